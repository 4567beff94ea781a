//! `tessera simulate --prometheus` end to end.
//!
//! - Against a tiny Prometheus stand-in on loopback (axum): an unreachable, slow, partial, refusing or
//!   vLLM-less server gets an error naming what is missing and how to get it, never a report; a complete one gives
//!   a scenario file and the first screen.
//! - Against a REAL Prometheus (Debian's `prometheus` package, `#[ignore]`d, run by `scripts/test.sh`): it scrapes
//!   two `tessera vllm-sim` emulators every second while the test replays a known trace into them; then
//!   `simulate --prometheus` on that history and `simulate` on the trace itself must agree on every strategy's
//!   GPU-hours within [`TOLERANCE`] ([`TESSERA_TOLERANCE`] for Tessera's own, which turns on which requests were
//!   long); its requests per step must be where they were sent, its length histograms the true ones, and Tessera's
//!   GPU-hours from it within [`CONVERSION_TOLERANCE`] of what exact metrics at the same step give.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::Query;
use axum::routing::get;
use serde_json::{Value, json};

mod support;
use support::{Killed, Tessera, free_port, serve};

/// How far the two runs' GPU-hours may differ, per strategy (relative to the trace's).
const TOLERANCE: f64 = 0.10;

/// How far Tessera's GPU-hours may differ from the trace's. Its scale-ups follow TTFT, which follows which requests
/// were long and when within a second they came; metrics hold neither (lengths as two histograms, requests as counts
/// per step), and on the test's four minutes one scale-up is 8–15% of the GPU-hours. Taken apart on one history at
/// 5 s steps, 60 seeds each (trace 0.0917): exact arrival times with lengths drawn from the true histograms 0.0980
/// (+7%), exact counts per 5 s step 0.1016 (+11%), the Prometheus history 0.1070 (+17%). So most of the difference is
/// what no history holds, and the conversion's own part is checked against [`CONVERSION_TOLERANCE`]. 30%: the widest
/// of seven runs (+25%) with room for the seeds.
const TESSERA_TOLERANCE: f64 = 0.30;

/// Σ|sent − counted| over the steps (both models), at most this share of the requests, per step length.
/// Counted at the first token and moved back by each step's mean wait for it, it was 17–24% at 2 s steps and
/// 24–41% at 1 s over five runs; counting the finishes instead (as before, moved back or not by the mean
/// end-to-end latency) puts it at 39–43% and 67–70%. A 1 s scrape places a request within a second at best, so
/// finer steps cannot do better.
const ARRIVALS_OFF: [(u64, f64); 2] = [(2, 0.32), (1, 0.50)];

/// How far the history's Tessera GPU-hours may differ from what exact metrics at the same step give (the mean over
/// every step of the test): the conversion's own error (counters read at their scrapes, each step's requests moved
/// back by its mean TTFT, histograms read by bucket). Measured per step over 30 seeds: +4.6% (1 s), −7.2% (2 s),
/// +5.3% (5 s), −3.0% (10 s), each ±3–5% from the seeds alone.
const CONVERSION_TOLERANCE: f64 = 0.10;

/// The seeds every side of the real-Prometheus comparison runs (their means are compared). Tessera's GPU-hours on
/// these four minutes come in a few large steps (0.069 to 0.19 per seed): the mean over 30 seeds still moves ±4%.
const SEEDS: &str = "1-30";

/// Runs `tessera simulate <args>` in `dir` (at most `limit`), returns its output.
fn simulate_in(dir: &Path, args: &[&str], limit: Duration) -> Output {
    support::simulate(Some(dir), args, limit)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The last line's `gpu_hours_<strategy>` values.
fn gpu_hours(out: &str) -> BTreeMap<String, f64> {
    let last = out.lines().last().unwrap_or_default();
    last.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| k.starts_with("gpu_hours_") && !k.starts_with("gpu_hours_lower_bound"))
        .map(|(k, v)| (k.trim_start_matches("gpu_hours_").to_string(), v.parse().unwrap()))
        .collect()
}

/// Each strategy's GPU-hours over the seeds of `simulate FILE --seeds … --out DIR`: `(mean, least, most)`, from
/// each seed's line of the sweep it writes. The mean, not the median: one scale-up is a step of 8–15% of the
/// GPU-hours here, and a median lands on one step or the next.
fn sweep_gpu_hours(dir: &Path) -> BTreeMap<String, (f64, f64, f64)> {
    let sweep: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("sweep.json")).unwrap()).unwrap();
    let mut per: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for seed in sweep["seeds"].as_array().unwrap() {
        for s in seed["strategies"].as_array().unwrap() {
            per.entry(s["strategy"].as_str().unwrap().to_string())
                .or_default()
                .push(s["gpu_hours"].as_f64().unwrap());
        }
    }
    per.into_iter()
        .map(|(k, v)| {
            let mean = v.iter().sum::<f64>() / v.len() as f64;
            let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            (k, (mean, lo, hi))
        })
        .collect()
}

/// Runs scenario `file` in `dir` over [`SEEDS`] (with `extra` arguments) and returns each strategy's GPU-hours as
/// [`sweep_gpu_hours`] reads them from its `sweep.json`.
fn sweep(dir: &Path, file: &str, extra: &[&str]) -> BTreeMap<String, (f64, f64, f64)> {
    let out = format!("{}-seeds", file.trim_end_matches(".yaml"));
    let mut args = vec![file, "--seeds", SEEDS, "--quiet", "--out", &out];
    args.extend_from_slice(extra);
    let run = simulate_in(dir, &args, Duration::from_secs(300));
    assert!(run.status.success(), "{file}: {}", stderr(&run));
    sweep_gpu_hours(&dir.join(out))
}

// ---------------------------------------------------------------------------------------------------------------
// A Prometheus stand-in: answers `query` and `query_range` from a function of the PromQL text.
// ---------------------------------------------------------------------------------------------------------------

/// What the stand-in holds.
#[derive(Clone, Copy, PartialEq)]
enum Holds {
    /// Nothing at all.
    Nothing,
    /// vLLM series, but only from this unix second on (a retention or a scrape job that began then).
    From(u64),
    /// Counters and replicas, but no token histograms.
    NoHistograms,
    /// Everything (one model, `chat`, one replica, one request a second).
    Everything,
    /// Everything, with a warning that the answer is partial.
    Warning,
}

fn vector(result: Vec<Value>) -> Value {
    json!({"status": "success", "data": {"resultType": "vector", "result": result}})
}

fn answer(holds: Holds, path: &str, q: &HashMap<String, String>) -> Value {
    let query = q.get("query").cloned().unwrap_or_default();
    let num = |k: &str| q.get(k).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let model = json!({"model_name": "chat"});
    if holds == Holds::Nothing {
        return if path.ends_with("query_range") {
            json!({"status": "success", "data": {"resultType": "matrix", "result": []}})
        } else {
            vector(vec![json!({"metric": {}, "value": [num("time"), "0"]})])
        };
    }
    if path.ends_with("query_range") {
        let (start, end, step) = (num("start"), num("end"), num("step"));
        let from = match holds {
            Holds::From(t) => t as f64,
            _ => start,
        };
        let mut values = Vec::new();
        let mut t = start;
        while t <= end + 1e-9 {
            if t >= from {
                // A counter at one request per second; a gauge at 1 replica; a scrape at every point.
                let v = if query.contains("count by") {
                    1.0
                } else if query.starts_with("timestamp(") {
                    t
                } else {
                    t - start
                };
                values.push(json!([t, v.to_string()]));
            }
            t += step;
        }
        let mut labels = json!({"model_name": "chat", "instance": "10.0.0.1:8000"});
        if query.contains("count by") {
            labels = model.clone();
        }
        let mut result = vec![json!({"metric": labels.clone(), "values": values})];
        // Token histograms: raw cumulative series, 10% up to 100 tokens, 60% up to 500, all up to 1000, 300 on
        // average; none where the stand-in holds none.
        let tokens = query.starts_with("vllm:request_prompt_tokens")
            || query.starts_with("vllm:request_generation_tokens");
        if tokens && holds == Holds::NoHistograms {
            result.clear();
        } else if tokens {
            let scaled = |share: f64| -> Value {
                json!(
                    values
                        .iter()
                        .map(|p| json!([
                            p[0],
                            (p[1].as_str().unwrap().parse::<f64>().unwrap() * share).to_string()
                        ]))
                        .collect::<Vec<_>>()
                )
            };
            result = if query.contains("_bucket") {
                [("100", 0.1), ("500", 0.6), ("1000", 1.0), ("+Inf", 1.0)]
                    .iter()
                    .map(|(le, share)| json!({"metric": {"model_name": "chat", "instance": "10.0.0.1:8000", "le": le}, "values": scaled(*share)}))
                    .collect()
            } else {
                vec![
                    json!({"metric": labels, "values": scaled(if query.contains("_sum") { 300.0 } else { 1.0 })}),
                ]
            };
        }
        let mut out = json!({"status": "success", "data": {"resultType": "matrix", "result": result}});
        if holds == Holds::Warning {
            out["warnings"] = json!(["remote read from store-eu failed: context deadline exceeded"]);
        }
        return out;
    }
    let at = num("time");
    let one = |v: f64| vector(vec![json!({"metric": model, "value": [at, v.to_string()]})]);
    if query.contains("_sum") {
        return one(2.0);
    }
    if query.contains("histogram_quantile") {
        return one(0.2);
    }
    if query.contains("DCGM") {
        return vector(vec![]);
    }
    one(1.0)
}

/// Serves the stand-in; returns its base URL.
async fn stand_in(holds: Holds) -> String {
    let route = |path: &'static str| {
        get(
            move |Query(q): Query<HashMap<String, String>>| async move { axum::Json(answer(holds, path, &q)) },
        )
    };
    let app = axum::Router::new()
        .route("/api/v1/query", route("query"))
        .route("/api/v1/query_range", route("query_range"));
    format!("http://{}", serve(app).await)
}

/// `simulate --prometheus URL <extra>` in a fresh folder, off the async runtime.
async fn simulate_prometheus(url: String, extra: &[&str]) -> (Output, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let mut args: Vec<String> = ["--prometheus", &url, "--since", "1h", "--step", "1m"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    let out = tokio::task::spawn_blocking(move || {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        simulate_in(&path, &a, Duration::from_secs(120))
    })
    .await
    .unwrap();
    (out, dir)
}

async fn fails_with(holds: Holds, extra: &[&str], says: &[&str]) {
    let url = stand_in(holds).await;
    let (out, dir) = simulate_prometheus(url, extra).await;
    let err = stderr(&out);
    assert!(!out.status.success(), "must fail:\n{}\n{err}", stdout(&out));
    for s in says {
        assert!(err.contains(s), "missing {s:?} in:\n{err}");
    }
    assert!(stdout(&out).is_empty(), "no report on failure:\n{}", stdout(&out));
    assert!(
        !dir.path().join("tessera-observed.yaml").exists(),
        "no scenario on failure"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prometheus_without_vllm_metrics_gets_the_scrape_config_to_add() {
    fails_with(
        Holds::Nothing,
        &[],
        &["holds no vLLM metrics", "scrape_configs", "job_name: vllm"],
    )
    .await;
}

/// A history shorter than `--since` is read for what it holds, and one line says how much that was (before: the
/// run failed, asking for a shorter `--since`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_shorter_than_asked_is_read_for_what_it_holds() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let url = stand_in(Holds::From(now - 1800)).await;
    let (out, dir) = simulate_prometheus(url, &[]).await;
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("holds vLLM metrics only from")
            && (err.contains("reading the 29m") || err.contains("reading the 30m")),
        "one line saying how much history there was: {err}"
    );
    assert!(
        dir.path().join("tessera-observed.yaml").exists(),
        "the scenario of what there was"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_without_token_histograms_is_named_with_the_metric() {
    fails_with(
        Holds::NoHistograms,
        &[],
        &["model chat", "vllm:request_prompt_tokens"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_answer_with_warnings_is_not_used() {
    fails_with(Holds::Warning, &[], &["data may be partial", "store-eu"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_or_slow_or_refusing_prometheus_is_named() {
    // Nothing listens on a port just released.
    let port = free_port();
    let (out, _dir) = simulate_prometheus(format!("http://127.0.0.1:{port}"), &[]).await;
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("cannot reach Prometheus at http://127.0.0.1:"),
        "{}",
        stderr(&out)
    );
    // A server that never answers, under a one-second deadline.
    let slow = axum::Router::new().fallback(|| async {
        tokio::time::sleep(Duration::from_secs(60)).await;
        "late"
    });
    let url = format!("http://{}", serve(slow).await);
    let started = Instant::now();
    let (out, _dir) = simulate_prometheus(url, &["--prometheus-timeout", "1s"]).await;
    assert!(!out.status.success());
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    let err = stderr(&out);
    assert!(
        err.contains("did not answer within 1s") && err.contains("--prometheus-timeout"),
        "{err}"
    );
    // An auth proxy in front.
    let refusing =
        axum::Router::new().fallback(|| async { (axum::http::StatusCode::UNAUTHORIZED, "no token") });
    let url = format!("http://{}", serve(refusing).await);
    let (out, _dir) = simulate_prometheus(url, &[]).await;
    let err = stderr(&out);
    assert!(
        err.contains("HTTP 401") && err.contains("--bearer-token-file"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_history_becomes_a_scenario_file_and_the_first_screen() {
    let url = stand_in(Holds::Everything).await;
    let (out, dir) = simulate_prometheus(url, &["--model-preset", "chat=qwen2-7b"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let screen = stdout(&out);
    // The first screen: the short table (today observed) and the advice, then the summary line.
    let first: Vec<&str> = screen.lines().take(20).collect();
    assert!(first.iter().any(|l| l.starts_with("today ")), "{screen}");
    assert!(first.iter().any(|l| l.starts_with("tessera ")), "{screen}");
    assert!(
        first.iter().any(|l| l.trim_start().starts_with("chat: ")),
        "{screen}"
    );
    assert!(screen.contains("assumptions were made"), "{screen}");
    let file = dir.path().join("tessera-observed.yaml");
    let yaml = std::fs::read_to_string(&file).unwrap();
    assert!(
        yaml.contains("trace: observed") && yaml.contains("preset: qwen2-7b"),
        "{yaml}"
    );
    assert!(yaml.contains("# What metrics cannot say"), "{yaml}");
    // The file runs again on its own and gives the same numbers.
    let again = simulate_in(dir.path(), &["tessera-observed.yaml"], Duration::from_secs(120));
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(gpu_hours(&stdout(&again)), gpu_hours(&screen));
}

/// Over https with a private CA (`--ca-file`) and a bearer token (`--bearer-token-file`): the stand-in only answers
/// a request carrying the token, and the client trusts only the given CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_a_private_ca_and_a_bearer_token() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pair = support::admission::pair();
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &pair.cert_pem).unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let route = |path: &'static str| {
        get(
            move |headers: axum::http::HeaderMap, Query(q): Query<HashMap<String, String>>| async move {
                if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some("Bearer s3cret") {
                    return (axum::http::StatusCode::FORBIDDEN, axum::Json(json!({}))).into_response();
                }
                axum::Json(answer(Holds::Everything, path, &q)).into_response()
            },
        )
    };
    use axum::response::IntoResponse;
    let app = axum::Router::new()
        .route("/api/v1/query", route("query"))
        .route("/api/v1/query_range", route("query_range"));
    let cert = rustls::pki_types::CertificateDer::from(pair.der.to_vec());
    let key = rustls::pki_types::PrivateKeyDer::try_from(
        rustls::pki_types::pem::PemObject::from_pem_slice(pair.key_pem.as_bytes())
            .map(|k: rustls::pki_types::PrivatePkcs8KeyDer<'static>| k.secret_pkcs8_der().to_vec())
            .unwrap(),
    )
    .unwrap();
    let config = std::sync::Arc::new(
        rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)
            .unwrap(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(tessera_runtime::serve::serve_tls(
        listener,
        app,
        tessera_runtime::serve::ConnLimits::default(),
        move || config.clone(),
        std::future::pending(),
    ));
    let url = format!("https://localhost:{port}");
    let (ca_s, token_s) = (ca.display().to_string(), token.display().to_string());
    // With the CA and the token: a report.
    let (out, _d) = simulate_prometheus(
        url.clone(),
        &[
            "--ca-file",
            &ca_s,
            "--bearer-token-file",
            &token_s,
            "--strategies",
            "static,tessera",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("tessera "), "{}", stdout(&out));
    // Without the token: the 403 is named with the flag to pass.
    let (out, _d) = simulate_prometheus(url.clone(), &["--ca-file", &ca_s]).await;
    assert!(
        stderr(&out).contains("HTTP 403") && stderr(&out).contains("--bearer-token-file"),
        "{}",
        stderr(&out)
    );
    // Without the CA: the certificate is not trusted, and the error says the connection failed.
    let (out, _d) = simulate_prometheus(url, &["--bearer-token-file", &token_s]).await;
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("cannot reach Prometheus") && stderr(&out).contains("pass --ca-file"),
        "{}",
        stderr(&out)
    );
}

// ---------------------------------------------------------------------------------------------------------------
// The real thing: Debian's Prometheus scraping emulators that replay a known trace.
// ---------------------------------------------------------------------------------------------------------------

/// The Prometheus binary: `TESSERA_PROMETHEUS_BIN`, else `prometheus` on the PATH (Debian's package).
fn prometheus_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("TESSERA_PROMETHEUS_BIN") {
        return PathBuf::from(p);
    }
    for dir in std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
    {
        let p = dir.join("prometheus");
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "no prometheus binary: install Debian's package (apt-get install prometheus) or set TESSERA_PROMETHEUS_BIN"
    );
}

/// One request of the replayed trace.
#[derive(Clone, Copy)]
struct Req {
    at: f64,
    prompt: u32,
    output: u32,
}

/// A known trace per model: a window of the bundled Azure LLM 2023 conversation trace, thinned to every n-th
/// request, with an idle gap, and every length scaled by `scale` so the emulated A100 keeps up in real time. Scaled,
/// not capped: a cap that a quarter of the requests hit (400 output tokens did) is a point mass inside one histogram
/// bucket, which no histogram shows (docs/simulator.md, "Agreement with the trace").
fn trace(skip_from: f64, skip_to: f64, keep_every: usize, offset: usize, span: f64, scale: f64) -> Vec<Req> {
    let csv = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../testdata/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"),
    )
    .unwrap();
    let mut rows = csv.lines().skip(1).filter_map(|l| {
        let f: Vec<&str> = l.split(',').collect();
        Some((
            f.first()?.to_string(),
            f.get(1)?.parse::<u32>().ok()?,
            f.get(2)?.parse::<u32>().ok()?,
        ))
    });
    let first = rows.next().unwrap();
    let t0 = parse_ts(&first.0);
    let mut out = Vec::new();
    for (i, (ts, p, o)) in std::iter::once(first).chain(rows).enumerate() {
        let at = parse_ts(&ts) - t0;
        if at >= span {
            break;
        }
        if i % keep_every != offset || (at >= skip_from && at < skip_to) {
            continue;
        }
        out.push(Req {
            at,
            prompt: ((f64::from(p) * scale).round() as u32).max(1),
            output: ((f64::from(o) * scale).round() as u32).max(1),
        });
    }
    out
}

/// Seconds of an Azure trace timestamp (`2023-11-16 18:15:46.6805900`) within its day.
fn parse_ts(ts: &str) -> f64 {
    let time = ts.split_whitespace().nth(1).unwrap_or("0:0:0");
    time.split(':')
        .fold(0.0, |acc, x| acc * 60.0 + x.parse::<f64>().unwrap_or(0.0))
}

/// Polls `url` until it answers 200 with a body containing `needle`, or panics after `limit`.
async fn wait_for(c: &reqwest::Client, url: &str, needle: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(r) = c.get(url).send().await
            && r.status().is_success()
            && r.text().await.unwrap_or_default().contains(needle)
        {
            return;
        }
        assert!(Instant::now() < deadline, "{url} never showed {needle:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `NAME=default` from the environment, for measuring the real-Prometheus test at other loads and steps.
fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Counts per step of `times` (seconds from the grid's start) over `steps` steps of `step` seconds; step `k` holds
/// `(k·step, (k+1)·step]`, as the converter's grid does.
fn per_step(times: &[f64], step: f64, steps: usize) -> Vec<u32> {
    let mut out = vec![0; steps];
    for &t in times {
        let k = ((t / step).ceil() as i64 - 1).clamp(0, steps as i64 - 1) as usize;
        out[k] += 1;
    }
    out
}

/// The lengths a scenario's histograms hold.
const LENGTHS: [&str; 2] = ["prompt_tokens", "output_tokens"];

impl Req {
    /// This request's own length of one of [`LENGTHS`].
    fn length(&self, field: &str) -> u32 {
        if field == "prompt_tokens" {
            self.prompt
        } else {
            self.output
        }
    }
}

/// One model of a scenario file, by name.
fn model_of<'a>(sc: &'a serde_yaml::Value, name: &str) -> &'a serde_yaml::Value {
    sc["models"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|x| x["name"].as_str() == Some(name))
        .unwrap()
}

fn model_mut<'a>(sc: &'a mut serde_yaml::Value, name: &str) -> &'a mut serde_yaml::Value {
    sc["models"]
        .as_sequence_mut()
        .unwrap()
        .iter_mut()
        .find(|x| x["name"].as_str() == Some(name))
        .unwrap()
}

/// The histogram of `lengths` on the buckets of `read` (a scenario's `prompt_tokens` or `output_tokens`), after
/// checking `read` holds the same: every bucket's count exactly (the converter counts the raw series between the
/// window's edges, no extrapolation) and the exact mean.
fn true_histogram(read: &serde_yaml::Value, lengths: &[u32], what: &str) -> serde_yaml::Value {
    let buckets = read["buckets"].as_sequence().unwrap();
    let n = lengths.len() as f64;
    let mut below = 0.0;
    let mut out = Vec::new();
    for b in buckets {
        let le = b["le"].as_f64().unwrap();
        let count = lengths
            .iter()
            .filter(|&&l| f64::from(l) > below && f64::from(l) <= le)
            .count() as f64;
        let read_count = b["count"].as_f64().unwrap();
        assert_eq!(
            read_count, count,
            "{what}: the bucket up to {le} holds {read_count} requests in the history, {count} in truth"
        );
        // Built as YAML, not JSON: the last bound is `.inf`, which JSON cannot hold.
        let mut bucket = serde_yaml::Mapping::new();
        bucket.insert("le".into(), le.into());
        bucket.insert("count".into(), count.into());
        out.push(serde_yaml::Value::Mapping(bucket));
        below = le;
    }
    let mean = lengths.iter().map(|&l| f64::from(l)).sum::<f64>() / n;
    let read_mean = read["mean"].as_f64().unwrap();
    assert!(
        (read_mean - mean).abs() <= 1e-9 * mean,
        "{what}: mean {read_mean} in the history, {mean} in truth"
    );
    let mut histogram = serde_yaml::Mapping::new();
    histogram.insert("mean".into(), mean.into());
    histogram.insert("buckets".into(), serde_yaml::Value::Sequence(out));
    serde_yaml::Value::Mapping(histogram)
}

fn line(v: &[u32]) -> String {
    v.iter().map(u32::to_string).collect::<Vec<_>>().join(" ")
}

/// What a server sends reaches the terminal only made printable (issue 53 N12): a 500 page's escape codes, an
/// API error's and a label value's, and an HTML error page is named rather than pasted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_server_sends_is_printed_without_its_control_characters() {
    for body in [
        "\u{1b}]0;pwned\u{7}\u{1b}[31mboom\u{1b}[0m",
        "<!DOCTYPE html><html><body><h1>502 Bad Gateway</h1></body></html>",
    ] {
        let failing = axum::Router::new()
            .fallback(move || async move { (axum::http::StatusCode::INTERNAL_SERVER_ERROR, body) });
        let url = format!("http://{}", serve(failing).await);
        let (out, _dir) = simulate_prometheus(url, &[]).await;
        let err = stderr(&out);
        assert!(!out.status.success());
        assert!(err.contains("HTTP 500"), "{err}");
        assert!(
            !err.contains('\u{1b}') && !err.contains('\u{7}'),
            "raw control characters: {err:?}"
        );
        if body.starts_with('<') {
            assert!(err.contains("an HTML page") && !err.contains("<h1>"), "{err}");
        } else {
            assert!(err.contains("\\u{1b}]0;pwned"), "shown escaped: {err}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "starts Debian's prometheus and replays a trace for a few minutes: scripts/test.sh runs it"]
#[expect(
    clippy::too_many_lines,
    reason = "one story against real processes, told in order: each step starts from the state the last one left"
)]
async fn real_prometheus_history_agrees_with_the_trace() {
    let span: f64 = env_or("TESSERA_PROM_TEST_SPAN", 240.0); // seconds of trace replayed
    let chat_every: usize = env_or("TESSERA_PROM_TEST_CHAT_EVERY", 3);
    let tools_every: usize = env_or("TESSERA_PROM_TEST_TOOLS_EVERY", 7);
    let scale: f64 = env_or("TESSERA_PROM_TEST_LENGTH_SCALE", 0.6);
    // Every step is read from the same history: the finest ones are where a misplaced arrival shows.
    let steps: Vec<u64> = std::env::var("TESSERA_PROM_TEST_STEPS")
        .unwrap_or_else(|_| "10,5,2,1".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    const TAIL: f64 = 10.0; // after the last arrival, for the last requests to finish and be scraped
    let bin = prometheus_bin();
    let dir = tempfile::tempdir().unwrap();
    // Two models on their own emulators: chat is steady, tools is bursty with an idle stretch.
    let models: [(&str, &str, Vec<Req>); 2] = [
        (
            "chat",
            "qwen2-7b",
            trace(f64::MAX, f64::MAX, chat_every, 0, span, scale),
        ),
        (
            "tools",
            "llama-3.1-8b",
            trace(span * 0.25, span * 0.75, tools_every, 1, span, scale),
        ),
    ];
    let emulators: Vec<Tessera> = models
        .iter()
        .map(|(name, preset, _)| {
            Tessera::vllm_sim(&[
                "--served-model-name",
                name,
                "--model-preset",
                preset,
                "--seed",
                "1",
            ])
        })
        .collect();
    let targets: Vec<String> = emulators.iter().map(|e| format!("\"{}\"", e.addr)).collect();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: vllm\n    \
             static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        ),
    )
    .unwrap();
    let port = free_port();
    let prom = Killed(
        Command::new(&bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(if std::env::var_os("TESSERA_TEST_LOGS").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display())),
    );
    let base = format!("http://127.0.0.1:{port}");
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    wait_for(&c, &format!("{base}/-/ready"), "", Duration::from_secs(60)).await;
    // Both targets scraped at least once before the window opens.
    wait_for(
        &c,
        &format!("{base}/api/v1/query?query=count(up%3D%3D1)"),
        "\"2\"",
        Duration::from_secs(30),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let start = Instant::now() + Duration::from_secs(1);
    let start_unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        + 1.0;
    // Replay: every request at its time, as a client would send it (lengths exact: tessera_prompt_tokens and
    // ignore_eos with max_tokens).
    let mut tasks = Vec::new();
    for (m, ((name, _, reqs), emu)) in models.iter().zip(&emulators).enumerate() {
        for r in reqs.iter().copied() {
            let c = c.clone();
            let url = emu.url("/v1/completions");
            let name = name.to_string();
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep_until((start + Duration::from_secs_f64(r.at)).into()).await;
                let sent = start.elapsed().as_secs_f64();
                let body = json!({"model": name, "prompt": "x", "tessera_prompt_tokens": r.prompt,
                    "max_tokens": r.output, "ignore_eos": true});
                let resp = c.post(url).json(&body).send().await.unwrap();
                assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap_or_default());
                (m, sent, start.elapsed().as_secs_f64())
            }));
        }
    }
    // When each request was really sent and answered, seconds from `start`.
    let mut sent: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut done: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for t in tasks {
        let (m, s, d) = t.await.unwrap();
        sent[m].push(s);
        done[m].push(d);
    }
    let until = start_unix + span + TAIL;
    let wait = until
        - SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
        + 2.0;
    if wait > 0.0 {
        tokio::time::sleep(Duration::from_secs_f64(wait)).await;
    }
    let path = dir.path().to_path_buf();
    let since = format!("{}s", (span + TAIL) as u64);
    let until_s =
        humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs_f64(until.floor())).to_string();
    // The converter's grid starts `since` before the whole second `until`; `start` is this far into it.
    let offset = start_unix - (until.floor() - (span + TAIL));
    let mut observed = Vec::new();
    for &step in &steps {
        let out = tokio::task::spawn_blocking({
            let (path, base, since, until_s) = (path.clone(), base.clone(), since.clone(), until_s.clone());
            move || {
                simulate_in(
                    &path,
                    &[
                        "--prometheus",
                        &base,
                        "--since",
                        &since,
                        "--until",
                        &until_s,
                        "--step",
                        &format!("{step}s"),
                        "--write-scenario",
                        &format!("observed-{step}s.yaml"),
                        "--out",
                        &format!("observed-{step}s-report"),
                        "--model-preset",
                        "chat=qwen2-7b,tools=llama-3.1-8b",
                    ],
                    Duration::from_secs(300),
                )
            }
        })
        .await
        .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let yaml = std::fs::read_to_string(path.join(format!("observed-{step}s.yaml"))).unwrap();
        let sc: serde_yaml::Value = serde_yaml::from_str(&yaml).unwrap();
        // The same scenario as exact metrics at this step would give it: the requests each step really sent and
        // histograms of the true lengths. Beside it the history's GPU-hours show the conversion's own error, apart
        // from what no metric can say (which request was long, when within a step it came).
        let mut exact = sc.clone();
        // What the converter counted per step beside what really happened in it, model by model.
        let (mut off, mut requests_sent) = (0, 0);
        for (m, (name, _, reqs)) in models.iter().enumerate() {
            let o = model_of(&sc, name);
            let counted: Vec<u32> = o["traffic"]["observed"]["requests"]
                .as_str()
                .unwrap_or_default()
                .split_whitespace()
                .map(|w| w.parse().unwrap())
                .collect();
            let n = counted.len();
            let s = step as f64;
            let at = |v: &[f64]| per_step(&v.iter().map(|t| t + offset).collect::<Vec<_>>(), s, n);
            let (sent_per_step, done_per_step) = (at(&sent[m]), at(&done[m]));
            let misplaced = |v: &[u32]| -> u32 { v.iter().zip(&counted).map(|(a, b)| a.abs_diff(*b)).sum() };
            let total: u32 = sent_per_step.iter().sum();
            eprintln!(
                "{name} per {step}s step (shift {:?}): {total} requests, Σ|sent − counted| over the steps {} (with \
                 the finishes counted instead: {})\n  sent     {}\n  answered {}\n  counted  {}",
                o["traffic"]["observed"]["finish_to_arrival"],
                misplaced(&sent_per_step),
                misplaced(&done_per_step),
                line(&sent_per_step),
                line(&done_per_step),
                line(&counted)
            );
            assert_eq!(
                counted.iter().sum::<u32>(),
                total,
                "{name}: every request counted once"
            );
            off += misplaced(&sent_per_step);
            requests_sent += total;
            let e = &mut model_mut(&mut exact, name)["traffic"]["observed"];
            e["requests"] = line(&sent_per_step).into();
            for field in LENGTHS {
                let truth: Vec<u32> = reqs.iter().map(|r| r.length(field)).collect();
                e[field] = true_histogram(
                    &o["traffic"]["observed"][field],
                    &truth,
                    &format!("{name} {field}"),
                );
            }
        }
        std::fs::write(
            path.join(format!("exact-{step}s.yaml")),
            serde_yaml::to_string(&exact).unwrap(),
        )
        .unwrap();
        // Where the requests were counted, against where they were sent (both models): see ARRIVALS_OFF.
        if let Some(&(_, limit)) = ARRIVALS_OFF.iter().find(|(s, _)| *s == step) {
            assert!(
                f64::from(off) <= limit * f64::from(requests_sent),
                "at {step}s steps Σ|sent − counted| is {off} of {requests_sent} requests, over {:.0}%",
                limit * 100.0
            );
        }
        // What a history cannot say (which request had which lengths, when within a step it came) is drawn: the
        // mean over seeds is the history's answer (`--seeds` gives a user the spread).
        let from_prometheus = sweep(&path, &format!("observed-{step}s.yaml"), &[]);
        let from_exact = sweep(
            &path,
            &format!("exact-{step}s.yaml"),
            &["--strategies", "tessera"],
        )["tessera"]
            .0;
        observed.push((step, sc, stdout(&out), from_prometheus, from_exact));
    }
    let mut sc = observed[0].1.clone();
    for m in sc["models"].as_sequence_mut().unwrap() {
        let name = m["name"].as_str().unwrap().to_string();
        let reqs = &models.iter().find(|(n, _, _)| *n == name).unwrap().2;
        // The same models and settings as the observed scenario, the traffic from the trace itself. The CSV reader
        // starts a trace at its first request: a shift by that request's offset puts every request back at its time.
        let file = format!("{name}.csv");
        let mut rows = String::from("timestamp,prompt_tokens,output_tokens\n");
        for r in reqs {
            rows.push_str(&format!("{:.3},{},{}\n", r.at, r.prompt, r.output));
        }
        std::fs::write(path.join(&file), rows).unwrap();
        let first = reqs.first().map_or(0.0, |r| r.at);
        m["traffic"] = serde_yaml::to_value(json!({
            "trace": "csv", "file": file, "shift": format!("{}ms", (first * 1000.0).round() as u64),
            "window": format!("{}s", (span + TAIL) as u64),
        }))
        .unwrap();
    }
    sc["name"] = "trace".into();
    std::fs::write(path.join("trace.yaml"), serde_yaml::to_string(&sc).unwrap()).unwrap();
    let from_trace = sweep(&path, "trace.yaml", &[]);
    drop(prom);
    let requests = |o: &str| o.lines().next().unwrap_or_default().to_string();
    // The worst difference relative to its tolerance (1 is at the tolerance).
    let mut worst: f64 = 0.0;
    let mut tables = String::new();
    for (step, _, out, from_prometheus, _) in &observed {
        assert_eq!(
            from_prometheus.keys().collect::<Vec<_>>(),
            from_trace.keys().collect::<Vec<_>>()
        );
        let mut table = format!(
            "--step {step}s: {}\n| strategy | GPU-hours, trace | GPU-hours, Prometheus (mean; least–most) | \
             difference |\n|---|---:|---:|---:|\n",
            requests(out)
        );
        for (k, (t, _, _)) in &from_trace {
            let (p, lo, hi) = from_prometheus[k];
            let d = (p - t) / t;
            let tolerance = if k == "tessera" {
                TESSERA_TOLERANCE
            } else {
                TOLERANCE
            };
            worst = worst.max(d.abs() / tolerance);
            table.push_str(&format!(
                "| {k} | {t:.4} | {p:.4} ({lo:.4}–{hi:.4}) | {:+.1}% (±{:.0}%) |\n",
                d * 100.0,
                tolerance * 100.0
            ));
        }
        tables.push_str(&table);
    }
    // Tessera's difference from the trace, taken apart per step: what exact metrics at that step would give (the
    // information no metric holds), and what the history gives beside it (the conversion's own error).
    let trace_tessera = from_trace["tessera"].0;
    tables.push_str(
        "Tessera, where the difference comes from (GPU-hours, mean over the seeds)\n| step | trace | exact counts \
         per step, true histograms | Prometheus history | conversion error |\n|---|---:|---:|---:|---:|\n",
    );
    let (mut sum_exact, mut sum_prometheus) = (0.0, 0.0);
    for (step, _, _, from_prometheus, from_exact) in &observed {
        let p = from_prometheus["tessera"].0;
        tables.push_str(&format!(
            "| {step}s | {trace_tessera:.4} | {from_exact:.4} ({:+.1}%) | {p:.4} ({:+.1}%) | {:+.1}% |\n",
            (from_exact - trace_tessera) / trace_tessera * 100.0,
            (p - trace_tessera) / trace_tessera * 100.0,
            (p - from_exact) / from_exact * 100.0
        ));
        sum_exact += from_exact;
        sum_prometheus += p;
    }
    let conversion = (sum_prometheus - sum_exact) / sum_exact;
    tables.push_str(&format!(
        "over every step: conversion error {:+.1}% (±{:.0}%)\n",
        conversion * 100.0,
        CONVERSION_TOLERANCE * 100.0
    ));
    worst = worst.max(conversion.abs() / CONVERSION_TOLERANCE);
    eprintln!("{tables}\nworst at {:.2} of its tolerance", worst);
    if worst > 1.0 || std::env::var_os("TESSERA_KEEP_TEST_DIR").is_some() {
        // Keep the scenario files and Prometheus's data for a look (`tessera simulate FILE --explain`, or
        // `prometheus --storage.tsdb.path=DIR/data` to ask the history again).
        eprintln!("kept {}", dir.keep().display());
    }
    assert!(
        worst <= 1.0,
        "GPU-hours differ by more than the tolerance:\n{tables}"
    );
}
