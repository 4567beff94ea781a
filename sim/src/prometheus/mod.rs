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

async fn fetch_window(url: &str, a: &PromArgs) -> Result<Fetched, PromError> {
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
    let f = a.matchers();
    let sel = |metric: &str| format!("{metric}{{{f}}}");
    let range = format!("{}s", (grid.step * grid.steps as f64).round() as u64);
    let step_range = format!("{}s", grid.step.round() as u64);
    let end = grid.end();

    // Which models: every model_name with vLLM's finished-request counter in the window.
    let finished_metric = "vllm:e2e_request_latency_seconds_count";
    let found = client
        .query(
            &format!(
                "count by (model_name) (last_over_time({}[{range}]))",
                sel(finished_metric)
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
    if names.is_empty() {
        let any_vllm = client
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
                url: client.url().to_string(),
                selector: if f.is_empty() {
                    String::new()
                } else {
                    format!("{{{f}}}")
                },
                from: rfc3339(grid.start),
                to: rfc3339(end),
            });
        }
        return Err(PromError::MissingMetric {
            model: "every model".into(),
            metric: finished_metric.into(),
            why: "no request can be counted (other vllm: series are there)".into(),
            extra: String::new(),
        });
    }
    tracing::info!(
        models = names.len(),
        steps = grid.steps,
        url = client.url(),
        "reading Prometheus"
    );

    // Requests finished per step, and requests that got their first token per step with the seconds they waited
    // for it (arrivals come from these: see convert::arrivals_from_first_tokens): the raw counters, one series per
    // pod, differenced here. Asked model by model, so one answer holds one model's pods, not the cluster's (each
    // answer is capped).
    let first_token_metric = "vllm:time_to_first_token_seconds_count";
    let first_token_wait_metric = "vllm:time_to_first_token_seconds_sum";
    // Per model: finished, first tokens, their summed wait, and when each point was scraped (a pod's counters are
    // read by the same scrape, so the first-token counter's times serve all three).
    let mut read: [Vec<Series>; 4] = Default::default();
    for name in &names {
        let m = model_matchers(name, &f);
        let queries = [
            format!("{finished_metric}{{{m}}}"),
            format!("{first_token_metric}{{{m}}}"),
            format!("{first_token_wait_metric}{{{m}}}"),
            format!("timestamp({first_token_metric}{{{m}}})"),
        ];
        for (query, into) in queries.iter().zip(read.iter_mut()) {
            into.extend(client.query_range(query, grid.start, end, grid.step).await?);
        }
    }
    let [counters, first_tokens, first_token_waits, stamps] = read;
    // Replicas: pods exporting vLLM's running gauge.
    let replicas = client
        .query_range(
            &format!(
                "count by (model_name) (group by (model_name, instance, pod, engine) ({}))",
                sel("vllm:num_requests_running")
            ),
            grid.start,
            end,
            grid.step,
        )
        .await?;
    // The history must cover the window; a server whose retention (or whose scraping) began later would make a
    // quiet first part look idle.
    let first_seen = replicas
        .iter()
        .chain(counters.iter())
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
            suggest: humantime::format_duration(Duration::from_secs_f64(covered.max(grid.step))).to_string(),
            covered_s: covered,
        });
    }

    let by_model = |list: &[Series]| -> BTreeMap<String, Series> {
        list.iter()
            .map(|s| (s.label("model_name").to_string(), s.clone()))
            .collect()
    };
    let scalar = async |q: String| -> Result<BTreeMap<String, f64>, PromError> {
        Ok(client
            .query(&q, end)
            .await?
            .into_iter()
            .filter_map(|s| {
                let v = s.points.first()?.1;
                v.is_finite().then(|| (s.label("model_name").to_string(), v))
            })
            .collect())
    };
    // Token histograms: the raw bucket, sum and count series of each model's pods on a coarser grid, counted
    // exactly (see convert::histogram_over); asked model by model like the request counters.
    let hgrid = convert::histogram_grid(&grid);
    let histogram = async |base: &str| -> Result<BTreeMap<String, TokenHistogram>, PromError> {
        let mut out = BTreeMap::new();
        for name in &names {
            let m = model_matchers(name, &f);
            let mut read: [Vec<Series>; 3] = Default::default();
            for (suffix, into) in ["_bucket", "_sum", "_count"].iter().zip(read.iter_mut()) {
                *into = client
                    .query_range(&format!("{base}{suffix}{{{m}}}"), hgrid.start, end, hgrid.step)
                    .await?;
            }
            if let Some(h) = convert::histogram_over(&read[0], &read[1], &read[2], &hgrid) {
                out.insert(name.clone(), h);
            }
        }
        Ok(out)
    };
    let prompt = histogram("vllm:request_prompt_tokens").await?;
    let output = histogram("vllm:request_generation_tokens").await?;
    let e2e = scalar(format!(
        "sum by (model_name) (increase({}[{range}])) / sum by (model_name) (increase({}[{range}]))",
        sel("vllm:e2e_request_latency_seconds_sum"),
        sel(finished_metric)
    ))
    .await?;
    let quantile = |metric: String| {
        format!("histogram_quantile(0.95, sum by (model_name, le) (increase({metric}[{range}])))")
    };
    let ttft = scalar(quantile(sel("vllm:time_to_first_token_seconds_bucket"))).await?;
    let mut itl = scalar(quantile(sel("vllm:inter_token_latency_seconds_bucket"))).await?;
    if itl.is_empty() {
        // vLLM before 0.10 names it time per output token.
        itl = scalar(quantile(sel("vllm:time_per_output_token_seconds_bucket"))).await?;
    }
    let gauge_max = |m: &str| format!("max by (model_name) (max_over_time({}[{range}]))", sel(m));
    let mut kv = scalar(gauge_max("vllm:kv_cache_usage_perc")).await?;
    if kv.is_empty() {
        // Deprecated in vLLM 0.9.2, removed in 0.12: older servers only have this one.
        kv = scalar(gauge_max("vllm:gpu_cache_usage_perc")).await?;
    }
    let running = scalar(gauge_max("vllm:num_requests_running")).await?;
    let waiting = scalar(gauge_max("vllm:num_requests_waiting")).await?;
    let _ = step_range;

    let (gpu, gpu_reason) = match &a.gpu {
        Some(g) => (g.clone(), "--gpu".to_string()),
        None => {
            // DCGM's exporter labels every GPU series with the card's model name.
            let cards = client
                .query(
                    &format!("count by (modelName) (last_over_time(DCGM_FI_DEV_GPU_UTIL[{range}]))"),
                    end,
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
    };

    let replicas = by_model(&replicas);
    let mut obs = Vec::with_capacity(names.len());
    for name in &names {
        let stamps: Vec<&Series> = stamps.iter().filter(|s| s.label("model_name") == name).collect();
        let mine = |list: &[Series]| -> Vec<f64> {
            let series: Vec<&Series> = list.iter().filter(|s| s.label("model_name") == name).collect();
            convert::counts_per_step(&series, &stamps, &grid)
        };
        let (finished, first, waits) = (mine(&counters), mine(&first_tokens), mine(&first_token_waits));
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
            replicas: convert::on_grid(replicas.get(name), &grid),
            prompt_tokens: prompt.get(name).cloned(),
            output_tokens: output.get(name).cloned(),
            e2e_mean: e2e.get(name).copied(),
            ttft_p95: ttft.get(name).copied(),
            itl_p95: itl.get(name).copied(),
            kv_max: kv.get(name).copied(),
            running_max: running.get(name).copied(),
            waiting_max: waiting.get(name).copied(),
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
    let opts = ConvertOptions {
        name: "observed".into(),
        observer: convert::Observer::Prometheus,
        source: format!(
            "{} from {} to {}{}",
            client.url(),
            rfc3339(grid.start),
            rfc3339(end),
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
