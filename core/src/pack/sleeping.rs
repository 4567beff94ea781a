//! Placing a replica beside sleeping pods (vLLM sleep mode), the rule the simulator's sleep-mode run models and the
//! webhook will follow once the controller can put a pod to sleep (`docs/simulator-experiments.md`, "What sleep mode is
//! worth").
//!
//! A sleeping pod's weights sit in host memory, but its CUDA context does not move: it can wake only on the GPU it
//! slept on. So the packer counts none of its memory or compute (it lends its room), yet a new replica takes that
//! room only where the alternative is opening a GPU. Taking it turns the sleeping pod's next wake into a cold start
//! somewhere else, which costs its model's objective; opening a GPU costs a GPU.

use super::{GpuId, PackError, Packer, Placement, ReplicaRequest};

impl Packer {
    /// Places `request` leaving `sleeping` pods' room (each a GPU and the share the pod held there, with an id no
    /// replica in the packer has) where another GPU has room: first with every sleeping pod's share held where it
    /// still fits, then, if no GPU has room that way, as [`Packer::place_or_open`] would with that room free.
    /// Returns the GPU it went to; the packer ends holding `request` and nothing of the sleeping shares.
    pub fn place_beside_sleeping(
        &mut self,
        request: ReplicaRequest,
        sleeping: impl IntoIterator<Item = (GpuId, ReplicaRequest)>,
    ) -> Result<GpuId, PackError> {
        // A share that no longer fits (its room was lent earlier) holds nothing: that pod will start cold anyway.
        let held: Vec<String> = sleeping
            .into_iter()
            .filter_map(|(g, share)| {
                let id = share.id.clone();
                self.assign(g, share).is_ok().then_some(id)
            })
            .collect();
        let placed = self.place(request.clone());
        for id in &held {
            self.remove(id);
        }
        match placed? {
            Placement::Gpu { gpu, .. } => Ok(gpu),
            Placement::NoRoom(_) => self.place_or_open(request).map(|(g, _)| g),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::super::GpuShape;
    use super::*;

    /// Two GPUs of 10,000 MiB (no headroom): GPU 0 holds 5,000 MiB and a sleeping pod's 4,000 lent, GPU 1 holds
    /// `other` MiB.
    fn pool(other: u64) -> (Packer, (GpuId, ReplicaRequest), GpuId) {
        let mut p = Packer::new(GpuShape::new(10_000, 0).unwrap());
        let (g0, g1) = (p.add_gpu(), p.add_gpu());
        p.assign(g0, ReplicaRequest::new("a-0", "a", 100, 5_000)).unwrap();
        p.assign(g1, ReplicaRequest::new("b-0", "b", 100, other)).unwrap();
        (
            p,
            (g0, ReplicaRequest::new("asleep/tool", "tool", 100, 4_000)),
            g1,
        )
    }

    /// A new replica goes where it fits with the sleeping pod's share held, although the lent room is the better
    /// fit (best fit alone would pick GPU 0), so the sleeping pod can still wake.
    #[test]
    fn a_new_replica_leaves_a_sleeping_pods_room_where_another_gpu_has_some() {
        let (mut p, asleep, g1) = pool(4_000);
        let g = p
            .place_beside_sleeping(ReplicaRequest::new("c-0", "c", 100, 3_000), [asleep.clone()])
            .unwrap();
        assert_eq!(g, g1);
        assert!(
            p.gpu(asleep.0).unwrap().fits(&asleep.1, p.shape()),
            "the sleeping pod's room is left"
        );
        // Nothing of the held share stays behind.
        assert_eq!(p.replica_count(), 3);
    }

    /// Where the alternative is opening a GPU, the lent room is taken (the sleeping pod will start cold).
    #[test]
    fn a_new_replica_takes_lent_room_rather_than_open_a_gpu() {
        let (mut p, asleep, _) = pool(7_000);
        let g0 = asleep.0;
        let g = p
            .place_beside_sleeping(ReplicaRequest::new("c-0", "c", 100, 4_500), [asleep.clone()])
            .unwrap();
        assert_eq!(g, g0);
        assert_eq!(p.gpus().count(), 2, "no GPU opened");
        assert!(!p.gpu(g0).unwrap().fits(&asleep.1, p.shape()));
        // And where not even the lent room holds it, a GPU opens.
        let g = p
            .place_beside_sleeping(ReplicaRequest::new("d-0", "d", 100, 8_000), [asleep])
            .unwrap();
        assert_eq!(p.gpus().count(), 3);
        assert_eq!(p.gpu(g).unwrap().replicas_of("d"), 1);
    }
}
