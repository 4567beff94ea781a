//! Workload classes: whether a model is **real-time**, **near-real-time** or **batch**, detected from what it
//! declares and what it does, and the policy defaults each class supplies.
//!
//! A class is a set of defaults, never a mode: every knob it sets already exists and an explicit field in the
//! spec always wins ([`policy`]). Detection ([`detect`]) reads declared signals before observed ones and says
//! why; [`stable`] keeps the answer from flapping (real-time when unsure, slow to leave real-time, a minimum
//! dwell). The controller and the simulator reach all of it through one call in [`crate::round`].
//!
//! - [`detect`]: the rule, first match wins, each outcome with its reason.
//! - [`shape`]: the traffic's daily shape (diurnal, on/off bursts, flat) from per-minute counts, and how
//!   templated the prompts are (their length spread).
//! - [`mix`]: what the activator counts of each model's requests (tiers, streaming, prompt lengths) and the lane
//!   a request takes.
//! - [`series`]: the bounded per-minute request counts the round feeds from the activators' counters.
//! - [`stable`]: hysteresis and dwell over successive detections.
//! - [`policy`]: each class's bundle of defaults, and which values came from it.
//! - [`step`]: the class step of a round (count, detect, hold, apply).

use serde::{Deserialize, Serialize};

pub mod detect;
pub mod mix;
pub mod policy;
pub mod series;
pub mod shape;
pub mod stable;
pub mod step;

#[cfg(test)]
mod tests;

pub use detect::{Declared, Detection, ObservedTraffic, Source, TierCounts, detect};
pub use mix::{Lane, RequestMix};
pub use policy::{ClassPolicy, CoTenants, Explicit, Resolved};
pub use series::MinuteSeries;
pub use shape::{Moments, Shape, ShapeStats};
pub use stable::{ClassState, Held};
pub use step::{ClassRound, ClassSignals};

/// How a model is used, as far as its policy is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub enum WorkloadClass {
    /// Someone waits on each token (chat, code completion): latency first. The class when unsure.
    #[default]
    Realtime,
    /// Someone waits on the answer, but not token by token, and traffic comes in bursts (tools, functions,
    /// agents' calls): a short wait or a cold start is acceptable within the objective.
    NearRealtime,
    /// Nobody waits on one request (offline jobs, evaluations, embeddings of a corpus): throughput and
    /// utilisation first.
    Batch,
}

impl WorkloadClass {
    /// The name in `spec.workloadClass`, `status.workloadClass` and on the page.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadClass::Realtime => "realtime",
            WorkloadClass::NearRealtime => "nearRealtime",
            WorkloadClass::Batch => "batch",
        }
    }

    /// From the name [`WorkloadClass::as_str`] writes; `None` for anything else.
    pub fn from_name(s: &str) -> Option<Self> {
        match s {
            "realtime" => Some(WorkloadClass::Realtime),
            "nearRealtime" => Some(WorkloadClass::NearRealtime),
            "batch" => Some(WorkloadClass::Batch),
            _ => None,
        }
    }

    /// Every class, from the most latency-bound to the least.
    pub const ALL: [WorkloadClass; 3] = [
        WorkloadClass::Realtime,
        WorkloadClass::NearRealtime,
        WorkloadClass::Batch,
    ];
}

impl std::fmt::Display for WorkloadClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
