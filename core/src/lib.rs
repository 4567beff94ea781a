//! Tessera's decisions, as pure functions over plain structs.
//!
//! Nothing in this crate does I/O or reads a clock: callers pass in what they observed and the time it is,
//! and get back a value *and a reason*. That is what lets the sidecar, the autoscaler, the webhook and the
//! what-if simulator share one copy of every rule — the simulator replays hours of traffic through exactly
//! the code that runs in the cluster.
//!
//! Where to find a decision:
//! - [`metrics`]: reading a vLLM `/metrics` page into a typed snapshot; windowed rates and quantiles.
//! - [`recommend`]: how much GPU memory (KV cache bytes, `gpu_memory_utilization`, MiB) and compute a replica needs.
//! - [`scale`]: how many replicas a model needs (the HPA replacement), including scale to zero.
//! - [`pack`]: which GPU each fractional replica goes on, and which GPUs could be emptied.
//! - [`round`]: one model's decision round, observed state in, every decision out (the controller's and the
//!   simulator's one sequence of the rules above).
//! - [`rollout`]: which GPU allocation is in force for a model, and whether to roll its running pods onto it.
//! - [`keda`]: what Tessera answers KEDA's external-scaler calls (the model a ScaledObject names, the metric,
//!   whether the model is active).
//! - [`lanes`]: whether a flex-lane request may go to a backend now (the activator's priority lanes).
//! - [`gate`]: the per-GPU start-up gate (vLLM servers sharing a GPU start one at a time).
//! - [`lease`]: the Lease rule shared by leader election and the start-up gate.
//! - [`wire`]: the JSON documents one role serves and another reads (sidecar status, activator stats).
//! - [`class`]: a model's workload class (real-time, near-real-time, batch) and the policy defaults it supplies.
//! - [`sleep`]: sleeping replicas (vLLM sleep mode): sleep or go to zero at rest (`sleep::rule`), the pod's
//!   instruction (`sleep::command`), risky set-ups (`sleep::risk`); the sleeper budget is `pack::sleeping`.
//! - [`workload`]: the class as the GPU workloads page shows it.
//! - [`batch`]: the OpenAI Batch API's rules: the batch object's statuses, validating an input line, which lines
//!   are answered, and pacing a batch to its deadline on the cheapest capacity.

pub mod batch;
pub mod class;
pub mod gate;
pub mod keda;
pub mod lanes;
pub mod lease;
pub mod metrics;
pub mod pack;
pub mod recommend;
pub mod rollout;
pub mod round;
pub mod scale;
pub mod sleep;
pub mod wire;
pub mod workload;
