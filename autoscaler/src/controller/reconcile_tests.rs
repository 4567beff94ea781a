//! Reconcile against kube's mock service: every API request is asserted (method, path, query, body) and answered.
#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use futures::future::BoxFuture;
use http::{Method, Request, Response};
use http_body_util::BodyExt;
use kube::Client;
use kube::client::Body;
use kube::runtime::events::{Recorder, Reporter};
use serde_json::{Value, json};
use tessera_core::wire::activator::ActivatorStats;
use tessera_core::wire::sidecar::SidecarStatus;

use super::*;
use crate::controller::metrics::Metrics;
use crate::controller::signals::{ActivatorPoller, FetchError, SignalSource};
use crate::test_support::respond;

#[path = "reconcile_coldstart_tests.rs"]
mod coldstart;
#[path = "reconcile_objective_tests.rs"]
mod objective;
#[path = "reconcile_sleep_tests.rs"]
mod sleep;

/// Sidecars answer from a map of base URL → KV usage; a missing URL times out. Activators answer the documents
/// queued in `activator`, one per call, repeating the last one; none: connection refused.
#[derive(Default)]
struct FakeSignals {
    kv: HashMap<String, f64>,
    activator: Mutex<std::collections::VecDeque<ActivatorStats>>,
    /// The `rest` field every sidecar document carries (sleep mode), if any.
    rest: Option<Value>,
    /// The objective every sidecar reports holding (`compute`); a hand-over replaces it, as the sidecar does.
    compute: Mutex<Option<tessera_core::wire::sidecar::ComputeStatus>>,
    /// Every objective handed over, with the sidecar it went to.
    handed: Mutex<Vec<(String, tessera_core::wire::sidecar::Objective)>>,
    /// The time to first token's p95 over the short window every sidecar reports, seconds, if any.
    ttft_p95: Option<f64>,
}

/// A replica's status with KV cache usage `kv`: four requests running, none when the cache is empty (an idle
/// replica, which lets a model go to zero).
fn sidecar_status(kv: f64) -> SidecarStatus {
    let running = if kv == 0.0 { 0.0 } else { 4.0 };
    serde_json::from_value(json!({
        "schema_version": 1, "generated_at": 1000.0, "vllm_url": "http://127.0.0.1:8000", "vllm_up": true,
        "ready": true, "stale": false, "scrape": {"interval_secs": 5.0, "successes_total": 10},
        "latest": {"at": 999.0, "kv_cache_usage_ratio": kv, "requests_running": running, "requests_waiting": 0.0},
        "recommendation": {"outcome": {"state": "not_yet", "code": "too_few_samples", "reason": "warming up"}}
    }))
    .unwrap()
}

impl SignalSource for FakeSignals {
    fn sidecar_status(&self, base: &str) -> BoxFuture<'_, Result<SidecarStatus, FetchError>> {
        let r = self
            .kv
            .get(base)
            .map(|kv| {
                let mut st = sidecar_status(*kv);
                st.rest = self.rest.clone().map(|r| serde_json::from_value(r).unwrap());
                st.compute = *self.compute.lock().unwrap();
                st.recent = self.ttft_p95.map(|p95| {
                    serde_json::from_value(json!({"window_secs": 30.0, "start": 970.0, "end": 999.0,
                        "ttft_seconds": {"p50": p95 / 3.0, "p95": p95, "p99": p95 * 1.2, "count": 40}}))
                    .unwrap()
                });
                st
            })
            .ok_or(FetchError::Timeout {
                url: base.to_owned(),
                timeout: Duration::from_secs(2),
            });
        Box::pin(async move { r })
    }
    fn hand_objective(
        &self,
        base: &str,
        _namespace: &str,
        objective: &tessera_core::wire::sidecar::Objective,
    ) -> BoxFuture<'_, Result<(), FetchError>> {
        self.handed.lock().unwrap().push((base.to_owned(), *objective));
        if let Some(c) = self.compute.lock().unwrap().as_mut() {
            c.ttft_slo_secs = objective.ttft_slo_secs;
            c.ttft_slo_percentile = Some(objective.ttft_slo_percentile);
            c.itl_slo_secs = objective.itl_slo_secs;
        }
        Box::pin(async { Ok(()) })
    }
    fn activator_stats(&self, base: &str) -> BoxFuture<'_, Result<ActivatorStats, FetchError>> {
        let url = base.to_owned();
        let mut docs = self.activator.lock().unwrap();
        let doc = if docs.len() > 1 {
            docs.pop_front()
        } else {
            docs.front().cloned()
        };
        Box::pin(async move {
            doc.ok_or(FetchError::Connect {
                url,
                message: "not in this test".into(),
            })
        })
    }
}

const NOW_S: u64 = 1_800_000_000;

fn context(client: Client, kv: &[(&str, f64)]) -> Arc<Context> {
    context_with_activator(client, kv, Vec::new())
}

/// One activator pod at `http://act-0:8080` answering `docs` in turn.
fn context_with_activator(client: Client, kv: &[(&str, f64)], docs: Vec<ActivatorStats>) -> Arc<Context> {
    let activators = if docs.is_empty() {
        ActivatorPoller::new(&[])
    } else {
        ActivatorPoller::new(&["http://act-0:8080".to_owned()])
    };
    test_context(
        client,
        Arc::new(FakeSignals {
            kv: kv.iter().map(|(u, k)| ((*u).to_owned(), *k)).collect(),
            activator: Mutex::new(docs.into()),
            ..FakeSignals::default()
        }),
        activators,
        UNIX_EPOCH + Duration::from_secs(NOW_S),
        HashMap::new(),
    )
}

/// A controller context with the controller's default settings, answering signals from `signals`, with its clock
/// stopped at `now` and the models' histories `states`.
pub(super) fn test_context(
    client: Client,
    signals: Arc<dyn SignalSource>,
    activators: ActivatorPoller,
    now: std::time::SystemTime,
    states: HashMap<String, tessera_core::scale::ScaleState>,
) -> Arc<Context> {
    Arc::new(Context {
        client: client.clone(),
        signals,
        activators,
        metrics: Arc::new(Metrics::new()),
        recorder: Recorder::new(
            client,
            Reporter {
                controller: "tessera-autoscaler".into(),
                instance: None,
            },
        ),
        settings: Settings {
            sync_period: Duration::from_secs(15),
            sidecar_port: 9090,
            max_signal_age: tessera_core::scale::inputs::MAX_SIGNAL_AGE,
            activator_max_age: tessera_core::scale::inputs::ACTIVATOR_MAX_AGE,
            rollout: tessera_core::rollout::RolloutConfig::default(),
        },
        clock: Arc::new(move || now),
        states: Mutex::new(states),
        last_runs: Mutex::new(HashMap::new()),
        runs_swept_at: Mutex::new(None),
        woken: Mutex::new(HashSet::new()),
        gate_timeouts: Mutex::new(HashSet::new()),
        rolling: crate::controller::rollout::Rolling::default(),
        consolidation: crate::pool::ConsolidationLink::default(),
        ui: Arc::new(crate::ui::Store::new(
            Default::default(),
            false,
            0,
            Duration::from_secs(600),
        )),
        objects: std::sync::RwLock::new(None),
        scalers: crate::controller::owners::HpaCache::default(),
        neighbours: crate::controller::neighbours::Book::default(),
        dra_templates: std::sync::Mutex::default(),
        pods: crate::controller::pods::PodCache::default(),
        deployments: crate::controller::scales::DeploymentCache::default(),
    })
}

/// An activator document (schema 2, keys `"<namespace>/<model>"`) observed at `at_ms` with one model.
fn activator_doc(
    at_ms: u64,
    key: &str,
    total: u64,
    in_flight: u64,
    queued: u64,
    last: Option<u64>,
) -> ActivatorStats {
    let stats = tessera_core::wire::activator::ModelStats::counts(total, in_flight, queued, last);
    ActivatorStats::new("act-0", 1_000, at_ms, [(key.to_owned(), stats)])
}

/// Polls the context's activators once at the test's "now".
async fn poll(ctx: &Context) {
    ctx.activators
        .poll_once(
            ctx.signals.as_ref(),
            &ctx.metrics,
            NOW_S * 1000,
            Duration::from_secs(5),
        )
        .await;
}

fn ias(spec: Value, annotations: Value) -> Arc<InferenceAutoscaler> {
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "tessera.dev/v1alpha1", "kind": "InferenceAutoscaler",
            "metadata": {"name": "llama", "namespace": "models", "uid": "u-1", "resourceVersion": "5",
                         "generation": 2, "annotations": annotations},
            "spec": spec,
        }))
        .unwrap(),
    )
}

/// A valid object as the API server would answer a status write.
fn ias_json() -> Value {
    serde_json::to_value(&*ias(
        json!({"scaleTargetRef": {"kind": "Deployment", "name": "llama"}, "maxReplicas": 10}),
        json!({}),
    ))
    .unwrap()
}

fn scale_json(replicas: i32) -> Value {
    json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
           "metadata": {"name": "llama", "namespace": "models", "resourceVersion": "100"},
           "spec": {"replicas": replicas}, "status": {"replicas": replicas, "selector": "app=llama"}})
}

/// A ready pod the webhook placed on capacity pod `gpu`.
fn pod_on_gpu(name: &str, ip: &str, gpu: &str) -> Value {
    let mut p = pod(name, ip, true);
    p["metadata"]["annotations"] = json!({ crate::pool::ANNOTATION_CAPACITY_POD: gpu });
    p
}

fn pod(name: &str, ip: &str, ready: bool) -> Value {
    json!({"metadata": {"name": name, "namespace": "models"}, "spec": crate::controller::injection::injected_spec(),
           "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}})
}

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// Takes the next request, checks method and path (with query), returns its JSON body (Null when empty).
async fn expect(
    handle: &mut Handle,
    method: Method,
    path_and_query: &str,
) -> (Value, tower_test::mock::SendResponse<Response<Body>>) {
    let (req, send) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
        .await
        .expect("the reconcile made no further request")
        .expect("the client went away");
    assert_eq!(req.method(), method, "{}", req.uri());
    assert_eq!(req.uri().path_and_query().unwrap().as_str(), path_and_query);
    if method == Method::PATCH {
        assert_eq!(
            req.headers()["content-type"],
            "application/merge-patch+json",
            "{}",
            req.uri()
        );
    }
    let bytes = req.into_body().collect().await.unwrap().to_bytes();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap()
    };
    (body, send)
}

/// Takes the reconcile's write of `replicas` to the target's `/scale` (answering it), then the event it posts:
/// returns the event to check and answer.
async fn expect_rescale(
    handle: &mut Handle,
    replicas: i32,
) -> (Value, tower_test::mock::SendResponse<Response<Body>>) {
    let (body, send) = expect(
        handle,
        Method::PATCH,
        &format!("{SCALE}?&fieldManager=tessera-autoscaler"),
    )
    .await;
    assert_eq!(body, json!({"spec": {"replicas": replicas}}));
    respond(send, 200, &scale_json(replicas));
    expect(handle, Method::POST, EVENTS).await
}

const SCALE: &str = "/apis/apps/v1/namespaces/models/deployments/llama/scale";
const STATUS: &str = "/apis/tessera.dev/v1alpha1/namespaces/models/inferenceautoscalers/llama/status";
/// A status write (a merge patch under our field manager).
const STATUS_PATCH: &str = "/apis/tessera.dev/v1alpha1/namespaces/models/inferenceautoscalers/llama/status?&fieldManager=tessera-autoscaler";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/models/events?";

fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap()
}

/// Answers the reconcile's first two reads: the target's `/scale` at `replicas`, then its pods.
async fn answer_scale_and_pods(handle: &mut Handle, replicas: i32, pods: Vec<Value>) {
    let (_, send) = expect(handle, Method::GET, SCALE).await;
    respond(send, 200, &scale_json(replicas));
    let (_, send) = expect(
        handle,
        Method::GET,
        "/api/v1/namespaces/models/pods?&labelSelector=app%3Dllama",
    )
    .await;
    respond(
        send,
        200,
        &json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": pods}),
    );
}

#[tokio::test]
async fn scales_up_through_scale_writes_status_and_retries_a_conflict() {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(svc, "default");
    let ctx = context(
        client,
        &[("http://10.0.0.1:9090", 0.7), ("http://10.0.0.2:9090", 0.7)],
    );
    let obj = ias(
        json!({"scaleTargetRef": {"kind": "Deployment", "name": "llama"}, "minReplicas": 1, "maxReplicas": 10,
               "targets": {"kvCacheUtilization": 0.5}}),
        json!({}),
    );
    let server = tokio::spawn(async move {
        answer_scale_and_pods(
            &mut handle,
            2,
            vec![
                pod("llama-0", "10.0.0.1", true),
                pod("llama-1", "10.0.0.2", true),
                pod("llama-2", "10.0.0.3", false),
            ],
        )
        .await;
        // 2 ready replicas at 70% KV, target 50%: ceil(2 × 1.4) = 3 (below the 200% panic threshold).
        let (event, send) = expect_rescale(&mut handle, 3).await;
        assert_eq!(event["reason"], "SuccessfulRescale");
        assert_eq!(event["action"], "ScaleTo3");
        assert_eq!(event["type"], "Normal");
        assert_eq!(event["regarding"]["kind"], "InferenceAutoscaler");
        assert!(
            event["note"]
                .as_str()
                .unwrap()
                .starts_with("New size: 3; reason: kv_cache_utilization 0.700"),
            "{event}"
        );
        respond(send, 201, &event);
        // Status with the object's resourceVersion; someone else wrote first.
        let (patch, send) = expect(&mut handle, Method::PATCH, STATUS_PATCH).await;
        assert_eq!(patch["metadata"]["resourceVersion"], "5");
        assert_eq!(patch["status"]["desiredReplicas"], 3);
        respond(
            send,
            409,
            &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict",
            "code": 409, "message": "the object has been modified; please apply your changes to the latest version"}),
        );
        let (_, send) = expect(&mut handle, Method::GET, STATUS).await;
        let mut fresh = serde_json::to_value(&*ias(
            json!({"scaleTargetRef": {"kind": "Deployment", "name": "llama"},
            "maxReplicas": 10}),
            json!({}),
        ))
        .unwrap();
        fresh["metadata"]["resourceVersion"] = json!("6");
        fresh["status"] = json!({"replicas": 2, "desiredReplicas": 2, "conditions": [{"type": "ScalingLimited",
            "status": "False", "reason": "DesiredWithinRange", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
        respond(send, 200, &fresh);
        let (patch, send) = expect(&mut handle, Method::PATCH, STATUS_PATCH).await;
        assert_eq!(
            patch["metadata"]["resourceVersion"], "6",
            "retried on the fresh version"
        );
        let st = &patch["status"];
        assert_eq!(
            (
                st["replicas"].clone(),
                st["desiredReplicas"].clone(),
                st["readyReplicas"].clone()
            ),
            (json!(3), json!(3), json!(2))
        );
        assert_eq!(st["target"], "Deployment/llama");
        assert_eq!(st["leadingSignal"], "kvCacheUtilization");
        assert_eq!(st["lastDecisionReason"], "scale_up");
        assert_eq!(st["currentMetrics"][0]["current"], 0.7);
        assert_eq!(condition(st, "AbleToScale")["reason"], "SucceededRescale");
        // The condition from the fresh status kept its transition time (status unchanged: False).
        assert_eq!(
            condition(st, "ScalingLimited")["lastTransitionTime"],
            "2026-01-01T00:00:00Z"
        );
        respond(send, 200, &fresh);
    });
    let action = reconcile(obj, ctx.clone()).await.unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(15)));
    server.await.unwrap();
    let text = ctx.metrics.encode();
    assert!(
        text.contains("tessera_autoscaler_decisions_total{reason=\"scale_up\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("tessera_autoscaler_scales_total{direction=\"up\"} 1"),
        "{text}"
    );
    let states = ctx.states.lock().unwrap();
    assert_eq!(
        states["models/llama"].events.len(),
        1,
        "the scale is remembered for the rate limits"
    );
}

#[tokio::test]
async fn unreadable_sidecars_never_scale_down() {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(svc, "default");
    // Sidecars answer nothing (timeouts) although KV would be 0: keep 3 replicas.
    let ctx = context(client, &[]);
    let obj = ias(
        json!({"scaleTargetRef": {"kind": "Deployment", "name": "llama"}, "maxReplicas": 10,
               "targets": {"kvCacheUtilization": 0.5}, "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}}}),
        json!({}),
    );
    let server = tokio::spawn(async move {
        answer_scale_and_pods(
            &mut handle,
            3,
            vec![
                pod("a", "10.0.0.1", true),
                pod("b", "10.0.0.2", true),
                pod("c", "10.0.0.3", true),
            ],
        )
        .await;
        // No /scale PATCH, no event: straight to status.
        let (patch, send) = expect(&mut handle, Method::PATCH, STATUS_PATCH).await;
        let st = &patch["status"];
        assert_eq!(st["desiredReplicas"], 3);
        assert_eq!(st["lastDecisionReason"], "missing_metrics");
        assert_eq!(condition(st, "ScalingActive")["status"], "False");
        assert_eq!(condition(st, "ScalingActive")["reason"], "MissingMetrics");
        respond(send, 200, &ias_json());
    });
    reconcile(obj, ctx.clone()).await.unwrap();
    server.await.unwrap();
    assert!(
        ctx.metrics
            .encode()
            .contains("tessera_autoscaler_scrape_failures_total{source=\"sidecar\",reason=\"timeout\"} 3")
    );
}

/// Contract 2: a request held at an activator (queued > 0 in its document, key "<namespace>/<model>") scales a
/// model at zero to one replica at once; nothing is read from or written to the object's annotations.
#[tokio::test]
async fn a_request_held_at_an_activator_scales_from_zero_at_once() {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(svc, "default");
    let ms = NOW_S * 1000;
    let ctx = context_with_activator(
        client,
        &[],
        vec![activator_doc(ms, "models/llama", 1, 0, 1, Some(ms - 200))],
    );
    let mut wakes = ctx.activators.subscribe();
    poll(&ctx).await;
    assert_eq!(wakes.try_recv().unwrap(), "models/llama");
    let obj = ias(
        json!({"scaleTargetRef": {"kind": "StatefulSet", "name": "llama"}, "minReplicas": 0, "maxReplicas": 4,
               "scaleToZero": {"idleAfter": "5m"}, "targets": {"kvCacheUtilization": 0.5},
               "modelNames": ["llama"]}),
        json!({}),
    );
    let other_ns: Arc<InferenceAutoscaler> = Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "tessera.dev/v1alpha1", "kind": "InferenceAutoscaler",
            "metadata": {"name": "llama", "namespace": "team-b"},
            "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "llama"}, "maxReplicas": 1, "modelNames": ["llama"]}
        }))
        .unwrap(),
    );
    let refs = objects_for_model(&[obj.clone(), other_ns], "models/llama");
    assert_eq!(refs.len(), 1, "only the namespace the request was for");
    assert_eq!(
        (refs[0].name.as_str(), refs[0].namespace.as_deref()),
        ("llama", Some("models"))
    );
    // Woken right after a status write (which would look like its echo): it still runs.
    ctx.last_runs.lock().unwrap().insert(
        "models/llama".into(),
        (UNIX_EPOCH + Duration::from_secs(NOW_S - 1), trigger_hash(&obj)),
    );
    ctx.mark_woken("models/llama");
    let scale = "/apis/apps/v1/namespaces/models/statefulsets/llama/scale";
    let server = tokio::spawn(async move {
        let (_, send) = expect(&mut handle, Method::GET, scale).await;
        respond(send, 200, &scale_json(0));
        // At zero there are no pods to list: straight to the scale.
        let (body, send) = expect(
            &mut handle,
            Method::PATCH,
            &format!("{scale}?&fieldManager=tessera-autoscaler"),
        )
        .await;
        assert_eq!(body, json!({"spec": {"replicas": 1}}));
        respond(send, 200, &scale_json(1));
        let (event, send) = expect(&mut handle, Method::POST, EVENTS).await;
        assert!(
            event["note"].as_str().unwrap().contains("scaling 0 -> 1"),
            "{event}"
        );
        respond(send, 201, &event);
        let (patch, send) = expect(&mut handle, Method::PATCH, STATUS_PATCH).await;
        assert_eq!(patch["status"]["lastDecisionReason"], "scale_from_zero");
        respond(send, 200, &ias_json());
    });
    reconcile(obj, ctx).await.unwrap();
    server.await.unwrap();
}

/// Item 7: the documents the decision used may be a poll old; a request that arrived since keeps the model up.
#[tokio::test]
async fn a_request_arriving_before_the_scale_to_zero_keeps_the_model() {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(svc, "default");
    let ms = NOW_S * 1000;
    let ctx = context_with_activator(
        client,
        &[("http://10.0.0.1:9090", 0.0)],
        vec![
            activator_doc(ms - 1000, "models/llama", 5, 0, 0, Some(ms - 900_000)),
            activator_doc(ms, "models/llama", 5, 0, 0, Some(ms - 900_000)),
            // Fetched right before the patch to zero: a request is in flight.
            activator_doc(ms + 100, "models/llama", 6, 1, 0, Some(ms + 50)),
        ],
    );
    poll(&ctx).await;
    poll(&ctx).await;
    let obj = ias(
        json!({"scaleTargetRef": {"kind": "Deployment", "name": "llama"}, "minReplicas": 0, "maxReplicas": 4,
               "scaleToZero": {"idleAfter": "5m"}, "modelNames": ["llama"]}),
        json!({}),
    );
    let server = tokio::spawn(async move {
        let idle_pod = pod("a", "10.0.0.1", true);
        answer_scale_and_pods(&mut handle, 1, vec![idle_pod]).await;
        // No /scale PATCH: straight to status.
        let (patch, send) = expect(&mut handle, Method::PATCH, STATUS_PATCH).await;
        assert_eq!(patch["status"]["desiredReplicas"], 1);
        respond(send, 200, &ias_json());
    });
    reconcile(obj, ctx).await.unwrap();
    server.await.unwrap();
}

/// Item 8: a reconcile whose status equals the object's writes nothing.
#[tokio::test]
async fn an_unchanged_status_is_not_written() {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let ctx = context(Client::new(svc, "default"), &[("http://10.0.0.1:9090", 0.5)]);
    let spec = json!({"scaleTargetRef": {"kind": "Deployment", "name": "llama"}, "maxReplicas": 3,
                      "targets": {"kvCacheUtilization": 0.5}});
    let first = tokio::spawn(async move {
        answer_scale_and_pods(&mut handle, 1, vec![pod("a", "10.0.0.1", true)]).await;
        let (patch, send) = expect(&mut handle, Method::PATCH, STATUS_PATCH).await;
        respond(send, 200, &ias_json());
        (patch, handle)
    });
    reconcile(ias(spec.clone(), json!({})), ctx.clone())
        .await
        .unwrap();
    let (patch, mut handle) = first.await.unwrap();
    // The same observation again, on the object carrying the status just written (not an echo: a full run).
    ctx.last_runs.lock().unwrap().clear();
    let mut obj = (*ias(spec, json!({}))).clone();
    obj.status = Some(serde_json::from_value(patch["status"].clone()).unwrap());
    let second = tokio::spawn(async move {
        answer_scale_and_pods(&mut handle, 1, vec![pod("a", "10.0.0.1", true)]).await;
        handle
    });
    reconcile(Arc::new(obj), ctx).await.unwrap();
    let mut handle = second.await.unwrap();
    let next = tokio::time::timeout(Duration::from_millis(100), handle.next_request()).await;
    assert!(
        matches!(next, Err(_) | Ok(None)),
        "a status write with nothing new"
    );
}

/// A pod sharing a GPU with another model's pod near its objective: the status tells the activator
/// (`status.flexNeighbours`, by pod IP) so that it sends that pod no batch work.
#[tokio::test]
async fn a_pod_beside_a_pressed_neighbour_is_published_for_the_flex_lane() {
    use crate::controller::neighbours::PodSeen;
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let ctx = context(Client::new(svc, "default"), &[("http://10.0.0.1:9090", 0.5)]);
    // Another model's round saw its pod on capacity pod cap-0 at 90% of its TTFT objective.
    let now = UNIX_EPOCH + Duration::from_secs(NOW_S);
    let other = PodSeen {
        name: "chat-0".into(),
        ip: Some("10.0.9.9".into()),
        gpu: Some("cap-0".into()),
        pressure: Some(0.9),
    };
    ctx.neighbours.record("team/chat", vec![other], now);
    let spec = json!({"scaleTargetRef": {"kind": "Deployment", "name": "llama"}, "maxReplicas": 3,
                      "targets": {"kvCacheUtilization": 0.5}});
    let mut on_cap = pod("a", "10.0.0.1", true);
    on_cap["metadata"]["annotations"] = json!({"tessera.dev/capacity-pod": "cap-0"});
    let server = tokio::spawn(async move {
        answer_scale_and_pods(&mut handle, 1, vec![on_cap]).await;
        let (patch, send) = expect(&mut handle, Method::PATCH, STATUS_PATCH).await;
        respond(send, 200, &ias_json());
        patch
    });
    reconcile(ias(spec, json!({})), ctx).await.unwrap();
    let patch = server.await.unwrap();
    let flex = &patch["status"]["flexNeighbours"];
    assert_eq!(
        flex["pods"],
        json!([{"pod": "a", "podIP": "10.0.0.1", "pressure": 0.9}]),
        "{flex}"
    );
    assert!(
        flex["observedAt"]
            .as_str()
            .is_some_and(|t| t.starts_with("2027-")),
        "{flex}"
    );
}

#[tokio::test]
async fn an_invalid_spec_is_reported_not_acted_on() {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(svc, "default");
    let ctx = context(client, &[]);
    let spec = json!({"scaleTargetRef": {"kind": "Deployment", "name": "llama"}, "minReplicas": 5, "maxReplicas": 2});
    let obj = ias(spec.clone(), json!({}));
    let server = tokio::spawn(async move {
        let (event, send) = expect(&mut handle, Method::POST, EVENTS).await;
        assert_eq!(
            (event["type"].clone(), event["reason"].clone()),
            (json!("Warning"), json!("InvalidSpec"))
        );
        respond(send, 201, &event);
        let (patch, send) = expect(&mut handle, Method::PATCH, STATUS_PATCH).await;
        let valid = condition(&patch["status"], "Valid");
        assert_eq!(valid["status"], "False");
        assert!(
            valid["message"]
                .as_str()
                .unwrap()
                .contains("maxReplicas (2) must be >= minReplicas (5)")
        );
        let message = valid["message"].as_str().unwrap().to_owned();
        respond(send, 200, &ias_json());
        message
    });
    reconcile(obj, ctx).await.unwrap();
    let message = server.await.unwrap();
    // The simulator reads the same spec in a scenario model and refuses it with this very message.
    let scenario = format!(
        "{{name: t, duration: 10m, gpu: a100-80gb, models: [{{name: llama, preset: llama-3.1-8b, \
         hpa_requests_per_second_per_replica: 4, traffic: {{trace: azure_llm}}, inference_autoscaler: {spec}}}]}}"
    );
    match tessera_sim::simulate::scenario::ScenarioFile::parse(&scenario, "s.yaml") {
        Err(tessera_sim::simulate::scenario::ScenarioError::Invalid { problems, .. }) => {
            assert_eq!(
                problems,
                [format!("models[0] (llama).inference_autoscaler: {message}")]
            );
        }
        other => panic!("the simulator took the spec: {other:?}"),
    }
}

#[test]
fn target_resources_and_pod_urls() {
    let ar = target_resource("apps/v1", "StatefulSet").unwrap();
    assert_eq!((ar.group.as_str(), ar.plural.as_str()), ("apps", "statefulsets"));
    let ar = target_resource("v1", "ReplicationController").unwrap();
    assert_eq!((ar.group.as_str(), ar.version.as_str()), ("", "v1"));
    assert!(target_resource("a/b/c", "X").is_err());
    assert!(target_resource("", "X").is_err());
    let p: Pod = serde_json::from_value(pod("a", "fd00::1", true)).unwrap();
    assert_eq!(ready_pod_url(&p, 9090).unwrap().1, "http://[fd00::1]:9090");
    let mut p: Pod = serde_json::from_value(pod("a", "10.1.1.1", true)).unwrap();
    p.metadata.annotations = Some([(SIDECAR_PORT_ANNOTATION.to_owned(), "9191".to_owned())].into());
    assert_eq!(ready_pod_url(&p, 9090).unwrap().1, "http://10.1.1.1:9191");
    let p: Pod = serde_json::from_value(pod("a", "10.1.1.1", false)).unwrap();
    assert!(ready_pod_url(&p, 9090).is_none());
}

#[test]
fn generation_triggers_but_status_and_annotations_do_not() {
    let mut obj: InferenceAutoscaler = serde_json::from_value(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "InferenceAutoscaler",
        "metadata": {"name": "a", "namespace": "n", "generation": 1},
        "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "a"}, "maxReplicas": 3}
    }))
    .unwrap();
    let h0 = trigger_hash(&obj);
    obj.status = Some(crate::crd::InferenceAutoscalerStatus {
        desired_replicas: 2,
        ..Default::default()
    });
    obj.metadata.resource_version = Some("99".into());
    assert_eq!(trigger_hash(&obj), h0, "a status write must not re-trigger");
    obj.metadata.annotations = Some(
        [(
            "tessera.dev/activated-at".to_owned(),
            "2026-01-01T00:00:00Z".to_owned(),
        )]
        .into(),
    );
    assert_eq!(
        trigger_hash(&obj),
        h0,
        "wake-ups no longer come through annotations"
    );
    obj.metadata.generation = Some(2);
    assert_ne!(trigger_hash(&obj), h0);
}

#[tokio::test]
async fn the_echo_of_a_status_write_is_skipped_without_api_calls() {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let ctx = context(Client::new(svc, "default"), &[]);
    let obj = ias(
        json!({"scaleTargetRef": {"kind": "Deployment", "name": "llama"}, "maxReplicas": 3}),
        json!({}),
    );
    ctx.last_runs.lock().unwrap().insert(
        "models/llama".into(),
        (UNIX_EPOCH + Duration::from_secs(NOW_S - 2), trigger_hash(&obj)),
    );
    let action = reconcile(obj, ctx).await.unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(13)));
    // The client is gone (or silent): either way no request was made.
    let next = tokio::time::timeout(Duration::from_millis(50), handle.next_request()).await;
    assert!(matches!(next, Err(_) | Ok(None)), "unexpected request");
}

#[tokio::test]
async fn history_of_deleted_objects_is_forgotten() {
    let (svc, _handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let ctx = context(Client::new(svc, "default"), &[]);
    let now = UNIX_EPOCH + Duration::from_secs(NOW_S);
    ctx.states
        .lock()
        .unwrap()
        .insert("ns/gone".into(), ScaleState::default());
    ctx.states
        .lock()
        .unwrap()
        .insert("ns/live".into(), ScaleState::default());
    let mut runs = HashMap::new();
    runs.insert("ns/gone".to_owned(), (now - Duration::from_secs(151), 0));
    runs.insert("ns/live".to_owned(), (now - Duration::from_secs(15), 0));
    forget_deleted(&mut runs, &ctx, now);
    assert!(!runs.contains_key("ns/gone") && runs.contains_key("ns/live"));
    let states = ctx.states.lock().unwrap();
    assert!(!states.contains_key("ns/gone") && states.contains_key("ns/live"));
}

/// A pod on a GPU the pool manager is draining (`core::pack::consolidate`): the first round surges one replica over
/// the decision (which stays 1) and says so in the `Consolidating` condition; once the copy elsewhere is ready, the
/// next round takes the surge off `/scale`'s count before deciding, marks the pod on the draining GPU with the
/// lowest pod-deletion-cost, and goes back to one replica, so the ReplicaSet removes that pod.
#[tokio::test]
async fn a_pod_on_a_draining_gpu_is_surged_off_then_retired() {
    let spec = json!({"scaleTargetRef": {"kind": "Deployment", "name": "llama"}, "minReplicas": 1, "maxReplicas": 4,
                      "targets": {"kvCacheUtilization": 0.5}});

    // Round 1: one pod, on the draining GPU.
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let ctx = context(Client::new(svc, "default"), &[("http://10.0.0.1:9090", 0.5)]);
    ctx.consolidation
        .draining
        .set("a100", vec!["tessera-gpu-a100-1".into()]);
    let obj = ias(spec.clone(), json!({}));
    let first = pod_on_gpu("llama-0", "10.0.0.1", "tessera-gpu-a100-1");
    let server = tokio::spawn(async move {
        answer_scale_and_pods(&mut handle, 1, vec![first]).await;
        let (event, send) = expect_rescale(&mut handle, 2).await;
        assert!(
            event["note"]
                .as_str()
                .unwrap()
                .contains("+1 while a pod moves off a GPU being drained"),
            "{event}"
        );
        respond(send, 201, &event);
        let (patch, send) = expect(&mut handle, Method::PATCH, STATUS_PATCH).await;
        let st = &patch["status"];
        assert_eq!(st["desiredReplicas"], 1, "the decision is still one replica");
        let c = condition(st, "Consolidating");
        assert_eq!(
            (c["status"].clone(), c["reason"].clone()),
            (json!("True"), json!("Surge"))
        );
        assert!(
            c["message"].as_str().unwrap().contains("tessera-gpu-a100-1"),
            "{c}"
        );
        let mut answer = ias_json();
        answer["status"] = patch["status"].clone();
        respond(send, 200, &answer);
        patch["status"].clone()
    });
    reconcile(obj, ctx.clone()).await.unwrap();
    let status = server.await.unwrap();
    // The round told the pool managers it moves this Deployment's pod.
    assert!(ctx.consolidation.managed.fresh().contains("models/llama-0"));

    // Round 2: the copy on another GPU is ready; the status remembers the surge.
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let ctx = context(
        Client::new(svc, "default"),
        &[("http://10.0.0.1:9090", 0.5), ("http://10.0.0.2:9090", 0.5)],
    );
    ctx.consolidation
        .draining
        .set("a100", vec!["tessera-gpu-a100-1".into()]);
    let mut obj = (*ias(spec, json!({}))).clone();
    obj.status = Some(serde_json::from_value(status).unwrap());
    let pods = vec![
        pod_on_gpu("llama-0", "10.0.0.1", "tessera-gpu-a100-1"),
        pod_on_gpu("llama-1", "10.0.0.2", "tessera-gpu-a100-0"),
    ];
    let server = tokio::spawn(async move {
        answer_scale_and_pods(&mut handle, 2, pods).await;
        let (body, send) = expect(
            &mut handle,
            Method::PATCH,
            "/api/v1/namespaces/models/pods/llama-0?",
        )
        .await;
        assert_eq!(
            body,
            json!({"metadata": {"annotations": {"controller.kubernetes.io/pod-deletion-cost": "-2147483648"}}})
        );
        respond(send, 200, &pod("llama-0", "10.0.0.1", true));
        let (event, send) = expect_rescale(&mut handle, 1).await;
        assert_eq!(event["action"], "ScaleTo1");
        respond(send, 201, &event);
        let (patch, send) = expect(&mut handle, Method::PATCH, STATUS_PATCH).await;
        let c = condition(&patch["status"], "Consolidating");
        assert_eq!(
            (c["status"].clone(), c["reason"].clone()),
            (json!("True"), json!("Retire"))
        );
        assert!(c["message"].as_str().unwrap().contains("llama-0"), "{c}");
        respond(send, 200, &ias_json());
    });
    reconcile(Arc::new(obj), ctx).await.unwrap();
    server.await.unwrap();
}

/// At its ceiling, over its TTFT objective while one of its pods shares a GPU (`core::scale::isolation`): the round
/// says `Isolated` True; the next round reads it, and the pod on the shared GPU moves off it as from a draining
/// one (a surge over the ceiling, the copy placed on a whole GPU by the webhook).
#[tokio::test]
async fn a_model_over_its_objective_at_the_ceiling_is_isolated_and_its_shared_pod_moves() {
    let spec = json!({"scaleTargetRef": {"kind": "Deployment", "name": "llama"}, "minReplicas": 1, "maxReplicas": 2,
                      "ttftSlo": "2s", "targets": {"kvCacheUtilization": 0.5}});
    let sidecars = [("http://10.0.0.1:9090", 0.3), ("http://10.0.0.2:9090", 0.3)];
    let pods = vec![
        pod_on_gpu("llama-0", "10.0.0.1", "tessera-gpu-a100-0"),
        pod_on_gpu("llama-1", "10.0.0.2", "tessera-gpu-a100-1"),
    ];

    let slow_context = |svc| {
        let ctx = test_context(
            Client::new(svc, "default"),
            Arc::new(FakeSignals {
                kv: sidecars.iter().map(|(u, k)| ((*u).to_owned(), *k)).collect(),
                ttft_p95: Some(3.0),
                ..FakeSignals::default()
            }),
            ActivatorPoller::new(&[]),
            UNIX_EPOCH + Duration::from_secs(NOW_S),
            HashMap::new(),
        );
        // The pool: llama-0's GPU holds another tenant too.
        ctx.consolidation
            .shared
            .set("a100", vec!["tessera-gpu-a100-0".into()]);
        ctx
    };

    // Round 1: at two of two, p95 3 s over 2 s, one pod sharing: isolated, nothing moves yet.
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let first = pods.clone();
    let server = tokio::spawn(async move {
        answer_scale_and_pods(&mut handle, 2, first).await;
        let (patch, send) = expect(&mut handle, Method::PATCH, STATUS_PATCH).await;
        let c = condition(&patch["status"], "Isolated");
        assert_eq!(c["status"], "True", "{c}");
        assert!(
            c["message"]
                .as_str()
                .unwrap()
                .contains("at its ceiling (2 replicas)"),
            "{c}"
        );
        let mut answer = ias_json();
        answer["status"] = patch["status"].clone();
        respond(send, 200, &answer);
        patch["status"].clone()
    });
    reconcile(ias(spec.clone(), json!({})), slow_context(svc))
        .await
        .unwrap();
    let status = server.await.unwrap();

    // Round 2: the condition holds; llama-0 leaves its shared GPU: one replica over the ceiling until its copy is
    // ready.
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let mut obj = (*ias(spec, json!({}))).clone();
    obj.status = Some(serde_json::from_value(status).unwrap());
    let server = tokio::spawn(async move {
        answer_scale_and_pods(&mut handle, 2, pods).await;
        let (event, send) = expect_rescale(&mut handle, 3).await;
        respond(send, 201, &event);
        let (patch, send) = expect(&mut handle, Method::PATCH, STATUS_PATCH).await;
        let st = &patch["status"];
        assert_eq!(condition(st, "Isolated")["status"], "True");
        let c = condition(st, "Consolidating");
        assert_eq!(c["reason"], "Surge", "{c}");
        let message = c["message"].as_str().unwrap();
        assert!(
            message.contains("shared while the model is isolated") && message.contains("tessera-gpu-a100-0"),
            "{c}"
        );
        respond(send, 200, &ias_json());
    });
    reconcile(Arc::new(obj), slow_context(svc)).await.unwrap();
    server.await.unwrap();
}

/// `updateMode: Initial` with 30,000 MiB at a 0.5 share in force: the pod started on an older, smaller allocation
/// gets the drifted deletion cost (a scale-down removes it first), the pod that runs the allocation in force is
/// left alone, and so is a drifted pod whose cost a user set. The condition counts the pod it marked.
#[tokio::test]
async fn initial_marks_the_pods_that_run_another_allocation_to_go_first_on_a_scale_down() {
    use crate::controller::rollout::{DRIFTED_COST, POD_COMPUTE_ANNOTATION, POD_MEMORY_ANNOTATION};
    let with = |name: &str, ip: &str, memory: &str, share: &str, cost: Option<&str>| {
        let mut p = pod(name, ip, true);
        p["metadata"]["annotations"] =
            json!({ POD_MEMORY_ANNOTATION: memory, POD_COMPUTE_ANNOTATION: share });
        if let Some(c) = cost {
            p["metadata"]["annotations"][crate::pool::POD_DELETION_COST] = json!(c);
        }
        p
    };
    let spec = json!({"scaleTargetRef": {"kind": "Deployment", "name": "llama"}, "minReplicas": 1, "maxReplicas": 4,
                      "targets": {"kvCacheUtilization": 0.5}, "gpu": {"updateMode": "Initial"}});
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let ctx = context(
        Client::new(svc, "default"),
        &[
            ("http://10.0.0.1:9090", 0.5),
            ("http://10.0.0.2:9090", 0.5),
            ("http://10.0.0.3:9090", 0.5),
        ],
    );
    let mut obj = (*ias(spec, json!({}))).clone();
    obj.status = Some(
        serde_json::from_value(json!({"allocation": {
            "inForce": {"gpuMemoryMiB": 30000, "computeFraction": 0.5}, "reason": "stable"}}))
        .unwrap(),
    );
    let pods = vec![
        with("llama-old", "10.0.0.1", "18000", "0.30", None),
        with("llama-new", "10.0.0.2", "30000", "0.50", None),
        with("llama-pinned", "10.0.0.3", "18000", "0.30", Some("7")),
    ];
    let server = tokio::spawn(async move {
        answer_scale_and_pods(&mut handle, 3, pods).await;
        let (body, send) = expect(
            &mut handle,
            Method::PATCH,
            "/api/v1/namespaces/models/pods/llama-old?",
        )
        .await;
        assert_eq!(
            body,
            json!({"metadata": {"annotations": {"controller.kubernetes.io/pod-deletion-cost": DRIFTED_COST.to_string()}}})
        );
        respond(send, 200, &pod("llama-old", "10.0.0.1", true));
        let (patch, send) = expect(&mut handle, Method::PATCH, STATUS_PATCH).await;
        let c = condition(&patch["status"], "AllocationInSync");
        assert!(
            c["message"]
                .as_str()
                .unwrap()
                .contains("1 running pod(s) run another allocation and go first when the model scales down"),
            "{c}"
        );
        respond(send, 200, &ias_json());
    });
    reconcile(Arc::new(obj), ctx).await.unwrap();
    server.await.unwrap();
}
