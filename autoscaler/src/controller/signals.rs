//! Where the scaling signals come from, and their conversion into the core's [`ScaleInput`] parts.
//!
//! - Each ready replica's sidecar serves [`SidecarStatus`] on `/v1/status`; [`replica_signals`] turns one into
//!   [`ReplicaSignals`], marking it stale (never a reason to scale down) when vLLM is down, the sidecar says its
//!   snapshot is stale, or the snapshot is older than the controller accepts.
//! - Each activator pod serves [`ActivatorStats`] on [`STATS_PATH`]; an [`ActivatorPoller`] keeps the last two
//!   documents per pod (a rate needs two), and [`demand_from`] sums them into the model's [`Demand`]. Behind a
//!   Service each pod sees only the requests routed to it, so the pods are discovered one by one (EndpointSlices,
//!   see [`super::discovery`]) and polled each. When any known pod has no fresh document, the demand is *unknown*
//!   (no rate, no idle time), which blocks scale to zero — a missing activator must never make a busy model look
//!   idle. A fresh document with `queued > 0` wakes that model's reconcile at once ([`queued_models`]).
//!
//! The HTTP side sits behind [`SignalSource`] so reconcile tests run without sockets.

use std::collections::{BTreeMap, BTreeSet};
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
        // The short window (about a sync period) when the sidecar has one: over the 10-minute window one
        // excursion keeps the SLO guard firing long after new replicas are up. Older sidecars: the long window.
        ttft_p95: status
            .recent
            .as_ref()
            .map(|r| r.ttft_seconds.p95)
            .unwrap_or_else(|| status.window.as_ref().and_then(|w| w.ttft_seconds.p95))
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(Duration::from_secs_f64),
        fresh,
    }
}

/// The last two stats documents of one activator pod, or why the last fetch failed.
#[derive(Debug, Clone, Default)]
pub struct ActivatorSample {
    /// The document before `latest` (for the rate).
    pub previous: Option<ActivatorStats>,
    /// The newest document.
    pub latest: Option<ActivatorStats>,
    /// When `latest` was fetched, on the controller's clock (Unix ms).
    pub fetched_at_ms: Option<u64>,
    /// Set when the last fetch failed: the demand is then unknown.
    pub last_error: Option<String>,
}

impl ActivatorSample {
    /// Whether this pod's view counts as current at `now_ms`: the last poll succeeded and is at most `max_age` old.
    pub fn is_fresh(&self, now_ms: u64, max_age: Duration) -> bool {
        let max_age = u64::try_from(max_age.as_millis()).unwrap_or(u64::MAX);
        self.last_error.is_none()
            && self.latest.is_some()
            && self
                .fetched_at_ms
                .is_some_and(|t| now_ms.saturating_sub(t) <= max_age)
    }
}

/// The model's demand from every activator pod's samples. `models` are [`model_key`]s (`"<namespace>/<model>"`,
/// contract 1). Idle time and rate are known only when *every* known activator pod gave a fresh document (each
/// pod sees only the requests its Service routed to it) whose rate could be derived; otherwise they are unknown,
/// which never allows a scale-down to zero. In-flight and queued counts are summed from whatever was read: they
/// only ever push up. No activator known: unknown demand.
///
/// [`model_key`]: tessera_core::wire::activator::model_key
pub fn demand_from(samples: &[ActivatorSample], models: &[String], now_ms: u64, max_age: Duration) -> Demand {
    let mut demand = Demand::default();
    if samples.is_empty() {
        return demand;
    }
    let mut rate = Some(0.0);
    let mut last: Option<u64> = None;
    let mut known = true;
    for s in samples {
        let fresh = s.is_fresh(now_ms, max_age);
        if !fresh {
            known = false;
            rate = None;
        }
        let Some(latest) = &s.latest else { continue };
        for m in models {
            if let Some(st) = latest.models.get(m) {
                demand.in_flight = demand
                    .in_flight
                    .saturating_add(u32::try_from(st.in_flight).unwrap_or(u32::MAX));
                demand.queued_at_activator = demand
                    .queued_at_activator
                    .saturating_add(u32::try_from(st.queued).unwrap_or(u32::MAX));
            }
            if !fresh {
                continue;
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

/// Model keys with `queued > 0` in any fresh document: a request is held right now, so the model's reconcile is
/// woken at once (the wake-up from zero, contract 2).
pub fn queued_models(samples: &[ActivatorSample], now_ms: u64, max_age: Duration) -> BTreeSet<String> {
    samples
        .iter()
        .filter(|s| s.is_fresh(now_ms, max_age))
        .filter_map(|s| s.latest.as_ref())
        .flat_map(|doc| doc.models.iter())
        .filter(|(_, st)| st.queued > 0)
        .map(|(k, _)| k.clone())
        .collect()
}

/// Polls every known activator pod and keeps its last two documents. The set of pods comes from
/// [`ActivatorPoller::set_targets`] (EndpointSlices of `--activator-service`) or is fixed (`--activator-url`).
#[derive(Debug, Clone)]
pub struct ActivatorPoller {
    /// Target name (pod name, or the URL itself for static URLs) → (base URL, sample).
    samples: Arc<Mutex<BTreeMap<String, (String, ActivatorSample)>>>,
    /// Model keys with a held request, sent after every poll (a model at most once per [`WAKE_REPEAT`]).
    wakes: tokio::sync::broadcast::Sender<String>,
    last_wakes: Arc<Mutex<BTreeMap<String, u64>>>,
}

/// While a request stays held, its model is woken again this often (the first wake may have raced a scale).
pub const WAKE_REPEAT: Duration = Duration::from_secs(5);

impl Default for ActivatorPoller {
    fn default() -> Self {
        Self::new(&[])
    }
}

impl ActivatorPoller {
    /// A poller for fixed `urls` (none: demand is unknown until targets are set).
    pub fn new(urls: &[String]) -> Self {
        let map = urls
            .iter()
            .map(|u| (u.clone(), (u.clone(), ActivatorSample::default())))
            .collect();
        let (wakes, _) = tokio::sync::broadcast::channel(1024);
        Self {
            samples: Arc::new(Mutex::new(map)),
            wakes,
            last_wakes: Arc::default(),
        }
    }

    /// Replaces the set of activator pods (name → base URL). A pod that stays keeps its samples; a pod that left
    /// is forgotten (its requests left with it); a new pod starts with no document, so the demand is unknown
    /// until it has been read.
    pub fn set_targets(&self, targets: BTreeMap<String, String>) {
        let Ok(mut map) = self.samples.lock() else { return };
        map.retain(|name, (url, _)| targets.get(name) == Some(url));
        for (name, url) in targets {
            map.entry(name)
                .or_insert_with(|| (url, ActivatorSample::default()));
        }
    }

    /// The current target names, sorted.
    pub fn targets(&self) -> Vec<String> {
        self.samples
            .lock()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// The current samples, one per known activator pod.
    pub fn samples(&self) -> Vec<ActivatorSample> {
        self.samples
            .lock()
            .map(|m| m.values().map(|(_, s)| s.clone()).collect())
            .unwrap_or_default()
    }

    /// Wake-ups: model keys with a held request.
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<String> {
        self.wakes.subscribe()
    }

    /// Fetches every activator once, concurrently, then sends the wake-ups. `now_ms`: the controller's clock.
    pub async fn poll_once(
        &self,
        source: &dyn SignalSource,
        metrics: &Metrics,
        now_ms: u64,
        max_age: Duration,
    ) {
        let targets: Vec<(String, String)> = self
            .samples
            .lock()
            .map(|m| m.iter().map(|(k, (u, _))| (k.clone(), u.clone())).collect())
            .unwrap_or_default();
        let results = futures::future::join_all(targets.iter().map(|(_, u)| source.activator_stats(u))).await;
        let samples = {
            let Ok(mut map) = self.samples.lock() else { return };
            for ((name, url), result) in targets.into_iter().zip(results) {
                // The pod may have left while we polled it.
                let Some((_, entry)) = map.get_mut(&name) else {
                    continue;
                };
                match result {
                    Ok(doc) => {
                        debug!(%url, models = doc.models.len(), "activator stats");
                        entry.previous = entry.latest.take();
                        entry.latest = Some(doc);
                        entry.fetched_at_ms = Some(now_ms);
                        entry.last_error = None;
                    }
                    Err(e) => {
                        warn!(%url, error = %e, "could not read activator stats; scale to zero is paused");
                        metrics.scrape_failure("activator", e.label());
                        entry.last_error = Some(e.to_string());
                    }
                }
            }
            map.values().map(|(_, s)| s.clone()).collect::<Vec<_>>()
        };
        let queued = queued_models(&samples, now_ms, max_age);
        let Ok(mut last) = self.last_wakes.lock() else {
            return;
        };
        last.retain(|k, _| queued.contains(k));
        let repeat = u64::try_from(WAKE_REPEAT.as_millis()).unwrap_or(u64::MAX);
        for key in queued {
            let due = last.get(&key).is_none_or(|t| now_ms.saturating_sub(*t) >= repeat);
            if due {
                last.insert(key.clone(), now_ms);
                // No receiver (not leading) is fine: the next term reconciles everything anyway.
                let _ = self.wakes.send(key);
            }
        }
    }

    /// Polls every `interval` until `shutdown` fires. A document older than `max_age` no longer counts.
    pub async fn run(
        self,
        source: Arc<dyn SignalSource>,
        metrics: Arc<Metrics>,
        interval: Duration,
        max_age: Duration,
        clock: impl Fn() -> SystemTime + Send + 'static,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        loop {
            self.poll_once(source.as_ref(), &metrics, crate::unix_ms(clock()), max_age)
                .await;
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
            schema_version: tessera_core::wire::activator::SCHEMA_VERSION,
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

    const AGE: Duration = Duration::from_secs(3);

    /// A pod's sample whose documents were fetched at their `observed` times, the last poll successful.
    fn sample(previous: Option<ActivatorStats>, latest: ActivatorStats) -> ActivatorSample {
        ActivatorSample {
            fetched_at_ms: Some(latest.observed_at_unix_ms),
            previous,
            latest: Some(latest),
            last_error: None,
        }
    }

    fn keys(k: &[&str]) -> Vec<String> {
        k.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn demand_sums_activator_pods_and_models_by_namespaced_key() {
        let a = sample(
            Some(stats(
                "a",
                10_000,
                &[("ns/m", 10, 0, 0, Some(9_000)), ("ns/alias", 0, 0, 0, None)],
            )),
            stats(
                "a",
                20_000,
                &[
                    ("ns/m", 60, 2, 1, Some(19_000)),
                    ("ns/alias", 0, 0, 0, None),
                    ("other/m", 500, 9, 9, Some(19_500)),
                ],
            ),
        );
        let b = sample(
            Some(stats("b", 10_000, &[("ns/m", 0, 0, 0, None)])),
            stats(
                "b",
                20_000,
                &[("ns/alias", 20, 1, 0, Some(15_000)), ("ns/m", 0, 0, 0, None)],
            ),
        );
        let d = demand_from(&[a.clone(), b], &keys(&["ns/m", "ns/alias"]), 20_500, AGE);
        assert_eq!(
            d.requests_per_second,
            Some(7.0),
            "another namespace's model is not ours"
        );
        assert_eq!((d.in_flight, d.queued_at_activator), (3, 1));
        assert_eq!(d.last_request_at, Some(Timestamp::from_millis(19_000)));
        // A single document gives no rate yet.
        let first = ActivatorSample { previous: None, ..a };
        assert_eq!(
            demand_from(&[first], &keys(&["ns/m"]), 20_500, AGE).requests_per_second,
            None
        );
        // No activator at all: unknown.
        assert_eq!(demand_from(&[], &keys(&["ns/m"]), 20_500, AGE), Demand::default());
    }

    /// Item 7: a failed poll used to keep the last two documents' rate (frozen): now the rate and the idle time
    /// are unknown, and what was queued still counts.
    #[test]
    fn a_failed_or_stale_poll_makes_the_rate_unknown_not_frozen() {
        let ok = sample(
            Some(stats("a", 10_000, &[("ns/m", 10, 0, 0, Some(9_000))])),
            stats("a", 20_000, &[("ns/m", 60, 2, 0, Some(19_000))]),
        );
        let failed = ActivatorSample {
            last_error: Some("timeout".into()),
            ..ok.clone()
        };
        let d = demand_from(&[failed], &keys(&["ns/m"]), 21_000, AGE);
        assert_eq!((d.requests_per_second, d.last_request_at), (None, None));
        assert_eq!(d.in_flight, 2);
        // Fetched 3.5 s ago with polls every second: stale, so unknown too.
        let d = demand_from(std::slice::from_ref(&ok), &keys(&["ns/m"]), 23_500, AGE);
        assert_eq!((d.requests_per_second, d.last_request_at), (None, None));
        let d = demand_from(&[ok], &keys(&["ns/m"]), 23_000, AGE);
        assert_eq!(d.requests_per_second, Some(5.0));
    }

    /// Item 3: behind a Service each pod sees part of the traffic; one pod without a fresh document means the model
    /// is not provably idle, however idle the others look.
    #[test]
    fn idle_needs_a_fresh_document_from_every_activator_pod() {
        let idle = |name: &str| {
            sample(
                Some(stats(name, 10_000, &[("ns/m", 0, 0, 0, None)])),
                stats(name, 20_000, &[("ns/m", 0, 0, 0, None)]),
            )
        };
        let both = [idle("a"), idle("b")];
        let d = demand_from(&both, &keys(&["ns/m"]), 20_000, AGE);
        assert_eq!(
            d.last_request_at,
            Some(Timestamp::from_millis(1_000)),
            "idle since the activators started"
        );
        let not_yet_read = ActivatorSample::default();
        let d = demand_from(&[idle("a"), not_yet_read], &keys(&["ns/m"]), 20_000, AGE);
        assert_eq!((d.requests_per_second, d.last_request_at), (None, None));
        let d = demand_from(&both, &keys(&["ns/m", "ns/not-routed-here"]), 20_000, AGE);
        assert_eq!(
            d.last_request_at, None,
            "a model the activator does not know never allows scale to zero"
        );
    }

    #[test]
    fn queued_models_come_only_from_fresh_documents() {
        let held = sample(
            None,
            stats(
                "a",
                20_000,
                &[("ns/m", 1, 0, 2, Some(19_000)), ("ns/idle", 0, 0, 0, None)],
            ),
        );
        assert_eq!(
            queued_models(std::slice::from_ref(&held), 20_000, AGE),
            BTreeSet::from(["ns/m".to_owned()])
        );
        assert!(queued_models(&[held], 30_000, AGE).is_empty());
    }

    /// A fake that answers activator stats from a map of URL → document and sidecars never.
    struct Docs(Mutex<BTreeMap<String, ActivatorStats>>);

    impl SignalSource for Docs {
        fn sidecar_status(&self, base: &str) -> BoxFuture<'_, Result<SidecarStatus, FetchError>> {
            let url = base.to_owned();
            Box::pin(async move { Err(FetchError::Status { url, status: 404 }) })
        }
        fn activator_stats(&self, base: &str) -> BoxFuture<'_, Result<ActivatorStats, FetchError>> {
            let r = self
                .0
                .lock()
                .unwrap()
                .get(base)
                .cloned()
                .ok_or(FetchError::Connect {
                    url: base.to_owned(),
                    message: "refused".into(),
                });
            Box::pin(async move { r })
        }
    }

    #[tokio::test]
    async fn the_poller_follows_its_targets_and_wakes_held_models() {
        let docs = Docs(Mutex::new(BTreeMap::from([
            (
                "http://a".to_owned(),
                stats("a", 1_000, &[("ns/m", 1, 0, 1, Some(900))]),
            ),
            (
                "http://b".to_owned(),
                stats("b", 1_000, &[("ns/m", 0, 0, 0, None)]),
            ),
        ])));
        let metrics = Metrics::new();
        let poller = ActivatorPoller::new(&[]);
        let mut wakes = poller.subscribe();
        poller.set_targets(BTreeMap::from([("pod-a".to_owned(), "http://a".to_owned())]));
        poller.poll_once(&docs, &metrics, 1_000, AGE).await;
        assert_eq!(wakes.try_recv().unwrap(), "ns/m");
        // Still held 1 s later: not woken again before WAKE_REPEAT.
        poller.poll_once(&docs, &metrics, 2_000, AGE).await;
        assert!(wakes.try_recv().is_err());
        poller.poll_once(&docs, &metrics, 6_000, AGE).await;
        assert_eq!(wakes.try_recv().unwrap(), "ns/m");
        // A second pod joins: until it is read the demand is unknown; it keeps pod-a's samples.
        poller.set_targets(BTreeMap::from([
            ("pod-a".to_owned(), "http://a".to_owned()),
            ("pod-b".to_owned(), "http://b".to_owned()),
        ]));
        assert_eq!(poller.targets(), vec!["pod-a", "pod-b"]);
        let samples = poller.samples();
        assert!(samples[0].latest.is_some() && samples[1].latest.is_none());
        assert_eq!(
            demand_from(&samples, &keys(&["ns/m"]), 6_000, AGE).last_request_at,
            None
        );
        // pod-a leaves: its sample goes with it; pod-b fails: unknown, not frozen.
        poller.set_targets(BTreeMap::from([("pod-b".to_owned(), "http://b".to_owned())]));
        docs.0.lock().unwrap().remove("http://b");
        poller.poll_once(&docs, &metrics, 7_000, AGE).await;
        let samples = poller.samples();
        assert_eq!(samples.len(), 1);
        assert!(samples[0].last_error.is_some());
    }
}
