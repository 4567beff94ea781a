//! One signal's replica proposal: Kubernetes HPA's replica calculator
//! (`pkg/controller/podautoscaler/replica_calculator.go`), re-stated over plain numbers.
//!
//! Per-replica signals (KV usage, waiting requests, TTFT) follow HPA's pod-metric rule:
//! - usage ratio = mean over replicas with fresh data ÷ target;
//! - within tolerance → no change; otherwise `ceil(ratio × reporting replicas)`;
//! - when some ready replicas have no fresh data ("missing"), they count as exactly at target if the ratio says
//!   scale down, and as 0 if it says scale up; replicas not ready yet count as 0 on a scale-up. The ratio is then
//!   recomputed, and if it is now within tolerance or points the other way, nothing changes. This is why missing
//!   data can only ever dampen a change, never cause a scale-down.
//!
//! The request rate is a model-wide total (from the activator), so it follows HPA's external-metric `AverageValue`
//! rule: ratio = total ÷ (target × current replicas); outside tolerance → `ceil(total ÷ target)`.

use super::{ReplicaSignals, ScaleInput, ScalePolicy, Signal, SignalDecision, ceil_u32};

/// What `signal` alone asks for.
pub(super) fn propose(
    signal: Signal,
    target: f64,
    input: &ScaleInput,
    policy: &ScalePolicy,
) -> SignalDecision {
    let current = input.current_replicas;
    let mut out = SignalDecision {
        signal,
        value: None,
        target,
        proposed: None,
        reporting_replicas: 0,
        missing_replicas: 0,
    };
    if signal == Signal::RequestsPerSecondPerReplica {
        let Some(total) = input
            .demand
            .requests_per_second
            .filter(|r| r.is_finite() && *r >= 0.0)
        else {
            return out;
        };
        let per_replica = total / f64::from(current.max(1));
        out.value = Some(per_replica);
        out.reporting_replicas = current;
        let ratio = per_replica / target;
        out.proposed = Some(if (1.0 - ratio).abs() <= policy.tolerance {
            current
        } else {
            ceil_u32(total / target)
        });
        return out;
    }

    let values: Vec<f64> = input
        .replicas
        .iter()
        .filter(|r| r.fresh)
        .filter_map(|r| value_of(signal, r))
        .filter(|v| v.is_finite())
        .collect();
    let reporting = u32::try_from(values.len()).unwrap_or(u32::MAX);
    // Ready replicas without a usable value: listed as stale, or not listed at all.
    let missing = input.ready_replicas.saturating_sub(reporting);
    let unready = current.saturating_sub(input.ready_replicas.max(reporting));
    out.reporting_replicas = reporting;
    out.missing_replicas = missing;
    if values.is_empty() {
        return out;
    }
    let sum: f64 = values.iter().sum();
    let mean = sum / f64::from(reporting);
    out.value = Some(mean);
    let ratio = mean / target;
    let tol = policy.tolerance;
    let scale_up_with_unready = unready > 0 && ratio > 1.0;

    if !scale_up_with_unready && missing == 0 {
        out.proposed = Some(if (1.0 - ratio).abs() <= tol {
            current
        } else {
            ceil_u32(ratio * f64::from(reporting))
        });
        return out;
    }

    // Fill in the replicas we could not measure in the direction that dampens the change.
    let mut filled_sum = sum;
    let mut filled_n = f64::from(reporting);
    if missing > 0 {
        if ratio < 1.0 {
            filled_sum += target * f64::from(missing);
        }
        filled_n += f64::from(missing);
    }
    if scale_up_with_unready {
        filled_n += f64::from(unready);
    }
    let new_ratio = filled_sum / filled_n / target;
    let reversed = (ratio < 1.0 && new_ratio > 1.0) || (ratio > 1.0 && new_ratio < 1.0);
    if (1.0 - new_ratio).abs() <= tol || reversed {
        out.proposed = Some(current);
        return out;
    }
    let proposed = ceil_u32(new_ratio * filled_n);
    // A fill-in that would move the count against the ratio's direction means "no change" (HPA does the same).
    let against = (new_ratio < 1.0 && proposed > current) || (new_ratio > 1.0 && proposed < current);
    out.proposed = Some(if against { current } else { proposed });
    out
}

fn value_of(signal: Signal, r: &ReplicaSignals) -> Option<f64> {
    match signal {
        Signal::KvCacheUtilization => r.kv_cache_usage,
        Signal::WaitingRequestsPerReplica => r.waiting.map(f64::from),
        Signal::TtftP95 => r.ttft_p95.map(|d| d.as_secs_f64()),
        Signal::RequestsPerSecondPerReplica => None,
    }
}
