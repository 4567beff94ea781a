//! Small readings of a pod that several roles make the same way.

use k8s_openapi::api::core::v1::Pod;

/// Whether a pod's `Ready` condition is `True` (the kubelet's verdict: its containers run and pass readiness).
pub fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}
