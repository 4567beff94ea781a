//! The admission handler: parse the `AdmissionReview`, find the pod's policy, reserve GPU room for fractional
//! pods, call the pure [`mutate`](crate::mutate::mutate), and answer. Every failure admits the pod unchanged
//! (fail open), counted under a fixed label, logged, and reported as an Event on the pod's owner.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::UserInfo;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::{DynamicObject, GroupVersionKind, GroupVersionResource, TypeMeta};
use kube::runtime::reflector::Store;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;
use tessera_api::crd::InferenceAutoscaler;
use tessera_pool::{PoolError, PoolManager, ReserveRequest};
use tessera_runtime::metrics::{register_value, register_with_unit};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::mutate::{self, Config, Context, Mutation, Plan, Unchanged};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AdmissionLabels {
    outcome: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// The webhook's metrics (`tessera_webhook_*`). Cheap to clone.
#[derive(Debug, Clone)]
pub struct Metrics {
    admissions: Family<AdmissionLabels, Counter>,
    duration: Histogram,
    events_dropped: Counter,
    tls_reloads: Family<ResultLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            admissions: Family::default(),
            // 100 µs .. ~1.6 s: admissions take about a millisecond, a reservation up to its timeout.
            duration: Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                0.0001, 2.0, 15,
            )),
            events_dropped: Counter::default(),
            tls_reloads: Family::default(),
        }
    }
}

impl Metrics {
    /// Creates the metrics and registers them into `registry` (the root registry).
    pub fn register(registry: &mut Registry) -> Self {
        // The metrics as `Default` builds them (the histogram's buckets live there), each registered.
        let fresh = Self::default();
        let r = registry.sub_registry_with_prefix("tessera_webhook");
        Self {
            admissions: register_value(
                r,
                "admissions",
                "Pod admissions by outcome (mutated, unchanged, denied, invalid) and fixed reason",
                fresh.admissions,
            ),
            duration: register_with_unit(
                r,
                "admission_duration",
                "Time to answer an admission review, including any GPU reservation",
                prometheus_client::registry::Unit::Seconds,
                fresh.duration,
            ),
            events_dropped: register_value(
                r,
                "events_dropped",
                "Kubernetes Events not sent because the event queue was full",
                fresh.events_dropped,
            ),
            tls_reloads: register_value(
                r,
                "tls_reloads",
                "Certificate reloads after the files changed, by result",
                fresh.tls_reloads,
            ),
        }
    }

    fn admission(&self, outcome: &'static str, reason: &'static str) {
        self.admissions
            .get_or_create(&AdmissionLabels { outcome, reason })
            .inc();
    }

    /// Counts a certificate reload (`ok` or `error`).
    pub fn tls_reload(&self, result: &'static str) {
        self.tls_reloads.get_or_create(&ResultLabels { result }).inc();
    }
}

/// Where policies come from.
#[derive(Debug, Clone)]
pub enum Policies {
    /// `--no-kube`: no policies; every pod is injected in whole mode.
    None,
    /// A reflector store of InferenceAutoscalers and whether it has synced.
    Store(Store<InferenceAutoscaler>, Arc<AtomicBool>),
}

/// A Kubernetes Event to publish on a pod's owner.
#[derive(Debug, Clone)]
pub struct EventJob {
    /// The owner.
    pub regarding: ObjectReference,
    /// PascalCase reason.
    pub reason: String,
    /// The message.
    pub note: String,
}

/// The admission handler. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Admitter {
    /// What to inject.
    pub config: Arc<Config>,
    /// The policy cache.
    pub policies: Policies,
    /// One pool manager per configured pool (empty without `--pools-config` or with `--no-kube`).
    pub pools: Arc<HashMap<String, PoolManager>>,
    /// The longest a reservation may take before the pod is admitted unchanged.
    pub reservation_timeout: Duration,
    /// Metrics.
    pub metrics: Metrics,
    /// Events to publish (bounded; dropped when full).
    pub events: Option<mpsc::Sender<EventJob>>,
    /// Pools whose capacity pods have not been listed yet (ready at 0).
    pub pools_unsynced: Arc<std::sync::atomic::AtomicUsize>,
}

/// A request body that is not an `AdmissionReview` at all (answered with 400).
#[derive(Debug, thiserror::Error)]
#[error("the body is not an admission.k8s.io/v1 AdmissionReview: {0}")]
pub struct BadRequest(String);

/// Whether `patch` applies to the object exactly as the API server sent it.
fn applies_to(object: Option<&RawValue>, patch: &json_patch::Patch) -> Result<(), String> {
    let raw = object.ok_or("no object")?;
    let mut doc: serde_json::Value = serde_json::from_str(raw.get()).map_err(|e| e.to_string())?;
    json_patch::patch(&mut doc, patch).map_err(|e| e.to_string())
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn reservation_label(e: &PoolError) -> &'static str {
    match e {
        PoolError::NoRoom { .. } => "reservation_no_room",
        PoolError::Invalid(_) => "reservation_invalid",
        PoolError::UnknownPool(_) => "reservation_unknown_pool",
        PoolError::TooManyConflicts { .. } => "reservation_conflicts",
        PoolError::Kube(_) => "reservation_kube",
    }
}

fn owner_reference(pod: &Pod, namespace: &str) -> Option<ObjectReference> {
    let (kind, name) = crate::policy::owner_workload(pod)?;
    let api_version = match kind.as_str() {
        "Deployment" | "ReplicaSet" | "StatefulSet" | "DaemonSet" => "apps/v1".to_string(),
        _ => pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.kind == kind)
            .map(|o| o.api_version.clone())
            .unwrap_or_default(),
    };
    let uid = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == kind && o.name == name)
        .map(|o| o.uid.clone());
    Some(ObjectReference {
        api_version: Some(api_version),
        kind: Some(kind),
        name: Some(name),
        namespace: Some(namespace.to_string()),
        uid,
        ..ObjectReference::default()
    })
}

/// An `AdmissionReview` as it arrives, read in one pass over the body. The object stays raw JSON borrowed from the
/// body until it is read straight into a typed pod, and `oldObject` (absent on CREATE) is skipped unread; an object
/// that is no Kubernetes object at all thus still gets a well-formed answer (admitted unchanged) instead of a 400.
/// The fields are kube's `AdmissionReview`/`AdmissionRequest` (whose own `Deserialize` flattens the type meta,
/// which buffers the whole body into an intermediate tree first).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Incoming<'a> {
    api_version: String,
    kind: String,
    #[serde(borrow, default)]
    request: Option<IncomingRequest<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct IncomingRequest<'a> {
    uid: String,
    kind: GroupVersionKind,
    resource: GroupVersionResource,
    #[serde(default)]
    sub_resource: Option<String>,
    #[serde(default)]
    request_kind: Option<GroupVersionKind>,
    #[serde(default)]
    request_resource: Option<GroupVersionResource>,
    #[serde(default)]
    request_sub_resource: Option<String>,
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    operation: Operation,
    user_info: UserInfo,
    #[serde(borrow, default)]
    object: Option<&'a RawValue>,
    #[serde(default, rename = "oldObject")]
    _old_object: Option<IgnoredAny>,
    #[serde(default)]
    dry_run: bool,
    #[serde(default)]
    options: Option<RawExtension>,
}

impl<'a> Incoming<'a> {
    /// kube's request (without its objects) and the raw object; `None` when the review carries no request.
    fn into_request(self) -> Option<(AdmissionRequest<DynamicObject>, Option<&'a RawValue>)> {
        let r = self.request?;
        let request = AdmissionRequest {
            types: TypeMeta {
                api_version: self.api_version,
                kind: self.kind,
            },
            uid: r.uid,
            kind: r.kind,
            resource: r.resource,
            sub_resource: r.sub_resource,
            request_kind: r.request_kind,
            request_resource: r.request_resource,
            request_sub_resource: r.request_sub_resource,
            name: r.name,
            namespace: r.namespace,
            operation: r.operation,
            user_info: r.user_info,
            object: None,
            old_object: None,
            dry_run: r.dry_run,
            options: r.options,
        };
        Some((request, r.object))
    }
}

impl Admitter {
    /// An admitter without a cluster (`--no-kube`): injection and validation only.
    pub fn without_kube(config: Config) -> Self {
        Self {
            config: Arc::new(config),
            policies: Policies::None,
            pools: Arc::new(HashMap::new()),
            reservation_timeout: Duration::from_secs(2),
            metrics: Metrics::default(),
            events: None,
            pools_unsynced: Arc::default(),
        }
    }

    /// Whether the caches have synced (always with `--no-kube`).
    pub fn ready(&self) -> bool {
        let policies = match &self.policies {
            Policies::None => true,
            Policies::Store(_, synced) => synced.load(Ordering::Acquire),
        };
        policies && self.pools_unsynced.load(Ordering::Acquire) == 0
    }

    /// Answers one admission request body. `Err` only for a body that is no AdmissionReview (answer 400).
    pub async fn admit(&self, body: &[u8]) -> Result<AdmissionReview<DynamicObject>, BadRequest> {
        let started = Instant::now();
        let incoming = match serde_json::from_slice::<Incoming<'_>>(body) {
            Ok(r) => r,
            Err(e) => {
                self.metrics.admission("invalid", "not_a_review");
                return Err(BadRequest(e.to_string()));
            }
        };
        let Some((request, object)) = incoming.into_request() else {
            self.metrics.admission("invalid", "no_request");
            return Ok(AdmissionResponse::invalid("the AdmissionReview has no request").into_review());
        };
        let response = self.respond(&request, object).await;
        self.metrics.duration.observe(started.elapsed().as_secs_f64());
        Ok(response.into_review())
    }

    async fn respond(
        &self,
        req: &AdmissionRequest<DynamicObject>,
        object: Option<&RawValue>,
    ) -> AdmissionResponse {
        let base = AdmissionResponse::from(req);
        if req.operation != Operation::Create {
            return self.unchanged(base, req, None, Unchanged::NotCreate);
        }
        // Straight from the body's bytes into the typed pod: no intermediate JSON tree.
        let mut pod: Pod = match object
            .ok_or_else(|| "no object".to_string())
            .and_then(|v| serde_json::from_str(v.get()).map_err(|e| e.to_string()))
        {
            Ok(p) => p,
            Err(e) => return self.unchanged(base, req, None, Unchanged::NotAPod(e)),
        };
        let namespace = req
            .namespace
            .clone()
            .or_else(|| pod.metadata.namespace.clone())
            .unwrap_or_else(|| "default".into());
        // A pod created from a template arrives without its namespace; the mutation reads it from the pod (the
        // sidecar's objective token is the namespace's). Set on both sides of the diff, it adds no patch op.
        pod.metadata.namespace.get_or_insert_with(|| namespace.clone());
        let guard;
        let policy = match &self.policies {
            Policies::None => None,
            Policies::Store(store, synced) => {
                if !synced.load(Ordering::Acquire) {
                    return self.unchanged(base, req, Some((&pod, &namespace)), Unchanged::CacheCold);
                }
                guard = store.state();
                crate::policy::find(&pod, &namespace, guard.iter().map(|a| a.as_ref()))
            }
        };
        let mut ctx = Context {
            config: &self.config,
            policy,
            placement: None,
        };
        let placement;
        let plan = match mutate::plan(&pod, &ctx) {
            Err(deny) => {
                self.metrics.admission("denied", "invalid_setting");
                info!(uid = %req.uid, %namespace, reason = %deny, "denied");
                return base.deny(deny.to_string());
            }
            Ok(Plan::Unchanged(u)) => return self.unchanged(base, req, Some((&pod, &namespace)), u),
            Ok(p) => p,
        };
        match &plan {
            Plan::Unchanged(_) | Plan::Whole(_) => {}
            // DRA mode books nothing here: the scheduler allocates the claim the mutation points the pod at.
            Plan::Fractional(_) if mutate::writes_claims(&self.config) => {}
            Plan::Fractional(need) => {
                if req.dry_run {
                    return self.unchanged(base, req, Some((&pod, &namespace)), Unchanged::DryRun);
                }
                if let Some(p) = mutate::existing_placement(
                    &pod,
                    self.config.pools.as_deref().map(|p| p.namespace.as_str()),
                ) {
                    // Re-invocation: the pod already carries its placement; reserving again could book twice.
                    placement = p;
                    ctx.placement = Some(&placement);
                    return self.finish(base, req, object, &pod, &namespace, &ctx, &plan);
                }
                let Some(manager) = self.pools.get(&need.pool) else {
                    let u = Unchanged::NoPool(format!(
                        "pool {:?} has no manager in this webhook (it runs with --no-kube or without \
                         --pools-config)",
                        need.pool
                    ));
                    return self.unchanged(base, req, Some((&pod, &namespace)), u);
                };
                let request = ReserveRequest {
                    id: need.reservation.clone().unwrap_or_else(|| req.uid.clone()),
                    model: need.model.clone(),
                    compute_milli: need.compute_milli,
                    memory_mib: need.memory_mib,
                    priority: need.priority,
                    pod: pod.metadata.name.as_ref().map(|n| format!("{namespace}/{n}")),
                };
                match tokio::time::timeout(self.reservation_timeout, manager.reserve(request, unix_now()))
                    .await
                {
                    Ok(Ok(p)) => placement = p,
                    Ok(Err(e)) => {
                        let u = Unchanged::Reservation {
                            label: reservation_label(&e),
                            message: e.to_string(),
                        };
                        return self.unchanged(base, req, Some((&pod, &namespace)), u);
                    }
                    Err(_) => {
                        let u = Unchanged::Reservation {
                            label: "reservation_timeout",
                            message: format!(
                                "no answer within --reservation-timeout {}; a reservation made meanwhile \
                                 expires by the pool's TTL",
                                humantime::format_duration(self.reservation_timeout)
                            ),
                        };
                        return self.unchanged(base, req, Some((&pod, &namespace)), u);
                    }
                }
                ctx.placement = Some(&placement);
            }
        }
        self.finish(base, req, object, &pod, &namespace, &ctx, &plan)
    }

    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        base: AdmissionResponse,
        req: &AdmissionRequest<DynamicObject>,
        object: Option<&RawValue>,
        pod: &Pod,
        namespace: &str,
        ctx: &Context<'_>,
        plan: &Plan,
    ) -> AdmissionResponse {
        match mutate::apply_plan(pod, ctx, plan) {
            Mutation::Unchanged(u) => self.unchanged(base, req, Some((pod, namespace)), u),
            Mutation::Patch { patch, label, notes } => {
                debug!(uid = %req.uid, %namespace, label, ops = patch.0.len(), ?notes, "mutated");
                // The patch was computed from the typed pod, which fills in fields the sent pod may lack; the API
                // server applies it to what was sent, and fails the whole request if it does not apply.
                if let Err(why) = applies_to(object, &patch) {
                    return self.unchanged(base, req, Some((pod, namespace)), Unchanged::Unpatchable(why));
                }
                match base.clone().with_patch(patch) {
                    Ok(mut r) => {
                        self.metrics.admission("mutated", label);
                        r.audit_annotations.insert("mode".into(), label.into());
                        r
                    }
                    Err(e) => self.unchanged(
                        base,
                        req,
                        Some((pod, namespace)),
                        Unchanged::Internal(e.to_string()),
                    ),
                }
            }
        }
    }

    fn unchanged(
        &self,
        mut base: AdmissionResponse,
        req: &AdmissionRequest<DynamicObject>,
        pod: Option<(&Pod, &str)>,
        why: Unchanged,
    ) -> AdmissionResponse {
        let label = why.label();
        self.metrics.admission("unchanged", label);
        base.audit_annotations.insert("unchanged".into(), label.into());
        if why.is_failure() {
            warn!(uid = %req.uid, reason = label, message = %why, "admitted unchanged");
            base.warnings = Some(vec![format!("tessera: admitted unchanged ({label}): {why}")]);
            if !req.dry_run
                && let (Some(tx), Some((pod, ns))) = (&self.events, pod)
                && let Some(regarding) = owner_reference(pod, ns)
            {
                let job = EventJob {
                    regarding,
                    reason: "TesseraAdmittedUnchanged".into(),
                    note: format!("{label}: {why}"),
                };
                if tx.try_send(job).is_err() {
                    self.metrics.events_dropped.inc();
                }
            }
        } else {
            debug!(uid = %req.uid, reason = label, "admitted unchanged");
        }
        base
    }
}

/// Publishes queued Events until the queue closes.
pub async fn publish_events(client: kube::Client, mut rx: mpsc::Receiver<EventJob>) {
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: "tessera-webhook".into(),
            instance: std::env::var("POD_NAME").ok(),
        },
    );
    while let Some(job) = rx.recv().await {
        let ev = Event {
            type_: EventType::Warning,
            reason: job.reason,
            note: Some(job.note.chars().take(1000).collect()),
            action: "Admit".into(),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&ev, &job.regarding).await {
            warn!(error = %e, "could not publish an Event");
        }
    }
}
