//! [`PoolManager::run`] end to end against the fake API server of `tests.rs`, extended with watches.
//!
//! The fake answers list and watch requests the way the API server does: a watch from `resourceVersion` N
//! first replays every change after N, then streams new ones (`ADDED` / `MODIFIED` / `DELETED` JSON lines),
//! so no event is lost between kube-runtime's list and its watch, whatever the scheduling. Time is tokio's
//! paused clock: the grace period passes in virtual time, and every wait is bounded.

#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Frame;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use kube::client::Body;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::tests::{
    FakeApi, Logged, capacity, config, matches_selector, percent_decode, read_request, reservations_on, resv,
    seeded, tenant,
};
use super::*;

type TestBody = UnsyncBoxBody<Bytes, Infallible>;

/// One change, as a watch reports it.
#[derive(Debug, Clone)]
struct Change {
    rv: u64,
    kind: &'static str,
    object: Value,
}

/// An open watch: namespace (`None`: all), label selector, and where its lines go.
struct Watch {
    namespace: Option<String>,
    selector: String,
    tx: mpsc::UnboundedSender<Result<Frame<Bytes>, Infallible>>,
}

#[derive(Default)]
struct Watches {
    history: Vec<Change>,
    open: Vec<Watch>,
}

impl Watch {
    fn wants(&self, c: &Change) -> bool {
        let ns = c.object["metadata"]["namespace"].as_str().unwrap_or("default");
        self.namespace.as_deref().is_none_or(|n| n == ns) && matches_selector(&c.object, &self.selector)
    }

    fn send(&self, c: &Change) -> bool {
        let line = serde_json::to_vec(&json!({"type": c.kind, "object": c.object})).unwrap();
        let mut line = line;
        line.push(b'\n');
        self.tx.send(Ok(Frame::data(Bytes::from(line)))).is_ok()
    }
}

fn query_param(query: &str, key: &str) -> Option<String> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .map(percent_decode)
}

fn once(code: u16, v: &Value) -> Response<TestBody> {
    let body = http_body_util::Full::new(Bytes::from(serde_json::to_vec(v).unwrap()))
        .map_err(|never| match never {})
        .boxed_unsync();
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap())
        .header("content-type", "application/json")
        .body(body)
        .unwrap()
}

/// A client served by `api`, with watches. Returns the client and the watch registry (to count open ones).
fn client_with_watches(api: Arc<Mutex<FakeApi>>) -> (kube::Client, Arc<Mutex<Watches>>) {
    let watches = Arc::new(Mutex::new(Watches::default()));
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<TestBody>>();
    let w = watches.clone();
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let (method, path, query, body) = read_request(req).await;
            if method == "GET" && query_param(&query, "watch").as_deref() == Some("true") {
                let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
                let namespace = match segs.as_slice() {
                    ["api", "v1", "namespaces", ns, "pods"] => Some(ns.to_string()),
                    _ => None,
                };
                let from: u64 = query_param(&query, "resourceVersion")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let (tx, rx) = mpsc::unbounded_channel();
                let watch = Watch {
                    namespace,
                    selector: query_param(&query, "labelSelector").unwrap_or_default(),
                    tx,
                };
                let mut reg = w.lock().unwrap();
                for c in reg.history.iter().filter(|c| c.rv > from && watch.wants(c)) {
                    watch.send(c);
                }
                reg.open.push(watch);
                let stream = http_body_util::StreamBody::new(UnboundedReceiverStream::new(rx)).boxed_unsync();
                let response = Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .body(stream)
                    .unwrap();
                send.send_response(response);
                continue;
            }
            let (code, resp) = {
                let mut a = api.lock().unwrap();
                let before = a.rv;
                let (code, mut resp) = a.handle(&method, &path, &query, body.clone());
                a.log.push(Logged {
                    method: method.clone(),
                    path: path.clone(),
                    query: query.clone(),
                    body,
                    status: code,
                });
                let kind = match method.as_str() {
                    "POST" => Some("ADDED"),
                    "PATCH" => Some("MODIFIED"),
                    "DELETE" => Some("DELETED"),
                    _ => None,
                };
                if let Some(kind) = kind.filter(|_| code < 300) {
                    // A deletion is a change too: it gets its own resourceVersion, as on a real server.
                    if kind == "DELETED" {
                        a.rv += 1;
                        resp["metadata"]["resourceVersion"] = json!(a.rv.to_string());
                    }
                    debug_assert!(a.rv > before);
                    let change = Change {
                        rv: a.rv,
                        kind,
                        object: resp.clone(),
                    };
                    let mut reg = w.lock().unwrap();
                    reg.open
                        .retain(|watch| !watch.wants(&change) || watch.send(&change));
                    reg.history.push(change);
                }
                (code, resp)
            };
            send.send_response(once(code, &resp));
        }
    });
    (kube::Client::new(svc, "default"), watches)
}

/// Waits (in virtual time, 100 ms steps) until `cond` holds; fails the test after `limit`.
async fn until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn annotations(api: &Arc<Mutex<FakeApi>>, name: &str) -> Option<std::collections::BTreeMap<String, String>> {
    api.lock()
        .unwrap()
        .pod("tessera-system", name)
        .map(|p| p.metadata.annotations.unwrap_or_default())
}

#[tokio::test(start_paused = true)]
async fn the_watch_loop_frees_a_deleted_tenants_share_and_deletes_the_empty_gpu_after_the_grace_period() {
    let cfg = config(3);
    let api = seeded(&[
        capacity(&cfg, "gpu-a", &[resv("r1", 300, 0)], "node-1", "GPU-a"),
        capacity(&cfg, "gpu-b", &[resv("r2", 500, 0)], "node-2", "GPU-b"),
        tenant("team", "t1", "r1", "gpu-a"),
        tenant("team", "t2", "r2", "gpu-b"),
    ]);
    let (client, watches) = client_with_watches(api.clone());
    let manager = PoolManager::new(client.clone(), cfg.clone(), "p").unwrap();
    let view = manager.clone();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let stop = shutdown.clone();
    let tick = Duration::from_secs(30);
    let run = tokio::spawn(async move { manager.run(tick, stop.cancelled_owned()).await });

    // Both watches open (capacity pods in the namespace, tenants cluster-wide) and the index is filled.
    until(Duration::from_secs(60), "both watches are open", || {
        watches.lock().unwrap().open.len() == 2
    })
    .await;
    until(
        Duration::from_secs(60),
        "the index holds both GPUs and tenants",
        || {
            let idx = view.index();
            idx.capacity().count() == 2 && idx.tenants().count() == 2
        },
    )
    .await;
    assert_eq!(
        reservations_on(&api, "gpu-a").len(),
        1,
        "a bound reservation is kept"
    );

    // A user deletes the tenant on gpu-a: the watch reports it, and its share is freed.
    let started = tokio::time::Instant::now();
    Api::<Pod>::namespaced(client.clone(), "team")
        .delete("t1", &DeleteParams::default())
        .await
        .unwrap();
    until(Duration::from_secs(60), "gpu-a's reservation is freed", || {
        reservations_on(&api, "gpu-a").is_empty()
    })
    .await;
    assert!(view.index().find_reservation("r1").is_none());
    let ann = annotations(&api, "gpu-a").unwrap();
    assert!(ann.contains_key(ANNOTATION_EMPTY_SINCE), "{ann:?}");
    assert!(
        !ann.contains_key(KARPENTER_DO_NOT_DISRUPT),
        "an empty GPU no longer blocks consolidation: {ann:?}"
    );

    // Nine minutes on (grace is ten), it is still there, and gpu-b was never touched.
    tokio::time::sleep(Duration::from_secs(9 * 60).saturating_sub(started.elapsed())).await;
    assert!(
        annotations(&api, "gpu-a").is_some(),
        "deleted before the grace period ended"
    );
    // Past the grace period plus one reconcile interval, it is deleted, with a resourceVersion precondition.
    until(
        Duration::from_secs(2 * 60),
        "gpu-a is deleted after the grace period",
        || annotations(&api, "gpu-a").is_none(),
    )
    .await;
    let gone_after = started.elapsed();
    assert!(
        gone_after >= Duration::from_secs(600) && gone_after <= Duration::from_secs(600) + tick * 2,
        "deleted after {gone_after:?}"
    );
    assert_eq!(reservations_on(&api, "gpu-b"), vec![resv("r2", 500, 0)]);
    let log = api.lock().unwrap().log.clone();
    let deletes: Vec<_> = log
        .iter()
        .filter(|l| l.method == "DELETE" && l.path.ends_with("/gpu-a"))
        .collect();
    assert_eq!(deletes.len(), 1, "one delete of gpu-a");
    assert!(
        deletes[0].body["preconditions"]["resourceVersion"].is_string(),
        "{:?}",
        deletes[0].body
    );
    assert!(
        !log.iter()
            .any(|l| l.path.ends_with("/gpu-b") && l.method != "GET"),
        "gpu-b, which has a tenant, is never written"
    );
    // The capacity watch told the index too.
    until(Duration::from_secs(10), "the index forgets gpu-a", || {
        view.index().capacity_pod("gpu-a").is_none()
    })
    .await;

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("run stops on shutdown")
        .unwrap();
}
