//! The peers' own scaling rules, configured from their published defaults (sources in `docs/simulator.md`).
//!
//! Tessera's and AIBrix's replica counts come from `tessera_core::scale::decide` (AIBrix's APA is a ratio rule
//! with tolerances and a scale-down cooldown, which the core rule expresses); KubeAI and the KEDA HTTP add-on
//! scale on in-flight requests counted at their proxy, which the core rule has no target for, so their rule is
//! here: pure, no clock, fed the proxy's count at each sync.

use std::collections::VecDeque;

/// KubeAI's Model `targetRequests` default (api/v1/model_types.go: `+kubebuilder:default=100`).
pub const KUBEAI_TARGET_REQUESTS: f64 = 100.0;
/// KubeAI's Model `scaleDownDelaySeconds` default (`+kubebuilder:default=30`).
pub const KUBEAI_SCALE_DOWN_DELAY_S: f64 = 30.0;
/// KubeAI's system config `modelAutoscaling.timeWindow` default: the in-flight average covers 10 minutes.
pub const KUBEAI_TIME_WINDOW_S: f64 = 600.0;
/// KEDA HTTP add-on: `scalingMetric.concurrency.targetValue` (formerly `targetPendingRequests`) default 100.
pub const KEDA_HTTP_TARGET_CONCURRENCY: f64 = 100.0;
/// KEDA ScaledObject `cooldownPeriod` default: 300 s at zero activity before scaling to zero.
pub const KEDA_COOLDOWN_S: f64 = 300.0;
/// HPA's default scale-down stabilization window, which KEDA's HPA keeps for 1 ↔ N.
pub const HPA_SCALE_DOWN_STABILIZATION_S: f64 = 300.0;
/// KEDA HTTP interceptor `KEDA_CONDITION_WAIT_TIMEOUT` default: a request held while the workload is at zero
/// fails after 20 s.
pub const KEDA_HOLD_TIMEOUT_S: f64 = 20.0;
/// AIBrix APA: `UpFluctuationTolerance` / `DownFluctuationTolerance` defaults (pkg/controller/podautoscaler/context).
pub const AIBRIX_TOLERANCE: f64 = 0.1;
/// AIBrix APA: `ScaleDownCooldownWindow` default, 300 s.
pub const AIBRIX_SCALE_DOWN_COOLDOWN_S: f64 = 300.0;
/// AIBrix's sample APA target for `gpu_cache_usage_perc` (KV cache usage): 50%.
pub const AIBRIX_KV_TARGET: f64 = 0.5;

/// A scale-on-in-flight rule (KubeAI, KEDA HTTP).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConcurrencyRule {
    /// In-flight requests per replica to aim for.
    pub target: f64,
    /// The in-flight count is averaged over this window (0 = the latest sample).
    pub window_s: f64,
    /// A lower count applies only once it has been asked for continuously this long.
    pub scale_down_delay_s: f64,
    /// Scale to zero after this long with nothing in flight (`None`: never below one).
    pub zero_after_s: Option<f64>,
}

impl ConcurrencyRule {
    /// KubeAI's defaults: 100 in flight per replica averaged over 10 min, 30 s scale-down delay; KubeAI scales
    /// to zero when the average reaches zero (min replicas 0), holding requests at its proxy meanwhile.
    pub fn kubeai() -> ConcurrencyRule {
        ConcurrencyRule {
            target: KUBEAI_TARGET_REQUESTS,
            window_s: KUBEAI_TIME_WINDOW_S,
            scale_down_delay_s: KUBEAI_SCALE_DOWN_DELAY_S,
            zero_after_s: Some(0.0),
        }
    }

    /// The KEDA HTTP add-on's defaults: concurrency 100 per replica (HPA's ratio on the latest value), HPA's
    /// 300 s scale-down stabilization, zero after KEDA's 300 s cooldown without requests.
    pub fn keda_http() -> ConcurrencyRule {
        ConcurrencyRule {
            target: KEDA_HTTP_TARGET_CONCURRENCY,
            window_s: 0.0,
            scale_down_delay_s: HPA_SCALE_DOWN_STABILIZATION_S,
            zero_after_s: Some(KEDA_COOLDOWN_S),
        }
    }
}

/// What a [`ConcurrencyRule`] remembers between syncs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConcurrencyState {
    samples: VecDeque<(f64, f64)>,
    lower_since: Option<f64>,
    last_busy: f64,
}

/// The replica count the rule asks for at `now`, given the proxy's in-flight count (held requests included)
/// and the current count, within `[0 or 1, max]`.
pub fn concurrency_desired(
    rule: &ConcurrencyRule,
    state: &mut ConcurrencyState,
    now: f64,
    in_flight: f64,
    current: u32,
    max: u32,
) -> u32 {
    state.samples.push_back((now, in_flight));
    while state
        .samples
        .front()
        .is_some_and(|&(t, _)| t < now - rule.window_s)
    {
        state.samples.pop_front();
    }
    if in_flight > 0.0 {
        state.last_busy = now;
    }
    let avg = state.samples.iter().map(|&(_, v)| v).sum::<f64>() / state.samples.len().max(1) as f64;
    let mut want = (avg / rule.target).ceil() as u32;
    let idle_long_enough = rule
        .zero_after_s
        .is_some_and(|z| avg <= 0.0 && now - state.last_busy >= z);
    if want == 0 && !idle_long_enough {
        want = 1;
    }
    // Waking from zero is immediate (the proxy asks for one replica when a request arrives).
    if current == 0 && in_flight > 0.0 {
        want = want.max(1);
    }
    let want = want.min(max.max(1));
    if want >= current {
        state.lower_since = None;
        return want;
    }
    let since = *state.lower_since.get_or_insert(now);
    if now - since >= rule.scale_down_delay_s {
        state.lower_since = None;
        want
    } else {
        current
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeai_keeps_one_replica_until_the_window_is_idle_then_goes_to_zero() {
        let r = ConcurrencyRule::kubeai();
        let mut s = ConcurrencyState::default();
        assert_eq!(concurrency_desired(&r, &mut s, 0.0, 3.0, 1, 4), 1);
        // 250 in flight on average asks for 3.
        let mut s2 = ConcurrencyState::default();
        assert_eq!(concurrency_desired(&r, &mut s2, 0.0, 250.0, 1, 4), 3);
        // Idle: the 10-minute average stays above zero for 10 minutes, then zero after the 30 s delay.
        let mut t = 10.0;
        let mut n = 1;
        while t < 2000.0 && n > 0 {
            n = concurrency_desired(&r, &mut s, t, 0.0, n, 4);
            t += 10.0;
        }
        assert_eq!(n, 0);
        assert!(t > 600.0, "{t}");
        // A request at zero wakes it at once.
        assert_eq!(concurrency_desired(&r, &mut s, t, 1.0, 0, 4), 1);
    }

    #[test]
    fn keda_http_waits_for_its_cooldown_before_zero() {
        let r = ConcurrencyRule::keda_http();
        let mut s = ConcurrencyState::default();
        assert_eq!(concurrency_desired(&r, &mut s, 0.0, 1.0, 1, 3), 1);
        assert_eq!(concurrency_desired(&r, &mut s, 200.0, 0.0, 1, 3), 1);
        // 300 s cooldown since the last request, then HPA's 300 s stabilization.
        assert_eq!(concurrency_desired(&r, &mut s, 310.0, 0.0, 1, 3), 1);
        assert_eq!(concurrency_desired(&r, &mut s, 620.0, 0.0, 1, 3), 0);
    }
}
