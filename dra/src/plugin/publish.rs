//! The node's `ResourceSlice`, published by the plugin itself as real drivers do: the kubelet removes the
//! node-local slices of a driver that is not registered with it, so on a node with a real kubelet only the plugin
//! can keep its slice (the pool manager publishes the slices of kwok nodes, and leaves alone a slice the plugin
//! took over: see `tessera_pool::dra`).
//!
//! Server-side apply with field manager [`FIELD_MANAGER`], forced, at start and every `--publish-interval`
//! after: an unchanged slice is a no-op for the API server, and one the kubelet deleted while the plugin was
//! unregistered comes back. The slice is owned by its Node (deleted with it). Its pool generation moves only
//! when its devices change, so the scheduler never mixes devices of two inventories.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Api;
use kube::api::{Patch, PatchParams};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::inventory::Inventory;
use crate::slice::{node_slice, slice_name};
// The plugin marks its slices as its own, so the pool manager no longer counts them as its.
use crate::{LABEL_PUBLISHED_BY, PUBLISHED_BY_PLUGIN};

/// The field manager of the plugin's slice writes.
pub const FIELD_MANAGER: &str = "tessera-dra-plugin";

/// The slice to apply for `inventory`, given the one in the cluster (`existing`) and the Node's UID (its owner).
pub fn desired(
    inventory: &Inventory,
    existing: Option<&ResourceSlice>,
    node_uid: Option<&str>,
) -> ResourceSlice {
    let mut s = node_slice(&inventory.node, &inventory.gpus, 1);
    if let Some(e) = existing {
        let same = e.spec.devices == s.spec.devices && e.spec.node_name == s.spec.node_name;
        s.spec.pool.generation = if same {
            e.spec.pool.generation
        } else {
            e.spec.pool.generation + 1
        };
    }
    s.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(LABEL_PUBLISHED_BY.into(), PUBLISHED_BY_PLUGIN.into());
    if let Some(uid) = node_uid {
        s.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: inventory.node.clone(),
            uid: uid.into(),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
    }
    s
}

/// Applies the node's slice once.
pub async fn publish(client: &kube::Client, inventory: &Inventory) -> Result<ResourceSlice, kube::Error> {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let name = slice_name(&inventory.node);
    let existing = slices.get_opt(&name).await?;
    // Without the Node (no permission, or a name that is no node) the slice has no owner; it is still published.
    let node_uid = match Api::<Node>::all(client.clone()).get_opt(&inventory.node).await {
        Ok(n) => n.and_then(|n| n.metadata.uid),
        Err(e) => {
            warn!(node = %inventory.node, error = %e, "cannot read the node: its slice is published without an owner");
            None
        }
    };
    let s = desired(inventory, existing.as_ref(), node_uid.as_deref());
    let body = serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": s.metadata,
        "spec": s.spec,
    });
    slices
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
}

/// Publishes every `interval` until `stop`; a failure is retried at the next.
pub async fn run(
    client: kube::Client,
    inventory: Inventory,
    interval: Duration,
    health: std::sync::Arc<super::health::Health>,
    stop: CancellationToken,
) {
    let mut last = None;
    loop {
        let outcome = publish(&client, &inventory).await;
        health.published(outcome.as_ref().map(|_| ()).map_err(ToString::to_string));
        match outcome {
            Ok(s) => {
                let generation = s.spec.pool.generation;
                if last != Some(generation) {
                    info!(slice = ?s.metadata.name, generation, devices = inventory.gpus.len(), "published the node's slice");
                    last = Some(generation);
                }
            }
            Err(e) => warn!(node = %inventory.node, error = %e, "cannot publish the node's slice; retrying"),
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::inventory::{InventorySpec, Sharing};

    fn inventory(gpus: u32) -> Inventory {
        Inventory::new(&InventorySpec {
            node: "gpu-node-1".into(),
            gpus,
            memory_mib: 81920,
            headroom_mib: 1024,
            compute_oversubscription: None,
            sharing: Sharing::Mps,
            uuids: vec![],
            product: None,
        })
        .expect("inventory")
    }

    #[test]
    fn the_slice_keeps_its_generation_until_its_devices_change() {
        let first = desired(&inventory(2), None, Some("node-uid"));
        assert_eq!(first.spec.pool.generation, 1);
        assert_eq!(
            first.metadata.labels.as_ref().expect("labels")[LABEL_PUBLISHED_BY],
            PUBLISHED_BY_PLUGIN
        );
        let owner = &first.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("Node", "gpu-node-1", "node-uid")
        );
        let mut seen = first.clone();
        seen.spec.pool.generation = 4;
        assert_eq!(
            desired(&inventory(2), Some(&seen), None).spec.pool.generation,
            4,
            "unchanged"
        );
        assert_eq!(
            desired(&inventory(3), Some(&seen), None).spec.pool.generation,
            5,
            "a GPU more"
        );
        assert!(
            desired(&inventory(3), Some(&seen), None)
                .metadata
                .owner_references
                .is_none()
        );
    }
}
