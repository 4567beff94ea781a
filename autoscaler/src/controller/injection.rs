//! Whether the target's pods run Tessera's sidecar: the `SidecarsInjected` condition.
//!
//! The webhook fails open (`failurePolicy: Ignore`): when it is down, or when it declines a pod (the reasons are
//! Events on the pod), the pod is admitted unchanged and runs without the sidecar. The controller cannot read such a
//! replica's signals (it counts as missing data, which never scales down), so nothing else would tell the user why a
//! model is not being right-sized. This condition does, naming the pods and what to do.

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::events::EventType;
use tessera_core::wire::sidecar::CONTAINER_NAME;

use super::context::{Context, publish};
use crate::crd::InferenceAutoscaler;

/// The condition type.
pub const SIDECARS_INJECTED: &str = "SidecarsInjected";

/// How many pods a message names before it says "and N more".
const NAMED: usize = 5;

/// The condition for the target's pods: `(status, reason, message)`.
pub fn condition(pods: &[Pod]) -> (bool, &'static str, String) {
    let live: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    let bare: Vec<&str> = live
        .iter()
        .filter(|p| !has_sidecar(p))
        .filter_map(|p| p.metadata.name.as_deref())
        .collect();
    if bare.is_empty() {
        let message = if live.is_empty() {
            "no pods to check".to_owned()
        } else {
            format!("every pod of the target ({}) runs {CONTAINER_NAME}", live.len())
        };
        return (true, "AllPodsInjected", message);
    }
    let mut names = bare.iter().take(NAMED).copied().collect::<Vec<_>>().join(", ");
    if bare.len() > NAMED {
        names.push_str(&format!(" and {} more", bare.len() - NAMED));
    }
    let message = format!(
        "{} of {} pods run without {CONTAINER_NAME} ({names}): the webhook was unreachable when they were created \
         (failurePolicy: Ignore admits a pod unchanged) or declined them (the Events on each pod say why). Their \
         signals cannot be read, so they never count toward a scale-down and get no memory or compute \
         recommendation; once the webhook is up, delete them (kubectl delete pod) and their replacements are \
         injected",
        bare.len(),
        live.len()
    );
    (false, "PodsWithoutSidecar", message)
}

/// The round's condition for `obj`'s pods, with a Warning Event when pods without the sidecar first appear (the
/// condition was not already False), so `kubectl describe` shows the moment too.
pub async fn announce(
    ctx: &Context,
    obj: &InferenceAutoscaler,
    pods: &[Pod],
) -> (bool, &'static str, String) {
    let (ok, reason, message) = condition(pods);
    let was_false = obj
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == SIDECARS_INJECTED))
        .is_some_and(|c| c.status == "False");
    if !ok && !was_false {
        tracing::warn!(%message, "pods without the sidecar");
        publish(ctx, obj, EventType::Warning, reason, "CheckPods", &message).await;
    }
    (ok, reason, message)
}

/// A pod runs the sidecar when a container of that name is in it: injected (a native sidecar, an init container
/// that keeps running) or brought by the pod itself.
fn has_sidecar(p: &Pod) -> bool {
    p.spec.as_ref().is_some_and(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
            .any(|c| c.name == CONTAINER_NAME)
    })
}

/// A pod spec as the webhook leaves it (vLLM and the native sidecar), for the controller's tests' pods.
#[cfg(test)]
pub fn injected_spec() -> serde_json::Value {
    serde_json::json!({"containers": [{"name": "vllm"}],
                       "initContainers": [{"name": CONTAINER_NAME, "restartPolicy": "Always"}]})
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn pod(name: &str, containers: &[&str], inits: &[&str], deleting: bool) -> Pod {
        let c = |n: &&str| json!({"name": n, "image": "x"});
        let mut meta = json!({"name": name});
        if deleting {
            meta["deletionTimestamp"] = json!("2026-11-27T00:00:00Z");
        }
        serde_json::from_value(json!({
            "metadata": meta,
            "spec": {"containers": containers.iter().map(c).collect::<Vec<_>>(),
                     "initContainers": inits.iter().map(c).collect::<Vec<_>>()}
        }))
        .unwrap()
    }

    #[test]
    fn injected_native_sidecars_and_pods_bringing_their_own_count_as_injected() {
        let pods = [
            pod("a", &["vllm"], &[CONTAINER_NAME], false),
            pod("b", &["vllm", CONTAINER_NAME], &[], false),
        ];
        let (ok, reason, message) = condition(&pods);
        assert!(ok, "{message}");
        assert_eq!(reason, "AllPodsInjected");
        assert!(condition(&[]).0);
    }

    #[test]
    fn a_pod_admitted_bare_is_named_with_what_to_do_and_a_terminating_one_is_not() {
        let pods = [
            pod("a", &["vllm"], &[CONTAINER_NAME], false),
            pod("bare", &["vllm"], &[], false),
            pod("going", &["vllm"], &[], true),
        ];
        let (ok, reason, message) = condition(&pods);
        assert!(!ok);
        assert_eq!(reason, "PodsWithoutSidecar");
        assert!(
            message.starts_with("1 of 2 pods run without tessera-sidecar (bare)"),
            "{message}"
        );
        assert!(message.contains("kubectl delete pod"), "{message}");
    }

    #[test]
    fn many_bare_pods_are_named_up_to_a_bound() {
        let names: Vec<String> = (0..12).map(|i| format!("p{i}")).collect();
        let pods: Vec<Pod> = names.iter().map(|n| pod(n, &["vllm"], &[], false)).collect();
        let (_, _, message) = condition(&pods);
        assert!(message.contains("p0, p1, p2, p3, p4 and 7 more"), "{message}");
    }
}
