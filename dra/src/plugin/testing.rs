//! Builders for the plugin's tests (this crate's and the binary's): an allocated claim as the scheduler leaves
//! it, and an in-memory [`ClaimSource`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::source::ClaimSource;
use crate::claim::{ClaimShape, template};
use crate::quantity::{of_mib, of_milli};
use crate::{COMPUTE, DRIVER, MEMORY, REQUEST};

/// The share ID of every allocation built here (the API server takes only a lowercase RFC 4122 UUID).
pub const SHARE_ID: &str = "3f6c2b1e-8d4a-4c7e-9b0f-5a2d1e6c7b8a";

/// A claim `namespace/name` with `uid`, asking for `shape` the way Tessera's templates do, allocated on
/// `node`'s `device` with `shape` consumed (a share of a shared device).
pub fn allocated_claim(
    namespace: &str,
    name: &str,
    uid: &str,
    node: &str,
    device: &str,
    shape: ClaimShape,
) -> ResourceClaim {
    let mut c = unallocated_claim(namespace, name, uid, shape);
    c.status = Some(ResourceClaimStatus {
        allocation: Some(allocation(node, device, shape)),
        ..ResourceClaimStatus::default()
    });
    c
}

/// The claim of [`allocated_claim`] before the scheduler allocated it.
pub fn unallocated_claim(namespace: &str, name: &str, uid: &str, shape: ClaimShape) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            uid: Some(uid.into()),
            ..ObjectMeta::default()
        },
        spec: template(namespace, "model", shape).spec.spec,
        status: None,
    }
}

/// The allocation the scheduler writes for one share of `node`'s `device` consuming `shape` (what a test writes
/// through the status subresource where no scheduler runs).
pub fn allocation(node: &str, device: &str, shape: ClaimShape) -> AllocationResult {
    AllocationResult {
        devices: Some(DeviceAllocationResult {
            results: Some(vec![DeviceRequestAllocationResult {
                driver: DRIVER.into(),
                pool: node.into(),
                device: device.into(),
                request: REQUEST.into(),
                consumed_capacity: Some(
                    [
                        (MEMORY.to_string(), of_mib(shape.memory_mib)),
                        (COMPUTE.to_string(), of_milli(shape.compute_milli)),
                    ]
                    .into(),
                ),
                share_id: Some(SHARE_ID.into()),
                ..DeviceRequestAllocationResult::default()
            }]),
            ..DeviceAllocationResult::default()
        }),
        ..AllocationResult::default()
    }
}

/// Claims held in memory, by `namespace/name`; [`FakeClaims::fail`] makes every read fail, and reads are counted.
#[derive(Debug, Clone, Default)]
pub struct FakeClaims {
    inner: Arc<Mutex<Fake>>,
}

#[derive(Debug, Default)]
struct Fake {
    claims: BTreeMap<String, ResourceClaim>,
    failing: Option<String>,
    hanging: bool,
    reads: usize,
}

impl FakeClaims {
    /// Adds or replaces `claim`.
    pub fn put(&self, claim: ResourceClaim) {
        let key = format!(
            "{}/{}",
            claim.metadata.namespace.as_deref().unwrap_or_default(),
            claim.metadata.name.as_deref().unwrap_or_default()
        );
        self.lock().claims.insert(key, claim);
    }

    /// Every read from now on fails with `message` (`None`: reads work again).
    pub fn fail(&self, message: Option<&str>) {
        self.lock().failing = message.map(str::to_string);
    }

    /// Every read from now on never answers (`false`: reads answer again).
    pub fn hang(&self, hanging: bool) {
        self.lock().hanging = hanging;
    }

    /// How many reads were made.
    pub fn reads(&self) -> usize {
        self.lock().reads
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Fake> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl ClaimSource for FakeClaims {
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, String> {
        let answer = {
            let mut f = self.lock();
            f.reads += 1;
            if f.hanging {
                None
            } else if let Some(m) = &f.failing {
                Some(Err(m.clone()))
            } else {
                Some(Ok(f.claims.get(&format!("{namespace}/{name}")).cloned()))
            }
        };
        match answer {
            Some(a) => a,
            None => std::future::pending().await,
        }
    }
}
