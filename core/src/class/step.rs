//! The class step of a round ([`crate::round::round`] calls it first): count the minute, detect, hold, and
//! apply the class's defaults to the policy the rest of the round decides with.

use super::detect::{Declared, ObservedTraffic, detect};
use super::mix::RequestMix;
use super::policy::{self, Explicit, Resolved};
use super::series::MinuteSeries;
use super::stable::{ClassState, Held};
use crate::scale::{ScalePolicy, Timestamp};
use crate::wire::sidecar::SidecarStatus;

/// What a round reads to classify a model, beside the sidecars and the demand it already observes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClassSignals {
    /// What the model declares (`tiers` is filled from `mix` by the step).
    pub declared: Declared,
    /// What the activators counted of its requests.
    pub mix: RequestMix,
    /// Which class knobs the spec set explicitly.
    pub explicit: Explicit,
}

/// What the class step decided.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassRound {
    /// The class in force, since when and why.
    pub held: Held,
    /// Its bundle and which values came from it.
    pub resolved: Resolved,
}

/// The class step: counts this round's requests into `minutes` (from the activators' counter `requests_total`),
/// detects the class on the declared and observed signals, holds it in `state`, and applies its defaults to
/// `policy` where the spec left them.
pub fn step(
    signals: &ClassSignals,
    policy: &mut ScalePolicy,
    sidecars: &[Option<&SidecarStatus>],
    requests_total: Option<u64>,
    state: &mut ClassState,
    minutes: &mut MinuteSeries,
    now: Timestamp,
) -> ClassRound {
    minutes.observe(now, requests_total);
    let docs = || sidecars.iter().flatten();
    let max = |v: Vec<f64>| v.into_iter().filter(|x| x.is_finite()).reduce(f64::max);
    let traffic = ObservedTraffic {
        ttft_objective_secs: policy
            .targets
            .ttft_p95
            .or(policy.ttft_slo)
            .map(|d| d.as_secs_f64())
            .or_else(|| {
                max(docs()
                    .filter_map(|s| s.compute.and_then(|c| c.ttft_slo_secs))
                    .collect())
            }),
        itl_objective_secs: max(docs()
            .filter_map(|s| s.compute.and_then(|c| c.itl_slo_secs))
            .collect()),
        streamed: signals.mix.streamed(),
        minute_counts: minutes.counts(),
        prompt_lengths: signals.mix.prompt_bytes,
        active_ratio: max(docs()
            .filter_map(|s| s.window.as_ref().and_then(|w| w.active_ratio))
            .collect()),
    };
    let declared = Declared {
        tiers: signals.mix.tiers,
        ..signals.declared.clone()
    };
    let detection = detect(&declared, &traffic, state.class);
    let held = state.hold(detection, now);
    let resolved = policy::apply(held.class, policy, signals.explicit);
    ClassRound { held, resolved }
}
