//! The memory and compute recommendation for one replica (issue 2, item 3).
//!
//! vLLM reserves `gpu_memory_utilization × total` GPU memory at start-up and fills whatever is left after the
//! weights, the activation peak and the CUDA context with KV cache, used or not. This module decides how much KV
//! cache a replica really needs, from a window of what it actually used, and turns that into the numbers a pod is
//! started with: `--kv-cache-memory-bytes`, `--gpu-memory-utilization`, the `tessera.dev/gpu-memory` MiB and the
//! `tessera.dev/gpu-compute-fraction`.
//!
//! [`recommend`] is a pure function: the caller passes the window ([`Observation`]s, with their times), the KV
//! geometry, what is known about memory, the previous recommendation and a [`Config`]; it returns either a
//! [`Recommendation`] whose every field carries a [`Reason`], or [`Outcome::NotYet`] with the reason why not. The
//! sidecar calls it after each scrape; the what-if simulator calls it per simulated replica.
//!
//! The rules, in the order they are applied to the KV size (in tokens, then bytes):
//! 1. Too little history (fewer than `min_samples` usable samples, or a window shorter than `min_window_secs`)
//!    → `NotYet`. Missing data never shrinks anything.
//! 2. Target = `max(percentile(usage) × (1 + headroom), max(usage))` of the current KV size: a high percentile
//!    plus headroom, and never less than the largest amount the window actually used.
//! 3. Pressure — any preemption in the window, or requests waiting while KV usage was at least
//!    `near_full_ratio` — means the cache was too small: the target becomes at least the current size plus
//!    headroom (grow), and never less than the previous recommendation (never shrink).
//! 4. At least one `max_model_len` sequence (vLLM refuses to start with less), and at least one block; when the
//!    replica count scales on KV utilization (`kv_target_utilization`, the policy's `targets.kvCacheUtilization`),
//!    that sequence *below* the target: `max_model_len / target` tokens. A smaller cache lets one request ask for
//!    another replica, whose weights cost many times the cache it relieves (measured: docs/simulator-experiments.md, "The KV
//!    floor below the replica count's target").
//! 5. Bounded step relative to the previous recommendation (or the current size when there is none): at most
//!    `max_step_up ×` up and `max_step_down_ratio` down per update. The floor of rule 2 still wins over the step
//!    bound, since recommending less than what was just used would cause preemptions by construction.
//! 6. Clamp to what fits: `non_kv + kv ≤ max_gpu_memory_utilization × total`. This is the only rule that can
//!    go below the observed peak (a GPU cannot hold more than it has), and the reason says so.
//!
//! The result is rounded *up* to whole KV blocks, MiB and hundredths of utilization, so rounding never shrinks it.
//!
//! **The compute share** ([`recommend_compute`]) is sized against latency, not GPU busy time: a decode step is
//! memory-bound, so a replica with one request in flight reads "busy" as much as one with fifty, and a busy-time
//! rule gives every steadily served model the whole GPU. Prefill and decode steps take about `1 / share` as long,
//! so the share scales like HPA's ratio rule on the latency objectives ([`ComputeFacts`]):
//! 1. With an objective (TTFT p95 and/or inter-token p95) and at least `min_latency_samples` observations:
//!    `share' = current × observed p95 / (latency_target_ratio × SLO)`, no change within `±latency_tolerance`,
//!    the largest over the objectives. Over the target → grow, never below what runs now or was recommended.
//! 2. Saturation at the current share (busy ≥ `saturation_busy_ratio` or preempting while requests waited, in
//!    at least `saturation_min_ratio` of the samples) → grow by `compute_max_step_up`, never shrink.
//! 3. Too few latency observations (idle, missing data) or no objective configured → keep the previous
//!    recommendation (or the current share; whole GPU when unknown). Missing data never shrinks the share.
//! 4. Bounded step per update from the previous recommendation (or the current share): at most
//!    `× compute_max_step_up` up and `compute_max_step_down_ratio` down; then `[min_compute_fraction, 1]`.
//! 5. When the pool's compute oversubscription is known (`compute_oversubscription`), never below the share the
//!    replica's GPU memory already pays for: `oversubscription × memory / GPU memory`, rounded down to
//!    hundredths. A GPU full on memory is then at most full on caps, so a smaller share packs nothing tighter;
//!    it would only slow the replica while its GPU is idle (measured: docs/simulator-experiments.md, "The share
//!    memory pays for").
//!
//! **Memory figures** (bytes per KV token, which convert tokens to bytes; non-KV memory: weights, activation peak
//! and CUDA context) come only from the derivations that are true in vLLM's memory mode, which `cache_config_info`
//! tells apart ([`MemoryMode`]: budget, fixed KV, overridden blocks, or unknown); the table is in `memory.rs`.
//! The model's own `config.json` ([`geometry`]) gives exact bytes per token in every mode; the budget rule
//! `non_KV = gpu_memory_utilization × total − KV` holds in budget mode only; `kv_cache_memory_bytes / tokens` in
//! fixed-KV mode only. Every figure passes plausibility bounds (`bounds.rs`) before use. Each source is reported
//! so an operator can check it; a missing one is a `not_yet` naming the flag or mount that supplies it.
//!
//! Where each decision is made:
//! - `mod.rs` (this file): the KV sizing rules above, in order, and the assembly of the [`Recommendation`];
//! - `mode.rs`: which memory mode vLLM runs in, from `cache_config_info` (`"None"` strings, missing labels);
//! - `memory.rs`: which source gives bytes per token and non-KV memory in that mode;
//! - `geometry.rs`: bytes per token and weight bytes from the model's files (standard, sliding-window, MLA,
//!   hybrid = not sized);
//! - `bounds.rs`: the plausibility bounds every derived figure must pass;
//! - `compute.rs`: the compute share, sized to the latency objective ([`crate::wire::sidecar::Objective`]: the
//!   body the controller hands a sidecar on an edit of `ttftSlo`, `ttftSloPercentile` or `itlSlo`);
//! - `types.rs`, `config.rs`, `outcome.rs`: the inputs, the tunables, the outputs and their reasons;
//! - `tests.rs` (sizing and compute rules), `tests_memory.rs` (modes, geometry on real configs, bounds).

mod bounds;
mod compute;
mod config;
pub mod geometry;
mod memory;
mod mode;
mod outcome;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_memory;
mod types;

pub use bounds::{MAX_BYTES_PER_KV_TOKEN, MIN_BYTES_PER_KV_TOKEN};
use compute::memory_paid_share;
pub use compute::{ComputeDecision, recommend_compute};
pub use config::{Config, ConfigError};
pub use geometry::{CacheDtype, Dtype, ModelFacts, ModelGeometry};
pub use mode::MemoryMode;
pub use outcome::*;
pub use types::*;

const MIB: u64 = 1024 * 1024;

/// Nearest-rank percentile of a non-empty, sorted slice.
fn percentile_sorted(sorted: &[f64], p: f64) -> f64 {
    let n = sorted.len();
    let rank = (p * n as f64).ceil() as usize;
    sorted[rank.clamp(1, n) - 1]
}

/// Increase of a cumulative counter over the window, treating a decrease as a restart from zero.
fn counter_increase(values: impl Iterator<Item = f64>) -> f64 {
    let mut prev: Option<f64> = None;
    let mut total = 0.0;
    for v in values.filter(|v| v.is_finite() && *v >= 0.0) {
        if let Some(p) = prev {
            total += if v >= p { v - p } else { v };
        }
        prev = Some(v);
    }
    total
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1024.0 * MIB as f64))
}

/// Computes this replica's recommendation from a window of observations. Pure: same input, same answer.
pub fn recommend(input: &Input<'_>, config: &Config) -> Outcome {
    if let Err(e) = config.validate() {
        return not_yet(NotYetCode::InvalidConfig, e.to_string());
    }
    let geometry = input.geometry;
    if geometry.num_gpu_blocks == 0 || geometry.block_size == 0 {
        return not_yet(
            NotYetCode::UnknownKvGeometry,
            "num_gpu_blocks or block_size is unknown: vLLM has not published vllm:cache_config_info yet",
        );
    }

    // Rule 1: enough usable history.
    let (window, mut usage) = match usable_window(input.window, config) {
        Ok(w) => w,
        Err(o) => return o,
    };
    // The memory mode decides which derivations are true (`mode`, `memory`); every figure is bounded (`bounds`).
    let mode = MemoryMode::of(&input.memory);
    let total = match memory::total(&input.memory) {
        Ok(t) => t,
        Err(o) => return o,
    };
    let bpt = match memory::bytes_per_token(&geometry, &input.memory, mode, total) {
        Ok(b) => b,
        Err(o) => return o,
    };

    let tokens_now = geometry.tokens();
    let block_bytes = geometry.block_size.saturating_mul(bpt.value);
    let mut reasons = Vec::new();

    // Rule 2: percentile + headroom, never below the peak.
    let (mut target, peak_tokens) = usage_target(&mut usage, tokens_now, config, &mut reasons);

    // Rule 3: pressure means grow, never shrink.
    let prev_tokens = input.previous.map(|r| r.kv_cache_tokens);
    let pressure_floor = pressure_floor(&window, tokens_now, prev_tokens, config, &mut reasons);
    let pressure = pressure_floor.is_some();
    if let Some(floor) = pressure_floor {
        target = target.max(floor);
    }

    // Rule 4: one max-length sequence, one block; below the replica count's KV target when it has one.
    let (min_tokens, why) = minimum_tokens(geometry, config.kv_target_utilization);
    if target < min_tokens {
        target = min_tokens;
        reasons.push(kv_reason(
            ReasonCode::MinimumSequence,
            format!("raised to {min_tokens} tokens: {why}"),
        ));
    }

    // Rule 5: bounded step from the previous recommendation (or what runs now). Under pressure the reference
    // is at least what runs now, so a stale small recommendation cannot hold a preempting replica back.
    let reference = match prev_tokens {
        Some(prev) if pressure => prev.max(tokens_now),
        Some(prev) => prev,
        None => tokens_now,
    }
    .max(1);
    // The step bound may not cap below what was used, below one sequence, or (under pressure) below what runs.
    let hard_floor = peak_tokens
        .max(min_tokens)
        .max(if pressure { tokens_now } else { 0 });
    target = step_bounded(target, reference, hard_floor, config, &mut reasons);

    // Round up to whole blocks; then rule 6: clamp to what fits, which needs the non-KV memory. Without it the
    // KV size is still known (what `--kv-cache-memory-bytes` takes), and the reason says so.
    let blocks = target.div_ceil(geometry.block_size);
    let (non_kv, non_kv_source) =
        match memory::non_kv(tokens_now.saturating_mul(bpt.value), &input.memory, mode, total) {
            Ok(n) => n,
            Err(Outcome::NotYet { code, reason }) if code == NotYetCode::UnknownNonKvMemory => {
                return only_kv_known(code, &reason, blocks, geometry.block_size, block_bytes, &bpt);
            }
            Err(o) => return o,
        };
    let gpu = Gpu {
        total,
        non_kv,
        non_kv_source,
    };
    let kv_bytes = match clamp_to_gpu(
        blocks,
        geometry.block_size,
        block_bytes,
        peak_tokens,
        &gpu,
        config,
        &mut reasons,
    ) {
        Ok(b) => b,
        Err(o) => return o,
    };
    let kv_tokens = kv_bytes / bpt.value.max(1);

    // GPU memory: non-KV plus KV, rounded up (MiB; hundredths of utilization), still within the cap.
    let need = non_kv.saturating_add(kv_bytes);
    let gpu_memory_mib = need.div_ceil(MIB);
    let util_exact = need as f64 / total as f64;
    let gpu_memory_utilization = ((util_exact * 100.0).ceil() / 100.0)
        .min(config.max_gpu_memory_utilization)
        .max(util_exact);
    reasons.push(Reason {
        field: Field::GpuMemory,
        code: ReasonCode::KvPlusNonKv,
        message: format!(
            "{} KV + {} non-KV ({:?}) = {gpu_memory_mib} MiB = {:.1}% of {} (bytes/token {} from {:?}: {}; {:?} \
             mode)",
            gib(kv_bytes),
            gib(non_kv),
            non_kv_source,
            util_exact * 100.0,
            gib(total),
            bpt.value,
            bpt.source,
            bpt.derivation,
            mode
        ),
    });

    // Compute: the latency/saturation rule (see `recommend_compute`).
    let previous_share = input.previous.map(|r| r.compute_fraction);
    let compute = recommend_compute(&window, &input.compute, previous_share, config);
    reasons.extend(compute.reasons);
    let compute_fraction = memory_paid_share(compute.share, need, total, config, &mut reasons);

    Outcome::Ready(Recommendation {
        kv_cache_memory_bytes: kv_bytes,
        kv_cache_tokens: kv_tokens,
        gpu_memory_utilization,
        gpu_memory_mib,
        compute_fraction,
        bytes_per_kv_token: bpt.value,
        bytes_per_kv_token_source: bpt.source,
        non_kv_bytes: non_kv,
        non_kv_source,
        reasons,
    })
}

fn kv_reason(code: ReasonCode, message: String) -> Reason {
    Reason {
        field: Field::KvCacheMemory,
        code,
        message,
    }
}

/// Rule 1: the window's timed observations, oldest first, and its usable KV usage samples (clamped to 0–1); or
/// why there is too little history to size anything.
fn usable_window(window: &[Observation], config: &Config) -> Result<(Vec<Observation>, Vec<f64>), Outcome> {
    let mut window: Vec<Observation> = window.iter().filter(|o| o.at_secs.is_finite()).copied().collect();
    window.sort_by(|a, b| a.at_secs.total_cmp(&b.at_secs));
    let usage: Vec<f64> = window
        .iter()
        .filter_map(|o| o.kv_usage)
        .filter(|u| u.is_finite())
        .map(|u| u.clamp(0.0, 1.0))
        .collect();
    if usage.len() < config.min_samples {
        return Err(not_yet(
            NotYetCode::TooFewSamples,
            format!(
                "{} KV usage samples in the window, {} needed",
                usage.len(),
                config.min_samples
            ),
        ));
    }
    let span = match (window.first(), window.last()) {
        (Some(a), Some(b)) => b.at_secs - a.at_secs,
        _ => 0.0,
    };
    if span < config.min_window_secs {
        return Err(not_yet(
            NotYetCode::WindowTooShort,
            format!(
                "the window spans {span:.0} s, {:.0} s needed",
                config.min_window_secs
            ),
        ));
    }
    Ok((window, usage))
}

/// Rule 2: the target in tokens (percentile + headroom, or the peak when that is more) and the peak itself,
/// which later rules may not go below. Sorts `usage`.
fn usage_target(
    usage: &mut [f64],
    tokens_now: u64,
    config: &Config,
    reasons: &mut Vec<Reason>,
) -> (u64, u64) {
    usage.sort_by(f64::total_cmp);
    let p = percentile_sorted(usage, config.percentile);
    let peak = usage.last().copied().unwrap_or(0.0);
    let peak_tokens = (peak * tokens_now as f64).ceil() as u64;
    let pct_tokens = (p * (1.0 + config.headroom) * tokens_now as f64).ceil() as u64;
    let target = if pct_tokens >= peak_tokens {
        reasons.push(kv_reason(
            ReasonCode::Percentile,
            format!(
                "p{:.0} KV usage {:.1}% of {tokens_now} tokens + {:.0}% headroom = {pct_tokens} tokens",
                config.percentile * 100.0,
                p * 100.0,
                config.headroom * 100.0
            ),
        ));
        pct_tokens
    } else {
        reasons.push(kv_reason(
            ReasonCode::ObservedPeak,
            format!(
                "peak KV usage {:.1}% of {tokens_now} tokens = {peak_tokens} tokens exceeds p{:.0} + headroom",
                peak * 100.0,
                config.percentile * 100.0
            ),
        ));
        peak_tokens
    };
    (target, peak_tokens)
}

/// Rule 3: under pressure (preemptions, or requests waiting at a nearly full cache) the floor the target may not
/// go below: what runs now plus headroom, and never less than the previous recommendation. `None` without
/// pressure.
fn pressure_floor(
    window: &[Observation],
    tokens_now: u64,
    prev_tokens: Option<u64>,
    config: &Config,
    reasons: &mut Vec<Reason>,
) -> Option<u64> {
    let preemptions = counter_increase(window.iter().filter_map(|o| o.preemptions_total));
    let waited_full = window.iter().any(|o| {
        matches!((o.kv_usage, o.requests_waiting), (Some(u), Some(w)) if u >= config.near_full_ratio && w > 0.0)
    });
    if !(preemptions > 0.0 || waited_full) {
        return None;
    }
    let grown = ((tokens_now as f64) * (1.0 + config.headroom)).ceil() as u64;
    let floor = grown.max(prev_tokens.unwrap_or(0));
    let (code, why) = if preemptions > 0.0 {
        (
            ReasonCode::Preemptions,
            format!("{preemptions:.0} preemption(s) in the window"),
        )
    } else {
        (
            ReasonCode::WaitingAtFullKv,
            format!(
                "requests waited while KV usage was ≥ {:.0}%",
                config.near_full_ratio * 100.0
            ),
        )
    };
    reasons.push(kv_reason(
        code,
        format!("{why}: grow to at least {floor} tokens (current {tokens_now} + headroom, never shrink)"),
    ));
    Some(floor)
}

/// Rule 5: `target` within one step of `reference` (at most `× max_step_up` up, `max_step_down_ratio` down),
/// except that growth is never capped below `hard_floor`.
fn step_bounded(
    target: u64,
    reference: u64,
    hard_floor: u64,
    config: &Config,
    reasons: &mut Vec<Reason>,
) -> u64 {
    let step_max = ((reference as f64) * config.max_step_up).floor() as u64;
    let step_min = ((reference as f64) * (1.0 - config.max_step_down_ratio)).ceil() as u64;
    let cap = step_max.max(hard_floor);
    if target > cap {
        reasons.push(kv_reason(
            ReasonCode::StepLimitedUp,
            format!(
                "growth capped at ×{} per update: {target} → {cap} tokens (from {reference})",
                config.max_step_up
            ),
        ));
        cap
    } else if target < step_min {
        reasons.push(kv_reason(
            ReasonCode::StepLimitedDown,
            format!(
                "shrink limited to {:.0}% per update: {target} → {step_min} tokens (from {reference})",
                config.max_step_down_ratio * 100.0
            ),
        ));
        step_min
    } else {
        target
    }
}

/// The `not_yet` for unknown non-KV memory, extended with the KV size that is known without it.
fn only_kv_known(
    code: NotYetCode,
    reason: &str,
    blocks: u64,
    block_size: u64,
    block_bytes: u64,
    bpt: &memory::BytesPerToken,
) -> Outcome {
    not_yet(
        code,
        format!(
            "{reason}. Until then only the KV cache is known: {} bytes ({} tokens at {} bytes each from {:?}) \
             for --kv-cache-memory-bytes, not clamped to the GPU",
            blocks.saturating_mul(block_bytes),
            blocks.saturating_mul(block_size),
            bpt.value,
            bpt.source
        ),
    )
}

/// The GPU memory the KV cache shares: the GPU's total and what the non-KV memory already takes of it.
struct Gpu {
    total: u64,
    non_kv: u64,
    non_kv_source: Source,
}

/// Rule 6: the KV bytes of `blocks`, clamped to what fits beside the non-KV memory within
/// `max_gpu_memory_utilization`; `not_yet` when not one block fits.
fn clamp_to_gpu(
    blocks: u64,
    block_size: u64,
    block_bytes: u64,
    peak_tokens: u64,
    gpu: &Gpu,
    config: &Config,
    reasons: &mut Vec<Reason>,
) -> Result<u64, Outcome> {
    let cap_total = (config.max_gpu_memory_utilization * gpu.total as f64).floor() as u64;
    let cap_kv = cap_total.saturating_sub(gpu.non_kv);
    let cap_kv_blocks = cap_kv / block_bytes.max(1);
    if cap_kv_blocks == 0 {
        // Not one block fits beside the non-KV memory: a KV size of zero is no recommendation (vLLM refuses it).
        return Err(not_yet(
            NotYetCode::InconsistentInputs,
            format!(
                "non-KV memory {} ({:?}) leaves no room for one KV block within {:.0}% of the GPU's {}: \
                 this model needs a larger GPU (or check --non-kv-memory-mib and --max-gpu-memory-utilization)",
                gib(gpu.non_kv),
                gpu.non_kv_source,
                config.max_gpu_memory_utilization * 100.0,
                gib(gpu.total)
            ),
        ));
    }
    if blocks <= cap_kv_blocks {
        return Ok(blocks.saturating_mul(block_bytes));
    }
    let kv_bytes = cap_kv_blocks.saturating_mul(block_bytes);
    let below_peak = cap_kv_blocks.saturating_mul(block_size) < peak_tokens;
    reasons.push(kv_reason(
        ReasonCode::ClampedToGpu,
        format!(
            "clamped to {} of KV: {:.0}% of {} minus {} non-KV memory is all that fits{}",
            gib(kv_bytes),
            config.max_gpu_memory_utilization * 100.0,
            gib(gpu.total),
            gib(gpu.non_kv),
            if below_peak {
                " (below the observed peak: this model needs a larger GPU)"
            } else {
                ""
            }
        ),
    ));
    Ok(kv_bytes)
}

/// Rule 4's floor, in tokens, and why: vLLM refuses to start a cache that cannot hold one `max_model_len`
/// sequence; when the replica count scales on KV utilization (`kv_target`), the cache holds that sequence below the
/// target, so one request alone never asks for another replica (which would load the weights again to relieve a
/// cache a fraction of their size). An out-of-range target is ignored (the config's validation names it).
fn minimum_tokens(geometry: KvGeometry, kv_target: Option<f64>) -> (u64, String) {
    let sequence = geometry.max_model_len.unwrap_or(0);
    let block = geometry.block_size;
    match kv_target.filter(|u| u.is_finite() && *u > 0.0 && *u < 1.0) {
        Some(u) if sequence > 0 => {
            let below = (sequence as f64 / u).ceil() as u64;
            (
                below.max(block),
                format!(
                    "the cache must hold one max_model_len sequence ({sequence} tokens) below the replica count's \
                     KV target ({:.0}%), so one request alone never adds a replica",
                    u * 100.0
                ),
            )
        }
        _ => (
            sequence.max(block),
            "the cache must hold one max_model_len sequence".to_owned(),
        ),
    }
}
