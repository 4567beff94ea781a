//! The GPU as the sidecar sees it, behind [`GpuProbe`] so tests (and GPU-less machines) use a fake.
//!
//! On a dedicated GPU the device's used memory and utilization are this server's own, so they feed the
//! recommendation (measured non-KV memory, observed compute use). On a shared GPU (`--gpu-shared`) they
//! include the neighbours' use, so only the total is taken; per-pod use comes from the gpu-agent, because
//! NVML reports host PIDs that a pod cannot map.

use crate::error::GpuError;

/// One reading of the device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuReading {
    /// Total memory, bytes.
    pub total_bytes: u64,
    /// Used memory of the whole device, bytes, when measured.
    pub used_bytes: Option<u64>,
    /// Fraction of the last sample period during which a kernel ran (NVML `utilization.gpu`), 0–1. An upper
    /// bound on SM use, so a compute fraction derived from it errs on the generous side.
    pub busy_ratio: Option<f64>,
}

/// Where GPU readings come from.
pub trait GpuProbe: Send + Sync {
    /// `nvml` or `config` (reported in `/v1/status`).
    fn source(&self) -> &'static str;
    /// Reads the device now.
    fn read(&self) -> Result<GpuReading, GpuError>;
}

/// NVML on one device.
pub struct NvmlProbe {
    nvml: nvml_wrapper::Nvml,
    index: u32,
}

impl std::fmt::Debug for NvmlProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlProbe").field("index", &self.index).finish()
    }
}

impl NvmlProbe {
    /// Initialises NVML and checks that device `index` answers. Fails cleanly (no panic) where
    /// `libnvidia-ml.so.1` is missing.
    pub fn new(index: u32) -> Result<Self, GpuError> {
        let nvml = nvml_wrapper::Nvml::init().map_err(|e| GpuError::Unavailable(e.to_string()))?;
        nvml.device_by_index(index)
            .map_err(|e| GpuError::Unavailable(format!("device {index}: {e}")))?;
        Ok(Self { nvml, index })
    }
}

impl GpuProbe for NvmlProbe {
    fn source(&self) -> &'static str {
        "nvml"
    }

    fn read(&self) -> Result<GpuReading, GpuError> {
        let dev = self
            .nvml
            .device_by_index(self.index)
            .map_err(GpuError::query("device_by_index"))?;
        let mem = dev.memory_info().map_err(GpuError::query("memory_info"))?;
        // Utilization is optional (some vGPU/MIG configurations refuse it); memory is what matters most.
        let busy_ratio = dev
            .utilization_rates()
            .ok()
            .map(|u| f64::from(u.gpu.min(100)) / 100.0);
        Ok(GpuReading {
            total_bytes: mem.total,
            used_bytes: Some(mem.used),
            busy_ratio,
        })
    }
}

/// A fixed total from `--gpu-memory-mib`, nothing measured.
#[derive(Debug, Clone, Copy)]
pub struct ConfiguredGpu {
    /// Total memory, bytes.
    pub total_bytes: u64,
}

impl GpuProbe for ConfiguredGpu {
    fn source(&self) -> &'static str {
        "config"
    }

    fn read(&self) -> Result<GpuReading, GpuError> {
        Ok(GpuReading {
            total_bytes: self.total_bytes,
            used_bytes: None,
            busy_ratio: None,
        })
    }
}

/// A scripted probe for tests: returns the reading it holds (changeable while running), or an error.
#[derive(Debug, Default)]
pub struct FakeProbe {
    reading: std::sync::Mutex<Option<GpuReading>>,
}

impl FakeProbe {
    /// A probe that answers `reading` (`None`: fails as if NVML were absent).
    pub fn new(reading: Option<GpuReading>) -> Self {
        Self {
            reading: std::sync::Mutex::new(reading),
        }
    }

    /// Changes what the probe answers.
    pub fn set(&self, reading: Option<GpuReading>) {
        if let Ok(mut r) = self.reading.lock() {
            *r = reading;
        }
    }
}

impl GpuProbe for FakeProbe {
    fn source(&self) -> &'static str {
        "fake"
    }

    fn read(&self) -> Result<GpuReading, GpuError> {
        self.reading
            .lock()
            .ok()
            .and_then(|r| *r)
            .ok_or_else(|| GpuError::Unavailable("fake probe has no reading".into()))
    }
}

/// Picks the probe: NVML when it initialises; else the configured total; else none. Also returns why NVML
/// was not used, for the caller to log once.
pub fn select(
    use_nvml: bool,
    index: u32,
    configured_total: Option<u64>,
) -> (Option<Box<dyn GpuProbe>>, Option<GpuError>) {
    let nvml_err = if use_nvml {
        match NvmlProbe::new(index) {
            Ok(p) => return (Some(Box::new(p)), None),
            Err(e) => Some(e),
        }
    } else {
        None
    };
    let probe = configured_total.map(|t| Box::new(ConfiguredGpu { total_bytes: t }) as Box<dyn GpuProbe>);
    (probe, nvml_err)
}
