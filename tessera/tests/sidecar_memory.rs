//! The real `tessera sidecar` against a real `tessera vllm-sim` started with a fixed KV size
//! (`--kv-cache-memory-bytes`), over 127.0.0.1: the page still says `gpu_memory_utilization 0.9`, and the sidecar
//! must not derive non-KV memory from it (issue 18). With `--model-dir` it takes bytes per token from the model's
//! `config.json` (testdata/models/qwen2-7b, the emulator's default model).
//!
//! The same check against a real vLLM (CPU build, `VLLM_CPU_KVCACHE_SPACE`) is the follow-up named in the
//! lead's notes: "sidecar against a real vLLM with a fixed KV size".
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};
use tessera_core::recommend::{MemoryMode, NotYetCode, Outcome, Source};
use tessera_core::wire::sidecar::SidecarStatus;

mod support;
use support::Tessera;

const GIB: u64 = 1024 * 1024 * 1024;

async fn status(base: &str) -> Option<SidecarStatus> {
    let r = reqwest::get(format!("{base}/v1/status")).await.ok()?;
    r.json().await.ok()
}

/// Polls `/v1/status` until `pred` holds, or fails after `secs` with the last document.
async fn wait_for(base: &str, what: &str, secs: u64, pred: impl Fn(&SidecarStatus) -> bool) -> SidecarStatus {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(s) = status(base).await
            && pred(&s)
        {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; last /v1/status: {:?}",
            status(base).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn sidecar(vllm: &str, extra: &[&str]) -> Tessera {
    let model_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/models/qwen2-7b");
    let mut args = vec!["--gpu-memory-mib", "81920", "--model-dir", model_dir];
    args.extend_from_slice(extra);
    Tessera::quick_sidecar(vllm, &args, &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_kv_server_is_sized_from_the_models_geometry_never_the_utilization() {
    // An 80 GiB A100 with a 2 GiB fixed KV cache: the old budget rule read 0.9 × 80 − 2 = 70 GiB as non-KV.
    let emu = Tessera::vllm_sim(&["--served-model-name", "qwen", "--kv-cache-memory-bytes", "2Gi"]);
    let vllm = emu.base();

    // Without NVML or --non-kv-memory-mib, non-KV memory has no true source in fixed-KV mode.
    let plain = sidecar(&vllm, &[]);
    let s = wait_for(&plain.base(), "a decision with the mode stated", 30, |s| {
        s.memory.is_some()
            && matches!(
                s.recommendation.outcome,
                Outcome::NotYet {
                    code: NotYetCode::UnknownNonKvMemory,
                    ..
                }
            )
    })
    .await;
    let memory = s.memory.unwrap();
    assert_eq!(memory.mode, MemoryMode::FixedKv, "{}", memory.mode_reason);
    let model = memory.model.unwrap();
    assert_eq!(model.bytes_per_kv_token, Some(57_344), "{model:?}");
    assert_eq!(model.error, None);
    let Outcome::NotYet { reason, .. } = &s.recommendation.outcome else {
        unreachable!()
    };
    assert!(
        reason.contains("--non-kv-memory-mib") && reason.contains("57344 bytes each from ModelConfig"),
        "{reason}"
    );

    // With the non-KV memory given, a recommendation sized from the model's bytes per token.
    let given = sidecar(&vllm, &["--non-kv-memory-mib", "15360"]);
    let s = wait_for(&given.base(), "a recommendation", 30, |s| {
        s.recommendation().is_some()
    })
    .await;
    let r = s.recommendation().unwrap();
    assert_eq!(r.bytes_per_kv_token, 57_344);
    assert_eq!(r.bytes_per_kv_token_source, Source::ModelConfig);
    assert_eq!(r.non_kv_source, Source::Configured);
    assert_eq!(r.non_kv_bytes, 15 * GIB);
    // Idle, so one 32,768-token sequence: 1.75 GiB of KV, ~17 GiB in all — not the ~72 GiB the old rule gave.
    assert!(
        r.gpu_memory_mib < 20 * 1024,
        "{} MiB: {:?}",
        r.gpu_memory_mib,
        r.reasons
    );
    assert!(
        r.reasons.iter().any(|x| x.message.contains("FixedKv mode")),
        "{:?}",
        r.reasons
    );
}
