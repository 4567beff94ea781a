//! Consolidation end to end: `tessera autoscaler` as a process (its controller and its pool manager), against the
//! in-memory API server of `support/apiserver.rs`.
//!
//! Two capacity pods of one pool each hold one fractional replica of a different model, and one GPU could hold
//! both. The test plays what the cluster would do around Tessera: the ReplicaSet controller (a pod per replica; on
//! a scale-down, the pod with the lowest `pod-deletion-cost` goes) and the webhook's placement (a new pod is booked
//! on a GPU that is not draining). It then watches the real binary, through the API alone:
//! 1. the pool manager marks the lighter GPU draining once it stayed emptiable for the settle time;
//! 2. the controller surges the model on it to two replicas (`Consolidating: Surge`), and once the copy is ready
//!    marks the old pod with the lowest deletion cost and goes back to one;
//! 3. the pool manager frees the old pod's share, ends the drain, and releases the empty GPU after the grace;
//! 4. the other model is never touched, and the drain metrics say what happened.

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::routing::get;
use serde_json::{Value, json};

mod support;
use support::apiserver::{ApiServer, DEPLOYMENTS, IAS, PODS};
use support::pool::{POOL_NS, capacity_pod, reservation};
use support::{Killed, free_port, serve};

const DRAINING: &str = "tessera.dev/draining-since";
const COST: &str = "controller.kubernetes.io/pod-deletion-cost";

/// A model pod as the webhook leaves it: in the pool, booked on `capacity`, owned by its ReplicaSet, Ready.
fn model_pod(model: &str, n: usize, capacity: &str, sidecar_port: u16) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": format!("{model}-{n}"), "labels": {"app": model, "tessera.dev/pool": "p"},
                        "annotations": {"tessera.dev/reservation": format!("r-{model}-{n}"),
                                        "tessera.dev/capacity-pod": capacity,
                                        "tessera.dev/sidecar-port": sidecar_port.to_string()},
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("{model}-rs"),
                                             "uid": format!("rs-{model}"), "controller": true}]},
           "spec": {"containers": []},
           "status": {"podIP": "127.0.0.1", "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
}

/// What the test saw the binary do, for assertions and for the failure message.
#[derive(Default, Debug)]
struct Seen {
    /// Replica counts written to each Deployment, in order.
    scales: Vec<(String, i64)>,
    /// `Consolidating` condition reasons seen on b's InferenceAutoscaler.
    conditions: Vec<String>,
    /// Pods the ReplicaSet stand-in removed, with the deletion cost they carried.
    removed: Vec<(String, Option<String>)>,
    /// The drain marks seen on each capacity pod.
    drained: Vec<String>,
}

/// Plays the ReplicaSet controller and the webhook's placement for Deployments `a` and `b`.
fn play_the_cluster(api: ApiServer, sidecar_port: u16, seen: Arc<Mutex<Seen>>) {
    tokio::spawn(async move {
        let mut replicas = std::collections::BTreeMap::from([("a".to_owned(), 1i64), ("b".to_owned(), 1i64)]);
        let mut next = 1usize;
        loop {
            for model in ["a", "b"] {
                let want = api.wanted_replicas("models", model);
                if replicas.get(model) != Some(&want) {
                    replicas.insert(model.to_owned(), want);
                    seen.lock().expect("lock").scales.push((model.to_owned(), want));
                }
                let pods: Vec<Value> = api
                    .list(PODS)
                    .into_iter()
                    .filter(|p| p["metadata"]["labels"]["app"] == model)
                    .collect();
                let have = pods.len() as i64;
                if have < want {
                    // The webhook: book the new pod on a GPU that is not draining, with room.
                    let caps: Vec<Value> = api
                        .list(PODS)
                        .into_iter()
                        .filter(|p| p["metadata"]["labels"]["tessera.dev/capacity-pod"] == "true")
                        .collect();
                    let target = caps
                        .iter()
                        .find(|c| c["metadata"]["annotations"][DRAINING].is_null())
                        .expect("a GPU that is not draining");
                    let name = target["metadata"]["name"].as_str().expect("name").to_owned();
                    let mut doc: Value = serde_json::from_str(
                        target["metadata"]["annotations"]["tessera.dev/reservations"]
                            .as_str()
                            .expect("reservations"),
                    )
                    .expect("reservations JSON");
                    doc["reservations"]
                        .as_array_mut()
                        .expect("list")
                        .push(reservation(
                            &format!("r-{model}-{next}"),
                            &format!("models/{model}"),
                            200,
                        ));
                    let mut cap = target.clone();
                    cap["metadata"]["annotations"]["tessera.dev/reservations"] = json!(doc.to_string());
                    api.put(PODS, POOL_NS, cap);
                    api.put(PODS, "models", model_pod(model, next, &name, sidecar_port));
                    next += 1;
                } else if have > want {
                    // The ReplicaSet: the lowest pod-deletion-cost goes first.
                    let cost = |p: &Value| {
                        p["metadata"]["annotations"][COST]
                            .as_str()
                            .and_then(|c| c.parse::<i64>().ok())
                            .unwrap_or(0)
                    };
                    let victim = pods.iter().min_by_key(|p| cost(p)).expect("a pod");
                    let name = victim["metadata"]["name"].as_str().expect("name").to_owned();
                    let carried = victim["metadata"]["annotations"][COST]
                        .as_str()
                        .map(str::to_owned);
                    api.delete_object(PODS, "models", &name);
                    seen.lock().expect("lock").removed.push((name, carried));
                }
            }
            if let Some(b) = api.get(IAS, "models", "b")
                && let Some(c) = b["status"]["conditions"]
                    .as_array()
                    .and_then(|cs| cs.iter().find(|c| c["type"] == "Consolidating"))
            {
                let reason = c["reason"].as_str().unwrap_or_default().to_owned();
                let mut s = seen.lock().expect("lock");
                if s.conditions.last() != Some(&reason) {
                    s.conditions.push(reason);
                }
            }
            for slot in 0..2 {
                if let Some(c) = api.get(PODS, POOL_NS, &format!("tessera-gpu-p-{slot}"))
                    && c["metadata"]["annotations"][DRAINING].is_string()
                {
                    let name = format!("tessera-gpu-p-{slot}");
                    let mut s = seen.lock().expect("lock");
                    if !s.drained.contains(&name) {
                        s.drained.push(name);
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

async fn wait_for(what: &str, seen: &Arc<Mutex<Seen>>, timeout: Duration, f: impl Fn() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; seen {:?}",
            seen.lock().expect("lock")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_is_emptied_by_moving_its_replica_and_then_released() {
    // Every replica reports a KV cache at its target: the decision stays at one replica throughout, so every
    // change of a count is consolidation's.
    let sidecar = serve(Router::new().route(
        "/v1/status",
        get(|| async {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .expect("clock")
                .as_secs_f64();
            axum::Json(json!({
                "schema_version": 1, "generated_at": now, "vllm_url": "http://127.0.0.1:8000", "vllm_up": true,
                "ready": true, "stale": false, "scrape": {"interval_secs": 1.0, "successes_total": 5},
                "latest": {"at": now, "kv_cache_usage_ratio": 0.5, "requests_running": 1.0, "requests_waiting": 0.0},
                "recommendation": {"outcome": {"state": "not_yet", "code": "too_few_samples", "reason": "test"}}
            }))
        }),
    ))
    .await;
    let api = ApiServer::start().await;
    // GPU 0 holds a (300 milli), GPU 1 holds b (200): GPU 1 is the cheaper to empty, onto GPU 0.
    api.put(
        PODS,
        POOL_NS,
        capacity_pod(0, &[reservation("r-a-0", "models/a", 300)]),
    );
    api.put(
        PODS,
        POOL_NS,
        capacity_pod(1, &[reservation("r-b-0", "models/b", 200)]),
    );
    for (model, gpu) in [("a", 0), ("b", 1)] {
        api.put(
            DEPLOYMENTS,
            "models",
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": model},
                   "spec": {"replicas": 1, "selector": {"matchLabels": {"app": model}}}}),
        );
        api.put(
            IAS,
            "models",
            json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "InferenceAutoscaler", "metadata": {"name": model},
                   "spec": {"scaleTargetRef": {"kind": "Deployment", "name": model}, "minReplicas": 1,
                            "maxReplicas": 3, "targets": {"kvCacheUtilization": 0.5}}}),
        );
        api.put(
            PODS,
            "models",
            model_pod(model, 0, &format!("tessera-gpu-p-{gpu}"), sidecar.port()),
        );
    }
    let seen = Arc::new(Mutex::new(Seen::default()));
    play_the_cluster(api.clone(), sidecar.port(), seen.clone());

    let dir = tempfile::tempdir().expect("tempdir");
    let pools = dir.path().join("pools.yaml");
    std::fs::write(
        &pools,
        "namespace: tessera-system\nimage: tessera:test\npools:\n- name: p\n  gpuMemoryMiB: 81920\n  sharing: mps\n  \
         maxGpus: 4\n  emptyGpuGracePeriod: 3s\n  computeOversubscription: 1.0\n  consolidation: {settle: 2s}\n",
    )
    .expect("write pools");
    let metrics_port = free_port();
    let _autoscaler = Killed(
        Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["autoscaler", "--sync-period", "1s", "--retry-period", "500ms"])
            .args([
                "--pools-config",
                pools.to_str().expect("utf-8 path"),
                "--pool-interval",
                "500ms",
            ])
            .args(["--metrics-listen", &format!("127.0.0.1:{metrics_port}")])
            .args(["--lease-namespace", "default", "--identity", "test-0"])
            .env("KUBECONFIG", api.kubeconfig(dir.path()))
            .env("RUST_LOG", "info,kube=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start tessera autoscaler"),
    );

    let s = seen.clone();
    wait_for("GPU 1 to be drained", &seen, Duration::from_secs(30), || {
        s.lock().expect("lock").drained == ["tessera-gpu-p-1"]
    })
    .await;
    let s = seen.clone();
    wait_for(
        "b's pod on GPU 1 to be retired",
        &seen,
        Duration::from_secs(30),
        || s.lock().expect("lock").removed.iter().any(|(n, _)| n == "b-0"),
    )
    .await;
    let api2 = api.clone();
    wait_for(
        "the emptied GPU to be released",
        &seen,
        Duration::from_secs(30),
        || api2.get(PODS, POOL_NS, "tessera-gpu-p-1").is_none(),
    )
    .await;

    {
        let seen = seen.lock().expect("lock");
        // b went 1 → 2 (the surge) → 1; a was never scaled.
        assert_eq!(
            seen.scales,
            [("b".to_owned(), 2), ("b".to_owned(), 1)],
            "{seen:?}"
        );
        // The pod that went is the one on the draining GPU, chosen by its deletion cost; its copy stands on GPU 0.
        assert_eq!(
            seen.removed,
            [("b-0".to_owned(), Some(i32::MIN.to_string()))],
            "{seen:?}"
        );
        let copy = api
            .list(PODS)
            .into_iter()
            .find(|p| p["metadata"]["labels"]["app"] == "b")
            .expect("b's copy");
        assert_eq!(
            copy["metadata"]["annotations"]["tessera.dev/capacity-pod"],
            "tessera-gpu-p-0"
        );
        assert!(
            api.get(PODS, "models", "a-0").is_some(),
            "a's pod was never touched"
        );
        assert!(
            seen.conditions.first().map(String::as_str) == Some("Surge")
                && seen.conditions.iter().any(|c| c == "Retire"),
            "b's status said what it did: {:?}",
            seen.conditions
        );
    }
    let metrics = support::get_text(
        &reqwest::Client::new(),
        &format!("http://127.0.0.1:{metrics_port}/metrics"),
    )
    .await;
    for line in [
        "tessera_pool_drains_total{pool=\"p\",result=\"started\"} 1",
        "tessera_pool_drains_total{pool=\"p\",result=\"drained\"} 1",
        "tessera_pool_capacity_pods_deleted_total{pool=\"p\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} missing from /metrics:\n{metrics}");
    }
}
