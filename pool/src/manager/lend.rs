//! The leader's half of lending a sleeping pod's room (`lendSleepers`). The leader watches tenant pods, so it marks
//! each reservation whose pod is asleep on its capacity pod ([`crate::state::Reservation::asleep_since`]; cleared
//! when the pod is awake again): that is what a webhook replica, which watches capacity pods only, lends from. A
//! webhook replica records a loan on the capacity pod ([`crate::state::Reservation::evicted_at`], in the same
//! resourceVersion-guarded write that adds the newcomer), and the leader carries it out here:
//!
//! 1. it takes the GPU's start-up Lease (`tessera-startup-<uuid>`, the one every tenant's sidecar takes before its
//!    vLLM may start), so the newcomer's vLLM waits while the sleeper still holds memory there;
//! 2. it deletes the sleeper's pod (uid precondition): the activator never asks a terminating pod to wake, and the
//!    pod's ReplicaSet or the model's next round decides where it starts again (cold);
//! 3. once the pod is gone its reservation goes (the tenant watch, or here for a pod already gone), and the Lease
//!    is released, so the newcomer starts at its sidecar's next read.
//!
//! The Lease is held for [`LEASE_SECS`] and renewed at every pass while the pod exists: a leader that dies
//! mid-way leaves a Lease that expires, and a sidecar waits at most its `--gate-max-wait` anyway (fail open).

use std::collections::HashMap;

use kube::api::{DeleteParams, PostParams, Preconditions};
use tessera_core::lease::{LeaseDecision, LeaseObservation, decide};
use tessera_runtime::kube_client::{give_up_lease, hold_lease, lease_facts, new_lease};
use tracing::{debug, info, warn};

use super::{PoolManager, is_status};
use crate::PoolError;

/// How long the leader's hold on a GPU's start-up Lease lives without a renewal.
pub(super) const LEASE_SECS: i32 = 60;

/// The holder the leader writes while a sleeper on the GPU is being evicted (shown on `/ui` and by
/// `kubectl describe lease`).
fn holder(pod: &str) -> String {
    format!("tessera-pool/evicting/{pod}")
}

/// Start-up Leases the leader holds, by GPU UUID: the holder it wrote, and what it last read of each Lease it
/// follows (expiry is judged on this clock, `core::lease`).
#[derive(Debug, Default)]
pub(super) struct Held {
    holding: HashMap<String, String>,
    seen: HashMap<String, LeaseObservation>,
}

impl PoolManager {
    /// One lending pass: the sleep marks, then the loans. Returns how many sleeper pods it deleted.
    pub(super) async fn lending_pass(&self, now: u64) -> Result<usize, PoolError> {
        self.mark_sleepers(now).await?;
        self.evict_lent(now).await
    }

    /// Writes the sleep marks that differ from the pods (`PoolIndex::sleep_marks`); a capacity pod written
    /// meanwhile (409) is re-read and marked at the next pass.
    async fn mark_sleepers(&self, now: u64) -> Result<(), PoolError> {
        let marks = self.index().sleep_marks(now);
        for (name, rv, list) in marks {
            let empty_since = self.index().capacity_pod(&name).and_then(|g| g.empty_since);
            let patch = crate::state::reservations_patch(&list, rv.as_deref(), empty_since, now);
            match self.patch_capacity(&name, &patch).await {
                Ok(()) => debug!(capacity_pod = %name, "sleep marks written"),
                Err(e) if is_status(&e, 409) || is_status(&e, 404) => self.refresh(&name).await?,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Carries out every loan the index records (see the module): returns how many sleeper pods it deleted.
    pub(super) async fn evict_lent(&self, now: u64) -> Result<usize, PoolError> {
        let lent = self.index().lent();
        let mut deleted = 0;
        let mut still: HashMap<String, String> = HashMap::new();
        for l in lent {
            let Some(tenant) = l.pod else {
                // Its pod is gone: the room is the newcomer's alone.
                self.remove_reservations(&l.capacity_pod, std::slice::from_ref(&l.reservation), now)
                    .await?;
                continue;
            };
            let key = &tenant.key;
            if let Some(uuid) = &l.gpu_uuid {
                still.insert(uuid.clone(), holder(key));
                self.hold_lease(uuid, &holder(key), now).await;
            }
            if tenant.terminating {
                continue;
            }
            let Some((ns, name)) = key.split_once('/') else {
                continue;
            };
            let api: kube::Api<k8s_openapi::api::core::v1::Pod> =
                kube::Api::namespaced(self.pods.clone().into_client(), ns);
            let dp = DeleteParams::default().preconditions(Preconditions {
                uid: tenant.uid.clone(),
                resource_version: None,
            });
            match api.delete(name, &dp).await {
                Ok(_) => {
                    deleted += 1;
                    self.metrics.reservation(&self.pool.name, "sleeper_evicted");
                    info!(pod = %key, capacity_pod = %l.capacity_pod, reservation = %l.reservation,
                          "deleted a sleeping pod whose room was lent (its next start is cold)");
                }
                // Gone already, or another pod now has the name: the tenant watch frees the reservation.
                Err(e) if is_status(&e, 404) || is_status(&e, 409) => {}
                Err(e) => {
                    warn!(pod = %key, error = %e, "could not delete a sleeping pod whose room was lent (the autoscaler needs delete on pods: gpuPools.lendSleepers); its newcomer waits on the GPU's start-up Lease");
                    return Err(e.into());
                }
            }
        }
        self.release_leases(&still).await;
        Ok(deleted)
    }

    /// Takes (or renews) GPU `uuid`'s start-up Lease as `me`, unless a tenant that is starting holds a live one
    /// (then the newcomer's own start waits for the sleeper's memory in vLLM's check, and the eviction proceeds).
    async fn hold_lease(&self, uuid: &str, me: &str, now: u64) {
        let name = tessera_core::gate::lease_name(uuid);
        let now_ms = now.saturating_mul(1000);
        let current = match self.leases.get_opt(&name).await {
            Ok(l) => l,
            Err(e) => {
                warn!(lease = %name, error = %e, "cannot read the GPU's start-up Lease");
                return;
            }
        };
        let observed = current.as_ref().map(|l| {
            let (holder, duration, rv) = lease_facts(l, std::time::Duration::from_secs(1));
            let previous = self.held().seen.get(uuid).cloned();
            LeaseObservation::observe(previous.as_ref(), holder, duration, rv, now_ms)
        });
        if let Some(o) = &observed {
            self.held().seen.insert(uuid.to_owned(), o.clone());
        }
        let result = match (decide(observed.as_ref(), me, now_ms), current) {
            (LeaseDecision::Create, _) => self
                .leases
                .create(&PostParams::default(), &new_lease(&name, me, LEASE_SECS, now_ms))
                .await
                .map(|_| ()),
            (LeaseDecision::Acquire | LeaseDecision::Renew, Some(mut lease)) => {
                hold_lease(&mut lease, me, LEASE_SECS, now_ms);
                self.leases
                    .replace(&name, &PostParams::default(), &lease)
                    .await
                    .map(|_| ())
            }
            (LeaseDecision::Follow { holder, .. }, _) => {
                debug!(lease = %name, %holder, "a tenant is starting on the GPU; the eviction goes on without the Lease");
                return;
            }
            _ => return,
        };
        match result {
            Ok(()) => {
                self.held().holding.insert(uuid.to_owned(), me.to_owned());
            }
            // Someone wrote first: the next pass reads again.
            Err(e) if is_status(&e, 409) => {}
            Err(e) => {
                warn!(lease = %name, error = %e, "cannot hold the GPU's start-up Lease (the autoscaler needs get/create/update on leases in the pool namespace)")
            }
        }
    }

    /// Releases every Lease held for an eviction that is over (the GPU is not in `still`, or another pod now).
    async fn release_leases(&self, still: &HashMap<String, String>) {
        let done: Vec<(String, String)> = self
            .held()
            .holding
            .iter()
            .filter(|(uuid, me)| still.get(*uuid) != Some(*me))
            .map(|(u, m)| (u.clone(), m.clone()))
            .collect();
        for (uuid, me) in done {
            let name = tessera_core::gate::lease_name(&uuid);
            match self.leases.get_opt(&name).await {
                Ok(Some(mut lease)) => {
                    // Cleared holder + 1 s: the waiting sidecar takes it at its next read (as a sidecar releases).
                    if give_up_lease(&mut lease, &me) {
                        if let Err(e) = self.leases.replace(&name, &PostParams::default(), &lease).await {
                            // Kept in `holding`: the next pass tries again; the Lease expires meanwhile anyway.
                            warn!(lease = %name, error = %e, "cannot release the GPU's start-up Lease");
                            continue;
                        }
                        info!(lease = %name, "the evicted sleeper is gone: released the GPU's start-up Lease");
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    warn!(lease = %name, error = %e, "cannot read the GPU's start-up Lease");
                    continue;
                }
            }
            let mut held = self.held();
            held.holding.remove(&uuid);
            held.seen.remove(&uuid);
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.lending.lock().unwrap_or_else(|e| e.into_inner())
    }
}
