//! Plausibility bounds: every derived memory figure is checked against what a real model on a real GPU can have
//! before anything is recommended from it. A violation is a `not_yet` naming the figure, its source and the bound,
//! never a recommendation: a wrong bytes-per-token or non-KV figure mis-sizes every pod built from it.

use super::{MemoryMode, NotYetCode, Outcome, Source, gib, not_yet};

/// The fewest KV bytes a token can take: one layer, one KV head of dimension 8, in fp8, key and value.
pub const MIN_BYTES_PER_KV_TOKEN: u64 = 16;

/// The most KV bytes a token can take on one GPU: 16 MiB. The largest multi-head models (a GPT-3-sized 96 layers ×
/// 96 heads × 128 × 2 bytes × 2) need about 4.5 MiB; anything far above is a derivation error (an overridden block
/// count read as bytes, a wrong unit).
pub const MAX_BYTES_PER_KV_TOKEN: u64 = 16 * 1024 * 1024;

fn implausible(reason: String) -> Outcome {
    not_yet(NotYetCode::Implausible, reason)
}

/// Bytes per KV token within physical bounds, and the cache that runs now (at that figure) within the GPU.
pub(super) fn check_bytes_per_token(
    bpt: u64,
    source: Source,
    tokens_now: u64,
    total: u64,
    mode: MemoryMode,
) -> Result<(), Outcome> {
    if !(MIN_BYTES_PER_KV_TOKEN..=MAX_BYTES_PER_KV_TOKEN).contains(&bpt) {
        return Err(implausible(format!(
            "{bpt} bytes per KV token (from {source:?}, {mode:?} mode) is outside what any model can have \
             ({MIN_BYTES_PER_KV_TOKEN} B to {} MiB): pass --bytes-per-kv-token or --model-dir",
            MAX_BYTES_PER_KV_TOKEN >> 20
        )));
    }
    let kv_now = tokens_now.saturating_mul(bpt);
    if kv_now > total {
        return Err(implausible(format!(
            "the KV cache that runs now ({tokens_now} tokens × {bpt} bytes from {source:?} = {}) would not fit the \
             GPU's {}: the bytes per token or the GPU total is wrong; check --bytes-per-kv-token, \
             --tensor-parallel-size and --gpu-memory-mib",
            gib(kv_now),
            gib(total)
        )));
    }
    Ok(())
}

/// Non-KV memory between the model's weights and the GPU's total, and with the running cache within the GPU.
pub(super) fn check_non_kv(
    non_kv: u64,
    source: Source,
    weights: Option<u64>,
    kv_now: u64,
    total: u64,
) -> Result<(), Outcome> {
    if let Some(w) = weights {
        if w >= total {
            return Err(implausible(format!(
                "the model's weights ({}, from its safetensors files) are not less than the GPU's total ({}): check \
                 --tensor-parallel-size and --gpu-memory-mib",
                gib(w),
                gib(total)
            )));
        }
        if non_kv < w {
            return Err(implausible(format!(
                "non-KV memory {} (from {source:?}) is less than the model's weights alone ({}, from its \
                 safetensors files): check --non-kv-memory-mib, the GPU total, or the bytes per token",
                gib(non_kv),
                gib(w)
            )));
        }
    }
    if non_kv >= total {
        return Err(implausible(format!(
            "non-KV memory {} (from {source:?}) is not less than the GPU's total ({})",
            gib(non_kv),
            gib(total)
        )));
    }
    if kv_now.saturating_add(non_kv) > total {
        return Err(implausible(format!(
            "the KV cache that runs now ({}) plus non-KV memory {} (from {source:?}) exceed the GPU's total ({}): \
             one of them is wrong",
            gib(kv_now),
            gib(non_kv),
            gib(total)
        )));
    }
    Ok(())
}
