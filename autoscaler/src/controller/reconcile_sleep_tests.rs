//! Sleep mode (`spec.sleep`) through a reconcile against kube's mock service: an idle model whose cold start
//! misses its objective keeps its pod (`/scale` stays 1), tells it to sleep through the pod's annotation, and says
//! why in status; asleep, the count holds and the status counts the sleeper.

use super::*;

/// The model's one pod, started in 60 s (the cold start the controller measures), ready or asleep (not ready).
fn pod_started_in_60s(ready: bool, annotation: Option<&str>) -> Value {
    let mut p = json!({"metadata": {"name": "a", "namespace": "models", "creationTimestamp": "2027-01-15T07:00:00Z"},
           "spec": crate::controller::injection::injected_spec(),
           "status": {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" },
                      "lastTransitionTime": "2027-01-15T07:01:00Z"}]}});
    if let Some(a) = annotation {
        p["metadata"]["annotations"] = json!({ "tessera.dev/rest": a });
    }
    p
}

fn sleepy() -> Arc<InferenceAutoscaler> {
    ias(
        json!({"scaleTargetRef": {"kind": "Deployment", "name": "llama"}, "minReplicas": 0, "maxReplicas": 4,
               "scaleToZero": {"idleAfter": "5m"}, "modelNames": ["llama"], "ttftSlo": "2s",
               "sleep": {"enabled": true, "level": 1}}),
        json!({}),
    )
}

/// An idle model, its replica's sidecar reporting `rest`.
async fn idle_context(client: Client, rest: Value) -> Arc<Context> {
    let ms = NOW_S * 1000;
    let idle = |at| activator_doc(at, "models/llama", 5, 0, 0, Some(ms - 900_000));
    let ctx = test_context(
        client,
        Arc::new(FakeSignals {
            kv: [("http://10.0.0.1:9090".to_owned(), 0.0)].into(),
            activator: Mutex::new(vec![idle(ms - 1000), idle(ms), idle(ms + 100)].into()),
            rest: Some(rest),
            ..FakeSignals::default()
        }),
        ActivatorPoller::new(&["http://act-0:8080".to_owned()]),
        UNIX_EPOCH + Duration::from_secs(NOW_S),
        HashMap::new(),
    );
    poll(&ctx).await;
    poll(&ctx).await;
    ctx
}

#[tokio::test]
async fn an_idle_model_sleeps_instead_of_going_to_zero() {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let ctx = idle_context(
        Client::new(svc, "default"),
        json!({"state": "awake", "level": "one", "last_wake_secs": 0.8}),
    )
    .await;
    let server = tokio::spawn(async move {
        answer_scale_and_pods(&mut handle, 1, vec![pod_started_in_60s(true, None)]).await;
        // No /scale PATCH: the pod stays, and is told to sleep.
        let (patch, send) = expect(&mut handle, Method::PATCH, "/api/v1/namespaces/models/pods/a?").await;
        let value = patch["metadata"]["annotations"]["tessera.dev/rest"]
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(value, format!("sleep level=1 since={}", NOW_S * 1000));
        respond(send, 200, &pod_started_in_60s(true, Some(&value)));
        let (event, send) = expect(&mut handle, Method::POST, EVENTS).await;
        assert_eq!(event["reason"], "Sleeping");
        respond(send, 201, &event);
        let (patch, send) = expect(&mut handle, Method::PATCH, STATUS_PATCH).await;
        let rest = &patch["status"]["rest"];
        assert_eq!(rest["atZero"], "sleep", "{patch}");
        assert_eq!(rest["reason"], "wake_shortens_cold_start");
        assert_eq!(rest["level"], 1);
        assert_eq!(rest["wakeSeconds"], 0.8);
        assert_eq!(patch["status"]["desiredReplicas"], 0);
        respond(send, 200, &ias_json());
    });
    reconcile(sleepy(), ctx).await.unwrap();
    server.await.unwrap();
}

#[tokio::test]
async fn asleep_the_count_holds_and_the_status_counts_the_sleeper() {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let ctx = idle_context(
        Client::new(svc, "default"),
        json!({"state": "sleeping", "level": "one", "last_wake_secs": 0.8, "residue_bytes": 1_503_238_553u64}),
    )
    .await;
    let since = NOW_S * 1000 - 600_000;
    let server = tokio::spawn(async move {
        let asleep = pod_started_in_60s(false, Some(&format!("sleep level=1 since={since}")));
        answer_scale_and_pods(&mut handle, 1, vec![asleep]).await;
        // Nothing to write but status: the pod keeps its instruction and `/scale` its one pod.
        let (patch, send) = expect(&mut handle, Method::PATCH, STATUS_PATCH).await;
        assert_eq!(patch["status"]["rest"]["sleeping"], 1, "{patch}");
        assert_eq!(patch["status"]["rest"]["atZero"], "sleep");
        respond(send, 200, &ias_json());
    });
    reconcile(sleepy(), ctx).await.unwrap();
    server.await.unwrap();
}
