//! Which memory figures are known, and from which source, in the mode at hand ([`MemoryMode`]).
//!
//! | figure | budget | fixed KV | overridden blocks | unknown |
//! |---|---|---|---|---|
//! | bytes per KV token | configured; model geometry; measured | configured; model geometry; `kv_cache_memory_bytes / tokens`; measured | configured; model geometry; measured | configured; model geometry; measured |
//! | non-KV memory | configured; measured; `util × total − KV` | configured; measured | configured; measured | configured; measured |
//!
//! Sources are tried in that order (configuration wins; then the model's own files; then what vLLM published;
//! then measurement), and every figure passes [`super::bounds`] before it is used. Where no true source exists
//! the answer is `not_yet` with a reason that names the missing fact and the flag or mount that supplies it.

use super::bounds::{check_bytes_per_token, check_non_kv};
use super::*;

/// Bytes per KV token, where it came from, and how.
pub(super) struct BytesPerToken {
    pub value: u64,
    pub source: Source,
    pub derivation: String,
}

/// The GPU's total memory.
pub(super) fn total(mem: &MemoryFacts) -> Result<u64, Outcome> {
    match mem.gpu_total_bytes {
        Some(t) if t > 0 => Ok(t),
        _ => Err(not_yet(
            NotYetCode::UnknownGpuMemory,
            "the GPU's total memory is unknown: NVML is not available; pass --gpu-memory-mib",
        )),
    }
}

/// Bytes per KV token from the first true source in `mode`, within bounds.
pub(super) fn bytes_per_token(
    geometry: &KvGeometry,
    mem: &MemoryFacts,
    mode: MemoryMode,
    total: u64,
) -> Result<BytesPerToken, Outcome> {
    let tokens = geometry.tokens();
    let found = find_bytes_per_token(tokens, mem, mode)?;
    check_bytes_per_token(found.value, found.source, tokens, total, mode)?;
    // In fixed-KV mode vLLM fitted whole blocks into the bytes it was given, so a figure from elsewhere that needs
    // more than those bytes for the blocks it made is wrong (a missing --tensor-parallel-size, a wrong dtype).
    if let (MemoryMode::FixedKv, Some(kv)) = (mode, mem.kv_cache_memory_bytes)
        && found.source != Source::CacheConfigKvBytes
        && (tokens.saturating_mul(found.value) as f64) > kv as f64 * 1.02
    {
        return Err(not_yet(
            NotYetCode::InconsistentInputs,
            format!(
                "{}: vLLM fitted {tokens} tokens into kv_cache_memory_bytes = {kv}, but {} bytes per token \
                 (from {:?}: {}) would need {}; check --bytes-per-kv-token, --tensor-parallel-size and \
                 --model-dtype",
                mode.describe(mem),
                found.value,
                found.source,
                found.derivation,
                gib(tokens.saturating_mul(found.value))
            ),
        ));
    }
    Ok(found)
}

fn find_bytes_per_token(tokens: u64, mem: &MemoryFacts, mode: MemoryMode) -> Result<BytesPerToken, Outcome> {
    if let Some(b) = mem.bytes_per_kv_token.filter(|b| *b > 0) {
        return Ok(BytesPerToken {
            value: b,
            source: Source::Configured,
            derivation: "--bytes-per-kv-token".into(),
        });
    }
    let mut model_why = None;
    if let Some(model) = &mem.model {
        match model.kv_bytes_per_token(mem.cache_dtype) {
            Ok(k) => {
                return Ok(BytesPerToken {
                    value: k.bytes_per_token,
                    source: Source::ModelConfig,
                    derivation: k.derivation,
                });
            }
            Err(why) => model_why = Some(why),
        }
    }
    if mode == MemoryMode::FixedKv
        && let Some(kv) = mem.kv_cache_memory_bytes.filter(|kv| *kv >= tokens)
    {
        return Ok(BytesPerToken {
            value: kv / tokens,
            source: Source::CacheConfigKvBytes,
            derivation: format!("kv_cache_memory_bytes {kv} / {tokens} tokens"),
        });
    }
    if let (Some(used), Some(non_kv)) = (mem.process_gpu_bytes, mem.non_kv_bytes) {
        let kv = used.saturating_sub(non_kv);
        if kv < tokens {
            return Err(not_yet(
                NotYetCode::InconsistentInputs,
                format!(
                    "measured process GPU memory ({}) minus configured non-KV memory ({}) leaves no room for \
                     {tokens} KV tokens: check --non-kv-memory-mib, or pass --bytes-per-kv-token",
                    gib(used),
                    gib(non_kv)
                ),
            ));
        }
        return Ok(BytesPerToken {
            value: kv / tokens,
            source: Source::MeasuredProcessMemory,
            derivation: format!(
                "(process {} − non-KV {}) / {tokens} tokens",
                gib(used),
                gib(non_kv)
            ),
        });
    }
    let mode_note = match mode {
        MemoryMode::OverriddenBlocks => {
            " (num_gpu_blocks_override is set, so kv_cache_memory_bytes / blocks is not bytes per token)"
        }
        MemoryMode::Budget | MemoryMode::Unknown => {
            " (vLLM publishes no KV byte size in this mode; starting it with --kv-cache-memory-bytes would)"
        }
        MemoryMode::FixedKv => "",
    };
    let model_note = model_why
        .map(|why| format!("; the model's config.json cannot give it: {why}"))
        .unwrap_or_default();
    Err(not_yet(
        NotYetCode::UnknownBytesPerKvToken,
        format!(
            "bytes per KV token are unknown{mode_note}: pass --bytes-per-kv-token (2 × layers × kv_heads × head_dim \
             × dtype bytes), or --model-dir with the model's config.json (the webhook mounts the model volume), or \
             --non-kv-memory-mib with NVML on a dedicated GPU{model_note}"
        ),
    ))
}

/// Non-KV memory from the first true source in `mode`, within bounds.
pub(super) fn non_kv(
    kv_now: u64,
    mem: &MemoryFacts,
    mode: MemoryMode,
    total: u64,
) -> Result<(u64, Source), Outcome> {
    let (non_kv, source) = find_non_kv(kv_now, mem, mode, total)?;
    let weights = mem.model.and_then(|m| m.weights_bytes);
    check_non_kv(non_kv, source, weights, kv_now, total)?;
    Ok((non_kv, source))
}

fn find_non_kv(
    kv_now: u64,
    mem: &MemoryFacts,
    mode: MemoryMode,
    total: u64,
) -> Result<(u64, Source), Outcome> {
    if let Some(n) = mem.non_kv_bytes {
        return Ok((n, Source::Configured));
    }
    if let Some(used) = mem.process_gpu_bytes.filter(|u| *u > kv_now) {
        return Ok((used - kv_now, Source::MeasuredProcessMemory));
    }
    if mode == MemoryMode::Budget
        && let Some(util) = mem.gpu_memory_utilization
    {
        let budget = (util * total as f64) as u64;
        if budget <= kv_now {
            return Err(not_yet(
                NotYetCode::InconsistentInputs,
                format!(
                    "gpu_memory_utilization {util} × {} = {} is not more than the KV cache ({}): the GPU total \
                     or bytes per KV token is wrong; pass --non-kv-memory-mib",
                    gib(total),
                    gib(budget),
                    gib(kv_now)
                ),
            ));
        }
        return Ok((budget - kv_now, Source::VllmBudgetRule));
    }
    let floor = mem
        .model
        .and_then(|m| m.weights_bytes)
        .map(|w| format!(" (at least the weights, {})", gib(w)))
        .unwrap_or_default();
    Err(not_yet(
        NotYetCode::UnknownNonKvMemory,
        format!(
            "{}. Non-KV memory (weights + activation peak + CUDA context){floor} is unknown: pass \
             --non-kv-memory-mib, or run the sidecar with NVML on a dedicated GPU (not --gpu-shared)",
            mode.describe(mem)
        ),
    ))
}
