//! One reconcile of one InferenceAutoscaler: observe, decide (in `tessera_core::scale`), act, report.
//!
//! 1. Validate the spec into a policy; an invalid spec is reported as the `Valid` condition and a Warning event,
//!    and nothing is scaled.
//! 2. Read the target's `/scale` subresource (works for Deployments, StatefulSets and any resource with /scale):
//!    `spec.replicas` is the current count and `status.selector` finds its pods.
//! 3. List the pods, keep the ready ones, and read every ready pod's sidecar `/v1/status` concurrently (each with
//!    the source's timeout). A replica that cannot be read counts as missing, never as idle.
//! 4. Add the activators' demand for the model's names (`"<namespace>/<model>"`, polled in the background).
//! 5. `decide`. A decision to go to zero is checked once more against activator documents fetched right then:
//!    a request that arrived since the last poll keeps the model up.
//! 6. Apply a change with a merge patch `{"spec":{"replicas":N}}` on `/scale`, emit an Event on every scale, and
//!    write `status` only when it changed (merge patch carrying the `resourceVersion`, retried on 409 Conflict).
//!
//! The per-object [`ScaleState`] lives in memory. Losing it (restart, new leader) only restarts the windows, which
//! is safe: a scale-down then waits a full stabilization window again. The cold-start ledger, a day of counts, is
//! the exception: a copy kept in `status.coldStartLedger` resumes it (`super::coldstart`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, Resource, ResourceExt};
use tessera_core::scale::{self, ScaleDecision, ScaleState, Timestamp};
use tessera_core::wire::activator::{model_key, split_model_key};
use tessera_core::wire::sidecar::SidecarStatus;
use tracing::{debug, info, instrument, warn};

use super::allocation::{AllocationRound, allocation_and_roll};
use super::coldstart::{
    ledger_status, namespace_claims, observed_cold_start, publish_budget_metrics, resume_state,
    watched_objects,
};
use super::metrics::Metrics;
use super::signals::{ActivatorPoller, SignalSource, demand_from};
use super::status::{self, Applied};
use crate::crd::{self, InferenceAutoscaler, InferenceAutoscalerStatus};

/// The field manager written on every patch, so `kubectl get -o yaml --show-managed-fields` shows who set replicas.
pub const FIELD_MANAGER: &str = "tessera-autoscaler";

/// Pod annotation that overrides the sidecar port for one workload.
pub const SIDECAR_PORT_ANNOTATION: &str = "tessera.dev/sidecar-port";

/// Why a reconcile failed. `label()` is the metric label.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The object has no namespace (the CRD is namespaced, so this means a broken object).
    #[error("the InferenceAutoscaler has no namespace")]
    NoNamespace,
    /// `scaleTargetRef.apiVersion` is not `group/version` or `version`.
    #[error("scaleTargetRef.apiVersion {0:?} is not of the form group/version (e.g. apps/v1)")]
    BadApiVersion(String),
    /// Reading `/scale` failed.
    #[error("reading {target}/scale: {source}")]
    GetScale {
        /// Kind/name.
        target: String,
        /// The API error.
        source: kube::Error,
    },
    /// Listing the target's pods failed.
    #[error("listing pods of {target} with selector {selector:?}: {source}")]
    ListPods {
        /// Kind/name.
        target: String,
        /// The selector from /scale.
        selector: String,
        /// The API error.
        source: kube::Error,
    },
    /// Writing status failed (after retries on conflict).
    #[error("writing status: {0}")]
    Status(kube::Error),
}

impl Error {
    /// Fixed metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Error::NoNamespace => "no_namespace",
            Error::BadApiVersion(_) => "bad_api_version",
            Error::GetScale { .. } => "get_scale",
            Error::ListPods { .. } => "list_pods",
            Error::Status(_) => "status",
        }
    }
}

/// Settings for reconciles.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Requeue every object this often (the decision period).
    pub sync_period: Duration,
    /// Default sidecar port on each pod.
    pub sidecar_port: u16,
    /// Oldest sidecar snapshot still counted as fresh.
    pub max_signal_age: Duration,
    /// An activator document older than this makes the demand unknown.
    pub activator_max_age: Duration,
    /// The in-force and roll rules' settings (`gpu.updateMode`).
    pub rollout: tessera_core::rollout::RolloutConfig,
}

/// A clock, injected so tests control time.
pub type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// Everything a reconcile needs.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Sidecar and activator documents.
    pub signals: Arc<dyn SignalSource>,
    /// The activator's latest documents.
    pub activators: ActivatorPoller,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Event publisher.
    pub recorder: Recorder,
    /// Settings.
    pub settings: Settings,
    /// The clock.
    pub clock: Clock,
    /// Per-object decision history, by `namespace/name`.
    pub states: Mutex<HashMap<String, ScaleState>>,
    /// Per-object time and [`trigger_hash`] of the last full reconcile, to skip the echo of our own status writes.
    pub last_runs: Mutex<HashMap<String, (SystemTime, u64)>>,
    /// Objects (`namespace/name`) woken by a request held at an activator: their next reconcile runs in full
    /// even when it looks like the echo of a status write.
    pub woken: Mutex<HashSet<String>>,
    /// Models being rolled onto a new allocation, one per pool.
    pub rolling: super::rollout::Rolling,
    /// Consolidation: the capacity pods the pool managers drain (this controller moves pods off them), and the pods
    /// this controller moves (the pool managers drain only GPUs whose pods someone moves).
    pub consolidation: crate::pool::ConsolidationLink,
    /// Where each reconcile publishes what it saw and decided for the `/ui` page (read-only for the page).
    pub ui: Arc<crate::ui::Store>,
    /// The InferenceAutoscalers this term's controller watches (its reflector's cache, set when it starts): a
    /// budget group's members this process has not decided for yet are read from their status through it
    /// ([`namespace_claims`]). `None` before the first term starts.
    pub objects: std::sync::RwLock<Option<kube::runtime::reflector::Store<InferenceAutoscaler>>>,
}

impl Context {
    /// Marks `key` (`namespace/name`) as woken by a held request.
    pub fn mark_woken(&self, key: &str) {
        if let Ok(mut w) = self.woken.lock() {
            w.insert(key.to_owned());
        }
    }

    fn take_woken(&self, key: &str) -> bool {
        self.woken.lock().is_ok_and(|mut w| w.remove(key))
    }
}

/// The InferenceAutoscalers a model key (`"<namespace>/<model>"`) belongs to: those in that namespace whose
/// `modelNames` include the model. Tenants are namespaces: another namespace's object with the same model name is
/// never woken.
pub fn objects_for_model(
    objects: &[Arc<InferenceAutoscaler>],
    key: &str,
) -> Vec<ObjectRef<InferenceAutoscaler>> {
    let Some((ns, model)) = split_model_key(key) else {
        return Vec::new();
    };
    objects
        .iter()
        .filter(|o| o.namespace().as_deref() == Some(ns) && o.spec.model_names.iter().any(|m| m == model))
        .map(|o| ObjectRef::from_obj(o.as_ref()))
        .collect()
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// The kube-runtime reconcile entry point.
#[instrument(skip_all, fields(ias = %obj.name_any(), ns = obj.namespace().unwrap_or_default()))]
pub async fn reconcile(obj: Arc<InferenceAutoscaler>, ctx: Arc<Context>) -> Result<Action, Error> {
    let key = format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any());
    if ctx.take_woken(&key) {
        debug!("woken by a request held at an activator");
    } else if let Some(due_in) = echo_of_own_write(&ctx, &key, trigger_hash(&obj), (ctx.clock)()) {
        debug!("skipping the echo of our own status write");
        return Ok(Action::requeue(due_in));
    }
    let started = Instant::now();
    let result = reconcile_inner(&obj, &ctx).await;
    ctx.metrics.reconcile_took(started.elapsed().as_secs_f64());
    if let Err(e) = &result {
        ctx.metrics.reconcile_error(e.label());
    }
    result.map(|()| Action::requeue(ctx.settings.sync_period))
}

/// The kube-runtime error policy: log, and retry after a sync period (the next decision is due then anyway).
pub fn error_policy(obj: Arc<InferenceAutoscaler>, error: &Error, ctx: Arc<Context>) -> Action {
    warn!(ias = %obj.name_any(), error = %error, "reconcile failed");
    Action::requeue(ctx.settings.sync_period)
}

/// Hash of what in the object should make a reconcile run at once: the spec generation. Status writes do not
/// change it, so their watch events are recognised and skipped. (Wake-ups come from the activators' documents, not
/// from the object: see [`Context::woken`].)
pub fn trigger_hash(obj: &InferenceAutoscaler) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    obj.metadata.generation.hash(&mut h);
    h.finish()
}

/// When a reconcile with the same [`trigger_hash`] ran less than half a sync period ago, this call is the echo of
/// our own status write: returns how long until the next real decision is due.
fn echo_of_own_write(ctx: &Context, key: &str, hash: u64, now: SystemTime) -> Option<Duration> {
    let runs = ctx.last_runs.lock().ok()?;
    let (at, last_hash) = runs.get(key)?;
    let elapsed = now.duration_since(*at).unwrap_or_default();
    (*last_hash == hash && elapsed < ctx.settings.sync_period / 2).then(|| ctx.settings.sync_period - elapsed)
}

/// Deleted objects are never reconciled again, so their history would stay forever: forget objects not
/// reconciled for 10 sync periods. A live object that is merely slow to come around loses only its windows (safe).
fn forget_deleted(runs: &mut HashMap<String, (SystemTime, u64)>, ctx: &Context, now: SystemTime) {
    let horizon = ctx.settings.sync_period * 10;
    let stale: Vec<String> = runs
        .iter()
        .filter(|(_, (at, _))| now.duration_since(*at).unwrap_or_default() > horizon)
        .map(|(k, _)| k.clone())
        .collect();
    if stale.is_empty() {
        return;
    }
    if let Ok(mut states) = ctx.states.lock() {
        for k in &stale {
            states.remove(k);
        }
    }
    for k in stale {
        debug!(object = %k, "forgetting an InferenceAutoscaler not seen for 10 sync periods");
        runs.remove(&k);
    }
}

async fn reconcile_inner(obj: &InferenceAutoscaler, ctx: &Context) -> Result<(), Error> {
    let ns = obj.namespace().ok_or(Error::NoNamespace)?;
    let name = obj.name_any();
    let key = format!("{ns}/{name}");
    let ias_api: Api<InferenceAutoscaler> = Api::namespaced(ctx.client.clone(), &ns);
    let now_sys = (ctx.clock)();
    if let Ok(mut runs) = ctx.last_runs.lock() {
        runs.insert(key.clone(), (now_sys, trigger_hash(obj)));
        forget_deleted(&mut runs, ctx, now_sys);
    }
    let now_k8s = k8s_time(now_sys);
    let generation = obj.metadata.generation;
    let spec = &obj.spec;
    let target = format!("{}/{}", spec.scale_target_ref.kind, spec.scale_target_ref.name);

    // 1. The spec.
    let policy = match spec.to_policy() {
        Ok(p) => p,
        Err(errors) => {
            let message = errors.join("; ");
            let was_invalid = obj.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == status::VALID && c.status == "False" && c.message == message)
            });
            if !was_invalid {
                publish(ctx, obj, EventType::Warning, "InvalidSpec", "Validate", &message).await;
            }
            warn!(%message, "invalid spec: not scaling");
            return write_status(&ias_api, obj, |prev| {
                status::after_failure(prev, generation, status::VALID, "InvalidSpec", &message, &now_k8s)
            })
            .await;
        }
    };

    // 2. The target's /scale.
    let ar = target_resource(&spec.scale_target_ref.api_version, &spec.scale_target_ref.kind)?;
    let target_api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &ar);
    let scale = match target_api.get_scale(&spec.scale_target_ref.name).await {
        Ok(s) => s,
        Err(source) => {
            let message = format!("could not read {target}/scale: {source}");
            publish(
                ctx,
                obj,
                EventType::Warning,
                "FailedGetScale",
                "GetScale",
                &message,
            )
            .await;
            write_status(&ias_api, obj, |prev| {
                status::after_failure(
                    prev,
                    generation,
                    status::ABLE_TO_SCALE,
                    "FailedGetScale",
                    &message,
                    &now_k8s,
                )
            })
            .await?;
            return Err(Error::GetScale { target, source });
        }
    };
    let current = scale
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .and_then(|r| u32::try_from(r).ok())
        .unwrap_or(0);
    let selector = scale
        .status
        .as_ref()
        .and_then(|s| s.selector.clone())
        .unwrap_or_default();

    // 3. Ready pods and their sidecars.
    let all_pods = if current == 0 || selector.is_empty() {
        Vec::new()
    } else {
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
        let list = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|source| Error::ListPods {
                target: target.clone(),
                selector: selector.clone(),
                source,
            })?;
        list.items
    };
    // Consolidation: this round moves these pods if a pool drains their GPU (surge, then retire by deletion cost,
    // which only a ReplicaSet honours: a Deployment's pods, not a StatefulSet's).
    let movable = if super::deletion_cost::honoured_by(&spec.scale_target_ref.kind) {
        all_pods.iter().filter_map(crate::pool::state::pod_key).collect()
    } else {
        Vec::new()
    };
    ctx.consolidation.managed.set(&key, movable);
    let ready_pods = all_pods
        .iter()
        .filter_map(|p| ready_pod_url(p, ctx.settings.sidecar_port))
        .collect::<Vec<_>>();
    let statuses =
        futures::future::join_all(ready_pods.iter().map(|(_, url)| ctx.signals.sidecar_status(url))).await;
    let mut recommendations = Vec::new();
    let mut docs = Vec::with_capacity(ready_pods.len());
    for ((pod, url), result) in ready_pods.iter().zip(statuses) {
        match result {
            Ok(st) => {
                let fresh = scale::inputs::replica_signals(&st, ctx.settings.max_signal_age).fresh;
                if fresh && let Some(r) = st.recommendation() {
                    recommendations.push(r.clone());
                }
                docs.push(Some(st));
            }
            Err(e) => {
                debug!(%pod, %url, error = %e, "sidecar status unavailable: counted as missing");
                ctx.metrics.scrape_failure("sidecar", e.label());
                docs.push(None);
            }
        }
    }

    // 4. Demand, and the decision's input: the same shaping the simulator uses (`core::scale::inputs`).
    let keys: Vec<String> = spec.model_names.iter().map(|m| model_key(&ns, m)).collect();
    let now_ms = crate::unix_ms(now_sys);
    let demand = demand_from(
        &ctx.activators.samples(),
        &keys,
        now_ms,
        ctx.settings.activator_max_age,
    );
    let read: Vec<Option<&SidecarStatus>> = docs.iter().map(Option::as_ref).collect();
    // What hurries a growth onto the pods (`core::rollout::Urgency`): preemptions for memory, a replica over the
    // TTFT objective for compute.
    let urgency = tessera_core::rollout::Urgency::of(&read, policy.ttft_slo, ctx.settings.max_signal_age);
    // A surge to move a pod off a draining GPU is not a count the rule chose: take it off before deciding (the
    // simulator does the same).
    let decided_current = tessera_core::pack::consolidate::count_before_surge(
        current,
        super::consolidate::surged(obj.status.as_ref()),
    );
    let mut input = scale::inputs::scale_input(decided_current, &read, ctx.settings.max_signal_age, demand);

    // 5. Decide and act.
    let now = timestamp(now_sys);
    // Replicas and share decided together (`core::scale::joint::round`, the simulator's call too): while the share
    // can grow, the latency target is the share rule's, and the replica count answers load and the SLO guard. The
    // round also counts every sync's demand into the model's cold-start ledger, whatever is decided, and keeps the
    // claim its budget group reads. A model in a group reads what this namespace's other models last claimed
    // (`coldstart::group`), so no tenant's traffic moves another's floors. A poisoned lock only loses history,
    // which restarts the windows: safe (see the module docs).
    let grouped = policy
        .scale_to_zero
        .as_ref()
        .is_some_and(|z| z.cold_start_budget_group.is_some());
    let measured = observed_cold_start(&all_pods);
    let room = share_room(obj, &docs);
    // A group's members this process has not decided for yet are read from their status (`namespace_claims`).
    let watched = if grouped {
        watched_objects(&ctx.objects).await
    } else {
        Vec::new()
    };
    let ledger_copy;
    let (state, joint) = {
        let mut states = ctx.states.lock().ok();
        let claims = match &states {
            Some(s) if grouped => namespace_claims(s, &watched, &ns, &key, now),
            _ => Vec::new(),
        };
        let mut lost = ScaleState::default();
        let state = match states.as_mut() {
            Some(s) => s
                .entry(key.clone())
                .or_insert_with(|| resume_state(obj, &policy, now)),
            None => &mut lost,
        };
        let joint = scale::joint::round(
            &policy,
            room,
            // Every replica, the first included, starts as a pod here.
            scale::joint::LeadTimes::one(measured),
            &input,
            state,
            &scale::joint::BudgetPeers {
                name: &name,
                claims: &claims,
            },
            now,
        );
        let state = state.clone();
        ledger_copy = ledger_status(obj, &policy, &state, now);
        if let Some(s) = &states {
            publish_budget_metrics(&ctx.metrics, s, &ns, joint.budget_group.as_ref());
        }
        (state, joint)
    };
    let mut decision = scale::joint::decide(&input, &joint, &state, now);
    if decision.desired_replicas == 0 && current > 0 {
        // The documents may be a poll interval old: a request that arrived since must not meet a model going to
        // zero. Read every activator again, now, and decide on that.
        ctx.activators
            .poll_once(
                ctx.signals.as_ref(),
                &ctx.metrics,
                now_ms,
                ctx.settings.activator_max_age,
            )
            .await;
        input.demand = demand_from(
            &ctx.activators.samples(),
            &keys,
            now_ms,
            ctx.settings.activator_max_age,
        );
        decision = scale::joint::decide(&input, &joint, &state, now);
        if decision.desired_replicas > 0 {
            info!(
                reason = decision.reason.label(),
                "fresh activator data: not scaling to zero"
            );
        }
    }
    ctx.metrics.decision(decision.reason);
    let held_by = scale::constraint::Constraint::of(&input, &joint, &decision);
    // 5b. Pods on a GPU the pool is draining move off it (`core::pack::consolidate::move_step`): the count applied
    // may be one over the decision (a surge), and a retire first marks the pods that must go.
    let moving = super::consolidate::plan(&all_pods, &ctx.consolidation.draining, decision.desired_replicas);
    let mut replicas = moving.step.replicas(decision.desired_replicas);
    if !moving.to_retire().is_empty() {
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
        if let Err(e) = super::consolidate::mark_leaving(&pods, moving.to_retire()).await {
            // The ReplicaSet would pick another pod to remove: hold the count this round instead.
            warn!(error = %e, pods = ?moving.to_retire(), "could not mark pods leaving a draining GPU; not scaling down this round");
            replicas = current.max(replicas);
        }
    }
    let applied = if replicas != current {
        apply(ctx, obj, &target_api, &target, &decision, current, replicas).await
    } else {
        Applied::Unchanged
    };
    if !matches!(applied, Applied::Failed(_))
        && let Ok(mut states) = ctx.states.lock()
    {
        states.entry(key).or_default().record(&decision, now);
    }
    debug!(
        current,
        desired = decision.desired_replicas,
        reason = decision.reason.label(),
        "decided"
    );
    let observed = crate::ui::observe::model_from_reconcile(
        obj,
        &policy,
        &docs.iter().flatten().cloned().collect::<Vec<_>>(),
        &decision,
        held_by,
        input.ready_replicas,
        now.as_millis(),
    );
    // The class shown by `kubectl get ias -o wide` is the one the page shows.
    let workload_class = observed.workload_class.clone();
    ctx.ui.observe_model(observed, now.as_millis());
    let recommendation = status::largest_recommendation(&recommendations);

    // 6. The allocation in force, and under `updateMode: Recreate` a roll onto it.
    let gpu = spec.gpu.clone().unwrap_or_default();
    let (allocation, in_sync) = allocation_and_roll(
        ctx,
        obj,
        AllocationRound {
            target_api: &target_api,
            target: &target,
            all_pods: &all_pods,
            gpu: &gpu,
            recommendation: recommendation.as_ref(),
            urgency,
            replicas: (
                i32::try_from(current).unwrap_or(i32::MAX),
                i32::try_from(input.ready_replicas).unwrap_or(i32::MAX),
                i32::try_from(decision.desired_replicas).unwrap_or(i32::MAX),
                spec.min_replicas,
            ),
            now_ms,
            now_k8s: &now_k8s,
        },
    )
    .await;
    write_status(&ias_api, obj, |prev| {
        let mut st = status::after_decision(
            prev,
            generation,
            &target,
            input.ready_replicas,
            &decision,
            held_by,
            &applied,
            recommendation.clone(),
            &now_k8s,
        );
        st.allocation = Some(allocation.clone());
        st.cold_start_ledger = ledger_copy.clone();
        status::set_workload_class(&mut st, workload_class.as_ref());
        let had = st
            .conditions
            .iter()
            .any(|c| c.type_ == super::consolidate::CONSOLIDATING);
        // The surge is remembered only when `/scale` really carries it (written now, or already there): a failed
        // write must not make the next round take a replica off a count that never had it.
        let surge_in_force = matches!(applied, Applied::Scaled) || replicas == current;
        if let Some((ok, reason, message)) = moving.condition(had, surge_in_force) {
            status::set_condition(
                &mut st.conditions,
                super::consolidate::CONSOLIDATING,
                ok,
                reason,
                &message,
                generation,
                &now_k8s,
            );
        }
        if let Some((ok, reason, message)) = &in_sync {
            status::set_condition(
                &mut st.conditions,
                super::rollout::ALLOCATION_IN_SYNC,
                *ok,
                reason,
                message,
                generation,
                &now_k8s,
            );
        }
        st
    })
    .await
}

/// What the model's compute share can do, for the joint policy: it can grow when the model shares GPUs with a
/// share Tessera manages and an allocation is in force (new pods get it); the GPU's size (for the cost of
/// another replica's memory) comes from a sidecar that knows it. No allocation yet: unknown, which keeps every
/// target on the replica count.
fn share_room(obj: &InferenceAutoscaler, docs: &[Option<SidecarStatus>]) -> scale::joint::ShareRoom {
    let gpu = obj.spec.gpu.clone().unwrap_or_default();
    let in_force = obj
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.in_force)
        .map(|a| (a.compute_fraction, u64::try_from(a.gpu_memory_mib).unwrap_or(0)));
    let gpu_bytes = docs
        .iter()
        .flatten()
        .find_map(|d| d.gpu.as_ref().map(|g| g.total_bytes));
    scale::joint::ShareRoom::of(
        gpu.sharing == crd::Sharing::Fractional,
        gpu.compute_fraction.as_deref().is_none_or(|c| c == "auto"),
        in_force,
        gpu_bytes,
    )
}

async fn apply(
    ctx: &Context,
    obj: &InferenceAutoscaler,
    target_api: &Api<DynamicObject>,
    target: &str,
    decision: &ScaleDecision,
    current: u32,
    replicas: u32,
) -> Applied {
    let patch = serde_json::json!({ "spec": { "replicas": replicas } });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    // One over the decision: a surge to move a pod off a draining GPU (see `consolidate`).
    let why = if replicas > decision.desired_replicas {
        format!(
            "{} (+1 while a pod moves off a GPU being drained)",
            decision.message
        )
    } else {
        decision.message.clone()
    };
    match target_api
        .patch_scale(&obj.spec.scale_target_ref.name, &params, &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {
            info!(
                %target, from = current, to = replicas,
                reason = decision.reason.label(), message = %why, "scaled"
            );
            ctx.metrics.scaled(current, replicas);
            let note = format!("New size: {replicas}; reason: {why}");
            // kube's Recorder folds events with the same (reason, action) into one series that keeps the *first*
            // note; naming the action after the new size keeps each distinct scale visible with its own reason.
            let action = format!("ScaleTo{replicas}");
            publish(ctx, obj, EventType::Normal, "SuccessfulRescale", &action, &note).await;
            Applied::Scaled
        }
        Err(e) => {
            let message = format!("could not scale {target} to {replicas}: {e}");
            warn!(%message);
            publish(ctx, obj, EventType::Warning, "FailedRescale", "Scale", &message).await;
            Applied::Failed(e.to_string())
        }
    }
}

/// Writes status with the object's `resourceVersion`; on 409 Conflict, re-reads and rebuilds from the fresh status.
/// A status equal to the one the object already has is not written: every sync would otherwise patch each object
/// (and wake every watcher of it) for nothing.
async fn write_status(
    api: &Api<InferenceAutoscaler>,
    obj: &InferenceAutoscaler,
    build: impl Fn(Option<&InferenceAutoscalerStatus>) -> InferenceAutoscalerStatus,
) -> Result<(), Error> {
    let name = obj.name_any();
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    let mut previous = obj.status.clone();
    let mut rv = obj.resource_version();
    const ATTEMPTS: usize = 3;
    for attempt in 1..=ATTEMPTS {
        let status = build(previous.as_ref());
        if previous.as_ref() == Some(&status) {
            return Ok(());
        }
        let patch = status::merge_patch(&status, rv.as_deref());
        match api.patch_status(&name, &params, &Patch::Merge(&patch)).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 && attempt < ATTEMPTS => {
                debug!(attempt, "status conflict: re-reading");
                let fresh = api.get_status(&name).await.map_err(Error::Status)?;
                previous = fresh.status.clone();
                rv = fresh.resource_version();
            }
            Err(e) => return Err(Error::Status(e)),
        }
    }
    // The loop returns on every path of its last attempt.
    Ok(())
}

pub(super) async fn publish(
    ctx: &Context,
    obj: &InferenceAutoscaler,
    type_: EventType,
    reason: &str,
    action: &str,
    note: &str,
) {
    let reference: ObjectReference = obj.object_ref(&());
    // Events are capped at 1 kB notes by the API server.
    let note: String = note.chars().take(1000).collect();
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: action.to_owned(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &reference).await {
        warn!(error = %e, reason, "could not publish event");
    }
}

/// The API resource for a scale target; plural by kube's English rules (deployments, statefulsets, ...).
pub fn target_resource(api_version: &str, kind: &str) -> Result<ApiResource, Error> {
    let (group, version) =
        crd::group_version(api_version).ok_or_else(|| Error::BadApiVersion(api_version.to_owned()))?;
    Ok(ApiResource::from_gvk(&GroupVersionKind::gvk(
        group, version, kind,
    )))
}

/// A pod's sidecar base URL if the pod is ready (Ready condition true, has an IP, not terminating).
pub fn ready_pod_url(pod: &Pod, default_port: u16) -> Option<(String, String)> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    if !crate::pod_ready(pod) {
        return None;
    }
    let ip = pod.status.as_ref()?.pod_ip.as_ref().filter(|ip| !ip.is_empty())?;
    let port = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SIDECAR_PORT_ANNOTATION))
        .and_then(|p| p.parse::<u16>().ok())
        .unwrap_or(default_port);
    // IPv6 pod IPs need brackets in a URL.
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.clone()
    };
    Some((pod.name_any(), format!("http://{host}:{port}")))
}

fn timestamp(t: SystemTime) -> Timestamp {
    Timestamp::from_millis(crate::unix_ms(t))
}

fn k8s_time(t: SystemTime) -> Time {
    Time(jiff::Timestamp::try_from(t).unwrap_or(jiff::Timestamp::UNIX_EPOCH))
}

#[cfg(test)]
#[path = "reconcile_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "sim_parity_tests.rs"]
mod sim_parity_tests;
