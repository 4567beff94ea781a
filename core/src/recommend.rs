//! The memory and compute recommendation for one replica (issue 2, item 3).
//!
//! vLLM reserves `gpu_memory_utilization × total` GPU memory at start-up and fills whatever is left after the
//! weights, the activation peak and the CUDA context with KV cache, used or not. This module decides how much KV
//! cache a replica really needs, from a window of what it actually used, and turns that into the numbers a pod is
//! started with: `--kv-cache-memory-bytes`, `--gpu-memory-utilization`, the `tessera.dev/gpu-memory` MiB and the
//! `tessera.dev/gpu-compute-fraction`.
//!
//! [`recommend`] is a pure function: the caller passes the window ([`Observation`]s, with their times), the KV
//! geometry, what is known about memory, the previous recommendation and a [`Config`]; it returns either a
//! [`Recommendation`] whose every field carries a [`Reason`], or [`Outcome::NotYet`] with the reason why not. The
//! sidecar calls it after each scrape; the what-if simulator calls it per simulated replica.
//!
//! The rules, in the order they are applied to the KV size (in tokens, then bytes):
//! 1. Too little history (fewer than `min_samples` usable samples, or a window shorter than `min_window_secs`)
//!    → `NotYet`. Missing data never shrinks anything.
//! 2. Target = `max(percentile(usage) × (1 + headroom), max(usage))` of the current KV size: a high percentile
//!    plus headroom, and never less than the largest amount the window actually used.
//! 3. Pressure — any preemption in the window, or requests waiting while KV usage was at least
//!    `near_full_ratio` — means the cache was too small: the target becomes at least the current size plus
//!    headroom (grow), and never less than the previous recommendation (never shrink).
//! 4. At least one `max_model_len` sequence (vLLM refuses to start with less), and at least one block.
//! 5. Bounded step relative to the previous recommendation (or the current size when there is none): at most
//!    `max_step_up ×` up and `max_step_down_ratio` down per update. The floor of rule 2 still wins over the step
//!    bound, since recommending less than what was just used would cause preemptions by construction.
//! 6. Clamp to what fits: `non_kv + kv ≤ max_gpu_memory_utilization × total`. This is the only rule that can
//!    go below the observed peak (a GPU cannot hold more than it has), and the reason says so.
//!
//! The result is rounded *up* to whole KV blocks, MiB and hundredths of utilization, so rounding never shrinks it.
//!
//! **The compute share** ([`recommend_compute`]) is sized against latency, not GPU busy time: a decode step is
//! memory-bound, so a replica with one request in flight reads "busy" as much as one with fifty, and a busy-time
//! rule gives every steadily served model the whole GPU. Prefill and decode steps take about `1 / share` as long,
//! so the share scales like HPA's ratio rule on the latency objectives ([`ComputeFacts`]):
//! 1. With an objective (TTFT p95 and/or inter-token p95) and at least `min_latency_samples` observations:
//!    `share' = current × observed p95 / (latency_target_ratio × SLO)`, no change within `±latency_tolerance`,
//!    the largest over the objectives. Over the target → grow, never below what runs now or was recommended.
//! 2. Saturation at the current share (busy ≥ `saturation_busy_ratio` or preempting while requests waited, in
//!    at least `saturation_min_ratio` of the samples) → grow by `compute_max_step_up`, never shrink.
//! 3. Too few latency observations (idle, missing data) or no objective configured → keep the previous
//!    recommendation (or the current share; whole GPU when unknown). Missing data never shrinks the share.
//! 4. Bounded step per update from the previous recommendation (or the current share): at most
//!    `× compute_max_step_up` up and `compute_max_step_down_ratio` down; then `[min_compute_fraction, 1]`.
//!
//! **Bytes per KV token** (what converts tokens to bytes) come, in order of preference, from: configuration
//! (`2 × layers × kv_heads × head_dim × dtype bytes`, 1× for MLA models); `kv_cache_memory_bytes` in vLLM's
//! `cache_config_info` divided by `num_gpu_blocks × block_size` (vLLM sized the cache from exactly that); or the
//! measured process GPU memory: `(process GPU memory − non-KV memory) / (num_gpu_blocks × block_size)`.
//! **Non-KV memory** (weights + activation peak + CUDA context and graphs) comes from configuration; or from the
//! measured process memory minus the KV cache; or from vLLM's own budget rule, `KV = util × total − non_KV`, i.e.
//! `non_KV = gpu_memory_utilization × total − KV`. Each source is reported so an operator can check it.

use serde::{Deserialize, Serialize};
use std::fmt;

const MIB: u64 = 1024 * 1024;

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
}

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

/// Everything [`recommend`] looks at.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    /// The window, oldest first (unsorted input is tolerated: it is sorted by time internally).
    pub window: &'a [Observation],
    /// The KV cache shape.
    pub geometry: KvGeometry,
    /// What is known about memory.
    pub memory: MemoryFacts,
    /// The previous recommendation for this replica, if any: the step bound (rule 5) is measured from it.
    /// Pass the one that was *applied*; `None` bounds the step from what runs now (the current KV geometry),
    /// which is what the sidecar does, since what runs is the applied one. The simulator passes its last one.
    pub previous: Option<&'a Recommendation>,
    /// What the compute-share rule needs besides the window: the share the replica runs with, its latency
    /// objectives and the window's observed latency. `ComputeFacts::default()` = whole GPU, no objective.
    pub compute: ComputeFacts,
}

/// A latency percentile observed over the window, with how many observations it rests on.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct LatencyObservation {
    /// The 95th percentile over the window, seconds (from the difference of two cumulative histograms).
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
    /// From `gpu_memory_utilization × total − KV` (vLLM's budget rule).
    VllmBudgetRule,
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
}

/// The answer of [`recommend`].
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

fn not_yet(code: NotYetCode, reason: impl Into<String>) -> Outcome {
    Outcome::NotYet {
        code,
        reason: reason.into(),
    }
}

/// Nearest-rank percentile of a non-empty, sorted slice.
fn percentile_sorted(sorted: &[f64], p: f64) -> f64 {
    let n = sorted.len();
    let rank = (p * n as f64).ceil() as usize;
    sorted[rank.clamp(1, n) - 1]
}

/// Increase of a cumulative counter over the window, treating a decrease as a restart from zero.
fn counter_increase(values: impl Iterator<Item = f64>) -> f64 {
    let mut prev: Option<f64> = None;
    let mut total = 0.0;
    for v in values.filter(|v| v.is_finite() && *v >= 0.0) {
        if let Some(p) = prev {
            total += if v >= p { v - p } else { v };
        }
        prev = Some(v);
    }
    total
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1024.0 * MIB as f64))
}

/// The resolved memory inputs.
struct Resolved {
    total: u64,
    bytes_per_token: u64,
    bpt_source: Source,
    non_kv: u64,
    non_kv_source: Source,
}

fn resolve_memory(geometry: &KvGeometry, mem: &MemoryFacts) -> Result<Resolved, Outcome> {
    let tokens = geometry.tokens();
    let total = match mem.gpu_total_bytes {
        Some(t) if t > 0 => t,
        _ => {
            return Err(not_yet(
                NotYetCode::UnknownGpuMemory,
                "the GPU's total memory is unknown: NVML is not available; pass --gpu-memory-mib",
            ));
        }
    };
    let kv_from_config = mem.kv_cache_memory_bytes.filter(|b| *b > 0);
    let (bytes_per_token, bpt_source) = if let Some(b) = mem.bytes_per_kv_token.filter(|b| *b > 0) {
        (b, Source::Configured)
    } else if let Some(kv) = kv_from_config.filter(|kv| *kv >= tokens) {
        (kv / tokens, Source::CacheConfigKvBytes)
    } else if let (Some(used), Some(non_kv)) = (mem.process_gpu_bytes, mem.non_kv_bytes) {
        let kv = used.saturating_sub(non_kv);
        if kv < tokens {
            return Err(not_yet(
                NotYetCode::InconsistentInputs,
                format!(
                    "measured process GPU memory ({}) minus configured non-KV memory ({}) leaves no room for \
                     {tokens} KV tokens: check --non-kv-memory-mib, or pass --bytes-per-kv-token",
                    gib(used),
                    gib(non_kv)
                ),
            ));
        }
        (kv / tokens, Source::MeasuredProcessMemory)
    } else {
        return Err(not_yet(
            NotYetCode::UnknownBytesPerKvToken,
            "bytes per KV token are unknown: pass --bytes-per-kv-token (2 × layers × kv_heads × head_dim × dtype \
             bytes), or start vLLM with --kv-cache-memory-bytes, or give --non-kv-memory-mib with NVML present",
        ));
    };
    let kv_now = tokens.saturating_mul(bytes_per_token);
    let (non_kv, non_kv_source) = if let Some(n) = mem.non_kv_bytes {
        (n, Source::Configured)
    } else if let Some(used) = mem.process_gpu_bytes.filter(|u| *u > kv_now) {
        (used - kv_now, Source::MeasuredProcessMemory)
    } else if let Some(util) = mem
        .gpu_memory_utilization
        .filter(|u| u.is_finite() && *u > 0.0 && *u <= 1.0)
    {
        let budget = (util * total as f64) as u64;
        if budget <= kv_now {
            return Err(not_yet(
                NotYetCode::InconsistentInputs,
                format!(
                    "gpu_memory_utilization {util} × {} = {} is not more than the KV cache ({}): the GPU total \
                     or bytes per KV token is wrong; pass --non-kv-memory-mib",
                    gib(total),
                    gib(budget),
                    gib(kv_now)
                ),
            ));
        }
        (budget - kv_now, Source::VllmBudgetRule)
    } else {
        return Err(not_yet(
            NotYetCode::UnknownNonKvMemory,
            "non-KV memory (weights + activations + CUDA context) is unknown: pass --non-kv-memory-mib, or run \
             with NVML, or let vLLM report gpu_memory_utilization in cache_config_info",
        ));
    };
    if non_kv >= total {
        return Err(not_yet(
            NotYetCode::InconsistentInputs,
            format!(
                "non-KV memory ({}) is not less than the GPU's total ({})",
                gib(non_kv),
                gib(total)
            ),
        ));
    }
    Ok(Resolved {
        total,
        bytes_per_token,
        bpt_source,
        non_kv,
        non_kv_source,
    })
}

/// The compute share and why (see [`recommend_compute`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ComputeDecision {
    /// The recommended share, within `[min_compute_fraction, 1]`, in hundredths rounded up.
    pub share: f64,
    /// Why, in the order the rules applied (each with `field: ComputeFraction`).
    pub reasons: Vec<Reason>,
}

/// What one latency objective says about the share it was observed at.
struct Objective {
    name: &'static str,
    slo: f64,
    /// `Some((p95, samples))` when there is enough evidence.
    seen: Option<(f64, f64)>,
    samples: f64,
}

/// True when a sample shows the replica saturated at its share: requests waiting while the GPU was busy all the
/// time, or while it preempted. Returns (saturated samples, samples that could show it).
fn saturation(window: &[Observation], config: &Config) -> (usize, usize) {
    let mut prev_preemptions: Option<f64> = None;
    let (mut saturated, mut seen) = (0, 0);
    for o in window {
        let preempted = match (prev_preemptions, o.preemptions_total) {
            (Some(p), Some(c)) if c.is_finite() => c > p || (c < p && c > 0.0),
            _ => false,
        };
        if o.preemptions_total.is_some_and(f64::is_finite) {
            prev_preemptions = o.preemptions_total;
        }
        let busy = o.sm_utilization.filter(|b| b.is_finite());
        if busy.is_none() && o.preemptions_total.is_none() {
            continue;
        }
        seen += 1;
        let waiting = o.requests_waiting.is_some_and(|w| w.is_finite() && w > 0.0);
        if waiting && (busy.is_some_and(|b| b >= config.saturation_busy_ratio) || preempted) {
            saturated += 1;
        }
    }
    (saturated, seen)
}

/// The compute-share rule. Pure; `window` is sorted oldest first.
///
/// Time-busy is not a measure of need for an LLM server (a memory-bound decode step keeps the GPU busy with one
/// request as with fifty), so the share is sized against latency, which does scale with it: prefill and decode
/// steps both take about `1 / share` as long. In order:
/// 1. **Evidence.** Each configured objective (TTFT p95, inter-token p95) with at least `min_latency_samples`
///    observations gives `r = observed p95 / (latency_target_ratio × SLO)`; within `1 ± latency_tolerance`
///    it counts as 1 (no change). With an objective over target (`r > 1 + tolerance`): `current × max r`, and
///    never below what runs now or the previous recommendation. With all objectives under target:
///    `current × max r`. An objective without enough observations (idle, or missing data) blocks any shrink:
///    keep the previous recommendation (or the current share). No objective at all: keep it too — there is no
///    evidence a smaller share is safe; GPU busy time is reported, never used to shrink.
/// 2. **Saturation** (at least `saturation_min_ratio` of the samples busy ≥ `saturation_busy_ratio` or
///    preempting while requests waited) → at least `max(current, previous) × compute_max_step_up`; never shrink.
/// 3. **Bounded step** from the previous recommendation (or the current share): at most
///    `× compute_max_step_up` up and `compute_max_step_down_ratio` down per update; a grow signal is never
///    capped below `max(current, previous)`.
/// 4. Rounded up to hundredths, clamped to `[min_compute_fraction, 1]`.
pub fn recommend_compute(
    window: &[Observation],
    facts: &ComputeFacts,
    previous: Option<f64>,
    config: &Config,
) -> ComputeDecision {
    let usable = |v: &f64| v.is_finite() && *v > 0.0;
    let current = facts.current_share.filter(usable).map_or(1.0, |s| s.min(1.0));
    let reference = previous.filter(usable).map_or(current, |s| s.min(1.0));
    let mut reasons = Vec::new();
    let mut reason = |code, message: String| {
        reasons.push(Reason {
            field: Field::ComputeFraction,
            code,
            message,
        })
    };
    let busy: Vec<f64> = window
        .iter()
        .filter_map(|o| o.sm_utilization)
        .filter(|b| b.is_finite())
        .collect();
    let busy_note = if busy.is_empty() {
        String::new()
    } else {
        format!(
            "; GPU busy {:.0}% of the time on average at this share (reported only: a decode step keeps the GPU \
             busy at any batch size)",
            100.0 * busy.iter().sum::<f64>() / busy.len() as f64
        )
    };

    // Rule 1: latency evidence.
    let objectives: Vec<Objective> = [
        ("TTFT", facts.ttft_slo_secs, facts.ttft),
        ("inter-token latency", facts.itl_slo_secs, facts.itl),
    ]
    .into_iter()
    .filter_map(|(name, slo, seen)| {
        let slo = slo.filter(usable)?;
        let samples = seen.map_or(0.0, |l| if l.samples.is_finite() { l.samples } else { 0.0 });
        let seen = seen
            .filter(|l| l.p95_secs.is_finite() && l.p95_secs >= 0.0)
            .filter(|_| samples >= config.min_latency_samples as f64)
            .map(|l| (l.p95_secs, samples));
        Some(Objective {
            name,
            slo,
            seen,
            samples,
        })
    })
    .collect();
    let band = |r: f64| {
        if (r - 1.0).abs() <= config.latency_tolerance {
            1.0
        } else {
            r
        }
    };
    let mut pressure = false;
    let mut desired;
    if objectives.is_empty() {
        desired = reference;
        reason(
            ReasonCode::NoLatencyObjective,
            format!(
                "no latency objective (--ttft-slo / --itl-slo): no evidence a smaller share is safe, keeping \
                 {reference:.2}{busy_note}"
            ),
        );
    } else {
        // The objective asking the most decides (the max over TTFT and inter-token latency).
        let mut worst: Option<(f64, &Objective)> = None;
        for o in &objectives {
            if let Some((p95, _)) = o.seen {
                let r = band(p95 / (config.latency_target_ratio * o.slo));
                if worst.is_none_or(|(w, _)| r > w) {
                    worst = Some((r, o));
                }
            }
        }
        let missing: Vec<&Objective> = objectives.iter().filter(|o| o.seen.is_none()).collect();
        let describe = |o: &Objective| match o.seen {
            Some((p95, n)) => format!(
                "{} p95 {:.3} s over {n:.0} observations vs target {:.3} s ({:.0}% of the {:.3} s objective)",
                o.name,
                p95,
                config.latency_target_ratio * o.slo,
                config.latency_target_ratio * 100.0,
                o.slo
            ),
            None => format!(
                "{} has {:.0} observations in the window ({} needed)",
                o.name, o.samples, config.min_latency_samples
            ),
        };
        match worst {
            Some((r, o)) if r > 1.0 => {
                pressure = true;
                desired = current * r;
                reason(
                    ReasonCode::LatencyOverObjective,
                    format!(
                        "{}: grow {current:.2} × {r:.2} = {desired:.2}, never below {:.2} (what runs now or was \
                         recommended){busy_note}",
                        describe(o),
                        current.max(reference)
                    ),
                );
            }
            _ if !missing.is_empty() => {
                desired = reference;
                reason(
                    ReasonCode::TooFewLatencySamples,
                    format!(
                        "{}: not enough evidence to shrink, keeping {reference:.2}{busy_note}",
                        missing.iter().map(|o| describe(o)).collect::<Vec<_>>().join("; ")
                    ),
                );
            }
            Some((r, o)) if r >= 1.0 => {
                desired = current;
                reason(
                    ReasonCode::LatencyWithinObjective,
                    format!(
                        "{}: within ±{:.0}%, keeping {current:.2}{busy_note}",
                        describe(o),
                        config.latency_tolerance * 100.0
                    ),
                );
            }
            Some((r, o)) => {
                desired = current * r;
                reason(
                    ReasonCode::LatencyUnderObjective,
                    format!(
                        "{} (the objective asking the most): shrink {current:.2} × {r:.2} = {desired:.2}{busy_note}",
                        describe(o)
                    ),
                );
            }
            // Unreachable in practice: no evidence means `missing` is not empty. Keep, to be safe.
            None => desired = reference,
        }
    }

    // Rule 2: saturation at the current share.
    let (saturated, seen) = saturation(window, config);
    if saturated > 0 && saturated as f64 >= config.saturation_min_ratio * seen as f64 {
        pressure = true;
        let grown = current.max(reference) * config.compute_max_step_up;
        if grown > desired {
            desired = grown;
        }
        reason(
            ReasonCode::ComputeSaturated,
            format!(
                "{saturated} of {seen} samples busy ≥ {:.0}% (or preempting) while requests waited at share \
                 {current:.2}: grow to at least {grown:.2}, never shrink",
                config.saturation_busy_ratio * 100.0
            ),
        );
    }

    // Rule 3: bounded step from the previous recommendation (or what runs now).
    let floor = if pressure { current.max(reference) } else { 0.0 };
    let upper = (reference * config.compute_max_step_up).max(floor);
    let lower = reference * (1.0 - config.compute_max_step_down_ratio);
    if desired > upper {
        reason(
            ReasonCode::StepLimitedUp,
            format!(
                "compute share growth capped at ×{} per update: {desired:.2} → {upper:.2} (from {reference:.2})",
                config.compute_max_step_up
            ),
        );
        desired = upper;
    } else if desired < lower {
        reason(
            ReasonCode::StepLimitedDown,
            format!(
                "compute share shrink limited to {:.0}% per update: {desired:.2} → {lower:.2} (from {reference:.2})",
                config.compute_max_step_down_ratio * 100.0
            ),
        );
        desired = lower;
    }
    desired = desired.max(floor);

    // Rule 4: hundredths rounded up (the epsilon keeps 0.75 from becoming 0.76 through float noise), clamped.
    let share = ((desired * 100.0 - 1e-9).ceil() / 100.0).clamp(config.min_compute_fraction, 1.0);
    ComputeDecision { share, reasons }
}

/// Computes this replica's recommendation from a window of observations. Pure: same input, same answer.
pub fn recommend(input: &Input<'_>, config: &Config) -> Outcome {
    if let Err(e) = config.validate() {
        return not_yet(NotYetCode::InvalidConfig, e.to_string());
    }
    let geometry = input.geometry;
    if geometry.num_gpu_blocks == 0 || geometry.block_size == 0 {
        return not_yet(
            NotYetCode::UnknownKvGeometry,
            "num_gpu_blocks or block_size is unknown: vLLM has not published vllm:cache_config_info yet",
        );
    }

    // Rule 1: enough usable history.
    let mut window: Vec<Observation> = input
        .window
        .iter()
        .filter(|o| o.at_secs.is_finite())
        .copied()
        .collect();
    window.sort_by(|a, b| a.at_secs.total_cmp(&b.at_secs));
    let mut usage: Vec<f64> = window
        .iter()
        .filter_map(|o| o.kv_usage)
        .filter(|u| u.is_finite())
        .map(|u| u.clamp(0.0, 1.0))
        .collect();
    if usage.len() < config.min_samples {
        return not_yet(
            NotYetCode::TooFewSamples,
            format!(
                "{} KV usage samples in the window, {} needed",
                usage.len(),
                config.min_samples
            ),
        );
    }
    let span = match (window.first(), window.last()) {
        (Some(a), Some(b)) => b.at_secs - a.at_secs,
        _ => 0.0,
    };
    if span < config.min_window_secs {
        return not_yet(
            NotYetCode::WindowTooShort,
            format!(
                "the window spans {span:.0} s, {:.0} s needed",
                config.min_window_secs
            ),
        );
    }
    let mem = match resolve_memory(&geometry, &input.memory) {
        Ok(m) => m,
        Err(o) => return o,
    };

    let tokens_now = geometry.tokens();
    let block_bytes = geometry.block_size.saturating_mul(mem.bytes_per_token);
    let mut reasons = Vec::new();
    let mut reason = |field, code, message: String| reasons.push(Reason { field, code, message });

    // Rule 2: percentile + headroom, never below the peak.
    usage.sort_by(f64::total_cmp);
    let p = percentile_sorted(&usage, config.percentile);
    let peak = usage.last().copied().unwrap_or(0.0);
    let peak_tokens = (peak * tokens_now as f64).ceil() as u64;
    let pct_tokens = (p * (1.0 + config.headroom) * tokens_now as f64).ceil() as u64;
    let mut target = if pct_tokens >= peak_tokens {
        reason(
            Field::KvCacheMemory,
            ReasonCode::Percentile,
            format!(
                "p{:.0} KV usage {:.1}% of {tokens_now} tokens + {:.0}% headroom = {pct_tokens} tokens",
                config.percentile * 100.0,
                p * 100.0,
                config.headroom * 100.0
            ),
        );
        pct_tokens
    } else {
        reason(
            Field::KvCacheMemory,
            ReasonCode::ObservedPeak,
            format!(
                "peak KV usage {:.1}% of {tokens_now} tokens = {peak_tokens} tokens exceeds p{:.0} + headroom",
                peak * 100.0,
                config.percentile * 100.0
            ),
        );
        peak_tokens
    };

    // Rule 3: pressure means grow, never shrink.
    let preemptions = counter_increase(window.iter().filter_map(|o| o.preemptions_total));
    let waited_full = window.iter().any(|o| {
        matches!((o.kv_usage, o.requests_waiting), (Some(u), Some(w)) if u >= config.near_full_ratio && w > 0.0)
    });
    let prev_tokens = input.previous.map(|r| r.kv_cache_tokens);
    let pressure = preemptions > 0.0 || waited_full;
    if pressure {
        let grown = ((tokens_now as f64) * (1.0 + config.headroom)).ceil() as u64;
        let floor = grown.max(prev_tokens.unwrap_or(0));
        target = target.max(floor);
        let (code, why) = if preemptions > 0.0 {
            (
                ReasonCode::Preemptions,
                format!("{preemptions:.0} preemption(s) in the window"),
            )
        } else {
            (
                ReasonCode::WaitingAtFullKv,
                format!(
                    "requests waited while KV usage was ≥ {:.0}%",
                    config.near_full_ratio * 100.0
                ),
            )
        };
        reason(
            Field::KvCacheMemory,
            code,
            format!("{why}: grow to at least {floor} tokens (current {tokens_now} + headroom, never shrink)"),
        );
    }

    // Rule 4: one max-length sequence, one block.
    let min_tokens = geometry.max_model_len.unwrap_or(0).max(geometry.block_size);
    if target < min_tokens {
        target = min_tokens;
        reason(
            Field::KvCacheMemory,
            ReasonCode::MinimumSequence,
            format!("raised to {min_tokens} tokens: the cache must hold one max_model_len sequence"),
        );
    }

    // Rule 5: bounded step from the previous recommendation (or what runs now). Under pressure the reference
    // is at least what runs now, so a stale small recommendation cannot hold a preempting replica back.
    let reference = match prev_tokens {
        Some(prev) if pressure => prev.max(tokens_now),
        Some(prev) => prev,
        None => tokens_now,
    }
    .max(1);
    let step_max = ((reference as f64) * config.max_step_up).floor() as u64;
    let step_min = ((reference as f64) * (1.0 - config.max_step_down_ratio)).ceil() as u64;
    // The step bound may not cap below what was used, below one sequence, or (under pressure) below what runs.
    let hard_floor = peak_tokens
        .max(min_tokens)
        .max(if pressure { tokens_now } else { 0 });
    let cap = step_max.max(hard_floor);
    if target > cap {
        reason(
            Field::KvCacheMemory,
            ReasonCode::StepLimitedUp,
            format!(
                "growth capped at ×{} per update: {target} → {cap} tokens (from {reference})",
                config.max_step_up
            ),
        );
        target = cap;
    } else if target < step_min {
        reason(
            Field::KvCacheMemory,
            ReasonCode::StepLimitedDown,
            format!(
                "shrink limited to {:.0}% per update: {target} → {step_min} tokens (from {reference})",
                config.max_step_down_ratio * 100.0
            ),
        );
        target = step_min;
    }

    // Round up to whole blocks; then rule 6: clamp to what fits.
    let blocks = target.div_ceil(geometry.block_size);
    let mut kv_bytes = blocks.saturating_mul(block_bytes);
    let cap_total = (config.max_gpu_memory_utilization * mem.total as f64).floor() as u64;
    let cap_kv = cap_total.saturating_sub(mem.non_kv);
    let cap_kv_blocks = cap_kv / block_bytes.max(1);
    if blocks > cap_kv_blocks {
        kv_bytes = cap_kv_blocks.saturating_mul(block_bytes);
        let below_peak = cap_kv_blocks.saturating_mul(geometry.block_size) < peak_tokens;
        reason(
            Field::KvCacheMemory,
            ReasonCode::ClampedToGpu,
            format!(
                "clamped to {} of KV: {:.0}% of {} minus {} non-KV memory is all that fits{}",
                gib(kv_bytes),
                config.max_gpu_memory_utilization * 100.0,
                gib(mem.total),
                gib(mem.non_kv),
                if below_peak {
                    " (below the observed peak: this model needs a larger GPU)"
                } else {
                    ""
                }
            ),
        );
    }
    let kv_tokens = kv_bytes / mem.bytes_per_token.max(1);

    // GPU memory: non-KV plus KV, rounded up (MiB; hundredths of utilization), still within the cap.
    let need = mem.non_kv.saturating_add(kv_bytes);
    let gpu_memory_mib = need.div_ceil(MIB);
    let util_exact = need as f64 / mem.total as f64;
    let gpu_memory_utilization = ((util_exact * 100.0).ceil() / 100.0)
        .min(config.max_gpu_memory_utilization)
        .max(util_exact);
    reason(
        Field::GpuMemory,
        ReasonCode::KvPlusNonKv,
        format!(
            "{} KV + {} non-KV ({:?}) = {gpu_memory_mib} MiB = {:.1}% of {} (bytes/token {} from {:?})",
            gib(kv_bytes),
            gib(mem.non_kv),
            mem.non_kv_source,
            util_exact * 100.0,
            gib(mem.total),
            mem.bytes_per_token,
            mem.bpt_source
        ),
    );

    // Compute: the latency/saturation rule (see `recommend_compute`).
    let previous_share = input.previous.map(|r| r.compute_fraction);
    let compute = recommend_compute(&window, &input.compute, previous_share, config);
    reasons.extend(compute.reasons);
    let compute_fraction = compute.share;

    Outcome::Ready(Recommendation {
        kv_cache_memory_bytes: kv_bytes,
        kv_cache_tokens: kv_tokens,
        gpu_memory_utilization,
        gpu_memory_mib,
        compute_fraction,
        bytes_per_kv_token: mem.bytes_per_token,
        bytes_per_kv_token_source: mem.bpt_source,
        non_kv_bytes: mem.non_kv,
        non_kv_source: mem.non_kv_source,
        reasons,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn need(kv: u64, util: f64, mib: u64, compute: f64, tag: &str) -> Recommendation {
        let reason = |field| Reason {
            field,
            code: ReasonCode::Percentile,
            message: format!("{tag} {field:?}"),
        };
        Recommendation {
            kv_cache_memory_bytes: kv,
            kv_cache_tokens: kv / 1024,
            gpu_memory_utilization: util,
            gpu_memory_mib: mib,
            compute_fraction: compute,
            bytes_per_kv_token: 1024,
            bytes_per_kv_token_source: Source::Configured,
            non_kv_bytes: 1 << 30,
            non_kv_source: Source::Configured,
            reasons: [Field::KvCacheMemory, Field::GpuMemory, Field::ComputeFraction]
                .into_iter()
                .map(reason)
                .collect(),
        }
    }

    #[test]
    fn largest_need_takes_each_field_from_the_replica_that_asks_most_with_its_reasons() {
        assert!(largest_need(&[]).is_none());
        let a = need(4 << 30, 0.35, 9000, 0.25, "a");
        let b = need(6 << 30, 0.30, 8000, 0.5, "b");
        let n = largest_need([&a, &b]).unwrap();
        assert_eq!(n.kv_cache_memory_bytes, 6 << 30);
        assert_eq!(n.kv_cache_tokens, (6 << 30) / 1024);
        assert_eq!(n.gpu_memory_utilization, 0.35);
        assert_eq!(n.gpu_memory_mib, 9000);
        assert_eq!(n.compute_fraction, 0.5);
        let why = |f: Field| {
            n.reasons
                .iter()
                .filter(|r| r.field == f)
                .map(|r| r.message.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(why(Field::KvCacheMemory), ["b KvCacheMemory"]);
        assert_eq!(why(Field::GpuMemory), ["a GpuMemory"]);
        assert_eq!(why(Field::ComputeFraction), ["b ComputeFraction"]);
        // Order does not matter.
        assert_eq!(
            largest_need([&b, &a]).unwrap().kv_cache_memory_bytes,
            n.kv_cache_memory_bytes
        );
    }
    use proptest::prelude::*;

    const GIB: u64 = 1024 * 1024 * 1024;

    /// `n` samples, 10 s apart, with KV usage from `usage(i)`.
    fn window(n: usize, usage: impl Fn(usize) -> f64) -> Vec<Observation> {
        (0..n)
            .map(|i| Observation {
                at_secs: 1000.0 + 10.0 * i as f64,
                kv_usage: Some(usage(i)),
                requests_waiting: Some(0.0),
                preemptions_total: Some(0.0),
                sm_utilization: None,
            })
            .collect()
    }

    fn geometry() -> KvGeometry {
        // Qwen2-7B on an A100-80GB at gpu_memory_utilization 0.25 (memory-profiles.md example 1).
        KvGeometry {
            num_gpu_blocks: 5867,
            block_size: 16,
            max_model_len: Some(16384),
        }
    }

    fn memory() -> MemoryFacts {
        MemoryFacts {
            gpu_total_bytes: Some(80 * GIB),
            bytes_per_kv_token: Some(57_344), // 2 × 28 layers × 4 kv heads × 128 × 2 bytes
            non_kv_bytes: Some(15 * GIB),
            ..Default::default()
        }
    }

    fn ready(o: Outcome) -> Recommendation {
        match o {
            Outcome::Ready(r) => r,
            Outcome::NotYet { code, reason } => panic!("expected a recommendation, got {code:?}: {reason}"),
        }
    }

    fn run(w: &[Observation], mem: MemoryFacts, prev: Option<&Recommendation>) -> Outcome {
        run_with(w, geometry(), mem, prev, &Config::default())
    }

    /// [`recommend`] with no compute facts.
    fn run_with(
        window: &[Observation],
        geometry: KvGeometry,
        memory: MemoryFacts,
        previous: Option<&Recommendation>,
        config: &Config,
    ) -> Outcome {
        recommend(
            &Input {
                window,
                geometry,
                memory,
                previous,
                compute: ComputeFacts::default(),
            },
            config,
        )
    }

    /// The code of a [`Outcome::NotYet`], `None` for a recommendation.
    fn not_yet_code(o: &Outcome) -> Option<NotYetCode> {
        match o {
            Outcome::NotYet { code, .. } => Some(*code),
            Outcome::Ready(_) => None,
        }
    }

    fn codes(r: &Recommendation) -> Vec<ReasonCode> {
        r.reasons.iter().map(|r| r.code).collect()
    }

    #[test]
    fn too_little_history_is_not_yet() {
        let o = run(&window(5, |_| 0.3), memory(), None);
        assert_eq!(not_yet_code(&o), Some(NotYetCode::TooFewSamples), "{o:?}");
        // Enough samples but squeezed into 11 s.
        let mut w = window(12, |_| 0.3);
        for (i, o) in w.iter_mut().enumerate() {
            o.at_secs = i as f64;
        }
        let o = run(&w, memory(), None);
        assert_eq!(not_yet_code(&o), Some(NotYetCode::WindowTooShort), "{o:?}");
        // Samples with no KV usage do not count.
        let mut w = window(30, |_| 0.3);
        for o in w.iter_mut().skip(5) {
            o.kv_usage = None;
        }
        let o = run(&w, memory(), None);
        assert_eq!(not_yet_code(&o), Some(NotYetCode::TooFewSamples), "{o:?}");
    }

    #[test]
    fn missing_inputs_are_named() {
        let w = window(30, |_| 0.3);
        let mem = MemoryFacts {
            gpu_total_bytes: None,
            ..memory()
        };
        let o = run(&w, mem, None);
        assert_eq!(not_yet_code(&o), Some(NotYetCode::UnknownGpuMemory), "{o:?}");
        let mem = MemoryFacts {
            bytes_per_kv_token: None,
            ..memory()
        };
        let o = run(&w, mem, None);
        assert!(
            matches!(&o, Outcome::NotYet { code: NotYetCode::UnknownBytesPerKvToken, reason }
            if reason.contains("--bytes-per-kv-token")),
            "{o:?}"
        );
        let mem = MemoryFacts {
            non_kv_bytes: None,
            ..memory()
        };
        let o = run(&w, mem, None);
        assert_eq!(not_yet_code(&o), Some(NotYetCode::UnknownNonKvMemory), "{o:?}");
        let g = KvGeometry {
            num_gpu_blocks: 0,
            ..geometry()
        };
        let o = run_with(&w, g, memory(), None, &Config::default());
        assert_eq!(not_yet_code(&o), Some(NotYetCode::UnknownKvGeometry), "{o:?}");
        let bad = Config {
            percentile: 1.5,
            ..Config::default()
        };
        let o = run_with(&w, geometry(), memory(), None, &bad);
        assert!(
            matches!(&o, Outcome::NotYet { code: NotYetCode::InvalidConfig, reason }
            if reason.contains("percentile")),
            "{o:?}"
        );
    }

    #[test]
    fn derives_geometry_from_vllm_budget_rule_on_real_numbers() {
        // vLLM 0.10.1.1, Qwen2-7B, A100 80GB, util 0.25: "Available KV cache memory: 5.01 GiB",
        // "GPU KV cache size: 93,872 tokens"; total 79.25 GiB as NVML reports for an A100-80GB.
        let total = (79.25 * GIB as f64) as u64;
        let kv = (5.01 * GIB as f64) as u64;
        let mem = MemoryFacts {
            gpu_total_bytes: Some(total),
            gpu_memory_utilization: Some(0.25),
            kv_cache_memory_bytes: Some(kv),
            ..Default::default()
        };
        let r = ready(run(&window(30, |_| 0.5), mem, None));
        assert_eq!(r.bytes_per_kv_token_source, Source::CacheConfigKvBytes);
        assert_eq!(r.non_kv_source, Source::VllmBudgetRule);
        // 5.01 GiB / 93,872 tokens = 57,307 bytes: the model's true 57,344 within rounding of the log line.
        assert!(
            (57_000..57_400).contains(&r.bytes_per_kv_token),
            "{}",
            r.bytes_per_kv_token
        );
        // Non-KV = 0.25 × 79.25 − 5.01 = 14.80 GiB (the design's measured 14.81 GiB).
        let non_kv_gib = r.non_kv_bytes as f64 / GIB as f64;
        assert!((non_kv_gib - 14.80).abs() < 0.02, "{non_kv_gib}");
    }

    #[test]
    fn shrinks_in_bounded_steps_and_converges_on_percentile_plus_headroom() {
        let w = window(60, |i| if i % 10 == 0 { 0.35 } else { 0.25 });
        let tokens = geometry().tokens();
        let first = ready(run(&w, memory(), None));
        // Target is 0.35 × 1.2 = 42% (the p95 is 0.35), but one step may only shrink 10%.
        assert_eq!(
            first.kv_cache_tokens,
            (tokens as f64 * 0.9).ceil() as u64 / 16 * 16 + 16
        );
        assert!(codes(&first).contains(&ReasonCode::StepLimitedDown));
        let mut prev = first;
        for _ in 0..30 {
            prev = ready(run(&w, memory(), Some(&prev)));
        }
        let want = (0.35 * 1.2 * tokens as f64).ceil() as u64;
        assert!(
            prev.kv_cache_tokens >= want && prev.kv_cache_tokens < want + 16,
            "{}",
            prev.kv_cache_tokens
        );
        assert_eq!(
            codes(&prev),
            vec![
                ReasonCode::Percentile,
                ReasonCode::KvPlusNonKv,
                ReasonCode::NoLatencyObjective
            ]
        );
        assert_eq!(prev.kv_cache_memory_bytes, prev.kv_cache_tokens * 57_344);
        let need = 15 * GIB + prev.kv_cache_memory_bytes;
        assert_eq!(prev.gpu_memory_mib, need.div_ceil(MIB));
        assert!(prev.gpu_memory_utilization >= need as f64 / (80 * GIB) as f64);
        assert!(prev.gpu_memory_utilization <= need as f64 / (80 * GIB) as f64 + 0.01);
        assert_eq!(prev.compute_fraction, 1.0);
        assert!(!prev.summary().is_empty());
    }

    #[test]
    fn a_lone_peak_above_percentile_sets_the_floor() {
        // One sample at 90%, the rest at 10%: p95 + 20% = 12%, but the window used 90%.
        let w = window(60, |i| if i == 30 { 0.9 } else { 0.1 });
        let mut prev = ready(run(&w, memory(), None));
        for _ in 0..30 {
            prev = ready(run(&w, memory(), Some(&prev)));
        }
        let peak = (0.9 * geometry().tokens() as f64).ceil() as u64;
        assert!(prev.kv_cache_tokens >= peak);
        assert!(codes(&prev).contains(&ReasonCode::ObservedPeak));
    }

    #[test]
    fn preemptions_grow_and_never_shrink() {
        let mut w = window(30, |_| 0.2);
        for (i, o) in w.iter_mut().enumerate() {
            o.preemptions_total = Some(if i < 20 { 4.0 } else { 5.0 });
        }
        let r = ready(run(&w, memory(), None));
        assert!(
            r.kv_cache_tokens as f64 >= geometry().tokens() as f64 * 1.2,
            "{}",
            r.kv_cache_tokens
        );
        assert!(codes(&r).contains(&ReasonCode::Preemptions));
        // A counter reset (server restart) is an increase, not a negative delta.
        let mut w = window(30, |_| 0.2);
        for (i, o) in w.iter_mut().enumerate() {
            o.preemptions_total = Some(if i < 20 { 7.0 } else { 1.0 });
        }
        assert!(codes(&ready(run(&w, memory(), None))).contains(&ReasonCode::Preemptions));
    }

    #[test]
    fn waiting_at_full_kv_grows() {
        let mut w = window(30, |_| 0.5);
        w[10].kv_usage = Some(0.97);
        w[10].requests_waiting = Some(3.0);
        let r = ready(run(&w, memory(), None));
        assert!(codes(&r).contains(&ReasonCode::WaitingAtFullKv));
        assert!(r.kv_cache_tokens > geometry().tokens());
    }

    #[test]
    fn growth_is_step_bounded_and_clamped_to_the_gpu() {
        let mut w = window(30, |_| 1.0);
        w[3].preemptions_total = Some(50.0);
        // A small previous recommendation: the step is from max(previous, current) under pressure.
        let g = KvGeometry {
            num_gpu_blocks: 40_000,
            block_size: 16,
            max_model_len: None,
        };
        let r = ready(run_with(&w, g, memory(), None, &Config::default()));
        // 640,000 tokens × 57,344 B = 34.2 GiB; +20% = 41 GiB; GPU cap is 0.95 × 80 − 15 = 61 GiB: fits.
        assert!(r.kv_cache_tokens >= 768_000);
        let small_gpu = MemoryFacts {
            gpu_total_bytes: Some(48 * GIB),
            ..memory()
        };
        let r = ready(run_with(&w, g, small_gpu, None, &Config::default()));
        assert!(codes(&r).contains(&ReasonCode::ClampedToGpu), "{:?}", r.reasons);
        assert!(15 * GIB + r.kv_cache_memory_bytes <= (0.95 * (48 * GIB) as f64) as u64);
        assert!(r.gpu_memory_utilization <= 0.95);
        // The step limit caps growth at ×2 of the reference.
        let cfg = Config {
            headroom: 3.0,
            ..Config::default()
        };
        let r = ready(run_with(&w, g, memory(), None, &cfg));
        assert!(
            codes(&r).contains(&ReasonCode::StepLimitedUp) || codes(&r).contains(&ReasonCode::ClampedToGpu)
        );
        assert!(r.kv_cache_tokens <= 2 * g.tokens());
    }

    #[test]
    fn holds_one_max_model_len_sequence() {
        let g = KvGeometry {
            num_gpu_blocks: 2000,
            block_size: 16,
            max_model_len: Some(32_768),
        };
        let w = window(30, |_| 0.0);
        let mut prev: Option<Recommendation> = None;
        for _ in 0..40 {
            prev = Some(ready(run_with(
                &w,
                g,
                memory(),
                prev.as_ref(),
                &Config::default(),
            )));
        }
        let r = prev.unwrap();
        assert_eq!(r.kv_cache_tokens, 32_768);
        assert!(codes(&r).contains(&ReasonCode::MinimumSequence));
    }

    /// A compute window: `n` samples 10 s apart, busy `busy`, `waiting` requests waiting.
    fn cwin(n: usize, busy: Option<f64>, waiting: f64) -> Vec<Observation> {
        (0..n)
            .map(|i| Observation {
                at_secs: 10.0 * i as f64,
                kv_usage: Some(0.3),
                requests_waiting: Some(waiting),
                preemptions_total: Some(0.0),
                sm_utilization: busy,
            })
            .collect()
    }

    fn lat(p95: f64, samples: f64) -> Option<LatencyObservation> {
        Some(LatencyObservation {
            p95_secs: p95,
            samples,
        })
    }

    fn facts(current: Option<f64>, ttft_slo: Option<f64>, ttft: Option<LatencyObservation>) -> ComputeFacts {
        ComputeFacts {
            current_share: current,
            ttft_slo_secs: ttft_slo,
            ttft,
            ..Default::default()
        }
    }

    fn ccodes(d: &ComputeDecision) -> Vec<ReasonCode> {
        d.reasons.iter().map(|r| r.code).collect()
    }

    #[test]
    fn busy_time_alone_never_sets_the_share() {
        // The old rule's failure: one request in flight keeps a decode-bound GPU busy 100% of the time, and a
        // quiet window reads 0% busy. Neither is evidence about the share it needs: without an objective the share
        // stays where it is (whole GPU by default), with no saturation (nothing waited).
        let cfg = Config::default();
        for busy in [Some(1.0), Some(0.0), None] {
            let d = recommend_compute(&cwin(60, busy, 0.0), &ComputeFacts::default(), None, &cfg);
            assert_eq!(d.share, 1.0, "{busy:?}");
            assert_eq!(ccodes(&d), vec![ReasonCode::NoLatencyObjective]);
            let d = recommend_compute(&cwin(60, busy, 0.0), &facts(Some(0.4), None, None), None, &cfg);
            assert_eq!(d.share, 0.4);
        }
        // Through `recommend`: the whole GPU by default.
        let r = ready(run(&window(30, |_| 0.3), memory(), None));
        assert_eq!(r.compute_fraction, 1.0);
    }

    #[test]
    fn fast_ttft_shrinks_in_bounded_steps_toward_half_the_objective() {
        let cfg = Config::default();
        // Whole GPU, TTFT p95 0.1 s against a 2 s objective (target 1 s): wants 0.1, a step may take 25%.
        let w = cwin(60, Some(1.0), 0.0);
        let d = recommend_compute(&w, &facts(None, Some(2.0), lat(0.1, 500.0)), None, &cfg);
        assert_eq!(d.share, 0.75);
        assert_eq!(
            ccodes(&d),
            vec![ReasonCode::LatencyUnderObjective, ReasonCode::StepLimitedDown]
        );
        // Compounding from the previous recommendation while latency keeps showing room (it was measured at
        // the whole GPU: ratio 0.1): 0.75 → 0.57 → 0.43 → ...
        let d2 = recommend_compute(&w, &facts(None, Some(2.0), lat(0.1, 500.0)), Some(d.share), &cfg);
        assert_eq!(d2.share, 0.57);
        // TTFT at share 0.25 is 0.8 s: ratio 0.8 → 0.20 (within the 25% step from 0.25).
        let d = recommend_compute(&w, &facts(Some(0.25), Some(2.0), lat(0.8, 500.0)), None, &cfg);
        assert_eq!(d.share, 0.2);
        assert_eq!(ccodes(&d), vec![ReasonCode::LatencyUnderObjective]);
        // Within ±10% of the target: no change.
        let d = recommend_compute(&w, &facts(Some(0.25), Some(2.0), lat(1.05, 500.0)), None, &cfg);
        assert_eq!(d.share, 0.25);
        assert_eq!(ccodes(&d), vec![ReasonCode::LatencyWithinObjective]);
    }

    #[test]
    fn latency_over_the_objective_grows_and_the_step_is_bounded() {
        let cfg = Config::default();
        let w = cwin(60, Some(1.0), 0.0);
        // 1.5 s against a 1 s target at 0.2: 0.30.
        let d = recommend_compute(&w, &facts(Some(0.2), Some(2.0), lat(1.5, 100.0)), None, &cfg);
        assert_eq!(d.share, 0.3);
        assert_eq!(ccodes(&d), vec![ReasonCode::LatencyOverObjective]);
        // 10 s: ×10 wanted, ×2 allowed.
        let d = recommend_compute(&w, &facts(Some(0.2), Some(2.0), lat(10.0, 100.0)), None, &cfg);
        assert_eq!(d.share, 0.4);
        assert!(ccodes(&d).contains(&ReasonCode::StepLimitedUp));
        // Over the objective never goes below the previous recommendation, even one above the current share.
        let d = recommend_compute(&w, &facts(Some(0.2), Some(2.0), lat(1.5, 100.0)), Some(0.6), &cfg);
        assert_eq!(d.share, 0.6);
        // Never above the whole GPU.
        let d = recommend_compute(&w, &facts(Some(0.9), Some(2.0), lat(9.0, 100.0)), None, &cfg);
        assert_eq!(d.share, 1.0);
    }

    #[test]
    fn the_inter_token_objective_counts_and_the_larger_need_wins() {
        let cfg = Config::default();
        let w = cwin(60, Some(1.0), 0.0);
        // TTFT has room (ratio 0.3), but decode steps at 0.3 give 60 ms ITL against a 100 ms objective
        // (target 50 ms): ratio 1.2 → grow.
        let f = ComputeFacts {
            current_share: Some(0.3),
            ttft_slo_secs: Some(2.0),
            itl_slo_secs: Some(0.1),
            ttft: lat(0.3, 200.0),
            itl: lat(0.06, 20_000.0),
        };
        let d = recommend_compute(&w, &f, None, &cfg);
        assert_eq!(d.share, 0.36);
        assert!(d.reasons[0].message.contains("inter-token"), "{:?}", d.reasons);
        // Both under: the one asking the most decides (ITL ratio 0.8 beats TTFT 0.3).
        let f = ComputeFacts {
            itl: lat(0.04, 20_000.0),
            ..f
        };
        assert_eq!(recommend_compute(&w, &f, None, &cfg).share, 0.24);
        // ITL objective with no ITL data: no shrink, even though TTFT has room.
        let f = ComputeFacts { itl: None, ..f };
        let d = recommend_compute(&w, &f, None, &cfg);
        assert_eq!(d.share, 0.3);
        assert_eq!(ccodes(&d), vec![ReasonCode::TooFewLatencySamples]);
    }

    #[test]
    fn idle_or_missing_latency_keeps_the_share() {
        let cfg = Config::default();
        // The old rule's other failure: a quiet window took a bursty model to 0.05. Now: kept.
        let w = cwin(60, Some(0.0), 0.0);
        for ttft in [None, lat(0.05, 3.0), lat(f64::NAN, 500.0)] {
            let d = recommend_compute(&w, &facts(Some(0.5), Some(2.0), ttft), None, &cfg);
            assert_eq!(d.share, 0.5, "{ttft:?}");
            assert_eq!(ccodes(&d), vec![ReasonCode::TooFewLatencySamples]);
            // With a previous recommendation, that one is kept (the replica may still run an older share).
            let d = recommend_compute(&w, &facts(Some(0.5), Some(2.0), ttft), Some(0.7), &cfg);
            assert_eq!(d.share, 0.7);
        }
        // Unknown current share = the whole GPU.
        let d = recommend_compute(&w, &facts(None, Some(2.0), None), None, &cfg);
        assert_eq!(d.share, 1.0);
    }

    #[test]
    fn saturation_at_the_share_grows() {
        let cfg = Config::default();
        // Busy all the time with requests waiting at 0.3, TTFT fine: saturation wins over the latency room.
        let w = cwin(60, Some(1.0), 3.0);
        let d = recommend_compute(&w, &facts(Some(0.3), Some(2.0), lat(0.2, 500.0)), None, &cfg);
        assert_eq!(d.share, 0.6);
        assert!(ccodes(&d).contains(&ReasonCode::ComputeSaturated));
        // Preemptions while requests wait count too (no busy data).
        let mut w = cwin(60, None, 2.0);
        for (i, o) in w.iter_mut().enumerate() {
            o.preemptions_total = Some(i as f64);
        }
        let d = recommend_compute(&w, &facts(Some(0.4), None, None), None, &cfg);
        assert_eq!(d.share, 0.8);
        // One transient sample out of sixty is not saturation.
        let mut w = cwin(60, Some(1.0), 0.0);
        w[7].requests_waiting = Some(1.0);
        let d = recommend_compute(&w, &facts(Some(0.3), None, None), None, &cfg);
        assert_eq!(d.share, 0.3);
    }

    #[test]
    fn compute_reasons_reach_the_recommendation() {
        let w = window(30, |_| 0.3);
        let out = recommend(
            &Input {
                window: &w,
                geometry: geometry(),
                memory: memory(),
                previous: None,
                compute: facts(Some(0.5), Some(2.0), lat(0.25, 400.0)),
            },
            &Config::default(),
        );
        let r = ready(out);
        // 0.5 × 0.25 = 0.125, bounded to 0.375 → 0.38.
        assert_eq!(r.compute_fraction, 0.38);
        assert!(
            r.reasons
                .iter()
                .any(|x| x.field == Field::ComputeFraction && x.code == ReasonCode::LatencyUnderObjective)
        );
        assert!(
            r.summary().contains("compute share shrink limited"),
            "{}",
            r.summary()
        );
    }

    fn arb_compute() -> impl Strategy<Value = (Vec<Observation>, ComputeFacts, Option<f64>)> {
        let opt_share = prop::option::of(prop_oneof![0.01f64..=1.0, Just(1.0), Just(0.0), Just(f64::NAN)]);
        let opt_lat = prop::option::of((0.0f64..30.0, 0.0f64..1000.0))
            .prop_map(|l| l.map(|(p95_secs, samples)| LatencyObservation { p95_secs, samples }));
        (
            prop::collection::vec(
                (
                    prop::option::of(0.0f64..=1.0),
                    prop::option::of(0.0f64..4.0),
                    any::<bool>(),
                ),
                0..60,
            ),
            opt_share.clone(),
            prop::option::of(0.05f64..20.0),
            prop::option::of(0.01f64..1.0),
            opt_lat.clone(),
            opt_lat,
            opt_share,
        )
            .prop_map(|(samples, current, ttft_slo, itl_slo, ttft, itl, prev)| {
                let mut pre = 0.0;
                let w = samples
                    .iter()
                    .enumerate()
                    .map(|(i, (busy, wait, preempt))| {
                        if *preempt {
                            pre += 1.0;
                        }
                        Observation {
                            at_secs: 5.0 * i as f64,
                            kv_usage: Some(0.5),
                            requests_waiting: wait.map(f64::floor),
                            preemptions_total: Some(pre),
                            sm_utilization: *busy,
                        }
                    })
                    .collect();
                let f = ComputeFacts {
                    current_share: current,
                    ttft_slo_secs: ttft_slo,
                    itl_slo_secs: itl_slo,
                    ttft,
                    itl,
                };
                (w, f, prev)
            })
    }

    /// What "keep" means: the previous recommendation, else the current share, else the whole GPU.
    fn reference(f: &ComputeFacts, prev: Option<f64>) -> f64 {
        let ok = |v: &f64| v.is_finite() && *v > 0.0;
        let current = f.current_share.filter(ok).map_or(1.0, |s| s.min(1.0));
        prev.filter(ok).map_or(current, |s| s.min(1.0))
    }

    fn current_of(f: &ComputeFacts) -> f64 {
        f.current_share
            .filter(|v| v.is_finite() && *v > 0.0)
            .map_or(1.0, |s| s.min(1.0))
    }

    proptest! {
        #[test]
        fn compute_share_stays_in_bounds_and_steps((w, f, prev) in arb_compute()) {
            let cfg = Config::default();
            let d = recommend_compute(&w, &f, prev, &cfg);
            prop_assert!(d.share >= cfg.min_compute_fraction && d.share <= 1.0, "{}", d.share);
            prop_assert!(!d.reasons.is_empty());
            prop_assert!(d.reasons.iter().all(|r| r.field == Field::ComputeFraction));
            let r = reference(&f, prev);
            let c = current_of(&f);
            // Each step within its bound (a grow signal may lift to what runs now; rounding adds < 0.01).
            let lower = (r * (1.0 - cfg.compute_max_step_down_ratio)).max(cfg.min_compute_fraction);
            let upper = (r * cfg.compute_max_step_up).max(c).min(1.0).max(cfg.min_compute_fraction);
            prop_assert!(d.share >= lower.min(1.0) - 1e-9, "{} < {lower}", d.share);
            prop_assert!(d.share <= upper + 0.01 + 1e-9, "{} > {upper}", d.share);
        }

        #[test]
        fn missing_latency_never_lowers_it((w, f, prev) in arb_compute()) {
            let cfg = Config::default();
            // Same window and objectives, but the latency unseen (idle or missing data).
            let f = ComputeFacts { ttft: None, itl: None, ..f };
            let d = recommend_compute(&w, &f, prev, &cfg);
            prop_assert!(d.share >= reference(&f, prev).max(cfg.min_compute_fraction) - 1e-9,
                "{} < {}: {:?}", d.share, reference(&f, prev), d.reasons);
        }

        #[test]
        fn latency_over_the_objective_never_lowers_it((w, f, prev) in arb_compute(), over in 1.11f64..50.0) {
            let cfg = Config::default();
            let slo = f.ttft_slo_secs.unwrap_or(2.0);
            let f = ComputeFacts {
                ttft_slo_secs: Some(slo),
                ttft: lat(over * cfg.latency_target_ratio * slo, 1000.0),
                ..f
            };
            let d = recommend_compute(&w, &f, prev, &cfg);
            let floor = reference(&f, prev).max(current_of(&f)).max(cfg.min_compute_fraction);
            prop_assert!(d.share >= floor - 1e-9, "{} < {floor}", d.share);
        }

        #[test]
        fn saturation_never_lowers_it((w, f, prev) in arb_compute()) {
            let cfg = Config::default();
            let base = recommend_compute(&w, &f, prev, &cfg);
            let sat = cwin(w.len().max(12), Some(1.0), 2.0);
            let d = recommend_compute(&sat, &f, prev, &cfg);
            let floor = reference(&f, prev).max(current_of(&f)).max(cfg.min_compute_fraction);
            prop_assert!(d.share >= floor - 1e-9, "{} < {floor}", d.share);
            prop_assert!(ccodes(&d).contains(&ReasonCode::ComputeSaturated));
            // And never below what the same facts give without saturation.
            let calm = cwin(w.len().max(12), Some(1.0), 0.0);
            prop_assert!(d.share >= recommend_compute(&calm, &f, prev, &cfg).share - 1e-9);
            let _ = base;
        }

        #[test]
        fn worse_latency_never_gives_a_smaller_share(
            (w, f, prev) in arb_compute(), a in 0.0f64..20.0, b in 0.0f64..20.0, n in 20.0f64..5000.0,
        ) {
            let cfg = Config::default();
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            let slo = f.ttft_slo_secs.unwrap_or(2.0);
            let with = |p95: f64| ComputeFacts { ttft_slo_secs: Some(slo), ttft: lat(p95, n), ..f };
            let s_lo = recommend_compute(&w, &with(lo), prev, &cfg).share;
            let s_hi = recommend_compute(&w, &with(hi), prev, &cfg).share;
            prop_assert!(s_hi >= s_lo - 1e-9, "p95 {lo} → {s_lo}, p95 {hi} → {s_hi}");
        }
    }

    #[test]
    fn outcome_json_is_tagged() {
        let o = not_yet(NotYetCode::TooFewSamples, "x");
        let j = serde_json::to_value(&o).unwrap();
        assert_eq!(j["state"], "not_yet");
        assert_eq!(j["code"], "too_few_samples");
        let r = run(&window(30, |_| 0.4), memory(), None);
        let back: Outcome = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }

    fn arb_case() -> impl Strategy<Value = (Vec<Observation>, KvGeometry, MemoryFacts, Option<u64>)> {
        (
            prop::collection::vec((prop_oneof![0.0f64..=1.0, 0.0f64..0.3], 0.0f64..5.0), 12..80),
            1u64..50_000,
            prop::sample::select(vec![1u64, 16, 32]),
            prop::option::of(1u64..200_000),
            1_000u64..200_000,
            1u64..200,
            0u64..100,
            prop::option::of(1u64..1_000_000),
            // A lone spike above the rest, so the observed peak often exceeds percentile + headroom.
            prop::option::of((0usize..80, 0.0f64..=1.0)),
        )
            .prop_map(
                |(mut samples, blocks, bs, mml, bpt, total_gib, non_kv_pct, prev, spike)| {
                    if let Some((at, v)) = spike {
                        let n = samples.len();
                        samples[at % n].0 = v;
                    }
                    let w = samples
                        .iter()
                        .enumerate()
                        .map(|(i, (u, wait))| Observation {
                            at_secs: 10.0 * i as f64,
                            kv_usage: Some(*u),
                            requests_waiting: Some(wait.floor()),
                            preemptions_total: Some(0.0),
                            sm_utilization: None,
                        })
                        .collect();
                    let total = total_gib * GIB;
                    let mem = MemoryFacts {
                        gpu_total_bytes: Some(total),
                        bytes_per_kv_token: Some(bpt),
                        non_kv_bytes: Some(total / 100 * non_kv_pct.min(94)),
                        ..Default::default()
                    };
                    let g = KvGeometry {
                        num_gpu_blocks: blocks,
                        block_size: bs,
                        max_model_len: mml,
                    };
                    (w, g, mem, prev)
                },
            )
    }

    fn prev_rec(tokens: Option<u64>) -> Option<Recommendation> {
        tokens.map(|t| Recommendation {
            kv_cache_memory_bytes: 0,
            kv_cache_tokens: t,
            gpu_memory_utilization: 0.0,
            gpu_memory_mib: 0,
            compute_fraction: 1.0,
            bytes_per_kv_token: 1,
            bytes_per_kv_token_source: Source::Configured,
            non_kv_bytes: 0,
            non_kv_source: Source::Configured,
            reasons: vec![],
        })
    }

    proptest! {
        #[test]
        fn always_within_the_gpu((w, g, mem, prev) in arb_case()) {
            let p = prev_rec(prev);
            let cfg = Config::default();
            // Complete inputs always give a recommendation, so a not-yet here is a failure, not a pass.
            let out = run_with(&w, g, mem, p.as_ref(), &cfg);
            let r = out.recommendation().expect("complete inputs always give a recommendation");
            let total = mem.gpu_total_bytes.unwrap();
            prop_assert!(r.non_kv_bytes + r.kv_cache_memory_bytes <= (cfg.max_gpu_memory_utilization * total as f64) as u64);
            prop_assert!(r.gpu_memory_utilization <= cfg.max_gpu_memory_utilization + 1e-12);
            prop_assert!(r.gpu_memory_utilization * total as f64 >= (r.non_kv_bytes + r.kv_cache_memory_bytes) as f64 - 1.0);
            prop_assert!((r.gpu_memory_mib * MIB) >= r.non_kv_bytes + r.kv_cache_memory_bytes);
            prop_assert!(r.compute_fraction > 0.0 && r.compute_fraction <= 1.0);
            prop_assert_eq!(r.kv_cache_memory_bytes % (g.block_size * r.bytes_per_kv_token), 0);
        }

        #[test]
        fn never_below_observed_peak_when_it_fits((w, g, mem, prev) in arb_case()) {
            let p = prev_rec(prev);
            let cfg = Config::default();
            let out = run_with(&w, g, mem, p.as_ref(), &cfg);
            let r = out.recommendation().expect("complete inputs always give a recommendation");
            let peak = w.iter().filter_map(|o| o.kv_usage).fold(0.0, f64::max);
            let peak_tokens = (peak * g.tokens() as f64).ceil() as u64;
            let room = (cfg.max_gpu_memory_utilization * mem.gpu_total_bytes.unwrap() as f64) as u64
                - mem.non_kv_bytes.unwrap();
            let fits = peak_tokens.div_ceil(g.block_size) * g.block_size * mem.bytes_per_kv_token.unwrap() <= room;
            if fits {
                prop_assert!(r.kv_cache_tokens >= peak_tokens, "{} < {}", r.kv_cache_tokens, peak_tokens);
            } else {
                prop_assert!(r.reasons.iter().any(|x| x.code == ReasonCode::ClampedToGpu));
            }
        }

        #[test]
        fn more_preemptions_never_shrink_it((w, g, mem, prev) in arb_case(), at in 0usize..80, n in 1.0f64..100.0) {
            let p = prev_rec(prev);
            let cfg = Config::default();
            let base = run_with(&w, g, mem, p.as_ref(), &cfg);
            let mut w2 = w.clone();
            let at = at % w2.len();
            for o in w2.iter_mut().skip(at) {
                o.preemptions_total = Some(n);
            }
            let more = run_with(&w2, g, mem, p.as_ref(), &cfg);
            let (a, b) = (base.recommendation().unwrap(), more.recommendation().unwrap());
            prop_assert!(b.kv_cache_tokens >= a.kv_cache_tokens);
            if at > 0 {
                // A preemption is pressure: never below what runs now or the previous recommendation (if they fit).
                let room = (cfg.max_gpu_memory_utilization * mem.gpu_total_bytes.unwrap() as f64) as u64
                    - mem.non_kv_bytes.unwrap();
                let floor = g.tokens().max(prev.unwrap_or(0));
                if floor * mem.bytes_per_kv_token.unwrap() <= room {
                    prop_assert!(b.kv_cache_tokens >= floor);
                }
            }
        }

        #[test]
        fn short_windows_are_not_yet(n in 0usize..12, (w, g, mem, _prev) in arb_case()) {
            let cfg = Config::default();
            let out = run_with(&w[..n.min(w.len())], g, mem, None, &cfg);
            prop_assert!(
                matches!(out, Outcome::NotYet { code: NotYetCode::TooFewSamples, .. }),
                "{:?}", out
            );
        }
    }
}
