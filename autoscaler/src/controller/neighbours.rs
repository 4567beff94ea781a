//! The flex lane's view of each pod's GPU neighbours: every round records its model's pods (their GPU, their TTFT
//! pressure from the sidecar it just read) in a book shared by all models' rounds, and publishes for its own pods
//! on a shared GPU the worst pressure among the other models there (`status.flexNeighbours`). The activator reads
//! that status and sends no batch request to a pod whose neighbour is near its objective.
//!
//! The rule is `tessera_core::lanes::neighbour_pressures`; this only gathers. Why the controller and not the
//! activator: the controller already reads every pod's sidecar and knows which capacity pod (GPU) each pod is on;
//! the activator knows neither. A model's entry older than [`FORGET_AFTER`] is not read (its controller round
//! stopped: the model was deleted, or this process lost leadership and another writes).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use tessera_core::lanes::{Tenant, neighbour_pressures, ttft_pressure};
use tessera_core::wire::sidecar::SidecarStatus;

use crate::crd::{FlexNeighbour, FlexNeighboursStatus};
use crate::pool::ANNOTATION_CAPACITY_POD;

/// A model's entry older than this is left out of the others' figures (the bound the gate reads a figure within).
pub const FORGET_AFTER: Duration = tessera_core::lanes::NEIGHBOURS_MAX_AGE;

/// An unchanged figure is written again (a new `observedAt`) at most this often: often enough that the activator,
/// which ignores figures older than two minutes, always has a fresh one, and seldom enough that a steady model's
/// status is not rewritten every sync.
pub const REFRESH_EVERY: Duration = Duration::from_secs(60);

/// Pressures are published in steps of 1/20 (0.05), so noise in a window's p95 does not rewrite the status.
/// (Dividing by 20 rather than multiplying by 0.05 gives 0.9, not 0.9000000000000001.)
const STEPS_PER_UNIT: f64 = 20.0;

/// Most pods listed in `status.flexNeighbours` (the CRD's bound); a pod beyond it reads no figure, and the gate
/// falls back to its own room.
pub const MAX_PODS: usize = 1024;

/// One pod as its model's last round saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct PodSeen {
    /// Pod name.
    pub name: String,
    /// Pod IP.
    pub ip: Option<String>,
    /// Its capacity pod (the GPU it shares), `None` on a GPU of its own.
    pub gpu: Option<String>,
    /// Its TTFT p95 over the model's objective.
    pub pressure: Option<f64>,
}

/// Every model's pods as its last round saw them, by `namespace/name` of the InferenceAutoscaler, with an index of
/// the models on each GPU.
#[derive(Debug, Default)]
pub struct Book(Mutex<Entries>);

#[derive(Debug, Default)]
struct Entries {
    /// By model: when its round last recorded, and its pods.
    models: HashMap<String, (SystemTime, Vec<PodSeen>)>,
    /// By GPU (capacity pod): the models with a pod on it. A round reads its own GPUs' tenants through it, so its
    /// cost is what its GPUs hold: walking every model's pods in each of N models' rounds made the controller's CPU
    /// per model grow with the fleet (docs/performance.md, "Fleet scale").
    on_gpu: HashMap<String, BTreeSet<String>>,
    /// When entries older than [`FORGET_AFTER`] were last removed: once per [`FORGET_AFTER`], not every round (an
    /// old entry is skipped when read in between).
    swept_at: Option<SystemTime>,
}

impl Entries {
    fn insert(&mut self, key: &str, at: SystemTime, pods: Vec<PodSeen>) {
        self.remove(key);
        for g in pods.iter().filter_map(|p| p.gpu.as_ref()) {
            self.on_gpu.entry(g.clone()).or_default().insert(key.to_owned());
        }
        self.models.insert(key.to_owned(), (at, pods));
    }

    fn remove(&mut self, key: &str) {
        let Some((_, pods)) = self.models.remove(key) else {
            return;
        };
        for g in pods.iter().filter_map(|p| p.gpu.as_ref()) {
            if let Some(models) = self.on_gpu.get_mut(g) {
                models.remove(key);
                if models.is_empty() {
                    self.on_gpu.remove(g);
                }
            }
        }
    }

    fn sweep(&mut self, now: SystemTime) {
        if self
            .swept_at
            .is_some_and(|at| now.duration_since(at).unwrap_or_default() < FORGET_AFTER)
        {
            return;
        }
        self.swept_at = Some(now);
        let stale: Vec<String> = self
            .models
            .iter()
            .filter(|(_, (at, _))| !fresh(*at, now))
            .map(|(k, _)| k.clone())
            .collect();
        for k in stale {
            self.remove(&k);
        }
    }
}

/// Pod `p` of `model` as the rule reads it.
fn tenant<'a>(model: &'a str, p: &'a PodSeen) -> Tenant<(&'a str, &'a str), &'a str, &'a str> {
    Tenant {
        pod: (model, p.name.as_str()),
        model,
        gpu: p.gpu.as_deref(),
        pressure: p.pressure,
    }
}

/// Whether an entry recorded `at` is still read at `now`.
fn fresh(at: SystemTime, now: SystemTime) -> bool {
    now.duration_since(at).unwrap_or_default() <= FORGET_AFTER
}

impl Book {
    /// Records `key`'s pods seen at `now` and returns the figures for its pods on a shared GPU (`None`: no pod
    /// of this model has a neighbour whose pressure is known).
    pub fn record(&self, key: &str, pods: Vec<PodSeen>, now: SystemTime) -> Option<FlexNeighboursStatus> {
        let mut book = self.0.lock().unwrap_or_else(|e| e.into_inner());
        book.sweep(now);
        book.insert(key, now, pods);
        let book = &*book;
        let own = &book.models.get(key)?.1;
        // Only the GPUs this model's pods share matter to its figures: the other models' pods elsewhere are left
        // out, and so are models whose round went silent (older than FORGET_AFTER).
        let own_gpus: HashSet<&str> = own.iter().filter_map(|p| p.gpu.as_deref()).collect();
        let neighbours: BTreeSet<&str> = own_gpus
            .iter()
            .filter_map(|g| book.on_gpu.get(*g))
            .flatten()
            .map(String::as_str)
            .filter(|m| *m != key)
            .collect();
        let mut tenants: Vec<Tenant<(&str, &str), &str, &str>> = own.iter().map(|p| tenant(key, p)).collect();
        for model in neighbours {
            let Some((at, pods)) = book.models.get(model) else {
                continue;
            };
            if !fresh(*at, now) {
                continue;
            }
            tenants.extend(
                pods.iter()
                    .filter(|p| p.gpu.as_deref().is_some_and(|g| own_gpus.contains(g)))
                    .map(|p| tenant(model, p)),
            );
        }
        let pods: Vec<FlexNeighbour> = neighbour_pressures(&tenants)
            .into_iter()
            .filter(|((model, _), _)| *model == key)
            .filter_map(|((_, name), pressure)| {
                let seen = own.iter().find(|p| p.name == name)?;
                Some(FlexNeighbour {
                    pod: name.to_owned(),
                    pod_ip: seen.ip.clone(),
                    pressure: (pressure * STEPS_PER_UNIT).round() / STEPS_PER_UNIT,
                })
            })
            // The CRD bounds the list (a status over the bound would be refused, and the round with it).
            .take(MAX_PODS)
            .collect();
        (!pods.is_empty()).then(|| FlexNeighboursStatus {
            observed_at: super::status::k8s_time(now),
            pods,
        })
    }
}

/// The status to write: `next`, unless it says what `prev` says and `prev` is younger than [`REFRESH_EVERY`]
/// (then `prev`, unchanged, and the round writes no status for it).
pub fn carry(
    prev: Option<FlexNeighboursStatus>,
    next: Option<FlexNeighboursStatus>,
    now: SystemTime,
) -> Option<FlexNeighboursStatus> {
    match (prev, next) {
        (Some(p), Some(n)) if p.pods == n.pods => {
            let at = SystemTime::from(p.observed_at.0);
            let young = now.duration_since(at).is_ok_and(|age| age < REFRESH_EVERY);
            Some(if young { p } else { n })
        }
        (_, next) => next,
    }
}

/// What a round saw of its pods: each ready pod (`ready`: name and sidecar URL, in the order of `sidecars`) with its GPU from its
/// annotations and its pressure from its sidecar's last window against `ttft_slo_secs` (the round's objective).
pub fn pods_seen(
    all_pods: &[Pod],
    ready: &[(String, String)],
    sidecars: &[Option<SidecarStatus>],
    ttft_slo_secs: Option<f64>,
) -> Vec<PodSeen> {
    ready
        .iter()
        .zip(sidecars)
        .filter_map(|((name, _), doc)| {
            let pod = all_pods
                .iter()
                .find(|p| p.metadata.name.as_deref() == Some(name.as_str()))?;
            let p95 = doc
                .as_ref()
                .and_then(|d| d.recent.as_ref())
                .and_then(|r| r.ttft_seconds.p95);
            Some(PodSeen {
                name: name.clone(),
                ip: pod.status.as_ref().and_then(|s| s.pod_ip.clone()),
                gpu: pod
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(ANNOTATION_CAPACITY_POD))
                    .cloned(),
                pressure: ttft_pressure(p95, ttft_slo_secs),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn seen(name: &str, gpu: Option<&str>, pressure: Option<f64>) -> PodSeen {
        PodSeen {
            name: name.into(),
            ip: Some(format!("10.0.0.{}", name.len())),
            gpu: gpu.map(str::to_owned),
            pressure,
        }
    }

    #[test]
    fn each_model_reads_the_others_on_its_gpus_and_forgets_the_silent() {
        let book = Book::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        // chat's round first: nobody else known yet.
        assert_eq!(
            book.record("team/chat", vec![seen("chat-0", Some("cap-a"), Some(0.9))], t0),
            None
        );
        // eval shares cap-a with chat (0.9); its pod on cap-b is alone.
        let st = book
            .record(
                "team/eval",
                vec![
                    seen("eval-0", Some("cap-a"), Some(0.1)),
                    seen("eval-1", Some("cap-b"), None),
                ],
                t0 + Duration::from_secs(15),
            )
            .unwrap();
        assert_eq!(st.pods.len(), 1);
        assert_eq!(st.pods[0].pod, "eval-0");
        assert!((st.pods[0].pressure - 0.9).abs() < 1e-9);
        assert_eq!(st.pods[0].pod_ip.as_deref(), Some("10.0.0.6"));
        // chat's next round reads eval's 0.1.
        let st = book
            .record(
                "team/chat",
                vec![seen("chat-0", Some("cap-a"), Some(0.95))],
                t0 + Duration::from_secs(30),
            )
            .unwrap();
        assert!((st.pods[0].pressure - 0.1).abs() < 1e-9);
        // The same figure 20 s later keeps the old status (no write); a minute on it is written afresh.
        let again = book.record(
            "team/chat",
            vec![seen("chat-0", Some("cap-a"), Some(0.9))],
            t0 + Duration::from_secs(50),
        );
        let kept = carry(Some(st.clone()), again.clone(), t0 + Duration::from_secs(50));
        assert_eq!(kept, Some(st.clone()));
        let later = t0 + Duration::from_secs(30) + REFRESH_EVERY;
        assert_eq!(carry(Some(st.clone()), again.clone(), later), again);
        // eval's pressure rises to 0.7: chat's figure changes and is written at once; no figure clears it.
        book.record(
            "team/eval",
            vec![seen("eval-0", Some("cap-a"), Some(0.7))],
            t0 + Duration::from_secs(55),
        );
        let changed = book.record(
            "team/chat",
            vec![seen("chat-0", Some("cap-a"), Some(0.9))],
            t0 + Duration::from_secs(56),
        );
        assert_ne!(
            carry(Some(st.clone()), changed.clone(), t0 + Duration::from_secs(56)),
            Some(st.clone())
        );
        assert_eq!(carry(Some(st), None, t0 + Duration::from_secs(57)), None);
        // chat's rounds stop: after FORGET_AFTER eval reads nothing of it.
        let later = t0 + Duration::from_secs(56) + FORGET_AFTER + Duration::from_secs(1);
        assert_eq!(
            book.record("team/eval", vec![seen("eval-0", Some("cap-a"), Some(0.1))], later),
            None
        );
    }

    /// The index by GPU follows a model's pods: a pod that moved to another GPU is read there and no longer on the
    /// one it left, and a forgotten model leaves the index (it stays bounded by the models that still run).
    #[test]
    fn a_moved_pod_is_read_on_its_new_gpu_only_and_the_silent_leave_the_index() {
        let book = Book::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        book.record("team/chat", vec![seen("chat-0", Some("cap-a"), Some(0.9))], t0);
        let on_a = |at| book.record("team/eval", vec![seen("eval-0", Some("cap-a"), Some(0.1))], at);
        assert!(on_a(t0).is_some());
        // chat moves to cap-b: eval on cap-a reads nothing of it; a pod of eval on cap-b does.
        book.record(
            "team/chat",
            vec![seen("chat-1", Some("cap-b"), Some(0.8))],
            t0 + Duration::from_secs(1),
        );
        assert_eq!(on_a(t0 + Duration::from_secs(2)), None);
        let on_b = book
            .record(
                "team/eval",
                vec![seen("eval-1", Some("cap-b"), None)],
                t0 + Duration::from_secs(3),
            )
            .unwrap();
        assert!((on_b.pods[0].pressure - 0.8).abs() < 1e-9);
        // chat goes silent: once swept, neither its entry nor its GPU stays in the index.
        let later = t0 + Duration::from_secs(4) + 2 * FORGET_AFTER;
        book.record("team/eval", vec![seen("eval-1", Some("cap-b"), None)], later);
        let entries = book.0.lock().unwrap();
        assert!(!entries.models.contains_key("team/chat"));
        assert_eq!(entries.on_gpu.keys().collect::<Vec<_>>(), vec!["cap-b"]);
        assert_eq!(
            entries.on_gpu["cap-b"].iter().collect::<Vec<_>>(),
            vec!["team/eval"]
        );
    }
}
