//! An SLO edit (`ttftSlo`, `ttftSloPercentile`, `itlSlo`) on a running model reaches the share rule within one sync: the reconcile that reads the edited
//! spec hands the sidecars the new objective (no pod recreated), and hands nothing while they hold it.

use tessera_core::wire::sidecar::ComputeStatus;
use tessera_core::wire::sidecar::Objective;

use super::*;

const SIDECAR: &str = "http://10.0.0.1:9090";

/// A spec with a TTFT objective (`percentile` may be absent).
fn spec(slo: &str, percentile: Option<u32>) -> Value {
    let mut s = json!({"scaleTargetRef": {"kind": "Deployment", "name": "llama"}, "maxReplicas": 3,
                       "targets": {"kvCacheUtilization": 0.5}, "ttftSlo": slo});
    if let Some(p) = percentile {
        s["ttftSloPercentile"] = json!(p);
    }
    s
}

/// One sync of `spec` with one ready replica: answers `/scale`, the pods, then whatever the reconcile writes
/// (status, Events) until it is done; returns the objectives handed over during it.
async fn sync(ctx: &Arc<Context>, signals: &FakeSignals, spec: Value) -> Vec<(String, Objective)> {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let ctx = Arc::new(Context {
        client: Client::new(svc, "default"),
        ..clone_context(ctx)
    });
    let server = tokio::spawn(async move {
        answer_scale_and_pods(&mut handle, 1, vec![pod("a", "10.0.0.1", true)]).await;
        while let Ok(Some((req, send))) =
            tokio::time::timeout(Duration::from_millis(200), handle.next_request()).await
        {
            let status = if req.method() == Method::POST { 201 } else { 200 };
            respond(send, status, &ias_json());
        }
    });
    ctx.last_runs.lock().unwrap().clear();
    reconcile(ias(spec, json!({})), ctx).await.unwrap();
    server.await.unwrap();
    std::mem::take(&mut *signals.handed.lock().unwrap())
}

/// The context's settings and state around another client (each sync gets its own mock API server).
fn clone_context(ctx: &Arc<Context>) -> Context {
    let fresh = test_context(
        ctx.client.clone(),
        ctx.signals.clone(),
        ActivatorPoller::new(&[]),
        UNIX_EPOCH + Duration::from_secs(NOW_S),
        ctx.states.lock().unwrap().clone(),
    );
    Arc::try_unwrap(fresh).unwrap_or_else(|_| unreachable!("a fresh context has one owner"))
}

#[tokio::test]
async fn an_slo_edit_reaches_the_share_rule_within_one_sync() {
    let signals = Arc::new(FakeSignals {
        kv: [(SIDECAR.to_owned(), 0.5)].into(),
        // The replica was admitted with `--ttft-slo 2s` and an inter-token objective from its annotation.
        compute: Mutex::new(Some(ComputeStatus {
            current_share: 0.5,
            ttft_slo_secs: Some(2.0),
            ttft_slo_percentile: Some(95),
            itl_slo_secs: Some(0.1),
        })),
        ..FakeSignals::default()
    });
    let (svc, _handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let ctx = test_context(
        Client::new(svc, "default"),
        signals.clone(),
        ActivatorPoller::new(&[]),
        UNIX_EPOCH + Duration::from_secs(NOW_S),
        HashMap::new(),
    );

    // The spec the replica was admitted with: nothing to hand over.
    assert_eq!(sync(&ctx, &signals, spec("2s", None)).await, []);

    // `ttftSlo` and `ttftSloPercentile` edited on the running model: the next sync hands the new objective to the
    // replica's sidecar (its inter-token objective kept), which its share rule sizes to from then on.
    let handed = sync(&ctx, &signals, spec("1s", Some(99))).await;
    let want = Objective {
        ttft_slo_secs: Some(1.0),
        ttft_slo_percentile: 99,
        itl_slo_secs: Some(0.1),
    };
    assert_eq!(handed, [(SIDECAR.to_owned(), want)]);
    let held = signals.compute.lock().unwrap().unwrap();
    assert_eq!(
        (held.ttft_slo_secs, held.ttft_slo_percentile, held.itl_slo_secs),
        (Some(1.0), Some(99), Some(0.1))
    );

    // The sidecar now reports it: the sync after hands nothing.
    assert_eq!(sync(&ctx, &signals, spec("1s", Some(99))).await, []);

    // The inter-token objective written in the spec (`itlSlo`) replaces the annotation's, the same way.
    let mut with_itl = spec("1s", Some(99));
    with_itl["itlSlo"] = json!("50ms");
    let handed = sync(&ctx, &signals, with_itl.clone()).await;
    let want = Objective {
        itl_slo_secs: Some(0.05),
        ..want
    };
    assert_eq!(handed, [(SIDECAR.to_owned(), want)]);
    assert_eq!(sync(&ctx, &signals, with_itl).await, []);
}
