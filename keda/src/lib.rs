//! Tessera's decisions as a KEDA external scaler: the gRPC service `externalscaler.ExternalScaler` that a
//! `ScaledObject` trigger of type `external` or `external-push` calls.
//!
//! - [`service`]: the four calls, answered by [`tessera_core::keda`]'s rule from a [`Source`] the autoscaler
//!   provides (the leader's decisions and the activators' held requests).
//! - [`metrics`]: calls by method and outcome, latency, open push streams, so KEDA's fallback never hides an
//!   outage.
//! - [`tls`]: the server's TLS, with client certificates checked when a CA is given (KEDA's
//!   `TriggerAuthentication` presents one).
//! - [`pb`]: the generated messages, server and client (the client is what the tests call with).
//!
//! The crate knows nothing of Kubernetes: the autoscaler wires it to its reflector in a cluster and to its local
//! loop with `--no-kube`.

pub mod metrics;
pub mod service;
pub mod tls;

/// The messages, server and client generated from `proto/externalscaler.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic, missing_debug_implementations)]
pub mod pb {
    tonic::include_proto!("externalscaler");
}

pub use service::{Scaler, Source};
