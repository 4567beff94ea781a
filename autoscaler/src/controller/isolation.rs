//! At the ceiling, whole GPUs (`tessera_core::scale::isolation`, the last step of `core::round`), carried out in
//! the cluster. The rule is core's, the one the simulator runs; this module reads its facts and says its answer:
//! - whether the model's pods share a GPU: a pod's capacity pod (`tessera.dev/capacity-pod`, written by the
//!   webhook) holding another tenant's reservation, as the pool managers of this process publish it
//!   ([`crate::pool::SharedGpus`]);
//! - what the last round decided: the `Isolated` condition ([`CONDITION_ISOLATED`]), so a restarted controller or a
//!   new leader resumes it;
//! - the answer is that condition: while it is True the webhook gives the model's new pods whole GPUs, and its
//!   pods on shared GPUs leave as from a draining GPU (`super::consolidate`: one surge, then the shared pod
//!   retired once its whole-GPU copy is ready), so capacity never falls during the move.

use k8s_openapi::api::core::v1::Pod;
use tessera_api::crd::CONDITION_ISOLATED;
use tessera_core::round::Round;
use tessera_core::scale::isolation::{Isolation, IsolationFacts};

use super::consolidate::Leaving;
use crate::crd::InferenceAutoscalerStatus;
use crate::pool::{ANNOTATION_CAPACITY_POD, ConsolidationLink};

/// Whether the last round isolated the model (its `Isolated` condition is True).
pub fn isolated_before(status: Option<&InferenceAutoscalerStatus>) -> bool {
    status.is_some_and(|s| s.isolated().is_some())
}

/// What the rule reads: whether any of `pods` (not being deleted) sits on a shared GPU, and the last round's answer.
pub fn facts(
    status: Option<&InferenceAutoscalerStatus>,
    pods: &[Pod],
    link: &ConsolidationLink,
) -> IsolationFacts {
    let shares_gpu = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.metadata.annotations.as_ref()?.get(ANNOTATION_CAPACITY_POD))
        .any(|c| link.shared.contains(c));
    IsolationFacts {
        shares_gpu,
        isolated: isolated_before(status),
    }
}

/// The GPUs the model's pods leave: the draining ones, and the shared ones while it is isolated. `movable`: its
/// workload honours the pod-deletion cost a retire sets (a Deployment's ReplicaSet); a StatefulSet removes its
/// highest ordinal whatever the cost, so its pods stay where they are and only its new pods get whole GPUs.
pub fn leaving<'a>(
    status: Option<&InferenceAutoscalerStatus>,
    link: &'a ConsolidationLink,
    movable: bool,
) -> Leaving<'a> {
    Leaving {
        draining: &link.draining,
        shared: (movable && isolated_before(status)).then_some(&link.shared),
    }
}

/// The `Isolated` condition for this round, as `(type, status, reason, message)`: `None` when the round did not ask
/// (no [`tessera_core::round::Observed::isolation`]), or when it shares and no condition was set before.
pub fn condition(
    status: Option<&InferenceAutoscalerStatus>,
    r: &Round,
) -> Option<(&'static str, bool, String, String)> {
    let had = status.is_some_and(|s| s.conditions.iter().any(|c| c.type_ == CONDITION_ISOLATED));
    match r.isolation? {
        Isolation::Isolate(why) => Some((
            CONDITION_ISOLATED,
            true,
            super::status::camel(why.label()),
            format!(
                "at its ceiling ({} replicas) with time to first token over its objective while it shared GPUs \
                 ({}): new pods get whole GPUs and pods on shared GPUs move off them, one at a time, until the \
                 model leaves its ceiling",
                r.policy.max_replicas,
                why.label()
            ),
        )),
        Isolation::Share if had => Some((
            CONDITION_ISOLATED,
            false,
            "BelowCeiling".to_owned(),
            "below its ceiling with its latency known: new pods may share GPUs again (running ones keep theirs)"
                .to_owned(),
        )),
        Isolation::Share => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    fn pod(name: &str, capacity: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.annotations = Some([(ANNOTATION_CAPACITY_POD.to_owned(), capacity.to_owned())].into());
        p
    }

    fn status(isolated: bool) -> InferenceAutoscalerStatus {
        InferenceAutoscalerStatus {
            conditions: vec![Condition {
                type_: CONDITION_ISOLATED.into(),
                status: if isolated { "True" } else { "False" }.into(),
                reason: "X".into(),
                message: String::new(),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ),
                observed_generation: None,
            }],
            ..InferenceAutoscalerStatus::default()
        }
    }

    #[test]
    fn a_pod_on_a_gpu_with_another_tenant_shares_it_and_leaves_it_only_while_isolated() {
        let link = ConsolidationLink::default();
        link.shared.set("a100", vec!["cap-1".into()]);
        let pods = [pod("m-0", "cap-0"), pod("m-1", "cap-1")];
        let f = facts(None, &pods, &link);
        assert!(f.shares_gpu && !f.isolated);
        assert!(!facts(None, &pods[..1], &link).shares_gpu);
        // Not isolated: only a draining GPU is left.
        let moving = super::super::consolidate::placement(&pods, leaving(None, &link, true));
        assert_eq!(moving.placement.on_draining, 0);
        // Isolated: the pod on the shared GPU leaves it, and the condition says why.
        let st = status(true);
        assert!(facts(Some(&st), &pods, &link).isolated);
        let moving = super::super::consolidate::placement(&pods, leaving(Some(&st), &link, true));
        assert_eq!(
            (moving.placement.on_draining, moving.placement.off_ready),
            (1, 0),
            "m-0 is not ready, so it counts as starting"
        );
        assert_eq!(moving.leaving, vec!["m-1".to_owned()]);
        assert!(moving.isolating);
        // A StatefulSet's pods stay: a retire could not pick them.
        let kept = super::super::consolidate::placement(&pods, leaving(Some(&st), &link, false));
        assert_eq!(kept.placement.on_draining, 0);
        assert!(!isolated_before(Some(&status(false))));
    }

    #[test]
    fn reasons_are_camel_case() {
        assert_eq!(
            super::super::status::camel("co_tenants_at_ceiling"),
            "CoTenantsAtCeiling"
        );
        assert_eq!(super::super::status::camel("held"), "Held");
    }
}
