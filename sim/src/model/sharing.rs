//! How sharing a GPU changes one engine's step time, with the GPU's capacities conserved.
//!
//! A vLLM step has two parts. Its **GPU part** reads the weights and the batch's KV cache from HBM (decode is
//! bound by memory bandwidth) and does `2 × params` FLOPs per scheduled token (prefill is bound by the SMs).
//! Its **host part** (scheduling, input preparation, sampling, output processing, launches: [`host_time_s`]) runs
//! on the CPU while the engine has no kernel on the GPU, so whatever share of the GPU it holds is free for the
//! co-tenants then.
//!
//! HBM bandwidth and SMs are capacities of the GPU. At any instant the tenants that are in their GPU part share
//! them ([`allocate`]), and no combination of them reads more bytes per second than the GPU delivers or uses
//! more SMs than it has:
//!
//! - [`SharingModel::Mps`] (the default; Tessera's pools use MPS): the tenants run concurrently. Each may use
//!   the SM share its cap gives (caps are limits, not reservations: when the caps of the tenants in their GPU
//!   part add up to more than the GPU they are scaled down in proportion). A share below
//!   [`MPS_BANDWIDTH_KNEE`] cannot pull the whole bandwidth; above it a lone decode step reads HBM at full speed.
//!   Each tenant asks for the bandwidth its step would use alone at its SM share; the bandwidth is split
//!   max-min fairly among those asks (water-filling), so a tenant that asks little is not slowed and the rest
//!   share what is left. Two decoders that each saturate HBM take twice as long *while their GPU parts
//!   overlap*, never less.
//! - [`SharingModel::TimeSlicing`]: no SM cap (a lone tenant has the whole GPU); tenants in their GPU part at
//!   the same moment take exclusive turns with the whole GPU, and switching loses [`TIME_SLICE_SWITCH_LOSS`] of
//!   the time: with `k` of them each progresses at `(1 − loss) / k` of its alone speed.
//! - [`SharingModel::Proportional`]: the old, pessimistic bound: every step's GPU part stretches by `1/s`,
//!   whatever the phase and whatever the neighbours do (a fixed partition: conserving, but never lending).
//!
//! How often the GPU parts overlap is what sets the cost of sharing. When a step starts, the engine knows which
//! co-tenants are in a step and what share of their step is GPU time (their duty). Taking each co-tenant to be
//! in its GPU part with probability equal to its duty, independently, the step's GPU part progresses at its
//! alone speed times the expected rate over the combinations ([`SharingModel::step`]). For identical tenants
//! this is exactly conserving in the steady state: N tenants' aggregate GPU work per second equals the chance
//! that at least one of them is in its GPU part, never more than the GPU (see `docs/simulator-experiments.md`).
//!
//! The constants are calibrated on published measurements in their absolute figures (sources, figures and the
//! fit in `docs/simulator-experiments.md`, "Sharing physics"); the tests in `sharing/tests.rs` reproduce each within its
//! stated error, and a property test checks conservation for random tenants, shares and batches.

use serde::{Deserialize, Serialize};

/// The SM share above which a lone decode step reads HBM at full speed. MuxServe (ICML'24, Figure 3) shows
/// decode latency barely moving as its SM share falls while prefill scales with SMs, and Nexus (2025, §3)
/// finds decode latency flat beyond a saturation point; 40% of the SMs is where this model puts that knee.
pub const MPS_BANDWIDTH_KNEE: f64 = 0.4;

/// The share of the GPU's time lost to switching when time-sliced tenants take turns (context switches, caches
/// refilled, kernels that cannot overlap across contexts). Fitted on the NVIDIA Run:ai / Nebius benchmark
/// (H100 NVL, Llama-3.1-8B at 0.5 GPU, time-sliced): see `docs/simulator-experiments.md`.
pub const TIME_SLICE_SWITCH_LOSS: f64 = 0.28;

/// Host time per step independent of model and batch (the engine loop, the scheduler's fixed work, one
/// GPU→CPU sync), seconds. With [`HOST_PER_BILLION_PARAMS_S`] and [`HOST_PER_SEQ_S`] it reproduces the
/// ~4 ms GPU bubble per decode step vLLM's multi-step RFC (#6854) profiles for an 8B model and the 24% GPU idle
/// time Hugging Face measured for an 8B model at batch 32 with 8K-token contexts on an H200 (synchronous
/// continuous batching). See `docs/simulator-experiments.md`.
pub const HOST_BASE_S: f64 = 0.001;

/// Host time per billion parameters, seconds: launches and per-layer bookkeeping grow with the layer count,
/// which grows with the model (8B: 32 layers, 14B: 40, 70B: 80).
pub const HOST_PER_BILLION_PARAMS_S: f64 = 0.000_25;

/// Host time per sequence in the batch, seconds: scheduling, block tables, sampling and output processing are
/// per request (the simllm study of vLLM's step loop finds the scheduler alone at ~13 µs per running request).
pub const HOST_PER_SEQ_S: f64 = 0.000_03;

/// The host part of one vLLM step for a model of `params` parameters with `seqs` sequences scheduled, plus a
/// configured fixed part `base_s` (the engine's `step_overhead_s`).
pub fn host_time_s(base_s: f64, params: f64, seqs: u64) -> f64 {
    base_s + HOST_PER_BILLION_PARAMS_S * params.max(0.0) / 1e9 + HOST_PER_SEQ_S * seqs as f64
}

/// Co-tenants beyond this many (the busiest kept) are taken to be always in their GPU part: the expectation
/// enumerates `2^n` combinations, and the pessimistic fold keeps it bounded without ever under-charging.
const MAX_ENUMERATED: usize = 8;

/// How co-tenants on one GPU affect each other.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SharingModel {
    /// MPS with an SM cap: concurrent tenants split the SMs (by cap) and the bandwidth (water-filling).
    #[default]
    Mps,
    /// The old model: every step's GPU part stretches by `1 / share` (a pessimistic bound).
    Proportional,
    /// Time-slicing: no SM cap; tenants in their GPU part at once take exclusive turns with a switch cost.
    TimeSlicing,
}

impl SharingModel {
    /// The name used in scenarios and reports.
    pub fn name(self) -> &'static str {
        match self {
            SharingModel::Mps => "mps",
            SharingModel::Proportional => "proportional",
            SharingModel::TimeSlicing => "time_slicing",
        }
    }
}

/// The GPU part of one step, seconds, for a lone engine with the whole GPU: the roofline's two parts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuWork {
    /// Bytes read from HBM over the achieved bandwidth.
    pub memory_s: f64,
    /// FLOPs over the achieved compute throughput.
    pub compute_s: f64,
}

/// One step's parts, seconds, for a lone engine with the whole GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepCost {
    /// Bytes read from HBM over the achieved bandwidth.
    pub memory_s: f64,
    /// FLOPs over the achieved compute throughput.
    pub compute_s: f64,
    /// The host part: time outside the GPU kernels (scheduling, sampling, launches), see [`host_time_s`].
    pub overhead_s: f64,
}

impl StepCost {
    fn gpu(&self) -> GpuWork {
        GpuWork {
            memory_s: self.memory_s.max(0.0),
            compute_s: self.compute_s.max(0.0),
        }
    }
}

/// A tenant in its GPU part at some instant: its work and its SM cap (the compute share; time-slicing and
/// proportional read it as their own rules say).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Demand {
    /// Its step's GPU work.
    pub work: GpuWork,
    /// Its SM cap, 0 < cap ≤ 1.
    pub cap: f64,
}

/// What [`allocate`] gives one tenant at an instant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grant {
    /// Share of the GPU's SMs (of its time, under time-slicing) the tenant uses.
    pub sm: f64,
    /// Share of the GPU's achieved HBM bandwidth granted.
    pub bandwidth: f64,
    /// Share of the bandwidth it actually reads at the speed it runs (≤ `bandwidth`).
    pub bandwidth_used: f64,
    /// Its progress speed relative to running its GPU part alone on the GPU (at its cap under MPS).
    pub rate: f64,
}

/// A co-tenant as a step that starts sees it: what it runs while in its GPU part, and how often it is there.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Neighbour {
    /// Its step's GPU work (whole-GPU roofline).
    pub work: GpuWork,
    /// Its SM cap.
    pub cap: f64,
    /// The share of its step in the GPU part (0 = idle, 1 = no host time).
    pub duty: f64,
}

/// The co-tenants of an engine's GPU that are in a step when its step starts (idle ones are left out: they
/// cost nothing).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Neighbours(pub Vec<Neighbour>);

/// A step's duration and how much of it is GPU time (what its co-tenants see).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepTiming {
    /// Wall time of the step.
    pub duration_s: f64,
    /// Its GPU part, as stretched by the co-tenants.
    pub gpu_s: f64,
    /// Share of the step the GPU runs this engine's kernels: `gpu_s / duration_s`.
    pub busy: f64,
}

/// Max-min fair split of `capacity` among `asks`: nobody gets more than it asks, and what one leaves is shared
/// by the rest.
fn water_fill(asks: &[f64], capacity: f64) -> Vec<f64> {
    let mut got = vec![0.0; asks.len()];
    let mut order: Vec<usize> = (0..asks.len()).collect();
    order.sort_by(|&a, &b| asks[a].total_cmp(&asks[b]));
    let mut left = capacity.max(0.0);
    let mut n = asks.len();
    for &i in &order {
        let fair = left / n as f64;
        let g = asks[i].max(0.0).min(fair);
        got[i] = g;
        left -= g;
        n -= 1;
    }
    got
}

/// The speed of a GPU part with `work` at SM share `sm` and bandwidth share `bw`: its duration.
fn gpu_time(work: GpuWork, sm: f64, bw: f64) -> f64 {
    let mem = if work.memory_s > 0.0 {
        work.memory_s / bw.max(1e-12)
    } else {
        0.0
    };
    let cmp = if work.compute_s > 0.0 {
        work.compute_s / sm.max(1e-12)
    } else {
        0.0
    };
    mem.max(cmp)
}

/// How the tenants in their GPU part at one instant share the GPU under `model`. The grants never add up to
/// more SMs or bandwidth than the GPU has (the property test in `sharing/tests.rs`).
pub fn allocate(model: SharingModel, tenants: &[Demand]) -> Vec<Grant> {
    match model {
        SharingModel::Mps => {
            let caps: Vec<f64> = tenants.iter().map(|t| t.cap.clamp(1e-6, 1.0)).collect();
            let scale = caps.iter().sum::<f64>().max(1.0);
            let sms: Vec<f64> = caps.iter().map(|c| c / scale).collect();
            // What each would read alone at its SM share: all the bandwidth its SMs can pull if memory-bound,
            // less if its compute holds it back.
            let asks: Vec<f64> = tenants
                .iter()
                .zip(&sms)
                .map(|(t, &sm)| {
                    let reach = (sm / MPS_BANDWIDTH_KNEE).min(1.0);
                    let alone = gpu_time(t.work, sm, reach);
                    if alone > 0.0 { t.work.memory_s / alone } else { 0.0 }
                })
                .collect();
            let bws = water_fill(&asks, 1.0);
            tenants
                .iter()
                .zip(caps.iter().zip(sms.iter().zip(&bws)))
                .map(|(t, (&cap, (&sm, &bw)))| {
                    let alone = gpu_time(t.work, cap, (cap / MPS_BANDWIDTH_KNEE).min(1.0));
                    let now = gpu_time(t.work, sm, bw);
                    Grant {
                        sm,
                        bandwidth: bw,
                        bandwidth_used: if now > 0.0 { t.work.memory_s / now } else { 0.0 },
                        rate: if now > 0.0 { alone / now } else { 1.0 },
                    }
                })
                .collect()
        }
        SharingModel::TimeSlicing => {
            let k = tenants.len().max(1) as f64;
            let turn = if tenants.len() > 1 {
                (1.0 - TIME_SLICE_SWITCH_LOSS) / k
            } else {
                1.0
            };
            tenants
                .iter()
                .map(|t| {
                    let alone = gpu_time(t.work, 1.0, 1.0);
                    Grant {
                        sm: turn,
                        bandwidth: turn,
                        bandwidth_used: if alone > 0.0 {
                            t.work.memory_s / alone * turn
                        } else {
                            0.0
                        },
                        rate: turn,
                    }
                })
                .collect()
        }
        SharingModel::Proportional => {
            // A fixed partition: each tenant has its share of everything, whoever else runs. Shares that add up
            // to more than the GPU are scaled down like MPS caps (the model never hands out more than there is).
            let caps: Vec<f64> = tenants.iter().map(|t| t.cap.clamp(1e-6, 1.0)).collect();
            let scale = caps.iter().sum::<f64>().max(1.0);
            tenants
                .iter()
                .zip(&caps)
                .map(|(t, &cap)| {
                    let s = cap / scale;
                    let alone = gpu_time(t.work, cap, cap);
                    let now = gpu_time(t.work, s, s);
                    Grant {
                        sm: s,
                        bandwidth: s,
                        bandwidth_used: if now > 0.0 { t.work.memory_s / now } else { 0.0 },
                        rate: if now > 0.0 { alone / now } else { 1.0 },
                    }
                })
                .collect()
        }
    }
}

impl SharingModel {
    /// The GPU part of `work` alone on the GPU with SM cap `cap`: what each model's rate is relative to.
    pub fn alone_gpu_s(self, work: GpuWork, cap: f64) -> f64 {
        let cap = cap.clamp(1e-6, 1.0);
        match self {
            SharingModel::Mps => gpu_time(work, cap, (cap / MPS_BANDWIDTH_KNEE).min(1.0)),
            SharingModel::TimeSlicing => gpu_time(work, 1.0, 1.0),
            SharingModel::Proportional => gpu_time(work, cap, cap),
        }
    }

    /// The expected progress rate of a GPU part `me` (cap `cap`) while these co-tenants step: each is in its GPU
    /// part with probability its duty, independently, and in each combination the GPU is shared as
    /// [`allocate`] says.
    pub fn expected_rate(self, me: Demand, neighbours: &[Neighbour]) -> f64 {
        let mut busy: Vec<Neighbour> = neighbours.iter().filter(|n| n.duty > 0.0).copied().collect();
        if busy.is_empty() {
            return 1.0;
        }
        // Past MAX_ENUMERATED, the least busy are kept and the busiest rest folded in as always on: bounded work
        // that can only overstate contention.
        busy.sort_by(|a, b| b.duty.total_cmp(&a.duty));
        let always: Vec<Neighbour> = if busy.len() > MAX_ENUMERATED {
            busy.drain(..busy.len() - MAX_ENUMERATED).collect()
        } else {
            Vec::new()
        };
        let mut expected = 0.0;
        let mut tenants: Vec<Demand> = Vec::with_capacity(1 + always.len() + busy.len());
        for mask in 0u32..(1u32 << busy.len()) {
            let mut p = 1.0;
            tenants.clear();
            tenants.push(me);
            tenants.extend(always.iter().map(|n| Demand {
                work: n.work,
                cap: n.cap,
            }));
            for (j, n) in busy.iter().enumerate() {
                let d = n.duty.min(1.0);
                if mask & (1 << j) != 0 {
                    p *= d;
                    tenants.push(Demand {
                        work: n.work,
                        cap: n.cap,
                    });
                } else {
                    p *= 1.0 - d;
                }
            }
            if p <= 0.0 {
                continue;
            }
            expected += p * allocate(self, &tenants)[0].rate;
        }
        expected.clamp(1e-9, 1.0)
    }

    /// The step's timing at SM cap `share` (0 < share ≤ 1) with these co-tenants stepping: the host part as it
    /// is, the GPU part at its alone speed over the expected rate.
    pub fn step(self, cost: StepCost, share: f64, neighbours: &Neighbours) -> StepTiming {
        let work = cost.gpu();
        let alone = self.alone_gpu_s(work, share);
        let rate = match self {
            SharingModel::Proportional => 1.0,
            _ => self.expected_rate(
                Demand {
                    work,
                    cap: share.clamp(1e-6, 1.0),
                },
                &neighbours.0,
            ),
        };
        let gpu_s = alone / rate;
        let duration_s = gpu_s + cost.overhead_s.max(0.0);
        if duration_s <= 0.0 {
            return StepTiming {
                duration_s: 0.0,
                gpu_s: 0.0,
                busy: 0.0,
            };
        }
        StepTiming {
            duration_s,
            gpu_s,
            busy: gpu_s / duration_s,
        }
    }
}

/// N identical tenants, each stepping back to back: the steady state where each one's duty is what its own
/// (stretched) steps give. The answer `tessera sharing` prints.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SteadyState {
    /// One tenant's step alone on the GPU at the whole GPU (the dedicated replica).
    pub alone: StepTiming,
    /// One tenant's step with its `N − 1` co-tenants stepping.
    pub shared: StepTiming,
}

/// The steady state of `tenants` identical tenants running `cost` back to back at SM cap `share`.
pub fn steady_state(model: SharingModel, cost: StepCost, share: f64, tenants: u32) -> SteadyState {
    let same = vec![(cost, share); tenants.max(1) as usize];
    steady_states(model, &same).0[0]
}

/// Everyone but tenant `i` of `tenants` (each `(cost, share)`, at its `duty`), as a step of `i` sees them.
pub fn neighbours_of(i: usize, tenants: &[(StepCost, f64)], duty: &[f64]) -> Neighbours {
    Neighbours(
        tenants
            .iter()
            .zip(duty)
            .enumerate()
            .filter(|&(j, _)| j != i)
            .map(|(_, (&(c, cap), &duty))| Neighbour {
                work: c.gpu(),
                cap,
                duty,
            })
            .collect(),
    )
}

/// The steady state of tenants that may differ, each `(cost, share)` stepping back to back: every tenant's duty
/// is what its own (stretched) steps give beside the others' duties. Returns each one's [`SteadyState`] and its
/// duty (the share of its step on the GPU). The duties are a fixed point: more overlap stretches the GPU part,
/// which raises the duty; the map is monotone and bounded, so damped simultaneous iteration from each one's duty
/// at its cap alone converges (for identical tenants, every duty moves alike).
pub fn steady_states(model: SharingModel, tenants: &[(StepCost, f64)]) -> (Vec<SteadyState>, Vec<f64>) {
    let none = Neighbours::default();
    let mut shared: Vec<StepTiming> = tenants.iter().map(|&(c, s)| model.step(c, s, &none)).collect();
    let mut duty: Vec<f64> = shared.iter().map(|t| t.busy).collect();
    if tenants.len() > 1 {
        for _ in 0..200 {
            for (i, &(c, s)) in tenants.iter().enumerate() {
                shared[i] = model.step(c, s, &neighbours_of(i, tenants, &duty));
            }
            let next: Vec<f64> = duty
                .iter()
                .zip(&shared)
                .map(|(d, t)| 0.5 * (d + t.busy))
                .collect();
            let moved = next
                .iter()
                .zip(&duty)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max);
            duty = next;
            if moved < 1e-12 {
                break;
            }
        }
    }
    let states = tenants
        .iter()
        .zip(shared)
        .map(|(&(c, _), shared)| SteadyState {
            alone: model.step(c, 1.0, &none),
            shared,
        })
        .collect();
    (states, duty)
}

#[cfg(test)]
mod tests;
