//! Building `InferenceAutoscaler.status` from a decision: pure, so the conditions' rules are unit-tested.
//!
//! Conditions follow HPA's (`kubectl describe hpa` readers know them):
//! - `AbleToScale`: the target's `/scale` could be read and written (`SucceededRescale`, `ReadyForNewScale`,
//!   `FailedGetScale`, `FailedUpdateScale`).
//! - `ScalingActive`: signals could be computed (`ValidMetricFound`), or why not (`MissingMetrics`, `ScaledToZero`,
//!   `InvalidSpec`).
//! - `ScalingLimited`: the count was cut by min/max or a rate limit (`TooManyReplicas`, `TooFewReplicas`,
//!   `RateLimited`) or not (`DesiredWithinRange`).
//! - `Valid`: the spec passed validation (`SpecValid`) or not (`InvalidSpec`, with every problem in the message).
//! - Tessera's own: `Consolidating` (`consolidate.rs`), `AllocationInSync` (`rollout.rs`), `SidecarsInjected`
//!   (`injection.rs`).
//!
//! `lastTransitionTime` only moves when a condition's status flips, as the Kubernetes API conventions require.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use tessera_core::recommend::Recommendation;
use tessera_core::scale::constraint::Constraint;
use tessera_core::scale::{ScaleDecision, ScaleReason};

use crate::crd::{InferenceAutoscalerStatus, RecommendationStatus, SignalStatus};

/// A status timestamp, in whole seconds; a clock before 1970 reads as the epoch.
///
/// Whole seconds because that is all a `metav1.Time` keeps on the wire: a status built with the nanoseconds would
/// never equal the one read back from the API server, so `write_status` would patch every object on every sync
/// (and wake every watcher of it) though nothing changed (the fleet bench saw one status write per model per round).
pub fn k8s_time(t: std::time::SystemTime) -> Time {
    use k8s_openapi::jiff::Timestamp;
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    Time(Timestamp::from_second(secs).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// The top-level fields of `next` that differ from `prev` (its camelCase names) as the API server stores them:
/// empty when writing `next` would change nothing. On the wire, not as Rust values: a `metav1.Time` keeps whole
/// seconds, so a time built from milliseconds (`classSince`) never equals the one read back, and comparing the
/// values made the controller patch every model's status on every sync (the fleet bench: one write per model per
/// round). The names go into the debug line of each write.
pub fn changed_fields(
    prev: Option<&InferenceAutoscalerStatus>,
    next: &InferenceAutoscalerStatus,
) -> Vec<String> {
    let as_map = |s: Option<&InferenceAutoscalerStatus>| match s.map(serde_json::to_value) {
        Some(Ok(serde_json::Value::Object(m))) => m,
        _ => serde_json::Map::new(),
    };
    let (before, after) = (as_map(prev), as_map(Some(next)));
    let mut keys: Vec<String> = before
        .keys()
        .chain(after.keys())
        .filter(|k| before.get(*k) != after.get(*k))
        .cloned()
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// The field manager written on every patch, so `kubectl get -o yaml --show-managed-fields` shows who set replicas.
pub const FIELD_MANAGER: &str = "tessera-autoscaler";

/// Condition types.
pub const ABLE_TO_SCALE: &str = "AbleToScale";
/// Condition types.
pub const SCALING_ACTIVE: &str = "ScalingActive";
/// Condition types.
pub const SCALING_LIMITED: &str = "ScalingLimited";
/// Condition types.
pub const VALID: &str = "Valid";

/// Sets (or adds) a condition, keeping `lastTransitionTime` when the status did not change.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) {
    let status_str = if status { "True" } else { "False" };
    // The API server limits messages to 32 KiB; ours are sentences, but a spec with many errors could grow.
    let message: String = message.chars().take(4096).collect();
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status_str {
                c.last_transition_time = now.clone();
            }
            c.status = status_str.to_owned();
            c.reason = reason.to_owned();
            c.message = message;
            c.observed_generation = generation;
        }
        None => conditions.push(Condition {
            type_: type_.to_owned(),
            status: status_str.to_owned(),
            reason: reason.to_owned(),
            message,
            observed_generation: generation,
            last_transition_time: now.clone(),
        }),
    }
}

/// What happened when the decision was applied.
#[derive(Debug, Clone, PartialEq)]
pub enum Applied {
    /// No change was needed.
    Unchanged,
    /// The target was scaled.
    Scaled,
    /// The `/scale` write failed (message).
    Failed(String),
    /// `spec.scaledBy: KEDA`: the decision is served to KEDA, which owns `/scale` (the ScaledObject found, if any).
    Published {
        /// The ScaledObject whose HPA targets the workload.
        scaled_object: Option<String>,
    },
    /// Another autoscaler claims the same `/scale`: nothing written (the message says what to change).
    Conflict(String),
}

/// `AbleToScale` when Tessera did not write `/scale`: KEDA owns it, two owners claim it, or the write failed.
fn why_not_written(applied: &Applied, decision: &ScaleDecision) -> Option<(bool, &'static str, String)> {
    match applied {
        Applied::Published { scaled_object } => {
            let by = scaled_object.as_ref().map_or_else(
                || "no ScaledObject scales it yet".to_owned(),
                |so| format!("ScaledObject {so} scales it"),
            );
            let message = format!(
                "spec.scaledBy: KEDA ({by}): Tessera serves its decision, {} replicas, through its external scaler \
                 and does not write /scale: {}",
                decision.desired_replicas, decision.message
            );
            Some((true, "ScaledByKEDA", message))
        }
        Applied::Conflict(message) => Some((false, "ScaleOwnerConflict", message.clone())),
        Applied::Failed(e) => Some((
            false,
            "FailedUpdateScale",
            format!("could not scale to {}: {e}", decision.desired_replicas),
        )),
        Applied::Unchanged | Applied::Scaled => None,
    }
}

/// The status after a decision.
#[allow(clippy::too_many_arguments)]
pub fn after_decision(
    previous: Option<&InferenceAutoscalerStatus>,
    generation: Option<i64>,
    target: &str,
    ready: u32,
    decision: &ScaleDecision,
    constraint: Constraint,
    applied: &Applied,
    recommendation: Option<RecommendationStatus>,
    now: &Time,
) -> InferenceAutoscalerStatus {
    let mut st = previous.cloned().unwrap_or_default();
    st.observed_generation = generation;
    st.target = Some(target.to_owned());
    st.ready_replicas = clamp_i32(ready);
    st.leading_signal = decision.leading_signal.map(|s| s.field().to_owned());
    st.last_decision_reason = Some(decision.reason.label().to_owned());
    st.constraint = Some(constraint.label().to_owned());
    st.current_metrics = decision
        .signals
        .iter()
        .map(|s| SignalStatus {
            name: s.signal.field().to_owned(),
            current: s.value,
            target: s.target,
            proposed_replicas: s.proposed.map(clamp_i32),
            reporting_replicas: clamp_i32(s.reporting_replicas),
        })
        .collect();
    if recommendation.is_some() {
        st.recommendation = recommendation;
    }
    match applied {
        Applied::Unchanged => {
            st.replicas = clamp_i32(decision.current_replicas);
            st.desired_replicas = clamp_i32(decision.desired_replicas);
            set_condition(
                &mut st.conditions,
                ABLE_TO_SCALE,
                true,
                "ReadyForNewScale",
                "the target's /scale subresource was read; no change needed",
                generation,
                now,
            );
        }
        Applied::Scaled => {
            st.replicas = clamp_i32(decision.desired_replicas);
            st.desired_replicas = clamp_i32(decision.desired_replicas);
            st.last_scale_time = Some(now.clone());
            set_condition(
                &mut st.conditions,
                ABLE_TO_SCALE,
                true,
                "SucceededRescale",
                &format!(
                    "scaled {} -> {}: {}",
                    decision.current_replicas, decision.desired_replicas, decision.message
                ),
                generation,
                now,
            );
        }
        // Nothing written by Tessera: the count stays what /scale said, the decision is reported.
        not_written => {
            st.replicas = clamp_i32(decision.current_replicas);
            st.desired_replicas = clamp_i32(decision.desired_replicas);
            if let Some((ok, reason, message)) = why_not_written(not_written, decision) {
                set_condition(
                    &mut st.conditions,
                    ABLE_TO_SCALE,
                    ok,
                    reason,
                    &message,
                    generation,
                    now,
                );
            }
        }
    }
    let (active, active_reason) = match decision.reason {
        ScaleReason::MissingMetrics if !decision.scaling_active => (false, "MissingMetrics"),
        ScaleReason::InvalidPolicy => (false, "InvalidSpec"),
        ScaleReason::IdleAtZero | ScaleReason::ScaleToZero => (false, "ScaledToZero"),
        _ => (true, "ValidMetricFound"),
    };
    set_condition(
        &mut st.conditions,
        SCALING_ACTIVE,
        active,
        active_reason,
        &decision.message,
        generation,
        now,
    );
    let limited_reason = if decision.scaling_limited {
        match decision.reason {
            ScaleReason::TooManyReplicas | ScaleReason::TooFewReplicas | ScaleReason::RateLimited => {
                decision.reason.condition_reason()
            }
            _ => "Limited",
        }
    } else {
        "DesiredWithinRange"
    };
    let limited_message = if decision.scaling_limited {
        decision.message.clone()
    } else {
        "the desired count is within the acceptable range".to_owned()
    };
    set_condition(
        &mut st.conditions,
        SCALING_LIMITED,
        decision.scaling_limited,
        limited_reason,
        &limited_message,
        generation,
        now,
    );
    set_condition(
        &mut st.conditions,
        VALID,
        true,
        "SpecValid",
        "the spec is valid",
        generation,
        now,
    );
    st
}

/// The status after a failure that stopped the decision (invalid spec, unreadable target): keeps the previous
/// values and sets one condition.
pub fn after_failure(
    previous: Option<&InferenceAutoscalerStatus>,
    generation: Option<i64>,
    condition: &str,
    reason: &str,
    message: &str,
    now: &Time,
) -> InferenceAutoscalerStatus {
    let mut st = previous.cloned().unwrap_or_default();
    st.observed_generation = generation;
    set_condition(
        &mut st.conditions,
        condition,
        false,
        reason,
        message,
        generation,
        now,
    );
    if condition == VALID {
        set_condition(
            &mut st.conditions,
            SCALING_ACTIVE,
            false,
            "InvalidSpec",
            message,
            generation,
            now,
        );
    }
    st
}

/// Sets the class fields of the status from the round's class step (`status.workloadClass`, its reason and
/// source, since when, the class's policy and the knobs that came from it), so `kubectl get ias -o wide` and `/ui`
/// agree. `None` (no class this round) keeps what the status had.
pub fn set_workload_class(
    st: &mut InferenceAutoscalerStatus,
    class: Option<&tessera_core::class::ClassRound>,
) {
    let Some(c) = class else { return };
    st.workload_class = Some(c.held.class.as_str().to_owned());
    // Same bound as a condition's message: the API server limits the object's size, not us.
    st.workload_class_reason = Some(c.held.reason.chars().take(1024).collect());
    st.workload_class_source = Some(c.held.source.as_str().to_owned());
    st.class_since = Some(k8s_time(
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(c.held.since.as_millis()),
    ));
    st.class_policy = Some(c.resolved.summary());
    st.policy_from_class = c.resolved.from_class.iter().map(|f| (*f).to_owned()).collect();
}

/// The merge patch for a status: fields that are unset now are sent as `null` so stale values are removed, and the
/// `resourceVersion` is included so a concurrent writer makes this patch fail with 409 instead of being overwritten.
pub fn merge_patch(status: &InferenceAutoscalerStatus, resource_version: Option<&str>) -> serde_json::Value {
    let mut value = serde_json::to_value(status).unwrap_or_default();
    if let Some(obj) = value.as_object_mut() {
        for key in [
            "observedGeneration",
            "target",
            "lastScaleTime",
            "leadingSignal",
            "lastDecisionReason",
            "recommendation",
            "workloadClass",
            "workloadClassReason",
            "workloadClassSource",
            "classSince",
            "classPolicy",
            "coldStartLedger",
        ] {
            obj.entry(key).or_insert(serde_json::Value::Null);
        }
        for key in ["currentMetrics", "conditions", "policyFromClass"] {
            obj.entry(key).or_insert(serde_json::json!([]));
        }
    }
    let mut patch = serde_json::json!({ "status": value });
    if let Some(rv) = resource_version {
        patch["metadata"] = serde_json::json!({ "resourceVersion": rv });
    }
    patch
}

/// `status.recommendation`: the largest need over the fresh replicas' recommendations (every replica must fit);
/// `None` when no replica has one, so the status keeps what it had.
pub fn largest_recommendation(recs: &[Recommendation]) -> Option<RecommendationStatus> {
    let need = tessera_core::recommend::largest_need(recs)?;
    Some(RecommendationStatus {
        kv_cache_memory_bytes: i64::try_from(need.kv_cache_memory_bytes).ok(),
        gpu_memory_utilization: Some(need.gpu_memory_utilization),
        gpu_memory_mib: i64::try_from(need.gpu_memory_mib).ok(),
        compute_fraction: Some(need.compute_fraction),
        reason: format!("largest need over {} replica(s): {}", recs.len(), need.summary()),
    })
}

fn clamp_i32(v: u32) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

/// A stable snake_case label as a condition reason (`urgent_growth` → `UrgentGrowth`: reasons are CamelCase).
pub fn camel(label: &str) -> String {
    label
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use k8s_openapi::jiff::Timestamp;
    use tessera_core::scale::{Signal, SignalDecision};

    #[test]
    fn a_status_that_differs_only_below_a_second_is_not_a_change() {
        let at = |ms| Some(super::Time(Timestamp::from_millisecond(ms).unwrap()));
        let stored = super::InferenceAutoscalerStatus {
            class_since: at(1_764_700_000_000),
            ..Default::default()
        };
        let built = super::InferenceAutoscalerStatus {
            class_since: at(1_764_700_000_456),
            ..stored.clone()
        };
        assert_ne!(stored, built, "the Rust values differ");
        assert!(super::changed_fields(Some(&stored), &built).is_empty());
        let later = super::InferenceAutoscalerStatus {
            class_since: at(1_764_700_001_000),
            desired_replicas: 2,
            ..stored.clone()
        };
        assert_eq!(
            super::changed_fields(Some(&stored), &later),
            ["classSince", "desiredReplicas"]
        );
        assert_eq!(
            super::changed_fields(None, &later),
            ["classSince", "desiredReplicas", "readyReplicas", "replicas"]
        );
    }

    #[test]
    fn a_status_time_reads_back_equal_from_the_wire() {
        let now = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(1_764_700_000_123_456_789);
        let t = super::k8s_time(now);
        let wire = serde_json::to_string(&t).unwrap();
        let back: super::Time = serde_json::from_str(&wire).unwrap();
        assert_eq!(back, t, "{wire}");
        assert_eq!(t.0.as_second(), 1_764_700_000);
        assert_eq!(
            super::k8s_time(std::time::UNIX_EPOCH - std::time::Duration::from_secs(5)).0,
            Timestamp::UNIX_EPOCH
        );
    }

    use super::*;

    fn time(s: i64) -> Time {
        Time(Timestamp::from_second(s).unwrap())
    }

    fn decision(current: u32, desired: u32, reason: ScaleReason, limited: bool) -> ScaleDecision {
        ScaleDecision {
            desired_replicas: desired,
            current_replicas: current,
            recommendation: desired,
            reason,
            message: "kv_cache_utilization 0.900 vs target 0.5: scaling".into(),
            signals: vec![SignalDecision {
                signal: Signal::KvCacheUtilization,
                value: Some(0.9),
                target: 0.5,
                proposed: Some(desired),
                reporting_replicas: current,
                missing_replicas: 0,
            }],
            leading_signal: Some(Signal::KvCacheUtilization),
            panicking: false,
            panic_triggered: false,
            scaling_active: true,
            scaling_limited: limited,
            history_horizon: std::time::Duration::from_secs(300),
            prefill_held: None,
        }
    }

    /// A decision on `Deployment/a` at second `at`, with no generation or recommendation to report.
    fn decided(
        prev: Option<&InferenceAutoscalerStatus>,
        ready: u32,
        d: &ScaleDecision,
        applied: &Applied,
        at: i64,
    ) -> InferenceAutoscalerStatus {
        after_decision(
            prev,
            None,
            "Deployment/a",
            ready,
            d,
            Constraint::KvCache,
            applied,
            None,
            &time(at),
        )
    }

    fn cond<'a>(st: &'a InferenceAutoscalerStatus, t: &str) -> &'a Condition {
        st.conditions.iter().find(|c| c.type_ == t).unwrap()
    }

    #[test]
    fn scaling_sets_hpa_like_conditions_and_fields() {
        let d = decision(2, 4, ScaleReason::ScaleUp, false);
        let st = after_decision(
            None,
            Some(3),
            "Deployment/llama",
            2,
            &d,
            Constraint::KvCache,
            &Applied::Scaled,
            None,
            &time(100),
        );
        assert_eq!((st.replicas, st.desired_replicas, st.ready_replicas), (4, 4, 2));
        assert_eq!(st.last_scale_time, Some(time(100)));
        assert_eq!(st.leading_signal.as_deref(), Some("kvCacheUtilization"));
        assert_eq!(st.last_decision_reason.as_deref(), Some("scale_up"));
        assert_eq!(st.constraint.as_deref(), Some("kv_cache"));
        assert_eq!(st.current_metrics[0].proposed_replicas, Some(4));
        assert_eq!(cond(&st, ABLE_TO_SCALE).reason, "SucceededRescale");
        assert_eq!(cond(&st, SCALING_ACTIVE).status, "True");
        assert_eq!(cond(&st, SCALING_LIMITED).reason, "DesiredWithinRange");
        assert_eq!(cond(&st, VALID).observed_generation, Some(3));
    }

    #[test]
    fn transition_time_moves_only_when_status_flips() {
        let d = decision(2, 2, ScaleReason::WithinTolerance, false);
        let st = decided(None, 2, &d, &Applied::Unchanged, 100);
        let st = decided(Some(&st), 2, &d, &Applied::Unchanged, 200);
        assert_eq!(cond(&st, SCALING_LIMITED).last_transition_time, time(100));
        let limited = decision(2, 3, ScaleReason::TooManyReplicas, true);
        let st = decided(Some(&st), 2, &limited, &Applied::Scaled, 300);
        let c = cond(&st, SCALING_LIMITED);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "TooManyReplicas")
        );
        assert_eq!(c.last_transition_time, time(300));
        // last scale time stays from the scale at 300 while nothing changes.
        let st = decided(Some(&st), 3, &d, &Applied::Unchanged, 400);
        assert_eq!(st.last_scale_time, Some(time(300)));
    }

    #[test]
    fn failures_keep_values_and_explain() {
        let d = decision(2, 4, ScaleReason::ScaleUp, false);
        let st = decided(None, 2, &d, &Applied::Failed("forbidden".into()), 1);
        let c = cond(&st, ABLE_TO_SCALE);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "FailedUpdateScale")
        );
        assert!(c.message.contains("forbidden"));
        assert_eq!(st.replicas, 2);
        let st = after_failure(
            Some(&st),
            Some(2),
            VALID,
            "InvalidSpec",
            "maxReplicas must be >= minReplicas",
            &time(2),
        );
        assert_eq!(cond(&st, VALID).status, "False");
        assert_eq!(cond(&st, SCALING_ACTIVE).reason, "InvalidSpec");
        assert_eq!(st.replicas, 2, "values from before are kept");
    }

    #[test]
    fn the_workload_class_is_set_kept_and_survives_a_decision() {
        use tessera_core::class::{ClassRound, Explicit, Held, Source, WorkloadClass, policy};
        use tessera_core::scale::{ScalePolicy, Timestamp};
        let mut st = InferenceAutoscalerStatus::default();
        set_workload_class(&mut st, None);
        assert_eq!(st.workload_class, None);
        let batch = ClassRound {
            held: Held {
                class: WorkloadClass::Batch,
                source: Source::Declared,
                reason: "owned by a Job: it runs to completion".into(),
                since: Timestamp::from_millis(1_700_000_000_000),
                changed_from: Some(WorkloadClass::Realtime),
            },
            resolved: policy::apply(
                WorkloadClass::Batch,
                &mut ScalePolicy::default(),
                Explicit::default(),
            ),
        };
        set_workload_class(&mut st, Some(&batch));
        assert_eq!(st.workload_class.as_deref(), Some("batch"));
        assert_eq!(st.workload_class_source.as_deref(), Some("declared"));
        assert_eq!(
            st.workload_class_reason.as_deref(),
            Some(batch.held.reason.as_str())
        );
        assert!(st.policy_from_class.iter().any(|f| f == "requestPriority"));
        // A round with nothing classified keeps it; so does the next decision's status.
        set_workload_class(&mut st, None);
        let d = decision(2, 2, ScaleReason::WithinTolerance, false);
        let next = after_decision(
            Some(&st),
            None,
            "Deployment/a",
            2,
            &d,
            Constraint::KvCache,
            &Applied::Unchanged,
            None,
            &time(1),
        );
        assert_eq!(next.workload_class.as_deref(), Some("batch"));
        let json = serde_json::to_value(&next).unwrap();
        assert_eq!(json["workloadClass"], "batch");
        assert_eq!(json["classSince"], "2023-11-14T22:13:20Z");
        assert!(json["workloadClassReason"].as_str().unwrap().contains("Job"));
        assert!(json["classPolicy"].as_str().unwrap().contains("priority 10"));
    }

    #[test]
    fn merge_patch_clears_unset_fields_and_carries_the_resource_version() {
        let st = InferenceAutoscalerStatus::default();
        let p = merge_patch(&st, Some("42"));
        assert_eq!(p["metadata"]["resourceVersion"], "42");
        assert!(p["status"]["leadingSignal"].is_null());
        assert_eq!(p["status"]["conditions"], serde_json::json!([]));
    }

    #[test]
    fn the_recommendation_is_the_largest_need_over_replicas() {
        use tessera_core::recommend::Source;
        let rec = |kv: u64, util: f64, mib: u64, cf: f64| Recommendation {
            kv_cache_memory_bytes: kv,
            kv_cache_tokens: kv / 1024,
            gpu_memory_utilization: util,
            gpu_memory_mib: mib,
            compute_fraction: cf,
            bytes_per_kv_token: 1024,
            bytes_per_kv_token_source: Source::Configured,
            non_kv_bytes: 1 << 30,
            non_kv_source: Source::Configured,
            reasons: Vec::new(),
        };
        assert_eq!(
            largest_recommendation(&[]),
            None,
            "no replica recommendation: keep whatever status had"
        );
        let r =
            largest_recommendation(&[rec(4 << 30, 0.35, 9000, 0.25), rec(6 << 30, 0.30, 8000, 0.5)]).unwrap();
        assert_eq!(r.kv_cache_memory_bytes, Some(6 << 30));
        assert_eq!(r.gpu_memory_utilization, Some(0.35));
        assert_eq!(r.gpu_memory_mib, Some(9000));
        assert_eq!(r.compute_fraction, Some(0.5));
        assert!(
            r.reason.starts_with("largest need over 2 replica(s)"),
            "{}",
            r.reason
        );
    }
}
