//! Tessera's "at the ceiling, buy isolation" step (`core::scale::isolation`), applied each round after the
//! replica decision: a model held at `max_replicas` whose TTFT is over its objective while it shares GPUs gets
//! whole GPUs. The simulator applies it the way a roll leaves: each of its replicas that shares a GPU is
//! replaced make-before-break (one surge, then the old pod once the new one is ready, `move_step`), and the new
//! ones are placed alone — a full SM cap and a whole GPU's memory in the packer, so no co-tenant is placed beside
//! them. The controller would move the co-tenants instead (the same end state, the model's own replicas never
//! restarted); that wiring is not done yet (docs/fractional-gpus.md, "Limits").

use tessera_core::scale::isolation::{Isolation, IsolationFacts, isolation};
use tessera_core::scale::{ScaleInput, ScalePolicy};

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

    /// The rule for model `m` this round, from the round's own policy and input; starts the moves it asks for.
    pub(super) fn isolation_round(
        &mut self,
        m: usize,
        policy: &ScalePolicy,
        input: &ScaleInput,
        live: &[usize],
    ) {
        if self.plan.kind != StrategyKind::Tessera || self.packer.is_none() {
            return;
        }
        let shared: Vec<usize> = live.iter().copied().filter(|&r| self.shares_gpu(r)).collect();
        let facts = IsolationFacts {
            shares_gpu: !shared.is_empty(),
            isolated: self.models[m].isolation.isolated,
        };
        let decided = isolation(policy, input, facts);
        let st = &mut self.models[m].isolation;
        let now = matches!(decided, Isolation::Isolate(_));
        if now && !st.isolated {
            st.began += 1;
            tracing::debug!(model = %self.sc.models[m].name, at = self.now, ?decided, "isolating at the ceiling");
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
