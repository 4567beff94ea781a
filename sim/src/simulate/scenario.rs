//! Scenario files: what cluster, which models, what traffic, which policies.
//!
//! A scenario is YAML (see `docs/simulator.md` and `scenarios/default.yaml`). [`ScenarioFile`] is the file as
//! written, with serde defaults; [`ScenarioFile::validate`] checks every value and names the field and the fix;
//! [`load`] resolves presets and reads the traces into a [`Scenario`] of plain numbers and per-model arrivals,
//! ready for the pure simulation. Trace paths are relative to the scenario file; `builtin` (the default) means
//! the real traces bundled into the binary, so the default scenario runs anywhere.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use tessera_core::scale::{SloPercentile, coldstart};

use super::batch_jobs::{BatchFile, BatchSetup};
use super::crd_model::SpecModelError;
use super::today::TodayFile;
use crate::model::{GIB, GpuSpec, ModelSpec, SharingModel};
use crate::trace::formats::{self, Format};
use crate::trace::observed::{ObservedTraffic, observed_arrivals};
use crate::trace::transform::{Transform, function_arrivals, llm_arrivals};
use crate::trace::{Arrival, FunctionsTrace, LlmTrace, TraceError};

/// The default scenario, embedded so `tessera simulate` runs with no files around.
pub const DEFAULT_SCENARIO: &str = include_str!("../../../scenarios/default.yaml");
/// The bundled Azure LLM inference trace 2023 (CC-BY 4.0, see `testdata/azure_llm_2023/README.md`).
const BUILTIN_AZURE_LLM: &str =
    include_str!("../../../testdata/azure_llm_2023/AzureLLMInferenceTrace_conv.csv");
/// Six rows of the Azure Functions 2019 trace (CC-BY 4.0, see `testdata/azure_functions_2019/README.md`).
const BUILTIN_AZURE_FUNCTIONS: &str =
    include_str!("../../../testdata/azure_functions_2019/functions_sample.csv");

/// Why a scenario cannot be run. Each message names the field or file and what to change.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum ScenarioError {
    /// The scenario file could not be read.
    #[error("cannot read scenario {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The YAML does not match the scenario schema.
    #[error("scenario {path}: {message}")]
    Yaml {
        /// The file.
        path: String,
        /// serde's message, with the line and column.
        message: String,
    },
    /// Values that are out of range or inconsistent; all of them, one per line.
    #[error("scenario {path} is invalid:\n  - {}", problems.join("\n  - "))]
    Invalid {
        /// The file.
        path: String,
        /// Each problem, naming the field.
        problems: Vec<String>,
    },
    /// A trace could not be read.
    #[error("model {model}: {source}")]
    Trace {
        /// The model whose traffic needed it.
        model: String,
        /// The trace error (file, line, column).
        source: TraceError,
    },
    /// A trace was read but the transform asked for something it does not hold.
    #[error("model {model}: traffic: {message}")]
    Traffic {
        /// The model.
        model: String,
        /// What is wrong.
        message: String,
    },
}

impl ScenarioError {
    /// A fixed label per variant, for metrics and logs.
    pub fn label(&self) -> &'static str {
        self.into()
    }
}

/// A scenario file as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioFile {
    /// A short name for the report.
    pub name: String,
    /// What the scenario represents.
    #[serde(default)]
    pub description: String,
    /// Seed for every random draw (arrivals within a minute, thinning, token draws).
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Simulated time.
    #[serde(with = "humantime_serde")]
    pub duration: Duration,
    /// The GPU type every node has: a preset of the performance model (`a100-80gb`, `h100-80gb`, `a100-40gb`, `l4`).
    pub gpu: String,
    /// Settings shared by the strategies.
    #[serde(default)]
    pub strategies: StrategySettings,
    /// The models served.
    pub models: Vec<ModelFile>,
    /// Batch jobs beside the models' traffic, and the capacity types they may run on
    /// ([`super::batch_jobs`]); `tessera simulate` then prices the ways of running them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<BatchFile>,
}

fn is_auto_class(c: &tessera_api::crd::WorkloadClassSpec) -> bool {
    c.pinned().is_none()
}

fn default_seed() -> u64 {
    1
}

/// Settings for the three strategies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StrategySettings {
    /// How often the autoscalers decide (HPA's `--horizontal-pod-autoscaler-sync-period`, 15 s).
    #[serde(with = "humantime_serde")]
    pub sync_period: Duration,
    /// How often replicas are scraped (signals, recommendation observations, utilization samples).
    #[serde(with = "humantime_serde")]
    pub scrape_interval: Duration,
    /// The window a replica's p95 TTFT signal covers: the sidecar's `--latency-window` (1 min by default, its
    /// `recent` latency, which the controller's SLO guard reads), over vLLM's bucketed histogram.
    #[serde(with = "humantime_serde")]
    pub ttft_window: Duration,
    /// The window of the HPA and AIBrix baselines' request rate (a Prometheus `rate()`); Tessera's rate is the
    /// activator's counter delta over one poll, as the controller gets it.
    #[serde(with = "humantime_serde")]
    pub rate_window: Duration,
    /// Share of requests that must meet the TTFT SLO for the static sizing rule to accept a replica count.
    pub static_attainment_target: f64,
    /// Time a whole-GPU pod takes before loading weights (scheduling, image already cached, CUDA init).
    #[serde(with = "humantime_serde")]
    pub pod_start: Duration,
    /// Tessera: how long a capacity pod keeps an empty GPU before releasing it.
    #[serde(with = "humantime_serde")]
    pub gpu_release_grace: Duration,
    /// Tessera: MiB kept free on every GPU for CUDA contexts (the packer's headroom).
    pub gpu_headroom_mib: u64,
    /// Tessera, sleep mode: GPU memory a sleeping pod keeps on its GPU (its CUDA context), MiB. 1.4 GiB is the
    /// level-1 residue reported for vLLM on an H100 (issue 44); a PyTorch process alone kept 0.94 GiB on an H200
    /// (`docs/performance.md`, "Sleep mode on a GPU").
    pub sleep_residue_mib: u64,
    /// Tessera, sleep mode: most sleeping pods on one GPU (the controller's `--max-sleepers-per-gpu`); their
    /// residue together may also take at most a quarter of the GPU's memory.
    pub max_sleepers_per_gpu: u32,
    /// Tessera: how often the memory/compute recommendation is recomputed from the replicas' windows.
    #[serde(with = "humantime_serde")]
    pub recommend_interval: Duration,
    /// Tessera: the observation window the recommendation looks at.
    #[serde(with = "humantime_serde")]
    pub recommend_window: Duration,
    /// The client's timeout: a request with no first token this long after its arrival fails, its client gone,
    /// wherever it waits (held at the activator, or queued and prefilling in a replica's vLLM, which aborts it);
    /// unfinished requests fail this long after the end of the run.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Tessera: start each model from the recommendation a sidecar would have made watching the HPA baseline
    /// (the rollout path: observe with `updateMode: Off`, then apply). When false, replicas start at vLLM's
    /// default memory and only shrink as Tessera's own observations come in.
    pub calibrate_from_baseline: bool,
    /// How co-tenants on a shared GPU slow each other (`mps`, the calibrated default; `proportional`, the old
    /// pessimistic bound where a share `s` stretches every step by `1/s`; `time_slicing`).
    pub sharing_model: SharingModel,
    /// Tessera: how many GPUs' worth of compute shares one GPU's tenants may hold together (the pool's
    /// `computeOversubscription`; 1.0 hands each GPU out once). Above 1 only under `mps`, whose shares are
    /// caps; unset, the pool's default (2.0 under `mps`, 1.0 otherwise).
    pub compute_oversubscription: Option<f64>,
    /// Tessera: empty a GPU by moving its few replicas elsewhere once it has stayed emptiable for
    /// `consolidation_settle` (`core::pack::consolidate`, the pool manager's rule; surge one replica onto another
    /// GPU, retire the old one once the new one is ready).
    pub consolidation: bool,
    /// Tessera: how long a GPU must stay emptiable before it is drained (the pool's `consolidation.settle`);
    /// unset, `gpu_release_grace`, as the pool defaults it to its empty grace.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub consolidation_settle: Option<Duration>,
    /// Tessera: the most replicas moved to empty one GPU (the pool's `consolidation.maxMoves`).
    pub consolidation_max_moves: usize,
    /// Tessera: how the allocation in force reaches pods (the policy's `gpu.updateMode`): `initial` (default),
    /// new pods get it and running pods keep theirs; `recreate`, running pods that drifted from it are also
    /// rolled onto it, make-before-break (`core::rollout::decide_roll`).
    pub update_mode: UpdateMode,
    /// Tessera: how long a recommendation must hold within 5% of itself before it comes into force, and a drift
    /// before it is rolled, unless the growth is urgent (the controller's `--rollout-stability-window`).
    #[serde(with = "humantime_serde")]
    pub rollout_stability_window: Duration,
    /// Tessera, sleep mode: lend a sleeping replica's room beyond its residue to a new replica where the
    /// alternative is opening a GPU (the chart's `gpuPools.lendSleepers`, off by default: a sleeping replica then
    /// keeps its whole share, and what the table shows is what the chart's defaults do). `--lend-sleepers` turns
    /// it on for one run.
    pub lend_sleepers: bool,
}

/// `gpu.updateMode` as the simulator runs it (`Off` applies nothing, so it has no what-if to show).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpdateMode {
    /// New pods get the allocation in force; running pods keep theirs. The default: no running vLLM server is
    /// restarted, the mode teams adopt first after `Off`.
    #[default]
    Initial,
    /// As `initial`, and drifted pods are rolled onto it.
    Recreate,
}

impl UpdateMode {
    /// The name used in scenarios and reports.
    pub fn label(self) -> &'static str {
        match self {
            UpdateMode::Initial => "initial",
            UpdateMode::Recreate => "recreate",
        }
    }

    /// The controller's mode.
    pub fn core(self) -> tessera_core::rollout::UpdateMode {
        match self {
            UpdateMode::Initial => tessera_core::rollout::UpdateMode::Initial,
            UpdateMode::Recreate => tessera_core::rollout::UpdateMode::Recreate,
        }
    }
}

impl StrategySettings {
    /// Tessera's consolidation rule as the pool manager runs it, with this scenario's knobs.
    pub fn consolidation(&self) -> tessera_core::pack::consolidate::ConsolidationConfig {
        use tessera_core::pack::consolidate::ConsolidationConfig;
        ConsolidationConfig::for_pool(
            self.consolidation,
            self.consolidation_max_moves,
            self.consolidation_settle,
            self.gpu_release_grace,
            ConsolidationConfig::default().drain_timeout,
        )
    }

    /// Tessera's in-force and roll rules as the controller runs them, with this scenario's stability window.
    pub fn rollout(&self) -> tessera_core::rollout::RolloutConfig {
        tessera_core::rollout::RolloutConfig {
            stability_window: self.rollout_stability_window,
            ..Default::default()
        }
    }

    /// Tessera's pool oversubscription in force: the one set, or the pool's default for the sharing model.
    pub fn compute_oversubscription(&self) -> f64 {
        self.compute_oversubscription.unwrap_or_else(|| {
            tessera_core::pack::default_compute_oversubscription(self.sharing_model == SharingModel::Mps)
        })
    }
}

impl Default for StrategySettings {
    fn default() -> Self {
        StrategySettings {
            sync_period: Duration::from_secs(15),
            scrape_interval: Duration::from_secs(5),
            ttft_window: tessera_core::scale::inputs::RECENT_WINDOW,
            rate_window: Duration::from_secs(60),
            static_attainment_target: 0.99,
            pod_start: Duration::from_secs(20),
            gpu_release_grace: tessera_core::pack::DEFAULT_EMPTY_GRACE,
            gpu_headroom_mib: tessera_core::pack::DEFAULT_HEADROOM_MIB,
            sleep_residue_mib: tessera_core::pack::sleeping::DEFAULT_RESIDUE_MIB,
            max_sleepers_per_gpu: 4,
            recommend_interval: Duration::from_secs(300),
            recommend_window: Duration::from_secs(1800),
            request_timeout: Duration::from_secs(300),
            calibrate_from_baseline: true,
            sharing_model: SharingModel::default(),
            compute_oversubscription: None,
            consolidation: true,
            consolidation_settle: None,
            consolidation_max_moves: tessera_core::pack::consolidate::ConsolidationConfig::default()
                .max_moves,
            update_mode: UpdateMode::default(),
            rollout_stability_window: tessera_core::rollout::RolloutConfig::default().stability_window,
            lend_sleepers: false,
        }
    }
}

/// One model as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelFile {
    /// The name requests use (`model` in the OpenAI API).
    pub name: String,
    /// A performance-model preset (`llama-3.1-8b`, `qwen2-7b`, `qwen3-14b`, `opt-125m`, …); or give `spec`.
    #[serde(default)]
    pub preset: Option<String>,
    /// A custom model instead of a preset: name, params, weights_bytes, bytes_per_kv_token, max_model_len,
    /// overhead_bytes.
    #[serde(default)]
    pub spec: Option<ModelSpec>,
    /// `--max-model-len` (every strategy uses the same).
    #[serde(default)]
    pub max_model_len: Option<u32>,
    /// The time-to-first-token objective: a request meets the SLO when its TTFT is at most this.
    #[serde(with = "humantime_serde")]
    pub slo_ttft: Duration,
    /// The inter-token latency (p95) objective, optional: Tessera's compute share keeps streaming at least
    /// this fast (the sidecar's `--itl-slo`). Not part of the report's attainment, which is TTFT's.
    #[serde(default, with = "humantime_serde")]
    pub slo_itl: Option<Duration>,
    /// Tessera: which percentile of the time to first token its SLO guard holds under `slo_ttft`, 95 (default) or
    /// 99 (the InferenceAutoscaler's `ttftSloPercentile`). The report's attainment does not depend on it.
    #[serde(default)]
    pub ttft_slo_percentile: Option<u32>,
    /// Fewest replicas (Tessera; 0 allows scale to zero). The baselines keep at least one.
    #[serde(default = "one")]
    pub min_replicas: u32,
    /// Most replicas (every strategy).
    pub max_replicas: u32,
    /// Tessera's per-replica targets (the InferenceAutoscaler `targets`).
    #[serde(default)]
    pub targets: TargetsFile,
    /// The HPA baseline's target: requests per second per replica (a concurrency proxy HPA can get from an
    /// external metric).
    pub hpa_requests_per_second_per_replica: f64,
    /// Tessera: scale to zero after this long without requests (needs `min_replicas: 0`).
    #[serde(default, with = "humantime_serde")]
    pub scale_to_zero_after: Option<Duration>,
    /// Tessera: the share of requests (0–0.5) that may miss the TTFT objective through a cold start
    /// (`scaleToZero.coldStartMissBudget`): a model whose cold start is over its objective goes to zero anyway
    /// when its traffic shows the misses fit (`core::scale::coldstart`). Unset: it keeps a warm replica.
    #[serde(default)]
    pub cold_start_miss_budget: Option<f64>,
    /// Tessera: share `cold_start_miss_budget` with the models naming the same group
    /// (`scaleToZero.coldStartBudgetGroup`): together they may miss that share of their combined requests, spent
    /// on the warm replicas that would sit idle longest per miss (`core::scale::coldstart::group`).
    #[serde(default)]
    pub cold_start_budget_group: Option<String>,
    /// How a replica starts.
    #[serde(default)]
    pub cold_start: ColdStartFile,
    /// Tessera: the replica's compute share: `auto` (the recommendation) or a number in (0, 1].
    #[serde(default)]
    pub compute_fraction: ComputeFraction,
    /// Tessera: the workload class, as the InferenceAutoscaler's `workloadClass`: `auto` (the default: detected
    /// from what the model declares and from its traffic, as the controller does, `core::class`), or
    /// `realtime`, `nearRealtime`, `batch` to pin it. The class's defaults fill the knobs the model leaves unset.
    #[serde(default, skip_serializing_if = "is_auto_class")]
    pub workload_class: tessera_api::crd::WorkloadClassSpec,
    /// The model's traffic.
    pub traffic: TrafficFile,
    /// The `hami-static` peer: the share and memory a user declares for this model.
    #[serde(default)]
    pub hami: HamiFile,
    /// What the model held and met in the cluster it was observed in (`simulate --prometheus` fills it): the
    /// report's "today" column. Absent, today is the static strategy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub today: Option<TodayFile>,
    /// Tessera's policy as an InferenceAutoscaler spec, written as in the manifest (camelCase, `behavior`
    /// included): it sets the Tessera fields above (`crd_model`), which are then not written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inference_autoscaler: Option<tessera_api::crd::InferenceAutoscalerSpec>,
}

/// What a HAMi user declares per model (`nvidia.com/gpucores`, `nvidia.com/gpumem-percentage`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HamiFile {
    /// Compute share, 0–1 (`gpucores` / 100).
    pub cores: f64,
    /// Share of the GPU's memory (`gpumem-percentage` / 100).
    pub memory_fraction: f64,
}

impl Default for HamiFile {
    /// Half a GPU: HAMi's own defaults (`gpucores` 0, `gpumem` 0) mean "no limit", i.e. a whole GPU, so a
    /// user who shares declares a split; half and half is the common one.
    fn default() -> Self {
        HamiFile {
            cores: 0.5,
            memory_fraction: 0.5,
        }
    }
}

fn one() -> u32 {
    1
}

/// Per-replica targets for Tessera's autoscaler.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetsFile {
    /// Mean KV cache usage (0–1).
    #[serde(default)]
    pub kv_cache_utilization: Option<f64>,
    /// Mean waiting requests per replica.
    #[serde(default)]
    pub waiting_requests_per_replica: Option<f64>,
    /// Mean p95 TTFT per replica.
    #[serde(default, with = "humantime_serde")]
    pub ttft_p95: Option<Duration>,
    /// Requests per second per replica.
    #[serde(default)]
    pub requests_per_second_per_replica: Option<f64>,
}

/// How a replica comes up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ColdStartFile {
    /// Weights load bandwidth, GB/s (10^9 bytes), from local NVMe or a model cache.
    pub load_bandwidth_gbps: f64,
    /// The model runs with vLLM sleep mode (`spec.sleep.enabled`): its level-1 wake-up time. Tessera's rounds
    /// decide, as the controller's do (`core::sleep::rule`), whether its last replica sleeps at zero; a single
    /// report's extra run without sleep mode shows what it saved (`Report::tessera_without_sleep`). The baselines
    /// never sleep.
    #[serde(with = "humantime_serde")]
    pub sleep_wake: Option<Duration>,
}

impl Default for ColdStartFile {
    fn default() -> Self {
        ColdStartFile {
            load_bandwidth_gbps: 2.0,
            sleep_wake: None,
        }
    }
}

/// `auto` or a fixed fraction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawFraction", into = "RawFraction")]
pub enum ComputeFraction {
    /// The recommendation's.
    #[default]
    Auto,
    /// A fixed share.
    Fixed(f64),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum RawFraction {
    Number(f64),
    Word(String),
}

impl TryFrom<RawFraction> for ComputeFraction {
    type Error = String;

    fn try_from(raw: RawFraction) -> Result<Self, String> {
        match raw {
            RawFraction::Number(f) => Ok(ComputeFraction::Fixed(f)),
            RawFraction::Word(w) if w == "auto" => Ok(ComputeFraction::Auto),
            RawFraction::Word(w) => Err(format!(
                "compute_fraction is {w:?}: expected `auto` or a number in (0, 1]"
            )),
        }
    }
}

impl From<ComputeFraction> for RawFraction {
    fn from(c: ComputeFraction) -> Self {
        match c {
            ComputeFraction::Auto => RawFraction::Word("auto".into()),
            ComputeFraction::Fixed(f) => RawFraction::Number(f),
        }
    }
}

/// Which trace format a model's traffic comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceKind {
    /// The Azure LLM inference trace format (2023, and the 2024 week-long one).
    AzureLlm,
    /// A generic CSV: `timestamp, prompt_tokens, output_tokens[, model]`.
    Csv,
    /// BurstGPT's CSV.
    Burstgpt,
    /// Mooncake's JSONL.
    Mooncake,
    /// The Azure Functions 2019 per-minute format.
    AzureFunctions,
    /// Counts per step and token histograms read from Prometheus (`simulate --prometheus` writes it inline as
    /// `traffic.observed`).
    Observed,
    /// A synthetic shape (`traffic.synthetic`: `diurnal` or `on_off`, `crate::trace::synthetic`), with lengths
    /// drawn from an Azure LLM trace (`tokens_from`).
    Synthetic,
}

/// One model's traffic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrafficFile {
    /// The trace format.
    pub trace: TraceKind,
    /// The file, relative to the scenario; `builtin` or absent = the bundled real trace.
    #[serde(default)]
    pub file: Option<String>,
    /// Multi-model files (csv with a `model` column, BurstGPT): keep only this model's rows.
    #[serde(default)]
    pub model: Option<String>,
    /// Azure Functions: which function (a unique prefix of `HashFunction`).
    #[serde(default)]
    pub function: Option<String>,
    /// Azure Functions: where (prompt, output) token pairs are drawn from (an Azure LLM trace file;
    /// `builtin` or absent = the bundled one).
    #[serde(default)]
    pub tokens_from: Option<String>,
    /// Request-rate multiplier.
    #[serde(default = "rate_one")]
    pub rate: f64,
    /// Circular time shift.
    #[serde(default, with = "humantime_serde")]
    pub shift: Duration,
    /// Start of the window in the trace's own time.
    #[serde(default, with = "humantime_serde")]
    pub window_start: Duration,
    /// Length of the window; absent = to the end of the trace.
    #[serde(default, with = "humantime_serde")]
    pub window: Option<Duration>,
    /// `trace: synthetic`: the shape (`{shape: diurnal, mean_rps, peak_to_trough, period}` or
    /// `{shape: on_off, rps, on, off}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synthetic: Option<crate::trace::synthetic::Shape>,
    /// `trace: synthetic`: every drawn prompt times this (long-context traffic from a chat trace's lengths),
    /// capped so that prompt and output fit the model's `max_model_len`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_scale: Option<f64>,
    /// `trace: observed`: the counts per step and the token histograms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<ObservedTraffic>,
}

fn rate_one() -> f64 {
    1.0
}

impl ScenarioFile {
    /// Parses YAML; `path` names the source in errors.
    pub fn parse(yaml: &str, path: &str) -> Result<Self, ScenarioError> {
        let yaml_err = |e: serde_yaml::Error| ScenarioError::Yaml {
            path: path.to_string(),
            message: e.to_string(),
        };
        // Models written with an InferenceAutoscaler spec are read by the controller's reader first
        // (`crd_model`); a file without one is read as it is.
        let expanded = super::crd_model::expand(yaml).map_err(|e| match e {
            SpecModelError::Yaml(message) => ScenarioError::Yaml {
                path: path.to_string(),
                message,
            },
            SpecModelError::Invalid(problems) => ScenarioError::Invalid {
                path: path.to_string(),
                problems,
            },
        })?;
        let parsed = match &expanded {
            Some(expanded) => serde_yaml::from_value(expanded.clone()),
            None => serde_yaml::from_str(yaml),
        };
        parsed.map_err(|e| {
            // serde names one missing field per run: name them all at once, with the first one's line.
            let value = expanded.or_else(|| serde_yaml::from_str(yaml).ok());
            let all = value.map_or_else(Vec::new, |v| super::missing_fields::missing::<Self>(&v));
            if all.len() > 1 {
                ScenarioError::Yaml {
                    path: path.to_string(),
                    message: format!(
                        "missing fields: {} (the first: {e})",
                        all.iter()
                            .map(|f| format!("`{f}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                }
            } else {
                yaml_err(e)
            }
        })
    }

    /// Every problem with the values, each naming its field (empty = valid). Presets are resolved here too.
    pub fn validate(&self) -> Vec<String> {
        let mut p = Vec::new();
        self.validate_settings(&mut p);
        if self.models.is_empty() {
            p.push("models: at least one model is needed".to_string());
        }
        let mut names = HashSet::new();
        for (i, m) in self.models.iter().enumerate() {
            let at = format!("models[{i}] ({})", m.name);
            if m.name.trim().is_empty() {
                p.push(format!("models[{i}].name must not be empty"));
            }
            if !names.insert(m.name.clone()) {
                p.push(format!(
                    "{at}: the name is used twice; model names must be unique"
                ));
            }
            m.validate(&at, &mut p);
        }
        if let Some(b) = &self.batch {
            let names: Vec<String> = self.models.iter().map(|m| m.name.clone()).collect();
            p.extend(b.validate(&names, self.duration));
        }
        p
    }

    /// The run's own values: its duration, its GPU and the strategies' settings.
    fn validate_settings(&self, p: &mut Vec<String>) {
        if self.duration.is_zero() {
            p.push("duration must be above 0 (e.g. `1h`)".to_string());
        }
        if self.duration > Duration::from_secs(7 * 86_400) {
            p.push("duration is over a week; simulate a representative day or less".to_string());
        }
        if let Err(e) = GpuSpec::preset(&self.gpu) {
            p.push(format!("gpu: {e}"));
        }
        let s = &self.strategies;
        for (field, d) in [
            ("sync_period", s.sync_period),
            ("scrape_interval", s.scrape_interval),
            ("ttft_window", s.ttft_window),
            ("rate_window", s.rate_window),
            ("recommend_interval", s.recommend_interval),
            ("recommend_window", s.recommend_window),
            ("request_timeout", s.request_timeout),
        ] {
            if d < Duration::from_millis(100) {
                p.push(format!("strategies.{field} must be at least 100ms, got {d:?}"));
            }
        }
        if !(s.static_attainment_target > 0.0 && s.static_attainment_target <= 1.0) {
            p.push(format!(
                "strategies.static_attainment_target must be in (0, 1], got {}",
                s.static_attainment_target
            ));
        }
        let oversubscription = s.compute_oversubscription();
        if let Err(e) = tessera_core::pack::GpuShape::new(1, 0)
            .and_then(|g| g.with_compute_oversubscription(oversubscription))
        {
            p.push(format!("strategies.compute_oversubscription: {e}"));
        }
        if oversubscription > 1.0 && s.sharing_model != SharingModel::Mps {
            p.push(format!(
                "strategies.compute_oversubscription is {} but sharing_model is {}: only MPS shares are caps \
                 that can be oversubscribed; set it to 1.0 or use sharing_model: mps",
                oversubscription,
                s.sharing_model.name()
            ));
        }
    }
}

impl ModelFile {
    /// Every problem with this model's values (its name aside, which needs the others'); `at` names the model.
    fn validate(&self, at: &str, p: &mut Vec<String>) {
        match (&self.preset, &self.spec) {
            (Some(_), Some(_)) => p.push(format!("{at}: give either preset or spec, not both")),
            (None, None) => p.push(format!(
                "{at}: give preset (one of {}) or spec",
                ModelSpec::PRESETS.join(", ")
            )),
            (Some(name), None) => {
                if let Err(e) = ModelSpec::preset(name) {
                    p.push(format!("{at}.preset: {e}"));
                }
            }
            (None, Some(spec)) => {
                if spec.weights_bytes == 0
                    || spec.bytes_per_kv_token == 0
                    || spec.params.is_nan()
                    || spec.params <= 0.0
                {
                    p.push(format!(
                        "{at}.spec: params, weights_bytes and bytes_per_kv_token must be above 0"
                    ));
                }
            }
        }
        if self.slo_ttft.is_zero() {
            p.push(format!("{at}.slo_ttft must be above 0 (e.g. `2s`)"));
        }
        if let Some(n) = self.ttft_slo_percentile
            && SloPercentile::from_number(n).is_none()
        {
            p.push(format!(
                "{at}.ttft_slo_percentile must be 95 or 99 (the percentiles the sidecar reports), got {n}"
            ));
        }
        if self.slo_itl.is_some_and(|d| d.is_zero()) {
            p.push(format!(
                "{at}.slo_itl must be above 0 (e.g. `100ms`), or left out for no objective"
            ));
        }
        if self.max_replicas == 0 {
            p.push(format!("{at}.max_replicas must be at least 1"));
        }
        if self.min_replicas > self.max_replicas {
            p.push(format!(
                "{at}: min_replicas ({}) exceeds max_replicas ({})",
                self.min_replicas, self.max_replicas
            ));
        }
        if self.min_replicas == 0 && self.scale_to_zero_after.is_none() {
            p.push(format!(
                "{at}: min_replicas 0 needs scale_to_zero_after (e.g. `5m`), or set min_replicas: 1"
            ));
        }
        self.validate_cold_start_budget(at, p);
        if !(self.hpa_requests_per_second_per_replica > 0.0
            && self.hpa_requests_per_second_per_replica.is_finite())
        {
            p.push(format!(
                "{at}.hpa_requests_per_second_per_replica must be above 0"
            ));
        }
        if !(self.cold_start.load_bandwidth_gbps > 0.0 && self.cold_start.load_bandwidth_gbps.is_finite()) {
            p.push(format!(
                "{at}.cold_start.load_bandwidth_gbps must be above 0 (GB/s)"
            ));
        }
        if let ComputeFraction::Fixed(f) = self.compute_fraction
            && !(f > 0.0 && f <= 1.0)
        {
            p.push(format!(
                "{at}.compute_fraction must be `auto` or in (0, 1], got {f}"
            ));
        }
        let unit = |x: f64| x > 0.0 && x <= 1.0;
        if !unit(self.hami.cores) || !unit(self.hami.memory_fraction) {
            p.push(format!("{at}.hami: cores and memory_fraction must be in (0, 1]"));
        }
        self.traffic.validate(at, p);
    }

    /// The cold-start miss budget and the group sharing it.
    fn validate_cold_start_budget(&self, at: &str, p: &mut Vec<String>) {
        if let Some(b) = self.cold_start_miss_budget {
            if !coldstart::is_miss_budget(b) {
                p.push(format!(
                    "{at}.cold_start_miss_budget is a share of requests in [0, 0.5] (0.005 = 0.5%), got {b}"
                ));
            }
            if self.scale_to_zero_after.is_none() {
                p.push(format!(
                    "{at}.cold_start_miss_budget needs scale_to_zero_after: it lets a model go to zero"
                ));
            }
        }
        if let Some(g) = &self.cold_start_budget_group {
            if self.cold_start_miss_budget.is_none() {
                p.push(format!(
                    "{at}.cold_start_budget_group '{g}' needs cold_start_miss_budget: the group shares that budget"
                ));
            }
            if !coldstart::is_group_name(g) {
                p.push(format!(
                    "{at}.cold_start_budget_group must be 1-63 lowercase letters, digits or '-', starting and \
                     ending with a letter or digit, got '{g}'"
                ));
            }
        }
    }
}

impl TrafficFile {
    /// Every problem with the traffic's values; `at` names the model.
    fn validate(&self, at: &str, p: &mut Vec<String>) {
        if !(self.rate > 0.0 && self.rate.is_finite()) {
            p.push(format!("{at}.traffic.rate must be above 0, got {}", self.rate));
        }
        match self.trace {
            TraceKind::AzureFunctions if self.function.is_none() => p.push(format!(
                "{at}.traffic.function is required for azure_functions (a unique prefix of HashFunction)"
            )),
            TraceKind::AzureFunctions if self.model.is_some() => p.push(format!(
                "{at}.traffic.model applies to csv and burstgpt files, not azure_functions"
            )),
            TraceKind::AzureLlm | TraceKind::Csv | TraceKind::Burstgpt | TraceKind::Mooncake
                if self.function.is_some() || self.tokens_from.is_some() =>
            {
                p.push(format!(
                    "{at}.traffic: function and tokens_from only apply to trace: azure_functions"
                ))
            }
            TraceKind::Csv | TraceKind::Burstgpt | TraceKind::Mooncake
                if self.file.as_deref().is_none_or(|f| f == "builtin") =>
            {
                p.push(format!(
                    "{at}.traffic.file is required for this trace format (no trace is bundled)"
                ))
            }
            TraceKind::AzureLlm | TraceKind::Mooncake if self.model.is_some() => p.push(format!(
                "{at}.traffic.model applies to csv and burstgpt files (this format holds one model)"
            )),
            TraceKind::Observed => match &self.observed {
                None => p.push(format!(
                    "{at}.traffic.observed is required for trace: observed (step, requests, prompt_tokens, \
                     output_tokens; `tessera simulate --prometheus` writes it)"
                )),
                Some(o) => {
                    if let Err(e) = o.check() {
                        p.push(format!("{at}.traffic.observed: {e}"));
                    }
                    if self.file.is_some()
                        || self.model.is_some()
                        || self.function.is_some()
                        || self.tokens_from.is_some()
                    {
                        p.push(format!(
                            "{at}.traffic: file, model, function and tokens_from do not apply to trace: observed"
                        ));
                    }
                }
            },
            TraceKind::Synthetic => match &self.synthetic {
                None => p.push(format!(
                    "{at}.traffic.synthetic is required for trace: synthetic ({{shape: diurnal, mean_rps, \
                     peak_to_trough, period}} or {{shape: on_off, rps, on, off}})"
                )),
                Some(shape) => {
                    if let Some(e) = shape.problem() {
                        p.push(format!("{at}.traffic.synthetic: {e}"));
                    }
                    if self.file.is_some() || self.model.is_some() || self.function.is_some() {
                        p.push(format!(
                            "{at}.traffic: file, model and function do not apply to trace: synthetic \
                             (tokens_from names where its lengths are drawn from)"
                        ));
                    }
                }
            },
            _ => {}
        }
        if self.prompt_scale.is_some() && self.trace != TraceKind::Synthetic {
            p.push(format!(
                "{at}.traffic.prompt_scale only applies to trace: synthetic"
            ));
        }
        if self.synthetic.is_some() && self.trace != TraceKind::Synthetic {
            p.push(format!("{at}.traffic.synthetic only applies to trace: synthetic"));
        }
        if self.observed.is_some() && self.trace != TraceKind::Observed {
            p.push(format!("{at}.traffic.observed only applies to trace: observed"));
        }
    }
}

/// A model, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSetup {
    /// The name requests use.
    pub name: String,
    /// The performance model's view of it.
    pub spec: ModelSpec,
    /// `--max-model-len`.
    pub max_model_len: Option<u32>,
    /// TTFT objective, seconds.
    pub slo_ttft: f64,
    /// Inter-token latency objective, seconds (Tessera's compute share only).
    pub slo_itl: Option<f64>,
    /// The percentile Tessera's SLO guard holds under `slo_ttft`.
    pub ttft_slo_percentile: SloPercentile,
    /// Tessera's lowest replica count.
    pub min_replicas: u32,
    /// Highest replica count.
    pub max_replicas: u32,
    /// Tessera's targets.
    pub targets: TargetsFile,
    /// HPA baseline target.
    pub hpa_rps_per_replica: f64,
    /// Scale to zero after.
    pub scale_to_zero_after: Option<Duration>,
    /// Share of requests that may miss through a cold start.
    pub cold_start_miss_budget: Option<f64>,
    /// The group sharing that budget.
    pub cold_start_budget_group: Option<String>,
    /// Weights load time, seconds (weights / bandwidth).
    pub load_secs: f64,
    /// Sleep-mode wake-up, seconds.
    pub sleep_wake_secs: Option<f64>,
    /// Tessera's compute share.
    pub compute_fraction: ComputeFraction,
    /// The `hami-static` declaration.
    pub hami: HamiFile,
    /// What it held and met where it was observed.
    pub today: Option<TodayFile>,
    /// Tessera's whole policy when the model carries an InferenceAutoscaler spec, as the controller reads it
    /// (`behavior`, tolerance and panic mode included, which the fields above do not hold).
    pub policy: Option<tessera_core::scale::ScalePolicy>,
    /// The class the model pins (`workload_class`); `None` detects it.
    pub workload_class: Option<tessera_core::class::WorkloadClass>,
    /// Which class knobs the model set itself (a class's default never overrides them).
    pub class_explicit: tessera_core::class::Explicit,
}

impl ModelSetup {
    /// How long a start from zero takes, seconds: a sleep-mode wake when the model has one (its weights wait
    /// in host memory), else the pod's start and the weights' load.
    pub fn cold_start_secs(&self, settings: &StrategySettings) -> f64 {
        self.sleep_wake_secs
            .unwrap_or_else(|| self.scale_up_secs(settings))
    }

    /// How long another replica beside a running one takes to serve: a new pod's start and the weights' load,
    /// sleep mode or not (only a model at zero keeps a sleeping pod to wake).
    pub fn scale_up_secs(&self, settings: &StrategySettings) -> f64 {
        settings.pod_start.as_secs_f64() + self.load_secs
    }
}

/// A scenario ready to simulate: plain numbers and per-model arrivals.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// The scenario's name.
    pub name: String,
    /// What it represents.
    pub description: String,
    /// The seed used for the arrivals.
    pub seed: u64,
    /// Simulated seconds.
    pub duration: f64,
    /// The GPU.
    pub gpu: GpuSpec,
    /// Strategy settings.
    pub settings: StrategySettings,
    /// The models, in file order.
    pub models: Vec<ModelSetup>,
    /// Each model's arrivals, sorted, in the same order as `models`.
    pub arrivals: Vec<Vec<Arrival>>,
    /// The batch jobs, if the scenario has any.
    pub batch: Option<BatchSetup>,
}

impl Scenario {
    /// The same scenario with no model's sleep-mode wake: every start from zero a pod's start and the weights'
    /// load, which is what the controller does today (it cannot put a pod to sleep).
    pub fn without_sleep_mode(&self) -> Scenario {
        let mut sc = self.clone();
        for m in &mut sc.models {
            m.sleep_wake_secs = None;
        }
        sc
    }
}

/// Where the scenario came from: a file (trace paths are relative to its folder) or the embedded default.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// The bundled default scenario.
    Default,
    /// A scenario file.
    File(PathBuf),
}

/// What the command line sets over a scenario file's own values.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Overrides {
    /// The seed of every draw.
    pub seed: Option<u64>,
    /// The simulated time.
    pub duration: Option<Duration>,
    /// `strategies.lend_sleepers` (`--lend-sleepers`).
    pub lend_sleepers: Option<bool>,
}

/// Reads, validates and resolves a scenario; `seed` and `duration` override the file's.
pub fn load(
    source: &Source,
    seed: Option<u64>,
    duration: Option<Duration>,
) -> Result<Scenario, ScenarioError> {
    load_with(
        source,
        Overrides {
            seed,
            duration,
            ..Overrides::default()
        },
    )
}

/// Reads, validates and resolves a scenario, with `overrides` over the file's values.
pub fn load_with(source: &Source, overrides: Overrides) -> Result<Scenario, ScenarioError> {
    let Overrides {
        seed,
        duration,
        lend_sleepers,
    } = overrides;
    let (text, name, dir) = match source {
        Source::Default => (
            DEFAULT_SCENARIO.to_string(),
            "<builtin default>".to_string(),
            None,
        ),
        Source::File(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Io {
                path: path.clone(),
                source,
            })?;
            (
                text,
                path.display().to_string(),
                path.parent().map(Path::to_path_buf),
            )
        }
    };
    let mut file = ScenarioFile::parse(&text, &name)?;
    if let Some(s) = seed {
        file.seed = s;
    }
    if let Some(d) = duration {
        file.duration = d;
    }
    if let Some(lend) = lend_sleepers {
        file.strategies.lend_sleepers = lend;
    }
    resolve(&file, &name, dir.as_deref())
}

/// Validates and resolves a parsed scenario. `dir` is where relative trace paths start.
pub fn resolve(file: &ScenarioFile, name: &str, dir: Option<&Path>) -> Result<Scenario, ScenarioError> {
    let problems = file.validate();
    if !problems.is_empty() {
        return Err(ScenarioError::Invalid {
            path: name.to_string(),
            problems,
        });
    }
    let invalid = |msg: String| ScenarioError::Invalid {
        path: name.to_string(),
        problems: vec![msg],
    };
    let gpu = GpuSpec::preset(&file.gpu).map_err(|e| invalid(format!("gpu: {e}")))?;
    let duration = file.duration.as_secs_f64();
    let names: Vec<String> = file.models.iter().map(|m| m.name.clone()).collect();
    let mut traces = TraceCache::default();
    let mut models = Vec::with_capacity(file.models.len());
    let mut arrivals = Vec::with_capacity(file.models.len());
    for m in &file.models {
        let spec = match (&m.preset, &m.spec) {
            (Some(p), _) => ModelSpec::preset(p).map_err(|e| invalid(format!("models ({}): {e}", m.name)))?,
            (None, Some(s)) => s.clone(),
            (None, None) => return Err(invalid(format!("models ({}): no preset or spec", m.name))),
        };
        let load_secs = spec.weights_bytes as f64 / (m.cold_start.load_bandwidth_gbps * 1e9);
        // Each model draws from its own stream, derived from the seed and its name, so adding a model does not
        // change the others' arrivals.
        let mut rng = ChaCha8Rng::seed_from_u64(file.seed ^ fnv(&m.name));
        let t = &m.traffic;
        let transform = Transform {
            window_start: t.window_start.as_secs_f64(),
            window_len: t.window.map(|w| w.as_secs_f64()),
            rate: t.rate,
            shift: t.shift.as_secs_f64(),
        };
        let traffic_err = |message: String| ScenarioError::Traffic {
            model: m.name.clone(),
            message,
        };
        let trace_err = |source: TraceError| ScenarioError::Trace {
            model: m.name.clone(),
            source,
        };
        let a = match t.trace {
            TraceKind::AzureLlm => {
                let trace = traces.llm(t.file.as_deref(), dir).map_err(trace_err)?;
                llm_arrivals(trace, &transform, duration, &mut rng).map_err(traffic_err)?
            }
            TraceKind::Csv | TraceKind::Burstgpt | TraceKind::Mooncake => {
                let format = match t.trace {
                    TraceKind::Csv => Format::Csv,
                    TraceKind::Burstgpt => Format::BurstGpt,
                    _ => Format::Mooncake,
                };
                let trace = traces
                    .user(format, t.file.as_deref(), t.model.as_deref(), dir)
                    .map_err(trace_err)?;
                llm_arrivals(trace, &transform, duration, &mut rng).map_err(traffic_err)?
            }
            TraceKind::AzureFunctions => {
                let tokens = traces
                    .llm(t.tokens_from.as_deref(), dir)
                    .map_err(trace_err)?
                    .token_pairs();
                let functions = traces.functions(t.file.as_deref(), dir).map_err(trace_err)?;
                let prefix = t.function.as_deref().unwrap_or_default();
                let row = functions.find(prefix).ok_or_else(|| {
                    traffic_err(format!(
                        "no single function whose HashFunction starts with {prefix:?} (absent or ambiguous); \
                         give a longer prefix"
                    ))
                })?;
                function_arrivals(row, &transform, duration, &tokens, &mut rng).map_err(traffic_err)?
            }
            TraceKind::Synthetic => {
                let shape = t
                    .synthetic
                    .as_ref()
                    .ok_or_else(|| traffic_err("trace: synthetic needs traffic.synthetic".into()))?;
                let tokens = traces
                    .llm(t.tokens_from.as_deref(), dir)
                    .map_err(trace_err)?
                    .token_pairs();
                // A prompt longer than the model's context would be refused by vLLM: the scale stops short of it.
                let max_len = m.max_model_len.unwrap_or(spec.max_model_len);
                crate::trace::synthetic::synthetic_arrivals(
                    shape,
                    &transform,
                    duration,
                    &tokens,
                    t.prompt_scale.unwrap_or(1.0),
                    max_len,
                    &mut rng,
                )
                .map_err(traffic_err)?
            }
            TraceKind::Observed => {
                let o = t
                    .observed
                    .as_ref()
                    .ok_or_else(|| traffic_err("trace: observed needs traffic.observed".into()))?;
                observed_arrivals(o, &transform, duration, &mut rng).map_err(traffic_err)?
            }
        };
        models.push(ModelSetup {
            name: m.name.clone(),
            spec,
            max_model_len: m.max_model_len,
            slo_ttft: m.slo_ttft.as_secs_f64(),
            slo_itl: m.slo_itl.map(|d| d.as_secs_f64()),
            // Checked above: a number other than 95 or 99 never gets here.
            ttft_slo_percentile: m
                .ttft_slo_percentile
                .and_then(SloPercentile::from_number)
                .unwrap_or_default(),
            min_replicas: m.min_replicas,
            max_replicas: m.max_replicas,
            targets: m.targets.clone(),
            hpa_rps_per_replica: m.hpa_requests_per_second_per_replica,
            scale_to_zero_after: m.scale_to_zero_after,
            cold_start_miss_budget: m.cold_start_miss_budget,
            cold_start_budget_group: m.cold_start_budget_group.clone(),
            load_secs,
            sleep_wake_secs: m.cold_start.sleep_wake.map(|d| d.as_secs_f64()),
            compute_fraction: m.compute_fraction,
            hami: m.hami,
            today: m.today.clone(),
            policy: super::crd_model::policy(m.inference_autoscaler.as_ref()),
            workload_class: m.workload_class.pinned(),
            class_explicit: tessera_core::class::Explicit {
                cold_start_miss_budget: m.cold_start_miss_budget.is_some(),
                ttft_slo_percentile: m.ttft_slo_percentile.is_some(),
            },
        });
        arrivals.push(a);
    }
    Ok(Scenario {
        name: file.name.clone(),
        description: file.description.clone(),
        seed: file.seed,
        duration,
        gpu,
        settings: file.strategies.clone(),
        batch: file.batch.as_ref().map(|b| b.resolve(&names)),
        models,
        arrivals,
    })
}

/// Bytes of a GiB, for messages.
pub fn gib(bytes: u64) -> f64 {
    bytes as f64 / GIB as f64
}

fn fnv(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Each trace file is read once per scenario, however many models use it.
#[derive(Default)]
struct TraceCache {
    llm: BTreeMap<String, LlmTrace>,
    user: BTreeMap<(String, String), LlmTrace>,
    functions: BTreeMap<String, FunctionsTrace>,
}

impl TraceCache {
    fn key(file: Option<&str>, dir: Option<&Path>) -> (String, Option<PathBuf>) {
        match file {
            None | Some("builtin") => ("builtin".to_string(), None),
            Some(f) => {
                let p = match dir {
                    Some(d) if Path::new(f).is_relative() => d.join(f),
                    _ => PathBuf::from(f),
                };
                (p.display().to_string(), Some(p))
            }
        }
    }

    fn llm(&mut self, file: Option<&str>, dir: Option<&Path>) -> Result<&LlmTrace, TraceError> {
        let (key, path) = Self::key(file, dir);
        if !self.llm.contains_key(&key) {
            let trace = match path {
                None => LlmTrace::parse(
                    BUILTIN_AZURE_LLM.as_bytes(),
                    Path::new("builtin:testdata/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"),
                )?,
                Some(p) => LlmTrace::read(&p)?,
            };
            self.llm.insert(key.clone(), trace);
        }
        self.llm.get(&key).ok_or_else(|| TraceError::Empty {
            path: key.into(),
            message: "not loaded".into(),
        })
    }

    fn user(
        &mut self,
        format: Format,
        file: Option<&str>,
        model: Option<&str>,
        dir: Option<&Path>,
    ) -> Result<&LlmTrace, TraceError> {
        let (path_key, path) = Self::key(file, dir);
        let key = (
            format!("{format:?}:{path_key}"),
            model.unwrap_or_default().to_string(),
        );
        if !self.user.contains_key(&key) {
            let path = path.ok_or_else(|| TraceError::Empty {
                path: path_key.clone().into(),
                message: "no trace of this format is bundled; give traffic.file".into(),
            })?;
            let trace = formats::read(format, &path, model)?;
            self.user.insert(key.clone(), trace);
        }
        self.user.get(&key).ok_or_else(|| TraceError::Empty {
            path: path_key.into(),
            message: "not loaded".into(),
        })
    }

    fn functions(&mut self, file: Option<&str>, dir: Option<&Path>) -> Result<&FunctionsTrace, TraceError> {
        let (key, path) = Self::key(file, dir);
        if !self.functions.contains_key(&key) {
            let trace = match path {
                None => FunctionsTrace::parse(
                    BUILTIN_AZURE_FUNCTIONS.as_bytes(),
                    Path::new("builtin:testdata/azure_functions_2019/functions_sample.csv"),
                )?,
                Some(p) => FunctionsTrace::read(&p)?,
            };
            self.functions.insert(key.clone(), trace);
        }
        self.functions.get(&key).ok_or_else(|| TraceError::Empty {
            path: key.into(),
            message: "not loaded".into(),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const MINIMAL: &str = "
name: t
duration: 10m
gpu: a100-80gb
models:
  - name: chat
    preset: llama-3.1-8b
    slo_ttft: 2s
    max_replicas: 2
    hpa_requests_per_second_per_replica: 4
    traffic: { trace: azure_llm, rate: 0.1 }
";

    #[test]
    fn default_scenario_loads() {
        let s = load(&Source::Default, None, None).unwrap();
        assert!(s.models.len() >= 6, "{} models", s.models.len());
        assert!(s.arrivals.iter().all(|a| !a.is_empty()));
        assert_eq!(s.arrivals.len(), s.models.len());
    }

    /// Every scenario shipped in `scenarios/` parses, validates and resolves (its traces are bundled).
    #[test]
    fn shipped_scenarios_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "yaml") {
                let s = load(&Source::File(path.clone()), None, None)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                assert!(s.arrivals.iter().all(|a| !a.is_empty()), "{}", path.display());
                n += 1;
            }
        }
        assert!(n >= 3, "{n} scenarios in {}", dir.display());
    }

    #[test]
    fn minimal_scenario_and_overrides() {
        let f = ScenarioFile::parse(MINIMAL, "m.yaml").unwrap();
        let s = resolve(&f, "m.yaml", None).unwrap();
        assert_eq!(s.duration, 600.0);
        // 10 minutes at a tenth of ~5.5 req/s.
        let n = s.arrivals[0].len();
        assert!((200..500).contains(&n), "{n}");
        assert!((s.models[0].load_secs - 14.96 * GIB as f64 / 2e9).abs() < 1e-9);
    }

    #[test]
    fn errors_name_the_field() {
        let bad = MINIMAL
            .replace("max_replicas: 2", "max_replicas: 0")
            .replace("gpu: a100-80gb", "gpu: tpu");
        let f = ScenarioFile::parse(&bad, "m.yaml").unwrap();
        let err = resolve(&f, "m.yaml", None).unwrap_err().to_string();
        assert!(err.contains("max_replicas must be at least 1"), "{err}");
        assert!(err.contains("gpu: unknown GPU preset"), "{err}");
        // A miss budget out of range, and one on a model that never goes to zero.
        let bad = MINIMAL.replace(
            "max_replicas: 2",
            "max_replicas: 2\n    cold_start_miss_budget: 0.7",
        );
        let f = ScenarioFile::parse(&bad, "m.yaml").unwrap();
        let err = resolve(&f, "m.yaml", None).unwrap_err().to_string();
        assert!(
            err.contains("cold_start_miss_budget is a share of requests in [0, 0.5]"),
            "{err}"
        );
        assert!(
            err.contains("cold_start_miss_budget needs scale_to_zero_after"),
            "{err}"
        );
        // A budget group without a budget, and a group name no label could carry.
        let bad = MINIMAL.replace(
            "max_replicas: 2",
            "max_replicas: 2\n    cold_start_budget_group: Batch_Tools",
        );
        let f = ScenarioFile::parse(&bad, "m.yaml").unwrap();
        let err = resolve(&f, "m.yaml", None).unwrap_err().to_string();
        assert!(
            err.contains("cold_start_budget_group 'Batch_Tools' needs cold_start_miss_budget"),
            "{err}"
        );
        assert!(
            err.contains("cold_start_budget_group must be 1-63 lowercase letters"),
            "{err}"
        );
        // A guard percentile the sidecar does not report; the two it does resolve.
        let at = |n: &str| {
            MINIMAL.replace(
                "slo_ttft: 2s",
                &format!("slo_ttft: 2s\n    ttft_slo_percentile: {n}"),
            )
        };
        let f = ScenarioFile::parse(&at("90"), "m.yaml").unwrap();
        let err = resolve(&f, "m.yaml", None).unwrap_err().to_string();
        assert!(
            err.contains(
                "ttft_slo_percentile must be 95 or 99 (the percentiles the sidecar reports), got 90"
            ),
            "{err}"
        );
        for (n, want) in [("95", SloPercentile::P95), ("99", SloPercentile::P99)] {
            let f = ScenarioFile::parse(&at(n), "m.yaml").unwrap();
            assert_eq!(
                resolve(&f, "m.yaml", None).unwrap().models[0].ttft_slo_percentile,
                want
            );
        }
        let err = ScenarioFile::parse(&MINIMAL.replace("slo_ttft", "slo_tft"), "m.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("slo_tft"), "{err}");
        let err = ScenarioFile::parse(&MINIMAL.replace("2s", "two seconds"), "m.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("m.yaml"), "{err}");
    }

    #[test]
    fn compute_fraction_auto_or_number() {
        let f = ScenarioFile::parse(&format!("{MINIMAL}    compute_fraction: 0.5\n"), "m").unwrap();
        assert_eq!(f.models[0].compute_fraction, ComputeFraction::Fixed(0.5));
        let f = ScenarioFile::parse(&format!("{MINIMAL}    compute_fraction: auto\n"), "m").unwrap();
        assert_eq!(f.models[0].compute_fraction, ComputeFraction::Auto);
        assert!(ScenarioFile::parse(&format!("{MINIMAL}    compute_fraction: most\n"), "m").is_err());
    }

    #[test]
    fn missing_trace_file_is_a_clear_error() {
        let y = MINIMAL.replace("trace: azure_llm,", "trace: azure_llm, file: nope.csv,");
        let f = ScenarioFile::parse(&y, "m.yaml").unwrap();
        let err = resolve(&f, "m.yaml", Some(Path::new("/nonexistent")))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("model chat") && err.contains("/nonexistent/nope.csv"),
            "{err}"
        );
    }
}
