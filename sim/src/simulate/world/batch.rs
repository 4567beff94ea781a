//! Batch jobs in a strategy run: how their lines reach a GPU under each way of running them
//! ([`BatchMode`]), with the rules the real system uses.
//!
//! - **Paced** (Tessera): lines fill the spare room of the model's interactive replicas through the activator's
//!   flex-lane gate (`tessera_core::lanes::admit_flex`, read once per lane poll, one line per backend per read as
//!   the activator's "unseen" count allows); every sync, the pacing rule (`tessera_core::batch::pace`) decides
//!   whether the job needs replicas of its own and on which capacity type. Spot replicas are reclaimed on an
//!   exponential clock; their lines in flight go back to the queue.
//! - **Dedicated**: a pool of reliable GPUs held all day for batch work, serving the jobs earliest deadline first.
//! - **At submit**: each job starts, when it is submitted, the reliable replicas that finish it by its deadline
//!   (sized by the same pacing rule with no spare room and no measuring), and gives them back when done.
//! - **Greedy spot**: each job takes every spot GPU it can when submitted (and again when reclaimed ones come
//!   back), with no reliable fallback.
//!
//! A line is an engine request whose id carries [`BATCH_BIT`]; what the interactive side counts (requests, TTFT
//! attainment) never includes one, but the replicas' vLLM gauges and histograms do, as vLLM's own would.
//! Simplification, said in `docs/batch.md`: lines sent through the flex lane do not keep an idle model from
//! scaling to zero (the activator counts them as requests in a cluster).

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_core::batch::{CapacityOffer, MEASURE_SPARE, PaceAction, PaceInput, pace};
use tessera_core::lanes::{BackendRoom, LaneLimits, Tenant, admit_flex, neighbour_pressures, ttft_pressure};

use super::super::batch_jobs::{BatchSetup, Job};
use super::*;

/// Marks a batch line's engine request id: `BATCH_BIT | job << 32 | line`.
pub const BATCH_BIT: u64 = 1 << 63;
/// The activator's default `--lane-poll-interval`.
const LANE_POLL_S: f64 = 0.2;
/// How far back the spare room's rate is measured.
const SPARE_WINDOW_S: f64 = 300.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OwnPhase {
    Starting,
    Ready,
    Draining,
    Gone,
}

/// A replica of the batch's own: a whole GPU of one capacity type.
#[derive(Debug)]
struct Own {
    /// The job it serves (`None`: the dedicated pool, serving any).
    job: Option<usize>,
    offer: usize,
    engine: Engine,
    phase: OwnPhase,
    since: f64,
    until: Option<f64>,
    generation: u64,
    lines: Vec<u64>,
}

#[derive(Debug, Default)]
struct JobRt {
    started: bool,
    next_line: u64,
    /// Lines to send again (a reclaim lost them).
    returned: Vec<u64>,
    done: u64,
    finished_at: Option<f64>,
    spare_done: VecDeque<f64>,
    on_spare: u64,
    on_own: u64,
    resent: u64,
}

/// The batch side of a world.
#[derive(Debug)]
pub(super) struct BatchRt {
    setup: BatchSetup,
    mode: BatchMode,
    jobs: Vec<JobRt>,
    own: Vec<Own>,
    /// Per offer: when each reclaimed GPU comes back.
    back_at: Vec<Vec<f64>>,
    rng: ChaCha8Rng,
    lanes: LaneLimits,
    /// Per job: lines per second one replica of its own answers (a probe run of the same engine).
    per_replica: Vec<f64>,
    /// Lines in flight in each interactive replica's spare room.
    spare: BTreeMap<usize, Vec<u64>>,
    /// Each interactive replica's neighbours' TTFT pressure, refreshed each sync (`refresh_neighbours`), and when.
    neighbours: BTreeMap<usize, f64>,
    neighbours_at: f64,
    reclaims: u64,
    paced_adds: u64,
}

fn line_id(job: usize, line: u64) -> u64 {
    BATCH_BIT | ((job as u64) << 32) | line
}

fn job_of(id: u64) -> usize {
    ((id & !BATCH_BIT) >> 32) as usize
}

/// Lines per second one whole-GPU replica of `job`'s model answers, kept full: the same engine, run on a sample.
fn probe_rate(sc: &Scenario, job: &Job) -> f64 {
    let setup = &sc.models[job.model];
    let mut cfg = EngineConfig::vllm_defaults(&sc.gpu);
    cfg.max_model_len = setup.max_model_len;
    let Ok(mut engine) = Engine::new(setup.spec.clone(), sc.gpu.clone(), cfg) else {
        return 0.0;
    };
    let n = job.lines.min(u64::from(engine.config().max_num_seqs) * 2).max(1);
    for i in 0..n {
        if engine
            .submit(Request::new(i, job.prompt_tokens, job.output_tokens), 0.0)
            .is_err()
        {
            return 0.0;
        }
    }
    let mut end = 0.0;
    while let Some(t) = engine.next_event_time() {
        end = t;
        engine.advance(t, &mut |_| {});
    }
    if end > 0.0 { n as f64 / end } else { 0.0 }
}

impl BatchRt {
    pub(super) fn new(sc: &Scenario, setup: &BatchSetup, mode: BatchMode) -> BatchRt {
        BatchRt {
            per_replica: setup.jobs.iter().map(|j| probe_rate(sc, j)).collect(),
            jobs: setup.jobs.iter().map(|_| JobRt::default()).collect(),
            back_at: vec![Vec::new(); setup.offers.len()],
            setup: setup.clone(),
            mode,
            own: Vec::new(),
            rng: ChaCha8Rng::seed_from_u64(sc.seed ^ 0xba7c_4000),
            lanes: LaneLimits::default(),
            spare: BTreeMap::new(),
            neighbours: BTreeMap::new(),
            neighbours_at: 0.0,
            reclaims: 0,
            paced_adds: 0,
        }
    }

    fn first_submit(&self) -> f64 {
        self.setup
            .jobs
            .iter()
            .map(|j| j.submit_at)
            .fold(f64::INFINITY, f64::min)
    }

    fn active(&self, j: usize) -> bool {
        self.jobs[j].started && self.jobs[j].finished_at.is_none()
    }

    fn has_unsent(&self, j: usize) -> bool {
        !self.jobs[j].returned.is_empty() || self.jobs[j].next_line < self.setup.jobs[j].lines
    }

    fn take_line(&mut self, j: usize) -> Option<u64> {
        let rt = &mut self.jobs[j];
        if let Some(l) = rt.returned.pop() {
            return Some(l);
        }
        (rt.next_line < self.setup.jobs[j].lines).then(|| {
            rt.next_line += 1;
            rt.next_line - 1
        })
    }

    /// A line of job `j`'s KV footprint: its prompt and its `max_tokens`.
    fn footprint(&self, j: usize) -> u64 {
        let job = &self.setup.jobs[j];
        u64::from(job.prompt_tokens) + u64::from(job.output_tokens)
    }

    fn request(&self, j: usize, line: u64) -> Request {
        let job = &self.setup.jobs[j];
        Request::new(line_id(j, line), job.prompt_tokens, job.output_tokens)
    }

    /// GPUs of `offer` that can be had now, besides the ones running.
    fn available(&self, offer: usize, now: f64) -> u32 {
        let running = self
            .own
            .iter()
            .filter(|o| o.offer == offer && matches!(o.phase, OwnPhase::Starting | OwnPhase::Ready))
            .count() as u32;
        let away = self.back_at[offer].iter().filter(|&&t| t > now).count() as u32;
        self.setup.offers[offer].available.saturating_sub(running + away)
    }

    /// Active jobs, earliest deadline first.
    fn by_deadline(&self) -> Vec<usize> {
        let mut js: Vec<usize> = (0..self.jobs.len()).filter(|&j| self.active(j)).collect();
        js.sort_by(|a, b| {
            self.setup.jobs[*a]
                .deadline
                .total_cmp(&self.setup.jobs[*b].deadline)
        });
        js
    }

    /// Counts a finished line.
    fn line_done(&mut self, id: u64, now: f64, on_spare: bool) {
        let j = job_of(id);
        let Some(rt) = self.jobs.get_mut(j) else { return };
        rt.done += 1;
        if on_spare {
            rt.on_spare += 1;
            rt.spare_done.push_back(now);
        } else {
            rt.on_own += 1;
        }
        if rt.done >= self.setup.jobs[j].lines && rt.finished_at.is_none() {
            rt.finished_at = Some(now);
        }
    }

    /// The outcome at the end of the run (`end`: the scenario's end; billing stops there).
    pub(super) fn outcome(&self, end: f64) -> BatchOutcome {
        let mut own: Vec<(String, f64, f64)> = self
            .setup
            .offers
            .iter()
            .map(|o| (o.name.clone(), 0.0, 0.0))
            .collect();
        for o in &self.own {
            let hours = (o.until.unwrap_or(end).min(end) - o.since).max(0.0) / 3600.0;
            own[o.offer].1 += hours;
            own[o.offer].2 += hours * self.setup.offers[o.offer].price_per_gpu_hour;
        }
        own.retain(|o| o.1 > 0.0);
        BatchOutcome {
            mode: self.mode.name(),
            jobs: self
                .setup
                .jobs
                .iter()
                .zip(&self.jobs)
                .map(|(j, rt)| JobOutcome {
                    name: j.name.clone(),
                    done: rt.done,
                    lines: j.lines,
                    finished_at: rt.finished_at,
                    deadline: j.deadline,
                    on_spare: rt.on_spare,
                    on_own: rt.on_own,
                    resent: rt.resent,
                })
                .collect(),
            own,
            reclaims: self.reclaims,
            paced_adds: self.paced_adds,
        }
    }
}

impl World<'_> {
    /// Sets the batch side up at the start of a run: the dedicated pool warm, the first tick at the first submit.
    pub(super) fn start_batch(&mut self) -> Result<(), SimError> {
        let Some(b) = self.batch.as_mut() else {
            return Ok(());
        };
        let first = b.first_submit();
        if let BatchMode::Dedicated(n) = b.mode {
            let reliable = b.setup.reliable;
            for _ in 0..n {
                let o = self.start_own(None, reliable)?;
                if let Some(b) = self.batch.as_mut() {
                    b.own[o].phase = OwnPhase::Ready;
                }
            }
        }
        if first.is_finite() {
            self.push(first, Ev::BatchTick);
        }
        Ok(())
    }

    /// Starts a replica of the batch's own on `offer` for `job` (`None`: the dedicated pool).
    fn start_own(&mut self, job: Option<usize>, offer: usize) -> Result<usize, SimError> {
        let model = match (job, self.batch.as_ref()) {
            (Some(j), Some(b)) => b.setup.jobs[j].model,
            (None, Some(b)) => b.setup.jobs.first().map_or(0, |j| j.model),
            _ => 0,
        };
        let setup = &self.sc.models[model];
        let mut cfg = EngineConfig::vllm_defaults(&self.sc.gpu);
        cfg.max_model_len = setup.max_model_len;
        let engine =
            Engine::new(setup.spec.clone(), self.sc.gpu.clone(), cfg).map_err(|source| SimError::Engine {
                model: setup.name.clone(),
                source,
            })?;
        let start = setup.scale_up_secs(&self.sc.settings);
        let now = self.now;
        let Some(b) = self.batch.as_mut() else {
            unreachable!("called with a batch side")
        };
        let idx = b.own.len();
        b.own.push(Own {
            job,
            offer,
            engine,
            phase: OwnPhase::Starting,
            since: now,
            until: None,
            generation: 0,
            lines: Vec::new(),
        });
        let o = &b.setup.offers[offer];
        if o.interruptible && o.reclaims_per_hour > 0.0 {
            // An exponential clock per GPU: the provider takes it back at a constant rate.
            let u: f64 = b.rng.random::<f64>().max(f64::EPSILON);
            let after = -u.ln() / (o.reclaims_per_hour / 3600.0);
            self.push(now + after, Ev::BatchReclaim { own: idx });
        }
        self.push(now + start, Ev::BatchReady { own: idx });
        Ok(idx)
    }

    /// Stops feeding replica `o`; it goes when its lines are answered (at once while starting or idle).
    fn drain_own(&mut self, o: usize) {
        let now = self.now;
        let Some(b) = self.batch.as_mut() else { return };
        let own = &mut b.own[o];
        match own.phase {
            OwnPhase::Starting => {
                own.phase = OwnPhase::Gone;
                own.until = Some(now);
            }
            OwnPhase::Ready if own.engine.is_idle() => {
                own.phase = OwnPhase::Gone;
                own.until = Some(now);
            }
            OwnPhase::Ready => own.phase = OwnPhase::Draining,
            OwnPhase::Draining | OwnPhase::Gone => {}
        }
    }

    pub(super) fn on_batch_ready(&mut self, o: usize) {
        let Some(b) = self.batch.as_mut() else { return };
        if b.own[o].phase == OwnPhase::Starting {
            b.own[o].phase = OwnPhase::Ready;
        }
    }

    /// The provider takes replica `o` back: its lines in flight go back to their job's queue.
    pub(super) fn on_batch_reclaim(&mut self, o: usize) {
        let now = self.now;
        let Some(b) = self.batch.as_mut() else { return };
        if b.own[o].phase == OwnPhase::Gone {
            return;
        }
        b.reclaims += 1;
        let lines = std::mem::take(&mut b.own[o].lines);
        for id in lines {
            let j = job_of(id);
            b.jobs[j].returned.push(id & 0xffff_ffff);
            b.jobs[j].resent += 1;
        }
        let own = &mut b.own[o];
        own.phase = OwnPhase::Gone;
        own.until = Some(now);
        own.generation += 1;
        let back = now + b.setup.offers[own.offer].back_after_s;
        b.back_at[own.offer].push(back);
    }

    pub(super) fn on_batch_step(&mut self, o: usize, generation: u64) {
        let now = self.now;
        let Some(b) = self.batch.as_mut() else { return };
        let own = &mut b.own[o];
        if own.generation != generation || own.phase == OwnPhase::Gone {
            return;
        }
        let mut finished = Vec::new();
        own.engine.advance(now, &mut |e| {
            if let EngineEvent::Finished { id, .. } = e {
                finished.push(id);
            }
        });
        own.lines.retain(|id| !finished.contains(id));
        for id in finished {
            b.line_done(id, now, false);
        }
        if !self.schedule_own(o)
            && let Some(b) = self.batch.as_mut()
            && b.own[o].phase == OwnPhase::Draining
            && b.own[o].engine.is_idle()
        {
            b.own[o].phase = OwnPhase::Gone;
            b.own[o].until = Some(now);
        }
    }

    fn schedule_own(&mut self, o: usize) -> bool {
        let Some(b) = self.batch.as_mut() else {
            return false;
        };
        let own = &mut b.own[o];
        let Some(t) = own.engine.next_event_time() else {
            return false;
        };
        own.generation += 1;
        let generation = own.generation;
        self.push(t, Ev::BatchStep { own: o, generation });
        true
    }

    /// A batch line finished in an interactive replica's spare room.
    pub(super) fn batch_line_done_on_spare(&mut self, r: usize, id: u64) {
        let now = self.now;
        let Some(b) = self.batch.as_mut() else { return };
        if let Some(v) = b.spare.get_mut(&r) {
            v.retain(|&x| x != id);
        }
        b.line_done(id, now, true);
    }

    /// The lane poll: jobs submitted by now start; lines go to spare room and to the batch's own replicas.
    pub(super) fn on_batch_tick(&mut self) -> Result<(), SimError> {
        let now = self.now;
        let Some(b) = self.batch.as_mut() else {
            return Ok(());
        };
        let mode = b.mode;
        let starting: Vec<usize> = (0..b.jobs.len())
            .filter(|&j| !b.jobs[j].started && b.setup.jobs[j].submit_at <= now + 1e-9)
            .collect();
        for &j in &starting {
            b.jobs[j].started = true;
        }
        for j in starting {
            match mode {
                BatchMode::AtSubmit => {
                    let n = self.replicas_at_submit(j);
                    let reliable = self.batch.as_ref().map_or(0, |b| b.setup.reliable);
                    for _ in 0..n {
                        self.start_own(Some(j), reliable)?;
                    }
                }
                BatchMode::GreedySpot => self.take_spot(j)?,
                BatchMode::Paced | BatchMode::Dedicated(_) => {}
            }
        }
        if mode == BatchMode::Paced {
            self.feed_spare();
        }
        self.feed_own();
        let Some(b) = self.batch.as_mut() else {
            return Ok(());
        };
        let busy = (0..b.jobs.len()).any(|j| b.active(j));
        let next_submit = (0..b.jobs.len())
            .filter(|&j| !b.jobs[j].started)
            .map(|j| b.setup.jobs[j].submit_at)
            .fold(f64::INFINITY, f64::min);
        let next = if busy { now + LANE_POLL_S } else { next_submit };
        if next.is_finite() && next <= self.sc.duration {
            self.push(next, Ev::BatchTick);
        }
        Ok(())
    }

    /// The replicas a job sized for its deadline from its submission needs on the reliable type: the pacing
    /// rule, asked with no spare room and nothing to measure.
    fn replicas_at_submit(&self, j: usize) -> u32 {
        let Some(b) = self.batch.as_ref() else { return 0 };
        let job = &b.setup.jobs[j];
        let offer = &b.setup.offers[b.setup.reliable];
        let input = PaceInput {
            started_ms: secs_to_ms(job.submit_at),
            deadline_ms: secs_to_ms(job.deadline),
            now_ms: secs_to_ms(self.now),
            done: 0,
            remaining: job.lines,
            spare_lines_per_s: 0.0,
            spare_measured_for: MEASURE_SPARE,
            per_replica_lines_per_s: b.per_replica[j],
            cold_start: Duration::from_secs_f64(self.sc.models[job.model].scale_up_secs(&self.sc.settings)),
            margin: b.setup.margin,
            offers: vec![CapacityOffer {
                name: offer.name.clone(),
                price_per_hour: offer.price_per_gpu_hour,
                available: b.available(b.setup.reliable, self.now),
                ready: 0,
                interruptible: false,
            }],
        };
        match pace(&input).action {
            PaceAction::Add { replicas, .. } => replicas,
            // Too late or no estimate: one replica, so the job at least runs.
            _ => 1,
        }
    }

    /// Greedy spot: every spot GPU to be had, for job `j`.
    fn take_spot(&mut self, j: usize) -> Result<(), SimError> {
        let now = self.now;
        let Some(b) = self.batch.as_ref() else {
            return Ok(());
        };
        let wants: Vec<(usize, u32)> = (0..b.setup.offers.len())
            .filter(|&o| b.setup.offers[o].interruptible)
            .map(|o| (o, b.available(o, now)))
            .collect();
        for (o, n) in wants {
            for _ in 0..n {
                self.start_own(Some(j), o)?;
            }
        }
        Ok(())
    }

    /// Spare room: each ready interactive replica of an active job's model gets a line when the flex-lane gate
    /// admits one (one per replica per poll: the activator's "unseen" count holds the next until the gauges are
    /// read again).
    fn feed_spare(&mut self) {
        let now = self.now;
        let Some(b) = self.batch.as_ref() else { return };
        let order = b.by_deadline();
        for j in order {
            let m = self.batch.as_ref().map_or(0, |b| b.setup.jobs[j].model);
            let ready: Vec<usize> = self.models[m]
                .replicas
                .iter()
                .copied()
                .filter(|&r| self.replicas[r].phase == Phase::Ready)
                .collect();
            for r in ready {
                let Some(b) = self.batch.as_ref() else { return };
                if !b.has_unsent(j) {
                    break;
                }
                let eng = &self.replicas[r].engine;
                let st = eng.stats();
                let job = &b.setup.jobs[j];
                // The line's footprint is exact here (its prompt and max_tokens); the activator estimates it
                // from the body (`tessera_core::lanes::footprint_tokens`).
                let footprint = u64::from(job.prompt_tokens) + u64::from(job.output_tokens);
                let in_flight = b.spare.get(&r).map_or(0, |v| v.len() as u64);
                let room = BackendRoom {
                    kv: Some(st.kv_usage),
                    waiting: Some(st.waiting as f64),
                    age: Some(Duration::ZERO),
                    flex_in_flight: in_flight,
                    flex_unseen: 0,
                    flex_tokens: b
                        .spare
                        .get(&r)
                        .map_or(0, |v| v.iter().map(|&id| b.footprint(job_of(id))).sum()),
                    kv_capacity_tokens: Some(eng.kv_blocks_total() * u64::from(eng.config().block_size)),
                    neighbours: b.neighbours.get(&r).copied(),
                    // Refreshed each sync, as the controller writes them.
                    neighbours_age: Some(Duration::from_secs_f64((now - b.neighbours_at).max(0.0))),
                };
                if admit_flex(&room, &b.lanes, footprint).is_err() {
                    continue;
                }
                self.tell_neighbours(r);
                let Some(b) = self.batch.as_mut() else { return };
                let Some(line) = b.take_line(j) else { break };
                let req = b.request(j, line);
                let rep = &mut self.replicas[r];
                let was_idle = rep.engine.next_event_time().is_none();
                if rep.engine.submit(req, now).is_err() {
                    // vLLM would answer 400: counted answered (to the error file), as the runner does.
                    b.line_done(req.id, now, true);
                    continue;
                }
                b.spare.entry(r).or_default().push(req.id);
                if was_idle {
                    self.schedule_step(r);
                }
            }
        }
    }

    /// Each interactive replica's flex-gate figure for its GPU's other models (`lanes::neighbour_pressures`), from
    /// every ready replica's sidecar window (its TTFT p95 over its model's objective), as the controller computes
    /// it once per sync and publishes it to the activator.
    fn refresh_neighbours(&mut self) {
        let settings = &self.sc.settings;
        let tenants: Vec<Tenant<usize, usize, GpuId>> = (0..self.replicas.len())
            .filter(|&r| self.replicas[r].phase == Phase::Ready && self.replicas[r].gpu.is_some())
            .map(|r| {
                let rep = &self.replicas[r];
                let status = observe::sidecar_status(
                    rep.scrapes.iter(),
                    self.sc.gpu.memory_bytes,
                    self.now,
                    settings.scrape_interval,
                    settings.ttft_window,
                );
                let p95 = status.recent.and_then(|w| w.ttft_seconds.p95);
                Tenant {
                    pod: r,
                    model: rep.model,
                    gpu: rep.gpu,
                    pressure: ttft_pressure(p95, Some(self.sc.models[rep.model].slo_ttft)),
                }
            })
            .collect();
        if let Some(b) = self.batch.as_mut() {
            b.neighbours = neighbour_pressures(&tenants).into_iter().collect();
            b.neighbours_at = self.now;
        }
    }

    /// The batch's own replicas: each ready one kept at its engine's batch size in lines (its job's, or the
    /// earliest-due job's for the dedicated pool).
    fn feed_own(&mut self) {
        let now = self.now;
        let Some(b) = self.batch.as_ref() else { return };
        let order = b.by_deadline();
        for o in 0..b.own.len() {
            let Some(b) = self.batch.as_mut() else { return };
            if b.own[o].phase != OwnPhase::Ready {
                continue;
            }
            let depth = b.own[o].engine.config().max_num_seqs as usize;
            let mut sent = false;
            while b.own[o].lines.len() < depth {
                let job = match b.own[o].job {
                    Some(j) => Some(j).filter(|&j| b.active(j) && b.has_unsent(j)),
                    None => order.iter().copied().find(|&j| b.has_unsent(j)),
                };
                let Some(j) = job else { break };
                let Some(line) = b.take_line(j) else { break };
                let req = b.request(j, line);
                if b.own[o].engine.submit(req, now).is_err() {
                    b.line_done(req.id, now, false);
                    continue;
                }
                b.own[o].lines.push(req.id);
                sent = true;
            }
            if sent && b.own[o].engine.next_event_time().is_some() {
                self.schedule_own(o);
            }
        }
    }

    /// Every sync: the pacing rule for each active job (Paced), or greedy spot taking back what returned.
    pub(super) fn batch_round(&mut self) -> Result<(), SimError> {
        let Some(b) = self.batch.as_ref() else {
            return Ok(());
        };
        if b.mode == BatchMode::Paced {
            self.refresh_neighbours();
        }
        let Some(b) = self.batch.as_ref() else {
            return Ok(());
        };
        match b.mode {
            BatchMode::Paced => {
                for j in b.by_deadline() {
                    self.pace_job(j)?;
                }
            }
            BatchMode::GreedySpot => {
                for j in b.by_deadline() {
                    if self.batch.as_ref().is_some_and(|b| b.has_unsent(j)) {
                        self.take_spot(j)?;
                    }
                }
            }
            BatchMode::Dedicated(_) | BatchMode::AtSubmit => {}
        }
        // Own replicas whose job has ended go.
        let ended: Vec<usize> = self.batch.as_ref().map_or_else(Vec::new, |b| {
            (0..b.own.len())
                .filter(|&o| b.own[o].job.is_some_and(|j| !b.active(j)))
                .collect()
        });
        for o in ended {
            self.drain_own(o);
        }
        Ok(())
    }

    /// One job's pacing round (`tessera_core::batch::pace`), carried out on its own replicas.
    fn pace_job(&mut self, j: usize) -> Result<(), SimError> {
        let now = self.now;
        let Some(b) = self.batch.as_mut() else {
            return Ok(());
        };
        let job = b.setup.jobs[j].clone();
        let rt = &mut b.jobs[j];
        while rt.spare_done.front().is_some_and(|&t| t < now - SPARE_WINDOW_S) {
            rt.spare_done.pop_front();
        }
        let measured = (now - job.submit_at).max(0.0);
        let spare_rate = if measured > 0.0 {
            rt.spare_done.len() as f64 / measured.min(SPARE_WINDOW_S)
        } else {
            0.0
        };
        let mine = |o: usize| {
            b.own
                .iter()
                .filter(|x| x.job == Some(j) && x.offer == o && x.phase == OwnPhase::Ready)
                .count() as u32
        };
        let offers: Vec<CapacityOffer> = (0..b.setup.offers.len())
            .map(|o| CapacityOffer {
                name: b.setup.offers[o].name.clone(),
                price_per_hour: b.setup.offers[o].price_per_gpu_hour,
                // Replicas of its own still starting count as available: the rule asks for a total.
                available: b.available(o, now)
                    + b.own
                        .iter()
                        .filter(|x| x.job == Some(j) && x.offer == o && x.phase == OwnPhase::Starting)
                        .count() as u32,
                ready: mine(o),
                interruptible: b.setup.offers[o].interruptible,
            })
            .collect();
        let input = PaceInput {
            started_ms: secs_to_ms(job.submit_at),
            deadline_ms: secs_to_ms(job.deadline),
            now_ms: secs_to_ms(now),
            done: b.jobs[j].done,
            remaining: job.lines.saturating_sub(b.jobs[j].done),
            spare_lines_per_s: spare_rate,
            spare_measured_for: Duration::from_secs_f64(measured),
            per_replica_lines_per_s: b.per_replica[j],
            cold_start: Duration::from_secs_f64(self.sc.models[job.model].scale_up_secs(&self.sc.settings)),
            margin: b.setup.margin,
            offers,
        };
        let decision = pace(&input);
        let want: Option<(usize, u32)> = match &decision.action {
            PaceAction::Add { offer, replicas } => b
                .setup
                .offers
                .iter()
                .position(|o| &o.name == offer)
                .map(|o| (o, *replicas)),
            PaceAction::Done | PaceAction::FillSpare => None,
        };
        if want.is_some() {
            b.paced_adds += 1;
        }
        // Its own replicas: keep what the decision wants of its type, drain the rest.
        let mut alive: Vec<usize> = (0..b.own.len())
            .filter(|&o| {
                b.own[o].job == Some(j) && matches!(b.own[o].phase, OwnPhase::Starting | OwnPhase::Ready)
            })
            .collect();
        // Ready ones are kept before starting ones (their start is paid for).
        alive.sort_by_key(|&o| (b.own[o].phase == OwnPhase::Starting, o));
        let mut keep = 0u32;
        let mut drain = Vec::new();
        for o in alive {
            match want {
                Some((offer, n)) if b.own[o].offer == offer && keep < n => keep += 1,
                _ => drain.push(o),
            }
        }
        for o in drain {
            self.drain_own(o);
        }
        if let Some((offer, n)) = want {
            let can = self.batch.as_ref().map_or(0, |b| b.available(offer, now));
            for _ in 0..n.saturating_sub(keep).min(can) {
                self.start_own(Some(j), offer)?;
            }
        }
        Ok(())
    }
}
