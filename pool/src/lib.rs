//! The GPU pool manager: capacity pods, reservations, and release of empty GPUs.
//!
//! A replica that asks for a fraction of a GPU gets it from a *capacity pod* that holds the whole device
//! ([`capacity`]). At admission the webhook calls [`PoolManager::reserve`]: the core packer chooses the
//! capacity pod ([`state::PoolIndex::decide`]), and the reservation is written into that pod's
//! `tessera.dev/reservations` annotation with a merge patch carrying `metadata.resourceVersion`. If another
//! webhook replica wrote first the API server answers 409; the manager re-reads the pod, decides again, and
//! retries, so no share is ever booked twice. When no capacity pod has room, a new one is created already
//! holding the reservation (its Pending state is what makes the cluster autoscaler or Karpenter add a node).
//!
//! The cluster is the only store: a restarted manager lists capacity pods and tenant pods and knows
//! everything again ([`PoolManager::rebuild`]). [`PoolManager::reconcile`] drops reservations whose pod never
//! appeared (TTL), marks empty GPUs, and deletes those empty for longer than the pool's grace period (the
//! delete carries a resourceVersion precondition, so a reservation racing in makes the delete fail instead of
//! losing the GPU under it). A deleted tenant pod frees its share ([`PoolManager::tenant_deleted`]). Each reconcile
//! also runs consolidation's pool half (`manager/consolidate.rs`: drain a GPU whose few replicas fit on the others; the
//! controller moves the pods, sharing state through [`ConsolidationLink`]).
//!
//! With `lendSleepers`, a reservation whose pod sleeps (marked `asleepSince` by the leader) lends its room to a new
//! one that would otherwise open a GPU; the leader deletes the sleeper behind the GPU's start-up Lease
//! (`manager/lend.rs`; the decision is [`state::PoolIndex::decide`] through `tessera_core::pack::sleeping`).
//! Whatever `lendSleepers` says, each reconcile publishes every GPU's sleepers and budget to the controller
//! ([`sleepers::SleepLink`]), which applies the sleeper budget, and marks when a GPU has held only sleepers.
//!
//! Labels and annotations (the contract with the webhook, the gpu-agent and the sidecar):
//! - capacity pods: label [`LABEL_POOL`] = pool, label [`LABEL_CAPACITY_POD`] = `"true"`, annotations
//!   [`ANNOTATION_RESERVATIONS`] (JSON, written here), [`ANNOTATION_GPU_UUID`] (written by the gpu-agent),
//!   [`KARPENTER_DO_NOT_DISRUPT`] while it has reservations, [`ANNOTATION_EMPTY_SINCE`] once it has none,
//!   [`ANNOTATION_DRAINING_SINCE`] while consolidation empties it.
//! - tenant pods (set by the webhook): label [`LABEL_POOL`], annotations [`ANNOTATION_RESERVATION`] (the id)
//!   and [`ANNOTATION_CAPACITY_POD`] (the capacity pod's name).

pub mod capacity;
pub mod config;
pub mod dra;
mod manager;
pub mod metrics;
mod shared;
pub mod sleepers;
pub mod state;

pub use config::{ConsolidationSpec, PoolConfigError, PoolMode, PoolSpec, PoolsConfig, SharingMode};
pub use dra::DraView;
pub use manager::{
    Placement, PoolManager, PoolObserver, ReconcileReport, ReserveRequest, run_pools, run_pools_with_metrics,
};
pub use metrics::PoolMetrics;
pub use shared::{CapacityPodSet, ConsolidationLink, DrainingGpus, ManagedPods, SharedGpus};
pub use state::{CapacityGpu, PoolIndex, Reservation, Tenant};

/// Label on capacity pods and tenant pods: the pool's name.
pub const LABEL_POOL: &str = "tessera.dev/pool";
/// Label `"true"` on capacity pods; as an annotation on a tenant pod, the name of its capacity pod.
pub const LABEL_CAPACITY_POD: &str = "tessera.dev/capacity-pod";
/// Annotation on a tenant pod: its capacity pod's name.
pub const ANNOTATION_CAPACITY_POD: &str = "tessera.dev/capacity-pod";
/// Annotation on a tenant pod: its reservation id.
pub const ANNOTATION_RESERVATION: &str = "tessera.dev/reservation";
/// Annotation on a capacity pod: its reservations (JSON `{"version":1,"reservations":[…]}`).
pub const ANNOTATION_RESERVATIONS: &str = "tessera.dev/reservations";
/// Annotation on a capacity pod: its GPU's UUID, published by the gpu-agent.
pub const ANNOTATION_GPU_UUID: &str = "tessera.dev/gpu-uuid";
/// Annotation on a capacity pod: Unix seconds since it has had no reservation.
pub const ANNOTATION_EMPTY_SINCE: &str = "tessera.dev/empty-since";
/// Annotation on a capacity pod: the pool's sharing mode, for the gpu-agent and for people reading it.
pub const ANNOTATION_SHARING: &str = "tessera.dev/sharing";
/// Annotation on a capacity pod: Unix seconds since it has been drained (consolidation: new tenants go elsewhere
/// unless nothing else has room, and its tenants' models move off it; see `tessera_core::pack::consolidate`).
pub const ANNOTATION_DRAINING_SINCE: &str = "tessera.dev/draining-since";
/// Annotation the ReplicaSet controller reads to choose which pod goes first on a scale-down (lower first): the
/// controller sets it on a pod leaving a draining GPU, and on one that runs another allocation than the one in
/// force (`tessera_autoscaler::controller::deletion_cost`).
pub const POD_DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";
/// The scheduling gate on a spare capacity pod (`spec.schedulingGates`): no node, no GPU, no cluster-autoscaler
/// scale-up until the leader lifts it, which it does once a reservation is booked there.
pub const SPARE_GATE: &str = "tessera.dev/spare";
/// Karpenter's annotation that keeps a node from voluntary disruption (consolidation) while it is set.
pub const KARPENTER_DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";

/// What the pool manager can fail with. [`PoolError::label`] is a fixed metric label per variant.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum PoolError {
    /// No GPU has room and the pool is at `maxGpus`.
    #[error(
        "pool {pool:?} has no room: {reason}; it holds {gpus} of at most {max_gpus} GPUs (raise maxGpus or free capacity)"
    )]
    NoRoom {
        /// The pool.
        pool: String,
        /// The packer's explanation.
        reason: String,
        /// GPUs held.
        gpus: usize,
        /// The limit.
        max_gpus: u32,
    },
    /// The request itself can never fit (compute outside 1..=1000, more memory than a GPU offers).
    #[error("invalid reservation request: {0}")]
    Invalid(#[from] tessera_core::pack::PackError),
    /// The named pool is not configured.
    #[error("no pool named {0:?} in the pool config")]
    UnknownPool(String),
    /// Other writers kept winning; the caller should fail open.
    #[error("gave up after {attempts} conflicting writes to capacity pods of pool {pool:?}")]
    #[strum(serialize = "conflicts")]
    TooManyConflicts {
        /// The pool.
        pool: String,
        /// Attempts made.
        attempts: u32,
    },
    /// The Kubernetes API failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

impl PoolError {
    /// A fixed label for metrics.
    pub fn label(&self) -> &'static str {
        self.into()
    }
}

#[cfg(test)]
mod lend_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod watch_tests;
