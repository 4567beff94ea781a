//! Which way vLLM sized its KV cache, told apart by `vllm:cache_config_info`.
//!
//! The mode decides which derivations are true (see [`super::memory`]):
//! - **budget** (`gpu_memory_utilization` set, no override): vLLM profiled the model and gave the KV cache
//!   whatever `gpu_memory_utilization × total` leaves after the weights, the activation peak and the CUDA context.
//!   So `non_KV = util × total − KV` holds.
//! - **fixed KV** (`kv_cache_memory_bytes` set, vLLM ≥ 0.11, and the CPU backend from `VLLM_CPU_KVCACHE_SPACE`):
//!   the cache is that many bytes; `gpu_memory_utilization` is still on the page but sizes nothing, so the budget
//!   rule is false. `kv_cache_memory_bytes / (num_gpu_blocks × block_size)` is the bytes per token (vLLM divided
//!   exactly that).
//! - **overridden blocks** (`num_gpu_blocks_override` set, with or without either figure): vLLM allocated that
//!   many blocks whatever the budget or byte size said, so neither figure describes the cache.
//! - **unknown** (no label names any of them: an old or partial page): only configuration, the model's files
//!   and measurement are used.
//!
//! vLLM writes unset values as the string `"None"`; those, empty strings and anything that does not parse are
//! unknown, never zero.

use super::MemoryFacts;
use super::geometry::CacheDtype;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How vLLM sized this replica's KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryMode {
    /// `gpu_memory_utilization` sizes the cache.
    Budget,
    /// `kv_cache_memory_bytes` fixes the cache's size.
    FixedKv,
    /// `num_gpu_blocks_override` fixes the number of blocks.
    OverriddenBlocks,
    /// `cache_config_info` names none of the three.
    Unknown,
}

impl MemoryMode {
    /// The mode the facts show. The override wins over everything (vLLM applies it last, after sizing from bytes
    /// or budget); a KV byte size wins over the utilization (vLLM then skips the profile-based budget).
    pub fn of(mem: &MemoryFacts) -> MemoryMode {
        if mem.num_gpu_blocks_override.is_some() {
            MemoryMode::OverriddenBlocks
        } else if mem.kv_cache_memory_bytes.is_some() {
            MemoryMode::FixedKv
        } else if mem.gpu_memory_utilization.is_some() {
            MemoryMode::Budget
        } else {
            MemoryMode::Unknown
        }
    }

    /// One sentence for the status and the reasons: the mode, the labels that show it, and what it rules out.
    pub fn describe(self, mem: &MemoryFacts) -> String {
        let util = mem
            .gpu_memory_utilization
            .map_or_else(|| "not reported".to_string(), |u| format!("{u}"));
        match self {
            MemoryMode::Budget => format!(
                "budget mode: gpu_memory_utilization {util} sizes the KV cache (KV = {util} × total − non-KV)"
            ),
            MemoryMode::FixedKv => format!(
                "fixed-KV mode: kv_cache_memory_bytes = {} fixes the KV cache; gpu_memory_utilization ({util}) sizes \
                 nothing, so non-KV memory is not derived from it",
                mem.kv_cache_memory_bytes.unwrap_or(0)
            ),
            MemoryMode::OverriddenBlocks => format!(
                "overridden-blocks mode: num_gpu_blocks_override = {} fixes the block count; neither \
                 gpu_memory_utilization ({util}) nor kv_cache_memory_bytes describes the cache",
                mem.num_gpu_blocks_override.unwrap_or(0)
            ),
            MemoryMode::Unknown => "unknown mode: cache_config_info names neither gpu_memory_utilization, \
                kv_cache_memory_bytes nor num_gpu_blocks_override; only configuration, the model's files and \
                measurement are used"
                .to_string(),
        }
    }
}

/// A positive whole number, or unknown (`"None"`, empty, zero, not a number).
fn positive_u64(v: Option<&String>) -> Option<u64> {
    v?.trim().parse::<u64>().ok().filter(|n| *n > 0)
}

impl MemoryFacts {
    /// These facts with the memory labels of `vllm:cache_config_info` filled in: `gpu_memory_utilization`,
    /// `kv_cache_memory_bytes`, `num_gpu_blocks_override` and `cache_dtype`. A label that is absent, `"None"`
    /// or malformed leaves the field unknown.
    pub fn with_cache_config(mut self, labels: &BTreeMap<String, String>) -> MemoryFacts {
        self.gpu_memory_utilization = labels
            .get("gpu_memory_utilization")
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|u| u.is_finite() && *u > 0.0 && *u <= 1.0);
        self.kv_cache_memory_bytes = positive_u64(labels.get("kv_cache_memory_bytes"));
        self.num_gpu_blocks_override = positive_u64(labels.get("num_gpu_blocks_override"));
        self.cache_dtype = labels.get("cache_dtype").and_then(|v| CacheDtype::parse(v));
        self
    }
}
