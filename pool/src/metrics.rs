//! The pool manager's Prometheus metrics (registered into the autoscaler's registry, or any other):
//!
//! - `tessera_pool_reservations_total{pool,result}`: reservation calls by outcome (`placed`, `existing`,
//!   `created_capacity_pod`, `lent_by_sleepers`, and the [`PoolError::label`](super::PoolError::label) of failures),
//!   and `sleeper_evicted` each time the leader deletes a sleeping pod whose room was lent.
//! - `tessera_pool_conflicts_total{pool}`: writes refused with 409 (lost optimistic-concurrency races).
//! - `tessera_pool_expired_reservations_total{pool}`: reservations dropped because their pod never came.
//! - `tessera_pool_capacity_pods_deleted_total{pool}`: capacity pods deleted after the grace period.
//! - `tessera_pool_capacity_pods{pool}`: capacity pods in the index after the last reconcile.
//! - `tessera_pool_drains_total{pool,result}`: consolidation drains by step: `started`, `drained` (the GPU emptied),
//!   `timed_out`, `disabled`, `ended_by_placement` (a new replica had to go on it).

use std::sync::atomic::AtomicI64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tessera_runtime::metrics::register;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    pool: String,
    result: String,
}

/// Handles to the pool metrics; cheap to clone (the families are shared).
#[derive(Debug, Clone, Default)]
pub struct PoolMetrics {
    reservations: Family<ResultLabels, Counter>,
    conflicts: Family<PoolLabels, Counter>,
    expired: Family<PoolLabels, Counter>,
    deleted: Family<PoolLabels, Counter>,
    capacity_pods: Family<PoolLabels, Gauge<i64, AtomicI64>>,
    drains: Family<ResultLabels, Counter>,
}

impl PoolMetrics {
    /// Creates the metrics and registers them under `tessera_pool_*` (pass the root registry; a prefixed
    /// sub-registry would add its prefix in front).
    pub fn register(registry: &mut Registry) -> Self {
        let r = registry.sub_registry_with_prefix("tessera_pool");
        Self {
            reservations: register(r, "reservations", "Reservation calls, by outcome"),
            conflicts: register(r, "conflicts", "Capacity pod writes refused with 409 Conflict"),
            expired: register(
                r,
                "expired_reservations",
                "Reservations dropped because their pod never appeared",
            ),
            deleted: register(
                r,
                "capacity_pods_deleted",
                "Capacity pods deleted after the empty-GPU grace period",
            ),
            capacity_pods: register(r, "capacity_pods", "Capacity pods held by the pool"),
            drains: register(
                r,
                "drains",
                "Consolidation drains of a GPU, by step (started, drained, timed_out, disabled, ended_by_placement)",
            ),
        }
    }

    /// Counts one consolidation step of `pool` (`started`, `drained`, `timed_out`, ...).
    pub fn drain(&self, pool: &str, result: &str) {
        self.drains
            .get_or_create(&ResultLabels {
                pool: pool.into(),
                result: result.into(),
            })
            .inc();
    }

    /// Counts one reservation call of `pool` with its outcome (`placed`, `existing`, ... or a failure label).
    pub fn reservation(&self, pool: &str, result: &str) {
        self.reservations
            .get_or_create(&ResultLabels {
                pool: pool.into(),
                result: result.into(),
            })
            .inc();
    }

    /// Counts one capacity-pod write refused with 409.
    pub fn conflict(&self, pool: &str) {
        self.conflicts
            .get_or_create(&PoolLabels { pool: pool.into() })
            .inc();
    }

    /// Counts `n` reservations dropped because their pod never appeared.
    pub fn expired(&self, pool: &str, n: usize) {
        self.expired
            .get_or_create(&PoolLabels { pool: pool.into() })
            .inc_by(n as u64);
    }

    /// Counts one capacity pod deleted after the grace period.
    pub fn deleted(&self, pool: &str) {
        self.deleted
            .get_or_create(&PoolLabels { pool: pool.into() })
            .inc();
    }

    /// Sets the number of capacity pods `pool` holds.
    pub fn capacity_pods(&self, pool: &str, n: usize) {
        self.capacity_pods
            .get_or_create(&PoolLabels { pool: pool.into() })
            .set(n as i64);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn names_follow_prometheus_conventions() {
        let mut reg = Registry::default();
        let m = PoolMetrics::register(&mut reg);
        m.reservation("a100", "placed");
        m.conflict("a100");
        m.expired("a100", 2);
        m.capacity_pods("a100", 3);
        m.drain("a100", "started");
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &reg).unwrap();
        assert!(
            out.contains("tessera_pool_reservations_total{pool=\"a100\",result=\"placed\"} 1"),
            "{out}"
        );
        assert!(
            out.contains("tessera_pool_conflicts_total{pool=\"a100\"} 1"),
            "{out}"
        );
        assert!(
            out.contains("tessera_pool_expired_reservations_total{pool=\"a100\"} 2"),
            "{out}"
        );
        assert!(
            out.contains("tessera_pool_capacity_pods{pool=\"a100\"} 3"),
            "{out}"
        );
        assert!(
            out.contains("tessera_pool_drains_total{pool=\"a100\",result=\"started\"} 1"),
            "{out}"
        );
    }
}
