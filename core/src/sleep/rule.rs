//! Keep warm, sleep, or go to zero: what a model's last replica does when its traffic stops.
//!
//! Three ways to sit out an idle gap, each with its cost:
//! - **keep warm**: a running replica holds its whole GPU share; the next request is served at once;
//! - **sleep**: the pod stays on its GPU holding a residue (its CUDA context), its weights in host memory (level 1)
//!   or dropped (level 2); the next request waits for a wake (a second or so at level 1);
//! - **zero**: nothing is held; the next request waits for a cold start (pod start and weight load).
//!
//! This rule picks between sleep and zero ([`decide`]); whether the replica may leave at all (keep warm) stays the
//! joint round's warm floor, which reads the lead time this rule implies (`LeadTimes::may_sleep` with
//! [`Rest::wake`], in `core::round`): with sleep,
//! the way back from zero is the wake, so a model whose cold start misses its objective but whose wake meets it
//! no longer needs a warm floor. A sleeping replica therefore *is* the model's floor, at a residue's cost.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::command::SleepLevel;

/// What the spec allows (`spec.sleep` of the InferenceAutoscaler; a scenario's `sleep_wake`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SleepPolicy {
    /// Sleep mode on for this model (off unless the spec asks: the server must run with `--enable-sleep-mode`).
    pub enabled: bool,
    /// The level the spec pins; `None` lets the rule choose ([`level`]).
    pub level: Option<SleepLevel>,
    /// Sleep even where the sidecar found a risky combination (LoRA adapters, tensor parallel, a hybrid or
    /// sliding-window model, a vLLM outside the tested range): vLLM has shipped wrong answers after a wake there.
    pub allow_risky: bool,
    /// The wake the spec states, used until the replicas measured one (before the first sleep, where the sidecar
    /// cannot read the model's weights to estimate it).
    pub expected_wake: Option<Duration>,
}

/// What the round observed about the model's sleep (from its sidecars' `rest` documents, or the scenario).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SleepFacts {
    /// A pod of the model is asleep now (or falling asleep, or waking).
    pub asleep: bool,
    /// Why a replica's sidecar will not sleep it, if one said so.
    pub refused: Option<String>,
    /// The longest wake the replicas measured, by level (the last wake of each); `None` before any wake.
    pub measured_wake: [Option<Duration>; 2],
    /// The model's weights, bytes (the sidecar's model directory), for the level-1 copy and an estimated wake.
    pub weights_bytes: Option<u64>,
    /// Host memory free on the node for a pinned copy of the weights (level 1); `None` when unknown.
    pub host_free_bytes: Option<u64>,
    /// The pool cannot keep another sleeper where this model's replica runs: its GPU's sleeper budget is full and
    /// this model is the cheapest sleeper to lose there ([`crate::pack::sleeping::admit`]).
    pub no_room: bool,
    /// The GPU the model's last running replica is on holds no other running replica. A sleeper there would be
    /// all that keeps the GPU: it saves nothing a warm replica does not, and it is lost when the idle GPU is given
    /// back, after which the warm floor starts a replica cold again — a cycle of cold starts. `false` when unknown.
    pub alone_on_gpu: bool,
}

/// The round's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rest {
    /// Sleep at this level when the model goes to zero, or `None`: go to zero.
    pub sleep: Option<SleepLevel>,
    /// The wake the round counts on (measured, else estimated), when sleeping.
    pub wake: Option<Duration>,
    /// Why, for the status and the Event.
    pub reason: RestReason,
}

/// Why the model sleeps or goes to zero (a stable code for the status).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RestReason {
    /// The spec does not enable sleep mode.
    SleepModeOff,
    /// A replica's sidecar refuses (a risky combination) and the spec does not opt in.
    Refused,
    /// The cold start already meets the TTFT objective (or there is none): holding a residue buys nothing.
    ColdStartMeetsObjective,
    /// The wake is no faster than a cold start, or unknown (never measured, no weights to estimate from).
    WakeNoFaster,
    /// The GPU's sleeper budget is full and this model is the cheapest sleeper to lose.
    NoSleeperRoom,
    /// Its replica is alone on its GPU: a sleeper would hold the GPU as a warm replica does, and be lost with it.
    AloneOnGpu,
    /// Sleeps: the wake is shorter than the cold start that misses the objective.
    WakeShortensColdStart,
}

impl RestReason {
    /// A sentence for the status.
    pub fn message(self) -> &'static str {
        match self {
            RestReason::SleepModeOff => "sleep mode is off (spec.sleep.enabled): an idle model goes to zero",
            RestReason::Refused => {
                "a replica's server is risky to sleep (its sidecar's rest.risks: LoRA, tensor parallel, an untested vLLM, a \
                 hybrid model) or its sidecar would not sleep it (rest.refused); set spec.sleep.allowRisky to sleep a \
                 risky one anyway"
            }
            RestReason::ColdStartMeetsObjective => {
                "the cold start meets the TTFT objective: going to zero holds nothing on the GPU"
            }
            RestReason::WakeNoFaster => {
                "a wake is no faster than a cold start here, or not known yet (no wake measured, no weights to \
                 estimate one from: set spec.sleep.expectedWake, or give the sidecar --model-dir): going to zero"
            }
            RestReason::NoSleeperRoom => {
                "the GPU's sleeper budget is full and this model is the cheapest sleeper to lose: going to zero"
            }
            RestReason::AloneOnGpu => {
                "its replica is alone on its GPU: asleep it would hold the GPU as a warm replica does and be lost \
                 when the GPU is given back; it sleeps once it shares a GPU"
            }
            RestReason::WakeShortensColdStart => {
                "asleep at zero: a wake replaces the cold start that would miss the TTFT objective"
            }
        }
    }
}

/// Host-to-device copy rate assumed for an estimated level-1 wake before one is measured: half the 51 GB/s
/// measured from pinned memory on an H200 (`docs/performance.md`, "Sleep mode on a GPU"), for margin.
pub const ESTIMATE_H2D_BYTES_PER_SEC: f64 = 25e9;
/// Read rate assumed for an estimated level-2 wake (the weights reloaded from the node's disk): the 1.6 GB/s
/// measured cold on that machine.
pub const ESTIMATE_RELOAD_BYTES_PER_SEC: f64 = 1.5e9;
/// The fixed part of an estimated wake (the server's own wake-up, the canary): vLLM's blog reports 0.26–0.82 s
/// level-1 wakes for small models.
pub const ESTIMATE_WAKE_FIXED: Duration = Duration::from_secs(1);
/// Host memory kept free beside a level-1 copy of the weights (the server's own host memory, the page cache).
pub const HOST_MARGIN: f64 = 1.2;

/// The level: the spec's, else level 1 where the node's host memory holds a copy of the weights with margin,
/// else level 2 (which needs none). Unknown host memory or weights choose level 2: a level-1 sleep that runs
/// the node out of memory would lose the pod.
pub fn level(policy: &SleepPolicy, facts: &SleepFacts) -> SleepLevel {
    if let Some(l) = policy.level {
        return l;
    }
    match (facts.weights_bytes, facts.host_free_bytes) {
        (Some(w), Some(free)) if (w as f64) * HOST_MARGIN <= free as f64 => SleepLevel::One,
        _ => SleepLevel::Two,
    }
}

/// The wake at `level`: the longest measured, else the spec's expected wake, else estimated from the weights, else
/// `None` (unknown).
pub fn wake(level: SleepLevel, policy: &SleepPolicy, facts: &SleepFacts) -> Option<Duration> {
    let measured = facts.measured_wake[usize::from(level.as_u8() - 1)];
    measured.or(policy.expected_wake).or_else(|| {
        let rate = match level {
            SleepLevel::One => ESTIMATE_H2D_BYTES_PER_SEC,
            SleepLevel::Two => ESTIMATE_RELOAD_BYTES_PER_SEC,
        };
        facts
            .weights_bytes
            .map(|w| ESTIMATE_WAKE_FIXED + Duration::from_secs_f64(w as f64 / rate))
    })
}

/// Sleep or zero, for a model whose new pod takes `cold_start` and whose objective is `ttft_slo`.
///
/// A wake that is unknown (no measurement, no weights to estimate from) is taken as the cold start itself: no
/// faster, so the model goes to zero as without sleep mode and its floor is decided on the cold start — a missing
/// measurement never removes a warm floor.
pub fn decide(
    policy: &SleepPolicy,
    facts: &SleepFacts,
    cold_start: Option<Duration>,
    ttft_slo: Option<Duration>,
) -> Rest {
    let zero = |reason| Rest {
        sleep: None,
        wake: None,
        reason,
    };
    if !policy.enabled {
        return zero(RestReason::SleepModeOff);
    }
    if facts.refused.is_some() && !policy.allow_risky {
        return zero(RestReason::Refused);
    }
    let Some(slo) = ttft_slo else {
        return zero(RestReason::ColdStartMeetsObjective);
    };
    if cold_start.is_some_and(|cold| cold <= slo) {
        return zero(RestReason::ColdStartMeetsObjective);
    }
    // An unknown cold start (no pod measured one: the only pod is asleep, say) is no reason to drop a sleeper: a
    // wake is never slower than a start.
    let lvl = level(policy, facts);
    let Some(w) = wake(lvl, policy, facts).filter(|w| cold_start.is_none_or(|cold| *w < cold)) else {
        return zero(RestReason::WakeNoFaster);
    };
    // A sleeper already asleep keeps its place; the budget decides only where a new one would go.
    if !facts.asleep {
        if facts.alone_on_gpu {
            return zero(RestReason::AloneOnGpu);
        }
        if facts.no_room {
            return zero(RestReason::NoSleeperRoom);
        }
    }
    Rest {
        sleep: Some(lvl),
        wake: Some(w),
        reason: RestReason::WakeShortensColdStart,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const GIB: u64 = 1 << 30;

    fn on() -> SleepPolicy {
        SleepPolicy {
            enabled: true,
            ..SleepPolicy::default()
        }
    }

    fn s(x: u64) -> Option<Duration> {
        Some(Duration::from_secs(x))
    }

    #[test]
    fn a_long_cold_start_sleeps_at_the_level_host_memory_allows() {
        let facts = SleepFacts {
            weights_bytes: Some(16 * GIB),
            host_free_bytes: Some(64 * GIB),
            ..Default::default()
        };
        let r = decide(&on(), &facts, s(60), s(2));
        assert_eq!(
            (r.sleep, r.reason),
            (Some(SleepLevel::One), RestReason::WakeShortensColdStart)
        );
        // 1 s + 16 GiB at 25 GB/s.
        assert!((r.wake.unwrap().as_secs_f64() - 1.687).abs() < 0.01, "{r:?}");
        // Too little host memory for a copy: level 2, reloading at disk speed.
        let tight = SleepFacts {
            host_free_bytes: Some(16 * GIB),
            ..facts.clone()
        };
        let r = decide(&on(), &tight, s(60), s(2));
        assert_eq!(r.sleep, Some(SleepLevel::Two));
        assert!(r.wake.unwrap() > Duration::from_secs(12));
        // Unknown host memory: level 2 too.
        assert_eq!(
            level(
                &on(),
                &SleepFacts {
                    host_free_bytes: None,
                    ..facts
                }
            ),
            SleepLevel::Two
        );
    }

    #[test]
    fn a_measured_wake_wins_over_the_estimate() {
        let facts = SleepFacts {
            weights_bytes: Some(16 * GIB),
            host_free_bytes: Some(64 * GIB),
            measured_wake: [Some(Duration::from_millis(400)), None],
            ..Default::default()
        };
        assert_eq!(
            decide(&on(), &facts, s(60), s(2)).wake,
            Some(Duration::from_millis(400))
        );
    }

    #[test]
    fn nothing_known_of_the_wake_goes_to_zero_and_keeps_the_floor_on_the_cold_start() {
        let r = decide(&on(), &SleepFacts::default(), s(60), s(2));
        assert_eq!(
            (r.sleep, r.reason, r.wake),
            (None, RestReason::WakeNoFaster, None)
        );
    }

    #[test]
    fn off_refused_fast_cold_starts_and_full_gpus_go_to_zero() {
        let facts = SleepFacts {
            measured_wake: [s(1), s(5)],
            host_free_bytes: Some(u64::MAX),
            weights_bytes: Some(GIB),
            ..Default::default()
        };
        assert_eq!(
            decide(&SleepPolicy::default(), &facts, s(60), s(2)).reason,
            RestReason::SleepModeOff
        );
        let refused = SleepFacts {
            refused: Some("LoRA adapters".into()),
            ..facts.clone()
        };
        assert_eq!(decide(&on(), &refused, s(60), s(2)).reason, RestReason::Refused);
        let risky = SleepPolicy {
            allow_risky: true,
            ..on()
        };
        assert_eq!(decide(&risky, &refused, s(60), s(2)).sleep, Some(SleepLevel::One));
        assert_eq!(
            decide(&on(), &facts, s(2), s(2)).reason,
            RestReason::ColdStartMeetsObjective
        );
        assert_eq!(
            decide(&on(), &facts, s(60), None).reason,
            RestReason::ColdStartMeetsObjective
        );
        let full = SleepFacts {
            no_room: true,
            ..facts.clone()
        };
        assert_eq!(
            decide(&on(), &full, s(60), s(2)).reason,
            RestReason::NoSleeperRoom
        );
        // One already asleep keeps its place.
        let kept = SleepFacts { asleep: true, ..full };
        assert!(decide(&on(), &kept, s(60), s(2)).sleep.is_some());
        // The spec's level wins.
        let pinned = SleepPolicy {
            level: Some(SleepLevel::Two),
            ..on()
        };
        assert_eq!(decide(&pinned, &facts, s(60), s(2)).wake, s(5));
    }
}
