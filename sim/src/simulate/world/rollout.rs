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
//!
//! Both callers take this half of the round in one call, `core::rollout::fold`; here the simulator only gathers its
//! inputs from the replicas and applies the answer (the roll's surge and retirements).

use std::sync::{Arc, Mutex};

use tessera_core::rollout::{self, Allocation, Fixed, FoldInput, Kept, RollDecision, Urgency, Workload};

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
    /// Where each fold is recorded, when asked for ([`World::recording_allocations`]).
    records: Option<Arc<Mutex<Vec<observe::AllocationRecord>>>>,
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

    /// What the last fold kept, as the next one reads it.
    fn kept(&self) -> Kept {
        Kept {
            candidate: self.candidate,
            in_force: self.in_force,
            drift_since_ms: self.drift_since_ms,
        }
    }

    /// Keeps what a fold decided for the next round.
    fn keep(&mut self, kept: Kept) {
        self.candidate = kept.candidate;
        self.in_force = kept.in_force;
        self.drift_since_ms = kept.drift_since_ms;
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
    /// Records every allocation fold into `sink` (for the controller parity test; costs memory on long runs).
    pub fn recording_allocations(mut self, sink: Arc<Mutex<Vec<observe::AllocationRecord>>>) -> Self {
        for rt in &mut self.models {
            rt.allocation.records = Some(Arc::clone(&sink));
        }
        self
    }

    /// Tessera's allocation step for model `m` after its replica decision (the controller's step 7): gathers what
    /// `core::rollout::fold` reads (the model's recommendation, the `urgency` its ready replicas' documents show,
    /// the `live` replicas' allocations, the roll in progress), folds, and applies a roll. `desired` is the replica
    /// decision.
    pub(super) fn fold_allocation(&mut self, m: usize, urgency: Urgency, live: &[usize], desired: u32) {
        let cfg = self.sc.settings.rollout();
        let now_ms = secs_to_ms(self.now);
        let setup = &self.sc.models[m];
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
        // A roll is over once every replica it replaces is gone.
        st.replacing.retain(|r| live.contains(r));
        let rolled_to = st.rolled_to;
        let carries = |a: &Allocation| rolled_to == Some(*a);
        let input = FoldInput {
            mode: self.sc.settings.update_mode.core(),
            fixed: fixed_of(setup),
            kept: st.kept(),
            recommended,
            urgency,
            pods: &pods,
            workload: Workload {
                replicas: live.len() as i32,
                ready_replicas: ready as i32,
                desired_replicas: desired as i32,
                min_replicas: min_replicas as i32,
                // The roll surges one new pod before each old one goes (maxSurge 1, maxUnavailable 0).
                max_unavailable: 0,
                rollout_in_progress: !st.replacing.is_empty(),
                pool_busy,
                disruption_blocked: false,
            },
            template_carries: &carries,
            now_ms,
        };
        let fold = rollout::fold(&input, &cfg);
        if let Some(sink) = &st.records
            && let Ok(mut records) = sink.lock()
        {
            records.push(observe::AllocationRecord {
                model: setup.name.clone(),
                mode: input.mode,
                fixed: input.fixed,
                kept: input.kept,
                recommended,
                urgency,
                pods: pods.clone(),
                workload: input.workload,
                rolled_to,
                now_ms,
                fold: fold.clone(),
            });
        }
        st.keep(fold.kept);
        if let RollDecision::Roll(reason) = fold.roll {
            tracing::debug!(model = %setup.name, reason = reason.label(), replicas = live.len(), "rolling onto the allocation in force");
            st.rolled_to = fold.kept.in_force;
            st.replacing = live.to_vec();
            *self.rollouts.rolls.entry(reason.label().to_owned()).or_default() += 1;
        }
        if fold.behind > 0 {
            self.models[m].rounds_behind_while_urgent += 1;
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
