//! Stabilization windows and rate limits: HPA's `behavior` field (autoscaling/v2), re-stated over plain numbers
//! (`pkg/controller/podautoscaler/horizontal.go`: `stabilizeRecommendationWithBehaviors`,
//! `convertDesiredReplicasWithBehaviorRate`, `calculateScaleUpLimitWithScalingRules`,
//! `calculateScaleDownLimitWithBehaviors`).
//!
//! Defaults are HPA's: scale up with no window, by the larger of 100% or 4 pods per 15 s; scale down after a
//! 300 s window, by up to 100% per 15 s.

use std::time::Duration;

use super::{Recommendation, ScaleEvent, ScalePolicy, ScaleReason, Timestamp, ceil_u32};

/// How fast to move in each direction.
#[derive(Debug, Clone, PartialEq)]
pub struct Behavior {
    /// Rules for adding replicas.
    pub scale_up: ScalingRules,
    /// Rules for removing replicas.
    pub scale_down: ScalingRules,
}

impl Default for Behavior {
    fn default() -> Self {
        Self {
            scale_up: ScalingRules::default_up(),
            scale_down: ScalingRules::default_down(),
        }
    }
}

impl Behavior {
    pub(super) fn validate(&self) -> Vec<String> {
        let mut errors = self.scale_up.validate("behavior.scaleUp");
        errors.extend(self.scale_down.validate("behavior.scaleDown"));
        errors
    }

    /// The longest window or rate-limit period: history older than this is never looked at.
    pub(super) fn horizon(&self) -> Duration {
        [&self.scale_up, &self.scale_down]
            .iter()
            .flat_map(|r| std::iter::once(r.stabilization_window).chain(r.policies.iter().map(|p| p.period)))
            .max()
            .unwrap_or_default()
    }
}

/// One direction's rules.
#[derive(Debug, Clone, PartialEq)]
pub struct ScalingRules {
    /// Recommendations within this window are considered: the most conservative one wins.
    pub stabilization_window: Duration,
    /// Which of several rate policies applies.
    pub select_policy: SelectPolicy,
    /// Rate limits; empty means unlimited.
    pub policies: Vec<RatePolicy>,
}

impl ScalingRules {
    /// HPA's scale-up default: no window, max(100%, 4 pods) per 15 s.
    pub fn default_up() -> Self {
        Self {
            stabilization_window: Duration::ZERO,
            select_policy: SelectPolicy::Max,
            policies: vec![
                RatePolicy {
                    kind: RatePolicyKind::Percent,
                    value: 100,
                    period: Duration::from_secs(15),
                },
                RatePolicy {
                    kind: RatePolicyKind::Pods,
                    value: 4,
                    period: Duration::from_secs(15),
                },
            ],
        }
    }

    /// HPA's scale-down default: 300 s window, 100% per 15 s.
    pub fn default_down() -> Self {
        Self {
            stabilization_window: Duration::from_secs(300),
            select_policy: SelectPolicy::Max,
            policies: vec![RatePolicy {
                kind: RatePolicyKind::Percent,
                value: 100,
                period: Duration::from_secs(15),
            }],
        }
    }

    fn validate(&self, path: &str) -> Vec<String> {
        let mut errors = Vec::new();
        if self.stabilization_window > Duration::from_secs(3600) {
            errors.push(format!(
                "{path}.stabilizationWindowSeconds must be at most 3600 (one hour)"
            ));
        }
        for (i, p) in self.policies.iter().enumerate() {
            if p.value == 0 {
                errors.push(format!("{path}.policies[{i}].value must be > 0"));
            }
            if p.period.is_zero() || p.period > Duration::from_secs(1800) {
                errors.push(format!("{path}.policies[{i}].periodSeconds must be in 1..=1800"));
            }
        }
        errors
    }
}

/// Which rate policy wins when several are listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SelectPolicy {
    /// The policy allowing the largest change.
    #[default]
    Max,
    /// The policy allowing the smallest change.
    Min,
    /// No scaling in this direction at all.
    Disabled,
}

/// A rate limit: at most `value` pods (or percent) per `period`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RatePolicy {
    /// Pods or percent.
    pub kind: RatePolicyKind,
    /// How many pods, or what percentage of the replicas at the start of the period.
    pub value: u32,
    /// The sliding period.
    pub period: Duration,
}

/// The unit of a [`RatePolicy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RatePolicyKind {
    /// An absolute number of pods.
    Pods,
    /// A percentage of the replicas at the start of the period.
    Percent,
}

/// HPA's stabilization: up = lowest recommendation in the up window, down = highest in the down window; the result
/// moves from `current` only as far as both allow.
pub(super) fn stabilize(
    raw: u32,
    current: u32,
    behavior: &Behavior,
    history: &[Recommendation],
    now: Timestamp,
) -> u32 {
    let mut up = raw;
    let mut down = raw;
    for r in history {
        if r.at.is_within(behavior.scale_up.stabilization_window, now) {
            up = up.min(r.replicas);
        }
        if r.at.is_within(behavior.scale_down.stabilization_window, now) {
            down = down.max(r.replicas);
        }
    }
    current.max(up).min(down)
}

/// Replicas added and removed by events within `period` before `now`.
fn changes_within(events: &[ScaleEvent], period: Duration, now: Timestamp) -> (u32, u32) {
    events
        .iter()
        .filter(|e| e.at.is_within(period, now))
        .fold((0u32, 0u32), |(added, removed), e| {
            if e.to > e.from {
                (added.saturating_add(e.to - e.from), removed)
            } else {
                (added, removed.saturating_add(e.from - e.to))
            }
        })
}

/// The replicas the model had when a policy's period began, as HPA counts them: the current count less what the
/// period's events added, plus what they removed.
fn replicas_at_period_start(events: &[ScaleEvent], period: Duration, current: u32, now: Timestamp) -> u32 {
    let (added, removed) = changes_within(events, period, now);
    let start = i64::from(current) - i64::from(added) + i64::from(removed);
    u32::try_from(start.max(0)).unwrap_or(u32::MAX)
}

/// The most replicas the up rules allow now.
pub(super) fn scale_up_limit(
    rules: &ScalingRules,
    current: u32,
    events: &[ScaleEvent],
    now: Timestamp,
) -> u32 {
    if rules.select_policy == SelectPolicy::Disabled {
        return current;
    }
    if rules.policies.is_empty() {
        return u32::MAX;
    }
    let proposals = rules.policies.iter().map(|p| {
        let start = replicas_at_period_start(events, p.period, current, now);
        match p.kind {
            RatePolicyKind::Pods => start.saturating_add(p.value),
            RatePolicyKind::Percent => ceil_u32(f64::from(start) * (1.0 + f64::from(p.value) / 100.0)),
        }
    });
    let limit = match rules.select_policy {
        SelectPolicy::Min => proposals.min(),
        _ => proposals.max(),
    };
    limit.unwrap_or(u32::MAX).max(current)
}

/// The fewest replicas the down rules allow now.
pub(super) fn scale_down_limit(
    rules: &ScalingRules,
    current: u32,
    events: &[ScaleEvent],
    now: Timestamp,
) -> u32 {
    if rules.select_policy == SelectPolicy::Disabled {
        return current;
    }
    if rules.policies.is_empty() {
        return 0;
    }
    let proposals = rules.policies.iter().map(|p| {
        let start = replicas_at_period_start(events, p.period, current, now);
        match p.kind {
            RatePolicyKind::Pods => start.saturating_sub(p.value),
            // HPA truncates here (int32 conversion), so a percent policy can always reach a lower whole count.
            RatePolicyKind::Percent => {
                let v = (f64::from(start) * (1.0 - f64::from(p.value.min(100)) / 100.0)).floor();
                if v <= 0.0 { 0 } else { v as u32 }
            }
        }
    });
    // For scale-down the "Max" policy (largest change) is the lowest count.
    let limit = match rules.select_policy {
        SelectPolicy::Min => proposals.max(),
        _ => proposals.min(),
    };
    limit.unwrap_or(0).min(current)
}

/// Applies the rate limits and the `[min, max]` clamp; returns the count and, when it was cut, why.
pub(super) fn limit_rate(
    desired: u32,
    current: u32,
    policy: &ScalePolicy,
    events: &[ScaleEvent],
    now: Timestamp,
) -> (u32, Option<ScaleReason>) {
    let floor = policy.active_floor();
    let max = policy.max_replicas;
    if desired > current {
        let up = scale_up_limit(&policy.behavior.scale_up, current, events, now);
        let (allowed, why) = if up < max {
            (up, ScaleReason::RateLimited)
        } else {
            (max, ScaleReason::TooManyReplicas)
        };
        if desired > allowed {
            // The rate limit can never push below the floor (a target under min scales up to min regardless).
            let v = allowed.max(floor);
            return (
                v,
                Some(if v == floor && allowed < floor {
                    ScaleReason::TooFewReplicas
                } else {
                    why
                }),
            );
        }
    } else if desired < current {
        let down = scale_down_limit(&policy.behavior.scale_down, current, events, now);
        let (allowed, why) = if down > floor {
            (down, ScaleReason::RateLimited)
        } else {
            (floor, ScaleReason::TooFewReplicas)
        };
        if desired < allowed {
            let v = allowed.min(max);
            return (
                v,
                Some(if v == max && allowed > max {
                    ScaleReason::TooManyReplicas
                } else {
                    why
                }),
            );
        }
    }
    if desired > max {
        return (max, Some(ScaleReason::TooManyReplicas));
    }
    if desired < floor {
        return (floor, Some(ScaleReason::TooFewReplicas));
    }
    (desired, None)
}
