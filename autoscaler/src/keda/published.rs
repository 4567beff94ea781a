//! An InferenceAutoscaler's status as the scaler reads it.

use kube::ResourceExt;
use tessera_core::keda::{Published, PublishedSignal};
use tessera_core::scale::Signal;

use crate::crd::InferenceAutoscaler;

/// What `ia`'s status says the leader decided, with `held` requests at the activators. A status written for an
/// older generation of the spec is no decision: the spec changed and the leader has not decided on it yet.
pub fn published_of(ia: &InferenceAutoscaler, held: u32) -> Published {
    let status = ia.status.as_ref();
    let decided = status
        .is_some_and(|s| s.observed_generation.is_some() && s.observed_generation == ia.metadata.generation)
        && status.is_some_and(|s| s.last_decision_reason.is_some());
    let signals = status
        .map(|s| {
            s.current_metrics
                .iter()
                .filter_map(|m| {
                    let signal = Signal::from_field(&m.name)?;
                    Some(PublishedSignal {
                        signal,
                        current: m.current,
                        target: m.target,
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    Published {
        owner: ia.spec.scaled_by.owner(),
        desired_replicas: status
            .filter(|_| decided)
            .and_then(|s| u32::try_from(s.desired_replicas).ok()),
        current_replicas: status.and_then(|s| u32::try_from(s.replicas).ok()).unwrap_or(0),
        signals,
        held,
    }
}

/// The activator keys of `ia`'s model names.
pub(super) fn activator_keys(ia: &InferenceAutoscaler) -> Vec<String> {
    let ns = ia.namespace().unwrap_or_default();
    ia.spec
        .model_names
        .iter()
        .map(|m| tessera_core::wire::activator::model_key(&ns, m))
        .collect()
}
