//! The pool manager's half of consolidation: runs [`tessera_core::pack::consolidate::pool_step`] on the pool's
//! index every reconcile and writes its answer, the `tessera.dev/draining-since` mark on a capacity pod. The
//! controller's half (moving the pods) is `crate::controller::consolidate`.

use tessera_core::pack::consolidate::{CancelReason, PoolStep, pool_step};
use tracing::{debug, info, warn};

use super::super::PoolError;
use super::super::state::draining_patch;
use super::{PoolManager, is_status};

impl PoolManager {
    /// One consolidation step (`tessera_core::pack::consolidate::pool_step`): marks a GPU whose replicas fit
    /// elsewhere as draining once it has stayed so for the settle time, and clears the mark once it is empty or the
    /// drain is called off. The marks are then published for the controller, which moves the pods.
    pub(super) async fn consolidate(&self, now: u64) -> Result<Option<(String, &'static str)>, PoolError> {
        let cfg = self.pool.consolidation();
        let shape = self.pool.shape();
        let (step, target) = {
            let idx = self.index();
            let (packer, names) = idx.packer(&shape);
            let candidate = *self.candidate.lock().unwrap_or_else(|e| e.into_inner());
            // Movable: a ReplicaSet's Ready pod (the index) that an InferenceAutoscaler's round moves (the link).
            let step = pool_step(&packer, candidate, now, &cfg, |r| {
                idx.tenant_of(&r.id)
                    .is_some_and(|t| t.movable && self.link.managed.contains(&t.key))
            });
            let gpu = match &step {
                PoolStep::Drain(plan) => Some(plan.gpu),
                PoolStep::Drained(g) | PoolStep::Cancel { gpu: g, .. } => Some(*g),
                PoolStep::Idle | PoolStep::Settling { .. } | PoolStep::Draining(_) => None,
            };
            let target = gpu.and_then(|g| names.get(&g)).and_then(|name| {
                let cap = idx.capacity_pod(name)?;
                Some((name.clone(), cap.resource_version.clone()))
            });
            if let PoolStep::Settling { candidate, plan } = &step
                && candidate.since == now
            {
                let name = names.get(&plan.gpu).map_or("?", String::as_str);
                debug!(
                    capacity_pod = name,
                    moves = plan.moves.len(),
                    "consolidation candidate: waiting for the settle time"
                );
            }
            (step, target)
        };
        *self.candidate.lock().unwrap_or_else(|e| e.into_inner()) = step.candidate();
        let result = match (&step, target) {
            (PoolStep::Drain(plan), Some((name, rv))) => {
                let moves: Vec<&str> = plan.moves.iter().map(|m| m.replica.as_str()).collect();
                self.write_draining(&name, Some(now), rv.as_deref()).await?.then(|| {
                    info!(capacity_pod = %name, reservations = ?moves, "consolidation: draining this GPU; its models move their pods to the others");
                    (name, "started")
                })
            }
            (PoolStep::Drained(_), Some((name, rv))) => {
                self.write_draining(&name, None, rv.as_deref()).await?.then(|| {
                    info!(capacity_pod = %name, "consolidation: GPU emptied; released after the empty grace");
                    (name, "drained")
                })
            }
            (PoolStep::Cancel { reason, .. }, Some((name, rv))) => {
                let label = match reason {
                    CancelReason::TimedOut => "timed_out",
                    CancelReason::Disabled => "disabled",
                };
                self.write_draining(&name, None, rv.as_deref()).await?.then(|| {
                    warn!(capacity_pod = %name, reason = reason.as_str(), "consolidation: drain called off (a model on it did not move: does it have an InferenceAutoscaler?)");
                    (name, label)
                })
            }
            _ => None,
        };
        if let Some((_, label)) = &result {
            self.metrics.drain(&self.pool.name, label);
        }
        let draining: Vec<String> = self.index().draining().map(|g| g.name.clone()).collect();
        self.link.draining.set(&self.pool.name, draining);
        Ok(result)
    }

    /// Writes (or clears) the draining mark of capacity pod `name`; false when it changed or went meanwhile
    /// (re-read; the next reconcile decides again).
    async fn write_draining(
        &self,
        name: &str,
        since: Option<u64>,
        rv: Option<&str>,
    ) -> Result<bool, PoolError> {
        let patch = draining_patch(since, rv);
        match self.patch_capacity(name, &patch).await {
            Ok(()) => Ok(true),
            Err(e) if is_status(&e, 409) || is_status(&e, 404) => {
                self.metrics.conflict(&self.pool.name);
                self.refresh(name).await?;
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }
}
