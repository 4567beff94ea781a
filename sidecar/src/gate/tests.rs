//! The gate against kube's mock service, backed by a small Lease store that behaves like the API server where
//! the gate depends on it: `resourceVersion` bumped on every write, 409 on a stale one, 409 on creating an
//! existing object, 404 on a missing one. Two gates share one store, as two pods share one GPU's lease.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use http::{Method, Request, Response};
use http_body_util::BodyExt;
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};

use super::*;

#[derive(Debug, Default)]
struct Store {
    rv: u64,
    leases: BTreeMap<String, Value>,
    /// Every (holder) written, in order, to check that two pods never held at once.
    holders: Vec<Option<String>>,
}

type SharedStore = Arc<Mutex<Store>>;

fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code, "message": reason})
}

async fn answer(store: &SharedStore, req: Request<Body>) -> (u16, Value) {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let prefix = "/apis/coordination.k8s.io/v1/namespaces/pool/leases";
    let rest = path
        .strip_prefix(prefix)
        .unwrap_or_else(|| panic!("unexpected path {path}"));
    let mut s = store.lock().unwrap();
    match (method, rest.trim_start_matches('/')) {
        (Method::GET, name) => match s.leases.get(name) {
            Some(l) => (200, l.clone()),
            None => (404, status(404, "NotFound")),
        },
        (Method::POST, "") => {
            let mut l: Value = serde_json::from_slice(&body).unwrap();
            let name = l["metadata"]["name"].as_str().unwrap().to_owned();
            if s.leases.contains_key(&name) {
                return (409, status(409, "AlreadyExists"));
            }
            s.rv += 1;
            l["metadata"]["resourceVersion"] = json!(s.rv.to_string());
            let holder = l["spec"]["holderIdentity"].as_str().map(str::to_owned);
            s.holders.push(holder);
            s.leases.insert(name, l.clone());
            (201, l)
        }
        (Method::PUT, name) => {
            let mut l: Value = serde_json::from_slice(&body).unwrap();
            let Some(current) = s.leases.get(name) else {
                return (404, status(404, "NotFound"));
            };
            if current["metadata"]["resourceVersion"] != l["metadata"]["resourceVersion"] {
                return (409, status(409, "Conflict"));
            }
            s.rv += 1;
            l["metadata"]["resourceVersion"] = json!(s.rv.to_string());
            let holder = l["spec"]["holderIdentity"].as_str().map(str::to_owned);
            s.holders.push(holder);
            s.leases.insert(name.to_owned(), l.clone());
            (200, l)
        }
        (m, _) => panic!("unexpected {m} {path}"),
    }
}

fn api(store: SharedStore) -> Api<Lease> {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let (code, body) = answer(&store, req).await;
            send.send_response(
                Response::builder()
                    .status(code)
                    .body(Body::from(serde_json::to_vec(&body).unwrap()))
                    .unwrap(),
            );
        }
    });
    Api::namespaced(Client::new(svc, "pool"), "pool")
}

/// A stand-in for vLLM's `/health`: 503 until `ready` is set.
async fn fake_vllm(ready: Arc<AtomicBool>) -> String {
    let app = axum::Router::new().route(
        "/health",
        axum::routing::get(move || {
            let ready = ready.clone();
            async move {
                if ready.load(Ordering::SeqCst) {
                    axum::http::StatusCode::OK
                } else {
                    axum::http::StatusCode::SERVICE_UNAVAILABLE
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/health")
}

fn args(pod: &str) -> GateArgs {
    GateArgs {
        gpu_uuid: Some("GPU-1234abcd".into()),
        gate_namespace: "pool".into(),
        pod_name: pod.into(),
        pod_namespace: "team-a".into(),
        startup_timeout: Duration::from_secs(60),
        gate_max_wait: Duration::from_secs(120),
        gate_state_dir: None,
        gate_lease_duration: Duration::from_secs(1),
        gate_retry_period: Duration::from_millis(50),
        gate_api_timeout: Duration::from_secs(60),
    }
}

struct Pod {
    status: SharedGate,
    ready: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
    stop: CancellationToken,
}

async fn start(store: &SharedStore, pod: &str) -> Pod {
    start_with(store, args(pod)).await
}

async fn start_with(store: &SharedStore, args: GateArgs) -> Pod {
    let ready = Arc::new(AtomicBool::new(false));
    let url = fake_vllm(ready.clone()).await;
    let status = Arc::new(Mutex::new(GateStatus::of(
        &Phase::Waiting { since_ms: 0 },
        None,
        None,
    )));
    let stop = CancellationToken::new();
    let task = tokio::spawn(run(api(store.clone()), args, url, status.clone(), stop.clone()));
    Pod {
        status,
        ready,
        task,
        stop,
    }
}

fn state(p: &Pod) -> &'static str {
    p.status.lock().unwrap().state
}

async fn until(what: &str, f: impl Fn() -> bool) {
    for _ in 0..200 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

#[test]
fn startup_gate_lease_name_is_a_valid_object_name() {
    assert_eq!(lease_name("GPU-8f3a_B1"), "tessera-startup-gpu-8f3a-b1");
}

#[tokio::test]
async fn startup_gate_two_pods_on_one_gpu_never_hold_the_lease_at_once() {
    let store = SharedStore::default();
    let a = start(&store, "a").await;
    until("a to hold", || state(&a) == "holding").await;
    let b = start(&store, "b").await;
    // b waits while a loads, and says who holds the GPU.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(state(&b), "waiting");
    assert!(!b.status.lock().unwrap().passes());
    assert_eq!(b.status.lock().unwrap().holder.as_deref(), Some("team-a/a"));
    let waiting = store.lock().unwrap().leases["tessera-startup-gpu-1234abcd"]["metadata"]["annotations"]
        [WAITING_ANNOTATION]
        .clone();
    assert!(waiting.as_str().unwrap().contains("team-a/b"), "{waiting}");
    // a's vLLM becomes ready: a releases, b takes the lease.
    a.ready.store(true, Ordering::SeqCst);
    until("b to hold", || state(&b) == "holding").await;
    assert_eq!(state(&a), "open");
    assert_eq!(a.status.lock().unwrap().reason, Some("vllm_ready"));
    b.ready.store(true, Ordering::SeqCst);
    until("b to open", || state(&b) == "open").await;
    // Every write left at most one holder, and the holders came in order a, (release), b, (release).
    let holders = store.lock().unwrap().holders.clone();
    let handovers: Vec<Option<String>> = holders.iter().fold(Vec::new(), |mut v, h| {
        if v.last() != Some(h) {
            v.push(h.clone());
        }
        v
    });
    assert_eq!(
        handovers,
        vec![Some("team-a/a".into()), None, Some("team-a/b".into()), None],
        "{holders:?}"
    );
    println!(
        "startup_gate: 2 pods, handovers {handovers:?}, {} lease writes",
        holders.len()
    );
}

#[tokio::test]
async fn startup_gate_a_killed_holder_loses_the_lease_after_its_duration() {
    let store = SharedStore::default();
    let a = start(&store, "a").await;
    until("a to hold", || state(&a) == "holding").await;
    // SIGKILL: the task vanishes without releasing.
    a.task.abort();
    let killed_at = std::time::Instant::now();
    let b = start(&store, "b").await;
    until("b to take over", || state(&b) == "holding").await;
    let waited = killed_at.elapsed();
    assert!(
        waited >= Duration::from_millis(900),
        "took over after {waited:?}, before the 1 s lease expired"
    );
    b.stop.cancel();
    b.task.await.unwrap();
    // Stopped while holding (pod deleted): it released the lease for the next pod.
    let lease = store.lock().unwrap().leases["tessera-startup-gpu-1234abcd"].clone();
    assert!(lease["spec"]["holderIdentity"].is_null(), "{lease}");
}

#[tokio::test]
async fn startup_gate_opens_at_once_for_a_whole_gpu_pod() {
    let store = SharedStore::default();
    let status = Arc::new(Mutex::new(GateStatus::of(
        &Phase::Waiting { since_ms: 0 },
        None,
        None,
    )));
    let mut whole = args("w");
    whole.gpu_uuid = None;
    run(
        api(store.clone()),
        whole,
        "http://127.0.0.1:9/health".into(),
        status.clone(),
        CancellationToken::new(),
    )
    .await;
    let s = status.lock().unwrap().clone();
    assert!(s.passes());
    assert_eq!(s.reason, Some("not_shared"));
    assert!(
        store.lock().unwrap().leases.is_empty(),
        "a whole-GPU pod never touches a lease"
    );
}

#[tokio::test]
async fn startup_gate_fails_open_when_the_api_is_unreachable() {
    // Every request answers 503: the API is down.
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(async move {
        while let Some((_, send)) = handle.next_request().await {
            send.send_response(
                Response::builder()
                    .status(503)
                    .body(Body::from(
                        serde_json::to_vec(&status(503, "ServiceUnavailable")).unwrap(),
                    ))
                    .unwrap(),
            );
        }
    });
    let mut a = args("a");
    a.gate_api_timeout = Duration::from_millis(300);
    let status = Arc::new(Mutex::new(GateStatus::of(
        &Phase::Waiting { since_ms: 0 },
        None,
        None,
    )));
    let api = Api::namespaced(Client::new(svc, "pool"), "pool");
    tokio::time::timeout(
        Duration::from_secs(5),
        run(
            api,
            a,
            "http://127.0.0.1:9/health".into(),
            status.clone(),
            CancellationToken::new(),
        ),
    )
    .await
    .unwrap();
    let s = status.lock().unwrap().clone();
    assert_eq!((s.state, s.reason), ("open", Some("api_unavailable")));
}

/// A co-tenant (another team's pod) holds the GPU's lease and renews it for ever (the lease name is derived from the
/// GPU UUID every tenant sees): the waiter opens its gate after --gate-max-wait instead of waiting for good.
#[tokio::test]
async fn startup_gate_a_squatting_co_tenant_cannot_block_a_start_for_longer_than_the_max_wait() {
    let store = SharedStore::default();
    let mut squatter_args = args("squatter");
    squatter_args.pod_namespace = "other-team".into();
    // Its vLLM never becomes ready and its start-up never times out within the test: it renews throughout.
    let squatter = start_with(&store, squatter_args).await;
    until("the squatter to hold", || state(&squatter) == "holding").await;
    let mut waiter_args = args("a");
    waiter_args.gate_max_wait = Duration::from_millis(1_500);
    let started = std::time::Instant::now();
    let a = start_with(&store, waiter_args).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(state(&a), "waiting");
    until("a to give up waiting", || state(&a) == "open").await;
    assert!(
        started.elapsed() >= Duration::from_millis(1_500),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(a.status.lock().unwrap().reason, Some("wait_timeout"));
    assert_eq!(
        a.status.lock().unwrap().holder.as_deref(),
        Some("other-team/squatter"),
        "who held it too long stays named (the sidecar's /v1/status, the controller's Event)"
    );
    assert_eq!(
        state(&squatter),
        "holding",
        "the waiter wrote nothing over the holder"
    );
}

/// Issue 53, M8: the bound holds across restarts of the sidecar. The startup probe restarts a sidecar that
/// waits too long; the restarted one resumes the wait kept in its pod's emptyDir instead of waiting from zero,
/// so a squatter cannot hold this pod off for ever by outlasting each try.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wait_bound_holds_across_a_restart_of_the_sidecar() {
    let store = SharedStore::default();
    let mut squatter_args = args("squatter");
    squatter_args.pod_namespace = "other-team".into();
    let squatter = start_with(&store, squatter_args).await;
    until("the squatter to hold", || state(&squatter) == "holding").await;
    let dir = tempfile::tempdir().unwrap();
    let mut waiter_args = args("a");
    waiter_args.gate_max_wait = Duration::from_millis(2_000);
    waiter_args.gate_state_dir = Some(dir.path().to_path_buf());
    let started = std::time::Instant::now();
    let first = start_with(&store, waiter_args.clone()).await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert_eq!(state(&first), "waiting");
    // The kubelet kills the container; its emptyDir stays.
    first.task.abort();
    let restarted_at = std::time::Instant::now();
    let again = start_with(&store, waiter_args).await;
    until("the restarted sidecar to give up waiting", || {
        state(&again) == "open"
    })
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(2_000),
        "{:?}",
        started.elapsed()
    );
    assert!(
        restarted_at.elapsed() < Duration::from_millis(1_600),
        "resumed, not from zero: {:?} after the restart",
        restarted_at.elapsed()
    );
    assert_eq!(again.status.lock().unwrap().reason, Some("wait_timeout"));
    assert!(
        !dir.path().join(WAIT_FILE).exists(),
        "forgotten once the gate is open"
    );
}

#[test]
fn a_kept_wait_start_is_read_back_and_a_future_one_ignored() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(wait_started(Some(dir.path()), 1_000), 1_000);
    assert_eq!(
        wait_started(Some(dir.path()), 5_000),
        1_000,
        "the first start is kept"
    );
    std::fs::write(dir.path().join(WAIT_FILE), "9000").unwrap();
    assert_eq!(
        wait_started(Some(dir.path()), 6_000),
        6_000,
        "a start in the future is no start"
    );
    forget_wait(Some(dir.path()));
    assert_eq!(wait_started(Some(dir.path()), 7_000), 7_000);
    assert_eq!(wait_started(None, 8_000), 8_000);
}
