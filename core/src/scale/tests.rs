#![allow(clippy::unwrap_used)]

use std::time::Duration;

use proptest::prelude::*;

use super::*;

fn secs(s: u64) -> Timestamp {
    Timestamp::from_millis(s * 1000)
}

fn kv_policy(min: u32, max: u32) -> ScalePolicy {
    ScalePolicy {
        min_replicas: min,
        max_replicas: max,
        targets: Targets {
            kv_cache_utilization: Some(0.5),
            ..Targets::default()
        },
        scale_to_zero: (min == 0).then_some(ScaleToZero::after(Duration::from_secs(300))),
        panic: None,
        ..ScalePolicy::default()
    }
}

fn replica(kv: f64) -> ReplicaSignals {
    ReplicaSignals {
        kv_cache_usage: Some(kv),
        waiting: Some(0),
        running: Some(1),
        ttft_p95: None,
        ttft_p99: None,
        queue_p95: None,
        fresh: true,
    }
}

fn stale() -> ReplicaSignals {
    ReplicaSignals {
        fresh: false,
        ..ReplicaSignals::default()
    }
}

fn input(kvs: &[f64]) -> ScaleInput {
    let n = u32::try_from(kvs.len()).unwrap();
    ScaleInput {
        current_replicas: n,
        ready_replicas: n,
        replicas: kvs.iter().map(|&k| replica(k)).collect(),
        demand: Demand {
            last_request_at: Some(Timestamp(0)),
            ..Demand::default()
        },
        ttft_window_count: None,
    }
}

/// Runs `decide` + `record` like a caller that always acts on the decision.
fn step(inp: &mut ScaleInput, policy: &ScalePolicy, state: &mut ScaleState, now: Timestamp) -> ScaleDecision {
    let d = decide(inp, policy, state, now);
    state.record(&d, now);
    inp.current_replicas = d.desired_replicas;
    d
}

#[test]
fn ratio_rule_scales_up_by_ceil() {
    // 2 replicas at 90% KV with a 50% target: ceil(2 × 0.9/0.5) = 4.
    let d = decide(
        &input(&[0.9, 0.9]),
        &kv_policy(1, 10),
        &ScaleState::default(),
        secs(100),
    );
    assert_eq!(d.desired_replicas, 4);
    assert_eq!(d.reason, ScaleReason::ScaleUp);
    assert_eq!(d.leading_signal, Some(Signal::KvCacheUtilization));
    assert_eq!(d.signals[0].proposed, Some(4));
    assert!((d.signals[0].value.unwrap() - 0.9).abs() < 1e-9);
}

#[test]
fn tolerance_keeps_count_within_ten_percent() {
    let policy = kv_policy(1, 10);
    for kv in [0.46, 0.5, 0.54] {
        let d = decide(&input(&[kv, kv, kv]), &policy, &ScaleState::default(), secs(100));
        assert_eq!(d.desired_replicas, 3, "kv {kv}");
        assert_eq!(d.reason, ScaleReason::WithinTolerance);
    }
    // Just outside: 0.56/0.5 = 1.12 → ceil(3.36) = 4.
    let d = decide(
        &input(&[0.56, 0.56, 0.56]),
        &policy,
        &ScaleState::default(),
        secs(100),
    );
    assert_eq!(d.desired_replicas, 4);
}

#[test]
fn scale_down_waits_for_the_stabilization_window() {
    let policy = kv_policy(1, 10);
    let mut state = ScaleState::default();
    let mut inp = input(&[0.5, 0.5, 0.5, 0.5]);
    // Load at target for a while, then it drops to 10%.
    step(&mut inp, &policy, &mut state, secs(0));
    for r in &mut inp.replicas {
        r.kv_cache_usage = Some(0.1);
    }
    let mut t = 15;
    while t < 300 {
        let d = step(&mut inp, &policy, &mut state, secs(t));
        assert_eq!(d.desired_replicas, 4, "at {t}s the window still holds");
        assert_eq!(d.reason, ScaleReason::Stabilizing);
        t += 15;
    }
    // The 4-replica recommendation made at t=0 leaves the window after 300 s.
    let d = step(&mut inp, &policy, &mut state, secs(300));
    assert_eq!(d.desired_replicas, 1, "{d:?}");
    assert_eq!(d.reason, ScaleReason::ScaleDown);
}

#[test]
fn scale_up_is_rate_limited_like_hpa() {
    let mut policy = kv_policy(1, 100);
    policy.targets.kv_cache_utilization = Some(0.01);
    let mut state = ScaleState::default();
    let mut inp = input(&[1.0]);
    // 1 replica at 100× target: max(100%, 4 pods) per 15 s → 5.
    let d = step(&mut inp, &policy, &mut state, secs(0));
    assert_eq!(d.desired_replicas, 5);
    assert_eq!(d.reason, ScaleReason::RateLimited);
    assert!(d.scaling_limited);
    // Within the same 15 s period nothing more is allowed.
    let d = step(&mut inp, &policy, &mut state, secs(5));
    assert_eq!(d.desired_replicas, 5);
    // Next period: from 5, 100% → 10.
    let d = step(&mut inp, &policy, &mut state, secs(16));
    assert_eq!(d.desired_replicas, 10);
}

#[test]
fn clamps_to_min_and_max() {
    let d = decide(
        &input(&[1.0, 1.0]),
        &kv_policy(1, 3),
        &ScaleState::default(),
        secs(0),
    );
    assert_eq!(d.desired_replicas, 3);
    assert_eq!(d.reason, ScaleReason::TooManyReplicas);
    let mut policy = kv_policy(2, 5);
    policy.behavior.scale_down.stabilization_window = Duration::ZERO;
    let d = decide(
        &input(&[0.0, 0.0, 0.0, 0.0]),
        &policy,
        &ScaleState::default(),
        secs(0),
    );
    assert_eq!(d.desired_replicas, 2);
    assert_eq!(d.reason, ScaleReason::TooFewReplicas);
}

#[test]
fn stale_replicas_never_cause_a_scale_down() {
    let mut policy = kv_policy(1, 10);
    policy.behavior.scale_down.stabilization_window = Duration::ZERO;
    // All data missing: keep.
    let inp = ScaleInput {
        current_replicas: 4,
        ready_replicas: 4,
        replicas: vec![stale(), stale(), stale(), stale()],
        demand: Demand::default(),
        ttft_window_count: None,
    };
    let d = decide(&inp, &policy, &ScaleState::default(), secs(0));
    assert_eq!(d.desired_replicas, 4);
    assert_eq!(d.reason, ScaleReason::MissingMetrics);
    assert!(!d.scaling_active);
    // One fresh replica at 40% (ratio 0.8) and three missing (counted at target): new ratio 0.95 → within tolerance.
    let mut inp = inp;
    inp.replicas[0] = replica(0.4);
    let d = decide(&inp, &policy, &ScaleState::default(), secs(0));
    assert_eq!(d.desired_replicas, 4);
    // The same fresh replica alone would have scaled down to 1 without the missing ones.
    let d = decide(&input(&[0.4]), &policy, &ScaleState::default(), secs(0));
    assert_eq!(d.desired_replicas, 1);
}

#[test]
fn missing_replicas_count_as_zero_on_scale_up() {
    let policy = kv_policy(1, 10);
    // 2 fresh at 100% (ratio 2), 2 missing counted as 0 → ratio 1.0 → no change (HPA's rule).
    let inp = ScaleInput {
        current_replicas: 4,
        ready_replicas: 4,
        replicas: vec![replica(1.0), replica(1.0), stale(), stale()],
        demand: Demand::default(),
        ttft_window_count: None,
    };
    assert_eq!(
        decide(&inp, &policy, &ScaleState::default(), secs(0)).desired_replicas,
        4
    );
    // 2 fresh at 100%, 1 missing → ratio 2/3×2=1.33 → ceil(1.33×3) = 4.
    let inp = ScaleInput {
        current_replicas: 3,
        ready_replicas: 3,
        replicas: inp.replicas[..3].to_vec(),
        ..inp
    };
    assert_eq!(
        decide(&inp, &policy, &ScaleState::default(), secs(0)).desired_replicas,
        4
    );
}

#[test]
fn a_failing_signal_blocks_scale_down_from_others() {
    let mut policy = kv_policy(1, 10);
    policy.behavior.scale_down.stabilization_window = Duration::ZERO;
    policy.targets.requests_per_second_per_replica = Some(5.0);
    // KV says scale down to 1, the rate is unknown (no activator data): keep.
    let d = decide(&input(&[0.1, 0.1, 0.1]), &policy, &ScaleState::default(), secs(0));
    assert_eq!(d.desired_replicas, 3);
    assert_eq!(d.reason, ScaleReason::MissingMetrics);
}

#[test]
fn max_over_signals_wins() {
    let mut policy = kv_policy(1, 20);
    policy.targets.requests_per_second_per_replica = Some(2.0);
    let mut inp = input(&[0.5, 0.5]);
    inp.demand.requests_per_second = Some(16.0);
    let d = decide(&inp, &policy, &ScaleState::default(), secs(0));
    // KV within tolerance (2); rate 16/2 = 8, rate-limited to max(2×2, 2+4) = 6.
    assert_eq!(d.leading_signal, Some(Signal::RequestsPerSecondPerReplica));
    assert_eq!(d.recommendation, 8);
    assert_eq!(d.desired_replicas, 6);
}

#[test]
fn ttft_slo_breach_adds_a_replica_and_blocks_scale_down() {
    let mut policy = kv_policy(1, 10);
    policy.behavior.scale_down.stabilization_window = Duration::ZERO;
    policy.ttft_slo = Some(Duration::from_millis(500));
    let mut inp = input(&[0.1, 0.1]);
    inp.replicas[1].ttft_p95 = Some(Duration::from_millis(800));
    let d = decide(&inp, &policy, &ScaleState::default(), secs(0));
    assert_eq!(d.desired_replicas, 3);
    assert_eq!(d.reason, ScaleReason::TtftSloBreached);
    // Under the SLO, KV's scale-down goes ahead.
    inp.replicas[1].ttft_p95 = Some(Duration::from_millis(200));
    assert_eq!(
        decide(&inp, &policy, &ScaleState::default(), secs(0)).desired_replicas,
        1
    );
}

/// A guard on the p99 (`ttftSloPercentile: 99`) fires where the p95 is under the SLO and the slowest 1% are over
/// it, says which percentile it read, and a p95 guard over the same window does not; over a window of under
/// 50 first tokens it reads the p95, and so it does for a replica that reports no p99 (a sidecar that does not
/// send it): a stricter guard never becomes no guard.
#[test]
fn a_guard_on_the_p99_sees_the_slowest_one_percent() {
    let mut policy = kv_policy(1, 10);
    policy.behavior.scale_down.stabilization_window = Duration::ZERO;
    policy.ttft_slo = Some(Duration::from_millis(500));
    let mut inp = input(&[0.1, 0.1]);
    for r in &mut inp.replicas {
        r.ttft_p95 = Some(Duration::from_millis(300));
        r.ttft_p99 = Some(Duration::from_millis(900));
    }
    let d = decide(&inp, &policy, &ScaleState::default(), secs(0));
    assert_eq!((d.desired_replicas, d.reason), (1, ScaleReason::ScaleDown));
    policy.ttft_slo_percentile = SloPercentile::P99;
    let d = decide(&inp, &policy, &ScaleState::default(), secs(0));
    assert_eq!((d.desired_replicas, d.reason), (3, ScaleReason::TtftSloBreached));
    assert!(
        d.message.starts_with("p99 time to first token 0.900s"),
        "{}",
        d.message
    );
    // Over a window of fewer than 50 first tokens the p99 is about the slowest request: the guard reads the p95.
    inp.ttft_window_count = Some(P99_MIN_FIRST_TOKENS - 1.0);
    assert_eq!(
        decide(&inp, &policy, &ScaleState::default(), secs(0)).desired_replicas,
        1
    );
    inp.ttft_window_count = Some(P99_MIN_FIRST_TOKENS);
    assert_eq!(
        decide(&inp, &policy, &ScaleState::default(), secs(0)).desired_replicas,
        3
    );
    // A sidecar that sends no p99: the guard reads its p95 rather than nothing.
    for r in &mut inp.replicas {
        r.ttft_p99 = None;
    }
    assert_eq!(
        decide(&inp, &policy, &ScaleState::default(), secs(0)).desired_replicas,
        1
    );
    inp.replicas[0].ttft_p95 = Some(Duration::from_millis(700));
    let d = decide(&inp, &policy, &ScaleState::default(), secs(0));
    assert_eq!((d.desired_replicas, d.reason), (3, ScaleReason::TtftSloBreached));
}

/// The guard looks a lead time ahead: a p95 under the SLO but rising 10 ms a second, with a replica taking 34 s to
/// serve, would pass a 2 s SLO before a replica asked for now could help, so it asks for one now (and, while that
/// one starts, waits for it). A flat p95 at the same height, a quiet window, or no known lead time asks for
/// nothing.
#[test]
fn a_p95_rising_to_pass_the_slo_within_the_lead_time_adds_a_replica_now() {
    let mut policy = kv_policy(1, 10);
    policy.behavior.scale_down.stabilization_window = Duration::ZERO;
    policy.ttft_slo = Some(Duration::from_secs(2));
    policy.ttft_guard_lead = Some(Duration::from_secs(34));
    // Busy windows: 120 first tokens in the last minute between the two replicas.
    let at_ms = |v: u64| {
        let mut inp = input(&[0.5, 0.5]);
        for r in &mut inp.replicas {
            r.ttft_p95 = Some(Duration::from_millis(v));
        }
        inp.ttft_window_count = Some(120.0);
        inp
    };
    // What `joint::round` keeps: the worst p95 of the last minute's rounds.
    let history = |values: &[(u64, u64)]| {
        let mut state = ScaleState::default();
        for &(t, v) in values {
            lookahead::note(&mut state.ttft_seen, Some(Duration::from_millis(v)), secs(t));
        }
        state
    };
    let rising = history(&[(0, 1250), (15, 1400), (30, 1550), (45, 1700)]);
    // Nothing starting: one more now. One replica already starting: wait for it.
    let mut starting = at_ms(1700);
    starting.current_replicas = 3;
    for (inp, then) in [
        (at_ms(1700), "asking for one more replica"),
        (
            starting,
            "waiting for 1 starting replica(s) before asking for more",
        ),
    ] {
        let d = decide(&inp, &policy, &rising, secs(45));
        assert_eq!(
            (d.reason, d.desired_replicas),
            (ScaleReason::TtftSloAtRisk, 3),
            "{}",
            d.message
        );
        assert_eq!(
            d.message,
            format!(
                "p95 time to first token 1.700s, rising 0.010 s/s over the last 45 s, would pass the SLO 2.000s \
                 within the 34 s a new replica takes to serve: {then}"
            )
        );
        let joint = joint::replica_policy(
            &policy,
            joint::ShareRoom::Fixed,
            2.0,
            joint::LeadTimes::one(policy.ttft_guard_lead),
            &rising,
            &joint::BudgetPeers::NONE,
            secs(45),
        );
        assert_eq!(
            constraint::Constraint::of(&inp, &joint, &d),
            constraint::Constraint::TtftObjective
        );
    }
    // Flat at the same height; rising, with no lead time known; rising too slowly to pass within 34 s.
    let flat = history(&[(0, 1700), (15, 1700), (30, 1700), (45, 1700)]);
    let slow = history(&[(0, 1650), (45, 1700)]);
    let unknown = ScalePolicy {
        ttft_guard_lead: None,
        ..policy.clone()
    };
    // A quiet window (a p95 over a handful of first tokens) reads no trend either.
    let mut quiet = at_ms(1700);
    quiet.ttft_window_count = Some(12.0);
    let d = decide(&quiet, &policy, &rising, secs(45));
    assert_eq!(d.desired_replicas, 2, "{}", d.message);
    for (p, state) in [(&policy, &flat), (&unknown, &rising), (&policy, &slow)] {
        let d = decide(&at_ms(1700), p, state, secs(45));
        assert_eq!(d.desired_replicas, 2, "{}", d.message);
        assert_ne!(d.reason, ScaleReason::TtftSloAtRisk);
    }
}

/// The incident: 2 ready replicas over the SLO, new replicas taking minutes to load, a sync every 15 s. Before the
/// guard counted starting replicas it asked for current+1 on every sync, entered panic once current+1 reached twice
/// the ready count, and reached 18 desired in 225 s.
#[test]
fn ttft_guard_waits_for_starting_replicas_and_never_panics_on_its_own() {
    let mut policy = kv_policy(1, 50);
    policy.panic = Some(PanicMode::default());
    policy.ttft_slo = Some(Duration::from_millis(500));
    let mut state = ScaleState::default();
    let mut inp = input(&[0.5, 0.5]);
    for r in &mut inp.replicas {
        r.ttft_p95 = Some(Duration::from_millis(900));
    }
    let mut reasons = Vec::new();
    for t in (0..=225).step_by(15) {
        // The replicas asked for are still loading: only the first two are ready.
        let d = step(&mut inp, &policy, &mut state, secs(t));
        assert!(!d.panicking, "the guard entered panic at {t}s: {}", d.message);
        reasons.push(d.reason);
    }
    assert_eq!(inp.current_replicas, 3, "one more replica, then wait for it");
    assert!(reasons.iter().all(|r| *r == ScaleReason::TtftSloBreached));
    // Once it is ready and the excursion is still there, one more.
    inp.ready_replicas = 3;
    inp.replicas.push(inp.replicas[0].clone());
    let d = step(&mut inp, &policy, &mut state, secs(240));
    assert_eq!(d.desired_replicas, 4);
    assert!(!d.panicking);
    // A single ready replica: current+1 is 200% of it, still not a panic.
    let mut one = input(&[0.5]);
    one.replicas[0].ttft_p95 = Some(Duration::from_secs(2));
    let d = decide(&one, &policy, &ScaleState::default(), secs(0));
    assert_eq!((d.desired_replicas, d.panicking), (2, false));
}

fn idle_input(replicas: u32, last_request_s: u64) -> ScaleInput {
    ScaleInput {
        current_replicas: replicas,
        ready_replicas: replicas,
        replicas: (0..replicas)
            .map(|_| ReplicaSignals {
                running: Some(0),
                waiting: Some(0),
                ..replica(0.0)
            })
            .collect(),
        demand: Demand {
            requests_per_second: Some(0.0),
            in_flight: 0,
            queued_at_activator: 0,
            last_request_at: Some(secs(last_request_s)),
            requests_total: None,
        },
        ttft_window_count: None,
    }
}

#[test]
fn scales_to_zero_only_after_idle_after() {
    let policy = kv_policy(0, 5);
    let state = ScaleState::default();
    let d = decide(&idle_input(1, 1000), &policy, &state, secs(1299));
    assert_eq!(d.desired_replicas, 1, "{d:?}");
    let d = decide(&idle_input(1, 1000), &policy, &state, secs(1300));
    assert_eq!(d.desired_replicas, 0);
    assert_eq!(d.reason, ScaleReason::ScaleToZero);
}

#[test]
fn never_to_zero_with_work_anywhere_or_unknown_idle() {
    let policy = kv_policy(0, 5);
    let state = ScaleState::default();
    let now = secs(10_000);
    let mut inp = idle_input(1, 0);
    inp.demand.in_flight = 1;
    assert_eq!(decide(&inp, &policy, &state, now).desired_replicas, 1);
    let mut inp = idle_input(1, 0);
    inp.demand.queued_at_activator = 1;
    assert_eq!(decide(&inp, &policy, &state, now).desired_replicas, 1);
    let mut inp = idle_input(1, 0);
    inp.replicas[0].running = Some(2);
    assert_eq!(decide(&inp, &policy, &state, now).desired_replicas, 1);
    let mut inp = idle_input(1, 0);
    inp.replicas[0] = stale();
    assert_eq!(decide(&inp, &policy, &state, now).desired_replicas, 1);
    let mut inp = idle_input(1, 0);
    inp.demand.last_request_at = None;
    assert_eq!(decide(&inp, &policy, &state, now).desired_replicas, 1);
    // An unknown rate (a failed activator poll) is missing data, even with an old last arrival on record.
    let mut inp = idle_input(1, 0);
    inp.demand.requests_per_second = None;
    assert_eq!(decide(&inp, &policy, &state, now).desired_replicas, 1);
    // Without scale_to_zero in the policy: never.
    let mut policy = kv_policy(1, 5);
    policy.scale_to_zero = Some(ScaleToZero::after(Duration::from_secs(1)));
    assert_eq!(
        decide(&idle_input(1, 0), &policy, &state, now).desired_replicas,
        1
    );
}

#[test]
fn wakes_from_zero_at_once_on_demand() {
    let mut policy = kv_policy(0, 5);
    policy.behavior.scale_up.stabilization_window = Duration::from_secs(120);
    let inp = ScaleInput {
        demand: Demand {
            queued_at_activator: 1,
            last_request_at: Some(secs(5)),
            ..Demand::default()
        },
        ..ScaleInput::default()
    };
    let d = decide(&inp, &policy, &ScaleState::default(), secs(5));
    assert_eq!(d.desired_replicas, 1);
    assert_eq!(d.reason, ScaleReason::ScaleFromZero);
    // With a rate target, enough for the observed rate.
    policy.targets.requests_per_second_per_replica = Some(3.0);
    let inp = ScaleInput {
        demand: Demand {
            requests_per_second: Some(10.0),
            ..inp.demand
        },
        ..inp
    };
    assert_eq!(
        decide(&inp, &policy, &ScaleState::default(), secs(5)).desired_replicas,
        4
    );
    // No demand: stay.
    let d = decide(&ScaleInput::default(), &policy, &ScaleState::default(), secs(5));
    assert_eq!((d.desired_replicas, d.reason), (0, ScaleReason::IdleAtZero));
}

#[test]
fn panic_scales_up_at_once_and_holds() {
    let mut policy = kv_policy(1, 50);
    policy.panic = Some(PanicMode::default());
    policy.behavior.scale_down.stabilization_window = Duration::ZERO;
    policy.behavior.scale_up.stabilization_window = Duration::from_secs(60);
    let mut state = ScaleState::default();
    let mut inp = input(&[0.5, 0.5]);
    step(&mut inp, &policy, &mut state, secs(0));
    // A burst: 2 replicas at 100% with a 25% target → 8, which is 4× the ready count.
    policy.targets.kv_cache_utilization = Some(0.25);
    for r in &mut inp.replicas {
        r.kv_cache_usage = Some(1.0);
    }
    let d = step(&mut inp, &policy, &mut state, secs(10));
    assert!(d.panicking);
    assert_eq!(d.reason, ScaleReason::Panic);
    assert_eq!(
        d.desired_replicas, 8,
        "panic skips the 60 s up window and the rate limit"
    );
    // Load vanishes: no scale-down until 60 s pass without panic.
    inp.ready_replicas = 8;
    inp.replicas = vec![replica(0.0); 8];
    for t in [20, 40, 69] {
        let d = step(&mut inp, &policy, &mut state, secs(t));
        assert_eq!(d.desired_replicas, 8, "at {t}s");
        assert!(d.panicking);
    }
    let d = step(&mut inp, &policy, &mut state, secs(71));
    assert!(!d.panicking);
    assert_eq!(d.desired_replicas, 1);
}

#[test]
fn invalid_policy_changes_nothing() {
    let mut policy = kv_policy(3, 2);
    policy.targets.kv_cache_utilization = Some(-1.0);
    let d = decide(&input(&[1.0]), &policy, &ScaleState::default(), secs(0));
    assert_eq!(d.desired_replicas, 1);
    assert_eq!(d.reason, ScaleReason::InvalidPolicy);
    assert!(
        d.message.contains("maxReplicas (2) must be >= minReplicas (3)"),
        "{}",
        d.message
    );
    assert!(d.message.contains("kvCacheUtilization"), "{}", d.message);
}

#[test]
fn state_forgets_what_no_window_sees() {
    let policy = kv_policy(1, 10);
    let mut state = ScaleState::default();
    let mut inp = input(&[0.5]);
    for t in 0..2000 {
        step(&mut inp, &policy, &mut state, secs(t));
    }
    assert!(
        state.recommendations.len() <= 301,
        "{}",
        state.recommendations.len()
    );
}

#[test]
fn reason_labels_are_snake_case() {
    let all = [
        ScaleReason::InvalidPolicy,
        ScaleReason::ScaleUp,
        ScaleReason::ScaleDown,
        ScaleReason::WithinTolerance,
        ScaleReason::MissingMetrics,
        ScaleReason::Stabilizing,
        ScaleReason::RateLimited,
        ScaleReason::TooManyReplicas,
        ScaleReason::TooFewReplicas,
        ScaleReason::TtftSloBreached,
        ScaleReason::Panic,
        ScaleReason::ScaleFromZero,
        ScaleReason::ScaleToZero,
        ScaleReason::IdleAtZero,
    ];
    for r in all {
        assert!(
            r.label().chars().all(|c| c.is_ascii_lowercase() || c == '_'),
            "{r:?}"
        );
        assert!(
            r.condition_reason().chars().all(|c| c.is_ascii_alphabetic()),
            "{r:?}"
        );
    }
}

fn arb_replica() -> impl Strategy<Value = ReplicaSignals> {
    (
        proptest::option::of(0.0f64..=1.0),
        proptest::option::of(0u32..50),
        proptest::option::of(0u32..50),
        proptest::option::of(0u64..5000),
        any::<bool>(),
    )
        .prop_map(|(kv, waiting, running, ttft, fresh)| ReplicaSignals {
            kv_cache_usage: kv,
            waiting,
            running,
            ttft_p95: ttft.map(Duration::from_millis),
            ttft_p99: ttft.map(|t| Duration::from_millis(t + t / 4)),
            queue_p95: None,
            fresh,
        })
}

fn arb_policy() -> impl Strategy<Value = ScalePolicy> {
    (
        0u32..5,
        1u32..30,
        proptest::option::of(0.05f64..=1.0),
        proptest::option::of(0.5f64..20.0),
        proptest::option::of(0.5f64..20.0),
        any::<bool>(),
        proptest::option::of(100u64..3000),
    )
        .prop_map(|(min, span, kv, waiting, rps, panic, slo)| ScalePolicy {
            min_replicas: min,
            max_replicas: min.max(1) + span,
            targets: Targets {
                kv_cache_utilization: kv,
                waiting_requests_per_replica: waiting,
                ttft_p95: None,
                requests_per_second_per_replica: rps,
            },
            scale_to_zero: (min == 0).then_some(ScaleToZero::after(Duration::from_secs(60))),
            panic: panic.then(PanicMode::default),
            ttft_slo: slo.map(Duration::from_millis),
            ..ScalePolicy::default()
        })
}

fn arb_input() -> impl Strategy<Value = ScaleInput> {
    (
        0u32..40,
        proptest::collection::vec(arb_replica(), 0..12),
        proptest::option::of(0.0f64..200.0),
        0u32..5,
        0u32..5,
        proptest::option::of(0u64..600),
    )
        .prop_map(|(current, replicas, rps, in_flight, queued, last)| ScaleInput {
            current_replicas: current,
            ready_replicas: u32::try_from(replicas.len()).unwrap().min(current),
            replicas: replicas.into_iter().take(current as usize).collect(),
            demand: Demand {
                requests_per_second: rps,
                in_flight,
                queued_at_activator: queued,
                last_request_at: last.map(secs),
                requests_total: None,
            },
            ttft_window_count: None,
        })
}

proptest! {
    /// Whatever comes in, over time, the count stays within [min, max] once the first decision is made.
    #[test]
    fn desired_always_within_bounds(policy in arb_policy(), inputs in proptest::collection::vec(arb_input(), 1..30)) {
        let mut state = ScaleState::default();
        let mut current = inputs[0].current_replicas;
        for (i, inp) in inputs.iter().enumerate() {
            let mut inp = inp.clone();
            inp.current_replicas = current;
            inp.ready_replicas = inp.ready_replicas.min(current);
            inp.replicas.truncate(inp.ready_replicas as usize);
            let now = secs(600 + 7 * i as u64);
            let d = decide(&inp, &policy, &state, now);
            prop_assert!(d.desired_replicas <= policy.max_replicas, "{d:?}");
            prop_assert!(d.desired_replicas >= policy.min_replicas, "{d:?}");
            if d.desired_replicas == 0 {
                prop_assert_eq!(policy.min_replicas, 0);
            }
            state.record(&d, now);
            current = d.desired_replicas;
        }
    }

    /// With no fresh replica data and no rate data, a count within bounds never goes down.
    #[test]
    fn no_scale_down_without_data(policy in arb_policy(), mut inp in arb_input(), t in 0u64..10_000) {
        for r in &mut inp.replicas { r.fresh = false; }
        inp.demand.requests_per_second = None;
        let d = decide(&inp, &policy, &ScaleState::default(), secs(t));
        if inp.current_replicas >= policy.min_replicas.max(1) && inp.current_replicas <= policy.max_replicas {
            prop_assert!(d.desired_replicas >= inp.current_replicas, "{d:?}");
        }
    }

    /// Never to zero while anything is in flight, queued, running or waiting.
    #[test]
    fn no_zero_with_work(policy in arb_policy(), mut inp in arb_input(), t in 0u64..10_000, which in 0u8..3) {
        match which {
            0 => inp.demand.in_flight = inp.demand.in_flight.max(1),
            1 => inp.demand.queued_at_activator = inp.demand.queued_at_activator.max(1),
            _ => if let Some(r) = inp.replicas.first_mut() { r.running = Some(1); r.fresh = true; } else {
                inp.demand.in_flight = 1;
            },
        }
        let d = decide(&inp, &policy, &ScaleState::default(), secs(t));
        prop_assert!(d.desired_replicas >= 1, "{d:?}");
    }

    /// Flapping signals: any scale-down (outside panic and idle) is no lower than every recommendation made within
    /// the scale-down window, so the count cannot chase the input down and up.
    #[test]
    fn flapping_input_respects_the_down_window(
        kvs in proptest::collection::vec(prop_oneof![Just(0.05f64), Just(0.95f64)], 2..60),
    ) {
        let mut policy = kv_policy(1, 20);
        policy.behavior.scale_down.stabilization_window = Duration::from_secs(120);
        let mut state = ScaleState::default();
        let mut inp = input(&[0.5, 0.5, 0.5]);
        let mut downs = 0;
        for (i, kv) in kvs.iter().enumerate() {
            for r in &mut inp.replicas { r.kv_cache_usage = Some(*kv); }
            inp.ready_replicas = inp.current_replicas;
            inp.replicas.resize(inp.current_replicas as usize, replica(*kv));
            let now = secs(15 * i as u64);
            let before = state.clone();
            let d = step(&mut inp, &policy, &mut state, now);
            if d.desired_replicas < d.current_replicas {
                downs += 1;
                let window = Duration::from_secs(120);
                for r in before.recommendations.iter().filter(|r| r.at.is_within(window, now)) {
                    prop_assert!(d.desired_replicas >= r.replicas.min(policy.max_replicas), "{d:?} vs {r:?}");
                }
            }
        }
        // At most one scale-down per window's worth of ticks (+1 for the tail).
        prop_assert!(downs <= kvs.len() / 8 + 1, "{downs} scale-downs in {} ticks", kvs.len());
    }

    /// Knative's rule: while panicking, the count never goes down (unless maxReplicas was lowered below it).
    #[test]
    fn never_down_during_panic(
        kvs in proptest::collection::vec(0.0f64..=1.0, 2..60),
        dt in 1u64..20,
    ) {
        let mut policy = kv_policy(1, 40);
        policy.panic = Some(PanicMode::default());
        policy.behavior.scale_down.stabilization_window = Duration::ZERO;
        policy.targets.kv_cache_utilization = Some(0.2);
        let mut state = ScaleState::default();
        let mut inp = input(&[0.2, 0.2]);
        for (i, kv) in kvs.iter().enumerate() {
            inp.ready_replicas = inp.current_replicas;
            inp.replicas = vec![replica(*kv); inp.current_replicas as usize];
            let now = secs(dt * i as u64);
            let d = step(&mut inp, &policy, &mut state, now);
            if d.panicking {
                prop_assert!(d.desired_replicas >= d.current_replicas.min(policy.max_replicas), "{d:?}");
            }
        }
    }

    /// From zero, any demand gives at least one replica in the same decision, whatever the history says.
    #[test]
    fn demand_at_zero_wakes_at_once(
        policy in arb_policy(),
        queued in 0u32..3,
        in_flight in 0u32..3,
        rps in proptest::option::of(0.0f64..50.0),
        history in proptest::collection::vec((0u64..600, 0u32..10), 0..50),
    ) {
        let demand = Demand { requests_per_second: rps, in_flight, queued_at_activator: queued, last_request_at: None, requests_total: None };
        let mut state = ScaleState::default();
        for (t, r) in history {
            state.recommendations.push(Recommendation { at: secs(t), replicas: r });
        }
        let inp = ScaleInput { demand, ..ScaleInput::default() };
        let d = decide(&inp, &policy, &state, secs(600));
        if demand.has_work() {
            prop_assert!(d.desired_replicas >= 1, "{d:?}");
            prop_assert_eq!(d.reason, ScaleReason::ScaleFromZero);
        } else {
            prop_assert_eq!(d.desired_replicas, policy.min_replicas);
        }
    }
}
