//! Sleep mode in a run, as the controller does it: the round decides (`core::sleep::rule`, through
//! `core::round`), a model's last replica at zero stays on its GPU as a sleeper holding its residue, the GPU's
//! sleeper budget admits or evicts (`core::pack::sleeping::admit`), and a wake goes to the sleeper's own GPU.
//!
//! A sleeper keeps its whole share on its GPU, as the pool keeps a sleeping pod's reservation by default; with
//! `lend_sleepers` (the chart's `gpuPools.lendSleepers`) it keeps only its residue (`sleep_residue_mib`, its CUDA
//! context) and lends the rest: a new replica takes that room only where the alternative is opening a GPU
//! (`Packer::place_beside_sleeping`). Every placement is made with what the sleepers keep held
//! ([`World::held_asleep`]). A GPU that holds
//! only sleepers is given back after the release grace like an empty one (a GPU costs far more than the cold
//! starts its sleepers save), and its sleepers are lost.

use std::time::Duration;

use tessera_core::pack::sleeping::{self, Admit, GAPS_KEPT, Sleeper, SleeperBudget};
use tessera_core::pack::{GpuId, ReplicaRequest};
use tessera_core::sleep::command::SleepLevel;
use tessera_core::sleep::rule::{SleepFacts, SleepPolicy};

use super::World;

impl World<'_> {
    /// What Tessera's round reads about model `m`'s sleep mode; `None` for a model without one.
    pub(super) fn sleep_facts(&self, m: usize, live: &[usize]) -> Option<(SleepPolicy, SleepFacts)> {
        let wake = self.sc.models[m].sleep_wake_secs?;
        // The scenario's wake is a level-1 wake, and capacity nodes hold a copy of the weights in host memory.
        let policy = SleepPolicy {
            enabled: true,
            level: Some(SleepLevel::One),
            allow_risky: false,
            expected_wake: None,
        };
        let asleep = self.sleepers.contains_key(&m);
        // The GPU its last running replica would sleep on: the room there, by the rule the controller reads too.
        let room = match live {
            [only] => self.replicas[*only].gpu.map(|g| {
                let others_awake = self
                    .tenants
                    .get(&g)
                    .is_some_and(|t| t.iter().any(|&r| r != *only));
                sleeping::room(
                    others_awake,
                    &self.sleepers_on(g, m),
                    &self.sleeper(m),
                    self.sleeper_budget(),
                )
            }),
            _ => None,
        }
        .unwrap_or_default();
        let facts = SleepFacts {
            asleep,
            alone_on_gpu: room.alone_on_gpu,
            measured_wake: [Some(Duration::from_secs_f64(wake)), None],
            no_room: !asleep && room.no_room,
            ..SleepFacts::default()
        };
        Some((policy, facts))
    }

    /// The sleepers on GPU `g` but model `m`'s.
    fn sleepers_on(&self, g: GpuId, m: usize) -> Vec<Sleeper> {
        self.sleepers
            .iter()
            .filter(|&(&other, (on, _))| *on == g && other != m)
            .map(|(&other, _)| self.sleeper(other))
            .collect()
    }

    /// The budget's answer to model `m` sleeping on GPU `g`.
    fn admit_sleeper(&self, m: usize, g: GpuId) -> Admit {
        sleeping::admit(&self.sleepers_on(g, m), &self.sleeper(m), self.sleeper_budget())
    }

    fn sleeper(&self, m: usize) -> Sleeper {
        let setup = &self.sc.models[m];
        let cold = setup.scale_up_secs(&self.sc.settings);
        let gaps: Vec<Duration> = self.models[m]
            .idle_gaps
            .iter()
            .map(|g| Duration::from_secs_f64(g.max(0.0)))
            .collect();
        Sleeper::new(
            setup.name.clone(),
            self.sc.settings.sleep_residue_mib,
            Duration::from_secs_f64(cold.max(0.0)),
            Duration::from_secs_f64(setup.sleep_wake_secs.unwrap_or(cold).max(0.0)),
            &gaps,
        )
    }

    fn sleeper_budget(&self) -> SleeperBudget {
        SleeperBudget::of_gpu(
            self.sc.gpu.memory_bytes >> 20,
            self.sc.settings.max_sleepers_per_gpu,
        )
    }

    /// Model `m`'s last replica left GPU `g` with `share`: it sleeps there if its last round said so and the
    /// budget admits it (evicting cheaper sleepers), else it is gone.
    pub(super) fn fall_asleep(&mut self, m: usize, g: GpuId, share: ReplicaRequest) {
        if !self.models[m].sleeps_at_zero {
            return;
        }
        match self.admit_sleeper(m, g) {
            Admit::Refuse => return,
            Admit::Fits => {}
            Admit::Evict(ids) => {
                let evicted: Vec<usize> = ids
                    .iter()
                    .filter_map(|id| self.sc.models.iter().position(|s| &s.name == id))
                    .collect();
                for e in evicted {
                    self.sleepers.remove(&e);
                    self.models[e].sleepers_lost += 1;
                }
            }
        }
        self.models[m].asleep_since = Some(self.now);
        self.sleepers.insert(m, (g, share));
    }

    /// Model `m` wakes (or starts cold after losing its sleeper): the gap it sat out counts towards its typical one.
    pub(super) fn note_idle_gap(&mut self, m: usize) {
        if let Some(since) = self.models[m].asleep_since.take() {
            let gaps = &mut self.models[m].idle_gaps;
            if gaps.len() == GAPS_KEPT {
                gaps.remove(0);
            }
            gaps.push(self.now - since);
        }
    }

    /// What every sleeper but `waking` (whose whole share is about to be placed) keeps on its GPU, as packer
    /// requests for [`tessera_core::pack::Packer::with_held`]: its residue where sleepers lend their room
    /// (`lend_sleepers`), else its whole share, as the pool keeps a sleeping pod's reservation without lending.
    pub(super) fn held_asleep(&self, waking: Option<usize>) -> Vec<(GpuId, ReplicaRequest)> {
        let residue = self.sc.settings.sleep_residue_mib;
        let lend = self.sc.settings.lend_sleepers;
        self.sleepers
            .iter()
            .filter(|&(&m, _)| Some(m) != waking)
            .map(|(&m, (g, share))| {
                let model = self.sc.models[m].name.clone();
                let id = format!("asleep/{m}");
                let held = if lend {
                    ReplicaRequest::new(id, model, 0, residue)
                } else {
                    ReplicaRequest::new(id, model, share.compute_milli, share.memory_mib)
                };
                (*g, held)
            })
            .collect()
    }
}
