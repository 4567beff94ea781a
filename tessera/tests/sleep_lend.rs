//! Lending a sleeping replica's GPU room (`gpuPools.lendSleepers`) through the real processes: `tessera autoscaler`
//! (its leader's pool manager) and a new replica's `tessera sidecar` (its start-up gate), against the in-memory API
//! server of `support/apiserver.rs`. The webhook's write is made by the webhook's own code, in process
//! (`tessera_pool::PoolManager::reserve`, what `tessera webhook` calls at admission); the test plays the kubelet.
//!
//! One GPU of a one-GPU pool holds an awake replica (300 milli) and a sleeping one (600). A new replica of 500 fits
//! only in the sleeper's room, and the pool may not open a GPU. The leader marks the sleeper's reservation asleep;
//! the webhook lends its room; the leader takes the GPU's start-up Lease and deletes the sleeper; while the sleeper
//! terminates the new replica's start-up gate waits on that Lease; once the sleeper is gone the Lease is released and
//! the new replica's gate opens.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod support;
use support::apiserver::{ApiServer, LEASES, PODS};
use support::pool::{POOL_NS, now_s, put_one_gpu};
use support::{Tessera, free_port};

const CAPACITY: &str = "tessera-gpu-p-0";
const LEASE: &str = "tessera-startup-gpu-0";
/// The test's stand-in for the kubelet's graceful termination: a deleted pod lingers until it is removed.
const KUBELET: &str = "test.tessera.dev/kubelet";

/// A model pod as the webhook leaves it (in the pool, booked on the capacity pod), Ready or not, and told to sleep
/// (the controller's `tessera.dev/rest`) or not.
fn model_pod(name: &str, reservation: &str, ready: bool, asleep: bool) -> Value {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "labels": {"app": name, "tessera.dev/pool": "p"},
                        "finalizers": [KUBELET],
                        "annotations": {"tessera.dev/reservation": reservation, "tessera.dev/capacity-pod": CAPACITY}},
           "status": {"phase": "Running", "podIP": "127.0.0.1",
                      "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}});
    if asleep {
        p["metadata"]["annotations"]["tessera.dev/rest"] = json!("sleep level=1 since=1000");
    }
    p
}

fn ids(api: &ApiServer) -> Vec<(String, bool, bool)> {
    let cap = api.get(PODS, POOL_NS, CAPACITY).expect("the capacity pod");
    let doc: Value = serde_json::from_str(
        cap["metadata"]["annotations"]["tessera.dev/reservations"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    doc["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["id"].as_str().unwrap().to_owned(),
                !r["asleepSince"].is_null(),
                !r["evictedAt"].is_null(),
            )
        })
        .collect()
}

async fn until(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn startup(c: &reqwest::Client, sidecar: &Tessera) -> (u16, Value) {
    let r = c.get(sidecar.url("/startup")).send().await.unwrap();
    let code = r.status().as_u16();
    (code, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_replica_takes_a_sleepers_room_and_starts_once_the_sleeper_is_gone() {
    let api = ApiServer::start().await;
    put_one_gpu(&api, &[("w", "models/w", 300), ("s", "models/s", 600)]);
    api.put(PODS, "models", model_pod("w-0", "w", true, false));
    // Told to sleep and not Ready: asleep.
    api.put(PODS, "models", model_pod("s-0", "s", false, true));

    let dir = tempfile::tempdir().unwrap();
    let pools = dir.path().join("pools.yaml");
    let pools_yaml = "namespace: tessera-system\nimage: tessera:test\nlendSleepers: true\npools:\n- name: p\n  \
                      gpuMemoryMiB: 81920\n  sharing: time-slicing\n  maxGpus: 1\n  emptyGpuGracePeriod: 10m\n";
    std::fs::write(&pools, pools_yaml).unwrap();
    let kubeconfig = api.kubeconfig(dir.path());
    let metrics_port = free_port();
    let _autoscaler = support::start_autoscaler(
        "test-0",
        &kubeconfig,
        metrics_port,
        &[
            "--pools-config",
            pools.to_str().unwrap(),
            "--pool-interval",
            "500ms",
        ],
    );

    // 1. The leader marks the sleeper's reservation (the webhook reads capacity pods only).
    until(
        "the sleeper's reservation marked asleep",
        Duration::from_secs(30),
        || ids(&api) == [("w".into(), false, false), ("s".into(), true, false)],
    )
    .await;

    // 2. The webhook's code admits a replica of 500 milli: no GPU may open, so it takes the sleeper's room.
    let cfg = Arc::new(tessera_pool::PoolsConfig::from_yaml(pools_yaml).unwrap());
    let kc = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .unwrap();
    let webhook = tessera_pool::PoolManager::new(kube::Client::try_from(config).unwrap(), cfg, "p").unwrap();
    webhook.rebuild().await.unwrap();
    let placed = webhook
        .reserve(
            tessera_pool::ReserveRequest {
                id: "n".into(),
                model: "models/n".into(),
                compute_milli: 500,
                memory_mib: 20000,
                priority: 0,
                pod: Some("models/n-0".into()),
            },
            now_s(),
        )
        .await
        .unwrap();
    assert_eq!(
        (placed.capacity_pod.as_str(), placed.reason.as_str()),
        (CAPACITY, "LentBySleepers")
    );
    api.put(PODS, "models", model_pod("n-0", "n", false, false));

    // 3. The leader holds the GPU's start-up Lease and deletes the sleeper, which terminates (the kubelet's part).
    until(
        "the leader to hold the Lease and delete the sleeper",
        Duration::from_secs(30),
        || {
            let holder = api
                .get(LEASES, POOL_NS, LEASE)
                .map(|l| l["spec"]["holderIdentity"].clone());
            let terminating = api
                .get(PODS, "models", "s-0")
                .is_some_and(|p| !p["metadata"]["deletionTimestamp"].is_null());
            holder == Some(json!("tessera-pool/evicting/models/s-0")) && terminating
        },
    )
    .await;
    assert!(
        api.get(PODS, "models", "w-0").unwrap()["metadata"]["deletionTimestamp"].is_null(),
        "the awake replica is never touched"
    );

    // 4. The new replica's sidecar waits on the Lease while the sleeper still holds its memory.
    let vllm_port = free_port();
    let sidecar =
        support::pool::gate_sidecar(&kubeconfig, POOL_NS, "models", "n-0", Some("GPU-0"), vllm_port);
    let c = reqwest::Client::new();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(2) {
        let (code, body) = startup(&c, &sidecar).await;
        assert_eq!(
            code, 503,
            "the gate opened while the sleeper was still there: {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (_, body) = startup(&c, &sidecar).await;
    assert_eq!(body["holder"], "tessera-pool/evicting/models/s-0", "{body}");

    // 5. The sleeper is gone: its reservation goes, the Lease is released, and the new replica's gate opens.
    let mut gone = api.get(PODS, "models", "s-0").unwrap();
    gone["metadata"]["finalizers"] = json!([]);
    api.put(PODS, "models", gone);
    api.delete_object(PODS, "models", "s-0");
    let released = Instant::now();
    let deadline = released + Duration::from_secs(30);
    loop {
        if startup(&c, &sidecar).await.0 == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the new replica's gate never opened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "the new replica's start-up gate opened {:.0} ms after the sleeper was gone",
        released.elapsed().as_secs_f64() * 1e3
    );
    assert_eq!(
        ids(&api),
        [("w".into(), false, false), ("n".into(), false, false)]
    );
    let holder = api.get(LEASES, POOL_NS, LEASE).unwrap()["spec"]["holderIdentity"].clone();
    assert_eq!(
        holder,
        json!("models/n-0"),
        "the new replica holds the GPU's start-up Lease"
    );
    let metrics = support::get_text(&c, &format!("http://127.0.0.1:{metrics_port}/metrics")).await;
    assert!(
        metrics.contains("tessera_pool_reservations_total{pool=\"p\",result=\"sleeper_evicted\"} 1"),
        "{metrics}"
    );
}
