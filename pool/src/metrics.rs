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
//! - `mode: dra`, from each pass's index of slices and allocated claims (one series per published GPU):
//!   `tessera_pool_dra_memory_used_mib{node,device}`, `tessera_pool_dra_compute_used_milli{node,device}` and
//!   `tessera_pool_dra_claims{node,device}` (what the scheduler booked), `tessera_pool_dra_gpus{placement}` — GPUs
//!   holding a claim (`scheduler`) against an offline packing of the same claims (`packer`) and its lower bound
//!   (`bound`) — and `tessera_pool_dra_overbooked_claims` (claims over their device's capacity: never expected).

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
struct DeviceLabels {
    node: String,
    device: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PlacementLabels {
    placement: String,
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
    dra_memory: Family<DeviceLabels, Gauge<i64, AtomicI64>>,
    dra_compute: Family<DeviceLabels, Gauge<i64, AtomicI64>>,
    dra_claims: Family<DeviceLabels, Gauge<i64, AtomicI64>>,
    dra_gpus: Family<PlacementLabels, Gauge<i64, AtomicI64>>,
    dra_overbooked: Gauge<i64, AtomicI64>,
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
            dra_memory: register(
                r,
                "dra_memory_used_mib",
                "DRA: GPU memory the scheduler booked on a device, MiB",
            ),
            dra_compute: register(
                r,
                "dra_compute_used_milli",
                "DRA: compute the scheduler booked on a device, milli-GPUs",
            ),
            dra_claims: register(r, "dra_claims", "DRA: claims allocated on a device"),
            dra_gpus: register(
                r,
                "dra_gpus",
                "DRA: GPUs holding a claim (scheduler) against an offline packing of the same claims (packer) and its lower bound (bound)",
            ),
            dra_overbooked: register(
                r,
                "dra_overbooked_claims",
                "DRA: claims over their device's capacity (never expected)",
            ),
        }
    }

    /// Sets the DRA gauges from one pass's index; devices no longer published lose their series.
    pub fn dra(&self, index: &tessera_dra::index::DraIndex) {
        for f in [&self.dra_memory, &self.dra_compute, &self.dra_claims] {
            f.clear();
        }
        for room in index.rooms() {
            let l = DeviceLabels {
                node: room.pool.clone(),
                device: room.device.clone(),
            };
            self.dra_memory
                .get_or_create(&l)
                .set(i64::try_from(room.memory_used_mib).unwrap_or(i64::MAX));
            self.dra_compute
                .get_or_create(&l)
                .set(i64::from(room.compute_used_milli));
            self.dra_claims
                .get_or_create(&l)
                .set(i64::try_from(room.claims.len()).unwrap_or(i64::MAX));
        }
        let (held, packed, bound) = index.placement_gap();
        for (placement, n) in [
            ("scheduler", held as i64),
            ("packer", packed as i64),
            ("bound", i64::from(bound)),
        ] {
            self.dra_gpus
                .get_or_create(&PlacementLabels {
                    placement: placement.into(),
                })
                .set(n);
        }
        self.dra_overbooked
            .set(i64::try_from(index.overbooked.len()).unwrap_or(i64::MAX));
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
