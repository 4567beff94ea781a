#![allow(clippy::unwrap_used)]

use super::*;
use proptest::prelude::*;

const SHAPE: GpuShape = GpuShape {
    memory_mib: 81920,
    headroom_mib: 1024,
    compute_milli: crate::pack::GPU_COMPUTE_MILLI,
};

fn req(id: &str, model: &str, c: u32, m: u64) -> ReplicaRequest {
    ReplicaRequest::new(id, model, c, m)
}

/// Recounts every GPU from its replica list, independently of the packer's running sums.
fn assert_consistent(p: &Packer) {
    let mut seen = std::collections::HashSet::new();
    for g in p.gpus() {
        let c: u32 = g.replicas.iter().map(|r| r.compute_milli).sum();
        let m: u64 = g.replicas.iter().map(|r| r.memory_mib).sum();
        assert_eq!(c, g.compute_used_milli, "{} compute sum", g.id);
        assert_eq!(m, g.memory_used_mib, "{} memory sum", g.id);
        assert!(c <= GPU_COMPUTE_MILLI, "{} over compute: {c}", g.id);
        assert!(m <= p.shape().usable_memory_mib(), "{} over memory: {m}", g.id);
        for r in &g.replicas {
            assert!(seen.insert(r.id.clone()), "{} placed twice", r.id);
            assert_eq!(p.location(&r.id), Some(g.id));
        }
    }
    assert_eq!(seen.len(), p.replica_count());
}

#[test]
fn best_fit_takes_the_tightest_gpu() {
    let mut p = Packer::new(SHAPE);
    let a = p.add_gpu();
    let b = p.add_gpu();
    p.assign(a, req("x", "m1", 300, 10_000)).unwrap();
    p.assign(b, req("y", "m2", 700, 50_000)).unwrap();
    // 300 milli fits both; b is left with 0 compute and the least memory: b.
    let got = p.place(req("z", "m3", 300, 10_000)).unwrap();
    assert_eq!(
        got,
        Placement::Gpu {
            gpu: b,
            reason: PlaceReason::BestFit
        }
    );
    assert_consistent(&p);
}

#[test]
fn first_fit_takes_the_lowest_id() {
    let mut p = Packer::with_policy(SHAPE, FitPolicy::FirstFit);
    let a = p.add_gpu();
    let b = p.add_gpu();
    p.assign(b, req("y", "m2", 700, 0)).unwrap();
    assert_eq!(p.place(req("z", "m3", 300, 0)).unwrap().gpu(), Some(a));
}

#[test]
fn replicas_of_a_model_spread_when_possible() {
    let mut p = Packer::new(SHAPE);
    let a = p.add_gpu();
    let b = p.add_gpu();
    p.assign(a, req("llama-0", "llama", 500, 20_000)).unwrap();
    // a would be the best fit (fuller), but it already holds llama: b.
    let got = p.place(req("llama-1", "llama", 400, 20_000)).unwrap();
    assert_eq!(
        got,
        Placement::Gpu {
            gpu: b,
            reason: PlaceReason::BestFit
        }
    );
    // Now only a has room for 500: the same model goes there, and says why.
    p.assign(b, req("other", "qwen", 500, 1_000)).unwrap();
    let got = p.place(req("llama-2", "llama", 500, 1_000)).unwrap();
    assert_eq!(
        got,
        Placement::Gpu {
            gpu: a,
            reason: PlaceReason::SameModelOnly
        }
    );
    assert_consistent(&p);
}

#[test]
fn no_room_leaves_the_packer_unchanged_and_says_why() {
    let mut p = Packer::new(SHAPE);
    assert_eq!(
        p.place(req("a", "m", 100, 0)).unwrap(),
        Placement::NoRoom(NoRoomReason::NoGpus)
    );
    let g = p.add_gpu();
    p.assign(g, req("big", "m", 900, 70_000)).unwrap();
    let before = p.gpu(g).unwrap().clone();
    let got = p.place(req("b", "m2", 200, 1_000)).unwrap();
    assert_eq!(
        got,
        Placement::NoRoom(NoRoomReason::AllFull {
            max_free_compute_milli: 100,
            max_free_memory_mib: 10_896
        })
    );
    assert_eq!(p.gpu(g).unwrap(), &before);
    // Memory is the short dimension here.
    assert!(matches!(
        p.place(req("c", "m2", 50, 20_000)).unwrap(),
        Placement::NoRoom(_)
    ));
    let (opened, reason) = p.place_or_open(req("c", "m2", 50, 20_000)).unwrap();
    assert_ne!(opened, g);
    assert_eq!(reason, PlaceReason::Opened);
}

#[test]
fn bad_requests_are_errors_naming_the_problem() {
    let mut p = Packer::new(SHAPE);
    p.add_gpu();
    let e = p.place(req("z", "m", 0, 0)).unwrap_err();
    assert!(e.to_string().contains("1..=1000"), "{e}");
    let e = p.place(req("z", "m", 1001, 0)).unwrap_err();
    assert!(matches!(
        e,
        PackError::InvalidCompute {
            compute_milli: 1001,
            ..
        }
    ));
    let e = p.place(req("z", "m", 10, 81_000)).unwrap_err();
    assert!(e.to_string().contains("80896 MiB after headroom"), "{e}");
    p.place(req("d", "m", 10, 0)).unwrap();
    assert_eq!(
        p.place(req("d", "m", 10, 0)).unwrap_err(),
        PackError::Duplicate("d".into())
    );
    assert!(GpuShape::new(1000, 1000).is_err());
    assert!(GpuShape::new(0, 0).is_err());
    assert_eq!(
        p.assign(GpuId(99), req("q", "m", 1, 0)).unwrap_err(),
        PackError::UnknownGpu(GpuId(99))
    );
}

#[test]
fn remove_frees_exactly_and_keeps_the_gpu() {
    let mut p = Packer::new(SHAPE);
    let (g, _) = p.place_or_open(req("a", "m", 250, 5_000)).unwrap();
    p.place(req("b", "m2", 300, 7_000)).unwrap();
    let (from, r) = p.remove("a").unwrap();
    assert_eq!((from, r.compute_milli, r.memory_mib), (g, 250, 5_000));
    assert_eq!(p.gpu(g).unwrap().compute_used_milli, 300);
    assert_eq!(p.gpu(g).unwrap().memory_used_mib, 7_000);
    assert!(p.remove("a").is_none());
    p.remove("b").unwrap();
    assert_eq!(p.empty_gpus(), vec![g]);
    assert_eq!(p.utilization().empty_gpus, 1);
}

#[test]
fn defrag_finds_gpus_emptied_by_few_moves() {
    let mut p = Packer::new(SHAPE);
    let a = p.add_gpu();
    let b = p.add_gpu();
    let c = p.add_gpu();
    p.assign(a, req("a1", "m1", 600, 0)).unwrap();
    p.assign(b, req("b1", "m2", 500, 0)).unwrap();
    p.assign(c, req("c1", "m3", 200, 0)).unwrap();
    p.assign(c, req("c2", "m4", 200, 0)).unwrap();
    // b's 500 fits only on c (600 free; a has 400): one move empties b. Then c is at 900 and a's 600 fits
    // nowhere, and c holds three replicas, more than two moves.
    let plans = p.defrag_candidates(1);
    assert_eq!(plans.len(), 1, "{plans:?}");
    assert_eq!(plans[0].gpu, b);
    assert_eq!(
        plans[0].moves,
        vec![Move {
            replica: "b1".into(),
            from: b,
            to: c
        }]
    );
    // With two moves allowed, the cheapest (b, one replica) still comes first and nothing else is possible.
    let plans2 = p.defrag_candidates(2);
    assert_eq!(plans2[0], plans[0]);
    let mut q = p.clone();
    for plan in &plans2 {
        q.apply_plan(plan).unwrap();
        assert!(q.gpu(plan.gpu).unwrap().is_empty());
    }
    assert_consistent(&q);
    assert!(p.defrag_candidates(0).is_empty());
}

#[test]
fn a_stale_plan_is_refused_without_changes() {
    let mut p = Packer::new(SHAPE);
    let a = p.add_gpu();
    let b = p.add_gpu();
    p.assign(a, req("a1", "m1", 600, 0)).unwrap();
    p.assign(b, req("b1", "m2", 300, 0)).unwrap();
    let plan = p.defrag_candidates(1).remove(0);
    // Someone took the room meanwhile.
    p.assign(plan.moves[0].to, req("late", "m3", 400, 0)).unwrap();
    let before = p.clone();
    assert!(p.apply_plan(&plan).is_err());
    assert_eq!(p.gpus().collect::<Vec<_>>(), before.gpus().collect::<Vec<_>>());
}

#[test]
fn place_all_goes_by_priority_and_respects_max_gpus() {
    let mut p = Packer::new(SHAPE);
    let mut lo = req("lo", "m1", 800, 0);
    lo.priority = -1;
    let mut hi = req("hi", "m2", 700, 0);
    hi.priority = 5;
    let out = p.place_all(vec![lo, hi], true, 1);
    assert!(matches!(out[0], (ref id, Ok(Placement::Gpu { .. })) if id == "hi"));
    assert!(matches!(out[1], (ref id, Ok(Placement::NoRoom(_))) if id == "lo"));
    assert_eq!(p.gpus().count(), 1);
}

#[test]
fn offline_packing_beats_first_fit_decreasing_where_ffd_is_known_to_lose() {
    // {440, 440, 300, 300, 260, 260}: optimum 2 (440+300+260 twice); FFD pairs the two 440s first and needs 3
    // (440+440, 300+300+260, 260).
    let sizes = [440, 440, 300, 300, 260, 260];
    let items: Vec<ReplicaRequest> = sizes
        .iter()
        .enumerate()
        .map(|(i, &c)| req(&format!("r{i}"), &format!("m{i}"), c, 0))
        .collect();
    let ffd = pack_first_fit_decreasing(&items, &SHAPE).unwrap();
    let best = pack_offline(&items, &SHAPE).unwrap();
    assert_eq!(ffd.gpus_used(), 3);
    assert_eq!(best.gpus_used(), 2);
    assert_eq!(best.algorithm, OfflineAlgorithm::MinimumBinSlack);
    verify_offline(&items, &best);
}

#[test]
fn offline_respects_memory() {
    // Compute alone would fit 4 on a GPU; memory allows only 2.
    let items: Vec<ReplicaRequest> = (0..4).map(|i| req(&format!("r{i}"), "m", 200, 40_000)).collect();
    let got = pack_offline(&items, &SHAPE).unwrap();
    assert_eq!(got.gpus_used(), 2);
    verify_offline(&items, &got);
    let bad = vec![req("x", "m", 100, 90_000)];
    assert!(matches!(
        pack_offline(&bad, &SHAPE),
        Err(PackError::TooMuchMemory { .. })
    ));
}

/// Every item on exactly one GPU; every GPU within both capacities (recounted from the items).
fn verify_offline(items: &[ReplicaRequest], p: &OfflinePacking) {
    let mut count = vec![0; items.len()];
    for (g, bin) in p.gpus.iter().enumerate() {
        assert!(!bin.is_empty(), "GPU {g} is empty");
        let c: u32 = bin.iter().map(|&i| items[i].compute_milli).sum();
        let m: u64 = bin.iter().map(|&i| items[i].memory_mib).sum();
        assert!(c <= GPU_COMPUTE_MILLI, "GPU {g}: compute {c}");
        assert!(m <= SHAPE.usable_memory_mib(), "GPU {g}: memory {m}");
        for &i in bin {
            count[i] += 1;
            assert_eq!(p.assignment[i], g);
        }
    }
    assert!(count.iter().all(|&n| n == 1), "{count:?}");
}

#[derive(Debug, Clone)]
enum Op {
    Place { model: u8, c: u32, m: u64 },
    Open { model: u8, c: u32, m: u64 },
    Remove(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..4, 1u32..=1000, 0u64..=80_896).prop_map(|(model, c, m)| Op::Place { model, c, m }),
        (0u8..4, 1u32..=1000, 0u64..=80_896).prop_map(|(model, c, m)| Op::Open { model, c, m }),
        (0usize..64).prop_map(Op::Remove),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// No GPU ever goes over either capacity; place says NoRoom only when no GPU has room; place_or_open
    /// always places a valid request; remove frees exactly the replica's share.
    #[test]
    fn online_invariants(ops in proptest::collection::vec(op(), 1..80)) {
        let mut p = Packer::new(SHAPE);
        let mut ids: Vec<String> = Vec::new();
        for (n, o) in ops.into_iter().enumerate() {
            match o {
                Op::Place { model, c, m } => {
                    let r = req(&format!("r{n}"), &format!("m{model}"), c, m);
                    let any_fits = p.gpus().any(|g| g.fits(&r, &SHAPE));
                    match p.place(r).unwrap() {
                        Placement::Gpu { .. } => { prop_assert!(any_fits); ids.push(format!("r{n}")); }
                        Placement::NoRoom(_) => prop_assert!(!any_fits, "NoRoom although a GPU had room"),
                    }
                }
                Op::Open { model, c, m } => {
                    let gpus_before = p.gpus().count();
                    let r = req(&format!("r{n}"), &format!("m{model}"), c, m);
                    let any_fits = p.gpus().any(|g| g.fits(&r, &SHAPE));
                    let (_, reason) = p.place_or_open(r).unwrap();
                    // A GPU is opened only if nothing existing fits.
                    prop_assert_eq!(reason == PlaceReason::Opened, !any_fits);
                    prop_assert_eq!(p.gpus().count(), gpus_before + usize::from(!any_fits));
                    ids.push(format!("r{n}"));
                }
                Op::Remove(k) if !ids.is_empty() => {
                    let id = ids.remove(k % ids.len());
                    let gpu = p.location(&id).unwrap();
                    let before = p.gpu(gpu).unwrap().clone();
                    let (from, r) = p.remove(&id).unwrap();
                    prop_assert_eq!(from, gpu);
                    let after = p.gpu(gpu).unwrap();
                    prop_assert_eq!(after.compute_used_milli + r.compute_milli, before.compute_used_milli);
                    prop_assert_eq!(after.memory_used_mib + r.memory_mib, before.memory_used_mib);
                    prop_assert_eq!(after.replicas.len() + 1, before.replicas.len());
                }
                Op::Remove(_) => {}
            }
            assert_consistent(&p);
        }
    }

    /// Spreading: a replica lands on a GPU already holding its model only when no other GPU had room.
    #[test]
    fn spreading_is_only_broken_when_needed(ops in proptest::collection::vec((0u8..3, 1u32..=600), 1..60)) {
        let mut p = Packer::new(SHAPE);
        for (n, (model, c)) in ops.into_iter().enumerate() {
            let r = req(&format!("r{n}"), &format!("m{model}"), c, 0);
            let other_fits = p.gpus().any(|g| g.fits(&r, &SHAPE) && g.replicas_of(&r.model) == 0);
            let (gpu, reason) = p.place_or_open(r.clone()).unwrap();
            let holds_model_before = p.gpu(gpu).unwrap().replicas_of(&r.model) > 1;
            if holds_model_before {
                prop_assert!(!other_fits);
                prop_assert_eq!(reason, PlaceReason::SameModelOnly);
            }
        }
    }

    /// Defragmentation plans are valid when applied in order, each empties its GPU, and none exceeds K moves.
    #[test]
    fn defrag_plans_apply(
        items in proptest::collection::vec((1u32..=700, 0u64..=40_000), 1..40), k in 1usize..4
    ) {
        let mut p = Packer::with_policy(SHAPE, FitPolicy::FirstFit);
        for (n, (c, m)) in items.iter().enumerate() {
            p.place_or_open(req(&format!("r{n}"), &format!("m{n}"), *c, *m)).unwrap();
        }
        // Remove every third replica to leave holes worth defragmenting.
        for n in (0..items.len()).step_by(3) {
            p.remove(&format!("r{n}"));
        }
        let replicas = p.replica_count();
        let plans = p.defrag_candidates(k);
        for plan in &plans {
            prop_assert!(plan.moves.len() <= k);
            prop_assert!(!plan.moves.is_empty());
            p.apply_plan(plan).unwrap();
            prop_assert!(p.gpu(plan.gpu).unwrap().is_empty());
            assert_consistent(&p);
        }
        prop_assert_eq!(p.replica_count(), replicas);
    }

    /// Offline packings are valid, never below the L2 bound (a sanity check of both), and never worse than
    /// first-fit decreasing.
    #[test]
    fn offline_packings_are_valid(items in proptest::collection::vec((1u32..=1000, 0u64..=50_000), 0..120)) {
        let items: Vec<ReplicaRequest> =
            items.iter().enumerate().map(|(i, &(c, m))| req(&format!("r{i}"), "m", c, m)).collect();
        let got = pack_offline(&items, &SHAPE).unwrap();
        verify_offline(&items, &got);
        let ffd = pack_first_fit_decreasing(&items, &SHAPE).unwrap();
        verify_offline(&items, &ffd);
        let compute: Vec<u32> = items.iter().map(|r| r.compute_milli).collect();
        let memory: Vec<u32> = items.iter().map(|r| r.memory_mib as u32).collect();
        let lb = lower_bound_l2(&compute, GPU_COMPUTE_MILLI)
            .max(lower_bound_l2(&memory, SHAPE.usable_memory_mib() as u32));
        prop_assert!(got.gpus_used() as u32 >= lb);
        prop_assert!(got.gpus_used() <= ffd.gpus_used(), "offline {} > ffd {}", got.gpus_used(), ffd.gpus_used());
    }
}

#[test]
fn an_oversubscribed_shape_hands_out_compute_more_than_once_and_memory_once() {
    let shape = SHAPE.with_compute_oversubscription(2.0).unwrap();
    assert_eq!(shape.compute_milli, 2000);
    assert_eq!(shape.compute_oversubscription(), 2.0);
    let mut p = Packer::new(shape);
    for i in 0..3 {
        p.place_or_open(ReplicaRequest::new(format!("r{i}"), format!("m{i}"), 600, 10_000))
            .unwrap();
    }
    // 1,800 milli of caps on one GPU: twice a GPU's worth was handed out, so they all fit.
    assert_eq!(p.utilization().gpus, 1);
    assert!((p.utilization().compute_ratio - 0.9).abs() < 1e-9);
    // The fourth cap would pass 2,000: a second GPU.
    p.place_or_open(ReplicaRequest::new("r3", "m3", 600, 10_000))
        .unwrap();
    assert_eq!(p.utilization().gpus, 2);
    // A single replica still asks for at most one GPU's worth.
    assert!(matches!(
        p.check(&ReplicaRequest::new("big", "big", 1500, 1)),
        Err(PackError::InvalidCompute { .. })
    ));
    // Memory is never oversubscribed.
    let mut p = Packer::new(shape);
    p.place_or_open(ReplicaRequest::new("a", "a", 100, 60_000))
        .unwrap();
    p.place_or_open(ReplicaRequest::new("b", "b", 100, 60_000))
        .unwrap();
    assert_eq!(p.utilization().gpus, 2);
}

#[test]
fn oversubscription_is_checked() {
    for bad in [0.5, 4.5, f64::NAN, f64::INFINITY, -1.0] {
        let e = SHAPE.with_compute_oversubscription(bad).unwrap_err();
        assert!(
            matches!(e, PackError::InvalidOversubscription { .. }),
            "{bad}: {e}"
        );
        assert!(e.to_string().contains("computeOversubscription"), "{e}");
    }
    assert_eq!(SHAPE.with_compute_oversubscription(1.0).unwrap(), SHAPE);
    assert_eq!(
        default_compute_oversubscription(true),
        DEFAULT_MPS_COMPUTE_OVERSUBSCRIPTION
    );
    assert_eq!(default_compute_oversubscription(false), 1.0);
}
