//! The node's GPUs as the plugin knows them: from the command line for now (`--gpus`, `--gpu-memory-mib`, …).
//! NVML discovery is a follow-up: it needs a GPU node to be tested on, and the flags are what a pool's config
//! already says of its nodes. The same inventory publishes the node's slice ([`crate::slice::node_slice`]) and
//! resolves the devices the scheduler allocated (`gpu-<index>` → its UUID).

use tessera_core::pack::{
    GPU_COMPUTE_MILLI, GpuShape, MAX_COMPUTE_OVERSUBSCRIPTION, default_compute_oversubscription,
};

use super::PluginError;
use crate::claim::ClaimShape;
use crate::slice::{GpuDevice, device_name};

/// The most GPUs one node's inventory may list (the largest nodes have 8–16).
pub const MAX_GPUS: u32 = 64;

/// How tenants share a GPU (the pool's `sharing`): what the CDI spec gives a container besides its GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sharing {
    /// NVIDIA MPS: the claim's memory and compute become the client's limits.
    Mps,
    /// Time-slicing: the GPU alone (no per-tenant limit exists).
    TimeSlicing,
    /// No sharing mechanism: the GPU alone.
    None,
}

impl Sharing {
    /// As the slice's `sharing` attribute and the pool config write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mps => "mps",
            Self::TimeSlicing => "time-slicing",
            Self::None => "none",
        }
    }
}

/// What the command line says of the node's GPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct InventorySpec {
    /// The node's name.
    pub node: String,
    /// How many GPUs it has.
    pub gpus: u32,
    /// Each GPU's memory, MiB.
    pub memory_mib: u64,
    /// MiB of each never handed out (driver, CUDA contexts).
    pub headroom_mib: u64,
    /// GPUs' worth of compute shares per GPU (`None`: 2.0 under MPS, else 1.0).
    pub compute_oversubscription: Option<f64>,
    /// How tenants share.
    pub sharing: Sharing,
    /// The GPUs' UUIDs by index, if known (all or none).
    pub uuids: Vec<String>,
    /// The product name, if known.
    pub product: Option<String>,
}

/// The node's GPUs, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Inventory {
    /// The node's name (its pool's name in the slice).
    pub node: String,
    /// How tenants share.
    pub sharing: Sharing,
    /// One per GPU, by index.
    pub gpus: Vec<GpuDevice>,
}

impl Inventory {
    /// The inventory `spec` describes, or why it is inconsistent.
    pub fn new(spec: &InventorySpec) -> Result<Self, PluginError> {
        let bad = |s: String| Err(PluginError::Inventory(s));
        if spec.node.is_empty() {
            return bad("no node name: set --node or NODE_NAME (the downward API's spec.nodeName)".into());
        }
        if spec.gpus == 0 || spec.gpus > MAX_GPUS {
            return bad(format!("--gpus {} is out of range 1..={MAX_GPUS}", spec.gpus));
        }
        if !spec.uuids.is_empty() && spec.uuids.len() != spec.gpus as usize {
            return bad(format!(
                "--gpu-uuids lists {} UUIDs for {} GPUs: give one per GPU, in index order, or none",
                spec.uuids.len(),
                spec.gpus
            ));
        }
        if let Some(u) = spec.uuids.iter().find(|u| !valid_uuid(u)) {
            return bad(format!(
                "--gpu-uuids: {u:?} is not a GPU UUID (letters, digits and '-')"
            ));
        }
        let mps = spec.sharing == Sharing::Mps;
        let factor = spec
            .compute_oversubscription
            .unwrap_or_else(|| default_compute_oversubscription(mps));
        if !(1.0..=MAX_COMPUTE_OVERSUBSCRIPTION).contains(&factor) {
            return bad(format!(
                "--compute-oversubscription {factor} is out of range 1.0..={MAX_COMPUTE_OVERSUBSCRIPTION}"
            ));
        }
        if factor > 1.0 && !mps {
            return bad(format!(
                "--compute-oversubscription {factor} needs --sharing mps: only MPS caps can be oversubscribed"
            ));
        }
        let shape = GpuShape::new(spec.memory_mib, spec.headroom_mib)
            .and_then(|s| s.with_compute_oversubscription(factor))
            .map_err(|e| PluginError::Inventory(format!("--gpu-memory-mib/--memory-headroom-mib: {e}")))?;
        let gpus = (0..spec.gpus)
            .map(|index| GpuDevice {
                index,
                uuid: spec.uuids.get(index as usize).cloned(),
                product: spec.product.clone(),
                shape,
                sharing: spec.sharing.as_str().into(),
            })
            .collect();
        Ok(Self {
            node: spec.node.clone(),
            sharing: spec.sharing,
            gpus,
        })
    }

    /// The GPU a slice device name (`gpu-<index>`) stands for.
    pub fn gpu(&self, device: &str) -> Option<&GpuDevice> {
        self.gpus.iter().find(|g| device_name(g.index) == device)
    }

    /// What a result without a readable consumption counts as: the whole device.
    pub fn whole(&self) -> ClaimShape {
        ClaimShape {
            memory_mib: self.gpus.first().map_or(0, |g| g.shape.usable_memory_mib()),
            compute_milli: GPU_COMPUTE_MILLI,
        }
    }
}

/// What `NVIDIA_VISIBLE_DEVICES` names the GPU by: its UUID when known, else its index (the NVIDIA container
/// runtime takes either; the index is only right where the plugin's indices are the driver's).
pub fn visible_device(gpu: &GpuDevice) -> String {
    gpu.uuid.clone().unwrap_or_else(|| gpu.index.to_string())
}

fn valid_uuid(u: &str) -> bool {
    !u.is_empty() && u.len() <= 64 && u.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn spec() -> InventorySpec {
        InventorySpec {
            node: "gpu-node-1".into(),
            gpus: 2,
            memory_mib: 81920,
            headroom_mib: 1024,
            compute_oversubscription: None,
            sharing: Sharing::Mps,
            uuids: vec!["GPU-aaaa".into(), "GPU-bbbb".into()],
            product: Some("NVIDIA A100-SXM4-80GB".into()),
        }
    }

    #[test]
    fn an_inventory_names_each_gpu_and_shapes_it_like_the_pool() {
        let inv = Inventory::new(&spec()).expect("inventory");
        assert_eq!(inv.gpus.len(), 2);
        let g = inv.gpu("gpu-1").expect("gpu-1");
        assert_eq!(g.uuid.as_deref(), Some("GPU-bbbb"));
        assert_eq!(g.shape.compute_milli, 2000, "MPS oversubscribes 2x by default");
        assert_eq!(visible_device(g), "GPU-bbbb");
        assert!(inv.gpu("gpu-2").is_none());
        assert_eq!(inv.whole().memory_mib, 80896);
        let no_uuids = Inventory::new(&InventorySpec {
            uuids: vec![],
            sharing: Sharing::TimeSlicing,
            ..spec()
        })
        .expect("inventory");
        assert_eq!(visible_device(&no_uuids.gpus[1]), "1");
        assert_eq!(no_uuids.gpus[1].shape.compute_milli, 1000);
    }

    #[test]
    fn an_inconsistent_inventory_is_refused_with_the_flag_to_fix() {
        let err = |s: InventorySpec| Inventory::new(&s).expect_err("refused").to_string();
        assert!(
            err(InventorySpec {
                node: String::new(),
                ..spec()
            })
            .contains("NODE_NAME")
        );
        assert!(err(InventorySpec { gpus: 0, ..spec() }).contains("--gpus"));
        assert!(
            err(InventorySpec {
                uuids: vec!["GPU-a".into()],
                ..spec()
            })
            .contains("one per GPU")
        );
        assert!(
            err(InventorySpec {
                uuids: vec!["GPU-a".into(), "../x".into()],
                ..spec()
            })
            .contains("not a GPU UUID")
        );
        assert!(
            err(InventorySpec {
                sharing: Sharing::None,
                compute_oversubscription: Some(2.0),
                ..spec()
            })
            .contains("needs --sharing mps")
        );
        assert!(
            err(InventorySpec {
                headroom_mib: 81920,
                ..spec()
            })
            .contains("--memory-headroom-mib")
        );
    }
}
