//! The discrete-event simulation of one strategy, in virtual time.
//!
//! A [`World`] holds the replicas of every model (each a [`crate::model::Engine`]), the GPUs they hold, and a
//! priority queue of events ordered by (time, insertion sequence), so equal times resolve in a fixed order and a
//! run is deterministic. Events: a model's next arrival, a replica's engine step ending, a replica becoming
//! ready, the scrape tick (signals, recommendation observations, utilization and chart samples), the autoscaler's
//! sync tick, and Tessera's recommendation tick. Nothing here reads a clock or does I/O.
//!
//! The decisions are not re-implemented here: replica counts come from [`tessera_core::scale::decide`], GPU
//! placement from [`tessera_core::pack::Packer`], memory and compute shares from
//! [`tessera_core::recommend::recommend`]. This module only feeds them what a cluster would observe and carries
//! out what they decide.
//!
//! The parts: [`strategy`] (the strategies and the scale policy each gives a model), [`autoscale`] (the
//! autoscaler's round, consolidation moves and Tessera's recommendation round, all calling `core`), [`finish`]
//! (the run's report).

mod autoscale;
mod batch;
mod finish;
mod isolation;
mod rollout;
mod sleep;
mod strategy;

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::time::Duration;

use tessera_core::pack::consolidate::{self, Candidate, ModelPlacement, MoveStep, PoolStep};
use tessera_core::pack::{
    EmptyGpu, GpuId, GpuShape, PackError, Packer, ReplicaRequest, compute_milli, empty_gpu,
};
use tessera_core::recommend::{self, KvGeometry, MemoryFacts, Observation, Outcome, Recommendation};
use tessera_core::scale::inputs;
use tessera_core::scale::joint::{self, LatencyOwner, ShareRoom};
use tessera_core::scale::{Behavior, ScalePolicy, ScaleState, ScaleToZero, ScalingRules, Targets, Timestamp};
use tessera_core::wire::activator::model_key;
use tessera_core::wire::sidecar::SnapshotSummary;

use super::observe::{self, Scrape};
use super::peers::{
    AIBRIX_KV_TARGET, AIBRIX_SCALE_DOWN_COOLDOWN_S, AIBRIX_TOLERANCE, ConcurrencyRule, ConcurrencyState,
    KEDA_HOLD_TIMEOUT_S, concurrency_desired,
};
use super::report::{
    ConsolidationReport, ModelReport, RolloutReport, Series, StrategyReport, quantile_sorted,
};
use super::scenario::{ComputeFraction, ModelSetup, Scenario};
use crate::model::{
    Engine, EngineConfig, EngineEvent, GIB, Histogram, MemorySetting, ModelError, Neighbours, Request,
    capped_max_tokens,
};

pub use super::batch_outcome::{BatchMode, BatchOutcome, BatchPlan, JobOutcome};
pub use autoscale::calibrate;
use autoscale::geometry;
pub use batch::BATCH_BIT;
pub use strategy::StrategyKind;
use strategy::policy_for;

/// What a strategy run needs besides the scenario.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Which strategy.
    pub kind: StrategyKind,
    /// Static and HAMi: replicas per model (ignored otherwise).
    pub static_replicas: Vec<u32>,
    /// Tessera: each model's starting recommendation (`None`: vLLM's default memory until observed).
    pub initial_recommendations: Vec<Option<Recommendation>>,
    /// Run only these models (indices); empty = all. Used by the static sizing rule.
    pub only_models: Vec<usize>,
    /// Run the scenario's batch jobs this way (`None`: leave them out, as the strategy tables do).
    pub batch: Option<BatchPlan>,
}

impl Plan {
    /// A plan for every model of the scenario with `kind`, Tessera starting from `initial_recommendations`, no
    /// static counts and no batch jobs: what the parity tests replay.
    pub fn starting_from(kind: StrategyKind, initial_recommendations: Vec<Option<Recommendation>>) -> Self {
        Plan {
            kind,
            static_replicas: Vec::new(),
            initial_recommendations,
            only_models: Vec::new(),
            batch: None,
        }
    }

    /// Static with `replicas` per model (a zero leaves a model out of the GPU count), every model of the
    /// scenario, no batch jobs.
    pub fn fixed(replicas: Vec<u32>) -> Self {
        Plan {
            static_replicas: replicas,
            ..Plan::starting_from(StrategyKind::Static, Vec::new())
        }
    }
}

/// Why a run could not complete.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The performance model refused a replica's configuration (as vLLM would refuse to start).
    #[error("model {model}: a replica cannot start: {source}")]
    Engine {
        /// The model.
        model: String,
        /// The engine's reason.
        source: ModelError,
    },
    /// The GPU preset's memory and the scenario's headroom leave nothing to pack into.
    #[error("GPU shape: {0}")]
    GpuShape(PackError),
    /// The packer refused a replica (for example, it needs more than one GPU holds).
    #[error("model {model}: cannot place a replica: {source}")]
    Pack {
        /// The model.
        model: String,
        /// The packer's reason.
        source: PackError,
    },
}

/// A replica's observation history with its KV geometry, for calibrating the recommendation.
#[derive(Debug, Clone)]
pub struct ReplicaHistory {
    /// The model index.
    pub model: usize,
    /// Everything it was observed doing.
    pub observations: Vec<Observation>,
    /// Its KV cache shape.
    pub geometry: KvGeometry,
    /// What was known about its memory.
    pub memory: MemoryFacts,
    /// Its vLLM TTFT histogram at the end (cumulative since it started, as `/metrics` shows it).
    pub ttft: Histogram,
    /// Its vLLM inter-token latency histogram at the end.
    pub itl: Histogram,
    /// The compute share it ran with.
    pub compute_fraction: f64,
}

/// The result of one strategy run.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// The report section.
    pub report: StrategyReport,
    /// Every replica's observation history (for calibration).
    pub histories: Vec<ReplicaHistory>,
    /// Every replica-count decision with what it was decided on, when asked for
    /// ([`World::recording_decisions`]).
    pub decisions: Vec<observe::DecisionRecord>,
    /// Replicas' recommendations with the pages they were made from, when asked for
    /// ([`World::recording_recommendations`]).
    pub recommendations: Vec<observe::RecommendationRecord>,
    /// The batch jobs' outcome, when the plan ran them.
    pub batch: Option<BatchOutcome>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Ev {
    Arrival { model: usize },
    Step { replica: usize, generation: u64 },
    Ready { replica: usize },
    Scrape,
    Sync,
    Recommend,
    BatchTick,
    BatchStep { own: usize, generation: u64 },
    BatchReady { own: usize },
    BatchReclaim { own: usize },
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Queued {
    at: f64,
    seq: u64,
    ev: Ev,
}

impl Eq for Queued {}

impl Ord for Queued {
    fn cmp(&self, other: &Self) -> Ordering {
        // BinaryHeap is a max-heap: reverse so the earliest (then the first inserted) pops first.
        other
            .at
            .total_cmp(&self.at)
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Starting,
    Ready,
    Draining,
    Gone,
}

#[derive(Debug)]
struct Replica {
    model: usize,
    name: String,
    engine: Engine,
    phase: Phase,
    compute_fraction: f64,
    generation: u64,
    observations: Vec<Observation>,
    last_busy: f64,
    /// Its scrapes while ready (gauges and cumulative TTFT and inter-token histograms), back to the longer of
    /// the recommendation window and the latency window: a window's latency is the difference of two, as the
    /// sidecar computes it.
    scrapes: VecDeque<Scrape>,
    /// While recording recommendations: each scrape's `/metrics` page and the GPU busy ratio its sidecar reads, as
    /// far back as `scrapes`.
    pages: VecDeque<observe::Page>,
    /// What its sidecar knows of its memory (on a shared GPU, not the device's used memory: [`Replica::gpu_shared`]).
    memory: MemoryFacts,
    /// The shared GPU it is packed on (packing strategies).
    gpu: Option<GpuId>,
    /// Tessera: the allocation it was started with (its pod's annotations); `None` when nothing was in force.
    allocation: Option<tessera_core::rollout::Allocation>,
}

impl Replica {
    /// Packed on a shared GPU: its sidecar runs with `--gpu-shared`, because NVML's device figures (busy time,
    /// used memory) are not one tenant's, so its window has neither (as the real one: the recommendation parity
    /// test, `sidecar/tests/recommend_parity.rs`, checks it).
    fn gpu_shared(&self) -> bool {
        self.gpu.is_some()
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct ReqState {
    ttft: Option<f64>,
    held: f64,
    done: bool,
    failed: bool,
}

#[derive(Debug)]
struct ModelRt {
    policy: Option<ScalePolicy>,
    state: ScaleState,
    replicas: Vec<usize>,
    held: VecDeque<usize>,
    recent: VecDeque<f64>,
    /// Requests that have arrived so far (the activator's `requests_total`).
    arrived: u64,
    /// Replica decisions made, how many of them left the latency target to the share rule, and how many had the
    /// TTFT target asking for replicas while nothing queued (`joint::latency_without_queue`).
    rounds: u32,
    rounds_latency_on_share: u32,
    rounds_prefill_bound: u32,
    /// Tessera: rounds in which the cold start was over the objective but the model could go to zero, its
    /// would-be misses within `cold_start_miss_budget` (`joint::JointPolicy::zero_within_budget`).
    rounds_zero_within_budget: u32,
    /// Tessera: rounds after which a running replica held less than an urgent growth in force.
    rounds_behind_while_urgent: u32,
    /// Tessera: the warm floor the joint rule kept, if any.
    warm_floor: Option<joint::WarmFloor>,
    /// Tessera: what the activator counted of the model's requests, since the run began (the class step's
    /// request mix, `core::class::RequestMix`).
    mix: tessera_core::class::RequestMix,
    /// Tessera: the workload class of the last round, and the defaults it supplied.
    class: Option<tessera_core::class::ClassRound>,
    last_request_at: Option<f64>,
    next_arrival: usize,
    requests: Vec<ReqState>,
    rec: Option<Recommendation>,
    cold_starts: u64,
    starts_from_zero: u64,
    /// Sleep mode: sleeping pods woken on their GPU, and sleeping pods lost (their GPU given back, or their
    /// memory lent out when a request came), whose model's next start is a cold one.
    sleep_wakes: u64,
    sleepers_lost: u64,
    /// Sleep mode: the last round chose sleep at zero (`core::sleep::rule`), so the last replica to leave sleeps.
    sleeps_at_zero: bool,
    /// Sleep mode: when the model's last replica fell asleep, and the idle gaps it sat out (most recent last):
    /// the sleeper budget weighs a sleeper by how often it is woken.
    asleep_since: Option<f64>,
    idle_gaps: Vec<f64>,
    /// The most replicas at once within the count decided, and the most over it at once: make-before-break
    /// surges (a move off a draining GPU, a roll, an isolation), counted apart so that "at most" never passes
    /// `max_replicas`.
    replicas_max: u32,
    surge_max: u32,
    /// The replica count the last decision applied (before a surge); the warm start's count before any.
    decided: u32,
    replica_seconds: f64,
    /// GPU memory its replicas reserved (what vLLM holds: weights, overhead, the KV cache), byte-seconds.
    memory_byte_seconds: f64,
    replica_count_since: f64,
    scale_changes: BTreeMap<String, u32>,
    /// Tessera's and the autoscaled baselines' rounds by what held the count (`core::scale::constraint`).
    held_by: BTreeMap<tessera_core::scale::constraint::Constraint, u32>,
    /// Tessera: what the next unit of latency capacity cost at the last decision.
    next_unit: Option<joint::NextUnit>,
    /// KubeAI / KEDA HTTP: their in-flight rule and its memory.
    concurrency: Option<(ConcurrencyRule, ConcurrencyState)>,
    /// Tessera: the last round asked for one replica over the decision to move a pod off a draining GPU
    /// (`core::pack::consolidate::move_step`), so the live count is one over what was decided.
    surging: bool,
    /// Tessera: the allocation in force and the roll in progress (`core::rollout`).
    allocation: rollout::AllocationState,
    /// Tessera: whether the model holds whole GPUs at its ceiling (`core::scale::isolation`).
    isolation: isolation::IsolationState,
}

/// One strategy's world.
#[derive(Debug)]
pub struct World<'a> {
    sc: &'a Scenario,
    plan: Plan,
    now: f64,
    seq: u64,
    heap: BinaryHeap<Queued>,
    replicas: Vec<Replica>,
    models: Vec<ModelRt>,
    active: Vec<bool>,
    packer: Option<Packer>,
    gpu_loading_until: BTreeMap<GpuId, f64>,
    gpu_empty_since: BTreeMap<GpuId, f64>,
    /// Sleep mode (packing strategies, models with a `sleep_wake`): the GPU each model at zero left its sleeping
    /// pod on, and the share it had there. A sleeping pod stays bound to its GPU (its CUDA context); every
    /// placement holds what it keeps there ([`World::held_asleep`]: its whole share, or with `lend_sleepers` its
    /// residue, the rest lent to a new replica where the alternative is opening a GPU,
    /// `Packer::place_beside_sleeping`). It wakes only where its full share fits again, and it goes when its GPU
    /// is given back; then its next start is a cold one.
    sleepers: BTreeMap<usize, (GpuId, ReplicaRequest)>,
    /// The replicas on each shared GPU (packing strategies): whose activity a step contends with.
    tenants: BTreeMap<GpuId, Vec<usize>>,
    whole_gpus: u32,
    gpu_seconds: f64,
    gpus_peak: u32,
    last_gpu_change: f64,
    mem_used_acc: f64,
    mem_reserved_acc: f64,
    compute_acc: f64,
    allocated_acc: f64,
    capacity_acc: f64,
    series: Series,
    last_series_at: f64,
    preemptions: u64,
    events: Vec<EngineEvent>,
    /// FNV-1a over (model, arrival) in the order the arrivals were processed.
    processed_digest: u64,
    processed: u64,
    /// Set by [`World::recording_decisions`].
    decisions: Option<Vec<observe::DecisionRecord>>,
    /// Set by [`World::recording_recommendations`].
    recommendations: Option<Vec<observe::RecommendationRecord>>,
    recommendations_limit: usize,
    /// Tessera: the pool's consolidation candidate (`core::pack::consolidate::pool_step`).
    candidate: Option<Candidate>,
    consolidation: ConsolidationReport,
    rollouts: RolloutReport,
    /// The batch jobs' side, when the plan runs them (`batch.rs`).
    batch: Option<batch::BatchRt>,
}

const CHART_POINTS: f64 = 720.0;
const TTFT_BUCKETS: f64 = 120.0;

impl<'a> World<'a> {
    /// A world for `plan` over `sc`, with the replicas each strategy starts with already warm at time 0.
    pub fn new(sc: &'a Scenario, plan: Plan) -> Result<World<'a>, SimError> {
        let n = sc.models.len();
        let interactive = plan.batch.is_none_or(|b| b.interactive);
        let active: Vec<bool> = (0..n)
            .map(|i| interactive && (plan.only_models.is_empty() || plan.only_models.contains(&i)))
            .collect();
        let batch = match (plan.batch, &sc.batch) {
            (Some(p), Some(setup)) => Some(batch::BatchRt::new(sc, setup, p.mode)),
            _ => None,
        };
        let packer = match plan.kind {
            k if k.packs() => {
                let mut shape = GpuShape::new(sc.gpu.memory_bytes / (1 << 20), sc.settings.gpu_headroom_mib)
                    .map_err(SimError::GpuShape)?;
                // HAMi's declared cores are a fixed split of the GPU; only Tessera's pool oversubscribes caps.
                if k == StrategyKind::Tessera {
                    shape = shape
                        .with_compute_oversubscription(sc.settings.compute_oversubscription())
                        .map_err(SimError::GpuShape)?;
                }
                Some(Packer::new(shape))
            }
            _ => None,
        };
        let models = sc
            .models
            .iter()
            .enumerate()
            .map(|(i, m)| ModelRt {
                policy: policy_for(plan.kind, m),
                state: ScaleState::default(),
                replicas: Vec::new(),
                held: VecDeque::new(),
                recent: VecDeque::new(),
                arrived: 0,
                rounds: 0,
                rounds_latency_on_share: 0,
                rounds_zero_within_budget: 0,
                rounds_prefill_bound: 0,
                rounds_behind_while_urgent: 0,
                warm_floor: None,
                mix: tessera_core::class::RequestMix::default(),
                class: None,
                last_request_at: None,
                next_arrival: 0,
                requests: vec![ReqState::default(); sc.arrivals[i].len()],
                rec: plan.initial_recommendations.get(i).cloned().flatten(),
                cold_starts: 0,
                starts_from_zero: 0,
                sleep_wakes: 0,
                sleepers_lost: 0,
                sleeps_at_zero: false,
                asleep_since: None,
                idle_gaps: Vec::new(),
                replicas_max: 0,
                surge_max: 0,
                decided: 0,
                replica_seconds: 0.0,
                memory_byte_seconds: 0.0,
                replica_count_since: 0.0,
                scale_changes: BTreeMap::new(),
                held_by: BTreeMap::new(),
                next_unit: None,
                concurrency: match plan.kind {
                    StrategyKind::Kubeai => Some((ConcurrencyRule::kubeai(), ConcurrencyState::default())),
                    StrategyKind::KedaHttp => {
                        Some((ConcurrencyRule::keda_http(), ConcurrencyState::default()))
                    }
                    _ => None,
                },
                surging: false,
                isolation: isolation::IsolationState::default(),
                allocation: rollout::AllocationState::starting(
                    plan.initial_recommendations.get(i).and_then(Option::as_ref),
                    m,
                ),
            })
            .collect();
        let mut w = World {
            sc,
            plan,
            now: 0.0,
            seq: 0,
            heap: BinaryHeap::new(),
            replicas: Vec::new(),
            models,
            active,
            packer,
            gpu_loading_until: BTreeMap::new(),
            gpu_empty_since: BTreeMap::new(),
            sleepers: BTreeMap::new(),
            tenants: BTreeMap::new(),
            whole_gpus: 0,
            gpu_seconds: 0.0,
            gpus_peak: 0,
            last_gpu_change: 0.0,
            mem_used_acc: 0.0,
            mem_reserved_acc: 0.0,
            compute_acc: 0.0,
            allocated_acc: 0.0,
            capacity_acc: 0.0,
            series: Series {
                replicas: vec![Vec::new(); n],
                ..Series::default()
            },
            last_series_at: f64::NEG_INFINITY,
            preemptions: 0,
            events: Vec::new(),
            processed_digest: 0xcbf2_9ce4_8422_2325,
            processed: 0,
            decisions: None,
            recommendations: None,
            recommendations_limit: 0,
            candidate: None,
            consolidation: ConsolidationReport::default(),
            rollouts: RolloutReport::default(),
            batch,
        };
        w.start_batch()?;
        for m in 0..n {
            if !w.active[m] {
                continue;
            }
            // Every strategy starts warm, as a cluster that has been running: static at its fixed count, the
            // autoscalers at one replica (Tessera then scales idle models to zero on its own rules).
            let initial = match w.plan.kind {
                k if k.fixed() => w.plan.static_replicas.get(m).copied().unwrap_or(1).max(1),
                StrategyKind::Tessera => sc.models[m].min_replicas.max(1),
                _ => 1,
            };
            for _ in 0..initial {
                let r = w.start_replica(m, true)?;
                w.replicas[r].phase = Phase::Ready;
            }
            if let Some(a) = sc.arrivals[m].first() {
                w.push(a.at, Ev::Arrival { model: m });
            }
        }
        w.push(0.0, Ev::Scrape);
        if !w.plan.kind.fixed() {
            w.push(sc.settings.sync_period.as_secs_f64(), Ev::Sync);
        }
        if w.plan.kind == StrategyKind::Tessera {
            w.push(sc.settings.recommend_interval.as_secs_f64(), Ev::Recommend);
        }
        Ok(w)
    }

    /// Schedules the periodic `ev` again `every` from now, unless that is past the scenario's end.
    fn again_within_run(&mut self, every: Duration, ev: Ev) {
        let next = self.now + every.as_secs_f64();
        if next <= self.sc.duration {
            self.push(next, ev);
        }
    }

    fn push(&mut self, at: f64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Queued {
            at,
            seq: self.seq,
            ev,
        });
    }

    /// Keeps every replica-count decision with the documents it was decided on (for the controller parity
    /// test; costs memory on long runs).
    pub fn recording_decisions(mut self) -> Self {
        self.decisions = Some(Vec::new());
        self
    }

    /// Keeps the first `limit` recommendations each ready replica's sidecar would make, with every `/metrics` page
    /// it would have scraped (for the recommendation parity test: the sidecar's own state, fed those pages, must
    /// recommend the same; costs a page per replica per scrape while recording).
    pub fn recording_recommendations(mut self, limit: usize) -> Self {
        self.recommendations = Some(Vec::with_capacity(limit));
        self.recommendations_limit = limit;
        self
    }

    /// Runs to the end (duration plus the drain allowance), reporting progress in virtual seconds.
    pub fn run(mut self, progress: &mut dyn FnMut(f64)) -> Result<RunResult, SimError> {
        let span =
            tracing::debug_span!("strategy", name = self.plan.kind.name(), models = ?self.plan.only_models);
        let _entered = span.enter();
        let duration = self.sc.duration;
        let hard_end = duration + self.sc.settings.request_timeout.as_secs_f64();
        let mut last_progress = 0.0;
        while let Some(q) = self.heap.pop() {
            if q.at > hard_end {
                break;
            }
            self.now = q.at;
            if self.now - last_progress >= 30.0 {
                last_progress = self.now;
                progress(self.now.min(duration));
            }
            match q.ev {
                Ev::Arrival { model } => self.on_arrival(model)?,
                Ev::Step { replica, generation } => self.on_step(replica, generation),
                Ev::Ready { replica } => self.on_ready(replica),
                Ev::Scrape => {
                    self.on_scrape();
                    self.again_within_run(self.sc.settings.scrape_interval, Ev::Scrape);
                }
                Ev::Sync => {
                    for m in 0..self.models.len() {
                        if self.active[m] {
                            self.scale_model(m)?;
                        }
                    }
                    self.batch_round()?;
                    self.again_within_run(self.sc.settings.sync_period, Ev::Sync);
                }
                Ev::BatchTick => self.on_batch_tick()?,
                Ev::BatchStep { own, generation } => self.on_batch_step(own, generation),
                Ev::BatchReady { own } => self.on_batch_ready(own),
                Ev::BatchReclaim { own } => self.on_batch_reclaim(own),
                Ev::Recommend => {
                    self.on_recommend();
                    self.again_within_run(self.sc.settings.recommend_interval, Ev::Recommend);
                }
            }
        }
        progress(duration);
        self.now = self.now.max(duration);
        let out = self.finish();
        tracing::debug!(
            gpu_hours = out.report.gpu_hours,
            slo_attainment = out.report.slo_attainment,
            cold_starts = out.report.cold_starts,
            "strategy run done"
        );
        Ok(out)
    }

    fn gpus_held(&self) -> u32 {
        match &self.packer {
            Some(p) => p.gpus().count() as u32,
            None => self.whole_gpus,
        }
    }

    /// Accrues GPU-seconds up to now (capped at the duration) before the count changes.
    fn account_gpus(&mut self) {
        let until = self.now.min(self.sc.duration);
        if until > self.last_gpu_change {
            self.gpu_seconds += f64::from(self.gpus_held()) * (until - self.last_gpu_change);
            self.last_gpu_change = until;
        }
    }

    fn account_replicas(&mut self, m: usize) {
        let until = self.now.min(self.sc.duration);
        let live = self.live_count(m);
        let rt = &mut self.models[m];
        if until > rt.replica_count_since {
            rt.replica_seconds += f64::from(live) * (until - rt.replica_count_since);
            rt.replica_count_since = until;
        }
    }

    /// Model `m`'s replicas starting or ready (what `/scale` counts), in start order.
    fn live(&self, m: usize) -> Vec<usize> {
        self.models[m]
            .replicas
            .iter()
            .copied()
            .filter(|&r| matches!(self.replicas[r].phase, Phase::Starting | Phase::Ready))
            .collect()
    }

    /// Schedules replica `r`'s next step end, if its engine has one; a new generation makes older step
    /// events for it stale.
    fn schedule_step(&mut self, r: usize) -> bool {
        let rep = &mut self.replicas[r];
        let Some(t) = rep.engine.next_event_time() else {
            return false;
        };
        rep.generation += 1;
        let generation = rep.generation;
        self.push(
            t,
            Ev::Step {
                replica: r,
                generation,
            },
        );
        true
    }

    fn live_count(&self, m: usize) -> u32 {
        self.models[m]
            .replicas
            .iter()
            .filter(|&&r| self.replicas[r].phase != Phase::Gone)
            .count() as u32
    }

    /// The engine configuration and packing request for a new replica of model `m` under this strategy.
    fn replica_config(&self, m: usize) -> (EngineConfig, f64) {
        let setup = &self.sc.models[m];
        let mut cfg = EngineConfig::vllm_defaults(&self.sc.gpu);
        cfg.max_model_len = setup.max_model_len;
        cfg.sharing = self.sc.settings.sharing_model;
        if self.plan.kind == StrategyKind::HamiStatic {
            // The declared memory holds weights, activations and the KV cache; the rest of the GPU is others'.
            let declared = self.hami_declared_mib(m) << 20;
            let kv = declared.saturating_sub(setup.spec.weights_bytes + setup.spec.overhead_bytes);
            cfg.memory = MemorySetting::KvCacheBytes(kv.max(1));
            cfg.compute_fraction = setup.hami.cores;
            return (cfg, setup.hami.cores);
        }
        if self.plan.kind != StrategyKind::Tessera {
            return (cfg, 1.0);
        }
        // What the webhook gives a new pod: the allocation in force (`core::rollout`, the policy's fixed values
        // applied), else vLLM's defaults and the fixed share.
        let in_force = self.models[m].allocation.in_force;
        if let Some(b) = in_force.and_then(|a| a.kv_cache_memory_bytes) {
            cfg.memory = MemorySetting::KvCacheBytes(b);
        }
        let fraction = in_force.map_or_else(
            || rollout::fixed_of(setup).compute_fraction.unwrap_or(1.0),
            |a| a.compute_fraction,
        );
        // Isolated at its ceiling: the whole GPU's SMs.
        let fraction = if self.placed_alone(m) { 1.0 } else { fraction };
        cfg.compute_fraction = fraction;
        (cfg, fraction)
    }

    /// The memory a HAMi user declares for model `m`: its share of what a GPU can hold besides the headroom
    /// (so two halves fit one GPU, as `gpumem-percentage: 50` does).
    fn hami_declared_mib(&self, m: usize) -> u64 {
        let usable = (self.sc.gpu.memory_bytes >> 20).saturating_sub(self.sc.settings.gpu_headroom_mib);
        (usable as f64 * self.sc.models[m].hami.memory_fraction).floor() as u64
    }

    /// Creates a replica of model `m`: places it (Tessera) or takes a whole GPU, and schedules its readiness.
    fn start_replica(&mut self, m: usize, warm: bool) -> Result<usize, SimError> {
        let setup = &self.sc.models[m];
        let (cfg, fraction) = self.replica_config(m);
        let engine =
            Engine::new(setup.spec.clone(), self.sc.gpu.clone(), cfg).map_err(|source| SimError::Engine {
                model: setup.name.clone(),
                source,
            })?;
        let idx = self.replicas.len();
        let name = format!("{}-{idx}", setup.name);
        let from_zero = self.live_count(m) == 0;
        self.account_gpus();
        self.account_replicas(m);
        let memory = MemoryFacts {
            gpu_total_bytes: Some(self.sc.gpu.memory_bytes),
            bytes_per_kv_token: Some(setup.spec.bytes_per_kv_token),
            non_kv_bytes: Some(setup.spec.weights_bytes + setup.spec.overhead_bytes),
            process_gpu_bytes: Some(engine.gpu_memory_used_bytes()),
            gpu_memory_utilization: match engine.config().memory {
                MemorySetting::GpuMemoryUtilization(u) => Some(u),
                MemorySetting::KvCacheBytes(_) => None,
            },
            kv_cache_memory_bytes: match engine.config().memory {
                MemorySetting::KvCacheBytes(b) => Some(b),
                MemorySetting::GpuMemoryUtilization(_) => None,
            },
            ..Default::default()
        };
        let pod_start = self.sc.settings.pod_start.as_secs_f64();
        let ready_at;
        let mut placed = None;
        // HAMi reserves the declared memory whatever vLLM uses of it.
        let mib = match self.plan.kind {
            StrategyKind::HamiStatic => self.hami_declared_mib(m),
            // Isolated at its ceiling: the whole GPU, so nothing is placed beside it.
            _ if self.placed_alone(m) => self.packer.as_ref().map_or(0, |p| p.shape().usable_memory_mib()),
            _ => engine.gpu_memory_used_bytes().div_ceil(1 << 20),
        };
        if self.packer.is_some() {
            if from_zero {
                self.note_idle_gap(m);
            }
            let others_asleep = self.held_asleep(Some(m));
            let all_asleep = self.held_asleep(None);
            let residue = self.sc.settings.sleep_residue_mib;
            let lend = self.sc.settings.lend_sleepers;
            let Some(packer) = self.packer.as_mut() else {
                unreachable!("checked above")
            };
            // Reserved as the webhook reserves it (`core::pack::compute_milli`).
            let milli = compute_milli(fraction).unwrap_or(tessera_core::pack::GPU_COMPUTE_MILLI);
            let request = ReplicaRequest::new(name.clone(), setup.name.clone(), milli, mib);
            // Sleep mode: a model at zero left a sleeping pod whose weights sit in host memory. It wakes on its
            // own GPU, skipping the pod start and the load, if its share fits there again (beside the other
            // sleepers' residue); otherwise the pod is replaced by a new one wherever the packer finds room,
            // started cold.
            let sleeper = match (from_zero, setup.sleep_wake_secs) {
                (true, Some(wake)) => self.sleepers.remove(&m).map(|(g, _)| (g, wake)),
                _ => None,
            };
            let woke = sleeper.and_then(|(g, wake)| {
                packer.with_held(others_asleep, |packer| {
                    let room = packer.gpu(g).is_some_and(|s| !s.is_draining());
                    (room && packer.assign(g, request.clone()).is_ok()).then_some((g, wake))
                })
            });
            match (sleeper, woke) {
                (_, Some(_)) => self.models[m].sleep_wakes += 1,
                (Some(_), None) => self.models[m].sleepers_lost += 1,
                (None, None) => {}
            }
            let g = match woke {
                Some((g, _)) => g,
                // With lending, a sleeping pod's room beyond its residue is lent only where the alternative is
                // opening a GPU (`core::pack`); without, its whole share is held and nothing is lent.
                None => {
                    let sleeping: Vec<(GpuId, ReplicaRequest)> = self
                        .sleepers
                        .iter()
                        .filter(|_| lend)
                        .map(|(m, (g, share))| {
                            let mut share = share.clone();
                            share.id = format!("asleep/{m}");
                            share.memory_mib = share.memory_mib.saturating_sub(residue);
                            (*g, share)
                        })
                        .collect();
                    packer
                        .with_held(all_asleep, |packer| {
                            packer.place_beside_sleeping(request, sleeping)
                        })
                        .map_err(|source| SimError::Pack {
                            model: setup.name.clone(),
                            source,
                        })?
                }
            };
            self.gpu_empty_since.remove(&g);
            placed = Some(g);
            let (begin, load) = match woke {
                Some((_, wake)) => (self.now, wake),
                None => (self.now + pod_start, setup.load_secs),
            };
            // One replica loads at a time per GPU (vLLM profiles free memory at start-up).
            let lease_free = self.gpu_loading_until.get(&g).copied().unwrap_or(0.0);
            ready_at = begin.max(lease_free) + load;
            self.gpu_loading_until.insert(g, ready_at);
        } else {
            self.whole_gpus += 1;
            ready_at = self.now + pod_start + setup.load_secs;
        }
        self.gpus_peak = self.gpus_peak.max(self.gpus_held());
        // On a shared GPU the sidecar has no reading of the replica's own memory ([`Replica::gpu_shared`]).
        let memory = MemoryFacts {
            process_gpu_bytes: memory.process_gpu_bytes.filter(|_| placed.is_none()),
            ..memory
        };
        self.replicas.push(Replica {
            model: m,
            name,
            engine,
            phase: Phase::Starting,
            compute_fraction: fraction,
            generation: 0,
            observations: Vec::new(),
            last_busy: 0.0,
            scrapes: VecDeque::new(),
            pages: VecDeque::new(),
            memory,
            gpu: placed,
            allocation: match self.plan.kind {
                StrategyKind::Tessera => self.models[m].allocation.in_force,
                _ => None,
            },
        });
        if let Some(g) = placed {
            self.tenants.entry(g).or_default().push(idx);
        }
        self.models[m].replicas.push(idx);
        let live = self.live_count(m);
        let rt = &mut self.models[m];
        if warm {
            rt.decided = rt.decided.max(live);
        }
        let counted = live.min(rt.decided);
        rt.replicas_max = rt.replicas_max.max(counted);
        rt.surge_max = rt.surge_max.max(live - counted);
        if !warm {
            rt.cold_starts += 1;
            if from_zero {
                rt.starts_from_zero += 1;
            }
            self.push(ready_at, Ev::Ready { replica: idx });
        }
        Ok(idx)
    }

    fn stop_replica(&mut self, r: usize) {
        if self.replicas[r].phase == Phase::Gone {
            return;
        }
        let m = self.replicas[r].model;
        self.account_gpus();
        self.account_replicas(m);
        self.replicas[r].phase = Phase::Gone;
        if let Some(g) = self.replicas[r].gpu
            && let Some(t) = self.tenants.get_mut(&g)
        {
            t.retain(|&x| x != r);
        }
        if let Some(packer) = self.packer.as_mut() {
            let name = self.replicas[r].name.clone();
            if let Some((g, share)) = packer.remove(&name) {
                if packer.gpu(g).is_some_and(|s| s.is_empty()) {
                    self.gpu_empty_since.insert(g, self.now);
                }
                // The model's last replica goes to sleep on its GPU rather than away, where its round said so
                // and the GPU's sleeper budget admits it (`sleep.rs`).
                if self.live_count(m) == 0 {
                    self.fall_asleep(m, g, share);
                }
            }
        } else {
            self.whole_gpus = self.whole_gpus.saturating_sub(1);
        }
    }

    fn on_arrival(&mut self, m: usize) -> Result<(), SimError> {
        let i = self.models[m].next_arrival;
        self.models[m].next_arrival += 1;
        if let Some(next) = self.sc.arrivals[m].get(i + 1) {
            self.push(next.at, Ev::Arrival { model: m });
        }
        let a = self.sc.arrivals[m][i];
        for b in (m as u64)
            .to_le_bytes()
            .iter()
            .chain(&a.at.to_bits().to_le_bytes())
            .chain(&a.prompt_tokens.to_le_bytes())
            .chain(&a.output_tokens.to_le_bytes())
        {
            self.processed_digest =
                (self.processed_digest ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        self.processed += 1;
        let rt = &mut self.models[m];
        rt.recent.push_back(self.now);
        rt.arrived += 1;
        // The activator counts the prompt's length in bytes; a trace holds tokens, about four bytes each in
        // English text. Whether a request streamed is not in the traces: left uncounted, as the activator leaves
        // a body that does not say.
        rt.mix.count(
            tessera_core::class::Lane::Default,
            None,
            Some((a.prompt_tokens as usize).saturating_mul(4)),
        );
        rt.last_request_at = Some(self.now);
        if !self.route(m, i) {
            self.models[m].held.push_back(i);
            // The activator pokes the autoscaler at once when a request finds no replica (a wake-up), rather
            // than waiting for the next sync.
            if self.live_count(m) == 0 && self.plan.kind.wakes_from_zero() {
                self.scale_model(m)?;
            }
        }
        Ok(())
    }

    /// Sends request `i` of model `m` to its least-outstanding ready replica. False when none is ready.
    fn route(&mut self, m: usize, i: usize) -> bool {
        let best = self.models[m]
            .replicas
            .iter()
            .copied()
            .filter(|&r| self.replicas[r].phase == Phase::Ready)
            .min_by_key(|&r| (self.replicas[r].engine.in_flight(), r));
        let Some(r) = best else { return false };
        let a = self.sc.arrivals[m][i];
        let id = ((m as u64) << 32) | i as u64;
        self.tell_neighbours(r);
        let rep = &mut self.replicas[r];
        let was_idle = rep.engine.next_event_time().is_none();
        // As vLLM 0.32's API: the trace's output length, capped at what the prompt leaves of max_model_len.
        let max_tokens =
            capped_max_tokens(rep.engine.max_model_len(), a.prompt_tokens, Some(a.output_tokens));
        if max_tokens
            .and_then(|t| {
                rep.engine
                    .submit(Request::new(id, a.prompt_tokens, t), self.now)
                    .ok()
            })
            .is_none()
        {
            // vLLM answers 400 (a prompt with no room left in max_model_len): the request fails, no replica is
            // blamed.
            let st = &mut self.models[m].requests[i];
            st.failed = true;
            return true;
        }
        if was_idle {
            self.schedule_step(r);
        }
        true
    }

    fn on_step(&mut self, r: usize, generation: u64) {
        if self.replicas[r].generation != generation || self.replicas[r].phase == Phase::Gone {
            return;
        }
        let now = self.now;
        self.tell_neighbours(r);
        let mut events = std::mem::take(&mut self.events);
        events.clear();
        self.replicas[r].engine.advance(now, &mut |e| {
            if !matches!(e, EngineEvent::Token { .. }) {
                events.push(e);
            }
        });
        let m = self.replicas[r].model;
        let mut gave_up = Vec::new();
        for e in &events {
            match *e {
                EngineEvent::Finished { id, .. } if id & BATCH_BIT != 0 => {
                    self.batch_line_done_on_spare(r, id)
                }
                EngineEvent::FirstToken { id, .. } if id & BATCH_BIT != 0 => {}
                EngineEvent::FirstToken { id, at, .. } => {
                    let i = (id & 0xffff_ffff) as usize;
                    // What the client sees counts from its arrival at the gateway (activator hold included);
                    // the replica's own histogram, which its sidecar reports, counts from when vLLM got it.
                    let arrival = self.sc.arrivals[m][i].at;
                    if at - arrival > self.client_timeout() {
                        // Its client gave up before this token came (between two scrapes' checks).
                        gave_up.push(id);
                    } else {
                        self.models[m].requests[i].ttft = Some(at - arrival);
                    }
                }
                EngineEvent::Finished { id, .. } => {
                    let i = (id & 0xffff_ffff) as usize;
                    self.models[m].requests[i].done = true;
                }
                EngineEvent::Preempted { .. } => self.preemptions += 1,
                EngineEvent::Token { .. } => {}
            }
        }
        self.events = events;
        for id in gave_up {
            self.give_up(r, id);
        }
        // A draining replica whose engine has nothing left to step stops.
        if !self.schedule_step(r)
            && self.replicas[r].phase == Phase::Draining
            && self.replicas[r].engine.is_idle()
        {
            self.stop_replica(r);
        }
    }

    /// Tells replica `r`'s engine what the other tenants of its GPU are doing right now, so the step it starts
    /// next is timed against them (the sharing model's contention).
    fn tell_neighbours(&mut self, r: usize) {
        let Some(g) = self.replicas[r].gpu else { return };
        let n = self
            .tenants
            .get(&g)
            .map_or(&[][..], Vec::as_slice)
            .iter()
            .filter(|&&o| o != r)
            .filter_map(|&o| self.replicas[o].engine.load())
            .collect();
        self.replicas[r].engine.set_neighbours(Neighbours(n));
    }

    fn on_ready(&mut self, r: usize) {
        if self.replicas[r].phase != Phase::Starting {
            return;
        }
        self.replicas[r].phase = Phase::Ready;
        self.replicas[r].last_busy = self.replicas[r].engine.stats().busy_time_s;
        let m = self.replicas[r].model;
        while let Some(i) = self.models[m].held.pop_front() {
            self.models[m].requests[i].held = self.now - self.sc.arrivals[m][i].at;
            if !self.route(m, i) {
                self.models[m].held.push_front(i);
                break;
            }
        }
    }

    fn on_scrape(&mut self) {
        let now = self.now;
        let dt = self.sc.settings.scrape_interval.as_secs_f64();
        let mut used = 0.0;
        let mut reserved = 0.0;
        let mut busy = 0.0;
        let mut allocated = 0.0;
        // Snapshots go back to the longer of the sidecar's TTFT window and the recommendation window.
        let rec_horizon = now
            - self
                .sc
                .settings
                .recommend_window
                .max(self.sc.settings.ttft_window)
                .as_secs_f64();
        let counting = now < self.sc.duration;
        let recording = self
            .recommendations
            .as_ref()
            .is_some_and(|r| r.len() < self.recommendations_limit);
        for rep in self.replicas.iter_mut().filter(|r| r.phase != Phase::Gone) {
            let st = rep.engine.stats();
            let spec = rep.engine.model();
            let block_bytes = spec.bytes_per_kv_token * u64::from(rep.engine.config().block_size);
            let holds = rep.engine.gpu_memory_used_bytes() as f64;
            reserved += holds;
            if counting {
                self.models[rep.model].memory_byte_seconds += holds * dt;
            }
            allocated += rep.compute_fraction;
            used += (spec.weights_bytes + spec.overhead_bytes + st.kv_blocks_used * block_bytes) as f64;
            if rep.phase == Phase::Starting {
                continue;
            }
            // The engine books a step's whole duration when it starts, so a window can see a little more than
            // its length. NVML's per-process SM utilization is the share of time a kernel of the process was
            // running: under an MPS share the kernels run all through a (stretched) step, so it is the busy
            // share of time, not scaled by the compute share. Scaling it would cap what a fractional replica can
            // ever show at its own share, and the recommendation could never grow it back.
            let sm = ((st.busy_time_s - rep.last_busy) / dt).clamp(0.0, 1.0);
            rep.last_busy = st.busy_time_s;
            // The GPU capacity it occupied: busy time at its share.
            busy += sm * rep.compute_fraction;
            let own_busy = (!rep.gpu_shared()).then_some(sm);
            rep.observations.push(Observation {
                at_secs: now,
                kv_usage: Some(st.kv_usage),
                requests_waiting: Some(st.waiting as f64),
                preemptions_total: Some(st.num_preemptions as f64),
                sm_utilization: own_busy,
            });
            rep.scrapes.push_back(Scrape {
                at: now,
                snapshot: SnapshotSummary {
                    at: now,
                    kv_cache_usage_ratio: Some(st.kv_usage),
                    requests_running: Some(st.running as f64),
                    requests_waiting: Some(st.waiting as f64),
                    preemptions_total: Some(st.num_preemptions as f64),
                    ..SnapshotSummary::default()
                },
                ttft: st.ttft.clone(),
                itl: st.itl.clone(),
                queue: st.queue_time.clone(),
            });
            // Keep one snapshot at or before the window's start, the base of the window's difference.
            while rep.scrapes.get(1).is_some_and(|s| s.at <= rec_horizon) {
                rep.scrapes.pop_front();
            }
            if recording {
                rep.pages.push_back(observe::Page {
                    at: now,
                    text: crate::emulator::page_of(&rep.engine, &self.sc.models[rep.model].name),
                    busy: own_busy,
                });
                while rep.pages.get(1).is_some_and(|p| p.at <= rec_horizon) {
                    rep.pages.pop_front();
                }
            }
        }
        if now < self.sc.duration {
            let held = f64::from(self.gpus_held());
            let cap = held * self.sc.gpu.memory_bytes as f64;
            self.mem_used_acc += used;
            self.mem_reserved_acc += reserved;
            self.compute_acc += busy;
            self.allocated_acc += allocated;
            self.capacity_acc += if cap > 0.0 { held } else { 0.0 };
        }
        // Requests held at the activator for too long fail (the client gives up; KEDA's interceptor gives up
        // after its condition-wait timeout).
        let timeout = match self.plan.kind {
            StrategyKind::KedaHttp => KEDA_HOLD_TIMEOUT_S,
            _ => self.sc.settings.request_timeout.as_secs_f64(),
        };
        for m in 0..self.models.len() {
            while let Some(&i) = self.models[m].held.front() {
                if now - self.sc.arrivals[m][i].at < timeout {
                    break;
                }
                self.models[m].held.pop_front();
                self.models[m].requests[i].failed = true;
            }
            self.give_up_on_first_tokens(m);
            let horizon = now - self.sc.settings.rate_window.as_secs_f64();
            while self.models[m].recent.front().is_some_and(|&t| t < horizon) {
                self.models[m].recent.pop_front();
            }
        }
        self.consolidate();
        // Capacity pods give back GPUs that stayed empty for the grace period.
        // The pool manager's rule (`core::pack::empty_gpu`).
        let grace = self.sc.settings.gpu_release_grace;
        let secs = Duration::from_secs_f64;
        let expired: Vec<GpuId> = self
            .gpu_empty_since
            .iter()
            .filter(|&(_, &since)| empty_gpu(Some(secs(since)), secs(now), grace) == EmptyGpu::Release)
            .map(|(&g, _)| g)
            .collect();
        for g in expired {
            self.account_gpus();
            if let Some(p) = self.packer.as_mut()
                && p.gpu(g).is_some_and(|s| s.is_empty())
            {
                p.remove_gpu(g);
                self.gpu_loading_until.remove(&g);
                // A capacity pod given back takes its sleeping pods with it: their next start is cold.
                let gone: Vec<usize> = self
                    .sleepers
                    .iter()
                    .filter(|(_, (on, _))| *on == g)
                    .map(|(&m, _)| m)
                    .collect();
                for m in gone {
                    self.sleepers.remove(&m);
                    self.models[m].sleepers_lost += 1;
                }
            }
            self.gpu_empty_since.remove(&g);
        }
        // Chart samples.
        let every = (self.sc.duration / CHART_POINTS).max(dt);
        if now - self.last_series_at >= every - 1e-9 && now <= self.sc.duration {
            self.last_series_at = now;
            self.series.t.push(now);
            self.series.gpus.push(self.gpus_held());
            for m in 0..self.models.len() {
                let live = self.live_count(m);
                self.series.replicas[m].push(live);
            }
        }
    }
}

/// Virtual seconds as the milliseconds the activator's documents and the decision's timestamps carry.
impl World<'_> {
    /// How long a client waits for its first token before it gives up (`request_timeout`): a streaming client's
    /// read timeout. It counts from the arrival at the gateway, wherever the request waits — held at the activator
    /// or queued and prefilling in a replica's vLLM — so no request reports a TTFT longer than any client waits.
    fn client_timeout(&self) -> f64 {
        self.sc.settings.request_timeout.as_secs_f64()
    }

    /// The clients of model `m` whose requests sit in a replica's vLLM without a first token for the client
    /// timeout give up: each disconnects, vLLM aborts its request (freeing its place and its KV blocks), and it
    /// fails.
    fn give_up_on_first_tokens(&mut self, m: usize) {
        let (now, timeout) = (self.now, self.client_timeout());
        let replicas: Vec<usize> = self.models[m]
            .replicas
            .iter()
            .copied()
            .filter(|&r| matches!(self.replicas[r].phase, Phase::Ready | Phase::Draining))
            .collect();
        for r in replicas {
            let late: Vec<u64> = self.replicas[r]
                .engine
                .awaiting_first_token()
                .filter(|id| id & BATCH_BIT == 0)
                .filter(|&id| now - self.sc.arrivals[m][(id & 0xffff_ffff) as usize].at >= timeout)
                .collect();
            for id in late {
                self.give_up(r, id);
            }
        }
    }

    /// Request `id` on replica `r` fails: its client went away, and vLLM aborts it.
    fn give_up(&mut self, r: usize, id: u64) {
        let m = self.replicas[r].model;
        self.replicas[r].engine.abort(id, self.now);
        let st = &mut self.models[m].requests[(id & 0xffff_ffff) as usize];
        st.failed = true;
        st.ttft = None;
    }
}

fn secs_to_ms(secs: f64) -> u64 {
    (secs * 1000.0).round().max(0.0) as u64
}
