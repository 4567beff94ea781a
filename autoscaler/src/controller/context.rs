//! What every reconcile shares: the settings, the clock, the per-object history and the links to the other parts
//! of the process ([`Context`]), and how a reconcile publishes an Event. Its own module so that the reconcile and
//! the steps it calls (`super::allocation`, `super::rollout`) all read it without importing each other.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder};
use tessera_core::scale::ScaleState;
use tracing::warn;

use super::metrics::Metrics;
use super::signals::{ActivatorPoller, SignalSource};
use crate::crd::InferenceAutoscaler;

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
    /// Per-object time and `reconcile::trigger_hash` of the last full reconcile, to skip the echo of our own status writes.
    pub last_runs: Mutex<HashMap<String, (SystemTime, u64)>>,
    /// When `last_runs` was last swept of deleted objects (`reconcile::forget_deleted`): once per sync period, not in
    /// every object's round, whose cost would then grow with the fleet.
    pub runs_swept_at: Mutex<Option<SystemTime>>,
    /// Objects (`namespace/name`) woken by a request held at an activator: their next reconcile runs in full
    /// even when it looks like the echo of a status write.
    pub woken: Mutex<HashSet<String>>,
    /// Pods whose start-up gate opened by its bounded wait and already have their Warning Event.
    pub gate_timeouts: Mutex<HashSet<String>>,
    /// Models being rolled onto a new allocation, one per pool.
    pub rolling: super::rollout::Rolling,
    /// Consolidation: the capacity pods the pool managers drain (this controller moves pods off them), and the pods
    /// this controller moves (the pool managers drain only GPUs whose pods someone moves).
    pub consolidation: crate::pool::ConsolidationLink,
    /// Where each reconcile publishes what it saw and decided for the `/ui` page (read-only for the page).
    pub ui: Arc<crate::ui::Store>,
    /// The InferenceAutoscalers this term's controller watches (its reflector's cache, set when it starts): a
    /// budget group's members this process has not decided for yet are read from their status through it
    /// (`coldstart::namespace_claims`). `None` before the first term starts.
    pub objects: std::sync::RwLock<Option<kube::runtime::reflector::Store<InferenceAutoscaler>>>,
    /// The HorizontalPodAutoscalers (KEDA's among them), for the one-owner-per-`/scale` check.
    pub scalers: super::owners::HpaCache,
    /// Every model's pods, their GPUs and TTFT pressure, for the flex lane's neighbour figures.
    pub neighbours: super::neighbours::Book,
    /// Every pod in the watched scope, from one watch: what each round reads instead of listing its model's pods.
    pub pods: super::pods::PodCache,
    /// Every Deployment in the watched scope: what `/scale` would answer for a Deployment target, without a read.
    pub deployments: super::scales::DeploymentCache,
    /// DRA mode: the claim templates (`namespace/name`) this process wrote, so each is written once.
    pub dra_templates: Mutex<HashSet<String>>,
}

impl Context {
    /// Marks `key` (`namespace/name`) as woken by a held request.
    pub fn mark_woken(&self, key: &str) {
        if let Ok(mut w) = self.woken.lock() {
            w.insert(key.to_owned());
        }
    }

    pub(super) fn take_woken(&self, key: &str) -> bool {
        self.woken.lock().is_ok_and(|mut w| w.remove(key))
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
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
