#![allow(clippy::unwrap_used)]
use super::*;

fn need(kv: u64, util: f64, mib: u64, compute: f64, tag: &str) -> Recommendation {
    let reason = |field| Reason {
        field,
        code: ReasonCode::Percentile,
        message: format!("{tag} {field:?}"),
    };
    Recommendation {
        kv_cache_memory_bytes: kv,
        kv_cache_tokens: kv / 1024,
        gpu_memory_utilization: util,
        gpu_memory_mib: mib,
        compute_fraction: compute,
        bytes_per_kv_token: 1024,
        bytes_per_kv_token_source: Source::Configured,
        non_kv_bytes: 1 << 30,
        non_kv_source: Source::Configured,
        reasons: [Field::KvCacheMemory, Field::GpuMemory, Field::ComputeFraction]
            .into_iter()
            .map(reason)
            .collect(),
    }
}

#[test]
fn largest_need_takes_each_field_from_the_replica_that_asks_most_with_its_reasons() {
    assert!(largest_need(&[]).is_none());
    let a = need(4 << 30, 0.35, 9000, 0.25, "a");
    let b = need(6 << 30, 0.30, 8000, 0.5, "b");
    let n = largest_need([&a, &b]).unwrap();
    assert_eq!(n.kv_cache_memory_bytes, 6 << 30);
    assert_eq!(n.kv_cache_tokens, (6 << 30) / 1024);
    assert_eq!(n.gpu_memory_utilization, 0.35);
    assert_eq!(n.gpu_memory_mib, 9000);
    assert_eq!(n.compute_fraction, 0.5);
    let why = |f: Field| {
        n.reasons
            .iter()
            .filter(|r| r.field == f)
            .map(|r| r.message.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(why(Field::KvCacheMemory), ["b KvCacheMemory"]);
    assert_eq!(why(Field::GpuMemory), ["a GpuMemory"]);
    assert_eq!(why(Field::ComputeFraction), ["b ComputeFraction"]);
    // Order does not matter.
    assert_eq!(
        largest_need([&b, &a]).unwrap().kv_cache_memory_bytes,
        n.kv_cache_memory_bytes
    );
}
use proptest::prelude::*;

const GIB: u64 = 1024 * 1024 * 1024;

/// `n` samples, 10 s apart, with KV usage from `usage(i)`.
fn window(n: usize, usage: impl Fn(usize) -> f64) -> Vec<Observation> {
    (0..n)
        .map(|i| Observation {
            at_secs: 1000.0 + 10.0 * i as f64,
            kv_usage: Some(usage(i)),
            requests_waiting: Some(0.0),
            preemptions_total: Some(0.0),
            sm_utilization: None,
        })
        .collect()
}

fn geometry() -> KvGeometry {
    // Qwen2-7B on an A100-80GB at gpu_memory_utilization 0.25 (memory-profiles.md example 1).
    KvGeometry {
        num_gpu_blocks: 5867,
        block_size: 16,
        max_model_len: Some(16384),
    }
}

fn memory() -> MemoryFacts {
    MemoryFacts {
        gpu_total_bytes: Some(80 * GIB),
        bytes_per_kv_token: Some(57_344), // 2 × 28 layers × 4 kv heads × 128 × 2 bytes
        non_kv_bytes: Some(15 * GIB),
        ..Default::default()
    }
}

fn ready(o: Outcome) -> Recommendation {
    match o {
        Outcome::Ready(r) => r,
        Outcome::NotYet { code, reason } => panic!("expected a recommendation, got {code:?}: {reason}"),
    }
}

fn run(w: &[Observation], mem: MemoryFacts, prev: Option<&Recommendation>) -> Outcome {
    run_with(w, geometry(), mem, prev, &Config::default())
}

/// [`recommend`] with no compute facts.
fn run_with(
    window: &[Observation],
    geometry: KvGeometry,
    memory: MemoryFacts,
    previous: Option<&Recommendation>,
    config: &Config,
) -> Outcome {
    recommend(
        &Input {
            window,
            geometry,
            memory,
            previous,
            compute: ComputeFacts::default(),
        },
        config,
    )
}

/// The code of a [`Outcome::NotYet`], `None` for a recommendation.
fn not_yet_code(o: &Outcome) -> Option<NotYetCode> {
    match o {
        Outcome::NotYet { code, .. } => Some(*code),
        Outcome::Ready(_) => None,
    }
}

fn codes(r: &Recommendation) -> Vec<ReasonCode> {
    r.reasons.iter().map(|r| r.code).collect()
}

#[test]
fn too_little_history_is_not_yet() {
    let o = run(&window(5, |_| 0.3), memory(), None);
    assert_eq!(not_yet_code(&o), Some(NotYetCode::TooFewSamples), "{o:?}");
    // Enough samples but squeezed into 11 s.
    let mut w = window(12, |_| 0.3);
    for (i, o) in w.iter_mut().enumerate() {
        o.at_secs = i as f64;
    }
    let o = run(&w, memory(), None);
    assert_eq!(not_yet_code(&o), Some(NotYetCode::WindowTooShort), "{o:?}");
    // Samples with no KV usage do not count.
    let mut w = window(30, |_| 0.3);
    for o in w.iter_mut().skip(5) {
        o.kv_usage = None;
    }
    let o = run(&w, memory(), None);
    assert_eq!(not_yet_code(&o), Some(NotYetCode::TooFewSamples), "{o:?}");
}

#[test]
fn missing_inputs_are_named() {
    let w = window(30, |_| 0.3);
    let mem = MemoryFacts {
        gpu_total_bytes: None,
        ..memory()
    };
    let o = run(&w, mem, None);
    assert_eq!(not_yet_code(&o), Some(NotYetCode::UnknownGpuMemory), "{o:?}");
    let mem = MemoryFacts {
        bytes_per_kv_token: None,
        ..memory()
    };
    let o = run(&w, mem, None);
    assert!(
        matches!(&o, Outcome::NotYet { code: NotYetCode::UnknownBytesPerKvToken, reason }
        if reason.contains("--bytes-per-kv-token")),
        "{o:?}"
    );
    let mem = MemoryFacts {
        non_kv_bytes: None,
        ..memory()
    };
    let o = run(&w, mem, None);
    assert_eq!(not_yet_code(&o), Some(NotYetCode::UnknownNonKvMemory), "{o:?}");
    let g = KvGeometry {
        num_gpu_blocks: 0,
        ..geometry()
    };
    let o = run_with(&w, g, memory(), None, &Config::default());
    assert_eq!(not_yet_code(&o), Some(NotYetCode::UnknownKvGeometry), "{o:?}");
    let bad = Config {
        percentile: 1.5,
        ..Config::default()
    };
    let o = run_with(&w, geometry(), memory(), None, &bad);
    assert!(
        matches!(&o, Outcome::NotYet { code: NotYetCode::InvalidConfig, reason }
        if reason.contains("percentile")),
        "{o:?}"
    );
}

#[test]
fn shrinks_in_bounded_steps_and_converges_on_percentile_plus_headroom() {
    let w = window(60, |i| if i % 10 == 0 { 0.35 } else { 0.25 });
    let tokens = geometry().tokens();
    let first = ready(run(&w, memory(), None));
    // Target is 0.35 × 1.2 = 42% (the p95 is 0.35), but one step may only shrink 10%.
    assert_eq!(
        first.kv_cache_tokens,
        (tokens as f64 * 0.9).ceil() as u64 / 16 * 16 + 16
    );
    assert!(codes(&first).contains(&ReasonCode::StepLimitedDown));
    let mut prev = first;
    for _ in 0..30 {
        prev = ready(run(&w, memory(), Some(&prev)));
    }
    let want = (0.35 * 1.2 * tokens as f64).ceil() as u64;
    assert!(
        prev.kv_cache_tokens >= want && prev.kv_cache_tokens < want + 16,
        "{}",
        prev.kv_cache_tokens
    );
    assert_eq!(
        codes(&prev),
        vec![
            ReasonCode::Percentile,
            ReasonCode::KvPlusNonKv,
            ReasonCode::NoLatencyObjective
        ]
    );
    assert_eq!(prev.kv_cache_memory_bytes, prev.kv_cache_tokens * 57_344);
    let need = 15 * GIB + prev.kv_cache_memory_bytes;
    assert_eq!(prev.gpu_memory_mib, need.div_ceil(MIB));
    assert!(prev.gpu_memory_utilization >= need as f64 / (80 * GIB) as f64);
    assert!(prev.gpu_memory_utilization <= need as f64 / (80 * GIB) as f64 + 0.01);
    assert_eq!(prev.compute_fraction, 1.0);
    assert!(!prev.summary().is_empty());
}

#[test]
fn a_lone_peak_above_percentile_sets_the_floor() {
    // One sample at 90%, the rest at 10%: p95 + 20% = 12%, but the window used 90%.
    let w = window(60, |i| if i == 30 { 0.9 } else { 0.1 });
    let mut prev = ready(run(&w, memory(), None));
    for _ in 0..30 {
        prev = ready(run(&w, memory(), Some(&prev)));
    }
    let peak = (0.9 * geometry().tokens() as f64).ceil() as u64;
    assert!(prev.kv_cache_tokens >= peak);
    assert!(codes(&prev).contains(&ReasonCode::ObservedPeak));
}

#[test]
fn preemptions_grow_and_never_shrink() {
    let mut w = window(30, |_| 0.2);
    for (i, o) in w.iter_mut().enumerate() {
        o.preemptions_total = Some(if i < 20 { 4.0 } else { 5.0 });
    }
    let r = ready(run(&w, memory(), None));
    assert!(
        r.kv_cache_tokens as f64 >= geometry().tokens() as f64 * 1.2,
        "{}",
        r.kv_cache_tokens
    );
    assert!(codes(&r).contains(&ReasonCode::Preemptions));
    // A counter reset (server restart) is an increase, not a negative delta.
    let mut w = window(30, |_| 0.2);
    for (i, o) in w.iter_mut().enumerate() {
        o.preemptions_total = Some(if i < 20 { 7.0 } else { 1.0 });
    }
    assert!(codes(&ready(run(&w, memory(), None))).contains(&ReasonCode::Preemptions));
}

#[test]
fn waiting_at_full_kv_grows() {
    let mut w = window(30, |_| 0.5);
    w[10].kv_usage = Some(0.97);
    w[10].requests_waiting = Some(3.0);
    let r = ready(run(&w, memory(), None));
    assert!(codes(&r).contains(&ReasonCode::WaitingAtFullKv));
    assert!(r.kv_cache_tokens > geometry().tokens());
}

#[test]
fn growth_is_step_bounded_and_clamped_to_the_gpu() {
    let mut w = window(30, |_| 1.0);
    w[3].preemptions_total = Some(50.0);
    // A small previous recommendation: the step is from max(previous, current) under pressure.
    let g = KvGeometry {
        num_gpu_blocks: 40_000,
        block_size: 16,
        max_model_len: None,
    };
    let r = ready(run_with(&w, g, memory(), None, &Config::default()));
    // 640,000 tokens × 57,344 B = 34.2 GiB; +20% = 41 GiB; GPU cap is 0.95 × 80 − 15 = 61 GiB: fits.
    assert!(r.kv_cache_tokens >= 768_000);
    // A GPU that holds what runs now (34.2 + 15 GiB) but not the 41 GiB of KV wanted: 0.95 × 56 − 15 = 38.2 GiB.
    let small_gpu = MemoryFacts {
        gpu_total_bytes: Some(56 * GIB),
        ..memory()
    };
    let r = ready(run_with(&w, g, small_gpu, None, &Config::default()));
    assert!(codes(&r).contains(&ReasonCode::ClampedToGpu), "{:?}", r.reasons);
    assert!(15 * GIB + r.kv_cache_memory_bytes <= (0.95 * (56 * GIB) as f64) as u64);
    assert!(r.gpu_memory_utilization <= 0.95);
    // The step limit caps growth at ×2 of the reference.
    let cfg = Config {
        headroom: 3.0,
        ..Config::default()
    };
    let r = ready(run_with(&w, g, memory(), None, &cfg));
    assert!(codes(&r).contains(&ReasonCode::StepLimitedUp) || codes(&r).contains(&ReasonCode::ClampedToGpu));
    assert!(r.kv_cache_tokens <= 2 * g.tokens());
}

#[test]
fn holds_one_max_model_len_sequence() {
    let g = KvGeometry {
        num_gpu_blocks: 2000,
        block_size: 16,
        max_model_len: Some(32_768),
    };
    let w = window(30, |_| 0.0);
    let mut prev: Option<Recommendation> = None;
    for _ in 0..40 {
        prev = Some(ready(run_with(
            &w,
            g,
            memory(),
            prev.as_ref(),
            &Config::default(),
        )));
    }
    let r = prev.unwrap();
    assert_eq!(r.kv_cache_tokens, 32_768);
    assert!(codes(&r).contains(&ReasonCode::MinimumSequence));
}

/// With the replica count's KV target (0.7), an idle window settles at one max_model_len sequence *below* it
/// (32,768 / 0.7 → 46,812 tokens, rounded up to whole blocks), and the reason says why; an out-of-range target
/// makes the recommendation `not_yet` with the setting named (the sidecar refuses the flag at start).
#[test]
fn holds_one_max_model_len_sequence_below_the_replica_counts_kv_target() {
    let g = KvGeometry {
        num_gpu_blocks: 2000,
        block_size: 16,
        max_model_len: Some(32_768),
    };
    let w = window(30, |_| 0.0);
    let settle = |cfg: &Config| {
        let mut prev: Option<Recommendation> = None;
        for _ in 0..40 {
            prev = Some(ready(run_with(&w, g, memory(), prev.as_ref(), cfg)));
        }
        prev.unwrap()
    };
    let cfg = Config {
        kv_target_utilization: Some(0.7),
        ..Config::default()
    };
    assert!(cfg.validate().is_ok());
    let r = settle(&cfg);
    assert_eq!(r.kv_cache_tokens, 46_816, "46,812 rounded up to 16-token blocks");
    assert!(
        r.reasons.iter().any(|x| x.code == ReasonCode::MinimumSequence
            && x.message.contains("below the replica count's KV target (70%)")),
        "{:?}",
        r.reasons
    );
    // A sequence used for real still wins over the floor, and so does a target of 1 (no room asked for).
    let whole = Config {
        kv_target_utilization: Some(1.0),
        ..Config::default()
    };
    assert_eq!(settle(&whole).kv_cache_tokens, 32_768);
    for bad in [0.0, -0.5, 1.5, f64::NAN] {
        let c = Config {
            kv_target_utilization: Some(bad),
            ..Config::default()
        };
        assert!(c.validate().is_err(), "{bad}");
        assert!(
            matches!(
                run_with(&w, g, memory(), None, &c),
                Outcome::NotYet {
                    code: NotYetCode::InvalidConfig,
                    ..
                }
            ),
            "{bad}"
        );
    }
}

/// A compute window: `n` samples 10 s apart, busy `busy`, `waiting` requests waiting.
fn cwin(n: usize, busy: Option<f64>, waiting: f64) -> Vec<Observation> {
    (0..n)
        .map(|i| Observation {
            at_secs: 10.0 * i as f64,
            kv_usage: Some(0.3),
            requests_waiting: Some(waiting),
            preemptions_total: Some(0.0),
            sm_utilization: busy,
        })
        .collect()
}

fn lat(p95: f64, samples: f64) -> Option<LatencyObservation> {
    Some(LatencyObservation {
        p95_secs: p95,
        samples,
    })
}

fn facts(current: Option<f64>, ttft_slo: Option<f64>, ttft: Option<LatencyObservation>) -> ComputeFacts {
    ComputeFacts {
        current_share: current,
        ttft_slo_secs: ttft_slo,
        ttft,
        ..Default::default()
    }
}

fn ccodes(d: &ComputeDecision) -> Vec<ReasonCode> {
    d.reasons.iter().map(|r| r.code).collect()
}

#[test]
fn busy_time_alone_never_sets_the_share() {
    // The old rule's failure: one request in flight keeps a decode-bound GPU busy 100% of the time, and a
    // quiet window reads 0% busy. Neither is evidence about the share it needs: without an objective the share
    // stays where it is (whole GPU by default), with no saturation (nothing waited).
    let cfg = Config::default();
    for busy in [Some(1.0), Some(0.0), None] {
        let d = recommend_compute(&cwin(60, busy, 0.0), &ComputeFacts::default(), None, &cfg);
        assert_eq!(d.share, 1.0, "{busy:?}");
        assert_eq!(ccodes(&d), vec![ReasonCode::NoLatencyObjective]);
        let d = recommend_compute(&cwin(60, busy, 0.0), &facts(Some(0.4), None, None), None, &cfg);
        assert_eq!(d.share, 0.4);
    }
    // Through `recommend`: the whole GPU by default.
    let r = ready(run(&window(30, |_| 0.3), memory(), None));
    assert_eq!(r.compute_fraction, 1.0);
}

#[test]
fn fast_ttft_shrinks_in_bounded_steps_toward_half_the_objective() {
    let cfg = Config::default();
    // Whole GPU, TTFT p95 0.1 s against a 2 s objective (target 1 s): wants 0.1, a step may take 25%.
    let w = cwin(60, Some(1.0), 0.0);
    let d = recommend_compute(&w, &facts(None, Some(2.0), lat(0.1, 500.0)), None, &cfg);
    assert_eq!(d.share, 0.75);
    assert_eq!(
        ccodes(&d),
        vec![ReasonCode::LatencyUnderObjective, ReasonCode::StepLimitedDown]
    );
    // Compounding from the previous recommendation while latency keeps showing room (it was measured at
    // the whole GPU: ratio 0.1): 0.75 → 0.57 → 0.43 → ...
    let d2 = recommend_compute(&w, &facts(None, Some(2.0), lat(0.1, 500.0)), Some(d.share), &cfg);
    assert_eq!(d2.share, 0.57);
    // TTFT at share 0.25 is 0.8 s: ratio 0.8 → 0.20 (within the 25% step from 0.25).
    let d = recommend_compute(&w, &facts(Some(0.25), Some(2.0), lat(0.8, 500.0)), None, &cfg);
    assert_eq!(d.share, 0.2);
    assert_eq!(ccodes(&d), vec![ReasonCode::LatencyUnderObjective]);
    // Within ±10% of the target: no change.
    let d = recommend_compute(&w, &facts(Some(0.25), Some(2.0), lat(1.05, 500.0)), None, &cfg);
    assert_eq!(d.share, 0.25);
    assert_eq!(ccodes(&d), vec![ReasonCode::LatencyWithinObjective]);
}

#[test]
fn latency_over_the_objective_grows_and_the_step_is_bounded() {
    let cfg = Config::default();
    let w = cwin(60, Some(1.0), 0.0);
    // 1.5 s against a 1 s target at 0.2: 0.30.
    let d = recommend_compute(&w, &facts(Some(0.2), Some(2.0), lat(1.5, 100.0)), None, &cfg);
    assert_eq!(d.share, 0.3);
    assert_eq!(ccodes(&d), vec![ReasonCode::LatencyOverObjective]);
    // 10 s: ×10 wanted, ×2 allowed.
    let d = recommend_compute(&w, &facts(Some(0.2), Some(2.0), lat(10.0, 100.0)), None, &cfg);
    assert_eq!(d.share, 0.4);
    assert!(ccodes(&d).contains(&ReasonCode::StepLimitedUp));
    // Over the objective never goes below the previous recommendation, even one above the current share.
    let d = recommend_compute(&w, &facts(Some(0.2), Some(2.0), lat(1.5, 100.0)), Some(0.6), &cfg);
    assert_eq!(d.share, 0.6);
    // Never above the whole GPU.
    let d = recommend_compute(&w, &facts(Some(0.9), Some(2.0), lat(9.0, 100.0)), None, &cfg);
    assert_eq!(d.share, 1.0);
}

#[test]
fn the_inter_token_objective_counts_and_the_larger_need_wins() {
    let cfg = Config::default();
    let w = cwin(60, Some(1.0), 0.0);
    // TTFT has room (ratio 0.3), but decode steps at 0.3 give 60 ms ITL against a 100 ms objective
    // (target 50 ms): ratio 1.2 → grow.
    let f = ComputeFacts {
        current_share: Some(0.3),
        ttft_slo_secs: Some(2.0),
        itl_slo_secs: Some(0.1),
        ttft: lat(0.3, 200.0),
        itl: lat(0.06, 20_000.0),
    };
    let d = recommend_compute(&w, &f, None, &cfg);
    assert_eq!(d.share, 0.36);
    assert!(d.reasons[0].message.contains("inter-token"), "{:?}", d.reasons);
    // Both under: the one asking the most decides (ITL ratio 0.8 beats TTFT 0.3).
    let f = ComputeFacts {
        itl: lat(0.04, 20_000.0),
        ..f
    };
    assert_eq!(recommend_compute(&w, &f, None, &cfg).share, 0.24);
    // ITL objective with no ITL data: no shrink, even though TTFT has room.
    let f = ComputeFacts { itl: None, ..f };
    let d = recommend_compute(&w, &f, None, &cfg);
    assert_eq!(d.share, 0.3);
    assert_eq!(ccodes(&d), vec![ReasonCode::TooFewLatencySamples]);
}

#[test]
fn idle_or_missing_latency_keeps_the_share() {
    let cfg = Config::default();
    // The old rule's other failure: a quiet window took a bursty model to 0.05. Now: kept.
    let w = cwin(60, Some(0.0), 0.0);
    for ttft in [None, lat(0.05, 3.0), lat(f64::NAN, 500.0)] {
        let d = recommend_compute(&w, &facts(Some(0.5), Some(2.0), ttft), None, &cfg);
        assert_eq!(d.share, 0.5, "{ttft:?}");
        assert_eq!(ccodes(&d), vec![ReasonCode::TooFewLatencySamples]);
        // With a previous recommendation, that one is kept (the replica may still run an older share).
        let d = recommend_compute(&w, &facts(Some(0.5), Some(2.0), ttft), Some(0.7), &cfg);
        assert_eq!(d.share, 0.7);
    }
    // Unknown current share = the whole GPU.
    let d = recommend_compute(&w, &facts(None, Some(2.0), None), None, &cfg);
    assert_eq!(d.share, 1.0);
}

#[test]
fn saturation_at_the_share_grows() {
    let cfg = Config::default();
    // Busy all the time with requests waiting at 0.3, TTFT fine: saturation wins over the latency room.
    let w = cwin(60, Some(1.0), 3.0);
    let d = recommend_compute(&w, &facts(Some(0.3), Some(2.0), lat(0.2, 500.0)), None, &cfg);
    assert_eq!(d.share, 0.6);
    assert!(ccodes(&d).contains(&ReasonCode::ComputeSaturated));
    // Preemptions while requests wait count too (no busy data).
    let mut w = cwin(60, None, 2.0);
    for (i, o) in w.iter_mut().enumerate() {
        o.preemptions_total = Some(i as f64);
    }
    let d = recommend_compute(&w, &facts(Some(0.4), None, None), None, &cfg);
    assert_eq!(d.share, 0.8);
    // One transient sample out of sixty is not saturation.
    let mut w = cwin(60, Some(1.0), 0.0);
    w[7].requests_waiting = Some(1.0);
    let d = recommend_compute(&w, &facts(Some(0.3), None, None), None, &cfg);
    assert_eq!(d.share, 0.3);
}

#[test]
fn compute_reasons_reach_the_recommendation() {
    let w = window(30, |_| 0.3);
    let out = recommend(
        &Input {
            window: &w,
            geometry: geometry(),
            memory: memory(),
            previous: None,
            compute: facts(Some(0.5), Some(2.0), lat(0.25, 400.0)),
        },
        &Config::default(),
    );
    let r = ready(out);
    // 0.5 × 0.25 = 0.125, bounded to 0.375 → 0.38.
    assert_eq!(r.compute_fraction, 0.38);
    assert!(
        r.reasons
            .iter()
            .any(|x| x.field == Field::ComputeFraction && x.code == ReasonCode::LatencyUnderObjective)
    );
    assert!(
        r.summary().contains("compute share shrink limited"),
        "{}",
        r.summary()
    );
}

fn arb_compute() -> impl Strategy<Value = (Vec<Observation>, ComputeFacts, Option<f64>)> {
    let opt_share = prop::option::of(prop_oneof![0.01f64..=1.0, Just(1.0), Just(0.0), Just(f64::NAN)]);
    let opt_lat = prop::option::of((0.0f64..30.0, 0.0f64..1000.0))
        .prop_map(|l| l.map(|(p95_secs, samples)| LatencyObservation { p95_secs, samples }));
    (
        prop::collection::vec(
            (
                prop::option::of(0.0f64..=1.0),
                prop::option::of(0.0f64..4.0),
                any::<bool>(),
            ),
            0..60,
        ),
        opt_share.clone(),
        prop::option::of(0.05f64..20.0),
        prop::option::of(0.01f64..1.0),
        opt_lat.clone(),
        opt_lat,
        opt_share,
    )
        .prop_map(|(samples, current, ttft_slo, itl_slo, ttft, itl, prev)| {
            let mut pre = 0.0;
            let w = samples
                .iter()
                .enumerate()
                .map(|(i, (busy, wait, preempt))| {
                    if *preempt {
                        pre += 1.0;
                    }
                    Observation {
                        at_secs: 5.0 * i as f64,
                        kv_usage: Some(0.5),
                        requests_waiting: wait.map(f64::floor),
                        preemptions_total: Some(pre),
                        sm_utilization: *busy,
                    }
                })
                .collect();
            let f = ComputeFacts {
                current_share: current,
                ttft_slo_secs: ttft_slo,
                itl_slo_secs: itl_slo,
                ttft,
                itl,
            };
            (w, f, prev)
        })
}

/// What "keep" means: the previous recommendation, else the current share, else the whole GPU.
fn reference(f: &ComputeFacts, prev: Option<f64>) -> f64 {
    let ok = |v: &f64| v.is_finite() && *v > 0.0;
    let current = f.current_share.filter(ok).map_or(1.0, |s| s.min(1.0));
    prev.filter(ok).map_or(current, |s| s.min(1.0))
}

fn current_of(f: &ComputeFacts) -> f64 {
    f.current_share
        .filter(|v| v.is_finite() && *v > 0.0)
        .map_or(1.0, |s| s.min(1.0))
}

proptest! {
    #[test]
    fn compute_share_stays_in_bounds_and_steps((w, f, prev) in arb_compute()) {
        let cfg = Config::default();
        let d = recommend_compute(&w, &f, prev, &cfg);
        prop_assert!(d.share >= cfg.min_compute_fraction && d.share <= 1.0, "{}", d.share);
        prop_assert!(!d.reasons.is_empty());
        prop_assert!(d.reasons.iter().all(|r| r.field == Field::ComputeFraction));
        let r = reference(&f, prev);
        let c = current_of(&f);
        // Each step within its bound (a grow signal may lift to what runs now; rounding adds < 0.01).
        let lower = (r * (1.0 - cfg.compute_max_step_down_ratio)).max(cfg.min_compute_fraction);
        let upper = (r * cfg.compute_max_step_up).max(c).min(1.0).max(cfg.min_compute_fraction);
        prop_assert!(d.share >= lower.min(1.0) - 1e-9, "{} < {lower}", d.share);
        prop_assert!(d.share <= upper + 0.01 + 1e-9, "{} > {upper}", d.share);
    }

    #[test]
    fn missing_latency_never_lowers_it((w, f, prev) in arb_compute()) {
        let cfg = Config::default();
        // Same window and objectives, but the latency unseen (idle or missing data).
        let f = ComputeFacts { ttft: None, itl: None, ..f };
        let d = recommend_compute(&w, &f, prev, &cfg);
        prop_assert!(d.share >= reference(&f, prev).max(cfg.min_compute_fraction) - 1e-9,
            "{} < {}: {:?}", d.share, reference(&f, prev), d.reasons);
    }

    #[test]
    fn latency_over_the_objective_never_lowers_it((w, f, prev) in arb_compute(), over in 1.11f64..50.0) {
        let cfg = Config::default();
        let slo = f.ttft_slo_secs.unwrap_or(2.0);
        let f = ComputeFacts {
            ttft_slo_secs: Some(slo),
            ttft: lat(over * cfg.latency_target_ratio * slo, 1000.0),
            ..f
        };
        let d = recommend_compute(&w, &f, prev, &cfg);
        let floor = reference(&f, prev).max(current_of(&f)).max(cfg.min_compute_fraction);
        prop_assert!(d.share >= floor - 1e-9, "{} < {floor}", d.share);
    }

    #[test]
    fn saturation_never_lowers_it((w, f, prev) in arb_compute()) {
        let cfg = Config::default();
        let base = recommend_compute(&w, &f, prev, &cfg);
        let sat = cwin(w.len().max(12), Some(1.0), 2.0);
        let d = recommend_compute(&sat, &f, prev, &cfg);
        let floor = reference(&f, prev).max(current_of(&f)).max(cfg.min_compute_fraction);
        prop_assert!(d.share >= floor - 1e-9, "{} < {floor}", d.share);
        prop_assert!(ccodes(&d).contains(&ReasonCode::ComputeSaturated));
        // And never below what the same facts give without saturation.
        let calm = cwin(w.len().max(12), Some(1.0), 0.0);
        prop_assert!(d.share >= recommend_compute(&calm, &f, prev, &cfg).share - 1e-9);
        let _ = base;
    }

    #[test]
    fn worse_latency_never_gives_a_smaller_share(
        (w, f, prev) in arb_compute(), a in 0.0f64..20.0, b in 0.0f64..20.0, n in 20.0f64..5000.0,
    ) {
        let cfg = Config::default();
        let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
        let slo = f.ttft_slo_secs.unwrap_or(2.0);
        let with = |p95: f64| ComputeFacts { ttft_slo_secs: Some(slo), ttft: lat(p95, n), ..f };
        let s_lo = recommend_compute(&w, &with(lo), prev, &cfg).share;
        let s_hi = recommend_compute(&w, &with(hi), prev, &cfg).share;
        prop_assert!(s_hi >= s_lo - 1e-9, "p95 {lo} → {s_lo}, p95 {hi} → {s_hi}");
    }
}

#[test]
fn outcome_json_is_tagged() {
    let o = not_yet(NotYetCode::TooFewSamples, "x");
    let j = serde_json::to_value(&o).unwrap();
    assert_eq!(j["state"], "not_yet");
    assert_eq!(j["code"], "too_few_samples");
    let r = run(&window(30, |_| 0.4), memory(), None);
    let back: Outcome = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
    assert_eq!(back, r);
}

fn arb_case() -> impl Strategy<Value = (Vec<Observation>, KvGeometry, MemoryFacts, Option<u64>)> {
    (
        prop::collection::vec((prop_oneof![0.0f64..=1.0, 0.0f64..0.3], 0.0f64..5.0), 12..80),
        1u64..50_000,
        prop::sample::select(vec![1u64, 16, 32]),
        prop::option::of(1u64..200_000),
        1_000u64..200_000,
        1u64..200,
        0u64..100,
        prop::option::of(1u64..1_000_000),
        // A lone spike above the rest, so the observed peak often exceeds percentile + headroom.
        prop::option::of((0usize..80, 0.0f64..=1.0)),
    )
        .prop_map(
            |(mut samples, blocks, bs, mml, bpt, total_gib, non_kv_pct, prev, spike)| {
                if let Some((at, v)) = spike {
                    let n = samples.len();
                    samples[at % n].0 = v;
                }
                let w = samples
                    .iter()
                    .enumerate()
                    .map(|(i, (u, wait))| Observation {
                        at_secs: 10.0 * i as f64,
                        kv_usage: Some(*u),
                        requests_waiting: Some(wait.floor()),
                        preemptions_total: Some(0.0),
                        sm_utilization: None,
                    })
                    .collect();
                let total = total_gib * GIB;
                let non_kv = total / 100 * non_kv_pct.min(94);
                let mem = MemoryFacts {
                    gpu_total_bytes: Some(total),
                    bytes_per_kv_token: Some(bpt),
                    non_kv_bytes: Some(non_kv),
                    ..Default::default()
                };
                // The cache that runs now fits beside the non-KV memory (it ran on this GPU): a case where it
                // does not is implausible, and `tests_memory` covers that it is refused.
                let fits = (total - non_kv) / (bs * bpt);
                let g = KvGeometry {
                    num_gpu_blocks: blocks.min(fits).max(1),
                    block_size: bs,
                    max_model_len: mml,
                };
                (w, g, mem, prev)
            },
        )
}

fn prev_rec(tokens: Option<u64>) -> Option<Recommendation> {
    tokens.map(|t| Recommendation {
        kv_cache_memory_bytes: 0,
        kv_cache_tokens: t,
        gpu_memory_utilization: 0.0,
        gpu_memory_mib: 0,
        compute_fraction: 1.0,
        bytes_per_kv_token: 1,
        bytes_per_kv_token_source: Source::Configured,
        non_kv_bytes: 0,
        non_kv_source: Source::Configured,
        reasons: vec![],
    })
}

proptest! {
    #[test]
    fn always_within_the_gpu((w, g, mem, prev) in arb_case()) {
        let p = prev_rec(prev);
        let cfg = Config::default();
        // Complete inputs always give a recommendation, so a not-yet here is a failure, not a pass.
        let out = run_with(&w, g, mem, p.as_ref(), &cfg);
        let r = out.recommendation().expect("complete inputs always give a recommendation");
        let total = mem.gpu_total_bytes.unwrap();
        prop_assert!(r.non_kv_bytes + r.kv_cache_memory_bytes <= (cfg.max_gpu_memory_utilization * total as f64) as u64);
        prop_assert!(r.gpu_memory_utilization <= cfg.max_gpu_memory_utilization + 1e-12);
        prop_assert!(r.gpu_memory_utilization * total as f64 >= (r.non_kv_bytes + r.kv_cache_memory_bytes) as f64 - 1.0);
        prop_assert!((r.gpu_memory_mib * MIB) >= r.non_kv_bytes + r.kv_cache_memory_bytes);
        prop_assert!(r.compute_fraction > 0.0 && r.compute_fraction <= 1.0);
        prop_assert_eq!(r.kv_cache_memory_bytes % (g.block_size * r.bytes_per_kv_token), 0);
    }

    #[test]
    fn never_below_observed_peak_when_it_fits((w, g, mem, prev) in arb_case()) {
        let p = prev_rec(prev);
        let cfg = Config::default();
        let out = run_with(&w, g, mem, p.as_ref(), &cfg);
        let r = out.recommendation().expect("complete inputs always give a recommendation");
        let peak = w.iter().filter_map(|o| o.kv_usage).fold(0.0, f64::max);
        let peak_tokens = (peak * g.tokens() as f64).ceil() as u64;
        let room = (cfg.max_gpu_memory_utilization * mem.gpu_total_bytes.unwrap() as f64) as u64
            - mem.non_kv_bytes.unwrap();
        let fits = peak_tokens.div_ceil(g.block_size) * g.block_size * mem.bytes_per_kv_token.unwrap() <= room;
        if fits {
            prop_assert!(r.kv_cache_tokens >= peak_tokens, "{} < {}", r.kv_cache_tokens, peak_tokens);
        } else {
            prop_assert!(r.reasons.iter().any(|x| x.code == ReasonCode::ClampedToGpu));
        }
    }

    #[test]
    fn more_preemptions_never_shrink_it((w, g, mem, prev) in arb_case(), at in 0usize..80, n in 1.0f64..100.0) {
        let p = prev_rec(prev);
        let cfg = Config::default();
        let base = run_with(&w, g, mem, p.as_ref(), &cfg);
        let mut w2 = w.clone();
        let at = at % w2.len();
        for o in w2.iter_mut().skip(at) {
            o.preemptions_total = Some(n);
        }
        let more = run_with(&w2, g, mem, p.as_ref(), &cfg);
        let (a, b) = (base.recommendation().unwrap(), more.recommendation().unwrap());
        prop_assert!(b.kv_cache_tokens >= a.kv_cache_tokens);
        if at > 0 {
            // A preemption is pressure: never below what runs now or the previous recommendation (if they fit).
            let room = (cfg.max_gpu_memory_utilization * mem.gpu_total_bytes.unwrap() as f64) as u64
                - mem.non_kv_bytes.unwrap();
            let floor = g.tokens().max(prev.unwrap_or(0));
            if floor * mem.bytes_per_kv_token.unwrap() <= room {
                prop_assert!(b.kv_cache_tokens >= floor);
            }
        }
    }

    #[test]
    fn short_windows_are_not_yet(n in 0usize..12, (w, g, mem, _prev) in arb_case()) {
        let cfg = Config::default();
        let out = run_with(&w[..n.min(w.len())], g, mem, None, &cfg);
        prop_assert!(
            matches!(out, Outcome::NotYet { code: NotYetCode::TooFewSamples, .. }),
            "{:?}", out
        );
    }
}

/// The share's last rule: with the pool's compute oversubscription known, the share is never below what the
/// replica's GPU memory already pays for (`oversubscription × memory / GPU memory`, rounded down to hundredths),
/// the reason names the numbers; a share above it is untouched; without the setting nothing changes; the setting is
/// validated to [1, 4].
#[test]
fn the_share_is_never_below_what_the_replicas_memory_pays_for() {
    let w = cwin(60, Some(1.0), 0.0);
    // Share 0.25 with TTFT 0.1 s against a 2 s objective: the latency rule takes it to 0.19 (a 25% step).
    let input = |c: &Config| {
        recommend(
            &Input {
                window: &w,
                geometry: geometry(),
                memory: memory(),
                previous: None,
                compute: facts(Some(0.25), Some(2.0), lat(0.1, 500.0)),
            },
            c,
        )
    };
    let plain = ready(input(&Config::default()));
    assert_eq!(plain.compute_fraction, 0.19);
    assert!(!codes(&plain).contains(&ReasonCode::MemoryPaysForShare));
    for o in [1.0, 2.0, 4.0] {
        let cfg = Config {
            compute_oversubscription: Some(o),
            ..Config::default()
        };
        assert!(cfg.validate().is_ok());
        let r = ready(input(&cfg));
        assert_eq!(r.gpu_memory_mib, plain.gpu_memory_mib, "memory is not touched");
        let paid = ((o * r.gpu_memory_mib as f64 / (80.0 * 1024.0) * 100.0).floor() / 100.0).min(1.0);
        assert!(paid > 0.19, "the example must exercise the floor ({paid})");
        assert!(
            (r.compute_fraction - paid).abs() < 1e-9,
            "{o}: {} vs {paid}",
            r.compute_fraction
        );
        let why = r
            .reasons
            .iter()
            .find(|x| x.code == ReasonCode::MemoryPaysForShare)
            .expect("reason");
        assert_eq!(why.field, Field::ComputeFraction);
        assert!(why.message.contains(&format!("{paid:.2}")), "{}", why.message);
    }
    // A share the latency rule already puts above the floor is kept: 1.5 s over a 1 s target at 0.6 → 0.9.
    let cfg = Config {
        compute_oversubscription: Some(2.0),
        ..Config::default()
    };
    let r = ready(recommend(
        &Input {
            window: &w,
            geometry: geometry(),
            memory: memory(),
            previous: None,
            compute: facts(Some(0.6), Some(2.0), lat(1.5, 100.0)),
        },
        &cfg,
    ));
    assert_eq!(r.compute_fraction, 0.9);
    assert!(!codes(&r).contains(&ReasonCode::MemoryPaysForShare));
    for bad in [0.5, 4.5, f64::NAN] {
        let c = Config {
            compute_oversubscription: Some(bad),
            ..Config::default()
        };
        assert!(c.validate().is_err(), "{bad}");
    }
}
