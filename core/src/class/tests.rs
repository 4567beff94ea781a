//! Labelled cases, each with its reason: declared cases always, observed cases on the real traces in the
//! project (`testdata/azure_llm_2023`, `testdata/azure_functions_2019`). A wrong label on a trace is a bug in
//! the rule, not in the test.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use super::detect::{Declared, ObservedTraffic, Source, TierCounts, detect};
use super::policy::{self, ClassPolicy, Explicit, fields};
use super::shape::{Moments, Shape, ShapeStats};
use super::stable::{ClassState, LEAVE_REALTIME_AFTER, MIN_DWELL};
use super::{MinuteSeries, WorkloadClass};
use crate::scale::{ScalePolicy, ScaleToZero, SloPercentile, Timestamp};

const CONVERSATION: &str = include_str!("../../../testdata/azure_llm_2023/AzureLLMInferenceTrace_conv.csv");
const FUNCTIONS: &str = include_str!("../../../testdata/azure_functions_2019/functions_sample.csv");

/// Seconds since midnight of an Azure LLM trace timestamp (`2023-11-16 18:15:46.6805900`).
fn seconds_of_day(ts: &str) -> f64 {
    let time = ts.split(' ').nth(1).unwrap();
    let mut parts = time.split(':');
    let h: f64 = parts.next().unwrap().parse().unwrap();
    let m: f64 = parts.next().unwrap().parse().unwrap();
    let s: f64 = parts.next().unwrap().parse().unwrap();
    h * 3600.0 + m * 60.0 + s
}

/// The conversation trace as the activator would count it: per-minute arrivals and the prompts' lengths.
fn conversation() -> ObservedTraffic {
    let rows: Vec<(f64, f64)> = CONVERSATION
        .lines()
        .skip(1)
        .filter(|l| !l.is_empty())
        .map(|l| {
            let mut f = l.split(',');
            let t = seconds_of_day(f.next().unwrap());
            let prompt: f64 = f.next().unwrap().parse().unwrap();
            (t, prompt)
        })
        .collect();
    let start = rows[0].0;
    let mut minutes = vec![0u32; 0];
    let mut lengths = Moments::default();
    for (t, prompt) in &rows {
        let m = ((t - start) / 60.0) as usize;
        if minutes.len() <= m {
            minutes.resize(m + 1, 0);
        }
        minutes[m] += 1;
        lengths.push(*prompt);
    }
    // The last minute is partial.
    minutes.pop();
    ObservedTraffic {
        minute_counts: minutes,
        prompt_lengths: lengths,
        ..ObservedTraffic::default()
    }
}

/// Each function of the Azure Functions sample: its hash prefix and its day of per-minute invocations.
fn functions() -> Vec<(String, Vec<u32>)> {
    FUNCTIONS
        .lines()
        .skip(1)
        .filter(|l| !l.is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            let counts = f[3..].iter().map(|c| c.trim().parse().unwrap()).collect();
            (f[0][..10].to_owned(), counts)
        })
        .collect()
}

/// A templated offline job: 50,000 requests filling one template with inputs of near-equal length, sent as
/// fast as they are admitted. No public trace of such a job is in the project (the ServeGen offline jobs are
/// described, not published per request), so this one is generated: a seeded spread of ±3% around 800 tokens.
fn templated_job() -> ObservedTraffic {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut lengths = Moments::default();
    for _ in 0..50_000 {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let u = (seed >> 11) as f64 / (1u64 << 53) as f64;
        lengths.push(800.0 * (0.97 + 0.06 * u));
    }
    ObservedTraffic {
        minute_counts: vec![1200; 45],
        prompt_lengths: lengths,
        streamed: Some((50_000, 0)),
        ..ObservedTraffic::default()
    }
}

fn auto() -> Declared {
    Declared::default()
}

#[test]
fn declared_cases_win_and_say_so() {
    let busy_chat = ObservedTraffic {
        streamed: Some((1000, 900)),
        ttft_objective_secs: Some(1.0),
        ..conversation()
    };
    let cases: Vec<(&str, Declared, WorkloadClass, &str)> = vec![
        (
            "pinned batch beats streamed chat",
            Declared {
                pinned: Some(WorkloadClass::Batch),
                ..auto()
            },
            WorkloadClass::Batch,
            "pinned by spec.workloadClass: batch",
        ),
        (
            "a Job owner",
            Declared {
                owner_kind: Some("Job".into()),
                ..auto()
            },
            WorkloadClass::Batch,
            "owned by a Job",
        ),
        (
            "a CronJob owner",
            Declared {
                owner_kind: Some("CronJob".into()),
                ..auto()
            },
            WorkloadClass::Batch,
            "owned by a CronJob",
        ),
        (
            "a Kueue queue",
            Declared {
                kueue_queue: Some("team-a-batch".into()),
                ..auto()
            },
            WorkloadClass::Batch,
            "Kueue queue \"team-a-batch\"",
        ),
        (
            "flex tier",
            Declared {
                tiers: TierCounts {
                    flex: 95,
                    default: 5,
                    priority: 0,
                },
                ..auto()
            },
            WorkloadClass::Batch,
            "95% of 100 requests asked for service_tier flex",
        ),
        (
            "priority tier beats a Job owner",
            Declared {
                owner_kind: Some("Job".into()),
                tiers: TierCounts {
                    priority: 10,
                    default: 90,
                    flex: 0,
                },
                ..auto()
            },
            WorkloadClass::Realtime,
            "10% of 100 requests asked for service_tier priority",
        ),
        (
            "a Deployment owner declares nothing",
            Declared {
                owner_kind: Some("Deployment".into()),
                ..auto()
            },
            WorkloadClass::Realtime,
            "streamed",
        ),
    ];
    for (name, declared, want, why) in cases {
        let d = detect(&declared, &busy_chat, None);
        assert_eq!(d.class, want, "{name}: {}", d.reason);
        assert!(d.reason.contains(why), "{name}: {:?} lacks {why:?}", d.reason);
    }
    // Too few tiered requests say nothing.
    let few = Declared {
        tiers: TierCounts {
            flex: 5,
            ..TierCounts::default()
        },
        ..auto()
    };
    assert_eq!(
        detect(&few, &ObservedTraffic::default(), None).source,
        Source::Default
    );
}

#[test]
fn the_azure_conversation_trace_is_realtime() {
    let o = conversation();
    let s = ShapeStats::of(&o.minute_counts, super::shape::ON_OFF_MAX_ACTIVE).unwrap();
    assert_eq!(s.shape, Shape::Flat, "{}", s.describe());
    assert!(o.prompt_lengths.cv().unwrap() > 0.5);
    for objective in [None, Some(1.0), Some(5.0)] {
        let d = detect(
            &auto(),
            &ObservedTraffic {
                ttft_objective_secs: objective,
                ..o.clone()
            },
            None,
        );
        assert_eq!(d.class, WorkloadClass::Realtime, "{objective:?}: {}", d.reason);
        assert_eq!(d.source, Source::Observed);
        assert!(
            d.reason.contains("flat") && d.reason.contains("prompts spread"),
            "{}",
            d.reason
        );
    }
}

#[test]
fn azure_functions_on_off_apps_are_near_realtime_with_an_objective_and_batch_without() {
    let all = functions();
    assert_eq!(all.len(), 6);
    for (hash, counts) in all {
        let with = ObservedTraffic {
            minute_counts: counts.clone(),
            ttft_objective_secs: Some(5.0),
            ..ObservedTraffic::default()
        };
        let d = detect(&auto(), &with, None);
        assert_eq!(d.class, WorkloadClass::NearRealtime, "{hash}: {}", d.reason);
        assert!(d.reason.contains("on/off bursts"), "{hash}: {}", d.reason);
        let without = ObservedTraffic {
            minute_counts: counts,
            ..ObservedTraffic::default()
        };
        let d = detect(&auto(), &without, None);
        assert_eq!(d.class, WorkloadClass::Batch, "{hash}: {}", d.reason);
        assert!(d.reason.contains("no latency objective"), "{hash}: {}", d.reason);
    }
}

#[test]
fn a_templated_offline_job_is_batch() {
    let d = detect(&auto(), &templated_job(), None);
    assert_eq!(d.class, WorkloadClass::Batch, "{}", d.reason);
    assert!(d.reason.contains("templated offline job"), "{}", d.reason);
    // Given a tight objective someone waits on, templating alone does not make it batch.
    let waited = ObservedTraffic {
        ttft_objective_secs: Some(1.0),
        ..templated_job()
    };
    assert_eq!(detect(&auto(), &waited, None).class, WorkloadClass::Realtime);
}

#[test]
fn observed_rules_each_with_a_reason() {
    let on_off = functions().remove(0).1;
    let cases: Vec<(&str, ObservedTraffic, WorkloadClass, &str)> = vec![
        (
            "an inter-token objective",
            ObservedTraffic {
                itl_objective_secs: Some(0.05),
                minute_counts: on_off.clone(),
                ..ObservedTraffic::default()
            },
            WorkloadClass::Realtime,
            "inter-token objective",
        ),
        (
            "streamed bursts",
            ObservedTraffic {
                streamed: Some((200, 180)),
                minute_counts: on_off.clone(),
                ..ObservedTraffic::default()
            },
            WorkloadClass::Realtime,
            "90% of 200 requests streamed",
        ),
        (
            "a two-minute objective",
            ObservedTraffic {
                ttft_objective_secs: Some(120.0),
                ..conversation()
            },
            WorkloadClass::Batch,
            "nobody waits",
        ),
        (
            "a thirty-second objective on steady traffic",
            ObservedTraffic {
                ttft_objective_secs: Some(30.0),
                ..conversation()
            },
            WorkloadClass::NearRealtime,
            "not token by token",
        ),
        (
            "nothing yet",
            ObservedTraffic {
                active_ratio: Some(0.2),
                ..ObservedTraffic::default()
            },
            WorkloadClass::Realtime,
            "real-time until shown otherwise",
        ),
    ];
    for (name, o, want, why) in cases {
        let d = detect(&auto(), &o, None);
        assert_eq!(d.class, want, "{name}: {}", d.reason);
        assert!(d.reason.contains(why), "{name}: {:?} lacks {why:?}", d.reason);
    }
}

#[test]
fn a_diurnal_day_is_realtime() {
    // A day of traffic busier by day than by night, every minute active.
    let counts: Vec<u32> = (0..1440u32)
        .map(|m| {
            let h = m / 60;
            if (8..20).contains(&h) { 40 } else { 5 }
        })
        .collect();
    let s = ShapeStats::of(&counts, super::shape::ON_OFF_MAX_ACTIVE).unwrap();
    assert_eq!(s.shape, Shape::Diurnal);
    let d = detect(
        &auto(),
        &ObservedTraffic {
            minute_counts: counts,
            ..ObservedTraffic::default()
        },
        None,
    );
    assert_eq!(d.class, WorkloadClass::Realtime, "{}", d.reason);
    assert!(d.reason.contains("diurnal"));
}

#[test]
fn hysteresis_keeps_a_model_near_a_threshold_where_it_is() {
    // 40% streamed: not enough to enter real-time, enough to stay.
    let o = ObservedTraffic {
        streamed: Some((500, 200)),
        minute_counts: functions().remove(0).1,
        ..ObservedTraffic::default()
    };
    assert_eq!(detect(&auto(), &o, None).class, WorkloadClass::Batch);
    assert_eq!(
        detect(&auto(), &o, Some(WorkloadClass::Batch)).class,
        WorkloadClass::Batch
    );
    assert_eq!(
        detect(&auto(), &o, Some(WorkloadClass::Realtime)).class,
        WorkloadClass::Realtime
    );
}

#[test]
fn a_tier_share_hovering_at_its_threshold_does_not_switch_the_class() {
    let tiers = |flex: u64| Declared {
        tiers: TierCounts {
            flex,
            default: 100 - flex,
            priority: 0,
        },
        ..auto()
    };
    let o = ObservedTraffic::default();
    // 92% flex enters batch from nothing, but not from real-time (95% there); once batch, 85% keeps it.
    use WorkloadClass::{Batch, Realtime};
    for (flex, from, want) in [
        (92, None, Batch),
        (92, Some(Realtime), Realtime),
        (96, Some(Realtime), Batch),
        (85, Some(Batch), Batch),
        (75, Some(Batch), Realtime),
    ] {
        assert_eq!(
            detect(&tiers(flex), &o, from).class,
            want,
            "{flex}% flex from {from:?}"
        );
    }
    let mut state = ClassState::default();
    let mut changes = 0;
    for m in 0..200 {
        let flex = if m % 2 == 0 { 91 } else { 89 };
        let d = detect(&tiers(flex), &o, state.class);
        changes += usize::from(state.hold(d, at(m)).changed_from.is_some());
    }
    assert!(changes <= 1, "{changes} changes");
}

fn at(minutes: u64) -> Timestamp {
    Timestamp::from_millis(1_000_000_000 + minutes * 60_000)
}

#[test]
fn slow_to_leave_realtime_and_never_flapping() {
    let mut state = ClassState::default();
    let chat = detect(&auto(), &conversation(), None);
    let held = state.hold(chat.clone(), at(0));
    assert_eq!(held.class, WorkloadClass::Realtime);
    assert_eq!(held.changed_from, None);
    let batch = detect(&auto(), &templated_job(), Some(WorkloadClass::Realtime));
    assert_eq!(batch.class, WorkloadClass::Batch);
    // Batch traffic for 29 minutes, one round a minute: still real-time, and the reason says what is pending.
    for m in 1..30 {
        let h = state.hold(batch.clone(), at(m));
        assert_eq!(h.class, WorkloadClass::Realtime, "minute {m}");
        assert!(h.reason.contains("held"), "{}", h.reason);
    }
    let h = state.hold(batch.clone(), at(31));
    assert_eq!(h.class, WorkloadClass::Batch, "{}", h.reason);
    assert_eq!(h.changed_from, Some(WorkloadClass::Realtime));
    assert_eq!(h.since, at(31));
    // Alternating readings never change it: each break restarts the count.
    let mut changes = 0;
    for m in 32..400 {
        let d = if m % 3 == 0 { chat.clone() } else { batch.clone() };
        changes += usize::from(state.hold(d, at(m)).changed_from.is_some());
    }
    assert_eq!(changes, 0);
    assert!(LEAVE_REALTIME_AFTER >= MIN_DWELL);
}

#[test]
fn a_pin_changes_the_class_at_once_and_unpinning_returns_it() {
    let mut state = ClassState::default();
    state.hold(detect(&auto(), &conversation(), None), at(0));
    let pinned = Declared {
        pinned: Some(WorkloadClass::Batch),
        ..auto()
    };
    let h = state.hold(detect(&pinned, &conversation(), state.class), at(1));
    assert_eq!(h.class, WorkloadClass::Batch);
    assert_eq!(h.changed_from, Some(WorkloadClass::Realtime));
    assert_eq!(h.source, Source::Pinned);
    // The pin removed: the traffic's class at once, not after a dwell.
    let h = state.hold(detect(&auto(), &conversation(), state.class), at(2));
    assert_eq!(h.class, WorkloadClass::Realtime);
    assert_eq!(h.changed_from, Some(WorkloadClass::Batch));
}

#[test]
fn minute_series_feeds_the_shape() {
    let (_, counts) = functions().remove(4);
    let series = MinuteSeries::from_counts(0, &counts);
    assert_eq!(series.counts(), counts);
    let s = ShapeStats::of(&series.counts(), super::shape::ON_OFF_MAX_ACTIVE).unwrap();
    assert_eq!(s.shape, Shape::OnOff);
}

#[test]
fn class_defaults_fill_what_the_spec_left_and_no_more() {
    let base = ScalePolicy {
        min_replicas: 0,
        max_replicas: 3,
        scale_to_zero: Some(ScaleToZero::after(Duration::from_secs(600))),
        ttft_slo: Some(Duration::from_secs(2)),
        ..ScalePolicy::default()
    };
    // Real-time is today's defaults: nothing moves.
    let mut p = base.clone();
    let r = policy::apply(WorkloadClass::Realtime, &mut p, Explicit::default());
    assert_eq!(p, base);
    assert!(r.from_class.contains(&fields::COLD_START_MISS_BUDGET));
    // Batch spends cold starts; an explicit budget wins and is not listed as the class's.
    let mut p = base.clone();
    policy::apply(WorkloadClass::Batch, &mut p, Explicit::default());
    assert_eq!(
        p.scale_to_zero.as_ref().unwrap().cold_start_miss_budget,
        Some(0.5)
    );
    let mut explicit = base.clone();
    if let Some(z) = explicit.scale_to_zero.as_mut() {
        z.cold_start_miss_budget = Some(0.001);
    }
    let mut p = explicit.clone();
    let r = policy::apply(
        WorkloadClass::Batch,
        &mut p,
        Explicit {
            cold_start_miss_budget: true,
            ttft_slo_percentile: false,
        },
    );
    assert_eq!(
        p.scale_to_zero.as_ref().unwrap().cold_start_miss_budget,
        Some(0.001)
    );
    assert!(!r.from_class.contains(&fields::COLD_START_MISS_BUDGET));
    assert_eq!(p.ttft_slo_percentile, SloPercentile::P95);
    assert!(r.summary().contains("priority 10"), "{}", r.summary());
    // Real-time is never packed beside batch on a time-sliced GPU, from either side.
    let rt = ClassPolicy::of(WorkloadClass::Realtime);
    let batch = ClassPolicy::of(WorkloadClass::Batch);
    assert!(!rt.may_share_with(WorkloadClass::Batch));
    assert!(!batch.may_share_with(WorkloadClass::Realtime));
    assert!(batch.may_share_with(WorkloadClass::NearRealtime));
    assert!(rt.may_share_with(WorkloadClass::NearRealtime));
}

#[test]
fn names_round_trip() {
    for c in WorkloadClass::ALL {
        assert_eq!(WorkloadClass::from_name(c.as_str()), Some(c));
        assert_eq!(
            serde_json::to_value(c).unwrap(),
            serde_json::Value::String(c.to_string())
        );
    }
}
