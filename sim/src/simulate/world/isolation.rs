//! Tessera's "at the ceiling, buy isolation" step (`core::scale::isolation`, step 6 of `core::round`): a model held
//! at `max_replicas` whose TTFT is over its objective while it shares GPUs gets whole GPUs. The simulator applies
//! the round's answer as the controller does: each of its replicas that shares a GPU leaves as from a draining GPU
//! (one surge, then the old pod once the new one is ready, `move_step`), and the new ones are placed alone — a
//! full SM cap and a whole GPU's memory in the packer (the controller's webhook gives them whole GPUs), so no
//! co-tenant is placed beside them.

use tessera_core::round::Round;
use tessera_core::scale::isolation::IsolationFacts;

use super::*;

/// One model's isolation, as the rule decided it last round.
#[derive(Debug, Default)]
pub(super) struct IsolationState {
    /// Whether its replicas hold whole GPUs now.
    pub(super) isolated: bool,
    /// Rounds it spent isolated, and times the rule began an isolation.
    pub(super) rounds: u32,
    pub(super) began: u32,
}

impl World<'_> {
    /// Whether replica `r` shares its GPU with another tenant.
    fn shares_gpu(&self, r: usize) -> bool {
        self.replicas[r]
            .gpu
            .and_then(|g| self.tenants.get(&g))
            .is_some_and(|t| t.iter().any(|&o| o != r))
    }

    /// Whether new replicas of model `m` are placed alone (Tessera only).
    pub(super) fn placed_alone(&self, m: usize) -> bool {
        self.plan.kind == StrategyKind::Tessera && self.models[m].isolation.isolated
    }

    /// What the round's isolation rule reads of model `m`: whether any of its `live` replicas shares its GPU, and
    /// what the last round decided. `None` for the baselines and without a packer (no shared GPUs to leave).
    pub(super) fn isolation_facts(&self, m: usize, live: &[usize]) -> Option<IsolationFacts> {
        (self.plan.kind == StrategyKind::Tessera && self.packer.is_some()).then(|| IsolationFacts {
            shares_gpu: live.iter().any(|&r| self.shares_gpu(r)),
            isolated: self.models[m].isolation.isolated,
        })
    }

    /// Applies the round's isolation to model `m`: records it and starts the moves it asks for.
    pub(super) fn apply_isolation(&mut self, m: usize, r: &Round, live: &[usize]) {
        if r.isolation.is_none() {
            return;
        }
        let shared: Vec<usize> = live.iter().copied().filter(|&r| self.shares_gpu(r)).collect();
        let st = &mut self.models[m].isolation;
        let now = r.isolated();
        if now && !st.isolated {
            st.began += 1;
            tracing::debug!(model = %self.sc.models[m].name, at = self.now, decided = ?r.isolation, "isolating at the ceiling");
        }
        st.isolated = now;
        if now {
            st.rounds += 1;
        }
        // Its shared replicas leave as a roll's do, one surge at a time; a roll in progress finishes first (its new
        // pods are placed alone already).
        if now && !shared.is_empty() && self.models[m].allocation.replacing.is_empty() {
            self.models[m].allocation.replacing = shared;
        }
    }
}
