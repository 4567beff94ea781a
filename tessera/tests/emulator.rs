//! `tessera vllm-sim` over real HTTP on 127.0.0.1: the OpenAI protocol, the `/metrics` page read by the project's
//! own parser, start-up, sleep mode, determinism, and the ramp behaviour (KV usage, queue and TTFT rise with load;
//! a lower `--gpu-memory-utilization` gives fewer blocks and, past the knee, preemptions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};
use tessera_core::metrics::{VllmSnapshot, parse_text};

mod support;
use support::{Tessera, free_port};

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

async fn metrics_text(c: &reqwest::Client, emu: &Tessera) -> String {
    let r = c.get(emu.url("/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.text().await.unwrap()
}

async fn snapshot(c: &reqwest::Client, emu: &Tessera) -> VllmSnapshot {
    VllmSnapshot::from_text(&metrics_text(c, emu).await).expect("the emulator's page parses")
}

/// POSTs `body` to `url` and parses the answer as JSON.
async fn post_value(c: &reqwest::Client, url: &str, body: &Value) -> Value {
    support::post_json(c, url, body).await.json().await.unwrap()
}

/// POSTs nothing to `url` (the sleep-mode endpoints); the answer's status.
async fn post_status(c: &reqwest::Client, url: &str) -> reqwest::StatusCode {
    c.post(url).send().await.unwrap().status()
}

/// The families vLLM V1's page has after a request (the emulator's default page).
const V1_FAMILIES: [&str; 27] = [
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:engine_sleep_state",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:request_success_total",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:request_time_per_output_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_inference_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:request_params_n",
    "vllm:request_params_max_tokens",
    "vllm:request_max_num_generation_tokens",
    "vllm:iteration_tokens_total",
    "vllm:cache_config_info",
    "vllm:prompt_tokens_created",
    "vllm:time_to_first_token_seconds_created",
];

/// The families vLLM V0's page has after a request (`--metrics-version v0`).
const V0_FAMILIES: [&str; 18] = [
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_requests_swapped",
    "vllm:gpu_cache_usage_perc",
    "vllm:cpu_cache_usage_perc",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:time_to_first_token_seconds",
    "vllm:time_per_output_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:request_params_n",
    "vllm:request_success_total",
    "vllm:avg_prompt_throughput_toks_per_s",
    "vllm:avg_generation_throughput_toks_per_s",
    "vllm:cache_config_info",
];

/// `emu`'s metrics page: it parses without a malformed line and has each of `families` (`version` names the page
/// in the message).
async fn page_with_families(c: &reqwest::Client, emu: &Tessera, version: &str, families: &[&str]) -> String {
    let text = metrics_text(c, emu).await;
    let page = parse_text(&text);
    assert!(page.errors.is_empty(), "malformed lines: {:?}", page.errors);
    for name in families {
        assert!(
            page.family(name).is_some(),
            "family {name} missing from the {version} page"
        );
    }
    text
}

/// Tells the load `tasks` to stop and waits for each to end (at most a minute; `what` names them).
async fn drain(stop: &AtomicBool, tasks: Vec<tokio::task::JoinHandle<()>>, what: &str) {
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .unwrap_or_else(|_| panic!("{what} drains"))
            .unwrap();
    }
}

/// Sends one streaming completion and reads it to the end; returns the number of content chunks.
async fn stream_one(
    c: &reqwest::Client,
    url: &str,
    model: &str,
    prompt_tokens: u32,
    max_tokens: u32,
) -> usize {
    let body = json!({
        "model": model, "prompt": "x", "tessera_prompt_tokens": prompt_tokens, "max_tokens": max_tokens,
        "ignore_eos": true, "stream": true,
    });
    let r = c.post(url).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    let mut s = r.bytes_stream();
    let mut text = Vec::new();
    while let Some(chunk) = s.next().await {
        text.extend_from_slice(&chunk.unwrap());
    }
    let text = String::from_utf8(text).unwrap();
    assert!(
        text.trim_end().ends_with("data: [DONE]"),
        "stream must end with [DONE]: {text}"
    );
    text.matches("\"finish_reason\":null").count()
}

#[tokio::test]
async fn openai_protocol_matches_vllm() {
    let emu = Tessera::vllm_sim(&[
        "--served-model-name",
        "tiny",
        "--model-preset",
        "opt-125m",
        "--seed",
        "7",
    ]);
    let c = client();
    assert_eq!(c.get(emu.url("/health")).send().await.unwrap().status(), 200);

    let models: Value = support::get_json(&c, &emu.url("/v1/models")).await;
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "tiny");
    assert_eq!(models["data"][0]["max_model_len"], 2048);

    // Non-streaming chat: usage adds up and max_tokens is respected.
    let body = json!({"model": "tiny", "messages": [{"role": "user", "content": "Hello there, emulator!"}],
                      "max_tokens": 12, "ignore_eos": true});
    let r: Value = post_value(&c, &emu.url("/v1/chat/completions"), &body).await;
    assert_eq!(r["object"], "chat.completion");
    assert_eq!(r["choices"][0]["message"]["role"], "assistant");
    assert_eq!(r["choices"][0]["finish_reason"], "length");
    assert_eq!(r["usage"]["completion_tokens"], 12);
    let u = &r["usage"];
    assert_eq!(
        u["total_tokens"].as_u64(),
        Some(u["prompt_tokens"].as_u64().unwrap() + 12)
    );

    // Streaming chat with include_usage: role chunk, one chunk per token, finish chunk, usage chunk, [DONE].
    let body = json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
                      "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}});
    let text = support::post_json(&c, &emu.url("/v1/chat/completions"), &body)
        .await
        .text()
        .await
        .unwrap();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 1 + 5 + 1 + 1 + 1, "{text}");
    assert!(events.iter().all(|e| e.starts_with("data: ")));
    let first: Value = serde_json::from_str(&events[0][6..]).unwrap();
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let usage: Value = serde_json::from_str(&events[7][6..]).unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 5);
    assert_eq!(events[8], "data: [DONE]");

    // Completions with token ids count prompt tokens exactly.
    let body = json!({"model": "tiny", "prompt": [1, 2, 3, 4, 5, 6, 7], "max_tokens": 3});
    let r: Value = post_value(&c, &emu.url("/v1/completions"), &body).await;
    assert_eq!(r["object"], "text_completion");
    assert_eq!(r["usage"]["prompt_tokens"], 7);

    // Errors in OpenAI's shape.
    let r = support::post_json(
        &c,
        &emu.url("/v1/completions"),
        &json!({"model": "nope", "prompt": "x"}),
    )
    .await;
    assert_eq!(r.status(), 404);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["type"], "NotFoundError");
    assert!(e["error"]["message"].as_str().unwrap().contains("nope"));
    let r = c
        .post(emu.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], 400);
    // A prompt that fills max_model_len (2048 for opt-125m) on its own: 400 with vLLM 0.32's message.
    let body = json!({"model": "tiny", "prompt": "x", "tessera_prompt_tokens": 2048, "max_tokens": 10});
    let r = support::post_json(&c, &emu.url("/v1/completions"), &body).await;
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("maximum context length is 2048"),
        "{e}"
    );
    assert_eq!(e["error"]["param"], "input_tokens");
    // Prompt + max_tokens over the limit: vLLM 0.32 caps max_tokens at what is left (48 here), no error.
    let body = json!({"model": "tiny", "prompt": "x", "tessera_prompt_tokens": 2000, "max_tokens": 100,
        "ignore_eos": true});
    let r = support::post_json(&c, &emu.url("/v1/completions"), &body).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 48, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
}

#[tokio::test]
async fn same_seed_same_text() {
    let body = json!({"model": "m", "prompt": "seeded", "max_tokens": 40});
    let mut outs = Vec::new();
    for seed in ["3", "3", "4"] {
        let emu = Tessera::vllm_sim(&["--served-model-name", "m", "--seed", seed]);
        let r: Value = post_value(&client(), &emu.url("/v1/completions"), &body).await;
        outs.push(r["choices"][0]["text"].as_str().unwrap().to_owned());
    }
    assert_eq!(outs[0], outs[1]);
    assert_ne!(outs[0], outs[2]);
}

#[tokio::test]
async fn metrics_page_has_every_vllm_family_and_parses() {
    let emu = Tessera::vllm_sim(&[
        "--served-model-name",
        "m",
        "--gpu-memory-utilization",
        "0.5",
        "--time-scale",
        "20",
    ]);
    let c = client();
    stream_one(&c, &emu.url("/v1/completions"), "m", 300, 20).await;
    let text = page_with_families(&c, &emu, "V1", &V1_FAMILIES).await;
    // vLLM's V1 TTFT buckets, read back from `le`.
    let snap = VllmSnapshot::from_text(&text).unwrap();
    let ttft = snap.ttft.as_ref().expect("ttft");
    assert_eq!(ttft.buckets.len(), 23, "22 bounds + +Inf");
    assert_eq!(ttft.count, 1.0);
    assert_eq!(snap.prompt_tokens_total, Some(300.0));
    assert_eq!(snap.generation_tokens_total, Some(20.0));
    assert_eq!(snap.request_success_total.get("length"), Some(&1.0));
    assert_eq!(snap.model_names, vec!["m".to_owned()]);
    assert_eq!(snap.per_engine[0].engine.as_deref(), Some("0"));
    assert_eq!(
        snap.cache_config
            .get("gpu_memory_utilization")
            .map(String::as_str),
        Some("0.5")
    );
    assert_eq!(
        snap.cache_config.get("block_size").map(String::as_str),
        Some("16")
    );
    // Qwen2-7B on an A100 at 0.5: vLLM measured 29,053 blocks.
    let blocks = snap.num_gpu_blocks().unwrap() as f64;
    assert!((blocks - 29_053.0).abs() / 29_053.0 < 0.02, "{blocks}");

    // V0 names.
    let emu = Tessera::vllm_sim(&[
        "--served-model-name",
        "m",
        "--metrics-version",
        "v0",
        "--time-scale",
        "20",
    ]);
    stream_one(&c, &emu.url("/v1/completions"), "m", 100, 10).await;
    let text = page_with_families(&c, &emu, "V0", &V0_FAMILIES).await;
    assert!(parse_text(&text).family("vllm:kv_cache_usage_perc").is_none());
    assert!(!text.contains("engine=\""), "V0 pages have no engine label");
    let snap = VllmSnapshot::from_text(&text).unwrap();
    assert_eq!(snap.generation_tokens_total, Some(10.0));
    assert!(
        snap.kv_cache_usage.is_some(),
        "gpu_cache_usage_perc is read as KV usage"
    );
    assert!(
        snap.inter_token_latency.is_some(),
        "time_per_output_token_seconds is read as ITL"
    );
}

#[tokio::test]
async fn startup_delay_refuses_then_serves() {
    // Reserve a free port, then let the emulator take it after its start-up delay.
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["vllm-sim", "--listen", &listen, "--startup-delay", "1500ms"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let emu_guard = scopeguard(&mut child);
    let c = client();
    let url = format!("http://{listen}/health");
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        c.get(&url).send().await.is_err(),
        "the port must refuse while loading"
    );
    let mut ok_at = None;
    while t0.elapsed() < Duration::from_secs(20) {
        if let Ok(r) = c.get(&url).send().await
            && r.status() == 200
        {
            ok_at = Some(t0.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ok_at = ok_at.expect("healthy after the start-up delay");
    assert!(
        ok_at >= Duration::from_millis(1400),
        "healthy too early: {ok_at:?}"
    );
    drop(emu_guard);

    // Unhealthy mode: listens at once, answers 503 until ready.
    let emu = Tessera::vllm_sim(&["--startup-delay", "1s", "--startup-mode", "unhealthy"]);
    assert_eq!(c.get(emu.url("/health")).send().await.unwrap().status(), 503);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(c.get(emu.url("/health")).send().await.unwrap().status(), 200);
}

/// Kills a child process when dropped.
struct Guard<'a>(&'a mut Child);
impl Drop for Guard<'_> {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
fn scopeguard(c: &mut Child) -> Guard<'_> {
    Guard(c)
}

#[tokio::test]
async fn sleep_endpoints_need_sleep_mode_and_dev_mode_as_in_vllm() {
    let c = client();
    for (flags, env) in [
        (vec![], vec![]),
        (vec!["--enable-sleep-mode"], vec![]),
        (vec![], vec![("VLLM_SERVER_DEV_MODE", "1")]),
    ] {
        let mut args = vec!["vllm-sim", "--listen", "127.0.0.1:0"];
        args.extend(flags.iter().copied());
        let emu = Tessera::start_with_env(&args, &env);
        for (post, path) in [
            (true, "/sleep?level=1"),
            (true, "/wake_up"),
            (false, "/is_sleeping"),
        ] {
            let req = if post {
                c.post(emu.url(path))
            } else {
                c.get(emu.url(path))
            };
            assert_eq!(
                req.send().await.unwrap().status(),
                404,
                "{path} with {flags:?} {env:?}"
            );
        }
        assert!(
            !metrics_text(&c, &emu)
                .await
                .contains("tessera_emulator_gpu_memory_used_bytes")
        );
    }
}

fn gpu_used(text: &str) -> f64 {
    let page = parse_text(text);
    page.family("tessera_emulator_gpu_memory_used_bytes")
        .unwrap()
        .samples[0]
        .value
}

#[tokio::test]
async fn sleep_pauses_the_engine_and_wake_up_resumes() {
    let emu = Tessera::sleep_mode_sim(&["--wake-up-delay", "200ms", "--fault-sleep-residue-bytes", "1Gi"]);
    let c = client();
    let asleep = |v: Value| v["is_sleeping"].as_bool().unwrap();
    let get = |p: &'static str| {
        let c = c.clone();
        let u = emu.url(p);
        async move { c.get(u).send().await.unwrap().json::<Value>().await.unwrap() }
    };
    assert!(!asleep(get("/is_sleeping").await));
    let awake_bytes = gpu_used(&metrics_text(&c, &emu).await);
    assert!(
        awake_bytes > 4e9,
        "weights + KV of an emulated 7B model: {awake_bytes}"
    );
    assert_eq!(post_status(&c, &emu.url("/sleep?level=1&mode=keep")).await, 200);
    assert!(asleep(get("/is_sleeping").await));
    let text = metrics_text(&c, &emu).await;
    assert!(text.contains("sleep_state=\"weights_offloaded\"} 1.0"), "{text}");
    assert_eq!(gpu_used(&text), 1024.0 * 1024.0 * 1024.0, "the residue flag");
    // mode=keep: a request sent while asleep waits, and completes after wake-up.
    let url = emu.url("/v1/completions");
    let c2 = c.clone();
    let pending = tokio::spawn(async move { stream_one(&c2, &url, "m", 50, 5).await });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!pending.is_finished(), "no tokens while asleep");
    // The KV cache alone wakes at once and leaves the engine paused; the weights take --wake-up-delay.
    assert_eq!(post_status(&c, &emu.url("/wake_up?tags=kv_cache")).await, 200);
    assert!(asleep(get("/is_sleeping").await), "weights still asleep");
    let t = Instant::now();
    assert_eq!(post_status(&c, &emu.url("/wake_up?tags=weights")).await, 200);
    assert!(
        t.elapsed() >= Duration::from_millis(200),
        "wake-up takes --wake-up-delay"
    );
    assert!(!asleep(get("/is_sleeping").await));
    assert_eq!(gpu_used(&metrics_text(&c, &emu).await), awake_bytes);
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(10), pending)
            .await
            .unwrap()
            .unwrap(),
        5
    );
    for bad in ["/sleep?level=3", "/sleep?mode=later", "/wake_up?tags=lora"] {
        assert_eq!(post_status(&c, &emu.url(bad)).await, 400, "{bad}");
    }
}

/// A seeded completion's text (the sidecar's canary).
async fn seeded_text(c: &reqwest::Client, emu: &Tessera) -> String {
    let v: Value = post_value(
        c,
        &emu.url("/v1/completions"),
        &json!({"model": "m", "prompt": "canary", "max_tokens": 8, "temperature": 0, "seed": 7,
            "ignore_eos": true}),
    )
    .await;
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn abort_and_wait_modes_level_two_reload_and_the_wrong_answer_fault() {
    let emu = Tessera::sleep_mode_sim(&["--wake-up-delay", "10ms", "--time-scale", "20"]);
    let c = client();
    let before = seeded_text(&c, &emu).await;
    assert_eq!(
        seeded_text(&c, &emu).await,
        before,
        "the same seed, the same text"
    );
    // mode=abort ends the request in flight.
    let r = support::post_json(
        &c,
        &emu.url("/v1/completions"),
        &json!({"model": "m", "prompt": "x", "max_tokens": 30_000, "ignore_eos": true, "stream": true}),
    )
    .await;
    let long = tokio::spawn(async move {
        let mut s = r.bytes_stream();
        let mut text = Vec::new();
        while let Some(Ok(chunk)) = s.next().await {
            text.extend_from_slice(&chunk);
        }
        String::from_utf8(text)
            .unwrap()
            .matches("\"finish_reason\":null")
            .count()
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(post_status(&c, &emu.url("/sleep?level=2&mode=abort")).await, 200);
    let got = tokio::time::timeout(Duration::from_secs(5), long)
        .await
        .unwrap()
        .unwrap();
    assert!(got < 30_000, "aborted after {got} tokens");
    // Level 2 discarded the weights: after a wake without reload_weights the answer is wrong; after it, right.
    assert_eq!(post_status(&c, &emu.url("/wake_up?tags=weights")).await, 200);
    assert_eq!(post_status(&c, &emu.url("/wake_up?tags=kv_cache")).await, 200);
    assert_ne!(seeded_text(&c, &emu).await, before, "no reload: wrong weights");
    let r = support::post_json(
        &c,
        &emu.url("/collective_rpc"),
        &json!({"method": "reload_weights"}),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(post_status(&c, &emu.url("/reset_prefix_cache")).await, 200);
    assert_eq!(seeded_text(&c, &emu).await, before);
    // mode=wait answers only once the request in flight has finished.
    let url = emu.url("/v1/completions");
    let c2 = c.clone();
    let short = tokio::spawn(async move { stream_one(&c2, &url, "m", 50, 300).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(post_status(&c, &emu.url("/sleep?level=1&mode=wait")).await, 200);
    assert!(
        short.is_finished()
            || tokio::time::timeout(Duration::from_millis(100), short)
                .await
                .is_ok()
    );

    let faulty = Tessera::sleep_mode_sim(&["--wake-up-delay", "10ms", "--fault-wake-wrong-answer"]);
    let before = seeded_text(&c, &faulty).await;
    assert_eq!(post_status(&c, &faulty.url("/sleep?level=1")).await, 200);
    assert_eq!(post_status(&c, &faulty.url("/wake_up")).await, 200);
    assert_ne!(
        seeded_text(&c, &faulty).await,
        before,
        "--fault-wake-wrong-answer"
    );

    let hang = Tessera::sleep_mode_sim(&["--fault-wake-hang"]);
    assert_eq!(post_status(&c, &hang.url("/sleep?level=1")).await, 200);
    let woke = tokio::time::timeout(Duration::from_secs(2), c.post(hang.url("/wake_up")).send()).await;
    assert!(woke.is_err(), "--fault-wake-hang: the wake never answers");
}

/// Load at one concurrency level for `dur`; returns the mean KV usage and waiting count seen, and the TTFT
/// histogram's mean over the stage (from the difference of two scrapes, as a user of vLLM would compute it).
struct Stage {
    kv: f64,
    waiting: f64,
    ttft_mean: f64,
    preemptions: f64,
}

async fn run_stage(emu: &Tessera, concurrency: usize, dur: Duration, prompt: u32, output: u32) -> Stage {
    let c = client();
    let before = snapshot(&c, emu).await;
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (c, url, stop, done) = (c.clone(), emu.url("/v1/completions"), stop.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                stream_one(&c, &url, "m", prompt, output).await;
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let (mut kv, mut waiting, mut n) = (0.0, 0.0, 0.0);
    let t0 = Instant::now();
    // Let the stage settle before sampling the gauges.
    tokio::time::sleep(dur / 4).await;
    while t0.elapsed() < dur {
        let s = snapshot(&c, emu).await;
        kv += s.kv_cache_usage.unwrap();
        waiting += s.requests_waiting.unwrap();
        n += 1.0;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drain(&stop, tasks, "stage").await;
    let after = snapshot(&c, emu).await;
    let ttft = after.ttft.unwrap().delta(before.ttft.as_ref().unwrap());
    Stage {
        kv: kv / n,
        waiting: waiting / n,
        ttft_mean: ttft.mean().unwrap(),
        preemptions: after.preemptions_total.unwrap() - before.preemptions_total.unwrap(),
    }
}

#[tokio::test]
async fn ramp_raises_kv_queue_and_ttft_and_low_memory_preempts() {
    // Qwen2-7B on an A100, 4× faster than real time so the test stays short. 32 sequences at most, so the
    // queue grows once more than 32 clients are active.
    let common = [
        "--served-model-name",
        "m",
        "--max-model-len",
        "8192",
        "--max-num-seqs",
        "32",
        "--time-scale",
        "4",
    ];
    let big = Tessera::vllm_sim(&[&common[..], &["--gpu-memory-utilization", "0.9"]].concat());
    let small = Tessera::vllm_sim(&[&common[..], &["--gpu-memory-utilization", "0.2"]].concat());
    let c = client();
    let (big_blocks, small_blocks) = (
        snapshot(&c, &big).await.num_gpu_blocks().unwrap(),
        snapshot(&c, &small).await.num_gpu_blocks().unwrap(),
    );
    assert!(
        small_blocks * 10 < big_blocks,
        "util 0.2 → {small_blocks} blocks, 0.9 → {big_blocks}"
    );

    let stage = Duration::from_secs(3);
    let mut big_stages = Vec::new();
    for conc in [2, 16, 64] {
        big_stages.push(run_stage(&big, conc, stage, 1000, 200).await);
    }
    for (i, s) in big_stages.iter().enumerate() {
        eprintln!(
            "util 0.9 stage {i}: kv {:.4} waiting {:.1} ttft mean {:.3}s preemptions {}",
            s.kv, s.waiting, s.ttft_mean, s.preemptions
        );
    }
    for w in big_stages.windows(2) {
        assert!(w[1].kv > w[0].kv, "KV usage rises with load");
        assert!(w[1].ttft_mean > w[0].ttft_mean, "TTFT rises with load");
    }
    assert!(
        big_stages[2].waiting > big_stages[0].waiting + 5.0,
        "the queue grows past max_num_seqs"
    );
    assert!(
        big_stages.iter().all(|s| s.preemptions == 0.0),
        "plenty of blocks: no preemption"
    );

    // Same load with a quarter of the memory: the KV cache fills and requests get preempted.
    let mut small_stages = Vec::new();
    for conc in [2, 64] {
        small_stages.push(run_stage(&small, conc, stage, 1000, 200).await);
    }
    for (i, s) in small_stages.iter().enumerate() {
        eprintln!(
            "util 0.2 stage {i}: kv {:.4} waiting {:.1} ttft mean {:.3}s preemptions {}",
            s.kv, s.waiting, s.ttft_mean, s.preemptions
        );
    }
    assert_eq!(small_stages[0].preemptions, 0.0, "below the knee: no preemption");
    assert!(small_stages[1].preemptions > 0.0, "past the knee: preemptions");
    assert!(small_stages[1].kv > 0.8, "past the knee the cache is nearly full");
    assert!(small_stages[1].kv > big_stages[2].kv);
}

/// Starts `tessera sidecar` reading the emulator at `vllm_url`.
fn sidecar(vllm_url: &str) -> Tessera {
    Tessera::start(&[
        "sidecar",
        "--listen",
        "127.0.0.1:0",
        "--vllm-url",
        vllm_url,
        "--scrape-interval",
        "200ms",
        "--no-nvml",
    ])
}

#[tokio::test]
async fn sidecar_readings_track_the_emulator_under_load() {
    // 16 sequences at most and 32 clients: 16 run, 16 wait, and the KV cache fills partly.
    let emu = Tessera::vllm_sim(&[
        "--served-model-name",
        "m",
        "--max-num-seqs",
        "16",
        "--gpu-memory-utilization",
        "0.22",
        "--max-model-len",
        "4096",
    ]);
    let sidecar = sidecar(&emu.base());
    let c = client();
    let status = |c: reqwest::Client, url: String| async move {
        let r = c.get(url).send().await.unwrap();
        assert_eq!(r.status(), 200);
        r.json::<Value>().await.unwrap()
    };
    let status_url = format!("{}/v1/status", sidecar.base());

    // Under load.
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (c, url, stop) = (c.clone(), emu.url("/v1/completions"), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                stream_one(&c, &url, "m", 1500, 150).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut compared = 0;
    for _ in 0..10 {
        let emu_snap = snapshot(&c, &emu).await;
        let st = status(c.clone(), status_url.clone()).await;
        let latest = &st["latest"];
        assert!(st["vllm_up"].as_bool().unwrap(), "{st}");
        let (kv_e, kv_s) = (
            emu_snap.kv_cache_usage.unwrap(),
            latest["kv_cache_usage_ratio"].as_f64().unwrap(),
        );
        let (run_e, run_s) = (
            emu_snap.requests_running.unwrap(),
            latest["requests_running"].as_f64().unwrap(),
        );
        let (wait_e, wait_s) = (
            emu_snap.requests_waiting.unwrap(),
            latest["requests_waiting"].as_f64().unwrap(),
        );
        eprintln!(
            "emulator kv {kv_e:.3} run {run_e} wait {wait_e} | sidecar kv {kv_s:.3} run {run_s} wait {wait_s}"
        );
        // The sidecar's reading is at most one scrape interval (200 ms) old.
        assert!((kv_e - kv_s).abs() < 0.1, "kv {kv_e} vs {kv_s}");
        assert!(kv_s > 0.05, "the sidecar sees the cache in use: {kv_s}");
        assert!(
            (8.0..=16.0).contains(&run_s),
            "running {run_s} (emulator {run_e})"
        );
        assert!(wait_s >= 4.0, "waiting {wait_s} (emulator {wait_e})");
        compared += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(compared, 10);
    drain(&stop, tasks, "load").await;

    // Idle: once the sidecar has scraped again, its counters equal the emulator's exactly.
    let emu_snap = snapshot(&c, &emu).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let st = status(c.clone(), status_url.clone()).await;
    let latest = &st["latest"];
    assert_eq!(latest["requests_running"].as_f64(), Some(0.0), "{st}");
    assert_eq!(latest["requests_waiting"].as_f64(), Some(0.0));
    assert_eq!(latest["kv_cache_usage_ratio"].as_f64(), Some(0.0));
    assert_eq!(
        latest["generation_tokens_total"].as_f64(),
        emu_snap.generation_tokens_total
    );
    assert_eq!(
        latest["prompt_tokens_total"].as_f64(),
        emu_snap.prompt_tokens_total
    );
    assert_eq!(
        latest["cache_config"]["num_gpu_blocks"]
            .as_str()
            .map(str::to_owned),
        emu_snap.cache_config.get("num_gpu_blocks").cloned()
    );
    assert_eq!(latest["model_names"], json!(["m"]));
}

/// CPU seconds (user + system) a process has used, from `/proc/<pid>/stat` (Linux clock ticks of 10 ms).
fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// The same closed loop as the benchmark (`clients` requests always in flight, each replaced the moment it
/// finishes), run through the model alone in virtual time: what the emulator would deliver with zero overhead.
/// Returns (requests/s, generated tokens/s, mean e2e seconds) over `[warmup, warmup + secs]`.
fn ideal_closed_loop(
    gpu: &str,
    clients: u64,
    warmup: f64,
    secs: f64,
    prompt: u32,
    output: u32,
) -> (f64, f64, f64) {
    use tessera_sim::model::{Engine, EngineConfig, EngineEvent, GpuSpec, ModelSpec, Request};
    let gpu = GpuSpec::preset(gpu).unwrap();
    let mut cfg = EngineConfig::vllm_defaults(&gpu);
    cfg.max_num_seqs = 512;
    let mut e = Engine::new(ModelSpec::preset("qwen2-7b").unwrap(), gpu, cfg).unwrap();
    let mut next = 0u64;
    for _ in 0..clients {
        e.submit(Request::new(next, prompt, output), 0.0).unwrap();
        next += 1;
    }
    let (mut done, mut e2e_sum, mut gen0) = (0u64, 0.0, None);
    while let Some(t) = e.next_event_time() {
        if t > warmup + secs {
            break;
        }
        if t >= warmup && gen0.is_none() {
            gen0 = Some(e.stats().generation_tokens);
        }
        let mut finished = Vec::new();
        e.advance(t, &mut |ev| {
            if let EngineEvent::Finished { e2e, .. } = ev {
                finished.push(e2e);
            }
        });
        for x in finished {
            if t >= warmup {
                done += 1;
                e2e_sum += x;
            }
            e.submit(Request::new(next, prompt, output), t).unwrap();
            next += 1;
        }
    }
    let generated = (e.stats().generation_tokens - gen0.unwrap_or(0)) as f64;
    (done as f64 / secs, generated / secs, e2e_sum / done.max(1) as f64)
}

/// Drives `clients` concurrent streaming requests against one emulator for `secs` wall seconds after a warm-up
/// and prints its CPU use and what it delivered next to what the model alone delivers (same run).
async fn bench_streams(gpu: &str, time_scale: f64, clients: usize, prompt: u32, output: u32) {
    const SECS: f64 = 20.0;
    const WARMUP: f64 = 10.0;
    let scale = time_scale.to_string();
    let emu = Tessera::vllm_sim(&[
        "--served-model-name",
        "m",
        "--max-num-seqs",
        "512",
        "--gpu",
        gpu,
        "--time-scale",
        &scale,
    ]);
    let pid = emu.child.id().to_string();
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(300))
        .pool_max_idle_per_host(clients)
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let chunks = Arc::new(AtomicU64::new(0));
    let completed = Arc::new(AtomicU64::new(0));
    let e2e_ms = Arc::new(AtomicU64::new(0));
    let counting = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (c, url) = (c.clone(), emu.url("/v1/completions"));
        let (stop, chunks, completed, e2e_ms, counting) = (
            stop.clone(),
            chunks.clone(),
            completed.clone(),
            e2e_ms.clone(),
            counting.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                let n = stream_one(&c, &url, "m", prompt, output).await;
                if counting.load(Ordering::Relaxed) {
                    chunks.fetch_add(n as u64, Ordering::Relaxed);
                    completed.fetch_add(1, Ordering::Relaxed);
                    e2e_ms.fetch_add(t0.elapsed().as_millis() as u64, Ordering::Relaxed);
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(WARMUP / time_scale)).await;
    let before = snapshot(&c, &emu).await;
    let (cpu0, self0) = (cpu_seconds(&pid).unwrap(), cpu_seconds("self").unwrap());
    counting.store(true, Ordering::Relaxed);
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(SECS)).await;
    counting.store(false, Ordering::Relaxed);
    let wall = t0.elapsed().as_secs_f64();
    let (cpu1, self1) = (cpu_seconds(&pid).unwrap(), cpu_seconds("self").unwrap());
    let after = snapshot(&c, &emu).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(300), t).await;
    }
    let generated = after.generation_tokens_total.unwrap() - before.generation_tokens_total.unwrap();
    let e2e = after
        .e2e_latency
        .unwrap()
        .delta(before.e2e_latency.as_ref().unwrap());
    let (ideal_rps, ideal_tps, ideal_e2e) =
        ideal_closed_loop(gpu, clients as u64, WARMUP, SECS * time_scale, prompt, output);
    let done = completed.load(Ordering::Relaxed) as f64;
    let vsecs = wall * time_scale;
    println!(
        "bench: {clients} clients, {gpu}, time scale {time_scale}, prompt {prompt}, output {output}, \
         {wall:.1} s wall measured"
    );
    println!(
        "  CPU: emulator {:.2} cores, load generator (this test) {:.2} cores",
        (cpu1 - cpu0) / wall,
        (self1 - self0) / wall
    );
    println!(
        "  running at the end: {}, waiting {}",
        after.requests_running.unwrap(),
        after.requests_waiting.unwrap()
    );
    println!(
        "  tokens/s (wall): served {:.0}, received by clients {:.0}",
        generated / wall,
        chunks.load(Ordering::Relaxed) as f64 / wall
    );
    println!(
        "  tokens per model second: emulator {:.0}, model alone {ideal_tps:.0}, ratio {:.3}",
        generated / vsecs,
        generated / vsecs / ideal_tps
    );
    println!(
        "  requests per model second: emulator {:.2}, model alone {ideal_rps:.2}",
        done / vsecs
    );
    println!(
        "  mean e2e (model s): client-observed {:.2}, emulator histogram {:.2}, model alone {ideal_e2e:.2}",
        e2e_ms.load(Ordering::Relaxed) as f64 / 1000.0 / done.max(1.0) * time_scale,
        e2e.mean().unwrap_or(f64::NAN)
    );
}

/// 500 concurrent streams. Run with
/// `cargo test --release -p tessera --test emulator -- --ignored --nocapture bench_`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run explicitly in release mode"]
async fn bench_500_concurrent_streams() {
    // Realistic speed: an H100 serving Qwen2-7B, short prompts so the token rate is high.
    bench_streams("h100-80gb", 1.0, 500, 100, 200).await;
    // 4× faster than an H100: the emulator's own ceiling.
    bench_streams("h100-80gb", 4.0, 500, 100, 200).await;
}

/// How fast the model itself runs: the whole Azure LLM 2023 conversation hour (19,366 requests) through one
/// engine in virtual time, as the what-if simulator does. Run with
/// `cargo test --release -p tessera --test emulator -- --ignored --nocapture bench_model`.
#[test]
#[ignore = "benchmark: run explicitly in release mode"]
fn bench_model_replays_the_azure_hour() {
    use tessera_sim::model::{Engine, EngineConfig, EngineEvent, GpuSpec, ModelSpec, Request};
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/azure_llm_2023/AzureLLMInferenceTrace_conv.csv");
    let text = std::fs::read_to_string(&path).expect("testdata/azure_llm_2023 is in the repository");
    // TIMESTAMP is "2023-11-16 18:15:46.6805900"; the hour stays within one day, so hh:mm:ss is enough.
    let mut reqs = Vec::new();
    for line in text.lines().skip(1) {
        let mut f = line.split(',');
        let (ts, p, o) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
        let hms: Vec<f64> = ts
            .split(' ')
            .nth(1)
            .unwrap()
            .split(':')
            .map(|x| x.parse().unwrap())
            .collect();
        reqs.push((
            hms[0] * 3600.0 + hms[1] * 60.0 + hms[2],
            p.parse::<u32>().unwrap(),
            o.parse::<u32>().unwrap(),
        ));
    }
    let t_first = reqs[0].0;
    let gpu = GpuSpec::preset("h100-80gb").unwrap();
    let mut cfg = EngineConfig::vllm_defaults(&gpu);
    cfg.max_model_len = Some(32_768);
    let mut times = Vec::new();
    for _ in 0..5 {
        let t0 = Instant::now();
        let mut e = Engine::new(ModelSpec::preset("qwen2-7b").unwrap(), gpu.clone(), cfg.clone()).unwrap();
        let mut events = 0u64;
        for (i, (t, p, o)) in reqs.iter().enumerate() {
            let at = t - t_first;
            e.advance(at, &mut |_: EngineEvent| events += 1);
            // A few trace rows ask for more than 32k tokens in all; vLLM would reject them too.
            let _ = e.submit(Request::new(i as u64, (*p).max(1), (*o).max(1)), at);
        }
        while let Some(t) = e.next_event_time() {
            e.advance(t, &mut |_: EngineEvent| events += 1);
        }
        times.push(t0.elapsed().as_secs_f64());
        if times.len() == 1 {
            let s = e.stats();
            println!(
                "replayed {} requests, {} output tokens, {} steps, {} events, {} preemptions, TTFT p50 {:.3} s p99 {:.3} s",
                s.e2e.count,
                s.generation_tokens,
                s.steps,
                events,
                s.num_preemptions,
                s.ttft.quantile(0.5).unwrap(),
                s.ttft.quantile(0.99).unwrap()
            );
        }
    }
    times.sort_by(f64::total_cmp);
    println!(
        "model replay of the Azure hour on one engine: median {:.3} s over 5 runs (min {:.3}, max {:.3})",
        times[2], times[0], times[4]
    );
}

#[tokio::test]
async fn disconnected_clients_are_aborted_and_free_their_blocks() {
    // One sequence at a time: the first request runs, the second waits in the queue.
    let emu = Tessera::vllm_sim(&["--served-model-name", "m", "--max-num-seqs", "1"]);
    let c = client();
    let body = json!({"model": "m", "prompt": "x", "tessera_prompt_tokens": 500, "max_tokens": 5000,
                      "ignore_eos": true, "stream": true});
    let running = support::post_json(&c, &emu.url("/v1/completions"), &body).await;
    let waiting = support::post_json(&c, &emu.url("/v1/completions"), &body).await;
    assert_eq!((running.status().as_u16(), waiting.status().as_u16()), (200, 200));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let s = snapshot(&c, &emu).await;
    assert_eq!((s.requests_running, s.requests_waiting), (Some(1.0), Some(1.0)));
    assert!(s.kv_cache_usage.unwrap() > 0.0);
    drop(running);
    drop(waiting);
    let t0 = Instant::now();
    loop {
        let s = snapshot(&c, &emu).await;
        if s.request_success_total.get("abort") == Some(&2.0) {
            assert_eq!((s.requests_running, s.requests_waiting), (Some(0.0), Some(0.0)));
            assert_eq!(s.kv_cache_usage, Some(0.0), "aborted requests free their blocks");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "not aborted after 10 s: {:?}",
            s.request_success_total
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
