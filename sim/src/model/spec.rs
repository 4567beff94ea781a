//! Models, GPUs and engine settings: the numbers the performance model runs on, and the errors vLLM gives at start-up.

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
        "llama-3.2-1b",
        "llama-3.2-3b",
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
            // Llama-3.2-1B-Instruct, bf16: 16 layers, 8 KV heads, head dim 64, tied embeddings; 1.24B parameters
            // (2.30 GiB of weights). Its overhead is not measured here: the 8B's small-activation figure, scaled.
            "llama-3.2-1b" | "meta-llama/llama-3.2-1b-instruct" => ModelSpec {
                name: "meta-llama/Llama-3.2-1B-Instruct".into(),
                params: 1.24e9,
                weights_bytes: gib(2.30),
                bytes_per_kv_token: kv_bytes_per_token(16, 8, 64, 2),
                max_model_len: 131_072,
                overhead_bytes: gib(0.8),
            },
            // Llama-3.2-3B-Instruct, bf16: 28 layers, 8 KV heads, head dim 128, tied embeddings; 3.21B parameters
            // (5.98 GiB of weights). Overhead as for the 1B.
            "llama-3.2-3b" | "meta-llama/llama-3.2-3b-instruct" => ModelSpec {
                name: "meta-llama/Llama-3.2-3B-Instruct".into(),
                params: 3.21e9,
                weights_bytes: gib(5.98),
                bytes_per_kv_token: kv_bytes_per_token(28, 8, 128, 2),
                max_model_len: 131_072,
                overhead_bytes: gib(1.0),
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
    pub const PRESETS: &'static [&'static str] = &[
        "a100-80gb",
        "a100-40gb",
        "h100-80gb",
        "h200",
        "l40s",
        "l4",
        "b200",
    ];

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
            // H200 SXM: 141 GB HBM3e at 4.8 TB/s, 989 TFLOPS dense bf16 (NVIDIA's H200 datasheet; the same SMs as
            // the H100 SXM); the lent H200 reported 143,771 MiB total (docs/performance.md, "Sleep mode on a GPU").
            "h200" | "h200-141gb" => GpuSpec {
                name: "h200".into(),
                memory_bytes: 143_771 << 20,
                hbm_bandwidth_bytes_per_s: 4.8e12,
                flops: 989e12,
            },
            // L40S: 48 GB GDDR6 at 864 GB/s, 362 TFLOPS dense bf16 (NVIDIA's L40S datasheet: 733 with sparsity);
            // nvidia-smi reports 46,068 MiB with ECC on.
            "l40s" => GpuSpec {
                name: "l40s".into(),
                memory_bytes: 46_068 << 20,
                hbm_bandwidth_bytes_per_s: 864e9,
                flops: 362e12,
            },
            // B200 (HGX): 180 GB HBM3e at 8 TB/s, 2.25 PFLOPS dense bf16 (NVIDIA's HGX B200 figures: 4.5 with
            // sparsity); the datasheet's 180 GB taken as what CUDA reports, not measured here.
            "b200" => GpuSpec {
                name: "b200".into(),
                memory_bytes: 180_000_000_000,
                hbm_bandwidth_bytes_per_s: 8.0e12,
                flops: 2.25e15,
            },
            _ => return Err(ModelError::UnknownGpuPreset(name.to_owned())),
        };
        Ok(spec)
    }
}

fn default_true() -> bool {
    true
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
    /// Fixed part of each step's host time (outside the GPU kernels: the engine loop, scheduling, sampling,
    /// launches), seconds. The host part grows with the model and the batch on top of it
    /// ([`crate::model::sharing::host_time_s`]) unless `host_scales_with_model` is off.
    pub step_overhead_s: f64,
    /// Whether the host part grows with the model's size and the batch (measured vLLM behaviour; on by
    /// default). Off, every step's host part is `step_overhead_s` (tests that want the bare roofline).
    #[serde(default = "default_true")]
    pub host_scales_with_model: bool,
    /// How a GPU share and busy co-tenants stretch a step (see [`crate::model::sharing`]).
    #[serde(default)]
    pub sharing: crate::model::SharingModel,
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
            step_overhead_s: crate::model::sharing::HOST_BASE_S,
            host_scales_with_model: true,
            sharing: crate::model::SharingModel::default(),
        }
    }

    pub(crate) fn validate(&self) -> Result<(), ModelError> {
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
