//! Sleep mode in the controller (`spec.sleep`): what the round reads of the replicas' sleep, and the one write
//! that puts a replica to sleep — the pod's `tessera.dev/rest` annotation (`core::sleep::command`), which its
//! sidecar reads from its downward-API file and performs. The decision is the round's (`core::sleep::rule`).
//!
//! A sleeping pod stays a pod of the workload: `/scale` keeps counting it (`Round::pods`), while the round reads
//! only the running replicas. It is not ready while asleep, so the activator holds a request for the model and
//! asks the pod's sidecar for the wake at once.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use tessera_core::round::Round;
use tessera_core::sleep::command::{self, ANNOTATION, Instruct, RestCommand};
use tessera_core::sleep::rule::SleepFacts;
use tessera_core::wire::sidecar::{RestState, SidecarStatus};
use tracing::warn;

use super::context::{Context, publish};
use crate::crd::{InferenceAutoscaler, RestStatus};

/// What sleep mode gathered for a round, and what applying the round's sleep needs.
#[derive(Debug, Default)]
pub struct Gathered {
    /// Every pod's sidecar document that could be read (asleep ones too), by pod name; the sleepers let go left out.
    pub docs: Vec<(String, SidecarStatus)>,
    /// Replicas asleep: counted in `/scale`, not in the round's running replicas.
    pub sleeping: u32,
    /// Sleepers let go (`super::sleep_room`): in `/scale`'s count, neither running nor asleep; and which.
    pub leaving: u32,
    /// The sleepers let go.
    pub let_go: Vec<super::sleep_room::LetGo>,
    /// Its last running replica's room on its GPU: the other models' sleepers the budget lets go once it falls
    /// asleep.
    pub room: tessera_core::pack::sleeping::Room,
    /// The round's sleep input: the policy and what the replicas show (`None` without `spec.sleep`).
    pub round: Option<(tessera_core::sleep::rule::SleepPolicy, SleepFacts)>,
}

/// Sleep mode's half of a reconcile's gathering: `ready` (each ready replica's pod name and readable document) and,
/// with `spec.sleep`, the documents of the pods not ready (a sleeping replica is not ready, so its sidecar is read
/// here too), the sleepers let go, how many replicas are asleep or leaving of `/scale`'s `current`, and the room on
/// the GPU of its last running replica (with the `cold_start` measured from the pods).
pub async fn gather(
    ctx: &Context,
    obj: &InferenceAutoscaler,
    all_pods: &[Pod],
    ready: Vec<(String, SidecarStatus)>,
    current: u32,
    cold_start: Option<Duration>,
) -> Gathered {
    let mut docs = ready;
    let Some(sleep) = obj.spec.sleep.as_ref() else {
        return Gathered {
            docs,
            ..Gathered::default()
        };
    };
    let asleep: Vec<(String, String)> = all_pods
        .iter()
        .filter(|p| !crate::pod_ready(p))
        .filter_map(|p| super::sidecar_url::pod_url(p, ctx.settings.sidecar_port))
        .collect();
    let read = futures::future::join_all(asleep.iter().map(|(_, url)| ctx.signals.sidecar_status(url))).await;
    for ((pod, _), result) in asleep.into_iter().zip(read) {
        if let Ok(st) = result {
            docs.push((pod, st));
        }
    }
    // Sleepers let go (the sleeper budget, their GPU given back) are leaving: neither running nor asleep.
    let let_go = super::sleep_room::let_go(all_pods, &ctx.consolidation.sleepers);
    docs.retain(|(pod, _)| !let_go.iter().any(|l| &l.pod == pod));
    let (mut sleep_facts, sleeping) = facts(&docs.iter().map(|(_, d)| d).collect::<Vec<_>>());
    let sleeping = sleeping.min(current);
    let leaving = u32::try_from(let_go.len())
        .unwrap_or(u32::MAX)
        .min(current - sleeping);
    let policy = sleep.policy();
    let room = super::sleep_room::facts(
        &ctx.consolidation.sleepers,
        &policy,
        &mut sleep_facts,
        all_pods,
        &docs,
        cold_start,
    );
    Gathered {
        docs,
        sleeping,
        leaving,
        let_go,
        room,
        round: Some((policy, sleep_facts)),
    }
}

/// Applies the round's sleep where Tessera owns `/scale` (KEDA's zero deletes the pod): the pod the count keeps
/// at zero is told to sleep, a model that does not sleep now has every instruction taken off, and the sleepers a
/// new sleeper displaces are let go once it is told to sleep (this model's own on a GPU given back at once).
pub async fn apply(
    ctx: &Context,
    obj: &InferenceAutoscaler,
    pods: &[Pod],
    g: &Gathered,
    r: &Round,
    now_ms: u64,
) {
    let wrote = instruct(ctx, obj, pods, &g.docs, r, &g.let_go, now_ms).await;
    let displaced = wrote.then_some(&g.room);
    super::sleep_room::mark(ctx, obj, displaced, &g.let_go, now_ms).await;
}

/// What the round reads of the model's sleep from every replica's sidecar document (asleep ones included), and
/// how many replicas are asleep.
pub fn facts(docs: &[&SidecarStatus]) -> (SleepFacts, u32) {
    let rests: Vec<_> = docs.iter().filter_map(|d| d.rest.as_ref()).collect();
    let sleeping = rests
        .iter()
        .filter(|r| {
            matches!(
                r.state,
                RestState::FallingAsleep | RestState::Sleeping | RestState::Waking
            )
        })
        .count();
    // The longest wake measured at each level: the round plans for the slow one.
    let mut measured_wake = [None, None];
    for r in &rests {
        if let (Some(level), Some(secs)) = (r.level, r.last_wake_secs)
            && secs.is_finite()
            && secs >= 0.0
        {
            let slot = &mut measured_wake[usize::from(level.as_u8() - 1)];
            let w = Duration::from_secs_f64(secs);
            *slot = Some(slot.map_or(w, |x: Duration| x.max(w)));
        }
    }
    let facts = SleepFacts {
        asleep: sleeping > 0,
        // The server's risky set-ups (the rule sleeps such a model only with `spec.sleep.allowRisky`), or a
        // sidecar that would not carry out an instruction (a server without /sleep, no canary answer): safe,
        // since the model then keeps a warm replica wherever its floor asks for one.
        refused: rests
            .iter()
            .find(|r| !r.risks.is_empty())
            .map(|r| r.risks.join("; "))
            .or_else(|| rests.iter().find_map(|r| r.refused.clone())),
        measured_wake,
        weights_bytes: docs
            .iter()
            .find_map(|d| d.memory.as_ref()?.model.as_ref()?.weights_bytes),
        // Not read today: the level-1 copy counts against the vLLM container's memory limit, which the sidecar
        // cannot see. Unknown chooses level 2 unless the spec pins level 1.
        host_free_bytes: None,
        // The GPU's room for a sleeper: read of the pool by `super::sleep_room::facts`.
        no_room: false,
        alone_on_gpu: false,
    };
    (facts, u32::try_from(sleeping).unwrap_or(u32::MAX))
}

/// The pod's instruction now, if it has a valid one.
fn instruction(pod: &Pod) -> Option<RestCommand> {
    pod.annotations().get(ANNOTATION)?.parse().ok()
}

/// Writes or clears the pods' instruction after the round: where the model sleeps at zero, its running pods get
/// `sleep level=N since=<now>` (a pod that was woken after its instruction gets a fresh one once idle again);
/// otherwise every instruction is taken off, so that a woken pod serving rising traffic does not fall asleep. A
/// sleeper `let_go` (`super::sleep_room`) keeps its instruction while the model is at zero (`/scale` drops it),
/// and wakes as any other when the round wants a running replica. Returns whether a pod was told to sleep.
pub async fn instruct(
    ctx: &Context,
    obj: &InferenceAutoscaler,
    pods: &[Pod],
    docs: &[(String, SidecarStatus)],
    r: &Round,
    let_go: &[super::sleep_room::LetGo],
    now_ms: u64,
) -> bool {
    let Some(rest) = r.rest.as_ref() else {
        return false;
    };
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &obj.namespace().unwrap_or_default());
    let params = PatchParams::default();
    let mut told = false;
    for pod in pods.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
        let name = pod.name_any();
        // When its sidecar last turned awake: a pod woken after its instruction (demand came) gets a fresh one.
        let awake_since_ms = docs
            .iter()
            .filter(|(n, _)| n == &name)
            .filter_map(|(_, d)| d.rest.as_ref())
            .find(|x| x.state == RestState::Awake)
            .and_then(|x| x.since)
            .map(|s| s * 1000.0);
        let sleep = rest.sleep.filter(|_| r.sleeps());
        let own = command::instruct(sleep, instruction(pod), awake_since_ms, now_ms);
        let is_let_go = let_go.iter().any(|l| l.pod == name);
        let value =
            match tessera_core::sleep::evict::instruct(is_let_go, r.decision.desired_replicas == 0, own) {
                Instruct::Keep => continue,
                Instruct::Write(c) => Some(c.to_string()),
                Instruct::Clear => None,
            };
        // A fresh instruction makes an old eviction mark stale (`core::sleep::evict`): it goes with it.
        let mut annotations = serde_json::json!({ ANNOTATION: value });
        if value.is_some() {
            annotations[tessera_core::sleep::evict::ANNOTATION] = serde_json::Value::Null;
        }
        let patch = serde_json::json!({ "metadata": { "annotations": annotations } });
        match api.patch(&name, &params, &Patch::Merge(&patch)).await {
            Ok(_) => {
                if let Some(v) = &value {
                    told = true;
                    let wake = rest
                        .wake
                        .map_or_else(|| "unknown".to_owned(), |w| format!("{:.1}s", w.as_secs_f64()));
                    let note = format!(
                        "{name}: {v}; at zero it sleeps instead of going (wake {wake}): {}",
                        rest.reason.message()
                    );
                    publish(ctx, obj, EventType::Normal, "Sleeping", "Sleep", &note).await;
                }
            }
            Err(e) => {
                warn!(pod = %name, error = %e, "could not write the pod's sleep instruction");
                publish(
                    ctx,
                    obj,
                    EventType::Warning,
                    "FailedSleep",
                    "Sleep",
                    &format!(
                        "could not annotate {name} with {ANNOTATION}: {e} (the controller needs pods patch)"
                    ),
                )
                .await;
            }
        }
    }
    told
}

/// `status.rest` for the round; `None` without `spec.sleep`.
pub fn status(r: &Round, sleeping: u32) -> Option<RestStatus> {
    let rest = r.rest.as_ref()?;
    let reason = serde_json::to_value(rest.reason)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    Some(RestStatus {
        sleeping,
        at_zero: if rest.sleep.is_some() { "sleep" } else { "zero" }.to_owned(),
        level: rest.sleep.map(|l| l.as_u8()),
        wake_seconds: rest.wake.map(|w| (w.as_secs_f64() * 1000.0).round() / 1000.0),
        reason,
        message: rest.reason.message().to_owned(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn doc(rest: serde_json::Value) -> SidecarStatus {
        crate::test_support::sidecar_doc(serde_json::json!({ "rest": rest }))
    }

    #[test]
    fn facts_count_sleepers_and_keep_the_slowest_wake_per_level() {
        let a = doc(serde_json::json!({"state": "sleeping", "level": "one", "last_wake_secs": 0.4}));
        let b = doc(
            serde_json::json!({"state": "awake", "level": "one", "last_wake_secs": 0.9, "refused": "LoRA adapters"}),
        );
        let c = doc(serde_json::json!({"state": "awake", "level": "two", "last_wake_secs": -1.0}));
        let (f, sleeping) = facts(&[&a, &b, &c]);
        assert_eq!(sleeping, 1);
        assert!(f.asleep);
        assert_eq!(f.measured_wake, [Some(Duration::from_millis(900)), None]);
        assert_eq!(f.refused.as_deref(), Some("LoRA adapters"));
        let risky = doc(serde_json::json!({"state": "awake", "risks": ["tensor parallel (2 GPUs)", "LoRA"]}));
        assert_eq!(
            facts(&[&b, &risky]).0.refused.as_deref(),
            Some("tensor parallel (2 GPUs); LoRA")
        );
        let (none, n) = facts(&[]);
        assert_eq!((none.asleep, n), (false, 0));
    }
}
