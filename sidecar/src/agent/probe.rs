//! NVML per process, behind a trait ([`ProcessProbe`]; tests use [`FakeProcessProbe`]), and the per-pod totals
//! (pure given the PID → pod resolver).

use std::collections::BTreeMap;
use std::sync::Mutex;

use tessera_core::wire::sidecar::{GpuDeviceUse, PodGpuUse};

use super::PodRef;
use crate::error::GpuError;

/// One process on a GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessUse {
    /// Host PID.
    pub pid: u32,
    /// GPU memory, bytes, when NVML says.
    pub used_bytes: Option<u64>,
    /// SM utilization over the last sample period, 0–1; `None` when the device does not support sampling.
    pub sm_utilization: Option<f64>,
}

/// One GPU and its processes.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceReading {
    /// NVML index.
    pub index: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Total memory, bytes.
    pub total_bytes: u64,
    /// Used memory, bytes.
    pub used_bytes: u64,
    /// Compute processes.
    pub processes: Vec<ProcessUse>,
}

/// Where per-process GPU readings come from.
pub trait ProcessProbe: Send + Sync {
    /// Reads every device now.
    fn read(&self) -> Result<Vec<DeviceReading>, GpuError>;
}

/// NVML over every device.
pub struct NvmlProcessProbe {
    nvml: nvml_wrapper::Nvml,
    /// Per device, the newest utilization sample already seen (NVML returns samples since a timestamp).
    last_seen: Mutex<BTreeMap<u32, u64>>,
}

impl std::fmt::Debug for NvmlProcessProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlProcessProbe").finish_non_exhaustive()
    }
}

impl NvmlProcessProbe {
    /// Initialises NVML; fails cleanly where the driver library is missing.
    pub fn new() -> Result<Self, GpuError> {
        let nvml = nvml_wrapper::Nvml::init().map_err(|e| GpuError::Unavailable(e.to_string()))?;
        Ok(Self {
            nvml,
            last_seen: Mutex::new(BTreeMap::new()),
        })
    }
}

impl ProcessProbe for NvmlProcessProbe {
    fn read(&self) -> Result<Vec<DeviceReading>, GpuError> {
        let count = self
            .nvml
            .device_count()
            .map_err(GpuError::query("device_count"))?;
        let mut out = Vec::with_capacity(count as usize);
        for index in 0..count {
            let dev = self
                .nvml
                .device_by_index(index)
                .map_err(GpuError::query("device_by_index"))?;
            let uuid = dev.uuid().map_err(GpuError::query("uuid"))?;
            let mem = dev.memory_info().map_err(GpuError::query("memory_info"))?;
            let procs = dev
                .running_compute_processes()
                .map_err(GpuError::query("running_compute_processes"))?;
            let since = self.last_seen.lock().ok().and_then(|m| m.get(&index).copied());
            // Samples exist only for processes that used the SMs in the period; a process absent from a
            // successful answer used none. An error (NotSupported on some devices) means "unknown".
            let samples = dev.process_utilization_stats(since).ok();
            let mut sm: BTreeMap<u32, (u64, u32)> = BTreeMap::new();
            if let Some(samples) = &samples {
                for s in samples {
                    let e = sm.entry(s.pid).or_insert((0, 0));
                    if s.timestamp >= e.0 {
                        *e = (s.timestamp, s.sm_util);
                    }
                }
                if let (Some(newest), Ok(mut m)) =
                    (samples.iter().map(|s| s.timestamp).max(), self.last_seen.lock())
                {
                    m.insert(index, newest);
                }
            }
            let processes = procs
                .iter()
                .map(|p| ProcessUse {
                    pid: p.pid,
                    used_bytes: match p.used_gpu_memory {
                        nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => Some(b),
                        nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => None,
                    },
                    sm_utilization: samples.as_ref().map(|_| {
                        sm.get(&p.pid)
                            .map_or(0.0, |(_, u)| f64::from((*u).min(100)) / 100.0)
                    }),
                })
                .collect();
            out.push(DeviceReading {
                index,
                uuid,
                total_bytes: mem.total,
                used_bytes: mem.used,
                processes,
            });
        }
        Ok(out)
    }
}

/// A scripted probe for tests.
#[derive(Debug, Default)]
pub struct FakeProcessProbe {
    /// What `read` answers (`None`: an NVML error).
    pub readings: Mutex<Option<Vec<DeviceReading>>>,
}

impl ProcessProbe for FakeProcessProbe {
    fn read(&self) -> Result<Vec<DeviceReading>, GpuError> {
        self.readings
            .lock()
            .ok()
            .and_then(|r| r.clone())
            .ok_or_else(|| GpuError::Unavailable("fake probe has no reading".into()))
    }
}

// ---------------------------------------------------------------------------------------------------------
// Per-pod totals (pure given the resolver).

/// Groups each device's processes by pod. `resolve` maps a host PID to its pod (`None`: not in a pod).
pub fn per_pod(devices: &[DeviceReading], resolve: impl Fn(u32) -> Option<PodRef>) -> Vec<GpuDeviceUse> {
    devices
        .iter()
        .map(|d| {
            let mut pods: BTreeMap<String, PodGpuUse> = BTreeMap::new();
            let mut host: Option<PodGpuUse> = None;
            for p in &d.processes {
                let pod = resolve(p.pid);
                let entry = match &pod {
                    Some(r) => pods.entry(r.uid.clone()).or_insert_with(|| empty_use(&r.uid)),
                    None => host.get_or_insert_with(|| empty_use("")),
                };
                entry.pids.push(p.pid);
                if let Some(c) = pod.and_then(|r| r.container_id)
                    && !entry.container_ids.contains(&c)
                {
                    entry.container_ids.push(c);
                }
                if let Some(b) = p.used_bytes {
                    entry.memory_bytes = Some(entry.memory_bytes.unwrap_or(0).saturating_add(b));
                }
                if let Some(u) = p.sm_utilization {
                    entry.sm_utilization = Some((entry.sm_utilization.unwrap_or(0.0) + u).min(1.0));
                }
            }
            let tidy = |mut u: PodGpuUse| {
                u.pids.sort_unstable();
                u.container_ids.sort();
                u
            };
            GpuDeviceUse {
                index: d.index,
                uuid: d.uuid.clone(),
                total_bytes: d.total_bytes,
                used_bytes: d.used_bytes,
                pods: pods.into_values().map(tidy).collect(),
                unattributed: host.map(tidy),
            }
        })
        .collect()
}

fn empty_use(uid: &str) -> PodGpuUse {
    PodGpuUse {
        pod_uid: uid.to_string(),
        container_ids: Vec::new(),
        pids: Vec::new(),
        memory_bytes: None,
        sm_utilization: None,
    }
}
