//! The controller's own Prometheus metrics, served on `--metrics-listen` `/metrics`.
//!
//! - `tessera_autoscaler_decisions_total{reason}`: every decision, by [`ScaleReason::label`].
//! - `tessera_autoscaler_scales_total{direction}`: replica changes actually applied (`up`, `down`).
//! - `tessera_autoscaler_reconcile_duration_seconds`: reconcile latency histogram.
//! - `tessera_autoscaler_reconcile_errors_total{reason}`: failed reconciles, by error label.
//! - `tessera_autoscaler_scrape_failures_total{source,reason}`: sidecar or activator documents that could not be read.
//! - `tessera_autoscaler_leader`: 1 while this replica holds the lease.

use std::sync::atomic::AtomicI64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tessera_core::scale::ScaleReason;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabels {
    direction: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ScrapeLabels {
    source: String,
    reason: String,
}

/// The registry and handles.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    decisions: Family<ReasonLabels, Counter>,
    scales: Family<DirectionLabels, Counter>,
    reconcile_duration: Histogram,
    reconcile_errors: Family<ReasonLabels, Counter>,
    scrape_failures: Family<ScrapeLabels, Counter>,
    leader: Gauge<i64, AtomicI64>,
    /// The pool manager's `tessera_pool_*` metrics, served on the same page.
    pub pool: crate::pool::PoolMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric registered.
    pub fn new() -> Self {
        let mut root = Registry::default();
        let pool = crate::pool::PoolMetrics::register(&mut root);
        let registry = root.sub_registry_with_prefix("tessera_autoscaler");
        let decisions = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "decisions",
            "Replica decisions, by the rule that settled them",
            decisions.clone(),
        );
        let scales = Family::<DirectionLabels, Counter>::default();
        registry.register("scales", "Replica changes applied through /scale", scales.clone());
        // Reconciles are dominated by sidecar fetches (timeouts of seconds): buckets from 1 ms to ~16 s.
        let reconcile_duration = Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
            0.001, 2.0, 15,
        ));
        registry.register_with_unit(
            "reconcile_duration",
            "Time to reconcile one InferenceAutoscaler",
            prometheus_client::registry::Unit::Seconds,
            reconcile_duration.clone(),
        );
        let reconcile_errors = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "reconcile_errors",
            "Reconciles that failed, by error",
            reconcile_errors.clone(),
        );
        let scrape_failures = Family::<ScrapeLabels, Counter>::default();
        registry.register(
            "scrape_failures",
            "Sidecar /v1/status or activator stats documents that could not be read",
            scrape_failures.clone(),
        );
        let leader = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader lease",
            leader.clone(),
        );
        Self {
            registry: root,
            decisions,
            scales,
            reconcile_duration,
            reconcile_errors,
            scrape_failures,
            leader,
            pool,
        }
    }

    /// Counts a decision.
    pub fn decision(&self, reason: ScaleReason) {
        self.decisions
            .get_or_create(&ReasonLabels {
                reason: reason.label().to_owned(),
            })
            .inc();
    }

    /// Counts an applied scale.
    pub fn scaled(&self, from: u32, to: u32) {
        let direction = if to > from { "up" } else { "down" };
        self.scales
            .get_or_create(&DirectionLabels {
                direction: direction.to_owned(),
            })
            .inc();
    }

    /// Observes one reconcile's duration.
    pub fn reconcile_took(&self, seconds: f64) {
        self.reconcile_duration.observe(seconds);
    }

    /// Counts a failed reconcile.
    pub fn reconcile_error(&self, reason: &str) {
        self.reconcile_errors
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Counts a document that could not be read.
    pub fn scrape_failure(&self, source: &str, reason: &str) {
        self.scrape_failures
            .get_or_create(&ScrapeLabels {
                source: source.to_owned(),
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Sets the leader gauge.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    /// The text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_prometheus_conventions() {
        let m = Metrics::new();
        m.decision(ScaleReason::ScaleUp);
        m.scrape_failure("sidecar", "timeout");
        m.reconcile_took(0.01);
        m.set_leader(true);
        let text = m.encode();
        assert!(
            text.contains("tessera_autoscaler_decisions_total{reason=\"scale_up\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "tessera_autoscaler_scrape_failures_total{source=\"sidecar\",reason=\"timeout\"} 1"
            )
        );
        assert!(text.contains("tessera_autoscaler_reconcile_duration_seconds_count 1"));
        assert!(text.contains("tessera_autoscaler_leader 1"));
    }
}
