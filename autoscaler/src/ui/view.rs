//! What the page shows, as a pure function of what the controller knows: [`view`] turns a [`Snapshot`] into a
//! [`View`] (numbers only, no HTML), so every figure on the page — above all the savings — is unit-tested here.
//!
//! **Savings.** "GPUs held" counts what managed models hold now: one GPU per replica that runs on a whole GPU,
//! plus every capacity pod of a fractional pool. "GPUs needed" packs one request per replica — the replica's
//! model recommendation (compute share in milli-GPUs, GPU memory MiB) — with [`tessera_core::pack::pack_offline`],
//! the packer of `tessera pack`, onto GPUs of the same memory size. A replica with no recommendation yet keeps a
//! whole GPU (missing data never shrinks anything). The difference is priced at `price_per_gpu_hour` ×
//! [`HOURS_PER_MONTH`]. Replica counts are today's: what scaling would change is a separate question.

use std::collections::BTreeMap;

use tessera_core::pack::{GPU_COMPUTE_MILLI, GpuShape, ReplicaRequest, pack_offline};
use tessera_core::recommend::{Field, ReasonCode, Recommendation};
use tessera_core::workload::Classified;

/// Hours in an average month (365 × 24 / 12), the unit cloud price lists use for a monthly figure.
pub const HOURS_PER_MONTH: f64 = 730.0;

/// How a model's replicas get their GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub enum Sharing {
    /// Each replica holds a whole GPU (`nvidia.com/gpu: 1`).
    #[default]
    Whole,
    /// Replicas hold shares of capacity pods' GPUs.
    Fractional,
}

impl Sharing {
    /// Lower-case name, as in the CRD.
    pub fn as_str(self) -> &'static str {
        match self {
            Sharing::Whole => "whole",
            Sharing::Fractional => "fractional",
        }
    }
}

/// Replica counts.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Replicas {
    /// Replicas the target has.
    pub current: u32,
    /// Ready replicas.
    pub ready: u32,
    /// Replicas the controller wants (= current where nothing decides, as in local mode).
    pub desired: u32,
    /// The policy's bounds; `None` where no policy is known (local mode).
    pub min: Option<u32>,
    /// Upper bound.
    pub max: Option<u32>,
}

/// The model's signals, over its replicas (means for ratios and latencies' worst replica, sums for counts).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Signals {
    /// Mean KV cache usage over fresh replicas, 0–1.
    pub kv_cache_usage: Option<f64>,
    /// Waiting requests, summed.
    pub waiting: Option<f64>,
    /// Running requests, summed.
    pub running: Option<f64>,
    /// Finished requests per second, summed.
    pub requests_per_second: Option<f64>,
    /// Generated tokens per second, summed.
    pub generation_tokens_per_second: Option<f64>,
    /// Worst replica's TTFT p95, seconds.
    pub ttft_p95: Option<f64>,
    /// Worst replica's inter-token latency p95, seconds.
    pub itl_p95: Option<f64>,
    /// TTFT objective, seconds.
    pub ttft_slo: Option<f64>,
    /// Inter-token latency objective, seconds.
    pub itl_slo: Option<f64>,
    /// Preemptions in the window, summed.
    pub preemptions: Option<f64>,
    /// Prefix-cache hits over queries in the window, mean over replicas, 0–1 (`None` from older sidecars).
    pub prefix_cache_hit_ratio: Option<f64>,
    /// Worst replica's prefill time p50 over the window, seconds.
    pub prefill_p50: Option<f64>,
    /// Worst replica's prefill time p95, seconds.
    pub prefill_p95: Option<f64>,
    /// Worst replica's decode time p50 over the window, seconds.
    pub decode_p50: Option<f64>,
    /// Worst replica's decode time p95, seconds.
    pub decode_p95: Option<f64>,
    /// Share of the window's scrapes with a request running or waiting, busiest replica, 0–1.
    pub active_ratio: Option<f64>,
}

/// What the pods run with now (from vLLM's own `cache_config_info` and the sidecar's compute share).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RunningWith {
    /// `--gpu-memory-utilization` in force.
    pub gpu_memory_utilization: Option<f64>,
    /// `--kv-cache-memory-bytes` in force, if the server runs with a fixed KV size.
    pub kv_cache_memory_bytes: Option<u64>,
    /// Compute share, 0–1.
    pub compute_share: Option<f64>,
}

/// One decision the controller took, newest last.
#[derive(Debug, Clone, PartialEq)]
pub struct DecisionNote {
    /// When (Unix ms).
    pub at_ms: u64,
    /// Replicas before.
    pub from: u32,
    /// Replicas wanted.
    pub to: u32,
    /// Stable label (e.g. `scale_up`).
    pub reason: String,
    /// The sentence.
    pub message: String,
}

/// One managed model as the controller sees it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ModelObservation {
    /// Namespace.
    pub namespace: String,
    /// The InferenceAutoscaler's (or, in local mode, the `--sidecar` entry's) name.
    pub name: String,
    /// The scaled workload, `Kind/name`, or the sidecar URL in local mode.
    pub target: String,
    /// Replica counts.
    pub replicas: Replicas,
    /// Replicas whose sidecar answered with fresh data.
    pub reporting: u32,
    /// Signals.
    pub signals: Signals,
    /// The signal that asked for the most replicas.
    pub leading_signal: Option<String>,
    /// What held the replica count in the last decision (`status.constraint`, `core::scale::constraint`).
    pub constraint: Option<String>,
    /// The recommendation covering every replica.
    pub recommendation: Option<Recommendation>,
    /// Why there is no recommendation, when there is none.
    pub no_recommendation_reason: Option<String>,
    /// What the pods run with.
    pub running: RunningWith,
    /// Total memory of the GPU a replica runs on, MiB, if known.
    pub gpu_memory_mib: Option<u64>,
    /// Measured GPU memory used, summed over replicas, MiB (NVML), if known.
    pub measured_memory_mib: Option<u64>,
    /// Measured SM utilization, mean over replicas, 0–1 (NVML), if known.
    pub measured_sm: Option<f64>,
    /// Whole GPUs or shares.
    pub sharing: Sharing,
    /// `gpu.updateMode`, as in the CRD; `None` in local mode.
    pub update_mode: Option<String>,
    /// The workload class ([`tessera_core::workload`]) and why; `None` before it is classified.
    pub workload_class: Option<Classified>,
    /// The last decisions, newest last.
    pub decisions: Vec<DecisionNote>,
}

impl ModelObservation {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// One tenant of a shared GPU.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TenantObservation {
    /// The pod (or reservation id while the pod does not exist yet).
    pub pod: String,
    /// Its model.
    pub model: String,
    /// Reserved compute, milli-GPUs.
    pub compute_milli: u32,
    /// Reserved memory, MiB.
    pub memory_mib: u64,
    /// Measured memory (gpu-agent), MiB.
    pub measured_memory_mib: Option<u64>,
    /// Measured SM utilization (gpu-agent), 0–1.
    pub measured_sm: Option<f64>,
}

/// One capacity pod of a fractional pool: one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuObservation {
    /// Pool name.
    pub pool: String,
    /// The capacity pod.
    pub capacity_pod: String,
    /// Node it runs on.
    pub node: Option<String>,
    /// GPU UUID (from the gpu-agent).
    pub uuid: Option<String>,
    /// Device memory, MiB.
    pub memory_mib: u64,
    /// The compute its pool hands out on it, milli-GPUs: 1000 × the pool's `computeOversubscription`.
    pub compute_milli: u32,
    /// Tenants.
    pub tenants: Vec<TenantObservation>,
    /// Who holds the GPU's start-up lease, if anyone.
    pub startup_lease_holder: Option<String>,
    /// Being emptied by consolidation since (Unix seconds): its models move their pods to other GPUs.
    pub draining_since: Option<u64>,
}

impl Default for GpuObservation {
    /// An unnamed GPU of a pool that hands it out once.
    fn default() -> Self {
        Self {
            pool: String::new(),
            capacity_pod: String::new(),
            node: None,
            uuid: None,
            memory_mib: 0,
            compute_milli: GPU_COMPUTE_MILLI,
            tenants: Vec::new(),
            startup_lease_holder: None,
            draining_since: None,
        }
    }
}

/// Everything the page is drawn from.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Snapshot {
    /// When it was taken (Unix ms).
    pub at_ms: u64,
    /// When this process started keeping history (Unix ms): the page says history begins there.
    pub history_since_ms: u64,
    /// True in `--no-kube` mode (read-only, from sidecars named on the command line).
    pub local: bool,
    /// Managed models.
    pub models: Vec<ModelObservation>,
    /// Capacity pods of fractional pools.
    pub gpus: Vec<GpuObservation>,
}

/// Page settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// Price of one GPU-hour (`--gpu-hour-price`); `None`: the list price of the GPU the replicas report, the one
    /// `tessera simulate` uses ([`Settings::price`]).
    pub price_per_gpu_hour: Option<f64>,
    /// GPU memory assumed where a replica's GPU is unknown, MiB.
    pub default_gpu_memory_mib: u64,
    /// MiB kept free on every GPU when packing (as the pools' `memoryHeadroomMiB`).
    pub headroom_mib: u64,
}

/// The GPU preset a reported GPU memory most likely is (what `/ui` prices and `/ui/savings` simulates).
pub fn gpu_for_memory(mib: Option<u64>) -> &'static str {
    match mib {
        Some(m) if m < 30 * 1024 => "l4",
        Some(m) if m < 60 * 1024 => "a100-40gb",
        _ => "a100-80gb",
    }
}

impl Settings {
    /// The price of one GPU-hour and where it comes from, for GPUs of `gpu_memory_mib` (unknown: the page's
    /// default GPU): the user's, else the list price of that GPU's preset — one price for `/ui` and `/ui/savings`,
    /// and the one `tessera simulate` prints for the same GPU.
    pub fn price(&self, gpu_memory_mib: Option<u64>) -> (f64, String) {
        tessera_sim::simulate::today::price_for(self.gpu(gpu_memory_mib), self.price_per_gpu_hour)
    }

    /// The GPU preset the page assumes for GPUs of `gpu_memory_mib` (unknown: the page's default GPU memory).
    pub fn gpu(&self, gpu_memory_mib: Option<u64>) -> &'static str {
        gpu_for_memory(Some(gpu_memory_mib.unwrap_or(self.default_gpu_memory_mib)))
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            price_per_gpu_hour: None,
            default_gpu_memory_mib: 81920,
            headroom_mib: 1024,
        }
    }
}

/// The overview numbers.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Overview {
    /// GPUs held by managed models now.
    pub gpus_held: usize,
    /// GPUs the recommendations need when packed.
    pub gpus_needed: usize,
    /// `held − needed` (never negative: a packing that needs more than is held frees nothing).
    pub gpus_freed: usize,
    /// Money per month the freed GPUs cost.
    pub monthly_savings: f64,
    /// The price used.
    pub price_per_gpu_hour: f64,
    /// Where it comes from (`--gpu-hour-price`, or the list price's source).
    pub price_source: String,
    /// Replicas that have no recommendation yet (counted as a whole GPU each).
    pub replicas_without_recommendation: u32,
    /// Memory of the GPUs held, MiB.
    pub memory_held_mib: u64,
    /// Memory vLLM reserves (`gpu_memory_utilization` × device, or the fixed share), MiB.
    pub memory_reserved_mib: u64,
    /// Memory the recommendations ask for, MiB.
    pub memory_needed_mib: u64,
    /// Measured memory, MiB, where NVML measures it.
    pub memory_measured_mib: Option<u64>,
    /// Memory the recommendations ask for, in GPUs (each replica's MiB over its GPU's usable MiB): with
    /// [`Overview::compute_needed`], says which of the two keeps the GPUs.
    pub memory_needed_gpus: f64,
    /// Compute allocated, GPUs (a whole-GPU replica counts 1, a share its fraction).
    pub compute_allocated: f64,
    /// Compute the recommendations ask for, GPUs.
    pub compute_needed: f64,
    /// Measured SM busy, in GPUs (SM utilization × GPUs), where NVML measures it.
    pub compute_busy: Option<f64>,
    /// Models, replicas.
    pub models: usize,
    /// Replicas.
    pub replicas: u32,
    /// Models whose recommendation is still stepping down ([`ModelRow::memory_step_limited`] or compute).
    pub models_step_limited: usize,
}

/// One row of the models table.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRow {
    /// The observation.
    pub model: ModelObservation,
    /// GPUs its replicas hold now.
    pub gpus_held: f64,
    /// GPU memory per replica the recommendation asks for, MiB.
    pub recommended_memory_mib: Option<u64>,
    /// Memory per replica the pods reserve now, MiB.
    pub reserved_memory_mib: Option<u64>,
    /// True when a latency objective is set and its p95 is over it.
    pub over_objective: bool,
    /// True when a memory shrink was cut by the per-update step limit: the recommendation is a first step from
    /// what runs, and the end state needs less.
    pub memory_step_limited: bool,
    /// The same for the compute share.
    pub compute_step_limited: bool,
}

/// One row of the GPUs table.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuRow {
    /// The observation.
    pub gpu: GpuObservation,
    /// Free compute, milli-GPUs, of what the pool hands out on this GPU.
    pub free_compute_milli: u32,
    /// Free memory, MiB.
    pub free_memory_mib: u64,
}

/// The whole page, as numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct View {
    /// When the snapshot was taken (Unix ms).
    pub at_ms: u64,
    /// History start (Unix ms).
    pub history_since_ms: u64,
    /// Local mode.
    pub local: bool,
    /// Overview.
    pub overview: Overview,
    /// Models, by namespace/name.
    pub models: Vec<ModelRow>,
    /// GPUs of fractional pools, by pool/name.
    pub gpus: Vec<GpuRow>,
}

const MIB: u64 = 1 << 20;

/// The compute request of a replica with this recommendation, milli-GPUs, as the webhook reserves it
/// (`core::pack::compute_milli`); a fraction that is not a share is counted as the whole GPU.
fn compute_milli(fraction: f64) -> u32 {
    tessera_core::pack::compute_milli(fraction.min(1.0)).unwrap_or(GPU_COMPUTE_MILLI)
}

/// Memory per replica vLLM reserves now: the fixed KV size plus the non-KV memory where the server runs with a
/// fixed KV size, else `gpu_memory_utilization` × the device.
fn reserved_memory_mib(m: &ModelObservation) -> Option<u64> {
    if let (Some(kv), Some(rec)) = (m.running.kv_cache_memory_bytes, &m.recommendation) {
        return Some((kv + rec.non_kv_bytes).div_ceil(MIB));
    }
    let util = m.running.gpu_memory_utilization?;
    let total = m.gpu_memory_mib?;
    Some((util * total as f64).ceil() as u64)
}

/// The page's numbers from a snapshot. Pure: the same snapshot always draws the same page.
pub fn view(snapshot: &Snapshot, settings: &Settings) -> View {
    let mut models: Vec<&ModelObservation> = snapshot.models.iter().collect();
    models.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let mut gpus: Vec<&GpuObservation> = snapshot.gpus.iter().collect();
    gpus.sort_by(|a, b| (&a.pool, &a.capacity_pod).cmp(&(&b.pool, &b.capacity_pod)));

    let (price_per_gpu_hour, price_source) = settings.price(models.iter().find_map(|m| m.gpu_memory_mib));
    let mut o = Overview {
        price_per_gpu_hour,
        price_source,
        models: models.len(),
        ..Overview::default()
    };
    // Packing requests, grouped by the GPU's memory size (a replica can only move to a GPU like its own).
    let mut by_shape: BTreeMap<u64, Vec<ReplicaRequest>> = BTreeMap::new();
    let mut measured_mem: Option<u64> = None;
    let mut busy: Option<f64> = None;
    let mut rows = Vec::with_capacity(models.len());
    for m in &models {
        let n = m.replicas.current;
        o.replicas += n;
        let device_mib = m.gpu_memory_mib.unwrap_or(settings.default_gpu_memory_mib);
        let usable = device_mib.saturating_sub(settings.headroom_mib).max(1);
        let share = match m.sharing {
            Sharing::Whole => 1.0,
            Sharing::Fractional => m.running.compute_share.unwrap_or(1.0).clamp(0.0, 1.0),
        };
        let gpus_held = share * f64::from(n);
        if m.sharing == Sharing::Whole {
            o.gpus_held += n as usize;
            o.memory_held_mib += device_mib * u64::from(n);
        }
        o.compute_allocated += gpus_held;
        let reserved = reserved_memory_mib(m);
        o.memory_reserved_mib += reserved.unwrap_or(device_mib) * u64::from(n);
        let (milli, mem) = match &m.recommendation {
            Some(r) if r.gpu_memory_mib <= usable => (compute_milli(r.compute_fraction), r.gpu_memory_mib),
            // Needs more than a GPU of this size offers: it keeps a whole one.
            _ => {
                if m.recommendation.is_none() {
                    o.replicas_without_recommendation += n;
                }
                (GPU_COMPUTE_MILLI, usable)
            }
        };
        o.memory_needed_mib += mem * u64::from(n);
        o.memory_needed_gpus += mem as f64 / usable as f64 * f64::from(n);
        o.compute_needed += f64::from(milli) / f64::from(GPU_COMPUTE_MILLI) * f64::from(n);
        let requests = by_shape.entry(device_mib).or_default();
        for i in 0..n {
            requests.push(ReplicaRequest::new(
                format!("{}#{i}", m.key()),
                m.key(),
                milli,
                mem,
            ));
        }
        if let Some(x) = m.measured_memory_mib {
            measured_mem = Some(measured_mem.unwrap_or(0) + x);
        }
        if let Some(sm) = m.measured_sm {
            busy = Some(busy.unwrap_or(0.0) + sm * gpus_held);
        }
        let limited = |field: Field| {
            m.recommendation.as_ref().is_some_and(|r| {
                r.reasons
                    .iter()
                    .any(|x| x.field == field && x.code == ReasonCode::StepLimitedDown)
            })
        };
        let memory_step_limited = limited(Field::KvCacheMemory) || limited(Field::GpuMemory);
        let compute_step_limited = limited(Field::ComputeFraction);
        o.models_step_limited += usize::from(memory_step_limited || compute_step_limited);
        let over_objective = matches!((m.signals.ttft_p95, m.signals.ttft_slo), (Some(v), Some(s)) if v > s)
            || matches!((m.signals.itl_p95, m.signals.itl_slo), (Some(v), Some(s)) if v > s);
        rows.push(ModelRow {
            model: (*m).clone(),
            gpus_held,
            recommended_memory_mib: m.recommendation.as_ref().map(|r| r.gpu_memory_mib),
            reserved_memory_mib: reserved,
            over_objective,
            memory_step_limited,
            compute_step_limited,
        });
    }
    for g in &gpus {
        o.gpus_held += 1;
        o.memory_held_mib += g.memory_mib;
    }
    o.memory_measured_mib = measured_mem;
    o.compute_busy = busy;
    o.gpus_needed = by_shape
        .iter()
        .map(|(device_mib, requests)| {
            let shape = GpuShape {
                memory_mib: *device_mib,
                headroom_mib: settings.headroom_mib.min(device_mib.saturating_sub(1)),
                compute_milli: GPU_COMPUTE_MILLI,
            };
            // Every request was clamped to the shape above, so packing cannot fail; if it ever did, count one
            // GPU per replica, which frees nothing.
            pack_offline(requests, &shape).map_or(requests.len(), |p| p.gpus_used())
        })
        .sum();
    o.gpus_freed = o.gpus_held.saturating_sub(o.gpus_needed);
    o.monthly_savings = o.gpus_freed as f64 * o.price_per_gpu_hour * HOURS_PER_MONTH;

    let gpu_rows = gpus
        .into_iter()
        .map(|g| {
            let used_c: u32 = g.tenants.iter().map(|t| t.compute_milli).sum();
            let used_m: u64 = g.tenants.iter().map(|t| t.memory_mib).sum();
            GpuRow {
                gpu: g.clone(),
                free_compute_milli: g.compute_milli.saturating_sub(used_c),
                free_memory_mib: g.memory_mib.saturating_sub(used_m),
            }
        })
        .collect();
    View {
        at_ms: snapshot.at_ms,
        history_since_ms: snapshot.history_since_ms,
        local: snapshot.local,
        overview: o,
        models: rows,
        gpus: gpu_rows,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::recommend::Source;

    fn rec(memory_mib: u64, compute: f64) -> Recommendation {
        Recommendation {
            kv_cache_memory_bytes: 4 << 30,
            kv_cache_tokens: 1000,
            gpu_memory_utilization: 0.3,
            gpu_memory_mib: memory_mib,
            compute_fraction: compute,
            bytes_per_kv_token: 1024,
            bytes_per_kv_token_source: Source::Configured,
            non_kv_bytes: 2 << 30,
            non_kv_source: Source::Configured,
            reasons: Vec::new(),
        }
    }

    fn model(name: &str, replicas: u32, r: Option<Recommendation>) -> ModelObservation {
        ModelObservation {
            namespace: "ml".into(),
            name: name.into(),
            replicas: Replicas {
                current: replicas,
                ready: replicas,
                desired: replicas,
                ..Replicas::default()
            },
            recommendation: r,
            gpu_memory_mib: Some(81920),
            running: RunningWith {
                gpu_memory_utilization: Some(0.9),
                ..RunningWith::default()
            },
            ..ModelObservation::default()
        }
    }

    /// Worked by hand. Three models on 80 GiB GPUs (81920 MiB, 1024 MiB headroom → 80896 MiB usable), each
    /// replica on its own whole GPU:
    /// - `chat`: 2 replicas, recommended 30000 MiB and 0.4 of the compute;
    /// - `embed`: 3 replicas, 10000 MiB and 0.2;
    /// - `code`: 1 replica, no recommendation yet → keeps a whole GPU (1000 milli, 80896 MiB).
    ///
    /// Held: 2 + 3 + 1 = 6 GPUs. Needed: `code` fills one GPU alone. The others ask for 2 × (400 m, 30000) +
    /// 3 × (200 m, 10000) = 1400 m and 90000 MiB: more than one GPU on both counts, and two GPUs hold them
    /// (e.g. 400+400+200 m / 70000 MiB and 200+200 m / 20000 MiB). Needed = 1 + 2 = 3, freed = 3.
    /// Money: 3 GPUs × $5.12 (the A100-80GB's list price, as `tessera simulate` prices it) × 730 h = $11,212.80
    /// a month.
    #[test]
    fn savings_on_a_hand_worked_example() {
        let snapshot = Snapshot {
            models: vec![
                model("chat", 2, Some(rec(30000, 0.4))),
                model("embed", 3, Some(rec(10000, 0.2))),
                model("code", 1, None),
            ],
            ..Snapshot::default()
        };
        let v = view(&snapshot, &Settings::default());
        let o = &v.overview;
        assert_eq!(o.gpus_held, 6);
        assert_eq!(o.gpus_needed, 3);
        assert_eq!(o.gpus_freed, 3);
        assert!(
            (o.monthly_savings - 11_212.8).abs() < 1e-6,
            "{}",
            o.monthly_savings
        );
        assert!(o.price_source.contains("p4de.24xlarge"), "{}", o.price_source);
        assert_eq!(o.replicas_without_recommendation, 1);
        assert_eq!(o.replicas, 6);
        assert_eq!(o.memory_held_mib, 6 * 81920);
        // 0.9 × 81920 = 73728 per replica.
        assert_eq!(o.memory_reserved_mib, 6 * 73728);
        assert_eq!(o.memory_needed_mib, 2 * 30000 + 3 * 10000 + 80896);
        assert!((o.compute_needed - (0.8 + 0.6 + 1.0)).abs() < 1e-9);
        assert!((o.compute_allocated - 6.0).abs() < 1e-9);
        assert_eq!(o.memory_measured_mib, None);
        // Rows are sorted by name.
        let names: Vec<&str> = v.models.iter().map(|r| r.model.name.as_str()).collect();
        assert_eq!(names, ["chat", "code", "embed"]);
        assert_eq!(v.models[0].reserved_memory_mib, Some(73728));
        assert_eq!(v.models[0].recommended_memory_mib, Some(30000));
    }

    /// `/ui` and `/ui/savings` price a GPU-hour alike, and as `tessera simulate` does for that GPU (the page used
    /// to say $4.10 where `simulate` said $5.12 for the same A100-80GB).
    #[test]
    fn one_price_for_the_page_the_savings_page_and_simulate() {
        let s = Settings::default();
        let list = |gpu| {
            tessera_sim::simulate::today::list_price(gpu)
                .expect("priced")
                .usd_per_gpu_hour
        };
        assert_eq!(s.price(Some(81920)).0, list("a100-80gb"));
        assert_eq!(
            s.price(None).0,
            list("a100-80gb"),
            "unknown: the page's default GPU (80 GiB)"
        );
        assert_eq!(s.price(Some(40960)).0, list("a100-40gb"));
        assert_eq!(s.price(Some(23034)).0, list("l4"));
        let mine = Settings {
            price_per_gpu_hour: Some(2.5),
            ..s
        };
        assert_eq!(mine.price(Some(23034)), (2.5, "--gpu-hour-price".to_owned()));
    }

    #[test]
    fn the_price_is_configurable_and_nothing_is_freed_without_recommendations() {
        let snapshot = Snapshot {
            models: vec![model("a", 2, None)],
            ..Snapshot::default()
        };
        let settings = Settings {
            price_per_gpu_hour: Some(2.0),
            ..Settings::default()
        };
        let o = view(&snapshot, &settings).overview;
        assert_eq!((o.gpus_held, o.gpus_needed, o.gpus_freed), (2, 2, 0));
        assert_eq!(o.monthly_savings, 0.0);

        let snapshot = Snapshot {
            models: vec![model("a", 2, Some(rec(1000, 0.1)))],
            ..Snapshot::default()
        };
        let o = view(&snapshot, &settings).overview;
        assert_eq!((o.gpus_held, o.gpus_needed, o.gpus_freed), (2, 1, 1));
        assert!((o.monthly_savings - 2.0 * 730.0).abs() < 1e-9);
    }

    /// GPUs of different sizes are packed separately, and a recommendation larger than the GPU keeps a whole one.
    #[test]
    fn replicas_pack_only_onto_gpus_like_their_own() {
        let mut small = model("small", 2, Some(rec(5000, 0.1)));
        small.gpu_memory_mib = Some(23034);
        let big = model("big", 2, Some(rec(5000, 0.1)));
        let mut huge = model("huge", 1, Some(rec(90000, 0.1)));
        huge.gpu_memory_mib = Some(81920);
        let v = view(
            &Snapshot {
                models: vec![small, big, huge],
                ..Snapshot::default()
            },
            &Settings::default(),
        );
        // small: 1 GPU of 23034; big + huge (whole): 1 + 1 on 81920.
        assert_eq!(v.overview.gpus_held, 5);
        assert_eq!(v.overview.gpus_needed, 3);
        assert_eq!(v.overview.replicas_without_recommendation, 0);
    }

    #[test]
    fn capacity_pods_count_as_held_and_tenants_leave_free_room() {
        let mut shared = model("shared", 2, Some(rec(20000, 0.25)));
        shared.sharing = Sharing::Fractional;
        shared.running.compute_share = Some(0.5);
        let gpu = GpuObservation {
            pool: "a100".into(),
            capacity_pod: "tessera-capacity-a100-0".into(),
            memory_mib: 81920,
            compute_milli: GPU_COMPUTE_MILLI,
            tenants: vec![
                TenantObservation {
                    pod: "shared-0".into(),
                    model: "ml/shared".into(),
                    compute_milli: 500,
                    memory_mib: 20000,
                    ..TenantObservation::default()
                },
                TenantObservation {
                    pod: "shared-1".into(),
                    model: "ml/shared".into(),
                    compute_milli: 300,
                    memory_mib: 20000,
                    ..TenantObservation::default()
                },
            ],
            ..GpuObservation::default()
        };
        let v = view(
            &Snapshot {
                models: vec![shared],
                gpus: vec![gpu],
                ..Snapshot::default()
            },
            &Settings::default(),
        );
        assert_eq!(v.overview.gpus_held, 1);
        assert_eq!(v.overview.gpus_needed, 1);
        assert!((v.overview.compute_allocated - 1.0).abs() < 1e-9);
        assert_eq!(v.gpus[0].free_compute_milli, 200);
        assert_eq!(v.gpus[0].free_memory_mib, 81920 - 40000);
    }

    #[test]
    fn an_oversubscribed_gpu_shows_free_compute_of_what_its_pool_hands_out() {
        let tenant = |pod: &str, milli| TenantObservation {
            pod: pod.into(),
            model: "ml/shared".into(),
            compute_milli: milli,
            memory_mib: 20000,
            ..TenantObservation::default()
        };
        let gpu = GpuObservation {
            pool: "a100".into(),
            capacity_pod: "tessera-capacity-a100-0".into(),
            memory_mib: 81920,
            compute_milli: 2000,
            tenants: vec![tenant("a-0", 700), tenant("b-0", 600)],
            draining_since: Some(1_800_000_000),
            ..GpuObservation::default()
        };
        let v = view(
            &Snapshot {
                gpus: vec![gpu],
                ..Snapshot::default()
            },
            &Settings::default(),
        );
        // 1,300 milli of caps on a GPU handed out twice: 700 free, not "0% free".
        assert_eq!(v.gpus[0].free_compute_milli, 700);
        let page = super::super::html::render(&v, &super::super::history::History::default());
        assert!(
            page.contains("70%<span class=\"s\">of 200% (caps oversubscribed)</span>"),
            "the GPU row names the pool's caps"
        );
        assert!(
            page.contains("draining since 2027-01-15 08:00:00 UTC"),
            "a GPU being consolidated says so"
        );
    }

    #[test]
    fn a_latency_over_its_objective_is_flagged() {
        let mut m = model("slow", 1, None);
        m.signals.ttft_p95 = Some(0.8);
        m.signals.ttft_slo = Some(0.5);
        let v = view(
            &Snapshot {
                models: vec![m],
                ..Snapshot::default()
            },
            &Settings::default(),
        );
        assert!(v.models[0].over_objective);
    }
}
