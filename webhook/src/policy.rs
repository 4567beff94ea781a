//! Which InferenceAutoscaler governs a pod (pure; the cache that feeds it lives in [`crate::admit`]).
//!
//! At admission a Deployment's pod has no name yet, but it already carries its owner: the ReplicaSet, named
//! `<deployment>-<pod-template-hash>`, with the same hash in the pod's `pod-template-hash` label. So the
//! Deployment is known without reading the ReplicaSet from the API (which would cost a request per admission).
//! A pod owned directly by a StatefulSet (or any other workload) matches a policy whose `scaleTargetRef` names
//! that owner. Where no owner leads to a policy, the pod label `tessera.dev/autoscaler: <name>` names one.

use k8s_openapi::api::core::v1::Pod;
use tessera_api::crd::InferenceAutoscaler;

/// Pod label: the InferenceAutoscaler of this pod, where its owner chain does not lead to one.
pub const LABEL_AUTOSCALER: &str = "tessera.dev/autoscaler";

/// The workload that owns `pod`, as (kind, name): the Deployment behind a ReplicaSet where the pod-template-hash
/// says so, else the controller owner itself.
pub fn owner_workload(pod: &Pod) -> Option<(String, String)> {
    let owner = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))?;
    if owner.kind == "ReplicaSet"
        && let Some(hash) = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("pod-template-hash"))
        && let Some(deployment) = owner.name.strip_suffix(&format!("-{hash}"))
        && !deployment.is_empty()
    {
        return Some(("Deployment".into(), deployment.into()));
    }
    Some((owner.kind.clone(), owner.name.clone()))
}

/// The policy for `pod` in `namespace` among `policies` (all namespaces may be mixed in).
pub fn find<'a, I>(pod: &Pod, namespace: &str, policies: I) -> Option<&'a InferenceAutoscaler>
where
    I: IntoIterator<Item = &'a InferenceAutoscaler> + Clone,
{
    let in_ns = |p: &&InferenceAutoscaler| p.metadata.namespace.as_deref() == Some(namespace);
    if let Some((kind, name)) = owner_workload(pod)
        && let Some(p) = policies
            .clone()
            .into_iter()
            .filter(in_ns)
            .find(|p| p.spec.scale_target_ref.kind == kind && p.spec.scale_target_ref.name == name)
    {
        return Some(p);
    }
    let by_label = pod.metadata.labels.as_ref()?.get(LABEL_AUTOSCALER)?;
    policies
        .into_iter()
        .filter(in_ns)
        .find(|p| p.metadata.name.as_deref() == Some(by_label.as_str()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn ias(ns: &str, name: &str, kind: &str, target: &str) -> InferenceAutoscaler {
        serde_json::from_value(json!({
            "apiVersion": "tessera.dev/v1alpha1", "kind": "InferenceAutoscaler",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"scaleTargetRef": {"kind": kind, "name": target}, "maxReplicas": 2}
        }))
        .unwrap()
    }

    fn pod(owner_kind: &str, owner: &str, hash: Option<&str>, label: Option<&str>) -> Pod {
        let mut labels = serde_json::Map::new();
        if let Some(h) = hash {
            labels.insert("pod-template-hash".into(), json!(h));
        }
        if let Some(l) = label {
            labels.insert(LABEL_AUTOSCALER.into(), json!(l));
        }
        serde_json::from_value(json!({"metadata": {"generateName": "x-", "labels": labels,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": owner_kind, "name": owner, "uid": "u", "controller": true}]}}))
        .unwrap()
    }

    #[test]
    fn a_replicaset_leads_to_its_deployment() {
        let all = [
            ias("team", "llama", "Deployment", "llama-8b"),
            ias("other", "llama", "Deployment", "llama-8b"),
            ias("team", "sts", "StatefulSet", "qwen"),
        ];
        let p = pod("ReplicaSet", "llama-8b-7c9f6d5b8", Some("7c9f6d5b8"), None);
        assert_eq!(owner_workload(&p), Some(("Deployment".into(), "llama-8b".into())));
        let found = find(&p, "team", all.iter()).unwrap();
        assert_eq!(found.metadata.namespace.as_deref(), Some("team"));
        assert!(
            find(&p, "nowhere", all.iter()).is_none(),
            "tenants are namespaces"
        );
        let s = pod("StatefulSet", "qwen", None, None);
        assert_eq!(
            find(&s, "team", all.iter()).unwrap().metadata.name.as_deref(),
            Some("sts")
        );
        // A ReplicaSet whose name does not end in the hash is matched as a ReplicaSet.
        let odd = pod("ReplicaSet", "handmade", Some("abc"), None);
        assert_eq!(
            owner_workload(&odd),
            Some(("ReplicaSet".into(), "handmade".into()))
        );
        assert!(find(&odd, "team", all.iter()).is_none());
        let labelled = pod("ReplicaSet", "handmade", Some("abc"), Some("llama"));
        assert_eq!(
            find(&labelled, "team", all.iter())
                .unwrap()
                .spec
                .scale_target_ref
                .name,
            "llama-8b"
        );
    }
}
