//! The controller's side of the workload class: what it gathers for the round's class step (the pin, the owner,
//! a Kueue queue, the activators' request mix), the class a restarted controller resumes from status, and the
//! Event that says when the class changed, from what to what and why. The rule is in `tessera_core::class`.

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::events::EventType;
use tessera_core::class::{ClassRound, ClassSignals, ClassState, Declared, RequestMix, WorkloadClass};
use tessera_core::scale::Timestamp;
use tracing::info;

use super::context::{Context, publish};
use crate::crd::InferenceAutoscaler;

/// The label Kueue reads to queue a workload (on the Job, and on the pods of its pod integration).
pub const KUEUE_QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";

/// What the round's class step reads for `obj`, from its pods (already listed for the round: no extra call to
/// the API server) and the activators' `mix`.
pub fn signals(obj: &InferenceAutoscaler, pods: &[Pod], mix: RequestMix) -> ClassSignals {
    let target_kind = &obj.spec.scale_target_ref.kind;
    // The workload's own kind when it is a Job-like one; else the pods' controlling owner (a Job's pods name it).
    let owner_kind = if matches!(target_kind.as_str(), "Job" | "CronJob") {
        Some(target_kind.clone())
    } else {
        pods.iter()
            .flat_map(|p| p.metadata.owner_references.iter().flatten())
            .find(|o| o.controller == Some(true))
            .map(|o| o.kind.clone())
    };
    let label = |labels: Option<&std::collections::BTreeMap<String, String>>| {
        labels.and_then(|l| l.get(KUEUE_QUEUE_LABEL)).cloned()
    };
    let kueue_queue = label(obj.metadata.labels.as_ref())
        .or_else(|| pods.iter().find_map(|p| label(p.metadata.labels.as_ref())));
    ClassSignals {
        declared: Declared {
            pinned: obj.spec.workload_class.pinned(),
            owner_kind,
            kueue_queue,
            ..Declared::default()
        },
        mix,
        explicit: obj.spec.class_explicit(),
    }
}

/// The class a restarted controller (or a new leader) resumes from `status.workloadClass` and `classSince`, so a
/// restart neither resets the dwell nor drops a model back to real-time for half an hour. Nothing to resume (or
/// a class name from an older release): a fresh state.
pub fn resume(obj: &InferenceAutoscaler) -> ClassState {
    let Some(st) = obj.status.as_ref() else {
        return ClassState::default();
    };
    let class = st.workload_class.as_deref().and_then(WorkloadClass::from_name);
    let since = st
        .class_since
        .as_ref()
        .and_then(|t| u64::try_from(t.0.as_millisecond()).ok());
    match (class, since) {
        (Some(class), Some(since)) => ClassState::resume(
            class,
            Timestamp::from_millis(since),
            st.workload_class_reason.clone().unwrap_or_default(),
        ),
        _ => ClassState::default(),
    }
}

/// A Normal Event when this round changed the class: from what to what, why, and the policy it brings.
pub async fn announce(ctx: &Context, obj: &InferenceAutoscaler, c: &ClassRound) {
    let Some(from) = c.held.changed_from else {
        return;
    };
    let to = c.held.class;
    let note = format!(
        "Workload class changed from {from} to {to} ({}): {}. Policy now: {}; from the class: {}",
        c.held.source.as_str(),
        c.held.reason,
        c.resolved.summary(),
        c.resolved.from_class.join(", ")
    );
    info!(%from, %to, source = c.held.source.as_str(), reason = %c.held.reason, "workload class changed");
    ctx.metrics.class_changed(from, to);
    // kube's Recorder folds events with the same (reason, action) into one series that keeps the first note:
    // naming the action after the new class keeps each change visible with its own reason.
    let action = format!("ClassTo{}", upper_first(to.as_str()));
    publish(
        ctx,
        obj,
        EventType::Normal,
        "WorkloadClassChanged",
        &action,
        &note,
    )
    .await;
}

fn upper_first(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}
