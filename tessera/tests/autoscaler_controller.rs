//! `tessera autoscaler` as a process, against a small in-memory Kubernetes API served over loopback.
//!
//! No kube-apiserver can run here, so the controller talks to the in-memory API server of `support/apiserver.rs`
//! (watch streams, label selectors, resourceVersion on every object, 409 on a stale one), seeded with a Deployment
//! and an InferenceAutoscaler; the test plays the Deployment controller (one ready pod per replica) and serves a
//! fake sidecar `/v1/status` and a fake activator stats document (schema 2) it can change mid-test. It then
//! drives the whole loop through the real binary: scale up on KV pressure, scale to zero once idle, and back from
//! zero when a request is held at the activator. Everything is bounded by timeouts and the child is killed on drop.

use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use serde_json::{Value, json};

mod support;
use support::apiserver::{ApiServer, DEPLOYMENTS, EVENTS, IAS, LEASES, PODS};
use support::{Killed, Tessera, free_port, serve};

#[derive(Default)]
struct Cluster {
    /// The one InferenceAutoscaler the API serves.
    ias: Value,
    replicas: i64,
    lease: Option<Value>,
    scale_patches: Vec<i64>,
    status_patches: Vec<Value>,
    events: Vec<Value>,
    /// What the fake sidecar reports: KV usage and running requests.
    kv: f64,
    running: f64,
    /// What the fake activator reports for the model.
    queued: u64,
    last_request_ms: u64,
    requests_total: u64,
    /// Requests the fake activator counted in the flex lane and in the default one.
    flex: u64,
    default_lane: u64,
}

type Shared = Arc<Mutex<Cluster>>;

fn now_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970")
            .as_millis(),
    )
    .expect("millis fit u64")
}

fn ias(spec: Value) -> Value {
    json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "InferenceAutoscaler",
        "metadata": {"name": "llama", "namespace": "models", "uid": "u-1", "resourceVersion": "1", "generation": 1},
        "spec": spec
    })
}

/// The in-memory API server (`support/apiserver.rs`: watch streams, selectors, resourceVersion, 409s) seeded with
/// `state`'s InferenceAutoscaler and a Deployment at `state.replicas`, plus the part of a cluster the test plays:
/// a Deployment controller that keeps one ready pod per replica (pointing at the fake sidecar on `sidecar_port`),
/// and a mirror of what the controller wrote (replica changes, status writes, events, the Lease) into `state`.
async fn honest_api(state: Shared, sidecar_port: u16) -> ApiServer {
    let api = ApiServer::start().await;
    let (ias, replicas) = {
        let c = state.lock().expect("lock");
        (c.ias.clone(), c.replicas)
    };
    api.put(IAS, "models", ias);
    api.put(
        DEPLOYMENTS,
        "models",
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "llama"},
               "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "llama"}}}}),
    );
    let server = api.clone();
    tokio::spawn(async move {
        let mut pods = 0i64;
        let mut replicas = replicas;
        let mut status_rv = String::new();
        loop {
            let want = api.wanted_replicas("models", "llama");
            while pods < want {
                api.put(
                    PODS,
                    "models",
                    // Each pod took 28 s from creation to Ready: the cold start the controller measures.
                    json!({"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": format!("llama-{pods}"), "labels": {"app": "llama"},
                                        "creationTimestamp": "2026-01-01T00:00:00Z",
                                        "annotations": {"tessera.dev/sidecar-port": sidecar_port.to_string()}},
                           "status": {"podIP": "127.0.0.1", "phase": "Running",
                                      "conditions": [{"type": "Ready", "status": "True",
                                                      "lastTransitionTime": "2026-01-01T00:00:28Z"}]}}),
                );
                pods += 1;
            }
            while pods > want {
                pods -= 1;
                api.delete_object(PODS, "models", &format!("llama-{pods}"));
            }
            let obj = api.get(IAS, "models", "llama").unwrap_or_default();
            {
                let mut c = state.lock().expect("lock");
                if want != replicas {
                    replicas = want;
                    c.scale_patches.push(want);
                }
                c.replicas = want;
                let rv = obj["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                if rv != status_rv && !obj["status"].is_null() {
                    let changed = c
                        .status_patches
                        .last()
                        .is_none_or(|p| p["status"] != obj["status"]);
                    if changed {
                        c.status_patches.push(json!({"status": obj["status"]}));
                    }
                    status_rv = rv;
                }
                c.events = api.list(EVENTS);
                c.lease = api.get(LEASES, "default", "tessera-autoscaler");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    server
}

fn sidecar_app(state: Shared) -> Router {
    Router::new()
        .route(
            "/v1/status",
            get(|State(s): State<Shared>| async move {
                let c = s.lock().expect("lock");
                let now = now_ms() as f64 / 1000.0;
                axum::Json(json!({
                    "schema_version": 1, "generated_at": now, "vllm_url": "http://127.0.0.1:8000", "vllm_up": true,
                    "ready": true, "stale": false, "scrape": {"interval_secs": 1.0, "successes_total": 5},
                    "latest": {"at": now, "kv_cache_usage_ratio": c.kv, "requests_running": c.running,
                               "requests_waiting": 0.0},
                    "recommendation": {"outcome": {"state": "not_yet", "code": "too_few_samples", "reason": "test"}}
                }))
            }),
        )
        .route(
            "/tessera/v1/stats",
            get(|State(s): State<Shared>| async move {
                let c = s.lock().expect("lock");
                axum::Json(json!({
                    "schemaVersion": 2, "instance": "activator-0", "startedAtUnixMs": 1_000,
                    "observedAtUnixMs": now_ms(),
                    "models": {"models/llama": {"requestsTotal": c.requests_total, "rejectedTotal": 0, "inFlight": 0,
                                         "queued": c.queued, "readyBackends": c.replicas,
                                         "lastRequestAtUnixMs": c.last_request_ms,
                                         "mix": {"tiers": {"priority": 0, "default": c.default_lane,
                                                           "flex": c.flex}}}}
                }))
            }),
        )
        .with_state(state)
}

/// The EndpointSlice of the chart's admin Service `tessera/tessera-activator-admin`, one ready activator pod on
/// loopback whose admin listener (the slice's port `admin`) is at `port`: how the controller finds activators in a
/// cluster (contract 2).
fn activator_slice(api: &ApiServer, port: u16) {
    api.put(
        "discovery.k8s.io/v1/endpointslices",
        "tessera",
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"name": "tessera-activator-admin-x1",
                            "labels": {"kubernetes.io/service-name": "tessera-activator-admin"}},
               "addressType": "IPv4", "ports": [{"name": "admin", "port": port}],
               "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true},
                              "targetRef": {"kind": "Pod", "name": "tessera-activator-0"}}]}),
    );
}

/// Starts `tessera autoscaler` against the fake API at `api` (a kubeconfig in `dir`), deciding every second.
fn start_autoscaler(dir: &tempfile::TempDir, api: SocketAddr, metrics_port: u16, extra: &[&str]) -> Killed {
    start_autoscaler_as("test-0", dir, api, metrics_port, extra)
}

fn start_autoscaler_as(
    identity: &str,
    dir: &tempfile::TempDir,
    api: SocketAddr,
    metrics_port: u16,
    extra: &[&str],
) -> Killed {
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster: {{server: \"http://{api}\"}}\n\
             users:\n- name: u\n  user: {{}}\ncontexts:\n- name: c\n  context: {{cluster: fake, user: u, namespace: default}}\n\
             current-context: c\n"
        ),
    )
    .expect("write kubeconfig");
    support::start_autoscaler(identity, &kubeconfig, metrics_port, extra)
}

/// Waits until `ready_url` answers 200 (at most 20 s).
async fn wait_ready(ready_url: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(r) = reqwest::get(ready_url).await
            && r.status().is_success()
        {
            return;
        }
        assert!(Instant::now() < deadline, "not ready at {ready_url}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_for(state: &Shared, what: &str, timeout: Duration, f: impl Fn(&Cluster) -> bool) {
    let deadline = Instant::now() + timeout;
    loop {
        if f(&state.lock().expect("lock")) {
            return;
        }
        if Instant::now() > deadline {
            let c = state.lock().expect("lock");
            panic!(
                "timed out waiting for {what}: scale patches {:?}, {} status patches, last status {}",
                c.scale_patches,
                c.status_patches.len(),
                c.status_patches
                    .last()
                    .map(|p| p["status"].to_string())
                    .unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_scales_up_to_zero_and_back_through_scale() {
    let state: Shared = Arc::new(Mutex::new(Cluster {
        ias: ias(json!({
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"},
            "minReplicas": 0, "maxReplicas": 6,
            "targets": {"kvCacheUtilization": 0.5},
            "scaleToZero": {"idleAfter": "2s"},
            "behavior": {"panic": {"enabled": false}},
            "modelNames": ["llama"]
        })),
        replicas: 2,
        kv: 0.9,
        running: 3.0,
        last_request_ms: now_ms(),
        requests_total: 10,
        ..Cluster::default()
    }));
    let sidecar = serve(sidecar_app(state.clone())).await;
    let api_server = honest_api(state.clone(), sidecar.port()).await;
    let api = api_server.addr;
    let dir = tempfile::tempdir().expect("tempdir");
    let metrics_port = free_port();
    // Another writer got there first, twice: the controller must re-read the status and write again.
    api_server.conflict_next_status_writes(2);
    // The activator is found the way it is in a cluster: the EndpointSlice of its Service (contract 2).
    activator_slice(&api_server, sidecar.port());
    let mut child = start_autoscaler(
        &dir,
        api,
        metrics_port,
        &["--activator-service", "tessera/tessera-activator-admin"],
    );

    // 1. Two replicas at 90% KV with a 50% target: ceil(2 × 1.8) = 4.
    wait_for(&state, "the scale-up to 4", Duration::from_secs(30), |c| {
        c.scale_patches.first() == Some(&4)
    })
    .await;
    {
        let c = state.lock().expect("lock");
        assert_eq!(
            c.lease.as_ref().expect("lease")["spec"]["holderIdentity"],
            "test-0"
        );
    }
    wait_for(&state, "the rescale event", Duration::from_secs(10), |c| {
        c.events.iter().any(|e| {
            e["reason"] == "SuccessfulRescale"
                && e["note"].as_str().is_some_and(|n| n.starts_with("New size: 4"))
        })
    })
    .await;
    wait_for(&state, "a status with 4 desired", Duration::from_secs(10), |c| {
        c.status_patches
            .iter()
            .any(|p| p["status"]["desiredReplicas"] == 4 && p["status"]["target"] == "Deployment/llama")
    })
    .await;
    let status_path = "/apis/tessera.dev/v1alpha1/namespaces/models/inferenceautoscalers/llama/status";
    assert!(
        api_server
            .requests()
            .iter()
            .any(|r| r.starts_with(&format!("GET {status_path}"))),
        "the 409 was not followed by a re-read: {:?}",
        api_server.requests()
    );
    let metrics = support::get_text(
        &reqwest::Client::new(),
        &format!("http://127.0.0.1:{metrics_port}/metrics"),
    )
    .await;
    assert!(
        metrics.contains("tessera_autoscaler_decisions_total{reason=\"scale_up\"}"),
        "{metrics}"
    );
    assert!(metrics.contains("tessera_autoscaler_leader 1"), "{metrics}");

    // 2. Traffic stops: nothing running, the last request 10 s ago (idleAfter 2s) → straight to zero.
    {
        let mut c = state.lock().expect("lock");
        c.kv = 0.0;
        c.running = 0.0;
        c.last_request_ms = now_ms() - 10_000;
    }
    wait_for(&state, "the scale to zero", Duration::from_secs(30), |c| {
        c.replicas == 0
    })
    .await;

    // 3. A request is held at the activator: from zero to one at once.
    {
        let mut c = state.lock().expect("lock");
        c.queued = 1;
        c.requests_total += 1;
        c.last_request_ms = now_ms();
    }
    wait_for(&state, "the scale from zero", Duration::from_secs(30), |c| {
        c.replicas >= 1
    })
    .await;
    {
        let c = state.lock().expect("lock");
        assert_eq!(c.scale_patches.last(), Some(&1), "{:?}", c.scale_patches);
    }
    wait_for(
        &state,
        "the scale_from_zero status",
        Duration::from_secs(10),
        |c| {
            c.status_patches
                .iter()
                .any(|p| p["status"]["lastDecisionReason"] == "scale_from_zero")
        },
    )
    .await;
    // Every scale has its own event, with its own reason.
    for (size, why) in [(0, "no requests for"), (1, "demand at zero replicas")] {
        let action = format!("ScaleTo{size}");
        wait_for(
            &state,
            &format!("a {action} event saying {why:?}"),
            Duration::from_secs(10),
            |c| {
                c.events.iter().any(|e| {
                    e["action"] == action.as_str() && e["note"].as_str().is_some_and(|n| n.contains(why))
                })
            },
        )
        .await;
    }
    // 4. SIGTERM: the leader releases its lease (so a standby takes over at once) and exits cleanly.
    let status = support::terminate(&mut child.0, Duration::from_secs(10)).await;
    assert!(status.success(), "exit status {status}");
    let c = state.lock().expect("lock");
    let holder = &c.lease.as_ref().expect("lease")["spec"]["holderIdentity"];
    assert!(
        holder.is_null() || holder == "",
        "lease still held by {holder} after shutdown"
    );
}

/// The real sidecar in front of the real emulator: the controller reads its `/v1/status` (an idle server: KV 0,
/// nothing running) and scales 3 → 1 replica, reporting the signal's current value in status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_a_real_sidecar_and_scales_down_an_idle_model() {
    let vllm = Tessera::vllm_sim(&["--model-preset", "opt-125m", "--gpu", "l4"]);
    let sidecar = Tessera::sidecar(&vllm.base(), &["--scrape-interval", "200ms"]);
    wait_ready(&sidecar.url("/ready")).await;
    let sidecar_port = sidecar.addr.port();
    let state: Shared = Arc::new(Mutex::new(Cluster {
        ias: ias(json!({
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"},
            "minReplicas": 1, "maxReplicas": 6,
            "targets": {"kvCacheUtilization": 0.5, "waitingRequestsPerReplica": 2},
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}}
        })),
        replicas: 3,
        ..Cluster::default()
    }));
    let api_server = honest_api(state.clone(), sidecar_port).await;
    let api = api_server.addr;
    let dir = tempfile::tempdir().expect("tempdir");
    let metrics_port = free_port();
    let _autoscaler = start_autoscaler(&dir, api, metrics_port, &[]);
    wait_for(&state, "the scale-down to 1", Duration::from_secs(30), |c| {
        c.scale_patches.first() == Some(&1)
    })
    .await;
    // The decision that scaled: 3 replicas reported KV 0, so HPA's rule asks for 0, held at minReplicas 1.
    wait_for(
        &state,
        "a status with the sidecar's values",
        Duration::from_secs(10),
        |c| {
            c.status_patches.first().is_some_and(|p| {
                let st = &p["status"];
                st["desiredReplicas"] == 1
                    && st["lastDecisionReason"] == "too_few_replicas"
                    && st["currentMetrics"][0]["name"] == "kvCacheUtilization"
                    && st["currentMetrics"][0]["current"] == 0.0
                    && st["currentMetrics"][0]["reportingReplicas"] == 3
            })
        },
    )
    .await;
    wait_for(
        &state,
        "a ScaleTo1 event saying why",
        Duration::from_secs(10),
        |c| {
            c.events.iter().any(|e| {
                e["action"] == "ScaleTo1"
                    && e["note"]
                        .as_str()
                        .is_some_and(|n| n.contains("held at the minimum 1"))
            })
        },
    )
    .await;
    // The reconcile published what it saw and decided to the /ui page on the metrics listener.
    let page = support::get_text(
        &reqwest::Client::new(),
        &format!("http://127.0.0.1:{metrics_port}/ui"),
    )
    .await;
    assert!(page.contains(r#"data-model="models/llama""#), "{page}");
    assert!(
        page.contains("too_few_replicas") && page.contains("cluster · read-only"),
        "{page}"
    );
}

/// Two replicas, one lease: only the leader acts (its identity is on every Event it writes); when it is stopped, it
/// releases the lease and the standby takes over and acts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_acts_and_a_standby_takes_over() {
    let state: Shared = Arc::new(Mutex::new(Cluster {
        ias: ias(json!({
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"},
            "minReplicas": 1, "maxReplicas": 6,
            "targets": {"kvCacheUtilization": 0.5},
            "behavior": {"panic": {"enabled": false}, "scaleDown": {"stabilizationWindowSeconds": 0}}
        })),
        replicas: 2,
        kv: 0.9,
        running: 3.0,
        ..Cluster::default()
    }));
    let sidecar = serve(sidecar_app(state.clone())).await;
    let api_server = honest_api(state.clone(), sidecar.port()).await;
    let api = api_server.addr;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut a = start_autoscaler_as("replica-a", &dir, api, free_port(), &[]);
    wait_for(&state, "replica-a to lead", Duration::from_secs(20), |c| {
        c.lease
            .as_ref()
            .is_some_and(|l| l["spec"]["holderIdentity"] == "replica-a")
    })
    .await;
    let _b = start_autoscaler_as("replica-b", &dir, api, free_port(), &[]);
    wait_for(
        &state,
        "a scale event from replica-a",
        Duration::from_secs(20),
        |c| c.events.iter().any(|e| e["reportingInstance"] == "replica-a"),
    )
    .await;
    // Give the standby a few election rounds: it must not act while replica-a renews.
    tokio::time::sleep(Duration::from_secs(3)).await;
    {
        let c = state.lock().expect("lock");
        assert!(
            !c.events.iter().any(|e| e["reportingInstance"] == "replica-b"),
            "the standby acted"
        );
        assert_eq!(
            c.lease.as_ref().expect("lease")["spec"]["holderIdentity"],
            "replica-a"
        );
    }
    support::sigterm(&a.0);
    let _ = a.0.wait();
    wait_for(&state, "replica-b to take over", Duration::from_secs(20), |c| {
        c.lease
            .as_ref()
            .is_some_and(|l| l["spec"]["holderIdentity"] == "replica-b")
    })
    .await;
    // Load drops: the new leader scales down, and says so under its own name.
    {
        let mut c = state.lock().expect("lock");
        c.kv = 0.1;
    }
    wait_for(
        &state,
        "a scale event from replica-b",
        Duration::from_secs(20),
        |c| c.events.iter().any(|e| e["reportingInstance"] == "replica-b"),
    )
    .await;
    let c = state.lock().expect("lock");
    assert_eq!(
        c.lease.as_ref().expect("lease")["spec"]["leaseTransitions"],
        1,
        "one handover"
    );
}

/// llama (`ias`) on one replica, its activator's last request three minutes before `now` (ms) and 204 counted:
/// the cluster, its sidecar's address and the API server.
async fn idle_for_three_minutes(ias: Value, now: u64) -> (Shared, std::net::SocketAddr, ApiServer) {
    let state: Shared = Arc::new(Mutex::new(Cluster {
        ias,
        replicas: 1,
        last_request_ms: now - 180_000,
        requests_total: 204,
        ..Cluster::default()
    }));
    let sidecar = serve(sidecar_app(state.clone())).await;
    let api_server = honest_api(state.clone(), sidecar.port()).await;
    activator_slice(&api_server, sidecar.port());
    (state, sidecar, api_server)
}

/// A model whose 28 s cold start is over its 2 s objective goes to zero only on a day of evidence that its cold
/// starts fit its `coldStartMissBudget`, a day the leader counts in memory and copies into
/// `status.coldStartLedger`. Through the real binary and the in-memory API server:
/// 1. a controller with no copy to read keeps the warm replica;
/// 2. a new one finds a copy in the status (two hours, one would-be cold start missing 4 of 204 requests, within
///    the 5% budget) and goes to zero at once;
/// 3. a request wakes the model; the leader counts it and writes a fresh copy;
/// 4. it stops, and the next leader resumes from that copy and takes the model back to zero, where without it
///    the warm floor would hold for an hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_resumes_the_cold_start_ledger_from_status() {
    let now = now_ms();
    let mut object = ias(json!({
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"},
        "minReplicas": 0, "maxReplicas": 2, "ttftSlo": "2s",
        "scaleToZero": {"idleAfter": "2s", "coldStartMissBudget": 0.05},
        "modelNames": ["llama"]
    }));
    let (state, _sidecar, api_server) = idle_for_three_minutes(object.clone(), now).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let start = |identity: &str| {
        start_autoscaler_as(
            identity,
            &dir,
            api_server.addr,
            free_port(),
            &["--activator-service", "tessera/tessera-activator-admin"],
        )
    };
    let message = |c: &Cluster| {
        c.status_patches.last().map_or(String::new(), |p| {
            p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "ScalingActive")
                .map_or(String::new(), |c| c["message"].to_string())
        })
    };

    // 1. Nothing to resume: the warm floor holds.
    let mut x = start("replica-x");
    wait_for(&state, "the warm floor", Duration::from_secs(30), |c| {
        message(c).contains("keeps one warm replica: a cold start takes 28 s, over the 2 s TTFT objective")
    })
    .await;
    support::terminate(&mut x.0, Duration::from_secs(10)).await;
    assert!(state.lock().expect("lock").scale_patches.is_empty());

    // 2. A copy from a previous leader, taken two minutes ago.
    object["status"] = json!({"coldStartLedger": {
        "takenAtUnixMs": now - 120_000, "lastRequestAtUnixMs": now - 180_000, "requestsTotal": 204,
        "coldStartMs": 28_000,
        "samples": [[7_080_000, 100], [3_480_000, 2, 600_000], [3_465_000, 2], [1_680_000, 100]]}});
    api_server.put(IAS, "models", object);
    let mut a = start("replica-a");
    wait_for(
        &state,
        "the scale to zero on the copy",
        Duration::from_secs(30),
        |c| c.replicas == 0,
    )
    .await;
    assert!(
        state.lock().expect("lock").status_patches.iter().any(|p| p.to_string().contains(
            "may go to zero though a cold start is over the TTFT objective: over the last 2.0 h, 1 cold start(s) \
             would have missed 4 of 204 requests"
        )),
        "no status said why"
    );

    // 3. A request wakes it: the leader counts it, and its copy says so.
    {
        let mut c = state.lock().expect("lock");
        c.queued = 1;
        c.requests_total += 1;
        c.last_request_ms = now_ms();
    }
    wait_for(
        &state,
        "a copy counting the request",
        Duration::from_secs(30),
        |c| {
            c.replicas == 1
                && c.status_patches
                    .last()
                    .is_some_and(|p| p["status"]["coldStartLedger"]["requestsTotal"] == 205)
        },
    )
    .await;
    state.lock().expect("lock").queued = 0;
    support::terminate(&mut a.0, Duration::from_secs(10)).await;

    // 4. The next leader resumes from that copy: back to zero once idle for 2 s.
    let patches = state.lock().expect("lock").scale_patches.clone();
    assert_eq!(patches, vec![0, 1]);
    let _b = start("replica-b");
    wait_for(
        &state,
        "the new leader's scale to zero",
        Duration::from_secs(30),
        |c| c.scale_patches.len() == 3 && c.replicas == 0,
    )
    .await;
    let c = state.lock().expect("lock");
    assert!(
        message(&c).contains("2 cold start(s) would have missed 5 of 205 requests"),
        "{}",
        message(&c)
    );
}

/// A budget group's member that this process has not decided for (here: its target does not exist yet, so its
/// rounds never run) still counts in its group, read from the ledger copy in its status. llama alone would go to
/// zero on its copy (4 misses of 204, within its 5%); its group also holds digest, whose copy shows the same two
/// hours and whose 0.1% budget is the group's: the group may miss none of their 408 requests, so llama keeps its
/// warm replica, and its status says the group has two members.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_member_not_decided_for_yet_counts_from_its_status() {
    let now = now_ms();
    let copy = json!({
        "takenAtUnixMs": now - 120_000, "lastRequestAtUnixMs": now - 180_000, "requestsTotal": 204,
        "coldStartMs": 28_000,
        "samples": [[7_080_000, 100], [3_480_000, 2, 600_000], [3_465_000, 2], [1_680_000, 100]]});
    let member = |name: &str, budget: f64| {
        let mut o = ias(json!({
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": 0, "maxReplicas": 2, "ttftSlo": "2s",
            "scaleToZero": {"idleAfter": "2s", "coldStartMissBudget": budget, "coldStartBudgetGroup": "tools"},
            "modelNames": [name]
        }));
        o["metadata"]["name"] = json!(name);
        o["metadata"]["uid"] = json!(format!("u-{name}"));
        o["status"] = json!({"coldStartLedger": copy.clone()});
        o
    };
    let (state, _sidecar, api_server) = idle_for_three_minutes(member("llama", 0.05), now).await;
    api_server.put(IAS, "models", member("digest", 0.001));
    let dir = tempfile::tempdir().expect("tempdir");
    let _x = start_autoscaler_as(
        "replica-x",
        &dir,
        api_server.addr,
        free_port(),
        &["--activator-service", "tessera/tessera-activator-admin"],
    );
    let group = "budget group 'tools' (2 model(s), 408 requests over their last day) may miss 0 (0.10%), 0 of them \
                 spent on the floors idle longest per miss; this model's 4 do not fit what is left";
    wait_for(&state, "the group's floor", Duration::from_secs(30), |c| {
        c.status_patches.iter().any(|p| p.to_string().contains(group))
    })
    .await;
    let c = state.lock().expect("lock");
    assert!(c.scale_patches.is_empty(), "{:?}", c.scale_patches);
    assert_eq!(c.replicas, 1);
}

/// A broken pools file stops the process at start with a message naming the flag, before any API call.
#[test]
fn a_bad_pools_config_fails_fast_and_says_where() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("pools.yaml");
    std::fs::write(&path, "pools: [").expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["autoscaler", "--pools-config"])
        .arg(&path)
        .env("KUBECONFIG", dir.path().join("no-such-kubeconfig"))
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run tessera autoscaler");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("reading --pools-config") && stderr.contains("pools.yaml"),
        "{stderr}"
    );
}

/// `spec.scaledBy: KEDA`: the controller decides and reports but never writes `/scale`, and every autoscaler
/// replica's KEDA scaler answers that decision from the status it watches. A second owner on the same workload (an
/// HPA next to a Tessera-scaled model) is a `ScaleOwnerConflict`, with a Warning Event and nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::too_many_lines,
    reason = "one story against real processes, told in order: each step starts from the state the last one left"
)]
async fn scaled_by_keda_is_decided_and_served_but_never_written() {
    use tessera_keda::pb;
    let state: Shared = Arc::new(Mutex::new(Cluster {
        ias: ias(json!({
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"},
            "minReplicas": 1, "maxReplicas": 6,
            "targets": {"kvCacheUtilization": 0.5},
            "behavior": {"panic": {"enabled": false}},
            "scaledBy": "KEDA",
            "modelNames": ["llama"]
        })),
        replicas: 2,
        kv: 0.9,
        running: 3.0,
        last_request_ms: now_ms(),
        ..Cluster::default()
    }));
    let sidecar = serve(sidecar_app(state.clone())).await;
    let api_server = honest_api(state.clone(), sidecar.port()).await;
    // KEDA's HPA for ScaledObject `llama`.
    let hpas = "autoscaling/v2/horizontalpodautoscalers";
    api_server.put(
        hpas,
        "models",
        json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
               "metadata": {"name": "keda-hpa-llama", "labels": {"scaledobject.keda.sh/name": "llama"}},
               "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"},
                        "maxReplicas": 6}}),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let keda_port = free_port();
    let _child = start_autoscaler(
        &dir,
        api_server.addr,
        free_port(),
        &["--keda-scaler-listen", &format!("127.0.0.1:{keda_port}")],
    );
    // Two replicas at 90% KV against 50%: 4, decided and reported, not written.
    wait_for(
        &state,
        "a status handing 4 to KEDA",
        Duration::from_secs(30),
        |c| {
            c.status_patches.iter().any(|p| {
                let st = &p["status"];
                st["desiredReplicas"] == 4
                    && st["conditions"].as_array().is_some_and(|cs| {
                        cs.iter().any(|c| {
                            c["type"] == "AbleToScale"
                                && c["reason"] == "ScaledByKEDA"
                                && c["message"]
                                    .as_str()
                                    .is_some_and(|m| m.contains("ScaledObject llama"))
                        })
                    })
            })
        },
    )
    .await;
    // The scaler answers the leader's decision from the status it watches.
    let mut client = loop {
        if let Ok(c) =
            pb::external_scaler_client::ExternalScalerClient::connect(format!("http://127.0.0.1:{keda_port}"))
                .await
        {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let so = pb::ScaledObjectRef {
        name: "llama".into(),
        namespace: "models".into(),
        scaler_metadata: [("model".to_owned(), "llama".to_owned())].into(),
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let value = loop {
        if let Ok(r) = client
            .get_metrics(pb::GetMetricsRequest {
                scaled_object_ref: Some(so.clone()),
                metric_name: "s0-tessera-desired-replicas".into(),
            })
            .await
        {
            break r.into_inner().metric_values[0].metric_value;
        }
        assert!(
            Instant::now() < deadline,
            "the scaler never answered from the status"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(value, 4);
    assert!(
        client
            .is_active(so.clone())
            .await
            .expect("IsActive")
            .into_inner()
            .result
    );
    wait_for(
        &state,
        "a DecidedForKEDA event saying why",
        Duration::from_secs(10),
        |c| {
            c.events.iter().any(|e| {
                e["reason"] == "DecidedForKEDA"
                    && e["note"]
                        .as_str()
                        .is_some_and(|n| n.starts_with("Desired: 4 (KEDA scales)"))
            })
        },
    )
    .await;
    assert!(
        state.lock().expect("lock").scale_patches.is_empty(),
        "KEDA owns /scale: nothing written"
    );

    // The team switches the model back to Tessera but leaves the ScaledObject: two owners, nobody writes.
    let mut obj = api_server.get(IAS, "models", "llama").expect("the object");
    obj["spec"]["scaledBy"] = json!("Tessera");
    api_server.put(IAS, "models", obj);
    wait_for(
        &state,
        "a ScaleOwnerConflict and its Event",
        Duration::from_secs(30),
        |c| {
            let conflict = c.status_patches.last().is_some_and(|p| {
                p["status"]["conditions"].as_array().is_some_and(|cs| {
                    cs.iter().any(|c| {
                        c["type"] == "AbleToScale"
                            && c["status"] == "False"
                            && c["reason"] == "ScaleOwnerConflict"
                            && c["message"]
                                .as_str()
                                .is_some_and(|m| m.contains("ScaledObject llama (HPA keda-hpa-llama)"))
                    })
                })
            });
            conflict
                && c.events
                    .iter()
                    .any(|e| e["reason"] == "ScaleOwnerConflict" && e["type"] == "Warning")
        },
    )
    .await;
    assert!(
        state.lock().expect("lock").scale_patches.is_empty(),
        "a conflict writes nothing"
    );
    let refused = client
        .get_metrics(pb::GetMetricsRequest {
            scaled_object_ref: Some(so),
            metric_name: String::new(),
        })
        .await
        .expect_err("a Tessera-scaled model is not handed to KEDA");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused}");
}

/// The workload class sets the policy, and a change of class — from the traffic's declared tier, then from a pin
/// in the spec — changes it within one sync, with an Event saying from what to what and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_class_change_changes_the_policy_within_one_sync_with_an_event() {
    let state: Shared = Arc::new(Mutex::new(Cluster {
        ias: ias(json!({
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"},
            "minReplicas": 1, "maxReplicas": 4,
            "targets": {"kvCacheUtilization": 0.7},
            "scaleToZero": {"idleAfter": "10m"},
            "behavior": {"panic": {"enabled": false}},
            "modelNames": ["llama"]
        })),
        replicas: 1,
        kv: 0.5,
        running: 1.0,
        last_request_ms: now_ms(),
        requests_total: 10,
        default_lane: 10,
        ..Cluster::default()
    }));
    let sidecar = serve(sidecar_app(state.clone())).await;
    let api_server = honest_api(state.clone(), sidecar.port()).await;
    activator_slice(&api_server, sidecar.port());
    let dir = tempfile::tempdir().expect("tempdir");
    let _child = start_autoscaler(
        &dir,
        api_server.addr,
        free_port(),
        &["--activator-service", "tessera/tessera-activator-admin"],
    );
    let class_of = |c: &Cluster| {
        c.status_patches
            .last()
            .map(|p| p["status"].clone())
            .unwrap_or_default()
    };
    // 1. Nothing declared, too little traffic: real-time, whose defaults are Tessera's own.
    wait_for(
        &state,
        "a real-time class in status",
        Duration::from_secs(30),
        |c| {
            let st = class_of(c);
            st["workloadClass"] == "realtime"
                && st["workloadClassSource"] == "default"
                && st["classPolicy"]
                    .as_str()
                    .is_some_and(|p| p.contains("warm replica kept"))
                && st["policyFromClass"]
                    .as_array()
                    .is_some_and(|f| f.iter().any(|f| f == "scaleToZero.coldStartMissBudget"))
        },
    )
    .await;
    // 2. The traffic changes: 98% of its requests now ask for the flex tier. One sync later (1 s here) the class
    // is batch, its policy spends cold starts, and an Event says from what to what and why.
    let changed_at = Instant::now();
    {
        let mut c = state.lock().expect("lock");
        c.flex = 196;
        c.requests_total = 200;
    }
    wait_for(&state, "the change to batch", Duration::from_secs(10), |c| {
        let st = class_of(c);
        st["workloadClass"] == "batch"
            && st["workloadClassSource"] == "declared"
            && st["classPolicy"]
                .as_str()
                .is_some_and(|p| p.contains("cold-start budget 50.0%"))
            && c.events.iter().any(|e| {
                e["reason"] == "WorkloadClassChanged"
                    && e["note"].as_str().is_some_and(|n| {
                        n.contains("from realtime to batch") && n.contains("service_tier flex")
                    })
            })
    })
    .await;
    // Within one sync period (1 s) and the activator poll (300 ms), with room for a loaded machine.
    assert!(
        changed_at.elapsed() < Duration::from_secs(5),
        "{:?}",
        changed_at.elapsed()
    );
    // 3. A pin in the spec wins over the traffic at once.
    let mut obj = api_server.get(IAS, "models", "llama").expect("the object");
    obj["spec"]["workloadClass"] = json!("realtime");
    obj["metadata"]["generation"] = json!(2);
    api_server.put(IAS, "models", obj);
    wait_for(&state, "the pin to real-time", Duration::from_secs(10), |c| {
        let st = class_of(c);
        st["workloadClass"] == "realtime"
            && st["workloadClassSource"] == "pinned"
            && c.events.iter().any(|e| {
                e["reason"] == "WorkloadClassChanged"
                    && e["note"].as_str().is_some_and(|n| {
                        n.contains("from batch to realtime") && n.contains("pinned by spec.workloadClass")
                    })
            })
    })
    .await;
}
