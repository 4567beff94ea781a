//! The real `tessera sidecar` process against a local fake vLLM that serves the real KubeAI `/metrics` page
//! (testdata/vllm, Apache-2.0) with changing values: `/metrics` and `/v1/status` values, readiness, the
//! vLLM-down / garbage / slow paths, recovery, and a clean exit on SIGTERM.
#![allow(clippy::unwrap_used)]

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tessera_core::wire::sidecar::SidecarStatus;

mod support;
use support::Tessera;

const MODEL: &str = "neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8";

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Page,
    Status(u16),
    Garbage,
    Slow,
}

#[derive(Debug)]
struct Fake {
    base: String,
    mode: Mode,
    served: u32,
}

/// The real page at step `n`: KV usage 0.30 + 0.01·n, 1 waiting, and per step 10 more requests whose first
/// token came in the (0.04, 0.06] bucket, so the windowed TTFT median is known exactly.
fn page_at(base: &str, n: u32) -> String {
    let n = f64::from(n);
    let ttft_extra = |le: &str| {
        if le.parse::<f64>().map_or(true, |v| v >= 0.06) {
            10.0 * n
        } else {
            0.0
        }
    };
    base.lines()
        .map(|l| {
            let Some((series, value)) = l.rsplit_once(' ') else {
                return l.to_string();
            };
            let Ok(v) = value.parse::<f64>() else {
                return l.to_string();
            };
            let ours = series.contains(&format!("model_name=\"{MODEL}\""));
            let new = if !ours {
                v
            } else if series.starts_with("vllm:gpu_cache_usage_perc{") {
                0.30 + 0.01 * n
            } else if series.starts_with("vllm:num_requests_waiting{") {
                1.0
            } else if series.starts_with("vllm:time_to_first_token_seconds_bucket{") {
                let le = series
                    .split("le=\"")
                    .nth(1)
                    .and_then(|s| s.split('"').next())
                    .unwrap();
                v + ttft_extra(le)
            } else if series.starts_with("vllm:time_to_first_token_seconds_count{")
                || series.starts_with("vllm:request_success_total{")
            {
                v + 10.0 * n
            } else if series.starts_with("vllm:time_to_first_token_seconds_sum{") {
                v + 0.5 * n
            } else {
                v
            };
            format!("{series} {new}")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every answer closes its connection, so stopping the server really makes vLLM unreachable (axum's
/// per-connection tasks outlive an aborted `serve`).
async fn serve_metrics(State(fake): State<Arc<Mutex<Fake>>>) -> Response {
    let mut r = serve_mode(fake).await;
    r.headers_mut().insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    r
}

async fn serve_mode(fake: Arc<Mutex<Fake>>) -> Response {
    let (mode, body) = {
        let mut f = fake.lock().unwrap();
        f.served += 1;
        // The page stops changing after 10 steps so the test can check exact values.
        (f.mode, page_at(&f.base, f.served.min(10)))
    };
    match mode {
        Mode::Page => body.into_response(),
        Mode::Status(s) => (StatusCode::from_u16(s).unwrap(), "unavailable").into_response(),
        Mode::Garbage => "<html><body>502 Bad Gateway</body></html>".into_response(),
        Mode::Slow => {
            tokio::time::sleep(Duration::from_secs(5)).await;
            body.into_response()
        }
    }
}

struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    async fn get(&self, path: &str) -> Option<(u16, String)> {
        let r = self.http.get(format!("{}{path}", self.base)).send().await.ok()?;
        let status = r.status().as_u16();
        Some((status, r.text().await.ok()?))
    }

    async fn status(&self) -> SidecarStatus {
        let (code, body) = self.get("/v1/status").await.expect("sidecar answers /v1/status");
        assert_eq!(code, 200);
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("bad /v1/status JSON ({e}): {body}"))
    }

    async fn metric(&self, name_and_labels: &str) -> Option<f64> {
        let (_, body) = self.get("/metrics").await?;
        body.lines().find_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            // An empty label set (`name{}`, how prometheus-client writes a label-less family) is `name`.
            let k = k.strip_suffix("{}").unwrap_or(k);
            (k == name_and_labels).then(|| v.parse().ok())?
        })
    }

    /// Polls `/v1/status` until `pred` holds, or fails after `secs` with the last document.
    async fn wait_for(&self, what: &str, secs: u64, pred: impl Fn(&SidecarStatus) -> bool) -> SidecarStatus {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some((200, body)) = self.get("/v1/status").await
                && let Ok(s) = serde_json::from_str::<SidecarStatus>(&body)
                && pred(&s)
            {
                return s;
            }
            if Instant::now() > deadline {
                let last = self.get("/v1/status").await;
                panic!("timed out waiting for {what}; last /v1/status: {last:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The real vLLM page (Llama 3.1 8B FP8 under KubeAI) from testdata.
fn real_page() -> String {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../testdata/vllm/v0-metrics-kubeai-llama31-8b-fp8.txt"
    );
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e} (testdata is part of the repo)"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::too_many_lines,
    reason = "one story against real processes, told in order: each step starts from the state the last one left"
)]
async fn sidecar_against_a_fake_vllm() {
    let base = real_page();
    let fake = Arc::new(Mutex::new(Fake {
        base,
        mode: Mode::Status(503),
        served: 0,
    }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let vllm_addr: SocketAddr = listener.local_addr().unwrap();
    // vLLM's OpenAI model list, where the sidecar learns max_model_len when no flag gives it.
    let models = || async {
        axum::Json(serde_json::json!({"object": "list", "data": [
            {"id": MODEL, "object": "model", "max_model_len": 8192}
        ]}))
    };
    let app = Router::new()
        .route("/metrics", get(serve_metrics))
        .route("/v1/models", get(models))
        .with_state(fake.clone());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let vllm_url = format!("http://{vllm_addr}");
    let mut sidecar = quick_sidecar(
        &vllm_url,
        &["--scrape-timeout", "500ms", "--gpu-memory-mib", "23034"],
        &[],
    );
    let c = Client {
        http: reqwest::Client::new(),
        base: sidecar.base(),
    };

    // Up and live, but not ready while vLLM answers 503.
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.get("/live").await.is_none() {
        assert!(Instant::now() < deadline, "sidecar did not start serving");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let s = c
        .wait_for("an http_status error", 10, |s| {
            s.scrape.errors_total.contains_key("http_status")
        })
        .await;
    assert!(!s.ready && !s.vllm_up && s.latest.is_none());
    assert_eq!(c.get("/ready").await.unwrap().0, 503);
    // The injected sidecar's startup probe passes as soon as the sidecar serves, whatever vLLM does.
    assert_eq!(c.get("/startup").await.unwrap().0, 200);
    assert!(s.recommendation().is_none(), "no recommendation without data");
    // Unknown is absent, never 0 ("needs nothing") or NaN (breaks alert comparisons).
    let (_, page) = c.get("/metrics").await.unwrap();
    assert!(
        !page.contains("\ntessera_recommended_kv_cache_memory_bytes"),
        "no recommendation series before the first recommendation:\n{page}"
    );

    // vLLM answers: ready, values from the page, a recommendation after the window fills.
    fake.lock().unwrap().mode = Mode::Page;
    let s = c
        .wait_for("the page to settle and a recommendation", 20, |s| {
            s.latest
                .as_ref()
                .and_then(|l| l.kv_cache_usage_ratio)
                .is_some_and(|v| (v - 0.40).abs() < 1e-9)
                && s.recommendation().is_some()
        })
        .await;
    assert!(s.ready && s.vllm_up && !s.stale);
    assert_eq!(s.max_model_len, Some(8192), "learned from /v1/models");
    assert_eq!(c.get("/ready").await.unwrap().0, 200);
    let latest = s.latest.as_ref().unwrap();
    assert_eq!(
        latest.model_names,
        vec![MODEL.to_string(), "other/OTHER".to_string()]
    );
    assert_eq!(
        latest.requests_waiting,
        Some(4.0),
        "1 for our model + 3 for other/OTHER"
    );
    assert_eq!(
        latest.cache_config.get("num_gpu_blocks").map(String::as_str),
        Some("4574")
    );
    let w = s.window.as_ref().unwrap();
    assert!(w.samples >= 5);
    assert!(w.requests_per_second.unwrap() > 0.0);
    let p50 = w.ttft_seconds.p50.expect("requests finished in the window");
    assert!(
        p50 > 0.04 && p50 <= 0.06,
        "windowed TTFT p50 {p50} must lie in the (0.04, 0.06] bucket"
    );
    let rec = s.recommendation().unwrap();
    assert_eq!(rec.bytes_per_kv_token, 131_072);
    assert!(rec.kv_cache_memory_bytes > 0 && rec.gpu_memory_mib > 0 && rec.gpu_memory_mib <= 23_034);

    let model = format!("{{model_name=\"{MODEL}\"}}");
    let kv = c
        .metric(&format!("tessera_kv_cache_usage_ratio{model}"))
        .await
        .unwrap();
    assert!((kv - 0.40).abs() < 1e-9, "{kv}");
    assert_eq!(
        c.metric(&format!("tessera_requests_waiting{model}")).await,
        Some(1.0)
    );
    assert_eq!(
        c.metric("tessera_requests_waiting{model_name=\"other/OTHER\"}")
            .await,
        Some(3.0)
    );
    assert_eq!(
        c.metric(&format!("tessera_requests_running{model}")).await,
        Some(3.0)
    );
    assert_eq!(
        c.metric(&format!("tessera_preemptions_total{model}")).await,
        Some(0.0)
    );
    assert_eq!(c.metric("tessera_vllm_up").await, Some(1.0));
    let q95 = c.metric("tessera_ttft_seconds{quantile=\"0.95\"}").await;
    assert!(q95.is_some_and(|v| v > 0.04 && v <= 0.06), "{q95:?}");
    for name in [
        "tessera_recommended_gpu_memory_utilization",
        "tessera_recommended_kv_cache_memory_bytes",
        "tessera_recommended_gpu_memory_mib",
        "tessera_recommended_gpu_compute_fraction",
    ] {
        let v = c.metric(name).await.unwrap_or_else(|| panic!("{name} missing"));
        assert!(v.is_finite() && v > 0.0, "{name} = {v}");
    }
    // No latency objective: GPU busy time is no evidence a smaller share is safe, so the share stays whole.
    assert_eq!(rec.compute_fraction, 1.0);
    assert!(
        rec.reasons
            .iter()
            .any(|r| r.code == tessera_core::recommend::ReasonCode::NoLatencyObjective)
    );
    assert_eq!(s.compute.unwrap().current_share, 1.0);
    assert_eq!(c.metric("tessera_gpu_compute_fraction").await, Some(1.0));
    let before = c.status().await;
    let rec_before = before.recommendation().unwrap().clone();

    // Garbage: parse errors, stale, last good values kept, the recommendation unchanged.
    fake.lock().unwrap().mode = Mode::Garbage;
    let s = c
        .wait_for("a parse error", 10, |s| {
            s.scrape.errors_total.get("parse").is_some_and(|n| *n >= 2)
        })
        .await;
    assert!(!s.vllm_up && s.stale && s.ready);
    assert_eq!(s.scrape.last_error.as_ref().unwrap().reason, "parse");
    assert_eq!(s.latest.as_ref().unwrap().kv_cache_usage_ratio, Some(0.40));
    assert_eq!(
        s.recommendation(),
        Some(&rec_before),
        "bad data never changes the recommendation"
    );
    assert_eq!(c.metric("tessera_vllm_up").await, Some(0.0));
    assert!(
        c.metric("tessera_scrape_errors_total{reason=\"parse\"}")
            .await
            .unwrap()
            >= 2.0
    );

    // Recovery.
    fake.lock().unwrap().mode = Mode::Page;
    c.wait_for("recovery", 10, |s| s.vllm_up && !s.stale).await;
    assert_eq!(c.metric("tessera_vllm_up").await, Some(1.0));

    // Slow: times out after --scrape-timeout.
    fake.lock().unwrap().mode = Mode::Slow;
    let s = c
        .wait_for("a timeout", 10, |s| s.scrape.errors_total.contains_key("timeout"))
        .await;
    assert!(s.stale);
    fake.lock().unwrap().mode = Mode::Page;
    c.wait_for("recovery after slowness", 10, |s| s.vllm_up).await;

    // vLLM gone: connection errors, still serving the last good state.
    server.abort();
    let _ = server.await;
    let s = c
        .wait_for("connect errors", 10, |s| {
            s.scrape.errors_total.get("connect").is_some_and(|n| *n >= 2)
        })
        .await;
    assert!(s.stale && !s.vllm_up);
    assert_eq!(s.latest.as_ref().unwrap().kv_cache_usage_ratio, Some(0.40));
    assert!(
        c.metric("tessera_scrape_errors_total{reason=\"connect\"}")
            .await
            .unwrap()
            >= 2.0
    );
    assert_eq!(c.get("/live").await.unwrap().0, 200);

    // SIGTERM: exits 0 promptly.
    let code = support::terminate(&mut sidecar.child, Duration::from_secs(10)).await;
    assert!(code.success(), "exit status {code:?}");
}

/// The real vLLM page (Llama 3.1 8B FP8 under KubeAI: 4,574 blocks of 16 tokens) served as [`page_at`] moves
/// it. Returns its URL and the server task.
async fn serve_the_real_page() -> (String, tokio::task::JoinHandle<std::io::Result<()>>) {
    let base = real_page();
    let fake = Arc::new(Mutex::new(Fake {
        base,
        mode: Mode::Page,
        served: 0,
    }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let vllm_addr: SocketAddr = listener.local_addr().unwrap();
    let app = Router::new()
        .route("/metrics", get(serve_metrics))
        .with_state(fake);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{vllm_addr}"), server)
}

/// The real sidecar on `vllm_url` with the page's model (131,072 KV bytes per token), plus `extra` and `env`.
fn quick_sidecar(vllm_url: &str, extra: &[&str], env: &[(&str, &str)]) -> Tessera {
    let mut args = vec!["--bytes-per-kv-token", "131072"];
    args.extend_from_slice(extra);
    Tessera::quick_sidecar(vllm_url, &args, env)
}

/// The KV floor through the real binary: two sidecars on the same page (73,184 tokens of cache, 40% used) with
/// `--max-model-len 65536`. Without a KV target the shrink is bounded by the 10% step (65,866 tokens, above one
/// sequence); with `--kv-target-utilization 0.7` (what the webhook passes from `targets.kvCacheUtilization`) the
/// cache must hold that sequence below 70%: 65,536 / 0.7 → 93,623, rounded up to whole blocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kv_floor_sits_one_sequence_below_the_replica_counts_target() {
    let (vllm_url, server) = serve_the_real_page().await;
    let flags = ["--gpu-memory-mib", "81920", "--max-model-len", "65536"];
    let plain = quick_sidecar(&vllm_url, &flags, &[]);
    let below = quick_sidecar(&vllm_url, &flags, &[("TESSERA_KV_TARGET_UTILIZATION", "0.7")]);
    let mut tokens = Vec::new();
    for sidecar in [&plain, &below] {
        let c = Client {
            http: reqwest::Client::new(),
            base: sidecar.base(),
        };
        let s = c
            .wait_for("a recommendation", 20, |s| s.recommendation().is_some())
            .await;
        let rec = s.recommendation().unwrap().clone();
        tokens.push((rec.kv_cache_tokens, rec.reasons));
    }
    use tessera_core::recommend::ReasonCode;
    let (plain_tokens, plain_reasons) = &tokens[0];
    assert_eq!(*plain_tokens, 65_872, "{plain_reasons:?}");
    assert!(
        plain_reasons
            .iter()
            .any(|r| r.code == ReasonCode::StepLimitedDown),
        "{plain_reasons:?}"
    );
    let (below_tokens, below_reasons) = &tokens[1];
    assert_eq!(*below_tokens, 93_632, "{below_reasons:?}");
    assert!(
        below_reasons.iter().any(|r| r.code == ReasonCode::MinimumSequence
            && r.message.contains("below the replica count's KV target (70%)")),
        "{below_reasons:?}"
    );
    server.abort();
}

/// The namespace token the sidecars below are started with (what the webhook injects).
const OBJECTIVE_TOKEN: &str = "5d41402abc4b2a76b9719d911017c5925d41402abc4b2a76b9719d911017c592";

/// A sidecar on the real page's fake, running at half a GPU under a 2 s TTFT objective: the share rule's
/// starting point for the two tests below.
async fn half_share_under_two_seconds() -> (Tessera, Client, tokio::task::JoinHandle<std::io::Result<()>>) {
    let (vllm_url, server) = serve_the_real_page().await;
    let sidecar = quick_sidecar(
        &vllm_url,
        &["--gpu-memory-mib", "23034", "--max-model-len", "8192"],
        &[
            ("TESSERA_TTFT_SLO", "2s"),
            ("TESSERA_GPU_COMPUTE_FRACTION", "0.5"),
            ("TESSERA_OBJECTIVE_TOKEN", OBJECTIVE_TOKEN),
        ],
    );
    let c = Client {
        http: reqwest::Client::new(),
        base: sidecar.base(),
    };
    (sidecar, c, server)
}

/// With a TTFT objective and a replica well inside it, the recommended compute share drops from the share it runs
/// with — by one bounded step, not to what the ratio alone would give.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_ttft_under_an_objective_shrinks_the_share_by_a_bounded_step() {
    let (_sidecar, c, server) = half_share_under_two_seconds().await;
    // The fake adds 10 requests per scrape with TTFT in (0.04, 0.06] for ten scrapes: 20+ in the window.
    let s = c
        .wait_for("a compute share from latency", 20, |s| {
            s.window
                .as_ref()
                .and_then(|w| w.ttft_seconds.count)
                .is_some_and(|n| n >= 20.0)
                && s.recommendation().is_some()
        })
        .await;
    let compute = s.compute.expect("the sidecar reports its compute settings");
    assert_eq!(compute.current_share, 0.5);
    assert_eq!(compute.ttft_slo_secs, Some(2.0));
    let p95 = s.window.as_ref().unwrap().ttft_seconds.p95.unwrap();
    assert!(p95 > 0.04 && p95 <= 0.06, "{p95}");
    let rec = s.recommendation().unwrap();
    // p95 ≈ 0.06 s against a 1 s target (half the 2 s objective) asks for 0.5 × 0.06 = 0.03; one update may
    // take 25% off what runs: 0.375, rounded up to 0.38.
    assert_eq!(rec.compute_fraction, 0.38, "{:?}", rec.reasons);
    let codes: Vec<_> = rec.reasons.iter().map(|r| r.code).collect();
    use tessera_core::recommend::ReasonCode;
    assert!(codes.contains(&ReasonCode::LatencyUnderObjective), "{codes:?}");
    assert!(codes.contains(&ReasonCode::StepLimitedDown), "{codes:?}");
    assert_eq!(
        c.metric("tessera_recommended_gpu_compute_fraction").await,
        Some(0.38)
    );
    assert_eq!(c.metric("tessera_gpu_compute_fraction").await, Some(0.5));
    server.abort();
}

/// The objective the controller hands over (`PUT /v1/objective`, an InferenceAutoscaler edit) replaces the
/// `--ttft-slo` the sidecar started with, without a restart: the same window that shrank the share under 2 s grows
/// it under 50 ms (the p95 ≈ 0.06 s is over half of that), and `/v1/status` reports the objective held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_objective_handed_over_moves_the_share_rule_without_a_restart() {
    let (_sidecar, c, server) = half_share_under_two_seconds().await;
    let shrunk = c
        .wait_for("a share from latency under the 2 s objective", 20, |s| {
            s.recommendation().is_some_and(|r| r.compute_fraction < 0.5)
        })
        .await;
    assert_eq!(shrunk.compute.unwrap().ttft_slo_percentile, Some(95));
    let put = |auth: Option<&str>| {
        let mut r = c
            .http
            .put(format!("{}/v1/objective", c.base))
            .json(&serde_json::json!({"ttftSloSecs": 0.05, "ttftSloPercentile": 95}));
        if let Some(t) = auth {
            r = r.bearer_auth(t);
        }
        r.send()
    };
    // Any pod can reach the port: without this namespace's token the objective is refused (issue 53, N7).
    assert_eq!(put(None).await.unwrap().status().as_u16(), 401);
    assert_eq!(put(Some("not-the-token")).await.unwrap().status().as_u16(), 401);
    assert_eq!(c.status().await.compute.unwrap().ttft_slo_secs, Some(2.0));
    assert_eq!(put(Some(OBJECTIVE_TOKEN)).await.unwrap().status().as_u16(), 204);
    let compute = c.status().await.compute.unwrap();
    assert_eq!(compute.ttft_slo_secs, Some(0.05));
    use tessera_core::recommend::ReasonCode;
    let grown = c
        .wait_for("a share from latency over the 50 ms objective", 20, |s| {
            s.recommendation().is_some_and(|r| {
                r.compute_fraction > 0.5
                    && r.reasons
                        .iter()
                        .any(|r| r.code == ReasonCode::LatencyOverObjective)
            })
        })
        .await;
    assert_eq!(
        grown.compute.unwrap().current_share,
        0.5,
        "the share it runs with is the pod's"
    );
    server.abort();
}

/// Each bad flag stops the sidecar at start, and the error names it (and, where it helps, the valid range).
#[test]
fn bad_flags_are_named() {
    for (flag, value, said) in [
        (
            "--vllm-url",
            "localhost:8000",
            "--vllm-url \"localhost:8000\" must be an http:// or https:// URL",
        ),
        ("--percentile", "1.5", "percentile"),
        ("--gpu-compute-fraction", "1.5", "--gpu-compute-fraction"),
        (
            "--kv-target-utilization",
            "70",
            "--kv-target-utilization 70 must be in (0, 1]",
        ),
        ("--ttft-slo", "fast", "--ttft-slo"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["sidecar", flag, value, "--listen", "127.0.0.1:0", "--no-nvml"])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{flag} {value} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(said), "{flag} {value}: {err}");
    }
}

/// The gpu-agent on a machine without NVML (like this one): it serves, says why it has no data, is not
/// ready, and exits 0 on SIGTERM. Where NVML *is* present the test only checks that it serves and exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_agent_without_nvml_serves_and_says_why() {
    let mut agent = Tessera::start(&["gpu-agent", "--listen", "127.0.0.1:0", "--interval", "100ms"]);
    let c = Client {
        http: reqwest::Client::new(),
        base: agent.base(),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let doc: tessera_core::wire::sidecar::GpuAgentStatus = loop {
        if let Some((200, body)) = c.get("/v1/gpus").await {
            let d: tessera_core::wire::sidecar::GpuAgentStatus = serde_json::from_str(&body).unwrap();
            if d.error.as_deref() != Some("no reading yet") {
                break d;
            }
        }
        assert!(Instant::now() < deadline, "gpu-agent did not serve a reading");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let nvml_present = doc.nvml_up;
    if !nvml_present {
        assert!(doc.error.as_deref().unwrap().contains("NVML"), "{doc:?}");
        assert!(doc.devices.is_empty());
        assert_eq!(c.get("/ready").await.unwrap().0, 503);
        assert_eq!(c.metric("tessera_gpu_agent_nvml_up").await, Some(0.0));
    }
    assert_eq!(c.get("/live").await.unwrap().0, 200);
    let code = support::terminate(&mut agent.child, Duration::from_secs(10)).await;
    assert!(code.success(), "{code:?}");
}
