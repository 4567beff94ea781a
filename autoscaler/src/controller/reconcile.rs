//! One reconcile of one InferenceAutoscaler: gather what the round observes, take the round in core
//! ([`tessera_core::round`], the simulator's round too), apply what it decided, report.
//!
//! 1. Validate the spec into a policy; an invalid spec is reported as the `Valid` condition and a Warning event,
//!    and nothing is scaled.
//! 2. Read the target's `/scale` subresource (works for Deployments, StatefulSets and any resource with /scale):
//!    `spec.replicas` is the current count and `status.selector` finds its pods.
//! 3. List the pods, keep the ready ones, and read every ready pod's sidecar `/v1/status` concurrently (each with
//!    the source's timeout). A replica that cannot be read counts as missing, never as idle.
//! 4. Add the activators' demand for the model's names (`"<namespace>/<model>"`, polled in the background), the
//!    share's room, the cold start measured from the pods, the budget group's claims and where the pods sit
//!    relative to a draining GPU: the round's [`Observed`] ([`gather`]).
//! 5. The round: the workload class and the policy defaults it supplies (an Event when it changes), urgency, the
//!    decision and its reason, what held it, the move off a draining GPU. A decision to
//!    go to zero is asked again on activator documents fetched right then ([`Round::redecide`]): a request that
//!    arrived since keeps the model up. Every sidecar that reports another latency objective than the round's
//!    policy is handed it (`super::objective`), so an SLO edit reaches the share rule within this sync.
//! 6. Mark pods leaving a draining GPU, apply a change with a merge patch `{"spec":{"replicas":N}}` on `/scale`,
//!    and emit an Event on every scale.
//! 7. Fold the recommendation into the allocation in force, roll under `updateMode: Recreate`
//!    (`super::allocation`), and write `status` only when it changed (merge patch carrying the `resourceVersion`,
//!    retried on 409 Conflict).
//!
//! The per-object [`ScaleState`] lives in memory. Losing it (restart, new leader) only restarts the windows, which
//! is safe: a scale-down then waits a full stabilization window again. The cold-start ledger, a day of counts, is
//! the exception: a copy kept in `status.coldStartLedger` resumes it (`super::coldstart`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use tessera_core::round::{Observed, Round};
use tessera_core::scale::{self, ScaleDecision, ScaleState, Timestamp};
use tessera_core::wire::activator::{model_key, split_model_key};
use tessera_core::wire::sidecar::SidecarStatus;
use tracing::{debug, info, instrument, warn};

use super::allocation::{AllocationRound, allocation_and_roll};
use super::coldstart::{
    forget_budget_groups, ledger_status, namespace_claims, observed_cold_start, publish_budget_metrics,
    resume_state, watched_objects,
};
use super::signals::demand_from;
use super::status::{self, Applied};
use crate::crd::{self, InferenceAutoscaler, InferenceAutoscalerStatus};

use super::context::publish;
pub use super::context::{Clock, Context, Settings};
pub use super::status::FIELD_MANAGER;

pub use super::sidecar_url::{SIDECAR_PORT_ANNOTATION, pod_url, ready_pod_url};

/// Why a reconcile failed. `label()` is the metric label.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
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
        self.into()
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

/// What outlives its objects — deleted objects' history, budget groups no model names — is swept once per sync
/// period, by whichever round comes first: each sweep reads every model, so doing it in every round made a round's
/// cost grow with the fleet.
fn sweep_when_due(runs: &mut HashMap<String, (SystemTime, u64)>, ctx: &Context, now: SystemTime) {
    let Ok(mut swept) = ctx.runs_swept_at.lock() else {
        return;
    };
    if swept.is_some_and(|at| now.duration_since(at).unwrap_or_default() < ctx.settings.sync_period) {
        return;
    }
    *swept = Some(now);
    forget_deleted(runs, ctx, now);
    if let Ok(states) = ctx.states.lock() {
        forget_budget_groups(&ctx.metrics, &states);
    }
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

/// The documents may be a poll interval old: a request that arrived since must not meet a model going to zero.
/// Reads every activator again, now, and asks the same rule once more (`Round::redecide`).
async fn repoll_before_zero(
    ctx: &Context,
    r: &mut Round,
    keys: &[String],
    state: &ScaleState,
    now: Timestamp,
) {
    let now_ms = now.as_millis();
    let age = ctx.settings.activator_max_age;
    ctx.activators
        .poll_once(ctx.signals.as_ref(), &ctx.metrics, now_ms, age)
        .await;
    r.redecide(
        demand_from(&ctx.activators.samples(), keys, now_ms, age),
        state,
        now,
    );
    if !r.goes_to_zero() {
        info!(
            reason = r.decision.reason.label(),
            "fresh activator data: not scaling to zero"
        );
    }
}

/// One reconcile: gather what the round observes, take the round in core (`tessera_core::round`), apply it.
async fn reconcile_inner(obj: &InferenceAutoscaler, ctx: &Context) -> Result<(), Error> {
    let ns = obj.namespace().ok_or(Error::NoNamespace)?;
    let key = format!("{ns}/{}", obj.name_any());
    let ias_api: Api<InferenceAutoscaler> = Api::namespaced(ctx.client.clone(), &ns);
    let now_sys = (ctx.clock)();
    if let Ok(mut runs) = ctx.last_runs.lock() {
        runs.insert(key.clone(), (now_sys, trigger_hash(obj)));
        sweep_when_due(&mut runs, ctx, now_sys);
    }
    let now_k8s = status::k8s_time(now_sys);
    let now = timestamp(now_sys);

    // 1. The spec.
    let policy = match obj.spec.to_policy() {
        Ok(p) => p,
        Err(errors) => return invalid_spec(ctx, obj, &ias_api, &errors, &now_k8s).await,
    };
    // 2-4. What the round observes.
    let g = gather(ctx, obj, &ias_api, &policy, now_sys).await?;

    // 5. The round (`core::round`): urgency, the count before a surge, the input, the joint round on the model's
    // history, the decision, what held it and the move off a draining GPU.
    let (mut r, state, ledger_copy) = take_round(ctx, obj, &policy, &g.observed, &key, now);
    if r.goes_to_zero() {
        repoll_before_zero(ctx, &mut r, &g.keys, &state, now).await;
    }
    ctx.metrics.decision(r.decision.reason);
    super::objective::hand_over(
        ctx,
        &ns,
        &obj.spec,
        &r.policy,
        &g.ready_pods,
        &g.observed.sidecars,
    )
    .await;
    let flex_neighbours = neighbours_seen(ctx, &key, &g, &r, now_sys);

    // 6. Apply: pods leaving a draining GPU are marked first (a failed mark holds the count), then `/scale`.
    let current = g.scale_count();
    let moving = g.placed.decided(r.placement, r.step);
    let (replicas, applied) = apply_count(ctx, obj, &g, &moving, &r).await;
    // Sleep mode, only where Tessera owns `/scale` (KEDA's zero deletes the pod).
    if matches!(applied, Applied::Scaled | Applied::Unchanged) {
        super::sleep::apply(ctx, obj, &g.all_pods, &g.sleep, &r, now.as_millis()).await;
    }
    let decision = &r.decision;
    if !matches!(applied, Applied::Failed(_) | Applied::Conflict(_))
        && let Ok(mut states) = ctx.states.lock()
    {
        states.entry(key).or_default().record(decision, now);
    }
    debug!(
        current,
        desired = decision.desired_replicas,
        reason = decision.reason.label(),
        "decided"
    );
    publish_to_page(ctx, obj, &g, &r, now);
    if let Some(c) = &r.class {
        super::class::announce(ctx, obj, c).await;
    }
    let recommendation = status::largest_recommendation(&g.recommendations);

    // 7. The allocation in force, and under `updateMode: Recreate` a roll onto it.
    let (allocation, in_sync) =
        allocation_round(ctx, obj, &g, &r, recommendation.as_ref(), now, &now_k8s).await;
    let injected = super::injection::announce(ctx, obj, &g.all_pods).await;
    // In DRA mode the allocation in force is also a claim template, and a claim that fits nowhere is explained.
    let claims = super::claims::apply(ctx, obj, &allocation, &g.all_pods).await;
    // The surge is remembered only when `/scale` really carries it (written now, or already there): a failed
    // write must not make the next round take a replica off a count that never had it.
    let surge_in_force = matches!(applied, Applied::Scaled) || replicas == current;
    let outcome = Outcome {
        obj,
        g: &g,
        r: &r,
        applied: &applied,
        recommendation,
        allocation,
        ledger: ledger_copy,
        flex_neighbours,
        moving: &moving,
        surge_in_force,
        in_sync,
        injected,
        claims,
        now_sys,
        now_k8s: &now_k8s,
    };
    write_status(&ias_api, obj, |prev| round_status(prev, &outcome)).await
}

/// What a round decided and applied, for its status write (rebuilt on a conflict from the fresh status).
struct Outcome<'a> {
    obj: &'a InferenceAutoscaler,
    g: &'a Gathered,
    r: &'a Round,
    applied: &'a Applied,
    recommendation: Option<crd::RecommendationStatus>,
    allocation: crd::AllocationStatus,
    ledger: Option<crd::ColdStartLedgerStatus>,
    flex_neighbours: Option<crd::FlexNeighboursStatus>,
    moving: &'a super::consolidate::Move,
    surge_in_force: bool,
    in_sync: Option<(bool, String, String)>,
    injected: (bool, &'static str, String),
    claims: Option<(bool, &'static str, String)>,
    now_sys: SystemTime,
    now_k8s: &'a Time,
}

/// The status after a round, from `prev` (the object's, or a fresh read after a conflict): the decision's
/// conditions and fields, then each feature's part (allocation, cold-start ledger, sleep, flex neighbours, class)
/// and the conditions of consolidation, the allocation, injection and isolation.
fn round_status(prev: Option<&InferenceAutoscalerStatus>, o: &Outcome<'_>) -> InferenceAutoscalerStatus {
    let (obj, g, r) = (o.obj, o.g, o.r);
    let generation = obj.metadata.generation;
    let now_k8s = o.now_k8s;
    let mut st = status::after_decision(
        prev,
        generation,
        &g.target,
        r.input.ready_replicas,
        &r.decision,
        r.constraint,
        o.applied,
        o.recommendation.clone(),
        now_k8s,
    );
    st.allocation = Some(o.allocation.clone());
    st.cold_start_ledger = o.ledger.clone();
    st.rest = super::sleep::status(r, g.sleep.sleeping);
    st.flex_neighbours =
        super::neighbours::carry(st.flex_neighbours.take(), o.flex_neighbours.clone(), o.now_sys);
    status::set_workload_class(&mut st, r.class.as_ref());
    let had = st
        .conditions
        .iter()
        .any(|c| c.type_ == super::consolidate::CONSOLIDATING);
    let conditions = [
        o.moving
            .condition(had, o.surge_in_force)
            .map(|(ok, reason, message)| (super::consolidate::CONSOLIDATING, ok, reason.to_owned(), message)),
        o.in_sync
            .clone()
            .map(|(ok, reason, message)| (super::rollout::ALLOCATION_IN_SYNC, ok, reason, message)),
        Some((
            super::injection::SIDECARS_INJECTED,
            o.injected.0,
            o.injected.1.to_owned(),
            o.injected.2.clone(),
        )),
        super::isolation::condition(obj.status.as_ref(), r),
        o.claims.clone().map(|(ok, reason, message)| {
            (
                super::claims::GPU_CLAIMS_ALLOCATED,
                ok,
                reason.to_owned(),
                message,
            )
        }),
    ];
    for (type_, ok, reason, message) in conditions.into_iter().flatten() {
        status::set_condition(
            &mut st.conditions,
            type_,
            ok,
            &reason,
            &message,
            generation,
            now_k8s,
        );
    }
    st
}

/// The flex lane's neighbours: what the model's ready pods show of their GPU neighbours this round, kept in the
/// process's book (`super::neighbours`).
fn neighbours_seen(
    ctx: &Context,
    key: &str,
    g: &Gathered,
    r: &Round,
    now_sys: SystemTime,
) -> Option<crd::FlexNeighboursStatus> {
    let slo = tessera_core::wire::sidecar::Objective::of(&r.policy, None).ttft_slo_secs;
    let seen = super::neighbours::pods_seen(&g.all_pods, &g.ready_pods, &g.observed.sidecars, slo);
    ctx.neighbours.record(key, seen, now_sys)
}

/// The `/ui` page's view of this model after its round.
fn publish_to_page(ctx: &Context, obj: &InferenceAutoscaler, g: &Gathered, r: &Round, now: Timestamp) {
    let docs: Vec<SidecarStatus> = g.observed.sidecars.iter().flatten().cloned().collect();
    let seen = crate::ui::observe::model_from_reconcile(
        obj,
        &r.policy,
        &docs,
        &r.decision,
        r.constraint,
        r.input.ready_replicas,
        r.class.as_ref(),
        now.as_millis(),
    );
    ctx.ui.observe_model(seen, now.as_millis());
}

/// Step 7: the allocation half of the round (`super::allocation`) on what was gathered and decided.
async fn allocation_round(
    ctx: &Context,
    obj: &InferenceAutoscaler,
    g: &Gathered,
    r: &Round,
    recommendation: Option<&crd::RecommendationStatus>,
    now: Timestamp,
    now_k8s: &Time,
) -> (crd::AllocationStatus, Option<(bool, String, String)>) {
    let gpu = obj.spec.gpu.clone().unwrap_or_default();
    let as_i32 = |n: u32| i32::try_from(n).unwrap_or(i32::MAX);
    let round = AllocationRound {
        target_api: &g.target_api,
        target: &g.target,
        all_pods: &g.all_pods,
        gpu: &gpu,
        recommendation,
        urgency: r.urgency,
        replicas: (
            as_i32(g.scale_count()),
            as_i32(r.input.ready_replicas),
            as_i32(r.decision.desired_replicas),
            obj.spec.min_replicas,
        ),
        now_ms: now.as_millis(),
        now_k8s,
    };
    allocation_and_roll(ctx, obj, round).await
}

/// Applies the round's count: marks the pods a retire takes off a draining GPU (a failed mark holds the count
/// this round: the ReplicaSet would pick another pod), then writes `/scale` when the count differs. Returns the
/// count applied and how the write went.
async fn apply_count(
    ctx: &Context,
    obj: &InferenceAutoscaler,
    g: &Gathered,
    moving: &super::consolidate::Move,
    r: &Round,
) -> (u32, Applied) {
    // `/scale`'s count holds the sleeping replicas too, and so does the count written (`Round::pods`).
    let current = g.scale_count();
    let mut replicas = r.pods();
    // One owner per /scale: KEDA's, or nobody's while two claim it (`core::keda::ownership`).
    match tessera_core::keda::ownership(obj.spec.scaled_by.owner(), &g.target, g.others.as_deref()) {
        tessera_core::keda::Ownership::Tessera => {}
        tessera_core::keda::Ownership::Keda { scaled_object } => {
            super::owner_events::announce_decision(ctx, obj, &r.decision).await;
            return (replicas, Applied::Published { scaled_object });
        }
        tessera_core::keda::Ownership::Conflict(message) => {
            super::owner_events::warn_conflict(ctx, obj, &message).await;
            return (current, Applied::Conflict(message));
        }
    }
    if !moving.to_retire().is_empty() {
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &obj.namespace().unwrap_or_default());
        if let Err(e) = super::consolidate::mark_leaving(&pods, moving.to_retire()).await {
            warn!(error = %e, pods = ?moving.to_retire(), "could not mark pods leaving a draining GPU; not scaling down this round");
            replicas = current.max(replicas);
        }
    }
    let applied = if replicas != current {
        apply(ctx, obj, &g.target_api, &g.target, &r.decision, current, replicas).await
    } else {
        Applied::Unchanged
    };
    (replicas, applied)
}

/// An invalid spec: reported as the `Valid` condition and a Warning event (once per message), and nothing is
/// scaled.
async fn invalid_spec(
    ctx: &Context,
    obj: &InferenceAutoscaler,
    ias_api: &Api<InferenceAutoscaler>,
    errors: &[String],
    now_k8s: &Time,
) -> Result<(), Error> {
    // The simulator says the same of a scenario carrying this spec (`tessera_sim::simulate::crd_model`).
    let message = crate::crd::invalid_spec_message(errors);
    let message = message.as_str();
    let was_invalid = obj.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == status::VALID && c.status == "False" && c.message == message)
    });
    if !was_invalid {
        publish(ctx, obj, EventType::Warning, "InvalidSpec", "Validate", message).await;
    }
    warn!(%message, "invalid spec: not scaling");
    write_status(ias_api, obj, |prev| {
        status::after_failure(
            prev,
            obj.metadata.generation,
            status::VALID,
            "InvalidSpec",
            message,
            now_k8s,
        )
    })
    .await
}

/// What a reconcile gathered from the cluster for its round, and what applying the round needs.
pub(super) struct Gathered {
    /// What the round observes.
    pub(super) observed: Observed,
    /// The target's API and `Kind/name`.
    target_api: Api<DynamicObject>,
    target: String,
    /// The target's pods, ready or not.
    all_pods: Vec<Pod>,
    /// The fresh replicas' recommendations.
    recommendations: Vec<tessera_core::recommend::Recommendation>,
    /// The activators' keys of the model's names (`"<namespace>/<model>"`).
    keys: Vec<String>,
    /// Where the pods are relative to a draining GPU (the move not decided yet).
    placed: super::consolidate::Move,
    /// Other autoscalers (HPAs, KEDA's among them) on the same workload; `None` when they could not be listed.
    others: Option<Vec<tessera_core::keda::OtherScaler>>,
    /// What sleep mode gathered: the documents of every pod (asleep ones too), the replicas asleep or let go.
    sleep: super::sleep::Gathered,
    /// Each ready replica's pod name and sidecar URL, in `observed.sidecars`' order (where the objective is
    /// handed over, and whose GPU neighbours the flex lane reads).
    ready_pods: Vec<(String, String)>,
}

impl Gathered {
    /// `/scale`'s count as read: the running replicas, the sleeping ones and those let go.
    fn scale_count(&self) -> u32 {
        self.observed.replicas + self.sleep.sleeping + self.sleep.leaving
    }
}

/// Steps 2-4 of a reconcile: the target's `/scale`, its pods and their sidecars, the activators' demand, the
/// share's room, the cold start measured from the pods, the budget group's claims and where the pods sit, as a
/// [`Observed`]. A failure to read `/scale` is reported in status and an Event.
pub(super) async fn gather(
    ctx: &Context,
    obj: &InferenceAutoscaler,
    ias_api: &Api<InferenceAutoscaler>,
    policy: &scale::ScalePolicy,
    now_sys: SystemTime,
) -> Result<Gathered, Error> {
    let ns = obj.namespace().ok_or(Error::NoNamespace)?;
    let name = obj.name_any();
    let key = format!("{ns}/{name}");
    let spec = &obj.spec;
    let target = format!("{}/{}", spec.scale_target_ref.kind, spec.scale_target_ref.name);
    let now_ms = crate::unix_ms(now_sys);

    // 2. The target's /scale.
    let ar = target_resource(&spec.scale_target_ref.api_version, &spec.scale_target_ref.kind)?;
    let target_api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &ar);
    let (current, selector) = read_scale(ctx, obj, ias_api, &target_api, &target, now_sys).await?;

    // 3. Ready pods and their sidecars.
    let all_pods = list_pods(ctx, &ns, &target, current, &selector).await?;
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
    let (sidecars, recommendations) = read_sidecars(ctx, &ready_pods).await;
    super::gate_events::publish_round(ctx, obj, &ns, &ready_pods, &sidecars).await;
    // Sleep mode reads what is asleep and the wakes measured (the instruction is written per pod).
    let ready_docs: Vec<(String, SidecarStatus)> = ready_pods
        .iter()
        .map(|(pod, _)| pod.clone())
        .zip(sidecars.iter())
        .filter_map(|(pod, st)| st.clone().map(|st| (pod, st)))
        .collect();
    let cold_start = observed_cold_start(&all_pods);
    let mut sleep = super::sleep::gather(ctx, obj, &all_pods, ready_docs, current, cold_start).await;

    // 4. Demand (the activators' documents, polled in the background), the share's room, the cold start measured
    // from the pods (every replica, the first included, starts as a pod here) and the budget group's claims.
    let keys: Vec<String> = spec.model_names.iter().map(|m| model_key(&ns, m)).collect();
    let demand = demand_from(
        &ctx.activators.samples(),
        &keys,
        now_ms,
        ctx.settings.activator_max_age,
    );
    let peers = budget_peers(ctx, policy, &ns, &key, now_sys).await;
    let status = obj.status.as_ref();
    let movable = super::deletion_cost::honoured_by(&spec.scale_target_ref.kind);
    let placed = super::consolidate::placement(
        &all_pods,
        super::isolation::leaving(status, &ctx.consolidation, movable),
    );
    let class = super::class::signals(
        obj,
        &all_pods,
        scale::inputs::mix_from(
            &ctx.activators.samples(),
            &keys,
            now_ms,
            ctx.settings.activator_max_age,
        ),
    );
    let observed = Observed {
        name,
        // The round reads the running replicas: a sleeping one (or one let go) is `/scale`'s but not the rule's
        // (`Round::pods`).
        replicas: current - sleep.sleeping - sleep.leaving,
        surged: super::consolidate::surged(obj.status.as_ref()),
        room: share_room(obj, &sidecars),
        sidecars,
        demand,
        external_rate: None,
        leads: scale::joint::LeadTimes::one(cold_start),
        peers,
        placement: placed.placement,
        max_signal_age: ctx.settings.max_signal_age,
        class: Some(class),
        sleep: sleep.round.take(),
        isolation: Some(super::isolation::facts(status, &all_pods, &ctx.consolidation)),
    };
    Ok(Gathered {
        observed,
        target_api,
        target,
        all_pods,
        recommendations,
        keys,
        placed,
        others: ctx.scalers.other_scalers(&ns, &spec.scale_target_ref),
        sleep,
        ready_pods,
    })
}

/// The target's `/scale`: its count and the selector of its pods. A failure to read it is reported in status and
/// an Event.
async fn read_scale(
    ctx: &Context,
    obj: &InferenceAutoscaler,
    ias_api: &Api<InferenceAutoscaler>,
    target_api: &Api<DynamicObject>,
    target: &str,
    now_sys: SystemTime,
) -> Result<(u32, String), Error> {
    // A Deployment's /scale from the watch when it can answer (`super::scales`): no request per model per round.
    let r = &obj.spec.scale_target_ref;
    if r.kind == "Deployment"
        && r.api_version == "apps/v1"
        && let Some(ns) = obj.metadata.namespace.as_deref()
        && let Some(answer) = ctx.deployments.scale(ns, &r.name)
    {
        return Ok(answer);
    }
    let scale = match target_api.get_scale(&obj.spec.scale_target_ref.name).await {
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
            let now_k8s = status::k8s_time(now_sys);
            write_status(ias_api, obj, |prev| {
                let generation = obj.metadata.generation;
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
            return Err(Error::GetScale {
                target: target.to_owned(),
                source,
            });
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
    Ok((current, selector))
}

/// The target's pods, ready or not (none to list at zero or without a selector).
async fn list_pods(
    ctx: &Context,
    ns: &str,
    target: &str,
    current: u32,
    selector: &str,
) -> Result<Vec<Pod>, Error> {
    if current == 0 || selector.is_empty() {
        return Ok(Vec::new());
    }
    // From the watch when it can answer (`super::pods`): no request per model per round.
    if let Some(pods) = ctx.pods.matching(ns, selector) {
        return Ok(pods);
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let list = pods
        .list(&ListParams::default().labels(selector))
        .await
        .map_err(|source| Error::ListPods {
            target: target.to_owned(),
            selector: selector.to_owned(),
            source,
        })?;
    Ok(list.items)
}

/// Every ready replica's sidecar document, read concurrently (`None`: unreadable, counted as missing, never as
/// idle), and the fresh replicas' recommendations.
async fn read_sidecars(
    ctx: &Context,
    ready_pods: &[(String, String)],
) -> (
    Vec<Option<SidecarStatus>>,
    Vec<tessera_core::recommend::Recommendation>,
) {
    let statuses =
        futures::future::join_all(ready_pods.iter().map(|(_, url)| ctx.signals.sidecar_status(url))).await;
    let mut recommendations = Vec::new();
    let mut sidecars = Vec::with_capacity(ready_pods.len());
    for ((pod, url), result) in ready_pods.iter().zip(statuses) {
        match result {
            Ok(st) => {
                let fresh = scale::inputs::replica_signals(&st, ctx.settings.max_signal_age).fresh;
                if fresh && let Some(r) = st.recommendation() {
                    recommendations.push(r.clone());
                }
                sidecars.push(Some(st));
            }
            Err(e) => {
                debug!(%pod, %url, error = %e, "sidecar status unavailable: counted as missing");
                ctx.metrics.scrape_failure("sidecar", e.label());
                sidecars.push(None);
            }
        }
    }
    (sidecars, recommendations)
}

/// A cold-start budget group's claims in the namespace: the members this process has not decided for yet are
/// read from their status (`namespace_claims`). None without a group.
async fn budget_peers(
    ctx: &Context,
    policy: &scale::ScalePolicy,
    ns: &str,
    key: &str,
    now_sys: SystemTime,
) -> Vec<tessera_core::scale::coldstart::BudgetClaim> {
    let grouped = policy
        .scale_to_zero
        .as_ref()
        .is_some_and(|z| z.cold_start_budget_group.is_some());
    if !grouped {
        return Vec::new();
    }
    let watched = watched_objects(&ctx.objects).await;
    let now = timestamp(now_sys);
    ctx.states
        .lock()
        .map(|s| namespace_claims(&s, &watched, ns, key, now))
        .unwrap_or_default()
}

/// The round on the model's history (`ctx.states`, resumed from status when this process has none), the history
/// after it, and the ledger copy for status. A poisoned lock only loses history, which restarts the windows: safe
/// (see the module docs).
fn take_round(
    ctx: &Context,
    obj: &InferenceAutoscaler,
    policy: &scale::ScalePolicy,
    observed: &Observed,
    key: &str,
    now: Timestamp,
) -> (Round, ScaleState, Option<crd::ColdStartLedgerStatus>) {
    let mut states = ctx.states.lock().ok();
    let mut lost = ScaleState::default();
    let state = match states.as_mut() {
        Some(s) => s.entry(key.to_owned()).or_insert_with(|| {
            let mut state = resume_state(obj, policy, now);
            state.class = super::class::resume(obj);
            state
        }),
        None => &mut lost,
    };
    let r = tessera_core::round::round(policy, observed, state, now);
    let state = state.clone();
    // The ledger is kept under the policy the round decided with: a class may have set its budget.
    let ledger = ledger_status(obj, &r.policy, &state, now);
    drop(states);
    let ns = obj.namespace().unwrap_or_default();
    publish_budget_metrics(&ctx.metrics, &ns, r.joint.budget_group.as_ref());
    (r, state, ledger)
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
    scale::joint::ShareRoom::of(
        gpu.sharing == crd::Sharing::Fractional,
        gpu.compute_fraction.as_deref().is_none_or(|c| c == "auto"),
        in_force,
        scale::inputs::gpu_memory_bytes(docs),
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
            "{} (+1 while a pod moves off a GPU being drained, or shared while the model is isolated)",
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
            if let Some(ns) = obj.metadata.namespace.as_deref() {
                ctx.deployments
                    .wrote(ns, &obj.spec.scale_target_ref.name, replicas);
            }
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
/// A status equal on the wire to the one the object already has is not written: every sync would otherwise patch
/// each object (and wake every watcher of it) for nothing.
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
        // Compared as the API server would store them (a `metav1.Time` keeps whole seconds), not as Rust values.
        let changed = status::changed_fields(previous.as_ref(), &status);
        if changed.is_empty() {
            return Ok(());
        }
        debug!(model = %name, ?changed, "writing status");
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

/// The API resource for a scale target; plural by kube's English rules (deployments, statefulsets, ...).
pub fn target_resource(api_version: &str, kind: &str) -> Result<ApiResource, Error> {
    let (group, version) =
        crd::group_version(api_version).ok_or_else(|| Error::BadApiVersion(api_version.to_owned()))?;
    Ok(ApiResource::from_gvk(&GroupVersionKind::gvk(
        group, version, kind,
    )))
}

fn timestamp(t: SystemTime) -> Timestamp {
    Timestamp::from_millis(crate::unix_ms(t))
}

#[cfg(test)]
#[path = "reconcile_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "sim_parity_tests.rs"]
mod sim_parity_tests;

#[cfg(test)]
#[path = "allocation_parity_tests.rs"]
mod allocation_parity_tests;
