//! Sleep mode end to end through the real processes: `tessera autoscaler` against the in-memory API server
//! (`support/apiserver.rs`), a real sidecar in front of the emulator with sleep mode, and a real activator. The
//! test plays the kubelet and the Deployment controller: it keeps one pod per replica, copies the pod's
//! annotations into the sidecar's downward-API file, and sets the pod's Ready condition from the sidecar's
//! `/ready` (the readiness probe the webhook points at it).
//!
//! An idle model whose 28 s cold start misses its 2 s objective is kept as a sleeping pod (`/scale` stays 1, the
//! pod annotated, `status.rest` says why), a request through the activator wakes it, and once idle again it is
//! told to sleep anew with a later instruction.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod support;
use support::apiserver::{ApiServer, DEPLOYMENTS, IAS, PODS};
use support::sleep::{Replica, kubelet};
use support::{Tessera, free_port, get_json, http_client};

fn pod(name: &str, sidecar_port: u16, ready: bool) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "labels": {"app": "llama"}, "creationTimestamp": "2026-01-01T00:00:00Z",
                        "annotations": {"tessera.dev/sidecar-port": sidecar_port.to_string()}},
           "status": {"podIP": "127.0.0.1", "phase": "Running",
                      "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" },
                                      "lastTransitionTime": "2026-01-01T00:00:28Z"}]}})
}

/// One completion through the activator, answered 200.
async fn complete(c: &reqwest::Client, act: &Tessera) {
    let body = json!({"model": "m", "prompt": "hello", "max_tokens": 4});
    let r = support::post_json(c, &act.url("/v1/completions"), &body).await;
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn the_controller_puts_an_idle_model_to_sleep_and_a_request_wakes_it() {
    let c = http_client(Duration::from_secs(30));
    let dir = tempfile::tempdir().unwrap();
    let llama = Replica::start(dir.path(), "llama");
    let sc = &llama.sidecar;
    let act = Tessera::waking_activator(
        &llama.emu,
        sc,
        &["--probe-interval", "50ms", "--hold-timeout", "20s"],
    );

    let api = ApiServer::start().await;
    api.put(
        IAS,
        "default",
        json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "InferenceAutoscaler",
               "metadata": {"name": "llama", "uid": "u-1", "generation": 1},
               "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "llama"}, "minReplicas": 0,
                        "maxReplicas": 2, "scaleToZero": {"idleAfter": "2s"}, "modelNames": ["m"],
                        "ttftSlo": "2s", "sleep": {"enabled": true, "level": 1, "expectedWake": "500ms"}}}),
    );
    api.put(
        DEPLOYMENTS,
        "default",
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "llama"},
               "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "llama"}}}}),
    );
    api.put(PODS, "default", pod("llama-0", llama.port(), true));

    // The kubelet and the Deployment controller.
    let kubelet = kubelet(&api, &c, &[&llama]);

    let metrics_port = free_port();
    let kubeconfig = api.kubeconfig(dir.path());
    let _autoscaler = support::start_autoscaler(
        "test-0",
        &kubeconfig,
        metrics_port,
        &["--activator-url", &act.admin_base()],
    );

    // A first request, then nothing: once idle the controller keeps the pod and tells it to sleep.
    complete(&c, &act).await;
    let deadline = Instant::now() + Duration::from_secs(40);
    let first = loop {
        let rest = get_json(&c, &sc.url("/v1/status")).await["rest"].clone();
        let status = api
            .get(IAS, "default", "llama")
            .map(|o| o["status"].clone())
            .unwrap_or_default();
        if rest["state"] == "sleeping" && status["rest"]["sleeping"] == 1 {
            assert_eq!(status["rest"]["atZero"], "sleep", "{status}");
            assert_eq!(status["rest"]["reason"], "wake_shortens_cold_start", "{status}");
            break api.get(PODS, "default", "llama-0").unwrap()["metadata"]["annotations"]["tessera.dev/rest"]
                .as_str()
                .unwrap()
                .to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "never slept: sidecar {rest}, status {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(first.starts_with("sleep level=1 since="), "{first}");
    let replicas =
        |api: &ApiServer| api.get(DEPLOYMENTS, "default", "llama").unwrap()["spec"]["replicas"].as_i64();
    assert_eq!(replicas(&api), Some(1), "the sleeping pod is kept");
    assert!(
        api.list("events.k8s.io/v1/events")
            .iter()
            .any(|e| e["reason"] == "Sleeping"),
        "a Sleeping event"
    );

    // A request through the activator wakes it.
    let t0 = Instant::now();
    complete(&c, &act).await;
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    println!(
        "a request through the activator to the sleeping replica was answered in {:.0} ms",
        waited.as_secs_f64() * 1e3
    );

    // Idle again: a later instruction, and asleep once more; the pod was never deleted.
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let rest = get_json(&c, &sc.url("/v1/status")).await["rest"].clone();
        let now = api.get(PODS, "default", "llama-0").unwrap()["metadata"]["annotations"]["tessera.dev/rest"]
            .clone();
        if rest["state"] == "sleeping" && rest["wakes_total"] == 1 && now.as_str().is_some_and(|n| n != first)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never slept again: sidecar {rest}, instruction {now}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(replicas(&api), Some(1));
    kubelet.abort();
}
