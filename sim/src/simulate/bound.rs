//! A lower bound on GPU-hours that no policy can beat, from the arrivals alone.
//!
//! Every request is in flight at least from its arrival for its *ideal* latency: its prefill at the whole
//! GPU's compute plus one weights read per output token at the whole GPU's bandwidth, with no queueing. While
//! any request of a model is in flight, that model's weights and start-up overhead must sit in some GPU's
//! memory, and so must each in-flight request's KV cache (prompt + output tokens). Its FLOPs (`2 × params` per
//! token) must be done at the whole GPU's achieved throughput, spread evenly over its ideal interval.
//!
//! At each instant the cluster then needs at least `max(Σ memory / usable memory per GPU, Σ compute rate)`
//! GPUs — the fluid relaxation of packing — rounded up, since GPUs are held whole (any placement holds an
//! integral number of GPUs at every instant), and the bound is that integrated over the run. Cold starts, idle replicas and scale-down delays are free, batching
//! is perfect, and a model's weights are counted once however many replicas serve it, so real policies sit
//! above it; the ratio to it says how much room is left, not that it is reachable.

use crate::model::EngineConfig;

use super::scenario::Scenario;

/// The bound in GPU-hours over `[0, duration)`.
pub fn lower_bound_gpu_hours(sc: &Scenario) -> f64 {
    let gpu = &sc.gpu;
    let cfg = EngineConfig::vllm_defaults(gpu);
    let bw = gpu.hbm_bandwidth_bytes_per_s * cfg.memory_efficiency;
    let flops = gpu.flops * cfg.compute_efficiency;
    let usable = (gpu.memory_bytes as f64 - sc.settings.gpu_headroom_mib as f64 * 1_048_576.0).max(1.0);
    // (time, model, +1/-1, KV bytes, compute rate in GPUs)
    let mut events: Vec<(f64, usize, i8, f64, f64)> = Vec::new();
    for (m, arrivals) in sc.arrivals.iter().enumerate() {
        let spec = &sc.models[m].spec;
        let per_token_decode = spec.weights_bytes as f64 / bw;
        for a in arrivals {
            if a.at >= sc.duration {
                continue;
            }
            let prompt = f64::from(a.prompt_tokens);
            let output = f64::from(a.output_tokens.max(1));
            let prefill = (2.0 * spec.params * prompt / flops).max(per_token_decode);
            let ideal = prefill + (output - 1.0) * per_token_decode;
            let work = 2.0 * spec.params * (prompt + output) / flops;
            let kv = (prompt + output) * spec.bytes_per_kv_token as f64;
            let rate = work / ideal;
            let end = (a.at + ideal).min(sc.duration);
            events.push((a.at, m, 1, kv, rate));
            events.push((end, m, -1, kv, rate));
        }
    }
    // Ends before starts at the same instant, so a zero-length gap never double counts.
    events.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.2.cmp(&y.2)));
    let fixed: Vec<f64> = sc
        .models
        .iter()
        .map(|m| (m.spec.weights_bytes + m.spec.overhead_bytes) as f64)
        .collect();
    let mut active = vec![0u64; sc.models.len()];
    let (mut memory, mut compute, mut last, mut gpu_seconds) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    for (t, m, delta, kv, rate) in events {
        if t > last {
            // GPUs are held whole: at any instant a cluster holds an integral number of them, at least the
            // fluid need rounded up (the tolerance keeps float noise from rounding 1.000…1 up to 2).
            let need = (memory / usable).max(compute).max(0.0);
            gpu_seconds += (need - 1e-9).ceil().max(0.0) * (t - last);
            last = t;
        }
        if delta > 0 {
            if active[m] == 0 {
                memory += fixed[m];
            }
            active[m] += 1;
            memory += kv;
            compute += rate;
        } else {
            active[m] = active[m].saturating_sub(1);
            if active[m] == 0 {
                memory -= fixed[m];
            }
            memory -= kv;
            compute -= rate;
        }
    }
    gpu_seconds / 3600.0
}
