//! The sidecar's `/v1/status` document: what the autoscaler reads from every replica.
//!
//! The sidecar serializes [`SidecarStatus`]; the autoscaler deserializes the same type, so the two cannot drift.
//! Compatibility rules: fields are only ever added (every new field is optional or has a default, so an older
//! reader ignores it and a newer reader accepts an older document); a breaking change bumps
//! [`SCHEMA_VERSION`]. Times are Unix seconds (floating point) taken from the sidecar's clock; `generated_at`
//! lets a reader measure ages against the same clock. Ratios are 0–1; durations are seconds; memory is bytes
//! unless the name says MiB. A value that is unknown is `null`, never 0.
//!
//! The schema is documented field by field in `docs/sidecar.md`.

use crate::recommend::{MemoryMode, ModelGeometry, Outcome, Recommendation};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Version of this document's shape. Bumped only for a breaking change.
pub const SCHEMA_VERSION: u32 = 1;

/// The sidecar's container name in a model's pod: what the webhook injects (or finds, when a pod brings its own)
/// and what the controller looks for to tell an injected pod from one admitted without it.
pub const CONTAINER_NAME: &str = "tessera-sidecar";

/// The whole `/v1/status` document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SidecarStatus {
    /// [`SCHEMA_VERSION`] of the producer.
    pub schema_version: u32,
    /// When this document was produced (Unix seconds, sidecar clock).
    pub generated_at: f64,
    /// The vLLM base URL the sidecar scrapes.
    pub vllm_url: String,
    /// True when the last scrape of vLLM's `/metrics` succeeded and parsed.
    pub vllm_up: bool,
    /// True once vLLM has answered a scrape at least once (the sidecar's `/ready`).
    pub ready: bool,
    /// True when `latest` is not from the last scrape attempt (vLLM down, slow, or returned garbage): a reader
    /// must not scale on stale values as if they were current.
    pub stale: bool,
    /// Scrape bookkeeping: times, counts, last error.
    pub scrape: ScrapeStatus,
    /// vLLM's `max_model_len` (configured on the sidecar, or read from vLLM's `/v1/models`), if known.
    #[serde(default)]
    pub max_model_len: Option<u64>,
    /// The last good snapshot, if any scrape ever succeeded.
    #[serde(default)]
    pub latest: Option<SnapshotSummary>,
    /// Summary of the window of good snapshots (the recommendation's input), if there are at least two.
    #[serde(default)]
    pub window: Option<WindowStatus>,
    /// Latency over a short trailing window (`--latency-window`, default 1 min), for the autoscaler's TTFT SLO
    /// guard: `window` spans the recommendation's 10 minutes, over which one excursion keeps "firing" for 10
    /// minutes after new replicas are up. `null` from older sidecars and before two scrapes fall in the window.
    #[serde(default)]
    pub recent: Option<RecentLatency>,
    /// The GPU as the sidecar sees it (NVML or configuration), if known.
    #[serde(default)]
    pub gpu: Option<GpuStatus>,
    /// The recommendation, or why there is none yet.
    pub recommendation: RecommendationStatus,
    /// What the compute-share rule was told: the share this replica runs with and its latency objectives.
    /// `null` from older sidecars.
    #[serde(default)]
    pub compute: Option<ComputeStatus>,
    /// How vLLM sizes this replica's KV cache (its memory mode) and what the sidecar knows of the model's
    /// geometry. `null` from older sidecars, and before the first good scrape.
    #[serde(default)]
    pub memory: Option<MemoryStatus>,
    /// Sleep mode: the replica's state (awake, asleep, between), what the last transition measured and why the
    /// sidecar refuses to put it to sleep, if it does. `null` from older sidecars and where sleep mode is off.
    #[serde(default)]
    pub rest: Option<RestStatus>,
    /// The per-GPU start-up gate as this pod went through it (fractional pods); `null` for a whole GPU and from
    /// older sidecars. The controller turns an opening by `wait_timeout` into a Warning Event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_gate: Option<StartupGateStatus>,
}

/// The start-up gate's state, as `/startup` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartupGateStatus {
    /// `waiting`, `holding` or `open`.
    pub state: String,
    /// Why it is open (`vllm_ready`, `startup_timeout`, `lease_lost`, `api_unavailable`, `wait_timeout`, …).
    #[serde(default)]
    pub reason: Option<String>,
    /// Who held the GPU's start-up Lease while this pod waited (kept when it opened by `wait_timeout`).
    #[serde(default)]
    pub holder: Option<String>,
}

/// A replica's sleep state as its sidecar performed and checked it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RestStatus {
    /// Where the replica is.
    pub state: RestState,
    /// The level it sleeps at (while `falling_asleep`, `sleeping`, `waking`).
    #[serde(default)]
    pub level: Option<crate::sleep::command::SleepLevel>,
    /// When it entered `state` (Unix seconds, sidecar clock).
    #[serde(default)]
    pub since: Option<f64>,
    /// GPU memory the sleeping server still holds (its CUDA context, level 1's bookkeeping), bytes, as the
    /// gpu-agent measured it for this pod after the sleep; `null` when not measured.
    #[serde(default)]
    pub residue_bytes: Option<u64>,
    /// GPU memory the last sleep gave back, bytes, measured (before minus after); `null` when not measured.
    #[serde(default)]
    pub freed_bytes: Option<u64>,
    /// How long the last sleep took, seconds (the `/sleep` call to the state metric reading asleep).
    #[serde(default)]
    pub last_sleep_secs: Option<f64>,
    /// How long the last wake took, seconds (the `/wake_up` call to the canary answering right).
    #[serde(default)]
    pub last_wake_secs: Option<f64>,
    /// Wakes performed since the sidecar started.
    #[serde(default)]
    pub wakes_total: u64,
    /// How long each of the last sleeps lasted before a wake was asked, seconds, oldest first (at most
    /// `core::pack::sleeping::GAPS_KEPT`): how often the model is woken, which the sleeper budget weighs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub idle_gaps_secs: Vec<f64>,
    /// Wakes whose canary answer differed from the one recorded before the sleep (each fails the pod's liveness).
    #[serde(default)]
    pub canary_failures_total: u64,
    /// Why the sidecar will not put this replica to sleep (LoRA adapters, tensor parallel, a hybrid or
    /// sliding-window model, a vLLM outside the tested range, sleep mode not enabled on the server), `null` when
    /// it will.
    #[serde(default)]
    pub refused: Option<String>,
    /// Risky set-ups found in the server's command line, image and model (`core::sleep::risk`): the controller
    /// does not put the replica to sleep unless the spec opts in (`spec.sleep.allowRisky`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub risks: Vec<String>,
}

/// The states of [`RestStatus::state`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RestState {
    /// Serving.
    Awake,
    /// `/sleep` sent, not yet confirmed by `vllm:engine_sleep_state`.
    FallingAsleep,
    /// Asleep and checked (state metric, memory freed).
    Sleeping,
    /// `/wake_up` sent, or the canary not yet answered.
    Waking,
    /// A transition failed its check (the state metric, memory not freed, the canary): the pod is being restarted.
    Failed,
}

/// vLLM's memory mode as `cache_config_info` shows it, and the model as `--model-dir` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryStatus {
    /// `budget`, `fixed_kv`, `overridden_blocks` or `unknown`.
    pub mode: MemoryMode,
    /// The mode in a sentence: the labels that show it and what it rules out.
    pub mode_reason: String,
    /// The model's files (`--model-dir`), when given.
    #[serde(default)]
    pub model: Option<ModelStatus>,
}

/// What the sidecar read from the model's files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelStatus {
    /// The directory (`--model-dir`).
    pub dir: String,
    /// Why the files could not be read, if they could not (the recommendation then goes without them).
    #[serde(default)]
    pub error: Option<String>,
    /// Layers and attention from `config.json`.
    #[serde(default)]
    pub geometry: Option<ModelGeometry>,
    /// Weight bytes per GPU from the safetensors headers or index: a floor for non-KV memory.
    #[serde(default)]
    pub weights_bytes: Option<u64>,
    /// KV bytes per token from the geometry and vLLM's `cache_dtype`, when it can be sized.
    #[serde(default)]
    pub bytes_per_kv_token: Option<u64>,
    /// How `bytes_per_kv_token` was computed, or why it cannot be.
    #[serde(default)]
    pub bytes_per_kv_token_note: Option<String>,
}

/// The compute-share rule's configuration as the sidecar applies it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ComputeStatus {
    /// The compute share this replica runs with (`--gpu-compute-fraction`, from the
    /// `tessera.dev/gpu-compute-fraction` annotation), 0–1; 1 = whole GPU.
    pub current_share: f64,
    /// The TTFT objective, seconds (`--ttft-slo`, or the controller's latest hand-over), if set.
    #[serde(default)]
    pub ttft_slo_secs: Option<f64>,
    /// The percentile the TTFT objective holds, 95 or 99; absent from sidecars older than the hand-over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_slo_percentile: Option<u32>,
    /// The inter-token latency p95 objective, seconds (`--itl-slo`), if set.
    #[serde(default)]
    pub itl_slo_secs: Option<f64>,
}

impl SidecarStatus {
    /// The current recommendation, if any (ready and computed from fresh data).
    pub fn recommendation(&self) -> Option<&Recommendation> {
        self.recommendation.outcome.recommendation()
    }
}

/// Scrape bookkeeping.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ScrapeStatus {
    /// Scrape interval, seconds.
    pub interval_secs: f64,
    /// When the last scrape attempt finished (Unix seconds).
    #[serde(default)]
    pub last_attempt_at: Option<f64>,
    /// When the last successful scrape finished (Unix seconds).
    #[serde(default)]
    pub last_success_at: Option<f64>,
    /// Successful scrapes since the sidecar started.
    pub successes_total: u64,
    /// Failed scrapes since the sidecar started, by reason (the `reason` label of `tessera_scrape_errors_total`).
    #[serde(default)]
    pub errors_total: BTreeMap<String, u64>,
    /// The last error, if the last attempt failed (cleared by a success).
    #[serde(default)]
    pub last_error: Option<ScrapeError>,
}

/// One failed scrape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScrapeError {
    /// Fixed reason label: `connect`, `timeout`, `http_status`, `body`, `parse`, `no_vllm_metrics`.
    pub reason: String,
    /// Human-readable detail.
    pub message: String,
    /// When it happened (Unix seconds).
    pub at: f64,
}

/// The latest good snapshot of vLLM's `/metrics`, aggregated over engines and models as the parser documents.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SnapshotSummary {
    /// When it was scraped (Unix seconds).
    pub at: f64,
    /// `model_name` label values seen on the page.
    #[serde(default)]
    pub model_names: Vec<String>,
    /// KV cache usage, 0–1.
    #[serde(default)]
    pub kv_cache_usage_ratio: Option<f64>,
    /// Requests running.
    #[serde(default)]
    pub requests_running: Option<f64>,
    /// Requests waiting.
    #[serde(default)]
    pub requests_waiting: Option<f64>,
    /// Cumulative preemptions.
    #[serde(default)]
    pub preemptions_total: Option<f64>,
    /// Cumulative finished requests (all reasons).
    #[serde(default)]
    pub requests_finished_total: Option<f64>,
    /// Cumulative prompt tokens.
    #[serde(default)]
    pub prompt_tokens_total: Option<f64>,
    /// Cumulative generation tokens.
    #[serde(default)]
    pub generation_tokens_total: Option<f64>,
    /// `vllm:cache_config_info` labels, as vLLM wrote them.
    #[serde(default)]
    pub cache_config: BTreeMap<String, String>,
}

/// Summary of the window of good snapshots.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct WindowStatus {
    /// First and last snapshot times (Unix seconds).
    pub start: f64,
    /// Last snapshot time.
    pub end: f64,
    /// Good snapshots in the window.
    pub samples: usize,
    /// Mean KV cache usage over the samples, 0–1.
    #[serde(default)]
    pub kv_cache_usage_mean: Option<f64>,
    /// Largest KV cache usage, 0–1.
    #[serde(default)]
    pub kv_cache_usage_max: Option<f64>,
    /// Mean waiting requests.
    #[serde(default)]
    pub requests_waiting_mean: Option<f64>,
    /// Largest waiting requests.
    #[serde(default)]
    pub requests_waiting_max: Option<f64>,
    /// Mean running requests.
    #[serde(default)]
    pub requests_running_mean: Option<f64>,
    /// Preemptions during the window (counter resets handled).
    #[serde(default)]
    pub preemptions: Option<f64>,
    /// Finished requests per second over the window.
    #[serde(default)]
    pub requests_per_second: Option<f64>,
    /// Prompt tokens per second over the window.
    #[serde(default)]
    pub prompt_tokens_per_second: Option<f64>,
    /// Generation tokens per second over the window.
    #[serde(default)]
    pub generation_tokens_per_second: Option<f64>,
    /// Time to first token over the window (from the difference of the first and last histograms), seconds.
    #[serde(default)]
    pub ttft_seconds: Quantiles,
    /// Inter-token latency over the window, seconds (vLLM's `inter_token_latency_seconds`, or the older
    /// `time_per_output_token_seconds`).
    #[serde(default)]
    pub inter_token_latency_seconds: Quantiles,
    /// Prefix-cache hits over queries in the window (vLLM counts both in prompt tokens), 0–1; `null` when no
    /// token was queried in the window, and from older sidecars.
    #[serde(default)]
    pub prefix_cache_hit_ratio: Option<f64>,
    /// Time requests spent in prefill over the window (`vllm:request_prefill_time_seconds`), seconds; all
    /// `null` from older sidecars.
    #[serde(default)]
    pub prefill_time_seconds: Quantiles,
    /// Time requests spent in decode over the window (`vllm:request_decode_time_seconds`), seconds.
    #[serde(default)]
    pub decode_time_seconds: Quantiles,
    /// Share of the window's scrapes that found a request running or waiting, 0–1 (the workload class reads it:
    /// a model idle most of the window is `bursty`); `null` from older sidecars.
    #[serde(default)]
    pub active_ratio: Option<f64>,
}

/// Latency over the short trailing window (see [`SidecarStatus::recent`]).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RecentLatency {
    /// The window asked for (`--latency-window`), seconds.
    pub window_secs: f64,
    /// First snapshot the quantiles start from (Unix seconds): the oldest good scrape within the window.
    pub start: f64,
    /// Last snapshot (Unix seconds).
    pub end: f64,
    /// Time to first token between `start` and `end`, seconds.
    #[serde(default)]
    pub ttft_seconds: Quantiles,
    /// Inter-token latency between `start` and `end`, seconds.
    #[serde(default)]
    pub inter_token_latency_seconds: Quantiles,
    /// The same window's TTFT observations as cumulative buckets on vLLM's bounds (`le` in seconds, the last
    /// `+Inf`): the controller pools them over a model's replicas into the model's p95
    /// (`core::scale::inputs::pooled_ttft`). Empty from older sidecars and in windows with no first token.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ttft_buckets: Vec<crate::metrics::Bucket>,
    /// Time requests waited in vLLM's queue between `start` and `end` (`vllm:request_queue_time_seconds`,
    /// observed when a request finishes), seconds: what tells a queue from a prefill (`core::scale::cause`).
    /// All `null` from older sidecars and vLLMs without the histogram.
    #[serde(default)]
    pub queue_time_seconds: Quantiles,
}

impl RecentLatency {
    /// The [`RecentLatency::ttft_buckets`] of a window's TTFT observations (the difference of two cumulative
    /// histograms): none when the window saw no first token, so an empty list always means "nothing observed"
    /// for a sidecar that sends buckets.
    pub fn ttft_buckets_of(window: &crate::metrics::Histogram) -> Vec<crate::metrics::Bucket> {
        if window.count > 0.0 {
            window.buckets.clone()
        } else {
            Vec::new()
        }
    }
}

/// Windowed quantiles; `null` when no request finished its first token in the window.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Quantiles {
    /// Median.
    #[serde(default)]
    pub p50: Option<f64>,
    /// 95th percentile.
    #[serde(default)]
    pub p95: Option<f64>,
    /// 99th percentile.
    #[serde(default)]
    pub p99: Option<f64>,
    /// Observations in the window the quantiles rest on.
    #[serde(default)]
    pub count: Option<f64>,
}

/// The GPU as the sidecar sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuStatus {
    /// Where the numbers come from: `nvml` or `config`.
    pub source: String,
    /// Total memory, bytes.
    pub total_bytes: u64,
    /// Used memory of the device, bytes (on a dedicated GPU: this server's), when measured.
    #[serde(default)]
    pub used_bytes: Option<u64>,
    /// SM utilization of the device, 0–1, when measured.
    #[serde(default)]
    pub sm_utilization: Option<f64>,
}

/// The recommendation and its bookkeeping.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecommendationStatus {
    /// When it was computed (Unix seconds); `null` before the first attempt.
    #[serde(default)]
    pub computed_at: Option<f64>,
    /// A recommendation (`state: "ready"`) or why not (`state: "not_yet"`, `code`, `reason`).
    pub outcome: Outcome,
}

/// The gpu-agent's `/v1/gpus` document: per-GPU, per-pod use, from NVML in a capacity pod with hostPID. The pool
/// manager reads it to see what each tenant of a shared GPU really uses. Same compatibility rules as
/// [`SidecarStatus`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuAgentStatus {
    /// [`SCHEMA_VERSION`] of the producer.
    pub schema_version: u32,
    /// When this document was produced (Unix seconds, agent clock).
    pub generated_at: f64,
    /// True when the last NVML reading succeeded.
    pub nvml_up: bool,
    /// Why NVML is not up, if it is not.
    #[serde(default)]
    pub error: Option<String>,
    /// When `devices` was read (Unix seconds); `null` before the first good reading.
    #[serde(default)]
    pub read_at: Option<f64>,
    /// Every GPU NVML sees.
    #[serde(default)]
    pub devices: Vec<GpuDeviceUse>,
}

/// One GPU and who uses it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuDeviceUse {
    /// NVML index.
    pub index: u32,
    /// `GPU-…` UUID (what `NVIDIA_VISIBLE_DEVICES` takes).
    pub uuid: String,
    /// Total memory, bytes.
    pub total_bytes: u64,
    /// Used memory of the whole device, bytes (includes the driver's reservation).
    pub used_bytes: u64,
    /// Per-pod use, sorted by pod UID.
    #[serde(default)]
    pub pods: Vec<PodGpuUse>,
    /// Processes on the GPU that are in no Kubernetes pod (host processes), summed.
    #[serde(default)]
    pub unattributed: Option<PodGpuUse>,
}

/// One pod's use of one GPU (all its processes on that GPU).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodGpuUse {
    /// The pod's `metadata.uid` (empty for [`GpuDeviceUse::unattributed`]).
    pub pod_uid: String,
    /// Container IDs seen (runtime prefix stripped), sorted.
    #[serde(default)]
    pub container_ids: Vec<String>,
    /// Host PIDs, sorted.
    pub pids: Vec<u32>,
    /// GPU memory used by those processes, bytes; `null` when NVML could not say for any of them.
    #[serde(default)]
    pub memory_bytes: Option<u64>,
    /// SM utilization of those processes over the last sample period, 0–1; `null` when not supported.
    #[serde(default)]
    pub sm_utilization: Option<f64>,
}

/// The latency objective a replica's compute share is sized to, the body of the sidecar's `PUT /v1/objective`:
/// the InferenceAutoscaler's (`ttftSlo`,
/// `ttftSloPercentile`, `itlSlo`), so it can change while pods run. A command-line flag set at admission would keep
/// the old one until the pod is recreated; instead the controller compares, every sync, the objective each sidecar
/// reports holding ([`ComputeStatus`]) with the spec's and hands over the spec's where they differ
/// ([`Objective::handover`]). The admission flags (`--ttft-slo`, `--itl-slo`) remain the one a sidecar starts with.
/// How a policy makes one is `tessera_core::scale`'s ([`Objective::of`]).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Objective {
    /// Time to first token, seconds (`ttftSlo`); `None`: no TTFT objective.
    #[serde(default)]
    pub ttft_slo_secs: Option<f64>,
    /// Which percentile of the TTFT the objective holds, 95 or 99 (`ttftSloPercentile`).
    #[serde(default = "p95")]
    pub ttft_slo_percentile: u32,
    /// Inter-token latency p95, seconds (`itlSlo`); `None`: no inter-token objective.
    #[serde(default)]
    pub itl_slo_secs: Option<f64>,
}

fn p95() -> u32 {
    95
}

impl Objective {
    /// What to hand a sidecar reporting `held`, or `None` when it holds it already. Without an inter-token
    /// objective of its own (`itl_slo_secs: None`) this keeps the replica's (the `tessera.dev/itl-slo` annotation
    /// it was admitted with), so an InferenceAutoscaler that names none never erases one. A sidecar that reports
    /// no objective (older than the hand-over) is handed it; it answers 404 and keeps its flags.
    pub fn handover(&self, held: Option<&ComputeStatus>) -> Option<Objective> {
        let want = Objective {
            itl_slo_secs: self.itl_slo_secs.or(held.and_then(|h| h.itl_slo_secs)),
            ..*self
        };
        let Some(held) = held else { return Some(want) };
        // Seconds travel through JSON as decimals: equal within a microsecond is the same objective.
        let same = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => (a - b).abs() < 1e-6,
            (None, None) => true,
            _ => false,
        };
        let holds = same(want.ttft_slo_secs, held.ttft_slo_secs)
            && same(want.itl_slo_secs, held.itl_slo_secs)
            && want.ttft_slo_percentile == held.ttft_slo_percentile.unwrap_or(95);
        (!holds).then_some(want)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A window from a sidecar that predates the prefix-cache, prefill, decode and activity fields still reads:
    /// the new fields are unknown (`null`), never zero.
    #[test]
    fn an_older_window_reads_with_the_new_fields_unknown() {
        let old = r#"{"start": 0, "end": 60, "samples": 7, "requests_per_second": 2.5,
            "ttft_seconds": {"p50": 0.1, "p95": 0.3, "p99": 0.4, "count": 150}}"#;
        let w: WindowStatus = serde_json::from_str(old).unwrap();
        assert_eq!(w.requests_per_second, Some(2.5));
        assert_eq!(w.ttft_seconds.p95, Some(0.3));
        assert_eq!(w.prefix_cache_hit_ratio, None);
        assert_eq!(w.prefill_time_seconds, Quantiles::default());
        assert_eq!(w.decode_time_seconds.p95, None);
        assert_eq!(w.active_ratio, None);
    }
}
