//! What the pool managers and the controller of one process tell each other for consolidation
//! (`tessera_core::pack::consolidate`): the pool managers publish the capacity pods they drain, which the controller
//! moves its models' pods off; the controller publishes the pods it manages, so a pool drains a GPU only when every
//! pod on it has a controller to move it. Both run on the leader only, in the same process.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// Both directions of the link, as one handle: what a pool manager and the controller of one process share.
#[derive(Debug, Clone, Default)]
pub struct ConsolidationLink {
    /// Pool managers → controller: the capacity pods being drained.
    pub draining: DrainingGpus,
    /// Pool managers → controller: the capacity pods holding more than one tenant (a model isolated at its
    /// ceiling moves its pods off them, `core::scale::isolation`).
    pub shared: SharedGpus,
    /// Controller → pool managers.
    pub managed: ManagedPods,
    /// Both ways, for sleeping pods: each GPU's sleepers and budget, and what each sleeper is worth.
    pub sleepers: crate::sleepers::SleepLink,
    /// Pool managers → controller, in `mode: dra`: that the mode is on, and the slices' index with the claims the
    /// scheduler allocated.
    pub dra: crate::dra::DraView,
}

/// A set of capacity pods, by pool, as the pool managers last published it. Cheap to clone; clones share.
#[derive(Debug, Clone, Default)]
pub struct CapacityPodSet(Arc<RwLock<HashMap<String, Vec<String>>>>);

/// The capacity pods being drained.
pub type DrainingGpus = CapacityPodSet;

/// The capacity pods that hold more than one reservation.
pub type SharedGpus = CapacityPodSet;

impl CapacityPodSet {
    /// Sets the capacity pods of `pool` in the set.
    pub fn set(&self, pool: &str, capacity_pods: Vec<String>) {
        // A poisoned lock holds whole entries only: still usable.
        let mut map = self.0.write().unwrap_or_else(|e| e.into_inner());
        if capacity_pods.is_empty() {
            map.remove(pool);
        } else {
            map.insert(pool.to_owned(), capacity_pods);
        }
    }

    /// Whether capacity pod `name` (of any pool) is in the set.
    pub fn contains(&self, name: &str) -> bool {
        let map = self.0.read().unwrap_or_else(|e| e.into_inner());
        map.values().any(|names| names.iter().any(|n| n == name))
    }
}

/// The pods (`namespace/name`) each InferenceAutoscaler's controller round last saw for its Deployment: the pods
/// a surge and a retire can move. An entry older than [`ManagedPods::MAX_AGE`] no longer counts (its
/// InferenceAutoscaler was deleted, or the controller stopped). Cheap to clone; clones share.
#[derive(Debug, Clone, Default)]
pub struct ManagedPods(Arc<RwLock<HashMap<String, Claim>>>);

/// One InferenceAutoscaler's pods and when its round listed them.
type Claim = (Instant, Vec<String>);

impl ManagedPods {
    /// How long a round's list counts: many sync periods, so a slow round never makes a pod look unmanaged.
    pub const MAX_AGE: Duration = Duration::from_secs(300);

    /// Records the pods InferenceAutoscaler `owner` (`namespace/name`) moves, as of now.
    pub fn set(&self, owner: &str, pods: Vec<String>) {
        let mut map = self.0.write().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        map.retain(|_, (at, _)| now.duration_since(*at) <= Self::MAX_AGE);
        if pods.is_empty() {
            map.remove(owner);
        } else {
            map.insert(owner.to_owned(), (now, pods));
        }
    }

    /// The pods (`namespace/name`) a controller round moves, from the claims still fresh: one set, read once per
    /// pool tick, instead of a scan of every claim for each tenant.
    pub fn fresh(&self) -> HashSet<String> {
        let map = self.0.read().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        map.values()
            .filter(|(at, _)| now.duration_since(*at) <= Self::MAX_AGE)
            .flat_map(|(_, pods)| pods.iter().cloned())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draining_and_managed_sets_are_shared_by_clones() {
        let d = DrainingGpus::default();
        d.clone().set("a100", vec!["gpu-1".into()]);
        assert!(d.contains("gpu-1") && !d.contains("gpu-0"));
        d.set("a100", Vec::new());
        assert!(!d.contains("gpu-1"));
        let m = ManagedPods::default();
        m.clone().set("team/chat", vec!["team/chat-abc".into()]);
        assert!(m.fresh().contains("team/chat-abc") && !m.fresh().contains("team/other"));
        m.set("team/chat", Vec::new());
        assert!(!m.fresh().contains("team/chat-abc"));
    }
}
