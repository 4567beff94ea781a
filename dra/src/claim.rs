//! Claims sized from a recommendation, and the allocation the scheduler made for them.
//!
//! One `ResourceClaimTemplate` per (model, allocation): its name carries the allocation ([`template_name`]), so
//! the controller, which writes the template for the allocation in force, and the webhook, which points a new pod
//! at it, agree without a lookup; a new recommendation is a new template, and the pods roll onto it the way they
//! roll onto a new allocation with capacity pods (Recreate, drifted pods first on scale-down). The resource-claim
//! controller makes one claim per pod from it and deletes that claim with the pod.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PodResourceClaim, ResourceClaim as ContainerClaim};
use k8s_openapi::api::resource::v1::{
    CapacityRequirements, DeviceClaim, DeviceRequest, ExactDeviceRequest, ResourceClaim, ResourceClaimSpec,
    ResourceClaimTemplate, ResourceClaimTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::quantity::{mib, milli, of_mib, of_milli};
use crate::{
    COMPUTE, DEVICE_CLASS, DRIVER, LABEL_MANAGED_BY, LABEL_MODEL, MANAGED_BY, MEMORY, POD_CLAIM, REQUEST,
};

/// What one replica's claim asks of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClaimShape {
    /// GPU memory, MiB.
    pub memory_mib: u64,
    /// Compute share, milli-GPUs.
    pub compute_milli: u32,
}

impl ClaimShape {
    /// The shape with compute rounded up to the slice's step ([`crate::slice::COMPUTE_STEP_MILLI`]) — what the
    /// scheduler would consume anyway — so the template's name says what is really booked.
    pub fn rounded(self) -> Self {
        let step = crate::slice::COMPUTE_STEP_MILLI;
        Self {
            memory_mib: self.memory_mib.max(crate::slice::MIN_MEMORY_MIB),
            compute_milli: self.compute_milli.div_ceil(step).max(1) * step,
        }
    }
}

/// The template's name for `model` at `shape`: `<model>-gpu-<memory>mi-<compute>m`, a DNS subdomain (a model name is
/// a DNS label of at most 63 characters, so this stays well under 253).
pub fn template_name(model: &str, shape: ClaimShape) -> String {
    let s = shape.rounded();
    format!("{model}-gpu-{}mi-{}m", s.memory_mib, s.compute_milli)
}

/// The template for `model`'s replicas at `shape`, in `namespace`.
pub fn template(namespace: &str, model: &str, shape: ClaimShape) -> ResourceClaimTemplate {
    let s = shape.rounded();
    let labels: BTreeMap<String, String> = [
        (LABEL_MODEL.to_string(), model.to_string()),
        (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
    ]
    .into();
    ResourceClaimTemplate {
        metadata: ObjectMeta {
            name: Some(template_name(model, s)),
            namespace: Some(namespace.into()),
            labels: Some(labels.clone()),
            ..ObjectMeta::default()
        },
        spec: ResourceClaimTemplateSpec {
            // Copied onto every claim made from it: the pool index tells models apart by this label.
            metadata: Some(ObjectMeta {
                labels: Some(labels),
                ..ObjectMeta::default()
            }),
            spec: claim_spec(s),
        },
    }
}

fn claim_spec(s: ClaimShape) -> ResourceClaimSpec {
    ResourceClaimSpec {
        devices: Some(DeviceClaim {
            requests: Some(vec![DeviceRequest {
                name: REQUEST.into(),
                exactly: Some(ExactDeviceRequest {
                    device_class_name: DEVICE_CLASS.into(),
                    count: Some(1),
                    capacity: Some(CapacityRequirements {
                        requests: Some(
                            [
                                (MEMORY.to_string(), of_mib(s.memory_mib)),
                                (COMPUTE.to_string(), of_milli(s.compute_milli)),
                            ]
                            .into(),
                        ),
                    }),
                    ..ExactDeviceRequest::default()
                }),
                ..DeviceRequest::default()
            }]),
            ..DeviceClaim::default()
        }),
    }
}

/// What the webhook adds to a pod: the pod-level claim from the template (`spec.resourceClaims`), and the
/// container's reference to it (`resources.claims`).
pub fn pod_claims(template: &str) -> (PodResourceClaim, ContainerClaim) {
    (
        PodResourceClaim {
            name: POD_CLAIM.into(),
            resource_claim_template_name: Some(template.into()),
            ..PodResourceClaim::default()
        },
        ContainerClaim {
            name: POD_CLAIM.into(),
            ..ContainerClaim::default()
        },
    )
}

/// One device the scheduler allocated to a claim, from [`DRIVER`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocated {
    /// `namespace/name` of the claim.
    pub claim: String,
    /// The claim's UID (the kubelet plugin's key).
    pub uid: Option<String>,
    /// The model, from the claim's label (copied from its template), if any.
    pub model: Option<String>,
    /// The pool (the node, for Tessera's slices).
    pub pool: String,
    /// The device.
    pub device: String,
    /// Consumed memory, MiB (what the scheduler booked, rounded by the policy).
    pub memory_mib: u64,
    /// Consumed compute, milli.
    pub compute_milli: u32,
    /// The share's ID on a shared device.
    pub share_id: Option<String>,
}

/// The devices [`DRIVER`] holds for `claim`, once allocated (empty before; other drivers' results are not ours).
/// A result without a readable consumed capacity counts as the whole device (`whole(pool, device)`): room that is
/// not known is not handed out.
pub fn allocations(claim: &ResourceClaim, whole: impl Fn(&str, &str) -> ClaimShape) -> Vec<Allocated> {
    let ns = claim.metadata.namespace.as_deref().unwrap_or_default();
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    let model = claim
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_MODEL))
        .cloned();
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref());
    results
        .into_iter()
        .flatten()
        .filter(|r| r.driver == DRIVER)
        .map(|r| {
            let consumed = |k: &str| r.consumed_capacity.as_ref().and_then(|c| c.get(k));
            let whole = whole(&r.pool, &r.device);
            Allocated {
                claim: format!("{ns}/{name}"),
                uid: claim.metadata.uid.clone(),
                model: model.clone(),
                pool: r.pool.clone(),
                device: r.device.clone(),
                memory_mib: consumed(MEMORY)
                    .and_then(|q| mib(q).ok())
                    .unwrap_or(whole.memory_mib),
                compute_milli: consumed(COMPUTE)
                    .and_then(|q| milli(q).ok())
                    .unwrap_or(whole.compute_milli),
                share_id: r.share_id.clone(),
            }
        })
        .collect()
}

/// What `claim` asks for (its request's capacity), if it is one of Tessera's shapes.
pub fn requested(spec: &ResourceClaimSpec) -> Option<ClaimShape> {
    let req = spec
        .devices
        .as_ref()?
        .requests
        .as_ref()?
        .iter()
        .find(|r| r.name == REQUEST)?;
    let caps = req.exactly.as_ref()?.capacity.as_ref()?.requests.as_ref()?;
    Some(ClaimShape {
        memory_mib: mib(caps.get(MEMORY)?).ok()?,
        compute_milli: milli(caps.get(COMPUTE)?).ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{
        AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaimStatus,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    const SHAPE: ClaimShape = ClaimShape {
        memory_mib: 30000,
        compute_milli: 333,
    };

    #[test]
    fn the_template_is_named_by_what_it_books_and_asks_for_it() {
        assert_eq!(
            template_name("llama", SHAPE),
            "llama-gpu-30000mi-340m",
            "compute rounded up to whole percents"
        );
        let t = template("models", "llama", SHAPE);
        assert_eq!(t.metadata.name.as_deref(), Some("llama-gpu-30000mi-340m"));
        let copied = t
            .spec
            .metadata
            .as_ref()
            .and_then(|m| m.labels.as_ref())
            .expect("labels");
        assert_eq!(copied[LABEL_MODEL], "llama");
        assert_eq!(
            requested(&t.spec.spec),
            Some(ClaimShape {
                memory_mib: 30000,
                compute_milli: 340
            })
        );
        let req = &t
            .spec
            .spec
            .devices
            .as_ref()
            .and_then(|d| d.requests.as_ref())
            .expect("requests")[0];
        assert_eq!(
            req.exactly.as_ref().map(|e| e.device_class_name.as_str()),
            Some(DEVICE_CLASS)
        );
        let (pod, container) = pod_claims("llama-gpu-30000mi-340m");
        assert_eq!(pod.name, container.name);
        assert_eq!(
            pod.resource_claim_template_name.as_deref(),
            Some("llama-gpu-30000mi-340m")
        );
    }

    #[test]
    fn allocations_read_consumed_capacity_and_skip_other_drivers() {
        let result = |driver: &str, consumed: Option<(&str, &str)>| DeviceRequestAllocationResult {
            driver: driver.into(),
            pool: "node-a".into(),
            device: "gpu-1".into(),
            request: REQUEST.into(),
            consumed_capacity: consumed.map(|(m, c)| {
                [
                    (MEMORY.to_string(), Quantity(m.into())),
                    (COMPUTE.to_string(), Quantity(c.into())),
                ]
                .into()
            }),
            share_id: Some("a1b2".into()),
            ..DeviceRequestAllocationResult::default()
        };
        let claim = ResourceClaim {
            metadata: ObjectMeta {
                name: Some("llama-abc-tessera-gpu-x".into()),
                namespace: Some("models".into()),
                labels: Some([(LABEL_MODEL.to_string(), "llama".to_string())].into()),
                ..ObjectMeta::default()
            },
            spec: claim_spec(SHAPE.rounded()),
            status: Some(ResourceClaimStatus {
                allocation: Some(AllocationResult {
                    devices: Some(DeviceAllocationResult {
                        results: Some(vec![
                            result(DRIVER, Some(("30000Mi", "340"))),
                            result("gpu.nvidia.com", None),
                            result(DRIVER, None),
                        ]),
                        ..DeviceAllocationResult::default()
                    }),
                    ..AllocationResult::default()
                }),
                ..ResourceClaimStatus::default()
            }),
        };
        let whole = ClaimShape {
            memory_mib: 80896,
            compute_milli: 1000,
        };
        let a = allocations(&claim, |_, _| whole);
        assert_eq!(a.len(), 2, "the other driver's result is not Tessera's");
        assert_eq!(a[0].claim, "models/llama-abc-tessera-gpu-x");
        assert_eq!(a[0].model.as_deref(), Some("llama"));
        assert_eq!((a[0].memory_mib, a[0].compute_milli), (30000, 340));
        assert_eq!(a[0].share_id.as_deref(), Some("a1b2"));
        assert_eq!(
            (a[1].memory_mib, a[1].compute_milli),
            (80896, 1000),
            "unknown consumption: the whole device"
        );
    }
}
