//! Which constraint held a model's replica count in one decision, in the joint policy's words.
//!
//! A decision already carries its reason (`ScaleReason`) and its leading signal; together with the joint policy
//! ([`super::joint`]) they say what bound it, but in HPA's vocabulary (`within_tolerance` on `ttftP95`,
//! `too_many_replicas`, …). [`Constraint::of`] names it the way a platform engineer asks the question — the
//! TTFT objective, the TTFT target, prefill, the KV cache, the queue, the request rate, a burst, the scale-down
//! window, a cold start, the bounds — so the controller's status (`status.constraint`) and the simulator's
//! report (each model's share of decisions per constraint) answer it in one word. What the next unit of
//! capacity would cost is the joint policy's [`super::joint::NextUnit`], in the same message.

use super::joint::{self, JointPolicy};
use super::{ScaleDecision, ScaleInput, ScaleReason, Signal};

/// What held the replica count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Constraint {
    /// The TTFT SLO guard: a p95 over the objective added a replica or forbade a scale-down.
    TtftObjective,
    /// The TTFT target on the replica count (the share cannot grow), with requests queueing.
    TtftTarget,
    /// The TTFT target while nothing queued: the time was prefill (`joint::latency_without_queue`).
    Prefill,
    /// The KV cache target (`kvCacheUtilization`).
    KvCache,
    /// Requests waiting in vLLM (`waitingRequestsPerReplica`).
    Queue,
    /// The request rate per replica (`requestsPerSecondPerReplica`).
    RequestRate,
    /// A burst: panic mode scaled at once and holds its peak.
    Burst,
    /// A stabilization window holds an earlier count (HPA's `behavior`): a scale-down waits for its window.
    StabilizationWindow,
    /// A `behavior` rate limit cut the change.
    RateLimit,
    /// A warm floor: one replica kept because a start from zero takes longer than the TTFT objective.
    ColdStart,
    /// Held at `minReplicas`.
    MinReplicas,
    /// Held at `maxReplicas`: the signals ask for more.
    MaxReplicas,
    /// A configured signal could not be read: no scale-down.
    MissingMetrics,
    /// Scale to zero: at zero, going there, woken from it by a request, or one replica kept until the model has
    /// been idle for `idleAfter`.
    ScaleToZero,
    /// No signal is configured or the policy is invalid: the count is left alone.
    None,
}

impl Constraint {
    /// What held `d`, decided by `super::joint::decide` under `joint` on `input`.
    pub fn of(input: &ScaleInput, joint: &JointPolicy, d: &ScaleDecision) -> Self {
        // The floor's reason: a warm floor the joint policy set, the one replica a model allowed to go to zero
        // keeps until it has been idle long enough, or `minReplicas`.
        let floor = if joint.warm_floor.is_some() {
            Self::ColdStart
        } else if joint.policy.min_replicas == 0 {
            Self::ScaleToZero
        } else {
            Self::MinReplicas
        };
        match d.reason {
            ScaleReason::TtftSloBreached | ScaleReason::TtftSloAtRisk => Self::TtftObjective,
            ScaleReason::Panic => Self::Burst,
            // At the floor with every signal under target, the floor is what holds the count, whichever rule
            // also said so this round (a window still holding one replica, a rate limit on the way down).
            ScaleReason::ScaleUp
            | ScaleReason::ScaleDown
            | ScaleReason::WithinTolerance
            | ScaleReason::Stabilizing
            | ScaleReason::RateLimited
            | ScaleReason::MissingMetrics
                if at_floor(joint, d) =>
            {
                floor
            }
            ScaleReason::Stabilizing => Self::StabilizationWindow,
            ScaleReason::RateLimited => Self::RateLimit,
            ScaleReason::TooManyReplicas => Self::MaxReplicas,
            // The warm floor is a `minReplicas` of one the joint policy set: name why it is there.
            ScaleReason::TooFewReplicas => floor,
            ScaleReason::MissingMetrics => Self::MissingMetrics,
            ScaleReason::ScaleToZero | ScaleReason::IdleAtZero | ScaleReason::ScaleFromZero => {
                Self::ScaleToZero
            }
            ScaleReason::InvalidPolicy => Self::None,
            // The TTFT target held at the count because the time is prefill (`scale::cause`).
            ScaleReason::WithinTolerance if d.prefill_held.is_some() => Self::Prefill,
            ScaleReason::ScaleUp | ScaleReason::ScaleDown | ScaleReason::WithinTolerance => {
                match d.leading_signal {
                    Some(Signal::TtftP95) if joint::latency_without_queue(input, d) => Self::Prefill,
                    Some(Signal::TtftP95) => Self::TtftTarget,
                    Some(Signal::KvCacheUtilization) => Self::KvCache,
                    Some(Signal::WaitingRequestsPerReplica) => Self::Queue,
                    Some(Signal::RequestsPerSecondPerReplica) => Self::RequestRate,
                    None => Self::None,
                }
            }
        }
    }

    /// A stable snake_case label (`status.constraint`, the simulator's `held_by` keys).
    pub fn label(self) -> &'static str {
        match self {
            Self::TtftObjective => "ttft_objective",
            Self::TtftTarget => "ttft_target",
            Self::Prefill => "prefill",
            Self::KvCache => "kv_cache",
            Self::Queue => "queue",
            Self::RequestRate => "request_rate",
            Self::Burst => "burst",
            Self::StabilizationWindow => "stabilization_window",
            Self::RateLimit => "rate_limit",
            Self::ColdStart => "cold_start",
            Self::MinReplicas => "min_replicas",
            Self::MaxReplicas => "max_replicas",
            Self::MissingMetrics => "missing_metrics",
            Self::ScaleToZero => "scale_to_zero",
            Self::None => "none",
        }
    }
}

/// Whether the count sits at its floor (`minReplicas`, at least one while not idle) with every signal under its
/// target: a proposal of one replica for a signal at 20% of its target is the floor, not the signal.
fn at_floor(joint: &JointPolicy, d: &ScaleDecision) -> bool {
    d.desired_replicas == joint.policy.min_replicas.max(1)
        && d.signals.iter().all(|s| match s.value {
            Some(v) => v < s.target,
            None => true,
        })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::scale::joint::ShareRoom;
    use crate::scale::{ReplicaSignals, ScalePolicy, ScaleState, ScaleToZero, Targets, Timestamp};

    fn policy() -> ScalePolicy {
        ScalePolicy {
            min_replicas: 1,
            max_replicas: 4,
            ..joint::tests::policy()
        }
    }

    fn input(n: u32, kv: f64, ttft_ms: u64, waiting: u32) -> ScaleInput {
        ScaleInput {
            current_replicas: n,
            ready_replicas: n,
            replicas: (0..n)
                .map(|_| ReplicaSignals {
                    kv_cache_usage: Some(kv),
                    waiting: Some(waiting),
                    running: Some(2),
                    ttft_p95: Some(Duration::from_millis(ttft_ms)),
                    ttft_p99: None,
                    queue_p95: None,
                    fresh: true,
                })
                .collect(),
            ..ScaleInput::default()
        }
    }

    fn held_by(p: &ScalePolicy, i: &ScaleInput, cold_start: Option<Duration>) -> Constraint {
        let j = joint::tests::alone(p, ShareRoom::Fixed, 2.0, cold_start);
        let d = joint::decide(i, &j, &ScaleState::default(), Timestamp::from_millis(600_000));
        Constraint::of(i, &j, &d)
    }

    #[test]
    fn each_decision_names_what_held_it() {
        let p = policy();
        // The KV cache over its target leads a scale-up.
        assert_eq!(held_by(&p, &input(2, 0.95, 300, 1), None), Constraint::KvCache);
        // The TTFT target over with a queue; the same with nothing queued is prefill.
        assert_eq!(
            held_by(&p, &input(2, 0.3, 1_500, 1), None),
            Constraint::TtftTarget
        );
        assert_eq!(held_by(&p, &input(2, 0.3, 1_500, 0), None), Constraint::Prefill);
        // Over the objective with no target asking for more (the share owns the target): the guard.
        let guard_only = ScalePolicy {
            targets: Targets {
                ttft_p95: None,
                ..p.targets.clone()
            },
            ..policy()
        };
        assert_eq!(
            held_by(&guard_only, &input(2, 0.3, 2_500, 3), None),
            Constraint::TtftObjective
        );
        // At the maximum with the target asking for more.
        assert_eq!(
            held_by(&p, &input(4, 0.3, 1_800, 1), None),
            Constraint::MaxReplicas
        );
        // One replica, every signal low: the minimum holds it.
        assert_eq!(
            held_by(&p, &input(1, 0.05, 200, 0), None),
            Constraint::MinReplicas
        );
        // The same model allowed to go to zero, idle, with a 28 s cold start against the 2 s objective: the warm
        // floor, named as the cold start.
        let zero = ScalePolicy {
            min_replicas: 0,
            scale_to_zero: Some(ScaleToZero::after(Duration::from_secs(60))),
            ..policy()
        };
        assert_eq!(
            held_by(&zero, &input(1, 0.0, 200, 0), Some(Duration::from_secs(28))),
            Constraint::ColdStart
        );
        // With a sleep-mode wake that meets the objective there is no warm floor: one replica until idle.
        assert_eq!(
            held_by(&zero, &input(1, 0.0, 200, 0), Some(Duration::from_secs(1))),
            Constraint::ScaleToZero
        );
        assert_eq!(Constraint::ColdStart.label(), "cold_start");
    }
}
