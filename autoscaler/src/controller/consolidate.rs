//! Moving a model's pods off a GPU the pool manager is draining.
//!
//! The rule is [`tessera_core::pack::consolidate::move_step`], the one the simulator runs; this module reads its
//! input from the cluster and carries out its answer:
//! - which pods sit on a draining GPU: their `tessera.dev/capacity-pod` annotation (written by the webhook) names a
//!   capacity pod in [`crate::pool::DrainingGpus`], which the pool managers of this process publish;
//! - a **surge** writes one replica over the decision to `/scale`; the webhook places the new pod off the draining
//!   GPU. The `Consolidating` condition (reason `Surge`) remembers it, so the next round takes the extra replica
//!   off `/scale`'s count before deciding, exactly as the simulator does, and a restarted controller does too;
//! - a **retire** first sets `controller.kubernetes.io/pod-deletion-cost` to the lowest value on the pods leaving
//!   the draining GPU, so the ReplicaSet removes those when the count goes back to the decision. If that write
//!   fails, nothing is scaled down this round: a wrong pod must not go.
//!
//! Only pods of one ReplicaSet are picked this way (Deployments); the pool manager drains a GPU only when each
//! pod on it is a ReplicaSet's and Ready.
//!
//! A model isolated at its ceiling (`super::isolation`) moves the same way off every GPU it shares: those pods
//! leave as from a draining GPU, and the webhook gives their copies whole GPUs.

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use tessera_core::pack::consolidate::{ModelPlacement, MoveStep, move_step};

use crate::crd::InferenceAutoscalerStatus;
use crate::pool::{ANNOTATION_CAPACITY_POD, DrainingGpus, SharedGpus};

/// The condition type: a move off a draining GPU is under way (`Surge`, `Retire`) or not (`NotDraining`).
pub const CONSOLIDATING: &str = "Consolidating";

/// The condition reason of a round that asked for a surge.
pub const REASON_SURGE: &str = "Surge";

/// The cost set on a pod that leaves a draining GPU: the lowest there is, so it goes before any pod a user
/// ranked with the same annotation.
pub const LEAVING_COST: i32 = i32::MIN;

/// Whether the previous round asked for one replica over its decision (the `Consolidating` condition says
/// `Surge`): `/scale`'s count is then one over what the rule chose.
pub fn surged(status: Option<&InferenceAutoscalerStatus>) -> bool {
    status.is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == CONSOLIDATING && c.status == "True" && c.reason == REASON_SURGE)
    })
}

/// One round's move: the rule's answer and the pods it concerns.
#[derive(Debug, Clone, PartialEq)]
pub struct Move {
    /// The rule's input.
    pub placement: ModelPlacement,
    /// Its answer.
    pub step: MoveStep,
    /// Pods on a draining GPU, starting ones first then by name (the order they are retired in).
    pub leaving: Vec<String>,
    /// The draining capacity pods they sit on.
    pub from: Vec<String>,
    /// Some leave a GPU that is not draining but shared, because the model is isolated.
    pub isolating: bool,
}

/// Which capacity pods a model's pods leave.
#[derive(Debug, Clone, Copy)]
pub struct Leaving<'a> {
    /// The GPUs the pool managers drain.
    pub draining: &'a DrainingGpus,
    /// The GPUs holding another tenant, when the model is isolated (`super::isolation`); `None` otherwise.
    pub shared: Option<&'a SharedGpus>,
}

impl Leaving<'_> {
    /// Whether a pod on `capacity_pod` leaves it, and whether because the model is isolated.
    fn leaves(&self, capacity_pod: &str) -> Option<bool> {
        if self.draining.contains(capacity_pod) {
            Some(false)
        } else if self.shared.is_some_and(|s| s.contains(capacity_pod)) {
            Some(true)
        } else {
            None
        }
    }
}

impl Move {
    /// The pods to mark with [`LEAVING_COST`] before the count goes back down.
    pub fn to_retire(&self) -> &[String] {
        match self.step {
            MoveStep::Retire { pods } => &self.leaving[..(pods as usize).min(self.leaving.len())],
            MoveStep::Stay | MoveStep::Surge => &[],
        }
    }

    /// The `Consolidating` condition for this round: `None` when there is nothing to say (no pod of the model on
    /// a draining GPU, and no condition set before). `surge_in_force`: `/scale` carries the surge (written this
    /// round or already there); when it does not (the write failed), the reason is `SurgePending`, which the next
    /// round does not take off the count.
    pub fn condition(
        &self,
        had_condition: bool,
        surge_in_force: bool,
    ) -> Option<(bool, &'static str, String)> {
        let from = self.from.join(", ");
        let gpu = if self.isolating {
            "GPU shared while the model is isolated at its ceiling"
        } else {
            "GPU being drained"
        };
        match self.step {
            MoveStep::Stay if had_condition => Some((
                false,
                "NotDraining",
                "no pod of this model is on a GPU being drained".to_owned(),
            )),
            MoveStep::Stay => None,
            MoveStep::Surge => Some((
                true,
                if surge_in_force {
                    REASON_SURGE
                } else {
                    "SurgePending"
                },
                format!(
                    "{} pod(s) on {gpu} ({from}): one replica over the decision of {} until its copy elsewhere is \
                     ready ({} ready elsewhere, {} starting)",
                    self.placement.on_draining,
                    self.placement.desired,
                    self.placement.off_ready,
                    self.placement.off_starting
                ),
            )),
            MoveStep::Retire { .. } => Some((
                true,
                "Retire",
                format!(
                    "removing {} off {gpu} ({from}); {} ready elsewhere for a decision of {}",
                    self.to_retire().join(", "),
                    self.placement.off_ready,
                    self.placement.desired
                ),
            )),
        }
    }
}

/// Reads where the model's pods are and asks the rule. Pods being deleted are not counted anywhere: they are
/// already going.
pub fn plan(pods: &[Pod], draining: &DrainingGpus, desired: u32) -> Move {
    let placed = placement(
        pods,
        Leaving {
            draining,
            shared: None,
        },
    );
    let placement = ModelPlacement {
        desired,
        ..placed.placement
    };
    placed.decided(placement, move_step(placement))
}

/// Where the model's pods are relative to the GPUs they leave, before the round decides (`desired` 0, step
/// `Stay`): the round's `Observed::placement`. Pods being deleted are not counted anywhere: they are already going.
pub fn placement(pods: &[Pod], leaves: Leaving<'_>) -> Move {
    let mut placement = ModelPlacement::default();
    let mut leaving: Vec<(bool, String)> = Vec::new();
    let mut from: Vec<String> = Vec::new();
    let mut isolating = false;
    for pod in pods.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
        let ready = crate::pod_ready(pod);
        let capacity = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_CAPACITY_POD))
            .and_then(|c| Some((c, leaves.leaves(c)?)));
        match capacity {
            Some((c, shared)) => {
                isolating |= shared;
                placement.on_draining += 1;
                leaving.push((ready, pod.metadata.name.clone().unwrap_or_default()));
                if !from.contains(c) {
                    from.push(c.clone());
                }
            }
            None if ready => placement.off_ready += 1,
            None => placement.off_starting += 1,
        }
    }
    leaving.sort();
    Move {
        placement,
        step: MoveStep::Stay,
        leaving: leaving.into_iter().map(|(_, n)| n).collect(),
        from,
        isolating,
    }
}

impl Move {
    /// This placement with the round's answer: the `placement` it decided on (its `desired` filled) and its `step`.
    pub fn decided(&self, placement: ModelPlacement, step: MoveStep) -> Move {
        Move {
            placement,
            step,
            leaving: self.leaving.clone(),
            from: self.from.clone(),
            isolating: self.isolating,
        }
    }
}

/// Sets [`LEAVING_COST`] on each of `names` (`super::deletion_cost::write`).
pub async fn mark_leaving(pods: &Api<Pod>, names: &[String]) -> Result<(), kube::Error> {
    let changes: Vec<(String, Option<i32>)> = names.iter().map(|n| (n.clone(), Some(LEAVING_COST))).collect();
    super::deletion_cost::write(pods, &changes).await.map(|_| ())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};

    fn pod(name: &str, capacity: &str, ready: bool) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.annotations = Some([(ANNOTATION_CAPACITY_POD.to_owned(), capacity.to_owned())].into());
        p.status = Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..PodCondition::default()
            }]),
            ..PodStatus::default()
        });
        p
    }

    #[test]
    fn pods_on_a_draining_gpu_surge_then_retire() {
        let draining = DrainingGpus::default();
        draining.set("a100", vec!["tessera-gpu-a100-1".into()]);
        let old = pod("m-old", "tessera-gpu-a100-1", true);
        let m = plan(std::slice::from_ref(&old), &draining, 1);
        assert_eq!(m.step, MoveStep::Surge);
        let (ok, reason, message) = m.condition(false, true).unwrap();
        // A surge whose /scale write failed is not remembered as one.
        assert_eq!(m.condition(false, false).unwrap().1, "SurgePending");
        assert!(
            ok && reason == REASON_SURGE && message.contains("tessera-gpu-a100-1"),
            "{message}"
        );
        // The copy is starting on another GPU: keep the surge.
        let new = pod("m-new", "tessera-gpu-a100-0", false);
        assert_eq!(plan(&[old.clone(), new], &draining, 1).step, MoveStep::Surge);
        // Ready: retire the old one, and only it.
        let new = pod("m-new", "tessera-gpu-a100-0", true);
        let m = plan(&[old, new], &draining, 1);
        assert_eq!(m.step, MoveStep::Retire { pods: 1 });
        assert_eq!(m.to_retire(), ["m-old".to_owned()]);
    }

    #[test]
    fn nothing_draining_says_nothing_unless_it_said_something_before() {
        let draining = DrainingGpus::default();
        let m = plan(&[pod("m", "tessera-gpu-a100-0", true)], &draining, 1);
        assert_eq!(m.step, MoveStep::Stay);
        assert_eq!(m.condition(false, true), None);
        assert_eq!(m.condition(true, true).map(|c| c.1), Some("NotDraining"));
    }

    #[test]
    fn a_surge_is_remembered_by_the_condition() {
        let mut st = InferenceAutoscalerStatus::default();
        assert!(!surged(Some(&st)));
        let now =
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        crate::controller::status::set_condition(
            &mut st.conditions,
            CONSOLIDATING,
            true,
            REASON_SURGE,
            "",
            None,
            &now,
        );
        assert!(surged(Some(&st)));
        crate::controller::status::set_condition(
            &mut st.conditions,
            CONSOLIDATING,
            true,
            "Retire",
            "",
            None,
            &now,
        );
        assert!(!surged(Some(&st)));
    }
}
