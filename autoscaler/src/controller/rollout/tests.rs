#![allow(clippy::unwrap_used)]

use std::time::Duration;

use http::{Method, Request, Response};
use http_body_util::BodyExt;
use kube::Client;
use kube::api::ApiResource;
use kube::client::Body;
use serde_json::json;

use super::*;
use crate::crd::Sharing;
use crate::test_support::respond;

const DEPLOY: &str = "/apis/apps/v1/namespaces/team-a/deployments/llama";
const PDBS: &str = "/apis/policy/v1/namespaces/team-a/poddisruptionbudgets";
const MIN: u64 = 60_000;

fn gpu(mode: crate::crd::UpdateMode) -> GpuSpec {
    GpuSpec {
        sharing: Sharing::Fractional,
        update_mode: mode,
        ..GpuSpec::default()
    }
}

fn deployment(rv: &str, replicas: i64, updated: i64) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "llama", "namespace": "team-a", "resourceVersion": rv, "generation": 3},
        "spec": {"replicas": replicas, "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                 "template": {"metadata": {"labels": {"app": "llama"}}}},
        "status": {"observedGeneration": 3, "replicas": replicas, "updatedReplicas": updated, "readyReplicas": replicas}
    })
}

fn pod(memory: u64, compute: f64) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "llama-x", "annotations": {POD_MEMORY_ANNOTATION: memory.to_string(), POD_COMPUTE_ANNOTATION: compute.to_string()}}
    }))
    .unwrap()
}

/// A sidecar recommendation as the status carries it.
fn recommendation(
    memory_mib: i64,
    compute_fraction: f64,
    kv_cache_memory_bytes: i64,
) -> RecommendationStatus {
    RecommendationStatus {
        gpu_memory_mib: Some(memory_mib),
        compute_fraction: Some(compute_fraction),
        kv_cache_memory_bytes: Some(kv_cache_memory_bytes),
        reason: "r".into(),
        ..RecommendationStatus::default()
    }
}

fn allocation(memory: i64, drift_since_ms: u64) -> AllocationStatus {
    AllocationStatus {
        in_force: Some(AllocationValues {
            gpu_memory_mib: memory,
            compute_fraction: 0.3,
            kv_cache_memory_bytes: Some(8 << 30),
            gpu_memory_utilization: None,
        }),
        reason: "stable".into(),
        drift_since: ms_time(drift_since_ms),
        ..AllocationStatus::default()
    }
}

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

fn apis() -> (Api<DynamicObject>, Api<PodDisruptionBudget>, Handle) {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(svc, "team-a");
    let ar = ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk("apps", "v1", "Deployment"));
    (
        Api::namespaced_with(client.clone(), "team-a", &ar),
        Api::namespaced(client, "team-a"),
        handle,
    )
}

async fn run_roll(
    alloc: &AllocationStatus,
    pods: &[Pod],
    rolling: &Rolling,
    target_api: &Api<DynamicObject>,
    pdb_api: Api<PodDisruptionBudget>,
) -> RollOutcome {
    let g = gpu(crate::crd::UpdateMode::Recreate);
    // `alloc` is what the last round left: no recommendation this round keeps it in force, drifting since then.
    let (_, outcome) = fold_and_roll(
        RollRequest {
            target_api,
            pdb_api,
            kind: "Deployment",
            name: "llama",
            model_key: "team-a/llama",
            facts: AllocationFacts {
                pods,
                previous: Some(alloc),
                recommendation: None,
                gpu: &g,
                replicas: (2, 2, 2, 1),
                urgency: Default::default(),
                now_ms: 40 * MIN,
            },
        },
        rolling,
        &RolloutConfig::default(),
    )
    .await;
    outcome
}

/// The allocation status a reconcile with no pods folds from `previous` and `recommendation`.
fn next_allocation(
    previous: Option<&AllocationStatus>,
    recommendation: Option<&RecommendationStatus>,
    gpu: &GpuSpec,
    urgency: Urgency,
    now_ms: u64,
    cfg: &RolloutConfig,
) -> AllocationStatus {
    let facts = AllocationFacts {
        pods: &[],
        previous,
        recommendation,
        gpu,
        replicas: (0, 0, 0, 0),
        urgency,
        now_ms,
    };
    status_of(previous, &fold_round(&facts, None, cfg))
}

/// The fold over `pods` with `in_force` kept from the last round (and no recommendation: it stays in force).
fn fold_over(
    in_force: Option<&AllocationValues>,
    pods: &[Pod],
    urgency: Urgency,
    cfg: &RolloutConfig,
) -> Fold {
    let previous = AllocationStatus {
        in_force: in_force.cloned(),
        ..AllocationStatus::default()
    };
    let g = gpu(crate::crd::UpdateMode::Initial);
    let facts = AllocationFacts {
        pods,
        previous: Some(&previous),
        recommendation: None,
        gpu: &g,
        replicas: (0, 0, 0, 0),
        urgency,
        now_ms: 0,
    };
    fold_round(&facts, None, cfg)
}

/// How many pods the fold finds behind `in_force` while `urgency` hurries them.
fn urgently_behind(
    in_force: &AllocationValues,
    pods: &[Pod],
    urgency: Urgency,
    cfg: &RolloutConfig,
) -> usize {
    fold_over(Some(in_force), pods, urgency, cfg).behind
}

#[tokio::test]
async fn roll_recreate_patches_the_template_hash_with_the_resource_version() {
    let (target, pdb, mut handle) = apis();
    let alloc = allocation(20_000, 0);
    let pods = vec![pod(40_000, 0.3), pod(40_000, 0.3)];
    let rolling = Rolling::default();
    let server = tokio::spawn(async move {
        let (req, send) = handle.next_request().await.unwrap();
        assert_eq!((req.method(), req.uri().path()), (&Method::GET, DEPLOY));
        respond(send, 200, &deployment("41", 2, 2));
        let (req, send) = handle.next_request().await.unwrap();
        assert_eq!((req.method(), req.uri().path()), (&Method::GET, PDBS));
        respond(
            send,
            200,
            &json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudgetList", "metadata": {}, "items": []}),
        );
        let (req, send) = handle.next_request().await.unwrap();
        assert_eq!((req.method(), req.uri().path()), (&Method::PATCH, DEPLOY));
        assert_eq!(req.headers()["content-type"], "application/merge-patch+json");
        let body: Value =
            serde_json::from_slice(&req.into_body().collect().await.unwrap().to_bytes()).unwrap();
        assert_eq!(body["metadata"]["resourceVersion"], "41");
        let hash = body["spec"]["template"]["metadata"]["annotations"][TEMPLATE_HASH_ANNOTATION]
            .as_str()
            .unwrap()
            .to_owned();
        respond(send, 200, &deployment("42", 2, 0));
        hash
    });
    let outcome = run_roll(&alloc, &pods, &rolling, &target, pdb).await;
    let hash = server.await.unwrap();
    match outcome {
        RollOutcome::Rolled {
            reason,
            hash: h,
            message,
        } => {
            assert_eq!(reason, "shrink");
            assert_eq!(h, hash);
            assert!(message.contains("40000 → 20000 MiB"), "{message}");
        }
        other => panic!("expected a roll, got {other:?}"),
    }
    // One model at a time per pool: another fractional model is now held.
    assert!(rolling.busy_for("fractional", "team-b/other"));
}

#[tokio::test]
async fn roll_a_conflict_is_retried_on_a_fresh_read() {
    let (target, pdb, mut handle) = apis();
    let alloc = allocation(20_000, 0);
    let pods = vec![pod(40_000, 0.3), pod(40_000, 0.3)];
    let server = tokio::spawn(async move {
        for (rv, code) in [("41", 409), ("43", 200)] {
            let (_, send) = handle.next_request().await.unwrap();
            respond(send, 200, &deployment(rv, 2, 2));
            let (_, send) = handle.next_request().await.unwrap();
            respond(
                send,
                200,
                &json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudgetList", "metadata": {}, "items": []}),
            );
            let (req, send) = handle.next_request().await.unwrap();
            let body: Value =
                serde_json::from_slice(&req.into_body().collect().await.unwrap().to_bytes()).unwrap();
            assert_eq!(body["metadata"]["resourceVersion"], rv);
            let answer = if code == 409 {
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409, "message": "modified"})
            } else {
                deployment("44", 2, 0)
            };
            respond(send, code, &answer);
        }
    });
    let outcome = run_roll(&alloc, &pods, &Rolling::default(), &target, pdb).await;
    server.await.unwrap();
    assert!(matches!(outcome, RollOutcome::Rolled { .. }), "{outcome:?}");
}

#[tokio::test]
async fn roll_refused_while_the_deployment_is_mid_rollout() {
    let (target, pdb, mut handle) = apis();
    let alloc = allocation(20_000, 0);
    let pods = vec![pod(40_000, 0.3), pod(40_000, 0.3)];
    let server = tokio::spawn(async move {
        let (_, send) = handle.next_request().await.unwrap();
        respond(send, 200, &deployment("41", 2, 1));
        let (_, send) = handle.next_request().await.unwrap();
        respond(
            send,
            200,
            &json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudgetList", "metadata": {}, "items": []}),
        );
        // No PATCH may follow.
        assert!(
            tokio::time::timeout(Duration::from_millis(200), handle.next_request())
                .await
                .is_err()
        );
    });
    let outcome = run_roll(&alloc, &pods, &Rolling::default(), &target, pdb).await;
    server.await.unwrap();
    assert_eq!(outcome, RollOutcome::Held(HoldReason::RolloutInProgress));
}

#[tokio::test]
async fn roll_refused_by_a_pod_disruption_budget() {
    let (target, pdb, mut handle) = apis();
    let alloc = allocation(20_000, 0);
    let pods = vec![pod(40_000, 0.3), pod(40_000, 0.3)];
    let server = tokio::spawn(async move {
        let (_, send) = handle.next_request().await.unwrap();
        respond(send, 200, &deployment("41", 2, 2));
        let (_, send) = handle.next_request().await.unwrap();
        respond(
            send,
            200,
            &json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudgetList", "metadata": {}, "items": [
            {"metadata": {"name": "llama"}, "spec": {"selector": {"matchLabels": {"app": "llama"}}, "minAvailable": 2},
             "status": {"disruptionsAllowed": 0, "currentHealthy": 2, "desiredHealthy": 2, "expectedPods": 2}}]}),
        );
    });
    let outcome = run_roll(&alloc, &pods, &Rolling::default(), &target, pdb).await;
    server.await.unwrap();
    assert_eq!(outcome, RollOutcome::Held(HoldReason::DisruptionBudget));
}

#[test]
fn roll_workload_facts_resolve_strategy_defaults() {
    let mut d = deployment("1", 8, 8);
    d["spec"]["strategy"] = json!({"type": "RollingUpdate"});
    let obj: DynamicObject = serde_json::from_value(d).unwrap();
    let f = workload_facts(&obj, "Deployment");
    assert_eq!((f.rollout_in_progress, f.max_unavailable), (false, 2));
    let mut s = deployment("1", 3, 3);
    s["status"]["currentRevision"] = json!("a");
    s["status"]["updateRevision"] = json!("b");
    let obj: DynamicObject = serde_json::from_value(s).unwrap();
    let f = workload_facts(&obj, "StatefulSet");
    assert_eq!((f.rollout_in_progress, f.max_unavailable), (true, 1));
}

#[test]
fn roll_in_force_is_kept_in_status_across_reconciles() {
    let cfg = RolloutConfig::default();
    let g = gpu(crate::crd::UpdateMode::Initial);
    let rec = recommendation(30_000, 0.4, 12 << 30);
    let first = next_allocation(None, Some(&rec), &g, Urgency::default(), 0, &cfg);
    assert_eq!(
        (first.in_force, first.reason.as_str()),
        (None, "no_recommendation")
    );
    // A restart re-reads status: the candidate's clock survives it, and missing data changes nothing.
    let gap = next_allocation(Some(&first), None, &g, Urgency::default(), 10 * MIN, &cfg);
    assert_eq!(gap.candidate_since, first.candidate_since);
    let later = next_allocation(Some(&gap), Some(&rec), &g, Urgency::default(), 30 * MIN, &cfg);
    assert_eq!(later.reason, "stable");
    assert_eq!(later.in_force.unwrap().kv_cache_memory_bytes, Some(12 << 30));
    // A fixed memory in the policy wins.
    let mut fixed = g.clone();
    fixed.memory = Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(
        10_240,
    ));
    let f = next_allocation(
        Some(&later),
        Some(&rec),
        &fixed,
        Urgency::default(),
        31 * MIN,
        &cfg,
    );
    assert_eq!(f.in_force.unwrap().gpu_memory_mib, 10_240);
}

#[test]
fn roll_a_share_growth_over_the_ttft_objective_comes_into_force_at_once_in_status() {
    let cfg = RolloutConfig::default();
    let g = gpu(crate::crd::UpdateMode::Recreate);
    let rec = |share: f64| recommendation(30_000, share, 12 << 30);
    let first = next_allocation(None, Some(&rec(0.5)), &g, Urgency::default(), 0, &cfg);
    let settled = next_allocation(
        Some(&first),
        Some(&rec(0.5)),
        &g,
        Urgency::default(),
        30 * MIN,
        &cfg,
    );
    assert_eq!(settled.in_force.unwrap().compute_fraction, 0.5);
    // The share rule asks for 0.8: without urgency it settles for the window...
    let calm = next_allocation(
        Some(&settled),
        Some(&rec(0.8)),
        &g,
        Urgency::default(),
        31 * MIN,
        &cfg,
    );
    assert_eq!(
        (calm.reason.as_str(), calm.in_force.unwrap().compute_fraction),
        ("settling", 0.5)
    );
    // ... while a replica is over the TTFT objective it is in force at once, and stays so.
    let slow = Urgency {
        preempting: false,
        ttft_over_slo: true,
    };
    let urgent = next_allocation(Some(&calm), Some(&rec(0.8)), &g, slow, 32 * MIN, &cfg);
    assert_eq!(
        (urgent.reason.as_str(), urgent.in_force.unwrap().compute_fraction),
        ("urgent_growth", 0.8)
    );
    let after = next_allocation(
        Some(&urgent),
        Some(&rec(0.8)),
        &g,
        Urgency::default(),
        33 * MIN,
        &cfg,
    );
    assert_eq!(after.in_force.unwrap().compute_fraction, 0.8);
}

/// The status keeps a shrink's clock across reconciles while the recommendation steps down (each update is
/// step-bounded), and the largest of the window comes into force with its vLLM figures.
#[test]
fn roll_a_shrink_stepping_down_comes_into_force_at_the_largest_of_its_window_in_status() {
    let cfg = RolloutConfig::default();
    let g = gpu(crate::crd::UpdateMode::Initial);
    let rec = |mib: i64| recommendation(mib, 1.0, mib << 19);
    let first = next_allocation(None, Some(&rec(40_000)), &g, Urgency::default(), 0, &cfg);
    let mut status = next_allocation(
        Some(&first),
        Some(&rec(40_000)),
        &g,
        Urgency::default(),
        30 * MIN,
        &cfg,
    );
    assert_eq!(status.in_force.as_ref().map(|f| f.gpu_memory_mib), Some(40_000));
    // 7% down every four minutes from minute 32: every step leaves the 5% tolerance.
    let mut mib = 37_200;
    for step in 0..8 {
        let now = 32 * MIN + step * 4 * MIN;
        status = next_allocation(Some(&status), Some(&rec(mib)), &g, Urgency::default(), now, &cfg);
        mib = mib * 93 / 100;
    }
    assert_eq!(status.reason, "settling");
    assert_eq!(status.candidate.as_ref().map(|c| c.gpu_memory_mib), Some(37_200));
    let at_window = next_allocation(
        Some(&status),
        Some(&rec(mib)),
        &g,
        Urgency::default(),
        62 * MIN,
        &cfg,
    );
    let f = at_window.in_force.unwrap_or_else(|| panic!("in force"));
    assert_eq!(at_window.reason, "stable");
    assert_eq!(
        (f.gpu_memory_mib, f.kv_cache_memory_bytes),
        (37_200, Some(37_200 << 19))
    );
}

#[test]
fn roll_initial_names_the_pods_an_urgent_growth_leaves_behind() {
    let cfg = RolloutConfig::default();
    let in_force = AllocationValues {
        gpu_memory_mib: 30_000,
        compute_fraction: 0.8,
        kv_cache_memory_bytes: None,
        gpu_memory_utilization: None,
    };
    // One pod on a 0.5 share, one already at 0.8, one admitted before Tessera (no annotations: never judged).
    let mut unknown = pod(30_000, 0.8);
    unknown.metadata.annotations = None;
    let pods = vec![pod(30_000, 0.5), pod(30_000, 0.8), unknown];
    let slow = Urgency {
        preempting: false,
        ttft_over_slo: true,
    };
    assert_eq!(urgently_behind(&in_force, &pods, slow, &cfg), 1);
    assert_eq!(urgently_behind(&in_force, &pods, Urgency::default(), &cfg), 0);
    // Preemptions hurry memory only: the share gap is not theirs.
    let preempting = Urgency {
        preempting: true,
        ttft_over_slo: false,
    };
    assert_eq!(urgently_behind(&in_force, &pods, preempting, &cfg), 0);
}

/// The deletion-cost marks follow the allocation in force: a drifted pod is marked, the mark comes off once it
/// runs the allocation in force again (or nothing is in force), and a cost someone else set — a user's, or
/// consolidation's for a pod leaving a draining GPU — is never touched, nor a pod being deleted or one whose
/// allocation is unknown.
#[test]
fn deletion_cost_marks_follow_the_allocation_in_force() {
    use super::DRIFTED_COST;
    let cfg = RolloutConfig::default();
    // The marks follow the fold's judgement of each pod.
    let deletion_cost_changes = |in_force: Option<&AllocationValues>, pods: &[Pod], cfg: &RolloutConfig| {
        super::deletion_cost_changes(pods, &fold_over(in_force, pods, Urgency::default(), cfg).drifted)
    };
    let marked_count = |in_force: Option<&AllocationValues>, pods: &[Pod], cfg: &RolloutConfig| {
        super::marked_count(pods, &fold_over(in_force, pods, Urgency::default(), cfg).drifted)
    };
    let named = |name: &str, mut p: Pod, cost: Option<String>| {
        p.metadata.name = Some(name.into());
        if let Some(c) = cost {
            p.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(crate::pool::POD_DELETION_COST.into(), c);
        }
        p
    };
    let in_force = AllocationValues {
        gpu_memory_mib: 30_000,
        compute_fraction: 0.5,
        kv_cache_memory_bytes: None,
        gpu_memory_utilization: None,
    };
    let ours = Some(DRIFTED_COST.to_string());
    let mut deleting = named("deleting", pod(18_000, 0.3), None);
    deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    let pods = vec![
        named("smaller", pod(18_000, 0.5), None),
        named("larger", pod(40_000, 0.5), None),
        named("in-sync", pod(31_000, 0.52), None),
        named("back-in-sync", pod(30_000, 0.5), ours.clone()),
        named("still-drifted", pod(18_000, 0.5), ours.clone()),
        named("user", pod(18_000, 0.5), Some("100".into())),
        named("leaving", pod(18_000, 0.5), Some(i32::MIN.to_string())),
        named("unknown", Pod::default(), None),
        deleting,
    ];
    assert_eq!(
        deletion_cost_changes(Some(&in_force), &pods, &cfg),
        vec![
            ("smaller".to_owned(), Some(DRIFTED_COST)),
            ("larger".to_owned(), Some(DRIFTED_COST)),
            ("back-in-sync".to_owned(), None),
        ]
    );
    // smaller, larger and still-drifted carry the mark; user and leaving are drifted but ranked by someone else.
    assert_eq!(marked_count(Some(&in_force), &pods, &cfg), 3);
    // Nothing in force: only our own marks come off.
    assert_eq!(
        deletion_cost_changes(None, &pods, &cfg),
        vec![
            ("back-in-sync".to_owned(), None),
            ("still-drifted".to_owned(), None)
        ]
    );
    assert_eq!(marked_count(None, &pods, &cfg), 0);
}
