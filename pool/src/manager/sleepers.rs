//! The pool's half of the sleeper budget: after every reconcile the manager publishes each GPU's tenants (which
//! are asleep, which were let go), its budget and whether it is given back ([`crate::sleepers::SleepLink`]); the
//! controller decides with them (`core::pack::sleeping::admit`, `SleepFacts::{no_room, alone_on_gpu}`).
//!
//! A GPU that holds only sleeping pods is given back like an empty one (the simulator's rule): once it has held
//! only sleepers for the pool's `emptyGpuGracePeriod` its sleepers are let go by their models' controllers, and
//! when the last one's reservation goes the capacity pod is marked empty as of the moment it held only sleepers,
//! so it is released at once rather than after a second grace. The moment is kept in memory: a new leader starts
//! it again, which only keeps the GPU longer.

use std::collections::HashMap;
use std::time::Duration;

use tessera_core::pack::{EmptyGpu, empty_gpu};

use super::PoolManager;
use crate::sleepers::{GpuSleepers, GpuTenant};

/// Every tenant asleep (a GPU with none is empty, which the empty rule handles).
fn only_sleepers(tenants: &[GpuTenant]) -> bool {
    !tenants.is_empty() && tenants.iter().all(|t| t.asleep)
}

impl PoolManager {
    /// Publishes every GPU of the pool for the controller's sleeper budget (see the module).
    pub(super) fn publish_sleepers(&self, now: u64) {
        let tenants = self.index().gpu_tenants();
        let grace = self.pool.empty_gpu_grace_period;
        let secs = Duration::from_secs;
        let mut since = self.sleepers_only.lock().unwrap_or_else(|e| e.into_inner());
        since.retain(|name, _| tenants.iter().any(|(n, t)| n == name && only_sleepers(t)));
        let gpus: HashMap<String, GpuSleepers> = tenants
            .into_iter()
            .map(|(name, list)| {
                let given_back = only_sleepers(&list) && {
                    let from = *since.entry(name.clone()).or_insert(now);
                    empty_gpu(Some(secs(from)), secs(now), grace) == EmptyGpu::Release
                };
                let gpu = GpuSleepers {
                    budget: self.pool.sleeper_budget(),
                    default_residue_mib: self.pool.sleep_residue_mib,
                    tenants: list,
                    given_back,
                };
                (name, gpu)
            })
            .collect();
        self.link.sleepers.set_pool(&self.pool.name, gpus);
    }

    /// Since when capacity pod `name` has held only sleeping pods (Unix seconds), as this leader saw it.
    pub(super) fn sleepers_only_since(&self, name: &str) -> Option<u64> {
        let since = self.sleepers_only.lock().unwrap_or_else(|e| e.into_inner());
        since.get(name).copied()
    }
}
