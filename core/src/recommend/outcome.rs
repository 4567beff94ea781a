//! The outputs: a recommendation whose every field carries a reason, or why there is none yet.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Which output a [`Reason`] explains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Field {
    /// `kv_cache_memory_bytes`.
    KvCacheMemory,
    /// `gpu_memory_utilization` and `gpu_memory_mib`.
    GpuMemory,
    /// `compute_fraction`.
    ComputeFraction,
}

/// Why a field has its value (machine-readable; [`Reason::message`] has the numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReasonCode {
    /// Sized for the usage percentile plus headroom.
    Percentile,
    /// Sized for the largest usage the window saw (it exceeded percentile + headroom).
    ObservedPeak,
    /// Preemptions in the window: grown, never shrunk.
    Preemptions,
    /// Requests waited while the KV cache was nearly full: grown, never shrunk.
    WaitingAtFullKv,
    /// Raised to hold one `max_model_len` sequence (or one block).
    MinimumSequence,
    /// Growth capped by the per-update step limit.
    StepLimitedUp,
    /// Shrink slowed by the per-update step limit.
    StepLimitedDown,
    /// Reduced to what fits on the GPU.
    ClampedToGpu,
    /// Derived from the KV size plus non-KV memory.
    KvPlusNonKv,
    /// From observed SM utilization plus headroom. Produced only by older sidecars (kept so their documents
    /// still parse): time-busy cannot tell a batch of one from a batch of fifty.
    ObservedSmUtilization,
    /// No SM utilization observed: the conservative default. Produced only by older sidecars.
    DefaultCompute,
    /// Observed latency p95 is well under its target share of the objective: shrink in proportion.
    LatencyUnderObjective,
    /// Observed latency p95 is within the tolerance band of its target: keep the current share.
    LatencyWithinObjective,
    /// Observed latency p95 is over its target: grow in proportion, never shrink.
    LatencyOverObjective,
    /// Too few latency observations in the window (idle, or missing data): keep the share.
    TooFewLatencySamples,
    /// No latency objective configured: no evidence a smaller share is safe, keep the share.
    NoLatencyObjective,
    /// The replica was busy with requests waiting (or preempting) at its share: grow, never shrink.
    ComputeSaturated,
    /// More compute was asked for at the whole GPU (share 1.00): a share cannot exceed 1, so the next unit of
    /// capacity is another replica (what the replica-scaling policy reads).
    ReplicaIsNextUnit,
    /// Raised to the share the replica's GPU memory already pays for (`oversubscription × memory / GPU memory`):
    /// a smaller cap would pack nothing tighter.
    MemoryPaysForShare,
}

/// One explanation: which field, why (code), and a human sentence with the numbers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reason {
    /// The output it explains.
    pub field: Field,
    /// Why.
    pub code: ReasonCode,
    /// The same, for people, with numbers.
    pub message: String,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Where a derived input came from, reported so an operator can check it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// Given in configuration.
    Configured,
    /// From `kv_cache_memory_bytes` in `cache_config_info`.
    CacheConfigKvBytes,
    /// From the measured process GPU memory.
    MeasuredProcessMemory,
    /// From `gpu_memory_utilization × total − KV` (vLLM's budget rule; budget mode only).
    VllmBudgetRule,
    /// From the model's `config.json` (the sidecar's `--model-dir`) and vLLM's `cache_dtype`.
    ModelConfig,
}

/// A recommendation for one replica. Every field is explained by at least one entry of `reasons`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recommendation {
    /// For `--kv-cache-memory-bytes` (whole KV blocks).
    pub kv_cache_memory_bytes: u64,
    /// KV tokens that holds.
    pub kv_cache_tokens: u64,
    /// For `--gpu-memory-utilization` (rounded up to hundredths), for servers older than 0.11.
    pub gpu_memory_utilization: f64,
    /// For `tessera.dev/gpu-memory`: non-KV plus KV memory, MiB (rounded up).
    pub gpu_memory_mib: u64,
    /// For `tessera.dev/gpu-compute-fraction`, 0–1.
    pub compute_fraction: f64,
    /// Bytes per KV token used, and where it came from.
    pub bytes_per_kv_token: u64,
    /// Source of `bytes_per_kv_token`.
    pub bytes_per_kv_token_source: Source,
    /// Non-KV memory used, bytes.
    pub non_kv_bytes: u64,
    /// Source of `non_kv_bytes`.
    pub non_kv_source: Source,
    /// Why each field has its value, in the order the rules applied.
    pub reasons: Vec<Reason>,
}

impl Recommendation {
    /// One line for a status condition: the last reason of each field (the one that decided it).
    pub fn summary(&self) -> String {
        [Field::KvCacheMemory, Field::GpuMemory, Field::ComputeFraction]
            .iter()
            .filter_map(|f| self.reasons.iter().rev().find(|r| r.field == *f))
            .map(|r| r.message.as_str())
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// What fits both this replica and `other`: a model's replicas share one pod template, which must fit the
    /// busiest of them. Each field is the larger of the two, with the reasons of the replica that asked for it, so
    /// the result still explains every number it shows. The KV size carries its geometry (tokens, bytes per token,
    /// non-KV memory and their sources) with it; `gpu_memory_utilization` and MiB are taken on their own, since a
    /// replica with more non-KV memory can need more of the GPU for the same KV size.
    pub fn covering(mut self, other: &Recommendation) -> Recommendation {
        if other.kv_cache_memory_bytes > self.kv_cache_memory_bytes {
            self.kv_cache_memory_bytes = other.kv_cache_memory_bytes;
            self.kv_cache_tokens = other.kv_cache_tokens;
            self.bytes_per_kv_token = other.bytes_per_kv_token;
            self.bytes_per_kv_token_source = other.bytes_per_kv_token_source;
            self.non_kv_bytes = other.non_kv_bytes;
            self.non_kv_source = other.non_kv_source;
            self.take_reasons(other, Field::KvCacheMemory);
        }
        if other.gpu_memory_mib > self.gpu_memory_mib
            || other.gpu_memory_utilization > self.gpu_memory_utilization
        {
            self.gpu_memory_mib = self.gpu_memory_mib.max(other.gpu_memory_mib);
            self.gpu_memory_utilization = self.gpu_memory_utilization.max(other.gpu_memory_utilization);
            self.take_reasons(other, Field::GpuMemory);
        }
        if other.compute_fraction > self.compute_fraction {
            self.compute_fraction = other.compute_fraction;
            self.take_reasons(other, Field::ComputeFraction);
        }
        self
    }

    /// Replaces this recommendation's reasons for `field` with `other`'s.
    fn take_reasons(&mut self, other: &Recommendation, field: Field) {
        self.reasons.retain(|r| r.field != field);
        self.reasons
            .extend(other.reasons.iter().filter(|r| r.field == field).cloned());
    }
}

/// The recommendation that fits every one of a model's replicas ([`Recommendation::covering`] over all of them);
/// `None` when no replica has one, so the caller keeps what it had: missing data never shrinks anything.
pub fn largest_need<'a>(recs: impl IntoIterator<Item = &'a Recommendation>) -> Option<Recommendation> {
    let mut recs = recs.into_iter();
    let first = recs.next()?.clone();
    Some(recs.fold(first, Recommendation::covering))
}

/// Why there is no recommendation yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NotYetCode {
    /// Fewer usable samples than `min_samples`.
    TooFewSamples,
    /// The window spans less than `min_window_secs`.
    WindowTooShort,
    /// `num_gpu_blocks` or `block_size` unknown or zero.
    UnknownKvGeometry,
    /// GPU total memory unknown.
    UnknownGpuMemory,
    /// Bytes per KV token could not be determined.
    UnknownBytesPerKvToken,
    /// Non-KV memory could not be determined.
    UnknownNonKvMemory,
    /// The inputs contradict each other (e.g. non-KV memory larger than the GPU).
    InconsistentInputs,
    /// A recommendation setting is out of range.
    InvalidConfig,
    /// A derived figure is outside what any real model on a real GPU can have (see `recommend::bounds`).
    Implausible,
}

/// The answer of [`recommend`](super::recommend).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Outcome {
    /// A recommendation.
    Ready(Recommendation),
    /// None yet, and why; the caller keeps whatever it had.
    NotYet {
        /// Machine-readable reason.
        code: NotYetCode,
        /// What is missing and how to fix it.
        reason: String,
    },
}

impl Outcome {
    /// The recommendation, if there is one.
    pub fn recommendation(&self) -> Option<&Recommendation> {
        match self {
            Outcome::Ready(r) => Some(r),
            Outcome::NotYet { .. } => None,
        }
    }
}

pub(crate) fn not_yet(code: NotYetCode, reason: impl Into<String>) -> Outcome {
    Outcome::NotYet {
        code,
        reason: reason.into(),
    }
}
