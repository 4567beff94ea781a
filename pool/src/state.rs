//! The pool's state as the cluster holds it, and every pool decision, with no I/O.
//!
//! The source of truth is the capacity pods: each carries its reservations as a JSON annotation. Tenant pods
//! carry the id of their reservation. [`PoolIndex`] is rebuilt from watch events (`apply` / `delete` /
//! `reset`, as a reflector would feed it) and from the answers to our own writes; decisions read it and
//! return what to write. Time is a parameter (Unix seconds) so tests need no clock.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Pod;
use tessera_core::pack::{EmptyGpu, GPU_COMPUTE_MILLI, GpuId, GpuShape, Packer, ReplicaRequest, empty_gpu};

use super::{
    ANNOTATION_CAPACITY_POD, ANNOTATION_DRAINING_SINCE, ANNOTATION_EMPTY_SINCE, ANNOTATION_GPU_UUID,
    ANNOTATION_RESERVATION, ANNOTATION_RESERVATIONS, KARPENTER_DO_NOT_DISRUPT, LABEL_CAPACITY_POD,
    LABEL_POOL, SPARE_GATE,
};

/// One reservation: a share of a GPU promised to a pod being admitted.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reservation {
    /// Unique id chosen by the caller (the webhook uses the admission request UID, so a retried admission
    /// finds its own reservation instead of taking a second one).
    pub id: String,
    /// The model served (replicas of one model are spread over GPUs).
    pub model: String,
    /// Compute share, milli-GPUs.
    pub compute_milli: u32,
    /// GPU memory, MiB.
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// Placement priority.
    #[serde(default)]
    pub priority: i32,
    /// When it was made (Unix seconds); a reservation with no pod expires `reservationTtl` after this.
    pub created_at: u64,
    /// `namespace/name` of the pod, when known at admission (pods using generateName have no name yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// Lent (Unix seconds): its pod was asleep and a new reservation took its room rather than open a GPU
    /// (`tessera_core::pack::sleeping`). It holds nothing in the packer; the leader's pool manager deletes its pod
    /// and holds the GPU's start-up Lease until that pod is gone, so the newcomer's vLLM starts only then and the
    /// sleeper never wakes into room that is no longer its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evicted_at: Option<u64>,
    /// Asleep since (Unix seconds): the leader's pool manager marks it from its pod ([`Tenant::asleep`]) and
    /// clears it once the pod is awake, so every webhook replica, which watches capacity pods only, knows whose
    /// room may be lent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asleep_since: Option<u64>,
}

impl Reservation {
    fn request(&self) -> ReplicaRequest {
        ReplicaRequest {
            id: self.id.clone(),
            model: self.model.clone(),
            compute_milli: self.compute_milli,
            memory_mib: self.memory_mib,
            priority: self.priority,
        }
    }
}

/// The annotation document.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct ReservationDoc {
    version: u32,
    reservations: Vec<Reservation>,
}

/// Serialises reservations for the `tessera.dev/reservations` annotation.
pub fn encode_reservations(list: &[Reservation]) -> String {
    let doc = ReservationDoc {
        version: 1,
        reservations: list.to_vec(),
    };
    serde_json::to_string(&doc).unwrap_or_else(|_| String::from("{\"version\":1,\"reservations\":[]}"))
}

/// Parses the annotation; a missing annotation is no reservations.
pub fn decode_reservations(annotation: Option<&str>) -> Result<Vec<Reservation>, String> {
    let Some(s) = annotation else {
        return Ok(Vec::new());
    };
    let doc: ReservationDoc = serde_json::from_str(s).map_err(|e| e.to_string())?;
    if doc.version != 1 {
        return Err(format!(
            "unsupported reservations version {} (this tessera reads version 1)",
            doc.version
        ));
    }
    Ok(doc.reservations)
}

/// A capacity pod, as the pool manager sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapacityGpu {
    /// Pod name.
    pub name: String,
    /// The node it runs on, once scheduled.
    pub node: Option<String>,
    /// The GPU UUID the gpu-agent published, once running.
    pub gpu_uuid: Option<String>,
    /// The pod's `resourceVersion`: every write carries it, so a concurrent write makes ours fail with 409.
    pub resource_version: Option<String>,
    /// Its reservations, or why the annotation could not be read (such a GPU is never placed on, never
    /// deleted: what it holds is unknown, so neither is safe).
    pub reservations: Result<Vec<Reservation>, String>,
    /// Since when it has had no reservation (Unix seconds), as recorded on the pod.
    pub empty_since: Option<u64>,
    /// Since when consolidation has been emptying it (Unix seconds), as recorded on the pod.
    pub draining_since: Option<u64>,
    /// Deleted, failed or finished: not a place for new tenants.
    pub gone: bool,
    /// Failed or Succeeded and not being deleted (evicted, its node lost, its agent crashed for good): it holds no
    /// GPU any more and will never run again, so the manager deletes it and it does not count toward `maxGpus`.
    pub terminated: bool,
    /// Its containers have started (phase `Running`): from then on its gpu-agent is expected to publish the
    /// GPU UUID, and while it has not, new tenants are not placed here (see [`CapacityGpu::unidentified`]).
    pub running: bool,
    /// The pod's IP, once it has one: where its gpu-agent's `/v1/gpus` is read for the `/ui` page.
    pub pod_ip: Option<String>,
    /// A spare: gated by [`SPARE_GATE`], it holds no GPU yet. Not a place for ordinary placements; a replica
    /// that fits on no GPU books on it, and the leader lifts the gate.
    pub spare: bool,
}

impl CapacityGpu {
    /// Reads a capacity pod of `pool`; `None` for any other pod.
    pub fn from_pod(pod: &Pod, pool: &str) -> Option<Self> {
        let labels = pod.metadata.labels.as_ref()?;
        if labels.get(LABEL_POOL).map(String::as_str) != Some(pool)
            || labels.get(LABEL_CAPACITY_POD).map(String::as_str) != Some("true")
        {
            return None;
        }
        let ann = pod.metadata.annotations.clone().unwrap_or_default();
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
        Some(Self {
            name: pod.metadata.name.clone()?,
            node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            gpu_uuid: ann.get(ANNOTATION_GPU_UUID).cloned(),
            resource_version: pod.metadata.resource_version.clone(),
            reservations: decode_reservations(ann.get(ANNOTATION_RESERVATIONS).map(String::as_str)),
            empty_since: ann.get(ANNOTATION_EMPTY_SINCE).and_then(|v| v.parse().ok()),
            draining_since: ann.get(ANNOTATION_DRAINING_SINCE).and_then(|v| v.parse().ok()),
            gone: pod.metadata.deletion_timestamp.is_some()
                || matches!(phase.as_deref(), Some("Failed") | Some("Succeeded")),
            terminated: pod.metadata.deletion_timestamp.is_none()
                && matches!(phase.as_deref(), Some("Failed") | Some("Succeeded")),
            running: phase.as_deref() == Some("Running"),
            pod_ip: pod.status.as_ref().and_then(|s| s.pod_ip.clone()),
            spare: pod
                .spec
                .as_ref()
                .and_then(|s| s.scheduling_gates.as_ref())
                .is_some_and(|g| g.iter().any(|g| g.name == SPARE_GATE)),
        })
    }

    /// Running, yet no GPU UUID published: its gpu-agent cannot tell which device it holds (no NVML, several
    /// GPUs visible) or has not written it yet (the first second or so). New tenants are not placed on it in
    /// any sharing mode: the webhook points a tenant at its GPU with `NVIDIA_VISIBLE_DEVICES=<uuid>`, and
    /// without it a CUDA image's default (`all`) would run the tenant on whatever GPU 0 of the node is. A
    /// Pending capacity pod is different: no agent has run yet, it is where a new GPU is coming from, and
    /// it is placed on as usual (its UUID follows once it runs). The agent's `/ready` says the same thing.
    pub fn unidentified(&self) -> bool {
        self.running && self.gpu_uuid.is_none()
    }

    /// Reservations, or none when unreadable.
    pub fn reservation_list(&self) -> &[Reservation] {
        self.reservations.as_deref().unwrap_or(&[])
    }
}

/// A pod holding a share, as the pool manager sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    /// `namespace/name`.
    pub key: String,
    /// Its reservation id (`tessera.dev/reservation`).
    pub reservation: String,
    /// Its capacity pod (`tessera.dev/capacity-pod`).
    pub capacity_pod: String,
    /// Its `metadata.uid`: what the gpu-agent reports its GPU use by.
    pub uid: Option<String>,
    /// Whether consolidation may move it: a ReplicaSet's pod (the controller can surge its Deployment and pick
    /// this pod to go with `pod-deletion-cost`), Ready, and not being deleted.
    pub movable: bool,
    /// Asleep: the controller told it to sleep (`tessera.dev/rest`) and it is not Ready (a sleeping vLLM fails
    /// its readiness), nor being deleted. Only such a pod's room may be lent ([`PoolIndex::decide`]).
    pub asleep: bool,
    /// Asleep and let go by its model's controller (`tessera_core::sleep::evict`): its pod is on its way out.
    pub evicted: bool,
    /// Being deleted.
    pub terminating: bool,
}

impl Tenant {
    /// Reads a tenant pod of `pool` (labelled `tessera.dev/pool`, not a capacity pod, annotated with its
    /// reservation); `None` for any other pod.
    pub fn from_pod(pod: &Pod, pool: &str) -> Option<Self> {
        let labels = pod.metadata.labels.as_ref()?;
        if labels.get(LABEL_POOL).map(String::as_str) != Some(pool) || labels.contains_key(LABEL_CAPACITY_POD)
        {
            return None;
        }
        let ann = pod.metadata.annotations.as_ref()?;
        let instruction = ann
            .get(tessera_core::sleep::command::ANNOTATION)
            .and_then(|v| v.parse::<tessera_core::sleep::command::RestCommand>().ok());
        let replica_set = pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.controller == Some(true) && o.kind == "ReplicaSet");
        Some(Self {
            key: pod_key(pod)?,
            reservation: ann.get(ANNOTATION_RESERVATION)?.clone(),
            capacity_pod: ann.get(ANNOTATION_CAPACITY_POD)?.clone(),
            uid: pod.metadata.uid.clone(),
            movable: replica_set
                && tessera_runtime::pod::ready(pod)
                && pod.metadata.deletion_timestamp.is_none(),
            asleep: instruction.is_some()
                && !tessera_runtime::pod::ready(pod)
                && pod.metadata.deletion_timestamp.is_none(),
            evicted: tessera_core::sleep::evict::let_go(
                instruction.as_ref(),
                ann.get(tessera_core::sleep::evict::ANNOTATION)
                    .and_then(|v| v.parse().ok())
                    .as_ref(),
            ),
            terminating: pod.metadata.deletion_timestamp.is_some(),
        })
    }
}

/// `namespace/name` of a pod.
pub fn pod_key(pod: &Pod) -> Option<String> {
    Some(format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref()?
    ))
}

/// The pool as last seen: capacity pods by name, tenants by `namespace/name`.
#[derive(Debug, Clone, Default)]
pub struct PoolIndex {
    pool: String,
    capacity: BTreeMap<String, CapacityGpu>,
    tenants: HashMap<String, Tenant>,
}

/// The packer reason of a placement that took sleeping pods' room.
pub const LENT_BY_SLEEPERS: &str = "LentBySleepers";
/// The reason of a placement on a spare capacity pod (no GPU had room; the leader opens it).
pub const BOOKED_SPARE: &str = "BookedSpare";

/// A lent reservation ([`Reservation::evicted_at`]) and what the leader must still do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lent {
    /// The capacity pod it is on.
    pub capacity_pod: String,
    /// That GPU's UUID (names its start-up Lease), once published.
    pub gpu_uuid: Option<String>,
    /// The reservation id.
    pub reservation: String,
    /// Its pod while it exists; `None` once gone: the reservation is dropped.
    pub pod: Option<Tenant>,
}

/// The placement decision of [`PoolIndex::decide`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// A reservation with this id already exists (a retried admission): return it.
    Existing {
        /// The capacity pod holding it.
        capacity_pod: String,
    },
    /// Add the reservation to this capacity pod (whose reservations and resourceVersion are given).
    Place {
        /// The capacity pod.
        capacity_pod: String,
        /// Its `resourceVersion` to write against.
        resource_version: Option<String>,
        /// Its reservations with the new one appended.
        reservations: Vec<Reservation>,
        /// The packer's reason.
        reason: &'static str,
        /// It was being drained and nothing else had room: the write also ends the drain.
        ends_drain: bool,
        /// Reservations of sleeping pods on this GPU whose room it takes (marked lent in `reservations`): the
        /// alternative was opening a GPU. Empty for an ordinary placement.
        evicts: Vec<String>,
    },
    /// No capacity pod has room.
    NoRoom {
        /// The packer's explanation.
        reason: String,
        /// Capacity pods held (to compare with `maxGpus`).
        gpus: usize,
    },
}

impl Decision {
    /// Add `new` to capacity pod `cap` (whose reservations are `kept`, as they are to be written): the write the
    /// caller guards with `cap`'s resourceVersion.
    fn place_on(
        cap: &CapacityGpu,
        kept: Vec<Reservation>,
        new: &Reservation,
        reason: &'static str,
        ends_drain: bool,
        evicts: Vec<String>,
    ) -> Decision {
        let mut reservations = kept;
        reservations.push(new.clone());
        Decision::Place {
            capacity_pod: cap.name.clone(),
            resource_version: cap.resource_version.clone(),
            reservations,
            reason,
            ends_drain,
            evicts,
        }
    }
}

impl PoolIndex {
    /// An empty index for `pool`.
    pub fn new(pool: impl Into<String>) -> Self {
        Self {
            pool: pool.into(),
            ..Self::default()
        }
    }

    /// A capacity pod was added or changed (ignored if it is not one of this pool's).
    pub fn apply_capacity(&mut self, pod: &Pod) {
        if let Some(gpu) = CapacityGpu::from_pod(pod, &self.pool) {
            self.capacity.insert(gpu.name.clone(), gpu);
        }
    }

    /// A capacity pod is gone.
    pub fn delete_capacity(&mut self, name: &str) {
        self.capacity.remove(name);
    }

    /// The full list of capacity pods (a relist).
    pub fn reset_capacity<'a>(&mut self, pods: impl IntoIterator<Item = &'a Pod>) {
        self.capacity.clear();
        for p in pods {
            self.apply_capacity(p);
        }
    }

    /// A tenant pod was added or changed.
    pub fn apply_tenant(&mut self, pod: &Pod) {
        if let Some(t) = Tenant::from_pod(pod, &self.pool) {
            self.tenants.insert(t.key.clone(), t);
        }
    }

    /// A tenant pod is gone; returns it so its reservation can be released.
    pub fn delete_tenant(&mut self, key: &str) -> Option<Tenant> {
        self.tenants.remove(key)
    }

    /// The full list of tenant pods (a relist).
    pub fn reset_tenants<'a>(&mut self, pods: impl IntoIterator<Item = &'a Pod>) {
        self.tenants.clear();
        for p in pods {
            self.apply_tenant(p);
        }
    }

    /// The capacity pods.
    pub fn capacity(&self) -> impl Iterator<Item = &CapacityGpu> {
        self.capacity.values()
    }

    /// One capacity pod.
    pub fn capacity_pod(&self, name: &str) -> Option<&CapacityGpu> {
        self.capacity.get(name)
    }

    /// The tenants.
    pub fn tenants(&self) -> impl Iterator<Item = &Tenant> {
        self.tenants.values()
    }

    /// Where a reservation is.
    pub fn find_reservation(&self, id: &str) -> Option<(&CapacityGpu, &Reservation)> {
        self.capacity
            .values()
            .find_map(|g| g.reservation_list().iter().find(|r| r.id == id).map(|r| (g, r)))
    }

    /// A packer holding every readable, live capacity pod and its reservations, plus the map from the
    /// packer's GPU ids to capacity pod names. Reservations that would overflow a GPU (which concurrency
    /// control should make impossible) are left out of the packer *and* the GPU is marked full, so an
    /// inconsistency can never lead to more booking. A lent reservation ([`Reservation::evicted_at`]) holds
    /// nothing: its room went to the reservation that took it.
    pub fn packer(&self, shape: &GpuShape) -> (Packer, HashMap<GpuId, String>) {
        let (packer, names, _) = self.packer_lending(shape, false);
        (packer, names)
    }

    /// [`PoolIndex::packer`], and with `lend` the reservations of sleeping pods ([`Reservation::asleep_since`])
    /// left out of the packer and returned beside it, each with its GPU: the `sleeping` argument of
    /// [`Packer::place_beside_sleeping`].
    fn packer_lending(
        &self,
        shape: &GpuShape,
        lend: bool,
    ) -> (Packer, HashMap<GpuId, String>, Vec<(GpuId, ReplicaRequest)>) {
        let mut packer = Packer::new(*shape);
        let mut names = HashMap::new();
        let mut sleeping = Vec::new();
        for g in self.capacity.values() {
            let Ok(list) = &g.reservations else { continue };
            if g.gone || g.unidentified() || g.spare {
                continue;
            }
            let id = packer.add_gpu();
            names.insert(id, g.name.clone());
            packer.set_draining(id, g.draining_since);
            let mut consistent = true;
            for r in list.iter().filter(|r| r.evicted_at.is_none()) {
                if lend && r.asleep_since.is_some() {
                    sleeping.push((id, r.request()));
                } else if packer.assign(id, r.request()).is_err() {
                    consistent = false;
                }
            }
            if !consistent {
                tracing::warn!(capacity_pod = %g.name, "reservations overflow the GPU or repeat an id; treating it as full");
                // One filler takes all the free memory (and what compute a single request may), so nothing
                // fits even where the pool oversubscribes compute beyond one request's largest share.
                let (free_c, free_m) = packer
                    .gpu(id)
                    .map_or((0, 0), |s| (s.free_compute_milli(), s.free_memory_mib(shape)));
                let fill = ReplicaRequest::new(
                    format!("{}/overflow", g.name),
                    "",
                    free_c.clamp(1, GPU_COMPUTE_MILLI),
                    free_m,
                );
                let _ = packer.assign(id, fill);
                // Nothing on a GPU in that state is lent either.
                sleeping.retain(|(g, _)| *g != id);
            }
        }
        (packer, names, sleeping)
    }

    /// Capacity pods being drained.
    pub fn draining(&self) -> impl Iterator<Item = &CapacityGpu> {
        self.capacity.values().filter(|g| g.draining_since.is_some())
    }

    /// The capacity pods holding more than one reservation (tenants that share the GPU).
    pub fn shared(&self) -> impl Iterator<Item = &CapacityGpu> {
        self.capacity
            .values()
            .filter(|g| !g.gone && g.reservation_list().len() > 1)
    }

    /// Decides where a new reservation goes. Pure: the caller writes the result with optimistic concurrency.
    ///
    /// With `lend_sleepers`, a reservation that fits nowhere beside the sleeping pods' shares may take a sleeping
    /// pod's room rather than open a GPU — the simulator's rule, [`Packer::place_beside_sleeping`]: the
    /// sleepers that no longer fit on that GPU are marked lent ([`Decision::Place::evicts`]), smallest shares
    /// kept first so the fewest lose their place.
    pub fn decide(
        &self,
        shape: &GpuShape,
        new: &Reservation,
        lend_sleepers: bool,
        max_gpus: usize,
    ) -> Result<Decision, tessera_core::pack::PackError> {
        if let Some((g, _)) = self.find_reservation(&new.id) {
            return Ok(Decision::Existing {
                capacity_pod: g.name.clone(),
            });
        }
        let (mut packer, names) = self.packer(shape);
        match packer.place(new.request())? {
            tessera_core::pack::Placement::Gpu { gpu, reason } => {
                let Some(name) = names.get(&gpu) else {
                    return Ok(Decision::NoRoom {
                        reason: "internal: unknown GPU".into(),
                        gpus: names.len(),
                    });
                };
                let cap = &self.capacity[name];
                Ok(Decision::place_on(
                    cap,
                    cap.reservation_list().to_vec(),
                    new,
                    reason.as_str(),
                    reason == tessera_core::pack::PlaceReason::Draining,
                    Vec::new(),
                ))
            }
            tessera_core::pack::Placement::NoRoom(why) => {
                if lend_sleepers && let Some(lent) = self.lend(shape, new) {
                    return Ok(lent);
                }
                if let Some(spare) = self.book_spare(shape, new, max_gpus) {
                    return Ok(spare);
                }
                let unidentified = self.capacity.values().filter(|g| g.unidentified()).count();
                let mut reason = why.to_string();
                if unidentified > 0 {
                    reason.push_str(&format!(
                        "; {unidentified} running capacity pod(s) have no published GPU UUID and were skipped (see their gpu-agent's /ready)"
                    ));
                }
                // Below maxGpus a spare would have taken it: none was ready (the leader makes them).
                if self.gpus_held() < max_gpus && !self.capacity.values().any(|g| g.spare && !g.gone) {
                    reason.push_str(
                        "; no spare capacity pod is ready (the leader makes one; spareCapacityPods)",
                    );
                }
                Ok(Decision::NoRoom {
                    reason,
                    gpus: self.gpus_held(),
                })
            }
        }
    }

    /// Capacity pods that hold or will hold a GPU: every one not terminated and not a spare. `maxGpus` bounds this.
    pub fn gpus_held(&self) -> usize {
        self.capacity
            .values()
            .filter(|g| !g.terminated && !g.spare)
            .count()
    }

    /// The booking of `new` on a spare (the lowest-named one it fits on, beside what others booked there first),
    /// where no GPU has room and the pool may grow; `None` otherwise.
    fn book_spare(&self, shape: &GpuShape, new: &Reservation, max_gpus: usize) -> Option<Decision> {
        if self.gpus_held() >= max_gpus {
            return None;
        }
        self.capacity
            .values()
            .filter(|g| g.spare && !g.gone)
            .find_map(|g| {
                let list = g.reservations.as_ref().ok()?;
                let mut packer = Packer::new(*shape);
                let id = packer.add_gpu();
                for r in list {
                    packer.assign(id, r.request()).ok()?;
                }
                packer.assign(id, new.request()).ok()?;
                Some(Decision::place_on(
                    g,
                    list.clone(),
                    new,
                    BOOKED_SPARE,
                    false,
                    Vec::new(),
                ))
            })
    }

    /// Spares with a booking, whose gate the leader lifts (the pool stays within `max_gpus`: a booked spare past it
    /// keeps its gate, and its booking lapses by the TTL).
    pub fn spares_to_open(&self, max_gpus: usize) -> Vec<String> {
        let room = max_gpus.saturating_sub(self.gpus_held());
        self.capacity
            .values()
            .filter(|g| g.spare && !g.gone && !g.reservation_list().is_empty())
            .take(room)
            .map(|g| g.name.clone())
            .collect()
    }

    /// Names for the spares to create so that `wanted` are ready, or as many as `max_gpus` leaves room for: the
    /// lowest free slots (a terminating pod still holds its name).
    pub fn spares_to_create(&self, max_gpus: usize, wanted: usize) -> Vec<String> {
        let ready = self
            .capacity
            .values()
            .filter(|g| g.spare && !g.gone && g.reservation_list().is_empty())
            .count();
        let want = wanted.min(max_gpus.saturating_sub(self.gpus_held()));
        (0..)
            .map(|n| capacity_pod_name(&self.pool, n))
            .filter(|name| !self.capacity.contains_key(name))
            .take(want.saturating_sub(ready))
            .collect()
    }

    /// The placement that takes sleeping pods' room, or `None` where even their room does not hold `new` (a GPU
    /// must open) or nothing sleeps.
    fn lend(&self, shape: &GpuShape, new: &Reservation) -> Option<Decision> {
        let (mut packer, names, sleeping) = self.packer_lending(shape, true);
        if sleeping.is_empty() {
            return None;
        }
        let gpu = packer
            .place_beside_sleeping(new.request(), sleeping.clone())
            .ok()?;
        // A GPU the packer opened has no capacity pod: the caller creates one as without lending.
        let name = names.get(&gpu)?;
        let mut here: Vec<&ReplicaRequest> = sleeping
            .iter()
            .filter(|(g, _)| *g == gpu)
            .map(|(_, r)| r)
            .collect();
        here.sort_by(|a, b| a.memory_mib.cmp(&b.memory_mib).then_with(|| a.id.cmp(&b.id)));
        let evicts: Vec<String> = here
            .into_iter()
            .filter(|r| packer.assign(gpu, (*r).clone()).is_err())
            .map(|r| r.id.clone())
            .collect();
        if evicts.is_empty() {
            // It fit with every sleeper held after all: an ordinary placement would have found it.
            return None;
        }
        let cap = &self.capacity[name];
        let kept = cap
            .reservation_list()
            .iter()
            .map(|r| {
                let mut r = r.clone();
                if evicts.contains(&r.id) {
                    r.evicted_at = Some(new.created_at);
                }
                r
            })
            .collect();
        Some(Decision::place_on(
            cap,
            kept,
            new,
            LENT_BY_SLEEPERS,
            cap.draining_since.is_some(),
            evicts,
        ))
    }

    /// The capacity pods whose reservations' sleep marks ([`Reservation::asleep_since`]) differ from their pods
    /// (asleep, or awake again), each with its resourceVersion and the list to write; the leader writes them.
    pub fn sleep_marks(&self, now: u64) -> Vec<(String, Option<String>, Vec<Reservation>)> {
        let tenant_of = self.tenant_by_reservation();
        let mut out = Vec::new();
        for g in self.capacity.values().filter(|g| !g.gone) {
            let Ok(list) = &g.reservations else { continue };
            let mut changed = false;
            let next: Vec<Reservation> = list
                .iter()
                .map(|r| {
                    let mut r = r.clone();
                    // A reservation whose pod has not appeared yet (or is gone) is not asleep.
                    let want =
                        r.evicted_at.is_none() && tenant_of.get(r.id.as_str()).is_some_and(|t| t.asleep);
                    if want != r.asleep_since.is_some() {
                        r.asleep_since = want.then_some(now);
                        changed = true;
                    }
                    r
                })
                .collect();
            if changed {
                out.push((g.name.clone(), g.resource_version.clone(), next));
            }
        }
        out
    }

    /// Lent reservations still on a capacity pod: the leader deletes each one's pod (if it still has one) and
    /// holds the GPU's start-up Lease meanwhile.
    pub fn lent(&self) -> Vec<Lent> {
        let tenant_of = self.tenant_by_reservation();
        let mut out = Vec::new();
        for g in self.capacity.values() {
            for r in g.reservation_list().iter().filter(|r| r.evicted_at.is_some()) {
                out.push(Lent {
                    capacity_pod: g.name.clone(),
                    gpu_uuid: g.gpu_uuid.clone(),
                    reservation: r.id.clone(),
                    pod: tenant_of.get(r.id.as_str()).map(|t| (*t).clone()),
                });
            }
        }
        out
    }

    /// Each GPU's tenants for the sleeper budget, by capacity pod (spares, gone and unreadable ones left out): one
    /// per reservation, a lent one (leaving) excepted; a reservation whose pod has not appeared counts as awake.
    pub fn gpu_tenants(&self) -> Vec<(String, Vec<crate::sleepers::GpuTenant>)> {
        let tenant_of = self.tenant_by_reservation();
        self.capacity
            .values()
            .filter(|g| !g.gone && !g.spare)
            .filter_map(|g| {
                let list = g.reservations.as_ref().ok()?;
                let tenants = list
                    .iter()
                    .filter(|r| r.evicted_at.is_none())
                    .map(|r| {
                        let t = tenant_of.get(r.id.as_str());
                        crate::sleepers::GpuTenant {
                            pod: t.map(|t| t.key.clone()),
                            asleep: t.is_some_and(|t| t.asleep),
                            evicted: t.is_some_and(|t| t.asleep && t.evicted),
                        }
                    })
                    .collect();
                Some((g.name.clone(), tenants))
            })
            .collect()
    }

    /// Each tenant by its reservation id.
    pub fn tenant_by_reservation(&self) -> HashMap<&str, &Tenant> {
        self.tenants
            .values()
            .map(|t| (t.reservation.as_str(), t))
            .collect()
    }

    /// Capacity pods that failed or completed (evicted, node lost) and are not being deleted yet: to delete.
    pub fn terminated(&self) -> Vec<String> {
        self.capacity
            .values()
            .filter(|g| g.terminated)
            .map(|g| g.name.clone())
            .collect()
    }

    /// Reservations to drop: no tenant pod carries their id, and they are older than `ttl_secs`.
    pub fn expired(&self, now: u64, ttl_secs: u64) -> Vec<(String, Vec<String>)> {
        let bound = self.tenant_by_reservation();
        let mut out = Vec::new();
        for g in self.capacity.values() {
            let ids: Vec<String> = g
                .reservation_list()
                .iter()
                .filter(|r| {
                    !bound.contains_key(r.id.as_str()) && r.created_at.saturating_add(ttl_secs) <= now
                })
                .map(|r| r.id.clone())
                .collect();
            if !ids.is_empty() {
                out.push((g.name.clone(), ids));
            }
        }
        out
    }

    /// Capacity pods to mark empty (no reservation, no `empty-since` yet) and to delete (empty for at least
    /// `grace_secs`). Unreadable ones are neither: what they hold is unknown.
    pub fn empty_gpus(&self, now: u64, grace_secs: u64) -> (Vec<String>, Vec<String>) {
        let mut mark = Vec::new();
        let mut delete = Vec::new();
        let secs = std::time::Duration::from_secs;
        // A spare is empty by design: it holds no GPU, so there is nothing to give back.
        for g in self.capacity.values().filter(|g| !g.spare) {
            if g.reservations.as_ref().is_ok_and(|list| list.is_empty()) {
                // The simulator gives its GPUs back by the same rule.
                match empty_gpu(g.empty_since.map(secs), secs(now), secs(grace_secs)) {
                    EmptyGpu::Mark => mark.push(g.name.clone()),
                    EmptyGpu::Release => delete.push(g.name.clone()),
                    EmptyGpu::Keep => {}
                }
            }
        }
        (mark, delete)
    }
}

/// The capacity pod name of slot `n` of `pool`. Names are slots, not random: two webhook replicas that both
/// find no room create the *same* name, so one create wins and the other gets 409 AlreadyExists, re-reads,
/// and books on the pod the winner made. That keeps a pool within `maxGpus` under any number of concurrent
/// admissions, and a retried creation can never make a second GPU.
pub fn capacity_pod_name(pool: &str, slot: usize) -> String {
    format!("tessera-gpu-{pool}-{slot}")
}

/// The merge patch that marks a capacity pod as draining since `since` (`Some`) or clears the mark (`None`), guarded
/// by `resource_version` so a reservation written meanwhile makes it fail (409) and the decision is taken again.
pub fn draining_patch(since: Option<u64>, resource_version: Option<&str>) -> serde_json::Value {
    let value = since.map_or(serde_json::Value::Null, |t| {
        serde_json::Value::String(t.to_string())
    });
    let mut meta = serde_json::json!({ "annotations": { ANNOTATION_DRAINING_SINCE: value } });
    if let Some(rv) = resource_version {
        meta["resourceVersion"] = serde_json::Value::String(rv.to_string());
    }
    serde_json::json!({ "metadata": meta })
}

/// The merge patch that sets a capacity pod's reservations, guarded by `resource_version`: the Karpenter
/// `do-not-disrupt` annotation while it has tenants, and `empty-since` from the moment it has none.
pub fn reservations_patch(
    reservations: &[Reservation],
    resource_version: Option<&str>,
    previous_empty_since: Option<u64>,
    now: u64,
) -> serde_json::Value {
    let (dnd, empty) = if reservations.is_empty() {
        (
            serde_json::Value::Null,
            serde_json::Value::String(previous_empty_since.unwrap_or(now).to_string()),
        )
    } else {
        (serde_json::Value::String("true".into()), serde_json::Value::Null)
    };
    let mut meta = serde_json::json!({
        "annotations": {
            ANNOTATION_RESERVATIONS: encode_reservations(reservations),
            KARPENTER_DO_NOT_DISRUPT: dnd,
            ANNOTATION_EMPTY_SINCE: empty,
        }
    });
    if let Some(rv) = resource_version {
        meta["resourceVersion"] = serde_json::Value::String(rv.to_string());
    }
    serde_json::json!({ "metadata": meta })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    pub(crate) fn resv(id: &str, c: u32, at: u64) -> Reservation {
        Reservation {
            id: id.into(),
            model: format!("model-{id}"),
            compute_milli: c,
            memory_mib: 1000,
            priority: 0,
            created_at: at,
            pod: None,
            evicted_at: None,
            asleep_since: None,
        }
    }

    fn cap(name: &str, rs: &[Reservation], empty_since: Option<u64>) -> Pod {
        let mut ann = BTreeMap::new();
        ann.insert(ANNOTATION_RESERVATIONS.to_string(), encode_reservations(rs));
        if let Some(t) = empty_since {
            ann.insert(ANNOTATION_EMPTY_SINCE.to_string(), t.to_string());
        }
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("tessera-system".into()),
                labels: Some(BTreeMap::from([
                    (LABEL_POOL.to_string(), "p".to_string()),
                    (LABEL_CAPACITY_POD.to_string(), "true".to_string()),
                ])),
                annotations: Some(ann),
                resource_version: Some("7".into()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    fn tenant(ns: &str, name: &str, reservation: &str, capacity: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                labels: Some(BTreeMap::from([(LABEL_POOL.to_string(), "p".to_string())])),
                annotations: Some(BTreeMap::from([
                    (ANNOTATION_RESERVATION.to_string(), reservation.to_string()),
                    (ANNOTATION_CAPACITY_POD.to_string(), capacity.to_string()),
                ])),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    const SHAPE: GpuShape = GpuShape {
        memory_mib: 81920,
        headroom_mib: 1024,
        compute_milli: tessera_core::pack::GPU_COMPUTE_MILLI,
    };

    #[test]
    fn decide_best_fit_and_idempotent() {
        let mut idx = PoolIndex::new("p");
        idx.reset_capacity(&[
            cap("a", &[resv("r1", 700, 0)], None),
            cap("b", &[resv("r2", 200, 0)], None),
        ]);
        match idx.decide(&SHAPE, &resv("r3", 300, 5), false, 16).unwrap() {
            Decision::Place {
                capacity_pod,
                resource_version,
                reservations,
                reason,
                ends_drain,
                evicts,
            } => {
                assert!(!ends_drain);
                assert!(evicts.is_empty());
                assert_eq!(capacity_pod, "a");
                assert_eq!(resource_version.as_deref(), Some("7"));
                assert_eq!(reservations.len(), 2);
                assert_eq!(reason, "BestFit");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            idx.decide(&SHAPE, &resv("r1", 300, 5), false, 16).unwrap(),
            Decision::Existing {
                capacity_pod: "a".into()
            }
        );
        assert!(matches!(
            idx.decide(&SHAPE, &resv("r4", 900, 5), false, 16).unwrap(),
            Decision::NoRoom { gpus: 2, .. }
        ));
    }

    #[test]
    fn unreadable_or_other_pools_are_never_placed_on() {
        let mut idx = PoolIndex::new("p");
        let mut bad = cap("bad", &[], None);
        bad.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(ANNOTATION_RESERVATIONS.into(), "{oops".into());
        let mut other = cap("other", &[], None);
        other
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(LABEL_POOL.into(), "q".into());
        idx.reset_capacity(&[bad, other]);
        assert_eq!(idx.capacity().count(), 1);
        assert!(matches!(
            idx.decide(&SHAPE, &resv("r", 10, 0), false, 16).unwrap(),
            Decision::NoRoom { .. }
        ));
        // Nor deleted: what it holds is unknown.
        assert_eq!(idx.empty_gpus(10_000, 0), (vec![], vec![]));
    }

    #[test]
    fn running_capacity_pods_without_a_gpu_uuid_are_not_placed_on() {
        let with_phase = |mut p: Pod, phase: &str, uuid: Option<&str>| {
            p.status = Some(k8s_openapi::api::core::v1::PodStatus {
                phase: Some(phase.into()),
                ..Default::default()
            });
            if let Some(u) = uuid {
                p.metadata
                    .annotations
                    .as_mut()
                    .unwrap()
                    .insert(ANNOTATION_GPU_UUID.into(), u.into());
            }
            p
        };
        let mut idx = PoolIndex::new("p");
        // Running, agent never published: skipped, and the reason says so.
        idx.reset_capacity(&[with_phase(cap("a", &[], None), "Running", None)]);
        assert!(idx.capacity_pod("a").unwrap().unidentified());
        match idx.decide(&SHAPE, &resv("r", 100, 0), false, 16).unwrap() {
            Decision::NoRoom { reason, gpus } => {
                assert_eq!(gpus, 1);
                assert!(reason.contains("no published GPU UUID"), "{reason}");
            }
            d => panic!("placed on an unidentified GPU: {d:?}"),
        }
        // Once the agent publishes, it is placed on.
        idx.apply_capacity(&with_phase(cap("a", &[], None), "Running", Some("GPU-a")));
        assert!(matches!(
            idx.decide(&SHAPE, &resv("r", 100, 0), false, 16).unwrap(),
            Decision::Place { capacity_pod, .. } if capacity_pod == "a"
        ));
        // A Pending capacity pod (a GPU on its way) is placed on before any UUID exists.
        let mut idx = PoolIndex::new("p");
        idx.reset_capacity(&[with_phase(cap("b", &[], None), "Pending", None)]);
        assert!(!idx.capacity_pod("b").unwrap().unidentified());
        assert!(matches!(
            idx.decide(&SHAPE, &resv("r", 100, 0), false, 16).unwrap(),
            Decision::Place { capacity_pod, .. } if capacity_pod == "b"
        ));
        // An unidentified GPU keeps its reservations and is never deleted for being "empty" of placements.
        let mut idx = PoolIndex::new("p");
        idx.reset_capacity(&[with_phase(
            cap("c", &[resv("old", 100, 0)], None),
            "Running",
            None,
        )]);
        assert_eq!(idx.find_reservation("old").unwrap().0.name, "c");
        assert_eq!(idx.empty_gpus(10_000, 0), (vec![], vec![]));
    }

    #[test]
    fn expiry_spares_reservations_with_a_pod() {
        let mut idx = PoolIndex::new("p");
        idx.reset_capacity(&[cap(
            "a",
            &[resv("r1", 100, 0), resv("r2", 100, 0), resv("r3", 100, 90)],
            None,
        )]);
        idx.reset_tenants(&[tenant("ns", "pod-1", "r1", "a")]);
        assert_eq!(idx.expired(100, 120), vec![]);
        assert_eq!(
            idx.expired(120, 120),
            vec![("a".to_string(), vec!["r2".to_string()])]
        );
        assert_eq!(
            idx.expired(210, 120),
            vec![("a".to_string(), vec!["r2".to_string(), "r3".to_string()])]
        );
        assert_eq!(idx.delete_tenant("ns/pod-1").unwrap().reservation, "r1");
    }

    #[test]
    fn spares_take_the_lowest_free_slots_within_max_gpus() {
        let mut idx = PoolIndex::new("p");
        assert_eq!(idx.spares_to_create(2, 1), ["tessera-gpu-p-0"]);
        assert_eq!(
            idx.spares_to_create(2, 3),
            ["tessera-gpu-p-0", "tessera-gpu-p-1"],
            "no more than maxGpus"
        );
        idx.reset_capacity(&[cap("tessera-gpu-p-0", &[], None)]);
        assert_eq!(idx.spares_to_create(2, 1), ["tessera-gpu-p-1"]);
        idx.reset_capacity(&[cap("tessera-gpu-p-1", &[], None)]);
        assert_eq!(idx.spares_to_create(2, 1), ["tessera-gpu-p-0"]);
        idx.reset_capacity(&[cap("tessera-gpu-p-1", &[], None), cap("other", &[], None)]);
        assert!(idx.spares_to_create(2, 1).is_empty(), "two GPUs held: no spare");
        // A spare ready is enough; one booked is opened (and a new one made) while the pool has room.
        let mut ready = cap("tessera-gpu-p-0", &[], None);
        ready.spec.get_or_insert_default().scheduling_gates =
            Some(vec![k8s_openapi::api::core::v1::PodSchedulingGate {
                name: SPARE_GATE.into(),
            }]);
        idx.reset_capacity(&[ready.clone()]);
        assert!(idx.spares_to_create(2, 1).is_empty());
        assert!(idx.spares_to_open(2).is_empty());
        assert_eq!(idx.gpus_held(), 0, "a spare holds no GPU");
        let mut booked = ready;
        booked.metadata.annotations.get_or_insert_default().insert(
            ANNOTATION_RESERVATIONS.into(),
            encode_reservations(&[resv("r", 300, 0)]),
        );
        idx.reset_capacity(&[booked]);
        assert_eq!(idx.spares_to_open(2), ["tessera-gpu-p-0"]);
        assert_eq!(idx.spares_to_create(2, 1), ["tessera-gpu-p-1"]);
        assert!(
            idx.spares_to_open(0).is_empty(),
            "past maxGpus a booked spare keeps its gate"
        );
        // Never marked empty nor given back: it holds no GPU.
        let mut empty_spare = cap("tessera-gpu-p-3", &[], None);
        empty_spare.spec.get_or_insert_default().scheduling_gates =
            Some(vec![k8s_openapi::api::core::v1::PodSchedulingGate {
                name: SPARE_GATE.into(),
            }]);
        idx.reset_capacity(&[empty_spare]);
        assert_eq!(idx.empty_gpus(10_000, 1), (vec![], vec![]));
    }

    /// Item 9: an evicted capacity pod used to keep its slot (counted toward maxGpus) and was never deleted.
    #[test]
    fn failed_capacity_pods_free_their_slot_and_are_to_be_deleted() {
        let mut idx = PoolIndex::new("p");
        let mut evicted = cap("tessera-gpu-p-0", &[], None);
        evicted.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Failed".into()),
            reason: Some("Evicted".into()),
            ..Default::default()
        });
        let mut deleting = cap("tessera-gpu-p-1", &[], None);
        deleting.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        idx.reset_capacity(&[evicted, deleting]);
        assert_eq!(
            idx.terminated(),
            vec!["tessera-gpu-p-0".to_string()],
            "a terminating pod is being deleted already"
        );
        assert_eq!(
            idx.spares_to_create(2, 1),
            ["tessera-gpu-p-2"],
            "the evicted pod's GPU is free; its name is still taken until it is deleted"
        );
        assert!(
            idx.spares_to_create(1, 1).is_empty(),
            "the terminating pod still holds its GPU"
        );
    }

    #[test]
    fn empty_gpus_are_marked_then_deleted_after_grace() {
        let mut idx = PoolIndex::new("p");
        idx.reset_capacity(&[
            cap("a", &[], None),
            cap("b", &[], Some(100)),
            cap("c", &[resv("r", 1, 0)], None),
        ]);
        assert_eq!(idx.empty_gpus(500, 600), (vec!["a".to_string()], vec![]));
        assert_eq!(
            idx.empty_gpus(700, 600),
            (vec!["a".to_string()], vec!["b".to_string()])
        );
    }

    #[test]
    fn patch_carries_resource_version_and_karpenter_annotation() {
        let p = reservations_patch(&[resv("r", 100, 0)], Some("42"), Some(5), 9);
        assert_eq!(p["metadata"]["resourceVersion"], "42");
        assert_eq!(p["metadata"]["annotations"][KARPENTER_DO_NOT_DISRUPT], "true");
        assert!(p["metadata"]["annotations"][ANNOTATION_EMPTY_SINCE].is_null());
        let p = reservations_patch(&[], Some("43"), None, 9);
        assert!(p["metadata"]["annotations"][KARPENTER_DO_NOT_DISRUPT].is_null());
        assert_eq!(p["metadata"]["annotations"][ANNOTATION_EMPTY_SINCE], "9");
        let doc = p["metadata"]["annotations"][ANNOTATION_RESERVATIONS]
            .as_str()
            .unwrap();
        assert_eq!(decode_reservations(Some(doc)).unwrap(), vec![]);
        assert!(
            decode_reservations(Some("{\"version\":2,\"reservations\":[]}"))
                .unwrap_err()
                .contains("version 2")
        );
    }

    use proptest::prelude::*;

    proptest! {
        /// Deciding then writing (as the manager does after a successful patch), over any sequence of
        /// reservations and releases, never books a GPU past either capacity, and NoRoom means no GPU fits.
        #[test]
        fn decisions_never_overbook(ops in proptest::collection::vec((0u8..4, 1u32..=700, 0u64..=40_000, any::<bool>()), 1..60)) {
            let mut idx = PoolIndex::new("p");
            let mut pods: BTreeMap<String, Vec<Reservation>> = BTreeMap::new();
            let mut live: Vec<String> = Vec::new();
            for (n, (model, c, m, release)) in ops.into_iter().enumerate() {
                if release && !live.is_empty() {
                    let id = live.remove(n % live.len());
                    for rs in pods.values_mut() {
                        rs.retain(|r| r.id != id);
                    }
                } else {
                    let r = Reservation { id: format!("r{n}"), model: format!("m{model}"), compute_milli: c, memory_mib: m, priority: 0, created_at: 0, pod: None, evicted_at: None, asleep_since: None };
                    match idx.decide(&SHAPE, &r, false, 16).unwrap() {
                        Decision::Place { capacity_pod, reservations, .. } => {
                            pods.insert(capacity_pod, reservations);
                            live.push(r.id);
                        }
                        Decision::NoRoom { .. } => {
                            let fits = pods.values().any(|rs| {
                                rs.iter().map(|x| x.compute_milli).sum::<u32>() + c <= 1000
                                    && rs.iter().map(|x| x.memory_mib).sum::<u64>() + m <= SHAPE.usable_memory_mib()
                            });
                            prop_assert!(!fits, "NoRoom although a capacity pod had room");
                            let name = idx.spares_to_create(usize::MAX, 1).remove(0);
                            pods.insert(name, vec![r.clone()]);
                            live.push(r.id);
                        }
                        Decision::Existing { .. } => prop_assert!(false, "ids are unique here"),
                    }
                }
                let list: Vec<Pod> = pods.iter().map(|(name, rs)| cap(name, rs, None)).collect();
                idx.reset_capacity(&list);
                for (name, rs) in &pods {
                    prop_assert!(rs.iter().map(|x| x.compute_milli).sum::<u32>() <= 1000, "{} over compute", name);
                    prop_assert!(rs.iter().map(|x| x.memory_mib).sum::<u64>() <= SHAPE.usable_memory_mib(), "{} over memory", name);
                }
            }
        }
    }
}
