//! `tessera autoscaler`: the InferenceAutoscaler controller, the HPA replacement for model servers.
//!
//! - [`reconcile`]: one object per call — read `/scale`, read every ready replica's sidecar, add the activator's
//!   demand, decide with [`tessera_core::scale::joint::round`] and [`tessera_core::scale::joint::decide`], scale through `/scale`, write status, emit Events.
//! - [`class`]: what the round's workload-class step reads (pin, owner, Kueue queue, request mix), the class
//!   resumed from status, and the Event when it changes.
//! - [`signals`]: the sidecar and activator documents and their conversion into the core's input.
//! - [`status`]: HPA-like conditions, built purely from a decision.
//! - [`coldstart`]: what the cold-start rules carry between rounds and across processes — the measured cold start,
//!   a budget group's claims within a namespace, and the copy of a budgeted model's day-long ledger in
//!   `status.coldStartLedger` that a restarted controller or a new leader resumes.
//! - [`allocation`]: the allocation in force (`status.allocation`), the `AllocationInSync` condition and the rolls
//!   of `updateMode: Recreate` ([`rollout`] holds their rules); [`consolidate`]: moving pods off a draining GPU.
//! - [`metrics`]: the Prometheus registry served on `/metrics`.
//! - [`crate::leader`]: only the replica holding the `Lease` reconciles; others stand by.
//! - [`crate::pool::run_pools_with_metrics`]: with `--pools-config`, the leader also runs the GPU pool manager
//!   (its `tessera_pool_*` metrics on the same `/metrics`).
//!
//! **Wake-up contract with the activator (contract 2).** The activator writes nothing to the Kubernetes API for
//! wake-ups. The controller finds every activator pod through the EndpointSlices of `--activator-service`
//! ([`discovery`]; or takes fixed `--activator-url`s), reads each pod's stats every `--activator-poll-interval`
//! (default 1 s), and any fresh document with `queued > 0` for a model (key `"<namespace>/<model>"`) reconciles
//! that model's InferenceAutoscaler at once — from zero, at least one replica, no stabilization. The same
//! documents give the request rate, in-flight and queued counts and the last arrival; idle is decided only when
//! every known activator pod gave a fresh document, and without them a model is never scaled to zero.

pub mod allocation;
pub mod claims;
pub mod class;
pub mod coldstart;
pub mod consolidate;
pub mod context;
pub mod deletion_cost;
pub mod discovery;
pub mod gate_events;
pub mod injection;
pub mod isolation;
pub mod metrics;
pub mod neighbours;
mod objective;
pub mod owner_events;
pub mod owners;
pub mod pods;
mod pollers;
pub mod reconcile;
pub mod rollout;
pub mod scales;
mod serving;
pub mod sidecar_url;
pub mod signals;
pub mod sleep;
pub mod sleep_room;
pub mod status;
mod term;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use futures::StreamExt;
use kube::Api;
use kube::runtime::Controller;
use kube::runtime::events::{Recorder, Reporter};
use tokio::sync::watch;

use crate::crd::InferenceAutoscaler;
use context::{Context, Settings};
use metrics::Metrics;
use signals::{ActivatorPoller, SignalSource};

// `--help` headings: the flags grouped by what a platform engineer sets them for.
const SERVING: &str = "Serving";
const KUBE: &str = "Scaling rounds";
const SIDECARS: &str = "Sidecars";
const ACTIVATOR: &str = "Activator";
const LEADER: &str = "Leader election";

/// `tessera autoscaler` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Address to serve /metrics, /live and /ready on.
    #[arg(help_heading = SERVING, long, env = "TESSERA_METRICS_LISTEN", default_value = "0.0.0.0:9091")]
    pub metrics_listen: SocketAddr,
    /// Client connection bounds (`--header-read-timeout`, `--client-idle-timeout`): a silent, trickling or idle
    /// connection is closed.
    #[command(flatten, next_help_heading = SERVING)]
    pub conn: tessera_runtime::serve::ConnArgs,
    /// Only watch InferenceAutoscalers in this namespace (default: all namespaces).
    #[arg(help_heading = KUBE, long, env = "TESSERA_WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    /// How often every InferenceAutoscaler is decided again (HPA's --horizontal-pod-autoscaler-sync-period).
    #[arg(help_heading = KUBE, long, env = "TESSERA_SYNC_PERIOD", default_value = "15s", value_parser = humantime::parse_duration)]
    pub sync_period: Duration,
    /// Port of the tessera sidecar on each model pod (override per pod with the tessera.dev/sidecar-port annotation).
    #[arg(help_heading = SIDECARS, long, env = "TESSERA_SIDECAR_PORT", default_value_t = 9090)]
    pub sidecar_port: u16,
    /// Timeout for each sidecar /v1/status and activator stats request.
    #[arg(help_heading = SIDECARS, long, env = "TESSERA_SCRAPE_TIMEOUT", default_value = "2s", value_parser = humantime::parse_duration)]
    pub scrape_timeout: Duration,
    /// The most bytes read of one document from a pod (a sidecar's /v1/status, an activator's stats, a
    /// gpu-agent's /v1/gpus; `8MiB`, `8Mi` or bytes): generous for a sidecar's status (tens of KiB) or an
    /// activator's stats with thousands of models, far below any role's memory limit. A larger answer is refused and counted
    /// (`tessera_autoscaler_scrape_failures_total{reason="too_large"}`), and the document counts as missing:
    /// a tenant's pod chooses what it answers and must not be able to run the autoscaler out of memory.
    #[arg(help_heading = SIDECARS, long, env = "TESSERA_MAX_DOCUMENT_SIZE", default_value = "8MiB", value_parser = tessera_runtime::size::parse_bytes_usize)]
    pub max_document_size: usize,
    /// File holding the secret key (≥ 32 bytes) the sidecars' objective tokens derive from, the same the webhook
    /// holds (the chart's `<release>-objective-key` Secret). Each hand-over of an objective (`PUT /v1/objective`)
    /// carries the pod namespace's token; without the key none does and sidecars refuse them (401), so spec edits
    /// of `ttftSlo`/`itlSlo` reach pods only as they are recreated.
    #[arg(help_heading = SIDECARS, long, env = "TESSERA_OBJECTIVE_KEY_FILE")]
    pub objective_key_file: Option<std::path::PathBuf>,
    /// A sidecar snapshot older than this counts as missing data (never a reason to scale down).
    #[arg(help_heading = SIDECARS, long, env = "TESSERA_MAX_SIGNAL_AGE", default_value = "30s", value_parser = humantime::parse_duration)]
    pub max_signal_age: Duration,
    /// The activator's admin Service as NAMESPACE/NAME: every activator pod is found through its EndpointSlices
    /// and its stats read directly on its admin listener (the slice's port named `admin`, else 9090), since
    /// behind a Service each pod sees only its share of the requests. The usual setting in a cluster (the
    /// chart's `<release>-activator-admin`).
    #[arg(help_heading = ACTIVATOR, long, env = "TESSERA_ACTIVATOR_SERVICE", value_parser = discovery::parse_service)]
    pub activator_service: Option<(String, String)>,
    /// Base URL of an activator's admin listener (its `--admin-listen`, e.g. http://127.0.0.1:9090), whose
    /// stats to read (repeatable, one per activator process), for static setups without --activator-service. Neither: models are never scaled to zero and the request-rate signal has no
    /// data.
    #[arg(help_heading = ACTIVATOR, long = "activator-url", env = "TESSERA_ACTIVATOR_URLS", value_delimiter = ',')]
    pub activator_urls: Vec<String>,
    /// How often to read every activator pod's stats; a held request wakes its model's reconcile within this.
    #[arg(help_heading = ACTIVATOR, long, env = "TESSERA_ACTIVATOR_POLL_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub activator_poll_interval: Duration,
    /// An activator document older than this (or a failed poll) makes the demand unknown: no scale to zero.
    #[arg(help_heading = ACTIVATOR, long, env = "TESSERA_ACTIVATOR_MAX_AGE", default_value = "5s", value_parser = humantime::parse_duration)]
    pub activator_max_age: Duration,
    /// `gpu.updateMode`: a recommendation must stay within 5% of itself this long before it comes into force
    /// (new pods get it), and running pods must have drifted this long before a `Recreate` roll. A growth while
    /// vLLM preempts is applied at once.
    #[arg(help_heading = KUBE, long, env = "TESSERA_ROLLOUT_STABILITY_WINDOW", default_value = "30m", value_parser = humantime::parse_duration)]
    pub rollout_stability_window: Duration,
    /// `Recreate`: running pods whose memory or compute differs from the allocation in force by more than this
    /// fraction (0.15 = 15%) are rolled.
    #[arg(help_heading = KUBE, long, env = "TESSERA_ROLLOUT_DRIFT_THRESHOLD", default_value_t = 0.15)]
    pub rollout_drift_threshold: f64,
    /// Elect a leader with a Lease so several replicas can run (only the leader reconciles).
    #[arg(help_heading = LEADER, long, env = "TESSERA_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Name of the leader Lease.
    #[arg(help_heading = LEADER, long, env = "TESSERA_LEASE_NAME", default_value = "tessera-autoscaler")]
    pub lease_name: String,
    /// Namespace of the leader Lease (in a pod: its own namespace via the downward API).
    #[arg(help_heading = LEADER, long, env = "TESSERA_LEASE_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// This replica's identity in the Lease and in Events (in a pod: its name via the downward API).
    #[arg(help_heading = LEADER, long, env = "TESSERA_IDENTITY")]
    pub identity: Option<String>,
    /// How long a Lease lives without renewal.
    #[arg(help_heading = LEADER, long, env = "TESSERA_LEASE_DURATION", default_value = "15s", value_parser = humantime::parse_duration)]
    pub lease_duration: Duration,
    /// A leader that could not renew for this long stops reconciling (must be shorter than --lease-duration).
    #[arg(help_heading = LEADER, long, env = "TESSERA_RENEW_DEADLINE", default_value = "10s", value_parser = humantime::parse_duration)]
    pub renew_deadline: Duration,
    /// How often to try to acquire or renew the Lease.
    #[arg(help_heading = LEADER, long, env = "TESSERA_RETRY_PERIOD", default_value = "2s", value_parser = humantime::parse_duration)]
    pub retry_period: Duration,
    /// GPU pools (YAML, e.g. deploy/examples/gpu-pools.yaml) whose capacity pods the leader manages. Unset: no
    /// pool manager runs here (whole-GPU replicas need none).
    #[arg(help_heading = "GPU pools", long, env = "TESSERA_POOLS_CONFIG")]
    pub pools_config: Option<std::path::PathBuf>,
    /// How often the pool manager reconciles capacity pods and reservations.
    #[arg(help_heading = "GPU pools", long, env = "TESSERA_POOL_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub pool_interval: Duration,
    /// The GPU workloads page (`/ui`) and its local mode.
    #[command(flatten, next_help_heading = "/ui page")]
    pub ui: crate::ui::PageArgs,
    /// KEDA's external scaler (`--keda-scaler-listen`).
    #[command(flatten, next_help_heading = "KEDA external scaler")]
    pub keda: crate::keda::KedaArgs,
}

#[derive(Debug)]
struct Health {
    metrics: Arc<Metrics>,
    ready: AtomicBool,
}

/// Runs the controller until SIGTERM or Ctrl-C (`--no-kube` is the local page's: [`crate::run`] dispatches it).
/// Every replica serves (`/metrics`, `/ui`, `/live`, `/ready`), polls the activators and answers KEDA; only the
/// leader reconciles and runs the pool manager, one leadership term at a time ([`term::lead`]).
pub async fn run(args: Args) -> anyhow::Result<()> {
    validate(&args)?;
    // Read the pools first: a typo in the file should stop the process at once, not at the first election.
    let pools = match &args.pools_config {
        Some(path) => Some(Arc::new(
            crate::pool::PoolsConfig::from_file(path)
                .with_context(|| format!("reading --pools-config {}", path.display()))?,
        )),
        None => None,
    };
    let client = crate::kube_client::client().await?;
    let identity = args
        .identity
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("tessera-autoscaler-{}", std::process::id()));
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health {
        metrics: metrics.clone(),
        ready: AtomicBool::new(false),
    });

    // No drain: the controller serves no traffic, and stopping at once releases the Lease to a standby sooner.
    let graceful = tessera_runtime::Graceful::on_signals(Duration::ZERO);
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let stopping = graceful.clone();
    tokio::spawn(async move {
        stopping.stopping().await;
        shutdown_tx.send_replace(true);
    });

    let (ui, server) = serving::serve(&args, &graceful, health.clone(), shutdown_rx.clone()).await?;
    let source = pollers::signal_source(&args)?;
    let page = term::PoolPage::new(&args)?;
    let activators = pollers::start(
        &args,
        &client,
        source.clone(),
        metrics.clone(),
        shutdown_rx.clone(),
    )?;
    let keda_server = keda_scaler(&args, &client, &activators, &metrics, shutdown_rx.clone()).await?;
    let (mut leader_rx, election) = term::elect(&args, &client, &identity, shutdown_rx.clone());
    health.ready.store(true, Ordering::Relaxed);

    let ctx = context(
        &args,
        &client,
        &identity,
        source,
        activators,
        metrics.clone(),
        ui,
        &shutdown_rx,
    );
    let mut shutdown = shutdown_rx.clone();
    loop {
        // Stand by until this replica leads (or shutdown).
        tokio::select! {
            r = leader_rx.wait_for(|l| *l) => if r.is_err() && args.leader_elect { break },
            _ = shutdown.wait_for(|s| *s) => break,
        }
        term::lead(
            &args,
            &ctx,
            pools.clone(),
            &page,
            &mut leader_rx,
            &shutdown_rx,
            &identity,
        )
        .await;
        if *shutdown.borrow() {
            break;
        }
    }
    if let Some(e) = election {
        // The elector releases the lease on shutdown so a standby takes over at once.
        let _ = tokio::time::timeout(Duration::from_secs(5), e).await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    if let Some(k) = keda_server {
        let _ = tokio::time::timeout(Duration::from_secs(5), k).await;
    }
    Ok(())
}

/// Flags that only make sense together, checked before anything starts.
fn validate(args: &Args) -> anyhow::Result<()> {
    if args.ui.no_kube {
        anyhow::bail!("--no-kube serves the /ui page alone: run it through tessera_autoscaler::run");
    }
    if args.renew_deadline >= args.lease_duration {
        anyhow::bail!(
            "--renew-deadline ({:?}) must be shorter than --lease-duration ({:?}), or a leader could still be \
             writing after another replica took over",
            args.renew_deadline,
            args.lease_duration
        );
    }
    if args.activator_max_age <= args.activator_poll_interval {
        anyhow::bail!(
            "--activator-max-age ({:?}) must be longer than --activator-poll-interval ({:?}), or every document \
             would be stale before the next poll and no model could ever be scaled to zero",
            args.activator_max_age,
            args.activator_poll_interval
        );
    }
    args.keda.validate()?;
    Ok(())
}

/// KEDA's scaler, on every replica (not only the leader): KEDA round-robins over the Service, and each replica
/// answers from its own watch of the leader's decisions and its own activator poll.
async fn keda_scaler(
    args: &Args,
    client: &kube::Client,
    activators: &ActivatorPoller,
    metrics: &Metrics,
    shutdown_rx: watch::Receiver<bool>,
) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    if args.keda.keda_scaler_listen.is_none() {
        return Ok(None);
    }
    let keda_source = crate::keda::cluster::ClusterSource::start(
        watched(args, client),
        activators.clone(),
        args.activator_max_age,
        shutdown_rx.clone(),
    );
    crate::keda::serve(
        &args.keda,
        args.conn.limits(),
        keda_source,
        metrics.keda.clone(),
        shutdown_rx,
    )
    .await
}

/// The API of `K` in `--watch-namespace`, or in every namespace.
fn watched<K>(args: &Args, client: &kube::Client) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    match &args.watch_namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The reconcile's context: clients, settings from the flags, and the state one process keeps between rounds.
#[allow(clippy::too_many_arguments)]
fn context(
    args: &Args,
    client: &kube::Client,
    identity: &str,
    source: Arc<dyn SignalSource>,
    activators: ActivatorPoller,
    metrics: Arc<Metrics>,
    ui: Arc<crate::ui::Store>,
    shutdown_rx: &watch::Receiver<bool>,
) -> Arc<Context> {
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "tessera-autoscaler".into(),
            instance: Some(identity.to_owned()),
        },
    );
    Arc::new(Context {
        client: client.clone(),
        signals: source,
        activators,
        metrics,
        recorder,
        settings: Settings {
            sync_period: args.sync_period,
            sidecar_port: args.sidecar_port,
            max_signal_age: args.max_signal_age,
            activator_max_age: args.activator_max_age,
            rollout: tessera_core::rollout::RolloutConfig {
                stability_window: args.rollout_stability_window,
                drift_threshold: args.rollout_drift_threshold,
                ..tessera_core::rollout::RolloutConfig::default()
            },
        },
        clock: Arc::new(SystemTime::now),
        states: Mutex::new(HashMap::new()),
        last_runs: Mutex::new(HashMap::new()),
        runs_swept_at: Mutex::new(None),
        woken: Mutex::new(HashSet::new()),
        gate_timeouts: Mutex::new(HashSet::new()),
        rolling: rollout::Rolling::default(),
        consolidation: crate::pool::ConsolidationLink::default(),
        ui,
        objects: std::sync::RwLock::new(None),
        neighbours: neighbours::Book::default(),
        dra_templates: Mutex::new(HashSet::new()),
        pods: pods::PodCache::start(watched(args, client), shutdown_rx.clone()),
        deployments: scales::DeploymentCache::start(watched(args, client), shutdown_rx.clone()),
        scalers: owners::HpaCache::start(watched(args, client), shutdown_rx.clone()),
    })
}

/// The kube-runtime controller over InferenceAutoscalers. Every change of an object triggers it, including this
/// controller's own status writes; [`reconcile::reconcile`] skips those (see [`reconcile::trigger_hash`]) so they do
/// not loop, while generation changes are acted on at once. `wakes` (model keys with a request held at an
/// activator) reconcile every InferenceAutoscaler of that namespace naming that model at once (contract 2).
fn controller_stream(
    api: Api<InferenceAutoscaler>,
    ctx: Arc<Context>,
    wakes: tokio::sync::broadcast::Receiver<String>,
) -> impl std::future::Future<Output = ()> {
    let controller = Controller::new(api, crate::kube_client::watcher_config());
    let store = controller.store();
    // This term's cache: where a budget group's members are read before their own first round.
    if let Ok(mut objects) = ctx.objects.write() {
        *objects = Some(store.clone());
    }
    let wake_ctx = ctx.clone();
    let wake_refs = tokio_stream::wrappers::BroadcastStream::new(wakes)
        .filter_map(|r| std::future::ready(r.ok()))
        .flat_map(move |key| {
            let refs = reconcile::objects_for_model(&store.state(), &key);
            for r in &refs {
                wake_ctx.mark_woken(&format!(
                    "{}/{}",
                    r.namespace.as_deref().unwrap_or_default(),
                    r.name
                ));
            }
            futures::stream::iter(refs)
        });
    controller
        .reconcile_on(wake_refs)
        .run(reconcile::reconcile, reconcile::error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile error");
            }
        })
}

async fn serve_ready(State(h): State<Arc<Health>>) -> impl IntoResponse {
    if h.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    }
}

#[cfg(test)]
mod default_tests {
    use tessera_core::scale::inputs;

    /// The simulator feeds `core::scale::inputs` with these constants: they must be the controller's defaults.
    #[test]
    fn the_simulated_controller_runs_with_the_shipped_defaults() {
        let a: super::Args = tessera_runtime::try_parse_args(&["autoscaler"]).expect("the defaults parse");
        assert_eq!(a.max_signal_age, inputs::MAX_SIGNAL_AGE);
        assert_eq!(a.activator_max_age, inputs::ACTIVATOR_MAX_AGE);
        assert_eq!(a.activator_poll_interval, inputs::ACTIVATOR_POLL_INTERVAL);
    }
}
