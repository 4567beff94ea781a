//! The model's own geometry: KV bytes per token and weight bytes, from the files vLLM loads.
//!
//! vLLM sizes its KV cache in blocks of `block_size` tokens, each token holding, per attention layer, one key and
//! one value vector per KV head: `2 × layers × kv_heads × head_dim × dtype bytes`. Reading that from the model's
//! `config.json` gives the exact figure in every memory mode, where the figures vLLM publishes give it only in
//! some (see [`super::MemoryMode`]). This module is the pure half: it parses text the caller read (the sidecar's
//! `--model-dir`), and says plainly which models it cannot size, rather than guess:
//! - **standard attention** (Llama, Qwen2, Mistral, …): the formula above; with tensor parallelism each GPU holds
//!   `max(1, kv_heads / tp)` heads, as vLLM shards them.
//! - **one sliding window on every layer** (Mistral-7B-v0.1): the same bytes per cached token; the window only
//!   bounds how many tokens a request keeps, which the usage vLLM reports already shows.
//! - **MLA** (DeepSeek-V2/V3): one latent of `kv_lora_rank + qk_rope_head_dim` per layer and token, not two
//!   vectors per head, and not sharded by tensor parallelism.
//! - **hybrid layers** (sliding-window layers interleaved with full ones, as in Gemma-2/3; Mamba or linear
//!   attention layers beside attention): vLLM's hybrid allocator shares one block pool between layer groups, so a
//!   token's bytes depend on the sequence length. Not sized: the caller gets a reason naming
//!   `--bytes-per-kv-token`.
//!
//! The KV element width is vLLM's `cache_dtype` (`cache_config_info`): `fp8*` = 1 byte; `auto` = the dtype the
//! server runs (`--dtype`, which the caller passes when it is not `auto`), else 2 bytes, since vLLM's `auto`
//! runs float32 checkpoints in 16 bits. Weight bytes come from the safetensors headers (or the index's
//! `total_size`); they are a floor for non-KV memory, never an estimate of it.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A floating-point width as vLLM stores weights or KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dtype {
    /// 4 bytes.
    Float32,
    /// 2 bytes.
    Float16,
    /// 2 bytes.
    Bfloat16,
    /// 1 byte (`fp8`, `fp8_e4m3`, `fp8_e5m2`, `fp8_inc`).
    Fp8,
}

impl Dtype {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::Float32 => 4,
            Dtype::Float16 | Dtype::Bfloat16 => 2,
            Dtype::Fp8 => 1,
        }
    }

    /// Reads the names vLLM's `--dtype`, `cache_dtype` and transformers' `torch_dtype` use; `None` for `auto` or
    /// anything else.
    pub fn parse(s: &str) -> Option<Dtype> {
        match s.trim().to_ascii_lowercase().as_str() {
            "float32" | "float" | "fp32" | "torch.float32" => Some(Dtype::Float32),
            "float16" | "half" | "fp16" | "torch.float16" => Some(Dtype::Float16),
            "bfloat16" | "bf16" | "torch.bfloat16" => Some(Dtype::Bfloat16),
            "fp8" | "fp8_e4m3" | "fp8_e5m2" | "fp8_inc" => Some(Dtype::Fp8),
            _ => None,
        }
    }
}

/// vLLM's `cache_dtype` (from `cache_config_info`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheDtype {
    /// `auto`: the dtype the model runs in.
    Auto,
    /// An explicit width.
    Fixed(Dtype),
    /// A format this code does not size (nvfp4, int4/int8 per-head scales, fp8_ds_mla, …).
    Unsupported,
}

impl CacheDtype {
    /// Reads the label; `None` when it is absent or `"None"`.
    pub fn parse(s: &str) -> Option<CacheDtype> {
        let s = s.trim();
        if s.is_empty() || s.eq_ignore_ascii_case("none") {
            return None;
        }
        Some(if s.eq_ignore_ascii_case("auto") {
            CacheDtype::Auto
        } else if let Some(d) = Dtype::parse(s) {
            CacheDtype::Fixed(d)
        } else {
            CacheDtype::Unsupported
        })
    }
}

/// How the model's layers hold KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Attention {
    /// A key and a value vector per KV head per layer (full attention, or one sliding window on every layer).
    Standard {
        /// KV heads (`num_key_value_heads`; equal to the attention heads without GQA).
        kv_heads: u32,
        /// Per-head dimension (`head_dim`, else `hidden_size / num_attention_heads`).
        head_dim: u32,
        /// The sliding window, when every layer uses the same one.
        sliding_window: Option<u32>,
    },
    /// Multi-head latent attention: one latent per layer and token.
    Mla {
        /// `kv_lora_rank`.
        kv_lora_rank: u32,
        /// `qk_rope_head_dim`.
        qk_rope_head_dim: u32,
    },
    /// Layers whose bytes per token this code does not size (see the module docs).
    Hybrid {
        /// What kind of mix.
        mix: HybridMix,
    },
}

/// Which mix of layers makes a model [`Attention::Hybrid`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HybridMix {
    /// Sliding-window layers interleaved with full-attention ones (Gemma-2/3, Cohere2, Qwen2 with
    /// `max_window_layers`).
    SlidingAndFull,
    /// Mamba, linear-attention or other non-attention layers beside attention (Jamba, Nemotron-H, Qwen3-Next, …).
    StateSpace,
}

/// The model's geometry from its `config.json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelGeometry {
    /// Decoder layers (`num_hidden_layers`).
    pub layers: u32,
    /// How they hold KV cache.
    pub attention: Attention,
    /// The checkpoint's dtype (`torch_dtype`, or `dtype` in newer files), if it says.
    pub dtype: Option<Dtype>,
}

/// What the caller knows about the model besides vLLM's metrics: its geometry and weights, and the run flags
/// that change the bytes. Passed in [`super::MemoryFacts::model`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelFacts {
    /// From `config.json`.
    pub geometry: ModelGeometry,
    /// Weight bytes each GPU loads (safetensors, divided by the tensor-parallel size), if known.
    pub weights_bytes: Option<u64>,
    /// vLLM's `--dtype` when it is not `auto`.
    pub run_dtype: Option<Dtype>,
    /// vLLM's `--tensor-parallel-size` (1 when unset).
    pub tensor_parallel_size: u32,
}

/// A `config.json` (or safetensors header) that cannot be read as a model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GeometryError {
    /// Not JSON, or not an object.
    #[error("not a JSON object: {0}")]
    Json(String),
    /// A field every supported model has is missing or not a positive whole number.
    #[error("`{0}` is missing or not a positive whole number")]
    Missing(&'static str),
    /// Fields that contradict each other.
    #[error("{0}")]
    Inconsistent(String),
}

fn uint(obj: &Map<String, Value>, keys: &[&'static str]) -> Option<u32> {
    keys.iter()
        .find_map(|k| obj.get(*k).and_then(Value::as_u64))
        .filter(|v| *v > 0)
        .and_then(|v| u32::try_from(v).ok())
}

fn required(obj: &Map<String, Value>, keys: &[&'static str]) -> Result<u32, GeometryError> {
    uint(obj, keys).ok_or(GeometryError::Missing(keys[0]))
}

/// `model_type`s whose layers interleave sliding-window and full attention even where the file has no
/// `layer_types` list (older transformers wrote none).
const INTERLEAVED: &[&str] = &["gemma2", "gemma3", "gemma3_text", "cohere2", "gpt_oss"];

/// `model_type`s with Mamba, linear-attention or other non-attention layers.
const STATE_SPACE: &[&str] = &[
    "mamba",
    "mamba2",
    "jamba",
    "bamba",
    "nemotron_h",
    "falcon_h1",
    "zamba",
    "zamba2",
    "granitemoehybrid",
    "qwen3_next",
    "lfm2",
    "plamo2",
    "minimax",
    "minimax_text_01",
    "recurrent_gemma",
    "rwkv",
];

impl ModelGeometry {
    /// Parses a Hugging Face `config.json`. Multimodal files keep the language model under `text_config`; its
    /// fields win there.
    pub fn from_config_json(text: &str) -> Result<ModelGeometry, GeometryError> {
        let root: Value = serde_json::from_str(text).map_err(|e| GeometryError::Json(e.to_string()))?;
        let root = root
            .as_object()
            .ok_or_else(|| GeometryError::Json("the top level is not an object".into()))?;
        let obj = root.get("text_config").and_then(Value::as_object).unwrap_or(root);
        let str_of = |k: &str| {
            obj.get(k)
                .and_then(Value::as_str)
                .or_else(|| root.get(k).and_then(Value::as_str))
        };
        let model_type = str_of("model_type").unwrap_or("").to_ascii_lowercase();
        let dtype = str_of("torch_dtype")
            .or_else(|| str_of("dtype"))
            .and_then(Dtype::parse);
        let layers = required(obj, &["num_hidden_layers", "n_layer", "num_layers", "n_layers"])?;

        let hybrid = |mix| {
            Ok(ModelGeometry {
                layers,
                attention: Attention::Hybrid { mix },
                dtype,
            })
        };
        if STATE_SPACE.contains(&model_type.as_str())
            || [
                "layers_block_type",
                "hybrid_override_pattern",
                "attn_layer_indices",
            ]
            .iter()
            .any(|k| obj.contains_key(*k))
        {
            return hybrid(HybridMix::StateSpace);
        }
        let sliding = uint(obj, &["sliding_window"]);
        let mut uniform_window = None;
        if let Some(types) = obj.get("layer_types").and_then(Value::as_array) {
            let (mut full, mut window, mut other) = (0, 0, 0);
            for t in types {
                match t.as_str().unwrap_or("") {
                    "full_attention" | "attention" => full += 1,
                    "sliding_attention" | "sliding_window_attention" => window += 1,
                    _ => other += 1,
                }
            }
            if other > 0 {
                return hybrid(HybridMix::StateSpace);
            }
            if full > 0 && window > 0 {
                return hybrid(HybridMix::SlidingAndFull);
            }
            if window > 0 {
                uniform_window = sliding;
            }
        } else if INTERLEAVED.contains(&model_type.as_str()) {
            return hybrid(HybridMix::SlidingAndFull);
        } else if let Some(w) = sliding {
            // Qwen2-style files carry a `sliding_window` they do not use unless `use_sliding_window` is set, and
            // then only on the layers from `max_window_layers` on.
            match obj.get("use_sliding_window").and_then(Value::as_bool) {
                Some(false) => {}
                Some(true) => match uint(obj, &["max_window_layers"]) {
                    Some(m) if m < layers => return hybrid(HybridMix::SlidingAndFull),
                    _ => uniform_window = Some(w),
                },
                None => uniform_window = Some(w),
            }
        }

        if let Some(kv_lora_rank) = uint(obj, &["kv_lora_rank"]) {
            return Ok(ModelGeometry {
                layers,
                attention: Attention::Mla {
                    kv_lora_rank,
                    qk_rope_head_dim: uint(obj, &["qk_rope_head_dim"]).unwrap_or(64),
                },
                dtype,
            });
        }
        let heads = required(obj, &["num_attention_heads", "n_head", "num_heads"])?;
        let kv_heads = if obj.get("multi_query").and_then(Value::as_bool) == Some(true) {
            1
        } else if obj.get("multi_query_attention").and_then(Value::as_bool) == Some(true) {
            // ChatGLM: grouped KV heads under its own names.
            required(obj, &["multi_query_group_num"])?
        } else {
            uint(obj, &["num_key_value_heads", "num_kv_heads", "n_head_kv"]).unwrap_or(heads)
        };
        let head_dim = match uint(obj, &["head_dim", "kv_channels"]) {
            Some(d) => d,
            None => {
                let hidden = required(obj, &["hidden_size", "n_embd", "d_model"])?;
                if hidden % heads != 0 {
                    return Err(GeometryError::Inconsistent(format!(
                        "hidden_size {hidden} is not a multiple of num_attention_heads {heads}, and there is no head_dim"
                    )));
                }
                hidden / heads
            }
        };
        Ok(ModelGeometry {
            layers,
            attention: Attention::Standard {
                kv_heads,
                head_dim,
                sliding_window: uniform_window,
            },
            dtype,
        })
    }
}

/// Bytes per KV token from the geometry, with the arithmetic that gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvBytes {
    /// Bytes per token on one GPU.
    pub bytes_per_token: u64,
    /// `2 × 28 layers × 4 KV heads × 128 × 2 bytes (bfloat16)`, for the reasons.
    pub derivation: String,
}

impl ModelFacts {
    /// KV bytes per token on one GPU, for vLLM's `cache_dtype` (`None` = not reported: read as `auto`).
    /// `Err` says why the geometry cannot give it, naming the flag that can.
    pub fn kv_bytes_per_token(&self, cache_dtype: Option<CacheDtype>) -> Result<KvBytes, String> {
        let g = &self.geometry;
        let (elem, elem_name) = match cache_dtype.unwrap_or(CacheDtype::Auto) {
            CacheDtype::Fixed(d) => (d.bytes(), format!("{d:?} cache_dtype").to_lowercase()),
            CacheDtype::Auto => match self.run_dtype {
                Some(d) => (d.bytes(), format!("{d:?}, the server's --dtype").to_lowercase()),
                None => (
                    2,
                    "16-bit: cache_dtype auto, and vLLM runs every checkpoint in 16 bits unless --dtype says otherwise"
                        .to_string(),
                ),
            },
            CacheDtype::Unsupported => {
                return Err("vLLM's cache_dtype is a format Tessera does not size (it sizes auto, float16, bfloat16 \
                            and fp8): pass --bytes-per-kv-token"
                    .into());
            }
        };
        let tp = self.tensor_parallel_size.max(1);
        let layers = u64::from(g.layers);
        match g.attention {
            Attention::Standard {
                kv_heads, head_dim, ..
            } => {
                let per_gpu = (kv_heads / tp).max(1);
                let heads_note = if tp > 1 {
                    format!("{per_gpu} KV heads per GPU ({kv_heads} / tensor-parallel {tp})")
                } else {
                    format!("{kv_heads} KV heads")
                };
                Ok(KvBytes {
                    bytes_per_token: 2 * layers * u64::from(per_gpu) * u64::from(head_dim) * elem,
                    derivation: format!(
                        "2 × {layers} layers × {heads_note} × {head_dim} × {elem} bytes ({elem_name})"
                    ),
                })
            }
            Attention::Mla {
                kv_lora_rank,
                qk_rope_head_dim,
            } => {
                let latent = u64::from(kv_lora_rank) + u64::from(qk_rope_head_dim);
                Ok(KvBytes {
                    bytes_per_token: layers * latent * elem,
                    derivation: format!(
                        "MLA: {layers} layers × one latent of {kv_lora_rank} + {qk_rope_head_dim} × {elem} bytes \
                         ({elem_name})"
                    ),
                })
            }
            Attention::Hybrid { mix } => Err(match mix {
                HybridMix::SlidingAndFull => {
                    "the model interleaves sliding-window and full-attention layers, so \
                    its KV bytes per token depend on sequence length (vLLM's hybrid allocator): pass \
                    --bytes-per-kv-token"
                        .to_string()
                }
                HybridMix::StateSpace => {
                    "the model has Mamba or linear-attention layers beside attention, whose \
                    state is not a per-token KV cache: pass --bytes-per-kv-token"
                        .to_string()
                }
            }),
        }
    }
}

/// What a safetensors header says about the tensors in its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TensorBytes {
    /// Bytes of every tensor.
    pub total: u64,
    /// Bytes of the float32 tensors among them (vLLM's `auto` runs them in 16 bits).
    pub float32: u64,
}

impl TensorBytes {
    /// Adds another file's bytes.
    pub fn plus(self, other: TensorBytes) -> TensorBytes {
        TensorBytes {
            total: self.total.saturating_add(other.total),
            float32: self.float32.saturating_add(other.float32),
        }
    }

    /// Bytes the weights take once loaded: float32 tensors halve unless the server runs in float32.
    pub fn loaded(self, run_dtype: Option<Dtype>) -> u64 {
        if run_dtype == Some(Dtype::Float32) {
            self.total
        } else {
            self.total - self.float32 / 2
        }
    }
}

/// Reads a safetensors header (the JSON after the 8-byte length): the sum of every tensor's byte range.
pub fn safetensors_header_bytes(header: &str) -> Result<TensorBytes, GeometryError> {
    let v: Value = serde_json::from_str(header).map_err(|e| GeometryError::Json(e.to_string()))?;
    let obj = v
        .as_object()
        .ok_or_else(|| GeometryError::Json("the header is not an object".into()))?;
    let mut out = TensorBytes::default();
    for (name, t) in obj.iter().filter(|(k, _)| k.as_str() != "__metadata__") {
        let range = t
            .get("data_offsets")
            .and_then(Value::as_array)
            .and_then(|a| Some((a.first()?.as_u64()?, a.get(1)?.as_u64()?)));
        let Some((start, end)) = range.filter(|(s, e)| e >= s) else {
            return Err(GeometryError::Inconsistent(format!(
                "tensor `{name}` has no valid data_offsets"
            )));
        };
        out.total = out.total.saturating_add(end - start);
        if t.get("dtype").and_then(Value::as_str) == Some("F32") {
            out.float32 = out.float32.saturating_add(end - start);
        }
    }
    Ok(out)
}

/// Reads `model.safetensors.index.json`: `metadata.total_size`, the bytes of every shard's tensors. The index
/// names no dtypes, so a float32 checkpoint is recognised from `config.json` by the caller.
pub fn safetensors_index_bytes(index: &str) -> Result<u64, GeometryError> {
    let v: Value = serde_json::from_str(index).map_err(|e| GeometryError::Json(e.to_string()))?;
    v.pointer("/metadata/total_size")
        .and_then(|t| {
            t.as_u64()
                .or_else(|| t.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))
        })
        .filter(|t| *t > 0)
        .ok_or(GeometryError::Missing("metadata.total_size"))
}
