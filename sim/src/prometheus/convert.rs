//! From what Prometheus holds to a scenario: pure functions over plain series, no I/O.
//!
//! Requests per step come from vLLM's cumulative request counter, one series per pod (and engine), differenced
//! step by step here rather than with PromQL's `increase()`, which extrapolates to the window's edges and would add
//! requests that never came. A counter that goes down restarted (a new process starts from 0); a series that
//! appears inside the window is a new pod whose first value counts; a gap in the scrapes spreads its delta over the
//! steps it covers. Everything else (token histograms, latency quantiles, gauges) is one number or one histogram per
//! model over the whole window. Memory is bounded by series × steps, never by requests.

use std::collections::BTreeMap;
use std::time::Duration;

use super::client::Series;
use super::error::PromError;
use crate::model::ModelSpec;
use crate::simulate::scenario::{
    ColdStartFile, ComputeFraction, HamiFile, ModelFile, ScenarioFile, StrategySettings, TargetsFile,
    TraceKind, TrafficFile,
};
use crate::simulate::today::TodayFile;
use crate::trace::observed::{ObservedTraffic, StepCounts, TokenHistogram};

/// The query grid: points at `start + k × step` for `k` in `0..=steps`; step `k` covers `(t_k, t_k+1]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grid {
    /// Unix seconds of the first point.
    pub start: f64,
    /// Seconds between points.
    pub step: f64,
    /// Steps (points − 1).
    pub steps: usize,
}

impl Grid {
    /// The grid over `[end − span, end]`, whole steps (the span is cut down to a whole number of steps).
    pub fn ending_at(end: f64, span: f64, step: f64) -> Grid {
        let steps = ((span / step).floor() as usize).max(1);
        Grid {
            start: end - steps as f64 * step,
            step,
            steps,
        }
    }

    /// Unix seconds of the last point.
    pub fn end(&self) -> f64 {
        self.start + self.steps as f64 * self.step
    }

    /// The point a timestamp falls on, if on the grid.
    pub fn index(&self, t: f64) -> Option<usize> {
        let k = ((t - self.start) / self.step).round();
        (k >= 0.0 && k <= self.steps as f64).then_some(k as usize)
    }
}

/// Requests finished per step from raw cumulative counters (any number of series of one model).
pub fn counts_per_step(series: &[&Series], grid: &Grid) -> Vec<f64> {
    let mut counts = vec![0.0; grid.steps];
    for s in series {
        let mut prev: Option<(usize, f64)> = None;
        for &(t, v) in &s.points {
            let Some(k) = grid.index(t) else { continue };
            if !v.is_finite() || v < 0.0 {
                continue;
            }
            match prev {
                // Born inside the window: a new process's counter started at 0 after the previous point.
                None if k > 0 => counts[k - 1] += v,
                None => {}
                Some((pk, pv)) if k > pk => {
                    let delta = if v >= pv { v - pv } else { v };
                    let n = (k - pk) as f64;
                    for c in &mut counts[pk..k] {
                        *c += delta / n;
                    }
                }
                Some(_) => continue,
            }
            prev = Some((k, v));
        }
    }
    counts
}

/// Whole counts that keep the running total: each step gets what its share brings the rounded total to.
pub fn whole_counts(counts: &[f64]) -> Vec<u32> {
    let mut acc = 0.0;
    let mut emitted = 0.0;
    counts
        .iter()
        .map(|c| {
            acc += c;
            let n = (acc.round() - emitted).max(0.0);
            emitted += n;
            n.min(f64::from(u32::MAX)) as u32
        })
        .collect()
}

/// A gauge's values on the grid's points `1..=steps` (a missing point is 0: nothing was there).
pub fn on_grid(series: Option<&Series>, grid: &Grid) -> Vec<f64> {
    let mut out = vec![0.0; grid.steps + 1];
    if let Some(s) = series {
        for &(t, v) in &s.points {
            if let Some(k) = grid.index(t)
                && v.is_finite()
            {
                out[k] = v;
            }
        }
    }
    out
}

/// The performance-model preset a served model name most likely is (`Qwen/Qwen2-7B-Instruct` → `qwen2-7b`).
pub fn guess_preset(model_name: &str) -> Option<&'static str> {
    let n = model_name
        .rsplit('/')
        .next()
        .unwrap_or(model_name)
        .to_ascii_lowercase()
        .replace('_', "-");
    // Longest first, so `llama-3.1-70b` is not taken for a shorter name it contains.
    let mut presets: Vec<&'static str> = ModelSpec::PRESETS.to_vec();
    presets.sort_by_key(|p| std::cmp::Reverse(p.len()));
    presets.into_iter().find(|p| n.contains(p))
}

/// The GPU preset a DCGM `modelName` is (`NVIDIA A100-SXM4-80GB` → `a100-80gb`).
pub fn gpu_preset(dcgm_model: &str) -> Option<&'static str> {
    let m = dcgm_model.to_ascii_uppercase();
    if m.contains("H100") {
        Some("h100-80gb")
    } else if m.contains("A100") && m.contains("40GB") {
        Some("a100-40gb")
    } else if m.contains("A100") {
        Some("a100-80gb")
    } else if m.contains(" L4") || m.ends_with("L4") {
        Some("l4")
    } else {
        None
    }
}

/// What was read for one model.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelObservation {
    /// `model_name`.
    pub name: String,
    /// Requests finished per step.
    pub finished: Vec<f64>,
    /// Replicas at each grid point (`0..=steps`).
    pub replicas: Vec<f64>,
    /// Prompt lengths.
    pub prompt_tokens: Option<TokenHistogram>,
    /// Output lengths.
    pub output_tokens: Option<TokenHistogram>,
    /// Mean end-to-end latency, seconds.
    pub e2e_mean: Option<f64>,
    /// TTFT p95, seconds.
    pub ttft_p95: Option<f64>,
    /// Inter-token latency p95, seconds.
    pub itl_p95: Option<f64>,
    /// Highest KV usage.
    pub kv_max: Option<f64>,
    /// Most running on one replica.
    pub running_max: Option<f64>,
    /// Most waiting on one replica.
    pub waiting_max: Option<f64>,
}

/// The choices metrics cannot make.
#[derive(Debug, Clone, PartialEq)]
pub struct ConvertOptions {
    /// Scenario name.
    pub name: String,
    /// Where it came from (URL, window), for the description.
    pub source: String,
    /// GPU preset.
    pub gpu: String,
    /// Why that GPU (read from DCGM, given, or assumed).
    pub gpu_reason: String,
    /// TTFT objective for every model.
    pub slo_ttft: Duration,
    /// Tessera's idle time before zero.
    pub scale_to_zero_after: Duration,
    /// Presets by model name, given by the user.
    pub presets: BTreeMap<String, String>,
    /// `--max-model-len` for every model, when given.
    pub max_model_len: Option<u32>,
    /// Seed.
    pub seed: u64,
}

/// The scenario file and the assumptions it was written under (one line each, for the file and the report).
pub fn scenario(
    obs: &[ModelObservation],
    grid: &Grid,
    opts: &ConvertOptions,
) -> Result<(ScenarioFile, Vec<String>), PromError> {
    let step = Duration::from_secs_f64(grid.step);
    let mut assumptions = vec![
        format!(
            "arrivals: Prometheus counts requests per {} step; within a step they are spread uniformly at random \
             (bursts shorter than a step are smoothed)",
            humantime::format_duration(step)
        ),
        "arrival time: vLLM counts a request when it finishes; each is moved earlier by the model's mean \
         end-to-end latency"
            .to_string(),
        "token lengths: drawn from vLLM's prompt and generation histograms, uniform within a bucket, scaled to the \
         exact means; a request's prompt and output lengths are drawn independently"
            .to_string(),
        "today: every replica (pod exporting vllm:num_requests_running) holds one whole GPU; tensor parallelism is \
         not in the metrics"
            .to_string(),
        format!(
            "TTFT objective {} for every model, and Tessera may scale a model to zero after {} idle (--slo-ttft, \
             --scale-to-zero-after; edit the file per model)",
            humantime::format_duration(opts.slo_ttft),
            humantime::format_duration(opts.scale_to_zero_after)
        ),
        format!("GPU: {} ({})", opts.gpu, opts.gpu_reason),
    ];
    let mut models = Vec::new();
    for o in obs {
        let requests = whole_counts(&o.finished);
        let total: u64 = requests.iter().map(|&n| u64::from(n)).sum();
        let hist = |h: &Option<TokenHistogram>, metric: &str| -> Result<TokenHistogram, PromError> {
            match h {
                Some(h) if h.total() > 0.0 && h.mean > 0.0 => Ok(h.clone()),
                _ if total == 0 => Ok(TokenHistogram {
                    mean: 1.0,
                    buckets: vec![crate::trace::observed::Bucket {
                        le: f64::INFINITY,
                        count: 0.0,
                    }],
                }),
                _ => Err(PromError::MissingMetric {
                    model: o.name.clone(),
                    metric: metric.to_string(),
                    why: "the prompt and output lengths of its requests cannot be known".to_string(),
                    extra: String::new(),
                }),
            }
        };
        let prompt_tokens = hist(&o.prompt_tokens, "vllm:request_prompt_tokens_bucket/_sum/_count")?;
        let output_tokens = hist(
            &o.output_tokens,
            "vllm:request_generation_tokens_bucket/_sum/_count",
        )?;
        let preset = match opts.presets.get(&o.name) {
            Some(p) => p.clone(),
            None => match guess_preset(&o.name) {
                Some(p) => p.to_string(),
                None => {
                    assumptions.push(format!(
                        "model {}: its architecture is not in the metrics and its name matches no preset: assumed \
                         llama-3.1-8b (set --model-preset {}=PRESET; presets: {})",
                        o.name,
                        o.name,
                        ModelSpec::PRESETS.join(", ")
                    ));
                    "llama-3.1-8b".to_string()
                }
            },
        };
        let points = &o.replicas[1.min(o.replicas.len())..];
        let replica_hours: f64 = points.iter().sum::<f64>() * grid.step / 3600.0;
        let replicas_max = points.iter().copied().fold(0.0, f64::max).round() as u32;
        let replicas_mean = if points.is_empty() {
            0.0
        } else {
            points.iter().sum::<f64>() / points.len() as f64
        };
        let secs = |s: Option<f64>| {
            s.filter(|x| x.is_finite() && *x >= 0.0)
                .map(Duration::from_secs_f64)
        };
        let slo = opts.slo_ttft;
        models.push(ModelFile {
            name: o.name.clone(),
            preset: Some(preset),
            spec: None,
            max_model_len: opts.max_model_len,
            slo_ttft: slo,
            slo_itl: None,
            ttft_slo_percentile: None,
            min_replicas: 0,
            max_replicas: (replicas_max * 2).max(4),
            targets: TargetsFile {
                kv_cache_utilization: Some(0.7),
                waiting_requests_per_replica: Some(2.0),
                ttft_p95: Some(slo / 2),
                requests_per_second_per_replica: None,
            },
            // What one whole A100 sustains for an 8B chat model, as in the default scenario; edit per model.
            hpa_requests_per_second_per_replica: 5.0,
            scale_to_zero_after: Some(opts.scale_to_zero_after),
            cold_start_miss_budget: None,
            cold_start_budget_group: None,
            cold_start: ColdStartFile::default(),
            compute_fraction: ComputeFraction::Auto,
            traffic: TrafficFile {
                trace: TraceKind::Observed,
                file: None,
                model: None,
                function: None,
                tokens_from: None,
                rate: 1.0,
                shift: Duration::ZERO,
                window_start: Duration::ZERO,
                window: None,
                observed: Some(ObservedTraffic {
                    step,
                    requests: StepCounts(requests),
                    // Milliseconds are all this shift can claim (a mean over the window), and all a reader needs.
                    finish_to_arrival: secs(o.e2e_mean.map(|x| (x * 1000.0).round() / 1000.0))
                        .unwrap_or_default(),
                    prompt_tokens,
                    output_tokens,
                }),
            },
            hami: HamiFile::default(),
            today: Some(TodayFile {
                gpu_hours: replica_hours,
                replicas_mean,
                replicas_max,
                gpus_per_replica: 1.0,
                ttft_p95: secs(o.ttft_p95),
                itl_p95: secs(o.itl_p95),
                kv_cache_usage_max: o.kv_max.filter(|x| x.is_finite()),
                running_max: o.running_max.filter(|x| x.is_finite()),
                waiting_max: o.waiting_max.filter(|x| x.is_finite()),
            }),
            inference_autoscaler: None,
        });
    }
    let file = ScenarioFile {
        name: opts.name.clone(),
        description: format!(
            "Observed by Prometheus: {}. What metrics cannot say, and what was assumed: {}.",
            opts.source,
            assumptions.join("; ")
        ),
        seed: opts.seed,
        duration: Duration::from_secs_f64(grid.step * grid.steps as f64),
        gpu: opts.gpu.clone(),
        strategies: StrategySettings::default(),
        models,
        batch: None,
    };
    Ok((file, assumptions))
}

/// The scenario as YAML a person reads: a header of what it is and what was assumed, then the file with its
/// unset optional fields left out.
pub fn to_yaml(file: &ScenarioFile, assumptions: &[String]) -> Result<String, serde_yaml::Error> {
    let body = serde_yaml::to_string(file)?;
    let mut out = String::from(
        "# Written by `tessera simulate --prometheus`: the traffic Prometheus saw, as a scenario.\n\
         # Edit it (objectives, presets, scale-to-zero, traffic.rate) and run it again: tessera simulate FILE\n\
         # What metrics cannot say, and what was assumed:\n",
    );
    for a in assumptions {
        out.push_str("#   - ");
        out.push_str(a);
        out.push('\n');
    }
    // Every optional field has a serde default: a `null` says nothing a reader needs.
    for line in body.lines() {
        if line.trim_end().ends_with(": null") && !line.trim_start().starts_with("- ") {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn series(points: &[(f64, f64)]) -> Series {
        Series {
            labels: BTreeMap::new(),
            points: points.to_vec(),
        }
    }

    #[test]
    fn counters_difference_per_step_through_resets_births_and_gaps() {
        let grid = Grid {
            start: 100.0,
            step: 10.0,
            steps: 4,
        };
        // Running from before the window: 5, 7, then a restart (3), then 4.
        let a = series(&[
            (100.0, 5.0),
            (110.0, 7.0),
            (120.0, 3.0),
            (130.0, 4.0),
            (140.0, 4.0),
        ]);
        // Born at 120 with 2 done; a gap over 130; 8 at 140.
        let b = series(&[(120.0, 2.0), (140.0, 8.0)]);
        let c = counts_per_step(&[&a, &b], &grid);
        assert_eq!(c, vec![2.0, 3.0 + 2.0, 1.0 + 3.0, 0.0 + 3.0]);
        assert_eq!(whole_counts(&[0.4, 0.4, 0.4, 1.8]), vec![0, 1, 0, 2]);
    }

    #[test]
    fn names_become_presets_and_dcgm_names_gpus() {
        assert_eq!(guess_preset("Qwen/Qwen2-7B-Instruct"), Some("qwen2-7b"));
        assert_eq!(
            guess_preset("/models/Meta-Llama-3.1-70B-Instruct"),
            Some("llama-3.1-70b")
        );
        assert_eq!(guess_preset("support-chat"), None);
        assert_eq!(gpu_preset("NVIDIA A100-SXM4-80GB"), Some("a100-80gb"));
        assert_eq!(gpu_preset("NVIDIA A100-PCIE-40GB"), Some("a100-40gb"));
        assert_eq!(gpu_preset("NVIDIA H100 80GB HBM3"), Some("h100-80gb"));
        assert_eq!(gpu_preset("NVIDIA L4"), Some("l4"));
        assert_eq!(gpu_preset("Tesla T4"), None);
    }

    fn opts() -> ConvertOptions {
        ConvertOptions {
            name: "observed".into(),
            source: "http://p:9090".into(),
            gpu: "a100-80gb".into(),
            gpu_reason: "given".into(),
            slo_ttft: Duration::from_secs(2),
            scale_to_zero_after: Duration::from_secs(600),
            presets: BTreeMap::new(),
            max_model_len: None,
            seed: 1,
        }
    }

    #[test]
    fn a_model_with_requests_but_no_token_histogram_is_an_error_not_a_guess() {
        let grid = Grid {
            start: 0.0,
            step: 60.0,
            steps: 2,
        };
        let o = ModelObservation {
            name: "chat".into(),
            finished: vec![3.0, 4.0],
            replicas: vec![1.0, 1.0, 1.0],
            ..Default::default()
        };
        let err = scenario(&[o], &grid, &opts()).unwrap_err().to_string();
        assert!(
            err.contains("model chat") && err.contains("vllm:request_prompt_tokens"),
            "{err}"
        );
    }

    #[test]
    fn the_written_file_reads_back_and_runs() {
        let grid = Grid {
            start: 0.0,
            step: 60.0,
            steps: 10,
        };
        let h =
            TokenHistogram::from_cumulative(vec![(500.0, 5.0), (1000.0, 10.0), (f64::INFINITY, 10.0)], 600.0);
        let o = ModelObservation {
            name: "Qwen/Qwen2-7B-Instruct".into(),
            finished: vec![10.0; 10],
            replicas: vec![2.0; 11],
            prompt_tokens: Some(h.clone()),
            output_tokens: Some(h),
            e2e_mean: Some(3.0),
            ..Default::default()
        };
        let idle = ModelObservation {
            name: "tools".into(),
            finished: vec![0.0; 10],
            replicas: vec![1.0; 11],
            ..Default::default()
        };
        let (file, assumptions) = scenario(&[o, idle], &grid, &opts()).unwrap();
        let today = file.models[0].today.as_ref().unwrap();
        assert!((today.gpu_hours - 2.0 * 600.0 / 3600.0).abs() < 1e-9);
        assert_eq!(file.models[0].preset.as_deref(), Some("qwen2-7b"));
        let yaml = to_yaml(&file, &assumptions).unwrap();
        assert!(yaml.contains("assumed llama-3.1-8b"), "{yaml}");
        let back = ScenarioFile::parse(&yaml, "observed.yaml").unwrap();
        assert_eq!(back, file);
        let sc = crate::simulate::scenario::resolve(&back, "observed.yaml", None).unwrap();
        assert_eq!(sc.arrivals[0].len(), 100);
        assert!(sc.arrivals[1].is_empty());
    }
}
