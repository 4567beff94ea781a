//! `tessera autoscaler --no-kube --sidecar NAME=URL ...`: the GPU workloads page on one machine, with no cluster.
//! Every sync period it reads each named sidecar's `/v1/status` (the documents the controller reads in a
//! cluster) and publishes one model per NAME, its replicas being that NAME's sidecars. Read-only: there is no
//! policy, nothing decides and nothing is scaled; each replica is taken to hold a whole GPU, so the page shows
//! what sharing the recommendations would free.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::routing::get;
use tokio::sync::watch;
use tracing::{debug, info};

use super::observe::model_from_sidecars;
use super::view::Replicas;
use super::{Store, now_ms};
use crate::controller::Args;
use crate::controller::metrics::Metrics;
use crate::controller::signals::{ActivatorPoller, HttpSignals, SignalSource};

/// Namespace shown for models in local mode.
pub const LOCAL_NAMESPACE: &str = "local";

/// Reads every sidecar once and publishes the models.
pub async fn poll_once(
    source: &dyn SignalSource,
    groups: &BTreeMap<String, Vec<String>>,
    store: &Store,
    metrics: &Metrics,
) {
    for (name, urls) in groups {
        let results = futures::future::join_all(urls.iter().map(|u| source.sidecar_status(u))).await;
        let mut docs = Vec::with_capacity(results.len());
        for (url, r) in urls.iter().zip(results) {
            match r {
                Ok(doc) => docs.push(doc),
                Err(e) => {
                    debug!(%url, error = %e, "sidecar unavailable");
                    metrics.scrape_failure("sidecar", e.label());
                }
            }
        }
        let n = u32::try_from(urls.len()).unwrap_or(u32::MAX);
        let replicas = Replicas {
            current: n,
            desired: n,
            ready: u32::try_from(docs.iter().filter(|d| d.ready).count()).unwrap_or(u32::MAX),
            min: None,
            max: None,
        };
        let mut obs = model_from_sidecars(LOCAL_NAMESPACE, name, replicas, &docs);
        obs.target = urls.join(" ");
        store.observe_model(obs, now_ms());
    }
}

/// Runs local mode until SIGTERM or Ctrl-C.
pub async fn run(args: Args) -> anyhow::Result<()> {
    if args.ui.sidecars.is_empty() {
        anyhow::bail!(
            "--no-kube needs at least one --sidecar NAME=URL (e.g. --sidecar llama=http://127.0.0.1:9090)"
        );
    }
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for s in &args.ui.sidecars {
        groups.entry(s.name.clone()).or_default().push(s.url.clone());
    }
    let store = Arc::new(Store::new(
        args.ui.settings(),
        true,
        now_ms(),
        // A model named on the command line never goes away; a long horizon keeps it through outages.
        Duration::from_secs(365 * 24 * 3600),
    ));
    let metrics = Arc::new(Metrics::new());
    let source = HttpSignals::new(args.scrape_timeout, args.max_document_size)
        .context("building the HTTP client for sidecars")?;

    let listener = tokio::net::TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("binding --metrics-listen {}", args.metrics_listen))?;
    let addr = listener.local_addr()?;
    info!(listen = %addr, models = groups.len(), "local mode (no Kubernetes): serving /ui, /metrics, /live, /ready");
    let app = metrics
        .router()
        .route("/live", get(|| async { "ok" }))
        .route("/ready", get(|| async { "ready" }))
        .merge(super::router(store.clone()));

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    // Read-only and stateless: no drain, stop at the first signal.
    let graceful = tessera_runtime::Graceful::on_signals(Duration::ZERO);
    tokio::spawn(async move {
        graceful.stopping().await;
        info!("shutting down");
        shutdown_tx.send_replace(true);
    });
    // With --keda-scaler-listen this process also decides for each model and serves KEDA (`crate::keda::local`).
    let keda_server = if args.keda.keda_scaler_listen.is_some() {
        let activators = ActivatorPoller::new(&args.activator_urls);
        let signals: Arc<dyn SignalSource> = Arc::new(source.clone());
        tokio::spawn(activators.clone().run(
            signals.clone(),
            metrics.clone(),
            args.activator_poll_interval,
            args.activator_max_age,
            std::time::SystemTime::now,
            shutdown_rx.clone(),
        ));
        let spec = crate::keda::local::policy_spec(args.keda.policy.as_deref())?;
        let decided = crate::keda::local::start(
            &groups,
            &spec,
            signals,
            activators,
            metrics.clone(),
            args.sync_period,
            args.max_signal_age,
            args.activator_max_age,
            shutdown_rx.clone(),
        )?;
        crate::keda::serve(
            &args.keda,
            args.conn.limits(),
            decided,
            metrics.keda.clone(),
            shutdown_rx.clone(),
        )
        .await?
    } else {
        None
    };
    tokio::spawn(
        store
            .clone()
            .run_recorder(Duration::from_secs(60), shutdown_rx.clone()),
    );
    let mut poll_shutdown = shutdown_rx.clone();
    let period = args.sync_period;
    let poll_store = store.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let stop = tokio::select! {
                _ = tick.tick() => false,
                _ = poll_shutdown.wait_for(|s| *s) => true,
            };
            if stop {
                return;
            }
            poll_once(&source, &groups, &poll_store, &metrics).await;
        }
    });
    let mut server_shutdown = shutdown_rx;
    tessera_runtime::serve::serve(listener, app, args.conn.limits(), async move {
        let _ = server_shutdown.wait_for(|s| *s).await;
    })
    .await;
    if let Some(k) = keda_server {
        let _ = tokio::time::timeout(Duration::from_secs(5), k).await;
    }
    Ok(())
}
