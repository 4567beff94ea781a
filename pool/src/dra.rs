//! `mode: dra`: the pool manager's half of Dynamic Resource Allocation (`tessera_dra`).
//!
//! With DRA the kube-scheduler books each replica's claim on a device; no capacity pod holds a GPU and the webhook
//! reserves nothing. The leader's pool manager then does two things every pass:
//! - **publishes a `ResourceSlice` for each GPU node of a pool that has no kubelet plugin of Tessera's** (kwok
//!   nodes, or nodes before the plugin runs): one device per GPU the node's allocatable `resourceName` counts, with
//!   the pool's shape (memory minus headroom, compute times the oversubscription). A slice the plugin published
//!   (its [`LABEL_PUBLISHED_BY`] is not the pool manager's) is left alone: on a node with a real kubelet the
//!   plugin speaks for its GPUs, as real drivers do. Slices of nodes that left the pool are deleted. A slice is written only when it changed
//!   (its pool generation then moves), so a steady cluster costs one list per pass;
//! - **folds slices and allocated claims into a [`DraIndex`]** shared with the controller ([`DraView`]), which says
//!   why a model's claim fits nowhere and reads what the scheduler booked.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use tessera_dra::claim::{ClaimShape, allocations};
use tessera_dra::index::DraIndex;
use tessera_dra::slice::{GpuDevice, node_slice, published, slice_name};
use tracing::{debug, info, warn};

use crate::{PoolError, PoolSpec, PoolsConfig};
use tessera_dra::{LABEL_PUBLISHED_BY, PUBLISHED_BY_POOL_MANAGER};

/// The field manager of the pool manager's slice writes.
const FIELD_MANAGER: &str = "tessera-pool-manager";
/// Node label with the GPU's product (NVIDIA's GPU feature discovery writes it).
const PRODUCT_LABEL: &str = "nvidia.com/gpu.product";

/// What the DRA pool pass shares with the controller of the same process. Cheap to clone; clones share.
#[derive(Debug, Clone, Default)]
pub struct DraView(Arc<RwLock<DraState>>);

#[derive(Debug, Default)]
struct DraState {
    enabled: bool,
    index: Option<Arc<DraIndex>>,
}

impl DraView {
    /// Marks DRA mode on: the controller then writes claim templates.
    pub fn enable(&self) {
        self.0.write().unwrap_or_else(|e| e.into_inner()).enabled = true;
    }

    /// Whether this process runs its pools in DRA mode.
    pub fn enabled(&self) -> bool {
        self.0.read().unwrap_or_else(|e| e.into_inner()).enabled
    }

    /// The latest index, once a pass has built one.
    pub fn index(&self) -> Option<Arc<DraIndex>> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).index.clone()
    }

    fn set(&self, index: DraIndex) {
        self.0.write().unwrap_or_else(|e| e.into_inner()).index = Some(Arc::new(index));
    }
}

/// What a pass does to one slice.
#[derive(Debug, Clone, PartialEq)]
pub enum SliceAction {
    /// Create or replace it (server-side apply).
    Apply(Box<ResourceSlice>),
    /// Delete it (its node left the pool).
    Delete(String),
}

/// The GPUs of `node` if it belongs to `pool`: its labels carry the pool's node selector and its allocatable
/// `resourceName` counts them.
pub fn node_gpus(pool: &PoolSpec, node: &Node) -> Vec<GpuDevice> {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    if !pool.node_selector.iter().all(|(k, v)| labels.get(k) == Some(v)) {
        return Vec::new();
    }
    let count = tessera_dra::slice::allocatable_gpus(node, &pool.resource_name).unwrap_or(0);
    (0..count)
        .map(|index| GpuDevice {
            index,
            uuid: None,
            product: labels.get(PRODUCT_LABEL).cloned(),
            shape: pool.shape(),
            sharing: pool.sharing.as_str().to_string(),
        })
        .collect()
}

/// The pass's writes: a slice for every pool node whose slice is missing or differs, a delete for each slice the
/// pool manager published for a node no longer in any pool. Nodes whose slice the plugin published are skipped.
pub fn plan_slices(cfg: &PoolsConfig, nodes: &[Node], existing: &[ResourceSlice]) -> Vec<SliceAction> {
    let by_name: BTreeMap<&str, &ResourceSlice> = existing
        .iter()
        .filter_map(|s| Some((s.metadata.name.as_deref()?, s)))
        .collect();
    let ours = |s: &ResourceSlice| {
        s.metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.get(LABEL_PUBLISHED_BY).map(String::as_str) == Some(PUBLISHED_BY_POOL_MANAGER))
    };
    let mut wanted = BTreeSet::new();
    let mut out = Vec::new();
    for node in nodes {
        let Some(name) = node.metadata.name.as_deref() else {
            continue;
        };
        // A node in two pools takes the first's shape (the config validator should refuse overlapping pools).
        let Some(gpus) = cfg
            .pools
            .iter()
            .map(|p| node_gpus(p, node))
            .find(|g| !g.is_empty())
        else {
            continue;
        };
        let slice_id = slice_name(name);
        wanted.insert(slice_id.clone());
        let current = by_name.get(slice_id.as_str());
        if current.is_some_and(|s| !ours(s)) {
            continue;
        }
        let generation = current.map_or(1, |s| s.spec.pool.generation);
        let mut desired = node_slice(name, &gpus, generation);
        if let Some(l) = desired.metadata.labels.as_mut() {
            l.insert(LABEL_PUBLISHED_BY.into(), PUBLISHED_BY_POOL_MANAGER.into());
        }
        if current.is_some_and(|s| {
            s.spec.devices == desired.spec.devices && s.spec.node_name == desired.spec.node_name
        }) {
            continue;
        }
        // A changed pool is a new generation: the scheduler then ignores slices of older ones.
        if current.is_some() {
            desired.spec.pool.generation = generation + 1;
        }
        out.push(SliceAction::Apply(Box::new(desired)));
    }
    for s in existing.iter().filter(|s| ours(s)) {
        if let Some(name) = s.metadata.name.as_deref()
            && !wanted.contains(name)
        {
            out.push(SliceAction::Delete(name.to_string()));
        }
    }
    out
}

/// The DRA pass of every pool, every `interval`, until `shutdown`: slices published, the index rebuilt.
pub async fn run_dra_pools(
    client: kube::Client,
    cfg: Arc<PoolsConfig>,
    interval: Duration,
    view: DraView,
    metrics: crate::PoolMetrics,
    shutdown: tokio_util::sync::CancellationToken,
) -> Result<(), PoolError> {
    view.enable();
    info!(
        pools = cfg.pools.len(),
        "GPU pools in DRA mode: publishing slices of {}",
        tessera_dra::DRIVER
    );
    loop {
        if let Err(e) = pass(&client, &cfg, &view, &metrics).await {
            warn!(error = %e, "DRA pool pass failed; retrying next interval");
        }
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = tokio::time::sleep(interval) => {}
        }
    }
}

async fn pass(
    client: &kube::Client,
    cfg: &PoolsConfig,
    view: &DraView,
    metrics: &crate::PoolMetrics,
) -> Result<(), PoolError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let by_driver = ListParams::default().fields(&format!("spec.driver={}", tessera_dra::DRIVER));
    let node_list = nodes.list(&ListParams::default()).await?.items;
    let mut existing = slices.list(&by_driver).await?.items;
    let actions = plan_slices(cfg, &node_list, &existing);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for action in &actions {
        match action {
            SliceAction::Apply(slice) => {
                let name = slice.metadata.name.clone().unwrap_or_default();
                let mut body = (**slice).clone();
                body.metadata.managed_fields = None;
                let body = serde_json::json!({
                    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                    "metadata": body.metadata, "spec": body.spec,
                });
                match slices.patch(&name, &params, &Patch::Apply(&body)).await {
                    Ok(_) => {
                        info!(slice = %name, generation = slice.spec.pool.generation, "published GPU slice")
                    }
                    Err(e) => warn!(slice = %name, error = %e, "cannot publish GPU slice"),
                }
            }
            SliceAction::Delete(name) => match slices.delete(name, &DeleteParams::default()).await {
                Ok(_) => info!(slice = %name, "deleted the slice of a node that left the pool"),
                Err(e) => warn!(slice = %name, error = %e, "cannot delete a stale slice"),
            },
        }
    }
    if !actions.is_empty() {
        existing = slices.list(&by_driver).await?.items;
    }
    let claims: Api<ResourceClaim> = match &cfg.tenant_namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let claim_list = claims.list(&ListParams::default()).await?.items;
    let index = build_index(&existing, &claim_list);
    metrics.dra(&index);
    view.set(index);
    Ok(())
}

/// The index of `slices` holding the allocations of `claims` (Tessera's driver only).
pub fn build_index(slices: &[ResourceSlice], claims: &[ResourceClaim]) -> DraIndex {
    let mut devices = Vec::new();
    for s in slices {
        let (d, errors) = published(s);
        for e in errors {
            warn!(slice = ?s.metadata.name, error = %e, "slice device not counted");
        }
        devices.extend(d);
    }
    // A result whose consumption cannot be read counts as its whole device (never as free room); one on a device
    // no slice publishes is an orphan in the index, whatever it is counted as.
    let whole = |pool: &str, device: &str| {
        devices
            .iter()
            .find(|d| d.pool == pool && d.device == device)
            .map_or(
                ClaimShape {
                    memory_mib: 0,
                    compute_milli: 0,
                },
                |d| ClaimShape {
                    memory_mib: d.memory_mib,
                    compute_milli: d.compute_milli,
                },
            )
    };
    let allocated: Vec<_> = claims.iter().flat_map(|c| allocations(c, whole)).collect();
    let index = DraIndex::build(&devices, &allocated);
    for (a, why) in &index.overbooked {
        warn!(claim = %a.claim, device = %format!("{}/{}", a.pool, a.device), %why, "claim over its device's capacity");
    }
    debug!(
        devices = devices.len(),
        claims = allocated.len(),
        "DRA index rebuilt"
    );
    index
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeStatus;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    const CONFIG: &str = r#"
namespace: tessera-gpus
mode: dra
pools:
  - name: l4
    nodeSelector: { nvidia.com/gpu.product: NVIDIA-L4 }
    gpuMemoryMiB: 23034
    sharing: mps
    maxGpus: 8
"#;

    fn node(name: &str, product: &str, gpus: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some([(PRODUCT_LABEL.to_string(), product.to_string())].into()),
                ..ObjectMeta::default()
            },
            status: Some(NodeStatus {
                allocatable: Some([("nvidia.com/gpu".to_string(), Quantity(gpus.into()))].into()),
                ..NodeStatus::default()
            }),
            ..Node::default()
        }
    }

    fn applied(actions: &[SliceAction]) -> Vec<ResourceSlice> {
        actions
            .iter()
            .filter_map(|a| match a {
                SliceAction::Apply(s) => Some((**s).clone()),
                SliceAction::Delete(_) => None,
            })
            .collect()
    }

    #[test]
    fn each_pool_node_gets_a_slice_once_and_a_change_is_a_new_generation() {
        let cfg = PoolsConfig::from_yaml(CONFIG).expect("config");
        assert_eq!(cfg.mode, crate::PoolMode::Dra);
        let nodes = [
            node("a", "NVIDIA-L4", "2"),
            node("b", "NVIDIA-L4", "2"),
            node("cpu", "none", "0"),
        ];
        let first = applied(&plan_slices(&cfg, &nodes, &[]));
        assert_eq!(first.len(), 2, "the CPU node has no GPUs");
        let devices = first[0].spec.devices.as_ref().expect("devices");
        assert_eq!(devices.len(), 2);
        let cap = devices[0].capacity.as_ref().expect("capacity");
        assert_eq!(
            cap[tessera_dra::MEMORY].value.0,
            "22010Mi",
            "23034 minus the default 1024 MiB headroom"
        );
        assert_eq!(
            cap[tessera_dra::COMPUTE].value.0,
            "2000",
            "MPS: two GPUs' worth of caps by default"
        );
        let mut published = first.clone();
        assert!(
            plan_slices(&cfg, &nodes, &published).is_empty(),
            "nothing changed: nothing written"
        );
        let grown = [node("a", "NVIDIA-L4", "4"), node("b", "NVIDIA-L4", "2")];
        let second = applied(&plan_slices(&cfg, &grown, &published));
        assert_eq!(second.len(), 1);
        assert_eq!(second[0].spec.pool.generation, 2);
        // Node b leaves the pool: its slice goes; a plugin's slice (no publisher label) is never touched.
        published[0].metadata.labels = None;
        let actions = plan_slices(&cfg, &[node("a", "NVIDIA-L4", "4")], &published);
        assert_eq!(actions, vec![SliceAction::Delete("b-gpu.tessera.dev".into())]);
    }
}
