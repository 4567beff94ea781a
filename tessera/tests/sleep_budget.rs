//! The GPU's sleeper budget through the real processes: `tessera autoscaler` (its controller and its leader's pool
//! manager) against the in-memory API server, two models each with a real `tessera sidecar` in front of the
//! emulator in sleep mode, and one real activator for both. The test plays the kubelet (annotations into each
//! sidecar's downward-API file, Ready from each sidecar's `/ready`) and the ReplicaSets (a pod deleted at zero).
//!
//! One GPU of pool `p` (`maxSleepersPerGpu: 1`) holds an awake tenant and two models' replicas: `daily` (a
//! 28 s cold start) and `often` (90 s). `daily` goes idle first and sleeps. Then `often` goes idle: the budget
//! holds one sleeper, and `often` asleep saves more waiting (89.5 s per wake against 27.5 s), so `often` sleeps
//! and `daily`'s sleeper is let go — by worth, not by age (`tessera_core::pack::sleeping::admit`): its pod is
//! marked `tessera.dev/evicted` and its own round drops it from `/scale`.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod support;
use support::apiserver::{ApiServer, DEPLOYMENTS, IAS, PODS};
use support::pool::{POOL_NS, put_one_gpu};
use support::sleep::{Replica, kubelet};
use support::{Tessera, free_port, http_client};

/// A pod of the pool on `tessera-gpu-p-0`, Ready, created at midnight and Ready `cold_s` later (its measured cold
/// start); `sidecar_port` where its sidecar listens (none for the plain tenant).
fn pod(name: &str, reservation: &str, cold_s: u32, sidecar_port: Option<u16>) -> Value {
    let mut annotations = json!({"tessera.dev/reservation": reservation,
                                 "tessera.dev/capacity-pod": "tessera-gpu-p-0"});
    if let Some(port) = sidecar_port {
        annotations["tessera.dev/sidecar-port"] = json!(port.to_string());
    }
    let app = name.trim_end_matches("-0");
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "labels": {"app": app, "tessera.dev/pool": "p"},
                        "creationTimestamp": "2026-01-01T00:00:00Z", "annotations": annotations},
           "status": {"podIP": "127.0.0.1", "phase": "Running",
                      "conditions": [{"type": "Ready", "status": "True",
                                      "lastTransitionTime": format!("2026-01-01T00:{:02}:{:02}Z", cold_s / 60, cold_s % 60)}]}})
}

fn autoscaler(name: &str) -> Value {
    json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "InferenceAutoscaler",
           "metadata": {"name": name, "uid": format!("u-{name}"), "generation": 1},
           "spec": {"scaleTargetRef": {"kind": "Deployment", "name": name}, "minReplicas": 0,
                    "maxReplicas": 1, "scaleToZero": {"idleAfter": "2s"}, "modelNames": [name],
                    "ttftSlo": "2s", "sleep": {"enabled": true, "level": 1, "expectedWake": "500ms"}}})
}

fn deployment(name: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
           "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}}})
}

/// One real activator for `replicas`: each model's emulator as its backend, woken through its sidecar.
fn activator(replicas: &[&Replica]) -> Tessera {
    let mut flags: Vec<String> = Vec::new();
    for r in replicas {
        flags.extend(["--backend".into(), format!("{}={}", r.name, r.emu.base())]);
        flags.extend(["--sidecar".into(), format!("{}={}", r.name, r.sidecar.base())]);
    }
    flags.extend(["--probe-interval".into(), "50ms".into()]);
    Tessera::activator(&flags.iter().map(String::as_str).collect::<Vec<_>>())
}

/// `tessera autoscaler` on `api` with pool `p` (one GPU, no spares; `pool_extra`: more of the pool's fields) and
/// the activator `act`, its metrics on `metrics_port`.
fn start(api: &ApiServer, dir: &Path, act: &Tessera, pool_extra: &str, metrics_port: u16) -> support::Killed {
    let pools = dir.join("pools.yaml");
    std::fs::write(
        &pools,
        format!(
            "namespace: tessera-system\nimage: tessera:test\npools:\n- name: p\n  gpuMemoryMiB: 81920\n  \
             sharing: time-slicing\n  maxGpus: 1\n  spareCapacityPods: 0\n  {pool_extra}"
        ),
    )
    .unwrap();
    let kubeconfig = api.kubeconfig(dir);
    support::start_autoscaler(
        "test-0",
        &kubeconfig,
        metrics_port,
        &[
            "--activator-url",
            &act.admin_base(),
            "--pools-config",
            pools.to_str().unwrap(),
            "--pool-interval",
            "500ms",
        ],
    )
}

async fn until(what: &str, within: Duration, mut f: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_sleeper_budget_lets_the_sleeper_worth_least_go() {
    let c = http_client(Duration::from_secs(30));
    let dir = tempfile::tempdir().unwrap();
    let daily = Replica::start(dir.path(), "daily");
    let often = Replica::start(dir.path(), "often");
    let act = activator(&[&daily, &often]);

    let api = ApiServer::start().await;
    put_one_gpu(
        &api,
        &[
            ("w", "default/w", 300),
            ("d", "default/daily", 300),
            ("o", "default/often", 300),
        ],
    );
    // An awake tenant: neither model's replica is alone on the GPU.
    api.put(PODS, "default", pod("w-0", "w", 30, None));
    api.put(PODS, "default", pod("daily-0", "d", 28, Some(daily.port())));
    api.put(PODS, "default", pod("often-0", "o", 90, Some(often.port())));
    for name in ["daily", "often"] {
        api.put(DEPLOYMENTS, "default", deployment(name));
    }

    let kubelet = kubelet(&api, &c, &[&daily, &often]);
    let metrics_port = free_port();
    let _autoscaler = start(
        &api,
        dir.path(),
        &act,
        "emptyGpuGracePeriod: 10m\n  maxSleepersPerGpu: 1\n",
        metrics_port,
    );

    // 1. Only `daily` is autoscaled yet: idle, it sleeps (the budget has room for one).
    api.put(IAS, "default", autoscaler("daily"));
    until("daily asleep", Duration::from_secs(40), async || {
        daily.rest(&c).await["state"] == "sleeping"
    })
    .await;

    // The pool publishes what it sees every pass (500 ms here), from the tenant watch: let it see `daily` asleep.
    // (Without this wait both fall asleep before it does; then the cheaper one lets itself go,
    // `core::pack::sleeping::over_budget`, with the same outcome and the Event on `daily`.)
    tokio::time::sleep(Duration::from_secs(2)).await;

    // 2. `often` goes idle on the same GPU: worth more asleep, it sleeps and `daily`'s sleeper is let go.
    let t0 = Instant::now();
    api.put(IAS, "default", autoscaler("often"));
    until("often asleep", Duration::from_secs(40), async || {
        often.rest(&c).await["state"] == "sleeping"
    })
    .await;
    until(
        "daily's pod marked and dropped from /scale",
        Duration::from_secs(30),
        async || api.wanted_replicas("default", "daily") == 0,
    )
    .await;
    println!(
        "often asleep and daily's sleeper let go {:.1} s after often's InferenceAutoscaler appeared",
        t0.elapsed().as_secs_f64()
    );
    let events = api.list("events.k8s.io/v1/events");
    for e in &events {
        println!("event {} {}: {}", e["regarding"]["name"], e["reason"], e["note"]);
    }
    let let_go = events
        .iter()
        .find(|e| e["reason"] == "SleeperLetGo")
        .unwrap_or_else(|| panic!("a SleeperLetGo event: {events:?}"));
    let note = let_go["note"].as_str().unwrap_or_default();
    assert!(
        note.starts_with("default/daily-0: let go (at=")
            && note.contains("reason=budget")
            && note.ends_with(
                "(default/often-0 asleep saves 89.5 s of waiting per hour against default/daily-0's 27.5)"
            ),
        "{note}"
    );
    assert_eq!(let_go["regarding"]["name"], "often", "{let_go}");
    assert_eq!(
        api.wanted_replicas("default", "often"),
        1,
        "often's sleeper is kept"
    );
    let metrics = support::get_text(&c, &format!("http://127.0.0.1:{metrics_port}/metrics")).await;
    assert!(
        metrics.contains("tessera_autoscaler_sleepers_let_go_total{reason=\"budget\"} 1"),
        "{metrics}"
    );
    assert!(api.get(PODS, "default", "often-0").is_some());
    assert!(
        api.get(PODS, "default", "w-0").unwrap()["metadata"]["deletionTimestamp"].is_null(),
        "the awake tenant is never touched"
    );
    kubelet.abort();
}

/// A GPU that holds only a sleeping pod is given back after the pool's grace, as the simulator gives it back: the
/// awake tenant beside `daily`'s sleeper leaves, and once the GPU has held only the sleeper for
/// `emptyGpuGracePeriod` (3 s here) the sleeper is let go (`reason=gpu-given-back`), `/scale` drops it, and the
/// capacity pod, empty as of the moment it held only the sleeper, is released at the next pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_held_only_by_a_sleeper_is_given_back_after_the_grace() {
    let c = http_client(Duration::from_secs(30));
    let dir = tempfile::tempdir().unwrap();
    let daily = Replica::start(dir.path(), "daily");
    let act = activator(&[&daily]);
    let api = ApiServer::start().await;
    put_one_gpu(&api, &[("w", "default/w", 300), ("d", "default/daily", 300)]);
    api.put(PODS, "default", pod("w-0", "w", 30, None));
    api.put(PODS, "default", pod("daily-0", "d", 28, Some(daily.port())));
    api.put(DEPLOYMENTS, "default", deployment("daily"));
    let kubelet = kubelet(&api, &c, &[&daily]);
    let _autoscaler = start(
        &api,
        dir.path(),
        &act,
        "emptyGpuGracePeriod: 3s\n  maxSleepersPerGpu: 4\n",
        free_port(),
    );

    // Beside an awake tenant, `daily` sleeps.
    api.put(IAS, "default", autoscaler("daily"));
    until("daily asleep", Duration::from_secs(40), async || {
        daily.rest(&c).await["state"] == "sleeping"
    })
    .await;
    // The awake tenant leaves: the GPU holds only the sleeper.
    api.delete_object(PODS, "default", "w-0");
    let t0 = Instant::now();
    until(
        "the sleeper let go and the GPU given back",
        Duration::from_secs(30),
        async || {
            api.wanted_replicas("default", "daily") == 0
                && api.get(PODS, POOL_NS, "tessera-gpu-p-0").is_none()
        },
    )
    .await;
    let took = t0.elapsed();
    println!(
        "the GPU held only by a sleeper was given back {:.1} s after its last awake tenant left (grace 3 s)",
        took.as_secs_f64()
    );
    assert!(took >= Duration::from_secs(3), "not before the grace: {took:?}");
    let events = api.list("events.k8s.io/v1/events");
    assert!(
        events.iter().any(|e| e["reason"] == "SleeperLetGo"
            && e["note"]
                .as_str()
                .is_some_and(|n| n.contains("reason=gpu-given-back"))),
        "{events:?}"
    );
    kubelet.abort();
}
