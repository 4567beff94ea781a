//! Priority lanes over loopback: `tessera vllm-sim` behind `tessera activator`, real-time streaming clients
//! alone and then beside a flex lane (`service_tier: flex`) that offers far more work than the server has room
//! for. The real-time TTFT p95 with the flex lane stays within 10% of the same real-time load alone, the flex
//! lane still completes work, and the flex requests it cannot place are answered `429` with `Retry-After`,
//! never left to time out.
//!
//! The numbers it prints are the ones in `docs/performance.md` ("Priority lanes").

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod support;
use support::{Tessera, http_client};

/// Real-time clients, each sending its next request when the last one ends (a closed loop).
const REALTIME_CLIENTS: usize = 4;
/// Flex clients: more than the server has room for, so the gate has to say no.
const FLEX_CLIENTS: usize = 24;
/// Each phase's length.
const PHASE: Duration = Duration::from_secs(20);

/// A real-time request: a long prompt (a chat with its history), a short streamed answer.
fn realtime_body() -> serde_json::Value {
    serde_json::json!({ "model": "llama", "stream": true, "max_tokens": 16, "ignore_eos": true,
        "tessera_prompt_tokens": 2000,
        "messages": [{ "role": "user", "content": "Summarise our conversation so far." }] })
}

/// A flex request: one of a batch job's near-identical requests, decode-heavy.
fn flex_body() -> serde_json::Value {
    serde_json::json!({ "model": "llama", "service_tier": "flex", "max_tokens": 512, "ignore_eos": true,
        "tessera_prompt_tokens": 512,
        "messages": [{ "role": "user", "content": "Classify this support ticket." }] })
}

/// Streams one real-time request; its time to the first token: the first SSE event whose delta carries text
/// (vLLM, like the emulator, sends the assistant role in an empty event first).
async fn one_realtime(client: &reqwest::Client, url: &str) -> Duration {
    let start = Instant::now();
    let mut resp = client.post(url).json(&realtime_body()).send().await.unwrap();
    assert_eq!(resp.status(), 200, "a real-time request is never refused");
    let mut ttft = None;
    let mut pending = String::new();
    while let Some(chunk) = resp.chunk().await.unwrap() {
        if ttft.is_some() {
            continue;
        }
        pending.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = pending.find("\n\n") {
            let event: String = pending.drain(..end + 2).collect();
            let Some(json) = event.trim().strip_prefix("data: ") else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<serde_json::Value>(json) else {
                continue;
            };
            if v["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|c| !c.is_empty())
            {
                ttft.get_or_insert(start.elapsed());
            }
        }
    }
    ttft.expect("a token was streamed")
}

async fn realtime_load(url: String, until: Instant) -> Vec<Duration> {
    let client = http_client(Duration::from_secs(60));
    let mut out = Vec::new();
    while Instant::now() < until {
        out.push(one_realtime(&client, &url).await);
    }
    out
}

#[derive(Default)]
struct FlexCounts {
    completed: AtomicU64,
    refused: AtomicU64,
    other: AtomicU64,
}

/// A flex client that honours `Retry-After`.
async fn flex_load(url: String, until: Instant, counts: Arc<FlexCounts>) {
    let client = http_client(Duration::from_secs(60));
    while Instant::now() < until {
        let resp = client.post(&url).json(&flex_body()).send().await.unwrap();
        match resp.status().as_u16() {
            200 => {
                resp.bytes().await.unwrap();
                counts.completed.fetch_add(1, Ordering::Relaxed);
            }
            429 => {
                let secs: u64 = resp
                    .headers()
                    .get("retry-after")
                    .expect("a 429 carries Retry-After")
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                let body: serde_json::Value = resp.json().await.unwrap();
                assert_eq!(body["error"]["code"], "lane_full", "{body}");
                counts.refused.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_secs(secs)).await;
            }
            code => {
                eprintln!(
                    "flex: unexpected {code}: {}",
                    resp.text().await.unwrap_or_default()
                );
                counts.other.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

fn p95(v: &mut [Duration]) -> Duration {
    v.sort();
    v[((v.len() as f64 * 0.95).ceil() as usize)
        .saturating_sub(1)
        .min(v.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flex_lane_fills_room_without_slowing_real_time_and_is_refused_with_retry_after() {
    // llama-3.1-8b on an A100 with a 4 GiB KV cache: four real-time requests hold about a quarter of it.
    let sim = Tessera::vllm_sim(&[
        "--served-model-name",
        "llama",
        "--model-preset",
        "llama-3.1-8b",
        "--kv-cache-memory-bytes",
        "4Gi",
        "--max-model-len",
        "8192",
        "--time-scale",
        "1",
    ]);
    let act = Tessera::activator(&[
        "--backend",
        &format!("llama={}", sim.base()),
        "--lane-hold-timeout",
        "1s",
        "--lane-retry-after",
        "1s",
        "--lane-poll-interval",
        "100ms",
    ]);
    act.wait_activator_stats("the backend ready", Duration::from_secs(20), |s| {
        s["models"]["default/llama"]["readyBackends"] == 1
    })
    .await;
    let url = act.url("/v1/chat/completions");
    // Warm up the connections and the emulator.
    let warm = http_client(Duration::from_secs(30));
    one_realtime(&warm, &url).await;

    // 1. Real-time alone.
    let until = Instant::now() + PHASE;
    let alone: Vec<Vec<Duration>> =
        futures::future::join_all((0..REALTIME_CLIENTS).map(|_| realtime_load(url.clone(), until))).await;
    let mut alone: Vec<Duration> = alone.into_iter().flatten().collect();

    // 2. The same real-time load beside a flex lane offering far more than the room left.
    let counts = Arc::new(FlexCounts::default());
    let until = Instant::now() + PHASE;
    let flex: Vec<_> = (0..FLEX_CLIENTS)
        .map(|_| tokio::spawn(flex_load(url.clone(), until, counts.clone())))
        .collect();
    // The flex lane starts first, as a batch job already running when people come in.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let with: Vec<Vec<Duration>> =
        futures::future::join_all((0..REALTIME_CLIENTS).map(|_| realtime_load(url.clone(), until))).await;
    let mut with: Vec<Duration> = with.into_iter().flatten().collect();
    for f in flex {
        f.await.unwrap();
    }
    let (n_alone, n_with) = (alone.len(), with.len());
    let (p_alone, p_with) = (p95(&mut alone), p95(&mut with));
    let completed = counts.completed.load(Ordering::Relaxed);
    let refused = counts.refused.load(Ordering::Relaxed);
    let other = counts.other.load(Ordering::Relaxed);
    let metrics = http_client(Duration::from_secs(5))
        .get(act.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let sample = |prefix: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let flex_admitted =
        sample("tessera_activator_lane_admitted_total{namespace=\"default\",model=\"llama\",lane=\"flex\"}");
    let flex_rejected =
        sample("tessera_activator_lane_rejected_total{namespace=\"default\",model=\"llama\",lane=\"flex\"}");
    println!(
        "lanes: real-time TTFT p95 alone {:.1} ms ({n_alone} requests), with the flex lane {:.1} ms ({n_with}), \
         ratio {:.3}; flex completed {completed}, refused 429 {refused}, other {other}; metrics: flex admitted \
         {flex_admitted}, rejected {flex_rejected}",
        ms(p_alone),
        ms(p_with),
        p_with.as_secs_f64() / p_alone.as_secs_f64()
    );
    assert!(
        p_with.as_secs_f64() <= p_alone.as_secs_f64() * 1.10,
        "real-time TTFT p95 {:.1} ms with the flex lane vs {:.1} ms alone: more than 10% worse",
        ms(p_with),
        ms(p_alone)
    );
    assert!(completed > 0, "the flex lane completes work");
    assert!(
        refused > 0,
        "above the threshold flex requests are refused with 429"
    );
    assert_eq!(
        other, 0,
        "every flex request ends in 200 or 429 + Retry-After, never a timeout"
    );
    assert_eq!(flex_admitted as u64, completed);
    assert_eq!(flex_rejected as u64, refused);
}
