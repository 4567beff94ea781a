//! Tessera's allocation in force and its rolls, folded each round with the controller's own rules
//! (`core::rollout`): what new replicas get, and under `updateMode: Recreate` the make-before-break replacement of
//! the running ones that drifted from it.
//!
//! The controller keeps a candidate (the latest recommendation and since when it has held still), brings it into
//! force after the stability window or at once for an urgent growth ([`Urgency`]: memory while preempting, compute
//! while a replica is over the TTFT objective), and rolls pods that drifted from it by bumping the pod template; the
//! Deployment then surges a new pod (which the webhook gives the allocation in force) before each old one goes.
//! Here the old pods leave the way consolidation's moves do (`core::pack::consolidate::move_step`): one surge, then
//! the old pod's retirement once the new one is ready.

use tessera_core::rollout::{self, Allocation, Fixed, RollDecision, RollInput, Urgency};

use super::*;

/// One model's allocation, as the controller keeps it in `status.allocation`.
#[derive(Debug, Default)]
pub(super) struct AllocationState {
    /// The latest recommendation and since when it has held within the tolerance.
    candidate: Option<rollout::Candidate>,
    /// What new replicas get.
    pub(super) in_force: Option<Allocation>,
    /// Since when running pods have drifted from the allocation in force.
    drift_since_ms: Option<u64>,
    /// The allocation the last roll put into the pod template.
    rolled_to: Option<Allocation>,
    /// The replicas that roll replaces (those running when it began); empty when no roll is in progress.
    pub(super) replacing: Vec<usize>,
}

impl AllocationState {
    /// The state a run starts from: `initial` (the calibrated recommendation) in force since time 0, as after the
    /// `updateMode: Off` observation the rollout path starts with, with the values `setup` fixes.
    pub(super) fn starting(initial: Option<&Recommendation>, setup: &ModelSetup) -> AllocationState {
        let alloc = initial.map(allocation_of);
        AllocationState {
            candidate: alloc.map(|alloc| rollout::Candidate { alloc, since_ms: 0 }),
            in_force: alloc.map(|a| fixed_of(setup).apply(a)),
            ..AllocationState::default()
        }
    }
}

/// The values a model's policy fixes (the simulator fixes compute only: `compute_fraction: 0.5`).
pub(super) fn fixed_of(setup: &ModelSetup) -> Fixed {
    Fixed {
        memory_mib: None,
        compute_fraction: match setup.compute_fraction {
            ComputeFraction::Fixed(f) => Some(f),
            ComputeFraction::Auto => None,
        },
    }
}

/// A recommendation as the allocation it would put in force (the controller's `rollout::recommended`).
pub(super) fn allocation_of(r: &Recommendation) -> Allocation {
    Allocation {
        memory_mib: r.gpu_memory_mib,
        compute_fraction: r.compute_fraction,
        kv_cache_memory_bytes: Some(r.kv_cache_memory_bytes),
        gpu_memory_utilization: Some(r.gpu_memory_utilization),
    }
}

impl World<'_> {
    /// Tessera's allocation step for model `m` after its replica decision (the controller's step 6): fold the
    /// model's recommendation into the allocation in force with the `urgency` its ready replicas' documents show,
    /// then, under `Recreate`, decide a roll of the `live` replicas. `desired` is the replica decision.
    pub(super) fn fold_allocation(&mut self, m: usize, urgency: Urgency, live: &[usize], desired: u32) {
        let cfg = self.sc.settings.rollout();
        let now_ms = secs_to_ms(self.now);
        let setup = &self.sc.models[m];
        let fixed = fixed_of(setup);
        let min_replicas = self.models[m].policy.as_ref().map_or(0, |p| p.min_replicas);
        let recommended = self.models[m].rec.as_ref().map(allocation_of);
        let pods: Vec<Option<Allocation>> = live.iter().map(|&r| self.replicas[r].allocation).collect();
        let ready = live
            .iter()
            .filter(|&&r| self.replicas[r].phase == Phase::Ready)
            .count();
        // One model of a pool rolls at a time (the simulator runs one pool).
        let pool_busy = self
            .models
            .iter()
            .enumerate()
            .any(|(o, rt)| o != m && !rt.allocation.replacing.is_empty());
        let st = &mut self.models[m].allocation;
        st.candidate = rollout::track(
            st.candidate.as_ref(),
            recommended,
            st.in_force.as_ref(),
            now_ms,
            &cfg,
        );
        let (force, _) = rollout::in_force(&fixed, st.candidate.as_ref(), st.in_force, urgency, now_ms, &cfg);
        st.in_force = force;
        // A roll is over once every replica it replaces is gone.
        st.replacing.retain(|r| live.contains(r));
        let drift = force.map_or(rollout::Drift::Unknown, |f| {
            rollout::drift(&f, &pods, cfg.drift_threshold)
        });
        st.drift_since_ms = rollout::drift_since(st.drift_since_ms, drift, now_ms);
        let behind = force.map_or(0, |f| {
            rollout::urgently_below(&f, &pods, cfg.drift_threshold, urgency)
        });
        let input = RollInput {
            mode: self.sc.settings.update_mode.core(),
            in_force: force,
            pods,
            drift_since_ms: st.drift_since_ms,
            urgency,
            replicas: live.len() as i32,
            ready_replicas: ready as i32,
            desired_replicas: desired as i32,
            min_replicas: min_replicas as i32,
            // The roll surges one new pod before each old one goes (maxSurge 1, maxUnavailable 0).
            max_unavailable: 0,
            rollout_in_progress: !st.replacing.is_empty(),
            pool_busy,
            disruption_blocked: false,
            template_at_in_force: st.rolled_to.is_some() && st.rolled_to == force,
            now_ms,
        };
        if behind > 0 {
            self.models[m].rounds_behind_while_urgent += 1;
        }
        let st = &mut self.models[m].allocation;
        if let RollDecision::Roll(reason) = rollout::decide_roll(&input, &cfg) {
            tracing::debug!(model = %setup.name, reason = reason.label(), replicas = live.len(), "rolling onto the allocation in force");
            st.rolled_to = force;
            st.replacing = live.to_vec();
            *self.rollouts.rolls.entry(reason.label().to_owned()).or_default() += 1;
        }
    }

    /// Whether replica `r` is being replaced by its model's roll.
    pub(super) fn replaced_by_roll(&self, r: usize) -> bool {
        self.models[self.replicas[r].model]
            .allocation
            .replacing
            .contains(&r)
    }
}
