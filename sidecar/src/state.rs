//! The sidecar's state: the window of good scrapes, the last good snapshot, scrape bookkeeping, and the
//! recommendation. No I/O and no clock here: every change takes the time it happened, so it is tested
//! directly and the loop in `lib.rs` stays thin.
//!
//! Rules that matter to the autoscaler reading `/v1/status`:
//! - only a scrape that parsed enters the window; a failed one sets `stale` and keeps the last good state;
//! - the recommendation is recomputed only after a good scrape, so it is never computed from bad or missing
//!   data; while stale, the last one stays, marked by `stale` and its `computed_at`;
//! - when vLLM's KV geometry changes (a restart with other flags), the window restarts: usage fractions of
//!   two different cache sizes cannot be compared.

use crate::error::ScrapeError;
use crate::gpu::GpuReading;
use crate::model::{ModelDirError, ModelFiles};
use std::collections::{BTreeMap, VecDeque};
use tessera_core::metrics::{Series, VllmSnapshot, WindowSummary};
use tessera_core::recommend::{
    self, ComputeFacts, Dtype, KvGeometry, LatencyObservation, MemoryFacts, MemoryMode, ModelFacts,
    Observation, Outcome,
};
use tessera_core::scale::SloPercentile;
use tessera_core::wire::sidecar::{
    ComputeStatus, GpuStatus, MemoryStatus, ModelStatus, Quantiles, RecentLatency, RecommendationStatus,
    SCHEMA_VERSION, ScrapeStatus, SidecarStatus, SnapshotSummary, WindowStatus,
};

const MIB: u64 = 1024 * 1024;

/// What the state needs to know from configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    /// vLLM base URL (reported).
    pub vllm_url: String,
    /// Scrape interval, seconds (reported).
    pub interval_secs: f64,
    /// Window length, seconds.
    pub window_secs: f64,
    /// The short latency window of `/v1/status`'s `recent` (`--latency-window`), seconds.
    pub latency_window_secs: f64,
    /// Recommendation tunables.
    pub recommend: recommend::Config,
    /// `--bytes-per-kv-token`.
    pub bytes_per_kv_token: Option<u64>,
    /// `--non-kv-memory-mib`, in bytes.
    pub non_kv_bytes: Option<u64>,
    /// `--max-model-len`.
    pub max_model_len: Option<u64>,
    /// `--gpu-shared`: the device's used memory and busy time are not this server's alone.
    pub gpu_shared: bool,
    /// `--gpu-compute-fraction`: the compute share this server runs with (1 = whole GPU).
    pub compute_share: f64,
    /// `--ttft-slo`, seconds.
    pub ttft_slo_secs: Option<f64>,
    /// `--itl-slo`, seconds.
    pub itl_slo_secs: Option<f64>,
    /// `--model-dir` (reported; the files are read by the loop and given to [`State::set_model`]).
    pub model_dir: Option<String>,
    /// `--model-dtype`: vLLM's `--dtype` when it is not `auto`.
    pub model_dtype: Option<Dtype>,
    /// `--tensor-parallel-size`.
    pub tensor_parallel_size: u32,
}

/// What `--model-dir` gave.
#[derive(Debug, Clone)]
struct ModelLoad {
    /// The geometry and weights, when `config.json` was read.
    facts: Option<ModelFacts>,
    /// Why the files (or only the weights) could not be read.
    error: Option<String>,
}

/// One good scrape, kept in the window with only what the window summary and the recommendation read.
#[derive(Debug, Clone)]
struct Sample {
    obs: Observation,
    snapshot: VllmSnapshot,
}

/// The sidecar's state.
#[derive(Debug)]
pub struct State {
    settings: Settings,
    /// The percentile the TTFT objective holds (p95 until the controller hands over `ttftSloPercentile`).
    ttft_percentile: SloPercentile,
    window: VecDeque<Sample>,
    latest: Option<(f64, VllmSnapshot)>,
    gpu: Option<(&'static str, GpuReading)>,
    scrape: ScrapeStatus,
    vllm_up: bool,
    recommendation: RecommendationStatus,
    model: Option<ModelLoad>,
}

impl State {
    /// Empty state.
    pub fn new(settings: Settings) -> Self {
        let scrape = ScrapeStatus {
            interval_secs: settings.interval_secs,
            ..Default::default()
        };
        Self {
            settings,
            ttft_percentile: SloPercentile::P95,
            window: VecDeque::new(),
            latest: None,
            gpu: None,
            scrape,
            vllm_up: false,
            model: None,
            recommendation: RecommendationStatus {
                computed_at: None,
                outcome: Outcome::NotYet {
                    code: recommend::NotYetCode::TooFewSamples,
                    reason: "no successful scrape of vLLM yet".into(),
                },
            },
        }
    }

    /// Takes the objective the controller hands over (the InferenceAutoscaler's, edited or not): the share rule
    /// sizes to it from the next recommendation on, and `/v1/status` reports it, with no restart (the flags were
    /// only the objective at admission). Returns whether it changed anything.
    pub fn set_objective(&mut self, o: &tessera_core::wire::sidecar::Objective) -> bool {
        let changed = (
            self.settings.ttft_slo_secs,
            self.settings.itl_slo_secs,
            self.ttft_percentile,
        ) != (o.ttft_slo_secs, o.itl_slo_secs, o.percentile());
        self.settings.ttft_slo_secs = o.ttft_slo_secs;
        self.settings.itl_slo_secs = o.itl_slo_secs;
        self.ttft_percentile = o.percentile();
        changed
    }

    /// Records the latest GPU reading (`None` when the probe failed or there is none).
    pub fn set_gpu(&mut self, source: &'static str, reading: Option<GpuReading>) {
        self.gpu = reading.map(|r| (source, r));
    }

    /// Records what `--model-dir` holds (read by the loop, off the async threads). The recommendation uses it from
    /// the next scrape on.
    pub fn set_model(&mut self, read: Result<ModelFiles, ModelDirError>) {
        let (tp, dtype) = (self.settings.tensor_parallel_size, self.settings.model_dtype);
        self.model = Some(match read {
            Ok(files) => ModelLoad {
                facts: Some(files.facts(dtype, tp)),
                error: files
                    .weights
                    .as_ref()
                    .err()
                    .map(|e| format!("weight bytes unknown (no floor for non-KV memory): {e}")),
            },
            Err(e) => ModelLoad {
                facts: None,
                error: Some(e.to_string()),
            },
        });
    }

    /// True while `--model-dir` is set but its `config.json` has not been read (missing, or not there yet).
    pub fn needs_model(&self) -> bool {
        self.settings.model_dir.is_some() && self.model.as_ref().is_none_or(|m| m.facts.is_none())
    }

    /// True once vLLM has answered a scrape.
    pub fn ready(&self) -> bool {
        self.scrape.last_success_at.is_some()
    }

    /// True when the last scrape succeeded.
    pub fn vllm_up(&self) -> bool {
        self.vllm_up
    }

    /// True when `--max-model-len` is unknown (neither configured nor learned from vLLM yet).
    pub fn needs_max_model_len(&self) -> bool {
        self.settings.max_model_len.is_none()
    }

    /// Learns vLLM's `max_model_len` (from `/v1/models`).
    pub fn set_max_model_len(&mut self, n: u64) {
        self.settings.max_model_len = Some(n);
    }

    /// The compute share this server runs with (`--gpu-compute-fraction`).
    pub fn compute_share(&self) -> f64 {
        self.settings.compute_share
    }

    /// Good scrapes in the window.
    pub fn window_len(&self) -> usize {
        self.window.len()
    }

    /// The last good snapshot.
    pub fn latest(&self) -> Option<&VllmSnapshot> {
        self.latest.as_ref().map(|(_, s)| s)
    }

    /// The recommendation outcome.
    pub fn outcome(&self) -> &Outcome {
        &self.recommendation.outcome
    }

    /// Records a good scrape at `now` (Unix seconds) and recomputes the recommendation.
    pub fn record_success(&mut self, now: f64, snapshot: VllmSnapshot) {
        self.scrape.last_attempt_at = Some(now);
        self.scrape.last_success_at = Some(now);
        self.scrape.successes_total += 1;
        self.scrape.last_error = None;
        self.vllm_up = true;

        let geometry = |s: &VllmSnapshot| (s.num_gpu_blocks(), s.block_size());
        let key = geometry(&snapshot);
        let previous = self.latest().map(geometry);
        if previous.is_some_and(|k| k != key) {
            tracing::info!(
                ?key,
                ?previous,
                "vLLM's KV geometry changed: restarting the window"
            );
            self.window.clear();
        }

        let busy = self
            .gpu
            .filter(|_| !self.settings.gpu_shared)
            .and_then(|(_, g)| g.busy_ratio);
        let obs = Observation {
            at_secs: now,
            kv_usage: snapshot.kv_cache_usage,
            requests_waiting: snapshot.requests_waiting,
            preemptions_total: snapshot.preemptions_total,
            sm_utilization: busy,
        };
        self.window.push_back(Sample {
            obs,
            snapshot: slim(&snapshot),
        });
        let horizon = now - self.settings.window_secs;
        while self.window.front().is_some_and(|s| s.obs.at_secs < horizon) {
            self.window.pop_front();
        }
        self.latest = Some((now, snapshot));
        self.recompute(now);
    }

    /// Records a failed scrape at `now`: vLLM is down, the last good state is kept and marked stale.
    pub fn record_failure(&mut self, now: f64, error: &ScrapeError) {
        self.scrape.last_attempt_at = Some(now);
        *self
            .scrape
            .errors_total
            .entry(error.label().to_string())
            .or_insert(0) += 1;
        self.scrape.last_error = Some(tessera_core::wire::sidecar::ScrapeError {
            reason: error.label().to_string(),
            message: error.to_string(),
            at: now,
        });
        self.vllm_up = false;
    }

    fn memory_facts(&self, snapshot: &VllmSnapshot) -> MemoryFacts {
        let gpu = self.gpu.map(|(_, g)| g);
        MemoryFacts {
            gpu_total_bytes: gpu.map(|g| g.total_bytes),
            bytes_per_kv_token: self.settings.bytes_per_kv_token,
            non_kv_bytes: self.settings.non_kv_bytes,
            process_gpu_bytes: gpu
                .filter(|_| !self.settings.gpu_shared)
                .and_then(|g| g.used_bytes),
            model: self.model.as_ref().and_then(|m| m.facts),
            ..Default::default()
        }
        // The memory mode's labels; vLLM writes "None" for unset values, which stay unknown, never zero.
        .with_cache_config(&snapshot.cache_config)
    }

    /// The memory mode and the model's files, as the status reports them.
    fn memory_status(&self) -> Option<MemoryStatus> {
        let (_, latest) = self.latest.as_ref()?;
        let mem = self.memory_facts(latest);
        let mode = MemoryMode::of(&mem);
        let model = self.settings.model_dir.as_ref().map(|dir| {
            let load = self.model.as_ref();
            let facts = load.and_then(|m| m.facts);
            let kv = facts.map(|f| f.kv_bytes_per_token(mem.cache_dtype));
            ModelStatus {
                dir: dir.clone(),
                error: match load {
                    Some(m) => m.error.clone(),
                    None => Some("not read yet".into()),
                },
                geometry: facts.map(|f| f.geometry),
                weights_bytes: facts.and_then(|f| f.weights_bytes),
                bytes_per_kv_token: kv
                    .as_ref()
                    .and_then(|k| k.as_ref().ok())
                    .map(|k| k.bytes_per_token),
                bytes_per_kv_token_note: kv.map(|k| match k {
                    Ok(k) => k.derivation,
                    Err(why) => why,
                }),
            }
        });
        Some(MemoryStatus {
            mode,
            mode_reason: mode.describe(&mem),
            model,
        })
    }

    fn recompute(&mut self, now: f64) {
        let Some((_, latest)) = &self.latest else { return };
        let geometry = KvGeometry {
            num_gpu_blocks: latest.num_gpu_blocks().unwrap_or(0),
            block_size: latest.block_size().unwrap_or(0),
            max_model_len: self.settings.max_model_len,
        };
        let window: Vec<Observation> = self.window.iter().map(|s| s.obs).collect();
        // The window's latency, from the difference of its first and last cumulative histograms: what the
        // compute-share rule weighs against the objectives. No window (fewer than two scrapes) = unknown.
        let summary = self.window_summary().map(|(_, _, w)| w);
        // The observation is the objective's percentile: the TTFT's p99 when the objective holds the p99
        // (`ttftSloPercentile: 99`), read as the scale guard reads it (the p95 over too few first tokens for a
        // p99, `SloPercentile::for_window`); the inter-token objective is a p95.
        let latency = |q: Option<tessera_core::metrics::Quantiles>, p: SloPercentile| {
            q.map(|q| LatencyObservation {
                p95_secs: match p.for_window(Some(q.count)) {
                    SloPercentile::P95 => q.p95,
                    SloPercentile::P99 => q.p99,
                },
                samples: q.count,
            })
        };
        let compute = ComputeFacts {
            current_share: Some(self.settings.compute_share),
            ttft_slo_secs: self.settings.ttft_slo_secs,
            itl_slo_secs: self.settings.itl_slo_secs,
            ttft: latency(summary.as_ref().and_then(|w| w.ttft), self.ttft_percentile),
            itl: latency(
                summary.as_ref().and_then(|w| w.inter_token_latency),
                SloPercentile::P95,
            ),
        };
        // The step is bounded from what runs (`recommend::Input::of_replica`, the simulator's input too).
        let input = recommend::Input::of_replica(&window, geometry, self.memory_facts(latest), compute);
        let outcome = recommend::recommend(&input, &self.settings.recommend);
        if let (Outcome::Ready(new), Some(old)) = (&outcome, self.recommendation.outcome.recommendation())
            && (new.kv_cache_memory_bytes != old.kv_cache_memory_bytes
                || new.compute_fraction != old.compute_fraction)
        {
            tracing::info!(
                kv_cache_memory_bytes = new.kv_cache_memory_bytes,
                gpu_memory_mib = new.gpu_memory_mib,
                compute_fraction = new.compute_fraction,
                reason = %new.summary(),
                "recommendation changed"
            );
        }
        self.recommendation = RecommendationStatus {
            computed_at: Some(now),
            outcome,
        };
    }

    /// The window summary between the oldest and newest good scrapes (`None` with fewer than two).
    pub fn window_summary(&self) -> Option<(f64, f64, WindowSummary)> {
        let (first, last) = (self.window.front()?, self.window.back()?);
        let elapsed = last.obs.at_secs - first.obs.at_secs;
        (self.window.len() >= 2 && elapsed > 0.0).then(|| {
            (
                first.obs.at_secs,
                last.obs.at_secs,
                WindowSummary::between(&first.snapshot, &last.snapshot, elapsed),
            )
        })
    }

    /// Latency between the oldest good scrape within the last `latency_window_secs` and the newest one (`None`
    /// with fewer than two scrapes in that span).
    pub fn recent_latency(&self) -> Option<RecentLatency> {
        let last = self.window.back()?;
        // The same rule the simulator applies to its scrapes (`core::scale::inputs::window_start`).
        let first = tessera_core::scale::inputs::window_start(
            self.window.iter(),
            |s| s.obs.at_secs,
            last.obs.at_secs,
            std::time::Duration::from_secs_f64(self.settings.latency_window_secs.max(0.0)),
        )?;
        let elapsed = last.obs.at_secs - first.obs.at_secs;
        (elapsed > 0.0).then(|| {
            let w = WindowSummary::between(&first.snapshot, &last.snapshot, elapsed);
            RecentLatency {
                window_secs: self.settings.latency_window_secs,
                start: first.obs.at_secs,
                end: last.obs.at_secs,
                ttft_seconds: quantiles(w.ttft),
                inter_token_latency_seconds: quantiles(w.inter_token_latency),
                // The window's own buckets, for the controller to pool over the model's replicas; none when no
                // first token was seen (nothing to add).
                ttft_buckets: w
                    .ttft_histogram
                    .as_ref()
                    .map(RecentLatency::ttft_buckets_of)
                    .unwrap_or_default(),
                queue_time_seconds: quantiles(w.queue_time),
            }
        })
    }

    /// The `/v1/status` document at `now`.
    pub fn status(&self, now: f64) -> SidecarStatus {
        let latest = self.latest.as_ref().map(|(at, s)| SnapshotSummary {
            at: *at,
            model_names: s.model_names.clone(),
            kv_cache_usage_ratio: s.kv_cache_usage,
            requests_running: s.requests_running,
            requests_waiting: s.requests_waiting,
            preemptions_total: s.preemptions_total,
            requests_finished_total: (!s.request_success_total.is_empty())
                .then(|| s.request_success_total.values().sum()),
            prompt_tokens_total: s.prompt_tokens_total,
            generation_tokens_total: s.generation_tokens_total,
            cache_config: s.cache_config.clone(),
        });
        let window = self.window_summary().map(|(start, end, w)| {
            let vals = |f: fn(&Observation) -> Option<f64>| -> Vec<f64> {
                self.window
                    .iter()
                    .filter_map(|s| f(&s.obs))
                    .filter(|v| v.is_finite())
                    .collect()
            };
            let mean = |v: &[f64]| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
            let max = |v: &[f64]| v.iter().copied().reduce(f64::max);
            let kv = vals(|o| o.kv_usage);
            let waiting = vals(|o| o.requests_waiting);
            let running: Vec<f64> = self
                .window
                .iter()
                .filter_map(|s| s.snapshot.requests_running)
                .filter(|v| v.is_finite())
                .collect();
            WindowStatus {
                start,
                end,
                samples: self.window.len(),
                kv_cache_usage_mean: mean(&kv),
                kv_cache_usage_max: max(&kv),
                requests_waiting_mean: mean(&waiting),
                requests_waiting_max: max(&waiting),
                requests_running_mean: mean(&running),
                preemptions: w.preemptions,
                requests_per_second: w.requests_per_second,
                prompt_tokens_per_second: w.prompt_tokens_per_second,
                generation_tokens_per_second: w.generation_tokens_per_second,
                ttft_seconds: quantiles(w.ttft),
                inter_token_latency_seconds: quantiles(w.inter_token_latency),
                prefix_cache_hit_ratio: w.prefix_cache_hit_ratio,
                prefill_time_seconds: quantiles(w.prefill_time),
                decode_time_seconds: quantiles(w.decode_time),
                // What the workload class reads (`core::workload`, which defines an active scrape).
                active_ratio: tessera_core::workload::active_ratio(
                    self.window
                        .iter()
                        .map(|s| (s.snapshot.requests_running, s.snapshot.requests_waiting)),
                ),
            }
        });
        let gpu = self.gpu.map(|(source, g)| GpuStatus {
            source: source.to_string(),
            total_bytes: g.total_bytes,
            used_bytes: g.used_bytes,
            sm_utilization: g.busy_ratio,
        });
        SidecarStatus {
            schema_version: SCHEMA_VERSION,
            generated_at: now,
            vllm_url: self.settings.vllm_url.clone(),
            vllm_up: self.vllm_up,
            ready: self.ready(),
            stale: !self.vllm_up,
            scrape: self.scrape.clone(),
            max_model_len: self.settings.max_model_len,
            latest,
            window,
            recent: self.recent_latency(),
            gpu,
            recommendation: self.recommendation.clone(),
            compute: Some(ComputeStatus {
                current_share: self.settings.compute_share,
                ttft_slo_secs: self.settings.ttft_slo_secs,
                ttft_slo_percentile: Some(self.ttft_percentile.number()),
                itl_slo_secs: self.settings.itl_slo_secs,
            }),
            memory: self.memory_status(),
            // Sleep mode is not performed by this sidecar yet.
            rest: None,
            startup_gate: None,
        }
    }

    /// Per-model values of the latest snapshot, by the parser's aggregate rule over each model's engines
    /// ([`VllmSnapshot::per_model`]); empty before the first good scrape.
    pub fn per_model(&self) -> BTreeMap<String, Series> {
        self.latest().map(VllmSnapshot::per_model).unwrap_or_default()
    }
}

/// The window keeps hundreds of snapshots (600 at a 1 s interval over 10 min); drop what the window summary
/// does not read so the sidecar stays small (the aggregate histograms, prefill and decode included, stay: the
/// window's quantiles come from them).
fn slim(s: &VllmSnapshot) -> VllmSnapshot {
    VllmSnapshot {
        per_engine: Vec::new(),
        line_errors: Vec::new(),
        cache_config: BTreeMap::new(),
        model_names: Vec::new(),
        ..s.clone()
    }
}

/// The wire form of windowed quantiles (all `null` when nothing was observed).
fn quantiles(q: Option<tessera_core::metrics::Quantiles>) -> Quantiles {
    q.map(|q| Quantiles {
        p50: Some(q.p50),
        p95: Some(q.p95),
        p99: Some(q.p99),
        count: Some(q.count),
    })
    .unwrap_or_default()
}

/// Bytes from MiB, saturating.
pub fn mib(m: u64) -> u64 {
    m.saturating_mul(MIB)
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tessera_core::recommend::{NotYetCode, ReasonCode, Source};

    const GIB: u64 = 1024 * 1024 * 1024;
    const MODEL: &str = "neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8";

    /// The real KubeAI page (vLLM ~0.5, Llama-3.1-8B FP8, 4574 blocks of 16).
    const REAL_PAGE: &str = include_str!("../../testdata/vllm/v0-metrics-kubeai-llama31-8b-fp8.txt");

    /// The real page with this model's KV usage, waiting requests and preemption counter replaced.
    fn page(base: &str, kv: f64, waiting: f64, preemptions: f64) -> String {
        base.lines()
            .map(|l| {
                let set = |prefix: &str, v: f64| {
                    l.starts_with(&format!("{prefix}{{model_name=\"{MODEL}\"}}"))
                        .then(|| format!("{prefix}{{model_name=\"{MODEL}\"}} {v}"))
                };
                set("vllm:gpu_cache_usage_perc", kv)
                    .or_else(|| set("vllm:num_requests_waiting", waiting))
                    .or_else(|| set("vllm:num_preemptions_total", preemptions))
                    .unwrap_or_else(|| l.to_string())
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Settings of a sidecar beside a Llama-3.1-8B server (also the exporter's tests').
    pub(crate) fn settings() -> Settings {
        Settings {
            vllm_url: "http://vllm:8000".into(),
            interval_secs: 10.0,
            window_secs: 600.0,
            latency_window_secs: 60.0,
            recommend: recommend::Config::default(),
            // Llama-3.1-8B: 2 × 32 layers × 8 KV heads × 128 × 2 bytes (cache_dtype auto = bf16).
            bytes_per_kv_token: Some(131_072),
            non_kv_bytes: None,
            max_model_len: Some(8192),
            gpu_shared: false,
            compute_share: 1.0,
            ttft_slo_secs: None,
            itl_slo_secs: None,
            model_dir: None,
            model_dtype: None,
            tensor_parallel_size: 1,
        }
    }

    /// Twenty good scrapes of `page`, ten seconds apart from t = 0.
    fn scrape_20(st: &mut State, page: &str) {
        for i in 0..20 {
            st.record_success(10.0 * i as f64, VllmSnapshot::from_text(page).unwrap());
        }
    }

    /// A fresh state with the default settings on an L4.
    fn on_l4() -> State {
        let mut st = State::new(settings());
        st.set_gpu("fake", Some(l4()));
        st
    }

    /// An 80 GiB GPU with no usage or busy reading.
    fn gpu_80gib() -> GpuReading {
        GpuReading {
            total_bytes: 80 * GIB,
            used_bytes: None,
            busy_ratio: None,
        }
    }

    fn l4() -> GpuReading {
        // An NVIDIA L4 as nvidia-smi reports it: 23034 MiB.
        GpuReading {
            total_bytes: 23_034 * MIB,
            used_bytes: None,
            busy_ratio: Some(0.4),
        }
    }

    #[test]
    fn recommends_from_a_window_of_real_pages() {
        let base = REAL_PAGE;
        let mut st = on_l4();
        for i in 0..20 {
            let kv = 0.2 + 0.01 * i as f64;
            st.record_success(
                1000.0 + 10.0 * i as f64,
                VllmSnapshot::from_text(&page(base, kv, 0.0, 0.0)).unwrap(),
            );
        }
        let r = st
            .outcome()
            .recommendation()
            .expect("20 samples over 190 s is enough")
            .clone();
        assert_eq!(r.bytes_per_kv_token_source, Source::Configured);
        // non-KV from vLLM's budget rule: 0.9 × 23034 MiB − 4574 × 16 × 128 KiB.
        assert_eq!(r.non_kv_source, Source::VllmBudgetRule);
        let want_non_kv = (0.9 * (23_034 * MIB) as f64) as u64 - 4574 * 16 * 131_072;
        assert_eq!(r.non_kv_bytes, want_non_kv);
        // Peak 0.39 and p95 0.38 (+20% = 0.456) of 73,184 tokens, but one update may shrink only 10%.
        assert_eq!(r.kv_cache_tokens, (73_184f64 * 0.9).ceil() as u64 / 16 * 16 + 16);
        assert!(r.reasons.iter().any(|x| x.code == ReasonCode::StepLimitedDown));
        // GPU busy 40% is reported, not a sizing signal; with no latency objective the share stays whole.
        assert_eq!(r.compute_fraction, 1.0);
        assert!(
            r.reasons
                .iter()
                .any(|x| x.code == ReasonCode::NoLatencyObjective && x.message.contains("GPU busy 40%"))
        );
        let s = st.status(1200.0);
        assert_eq!(s.compute.unwrap().current_share, 1.0);
        assert_eq!(s.compute.unwrap().ttft_slo_secs, None);
        assert!(s.vllm_up && s.ready && !s.stale);
        let w = s.window.unwrap();
        assert_eq!(w.samples, 20);
        assert!((w.kv_cache_usage_max.unwrap() - 0.39).abs() < 1e-9);
        assert_eq!(
            s.latest.unwrap().model_names,
            vec![MODEL.to_string(), "other/OTHER".to_string()]
        );
        let pm = st.per_model();
        assert_eq!(pm[MODEL].requests_waiting, Some(0.0));
        assert_eq!(pm["other/OTHER"].requests_waiting, Some(3.0));
        assert_eq!(pm["other/OTHER"].kv_cache_usage, None);
    }

    /// An objective handed over at run time replaces the admission flags' at once: the status the controller
    /// reads next reports it, and the next recommendation sizes to it (no restart).
    #[test]
    fn an_objective_handed_over_replaces_the_flags() {
        let mut st = State::new(Settings {
            compute_share: 0.5,
            ttft_slo_secs: Some(2.0),
            ..settings()
        });
        let held = |st: &State| st.status(0.0).compute.unwrap();
        assert_eq!(
            (
                held(&st).ttft_slo_secs,
                held(&st).ttft_slo_percentile,
                held(&st).itl_slo_secs
            ),
            (Some(2.0), Some(95), None)
        );
        let edited = tessera_core::wire::sidecar::Objective {
            ttft_slo_secs: Some(1.0),
            ttft_slo_percentile: 99,
            itl_slo_secs: Some(0.05),
        };
        assert!(st.set_objective(&edited));
        assert!(
            !st.set_objective(&edited),
            "the same objective again changes nothing"
        );
        assert_eq!(
            (
                held(&st).ttft_slo_secs,
                held(&st).ttft_slo_percentile,
                held(&st).itl_slo_secs
            ),
            (Some(1.0), Some(99), Some(0.05))
        );
        assert_eq!(
            edited.handover(Some(&held(&st))),
            None,
            "the controller sees its objective held"
        );
    }

    #[test]
    fn an_objective_without_requests_in_the_window_keeps_the_share() {
        let base = REAL_PAGE;
        let mut st = State::new(Settings {
            compute_share: 0.5,
            ttft_slo_secs: Some(2.0),
            ..settings()
        });
        st.set_gpu("fake", Some(l4()));
        // The page's TTFT histogram never moves: no request got a first token in the window (idle).
        scrape_20(&mut st, &page(base, 0.3, 0.0, 0.0));
        let r = st.outcome().recommendation().unwrap();
        assert_eq!(r.compute_fraction, 0.5);
        assert!(
            r.reasons
                .iter()
                .any(|x| x.code == ReasonCode::TooFewLatencySamples)
        );
        let c = st.status(200.0).compute.unwrap();
        assert_eq!((c.current_share, c.ttft_slo_secs), (0.5, Some(2.0)));
    }

    #[test]
    fn failure_keeps_last_good_state_marked_stale() {
        let base = REAL_PAGE;
        let mut st = on_l4();
        for i in 0..15 {
            st.record_success(
                10.0 * i as f64,
                VllmSnapshot::from_text(&page(base, 0.5, 0.0, 0.0)).unwrap(),
            );
        }
        let before = st.outcome().clone();
        assert!(before.recommendation().is_some());
        let err = crate::error::ScrapeError::HttpStatus {
            url: "u".into(),
            status: 500,
        };
        st.record_failure(200.0, &err);
        st.record_failure(210.0, &err);
        let s = st.status(211.0);
        assert!(!s.vllm_up && s.stale && s.ready);
        assert_eq!(s.scrape.errors_total["http_status"], 2);
        assert_eq!(s.scrape.last_error.as_ref().unwrap().reason, "http_status");
        assert_eq!(s.scrape.last_success_at, Some(140.0));
        assert_eq!(
            st.outcome(),
            &before,
            "a failed scrape never changes the recommendation"
        );
        assert_eq!(s.latest.unwrap().kv_cache_usage_ratio, Some(0.5));
        // The document reads back as the same type the autoscaler uses.
        let json = serde_json::to_string(&st.status(211.0)).unwrap();
        let back: SidecarStatus = serde_json::from_str(&json).unwrap();
        assert_eq!(back, st.status(211.0));
    }

    #[test]
    fn preemptions_on_real_pages_grow_the_cache() {
        let base = REAL_PAGE;
        let mut st = on_l4();
        for i in 0..15 {
            let p = if i < 10 { 3.0 } else { 4.0 };
            st.record_success(
                10.0 * i as f64,
                VllmSnapshot::from_text(&page(base, 0.98, 2.0, p)).unwrap(),
            );
        }
        let r = st.outcome().recommendation().unwrap();
        assert!(r.kv_cache_tokens > 73_184, "{}", r.kv_cache_tokens);
        assert!(r.reasons.iter().any(|x| x.code == ReasonCode::Preemptions));
    }

    #[test]
    fn geometry_change_restarts_the_window_and_no_gpu_means_not_yet() {
        let base = REAL_PAGE;
        let mut st = State::new(settings());
        for i in 0..15 {
            st.record_success(
                10.0 * i as f64,
                VllmSnapshot::from_text(&page(base, 0.5, 0.0, 0.0)).unwrap(),
            );
        }
        // No GPU reading at all: nothing to size against.
        assert!(matches!(
            st.outcome(),
            Outcome::NotYet {
                code: NotYetCode::UnknownGpuMemory,
                ..
            }
        ));
        st.set_gpu("fake", Some(gpu_80gib()));
        let restarted = base.replace("num_gpu_blocks=\"4574\"", "num_gpu_blocks=\"9000\"");
        st.record_success(200.0, VllmSnapshot::from_text(&restarted).unwrap());
        assert_eq!(st.window_len(), 1);
        assert!(matches!(
            st.outcome(),
            Outcome::NotYet {
                code: NotYetCode::TooFewSamples,
                ..
            }
        ));
    }

    /// A page whose only latency is a TTFT histogram with `slow` requests between 0.1 and 1 s and `fast` under 0.1 s.
    fn ttft_page(fast: u64, slow: u64) -> String {
        let m = "model_name=\"m\"";
        let total = fast + slow;
        format!(
            "vllm:num_requests_running{{{m}}} 0\nvllm:num_requests_waiting{{{m}}} 0\n\
             vllm:time_to_first_token_seconds_bucket{{{m},le=\"0.1\"}} {fast}\n\
             vllm:time_to_first_token_seconds_bucket{{{m},le=\"1.0\"}} {total}\n\
             vllm:time_to_first_token_seconds_bucket{{{m},le=\"+Inf\"}} {total}\n\
             vllm:time_to_first_token_seconds_count{{{m}}} {total}\n\
             vllm:time_to_first_token_seconds_sum{{{m}}} {}\n",
            fast as f64 * 0.05 + slow as f64 * 0.5
        )
    }

    #[test]
    fn recent_latency_covers_only_the_latency_window() {
        let mut st = State::new(settings());
        // Five minutes of slow first tokens (an excursion), then five minutes of fast ones.
        let (mut fast, mut slow) = (0, 0);
        for i in 0..=60 {
            if i < 30 {
                slow += 10;
            } else {
                fast += 10;
            }
            st.record_success(
                10.0 * f64::from(i),
                VllmSnapshot::from_text(&ttft_page(fast, slow)).unwrap(),
            );
        }
        let s = st.status(600.0);
        let long = s.window.unwrap().ttft_seconds.p95.unwrap();
        let recent = s.recent.unwrap();
        assert!(
            long > 0.1,
            "the 10-minute window still sees the excursion: p95 {long}"
        );
        assert!(recent.ttft_seconds.p95.unwrap() <= 0.1, "{recent:?}");
        assert_eq!(
            (recent.window_secs, recent.start, recent.end),
            (60.0, 540.0, 600.0)
        );
        assert_eq!(recent.ttft_seconds.count, Some(60.0));
        // The window's buckets ride along, cumulative, ending at +Inf with the window's count.
        let last = recent.ttft_buckets.last().unwrap();
        assert!(
            last.le.is_infinite() && last.cumulative == 60.0,
            "{:?}",
            recent.ttft_buckets
        );
    }

    /// Four real pages of one vLLM 0.32 server, scraped in the order they were captured (idle, a full batch
    /// running, 40 waiting, idle again): the window carries the prefix-cache hit ratio, prefill and decode
    /// quantiles and the share of active scrapes, and the document reads back as the autoscaler's type.
    #[test]
    fn the_window_reports_prefix_cache_prefill_decode_and_activity_from_real_pages() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/vllm/real/");
        let mut st = State::new(settings());
        for (i, f) in ["idle", "running", "waiting", "after-load"].iter().enumerate() {
            let text = std::fs::read_to_string(format!("{dir}metrics-{f}.txt")).unwrap();
            st.record_success(10.0 * i as f64, VllmSnapshot::from_text(&text).unwrap());
        }
        let w = st.status(30.0).window.unwrap();
        // Hits 0 → 896 of queries 1088 → 7569 prompt tokens.
        let ratio = w.prefix_cache_hit_ratio.unwrap();
        assert!((ratio - 896.0 / 6481.0).abs() < 1e-12, "{ratio}");
        // 8 → 69 requests finished their prefill and decode in the window.
        assert_eq!(w.prefill_time_seconds.count, Some(61.0));
        assert_eq!(w.decode_time_seconds.count, Some(61.0));
        let (p50, p95) = (
            w.prefill_time_seconds.p50.unwrap(),
            w.prefill_time_seconds.p95.unwrap(),
        );
        assert!(0.0 < p50 && p50 <= p95, "{:?}", w.prefill_time_seconds);
        assert!(w.decode_time_seconds.p95.is_some());
        // Two of the four scrapes found requests running or waiting.
        assert_eq!(w.active_ratio, Some(0.5));
        // The short window carries the same requests' queue time, which the autoscaler reads to tell a queue from
        // a prefill (`core::scale::cause`).
        let now = st.status(30.0);
        let queue = now.recent.as_ref().unwrap().queue_time_seconds;
        assert_eq!(queue.count, Some(61.0));
        let signals = tessera_core::scale::inputs::replica_signals(&now, std::time::Duration::from_secs(60));
        let read = signals.queue_p95.unwrap().as_secs_f64();
        assert!(
            (read - queue.p95.unwrap()).abs() < 1e-9 && read > 0.0,
            "{queue:?} read as {read}"
        );
        // Read back as the autoscaler reads it (serde_json may move a float's last bit: compare within it).
        let json = serde_json::to_string(&st.status(30.0)).unwrap();
        let back = serde_json::from_str::<SidecarStatus>(&json)
            .unwrap()
            .window
            .unwrap();
        assert_eq!(back.active_ratio, Some(0.5));
        assert!((back.prefix_cache_hit_ratio.unwrap() - ratio).abs() < 1e-12);
        assert_eq!(back.prefill_time_seconds.count, Some(61.0));
        assert!((back.decode_time_seconds.p95.unwrap() - w.decode_time_seconds.p95.unwrap()).abs() < 1e-9);
    }

    #[test]
    fn window_drops_old_samples() {
        let base = REAL_PAGE;
        let mut st = State::new(Settings {
            window_secs: 60.0,
            latency_window_secs: 60.0,
            ..settings()
        });
        scrape_20(&mut st, &page(base, 0.1, 0.0, 0.0));
        // Samples at 130..=190 s are within 60 s of the last.
        assert_eq!(st.window_len(), 7);
    }

    /// The real page, as a server started with `--kv-cache-memory-bytes` would publish it (fixed-KV mode).
    fn fixed_kv_page(kv: f64) -> String {
        page(REAL_PAGE, kv, 0.0, 0.0).replace(
            "gpu_memory_utilization=\"0.9\"",
            "gpu_memory_utilization=\"0.9\",kv_cache_memory_bytes=\"9592373248\"",
        )
    }

    #[test]
    fn fixed_kv_mode_is_stated_and_never_uses_the_budget_rule() {
        let mut st = State::new(Settings {
            bytes_per_kv_token: None,
            ..settings()
        });
        st.set_gpu("fake", Some(gpu_80gib()));
        scrape_20(&mut st, &fixed_kv_page(0.3));
        // No measurement, no configuration: not yet, naming what supplies non-KV memory.
        match st.outcome() {
            Outcome::NotYet { code, reason } => {
                assert_eq!(*code, NotYetCode::UnknownNonKvMemory, "{reason}");
                assert!(
                    reason.contains("fixed-KV mode") && reason.contains("--non-kv-memory-mib"),
                    "{reason}"
                );
            }
            o => panic!("{o:?}"),
        }
        let m = st.status(200.0).memory.unwrap();
        assert_eq!(m.mode, MemoryMode::FixedKv);
        assert!(
            m.mode_reason.contains("kv_cache_memory_bytes = 9592373248"),
            "{}",
            m.mode_reason
        );
        assert!(m.model.is_none());
        // NVML on a dedicated GPU measures it: 8.93 GiB of KV + 16 GiB of weights and context.
        st.set_gpu(
            "fake",
            Some(GpuReading {
                total_bytes: 80 * GIB,
                used_bytes: Some(9_592_373_248 + 16 * GIB),
                busy_ratio: None,
            }),
        );
        st.record_success(200.0, VllmSnapshot::from_text(&fixed_kv_page(0.3)).unwrap());
        let r = st.outcome().recommendation().unwrap();
        assert_eq!(r.bytes_per_kv_token, 131_072);
        assert_eq!(r.bytes_per_kv_token_source, Source::CacheConfigKvBytes);
        assert_eq!(r.non_kv_source, Source::MeasuredProcessMemory);
        assert_eq!(r.non_kv_bytes, 16 * GIB);
    }

    #[test]
    fn model_dir_geometry_is_used_and_reported() {
        let mut st = State::new(Settings {
            bytes_per_kv_token: None,
            non_kv_bytes: Some(10 * GIB),
            model_dir: Some("/models/llama".into()),
            ..settings()
        });
        assert!(st.needs_model());
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/models/llama-3.1-8b");
        st.set_model(crate::model::read_model_dir(&dir));
        assert!(!st.needs_model());
        st.set_gpu("fake", Some(l4()));
        scrape_20(&mut st, &page(REAL_PAGE, 0.3, 0.0, 0.0));
        // Budget mode on the page, but configured non-KV wins; bytes per token from config.json (bf16 KV).
        let r = st.outcome().recommendation().unwrap();
        assert_eq!(r.bytes_per_kv_token, 131_072);
        assert_eq!(r.bytes_per_kv_token_source, Source::ModelConfig);
        let m = st.status(200.0).memory.unwrap();
        assert_eq!(m.mode, MemoryMode::Budget);
        let model = m.model.unwrap();
        assert_eq!(model.dir, "/models/llama");
        assert_eq!(model.bytes_per_kv_token, Some(131_072));
        assert_eq!(model.geometry.unwrap().layers, 32);
        assert!(model.bytes_per_kv_token_note.unwrap().contains("32 layers"));
        // The status round-trips through the type the autoscaler reads.
        let json = serde_json::to_string(&st.status(200.0)).unwrap();
        assert_eq!(
            serde_json::from_str::<SidecarStatus>(&json).unwrap(),
            st.status(200.0)
        );
        // A directory without config.json: reported, and retried.
        let mut st = State::new(Settings {
            model_dir: Some("/nowhere".into()),
            ..settings()
        });
        st.set_model(crate::model::read_model_dir(std::path::Path::new("/nowhere")));
        assert!(st.needs_model());
        st.record_success(0.0, VllmSnapshot::from_text(REAL_PAGE).unwrap());
        let err = st.status(1.0).memory.unwrap().model.unwrap().error.unwrap();
        assert!(err.contains("no config.json"), "{err}");
    }
}
