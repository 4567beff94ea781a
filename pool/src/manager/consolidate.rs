//! The pool manager's half of consolidation: runs [`tessera_core::pack::consolidate::pool_step`] on the pool's
//! index every reconcile and writes its answer, the `tessera.dev/draining-since` mark on a capacity pod. The
//! controller's half (moving the pods) is `tessera_autoscaler::controller::consolidate`.

use std::collections::HashSet;

use tessera_core::pack::consolidate::{PoolStep, pool_step};
use tracing::{debug, info, warn};

use super::{PoolManager, is_status};
use crate::PoolError;
use crate::state::draining_patch;

impl PoolManager {
    /// One consolidation step (`tessera_core::pack::consolidate::pool_step`): marks a GPU whose replicas fit
    /// elsewhere as draining once it has stayed so for the settle time, and clears the mark once it is empty or the
    /// drain is called off. The marks, and the GPUs that hold more than one tenant, are then published for the
    /// controller, which moves the pods.
    pub(super) async fn consolidate(&self, now: u64) -> Result<Option<(String, &'static str)>, PoolError> {
        let cfg = self.pool.consolidation();
        let shape = self.pool.shape();
        let (step, target) = {
            let idx = self.index();
            let (packer, names) = idx.packer(&shape);
            let candidate = *self.candidate.lock().unwrap_or_else(|e| e.into_inner());
            // Movable: a ReplicaSet's Ready pod (the index) that an InferenceAutoscaler's round moves (the link), by
            // reservation id.
            let managed = self.link.managed.fresh();
            let movable: HashSet<&str> = idx
                .tenants()
                .filter(|t| t.movable && managed.contains(&t.key))
                .map(|t| t.reservation.as_str())
                .collect();
            let step = pool_step(&packer, candidate, now, &cfg, |r| movable.contains(r.id.as_str()));
            let target = step.mark(now).and_then(|(gpu, since)| {
                let name = names.get(&gpu)?;
                let cap = idx.capacity_pod(name)?;
                Some((name.clone(), since, cap.resource_version.clone()))
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
        let mut result = None;
        if let (Some((name, since, rv)), Some(label)) = (target, step.label())
            && self.write_draining(&name, since, rv.as_deref()).await?
        {
            match &step {
                PoolStep::Drain(plan) => {
                    let moves: Vec<&str> = plan.moves.iter().map(|m| m.replica.as_str()).collect();
                    info!(capacity_pod = %name, reservations = ?moves, "consolidation: draining this GPU; its models move their pods to the others");
                }
                PoolStep::Cancel { reason, .. } => {
                    warn!(capacity_pod = %name, reason = reason.as_str(), "consolidation: drain called off (a move did not finish in time, or consolidation was turned off)");
                }
                _ => {
                    info!(capacity_pod = %name, "consolidation: GPU emptied; released after the empty grace")
                }
            }
            self.metrics.drain(&self.pool.name, label);
            result = Some((name, label));
        }
        let (draining, shared): (Vec<String>, Vec<String>) = {
            let idx = self.index();
            let draining = idx.draining().map(|g| g.name.clone()).collect();
            let shared = idx.shared().map(|g| g.name.clone()).collect();
            (draining, shared)
        };
        self.link.draining.set(&self.pool.name, draining);
        self.link.shared.set(&self.pool.name, shared);
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
