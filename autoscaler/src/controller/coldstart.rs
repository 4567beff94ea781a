//! What the controller carries for the cold-start rules between rounds and across processes
//! (`core::scale::coldstart`): the cold start it measures from the target's pods, the claims a budget group's
//! members read from each other (only within a namespace) and the group's gauges, and the copy of a budgeted
//! model's day-long ledger it keeps in `status.coldStartLedger` so a restarted controller or a new leader resumes
//! it instead of holding every warm floor for an hour.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::reflector::Store;
use tessera_core::scale::coldstart::BudgetClaim;
use tessera_core::scale::{self, ScaleState, Timestamp};
use tracing::{debug, info, warn};

use super::metrics::Metrics;
use crate::crd::{self, InferenceAutoscaler};

/// The budget claims the other models of namespace `ns` read for `key`'s round (`core::scale::coldstart::group`),
/// `key`'s own left out. Only `ns`'s: a group name is a namespace's, so another tenant naming the same group
/// neither widens nor spends this one's allowance.
///
/// What each member last published in its own round (`states`), and for a member of `objects` (the watched
/// InferenceAutoscalers) this process has not decided for yet, the claim it stands by on the ledger copy in its
/// status (`joint::standing_claim`). Without those, the first member to decide after a restart or a failover
/// would read its group without the others: fewer requests, and none of their misses spent, which can allot it
/// a scale to zero the whole group's claims would not. A member whose spec or copy cannot be read claims nothing,
/// as before its first hour.
pub(super) fn namespace_claims(
    states: &HashMap<String, ScaleState>,
    objects: &[Arc<InferenceAutoscaler>],
    ns: &str,
    key: &str,
    now: Timestamp,
) -> Vec<BudgetClaim> {
    let in_ns = |k: &str| k != key && k.split_once('/').is_some_and(|(n, _)| n == ns);
    let decided = states
        .iter()
        .filter(|(k, _)| in_ns(k))
        .filter_map(|(_, st)| st.claim.clone());
    let undecided = objects
        .iter()
        .filter(|o| o.namespace().as_deref() == Some(ns))
        .filter(|o| {
            let k = format!("{ns}/{}", o.name_any());
            in_ns(&k) && !states.contains_key(&k)
        })
        .filter_map(|o| standing_claim(o, now));
    decided.chain(undecided).collect()
}

/// How long a round waits for this term's first list of InferenceAutoscalers: the controller's reflector fills
/// its cache only once the whole list is in, while it starts reconciling with the first object listed.
const FIRST_LIST_WAIT: Duration = Duration::from_secs(5);

/// The InferenceAutoscalers the controller watches (`objects`, its reflector's cache), once its first list is
/// in, so that the first rounds after a start see every member of their groups. After [`FIRST_LIST_WAIT`] (a
/// list that slow), what the cache holds; none before the first term has a cache.
pub(super) async fn watched_objects(
    objects: &RwLock<Option<Store<InferenceAutoscaler>>>,
) -> Vec<Arc<InferenceAutoscaler>> {
    let Some(store) = objects.read().ok().and_then(|o| o.clone()) else {
        return Vec::new();
    };
    match tokio::time::timeout(FIRST_LIST_WAIT, store.wait_until_ready()).await {
        Ok(Ok(())) => {}
        Ok(Err(_)) => {
            debug!("the term's watch ended before its first list: reading no group members from status")
        }
        Err(_) => warn!(
            waited = ?FIRST_LIST_WAIT,
            "the first list of InferenceAutoscalers is not in yet: a budget group's members not decided for yet are not read"
        ),
    }
    store.state()
}

/// The claim of a group member this process has not decided for, from its spec and its status's ledger copy.
fn standing_claim(obj: &InferenceAutoscaler, now: Timestamp) -> Option<BudgetClaim> {
    let policy = obj.spec.to_policy().ok()?;
    policy.scale_to_zero.as_ref()?.cold_start_budget_group.as_ref()?;
    let state = kept_state(obj, &policy, now)?.1.ok()?;
    let claim = scale::joint::standing_claim(&policy, &state, &obj.name_any(), now)?;
    debug!(member = %claim.member, group = %claim.group, "read a budget group member from its status before its own round");
    Some(claim)
}

/// A budget group's gauges as one member's round allotted it (`spend`).
pub(super) fn publish_budget_metrics(
    metrics: &Metrics,
    ns: &str,
    spend: Option<&tessera_core::scale::coldstart::GroupSpend>,
) {
    if let Some(spend) = spend {
        metrics.budget_group(ns, spend);
    }
}

/// Removes the series of budget groups that no model this controller keeps a claim for names any more, so the
/// labels stay bounded by the objects. It reads every model's state, so the controller runs it once per sync period
/// (with `reconcile::forget_deleted`), not in each model's round.
pub(super) fn forget_budget_groups(metrics: &Metrics, states: &HashMap<String, ScaleState>) {
    let named: HashSet<(&str, &str)> = states
        .iter()
        .filter_map(|(k, st)| Some((k.split_once('/')?.0, st.claim.as_ref()?.group.as_str())))
        .collect();
    metrics.retain_budget_groups(|namespace, group| named.contains(&(namespace, group)));
}

/// How long the fastest of the target's ready pods took from creation to Ready: a start from zero takes at least
/// that, so when it is over the TTFT objective a cold start cannot meet it (the joint rule's warm floor).
/// `None` without a ready pod to measure (the policy then stays as declared).
pub(super) fn observed_cold_start(pods: &[Pod]) -> Option<Duration> {
    // A pod told to sleep turns not ready while asleep and ready again at its wake, which would read as a start
    // hours long: only pods never told to sleep measure the start.
    pods.iter()
        .filter(|p| {
            !p.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(tessera_core::sleep::command::ANNOTATION))
        })
        .filter_map(|p| {
            let created = p.metadata.creation_timestamp.as_ref()?.0;
            let ready = p
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .find(|c| c.type_ == "Ready" && c.status == "True")?
                .last_transition_time
                .as_ref()?
                .0;
            let ms = ready.duration_since(created).as_millis();
            u64::try_from(ms).ok().map(Duration::from_millis)
        })
        .min()
}

/// The state of a model this process has not decided for yet (it just started, or became the leader): the
/// cold-start ledger resumes from the copy in the status ([`ledger_status`]), so a model with a
/// `coldStartMissBudget` does not fall back to its warm floor for an hour after every restart. A copy that cannot be
/// read is logged and ignored: an empty ledger keeps the floor, which is safe.
pub(super) fn resume_state(
    obj: &InferenceAutoscaler,
    policy: &scale::ScalePolicy,
    now: Timestamp,
) -> ScaleState {
    match kept_state(obj, policy, now) {
        None => ScaleState::default(),
        Some((copy, Ok(state))) => {
            info!(
                samples = copy.samples.len(),
                taken_ms_ago = i64::try_from(now.as_millis()).unwrap_or(i64::MAX) - copy.taken_at_unix_ms,
                "resumed the cold-start ledger from status.coldStartLedger"
            );
            state
        }
        Some((_, Err(e))) => {
            warn!(error = %e, "status.coldStartLedger cannot be resumed: starting an empty ledger (the warm floor holds for an hour)");
            ScaleState::default()
        }
    }
}

/// The ledger copy in `obj`'s status and the state it resumes, for a `policy` that keeps a ledger (the one path
/// from a status copy to a state: this model's resume and a group member's standing claim); `None` without a copy
/// to read, an error naming what is wrong with one that cannot be.
fn kept_state<'a>(
    obj: &'a InferenceAutoscaler,
    policy: &scale::ScalePolicy,
    now: Timestamp,
) -> Option<(&'a crd::ColdStartLedgerStatus, Result<ScaleState, String>)> {
    let copy = obj.status.as_ref()?.cold_start_ledger.as_ref()?;
    policy.keeps_cold_start_ledger().then(|| (copy, copy.resume(now)))
}

/// The copy of the model's cold-start ledger to keep in its status: none without a `coldStartMissBudget`; the
/// status's own until a new one is due ([`ScaleState::copy_due`]: a minute old and something new counted); a fresh
/// one over a copy that cannot be read.
pub(super) fn ledger_status(
    obj: &InferenceAutoscaler,
    policy: &scale::ScalePolicy,
    state: &ScaleState,
    now: Timestamp,
) -> Option<crd::ColdStartLedgerStatus> {
    if !policy.keeps_cold_start_ledger() {
        return None;
    }
    let written = obj.status.as_ref().and_then(|s| s.cold_start_ledger.clone());
    let kept = written.as_ref().and_then(|w| w.resume(now).ok());
    if kept.is_some_and(|k| !state.copy_due(&k)) {
        return written;
    }
    // Nothing counted yet (no copy to take): whatever is written stays.
    state
        .checkpoint(now)
        .map(|c| crd::ColdStartLedgerStatus::from_checkpoint(&c))
        .or(written)
}
