//! Kubernetes discovery: ready backends per model from EndpointSlices, models from InferenceAutoscalers, and the
//! wake-up patch that tells the controller to scale a model from zero.
//!
//! **Model → Service.** An `InferenceAutoscaler` lists the OpenAI model names it serves in `spec.modelNames`
//! (no default: the controller counts demand for exactly these names). Its pods are found through the EndpointSlices of the Service `spec.serviceName`
//! (default: the name of its `spec.scaleTargetRef`, the usual convention when Deployment and Service share a
//! name), or of any Service in its
//! namespace labelled `tessera.dev/autoscaler=<autoscaler name>` (Kubernetes copies Service labels onto the
//! Service's EndpointSlices). A Service without an autoscaler can still be routed by labelling it
//! `tessera.dev/model=<name>`; that only works for names that are valid label values (no `/`), and such a model
//! cannot be woken from zero.
//!
//! **Wake-up contract.** When a request is held for a model with no ready backend, the activator merge-patches
//! `metadata.annotations["tessera.dev/activated-at"]` (RFC 3339, UTC) on every InferenceAutoscaler serving the
//! model, at most once per `--wake-interval`. The controller watches its CRs, so the patch triggers a reconcile at
//! once; the controller treats a recent `activated-at` (and `queued > 0` in the activator's stats) as demand for at
//! least one replica.
//!
//! The [`Index`] is pure (events in, routes out) so it is tested without an API server; the CR is read as a
//! `DynamicObject` so the activator does not need the controller's Rust types to follow the schema.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use tessera_core::wire::activator::ACTIVATED_AT_ANNOTATION;
use tracing::{debug, info, warn};

use super::ActivatorError;
use super::discovery::Discovery;
use super::router::{ModelEntry, Router};
use crate::watch::{Change, fold_event};

/// Label on a Service (mirrored to its EndpointSlices) that routes a model without an InferenceAutoscaler.
pub const MODEL_LABEL: &str = "tessera.dev/model";
/// Label on a Service (mirrored to its EndpointSlices) naming the InferenceAutoscaler, in the same namespace, whose
/// models it serves — for a Service not named like the autoscaler's target.
pub const AUTOSCALER_LABEL: &str = "tessera.dev/autoscaler";
/// The label Kubernetes puts on every EndpointSlice naming its Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Field manager for the wake-up patch (shows in `managedFields`).
const FIELD_MANAGER: &str = "tessera-activator";

/// The `InferenceAutoscaler` resource (`tessera.dev/v1alpha1`), addressed dynamically.
pub fn autoscaler_resource() -> ApiResource {
    ApiResource {
        group: "tessera.dev".into(),
        version: "v1alpha1".into(),
        api_version: "tessera.dev/v1alpha1".into(),
        kind: "InferenceAutoscaler".into(),
        plural: "inferenceautoscalers".into(),
    }
}

/// Namespace and name of an object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl ObjectKey {
    fn of<K: ResourceExt>(obj: &K) -> Self {
        Self {
            namespace: obj.namespace().unwrap_or_default(),
            name: obj.name_any(),
        }
    }
}

/// What one InferenceAutoscaler contributes to routing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AutoscalerRoute {
    /// OpenAI model names (`spec.modelNames`).
    pub models: Vec<String>,
    /// The Service whose EndpointSlices hold the model's pods.
    pub service: Option<String>,
}

impl AutoscalerRoute {
    /// Reads the route from the CR's JSON; tolerant of a partly filled spec. As the CRD documents, `serviceName`
    /// defaults to the target's name. `modelNames` has no default: the controller counts demand only for the
    /// listed names, so routing an unlisted name here would hide its requests from scaling decisions.
    pub fn from_object(obj: &DynamicObject) -> Self {
        let spec = obj.data.get("spec");
        let target = spec
            .and_then(|s| s.pointer("/scaleTargetRef/name"))
            .and_then(|v| v.as_str())
            .map(String::from);
        let models: Vec<String> = spec
            .and_then(|s| s.get("modelNames"))
            .and_then(|m| m.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str())
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default();
        let service = spec
            .and_then(|s| s.get("serviceName"))
            .and_then(|v| v.as_str())
            .map(String::from);
        Self {
            models,
            service: service.or(target),
        }
    }
}

/// What one EndpointSlice contributes: its Service, an optional model label, and its ready addresses as URLs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceBackends {
    /// `kubernetes.io/service-name`.
    pub service: Option<String>,
    /// `tessera.dev/model`, if labelled.
    pub model_label: Option<String>,
    /// `tessera.dev/autoscaler`, if labelled.
    pub autoscaler_label: Option<String>,
    /// `http://addr:port` for each ready endpoint address.
    pub urls: Vec<String>,
}

impl SliceBackends {
    /// Reads a slice; `port_name` picks the port (default: the first one).
    pub fn from_slice(slice: &EndpointSlice, port_name: Option<&str>) -> Self {
        let labels = slice.labels();
        let port = slice.ports.as_ref().and_then(|ports| {
            let chosen = match port_name {
                Some(name) => ports.iter().find(|p| p.name.as_deref() == Some(name)),
                None => ports.first(),
            };
            chosen.and_then(|p| p.port)
        });
        let ipv6 = slice.address_type == "IPv6";
        let urls = match port {
            // A slice with no usable port has no backends (e.g. the Service has no matching port yet).
            None => Vec::new(),
            Some(port) => slice
                .endpoints
                .iter()
                // `ready` unset means ready (API docs: "nil should be interpreted as true"); a terminating
                // endpoint is reported not ready, so it gets no new requests.
                .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
                .flat_map(|e| e.addresses.first())
                .map(|a| {
                    if ipv6 {
                        format!("http://[{a}]:{port}")
                    } else {
                        format!("http://{a}:{port}")
                    }
                })
                .collect(),
        };
        Self {
            service: labels.get(SERVICE_NAME_LABEL).cloned(),
            model_label: labels.get(MODEL_LABEL).cloned(),
            autoscaler_label: labels.get(AUTOSCALER_LABEL).cloned(),
            urls,
        }
    }
}

/// Routing state fed by watch events; pure, so it is tested with `apply`/`delete`/`reset` alone.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Index {
    autoscalers: BTreeMap<ObjectKey, AutoscalerRoute>,
    slices: BTreeMap<ObjectKey, SliceBackends>,
}

impl Index {
    /// An InferenceAutoscaler was added or changed.
    pub fn apply_autoscaler(&mut self, key: ObjectKey, route: AutoscalerRoute) {
        self.autoscalers.insert(key, route);
    }

    /// An InferenceAutoscaler was deleted.
    pub fn delete_autoscaler(&mut self, key: &ObjectKey) {
        self.autoscalers.remove(key);
    }

    /// The watch restarted: this is the complete set of InferenceAutoscalers.
    pub fn reset_autoscalers(&mut self, all: BTreeMap<ObjectKey, AutoscalerRoute>) {
        self.autoscalers = all;
    }

    /// An EndpointSlice was added or changed.
    pub fn apply_slice(&mut self, key: ObjectKey, slice: SliceBackends) {
        self.slices.insert(key, slice);
    }

    /// An EndpointSlice was deleted.
    pub fn delete_slice(&mut self, key: &ObjectKey) {
        self.slices.remove(key);
    }

    /// The watch restarted: this is the complete set of EndpointSlices.
    pub fn reset_slices(&mut self, all: BTreeMap<ObjectKey, SliceBackends>) {
        self.slices = all;
    }

    /// Ready backend URLs for every routable model (a model at zero replicas maps to an empty list, so the
    /// activator knows it and holds its requests instead of answering 404).
    pub fn backends(&self) -> BTreeMap<String, Vec<String>> {
        // One pass over the slices, grouped by what can select them, then one lookup per autoscaler: linear in
        // the number of objects, since this runs on every watch event in clusters with thousands of slices.
        let mut by_service: BTreeMap<(&str, &str), Vec<&String>> = BTreeMap::new();
        let mut by_label: BTreeMap<(&str, &str), Vec<&String>> = BTreeMap::new();
        for (k, slice) in &self.slices {
            match (&slice.autoscaler_label, &slice.service) {
                // An explicit label wins over the naming convention.
                (Some(ias), _) => by_label
                    .entry((&k.namespace, ias))
                    .or_default()
                    .extend(&slice.urls),
                (None, Some(svc)) => by_service
                    .entry((&k.namespace, svc))
                    .or_default()
                    .extend(&slice.urls),
                (None, None) => {}
            }
        }
        let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (key, route) in &self.autoscalers {
            let via_service = route
                .service
                .as_deref()
                .and_then(|svc| by_service.get(&(key.namespace.as_str(), svc)));
            let via_label = by_label.get(&(key.namespace.as_str(), key.name.as_str()));
            let urls: Vec<&String> = via_service
                .into_iter()
                .chain(via_label)
                .flatten()
                .copied()
                .collect();
            for model in &route.models {
                out.entry(model.clone())
                    .or_default()
                    .extend(urls.iter().map(|u| (*u).clone()));
            }
        }
        for slice in self.slices.values() {
            if let Some(model) = &slice.model_label {
                out.entry(model.clone())
                    .or_default()
                    .extend(slice.urls.iter().cloned());
            }
        }
        out.into_iter()
            .map(|(m, urls)| (m, urls.into_iter().collect()))
            .collect()
    }

    /// The InferenceAutoscalers to wake for `model`.
    pub fn autoscalers_for(&self, model: &str) -> Vec<ObjectKey> {
        self.autoscalers
            .iter()
            .filter(|(_, r)| r.models.iter().any(|m| m == model))
            .map(|(k, _)| k.clone())
            .collect()
    }
}

/// Merge-patches the wake-up annotation onto one InferenceAutoscaler.
pub async fn wake(client: &Client, key: &ObjectKey, at: SystemTime) -> Result<(), kube::Error> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &key.namespace, &autoscaler_resource());
    let stamp = humantime::format_rfc3339_millis(at).to_string();
    let patch = serde_json::json!({ "metadata": { "annotations": { ACTIVATED_AT_ANNOTATION: stamp } } });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    api.patch(&key.name, &params, &Patch::Merge(&patch)).await?;
    Ok(())
}

/// Discovery from the Kubernetes API.
pub struct KubeDiscovery {
    client: Client,
    namespace: Option<String>,
    port_name: Option<String>,
    wake_interval: Duration,
    index: Mutex<Index>,
    /// One wake-up task per routed model, aborted when the model stops being routed.
    wakers: Mutex<HashMap<String, tokio::task::AbortHandle>>,
    autoscalers_synced: AtomicBool,
    slices_synced: AtomicBool,
}

impl std::fmt::Debug for KubeDiscovery {
    // kube::Client has no Debug; show what identifies this source.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeDiscovery")
            .field("namespace", &self.namespace)
            .field("port_name", &self.port_name)
            .field("wake_interval", &self.wake_interval)
            .field("synced", &self.synced())
            .finish_non_exhaustive()
    }
}

enum Watched {
    Autoscaler(Event<DynamicObject>),
    Slice(Event<EndpointSlice>),
}

impl KubeDiscovery {
    /// Watches `namespace` (all when `None`), routes to the slice port `port_name` (first when `None`), and
    /// patches each autoscaler at most once per `wake_interval`.
    pub fn new(
        client: Client,
        namespace: Option<String>,
        port_name: Option<String>,
        wake_interval: Duration,
    ) -> Self {
        Self {
            client,
            namespace,
            port_name,
            wake_interval,
            index: Mutex::new(Index::default()),
            wakers: Mutex::new(HashMap::new()),
            autoscalers_synced: AtomicBool::new(false),
            slices_synced: AtomicBool::new(false),
        }
    }

    fn index(&self) -> std::sync::MutexGuard<'_, Index> {
        // Each update is a single insert/remove/replace, so a poisoned lock still holds a consistent index.
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pushes the index's view into the router and starts a waker for each new model.
    fn publish(self: &Arc<Self>, router: &Arc<Router>) {
        let backends = self.index().backends();
        let mut wakers = self.wakers.lock().unwrap_or_else(|e| e.into_inner());
        for (model, urls) in &backends {
            let entry = router.ensure(model);
            entry.replace_ready(urls);
            if !wakers.contains_key(model) {
                let task = tokio::spawn(self.clone().waker(entry));
                wakers.insert(model.clone(), task.abort_handle());
            }
        }
        for gone in router
            .model_names()
            .into_iter()
            .filter(|m| !backends.contains_key(m))
        {
            info!(model = %gone, "model no longer routed");
            if let Some(e) = router.get(&gone) {
                e.replace_ready(&[]);
            }
            router.remove(&gone);
            // The waker waits on the removed entry's demand; if the model comes back it gets a new entry, so the
            // old task must go, or the new entry would have no waker.
            if let Some(task) = wakers.remove(&gone) {
                task.abort();
            }
        }
    }

    /// Patches the model's autoscalers whenever requests are held with no ready backend.
    async fn waker(self: Arc<Self>, entry: Arc<ModelEntry>) {
        let demand = entry.demand();
        loop {
            demand.notified().await;
            if entry.ready_count() > 0 {
                continue;
            }
            let targets = self.index().autoscalers_for(entry.name());
            if targets.is_empty() {
                warn!(
                    model = entry.name(),
                    "requests are held but no InferenceAutoscaler serves this model"
                );
            }
            for key in targets {
                match wake(&self.client, &key, SystemTime::now()).await {
                    Ok(()) => info!(model = entry.name(), autoscaler = %key.name, namespace = %key.namespace,
                        "woke the controller: scale from zero"),
                    Err(e) => {
                        warn!(model = entry.name(), autoscaler = %key.name, error = %e, "wake-up patch failed")
                    }
                }
            }
            // Coalesce: notifications during this pause leave one permit, so the next wake is at most one later.
            tokio::time::sleep(self.wake_interval).await;
        }
    }

    fn handle(
        &self,
        ev: Watched,
        staged_ias: &mut Vec<DynamicObject>,
        staged_slices: &mut Vec<EndpointSlice>,
    ) {
        let port = self.port_name.as_deref();
        match ev {
            Watched::Autoscaler(ev) => fold_event(ev, staged_ias, |change| {
                let mut index = self.index();
                match change {
                    Change::Apply(o) => {
                        index.apply_autoscaler(ObjectKey::of(&o), AutoscalerRoute::from_object(&o))
                    }
                    Change::Delete(o) => index.delete_autoscaler(&ObjectKey::of(&o)),
                    Change::Reset(all) => {
                        index.reset_autoscalers(
                            all.iter()
                                .map(|o| (ObjectKey::of(o), AutoscalerRoute::from_object(o)))
                                .collect(),
                        );
                        self.autoscalers_synced.store(true, Ordering::Relaxed);
                    }
                }
            }),
            Watched::Slice(ev) => fold_event(ev, staged_slices, |change| {
                let mut index = self.index();
                match change {
                    Change::Apply(s) => {
                        index.apply_slice(ObjectKey::of(&s), SliceBackends::from_slice(&s, port))
                    }
                    Change::Delete(s) => index.delete_slice(&ObjectKey::of(&s)),
                    Change::Reset(all) => {
                        index.reset_slices(
                            all.iter()
                                .map(|s| (ObjectKey::of(s), SliceBackends::from_slice(s, port)))
                                .collect(),
                        );
                        self.slices_synced.store(true, Ordering::Relaxed);
                    }
                }
            }),
        }
    }
}

impl Discovery for KubeDiscovery {
    fn run(self: Arc<Self>, router: Arc<Router>) -> BoxFuture<'static, Result<(), ActivatorError>> {
        Box::pin(async move {
            let ar = autoscaler_resource();
            let (ias, slices): (Api<DynamicObject>, Api<EndpointSlice>) = match &self.namespace {
                Some(ns) => (
                    Api::namespaced_with(self.client.clone(), ns, &ar),
                    Api::namespaced(self.client.clone(), ns),
                ),
                None => (
                    Api::all_with(self.client.clone(), &ar),
                    Api::all(self.client.clone()),
                ),
            };
            // default_backoff: a failing watch retries with exponential backoff instead of ending the stream.
            let ias = watcher::watcher(ias, watcher::Config::default())
                .default_backoff()
                .map(|e| e.map(Watched::Autoscaler));
            let slices = watcher::watcher(slices, watcher::Config::default())
                .default_backoff()
                .map(|e| e.map(Watched::Slice));
            let mut events = std::pin::pin!(futures::stream::select(ias, slices));
            let (mut staged_ias, mut staged_slices) = (Vec::new(), Vec::new());
            // Re-publishing every second restores backends a refused connection took out of rotation.
            let mut resync = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    ev = events.next() => match ev {
                        Some(Ok(ev)) => self.handle(ev, &mut staged_ias, &mut staged_slices),
                        Some(Err(e)) => {
                            warn!(error = %e, "watch failed; retrying with backoff");
                            continue;
                        }
                        None => return Ok(()),
                    },
                    _ = resync.tick() => {}
                }
                if self.synced() {
                    self.publish(&router);
                } else {
                    debug!("waiting for the initial list of InferenceAutoscalers and EndpointSlices");
                }
            }
        })
    }

    fn connect_failed(&self, entry: &ModelEntry, base: &str) {
        // Out of rotation until the next publish (≤ 1 s) or an EndpointSlice change says otherwise.
        entry.set_ready(base, false);
    }

    fn synced(&self) -> bool {
        self.autoscalers_synced.load(Ordering::Relaxed) && self.slices_synced.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use http::{Method, Request, Response};
    use kube::client::Body;

    use crate::activator::router::Router;

    fn key(ns: &str, name: &str) -> ObjectKey {
        ObjectKey {
            namespace: ns.into(),
            name: name.into(),
        }
    }

    fn ias(ns: &str, name: &str, spec: serde_json::Value) -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "tessera.dev/v1alpha1", "kind": "InferenceAutoscaler",
            "metadata": { "name": name, "namespace": ns }, "spec": spec
        }))
        .unwrap()
    }

    fn slice(ns: &str, name: &str, service: &str, endpoints: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": { "name": name, "namespace": ns, "labels": { SERVICE_NAME_LABEL: service } },
            "ports": [ { "name": "metrics", "port": 9090 }, { "name": "http", "port": 8000 } ],
            "endpoints": endpoints
        }))
        .unwrap()
    }

    #[test]
    fn route_reads_model_names_and_service() {
        let r = AutoscalerRoute::from_object(&ias(
            "ml",
            "llama",
            serde_json::json!({
            "scaleTargetRef": { "kind": "Deployment", "name": "llama-vllm" }, "modelNames": ["meta-llama/Llama-3-8B"] }),
        ));
        assert_eq!(r.models, vec!["meta-llama/Llama-3-8B"]);
        assert_eq!(r.service.as_deref(), Some("llama-vllm"));
        // modelNames has no default (the controller would not see the demand); serviceName defaults to the target.
        let r = AutoscalerRoute::from_object(&ias(
            "ml",
            "x",
            serde_json::json!({ "scaleTargetRef": { "name": "d" } }),
        ));
        assert!(r.models.is_empty());
        assert_eq!(r.service.as_deref(), Some("d"));
        let spec = serde_json::json!({ "scaleTargetRef": { "name": "d" }, "serviceName": "svc" });
        let r = AutoscalerRoute::from_object(&ias("ml", "z", spec));
        assert_eq!(r.service.as_deref(), Some("svc"));
        // A spec this version cannot read routes nothing rather than failing the watch.
        assert!(
            AutoscalerRoute::from_object(&ias("ml", "y", serde_json::json!({})))
                .models
                .is_empty()
        );
    }

    #[test]
    fn slice_keeps_only_ready_endpoints_on_the_named_port() {
        let s = slice(
            "ml",
            "llama-abc",
            "llama-vllm",
            serde_json::json!([
                { "addresses": ["10.0.0.1"], "conditions": { "ready": true } },
                { "addresses": ["10.0.0.2"], "conditions": { "ready": false, "terminating": true } },
                { "addresses": ["10.0.0.3"] }
            ]),
        );
        let b = SliceBackends::from_slice(&s, Some("http"));
        assert_eq!(b.urls, vec!["http://10.0.0.1:8000", "http://10.0.0.3:8000"]);
        assert_eq!(
            SliceBackends::from_slice(&s, None).urls[0],
            "http://10.0.0.1:9090"
        );
        assert!(SliceBackends::from_slice(&s, Some("grpc")).urls.is_empty());
    }

    #[test]
    fn index_follows_apply_delete_and_reset() {
        let mut idx = Index::default();
        let route = AutoscalerRoute {
            models: vec!["m".into()],
            service: Some("svc".into()),
        };
        idx.apply_autoscaler(key("ml", "a"), route.clone());
        // Known at zero replicas: present with no backends, so requests are held rather than 404.
        assert_eq!(idx.backends().get("m"), Some(&vec![]));
        let ready = |urls: &[&str]| SliceBackends {
            service: Some("svc".into()),
            model_label: None,
            autoscaler_label: None,
            urls: urls.iter().map(|u| u.to_string()).collect(),
        };
        idx.apply_slice(key("ml", "s1"), ready(&["http://10.0.0.1:8000"]));
        idx.apply_slice(key("ml", "s2"), ready(&["http://10.0.0.2:8000"]));
        // Same service name in another namespace must not leak in.
        idx.apply_slice(key("other", "s3"), ready(&["http://10.9.9.9:8000"]));
        assert_eq!(
            idx.backends()["m"],
            vec!["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
        );
        idx.delete_slice(&key("ml", "s1"));
        assert_eq!(idx.backends()["m"], vec!["http://10.0.0.2:8000"]);
        assert_eq!(idx.autoscalers_for("m"), vec![key("ml", "a")]);
        idx.reset_slices(BTreeMap::new());
        assert_eq!(idx.backends()["m"], Vec::<String>::new());
        idx.delete_autoscaler(&key("ml", "a"));
        assert!(!idx.backends().contains_key("m"));
        // A Service with another name, labelled with the autoscaler's name, serves its models.
        idx.apply_autoscaler(key("ml", "a"), route.clone());
        idx.apply_slice(
            key("ml", "s5"),
            SliceBackends {
                service: Some("other-name".into()),
                autoscaler_label: Some("a".into()),
                ..ready(&["http://10.0.0.5:8000"])
            },
        );
        assert_eq!(idx.backends()["m"], vec!["http://10.0.0.5:8000"]);
        idx.delete_autoscaler(&key("ml", "a"));
        // A labelled Service routes a model without an autoscaler.
        idx.apply_slice(
            key("ml", "s4"),
            SliceBackends {
                model_label: Some("tiny".into()),
                ..ready(&["http://10.0.0.4:80"])
            },
        );
        assert_eq!(idx.backends()["tiny"], vec!["http://10.0.0.4:80"]);
        assert!(idx.autoscalers_for("tiny").is_empty());
    }

    #[tokio::test]
    async fn wake_sends_one_merge_patch_of_the_annotation() {
        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(mock, "default");
        let server = tokio::spawn(async move {
            let (req, send) = handle.next_request().await.expect("one request");
            assert_eq!(req.method(), Method::PATCH);
            assert_eq!(
                req.uri().path(),
                "/apis/tessera.dev/v1alpha1/namespaces/ml/inferenceautoscalers/llama"
            );
            assert!(
                req.uri()
                    .query()
                    .unwrap_or("")
                    .contains("fieldManager=tessera-activator")
            );
            assert_eq!(req.headers()["content-type"], "application/merge-patch+json");
            let body = http_body_util::BodyExt::collect(req.into_body())
                .await
                .unwrap()
                .to_bytes();
            let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(
                json,
                serde_json::json!({ "metadata": { "annotations": { "tessera.dev/activated-at": "1970-01-01T00:16:40.000Z" } } })
            );
            let obj = ias("ml", "llama", serde_json::json!({ "modelNames": ["m"] }));
            send.send_response(Response::new(Body::from(serde_json::to_vec(&obj).unwrap())));
        });
        wake(
            &client,
            &key("ml", "llama"),
            SystemTime::UNIX_EPOCH + Duration::from_secs(1000),
        )
        .await
        .unwrap();
        server.await.unwrap();
    }

    #[tokio::test]
    async fn wake_reports_a_missing_autoscaler() {
        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(mock, "default");
        let server = tokio::spawn(async move {
            let (_, send) = handle.next_request().await.expect("one request");
            let status = serde_json::json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": "inferenceautoscalers.tessera.dev \"llama\" not found", "reason": "NotFound", "code": 404 });
            send.send_response(
                Response::builder()
                    .status(404)
                    .body(Body::from(serde_json::to_vec(&status).unwrap()))
                    .unwrap(),
            );
        });
        let err = wake(&client, &key("ml", "llama"), SystemTime::now())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("not found"), "{err}");
        server.await.unwrap();
    }

    proptest::proptest! {
        /// Incremental apply/delete events end in the same routes as a reset to the final set of objects, whatever
        /// their order — so a missed event can only ever be fixed, never compounded, by the watcher's relist.
        #[test]
        fn incremental_events_equal_a_reset_to_the_final_state(
            events in proptest::collection::vec((0usize..4, proptest::option::of(0u8..3)), 0..30)
        ) {
            let route = AutoscalerRoute { models: vec!["m".into()], service: Some("svc".into()) };
            let slice_for = |i: usize, n: u8| SliceBackends {
                service: Some(if i == 3 { "other".into() } else { "svc".into() }),
                model_label: None,
                autoscaler_label: None,
                urls: (0..n).map(|j| format!("http://10.0.{i}.{j}:8000")).collect(),
            };
            let mut incremental = Index::default();
            incremental.apply_autoscaler(key("ml", "a"), route.clone());
            let mut last: BTreeMap<ObjectKey, SliceBackends> = BTreeMap::new();
            for (i, ev) in &events {
                let k = key("ml", &format!("s{i}"));
                match ev {
                    Some(n) => {
                        incremental.apply_slice(k.clone(), slice_for(*i, *n));
                        last.insert(k, slice_for(*i, *n));
                    }
                    None => {
                        incremental.delete_slice(&k);
                        last.remove(&k);
                    }
                }
            }
            let mut reset = Index::default();
            reset.apply_autoscaler(key("ml", "a"), route);
            reset.reset_slices(last);
            proptest::prop_assert_eq!(incremental.backends(), reset.backends());
            // Only endpoints of the model's own Service are ever routed.
            for url in &incremental.backends()["m"] {
                proptest::prop_assert!(!url.starts_with("http://10.0.3."));
            }
        }
    }

    /// A model that stops being routed and comes back gets a fresh entry *with* a waker (the old waker, bound to
    /// the old entry, must not be left standing in for it).
    #[tokio::test]
    async fn a_model_that_comes_back_can_still_wake_its_autoscaler() {
        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let discovery = Arc::new(KubeDiscovery::new(
            Client::new(mock, "default"),
            None,
            None,
            Duration::from_millis(1),
        ));
        let router = Arc::new(Router::new(10, "test".into(), 0));
        let obj = ias(
            "ml",
            "qwen",
            serde_json::json!({ "scaleTargetRef": { "name": "qwen" }, "modelNames": ["qwen"] }),
        );
        let (mut staged_ias, mut staged_slices) = (Vec::new(), Vec::new());
        for ev in [
            Watched::Autoscaler(Event::Init),
            Watched::Autoscaler(Event::InitDone),
        ] {
            discovery.handle(ev, &mut staged_ias, &mut staged_slices);
        }
        for ev in [Watched::Slice(Event::Init), Watched::Slice(Event::InitDone)] {
            discovery.handle(ev, &mut staged_ias, &mut staged_slices);
        }
        discovery.handle(
            Watched::Autoscaler(Event::Apply(obj.clone())),
            &mut staged_ias,
            &mut staged_slices,
        );
        discovery.publish(&router);
        let first = router.get("qwen").expect("routed");
        discovery.handle(
            Watched::Autoscaler(Event::Delete(obj.clone())),
            &mut staged_ias,
            &mut staged_slices,
        );
        discovery.publish(&router);
        assert!(
            router.get("qwen").is_none(),
            "a deleted autoscaler's model is no longer routed"
        );
        discovery.handle(
            Watched::Autoscaler(Event::Apply(obj.clone())),
            &mut staged_ias,
            &mut staged_slices,
        );
        discovery.publish(&router);
        let second = router.get("qwen").expect("routed again");
        assert!(!Arc::ptr_eq(&first, &second));
        let _held = second.try_enqueue().unwrap();
        let (req, send) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
            .await
            .expect("the new entry's held request must produce a wake-up PATCH")
            .unwrap();
        assert_eq!(req.method(), Method::PATCH);
        send.send_response(Response::new(Body::from(serde_json::to_vec(&obj).unwrap())));
    }

    /// The whole discovery loop against a mocked API server: the initial lists fill the router, `/ready` turns
    /// true, and a request held for a model at zero replicas produces the wake-up PATCH.
    #[tokio::test]
    async fn discovery_lists_then_wakes_the_autoscaler_of_a_held_model() {
        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(mock, "default");
        let (patched_tx, mut patched_rx) = tokio::sync::mpsc::unbounded_channel();
        let api = tokio::spawn(async move {
            // Watch requests are left pending (a quiet cluster); keep their responders alive.
            let mut pending = Vec::new();
            while let Some((req, send)) = handle.next_request().await {
                let path = req.uri().path().to_string();
                let query = req.uri().query().unwrap_or("").to_string();
                if query.contains("watch=true") {
                    pending.push(send);
                    continue;
                }
                let body = match (req.method().clone(), path.as_str()) {
                    (Method::GET, "/apis/discovery.k8s.io/v1/endpointslices") => serde_json::json!({
                        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList",
                        "metadata": { "resourceVersion": "10" },
                        "items": [slice("ml", "llama-1", "llama", serde_json::json!([{ "addresses": ["10.0.0.1"] }]))]
                    }),
                    (Method::GET, "/apis/tessera.dev/v1alpha1/inferenceautoscalers") => serde_json::json!({
                        "apiVersion": "tessera.dev/v1alpha1", "kind": "InferenceAutoscalerList",
                        "metadata": { "resourceVersion": "11" },
                        "items": [
                            ias("ml", "llama", serde_json::json!({ "scaleTargetRef": { "name": "llama" },
                                "modelNames": ["llama-3"] })),
                            ias("ml", "qwen", serde_json::json!({ "scaleTargetRef": { "name": "qwen" }, "modelNames": ["qwen"] })),
                        ]
                    }),
                    (Method::PATCH, p) => {
                        patched_tx.send(p.to_string()).unwrap();
                        serde_json::to_value(ias("ml", "qwen", serde_json::json!({}))).unwrap()
                    }
                    other => panic!("unexpected request {other:?} {query}"),
                };
                send.send_response(Response::new(Body::from(serde_json::to_vec(&body).unwrap())));
            }
        });
        let discovery = Arc::new(KubeDiscovery::new(
            client,
            None,
            Some("http".into()),
            Duration::from_secs(60),
        ));
        let router = Arc::new(Router::new(10, "test".into(), 0));
        let task = tokio::spawn(discovery.clone().run(router.clone()));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while router.get("qwen").is_none() || router.get("llama-3").is_none_or(|e| e.ready_count() == 0) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the router never got the listed backends"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(discovery.synced());
        let llama = router.get("llama-3").unwrap();
        assert_eq!(llama.pick().unwrap().backend().base, "http://10.0.0.1:8000");
        // qwen is known at zero replicas: a held request wakes its autoscaler, once.
        let qwen = router.get("qwen").unwrap();
        assert_eq!(qwen.ready_count(), 0);
        let _held = qwen.try_enqueue().unwrap();
        let patched = tokio::time::timeout(Duration::from_secs(10), patched_rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            patched,
            "/apis/tessera.dev/v1alpha1/namespaces/ml/inferenceautoscalers/qwen"
        );
        // A second held request within --wake-interval is coalesced: no second PATCH.
        let _held2 = qwen.try_enqueue().unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(200), patched_rx.recv())
                .await
                .is_err()
        );
        task.abort();
        api.abort();
    }
}
