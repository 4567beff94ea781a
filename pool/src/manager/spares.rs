//! Spare capacity pods: how a pool grows without the webhook creating pods.
//!
//! The leader keeps `spareCapacityPods` capacity pods gated by [`crate::SPARE_GATE`] (`spec.schedulingGates`): no
//! node, no GPU, and no cluster-autoscaler scale-up while gated, so a spare costs nothing. A replica that fits on no
//! GPU is booked on a spare by whichever replica admits it (a resourceVersion-guarded patch, like any booking), and
//! the leader lifts that spare's gate at the event that shows the booking — from then on it is an ordinary capacity
//! pod, Pending until a node has a free GPU — and makes the next spare. The network-facing webhook therefore needs
//! no `create` on pods in the privileged capacity namespace (issue 42).

use kube::api::{Patch, PatchParams, PostParams};
use tracing::{info, warn};

use super::{PoolManager, is_status};
use crate::PoolError;
use crate::capacity::spare_capacity_pod;

impl PoolManager {
    /// Lifts the gate of every booked spare (within `maxGpus`) and creates spares up to `spareCapacityPods`.
    /// Returns how many gates it lifted.
    pub(super) async fn tend_spares(&self) -> Result<usize, PoolError> {
        let max = self.pool.max_gpus as usize;
        let open = self.index().spares_to_open(max);
        let mut opened = 0;
        for name in open {
            // Removing a scheduling gate is the one change a pod's spec allows here (the API server refuses adding
            // one); the merge patch drops the list.
            let patch = serde_json::json!({"spec": {"schedulingGates": null}});
            match self
                .pods
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(pod) => {
                    self.index().apply_capacity(&pod);
                    opened += 1;
                    self.metrics.reservation(&self.pool.name, "spare_opened");
                    info!(capacity_pod = %name, "a reservation was booked on a spare: its gate is lifted (the GPU is requested)");
                }
                Err(e) if is_status(&e, 404) || is_status(&e, 409) => self.refresh(&name).await?,
                Err(e) => return Err(e.into()),
            }
        }
        let create = self
            .index()
            .spares_to_create(max, self.pool.spare_capacity_pods as usize);
        for name in create {
            let pod = spare_capacity_pod(&self.cfg, &self.pool, &name);
            match self.pods.create(&PostParams::default(), &pod).await {
                Ok(pod) => {
                    self.index().apply_capacity(&pod);
                    info!(capacity_pod = %name, "spare capacity pod ready (gated: no GPU until a reservation is booked on it)");
                }
                // The name is taken (a pod still terminating, or one the index has not seen yet): next pass.
                Err(e) if is_status(&e, 409) => self.refresh(&name).await?,
                Err(e) => {
                    warn!(capacity_pod = %name, error = %e, "cannot create a spare capacity pod; replicas that need a new GPU are admitted with a whole one until it exists");
                    return Err(e.into());
                }
            }
        }
        Ok(opened)
    }

    /// Whether [`PoolManager::tend_spares`] has anything to do (the run loop calls it at once when so).
    pub(super) fn spares_need_tending(&self) -> bool {
        let max = self.pool.max_gpus as usize;
        let idx = self.index();
        !idx.spares_to_open(max).is_empty()
            || !idx
                .spares_to_create(max, self.pool.spare_capacity_pods as usize)
                .is_empty()
    }
}
