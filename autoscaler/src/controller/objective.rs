//! Handing the InferenceAutoscaler's latency objective to each replica's sidecar, so an edit of `ttftSlo`,
//! `ttftSloPercentile` or `itlSlo` reaches the compute-share rule within one sync, with no pod recreated. Which sidecars need
//! it is [`tessera_core::wire::sidecar::Objective::handover`]; this only sends it.

use futures::future::join_all;
use tessera_core::scale::ScalePolicy;
use tessera_core::wire::sidecar::Objective;
use tessera_core::wire::sidecar::SidecarStatus;
use tracing::{debug, info};

use super::context::Context;
use crate::crd::InferenceAutoscalerSpec;

/// Hands `policy`'s objective (as the controller of `namespace`, the InferenceAutoscaler's and its pods') (the round's, workload-class defaults included, so the share rule and the scale
/// guard hold the same percentile) to every replica in `ready` (pod name, sidecar URL) whose document in `docs`
/// (same order; `None`: unread, tried next sync) reports another one. A failure is counted and tried again next sync.
/// The inter-token objective is the spec's `itlSlo`; without one each replica keeps the one it was admitted with.
pub(super) async fn hand_over(
    ctx: &Context,
    namespace: &str,
    spec: &InferenceAutoscalerSpec,
    policy: &ScalePolicy,
    ready: &[(String, String)],
    docs: &[Option<SidecarStatus>],
) {
    let want = Objective::of(policy, spec.itl_slo());
    let due: Vec<(&String, Objective)> = ready
        .iter()
        .map(|(_, url)| url)
        .zip(docs)
        .filter_map(|(url, doc)| Some((url, want.handover(doc.as_ref()?.compute.as_ref())?)))
        .collect();
    let results = join_all(
        due.iter()
            .map(|(url, o)| ctx.signals.hand_objective(url, namespace, o)),
    )
    .await;
    for ((url, o), result) in due.iter().zip(results) {
        match result {
            Ok(()) => info!(
                %url,
                ttft_slo_secs = o.ttft_slo_secs,
                ttft_slo_percentile = o.ttft_slo_percentile,
                "latency objective handed to the sidecar"
            ),
            Err(e) => {
                debug!(%url, error = %e, "could not hand the latency objective over; next sync");
                ctx.metrics.scrape_failure("sidecar_objective", e.label());
            }
        }
    }
}
