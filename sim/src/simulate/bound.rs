//! Lower bounds on GPU-hours that no policy can beat, from the arrivals alone.
//!
//! Every request is in flight at least from its arrival for its *ideal* latency: its prefill at the whole
//! GPU's compute plus one weights read per output token at the whole GPU's bandwidth, with no queueing. While
//! any request of a model is in flight, that model's weights and start-up overhead must sit in some GPU's
//! memory, and so must a KV cache holding every in-flight request (prompt + output tokens) and never smaller
//! than one request of `max_model_len` tokens: vLLM refuses to start an engine whose cache cannot hold one
//! (the simulator's engine too, [`crate::model::ModelError::MaxModelLenTooLarge`]), so each replica reserves at
//! least that, and however many replicas serve the model their caches add up to at least
//! `max(max_model_len tokens, in-flight tokens)`. Its FLOPs (`2 × params` per token) must be done at the whole
//! GPU's achieved throughput, spread evenly over its ideal interval.
//!
//! At each instant the cluster then needs at least `max(Σ memory / usable memory per GPU, Σ compute rate)`
//! GPUs — the fluid relaxation of packing — rounded up, since GPUs are held whole (any placement holds an
//! integral number of GPUs at every instant), and the bound is that integrated over the run. Batching is
//! perfect and a model's weights are counted once however many replicas serve it, so real policies sit above
//! it; the ratio to it says how much room is left, not that it is reachable.
//!
//! Two variants, reported side by side:
//! - [`lower_bound_gpu_hours`]: cold starts are free (weights appear in memory the instant a request arrives).
//!   It holds for any policy, whatever its attainment.
//! - [`lower_bound_with_cold_starts_gpu_hours`]: a request meets its TTFT objective only if its model's weights
//!   were resident since `arrival − (cold start − objective)` (a clairvoyant policy that starts each replica
//!   exactly in time). It holds for any policy meeting the objective for *every* request, and shows what the
//!   cold starts alone cost; a policy may sit below it by letting some requests miss.
//! - [`lower_bound_at_attainment_gpu_hours`]: the cold-start bound for a policy that may let a share of requests
//!   miss (the run's attainment goal, 99%). Such a policy meets the objective for all but `k` requests, so it
//!   holds at least the cold-start bound of the others. Taking one request out lowers that bound by at most its
//!   own interval (`lead` before its arrival to its ideal end) times the GPUs its weights, KV cache (at least
//!   the `max_model_len` minimum, which it may be the only one holding) and compute rate round up to (one for
//!   every model here): at each instant of it the need falls by at most those, and a
//!   whole-GPU rounding by at most their ceiling. So the bound is the cold-start bound less the `k` largest such
//!   products (and never below the first bound, which holds whatever the attainment).

use crate::model::EngineConfig;

use super::scenario::Scenario;

/// The bound in GPU-hours over `[0, duration)`, cold starts free.
pub fn lower_bound_gpu_hours(sc: &Scenario) -> f64 {
    bound(sc, |_| 0.0)
}

/// The bound in GPU-hours over `[0, duration)` for a policy that meets every TTFT objective through its
/// cold starts: each model's weights are resident from `cold start − objective` before each arrival.
pub fn lower_bound_with_cold_starts_gpu_hours(sc: &Scenario) -> f64 {
    bound(sc, |m| cold_start_lead(sc, m))
}

/// The bound in GPU-hours for a policy that meets the TTFT objective for at least `attainment` of the requests
/// (0–1) through its cold starts (see the module docs for why it holds).
pub fn lower_bound_at_attainment_gpu_hours(sc: &Scenario, attainment: f64) -> f64 {
    lower_bounds(sc, attainment).at_attainment
}

/// The three bounds of a run, each walk done once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    /// [`lower_bound_gpu_hours`].
    pub free: f64,
    /// [`lower_bound_with_cold_starts_gpu_hours`].
    pub cold_starts: f64,
    /// [`lower_bound_at_attainment_gpu_hours`] at the `attainment` asked for.
    pub at_attainment: f64,
}

/// The three bounds, the third at `attainment` (0–1).
pub fn lower_bounds(sc: &Scenario, attainment: f64) -> Bounds {
    let lead = |m: usize| cold_start_lead(sc, m);
    let usable = usable_bytes(sc);
    let footprints = footprints(sc);
    // What taking each request out can save: its interval (from its lead before arrival, clipped to the run, to its
    // ideal end) times the most GPUs its weights, KV cache and compute rate can round the need up by.
    let mut spans: Vec<f64> = Vec::new();
    for_each_request(sc, |m, a, r| {
        let memory = footprints[m].held(1, r.kv);
        let gpus = (memory / usable).max(r.work / r.ideal).ceil().max(1.0);
        let start = (a.at - lead(m)).max(0.0);
        spans.push(((a.at + r.ideal).min(sc.duration) - start) * gpus);
    });
    let excused = ((1.0 - attainment.clamp(0.0, 1.0)) * spans.len() as f64).floor() as usize;
    spans.sort_by(|x, y| y.total_cmp(x));
    let slack: f64 = spans.iter().take(excused).sum();
    let free = lower_bound_gpu_hours(sc);
    let cold_starts = bound(sc, lead);
    Bounds {
        free,
        cold_starts,
        at_attainment: (cold_starts - slack / 3600.0).max(free),
    }
}

/// How long before each arrival model `m`'s weights must be resident for the request to meet its objective
/// through a cold start.
fn cold_start_lead(sc: &Scenario, m: usize) -> f64 {
    let setup = &sc.models[m];
    (setup.cold_start_secs(&sc.settings) - setup.slo_ttft).max(0.0)
}

/// What one model holds in GPU memory while its weights are resident, bytes.
struct Footprint {
    /// Weights and start-up overhead.
    fixed: f64,
    /// The smallest KV cache a replica starts with: one request of `max_model_len` tokens, in whole blocks (what
    /// vLLM checks at start-up).
    min_kv: f64,
}

impl Footprint {
    /// The model's memory with `kv` bytes of requests in flight: nothing while its weights are not resident (its
    /// requests' intervals lie within the residency), else its weights and a cache of at least `min_kv` holding
    /// them all.
    fn held(&self, resident: u64, kv: f64) -> f64 {
        if resident == 0 {
            kv
        } else {
            self.fixed + kv.max(self.min_kv)
        }
    }
}

/// Each model's [`Footprint`], in scenario order.
fn footprints(sc: &Scenario) -> Vec<Footprint> {
    let block = u64::from(EngineConfig::vllm_defaults(&sc.gpu).block_size.max(1));
    sc.models
        .iter()
        .map(|setup| {
            let len = u64::from(setup.max_model_len.unwrap_or(setup.spec.max_model_len));
            Footprint {
                fixed: (setup.spec.weights_bytes + setup.spec.overhead_bytes) as f64,
                min_kv: (len.div_ceil(block) * block * setup.spec.bytes_per_kv_token) as f64,
            }
        })
        .collect()
}

/// One GPU's memory less the headroom, bytes.
fn usable_bytes(sc: &Scenario) -> f64 {
    (sc.gpu.memory_bytes as f64 - sc.settings.gpu_headroom_mib as f64 * 1_048_576.0).max(1.0)
}

/// One request served ideally: alone on a whole GPU, no queueing.
struct Ideal {
    /// Seconds from arrival to the last token.
    ideal: f64,
    /// GPU-seconds of compute.
    work: f64,
    /// Its KV cache, bytes.
    kv: f64,
}

/// Calls `f(model, arrival, ideal)` for every request that arrives within the run.
fn for_each_request(sc: &Scenario, mut f: impl FnMut(usize, &crate::trace::Arrival, Ideal)) {
    let gpu = &sc.gpu;
    let cfg = EngineConfig::vllm_defaults(gpu);
    let bw = gpu.hbm_bandwidth_bytes_per_s * cfg.memory_efficiency;
    let flops = gpu.flops * cfg.compute_efficiency;
    for (m, arrivals) in sc.arrivals.iter().enumerate() {
        let spec = &sc.models[m].spec;
        let per_token_decode = spec.weights_bytes as f64 / bw;
        for a in arrivals.iter().filter(|a| a.at < sc.duration) {
            let prompt = f64::from(a.prompt_tokens);
            let output = f64::from(a.output_tokens.max(1));
            let prefill = (2.0 * spec.params * prompt / flops).max(per_token_decode);
            f(
                m,
                a,
                Ideal {
                    ideal: prefill + (output - 1.0) * per_token_decode,
                    work: 2.0 * spec.params * (prompt + output) / flops,
                    kv: (prompt + output) * spec.bytes_per_kv_token as f64,
                },
            );
        }
    }
}

/// `lead(m)`: how long before each arrival model `m`'s weights must already be resident.
fn bound(sc: &Scenario, lead: impl Fn(usize) -> f64) -> f64 {
    let usable = usable_bytes(sc);
    // (time, model, +1/-1, KV bytes, compute rate in GPUs, weights residency +1/-1)
    let mut events: Vec<(f64, usize, i8, f64, f64, i8)> = Vec::new();
    for_each_request(sc, |m, a, r| {
        let lead = lead(m);
        {
            let Ideal { ideal, work, kv } = r;
            let rate = work / ideal;
            let end = (a.at + ideal).min(sc.duration);
            events.push((a.at, m, 1, kv, rate, 0));
            events.push((end, m, -1, kv, rate, 0));
            // The weights: from `lead` before the arrival (clipped to the run) to the request's end.
            events.push(((a.at - lead).max(0.0), m, 1, 0.0, 0.0, 1));
            events.push((end, m, -1, 0.0, 0.0, -1));
        }
    });
    // Ends before starts at the same instant, so a zero-length gap never double counts.
    events.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.2.cmp(&y.2)));
    let footprints = footprints(sc);
    let mut resident = vec![0u64; sc.models.len()];
    let mut kv_of = vec![0.0f64; sc.models.len()];
    let (mut memory, mut compute, mut last, mut gpu_seconds) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    for (t, m, delta, kv, rate, weights) in events {
        if t > last {
            // GPUs are held whole: at any instant a cluster holds an integral number of them, at least the
            // fluid need rounded up (the tolerance keeps float noise from rounding 1.000…1 up to 2).
            let need = (memory / usable).max(compute).max(0.0);
            gpu_seconds += (need - 1e-9).ceil().max(0.0) * (t - last);
            last = t;
        }
        let before = footprints[m].held(resident[m], kv_of[m]);
        if weights > 0 {
            resident[m] += 1;
        } else if weights < 0 {
            resident[m] = resident[m].saturating_sub(1);
        } else if delta > 0 {
            kv_of[m] += kv;
            compute += rate;
        } else {
            kv_of[m] = (kv_of[m] - kv).max(0.0);
            compute -= rate;
        }
        memory += footprints[m].held(resident[m], kv_of[m]) - before;
    }
    gpu_seconds / 3600.0
}
