//! At the ceiling, buy isolation: a model held at `max_replicas` whose time to first token is over its objective
//! while it shares GPUs gets GPUs to itself.
//!
//! Below the ceiling, a model whose TTFT is over its objective gets another replica (the SLO guard) or a bigger
//! share (the joint policy). At `max_replicas` neither is left, and a shared replica's prefill runs on what its
//! co-tenants leave of the SMs: under MPS with oversubscribed caps, a co-tenant's prefill at the same moment halves
//! it. The one unit of latency capacity still for sale is the co-tenants' part of the GPU. So the rule asks for
//! the model's replicas to hold whole GPUs — co-tenants moved make-before-break, no cap oversubscribed on them —
//! before its attainment falls below what the same replica count on whole GPUs gives.
//!
//! Only once the share cannot grow: while the model's share is Tessera's to size and below the whole GPU
//! ([`ShareRoom::Auto`] under 1), a bigger share is the cheaper unit (the joint policy's next unit, a fraction of
//! a GPU) and whole GPUs are not bought. Measured over the simulator's corpus: buying whole GPUs for a model whose
//! cap was the limit held 5–50% more GPU-hours on six scenarios for at most 0.28 point of attainment
//! (docs/simulator-experiments.md, "Whole GPUs only once the share is whole").
//!
//! Only once the ceiling serves: while some of the `max_replicas` asked for are still starting, the ready ones
//! carry the load of all of them, so a TTFT over the objective then measures the start-up, not what the ceiling
//! can do. Isolating then bought whole GPUs for the model's start-up burst and kept them for as long as it stayed at
//! the ceiling (docs/simulator-experiments.md, "Isolation only once the ceiling serves").
//!
//! The rule is stateless beyond the one bit it decides: once isolated, the model stays isolated while it is at
//! its ceiling or its signals are missing (missing data never gives capacity back); below the ceiling the replica
//! loops have room again, and new replicas may share once more (the running ones keep their GPUs until they go,
//! so going back costs no roll).

use std::time::Duration;

use super::joint::ShareRoom;
use super::{ScaleInput, ScalePolicy};

/// Whether the model's replicas should hold whole GPUs, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// Sharing as usual.
    Share,
    /// Whole GPUs: co-tenants moved off its GPUs, new replicas placed alone.
    Isolate(IsolationReason),
}

/// Why a model holds whole GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IsolationReason {
    /// At the ceiling, over the objective with nothing queued: its prefill is slowed by co-tenants.
    CoTenantsAtCeiling,
    /// At the ceiling, over the objective with requests queued: more compute per replica is the only growth left.
    QueuedAtCeiling,
    /// Isolated before and still at the ceiling (or its signals are missing): it stays isolated.
    Held,
}

impl IsolationReason {
    /// A fixed label for metrics and reports.
    pub fn label(self) -> &'static str {
        match self {
            Self::CoTenantsAtCeiling => "co_tenants_at_ceiling",
            Self::QueuedAtCeiling => "queued_at_ceiling",
            Self::Held => "held",
        }
    }
}

/// What the rule reads besides the round's own input and policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IsolationFacts {
    /// Whether any of the model's replicas shares its GPU with another tenant (or holds an oversubscribed cap).
    pub shares_gpu: bool,
    /// What the rule decided last round (`false` at first).
    pub isolated: bool,
}

/// The rule (see the module docs). `input`, `policy` and `room` are the round's own: the live replica count, each
/// fresh replica's TTFT percentiles and queue, `max_replicas` and `ttft_slo`, and what the share can still do.
pub fn isolation(
    policy: &ScalePolicy,
    input: &ScaleInput,
    facts: IsolationFacts,
    room: ShareRoom,
) -> Isolation {
    let at_ceiling = input.current_replicas >= policy.max_replicas;
    let percentile = policy.guard_percentile(input);
    let fresh: Vec<_> = input.replicas.iter().filter(|r| r.fresh).collect();
    let over = |slo: Duration| fresh.iter().any(|r| percentile.of(r).is_some_and(|t| t > slo));
    let known = fresh.iter().any(|r| percentile.of(r).is_some());
    if facts.isolated {
        // Missing data never gives capacity back; only leaving the ceiling does.
        return if at_ceiling || !known {
            Isolation::Isolate(IsolationReason::Held)
        } else {
            Isolation::Share
        };
    }
    let Some(slo) = policy.ttft_slo else {
        return Isolation::Share;
    };
    // The ceiling is judged once it serves: replicas asked for but still starting have not yet taken their part
    // of the load, so a TTFT over the objective then says the ceiling was reached, not that it falls short.
    let ceiling_serving = input.ready_replicas >= policy.max_replicas;
    if !(facts.shares_gpu && at_ceiling && ceiling_serving && over(slo)) {
        return Isolation::Share;
    }
    // A share that can still grow is the cheaper unit: the joint policy asks for it, not for whole GPUs.
    if room.can_grow() {
        return Isolation::Share;
    }
    let queued =
        fresh.iter().any(|r| r.waiting.is_some_and(|w| w > 0)) || input.demand.queued_at_activator > 0;
    Isolation::Isolate(if queued {
        IsolationReason::QueuedAtCeiling
    } else {
        IsolationReason::CoTenantsAtCeiling
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scale::{Demand, ReplicaSignals};

    fn policy(max: u32) -> ScalePolicy {
        ScalePolicy {
            min_replicas: 1,
            max_replicas: max,
            ttft_slo: Some(Duration::from_secs(2)),
            ..ScalePolicy::default()
        }
    }

    fn input(replicas: u32, p95_secs: Option<f64>, waiting: u32) -> ScaleInput {
        ScaleInput {
            current_replicas: replicas,
            ready_replicas: replicas,
            replicas: (0..replicas)
                .map(|_| ReplicaSignals {
                    ttft_p95: p95_secs.map(Duration::from_secs_f64),
                    waiting: Some(waiting),
                    fresh: true,
                    ..ReplicaSignals::default()
                })
                .collect(),
            demand: Demand::default(),
            ttft_window_count: None,
        }
    }

    /// The share in force is the whole GPU's: nothing left to grow.
    const WHOLE: ShareRoom = ShareRoom::Auto {
        share: 1.0,
        memory_fraction: Some(0.5),
    };

    const SHARING: IsolationFacts = IsolationFacts {
        shares_gpu: true,
        isolated: false,
    };

    /// Isolated last round: its GPUs are its own now.
    const HELD: IsolationFacts = IsolationFacts {
        shares_gpu: false,
        isolated: true,
    };

    #[test]
    fn at_the_ceiling_over_the_objective_while_sharing_it_isolates() {
        assert_eq!(
            isolation(&policy(4), &input(4, Some(3.0), 0), SHARING, WHOLE),
            Isolation::Isolate(IsolationReason::CoTenantsAtCeiling)
        );
        assert_eq!(
            isolation(&policy(4), &input(4, Some(3.0), 5), SHARING, WHOLE),
            Isolation::Isolate(IsolationReason::QueuedAtCeiling)
        );
    }

    #[test]
    fn below_the_ceiling_under_the_objective_or_alone_it_shares() {
        // Room for another replica: the SLO guard's job.
        assert_eq!(
            isolation(&policy(4), &input(3, Some(3.0), 0), SHARING, WHOLE),
            Isolation::Share
        );
        // Within the objective.
        assert_eq!(
            isolation(&policy(4), &input(4, Some(1.0), 0), SHARING, WHOLE),
            Isolation::Share
        );
        // Nothing to buy: its GPUs are its own already.
        let alone = IsolationFacts {
            shares_gpu: false,
            isolated: false,
        };
        assert_eq!(
            isolation(&policy(4), &input(4, Some(3.0), 0), alone, WHOLE),
            Isolation::Share
        );
        // No objective, no breach.
        let mut p = policy(4);
        p.ttft_slo = None;
        assert_eq!(
            isolation(&p, &input(4, Some(3.0), 0), SHARING, WHOLE),
            Isolation::Share
        );
        // No latency measured yet: nothing is over.
        assert_eq!(
            isolation(&policy(4), &input(4, None, 0), SHARING, WHOLE),
            Isolation::Share
        );
    }

    #[test]
    fn once_isolated_it_stays_while_at_the_ceiling_or_blind() {
        // Within the objective now, because it is isolated: still at the ceiling, so it stays.
        assert_eq!(
            isolation(&policy(4), &input(4, Some(0.5), 0), HELD, WHOLE),
            Isolation::Isolate(IsolationReason::Held)
        );
        // Signals missing: never give capacity back on missing data.
        assert_eq!(
            isolation(&policy(4), &input(2, None, 0), HELD, WHOLE),
            Isolation::Isolate(IsolationReason::Held)
        );
        // Off the ceiling with signals: the replica loops have room again.
        assert_eq!(
            isolation(&policy(4), &input(2, Some(0.5), 0), HELD, WHOLE),
            Isolation::Share
        );
    }

    /// Replicas asked for but still starting have not taken their part of the load yet: the TTFT of the ready
    /// ones says the ceiling was reached, not that it falls short, so nothing is isolated until all of it serves.
    #[test]
    fn a_ceiling_still_starting_is_not_judged() {
        let mut starting = input(4, Some(3.0), 2);
        starting.ready_replicas = 2;
        starting.replicas.truncate(2);
        assert_eq!(isolation(&policy(4), &starting, SHARING, WHOLE), Isolation::Share);
        // Once every replica of the ceiling is ready and the objective is still missed, it isolates.
        assert_eq!(
            isolation(&policy(4), &input(4, Some(3.0), 2), SHARING, WHOLE),
            Isolation::Isolate(IsolationReason::QueuedAtCeiling)
        );
        // Already isolated, a replica restarting does not give the whole GPUs back.
        assert_eq!(
            isolation(&policy(4), &starting, HELD, WHOLE),
            Isolation::Isolate(IsolationReason::Held)
        );
    }

    /// A share below the whole GPU is the cheaper unit at the ceiling: no whole GPUs while it can grow; a share
    /// the policy fixes (or none known yet) cannot grow, so whole GPUs are still bought; once isolated, a smaller
    /// share in force does not undo it while at the ceiling.
    #[test]
    fn whole_gpus_only_once_the_share_cannot_grow() {
        let at_ceiling = input(4, Some(3.0), 0);
        let partial = ShareRoom::Auto {
            share: 0.78,
            memory_fraction: Some(0.25),
        };
        assert_eq!(
            isolation(&policy(4), &at_ceiling, SHARING, partial),
            Isolation::Share
        );
        for room in [WHOLE, ShareRoom::Fixed, ShareRoom::Unknown] {
            assert_eq!(
                isolation(&policy(4), &at_ceiling, SHARING, room),
                Isolation::Isolate(IsolationReason::CoTenantsAtCeiling),
                "{room:?}"
            );
        }
        assert_eq!(
            isolation(&policy(4), &at_ceiling, HELD, partial),
            Isolation::Isolate(IsolationReason::Held)
        );
    }
}
