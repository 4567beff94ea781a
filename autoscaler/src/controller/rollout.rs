//! `gpu.updateMode` in the controller: which allocation is in force (status.allocation, read by the webhook at pod
//! creation), and, under `Recreate`, rolling running pods onto it.
//!
//! The rules are pure and live in [`tessera_core::rollout`], taken in one call ([`tessera_core::rollout::fold`], the
//! simulator's too); this module gathers their inputs from the cluster and applies the answer:
//! - **in force**: folded every reconcile from the fresh recommendation and the previous status (so a restart or a
//!   new leader loses nothing: the candidate's clock is in status);
//! - **roll**: a merge patch of [`TEMPLATE_HASH_ANNOTATION`] on the workload's pod template, carrying the
//!   workload's `resourceVersion` (a 409 Conflict re-reads and decides again). The Deployment or StatefulSet
//!   controller then replaces pods with its own strategy — surge first where the strategy allows — and the webhook
//!   gives each new pod the allocation in force. Each roll is an Event with before/after and the reason, and the
//!   `AllocationInSync` condition says what is happening;
//! - **scale-down order** (`Initial` and `Recreate`, Deployments): a pod whose allocation drifted from the one in
//!   force carries [`DRIFTED_COST`] as its `controller.kubernetes.io/pod-deletion-cost`, so the ReplicaSet removes
//!   it before the pods that run the allocation in force when the model scales down; the mark comes off when it no
//!   longer applies.
//!
//! RBAC this needs: `get`/`patch` on the scaled kinds (deployments, statefulsets), `list` on
//! poddisruptionbudgets and `patch` on pods (the deletion cost, as consolidation), in the model's namespace.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::Value;
use tessera_core::rollout::{
    self, Allocation, Candidate, Fixed, Fold, FoldInput, HoldReason, Kept, RollDecision, RolloutConfig,
    UpdateMode, Urgency, Workload,
};
use tracing::{debug, info, warn};

use crate::crd::{AllocationStatus, AllocationValues, GpuSpec, RecommendationStatus};

/// Pod-template annotation whose change makes the workload controller roll its pods onto the allocation in force.
pub const TEMPLATE_HASH_ANNOTATION: &str = "tessera.dev/allocation-hash";
/// Pod annotation (written by the webhook): GPU memory the pod runs with, MiB.
pub const POD_MEMORY_ANNOTATION: &str = "tessera.dev/gpu-memory";
/// Pod annotation (written by the webhook): compute share the pod runs with.
pub const POD_COMPUTE_ANNOTATION: &str = "tessera.dev/gpu-compute-fraction";
/// The status condition that reports the roll state.
pub const ALLOCATION_IN_SYNC: &str = "AllocationInSync";

/// Models being rolled, by pool key, so that one pool rolls one model at a time (held by the leader only).
#[derive(Debug, Default)]
pub struct Rolling(Mutex<HashMap<String, String>>);

impl Rolling {
    /// Whether another model than `model` is rolling in `pool`.
    pub fn busy_for(&self, pool: &str, model: &str) -> bool {
        self.0
            .lock()
            .map(|m| m.get(pool).is_some_and(|other| other != model))
            .unwrap_or(true)
    }

    /// Records that `model` rolls (`true`) or finished (`false`) in `pool`.
    pub fn set(&self, pool: &str, model: &str, rolling: bool) {
        if let Ok(mut m) = self.0.lock() {
            if rolling {
                m.insert(pool.to_owned(), model.to_owned());
            } else if m.get(pool).is_some_and(|o| o == model) {
                m.remove(pool);
            }
        }
    }
}

/// The pool key for the one-roll-at-a-time rule: fractional models share GPUs (their pods move between capacity
/// pods), so they roll one at a time; a whole-GPU model rolls on its own.
pub fn pool_key(gpu: &GpuSpec, model_key: &str) -> String {
    match gpu.sharing {
        crate::crd::Sharing::Fractional => "fractional".to_owned(),
        crate::crd::Sharing::Whole => format!("whole:{model_key}"),
    }
}

/// The core's update mode for the CRD's.
pub fn mode(gpu: &GpuSpec) -> UpdateMode {
    match gpu.update_mode {
        crate::crd::UpdateMode::Off => UpdateMode::Off,
        crate::crd::UpdateMode::Initial => UpdateMode::Initial,
        crate::crd::UpdateMode::Recreate => UpdateMode::Recreate,
    }
}

/// Values the policy fixes (`gpu.memory: <MiB>`, `gpu.computeFraction: "<f>"`).
pub fn fixed(gpu: &GpuSpec) -> Fixed {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    Fixed {
        memory_mib: match &gpu.memory {
            Some(IntOrString::Int(m)) => u64::try_from(*m).ok().filter(|m| *m > 0),
            Some(IntOrString::String(s)) => s.parse::<u64>().ok().filter(|m| *m > 0),
            None => None,
        },
        compute_fraction: gpu
            .compute_fraction
            .as_deref()
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|f| *f > 0.0 && *f <= 1.0),
    }
}

fn to_values(a: &Allocation) -> AllocationValues {
    AllocationValues {
        gpu_memory_mib: i64::try_from(a.memory_mib).unwrap_or(i64::MAX),
        compute_fraction: a.compute_fraction,
        kv_cache_memory_bytes: a.kv_cache_memory_bytes.and_then(|b| i64::try_from(b).ok()),
        gpu_memory_utilization: a.gpu_memory_utilization,
    }
}

/// The `pod-deletion-cost` a pod gets while its allocation has drifted from the one in force
/// ([`tessera_core::rollout::drifted`]): a ReplicaSet scaling down removes the lowest cost first, so a model's
/// count going down takes the pods that run an old allocation before those that run the one in force. It sits
/// above consolidation's cost for pods leaving a draining GPU (`i32::MIN`, they go first) and below any cost a
/// user would set by hand.
pub const DRIFTED_COST: i32 = i32::MIN / 2;

/// Whether this round's mark decision may touch `pod`'s deletion cost: not when it is being deleted, nor when
/// someone else set the cost (a user, or consolidation marking it to leave a draining GPU). `Some(true)` when the
/// cost is already ours.
fn ours_to_mark(pod: &Pod) -> Option<bool> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    match pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(crate::pool::POD_DELETION_COST))
    {
        None => Some(false),
        Some(c) if c.trim().parse::<i32>().ok() == Some(DRIFTED_COST) => Some(true),
        Some(_) => None,
    }
}

/// What to change on the pods' `pod-deletion-cost` this round (pure): `(pod, Some(DRIFTED_COST))` for a pod that
/// has drifted from the allocation in force (`drifted`, one per pod as [`tessera_core::rollout::fold`] judged them)
/// and is not marked yet, `(pod, None)` to take the mark off one that no longer has (the allocation in force moved
/// back, or there is none). A pod whose cost someone else set (a user, or consolidation marking it to leave) is
/// never touched, nor one being deleted, nor one whose allocation is unknown (missing annotations are never judged).
pub fn deletion_cost_changes(pods: &[Pod], drifted: &[bool]) -> Vec<(String, Option<i32>)> {
    pods.iter()
        .zip(drifted)
        .filter_map(|(p, &drifted)| {
            let ours = ours_to_mark(p)?;
            let name = p.metadata.name.clone()?;
            match (drifted, ours) {
                (true, false) => Some((name, Some(DRIFTED_COST))),
                (false, true) => Some((name, None)),
                _ => None,
            }
        })
        .collect()
}

/// How many of `pods` this rule marks to go first on a scale-down: drifted (`drifted`, one per pod), and not ranked
/// by someone else (what the status counts).
pub fn marked_count(pods: &[Pod], drifted: &[bool]) -> usize {
    pods.iter()
        .zip(drifted)
        .filter(|(p, d)| **d && ours_to_mark(p).is_some())
        .count()
}

fn from_values(v: &AllocationValues) -> Allocation {
    Allocation {
        memory_mib: u64::try_from(v.gpu_memory_mib).unwrap_or(0),
        compute_fraction: v.compute_fraction,
        kv_cache_memory_bytes: v.kv_cache_memory_bytes.and_then(|b| u64::try_from(b).ok()),
        gpu_memory_utilization: v.gpu_memory_utilization,
    }
}

/// The recommendation as an allocation, when it has both memory and compute.
pub fn recommended(rec: Option<&RecommendationStatus>) -> Option<Allocation> {
    let rec = rec?;
    Some(Allocation {
        memory_mib: u64::try_from(rec.gpu_memory_mib?).ok()?,
        compute_fraction: rec.compute_fraction?,
        kv_cache_memory_bytes: rec.kv_cache_memory_bytes.and_then(|b| u64::try_from(b).ok()),
        gpu_memory_utilization: rec.gpu_memory_utilization,
    })
}

fn time_ms(t: &Time) -> u64 {
    u64::try_from(t.0.as_millisecond()).unwrap_or(0)
}

fn ms_time(ms: u64) -> Option<Time> {
    i64::try_from(ms)
        .ok()
        .and_then(|m| k8s_openapi::jiff::Timestamp::from_millisecond(m).ok())
        .map(Time)
}

/// What the last round kept, read back from `status.allocation` (so a restart or a new leader loses no clock).
fn kept(previous: Option<&AllocationStatus>) -> Kept {
    Kept {
        candidate: previous.and_then(|p| {
            Some(Candidate {
                alloc: from_values(p.candidate.as_ref()?),
                since_ms: time_ms(p.candidate_since.as_ref()?),
            })
        }),
        in_force: previous.and_then(|p| p.in_force.as_ref()).map(from_values),
        drift_since_ms: previous.and_then(|p| p.drift_since.as_ref()).map(time_ms),
    }
}

/// The allocation status after this round's fold; the roll's own fields (template hash, last roll, its reason) are
/// carried from `previous` until the roll is applied.
pub fn status_of(previous: Option<&AllocationStatus>, fold: &Fold) -> AllocationStatus {
    let kept = &fold.kept;
    AllocationStatus {
        in_force: kept.in_force.as_ref().map(to_values),
        reason: fold.reason.label().to_owned(),
        candidate: kept.candidate.as_ref().map(|c| to_values(&c.alloc)),
        candidate_since: kept.candidate.and_then(|c| ms_time(c.since_ms)),
        drift_since: kept.drift_since_ms.and_then(ms_time),
        template_hash: previous.and_then(|p| p.template_hash.clone()),
        last_roll_time: previous.and_then(|p| p.last_roll_time.clone()),
        roll_reason: previous.and_then(|p| p.roll_reason.clone()),
    }
}

/// What the allocation half reads of the model this round, as the reconcile gathered it.
#[derive(Debug, Clone, Copy)]
pub struct AllocationFacts<'a> {
    /// The model's pods (all of them, ready or not).
    pub pods: &'a [Pod],
    /// The allocation status the last round left.
    pub previous: Option<&'a AllocationStatus>,
    /// This round's recommendation; `None` when no fresh one exists (missing data keeps everything as it was).
    pub recommendation: Option<&'a RecommendationStatus>,
    /// The policy's GPU settings.
    pub gpu: &'a GpuSpec,
    /// Replica counts (spec, ready, desired) and the policy floor.
    pub replicas: (i32, i32, i32, i32),
    /// What hurries a growth this round (preemptions, a replica over the TTFT objective).
    pub urgency: Urgency,
    /// Now.
    pub now_ms: u64,
}

/// What the roll rule reads of the workload, gathered under `updateMode: Recreate` only.
#[derive(Debug, Clone, Copy)]
pub struct RollFacts<'a> {
    /// The workload object's state and strategy.
    pub workload: &'a WorkloadFacts,
    /// A PodDisruptionBudget over the pods allows no disruption now.
    pub disruption_blocked: bool,
    /// Another model of the pool is rolling.
    pub pool_busy: bool,
}

/// The allocation half of the round on what the reconcile gathered (pure): [`tessera_core::rollout::fold`], the
/// simulator's call too. `roll: None` (not `Recreate`, or the workload could not be read): no workload facts, and
/// the roll decision is not one to apply.
pub fn fold_round(facts: &AllocationFacts<'_>, roll: Option<RollFacts<'_>>, cfg: &RolloutConfig) -> Fold {
    let pods: Vec<Option<Allocation>> = facts.pods.iter().map(pod_allocation).collect();
    let (replicas, ready, desired, min) = facts.replicas;
    let workload = roll.map_or_else(Workload::default, |r| Workload {
        replicas,
        ready_replicas: ready,
        desired_replicas: desired,
        min_replicas: min,
        max_unavailable: r.workload.max_unavailable,
        rollout_in_progress: r.workload.rollout_in_progress,
        pool_busy: r.pool_busy,
        disruption_blocked: r.disruption_blocked,
    });
    let template_hash = roll.and_then(|r| r.workload.template_hash.as_deref());
    let carries = |a: &Allocation| template_hash == Some(allocation_hash(&to_values(a)).as_str());
    rollout::fold(
        &FoldInput {
            mode: mode(facts.gpu),
            fixed: fixed(facts.gpu),
            kept: kept(facts.previous),
            recommended: recommended(facts.recommendation),
            urgency: facts.urgency,
            pods: &pods,
            workload,
            template_carries: &carries,
            now_ms: facts.now_ms,
        },
        cfg,
    )
}

/// A pod's allocation from the annotations the webhook wrote; `None` when either is missing or unreadable.
pub fn pod_allocation(pod: &Pod) -> Option<Allocation> {
    let a = pod.metadata.annotations.as_ref()?;
    let memory = a.get(POD_MEMORY_ANNOTATION)?.trim().parse::<u64>().ok()?;
    let compute = a.get(POD_COMPUTE_ANNOTATION)?.trim().parse::<f64>().ok()?;
    Some(Allocation::new(memory, compute))
}

/// What the roll rule needs from the workload object (a Deployment or StatefulSet as read through the API).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct WorkloadFacts {
    /// A previous template is still being rolled out.
    pub rollout_in_progress: bool,
    /// Ready pods the strategy may take down at once.
    pub max_unavailable: i32,
    /// The pod template's labels (to find PodDisruptionBudgets).
    pub template_labels: std::collections::BTreeMap<String, String>,
    /// The template's current [`TEMPLATE_HASH_ANNOTATION`].
    pub template_hash: Option<String>,
}

/// Reads the rollout state and strategy from a Deployment or StatefulSet (other kinds: no rollout known, one pod at
/// a time).
pub fn workload_facts(obj: &DynamicObject, kind: &str) -> WorkloadFacts {
    let d = &obj.data;
    let int = |v: &Value| v.as_i64().and_then(|i| i32::try_from(i).ok());
    let replicas = int(&d["spec"]["replicas"]).unwrap_or(1);
    let generation = obj.metadata.generation;
    let observed = d["status"]["observedGeneration"].as_i64();
    let updated = int(&d["status"]["updatedReplicas"]).unwrap_or(0);
    let total = int(&d["status"]["replicas"]).unwrap_or(0);
    let mut in_progress = generation.is_some() && observed.is_some() && generation != observed;
    in_progress |= updated < replicas || total > updated;
    let max_unavailable = match kind {
        "StatefulSet" => {
            let cur = d["status"]["currentRevision"].as_str();
            let upd = d["status"]["updateRevision"].as_str();
            in_progress |= cur.is_some() && upd.is_some() && cur != upd;
            resolve(
                &d["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"],
                replicas,
                false,
            )
            .unwrap_or(1)
        }
        "Deployment" => match d["spec"]["strategy"]["type"].as_str() {
            Some("Recreate") => replicas,
            _ => resolve(
                &d["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"],
                replicas,
                false,
            )
            // Kubernetes' default: 25%, rounded down.
            .unwrap_or(replicas / 4),
        },
        _ => 1,
    };
    let template_labels = d["spec"]["template"]["metadata"]["labels"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default();
    let template_hash = d["spec"]["template"]["metadata"]["annotations"][TEMPLATE_HASH_ANNOTATION]
        .as_str()
        .map(str::to_owned);
    WorkloadFacts {
        rollout_in_progress: in_progress,
        max_unavailable,
        template_labels,
        template_hash,
    }
}

/// An int-or-percent of `replicas` (rounded up when `round_up`, else down), as Kubernetes resolves
/// `maxSurge`/`maxUnavailable`.
fn resolve(v: &Value, replicas: i32, round_up: bool) -> Option<i32> {
    if let Some(i) = v.as_i64() {
        return i32::try_from(i).ok();
    }
    let pct = v.as_str()?.strip_suffix('%')?.parse::<f64>().ok()?;
    let x = f64::from(replicas) * pct / 100.0;
    Some(if round_up { x.ceil() } else { x.floor() } as i32)
}

/// Whether a PodDisruptionBudget selecting these labels allows no disruption now.
pub fn disruption_blocked(
    pdbs: &[PodDisruptionBudget],
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    pdbs.iter().any(|pdb| {
        let selects = pdb
            .spec
            .as_ref()
            .and_then(|s| s.selector.as_ref())
            .and_then(|sel| sel.match_labels.as_ref())
            .is_some_and(|ml| !ml.is_empty() && ml.iter().all(|(k, v)| labels.get(k) == Some(v)));
        // An absent count is the API's default, 0: no disruption allowed.
        selects
            && pdb
                .status
                .as_ref()
                .is_some_and(|s| s.disruptions_allowed.unwrap_or(0) <= 0)
    })
}

/// A short, stable hash of an allocation (what the template annotation carries).
pub fn allocation_hash(a: &AllocationValues) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    a.gpu_memory_mib.hash(&mut h);
    a.compute_fraction.to_bits().hash(&mut h);
    a.kv_cache_memory_bytes.hash(&mut h);
    a.gpu_memory_utilization.map(f64::to_bits).hash(&mut h);
    format!("{:016x}", h.finish())
}

/// What a roll attempt did.
#[derive(Debug, Clone, PartialEq)]
pub enum RollOutcome {
    /// Nothing to do, with the reason.
    Held(HoldReason),
    /// The template annotation was patched.
    Rolled {
        /// Why.
        reason: &'static str,
        /// The hash written.
        hash: String,
        /// Human-readable before → after.
        message: String,
    },
    /// The patch failed (after retrying conflicts).
    Failed(String),
}

/// Everything [`fold_and_roll`] needs about the model this round.
#[derive(Debug)]
pub struct RollRequest<'a> {
    /// The workload's API (the scale target's kind).
    pub target_api: &'a Api<DynamicObject>,
    /// PodDisruptionBudgets in the namespace.
    pub pdb_api: Api<PodDisruptionBudget>,
    /// Kind (Deployment/StatefulSet/...).
    pub kind: &'a str,
    /// Name of the workload.
    pub name: &'a str,
    /// `namespace/name` of the InferenceAutoscaler.
    pub model_key: &'a str,
    /// What the fold reads of the model.
    pub facts: AllocationFacts<'a>,
}

/// The workload as read for a roll: the object (its `resourceVersion` guards the patch), its facts, and whether a
/// PodDisruptionBudget blocks a disruption.
async fn read_workload(req: &RollRequest<'_>) -> Result<(DynamicObject, WorkloadFacts, bool), String> {
    let workload = req
        .target_api
        .get(req.name)
        .await
        .map_err(|e| format!("reading {}/{}: {e}", req.kind, req.name))?;
    let facts = workload_facts(&workload, req.kind);
    let pdbs = match req.pdb_api.list(&ListParams::default()).await {
        Ok(l) => l.items,
        // Unknown budgets: never roll blind.
        Err(e) => return Err(format!("listing PodDisruptionBudgets: {e}")),
    };
    let blocked = disruption_blocked(&pdbs, &facts.template_labels);
    Ok((workload, facts, blocked))
}

/// Folds the allocation (`fold_round`) and, under `Recreate`, rolls when the fold says so: gathers the workload
/// and its budgets first, and on a 409 Conflict re-reads and folds again. Returns the fold (the status and the
/// pods' marks follow from it) and what the roll did.
pub async fn fold_and_roll(
    req: RollRequest<'_>,
    rolling: &Rolling,
    cfg: &RolloutConfig,
) -> (Fold, RollOutcome) {
    if mode(req.facts.gpu) != UpdateMode::Recreate {
        let fold = fold_round(&req.facts, None, cfg);
        return (fold, RollOutcome::Held(HoldReason::ModeNotRecreate));
    }
    let pool = pool_key(req.facts.gpu, req.model_key);
    const ATTEMPTS: usize = 3;
    for attempt in 1..=ATTEMPTS {
        let (workload, facts, blocked) = match read_workload(&req).await {
            Ok(read) => read,
            Err(message) => return (fold_round(&req.facts, None, cfg), RollOutcome::Failed(message)),
        };
        if !facts.rollout_in_progress {
            rolling.set(&pool, req.model_key, false);
        }
        let roll = RollFacts {
            workload: &facts,
            disruption_blocked: blocked,
            pool_busy: rolling.busy_for(&pool, req.model_key),
        };
        let fold = fold_round(&req.facts, Some(roll), cfg);
        let reason = match fold.roll {
            RollDecision::Hold(h) => return (fold, RollOutcome::Held(h)),
            RollDecision::Roll(r) => r,
        };
        let Some(target) = fold.kept.in_force.as_ref().map(to_values) else {
            return (fold, RollOutcome::Held(HoldReason::NoRecommendation));
        };
        let hash = allocation_hash(&target);
        match patch_template(&req, &workload, &hash).await {
            Ok(()) => {
                rolling.set(&pool, req.model_key, true);
                let message = roll_message(&req, &target, reason.label());
                info!(%message, "roll started");
                let rolled = RollOutcome::Rolled {
                    reason: reason.label(),
                    hash,
                    message,
                };
                return (fold, rolled);
            }
            Err(kube::Error::Api(e)) if e.code == 409 && attempt < ATTEMPTS => {
                debug!(attempt, "workload changed under the roll: re-reading");
            }
            Err(e) => {
                warn!(error = %e, "roll patch failed");
                return (fold, RollOutcome::Failed(e.to_string()));
            }
        }
    }
    let message = "the workload kept changing (409 Conflict on every attempt)".into();
    (fold_round(&req.facts, None, cfg), RollOutcome::Failed(message))
}

/// The roll itself: the template's hash annotation, as a merge patch carrying the `resourceVersion` read.
async fn patch_template(
    req: &RollRequest<'_>,
    workload: &DynamicObject,
    hash: &str,
) -> Result<(), kube::Error> {
    let patch = serde_json::json!({
        "metadata": { "resourceVersion": workload.metadata.resource_version },
        "spec": { "template": { "metadata": { "annotations": { TEMPLATE_HASH_ANNOTATION: hash } } } }
    });
    let params = PatchParams {
        field_manager: Some(super::status::FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    req.target_api
        .patch(req.name, &params, &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

/// The roll's Event: before (a pod's allocation, when one is known) → after, and why.
fn roll_message(req: &RollRequest<'_>, target: &AllocationValues, reason: &str) -> String {
    match req.facts.pods.iter().find_map(pod_allocation) {
        Some(b) => format!(
            "rolling {}/{}: memory {} → {} MiB, compute {:.2} → {:.2} ({reason})",
            req.kind,
            req.name,
            b.memory_mib,
            target.gpu_memory_mib,
            b.compute_fraction,
            target.compute_fraction,
        ),
        None => format!(
            "rolling {}/{} to {} MiB ({reason})",
            req.kind, req.name, target.gpu_memory_mib
        ),
    }
}

#[cfg(test)]
mod tests;
