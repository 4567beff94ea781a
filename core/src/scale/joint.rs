//! The joint policy: replicas and compute share decided as one, so two loops never chase the same latency.
//!
//! A fractional replica's latency can be bought two ways: a bigger compute share (the share rule,
//! [`crate::recommend::recommend_compute`], which sizes the share so the TTFT and inter-token p95 sit at their
//! target) or another replica ([`super::decide`]). When both chase the same TTFT target, every excursion while
//! the share is still settling adds a replica, and a model ends up with three replicas at 0.4 of a GPU where one
//! at 0.8 would do — paying its weights' memory three times (measured: the default scenario's chat models at
//! 3.2 replicas each, `docs/simulator-experiments.md`).
//!
//! The rule, applied to the replica policy before [`super::decide`]:
//! - **While the share can still grow** (fractional sharing, the share managed by Tessera, below the whole GPU),
//!   the next unit of latency capacity is a bigger share: it costs the share's increase in GPU compute, where
//!   another replica costs its whole share *and* its weights and KV cache in GPU memory. So the latency *target*
//!   (`targets.ttftP95`) belongs to the share rule, and the replica count answers load — KV cache, queue, request
//!   rate — and the **SLO guard**: a p95 over the objective on any replica still adds a replica at once, because
//!   a bigger share reaches only pods started after it (a roll or a scale), which is too slow for an SLO breach.
//! - **At the whole GPU**, or when the share is fixed by the policy or unknown, a bigger share is not available:
//!   latency targets stay with the replica count, as in HPA.
//! - **Cold starts are part of the cost.** A model allowed to scale to zero whose cold start (pod start and
//!   weights load, or a sleep-mode wake) takes longer than its TTFT objective cannot meet the objective for the
//!   request that wakes it, nor for any that arrive during the start. Such a model keeps a **warm floor** of one
//!   replica instead of going to zero ([`WarmFloor`]); the decision's message and the simulator's report name the
//!   models that pay for one and why. A lead time that is not known (nothing measured yet) leaves the policy as
//!   declared. A policy may instead name a **budget** of requests allowed to miss through a cold start
//!   (`scaleToZero.coldStartMissBudget`): when the model's own traffic over the last day shows that going to zero
//!   would have missed no more than that ([`super::coldstart`]), it goes to zero after all
//!   ([`JointPolicy::zero_within_budget`]). A warm floor costs a model that is idle for hours a GPU's worth of
//!   memory all day; a few cold starts a day cost a few requests.
//! - **So is a scale-up's lead time.** A replica asked for now serves a cold start later: the SLO guard looks that
//!   far ahead ([`ScalePolicy::ttft_guard_lead`], [`super::lookahead`]) and adds a replica while a busy model's p95
//!   is still under the objective but rising to pass it within that time.
//!
//! The caller reports the [`JointPolicy`] with the decision ([`decide`]), so the status and the simulator's
//! report say which constraint decided and what the next unit of capacity costs.

use std::fmt;
use std::time::Duration;

use super::coldstart::{BudgetClaim, ColdStartEvidence, GroupSpend, group};
use super::{ScaleDecision, ScaleInput, ScalePolicy, ScaleState, Timestamp};

/// A share within this of the whole GPU counts as the whole GPU (shares are recommended in hundredths).
const WHOLE: f64 = 0.99;

/// What the model's compute share can do.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ShareRoom {
    /// Whole GPUs, or a share fixed by the policy: it never grows.
    Fixed,
    /// Not known yet (no allocation in force): treated as fixed, so missing data never drops a target.
    Unknown,
    /// Managed by Tessera: the share new replicas get, and the GPU memory one replica holds (weights, KV cache
    /// and overhead) as a fraction of its GPU, when the GPU's size is known.
    Auto {
        /// The compute share in force, 0–1.
        share: f64,
        /// One replica's memory as a fraction of its GPU's.
        memory_fraction: Option<f64>,
    },
}

impl ShareRoom {
    /// Whether the share can still grow: Tessera sizes it and it is below the whole GPU.
    pub fn can_grow(&self) -> bool {
        matches!(*self, ShareRoom::Auto { share, .. } if share.is_finite() && share > 0.0 && share < WHOLE)
    }

    /// What a model's share can do: it can grow only when the model shares GPUs (`fractional`) with a share
    /// Tessera manages (`auto`, not fixed by the policy); then it is the share in force (`in_force`: the compute
    /// share and the GPU memory, MiB, new replicas get), unknown while nothing is in force. `gpu_memory_bytes`
    /// prices another replica's memory when the GPU's size is known.
    pub fn of(
        fractional: bool,
        auto: bool,
        in_force: Option<(f64, u64)>,
        gpu_memory_bytes: Option<u64>,
    ) -> ShareRoom {
        if !fractional || !auto {
            return ShareRoom::Fixed;
        }
        match in_force {
            None => ShareRoom::Unknown,
            Some((share, memory_mib)) => ShareRoom::Auto {
                share,
                memory_fraction: gpu_memory_bytes
                    .filter(|b| *b > 0)
                    .map(|b| memory_mib as f64 * 1_048_576.0 / b as f64),
            },
        }
    }
}

/// Who answers a latency target this round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatencyOwner {
    /// The share rule: a bigger share is the cheaper next unit.
    Share,
    /// The replica count (the share cannot grow).
    Replicas,
}

/// The replica policy to decide with, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct JointPolicy {
    /// `policy` with the latency target removed when the share rule owns it.
    pub policy: ScalePolicy,
    /// Who answers the latency target.
    pub latency: LatencyOwner,
    /// What the next unit of latency capacity costs, in GPUs: a bigger share while the share can grow, another
    /// replica once a managed share is the whole GPU (`bigger_share` 0); none when the share is fixed or unknown.
    pub next_unit: Option<NextUnit>,
    /// Set when the model keeps one warm replica instead of going to zero.
    pub warm_floor: Option<WarmFloor>,
    /// Set when the model's cold start is longer than its objective but it may go to zero anyway: what its
    /// traffic shows scaling to zero costs, within the policy's `coldStartMissBudget`.
    pub zero_within_budget: Option<(ColdStartEvidence, f64)>,
    /// For a policy in a `coldStartBudgetGroup`: how the group's allowance was spent, whichever way it went.
    pub budget_group: Option<GroupSpend>,
    /// For a policy in a `coldStartBudgetGroup`: what this round publishes for the group's other members; the
    /// caller keeps it in the model's [`ScaleState::claim`].
    pub claim: Option<BudgetClaim>,
}

/// The model's name and what the other models of its namespace last published ([`ScaleState::claim`]), read by a
/// policy in a `coldStartBudgetGroup` ([`group`]). Claims of other groups are ignored, so a caller may pass the
/// namespace's.
#[derive(Debug, Clone, Copy)]
pub struct BudgetPeers<'a> {
    /// This model's name.
    pub name: &'a str,
    /// The other models' claims.
    pub claims: &'a [BudgetClaim],
}

impl BudgetPeers<'static> {
    /// No group to read (a model deciding alone).
    pub const NONE: BudgetPeers<'static> = BudgetPeers {
        name: "",
        claims: &[],
    };
}

/// How long new capacity takes to serve, as the caller knows it this round.
///
/// Two leads, because they differ where a model at zero keeps a sleeping pod: waking it (vLLM's sleep mode) takes
/// a second, while another replica beside a running one is a new pod, its start and its weights' load. The warm
/// floor and the miss budget read the start from zero; the SLO guard's look-ahead ([`super::lookahead`]) reads
/// the start of another replica.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeadTimes {
    /// A start from zero: the controller's fastest ready pod from creation to Ready, a sleep-mode wake where the
    /// caller knows one. `None` when not measured this round ([`round`] then reads the last one measured).
    pub from_zero: Option<Duration>,
    /// Another replica, when the caller knows it differs from `from_zero`. `None`: the same as a start from zero
    /// (the controller's case: it starts every replica as a pod).
    pub scale_up: Option<Duration>,
}

impl LeadTimes {
    /// One lead for both: every replica, the first included, starts as a pod.
    pub const fn one(lead: Option<Duration>) -> Self {
        LeadTimes {
            from_zero: lead,
            scale_up: None,
        }
    }

    /// The leads of a model that may sleep at zero (vLLM's sleep mode): a start from zero is the `wake` only while
    /// there is a sleeping pod to wake — one asleep now, or the one its last running replica will leave
    /// (`sleeping_pod`); a model whose sleeping pod is gone (its GPU given back) starts a `new_pod`, as does every
    /// other replica. Without a `wake`, both leads are the new pod's.
    pub fn may_sleep(new_pod: Duration, wake: Option<Duration>, sleeping_pod: bool) -> Self {
        LeadTimes {
            from_zero: Some(wake.filter(|_| sleeping_pod).unwrap_or(new_pod)),
            scale_up: Some(new_pod),
        }
    }

    /// The lead of another replica: its own when known, else a start from zero's.
    fn another_replica(self) -> Option<Duration> {
        self.scale_up.or(self.from_zero)
    }
}

/// Why a model keeps a warm replica: its cold start is longer than its TTFT objective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WarmFloor {
    /// How long a start from zero takes (pod start and load, or a sleep-mode wake).
    pub cold_start: Duration,
    /// The TTFT objective it would miss.
    pub ttft_slo: Duration,
}

/// The cost of the next unit of capacity, in fractions of a GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NextUnit {
    /// Growing the share by the share rule's largest step: compute only.
    pub bigger_share: f64,
    /// Another replica: its share of compute, and its memory.
    pub another_replica_compute: f64,
    /// Another replica's memory, as a fraction of a GPU (when the GPU's size is known).
    pub another_replica_memory: Option<f64>,
}

impl NextUnit {
    /// " and 0.25 of memory", or " and its memory" when the GPU's size is unknown.
    fn write_memory(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.another_replica_memory {
            Some(m) => write!(f, " and {m:.2} of memory"),
            None => f.write_str(" and its memory"),
        }
    }
}

impl fmt::Display for NextUnit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let replica = |f: &mut fmt::Formatter<'_>| -> fmt::Result {
            write!(
                f,
                "another replica: {:.2} GPU of compute",
                self.another_replica_compute
            )?;
            self.write_memory(f)
        };
        if self.bigger_share > 0.0 {
            write!(f, "a bigger share: {:.2} GPU of compute (", self.bigger_share)?;
            replica(f)?;
            f.write_str(")")
        } else {
            replica(f)
        }
    }
}

impl fmt::Display for JointPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(w) = self.warm_floor {
            write!(
                f,
                "keeps one warm replica: a cold start takes {:.0} s, over the {:.0} s TTFT objective; ",
                w.cold_start.as_secs_f64(),
                w.ttft_slo.as_secs_f64()
            )?;
        }
        if let Some((e, budget)) = self.zero_within_budget {
            write!(
                f,
                "may go to zero though a cold start is over the TTFT objective: over the last {:.1} h, {} cold \
                 start(s) would have missed {} of ",
                e.observed.as_secs_f64() / 3600.0,
                e.cold_starts,
                e.misses,
            )?;
            match &self.budget_group {
                Some(g) => write!(f, "its {} requests, and its {g}; ", e.requests)?,
                None => write!(
                    f,
                    "{} requests ({:.2}%, within the {:.2}% budget); ",
                    e.requests,
                    100.0 * e.miss_share(),
                    100.0 * budget
                )?,
            }
        } else if let (Some(g), Some(_)) = (&self.budget_group, self.warm_floor) {
            write!(f, "its {g}; ")?;
        }
        match (self.latency, self.next_unit) {
            (LatencyOwner::Share, Some(n)) => {
                write!(
                    f,
                    "latency target left to the share rule: a bigger share costs {:.2} GPU of compute, another \
                     replica {:.2} of compute",
                    n.bigger_share, n.another_replica_compute
                )?;
                n.write_memory(f)
            }
            (LatencyOwner::Replicas, Some(n)) => {
                write!(
                    f,
                    "latency target on the replica count (the share is the whole GPU): another replica costs \
                     {:.2} GPU of compute",
                    n.another_replica_compute
                )?;
                n.write_memory(f)
            }
            _ => f.write_str("latency target on the replica count (the share cannot grow)"),
        }
    }
}

/// The replica policy under the joint rule. `share_step` is the share rule's largest step up (its
/// `compute_max_step_up`, e.g. 2×); `leads` how long a start from zero and another replica take, when known. Only
/// `targets.ttft_p95` and, for a warm floor, scale to zero move; the SLO guard, load targets, bounds and
/// behaviour are untouched. `state` carries the model's [`super::coldstart::ColdStartLedger`], which a
/// `coldStartMissBudget` reads at `now`; a `coldStartBudgetGroup` also reads its `peers`' claims.
pub fn replica_policy(
    policy: &ScalePolicy,
    room: ShareRoom,
    share_step: f64,
    leads: LeadTimes,
    state: &ScaleState,
    peers: &BudgetPeers<'_>,
    now: Timestamp,
) -> JointPolicy {
    let mut joint = share_policy(policy, room, share_step);
    // A replica asked for now serves only once it has started: the SLO guard looks that far ahead
    // (`super::lookahead`).
    joint.policy.ttft_guard_lead = leads.another_replica();
    let cold_start = leads.from_zero;
    // What the ledger shows, read once: for the budget below and for the claim a group's members read.
    let evidence = ledger_evidence(policy, state, cold_start, now);
    joint.claim = claim(policy, cold_start, evidence, peers.name, now);
    if let (Some(zero), Some(lead), Some(slo)) = (&policy.scale_to_zero, cold_start, policy.ttft_slo)
        && policy.min_replicas == 0
        && lead > slo
    {
        if let Some(budget) = zero.cold_start_miss_budget
            && let Some(e) = evidence
        {
            // In a group the group's allotment decides; alone, the model's own share of misses.
            let within = match &joint.claim {
                Some(own) => {
                    let spend = group::share(own, peers.claims, now);
                    let allotted = spend.allotted;
                    joint.budget_group = Some(spend);
                    allotted
                }
                None => e.miss_share() <= budget,
            };
            if within {
                let budget = joint.budget_group.as_ref().map_or(budget, |g| g.budget);
                joint.zero_within_budget = Some((e, budget));
                return joint;
            }
        }
        joint.policy.scale_to_zero = None;
        joint.policy.min_replicas = 1;
        joint.warm_floor = Some(WarmFloor {
            cold_start: lead,
            ttft_slo: slo,
        });
    }
    joint
}

/// What the model's ledger shows for a start from zero of `cold_start`: only for a policy that keeps one and may
/// go to zero, once the cold start is known.
fn ledger_evidence(
    policy: &ScalePolicy,
    state: &ScaleState,
    cold_start: Option<Duration>,
    now: Timestamp,
) -> Option<ColdStartEvidence> {
    cold_start
        .filter(|_| policy.keeps_cold_start_ledger())
        .and_then(|lead| state.cold_starts.evidence(lead, now))
}

/// The claim a group member `name` stands by at `now` without deciding: what its round would publish on `state`
/// with the cold start it last measured. For a caller that must read a member before the member's own round has
/// run: a restarted controller reads such a member from the copy of its ledger (`ScaleState::resume`), so that the
/// first member to decide does not read its group without the others. `None` outside a group.
pub fn standing_claim(
    policy: &ScalePolicy,
    state: &ScaleState,
    name: &str,
    now: Timestamp,
) -> Option<BudgetClaim> {
    let cold_start = state.last_cold_start;
    let evidence = ledger_evidence(policy, state, cold_start, now);
    claim(policy, cold_start, evidence, name, now)
}

/// What a model in a `coldStartBudgetGroup` publishes for the group's other members this round: its `evidence`
/// (when its cold start is known) and whether that cold start is over its objective. `None` outside a group.
fn claim(
    policy: &ScalePolicy,
    cold_start: Option<Duration>,
    evidence: Option<ColdStartEvidence>,
    name: &str,
    now: Timestamp,
) -> Option<BudgetClaim> {
    let zero = policy.scale_to_zero.as_ref()?;
    let group = zero.cold_start_budget_group.clone()?;
    let budget = zero.cold_start_miss_budget?;
    Some(BudgetClaim {
        member: name.to_owned(),
        group,
        budget,
        at: now,
        evidence,
        over_objective: policy.min_replicas == 0
            && cold_start
                .zip(policy.ttft_slo)
                .is_some_and(|(lead, slo)| lead > slo),
    })
}

/// One round of the replica policy as the controller and the simulator take it, on the model's `state`: counts
/// the round's demand into its cold-start ledger ([`ScaleState::count_demand`]) and its worst TTFT at the SLO
/// guard's percentile into the
/// trend the SLO guard's look-ahead reads ([`ScaleState::ttft_seen`]), resolves its start from zero (the one
/// measured this round, else the last, [`ScaleState::cold_start`]), decides the joint policy with the share
/// rule's default step ([`replica_policy`]) and keeps the claim the round publishes for the model's budget group
/// ([`ScaleState::claim`]). The cold start it used stays in [`ScaleState::last_cold_start`].
pub fn round(
    policy: &ScalePolicy,
    room: ShareRoom,
    leads: LeadTimes,
    input: &ScaleInput,
    state: &mut ScaleState,
    peers: &BudgetPeers<'_>,
    now: Timestamp,
) -> JointPolicy {
    state.count_demand(policy, &input.demand, now);
    super::lookahead::note(
        &mut state.ttft_seen,
        super::lookahead::trend_sample(input, policy.guard_percentile(input)),
        now,
    );
    let leads = LeadTimes {
        from_zero: state.cold_start(leads.from_zero),
        ..leads
    };
    let joint = replica_policy(
        policy,
        room,
        crate::recommend::Config::default().compute_max_step_up,
        leads,
        state,
        peers,
        now,
    );
    state.claim = joint.claim.clone();
    joint
}

fn share_policy(policy: &ScalePolicy, room: ShareRoom, share_step: f64) -> JointPolicy {
    match room {
        ShareRoom::Auto {
            share,
            memory_fraction,
        } if room.can_grow() => {
            let grown = (share * share_step.max(1.0)).min(1.0);
            let mut p = policy.clone();
            p.targets.ttft_p95 = None;
            JointPolicy {
                policy: p,
                latency: LatencyOwner::Share,
                warm_floor: None,
                zero_within_budget: None,
                budget_group: None,
                claim: None,
                next_unit: Some(NextUnit {
                    bigger_share: grown - share,
                    another_replica_compute: share,
                    another_replica_memory: replica_memory(memory_fraction),
                }),
            }
        }
        // At the whole GPU the next unit is another replica; its price is known when Tessera manages the share.
        ShareRoom::Auto {
            share,
            memory_fraction,
        } if share.is_finite() && share >= WHOLE => JointPolicy {
            policy: policy.clone(),
            latency: LatencyOwner::Replicas,
            next_unit: Some(NextUnit {
                bigger_share: 0.0,
                another_replica_compute: share.min(1.0),
                another_replica_memory: replica_memory(memory_fraction),
            }),
            warm_floor: None,
            zero_within_budget: None,
            budget_group: None,
            claim: None,
        },
        _ => JointPolicy {
            policy: policy.clone(),
            latency: LatencyOwner::Replicas,
            next_unit: None,
            warm_floor: None,
            zero_within_budget: None,
            budget_group: None,
            claim: None,
        },
    }
}

/// Another replica's memory as a fraction of its GPU, when known and sane.
fn replica_memory(memory_fraction: Option<f64>) -> Option<f64> {
    memory_fraction
        .filter(|m| m.is_finite())
        .map(|m| m.clamp(0.0, 1.0))
}

/// [`super::decide`] under the joint policy; when the share rule owns the latency target, the decision's message
/// says so and what the next unit of capacity costs; when the TTFT target asks for replicas while nothing
/// queues ([`latency_without_queue`]), it says that the time is in prefill.
pub fn decide(input: &ScaleInput, joint: &JointPolicy, state: &ScaleState, now: Timestamp) -> ScaleDecision {
    let mut d = super::decide(input, &joint.policy, state, now);
    if joint.latency == LatencyOwner::Share
        || joint.warm_floor.is_some()
        || joint.zero_within_budget.is_some()
        || joint.next_unit.is_some()
    {
        d.message = format!("{}; {joint}", d.message);
    }
    if let Some(held) = d.prefill_held {
        d.message = format!("{}; {held}", d.message);
    } else if latency_without_queue(input, &d) {
        d.message = format!(
            "{}; no request is waiting on any replica or at the activator: the time is in prefill (long prompts, or \
             SMs shared with busy co-tenants), which another replica shortens only by splitting bursts",
            d.message
        );
    }
    d
}

/// Whether the TTFT target led a recommendation above the current count while no request waited: every fresh
/// replica reported an empty queue and the activator held nothing. Then the latency is prefill, not queueing: a
/// replica adds its weights' memory and takes only the bursts it splits off (measured on the default scenario,
/// docs/simulator-experiments.md, "Why the chat models sit at four replicas"). The decision is not changed — the target is
/// the headroom the SLO guard needs — but the status and the simulator's report say which constraint bound it.
/// Missing queue data (no fresh replica, or one without a queue reading) never counts as "nothing waits".
pub fn latency_without_queue(input: &ScaleInput, d: &ScaleDecision) -> bool {
    let mut fresh = input.replicas.iter().filter(|r| r.fresh).peekable();
    d.leading_signal == Some(super::Signal::TtftP95)
        && d.recommendation > d.current_replicas
        && input.demand.queued_at_activator == 0
        && fresh.peek().is_some()
        && fresh.all(|r| r.waiting == Some(0))
}

#[cfg(test)]
pub(super) mod tests {
    use std::time::Duration;

    use super::*;
    use crate::scale::Targets;

    /// A chat model's policy: KV cache at 70%, TTFT p95 target 1 s, SLO 2 s (also `constraint`'s tests).
    pub(in crate::scale) fn policy() -> ScalePolicy {
        ScalePolicy {
            targets: Targets {
                kv_cache_utilization: Some(0.7),
                ttft_p95: Some(Duration::from_secs(1)),
                ..Targets::default()
            },
            ttft_slo: Some(Duration::from_secs(2)),
            ..ScalePolicy::default()
        }
    }

    #[test]
    fn a_share_that_can_grow_takes_the_latency_target_and_the_guard_stays() {
        let j = alone(
            &policy(),
            ShareRoom::Auto {
                share: 0.4,
                memory_fraction: Some(0.25),
            },
            1.5,
            None,
        );
        assert_eq!(j.latency, LatencyOwner::Share);
        assert_eq!(j.policy.targets.ttft_p95, None);
        assert_eq!(
            j.policy.targets.kv_cache_utilization,
            Some(0.7),
            "load targets stay"
        );
        assert_eq!(
            j.policy.ttft_slo,
            Some(Duration::from_secs(2)),
            "the SLO guard stays"
        );
        let n = j.next_unit.unwrap_or_else(|| panic!("a cost"));
        assert!((n.bigger_share - 0.2).abs() < 1e-9, "{n:?}");
        assert!(n.bigger_share < n.another_replica_compute + n.another_replica_memory.unwrap_or(0.0));
        assert!(j.to_string().contains("a bigger share costs 0.20 GPU"), "{j}");
        assert_eq!(
            n.to_string(),
            "a bigger share: 0.20 GPU of compute (another replica: 0.40 GPU of compute and 0.25 of memory)"
        );
    }

    #[test]
    fn whole_fixed_or_unknown_shares_leave_latency_to_the_replicas() {
        // A managed share at the whole GPU prices the next unit: another replica.
        let whole = alone(
            &policy(),
            ShareRoom::Auto {
                share: 1.0,
                memory_fraction: Some(0.46),
            },
            1.5,
            None,
        );
        assert_eq!(whole.latency, LatencyOwner::Replicas);
        assert_eq!(whole.policy, policy());
        assert!(
            whole
                .to_string()
                .ends_with("another replica costs 1.00 GPU of compute and 0.46 of memory"),
            "{whole}"
        );
        for room in [
            ShareRoom::Fixed,
            ShareRoom::Unknown,
            ShareRoom::Auto {
                share: 1.0,
                memory_fraction: None,
            },
            ShareRoom::Auto {
                share: f64::NAN,
                memory_fraction: None,
            },
        ] {
            let j = alone(&policy(), room, 1.5, None);
            assert_eq!(j.latency, LatencyOwner::Replicas, "{room:?}");
            assert_eq!(j.policy, policy(), "{room:?}");
        }
    }

    /// The joint policy of a model deciding alone, with no history (no ledger, no group).
    pub(in crate::scale) fn alone(
        policy: &ScalePolicy,
        room: ShareRoom,
        share_step: f64,
        cold_start: Option<Duration>,
    ) -> JointPolicy {
        replica_policy(
            policy,
            room,
            share_step,
            LeadTimes::one(cold_start),
            &ScaleState::default(),
            &BudgetPeers::NONE,
            Timestamp::default(),
        )
    }

    fn budgeted(budget: f64, group: Option<&str>) -> ScalePolicy {
        ScalePolicy {
            min_replicas: 0,
            scale_to_zero: Some(crate::scale::ScaleToZero {
                idle_after: Duration::from_secs(300),
                cold_start_miss_budget: Some(budget),
                cold_start_budget_group: group.map(str::to_owned),
            }),
            ttft_slo: Some(Duration::from_secs(10)),
            ..policy()
        }
    }

    /// Two hours at 15 s syncs: 1 request/s with one 20-minute pause, so one would-be cold start missing the
    /// waking sync's 15 requests and the next sync's 15 (the start runs 18 s past the objective): 30 of 6,000
    /// requests (0.5%). Returns the state and the time after the two hours.
    fn woken_once() -> (ScaleState, Timestamp) {
        let mut state = ScaleState::default();
        let (mut last, mut total) = (0, 0);
        let at = |t: u64| Timestamp::from_millis(t * 1000);
        for t in (0..=7200u64).step_by(15) {
            if t > 0 && !(3000..4200).contains(&t) {
                last = t;
                total += 15;
            }
            let demand = crate::scale::Demand {
                requests_total: Some(total),
                last_request_at: Some(at(last)),
                ..Default::default()
            };
            state
                .cold_starts
                .observe(&demand, Duration::from_secs(300), at(t));
        }
        (state, at(7200))
    }

    /// With a `coldStartMissBudget`, the floor goes only once an hour or more of evidence shows the model's
    /// would-be cold starts missing no more than the budget; a model whose idle spells would cost more keeps it.
    #[test]
    fn a_miss_budget_lets_a_rarely_woken_model_go_to_zero() {
        let with_budget = |budget| budgeted(budget, None);
        let (state, now) = woken_once();
        // A 28 s start against the 10 s objective, deciding alone on `state`'s ledger.
        let decide = |budget, state: &ScaleState| {
            replica_policy(
                &with_budget(budget),
                ShareRoom::Fixed,
                2.0,
                LeadTimes::one(Some(Duration::from_secs(28))),
                state,
                &BudgetPeers::NONE,
                now,
            )
        };
        let within = decide(0.01, &state);
        assert_eq!(within.warm_floor, None);
        assert_eq!(
            within.policy,
            ScalePolicy {
                ttft_guard_lead: Some(Duration::from_secs(28)),
                ..with_budget(0.01)
            },
            "scale to zero stays as declared (the SLO guard looks a cold start ahead)"
        );
        let Some((e, _)) = within.zero_within_budget else {
            panic!("no budget evidence: {within}")
        };
        assert_eq!(e.cold_starts, 1);
        assert!(
            within.to_string().contains(
                "1 cold start(s) would have missed 30 of 6000 requests (0.50%, within the 1.00% budget)"
            ),
            "{within}"
        );
        // A budget of 0.4% is less than that: the floor stays.
        let over = decide(0.004, &state);
        assert!(over.warm_floor.is_some() && over.zero_within_budget.is_none());
        assert_eq!(over.policy.min_replicas, 1);
        // No history (a controller that just started): the floor stays whatever the budget.
        let fresh = decide(0.5, &ScaleState::default());
        assert!(fresh.warm_floor.is_some());
    }

    /// In a budget group the group's allowance decides: 0.4% of the model's own 6,000 requests (24) cannot pay
    /// for its 30 misses, but 0.4% of the group's 16,000 (64) can; the claims of another group, or stale ones,
    /// add nothing; and the model publishes its own claim for the others.
    #[test]
    fn a_budget_group_spends_its_members_combined_allowance() {
        let s = Duration::from_secs;
        let (state, now) = woken_once();
        let busy = BudgetClaim {
            member: "busy-chat".to_owned(),
            group: "tools".to_owned(),
            budget: 0.004,
            at: now,
            evidence: Some(ColdStartEvidence {
                requests: 10_000,
                cold_starts: 0,
                misses: 0,
                observed: s(7200),
                at_zero: Duration::ZERO,
            }),
            over_objective: false,
        };
        let room = ShareRoom::Auto {
            share: 0.5,
            memory_fraction: Some(0.25),
        };
        let decide = |claims: &[BudgetClaim]| {
            replica_policy(
                &budgeted(0.004, Some("tools")),
                room,
                2.0,
                LeadTimes::one(Some(s(28))),
                &state,
                &BudgetPeers {
                    name: "digest",
                    claims,
                },
                now,
            )
        };
        let j = decide(std::slice::from_ref(&busy));
        assert!(j.warm_floor.is_none() && j.zero_within_budget.is_some(), "{j}");
        let g = j.budget_group.clone();
        assert_eq!(
            g.map(|g| (g.requests, g.allowance, g.spent)),
            Some((16_000, 64, 30)),
            "{j}"
        );
        assert!(
            j.to_string().contains(
                "budget group 'tools' (2 model(s), 16000 requests over their last day) may miss 64"
            ),
            "{j}"
        );
        let own = j.claim.clone();
        assert_eq!(
            own.clone()
                .map(|c| (c.member, c.over_objective, c.evidence.map(|e| e.misses))),
            Some(("digest".to_owned(), true, Some(30)))
        );
        // What a caller reads for the model before its own round (a restarted controller): the same claim, on
        // the cold start the state last measured.
        let measured = ScaleState {
            last_cold_start: Some(s(28)),
            ..state.clone()
        };
        assert_eq!(
            standing_claim(&budgeted(0.004, Some("tools")), &measured, "digest", now),
            own
        );
        assert_eq!(
            standing_claim(&budgeted(0.004, None), &measured, "digest", now),
            None
        );
        // Another group's claim, or a stale one, adds nothing: the floor stays, and the status says why.
        let elsewhere = BudgetClaim {
            group: "other-team".to_owned(),
            ..busy.clone()
        };
        let stale = BudgetClaim {
            at: now.minus(group::CLAIM_MAX_AGE + s(1)),
            ..busy
        };
        for claims in [vec![elsewhere], vec![stale], vec![]] {
            let j = decide(&claims);
            assert!(j.warm_floor.is_some() && j.zero_within_budget.is_none(), "{j}");
            assert!(
                j.to_string().contains("this model's 30 do not fit what is left"),
                "{j}"
            );
        }
        // Outside a group nothing is claimed.
        let alone = replica_policy(
            &budgeted(0.004, None),
            room,
            2.0,
            LeadTimes::one(Some(s(28))),
            &state,
            &BudgetPeers::NONE,
            now,
        );
        assert_eq!(alone.claim, None);
    }

    /// The test policy going to zero after 5 idle minutes, with no floor.
    fn to_zero() -> ScalePolicy {
        ScalePolicy {
            min_replicas: 0,
            scale_to_zero: Some(crate::scale::ScaleToZero::after(Duration::from_secs(300))),
            ..policy()
        }
    }

    #[test]
    fn a_cold_start_longer_than_the_objective_keeps_a_warm_replica() {
        let zero = to_zero();
        let s = Duration::from_secs;
        // 28 s to start against a 2 s objective: a floor of one, no scale to zero.
        let j = alone(&zero, ShareRoom::Fixed, 2.0, Some(s(28)));
        assert_eq!(
            (j.policy.min_replicas, j.policy.scale_to_zero.is_some()),
            (1, false)
        );
        assert_eq!(
            j.warm_floor,
            Some(WarmFloor {
                cold_start: s(28),
                ttft_slo: s(2)
            })
        );
        assert!(
            j.to_string()
                .starts_with("keeps one warm replica: a cold start takes 28 s"),
            "{j}"
        );
        // A one-second sleep-mode wake meets it; an unknown lead time changes nothing; nor does a model that
        // never goes to zero. Only the SLO guard's look-ahead takes the lead time.
        for (p, lead) in [(&zero, Some(s(1))), (&zero, None), (&policy(), Some(s(28)))] {
            let j = alone(p, ShareRoom::Fixed, 2.0, lead);
            assert_eq!(j.warm_floor, None);
            assert_eq!(
                j.policy,
                ScalePolicy {
                    ttft_guard_lead: lead,
                    ..p.clone()
                }
            );
        }
    }

    /// A start from zero is a wake only while a sleeping pod is there to wake; another replica is always a pod.
    #[test]
    fn a_start_from_zero_is_a_wake_only_with_a_sleeping_pod_to_wake() {
        let (pod, wake) = (Duration::from_secs(28), Duration::from_secs(1));
        let leads = |w, asleep| LeadTimes::may_sleep(pod, w, asleep);
        assert_eq!(leads(Some(wake), true).from_zero, Some(wake));
        assert_eq!(leads(Some(wake), false).from_zero, Some(pod));
        assert_eq!(leads(None, true).from_zero, Some(pod));
        assert_eq!(leads(Some(wake), true).another_replica(), Some(pod));
    }

    /// A sleep-mode model wakes from zero in a second, but another replica beside a running one is a new pod: the
    /// warm floor reads the wake, the SLO guard looks ahead by the pod.
    #[test]
    fn the_look_ahead_reads_another_replicas_start_and_the_floor_the_wake() {
        let zero = to_zero();
        let s = Duration::from_secs;
        let decide = |leads| {
            replica_policy(
                &zero,
                ShareRoom::Fixed,
                2.0,
                leads,
                &ScaleState::default(),
                &BudgetPeers::NONE,
                Timestamp::default(),
            )
        };
        let sleeping = decide(LeadTimes {
            from_zero: Some(s(1)),
            scale_up: Some(s(34)),
        });
        assert_eq!((sleeping.warm_floor, sleeping.policy.min_replicas), (None, 0));
        assert_eq!(sleeping.policy.ttft_guard_lead, Some(s(34)));
        // Without a sleeping pod both are the pod's start: the floor holds, and the look-ahead reads the same lead.
        let pod = decide(LeadTimes::one(Some(s(34))));
        assert_eq!(pod.warm_floor.map(|w| w.cold_start), Some(s(34)));
        assert_eq!(pod.policy.ttft_guard_lead, Some(s(34)));
    }

    /// The default scenario's assistant-14b at minute 28: four replicas, nothing waiting, the model's TTFT p95
    /// at 2 s against a 1 s target. The decision still asks for more (the target is the guard's headroom), and its
    /// message says the time is prefill. One request waiting anywhere, or a replica without a queue reading, and
    /// it says nothing of the kind.
    #[test]
    fn a_ttft_target_over_with_nothing_queued_is_named_prefill() {
        use crate::scale::{ReplicaSignals, ScaleInput, ScaleState, Timestamp};
        let replica = |waiting| ReplicaSignals {
            kv_cache_usage: Some(0.05),
            waiting,
            running: Some(3),
            ttft_p95: Some(Duration::from_millis(2_000)),
            ttft_p99: None,
            queue_p95: None,
            fresh: true,
        };
        let input = |waiting: Vec<Option<u32>>, held| {
            let mut i = ScaleInput {
                current_replicas: 4,
                ready_replicas: 4,
                replicas: waiting.into_iter().map(replica).collect(),
                ..ScaleInput::default()
            };
            i.demand.queued_at_activator = held;
            i
        };
        let p = ScalePolicy {
            max_replicas: 4,
            ..policy()
        };
        let j = alone(&p, ShareRoom::Fixed, 2.0, None);
        let decide_on =
            |i: &ScaleInput| decide(i, &j, &ScaleState::default(), Timestamp::from_millis(60_000));
        let quiet = input(vec![Some(0); 4], 0);
        let d = decide_on(&quiet);
        assert!(latency_without_queue(&quiet, &d), "{d:?}");
        assert_eq!(d.desired_replicas, 4, "held at the maximum, not changed");
        assert!(d.message.contains("the time is in prefill"), "{}", d.message);
        for busy in [
            input(vec![Some(0), Some(1), Some(0), Some(0)], 0),
            input(vec![Some(0); 4], 2),
            input(vec![Some(0), None, Some(0), Some(0)], 0),
        ] {
            let d = decide_on(&busy);
            assert!(!latency_without_queue(&busy, &d), "{busy:?}");
            assert!(!d.message.contains("prefill"), "{}", d.message);
        }
    }

    /// The same replicas with the window's queue time (`recent.queueTimeSeconds`): 50 ms of waiting against a TTFT
    /// 1 s over its target, so no count of replicas brings it under; the target asks for none, the message says
    /// why and the constraint is prefill. A window that queued 1.5 s keeps today's answer (more replicas).
    #[test]
    fn a_prefill_bound_ttft_over_the_window_asks_for_no_replica() {
        use crate::scale::constraint::Constraint;
        use crate::scale::{ReplicaSignals, ScaleInput, ScaleState, Timestamp};
        let input = |queue_ms| ScaleInput {
            current_replicas: 2,
            ready_replicas: 2,
            replicas: vec![
                ReplicaSignals {
                    kv_cache_usage: Some(0.05),
                    waiting: Some(0),
                    running: Some(3),
                    ttft_p95: Some(Duration::from_millis(2_000)),
                    queue_p95: Some(Duration::from_millis(queue_ms)),
                    fresh: true,
                    ..ReplicaSignals::default()
                };
                2
            ],
            ..ScaleInput::default()
        };
        let p = ScalePolicy {
            max_replicas: 8,
            ttft_slo: Some(Duration::from_secs(3)),
            ..policy()
        };
        let j = alone(&p, ShareRoom::Fixed, 2.0, None);
        let decide_on =
            |i: &ScaleInput| decide(i, &j, &ScaleState::default(), Timestamp::from_millis(60_000));
        let prefill = input(50);
        let d = decide_on(&prefill);
        assert_eq!(d.desired_replicas, 2, "{}", d.message);
        assert!(d.prefill_held.is_some());
        assert!(
            d.message.contains("asks for no replica: the time is in prefill"),
            "{}",
            d.message
        );
        assert_eq!(Constraint::of(&prefill, &j, &d), Constraint::Prefill);
        let queued = input(1_500);
        let d = decide_on(&queued);
        assert!(d.desired_replicas > 2, "{}", d.message);
        assert_eq!(d.prefill_held, None);
    }

    #[test]
    fn the_share_can_grow_only_when_fractional_and_managed() {
        let gib80 = Some(80 * 1024 * 1_048_576);
        assert_eq!(
            ShareRoom::of(false, true, Some((0.4, 20_480)), gib80),
            ShareRoom::Fixed
        );
        assert_eq!(
            ShareRoom::of(true, false, Some((0.4, 20_480)), gib80),
            ShareRoom::Fixed
        );
        assert_eq!(ShareRoom::of(true, true, None, gib80), ShareRoom::Unknown);
        assert_eq!(
            ShareRoom::of(true, true, Some((0.4, 20_480)), gib80),
            ShareRoom::Auto {
                share: 0.4,
                memory_fraction: Some(0.25)
            }
        );
        assert_eq!(
            ShareRoom::of(true, true, Some((0.4, 20_480)), None),
            ShareRoom::Auto {
                share: 0.4,
                memory_fraction: None
            }
        );
    }
}
