//! Which GPU allocation is *in force* for a model, and whether running pods should be rolled onto it.
//!
//! The sidecars' recommendation moves with traffic; applying every wobble would restart vLLM servers (a cold start
//! each) for nothing. So the controller keeps two things per model:
//! - the **candidate**: the latest recommendation and since when it has stayed within a tolerance of itself;
//! - the allocation **in force**: what new pods get (`updateMode: Initial` and `Recreate`). A candidate becomes
//!   in force once it has been stable for the stability window; a shrink that keeps shrinking counts as stable,
//!   and the largest recommendation of its window comes into force (`track`). An *urgent growth* becomes in force at once
//!   ([`Urgency`]): more memory while vLLM preempts (preemptions recompute work and hurt latency now), or a bigger
//!   compute share while a replica's TTFT p95 is over the objective (a replica started on a smaller share stays
//!   on it until replaced, and each sync it breaches the SLO guard adds a replica instead — measured on the
//!   simulator's default scenario, `docs/simulator-experiments.md`, "The allocation in force, and urgent compute growth").
//!   Values fixed in the policy (`gpu.memory: 10240`, `gpu.computeFraction: "0.25"`) always win over the
//!   recommendation.
//!
//! With `updateMode: Recreate`, the roll rule (`decide_roll`) says whether to roll the running pods now. A roll is a
//! make-before-break: the controller bumps a hash annotation on the workload's pod template and the Deployment or
//! StatefulSet controller replaces pods with its own strategy (surge first where it allows). The rule never rolls
//! below `minReplicas` ready, never while the model is scaling or a previous roll is in progress, never two models
//! of one pool at once, never against a PodDisruptionBudget, and never shrinks on missing data. A shrink rolls only
//! to give GPU memory back: pods that hold a larger compute share but no more memory keep it until they are
//! replaced for another reason (a restart costs a cold start and frees nothing while MPS caps are limits).
//!
//! The controller and the simulator take this half of the round through one call, [`fold`]: what was kept from
//! the last round, the recommendation, the pods' allocations and the workload's state in; the candidate, the
//! allocation in force, since when pods drift, which pods drifted, how many an urgency leaves behind, and the roll
//! decision out. Its steps are private so that neither caller can sequence them on its own (they did, twice, and
//! drifted apart); only [`drifted`] stays public, as the pod-deletion-cost order a ReplicaSet follows.

use std::time::Duration;

use crate::scale::inputs::replica_signals;
use crate::wire::sidecar::SidecarStatus;

/// How a policy applies its recommendation (`gpu.updateMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UpdateMode {
    /// Status only.
    #[default]
    Off,
    /// Applied to pods as they are created.
    Initial,
    /// Applied at creation, and running pods that drifted are rolled.
    Recreate,
}

/// One replica's GPU allocation: what a pod runs with, or what is in force.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Allocation {
    /// GPU memory for the replica (MiB): KV cache plus everything else.
    pub memory_mib: u64,
    /// Share of the GPU's compute, in (0, 1].
    pub compute_fraction: f64,
    /// vLLM's `--kv-cache-memory-bytes` that goes with it, when known (carried along; drift is judged on memory
    /// and compute).
    pub kv_cache_memory_bytes: Option<u64>,
    /// The equivalent `--gpu-memory-utilization`, when known.
    pub gpu_memory_utilization: Option<f64>,
}

impl Allocation {
    /// An allocation of `memory_mib` and `compute_fraction`, with no vLLM figures attached.
    pub fn new(memory_mib: u64, compute_fraction: f64) -> Allocation {
        Allocation {
            memory_mib,
            compute_fraction,
            kv_cache_memory_bytes: None,
            gpu_memory_utilization: None,
        }
    }

    /// The largest relative difference between two allocations over memory and compute (0.15 = 15%).
    pub fn relative_drift(&self, from: &Allocation) -> f64 {
        let rel = |a: f64, b: f64| {
            if b > 0.0 {
                (a - b).abs() / b
            } else if a > 0.0 {
                f64::INFINITY
            } else {
                0.0
            }
        };
        rel(self.memory_mib as f64, from.memory_mib as f64)
            .max(rel(self.compute_fraction, from.compute_fraction))
    }

    /// Whether this is a shrink from `from`: no more memory and no more compute, and less of one.
    pub fn shrinks(&self, from: &Allocation) -> bool {
        self.memory_mib <= from.memory_mib
            && self.compute_fraction <= from.compute_fraction
            && (self.memory_mib < from.memory_mib || self.compute_fraction < from.compute_fraction)
    }

    /// The larger of two allocations in each dimension; the vLLM memory figures come with the larger memory.
    pub fn larger(&self, other: &Allocation) -> Allocation {
        let memory = if other.memory_mib > self.memory_mib {
            other
        } else {
            self
        };
        Allocation {
            memory_mib: memory.memory_mib,
            compute_fraction: self.compute_fraction.max(other.compute_fraction),
            kv_cache_memory_bytes: memory.kv_cache_memory_bytes,
            gpu_memory_utilization: memory.gpu_memory_utilization,
        }
    }
}

/// Values the policy fixes (`gpu.memory: <MiB>`, `gpu.computeFraction: "<f>"`); `None` = `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Fixed {
    /// `gpu.memory` as MiB.
    pub memory_mib: Option<u64>,
    /// `gpu.computeFraction` as a number.
    pub compute_fraction: Option<f64>,
}

impl Fixed {
    /// `alloc` with the fixed fields replaced by the policy's values.
    pub fn apply(&self, alloc: Allocation) -> Allocation {
        Allocation {
            memory_mib: self.memory_mib.unwrap_or(alloc.memory_mib),
            compute_fraction: self.compute_fraction.unwrap_or(alloc.compute_fraction),
            ..alloc
        }
    }

    /// The allocation when the policy fixes both fields, whatever the recommendation says.
    pub fn complete(&self) -> Option<Allocation> {
        Some(Allocation::new(self.memory_mib?, self.compute_fraction?))
    }
}

/// The latest recommendation and since when it has been stable (within the tolerance of `alloc`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// The recommendation when it last moved by more than the tolerance.
    pub alloc: Allocation,
    /// When (Unix ms) it last moved.
    pub since_ms: u64,
}

/// What makes a growth urgent this round, read from the model's fresh replicas. Each urges its own dimension:
/// only memory while preempting, only compute while over the TTFT objective. Missing data is never urgent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Urgency {
    /// vLLM preempted on some replica within its window: a memory growth cannot wait.
    pub preempting: bool,
    /// Some replica's TTFT p95 (its short window) is over the TTFT objective: a compute growth cannot wait.
    pub ttft_over_slo: bool,
}

impl Urgency {
    /// The urgency in `statuses` (one per ready pod; `None`: unreadable, never urgent): a fresh replica
    /// (within `max_age`, as the replica decision reads it) that preempted in its window, or whose TTFT p95 is
    /// over `ttft_slo` (no objective: never). The controller and the simulator both read it here.
    pub fn of(statuses: &[Option<&SidecarStatus>], ttft_slo: Option<Duration>, max_age: Duration) -> Urgency {
        let mut u = Urgency::default();
        for st in statuses.iter().flatten() {
            let signals = replica_signals(st, max_age);
            if !signals.fresh {
                continue;
            }
            u.preempting |= st
                .window
                .as_ref()
                .and_then(|w| w.preemptions)
                .is_some_and(|p| p > 0.0);
            u.ttft_over_slo |= ttft_slo.zip(signals.ttft_p95).is_some_and(|(slo, p95)| p95 > slo);
        }
        u
    }
}

/// Settings of the in-force and roll rules.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RolloutConfig {
    /// A recommendation must stay within `tolerance` of itself this long to come into force, and a drift must last
    /// this long before a roll (except an urgent growth).
    pub stability_window: Duration,
    /// Movements of the recommendation smaller than this (relative) do not restart the stability clock.
    pub tolerance: f64,
    /// Running pods whose allocation differs from the one in force by more than this (relative) have drifted.
    pub drift_threshold: f64,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        RolloutConfig {
            stability_window: Duration::from_secs(30 * 60),
            tolerance: 0.05,
            drift_threshold: 0.15,
        }
    }
}

/// Folds a new recommendation into the candidate: a movement beyond the tolerance restarts its clock, except
/// while the recommendation keeps shrinking below what is in force (`in_force`). The sidecar's recommendation moves
/// in bounded steps, so a cache that is too large comes down a few percent per update for hours; if each step
/// restarted the clock, such a shrink would never hold for a whole window and never come into force. So, as HPA's
/// scale-down stabilization does for replicas, a shrink keeps its clock and the **largest** recommendation seen
/// since it started ([`Allocation::larger`]): when the window ends, what comes into force is the most the window
/// asked for. A recommendation that grows past the candidate restarts the clock as before.
/// `None` (no recommendation this round: not yet, or stale) keeps the candidate as it was — missing data never
/// moves anything.
fn track(
    previous: Option<&Candidate>,
    recommended: Option<Allocation>,
    in_force: Option<&Allocation>,
    now_ms: u64,
    cfg: &RolloutConfig,
) -> Option<Candidate> {
    match (previous, recommended) {
        (prev, None) => prev.copied(),
        (Some(prev), Some(rec)) if rec.relative_drift(&prev.alloc) <= cfg.tolerance => Some(*prev),
        (Some(prev), Some(rec)) if in_force.is_some_and(|f| prev.alloc.shrinks(f) && rec.shrinks(f)) => {
            Some(Candidate {
                alloc: prev.alloc.larger(&rec),
                since_ms: prev.since_ms,
            })
        }
        (_, Some(rec)) => Some(Candidate {
            alloc: rec,
            since_ms: now_ms,
        }),
    }
}

/// Why an allocation is (or is not) in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InForceReason {
    /// The recommendation was stable for the window.
    Stable,
    /// The recommendation grows memory while vLLM preempts, or compute while a replica is over the TTFT
    /// objective ([`Urgency`]): applied without waiting.
    UrgentGrowth,
    /// The policy fixes both memory and compute.
    PolicyFixed,
    /// The candidate has not been stable long enough; the previous allocation stays in force.
    Settling,
    /// No recommendation yet and the policy does not fix both values: nothing is in force.
    NoRecommendation,
}

impl InForceReason {
    /// A stable snake_case label for the status and Events.
    pub fn label(self) -> &'static str {
        match self {
            InForceReason::Stable => "stable",
            InForceReason::UrgentGrowth => "urgent_growth",
            InForceReason::PolicyFixed => "policy_fixed",
            InForceReason::Settling => "settling",
            InForceReason::NoRecommendation => "no_recommendation",
        }
    }
}

/// The allocation in force now, and why. `previous` is what was in force before; `urgency` what the model's
/// replicas show this round.
fn in_force(
    fixed: &Fixed,
    candidate: Option<&Candidate>,
    previous: Option<Allocation>,
    urgency: Urgency,
    now_ms: u64,
    cfg: &RolloutConfig,
) -> (Option<Allocation>, InForceReason) {
    if let Some(all) = fixed.complete() {
        return (Some(all), InForceReason::PolicyFixed);
    }
    let window = u64::try_from(cfg.stability_window.as_millis()).unwrap_or(u64::MAX);
    let Some(candidate) = candidate else {
        return match previous {
            Some(p) => (Some(fixed.apply(p)), InForceReason::Settling),
            None => (None, InForceReason::NoRecommendation),
        };
    };
    if now_ms.saturating_sub(candidate.since_ms) >= window {
        return (Some(fixed.apply(candidate.alloc)), InForceReason::Stable);
    }
    let memory_now = urgency.preempting && previous.is_none_or(|p| candidate.alloc.memory_mib > p.memory_mib);
    let compute_now = urgency.ttft_over_slo
        && previous.is_none_or(|p| candidate.alloc.compute_fraction > p.compute_fraction);
    if memory_now || compute_now {
        let mut alloc = candidate.alloc;
        // Each urgency is about its own dimension: the other one's change in the same candidate still waits, and
        // a shrink never rides along (keep the larger of the two).
        if let Some(p) = previous {
            if !compute_now {
                alloc.compute_fraction = alloc.compute_fraction.max(p.compute_fraction);
            }
            if !memory_now && p.memory_mib > alloc.memory_mib {
                alloc.memory_mib = p.memory_mib;
                alloc.kv_cache_memory_bytes = p.kv_cache_memory_bytes;
                alloc.gpu_memory_utilization = p.gpu_memory_utilization;
            }
        }
        return (Some(fixed.apply(alloc)), InForceReason::UrgentGrowth);
    }
    match previous {
        Some(p) => (Some(fixed.apply(p)), InForceReason::Settling),
        None => (None, InForceReason::NoRecommendation),
    }
}

/// How running pods compare with the allocation in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drift {
    /// Every pod whose allocation is known is within the threshold.
    None,
    /// Some pod has less memory (or compute) than in force by more than the threshold: rolling grows it.
    Grow,
    /// Pods hold more than in force by more than the threshold (and none has less): rolling shrinks them.
    Shrink,
    /// No pod's allocation is known (annotations missing): nothing can be judged.
    Unknown,
}

/// Which dimensions `pod` runs below `target` in, by more than `threshold`: (memory, compute).
fn below(target: &Allocation, pod: &Allocation, threshold: f64) -> (bool, bool) {
    (
        (target.memory_mib as f64) > pod.memory_mib as f64 * (1.0 + threshold),
        target.compute_fraction > pod.compute_fraction * (1.0 + threshold),
    )
}

/// Whether `pod` runs with an allocation that has drifted from `target` by more than `threshold`, either way:
/// less memory or compute than in force (a grow would roll it), or more (a shrink would). A scale-down takes such
/// pods first (the controller gives them a low `pod-deletion-cost`, the simulator picks them), so under
/// `updateMode: Initial` the allocation in force reaches a model as its replica count moves, without restarting a
/// server for it.
pub fn drifted(target: &Allocation, pod: &Allocation, threshold: f64) -> bool {
    let (memory, compute) = below(target, pod, threshold);
    memory || compute || pod.relative_drift(target) > threshold
}

/// How many pods run below `target` (by more than `threshold`) in a dimension `urgency` hurries: less memory
/// while vLLM preempts, less compute while a replica is over the TTFT objective. Under `Recreate` any makes the
/// roll an [`RollReason::UrgentGrowth`]; under `Initial` the status names them (they keep what they have).
fn urgently_below(
    target: &Allocation,
    pods: &[Option<Allocation>],
    threshold: f64,
    urgency: Urgency,
) -> usize {
    pods.iter()
        .flatten()
        .filter(|p| {
            let (memory, compute) = below(target, p, threshold);
            (memory && urgency.preempting) || (compute && urgency.ttft_over_slo)
        })
        .count()
}

/// Whether some pod holds more memory than `target` by more than `threshold`.
fn shrinks_memory(target: &Allocation, pods: &[Option<Allocation>], threshold: f64) -> bool {
    pods.iter()
        .flatten()
        .any(|p| p.memory_mib as f64 > target.memory_mib as f64 * (1.0 + threshold))
}

/// Compares the pods' allocations (`None`: unknown, e.g. a pod admitted before Tessera) with `target`.
fn drift(target: &Allocation, pods: &[Option<Allocation>], threshold: f64) -> Drift {
    let known: Vec<&Allocation> = pods.iter().flatten().collect();
    if known.is_empty() {
        return Drift::Unknown;
    }
    if known
        .iter()
        .any(|p| below(target, p, threshold) != (false, false))
    {
        return Drift::Grow;
    }
    // None runs below it, so a drifted pod holds more.
    if known.iter().any(|p| drifted(target, p, threshold)) {
        return Drift::Shrink;
    }
    Drift::None
}

/// When the current drift began: kept while the pods stay drifted, cleared when they are in sync.
fn drift_since(previous: Option<u64>, drift: Drift, now_ms: u64) -> Option<u64> {
    match drift {
        Drift::Grow | Drift::Shrink => Some(previous.unwrap_or(now_ms)),
        Drift::None | Drift::Unknown => None,
    }
}

/// Everything the roll rule needs about one model, as observed this round.
#[derive(Debug, Clone, PartialEq)]
struct RollInput {
    /// `gpu.updateMode`.
    pub mode: UpdateMode,
    /// The allocation in force (see `in_force`).
    pub in_force: Option<Allocation>,
    /// Each running pod's allocation (from its `tessera.dev/gpu-memory` and `tessera.dev/gpu-compute-fraction`).
    pub pods: Vec<Option<Allocation>>,
    /// When the current drift began (`drift_since`).
    pub drift_since_ms: Option<u64>,
    /// What the model's replicas show this round ([`Urgency::of`]).
    pub urgency: Urgency,
    /// What the roll reads of the workload: its replicas, its strategy's budget, what else is rolling.
    pub workload: Workload,
    /// The workload's pod template already carries the allocation in force (a roll to it was made; its pods are
    /// just not replaced yet): rolling again would change nothing.
    pub template_at_in_force: bool,
    /// Now (Unix ms).
    pub now_ms: u64,
}

/// The roll rule's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RollDecision {
    /// Bump the template's hash annotation now.
    Roll(RollReason),
    /// Do not roll this round.
    Hold(HoldReason),
}

/// Why a roll happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RollReason {
    /// Pods run with less memory than in force while vLLM preempts, or less compute while a replica is over the
    /// TTFT objective: grow now.
    UrgentGrowth,
    /// Pods run with less than in force, drifted for the whole window.
    Grow,
    /// Pods hold more than in force, drifted for the whole window: give it back.
    Shrink,
}

/// Why no roll happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldReason {
    /// `updateMode` is not `Recreate`.
    ModeNotRecreate,
    /// Nothing is in force yet.
    NoRecommendation,
    /// No pods run (new pods get the allocation at creation).
    NoPods,
    /// The pods' allocations are unknown: no judgement, never a shrink on missing data.
    PodsUnknown,
    /// Every pod is within the threshold.
    InSync,
    /// The drift has not lasted the stability window yet.
    Settling,
    /// The autoscaler is changing the replica count.
    Scaling,
    /// The workload is still rolling a previous template.
    RolloutInProgress,
    /// Another model of the pool is rolling.
    PoolBusy,
    /// A PodDisruptionBudget forbids a disruption now.
    DisruptionBudget,
    /// Rolling would leave fewer than `minReplicas` ready (or some replicas are not ready yet).
    BelowMinReady,
    /// Pods hold a larger compute share than in force but no more memory: a restart would give back no GPU memory
    /// (MPS caps are limits, not reservations), only slow the pods down, so they keep it until replaced.
    ComputeOnlyShrink,
}

impl RollReason {
    /// A stable snake_case label.
    pub fn label(self) -> &'static str {
        match self {
            RollReason::UrgentGrowth => "urgent_growth",
            RollReason::Grow => "grow",
            RollReason::Shrink => "shrink",
        }
    }
}

impl HoldReason {
    /// A stable snake_case label.
    pub fn label(self) -> &'static str {
        match self {
            HoldReason::ModeNotRecreate => "mode_not_recreate",
            HoldReason::NoRecommendation => "no_recommendation",
            HoldReason::NoPods => "no_pods",
            HoldReason::PodsUnknown => "pods_unknown",
            HoldReason::InSync => "in_sync",
            HoldReason::Settling => "settling",
            HoldReason::Scaling => "scaling",
            HoldReason::RolloutInProgress => "rollout_in_progress",
            HoldReason::PoolBusy => "pool_busy",
            HoldReason::DisruptionBudget => "disruption_budget",
            HoldReason::BelowMinReady => "below_min_ready",
            HoldReason::ComputeOnlyShrink => "compute_only_shrink",
        }
    }
}

/// Whether to roll the model's running pods now. See the module documentation for the rules.
fn decide_roll(input: &RollInput, cfg: &RolloutConfig) -> RollDecision {
    use HoldReason as H;
    let w = &input.workload;
    if input.mode != UpdateMode::Recreate {
        return RollDecision::Hold(H::ModeNotRecreate);
    }
    let Some(target) = input.in_force else {
        return RollDecision::Hold(H::NoRecommendation);
    };
    if w.replicas <= 0 || input.pods.is_empty() {
        return RollDecision::Hold(H::NoPods);
    }
    let d = drift(&target, &input.pods, cfg.drift_threshold);
    match d {
        Drift::Unknown => return RollDecision::Hold(H::PodsUnknown),
        Drift::None => return RollDecision::Hold(H::InSync),
        Drift::Grow | Drift::Shrink => {}
    }
    if w.desired_replicas != w.replicas {
        return RollDecision::Hold(H::Scaling);
    }
    if w.rollout_in_progress {
        return RollDecision::Hold(H::RolloutInProgress);
    }
    if w.pool_busy {
        return RollDecision::Hold(H::PoolBusy);
    }
    if w.disruption_blocked {
        return RollDecision::Hold(H::DisruptionBudget);
    }
    // Make-before-break: every replica ready first, and what the strategy takes down must leave minReplicas.
    if w.ready_replicas < w.replicas || w.ready_replicas - w.max_unavailable.max(0) < w.min_replicas {
        return RollDecision::Hold(H::BelowMinReady);
    }
    let window = u64::try_from(cfg.stability_window.as_millis()).unwrap_or(u64::MAX);
    let lasted = input
        .drift_since_ms
        .is_some_and(|since| input.now_ms.saturating_sub(since) >= window);
    let urgent = urgently_below(&target, &input.pods, cfg.drift_threshold, input.urgency) > 0;
    let reason = match d {
        Drift::Grow if urgent => RollReason::UrgentGrowth,
        Drift::Grow if lasted => RollReason::Grow,
        // A shrink is worth a restart only to give memory back (measured: compute-only shrink rolls cost
        // functions-day 1.3% more GPU-hours and 0.3 point of attainment, docs/simulator-experiments.md).
        Drift::Shrink if lasted && shrinks_memory(&target, &input.pods, cfg.drift_threshold) => {
            RollReason::Shrink
        }
        Drift::Shrink if lasted => return RollDecision::Hold(H::ComputeOnlyShrink),
        _ => return RollDecision::Hold(H::Settling),
    };
    if input.template_at_in_force {
        return RollDecision::Hold(H::RolloutInProgress);
    }
    RollDecision::Roll(reason)
}

/// What the allocation half keeps for a model from one round to the next: the controller in `status.allocation`
/// (so a restart or a new leader loses no clock), the simulator in its model state.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Kept {
    /// The latest recommendation and since when it has held within the tolerance.
    pub candidate: Option<Candidate>,
    /// What new pods get.
    pub in_force: Option<Allocation>,
    /// Since when (Unix ms) running pods have drifted from the allocation in force.
    pub drift_since_ms: Option<u64>,
}

/// What the roll rule reads of the workload this round. Only `updateMode: Recreate` reads it: under another mode
/// a caller may leave it at its default (the controller reads the workload only to roll it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Workload {
    /// The workload's replicas (spec).
    pub replicas: i32,
    /// Replicas ready now.
    pub ready_replicas: i32,
    /// The replicas the autoscaler wants; differs from `replicas` while scaling.
    pub desired_replicas: i32,
    /// The policy's floor.
    pub min_replicas: i32,
    /// How many ready pods the workload's strategy may take down at once during a roll (`maxUnavailable`
    /// resolved; 0 for a surge-only strategy).
    pub max_unavailable: i32,
    /// The workload is still rolling out a previous template.
    pub rollout_in_progress: bool,
    /// Another model of the same pool is being rolled now.
    pub pool_busy: bool,
    /// A PodDisruptionBudget covering the pods allows no disruption now.
    pub disruption_blocked: bool,
}

/// Everything the allocation half of a round reads, as each caller gathered it.
pub struct FoldInput<'a> {
    /// `gpu.updateMode`.
    pub mode: UpdateMode,
    /// The values the policy fixes.
    pub fixed: Fixed,
    /// What the last round kept.
    pub kept: Kept,
    /// This round's recommendation as an allocation; `None` when there is no fresh one (nothing moves on missing
    /// data).
    pub recommended: Option<Allocation>,
    /// What the model's replicas show this round ([`Urgency::of`]).
    pub urgency: Urgency,
    /// Each running pod's allocation (`None`: unknown, e.g. a pod admitted before Tessera).
    pub pods: &'a [Option<Allocation>],
    /// The workload's state, for the roll rule.
    pub workload: Workload,
    /// Whether the workload's pod template already carries an allocation (a roll to it was made, its pods are just
    /// not replaced yet). A predicate rather than a value: the controller knows only the hash its template
    /// annotation carries, the simulator the allocation it rolled to, and which allocation is asked about is
    /// decided here.
    pub template_carries: &'a dyn Fn(&Allocation) -> bool,
    /// Now (Unix ms).
    pub now_ms: u64,
}

impl std::fmt::Debug for FoldInput<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FoldInput")
            .field("mode", &self.mode)
            .field("fixed", &self.fixed)
            .field("kept", &self.kept)
            .field("recommended", &self.recommended)
            .field("urgency", &self.urgency)
            .field("pods", &self.pods)
            .field("workload", &self.workload)
            .field("now_ms", &self.now_ms)
            .finish_non_exhaustive()
    }
}

/// The allocation half of a round, decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Fold {
    /// What to keep for the next round: the candidate, the allocation in force, since when pods drift.
    pub kept: Kept,
    /// Why the allocation in force is what it is.
    pub reason: InForceReason,
    /// How the pods compare with it.
    pub drift: Drift,
    /// For each pod of the input, in its order: whether it drifted from the allocation in force (a scale-down
    /// takes it first). `false` for an unknown allocation, and for every pod while nothing is in force.
    pub drifted: Vec<bool>,
    /// How many pods run below the allocation in force in a dimension this round's urgency hurries: what
    /// `Recreate` rolls at once, named in the status under `Initial`.
    pub behind: usize,
    /// Whether to roll the pods now (`Hold(ModeNotRecreate)` under another mode).
    pub roll: RollDecision,
}

/// The allocation half of a round, in the order both callers need: the recommendation folded into the candidate,
/// the allocation in force, how the pods drift from it and since when, who an urgency leaves behind, then the roll
/// decision on the workload's state. Pure: time comes in as `now_ms`.
pub fn fold(input: &FoldInput<'_>, cfg: &RolloutConfig) -> Fold {
    let now_ms = input.now_ms;
    let prev = input.kept;
    let candidate = track(
        prev.candidate.as_ref(),
        input.recommended,
        prev.in_force.as_ref(),
        now_ms,
        cfg,
    );
    let (force, reason) = in_force(
        &input.fixed,
        candidate.as_ref(),
        prev.in_force,
        input.urgency,
        now_ms,
        cfg,
    );
    let threshold = cfg.drift_threshold;
    let drift_now = force.map_or(Drift::Unknown, |f| drift(&f, input.pods, threshold));
    let drift_since_ms = drift_since(prev.drift_since_ms, drift_now, now_ms);
    let drifted = input
        .pods
        .iter()
        .map(|p| force.zip(*p).is_some_and(|(f, a)| drifted(&f, &a, threshold)))
        .collect();
    let behind = force.map_or(0, |f| urgently_below(&f, input.pods, threshold, input.urgency));
    let roll = decide_roll(
        &RollInput {
            mode: input.mode,
            in_force: force,
            pods: input.pods.to_vec(),
            drift_since_ms,
            urgency: input.urgency,
            workload: input.workload,
            template_at_in_force: force.is_some_and(|f| (input.template_carries)(&f)),
            now_ms,
        },
        cfg,
    );
    Fold {
        kept: Kept {
            candidate,
            in_force: force,
            drift_since_ms,
        },
        reason,
        drift: drift_now,
        drifted,
        behind,
        roll,
    }
}

#[cfg(test)]
mod tests;
