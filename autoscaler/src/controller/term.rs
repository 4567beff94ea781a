//! The leadership term: only the replica holding the `Lease` reconciles and runs the GPU pool manager. A term
//! starts when this replica leads and ends when it loses the Lease, the controller stream ends, or the process
//! stops; nothing leader-only outlives it.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio::sync::watch;
use tracing::{info, warn};

use super::context::Context;
use super::{Args, controller_stream, watched};
use crate::crd::InferenceAutoscaler;
use crate::leader::{ElectionConfig, LeaderElector};

/// Starts the election (`--leader-elect`); without it this replica leads from the start. Returns whether this
/// replica leads, as it changes, and the elector's task.
pub(super) fn elect(
    args: &Args,
    client: &kube::Client,
    identity: &str,
    shutdown_rx: watch::Receiver<bool>,
) -> (watch::Receiver<bool>, Option<tokio::task::JoinHandle<()>>) {
    let (leader_tx, leader_rx) = watch::channel(!args.leader_elect);
    if !args.leader_elect {
        drop(leader_tx);
        return (leader_rx, None);
    }
    let elector = LeaderElector::new(
        Api::<Lease>::namespaced(client.clone(), &args.lease_namespace),
        ElectionConfig {
            lease_name: args.lease_name.clone(),
            identity: identity.to_owned(),
            lease_duration: args.lease_duration,
            renew_deadline: args.renew_deadline,
            retry_period: args.retry_period,
        },
    );
    let task = tokio::spawn(elector.run(leader_tx, shutdown_rx, || crate::unix_ms(SystemTime::now())));
    (leader_rx, Some(task))
}

/// What the `/ui` page's per-GPU table reads beside the pool manager: the gpu-agents' `/v1/gpus` (bounded like the
/// sidecars' reads).
#[derive(Debug, Clone)]
pub(super) struct PoolPage {
    agents: reqwest::Client,
    max_document: usize,
}

impl PoolPage {
    pub(super) fn new(args: &Args) -> anyhow::Result<PoolPage> {
        let agents = reqwest::Client::builder()
            .timeout(args.scrape_timeout)
            .build()
            .context("building the HTTP client for gpu-agents")?;
        Ok(PoolPage {
            agents,
            max_document: args.max_document_size,
        })
    }

    /// The page's per-GPU table: each pool's capacity pods and tenants, as the pool manager sees them, with each
    /// tenant's measured use from its capacity pod's gpu-agent (read off the pool manager's loop, each read bounded
    /// by --scrape-timeout). The start-up lease holders come from the gate's Leases in the pool namespace (one list
    /// per round).
    fn observer(&self, ctx: &Arc<Context>, pool_ns: String) -> crate::pool::PoolObserver {
        let page = ctx.ui.clone();
        let agents = self.agents.clone();
        let (agent_metrics, max_document) = (ctx.metrics.clone(), self.max_document);
        let kube = ctx.client.clone();
        Arc::new(move |pool, shape, index| {
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
                let holders = crate::ui::observe::startup_holders(&leases, crate::unix_ms(SystemTime::now()));
                page.set_pool_gpus(
                    &pool,
                    crate::ui::observe::gpus_from_pool(&index, &pool, &shape, &read, &holders),
                );
            });
        })
    }
}

/// The pool manager for this term (leader-only too: it creates and deletes capacity pods), stopped by `token`.
fn start_pools(
    args: &Args,
    ctx: &Arc<Context>,
    pools: Option<Arc<crate::pool::PoolsConfig>>,
    page: &PoolPage,
    token: &tokio_util::sync::CancellationToken,
) -> Option<tokio::task::JoinHandle<()>> {
    let cfg = pools?;
    let (client, token, interval) = (ctx.client.clone(), token.clone(), args.pool_interval);
    let pool_metrics = ctx.metrics.pool.clone();
    let link = ctx.consolidation.clone();
    let observer = page.observer(ctx, cfg.namespace.clone());
    Some(tokio::spawn(async move {
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
    }))
}

/// One leadership term: the controller over InferenceAutoscalers and the pool manager, until leadership is lost,
/// the controller stream ends or the process stops.
pub(super) async fn lead(
    args: &Args,
    ctx: &Arc<Context>,
    pools: Option<Arc<crate::pool::PoolsConfig>>,
    page: &PoolPage,
    leader_rx: &mut watch::Receiver<bool>,
    shutdown_rx: &watch::Receiver<bool>,
    identity: &str,
) {
    let metrics = &ctx.metrics;
    metrics.set_leader(true);
    info!(%identity, "leading: starting the controller");
    // A new term starts from empty history: windows restart, which only delays scale-downs (safe).
    if let Ok(mut s) = ctx.states.lock() {
        s.clear();
    }
    let api: Api<InferenceAutoscaler> = watched(args, &ctx.client);
    let controller = controller_stream(api, ctx.clone(), ctx.activators.subscribe());
    tokio::pin!(controller);
    let pool_token = tokio_util::sync::CancellationToken::new();
    let pool_task = start_pools(args, ctx, pools, page, &pool_token);
    let lost = async {
        if args.leader_elect {
            let _ = leader_rx.wait_for(|l| !*l).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    let mut shutdown = shutdown_rx.clone();
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
}
