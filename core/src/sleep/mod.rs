//! Sleeping replicas: vLLM's sleep mode as a third replica state, between running and gone.
//!
//! A sleeping vLLM keeps its process (and its CUDA context) but gives back almost all of its GPU memory: level 1
//! moves the weights to pinned host memory and drops the KV cache, level 2 drops both. It wakes in about a second
//! instead of a cold start's pod start and weight load.
//!
//! Who does what:
//! - [`rule`]: core decides, per model, among keep warm, sleep and scale to zero (the controller's round and the
//!   simulator call the same function);
//! - [`command`]: the controller tells a pod to sleep through one annotation on the pod (never a network call a
//!   tenant could forge: only what may patch the pod may put it to sleep), which the sidecar reads from its
//!   downward-API file;
//! - [`evict`]: a sleeper that loses its place on its GPU (the sleeper budget, the GPU given back) is marked on
//!   its pod, and its own model's round lets it go;
//! - the sidecar alone reaches vLLM's sleep endpoints and reports the state in its status document
//!   ([`crate::wire::sidecar::RestStatus`]); a wake is asked of the sidecar by the activator holding a request.

pub mod command;
pub mod evict;
pub mod risk;
pub mod rule;
