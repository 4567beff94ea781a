//! A GPU node's `ResourceSlice` for [`DRIVER`]: one device per GPU, shareable (`allowMultipleAllocations`), with
//! two consumable capacities the real kube-scheduler books claims against (it never lets their sum pass a device's
//! value, so Tessera never double-books either):
//! - [`MEMORY`]: MiB a tenant can really use — the device's memory minus what the driver and a CUDA context hold
//!   (the pool's `memoryHeadroomMiB`; KAI#2212 is what happens when no scheduler counts it). A request must be at
//!   least [`MIN_MEMORY_MIB`], in steps of 1 MiB; a claim that names no memory takes the whole usable memory.
//! - [`COMPUTE`]: milli-GPUs, as many as the pool's `computeOversubscription` hands out (an MPS share caps SMs,
//!   it reserves nothing: see `docs/fractional-gpus.md`). A request is at least [`COMPUTE_STEP_MILLI`], in steps of
//!   it (MPS's active-thread percentage has whole percents); a claim that names none takes one whole GPU's.
//!
//! The slice is the pool of one node (`pool.name` = the node), one slice per pool, so its generation only moves when
//! its devices change.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute, DeviceCapacity, ResourcePool,
    ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tessera_core::pack::{GPU_COMPUTE_MILLI, GpuShape};

use crate::quantity::{mib, milli, of_mib, of_milli};
use crate::{COMPUTE, DRIVER, LABEL_MANAGED_BY, MANAGED_BY, MEMORY};

/// The smallest memory request a device takes, MiB: below it no vLLM starts.
pub const MIN_MEMORY_MIB: u64 = 256;
/// The compute request's granularity, milli-GPUs: one percent of the SMs, MPS's unit.
pub const COMPUTE_STEP_MILLI: u32 = 10;

/// Attribute: the GPU's product name (as NVML reports it, `NVIDIA H100 80GB HBM3`).
pub const ATTR_PRODUCT: &str = "productName";
/// Attribute: the GPU's UUID (`GPU-…`), when known.
pub const ATTR_UUID: &str = "uuid";
/// Attribute: the device's whole memory, MiB (capacity [`MEMORY`] is what a tenant can use of it).
pub const ATTR_MEMORY_MIB: &str = "memoryMiB";
/// Attribute: how tenants share it (`mps`, `time-slicing`, `none`).
pub const ATTR_SHARING: &str = "sharing";
/// Attribute: the GPU's index on its node.
pub const ATTR_INDEX: &str = "index";

/// One GPU as the slice publishes it.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuDevice {
    /// Its index on the node (`gpu-<index>` is the device name).
    pub index: u32,
    /// Its UUID, when a real driver reported it.
    pub uuid: Option<String>,
    /// Its product name, when known.
    pub product: Option<String>,
    /// Its memory, headroom and compute capacity (the pool's shape).
    pub shape: GpuShape,
    /// How tenants share it.
    pub sharing: String,
}

/// The device name of the GPU at `index`.
pub fn device_name(index: u32) -> String {
    format!("gpu-{index}")
}

/// How many of `resource` (the pool's `resourceName`, e.g. `nvidia.com/gpu`) a node's status says it can
/// allocate: what a device plugin advertised. `None` when the node lists none or a count that is no whole number.
pub fn allocatable_gpus(node: &k8s_openapi::api::core::v1::Node, resource: &str) -> Option<u32> {
    let q = node.status.as_ref()?.allocatable.as_ref()?.get(resource)?;
    q.0.parse::<u32>().ok()
}

/// The slice's name for `node`: the node's name (a DNS subdomain) and the driver, so every driver's slices of one
/// node can coexist.
pub fn slice_name(node: &str) -> String {
    format!("{node}-{DRIVER}")
}

/// The `ResourceSlice` publishing `gpus` of `node`, as generation `generation` of the node's pool.
pub fn node_slice(node: &str, gpus: &[GpuDevice], generation: i64) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(slice_name(node)),
            labels: Some([(LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string())].into()),
            ..ObjectMeta::default()
        },
        spec: ResourceSliceSpec {
            driver: DRIVER.into(),
            node_name: Some(node.into()),
            pool: ResourcePool {
                name: node.into(),
                generation,
                resource_slice_count: 1,
            },
            devices: Some(gpus.iter().map(device).collect()),
            ..ResourceSliceSpec::default()
        },
    }
}

fn device(g: &GpuDevice) -> Device {
    let usable = g.shape.usable_memory_mib();
    let mut attributes = BTreeMap::from([
        (ATTR_INDEX.to_string(), int(i64::from(g.index))),
        (
            ATTR_MEMORY_MIB.to_string(),
            int(g.shape.memory_mib.try_into().unwrap_or(i64::MAX)),
        ),
        (ATTR_SHARING.to_string(), string(&g.sharing)),
    ]);
    if let Some(u) = &g.uuid {
        attributes.insert(ATTR_UUID.into(), string(u));
    }
    if let Some(p) = &g.product {
        attributes.insert(ATTR_PRODUCT.into(), string(p));
    }
    let capacity = BTreeMap::from([
        (
            MEMORY.to_string(),
            DeviceCapacity {
                value: of_mib(usable),
                request_policy: Some(CapacityRequestPolicy {
                    default: Some(of_mib(usable)),
                    valid_range: Some(CapacityRequestPolicyRange {
                        min: of_mib(MIN_MEMORY_MIB.min(usable)),
                        max: Some(of_mib(usable)),
                        step: Some(of_mib(1)),
                    }),
                    valid_values: None,
                }),
            },
        ),
        (
            COMPUTE.to_string(),
            DeviceCapacity {
                value: of_milli(g.shape.compute_milli),
                request_policy: Some(CapacityRequestPolicy {
                    default: Some(of_milli(GPU_COMPUTE_MILLI)),
                    valid_range: Some(CapacityRequestPolicyRange {
                        min: of_milli(COMPUTE_STEP_MILLI),
                        // One tenant never holds more than one GPU's SMs, whatever the oversubscription.
                        max: Some(of_milli(GPU_COMPUTE_MILLI)),
                        step: Some(of_milli(COMPUTE_STEP_MILLI)),
                    }),
                    valid_values: None,
                }),
            },
        ),
    ]);
    Device {
        name: device_name(g.index),
        allow_multiple_allocations: Some(true),
        attributes: Some(attributes),
        capacity: Some(capacity),
        ..Device::default()
    }
}

fn int(v: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(v),
        ..DeviceAttribute::default()
    }
}

fn string(v: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(v.to_string()),
        ..DeviceAttribute::default()
    }
}

/// One device of a published slice, read back: where claims can be allocated and how much each capacity holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedDevice {
    /// The slice's pool (the node, for Tessera's slices).
    pub pool: String,
    /// The node, when the slice is node-local.
    pub node: Option<String>,
    /// The device's name.
    pub device: String,
    /// Consumable memory, MiB.
    pub memory_mib: u64,
    /// Consumable compute, milli.
    pub compute_milli: u32,
    /// The device's whole memory, MiB (its attribute; the capacity when absent).
    pub total_memory_mib: u64,
    /// Its UUID attribute, if any.
    pub uuid: Option<String>,
}

/// The devices of `slice` if it is [`DRIVER`]'s; a device whose capacities cannot be read is left out (with its
/// reason in the error list) rather than guessed: room that is not known is not handed out.
pub fn published(slice: &ResourceSlice) -> (Vec<PublishedDevice>, Vec<String>) {
    let mut out = Vec::new();
    let mut errors = Vec::new();
    if slice.spec.driver != DRIVER {
        return (out, errors);
    }
    for d in slice.spec.devices.iter().flatten() {
        let cap = |name: &str| d.capacity.as_ref().and_then(|c| c.get(name)).map(|c| &c.value);
        let (Some(m), Some(c)) = (cap(MEMORY), cap(COMPUTE)) else {
            errors.push(format!("device {} has no {MEMORY} or {COMPUTE} capacity", d.name));
            continue;
        };
        match (mib(m), milli(c)) {
            (Ok(memory_mib), Ok(compute_milli)) => {
                let attr = |name: &str| d.attributes.as_ref().and_then(|a| a.get(name));
                out.push(PublishedDevice {
                    pool: slice.spec.pool.name.clone(),
                    node: slice.spec.node_name.clone(),
                    device: d.name.clone(),
                    memory_mib,
                    compute_milli,
                    total_memory_mib: attr(ATTR_MEMORY_MIB)
                        .and_then(|a| a.int)
                        .and_then(|v| u64::try_from(v).ok())
                        .unwrap_or(memory_mib),
                    uuid: attr(ATTR_UUID).and_then(|a| a.string.clone()),
                });
            }
            (Err(e), _) | (_, Err(e)) => errors.push(format!("device {}: {e}", d.name)),
        }
    }
    (out, errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32) -> GpuDevice {
        GpuDevice {
            index,
            uuid: Some(format!("GPU-{index}")),
            product: Some("NVIDIA A100-SXM4-80GB".into()),
            shape: GpuShape::new(81920, 1024)
                .and_then(|s| s.with_compute_oversubscription(2.0))
                .expect("shape"),
            sharing: "mps".into(),
        }
    }

    #[test]
    fn a_slice_offers_usable_memory_and_oversubscribed_compute_and_reads_back() {
        let s = node_slice("gpu-node-1", &[gpu(0), gpu(1)], 3);
        assert_eq!(s.metadata.name.as_deref(), Some("gpu-node-1-gpu.tessera.dev"));
        assert_eq!(s.spec.pool.generation, 3);
        let d = &s.spec.devices.as_ref().expect("devices")[1];
        assert_eq!(d.name, "gpu-1");
        assert_eq!(d.allow_multiple_allocations, Some(true));
        let cap = d.capacity.as_ref().expect("capacity");
        assert_eq!(
            cap[MEMORY].value.0, "80896Mi",
            "81920 minus the 1024 MiB headroom"
        );
        assert_eq!(cap[COMPUTE].value.0, "2000", "two GPUs' worth of MPS caps");
        let range = cap[COMPUTE]
            .request_policy
            .as_ref()
            .and_then(|p| p.valid_range.as_ref())
            .expect("range");
        assert_eq!(range.max.as_ref().map(|q| q.0.as_str()), Some("1000"));
        let (back, errors) = published(&s);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(back.len(), 2);
        assert_eq!(back[0].memory_mib, 80896);
        assert_eq!(back[0].total_memory_mib, 81920);
        assert_eq!(back[0].compute_milli, 2000);
        assert_eq!(back[0].node.as_deref(), Some("gpu-node-1"));
        assert_eq!(back[0].uuid.as_deref(), Some("GPU-0"));
    }

    #[test]
    fn another_drivers_slice_and_unreadable_capacities_are_not_counted() {
        let mut s = node_slice("n", &[gpu(0)], 1);
        s.spec.driver = "gpu.nvidia.com".into();
        assert_eq!(published(&s), (vec![], vec![]));
        let mut s = node_slice("n", &[gpu(0)], 1);
        if let Some(d) = s.spec.devices.as_mut().and_then(|d| d.first_mut()) {
            d.capacity
                .as_mut()
                .expect("capacity")
                .get_mut(MEMORY)
                .expect("memory")
                .value
                .0 = "lots".into();
        }
        let (back, errors) = published(&s);
        assert!(back.is_empty());
        assert!(
            errors[0].contains("gpu-0") && errors[0].contains("lots"),
            "{errors:?}"
        );
    }
}
