//! Lower bounds on GPU-hours, from the arrivals alone, for every policy that meets the TTFT objectives.
//!
//! The bounds count GPU memory, the resource that binds in the runs here, and only the memory a policy cannot
//! avoid holding at a given instant. For one request of model `m` arriving at `a`, with TTFT objective `O`,
//! ideal prefill `p` (its prompt at the whole GPU's achieved compute, or one weights read if that is longer)
//! and ideal latency `ℓ` (the prefill, then one weights read per output token at the whole GPU's achieved
//! bandwidth):
//! - If it meets its objective, vLLM admitted it by `a + O − p` at the latest, and it stays in flight at least
//!   `ℓ` from its admission, so until `a + ℓ` at least. Over `[a + O − p, a + ℓ]` (when not empty) some
//!   replica of `m` is serving it, whatever the policy delayed: `m`'s weights and start-up overhead are
//!   resident, with a KV cache of at least one `max_model_len` request (vLLM refuses to start an engine whose
//!   cache cannot hold one; the simulator's engine too, [`crate::model::ModelError::MaxModelLenTooLarge`]).
//! - The replica serving it was ready at its admission, so it began to start (pod start and weights load, or a
//!   sleep-mode wake; `c` seconds) by `a + O − p − c` and its pod has held a GPU since. With cold starts
//!   charged, at least one GPU is held over `[a + O − p − c, a + ℓ]`; the memory is counted only from
//!   `a + O − p`, since a starting pod holds its GPU before its weights and cache are in it.
//!
//! At each instant the cluster holds at least the sum of the resident models' memory over the usable memory of
//! one GPU (the fluid relaxation of packing), rounded up, since GPUs are held whole, and at least one GPU while
//! any model is starting; each bound integrates that over the run. A model's weights count once however many
//! replicas serve it. What is left out, because a policy can move it: the requests' own KV caches (a request can
//! be preempted and its cache freed, then recomputed) and their compute (a prefill may run anywhere in its
//! objective, a decode may be stretched), so batching is free and a burst costs no memory. Real policies sit well above these bounds; the ratio to them says how much
//! room is left, not that it is reachable.
//!
//! Three variants, reported side by side ([`lower_bounds`]):
//! - [`Bounds::free`]: cold starts are free. It holds for any policy that meets every request's
//!   objective.
//! - [`Bounds::cold_starts`]: a GPU is held from a cold start before each residency. It
//!   holds for any policy that meets every request's objective through its cold starts, and shows what they
//!   alone cost.
//! - [`Bounds::at_attainment`]: for a policy that may let a share of requests miss (the run's
//!   attainment goal, 99%). Such a policy meets the objective for all but `k` requests, so it holds at least
//!   either bound of the others. Taking requests out frees an instant of a model only if every interval of that
//!   model covering it is taken out, and frees at most the whole GPUs the model's weights and smallest cache
//!   round up to (one for every model here). `Walk::most_saved` bounds what any `k` requests can free; the
//!   bound is the larger of the two bounds, each less that.

use crate::model::EngineConfig;

use super::scenario::Scenario;

/// The three bounds of a run, GPU-hours over `[0, duration)` (see the module docs for why each holds), and each
/// model's part of the first.
#[derive(Debug, Clone, PartialEq)]
pub struct Bounds {
    /// For a policy that meets every TTFT objective, cold starts free.
    pub free: f64,
    /// For a policy that meets every TTFT objective through its cold starts: a GPU held from a cold start before
    /// each residency.
    pub cold_starts: f64,
    /// For a policy that meets the TTFT objective for at least the `attainment` asked for.
    pub at_attainment: f64,
    /// Per model, in scenario order: the GPU-hours of memory its requests force with free cold starts (the first
    /// bound's intervals): its weights and smallest cache over the union of its residencies, in one GPU's usable
    /// memory, not rounded up. What each model brings to the first bound before packing and whole GPUs; the
    /// report sets it beside the memory each strategy reserved for the model.
    pub forced_memory: Vec<f64>,
}

/// The three bounds, the third at `attainment` (0–1).
pub fn lower_bounds(sc: &Scenario, attainment: f64) -> Bounds {
    let requests = sc
        .arrivals
        .iter()
        .map(|a| a.iter().filter(|a| a.at < sc.duration).count())
        .sum::<usize>();
    let excused = ((1.0 - attainment.clamp(0.0, 1.0)) * requests as f64).floor() as usize;
    let free = walk(sc, &residencies(sc, Lead::Free));
    let cold = walk(sc, &residencies(sc, Lead::ColdStart));
    Bounds {
        free: free.gpu_hours,
        cold_starts: cold.gpu_hours,
        at_attainment: (free.gpu_hours - free.most_saved(excused))
            .max(cold.gpu_hours - cold.most_saved(excused))
            .max(0.0),
        forced_memory: free.resident,
    }
}

/// Where a model's residency for a request starts, before the latest admission that meets the objective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lead {
    /// Cold starts are free: at the admission.
    Free,
    /// A cold start before it.
    ColdStart,
}

/// What one model holds in GPU memory while its weights are resident, bytes.
struct Footprint {
    /// Weights and start-up overhead.
    fixed: u64,
    /// The smallest KV cache a replica starts with: one request of `max_model_len` tokens, in whole blocks (what
    /// vLLM checks at start-up).
    min_kv: u64,
}

impl Footprint {
    /// The least a resident model holds: its weights and the smallest cache it can start with.
    fn smallest(&self) -> u64 {
        self.fixed + self.min_kv
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
                fixed: setup.spec.weights_bytes + setup.spec.overhead_bytes,
                min_kv: len.div_ceil(block) * block * setup.spec.bytes_per_kv_token,
            }
        })
        .collect()
}

/// One GPU's memory less the headroom, bytes.
fn usable_bytes(sc: &Scenario) -> f64 {
    (sc.gpu.memory_bytes as f64 - sc.settings.gpu_headroom_mib as f64 * 1_048_576.0).max(1.0)
}

/// What one request forces for its model to meet its objective, clipped to the run: a GPU held over
/// `[start, end]` (its replica starting, then serving), its memory over `[ready, end]` (`start ≤ ready ≤ end`).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Residency {
    model: usize,
    start: f64,
    ready: f64,
    end: f64,
}

/// Every request's [`Residency`] that is not empty, in arrival order per model.
fn residencies(sc: &Scenario, lead: Lead) -> Vec<Residency> {
    let gpu = &sc.gpu;
    let cfg = EngineConfig::vllm_defaults(gpu);
    let bw = gpu.hbm_bandwidth_bytes_per_s * cfg.memory_efficiency;
    let flops = gpu.flops * cfg.compute_efficiency;
    let mut out = Vec::new();
    for (m, arrivals) in sc.arrivals.iter().enumerate() {
        let setup = &sc.models[m];
        let spec = &setup.spec;
        let per_token_decode = spec.weights_bytes as f64 / bw;
        let before = match lead {
            Lead::Free => 0.0,
            Lead::ColdStart => setup.cold_start_secs(&sc.settings),
        };
        for a in arrivals.iter().filter(|a| a.at < sc.duration) {
            let prefill = (2.0 * spec.params * f64::from(a.prompt_tokens) / flops).max(per_token_decode);
            let ideal = prefill + f64::from(a.output_tokens.max(1) - 1) * per_token_decode;
            // Admitted by `at + objective − prefill` at the latest, on a replica started `before` that; in flight
            // until `at + ideal` at least.
            let admitted = a.at + setup.slo_ttft - prefill;
            let end = (a.at + ideal).min(sc.duration);
            let start = (admitted - before).max(0.0);
            if end > start {
                out.push(Residency {
                    model: m,
                    start,
                    ready: admitted.clamp(start, end),
                    end,
                });
            }
        }
    }
    out
}

/// A walk over one variant's residencies.
struct Walk {
    /// The bound.
    gpu_hours: f64,
    /// Per model, the GPU-hours its smallest footprint was resident, in one GPU's usable memory, not rounded up
    /// ([`Bounds::forced_memory`] for the first bound's residencies).
    resident: Vec<f64>,
    /// Per model: how many seconds it was covered by exactly `c` residencies (index `c`, from 1), and the whole
    /// GPUs its memory rounds up to.
    coverage: Vec<(Vec<f64>, f64)>,
    /// Every residency's length, seconds, longest first.
    spans: Vec<f64>,
}

impl Walk {
    /// The most GPU-hours taking any `k` requests out can save (module docs). An instant of model `m` is freed
    /// only if every residency covering it is taken out, so freeing the instants covered `c` times costs `c`
    /// seconds of taken-out residency per second freed, and the taken-out residencies add up to at most the `k`
    /// longest. The most that budget frees, cheapest instants first and the last level in part (the fractional
    /// knapsack, which bounds the whole-request choice from above), times each model's GPUs.
    fn most_saved(&self, k: usize) -> f64 {
        let mut budget: f64 = self.spans.iter().take(k).sum();
        // (seconds of residency per GPU-second freed, GPU-seconds freeable at that price)
        let mut levels: Vec<(f64, f64)> = Vec::new();
        for (by_cover, gpus) in &self.coverage {
            for (c, secs) in by_cover.iter().enumerate().skip(1) {
                if *secs > 0.0 {
                    levels.push((c as f64 / gpus, secs * gpus));
                }
            }
        }
        levels.sort_by(|x, y| x.0.total_cmp(&y.0));
        let mut saved = 0.0;
        for (price, gpu_seconds) in levels {
            if budget <= 0.0 {
                break;
            }
            let take = gpu_seconds.min(budget / price);
            saved += take;
            budget -= take * price;
        }
        saved / 3600.0
    }
}

/// Adds `delta` (±1) to a count of open intervals: `Some(true)` when that opened the first, `Some(false)` when it
/// closed the last, `None` otherwise.
fn open_or_close(count: &mut usize, delta: i8) -> Option<bool> {
    if delta > 0 {
        *count += 1;
        (*count == 1).then_some(true)
    } else {
        let was = *count;
        *count = was.saturating_sub(1);
        (was == 1).then_some(false)
    }
}

/// The bound in GPU-hours over the given residencies (at each instant, the memory of every model resident then,
/// in whole GPUs, integrated), with what [`Walk::most_saved`] needs.
fn walk(sc: &Scenario, spans: &[Residency]) -> Walk {
    let usable = usable_bytes(sc);
    let footprints = footprints(sc);
    // (time, model, +1 when an interval starts / -1 when one ends, whether it is the memory's or the GPU's)
    let mut events: Vec<(f64, usize, i8, bool)> = Vec::with_capacity(spans.len() * 4);
    for r in spans {
        events.push((r.start, r.model, 1, false));
        events.push((r.end, r.model, -1, false));
        if r.end > r.ready {
            events.push((r.ready, r.model, 1, true));
            events.push((r.end, r.model, -1, true));
        }
    }
    // Ends before starts at the same instant, so a zero-length gap never double counts.
    events.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.2.cmp(&y.2)));
    let n = sc.models.len();
    let mut cover = vec![0usize; n];
    let mut in_memory = vec![0usize; n];
    // Per model, seconds with its memory resident, and since when the current stretch is.
    let (mut resident, mut resident_since) = (vec![0.0f64; n], vec![0.0f64; n]);
    // Models with an interval open: while any is, at least one GPU is held.
    let mut open_models = 0usize;
    let mut since = vec![0.0f64; n];
    let mut by_cover: Vec<Vec<f64>> = vec![Vec::new(); n];
    // Whole bytes, so millions of events add and take away exactly.
    let mut memory: u64 = 0;
    let (mut last, mut gpu_seconds) = (0.0f64, 0.0f64);
    for (t, m, delta, is_memory) in events {
        if t > last {
            // GPUs are held whole: at any instant a cluster holds an integral number of them, at least the
            // fluid need rounded up, and one while a pod starts.
            let need = (memory as f64 / usable)
                .ceil()
                .max(if open_models > 0 { 1.0 } else { 0.0 });
            gpu_seconds += need * (t - last);
            last = t;
        }
        if is_memory {
            match open_or_close(&mut in_memory[m], delta) {
                Some(true) => {
                    memory += footprints[m].smallest();
                    resident_since[m] = t;
                }
                Some(false) => {
                    memory = memory.saturating_sub(footprints[m].smallest());
                    resident[m] += t - resident_since[m];
                }
                None => {}
            }
        } else {
            let c = cover[m];
            if c > 0 {
                if by_cover[m].len() <= c {
                    by_cover[m].resize(c + 1, 0.0);
                }
                by_cover[m][c] += t - since[m];
            }
            since[m] = t;
            match open_or_close(&mut cover[m], delta) {
                Some(true) => open_models += 1,
                Some(false) => open_models = open_models.saturating_sub(1),
                None => {}
            }
        }
    }
    let mut lengths: Vec<f64> = spans.iter().map(|r| r.end - r.start).collect();
    lengths.sort_by(|x, y| y.total_cmp(x));
    Walk {
        gpu_hours: gpu_seconds / 3600.0,
        resident: resident
            .iter()
            .zip(&footprints)
            .map(|(secs, f)| secs * f.smallest() as f64 / usable / 3600.0)
            .collect(),
        coverage: by_cover
            .into_iter()
            .zip(&footprints)
            .map(|(c, f)| (c, (f.smallest() as f64 / usable).ceil().max(1.0)))
            .collect(),
        spans: lengths,
    }
}
