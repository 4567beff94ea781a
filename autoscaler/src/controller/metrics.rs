//! The controller's own Prometheus metrics, served on `--metrics-listen` `/metrics`.
//!
//! - `tessera_autoscaler_decisions_total{reason}`: every decision, by [`ScaleReason::label`].
//! - `tessera_autoscaler_scales_total{direction}`: replica changes actually applied (`up`, `down`).
//! - `tessera_autoscaler_reconcile_duration_seconds`: reconcile latency histogram.
//! - `tessera_autoscaler_reconcile_errors_total{reason}`: failed reconciles, by error label.
//! - `tessera_autoscaler_scrape_failures_total{source,reason}`: sidecar or activator documents that could not be read
//!   (`source="sidecar_objective"`: a latency objective that could not be handed to a sidecar, tried next sync).
//! - `tessera_autoscaler_leader`: 1 while this replica holds the lease.
//! - `tessera_autoscaler_class_changes_total{from,to}`: workload class changes (three classes: at most six series).
//! - `tessera_autoscaler_cold_start_budget_requests{namespace,group}`, `..._allowed_misses`, `..._spent_misses`: a
//!   shared cold-start miss budget (`scaleToZero.coldStartBudgetGroup`) as its last member's reconcile allotted it:
//!   the members' requests over the last day, the misses the budget allows, and the would-be misses of the
//!   members let go to zero. One series per group that a model still names, so the labels stay bounded by the
//!   objects.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::AtomicI64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tessera_core::scale::ScaleReason;
use tessera_runtime::metrics::{register, register_with_unit};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabels {
    direction: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassChangeLabels {
    from: String,
    to: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GroupLabels {
    namespace: String,
    group: String,
}

/// A budget group's gauges.
#[derive(Debug, Default)]
struct BudgetGauges {
    requests: Family<GroupLabels, Gauge<i64, AtomicI64>>,
    allowed: Family<GroupLabels, Gauge<i64, AtomicI64>>,
    spent: Family<GroupLabels, Gauge<i64, AtomicI64>>,
    /// The series set so far, so groups nobody names any more can be removed.
    set: Mutex<HashSet<GroupLabels>>,
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
    class_changes: Family<ClassChangeLabels, Counter>,
    sleepers_let_go: Family<ReasonLabels, Counter>,
    budget: BudgetGauges,
    /// The pool manager's `tessera_pool_*` metrics, served on the same page.
    pub pool: crate::pool::PoolMetrics,
    /// The KEDA scaler's `tessera_keda_*` metrics, served on the same page.
    pub keda: tessera_keda::metrics::Metrics,
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
        let keda = tessera_keda::metrics::Metrics::default();
        keda.register(&mut root);
        let r = root.sub_registry_with_prefix("tessera_autoscaler");
        let decisions = register(r, "decisions", "Replica decisions, by the rule that settled them");
        let scales = register(r, "scales", "Replica changes applied through /scale");
        // Reconciles are dominated by sidecar fetches (timeouts of seconds): buckets from 1 ms to ~16 s.
        let reconcile_duration = register_with_unit(
            r,
            "reconcile_duration",
            "Time to reconcile one InferenceAutoscaler",
            prometheus_client::registry::Unit::Seconds,
            Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                0.001, 2.0, 15,
            )),
        );
        let reconcile_errors = register(r, "reconcile_errors", "Reconciles that failed, by error");
        let scrape_failures = register(
            r,
            "scrape_failures",
            "Sidecar /v1/status or activator stats documents that could not be read",
        );
        let leader = register(r, "leader", "1 while this replica holds the leader lease");
        let class_changes = register(r, "class_changes", "Workload class changes, from and to");
        let sleepers_let_go = register(
            r,
            "sleepers_let_go",
            "Sleeping pods let go, by why: budget (a sleeper worth more took the GPU's room), gpu-given-back",
        );
        let budget = BudgetGauges {
            requests: register(
                r,
                "cold_start_budget_requests",
                "Requests over the last day of the models sharing a cold-start miss budget (members with an hour of history)",
            ),
            allowed: register(
                r,
                "cold_start_budget_allowed_misses",
                "Requests a shared cold-start miss budget allows to miss the TTFT objective through cold starts",
            ),
            spent: register(
                r,
                "cold_start_budget_spent_misses",
                "Would-be cold-start misses of the members a shared budget lets go to zero",
            ),
            set: Mutex::default(),
        };
        Self {
            registry: root,
            decisions,
            scales,
            reconcile_duration,
            reconcile_errors,
            scrape_failures,
            leader,
            class_changes,
            sleepers_let_go,
            budget,
            pool,
            keda,
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

    /// Counts a workload class change.
    pub fn class_changed(
        &self,
        from: tessera_core::class::WorkloadClass,
        to: tessera_core::class::WorkloadClass,
    ) {
        self.class_changes
            .get_or_create(&ClassChangeLabels {
                from: from.as_str().to_owned(),
                to: to.as_str().to_owned(),
            })
            .inc();
    }

    /// Counts a sleeping pod let go (`core::sleep::evict`).
    pub fn sleeper_let_go(&self, reason: tessera_core::sleep::evict::EvictReason) {
        self.sleepers_let_go
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

    /// Sets namespace `ns`'s budget group gauges from a member's allotment.
    pub fn budget_group(&self, ns: &str, spend: &tessera_core::scale::coldstart::GroupSpend) {
        let labels = GroupLabels {
            namespace: ns.to_owned(),
            group: spend.group.clone(),
        };
        let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.budget
            .requests
            .get_or_create(&labels)
            .set(int(spend.requests));
        self.budget
            .allowed
            .get_or_create(&labels)
            .set(int(spend.allowance));
        self.budget.spent.get_or_create(&labels).set(int(spend.spent));
        if let Ok(mut set) = self.budget.set.lock() {
            set.insert(labels);
        }
    }

    /// Removes the series of budget groups for which `named(namespace, group)` is false (no model names them any
    /// more, or their models are gone).
    pub fn retain_budget_groups(&self, named: impl Fn(&str, &str) -> bool) {
        let Ok(mut set) = self.budget.set.lock() else {
            return;
        };
        set.retain(|l| {
            let keep = named(&l.namespace, &l.group);
            if !keep {
                self.budget.requests.remove(l);
                self.budget.allowed.remove(l);
                self.budget.spent.remove(l);
            }
            keep
        });
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

    /// A router that serves [`Metrics::encode`] on `/metrics`, as OpenMetrics.
    pub fn router(self: &std::sync::Arc<Self>) -> axum::Router {
        let metrics = self.clone();
        axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let m = metrics.clone();
                async move { tessera_runtime::serve::openmetrics(m.encode()) }
            }),
        )
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

    /// A budget group's three gauges, and their removal once no model names the group.
    #[test]
    fn budget_group_gauges_follow_the_groups_still_named() {
        let m = Metrics::new();
        let spend = |group: &str| tessera_core::scale::coldstart::GroupSpend {
            group: group.to_owned(),
            members: 6,
            requests: 9282,
            budget: 0.0025,
            allowance: 23,
            spent: 17,
            allotted: true,
            own_misses: 9,
        };
        m.budget_group("tools", &spend("batch"));
        m.budget_group("team-b", &spend("batch"));
        let text = m.encode();
        for line in [
            "tessera_autoscaler_cold_start_budget_requests{namespace=\"tools\",group=\"batch\"} 9282",
            "tessera_autoscaler_cold_start_budget_allowed_misses{namespace=\"tools\",group=\"batch\"} 23",
            "tessera_autoscaler_cold_start_budget_spent_misses{namespace=\"tools\",group=\"batch\"} 17",
        ] {
            assert!(text.contains(line), "{line}\n{text}");
        }
        m.retain_budget_groups(|ns, _| ns == "team-b");
        let text = m.encode();
        assert!(!text.contains("namespace=\"tools\""), "{text}");
        assert!(text.contains("namespace=\"team-b\""), "{text}");
    }
}
