//! Backend discovery: where each model's ready backends come from.
//!
//! Two sources sit behind [`Discovery`]: [`StaticDiscovery`] (`--backend model=url`, readiness from probing each
//! backend's health path — local development and tests) and [`super::kube::KubeDiscovery`] (EndpointSlices and
//! InferenceAutoscalers in a cluster). Both push readiness into the [`Router`]; neither is on the request path.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use tracing::{debug, info};

use super::ActivatorError;
use super::router::{ModelEntry, Router};

/// A source of ready backends per model.
pub trait Discovery: Send + Sync + std::fmt::Debug + 'static {
    /// Feeds `router` until the process stops; returns only on a fatal error.
    fn run(self: Arc<Self>, router: Arc<Router>) -> BoxFuture<'static, Result<(), ActivatorError>>;

    /// A request could not even connect to `base`: stop routing to it until discovery sees it ready again.
    /// (Nothing was sent, so the request itself is retried elsewhere or held.)
    fn connect_failed(&self, entry: &ModelEntry, base: &str);

    /// True once the source has its first complete view (the activator's `/ready`).
    fn synced(&self) -> bool;

    /// A request is held for `entry`, which has no ready backend: ask its sleeping replicas to wake now, rather
    /// than at the next probe or sync. A source that knows no sidecars does nothing.
    fn wake(&self, _entry: &ModelEntry) {}

    /// Model names claimed twice within one namespace, as of now (for `/metrics`).
    fn collisions(&self) -> Vec<Collision> {
        Vec::new()
    }
}

/// A model name that more than one InferenceAutoscaler in one namespace claims. The oldest claim (then the
/// smallest name) is routed; the others are refused for that name until the collision is resolved.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Collision {
    /// The namespace.
    pub namespace: String,
    /// The OpenAI model name.
    pub model: String,
    /// The InferenceAutoscaler that keeps the name.
    pub chosen: String,
    /// The InferenceAutoscalers refused for it.
    pub refused: Vec<String>,
}

/// One `--backend model=url` flag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticBackend {
    /// The OpenAI `model` name routed to this backend.
    pub model: String,
    /// Base URL, `http://host:port` (an optional path prefix is kept).
    pub url: String,
}

impl std::str::FromStr for StaticBackend {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (model, url) = s.split_once('=').ok_or_else(|| {
            format!("--backend {s:?}: expected <model>=<url>, e.g. --backend llama=http://127.0.0.1:8000")
        })?;
        let url = url.trim_end_matches('/');
        if model.is_empty() {
            return Err(format!("--backend {s:?}: the model name before '=' is empty"));
        }
        let uri: http::Uri = url
            .parse()
            .map_err(|e| format!("--backend {s:?}: {url:?} is not a URL: {e}"))?;
        if uri.scheme_str() != Some("http") || uri.authority().is_none() {
            return Err(format!(
                "--backend {s:?}: the URL must be http://host:port (TLS to backends is not supported; \
                 terminate TLS in front of the activator)"
            ));
        }
        Ok(Self {
            model: model.to_string(),
            url: url.to_string(),
        })
    }
}

/// One `--sidecar model=url` flag: the sidecar of one of the model's `--backend`s (the n-th `--sidecar` of a model
/// belongs to its n-th `--backend`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticSidecar {
    /// The OpenAI `model` name.
    pub model: String,
    /// The sidecar's base URL, `http://host:port`.
    pub url: String,
}

impl std::str::FromStr for StaticSidecar {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        // The same shape and checks as --backend.
        let b: StaticBackend = s
            .parse()
            .map_err(|e: String| e.replace("--backend", "--sidecar"))?;
        Ok(Self {
            model: b.model,
            url: b.url,
        })
    }
}

/// Pairs each `--sidecar` with the `--backend` it belongs to (by order within the model): backend URL → sidecar
/// URL. A model with more sidecars than backends is a configuration error.
pub fn pair_sidecars(
    backends: &[StaticBackend],
    sidecars: &[StaticSidecar],
) -> Result<std::collections::BTreeMap<String, String>, String> {
    let mut out = std::collections::BTreeMap::new();
    let mut by_model: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for s in sidecars {
        by_model.entry(&s.model).or_default().push(&s.url);
    }
    for (model, urls) in by_model {
        let mine: Vec<&StaticBackend> = backends.iter().filter(|b| b.model == model).collect();
        if urls.len() > mine.len() {
            return Err(format!(
                "--sidecar: model `{model}` has {} sidecars but {} --backend; the n-th --sidecar of a model belongs \
                 to its n-th --backend",
                urls.len(),
                mine.len()
            ));
        }
        for (b, u) in mine.into_iter().zip(urls) {
            out.insert(b.url.clone(), u.to_owned());
        }
    }
    Ok(out)
}

/// Static backends with readiness from health probes; every `--backend` lives in one namespace (the activator's
/// default namespace), as a client addressing `/v1/...` without a namespace prefix expects.
///
/// Probing is demand-driven: every `slow` interval normally, but at once when a request is held (the model's
/// demand notifier fires) and then every `fast` interval while requests are held and no backend is ready — so a
/// scale from zero costs at most one `fast` interval beyond the backend turning healthy.
#[derive(Debug)]
pub struct StaticDiscovery {
    backends: Vec<StaticBackend>,
    namespace: String,
    health_path: String,
    fast: Duration,
    slow: Duration,
    client: Client<HttpConnector, Empty<Bytes>>,
    synced: std::sync::atomic::AtomicBool,
    /// Backend URL → its sidecar's URL (`--sidecar`): readiness then also needs the sidecar's `/ready` (false while
    /// the replica sleeps or wakes), and a held request asks the sidecar to wake it.
    sidecars: std::collections::BTreeMap<String, String>,
    /// Wake calls to the sidecars.
    waker: Waker,
}

/// How long a wake call may take (the sidecar answers when the replica is awake, within its own bound).
const WAKE_CALL_TIMEOUT: Duration = Duration::from_secs(35);

impl StaticDiscovery {
    /// Routes `backends` in `namespace`; probes `health_path` on each every `slow`, or every `fast` while requests
    /// are held.
    pub fn new(
        backends: Vec<StaticBackend>,
        namespace: String,
        health_path: String,
        fast: Duration,
        slow: Duration,
    ) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(fast.max(Duration::from_millis(200))));
        let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build(connector);
        Self {
            backends,
            namespace,
            health_path,
            fast,
            slow,
            client,
            synced: false.into(),
            sidecars: Default::default(),
            waker: Waker::new(),
        }
    }

    /// With sidecars (backend URL → sidecar URL, see [`pair_sidecars`]).
    pub fn with_sidecars(mut self, sidecars: std::collections::BTreeMap<String, String>) -> Self {
        self.sidecars = sidecars;
        self
    }

    async fn probe(&self, base: &str) -> bool {
        if !self.get_ok(base, &self.health_path).await {
            return false;
        }
        match self.sidecars.get(base) {
            Some(sidecar) => self.get_ok(sidecar, "/ready").await,
            None => true,
        }
    }

    async fn get_ok(&self, base: &str, path: &str) -> bool {
        let Ok(uri) = format!("{base}{path}").parse::<http::Uri>() else {
            return false;
        };
        // A probe that hangs must not stall the loop: bound it by the slow interval, kept within 100 ms..=1 s.
        let limit = self
            .slow
            .clamp(Duration::from_millis(100), Duration::from_secs(1));
        match tokio::time::timeout(limit, self.client.get(uri)).await {
            Ok(Ok(resp)) => resp.status().is_success(),
            Ok(Err(e)) => {
                debug!(backend = base, error = %e, "health probe failed");
                false
            }
            Err(_) => false,
        }
    }

    async fn probe_model(self: Arc<Self>, entry: Arc<ModelEntry>, urls: Vec<String>) {
        let demand = entry.demand();
        let mut was_ready: Vec<Option<bool>> = vec![None; urls.len()];
        loop {
            let results = futures::future::join_all(urls.iter().map(|u| self.probe(u))).await;
            for ((url, ok), was) in urls.iter().zip(&results).zip(was_ready.iter_mut()) {
                if *was != Some(*ok) {
                    info!(model = entry.name(), backend = %url, ready = ok, "backend readiness changed");
                    *was = Some(*ok);
                }
                entry.set_ready(url, *ok);
            }
            let waiting = entry.queued() > 0 && entry.ready_count() == 0;
            let interval = if waiting { self.fast } else { self.slow };
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                () = demand.notified() => {}
            }
        }
    }
}

impl Discovery for StaticDiscovery {
    fn run(self: Arc<Self>, router: Arc<Router>) -> BoxFuture<'static, Result<(), ActivatorError>> {
        Box::pin(async move {
            let mut by_model: std::collections::BTreeMap<String, Vec<String>> = Default::default();
            for b in &self.backends {
                by_model.entry(b.model.clone()).or_default().push(b.url.clone());
            }
            let mut tasks = tokio::task::JoinSet::new();
            for (model, urls) in by_model {
                let entry = router.ensure(&self.namespace, &model);
                tasks.spawn(self.clone().probe_model(entry, urls));
            }
            // Static backends are all known up front; holding requests for a backend still starting is the
            // activator's job, so it is ready to serve at once.
            self.synced.store(true, std::sync::atomic::Ordering::Relaxed);
            while tasks.join_next().await.is_some() {}
            Ok(())
        })
    }

    fn connect_failed(&self, entry: &ModelEntry, base: &str) {
        entry.set_ready(base, false);
    }

    fn synced(&self) -> bool {
        self.synced.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn wake(&self, entry: &ModelEntry) {
        if entry.namespace() != self.namespace {
            return;
        }
        for b in self.backends.iter().filter(|b| b.model == entry.name()) {
            if let Some(sidecar) = self.sidecars.get(&b.url) {
                self.waker.wake(entry, sidecar);
            }
        }
    }
}

/// Asks sidecars to wake their replicas (`POST <sidecar>/tessera/v1/wake`), one call per sidecar at a time: the
/// sidecar joins concurrent calls into one wake anyway, and this keeps a burst of held requests from opening a
/// connection each.
#[derive(Debug)]
pub struct Waker {
    client: Client<HttpConnector, Empty<Bytes>>,
    waking: Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
}

impl Waker {
    /// A waker with its own small client.
    pub fn new() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(2)));
        Self {
            client: Client::builder(hyper_util::rt::TokioExecutor::new()).build(connector),
            waking: Default::default(),
        }
    }

    /// Sends the wake to `sidecar` (base URL) for `entry` unless one is in flight; when it answers, `entry`'s
    /// discovery is nudged so the replica is seen ready without waiting for the next probe or watch event.
    pub fn wake(&self, entry: &ModelEntry, sidecar: &str) {
        if let Ok(mut w) = self.waking.lock()
            && !w.insert(sidecar.to_owned())
        {
            return;
        }
        let done = WakeDone {
            waking: self.waking.clone(),
            sidecar: sidecar.to_owned(),
        };
        let Ok(uri) = format!("{sidecar}/tessera/v1/wake").parse::<http::Uri>() else {
            return;
        };
        let mut req = http::Request::new(Empty::<Bytes>::new());
        *req.method_mut() = http::Method::POST;
        *req.uri_mut() = uri;
        let call = self.client.request(req);
        let (model, sidecar) = (entry.name().to_owned(), sidecar.to_owned());
        let demand = entry.demand();
        tokio::spawn(async move {
            info!(model = %model, sidecar = %sidecar, "a request is held: asking the replica to wake");
            match tokio::time::timeout(WAKE_CALL_TIMEOUT, call).await {
                Ok(Ok(resp)) => {
                    debug!(sidecar = %sidecar, status = %resp.status(), "wake answered");
                    // Awake and checked: look again now rather than at the next held-probe tick.
                    demand.notify_one();
                }
                Ok(Err(e)) => debug!(sidecar = %sidecar, error = %e, "wake call failed"),
                Err(_) => debug!(sidecar = %sidecar, "wake call timed out"),
            }
            drop(done);
        });
    }
}

impl Default for Waker {
    fn default() -> Self {
        Self::new()
    }
}

/// Clears a sidecar's wake-in-flight mark when its call ends (or its task is dropped).
struct WakeDone {
    waking: Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
    sidecar: String,
}

impl Drop for WakeDone {
    fn drop(&mut self) {
        if let Ok(mut w) = self.waking.lock() {
            w.remove(&self.sidecar);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn backend_flag_parses_and_rejects_clearly() {
        let b: StaticBackend = "llama=http://127.0.0.1:8000/".parse().unwrap();
        assert_eq!(
            b,
            StaticBackend {
                model: "llama".into(),
                url: "http://127.0.0.1:8000".into()
            }
        );
        // The first '=' splits, so model names with '/' (Hugging Face ids) are fine.
        let b: StaticBackend = "org/model-7b=http://h:1".parse().unwrap();
        assert_eq!(b.model, "org/model-7b");
        assert!(
            "nourl"
                .parse::<StaticBackend>()
                .unwrap_err()
                .contains("expected <model>=<url>")
        );
        assert!(
            "=http://h:1"
                .parse::<StaticBackend>()
                .unwrap_err()
                .contains("empty")
        );
        assert!(
            "m=https://h:1"
                .parse::<StaticBackend>()
                .unwrap_err()
                .contains("http://host:port")
        );
        assert!("m=h:1".parse::<StaticBackend>().is_err());
    }

    #[test]
    fn sidecars_pair_with_backends_in_order() {
        let b = |s: &str| s.parse::<StaticBackend>().unwrap();
        let c = |s: &str| s.parse::<StaticSidecar>().unwrap();
        let backends = [b("m=http://h:1"), b("n=http://h:2"), b("m=http://h:3")];
        let pairs = pair_sidecars(&backends, &[c("m=http://s:1"), c("m=http://s:3")]).unwrap();
        assert_eq!(pairs["http://h:1"], "http://s:1");
        assert_eq!(pairs["http://h:3"], "http://s:3");
        assert!(!pairs.contains_key("http://h:2"));
        let e = pair_sidecars(&backends, &[c("n=http://s:1"), c("n=http://s:2")]).unwrap_err();
        assert!(e.contains("2 sidecars but 1 --backend"), "{e}");
        assert!("x".parse::<StaticSidecar>().unwrap_err().contains("--sidecar"));
    }
}
