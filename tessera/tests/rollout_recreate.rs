//! `gpu.updateMode: Recreate` through the real binaries: the emulator and a real sidecar recommend memory for a
//! model whose pods run with a whole 80 GiB; `tessera autoscaler` (against the in-memory API server) brings the
//! recommendation into force once it is stable, sees the running pods drift, and rolls the Deployment by patching
//! its pod template. The test plays the Deployment controller and the webhook: on a new template it replaces the
//! pods with ones annotated with the allocation in force. Prints the Events and conditions as `kubectl describe
//! ias` would show them (the timeline in docs/autoscaling.md).
#![allow(clippy::unwrap_used)] // test: a failed request or lock is a test failure

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::Tessera;
use support::apiserver::{ApiServer, DEPLOYMENTS, EVENTS, IAS, PODS};

const HASH: &str = "tessera.dev/allocation-hash";
const COST: &str = "controller.kubernetes.io/pod-deletion-cost";

fn pod(name: &str, sidecar_port: u16, memory_mib: i64, compute: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "labels": {"app": "llama"},
                        "annotations": {"tessera.dev/sidecar-port": sidecar_port.to_string(),
                                        "tessera.dev/gpu-memory": memory_mib.to_string(),
                                        "tessera.dev/gpu-compute-fraction": compute}},
           "status": {"podIP": "127.0.0.1", "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::too_many_lines,
    reason = "one story against real processes, told in order: each step starts from the state the last one left"
)]
async fn roll_recreate_through_the_real_binary_rolls_once_and_reports_in_sync() {
    let vllm = Tessera::vllm_sim(&["--served-model-name", "llama"]);
    let sidecar = Tessera::sidecar(
        &vllm.base(),
        &[
            "--no-nvml",
            "--gpu-memory-mib",
            "81920",
            // The emulator's default model (Qwen2-7B's geometry: 57,344 B per KV token).
            "--bytes-per-kv-token",
            "57344",
            "--scrape-interval",
            "250ms",
            "--min-window",
            "2s",
            "--min-samples",
            "4",
        ],
    );
    let port = sidecar.addr.port();
    let api = ApiServer::start().await;
    api.put(
        IAS,
        "models",
        json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "InferenceAutoscaler",
               "metadata": {"name": "llama", "namespace": "models"},
               "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"},
                        "minReplicas": 1, "maxReplicas": 2, "targets": {"kvCacheUtilization": 0.9},
                        "modelNames": ["llama"], "gpu": {"sharing": "whole", "updateMode": "Recreate"}}}),
    );
    api.put(
        DEPLOYMENTS,
        "models",
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "llama", "generation": 1},
               "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "llama"}},
                        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                        "template": {"metadata": {"labels": {"app": "llama"}}}},
               "status": {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2}}),
    );
    for i in 0..2 {
        api.put(PODS, "models", pod(&format!("llama-old-{i}"), port, 81_920, "1"));
    }
    // The Deployment controller and the webhook, played by the test: a new template hash replaces the pods with
    // ones that run the allocation in force.
    let cluster = api.clone();
    // The deletion cost each old pod carried when it was replaced: the controller marks pods that run another
    // allocation so that a scale-down takes them first.
    let costs_seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Value>::new()));
    let costs = costs_seen.clone();
    tokio::spawn(async move {
        let mut seen: Option<String> = None;
        loop {
            let d = cluster.get(DEPLOYMENTS, "models", "llama").unwrap_or_default();
            let hash = d["spec"]["template"]["metadata"]["annotations"][HASH]
                .as_str()
                .map(str::to_owned);
            if hash.is_some() && hash != seen {
                let ias = cluster.get(IAS, "models", "llama").unwrap_or_default();
                let f = &ias["status"]["allocation"]["inForce"];
                let mib = f["gpuMemoryMiB"].as_i64().unwrap_or(0);
                for i in 0..2 {
                    let old = cluster
                        .get(PODS, "models", &format!("llama-old-{i}"))
                        .unwrap_or_default();
                    costs
                        .lock()
                        .unwrap()
                        .push(old["metadata"]["annotations"][COST].clone());
                    cluster.delete_object(PODS, "models", &format!("llama-old-{i}"));
                    cluster.put(PODS, "models", pod(&format!("llama-new-{i}"), port, mib, "1"));
                }
                let mut d2 = d.clone();
                let gen_ = d["metadata"]["generation"].as_i64().unwrap_or(1);
                d2["status"]["observedGeneration"] = json!(gen_);
                cluster.put(DEPLOYMENTS, "models", d2);
                seen = hash;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(dir.path());
    let metrics = support::free_port().to_string();
    let _autoscaler = Tessera::start_with_env(
        &[
            "autoscaler",
            "--sync-period",
            "1s",
            "--leader-elect",
            "false",
            "--metrics-listen",
            &format!("127.0.0.1:{metrics}"),
            "--rollout-stability-window",
            "3s",
        ],
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    );
    let t0 = Instant::now();
    let mut timeline: Vec<String> = Vec::new();
    let mut last_condition = String::new();
    let mut done = false;
    while t0.elapsed() < Duration::from_secs(90) {
        let ias = api.get(IAS, "models", "llama").unwrap_or_default();
        let cond = ias["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "AllocationInSync")
            .cloned();
        if let Some(c) = cond {
            let line = format!(
                "{} {} {}",
                c["status"].as_str().unwrap_or(""),
                c["reason"].as_str().unwrap_or(""),
                c["message"].as_str().unwrap_or("")
            );
            if line != last_condition {
                timeline.push(format!(
                    "{:>5.1}s  condition AllocationInSync={line}",
                    t0.elapsed().as_secs_f64()
                ));
                last_condition = line;
            }
            if c["status"] == "True" && !api.list(EVENTS).is_empty() {
                done = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let events: Vec<Value> = api
        .list(EVENTS)
        .into_iter()
        .filter(|e| e["reason"] == "AllocationRoll")
        .collect();
    for e in &events {
        timeline.push(format!(
            "event  Normal AllocationRoll  {}",
            e["note"].as_str().unwrap_or("")
        ));
    }
    let ias = api.get(IAS, "models", "llama").unwrap_or_default();
    println!(
        "roll timeline (kubectl describe ias llama):\n  {}",
        timeline.join("\n  ")
    );
    println!("status.allocation: {}", ias["status"]["allocation"]);
    assert!(
        done,
        "no roll reached AllocationInSync=True; timeline:\n{}",
        timeline.join("\n")
    );
    assert_eq!(events.len(), 1, "exactly one roll: {events:?}");
    let d = api.get(DEPLOYMENTS, "models", "llama").unwrap();
    assert!(d["spec"]["template"]["metadata"]["annotations"][HASH].is_string());
    let in_force = ias["status"]["allocation"]["inForce"]["gpuMemoryMiB"]
        .as_i64()
        .unwrap();
    assert!(
        in_force < 81_920,
        "the roll shrank the allocation: {in_force} MiB"
    );
    // Before the roll, both old pods ran another allocation and were marked to go first on a scale-down
    // (`i32::MIN / 2`); the new pods run the allocation in force and carry no mark.
    assert_eq!(
        *costs_seen.lock().unwrap(),
        vec![json!("-1073741824"), json!("-1073741824")]
    );
    let new_pod = api.get(PODS, "models", "llama-new-0").unwrap();
    assert!(new_pod["metadata"]["annotations"][COST].is_null(), "{new_pod}");
}
