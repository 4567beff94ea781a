//! Fractional placement end to end inside the webhook, against kube's mock service (`tower_test`) playing a
//! small API server for pods that enforces `resourceVersion` the way the real one does: reserve → patch with
//! node affinity and the GPU's UUID; a 409 is retried; a full pool admits the pod unchanged with the reason; a
//! reservation whose admission then failed is released by the pool's TTL.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use http::{Request, Response, StatusCode};
use k8s_openapi::api::core::v1::Pod;
use kube::client::Body;
use serde_json::{Value, json};
use tessera_pool::capacity::capacity_pod;
use tessera_pool::state::{Reservation, decode_reservations};
use tessera_pool::{ANNOTATION_GPU_UUID, ANNOTATION_RESERVATIONS, PoolManager, PoolsConfig};
use tessera_webhook::admit::Admitter;
use tessera_webhook::mutate::Config;

#[derive(Debug, Default)]
struct FakeApi {
    pods: BTreeMap<String, Value>,
    rv: u64,
    /// Answer the next this-many PATCHes with 409 (another writer won).
    conflicts: u32,
    log: Vec<(String, String, u16)>,
}

fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": reason,
           "reason": reason, "code": code})
}

impl FakeApi {
    fn insert(&mut self, pod: &Pod) {
        let mut v = serde_json::to_value(pod).unwrap();
        self.rv += 1;
        v["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.pods
            .insert(v["metadata"]["name"].as_str().unwrap().to_string(), v);
    }

    fn handle(&mut self, method: &str, path: &str, body: Value) -> (u16, Value) {
        let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        match (method, segs.as_slice()) {
            ("GET", ["api", "v1", "namespaces", _, "pods"] | ["api", "v1", "pods"]) => {
                let items: Vec<Value> = self.pods.values().cloned().collect();
                (
                    200,
                    json!({"kind": "PodList", "apiVersion": "v1",
                             "metadata": {"resourceVersion": self.rv.to_string()}, "items": items}),
                )
            }
            ("GET", ["api", "v1", "namespaces", _, "pods", name]) => match self.pods.get(*name) {
                Some(p) => (200, p.clone()),
                None => (404, status(404, "NotFound")),
            },
            ("PATCH", ["api", "v1", "namespaces", _, "pods", name]) => {
                let Some(cur) = self.pods.get(*name).cloned() else {
                    return (404, status(404, "NotFound"));
                };
                if self.conflicts > 0 {
                    self.conflicts -= 1;
                    return (409, status(409, "Conflict"));
                }
                if let Some(want) = body["metadata"]["resourceVersion"].as_str()
                    && cur["metadata"]["resourceVersion"].as_str() != Some(want)
                {
                    return (409, status(409, "Conflict"));
                }
                let mut next = cur;
                json_patch::merge(&mut next, &body);
                self.rv += 1;
                next["metadata"]["resourceVersion"] = json!(self.rv.to_string());
                self.pods.insert(name.to_string(), next.clone());
                (200, next)
            }
            ("POST", ["api", "v1", "namespaces", _, "pods"]) => {
                let name = body["metadata"]["name"].as_str().unwrap().to_string();
                if self.pods.contains_key(&name) {
                    return (409, status(409, "AlreadyExists"));
                }
                let pod: Pod = serde_json::from_value(body).unwrap();
                self.insert(&pod);
                (201, self.pods[&name].clone())
            }
            _ => (400, status(400, "unsupported")),
        }
    }

    fn reservations(&self, name: &str) -> Vec<Reservation> {
        decode_reservations(self.pods[name]["metadata"]["annotations"][ANNOTATION_RESERVATIONS].as_str())
            .unwrap()
    }
}

fn client(api: Arc<Mutex<FakeApi>>) -> kube::Client {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await.unwrap();
            let body: Value = if bytes.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice(&bytes).unwrap()
            };
            let (code, resp) = {
                let mut a = api.lock().unwrap();
                let (code, resp) = a.handle(parts.method.as_str(), parts.uri.path(), body);
                let name = parts.uri.path().rsplit('/').next().unwrap().to_string();
                a.log.push((parts.method.to_string(), name, code));
                (code, resp)
            };
            send.send_response(
                Response::builder()
                    .status(StatusCode::from_u16(code).unwrap())
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&resp).unwrap()))
                    .unwrap(),
            );
        }
    });
    kube::Client::new(svc, "default")
}

// Each GPU handed out once, so a 900-milli tenant leaves no room (the MPS default of handing caps out twice is
// tested in the pool config's tests).
const POOLS: &str = "namespace: tessera-system\nimage: tessera:test\nreservationTtl: 2m\npools:\n\
- name: a100\n  gpuMemoryMiB: 81920\n  sharing: mps\n  maxGpus: MAX\n  computeOversubscription: 1.0\n";

fn pools(max: u32) -> Arc<PoolsConfig> {
    Arc::new(PoolsConfig::from_yaml(&POOLS.replace("MAX", &max.to_string())).unwrap())
}

fn resv(id: &str, milli: u32) -> Reservation {
    Reservation {
        id: id.into(),
        model: "other/model".into(),
        compute_milli: milli,
        memory_mib: 8192,
        priority: 0,
        // Dated an hour ahead: only the reservation under test may expire in the TTL test.
        created_at: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 3600,
        pod: None,
        evicted_at: None,
        asleep_since: None,
    }
}

fn gpu(cfg: &PoolsConfig, name: &str, node: &str, uuid: &str, rs: &[Reservation]) -> Pod {
    let mut p = capacity_pod(cfg, &cfg.pools[0], name, rs);
    p.spec.as_mut().unwrap().node_name = Some(node.into());
    p.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(ANNOTATION_GPU_UUID.into(), uuid.into());
    p.status = Some(k8s_openapi::api::core::v1::PodStatus {
        phase: Some("Running".into()),
        ..Default::default()
    });
    p
}

/// A pool of at most `max` GPUs with one running capacity pod (`gpu-a` on `node-1`, UUID `GPU-aaaa`) holding
/// `reservations`, and an admitter over it.
async fn one_gpu(
    max: u32,
    reservations: Vec<Reservation>,
) -> (Arc<PoolsConfig>, Arc<Mutex<FakeApi>>, Admitter) {
    let cfg = pools(max);
    let api = Arc::new(Mutex::new(FakeApi::default()));
    api.lock()
        .unwrap()
        .insert(&gpu(&cfg, "gpu-a", "node-1", "GPU-aaaa", &reservations));
    let a = admitter(cfg.clone(), api.clone()).await;
    (cfg, api, a)
}

async fn admitter(cfg: Arc<PoolsConfig>, api: Arc<Mutex<FakeApi>>) -> Admitter {
    let c = client(api.clone());
    let m = PoolManager::new(c, cfg.clone(), "a100").unwrap();
    m.rebuild().await.unwrap();
    api.lock().unwrap().log.clear();
    let mut a = Admitter::without_kube(Config {
        pools: Some(cfg),
        ..Config::default()
    });
    a.pools = Arc::new(HashMap::from([("a100".to_string(), m)]));
    a
}

/// The production-stack pod, opted into the a100 pool with an explicit share (no InferenceAutoscaler needed).
fn review(uid: &str) -> (Value, Vec<u8>) {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../testdata/pods/production-stack-llama3.yaml"),
    )
    .unwrap();
    let mut pod: Value = serde_yaml::from_str(&text).unwrap();
    pod["metadata"]["labels"]["tessera.dev/pool"] = json!("a100");
    pod["metadata"]["annotations"] =
        json!({"tessera.dev/gpu-compute-fraction": "0.25", "tessera.dev/gpu-memory": "16384"});
    let body = serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"},
                    "namespace": "default", "operation": "CREATE", "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
                    "object": pod}
    }))
    .unwrap();
    (pod, body)
}

fn applied(pod: &Value, response: &kube::core::admission::AdmissionResponse) -> Value {
    let patch: json_patch::Patch = serde_json::from_slice(response.patch.as_ref().expect("a patch")).unwrap();
    let mut out = pod.clone();
    json_patch::patch(&mut out, &patch).unwrap();
    out
}

#[tokio::test]
async fn reserve_then_patch_with_node_affinity_and_uuid() {
    let (_, api, a) = one_gpu(2, vec![resv("old", 500)]).await;
    let (pod, body) = review("uid-1");
    let r = a.admit(&body).await.unwrap().response.unwrap();
    assert!(r.allowed);
    let out = applied(&pod, &r);
    assert_eq!(out["metadata"]["annotations"]["tessera.dev/gpu-uuid"], "GPU-aaaa");
    assert_eq!(out["metadata"]["annotations"]["tessera.dev/reservation"], "uid-1");
    assert_eq!(
        out["metadata"]["annotations"]["tessera.dev/capacity-pod"],
        "gpu-a"
    );
    assert_eq!(
        out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchFields"][0]["values"][0],
        "node-1"
    );
    let env = out["spec"]["containers"][0]["env"].as_array().unwrap();
    assert!(
        env.iter()
            .any(|e| e["name"] == "NVIDIA_VISIBLE_DEVICES" && e["value"] == "GPU-aaaa")
    );
    assert!(
        out["spec"]["containers"][0]["resources"]["limits"]
            .get("nvidia.com/gpu")
            .is_none()
    );
    // The cluster holds the reservation, written with the capacity pod's resourceVersion.
    let held = api.lock().unwrap().reservations("gpu-a");
    assert!(
        held.iter()
            .any(|r| r.id == "uid-1" && r.compute_milli == 250 && r.memory_mib == 16384)
    );
    assert_eq!(
        api.lock().unwrap().log,
        vec![("PATCH".to_string(), "gpu-a".to_string(), 200)]
    );
    // A re-invocation on the patched pod reserves nothing more and changes nothing.
    let again = serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "uid-2", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"},
                    "namespace": "default", "operation": "CREATE", "userInfo": {}, "object": out}
    }))
    .unwrap();
    let r2 = a.admit(&again).await.unwrap().response.unwrap();
    assert!(r2.allowed && r2.patch.is_none(), "{r2:?}");
    assert_eq!(api.lock().unwrap().log.len(), 1, "no second reservation");
}

/// `sideEffects: NoneOnDryRun` holds: a dry run of a fractional pod writes nothing to the cluster (no
/// reservation on any capacity pod, no new capacity pod) and is answered unchanged, `dry_run`, without a warning.
#[tokio::test]
async fn a_dry_run_reserves_nothing() {
    let (_, api, a) = one_gpu(2, vec![]).await;
    let (_, body) = review("uid-dry");
    let mut review: Value = serde_json::from_slice(&body).unwrap();
    review["request"]["dryRun"] = json!(true);
    let r = a
        .admit(&serde_json::to_vec(&review).unwrap())
        .await
        .unwrap()
        .response
        .unwrap();
    assert!(r.allowed && r.patch.is_none(), "{r:?}");
    assert_eq!(r.audit_annotations["unchanged"], "dry_run");
    assert!(r.warnings.is_none(), "a dry run is no failure");
    let api = api.lock().unwrap();
    assert!(api.log.is_empty(), "the API saw {:?}", api.log);
    assert!(api.reservations("gpu-a").is_empty());
    assert_eq!(api.pods.len(), 1, "no capacity pod was created");
}

#[tokio::test]
async fn a_conflict_is_retried() {
    let (_, api, a) = one_gpu(2, vec![]).await;
    api.lock().unwrap().conflicts = 1;
    let (pod, body) = review("uid-9");
    let r = a.admit(&body).await.unwrap().response.unwrap();
    let out = applied(&pod, &r);
    assert_eq!(out["metadata"]["annotations"]["tessera.dev/reservation"], "uid-9");
    let log = api.lock().unwrap().log.clone();
    assert_eq!(
        log,
        vec![
            ("PATCH".to_string(), "gpu-a".to_string(), 409),
            ("GET".to_string(), "gpu-a".to_string(), 200),
            ("PATCH".to_string(), "gpu-a".to_string(), 200),
        ]
    );
}

#[tokio::test]
async fn a_full_pool_admits_unchanged_with_the_reason() {
    let (_, api, a) = one_gpu(1, vec![resv("x", 900)]).await;
    let (_, body) = review("uid-3");
    let r = a.admit(&body).await.unwrap().response.unwrap();
    assert!(r.allowed, "fail open: the pod keeps its whole GPU");
    assert!(r.patch.is_none());
    assert_eq!(r.audit_annotations["unchanged"], "reservation_no_room");
    let warning = &r.warnings.unwrap()[0];
    assert!(warning.contains("has no room"), "{warning}");
    assert!(api.lock().unwrap().log.is_empty(), "nothing was written");
}

#[tokio::test]
async fn a_reservation_whose_admission_failed_expires_by_ttl() {
    // No running GPU has room, so the reservation is booked on the leader's spare capacity pod: it has no node,
    // the admission cannot pin the tenant and admits it unchanged, and the reservation on the new GPU is left
    // behind. The webhook creates no pod.
    let (cfg, api, _) = one_gpu(2, vec![resv("x", 900)]).await;
    let leader = PoolManager::new(client(api.clone()), cfg.clone(), "a100").unwrap();
    leader.rebuild().await.unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    leader.reconcile(now).await.unwrap();
    let a = admitter(cfg.clone(), api.clone()).await;
    let (_, body) = review("uid-7");
    let r = a.admit(&body).await.unwrap().response.unwrap();
    assert!(r.allowed && r.patch.is_none());
    assert_eq!(r.audit_annotations["unchanged"], "gpu_pending");
    let created = "tessera-gpu-a100-0";
    assert_eq!(
        api.lock().unwrap().reservations(created).len(),
        1,
        "the reservation was made"
    );

    assert!(
        api.lock().unwrap().log.iter().all(|l| l.0 != "POST"),
        "the webhook created no pod"
    );

    // The autoscaler's pool manager (the leader) drops it once the TTL passes without its pod appearing.
    leader.rebuild().await.unwrap();
    let early = leader.reconcile(now + 60).await.unwrap();
    assert_eq!(early.expired, 0, "not before the TTL");
    let report = leader
        .reconcile(now + cfg.reservation_ttl.as_secs() + 5)
        .await
        .unwrap();
    assert_eq!(report.expired, 1);
    assert!(api.lock().unwrap().reservations(created).is_empty(), "released");
}

/// The policy comes from a reflector store (seeded the way kube-rs tests do), matched through the pod's
/// ReplicaSet to its Deployment; before the store has synced, pods are admitted unchanged (`cache_cold`).
#[tokio::test]
async fn the_policy_comes_from_the_reflector_cache() {
    use kube::runtime::{reflector, watcher};
    use std::sync::atomic::AtomicBool;
    use tessera_api::crd::InferenceAutoscaler;
    use tessera_webhook::admit::Policies;

    let ias: InferenceAutoscaler = serde_json::from_value(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "InferenceAutoscaler",
        "metadata": {"name": "llama3", "namespace": "default"},
        "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "vllm-llama3-deployment-vllm"}, "maxReplicas": 2,
                 "gpu": {"sharing": "whole", "updateMode": "Initial"}},
        "status": {"recommendation": {"gpuMemoryUtilization": 0.42, "reason": "r"}}
    }))
    .unwrap();
    let (reader, mut writer) = reflector::store::<InferenceAutoscaler>();
    writer.apply_watcher_event(&watcher::Event::Init);
    writer.apply_watcher_event(&watcher::Event::InitApply(ias));
    writer.apply_watcher_event(&watcher::Event::InitDone);
    let synced = Arc::new(AtomicBool::new(false));
    let mut a = Admitter::without_kube(Config::default());
    a.policies = Policies::Store(reader, synced.clone());
    let (_, mut body) = review("uid-p");
    // A plain whole-mode pod: no pool label, no share annotations.
    let mut v: Value = serde_json::from_slice(&body).unwrap();
    v["request"]["object"]["metadata"]["labels"]
        .as_object_mut()
        .unwrap()
        .remove("tessera.dev/pool");
    v["request"]["object"]["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("annotations");
    body = serde_json::to_vec(&v).unwrap();
    let cold = a.admit(&body).await.unwrap().response.unwrap();
    assert!(cold.allowed && cold.patch.is_none());
    assert_eq!(cold.audit_annotations["unchanged"], "cache_cold");
    assert!(!a.ready());

    synced.store(true, std::sync::atomic::Ordering::Release);
    assert!(a.ready());
    let r = a.admit(&body).await.unwrap().response.unwrap();
    let out = applied(&v["request"]["object"], &r);
    assert_eq!(
        out["spec"]["containers"][0]["command"][15], "0.42",
        "the recommendation replaced the user's --gpu-memory-utilization 0.8"
    );
}
