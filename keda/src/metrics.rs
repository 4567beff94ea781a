//! The scaler's own metrics: what KEDA asked, what it got, and how long it took. KEDA falls back to its
//! `fallback.replicas` (or keeps the count) when a scaler errors, so an outage of Tessera's answers would be
//! invisible on the workload; these make it visible on Tessera's `/metrics`.

use std::sync::atomic::AtomicI64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Labels of one call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Call {
    method: &'static str,
    outcome: &'static str,
}

/// Labels of one method.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Method {
    method: &'static str,
}

/// The scaler's metrics, registered into the autoscaler's registry.
#[derive(Debug, Clone)]
pub struct Metrics {
    calls: Family<Call, Counter>,
    latency: Family<Method, Histogram>,
    streams: Gauge<i64, AtomicI64>,
    pushes: Family<Call, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            calls: Family::default(),
            latency: Family::new_with_constructor(|| {
                Histogram::new([0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5])
            }),
            streams: Gauge::default(),
            pushes: Family::default(),
        }
    }
}

impl Metrics {
    /// Adds the metrics to `registry` under the `tessera_keda_` prefix.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "tessera_keda_calls",
            "KEDA external-scaler calls by method and outcome (ok, or why no metric was given: not_found, \
             no_decision, no_signal, invalid, other_namespace, scaled_by_tessera)",
            self.calls.clone(),
        );
        registry.register(
            "tessera_keda_call_duration_seconds",
            "Time to answer a KEDA external-scaler call, by method",
            self.latency.clone(),
        );
        registry.register(
            "tessera_keda_open_streams",
            "StreamIsActive streams open (one per external-push trigger KEDA keeps connected)",
            self.streams.clone(),
        );
        registry.register(
            "tessera_keda_pushes",
            "IsActive values pushed on StreamIsActive streams, by value (true, false)",
            self.pushes.clone(),
        );
    }

    /// Counts one call and its time.
    pub fn call(&self, method: &'static str, outcome: &'static str, seconds: f64) {
        self.calls.get_or_create(&Call { method, outcome }).inc();
        self.latency.get_or_create(&Method { method }).observe(seconds);
    }

    /// Counts one pushed value.
    pub fn pushed(&self, active: bool) {
        let outcome = if active { "true" } else { "false" };
        self.pushes
            .get_or_create(&Call {
                method: "StreamIsActive",
                outcome,
            })
            .inc();
    }

    /// A stream opened (`+1`) or closed (`-1`).
    pub fn stream(&self, delta: i64) {
        self.streams.inc_by(delta);
    }
}
