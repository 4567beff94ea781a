//! The Events a reconcile publishes about who scales a workload: a conflict of owners (once per message) and, with
//! `scaledBy: KEDA`, each new decision KEDA is to apply. Apart from `owners.rs` (which reads the HPAs into the
//! context) so that the context and what publishes through it do not import each other.

use kube::runtime::events::EventType;

use super::context::{Context, publish};
use super::status;
use crate::crd::InferenceAutoscaler;

/// A Warning Event the first time a conflict is seen (or its message changes), like an invalid spec.
pub async fn warn_conflict(ctx: &Context, obj: &InferenceAutoscaler, message: &str) {
    let known = obj.status.as_ref().is_some_and(|s| {
        s.conditions.iter().any(|c| {
            c.type_ == status::ABLE_TO_SCALE && c.reason == "ScaleOwnerConflict" && c.message == message
        })
    });
    if !known {
        publish(
            ctx,
            obj,
            EventType::Warning,
            "ScaleOwnerConflict",
            "Scale",
            message,
        )
        .await;
    }
}

/// With `scaledBy: KEDA`, a new decision is an Event as a scale is (`DecidedForKEDA`, action `DecideN`): KEDA
/// applies it, and `kubectl describe` should still say what Tessera decided and why.
pub async fn announce_decision(
    ctx: &Context,
    obj: &InferenceAutoscaler,
    decision: &tessera_core::scale::ScaleDecision,
) {
    let published = obj.status.as_ref().map(|s| s.desired_replicas);
    let desired = i32::try_from(decision.desired_replicas).unwrap_or(i32::MAX);
    if published == Some(desired) {
        return;
    }
    let note = format!("Desired: {desired} (KEDA scales); reason: {}", decision.message);
    publish(
        ctx,
        obj,
        EventType::Normal,
        "DecidedForKEDA",
        &format!("Decide{desired}"),
        &note,
    )
    .await;
}
