//! An `InferenceAutoscaler` spec read into the core's [`scale::ScalePolicy`]: every check the schema makes (for API
//! servers without CEL) and those only Rust can make, each message naming the field and the fix, in the same
//! words as the CEL rules.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tessera_core::scale;

use super::{
    InferenceAutoscalerSpec, Panic, RatePolicyKind, ScalingRules, SelectPolicy, group_version, parse_duration,
};

/// Errors turning a spec into a policy.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// One or more fields are invalid; each message names the field and how to fix it.
    #[error("invalid InferenceAutoscaler spec: {}", .0.join("; "))]
    Invalid(Vec<String>),
}

/// The one message for an invalid spec, from [`InferenceAutoscalerSpec::to_policy`]'s problems: what the
/// controller writes in the `Valid` condition and its Warning Event, and what the simulator says of a scenario
/// model carrying the same spec, so both read alike.
pub fn invalid_spec_message(errors: &[String]) -> String {
    errors.join("; ")
}

impl InferenceAutoscalerSpec {
    /// Checks everything the schema checks (for API servers without CEL) and what only Rust can check (durations
    /// parse, the policy makes sense). Each message names the field and how to fix it.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        self.to_policy().map(|_| ())
    }

    /// The inter-token latency objective (`itlSlo`); `None` when unset or unreadable (which
    /// [`Self::to_policy`] reports).
    pub fn itl_slo(&self) -> Option<Duration> {
        parse_duration(self.itl_slo.as_deref()?).ok()
    }

    /// Which of the workload class's knobs this spec sets itself (those keep the spec's value).
    pub fn class_explicit(&self) -> tessera_core::class::Explicit {
        tessera_core::class::Explicit {
            cold_start_miss_budget: self
                .scale_to_zero
                .as_ref()
                .is_some_and(|z| z.cold_start_miss_budget.is_some()),
            ttft_slo_percentile: self.ttft_slo_percentile.is_some(),
        }
    }

    /// The core policy this spec describes, or every problem found.
    pub fn to_policy(&self) -> Result<scale::ScalePolicy, Vec<String>> {
        let mut errors = Vec::new();
        let min = u32::try_from(self.min_replicas).unwrap_or_else(|_| {
            errors.push(format!("minReplicas must be >= 0, got {}", self.min_replicas));
            0
        });
        let max = u32::try_from(self.max_replicas).unwrap_or_else(|_| {
            errors.push(format!("maxReplicas must be >= 1, got {}", self.max_replicas));
            0
        });
        if self.scale_target_ref.kind.is_empty() || self.scale_target_ref.name.is_empty() {
            errors
                .push("scaleTargetRef needs kind and name, e.g. {kind: Deployment, name: llama}".to_owned());
        }
        let api_version = &self.scale_target_ref.api_version;
        if group_version(api_version).is_none() {
            errors.push(format!(
                "scaleTargetRef.apiVersion {api_version:?} must be group/version (e.g. apps/v1) or a core version (v1)"
            ));
        }
        let durations = self.durations(&mut errors);
        let ttft_slo_percentile = self.slo_percentile(&mut errors);
        durations.check_slos(&mut errors);
        self.check_gpu(&mut errors);
        self.check_model_names(&mut errors);
        let behavior = self.behavior.clone().unwrap_or_default();
        let policy = scale::ScalePolicy {
            min_replicas: min,
            max_replicas: max,
            targets: scale::Targets {
                kv_cache_utilization: self.targets.kv_cache_utilization,
                waiting_requests_per_replica: self.targets.waiting_requests_per_replica,
                ttft_p95: durations.ttft_target,
                requests_per_second_per_replica: self.targets.requests_per_second_per_replica,
            },
            tolerance: scale::DEFAULT_TOLERANCE,
            scale_to_zero: durations
                .idle_after
                .zip(self.scale_to_zero.as_ref())
                .map(|(idle_after, z)| scale::ScaleToZero {
                    idle_after,
                    cold_start_miss_budget: z.cold_start_miss_budget,
                    cold_start_budget_group: z.cold_start_budget_group.clone(),
                }),
            behavior: scale::Behavior {
                scale_up: rules(
                    behavior.scale_up.as_ref(),
                    scale::ScalingRules::default_up(),
                    "scaleUp",
                    &mut errors,
                ),
                scale_down: rules(
                    behavior.scale_down.as_ref(),
                    scale::ScalingRules::default_down(),
                    "scaleDown",
                    &mut errors,
                ),
            },
            panic: panic_mode(behavior.panic.as_ref()),
            ttft_slo: durations.ttft_slo,
            ttft_slo_percentile,
            // Set each round by the joint policy from the model's cold start (`core::scale::lookahead`).
            ttft_guard_lead: None,
        };
        // The core's checks carry the same wording as the CEL rules (maxReplicas >= minReplicas, etc.).
        if let Err(core_errors) = policy.validate() {
            for e in core_errors {
                if !errors.contains(&e) {
                    errors.push(e);
                }
            }
        }
        if errors.is_empty() {
            Ok(policy)
        } else {
            Err(errors)
        }
    }

    /// The spec's durations, each reported when it does not parse; a `targets.ttftP95` of zero is reported too.
    fn durations(&self, errors: &mut Vec<String>) -> Durations {
        let mut duration = |field: &str, v: &Option<String>| -> Option<Duration> {
            let s = v.as_deref()?;
            match parse_duration(s) {
                Ok(d) => Some(d),
                Err(e) => {
                    errors.push(format!(
                        "{field} {s:?} is not a duration like 500ms, 30s, 10m: {e}"
                    ));
                    None
                }
            }
        };
        let ttft_target = duration("targets.ttftP95", &self.targets.ttft_p95);
        let ttft_slo = duration("ttftSlo", &self.ttft_slo);
        let itl_slo = duration("itlSlo", &self.itl_slo);
        let idle_after = duration(
            "scaleToZero.idleAfter",
            &self.scale_to_zero.as_ref().map(|s| s.idle_after.clone()),
        );
        if self.targets.ttft_p95.is_some() && ttft_target.is_some_and(|d| d.is_zero()) {
            errors.push("targets.ttftP95 must be more than 0".to_owned());
        }
        Durations {
            ttft_target,
            ttft_slo,
            itl_slo,
            idle_after,
        }
    }

    /// The percentile `ttftSlo` holds (`ttftSloPercentile`), the default when unset or invalid.
    fn slo_percentile(&self, errors: &mut Vec<String>) -> scale::SloPercentile {
        let Some(n) = self.ttft_slo_percentile else {
            return scale::SloPercentile::default();
        };
        if self.ttft_slo.is_none() {
            errors.push(format!(
                "ttftSloPercentile {n} needs ttftSlo: it says which percentile the SLO holds (set ttftSlo, \
                 e.g. 2s, or remove ttftSloPercentile)"
            ));
        }
        scale::SloPercentile::from_number(n).unwrap_or_else(|| {
            errors.push(format!(
                "ttftSloPercentile must be 95 or 99 (the percentiles the sidecar reports), got {n}"
            ));
            scale::SloPercentile::default()
        })
    }

    /// `gpu.memory` and `gpu.computeFraction`: "auto" or a value in range.
    fn check_gpu(&self, errors: &mut Vec<String>) {
        let Some(gpu) = &self.gpu else { return };
        if let Some(m) = &gpu.memory {
            match m {
                IntOrString::Int(n) if *n <= 0 => errors.push(format!(
                    "gpu.memory must be \"auto\" or a positive number of MiB, got {n}"
                )),
                IntOrString::String(s) if s != "auto" => errors.push(format!(
                    "gpu.memory must be \"auto\" or a positive number of MiB (unquoted), got {s:?}"
                )),
                _ => {}
            }
        }
        if let Some(cf) = &gpu.compute_fraction
            && cf != "auto"
        {
            match cf.parse::<f64>() {
                Ok(f) if f > 0.0 && f <= 1.0 => {}
                _ => errors.push(format!(
                    "gpu.computeFraction must be \"auto\" or a fraction in (0, 1] as a quoted string like \
                     \"0.25\", got {cf:?}"
                )),
            }
        }
    }

    /// `modelNames`: none empty, and present when a feature that finds requests by model name is on.
    fn check_model_names(&self, errors: &mut Vec<String>) {
        for (i, name) in self.model_names.iter().enumerate() {
            if name.trim().is_empty() {
                errors.push(format!("modelNames[{i}] is empty"));
            }
        }
        if self.model_names.is_empty() {
            // Same wording as the CEL rules, for API servers without CEL.
            if self.scale_to_zero.is_some() {
                errors.push(
                    "scaleToZero needs modelNames: the activator holds, counts and routes requests by their OpenAI \
                     model name"
                        .to_owned(),
                );
            }
            if self.targets.requests_per_second_per_replica.is_some() {
                errors.push(
                    "targets.requestsPerSecondPerReplica needs modelNames: the activator counts requests by model \
                     name"
                        .to_owned(),
                );
            }
        }
    }
}

/// The spec's durations that parsed.
struct Durations {
    ttft_target: Option<Duration>,
    ttft_slo: Option<Duration>,
    itl_slo: Option<Duration>,
    idle_after: Option<Duration>,
}

impl Durations {
    /// The latency objectives must be more than zero.
    fn check_slos(&self, errors: &mut Vec<String>) {
        if self.itl_slo.is_some_and(|d| d.is_zero()) {
            errors.push(
                "itlSlo must be more than 0 (e.g. 100ms), or left out for no inter-token objective"
                    .to_owned(),
            );
        }
        if self.ttft_slo.is_some_and(|d| d.is_zero()) {
            errors.push(
                "ttftSlo must be more than 0 (e.g. 500ms): a zero SLO is breached by every request"
                    .to_owned(),
            );
        }
    }
}

fn rules(
    spec: Option<&ScalingRules>,
    default: scale::ScalingRules,
    path: &str,
    errors: &mut Vec<String>,
) -> scale::ScalingRules {
    let Some(spec) = spec else { return default };
    let mut out = default;
    if let Some(w) = spec.stabilization_window_seconds {
        match u64::try_from(w) {
            Ok(w) => out.stabilization_window = Duration::from_secs(w),
            Err(_) => errors.push(format!(
                "behavior.{path}.stabilizationWindowSeconds must be >= 0, got {w}"
            )),
        }
    }
    if let Some(p) = spec.select_policy {
        out.select_policy = match p {
            SelectPolicy::Max => scale::SelectPolicy::Max,
            SelectPolicy::Min => scale::SelectPolicy::Min,
            SelectPolicy::Disabled => scale::SelectPolicy::Disabled,
        };
    }
    if let Some(policies) = &spec.policies {
        out.policies = policies
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                let value = u32::try_from(p.value).ok().filter(|v| *v > 0);
                let period = u64::try_from(p.period_seconds).ok().filter(|v| *v > 0);
                match (value, period) {
                    (Some(value), Some(period)) => Some(scale::RatePolicy {
                        kind: match p.kind {
                            RatePolicyKind::Pods => scale::RatePolicyKind::Pods,
                            RatePolicyKind::Percent => scale::RatePolicyKind::Percent,
                        },
                        value,
                        period: Duration::from_secs(period),
                    }),
                    _ => {
                        errors.push(format!(
                            "behavior.{path}.policies[{i}] needs value > 0 and periodSeconds in 1..=1800"
                        ));
                        None
                    }
                }
            })
            .collect();
    }
    out
}

fn panic_mode(spec: Option<&Panic>) -> Option<scale::PanicMode> {
    let default = scale::PanicMode::default();
    let Some(p) = spec else { return Some(default) };
    if p.enabled == Some(false) {
        return None;
    }
    let secs = |v: Option<i32>, d: Duration| {
        v.and_then(|s| u64::try_from(s).ok())
            .map_or(d, Duration::from_secs)
    };
    Some(scale::PanicMode {
        window: secs(p.window_seconds, default.window),
        stable_window: secs(p.stable_window_seconds, default.stable_window),
        threshold: p
            .threshold_percent
            .map_or(default.threshold, |t| f64::from(t) / 100.0),
    })
}
