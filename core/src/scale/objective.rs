//! How a model's policy makes the latency objective handed to its sidecars ([`Objective`], a wire type: the body
//! of the sidecar's `PUT /v1/objective`). Here, beside the policy, so the wire's types need nothing above them.

use std::time::Duration;

use super::{ScalePolicy, SloPercentile};
use crate::wire::sidecar::Objective;

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
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::wire::sidecar::ComputeStatus;

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
