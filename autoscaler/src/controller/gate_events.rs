//! The start-up gate's bounded wait, made visible: a fractional pod whose sidecar opened its gate because the GPU's
//! start-up Lease was held past `--gate-max-wait` (a co-tenant that squats the Lease, or one whose vLLM never
//! turned healthy) started without the gate's protection. The sidecar runs with the tenant's own ServiceAccount,
//! which may not write Events; it reports the opening in `/v1/status` (`startup_gate`), and the controller, which
//! reads that document each sync, publishes one Warning Event per pod on the InferenceAutoscaler.

use std::collections::HashSet;
use std::sync::Mutex;

use kube::runtime::events::EventType;
use tessera_core::wire::sidecar::SidecarStatus;

use super::context::{Context, publish};
use crate::crd::InferenceAutoscaler;

/// Pods already reported, bounded: past this many the set starts over (a pod reported twice is the worst case).
const MAX_REPORTED: usize = 10_000;

/// Whether `pod` is new to `reported` (the pods whose gate timeout has an Event already), recording it.
fn first(reported: &Mutex<HashSet<String>>, pod: &str) -> bool {
    let mut set = reported.lock().unwrap_or_else(|e| e.into_inner());
    if set.len() >= MAX_REPORTED {
        set.clear();
    }
    set.insert(pod.to_owned())
}

/// The Event's note for a pod whose gate opened by `wait_timeout`, or `None` for any other document.
pub fn note(pod: &str, doc: &SidecarStatus) -> Option<String> {
    let gate = doc.startup_gate.as_ref()?;
    (gate.reason.as_deref() == Some("wait_timeout")).then(|| {
        format!(
            "{pod} started without the GPU's start-up gate: its Lease was held by {} past the sidecar's \
             --gate-max-wait, so vLLM may have started beside another one loading (memory profiling can then \
             misjudge the free memory). See who holds it with `kubectl describe lease` in the pool namespace \
             (docs/fractional-gpus.md, \"Start-up gate\")",
            gate.holder.as_deref().unwrap_or("an unknown holder")
        )
    })
}

/// The gate events' part of a reconcile: a pod that started because its GPU's start-up Lease was held past the
/// gate's bound gets one Warning Event. `ready_pods` (pod name, sidecar URL) and `sidecars` are in the same order.
pub async fn publish_round(
    ctx: &Context,
    obj: &InferenceAutoscaler,
    ns: &str,
    ready_pods: &[(String, String)],
    sidecars: &[Option<SidecarStatus>],
) {
    let docs: Vec<(String, &SidecarStatus)> = ready_pods
        .iter()
        .zip(sidecars.iter())
        .filter_map(|((pod, _), st)| st.as_ref().map(|st| (format!("{ns}/{pod}"), st)))
        .collect();
    publish_timeouts(ctx, obj, &docs).await;
}

/// Publishes the Event for every pod of `docs` (`namespace/name`, its sidecar's document) whose gate opened by
/// timeout and was not reported before.
pub async fn publish_timeouts(ctx: &Context, obj: &InferenceAutoscaler, docs: &[(String, &SidecarStatus)]) {
    for (pod, doc) in docs {
        if let Some(note) = note(pod, doc)
            && first(&ctx.gate_timeouts, pod)
        {
            publish(
                ctx,
                obj,
                EventType::Warning,
                "StartupGateTimedOut",
                "Start",
                &note,
            )
            .await;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn doc(gate: serde_json::Value) -> SidecarStatus {
        crate::test_support::sidecar_doc(serde_json::json!({ "startup_gate": gate }))
    }

    #[test]
    fn only_a_timed_out_gate_makes_an_event_and_only_once_per_pod() {
        let timed_out =
            doc(serde_json::json!({"state": "open", "reason": "wait_timeout", "holder": "team-b/squatter"}));
        let n = note("team-a/llama-0", &timed_out).unwrap();
        assert!(
            n.contains("team-b/squatter") && n.contains("--gate-max-wait"),
            "{n}"
        );
        for fine in [
            doc(serde_json::json!({"state": "open", "reason": "vllm_ready"})),
            doc(serde_json::json!({"state": "holding"})),
            doc(serde_json::Value::Null),
        ] {
            assert!(note("team-a/llama-0", &fine).is_none());
        }
        let seen = Mutex::new(HashSet::new());
        assert!(first(&seen, "team-a/llama-0"));
        assert!(!first(&seen, "team-a/llama-0"), "one Event per pod");
        assert!(first(&seen, "team-a/llama-1"));
    }
}
