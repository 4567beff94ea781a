//! The latency objective the compute-share rule sizes a replica's share to, and when the controller must hand a
//! sidecar a new one.
//!
//! The objective is the InferenceAutoscaler's (`ttftSlo`, `ttftSloPercentile`, `itlSlo`), so it can change while
//! pods run. A command-line flag set at admission would keep the old one until the pod is recreated; instead the
//! controller compares, every sync, the objective each sidecar reports holding (`/v1/status`'s `compute`) with
//! the spec's and hands over the spec's where they differ ([`Objective::handover`]). The admission flags
//! (`--ttft-slo`, `--itl-slo`) remain the objective a sidecar starts with.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::scale::{ScalePolicy, SloPercentile};
use crate::wire::sidecar::ComputeStatus;

/// The objectives a replica's compute share must meet; the body of the sidecar's `PUT /v1/objective`.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Objective {
    /// Time to first token, seconds (`ttftSlo`); `None`: no TTFT objective.
    #[serde(default)]
    pub ttft_slo_secs: Option<f64>,
    /// Which percentile of the TTFT the objective holds, 95 or 99 (`ttftSloPercentile`).
    #[serde(default = "p95")]
    pub ttft_slo_percentile: u32,
    /// Inter-token latency p95, seconds (`itlSlo`); `None`: no inter-token objective.
    #[serde(default)]
    pub itl_slo_secs: Option<f64>,
}

fn p95() -> u32 {
    95
}

impl Objective {
    /// The objective a model's policy and inter-token objective set.
    pub fn of(policy: &ScalePolicy, itl_slo: Option<Duration>) -> Self {
        Self {
            ttft_slo_secs: policy.ttft_slo.map(|d| d.as_secs_f64()),
            ttft_slo_percentile: policy.ttft_slo_percentile.number(),
            itl_slo_secs: itl_slo.map(|d| d.as_secs_f64()),
        }
    }

    /// The percentile the TTFT objective holds (p95 for any number but 99).
    pub fn percentile(&self) -> SloPercentile {
        SloPercentile::from_number(self.ttft_slo_percentile).unwrap_or_default()
    }

    /// What to hand a sidecar reporting `held`, or `None` when it holds it already. Without an inter-token
    /// objective of its own (`itl_slo_secs: None`) this keeps the replica's (the `tessera.dev/itl-slo` annotation
    /// it was admitted with), so an InferenceAutoscaler that names none never erases one. A sidecar that reports
    /// no objective (older than the hand-over) is handed it; it answers 404 and keeps its flags.
    pub fn handover(&self, held: Option<&ComputeStatus>) -> Option<Objective> {
        let want = Objective {
            itl_slo_secs: self.itl_slo_secs.or(held.and_then(|h| h.itl_slo_secs)),
            ..*self
        };
        let Some(held) = held else { return Some(want) };
        // Seconds travel through JSON as decimals: equal within a microsecond is the same objective.
        let same = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => (a - b).abs() < 1e-6,
            (None, None) => true,
            _ => false,
        };
        let holds = same(want.ttft_slo_secs, held.ttft_slo_secs)
            && same(want.itl_slo_secs, held.itl_slo_secs)
            && want.ttft_slo_percentile == held.ttft_slo_percentile.unwrap_or(95);
        (!holds).then_some(want)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn held(ttft: Option<f64>, percentile: Option<u32>, itl: Option<f64>) -> ComputeStatus {
        ComputeStatus {
            current_share: 0.5,
            ttft_slo_secs: ttft,
            ttft_slo_percentile: percentile,
            itl_slo_secs: itl,
        }
    }

    #[test]
    fn an_edit_of_any_objective_is_handed_over() {
        let policy = ScalePolicy {
            ttft_slo: Some(Duration::from_secs(2)),
            ..ScalePolicy::default()
        };
        let want = Objective::of(&policy, Some(Duration::from_millis(100)));
        assert_eq!(want.handover(Some(&held(Some(2.0), None, Some(0.1)))), None);
        assert_eq!(want.handover(Some(&held(Some(2.0), Some(95), Some(0.1)))), None);
        for (edit, held) in [
            ("ttftSlo", held(Some(1.0), Some(95), Some(0.1))),
            ("ttftSloPercentile", held(Some(2.0), Some(99), Some(0.1))),
            ("itlSlo", held(Some(2.0), Some(95), Some(0.2))),
        ] {
            assert_eq!(want.handover(Some(&held)), Some(want), "{edit} edited");
        }
        assert_eq!(
            want.handover(None),
            Some(want),
            "a sidecar that reports no objective"
        );
        let p99 = Objective::of(
            &ScalePolicy {
                ttft_slo_percentile: SloPercentile::P99,
                ..policy
            },
            None,
        );
        assert_eq!(
            (p99.ttft_slo_percentile, p99.percentile()),
            (99, SloPercentile::P99)
        );
    }

    /// A spec without an inter-token objective keeps the one the replica was admitted with.
    #[test]
    fn no_inter_token_objective_keeps_the_replicas() {
        let policy = ScalePolicy {
            ttft_slo: Some(Duration::from_secs(2)),
            ..ScalePolicy::default()
        };
        let want = Objective::of(&policy, None);
        assert_eq!(want.handover(Some(&held(Some(2.0), Some(95), Some(0.1)))), None);
        let edited = want
            .handover(Some(&held(Some(3.0), Some(95), Some(0.1))))
            .unwrap();
        assert_eq!(
            (edited.ttft_slo_secs, edited.itl_slo_secs),
            (Some(2.0), Some(0.1))
        );
    }

    #[test]
    fn the_document_reads_with_defaults() {
        let o: Objective = serde_json::from_str(r#"{"ttftSloSecs": 1.5}"#).unwrap();
        assert_eq!(
            (o.ttft_slo_secs, o.ttft_slo_percentile, o.itl_slo_secs),
            (Some(1.5), 95, None)
        );
    }
}
