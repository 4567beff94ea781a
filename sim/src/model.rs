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

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// One GiB (2^30 bytes), the unit vLLM prints its memory numbers in.
pub const GIB: u64 = 1 << 30;

/// Errors from building an engine or submitting a request. Each names what is wrong and how to fix it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ModelError {
    /// No model preset has this name.
    #[error("unknown model preset {0:?}; known presets: {known}", known = ModelSpec::PRESETS.join(", "))]
    UnknownModelPreset(String),
    /// No GPU preset has this name.
    #[error("unknown GPU preset {0:?}; known presets: {known}", known = GpuSpec::PRESETS.join(", "))]
    UnknownGpuPreset(String),
    /// A configuration value is out of its range.
    #[error("invalid {field}: {reason}")]
    InvalidConfig {
        /// The field (named like vLLM's flag where there is one).
        field: &'static str,
        /// What is wrong with it and what is allowed.
        reason: String,
    },
    /// vLLM refuses to start when the weights, activations and non-torch memory leave no room for the KV cache.
    #[error(
        "No available memory for the cache blocks: the memory budget is {budget_gib:.2} GiB but weights take \
         {weights_gib:.2} GiB and activations plus non-torch memory {overhead_gib:.2} GiB. Try increasing \
         gpu_memory_utilization, a larger GPU, or a smaller model"
    )]
    NoMemoryForCache {
        /// The memory vLLM may use, in GiB.
        budget_gib: f64,
        /// The model weights, in GiB.
        weights_gib: f64,
        /// Activation peak plus non-torch memory, in GiB.
        overhead_gib: f64,
    },
    /// vLLM refuses to start when one request of `max_model_len` tokens cannot fit in the KV cache.
    #[error(
        "The model's max seq len ({max_model_len}) is larger than the maximum number of tokens that can be stored \
         in KV cache ({kv_tokens}). Try increasing gpu_memory_utilization (or kv_cache_memory_bytes) or \
         decreasing max_model_len"
    )]
    MaxModelLenTooLarge {
        /// The configured maximum sequence length.
        max_model_len: u32,
        /// Tokens the KV cache can hold.
        kv_tokens: u64,
    },
    /// A request is longer than the model allows; vLLM answers such a request with HTTP 400.
    #[error(
        "This model's maximum context length is {max_model_len} tokens. However, you requested {total} tokens \
         ({prompt} in the messages, {max_tokens} in the completion). Please reduce the length of the messages \
         or completion."
    )]
    RequestTooLong {
        /// The model's maximum context length.
        max_model_len: u32,
        /// Prompt tokens.
        prompt: u32,
        /// Requested output tokens.
        max_tokens: u32,
        /// prompt + max_tokens.
        total: u64,
    },
    /// A request must ask for at least one output token.
    #[error("max_tokens must be at least 1, got 0")]
    ZeroMaxTokens,
    /// Two requests with the same id are in the engine at once.
    #[error("request id {0} is already in the engine")]
    DuplicateRequest(u64),
}

/// A model: what the performance model needs to know about it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelSpec {
    /// The model's name (a Hugging Face id for the presets).
    pub name: String,
    /// Parameter count, for the prefill FLOPs (2 × params per token).
    pub params: f64,
    /// Bytes of weights on the GPU ("Model loading took … GiB").
    pub weights_bytes: u64,
    /// KV cache bytes per token: 2 (K and V) × layers × KV heads × head dim × dtype bytes.
    pub bytes_per_kv_token: u64,
    /// The model's own maximum context length (vLLM's default for `--max-model-len`).
    pub max_model_len: u32,
    /// Activation peak plus non-torch memory at start-up (vLLM subtracts both from the budget).
    pub overhead_bytes: u64,
}

/// KV bytes per token from the attention shape: 2 (K and V) × layers × KV heads × head dim × dtype bytes.
pub const fn kv_bytes_per_token(layers: u64, kv_heads: u64, head_dim: u64, dtype_bytes: u64) -> u64 {
    2 * layers * kv_heads * head_dim * dtype_bytes
}

impl ModelSpec {
    /// Names accepted by [`ModelSpec::preset`].
    pub const PRESETS: &'static [&'static str] = &[
        "qwen2-7b",
        "llama-3.1-8b",
        "opt-125m",
        "qwen3-14b",
        "llama-3.1-70b",
    ];

    /// A real model's numbers; sources for each are in `docs/emulator.md`.
    pub fn preset(name: &str) -> Result<ModelSpec, ModelError> {
        let gib = |x: f64| (x * GIB as f64).round() as u64;
        let spec = match name.to_ascii_lowercase().as_str() {
            // Qwen2-7B-Instruct, bf16: 28 layers, 4 KV heads, head dim 128. Weights 14.2488 GiB and
            // activation + non-torch ≈ 0.56 GiB are measured on an A100 with vLLM 0.10.1.1 (memory-profiles.md #1-2).
            "qwen2-7b" | "qwen/qwen2-7b-instruct" => ModelSpec {
                name: "Qwen/Qwen2-7B-Instruct".into(),
                params: 7.62e9,
                weights_bytes: gib(14.2488),
                bytes_per_kv_token: kv_bytes_per_token(28, 4, 128, 2),
                max_model_len: 32_768,
                overhead_bytes: gib(0.56),
            },
            // Llama-3.1-8B-Instruct, bf16: 32 layers, 8 KV heads, head dim 128. Weights 14.96 GiB as logged by
            // vLLM (memory-profiles.md #3-5); activation 1.26 + non-torch 0.10 GiB from #3-#4 (V1 profiles at
            // max_num_batched_tokens, not max_model_len, so the small activation peak applies).
            "llama-3.1-8b" | "meta-llama/llama-3.1-8b-instruct" => ModelSpec {
                name: "meta-llama/Llama-3.1-8B-Instruct".into(),
                params: 8.03e9,
                weights_bytes: gib(14.96),
                bytes_per_kv_token: kv_bytes_per_token(32, 8, 128, 2),
                max_model_len: 131_072,
                overhead_bytes: gib(1.36),
            },
            // facebook/opt-125m (vLLM's default model): 12 layers, 12 heads (no GQA), head dim 64, fp16.
            "opt-125m" | "facebook/opt-125m" => ModelSpec {
                name: "facebook/opt-125m".into(),
                params: 1.25e8,
                weights_bytes: gib(0.24),
                bytes_per_kv_token: kv_bytes_per_token(12, 12, 64, 2),
                max_model_len: 2_048,
                overhead_bytes: gib(0.3),
            },
            // Qwen3-14B, bf16: 40 layers, 8 KV heads, head dim 128 (memory-profiles.md #7 checks 160 KiB/token).
            "qwen3-14b" | "qwen/qwen3-14b" => ModelSpec {
                name: "Qwen/Qwen3-14B".into(),
                params: 14.8e9,
                weights_bytes: gib(27.5),
                bytes_per_kv_token: kv_bytes_per_token(40, 8, 128, 2),
                max_model_len: 40_960,
                overhead_bytes: gib(1.5),
            },
            // Llama-3.1-70B-Instruct, bf16: 80 layers, 8 KV heads, head dim 128. Does not fit on one 80 GB GPU,
            // which is the point: the engine refuses to start, as vLLM does without tensor parallelism.
            "llama-3.1-70b" | "meta-llama/llama-3.1-70b-instruct" => ModelSpec {
                name: "meta-llama/Llama-3.1-70B-Instruct".into(),
                params: 70.6e9,
                weights_bytes: gib(131.4),
                bytes_per_kv_token: kv_bytes_per_token(80, 8, 128, 2),
                max_model_len: 131_072,
                overhead_bytes: gib(2.0),
            },
            _ => return Err(ModelError::UnknownModelPreset(name.to_owned())),
        };
        Ok(spec)
    }
}

/// A GPU: memory, memory bandwidth and dense bf16 throughput.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuSpec {
    /// A short name ("a100-80gb"); vLLM picks some defaults by device name.
    pub name: String,
    /// Total device memory as CUDA reports it (what vLLM multiplies `gpu_memory_utilization` by).
    pub memory_bytes: u64,
    /// Peak HBM bandwidth, bytes per second.
    pub hbm_bandwidth_bytes_per_s: f64,
    /// Peak dense bf16 tensor FLOPs per second.
    pub flops: f64,
}

impl GpuSpec {
    /// Names accepted by [`GpuSpec::preset`].
    pub const PRESETS: &'static [&'static str] = &["a100-80gb", "a100-40gb", "h100-80gb", "l4"];

    /// A real GPU's datasheet numbers; sources in `docs/emulator.md`.
    pub fn preset(name: &str) -> Result<GpuSpec, ModelError> {
        let gib = |x: f64| (x * GIB as f64).round() as u64;
        let spec = match name.to_ascii_lowercase().as_str() {
            // A100-SXM4-80GB: 2,039 GB/s HBM2e, 312 TFLOPS dense bf16; CUDA reports 79.25-79.28 GiB
            // (memory-profiles.md #1-2 derive 79.28 GiB from vLLM's own numbers).
            "a100-80gb" | "a100" => GpuSpec {
                name: "a100-80gb".into(),
                memory_bytes: gib(79.28),
                hbm_bandwidth_bytes_per_s: 2.039e12,
                flops: 312e12,
            },
            // A100-SXM4-40GB: 1,555 GB/s, 312 TFLOPS; vLLM logs total_gpu_memory=39.50GiB (memory-profiles.md #3).
            "a100-40gb" => GpuSpec {
                name: "a100-40gb".into(),
                memory_bytes: gib(39.50),
                hbm_bandwidth_bytes_per_s: 1.555e12,
                flops: 312e12,
            },
            // H100-SXM5-80GB: 3.35 TB/s HBM3, 989 TFLOPS dense bf16; 79.22 GiB total (memory-profiles.md #4).
            "h100-80gb" | "h100" => GpuSpec {
                name: "h100-80gb".into(),
                memory_bytes: gib(79.22),
                hbm_bandwidth_bytes_per_s: 3.35e12,
                flops: 989e12,
            },
            // L4: 24 GB GDDR6 at 300 GB/s, 121 TFLOPS dense bf16; CUDA reports about 22.0 GiB.
            "l4" => GpuSpec {
                name: "l4".into(),
                memory_bytes: gib(22.0),
                hbm_bandwidth_bytes_per_s: 300e9,
                flops: 121e12,
            },
            _ => return Err(ModelError::UnknownGpuPreset(name.to_owned())),
        };
        Ok(spec)
    }
}

/// How the KV cache is sized, as vLLM's two flags do.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum MemorySetting {
    /// `--gpu-memory-utilization`: the fraction of total GPU memory vLLM may use (0 < u ≤ 1).
    GpuMemoryUtilization(f64),
    /// `--kv-cache-memory-bytes`: the KV cache size itself, whatever the GPU holds.
    KvCacheBytes(u64),
}

/// Engine settings: vLLM's scheduler and cache flags plus the model's efficiency factors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineConfig {
    /// `--max-num-seqs`: most requests in one batch.
    pub max_num_seqs: u32,
    /// `--max-num-batched-tokens`: token budget of one step (prefill chunks + decodes).
    pub max_num_batched_tokens: u32,
    /// `--block-size`: tokens per KV block.
    pub block_size: u32,
    /// `--max-model-len`; `None` = the model's own.
    pub max_model_len: Option<u32>,
    /// How the KV cache is sized.
    pub memory: MemorySetting,
    /// Share of the GPU's compute this engine gets (1.0 = the whole GPU).
    pub compute_fraction: f64,
    /// Achieved fraction of peak HBM bandwidth in memory-bound (decode) steps.
    pub memory_efficiency: f64,
    /// Achieved fraction of peak FLOPs in compute-bound (prefill) steps.
    pub compute_efficiency: f64,
    /// Fixed time per step outside the GPU kernels' roofline (scheduling, sampling, launches), seconds.
    pub step_overhead_s: f64,
}

impl EngineConfig {
    /// vLLM's defaults for the OpenAI server on this GPU: 8192 batched tokens and 1024 sequences on GPUs with
    /// at least 70 GiB that are not A100s, else 2048 and 256 (`EngineArgs.get_batch_defaults`); block size 16,
    /// `gpu_memory_utilization` 0.9.
    pub fn vllm_defaults(gpu: &GpuSpec) -> EngineConfig {
        let big = gpu.memory_bytes >= 70 * GIB && !gpu.name.to_ascii_lowercase().contains("a100");
        EngineConfig {
            max_num_seqs: if big { 1024 } else { 256 },
            max_num_batched_tokens: if big { 8192 } else { 2048 },
            block_size: 16,
            max_model_len: None,
            memory: MemorySetting::GpuMemoryUtilization(0.9),
            compute_fraction: 1.0,
            memory_efficiency: 0.8,
            compute_efficiency: 0.6,
            step_overhead_s: 0.001,
        }
    }

    fn validate(&self) -> Result<(), ModelError> {
        let bad = |field, reason: String| Err(ModelError::InvalidConfig { field, reason });
        if self.max_num_seqs == 0 {
            return bad("max_num_seqs", "must be at least 1".into());
        }
        if self.block_size == 0 {
            return bad(
                "block_size",
                "must be at least 1 (vLLM uses 16 by default)".into(),
            );
        }
        if self.max_num_batched_tokens < self.max_num_seqs {
            return bad(
                "max_num_batched_tokens",
                format!(
                    "{} is smaller than max_num_seqs ({}); raise it or lower max_num_seqs",
                    self.max_num_batched_tokens, self.max_num_seqs
                ),
            );
        }
        if let MemorySetting::GpuMemoryUtilization(u) = self.memory
            && !(u > 0.0 && u <= 1.0)
        {
            return bad("gpu_memory_utilization", format!("{u} is outside (0, 1]"));
        }
        let in_unit = |x: f64| x > 0.0 && x <= 1.0;
        if !in_unit(self.compute_fraction) {
            return bad(
                "compute_fraction",
                format!("{} is outside (0, 1]", self.compute_fraction),
            );
        }
        if !in_unit(self.memory_efficiency) {
            return bad(
                "memory_efficiency",
                format!("{} is outside (0, 1]", self.memory_efficiency),
            );
        }
        if !in_unit(self.compute_efficiency) {
            return bad(
                "compute_efficiency",
                format!("{} is outside (0, 1]", self.compute_efficiency),
            );
        }
        if !(self.step_overhead_s >= 0.0 && self.step_overhead_s.is_finite()) {
            return bad(
                "step_overhead_s",
                format!("{} must be a finite number ≥ 0", self.step_overhead_s),
            );
        }
        Ok(())
    }
}

/// One request as the engine sees it (tokens only; the text stays with the server).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Caller's id, unique among the requests in the engine.
    pub id: u64,
    /// Prompt length in tokens.
    pub prompt_tokens: u32,
    /// The request's `max_tokens`.
    pub max_tokens: u32,
    /// Where the model would emit end-of-sequence on its own (`None` = never, as with `ignore_eos`).
    /// Output stops at `min(max_tokens, stop_at)`; finishing early counts as `finished_reason="stop"`.
    pub stop_at: Option<u32>,
}

impl Request {
    /// A request that generates exactly `max_tokens` tokens.
    pub fn new(id: u64, prompt_tokens: u32, max_tokens: u32) -> Request {
        Request {
            id,
            prompt_tokens,
            max_tokens,
            stop_at: None,
        }
    }

    fn output_target(&self) -> u32 {
        self.stop_at
            .map_or(self.max_tokens, |s| s.clamp(1, self.max_tokens))
    }
}

/// Why a request finished, as vLLM's `finished_reason` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FinishReason {
    /// The model emitted end-of-sequence.
    Stop,
    /// It reached `max_tokens`.
    Length,
    /// The client went away (or the caller aborted it) before it finished.
    Abort,
}

impl FinishReason {
    /// The label value vLLM uses.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// Something that happened to a request, at a virtual time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum EngineEvent {
    /// The request's first output token.
    FirstToken {
        /// Request id.
        id: u64,
        /// When (seconds).
        at: f64,
        /// Time to first token: `at` − arrival.
        ttft: f64,
    },
    /// One more output token (after the first); `index` counts from 0, so the first `Token` has index 1.
    Token {
        /// Request id.
        id: u64,
        /// Output token index.
        index: u32,
        /// When (seconds).
        at: f64,
    },
    /// The request finished; its blocks are free.
    Finished {
        /// Request id.
        id: u64,
        /// When (seconds).
        at: f64,
        /// Time to first token.
        ttft: f64,
        /// Arrival to last token.
        e2e: f64,
        /// Arrival to first scheduling.
        queue_time: f64,
        /// Output tokens produced.
        output_tokens: u32,
        /// Prompt tokens.
        prompt_tokens: u32,
        /// Times it was preempted.
        preemptions: u32,
        /// Stop or length.
        reason: FinishReason,
    },
    /// The request was preempted (recompute): its blocks are freed and it waits at the head of the queue.
    Preempted {
        /// Request id.
        id: u64,
        /// When (seconds).
        at: f64,
    },
}

/// Bucket upper bounds of vLLM's `vllm:time_to_first_token_seconds` (vllm/v1/metrics/loggers.py).
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
];
/// Bucket bounds of `vllm:inter_token_latency_seconds` and `vllm:time_per_output_token_seconds`.
pub const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
];
/// Bucket bounds vLLM shares among e2e, queue, inference, prefill and decode time histograms.
pub const REQUEST_LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
];
/// Bucket bounds of `vllm:iteration_tokens_total`.
pub const ITERATION_TOKENS_BUCKETS: &[f64] = &[
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];
/// Bucket bounds of `vllm:request_params_n`.
pub const PARAMS_N_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0];
/// `vllm:request_num_preemptions` bucket bounds (as a real vLLM 0.32.0 page shows them).
pub const NUM_PREEMPTIONS_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0];

/// vLLM's `build_1_2_5_buckets(max)`: 1, 2, 5, 10, 20, 50, … up to `max` (token-count histograms).
pub fn buckets_1_2_5(max: u64) -> Vec<f64> {
    let mut out = Vec::new();
    let mut scale: u64 = 1;
    loop {
        for m in [1u64, 2, 5] {
            let v = m.saturating_mul(scale);
            if v > max {
                return out;
            }
            out.push(v as f64);
        }
        scale = scale.saturating_mul(10);
    }
}

/// A cumulative Prometheus-style histogram with fixed bounds (plus the implicit `+Inf`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    /// Upper bounds, ascending, without `+Inf`.
    pub bounds: Vec<f64>,
    /// Observations per bucket (not cumulative); one more entry than `bounds`, the last being `+Inf`.
    pub counts: Vec<u64>,
    /// Sum of observations.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
}

impl Histogram {
    /// An empty histogram with these upper bounds.
    pub fn new(bounds: &[f64]) -> Histogram {
        Histogram {
            bounds: bounds.to_vec(),
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    /// Records one value (`le` semantics: a value equal to a bound falls in that bucket).
    pub fn observe(&mut self, v: f64) {
        let i = self.bounds.partition_point(|b| *b < v);
        self.counts[i] += 1;
        self.sum += v;
        self.count += 1;
    }

    /// `(le, cumulative count)` pairs, ending with `(+Inf, count)`.
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut acc = 0;
        let mut out = Vec::with_capacity(self.counts.len());
        for (i, c) in self.counts.iter().enumerate() {
            acc += c;
            out.push((self.bounds.get(i).copied().unwrap_or(f64::INFINITY), acc));
        }
        out
    }

    /// The same observations as the cumulative histogram vLLM's `/metrics` shows and the project's parser reads
    /// (`tessera_core::metrics::Histogram`), so windows and quantiles use the one implementation the sidecar uses.
    pub fn to_cumulative(&self) -> tessera_core::metrics::Histogram {
        let mut acc = 0u64;
        let buckets = self
            .bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(&self.counts)
            .map(|(le, c)| {
                acc += c;
                tessera_core::metrics::Bucket {
                    le,
                    cumulative: acc as f64,
                }
            })
            .collect();
        tessera_core::metrics::Histogram {
            buckets,
            sum: self.sum,
            count: self.count as f64,
        }
    }

    /// The `q` quantile as Prometheus' `histogram_quantile` computes it (`tessera_core::metrics::Histogram::quantile`).
    pub fn quantile(&self, q: f64) -> Option<f64> {
        self.to_cumulative().quantile(q)
    }
}

/// The engine's counters, gauges and cumulative histograms: what vLLM's `/metrics` shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineStats {
    /// `num_gpu_blocks`.
    pub kv_blocks_total: u64,
    /// Blocks held by requests now.
    pub kv_blocks_used: u64,
    /// `kv_blocks_used / kv_blocks_total` (vLLM's `kv_cache_usage_perc`, a 0-1 fraction).
    pub kv_usage: f64,
    /// Requests in the running batch.
    pub running: u64,
    /// Requests waiting (new or preempted).
    pub waiting: u64,
    /// Cumulative preemptions.
    pub num_preemptions: u64,
    /// Prompt tokens of requests that produced their first token.
    pub prompt_tokens: u64,
    /// Output tokens produced.
    pub generation_tokens: u64,
    /// Requests finished with `finished_reason="stop"`.
    pub finished_stop: u64,
    /// Requests finished with `finished_reason="length"`.
    pub finished_length: u64,
    /// Requests aborted (`finished_reason="abort"`).
    pub finished_abort: u64,
    /// Prefix cache queries (tokens looked up when a request is scheduled).
    pub prefix_cache_queries: u64,
    /// Prefix cache hits (always 0: the model has no prefix cache).
    pub prefix_cache_hits: u64,
    /// Steps run.
    pub steps: u64,
    /// Virtual seconds the GPU was busy.
    pub busy_time_s: f64,
    /// `vllm:time_to_first_token_seconds`.
    pub ttft: Histogram,
    /// `vllm:inter_token_latency_seconds`.
    pub itl: Histogram,
    /// `vllm:request_time_per_output_token_seconds` (per request: decode time / (output − 1)).
    pub tpot: Histogram,
    /// `vllm:e2e_request_latency_seconds`.
    pub e2e: Histogram,
    /// `vllm:request_queue_time_seconds`.
    pub queue_time: Histogram,
    /// `vllm:request_inference_time_seconds`.
    pub inference_time: Histogram,
    /// `vllm:request_prefill_time_seconds`.
    pub prefill_time: Histogram,
    /// `vllm:request_decode_time_seconds`.
    pub decode_time: Histogram,
    /// `vllm:request_prompt_tokens`.
    pub request_prompt_tokens: Histogram,
    /// `vllm:request_generation_tokens`.
    pub request_generation_tokens: Histogram,
    /// `vllm:request_params_max_tokens`.
    pub request_max_tokens: Histogram,
    /// `vllm:iteration_tokens_total`.
    pub iteration_tokens: Histogram,
    /// `vllm:request_num_preemptions` (per finished request).
    pub request_num_preemptions: Histogram,
    /// `vllm:request_prefill_kv_computed_tokens` (per finished request: prompt tokens not served from the prefix
    /// cache, which the model does not have, so all of them).
    pub request_prefill_kv_computed_tokens: Histogram,
}

/// A request inside the engine.
#[derive(Debug, Clone)]
struct Seq {
    req: Request,
    arrival: f64,
    /// Tokens whose KV is computed (reset to 0 by preemption).
    computed: u64,
    /// Output tokens produced so far.
    output: u32,
    blocks: u64,
    first_scheduled: Option<f64>,
    first_token: Option<f64>,
    last_token: f64,
    preemptions: u32,
    /// Tokens scheduled in the step in flight.
    scheduled: u64,
}

impl Seq {
    /// Tokens the model must have seen to produce the next output token: prompt + output so far.
    fn total_tokens(&self) -> u64 {
        u64::from(self.req.prompt_tokens) + u64::from(self.output)
    }
}

/// A step that has started and not yet ended.
#[derive(Debug, Clone, Copy)]
struct Step {
    end: f64,
    tokens: u64,
}

/// One vLLM engine on one GPU, in virtual time. See the module docs.
#[derive(Debug, Clone)]
pub struct Engine {
    model: ModelSpec,
    gpu: GpuSpec,
    cfg: EngineConfig,
    max_model_len: u32,
    kv_cache_bytes: u64,
    blocks_total: u64,
    blocks_free: u64,
    running: Vec<Seq>,
    waiting: VecDeque<Seq>,
    step: Option<Step>,
    /// The latest time the engine has seen (submit or advance); time never goes backwards.
    now: f64,
    stats: EngineStats,
}

impl Engine {
    /// Builds an engine, refusing configurations that vLLM refuses at start-up.
    pub fn new(model: ModelSpec, gpu: GpuSpec, cfg: EngineConfig) -> Result<Engine, ModelError> {
        cfg.validate()?;
        let max_model_len = cfg.max_model_len.unwrap_or(model.max_model_len);
        if max_model_len == 0 {
            return Err(ModelError::InvalidConfig {
                field: "max_model_len",
                reason: "must be at least 1".into(),
            });
        }
        if model.bytes_per_kv_token == 0 {
            return Err(ModelError::InvalidConfig {
                field: "bytes_per_kv_token",
                reason: "must be at least 1: 2 × layers × kv_heads × head_dim × dtype bytes".into(),
            });
        }
        let kv_cache_bytes = Self::kv_cache_bytes(&model, &gpu, &cfg)?;
        let block_bytes = model.bytes_per_kv_token * u64::from(cfg.block_size);
        let blocks_total = kv_cache_bytes / block_bytes;
        let kv_tokens = blocks_total * u64::from(cfg.block_size);
        if kv_tokens < u64::from(max_model_len) {
            return Err(ModelError::MaxModelLenTooLarge {
                max_model_len,
                kv_tokens,
            });
        }
        let stats = EngineStats {
            kv_blocks_total: blocks_total,
            kv_blocks_used: 0,
            kv_usage: 0.0,
            running: 0,
            waiting: 0,
            num_preemptions: 0,
            prompt_tokens: 0,
            generation_tokens: 0,
            finished_stop: 0,
            finished_length: 0,
            finished_abort: 0,
            prefix_cache_queries: 0,
            prefix_cache_hits: 0,
            steps: 0,
            busy_time_s: 0.0,
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            tpot: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(REQUEST_LATENCY_BUCKETS),
            queue_time: Histogram::new(REQUEST_LATENCY_BUCKETS),
            inference_time: Histogram::new(REQUEST_LATENCY_BUCKETS),
            prefill_time: Histogram::new(REQUEST_LATENCY_BUCKETS),
            decode_time: Histogram::new(REQUEST_LATENCY_BUCKETS),
            request_prompt_tokens: Histogram::new(&buckets_1_2_5(u64::from(max_model_len))),
            request_generation_tokens: Histogram::new(&buckets_1_2_5(u64::from(max_model_len))),
            request_max_tokens: Histogram::new(&buckets_1_2_5(u64::from(max_model_len))),
            iteration_tokens: Histogram::new(ITERATION_TOKENS_BUCKETS),
            request_num_preemptions: Histogram::new(NUM_PREEMPTIONS_BUCKETS),
            request_prefill_kv_computed_tokens: Histogram::new(&buckets_1_2_5(u64::from(max_model_len))),
        };
        Ok(Engine {
            model,
            gpu,
            cfg,
            max_model_len,
            kv_cache_bytes,
            blocks_total,
            blocks_free: blocks_total,
            running: Vec::new(),
            waiting: VecDeque::new(),
            step: None,
            now: 0.0,
            stats,
        })
    }

    /// KV cache bytes as vLLM computes them: `util × total − weights − (activation + non-torch)`, or the
    /// `kv_cache_memory_bytes` flag as given (which must still fit beside the weights).
    fn kv_cache_bytes(model: &ModelSpec, gpu: &GpuSpec, cfg: &EngineConfig) -> Result<u64, ModelError> {
        let to_gib = |b: f64| b / GIB as f64;
        let weights = model.weights_bytes as f64;
        let overhead = model.overhead_bytes as f64;
        match cfg.memory {
            MemorySetting::GpuMemoryUtilization(u) => {
                let budget = u * gpu.memory_bytes as f64;
                let kv = budget - weights - overhead;
                if kv <= 0.0 {
                    return Err(ModelError::NoMemoryForCache {
                        budget_gib: to_gib(budget),
                        weights_gib: to_gib(weights),
                        overhead_gib: to_gib(overhead),
                    });
                }
                Ok(kv as u64)
            }
            MemorySetting::KvCacheBytes(b) => {
                let need = weights + overhead + b as f64;
                if need > gpu.memory_bytes as f64 {
                    return Err(ModelError::InvalidConfig {
                        field: "kv_cache_memory_bytes",
                        reason: format!(
                            "{:.2} GiB of KV cache plus {:.2} GiB of weights and {:.2} GiB of activations exceed \
                             the GPU's {:.2} GiB; lower kv_cache_memory_bytes",
                            to_gib(b as f64),
                            to_gib(weights),
                            to_gib(overhead),
                            to_gib(gpu.memory_bytes as f64)
                        ),
                    });
                }
                Ok(b)
            }
        }
    }

    /// The model this engine serves.
    pub fn model(&self) -> &ModelSpec {
        &self.model
    }

    /// The GPU it runs on.
    pub fn gpu(&self) -> &GpuSpec {
        &self.gpu
    }

    /// Its configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The effective maximum context length.
    pub fn max_model_len(&self) -> u32 {
        self.max_model_len
    }

    /// `num_gpu_blocks`.
    pub fn kv_blocks_total(&self) -> u64 {
        self.blocks_total
    }

    /// The KV cache size in bytes (before rounding down to whole blocks).
    pub fn kv_cache_bytes_configured(&self) -> u64 {
        self.kv_cache_bytes
    }

    /// GPU memory this engine holds: weights + activation/non-torch + KV cache.
    pub fn gpu_memory_used_bytes(&self) -> u64 {
        self.model.weights_bytes + self.model.overhead_bytes + self.kv_cache_bytes
    }

    /// True when no request is running or waiting.
    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    /// Requests in the engine (running + waiting).
    pub fn in_flight(&self) -> usize {
        self.running.len() + self.waiting.len()
    }

    /// Checks a request against the model's limits without submitting it (the API layer's 400 check).
    pub fn check(&self, req: &Request) -> Result<(), ModelError> {
        if req.max_tokens == 0 {
            return Err(ModelError::ZeroMaxTokens);
        }
        let total = u64::from(req.prompt_tokens) + u64::from(req.max_tokens);
        if total > u64::from(self.max_model_len) || req.prompt_tokens == 0 {
            return Err(ModelError::RequestTooLong {
                max_model_len: self.max_model_len,
                prompt: req.prompt_tokens,
                max_tokens: req.max_tokens,
                total,
            });
        }
        Ok(())
    }

    /// Adds a request that arrived at `now`. It joins the waiting queue; if the engine is idle, a step starts
    /// at `now`. Fails, changing nothing, when vLLM would reject the request.
    pub fn submit(&mut self, req: Request, now: f64) -> Result<(), ModelError> {
        self.check(&req)?;
        if self
            .running
            .iter()
            .chain(self.waiting.iter())
            .any(|s| s.req.id == req.id)
        {
            return Err(ModelError::DuplicateRequest(req.id));
        }
        self.now = self.now.max(now);
        self.waiting.push_back(Seq {
            req,
            arrival: now,
            computed: 0,
            output: 0,
            blocks: 0,
            first_scheduled: None,
            first_token: None,
            last_token: now,
            preemptions: 0,
            scheduled: 0,
        });
        if self.step.is_none() {
            let at = self.now;
            self.start_step(at, &mut |_| {});
        }
        self.refresh_gauges();
        Ok(())
    }

    /// When the step in flight ends (`None` = idle: nothing happens until the next `submit`).
    pub fn next_event_time(&self) -> Option<f64> {
        self.step.map(|s| s.end)
    }

    /// Runs every step that ends at or before `now`, reporting what happened to `sink` in time order.
    pub fn advance(&mut self, now: f64, sink: &mut impl FnMut(EngineEvent)) {
        while let Some(step) = self.step {
            if step.end > now {
                break;
            }
            self.finish_step(step, sink);
            self.start_step(step.end, sink);
        }
        self.now = self.now.max(now);
        self.refresh_gauges();
    }

    /// Aborts a request (the client went away): it leaves the engine and frees its blocks; the step in flight
    /// still ends when it was going to. Returns false when no such request is in the engine.
    pub fn abort(&mut self, id: u64, now: f64) -> bool {
        self.now = self.now.max(now);
        if let Some(i) = self.running.iter().position(|s| s.req.id == id) {
            let seq = self.running.remove(i);
            self.blocks_free += seq.blocks;
        } else if let Some(i) = self.waiting.iter().position(|s| s.req.id == id) {
            // Waiting requests hold no blocks (preemption freed them).
            self.waiting.remove(i);
        } else {
            return false;
        }
        // vLLM counts aborted requests only in request_success{finished_reason="abort"}, not in the latency
        // histograms.
        self.stats.finished_abort += 1;
        self.refresh_gauges();
        true
    }

    /// Counters, gauges and histograms now.
    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    /// Blocks a request with `tokens` tokens of KV needs.
    fn blocks_for(&self, tokens: u64) -> u64 {
        tokens.div_ceil(u64::from(self.cfg.block_size))
    }

    fn refresh_gauges(&mut self) {
        let used = self.blocks_total - self.blocks_free;
        self.stats.kv_blocks_used = used;
        self.stats.kv_usage = if self.blocks_total == 0 {
            0.0
        } else {
            used as f64 / self.blocks_total as f64
        };
        self.stats.running = self.running.len() as u64;
        self.stats.waiting = self.waiting.len() as u64;
    }

    /// Preempts the newest running request (recompute): frees its blocks, puts it at the head of the queue.
    fn preempt_last(&mut self, at: f64, sink: &mut impl FnMut(EngineEvent)) -> Option<u64> {
        let mut seq = self.running.pop()?;
        self.blocks_free += seq.blocks;
        seq.blocks = 0;
        seq.computed = 0;
        seq.scheduled = 0;
        seq.preemptions += 1;
        self.stats.num_preemptions += 1;
        let id = seq.req.id;
        sink(EngineEvent::Preempted { id, at });
        self.waiting.push_front(seq);
        Some(id)
    }

    /// Schedules one step at `at` (V1 order: running first, then waiting while nothing was preempted).
    fn start_step(&mut self, at: f64, sink: &mut impl FnMut(EngineEvent)) {
        let mut budget = u64::from(self.cfg.max_num_batched_tokens);
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let seq = &self.running[i];
            let n = (seq.total_tokens() - seq.computed).min(budget);
            let need = self.blocks_for(seq.computed + n).saturating_sub(seq.blocks);
            let mut scheduled_self = true;
            while need > self.blocks_free {
                preempted = true;
                // The victim is the newest request; if that is this one, it cannot run in this step.
                let victim_is_self = i == self.running.len() - 1;
                self.preempt_last(at, sink);
                if victim_is_self {
                    scheduled_self = false;
                    break;
                }
            }
            if !scheduled_self {
                break;
            }
            let seq = &mut self.running[i];
            seq.blocks += need;
            seq.scheduled = n;
            self.blocks_free -= need;
            budget -= n;
            i += 1;
        }
        // Requests after the budget ran out are in the batch but get no tokens this step.
        for seq in self.running.iter_mut().skip(i) {
            seq.scheduled = 0;
        }
        if !preempted {
            while budget > 0 && (self.running.len() as u64) < u64::from(self.cfg.max_num_seqs) {
                let Some(seq) = self.waiting.front() else { break };
                let n = (seq.total_tokens() - seq.computed).min(budget);
                let need = self.blocks_for(seq.computed + n);
                if need > self.blocks_free {
                    break; // FCFS: the head of the queue waits for blocks, and so does everyone behind it.
                }
                let Some(mut seq) = self.waiting.pop_front() else {
                    break;
                };
                if seq.first_scheduled.is_none() {
                    seq.first_scheduled = Some(at);
                    self.stats.prefix_cache_queries += u64::from(seq.req.prompt_tokens);
                }
                seq.blocks = need;
                seq.scheduled = n;
                self.blocks_free -= need;
                budget -= n;
                self.running.push(seq);
            }
        }
        let tokens = u64::from(self.cfg.max_num_batched_tokens) - budget;
        if tokens == 0 {
            // Nothing can run: only possible when the engine is empty (a lone request always fits, since
            // max_model_len fits in the cache and requests are checked against it).
            self.step = None;
            return;
        }
        let kv_tokens_read: u64 = self
            .running
            .iter()
            .filter(|s| s.scheduled > 0)
            .map(|s| s.computed + s.scheduled)
            .sum();
        let dur = self.step_time(tokens, kv_tokens_read);
        self.stats.steps += 1;
        self.stats.busy_time_s += dur;
        self.step = Some(Step {
            end: at + dur,
            tokens,
        });
    }

    /// Step duration from the roofline: GPU time is the larger of the memory time (weights + KV read from HBM)
    /// and the compute time (2 × params FLOPs per token), stretched by the GPU share; plus a fixed overhead.
    pub fn step_time(&self, tokens: u64, kv_tokens_read: u64) -> f64 {
        let bytes =
            self.model.weights_bytes as f64 + kv_tokens_read as f64 * self.model.bytes_per_kv_token as f64;
        let t_mem = bytes / (self.gpu.hbm_bandwidth_bytes_per_s * self.cfg.memory_efficiency);
        let t_compute =
            2.0 * self.model.params * tokens as f64 / (self.gpu.flops * self.cfg.compute_efficiency);
        t_mem.max(t_compute) / self.cfg.compute_fraction + self.cfg.step_overhead_s
    }

    fn finish_step(&mut self, step: Step, sink: &mut impl FnMut(EngineEvent)) {
        let at = step.end;
        self.stats.iteration_tokens.observe(step.tokens as f64);
        let mut i = 0;
        while i < self.running.len() {
            let seq = &mut self.running[i];
            if seq.scheduled == 0 {
                i += 1;
                continue;
            }
            seq.computed += seq.scheduled;
            seq.scheduled = 0;
            if seq.computed < seq.total_tokens() {
                i += 1; // a prefill chunk that has not reached the end of the prompt yet
                continue;
            }
            // The step covered every token the request has: the model samples one more.
            seq.output += 1;
            self.stats.generation_tokens += 1;
            let id = seq.req.id;
            if seq.first_token.is_none() {
                seq.first_token = Some(at);
                let ttft = at - seq.arrival;
                self.stats.ttft.observe(ttft);
                self.stats.prompt_tokens += u64::from(seq.req.prompt_tokens);
                sink(EngineEvent::FirstToken { id, at, ttft });
            } else {
                self.stats.itl.observe(at - seq.last_token);
                sink(EngineEvent::Token {
                    id,
                    index: seq.output - 1,
                    at,
                });
            }
            seq.last_token = at;
            let target = seq.req.output_target();
            if seq.output >= target {
                let seq = self.running.remove(i);
                self.blocks_free += seq.blocks;
                self.record_finished(&seq, at, sink);
                continue;
            }
            i += 1;
        }
    }

    fn record_finished(&mut self, seq: &Seq, at: f64, sink: &mut impl FnMut(EngineEvent)) {
        let first_token = seq.first_token.unwrap_or(at);
        let scheduled = seq.first_scheduled.unwrap_or(seq.arrival);
        let reason = if seq.output < seq.req.max_tokens {
            FinishReason::Stop
        } else {
            FinishReason::Length
        };
        match reason {
            FinishReason::Stop => self.stats.finished_stop += 1,
            FinishReason::Length => self.stats.finished_length += 1,
            FinishReason::Abort => self.stats.finished_abort += 1,
        }
        let ttft = first_token - seq.arrival;
        let e2e = at - seq.arrival;
        let queue_time = scheduled - seq.arrival;
        let s = &mut self.stats;
        s.e2e.observe(e2e);
        s.queue_time.observe(queue_time);
        s.inference_time.observe(at - scheduled);
        s.prefill_time.observe(first_token - scheduled);
        s.decode_time.observe(at - first_token);
        if seq.output > 1 {
            s.tpot.observe((at - first_token) / f64::from(seq.output - 1));
        }
        s.request_prompt_tokens.observe(f64::from(seq.req.prompt_tokens));
        s.request_generation_tokens.observe(f64::from(seq.output));
        s.request_max_tokens.observe(f64::from(seq.req.max_tokens));
        s.request_num_preemptions.observe(f64::from(seq.preemptions));
        s.request_prefill_kv_computed_tokens
            .observe(f64::from(seq.req.prompt_tokens));
        sink(EngineEvent::Finished {
            id: seq.req.id,
            at,
            ttft,
            e2e,
            queue_time,
            output_tokens: seq.output,
            prompt_tokens: seq.req.prompt_tokens,
            preemptions: seq.preemptions,
            reason,
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    fn engine_with(f: impl FnOnce(&mut EngineConfig)) -> Engine {
        let gpu = GpuSpec::preset("a100-80gb").unwrap();
        let mut cfg = EngineConfig::vllm_defaults(&gpu);
        cfg.max_model_len = Some(16_384);
        f(&mut cfg);
        Engine::new(ModelSpec::preset("qwen2-7b").unwrap(), gpu, cfg).unwrap()
    }

    /// Runs the engine until it is idle, returning every event.
    fn drain(e: &mut Engine) -> Vec<EngineEvent> {
        let mut ev = Vec::new();
        while let Some(t) = e.next_event_time() {
            e.advance(t, &mut |x| ev.push(x));
        }
        ev
    }

    #[test]
    fn kv_blocks_match_vllm_measurements_for_qwen2_7b_on_a100() {
        // vLLM 0.10.1.1 logged num_gpu_blocks 5,867 at util 0.25 and 29,053 at 0.5 (memory-profiles.md #1-2).
        for (util, measured) in [(0.25, 5_867.0), (0.5, 29_053.0)] {
            let e = engine_with(|c| c.memory = MemorySetting::GpuMemoryUtilization(util));
            let got = e.kv_blocks_total() as f64;
            assert!(
                (got - measured).abs() / measured < 0.02,
                "util {util}: {got} blocks vs {measured} measured"
            );
        }
    }

    #[test]
    fn kv_cache_bytes_flag_sets_the_cache_directly() {
        let e = engine_with(|c| c.memory = MemorySetting::KvCacheBytes(5 * GIB));
        assert_eq!(e.kv_blocks_total(), 5 * GIB / (57_344 * 16));
    }

    #[test]
    fn refuses_to_start_like_vllm() {
        let gpu = GpuSpec::preset("a100-80gb").unwrap();
        let cfg = EngineConfig::vllm_defaults(&gpu);
        let err = Engine::new(
            ModelSpec::preset("llama-3.1-70b").unwrap(),
            gpu.clone(),
            cfg.clone(),
        )
        .unwrap_err();
        assert!(matches!(err, ModelError::NoMemoryForCache { .. }), "{err}");
        let mut small = cfg.clone();
        small.memory = MemorySetting::GpuMemoryUtilization(0.18);
        let err = Engine::new(ModelSpec::preset("qwen2-7b").unwrap(), gpu.clone(), small).unwrap_err();
        assert!(err.to_string().contains("No available memory"), "{err}");
        // A little memory but not enough for one max-length sequence.
        let mut tight = cfg;
        tight.memory = MemorySetting::GpuMemoryUtilization(0.195);
        tight.max_model_len = Some(32_768);
        let err = Engine::new(ModelSpec::preset("qwen2-7b").unwrap(), gpu, tight).unwrap_err();
        assert!(matches!(err, ModelError::MaxModelLenTooLarge { .. }), "{err}");
    }

    #[test]
    fn bad_config_names_the_field() {
        let gpu = GpuSpec::preset("l4").unwrap();
        let mut cfg = EngineConfig::vllm_defaults(&gpu);
        cfg.compute_fraction = 0.0;
        let err = Engine::new(ModelSpec::preset("opt-125m").unwrap(), gpu, cfg).unwrap_err();
        assert!(err.to_string().contains("compute_fraction"), "{err}");
        assert!(
            ModelSpec::preset("gpt-5")
                .unwrap_err()
                .to_string()
                .contains("qwen2-7b")
        );
    }

    #[test]
    fn defaults_follow_vllm_by_gpu() {
        let a100 = EngineConfig::vllm_defaults(&GpuSpec::preset("a100-80gb").unwrap());
        let h100 = EngineConfig::vllm_defaults(&GpuSpec::preset("h100-80gb").unwrap());
        assert_eq!((a100.max_num_seqs, a100.max_num_batched_tokens), (256, 2048));
        assert_eq!((h100.max_num_seqs, h100.max_num_batched_tokens), (1024, 8192));
    }

    #[test]
    fn single_request_produces_every_token_in_order() {
        let mut e = engine_with(|_| {});
        e.submit(Request::new(7, 1000, 50), 0.0).unwrap();
        let ev = drain(&mut e);
        assert!(matches!(ev[0], EngineEvent::FirstToken { id: 7, .. }));
        let tokens = ev
            .iter()
            .filter(|x| matches!(x, EngineEvent::Token { .. }))
            .count();
        assert_eq!(tokens, 49);
        let EngineEvent::Finished {
            output_tokens,
            reason,
            ttft,
            e2e,
            ..
        } = ev[ev.len() - 1]
        else {
            panic!("last event {:?}", ev[ev.len() - 1]);
        };
        assert_eq!((output_tokens, reason), (50, FinishReason::Length));
        // 1,000-token prefill of a 7.6B model on an A100: tens of milliseconds; decode ~ 9 ms/token.
        assert!(ttft > 0.02 && ttft < 0.2, "ttft {ttft}");
        let itl = (e2e - ttft) / 49.0;
        assert!(itl > 0.005 && itl < 0.02, "itl {itl}");
        assert!(e.is_idle());
        assert_eq!(e.stats().kv_blocks_used, 0);
        assert_eq!(e.stats().generation_tokens, 50);
        assert_eq!(e.stats().prompt_tokens, 1000);
        assert_eq!(e.stats().ttft.count, 1);
        assert_eq!(e.stats().itl.count, 49);
    }

    #[test]
    fn stop_at_finishes_early_with_reason_stop() {
        let mut e = engine_with(|_| {});
        e.submit(
            Request {
                id: 1,
                prompt_tokens: 10,
                max_tokens: 100,
                stop_at: Some(5),
            },
            0.0,
        )
        .unwrap();
        let ev = drain(&mut e);
        assert!(matches!(
            ev.last(),
            Some(EngineEvent::Finished {
                output_tokens: 5,
                reason: FinishReason::Stop,
                ..
            })
        ));
        assert_eq!(e.stats().finished_stop, 1);
    }

    #[test]
    fn long_prompts_are_prefilled_in_chunks() {
        let mut e = engine_with(|c| c.max_num_batched_tokens = 512);
        e.submit(Request::new(1, 2000, 2), 0.0).unwrap();
        drain(&mut e);
        // 2,000 prompt tokens in chunks of ≤ 512: 4 steps, then 1 decode step.
        assert_eq!(e.stats().steps, 5);
        assert_eq!(e.stats().iteration_tokens.cumulative().last().unwrap().1, 5);
    }

    #[test]
    fn full_batch_makes_the_queue_grow() {
        let mut e = engine_with(|c| c.max_num_seqs = 4);
        for id in 0..10 {
            e.submit(Request::new(id, 100, 200), 0.0).unwrap();
        }
        e.advance(e.next_event_time().unwrap(), &mut |_| {});
        assert_eq!(e.stats().running, 4);
        assert_eq!(e.stats().waiting, 6);
        drain(&mut e);
        // The queued ones waited: some queue time is well above zero.
        assert!(
            e.stats().queue_time.sum > 1.0,
            "queue time {}",
            e.stats().queue_time.sum
        );
        assert_eq!(e.stats().finished_length, 10);
    }

    #[test]
    fn fewer_blocks_cause_preemptions() {
        // 2,000 tokens of KV (125 blocks) for requests that grow to 600 tokens each.
        let small = |c: &mut EngineConfig| {
            c.memory = MemorySetting::KvCacheBytes(2_000 * 57_344);
            c.max_model_len = Some(1024);
        };
        let mut e = engine_with(small);
        for id in 0..8 {
            e.submit(Request::new(id, 100, 500), 0.0).unwrap();
        }
        let ev = drain(&mut e);
        let preempted = ev
            .iter()
            .filter(|x| matches!(x, EngineEvent::Preempted { .. }))
            .count() as u64;
        assert!(preempted > 0);
        assert_eq!(e.stats().num_preemptions, preempted);
        assert_eq!(e.stats().finished_length, 8, "every request still finishes");
        // Plenty of blocks: no preemption at all.
        let mut big = engine_with(|c| c.max_model_len = Some(1024));
        for id in 0..8 {
            big.submit(Request::new(id, 100, 500), 0.0).unwrap();
        }
        drain(&mut big);
        assert_eq!(big.stats().num_preemptions, 0);
    }

    #[test]
    fn preempted_request_resumes_without_a_second_first_token() {
        let mut e = engine_with(|c| {
            c.memory = MemorySetting::KvCacheBytes(1_200 * 57_344);
            c.max_model_len = Some(1024);
        });
        for id in 0..4 {
            e.submit(Request::new(id, 200, 400), 0.0).unwrap();
        }
        let ev = drain(&mut e);
        assert!(e.stats().num_preemptions > 0);
        for id in 0..4 {
            let firsts = ev
                .iter()
                .filter(|x| matches!(x, EngineEvent::FirstToken { id: i, .. } if *i == id))
                .count();
            let tokens = ev
                .iter()
                .filter(|x| matches!(x, EngineEvent::Token { id: i, .. } if *i == id))
                .count();
            assert_eq!((firsts, tokens), (1, 399), "request {id}");
        }
    }

    #[test]
    fn half_the_compute_doubles_the_step_time() {
        let full = engine_with(|c| c.step_overhead_s = 0.0);
        let half = engine_with(|c| {
            c.step_overhead_s = 0.0;
            c.compute_fraction = 0.5;
        });
        for (tokens, kv) in [(1, 1000), (64, 64_000), (2048, 2048)] {
            let r = half.step_time(tokens, kv) / full.step_time(tokens, kv);
            assert!((r - 2.0).abs() < 1e-9, "ratio {r}");
        }
        // With the default overhead the whole step is still close to 2× slower.
        let (a, b) = (engine_with(|_| {}), engine_with(|c| c.compute_fraction = 0.5));
        let r = b.step_time(1, 1000) / a.step_time(1, 1000);
        assert!(r > 1.8 && r <= 2.0, "ratio {r}");
    }

    #[test]
    fn decode_step_time_grows_with_batch_and_prefill_with_prompt() {
        let e = engine_with(|_| {});
        assert!(e.step_time(64, 64 * 2000) > e.step_time(1, 2000));
        assert!(e.step_time(2048, 2048) > 2.0 * e.step_time(256, 256));
    }

    #[test]
    fn rejects_what_vllm_rejects() {
        let mut e = engine_with(|_| {});
        assert!(matches!(
            e.submit(Request::new(1, 16_000, 1000), 0.0),
            Err(ModelError::RequestTooLong { .. })
        ));
        assert_eq!(
            e.submit(Request::new(1, 10, 0), 0.0),
            Err(ModelError::ZeroMaxTokens)
        );
        e.submit(Request::new(1, 10, 10), 0.0).unwrap();
        assert_eq!(
            e.submit(Request::new(1, 10, 10), 0.0),
            Err(ModelError::DuplicateRequest(1))
        );
    }

    #[test]
    fn abort_frees_blocks_and_the_rest_go_on() {
        let mut e = engine_with(|_| {});
        e.submit(Request::new(1, 500, 100), 0.0).unwrap();
        e.submit(Request::new(2, 500, 100), 0.0).unwrap();
        e.advance(e.next_event_time().unwrap(), &mut |_| {});
        assert!(e.stats().kv_blocks_used > 0);
        assert!(e.abort(1, 0.5));
        assert!(!e.abort(1, 0.5));
        let ev = drain(&mut e);
        assert!(ev.iter().all(|x| !matches!(x, EngineEvent::Token { id: 1, .. })));
        assert_eq!((e.stats().finished_abort, e.stats().finished_length), (1, 1));
        assert_eq!(e.stats().kv_blocks_used, 0);
    }

    #[test]
    fn histogram_buckets_and_quantiles() {
        assert_eq!(buckets_1_2_5(100), vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]);
        let mut h = Histogram::new(&[1.0, 2.0]);
        for v in [0.5, 1.0, 1.5, 3.0] {
            h.observe(v);
        }
        assert_eq!(h.cumulative(), vec![(1.0, 2), (2.0, 3), (f64::INFINITY, 4)]);
        assert_eq!(h.quantile(0.5), Some(1.0));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Whatever arrives, blocks are never over-allocated, every request finishes with all its tokens,
        /// and time only moves forward.
        #[test]
        fn engine_invariants(
            reqs in prop::collection::vec((0.0f64..5.0, 1u32..600, 1u32..300, prop::option::of(1u32..300)), 1..40),
            kv_tokens in 1_024u64..20_000,
            max_num_seqs in 1u32..64,
        ) {
            let mut e = engine_with(|c| {
                c.memory = MemorySetting::KvCacheBytes(kv_tokens * 57_344);
                c.max_model_len = Some(1024);
                c.max_num_seqs = max_num_seqs;
                c.max_num_batched_tokens = 512.max(max_num_seqs);
            });
            let mut reqs = reqs;
            reqs.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut events = Vec::new();
            let mut last = 0.0f64;
            for (id, (t, p, m, s)) in reqs.iter().enumerate() {
                e.advance(*t, &mut |x| events.push(x));
                e.submit(Request { id: id as u64, prompt_tokens: *p, max_tokens: *m, stop_at: *s }, *t).unwrap();
                prop_assert!(e.stats().kv_blocks_used <= e.kv_blocks_total());
                prop_assert!(e.stats().running <= u64::from(max_num_seqs));
            }
            while let Some(t) = e.next_event_time() {
                prop_assert!(t >= last);
                last = t;
                e.advance(t, &mut |x| events.push(x));
                prop_assert!(e.stats().kv_blocks_used <= e.kv_blocks_total());
            }
            prop_assert!(e.is_idle());
            prop_assert_eq!(e.stats().kv_blocks_used, 0);
            for (id, (_, _, m, s)) in reqs.iter().enumerate() {
                let want = s.map_or(*m, |s| s.clamp(1, *m));
                let got = events.iter().find_map(|x| match x {
                    EngineEvent::Finished { id: i, output_tokens, .. } if *i == id as u64 => Some(*output_tokens),
                    _ => None,
                });
                prop_assert_eq!(got, Some(want));
            }
        }
    }
}
