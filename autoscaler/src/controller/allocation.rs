//! Step 7 of a reconcile: the allocation in force (`status.allocation`, folded from the replicas' recommendations
//! by `core::rollout::fold`, gathered and applied in `super::rollout`), the `AllocationInSync` condition, and under
//! `updateMode: Recreate` the roll of pods that run another allocation (an Event per roll).

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::events::EventType;
use tracing::{debug, warn};

use super::context::{Context, publish};
use crate::crd::InferenceAutoscaler;

/// What [`allocation_and_roll`] needs from this reconcile.
pub(super) struct AllocationRound<'a> {
    pub(super) target_api: &'a Api<DynamicObject>,
    pub(super) target: &'a str,
    pub(super) all_pods: &'a [Pod],
    pub(super) gpu: &'a crate::crd::GpuSpec,
    pub(super) recommendation: Option<&'a crate::crd::RecommendationStatus>,
    pub(super) urgency: tessera_core::rollout::Urgency,
    pub(super) replicas: (i32, i32, i32, i32),
    pub(super) now_ms: u64,
    pub(super) now_k8s: &'a Time,
}

/// What hurries a growth this round, in words for a status message.
fn urgency_text(u: tessera_core::rollout::Urgency) -> &'static str {
    match (u.preempting, u.ttft_over_slo) {
        (true, true) => "vLLM preempts and a replica is over the TTFT objective",
        (true, false) => "vLLM preempts",
        (false, true) => "a replica is over the TTFT objective",
        (false, false) => "nothing is urgent",
    }
}

/// Folds the recommendation into `status.allocation` and, under `Recreate`, rolls drifted pods (an Event per
/// roll): gathers, takes the allocation half of the round in core (`super::rollout::fold_and_roll`, on
/// [`tessera_core::rollout::fold`]) and applies it. Returns the allocation status and the `AllocationInSync`
/// condition to set (none under `Off`).
pub(super) async fn allocation_and_roll(
    ctx: &Context,
    obj: &InferenceAutoscaler,
    round: AllocationRound<'_>,
) -> (crate::crd::AllocationStatus, Option<(bool, String, String)>) {
    use super::rollout as ro;
    use tessera_core::rollout::UpdateMode;
    let cfg = &ctx.settings.rollout;
    let previous = obj.status.as_ref().and_then(|s| s.allocation.as_ref());
    let model_key = format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any());
    let ns = obj.namespace().unwrap_or_default();
    let kind = obj.spec.scale_target_ref.kind.clone();
    let request = ro::RollRequest {
        target_api: round.target_api,
        pdb_api: Api::namespaced(ctx.client.clone(), &ns),
        kind: &kind,
        name: &obj.spec.scale_target_ref.name,
        model_key: &model_key,
        facts: ro::AllocationFacts {
            pods: round.all_pods,
            previous,
            recommendation: round.recommendation,
            gpu: round.gpu,
            replicas: round.replicas,
            urgency: round.urgency,
            now_ms: round.now_ms,
        },
    };
    let (fold, outcome) = ro::fold_and_roll(request, &ctx.rolling, cfg).await;
    let mut allocation = ro::status_of(previous, &fold);
    let mode = ro::mode(round.gpu);
    if mode == UpdateMode::Off {
        return (allocation, None);
    }
    let drifted = mark_drifted(ctx, obj, &fold.drifted, round.all_pods).await;
    let condition = if mode == UpdateMode::Initial {
        initial_condition(&allocation, drifted, fold.behind, round.urgency)
    } else {
        roll_condition(ctx, obj, &mut allocation, outcome, &round).await
    };
    (allocation, Some(condition))
}

/// The `AllocationInSync` condition under `updateMode: Initial`: what new pods get, how many running pods run
/// another allocation (they go first on a scale-down), and how many an urgent growth leaves behind.
fn initial_condition(
    allocation: &crate::crd::AllocationStatus,
    drifted: usize,
    behind: usize,
    urgency: tessera_core::rollout::Urgency,
) -> (bool, String, String) {
    let msg = match &allocation.in_force {
        Some(a) => {
            let mut msg = format!(
                "new pods get {} MiB and a {:.2} compute share ({}); running pods are not replaced (updateMode: Initial)",
                a.gpu_memory_mib, a.compute_fraction, allocation.reason
            );
            if drifted > 0 {
                msg.push_str(&format!(
                    "; {drifted} running pod(s) run another allocation and go first when the model scales down"
                ));
            }
            // Name the running pods an urgent growth leaves behind: what Recreate would roll now.
            if behind > 0 {
                msg.push_str(&format!(
                    "; {behind} running pod(s) hold less than this while {} (updateMode: Recreate would roll them now)",
                    urgency_text(urgency)
                ));
            }
            msg
        }
        None => "no allocation in force yet: waiting for a stable recommendation".to_owned(),
    };
    (
        allocation_in_force(allocation),
        super::status::camel(&allocation.reason),
        msg,
    )
}

/// Applies a roll's outcome under `updateMode: Recreate`: the roll's fields in `allocation`, an Event for a roll
/// or a failed one, and the `AllocationInSync` condition.
async fn roll_condition(
    ctx: &Context,
    obj: &InferenceAutoscaler,
    allocation: &mut crate::crd::AllocationStatus,
    outcome: super::rollout::RollOutcome,
    round: &AllocationRound<'_>,
) -> (bool, String, String) {
    use super::rollout::RollOutcome;
    use tessera_core::rollout::HoldReason;
    match outcome {
        RollOutcome::Rolled {
            reason,
            hash,
            message,
        } => {
            allocation.template_hash = Some(hash);
            allocation.last_roll_time = Some(round.now_k8s.clone());
            allocation.roll_reason = Some(format!("roll_{reason}"));
            publish(ctx, obj, EventType::Normal, "AllocationRoll", "Roll", &message).await;
            (false, "Rolling".to_owned(), message)
        }
        RollOutcome::Held(HoldReason::InSync) => {
            allocation.roll_reason = Some("hold_in_sync".to_owned());
            (
                true,
                "InSync".to_owned(),
                format!("every pod of {} runs with the allocation in force", round.target),
            )
        }
        RollOutcome::Held(h) => {
            allocation.roll_reason = Some(format!("hold_{}", h.label()));
            (
                false,
                hold_reason_word(h).to_owned(),
                format!("not rolling {}: {}", round.target, h.label().replace('_', " ")),
            )
        }
        RollOutcome::Failed(message) => {
            warn!(%message, "roll failed");
            publish(
                ctx,
                obj,
                EventType::Warning,
                "FailedAllocationRoll",
                "Roll",
                &message,
            )
            .await;
            (false, "RollFailed".to_owned(), message)
        }
    }
}

/// Marks the pods that drifted from the allocation in force to go first on a scale-down, and takes the mark off
/// those that no longer have (`super::rollout::deletion_cost_changes`), as the fold judged them (`drifted`, one per
/// pod). Only a ReplicaSet honours the cost, so only a Deployment's pods are marked. A failed write is logged and
/// retried next round: the mark only orders a scale-down. Returns how many pods carry the mark (marked now or
/// before).
async fn mark_drifted(ctx: &Context, obj: &InferenceAutoscaler, drifted: &[bool], pods: &[Pod]) -> usize {
    use super::rollout as ro;
    if !super::deletion_cost::honoured_by(&obj.spec.scale_target_ref.kind) {
        return 0;
    }
    let changes = ro::deletion_cost_changes(pods, drifted);
    if !changes.is_empty() {
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &obj.namespace().unwrap_or_default());
        match super::deletion_cost::write(&api, &changes).await {
            Ok(n) => debug!(pods = n, "pod-deletion-cost updated for the allocation in force"),
            Err(e) => {
                warn!(error = %e, "could not mark pods that run another allocation; retrying next round")
            }
        }
    }
    ro::marked_count(pods, drifted)
}

fn allocation_in_force(a: &crate::crd::AllocationStatus) -> bool {
    a.in_force.is_some()
}

/// The condition reason (CamelCase, as Kubernetes conditions use) for a hold.
fn hold_reason_word(h: tessera_core::rollout::HoldReason) -> &'static str {
    use tessera_core::rollout::HoldReason as H;
    match h {
        H::ModeNotRecreate => "NotRecreate",
        H::NoRecommendation => "NoRecommendation",
        H::NoPods => "NoPods",
        H::PodsUnknown => "PodAllocationUnknown",
        H::InSync => "InSync",
        H::Settling => "Settling",
        H::Scaling => "Scaling",
        H::RolloutInProgress => "RolloutInProgress",
        H::PoolBusy => "PoolBusy",
        H::DisruptionBudget => "DisruptionBudget",
        H::BelowMinReady => "BelowMinReady",
        H::ComputeOnlyShrink => "ComputeOnlyShrink",
    }
}
