//! The cold-start rules through `reconcile` (`controller/coldstart.rs`): the cold start remembered at zero, the
//! ledger resumed from `status.coldStartLedger`, and a budget group's members read within their namespace, from
//! their rounds or, before those, from their status. Same mock API server and helpers as the other reconcile tests.

use super::*;

/// A model at zero has no pod to measure its cold start from: the controller remembers the last it measured. One
/// whose start (28 s) is over its objective (2 s) and that has no budget to spend goes back to its warm replica
/// without waiting for a request, as the simulator's model always did; without a remembered start, the policy
/// stays as declared and the model stays at zero.
#[tokio::test]
async fn a_model_at_zero_remembers_its_cold_start_and_returns_to_its_warm_floor() {
    let ms = NOW_S * 1000;
    let spec = json!({"scaleTargetRef": {"kind": "Deployment", "name": "llama"}, "minReplicas": 0, "maxReplicas": 4,
                      "ttftSlo": "2s", "scaleToZero": {"idleAfter": "5m"}, "modelNames": ["llama"]});
    for remembered in [Some(Duration::from_secs(28)), None] {
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let idle = activator_doc(ms, "models/llama", 5, 0, 0, Some(ms - 3_600_000));
        let ctx = context_with_activator(Client::new(svc, "default"), &[], vec![idle]);
        ctx.states.lock().unwrap().insert(
            "models/llama".into(),
            ScaleState {
                last_cold_start: remembered,
                ..ScaleState::default()
            },
        );
        poll(&ctx).await;
        let server = tokio::spawn(async move {
            let (_, send) = expect(&mut handle, Method::GET, SCALE).await;
            respond(send, 200, &scale_json(0));
            if remembered.is_some() {
                let (event, send) = expect_rescale(&mut handle, 1).await;
                respond(send, 201, &event);
            }
            let (patch, send) = expect(&mut handle, Method::PATCH, STATUS_PATCH).await;
            respond(send, 200, &ias_json());
            patch
        });
        reconcile(ias(spec.clone(), json!({})), ctx.clone())
            .await
            .unwrap();
        let patch = server.await.unwrap();
        let message = condition(&patch["status"], "ScalingActive")["message"].to_string();
        match remembered {
            Some(_) => {
                assert_eq!(patch["status"]["desiredReplicas"], 1, "{patch}");
                assert!(
                    message.contains(
                        "keeps one warm replica: a cold start takes 28 s, over the 2 s TTFT objective"
                    ),
                    "{message}"
                );
            }
            None => assert_eq!(patch["status"]["desiredReplicas"], 0, "{patch}"),
        }
        assert_eq!(
            ctx.states.lock().unwrap()["models/llama"].last_cold_start,
            remembered
        );
    }
}

/// A budget group is a namespace's: a model reads the claims of its own namespace's models only (another tenant
/// naming the same group neither widens nor spends its allowance), and never its own stale one.
#[test]
fn a_budget_group_reads_only_its_own_namespace() {
    let claim = |member: &str| ScaleState {
        claim: Some(tessera_core::scale::coldstart::BudgetClaim {
            member: member.to_owned(),
            group: "tools".to_owned(),
            budget: 0.01,
            at: Timestamp::from_millis(0),
            evidence: None,
            over_objective: true,
        }),
        ..ScaleState::default()
    };
    let states = HashMap::from([
        ("team-a/digest".to_owned(), claim("digest")),
        ("team-a/eval".to_owned(), claim("eval")),
        ("team-a/chat".to_owned(), ScaleState::default()),
        ("team-ab/eval".to_owned(), claim("eval")),
        ("team-b/summarizer".to_owned(), claim("summarizer")),
    ]);
    // The watched objects: members this process has not decided for are read from their status copies, except
    // in another namespace; a member it decided for is read from its own round, and a copy that cannot be read
    // claims nothing.
    let (copy, ..) = two_hours_with_one_wake();
    let mut broken = copy.clone();
    broken.samples[3].push(1);
    broken.samples[3].push(1);
    let objects: Vec<_> = [
        ("team-a", "digest", &copy),
        ("team-a", "eval", &copy),
        ("team-a", "nightly", &copy),
        ("team-a", "broken", &broken),
        ("team-b", "report", &copy),
    ]
    .into_iter()
    .map(|(ns, name, copy)| group_member(ns, name, 0.01, copy))
    .collect();
    let now = Timestamp::from_millis(NOW_S * 1000);
    let read = namespace_claims(&states, &objects, "team-a", "team-a/digest", now);
    let members: Vec<(&str, Option<u64>)> = read
        .iter()
        .map(|c| (c.member.as_str(), c.evidence.map(|e| e.requests)))
        .collect();
    assert_eq!(members, [("eval", None), ("nightly", Some(362))]);
    assert!(read[1].over_objective && read[1].at == now);
}

/// An InferenceAutoscaler in budget group `tools` with a `budget`, its status holding the ledger `copy`.
fn group_member(
    ns: &str,
    name: &str,
    budget: f64,
    copy: &crd::ColdStartLedgerStatus,
) -> Arc<InferenceAutoscaler> {
    let mut obj: InferenceAutoscaler = serde_json::from_value(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "InferenceAutoscaler",
        "metadata": {"name": name, "namespace": ns, "uid": format!("u-{name}"), "resourceVersion": "5",
                     "generation": 2},
        "spec": {"scaleTargetRef": {"kind": "Deployment", "name": name}, "minReplicas": 0, "maxReplicas": 4,
                 "ttftSlo": "2s", "modelNames": [name],
                 "scaleToZero": {"idleAfter": "5m", "coldStartMissBudget": budget,
                                 "coldStartBudgetGroup": "tools"}},
    }))
    .unwrap();
    obj.status = Some(InferenceAutoscalerStatus {
        cold_start_ledger: Some(copy.clone()),
        ..InferenceAutoscalerStatus::default()
    });
    Arc::new(obj)
}

/// The copy a previous leader kept of a model's last two hours, counted every 15 s until a minute before
/// [`NOW_S`]: 2 requests a sync for half an hour, idle for half an hour, a burst of a quarter of an hour (the
/// would-be cold start: 28 s against a 2 s objective, missing 4 of the 362 requests), idle since. With the total
/// and the last request the activators report now.
fn two_hours_with_one_wake() -> (crd::ColdStartLedgerStatus, u64, u64) {
    use tessera_core::scale::Demand;
    let ms = NOW_S * 1000;
    let start = ms - 7_200_000;
    let mut before = ScaleState {
        last_cold_start: Some(Duration::from_secs(28)),
        ..ScaleState::default()
    };
    let (mut total, mut last) = (0, start);
    for t in (0..=7140).step_by(15) {
        if t > 0 && (t <= 1800 || (3600..=4500).contains(&t)) {
            total += 2;
            last = start + t * 1000;
        }
        let demand = Demand {
            requests_total: Some(total),
            last_request_at: Some(Timestamp::from_millis(last)),
            ..Demand::default()
        };
        before.cold_starts.observe(
            &demand,
            Duration::from_secs(300),
            Timestamp::from_millis(start + t * 1000),
        );
    }
    assert_eq!(total, 362);
    let copy =
        crd::ColdStartLedgerStatus::from_checkpoint(&before.checkpoint(Timestamp::from_millis(ms)).unwrap());
    (copy, total, last)
}

/// A context whose one replica is idle and whose activator has counted `total` requests, the last at `last` (ms):
/// two polls a second apart, so the request rate is known (zero), and a third document for the poll made right
/// before going to zero.
async fn idle_since(client: Client, total: u64, last: u64) -> Arc<Context> {
    let ms = NOW_S * 1000;
    let idle = |at| activator_doc(at, "models/llama", total, 0, 0, Some(last));
    let ctx = context_with_activator(
        client,
        &[("http://10.0.0.1:9090", 0.0)],
        vec![idle(ms - 1000), idle(ms), idle(ms + 100)],
    );
    poll(&ctx).await;
    poll(&ctx).await;
    ctx
}

/// Its one pod, started in 28 s.
fn pod_started_in_28s() -> Value {
    json!({"metadata": {"name": "a", "namespace": "models", "creationTimestamp": "2027-01-15T07:00:00Z"},
           "spec": crate::controller::injection::injected_spec(),
           "status": {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True",
                      "lastTransitionTime": "2027-01-15T07:00:28Z"}]}})
}

/// A restarted controller (or a new leader) resumes a model's cold-start ledger from `status.coldStartLedger`. The
/// model's last two hours, as the previous leader counted them, show one would-be cold start missing 4 of 362
/// requests (1.1%, within its 2% budget): it goes to zero at once, as it would have before the restart. Without
/// the copy, or with one that cannot be read, the ledger starts empty and the model keeps its warm replica (its
/// 28 s start is over the 2 s objective) until an hour is counted again; the copy written then is a fresh one.
#[tokio::test]
async fn a_restarted_controller_resumes_the_cold_start_ledger_from_status() {
    let ms = NOW_S * 1000;
    let (copy, total, last) = two_hours_with_one_wake();
    let mut broken = copy.clone();
    broken.samples[3].push(1);
    broken.samples[3].push(1);
    let spec = json!({"scaleTargetRef": {"kind": "Deployment", "name": "llama"}, "minReplicas": 0, "maxReplicas": 4,
                      "ttftSlo": "2s", "modelNames": ["llama"],
                      "scaleToZero": {"idleAfter": "5m", "coldStartMissBudget": 0.02}});
    let started = pod_started_in_28s();
    for written in [Some(copy.clone()), None, Some(broken)] {
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let ctx = idle_since(Client::new(svc, "default"), total, last).await;
        let mut obj = (*ias(spec.clone(), json!({}))).clone();
        obj.status = Some(InferenceAutoscalerStatus {
            cold_start_ledger: written.clone(),
            ..InferenceAutoscalerStatus::default()
        });
        let resumes = written.as_ref() == Some(&copy);
        let pods = vec![started.clone()];
        let server = tokio::spawn(async move {
            answer_scale_and_pods(&mut handle, 1, pods).await;
            if resumes {
                let (event, send) = expect_rescale(&mut handle, 0).await;
                respond(send, 201, &event);
            }
            let (patch, send) = expect(&mut handle, Method::PATCH, STATUS_PATCH).await;
            respond(send, 200, &ias_json());
            patch
        });
        reconcile(Arc::new(obj), ctx.clone()).await.unwrap();
        let patch = server.await.unwrap();
        let message = condition(&patch["status"], "ScalingActive")["message"].to_string();
        let ledger: crd::ColdStartLedgerStatus =
            serde_json::from_value(patch["status"]["coldStartLedger"].clone()).unwrap();
        if resumes {
            assert_eq!(patch["status"]["desiredReplicas"], 0, "{patch}");
            // Nothing new was counted: the copy stays as written.
            assert_eq!(ledger, copy);
        } else {
            assert_eq!(patch["status"]["desiredReplicas"], 1, "{written:?}: {patch}");
            assert!(
                message.contains("keeps one warm replica: a cold start takes 28 s"),
                "{message}"
            );
            // The copy of the new ledger: one sync counted, so far.
            assert_eq!(
                (
                    ledger.samples.len(),
                    ledger.taken_at_unix_ms,
                    ledger.cold_start_ms
                ),
                (1, ms as i64, Some(28_000))
            );
        }
    }
}

/// Right after a restart, the first member of a budget group to decide reads the others from their status copies.
/// llama alone (group `tools`, 2% budget) would go to zero: its 4 misses of 362 fit the 7 it may miss. Its
/// group has a second member, digest (the same two hours, a 0.5% budget), that this process has not decided for
/// yet: read from its copy, the group may miss 3 of 724 (the smallest budget), and llama's 4 do not fit, so it
/// keeps its warm replica. Without digest's copy read (no watched objects) it would go to zero on half its
/// group's data.
#[tokio::test]
async fn the_first_member_to_decide_after_a_restart_reads_the_others_from_status() {
    let (copy, total, last) = two_hours_with_one_wake();
    let mut llama = (*group_member("models", "llama", 0.02, &copy)).clone();
    llama.metadata.uid = Some("u-1".into());
    let digest = group_member("models", "digest", 0.005, &copy);
    for peers_watched in [false, true] {
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let ctx = idle_since(Client::new(svc, "default"), total, last).await;
        if peers_watched {
            // The controller's cache once its first list is in.
            use kube::runtime::watcher::Event;
            let (store, mut writer) = kube::runtime::reflector::store::<InferenceAutoscaler>();
            writer.apply_watcher_event(&Event::Init);
            for obj in [&llama, digest.as_ref()] {
                writer.apply_watcher_event(&Event::InitApply(obj.clone()));
            }
            writer.apply_watcher_event(&Event::InitDone);
            *ctx.objects.write().unwrap() = Some(store);
        }
        let pods = vec![pod_started_in_28s()];
        let server = tokio::spawn(async move {
            answer_scale_and_pods(&mut handle, 1, pods).await;
            if !peers_watched {
                let (event, send) = expect_rescale(&mut handle, 0).await;
                respond(send, 201, &event);
            }
            let (patch, send) = expect(&mut handle, Method::PATCH, STATUS_PATCH).await;
            respond(send, 200, &ias_json());
            patch
        });
        reconcile(Arc::new(llama.clone()), ctx.clone()).await.unwrap();
        let patch = server.await.unwrap();
        let message = condition(&patch["status"], "ScalingActive")["message"].to_string();
        if peers_watched {
            assert_eq!(patch["status"]["desiredReplicas"], 1, "{patch}");
            assert!(
                message.contains(
                    "budget group 'tools' (2 model(s), 724 requests over their last day) may miss 3 (0.50%)"
                ) && message.contains("this model's 4 do not fit what is left"),
                "{message}"
            );
        } else {
            assert_eq!(patch["status"]["desiredReplicas"], 0, "{patch}");
        }
    }
}
