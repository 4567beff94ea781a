//! The pool manager's I/O: reads and writes capacity pods through the Kubernetes API. Every choice is made
//! by [`PoolIndex`] and the core packer; this file only turns decisions into requests and answers into index
//! updates.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use tracing::{debug, info, instrument, warn};

use super::config::{PoolSpec, PoolsConfig};
use super::metrics::PoolMetrics;
use super::state::{Decision, PoolIndex, Reservation, pod_key, reservations_patch};
use super::{ANNOTATION_DRAINING_SINCE, ConsolidationLink, LABEL_CAPACITY_POD, LABEL_POOL, PoolError};
use tessera_runtime::watch_events::{Change, fold_event};

// Consolidation's I/O (draining a GPU), in its own file; a child module so it reaches the manager's fields.
mod consolidate;
use tessera_core::pack::consolidate::Candidate;
// Lending a sleeping pod's room: the leader's eviction and its hold on the GPU's start-up Lease.
mod lend;
// Spare capacity pods: the leader alone creates capacity pods; a booking on a spare opens it.
mod sleepers;
mod spares;

/// What the webhook asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReserveRequest {
    /// Unique and stable across retries of one admission (the admission request UID).
    pub id: String,
    /// The model.
    pub model: String,
    /// Compute share, milli-GPUs (1..=1000).
    pub compute_milli: u32,
    /// GPU memory, MiB.
    pub memory_mib: u64,
    /// Placement priority.
    pub priority: i32,
    /// `namespace/name` of the pod if known.
    pub pod: Option<String>,
}

/// Where a reservation landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The pool.
    pub pool: String,
    /// The capacity pod holding the share.
    pub capacity_pod: String,
    /// Its namespace.
    pub namespace: String,
    /// Its node, once scheduled (a new capacity pod has none yet; pin the tenant with pod affinity to the
    /// capacity pod's `tessera.dev/capacity-pod` label … or wait).
    pub node: Option<String>,
    /// The GPU's UUID, once the gpu-agent published it.
    pub gpu_uuid: Option<String>,
    /// The reservation id (write it to the tenant as `tessera.dev/reservation`).
    pub reservation_id: String,
    /// Why here: the packer's reason, `Existing` for a retried request, `BookedSpare` (no GPU had room: a spare
    /// capacity pod, which the leader opens) or `LentBySleepers`.
    pub reason: String,
}

/// What one [`PoolManager::reconcile`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Reservations dropped because their pod never appeared in time.
    pub expired: usize,
    /// Capacity pods newly marked empty.
    pub marked_empty: usize,
    /// Capacity pods deleted after the grace period.
    pub deleted: Vec<String>,
    /// Consolidation: the capacity pod whose drain started, ended or was called off, with the step
    /// (`started`, `drained`, `timed_out`, `disabled`).
    pub drain: Option<(String, &'static str)>,
    /// Sleeping pods deleted because their room was lent (`lendSleepers`).
    pub sleepers_evicted: usize,
    /// Spare capacity pods whose gate was lifted (a reservation was booked on them).
    pub spares_opened: usize,
}

/// The pool manager of one pool. Cheap to clone; clones share the index.
#[derive(Debug, Clone)]
pub struct PoolManager {
    pods: Api<Pod>,
    all_pods: Api<Pod>,
    cfg: Arc<PoolsConfig>,
    pool: PoolSpec,
    index: Arc<Mutex<PoolIndex>>,
    max_attempts: u32,
    metrics: PoolMetrics,
    /// Consolidation's candidate GPU and since when (in memory: a restart only restarts the settle time).
    candidate: Arc<Mutex<Option<Candidate>>>,
    link: ConsolidationLink,
    /// The GPUs' start-up Leases (in the capacity namespace), held while a lent sleeper is evicted.
    leases: Api<k8s_openapi::api::coordination::v1::Lease>,
    lending: Arc<Mutex<lend::Held>>,
    /// Since when each capacity pod has held only sleeping pods (Unix seconds; `manager/sleepers.rs`).
    sleepers_only: Arc<Mutex<HashMap<String, u64>>>,
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

impl PoolManager {
    /// A manager for pool `pool` of `cfg`, with an empty index (call [`PoolManager::rebuild`] or feed it watch
    /// events before reserving).
    pub fn new(client: kube::Client, cfg: Arc<PoolsConfig>, pool: &str) -> Result<Self, PoolError> {
        let spec = cfg
            .pool(pool)
            .ok_or_else(|| PoolError::UnknownPool(pool.to_string()))?
            .clone();
        Ok(Self {
            pods: Api::namespaced(client.clone(), &cfg.namespace),
            leases: Api::namespaced(client.clone(), &cfg.namespace),
            lending: Arc::new(Mutex::new(lend::Held::default())),
            sleepers_only: Arc::new(Mutex::new(HashMap::new())),
            // Tenants are watched where they may be: one namespace when the installation watches one (its Role
            // grants pods there only), every namespace otherwise.
            all_pods: match &cfg.tenant_namespace {
                Some(ns) => Api::namespaced(client, ns),
                None => Api::all(client),
            },
            index: Arc::new(Mutex::new(PoolIndex::new(pool))),
            cfg,
            pool: spec,
            // Each lost race costs one attempt; a burst of N concurrent admissions on one GPU can make the
            // last one lose N − 1 times.
            max_attempts: 16,
            metrics: PoolMetrics::default(),
            candidate: Arc::new(Mutex::new(None)),
            link: ConsolidationLink::default(),
        })
    }

    /// Shares consolidation's state with the controller of this process: the capacity pods being drained are
    /// published into `link.draining` after every reconcile, and a pod is moved only if `link.managed` says a
    /// controller round moves it. Without a link nothing is ever drained (no controller would move the pods).
    pub fn with_link(mut self, link: ConsolidationLink) -> Self {
        self.link = link;
        self
    }

    /// Reports into `metrics` (from [`PoolMetrics::register`]); without this the counters go nowhere.
    pub fn with_metrics(mut self, metrics: PoolMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The pool.
    pub fn pool(&self) -> &PoolSpec {
        &self.pool
    }

    /// The index (read-only use by status pages and tests).
    pub fn index(&self) -> MutexGuard<'_, PoolIndex> {
        // A panic while holding the lock cannot leave the index half-written in a way that matters: every
        // update replaces whole entries. So a poisoned lock is still usable.
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn capacity_selector(&self) -> String {
        format!("{LABEL_POOL}={},{LABEL_CAPACITY_POD}=true", self.pool.name)
    }

    fn tenant_selector(&self) -> String {
        format!("{LABEL_POOL}={},!{LABEL_CAPACITY_POD}", self.pool.name)
    }

    /// Rebuilds the index from the cluster: capacity pods in the pool's namespace and tenant pods in the tenant
    /// namespace (every namespace when none is configured).
    #[instrument(skip(self), fields(pool = %self.pool.name))]
    pub async fn rebuild(&self) -> Result<(), PoolError> {
        let caps = self
            .pods
            .list(&ListParams::default().labels(&self.capacity_selector()))
            .await?;
        let tenants = self
            .all_pods
            .list(&ListParams::default().labels(&self.tenant_selector()))
            .await?;
        let mut idx = self.index();
        idx.reset_capacity(&caps.items);
        idx.reset_tenants(&tenants.items);
        info!(
            capacity_pods = idx.capacity().count(),
            tenants = idx.tenants().count(),
            "pool rebuilt from the cluster"
        );
        Ok(())
    }

    fn placement(&self, name: &str, id: &str, reason: &str) -> Placement {
        let idx = self.index();
        let gpu = idx.capacity_pod(name);
        Placement {
            pool: self.pool.name.clone(),
            capacity_pod: name.to_string(),
            namespace: self.cfg.namespace.clone(),
            node: gpu.and_then(|g| g.node.clone()),
            gpu_uuid: gpu.and_then(|g| g.gpu_uuid.clone()),
            reservation_id: id.to_string(),
            reason: reason.to_string(),
        }
    }

    /// Merge-patches capacity pod `name` and folds the answer into the index (errors are the caller's to sort:
    /// a 409 means someone wrote first).
    async fn patch_capacity(&self, name: &str, patch: &serde_json::Value) -> Result<(), kube::Error> {
        let pod = self
            .pods
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        self.index().apply_capacity(&pod);
        Ok(())
    }

    /// Re-reads one capacity pod after a conflict (or learns it is gone).
    async fn refresh(&self, name: &str) -> Result<(), PoolError> {
        match self.pods.get_opt(name).await? {
            Some(pod) => self.index().apply_capacity(&pod),
            None => self.index().delete_capacity(name),
        }
        Ok(())
    }

    /// Reserves a share for a new tenant. `now` is Unix seconds (the reservation's TTL starts there).
    ///
    /// Idempotent on `request.id`. On a 409 the capacity pod is re-read and the placement decided again, up
    /// to a bounded number of attempts. Errors are for the webhook to fail open on.
    #[instrument(skip(self, request), fields(pool = %self.pool.name, id = %request.id, model = %request.model))]
    pub async fn reserve(&self, request: ReserveRequest, now: u64) -> Result<Placement, PoolError> {
        let result = self.reserve_inner(request, now).await;
        let label = match &result {
            Ok((_, label)) => label,
            Err(e) => e.label(),
        };
        self.metrics.reservation(&self.pool.name, label);
        result.map(|(placement, _)| placement)
    }

    /// The placement and its `result` metric label.
    async fn reserve_inner(
        &self,
        request: ReserveRequest,
        now: u64,
    ) -> Result<(Placement, &'static str), PoolError> {
        let reservation = Reservation {
            id: request.id.clone(),
            model: request.model,
            compute_milli: request.compute_milli,
            memory_mib: request.memory_mib,
            priority: request.priority,
            created_at: now,
            pod: request.pod,
            evicted_at: None,
            asleep_since: None,
        };
        let shape = self.pool.shape();
        for attempt in 1..=self.max_attempts {
            let decision = self.index().decide(
                &shape,
                &reservation,
                self.cfg.lend_sleepers,
                self.pool.max_gpus as usize,
            )?;
            match decision {
                Decision::Existing { capacity_pod } => {
                    return Ok((
                        self.placement(&capacity_pod, &reservation.id, "Existing"),
                        "existing",
                    ));
                }
                Decision::Place {
                    capacity_pod,
                    resource_version,
                    reservations,
                    reason,
                    ends_drain,
                    evicts,
                } => {
                    let mut patch = reservations_patch(&reservations, resource_version.as_deref(), None, now);
                    if ends_drain {
                        // Nothing else had room: the plan behind the drain no longer holds (core::pack).
                        patch["metadata"]["annotations"][ANNOTATION_DRAINING_SINCE] = serde_json::Value::Null;
                    }
                    match self.patch_capacity(&capacity_pod, &patch).await {
                        Ok(()) => {
                            if ends_drain {
                                self.metrics.drain(&self.pool.name, "ended_by_placement");
                                info!(%capacity_pod, "no other GPU had room: placed on the GPU being drained, which ends its drain");
                            }
                            // A booked spare is opened by the leader at the event that shows it; a loan's sleepers
                            // are evicted by the leader behind the GPU's start-up Lease (`manager/lend.rs`).
                            let label = match reason {
                                crate::state::BOOKED_SPARE => "booked_spare",
                                crate::state::LENT_BY_SLEEPERS => "lent_by_sleepers",
                                _ => "placed",
                            };
                            info!(%capacity_pod, reason, ?evicts, attempt, "reserved");
                            return Ok((self.placement(&capacity_pod, &reservation.id, reason), label));
                        }
                        Err(e) if is_status(&e, 409) || is_status(&e, 404) => {
                            self.metrics.conflict(&self.pool.name);
                            debug!(%capacity_pod, attempt, "capacity pod changed under us; re-reading");
                            self.refresh(&capacity_pod).await?;
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                // No GPU has room and no spare could take it: the webhook admits the pod with a whole GPU (fail
                // open). Only the leader creates capacity pods (spares); this replica never does.
                Decision::NoRoom { reason, gpus } => {
                    return Err(PoolError::NoRoom {
                        pool: self.pool.name.clone(),
                        reason,
                        gpus,
                        max_gpus: self.pool.max_gpus,
                    });
                }
            }
        }
        Err(PoolError::TooManyConflicts {
            pool: self.pool.name.clone(),
            attempts: self.max_attempts,
        })
    }

    /// Removes reservations `ids` from capacity pod `name`, retrying on conflicts. Returns how many were
    /// removed (0 if none was there any more).
    async fn remove_reservations(&self, name: &str, ids: &[String], now: u64) -> Result<usize, PoolError> {
        for _ in 0..self.max_attempts {
            let (remaining, removed, rv, empty_since) = {
                let idx = self.index();
                let Some(gpu) = idx.capacity_pod(name) else {
                    return Ok(0);
                };
                let Ok(list) = &gpu.reservations else { return Ok(0) };
                let remaining: Vec<Reservation> =
                    list.iter().filter(|r| !ids.contains(&r.id)).cloned().collect();
                let removed = list.len() - remaining.len();
                // A GPU that held only sleepers is empty since then (`manager/sleepers.rs`).
                let empty_since = gpu.empty_since.or_else(|| self.sleepers_only_since(name));
                (remaining, removed, gpu.resource_version.clone(), empty_since)
            };
            if removed == 0 {
                return Ok(0);
            }
            let patch = reservations_patch(&remaining, rv.as_deref(), empty_since, now);
            match self.patch_capacity(name, &patch).await {
                Ok(()) => {
                    return Ok(removed);
                }
                Err(e) if is_status(&e, 409) => {
                    self.metrics.conflict(&self.pool.name);
                    self.refresh(name).await?;
                }
                Err(e) if is_status(&e, 404) => {
                    self.index().delete_capacity(name);
                    return Ok(0);
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(PoolError::TooManyConflicts {
            pool: self.pool.name.clone(),
            attempts: self.max_attempts,
        })
    }

    /// Releases a reservation (its pod is gone, or its admission failed). Returns whether it existed.
    #[instrument(skip(self), fields(pool = %self.pool.name))]
    pub async fn release(&self, reservation_id: &str, now: u64) -> Result<bool, PoolError> {
        let Some(name) = self
            .index()
            .find_reservation(reservation_id)
            .map(|(g, _)| g.name.clone())
        else {
            return Ok(false);
        };
        let n = self
            .remove_reservations(&name, &[reservation_id.to_string()], now)
            .await?;
        if n > 0 {
            info!(capacity_pod = %name, reservation_id, "released");
        }
        Ok(n > 0)
    }

    /// A tenant pod was deleted: forget it and free its share.
    pub async fn tenant_deleted(&self, key: &str, now: u64) -> Result<bool, PoolError> {
        let Some(t) = self.index().delete_tenant(key) else {
            return Ok(false);
        };
        self.release(&t.reservation, now).await
    }

    /// Expires reservations whose pod never appeared, marks empty capacity pods, and deletes those empty
    /// past the grace period. `now` is Unix seconds.
    #[instrument(skip(self), fields(pool = %self.pool.name))]
    pub async fn reconcile(&self, now: u64) -> Result<ReconcileReport, PoolError> {
        let mut report = ReconcileReport::default();
        if self.cfg.lend_sleepers {
            report.sleepers_evicted = self.lending_pass(now).await?;
        }
        let expired = self.index().expired(now, self.cfg.reservation_ttl.as_secs());
        for (name, ids) in expired {
            let n = self.remove_reservations(&name, &ids, now).await?;
            if n > 0 {
                warn!(capacity_pod = %name, ?ids, "reservations expired: their pods never appeared");
            }
            report.expired += n;
            self.metrics.expired(&self.pool.name, n);
        }
        // Evicted or failed capacity pods hold no GPU and never run again; left alone they would keep their slot
        // (and count toward maxGpus) forever. Their tenants' reservations go with them: those pods cannot run on
        // a GPU that is gone either.
        let terminated = self.index().terminated();
        for name in terminated {
            match self.pods.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {
                    warn!(capacity_pod = %name, "deleted: failed or evicted, it holds no GPU any more");
                    self.index().delete_capacity(&name);
                    self.metrics.deleted(&self.pool.name);
                    report.deleted.push(name);
                }
                Err(e) if is_status(&e, 404) => self.index().delete_capacity(&name),
                Err(e) => return Err(e.into()),
            }
        }
        report.spares_opened = self.tend_spares().await?;
        report.drain = self.consolidate(now).await?;
        self.publish_sleepers(now);
        let (mark, delete) = self
            .index()
            .empty_gpus(now, self.pool.empty_gpu_grace_period.as_secs());
        for name in mark {
            let rv = self
                .index()
                .capacity_pod(&name)
                .and_then(|g| g.resource_version.clone());
            let patch = reservations_patch(&[], rv.as_deref(), None, now);
            match self.patch_capacity(&name, &patch).await {
                Ok(()) => {
                    report.marked_empty += 1;
                }
                // Someone reserved meanwhile (or it is gone): the next reconcile sees the new state.
                Err(e) if is_status(&e, 409) || is_status(&e, 404) => self.refresh(&name).await?,
                Err(e) => return Err(e.into()),
            }
        }
        for name in delete {
            let rv = self
                .index()
                .capacity_pod(&name)
                .and_then(|g| g.resource_version.clone());
            let dp = DeleteParams::default().preconditions(Preconditions {
                resource_version: rv,
                uid: None,
            });
            match self.pods.delete(&name, &dp).await {
                Ok(_) => {
                    self.index().delete_capacity(&name);
                    info!(capacity_pod = %name, "deleted: empty past the grace period");
                    self.metrics.deleted(&self.pool.name);
                    report.deleted.push(name);
                }
                Err(e) if is_status(&e, 409) => self.refresh(&name).await?,
                Err(e) if is_status(&e, 404) => self.index().delete_capacity(&name),
                Err(e) => return Err(e.into()),
            }
        }
        let held = self.index().capacity().count();
        self.metrics.capacity_pods(&self.pool.name, held);
        Ok(report)
    }

    /// Runs the manager until `shutdown` resolves: watches capacity and tenant pods into the index, frees the
    /// shares of deleted tenants, and reconciles every `interval`. Only the leader should run this; any
    /// number of replicas may call [`PoolManager::reserve`].
    pub async fn run(self, interval: Duration, shutdown: impl std::future::Future<Output = ()>) {
        // Backoff: a failing watch (API down, RBAC missing) retries with exponential backoff instead of in a
        // tight loop that floods the log and the API server.
        let caps = watcher(
            self.pods.clone(),
            tessera_runtime::kube_client::watcher_config().labels(&self.capacity_selector()),
        )
        .default_backoff();
        let tenants = watcher(
            self.all_pods.clone(),
            tessera_runtime::kube_client::watcher_config().labels(&self.tenant_selector()),
        )
        .default_backoff();
        let mut caps = std::pin::pin!(caps);
        let mut tenants = std::pin::pin!(tenants);
        let mut tick = tokio::time::interval(interval);
        let mut shutdown = std::pin::pin!(shutdown);
        let mut cap_buf: Vec<Pod> = Vec::new();
        let mut ten_buf: Vec<Pod> = Vec::new();
        let clock = LoopClock::start();
        let mut last_lent = Vec::new();
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                ev = caps.next() => match ev {
                    Some(Ok(ev)) => {
                        fold_event(ev, &mut cap_buf, |e| match e {
                            Change::Apply(p) => self.index().apply_capacity(&p),
                            Change::Delete(p) => if let Some(n) = p.metadata.name.as_deref() { self.index().delete_capacity(n) },
                            Change::Reset(list) => self.index().reset_capacity(&list),
                        });
                        // A booking on a spare opens it now, not at the next tick: the replica waits for its GPU.
                        if self.spares_need_tending() && let Err(e) = self.tend_spares().await {
                            warn!(error = %e, kind = e.label(), "could not tend the spare capacity pods; retrying next tick");
                        }
                    }
                    Some(Err(e)) => warn!(error = %e, "capacity pod watch failed; it retries"),
                    None => return,
                },
                ev = tenants.next() => match ev {
                    Some(Ok(ev)) => {
                        let mut gone = Vec::new();
                        fold_event(ev, &mut ten_buf, |e| match e {
                            Change::Apply(p) => self.index().apply_tenant(&p),
                            Change::Delete(p) => gone.extend(pod_key(&p)),
                            Change::Reset(list) => self.index().reset_tenants(&list),
                        });
                        for key in gone {
                            if let Err(e) = self.tenant_deleted(&key, clock.now()).await {
                                warn!(error = %e, tenant = %key, "could not free the share of a deleted pod; expiry will");
                            }
                        }
                    }
                    Some(Err(e)) => warn!(error = %e, "tenant pod watch failed; it retries"),
                    None => return,
                },
                _ = tick.tick() => {
                    if let Err(e) = self.reconcile(clock.now()).await {
                        warn!(error = %e, kind = e.label(), "pool reconcile failed; retrying next tick");
                    }
                }
            }
            // A loan recorded by any webhook replica is carried out at the event that shows it, not at the next
            // tick: the newcomer's sidecar may ask for the GPU's start-up Lease within seconds.
            if self.cfg.lend_sleepers {
                let (lent, marks) = {
                    let idx = self.index();
                    (idx.lent(), !idx.sleep_marks(clock.now()).is_empty())
                };
                if lent != last_lent || marks {
                    if let Err(e) = self.lending_pass(clock.now()).await {
                        warn!(error = %e, kind = e.label(), "could not mark sleepers or carry out a loan; retrying next tick");
                    }
                    last_lent = lent;
                }
            }
        }
    }
}

/// A read-only view of each pool, called every pool interval with the pool's name, its GPUs' shape (memory and
/// the compute each hands out) and its index (the autoscaler's `/ui` shows the GPUs from it).
pub type PoolObserver = Arc<dyn Fn(&str, &tessera_core::pack::GpuShape, &PoolIndex) + Send + Sync>;

/// Runs one [`PoolManager`] per configured pool until `shutdown` is cancelled, without metrics; see
/// [`run_pools_with_metrics`].
pub async fn run_pools(
    client: kube::Client,
    cfg: Arc<PoolsConfig>,
    interval: Duration,
    shutdown: tokio_util::sync::CancellationToken,
) -> Result<(), PoolError> {
    run_pools_with_metrics(
        client,
        cfg,
        interval,
        PoolMetrics::default(),
        None,
        ConsolidationLink::default(),
        shutdown,
    )
    .await
}

/// Runs one [`PoolManager`] per configured pool until `shutdown` is cancelled: what the autoscaler's leader
/// calls. Each manager first rebuilds from the cluster (retrying every `interval` until the API answers),
/// then watches and reconciles every `interval`. Returns once every manager has stopped.
pub async fn run_pools_with_metrics(
    client: kube::Client,
    cfg: Arc<PoolsConfig>,
    interval: Duration,
    metrics: PoolMetrics,
    observer: Option<PoolObserver>,
    link: ConsolidationLink,
    shutdown: tokio_util::sync::CancellationToken,
) -> Result<(), PoolError> {
    if cfg.mode == crate::PoolMode::Dra {
        // No capacity pods: the scheduler books claims on the slices this publishes (`dra`).
        return crate::dra::run_dra_pools(client, cfg, interval, link.dra.clone(), metrics, shutdown).await;
    }
    let mut tasks = tokio::task::JoinSet::new();
    for pool in &cfg.pools {
        let m = PoolManager::new(client.clone(), cfg.clone(), &pool.name)?
            .with_metrics(metrics.clone())
            .with_link(link.clone());
        if let Some(observe) = observer.clone() {
            // A clone shares the index: the observer reads what the manager's watches and reconciles keep.
            let view = m.clone();
            let token = shutdown.clone();
            tasks.spawn(async move {
                loop {
                    tokio::select! {
                        () = token.cancelled() => return,
                        () = tokio::time::sleep(interval) => {}
                    }
                    let index = view.index();
                    observe(&view.pool().name, &view.pool().shape(), &index);
                }
            });
        }
        let token = shutdown.clone();
        tasks.spawn(async move {
            loop {
                match m.rebuild().await {
                    Ok(()) => break,
                    Err(e) => {
                        warn!(pool = %m.pool.name, error = %e, "cannot list pool pods yet; retrying");
                        tokio::select! {
                            () = token.cancelled() => return,
                            () = tokio::time::sleep(interval) => {}
                        }
                    }
                }
            }
            m.run(interval, token.cancelled_owned()).await;
        });
    }
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// The run loop's clock, in Unix seconds: the wall clock read once at start, advanced by tokio's monotonic
/// clock. Only the run loop reads it; everything it calls takes time as a parameter. Advancing with tokio's
/// clock (not re-reading the wall clock) is what lets a test drive grace periods and TTLs with paused time;
/// the drift from the wall clock over a run (NTP slews) is seconds, against grace periods and TTLs of minutes.
#[derive(Debug, Clone, Copy)]
struct LoopClock {
    unix_at_start: u64,
    start: tokio::time::Instant,
}

impl LoopClock {
    fn start() -> Self {
        Self {
            unix_at_start: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            start: tokio::time::Instant::now(),
        }
    }

    fn now(&self) -> u64 {
        self.unix_at_start.saturating_add(self.start.elapsed().as_secs())
    }
}
