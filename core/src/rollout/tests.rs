#![allow(clippy::unwrap_used)]

use proptest::prelude::*;

use super::*;

const MIN: u64 = 60_000;

fn cfg() -> RolloutConfig {
    RolloutConfig {
        stability_window: Duration::from_secs(30 * 60),
        ..RolloutConfig::default()
    }
}

fn alloc(memory_mib: u64, compute_fraction: f64) -> Allocation {
    Allocation::new(memory_mib, compute_fraction)
}

fn input(in_force: Allocation, pods: Vec<Option<Allocation>>) -> RollInput {
    RollInput {
        mode: UpdateMode::Recreate,
        in_force: Some(in_force),
        workload: Workload {
            replicas: pods.len() as i32,
            ready_replicas: pods.len() as i32,
            desired_replicas: pods.len() as i32,
            min_replicas: 1,
            ..Workload::default()
        },
        pods,
        drift_since_ms: Some(0),
        urgency: Urgency::default(),
        template_at_in_force: false,
        now_ms: 31 * MIN,
    }
}

#[test]
fn roll_a_shrink_waits_for_the_window_then_rolls() {
    let mut i = input(alloc(20_000, 0.3), vec![Some(alloc(40_000, 0.3)); 2]);
    i.drift_since_ms = Some(2 * MIN);
    assert_eq!(decide_roll(&i, &cfg()), RollDecision::Hold(HoldReason::Settling));
    i.now_ms = 32 * MIN;
    assert_eq!(decide_roll(&i, &cfg()), RollDecision::Roll(RollReason::Shrink));
}

#[test]
fn roll_a_growth_that_prevents_preemptions_is_prompt() {
    let mut i = input(alloc(40_000, 0.3), vec![Some(alloc(20_000, 0.3)); 2]);
    i.drift_since_ms = Some(i.now_ms);
    assert_eq!(decide_roll(&i, &cfg()), RollDecision::Hold(HoldReason::Settling));
    i.urgency.preempting = true;
    assert_eq!(
        decide_roll(&i, &cfg()),
        RollDecision::Roll(RollReason::UrgentGrowth)
    );
}

#[test]
fn roll_a_compute_growth_while_over_the_ttft_objective_is_prompt() {
    // A pod started on a 0.5 share while 0.8 is in force: a drift that would wait the window...
    let mut i = input(
        alloc(20_000, 0.8),
        vec![Some(alloc(20_000, 0.5)), Some(alloc(20_000, 0.8))],
    );
    i.drift_since_ms = Some(i.now_ms);
    assert_eq!(decide_roll(&i, &cfg()), RollDecision::Hold(HoldReason::Settling));
    // ... rolls at once while a replica is over the TTFT objective.
    i.urgency.ttft_over_slo = true;
    assert_eq!(
        decide_roll(&i, &cfg()),
        RollDecision::Roll(RollReason::UrgentGrowth)
    );
    // Each urgency urges its own dimension: preemptions do not hurry a compute drift, nor latency a memory one.
    i.urgency = Urgency {
        preempting: true,
        ttft_over_slo: false,
    };
    assert_eq!(decide_roll(&i, &cfg()), RollDecision::Hold(HoldReason::Settling));
    let mut m = input(alloc(40_000, 0.5), vec![Some(alloc(20_000, 0.5)); 2]);
    m.drift_since_ms = Some(m.now_ms);
    m.urgency.ttft_over_slo = true;
    assert_eq!(decide_roll(&m, &cfg()), RollDecision::Hold(HoldReason::Settling));
}

#[test]
fn in_force_a_compute_growth_is_urgent_only_over_the_ttft_objective_and_never_shrinks_memory() {
    let c = cfg();
    let previous = alloc(30_000, 0.5);
    // The candidate grows compute and shrinks memory; two minutes old, far from stable.
    let cand = track(None, Some(alloc(20_000, 0.8)), None, 0, &c).unwrap();
    let calm = in_force(
        &Fixed::default(),
        Some(&cand),
        Some(previous),
        Urgency::default(),
        2 * MIN,
        &c,
    );
    assert_eq!(calm, (Some(previous), InForceReason::Settling));
    let slow = Urgency {
        preempting: false,
        ttft_over_slo: true,
    };
    let (force, why) = in_force(&Fixed::default(), Some(&cand), Some(previous), slow, 2 * MIN, &c);
    assert_eq!(why, InForceReason::UrgentGrowth);
    // The share comes into force now; the memory shrink still waits for the window.
    assert_eq!(force, Some(alloc(30_000, 0.8)));
    // A candidate that does not grow compute is not hurried by latency.
    let smaller = track(None, Some(alloc(20_000, 0.4)), None, 0, &c).unwrap();
    let (_, why) = in_force(
        &Fixed::default(),
        Some(&smaller),
        Some(previous),
        slow,
        2 * MIN,
        &c,
    );
    assert_eq!(why, InForceReason::Settling);
}

#[test]
fn roll_refused_while_the_workload_is_mid_rollout_or_scaling() {
    let mut i = input(alloc(20_000, 0.3), vec![Some(alloc(40_000, 0.3)); 2]);
    i.workload.rollout_in_progress = true;
    assert_eq!(
        decide_roll(&i, &cfg()),
        RollDecision::Hold(HoldReason::RolloutInProgress)
    );
    i.workload.rollout_in_progress = false;
    i.workload.desired_replicas = 3;
    assert_eq!(decide_roll(&i, &cfg()), RollDecision::Hold(HoldReason::Scaling));
}

#[test]
fn roll_only_in_recreate_mode() {
    for mode in [UpdateMode::Off, UpdateMode::Initial] {
        let mut i = input(alloc(20_000, 0.3), vec![Some(alloc(40_000, 0.3)); 2]);
        i.mode = mode;
        assert_eq!(
            decide_roll(&i, &cfg()),
            RollDecision::Hold(HoldReason::ModeNotRecreate)
        );
    }
}

#[test]
fn roll_in_sync_pods_are_left_alone() {
    let i = input(alloc(20_000, 0.3), vec![Some(alloc(21_000, 0.31)); 2]);
    assert_eq!(decide_roll(&i, &cfg()), RollDecision::Hold(HoldReason::InSync));
}

#[test]
fn roll_a_candidate_comes_into_force_only_when_stable() {
    let c = cfg();
    let first = track(None, Some(alloc(30_000, 0.4)), None, 0, &c).unwrap();
    // Small wobble: the clock keeps running.
    let wobble = track(Some(&first), Some(alloc(30_500, 0.41)), None, 10 * MIN, &c).unwrap();
    assert_eq!(wobble.since_ms, 0);
    assert_eq!(
        in_force(
            &Fixed::default(),
            Some(&wobble),
            None,
            Urgency::default(),
            29 * MIN,
            &c
        )
        .1,
        InForceReason::NoRecommendation
    );
    let (f, why) = in_force(
        &Fixed::default(),
        Some(&wobble),
        None,
        Urgency::default(),
        30 * MIN,
        &c,
    );
    assert_eq!((f, why), (Some(alloc(30_000, 0.4)), InForceReason::Stable));
    // A real move restarts the clock; the previous allocation stays in force meanwhile.
    let moved = track(Some(&wobble), Some(alloc(20_000, 0.4)), None, 31 * MIN, &c).unwrap();
    assert_eq!(moved.since_ms, 31 * MIN);
    let (f, why) = in_force(
        &Fixed::default(),
        Some(&moved),
        f,
        Urgency::default(),
        40 * MIN,
        &c,
    );
    assert_eq!((f, why), (Some(alloc(30_000, 0.4)), InForceReason::Settling));
}

/// The default scenario's assistant-14b: the calibrated 40,204 MiB is in force and the recommendation steps down
/// about 2.5% every four minutes (each update is step-bounded). Before, every step moved the candidate beyond the
/// 5% tolerance within eight minutes and restarted its clock, so the shrink never came into force in an hour.
/// Now the shrink keeps its clock, and when the window ends the largest recommendation it saw comes into force.
#[test]
fn in_force_a_shrink_that_keeps_shrinking_comes_into_force_at_the_largest_of_its_window() {
    let c = cfg();
    let in_force_now = alloc(40_204, 1.0);
    let mut cand = None;
    let mut force = Some(in_force_now);
    let mut memory = 38_209.0_f64;
    let mut first_shrink = None;
    for step in 0..16u64 {
        let now = step * 4 * MIN;
        let rec = alloc(memory.round() as u64, 1.0);
        cand = track(cand.as_ref(), Some(rec), force.as_ref(), now, &c);
        let (f, why) = in_force(
            &Fixed::default(),
            cand.as_ref(),
            force,
            Urgency::default(),
            now,
            &c,
        );
        if why == InForceReason::Stable && first_shrink.is_none() && f != Some(in_force_now) {
            first_shrink = Some((now, f));
        }
        force = f;
        memory *= 0.975;
    }
    let (when, f) = first_shrink.unwrap_or_else(|| panic!("the shrink never came into force: {cand:?}"));
    // The clock started with the first recommendation (t = 0) and ran through every step down.
    assert_eq!(when, 32 * MIN, "the first round at or past the 30-minute window");
    assert_eq!(
        f,
        Some(alloc(38_209, 1.0)),
        "the largest recommendation of the window, not the latest"
    );
    // Once in force, the steps after it start a window of their own.
    assert!(cand.is_some_and(|c| c.since_ms > 32 * MIN), "{cand:?}");
}

/// A recommendation that turns back up while a shrink waits raises what the window will bring into force and
/// keeps its clock while it stays below what is in force; one that grows past what is in force in either
/// dimension restarts the clock.
#[test]
fn track_a_shrink_keeps_its_clock_and_its_largest_value_until_something_grows() {
    let c = cfg();
    let f = alloc(40_000, 0.8);
    let shrink = track(None, Some(alloc(30_000, 0.6)), Some(&f), 0, &c).unwrap();
    let back_up = track(Some(&shrink), Some(alloc(34_000, 0.5)), Some(&f), 5 * MIN, &c).unwrap();
    assert_eq!((back_up.alloc, back_up.since_ms), (alloc(34_000, 0.6), 0));
    for (rec, why) in [
        (alloc(44_000, 0.6), "memory above what is in force"),
        (alloc(30_000, 0.9), "compute above what is in force"),
    ] {
        let t = track(Some(&back_up), Some(rec), Some(&f), 10 * MIN, &c).unwrap();
        assert_eq!((t.alloc, t.since_ms), (rec, 10 * MIN), "{why}");
    }
    // Back up to just below what is in force: still a shrink, so the window brings in that much.
    let t = track(Some(&back_up), Some(alloc(39_000, 0.79)), Some(&f), 10 * MIN, &c).unwrap();
    assert_eq!((t.alloc, t.since_ms), (alloc(39_000, 0.79), 0));
    // The candidate already in force: a move down starts a new window.
    let t = track(
        Some(&Candidate {
            alloc: f,
            since_ms: 0,
        }),
        Some(alloc(30_000, 0.8)),
        Some(&f),
        10 * MIN,
        &c,
    )
    .unwrap();
    assert_eq!(t.since_ms, 10 * MIN);
    // Nothing in force yet: every move restarts the clock, as before.
    let t = track(Some(&shrink), Some(alloc(20_000, 0.6)), None, 10 * MIN, &c).unwrap();
    assert_eq!(t.since_ms, 10 * MIN);
}

fn arb_alloc() -> impl Strategy<Value = Allocation> {
    (1_000u64..80_000, 0.05f64..=1.0).prop_map(|(m, c)| alloc(m, c))
}

fn arb_input() -> impl Strategy<Value = RollInput> {
    (
        arb_alloc(),
        prop::collection::vec(prop::option::of(arb_alloc()), 0..6),
        (0i32..8, 0i32..8, 0i32..8, 0i32..4, 0i32..3),
        prop::array::uniform5(any::<bool>()),
        prop::option::of(0u64..120 * MIN),
        0u64..120 * MIN,
    )
        .prop_map(
            |(target, pods, (replicas, ready, desired, min, unavail), flags, since, now)| RollInput {
                mode: UpdateMode::Recreate,
                in_force: Some(target),
                pods,
                drift_since_ms: since,
                urgency: Urgency {
                    preempting: flags[0],
                    ttft_over_slo: flags[0],
                },
                workload: Workload {
                    replicas,
                    ready_replicas: ready.min(replicas),
                    desired_replicas: desired,
                    min_replicas: min,
                    max_unavailable: unavail,
                    rollout_in_progress: flags[1],
                    pool_busy: flags[2],
                    disruption_blocked: flags[3],
                },
                template_at_in_force: flags[4],
                now_ms: now,
            },
        )
}

proptest! {
    #[test]
    fn roll_never_below_min_replicas_ready(i in arb_input()) {
        if let RollDecision::Roll(_) = decide_roll(&i, &cfg()) {
            prop_assert!(i.workload.ready_replicas == i.workload.replicas);
            prop_assert!(i.workload.ready_replicas - i.workload.max_unavailable >= i.workload.min_replicas);
        }
    }

    #[test]
    fn roll_never_two_rolls_at_once(i in arb_input()) {
        if let RollDecision::Roll(_) = decide_roll(&i, &cfg()) {
            prop_assert!(!i.workload.rollout_in_progress && !i.workload.pool_busy && !i.workload.disruption_blocked);
            prop_assert_eq!(i.workload.desired_replicas, i.workload.replicas);
        }
    }

    #[test]
    fn roll_missing_data_never_causes_a_shrinking_roll(mut i in arb_input()) {
        for p in &mut i.pods { *p = None; }
        prop_assert!(matches!(decide_roll(&i, &cfg()), RollDecision::Hold(_)));
        i.in_force = None;
        prop_assert_eq!(decide_roll(&i, &cfg()), RollDecision::Hold(HoldReason::NoRecommendation));
    }

    #[test]
    fn roll_no_roll_without_a_stable_recommendation(
        rec in arb_alloc(), pods in prop::collection::vec(arb_alloc(), 1..4), t in 0u64..30 * MIN,
    ) {
        let c = cfg();
        let cand = track(None, Some(rec), None, 0, &c).unwrap();
        let (force, _) = in_force(&Fixed::default(), Some(&cand), None, Urgency::default(), t, &c);
        prop_assert_eq!(force, None);
        let mut i = input(rec, pods.into_iter().map(Some).collect());
        i.in_force = force;
        prop_assert!(matches!(decide_roll(&i, &c), RollDecision::Hold(_)));
    }

    #[test]
    fn roll_a_fixed_policy_value_always_wins(
        rec in prop::option::of(arb_alloc()), prev in prop::option::of(arb_alloc()),
        mem in prop::option::of(1_000u64..80_000), share in prop::option::of(0.05f64..=1.0),
        preempting in any::<bool>(), slow in any::<bool>(), t in 0u64..120 * MIN,
    ) {
        let c = cfg();
        let fixed = Fixed { memory_mib: mem, compute_fraction: share };
        let cand = track(None, rec, None, 0, &c);
        let urgency = Urgency { preempting, ttft_over_slo: slow };
        let (force, _) = in_force(&fixed, cand.as_ref(), prev, urgency, t, &c);
        if let Some(f) = force {
            if let Some(m) = mem { prop_assert_eq!(f.memory_mib, m); }
            if let Some(s) = share { prop_assert_eq!(f.compute_fraction, s); }
        }
        if mem.is_some() && share.is_some() { prop_assert!(force.is_some()); }
    }

    #[test]
    fn roll_missing_recommendations_never_move_the_candidate(
        rec in arb_alloc(), t0 in 0u64..MIN, gaps in prop::collection::vec(0u64..MIN, 0..20),
    ) {
        let c = cfg();
        let mut cand = track(None, Some(rec), None, t0, &c);
        let mut now = t0;
        for g in gaps { now += g; cand = track(cand.as_ref(), None, None, now, &c); }
        prop_assert_eq!(cand, Some(Candidate { alloc: rec, since_ms: t0 }));
    }
}

/// The replay: Qwen2-7B on an A100-80GB, from the real start-up logs in
/// `../shared/fixtures/vllm/memory-profiles.md` (KV ≈ util × 79.28 GiB − 14.81 GiB, 57,344 B/token, 16-token blocks),
/// started at `gpu_memory_utilization` 0.9 and peaking at 40% of that cache. Each round: the sidecar's
/// recommendation over a 10-minute window, the controller's in-force rule (stable for the window), a roll, and the
/// new server's cache. The allocation in force must reach ≤ 0.55 with the default headroom, and the load must never
/// overflow the cache (no preemption) on the way.
#[test]
fn roll_replay_qwen2_7b_a100_settles_at_or_below_055_without_preemption() {
    use crate::recommend::{
        self, ComputeFacts, Config, Input, KvGeometry, MemoryFacts, Observation, Outcome,
    };
    const GIB: f64 = (1u64 << 30) as f64;
    const TOTAL_GIB: f64 = 79.28;
    const FIXED_GIB: f64 = 14.81;
    const BYTES_PER_TOKEN: u64 = 57_344;
    let kv_gib = |u: f64| u * TOTAL_GIB - FIXED_GIB;
    let peak_used_gib = 0.40 * kv_gib(0.9);
    let c = cfg();
    let mut util = 0.9;
    let mut previous_in_force: Option<Allocation> = None;
    let mut path = vec![util];
    for round in 0u32..12 {
        let kv = kv_gib(util);
        let blocks = (kv * GIB / (16.0 * BYTES_PER_TOKEN as f64)) as u64;
        assert!(
            peak_used_gib < kv,
            "round {round}: 40% of the original cache no longer fits at util {util:.3}: a preemption"
        );
        // Ten minutes at 5 s: usage swings up to the peak and back.
        let window: Vec<Observation> = (0..120)
            .map(|i| {
                let phase = (f64::from(i) / 120.0 * std::f64::consts::TAU).sin().abs();
                Observation {
                    at_secs: f64::from(i) * 5.0,
                    kv_usage: Some(peak_used_gib * (0.5 + 0.5 * phase) / kv),
                    requests_waiting: Some(0.0),
                    preemptions_total: Some(0.0),
                    sm_utilization: None,
                }
            })
            .collect();
        let outcome = recommend::recommend(
            &Input {
                window: &window,
                geometry: KvGeometry {
                    num_gpu_blocks: blocks,
                    block_size: 16,
                    max_model_len: Some(32_768),
                },
                memory: MemoryFacts {
                    gpu_total_bytes: Some((TOTAL_GIB * GIB) as u64),
                    bytes_per_kv_token: Some(BYTES_PER_TOKEN),
                    gpu_memory_utilization: Some(util),
                    ..MemoryFacts::default()
                },
                previous: None,
                compute: ComputeFacts::default(),
            },
            &Config::default(),
        );
        let rec = match outcome {
            Outcome::Ready(r) => r,
            other => panic!("round {round}: no recommendation at util {util:.3}: {other:?}"),
        };
        let recommended = Allocation {
            memory_mib: rec.gpu_memory_mib,
            compute_fraction: rec.compute_fraction,
            kv_cache_memory_bytes: Some(rec.kv_cache_memory_bytes),
            gpu_memory_utilization: Some(rec.gpu_memory_utilization),
        };
        // The recommendation holds for the stability window: it comes into force, and the pods are rolled onto it.
        let t0 = u64::from(round) * 3_600_000;
        let cand = track(None, Some(recommended), None, t0, &c);
        let (force, why) = in_force(
            &Fixed::default(),
            cand.as_ref(),
            previous_in_force,
            Urgency::default(),
            t0 + 30 * MIN,
            &c,
        );
        assert_eq!(why, InForceReason::Stable);
        let force = force.unwrap();
        let next = force.gpu_memory_utilization.unwrap();
        previous_in_force = Some(force);
        path.push(next);
        if (next - util).abs() < 0.005 {
            util = next;
            break;
        }
        util = next;
    }
    println!("roll replay (Qwen2-7B, A100-80GB): gpu_memory_utilization {path:.3?}");
    assert!(util <= 0.55, "settled at {util:.3}; path {path:?}");
    assert!(
        peak_used_gib < kv_gib(util),
        "the settled cache must still hold the peak"
    );
}

/// A template that already carries the allocation in force was rolled; its pods are just not replaced yet.
#[test]
fn roll_holds_when_the_template_already_carries_the_allocation() {
    let mut i = input(alloc(40_000, 0.5), vec![Some(alloc(20_000, 0.3)); 2]);
    assert_eq!(decide_roll(&i, &cfg()), RollDecision::Roll(RollReason::Grow));
    i.template_at_in_force = true;
    assert_eq!(
        decide_roll(&i, &cfg()),
        RollDecision::Hold(HoldReason::RolloutInProgress)
    );
}

/// A sidecar document: fresh or not, its window's preemptions and its TTFT p95 (long window only, as an older
/// sidecar reports it).
fn sidecar(fresh: bool, preemptions: f64, ttft_p95: f64) -> SidecarStatus {
    serde_json::from_value(serde_json::json!({
        "schema_version": 1, "generated_at": 1000.0, "vllm_url": "http://127.0.0.1:8000", "vllm_up": true,
        "ready": true, "stale": !fresh,
        "scrape": {"interval_secs": 5.0, "successes_total": 3},
        "latest": {"at": 998.0, "kv_cache_usage_ratio": 0.4, "requests_running": 2.0, "requests_waiting": 0.0},
        "window": {"start": 900.0, "end": 1000.0, "samples": 20, "preemptions": preemptions,
                   "ttft_seconds": {"p95": ttft_p95}},
        "recommendation": {"outcome": {"state": "not_yet", "code": "too_few_samples", "reason": "warming up"}}
    }))
    .unwrap()
}

#[test]
fn urgency_reads_fresh_replicas_only_and_never_from_missing_data() {
    let age = Duration::from_secs(30);
    let slo = Some(Duration::from_secs(2));
    let (calm, slow, preempting) = (
        sidecar(true, 0.0, 0.5),
        sidecar(true, 0.0, 2.5),
        sidecar(true, 3.0, 0.5),
    );
    assert_eq!(Urgency::of(&[Some(&calm), None], slo, age), Urgency::default());
    assert_eq!(
        Urgency::of(&[Some(&calm), Some(&slow)], slo, age),
        Urgency {
            preempting: false,
            ttft_over_slo: true
        }
    );
    assert_eq!(
        Urgency::of(&[Some(&preempting)], slo, age),
        Urgency {
            preempting: true,
            ttft_over_slo: false
        }
    );
    // No objective: latency is never urgent. A stale document counts for nothing.
    assert_eq!(Urgency::of(&[Some(&slow)], None, age), Urgency::default());
    let stale = sidecar(false, 3.0, 9.0);
    assert_eq!(Urgency::of(&[Some(&stale)], slo, age), Urgency::default());
}

#[test]
fn urgently_below_counts_the_pods_an_urgency_would_roll() {
    let target = alloc(40_000, 0.8);
    let pods = vec![
        Some(alloc(40_000, 0.5)),
        Some(alloc(20_000, 0.8)),
        Some(alloc(40_000, 0.8)),
        None,
    ];
    let slow = Urgency {
        preempting: false,
        ttft_over_slo: true,
    };
    let preempting = Urgency {
        preempting: true,
        ttft_over_slo: false,
    };
    assert_eq!(urgently_below(&target, &pods, 0.15, Urgency::default()), 0);
    assert_eq!(
        urgently_below(&target, &pods, 0.15, slow),
        1,
        "the pod on the smaller share"
    );
    assert_eq!(
        urgently_below(&target, &pods, 0.15, preempting),
        1,
        "the pod with the smaller cache"
    );
    let both = Urgency {
        preempting: true,
        ttft_over_slo: true,
    };
    assert_eq!(urgently_below(&target, &pods, 0.15, both), 2);
}

#[test]
fn roll_a_shrink_rolls_only_to_give_memory_back() {
    // Pods hold a 0.8 share where 0.4 is in force, with the same memory: drifted for the whole window, but a
    // restart would give back no memory.
    let mut i = input(alloc(20_000, 0.4), vec![Some(alloc(20_000, 0.8)); 2]);
    i.drift_since_ms = Some(0);
    assert_eq!(
        decide_roll(&i, &cfg()),
        RollDecision::Hold(HoldReason::ComputeOnlyShrink)
    );
    // With more memory than in force as well, the shrink rolls.
    i.pods = vec![Some(alloc(30_000, 0.8)); 2];
    assert_eq!(decide_roll(&i, &cfg()), RollDecision::Roll(RollReason::Shrink));
}

/// The fold takes the steps in the order both callers need them: a recommendation held for the window comes into
/// force, the pods that run the old allocation drift from then on, and once the drift has lasted the window they
/// roll; a template that already carries the allocation in force holds the roll.
#[test]
fn fold_brings_a_stable_recommendation_into_force_then_rolls_the_drift() {
    let cfg = cfg();
    let pods = [Some(alloc(40_000, 0.3)), Some(alloc(40_000, 0.3)), None];
    let never = |_: &Allocation| false;
    let fold_at = |kept: Kept, now_ms: u64, carries: &dyn Fn(&Allocation) -> bool| {
        fold(
            &FoldInput {
                mode: UpdateMode::Recreate,
                fixed: Fixed::default(),
                kept,
                recommended: Some(alloc(20_000, 0.3)),
                urgency: Urgency::default(),
                pods: &pods,
                workload: Workload {
                    replicas: 3,
                    ready_replicas: 3,
                    desired_replicas: 3,
                    min_replicas: 1,
                    ..Workload::default()
                },
                template_carries: carries,
                now_ms,
            },
            &cfg,
        )
    };
    let first = fold_at(Kept::default(), 0, &never);
    assert_eq!(first.reason, InForceReason::NoRecommendation);
    assert_eq!((first.kept.in_force, first.kept.drift_since_ms), (None, None));
    assert_eq!(first.roll, RollDecision::Hold(HoldReason::NoRecommendation));
    let stable = fold_at(first.kept, 30 * MIN, &never);
    assert_eq!(stable.reason, InForceReason::Stable);
    assert_eq!(stable.drift, Drift::Shrink);
    assert_eq!(stable.drifted, vec![true, true, false]);
    assert_eq!(stable.kept.drift_since_ms, Some(30 * MIN));
    assert_eq!(stable.roll, RollDecision::Hold(HoldReason::Settling));
    let lasted = fold_at(stable.kept, 60 * MIN, &never);
    assert_eq!(lasted.kept.drift_since_ms, Some(30 * MIN));
    assert_eq!(lasted.roll, RollDecision::Roll(RollReason::Shrink));
    let rolled = fold_at(stable.kept, 60 * MIN, &|a| *a == alloc(20_000, 0.3));
    assert_eq!(rolled.roll, RollDecision::Hold(HoldReason::RolloutInProgress));
}
