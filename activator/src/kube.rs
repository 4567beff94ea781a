//! Kubernetes discovery: ready backends per model from EndpointSlices, models from InferenceAutoscalers, and the
//! Warning Events for model names claimed twice in one namespace.
//!
//! **Tenants are namespaces.** A route is `(namespace, model)`. An `InferenceAutoscaler` lists the OpenAI model
//! names it serves in `spec.modelNames`; its pods are found through the EndpointSlices of the Service
//! `spec.serviceName` (default: the name of its `spec.scaleTargetRef`), *in the autoscaler's own namespace*.
//! Nothing else routes: a Service that no InferenceAutoscaler in its namespace names receives no request, whatever
//! its labels say, so no team can attract another team's prompts by labelling a Service.
//!
//! **Collisions.** Two InferenceAutoscalers in one namespace claiming the same model name would split that
//! name's traffic between two workloads nobody chose to merge. The oldest claim (creation time, then name) keeps
//! the name; the others are refused for it, reported once per collision as a `Warning` Event
//! (`events.k8s.io/v1`, reason `ModelNameCollision`) on each refused autoscaler and counted in
//! `tessera_activator_model_name_collisions`. The same name in two namespaces is no collision: two models.
//!
//! **Writes.** The activator writes nothing to the API except those Events (created, never patched). Waking a
//! model from zero is the controller's job: it polls every activator's stats and sees `queued > 0`.
//!
//! The [`Index`] is pure (events in, routes out) so it is tested without an API server; the CR is read as a
//! `DynamicObject` so the activator does not need the controller's Rust types to follow the schema.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event as KubeEvent;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use tessera_core::wire::activator::model_key;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::ActivatorError;
use super::discovery::{Collision, Discovery};
use super::router::{ModelEntry, Router};
use tessera_runtime::watch_events::{Change, fold_event};

/// The label Kubernetes puts on every EndpointSlice naming its Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// `reportingController` of the Events the activator writes.
const REPORTING_CONTROLLER: &str = "tessera.dev/activator";
/// The Event reason for a model name claimed twice in one namespace.
pub const COLLISION_REASON: &str = "ModelNameCollision";
/// Most Events waiting to be written; beyond it new ones are dropped (and logged): a burst of collisions must not
/// grow memory or flood the API server.
const EVENT_QUEUE: usize = 64;
/// Longest one Event write may take.
const EVENT_TIMEOUT: Duration = Duration::from_secs(10);

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
#[derive(Debug, Clone, PartialEq)]
pub struct AutoscalerRoute {
    /// OpenAI model names (`spec.modelNames`).
    pub models: Vec<String>,
    /// The Service whose EndpointSlices hold the model's pods.
    pub service: Option<String>,
    /// `metadata.creationTimestamp` (RFC 3339, so it sorts as text): the older claim wins a collision.
    pub created: Option<String>,
    /// `metadata.uid`, for the Event's `regarding`.
    pub uid: Option<String>,
    /// `status.flexNeighbours`: when the controller read them, and each pod's figure by pod IP.
    pub neighbours: Option<Neighbours>,
}

/// The flex lane's neighbour figures of one model's pods: when the controller read them, and each pod's worst
/// neighbour's TTFT pressure by pod IP.
pub type Neighbours = (std::time::SystemTime, BTreeMap<String, f64>);

/// Reads `status.flexNeighbours`; a malformed one is no figure (the lane then reads only the pod's own room).
fn neighbours_of(obj: &DynamicObject) -> Option<Neighbours> {
    let raw = obj.data.pointer("/status/flexNeighbours")?;
    let st: tessera_api::crd::FlexNeighboursStatus = serde_json::from_value(raw.clone()).ok()?;
    let at = std::time::SystemTime::from(st.observed_at.0);
    let by_ip = st
        .pods
        .into_iter()
        .filter_map(|p| Some((p.pod_ip?, p.pressure)))
        .filter(|(_, p)| p.is_finite())
        .collect();
    Some((at, by_ip))
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
            created: obj.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string()),
            uid: obj.metadata.uid.clone(),
            neighbours: neighbours_of(obj),
        }
    }
}

/// What one EndpointSlice contributes: its Service and its ready addresses as URLs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceBackends {
    /// `kubernetes.io/service-name`.
    pub service: Option<String>,
    /// `http://addr:port` for each ready endpoint address.
    pub urls: Vec<String>,
    /// The host (`10.0.0.7`, `[fd00::7]`) of each endpoint that is not ready and not terminating: a replica
    /// starting, or one asleep, which a held request may ask to wake (`--sidecar-port`).
    pub not_ready: Vec<String>,
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
        let host = |a: &String| if ipv6 { format!("[{a}]") } else { a.clone() };
        // `endpoints` became optional in 1.36's schema; an absent list is an empty one.
        let endpoints = slice.endpoints.as_deref().unwrap_or_default();
        let not_ready = endpoints
            .iter()
            .filter(|e| {
                let c = e.conditions.as_ref();
                !c.and_then(|c| c.ready).unwrap_or(true) && !c.and_then(|c| c.terminating).unwrap_or(false)
            })
            .flat_map(|e| e.addresses.first())
            .map(host)
            .collect();
        let urls = match port {
            // A slice with no usable port has no backends (e.g. the Service has no matching port yet).
            None => Vec::new(),
            Some(port) => endpoints
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
            urls,
            not_ready,
        }
    }
}

/// Routing state fed by watch events; pure, so it is tested with `apply`/`delete`/`reset` alone.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Index {
    autoscalers: BTreeMap<ObjectKey, AutoscalerRoute>,
    slices: BTreeMap<ObjectKey, SliceBackends>,
}

/// What the index routes now.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Routes {
    /// Ready backend URLs per [`model_key`]; a model at zero replicas maps to an empty list, so the activator
    /// knows it and holds its requests instead of answering 404.
    pub backends: BTreeMap<String, Vec<String>>,
    /// Model names claimed more than once within a namespace.
    pub collisions: Vec<Collision>,
    /// Hosts of not-ready, not-terminating endpoints per [`model_key`] (see [`SliceBackends::not_ready`]).
    pub not_ready: BTreeMap<String, Vec<String>>,
    /// The flex lane's neighbour figures per [`model_key`] (see [`AutoscalerRoute::neighbours`]).
    pub neighbours: BTreeMap<String, Neighbours>,
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

    /// The `uid` of an autoscaler, if known.
    pub fn uid_of(&self, key: &ObjectKey) -> Option<String> {
        self.autoscalers.get(key).and_then(|r| r.uid.clone())
    }

    /// What is routed now: each model name of each namespace to the ready endpoints of the one Service its
    /// (oldest) InferenceAutoscaler names in that namespace.
    pub fn routes(&self) -> Routes {
        // One pass over the slices grouped by (namespace, Service), then one lookup per autoscaler: linear in the
        // number of objects, since this runs on every watch event in clusters with thousands of slices.
        let mut by_service: BTreeMap<(&str, &str), Vec<&String>> = BTreeMap::new();
        let mut waiting: BTreeMap<(&str, &str), Vec<&String>> = BTreeMap::new();
        for (k, slice) in &self.slices {
            if let Some(svc) = &slice.service {
                by_service
                    .entry((&k.namespace, svc))
                    .or_default()
                    .extend(&slice.urls);
                waiting
                    .entry((&k.namespace, svc))
                    .or_default()
                    .extend(&slice.not_ready);
            }
        }
        // Claims per (namespace, model), oldest first.
        let mut claims: BTreeMap<(&str, &str), Vec<(&ObjectKey, &AutoscalerRoute)>> = BTreeMap::new();
        for (key, route) in &self.autoscalers {
            let mut seen = BTreeSet::new();
            for model in &route.models {
                // A name listed twice by one autoscaler is one claim.
                if seen.insert(model.as_str()) {
                    claims
                        .entry((key.namespace.as_str(), model.as_str()))
                        .or_default()
                        .push((key, route));
                }
            }
        }
        let mut out = Routes::default();
        for ((namespace, model), mut owners) in claims {
            // A missing creation time (never set by a real API server) sorts last, then by name.
            owners.sort_by(|(ka, ra), (kb, rb)| {
                (ra.created.is_none(), &ra.created, &ka.name).cmp(&(
                    rb.created.is_none(),
                    &rb.created,
                    &kb.name,
                ))
            });
            let (chosen, route) = owners[0];
            if owners.len() > 1 {
                out.collisions.push(Collision {
                    namespace: namespace.to_string(),
                    model: model.to_string(),
                    chosen: chosen.name.clone(),
                    refused: owners[1..].iter().map(|(k, _)| k.name.clone()).collect(),
                });
            }
            let urls: BTreeSet<String> = route
                .service
                .as_deref()
                .and_then(|svc| by_service.get(&(namespace, svc)))
                .into_iter()
                .flatten()
                .map(|u| (*u).clone())
                .collect();
            let hosts: BTreeSet<String> = route
                .service
                .as_deref()
                .and_then(|svc| waiting.get(&(namespace, svc)))
                .into_iter()
                .flatten()
                .map(|h| (*h).clone())
                .collect();
            if !hosts.is_empty() {
                out.not_ready
                    .insert(model_key(namespace, model), hosts.into_iter().collect());
            }
            if let Some(n) = &route.neighbours {
                out.neighbours.insert(model_key(namespace, model), n.clone());
            }
            out.backends
                .insert(model_key(namespace, model), urls.into_iter().collect());
        }
        out
    }
}

/// Builds the `Warning` Event on a refused autoscaler (`events.k8s.io/v1`; `regarding` is the autoscaler).
pub fn collision_event(
    c: &Collision,
    refused: &str,
    uid: Option<&str>,
    instance: &str,
    at: SystemTime,
) -> Result<KubeEvent, serde_json::Error> {
    let note = format!(
        "model name {:?} is already claimed by InferenceAutoscaler {:?} in namespace {:?}; this autoscaler gets no \
         traffic for it until one of the two drops the name from spec.modelNames",
        c.model, c.chosen, c.namespace
    );
    serde_json::from_value(serde_json::json!({
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": { "generateName": format!("{refused}."), "namespace": c.namespace },
        "eventTime": humantime::format_rfc3339_micros(at).to_string(),
        "type": "Warning",
        "reason": COLLISION_REASON,
        "action": "Route",
        "note": note,
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": instance,
        "regarding": {
            "apiVersion": "tessera.dev/v1alpha1",
            "kind": "InferenceAutoscaler",
            "namespace": c.namespace,
            "name": refused,
            "uid": uid,
        },
    }))
}

/// One Event to write.
#[derive(Debug)]
struct PendingEvent {
    namespace: String,
    event: KubeEvent,
}

/// Writes queued Events one at a time, each bounded by [`EVENT_TIMEOUT`]; a failure is logged, never retried
/// (the next collision change reports again).
async fn write_events(client: Client, mut rx: mpsc::Receiver<PendingEvent>) {
    while let Some(p) = rx.recv().await {
        let api: Api<KubeEvent> = Api::namespaced(client.clone(), &p.namespace);
        match tokio::time::timeout(EVENT_TIMEOUT, api.create(&PostParams::default(), &p.event)).await {
            Ok(Ok(_)) => debug!(namespace = %p.namespace, "wrote a Warning Event"),
            Ok(Err(e)) => warn!(namespace = %p.namespace, error = %e, "could not write an Event"),
            Err(_) => warn!(namespace = %p.namespace, "writing an Event timed out"),
        }
    }
}

/// Discovery from the Kubernetes API.
pub struct KubeDiscovery {
    client: Client,
    namespace: Option<String>,
    port_name: Option<String>,
    instance: String,
    index: Mutex<Index>,
    /// The collisions already reported, so each is reported once while it lasts.
    collisions: Mutex<Vec<Collision>>,
    events: mpsc::Sender<PendingEvent>,
    events_rx: Mutex<Option<mpsc::Receiver<PendingEvent>>>,
    autoscalers_synced: AtomicBool,
    slices_synced: AtomicBool,
    /// The sidecars' port (`--sidecar-port`): with it, a held request asks each not-ready replica's sidecar to wake.
    sidecar_port: Option<u16>,
    /// Not-ready hosts per model key, as of the last publish.
    not_ready: Mutex<BTreeMap<String, Vec<String>>>,
    waker: super::discovery::Waker,
}

impl std::fmt::Debug for KubeDiscovery {
    // kube::Client has no Debug; show what identifies this source.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeDiscovery")
            .field("namespace", &self.namespace)
            .field("port_name", &self.port_name)
            .field("synced", &self.synced())
            .finish_non_exhaustive()
    }
}

enum Watched {
    Autoscaler(Event<DynamicObject>),
    Slice(Event<EndpointSlice>),
}

impl KubeDiscovery {
    /// Watches `namespace` (all when `None`) and routes to the slice port `port_name` (first when `None`);
    /// `instance` names this activator in the Events it writes.
    pub fn new(
        client: Client,
        namespace: Option<String>,
        port_name: Option<String>,
        instance: String,
    ) -> Self {
        let (events, events_rx) = mpsc::channel(EVENT_QUEUE);
        Self {
            client,
            namespace,
            port_name,
            instance,
            index: Mutex::new(Index::default()),
            collisions: Mutex::new(Vec::new()),
            events,
            events_rx: Mutex::new(Some(events_rx)),
            autoscalers_synced: AtomicBool::new(false),
            slices_synced: AtomicBool::new(false),
            sidecar_port: None,
            not_ready: Mutex::new(BTreeMap::new()),
            waker: super::discovery::Waker::new(),
        }
    }

    /// Wakes sleeping replicas through their sidecars on this port (the webhook's `--sidecar-port`).
    pub fn with_sidecar_port(mut self, port: Option<u16>) -> Self {
        self.sidecar_port = port;
        self
    }

    fn index(&self) -> std::sync::MutexGuard<'_, Index> {
        // Each update is a single insert/remove/replace, so a poisoned lock still holds a consistent index.
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pushes the index's view into the router and reports new collisions.
    fn publish(&self, router: &Router) {
        let (routes, uids) = {
            let index = self.index();
            let routes = index.routes();
            let uids: BTreeMap<String, Option<String>> = routes
                .collisions
                .iter()
                .flat_map(|c| {
                    c.refused.iter().map(|name| {
                        let key = ObjectKey {
                            namespace: c.namespace.clone(),
                            name: name.clone(),
                        };
                        (format!("{}/{name}", c.namespace), index.uid_of(&key))
                    })
                })
                .collect();
            (routes, uids)
        };
        for (key, urls) in &routes.backends {
            if let Some((namespace, model)) = tessera_core::wire::activator::split_model_key(key) {
                let entry = router.ensure(namespace, model);
                entry.replace_ready(urls);
                entry.set_neighbours(routes.neighbours.get(key));
            }
        }
        *self.not_ready.lock().unwrap_or_else(|e| e.into_inner()) = routes.not_ready.clone();
        for gone in router
            .keys()
            .into_iter()
            .filter(|k| !routes.backends.contains_key(k))
        {
            info!(model = %gone, "model no longer routed");
            if let Some(e) = router.get_key(&gone) {
                e.replace_ready(&[]);
            }
            router.remove_key(&gone);
        }
        let mut reported = self.collisions.lock().unwrap_or_else(|e| e.into_inner());
        for c in routes.collisions.iter().filter(|c| !reported.contains(c)) {
            for refused in &c.refused {
                warn!(namespace = %c.namespace, model = %c.model, kept = %c.chosen, refused = %refused,
                    "model name claimed by two InferenceAutoscalers in one namespace; routing only the older");
                let uid = uids.get(&format!("{}/{refused}", c.namespace)).cloned().flatten();
                match collision_event(c, refused, uid.as_deref(), &self.instance, SystemTime::now()) {
                    Ok(event) => {
                        let pending = PendingEvent {
                            namespace: c.namespace.clone(),
                            event,
                        };
                        if self.events.try_send(pending).is_err() {
                            warn!("the Event queue is full; dropping a collision Event (still logged here)");
                        }
                    }
                    Err(e) => warn!(error = %e, "could not build a collision Event"),
                }
            }
        }
        *reported = routes.collisions;
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
            if let Some(rx) = self.events_rx.lock().unwrap_or_else(|e| e.into_inner()).take() {
                tokio::spawn(write_events(self.client.clone(), rx));
            }
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
            let ias = watcher::watcher(ias, tessera_runtime::kube_client::watcher_config())
                .default_backoff()
                .map(|e| e.map(Watched::Autoscaler));
            let slices = watcher::watcher(slices, tessera_runtime::kube_client::watcher_config())
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

    fn wake(&self, entry: &ModelEntry) {
        let Some(port) = self.sidecar_port else {
            return;
        };
        let key = model_key(entry.namespace(), entry.name());
        let hosts = self
            .not_ready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned()
            .unwrap_or_default();
        // A replica still starting answers too (404 without sleep mode, or at once while awake): harmless.
        for host in hosts {
            self.waker.wake(entry, &format!("http://{host}:{port}"));
        }
    }

    fn collisions(&self) -> Vec<Collision> {
        self.collisions.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use http::{Method, Request, Response};
    use kube::client::Body;

    use crate::router::{Admission, Router};

    fn key(ns: &str, name: &str) -> ObjectKey {
        ObjectKey {
            namespace: ns.into(),
            name: name.into(),
        }
    }

    fn ias(ns: &str, name: &str, spec: serde_json::Value) -> DynamicObject {
        ias_at(ns, name, "2026-01-01T00:00:00Z", spec)
    }

    fn ias_at(ns: &str, name: &str, created: &str, spec: serde_json::Value) -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "tessera.dev/v1alpha1", "kind": "InferenceAutoscaler",
            "metadata": { "name": name, "namespace": ns, "uid": format!("uid-{name}"), "creationTimestamp": created },
            "spec": spec
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

    fn route(models: &[&str], service: &str, created: &str) -> AutoscalerRoute {
        AutoscalerRoute {
            models: models.iter().map(|m| m.to_string()).collect(),
            service: Some(service.into()),
            created: Some(created.into()),
            uid: None,
            neighbours: None,
        }
    }

    fn ready(service: &str, urls: &[&str]) -> SliceBackends {
        SliceBackends {
            service: Some(service.into()),
            urls: urls.iter().map(|u| u.to_string()).collect(),
            not_ready: Vec::new(),
        }
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
        assert_eq!(r.created.as_deref(), Some("2026-01-01T00:00:00Z"));
        assert_eq!(r.uid.as_deref(), Some("uid-llama"));
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

    /// The controller's `status.flexNeighbours` reaches the backend's room by pod IP, and stops counting once old.
    #[test]
    fn neighbour_figures_reach_the_backends_by_pod_ip() {
        let spec = serde_json::json!({ "scaleTargetRef": { "name": "d" }, "modelNames": ["m"] });
        let mut obj = ias("ml", "m", spec);
        let written = |at: std::time::SystemTime| {
            serde_json::json!({ "flexNeighbours": {
                "observedAt": k8s_openapi::jiff::Timestamp::try_from(at).unwrap().to_string(),
                "pods": [ { "pod": "d-1", "podIP": "10.0.0.1", "pressure": 0.93 }, { "pod": "d-2", "pressure": 0.5 } ]
            }})
        };
        obj.data["status"] = written(std::time::SystemTime::now());
        let r = AutoscalerRoute::from_object(&obj);
        let (_, by_ip) = r.neighbours.clone().unwrap();
        // A pod without an IP cannot be matched to an endpoint: left out.
        assert_eq!(
            by_ip.into_iter().collect::<Vec<_>>(),
            vec![("10.0.0.1".to_owned(), 0.93)]
        );
        let mut index = Index::default();
        index.apply_autoscaler(key("ml", "m"), r);
        index.apply_slice(
            key("ml", "s"),
            ready("d", &["http://10.0.0.1:8000", "http://10.0.0.2:8000"]),
        );
        let routes = index.routes();
        let router = Router::new(10, Admission::new(100, 100), "test".into(), 0);
        let entry = router.ensure("ml", "m");
        entry.replace_ready(&routes.backends["ml/m"]);
        entry.set_neighbours(routes.neighbours.get("ml/m"));
        let rooms: Vec<Option<f64>> = entry
            .ready_backends()
            .iter()
            .map(|b| b.room(tokio::time::Instant::now()).neighbours)
            .collect();
        assert_eq!(rooms, vec![Some(0.93), None]);
        // A figure's age goes with it (the gate does not read an old one: `tessera_core::lanes`' tests).
        obj.data["status"] = written(std::time::SystemTime::now() - std::time::Duration::from_secs(600));
        let stale = AutoscalerRoute::from_object(&obj).neighbours;
        entry.set_neighbours(stale.as_ref());
        let room = entry.ready_backends()[0].room(tokio::time::Instant::now());
        assert!(
            room.neighbours_age
                .is_some_and(|a| a > tessera_core::lanes::NEIGHBOURS_MAX_AGE),
            "{room:?}"
        );
        let limits = tessera_core::lanes::LaneLimits::default();
        assert_eq!(tessera_core::lanes::admit_flex(&room, &limits, 0), Ok(()));
        // A malformed status is no figure, not a failed watch.
        obj.data["status"] = serde_json::json!({ "flexNeighbours": { "pods": "x" } });
        assert_eq!(AutoscalerRoute::from_object(&obj).neighbours, None);
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
        // Not ready and not terminating (starting, or asleep): a held request may ask it to wake.
        let s = slice(
            "ml",
            "llama-abc",
            "llama-vllm",
            serde_json::json!([
                { "addresses": ["10.0.0.4"], "conditions": { "ready": false } },
                { "addresses": ["10.0.0.2"], "conditions": { "ready": false, "terminating": true } }
            ]),
        );
        let b = SliceBackends::from_slice(&s, Some("http"));
        assert_eq!(b.not_ready, vec!["10.0.0.4"]);
        let mut idx = Index::default();
        idx.apply_autoscaler(key("ml", "a"), route(&["m"], "llama-vllm", "t1"));
        idx.apply_slice(key("ml", "s"), b);
        assert_eq!(
            idx.routes().not_ready.get("ml/m"),
            Some(&vec!["10.0.0.4".to_string()])
        );
    }

    #[test]
    fn index_follows_apply_delete_and_reset() {
        let mut idx = Index::default();
        idx.apply_autoscaler(key("ml", "a"), route(&["m"], "svc", "t1"));
        // Known at zero replicas: present with no backends, so requests are held rather than 404.
        assert_eq!(idx.routes().backends.get("ml/m"), Some(&vec![]));
        idx.apply_slice(key("ml", "s1"), ready("svc", &["http://10.0.0.1:8000"]));
        idx.apply_slice(key("ml", "s2"), ready("svc", &["http://10.0.0.2:8000"]));
        assert_eq!(
            idx.routes().backends["ml/m"],
            vec!["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
        );
        idx.delete_slice(&key("ml", "s1"));
        assert_eq!(idx.routes().backends["ml/m"], vec!["http://10.0.0.2:8000"]);
        idx.reset_slices(BTreeMap::new());
        assert_eq!(idx.routes().backends["ml/m"], Vec::<String>::new());
        idx.delete_autoscaler(&key("ml", "a"));
        assert!(idx.routes().backends.is_empty());
    }

    /// The defect: a Service in `team-b` received `team-a`'s prompts (names were cluster-wide, and any labelled
    /// Service joined). Now a route is (namespace, model), and only the Service its own namespace's autoscaler
    /// names serves it.
    #[test]
    fn tenants_are_namespaces() {
        let mut idx = Index::default();
        idx.apply_autoscaler(key("team-a", "llama"), route(&["llama"], "llama", "t1"));
        idx.apply_slice(key("team-a", "s"), ready("llama", &["http://10.1.0.1:8000"]));
        // team-b: a Service with the same name, and another one, but no autoscaler claims either.
        idx.apply_slice(key("team-b", "s"), ready("llama", &["http://10.2.0.1:8000"]));
        idx.apply_slice(key("team-b", "t"), ready("evil", &["http://10.2.0.2:8000"]));
        let r = idx.routes();
        assert_eq!(r.backends.len(), 1, "{r:?}");
        assert_eq!(r.backends["team-a/llama"], vec!["http://10.1.0.1:8000"]);
        // team-b claims the same name for its own Service: a second, separate model — not a collision.
        idx.apply_autoscaler(key("team-b", "mine"), route(&["llama"], "evil", "t0"));
        let r = idx.routes();
        assert!(r.collisions.is_empty());
        assert_eq!(r.backends["team-a/llama"], vec!["http://10.1.0.1:8000"]);
        assert_eq!(r.backends["team-b/llama"], vec!["http://10.2.0.2:8000"]);
        // An autoscaler naming a Service of another namespace gets nothing from it (same-namespace only).
        idx.apply_autoscaler(key("team-c", "x"), route(&["x"], "llama", "t0"));
        assert!(idx.routes().backends["team-c/x"].is_empty());
    }

    #[test]
    fn a_collision_keeps_the_oldest_claim_and_is_reported() {
        let mut idx = Index::default();
        idx.apply_autoscaler(
            key("ml", "new"),
            route(&["m", "other"], "svc-new", "2026-02-01T00:00:00Z"),
        );
        idx.apply_autoscaler(
            key("ml", "old"),
            route(&["m", "m"], "svc-old", "2026-01-01T00:00:00Z"),
        );
        idx.apply_slice(key("ml", "a"), ready("svc-old", &["http://10.0.0.1:8000"]));
        idx.apply_slice(key("ml", "b"), ready("svc-new", &["http://10.0.0.2:8000"]));
        let r = idx.routes();
        assert_eq!(r.backends["ml/m"], vec!["http://10.0.0.1:8000"]);
        // The refused autoscaler keeps its other, uncontested names.
        assert_eq!(r.backends["ml/other"], vec!["http://10.0.0.2:8000"]);
        assert_eq!(
            r.collisions,
            vec![Collision {
                namespace: "ml".into(),
                model: "m".into(),
                chosen: "old".into(),
                refused: vec!["new".into()],
            }]
        );
        idx.delete_autoscaler(&key("ml", "old"));
        let r = idx.routes();
        assert!(r.collisions.is_empty());
        assert_eq!(r.backends["ml/m"], vec!["http://10.0.0.2:8000"]);
    }

    #[test]
    fn the_collision_event_is_a_warning_about_the_refused_autoscaler() {
        let c = Collision {
            namespace: "ml".into(),
            model: "m".into(),
            chosen: "old".into(),
            refused: vec!["new".into()],
        };
        let ev = collision_event(&c, "new", Some("u-1"), "act-0", SystemTime::UNIX_EPOCH).unwrap();
        let json = serde_json::to_value(&ev).unwrap();
        assert_eq!(json["type"], "Warning");
        assert_eq!(json["reason"], COLLISION_REASON);
        assert_eq!(json["reportingController"], "tessera.dev/activator");
        assert_eq!(json["reportingInstance"], "act-0");
        assert_eq!(json["regarding"]["kind"], "InferenceAutoscaler");
        assert_eq!(json["regarding"]["name"], "new");
        assert_eq!(json["regarding"]["uid"], "u-1");
        assert_eq!(json["metadata"]["generateName"], "new.");
        assert!(
            json["eventTime"]
                .as_str()
                .unwrap()
                .starts_with("1970-01-01T00:00:00")
        );
        assert!(json["note"].as_str().unwrap().contains("\"old\""));
    }

    proptest::proptest! {
        /// Incremental apply/delete events end in the same routes as a reset to the final set of objects, whatever
        /// their order — so a missed event can only ever be fixed, never compounded, by the watcher's relist.
        #[test]
        fn incremental_events_equal_a_reset_to_the_final_state(
            events in proptest::collection::vec((0usize..4, proptest::option::of(0u8..3)), 0..30)
        ) {
            let slice_for = |i: usize, n: u8| SliceBackends {
                service: Some(if i == 3 { "other".into() } else { "svc".into() }),
                urls: (0..n).map(|j| format!("http://10.0.{i}.{j}:8000")).collect(),
                not_ready: Vec::new(),
            };
            let mut incremental = Index::default();
            incremental.apply_autoscaler(key("ml", "a"), route(&["m"], "svc", "t"));
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
            reset.apply_autoscaler(key("ml", "a"), route(&["m"], "svc", "t"));
            reset.reset_slices(last);
            proptest::prop_assert_eq!(incremental.routes(), reset.routes());
            // Only endpoints of the model's own Service are ever routed.
            for url in &incremental.routes().backends["ml/m"] {
                proptest::prop_assert!(!url.starts_with("http://10.0.3."));
            }
        }
    }

    /// The whole discovery loop against a mocked API server: the initial lists fill the router keyed by
    /// namespace, `/ready` turns true, a held request at zero writes nothing to the API (the controller polls the
    /// stats instead), and a collision produces exactly one Warning Event (POST, never a PATCH).
    #[tokio::test]
    async fn discovery_lists_routes_and_writes_only_collision_events() {
        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(mock, "default");
        let (writes_tx, mut writes_rx) = tokio::sync::mpsc::unbounded_channel();
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
                let method = req.method().clone();
                let body = match (method.clone(), path.as_str()) {
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
                            ias_at("ml", "qwen-copy", "2026-06-01T00:00:00Z",
                                serde_json::json!({ "scaleTargetRef": { "name": "q2" }, "modelNames": ["qwen"] })),
                        ]
                    }),
                    (_, p) => {
                        let bytes = http_body_util::BodyExt::collect(req.into_body())
                            .await
                            .unwrap()
                            .to_bytes();
                        let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
                        writes_tx.send((method, p.to_string(), json.clone())).unwrap();
                        json
                    }
                };
                send.send_response(Response::new(Body::from(serde_json::to_vec(&body).unwrap())));
            }
        });
        let discovery = Arc::new(KubeDiscovery::new(
            client,
            None,
            Some("http".into()),
            "act-0".into(),
        ));
        let router = Arc::new(Router::new(10, Admission::new(100, 100), "test".into(), 0));
        let task = tokio::spawn(discovery.clone().run(router.clone()));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while router.get("ml", "qwen").is_none()
            || router.get("ml", "llama-3").is_none_or(|e| e.ready_count() == 0)
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the router never got the listed backends"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(discovery.synced());
        assert!(
            router.get("other", "llama-3").is_none(),
            "routes are per namespace"
        );
        let llama = router.get("ml", "llama-3").unwrap();
        assert_eq!(llama.pick().unwrap().backend().base, "http://10.0.0.1:8000");
        let (method, path, event) = tokio::time::timeout(Duration::from_secs(10), writes_rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(method, Method::POST);
        assert_eq!(path, "/apis/events.k8s.io/v1/namespaces/ml/events");
        assert_eq!(event["reason"], COLLISION_REASON);
        assert_eq!(event["regarding"]["name"], "qwen-copy");
        assert_eq!(discovery.collisions().len(), 1);
        // qwen is known at zero replicas; holding a request for it writes nothing, and the collision is not
        // reported again on the next publishes.
        let qwen = router.get("ml", "qwen").unwrap();
        assert_eq!(qwen.ready_count(), 0);
        let _held = qwen.try_enqueue().unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(2_500), writes_rx.recv())
                .await
                .is_err(),
            "no API write other than the one Event"
        );
        task.abort();
        api.abort();
    }
}
