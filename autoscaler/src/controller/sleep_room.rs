//! The GPU's room for a sleeper, in the cluster: what the round's sleep facts read of the pool
//! (`SleepFacts::{alone_on_gpu, no_room}`, as the simulator reads them of its own pool), which sleepers a
//! model's sleep lets go, and this model's own sleepers let go. The rule is core's
//! (`tessera_core::pack::sleeping::admit`, `tessera_core::sleep::evict`); the pool managers of this process publish
//! each GPU's tenants and budget ([`crate::pool::sleepers::SleepLink`]).
//!
//! 1. Each round publishes what its sleeping pods are worth (the waiting a wake saves × how often it is woken).
//! 2. Where the model's last running replica would fall asleep, the budget of its GPU decides: it fits, it fits
//!    once cheaper sleepers there are let go, or it goes to zero (`no_room`). A GPU with no other running
//!    replica is `alone_on_gpu`: a sleeper would be all that keeps it.
//! 3. When the round writes that replica's sleep instruction, the sleepers it displaces are marked
//!    (`tessera.dev/evicted`); a sleeper whose GPU has held only sleepers for the pool's grace is marked by its
//!    own model. A marked sleeper's own round counts it as neither running nor asleep: at zero `/scale` drops it
//!    (its ReplicaSet deletes it), and under a warm floor its instruction is withdrawn and it wakes.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use tessera_core::pack::sleeping::{self, Room, Sleeper};
use tessera_core::sleep::command::{self, RestCommand};
use tessera_core::sleep::evict::{self, EvictReason, Eviction};
use tessera_core::sleep::rule::{self, SleepFacts, SleepPolicy};
use tessera_core::wire::sidecar::SidecarStatus;
use tracing::{info, warn};

use super::context::{Context, publish};
use crate::crd::InferenceAutoscaler;
use crate::pool::ANNOTATION_CAPACITY_POD;
use crate::pool::sleepers::SleepLink;
use crate::pool::state::pod_key;

/// `namespace/name`, as the pool keys its tenants.
fn key(pod: &Pod) -> String {
    pod_key(pod).unwrap_or_default()
}

fn capacity_pod(pod: &Pod) -> Option<&String> {
    pod.annotations().get(ANNOTATION_CAPACITY_POD)
}

/// One of the model's pods that is let go, and whether its mark must still be written (its GPU is given back).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LetGo {
    /// The pod's name.
    pub pod: String,
    /// `Some` when the mark is still to be written.
    pub mark: Option<EvictReason>,
}

/// The model's pods that are let go: asleep (not Ready, told to sleep) and marked after their instruction, asleep
/// on a GPU the pool gives back, or the cheapest of more sleepers than their GPU's budget holds
/// (`core::pack::sleeping::over_budget`: two fell asleep at once).
pub fn let_go(pods: &[Pod], link: &SleepLink) -> Vec<LetGo> {
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && !crate::pod_ready(p))
        .filter_map(|p| {
            let a = p.annotations();
            let instruction: Option<RestCommand> = a.get(command::ANNOTATION)?.parse().ok();
            let mark: Option<Eviction> = a.get(evict::ANNOTATION).and_then(|v| v.parse().ok());
            if evict::let_go(instruction.as_ref(), mark.as_ref()) {
                return Some(LetGo {
                    pod: p.name_any(),
                    mark: None,
                });
            }
            let gpu = capacity_pod(p).and_then(|c| link.gpu(c))?;
            let me = key(p);
            let reason = evict::let_go_now(gpu.given_back, || {
                let others: Option<Vec<Sleeper>> = gpu.sleepers_but(&me).map(|s| link.published(s)).collect();
                let mut all = others?;
                all.push(link.worth(&me, gpu.default_residue_mib));
                Some(sleeping::over_budget(&all, &me, gpu.budget))
            })?;
            Some(LetGo {
                pod: p.name_any(),
                mark: Some(reason),
            })
        })
        .collect()
}

/// What the model's sleeper is worth: its residue (measured, else `default_residue_mib`), the waiting a wake
/// `saved` (cold start − wake) and how often it was woken (its sidecars' idle gaps).
pub fn worth(id: &str, docs: &[&SidecarStatus], default_residue_mib: u64, saved: Duration) -> Sleeper {
    let rests = docs.iter().filter_map(|d| d.rest.as_ref());
    let residue = rests
        .clone()
        .filter_map(|r| r.residue_bytes)
        .max()
        .map_or(default_residue_mib, |b| b >> 20);
    let mut gaps: Vec<Duration> = rests
        .flat_map(|r| r.idle_gaps_secs.iter())
        .filter(|g| g.is_finite() && **g >= 0.0)
        .map(|g| Duration::from_secs_f64(*g))
        .collect();
    // The most recent of them, as the simulator keeps.
    let keep = gaps.len().saturating_sub(sleeping::GAPS_KEPT);
    gaps.drain(..keep);
    Sleeper::new(id, residue, saved, Duration::ZERO, &gaps)
}

/// The room for `running` (the model's only running pod) to sleep on its GPU, valued as `own`; nothing is known
/// (all false) for a pod the pool did not place or a GPU not published yet.
pub fn room(link: &SleepLink, running: &Pod, own: impl FnOnce(&str, u64) -> Sleeper) -> Room {
    let Some(gpu) = capacity_pod(running).and_then(|c| link.gpu(c)) else {
        return Room::default();
    };
    let me = key(running);
    let present: Vec<Sleeper> = gpu
        .sleepers_but(&me)
        .map(|p| link.worth(p, gpu.default_residue_mib))
        .collect();
    sleeping::room(
        !gpu.alone(&me),
        &present,
        &own(&me, gpu.default_residue_mib),
        gpu.budget,
    )
}

/// The round's facts of the GPU room, for a model with sleep `policy` (its `facts` filled in
/// place), its `pods` (those let go already left out of `docs`, each sidecar's document by pod name) and its
/// measured `cold` start. Publishes what its pods are worth asleep, for the rounds of other models on their
/// GPUs, and returns its last running replica's room: the sleepers its sleep would let go, and why.
pub fn facts(
    link: &SleepLink,
    policy: &SleepPolicy,
    facts: &mut SleepFacts,
    pods: &[Pod],
    docs: &[(String, SidecarStatus)],
    cold: Option<Duration>,
) -> Room {
    let mine: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && docs.iter().any(|(n, _)| *n == p.name_any()))
        .collect();
    let keys: Vec<String> = mine.iter().map(|p| key(p)).collect();
    // The waiting a wake saves: cold start − wake. A sleeping model's pods were all told to sleep, which makes the
    // cold start unmeasurable (`observed_cold_start`): what was published while it was known stands.
    let wake = rule::wake(rule::level(policy, facts), policy, facts);
    let saved = match (cold, wake) {
        (Some(c), Some(w)) => Some(c.saturating_sub(w)),
        _ => keys.iter().find_map(|k| link.published(k)).map(|s| s.saved),
    };
    let all: Vec<&SidecarStatus> = docs.iter().map(|(_, d)| d).collect();
    let own = |id: &str, residue| worth(id, &all, residue, saved.unwrap_or_default());
    if saved.is_some() {
        for k in &keys {
            let residue = mine
                .iter()
                .find(|p| key(p) == *k)
                .and_then(|p| capacity_pod(p))
                .and_then(|c| link.gpu(c))
                .map_or(sleeping::DEFAULT_RESIDUE_MIB, |g| g.default_residue_mib);
            link.set_worth(k, own(k, residue));
        }
    }
    let running: Vec<&&Pod> = mine.iter().filter(|p| crate::pod_ready(p)).collect();
    let [only] = running.as_slice() else {
        return Room::default();
    };
    let r = room(link, only, own);
    facts.alone_on_gpu = r.alone_on_gpu;
    facts.no_room = r.no_room;
    r
}

/// Writes the eviction marks: on the sleepers `displaced` by this model's replica falling asleep (other models'
/// pods, `namespace/name`) and on this model's own pods whose GPU is given back. Each mark is an Event on `obj`.
pub async fn mark(
    ctx: &Context,
    obj: &InferenceAutoscaler,
    displaced: Option<&Room>,
    own: &[LetGo],
    now_ms: u64,
) {
    let ns = obj.namespace().unwrap_or_default();
    // Each with what to add to its Event: for a displaced sleeper, what both sides are worth.
    let mut marks: Vec<(String, EvictReason, String)> = Vec::new();
    if let Some(r) = displaced {
        marks.extend(
            r.displaces
                .iter()
                .map(|k| (k.clone(), EvictReason::Budget, r.why.clone())),
        );
    }
    marks.extend(
        own.iter()
            .filter_map(|l| Some((format!("{ns}/{}", l.pod), l.mark?, String::new()))),
    );
    for (pod_key, reason, why) in marks {
        let Some((pod_ns, name)) = pod_key.split_once('/') else {
            continue;
        };
        let value = Eviction {
            at_unix_ms: now_ms,
            reason,
        }
        .to_string();
        let patch = serde_json::json!({ "metadata": { "annotations": { evict::ANNOTATION: value } } });
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), pod_ns);
        let result = api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
        match result {
            Ok(_) => let_go_event(ctx, obj, &pod_key, reason, &value, &why, "").await,
            // A pod already gone was let go all the same: the round that found it let go (its GPU given back)
            // counted it as leaving and scaled the model down, and the Deployment removed it before this mark was
            // written. Its Event is still the only record of why.
            Err(kube::Error::Api(ae)) if ae.code == 404 => {
                let_go_event(
                    ctx,
                    obj,
                    &pod_key,
                    reason,
                    &value,
                    &why,
                    " (the pod had already left with the scale-down)",
                )
                .await;
            }
            Err(e) => {
                warn!(pod = %pod_key, error = %e, "could not mark a sleeping pod let go; the next round tries again")
            }
        }
    }
}

/// The metric, the log line and the Event of one sleeping pod let go.
async fn let_go_event(
    ctx: &Context,
    obj: &InferenceAutoscaler,
    pod_key: &str,
    reason: EvictReason,
    value: &str,
    why: &str,
    gone: &str,
) {
    ctx.metrics.sleeper_let_go(reason);
    info!(pod = %pod_key, reason = reason.message(), "sleeping pod let go");
    let mut note = format!("{pod_key}: let go ({value}): {}{gone}", reason.message());
    if !why.is_empty() {
        note.push_str(&format!(" ({why})"));
    }
    publish(ctx, obj, EventType::Normal, "SleeperLetGo", "Sleep", &note).await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::collections::HashMap;

    use tessera_core::pack::sleeping::SleeperBudget;

    use super::*;
    use crate::pool::sleepers::{GpuSleepers, GpuTenant};

    fn pod(name: &str, ready: bool, annotations: &[(&str, &str)]) -> Pod {
        let mut a: serde_json::Map<String, serde_json::Value> = annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
            .collect();
        a.insert(ANNOTATION_CAPACITY_POD.to_owned(), "cap-0".into());
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "team", "annotations": a},
            "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
        }))
        .unwrap()
    }

    fn link(tenants: &[(&str, bool)], max_sleepers: u32, given_back: bool) -> SleepLink {
        let link = SleepLink::default();
        let gpu = GpuSleepers {
            budget: SleeperBudget::of_gpu(81_920, max_sleepers),
            default_residue_mib: 1_434,
            tenants: tenants
                .iter()
                .map(|(p, asleep)| GpuTenant {
                    pod: Some((*p).to_owned()),
                    asleep: *asleep,
                    evicted: false,
                })
                .collect(),
            given_back,
        };
        link.set_pool("a100", HashMap::from([("cap-0".to_owned(), gpu)]));
        link
    }

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    #[test]
    fn a_full_budget_lets_the_cheapest_sleeper_go_or_sends_the_newcomer_to_zero() {
        let l = link(
            &[("team/new", false), ("a/often", true), ("b/daily", true)],
            2,
            false,
        );
        // Woken every 5 min, 90 s saved; woken once a day, 27 s saved.
        l.set_worth("a/often", Sleeper::new("a/often", 1_434, s(91), s(1), &[s(300)]));
        l.set_worth(
            "b/daily",
            Sleeper::new("b/daily", 1_434, s(28), s(1), &[s(86_400)]),
        );
        let running = pod("new", true, &[]);
        let r = room(&l, &running, |id, res| {
            Sleeper::new(id, res, s(28), s(1), &[s(600)])
        });
        assert_eq!(r.displaces, ["b/daily"]);
        assert!(!r.no_room && r.alone_on_gpu, "every other tenant is asleep");
        let r = room(&l, &running, |id, res| {
            Sleeper::new(id, res, s(11), s(1), &[s(172_800)])
        });
        assert!(r.no_room && r.displaces.is_empty());
        // A sleeper whose worth nobody published is never let go.
        let l = link(
            &[("team/new", false), ("a/x", true), ("b/y", true), ("c/z", false)],
            2,
            false,
        );
        let r = room(&l, &running, |id, res| {
            Sleeper::new(id, res, s(90), s(1), &[s(60)])
        });
        assert!(r.no_room && !r.alone_on_gpu);
        // Off the pool (no GPU published): nothing known.
        assert_eq!(
            room(&SleepLink::default(), &running, |_, _| unreachable!()),
            Room::default()
        );
    }

    #[test]
    fn a_sleeper_is_let_go_by_a_later_mark_or_a_gpu_given_back() {
        let rest = ("tessera.dev/rest", "sleep level=1 since=1000");
        let asleep = pod("p", false, &[rest]);
        let marked = pod(
            "q",
            false,
            &[rest, ("tessera.dev/evicted", "at=2000 reason=budget")],
        );
        let stale = pod(
            "r",
            false,
            &[
                ("tessera.dev/rest", "sleep level=1 since=3000"),
                ("tessera.dev/evicted", "at=2000 reason=budget"),
            ],
        );
        let awake = pod(
            "s",
            true,
            &[rest, ("tessera.dev/evicted", "at=2000 reason=budget")],
        );
        let l = link(&[], 4, false);
        let pods = [asleep.clone(), marked, stale, awake];
        assert_eq!(
            let_go(&pods, &l),
            [LetGo {
                pod: "q".into(),
                mark: None
            }]
        );
        let given_back = link(&[("team/p", true)], 4, true);
        assert_eq!(
            let_go(std::slice::from_ref(&asleep), &given_back),
            [LetGo {
                pod: "p".into(),
                mark: Some(EvictReason::GpuGivenBack)
            }]
        );
        // Two asleep under a budget of one (they fell asleep at once): the cheaper lets itself go, once both are
        // known.
        let two = link(&[("team/p", true), ("b/other", true)], 1, false);
        two.set_worth("team/p", Sleeper::new("team/p", 1_434, s(28), s(1), &[]));
        assert!(
            let_go(std::slice::from_ref(&asleep), &two).is_empty(),
            "the other's worth is unknown"
        );
        two.set_worth("b/other", Sleeper::new("b/other", 1_434, s(90), s(1), &[]));
        assert_eq!(
            let_go(std::slice::from_ref(&asleep), &two),
            [LetGo {
                pod: "p".into(),
                mark: Some(EvictReason::Budget)
            }]
        );
    }

    #[test]
    fn worth_reads_the_measured_residue_and_the_latest_gaps() {
        let doc = crate::test_support::sidecar_doc(serde_json::json!({
            "rest": {"state": "sleeping", "residue_bytes": 1_073_741_824u64,
                     "idle_gaps_secs": [1.0, 1.0, 600.0, 600.0, 600.0, 600.0, 600.0, 600.0, 600.0, 600.0]}
        }));
        let w = worth("team/p", &[&doc], 1_434, s(28));
        assert_eq!(w.residue_mib, 1_024);
        assert_eq!(w.saved, s(28));
        assert_eq!(w.typical_gap, Some(s(600)));
        let none = worth("team/p", &[], 1_434, s(28));
        assert_eq!((none.residue_mib, none.typical_gap), (1_434, None));
    }
}
