//! What a run produces: per-strategy numbers, per-model numbers and time series, and the stdout table.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::scenario::UpdateMode;

/// The whole report: the scenario and one entry per strategy, on the same arrivals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// Scenario description.
    pub description: String,
    /// Seed used.
    pub seed: u64,
    /// Simulated seconds.
    pub duration_secs: f64,
    /// GPU preset.
    pub gpu: String,
    /// Model names, in scenario order (the index used by the per-model series).
    pub models: Vec<String>,
    /// Requests per model.
    pub requests_per_model: Vec<u64>,
    /// Per model, the GPU-hours of memory its requests force: its weights and smallest cache over the instants
    /// some request of it must be in flight (the first bound's intervals, [`super::bound::Bounds::forced_memory`]), in
    /// one GPU's usable memory, not rounded up.
    #[serde(default)]
    pub forced_memory_gpu_hours: Vec<f64>,
    /// GPU-hours no policy meeting every request's TTFT objective can beat, cold starts free ([`super::bound::Bounds::free`]).
    pub lower_bound_gpu_hours: f64,
    /// GPU-hours no policy meeting every request's TTFT objective through its cold starts can beat
    /// ([`super::bound::Bounds::cold_starts`]).
    #[serde(default)]
    pub lower_bound_with_cold_starts_gpu_hours: f64,
    /// The attainment the run's goals ask for (the scenario's `static_attainment_target`, 0.99).
    #[serde(default)]
    pub attainment_goal: f64,
    /// GPU-hours no policy meeting the TTFT objective for at least `attainment_goal` of the requests through its
    /// cold starts can beat ([`super::bound::Bounds::at_attainment`]).
    #[serde(default)]
    pub lower_bound_at_goal_gpu_hours: f64,
    /// The sharing model the shared GPUs ran with.
    pub sharing_model: String,
    /// How many GPUs' worth of compute shares Tessera's pool handed out per GPU (1.0 = each GPU once).
    #[serde(default = "one")]
    pub compute_oversubscription: f64,
    /// How Tessera's allocation in force reached pods (`initial` or `recreate`, the policy's `gpu.updateMode`).
    #[serde(default)]
    pub update_mode: UpdateMode,
    /// Whether sleeping pods lent their room beyond their residue (`strategies.lend_sleepers`, the chart's
    /// `gpuPools.lendSleepers`; off by default).
    #[serde(default)]
    pub lend_sleepers: bool,
    /// Models the scenario gives a sleep-mode wake (`cold_start.sleep_wake`): Tessera's rounds decide whether
    /// their last replica sleeps at zero (`core::sleep::rule`), as the controller's do.
    #[serde(default)]
    pub sleep_mode_models: Vec<String>,
    /// Tessera's run again with sleep mode off: what putting those models to sleep saved. Only with
    /// `sleep_mode_models` and in a single run's report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tessera_without_sleep: Option<Outcome>,
    /// The scenario's batch jobs run four ways beside the interactive day (`super::batch`), when it has any.
    #[serde(default, skip_serializing_if = "Option::is_none", skip_deserializing)]
    pub batch: Option<super::batch_outcome::BatchComparison>,
    /// Static strategy: replicas per model from the sizing rule, with the reason for each.
    pub static_sizing: Vec<StaticSizing>,
    /// The strategies: static, hpa, tessera.
    pub strategies: Vec<StrategyReport>,
    /// Strategies that could not run the scenario (vLLM would refuse a replica), with the reason; the others ran.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<StrategyFailure>,
    /// Per model, what it held and met where it was observed (`simulate --prometheus`); empty or `None` without.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub today: Vec<Option<super::today::TodayFile>>,
    /// Per model, after how long idle Tessera may take it to zero (`None`: it keeps a replica).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scale_to_zero_after_secs: Vec<Option<f64>>,
    /// Per model, the TTFT objective, seconds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slo_ttft_secs: Vec<f64>,
}

/// A strategy that could not run: which model stopped it, and the reason as vLLM (or the packer) gives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StrategyFailure {
    /// The strategy.
    pub strategy: String,
    /// The model it cannot run (empty when the failure is not one model's).
    pub model: String,
    /// Why.
    pub reason: String,
}

impl StrategyFailure {
    /// From the error that stopped a strategy's run.
    pub fn of(kind: super::StrategyKind, e: &super::SimError) -> StrategyFailure {
        use super::SimError;
        let (model, reason) = match e {
            SimError::Engine { model, source } => (model.clone(), source.to_string()),
            SimError::Pack { model, source } => (model.clone(), source.to_string()),
            SimError::GpuShape(e) => (String::new(), e.to_string()),
        };
        StrategyFailure {
            strategy: kind.name().to_string(),
            model,
            reason,
        }
    }

    /// One line: "hami-static cannot run support-chat: …".
    pub fn line(&self) -> String {
        if self.model.is_empty() {
            format!("{} could not run: {}", self.strategy, self.reason)
        } else {
            format!("{} cannot run {}: {}", self.strategy, self.model, self.reason)
        }
    }
}

/// What one run held and met.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// GPU-hours held.
    pub gpu_hours: f64,
    /// Share of requests within their TTFT objective.
    pub slo_attainment: f64,
    /// Sleeping pods woken on their GPU ([`StrategyReport::sleep_wakes`]).
    #[serde(default)]
    pub sleep_wakes: u64,
    /// Sleeping pods lost ([`StrategyReport::sleepers_lost`]).
    #[serde(default)]
    pub sleepers_lost: u64,
}

fn one() -> f64 {
    1.0
}

/// How the static strategy sized one model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StaticSizing {
    /// Model.
    pub model: String,
    /// Replicas chosen.
    pub replicas: u32,
    /// SLO attainment the model reached alone with that many whole GPUs.
    pub attainment: f64,
    /// Why this count.
    pub reason: String,
}

/// One strategy's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StrategyReport {
    /// `static`, `hpa` or `tessera`.
    pub strategy: String,
    /// One line on what it does.
    pub description: String,
    /// GPU-hours held over the simulated duration.
    pub gpu_hours: f64,
    /// Most GPUs held at once.
    pub gpus_peak: u32,
    /// Mean GPUs held.
    pub gpus_mean: f64,
    /// GPU memory in use (weights, activations, KV blocks holding tokens) over memory of held GPUs.
    pub memory_used_ratio: f64,
    /// GPU memory reserved by replicas (what vLLM allocates) over memory of held GPUs.
    pub memory_reserved_ratio: f64,
    /// GPU compute busy (step time × compute share) over held GPUs.
    pub compute_ratio: f64,
    /// Compute shares held by replicas (starting, ready or draining) over held GPUs: how full the packing is on
    /// the compute dimension, busy or not.
    #[serde(default)]
    pub compute_allocated_ratio: f64,
    /// Requests that arrived.
    pub requests: u64,
    /// Requests that finished.
    pub completed: u64,
    /// Requests that failed: rejected (too long), timed out at the activator, or unfinished at the end.
    pub failed: u64,
    /// TTFT quantiles over requests that got a first token, seconds (arrival at the gateway to first token).
    pub ttft_p50: Option<f64>,
    /// p95.
    pub ttft_p95: Option<f64>,
    /// p99.
    pub ttft_p99: Option<f64>,
    /// Share of all requests whose TTFT met their model's SLO (failed requests count as misses).
    pub slo_attainment: f64,
    /// Replicas started after time 0 (each pays a load or a wake-up).
    pub cold_starts: u64,
    /// Of those, starts from zero replicas.
    pub starts_from_zero: u64,
    /// Of those, sleeping pods woken on their own GPU (sleep mode: only in the "with sleep mode" run).
    #[serde(default)]
    pub sleep_wakes: u64,
    /// Sleeping pods lost: their GPU given back (nothing else kept it), or their memory lent out when a request
    /// came. Their model's next start is a cold one.
    #[serde(default)]
    pub sleepers_lost: u64,
    /// Requests held at the activator because no replica was ready.
    pub held_requests: u64,
    /// Mean time those requests were held, seconds (the latency cold starts added).
    pub held_mean_secs: f64,
    /// Longest hold, seconds.
    pub held_max_secs: f64,
    /// vLLM preemptions (recompute) across replicas.
    pub preemptions: u64,
    /// Digest of the arrivals this strategy processed, in processing order (identical across strategies when
    /// they saw the same requests at the same times).
    pub arrival_digest: String,
    /// Arrivals processed.
    pub arrivals_processed: u64,
    /// Per model.
    pub models: Vec<ModelReport>,
    /// Tessera: what consolidation did (`core::pack::consolidate`); none for the other strategies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consolidation: Option<ConsolidationReport>,
    /// Tessera: what the rollout rule did (`core::rollout`); none for the other strategies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollouts: Option<RolloutReport>,
    /// Time series for the charts.
    pub series: Series,
}

/// What the rollout rule did over a run: rolls onto the allocation in force, by reason, and the replicas they
/// replaced.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RolloutReport {
    /// Rolls begun, by reason (`urgent_growth`, `grow`, `shrink`).
    pub rolls: BTreeMap<String, u32>,
    /// Replicas replaced by a roll (each a cold start of its successor, surged before it went).
    pub replaced: u64,
}

/// What consolidation did over a run: GPUs drained and replicas moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ConsolidationReport {
    /// GPUs marked for draining.
    pub drains: u64,
    /// Of those, emptied (then released by the empty grace unless a new replica came first).
    pub drained: u64,
    /// Of those, called off (their replicas no longer fit elsewhere, or the drain timed out).
    pub cancelled: u64,
    /// Replicas moved off a draining GPU by a surge (each a cold start).
    pub moves: u64,
}

/// One model under one strategy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelReport {
    /// Model name.
    pub model: String,
    /// Requests.
    pub requests: u64,
    /// Failed requests.
    pub failed: u64,
    /// TTFT p95, seconds.
    pub ttft_p95: Option<f64>,
    /// Share meeting the SLO.
    pub slo_attainment: f64,
    /// Most replicas at once within the count the autoscaler decided (never over `max_replicas`).
    pub replicas_max: u32,
    /// Most replicas at once over the decided count: make-before-break surges (a move off a draining GPU, a
    /// roll, an isolation), each a new pod started before the one it replaces leaves.
    #[serde(default)]
    pub surge_max: u32,
    /// Mean replicas (time-weighted).
    pub replicas_mean: f64,
    /// The GPU memory its replicas reserved over the run (weights, overhead and KV cache, starting replicas
    /// included), in GPU-hours of one GPU's memory: the model's part of the GPU-hours held where memory binds.
    #[serde(default)]
    pub memory_gpu_hours: f64,
    /// Replicas started after time 0.
    pub cold_starts: u64,
    /// Of those, the starts from zero replicas (a request found none).
    #[serde(default)]
    pub starts_from_zero: u64,
    /// Preemptions.
    pub preemptions: u64,
    /// KV cache per replica at the end, GiB (Tessera: the recommendation in force).
    pub kv_cache_gib: f64,
    /// Compute share per replica at the end.
    pub compute_fraction: f64,
    /// Smallest compute share any replica of the model was started with.
    pub compute_fraction_min: f64,
    /// GPU memory reserved per replica at the end, MiB.
    pub gpu_memory_mib: u64,
    /// Tessera: why the recommendation in force has its values (from `core::recommend`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recommendation_reasons: Vec<String>,
    /// Tessera: the recommendation the run started from (calibrated on the baseline), KV GiB and compute share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_recommendation: Option<(f64, f64)>,
    /// Autoscaler decisions that changed the replica count, by reason (and leading signal when there was one).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub scale_changes: BTreeMap<String, u32>,
    /// Tessera: the share of replica decisions in which the latency target was left to the share rule (the
    /// share could still grow, `core::scale::joint`); the rest had it on the replica count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_on_share: Option<f64>,
    /// Tessera: the share of replica decisions in which the TTFT target asked for more replicas while no request
    /// waited on any replica or at the activator — latency in prefill, not queueing
    /// (`core::scale::joint::latency_without_queue`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_bound: Option<f64>,
    /// Tessera: the share of replica decisions after which some running replica held less than the allocation in
    /// force in a dimension an urgency hurried (less compute while a replica was over the TTFT objective, less
    /// memory while vLLM preempted; `core::rollout::urgently_below`): what `updateMode: Recreate` rolls at once
    /// and `Initial` leaves running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub behind_while_urgent: Option<f64>,
    /// Tessera: the workload class its rounds ended the run in, where it came from and why (`core::class`, as in
    /// `status.workloadClass` and `workloadClassReason`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_class: Option<ClassReport>,
    /// Tessera: why the model kept a warm replica instead of going to zero (`core::scale::joint::WarmFloor`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_floor: Option<String>,
    /// Tessera: the share of replica decisions after which the model held whole GPUs at its ceiling
    /// (`core::scale::isolation`), and how many times an isolation began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolated: Option<(f64, u32)>,
    /// The share of the model's replica decisions by what held the count (`core::scale::constraint` labels:
    /// `ttft_target`, `prefill`, `kv_cache`, `max_replicas`, `cold_start`, …), as `status.constraint` says each
    /// round; empty for strategies without an autoscaler.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub held_by: BTreeMap<String, f64>,
    /// Tessera: what the next unit of latency capacity cost at the model's last decision — a bigger share while it
    /// can grow, another replica at the whole GPU (`core::scale::joint::NextUnit`); none for a fixed share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_unit: Option<String>,
}

impl ModelReport {
    /// Its `held_by` constraints, most frequent first, at most `n` of them (`ttft_target 40% / max_replicas
    /// 30%`); none when the strategy has no autoscaler.
    pub fn held_by_ranked(&self, n: usize) -> Option<String> {
        if self.held_by.is_empty() {
            return None;
        }
        let mut by: Vec<(&String, &f64)> = self.held_by.iter().collect();
        by.sort_by(|a, b| b.1.total_cmp(a.1).then(a.0.cmp(b.0)));
        Some(
            by.iter()
                .take(n)
                .map(|(k, f)| format!("{k} {:.0}%", **f * 100.0))
                .collect::<Vec<_>>()
                .join(" / "),
        )
    }
}

/// Time series sampled during the run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Series {
    /// Sample times, seconds.
    pub t: Vec<f64>,
    /// GPUs held at each sample.
    pub gpus: Vec<u32>,
    /// Replicas (starting, ready or draining) per model at each sample: `replicas[model][sample]`.
    pub replicas: Vec<Vec<u32>>,
    /// Start of each TTFT bucket, seconds.
    pub ttft_t: Vec<f64>,
    /// p95 TTFT of requests arriving in each bucket, seconds (`None`: no request).
    pub ttft_p95: Vec<Option<f64>>,
}

/// Nearest-rank quantile of a sorted slice.
pub fn quantile_sorted(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

fn secs(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |s| format!("{s:.3}s"))
}

impl ModelReport {
    /// Replicas on average and at most as printed: `2.4/4`, and `2.4/4+1` when surges went one over the count.
    pub fn replicas_mean_max(&self) -> String {
        let surge = if self.surge_max > 0 {
            format!("+{}", self.surge_max)
        } else {
            String::new()
        };
        format!("{:.1}/{}{surge}", self.replicas_mean, self.replicas_max)
    }

    /// The compute share per replica as printed: the range when replicas were started with different shares.
    pub fn compute_shares(&self) -> String {
        if self.compute_fraction_min < self.compute_fraction - 1e-9 {
            format!("{:.2}–{:.2}", self.compute_fraction_min, self.compute_fraction)
        } else {
            format!("{:.2}", self.compute_fraction)
        }
    }
}

/// A model's workload class at the end of a run, as the controller's status says it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassReport {
    /// `realtime`, `nearRealtime` or `batch`.
    pub class: String,
    /// Where it came from: `pinned`, `declared`, `observed`, `default`.
    pub source: String,
    /// Why.
    pub reason: String,
    /// The knobs whose values came from the class (`status.policyFromClass`); the rest the model set itself.
    pub policy_from_class: Vec<String>,
    /// The class's policy in words (`status.classPolicy`).
    pub policy: String,
}

impl Report {
    /// The strategy with this name.
    pub fn strategy(&self, name: &str) -> Option<&StrategyReport> {
        self.strategies.iter().find(|s| s.strategy == name)
    }

    /// The human table plus the last line for scripts.
    pub fn table(&self) -> String {
        let mut o = String::new();
        self.table_heading(&mut o);
        self.table_rows(&mut o);
        self.table_per_model(&mut o);
        if let (Some(st), Some(t)) = (self.strategy("static"), self.strategy("tessera"))
            && st.gpu_hours > 0.0
        {
            self.table_saving(&mut o, st, t);
            self.table_tessera_notes(&mut o, t);
        }
        for f in &self.failures {
            let _ = writeln!(o, "{}", f.line());
        }
        let _ = writeln!(o, "{}", self.summary_line());
        o
    }

    /// The scenario, the lower bounds and the settings every strategy ran under.
    fn table_heading(&self, o: &mut String) {
        let total: u64 = self.requests_per_model.iter().sum();
        let _ = writeln!(
            o,
            "scenario {} — {} models on {}, {:.0} min simulated, {} requests, seed {}",
            self.scenario,
            self.models.len(),
            self.gpu,
            self.duration_secs / 60.0,
            total,
            self.seed
        );
        let _ = writeln!(
            o,
            "lower bound: {:.2} GPU-hours (no policy meeting every TTFT objective can hold fewer, even with free cold \
             starts); {:.2} through its cold starts, {:.2} (the bound at goal) for one that meets it for {:.0}% of requests; \
             sharing model: {}; Tessera's compute oversubscription: {}×, updateMode: {}",
            self.lower_bound_gpu_hours,
            self.lower_bound_with_cold_starts_gpu_hours,
            self.lower_bound_at_goal_gpu_hours,
            self.attainment_goal * 100.0,
            self.sharing_model,
            self.compute_oversubscription,
            self.update_mode.label()
        );
        let _ = writeln!(o);
    }

    /// Every strategy's totals side by side, one row per number.
    fn table_rows(&self, o: &mut String) {
        let names: Vec<&str> = self.strategies.iter().map(|s| s.strategy.as_str()).collect();
        let _ = write!(o, "{:<34}", "");
        for n in &names {
            let _ = write!(o, "{n:>14}");
        }
        let _ = writeln!(o);
        let row = |o: &mut String, label: &str, f: &dyn Fn(&StrategyReport) -> String| {
            let _ = write!(o, "{label:<34}");
            for s in &self.strategies {
                let _ = write!(o, "{:>14}", f(s));
            }
            let _ = writeln!(o);
        };
        row(o, "GPU-hours", &|s| format!("{:.2}", s.gpu_hours));
        row(o, "× lower bound", &|s| {
            times(s.gpu_hours, self.lower_bound_gpu_hours)
        });
        row(o, "× bound at goal", &|s| {
            times(s.gpu_hours, self.lower_bound_at_goal_gpu_hours)
        });
        row(o, "GPUs held (mean / peak)", &|s| {
            format!("{:.1} / {}", s.gpus_mean, s.gpus_peak)
        });
        row(o, "GPU memory used, held GPUs", &|s| {
            format!("{:.1}%", s.memory_used_ratio * 100.0)
        });
        row(o, "GPU memory reserved, held GPUs", &|s| {
            format!("{:.1}%", s.memory_reserved_ratio * 100.0)
        });
        row(o, "GPU compute busy, held GPUs", &|s| {
            format!("{:.1}%", s.compute_ratio * 100.0)
        });
        row(o, "GPU compute shares held (¹)", &|s| {
            format!("{:.1}%", s.compute_allocated_ratio * 100.0)
        });
        row(o, "TTFT p50", &|s| secs(s.ttft_p50));
        row(o, "TTFT p95", &|s| secs(s.ttft_p95));
        row(o, "TTFT p99", &|s| secs(s.ttft_p99));
        row(o, "TTFT SLO attainment", &|s| {
            format!("{:.2}%", s.slo_attainment * 100.0)
        });
        row(o, "cold starts (from zero)", &|s| {
            format!("{} ({})", s.cold_starts, s.starts_from_zero)
        });
        row(o, "requests held at activator", &|s| s.held_requests.to_string());
        row(o, "added latency (mean / max)", &|s| {
            format!("{:.1}/{:.1}s", s.held_mean_secs, s.held_max_secs)
        });
        row(o, "preemptions", &|s| s.preemptions.to_string());
        row(o, "GPUs drained, replicas moved", &|s| {
            s.consolidation
                .map_or_else(|| "—".to_owned(), |c| format!("{}, {}", c.drains, c.moves))
        });
        row(o, "requests failed", &|s| s.failed.to_string());
        if let Some(note) = self.compute_shares_note() {
            let _ = writeln!(o, "{note}");
        }
        let _ = writeln!(o);
    }

    /// Per strategy, one row per model.
    fn table_per_model(&self, o: &mut String) {
        for s in &self.strategies {
            let _ = writeln!(o, "{} — {}", s.strategy, s.description);
            let _ = writeln!(
                o,
                "  {:<20}{:>9}{:>11}{:>10}{:>12}{:>8}{:>10}{:>13}",
                "model", "requests", "TTFT p95", "SLO met", "replicas", "cold", "KV GiB", "compute"
            );
            for m in &s.models {
                let _ = writeln!(
                    o,
                    "  {:<20}{:>9}{:>11}{:>9.2}%{:>12}{:>8}{:>10.1}{:>13}",
                    m.model,
                    m.requests,
                    secs(m.ttft_p95),
                    m.slo_attainment * 100.0,
                    m.replicas_mean_max(),
                    m.cold_starts,
                    m.kv_cache_gib,
                    m.compute_shares(),
                );
            }
        }
    }

    /// What Tessera saved against static, and what bounds that saving.
    fn table_saving(&self, o: &mut String, st: &StrategyReport, t: &StrategyReport) {
        let _ = writeln!(
            o,
            "\nTessera holds {:.1}% fewer GPU-hours than static and meets the TTFT SLO for {:.2}% of requests.",
            (1.0 - t.gpu_hours / st.gpu_hours) * 100.0,
            t.slo_attainment * 100.0
        );
        // What bounds the saving, from the run itself: the fuller dimension of the held GPUs is the one that
        // stops more replicas sharing them, and the shares actually allocated say how much of what is held
        // the replicas asked for (the rest is fragmentation, the release grace and draining).
        // Compute is full at the pool's oversubscription, not at one GPU's worth of shares.
        let compute_full = t.compute_allocated_ratio / self.compute_oversubscription.max(1.0);
        let (binding, other) = if compute_full >= t.memory_reserved_ratio {
            ("compute shares", "memory")
        } else {
            ("memory", "compute shares")
        };
        let _ = writeln!(
            o,
            "What bounds it: held GPUs are {:.0}% allocated on compute (of {}× a GPU handed out) and {:.0}% \
             reserved on memory, so {binding} \
             (not {other}) limit packing; replicas × shares add up to {:.1} of the {:.1} GPUs held on average. \
             Each model's share and replica count, with reasons: --out DIR → report.json; docs/simulator.md.",
            t.compute_allocated_ratio * 100.0,
            self.compute_oversubscription,
            t.memory_reserved_ratio * 100.0,
            t.compute_allocated_ratio * t.gpus_mean,
            t.gpus_mean
        );
    }

    /// Why Tessera's replicas, shares and rolls came out as they did, one line per cause that occurred.
    fn table_tessera_notes(&self, o: &mut String, t: &StrategyReport) {
        // The joint rule (`core::scale::joint`): who answered the latency target, per model.
        let owners = per_model_percent(&t.models, |m| m.latency_on_share);
        let floors = per_model(&t.models, |m| m.warm_floor.as_ref().map(|w| format!("({w})")));
        if !floors.is_empty() {
            let _ = writeln!(
                o,
                "Kept one warm replica instead of scaling to zero, because a cold start would miss the TTFT \
                 objective: {}.",
                floors.join(", ")
            );
        }
        if let Some(note) = self.sleep_mode_note() {
            let _ = writeln!(o, "{note}");
        }
        if let Some(note) = Self::class_note(t) {
            let _ = writeln!(o, "{note}");
        }
        if let Some(r) = t.rollouts.as_ref().filter(|r| !r.rolls.is_empty()) {
            let reasons: Vec<String> = r.rolls.iter().map(|(k, n)| format!("{k} {n}")).collect();
            let _ = writeln!(
                o,
                "Rolled running replicas onto the allocation in force {} time(s) ({}), replacing {} replica(s), \
                 each by a surge before the old one went.",
                r.rolls.values().sum::<u32>(),
                reasons.join(", "),
                r.replaced
            );
        }
        if let Some(c) = t.consolidation.filter(|c| c.drains > 0) {
            let _ = writeln!(
                o,
                "Consolidation drained {} GPU(s) ({} emptied, {} called off), moving {} replica(s), each by a \
                 surge onto another GPU before the old one went.",
                c.drains, c.drained, c.cancelled, c.moves
            );
        }
        if !owners.is_empty() {
            let _ = writeln!(
                o,
                "Latency target on the share rule (a bigger share was the cheaper next unit) in this share of \
                 each model's replica decisions; otherwise on the replica count: {}.",
                owners.join(", ")
            );
        }
        let _ = writeln!(o, "{}", self.where_memory_goes(t));
        // What held each model's count (`core::scale::constraint`), its two most frequent, as a status would say
        // it each round.
        let held = per_model(&t.models, |m| m.held_by_ranked(2));
        if !held.is_empty() {
            let _ = writeln!(
                o,
                "What held each model's replica count (status.constraint; the two most frequent, share of its \
                 decisions): {}.",
                held.join(", ")
            );
        }
        let next = per_model(&t.models, |m| m.next_unit.clone());
        if !next.is_empty() {
            let _ = writeln!(
                o,
                "What the next unit of latency capacity costs, at each model's last decision (fractions of a \
                 GPU): {}.",
                next.join("; ")
            );
        }
        let prefill = per_model_percent(&t.models, |m| m.prefill_bound.filter(|f| *f > 0.0));
        if !prefill.is_empty() {
            let _ = writeln!(
                o,
                "TTFT target over with no request waiting (the time was prefill, which another replica shortens \
                 only by splitting bursts) in this share of each model's replica decisions: {}.",
                prefill.join(", ")
            );
        }
        let behind = per_model_percent(&t.models, |m| m.behind_while_urgent.filter(|f| *f > 0.0));
        if !behind.is_empty() {
            let _ = writeln!(
                o,
                "Running replicas held less than the allocation in force while it was urgent (a replica over the \
                 TTFT objective, or vLLM preempting), in this share of each model's decisions — what \
                 updateMode {} {}: {}.",
                self.update_mode.label(),
                match self.update_mode {
                    UpdateMode::Recreate => "rolls at once, once nothing holds the roll",
                    UpdateMode::Initial => "leaves running (Recreate would roll them at once)",
                },
                behind.join(", ")
            );
        }
    }

    /// Each model's workload class at the end of Tessera's run, where it came from, and which knobs its
    /// defaults set (`core::class`, the round's first step, as the controller runs it).
    pub fn class_note(t: &StrategyReport) -> Option<String> {
        let classes = per_model(&t.models, |m| {
            m.workload_class.as_ref().map(|c| {
                let from = if c.policy_from_class.is_empty() {
                    "no knob from the class".to_owned()
                } else {
                    format!("from the class: {}", c.policy_from_class.join(", "))
                };
                format!("{} ({}: {}; {from})", c.class, c.source, c.reason)
            })
        });
        (!classes.is_empty()).then(|| {
            format!(
                "Workload class (core::class, as status.workloadClass; the class's defaults fill the knobs a model \
                 leaves unset): {}.",
                classes.join("; ")
            )
        })
    }

    /// Why a strategy's compute shares add up to more than the GPUs it held, when one's do: under MPS a share is
    /// a cap that reserves nothing, and the pool hands out up to `compute_oversubscription` GPUs' worth per GPU.
    pub fn compute_shares_note(&self) -> Option<String> {
        let over: Vec<String> = self
            .strategies
            .iter()
            .filter(|s| s.compute_allocated_ratio > 1.0 + 1e-9)
            .map(|s| format!("{} {:.0}%", s.strategy, s.compute_allocated_ratio * 100.0))
            .collect();
        if over.is_empty() {
            return None;
        }
        Some(format!(
            "(¹) compute shares held over the GPUs held, starting and idle replicas included: {}. Over 100% because \
             under `{}` a share is a cap on the SMs a replica may use (MPS's active-thread percentage), not a \
             reservation, and the pool hands out up to {}× a GPU's worth of caps per GPU \
             (computeOversubscription); how busy the GPUs were is the \"GPU compute busy\" row.",
            over.join(", "),
            self.sharing_model,
            self.compute_oversubscription
        ))
    }

    /// What sleep mode did for the scenario's sleep-mode models, against the same run without it; `None` without
    /// such a model.
    pub fn sleep_mode_note(&self) -> Option<String> {
        if self.sleep_mode_models.is_empty() {
            return None;
        }
        let mut note = format!(
            "Sleep mode ({}): at zero, Tessera puts a model's last replica to sleep where its wake meets the TTFT \
             objective that a cold start would miss (core::sleep::rule); {}, and wakes there if its share fits \
             again",
            self.sleep_mode_models.join(", "),
            if self.lend_sleepers {
                "a sleeping pod keeps its residue on its GPU and lends the rest of its share only where the \
                 alternative is opening a GPU (lend_sleepers on)"
            } else {
                "a sleeping pod keeps its whole share on its GPU (the chart's default; `--lend-sleepers` lends the \
                 room beyond its residue, as gpuPools.lendSleepers does)"
            }
        );
        if let Some(t) = self.strategy("tessera") {
            let _ = write!(
                note,
                ": {} wake(s), {} sleeping pod(s) lost (a GPU given back, memory lent out, the \
                                  sleeper budget)",
                t.sleep_wakes, t.sleepers_lost
            );
        }
        if let Some(o) = self.tessera_without_sleep {
            let _ = write!(
                note,
                ". Without sleep mode Tessera would hold {:.2} GPU-hours and meet the TTFT SLO for {:.2}% of requests",
                o.gpu_hours,
                o.slo_attainment * 100.0
            );
            if let Some(t) = self.strategy("tessera").filter(|_| o.gpu_hours > 0.0) {
                let _ = write!(
                    note,
                    " (sleep mode: {:+.1}% GPU-hours)",
                    (t.gpu_hours / o.gpu_hours - 1.0) * 100.0
                );
            }
        }
        note.push('.');
        Some(note)
    }

    /// Where a strategy's GPU-hours go: the memory each model's replicas reserved, beside what its requests force
    /// (the first bound's share, `forced_memory_gpu_hours`), and what was held with no replica's memory in it
    /// (packing, whole GPUs, the empty-GPU grace). The gap to the bound, model by model.
    pub fn where_memory_goes(&self, s: &StrategyReport) -> String {
        // A report read from an older file has no forced figures: none is shown rather than a zero.
        let models: Vec<String> = s
            .models
            .iter()
            .enumerate()
            .map(|(i, m)| match self.forced_memory_gpu_hours.get(i) {
                Some(forced) => format!("{} {:.2} ({forced:.2})", m.model, m.memory_gpu_hours),
                None => format!("{} {:.2}", m.model, m.memory_gpu_hours),
            })
            .collect();
        let reserved: f64 = s.models.iter().map(|m| m.memory_gpu_hours).sum();
        format!(
            "Where {}'s {:.2} GPU-hours go (the GPU memory each model's replicas reserved, in GPU-hours; in brackets \
             what its requests force, its share of the first bound before whole GPUs): {}; held with no replica's \
             memory in it (packing, whole GPUs, the empty-GPU grace): {:.2}.",
            s.strategy,
            s.gpu_hours,
            models.join(", "),
            (s.gpu_hours - reserved).max(0.0)
        )
    }

    /// `gpu_hours_static=<a> gpu_hours_hpa=<b> gpu_hours_tessera=<c> slo_attainment_tessera=<d>`.
    pub fn summary_line(&self) -> String {
        let mut out = format!(
            "gpu_hours_lower_bound={:.3} gpu_hours_lower_bound_cold_starts={:.3} gpu_hours_lower_bound_at_goal={:.3}",
            self.lower_bound_gpu_hours,
            self.lower_bound_with_cold_starts_gpu_hours,
            self.lower_bound_at_goal_gpu_hours
        );
        for s in &self.strategies {
            let _ = write!(
                out,
                " gpu_hours_{}={:.3}",
                s.strategy.replace('-', "_"),
                s.gpu_hours
            );
        }
        for s in &self.strategies {
            let _ = write!(
                out,
                " slo_attainment_{}={:.4}",
                s.strategy.replace('-', "_"),
                s.slo_attainment
            );
        }
        for b in self.batch.iter().flat_map(|b| &b.rows) {
            let way = b.way.replace('-', "_");
            let _ = write!(
                out,
                " batch_cost_{way}={:.2} batch_total_gpu_hours_{way}={:.3} batch_misses_{way}={} batch_attainment_{way}={:.4}",
                b.cost,
                b.gpu_hours(),
                b.deadline_misses,
                b.interactive_attainment
            );
        }
        out
    }

    /// The result as a Markdown table, one column per strategy (docs/simulator.md is generated from it).
    pub fn markdown(&self) -> String {
        let mut o = String::new();
        let total: u64 = self.requests_per_model.iter().sum();
        let _ = writeln!(
            o,
            "Scenario `{}`: {} models on {}, {:.0} min, {} requests, seed {}, sharing model `{}`, Tessera's compute \
             oversubscription {}×, updateMode `{}`. Lower bound for a policy meeting every TTFT objective: **{:.2} GPU-hours** \
             ({:.2} through its cold starts, {:.2} for one meeting it for {:.0}% of requests).",
            self.scenario,
            self.models.len(),
            self.gpu,
            self.duration_secs / 60.0,
            total,
            self.seed,
            self.sharing_model,
            self.compute_oversubscription,
            self.update_mode.label(),
            self.lower_bound_gpu_hours,
            self.lower_bound_with_cold_starts_gpu_hours,
            self.lower_bound_at_goal_gpu_hours,
            self.attainment_goal * 100.0
        );
        let _ = writeln!(o);
        markdown_header(&mut o, self.strategies.iter().map(|s| s.strategy.as_str()), "---");
        let row = |o: &mut String, label: &str, f: &dyn Fn(&StrategyReport) -> String| {
            let _ = write!(o, "| {label} |");
            for s in &self.strategies {
                let _ = write!(o, " {} |", f(s));
            }
            let _ = writeln!(o);
        };
        row(&mut o, "GPU-hours", &|s| format!("{:.2}", s.gpu_hours));
        row(&mut o, "× lower bound", &|s| {
            times(s.gpu_hours, self.lower_bound_gpu_hours)
        });
        row(&mut o, "× bound at goal", &|s| {
            times(s.gpu_hours, self.lower_bound_at_goal_gpu_hours)
        });
        row(&mut o, "GPUs held, mean / peak", &|s| {
            format!("{:.1} / {}", s.gpus_mean, s.gpus_peak)
        });
        row(&mut o, "GPU memory used / reserved", &|s| {
            format!(
                "{:.1}% / {:.1}%",
                s.memory_used_ratio * 100.0,
                s.memory_reserved_ratio * 100.0
            )
        });
        row(&mut o, "GPU compute busy", &|s| {
            format!("{:.1}%", s.compute_ratio * 100.0)
        });
        row(&mut o, "TTFT p50 / p95 / p99", &|s| {
            format!(
                "{} / {} / {}",
                secs(s.ttft_p50),
                secs(s.ttft_p95),
                secs(s.ttft_p99)
            )
        });
        row(&mut o, "TTFT SLO attainment", &|s| {
            format!("{:.2}%", s.slo_attainment * 100.0)
        });
        row(&mut o, "cold starts (from zero)", &|s| {
            format!("{} ({})", s.cold_starts, s.starts_from_zero)
        });
        row(&mut o, "held requests, mean / max hold", &|s| {
            format!(
                "{}, {:.1} / {:.1} s",
                s.held_requests, s.held_mean_secs, s.held_max_secs
            )
        });
        row(&mut o, "preemptions, failed", &|s| {
            format!("{}, {}", s.preemptions, s.failed)
        });
        row(&mut o, "GPUs drained (emptied), replicas moved", &|s| {
            s.consolidation.map_or_else(
                || "—".to_owned(),
                |c| format!("{} ({}), {}", c.drains, c.drained, c.moves),
            )
        });
        if let Some(b) = &self.batch {
            let _ = write!(o, "\n```text\n{}```\n", b.table());
        }
        o
    }
}

/// `gpu_hours` as a multiple of `bound`, `2.34×`; a dash when the bound is zero (nothing forced).
pub(super) fn times(gpu_hours: f64, bound: f64) -> String {
    if bound > 0.0 {
        format!("{:.2}×", gpu_hours / bound)
    } else {
        "—".to_string()
    }
}

/// `model NN%` for each model where `share` (0–1) has a value.
fn per_model_percent(models: &[ModelReport], share: impl Fn(&ModelReport) -> Option<f64>) -> Vec<String> {
    per_model(models, |m| share(m).map(|f| format!("{:.0}%", f * 100.0)))
}

/// `model what` for each model where `what` says something.
fn per_model(models: &[ModelReport], what: impl Fn(&ModelReport) -> Option<String>) -> Vec<String> {
    models
        .iter()
        .filter_map(|m| Some(format!("{} {}", m.model, what(m)?)))
        .collect()
}

/// The head of a Markdown table with one column per strategy (`names`) after a label column, each cell aligned
/// by `align` (`---`, `---:`).
pub(crate) fn markdown_header<'a>(o: &mut String, names: impl Iterator<Item = &'a str> + Clone, align: &str) {
    let _ = write!(o, "| |");
    for n in names.clone() {
        let _ = write!(o, " {n} |");
    }
    let _ = writeln!(o);
    let _ = write!(o, "|---|");
    for _ in names {
        let _ = write!(o, "{align}|");
    }
    let _ = writeln!(o);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile_sorted(&v, 0.5), Some(2.0));
        assert_eq!(quantile_sorted(&v, 0.95), Some(4.0));
        assert_eq!(quantile_sorted(&v, 0.0), Some(1.0));
        assert_eq!(quantile_sorted(&[], 0.5), None);
    }
}
