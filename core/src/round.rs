//! One decision round of one model: everything the controller (and the simulator) observed in, every decision
//! out.
//!
//! The controller and the simulator used to string the same dozen rules together twice, in the same order, kept
//! in step by a parity test. [`round`] is that sequence, written once:
//!
//! 0. the workload class (`class::step`: declared signals, then the traffic; held against flapping) and its
//!    defaults applied to the policy the rest of the round decides with, where the spec left them;
//! 1. the urgency of a growth (`rollout::Urgency::of`: preemptions, a replica over the TTFT objective);
//! 2. the count the rule reads: `/scale`'s less a consolidation surge (`pack::consolidate::count_before_surge`);
//! 3. the decision's input from the sidecars' documents and the activators' demand (`scale::inputs::scale_input`);
//! 4. sleep or zero at rest (`sleep::rule::decide`: sleep mode, the wake measured against the cold start, the
//!    GPU's sleeper room; where the model sleeps, the way back from zero is the wake, and the lead times say so),
//!    then the joint round on the model's history (`scale::joint::round`: the cold-start ledger, the look-ahead's
//!    trend, the warm floor, the budget group's claim) with the share's room and the lead times;
//! 5. the replica decision (`scale::joint::decide`), what held it (`scale::constraint::Constraint::of`) and the
//!    move off a draining GPU (`pack::consolidate::move_step`);
//! 6. at the ceiling, whole GPUs (`scale::isolation::isolation`): a model held at `max_replicas` whose TTFT is over
//!    its objective while it shares GPUs gets GPUs to itself (its shared replicas leave from the next round's
//!    placement on, as from a draining GPU).
//!
//! The caller applies what it can and then records the decision it acted on with [`crate::scale::ScaleState::record`]
//! (the controller does not record a scale it failed to write).
//!
//! Where the two callers differ by design, the difference is a field of [`Observed`], never code: the controller
//! measures a cold start from its pods' timestamps, the simulator knows its scenario's ([`Observed::leads`]); a
//! baseline of the simulator reads its rate from an external metric ([`Observed::external_rate`]).
//!
//! A decision to go to zero is taken on documents that may be a poll interval old. The controller then reads
//! its activators again and asks the same rule once more ([`Round::redecide`]): a request that arrived since keeps
//! the model up.

use std::time::Duration;

use crate::class::{self, ClassRound, ClassSignals};
use crate::pack::consolidate::{self, ModelPlacement, MoveStep};
use crate::rollout::Urgency;
use crate::scale::coldstart::BudgetClaim;
use crate::scale::constraint::Constraint;
use crate::scale::isolation::{self, Isolation, IsolationFacts};
use crate::scale::joint::{self, BudgetPeers, JointPolicy, LeadTimes, ShareRoom};
use crate::scale::{Demand, ScaleDecision, ScaleInput, ScalePolicy, ScaleState, Timestamp, inputs};
use crate::sleep::rule::{self as sleep_rule, Rest, SleepFacts, SleepPolicy};
use crate::wire::sidecar::SidecarStatus;

/// Everything one round observes about one model.
#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    /// The model's name (the budget group reads it).
    pub name: String,
    /// The replica count in force: `/scale`'s `spec.replicas`, or the simulator's live replicas. It includes a
    /// surge the last round asked for ([`Observed::surged`]).
    pub replicas: u32,
    /// The last round asked for one replica over its decision (a move off a draining GPU).
    pub surged: bool,
    /// Each ready replica's sidecar document; `None` when it could not be read (counted as missing, never idle).
    pub sidecars: Vec<Option<SidecarStatus>>,
    /// The model's demand at the activators (`scale::inputs::demand_from`).
    pub demand: Demand,
    /// A request rate from an external metric that replaces the activators' (the simulator's HPA and AIBrix
    /// baselines read a Prometheus-style rate); `None` for Tessera.
    pub external_rate: Option<f64>,
    /// What the model's compute share can do.
    pub room: ShareRoom,
    /// How long new capacity takes: measured from the pods by the controller, the scenario's in the simulator.
    pub leads: LeadTimes,
    /// The claims the other models of its namespace last published (read when the policy is in a budget group).
    pub peers: Vec<BudgetClaim>,
    /// Where the model's pods are relative to a GPU being drained (`desired` is the round's to fill).
    pub placement: ModelPlacement,
    /// Oldest sidecar document still counted as fresh.
    pub max_signal_age: Duration,
    /// What the class rule reads; `None` decides on the policy as written, with no class (the simulator's
    /// baselines, which scale as their products do).
    pub class: Option<ClassSignals>,
    /// Sleep mode: what the spec allows and what the replicas report; `None` where the model has none (it goes to
    /// zero as it always did).
    pub sleep: Option<(SleepPolicy, SleepFacts)>,
    /// Whether its replicas share GPUs and whether the last round isolated it; `None` where Tessera does not place
    /// the model's replicas (the simulator's baselines, which hold whole GPUs as their products do).
    pub isolation: Option<IsolationFacts>,
}

/// Everything one round decides.
#[derive(Debug, Clone, PartialEq)]
pub struct Round {
    /// The replica decision's input.
    pub input: ScaleInput,
    /// What hurries a growth onto the pods (the allocation in force and the roll read it).
    pub urgency: Urgency,
    /// The joint policy decided with (who owns latency, the warm floor, the budget).
    pub joint: JointPolicy,
    /// The replica decision and its reason.
    pub decision: ScaleDecision,
    /// What held the count.
    pub constraint: Constraint,
    /// The move off a draining GPU: the count to apply is `step.replicas(decision.desired_replicas)`.
    pub step: MoveStep,
    /// The placement the move was decided on (its `desired` the decision's).
    pub placement: ModelPlacement,
    /// The workload class and the defaults it supplied; `None` when [`Observed::class`] was.
    pub class: Option<ClassRound>,
    /// The policy the round decided with: the one given, with the class's defaults where the spec left them.
    pub policy: ScalePolicy,
    /// Sleep or zero at rest, and why; `None` where [`Observed::sleep`] was.
    pub rest: Option<Rest>,
    /// A pod is there to sleep: one asleep now, or a running replica that the last to leave will be. Without one
    /// (its sleeper was evicted, say) a model at zero keeps no pod: a sleep needs a pod to sleep.
    pub sleeper_pod: bool,
    /// Whole GPUs or shared, and why; `None` where [`Observed::isolation`] was.
    pub isolation: Option<Isolation>,
}

impl Round {
    /// Whether the model's replicas hold whole GPUs from this round on: new ones are placed alone, and the ones
    /// that share a GPU leave as from a draining GPU.
    pub fn isolated(&self) -> bool {
        matches!(self.isolation, Some(Isolation::Isolate(_)))
    }

    /// The replica count to apply: the decision, one over it during a surge.
    pub fn replicas(&self) -> u32 {
        self.step.replicas(self.decision.desired_replicas)
    }

    /// Whether the model's replicas at zero sleep rather than go: the decision is zero running replicas and the
    /// rest rule chose sleep. The pod stays (the controller keeps `/scale` at one and writes the pod's
    /// `tessera.dev/rest` instruction; the simulator keeps it on its GPU as a sleeper).
    pub fn sleeps(&self) -> bool {
        self.decision.desired_replicas == 0
            && self.sleeper_pod
            && self.rest.as_ref().is_some_and(|r| r.sleep.is_some())
    }

    /// The pods the workload keeps (`/scale`'s count): the running replicas, and at zero the one asleep.
    pub fn pods(&self) -> u32 {
        if self.sleeps() {
            self.replicas().max(1)
        } else {
            self.replicas()
        }
    }

    /// Whether the decision takes the model to zero from a running count: the documents may be a poll interval
    /// old, so the caller should read the activators again and [`Round::redecide`].
    pub fn goes_to_zero(&self) -> bool {
        self.decision.desired_replicas == 0 && self.input.current_replicas > 0
    }

    /// The same rule once more on fresher `demand` (the activators read again right before a scale to zero),
    /// with the round's joint policy: the history is not counted twice.
    pub fn redecide(&mut self, demand: Demand, state: &ScaleState, now: Timestamp) {
        self.input.demand = demand;
        self.decide(state, now);
    }

    fn decide(&mut self, state: &ScaleState, now: Timestamp) {
        self.decision = joint::decide(&self.input, &self.joint, state, now);
        self.constraint = Constraint::of(&self.input, &self.joint, &self.decision);
        self.placement.desired = self.decision.desired_replicas;
        self.step = consolidate::move_step(self.placement);
    }
}

/// One round for the model under `policy`, on its history `state`, at `now`: see the module docs.
pub fn round(policy: &ScalePolicy, observed: &Observed, state: &mut ScaleState, now: Timestamp) -> Round {
    let read: Vec<Option<&SidecarStatus>> = observed.sidecars.iter().map(Option::as_ref).collect();
    let mut effective = policy.clone();
    let class = observed.class.as_ref().map(|signals| {
        class::step::step(
            signals,
            &mut effective,
            &read,
            observed.demand.requests_total,
            &mut state.class,
            &mut state.minutes,
            now,
        )
    });
    let policy = &effective;
    let urgency = Urgency::of(&read, policy.ttft_slo, observed.max_signal_age);
    let current = consolidate::count_before_surge(observed.replicas, observed.surged);
    let mut demand = observed.demand;
    if let Some(rate) = observed.external_rate {
        demand.requests_per_second = Some(rate);
    }
    let input = inputs::scale_input(current, &read, observed.max_signal_age, demand);
    let mut leads = observed.leads;
    // A wake needs a pod to wake: one asleep now, or the one the last running replica will leave.
    let sleeper_pod = current > 0 || observed.sleep.as_ref().is_some_and(|(_, f)| f.asleep);
    let rest = observed.sleep.as_ref().map(|(sleep_policy, facts)| {
        let cold = observed.leads.scale_up.or(observed.leads.from_zero);
        let rest = sleep_rule::decide(sleep_policy, facts, cold, policy.ttft_slo);
        if let Some(cold) = cold {
            leads = LeadTimes::may_sleep(cold, rest.wake, sleeper_pod);
        }
        rest
    });
    let joint = joint::round(
        policy,
        observed.room,
        leads,
        &input,
        state,
        &BudgetPeers {
            name: &observed.name,
            claims: &observed.peers,
        },
        now,
    );
    let decision = joint::decide(&input, &joint, state, now);
    let constraint = Constraint::of(&input, &joint, &decision);
    let placement = ModelPlacement {
        desired: decision.desired_replicas,
        ..observed.placement
    };
    let isolation = observed
        .isolation
        .map(|facts| isolation::isolation(policy, &input, facts, observed.room));
    Round {
        urgency,
        step: consolidate::move_step(placement),
        placement,
        input,
        joint,
        decision,
        constraint,
        class,
        policy: effective,
        rest,
        sleeper_pod,
        isolation,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::scale::{ScaleReason, ScaleToZero};

    fn observed(replicas: u32, demand: Demand) -> Observed {
        Observed {
            name: "m".into(),
            replicas,
            surged: false,
            sidecars: vec![Some(idle_sidecar()); replicas as usize],
            demand,
            external_rate: None,
            room: ShareRoom::Fixed,
            leads: LeadTimes::default(),
            peers: Vec::new(),
            placement: ModelPlacement {
                off_ready: replicas,
                ..ModelPlacement::default()
            },
            max_signal_age: Duration::from_secs(30),
            class: None,
            sleep: None,
            isolation: None,
        }
    }

    /// A fresh replica with nothing running or waiting.
    fn idle_sidecar() -> SidecarStatus {
        serde_json::from_value(serde_json::json!({
            "schema_version": 1, "generated_at": 1000.0, "vllm_url": "http://127.0.0.1:8000", "vllm_up": true,
            "ready": true, "stale": false,
            "scrape": {"interval_secs": 5.0, "successes_total": 3},
            "latest": {"at": 999.0, "kv_cache_usage_ratio": 0.0, "requests_running": 0.0, "requests_waiting": 0.0},
            "recommendation": {"outcome": {"state": "not_yet", "code": "too_few_samples", "reason": "warming up"}}
        }))
        .unwrap()
    }

    fn idle(now: Timestamp) -> Demand {
        Demand {
            requests_per_second: Some(0.0),
            last_request_at: Some(Timestamp::from_millis(now.as_millis() - 3_600_000)),
            requests_total: Some(10),
            ..Demand::default()
        }
    }

    fn to_zero_policy() -> ScalePolicy {
        ScalePolicy {
            min_replicas: 0,
            max_replicas: 4,
            scale_to_zero: Some(ScaleToZero::after(Duration::from_secs(60))),
            ..ScalePolicy::default()
        }
    }

    #[test]
    fn an_idle_model_goes_to_zero_and_a_fresh_request_keeps_it_up() {
        let now = Timestamp::from_millis(10_000_000);
        let policy = to_zero_policy();
        let mut state = ScaleState::default();
        let mut r = round(&policy, &observed(1, idle(now)), &mut state, now);
        assert!(r.goes_to_zero(), "{:?}", r.decision);
        assert_eq!(r.decision.reason, ScaleReason::ScaleToZero);
        assert_eq!(r.replicas(), 0);
        // The activators read again: a request arrived a moment ago.
        let fresh = Demand {
            in_flight: 1,
            last_request_at: Some(now),
            ..idle(now)
        };
        r.redecide(fresh, &state, now);
        assert!(r.decision.desired_replicas >= 1, "{:?}", r.decision);
        assert_eq!(r.replicas(), r.decision.desired_replicas);
    }

    #[test]
    fn a_surge_is_taken_off_the_count_and_a_pod_on_a_draining_gpu_moves() {
        let now = Timestamp::from_millis(10_000_000);
        let policy = ScalePolicy {
            min_replicas: 2,
            max_replicas: 4,
            ..ScalePolicy::default()
        };
        let mut o = observed(3, idle(now));
        o.surged = true;
        // Two ready pods, one of them on the draining GPU, and the surge's copy starting elsewhere.
        o.placement = ModelPlacement {
            desired: 0,
            on_draining: 1,
            off_ready: 1,
            off_starting: 1,
        };
        let r = round(&policy, &o, &mut ScaleState::default(), now);
        assert_eq!(
            r.input.current_replicas, 2,
            "the surge is not a count the rule chose"
        );
        assert_eq!(r.decision.desired_replicas, 2);
        assert_eq!(r.step, MoveStep::Surge);
        assert_eq!(r.replicas(), 3);
    }

    /// At its ceiling, over its objective while its replicas share GPUs: the round isolates the model; once
    /// isolated it stays so at the ceiling; where nothing is placed by Tessera, the rule is not asked.
    #[test]
    fn a_model_over_its_objective_at_the_ceiling_while_sharing_is_isolated() {
        use crate::scale::isolation::IsolationReason;
        let now = Timestamp::from_millis(10_000_000);
        let policy = ScalePolicy {
            min_replicas: 1,
            max_replicas: 2,
            ttft_slo: Some(Duration::from_secs(2)),
            ..ScalePolicy::default()
        };
        let with_p95 = |p95: f64| -> SidecarStatus {
            let mut st = serde_json::to_value(idle_sidecar()).unwrap();
            st["recent"] = serde_json::json!({"window_secs": 30.0, "start": 970.0, "end": 999.0,
                "ttft_seconds": {"p50": p95 / 3.0, "p95": p95, "p99": p95 * 1.2, "count": 40}});
            serde_json::from_value(st).unwrap()
        };
        let slow = with_p95(3.0);
        let mut o = observed(2, idle(now));
        o.sidecars = vec![Some(slow.clone()), Some(slow)];
        assert_eq!(
            round(&policy, &o, &mut ScaleState::default(), now).isolation,
            None
        );
        o.isolation = Some(IsolationFacts {
            shares_gpu: true,
            isolated: false,
        });
        let r = round(&policy, &o, &mut ScaleState::default(), now);
        assert_eq!(
            r.isolation,
            Some(Isolation::Isolate(IsolationReason::CoTenantsAtCeiling))
        );
        assert!(r.isolated());
        // On whole GPUs already and still at the ceiling: held, whatever the latency.
        o.sidecars = vec![Some(idle_sidecar()); 2];
        o.isolation = Some(IsolationFacts {
            shares_gpu: false,
            isolated: true,
        });
        let r = round(&policy, &o, &mut ScaleState::default(), now);
        assert_eq!(r.isolation, Some(Isolation::Isolate(IsolationReason::Held)));
        // Below the ceiling, its latency known: shares again (while it is unknown, it stays isolated).
        let mut below = observed(1, idle(now));
        below.isolation = o.isolation;
        assert!(round(&policy, &below, &mut ScaleState::default(), now).isolated());
        below.sidecars = vec![Some(with_p95(0.5))];
        let r = round(&policy, &below, &mut ScaleState::default(), now);
        assert_eq!(r.isolation, Some(Isolation::Share));
        assert!(!r.isolated());
    }

    #[test]
    fn an_external_rate_replaces_the_activators() {
        let now = Timestamp::from_millis(10_000_000);
        let mut o = observed(1, idle(now));
        o.external_rate = Some(5.0);
        let r = round(&to_zero_policy(), &o, &mut ScaleState::default(), now);
        assert_eq!(r.input.demand.requests_per_second, Some(5.0));
        assert!(!r.goes_to_zero());
    }

    #[test]
    fn the_class_sets_the_policy_the_round_decides_with() {
        use crate::class::{ClassSignals, Declared, WorkloadClass};
        let now = Timestamp::from_millis(10_000_000);
        let policy = to_zero_policy();
        let mut state = ScaleState::default();
        // No class signals: the policy as written, no class.
        let r = round(&policy, &observed(1, idle(now)), &mut state, now);
        assert!(r.class.is_none());
        assert_eq!(r.policy, policy);
        // Auto with nothing observed: real-time, whose defaults are the policy as written.
        let mut o = observed(1, idle(now));
        o.class = Some(ClassSignals::default());
        let r = round(&policy, &o, &mut state, now);
        let c = r.class.as_ref().unwrap();
        assert_eq!(c.held.class, WorkloadClass::Realtime);
        assert_eq!(r.policy, policy);
        // Owned by a Job: batch at once, and its cold-start budget is in the policy the round used.
        o.class = Some(ClassSignals {
            declared: Declared {
                owner_kind: Some("Job".into()),
                ..Declared::default()
            },
            ..ClassSignals::default()
        });
        let later = Timestamp::from_millis(now.as_millis() + 15_000);
        let r = round(&policy, &o, &mut state, later);
        let c = r.class.as_ref().unwrap();
        assert_eq!(c.held.class, WorkloadClass::Batch);
        assert_eq!(c.held.changed_from, Some(WorkloadClass::Realtime));
        assert_eq!(
            r.policy.scale_to_zero.as_ref().unwrap().cold_start_miss_budget,
            Some(0.5)
        );
        assert_eq!(state.class.class, Some(WorkloadClass::Batch));
    }

    /// A model whose cold start misses its objective keeps a warm replica; with sleep mode and a wake that meets
    /// the objective, its last replica sleeps instead, and a request wakes it.
    #[test]
    fn sleep_mode_replaces_the_warm_floor_with_a_sleeping_replica() {
        use crate::sleep::command::SleepLevel;
        use crate::sleep::rule::RestReason;
        let now = Timestamp::from_millis(10_000_000);
        let policy = ScalePolicy {
            ttft_slo: Some(Duration::from_secs(2)),
            ..to_zero_policy()
        };
        let mut o = observed(1, idle(now));
        o.leads = LeadTimes {
            from_zero: Some(Duration::from_secs(60)),
            scale_up: Some(Duration::from_secs(60)),
        };
        let warm = round(&policy, &o, &mut ScaleState::default(), now);
        assert_eq!(
            (warm.decision.desired_replicas, warm.sleeps()),
            (1, false),
            "{:?}",
            warm.decision
        );
        o.sleep = Some((
            SleepPolicy {
                enabled: true,
                ..SleepPolicy::default()
            },
            SleepFacts {
                measured_wake: [Some(Duration::from_millis(800)), None],
                weights_bytes: Some(8 << 30),
                host_free_bytes: Some(64 << 30),
                ..SleepFacts::default()
            },
        ));
        let r = round(&policy, &o, &mut ScaleState::default(), now);
        assert!(r.sleeps(), "{:?} {:?}", r.decision, r.rest);
        let rest = r.rest.as_ref().unwrap();
        assert_eq!(
            (rest.sleep, rest.reason),
            (Some(SleepLevel::One), RestReason::WakeShortensColdStart)
        );
        // Asleep, and a request is held: one replica, woken (the lead is the wake, not the pod's start).
        let mut asleep = o.clone();
        asleep.replicas = 0;
        asleep.sidecars.clear();
        asleep.placement.off_ready = 0;
        if let Some((_, f)) = asleep.sleep.as_mut() {
            f.asleep = true;
        }
        asleep.demand = Demand {
            queued_at_activator: 1,
            last_request_at: Some(now),
            ..idle(now)
        };
        let r = round(&policy, &asleep, &mut ScaleState::default(), now);
        assert_eq!((r.decision.desired_replicas, r.sleeps()), (1, false));
        assert_eq!(r.joint.warm_floor, None);
        // Its sleeper evicted (none asleep, none running): no pod to sleep, so the way back is a cold start and the
        // warm floor asks for a replica, as the simulator starts one after losing a sleeper.
        let mut lost = asleep.clone();
        lost.demand = idle(now);
        if let Some((_, f)) = lost.sleep.as_mut() {
            f.asleep = false;
        }
        let r = round(&policy, &lost, &mut ScaleState::default(), now);
        assert!(!r.sleeper_pod && !r.sleeps());
        assert_eq!((r.decision.desired_replicas, r.pods()), (1, 1));
        assert!(r.joint.warm_floor.is_some());
    }
}
