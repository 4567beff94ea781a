//! `tessera vllm-sim` against what a real vLLM 0.32.0 server showed (`testdata/vllm/real/`, captured by
//! `scripts/capture_real_vllm.py`): every `vllm:` family with the same TYPE, HELP, label names and bucket bounds;
//! the same JSON shapes for `/v1/models`, plain and streamed completions (chunks, usage) and error bodies; the same
//! `/health` answer. Runs everywhere (the real side is committed); `real_vllm.rs` runs the same diff against a
//! live server. Each difference the emulator keeps on purpose is listed here with its reason (and in
//! docs/emulator.md).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};

mod support;
mod vllm_surface;
use support::Tessera;
use vllm_surface::{Chunking, api_diff, diff_metrics};

/// (page, the server's --max-model-len: the token-count histograms' bounds are 1-2-5 steps up to it).
const REAL_PAGES: [(&str, &str, &str); 6] = [
    (
        "after-load",
        include_str!("../../testdata/vllm/real/metrics-after-load.txt"),
        "1024",
    ),
    (
        "idle",
        include_str!("../../testdata/vllm/real/metrics-idle.txt"),
        "1024",
    ),
    (
        "running",
        include_str!("../../testdata/vllm/real/metrics-running.txt"),
        "1024",
    ),
    (
        "waiting",
        include_str!("../../testdata/vllm/real/metrics-waiting.txt"),
        "1024",
    ),
    (
        "fresh-small-cache",
        include_str!("../../testdata/vllm/real/metrics-fresh-small-cache.txt"),
        "768",
    ),
    (
        "preemption",
        include_str!("../../testdata/vllm/real/metrics-preemption.txt"),
        "768",
    ),
];
const REAL_API: &str = include_str!("../../testdata/vllm/real/api.json");

/// The emulator started the way the real server was (served name, context length, batch size), so that the
/// bucket bounds that depend on `max_model_len` agree. Fast (20×) so a request finishes at once.
fn emulator(max_model_len: &str) -> Tessera {
    Tessera::vllm_sim(&[
        "--served-model-name",
        "tiny-llama",
        "--max-model-len",
        max_model_len,
        "--max-num-seqs",
        "8",
        "--time-scale",
        "20",
    ])
}

fn real_api() -> Value {
    serde_json::from_str(REAL_API).expect("api.json is JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_match_the_real_pages() {
    let http = reqwest::Client::new();
    let mut report = Vec::new();
    for (name, real, max_model_len) in REAL_PAGES {
        let emu = emulator(max_model_len);
        // One finished request, so every histogram has observations (the shape is the same either way).
        let r = support::post_json(
            &http,
            &emu.url("/v1/completions"),
            &json!({"model": "tiny-llama", "prompt": [11, 12, 13], "max_tokens": 4}),
        )
        .await;
        assert_eq!(r.status(), 200);
        let sim = support::get_text(&http, &emu.url("/metrics")).await;
        for d in diff_metrics(real, &sim, &[], &[]) {
            report.push(format!("[{name}] {d}"));
        }
    }
    assert!(
        report.is_empty(),
        "the emulator's /metrics differs from the real vLLM 0.32.0 pages:\n{}",
        report.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_answers_match_the_real_server() {
    let emu = emulator("1024");
    let real = real_api();
    let report = api_diff(&emu.base(), &real, Chunking::AsRecorded).await;
    assert!(
        report.is_empty(),
        "the emulator's API differs from the real vLLM 0.32.0 answers:\n{}",
        report.join("\n")
    );
}
