//! `controller.kubernetes.io/pod-deletion-cost`: the annotation a ReplicaSet reads to choose which pod goes first
//! when it scales down (lowest first). Two rules of this controller set it, each with its own value:
//! consolidation on a pod leaving a draining GPU ([`super::consolidate::LEAVING_COST`]), and the rollout on a pod
//! that runs another allocation than the one in force ([`super::rollout::DRIFTED_COST`]). Both write it here.

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::Value;
use tracing::debug;

use crate::pool::POD_DELETION_COST;

/// Whether the workload kind's pods are removed by a ReplicaSet, the only controller that honours the cost (a
/// Deployment's; a StatefulSet removes its highest ordinal whatever the cost).
pub fn honoured_by(kind: &str) -> bool {
    kind == "Deployment"
}

/// Sets (`Some`) or removes (`None`) the cost on each named pod: one merge patch per pod, touching that one
/// annotation. The first error stops it. Returns how many were written.
pub async fn write(pods: &Api<Pod>, changes: &[(String, Option<i32>)]) -> Result<usize, kube::Error> {
    for (n, (name, cost)) in changes.iter().enumerate() {
        let value = cost.map_or(Value::Null, |c| Value::String(c.to_string()));
        let patch = serde_json::json!({ "metadata": { "annotations": { POD_DELETION_COST: value } } });
        if let Err(e) = pods
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            debug!(pod = %name, written = n, "pod-deletion-cost write failed");
            return Err(e);
        }
    }
    Ok(changes.len())
}
