//! Each class as a named bundle of knobs Tessera already has, and the rule that an explicit spec field always
//! wins. The reasons for each default are in `docs/policies.md` ("Workload classes").
//!
//! Real-time's bundle is Tessera's defaults as they were before classes: they were tuned on the Azure
//! conversation trace, a real-time workload, and a model whose class is unsure is real-time, so turning classes
//! on moves nothing for it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::WorkloadClass;
use crate::scale::{ScalePolicy, SloPercentile};

/// Which models a replica may share a time-sliced GPU with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CoTenants {
    /// Any but batch: a batch neighbour on a time-sliced GPU holds the SMs for whole slices, which lands on a
    /// real-time model's TTFT.
    NotBatch,
    /// Any: a batch or near-real-time model can wait a slice.
    Any,
}

impl CoTenants {
    /// The name in the status and on the page.
    pub fn as_str(self) -> &'static str {
        match self {
            CoTenants::NotBatch => "notBatch",
            CoTenants::Any => "any",
        }
    }
}

/// One class's defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClassPolicy {
    /// The class.
    pub class: WorkloadClass,
    /// How much history the recommendation reads (the sidecar's `--window`).
    pub history_window: Duration,
    /// The KV-usage percentile the recommendation sizes for (the sidecar's `--percentile`).
    pub percentile: f64,
    /// Headroom over that percentile (the sidecar's `--headroom`).
    pub headroom: f64,
    /// `scaleToZero.coldStartMissBudget`: the share of requests that may wait through a cold start (`None`: a
    /// warm replica is kept whenever the cold start is longer than the objective).
    pub cold_start_miss_budget: Option<f64>,
    /// `ttftSloPercentile`: which percentile the TTFT guard holds.
    pub ttft_slo_percentile: SloPercentile,
    /// Who may share a time-sliced GPU with it.
    pub co_tenants: CoTenants,
    /// The vLLM `priority` its requests carry through the activator where vLLM runs with
    /// `--scheduling-policy priority` (lower runs first; 0 is vLLM's default).
    pub vllm_priority: i32,
}

impl ClassPolicy {
    /// The bundle of `class`.
    pub const fn of(class: WorkloadClass) -> ClassPolicy {
        match class {
            WorkloadClass::Realtime => ClassPolicy {
                class,
                history_window: Duration::from_secs(10 * 60),
                percentile: 0.95,
                headroom: 0.2,
                cold_start_miss_budget: None,
                ttft_slo_percentile: SloPercentile::P95,
                co_tenants: CoTenants::NotBatch,
                vllm_priority: 0,
            },
            WorkloadClass::NearRealtime => ClassPolicy {
                class,
                history_window: Duration::from_secs(5 * 60),
                percentile: 0.95,
                headroom: 0.1,
                cold_start_miss_budget: Some(0.01),
                ttft_slo_percentile: SloPercentile::P95,
                co_tenants: CoTenants::Any,
                vllm_priority: 5,
            },
            WorkloadClass::Batch => ClassPolicy {
                class,
                history_window: Duration::from_secs(30 * 60),
                percentile: 0.9,
                headroom: 0.05,
                cold_start_miss_budget: Some(0.5),
                ttft_slo_percentile: SloPercentile::P95,
                co_tenants: CoTenants::Any,
                vllm_priority: 10,
            },
        }
    }

    /// Whether a replica of this class may share a time-sliced GPU with one of `other`.
    pub fn may_share_with(&self, other: WorkloadClass) -> bool {
        let other = ClassPolicy::of(other);
        let refuses = |p: &ClassPolicy, c: WorkloadClass| {
            p.co_tenants == CoTenants::NotBatch && c == WorkloadClass::Batch
        };
        !refuses(self, other.class) && !refuses(&other, self.class)
    }
}

/// Which of the class's knobs the spec set explicitly (those keep the spec's value).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Explicit {
    /// `scaleToZero.coldStartMissBudget`.
    pub cold_start_miss_budget: bool,
    /// `ttftSloPercentile`.
    pub ttft_slo_percentile: bool,
}

/// The spec paths a [`Resolved`] lists, in a stable order.
pub mod fields {
    /// The recommendation's history window.
    pub const HISTORY_WINDOW: &str = "recommendation.historyWindow";
    /// The recommendation's percentile.
    pub const PERCENTILE: &str = "recommendation.percentile";
    /// The recommendation's headroom.
    pub const HEADROOM: &str = "recommendation.headroom";
    /// The cold-start budget.
    pub const COLD_START_MISS_BUDGET: &str = "scaleToZero.coldStartMissBudget";
    /// The TTFT guard's percentile.
    pub const TTFT_SLO_PERCENTILE: &str = "ttftSloPercentile";
    /// Who may share a time-sliced GPU.
    pub const CO_TENANTS: &str = "gpu.coTenants";
    /// The requests' vLLM priority.
    pub const REQUEST_PRIORITY: &str = "requestPriority";
}

/// The class's bundle applied under a spec: what the policy became and which values came from the class.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// The class's bundle.
    pub bundle: ClassPolicy,
    /// The spec paths whose values came from the class, in [`fields`] order.
    pub from_class: Vec<&'static str>,
}

impl Resolved {
    /// The policy in words, for the page and the Event (`"history 10m p95 +20%, warm replica kept, ..."`).
    pub fn summary(&self) -> String {
        let b = &self.bundle;
        let budget = match b.cold_start_miss_budget {
            None => "warm replica kept".to_owned(),
            Some(x) => format!("cold-start budget {:.1}%", x * 100.0),
        };
        format!(
            "history {}m p{:.0} +{:.0}%, {budget}, TTFT guard {}, co-tenants {}, priority {}",
            b.history_window.as_secs() / 60,
            b.percentile * 100.0,
            b.headroom * 100.0,
            b.ttft_slo_percentile.label(),
            b.co_tenants.as_str(),
            b.vllm_priority
        )
    }
}

/// Applies `class`'s defaults to `policy` where the spec left them unset (`explicit`), returning what came from
/// the class.
pub fn apply(class: WorkloadClass, policy: &mut ScalePolicy, explicit: Explicit) -> Resolved {
    let bundle = ClassPolicy::of(class);
    let mut from_class = vec![fields::HISTORY_WINDOW, fields::PERCENTILE, fields::HEADROOM];
    if let Some(z) = policy.scale_to_zero.as_mut()
        && !explicit.cold_start_miss_budget
    {
        z.cold_start_miss_budget = bundle.cold_start_miss_budget;
        from_class.push(fields::COLD_START_MISS_BUDGET);
    }
    if policy.ttft_slo.is_some() && !explicit.ttft_slo_percentile {
        policy.ttft_slo_percentile = bundle.ttft_slo_percentile;
        from_class.push(fields::TTFT_SLO_PERCENTILE);
    }
    from_class.extend([fields::CO_TENANTS, fields::REQUEST_PRIORITY]);
    Resolved { bundle, from_class }
}
