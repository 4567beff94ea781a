//! The activator: an OpenAI-API gateway that routes by `(namespace, model)` and holds requests while a model
//! scales from zero.
//!
//! ```text
//!  client ──POST /namespaces/<ns>/v1/chat/completions {"model": m}──▶ admit ──▶ read body ──▶ proxy
//!         (or /v1/... for --default-namespace)                         │ bounded    │ bounded     │
//!                                   pick least-outstanding ready backend of ns/m ◀──┘             │
//!                                         │ none ready?                                           ▼
//!                                         ▼                                                      vLLM
//!                  bounded hold queue ──demand──▶ discovery: probe now (static); the controller polls
//!                         ▲                        /tessera/v1/stats on the admin listener and sees queued > 0
//!                         └──── watch: first backend ready ◀── discovery pushes readiness
//! ```
//!
//! - [`router`]: per-model state (ready backends, outstanding counts, hold queue, counters) and the gateway-wide
//!   admission bounds.
//! - [`proxy`]: the request path; every request is forwarded once or answered with an explicit error.
//! - [`discovery`]: the [`discovery::Discovery`] trait and static backends with demand-driven health probes.
//! - [`kube`]: Kubernetes discovery (EndpointSlices + InferenceAutoscalers, per namespace) and collision Events.
//! - [`admin`]: the admin listener (stats, metrics) and the public port's refusal of its paths.
//! - [`lanes`]: the flex lane's view of each backend (its KV-cache and queue gauges), read while flex traffic
//!   flows; the gate itself is `tessera_core::lanes`.
//! - [`metrics`]: Prometheus families.
//! - [`keepalive`]: the comments a held streamed request gets so proxies with idle timeouts keep its connection.
//! - [`batch`]: the OpenAI Files and Batches API and its runner.
//!
//! A crate of its own (on `core`, `api` and `runtime`, nothing of the controller's): the gateway is the only role
//! on the request path, and it shares with the controller only the wire documents in `tessera_core::wire`.
//!
//! **Priority lanes.** A request's lane is its `service_tier` (`priority`, `flex`) or vLLM `priority` (below 0,
//! above 0); anything else is the default lane. Priority and default requests are never gated. A flex request
//! goes only to a backend with room (`--lane-admit-below`, `--lane-stop-at`, `--lane-max-waiting`); it waits
//! for room at most `--lane-hold-timeout`, outside every queue and bound a real-time request waits in (its own
//! `--lane-max-held`), and is then answered `429` with `Retry-After`.
//!
//! On the public port (`--listen`), besides the API: `GET /v1/models` and `GET /namespaces/<ns>/v1/models` (the
//! models of one namespace, each as its server describes it, `max_model_len` included: [`models`]), `/live`,
//! `/ready` (fails from SIGTERM on; see [`tessera_runtime`]).
//! On the admin listener (`--admin-listen`, [`admin`]), which tenants must not reach: `GET /tessera/v1/stats`
//! (the [`tessera_core::wire::activator::ActivatorStats`] document the controller reads, keyed by
//! `<namespace>/<model>`) and `/metrics`, both of which describe every namespace's traffic.

use tessera_runtime::serve::nonzero_duration;

pub mod admin;
pub mod batch;
pub mod discovery;
pub mod keepalive;
pub mod kube;
pub mod lanes;
pub mod metrics;
pub mod models;
pub mod proxy;
pub mod router;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioTimer;
use tessera_core::lanes::LaneLimits;
use tessera_runtime::Graceful;
use tracing::info;

use self::discovery::{Discovery, StaticBackend, StaticDiscovery, StaticSidecar};
use self::proxy::{App, Limits};
use self::router::{Admission, Router};

/// The activator's errors at start-up and in its background tasks.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
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
    /// The flex lane's thresholds are inconsistent.
    #[error("{0}")]
    Lanes(String),
    /// The batch store could not be opened.
    #[error("--batch-store: {0}")]
    BatchStore(batch::store::StoreError),
    /// Flags that do not fit together (the message names them).
    #[error("{0}")]
    Config(String),
}

impl ActivatorError {
    /// A fixed label per variant, for metrics and logs.
    pub fn label(&self) -> &'static str {
        self.into()
    }
}

// `--help` headings: the flags grouped by what a platform engineer sets them for.
const SERVING: &str = "Serving and shutdown";
const BACKENDS: &str = "Static backends (no Kubernetes)";
const KUBE: &str = "Kubernetes";
const HOLD: &str = "Holding requests (scale from zero)";
const LIMITS: &str = "Limits and timeouts";
const LANE: &str = "Flex lane (service_tier: flex, batch)";

/// `tessera activator` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Address of the public port: the OpenAI API every client reaches, /live and /ready.
    #[arg(help_heading = SERVING, long, env = "TESSERA_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,

    /// Address of the admin listener: /tessera/v1/stats (the demand the autoscaler reads, --activator-url or
    /// --activator-service there), /metrics, /live and /ready. Both documents describe every namespace's traffic,
    /// so they are not served on --listen; keep this port reachable only by the control plane and Prometheus
    /// (the chart's NetworkPolicy does).
    #[arg(help_heading = SERVING, long, env = "TESSERA_ADMIN_LISTEN", default_value = "0.0.0.0:9090")]
    pub admin_listen: SocketAddr,

    /// A static backend, `<model>=<url>` (repeatable, or comma-separated in the environment variable). With
    /// none, backends come from Kubernetes EndpointSlices and InferenceAutoscalers.
    #[arg(help_heading = BACKENDS, long = "backend", env = "TESSERA_BACKENDS", value_delimiter = ',')]
    pub backends: Vec<StaticBackend>,

    /// The sidecar of a static backend, `<model>=<url>` (repeatable; the n-th `--sidecar` of a model belongs to
    /// its n-th `--backend`). The backend is then ready only while its sidecar's `/ready` is (a sleeping replica is
    /// not), and the first request held for the model asks the sidecar to wake it (`POST /tessera/v1/wake`).
    #[arg(help_heading = BACKENDS, long = "sidecar", env = "TESSERA_SIDECARS", value_delimiter = ',')]
    pub sidecars: Vec<StaticSidecar>,

    /// Kubernetes mode: the port of the replicas' sidecars (the webhook's `--sidecar-port`, 9090 by default). With it,
    /// the first request held for a model asks the sidecar of each of its not-ready, not-terminating endpoints to
    /// wake (`POST /tessera/v1/wake`): a sleeping replica is not ready, and wakes at once rather than when the
    /// controller next withdraws its instruction. Without it, Kubernetes mode wakes nothing itself.
    #[arg(help_heading = KUBE, long, env = "TESSERA_SIDECAR_PORT")]
    pub sidecar_port: Option<u16>,

    /// A streamed request (`"stream": true`) held this long without a replica gets response headers (200,
    /// text/event-stream) and an SSE comment line, then one every interval until the stream starts, so clients
    /// and proxies with idle timeouts keep the connection. 0 turns it off. Non-streamed requests never get
    /// anything early.
    #[arg(help_heading = HOLD, long, env = "TESSERA_KEEPALIVE_INTERVAL", value_parser = humantime::parse_duration, default_value = "5s")]
    pub keepalive_interval: Duration,

    /// Namespace of requests that name none (`/v1/...` rather than `/namespaces/<ns>/v1/...`) and of every
    /// `--backend`. Default: `--namespace` when set, else `default`.
    #[arg(help_heading = KUBE, long, env = "TESSERA_DEFAULT_NAMESPACE")]
    pub default_namespace: Option<String>,

    /// Most requests held per model while it has no ready backend; beyond it the activator answers 503
    /// (0: never hold, answer 503 at once).
    #[arg(help_heading = HOLD, long, env = "TESSERA_QUEUE_SIZE", default_value_t = 100)]
    pub queue_size: u64,

    /// Most requests held at once, all models together; beyond it the activator sheds with 429 + Retry-After.
    #[arg(help_heading = HOLD, long, env = "TESSERA_MAX_HELD", default_value_t = 1000)]
    pub max_held: u64,

    /// Most requests admitted at once (reading their body, held, forwarded or streaming back), all models
    /// together; beyond it the activator sheds with 429 + Retry-After before reading the body.
    #[arg(help_heading = LIMITS, long, env = "TESSERA_MAX_IN_FLIGHT", default_value_t = 4096)]
    pub max_in_flight: u64,

    /// Longest a request is held waiting for a backend before a 503 (covers a cold start of the model server).
    #[arg(help_heading = HOLD, long, env = "TESSERA_HOLD_TIMEOUT", value_parser = humantime::parse_duration, default_value = "60s")]
    pub hold_timeout: Duration,

    /// `Retry-After` sent with the activator's own 503 answers (rounded to whole seconds, at least 1).
    #[arg(help_heading = HOLD, long, env = "TESSERA_RETRY_AFTER", value_parser = humantime::parse_duration, default_value = "5s")]
    pub retry_after: Duration,

    /// Largest request body accepted (`16MiB`, `16Mi`, bytes; the body is read to find its `model`). A larger
    /// `Content-Length` is refused (413) before reading; a chunked body is cut off at the limit.
    #[arg(help_heading = LIMITS, long, env = "TESSERA_MAX_BODY_SIZE", default_value = "16MiB", value_parser = tessera_runtime::size::parse_bytes_usize)]
    pub max_body_size: usize,

    /// Most bytes of request bodies buffered at once, all requests together (held requests keep theirs); a
    /// body that would exceed it is shed with 429 + Retry-After. Bounds the activator's memory.
    #[arg(help_heading = LIMITS, long, env = "TESSERA_MAX_BUFFERED_BODY_BYTES", default_value = "256MiB", value_parser = tessera_runtime::size::parse_bytes_usize)]
    pub max_buffered_body_bytes: usize,

    /// Client connection bounds: `--header-read-timeout` (a silent, trickling or half-open connection is
    /// closed) and `--client-idle-timeout` (no request in flight).
    #[command(flatten, next_help_heading = LIMITS)]
    pub conn: tessera_runtime::serve::ConnArgs,

    /// Longest a client may take to send its whole request body (then 408).
    #[arg(help_heading = LIMITS, long, env = "TESSERA_BODY_READ_TIMEOUT", value_parser = nonzero_duration, default_value = "30s")]
    pub body_read_timeout: Duration,

    /// Longest a backend may take to send response headers after the request was sent (then 504). A
    /// non-streaming completion sends its headers only when it is done, so keep this above the longest
    /// generation.
    #[arg(help_heading = LIMITS, long, env = "TESSERA_RESPONSE_HEADER_TIMEOUT", value_parser = nonzero_duration, default_value = "10m")]
    pub response_header_timeout: Duration,

    /// Longest a backend may go without sending anything of a response body it has started (a stalled stream):
    /// then the client's connection is aborted, as for a backend that died, and the backend is released. Keep it
    /// above the longest gap between two tokens of a loaded server.
    #[arg(help_heading = LIMITS, long, env = "TESSERA_UPSTREAM_STREAM_TIMEOUT", value_parser = nonzero_duration, default_value = "2m")]
    pub upstream_stream_timeout: Duration,

    /// How long an idle pooled connection to a backend is kept. Must stay below the backend's keep-alive
    /// (vLLM/uvicorn closes idle connections after 5 s): reusing a connection the backend is closing fails the
    /// request after it was sent, which cannot safely be retried.
    #[arg(help_heading = LIMITS, long, env = "TESSERA_UPSTREAM_IDLE_TIMEOUT", value_parser = nonzero_duration, default_value = "4s")]
    pub upstream_idle_timeout: Duration,

    /// Static backends: the path probed for readiness (vLLM serves `/health`).
    #[arg(help_heading = BACKENDS, long, env = "TESSERA_HEALTH_PATH", default_value = "/health")]
    pub health_path: String,

    /// Static backends: probe interval while nobody is waiting.
    #[arg(help_heading = BACKENDS, long, env = "TESSERA_PROBE_INTERVAL", value_parser = nonzero_duration, default_value = "5s")]
    pub probe_interval: Duration,

    /// Static backends: probe interval while requests are held for a model with no ready backend (bounds the
    /// latency a scale from zero adds beyond the backend turning ready).
    #[arg(help_heading = BACKENDS, long, env = "TESSERA_PROBE_INTERVAL_HELD", value_parser = nonzero_duration, default_value = "5ms")]
    pub probe_interval_held: Duration,

    /// Kubernetes: watch only this namespace (default: all namespaces).
    #[arg(help_heading = KUBE, long, env = "TESSERA_NAMESPACE")]
    pub namespace: Option<String>,

    /// Kubernetes: the EndpointSlice port name to route to (default: the slice's only or first port).
    #[arg(help_heading = KUBE, long, env = "TESSERA_PORT_NAME")]
    pub port_name: Option<String>,

    /// This instance's name in the stats document and its Events (the pod name in a cluster; default: the
    /// listen address).
    #[arg(help_heading = SERVING, long, env = "TESSERA_INSTANCE")]
    pub instance: Option<String>,

    /// Flex lane (`service_tier: flex`, a vLLM `priority` above 0): admitted freely while the backend's KV-cache
    /// usage is under this fraction.
    #[arg(help_heading = LANE, long, env = "TESSERA_LANE_ADMIT_BELOW", default_value_t = 0.5)]
    pub lane_admit_below: f64,

    /// Flex lane: no flex request goes to a backend at or above this KV-cache usage; between
    /// `--lane-admit-below` and this, at most `--lane-throttle-in-flight` are in flight per backend.
    #[arg(help_heading = LANE, long, env = "TESSERA_LANE_STOP_AT", default_value_t = 0.6)]
    pub lane_stop_at: f64,

    /// Flex lane: no flex request goes to a backend while another model on its GPU is at or above this share of
    /// the TTFT p95 its replica count scales up at (the controller publishes it in the InferenceAutoscaler's
    /// status, `flexPaused`).
    #[arg(help_heading = LANE, long, env = "TESSERA_LANE_NEIGHBOUR_STOP_AT", default_value_t = 0.8)]
    pub lane_neighbour_stop_at: f64,

    /// Flex lane: no flex request goes to a backend with more requests than this waiting in its own queue.
    #[arg(help_heading = LANE, long, env = "TESSERA_LANE_MAX_WAITING", default_value_t = 0.0)]
    pub lane_max_waiting: f64,

    /// Flex lane: flex requests in flight per backend in the throttled band (and while its gauges are unknown).
    #[arg(help_heading = LANE, long, env = "TESSERA_LANE_THROTTLE_IN_FLIGHT", default_value_t = 1)]
    pub lane_throttle_in_flight: u64,

    /// Flex lane: flex requests in flight per backend below `--lane-admit-below`.
    #[arg(help_heading = LANE, long, env = "TESSERA_LANE_MAX_IN_FLIGHT", default_value_t = 64)]
    pub lane_max_in_flight: u64,

    /// Flex lane: most flex-tier requests and batch lines waiting at once, all models together (for a backend
    /// with room, or for a replica of a model at zero); beyond it they are answered 429 `overloaded_lane_held`
    /// with `--lane-retry-after`. A waiting flex request holds none of `--max-in-flight`, `--max-held` or
    /// `--queue-size`, so no flood of them can shed a real-time request; it counts in `--max-in-flight` only
    /// while its body is read, and once sent it is bounded by the gate's per-backend `--lane-max-in-flight`.
    #[arg(help_heading = LANE, long, env = "TESSERA_LANE_MAX_HELD", default_value_t = 512,
        value_parser = clap::value_parser!(u64).range(1..))]
    pub lane_max_held: u64,

    /// Flex lane: most bytes of request bodies held by waiting flex-tier requests and batch lines, all together.
    /// A flex request that starts waiting moves its body out of `--max-buffered-body-bytes` into this budget (or
    /// is answered 429 `overloaded_lane_held` when it is full), so waiting flex bodies never take real time's.
    #[arg(help_heading = LANE, long, env = "TESSERA_LANE_MAX_HELD_BODY_BYTES", default_value = "64MiB",
        value_parser = tessera_runtime::size::parse_bytes_nonzero)]
    pub lane_max_held_body_bytes: u64,

    /// Flex lane: longest a flex request waits for a backend with room before a 429 with Retry-After (never a
    /// timeout at the client).
    #[arg(help_heading = LANE, long, env = "TESSERA_LANE_HOLD_TIMEOUT", value_parser = humantime::parse_duration, default_value = "10s")]
    pub lane_hold_timeout: Duration,

    /// Flex lane: how often backends' gauges are read (only for models with flex traffic) and a waiting flex
    /// request looks for room again.
    #[arg(help_heading = LANE, long, env = "TESSERA_LANE_POLL_INTERVAL", value_parser = nonzero_duration, default_value = "200ms")]
    pub lane_poll_interval: Duration,

    /// Flex lane: `Retry-After` on its 429 (rounded to whole seconds, at least 1).
    #[arg(help_heading = LANE, long, env = "TESSERA_LANE_RETRY_AFTER", value_parser = humantime::parse_duration, default_value = "5s")]
    pub lane_retry_after: Duration,

    /// Set each request's vLLM `priority` from its lane: flex-tier requests and batch lines always get the
    /// batch class's 10, replacing any priority of their own (so none runs ahead of real time); a priority-tier
    /// request without one gets -1; real-time requests keep theirs. Only for servers started with
    /// `--scheduling-policy priority`: vLLM refuses a non-zero priority otherwise.
    #[arg(help_heading = LANE, long, env = "TESSERA_LANE_PRIORITY")]
    pub lane_priority: bool,

    /// Graceful shutdown (`--drain-period`): after SIGTERM `/ready` fails while requests are still served; at
    /// the end, requests still held are answered 503 + Retry-After.
    #[command(flatten, next_help_heading = SERVING)]
    pub drain: tessera_runtime::DrainArgs,

    /// The OpenAI Files and Batches API (`--batch-store` and its bounds).
    #[command(flatten, next_help_heading = "Batch API (Files and Batches)")]
    pub batch: batch::BatchArgs,
}

/// Runs the activator until SIGTERM (and the drain after it) or Ctrl-C.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let graceful = Graceful::on_signals(args.drain.drain_period);
    admin::check_distinct(args.listen, args.admin_listen).map_err(ActivatorError::Config)?;
    let listener = bind(args.listen).await?;
    let local = listener.local_addr().map_err(ActivatorError::Serve)?;
    let admin_listener = bind(args.admin_listen).await?;
    let admin_local = admin_listener.local_addr().map_err(ActivatorError::Serve)?;
    let started = SystemTime::now();
    let instance = args.instance.clone().unwrap_or_else(|| local.to_string());
    // The runner's lease names the process: a restarted activator with the same name must not take its dead
    // predecessor's lease as its own before it expires (the results it left are rebuilt first either way).
    let batch_instance = format!("{instance}-{}", std::process::id());
    let default_namespace = args
        .default_namespace
        .clone()
        .or_else(|| args.namespace.clone())
        .unwrap_or_else(|| "default".to_string());
    let admission = Admission::with_lane(args.max_in_flight, args.max_held, args.lane_max_held);
    let router = Arc::new(Router::new(
        args.queue_size,
        admission,
        instance.clone(),
        tessera_runtime::unix_ms(started),
    ));

    if args.backends.is_empty() && !args.sidecars.is_empty() {
        return Err(ActivatorError::Config(
            "--sidecar pairs with --backend (static mode); in Kubernetes mode give --sidecar-port instead"
                .into(),
        )
        .into());
    }
    let discovery: Arc<dyn Discovery> = if args.backends.is_empty() {
        let client = tessera_runtime::kube_client::client()
            .await
            .map_err(|e| ActivatorError::KubeConfig(e.to_string()))?;
        Arc::new(
            kube::KubeDiscovery::new(client, args.namespace.clone(), args.port_name.clone(), instance)
                .with_sidecar_port(args.sidecar_port),
        )
    } else {
        let sidecars =
            discovery::pair_sidecars(&args.backends, &args.sidecars).map_err(ActivatorError::Config)?;
        Arc::new(
            StaticDiscovery::new(
                args.backends.clone(),
                default_namespace.clone(),
                args.health_path.clone(),
                args.probe_interval_held,
                args.probe_interval,
            )
            .with_sidecars(sidecars),
        )
    };
    let discovery_task = tokio::spawn(discovery.clone().run(router.clone()));
    let lanes = LaneLimits {
        admit_below: args.lane_admit_below,
        stop_at: args.lane_stop_at,
        max_waiting: args.lane_max_waiting,
        throttle_in_flight: args.lane_throttle_in_flight,
        max_in_flight: args.lane_max_in_flight,
        // Gauges older than a few reads say nothing about the room now.
        max_age: (args.lane_poll_interval * 5).max(Duration::from_secs(1)),
        neighbour_stop_at: args.lane_neighbour_stop_at,
    };
    lanes.validate().map_err(ActivatorError::Lanes)?;
    let lanes_task = tokio::spawn(lanes::run(
        router.clone(),
        backend_client(args.upstream_idle_timeout),
        args.lane_poll_interval,
    ));

    // Semaphore permits are counted in usize but acquired in u32 chunks; a budget beyond Tokio's maximum is capped.
    let budget = args
        .max_buffered_body_bytes
        .min(tokio::sync::Semaphore::MAX_PERMITS);
    let app = Arc::new(App {
        router,
        discovery,
        metrics: metrics::Metrics::new(),
        client: backend_client(args.upstream_idle_timeout),
        limits: Limits {
            hold_timeout: args.hold_timeout,
            retry_after: args.retry_after,
            max_body_bytes: args.max_body_size,
            body_read_timeout: args.body_read_timeout,
            response_header_timeout: args.response_header_timeout,
            stream_idle_timeout: args.upstream_stream_timeout,
            lanes,
            lane_hold_timeout: args.lane_hold_timeout,
            lane_poll_interval: args.lane_poll_interval,
            lane_retry_after: args.lane_retry_after,
            lane_priority: args.lane_priority,
            keepalive_interval: args.keepalive_interval,
        },
        body_budget: Arc::new(tokio::sync::Semaphore::new(budget)),
        lane_body_budget: Arc::new(tokio::sync::Semaphore::new(
            usize::try_from(args.lane_max_held_body_bytes)
                .unwrap_or(usize::MAX)
                .min(tokio::sync::Semaphore::MAX_PERMITS),
        )),
        graceful: graceful.clone(),
        default_namespace,
    });
    let batches = match &args.batch.batch_store {
        Some(dir) => {
            let store = batch::store::LocalStore::open(dir).map_err(ActivatorError::BatchStore)?;
            Some(batch::Batches::new(
                Arc::new(store),
                args.batch.limits(),
                app.clone(),
                batch_instance,
            ))
        }
        None => None,
    };
    let runner_task = batches.clone().map(|b| tokio::spawn(batch::runner::run(b)));
    let service = graceful.ready_gate(
        axum::Router::new()
            .route("/v1/models", get(list_default_models))
            .route("/namespaces/{namespace}/v1/models", get(list_models))
            .route("/v1/models/{*id}", get(get_default_model))
            .route("/namespaces/{namespace}/v1/models/{*id}", get(get_model))
            .route("/live", get(|| async { "ok" }))
            .route("/ready", get(admin::ready))
            .route("/v1/{*rest}", post(proxy::handle))
            .route("/namespaces/{namespace}/v1/{*rest}", post(proxy::handle))
            .fallback(not_found)
            .with_state(app.clone())
            .merge(batch::api::routes(batches)),
    );
    let admin_service = graceful.ready_gate(admin::routes(app));
    let limits = args.conn.limits();
    info!(listen = %local, admin_listen = %admin_local, "activator listening");
    tokio::select! {
        // Both stop together at the end of the drain: the controller keeps reading held requests until then.
        ((), ()) = async {
            tokio::join!(
                tessera_runtime::serve::serve(listener, service, limits, graceful.stopping()),
                tessera_runtime::serve::serve(admin_listener, admin_service, limits, graceful.stopping()),
            )
        } => {}
        ended = discovery_task => {
            match ended {
                Ok(Ok(())) => anyhow::bail!("backend discovery stopped unexpectedly"),
                Ok(Err(e)) => return Err(e.into()),
                Err(e) => anyhow::bail!("backend discovery panicked: {e}"),
            }
        }
    }
    lanes_task.abort();
    if let Some(t) = runner_task {
        t.abort();
    }
    info!("activator stopped");
    Ok(())
}

/// Binds `addr`, or says which address is taken.
async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, ActivatorError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ActivatorError::Bind { addr, source })
}

/// The pooled keep-alive client to backends: TCP_NODELAY, idle connections kept (for `idle_timeout`, below the
/// backend's own keep-alive) so the proxy hop costs no handshake.
pub fn backend_client(idle_timeout: Duration) -> Client<HttpConnector, http_body_util::Full<bytes::Bytes>> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(Duration::from_secs(5)));
    Client::builder(hyper_util::rt::TokioExecutor::new())
        // The timer makes the pool drop idle connections on time, not only when it next looks at them.
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(idle_timeout)
        .pool_max_idle_per_host(1024)
        // A request hyper never started writing to a pooled connection that turned out closed is retried on a
        // fresh one: nothing reached the backend (the default, stated because the proxy relies on it).
        .retry_canceled_requests(true)
        .build(connector)
}

async fn list_default_models(State(app): State<Arc<App>>) -> Response {
    models::list(&app, &app.default_namespace).await
}

async fn list_models(State(app): State<Arc<App>>, Path(namespace): Path<String>) -> Response {
    models::list(&app, &namespace).await
}

async fn get_default_model(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    models::one(&app, &app.default_namespace, &id).await
}

async fn get_model(State(app): State<Arc<App>>, Path((namespace, id)): Path<(String, String)>) -> Response {
    models::one(&app, &namespace, &id).await
}

async fn not_found(uri: http::Uri) -> Response {
    if let Some(dev) = proxy::dev_endpoint(uri.path()) {
        return proxy::refuse_dev_endpoint(dev);
    }
    if let Some(path) = admin::admin_only(uri.path()) {
        return admin::refuse_on_public_port(path);
    }
    let body = serde_json::json!({ "error": {
        "message": "no such route; the gateway serves POST /v1/... and /namespaces/<namespace>/v1/... (OpenAI API) \
            and GET /v1/models",
        "type": "invalid_request_error", "param": null, "code": "not_found" } });
    (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}
