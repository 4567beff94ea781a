//! Slices and allocations folded into the core packer's state ([`tessera_core::pack::Packer`]): the DRA view of a
//! pool. The kube-scheduler books claims; Tessera reads what it booked and asks the same packing code the capacity
//! pods use whether a claim that fits nowhere could fit, why not, and how many GPUs an offline packing of the same
//! claims would need (the gap between the scheduler's placement and Tessera's).
//!
//! Devices are grouped by shape (their memory and compute capacities): one packer per shape, so a pool of mixed
//! cards is judged per card.

use std::collections::BTreeMap;

use tessera_core::pack::{
    GpuId, GpuShape, NoRoomReason, PackError, Packer, Placement, ReplicaRequest, lower_bound_l2,
    lower_bound_lp, pack_offline,
};

use crate::claim::{Allocated, ClaimShape};
use crate::slice::PublishedDevice;

/// One packer per device shape, with every allocation on its device.
#[derive(Debug, Default)]
pub struct DraIndex {
    shapes: BTreeMap<(u64, u32), ShapeGroup>,
    /// Allocations that name a device no slice publishes (its slice was removed, or not seen yet).
    pub orphans: Vec<Allocated>,
    /// Allocations the packer refused: over a device's capacity. The scheduler never books past a capacity, so
    /// each is a slice that shrank under its tenants, or two writers — reported, never hidden.
    pub overbooked: Vec<(Allocated, String)>,
}

#[derive(Debug)]
struct ShapeGroup {
    packer: Packer,
    devices: BTreeMap<(String, String), GpuId>,
    names: BTreeMap<GpuId, (String, String)>,
}

/// A device's room, for `/ui` and status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRoom {
    /// The slice pool (node) and the device.
    pub pool: String,
    /// The device's name.
    pub device: String,
    /// Consumable memory and compute.
    pub memory_mib: u64,
    /// Compute capacity, milli.
    pub compute_milli: u32,
    /// Booked memory, MiB.
    pub memory_used_mib: u64,
    /// Booked compute, milli.
    pub compute_used_milli: u32,
    /// The claims on it (`namespace/name`).
    pub claims: Vec<String>,
}

/// Whether a claim of some shape has a device with room, and if not, why and what would make room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fit {
    /// A device has room: `pool/device` is where the packer would put it (the scheduler may choose another).
    Room(String),
    /// No device of any shape has room.
    Nowhere(String),
}

impl DraIndex {
    /// The index of `devices` holding `allocations`.
    pub fn build(devices: &[PublishedDevice], allocations: &[Allocated]) -> Self {
        let mut index = Self::default();
        for d in devices {
            let key = (d.memory_mib, d.compute_milli);
            let group = match index.shapes.get_mut(&key) {
                Some(g) => g,
                None => {
                    let Ok(shape) = shape_of(d) else { continue };
                    index.shapes.entry(key).or_insert(ShapeGroup {
                        packer: Packer::new(shape),
                        devices: BTreeMap::new(),
                        names: BTreeMap::new(),
                    })
                }
            };
            let id = group.packer.add_gpu();
            group.devices.insert((d.pool.clone(), d.device.clone()), id);
            group.names.insert(id, (d.pool.clone(), d.device.clone()));
        }
        for a in allocations {
            let found = index.shapes.values_mut().find_map(|g| {
                let id = *g.devices.get(&(a.pool.clone(), a.device.clone()))?;
                Some((g, id))
            });
            let Some((group, id)) = found else {
                index.orphans.push(a.clone());
                continue;
            };
            let r = ReplicaRequest::new(
                a.claim.clone(),
                a.model.clone().unwrap_or_else(|| a.claim.clone()),
                a.compute_milli.max(1),
                a.memory_mib,
            );
            if let Err(e) = group.packer.assign(id, r) {
                index.overbooked.push((a.clone(), e.to_string()));
            }
        }
        index
    }

    /// Every device with what is booked on it, by pool then device.
    pub fn rooms(&self) -> Vec<DeviceRoom> {
        let mut out: Vec<DeviceRoom> = self
            .shapes
            .values()
            .flat_map(|g| {
                let shape = *g.packer.shape();
                g.packer.gpus().map(move |s| {
                    let (pool, device) = g.names[&s.id].clone();
                    DeviceRoom {
                        pool,
                        device,
                        memory_mib: shape.usable_memory_mib(),
                        compute_milli: s.compute_capacity_milli,
                        memory_used_mib: s.memory_used_mib,
                        compute_used_milli: s.compute_used_milli,
                        claims: s.replicas.iter().map(|r| r.id.clone()).collect(),
                    }
                })
            })
            .collect();
        out.sort_by(|a, b| (&a.pool, &a.device).cmp(&(&b.pool, &b.device)));
        out
    }

    /// Whether a claim of `want` for `model` has room anywhere, through the packer's own placement rule.
    pub fn fit(&self, model: &str, want: ClaimShape) -> Fit {
        let want = want.rounded();
        let mut most_free: Option<(u64, u32)> = None;
        let mut too_big = Vec::new();
        for group in self.shapes.values() {
            let mut trial = group.packer.clone();
            let r = ReplicaRequest::new("tessera-fit-probe", model, want.compute_milli, want.memory_mib);
            match trial.place(r) {
                Ok(Placement::Gpu { gpu, .. }) => {
                    let (pool, device) = &group.names[&gpu];
                    return Fit::Room(format!("{pool}/{device}"));
                }
                Ok(Placement::NoRoom(NoRoomReason::AllFull {
                    max_free_compute_milli,
                    max_free_memory_mib,
                })) => {
                    let m = most_free.get_or_insert((0, 0));
                    *m = (m.0.max(max_free_memory_mib), m.1.max(max_free_compute_milli));
                }
                Ok(Placement::NoRoom(NoRoomReason::NoGpus)) => {}
                // A request no GPU of this shape could hold, however empty.
                Err(_) => {
                    too_big.push(group.packer.shape().usable_memory_mib());
                }
            }
        }
        let devices: usize = self.shapes.values().map(|g| g.devices.len()).sum();
        let need = format!(
            "{} MiB and {}m compute on one GPU",
            want.memory_mib, want.compute_milli
        );
        let why = match most_free {
            _ if devices == 0 => format!(
                "needs {need}, and no node publishes {} devices (is the pool's node labelled, the DRA mode on?)",
                crate::DRIVER
            ),
            Some((m, c)) => format!(
                "needs {need}; none of the {devices} GPUs has that free (most free: {m} MiB, {c}m compute). Room \
                 would come from a new GPU node, fewer replicas of other models, or a smaller gpu.memory"
            ),
            None => format!(
                "needs {need}, more than any GPU offers (largest: {} MiB usable): set a smaller gpu.memory",
                too_big.iter().max().copied().unwrap_or(0)
            ),
        };
        Fit::Nowhere(why)
    }

    /// GPUs the scheduler's placement holds (devices with at least one claim), against the GPUs an offline
    /// packing of the same claims needs and the LP lower bound, per shape: (scheduler, packer, bound).
    pub fn placement_gap(&self) -> (usize, usize, u32) {
        let mut held = 0;
        let mut packed = 0;
        let mut bound = 0;
        for g in self.shapes.values() {
            let items: Vec<ReplicaRequest> =
                g.packer.gpus().flat_map(|s| s.replicas.iter().cloned()).collect();
            if items.is_empty() {
                continue;
            }
            held += g.packer.gpus().filter(|s| !s.is_empty()).count();
            packed += pack_offline(&items, g.packer.shape()).map_or(items.len(), |p| p.gpus_used());
            // Both resources bound the count; the larger holds. Compute by the LP (milli sizes keep its
            // dynamic programme small), memory by L2 (MiB would make the programme tens of thousands wide).
            let shape = g.packer.shape();
            let compute: Vec<u32> = items.iter().map(|r| r.compute_milli).collect();
            let memory: Vec<u32> = items
                .iter()
                .map(|r| u32::try_from(r.memory_mib).unwrap_or(u32::MAX))
                .collect();
            let memory_cap = u32::try_from(shape.usable_memory_mib()).unwrap_or(u32::MAX);
            bound += lower_bound_lp(&compute, shape.compute_milli, 200)
                .bound
                .max(lower_bound_l2(&memory, memory_cap));
        }
        (held, packed, bound)
    }
}

fn shape_of(d: &PublishedDevice) -> Result<GpuShape, PackError> {
    // The slice's memory capacity is already what a tenant can use: no headroom on top.
    let base = GpuShape {
        memory_mib: d.memory_mib,
        headroom_mib: 0,
        compute_milli: d.compute_milli,
    };
    base.validate().map(|()| base)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(pool: &str, device: &str) -> PublishedDevice {
        PublishedDevice {
            pool: pool.into(),
            node: Some(pool.into()),
            device: device.into(),
            memory_mib: 40000,
            compute_milli: 2000,
            total_memory_mib: 40960,
            uuid: None,
        }
    }

    fn alloc(claim: &str, pool: &str, device: &str, memory_mib: u64, compute_milli: u32) -> Allocated {
        Allocated {
            claim: claim.into(),
            uid: None,
            model: Some(claim.split('-').next().unwrap_or(claim).into()),
            pool: pool.into(),
            device: device.into(),
            memory_mib,
            compute_milli,
            share_id: None,
        }
    }

    #[test]
    fn room_is_what_the_scheduler_left_and_a_claim_too_big_for_it_is_explained() {
        let devices = [dev("a", "gpu-0"), dev("a", "gpu-1")];
        let allocs = [
            alloc("m/llama-1", "a", "gpu-0", 30000, 500),
            alloc("m/qwen-1", "a", "gpu-1", 30000, 500),
            alloc("m/gone-1", "b", "gpu-0", 1000, 100),
        ];
        let index = DraIndex::build(&devices, &allocs);
        assert_eq!(index.orphans.len(), 1, "a device no slice publishes");
        let rooms = index.rooms();
        assert_eq!((rooms[0].memory_used_mib, rooms[0].claims.len()), (30000, 1));
        let small = ClaimShape {
            memory_mib: 8000,
            compute_milli: 250,
        };
        assert!(matches!(index.fit("mistral", small), Fit::Room(_)));
        let big = ClaimShape {
            memory_mib: 20000,
            compute_milli: 250,
        };
        let Fit::Nowhere(why) = index.fit("mistral", big) else {
            panic!("20000 MiB cannot fit beside 30000 of 40000");
        };
        assert!(
            why.contains("20000 MiB") && why.contains("most free: 10000 MiB"),
            "{why}"
        );
        let huge = ClaimShape {
            memory_mib: 90000,
            compute_milli: 250,
        };
        let Fit::Nowhere(why) = index.fit("mistral", huge) else {
            panic!("larger than a GPU")
        };
        assert!(why.contains("largest: 40000 MiB"), "{why}");
    }

    #[test]
    fn an_overbooked_device_is_reported_and_the_gap_counts_gpus() {
        let devices = [dev("a", "gpu-0"), dev("a", "gpu-1")];
        let allocs = [
            alloc("m/a-1", "a", "gpu-0", 10000, 300),
            alloc("m/b-1", "a", "gpu-1", 10000, 300),
            alloc("m/c-1", "a", "gpu-1", 35000, 300),
        ];
        let index = DraIndex::build(&devices, &allocs);
        assert_eq!(index.overbooked.len(), 1, "{:?}", index.overbooked);
        let (held, packed, bound) = index.placement_gap();
        assert_eq!((held, packed), (2, 1), "two claims of 10000 MiB fit one GPU");
        assert!(bound <= 1);
        // Memory binds where compute does not: three claims of 15000 MiB need two 40000 MiB GPUs, whatever
        // their 100m of compute says.
        let devices = [dev("a", "gpu-0"), dev("a", "gpu-1"), dev("a", "gpu-2")];
        let allocs = [
            alloc("m/a-1", "a", "gpu-0", 15000, 100),
            alloc("m/a-2", "a", "gpu-1", 15000, 100),
            alloc("m/a-3", "a", "gpu-2", 15000, 100),
        ];
        assert_eq!(DraIndex::build(&devices, &allocs).placement_gap(), (3, 2, 2));
        let empty = DraIndex::build(&[], &[]);
        let Fit::Nowhere(why) = empty.fit(
            "x",
            ClaimShape {
                memory_mib: 1,
                compute_milli: 1,
            },
        ) else {
            panic!("no devices")
        };
        assert!(why.contains("no node publishes"), "{why}");
    }
}
