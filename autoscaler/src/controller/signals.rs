//! Where the scaling signals come from: the HTTP side of the controller's input path.
//!
//! - Each ready replica's sidecar serves [`SidecarStatus`] on `/v1/status`.
//! - Each activator pod serves [`ActivatorStats`] on [`STATS_PATH`]; an [`ActivatorPoller`] keeps the last two
//!   documents per pod (a rate needs two). Behind a Service each pod sees only the requests routed to it, so the
//!   pods are discovered one by one (EndpointSlices, see [`super::discovery`]) and polled each. A fresh document
//!   with `queued > 0` wakes that model's reconcile at once ([`queued_models`]).
//!
//! Turning the documents into the core's `ScaleInput` (freshness, the TTFT window, the rate, "unknown" demand) is
//! pure and shared with the simulator: [`tessera_core::scale::inputs`]. The HTTP side sits behind
//! [`SignalSource`] so reconcile tests run without sockets.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
pub use tessera_core::scale::inputs::{ActivatorSample, demand_from, queued_models};
use tessera_core::wire::activator::{ActivatorStats, STATS_PATH};
use tessera_core::wire::sidecar::{self, SidecarStatus};
use tracing::{debug, warn};

use super::metrics::Metrics;

/// Why a signal could not be fetched. `label()` is the `reason` label of `tessera_autoscaler_scrape_failures_total`.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
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
    #[strum(serialize = "http_status")]
    Status {
        /// The URL.
        url: String,
        /// The status code.
        status: u16,
    },
    /// The body is larger than the bound on one document (`--max-document-size`): a pod controls its own
    /// answers, and buffering a huge one could take the autoscaler past its memory limit.
    #[error(
        "{url} sent a body larger than {limit} bytes: refused (raise --max-document-size if this document is genuine)"
    )]
    TooLarge {
        /// The URL.
        url: String,
        /// The bound applied.
        limit: usize,
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
        self.into()
    }
}

/// Fetches documents over HTTP. Behind a trait so reconcile tests can answer without sockets.
pub trait SignalSource: Send + Sync {
    /// GET a sidecar's `/v1/status` at `base` (e.g. `http://10.0.0.7:9090`).
    fn sidecar_status(&self, base: &str) -> BoxFuture<'_, Result<SidecarStatus, FetchError>>;
    /// GET an activator's stats document at `base` (e.g. `http://tessera-activator:8080`).
    fn activator_stats(&self, base: &str) -> BoxFuture<'_, Result<ActivatorStats, FetchError>>;
    /// PUT the latency objective a sidecar's share rule sizes to (`/v1/objective`), as the controller of the pod's
    /// `namespace` (its token). Sources that only answer documents (the `--no-kube` page, test fakes that do not
    /// look at hand-overs) take it and do nothing.
    fn hand_objective(
        &self,
        base: &str,
        namespace: &str,
        objective: &tessera_core::wire::sidecar::Objective,
    ) -> BoxFuture<'_, Result<(), FetchError>> {
        let _ = (base, namespace, objective);
        Box::pin(async { Ok(()) })
    }
}

/// The real [`SignalSource`]: reqwest with a per-request timeout and a bound on each document's size.
#[derive(Debug, Clone)]
pub struct HttpSignals {
    client: reqwest::Client,
    timeout: Duration,
    max_body: usize,
    /// Signs each objective hand-over with the pod namespace's token (`tessera_runtime::token`).
    objective_key: Option<tessera_runtime::token::ObjectiveKey>,
}

impl HttpSignals {
    /// A source whose every request gives up after `timeout` and refuses a body over `max_body` bytes.
    pub fn new(timeout: Duration, max_body: usize) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .build()?;
        Ok(Self {
            client,
            timeout,
            max_body,
            objective_key: None,
        })
    }

    /// Hands objectives over with `key`'s namespace tokens; `None`: without a token (sidecars refuse them).
    pub fn with_objective_key(mut self, key: Option<tessera_runtime::token::ObjectiveKey>) -> Self {
        self.objective_key = key;
        self
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
        // Never buffer more than the bound: the pod chooses what it answers (runtime::body explains).
        let bytes = tessera_runtime::body::read_capped(resp, self.max_body)
            .await
            .map_err(|e| match e {
                tessera_runtime::body::BodyError::TooLarge { limit, .. } => FetchError::TooLarge {
                    url: url.clone(),
                    limit,
                },
                tessera_runtime::body::BodyError::Transport(e) => self.classify(&url, e),
            })?;
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

    fn hand_objective(
        &self,
        base: &str,
        namespace: &str,
        objective: &tessera_core::wire::sidecar::Objective,
    ) -> BoxFuture<'_, Result<(), FetchError>> {
        let url = format!("{}/v1/objective", base.trim_end_matches('/'));
        let objective = *objective;
        let token = self.objective_key.as_ref().map(|k| k.token_for(namespace));
        Box::pin(async move {
            let mut req = self.client.put(&url).json(&objective);
            if let Some(t) = token {
                req = req.bearer_auth(t);
            }
            let resp = req.send().await.map_err(|e| self.classify(&url, e))?;
            let status = resp.status();
            if status.is_success() {
                Ok(())
            } else {
                Err(FetchError::Status {
                    url,
                    status: status.as_u16(),
                })
            }
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
                        entry.latest = Some(Arc::new(doc));
                        entry.fetched_at_ms = Some(now_ms);
                        entry.last_error = None;
                    }
                    Err(e) => {
                        // A 404 is what an activator's public port answers: the stats moved to its admin listener.
                        let hint = matches!(e, FetchError::Status { status: 404, .. }).then_some(
                            "the activator serves its stats on its admin listener only (--admin-listen, port 9090 \
                             by default): give that address to --activator-url, or name it `admin` in the \
                             --activator-service's ports",
                        );
                        warn!(%url, error = %e, hint, "could not read activator stats; scale to zero is paused");
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

    fn stats(instance: &str, observed: u64, models: &[(&str, u64, u64, u64, Option<u64>)]) -> ActivatorStats {
        let models = models.iter().map(|&(m, total, in_flight, queued, last)| {
            (m.to_owned(), ModelStats::counts(total, in_flight, queued, last))
        });
        ActivatorStats::new(instance, 1_000, observed, models)
    }

    const AGE: Duration = Duration::from_secs(3);

    fn keys(k: &[&str]) -> Vec<String> {
        k.iter().map(|s| (*s).to_owned()).collect()
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

    /// Each hand-over carries the token of the pod's namespace (what the webhook gave that pod's sidecar), and
    /// none without a key (issue 53, N7).
    #[tokio::test]
    async fn an_objective_is_handed_over_with_the_pods_namespace_token() {
        use axum::http::HeaderMap;
        let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
        let s = seen.clone();
        let app = axum::Router::new().route(
            "/v1/objective",
            axum::routing::put(move |h: HeaderMap| async move {
                let auth = h.get("authorization").map(|v| v.to_str().unwrap().to_owned());
                s.lock().unwrap().push(auth);
                axum::http::StatusCode::NO_CONTENT
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let key = tessera_runtime::token::ObjectiveKey::from_bytes(&[b'c'; 32], "test").unwrap();
        let o = tessera_core::wire::sidecar::Objective::default();
        let plain = HttpSignals::new(Duration::from_secs(2), 1024).unwrap();
        plain.hand_objective(&base, "team-a", &o).await.unwrap();
        let keyed = plain.clone().with_objective_key(Some(key.clone()));
        keyed.hand_objective(&base, "team-a", &o).await.unwrap();
        keyed.hand_objective(&base, "team-b", &o).await.unwrap();
        assert_eq!(
            *seen.lock().unwrap(),
            [
                None,
                Some(format!("Bearer {}", key.token_for("team-a"))),
                Some(format!("Bearer {}", key.token_for("team-b"))),
            ]
        );
        server.abort();
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
