//! A sleeping pod let go: the `tessera.dev/evicted` annotation a controller writes on a sleeping pod that loses
//! its place on its GPU (the sleeper budget, `crate::pack::sleeping::admit`, keeping a more valuable sleeper; or
//! the GPU given back after holding only sleepers for its pool's grace, as the simulator gives it back).
//!
//! The pod's own model's round then counts it as neither running nor asleep: at zero its `/scale` drops it (its
//! ReplicaSet deletes it) and, where the model keeps a warm floor, its instruction is withdrawn and it wakes. A
//! mark older than the pod's sleep instruction is stale: the pod woke and was told to sleep anew since.

use std::fmt;
use std::str::FromStr;

use super::command::{Instruct, RestCommand};

/// The pod annotation.
pub const ANNOTATION: &str = "tessera.dev/evicted";

/// Why a sleeper was let go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictReason {
    /// The GPU's sleeper budget keeps a sleeper worth more (its model is woken more often or starts slower).
    Budget,
    /// The GPU held only sleeping pods for its pool's `emptyGpuGracePeriod`: it is given back like an empty one.
    GpuGivenBack,
}

impl EvictReason {
    /// The word in the mark, and the metric's label.
    pub fn label(self) -> &'static str {
        match self {
            EvictReason::Budget => "budget",
            EvictReason::GpuGivenBack => "gpu-given-back",
        }
    }

    /// A sentence for an Event.
    pub fn message(self) -> &'static str {
        match self {
            EvictReason::Budget => {
                "the GPU's sleeper budget keeps a sleeper worth more (woken more often, or a slower cold start)"
            }
            EvictReason::GpuGivenBack => {
                "its GPU held only sleeping pods for the pool's emptyGpuGracePeriod and is given back"
            }
        }
    }
}

/// The mark in [`ANNOTATION`]: `at=<unix ms> reason=budget|gpu-given-back`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Eviction {
    /// When it was let go (Unix ms, the controller's clock).
    pub at_unix_ms: u64,
    /// Why.
    pub reason: EvictReason,
}

impl fmt::Display for Eviction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at={} reason={}", self.at_unix_ms, self.reason.label())
    }
}

impl FromStr for Eviction {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let (mut at, mut reason) = (None, None);
        for word in value.split_whitespace() {
            match word.split_once('=') {
                Some(("at", v)) => at = v.parse::<u64>().ok(),
                Some(("reason", "budget")) => reason = Some(EvictReason::Budget),
                Some(("reason", "gpu-given-back")) => reason = Some(EvictReason::GpuGivenBack),
                _ => {}
            }
        }
        match (at, reason) {
            (Some(at_unix_ms), Some(reason)) => Ok(Eviction { at_unix_ms, reason }),
            _ => Err(format!(
                "{ANNOTATION}={:?} is not a mark (expected `at=<unix ms> reason=budget|gpu-given-back`)",
                value.chars().take(200).collect::<String>()
            )),
        }
    }
}

/// Whether a pod sleeping under `instruction` (its `tessera.dev/rest`) and marked `evicted` has been let go: the
/// mark is not older than the instruction. No instruction (the pod is told to stay awake) or no mark: not.
pub fn let_go(instruction: Option<&RestCommand>, evicted: Option<&Eviction>) -> bool {
    matches!((instruction, evicted), (Some(i), Some(e)) if e.at_unix_ms >= i.since_unix_ms)
}

/// Why a sleeping pod not marked yet is let go now, if it is: its GPU is given back (held only by sleepers for
/// the pool's grace), else it is the cheapest of more sleepers than the GPU's budget holds —
/// `over_budget` answers that, `None` when a sleeper's worth there is not known (missing facts never let one go).
pub fn let_go_now(given_back: bool, over_budget: impl FnOnce() -> Option<bool>) -> Option<EvictReason> {
    if given_back {
        return Some(EvictReason::GpuGivenBack);
    }
    over_budget().unwrap_or(false).then_some(EvictReason::Budget)
}

/// A pod's instruction after a round (`command::instruct`'s answer, `otherwise`), for a pod `let_go`: while the
/// model is `at_zero` it keeps its instruction and stays asleep until `/scale` drops it (withdrawn, it would wake
/// only to be deleted); when the round wants a running replica it is treated as any pod, and wakes.
pub fn instruct(let_go: bool, at_zero: bool, otherwise: Instruct) -> Instruct {
    if let_go && at_zero {
        Instruct::Keep
    } else {
        otherwise
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::super::command::SleepLevel;
    use super::*;

    #[test]
    fn a_mark_counts_only_against_the_instruction_it_followed() {
        let e = Eviction {
            at_unix_ms: 5_000,
            reason: EvictReason::Budget,
        };
        assert_eq!(e.to_string().parse::<Eviction>(), Ok(e));
        let slept = |since| RestCommand {
            level: SleepLevel::One,
            since_unix_ms: since,
        };
        assert!(let_go(Some(&slept(1_000)), Some(&e)));
        assert!(
            !let_go(Some(&slept(9_000)), Some(&e)),
            "told to sleep anew after it"
        );
        assert!(!let_go(None, Some(&e)), "awake");
        assert!(!let_go(Some(&slept(1_000)), None));
        let g = "at=7 reason=gpu-given-back".parse::<Eviction>().unwrap();
        assert_eq!(g.reason, EvictReason::GpuGivenBack);
        assert!("at=x reason=budget".parse::<Eviction>().is_err());
        assert_eq!(let_go_now(true, || None), Some(EvictReason::GpuGivenBack));
        assert_eq!(let_go_now(false, || Some(true)), Some(EvictReason::Budget));
        assert_eq!(let_go_now(false, || None), None, "a sleeper's worth unknown");
        assert_eq!(let_go_now(false, || Some(false)), None);
        assert_eq!(instruct(true, true, Instruct::Clear), Instruct::Keep);
        assert_eq!(instruct(true, false, Instruct::Clear), Instruct::Clear);
        assert_eq!(instruct(false, true, Instruct::Clear), Instruct::Clear);
        assert!(
            "reason=budget"
                .parse::<Eviction>()
                .unwrap_err()
                .contains("at=<unix ms>")
        );
    }
}
