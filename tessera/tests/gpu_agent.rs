//! `tessera gpu-agent` as a real process, with a pod identity and a kubeconfig pointing at a local fake API
//! server. Where NVML is missing (like here) the agent must publish nothing (not one request to the API
//! server), keep serving, and say on `/ready` that the GPU UUID is unknown. Where NVML is present the test
//! only checks that it serves.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use support::Tessera;

/// A kubeconfig for `server`, with a token (no TLS: the fake speaks plain HTTP on loopback).
fn kubeconfig(server: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {server}\n\
         users:\n- name: fake\n  user:\n    token: test\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: tessera-system\n\
         current-context: fake\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_nvml_the_agent_publishes_nothing_and_is_not_ready() {
    // The fake API server counts every request; it answers 404 so a stray request would also show in logs.
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    let app = axum::Router::new().fallback(move || {
        counted.fetch_add(1, Ordering::SeqCst);
        async { (axum::http::StatusCode::NOT_FOUND, "{}") }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("kubeconfig");
    std::fs::write(&cfg, kubeconfig(&format!("http://{api}"))).unwrap();

    let agent = Tessera::start_with_env(
        &[
            "gpu-agent",
            "--listen",
            "127.0.0.1:0",
            "--interval",
            "100ms",
            "--pod-name",
            "tessera-gpu-p-0",
        ],
        &[
            ("KUBECONFIG", cfg.to_str().unwrap()),
            ("POD_NAMESPACE", "tessera-system"),
            (
                "NVIDIA_VISIBLE_DEVICES",
                "GPU-00000000-0000-0000-0000-000000000000",
            ),
        ],
    );
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status: serde_json::Value = loop {
        if let Ok(r) = http.get(agent.url("/v1/gpus")).send().await
            && let Ok(v) = r.json::<serde_json::Value>().await
            && v["error"] != "no reading yet"
        {
            break v;
        }
        assert!(Instant::now() < deadline, "gpu-agent did not serve a reading");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let ready = http.get(agent.url("/ready")).send().await.unwrap();
    let code = ready.status().as_u16();
    let text = ready.text().await.unwrap();
    if status["nvml_up"] == false {
        assert_eq!(code, 503, "{text}");
        assert!(text.contains("GPU UUID unknown"), "{text}");
        // A few more readings: still nothing sent to the API server.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(hits.load(Ordering::SeqCst), 0, "published without a UUID");
        let metrics = support::get_text(&http, &agent.url("/metrics")).await;
        assert!(
            metrics.contains("tessera_gpu_agent_uuid_published 0"),
            "{metrics}"
        );
    } else {
        eprintln!("NVML is present here: only checking that the agent serves ({text})");
    }
    assert_eq!(
        http.get(agent.url("/live"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    drop(agent);
    server.abort();
}
