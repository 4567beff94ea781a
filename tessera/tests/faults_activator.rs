//! Fault injection against `tessera activator` as a real process over loopback: backends killed with SIGKILL
//! mid-stream and under load, a backend that resets after accepting, 2,000 requests held at zero, slowloris
//! clients and a 50 MiB body, and SIGTERM with requests still held.
//!
//! Each scenario asserts its outcome, is bounded in time (every wait has a deadline; children die on drop), and
//! prints one line of figures starting with `FAULT` (run with `--nocapture` to see them).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::{get, post};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod support;
use support::{Tessera, free_port, http_client, sigterm};

const WAIT: Duration = Duration::from_secs(30);

fn client() -> reqwest::Client {
    http_client(Duration::from_secs(60))
}

fn chat(model: &str) -> serde_json::Value {
    serde_json::json!({ "model": model, "max_tokens": 8, "messages": [{ "role": "user", "content": "hi" }] })
}

/// Resident memory of a process, KiB, from `/proc/<pid>/status`.
fn rss_kib(pid: u32) -> u64 {
    support::proc_status_kib(pid, "VmRSS").expect("VmRSS in /proc/<pid>/status")
}

/// A fast OpenAI-ish backend in the test process that counts what it received.
#[derive(Default)]
struct Counting {
    received: AtomicUsize,
}

async fn start_counting(listener: tokio::net::TcpListener) -> Arc<Counting> {
    let state = Arc::new(Counting::default());
    let app = axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/chat/completions",
            post(|State(c): State<Arc<Counting>>, body: Bytes| async move {
                c.received.fetch_add(1, Ordering::SeqCst);
                let req: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                axum::Json(serde_json::json!({ "object": "chat.completion", "model": req["model"],
                    "choices": [{ "index": 0, "message": { "role": "assistant", "content": "hi" }, "finish_reason": "stop" }] }))
            }),
        )
        .with_state(state.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    state
}

async fn bind() -> (tokio::net::TcpListener, u16) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    (l, port)
}

/// `vllm:prompt_tokens_total` of an emulator (0 when it never saw a request).
async fn prompt_tokens(sim: &Tessera) -> f64 {
    let page = support::get_text(&client(), &sim.url("/metrics")).await;
    support::metric_sum(&page, "vllm:prompt_tokens_total")
}

async fn running(sim: &Tessera) -> f64 {
    let page = support::get_text(&client(), &sim.url("/metrics")).await;
    support::metric_sum(&page, "vllm:num_requests_running")
}

/// Two emulators serving `qwen` at `time_scale` behind one activator probing every 100 ms, once both are ready.
async fn two_backends(time_scale: &str) -> (Tessera, Tessera, Tessera) {
    let a = Tessera::vllm_sim(&["--served-model-name", "qwen", "--time-scale", time_scale]);
    let b = Tessera::vllm_sim(&["--served-model-name", "qwen", "--time-scale", time_scale]);
    let act = Tessera::activator_for(
        &format!("qwen={}", a.base()),
        &[
            "--backend",
            &format!("qwen={}", b.base()),
            "--probe-interval",
            "100ms",
        ],
    );
    act.wait_activator_stats("two ready backends", WAIT, |s| {
        s["models"]["default/qwen"]["readyBackends"] == 2
    })
    .await;
    (a, b, act)
}

/// SIGKILL a backend while it streams: the client's stream ends with an error (never a clean end), promptly, and
/// the request is not sent again to the other backend after bytes had gone out.
#[tokio::test]
async fn kill_9_a_backend_mid_stream() {
    let (a, b, act) = two_backends("1").await;
    let body = serde_json::json!({ "model": "qwen", "max_tokens": 400, "stream": true, "ignore_eos": true,
        "messages": [{ "role": "user", "content": "Tell me a long story." }] });
    let mut resp = support::post_json(&client(), &act.url("/v1/chat/completions"), &body).await;
    assert_eq!(resp.status(), 200);
    let mut received = 0usize;
    while received < 3 {
        let chunk = tokio::time::timeout(WAIT, resp.chunk())
            .await
            .unwrap()
            .unwrap()
            .expect("stream ended before any token");
        received += chunk.len();
    }
    // Which emulator is serving it?
    let (mut victim, other) = if running(&a).await > 0.0 { (a, b) } else { (b, a) };
    let killed = Instant::now();
    victim.child.kill().unwrap();
    victim.child.wait().unwrap();
    let ended = loop {
        match tokio::time::timeout(WAIT, resp.chunk())
            .await
            .expect("the client must not hang")
        {
            Ok(Some(c)) => {
                let text = String::from_utf8_lossy(&c);
                assert!(
                    !text.contains("[DONE]"),
                    "a killed backend's stream must not end cleanly"
                );
            }
            Ok(None) => panic!("the stream ended cleanly although its backend was killed"),
            Err(_) => break killed.elapsed(),
        }
    };
    // Give a (wrong) replay every chance to show up on the surviving backend.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let replays = prompt_tokens(&other).await;
    assert_eq!(replays, 0.0, "the request was replayed to the other backend");
    assert!(ended < Duration::from_secs(5), "error took {ended:?}");
    println!(
        "FAULT kill9-mid-stream: bytes_before_kill={received} client_error_after_ms={} replayed_prompt_tokens={replays}",
        ended.as_millis()
    );
}

/// SIGKILL one of two backends under steady load: only requests in flight on it (or racing its death by a few
/// milliseconds) fail; everything after is routed to the survivor.
#[tokio::test]
async fn kill_one_of_two_backends_under_load() {
    // `_b` is the survivor: it serves until the test ends.
    let (mut a, _b, act) = two_backends("10").await;
    let start = Instant::now();
    let url = act.url("/v1/chat/completions");
    const WORKERS: usize = 16;
    let stop_at = start + Duration::from_secs(4);
    let mut tasks = Vec::new();
    for _ in 0..WORKERS {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let c = client();
            let mut outcomes = Vec::new();
            while Instant::now() < stop_at {
                let sent = start.elapsed();
                let ok = matches!(c.post(&url).json(&chat("qwen")).send().await, Ok(r) if r.status() == 200);
                outcomes.push((sent, ok));
            }
            outcomes
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let in_flight_on_a = running(&a).await;
    let kill_at = start.elapsed();
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let mut total = 0;
    let mut failed = Vec::new();
    for t in tasks {
        for (sent, ok) in tokio::time::timeout(WAIT, t).await.unwrap().unwrap() {
            total += 1;
            if !ok {
                failed.push(sent);
            }
        }
    }
    // A request sent after the kill may only fail if it raced it (a pooled connection not yet seen closed).
    let late: Vec<_> = failed
        .iter()
        .filter(|s| **s > kill_at + Duration::from_millis(100))
        .collect();
    assert!(
        late.is_empty(),
        "requests sent well after the kill failed: {late:?} (kill at {kill_at:?})"
    );
    assert!(
        failed.len() <= WORKERS,
        "{} failures, more than could be in flight ({WORKERS})",
        failed.len()
    );
    assert!(total > 50, "too little load to mean anything: {total}");
    println!(
        "FAULT kill-one-of-two: requests={total} failed={} in_flight_on_killed={in_flight_on_a} after_kill_failures=0",
        failed.len()
    );
}

/// A backend that answers health probes but resets every completion's connection after reading it: the client
/// gets an OpenAI-shaped 502, and the request is never replayed on the healthy backend (bytes had been sent).
#[tokio::test]
async fn backend_reset_after_connect_is_a_502_and_never_replayed() {
    let (resetter, reset_port) = bind().await;
    let resets = Arc::new(AtomicUsize::new(0));
    let counter = resets.clone();
    tokio::spawn(async move {
        loop {
            let (mut tcp, _) = resetter.accept().await.unwrap();
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                let Ok(n) = tcp.read(&mut buf).await else { return };
                if buf[..n].starts_with(b"GET /health") {
                    let _ = tcp
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
                        .await;
                    return;
                }
                counter.fetch_add(1, Ordering::SeqCst);
                // SO_LINGER 0: close sends RST, as a crashing server or a dropping proxy does.
                tcp.set_zero_linger().unwrap();
                drop(tcp);
            });
        }
    });
    let (healthy, healthy_port) = bind().await;
    let good = start_counting(healthy).await;
    let act = Tessera::activator_for(
        &format!("m=http://127.0.0.1:{reset_port}"),
        &[
            "--backend",
            &format!("m=http://127.0.0.1:{healthy_port}"),
            "--probe-interval",
            "100ms",
        ],
    );
    act.wait_activator_stats("two ready backends", WAIT, |s| {
        s["models"]["default/m"]["readyBackends"] == 2
    })
    .await;
    let (mut ok, mut bad) = (0, 0);
    for _ in 0..6 {
        let resp = support::post_json(&client(), &act.url("/v1/chat/completions"), &chat("m")).await;
        match resp.status().as_u16() {
            200 => ok += 1,
            502 => {
                let err: serde_json::Value = resp.json().await.unwrap();
                assert_eq!(err["error"]["code"], "upstream_error");
                assert_eq!(err["error"]["type"], "server_error");
                bad += 1;
            }
            other => panic!("unexpected status {other}"),
        }
    }
    let (reset_seen, good_seen) = (
        resets.load(Ordering::SeqCst),
        good.received.load(Ordering::SeqCst),
    );
    assert!(bad >= 1, "the resetting backend never got a request");
    assert_eq!(bad, reset_seen, "every reset is one 502");
    assert_eq!(
        good_seen, ok,
        "a reset request was replayed on the healthy backend"
    );
    println!("FAULT reset-after-connect: requests=6 ok={ok} bad_gateway={bad} replayed=0");
}

/// 2,000 requests held for a model at zero: memory stays bounded, one more is shed with 429 + Retry-After, and
/// every held request is answered once the backend starts.
#[tokio::test]
async fn two_thousand_held_requests_at_zero() {
    const HELD: usize = 2000;
    let port = free_port();
    let act = Tessera::activator_at_port(
        "m",
        port,
        &[
            "--queue-size",
            "5000",
            "--max-held",
            &HELD.to_string(),
            "--hold-timeout",
            "120s",
            "--probe-interval-held",
            "50ms",
        ],
    );
    let pid = act.child.id();
    let idle_rss = rss_kib(pid);
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .pool_max_idle_per_host(HELD)
        .build()
        .unwrap();
    let url = act.url("/v1/chat/completions");
    let mut tasks = Vec::with_capacity(HELD);
    for _ in 0..HELD {
        let (c, url) = (c.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            c.post(url)
                .json(&chat("m"))
                .send()
                .await
                .map(|r| r.status().as_u16())
        }));
    }
    act.wait_activator_stats("2000 held", WAIT, |s| {
        s["models"]["default/m"]["queued"] == HELD as u64
    })
    .await;
    let held_rss = rss_kib(pid);
    let extra = support::post_json(&client(), &act.url("/v1/chat/completions"), &chat("m")).await;
    assert_eq!(extra.status(), 429, "over --max-held must be shed");
    assert!(extra.headers().contains_key("retry-after"));
    let err: serde_json::Value = extra.json().await.unwrap();
    assert_eq!(err["error"]["code"], "overloaded_held");
    let per_request = (held_rss.saturating_sub(idle_rss) * 1024) / HELD as u64;
    // A held request is a task, its small body and a connection: a few tens of KiB at most.
    assert!(
        held_rss < idle_rss + 128 * 1024,
        "activator RSS grew from {idle_rss} KiB to {held_rss} KiB for {HELD} held requests"
    );
    let released = Instant::now();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    let backend = start_counting(listener).await;
    let mut ok = 0;
    for t in tasks {
        let status = tokio::time::timeout(WAIT, t).await.unwrap().unwrap().unwrap();
        assert_eq!(status, 200);
        ok += 1;
    }
    let drained = released.elapsed();
    assert_eq!(ok, HELD);
    assert_eq!(
        backend.received.load(Ordering::SeqCst),
        HELD,
        "each held request forwarded exactly once"
    );
    println!(
        "FAULT 2000-held: held={HELD} rss_idle_kib={idle_rss} rss_held_kib={held_rss} bytes_per_held={per_request} \
         shed_status=429 all_answered_ms={}",
        drained.as_millis()
    );
}

/// Latency of `n` sequential requests, sorted, in ms.
async fn latencies(url: &str, n: usize) -> Vec<f64> {
    let c = client();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let r = c.post(url).json(&chat("m")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
        out.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    out.sort_by(f64::total_cmp);
    out
}

/// Slowloris clients (headers and bodies trickled) and 50 MiB bodies (declared and chunked) are cut off by the
/// timeouts and limits, and requests from well-behaved clients are not slowed meanwhile.
#[tokio::test]
async fn slowloris_and_a_50_mib_body_are_rejected_without_slowing_others() {
    let (listener, port) = bind().await;
    start_counting(listener).await;
    let act = Tessera::activator_at_port(
        "m",
        port,
        &[
            "--header-read-timeout",
            "1s",
            "--body-read-timeout",
            "1s",
            "--max-body-size",
            "1048576",
        ],
    );
    let url = act.url("/v1/chat/completions");
    let baseline = latencies(&url, 50).await;
    let addr = act.addr;

    // 100 connections trickling their headers, 100 trickling their bodies.
    let mut loris = Vec::new();
    for i in 0..200 {
        loris.push(tokio::spawn(async move {
            let mut tcp = TcpStream::connect(addr).await.unwrap();
            let opened = Instant::now();
            let head = if i % 2 == 0 {
                "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n".to_string()
            } else {
                "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
                 content-length: 1000\r\n\r\n{\"model\":\"m\","
                    .to_string()
            };
            tcp.write_all(head.as_bytes()).await.unwrap();
            let mut buf = vec![0u8; 4096];
            // Keep trickling one byte every 200 ms until the server answers or closes.
            loop {
                tokio::select! {
                    r = tcp.read(&mut buf) => {
                        let text = match r { Ok(n) => String::from_utf8_lossy(&buf[..n]).into_owned(), Err(_) => String::new() };
                        return (opened.elapsed(), text);
                    }
                    () = tokio::time::sleep(Duration::from_millis(200)) => {
                        if tcp.write_all(if i % 2 == 0 { b"x" } else { b" " }).await.is_err() {
                            return (opened.elapsed(), String::new());
                        }
                    }
                }
            }
        }));
    }

    // 50 MiB, declared: refused before reading. 50 MiB, chunked: cut off at the 1 MiB limit.
    let huge = |chunked: bool| {
        tokio::spawn(async move {
            let tcp = TcpStream::connect(addr).await.unwrap();
            let (mut rd, mut wr) = tcp.into_split();
            let t = Instant::now();
            let head = if chunked {
                "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
                    .to_string()
            } else {
                format!(
                    "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n",
                    50 << 20
                )
            };
            let writer = tokio::spawn(async move {
                if wr.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = vec![b'a'; 64 * 1024];
                for _ in 0..800 {
                    let r = if chunked {
                        let mut framed = format!("{:x}\r\n", chunk.len()).into_bytes();
                        framed.extend_from_slice(&chunk);
                        framed.extend_from_slice(b"\r\n");
                        wr.write_all(&framed).await
                    } else {
                        wr.write_all(&chunk).await
                    };
                    if r.is_err() {
                        return;
                    }
                }
            });
            let mut buf = vec![0u8; 4096];
            let n = tokio::time::timeout(WAIT, rd.read(&mut buf))
                .await
                .unwrap()
                .unwrap_or(0);
            writer.abort();
            (t.elapsed(), String::from_utf8_lossy(&buf[..n]).into_owned())
        })
    };
    let declared = huge(false);
    let chunked = huge(true);

    tokio::time::sleep(Duration::from_millis(200)).await;
    let under_attack = latencies(&url, 50).await;

    let (declared_after, declared_resp) = tokio::time::timeout(WAIT, declared).await.unwrap().unwrap();
    assert!(declared_resp.starts_with("HTTP/1.1 413"), "{declared_resp:?}");
    let (chunked_after, chunked_resp) = tokio::time::timeout(WAIT, chunked).await.unwrap().unwrap();
    assert!(chunked_resp.starts_with("HTTP/1.1 413"), "{chunked_resp:?}");
    let mut closed_after = Duration::ZERO;
    let mut body_timeouts = 0;
    for l in loris {
        let (after, text) = tokio::time::timeout(WAIT, l).await.unwrap().unwrap();
        closed_after = closed_after.max(after);
        if text.starts_with("HTTP/1.1 408") {
            body_timeouts += 1;
        }
    }
    // Header trickles are closed by --header-read-timeout, body trickles answered 408 by --body-read-timeout.
    assert!(
        closed_after < Duration::from_secs(5),
        "a slow client was held for {closed_after:?}"
    );
    assert_eq!(body_timeouts, 100, "every body trickle gets a 408");
    let p50 = |v: &[f64]| v[v.len() / 2];
    let p99 = |v: &[f64]| v[v.len() * 99 / 100];
    assert!(
        p50(&under_attack) < p50(&baseline) * 3.0 + 20.0,
        "well-behaved requests slowed: p50 {:.2} ms → {:.2} ms",
        p50(&baseline),
        p50(&under_attack)
    );
    println!(
        "FAULT slowloris+50MiB: slow_clients=200 all_cut_within_ms={} declared_413_ms={} chunked_413_ms={} \
         p50_ms_before={:.2} p50_ms_during={:.2} p99_ms_before={:.2} p99_ms_during={:.2}",
        closed_after.as_millis(),
        declared_after.as_millis(),
        chunked_after.as_millis(),
        p50(&baseline),
        p50(&under_attack),
        p99(&baseline),
        p99(&under_attack)
    );
}

/// SIGTERM: `/ready` fails at once while requests are still served for `--drain-period`; at the end of the drain
/// a request still held is answered 503 + Retry-After (not cut off), and the process exits cleanly.
#[tokio::test]
async fn sigterm_drains_then_answers_held_requests() {
    let (listener, port) = bind().await;
    start_counting(listener).await;
    let zero_port = free_port();
    let mut act = Tessera::activator_at_port(
        "up",
        port,
        &[
            "--backend",
            &format!("zero=http://127.0.0.1:{zero_port}"),
            "--drain-period",
            "1500ms",
            "--retry-after",
            "3s",
        ],
    );
    act.wait_activator_stats("up ready", WAIT, |s| {
        s["models"]["default/up"]["readyBackends"] == 1
    })
    .await;
    let url = act.url("/v1/chat/completions");
    let held = {
        let url = url.clone();
        tokio::spawn(async move { client().post(url).json(&chat("zero")).send().await.unwrap() })
    };
    act.wait_activator_stats("one held", WAIT, |s| s["models"]["default/zero"]["queued"] == 1)
        .await;
    let signalled = Instant::now();
    sigterm(&act.child);
    // /ready flips promptly…
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let r = client().get(act.url("/ready")).send().await.unwrap();
        if r.status() == 503 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "/ready still {} after SIGTERM",
            r.status()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ready_failed_after = signalled.elapsed();
    // …while traffic is still served.
    let during = client().post(&url).json(&chat("up")).send().await.unwrap();
    assert_eq!(during.status(), 200, "requests during the drain must be served");
    let resp = tokio::time::timeout(WAIT, held).await.unwrap().unwrap();
    let answered_after = signalled.elapsed();
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()["retry-after"], "3");
    let err: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["code"], "shutting_down");
    assert!(
        answered_after >= Duration::from_millis(1400),
        "held request answered before the drain ended ({answered_after:?})"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = act.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the activator did not exit after the drain"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "exit status {status}");
    println!(
        "FAULT sigterm-drain: ready_failed_ms={} held_answered_503_ms={} exited_ms={}",
        ready_failed_after.as_millis(),
        answered_after.as_millis(),
        signalled.elapsed().as_millis()
    );
}

/// A flood of `service_tier: flex` requests, more than `--max-in-flight`, on a lane that stays closed (the flex
/// request the gate lets through never finishes): the waiting ones fill `--lane-max-held` and the rest are
/// answered 429 with `Retry-After`, while every real-time request is still served. Issue 53 N4: before, waiting
/// flex requests held `--max-in-flight` places, and once they filled them every real-time request got 429
/// `overloaded_in_flight`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flex_flood_on_a_closed_lane_never_sheds_real_time() {
    const MAX_IN_FLIGHT: usize = 120;
    const LANE_MAX_HELD: usize = 40;
    const FLEX: usize = 200;
    let (listener, port) = bind().await;
    // Real time is answered at once; a flex request is kept for a minute, so the lane stays closed (no /metrics
    // here, so its gauges are unknown: one flex request in flight per backend, `--lane-throttle-in-flight`).
    let flex_sent = Arc::new(AtomicUsize::new(0));
    let sent = flex_sent.clone();
    let app = axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/chat/completions",
            post(move |body: Bytes| {
                let sent = sent.clone();
                async move {
                    let req: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                    if req["service_tier"] == "flex" {
                        sent.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_secs(60)).await;
                    }
                    axum::Json(serde_json::json!({ "object": "chat.completion", "model": "m",
                        "choices": [{ "index": 0, "message": { "role": "assistant", "content": "hi" }, "finish_reason": "stop" }] }))
                }
            }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let max_in_flight = MAX_IN_FLIGHT.to_string();
    let lane_max_held = LANE_MAX_HELD.to_string();
    let act = Tessera::activator_at_port(
        "m",
        port,
        &[
            "--max-in-flight",
            &max_in_flight,
            "--lane-max-held",
            &lane_max_held,
            "--lane-hold-timeout",
            "60s",
            "--lane-retry-after",
            "3s",
        ],
    );
    act.wait_activator_stats("a ready backend", WAIT, |s| {
        s["models"]["default/m"]["readyBackends"] == 1
    })
    .await;
    let url = act.url("/v1/chat/completions");
    let mut flex_body = chat("m");
    flex_body["service_tier"] = "flex".into();
    let (refused_tx, mut refused_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut flood = Vec::new();
    let started = Instant::now();
    for _ in 0..FLEX {
        let (url, body, tx) = (url.clone(), flex_body.clone(), refused_tx.clone());
        flood.push(tokio::spawn(async move {
            let r = client().post(&url).json(&body).send().await.unwrap();
            let retry_after = r
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_owned());
            let status = r.status().as_u16();
            let body: serde_json::Value = r.json().await.unwrap_or_default();
            let _ = tx.send((status, retry_after, body));
        }));
    }
    // Every flex request is sent, waiting or refused: wait until they add up.
    let mut refused = Vec::new();
    let waiting = loop {
        while let Ok(r) = refused_rx.try_recv() {
            refused.push(r);
        }
        let admin = support::get_text(&client(), &act.admin_url("/metrics")).await;
        let waiting = support::metric_sum(&admin, "tessera_activator_lane_held_requests") as usize;
        if refused.len() + waiting + flex_sent.load(Ordering::SeqCst) == FLEX {
            break waiting;
        }
        assert!(
            started.elapsed() < WAIT,
            "{} refused, {waiting} waiting, {} sent of {FLEX}",
            refused.len(),
            flex_sent.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let refused_in = started.elapsed();
    // Real time, beside the flood: every request served.
    let mut codes = Vec::new();
    for _ in 0..10 {
        let r = support::post_json(&client(), &url, &chat("m")).await;
        codes.push(r.status().as_u16());
    }
    assert!(
        codes.iter().all(|c| *c == 200),
        "real-time answers beside a flex flood: {codes:?}"
    );
    assert_eq!(waiting, LANE_MAX_HELD, "the lane's bound is full");
    let mut by_lane = 0;
    for (status, retry_after, body) in &refused {
        assert_eq!(*status, 429, "{body}");
        // A flex request is counted in --max-in-flight while its body is read, so in a burst this large a few may be
        // shed there; the rest by the lane's own bound, with the lane's Retry-After.
        if body["error"]["code"] == "overloaded_lane_held" {
            by_lane += 1;
            assert!(
                body["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("--lane-max-held"),
                "{body}"
            );
            assert_eq!(retry_after.as_deref(), Some("3"), "the lane's Retry-After");
        } else {
            assert_eq!(body["error"]["code"], "overloaded_in_flight", "{body}");
        }
    }
    assert!(by_lane > 0, "no refusal named --lane-max-held");
    // Nothing more was refused meanwhile: the waiting flex requests are still waiting.
    assert!(refused_rx.try_recv().is_err());
    println!(
        "FAULT flex_flood: {FLEX} flex on a closed lane, --max-in-flight {MAX_IN_FLIGHT}, --lane-max-held \
         {LANE_MAX_HELD}: {} refused ({by_lane} by the lane's bound) in {:.2} s, {} sent, real time {codes:?}",
        refused.len(),
        refused_in.as_secs_f64(),
        flex_sent.load(Ordering::SeqCst)
    );
    for f in flood {
        f.abort();
    }
}

/// Waiting flex requests with large bodies keep them in the lane's own budget (`--lane-max-held-body-bytes`), so
/// real-time requests with bodies as large are still read within `--max-buffered-body-bytes` (before: 40 waiting
/// 400 KB flex bodies held 16 MB of a 4 MiB shared budget and real time got `429 overloaded_body_bytes`).
#[tokio::test]
async fn waiting_flex_bodies_never_take_real_times_body_budget() {
    let (listener, port) = bind().await;
    let app = axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/chat/completions",
            post(|body: Bytes| async move {
                let req: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                if req["service_tier"] == "flex" {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                }
                axum::Json(serde_json::json!({ "object": "chat.completion", "model": "m",
                    "choices": [{ "index": 0, "message": { "role": "assistant", "content": "hi" }, "finish_reason": "stop" }] }))
            }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let act = Tessera::activator_at_port(
        "m",
        port,
        &[
            "--max-buffered-body-bytes",
            "4194304",
            "--lane-max-held-body-bytes",
            "2097152",
            "--lane-max-held",
            "100",
            "--lane-hold-timeout",
            "60s",
        ],
    );
    act.wait_activator_stats("a ready backend", WAIT, |s| {
        s["models"]["default/m"]["readyBackends"] == 1
    })
    .await;
    let url = act.url("/v1/chat/completions");
    let big = |tier: Option<&str>| {
        let mut b = chat("m");
        b["messages"][0]["content"] = "x".repeat(400 * 1024).into();
        if let Some(t) = tier {
            b["service_tier"] = t.into();
        }
        b
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..40 {
        let (url, body, tx) = (url.clone(), big(Some("flex")), tx.clone());
        tokio::spawn(async move {
            let r = client().post(&url).json(&body).send().await.unwrap();
            let status = r.status().as_u16();
            let body: serde_json::Value = r.json().await.unwrap_or_default();
            let _ = tx.send((status, body));
        });
    }
    // The lane's budget holds four or five of them; the rest are refused by it, or, in a burst this large, while
    // their bodies are still read within the shared budget (as for --max-in-flight).
    let started = Instant::now();
    let mut refused = Vec::new();
    while refused.len() < 30 && started.elapsed() < WAIT {
        if let Ok(Some(r)) = tokio::time::timeout(Duration::from_millis(200), rx.recv()).await {
            refused.push(r);
        }
    }
    let mut by_lane = 0;
    for (status, body) in &refused {
        assert_eq!(*status, 429, "{body}");
        let code = body["error"]["code"].as_str().unwrap_or_default();
        assert!(
            code == "overloaded_lane_held" || code == "overloaded_body_bytes",
            "{body}"
        );
        if code == "overloaded_lane_held" {
            by_lane += 1;
            assert!(
                body["error"]["message"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("--lane-max-held-body-bytes")
            );
        }
    }
    let mut codes = Vec::new();
    for _ in 0..10 {
        codes.push(
            support::post_json(&client(), &url, &big(None))
                .await
                .status()
                .as_u16(),
        );
    }
    println!(
        "FAULT flex_bodies: 40 flex of 400 KB waiting, refused_by_lane={} real_time={codes:?}",
        refused.len()
    );
    assert!(
        codes.iter().all(|c| *c == 200),
        "real time beside waiting flex bodies: {codes:?}"
    );
    assert!(by_lane > 0, "none refused by the lane's own body budget");
}
