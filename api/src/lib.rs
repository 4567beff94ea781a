//! Tessera's API: the `InferenceAutoscaler` custom resource ([`crd`]) — its spec, its status, the CRD manifest
//! generated from them, and the one reading of a spec into the core's scale policy.
//!
//! Its own crate so that every role that reads or writes the resource (the controller, the webhook, the
//! simulator's scenarios) shares the types and the validation without depending on the controller.

pub mod crd;
