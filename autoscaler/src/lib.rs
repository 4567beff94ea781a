//! The autoscaler role: the InferenceAutoscaler controller, the GPU pool manager, the `/ui` page and the KEDA
//! scaler's host. The activator gateway is a crate of its own (`tessera-activator`).

pub mod controller;
/// The CRD's types live in `tessera-api` (shared with the webhook and the simulator); re-exported so the
/// controller's paths (`crate::crd::…`) stay as they were.
pub use tessera_api::crd;
pub mod keda;
pub use tessera_runtime::kube_client;
pub mod leader;
#[cfg(test)]
mod test_support;
/// The pool manager lives in `tessera-pool` (the webhook reserves through it without depending on the
/// controller); re-exported so the controller's paths (`crate::pool::…`) stay as they were.
pub use tessera_pool as pool;
pub mod ui;

/// The `autoscaler` role: the controller, or with `--no-kube` the `/ui` page alone, read from the sidecars given on
/// the command line (`ui::local`). Dispatched here so the controller and the local page do not import each other.
pub async fn run(args: controller::Args) -> anyhow::Result<()> {
    if args.ui.no_kube {
        ui::local::run(args).await
    } else {
        controller::run(args).await
    }
}

pub(crate) use tessera_runtime::unix_ms;

/// Whether a pod's `Ready` condition is `True` (one reading, shared with the pool manager).
pub(crate) use tessera_runtime::pod::ready as pod_ready;
