//! The vLLM performance model: a pure state machine in virtual time.
//!
//! One [`Engine`] is one vLLM engine core (one data-parallel rank) on one GPU. It has no clock, no I/O and no
//! async: time is an `f64` number of seconds that the caller passes in. That is what lets the what-if simulator
//! replay an hour of real traffic through many replicas in seconds, and the `vllm-sim` emulator drive the very
//! same model in wall-clock time.
//!
//! What it models, and why each piece is there (sources and known differences are in `docs/emulator.md`):
//! - **Continuous batching like vLLM's V1 scheduler.** Every step first serves the running requests in order
//!   (one decode token each, or the next prefill chunk), then admits waiting requests FCFS while the batch has
//!   fewer than `max_num_seqs` requests and the step's token budget (`max_num_batched_tokens`) lasts. Prompts
//!   longer than the remaining budget are prefilled in chunks (chunked prefill is always on in V1).
//! - **A paged KV cache.** The cache holds `num_gpu_blocks` blocks of `block_size` tokens. Its size comes from
//!   the GPU memory vLLM is allowed to use minus weights, activation peak and non-torch memory, or directly from
//!   `--kv-cache-memory-bytes`. A request holds `ceil(tokens / block_size)` blocks.
//! - **Recompute preemption like V1.** When a running request needs a block and none is free, the newest running
//!   request is preempted: its blocks are freed and it goes back to the head of the waiting queue, to be prefilled
//!   again (prompt plus the tokens it already produced) when it is scheduled next.
//! - **Step time from a roofline.** A step reads all the weights plus the KV cache of every scheduled request
//!   from HBM, and does `2 × params` FLOPs per scheduled token; its GPU time is the larger of the two, each divided
//!   by the GPU's peak and an efficiency factor. A GPU share (`compute_fraction`) stretches the GPU time, as a
//!   time slice or an MPS share would. Time to first token and inter-token latency come out of this.
//!
//! Everything is deterministic: the same calls give the same events.

mod engine;
mod histogram;
pub mod sharing;
mod spec;

pub use engine::{Engine, EngineEvent, EngineStats, FinishReason, Request, capped_max_tokens, step_cost};
pub use histogram::{
    Histogram, ITERATION_TOKENS_BUCKETS, ITL_BUCKETS, PARAMS_N_BUCKETS, REQUEST_LATENCY_BUCKETS,
    TTFT_BUCKETS, buckets_1_2_5,
};
pub use sharing::{Neighbour, Neighbours, SharingModel};
pub use spec::{EngineConfig, GIB, GpuSpec, MemorySetting, ModelError, ModelSpec, kv_bytes_per_token};
