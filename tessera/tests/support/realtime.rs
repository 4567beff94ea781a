//! Real-time streaming load for the tests that check a lower-priority lane leaves it alone (`lanes.rs`,
//! `batch.rs`): long-prompt, short-answer streamed chats on a seeded Poisson schedule that every phase replays
//! exactly (an open loop: a closed loop's clients drift in and out of step, which moves the p95 by a third from
//! one run to the next on its own), and the time to each one's first token.

use std::time::{Duration, Instant};

use super::{Tessera, http_client};

/// The emulator both tests load: `llama`, llama-3.1-8b on an A100 with a 4 GiB KV cache (four real-time requests
/// hold about a quarter of it), in real time.
pub fn llama_emulator() -> Tessera {
    Tessera::vllm_sim(&[
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
    ])
}

/// A real-time request to `model`: a long prompt (a chat with its history), a short streamed answer.
pub fn realtime_body(model: &str) -> serde_json::Value {
    serde_json::json!({ "model": model, "stream": true, "max_tokens": 16, "ignore_eos": true,
        "tessera_prompt_tokens": 2000,
        "messages": [{ "role": "user", "content": "Summarise our conversation so far." }] })
}

/// Streams one real-time request; its time to the first token: the first SSE event whose delta carries text
/// (vLLM, like the emulator, sends the assistant role in an empty event first).
pub async fn one_realtime(client: &reqwest::Client, url: &str, model: &str) -> Duration {
    let start = Instant::now();
    let mut resp = super::post_json(client, url, &realtime_body(model)).await;
    assert_eq!(resp.status(), 200, "a real-time request is never refused");
    let mut ttft = None;
    let mut pending = String::new();
    while let Some(chunk) = resp.chunk().await.expect("a chunk") {
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

/// Waits until `act` has its `llama` backend ready, then warms the connections and the emulator with one real-time
/// request; the chat completions URL.
pub async fn ready_and_warm(act: &Tessera) -> String {
    act.wait_activator_stats("the backend ready", Duration::from_secs(20), |s| {
        s["models"]["default/llama"]["readyBackends"] == 1
    })
    .await;
    let url = act.url("/v1/chat/completions");
    one_realtime(&http_client(Duration::from_secs(60)), &url, "llama").await;
    url
}

/// The real-time arrivals of one phase of length `phase`, as offsets from its start: exponential gaps at `rate`
/// per second, from a fixed seed.
pub fn schedule(rate: f64, phase: Duration) -> Vec<Duration> {
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut at = 0.0;
    let mut out = Vec::new();
    loop {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let u = ((seed >> 11) as f64 + 1.0) / ((1u64 << 53) as f64 + 1.0);
        at += -u.ln() / rate;
        if at >= phase.as_secs_f64() {
            return out;
        }
        out.push(Duration::from_secs_f64(at));
    }
}

/// Sends one phase's real-time requests to `model` on schedule; their TTFTs.
pub async fn realtime_load(url: String, model: &str, rate: f64, phase: Duration) -> Vec<Duration> {
    let client = http_client(Duration::from_secs(60));
    let start = tokio::time::Instant::now();
    let tasks: Vec<_> = schedule(rate, phase)
        .into_iter()
        .map(|offset| {
            let (client, url, model) = (client.clone(), url.clone(), model.to_owned());
            tokio::spawn(async move {
                tokio::time::sleep_until(start + offset).await;
                one_realtime(&client, &url, &model).await
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("a real-time request task"));
    }
    out
}

/// The 95th percentile (nearest rank).
pub fn p95(v: &mut [Duration]) -> Duration {
    v.sort();
    v[((v.len() as f64 * 0.95).ceil() as usize)
        .saturating_sub(1)
        .min(v.len() - 1)]
}

/// Milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
