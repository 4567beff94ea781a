//! What the pool managers and the controller of one process tell each other about sleeping pods (vLLM sleep
//! mode, `spec.sleep`), so that the controller applies the GPU's sleeper budget as the simulator does
//! (`tessera_core::pack::sleeping::admit`):
//! - pool managers → controller: each GPU's tenants, which are asleep, its [`SleeperBudget`], and whether it has
//!   held only sleepers for its pool's `emptyGpuGracePeriod` (then it is given back like an empty GPU: its
//!   sleepers' models let their pods go, and the empty GPU is released by the usual rule);
//! - controller → controller: what each sleeping pod is worth ([`Sleeper`]), published by its own model's round,
//!   read by another model's round whose last replica would sleep on the same GPU.
//!
//! Both run on the leader only, in the same process. A new leader starts with nothing: a sleeper whose worth is
//! not published yet is never evicted ([`Sleeper::unknown`]), and a GPU's sleepers-only time starts again.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use tessera_core::pack::sleeping::{Sleeper, SleeperBudget};

/// One GPU (capacity pod) as the controller's sleeper budget reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSleepers {
    /// Its pool's budget for sleeping pods.
    pub budget: SleeperBudget,
    /// A sleeping pod's residue, MiB, until its sidecar measured one (the pool's `sleepResidueMiB`).
    pub default_residue_mib: u64,
    /// Its tenants: one per reservation (a lent one, leaving, is not).
    pub tenants: Vec<GpuTenant>,
    /// It has held only sleeping pods for its pool's `emptyGpuGracePeriod`: given back like an empty GPU.
    pub given_back: bool,
}

/// A tenant of a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuTenant {
    /// `namespace/name`; `None` for a reservation whose pod has not appeared yet (it will run).
    pub pod: Option<String>,
    /// Told to sleep and not Ready.
    pub asleep: bool,
    /// Asleep and let go (`tessera_core::sleep::evict`): leaving, so no longer a sleeper the budget counts.
    pub evicted: bool,
}

impl GpuSleepers {
    /// Whether every tenant but `pod` is asleep (or there is none): a sleeper there would be all that keeps the
    /// GPU (`SleepFacts::alone_on_gpu`).
    pub fn alone(&self, pod: &str) -> bool {
        self.tenants
            .iter()
            .filter(|t| t.pod.as_deref() != Some(pod))
            .all(|t| t.asleep)
    }

    /// The sleeping tenants but `pod`.
    pub fn sleepers_but<'a>(&'a self, pod: &'a str) -> impl Iterator<Item = &'a str> {
        self.tenants
            .iter()
            .filter(|t| t.asleep && !t.evicted)
            .filter_map(|t| t.pod.as_deref())
            .filter(move |p| *p != pod)
    }
}

/// The shared view. Cheap to clone; clones share.
#[derive(Debug, Clone, Default)]
pub struct SleepLink {
    gpus: Arc<RwLock<HashMap<String, HashMap<String, GpuSleepers>>>>,
    worth: Arc<RwLock<HashMap<String, (Instant, Sleeper)>>>,
}

impl SleepLink {
    /// How long a published worth counts: many sync periods (a deleted model's sleepers stop counting).
    pub const MAX_AGE: Duration = Duration::from_secs(300);

    /// Pool manager: the GPUs of `pool` now, by capacity pod name.
    pub fn set_pool(&self, pool: &str, gpus: HashMap<String, GpuSleepers>) {
        let mut map = self.gpus.write().unwrap_or_else(|e| e.into_inner());
        map.insert(pool.to_owned(), gpus);
    }

    /// Capacity pod `name` (of any pool), as last published.
    pub fn gpu(&self, name: &str) -> Option<GpuSleepers> {
        let map = self.gpus.read().unwrap_or_else(|e| e.into_inner());
        map.values().find_map(|g| g.get(name).cloned())
    }

    /// Controller: what pod `pod` (`namespace/name`) is worth asleep, as of now.
    pub fn set_worth(&self, pod: &str, sleeper: Sleeper) {
        let mut map = self.worth.write().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        map.retain(|_, (at, _)| now.duration_since(*at) <= Self::MAX_AGE);
        map.insert(pod.to_owned(), (now, sleeper));
    }

    /// What pod `pod` is worth asleep, if its model's round said so lately; else [`Sleeper::unknown`] with
    /// `residue_mib` (never evicted on missing facts).
    pub fn worth(&self, pod: &str, residue_mib: u64) -> Sleeper {
        self.published(pod)
            .unwrap_or_else(|| Sleeper::unknown(pod, residue_mib))
    }

    /// What pod `pod` is worth asleep, if its model's round said so lately.
    pub fn published(&self, pod: &str) -> Option<Sleeper> {
        let map = self.worth.read().unwrap_or_else(|e| e.into_inner());
        map.get(pod)
            .filter(|(at, _)| at.elapsed() <= Self::MAX_AGE)
            .map(|(_, s)| s.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(tenants: &[(&str, bool)]) -> GpuSleepers {
        GpuSleepers {
            budget: SleeperBudget::of_gpu(81_920, 4),
            default_residue_mib: 1_434,
            tenants: tenants
                .iter()
                .map(|(p, asleep)| GpuTenant {
                    pod: (!p.is_empty()).then(|| (*p).to_owned()),
                    asleep: *asleep,
                    evicted: false,
                })
                .collect(),
            given_back: false,
        }
    }

    #[test]
    fn alone_means_every_other_tenant_asleep_and_a_pending_pod_is_awake() {
        assert!(gpu(&[("a/x", false), ("b/y", true)]).alone("a/x"));
        assert!(!gpu(&[("a/x", false), ("b/y", false)]).alone("a/x"));
        assert!(
            !gpu(&[("a/x", false), ("", false)]).alone("a/x"),
            "a pod on its way"
        );
        let g = gpu(&[("a/x", false), ("b/y", true), ("c/z", true)]);
        assert_eq!(g.sleepers_but("b/y").collect::<Vec<_>>(), ["c/z"]);
    }

    #[test]
    fn a_worth_not_published_is_never_the_cheapest() {
        let link = SleepLink::default();
        link.set_pool(
            "a100",
            HashMap::from([("cap-0".to_owned(), gpu(&[("a/x", true)]))]),
        );
        assert!(link.gpu("cap-0").is_some() && link.gpu("cap-1").is_none());
        let unknown = link.clone().worth("a/x", 1_434);
        let s = Sleeper::new("a/x", 1_434, Duration::from_secs(90), Duration::from_secs(1), &[]);
        assert!(unknown.value() > s.value());
        link.set_worth("a/x", s.clone());
        assert_eq!(link.worth("a/x", 1_434), s);
    }
}
