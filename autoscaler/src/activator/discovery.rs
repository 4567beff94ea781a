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
}

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
        }
    }

    async fn probe(&self, base: &str) -> bool {
        let Ok(uri) = format!("{base}{}", self.health_path).parse::<http::Uri>() else {
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
}
