//! `tessera simulate --prometheus URL`: a cluster's own vLLM history, read from Prometheus, as a scenario.
//!
//! [`fetch`] asks Prometheus's HTTP API ([`client`]) for each model's first-token and finished-request counters
//! (per step), its prompt and generation token histograms, TTFT and inter-token latency, running/waiting and KV
//! usage, the replicas exporting them, and the GPU model from DCGM where it is scraped; [`convert`] turns those into a
//! [`ScenarioFile`] with `trace: observed` traffic, which the caller writes out and simulates like any other.
//! What metrics cannot say is listed with the assumption made ([`convert::scenario`]).

pub mod client;
pub mod convert;
pub mod error;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use client::{ClientConfig, PromClient, Series};
pub use convert::{ConvertOptions, Grid, ModelObservation};
pub use error::PromError;

use crate::simulate::scenario::ScenarioFile;
use crate::trace::observed::TokenHistogram;

/// `tessera simulate --prometheus` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct PromArgs {
    /// Read the traffic from this Prometheus server (base URL, e.g. http://prometheus.monitoring:9090) instead
    /// of a scenario file: every vLLM model it scrapes becomes a model of the scenario, written to
    /// --write-scenario and then simulated.
    #[arg(long, env = "TESSERA_SIMULATE_PROMETHEUS", conflicts_with_all = ["scenario", "file"])]
    pub prometheus: Option<String>,
    /// How much history to read, ending at --until (e.g. `1d`, `7d`, `6h`; at most 7d).
    #[arg(long, env = "TESSERA_SIMULATE_SINCE", value_parser = humantime::parse_duration, default_value = "1d")]
    pub since: Duration,
    /// End of the history (RFC 3339, e.g. `2026-11-27T10:00:00Z`); default now.
    #[arg(long, env = "TESSERA_SIMULATE_UNTIL", value_parser = humantime::parse_rfc3339_weak)]
    pub until: Option<SystemTime>,
    /// Resolution of the request counts: arrivals reproduce the rate of every step (e.g. `1m`, `15s`).
    #[arg(long, env = "TESSERA_SIMULATE_STEP", value_parser = humantime::parse_duration, default_value = "1m")]
    pub step: Duration,
    /// Only models in this namespace (the `namespace` label of the vLLM series).
    #[arg(long, env = "TESSERA_SIMULATE_NAMESPACE")]
    pub namespace: Option<String>,
    /// More label matchers for the vLLM series, PromQL syntax (e.g. `cluster="prod",model_name=~"chat.*"`).
    #[arg(long, env = "TESSERA_SIMULATE_SELECTOR")]
    pub selector: Option<String>,
    /// A file holding a bearer token for Prometheus (a service account token, an API key).
    #[arg(long, env = "TESSERA_SIMULATE_BEARER_TOKEN_FILE")]
    pub bearer_token_file: Option<PathBuf>,
    /// A PEM bundle of certificate authorities to trust for an https:// Prometheus, beside the system's.
    #[arg(long, env = "TESSERA_SIMULATE_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// Deadline for each Prometheus request.
    #[arg(long, env = "TESSERA_SIMULATE_PROMETHEUS_TIMEOUT", value_parser = humantime::parse_duration, default_value = "30s")]
    pub prometheus_timeout: Duration,
    /// Where the scenario read from Prometheus is written (YAML; edit it and run `tessera simulate FILE`).
    #[arg(
        long,
        env = "TESSERA_SIMULATE_WRITE_SCENARIO",
        default_value = "tessera-observed.yaml"
    )]
    pub write_scenario: PathBuf,
    /// The GPU type (a100-80gb, a100-40gb, h100-80gb, l4); default: DCGM's `modelName` when Prometheus scrapes
    /// DCGM, else a100-80gb.
    #[arg(long, env = "TESSERA_SIMULATE_GPU")]
    pub gpu: Option<String>,
    /// A model's performance preset, `NAME=PRESET` (repeatable); default: the preset its name contains
    /// (`Qwen/Qwen2-7B-Instruct` → qwen2-7b), else llama-3.1-8b.
    #[arg(long, env = "TESSERA_SIMULATE_MODEL_PRESET", value_delimiter = ',', value_parser = parse_pair)]
    pub model_preset: Vec<(String, String)>,
    /// The TTFT objective written for every model.
    #[arg(long, env = "TESSERA_SIMULATE_SLO_TTFT", value_parser = humantime::parse_duration, default_value = "2s")]
    pub slo_ttft: Duration,
    /// How long a model stays idle before Tessera may scale it to zero.
    #[arg(long, env = "TESSERA_SIMULATE_SCALE_TO_ZERO_AFTER", value_parser = humantime::parse_duration, default_value = "10m")]
    pub scale_to_zero_after: Duration,
    /// `--max-model-len` written for every model (default: the preset's).
    #[arg(long, env = "TESSERA_SIMULATE_MAX_MODEL_LEN")]
    pub max_model_len: Option<u32>,
}

fn parse_pair(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() && !v.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{s:?}: expected NAME=PRESET")),
    }
}

impl PromArgs {
    /// The label matchers every vLLM query carries (without braces; empty for none).
    pub fn matchers(&self) -> String {
        let mut m = Vec::new();
        if let Some(ns) = &self.namespace {
            m.push(format!(
                "namespace=\"{}\"",
                ns.replace('\\', "\\\\").replace('"', "\\\"")
            ));
        }
        if let Some(s) = self.selector.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
            m.push(s.trim_matches(|c| c == '{' || c == '}').to_string());
        }
        m.join(",")
    }
}

/// What [`fetch`] produces.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// The scenario.
    pub file: ScenarioFile,
    /// What was assumed, one line each.
    pub assumptions: Vec<String>,
    /// The file as YAML (header included).
    pub yaml: String,
}

fn rfc3339(t: f64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs_f64(t.max(0.0))).to_string()
}

/// The matchers that select one model's series: its name, then the user's filter.
fn model_matchers(name: &str, filter: &str) -> String {
    format!(
        "model_name=\"{}\"{}",
        name.replace('\\', "\\\\").replace('"', "\\\""),
        if filter.is_empty() {
            String::new()
        } else {
            format!(",{filter}")
        }
    )
}

/// Reads the history and converts it. Async: only the HTTP waits; the conversion is pure. A server that holds less
/// history than `--since` asks is read for the part it holds (the window starting where its vLLM series start,
/// ending where it would have), with one line on stderr saying how much that was.
pub async fn fetch(url: &str, a: &PromArgs) -> Result<Fetched, PromError> {
    let until = a.until.unwrap_or_else(SystemTime::now);
    let pinned = PromArgs {
        until: Some(until),
        ..a.clone()
    };
    match fetch_window(url, &pinned).await {
        Err(PromError::Partial {
            first_seen,
            percent,
            covered_s,
            ..
        }) if covered_s >= a.step.as_secs_f64() => {
            let covered = Duration::from_secs_f64(covered_s);
            eprintln!(
                "Prometheus holds vLLM metrics only from {first_seen}, {percent:.0}% into the --since window: reading \
                 the {} it has (raise the server's retention for more).",
                humantime::format_duration(covered)
            );
            fetch_window(
                url,
                &PromArgs {
                    since: covered,
                    ..pinned
                },
            )
            .await
        }
        other => other,
    }
}

/// vLLM's finished-request counter: which models there are, and the requests they finished.
const FINISHED_METRIC: &str = "vllm:e2e_request_latency_seconds_count";
/// Requests that got their first token (arrivals come from these: see convert::arrivals_from_first_tokens).
const FIRST_TOKEN_METRIC: &str = "vllm:time_to_first_token_seconds_count";
/// The seconds those requests waited for it.
const FIRST_TOKEN_WAIT_METRIC: &str = "vllm:time_to_first_token_seconds_sum";

async fn fetch_window(url: &str, a: &PromArgs) -> Result<Fetched, PromError> {
    check_args(a)?;
    let client = PromClient::new(&ClientConfig {
        url: url.to_string(),
        bearer_token_file: a.bearer_token_file.clone(),
        ca_file: a.ca_file.clone(),
        timeout: a.prometheus_timeout,
        max_body_bytes: client::DEFAULT_MAX_BODY_BYTES,
        max_total_bytes: client::DEFAULT_MAX_TOTAL_BYTES,
    })?;
    let until = a
        .until
        .unwrap_or_else(SystemTime::now)
        .duration_since(UNIX_EPOCH)
        .map_err(|_| PromError::Config("--until is before 1970".into()))?
        .as_secs_f64()
        .floor();
    let grid = Grid::ending_at(until, a.since.as_secs_f64(), a.step.as_secs_f64());
    let w = Window {
        client: &client,
        grid,
        filter: a.matchers(),
        range: format!("{}s", (grid.step * grid.steps as f64).round() as u64),
        end: grid.end(),
    };
    let names = w.model_names().await?;
    tracing::info!(
        models = names.len(),
        steps = grid.steps,
        url = client.url(),
        "reading Prometheus"
    );
    let counters = w.request_counters(&names).await?;
    let replicas = w.replicas(&counters).await?;
    let summaries = w.summaries(&names).await?;
    let (gpu, gpu_reason) = w.gpu(a.gpu.as_ref()).await;
    let obs = observations(&names, &grid, &counters, &replicas, &summaries)?;
    let f = &w.filter;
    let opts = ConvertOptions {
        name: "observed".into(),
        observer: convert::Observer::Prometheus,
        source: format!(
            "{} from {} to {}{}",
            client.url(),
            rfc3339(grid.start),
            rfc3339(w.end),
            if f.is_empty() {
                String::new()
            } else {
                format!(" matching {{{f}}}")
            }
        ),
        gpu,
        gpu_reason,
        slo_ttft: a.slo_ttft,
        scale_to_zero_after: a.scale_to_zero_after,
        presets: a.model_preset.iter().cloned().collect(),
        max_model_len: a.max_model_len,
        seed: 1,
    };
    let (file, assumptions) = convert::scenario(&obs, &grid, &opts)?;
    let yaml = convert::to_yaml(&file, &assumptions)
        .map_err(|e| PromError::Config(format!("cannot write the scenario as YAML: {e}")))?;
    Ok(Fetched {
        file,
        assumptions,
        yaml,
    })
}

/// The flags' values a query cannot check, refused before the first one is sent.
fn check_args(a: &PromArgs) -> Result<(), PromError> {
    if a.step < Duration::from_secs(1) {
        return Err(PromError::Config("--step must be at least 1s".into()));
    }
    if a.since < a.step || a.since > Duration::from_secs(7 * 86_400) {
        return Err(PromError::Config(format!(
            "--since must be between --step ({}) and 7d, got {}",
            humantime::format_duration(a.step),
            humantime::format_duration(a.since)
        )));
    }
    if let Some(g) = &a.gpu {
        crate::model::GpuSpec::preset(g).map_err(|e| PromError::Config(format!("--gpu: {e}")))?;
    }
    for (name, p) in &a.model_preset {
        crate::model::ModelSpec::preset(p)
            .map_err(|e| PromError::Config(format!("--model-preset {name}={p}: {e}")))?;
    }
    Ok(())
}

/// The raw request counters of every model's pods, one series per pod (differenced in [`observations`]).
struct Counters {
    finished: Vec<Series>,
    first_tokens: Vec<Series>,
    first_token_waits: Vec<Series>,
    /// When each point was scraped (a pod's counters are read by the same scrape, so the first-token counter's
    /// times serve all three).
    stamps: Vec<Series>,
}

/// Per model, what one number or one histogram over the window says.
struct Summaries {
    prompt: BTreeMap<String, TokenHistogram>,
    output: BTreeMap<String, TokenHistogram>,
    e2e: BTreeMap<String, f64>,
    ttft: BTreeMap<String, f64>,
    itl: BTreeMap<String, f64>,
    kv: BTreeMap<String, f64>,
    running: BTreeMap<String, f64>,
    waiting: BTreeMap<String, f64>,
}

/// The queries over one window: its grid, and the user's matchers every vLLM query carries.
struct Window<'a> {
    client: &'a PromClient,
    grid: Grid,
    /// [`PromArgs::matchers`].
    filter: String,
    /// The whole window as a PromQL range (`3600s`).
    range: String,
    end: f64,
}

impl Window<'_> {
    /// A metric's selector with the user's matchers.
    fn sel(&self, metric: &str) -> String {
        let f = &self.filter;
        format!("{metric}{{{f}}}")
    }

    /// Every model_name with vLLM's finished-request counter in the window; with none, why not.
    async fn model_names(&self) -> Result<Vec<String>, PromError> {
        let (f, range, end) = (&self.filter, &self.range, self.end);
        let found = self
            .client
            .query(
                &format!(
                    "count by (model_name) (last_over_time({}[{range}]))",
                    self.sel(FINISHED_METRIC)
                ),
                end,
            )
            .await?;
        let mut names: Vec<String> = found
            .iter()
            .map(|s| s.label("model_name").to_string())
            .filter(|n| !n.is_empty())
            .collect();
        names.sort();
        names.dedup();
        if !names.is_empty() {
            return Ok(names);
        }
        let any_vllm = self
            .client
            .query(
                &format!(
                    "count(last_over_time({{__name__=~\"vllm:.+\"{}}}[{range}]))",
                    if f.is_empty() {
                        String::new()
                    } else {
                        format!(",{f}")
                    }
                ),
                end,
            )
            .await?;
        if any_vllm.iter().all(|s| s.points.iter().all(|p| p.1 == 0.0)) {
            return Err(PromError::NoVllmMetrics {
                url: self.client.url().to_string(),
                selector: if f.is_empty() {
                    String::new()
                } else {
                    format!("{{{f}}}")
                },
                from: rfc3339(self.grid.start),
                to: rfc3339(end),
            });
        }
        Err(PromError::MissingMetric {
            model: "every model".into(),
            metric: FINISHED_METRIC.into(),
            why: "no request can be counted (other vllm: series are there)".into(),
            extra: String::new(),
        })
    }

    /// Requests finished per step, and requests that got their first token per step with the seconds they waited
    /// for it: the raw counters, one series per pod. Asked model by model, so one answer holds one model's pods,
    /// not the cluster's (each answer is capped).
    async fn request_counters(&self, names: &[String]) -> Result<Counters, PromError> {
        let (grid, end) = (&self.grid, self.end);
        let mut read: [Vec<Series>; 4] = Default::default();
        for name in names {
            let m = model_matchers(name, &self.filter);
            let queries = [
                format!("{FINISHED_METRIC}{{{m}}}"),
                format!("{FIRST_TOKEN_METRIC}{{{m}}}"),
                format!("{FIRST_TOKEN_WAIT_METRIC}{{{m}}}"),
                format!("timestamp({FIRST_TOKEN_METRIC}{{{m}}})"),
            ];
            for (query, into) in queries.iter().zip(read.iter_mut()) {
                into.extend(self.client.query_range(query, grid.start, end, grid.step).await?);
            }
        }
        let [finished, first_tokens, first_token_waits, stamps] = read;
        Ok(Counters {
            finished,
            first_tokens,
            first_token_waits,
            stamps,
        })
    }

    /// Replicas per step: pods exporting vLLM's running gauge. The history must cover the window; a server whose
    /// retention (or whose scraping) began later would make a quiet first part look idle.
    async fn replicas(&self, counters: &Counters) -> Result<Vec<Series>, PromError> {
        let (grid, end) = (&self.grid, self.end);
        let replicas = self
            .client
            .query_range(
                &format!(
                    "count by (model_name) (group by (model_name, instance, pod, engine) ({}))",
                    self.sel("vllm:num_requests_running")
                ),
                grid.start,
                end,
                grid.step,
            )
            .await?;
        let first_seen = replicas
            .iter()
            .chain(counters.finished.iter())
            .filter_map(|s| s.points.first().map(|p| p.0))
            .fold(f64::INFINITY, f64::min);
        let span = end - grid.start;
        if first_seen.is_finite() && first_seen - grid.start > 0.1 * span {
            let covered = ((end - first_seen) / grid.step).floor() * grid.step;
            return Err(PromError::Partial {
                first_seen: rfc3339(first_seen),
                percent: (first_seen - grid.start) / span * 100.0,
                from: rfc3339(grid.start),
                to: rfc3339(end),
                suggest: humantime::format_duration(Duration::from_secs_f64(covered.max(grid.step)))
                    .to_string(),
                covered_s: covered,
            });
        }
        Ok(replicas)
    }

    /// One number per model, from an instant query at the window's end.
    async fn scalar(&self, q: String) -> Result<BTreeMap<String, f64>, PromError> {
        Ok(self
            .client
            .query(&q, self.end)
            .await?
            .into_iter()
            .filter_map(|s| {
                let v = s.points.first()?.1;
                v.is_finite().then(|| (s.label("model_name").to_string(), v))
            })
            .collect())
    }

    /// Token histograms: the raw bucket, sum and count series of each model's pods on a coarser grid, counted
    /// exactly (see convert::histogram_over); asked model by model like the request counters.
    async fn histogram(
        &self,
        names: &[String],
        hgrid: &Grid,
        base: &str,
    ) -> Result<BTreeMap<String, TokenHistogram>, PromError> {
        let mut out = BTreeMap::new();
        for name in names {
            let m = model_matchers(name, &self.filter);
            let mut read: [Vec<Series>; 3] = Default::default();
            for (suffix, into) in ["_bucket", "_sum", "_count"].iter().zip(read.iter_mut()) {
                *into = self
                    .client
                    .query_range(
                        &format!("{base}{suffix}{{{m}}}"),
                        hgrid.start,
                        self.end,
                        hgrid.step,
                    )
                    .await?;
            }
            if let Some(h) = convert::histogram_over(&read[0], &read[1], &read[2], hgrid) {
                out.insert(name.clone(), h);
            }
        }
        Ok(out)
    }

    /// The token histograms, latencies and gauge peaks of every model over the window.
    async fn summaries(&self, names: &[String]) -> Result<Summaries, PromError> {
        let range = &self.range;
        let hgrid = convert::histogram_grid(&self.grid);
        let prompt = self
            .histogram(names, &hgrid, "vllm:request_prompt_tokens")
            .await?;
        let output = self
            .histogram(names, &hgrid, "vllm:request_generation_tokens")
            .await?;
        let e2e = self
            .scalar(format!(
                "sum by (model_name) (increase({}[{range}])) / sum by (model_name) (increase({}[{range}]))",
                self.sel("vllm:e2e_request_latency_seconds_sum"),
                self.sel(FINISHED_METRIC)
            ))
            .await?;
        let quantile = |metric: String| {
            format!("histogram_quantile(0.95, sum by (model_name, le) (increase({metric}[{range}])))")
        };
        let ttft = self
            .scalar(quantile(self.sel("vllm:time_to_first_token_seconds_bucket")))
            .await?;
        let mut itl = self
            .scalar(quantile(self.sel("vllm:inter_token_latency_seconds_bucket")))
            .await?;
        if itl.is_empty() {
            // vLLM before 0.10 names it time per output token.
            itl = self
                .scalar(quantile(self.sel("vllm:time_per_output_token_seconds_bucket")))
                .await?;
        }
        let gauge_max = |m: &str| format!("max by (model_name) (max_over_time({}[{range}]))", self.sel(m));
        let mut kv = self.scalar(gauge_max("vllm:kv_cache_usage_perc")).await?;
        if kv.is_empty() {
            // Deprecated in vLLM 0.9.2, removed in 0.12: older servers only have this one.
            kv = self.scalar(gauge_max("vllm:gpu_cache_usage_perc")).await?;
        }
        let running = self.scalar(gauge_max("vllm:num_requests_running")).await?;
        let waiting = self.scalar(gauge_max("vllm:num_requests_waiting")).await?;
        Ok(Summaries {
            prompt,
            output,
            e2e,
            ttft,
            itl,
            kv,
            running,
            waiting,
        })
    }

    /// The GPU preset and why: `--gpu`, else the most common card DCGM reports, else an assumption.
    async fn gpu(&self, given: Option<&String>) -> (String, String) {
        let range = &self.range;
        match given {
            Some(g) => (g.clone(), "--gpu".to_string()),
            None => {
                // DCGM's exporter labels every GPU series with the card's model name.
                let cards = self
                    .client
                    .query(
                        &format!("count by (modelName) (last_over_time(DCGM_FI_DEV_GPU_UTIL[{range}]))"),
                        self.end,
                    )
                    .await
                    .unwrap_or_default();
                let best = cards
                    .iter()
                    .filter_map(|s| {
                        Some((
                            convert::gpu_preset(s.label("modelName"))?,
                            s.points.first()?.1,
                            s.label("modelName"),
                        ))
                    })
                    .max_by(|a, b| a.1.total_cmp(&b.1));
                match best {
                    Some((preset, n, card)) => (
                        preset.to_string(),
                        format!("DCGM reports {n:.0} {card}; the most common card is simulated"),
                    ),
                    None => (
                        "a100-80gb".to_string(),
                        "not in the metrics (no DCGM exporter scraped): assumed; set --gpu".to_string(),
                    ),
                }
            }
        }
    }
}

/// Each model's observation: its pods' counters differenced per step, with its replicas and summaries.
fn observations(
    names: &[String],
    grid: &Grid,
    counters: &Counters,
    replicas: &[Series],
    s: &Summaries,
) -> Result<Vec<ModelObservation>, PromError> {
    let replicas: BTreeMap<String, Series> = replicas
        .iter()
        .map(|s| (s.label("model_name").to_string(), s.clone()))
        .collect();
    let mut obs = Vec::with_capacity(names.len());
    for name in names {
        let stamps: Vec<&Series> = counters
            .stamps
            .iter()
            .filter(|s| s.label("model_name") == name)
            .collect();
        let mine = |list: &[Series]| -> Vec<f64> {
            let series: Vec<&Series> = list.iter().filter(|s| s.label("model_name") == name).collect();
            convert::counts_per_step(&series, &stamps, grid)
        };
        let (finished, first, waits) = (
            mine(&counters.finished),
            mine(&counters.first_tokens),
            mine(&counters.first_token_waits),
        );
        tracing::debug!(
            model = %name,
            finished = finished.iter().sum::<f64>(),
            first_tokens = first.iter().sum::<f64>(),
            "requests counted"
        );
        obs.push(ModelObservation {
            name: name.clone(),
            finished,
            first_tokens: first,
            ttft_seconds: waits,
            replicas: convert::on_grid(replicas.get(name), grid),
            prompt_tokens: s.prompt.get(name).cloned(),
            output_tokens: s.output.get(name).cloned(),
            e2e_mean: s.e2e.get(name).copied(),
            ttft_p95: s.ttft.get(name).copied(),
            itl_p95: s.itl.get(name).copied(),
            kv_max: s.kv.get(name).copied(),
            running_max: s.running.get(name).copied(),
            waiting_max: s.waiting.get(name).copied(),
        });
        if !replicas.contains_key(name) {
            return Err(PromError::MissingMetric {
                model: error::printable(name),
                metric: "vllm:num_requests_running".into(),
                why: "how many replicas served it today cannot be known".into(),
                extra: String::new(),
            });
        }
    }
    Ok(obs)
}
