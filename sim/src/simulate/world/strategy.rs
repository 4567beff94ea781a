//! The strategies compared on the same arrivals, and the scale policy each gives a model.

use super::*;

/// The strategies compared on the same arrivals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum StrategyKind {
    /// Whole GPU per replica, replicas fixed for the peak.
    Static,
    /// Whole GPU per replica, HPA on request rate, at least one replica.
    Hpa,
    /// KubeAI: whole GPU, in-flight requests at its proxy, scale to zero with requests held.
    Kubeai,
    /// AIBrix: whole GPU, APA on KV-cache usage and waiting requests, no request holding at zero (min 1).
    Aibrix,
    /// KEDA HTTP add-on: whole GPU, interceptor concurrency, scale to zero, held requests fail after 20 s.
    KedaHttp,
    /// HAMi, static: fractional (a fixed declared share and memory per model, MPS), no autoscaling.
    HamiStatic,
    /// Fractional replicas packed onto GPUs, rightsized memory, inference-signal autoscaling, scale to zero.
    Tessera,
}

impl StrategyKind {
    /// Every strategy, in report order.
    pub const ALL: [StrategyKind; 7] = [
        StrategyKind::Static,
        StrategyKind::Hpa,
        StrategyKind::Kubeai,
        StrategyKind::Aibrix,
        StrategyKind::KedaHttp,
        StrategyKind::HamiStatic,
        StrategyKind::Tessera,
    ];

    /// The name used in the report and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            StrategyKind::Static => "static",
            StrategyKind::Hpa => "hpa",
            StrategyKind::Kubeai => "kubeai",
            StrategyKind::Aibrix => "aibrix",
            StrategyKind::KedaHttp => "keda-http",
            StrategyKind::HamiStatic => "hami-static",
            StrategyKind::Tessera => "tessera",
        }
    }

    /// The strategy with this name.
    pub fn parse(name: &str) -> Result<StrategyKind, String> {
        StrategyKind::ALL
            .into_iter()
            .find(|k| k.name() == name.trim())
            .ok_or_else(|| {
                let known: Vec<&str> = StrategyKind::ALL.iter().map(|k| k.name()).collect();
                format!("unknown strategy {name:?}; known: {}", known.join(", "))
            })
    }

    /// Fractional replicas packed onto shared GPUs.
    pub(super) fn packs(self) -> bool {
        matches!(self, StrategyKind::Tessera | StrategyKind::HamiStatic)
    }

    /// Replicas fixed for the run.
    pub(super) fn fixed(self) -> bool {
        matches!(self, StrategyKind::Static | StrategyKind::HamiStatic)
    }

    /// A request that finds no replica is held (and wakes the model) rather than failing.
    pub(super) fn wakes_from_zero(self) -> bool {
        matches!(
            self,
            StrategyKind::Tessera | StrategyKind::Kubeai | StrategyKind::KedaHttp
        )
    }

    pub(super) fn description(self) -> &'static str {
        match self {
            StrategyKind::Static => {
                "whole GPU per replica, replicas fixed at the smallest count meeting the SLO"
            }
            StrategyKind::Hpa => {
                "whole GPU per replica, HPA on requests/s per replica, min 1, no scale to zero"
            }
            StrategyKind::Kubeai => {
                "KubeAI defaults: whole GPU, 100 in-flight per replica over 10 min, 30 s scale-down delay, zero with requests held"
            }
            StrategyKind::Aibrix => {
                "AIBrix APA defaults: whole GPU, KV cache 50% + waiting targets, ±10% tolerance, 300 s scale-down cooldown, min 1"
            }
            StrategyKind::KedaHttp => {
                "KEDA HTTP add-on defaults: whole GPU, concurrency 100, 300 s cooldown to zero, held requests fail after 20 s"
            }
            StrategyKind::HamiStatic => {
                "HAMi, static: declared share and memory per model (MPS), replicas fixed at the static count"
            }
            StrategyKind::Tessera => {
                "fractional packed replicas, recommended memory/compute, inference-signal autoscaling, scale to zero"
            }
        }
    }
}

/// The scale policy each strategy gives a model (`None`: not autoscaled).
pub(super) fn policy_for(kind: StrategyKind, m: &ModelSetup) -> Option<ScalePolicy> {
    match kind {
        StrategyKind::Static | StrategyKind::HamiStatic | StrategyKind::Kubeai | StrategyKind::KedaHttp => {
            None
        }
        StrategyKind::Aibrix => Some(ScalePolicy {
            min_replicas: 1,
            max_replicas: m.max_replicas.max(1),
            targets: Targets {
                kv_cache_utilization: Some(AIBRIX_KV_TARGET),
                waiting_requests_per_replica: m.targets.waiting_requests_per_replica,
                ..Targets::default()
            },
            tolerance: AIBRIX_TOLERANCE,
            behavior: Behavior {
                scale_up: ScalingRules::default_up(),
                scale_down: ScalingRules {
                    stabilization_window: Duration::from_secs_f64(AIBRIX_SCALE_DOWN_COOLDOWN_S),
                    ..ScalingRules::default_down()
                },
            },
            panic: None,
            ttft_slo: None,
            ..ScalePolicy::default()
        }),
        StrategyKind::Hpa => Some(ScalePolicy {
            min_replicas: 1,
            max_replicas: m.max_replicas.max(1),
            targets: Targets {
                requests_per_second_per_replica: Some(m.hpa_rps_per_replica),
                ..Targets::default()
            },
            // Plain HPA has neither panic mode nor a TTFT guard.
            panic: None,
            ttft_slo: None,
            ..ScalePolicy::default()
        }),
        // A model that carries its InferenceAutoscaler spec runs the policy the controller reads from it
        // (`behavior`, tolerance and panic mode included); the others, the policy their fields give.
        StrategyKind::Tessera if m.policy.is_some() => m.policy.clone(),
        StrategyKind::Tessera => Some(ScalePolicy {
            min_replicas: m.min_replicas,
            max_replicas: m.max_replicas,
            targets: Targets {
                kv_cache_utilization: m.targets.kv_cache_utilization,
                waiting_requests_per_replica: m.targets.waiting_requests_per_replica,
                ttft_p95: m.targets.ttft_p95,
                requests_per_second_per_replica: m.targets.requests_per_second_per_replica,
            },
            scale_to_zero: m.scale_to_zero_after.map(|idle_after| ScaleToZero {
                idle_after,
                cold_start_miss_budget: m.cold_start_miss_budget,
                cold_start_budget_group: m.cold_start_budget_group.clone(),
            }),
            ttft_slo: Some(Duration::from_secs_f64(m.slo_ttft)),
            ttft_slo_percentile: m.ttft_slo_percentile,
            ..ScalePolicy::default()
        }),
    }
}
