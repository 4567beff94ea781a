//! Which figures are known about memory, and where each came from.

use super::*;

/// The resolved memory inputs.
pub(super) struct Resolved {
    pub total: u64,
    pub bytes_per_token: u64,
    pub bpt_source: Source,
    pub non_kv: u64,
    pub non_kv_source: Source,
}

pub(super) fn resolve_memory(geometry: &KvGeometry, mem: &MemoryFacts) -> Result<Resolved, Outcome> {
    let tokens = geometry.tokens();
    let total = match mem.gpu_total_bytes {
        Some(t) if t > 0 => t,
        _ => {
            return Err(not_yet(
                NotYetCode::UnknownGpuMemory,
                "the GPU's total memory is unknown: NVML is not available; pass --gpu-memory-mib",
            ));
        }
    };
    let kv_from_config = mem.kv_cache_memory_bytes.filter(|b| *b > 0);
    let (bytes_per_token, bpt_source) = if let Some(b) = mem.bytes_per_kv_token.filter(|b| *b > 0) {
        (b, Source::Configured)
    } else if let Some(kv) = kv_from_config.filter(|kv| *kv >= tokens) {
        (kv / tokens, Source::CacheConfigKvBytes)
    } else if let (Some(used), Some(non_kv)) = (mem.process_gpu_bytes, mem.non_kv_bytes) {
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
        (kv / tokens, Source::MeasuredProcessMemory)
    } else {
        return Err(not_yet(
            NotYetCode::UnknownBytesPerKvToken,
            "bytes per KV token are unknown: pass --bytes-per-kv-token (2 × layers × kv_heads × head_dim × dtype \
             bytes), or start vLLM with --kv-cache-memory-bytes, or give --non-kv-memory-mib with NVML present",
        ));
    };
    let kv_now = tokens.saturating_mul(bytes_per_token);
    let (non_kv, non_kv_source) = if let Some(n) = mem.non_kv_bytes {
        (n, Source::Configured)
    } else if let Some(used) = mem.process_gpu_bytes.filter(|u| *u > kv_now) {
        (used - kv_now, Source::MeasuredProcessMemory)
    } else if let Some(util) = mem
        .gpu_memory_utilization
        .filter(|u| u.is_finite() && *u > 0.0 && *u <= 1.0)
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
        (budget - kv_now, Source::VllmBudgetRule)
    } else {
        return Err(not_yet(
            NotYetCode::UnknownNonKvMemory,
            "non-KV memory (weights + activations + CUDA context) is unknown: pass --non-kv-memory-mib, or run \
             with NVML, or let vLLM report gpu_memory_utilization in cache_config_info",
        ));
    };
    if non_kv >= total {
        return Err(not_yet(
            NotYetCode::InconsistentInputs,
            format!(
                "non-KV memory ({}) is not less than the GPU's total ({})",
                gib(non_kv),
                gib(total)
            ),
        ));
    }
    Ok(Resolved {
        total,
        bytes_per_token,
        bpt_source,
        non_kv,
        non_kv_source,
    })
}
