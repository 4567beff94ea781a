//! What the controller would read at an instant: the documents a replica's sidecar and the model's activator
//! would serve, written from the simulated engines.
//!
//! The simulator does not shape the autoscaler's inputs itself. It writes these documents and hands them to
//! [`tessera_core::scale::inputs`], the functions the controller runs on the documents it fetches, so the
//! simulated decision is the shipped decision on the same observations: the sidecar's snapshot is its last
//! scrape (up to a scrape interval old), its TTFT p95 is vLLM's bucketed histogram differenced over the
//! sidecar's `--latency-window` between two scrapes, and the rate is the activator's request counter differenced
//! over one poll.

use std::time::Duration;

use tessera_core::recommend::{NotYetCode, Outcome};
use tessera_core::scale::inputs::{self, ActivatorSample};
use tessera_core::scale::{ScaleDecision, ScalePolicy, ScaleState, SloPercentile};
use tessera_core::wire::activator::{ActivatorStats, ModelStats};
use tessera_core::wire::sidecar::{
    GpuStatus, Quantiles, RecentLatency, RecommendationStatus, SCHEMA_VERSION, ScrapeStatus, SidecarStatus,
    SnapshotSummary,
};

use crate::model::Histogram;

/// The namespace the simulated models live in (the activator keys models by `"<namespace>/<model>"`).
pub const NAMESPACE: &str = "default";

/// One scrape of a replica's vLLM, as its sidecar would have taken it: the `/metrics` page and the GPU busy ratio
/// NVML would give the sidecar (none on a shared GPU: the device's figure is not the replica's own).
#[derive(Debug, Clone)]
pub struct Page {
    /// When (virtual seconds).
    pub at: f64,
    /// vLLM's `/metrics` page (the emulator's rendering of the replica's engine).
    pub text: String,
    /// The GPU busy ratio over the last scrape interval.
    pub busy: Option<f64>,
}

/// How the webhook would start a replica's sidecar, in the simulator's terms (flags and what NVML reads).
#[derive(Debug, Clone)]
pub struct SidecarSetup {
    /// `--window`: the recommendation window, seconds.
    pub window_secs: f64,
    /// The recommendation's tunables (`--kv-target-utilization` among them).
    pub config: tessera_core::recommend::Config,
    /// `--gpu-compute-fraction`.
    pub compute_share: f64,
    /// `--ttft-slo`, seconds.
    pub ttft_slo_secs: Option<f64>,
    /// `--itl-slo`, seconds.
    pub itl_slo_secs: Option<f64>,
    /// The percentile the TTFT objective holds (`ttftSloPercentile`, handed over by the controller).
    pub ttft_percentile: SloPercentile,
    /// `--bytes-per-kv-token`.
    pub bytes_per_kv_token: Option<u64>,
    /// `--non-kv-memory-mib`, in bytes.
    pub non_kv_bytes: Option<u64>,
    /// `--max-model-len`.
    pub max_model_len: Option<u64>,
    /// `--gpu-shared`: a fractional replica on a shared GPU.
    pub gpu_shared: bool,
    /// The GPU's memory, as NVML (or `--gpu-memory-mib`) reads it.
    pub gpu_total_bytes: u64,
    /// The replica's own GPU memory as NVML reads it on a dedicated GPU.
    pub process_gpu_bytes: Option<u64>,
}

/// One replica's recommendation in a run, with the scrapes it rests on ([`World::recording_recommendations`]):
/// the sidecar's state, fed the same pages, must recommend the same.
///
/// [`World::recording_recommendations`]: crate::simulate::world::World::recording_recommendations
#[derive(Debug, Clone)]
pub struct RecommendationRecord {
    /// The model (index into the scenario's models).
    pub model: usize,
    /// When (virtual seconds).
    pub at: f64,
    /// The replica's sidecar.
    pub sidecar: SidecarSetup,
    /// Every scrape the replica's sidecar would hold, oldest first (at least the recommendation window's).
    pub pages: Vec<Page>,
    /// What the simulator recommended for the replica.
    pub outcome: Outcome,
}

/// One replica-count decision of a run and everything it was made from: what the controller would have fetched
/// (the sidecar documents of the ready replicas, the activator's last two documents), the policy, the history
/// before it, and the decision. The controller's reconcile, given the same documents, must decide the same.
#[derive(Debug, Clone)]
pub struct DecisionRecord {
    /// The model (index into the scenario's models).
    pub model: usize,
    /// When (ms of virtual time).
    pub at_ms: u64,
    /// The replica count the rule read (`/scale`'s, less a surge).
    pub current_replicas: u32,
    /// What the round observed (`core::round::Observed`): what the controller's gathering of the same instant
    /// must build.
    pub observed: tessera_core::round::Observed,
    /// The activator's documents as the controller's poller holds them.
    pub activator: ActivatorSample,
    /// The policy as declared (before the joint rule).
    pub policy: ScalePolicy,
    /// How long a start from zero takes, as the joint rule saw it.
    pub cold_start: Option<std::time::Duration>,
    /// The model's history before the round (before its demand was counted into the cold-start ledger).
    pub state: ScaleState,
    /// The history once the round (`core::scale::joint::round`) counted its demand, resolved its cold start and
    /// kept its budget claim, before the decision was recorded: what the controller's own round from the same
    /// documents must give.
    pub counted: ScaleState,
    /// What was decided.
    pub decision: ScaleDecision,
    /// What held the count (`core::scale::constraint`): the controller's `status.constraint`.
    pub constraint: tessera_core::scale::constraint::Constraint,
    /// Consolidation's part of the round: where the replicas were and the move step applied on top of the
    /// decision.
    pub moving: MoveRecord,
}

/// One model's allocation round as the simulator folded it (`World::recording_allocations`): what it gathered, and
/// what `core::rollout::fold` decided. The controller's parity test rebuilds the cluster this describes and checks
/// the controller folds the same.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocationRecord {
    /// The model's name.
    pub model: String,
    /// `gpu.updateMode`.
    pub mode: tessera_core::rollout::UpdateMode,
    /// The values the policy fixes.
    pub fixed: tessera_core::rollout::Fixed,
    /// What the last round kept.
    pub kept: tessera_core::rollout::Kept,
    /// The model's recommendation this round.
    pub recommended: Option<tessera_core::rollout::Allocation>,
    /// What the model's ready replicas showed.
    pub urgency: tessera_core::rollout::Urgency,
    /// The live replicas' allocations.
    pub pods: Vec<Option<tessera_core::rollout::Allocation>>,
    /// The workload's state.
    pub workload: tessera_core::rollout::Workload,
    /// The allocation the last roll put into the pod template.
    pub rolled_to: Option<tessera_core::rollout::Allocation>,
    /// Now (Unix ms of the simulated clock).
    pub now_ms: u64,
    /// The fold's answer.
    pub fold: tessera_core::rollout::Fold,
}

/// Where a model's replicas were relative to a draining GPU at a decision, and the move step taken
/// (`core::pack::consolidate::move_step`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoveRecord {
    /// The previous round asked for a surge, so `/scale` read one over `current_replicas`.
    pub surged: bool,
    /// For each ready replica (in the order of `sidecars`): whether it sits on a draining GPU — or is being replaced
    /// by a `recreate` roll, which the simulator moves with the same step (one surge, then the old one retired), so
    /// the controller's replay treats it as leaving a draining GPU.
    pub ready_on_draining: Vec<bool>,
    /// Starting replicas on a draining GPU (the other starting ones are elsewhere; a roll replaces only running
    /// ones, so none of these is a roll's).
    pub starting_on_draining: u32,
    /// The step.
    pub step: tessera_core::pack::consolidate::MoveStep,
}

/// The instance name of the one activator the simulator models (it sees every request of every model).
const ACTIVATOR: &str = "sim-activator";

/// One scrape of a replica's vLLM page, as the sidecar keeps it.
#[derive(Debug, Clone)]
pub struct Scrape {
    /// When (seconds of virtual time).
    pub at: f64,
    /// The gauges of the page.
    pub snapshot: SnapshotSummary,
    /// Its cumulative TTFT histogram.
    pub ttft: Histogram,
    /// Its cumulative inter-token latency histogram.
    pub itl: Histogram,
    /// Its cumulative queue-time histogram (`vllm:request_queue_time_seconds`).
    pub queue: Histogram,
}

/// The sidecar's `/v1/status` at `now` for a replica whose scrapes (oldest first) are `scrapes`, with a
/// `--latency-window` of `latency_window`. Only what the autoscaler reads is filled in; the recommendation is
/// the simulator's own round (it is applied by the simulated webhook, not read through this document).
pub fn sidecar_status<'a>(
    scrapes: impl DoubleEndedIterator<Item = &'a Scrape> + Clone,
    gpu_memory_bytes: u64,
    now: f64,
    scrape_interval: Duration,
    latency_window: Duration,
) -> SidecarStatus {
    let last = scrapes.clone().next_back();
    let recent = last.and_then(|last| {
        let first = inputs::window_start(scrapes, |s| s.at, last.at, latency_window)?;
        (last.at > first.at).then(|| {
            // The window's observations, once: its p95 and p99 as the sidecar computes them, and its buckets, which the
            // controller pools over the model's replicas.
            let window = last.ttft.to_cumulative().delta(&first.ttft.to_cumulative());
            RecentLatency {
                window_secs: latency_window.as_secs_f64(),
                start: first.at,
                end: last.at,
                ttft_seconds: Quantiles {
                    p95: inputs::window_ttft_p95(&window, None).map(|d| d.as_secs_f64()),
                    p99: inputs::window_ttft_quantile(&window, None, SloPercentile::P99.quantile())
                        .map(|d| d.as_secs_f64()),
                    ..Quantiles::default()
                },
                ttft_buckets: RecentLatency::ttft_buckets_of(&window),
                // The window's queue time as the sidecar reads it (`WindowSummary`'s difference of the two pages).
                queue_time_seconds: {
                    let q = last.queue.to_cumulative().delta(&first.queue.to_cumulative());
                    Quantiles {
                        p95: inputs::window_ttft_quantile(&q, None, 0.95).map(|d| d.as_secs_f64()),
                        ..Quantiles::default()
                    }
                },
                ..RecentLatency::default()
            }
        })
    });
    SidecarStatus {
        schema_version: SCHEMA_VERSION,
        generated_at: now,
        vllm_url: String::new(),
        vllm_up: true,
        ready: last.is_some(),
        stale: false,
        scrape: ScrapeStatus {
            interval_secs: scrape_interval.as_secs_f64(),
            last_attempt_at: last.map(|s| s.at),
            last_success_at: last.map(|s| s.at),
            ..ScrapeStatus::default()
        },
        max_model_len: None,
        latest: last.map(|s| s.snapshot.clone()),
        window: None,
        recent,
        // As NVML would report the device (the sidecar reads its total memory).
        gpu: Some(GpuStatus {
            source: "nvml".to_owned(),
            total_bytes: gpu_memory_bytes,
            used_bytes: None,
            sm_utilization: None,
        }),
        recommendation: RecommendationStatus {
            computed_at: None,
            outcome: Outcome::NotYet {
                code: NotYetCode::TooFewSamples,
                reason: "the simulator applies its own recommendation round".to_owned(),
            },
        },
        compute: None,
        memory: None,
        rest: None,
        startup_gate: None,
    }
}

/// A model's counters at the activator at one instant.
#[derive(Debug, Clone, Copy, Default)]
pub struct ActivatorCounts {
    /// Requests received since the start of the run.
    pub requests_total: u64,
    /// Requests forwarded whose response has not finished.
    pub in_flight: u64,
    /// Requests held for a replica.
    pub queued: u64,
    /// When the last request arrived (ms of virtual time).
    pub last_request_at_ms: Option<u64>,
    /// What the activator counted of the requests (lanes, streaming, prompt lengths): the class step's input.
    pub mix: tessera_core::class::RequestMix,
}

/// The activator's stats document for one model `key` observed at `at_ms`.
pub fn activator_doc(key: &str, at_ms: u64, counts: ActivatorCounts) -> ActivatorStats {
    let stats = ModelStats {
        mix: counts.mix,
        ..ModelStats::counts(
            counts.requests_total,
            counts.in_flight,
            counts.queued,
            counts.last_request_at_ms,
        )
    };
    ActivatorStats::new(ACTIVATOR, 0, at_ms, [(key.to_owned(), stats)])
}

/// What the controller's poller holds for the activator at `now_ms`: the document of the poll before (one
/// interval earlier) and the one just fetched.
pub fn activator_sample(
    key: &str,
    now_ms: u64,
    poll: Duration,
    previous: ActivatorCounts,
    latest: ActivatorCounts,
) -> ActivatorSample {
    let poll_ms = u64::try_from(poll.as_millis()).unwrap_or(u64::MAX);
    let previous = (now_ms >= poll_ms && poll_ms > 0).then(|| activator_doc(key, now_ms - poll_ms, previous));
    ActivatorSample {
        previous: previous.map(std::sync::Arc::new),
        latest: Some(std::sync::Arc::new(activator_doc(key, now_ms, latest))),
        fetched_at_ms: Some(now_ms),
        last_error: None,
    }
}
