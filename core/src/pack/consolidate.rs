//! Consolidation: which GPU of a pool to empty, and how a model moves its replicas off it without dropping a
//! request.
//!
//! Placement is online: replicas land where there is room when they start, and when load falls the survivors
//! stay where they are. A pool of idle tools can so hold two GPUs, each a third full, for a whole day, because
//! neither ever empties for the release grace. [`Packer::defrag`] finds the GPUs that moving a few replicas
//! would empty; this module decides when to act on one and how each model takes part. Both halves are pure and
//! shared: the pool manager and the controller run them against the cluster, the simulator against its world.
//!
//! **The pool's half** ([`pool_step`], one call per pool tick): at most one GPU drains at a time. A GPU becomes
//! a *candidate* when a plan of at most [`ConsolidationConfig::max_moves`] moves empties it and every replica
//! on it is movable (the caller says which; in Kubernetes a Ready pod of a Deployment that an InferenceAutoscaler
//! manages: a StatefulSet cannot pick which pod goes, a pod nobody manages is never moved, and a reservation
//! without a pod cannot move). It is drained once the same GPU has stayed a candidate for
//! [`ConsolidationConfig::settle`]: a move costs each moved replica a cold start with its memory held twice
//! meanwhile, so a GPU is emptied only when demand has left it emptiable for a while, not on one quiet minute.
//! Draining marks the GPU: new replicas go elsewhere unless nothing else has room, and it is never a move's
//! target. The drain ends when the GPU is empty (the pool's usual empty grace then releases it). It is called
//! off when a new replica had to be placed on it because no other GPU had room (load grew: the plan no longer
//! holds), or when it has taken longer than [`ConsolidationConfig::drain_timeout`] (a move that cannot finish,
//! such as a surge pod that never becomes ready).
//!
//! **The model's half** ([`move_step`], one call per replica decision): a make-before-break move. While some of
//! the model's pods sit on a draining GPU and fewer than the desired count run elsewhere, the model is asked
//! for one replica more than desired (a *surge*); the new pod is placed off the draining GPU by the rule
//! above. Once it is ready, one pod on the draining GPU is *retired*: the count goes back to the desired
//! number and the retired pod is the one removed (in Kubernetes, `controller.kubernetes.io/pod-deletion-cost`
//! makes the ReplicaSet pick it). Ready capacity never falls below the desired count, and one pod moves at a
//! time per model. The rule needs no memory of its own: it reads which pods are where and ready.

use std::time::Duration;

use super::{DefragPlan, GpuId, Packer, ReplicaRequest};

/// The consolidation knobs (the pool config's `consolidation`, the simulator's settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsolidationConfig {
    /// Off: no GPU is drained, and a drain under way is called off.
    pub enabled: bool,
    /// The most replicas moved to empty one GPU. Each costs a cold start; 0 disables consolidation.
    pub max_moves: usize,
    /// How long the same GPU must stay emptiable before it is drained.
    pub settle: Duration,
    /// A drain not finished after this long is cancelled (its models did not move).
    pub drain_timeout: Duration,
}

impl ConsolidationConfig {
    /// Whether GPUs are drained at all (on, and allowed at least one move).
    pub fn is_on(&self) -> bool {
        self.enabled && self.max_moves > 0
    }

    /// A pool's rule (the pool manager's config, the simulator's scenario): `settle` unset settles for the pool's
    /// `empty_grace` — a GPU that has stayed emptiable as long as an empty GPU is kept is worth emptying
    /// (measured in the simulator: `docs/simulator-experiments.md`, "Consolidation").
    pub fn for_pool(
        enabled: bool,
        max_moves: usize,
        settle: Option<Duration>,
        empty_grace: Duration,
        drain_timeout: Duration,
    ) -> Self {
        Self {
            enabled,
            max_moves,
            settle: settle.unwrap_or(empty_grace),
            drain_timeout,
        }
    }
}

impl Default for ConsolidationConfig {
    /// On, two moves per GPU, settling for the default empty grace ([`super::DEFAULT_EMPTY_GRACE`]), thirty minutes
    /// to finish. The pool and the simulator settle for their own empty grace (that one unless set): a GPU that has
    /// stayed emptiable as long as an empty GPU is kept is worth emptying. Measured in the simulator
    /// (`docs/simulator-experiments.md`, "Consolidation").
    fn default() -> Self {
        Self {
            enabled: true,
            max_moves: 2,
            settle: super::DEFAULT_EMPTY_GRACE,
            drain_timeout: Duration::from_secs(1800),
        }
    }
}

/// A GPU that could be emptied, and since when it has been the pool's candidate (seconds on the caller's clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// The GPU.
    pub gpu: GpuId,
    /// Since when.
    pub since: u64,
}

/// Why a drain was called off here. (A drain is also called off when a new replica had to be placed on the
/// draining GPU because no other had room: the packer clears the mark itself, [`super::PlaceReason::Draining`].)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelReason {
    /// It took longer than [`ConsolidationConfig::drain_timeout`].
    TimedOut,
    /// Consolidation was turned off.
    Disabled,
}

impl CancelReason {
    /// A fixed label for logs, metrics and events.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::TimedOut => "TimedOut",
            Self::Disabled => "Disabled",
        }
    }
}

/// What the pool does this tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolStep {
    /// Nothing to do: no GPU can be emptied within the limits (or consolidation is off).
    Idle,
    /// A GPU could be emptied; it is drained once it has been the candidate for the settle time. The caller
    /// keeps `candidate` for the next call.
    Settling {
        /// The GPU and since when.
        candidate: Candidate,
        /// How it would be emptied.
        plan: DefragPlan,
    },
    /// Start draining this plan's GPU: mark it (since now).
    Drain(DefragPlan),
    /// A drain is under way: keep the mark.
    Draining(GpuId),
    /// The draining GPU is empty: clear the mark; the pool's empty grace releases it as any empty GPU.
    Drained(GpuId),
    /// Clear the mark: the drain cannot or should not finish.
    Cancel {
        /// The GPU.
        gpu: GpuId,
        /// Why.
        reason: CancelReason,
    },
}

impl PoolStep {
    /// The candidate to remember for the next call.
    pub fn candidate(&self) -> Option<Candidate> {
        match self {
            Self::Settling { candidate, .. } => Some(*candidate),
            _ => None,
        }
    }

    /// The mark to write, if this step changes one: the GPU and its new `draining_since` (`None` clears it).
    pub fn mark(&self, now: u64) -> Option<(GpuId, Option<u64>)> {
        match self {
            Self::Drain(plan) => Some((plan.gpu, Some(now))),
            Self::Drained(gpu) | Self::Cancel { gpu, .. } => Some((*gpu, None)),
            Self::Idle | Self::Settling { .. } | Self::Draining(_) => None,
        }
    }

    /// A fixed label for a step that changes a mark (`started`, `drained`, `timed_out`, `disabled`), for metrics
    /// and reports; `None` for the others.
    pub fn label(&self) -> Option<&'static str> {
        match self {
            Self::Drain(_) => Some("started"),
            Self::Drained(_) => Some("drained"),
            Self::Cancel {
                reason: CancelReason::TimedOut,
                ..
            } => Some("timed_out"),
            Self::Cancel {
                reason: CancelReason::Disabled,
                ..
            } => Some("disabled"),
            Self::Idle | Self::Settling { .. } | Self::Draining(_) => None,
        }
    }
}

/// The replica count a scaling rule should read: `/scale`'s count less the surge the last round asked for (a
/// surge is not a count the rule chose). The controller remembers a surge in its status, the simulator in its
/// model state.
pub fn count_before_surge(count: u32, surged: bool) -> u32 {
    count.saturating_sub(u32::from(surged))
}

/// The pool's consolidation step at `now` (seconds, the same clock as [`super::GpuState::draining_since`]).
///
/// `candidate` is what the previous call returned in [`PoolStep::candidate`]; `movable` says whether a replica
/// can be moved (see the module docs).
pub fn pool_step(
    packer: &Packer,
    candidate: Option<Candidate>,
    now: u64,
    cfg: &ConsolidationConfig,
    movable: impl Fn(&ReplicaRequest) -> bool,
) -> PoolStep {
    // A drain under way first: only one at a time, so that two GPUs never shed replicas onto each other.
    if let Some(g) = packer.gpus().find(|g| g.is_draining()) {
        let since = g.draining_since.unwrap_or(now);
        if g.is_empty() {
            return PoolStep::Drained(g.id);
        }
        if !cfg.is_on() {
            return PoolStep::Cancel {
                gpu: g.id,
                reason: CancelReason::Disabled,
            };
        }
        if now.saturating_sub(since) >= cfg.drain_timeout.as_secs() {
            return PoolStep::Cancel {
                gpu: g.id,
                reason: CancelReason::TimedOut,
            };
        }
        // Whether the rest still fits elsewhere is not checked again here: a replica being moved has its new copy
        // on the target while the old one still stands, so the room is taken twice until it retires. Room that
        // really runs out shows as a new replica placed on this GPU, which ends the drain.
        return PoolStep::Draining(g.id);
    }
    if !cfg.is_on() {
        return PoolStep::Idle;
    }
    // Plans come cheapest first, and only GPUs whose replicas can all move are considered.
    let Some(plan) = packer
        .defrag_movable(cfg.max_moves, 1, movable)
        .into_iter()
        .next()
    else {
        return PoolStep::Idle;
    };
    let since = match candidate {
        Some(c) if c.gpu == plan.gpu => c.since,
        _ => now,
    };
    if now.saturating_sub(since) >= cfg.settle.as_secs() {
        PoolStep::Drain(plan)
    } else {
        PoolStep::Settling {
            candidate: Candidate { gpu: plan.gpu, since },
            plan,
        }
    }
}

/// Where one model's pods are, for [`move_step`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ModelPlacement {
    /// The replica count the scaling rule wants.
    pub desired: u32,
    /// Pods on a draining GPU (ready or not).
    pub on_draining: u32,
    /// Ready pods elsewhere.
    pub off_ready: u32,
    /// Pods elsewhere not ready yet (a surge starting).
    pub off_starting: u32,
}

/// What a model does about pods on a draining GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveStep {
    /// Nothing to move: apply the desired count.
    Stay,
    /// Run one replica more than desired so that a pod can leave the draining GPU without capacity falling.
    Surge,
    /// Go back to the desired count, removing `pods` of the pods on the draining GPU (those first).
    Retire {
        /// How many of the pods on the draining GPU to remove.
        pods: u32,
    },
}

impl MoveStep {
    /// The replica count to apply for a scaling decision of `desired`.
    pub fn replicas(&self, desired: u32) -> u32 {
        match self {
            Self::Surge => desired.saturating_add(1),
            Self::Stay | Self::Retire { .. } => desired,
        }
    }

    /// A fixed label for logs, metrics and status.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Stay => "Stay",
            Self::Surge => "Surge",
            Self::Retire { .. } => "Retire",
        }
    }
}

/// The model's move step (see the module docs).
pub fn move_step(p: ModelPlacement) -> MoveStep {
    if p.on_draining == 0 {
        return MoveStep::Stay;
    }
    // Enough runs elsewhere (or the model is scaling down anyway): the pods on the draining GPU go first.
    if p.off_ready >= p.desired {
        return MoveStep::Retire { pods: p.on_draining };
    }
    // A surge pod is still starting: wait for it.
    if p.off_starting > 0 {
        return MoveStep::Surge;
    }
    // The surge pod is ready (one more than desired runs): one pod leaves the draining GPU.
    if p.on_draining + p.off_ready > p.desired {
        return MoveStep::Retire { pods: 1 };
    }
    MoveStep::Surge
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::pack::GpuShape;

    fn packer() -> Packer {
        Packer::new(GpuShape::new(80 * 1024, 1024).unwrap())
    }

    fn req(id: &str, model: &str, milli: u32, mib: u64) -> ReplicaRequest {
        ReplicaRequest::new(id, model, milli, mib)
    }

    /// Two GPUs a quarter full each: one can be emptied onto the other.
    fn two_quarters() -> (Packer, GpuId, GpuId) {
        let mut p = packer();
        let a = p.add_gpu();
        let b = p.add_gpu();
        p.assign(a, req("a1", "x", 250, 20_000)).unwrap();
        p.assign(b, req("b1", "y", 200, 15_000)).unwrap();
        (p, a, b)
    }

    #[test]
    fn a_gpu_is_drained_only_after_it_stayed_emptiable_for_the_settle_time() {
        let (p, _, b) = two_quarters();
        let cfg = ConsolidationConfig::default();
        let first = pool_step(&p, None, 1000, &cfg, |_| true);
        let PoolStep::Settling { candidate, plan } = &first else {
            panic!("{first:?}")
        };
        // The lighter GPU is the cheaper to empty.
        assert_eq!((candidate.gpu, candidate.since, plan.gpu), (b, 1000, b));
        let settle = cfg.settle.as_secs();
        let later = pool_step(&p, first.candidate(), 1000 + settle - 1, &cfg, |_| true);
        assert!(matches!(later, PoolStep::Settling { .. }), "{later:?}");
        let due = pool_step(&p, later.candidate(), 1000 + settle, &cfg, |_| true);
        assert_eq!(due, PoolStep::Drain(plan.clone()));
    }

    #[test]
    fn a_different_candidate_restarts_the_settle_time() {
        let (p, a, _) = two_quarters();
        let cfg = ConsolidationConfig::default();
        let stale = Candidate { gpu: a, since: 0 };
        let s = pool_step(&p, Some(stale), 5000, &cfg, |_| true);
        assert_eq!(s.candidate().map(|c| c.since), Some(5000));
    }

    #[test]
    fn immovable_replicas_and_disabled_pools_drain_nothing() {
        let (p, _, _) = two_quarters();
        let cfg = ConsolidationConfig::default();
        assert_eq!(pool_step(&p, None, 0, &cfg, |_| false), PoolStep::Idle);
        let off = ConsolidationConfig {
            enabled: false,
            ..cfg
        };
        assert_eq!(pool_step(&p, None, 0, &off, |_| true), PoolStep::Idle);
        // The y replica cannot move, so the GPU holding x is the one to empty.
        let (p, a, _) = two_quarters();
        let s = pool_step(&p, None, 0, &cfg, |r| r.model != "y");
        assert_eq!(s.candidate().map(|c| c.gpu), Some(a));
    }

    #[test]
    fn a_drain_ends_when_empty_and_is_cancelled_when_it_cannot_finish() {
        let cfg = ConsolidationConfig::default();
        let (mut p, a, b) = two_quarters();
        p.set_draining(b, Some(100));
        // The moved replica's copy already stands on a: the drain goes on while the old one retires.
        p.assign(a, req("b1-copy", "y", 200, 15_000)).unwrap();
        assert_eq!(pool_step(&p, None, 200, &cfg, |_| true), PoolStep::Draining(b));
        // Too long.
        assert_eq!(
            pool_step(&p, None, 100 + 1800, &cfg, |_| true),
            PoolStep::Cancel {
                gpu: b,
                reason: CancelReason::TimedOut
            }
        );
        // Empty: done.
        p.remove("b1");
        assert_eq!(pool_step(&p, None, 200, &cfg, |_| true), PoolStep::Drained(b));
    }

    #[test]
    fn new_replicas_avoid_a_draining_gpu_unless_nothing_else_has_room() {
        let (mut p, a, b) = two_quarters();
        p.set_draining(b, Some(0));
        // Best fit alone would pick either; the draining one is out.
        let placed = p.place(req("n1", "w", 100, 1000)).unwrap();
        assert_eq!(placed.gpu(), Some(a));
        // Fill a: the next one goes to the draining GPU rather than nowhere, and that ends the drain.
        p.assign(a, req("a3", "v", 640, 40_000)).unwrap();
        let placed = p.place(req("n2", "u", 300, 1000)).unwrap();
        assert_eq!(
            placed,
            crate::pack::Placement::Gpu {
                gpu: b,
                reason: crate::pack::PlaceReason::Draining
            }
        );
        assert!(!p.gpu(b).unwrap().is_draining());
        p.set_draining(b, Some(0));
        // A draining GPU is never a move's target, nor a candidate.
        assert!(
            p.defrag_candidates(4)
                .iter()
                .all(|plan| plan.gpu != b && plan.moves.iter().all(|m| m.to != b))
        );
    }

    #[test]
    fn a_model_surges_then_retires_one_pod_at_a_time() {
        let at = |desired, on_draining, off_ready, off_starting| ModelPlacement {
            desired,
            on_draining,
            off_ready,
            off_starting,
        };
        // Nothing on a draining GPU.
        assert_eq!(move_step(at(2, 0, 2, 0)), MoveStep::Stay);
        // One replica, on the draining GPU: surge to two, wait while the new one starts, then retire the old.
        assert_eq!(move_step(at(1, 1, 0, 0)), MoveStep::Surge);
        assert_eq!(MoveStep::Surge.replicas(1), 2);
        assert_eq!(move_step(at(1, 1, 0, 1)), MoveStep::Surge);
        assert_eq!(move_step(at(1, 1, 1, 0)), MoveStep::Retire { pods: 1 });
        // Two on the draining GPU, one moved so far: the moved one is ready, so retire one and surge again.
        assert_eq!(move_step(at(2, 2, 1, 0)), MoveStep::Retire { pods: 1 });
        assert_eq!(move_step(at(2, 1, 1, 0)), MoveStep::Surge);
        // Scaling down anyway: the pods on the draining GPU are the ones to go, with no surge.
        assert_eq!(move_step(at(1, 1, 1, 0)), MoveStep::Retire { pods: 1 });
        assert_eq!(move_step(at(0, 1, 0, 0)), MoveStep::Retire { pods: 1 });
    }

    #[test]
    fn ready_capacity_never_falls_below_desired_during_a_move() {
        // Drive the rule as a ReplicaSet would: a surge pod starts, becomes ready next round; a retire removes
        // pods from the draining GPU. Ready pods must never be fewer than min(desired, ready at the start).
        for desired in 1..=4u32 {
            for on in 1..=desired {
                let mut st = ModelPlacement {
                    desired,
                    on_draining: on,
                    off_ready: desired - on,
                    off_starting: 0,
                };
                for _ in 0..4 * desired + 4 {
                    let ready = st.on_draining + st.off_ready;
                    assert!(ready >= desired, "{st:?}");
                    match move_step(st) {
                        MoveStep::Stay => break,
                        MoveStep::Surge if st.off_starting == 0 => st.off_starting = 1,
                        MoveStep::Surge => {
                            st.off_starting -= 1;
                            st.off_ready += 1;
                        }
                        MoveStep::Retire { pods } => {
                            let extra =
                                (st.on_draining + st.off_ready + st.off_starting).saturating_sub(desired);
                            st.on_draining -= pods.min(extra).min(st.on_draining);
                        }
                    }
                }
                assert_eq!(
                    (st.on_draining, st.off_ready),
                    (0, desired),
                    "desired {desired}, on {on}"
                );
            }
        }
    }
}
