//! `tessera webhook`: the mutating admission webhook for pods. Every managed model pod arrives with the Tessera
//! sidecar, vLLM's memory flags from its InferenceAutoscaler's recommendation, and, in fractional mode, its
//! share of a GPU (reserved through the pool manager, [`tessera_pool::PoolManager::reserve`]).
//!
//! Layers: [`mutate`] (the pure decision: `mutate(&Pod, &Context) -> Result<Mutation, Deny>`), [`vllm`] (pure
//! command-line editing), [`policy`] (pure policy matching), [`admit`] (the handler: cache, reservation,
//! metrics, events; fails open), [`server`] (HTTPS, certificate reload, probes, metrics). This file holds the
//! flags and wires them. See `docs/webhook.md`.

pub mod admit;
pub mod mutate;
pub mod policy;
pub mod server;
pub mod vllm;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use tessera_api::crd::InferenceAutoscaler;
use tessera_pool::{LABEL_CAPACITY_POD, LABEL_POOL, PoolManager, PoolMetrics, PoolsConfig};
use tracing::{info, warn};

/// `tessera webhook` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// HTTPS address for the API server: POST /mutate, and /live, /ready.
    #[arg(long, env = "TESSERA_LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// PEM certificate (chain) for --listen. Reloaded when the file changes (cert-manager, secret rotation).
    #[arg(long, env = "TESSERA_TLS_CERT")]
    pub tls_cert: PathBuf,
    /// PEM private key for --tls-cert. Reloaded with it.
    #[arg(long, env = "TESSERA_TLS_KEY")]
    pub tls_key: PathBuf,
    /// How often the certificate and key files are checked for changes.
    #[arg(long, env = "TESSERA_TLS_RELOAD_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub tls_reload_interval: Duration,
    /// After SIGTERM: `/ready` fails at once and admissions are still served for `--drain-period`.
    #[command(flatten)]
    pub drain: tessera_runtime::DrainArgs,
    /// Connection bounds on both listeners (a stalled TLS handshake, silent or idle connections are closed).
    #[command(flatten)]
    pub conn: tessera_runtime::serve::ConnArgs,
    /// Longest an admission request's body may take to arrive once its headers have (then 408 and the connection
    /// is closed). The API server sends the whole AdmissionReview at once and gives up on the webhook after the
    /// configuration's `timeoutSeconds` (10 s by default, 30 s at most), so a slower body is never the API server.
    #[arg(long, env = "TESSERA_BODY_READ_TIMEOUT", value_parser = tessera_runtime::serve::nonzero_duration, default_value = "10s")]
    pub body_read_timeout: Duration,
    /// Plain-HTTP address for /metrics, /live and /ready.
    #[arg(long, env = "TESSERA_METRICS_LISTEN", default_value = "0.0.0.0:9090")]
    pub metrics_listen: SocketAddr,
    /// Run without a cluster: injection and validation only (no policies, no placement); ready at once.
    #[arg(long, env = "TESSERA_NO_KUBE")]
    pub no_kube: bool,
    /// The image of the injected sidecar (the tessera image).
    #[arg(
        long,
        env = "TESSERA_SIDECAR_IMAGE",
        default_value = "ghcr.io/tessera-dev/tessera:latest"
    )]
    pub sidecar_image: String,
    /// CPU request of the injected sidecar.
    #[arg(long, env = "TESSERA_SIDECAR_CPU", default_value = "50m")]
    pub sidecar_cpu: String,
    /// Memory request and limit of the injected sidecar.
    #[arg(long, env = "TESSERA_SIDECAR_MEMORY", default_value = "64Mi")]
    pub sidecar_memory: String,
    /// Port the injected sidecar listens on (pods that already use it are admitted unchanged).
    #[arg(long, env = "TESSERA_SIDECAR_PORT", default_value_t = 9090)]
    pub sidecar_port: u16,
    /// GPU pool configuration (the autoscaler's format). Without it, fractional pods are admitted unchanged.
    #[arg(long, env = "TESSERA_POOLS_CONFIG")]
    pub pools_config: Option<PathBuf>,
    /// Longest a GPU reservation may take; past it the pod is admitted unchanged (keeps its whole GPU).
    #[arg(long, env = "TESSERA_RESERVATION_TIMEOUT", default_value = "2s", value_parser = humantime::parse_duration)]
    pub reservation_timeout: Duration,
    /// Watch InferenceAutoscalers in this namespace only (default: all namespaces).
    #[arg(long, env = "TESSERA_WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    /// The MPS pipe directory on GPU nodes (CUDA_MPS_PIPE_DIRECTORY of the node's MPS control daemon).
    #[arg(long, env = "TESSERA_MPS_PIPE_DIR", default_value = "/tmp/nvidia-mps")]
    pub mps_pipe_dir: String,
    /// The MPS log directory on GPU nodes (CUDA_MPS_LOG_DIRECTORY).
    #[arg(long, env = "TESSERA_MPS_LOG_DIR", default_value = "/var/log/nvidia-mps")]
    pub mps_log_dir: String,
    /// The node directory that is the MPS control daemon's /dev/shm (the host's /dev/shm for a daemon on the host
    /// or with hostIPC; `<root>/shm` for NVIDIA's device-plugin daemon); mounted at /dev/shm in MPS clients.
    #[arg(long, env = "TESSERA_MPS_SHM_DIR", default_value = "/dev/shm")]
    pub mps_shm_dir: String,
    /// File holding the secret key (≥ 32 bytes) the injected sidecars' objective tokens derive from, the same the
    /// autoscaler holds (the chart's `<release>-objective-key` Secret). Without it no sidecar gets a token and
    /// none takes an objective over HTTP (the InferenceAutoscaler's edits reach pods only as they are recreated).
    #[arg(long, env = "TESSERA_OBJECTIVE_KEY_FILE")]
    pub objective_key_file: Option<PathBuf>,
}

impl Args {
    /// The mutation's configuration (the objective key read by [`run`]).
    pub fn config(&self, pools: Option<Arc<PoolsConfig>>) -> mutate::Config {
        mutate::Config {
            objective_key: None,
            sidecar_image: self.sidecar_image.clone(),
            sidecar_port: self.sidecar_port,
            sidecar_cpu: self.sidecar_cpu.clone(),
            sidecar_memory: self.sidecar_memory.clone(),
            pools,
            mps_pipe_dir: self.mps_pipe_dir.clone(),
            mps_log_dir: self.mps_log_dir.clone(),
            mps_shm_dir: self.mps_shm_dir.clone(),
        }
    }
}

/// Installs rustls's ring provider as the process default (once; later calls are no-ops).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Runs the webhook until SIGTERM or Ctrl-C.
pub async fn run(args: Args) -> anyhow::Result<()> {
    install_crypto_provider();
    let pools = match &args.pools_config {
        Some(path) => Some(Arc::new(PoolsConfig::from_file(path)?)),
        None => None,
    };
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = admit::Metrics::register(&mut registry);
    let pool_metrics = PoolMetrics::register(&mut registry);
    let mut config = args.config(pools.clone());
    if let Some(path) = &args.objective_key_file {
        config.objective_key = Some(Arc::new(tessera_runtime::token::ObjectiveKey::from_file(path)?));
    }
    let mut admitter = admit::Admitter::without_kube(config);
    admitter.reservation_timeout = args.reservation_timeout;
    admitter.metrics = metrics.clone();
    if !args.no_kube {
        // The project's client: explicit connect, read and write timeouts, so a hung API server cannot hold an
        // admission (or the reservation it makes) past the webhook's own deadline.
        let client = tessera_runtime::kube_client::client()
            .await
            .context("no Kubernetes client (run in a cluster, set KUBECONFIG, or pass --no-kube)")?;
        let synced = Arc::new(AtomicBool::new(false));
        let store = watch_policies(client.clone(), args.watch_namespace.as_deref(), synced.clone());
        admitter.policies = admit::Policies::Store(store, synced);
        if let Some(cfg) = &pools {
            let mut managers = HashMap::new();
            admitter.pools_unsynced.store(cfg.pools.len(), Ordering::Release);
            for p in &cfg.pools {
                let m = PoolManager::new(client.clone(), cfg.clone(), &p.name)?
                    .with_metrics(pool_metrics.clone());
                tokio::spawn(watch_capacity(
                    m.clone(),
                    cfg.namespace.clone(),
                    client.clone(),
                    admitter.pools_unsynced.clone(),
                ));
                managers.insert(p.name.clone(), m);
            }
            admitter.pools = Arc::new(managers);
        }
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        admitter.events = Some(tx);
        tokio::spawn(admit::publish_events(client, rx));
    }

    let (cert, key) = server::read_pair(&args.tls_cert, &args.tls_key).with_context(|| {
        format!(
            "cannot read {} / {}",
            args.tls_cert.display(),
            args.tls_key.display()
        )
    })?;
    let tls = axum_server::tls_rustls::RustlsConfig::from_pem(cert.clone(), key.clone())
        .await
        .context("the TLS certificate or key does not load")?;
    tokio::spawn(server::reload_certificates(
        tls.clone(),
        args.tls_cert.clone(),
        args.tls_key.clone(),
        (cert, key),
        args.tls_reload_interval,
        metrics,
    ));

    let state = server::AppState {
        admitter,
        serving: Arc::new(AtomicBool::new(true)),
        registry: Arc::new(registry),
        body_read_timeout: args.body_read_timeout,
    };
    let https =
        std::net::TcpListener::bind(args.listen).with_context(|| format!("cannot bind {}", args.listen))?;
    https.set_nonblocking(true)?;
    let plain = tokio::net::TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("cannot bind {}", args.metrics_listen))?;
    let listen = https.local_addr()?;
    let metrics_listen = plain.local_addr()?;
    info!(%listen, %metrics_listen, no_kube = args.no_kube, "webhook serving");

    // The one shutdown every role shares (tessera-runtime): /ready fails at the signal so the Service's
    // endpoints drop this replica, admissions are still answered for --drain-period (the API server learns of
    // the removal seconds later), then in-flight ones finish.
    let graceful = tessera_runtime::Graceful::on_signals(args.drain.drain_period);
    let serving = state.serving.clone();
    let g = graceful.clone();
    tokio::spawn(async move {
        g.draining().await;
        serving.store(false, Ordering::Release);
        info!("shutting down: /ready fails, still admitting during the drain period");
    });
    let limits = args.conn.limits();
    let metrics_app = server::metrics_router(state.clone());
    let stop = graceful.clone();
    tokio::spawn(async move {
        tessera_runtime::serve::serve(plain, metrics_app, limits, async move { stop.stopping().await }).await;
    });
    https.set_nonblocking(true)?;
    let https = tokio::net::TcpListener::from_std(https)?;
    // Each handshake takes the current configuration, so a reloaded certificate applies to new connections.
    tessera_runtime::serve::serve_tls(
        https,
        server::webhook_router(state),
        limits,
        move || tls.get_inner(),
        graceful.stopping(),
    )
    .await;
    Ok(())
}

/// Starts the InferenceAutoscaler reflector; `synced` turns true once the first list is in the store.
pub fn watch_policies(
    client: kube::Client,
    namespace: Option<&str>,
    synced: Arc<AtomicBool>,
) -> reflector::Store<InferenceAutoscaler> {
    let api: kube::Api<InferenceAutoscaler> = match namespace {
        Some(ns) => kube::Api::namespaced(client, ns),
        None => kube::Api::all(client),
    };
    let (reader, stream) = tessera_runtime::kube_client::reflect(api);
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            if let Err(e) = ev {
                warn!(error = %e, "InferenceAutoscaler watch failed; it retries");
            }
        }
    });
    let r = reader.clone();
    tokio::spawn(async move {
        if r.wait_until_ready().await.is_ok() {
            synced.store(true, Ordering::Release);
            info!("InferenceAutoscaler cache synced");
        }
    });
    reader
}

/// Keeps a pool manager's index of capacity pods current (new GPUs, published UUIDs, other replicas'
/// reservations) and counts the pool as synced after its first full list (until then `/ready` fails: a cold
/// index would try to create capacity pods that already exist). The webhook never reconciles or deletes: the
/// autoscaler's leader does.
async fn watch_capacity(
    manager: PoolManager,
    namespace: String,
    client: kube::Client,
    unsynced: Arc<std::sync::atomic::AtomicUsize>,
) {
    let api: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(client, &namespace);
    let selector = format!("{LABEL_POOL}={},{LABEL_CAPACITY_POD}=true", manager.pool().name);
    let stream = watcher(
        api,
        tessera_runtime::kube_client::watcher_config().labels(&selector),
    )
    .default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut buffer = Vec::new();
    let mut synced = false;
    while let Some(ev) = stream.next().await {
        if !synced && matches!(ev, Ok(watcher::Event::InitDone)) {
            synced = true;
            unsynced.fetch_sub(1, Ordering::AcqRel);
        }
        match ev {
            Ok(watcher::Event::Init) => buffer.clear(),
            Ok(watcher::Event::InitApply(p)) => buffer.push(p),
            Ok(watcher::Event::InitDone) => manager.index().reset_capacity(&std::mem::take(&mut buffer)),
            Ok(watcher::Event::Apply(p)) => manager.index().apply_capacity(&p),
            Ok(watcher::Event::Delete(p)) => {
                if let Some(n) = p.metadata.name.as_deref() {
                    manager.index().delete_capacity(n);
                }
            }
            Err(e) => warn!(error = %e, pool = %manager.pool().name, "capacity pod watch failed; it retries"),
        }
    }
}
