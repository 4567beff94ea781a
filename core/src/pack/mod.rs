//! Packing fractional replicas onto GPUs.
//!
//! A GPU has two capacities: compute, measured in integer milli-GPUs (1000 = the whole device, so no float
//! rounding can ever let a GPU go over), and memory in MiB minus a headroom kept free for CUDA contexts. A
//! replica asks for some of each. Everything here is pure: no clock, no I/O, so the pool manager, the webhook
//! and the what-if simulator all place replicas with exactly the same rules.
//!
//! - [`Packer`] is the *online* packer: it holds the GPUs as they are now and places one replica at a time
//!   (best fit on both dimensions, replicas of one model spread over different GPUs when possible). It also
//!   answers "which GPUs could be emptied by moving at most K replicas" ([`Packer::defrag_candidates`]).
//! - [`pack_offline`] packs a whole set at once (Minimum Bin Slack with an exact per-GPU subset-sum, plus a
//!   best-fit-decreasing fallback), for capacity planning and the `tessera pack` benchmark.
//! - [`lower_bound_l2`] is the Martello–Toth L2 bound, to say how far from optimal a packing can be.
//! - [`Packer::place_beside_sleeping`] places a replica beside sleeping pods (vLLM sleep mode): their room is lent
//!   only where the alternative is opening a GPU.

mod bounds;
pub mod consolidate;
mod offline;
pub mod release;
pub mod sleeping;

use std::collections::{BTreeMap, HashMap};
use std::fmt;

pub use bounds::{LpBound, lower_bound_l2, lower_bound_l2_counts, lower_bound_lp};
pub use offline::{OfflineAlgorithm, OfflinePacking, pack_first_fit_decreasing, pack_offline};
pub use release::{DEFAULT_EMPTY_GRACE, EmptyGpu, compute_milli, empty_gpu};

/// The compute capacity of one GPU in milli-GPUs. Integers, so sums are exact.
pub const GPU_COMPUTE_MILLI: u32 = 1000;

/// The most compute a GPU may hand out, milli: four times the GPU (see [`GpuShape::compute_milli`]).
pub const MAX_COMPUTE_OVERSUBSCRIPTION_MILLI: u32 = 4 * GPU_COMPUTE_MILLI;

/// The same bound in GPUs' worth of compute per GPU (a pool's `computeOversubscription`, the sidecar's
/// `--compute-oversubscription`).
pub const MAX_COMPUTE_OVERSUBSCRIPTION: f64 =
    MAX_COMPUTE_OVERSUBSCRIPTION_MILLI as f64 / GPU_COMPUTE_MILLI as f64;

/// How many GPUs' worth of compute shares an MPS pool hands out per GPU unless told otherwise. An MPS share
/// caps a client's SMs and reserves nothing, and a fractional replica is busy only part of the time, so caps
/// adding up to twice the GPU meet rarely; when they do, each tenant gets SMs in proportion to its cap and
/// the SLO guard adds capacity. Measured in the simulator (`docs/simulator-experiments.md`, "Oversubscribed MPS caps"):
/// against 1.0 it holds 10% fewer GPU-hours on the default scenario and 17% fewer on the quiet mix, at the
/// same attainment; beyond 2.0 it gains little. Time-slicing and unshared pools have no caps: 1.0.
pub const DEFAULT_MPS_COMPUTE_OVERSUBSCRIPTION: f64 = 2.0;

/// The oversubscription a pool gets when its configuration names none: [`DEFAULT_MPS_COMPUTE_OVERSUBSCRIPTION`]
/// under MPS, 1.0 (each GPU handed out once) otherwise.
pub fn default_compute_oversubscription(mps: bool) -> f64 {
    if mps {
        DEFAULT_MPS_COMPUTE_OVERSUBSCRIPTION
    } else {
        1.0
    }
}

/// What one GPU of a pool offers.
/// MiB of each GPU a pool never hands out unless told otherwise, and what the simulator keeps free: one
/// CUDA context takes 300-500 MiB outside vLLM's own accounting, and a shared GPU holds one per tenant (MPS
/// adds its server's), so 1 GiB covers two or three tenants' contexts plus fragmentation. One constant, so the
/// simulator's savings are what a pool left at its defaults does.
pub const DEFAULT_HEADROOM_MIB: u64 = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GpuShape {
    /// The device's memory in MiB (e.g. 81920 for an 80 GiB card).
    pub memory_mib: u64,
    /// MiB kept free on every GPU: each CUDA context (one per process, more under time-slicing) takes a few
    /// hundred MiB outside what vLLM accounts for, so packing to the last MiB would make the last tenant OOM.
    pub headroom_mib: u64,
    /// The compute shares the tenants of one GPU may add up to, milli. [`GPU_COMPUTE_MILLI`] (the default)
    /// hands out the GPU once. Above it the pool oversubscribes: an MPS share is a cap on the SMs a client
    /// may use, not a reservation, so tenants whose busy moments rarely meet can hold caps adding up to more
    /// than the GPU and only slow each other while they run kernels together. Memory is never oversubscribed.
    #[serde(default = "whole_gpu_compute")]
    pub compute_milli: u32,
}

fn whole_gpu_compute() -> u32 {
    GPU_COMPUTE_MILLI
}

impl GpuShape {
    /// A shape, checked: the headroom must leave some memory to hand out.
    pub fn new(memory_mib: u64, headroom_mib: u64) -> Result<Self, PackError> {
        let shape = Self {
            memory_mib,
            headroom_mib,
            compute_milli: GPU_COMPUTE_MILLI,
        };
        shape.validate()?;
        Ok(shape)
    }

    /// The same shape handing out `factor` times the GPU's compute (1.0 = no oversubscription), checked.
    pub fn with_compute_oversubscription(self, factor: f64) -> Result<Self, PackError> {
        let milli = factor * f64::from(GPU_COMPUTE_MILLI);
        let shape = Self {
            compute_milli: if milli.is_finite() && milli >= 0.0 {
                milli.round().min(f64::from(u32::MAX)) as u32
            } else {
                0
            },
            ..self
        };
        shape.validate()?;
        Ok(shape)
    }

    /// How many times the GPU's compute the tenants may hold (1.0 = none oversubscribed).
    pub fn compute_oversubscription(&self) -> f64 {
        f64::from(self.compute_milli) / f64::from(GPU_COMPUTE_MILLI)
    }

    /// Memory that replicas may reserve: the device's memory minus the headroom.
    pub fn usable_memory_mib(&self) -> u64 {
        self.memory_mib.saturating_sub(self.headroom_mib)
    }

    /// Checks the shape; a shape with no usable memory could never hold anything.
    pub fn validate(&self) -> Result<(), PackError> {
        if self.memory_mib == 0 || self.headroom_mib >= self.memory_mib {
            return Err(PackError::InvalidShape {
                memory_mib: self.memory_mib,
                headroom_mib: self.headroom_mib,
            });
        }
        if !(GPU_COMPUTE_MILLI..=MAX_COMPUTE_OVERSUBSCRIPTION_MILLI).contains(&self.compute_milli) {
            return Err(PackError::InvalidOversubscription {
                compute_milli: self.compute_milli,
            });
        }
        Ok(())
    }
}

/// One replica asking for a share of a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ReplicaRequest {
    /// Unique among the replicas a packer holds (a pod name, a reservation id, a trace row).
    pub id: String,
    /// The model it serves: replicas of one model are spread over GPUs so one GPU failure cannot take all down.
    pub model: String,
    /// Compute share in milli-GPUs, 1..=1000.
    pub compute_milli: u32,
    /// GPU memory in MiB (0 when the memory dimension is unknown, as in compute-only traces).
    pub memory_mib: u64,
    /// Higher goes first when several are placed together ([`Packer::place_all`]).
    pub priority: i32,
}

impl ReplicaRequest {
    /// A request with priority 0.
    pub fn new(id: impl Into<String>, model: impl Into<String>, compute_milli: u32, memory_mib: u64) -> Self {
        Self {
            id: id.into(),
            model: model.into(),
            compute_milli,
            memory_mib,
            priority: 0,
        }
    }

    /// Its size normalised by a GPU, the larger of the two dimensions (0..=1): the order "largest first" uses.
    pub(crate) fn weight(&self, shape: &GpuShape) -> f64 {
        let c = f64::from(self.compute_milli) / f64::from(GPU_COMPUTE_MILLI);
        let m = self.memory_mib as f64 / shape.usable_memory_mib().max(1) as f64;
        c.max(m)
    }
}

/// A GPU in a [`Packer`]. Ids are handed out by the packer and never reused within one packer, so a stale id
/// from a removed GPU can never silently point at a different device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct GpuId(pub u64);

impl fmt::Display for GpuId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gpu-{}", self.0)
    }
}

/// Why a replica went where it went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlaceReason {
    /// The GPU that, after placement, leaves the least normalised room on compute plus memory, among the GPUs
    /// that hold no replica of the same model.
    BestFit,
    /// The first GPU (in id order) with room, among those holding no replica of the same model (first-fit policy).
    FirstFit,
    /// Only GPUs that already hold a replica of this model had room; the one with the fewest replicas of the
    /// model (then best fit) was chosen. Spreading is a preference, not a reason to leave a replica unplaced.
    SameModelOnly,
    /// Only a GPU being emptied ([`GpuState::draining_since`]) had room: taking it beats opening a GPU, and its
    /// drain is called off (the plan that started it no longer holds).
    Draining,
    /// No existing GPU had room and a new one was opened.
    Opened,
}

impl PlaceReason {
    /// A fixed, short label for logs, metrics and status conditions.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::BestFit => "BestFit",
            Self::FirstFit => "FirstFit",
            Self::SameModelOnly => "SameModelOnly",
            Self::Draining => "DrainingGpu",
            Self::Opened => "OpenedGpu",
        }
    }
}

/// Why a replica could not be placed on an existing GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoRoomReason {
    /// The packer holds no GPU at all.
    NoGpus,
    /// Every GPU lacks room on compute or memory (or both); a new GPU would take it.
    AllFull {
        /// The most free compute on any GPU, milli.
        max_free_compute_milli: u32,
        /// The most free memory on any GPU, MiB.
        max_free_memory_mib: u64,
    },
}

impl fmt::Display for NoRoomReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoGpus => write!(f, "no GPUs in the pool"),
            Self::AllFull {
                max_free_compute_milli,
                max_free_memory_mib,
            } => write!(
                f,
                "no GPU has room (most free: {max_free_compute_milli} milli compute, {max_free_memory_mib} MiB)"
            ),
        }
    }
}

/// The answer of [`Packer::place`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Placed on this GPU, for this reason.
    Gpu {
        /// Where.
        gpu: GpuId,
        /// Why.
        reason: PlaceReason,
    },
    /// Not placed; the packer is unchanged.
    NoRoom(NoRoomReason),
}

impl Placement {
    /// The GPU, if placed.
    pub fn gpu(&self) -> Option<GpuId> {
        match self {
            Self::Gpu { gpu, .. } => Some(*gpu),
            Self::NoRoom(_) => None,
        }
    }
}

/// A request the packer cannot take no matter how many GPUs it had, or a misuse of its API.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PackError {
    /// The GPU shape leaves no usable memory.
    #[error(
        "GPU shape has {memory_mib} MiB of memory and {headroom_mib} MiB of headroom: the headroom must be \
         smaller than the memory (set the pool's gpuMemoryMiB to the device's memory and headroom to a few hundred MiB)"
    )]
    InvalidShape {
        /// The device memory given.
        memory_mib: u64,
        /// The headroom given.
        headroom_mib: u64,
    },
    /// The compute a GPU hands out is below the GPU or above the most this packer allows.
    #[error(
        "GPU shape hands out {compute_milli} milli-GPUs of compute per GPU: it must be 1000 (the GPU once) to \
         4000 (set the pool's computeOversubscription between 1.0 and 4.0)"
    )]
    InvalidOversubscription {
        /// The compute per GPU given, milli.
        compute_milli: u32,
    },
    /// The compute share is 0 or more than a whole GPU.
    #[error(
        "replica {id:?} asks for {compute_milli} milli-GPUs of compute: a fractional replica needs 1..=1000 \
         (use a whole GPU outside the pool for more)"
    )]
    InvalidCompute {
        /// The replica.
        id: String,
        /// What it asked.
        compute_milli: u32,
    },
    /// The memory asked for is more than a GPU of this shape can hand out.
    #[error(
        "replica {id:?} asks for {memory_mib} MiB of GPU memory but a GPU of this pool offers {usable_mib} MiB \
         after headroom: lower the request or use a pool with larger GPUs"
    )]
    TooMuchMemory {
        /// The replica.
        id: String,
        /// What it asked.
        memory_mib: u64,
        /// What one GPU offers.
        usable_mib: u64,
    },
    /// A replica with this id is already placed.
    #[error("replica {0:?} is already placed; remove it first or use a unique id")]
    Duplicate(String),
    /// The GPU id is not (or no longer) in the packer.
    #[error("{0} is not in this packer")]
    UnknownGpu(GpuId),
    /// The replica does not fit on the GPU it was assigned to.
    #[error("replica {id:?} does not fit on {gpu}: {why}")]
    DoesNotFit {
        /// The replica.
        id: String,
        /// The GPU.
        gpu: GpuId,
        /// Which dimension is short.
        why: String,
    },
}

/// One GPU's tenants and what they use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuState {
    /// Its id.
    pub id: GpuId,
    /// Sum of the tenants' compute, milli (never above `compute_capacity_milli`).
    pub compute_used_milli: u32,
    /// What its tenants' compute may add up to, milli (the shape's [`GpuShape::compute_milli`]).
    pub compute_capacity_milli: u32,
    /// Sum of the tenants' memory, MiB (never above the usable memory).
    pub memory_used_mib: u64,
    /// The tenants, in placement order.
    pub replicas: Vec<ReplicaRequest>,
    /// Being emptied since (Unix seconds in the product, scenario seconds in the simulator): new replicas go
    /// elsewhere unless nothing else has room, and it is never a target of a move ([`consolidate`]).
    pub draining_since: Option<u64>,
}

impl GpuState {
    fn new(id: GpuId, shape: &GpuShape) -> Self {
        Self {
            id,
            compute_used_milli: 0,
            compute_capacity_milli: shape.compute_milli,
            memory_used_mib: 0,
            replicas: Vec::new(),
            draining_since: None,
        }
    }

    /// Whether it is being emptied.
    pub fn is_draining(&self) -> bool {
        self.draining_since.is_some()
    }

    /// Free compute, milli.
    pub fn free_compute_milli(&self) -> u32 {
        self.compute_capacity_milli
            .saturating_sub(self.compute_used_milli)
    }

    /// Free memory, MiB, for a GPU of `shape`.
    pub fn free_memory_mib(&self, shape: &GpuShape) -> u64 {
        shape.usable_memory_mib().saturating_sub(self.memory_used_mib)
    }

    /// Whether `r` fits in what is free.
    pub fn fits(&self, r: &ReplicaRequest, shape: &GpuShape) -> bool {
        r.compute_milli <= self.free_compute_milli() && r.memory_mib <= self.free_memory_mib(shape)
    }

    /// How many tenants serve `model`.
    pub fn replicas_of(&self, model: &str) -> usize {
        self.replicas.iter().filter(|r| r.model == model).count()
    }

    /// Whether it has no tenants.
    pub fn is_empty(&self) -> bool {
        self.replicas.is_empty()
    }

    /// Normalised room left after adding `r` (compute share + memory share; 0 = both exactly full).
    fn leftover_after(&self, r: &ReplicaRequest, shape: &GpuShape) -> f64 {
        let c =
            f64::from(self.free_compute_milli() - r.compute_milli) / f64::from(self.compute_capacity_milli);
        let m = (self.free_memory_mib(shape) - r.memory_mib) as f64 / shape.usable_memory_mib().max(1) as f64;
        c + m
    }

    fn add(&mut self, r: ReplicaRequest) {
        self.compute_used_milli += r.compute_milli;
        self.memory_used_mib += r.memory_mib;
        self.replicas.push(r);
    }

    fn take(&mut self, id: &str) -> Option<ReplicaRequest> {
        let i = self.replicas.iter().position(|r| r.id == id)?;
        let r = self.replicas.remove(i);
        self.compute_used_milli -= r.compute_milli;
        self.memory_used_mib -= r.memory_mib;
        Some(r)
    }
}

/// How [`Packer::place`] chooses among GPUs with room.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FitPolicy {
    /// Least normalised leftover (compute + memory) after placement. Tessera's policy.
    #[default]
    BestFit,
    /// Lowest GPU id with room: the naive baseline benchmarks compare against.
    FirstFit,
}

/// Used and total capacity over all GPUs of a packer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Utilization {
    /// GPUs held (empty ones included).
    pub gpus: usize,
    /// GPUs with no tenant.
    pub empty_gpus: usize,
    /// Sum of tenants' compute / (GPUs × the compute each hands out); 0 when there are no GPUs.
    pub compute_ratio: f64,
    /// Sum of tenants' memory / (GPUs × usable memory); 0 when there are no GPUs.
    pub memory_ratio: f64,
}

/// Moving one replica during defragmentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    /// The replica.
    pub replica: String,
    /// Where it is now.
    pub from: GpuId,
    /// Where it would go.
    pub to: GpuId,
}

/// A GPU that could be emptied, and how.
///
/// Executing a plan is a later step, and must start each replica's new copy on `to` and wait for it to be
/// ready before draining the old one, so that no request is dropped; the GPU is released only once empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefragPlan {
    /// The GPU that would become empty.
    pub gpu: GpuId,
    /// The moves, in order.
    pub moves: Vec<Move>,
}

/// The online packer: the GPUs of one pool, their tenants, and the placement rules.
#[derive(Debug, Clone)]
pub struct Packer {
    shape: GpuShape,
    policy: FitPolicy,
    gpus: BTreeMap<GpuId, GpuState>,
    location: HashMap<String, GpuId>,
    next_id: u64,
}

impl Packer {
    /// An empty packer with the best-fit policy. The shape should be validated ([`GpuShape::new`]); an invalid
    /// one simply fits nothing.
    pub fn new(shape: GpuShape) -> Self {
        Self::with_policy(shape, FitPolicy::BestFit)
    }

    /// An empty packer with the given policy.
    pub fn with_policy(shape: GpuShape, policy: FitPolicy) -> Self {
        Self {
            shape,
            policy,
            gpus: BTreeMap::new(),
            location: HashMap::new(),
            next_id: 0,
        }
    }

    /// The GPU shape.
    pub fn shape(&self) -> &GpuShape {
        &self.shape
    }

    /// Adds an empty GPU and returns its id.
    pub fn add_gpu(&mut self) -> GpuId {
        let id = GpuId(self.next_id);
        self.next_id += 1;
        self.gpus.insert(id, GpuState::new(id, &self.shape));
        id
    }

    /// Removes a GPU and returns its tenants (now unplaced); `None` if unknown.
    pub fn remove_gpu(&mut self, gpu: GpuId) -> Option<Vec<ReplicaRequest>> {
        let state = self.gpus.remove(&gpu)?;
        for r in &state.replicas {
            self.location.remove(&r.id);
        }
        Some(state.replicas)
    }

    /// Marks a GPU as being emptied since `since`, or clears the mark (`None`). False if the GPU is unknown.
    pub fn set_draining(&mut self, gpu: GpuId, since: Option<u64>) -> bool {
        match self.gpus.get_mut(&gpu) {
            Some(g) => {
                g.draining_since = since;
                true
            }
            None => false,
        }
    }

    /// The GPUs, in id order.
    pub fn gpus(&self) -> impl Iterator<Item = &GpuState> {
        self.gpus.values()
    }

    /// One GPU.
    pub fn gpu(&self, id: GpuId) -> Option<&GpuState> {
        self.gpus.get(&id)
    }

    /// Where a replica is.
    pub fn location(&self, replica: &str) -> Option<GpuId> {
        self.location.get(replica).copied()
    }

    /// Number of replicas placed.
    pub fn replica_count(&self) -> usize {
        self.location.len()
    }

    /// GPUs with no tenants (candidates for release after the pool's grace period).
    pub fn empty_gpus(&self) -> Vec<GpuId> {
        self.gpus
            .values()
            .filter(|g| g.is_empty())
            .map(|g| g.id)
            .collect()
    }

    /// Used versus held capacity.
    pub fn utilization(&self) -> Utilization {
        let gpus = self.gpus.len();
        let empty_gpus = self.gpus.values().filter(|g| g.is_empty()).count();
        if gpus == 0 {
            return Utilization {
                gpus,
                empty_gpus,
                compute_ratio: 0.0,
                memory_ratio: 0.0,
            };
        }
        let c: u64 = self.gpus.values().map(|g| u64::from(g.compute_used_milli)).sum();
        let m: u64 = self.gpus.values().map(|g| g.memory_used_mib).sum();
        Utilization {
            gpus,
            empty_gpus,
            compute_ratio: c as f64 / (gpus as f64 * f64::from(self.shape.compute_milli)),
            memory_ratio: m as f64 / (gpus as f64 * self.shape.usable_memory_mib().max(1) as f64),
        }
    }

    /// Checks a request on its own (not against the current GPUs): could an empty GPU of this shape hold it?
    pub fn check(&self, r: &ReplicaRequest) -> Result<(), PackError> {
        check_request(r, &self.shape)
    }

    /// Places `r` on an existing GPU, or says why none has room (the packer is then unchanged).
    ///
    /// Among GPUs holding no replica of `r.model`, the policy picks (best fit by default). Only if none of those
    /// has room is a GPU that already holds the model used: the one with the fewest replicas of it, then best fit.
    pub fn place(&mut self, r: ReplicaRequest) -> Result<Placement, PackError> {
        self.check(&r)?;
        if self.location.contains_key(&r.id) {
            return Err(PackError::Duplicate(r.id));
        }
        let placement = self.choose(&r);
        if let Placement::Gpu { gpu, reason } = placement {
            self.insert_placed(gpu, reason, r);
        }
        Ok(placement)
    }

    /// Places `r`, opening a new GPU if no existing one has room. Returns the GPU and whether it was opened.
    pub fn place_or_open(&mut self, r: ReplicaRequest) -> Result<(GpuId, PlaceReason), PackError> {
        self.check(&r)?;
        if self.location.contains_key(&r.id) {
            return Err(PackError::Duplicate(r.id));
        }
        match self.choose(&r) {
            Placement::Gpu { gpu, reason } => {
                self.insert_placed(gpu, reason, r);
                Ok((gpu, reason))
            }
            Placement::NoRoom(_) => {
                let gpu = self.add_gpu();
                self.insert(gpu, r);
                Ok((gpu, PlaceReason::Opened))
            }
        }
    }

    /// Places several at once: highest priority first, then largest first (so that big replicas are not
    /// stranded by small ones), then by id for determinism. Opens GPUs only if `open` is true, at most
    /// `max_gpus` in total. Returns each id with its placement (`NoRoom` for those left out).
    pub fn place_all(
        &mut self,
        mut requests: Vec<ReplicaRequest>,
        open: bool,
        max_gpus: usize,
    ) -> Vec<(String, Result<Placement, PackError>)> {
        let shape = self.shape;
        requests.sort_by(|a, b| {
            b.priority
                .cmp(&a.priority)
                .then(b.weight(&shape).total_cmp(&a.weight(&shape)))
                .then_with(|| a.id.cmp(&b.id))
        });
        let mut out = Vec::with_capacity(requests.len());
        for r in requests {
            let id = r.id.clone();
            let res = match self.place(r.clone()) {
                Ok(Placement::NoRoom(_)) if open && self.gpus.len() < max_gpus => self
                    .place_or_open(r)
                    .map(|(gpu, reason)| Placement::Gpu { gpu, reason }),
                other => other,
            };
            out.push((id, res));
        }
        out
    }

    /// Puts `r` on a specific GPU (rebuilding state from the cluster, or executing a move). Checked: the GPU
    /// must exist and have room.
    pub fn assign(&mut self, gpu: GpuId, r: ReplicaRequest) -> Result<(), PackError> {
        self.check(&r)?;
        if self.location.contains_key(&r.id) {
            return Err(PackError::Duplicate(r.id));
        }
        let state = self.gpus.get(&gpu).ok_or(PackError::UnknownGpu(gpu))?;
        if !state.fits(&r, &self.shape) {
            let why = if r.compute_milli > state.free_compute_milli() {
                format!(
                    "needs {} milli compute, {} free",
                    r.compute_milli,
                    state.free_compute_milli()
                )
            } else {
                format!(
                    "needs {} MiB, {} free",
                    r.memory_mib,
                    state.free_memory_mib(&self.shape)
                )
            };
            return Err(PackError::DoesNotFit { id: r.id, gpu, why });
        }
        self.insert(gpu, r);
        Ok(())
    }

    /// Removes a replica, freeing exactly its share. Returns it and its GPU; `None` if it was not placed.
    /// The GPU stays (possibly empty): releasing empty GPUs is the caller's decision (grace periods).
    pub fn remove(&mut self, replica: &str) -> Option<(GpuId, ReplicaRequest)> {
        let gpu = self.location.remove(replica)?;
        let r = self.gpus.get_mut(&gpu)?.take(replica)?;
        Some((gpu, r))
    }

    /// Inserts a replica the placement rule put on `gpu`. A draining GPU that had to take a new replica is no
    /// longer being emptied: nothing else had room, so the plan that started the drain no longer holds, and
    /// moving replicas off it now would only open a GPU elsewhere.
    fn insert_placed(&mut self, gpu: GpuId, reason: PlaceReason, r: ReplicaRequest) {
        if reason == PlaceReason::Draining {
            self.set_draining(gpu, None);
        }
        self.insert(gpu, r);
    }

    fn insert(&mut self, gpu: GpuId, r: ReplicaRequest) {
        if let Some(state) = self.gpus.get_mut(&gpu) {
            self.location.insert(r.id.clone(), gpu);
            state.add(r);
        }
    }

    /// The placement decision, without changing anything.
    ///
    /// GPUs being drained are a last resort: only when no other GPU has room is the best of them taken (reason
    /// [`PlaceReason::Draining`]), because filling a GPU that is being emptied still beats opening one.
    fn choose(&self, r: &ReplicaRequest) -> Placement {
        let among = |draining: bool| {
            choose_among(
                self.gpus.values().filter(|g| g.is_draining() == draining),
                r,
                &self.shape,
                self.policy,
            )
        };
        let open = among(false);
        if !matches!(open, Placement::NoRoom(_)) || !self.gpus.values().any(GpuState::is_draining) {
            return open;
        }
        match among(true) {
            Placement::Gpu { gpu, .. } => Placement::Gpu {
                gpu,
                reason: PlaceReason::Draining,
            },
            // Say how full the GPUs open to placement are, unless every GPU is draining.
            Placement::NoRoom(draining) => match open {
                Placement::NoRoom(NoRoomReason::NoGpus) => Placement::NoRoom(draining),
                other => other,
            },
        }
    }

    /// GPUs that could be emptied by moving at most `max_moves` replicas each onto other GPUs, without
    /// opening any GPU and respecting both capacities (and the spreading preference, as [`Packer::place`]).
    ///
    /// Plans are cumulative: each is computed on the state left by the previous ones (a GPU being emptied is
    /// never a target, and moved replicas take room), so executing them all in order is valid. GPUs with the
    /// fewest replicas, then the least used, are tried first: they are the cheapest to empty.
    pub fn defrag_candidates(&self, max_moves: usize) -> Vec<DefragPlan> {
        self.defrag(max_moves, usize::MAX)
    }

    /// Like [`Packer::defrag_candidates`], stopping after `max_plans` plans (callers that act on one plan at a
    /// time need not pay for finding all).
    ///
    /// Cost: O(G log G) to order the candidates, O(1) to reject one that cannot work by total or largest free
    /// room, and O(K × G) to simulate one that might. Nothing is cloned: tentative moves live in an overlay.
    pub fn defrag(&self, max_moves: usize, max_plans: usize) -> Vec<DefragPlan> {
        self.defrag_movable(max_moves, max_plans, |_| true)
    }

    /// Like [`Packer::defrag`], considering only GPUs whose replicas are all `movable` (the others stay
    /// targets).
    pub fn defrag_movable(
        &self,
        max_moves: usize,
        max_plans: usize,
        movable: impl Fn(&ReplicaRequest) -> bool,
    ) -> Vec<DefragPlan> {
        if max_moves == 0 || max_plans == 0 {
            return Vec::new();
        }
        let shape = self.shape;
        let mut order: Vec<&GpuState> = self
            .gpus
            .values()
            .filter(|g| {
                !g.is_empty()
                    && !g.is_draining()
                    && g.replicas.len() <= max_moves
                    && g.replicas.iter().all(&movable)
            })
            .collect();
        order.sort_by_key(|g| (g.replicas.len(), g.compute_used_milli, g.memory_used_mib, g.id));
        let mut overlay = Overlay::default();
        // Free room over all possible targets (non-empty GPUs), kept up to date as plans are accepted.
        let mut total_free_c: u64 = 0;
        let mut total_free_m: u64 = 0;
        let mut max_free_c = [0u32; 2];
        let mut max_free_m = [0u64; 2];
        for g in self.gpus.values().filter(|g| !g.is_empty() && !g.is_draining()) {
            total_free_c += u64::from(g.free_compute_milli());
            total_free_m += g.free_memory_mib(&shape);
            top2(&mut max_free_c, g.free_compute_milli());
            top2(&mut max_free_m, g.free_memory_mib(&shape));
        }
        let mut plans = Vec::new();
        for cand in order {
            if plans.len() >= max_plans {
                break;
            }
            if overlay.emptied.contains(&cand.id) {
                continue;
            }
            if overlay.added.contains_key(&cand.id) {
                // It received replicas from an earlier plan: emptying it would move them twice.
                continue;
            }
            let own_free_c = u64::from(cand.free_compute_milli());
            let own_free_m = cand.free_memory_mib(&shape);
            let others_c = total_free_c.saturating_sub(own_free_c);
            let others_m = total_free_m.saturating_sub(own_free_m);
            if u64::from(cand.compute_used_milli) > others_c || cand.memory_used_mib > others_m {
                continue;
            }
            // The largest free room elsewhere is at most the top value, or the second if the top is this GPU's.
            let best_c = if max_free_c[0] == cand.free_compute_milli() {
                max_free_c[1]
            } else {
                max_free_c[0]
            };
            let best_m = if max_free_m[0] == own_free_m {
                max_free_m[1]
            } else {
                max_free_m[0]
            };
            let need_c = cand.replicas.iter().map(|r| r.compute_milli).max().unwrap_or(0);
            let need_m = cand.replicas.iter().map(|r| r.memory_mib).max().unwrap_or(0);
            if need_c > best_c || need_m > best_m {
                continue;
            }
            let Some(trial) = self.trial_moves(cand, &overlay) else {
                continue;
            };
            overlay.emptied.insert(cand.id);
            total_free_c = total_free_c.saturating_sub(own_free_c);
            total_free_m = total_free_m.saturating_sub(own_free_m);
            let mut moves = Vec::with_capacity(trial.len());
            for (to, r) in trial {
                let a = overlay.added.entry(to).or_default();
                a.compute += r.compute_milli;
                a.memory += r.memory_mib;
                a.models.push(r.model.clone());
                total_free_c = total_free_c.saturating_sub(u64::from(r.compute_milli));
                total_free_m = total_free_m.saturating_sub(r.memory_mib);
                moves.push(Move {
                    replica: r.id.clone(),
                    from: cand.id,
                    to,
                });
            }
            plans.push(DefragPlan { gpu: cand.id, moves });
        }
        plans
    }

    /// The moves that would empty `cand` given the accepted plans in `overlay`, largest replica first (the
    /// hardest to fit decide whether the plan is possible at all); `None` if one of them fits nowhere.
    fn trial_moves<'a>(
        &self,
        cand: &'a GpuState,
        overlay: &Overlay,
    ) -> Option<Vec<(GpuId, &'a ReplicaRequest)>> {
        let shape = self.shape;
        let mut moving: Vec<&ReplicaRequest> = cand.replicas.iter().collect();
        moving.sort_by(|a, b| b.weight(&shape).total_cmp(&a.weight(&shape)));
        let mut trial: Vec<(GpuId, &ReplicaRequest)> = Vec::with_capacity(moving.len());
        for r in moving {
            let to = self.choose_with_overlay(r, cand.id, overlay, &trial)?;
            trial.push((to, r));
        }
        Some(trial)
    }

    /// The best-fit target for `r` given the overlay of accepted plans and the trial moves of the plan being
    /// built, excluding `from` and emptied or empty GPUs. Same rule as [`Packer::place`].
    fn choose_with_overlay(
        &self,
        r: &ReplicaRequest,
        from: GpuId,
        overlay: &Overlay,
        trial: &[(GpuId, &ReplicaRequest)],
    ) -> Option<GpuId> {
        let shape = &self.shape;
        let mut best_other: Option<(f64, GpuId)> = None;
        let mut best_same: Option<(usize, f64, GpuId)> = None;
        for g in self.gpus.values() {
            if g.id == from || g.is_empty() || g.is_draining() || overlay.emptied.contains(&g.id) {
                continue;
            }
            let added = overlay.added.get(&g.id);
            let mut used_c = g.compute_used_milli + added.map_or(0, |a| a.compute);
            let mut used_m = g.memory_used_mib + added.map_or(0, |a| a.memory);
            let mut same = g.replicas_of(&r.model)
                + added.map_or(0, |a| a.models.iter().filter(|m| **m == r.model).count());
            for (_, t) in trial.iter().filter(|(to, _)| *to == g.id) {
                used_c += t.compute_milli;
                used_m += t.memory_mib;
                same += usize::from(t.model == r.model);
            }
            let free_c = shape.compute_milli.saturating_sub(used_c);
            let free_m = shape.usable_memory_mib().saturating_sub(used_m);
            if r.compute_milli > free_c || r.memory_mib > free_m {
                continue;
            }
            let score = f64::from(free_c - r.compute_milli) / f64::from(shape.compute_milli)
                + (free_m - r.memory_mib) as f64 / shape.usable_memory_mib().max(1) as f64;
            if same == 0 {
                if best_other.is_none_or(|(s, _)| score < s) {
                    best_other = Some((score, g.id));
                }
            } else if best_same.is_none_or(|(n, s, _)| (same, score) < (n, s)) {
                best_same = Some((same, score, g.id));
            }
        }
        best_other.map(|(_, g)| g).or(best_same.map(|(_, _, g)| g))
    }

    /// Applies a plan produced by [`Packer::defrag`] on this packer: every move is checked again (the state
    /// may have changed since), and if one fails the moves already made are undone, leaving the packer as it was.
    pub fn apply_plan(&mut self, plan: &DefragPlan) -> Result<(), PackError> {
        let mut done: Vec<(GpuId, &str)> = Vec::new();
        let mut failure = None;
        for m in &plan.moves {
            if self.location(&m.replica) != Some(m.from) {
                failure = Some(PackError::UnknownGpu(m.from));
                break;
            }
            let Some((from, r)) = self.remove(&m.replica) else {
                failure = Some(PackError::UnknownGpu(m.from));
                break;
            };
            match self.assign(m.to, r.clone()) {
                Ok(()) => done.push((from, &m.replica)),
                Err(e) => {
                    self.insert(from, r);
                    failure = Some(e);
                    break;
                }
            }
        }
        let Some(e) = failure else { return Ok(()) };
        for (from, id) in done.into_iter().rev() {
            if let Some((_, r)) = self.remove(id) {
                self.insert(from, r);
            }
        }
        Err(e)
    }
}

/// Tentative changes made by accepted defragmentation plans.
#[derive(Debug, Default)]
struct Overlay {
    emptied: std::collections::HashSet<GpuId>,
    added: HashMap<GpuId, Added>,
}

#[derive(Debug, Default)]
struct Added {
    compute: u32,
    memory: u64,
    models: Vec<String>,
}

/// Keeps the two largest values seen, largest first.
fn top2<T: PartialOrd + Copy>(top: &mut [T; 2], v: T) {
    if v > top[0] {
        top[1] = top[0];
        top[0] = v;
    } else if v > top[1] {
        top[1] = v;
    }
}

/// Whether `r` is a valid request for GPUs of `shape`.
pub(crate) fn check_request(r: &ReplicaRequest, shape: &GpuShape) -> Result<(), PackError> {
    if r.compute_milli == 0 || r.compute_milli > GPU_COMPUTE_MILLI {
        return Err(PackError::InvalidCompute {
            id: r.id.clone(),
            compute_milli: r.compute_milli,
        });
    }
    if r.memory_mib > shape.usable_memory_mib() {
        return Err(PackError::TooMuchMemory {
            id: r.id.clone(),
            memory_mib: r.memory_mib,
            usable_mib: shape.usable_memory_mib(),
        });
    }
    Ok(())
}

/// The placement rule shared by online placement and defragmentation.
fn choose_among<'a>(
    gpus: impl Iterator<Item = &'a GpuState>,
    r: &ReplicaRequest,
    shape: &GpuShape,
    policy: FitPolicy,
) -> Placement {
    // (score, id) of the best GPU without the model, and (model count, score, id) of the best with it.
    let mut best_other: Option<(f64, GpuId)> = None;
    let mut best_same: Option<(usize, f64, GpuId)> = None;
    let mut any = false;
    let mut max_free_c = 0;
    let mut max_free_m = 0;
    for g in gpus {
        any = true;
        max_free_c = max_free_c.max(g.free_compute_milli());
        max_free_m = max_free_m.max(g.free_memory_mib(shape));
        if !g.fits(r, shape) {
            continue;
        }
        let score = match policy {
            FitPolicy::BestFit => g.leftover_after(r, shape),
            // Iteration is in id order, so the first seen wins with a constant score.
            FitPolicy::FirstFit => 0.0,
        };
        let same = g.replicas_of(&r.model);
        if same == 0 {
            if best_other.is_none_or(|(s, _)| score < s) {
                best_other = Some((score, g.id));
                if policy == FitPolicy::FirstFit {
                    break;
                }
            }
        } else if best_same.is_none_or(|(n, s, _)| (same, score) < (n, s)) {
            best_same = Some((same, score, g.id));
        }
    }
    if let Some((_, gpu)) = best_other {
        let reason = match policy {
            FitPolicy::BestFit => PlaceReason::BestFit,
            FitPolicy::FirstFit => PlaceReason::FirstFit,
        };
        return Placement::Gpu { gpu, reason };
    }
    if let Some((_, _, gpu)) = best_same {
        return Placement::Gpu {
            gpu,
            reason: PlaceReason::SameModelOnly,
        };
    }
    if !any {
        return Placement::NoRoom(NoRoomReason::NoGpus);
    }
    Placement::NoRoom(NoRoomReason::AllFull {
        max_free_compute_milli: max_free_c,
        max_free_memory_mib: max_free_m,
    })
}

#[cfg(test)]
mod tests;
