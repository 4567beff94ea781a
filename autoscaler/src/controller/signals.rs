//! Where the scaling signals come from, and their conversion into the core's [`ScaleInput`] parts.
//!
//! - Each ready replica's sidecar serves [`SidecarStatus`] on `/v1/status`; [`replica_signals`] turns one into
//!   [`ReplicaSignals`], marking it stale (never a reason to scale down) when vLLM is down, the sidecar says its
//!   snapshot is stale, or the snapshot is older than the controller accepts.
//! - Each activator serves [`ActivatorStats`] on [`STATS_PATH`]; an [`ActivatorPoller`] keeps the last two
//!   documents per activator (a rate needs two), and [`demand_from`] sums them into the model's [`Demand`].
//!   When any configured activator could not be read, the demand is *unknown* (no rate, no idle time), which
//!   blocks scale to zero — a missing activator must never make a busy model look idle.
//!
//! The HTTP side sits behind [`SignalSource`] so reconcile tests run without sockets.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use tessera_core::scale::{Demand, ReplicaSignals, Timestamp};
use tessera_core::wire::activator::{ActivatorStats, STATS_PATH, request_rate};
use tessera_core::wire::sidecar::{self, SidecarStatus};
use tracing::{debug, warn};

use super::metrics::Metrics;

/// Why a signal could not be fetched. `label()` is the `reason` label of `tessera_autoscaler_scrape_failures_total`.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// Could not connect or the connection broke.
    #[error("connecting to {url}: {message}")]
    Connect {
        /// The URL.
        url: String,
        /// The error.
        message: String,
    },
    /// No answer within the timeout.
    #[error("{url} did not answer within {timeout:?}")]
    Timeout {
        /// The URL.
        url: String,
        /// The timeout.
        timeout: Duration,
    },
    /// A non-2xx answer.
    #[error("{url} answered HTTP {status}")]
    Status {
        /// The URL.
        url: String,
        /// The status code.
        status: u16,
    },
    /// The body is not the expected JSON document.
    #[error("{url} sent a body that is not a valid document: {message}")]
    Decode {
        /// The URL.
        url: String,
        /// The decode error.
        message: String,
    },
    /// The document's schema version is one this controller does not understand.
    #[error("{url} sent schema version {got}, this controller reads {want}: upgrade the older of the two")]
    Schema {
        /// The URL.
        url: String,
        /// What came.
        got: u32,
        /// What this build reads.
        want: u32,
    },
}

impl FetchError {
    /// Fixed metric label.
    pub fn label(&self) -> &'static str {
        match self {
            FetchError::Connect { .. } => "connect",
            FetchError::Timeout { .. } => "timeout",
            FetchError::Status { .. } => "http_status",
            FetchError::Decode { .. } => "decode",
            FetchError::Schema { .. } => "schema",
        }
    }
}

/// Fetches documents over HTTP. Behind a trait so reconcile tests can answer without sockets.
pub trait SignalSource: Send + Sync {
    /// GET a sidecar's `/v1/status` at `base` (e.g. `http://10.0.0.7:9090`).
    fn sidecar_status(&self, base: &str) -> BoxFuture<'_, Result<SidecarStatus, FetchError>>;
    /// GET an activator's stats document at `base` (e.g. `http://tessera-activator:8080`).
    fn activator_stats(&self, base: &str) -> BoxFuture<'_, Result<ActivatorStats, FetchError>>;
}

/// The real [`SignalSource`]: reqwest with a per-request timeout.
#[derive(Debug, Clone)]
pub struct HttpSignals {
    client: reqwest::Client,
    timeout: Duration,
}

impl HttpSignals {
    /// A source whose every request gives up after `timeout`.
    pub fn new(timeout: Duration) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .build()?;
        Ok(Self { client, timeout })
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, url: String) -> Result<T, FetchError> {
        let resp = self
            .client
            .get(&url)
            .send()
            .await
            .map_err(|e| self.classify(&url, e))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(FetchError::Status {
                url,
                status: status.as_u16(),
            });
        }
        let bytes = resp.bytes().await.map_err(|e| self.classify(&url, e))?;
        serde_json::from_slice(&bytes).map_err(|e| FetchError::Decode {
            url,
            message: e.to_string(),
        })
    }

    fn classify(&self, url: &str, e: reqwest::Error) -> FetchError {
        if e.is_timeout() {
            FetchError::Timeout {
                url: url.to_owned(),
                timeout: self.timeout,
            }
        } else {
            FetchError::Connect {
                url: url.to_owned(),
                message: e.to_string(),
            }
        }
    }
}

impl SignalSource for HttpSignals {
    fn sidecar_status(&self, base: &str) -> BoxFuture<'_, Result<SidecarStatus, FetchError>> {
        let url = format!("{}/v1/status", base.trim_end_matches('/'));
        Box::pin(async move {
            let status: SidecarStatus = self.get_json(url.clone()).await?;
            if status.schema_version != sidecar::SCHEMA_VERSION {
                return Err(FetchError::Schema {
                    url,
                    got: status.schema_version,
                    want: sidecar::SCHEMA_VERSION,
                });
            }
            Ok(status)
        })
    }

    fn activator_stats(&self, base: &str) -> BoxFuture<'_, Result<ActivatorStats, FetchError>> {
        let url = format!("{}{}", base.trim_end_matches('/'), STATS_PATH);
        Box::pin(async move {
            let stats: ActivatorStats = self.get_json(url.clone()).await?;
            let want = tessera_core::wire::activator::SCHEMA_VERSION;
            if stats.schema_version != want {
                return Err(FetchError::Schema {
                    url,
                    got: stats.schema_version,
                    want,
                });
            }
            Ok(stats)
        })
    }
}

/// One replica's signals from its sidecar status. `max_age`: how old the last good snapshot may be (measured on
/// the sidecar's own clock, so node clock skew does not matter).
pub fn replica_signals(status: &SidecarStatus, max_age: Duration) -> ReplicaSignals {
    let Some(latest) = &status.latest else {
        return ReplicaSignals {
            fresh: false,
            ..ReplicaSignals::default()
        };
    };
    let age = status.generated_at - latest.at;
    let fresh = status.vllm_up && !status.stale && age.is_finite() && age <= max_age.as_secs_f64();
    let count = |v: Option<f64>| v.filter(|x| x.is_finite() && *x >= 0.0).map(|x| x.round() as u32);
    ReplicaSignals {
        kv_cache_usage: latest.kv_cache_usage_ratio.filter(|x| x.is_finite()),
        waiting: count(latest.requests_waiting),
        running: count(latest.requests_running),
        ttft_p95: status
            .window
            .as_ref()
            .and_then(|w| w.ttft_seconds.p95)
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(Duration::from_secs_f64),
        fresh,
    }
}

/// The last two stats documents of one activator, or why the last fetch failed.
#[derive(Debug, Clone, Default)]
pub struct ActivatorSample {
    /// The document before `latest` (for the rate).
    pub previous: Option<ActivatorStats>,
    /// The newest document.
    pub latest: Option<ActivatorStats>,
    /// Set when the last fetch failed: the demand is then unknown.
    pub last_error: Option<String>,
}

/// The model's demand from every activator's samples. `None` samples list (no activator configured) gives an
/// unknown demand: no rate, no idle time, nothing queued.
pub fn demand_from(samples: &[ActivatorSample], models: &[String]) -> Demand {
    let mut demand = Demand::default();
    if samples.is_empty() {
        return demand;
    }
    let mut rate = Some(0.0);
    let mut last: Option<u64> = None;
    let mut known = true;
    for s in samples {
        let Some(latest) = &s.latest else {
            known = false;
            rate = None;
            continue;
        };
        if s.last_error.is_some() {
            known = false;
        }
        for m in models {
            let stats = latest.models.get(m);
            if let Some(st) = stats {
                demand.in_flight = demand
                    .in_flight
                    .saturating_add(u32::try_from(st.in_flight).unwrap_or(u32::MAX));
                demand.queued_at_activator = demand
                    .queued_at_activator
                    .saturating_add(u32::try_from(st.queued).unwrap_or(u32::MAX));
            }
            // The activator's contract: a known model with no request since the activator started has been idle
            // since the start; a model it does not know at all is "no data" (it is not in that request path),
            // which must never allow scale to zero.
            match latest.last_activity_unix_ms(m) {
                Some(seen) => last = Some(last.map_or(seen, |l| l.max(seen))),
                None => known = false,
            }
            rate = match (rate, &s.previous) {
                (Some(r), Some(prev)) => request_rate(prev, latest, m).ok().map(|x| r + x),
                _ => None,
            };
        }
    }
    demand.requests_per_second = rate;
    demand.last_request_at = if known {
        last.map(Timestamp::from_millis)
    } else {
        None
    };
    demand
}

/// The demand with the activator's wake-up taken into account: the activator writes the wake-up annotation
/// because it holds a request right now, so a wake-up younger than `window` counts as at least one queued request
/// (the stats poll may not have seen it yet).
pub fn with_wake_up(
    mut demand: Demand,
    activated_at: Option<SystemTime>,
    now: SystemTime,
    window: Duration,
) -> Demand {
    if activated_at.is_some_and(|at| now.duration_since(at).unwrap_or_default() < window) {
        demand.queued_at_activator = demand.queued_at_activator.max(1);
    }
    demand
}

/// Polls every configured activator in the background and keeps its last two documents.
#[derive(Debug, Clone, Default)]
pub struct ActivatorPoller {
    samples: Arc<Mutex<BTreeMap<String, ActivatorSample>>>,
}

impl ActivatorPoller {
    /// A poller for `urls` (none: demand is always unknown).
    pub fn new(urls: &[String]) -> Self {
        let map = urls
            .iter()
            .map(|u| (u.clone(), ActivatorSample::default()))
            .collect();
        Self {
            samples: Arc::new(Mutex::new(map)),
        }
    }

    /// The current samples, one per configured activator.
    pub fn samples(&self) -> Vec<ActivatorSample> {
        self.samples
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Fetches every activator once, concurrently.
    pub async fn poll_once(&self, source: &dyn SignalSource, metrics: &Metrics) {
        let urls: Vec<String> = self
            .samples
            .lock()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        let results = futures::future::join_all(urls.iter().map(|u| source.activator_stats(u))).await;
        let Ok(mut map) = self.samples.lock() else { return };
        for (url, result) in urls.into_iter().zip(results) {
            let entry = map.entry(url.clone()).or_default();
            match result {
                Ok(doc) => {
                    debug!(%url, models = doc.models.len(), "activator stats");
                    entry.previous = entry.latest.take();
                    entry.latest = Some(doc);
                    entry.last_error = None;
                }
                Err(e) => {
                    warn!(%url, error = %e, "could not read activator stats; scale to zero is paused");
                    metrics.scrape_failure("activator", e.label());
                    entry.last_error = Some(e.to_string());
                }
            }
        }
    }

    /// Polls every `interval` until `shutdown` fires.
    pub async fn run(
        self,
        source: Arc<dyn SignalSource>,
        metrics: Arc<Metrics>,
        interval: Duration,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        loop {
            self.poll_once(source.as_ref(), &metrics).await;
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use tessera_core::wire::activator::ModelStats;

    use super::*;

    fn status(json: serde_json::Value) -> SidecarStatus {
        serde_json::from_value(json).unwrap()
    }

    fn sidecar_doc(stale: bool, age: f64) -> serde_json::Value {
        serde_json::json!({
            "schema_version": 1, "generated_at": 1000.0, "vllm_url": "http://127.0.0.1:8000", "vllm_up": true,
            "ready": true, "stale": stale,
            "scrape": {"interval_secs": 5.0, "successes_total": 3},
            "latest": {"at": 1000.0 - age, "kv_cache_usage_ratio": 0.42, "requests_running": 3.0,
                       "requests_waiting": 1.0},
            "window": {"start": 900.0, "end": 1000.0, "samples": 20, "ttft_seconds": {"p95": 0.35}},
            "recommendation": {"outcome": {"state": "not_yet", "code": "too_few_samples", "reason": "warming up"}}
        })
    }

    #[test]
    fn sidecar_status_becomes_replica_signals() {
        let st = status(sidecar_doc(false, 2.0));
        let r = replica_signals(&st, Duration::from_secs(30));
        assert!(r.fresh);
        assert_eq!(r.kv_cache_usage, Some(0.42));
        assert_eq!((r.running, r.waiting), (Some(3), Some(1)));
        assert_eq!(r.ttft_p95, Some(Duration::from_millis(350)));
        let mut old = st.clone();
        old.latest.as_mut().unwrap().at = 900.0;
        assert!(
            !replica_signals(&old, Duration::from_secs(30)).fresh,
            "100 s old snapshot is stale"
        );
        let mut stale = st.clone();
        stale.stale = true;
        assert!(!replica_signals(&stale, Duration::from_secs(30)).fresh);
        let mut down = st;
        down.latest = None;
        assert!(!replica_signals(&down, Duration::from_secs(30)).fresh);
    }

    fn stats(instance: &str, observed: u64, models: &[(&str, u64, u64, u64, Option<u64>)]) -> ActivatorStats {
        ActivatorStats {
            schema_version: 1,
            instance: instance.into(),
            started_at_unix_ms: 1_000,
            observed_at_unix_ms: observed,
            models: models
                .iter()
                .map(|(m, total, in_flight, queued, last)| {
                    (
                        (*m).to_owned(),
                        ModelStats {
                            requests_total: *total,
                            in_flight: *in_flight,
                            queued: *queued,
                            last_request_at_unix_ms: *last,
                            ..ModelStats::default()
                        },
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn demand_sums_activators_and_models() {
        let a = ActivatorSample {
            previous: Some(stats(
                "a",
                10_000,
                &[("m", 10, 0, 0, Some(9_000)), ("alias", 0, 0, 0, None)],
            )),
            latest: Some(stats(
                "a",
                20_000,
                &[("m", 60, 2, 1, Some(19_000)), ("alias", 0, 0, 0, None)],
            )),
            last_error: None,
        };
        let b = ActivatorSample {
            previous: Some(stats("b", 10_000, &[("m", 0, 0, 0, None)])),
            latest: Some(stats(
                "b",
                20_000,
                &[("alias", 20, 1, 0, Some(15_000)), ("m", 0, 0, 0, None)],
            )),
            last_error: None,
        };
        let d = demand_from(&[a.clone(), b], &["m".into(), "alias".into()]);
        assert_eq!(d.requests_per_second, Some(7.0));
        assert_eq!((d.in_flight, d.queued_at_activator), (3, 1));
        assert_eq!(d.last_request_at, Some(Timestamp::from_millis(19_000)));
        // One activator failing makes the idle time unknown (no scale to zero) but keeps what is known.
        let failed = ActivatorSample {
            last_error: Some("timeout".into()),
            ..a.clone()
        };
        let d = demand_from(&[failed], &["m".into()]);
        assert_eq!(d.last_request_at, None);
        assert_eq!(d.in_flight, 2);
        // A single document gives no rate yet.
        let first = ActivatorSample { previous: None, ..a };
        assert_eq!(demand_from(&[first], &["m".into()]).requests_per_second, None);
        // No activator at all: unknown.
        assert_eq!(demand_from(&[], &["m".into()]), Demand::default());
    }

    #[test]
    fn idle_since_start_for_a_known_model_unknown_for_an_unknown_one() {
        let s = ActivatorSample {
            previous: Some(stats("a", 10_000, &[("m", 0, 0, 0, None)])),
            latest: Some(stats("a", 20_000, &[("m", 0, 0, 0, None)])),
            last_error: None,
        };
        let d = demand_from(std::slice::from_ref(&s), &["m".into()]);
        assert_eq!(
            d.last_request_at,
            Some(Timestamp::from_millis(1_000)),
            "idle since the activator started"
        );
        assert_eq!(d.requests_per_second, Some(0.0));
        let d = demand_from(&[s], &["m".into(), "not-routed-here".into()]);
        assert_eq!(
            d.last_request_at, None,
            "a model the activator does not know never allows scale to zero"
        );
    }

    #[test]
    fn a_recent_wake_up_counts_as_one_queued_request() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let window = Duration::from_secs(60);
        let queued = |d: Demand| d.queued_at_activator;
        assert_eq!(queued(with_wake_up(Demand::default(), None, now, window)), 0);
        let recent = Some(now - Duration::from_secs(59));
        assert_eq!(queued(with_wake_up(Demand::default(), recent, now, window)), 1);
        let expired = Some(now - window);
        assert_eq!(queued(with_wake_up(Demand::default(), expired, now, window)), 0);
        // A wake-up written by a clock ahead of ours still counts.
        let ahead = Some(now + Duration::from_secs(5));
        assert_eq!(queued(with_wake_up(Demand::default(), ahead, now, window)), 1);
        let busy = Demand {
            queued_at_activator: 7,
            ..Demand::default()
        };
        assert_eq!(
            queued(with_wake_up(busy, recent, now, window)),
            7,
            "never lowers a known queue"
        );
    }
}
