//! Cost of one replica decision, the call the what-if simulator makes every virtual tick for every model and the
//! controller every sync period for every InferenceAutoscaler.
//!
//! Run: `cargo bench -p tessera-core --bench scale`. Side by side in one run:
//! - `decide/empty_state`: 8 replicas, all four signals, TTFT guard and panic mode on, no history;
//! - `decide/history_300`: the same input with a full 300 s scale-down window of history at 1 s ticks (300
//!   recommendations and 20 scale events), the worst case the windows and rate limits walk;
//! - `decide/history_300/guard_p99`: the same with the SLO guard on the p99 (`ttftSloPercentile: 99`);
//! - `scale_input/8_windows_pooled`: the controller reading eight sidecars' documents, their one-minute TTFT
//!   windows pooled into the model's p95 and p99;
//! - `decide_and_record/history_300`: the simulator's per-tick pair, `decide` then `ScaleState::record`;
//! - `coldstart/*`: a budgeted model's day-long ledger (5,760 syncs at 15 s, bursty): `evidence`, which every
//!   round of such a model reads, beside what keeping a copy in the status costs the controller — `checkpoint`
//!   (at most once a minute) and `restore` of that copy (the check of the kept copy each round, and a new leader's
//!   resume).

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use tessera_core::scale::{
    Demand, PanicMode, Recommendation, ReplicaSignals, ScaleEvent, ScaleInput, ScalePolicy, ScaleState,
    ScaleToZero, SloPercentile, Targets, Timestamp, decide, inputs,
};
use tessera_core::wire::sidecar::SidecarStatus;

fn policy() -> ScalePolicy {
    ScalePolicy {
        min_replicas: 0,
        max_replicas: 32,
        targets: Targets {
            kv_cache_utilization: Some(0.7),
            waiting_requests_per_replica: Some(2.0),
            ttft_p95: Some(Duration::from_millis(800)),
            requests_per_second_per_replica: Some(4.0),
        },
        scale_to_zero: Some(ScaleToZero::after(Duration::from_secs(600))),
        panic: Some(PanicMode::default()),
        ttft_slo: Some(Duration::from_secs(2)),
        ..ScalePolicy::default()
    }
}

/// Eight sidecars' `/v1/status` documents, each with a one-minute window of first tokens in vLLM's default TTFT
/// buckets (what the controller pools into the model's p95 and p99).
fn sidecar_docs() -> Vec<SidecarStatus> {
    let bounds = [
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
        40.0, 80.0, 160.0, 640.0, 2560.0,
    ];
    (0..8u32)
        .map(|i| {
            let buckets: Vec<serde_json::Value> = bounds
                .iter()
                .map(|&le: &f64| {
                    let n = (40.0 * (le / (0.3 + f64::from(i) * 0.05)).min(1.0)).round();
                    serde_json::json!({"le": le, "cumulative": n})
                })
                .chain([serde_json::json!({"le": "+Inf", "cumulative": 40.0})])
                .collect();
            serde_json::from_value(serde_json::json!({
                "schema_version": 1, "generated_at": 1000.0, "vllm_url": "http://127.0.0.1:8000", "vllm_up": true,
                "ready": true, "stale": false,
                "scrape": {"interval_secs": 5.0, "successes_total": 200},
                "latest": {"at": 999.0, "kv_cache_usage_ratio": 0.42, "requests_running": 3.0,
                           "requests_waiting": 1.0},
                "recent": {"window_secs": 60.0, "start": 940.0, "end": 999.0,
                           "ttft_seconds": {"p95": 0.4, "p99": 0.5, "count": 40.0},
                           "ttft_buckets": buckets},
                "recommendation": {"outcome": {"state": "not_yet", "code": "too_few_samples", "reason": "warming"}}
            }))
            .expect("a sidecar document")
        })
        .collect()
}

fn input() -> ScaleInput {
    ScaleInput {
        current_replicas: 8,
        ready_replicas: 8,
        replicas: (0..8)
            .map(|i| ReplicaSignals {
                kv_cache_usage: Some(0.5 + f64::from(i) * 0.03),
                waiting: Some(i % 3),
                running: Some(10 + i),
                ttft_p95: Some(Duration::from_millis(400 + u64::from(i) * 20)),
                ttft_p99: Some(Duration::from_millis(600 + u64::from(i) * 30)),
                queue_p95: None,
                fresh: i != 5,
            })
            .collect(),
        demand: Demand {
            requests_per_second: Some(35.0),
            in_flight: 12,
            queued_at_activator: 0,
            last_request_at: Some(Timestamp::from_millis(999_000)),
            requests_total: None,
        },
        ttft_window_count: Some(400.0),
    }
}

fn history(now: Timestamp) -> ScaleState {
    let start = now.as_millis() - 300_000;
    ScaleState {
        recommendations: (0..300)
            .map(|i| Recommendation {
                at: Timestamp::from_millis(start + i * 1000),
                replicas: 6 + (i % 5) as u32,
            })
            .collect(),
        events: (0..20)
            .map(|i| ScaleEvent {
                at: Timestamp::from_millis(start + i * 15_000),
                from: 7,
                to: 8,
            })
            .collect(),
        last_panic_at: None,
        panic_peak: 0,
        ..ScaleState::default()
    }
}

fn bench(c: &mut Criterion) {
    let policy = policy();
    let input = input();
    let now = Timestamp::from_millis(1_000_000);
    let empty = ScaleState::default();
    let full = history(now);
    let mut g = c.benchmark_group("decide");
    g.bench_function("empty_state", |b| {
        b.iter(|| decide(black_box(&input), &policy, &empty, now))
    });
    g.bench_function("history_300", |b| {
        b.iter(|| decide(black_box(&input), &policy, &full, now))
    });
    // The SLO guard on the p99 (`ttftSloPercentile: 99`) beside the p95 above, same input and history.
    let p99 = ScalePolicy {
        ttft_slo_percentile: SloPercentile::P99,
        ..policy.clone()
    };
    g.bench_function("history_300/guard_p99", |b| {
        b.iter(|| decide(black_box(&input), &p99, &full, now))
    });
    g.finish();
    // What the SLO guard reads, from the sidecars' documents: the pooled p95 and p99 of eight windows.
    let docs = sidecar_docs();
    let read: Vec<Option<&SidecarStatus>> = docs.iter().map(Some).collect();
    let pooled = inputs::scale_input(8, &read, inputs::MAX_SIGNAL_AGE, Demand::default());
    assert!(
        pooled
            .replicas
            .iter()
            .all(|r| r.ttft_p99 > r.ttft_p95 && r.ttft_p95.is_some()),
        "the documents pool into a p95 and a p99"
    );
    c.bench_function("scale_input/8_windows_pooled", |b| {
        b.iter(|| inputs::scale_input(8, black_box(&read), inputs::MAX_SIGNAL_AGE, Demand::default()))
    });
    c.bench_function("decide_and_record/history_300", |b| {
        b.iter_batched(
            || full.clone(),
            |mut state| {
                let d = decide(black_box(&input), &policy, &state, now);
                state.record(&d, now);
                state
            },
            criterion::BatchSize::SmallInput,
        )
    });
}

/// A day of 15 s syncs: busy half-hours with idle spells between (a wake after each), a few requests a sync.
fn day_ledger() -> (ScaleState, Timestamp) {
    let mut state = ScaleState {
        last_cold_start: Some(Duration::from_secs(28)),
        ..ScaleState::default()
    };
    let (mut total, mut last) = (0u64, 0u64);
    let mut t = 0u64;
    while t <= 86_400 {
        if (t / 1800) % 3 != 1 && !t.is_multiple_of(45) {
            total += 1 + t % 4;
            last = t;
        }
        let demand = Demand {
            requests_total: Some(total),
            last_request_at: Some(Timestamp::from_millis(last * 1000)),
            ..Demand::default()
        };
        state.cold_starts.observe(
            &demand,
            Duration::from_secs(300),
            Timestamp::from_millis(t * 1000),
        );
        t += 15;
    }
    (state, Timestamp::from_millis(86_400_000))
}

fn bench_coldstart(c: &mut Criterion) {
    let (state, now) = day_ledger();
    let copy = state.checkpoint(now).expect("a copy");
    let mut g = c.benchmark_group("coldstart");
    g.bench_function("evidence/day", |b| {
        b.iter(|| black_box(&state.cold_starts).evidence(Duration::from_secs(28), now))
    });
    g.bench_function("checkpoint/day", |b| b.iter(|| black_box(&state).checkpoint(now)));
    g.bench_function(format!("restore/day_copy_{}_samples", copy.samples.len()), |b| {
        b.iter(|| ScaleState::resume(black_box(&copy), now))
    });
    g.finish();
}

criterion_group!(benches, bench, bench_coldstart);
criterion_main!(benches);
