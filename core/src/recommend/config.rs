//! The recommendation's tunables and their valid ranges.

use serde::{Deserialize, Serialize};

/// Tunables. [`Config::default`] is what the sidecar uses unless told otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// The percentile of KV usage to size for, 0–1 (0.95 = p95).
    pub percentile: f64,
    /// Headroom over the percentile, as a fraction (0.2 = +20%).
    pub headroom: f64,
    /// Fewest usable samples before recommending anything.
    pub min_samples: usize,
    /// Shortest window (last sample time − first) before recommending anything, seconds.
    pub min_window_secs: f64,
    /// Largest growth per update, as a factor (2.0 = at most double).
    pub max_step_up: f64,
    /// Largest shrink per update, as a fraction (0.1 = at most 10% smaller).
    pub max_step_down_ratio: f64,
    /// KV usage at or above which waiting requests count as memory pressure.
    pub near_full_ratio: f64,
    /// The most of the GPU a replica may be given, as a fraction of its total memory.
    pub max_gpu_memory_utilization: f64,
    /// Smallest compute fraction ever recommended.
    pub min_compute_fraction: f64,
    /// The share of a latency objective the compute share is sized to reach (0.5 = p95 at half the SLO), so a
    /// burst has room before the objective is missed.
    pub latency_target_ratio: f64,
    /// Tolerance around that target within which the compute share does not move (0.1 = ±10%), as HPA's.
    pub latency_tolerance: f64,
    /// Fewest latency observations (TTFT requests, inter-token intervals) in the window before latency may
    /// shrink the compute share.
    pub min_latency_samples: u64,
    /// Largest growth of the compute share per update, as a factor (2.0 = at most double).
    pub compute_max_step_up: f64,
    /// Largest shrink of the compute share per update, as a fraction (0.25 = at most 25% smaller).
    pub compute_max_step_down_ratio: f64,
    /// GPU busy time at or above which a sample with waiting requests counts as saturated at its share.
    pub saturation_busy_ratio: f64,
    /// Share of the window's samples that must be saturated before saturation grows the compute share.
    pub saturation_min_ratio: f64,
    /// The KV-cache utilization the model's replica count scales on (`targets.kvCacheUtilization`), when it
    /// scales on one. The cache then holds one `max_model_len` sequence *below* that target (`max_model_len /
    /// target` tokens): a smaller cache lets one request ask for another replica, which loads the weights again
    /// to relieve a cache a fraction of their size. `None`: one sequence, vLLM's own minimum.
    #[serde(default)]
    pub kv_target_utilization: Option<f64>,
    /// How many GPUs' worth of compute caps the replica's pool hands out per GPU (`computeOversubscription`:
    /// 2.0 under MPS by default, 1.0 otherwise), when known. The share is then never below what the replica's
    /// GPU memory already pays for: `oversubscription × memory / GPU memory`. A GPU full on memory is then at
    /// most full on compute caps, so a smaller share packs nothing tighter; it only caps the replica's SMs while
    /// the GPU may be idle (measured: docs/simulator-experiments.md, "The share memory pays for"). `None`: no
    /// floor beyond `min_compute_fraction`.
    #[serde(default)]
    pub compute_oversubscription: Option<f64>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            percentile: 0.95,
            headroom: 0.2,
            min_samples: 12,
            min_window_secs: 60.0,
            max_step_up: 2.0,
            max_step_down_ratio: 0.1,
            near_full_ratio: 0.9,
            max_gpu_memory_utilization: 0.95,
            min_compute_fraction: 0.05,
            latency_target_ratio: 0.5,
            latency_tolerance: 0.1,
            min_latency_samples: 20,
            compute_max_step_up: 2.0,
            compute_max_step_down_ratio: 0.25,
            saturation_busy_ratio: 0.95,
            saturation_min_ratio: 0.1,
            kv_target_utilization: None,
            compute_oversubscription: None,
        }
    }
}

impl Config {
    /// Checks the tunables, naming the first one that is out of range and its valid range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let in_range = |name: &'static str, v: f64, lo: f64, hi: f64| {
            if v.is_finite() && v >= lo && v <= hi {
                Ok(())
            } else {
                Err(ConfigError {
                    name,
                    value: v,
                    range: format!("{lo}..={hi}"),
                })
            }
        };
        in_range("percentile", self.percentile, 0.0, 1.0)?;
        in_range("headroom", self.headroom, 0.0, 10.0)?;
        in_range("min_window_secs", self.min_window_secs, 0.0, 1e9)?;
        in_range("max_step_up", self.max_step_up, 1.0, 1000.0)?;
        in_range("max_step_down_ratio", self.max_step_down_ratio, 0.0, 1.0)?;
        in_range("near_full_ratio", self.near_full_ratio, 0.0, 1.0)?;
        in_range(
            "max_gpu_memory_utilization",
            self.max_gpu_memory_utilization,
            0.01,
            1.0,
        )?;
        in_range("min_compute_fraction", self.min_compute_fraction, 0.001, 1.0)?;
        in_range("latency_target_ratio", self.latency_target_ratio, 0.01, 1.0)?;
        in_range("latency_tolerance", self.latency_tolerance, 0.0, 0.9)?;
        in_range("compute_max_step_up", self.compute_max_step_up, 1.0, 1000.0)?;
        in_range(
            "compute_max_step_down_ratio",
            self.compute_max_step_down_ratio,
            0.0,
            0.99,
        )?;
        in_range("saturation_busy_ratio", self.saturation_busy_ratio, 0.0, 1.0)?;
        in_range("saturation_min_ratio", self.saturation_min_ratio, 0.0, 1.0)?;
        if let Some(u) = self.kv_target_utilization {
            in_range("kv_target_utilization", u, 0.01, 1.0)?;
        }
        if let Some(o) = self.compute_oversubscription {
            in_range(
                "compute_oversubscription",
                o,
                1.0,
                crate::pack::MAX_COMPUTE_OVERSUBSCRIPTION,
            )?;
        }
        if self.min_samples == 0 {
            return Err(ConfigError {
                name: "min_samples",
                value: 0.0,
                range: "1..".into(),
            });
        }
        Ok(())
    }
}

/// A recommendation tunable outside its valid range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("recommendation setting `{name}` is {value}, but must be in {range}")]
pub struct ConfigError {
    /// The setting's name.
    pub name: &'static str,
    /// Its value.
    pub value: f64,
    /// The valid range.
    pub range: String,
}
