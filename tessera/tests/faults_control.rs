//! Fault injection, control plane: real `tessera` processes over loopback fed what production feeds them on a bad
//! day. Each scenario is bounded in time, asserts its outcome and prints one line of figures.
//!
//! The sidecar against a vLLM that serves garbage, an empty page, a 100 MiB page, a page that never ends, and
//! counters that go backwards: it stays up (`/live`), never recommends from bad data, and its memory stays bounded
//! (resident set read from `/proc/<pid>/status`).
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tessera_core::wire::sidecar::SidecarStatus;

mod support;
use support::Tessera;

/// What the fake vLLM answers on `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Feed {
    /// A small valid vLLM page whose counters are `n`.
    Good(u64),
    /// Bytes that are not the exposition format.
    Garbage,
    /// 200 with an empty body.
    Empty,
    /// A 100 MiB body, streamed without a Content-Length.
    Huge,
    /// A valid-looking body that never ends.
    Endless,
}

type Shared = Arc<Mutex<Feed>>;

fn good_page(n: u64) -> String {
    let m = "model_name=\"m\"";
    format!(
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{{m}}} 1\n\
         vllm:num_requests_waiting{{{m}}} 0\nvllm:gpu_cache_usage_perc{{{m}}} 0.25\n\
         vllm:num_preemptions_total{{{m}}} {n}\nvllm:prompt_tokens_total{{{m}}} {}\n\
         vllm:generation_tokens_total{{{m}}} {}\n\
         vllm:request_success_total{{finished_reason=\"stop\",{m}}} {n}\n\
         vllm:cache_config_info{{block_size=\"16\",num_gpu_blocks=\"1000\",gpu_memory_utilization=\"0.9\"}} 1\n\
         vllm:time_to_first_token_seconds_bucket{{{m},le=\"0.1\"}} {n}\n\
         vllm:time_to_first_token_seconds_bucket{{{m},le=\"+Inf\"}} {n}\n\
         vllm:time_to_first_token_seconds_count{{{m}}} {n}\nvllm:time_to_first_token_seconds_sum{{{m}}} 1\n",
        n * 100,
        n * 50
    )
}

async fn metrics(State(s): State<Shared>) -> Response {
    let feed = *s.lock().unwrap();
    match feed {
        Feed::Good(n) => good_page(n).into_response(),
        Feed::Garbage => Response::new(Body::from(
            (0..4096u32)
                .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
                .collect::<Vec<u8>>(),
        )),
        Feed::Empty => "".into_response(),
        Feed::Huge => {
            let chunk = bytes_of_lines(1 << 20);
            let stream = futures::stream::iter((0..100).map(move |_| Ok::<_, std::io::Error>(chunk.clone())));
            Response::new(Body::from_stream(stream))
        }
        Feed::Endless => {
            let chunk = bytes_of_lines(64 * 1024);
            let stream = futures::stream::unfold(chunk, |c| async move {
                tokio::time::sleep(Duration::from_millis(1)).await;
                Some((Ok::<_, std::io::Error>(c.clone()), c))
            });
            Response::new(Body::from_stream(stream))
        }
    }
}

/// About `len` bytes of valid-looking sample lines.
fn bytes_of_lines(len: usize) -> Vec<u8> {
    let line = b"vllm:num_requests_running{model_name=\"m\"} 1\n";
    line.iter()
        .copied()
        .cycle()
        .take(len / line.len() * line.len())
        .collect()
}

/// Resident memory of a process, KiB (0 once it is gone).
fn rss_kib(pid: u32) -> u64 {
    support::proc_status_kib(pid, "VmRSS").unwrap_or(0)
}

async fn status(http: &reqwest::Client, base: &str) -> SidecarStatus {
    let body = support::get_text(http, &format!("{base}/v1/status")).await;
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("bad /v1/status ({e}): {body}"))
}

/// Waits until the sidecar has made `n` more scrape attempts (successes or errors) than `since`.
async fn attempts_after(http: &reqwest::Client, base: &str, since: u64, n: u64) -> SidecarStatus {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = status(http, base).await;
        let attempts = s.scrape.successes_total + s.scrape.errors_total.values().sum::<u64>();
        if attempts >= since + n {
            return s;
        }
        assert!(Instant::now() < deadline, "the sidecar stopped scraping: {s:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn attempts(s: &SidecarStatus) -> u64 {
    s.scrape.successes_total + s.scrape.errors_total.values().sum::<u64>()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_fed_bad_pages_stays_up_bounded_and_never_recommends_from_them() {
    let feed: Shared = Arc::new(Mutex::new(Feed::Garbage));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let vllm: SocketAddr = listener.local_addr().unwrap();
    let app = Router::new()
        .route("/metrics", get(metrics))
        .with_state(feed.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let sidecar = Tessera::sidecar(
        &format!("http://{vllm}"),
        &[
            "--scrape-interval",
            "100ms",
            "--scrape-timeout",
            "1s",
            "--no-nvml",
            "--gpu-memory-mib",
            "24000",
            "--max-model-len",
            "4096",
        ],
    );
    let base = sidecar.base();
    let pid = sidecar.child.id();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let baseline = rss_kib(pid);
    let mut peak = baseline;
    for bad in [Feed::Garbage, Feed::Empty, Feed::Huge, Feed::Endless] {
        *feed.lock().unwrap() = bad;
        let t0 = Instant::now();
        let before = attempts(&status(&http, &base).await);
        let s = attempts_after(&http, &base, before, 3).await;
        peak = peak.max(rss_kib(pid));
        let live = http.get(format!("{base}/live")).send().await.unwrap().status();
        assert!(live.is_success(), "{bad:?}: /live {live}");
        assert!(
            !s.vllm_up && s.stale,
            "{bad:?}: a bad page is not a good scrape: {s:?}"
        );
        assert!(s.recommendation().is_none(), "{bad:?}: recommended from bad data");
        let reason = s.scrape.last_error.as_ref().map_or("none", |e| e.reason.as_str());
        println!(
            "fault sidecar feed={bad:?} attempts={} last_error={reason} rss_kib={} took_ms={}",
            attempts(&s) - before,
            rss_kib(pid),
            t0.elapsed().as_millis()
        );
    }
    // Counters that go backwards (vLLM restarted): read as a restart, never as negative rates.
    *feed.lock().unwrap() = Feed::Good(1000);
    let before = attempts(&status(&http, &base).await);
    attempts_after(&http, &base, before, 3).await;
    *feed.lock().unwrap() = Feed::Good(10);
    let before = attempts(&status(&http, &base).await);
    let s = attempts_after(&http, &base, before, 3).await;
    assert!(s.vllm_up && !s.stale, "{s:?}");
    let w = s.window.expect("a window of good scrapes");
    for (name, v) in [
        ("preemptions", w.preemptions),
        ("requests_per_second", w.requests_per_second),
        ("prompt_tokens_per_second", w.prompt_tokens_per_second),
    ] {
        assert!(
            v.is_none_or(|v| v >= 0.0),
            "{name} negative after counters went backwards: {v:?}"
        );
    }
    peak = peak.max(rss_kib(pid));
    println!(
        "fault sidecar counters_backwards window_samples={} rps={:?} rss_baseline_kib={baseline} rss_peak_kib={peak}",
        w.samples, w.requests_per_second
    );
    // The scrape body is capped (8 MiB): a 100 MiB or endless page must not grow the process by anything like it.
    assert!(
        peak < baseline + 48 * 1024,
        "resident set grew from {baseline} KiB to {peak} KiB on bad pages"
    );
}

// ---------------------------------------------------------------------------------------------------------------
// The controller against the in-memory API server (support/apiserver.rs): restart mid scale-up, leader partition.

use serde_json::{Value, json};
use support::apiserver::{ApiServer, DEPLOYMENTS, IAS, LEASES, PODS};

/// A child process killed on drop.
struct Proc(std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `tessera autoscaler` against `api` (through `server`, which may be a proxy in front of it), deciding every
/// second, with a short lease so elections play out in seconds; returns it once it serves its metrics, with their
/// port. Should its port be taken before it binds (`free_port` picks outside the ephemeral range, but anything
/// else on the machine may still bind it), the controller exits on the bind error and is started again on
/// another port.
async fn controller(identity: &str, dir: &tempfile::TempDir, server: SocketAddr) -> (Proc, u16) {
    for _ in 0..5 {
        let port = support::free_port();
        let mut proc = spawn_controller(identity, dir, server, port);
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(30) {
            if proc.0.try_wait().ok().flatten().is_some() {
                break;
            }
            // Its own metrics (another process on the port would not have the leader gauge).
            if leading(port).await.is_some() {
                return (proc, port);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    panic!("tessera autoscaler {identity} exited at start five times, or never served its metrics");
}

fn spawn_controller(identity: &str, dir: &tempfile::TempDir, server: SocketAddr, metrics_port: u16) -> Proc {
    let kubeconfig = dir.path().join(format!("kubeconfig-{identity}"));
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster: {{server: \"http://{server}\"}}\n\
             users:\n- name: u\n  user: {{}}\ncontexts:\n- name: c\n  context: {{cluster: fake, user: u, \
             namespace: default}}\ncurrent-context: c\n"
        ),
    )
    .unwrap();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "autoscaler",
            "--sync-period",
            "1s",
            "--lease-namespace",
            "default",
            "--identity",
            identity,
        ])
        .args([
            "--lease-duration",
            "4s",
            "--renew-deadline",
            "2s",
            "--retry-period",
            "300ms",
        ])
        .args(["--metrics-listen", &format!("127.0.0.1:{metrics_port}")])
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", "info,kube=warn")
        .stdout(std::process::Stdio::null())
        .stderr(if std::env::var_os("TESSERA_TEST_LOGS").is_some() {
            std::process::Stdio::inherit()
        } else {
            std::process::Stdio::null()
        })
        .spawn()
        .expect("start tessera autoscaler");
    Proc(child)
}

/// A fake sidecar reporting KV usage `kv` with work running (so the model is never idle), and how many times it
/// was read (each round reads every ready replica's sidecar once).
async fn fake_sidecar(kv: f64) -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = reads.clone();
    let app = Router::new().route(
        "/v1/status",
        get(move || async move {
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs_f64();
            axum::Json(json!({
                "schema_version": 1, "generated_at": now, "vllm_url": "http://127.0.0.1:8000", "vllm_up": true,
                "ready": true, "stale": false, "scrape": {"interval_secs": 1.0, "successes_total": 5},
                "latest": {"at": now, "kv_cache_usage_ratio": kv, "requests_running": 3.0, "requests_waiting": 0.0},
                "recommendation": {"outcome": {"state": "not_yet", "code": "too_few_samples", "reason": "test"}}
            }))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, reads)
}

fn pod(i: usize, ready: bool, sidecar: SocketAddr) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": format!("llama-{i}"), "labels": {"app": "llama"},
                        "annotations": {"tessera.dev/sidecar-port": sidecar.port().to_string()}},
           "status": {"podIP": "127.0.0.1", "phase": "Running",
                      "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}})
}

/// A Deployment at 2 replicas (2 ready pods at 90% KV), and an InferenceAutoscaler targeting 50% KV.
async fn model_at_kv_pressure(api: &ApiServer) -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    let (sidecar, reads) = fake_sidecar(0.9).await;
    api.put(
        DEPLOYMENTS,
        "models",
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "llama"},
               "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "llama"}}}}),
    );
    for i in 0..2 {
        api.put(PODS, "models", pod(i, true, sidecar));
    }
    api.put(
        IAS,
        "models",
        json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "InferenceAutoscaler", "metadata": {"name": "llama"},
               "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"},
                        "maxReplicas": 10, "targets": {"kvCacheUtilization": 0.5},
                        "behavior": {"panic": {"enabled": false}}}}),
    );
    (sidecar, reads)
}

async fn eventually(what: &str, within: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < within,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    t0.elapsed()
}

fn scale_patches(api: &ApiServer) -> usize {
    api.requests()
        .iter()
        .filter(|r| r.starts_with("PATCH ") && r.contains("/deployments/llama/scale"))
        .count()
}

/// Restart the controller mid scale-up: the new replicas are still starting when it dies. The restarted one counts
/// them (they are not ready: 0% on the way up) and neither scales again nor loses the status the first one wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarting_the_controller_mid_scale_up_neither_scales_twice_nor_loses_status() {
    let api = ApiServer::start().await;
    let (sidecar, reads) = model_at_kv_pressure(&api).await;
    let dir = tempfile::tempdir().unwrap();
    let (first, _) = controller("ctl-0", &dir, api.addr).await;
    let replicas =
        |api: &ApiServer| api.get(DEPLOYMENTS, "models", "llama").unwrap()["spec"]["replicas"].clone();
    let t_scale = eventually("the scale-up 2 -> 4", Duration::from_secs(30), || {
        replicas(&api) == json!(4)
    })
    .await;
    // The Deployment controller's part: two new pods, not ready yet (a model takes minutes to load).
    for i in 2..4 {
        api.put(PODS, "models", pod(i, false, sidecar));
    }
    let status = |api: &ApiServer| api.get(IAS, "models", "llama").unwrap()["status"].clone();
    eventually("the status of the scale", Duration::from_secs(10), || {
        status(&api)["desiredReplicas"] == json!(4) && !status(&api)["lastScaleTime"].is_null()
    })
    .await;
    let written = status(&api);
    drop(first); // kill -9
    let before = reads.load(std::sync::atomic::Ordering::Relaxed);
    let (second, _) = controller("ctl-0", &dir, api.addr).await;
    // Let the restarted controller decide several times (sync 1 s): each round reads the two ready replicas'
    // sidecar (its /scale comes from its Deployment watch, not a request to count).
    eventually(
        "the restarted controller's reconciles",
        Duration::from_secs(30),
        || reads.load(std::sync::atomic::Ordering::Relaxed) >= before + 6,
    )
    .await;
    drop(second);
    let after = status(&api);
    println!(
        "fault controller_restart scale_up_ms={} scale_patches={} replicas={} last_scale_time_kept={}",
        t_scale.as_millis(),
        scale_patches(&api),
        replicas(&api),
        after["lastScaleTime"] == written["lastScaleTime"]
    );
    assert_eq!(
        replicas(&api),
        json!(4),
        "the starting replicas were scaled again"
    );
    assert_eq!(scale_patches(&api), 1, "one scale, not two: {:?}", api.requests());
    assert_eq!(after["desiredReplicas"], json!(4));
    assert_eq!(
        after["lastScaleTime"], written["lastScaleTime"],
        "the first controller's status was lost"
    );
}

/// A TCP proxy in front of the API server whose traffic can be cut (connections stay open, nothing crosses).
struct Partition {
    addr: SocketAddr,
    cut: Arc<std::sync::atomic::AtomicBool>,
}

async fn pump(
    cut: Arc<std::sync::atomic::AtomicBool>,
    mut r: tokio::net::tcp::OwnedReadHalf,
    mut w: tokio::net::tcp::OwnedWriteHalf,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let Ok(n) = r.read(&mut buf).await else { return };
        if n == 0 {
            return;
        }
        if cut.load(std::sync::atomic::Ordering::SeqCst) {
            // A partition: the bytes are lost and the connection hangs.
            std::future::pending::<()>().await;
        }
        if w.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

async fn proxy(to: SocketAddr) -> Partition {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let c = cut.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let cut = c.clone();
            tokio::spawn(async move {
                if cut.load(std::sync::atomic::Ordering::SeqCst) {
                    // New connections during a partition are accepted and go nowhere.
                    let _keep = &client;
                    std::future::pending::<()>().await;
                }
                let Ok(server) = tokio::net::TcpStream::connect(to).await else {
                    return;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                let up = tokio::spawn(pump(cut.clone(), cr, sw));
                let down = tokio::spawn(pump(cut, sr, cw));
                let _ = tokio::join!(up, down);
            });
        }
    });
    Partition { addr, cut }
}

async fn leading(metrics_port: u16) -> Option<bool> {
    let url = format!("http://127.0.0.1:{metrics_port}/metrics");
    support::first_sample(&url, "tessera_autoscaler_leader")
        .await
        .map(|v| v == 1.0)
}

/// Partition the leader from the API: it must stop leading (renew deadline 2 s) before the follower can take over
/// (lease 4 s after the follower last saw it renewed) — never two leaders at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_steps_down_before_a_follower_takes_over() {
    let api = ApiServer::start().await;
    model_at_kv_pressure(&api).await;
    let dir = tempfile::tempdir().unwrap();
    let (pa, pb) = (proxy(api.addr).await, proxy(api.addr).await);
    let (_a, ma) = controller("ctl-a", &dir, pa.addr).await;
    let holder = |api: &ApiServer| {
        api.get(LEASES, "default", "tessera-autoscaler")
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
    };
    eventually("ctl-a to lead", Duration::from_secs(30), || {
        holder(&api).as_deref() == Some("ctl-a")
    })
    .await;
    let (_b, mb) = controller("ctl-b", &dir, pb.addr).await;
    // ctl-b is up and following.
    let t0 = Instant::now();
    while leading(mb).await != Some(false) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "ctl-b never served its metrics"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(leading(ma).await, Some(true));
    pa.cut.store(true, std::sync::atomic::Ordering::SeqCst);
    let cut_at = Instant::now();
    let mut stepped_down = None;
    let mut taken_over = None;
    while (stepped_down.is_none() || taken_over.is_none()) && cut_at.elapsed() < Duration::from_secs(30) {
        if stepped_down.is_none() && leading(ma).await == Some(false) {
            stepped_down = Some(cut_at.elapsed());
        }
        if taken_over.is_none() && holder(&api).as_deref() == Some("ctl-b") {
            taken_over = Some(cut_at.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (down, over) = (
        stepped_down.expect("the partitioned leader never stepped down"),
        taken_over.expect("the follower never took over"),
    );
    println!(
        "fault leader_partition stepped_down_ms={} follower_took_over_ms={}",
        down.as_millis(),
        over.as_millis()
    );
    assert!(down < over, "two leaders for {:?}", over.saturating_sub(down));
    assert!(
        down <= Duration::from_millis(2_500),
        "stepped down {down:?} after the cut (renew deadline 2 s)"
    );
}
