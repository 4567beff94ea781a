//! The inputs of the recommendation: what the caller observed and knows.

use super::Recommendation;
use super::geometry::{CacheDtype, ModelFacts};
use serde::{Deserialize, Serialize};

/// One scrape's worth of what the recommendation looks at. Every field but the time may be missing (a family
/// absent from the page, or a GPU without NVML); a missing value is skipped, never read as zero.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Observation {
    /// When it was observed, in seconds since any fixed origin (the caller's clock; the core never reads one).
    pub at_secs: f64,
    /// KV cache usage as a 0–1 fraction of `num_gpu_blocks` (`vllm:kv_cache_usage_perc`).
    pub kv_usage: Option<f64>,
    /// Requests waiting to be scheduled (`vllm:num_requests_waiting`).
    pub requests_waiting: Option<f64>,
    /// The cumulative preemption counter (`vllm:num_preemptions_total`); resets are handled.
    pub preemptions_total: Option<f64>,
    /// This replica's GPU SM utilization as a 0–1 fraction (NVML on a dedicated GPU, or the gpu-agent).
    pub sm_utilization: Option<f64>,
}

/// The shape of this replica's KV cache, from `vllm:cache_config_info` and the model's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvGeometry {
    /// `num_gpu_blocks`: KV blocks vLLM allocated.
    pub num_gpu_blocks: u64,
    /// `block_size`: tokens per block (16 by default).
    pub block_size: u64,
    /// The longest sequence the server accepts; the KV cache must hold at least one. `None` = unknown.
    pub max_model_len: Option<u64>,
}

impl KvGeometry {
    /// Tokens the current KV cache holds.
    pub fn tokens(&self) -> u64 {
        self.num_gpu_blocks.saturating_mul(self.block_size)
    }
}

/// What is known about this replica's GPU memory. Anything may be unknown; see the module docs for how the
/// missing pieces are derived.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct MemoryFacts {
    /// Total memory of the GPU (NVML or configuration), bytes.
    pub gpu_total_bytes: Option<u64>,
    /// Bytes per KV token from configuration.
    pub bytes_per_kv_token: Option<u64>,
    /// Non-KV memory (weights + activation peak + CUDA context) from configuration, bytes.
    pub non_kv_bytes: Option<u64>,
    /// Measured GPU memory of this replica's process(es), bytes (NVML device use on a dedicated GPU).
    pub process_gpu_bytes: Option<u64>,
    /// `gpu_memory_utilization` the server was started with (`cache_config_info`).
    pub gpu_memory_utilization: Option<f64>,
    /// `kv_cache_memory_bytes` the server was started with, when it was set (`cache_config_info`, vLLM ≥ 0.11).
    pub kv_cache_memory_bytes: Option<u64>,
    /// `num_gpu_blocks_override` the server was started with, when it was set (`cache_config_info`).
    #[serde(default)]
    pub num_gpu_blocks_override: Option<u64>,
    /// vLLM's `cache_dtype` (`cache_config_info`): the KV element width.
    #[serde(default)]
    pub cache_dtype: Option<CacheDtype>,
    /// The model's geometry and weights, when the caller can read its files (the sidecar's `--model-dir`).
    #[serde(default)]
    pub model: Option<ModelFacts>,
}

/// Everything [`recommend`](super::recommend) looks at.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    /// The window, oldest first (unsorted input is tolerated: it is sorted by time internally).
    pub window: &'a [Observation],
    /// The KV cache shape.
    pub geometry: KvGeometry,
    /// What is known about memory.
    pub memory: MemoryFacts,
    /// The reference the step bound (rule 5) is measured from; `None` bounds it from what runs now (the current
    /// KV geometry and compute share). A replica's round always passes `None` ([`Input::of_replica`]); only a
    /// search for the steady state (the simulator's calibration) iterates on its own last answer.
    pub previous: Option<&'a Recommendation>,
    /// What the compute-share rule needs besides the window: the share the replica runs with, its latency
    /// objectives and the window's observed latency. `ComputeFacts::default()` = whole GPU, no objective.
    pub compute: ComputeFacts,
}

impl<'a> Input<'a> {
    /// One replica's input, as the sidecar builds it and the simulator builds it for each of its replicas: the
    /// window, the KV geometry, what is known about memory and the compute facts, with the step bounded from
    /// **what runs** (`previous: None`), never from the model's last recommendation.
    ///
    /// Why what runs: the window's latency and KV use were measured at the share and the cache the replica runs
    /// with, so a step from there rests on evidence. A recommendation comes into force only after its stability
    /// window and reaches only new pods, so a step from the last recommendation would compound growth (or
    /// shrinkage) on evidence measured at another size, round after round, before any pod runs it. What runs is
    /// also the one reference the sidecar always has: it keeps no model-wide recommendation across restarts.
    pub fn of_replica(
        window: &'a [Observation],
        geometry: KvGeometry,
        memory: MemoryFacts,
        compute: ComputeFacts,
    ) -> Self {
        Input {
            window,
            geometry,
            memory,
            previous: None,
            compute,
        }
    }
}

/// A latency percentile observed over the window, with how many observations it rests on.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct LatencyObservation {
    /// The 95th percentile over the window, seconds (from the difference of two cumulative histograms); for the
    /// TTFT under `ttftSloPercentile: 99`, the sidecar puts the objective's p99 here.
    pub p95_secs: f64,
    /// Observations in the window (requests for TTFT, token intervals for inter-token latency).
    pub samples: f64,
}

/// What the compute-share rule looks at besides the window of [`Observation`]s. Every field may be unknown.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct ComputeFacts {
    /// The compute share this replica runs with now (`tessera.dev/gpu-compute-fraction`); `None` = whole GPU.
    /// Latency was observed at this share, so the ratio rule scales from it.
    pub current_share: Option<f64>,
    /// The time-to-first-token p95 objective, seconds.
    pub ttft_slo_secs: Option<f64>,
    /// The inter-token latency p95 objective, seconds.
    pub itl_slo_secs: Option<f64>,
    /// Observed TTFT over the window (queue time included: what a client waits).
    pub ttft: Option<LatencyObservation>,
    /// Observed inter-token latency over the window.
    pub itl: Option<LatencyObservation>,
}
