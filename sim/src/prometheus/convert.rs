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

/// The step a time falls in (step `k` holds `(t_k, t_k+1]`), clamped to the grid: before it is the first step,
/// after it the last.
fn step_of(grid: &Grid, t: f64) -> usize {
    let k = ((t - grid.start) / grid.step).ceil() - 1.0;
    k.clamp(0.0, (grid.steps - 1) as f64) as usize
}

/// Adds `amount` spread evenly over `(lo, hi]` to the steps it overlaps (all of it to `hi`'s step when empty).
fn spread(counts: &mut [f64], grid: &Grid, lo: f64, hi: f64, amount: f64) {
    if hi <= lo {
        counts[step_of(grid, hi)] += amount;
        return;
    }
    let (first, last) = (step_of(grid, lo), step_of(grid, hi));
    for (k, c) in counts.iter_mut().enumerate().take(last + 1).skip(first) {
        // What lies before the grid belongs to its first step, what lies after to its last.
        let from = if k == first {
            lo
        } else {
            grid.start + k as f64 * grid.step
        };
        let to = if k == last {
            hi
        } else {
            grid.start + (k + 1) as f64 * grid.step
        };
        *c += amount * (to - from).max(0.0) / (hi - lo);
    }
}

/// Counts per step from raw cumulative counters, each counter's growth placed between the scrapes that saw it.
///
/// `stamps` holds, for a counter series with the same labels (`__name__` aside), the time of the scrape each grid
/// point read (PromQL `timestamp(…)`). A range query answers at each grid point with the last sample at or before
/// it, up to a scrape interval old and with a phase of its own per target: without the scrape times a step of the
/// order of the scrape interval puts a target's requests one step late (measured at 1 s steps on a 1 s scrape:
/// one model's arrivals were one step late throughout). A series without stamps uses the grid points.
///
/// A counter that goes down restarted (a new process starts from 0); a series that appears inside the window is a
/// new pod whose first value counts; a gap in the scrapes spreads its growth over the time it covers.
pub fn counts_per_step(series: &[&Series], stamps: &[&Series], grid: &Grid) -> Vec<f64> {
    let mut counts = vec![0.0; grid.steps];
    if grid.steps == 0 {
        return counts;
    }
    let unnamed = |s: &Series| {
        let mut l = s.labels.clone();
        l.remove("__name__");
        l
    };
    for s in series {
        let own = unnamed(s);
        let scraped: BTreeMap<usize, f64> = stamps
            .iter()
            .find(|st| unnamed(st) == own)
            .map(|st| {
                st.points
                    .iter()
                    .filter(|(_, v)| v.is_finite())
                    .filter_map(|&(t, v)| Some((grid.index(t)?, v)))
                    .collect()
            })
            .unwrap_or_default();
        let mut prev: Option<(usize, f64, f64)> = None;
        for &(t, v) in &s.points {
            let Some(k) = grid.index(t) else { continue };
            if !v.is_finite() || v < 0.0 {
                continue;
            }
            // When this value was read: its scrape, never after the grid point that returned it.
            let at = scraped.get(&k).map_or(t, |&st| st.min(t));
            match prev {
                // Born inside the window: a new process's counter started at 0 after the previous point.
                None if k > 0 => counts[step_of(grid, at)] += v,
                None => {}
                // The same scrape read again (steps shorter than the scrape interval): nothing new.
                Some((pk, pat, _)) if k > pk && at <= pat => continue,
                Some((pk, pat, pv)) if k > pk => {
                    let delta = if v >= pv { v - pv } else { v };
                    spread(&mut counts, grid, pat, at, delta);
                }
                Some(_) => continue,
            }
            prev = Some((k, at, v));
        }
    }
    counts
}

/// Points a token histogram is read on: enough to see a restart between two of them, few enough that a week of
/// one model's buckets on every pod stays a small answer.
pub const HISTOGRAM_POINTS: usize = 64;

/// The coarser grid token histograms are read on: the window of `grid`, at most [`HISTOGRAM_POINTS`] steps.
pub fn histogram_grid(grid: &Grid) -> Grid {
    let steps = grid.steps.clamp(1, HISTOGRAM_POINTS);
    Grid {
        start: grid.start,
        step: (grid.end() - grid.start) / steps as f64,
        steps,
    }
}

/// One model's token histogram over the window, from vLLM's raw cumulative series (one per pod, and per bucket
/// for `_bucket`), each differenced like [`counts_per_step`] and totalled.
///
/// Why not `increase()` over the window: it drops what the first sample already holds and extrapolates the rest
/// to the window's edges by a factor of each series' own, so buckets come out fractional and their shares off by
/// the requests near the edges (measured: 0.15 point of one bucket in 380 requests on a slow machine). Counted
/// here, each bucket holds the requests whose lengths were observed between the window's two edges, as whole
/// numbers, and the mean is their exact one. A restart between two points loses what the old process counted
/// since the earlier one. `None` when nothing was observed.
pub fn histogram_over(
    buckets: &[Series],
    sum: &[Series],
    count: &[Series],
    grid: &Grid,
) -> Option<TokenHistogram> {
    let total = |series: &[&Series]| counts_per_step(series, &[], grid).iter().sum::<f64>();
    let all = |list: &[Series]| total(&list.iter().collect::<Vec<_>>());
    let observed = all(count);
    if observed.is_nan() || observed <= 0.0 {
        return None;
    }
    let mut by_le: BTreeMap<String, Vec<&Series>> = BTreeMap::new();
    for s in buckets {
        by_le.entry(s.label("le").to_string()).or_default().push(s);
    }
    let cumulative = by_le
        .into_iter()
        .filter_map(|(le, series)| {
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse::<f64>().ok()?
            };
            (!le.is_nan()).then(|| (le, total(&series)))
        })
        .collect();
    Some(TokenHistogram::from_cumulative(cumulative, all(sum) / observed))
}

/// Requests that arrived per step, from the first-token counter: `first_tokens[k]` requests got their first token
/// in step `k` and waited `ttft_seconds[k]` for it in all (TTFT histogram's `_count` and `_sum`, differenced like
/// [`counts_per_step`]). Each step's requests are spread evenly over it and moved earlier by that step's own mean
/// TTFT, then split between the steps they land in; what lands before the window goes to its first step.
///
/// Why the first token and not the finish: vLLM observes TTFT when the first token comes out, a queue and one
/// prefill after the arrival, while a request finishes only after its whole output. Moving finishes back by the
/// mean end-to-end latency misplaces every request whose output is longer or shorter than the mean by the
/// difference (seconds for a chat model), and a step's own mean TTFT also follows a queue that builds in a burst.
pub fn arrivals_from_first_tokens(first_tokens: &[f64], ttft_seconds: &[f64], step: f64) -> Vec<f64> {
    let n = first_tokens.len();
    let mut out = vec![0.0; n];
    if n == 0 || !(step.is_finite() && step > 0.0) {
        return out;
    }
    for (k, &c) in first_tokens.iter().enumerate() {
        if !(c.is_finite() && c > 0.0) {
            continue;
        }
        let wait = ttft_seconds.get(k).map_or(0.0, |s| s / c);
        // Never before the window's start: what waited longer arrived before it and is counted in its first step.
        let wait = if wait.is_finite() {
            wait.clamp(0.0, k as f64 * step)
        } else {
            0.0
        };
        let lo = k as f64 * step - wait;
        let hi = lo + step;
        let mut j = (lo / step).floor() as usize;
        while j < n && (j as f64) * step < hi {
            let overlap = hi.min((j + 1) as f64 * step) - lo.max(j as f64 * step);
            if overlap > 0.0 {
                out[j] += c * overlap / step;
            }
            j += 1;
        }
    }
    out
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
    } else if m.contains("H200") {
        Some("h200")
    } else if m.contains("B200") {
        Some("b200")
    } else if m.contains("L40S") {
        Some("l40s")
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
    /// Requests finished per step (`vllm:e2e_request_latency_seconds_count`); arrivals come from it only when
    /// `first_tokens` is empty.
    pub finished: Vec<f64>,
    /// Requests that got their first token per step (`vllm:time_to_first_token_seconds_count`), empty when unknown.
    pub first_tokens: Vec<f64>,
    /// Seconds those requests waited for their first token, summed per step (`…_sum`), beside `first_tokens`.
    pub ttft_seconds: Vec<f64>,
    /// Replicas at each grid point (`0..=steps`).
    pub replicas: Vec<f64>,
    /// Prompt lengths.
    pub prompt_tokens: Option<TokenHistogram>,
    /// Output lengths.
    pub output_tokens: Option<TokenHistogram>,
    /// Mean end-to-end latency, seconds (how far finishes are moved back when `first_tokens` is empty).
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

/// Who observed the history a scenario is written from: what its arrivals, token lengths and today's replicas
/// were read from, so the assumptions a report lists describe the source it really had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observer {
    /// `tessera simulate --prometheus`: vLLM's counters and histograms, per query step.
    Prometheus,
    /// The autoscaler's `/ui` page history: per-minute rates and replica counts from the sidecars; no token
    /// histograms (the caller states the lengths it assumed).
    AutoscalerPage,
}

impl Observer {
    fn name(self) -> &'static str {
        match self {
            Self::Prometheus => "Prometheus",
            Self::AutoscalerPage => "this autoscaler's page",
        }
    }

    fn arrivals(self, step: Duration) -> String {
        let counted = match self {
            Self::Prometheus => "Prometheus counts requests",
            Self::AutoscalerPage => "the page keeps finished requests",
        };
        format!(
            "arrivals: {counted} per {} step; within a step they are spread uniformly at random (bursts shorter \
             than a step are smoothed)",
            humantime::format_duration(step)
        )
    }

    fn token_lengths(self) -> Option<&'static str> {
        match self {
            Self::Prometheus => Some(
                "token lengths: drawn from vLLM's prompt and generation histograms, uniform within a bucket, scaled \
                 to the exact means; a request's prompt and output lengths are drawn independently",
            ),
            Self::AutoscalerPage => None,
        }
    }

    fn today(self) -> &'static str {
        match self {
            Self::Prometheus => {
                "today: every replica (pod exporting vllm:num_requests_running) holds one whole GPU; tensor \
                 parallelism is not in the metrics"
            }
            Self::AutoscalerPage => {
                "today: every replica the page counted holds one whole GPU; tensor parallelism is not in the \
                 sidecars' documents"
            }
        }
    }
}

/// The choices metrics cannot make.
#[derive(Debug, Clone, PartialEq)]
pub struct ConvertOptions {
    /// Scenario name.
    pub name: String,
    /// Who observed the history (what the assumptions say it was read from).
    pub observer: Observer,
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
    let mut assumptions = common_assumptions(obs, grid, opts);
    let mut models = Vec::new();
    for o in obs {
        models.push(model_file(o, grid, opts, &mut assumptions)?);
    }
    let file = ScenarioFile {
        name: opts.name.clone(),
        description: format!(
            "Observed by {}: {}. What metrics cannot say, and what was assumed: {}.",
            opts.observer.name(),
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

/// What was assumed for every model alike; a model's own assumptions follow these.
fn common_assumptions(obs: &[ModelObservation], grid: &Grid, opts: &ConvertOptions) -> Vec<String> {
    let step = Duration::from_secs_f64(grid.step);
    let mut assumptions = vec![opts.observer.arrivals(step)];
    assumptions.extend(opts.observer.token_lengths().map(str::to_owned));
    assumptions.push(opts.observer.today().to_owned());
    assumptions.extend([
        format!(
            "TTFT objective {} for every model, and Tessera may scale a model to zero after {} idle (--slo-ttft, \
             --scale-to-zero-after; edit the file per model)",
            humantime::format_duration(opts.slo_ttft),
            humantime::format_duration(opts.scale_to_zero_after)
        ),
        format!("GPU: {} ({})", opts.gpu, opts.gpu_reason),
    ]);
    let by_first_token = obs.iter().any(|o| o.first_tokens.iter().sum::<f64>() > 0.0);
    assumptions.insert(
        1,
        if by_first_token {
            "arrival time: a request is counted when vLLM sends its first token (the TTFT histogram's count) and \
             moved earlier by the mean TTFT of the requests counted in the same step"
        } else {
            "arrival time: vLLM counts a request when it finishes; each is moved earlier by the model's mean \
             end-to-end latency"
        }
        .to_string(),
    );
    assumptions
}

/// One model of the scenario; the preset it was given when none could be told is added to `assumptions`.
fn model_file(
    o: &ModelObservation,
    grid: &Grid,
    opts: &ConvertOptions,
    assumptions: &mut Vec<String>,
) -> Result<ModelFile, PromError> {
    let step = Duration::from_secs_f64(grid.step);
    let from_first_tokens = o.first_tokens.iter().sum::<f64>() > 0.0;
    let requests = if from_first_tokens {
        whole_counts(&arrivals_from_first_tokens(
            &o.first_tokens,
            &o.ttft_seconds,
            grid.step,
        ))
    } else {
        whole_counts(&o.finished)
    };
    let total: u64 = requests.iter().map(|&n| u64::from(n)).sum();
    let prompt_tokens = token_histogram(
        o,
        &o.prompt_tokens,
        total,
        "vllm:request_prompt_tokens_bucket/_sum/_count",
    )?;
    let output_tokens = token_histogram(
        o,
        &o.output_tokens,
        total,
        "vllm:request_generation_tokens_bucket/_sum/_count",
    )?;
    let preset = preset_of(o, opts, assumptions);
    let slo = opts.slo_ttft;
    let today = today_file(o, grid);
    Ok(ModelFile {
        // The label as the scenario, the report and the terminal show it (a label value is anyone's text).
        name: super::error::printable(&o.name),
        preset: Some(preset),
        spec: None,
        max_model_len: opts.max_model_len,
        slo_ttft: slo,
        slo_itl: None,
        ttft_slo_percentile: None,
        min_replicas: 0,
        max_replicas: (today.replicas_max * 2).max(4),
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
        workload_class: tessera_api::crd::WorkloadClassSpec::Auto,
        traffic: TrafficFile {
            trace: TraceKind::Observed,
            synthetic: None,
            prompt_scale: None,
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
                // Counted at the first token, the counts are already arrivals. Counted at the finish, they move
                // back by the mean end-to-end latency: milliseconds are all a mean over the window can claim.
                finish_to_arrival: if from_first_tokens {
                    Duration::ZERO
                } else {
                    secs(o.e2e_mean.map(|x| (x * 1000.0).round() / 1000.0)).unwrap_or_default()
                },
                prompt_tokens,
                output_tokens,
            }),
        },
        hami: HamiFile::default(),
        today: Some(today),
        inference_autoscaler: None,
    })
}

/// A model's prompt or output lengths; a model that served no request gets a placeholder, since none is drawn.
fn token_histogram(
    o: &ModelObservation,
    h: &Option<TokenHistogram>,
    total: u64,
    metric: &str,
) -> Result<TokenHistogram, PromError> {
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
            model: super::error::printable(&o.name),
            metric: metric.to_string(),
            why: "the prompt and output lengths of its requests cannot be known".to_string(),
            extra: String::new(),
        }),
    }
}

/// The preset given for the model, else the one its name contains, else llama-3.1-8b with an assumption saying so.
fn preset_of(o: &ModelObservation, opts: &ConvertOptions, assumptions: &mut Vec<String>) -> String {
    match opts.presets.get(&o.name) {
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
    }
}

/// Today's setup as the metrics show it: replicas over the window (its first point left out) and the latencies and
/// gauges read.
fn today_file(o: &ModelObservation, grid: &Grid) -> TodayFile {
    let points = &o.replicas[1.min(o.replicas.len())..];
    let replica_hours: f64 = points.iter().sum::<f64>() * grid.step / 3600.0;
    let replicas_max = points.iter().copied().fold(0.0, f64::max).round() as u32;
    let replicas_mean = if points.is_empty() {
        0.0
    } else {
        points.iter().sum::<f64>() / points.len() as f64
    };
    TodayFile {
        gpu_hours: replica_hours,
        replicas_mean,
        replicas_max,
        gpus_per_replica: 1.0,
        ttft_p95: secs(o.ttft_p95),
        itl_p95: secs(o.itl_p95),
        kv_cache_usage_max: o.kv_max.filter(|x| x.is_finite()),
        running_max: o.running_max.filter(|x| x.is_finite()),
        waiting_max: o.waiting_max.filter(|x| x.is_finite()),
    }
}

/// Seconds as a duration, where they are a duration at all (a quantile over no requests is NaN).
fn secs(s: Option<f64>) -> Option<Duration> {
    s.filter(|x| x.is_finite() && *x >= 0.0)
        .map(Duration::from_secs_f64)
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
        let c = counts_per_step(&[&a, &b], &[], &grid);
        assert_eq!(c, vec![2.0, 3.0 + 2.0, 1.0 + 3.0, 0.0 + 3.0]);
        assert_eq!(whole_counts(&[0.4, 0.4, 0.4, 1.8]), vec![0, 1, 0, 2]);
    }

    #[test]
    fn histograms_count_whole_requests_between_the_edges_through_restarts_and_births() {
        let grid = Grid {
            start: 100.0,
            step: 10.0,
            steps: 2,
        };
        let on = |le: &str, points: &[(f64, f64)]| {
            let mut s = series(points);
            s.labels.insert("le".into(), le.into());
            s
        };
        // Pod a ran before the window (its 3 and 5 are not the window's), then restarted at 115; pod b was born
        // at 120 with one request already observed.
        let buckets = [
            on("100", &[(100.0, 3.0), (110.0, 4.0), (120.0, 1.0)]),
            on("+Inf", &[(100.0, 5.0), (110.0, 7.0), (120.0, 2.0)]),
            on("100", &[(120.0, 0.0)]),
            on("+Inf", &[(120.0, 1.0)]),
        ];
        let count = [
            series(&[(100.0, 5.0), (110.0, 7.0), (120.0, 2.0)]),
            series(&[(120.0, 1.0)]),
        ];
        let sum = [
            series(&[(100.0, 900.0), (110.0, 1_100.0), (120.0, 250.0)]),
            series(&[(120.0, 400.0)]),
        ];
        let h = histogram_over(&buckets, &sum, &count, &grid).unwrap();
        // In the window: 2 requests up to 100 tokens (one before the restart, one after) and 5 in all.
        let counts: Vec<(f64, f64)> = h.buckets.iter().map(|b| (b.le, b.count)).collect();
        assert_eq!(counts, vec![(100.0, 2.0), (f64::INFINITY, 3.0)]);
        assert_eq!(h.mean, (200.0 + 250.0 + 400.0) / 5.0);
        assert!(histogram_over(&buckets, &sum, &[series(&[(100.0, 5.0), (120.0, 5.0)])], &grid).is_none());
        // A week at 15 s steps is read on 64 points; a short window on its own.
        let week = Grid::ending_at(604_800.0, 604_800.0, 15.0);
        let h = histogram_grid(&week);
        assert_eq!(
            (h.steps, h.start, h.end()),
            (HISTOGRAM_POINTS, week.start, week.end())
        );
        assert_eq!(histogram_grid(&grid), grid);
    }

    #[test]
    fn scrape_times_place_a_counters_growth_where_it_happened() {
        let grid = Grid {
            start: 100.0,
            step: 1.0,
            steps: 4,
        };
        let labelled = |name: &str, points: &[(f64, f64)]| Series {
            labels: BTreeMap::from([
                ("__name__".to_string(), name.to_string()),
                ("instance".to_string(), "a".to_string()),
            ]),
            points: points.to_vec(),
        };
        // Scraped 0.9 s before each grid point: the request seen by the point at 102 came in (100.1, 101.1].
        let counter = labelled(
            "c",
            &[
                (100.0, 0.0),
                (101.0, 0.0),
                (102.0, 1.0),
                (103.0, 1.0),
                (104.0, 1.0),
            ],
        );
        let stamps = labelled(
            "",
            &[
                (100.0, 99.1),
                (101.0, 100.1),
                (102.0, 101.1),
                (103.0, 102.1),
                (104.0, 103.1),
            ],
        );
        let at_points = counts_per_step(&[&counter], &[], &grid);
        assert_eq!(
            at_points,
            vec![0.0, 1.0, 0.0, 0.0],
            "read at the grid points: a step late"
        );
        let scraped = counts_per_step(&[&counter], &[&stamps], &grid);
        assert!(
            (scraped[0] - 0.9).abs() < 1e-9 && (scraped[1] - 0.1).abs() < 1e-9,
            "{scraped:?}"
        );
        assert_eq!(whole_counts(&scraped), vec![1, 0, 0, 0]);
        // Steps shorter than the scrape interval read one scrape twice: its growth spreads over the interval.
        let slow = labelled(
            "c",
            &[
                (100.0, 0.0),
                (101.0, 0.0),
                (102.0, 4.0),
                (103.0, 4.0),
                (104.0, 4.0),
            ],
        );
        let slow_stamps = labelled(
            "",
            &[
                (100.0, 100.0),
                (101.0, 100.0),
                (102.0, 102.0),
                (103.0, 102.0),
                (104.0, 104.0),
            ],
        );
        assert_eq!(
            counts_per_step(&[&slow], &[&slow_stamps], &grid),
            vec![2.0, 2.0, 0.0, 0.0]
        );
    }

    #[test]
    fn first_tokens_move_back_by_their_own_steps_wait() {
        // 4 first tokens in step 2 after 1 s each; 2 in step 3 after 0.25 s each; 3 in step 0 after 5 s each.
        let a = arrivals_from_first_tokens(&[3.0, 0.0, 4.0, 2.0], &[15.0, 0.0, 4.0, 0.5], 2.0);
        // Step 2 covers (4, 6]: arrivals in (3, 5], half in step 1, half in step 2. Step 3's in (5.75, 7.75].
        // Step 0's would be before the window: they stay in its first step.
        assert_eq!(a, vec![3.0, 2.0, 2.0 + 0.25, 1.75]);
        assert!((a.iter().sum::<f64>() - 9.0).abs() < 1e-9);
        assert_eq!(whole_counts(&a), vec![3, 2, 2, 2]);
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
            observer: Observer::Prometheus,
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
        let (file, assumptions) = scenario(&[o.clone(), idle.clone()], &grid, &opts()).unwrap();
        let observed = |f: &ScenarioFile| f.models[0].traffic.observed.clone().unwrap();
        assert_eq!(observed(&file).finish_to_arrival, Duration::from_secs(3));
        // With the first-token counter, the counts are arrivals: nothing left to move.
        let by_first_token = ModelObservation {
            first_tokens: vec![0.0, 20.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 10.0],
            ttft_seconds: vec![0.0, 600.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0],
            ..o.clone()
        };
        let (f2, a2) = scenario(&[by_first_token, idle], &grid, &opts()).unwrap();
        assert_eq!(observed(&f2).finish_to_arrival, Duration::ZERO);
        assert_eq!(observed(&f2).requests.0, vec![10, 10, 0, 0, 0, 0, 0, 0, 0, 10]);
        assert!(a2[1].contains("first token"), "{a2:?}");
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
