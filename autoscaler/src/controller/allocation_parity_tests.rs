//! The controller and the simulator fold the allocation alike from the same observations.
//!
//! The simulator runs the default scenario with Tessera and records every allocation round it took
//! (`World::recording_allocations`): what it gathered (the last round's candidate, allocation in force and drift
//! clock, the recommendation, the urgency, the live replicas' allocations, the workload's state, the allocation its
//! last roll put into the template) and what `core::rollout::fold` decided. Each record is then rebuilt as the
//! cluster the controller would read — the InferenceAutoscaler's `status.allocation`, a pod per replica annotated
//! with its allocation, the Deployment (its rollout state and template hash) and its budgets, the roll lock of the
//! pool — and replayed through the controller's allocation step (`allocation_and_roll`) against an API server. The
//! controller must keep the same candidate, allocation in force and drift clock, count the same drifted pods and the
//! same pods an urgency leaves behind, and roll (or hold, for the same reason) as the simulator did.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request, Response};
use http_body_util::BodyExt;
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use tessera_core::rollout::{Allocation, HoldReason, RollDecision, UpdateMode};
use tessera_sim::simulate::observe::{AllocationRecord, NAMESPACE};
use tessera_sim::simulate::scenario::{self, Source};
use tessera_sim::simulate::world::{Plan, StrategyKind, World};

use super::*;
use crate::controller::allocation::{AllocationRound, allocation_and_roll};
use crate::controller::rollout::{POD_COMPUTE_ANNOTATION, POD_MEMORY_ANNOTATION, allocation_hash};
use crate::controller::signals::{ActivatorPoller, FetchError, SignalSource};
use crate::crd::{AllocationStatus, AllocationValues, RecommendationStatus};

/// The allocation step reads no sidecar nor activator: every read fails.
struct NoSignals;

impl SignalSource for NoSignals {
    fn sidecar_status(
        &self,
        base: &str,
    ) -> futures::future::BoxFuture<'_, Result<tessera_core::wire::sidecar::SidecarStatus, FetchError>> {
        let e = FetchError::Connect {
            url: base.to_owned(),
            message: "not in this test".into(),
        };
        Box::pin(async move { Err(e) })
    }
    fn activator_stats(
        &self,
        base: &str,
    ) -> futures::future::BoxFuture<'_, Result<tessera_core::wire::activator::ActivatorStats, FetchError>>
    {
        let e = FetchError::Connect {
            url: base.to_owned(),
            message: "not in this test".into(),
        };
        Box::pin(async move { Err(e) })
    }
}

fn values(a: &Allocation) -> AllocationValues {
    AllocationValues {
        gpu_memory_mib: i64::try_from(a.memory_mib).unwrap(),
        compute_fraction: a.compute_fraction,
        kv_cache_memory_bytes: a.kv_cache_memory_bytes.map(|b| i64::try_from(b).unwrap()),
        gpu_memory_utilization: a.gpu_memory_utilization,
    }
}

fn time(ms: u64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_millisecond(i64::try_from(ms).unwrap()).unwrap())
}

/// The status an earlier reconcile left for what the simulator kept.
fn previous_status(rec: &AllocationRecord) -> AllocationStatus {
    AllocationStatus {
        in_force: rec.kept.in_force.as_ref().map(values),
        reason: "stable".into(),
        candidate: rec.kept.candidate.as_ref().map(|c| values(&c.alloc)),
        candidate_since: rec.kept.candidate.map(|c| time(c.since_ms)),
        drift_since: rec.kept.drift_since_ms.map(time),
        template_hash: rec.rolled_to.as_ref().map(|a| allocation_hash(&values(a))),
        ..AllocationStatus::default()
    }
}

/// The InferenceAutoscaler a user would write for the simulated model, with that status.
fn object(rec: &AllocationRecord) -> InferenceAutoscaler {
    let mode = match rec.mode {
        UpdateMode::Off => "Off",
        UpdateMode::Initial => "Initial",
        UpdateMode::Recreate => "Recreate",
    };
    let share = rec
        .fixed
        .compute_fraction
        .map_or_else(|| "auto".to_owned(), |f| f.to_string());
    let mut gpu = json!({"sharing": "fractional", "computeFraction": share, "updateMode": mode});
    if let Some(m) = rec.fixed.memory_mib {
        gpu["memory"] = json!(m);
    }
    let mut obj: InferenceAutoscaler = serde_json::from_value(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "InferenceAutoscaler",
        "metadata": {"name": rec.model, "namespace": NAMESPACE, "resourceVersion": "7", "generation": 1},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": rec.model},
                 "minReplicas": rec.workload.min_replicas, "maxReplicas": 100,
                 "modelNames": [rec.model], "gpu": gpu},
    }))
    .unwrap();
    obj.status = Some(crate::crd::InferenceAutoscalerStatus {
        allocation: Some(previous_status(rec)),
        ..Default::default()
    });
    obj
}

/// A pod per live replica, annotated with its allocation as the webhook wrote it (none: admitted before Tessera).
fn pods(rec: &AllocationRecord) -> Vec<Pod> {
    rec.pods
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let annotations = a.map_or(json!({}), |a| {
                json!({POD_MEMORY_ANNOTATION: a.memory_mib.to_string(),
                       POD_COMPUTE_ANNOTATION: a.compute_fraction.to_string()})
            });
            serde_json::from_value(json!({"metadata": {"name": format!("{}-{i}", rec.model),
                "namespace": NAMESPACE, "annotations": annotations}}))
            .unwrap()
        })
        .collect()
}

/// The Deployment as the workload's controller leaves it: surge-only (the simulator's roll surges one pod before
/// each old one goes), mid-rollout while the simulator's roll replaces pods, its template carrying the hash of
/// the allocation last rolled to.
fn deployment(rec: &AllocationRecord) -> Value {
    let observed = if rec.workload.rollout_in_progress { 1 } else { 2 };
    let mut d = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": rec.model, "namespace": NAMESPACE, "resourceVersion": "41", "generation": 2},
        "spec": {"replicas": rec.workload.replicas,
                 "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
                 "template": {"metadata": {"labels": {"app": rec.model}}}},
        "status": {"observedGeneration": observed, "replicas": rec.workload.replicas,
                   "updatedReplicas": rec.workload.replicas},
    });
    if let Some(a) = &rec.rolled_to {
        d["spec"]["template"]["metadata"]["annotations"] =
            json!({crate::controller::rollout::TEMPLATE_HASH_ANNOTATION: allocation_hash(&values(a))});
    }
    d
}

/// What the API server saw during one replay.
#[derive(Default)]
struct Seen {
    rolled: bool,
    unexpected: Vec<String>,
}

/// Answers the Deployment, its budgets (none), the roll's patch, the pods' deletion-cost marks and Events.
async fn api_server(
    mut handle: tower_test::mock::Handle<Request<Body>, Response<Body>>,
    deployment: Value,
    seen: Arc<Mutex<Seen>>,
) {
    while let Some((req, send)) = handle.next_request().await {
        let path = req.uri().path().to_owned();
        let method = req.method().clone();
        let bytes = req.into_body().collect().await.unwrap().to_bytes();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let (status, answer) = if path.contains("/deployments/") && method == Method::GET {
            (200, deployment.clone())
        } else if path.contains("/deployments/") && method == Method::PATCH {
            seen.lock().unwrap().rolled = true;
            (200, deployment.clone())
        } else if path.ends_with("/poddisruptionbudgets") && method == Method::GET {
            let list = json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudgetList", "metadata": {},
                              "items": []});
            (200, list)
        } else if path.contains("/pods/") && method == Method::PATCH {
            let pod = path.rsplit('/').next().unwrap().to_owned();
            (200, json!({"metadata": {"name": pod, "namespace": NAMESPACE}}))
        } else if path.ends_with("/events") && method == Method::POST {
            (201, body)
        } else {
            seen.lock().unwrap().unexpected.push(format!("{method} {path}"));
            (404, json!({"kind": "Status", "code": 404}))
        };
        crate::test_support::respond(send, status, &answer);
    }
}

/// Replays one record through the controller's allocation step: the status it folds, the `AllocationInSync`
/// condition, and what the API server saw.
async fn replay(
    rec: &AllocationRecord,
    cfg: tessera_core::rollout::RolloutConfig,
) -> (AllocationStatus, Option<(bool, String, String)>, Seen) {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(svc, NAMESPACE);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let server = tokio::spawn(api_server(handle, deployment(rec), Arc::clone(&seen)));
    let now = std::time::UNIX_EPOCH + Duration::from_millis(rec.now_ms);
    let signals = Arc::new(NoSignals);
    let mut ctx = super::tests::test_context(
        client.clone(),
        signals,
        ActivatorPoller::new(&[]),
        now,
        Default::default(),
    );
    Arc::get_mut(&mut ctx).unwrap().settings.rollout = cfg;
    if rec.workload.pool_busy {
        ctx.rolling.set("fractional", "elsewhere/another-model", true);
    }
    let obj = object(rec);
    let all_pods = pods(rec);
    let gpu = obj.spec.gpu.clone().unwrap();
    let recommendation = rec.recommended.map(|a| RecommendationStatus {
        gpu_memory_mib: Some(i64::try_from(a.memory_mib).unwrap()),
        compute_fraction: Some(a.compute_fraction),
        kv_cache_memory_bytes: a.kv_cache_memory_bytes.map(|b| i64::try_from(b).unwrap()),
        gpu_memory_utilization: a.gpu_memory_utilization,
        reason: "recorded".into(),
    });
    let ar = target_resource("apps/v1", "Deployment").unwrap();
    let target_api: Api<DynamicObject> = Api::namespaced_with(client, NAMESPACE, &ar);
    let target = format!("Deployment/{}", rec.model);
    let w = rec.workload;
    let now_k8s = time(rec.now_ms);
    let round = AllocationRound {
        target_api: &target_api,
        target: &target,
        all_pods: &all_pods,
        gpu: &gpu,
        recommendation: recommendation.as_ref(),
        urgency: rec.urgency,
        replicas: (w.replicas, w.ready_replicas, w.desired_replicas, w.min_replicas),
        now_ms: rec.now_ms,
        now_k8s: &now_k8s,
    };
    let (status, condition) = allocation_and_roll(&ctx, &obj, round).await;
    drop(ctx);
    drop(target_api);
    server.abort();
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    (status, condition, seen)
}

/// Checks the controller folded `rec` as the simulator did.
async fn assert_folds_alike(rec: &AllocationRecord, cfg: tessera_core::rollout::RolloutConfig) {
    let (status, condition, seen) = replay(rec, cfg).await;
    let at = format!("{} at {} ms", rec.model, rec.now_ms);
    assert!(
        seen.unexpected.is_empty(),
        "{at}: unexpected requests {:?}",
        seen.unexpected
    );
    let fold = &rec.fold;
    assert_eq!(
        status.in_force,
        fold.kept.in_force.as_ref().map(values),
        "{at}: in force"
    );
    assert_eq!(status.reason, fold.reason.label(), "{at}: why in force");
    assert_eq!(
        status.candidate,
        fold.kept.candidate.as_ref().map(|c| values(&c.alloc)),
        "{at}: candidate"
    );
    assert_eq!(
        status.candidate_since,
        fold.kept.candidate.map(|c| time(c.since_ms)),
        "{at}: candidate since"
    );
    assert_eq!(
        status.drift_since,
        fold.kept.drift_since_ms.map(time),
        "{at}: drift since"
    );
    let (_, _, message) = condition.unwrap_or_else(|| panic!("{at}: no AllocationInSync condition"));
    match rec.mode {
        UpdateMode::Recreate => {
            let expected = match fold.roll {
                RollDecision::Roll(r) => format!("roll_{}", r.label()),
                RollDecision::Hold(HoldReason::InSync) => "hold_in_sync".to_owned(),
                RollDecision::Hold(h) => format!("hold_{}", h.label()),
            };
            assert_eq!(
                status.roll_reason.as_deref(),
                Some(expected.as_str()),
                "{at}: {message}"
            );
            assert_eq!(
                seen.rolled,
                matches!(fold.roll, RollDecision::Roll(_)),
                "{at}: rolled"
            );
        }
        _ => {
            assert!(!seen.rolled, "{at}: rolled under {:?}", rec.mode);
            // Who drifted (they go first on a scale-down) and who an urgency leaves behind, as the status names them.
            let drifted = fold.drifted.iter().filter(|d| **d).count();
            let named = |what: &str, n: usize| message.contains(&format!("; {n} running pod(s) {what}"));
            assert_eq!(
                named("run another allocation", drifted),
                drifted > 0 && status.in_force.is_some(),
                "{at}: drifted {drifted}: {message}"
            );
            assert_eq!(
                named("hold less", fold.behind),
                fold.behind > 0 && status.in_force.is_some(),
                "{at}: behind {}: {message}",
                fold.behind
            );
        }
    }
}

/// The simulator's allocation rounds over the default scenario's hour under `mode`, with a stability window short
/// enough for recommendations to come into force and drifts to roll within it. Started as `tessera simulate`
/// starts Tessera, from the allocation the HPA baseline's observations recommend, so the replicas run a known
/// allocation that the recommendations then move away from.
fn simulated_rounds(
    mode: scenario::UpdateMode,
) -> (Vec<AllocationRecord>, tessera_core::rollout::RolloutConfig) {
    let mut sc = scenario::load(&Source::Default, None, None)
        .unwrap()
        .without_sleep_mode();
    sc.settings.update_mode = mode;
    sc.settings.rollout_stability_window = Duration::from_secs(10 * 60);
    let histories = World::new(
        &sc,
        Plan::starting_from(StrategyKind::Hpa, vec![None; sc.models.len()]),
    )
    .unwrap()
    .run(&mut |_| {})
    .unwrap()
    .histories;
    let initial = tessera_sim::simulate::world::calibrate(&sc, &histories);
    let sink = Arc::new(Mutex::new(Vec::new()));
    World::new(&sc, Plan::starting_from(StrategyKind::Tessera, initial))
        .unwrap()
        .recording_allocations(Arc::clone(&sink))
        .run(&mut |_| {})
        .unwrap();
    let records = std::mem::take(&mut *sink.lock().unwrap());
    (records, sc.settings.rollout())
}

#[tokio::test]
async fn the_controller_folds_the_allocation_as_the_simulator_did() {
    let mut reasons: HashSet<String> = HashSet::new();
    let mut rolls = 0;
    let mut behind = 0;
    for mode in [scenario::UpdateMode::Initial, scenario::UpdateMode::Recreate] {
        let (records, cfg) = simulated_rounds(mode);
        assert!(!records.is_empty(), "the simulator recorded no allocation round");
        for rec in &records {
            assert_folds_alike(rec, cfg).await;
            reasons.insert(rec.fold.reason.label().to_owned());
            match rec.fold.roll {
                RollDecision::Roll(r) => {
                    rolls += 1;
                    reasons.insert(format!("roll_{}", r.label()));
                }
                RollDecision::Hold(h) => {
                    reasons.insert(format!("hold_{}", h.label()));
                }
            }
            behind += usize::from(rec.fold.behind > 0);
        }
        eprintln!("replayed {} allocation rounds under {mode:?}", records.len());
    }
    eprintln!("covered {reasons:?}, {rolls} rolls, {behind} rounds with pods behind");
    // What the hour holds (seen when this test was written: 2 rolls, 40 rounds with pods behind an urgency).
    for needed in [
        "settling",
        "stable",
        "urgent_growth",
        "hold_settling",
        "hold_in_sync",
        "hold_pool_busy",
        "hold_rollout_in_progress",
    ] {
        assert!(
            reasons.contains(needed),
            "the replay must cover {needed}; it covers {reasons:?}"
        );
    }
    assert!(rolls > 0, "the replay must cover a roll; it covers {reasons:?}");
    assert!(behind > 0, "the replay must cover pods an urgency leaves behind");
}
