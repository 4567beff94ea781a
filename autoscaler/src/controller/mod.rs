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
pub mod reconcile;
pub mod rollout;
pub mod signals;
pub mod sleep;
pub mod sleep_room;
pub mod status;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::runtime::Controller;
use kube::runtime::events::{Recorder, Reporter};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::crd::InferenceAutoscaler;
use crate::leader::{ElectionConfig, LeaderElector};
use context::{Context, Settings};
use metrics::Metrics;
use signals::{ActivatorPoller, HttpSignals, SignalSource};

/// `tessera autoscaler` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Address to serve /metrics, /live and /ready on.
    #[arg(long, env = "TESSERA_METRICS_LISTEN", default_value = "0.0.0.0:9091")]
    pub metrics_listen: SocketAddr,
    /// Client connection bounds (`--header-read-timeout`, `--client-idle-timeout`): a silent, trickling or idle
    /// connection is closed.
    #[command(flatten)]
    pub conn: tessera_runtime::serve::ConnArgs,
    /// Only watch InferenceAutoscalers in this namespace (default: all namespaces).
    #[arg(long, env = "TESSERA_WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    /// How often every InferenceAutoscaler is decided again (HPA's --horizontal-pod-autoscaler-sync-period).
    #[arg(long, env = "TESSERA_SYNC_PERIOD", default_value = "15s", value_parser = humantime::parse_duration)]
    pub sync_period: Duration,
    /// Port of the tessera sidecar on each model pod (override per pod with the tessera.dev/sidecar-port annotation).
    #[arg(long, env = "TESSERA_SIDECAR_PORT", default_value_t = 9090)]
    pub sidecar_port: u16,
    /// Timeout for each sidecar /v1/status and activator stats request.
    #[arg(long, env = "TESSERA_SCRAPE_TIMEOUT", default_value = "2s", value_parser = humantime::parse_duration)]
    pub scrape_timeout: Duration,
    /// The most bytes read of one document from a pod (a sidecar's /v1/status, an activator's stats, a
    /// gpu-agent's /v1/gpus). A larger answer is refused and counted
    /// (`tessera_autoscaler_scrape_failures_total{reason="too_large"}`), and the document counts as missing:
    /// a tenant's pod chooses what it answers and must not be able to run the autoscaler out of memory.
    #[arg(long, env = "TESSERA_MAX_DOCUMENT_SIZE", default_value_t = tessera_runtime::body::DEFAULT_MAX_DOCUMENT_BYTES)]
    pub max_document_size: usize,
    /// File holding the secret key (≥ 32 bytes) the sidecars' objective tokens derive from, the same the webhook
    /// holds (the chart's `<release>-objective-key` Secret). Each hand-over of an objective (`PUT /v1/objective`)
    /// carries the pod namespace's token; without the key none does and sidecars refuse them (401), so spec edits
    /// of `ttftSlo`/`itlSlo` reach pods only as they are recreated.
    #[arg(long, env = "TESSERA_OBJECTIVE_KEY_FILE")]
    pub objective_key_file: Option<std::path::PathBuf>,
    /// A sidecar snapshot older than this counts as missing data (never a reason to scale down).
    #[arg(long, env = "TESSERA_MAX_SIGNAL_AGE", default_value = "30s", value_parser = humantime::parse_duration)]
    pub max_signal_age: Duration,
    /// The activator's admin Service as NAMESPACE/NAME: every activator pod is found through its EndpointSlices
    /// and its stats read directly on its admin listener (the slice's port named `admin`, else 9090), since
    /// behind a Service each pod sees only its share of the requests. The usual setting in a cluster (the
    /// chart's `<release>-activator-admin`).
    #[arg(long, env = "TESSERA_ACTIVATOR_SERVICE", value_parser = discovery::parse_service)]
    pub activator_service: Option<(String, String)>,
    /// Base URL of an activator's admin listener (its `--admin-listen`, e.g. http://127.0.0.1:9090), whose
    /// stats to read (repeatable, one per activator process), for static setups without --activator-service. Neither: models are never scaled to zero and the request-rate signal has no
    /// data.
    #[arg(long = "activator-url", env = "TESSERA_ACTIVATOR_URLS", value_delimiter = ',')]
    pub activator_urls: Vec<String>,
    /// How often to read every activator pod's stats; a held request wakes its model's reconcile within this.
    #[arg(long, env = "TESSERA_ACTIVATOR_POLL_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub activator_poll_interval: Duration,
    /// An activator document older than this (or a failed poll) makes the demand unknown: no scale to zero.
    #[arg(long, env = "TESSERA_ACTIVATOR_MAX_AGE", default_value = "5s", value_parser = humantime::parse_duration)]
    pub activator_max_age: Duration,
    /// `gpu.updateMode`: a recommendation must stay within 5% of itself this long before it comes into force
    /// (new pods get it), and running pods must have drifted this long before a `Recreate` roll. A growth while
    /// vLLM preempts is applied at once.
    #[arg(long, env = "TESSERA_ROLLOUT_STABILITY_WINDOW", default_value = "30m", value_parser = humantime::parse_duration)]
    pub rollout_stability_window: Duration,
    /// `Recreate`: running pods whose memory or compute differs from the allocation in force by more than this
    /// fraction (0.15 = 15%) are rolled.
    #[arg(long, env = "TESSERA_ROLLOUT_DRIFT_THRESHOLD", default_value_t = 0.15)]
    pub rollout_drift_threshold: f64,
    /// Elect a leader with a Lease so several replicas can run (only the leader reconciles).
    #[arg(long, env = "TESSERA_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Name of the leader Lease.
    #[arg(long, env = "TESSERA_LEASE_NAME", default_value = "tessera-autoscaler")]
    pub lease_name: String,
    /// Namespace of the leader Lease (in a pod: its own namespace via the downward API).
    #[arg(long, env = "TESSERA_LEASE_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// This replica's identity in the Lease and in Events (in a pod: its name via the downward API).
    #[arg(long, env = "TESSERA_IDENTITY")]
    pub identity: Option<String>,
    /// How long a Lease lives without renewal.
    #[arg(long, env = "TESSERA_LEASE_DURATION", default_value = "15s", value_parser = humantime::parse_duration)]
    pub lease_duration: Duration,
    /// A leader that could not renew for this long stops reconciling (must be shorter than --lease-duration).
    #[arg(long, env = "TESSERA_RENEW_DEADLINE", default_value = "10s", value_parser = humantime::parse_duration)]
    pub renew_deadline: Duration,
    /// How often to try to acquire or renew the Lease.
    #[arg(long, env = "TESSERA_RETRY_PERIOD", default_value = "2s", value_parser = humantime::parse_duration)]
    pub retry_period: Duration,
    /// GPU pools (YAML, e.g. deploy/examples/gpu-pools.yaml) whose capacity pods the leader manages. Unset: no
    /// pool manager runs here (whole-GPU replicas need none).
    #[arg(long, env = "TESSERA_POOLS_CONFIG")]
    pub pools_config: Option<std::path::PathBuf>,
    /// How often the pool manager reconciles capacity pods and reservations.
    #[arg(long, env = "TESSERA_POOL_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub pool_interval: Duration,
    /// The GPU workloads page (`/ui`) and its local mode.
    #[command(flatten)]
    pub ui: crate::ui::PageArgs,
    /// KEDA's external scaler (`--keda-scaler-listen`).
    #[command(flatten)]
    pub keda: crate::keda::KedaArgs,
}

#[derive(Debug)]
struct Health {
    metrics: Arc<Metrics>,
    ready: AtomicBool,
}

/// Runs the controller until SIGTERM or Ctrl-C (`--no-kube` is the local page's: [`crate::run`] dispatches it).
pub async fn run(args: Args) -> anyhow::Result<()> {
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

    let listener = tokio::net::TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("binding --metrics-listen {}", args.metrics_listen))?;
    info!(listen = %listener.local_addr()?, "serving /metrics, /ui, /live, /ready");
    // Models not reconciled for 10 sync periods are gone (deleted, or another replica leads).
    let ui = Arc::new(crate::ui::Store::new(
        args.ui.settings(),
        false,
        crate::ui::now_ms(),
        args.sync_period * 10,
    ));
    tokio::spawn(
        ui.clone()
            .run_recorder(Duration::from_secs(60), shutdown_rx.clone()),
    );
    let app = graceful.ready_gate(
        Router::new()
            .route("/live", get(|| async { "ok" }))
            .route("/ready", get(serve_ready))
            .with_state(health.clone())
            .merge(health.metrics.router())
            .merge(crate::ui::router(ui.clone())),
    );
    let mut server_shutdown = shutdown_rx.clone();
    let limits = args.conn.limits();
    let server = tokio::spawn(async move {
        // The page and /metrics are read by people and Prometheus only; bounded connections all the same.
        tessera_runtime::serve::serve(listener, app, limits, async move {
            let _ = server_shutdown.wait_for(|s| *s).await;
        })
        .await;
        Ok::<(), std::io::Error>(())
    });

    let objective_key = match &args.objective_key_file {
        Some(path) => Some(tessera_runtime::token::ObjectiveKey::from_file(path)?),
        None => {
            warn!(
                "no --objective-key-file: latency objectives are not handed to running sidecars (they refuse a \
                 hand-over without their namespace's token); spec edits reach pods as they are recreated"
            );
            None
        }
    };
    let source: Arc<dyn SignalSource> = Arc::new(
        HttpSignals::new(args.scrape_timeout, args.max_document_size)
            .context("building the HTTP client for sidecars")?
            .with_objective_key(objective_key),
    );
    // The gpu-agents' /v1/gpus, for the page's per-GPU table (bounded like the sidecars' reads).
    let agent_client = reqwest::Client::builder()
        .timeout(args.scrape_timeout)
        .build()
        .context("building the HTTP client for gpu-agents")?;
    let activators = ActivatorPoller::new(&args.activator_urls);
    match &args.activator_service {
        Some((ns, name)) => {
            if !args.activator_urls.is_empty() {
                anyhow::bail!(
                    "--activator-service and --activator-url are exclusive: the Service's pods are the activators"
                );
            }
            tokio::spawn(discovery::follow_service(
                client.clone(),
                ns.clone(),
                name.clone(),
                activators.clone(),
            ));
        }
        None if args.activator_urls.is_empty() => warn!(
            "neither --activator-service nor --activator-url: models will not be scaled to zero and \
             requestsPerSecondPerReplica has no data"
        ),
        None => {}
    }
    tokio::spawn(activators.clone().run(
        source.clone(),
        metrics.clone(),
        args.activator_poll_interval,
        args.activator_max_age,
        SystemTime::now,
        shutdown_rx.clone(),
    ));

    // KEDA's scaler, on every replica (not only the leader): KEDA round-robins over the Service, and each replica
    // answers from its own watch of the leader's decisions and its own activator poll.
    let keda_server = if args.keda.keda_scaler_listen.is_some() {
        let keda_source = crate::keda::cluster::ClusterSource::start(
            match &args.watch_namespace {
                Some(ns) => Api::namespaced(client.clone(), ns),
                None => Api::all(client.clone()),
            },
            activators.clone(),
            args.activator_max_age,
            shutdown_rx.clone(),
        );
        crate::keda::serve(
            &args.keda,
            args.conn.limits(),
            keda_source,
            metrics.keda.clone(),
            shutdown_rx.clone(),
        )
        .await?
    } else {
        None
    };

    let (leader_tx, mut leader_rx) = watch::channel(!args.leader_elect);
    let election = if args.leader_elect {
        let elector = LeaderElector::new(
            Api::<Lease>::namespaced(client.clone(), &args.lease_namespace),
            ElectionConfig {
                lease_name: args.lease_name.clone(),
                identity: identity.clone(),
                lease_duration: args.lease_duration,
                renew_deadline: args.renew_deadline,
                retry_period: args.retry_period,
            },
        );
        Some(tokio::spawn(elector.run(leader_tx, shutdown_rx.clone(), || {
            crate::unix_ms(SystemTime::now())
        })))
    } else {
        drop(leader_tx);
        None
    };
    health.ready.store(true, Ordering::Relaxed);

    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "tessera-autoscaler".into(),
            instance: Some(identity.clone()),
        },
    );
    let ctx = Arc::new(Context {
        client: client.clone(),
        signals: source,
        activators,
        metrics: metrics.clone(),
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
        woken: Mutex::new(HashSet::new()),
        gate_timeouts: Mutex::new(HashSet::new()),
        rolling: rollout::Rolling::default(),
        consolidation: crate::pool::ConsolidationLink::default(),
        ui,
        objects: std::sync::RwLock::new(None),
        neighbours: neighbours::Book::default(),
        scalers: owners::HpaCache::start(
            match &args.watch_namespace {
                Some(ns) => Api::namespaced(client.clone(), ns),
                None => Api::all(client.clone()),
            },
            shutdown_rx.clone(),
        ),
    });

    let mut shutdown = shutdown_rx.clone();
    loop {
        // Stand by until this replica leads (or shutdown).
        tokio::select! {
            r = leader_rx.wait_for(|l| *l) => if r.is_err() && args.leader_elect { break },
            _ = shutdown.wait_for(|s| *s) => break,
        }
        metrics.set_leader(true);
        info!(%identity, "leading: starting the controller");
        // A new term starts from empty history: windows restart, which only delays scale-downs (safe).
        if let Ok(mut s) = ctx.states.lock() {
            s.clear();
        }
        let api: Api<InferenceAutoscaler> = match &args.watch_namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let controller = controller_stream(api, ctx.clone(), ctx.activators.subscribe());
        tokio::pin!(controller);
        // The pool manager is leader-only too: it creates and deletes capacity pods.
        let pool_token = tokio_util::sync::CancellationToken::new();
        let pool_task = pools.clone().map(|cfg| {
            let (client, token, interval) = (client.clone(), pool_token.clone(), args.pool_interval);
            let pool_metrics = metrics.pool.clone();
            let link = ctx.consolidation.clone();
            let page = ctx.ui.clone();
            let agents = agent_client.clone();
            let (agent_metrics, max_document) = (metrics.clone(), args.max_document_size);
            let (kube, pool_ns) = (client.clone(), cfg.namespace.clone());
            // The /ui page's per-GPU table: each pool's capacity pods and tenants, as the pool manager sees them,
            // with each tenant's measured use from its capacity pod's gpu-agent (read off the pool manager's
            // loop, each read bounded by --scrape-timeout).
            // The start-up lease holders come from the gate's Leases in the pool namespace (one list per round).
            let observer: crate::pool::PoolObserver = Arc::new(move |pool, shape, index| {
                let (page, index, pool, client, shape) = (
                    page.clone(),
                    index.clone(),
                    pool.to_owned(),
                    agents.clone(),
                    *shape,
                );
                let (kube, pool_ns) = (kube.clone(), pool_ns.clone());
                let agent_metrics = agent_metrics.clone();
                tokio::spawn(async move {
                    let refused = |reason: &'static str| agent_metrics.scrape_failure("gpu_agent", reason);
                    let port = u16::try_from(crate::pool::capacity::AGENT_PORT).unwrap_or(9091);
                    let (read, leases) = tokio::join!(
                        crate::ui::observe::read_agents(&client, &index, port, max_document, &refused),
                        crate::ui::observe::read_startup_leases(&kube, &pool_ns)
                    );
                    let holders =
                        crate::ui::observe::startup_holders(&leases, crate::unix_ms(SystemTime::now()));
                    page.set_pool_gpus(
                        &pool,
                        crate::ui::observe::gpus_from_pool(&index, &pool, &shape, &read, &holders),
                    );
                });
            });
            tokio::spawn(async move {
                if let Err(e) = crate::pool::run_pools_with_metrics(
                    client,
                    cfg,
                    interval,
                    pool_metrics,
                    Some(observer),
                    link,
                    token,
                )
                .await
                {
                    warn!(error = %e, "the GPU pool manager stopped");
                }
            })
        });
        let lost = async {
            if args.leader_elect {
                let _ = leader_rx.wait_for(|l| !*l).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            _ = &mut controller => warn!("the controller stream ended"),
            _ = lost => if !*shutdown_rx.borrow() { warn!("lost leadership: stopping the controller") },
            _ = shutdown.wait_for(|s| *s) => {}
        }
        metrics.set_leader(false);
        pool_token.cancel();
        if let Some(mut t) = pool_task {
            // A follower must not keep creating or deleting capacity pods: a manager that did not stop in time is
            // aborted (its JoinSet of per-pool managers aborts with it), never left running detached.
            if tokio::time::timeout(Duration::from_secs(5), &mut t)
                .await
                .is_err()
            {
                warn!("the GPU pool manager did not stop within 5 s of losing leadership: aborting it");
                t.abort();
                let _ = t.await;
            }
        }
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
