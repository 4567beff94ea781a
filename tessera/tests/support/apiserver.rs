//! An in-memory Kubernetes API server over loopback, honest enough to run the controller's real code paths: no
//! kube-apiserver can run on these machines.
//!
//! What it does like the real one:
//! - any namespaced or cluster-wide collection under `/api/v1/...` and `/apis/<group>/<version>/...`, objects kept
//!   as JSON; `metadata.resourceVersion` on every object from one global counter, `uid`, `generation` (bumped when
//!   `spec` changes), `creationTimestamp`;
//! - list with `labelSelector` (equality `k=v`, `k!=v`, existence `k`, non-existence `!k`, comma-joined), list
//!   `resourceVersion`;
//! - watch (`?watch=true&resourceVersion=N`): chunked JSON lines `{"type":"ADDED|MODIFIED|DELETED","object":…}`
//!   for every change after N, filtered by namespace and selector, ended after `timeoutSeconds`;
//! - create (409 `AlreadyExists`), replace (409 `Conflict` on a stale `resourceVersion`), JSON merge patch (409 when
//!   the patch carries a stale `metadata.resourceVersion`), delete (409 on a stale `preconditions`; an object with
//!   `metadata.finalizers` only gets a `deletionTimestamp` until they are gone); the `status` subresource (patch changes only
//!   `status`), and the `scale` subresource of Deployments and StatefulSets (`spec.replicas`, `status.selector`);
//! - every request is logged (method, path and query) for assertions;
//! - [`ApiServer::partition`] makes it hang every request from then on (a network partition as the client sees
//!   it), [`ApiServer::heal`] ends it.
#![allow(dead_code, clippy::unwrap_used)] // test support: a poisoned lock or unserializable JSON is a test bug

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// The collections the tests keep objects in (the keys of [`ApiServer::get`] and [`ApiServer::put`]).
pub const PODS: &str = "v1/pods";
pub const DEPLOYMENTS: &str = "apps/v1/deployments";
pub const IAS: &str = "tessera.dev/v1alpha1/inferenceautoscalers";
pub const LEASES: &str = "coordination.k8s.io/v1/leases";
pub const EVENTS: &str = "events.k8s.io/v1/events";

/// One change, kept for watches.
#[derive(Debug, Clone)]
struct Change {
    rv: u64,
    collection: String,
    kind: &'static str,
    object: Value,
}

#[derive(Debug, Default)]
struct Store {
    rv: u64,
    /// (collection path without namespace, e.g. `apps/v1/deployments`; namespace; name) → object.
    objects: BTreeMap<(String, String, String), Value>,
    changes: Vec<Change>,
    requests: Vec<String>,
    partitioned: bool,
    status_conflicts: u32,
}

/// The server; clone it freely (shared state).
#[derive(Debug, Clone)]
pub struct ApiServer {
    store: Arc<Mutex<Store>>,
    notify: Arc<tokio::sync::Notify>,
    pub addr: SocketAddr,
}

/// A parsed request path.
#[derive(Debug)]
struct Target {
    /// `v1/pods`, `apps/v1/deployments`, `coordination.k8s.io/v1/leases`.
    collection: String,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

fn parse_path(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (gv, rest) = match *parts.first()? {
        "api" => (parts.get(1)?.to_string(), &parts[2..]),
        "apis" => (format!("{}/{}", parts.get(1)?, parts.get(2)?), &parts[3..]),
        _ => return None,
    };
    let (namespace, rest) = if rest.first() == Some(&"namespaces") && rest.len() >= 3 {
        (Some(rest[1].to_string()), &rest[2..])
    } else {
        (None, rest)
    };
    Some(Target {
        collection: format!("{gv}/{}", rest.first()?),
        namespace,
        name: rest.get(1).map(|s| s.to_string()),
        sub: rest.get(2).map(|s| s.to_string()),
    })
}

fn status(code: u16, reason: &str, message: &str) -> Response {
    (
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        axum::Json(
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                          "reason": reason, "message": message, "code": code}),
        ),
    )
        .into_response()
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().expect("an object");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// Whether `labels` match a selector `k=v,k!=v,k,!k`.
pub fn selects(selector: &str, labels: &Value) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        if let Some(k) = term.trim().strip_prefix('!') {
            labels.get(k.trim()).is_none()
        } else if let Some((k, v)) = term.split_once("!=") {
            labels[k.trim()].as_str() != Some(v.trim())
        } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            labels[k.trim()].as_str() == Some(v.trim())
        } else {
            labels.get(term.trim()).is_some()
        }
    })
}

fn query(uri: &Uri) -> BTreeMap<String, String> {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), percent_decode(v)))
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Some(v) = std::str::from_utf8(&b[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl ApiServer {
    /// Starts the server on an ephemeral loopback port.
    pub async fn start() -> ApiServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let server = ApiServer {
            store: Arc::default(),
            notify: Arc::default(),
            addr,
        };
        let s = server.clone();
        let app = Router::new().fallback(move |method: Method, uri: Uri, body: Bytes| {
            let s = s.clone();
            async move { s.handle(method, uri, body).await }
        });
        tokio::spawn(async move { axum::serve(listener, app).await });
        server
    }

    /// A kubeconfig pointing at this server, written into `dir`; returns its path.
    pub fn kubeconfig(&self, dir: &std::path::Path) -> std::path::PathBuf {
        let path = dir.join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster: {{server: \"http://{}\"}}\n\
                 users:\n- name: u\n  user: {{}}\ncontexts:\n- name: c\n  context: {{cluster: fake, user: u, \
                 namespace: default}}\ncurrent-context: c\n",
                self.addr
            ),
        )
        .expect("write kubeconfig");
        path
    }

    /// Creates or replaces an object (as a test fixture, not through the API), with a new resourceVersion.
    pub fn put(&self, collection: &str, namespace: &str, mut obj: Value) -> Value {
        let mut st = self.store.lock().unwrap();
        let name = obj["metadata"]["name"]
            .as_str()
            .expect("metadata.name")
            .to_string();
        let key = (collection.to_string(), namespace.to_string(), name);
        let kind = if st.objects.contains_key(&key) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        st.rv += 1;
        let rv = st.rv;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        if !namespace.is_empty() {
            obj["metadata"]["namespace"] = json!(namespace);
        }
        if obj["metadata"]["uid"].is_null() {
            obj["metadata"]["uid"] = json!(format!("uid-{rv}"));
        }
        if obj["metadata"]["generation"].is_null() {
            obj["metadata"]["generation"] = json!(1);
        }
        st.objects.insert(key, obj.clone());
        st.changes.push(Change {
            rv,
            collection: collection.to_string(),
            kind,
            object: obj.clone(),
        });
        drop(st);
        self.notify.notify_waiters();
        obj
    }

    /// The Deployment `namespace/name`'s `spec.replicas`: what the controller asks for (0 while it has none).
    pub fn wanted_replicas(&self, namespace: &str, name: &str) -> i64 {
        self.get(DEPLOYMENTS, namespace, name)
            .and_then(|d| d["spec"]["replicas"].as_i64())
            .unwrap_or(0)
    }

    /// The object, if it exists.
    pub fn get(&self, collection: &str, namespace: &str, name: &str) -> Option<Value> {
        let st = self.store.lock().unwrap();
        st.objects
            .get(&(collection.to_string(), namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// Deletes an object (as a test fixture), sending the watch event.
    pub fn delete_object(&self, collection: &str, namespace: &str, name: &str) {
        let _ = self.delete(collection, namespace, name);
    }

    /// Every object of a collection, in every namespace.
    pub fn list(&self, collection: &str) -> Vec<Value> {
        let st = self.store.lock().unwrap();
        st.objects
            .iter()
            .filter(|((c, _, _), _)| c == collection)
            .map(|(_, o)| o.clone())
            .collect()
    }

    /// The next `n` writes to a `status` subresource answer 409 Conflict, as when another writer got there first:
    /// the caller must re-read and retry.
    pub fn conflict_next_status_writes(&self, n: u32) {
        self.store.lock().unwrap().status_conflicts = n;
    }

    /// Every request so far, as `METHOD path?query`.
    pub fn requests(&self) -> Vec<String> {
        self.store.lock().unwrap().requests.clone()
    }

    /// From now on every request hangs (until [`ApiServer::heal`]).
    pub fn partition(&self) {
        self.store.lock().unwrap().partitioned = true;
    }

    /// Ends a partition.
    pub fn heal(&self) {
        self.store.lock().unwrap().partitioned = false;
        self.notify.notify_waiters();
    }

    async fn handle(&self, method: Method, uri: Uri, body: Bytes) -> Response {
        let pq = uri
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_default();
        let partitioned = {
            let mut st = self.store.lock().unwrap();
            st.requests.push(format!("{method} {pq}"));
            st.partitioned
        };
        if partitioned {
            std::future::pending::<()>().await;
        }
        let Some(t) = parse_path(uri.path()) else {
            return status(404, "NotFound", &format!("no such path {pq}"));
        };
        let q = query(&uri);
        let body: Value = if body.is_empty() {
            Value::Null
        } else {
            match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(e) => return status(400, "BadRequest", &format!("body is not JSON: {e}")),
            }
        };
        let ns = t.namespace.clone().unwrap_or_default();
        match (&method, &t.name, t.sub.as_deref()) {
            (&Method::GET, None, _) if q.get("watch").is_some_and(|w| w == "true" || w == "1") => {
                self.watch(t, q).await
            }
            (&Method::GET, None, _) => self.list_response(&t, &q),
            (&Method::POST, None, _) => self.create(&t.collection, &ns, body),
            (&Method::GET, Some(name), None) => match self.get(&t.collection, &ns, name) {
                Some(o) => axum::Json(o).into_response(),
                None => status(404, "NotFound", &format!("{} {name} not found", t.collection)),
            },
            (&Method::GET, Some(name), Some("status")) => match self.get(&t.collection, &ns, name) {
                Some(o) => axum::Json(o).into_response(),
                None => status(404, "NotFound", name),
            },
            (&Method::GET, Some(name), Some("scale")) => match self.get(&t.collection, &ns, name) {
                Some(o) => axum::Json(scale_of(&o)).into_response(),
                None => status(404, "NotFound", name),
            },
            (&Method::PUT, Some(name), None) => self.replace(&t.collection, &ns, name, body),
            (&Method::PATCH, Some(name), sub) => self.patch(&t.collection, &ns, name, sub, body),
            (&Method::DELETE, Some(name), None) => {
                // DeleteOptions.preconditions: a stale resourceVersion (or uid) refuses the delete with 409.
                let pre = &body["preconditions"];
                if let Some(current) = self.get(&t.collection, &ns, name) {
                    for field in ["resourceVersion", "uid"] {
                        if let Some(want) = pre[field].as_str()
                            && current["metadata"][field].as_str() != Some(want)
                        {
                            return status(
                                409,
                                "Conflict",
                                &format!("Precondition failed: {field} in precondition: {want}"),
                            );
                        }
                    }
                }
                self.delete(&t.collection, &ns, name)
            }
            _ => status(405, "MethodNotAllowed", &format!("{method} {pq}")),
        }
    }

    fn list_response(&self, t: &Target, q: &BTreeMap<String, String>) -> Response {
        let st = self.store.lock().unwrap();
        let selector = q.get("labelSelector").cloned().unwrap_or_default();
        let items: Vec<Value> = st
            .objects
            .iter()
            .filter(|((c, n, _), o)| {
                *c == t.collection
                    && t.namespace.as_ref().is_none_or(|ns| ns == n)
                    && selects(&selector, &o["metadata"]["labels"])
            })
            .map(|(_, o)| o.clone())
            .collect();
        axum::Json(json!({"apiVersion": "v1", "kind": "List",
                          "metadata": {"resourceVersion": st.rv.to_string()}, "items": items}))
        .into_response()
    }

    async fn watch(&self, t: Target, q: BTreeMap<String, String>) -> Response {
        let from: u64 = q.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
        let timeout = Duration::from_secs(
            q.get("timeoutSeconds")
                .and_then(|v| v.parse().ok())
                .unwrap_or(290),
        );
        let selector = q.get("labelSelector").cloned().unwrap_or_default();
        let server = self.clone();
        let deadline = tokio::time::Instant::now() + timeout;
        let stream = futures::stream::unfold((from, false), move |(mut seen, done)| {
            let server = server.clone();
            let (t_coll, t_ns, selector) = (t.collection.clone(), t.namespace.clone(), selector.clone());
            async move {
                if done {
                    return None;
                }
                loop {
                    let notified = server.notify.notified();
                    if server.store.lock().unwrap().partitioned {
                        // Nothing crosses a partition; the changes are sent once it heals.
                        notified.await;
                        continue;
                    }
                    let (lines, partitioned) = {
                        let st = server.store.lock().unwrap();
                        let mut lines = Vec::new();
                        let from = seen;
                        for c in st.changes.iter().filter(|c| c.rv > from) {
                            seen = c.rv;
                            let ns = c.object["metadata"]["namespace"].as_str().unwrap_or("");
                            if c.collection == t_coll
                                && t_ns.as_deref().is_none_or(|n| n == ns)
                                && selects(&selector, &c.object["metadata"]["labels"])
                            {
                                lines.extend(
                                    serde_json::to_vec(&json!({"type": c.kind, "object": c.object})).unwrap(),
                                );
                                lines.push(b'\n');
                            }
                        }
                        (lines, st.partitioned)
                    };
                    if !lines.is_empty() && !partitioned {
                        return Some((Ok::<_, std::io::Error>(lines), (seen, false)));
                    }
                    tokio::select! {
                        () = notified => {}
                        () = tokio::time::sleep_until(deadline), if !partitioned => {
                            return Some((Ok(Vec::new()), (seen, true)));
                        }
                    }
                }
            }
        });
        Response::new(Body::from_stream(stream))
    }

    fn create(&self, collection: &str, ns: &str, obj: Value) -> Response {
        let Some(name) = obj["metadata"]["name"].as_str() else {
            return status(422, "Invalid", "metadata.name is required");
        };
        if self.get(collection, ns, name).is_some() {
            return status(
                409,
                "AlreadyExists",
                &format!("{collection} {name} already exists"),
            );
        }
        let mut obj = obj;
        obj["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
        (StatusCode::CREATED, axum::Json(self.put(collection, ns, obj))).into_response()
    }

    fn replace(&self, collection: &str, ns: &str, name: &str, mut obj: Value) -> Response {
        let Some(current) = self.get(collection, ns, name) else {
            return status(404, "NotFound", name);
        };
        if obj["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"] {
            return status(
                409,
                "Conflict",
                "the object has been modified; please apply your changes to the latest version",
            );
        }
        let mut generation = current["metadata"]["generation"].as_i64().unwrap_or(1);
        if obj["spec"] != current["spec"] {
            generation += 1;
        }
        obj["metadata"]["generation"] = json!(generation);
        obj["metadata"]["uid"] = current["metadata"]["uid"].clone();
        axum::Json(self.put(collection, ns, obj)).into_response()
    }

    fn patch(&self, collection: &str, ns: &str, name: &str, sub: Option<&str>, patch: Value) -> Response {
        let Some(mut obj) = self.get(collection, ns, name) else {
            return status(404, "NotFound", name);
        };
        if let Some(rv) = patch["metadata"]["resourceVersion"].as_str()
            && Some(rv) != obj["metadata"]["resourceVersion"].as_str()
        {
            return status(
                409,
                "Conflict",
                "the object has been modified; please apply your changes to the latest version",
            );
        }
        if sub == Some("status") {
            let mut st = self.store.lock().unwrap();
            if st.status_conflicts > 0 {
                st.status_conflicts -= 1;
                return status(
                    409,
                    "Conflict",
                    "the object has been modified; please apply your changes to the latest version",
                );
            }
        }
        match sub {
            Some("status") => merge_patch(&mut obj["status"], &patch["status"]),
            Some("scale") => {
                let Some(r) = patch["spec"]["replicas"].as_i64() else {
                    return status(422, "Invalid", "a scale patch sets spec.replicas");
                };
                obj["spec"]["replicas"] = json!(r);
            }
            None => {
                let before = obj["spec"].clone();
                let mut p = patch;
                if let Some(m) = p.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove("resourceVersion");
                }
                merge_patch(&mut obj, &p);
                if obj["spec"] != before {
                    let g = obj["metadata"]["generation"].as_i64().unwrap_or(1) + 1;
                    obj["metadata"]["generation"] = json!(g);
                }
            }
            Some(other) => return status(404, "NotFound", &format!("no subresource {other}")),
        }
        let obj = self.put(collection, ns, obj);
        if sub == Some("scale") {
            return axum::Json(scale_of(&obj)).into_response();
        }
        axum::Json(obj).into_response()
    }

    fn delete(&self, collection: &str, ns: &str, name: &str) -> Response {
        let mut st = self.store.lock().unwrap();
        let key = (collection.to_string(), ns.to_string(), name.to_string());
        // An object with finalizers is only marked (deletionTimestamp, a MODIFIED event) until they are gone, as
        // the real API server does: a test plays a kubelet's graceful termination this way.
        if let Some(obj) = st.objects.get_mut(&key)
            && obj["metadata"]["finalizers"]
                .as_array()
                .is_some_and(|f| !f.is_empty())
        {
            if obj["metadata"]["deletionTimestamp"].is_null() {
                obj["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            }
            let mut obj = obj.clone();
            st.rv += 1;
            let rv = st.rv;
            obj["metadata"]["resourceVersion"] = json!(rv.to_string());
            st.objects.insert(key, obj.clone());
            st.changes.push(Change {
                rv,
                collection: collection.to_string(),
                kind: "MODIFIED",
                object: obj.clone(),
            });
            drop(st);
            self.notify.notify_waiters();
            return axum::Json(obj).into_response();
        }
        let Some(mut obj) = st.objects.remove(&key) else {
            return status(404, "NotFound", name);
        };
        st.rv += 1;
        let rv = st.rv;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        st.changes.push(Change {
            rv,
            collection: collection.to_string(),
            kind: "DELETED",
            object: obj.clone(),
        });
        drop(st);
        self.notify.notify_waiters();
        axum::Json(obj).into_response()
    }
}

/// The `autoscaling/v1` Scale of a Deployment or StatefulSet.
fn scale_of(obj: &Value) -> Value {
    let labels = obj["spec"]["selector"]["matchLabels"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let selector: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
           "metadata": {"name": obj["metadata"]["name"], "namespace": obj["metadata"]["namespace"],
                        "resourceVersion": obj["metadata"]["resourceVersion"]},
           "spec": {"replicas": obj["spec"]["replicas"]},
           "status": {"replicas": obj["status"]["replicas"].as_i64().unwrap_or(0), "selector": selector.join(",")}})
}
