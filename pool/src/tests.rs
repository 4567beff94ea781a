//! The pool manager against kube's mock service: a small in-memory API server for pods that enforces
//! `resourceVersion` on merge patches and delete preconditions the way the real one does (409 Conflict), and
//! logs every request so the tests can assert what was sent.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use http::{Request, Response, StatusCode};
use k8s_openapi::api::core::v1::Pod;
use kube::client::Body;
use serde_json::{Value, json};

use super::state::Reservation;
use super::*;

#[derive(Debug, Clone)]
pub(super) struct Logged {
    pub(super) method: String,
    pub(super) path: String,
    pub(super) query: String,
    pub(super) body: Value,
    pub(super) status: u16,
}

#[derive(Debug, Default)]
pub(super) struct FakeApi {
    /// (namespace, name) → pod JSON.
    pub(super) pods: BTreeMap<(String, String), Value>,
    /// (namespace, name) → Lease JSON (the GPUs' start-up Leases).
    pub(super) leases: BTreeMap<(String, String), Value>,
    pub(super) rv: u64,
    pub(super) log: Vec<Logged>,
}

pub(super) fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

pub(super) fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8(out).unwrap()
}

pub(super) fn matches_selector(pod: &Value, selector: &str) -> bool {
    let labels = &pod["metadata"]["labels"];
    selector.split(',').filter(|t| !t.is_empty()).all(|term| {
        if let Some(k) = term.strip_prefix('!') {
            labels.get(k).is_none()
        } else if let Some((k, v)) = term.split_once('=') {
            labels.get(k).and_then(Value::as_str) == Some(v)
        } else {
            labels.get(term).is_some()
        }
    })
}

/// One object of `map`, or 404.
fn get_one(map: &BTreeMap<(String, String), Value>, ns: &str, name: &str) -> (u16, Value) {
    match map.get(&(ns.to_string(), name.to_string())) {
        Some(o) => (200, o.clone()),
        None => (404, status(404, "NotFound", &format!("{name} not found"))),
    }
}

/// Stores `body` in `map` under a new resourceVersion: a create (409 if the name is taken) or, with `replace`, a
/// replace (404 if absent, 409 on a stale resourceVersion).
fn write_one(
    map: &mut BTreeMap<(String, String), Value>,
    rv: &mut u64,
    ns: &str,
    mut body: Value,
    replace: bool,
) -> (u16, Value) {
    let key = (
        ns.to_string(),
        body["metadata"]["name"].as_str().unwrap().to_string(),
    );
    match (map.get(&key), replace) {
        (Some(_), false) => return (409, status(409, "AlreadyExists", "already exists")),
        (None, true) => return (404, status(404, "NotFound", "not found")),
        (Some(cur), true) if body["metadata"]["resourceVersion"] != cur["metadata"]["resourceVersion"] => {
            return (409, status(409, "Conflict", "the object has been modified"));
        }
        _ => {}
    }
    *rv += 1;
    body["metadata"]["resourceVersion"] = json!(rv.to_string());
    body["metadata"]["namespace"] = json!(ns);
    map.insert(key, body.clone());
    (if replace { 200 } else { 201 }, body)
}

impl FakeApi {
    pub(super) fn insert(&mut self, pod: &Pod) {
        let mut v = serde_json::to_value(pod).unwrap();
        self.rv += 1;
        v["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let ns = v["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string();
        let name = v["metadata"]["name"].as_str().unwrap().to_string();
        self.pods.insert((ns, name), v);
    }

    pub(super) fn pod(&self, ns: &str, name: &str) -> Option<Pod> {
        self.pods
            .get(&(ns.into(), name.into()))
            .map(|v| serde_json::from_value(v.clone()).unwrap())
    }

    pub(super) fn handle(&mut self, method: &str, path: &str, query: &str, body: Value) -> (u16, Value) {
        let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let selector = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("labelSelector="))
            .map(percent_decode)
            .unwrap_or_default();
        match (method, segs.as_slice()) {
            ("GET", ["api", "v1", "pods"]) => (200, self.list(None, &selector)),
            ("GET", ["api", "v1", "namespaces", ns, "pods"]) => (200, self.list(Some(ns), &selector)),
            ("GET", ["api", "v1", "namespaces", ns, "pods", name]) => get_one(&self.pods, ns, name),
            ("PATCH", ["api", "v1", "namespaces", ns, "pods", name]) => {
                let key = (ns.to_string(), name.to_string());
                let Some(cur) = self.pods.get(&key) else {
                    return (404, status(404, "NotFound", "not found"));
                };
                if let Some(want) = body["metadata"]["resourceVersion"].as_str()
                    && cur["metadata"]["resourceVersion"].as_str() != Some(want)
                {
                    return (409, status(409, "Conflict", "the object has been modified"));
                }
                let mut next = cur.clone();
                json_patch::merge(&mut next, &body);
                self.rv += 1;
                next["metadata"]["resourceVersion"] = json!(self.rv.to_string());
                self.pods.insert(key, next.clone());
                (200, next)
            }
            ("POST", ["api", "v1", "namespaces", ns, "pods"]) => {
                write_one(&mut self.pods, &mut self.rv, ns, body, false)
            }
            ("DELETE", ["api", "v1", "namespaces", ns, "pods", name]) => {
                let key = (ns.to_string(), name.to_string());
                let Some(cur) = self.pods.get(&key) else {
                    return (404, status(404, "NotFound", "not found"));
                };
                if let Some(want) = body["preconditions"]["resourceVersion"].as_str()
                    && cur["metadata"]["resourceVersion"].as_str() != Some(want)
                {
                    return (409, status(409, "Conflict", "precondition failed"));
                }
                if let Some(want) = body["preconditions"]["uid"].as_str()
                    && cur["metadata"]["uid"].as_str() != Some(want)
                {
                    return (409, status(409, "Conflict", "precondition failed: uid"));
                }
                let gone = self.pods.remove(&key).unwrap();
                (200, gone)
            }
            (
                "GET",
                [
                    "apis",
                    "coordination.k8s.io",
                    "v1",
                    "namespaces",
                    ns,
                    "leases",
                    name,
                ],
            ) => get_one(&self.leases, ns, name),
            ("POST", ["apis", "coordination.k8s.io", "v1", "namespaces", ns, "leases"]) => {
                write_one(&mut self.leases, &mut self.rv, ns, body, false)
            }
            ("PUT", ["apis", "coordination.k8s.io", "v1", "namespaces", ns, "leases", _]) => {
                write_one(&mut self.leases, &mut self.rv, ns, body, true)
            }
            _ => (
                400,
                status(
                    400,
                    "BadRequest",
                    &format!("fake API: unsupported {method} {path}"),
                ),
            ),
        }
    }

    fn list(&self, ns: Option<&str>, selector: &str) -> Value {
        let items: Vec<Value> = self
            .pods
            .iter()
            .filter(|((pns, _), p)| ns.is_none_or(|n| n == pns) && matches_selector(p, selector))
            .map(|(_, p)| p.clone())
            .collect();
        json!({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": self.rv.to_string()}, "items": items})
    }
}

/// A request as the fakes read it: method, path, query and JSON body (`null` when empty).
pub(super) async fn read_request(req: Request<Body>) -> (String, String, String, Value) {
    let (parts, body) = req.into_parts();
    let bytes = body.collect_bytes().await.unwrap();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap()
    };
    let query = parts.uri.query().unwrap_or("").to_string();
    (
        parts.method.to_string(),
        parts.uri.path().to_string(),
        query,
        body,
    )
}

/// A client whose requests are answered by `api`, one at a time, like an API server with one writer.
pub(super) fn client(api: Arc<Mutex<FakeApi>>) -> kube::Client {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let (method, path, query, body) = read_request(req).await;
            let (code, resp) = {
                let mut a = api.lock().unwrap();
                let (code, resp) = a.handle(&method, &path, &query, body.clone());
                a.log.push(Logged {
                    method,
                    path,
                    query,
                    body,
                    status: code,
                });
                (code, resp)
            };
            let response = Response::builder()
                .status(StatusCode::from_u16(code).unwrap())
                .header("content-type", "application/json")
                .body(Body::from(serde_json::to_vec(&resp).unwrap()))
                .unwrap();
            send.send_response(response);
        }
    });
    kube::Client::new(svc, "default")
}

const CONFIG: &str = "namespace: tessera-system\nimage: tessera:test\nreservationTtl: 2m\npools:\n\
- name: p\n  gpuMemoryMiB: 81920\n  sharing: mps\n  maxGpus: 3\n  emptyGpuGracePeriod: 10m\n  memoryHeadroomMiB: 1024\n  computeOversubscription: 1.0\n  spareCapacityPods: 0\n";

/// Each GPU handed out once, so "the last slot" is the GPU's last milli of compute; `pool::config`'s tests
/// cover the MPS default of handing out twice. No spare capacity pods unless a test asks ([`with_spares`]).
pub(super) fn config(max_gpus: u32) -> Arc<PoolsConfig> {
    Arc::new(PoolsConfig::from_yaml(&CONFIG.replace("maxGpus: 3", &format!("maxGpus: {max_gpus}"))).unwrap())
}

/// [`config`] with `n` spare capacity pods.
pub(super) fn with_spares(max_gpus: u32, n: u32) -> Arc<PoolsConfig> {
    let mut c = (*config(max_gpus)).clone();
    c.pools[0].spare_capacity_pods = n;
    Arc::new(c)
}

pub(super) fn resv(id: &str, c: u32, at: u64) -> Reservation {
    Reservation {
        id: id.into(),
        model: format!("model-{id}"),
        compute_milli: c,
        memory_mib: 4096,
        priority: 0,
        created_at: at,
        pod: None,
        evicted_at: None,
        asleep_since: None,
    }
}

pub(super) fn capacity(cfg: &PoolsConfig, name: &str, rs: &[Reservation], node: &str, uuid: &str) -> Pod {
    let mut pod = capacity::capacity_pod(cfg, &cfg.pools[0], name, rs);
    pod.spec.as_mut().unwrap().node_name = Some(node.into());
    pod.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(ANNOTATION_GPU_UUID.into(), uuid.into());
    pod
}

pub(super) fn tenant(ns: &str, name: &str, reservation: &str, cap: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "labels": {LABEL_POOL: "p"},
                     "annotations": {ANNOTATION_RESERVATION: reservation, ANNOTATION_CAPACITY_POD: cap}}
    }))
    .unwrap()
}

pub(super) fn request(id: &str, c: u32) -> ReserveRequest {
    ReserveRequest {
        id: id.into(),
        model: format!("model-{id}"),
        compute_milli: c,
        memory_mib: 4096,
        priority: 0,
        pod: None,
    }
}

pub(super) fn reservations_on(api: &Arc<Mutex<FakeApi>>, name: &str) -> Vec<Reservation> {
    let pod = api.lock().unwrap().pod("tessera-system", name).unwrap();
    let ann = pod.metadata.annotations.unwrap();
    state::decode_reservations(ann.get(ANNOTATION_RESERVATIONS).map(String::as_str)).unwrap()
}

pub(super) fn seeded(pods: &[Pod]) -> Arc<Mutex<FakeApi>> {
    let api = Arc::new(Mutex::new(FakeApi::default()));
    for p in pods {
        api.lock().unwrap().insert(p);
    }
    api
}

/// Two webhook replicas over `api`, each with its own view of the cluster, both rebuilt, the log cleared.
async fn two_writers(api: &Arc<Mutex<FakeApi>>, cfg: &Arc<PoolsConfig>) -> (PoolManager, PoolManager) {
    let c = client(api.clone());
    let w1 = PoolManager::new(c.clone(), cfg.clone(), "p").unwrap();
    let w2 = PoolManager::new(c, cfg.clone(), "p").unwrap();
    w1.rebuild().await.unwrap();
    w2.rebuild().await.unwrap();
    api.lock().unwrap().log.clear();
    (w1, w2)
}

#[tokio::test]
async fn two_concurrent_reservations_for_the_last_slot_never_double_book() {
    let cfg = config(3);
    // gpu-a has 300 milli left (the best fit for 300), gpu-b 500.
    let api = seeded(&[
        capacity(&cfg, "gpu-a", &[resv("old-a", 700, 0)], "node-1", "GPU-a"),
        capacity(&cfg, "gpu-b", &[resv("old-b", 500, 0)], "node-2", "GPU-b"),
    ]);
    let (w1, w2) = two_writers(&api, &cfg).await;

    let (p1, p2) = tokio::join!(
        w1.reserve(request("r1", 300), 10),
        w2.reserve(request("r2", 300), 10)
    );
    let (p1, p2) = (p1.unwrap(), p2.unwrap());
    let mut got = [p1.capacity_pod.as_str(), p2.capacity_pod.as_str()];
    got.sort_unstable();
    assert_eq!(
        got,
        ["gpu-a", "gpu-b"],
        "one wins the last slot on gpu-a, the other goes to gpu-b"
    );
    let winner_on_b = if p1.capacity_pod == "gpu-b" { &p1 } else { &p2 };
    assert_eq!(winner_on_b.node.as_deref(), Some("node-2"));
    assert_eq!(winner_on_b.gpu_uuid.as_deref(), Some("GPU-b"));

    // The cluster agrees: gpu-a exactly full, nothing booked twice.
    let a: u32 = reservations_on(&api, "gpu-a")
        .iter()
        .map(|r| r.compute_milli)
        .sum();
    let b: u32 = reservations_on(&api, "gpu-b")
        .iter()
        .map(|r| r.compute_milli)
        .sum();
    assert_eq!((a, b), (1000, 800));

    // The requests: both patched gpu-a with a resourceVersion, one got 409, re-read gpu-a, then patched gpu-b.
    let log = api.lock().unwrap().log.clone();
    let summary: Vec<(String, String, u16)> = log
        .iter()
        .map(|l| {
            (
                l.method.clone(),
                l.path.rsplit('/').next().unwrap().to_string(),
                l.status,
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            ("PATCH".into(), "gpu-a".into(), 200),
            ("PATCH".into(), "gpu-a".into(), 409),
            ("GET".into(), "gpu-a".into(), 200),
            ("PATCH".into(), "gpu-b".into(), 200),
        ]
    );
    for l in log.iter().filter(|l| l.method == "PATCH") {
        assert!(
            l.body["metadata"]["resourceVersion"].is_string(),
            "every write is guarded: {:?}",
            l.body
        );
        assert_eq!(
            l.body["metadata"]["annotations"][KARPENTER_DO_NOT_DISRUPT],
            "true"
        );
    }
}

#[tokio::test]
async fn the_loser_books_a_spare_which_the_leader_opens_and_replaces() {
    let cfg = with_spares(3, 1);
    let api = seeded(&[capacity(&cfg, "gpu-a", &[resv("old", 600, 0)], "node-1", "GPU-a")]);
    // The leader makes the spare: a capacity pod gated so that it holds no GPU yet.
    let leader = PoolManager::new(client(api.clone()), cfg.clone(), "p").unwrap();
    leader.rebuild().await.unwrap();
    leader.reconcile(5).await.unwrap();
    let spare = api
        .lock()
        .unwrap()
        .pod("tessera-system", "tessera-gpu-p-0")
        .unwrap();
    let spec = spare.spec.unwrap();
    assert_eq!(spec.scheduling_gates.unwrap()[0].name, SPARE_GATE);
    assert_eq!(
        spec.containers[0]
            .resources
            .as_ref()
            .unwrap()
            .limits
            .as_ref()
            .unwrap()["nvidia.com/gpu"]
            .0,
        "1"
    );

    // Two webhook replicas race for gpu-a's last 400: one wins it, the other books the spare. Neither creates a pod.
    let (w1, w2) = two_writers(&api, &cfg).await;
    let (p1, p2) = tokio::join!(
        w1.reserve(request("r1", 400), 10),
        w2.reserve(request("r2", 400), 10)
    );
    let (p1, p2) = (p1.unwrap(), p2.unwrap());
    let booked = if p1.capacity_pod == "gpu-a" { p2 } else { p1 };
    assert_eq!(booked.reason, state::BOOKED_SPARE);
    assert_eq!(booked.capacity_pod, "tessera-gpu-p-0");
    assert_eq!(
        booked.node, None,
        "a spare has no node until its gate is lifted and a GPU is free"
    );
    let log = api.lock().unwrap().log.clone();
    assert!(
        log.iter().all(|l| l.method != "POST"),
        "webhook replicas never create pods: {log:?}"
    );
    assert_eq!(log.iter().filter(|l| l.status == 409).count(), 1);
    let on_spare = reservations_on(&api, &booked.capacity_pod);
    assert_eq!(on_spare.len(), 1);
    assert_eq!(on_spare[0].id, booked.reservation_id);

    // The leader lifts the booked spare's gate and makes the next spare.
    leader.rebuild().await.unwrap();
    let report = leader.reconcile(11).await.unwrap();
    assert_eq!(report.spares_opened, 1);
    let opened = api
        .lock()
        .unwrap()
        .pod("tessera-system", "tessera-gpu-p-0")
        .unwrap();
    assert!(opened.spec.unwrap().scheduling_gates.is_none_or(|g| g.is_empty()));
    assert_eq!(
        annotation(&api, "tessera-gpu-p-0", KARPENTER_DO_NOT_DISRUPT).as_deref(),
        Some("true")
    );
    let next = api
        .lock()
        .unwrap()
        .pod("tessera-system", "tessera-gpu-p-1")
        .unwrap();
    assert_eq!(next.spec.unwrap().scheduling_gates.unwrap()[0].name, SPARE_GATE);
    // At maxGpus no spare is made, and a replica with no room fails open with the reason.
    let full = with_spares(2, 1);
    let at_max = PoolManager::new(client(api.clone()), full, "p").unwrap();
    at_max.rebuild().await.unwrap();
    let err = at_max.reserve(request("r3", 900), 12).await.unwrap_err();
    assert!(
        matches!(
            err,
            PoolError::NoRoom {
                gpus: 2,
                max_gpus: 2,
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn a_restarted_manager_rebuilds_from_listed_pods() {
    let cfg = config(1);
    let api = seeded(&[
        capacity(
            &cfg,
            "gpu-a",
            &[resv("r1", 600, 0), resv("r2", 300, 0)],
            "node-1",
            "GPU-a",
        ),
        tenant("team", "llama-0", "r1", "gpu-a"),
        tenant("team", "qwen-0", "r2", "gpu-a"),
    ]);
    let m = PoolManager::new(client(api.clone()), cfg.clone(), "p").unwrap();
    m.rebuild().await.unwrap();
    {
        let log = api.lock().unwrap().log.clone();
        assert_eq!(log.len(), 2);
        assert_eq!(log[0].path, "/api/v1/namespaces/tessera-system/pods");
        assert!(
            percent_decode(&log[0].query)
                .contains("labelSelector=tessera.dev/pool=p,tessera.dev/capacity-pod=true")
        );
        assert_eq!(log[1].path, "/api/v1/pods");
        assert!(
            percent_decode(&log[1].query)
                .contains("labelSelector=tessera.dev/pool=p,!tessera.dev/capacity-pod")
        );
    }
    assert_eq!(m.index().tenants().count(), 2);
    // A retried admission gets its own reservation back, without writing.
    api.lock().unwrap().log.clear();
    let again = m.reserve(request("r1", 600), 50).await.unwrap();
    assert_eq!(
        (again.capacity_pod.as_str(), again.reason.as_str()),
        ("gpu-a", "Existing")
    );
    assert!(api.lock().unwrap().log.is_empty());
    // The rebuilt state is respected: 100 milli left, and the pool is at maxGpus = 1.
    assert!(m.reserve(request("r3", 100), 50).await.is_ok());
    let err = m.reserve(request("r4", 50), 50).await.unwrap_err();
    assert!(
        matches!(
            err,
            PoolError::NoRoom {
                gpus: 1,
                max_gpus: 1,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(err.label(), "no_room");
}

#[tokio::test]
async fn expiry_release_and_deletion_after_grace() {
    let cfg = config(3);
    let api = seeded(&[
        capacity(
            &cfg,
            "gpu-a",
            &[resv("never-came", 200, 0), resv("bound", 300, 0)],
            "node-1",
            "GPU-a",
        ),
        tenant("team", "pod-1", "bound", "gpu-a"),
    ]);
    let m = PoolManager::new(client(api.clone()), cfg.clone(), "p").unwrap();
    m.rebuild().await.unwrap();

    // Before the TTL (120 s) nothing happens.
    api.lock().unwrap().log.clear();
    assert_eq!(m.reconcile(100).await.unwrap(), ReconcileReport::default());
    assert!(api.lock().unwrap().log.is_empty());

    // After it, the reservation without a pod goes; the one with a pod stays.
    let r = m.reconcile(130).await.unwrap();
    assert_eq!(r.expired, 1);
    let left: Vec<String> = reservations_on(&api, "gpu-a").into_iter().map(|r| r.id).collect();
    assert_eq!(left, vec!["bound".to_string()]);

    // The tenant is deleted: its share is freed, the GPU is marked empty and loses do-not-disrupt.
    assert!(m.tenant_deleted("team/pod-1", 200).await.unwrap());
    assert!(reservations_on(&api, "gpu-a").is_empty());
    let pod = api.lock().unwrap().pod("tessera-system", "gpu-a").unwrap();
    let ann = pod.metadata.annotations.unwrap();
    assert_eq!(ann.get(ANNOTATION_EMPTY_SINCE).map(String::as_str), Some("200"));
    assert!(!ann.contains_key(KARPENTER_DO_NOT_DISRUPT));
    assert!(
        !m.release("bound", 201).await.unwrap(),
        "releasing twice is a no-op"
    );

    // Within the grace period (10 min) it stays; after, it is deleted with a resourceVersion precondition.
    api.lock().unwrap().log.clear();
    assert!(m.reconcile(200 + 599).await.unwrap().deleted.is_empty());
    let r = m.reconcile(200 + 600).await.unwrap();
    assert_eq!(r.deleted, vec!["gpu-a".to_string()]);
    let log = api.lock().unwrap().log.clone();
    let del = log.iter().find(|l| l.method == "DELETE").unwrap();
    assert!(
        del.body["preconditions"]["resourceVersion"].is_string(),
        "{:?}",
        del.body
    );
    assert!(api.lock().unwrap().pod("tessera-system", "gpu-a").is_none());
}

#[tokio::test]
async fn a_reservation_racing_the_deletion_keeps_the_gpu() {
    let cfg = config(3);
    let mut empty = capacity(&cfg, "gpu-a", &[], "node-1", "GPU-a");
    empty
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(ANNOTATION_EMPTY_SINCE.into(), "0".into());
    let api = seeded(&[empty]);
    let c = client(api.clone());
    let gc = PoolManager::new(c.clone(), cfg.clone(), "p").unwrap();
    let webhook = PoolManager::new(c, cfg.clone(), "p").unwrap();
    gc.rebuild().await.unwrap();
    webhook.rebuild().await.unwrap();
    // The webhook reserves on the empty GPU after the collector's last look at it.
    webhook.reserve(request("late", 100), 1000).await.unwrap();
    let r = gc.reconcile(1000).await.unwrap();
    assert!(r.deleted.is_empty());
    assert!(api.lock().unwrap().pod("tessera-system", "gpu-a").is_some());
    assert_eq!(reservations_on(&api, "gpu-a").len(), 1);
    let statuses: Vec<u16> = api
        .lock()
        .unwrap()
        .log
        .iter()
        .filter(|l| l.method == "DELETE")
        .map(|l| l.status)
        .collect();
    assert_eq!(statuses, vec![409]);
}

#[tokio::test]
async fn unknown_pools_and_bad_requests_are_clear_errors() {
    let cfg = config(3);
    let api = seeded(&[]);
    let c = client(api.clone());
    let e = PoolManager::new(c.clone(), cfg.clone(), "nope").unwrap_err();
    assert_eq!(e.to_string(), "no pool named \"nope\" in the pool config");
    let m = PoolManager::new(c, cfg, "p").unwrap();
    let e = m.reserve(request("x", 1500), 0).await.unwrap_err();
    assert!(e.to_string().contains("1..=1000"), "{e}");
}

#[tokio::test]
async fn many_webhook_replicas_racing_never_overbook() {
    // Eight replicas, each with its own stale view, reserve 300 milli at once on a pool of at most 3 GPUs:
    // 3 fit per GPU, so at most 9 fit; every write is guarded, so no GPU ever holds more than 1000.
    let cfg = with_spares(3, 2);
    let api = seeded(&[capacity(&cfg, "gpu-a", &[], "node-1", "GPU-a")]);
    let c = client(api.clone());
    // The leader's two spares: the only way the pool grows.
    let leader = PoolManager::new(c.clone(), cfg.clone(), "p").unwrap();
    leader.rebuild().await.unwrap();
    leader.reconcile(1).await.unwrap();
    let mut managers = Vec::new();
    for _ in 0..8 {
        let m = PoolManager::new(c.clone(), cfg.clone(), "p").unwrap();
        m.rebuild().await.unwrap();
        managers.push(m);
    }
    let results = futures::future::join_all(
        managers
            .iter()
            .enumerate()
            .map(|(i, m)| m.reserve(request(&format!("r{i}"), 300), 10)),
    )
    .await;
    let placed: Vec<&Placement> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    for r in &results {
        if let Err(e) = r {
            assert!(
                matches!(e, PoolError::NoRoom { .. } | PoolError::TooManyConflicts { .. }),
                "{e}"
            );
        }
    }
    let pods: Vec<String> = api.lock().unwrap().pods.keys().map(|(_, n)| n.clone()).collect();
    let mut total = 0;
    for name in &pods {
        let rs = reservations_on(&api, name);
        let used: u32 = rs.iter().map(|r| r.compute_milli).sum();
        assert!(used <= 1000, "{name} holds {used} milli: overbooked");
        total += rs.len();
    }
    assert_eq!(total, placed.len(), "every success is recorded exactly once");
    let mut ids: Vec<&str> = placed.iter().map(|p| p.reservation_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), placed.len());
    // gpu-a and the two spares: the pool stays within maxGpus, and no webhook replica created a pod.
    assert_eq!(pods.len(), 3, "{pods:?}");
    assert_eq!(placed.len(), 8, "contention costs retries, not placements");
}

/// A tenant pod consolidation may move: a ReplicaSet's pod, Ready.
fn movable_tenant(ns: &str, name: &str, reservation: &str, cap: &str) -> Pod {
    let mut pod = tenant(ns, name, reservation, cap);
    pod.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            name: format!("{name}-rs"),
            uid: "uid-rs".into(),
            controller: Some(true),
            ..Default::default()
        },
    ]);
    pod.status =
        Some(serde_json::from_value(json!({"conditions": [{"type": "Ready", "status": "True"}]})).unwrap());
    pod
}

fn annotation(api: &Arc<Mutex<FakeApi>>, name: &str, key: &str) -> Option<String> {
    let pod = api.lock().unwrap().pod("tessera-system", name).unwrap();
    pod.metadata.annotations.unwrap().get(key).cloned()
}

/// Consolidation (`core::pack::consolidate`) against the API: two GPUs whose tenants fit on one. Once a controller
/// round claims their pods, the lighter one becomes the candidate, is marked draining only after the settle time (10 min), with a resourceVersion-guarded
/// patch; the controller sees it through `DrainingGpus`; new tenants go elsewhere; one that fits nowhere else is
/// placed on it and that same write ends the drain.
#[tokio::test]
async fn consolidation_drains_after_the_settle_time_and_a_forced_placement_ends_it() {
    let cfg = config(3);
    let api = seeded(&[
        capacity(&cfg, "gpu-a", &[resv("r1", 200, 0)], "node-1", "GPU-a"),
        capacity(&cfg, "gpu-b", &[resv("r2", 300, 0)], "node-2", "GPU-b"),
        movable_tenant("team", "pod-1", "r1", "gpu-a"),
        movable_tenant("team", "pod-2", "r2", "gpu-b"),
    ]);
    let link = ConsolidationLink::default();
    let draining = link.draining.clone();
    let m = PoolManager::new(client(api.clone()), cfg.clone(), "p")
        .unwrap()
        .with_link(link.clone());
    m.rebuild().await.unwrap();

    // No controller round has claimed the pods yet: nobody would move them, so nothing is drained.
    assert_eq!(m.reconcile(0).await.unwrap().drain, None);
    assert_eq!(m.reconcile(900).await.unwrap().drain, None);
    link.managed
        .set("team/ias", vec!["team/pod-1".into(), "team/pod-2".into()]);
    assert_eq!(m.reconcile(1000).await.unwrap().drain, None);
    assert_eq!(m.reconcile(1599).await.unwrap().drain, None);
    api.lock().unwrap().log.clear();
    let r = m.reconcile(1600).await.unwrap();
    assert_eq!(r.drain, Some(("gpu-a".to_string(), "started")));
    assert_eq!(
        annotation(&api, "gpu-a", ANNOTATION_DRAINING_SINCE).as_deref(),
        Some("1600")
    );
    let patch = api
        .lock()
        .unwrap()
        .log
        .iter()
        .find(|l| l.method == "PATCH")
        .cloned()
        .unwrap();
    assert!(
        patch.body["metadata"]["resourceVersion"].is_string(),
        "{:?}",
        patch.body
    );
    assert!(draining.contains("gpu-a") && !draining.contains("gpu-b"));
    // Still draining on the next tick.
    assert_eq!(m.reconcile(1610).await.unwrap().drain, None);

    // A new tenant goes elsewhere even though gpu-a has more room.
    let p = m.reserve(request("r3", 100), 1620).await.unwrap();
    assert_eq!(p.capacity_pod, "gpu-b");
    // One that fits only on gpu-a (gpu-b has 600 left) lands there, and the drain ends with the same write.
    let p = m.reserve(request("r4", 700), 1630).await.unwrap();
    assert_eq!(p.capacity_pod, "gpu-a");
    assert_eq!(annotation(&api, "gpu-a", ANNOTATION_DRAINING_SINCE), None);
    m.reconcile(1640).await.unwrap();
    assert!(!draining.contains("gpu-a"));
}

/// A drained GPU that emptied loses its mark (and is then marked empty, released after the grace); pods that are
/// not a ReplicaSet's (a StatefulSet's, a bare pod) are never moved.
#[tokio::test]
async fn an_emptied_drain_ends_and_immovable_tenants_stay() {
    let cfg = config(3);
    let mut drained = capacity(&cfg, "gpu-a", &[], "node-1", "GPU-a");
    drained
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(ANNOTATION_DRAINING_SINCE.into(), "500".into());
    let api = seeded(&[
        drained,
        capacity(&cfg, "gpu-b", &[resv("r2", 300, 0)], "node-2", "GPU-b"),
        capacity(&cfg, "gpu-c", &[resv("r3", 100, 0)], "node-3", "GPU-c"),
        movable_tenant("team", "pod-2", "r2", "gpu-b"),
        tenant("team", "pod-3", "r3", "gpu-c"),
    ]);
    let link = ConsolidationLink::default();
    let draining = link.draining.clone();
    // pod-3 is claimed too, but as a bare pod (no ReplicaSet) it still cannot be moved.
    link.managed
        .set("team/ias", vec!["team/pod-2".into(), "team/pod-3".into()]);
    let m = PoolManager::new(client(api.clone()), cfg.clone(), "p")
        .unwrap()
        .with_link(link);
    m.rebuild().await.unwrap();
    let r = m.reconcile(600).await.unwrap();
    assert_eq!(r.drain, Some(("gpu-a".to_string(), "drained")));
    assert_eq!(r.marked_empty, 1);
    assert_eq!(annotation(&api, "gpu-a", ANNOTATION_DRAINING_SINCE), None);
    assert!(!draining.contains("gpu-a"));
    // gpu-c (one bare pod) would be the cheapest to empty, but its pod cannot be moved; gpu-b's can, onto gpu-c.
    m.reconcile(700).await.unwrap();
    let r = m.reconcile(1300).await.unwrap();
    assert_eq!(r.drain, Some(("gpu-b".to_string(), "started")));
}

/// With `watchNamespace`, the chart's grants over tenant pods are a Role in that namespace: a cluster-wide list
/// would be refused and the pool manager would never start. The tenant watch follows `tenantNamespace`.
#[tokio::test]
async fn tenants_are_listed_only_in_the_tenant_namespace_when_one_is_set() {
    let mut cfg = (*config(1)).clone();
    cfg.tenant_namespace = Some("models".into());
    let cfg = Arc::new(cfg);
    let api = seeded(&[tenant("models", "llama-0", "r1", "gpu-a")]);
    let m = PoolManager::new(client(api.clone()), cfg, "p").unwrap();
    m.rebuild().await.unwrap();
    let log = api.lock().unwrap().log.clone();
    assert_eq!(log.len(), 2, "{log:?}");
    assert_eq!(log[1].path, "/api/v1/namespaces/models/pods");
    assert_eq!(m.index().tenants().count(), 1);
}
