//! The Container Device Interface spec a prepared claim becomes: one file per claim in `--cdi-dir`
//! (`gpu.tessera.dev-<claim UID>.json`), kind [`KIND`], one device per allocated result named from the claim's
//! UID and the device (`<uid>-gpu-0`). The container runtime (containerd, CRI-O) applies a device's
//! `containerEdits` to every container the kubelet says holds the claim, from the CDI device IDs the plugin
//! answers ([`device_id`]).
//!
//! What a device gives its container (the same settings the webhook writes in capacity-pod mode):
//! - `NVIDIA_VISIBLE_DEVICES` = the GPU's UUID (its index where the inventory has no UUIDs), which the NVIDIA
//!   container runtime turns into the device nodes and driver libraries;
//! - under MPS, the claim's limits from what the scheduler booked (`consumedCapacity`):
//!   `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT = "0=<memory>M"` (device 0 is the one GPU the container sees) and
//!   `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE = ⌈compute milli / 10⌉` in 1..=100, plus the MPS daemon's pipe and log
//!   directories and its `/dev/shm`, mounted as NVIDIA's device plugin mounts them for an MPS client.
//!
//! Files are written atomically (a temporary file in the same directory, synced, renamed over): a runtime never
//! reads half a spec, and a crash leaves the old file or the new one. The temporary name ends in `.tmp`, which no
//! CDI reader loads.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::PluginError;
use super::inventory::{Sharing, visible_device};
use crate::claim::Allocated;
use crate::slice::GpuDevice;

/// The CDI spec version written: 0.6.0 is what containerd ≥ 1.7 and CRI-O ≥ 1.28 read, and has every field used.
pub const CDI_VERSION: &str = "0.6.0";
/// The CDI kind (`vendor/class`) of Tessera's devices.
pub const KIND: &str = "gpu.tessera.dev/gpu";
/// The file name prefix of Tessera's specs (the vendor).
const FILE_PREFIX: &str = "gpu.tessera.dev-";

/// Where the MPS control daemon of the node keeps its pipes, logs and shared memory (the webhook's
/// `--mps-pipe-dir`, `--mps-log-dir`, `--mps-shm-dir`; the same defaults).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MpsPaths {
    /// `CUDA_MPS_PIPE_DIRECTORY`, mounted at the same path.
    pub pipe_dir: String,
    /// `CUDA_MPS_LOG_DIRECTORY`, mounted at the same path.
    pub log_dir: String,
    /// The node directory that is the daemon's `/dev/shm`, mounted at `/dev/shm`.
    pub shm_dir: String,
}

impl Default for MpsPaths {
    fn default() -> Self {
        Self {
            pipe_dir: "/tmp/nvidia-mps".into(),
            log_dir: "/var/log/nvidia-mps".into(),
            shm_dir: "/dev/shm".into(),
        }
    }
}

/// A CDI spec file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// [`CDI_VERSION`].
    pub cdi_version: String,
    /// [`KIND`].
    pub kind: String,
    /// One per allocated device of the claim.
    pub devices: Vec<Device>,
}

/// One CDI device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// Unique within [`KIND`]: `<claim UID>-<device>`.
    pub name: String,
    /// What the runtime applies to the container.
    pub container_edits: ContainerEdits,
}

/// A device's edits of its container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    /// `NAME=value` entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Bind mounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
}

/// A bind mount from the node into the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    /// On the node.
    pub host_path: String,
    /// In the container.
    pub container_path: String,
    /// Mount options.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Device {
    /// The env value of `name`, if set (for tests and logs).
    pub fn env(&self, name: &str) -> Option<&str> {
        self.container_edits
            .env
            .iter()
            .find_map(|e| e.strip_prefix(name)?.strip_prefix('='))
    }
}

/// The CDI device name of `device` in the claim `uid`.
pub fn device_name(uid: &str, device: &str) -> String {
    format!("{uid}-{device}")
}

/// The fully qualified CDI device ID the kubelet hands the runtime.
pub fn device_id(name: &str) -> String {
    format!("{KIND}={name}")
}

/// The spec file of the claim `uid` in `dir`.
pub fn spec_path(dir: &Path, uid: &str) -> PathBuf {
    dir.join(format!("{FILE_PREFIX}{uid}.json"))
}

/// The MPS active thread percentage of a compute share: whole percents, rounded up, at least 1 (0 would mean
/// "no limit" to MPS) and at most 100.
pub fn thread_percentage(compute_milli: u32) -> u32 {
    compute_milli.div_ceil(10).clamp(1, 100)
}

/// The CDI device for one allocated result on `gpu`.
pub fn device(uid: &str, alloc: &Allocated, gpu: &GpuDevice, sharing: Sharing, mps: &MpsPaths) -> Device {
    let mut edits = ContainerEdits {
        env: vec![format!("NVIDIA_VISIBLE_DEVICES={}", visible_device(gpu))],
        mounts: Vec::new(),
    };
    if sharing == Sharing::Mps {
        edits.env.extend([
            format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={}M", alloc.memory_mib),
            format!(
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={}",
                thread_percentage(alloc.compute_milli)
            ),
            format!("CUDA_MPS_PIPE_DIRECTORY={}", mps.pipe_dir),
            format!("CUDA_MPS_LOG_DIRECTORY={}", mps.log_dir),
        ]);
        let bind = |host: &str, container: &str| Mount {
            host_path: host.into(),
            container_path: container.into(),
            options: vec!["rbind".into(), "rw".into()],
        };
        edits.mounts = vec![
            bind(&mps.pipe_dir, &mps.pipe_dir),
            bind(&mps.log_dir, &mps.log_dir),
            bind(&mps.shm_dir, "/dev/shm"),
        ];
    }
    Device {
        name: device_name(uid, &alloc.device),
        container_edits: edits,
    }
}

/// The spec holding `devices`.
pub fn spec(devices: Vec<Device>) -> Spec {
    Spec {
        cdi_version: CDI_VERSION.into(),
        kind: KIND.into(),
        devices,
    }
}

/// Writes `bytes` to `path` atomically: a temporary file beside it, synced, renamed over it, and the directory
/// synced so the rename survives a power cut.
pub fn write_atomic(path: &Path, bytes: &[u8], what: &'static str) -> Result<(), PluginError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let file = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{file}.tmp"));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        // Best effort: not every filesystem lets a directory be opened for sync.
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        PluginError::io(what, path)(e)
    })
}

/// Writes the claim `uid`'s spec into `dir`.
pub fn write_spec(dir: &Path, uid: &str, spec: &Spec) -> Result<PathBuf, PluginError> {
    let path = spec_path(dir, uid);
    let bytes = serde_json::to_vec_pretty(spec).map_err(|e| PluginError::io("CDI spec", &path)(e.into()))?;
    write_atomic(&path, &bytes, "CDI spec")?;
    Ok(path)
}

/// Removes the claim `uid`'s spec from `dir`; one that is not there is already removed.
pub fn remove_spec(dir: &Path, uid: &str) -> Result<(), PluginError> {
    let path = spec_path(dir, uid);
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(PluginError::io("CDI spec", path)(e)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::inventory::{Inventory, InventorySpec};

    fn alloc(memory_mib: u64, compute_milli: u32) -> Allocated {
        Allocated {
            claim: "models/c".into(),
            uid: Some("u-1".into()),
            model: None,
            pool: "gpu-node-1".into(),
            device: "gpu-1".into(),
            memory_mib,
            compute_milli,
            share_id: None,
        }
    }

    fn inventory(sharing: Sharing) -> Inventory {
        Inventory::new(&InventorySpec {
            node: "gpu-node-1".into(),
            gpus: 2,
            memory_mib: 81920,
            headroom_mib: 1024,
            compute_oversubscription: Some(1.0),
            sharing,
            uuids: vec!["GPU-a".into(), "GPU-b".into()],
            product: None,
        })
        .expect("inventory")
    }

    #[test]
    fn an_mps_device_carries_the_claims_limits_and_the_daemons_directories() {
        let inv = inventory(Sharing::Mps);
        let d = device(
            "u-1",
            &alloc(30000, 333),
            &inv.gpus[1],
            Sharing::Mps,
            &MpsPaths::default(),
        );
        assert_eq!(d.name, "u-1-gpu-1");
        assert_eq!(device_id(&d.name), "gpu.tessera.dev/gpu=u-1-gpu-1");
        assert_eq!(d.env("NVIDIA_VISIBLE_DEVICES"), Some("GPU-b"));
        assert_eq!(d.env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), Some("0=30000M"));
        assert_eq!(
            d.env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
            Some("34"),
            "333 milli rounds up"
        );
        assert_eq!(d.env("CUDA_MPS_PIPE_DIRECTORY"), Some("/tmp/nvidia-mps"));
        let shm = d
            .container_edits
            .mounts
            .iter()
            .find(|m| m.container_path == "/dev/shm");
        assert_eq!(shm.map(|m| m.host_path.as_str()), Some("/dev/shm"));
    }

    #[test]
    fn without_mps_a_device_gives_the_gpu_alone() {
        let inv = inventory(Sharing::TimeSlicing);
        let d = device(
            "u-1",
            &alloc(30000, 333),
            &inv.gpus[0],
            Sharing::TimeSlicing,
            &MpsPaths::default(),
        );
        assert_eq!(
            d.container_edits.env,
            vec!["NVIDIA_VISIBLE_DEVICES=GPU-a".to_string()]
        );
        assert!(d.container_edits.mounts.is_empty());
    }

    #[test]
    fn the_thread_percentage_stays_within_what_mps_takes() {
        assert_eq!(thread_percentage(0), 1);
        assert_eq!(thread_percentage(1), 1);
        assert_eq!(thread_percentage(250), 25);
        assert_eq!(thread_percentage(1000), 100);
        assert_eq!(thread_percentage(2000), 100);
    }

    #[test]
    fn a_spec_is_written_atomically_and_removed_idempotently() {
        let dir = tempfile::tempdir().expect("tempdir");
        let inv = inventory(Sharing::Mps);
        let s = spec(vec![device(
            "u-1",
            &alloc(1024, 100),
            &inv.gpus[0],
            Sharing::Mps,
            &MpsPaths::default(),
        )]);
        let path = write_spec(dir.path(), "u-1", &s).expect("write");
        assert_eq!(path, dir.path().join("gpu.tessera.dev-u-1.json"));
        let back: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
        assert_eq!(back["cdiVersion"], "0.6.0");
        assert_eq!(back["kind"], "gpu.tessera.dev/gpu");
        assert_eq!(back["devices"][0]["name"], "u-1-gpu-1");
        assert_eq!(
            back["devices"][0]["containerEdits"]["mounts"][2]["containerPath"],
            "/dev/shm"
        );
        let files: Vec<_> = std::fs::read_dir(dir.path())
            .expect("ls")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(files.len(), 1, "no temporary file left: {files:?}");
        remove_spec(dir.path(), "u-1").expect("remove");
        assert!(!path.exists());
        remove_spec(dir.path(), "u-1").expect("removing again is fine");
    }
}
