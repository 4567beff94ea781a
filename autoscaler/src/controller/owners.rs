//! Who else scales an InferenceAutoscaler's workload: the HorizontalPodAutoscalers that target it, KEDA's among
//! them (KEDA makes one HPA per ScaledObject and labels it). The rule that reads them is
//! [`tessera_core::keda::ownership`]: one owner per `/scale`.

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use kube::api::Api;
use tessera_core::keda::OtherScaler;

use crate::crd::ScaleTargetRef;
use crate::kube_client::Cached;

/// The label KEDA puts on the HPA it makes for a ScaledObject, naming it.
pub const KEDA_SCALED_OBJECT_LABEL: &str = "scaledobject.keda.sh/name";

/// Every HorizontalPodAutoscaler the controller may see, watched (one watch, not a list per reconcile); `None`
/// until the first list arrived or where no watch runs.
#[derive(Debug, Clone, Default)]
pub struct HpaCache(Cached<HorizontalPodAutoscaler>);

impl HpaCache {
    /// Starts watching `api`; the cache answers once the first list is in. A watch that cannot start (RBAC of an
    /// older chart) leaves it unanswered: the spec's `scaledBy` is then taken at its word.
    pub fn start(api: Api<HorizontalPodAutoscaler>, stop: tokio::sync::watch::Receiver<bool>) -> Self {
        Self(Cached::start(api, "HorizontalPodAutoscalers", |_| {}, stop))
    }

    /// The HPAs in `namespace` whose `scaleTargetRef` is `target`; `None` while the cache has no list.
    pub fn other_scalers(&self, namespace: &str, target: &ScaleTargetRef) -> Option<Vec<OtherScaler>> {
        let store = self.0.store()?;
        let hpas: Vec<HorizontalPodAutoscaler> = store
            .state()
            .iter()
            .filter(|h| h.metadata.namespace.as_deref() == Some(namespace))
            .map(|h| (**h).clone())
            .collect();
        Some(targeting(&hpas, target))
    }
}

/// The HPAs of `hpas` that scale `target`.
pub fn targeting(hpas: &[HorizontalPodAutoscaler], target: &ScaleTargetRef) -> Vec<OtherScaler> {
    let group = |api_version: &str| api_version.split_once('/').map_or("", |(g, _)| g).to_owned();
    hpas.iter()
        .filter(|h| {
            let r = &h.spec.scale_target_ref;
            r.kind == target.kind
                && r.name == target.name
                && group(r.api_version.as_deref().unwrap_or_default()) == group(&target.api_version)
        })
        .map(|h| OtherScaler {
            hpa: h.metadata.name.clone().unwrap_or_default(),
            scaled_object: h
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(KEDA_SCALED_OBJECT_LABEL).cloned()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::autoscaling::v2::{CrossVersionObjectReference, HorizontalPodAutoscalerSpec};
    use kube::api::ObjectMeta;

    use super::*;

    fn hpa(name: &str, kind: &str, target: &str, keda: Option<&str>) -> HorizontalPodAutoscaler {
        HorizontalPodAutoscaler {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: keda.map(|so| [(KEDA_SCALED_OBJECT_LABEL.to_owned(), so.to_owned())].into()),
                ..ObjectMeta::default()
            },
            spec: HorizontalPodAutoscalerSpec {
                scale_target_ref: CrossVersionObjectReference {
                    api_version: Some("apps/v1".into()),
                    kind: kind.into(),
                    name: target.into(),
                },
                max_replicas: 3,
                ..HorizontalPodAutoscalerSpec::default()
            },
            status: None,
        }
    }

    #[test]
    fn only_the_hpas_on_the_same_workload_count() {
        let target = ScaleTargetRef {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            name: "chat".into(),
        };
        let hpas = [
            hpa("keda-hpa-chat", "Deployment", "chat", Some("chat")),
            hpa("other", "Deployment", "code", None),
            hpa("sts", "StatefulSet", "chat", None),
        ];
        assert_eq!(
            targeting(&hpas, &target),
            vec![OtherScaler {
                hpa: "keda-hpa-chat".into(),
                scaled_object: Some("chat".into())
            }]
        );
    }
}
