//! The activator's Prometheus metrics (one registry, served on `/metrics`).
//!
//! Counters and the hold histogram are updated on the request path; the per-model gauges (in flight, queued,
//! ready backends) are read from the router's atomics when `/metrics` is scraped, so the hot path pays nothing
//! for them.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tessera_runtime::metrics::{register, register_value};

use tessera_core::class::Lane;

use super::discovery::Collision;
use super::router::Router;

/// `{namespace, model, code}`: `code` is the HTTP status returned to the client.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabels {
    /// The model's namespace, or `unknown` (as `model`).
    pub namespace: String,
    /// The model name, or `unknown` for names the activator does not route (to bound cardinality).
    pub model: String,
    /// HTTP status code.
    pub code: u16,
}

/// `{namespace, model}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabels {
    /// The model's namespace.
    pub namespace: String,
    /// The model name.
    pub model: String,
}

/// `{namespace, model, reason}` for requests the activator answered itself.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectLabels {
    /// The model's namespace, or `unknown`.
    pub namespace: String,
    /// The model name, or `unknown`.
    pub model: String,
    /// The error's fixed label (see `RequestError::label`).
    pub reason: &'static str,
}

/// `{namespace, model, lane}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LaneLabels {
    /// The model's namespace.
    pub namespace: String,
    /// The model name.
    pub model: String,
    /// `priority`, `default` or `flex`.
    pub lane: &'static str,
}

/// `{namespace, model, reason}` for a flex request that found no room on a look.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NoRoomLabels {
    /// The model's namespace.
    pub namespace: String,
    /// The model name.
    pub model: String,
    /// `kv_full`, `queue` or `throttled` (`tessera_core::lanes::NoRoom::label`).
    pub reason: &'static str,
}

/// `{namespace, outcome}` for a batch line's answer.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BatchLineLabels {
    /// The batch's namespace.
    pub namespace: String,
    /// `completed` (2xx from the model), `failed` (another answer), `cancelled`, `expired`.
    pub outcome: &'static str,
}

/// `{namespace, batch}` for a running batch.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BatchLabels {
    /// The batch's namespace.
    pub namespace: String,
    /// The batch id (only running batches have series; a batch's series go when it ends).
    pub batch: String,
}

/// The activator's metric families.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// `tessera_activator_requests_total{model,code}`.
    pub requests: Family<CodeLabels, Counter>,
    /// `tessera_activator_rejected_total{model,reason}`.
    pub rejected: Family<RejectLabels, Counter>,
    /// `tessera_activator_hold_seconds{model}`: how long held requests waited for a ready backend.
    pub hold_seconds: Family<ModelLabels, Histogram>,
    in_flight: Family<ModelLabels, Gauge>,
    queued: Family<ModelLabels, Gauge>,
    ready_backends: Family<ModelLabels, Gauge>,
    collisions: Family<ModelLabels, Gauge>,
    admitted: Gauge,
    held: Gauge,
    lane_held: Gauge,
    lane_admitted: Family<LaneLabels, Counter>,
    lane_rejected: Family<LaneLabels, Counter>,
    lane_no_room: Family<NoRoomLabels, Counter>,
    lane_queued: Family<LaneLabels, Gauge>,
    /// `tessera_activator_batch_lines_total{namespace,outcome}`: batch lines answered, by outcome.
    pub batch_lines: Family<BatchLineLabels, Counter>,
    /// `tessera_activator_batch_deadline_slack_seconds{namespace,batch}`: time to the deadline less the time the
    /// lines left take at the rate measured since the runner took the batch (below 0: behind pace).
    pub batch_slack: Family<BatchLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// `tessera_activator_batch_lines_remaining{namespace,batch}`.
    pub batch_remaining: Family<BatchLabels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every family under the `tessera_activator` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("tessera_activator");
        let requests = register(
            &mut registry,
            "requests",
            "Requests answered, by model and HTTP status",
        );
        let rejected = register(
            &mut registry,
            "rejected",
            "Requests the activator answered itself with an error, by reason",
        );
        // 1 ms .. ~9 min: from a backend that was just starting to a cold start of a large model.
        let hold_seconds = register_value(
            &mut registry,
            "hold_seconds",
            "Time a request was held waiting for a ready backend (only requests that had to wait)",
            Family::<ModelLabels, Histogram>::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 20))
            }),
        );
        let in_flight = register(
            &mut registry,
            "in_flight_requests",
            "Requests forwarded and not finished",
        );
        let queued = register(
            &mut registry,
            "queued_requests",
            "Requests held waiting for a ready backend",
        );
        let ready_backends = register(&mut registry, "ready_backends", "Ready backends per model");
        let collisions = register(
            &mut registry,
            "model_name_collisions",
            "InferenceAutoscalers refused for a model name another one in the namespace already claims",
        );
        let admitted = register(
            &mut registry,
            "admitted_requests",
            "Requests admitted and not finished, all models (bounded by --max-in-flight; flex-lane requests count only while their body is read)",
        );
        let held = register(
            &mut registry,
            "held_requests",
            "Requests held for a model with no ready backend, all models (bounded by --max-held)",
        );
        let lane_held = register(
            &mut registry,
            "lane_held_requests",
            "Flex-lane and batch requests waiting for room or for a replica, all models (bounded by --lane-max-held)",
        );
        let lane_admitted = register(
            &mut registry,
            "lane_admitted",
            "Requests sent to a backend, by lane (priority, default, flex)",
        );
        let lane_rejected = register(
            &mut registry,
            "lane_rejected",
            "Requests answered 429 + Retry-After because their lane had no room within --lane-hold-timeout",
        );
        let lane_no_room = register(
            &mut registry,
            "lane_no_room",
            "Looks of a waiting flex request that found no backend with room, by what stopped it",
        );
        let lane_queued = register(
            &mut registry,
            "lane_queued_requests",
            "Requests waiting for room in their lane (only the flex lane ever waits for room)",
        );
        let batch_lines = register(
            &mut registry,
            "batch_lines",
            "Batch lines answered (in the output or the error file), by outcome",
        );
        let batch_slack = register(
            &mut registry,
            "batch_deadline_slack_seconds",
            "Seconds to a running batch's deadline less the time its lines left take at the measured rate (below 0: behind)",
        );
        let batch_remaining = register(
            &mut registry,
            "batch_lines_remaining",
            "Lines of a running batch not answered yet",
        );
        Self {
            registry,
            batch_lines,
            batch_slack,
            batch_remaining,
            lane_admitted,
            lane_rejected,
            lane_no_room,
            lane_queued,
            requests,
            rejected,
            hold_seconds,
            in_flight,
            queued,
            ready_backends,
            collisions,
            admitted,
            held,
            lane_held,
        }
    }

    /// Counts a request of `lane` sent to a backend.
    pub fn lane_admitted(&self, model: &ModelLabels, lane: Lane) {
        self.lane_admitted.get_or_create(&lane_labels(model, lane)).inc();
    }

    /// Counts a request of `lane` answered 429 for want of room.
    pub fn lane_rejected(&self, model: &ModelLabels, lane: Lane) {
        self.lane_rejected.get_or_create(&lane_labels(model, lane)).inc();
    }

    /// Counts a look that found no room, by what stopped it.
    pub fn lane_no_room(&self, model: &ModelLabels, reason: &'static str) {
        self.lane_no_room
            .get_or_create(&NoRoomLabels {
                namespace: model.namespace.clone(),
                model: model.model.clone(),
                reason,
            })
            .inc();
    }

    /// The text exposition, with the gauges refreshed from `router` and discovery's current `collisions`.
    pub fn encode(&self, router: &Router, collisions: &[Collision]) -> Result<String, std::fmt::Error> {
        for e in router.entries() {
            let l = ModelLabels {
                namespace: e.namespace().to_string(),
                model: e.name().to_string(),
            };
            self.in_flight
                .get_or_create(&l)
                .set(i64::try_from(e.in_flight()).unwrap_or(i64::MAX));
            self.queued
                .get_or_create(&l)
                .set(i64::try_from(e.queued()).unwrap_or(i64::MAX));
            self.ready_backends
                .get_or_create(&l)
                .set(i64::try_from(e.ready_count()).unwrap_or(i64::MAX));
            self.lane_queued
                .get_or_create(&LaneLabels {
                    namespace: l.namespace.clone(),
                    model: l.model.clone(),
                    lane: Lane::Flex.label(),
                })
                .set(i64::try_from(e.flex_waiting()).unwrap_or(i64::MAX));
        }
        // Cleared first, so that a collision that was resolved drops out instead of keeping its last value.
        self.collisions.clear();
        for c in collisions {
            let l = ModelLabels {
                namespace: c.namespace.clone(),
                model: c.model.clone(),
            };
            self.collisions
                .get_or_create(&l)
                .set(i64::try_from(c.refused.len()).unwrap_or(i64::MAX));
        }
        let admission = router.admission();
        self.admitted
            .set(i64::try_from(admission.in_flight()).unwrap_or(i64::MAX));
        self.held.set(i64::try_from(admission.held()).unwrap_or(i64::MAX));
        self.lane_held
            .set(i64::try_from(admission.lane_held()).unwrap_or(i64::MAX));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

fn lane_labels(model: &ModelLabels, lane: Lane) -> LaneLabels {
    LaneLabels {
        namespace: model.namespace.clone(),
        model: model.model.clone(),
        lane: lane.label(),
    }
}
