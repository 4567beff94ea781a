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
            (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect::<Vec<u8>>(),
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
    line.iter().copied().cycle().take(len / line.len() * line.len()).collect()
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

async fn status(http: &reqwest::Client, base: &str) -> SidecarStatus {
    let body = http
        .get(format!("{base}/v1/status"))
        .send()
        .await
        .expect("the sidecar answers /v1/status")
        .text()
        .await
        .unwrap();
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
    let app = Router::new().route("/metrics", get(metrics)).with_state(feed.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let sidecar = Tessera::start(&[
        "sidecar",
        "--vllm-url",
        &format!("http://{vllm}"),
        "--listen",
        "127.0.0.1:0",
        "--scrape-interval",
        "100ms",
        "--scrape-timeout",
        "1s",
        "--no-nvml",
        "--gpu-memory-mib",
        "24000",
        "--max-model-len",
        "4096",
    ]);
    let base = sidecar.base();
    let pid = sidecar.child.id();
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
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
        assert!(!s.vllm_up && s.stale, "{bad:?}: a bad page is not a good scrape: {s:?}");
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
        assert!(v.is_none_or(|v| v >= 0.0), "{name} negative after counters went backwards: {v:?}");
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
