//! The autoscaler role: the InferenceAutoscaler controller, the activator gateway, and the GPU pool manager.

pub mod activator;
pub mod controller;
pub mod crd;
pub mod keda;
pub use tessera_runtime::kube_client;
pub mod leader;
pub mod pool;
pub mod ui;
mod watch;

/// The `autoscaler` role: the controller, or with `--no-kube` the `/ui` page alone, read from the sidecars given on
/// the command line (`ui::local`). Dispatched here so the controller and the local page do not import each other.
pub async fn run(args: controller::Args) -> anyhow::Result<()> {
    if args.ui.no_kube {
        ui::local::run(args).await
    } else {
        controller::run(args).await
    }
}

/// Unix milliseconds of a clock reading (0 before the epoch), the unit of every time on the wire and in the core.
pub(crate) fn unix_ms(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Whether a pod's `Ready` condition is `True` (the kubelet's verdict: its containers run and pass readiness).
pub(crate) fn pod_ready(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}
