//! The activator: an OpenAI-API gateway that routes by model and holds requests while a model scales from zero.
//!
//! ```text
//!  client ──POST /v1/chat/completions {"model": m}──▶ proxy ──pick least-outstanding ready backend──▶ vLLM
//!                                                       │ none ready?
//!                                                       ▼
//!                                bounded hold queue per model ──demand──▶ discovery: probe now (static) /
//!                                       ▲                                 patch tessera.dev/activated-at (k8s)
//!                                       └──── watch: first backend ready ◀── discovery pushes readiness
//! ```
//!
//! - [`router`]: per-model state (ready backends, outstanding counts, hold queue, counters).
//! - [`proxy`]: the request path; every request is forwarded once or answered with an explicit error.
//! - [`discovery`]: the [`discovery::Discovery`] trait and static backends with demand-driven health probes.
//! - [`kube`]: Kubernetes discovery (EndpointSlices + InferenceAutoscalers) and the wake-up patch.
//! - [`metrics`]: Prometheus families.
//!
//! Admin endpoints: `GET /v1/models` (the union of known models), `GET` [`STATS_PATH`] (the
//! [`tessera_core::wire::activator::ActivatorStats`] document the controller reads), `/metrics`, `/live`, `/ready`.

pub mod discovery;
pub mod kube;
pub mod metrics;
pub mod proxy;
pub mod router;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use tessera_core::wire::activator::STATS_PATH;
use tracing::{info, warn};

use self::discovery::{Discovery, StaticBackend, StaticDiscovery};
use self::proxy::App;
use self::router::Router;

/// The activator's errors at start-up and in its background tasks.
#[derive(Debug, thiserror::Error)]
pub enum ActivatorError {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source} (is another process using the port?)")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("the HTTP server stopped: {0}")]
    Serve(std::io::Error),
    /// No Kubernetes configuration was found (and no `--backend` was given).
    #[error(
        "no --backend given and no Kubernetes configuration found ({0}); run in a cluster, set KUBECONFIG, \
         or pass --backend <model>=<url> for local use"
    )]
    KubeConfig(String),
    /// A Kubernetes API call failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] ::kube::Error),
}

impl ActivatorError {
    /// A fixed label per variant, for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Bind { .. } => "bind",
            Self::Serve(_) => "serve",
            Self::KubeConfig(_) => "kube_config",
            Self::Kube(_) => "kube",
        }
    }
}

/// `tessera activator` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Address to listen on (OpenAI API, /metrics, /live, /ready, /tessera/v1/stats).
    #[arg(long, env = "TESSERA_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,

    /// A static backend, `<model>=<url>` (repeatable, or comma-separated in the environment variable). With
    /// none, backends come from Kubernetes EndpointSlices and InferenceAutoscalers.
    #[arg(long = "backend", env = "TESSERA_BACKENDS", value_delimiter = ',')]
    pub backends: Vec<StaticBackend>,

    /// Most requests held per model while it has no ready backend; beyond it the activator answers 503
    /// (0: never hold, answer 503 at once).
    #[arg(long, env = "TESSERA_QUEUE_SIZE", default_value_t = 100)]
    pub queue_size: u64,

    /// Longest a request is held waiting for a backend before a 503 (covers a cold start of the model server).
    #[arg(long, env = "TESSERA_HOLD_TIMEOUT", value_parser = humantime::parse_duration, default_value = "60s")]
    pub hold_timeout: Duration,

    /// `Retry-After` sent with the activator's own 503 answers (rounded to whole seconds, at least 1).
    #[arg(long, env = "TESSERA_RETRY_AFTER", value_parser = humantime::parse_duration, default_value = "5s")]
    pub retry_after: Duration,

    /// Largest request body accepted, in bytes (the body is read to find its `model`).
    #[arg(long, env = "TESSERA_MAX_BODY_SIZE", default_value_t = 16 * 1024 * 1024)]
    pub max_body_size: usize,

    /// Static backends: the path probed for readiness (vLLM serves `/health`).
    #[arg(long, env = "TESSERA_HEALTH_PATH", default_value = "/health")]
    pub health_path: String,

    /// Static backends: probe interval while nobody is waiting.
    #[arg(long, env = "TESSERA_PROBE_INTERVAL", value_parser = nonzero_duration, default_value = "5s")]
    pub probe_interval: Duration,

    /// Static backends: probe interval while requests are held for a model with no ready backend (bounds the
    /// latency a scale from zero adds beyond the backend turning ready).
    #[arg(long, env = "TESSERA_PROBE_INTERVAL_HELD", value_parser = nonzero_duration, default_value = "20ms")]
    pub probe_interval_held: Duration,

    /// Kubernetes: watch only this namespace (default: all namespaces).
    #[arg(long, env = "TESSERA_NAMESPACE")]
    pub namespace: Option<String>,

    /// Kubernetes: the EndpointSlice port name to route to (default: the slice's only or first port).
    #[arg(long, env = "TESSERA_PORT_NAME")]
    pub port_name: Option<String>,

    /// Kubernetes: the shortest time between two wake-up patches for one InferenceAutoscaler.
    #[arg(long, env = "TESSERA_WAKE_INTERVAL", value_parser = nonzero_duration, default_value = "1s")]
    pub wake_interval: Duration,

    /// This instance's name in the stats document (the pod name in a cluster; default: the listen address).
    #[arg(long, env = "TESSERA_INSTANCE")]
    pub instance: Option<String>,
}

/// A humantime duration that must be positive: a zero interval would turn a probe or wake-up loop into a busy loop.
fn nonzero_duration(s: &str) -> Result<Duration, String> {
    let d =
        humantime::parse_duration(s).map_err(|e| format!("{s:?} is not a duration like 20ms or 5s: {e}"))?;
    if d.is_zero() {
        return Err(format!(
            "{s:?}: the interval must be greater than zero (e.g. 20ms)"
        ));
    }
    Ok(d)
}

/// Runs the activator until SIGTERM or Ctrl-C.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|source| ActivatorError::Bind {
            addr: args.listen,
            source,
        })?;
    let local = listener.local_addr().map_err(ActivatorError::Serve)?;
    let started = SystemTime::now();
    let instance = args.instance.clone().unwrap_or_else(|| local.to_string());
    let router = Arc::new(Router::new(args.queue_size, instance, crate::unix_ms(started)));

    let discovery: Arc<dyn Discovery> = if args.backends.is_empty() {
        let client = ::kube::Client::try_default()
            .await
            .map_err(|e| ActivatorError::KubeConfig(e.to_string()))?;
        Arc::new(kube::KubeDiscovery::new(
            client,
            args.namespace.clone(),
            args.port_name.clone(),
            args.wake_interval,
        ))
    } else {
        Arc::new(StaticDiscovery::new(
            args.backends.clone(),
            args.health_path.clone(),
            args.probe_interval_held,
            args.probe_interval,
        ))
    };
    let discovery_task = tokio::spawn(discovery.clone().run(router.clone()));

    let app = Arc::new(App {
        router,
        discovery,
        metrics: metrics::Metrics::new(),
        client: backend_client(),
        hold_timeout: args.hold_timeout,
        retry_after: args.retry_after,
        max_body_bytes: args.max_body_size,
    });
    let service = axum::Router::new()
        .route("/v1/models", get(list_models))
        .route(STATS_PATH, get(stats))
        .route("/metrics", get(prometheus))
        .route("/live", get(|| async { "ok" }))
        .route("/ready", get(ready))
        .route("/v1/{*rest}", post(proxy::handle))
        .fallback(not_found)
        .with_state(app);
    info!(listen = %local, "activator listening");
    let listener = listener.tap_io(|tcp| {
        // Small SSE chunks must leave at once, not wait for Nagle's algorithm.
        if let Err(e) = tcp.set_nodelay(true) {
            warn!(error = %e, "could not set TCP_NODELAY");
        }
    });
    tokio::select! {
        served = axum::serve(listener, service).with_graceful_shutdown(shutdown_signal()) => {
            served.map_err(ActivatorError::Serve)?;
        }
        ended = discovery_task => {
            match ended {
                Ok(Ok(())) => anyhow::bail!("backend discovery stopped unexpectedly"),
                Ok(Err(e)) => return Err(e.into()),
                Err(e) => anyhow::bail!("backend discovery panicked: {e}"),
            }
        }
    }
    info!("activator stopped");
    Ok(())
}

/// The pooled keep-alive client to backends: TCP_NODELAY, idle connections kept so the proxy hop costs no
/// handshake.
pub fn backend_client() -> Client<HttpConnector, http_body_util::Full<bytes::Bytes>> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(Duration::from_secs(5)));
    Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(1024)
        .build(connector)
}

async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            warn!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { () = ctrl_c => {}, () = term => {} }
    info!("shutting down: finishing in-flight requests");
}

async fn list_models(State(app): State<Arc<App>>) -> Response {
    let data: Vec<serde_json::Value> = app
        .router
        .model_names()
        .into_iter()
        .map(|id| serde_json::json!({ "id": id, "object": "model", "created": 0, "owned_by": "tessera" }))
        .collect();
    axum::Json(serde_json::json!({ "object": "list", "data": data })).into_response()
}

async fn stats(State(app): State<Arc<App>>) -> Response {
    axum::Json(app.router.stats(crate::unix_ms(SystemTime::now()))).into_response()
}

async fn prometheus(State(app): State<Arc<App>>) -> Response {
    match app.metrics.encode(&app.router) {
        Ok(text) => (
            // prometheus-client writes OpenMetrics (`# EOF`, counter families without `_total`); Prometheus chooses
            // its parser by this header, so it must say so, as the sidecar and the controller do.
            [(
                http::header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics failed: {e}"),
        )
            .into_response(),
    }
}

async fn ready(State(app): State<Arc<App>>) -> Response {
    if app.discovery.synced() {
        (StatusCode::OK, "ok").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "backend discovery has not synced yet",
        )
            .into_response()
    }
}

async fn not_found() -> Response {
    let body = serde_json::json!({ "error": {
        "message": "no such route; the gateway serves POST /v1/... (OpenAI API) and GET /v1/models",
        "type": "invalid_request_error", "param": null, "code": "not_found" } });
    (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}
