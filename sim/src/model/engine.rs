//! One vLLM engine core in virtual time: the scheduler, the paged KV cache, preemption and the step loop.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::histogram::*;
use super::sharing::{GpuWork, Neighbour, Neighbours, StepCost, StepTiming, host_time_s};
use super::spec::*;

/// One request as the engine sees it (tokens only; the text stays with the server).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Caller's id, unique among the requests in the engine.
    pub id: u64,
    /// Prompt length in tokens.
    pub prompt_tokens: u32,
    /// The request's `max_tokens`.
    pub max_tokens: u32,
    /// Where the model would emit end-of-sequence on its own (`None` = never, as with `ignore_eos`).
    /// Output stops at `min(max_tokens, stop_at)`; finishing early counts as `finished_reason="stop"`.
    pub stop_at: Option<u32>,
}

impl Request {
    /// A request that generates exactly `max_tokens` tokens.
    pub fn new(id: u64, prompt_tokens: u32, max_tokens: u32) -> Request {
        Request {
            id,
            prompt_tokens,
            max_tokens,
            stop_at: None,
        }
    }

    fn output_target(&self) -> u32 {
        self.stop_at
            .map_or(self.max_tokens, |s| s.clamp(1, self.max_tokens))
    }
}

/// Why a request finished, as vLLM's `finished_reason` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FinishReason {
    /// The model emitted end-of-sequence.
    Stop,
    /// It reached `max_tokens`.
    Length,
    /// The client went away (or the caller aborted it) before it finished.
    Abort,
}

impl FinishReason {
    /// The label value vLLM uses.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// Something that happened to a request, at a virtual time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum EngineEvent {
    /// The request's first output token.
    FirstToken {
        /// Request id.
        id: u64,
        /// When (seconds).
        at: f64,
        /// Time to first token: `at` − arrival.
        ttft: f64,
    },
    /// One more output token (after the first); `index` counts from 0, so the first `Token` has index 1.
    Token {
        /// Request id.
        id: u64,
        /// Output token index.
        index: u32,
        /// When (seconds).
        at: f64,
    },
    /// The request finished; its blocks are free.
    Finished {
        /// Request id.
        id: u64,
        /// When (seconds).
        at: f64,
        /// Time to first token.
        ttft: f64,
        /// Arrival to last token.
        e2e: f64,
        /// Arrival to first scheduling.
        queue_time: f64,
        /// Output tokens produced.
        output_tokens: u32,
        /// Prompt tokens.
        prompt_tokens: u32,
        /// Times it was preempted.
        preemptions: u32,
        /// Stop or length.
        reason: FinishReason,
    },
    /// The request was preempted (recompute): its blocks are freed and it waits at the head of the queue.
    Preempted {
        /// Request id.
        id: u64,
        /// When (seconds).
        at: f64,
    },
}

/// The engine's counters, gauges and cumulative histograms: what vLLM's `/metrics` shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineStats {
    /// `num_gpu_blocks`.
    pub kv_blocks_total: u64,
    /// Blocks held by requests now.
    pub kv_blocks_used: u64,
    /// `kv_blocks_used / kv_blocks_total` (vLLM's `kv_cache_usage_perc`, a 0-1 fraction).
    pub kv_usage: f64,
    /// Requests in the running batch.
    pub running: u64,
    /// Requests waiting (new or preempted).
    pub waiting: u64,
    /// Cumulative preemptions.
    pub num_preemptions: u64,
    /// Prompt tokens of requests that produced their first token.
    pub prompt_tokens: u64,
    /// Output tokens produced.
    pub generation_tokens: u64,
    /// Requests finished with `finished_reason="stop"`.
    pub finished_stop: u64,
    /// Requests finished with `finished_reason="length"`.
    pub finished_length: u64,
    /// Requests aborted (`finished_reason="abort"`).
    pub finished_abort: u64,
    /// Prefix cache queries (tokens looked up when a request is scheduled).
    pub prefix_cache_queries: u64,
    /// Prefix cache hits (always 0: the model has no prefix cache).
    pub prefix_cache_hits: u64,
    /// Steps run.
    pub steps: u64,
    /// Virtual seconds the GPU was busy.
    pub busy_time_s: f64,
    /// `vllm:time_to_first_token_seconds`.
    pub ttft: Histogram,
    /// `vllm:inter_token_latency_seconds`.
    pub itl: Histogram,
    /// `vllm:request_time_per_output_token_seconds` (per request: decode time / (output − 1)).
    pub tpot: Histogram,
    /// `vllm:e2e_request_latency_seconds`.
    pub e2e: Histogram,
    /// `vllm:request_queue_time_seconds`.
    pub queue_time: Histogram,
    /// `vllm:request_inference_time_seconds`.
    pub inference_time: Histogram,
    /// `vllm:request_prefill_time_seconds`.
    pub prefill_time: Histogram,
    /// `vllm:request_decode_time_seconds`.
    pub decode_time: Histogram,
    /// `vllm:request_prompt_tokens`.
    pub request_prompt_tokens: Histogram,
    /// `vllm:request_generation_tokens`.
    pub request_generation_tokens: Histogram,
    /// `vllm:request_params_max_tokens`.
    pub request_max_tokens: Histogram,
    /// `vllm:iteration_tokens_total`.
    pub iteration_tokens: Histogram,
    /// `vllm:request_num_preemptions` (per finished request).
    pub request_num_preemptions: Histogram,
    /// `vllm:request_prefill_kv_computed_tokens` (per finished request: prompt tokens not served from the prefix
    /// cache, which the model does not have, so all of them).
    pub request_prefill_kv_computed_tokens: Histogram,
}

/// A request inside the engine.
#[derive(Debug, Clone)]
struct Seq {
    req: Request,
    arrival: f64,
    /// Tokens whose KV is computed (reset to 0 by preemption).
    computed: u64,
    /// Output tokens produced so far.
    output: u32,
    blocks: u64,
    first_scheduled: Option<f64>,
    first_token: Option<f64>,
    last_token: f64,
    preemptions: u32,
    /// Tokens scheduled in the step in flight.
    scheduled: u64,
}

impl Seq {
    /// Tokens the model must have seen to produce the next output token: prompt + output so far.
    fn total_tokens(&self) -> u64 {
        u64::from(self.req.prompt_tokens) + u64::from(self.output)
    }
}

/// A step that has started and not yet ended.
#[derive(Debug, Clone, Copy)]
struct Step {
    end: f64,
    tokens: u64,
    /// The step's GPU work and the share of it spent in its GPU part: what co-tenants contend with.
    work: GpuWork,
    busy: f64,
}

/// One vLLM engine on one GPU, in virtual time. See the module docs.
#[derive(Debug, Clone)]
pub struct Engine {
    model: ModelSpec,
    gpu: GpuSpec,
    cfg: EngineConfig,
    max_model_len: u32,
    kv_cache_bytes: u64,
    blocks_total: u64,
    blocks_free: u64,
    running: Vec<Seq>,
    waiting: VecDeque<Seq>,
    step: Option<Step>,
    /// What the co-tenants of its GPU are doing, as last told by the caller.
    neighbours: Neighbours,
    /// The latest time the engine has seen (submit or advance); time never goes backwards.
    now: f64,
    stats: EngineStats,
}

impl Engine {
    /// Builds an engine, refusing configurations that vLLM refuses at start-up.
    pub fn new(model: ModelSpec, gpu: GpuSpec, cfg: EngineConfig) -> Result<Engine, ModelError> {
        cfg.validate()?;
        let max_model_len = cfg.max_model_len.unwrap_or(model.max_model_len);
        if max_model_len == 0 {
            return Err(ModelError::InvalidConfig {
                field: "max_model_len",
                reason: "must be at least 1".into(),
            });
        }
        if model.bytes_per_kv_token == 0 {
            return Err(ModelError::InvalidConfig {
                field: "bytes_per_kv_token",
                reason: "must be at least 1: 2 × layers × kv_heads × head_dim × dtype bytes".into(),
            });
        }
        let kv_cache_bytes = Self::kv_cache_bytes(&model, &gpu, &cfg)?;
        let block_bytes = model.bytes_per_kv_token * u64::from(cfg.block_size);
        let blocks_total = kv_cache_bytes / block_bytes;
        let kv_tokens = blocks_total * u64::from(cfg.block_size);
        if kv_tokens < u64::from(max_model_len) {
            return Err(ModelError::MaxModelLenTooLarge {
                max_model_len,
                kv_tokens,
            });
        }
        let stats = EngineStats {
            kv_blocks_total: blocks_total,
            kv_blocks_used: 0,
            kv_usage: 0.0,
            running: 0,
            waiting: 0,
            num_preemptions: 0,
            prompt_tokens: 0,
            generation_tokens: 0,
            finished_stop: 0,
            finished_length: 0,
            finished_abort: 0,
            prefix_cache_queries: 0,
            prefix_cache_hits: 0,
            steps: 0,
            busy_time_s: 0.0,
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            tpot: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(REQUEST_LATENCY_BUCKETS),
            queue_time: Histogram::new(REQUEST_LATENCY_BUCKETS),
            inference_time: Histogram::new(REQUEST_LATENCY_BUCKETS),
            prefill_time: Histogram::new(REQUEST_LATENCY_BUCKETS),
            decode_time: Histogram::new(REQUEST_LATENCY_BUCKETS),
            request_prompt_tokens: Histogram::new(&buckets_1_2_5(u64::from(max_model_len))),
            request_generation_tokens: Histogram::new(&buckets_1_2_5(u64::from(max_model_len))),
            request_max_tokens: Histogram::new(&buckets_1_2_5(u64::from(max_model_len))),
            iteration_tokens: Histogram::new(ITERATION_TOKENS_BUCKETS),
            request_num_preemptions: Histogram::new(NUM_PREEMPTIONS_BUCKETS),
            request_prefill_kv_computed_tokens: Histogram::new(&buckets_1_2_5(u64::from(max_model_len))),
        };
        Ok(Engine {
            model,
            gpu,
            cfg,
            max_model_len,
            kv_cache_bytes,
            blocks_total,
            blocks_free: blocks_total,
            running: Vec::new(),
            waiting: VecDeque::new(),
            step: None,
            neighbours: Neighbours::default(),
            now: 0.0,
            stats,
        })
    }

    /// KV cache bytes as vLLM computes them: `util × total − weights − (activation + non-torch)`, or the
    /// `kv_cache_memory_bytes` flag as given (which must still fit beside the weights).
    fn kv_cache_bytes(model: &ModelSpec, gpu: &GpuSpec, cfg: &EngineConfig) -> Result<u64, ModelError> {
        let to_gib = |b: f64| b / GIB as f64;
        let weights = model.weights_bytes as f64;
        let overhead = model.overhead_bytes as f64;
        match cfg.memory {
            MemorySetting::GpuMemoryUtilization(u) => {
                let budget = u * gpu.memory_bytes as f64;
                let kv = budget - weights - overhead;
                if kv <= 0.0 {
                    return Err(ModelError::NoMemoryForCache {
                        budget_gib: to_gib(budget),
                        weights_gib: to_gib(weights),
                        overhead_gib: to_gib(overhead),
                    });
                }
                Ok(kv as u64)
            }
            MemorySetting::KvCacheBytes(b) => {
                let need = weights + overhead + b as f64;
                if need > gpu.memory_bytes as f64 {
                    return Err(ModelError::InvalidConfig {
                        field: "kv_cache_memory_bytes",
                        reason: format!(
                            "{:.2} GiB of KV cache plus {:.2} GiB of weights and {:.2} GiB of activations exceed \
                             the GPU's {:.2} GiB; lower kv_cache_memory_bytes",
                            to_gib(b as f64),
                            to_gib(weights),
                            to_gib(overhead),
                            to_gib(gpu.memory_bytes as f64)
                        ),
                    });
                }
                Ok(b)
            }
        }
    }

    /// The model this engine serves.
    pub fn model(&self) -> &ModelSpec {
        &self.model
    }

    /// The GPU it runs on.
    pub fn gpu(&self) -> &GpuSpec {
        &self.gpu
    }

    /// Its configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The effective maximum context length.
    pub fn max_model_len(&self) -> u32 {
        self.max_model_len
    }

    /// `num_gpu_blocks`.
    pub fn kv_blocks_total(&self) -> u64 {
        self.blocks_total
    }

    /// The KV cache size in bytes (before rounding down to whole blocks).
    pub fn kv_cache_bytes_configured(&self) -> u64 {
        self.kv_cache_bytes
    }

    /// GPU memory this engine holds: weights + activation/non-torch + KV cache.
    pub fn gpu_memory_used_bytes(&self) -> u64 {
        self.model.weights_bytes + self.model.overhead_bytes + self.kv_cache_bytes
    }

    /// True when no request is running or waiting.
    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    /// Requests in the engine (running + waiting).
    pub fn in_flight(&self) -> usize {
        self.running.len() + self.waiting.len()
    }

    /// Checks a request against the model's limits without submitting it (the API layer's 400 check).
    pub fn check(&self, req: &Request) -> Result<(), ModelError> {
        if req.max_tokens == 0 {
            return Err(ModelError::ZeroMaxTokens);
        }
        let total = u64::from(req.prompt_tokens) + u64::from(req.max_tokens);
        if total > u64::from(self.max_model_len) || req.prompt_tokens == 0 {
            return Err(ModelError::RequestTooLong {
                max_model_len: self.max_model_len,
                prompt: req.prompt_tokens,
                max_tokens: req.max_tokens,
                total,
            });
        }
        Ok(())
    }

    /// Adds a request that arrived at `now`. It joins the waiting queue; if the engine is idle, a step starts
    /// at `now`. Fails, changing nothing, when vLLM would reject the request.
    pub fn submit(&mut self, req: Request, now: f64) -> Result<(), ModelError> {
        self.check(&req)?;
        if self
            .running
            .iter()
            .chain(self.waiting.iter())
            .any(|s| s.req.id == req.id)
        {
            return Err(ModelError::DuplicateRequest(req.id));
        }
        self.now = self.now.max(now);
        self.waiting.push_back(Seq {
            req,
            arrival: now,
            computed: 0,
            output: 0,
            blocks: 0,
            first_scheduled: None,
            first_token: None,
            last_token: now,
            preemptions: 0,
            scheduled: 0,
        });
        if self.step.is_none() {
            let at = self.now;
            self.start_step(at, &mut |_| {});
        }
        self.refresh_gauges();
        Ok(())
    }

    /// When the step in flight ends (`None` = idle: nothing happens until the next `submit`).
    pub fn next_event_time(&self) -> Option<f64> {
        self.step.map(|s| s.end)
    }

    /// Runs every step that ends at or before `now`, reporting what happened to `sink` in time order.
    pub fn advance(&mut self, now: f64, sink: &mut impl FnMut(EngineEvent)) {
        while let Some(step) = self.step {
            if step.end > now {
                break;
            }
            self.finish_step(step, sink);
            self.start_step(step.end, sink);
        }
        self.now = self.now.max(now);
        self.refresh_gauges();
    }

    /// Aborts a request (the client went away): it leaves the engine and frees its blocks; the step in flight
    /// still ends when it was going to. Returns false when no such request is in the engine.
    pub fn abort(&mut self, id: u64, now: f64) -> bool {
        self.now = self.now.max(now);
        if let Some(i) = self.running.iter().position(|s| s.req.id == id) {
            let seq = self.running.remove(i);
            self.blocks_free += seq.blocks;
        } else if let Some(i) = self.waiting.iter().position(|s| s.req.id == id) {
            // Waiting requests hold no blocks (preemption freed them).
            self.waiting.remove(i);
        } else {
            return false;
        }
        // vLLM counts aborted requests only in request_success{finished_reason="abort"}, not in the latency
        // histograms.
        self.stats.finished_abort += 1;
        self.refresh_gauges();
        true
    }

    /// The requests still without their first token (queued, or prefilling), oldest first within each list: the
    /// ones a client waiting on a stream can still give up on.
    pub fn awaiting_first_token(&self) -> impl Iterator<Item = u64> + '_ {
        self.running
            .iter()
            .chain(self.waiting.iter())
            .filter(|s| s.first_token.is_none())
            .map(|s| s.req.id)
    }

    /// Counters, gauges and histograms now.
    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    /// Blocks a request with `tokens` tokens of KV needs.
    fn blocks_for(&self, tokens: u64) -> u64 {
        tokens.div_ceil(u64::from(self.cfg.block_size))
    }

    fn refresh_gauges(&mut self) {
        let used = self.blocks_total - self.blocks_free;
        self.stats.kv_blocks_used = used;
        self.stats.kv_usage = if self.blocks_total == 0 {
            0.0
        } else {
            used as f64 / self.blocks_total as f64
        };
        self.stats.running = self.running.len() as u64;
        self.stats.waiting = self.waiting.len() as u64;
    }

    /// Preempts the newest running request (recompute): frees its blocks, puts it at the head of the queue.
    fn preempt_last(&mut self, at: f64, sink: &mut impl FnMut(EngineEvent)) -> Option<u64> {
        let mut seq = self.running.pop()?;
        self.blocks_free += seq.blocks;
        seq.blocks = 0;
        seq.computed = 0;
        seq.scheduled = 0;
        seq.preemptions += 1;
        self.stats.num_preemptions += 1;
        let id = seq.req.id;
        sink(EngineEvent::Preempted { id, at });
        self.waiting.push_front(seq);
        Some(id)
    }

    /// Schedules one step at `at` (V1 order: running first, then waiting while nothing was preempted).
    fn start_step(&mut self, at: f64, sink: &mut impl FnMut(EngineEvent)) {
        let mut budget = u64::from(self.cfg.max_num_batched_tokens);
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let seq = &self.running[i];
            let n = (seq.total_tokens() - seq.computed).min(budget);
            let need = self.blocks_for(seq.computed + n).saturating_sub(seq.blocks);
            let mut scheduled_self = true;
            while need > self.blocks_free {
                preempted = true;
                // The victim is the newest request; if that is this one, it cannot run in this step.
                let victim_is_self = i == self.running.len() - 1;
                self.preempt_last(at, sink);
                if victim_is_self {
                    scheduled_self = false;
                    break;
                }
            }
            if !scheduled_self {
                break;
            }
            let seq = &mut self.running[i];
            seq.blocks += need;
            seq.scheduled = n;
            self.blocks_free -= need;
            budget -= n;
            i += 1;
        }
        // Requests after the budget ran out are in the batch but get no tokens this step.
        for seq in self.running.iter_mut().skip(i) {
            seq.scheduled = 0;
        }
        if !preempted {
            while budget > 0 && (self.running.len() as u64) < u64::from(self.cfg.max_num_seqs) {
                let Some(seq) = self.waiting.front() else { break };
                let n = (seq.total_tokens() - seq.computed).min(budget);
                let need = self.blocks_for(seq.computed + n);
                if need > self.blocks_free {
                    break; // FCFS: the head of the queue waits for blocks, and so does everyone behind it.
                }
                let Some(mut seq) = self.waiting.pop_front() else {
                    break;
                };
                if seq.first_scheduled.is_none() {
                    seq.first_scheduled = Some(at);
                    self.stats.prefix_cache_queries += u64::from(seq.req.prompt_tokens);
                }
                seq.blocks = need;
                seq.scheduled = n;
                self.blocks_free -= need;
                budget -= n;
                self.running.push(seq);
            }
        }
        let tokens = u64::from(self.cfg.max_num_batched_tokens) - budget;
        if tokens == 0 {
            // Nothing can run: only possible when the engine is empty (a lone request always fits, since
            // max_model_len fits in the cache and requests are checked against it).
            self.step = None;
            return;
        }
        let kv_tokens_read: u64 = self
            .running
            .iter()
            .filter(|s| s.scheduled > 0)
            .map(|s| s.computed + s.scheduled)
            .sum();
        let seqs = self.running.iter().filter(|s| s.scheduled > 0).count() as u64;
        let (work, timing) = self.step_timing(tokens, kv_tokens_read, seqs);
        let dur = timing.duration_s;
        self.stats.steps += 1;
        self.stats.busy_time_s += dur;
        self.step = Some(Step {
            end: at + dur,
            tokens,
            work,
            busy: timing.busy,
        });
    }

    /// Step duration from the roofline: the GPU part is the larger of the memory time (weights + KV read from
    /// HBM) and the compute time (2 × params FLOPs per token), as the sharing model stretches it for the GPU share
    /// and the co-tenants' steps; plus the host part for `seqs` scheduled sequences ([`host_time_s`]).
    pub fn step_time(&self, tokens: u64, kv_tokens_read: u64, seqs: u64) -> f64 {
        self.step_timing(tokens, kv_tokens_read, seqs).1.duration_s
    }

    fn step_timing(&self, tokens: u64, kv_tokens_read: u64, seqs: u64) -> (GpuWork, StepTiming) {
        let cost = step_cost(&self.gpu, &self.model, &self.cfg, tokens, kv_tokens_read, seqs);
        let work = GpuWork {
            memory_s: cost.memory_s,
            compute_s: cost.compute_s,
        };
        let timing = self
            .cfg
            .sharing
            .step(cost, self.cfg.compute_fraction, &self.neighbours);
        (work, timing)
    }

    /// Tells the engine which co-tenants of its GPU are in a step now; steps that start from now on are timed
    /// with them.
    pub fn set_neighbours(&mut self, n: Neighbours) {
        self.neighbours = n;
    }

    /// The GPU work, SM cap and duty of the step in flight (`None` when idle): what this engine imposes on its
    /// co-tenants right now.
    pub fn load(&self) -> Option<Neighbour> {
        self.step.map(|s| Neighbour {
            work: s.work,
            cap: self.cfg.compute_fraction,
            duty: s.busy,
        })
    }

    fn finish_step(&mut self, step: Step, sink: &mut impl FnMut(EngineEvent)) {
        let at = step.end;
        self.stats.iteration_tokens.observe(step.tokens as f64);
        let mut i = 0;
        while i < self.running.len() {
            let seq = &mut self.running[i];
            if seq.scheduled == 0 {
                i += 1;
                continue;
            }
            seq.computed += seq.scheduled;
            seq.scheduled = 0;
            if seq.computed < seq.total_tokens() {
                i += 1; // a prefill chunk that has not reached the end of the prompt yet
                continue;
            }
            // The step covered every token the request has: the model samples one more.
            seq.output += 1;
            self.stats.generation_tokens += 1;
            let id = seq.req.id;
            if seq.first_token.is_none() {
                seq.first_token = Some(at);
                let ttft = at - seq.arrival;
                self.stats.ttft.observe(ttft);
                self.stats.prompt_tokens += u64::from(seq.req.prompt_tokens);
                sink(EngineEvent::FirstToken { id, at, ttft });
            } else {
                self.stats.itl.observe(at - seq.last_token);
                sink(EngineEvent::Token {
                    id,
                    index: seq.output - 1,
                    at,
                });
            }
            seq.last_token = at;
            let target = seq.req.output_target();
            if seq.output >= target {
                let seq = self.running.remove(i);
                self.blocks_free += seq.blocks;
                self.record_finished(&seq, at, sink);
                continue;
            }
            i += 1;
        }
    }

    fn record_finished(&mut self, seq: &Seq, at: f64, sink: &mut impl FnMut(EngineEvent)) {
        let first_token = seq.first_token.unwrap_or(at);
        let scheduled = seq.first_scheduled.unwrap_or(seq.arrival);
        let reason = if seq.output < seq.req.max_tokens {
            FinishReason::Stop
        } else {
            FinishReason::Length
        };
        match reason {
            FinishReason::Stop => self.stats.finished_stop += 1,
            FinishReason::Length => self.stats.finished_length += 1,
            FinishReason::Abort => self.stats.finished_abort += 1,
        }
        let ttft = first_token - seq.arrival;
        let e2e = at - seq.arrival;
        let queue_time = scheduled - seq.arrival;
        let s = &mut self.stats;
        s.e2e.observe(e2e);
        s.queue_time.observe(queue_time);
        s.inference_time.observe(at - scheduled);
        s.prefill_time.observe(first_token - scheduled);
        s.decode_time.observe(at - first_token);
        if seq.output > 1 {
            s.tpot.observe((at - first_token) / f64::from(seq.output - 1));
        }
        s.request_prompt_tokens.observe(f64::from(seq.req.prompt_tokens));
        s.request_generation_tokens.observe(f64::from(seq.output));
        s.request_max_tokens.observe(f64::from(seq.req.max_tokens));
        s.request_num_preemptions.observe(f64::from(seq.preemptions));
        s.request_prefill_kv_computed_tokens
            .observe(f64::from(seq.req.prompt_tokens));
        sink(EngineEvent::Finished {
            id: seq.req.id,
            at,
            ttft,
            e2e,
            queue_time,
            output_tokens: seq.output,
            prompt_tokens: seq.req.prompt_tokens,
            preemptions: seq.preemptions,
            reason,
        });
    }
}

/// The `max_tokens` vLLM 0.32's OpenAI server runs a request with: what the client asked for (or, unset, the
/// rest of the context), capped at what is left of `max_model_len` after the prompt — it no longer refuses a
/// request whose prompt and `max_tokens` together exceed the context. `None` when the prompt itself leaves no
/// room (vLLM answers 400). Shared by the emulator's API and the simulator's arrivals.
pub fn capped_max_tokens(max_model_len: u32, prompt_tokens: u32, asked: Option<u32>) -> Option<u32> {
    let room = max_model_len.checked_sub(prompt_tokens).filter(|r| *r > 0)?;
    Some(asked.map_or(room, |m| m.min(room)))
}

/// One step's cost on the roofline, alone with the whole GPU: the weights and `kv_tokens_read` tokens of KV read
/// over the achieved bandwidth, 2 × params FLOPs per scheduled token over the achieved compute, and the host part
/// for `seqs` scheduled sequences (`host_part_s`). The engine's steps and `tessera sharing` price steps with it.
pub fn step_cost(
    gpu: &GpuSpec,
    model: &ModelSpec,
    cfg: &EngineConfig,
    tokens: u64,
    kv_tokens_read: u64,
    seqs: u64,
) -> StepCost {
    let bytes = model.weights_bytes as f64 + kv_tokens_read as f64 * model.bytes_per_kv_token as f64;
    StepCost {
        memory_s: bytes / (gpu.hbm_bandwidth_bytes_per_s * cfg.memory_efficiency),
        compute_s: 2.0 * model.params * tokens as f64 / (gpu.flops * cfg.compute_efficiency),
        overhead_s: host_part_s(model, cfg, seqs),
    }
}

/// The host part of a step with `seqs` scheduled sequences: the configured fixed part, plus what grows with the
/// model and the batch unless the configuration turns the scaling off.
fn host_part_s(model: &ModelSpec, cfg: &EngineConfig, seqs: u64) -> f64 {
    if cfg.host_scales_with_model {
        host_time_s(cfg.step_overhead_s, model.params, seqs)
    } else {
        cfg.step_overhead_s
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::model::sharing::GpuWork;
    use crate::model::{Neighbour, SharingModel};
    use proptest::prelude::*;

    fn engine_with(f: impl FnOnce(&mut EngineConfig)) -> Engine {
        let gpu = GpuSpec::preset("a100-80gb").unwrap();
        let mut cfg = EngineConfig::vllm_defaults(&gpu);
        cfg.max_model_len = Some(16_384);
        f(&mut cfg);
        Engine::new(ModelSpec::preset("qwen2-7b").unwrap(), gpu, cfg).unwrap()
    }

    /// Runs the engine until it is idle, returning every event.
    fn drain(e: &mut Engine) -> Vec<EngineEvent> {
        let mut ev = Vec::new();
        while let Some(t) = e.next_event_time() {
            e.advance(t, &mut |x| ev.push(x));
        }
        ev
    }

    #[test]
    fn kv_blocks_match_vllm_measurements_for_qwen2_7b_on_a100() {
        // vLLM 0.10.1.1 logged num_gpu_blocks 5,867 at util 0.25 and 29,053 at 0.5 (memory-profiles.md #1-2).
        for (util, measured) in [(0.25, 5_867.0), (0.5, 29_053.0)] {
            let e = engine_with(|c| c.memory = MemorySetting::GpuMemoryUtilization(util));
            let got = e.kv_blocks_total() as f64;
            assert!(
                (got - measured).abs() / measured < 0.02,
                "util {util}: {got} blocks vs {measured} measured"
            );
        }
    }

    #[test]
    fn kv_cache_bytes_flag_sets_the_cache_directly() {
        let e = engine_with(|c| c.memory = MemorySetting::KvCacheBytes(5 * GIB));
        assert_eq!(e.kv_blocks_total(), 5 * GIB / (57_344 * 16));
    }

    #[test]
    fn refuses_to_start_like_vllm() {
        let gpu = GpuSpec::preset("a100-80gb").unwrap();
        let cfg = EngineConfig::vllm_defaults(&gpu);
        let err = Engine::new(
            ModelSpec::preset("llama-3.1-70b").unwrap(),
            gpu.clone(),
            cfg.clone(),
        )
        .unwrap_err();
        assert!(matches!(err, ModelError::NoMemoryForCache { .. }), "{err}");
        let mut small = cfg.clone();
        small.memory = MemorySetting::GpuMemoryUtilization(0.18);
        let err = Engine::new(ModelSpec::preset("qwen2-7b").unwrap(), gpu.clone(), small).unwrap_err();
        assert!(err.to_string().contains("No available memory"), "{err}");
        // A little memory but not enough for one max-length sequence.
        let mut tight = cfg;
        tight.memory = MemorySetting::GpuMemoryUtilization(0.195);
        tight.max_model_len = Some(32_768);
        let err = Engine::new(ModelSpec::preset("qwen2-7b").unwrap(), gpu, tight).unwrap_err();
        assert!(matches!(err, ModelError::MaxModelLenTooLarge { .. }), "{err}");
    }

    #[test]
    fn bad_config_names_the_field() {
        let gpu = GpuSpec::preset("l4").unwrap();
        let mut cfg = EngineConfig::vllm_defaults(&gpu);
        cfg.compute_fraction = 0.0;
        let err = Engine::new(ModelSpec::preset("opt-125m").unwrap(), gpu, cfg).unwrap_err();
        assert!(err.to_string().contains("compute_fraction"), "{err}");
        assert!(
            ModelSpec::preset("gpt-5")
                .unwrap_err()
                .to_string()
                .contains("qwen2-7b")
        );
    }

    #[test]
    fn defaults_follow_vllm_by_gpu() {
        let a100 = EngineConfig::vllm_defaults(&GpuSpec::preset("a100-80gb").unwrap());
        let h100 = EngineConfig::vllm_defaults(&GpuSpec::preset("h100-80gb").unwrap());
        assert_eq!((a100.max_num_seqs, a100.max_num_batched_tokens), (256, 2048));
        assert_eq!((h100.max_num_seqs, h100.max_num_batched_tokens), (1024, 8192));
    }

    #[test]
    fn single_request_produces_every_token_in_order() {
        let mut e = engine_with(|_| {});
        e.submit(Request::new(7, 1000, 50), 0.0).unwrap();
        let ev = drain(&mut e);
        assert!(matches!(ev[0], EngineEvent::FirstToken { id: 7, .. }));
        let tokens = ev
            .iter()
            .filter(|x| matches!(x, EngineEvent::Token { .. }))
            .count();
        assert_eq!(tokens, 49);
        let EngineEvent::Finished {
            output_tokens,
            reason,
            ttft,
            e2e,
            ..
        } = ev[ev.len() - 1]
        else {
            panic!("last event {:?}", ev[ev.len() - 1]);
        };
        assert_eq!((output_tokens, reason), (50, FinishReason::Length));
        // 1,000-token prefill of a 7.6B model on an A100: tens of milliseconds; decode ~ 9 ms/token.
        assert!(ttft > 0.02 && ttft < 0.2, "ttft {ttft}");
        let itl = (e2e - ttft) / 49.0;
        assert!(itl > 0.005 && itl < 0.02, "itl {itl}");
        assert!(e.is_idle());
        assert_eq!(e.stats().kv_blocks_used, 0);
        assert_eq!(e.stats().generation_tokens, 50);
        assert_eq!(e.stats().prompt_tokens, 1000);
        assert_eq!(e.stats().ttft.count, 1);
        assert_eq!(e.stats().itl.count, 49);
    }

    #[test]
    fn stop_at_finishes_early_with_reason_stop() {
        let mut e = engine_with(|_| {});
        e.submit(
            Request {
                id: 1,
                prompt_tokens: 10,
                max_tokens: 100,
                stop_at: Some(5),
            },
            0.0,
        )
        .unwrap();
        let ev = drain(&mut e);
        assert!(matches!(
            ev.last(),
            Some(EngineEvent::Finished {
                output_tokens: 5,
                reason: FinishReason::Stop,
                ..
            })
        ));
        assert_eq!(e.stats().finished_stop, 1);
    }

    #[test]
    fn long_prompts_are_prefilled_in_chunks() {
        let mut e = engine_with(|c| c.max_num_batched_tokens = 512);
        e.submit(Request::new(1, 2000, 2), 0.0).unwrap();
        drain(&mut e);
        // 2,000 prompt tokens in chunks of ≤ 512: 4 steps, then 1 decode step.
        assert_eq!(e.stats().steps, 5);
        assert_eq!(e.stats().iteration_tokens.cumulative().last().unwrap().1, 5);
    }

    #[test]
    fn full_batch_makes_the_queue_grow() {
        let mut e = engine_with(|c| c.max_num_seqs = 4);
        for id in 0..10 {
            e.submit(Request::new(id, 100, 200), 0.0).unwrap();
        }
        e.advance(e.next_event_time().unwrap(), &mut |_| {});
        assert_eq!(e.stats().running, 4);
        assert_eq!(e.stats().waiting, 6);
        drain(&mut e);
        // The queued ones waited: some queue time is well above zero.
        assert!(
            e.stats().queue_time.sum > 1.0,
            "queue time {}",
            e.stats().queue_time.sum
        );
        assert_eq!(e.stats().finished_length, 10);
    }

    #[test]
    fn fewer_blocks_cause_preemptions() {
        // 2,000 tokens of KV (125 blocks) for requests that grow to 600 tokens each.
        let small = |c: &mut EngineConfig| {
            c.memory = MemorySetting::KvCacheBytes(2_000 * 57_344);
            c.max_model_len = Some(1024);
        };
        let mut e = engine_with(small);
        for id in 0..8 {
            e.submit(Request::new(id, 100, 500), 0.0).unwrap();
        }
        let ev = drain(&mut e);
        let preempted = ev
            .iter()
            .filter(|x| matches!(x, EngineEvent::Preempted { .. }))
            .count() as u64;
        assert!(preempted > 0);
        assert_eq!(e.stats().num_preemptions, preempted);
        assert_eq!(e.stats().finished_length, 8, "every request still finishes");
        // Plenty of blocks: no preemption at all.
        let mut big = engine_with(|c| c.max_model_len = Some(1024));
        for id in 0..8 {
            big.submit(Request::new(id, 100, 500), 0.0).unwrap();
        }
        drain(&mut big);
        assert_eq!(big.stats().num_preemptions, 0);
    }

    #[test]
    fn preempted_request_resumes_without_a_second_first_token() {
        let mut e = engine_with(|c| {
            c.memory = MemorySetting::KvCacheBytes(1_200 * 57_344);
            c.max_model_len = Some(1024);
        });
        for id in 0..4 {
            e.submit(Request::new(id, 200, 400), 0.0).unwrap();
        }
        let ev = drain(&mut e);
        assert!(e.stats().num_preemptions > 0);
        for id in 0..4 {
            let firsts = ev
                .iter()
                .filter(|x| matches!(x, EngineEvent::FirstToken { id: i, .. } if *i == id))
                .count();
            let tokens = ev
                .iter()
                .filter(|x| matches!(x, EngineEvent::Token { id: i, .. } if *i == id))
                .count();
            assert_eq!((firsts, tokens), (1, 399), "request {id}");
        }
    }

    #[test]
    fn half_the_compute_doubles_the_step_time_under_the_proportional_model() {
        let full = engine_with(|c| {
            c.step_overhead_s = 0.0;
            c.host_scales_with_model = false;
            c.sharing = SharingModel::Proportional;
        });
        let half = engine_with(|c| {
            c.step_overhead_s = 0.0;
            c.host_scales_with_model = false;
            c.compute_fraction = 0.5;
            c.sharing = SharingModel::Proportional;
        });
        for (tokens, kv) in [(1, 1000), (64, 64_000), (2048, 2048)] {
            let r = half.step_time(tokens, kv, 1) / full.step_time(tokens, kv, 1);
            assert!((r - 2.0).abs() < 1e-9, "ratio {r}");
        }
    }

    #[test]
    fn half_the_sms_cost_decode_nothing_alone_but_prefill_twice() {
        let bare = |c: &mut EngineConfig| {
            c.step_overhead_s = 0.0;
            c.host_scales_with_model = false;
        };
        let full = engine_with(bare);
        let mut half = engine_with(|c| {
            bare(c);
            c.compute_fraction = 0.5;
        });
        // Decode (one token per sequence, long contexts): bandwidth-bound, unchanged at half the SMs.
        let r = half.step_time(64, 64_000, 64) / full.step_time(64, 64_000, 64);
        assert!((r - 1.0).abs() < 1e-9, "decode ratio {r}");
        // Prefill (2,048 prompt tokens): compute-bound, twice as long.
        let r = half.step_time(2048, 2048, 1) / full.step_time(2048, 2048, 1);
        assert!((r - 2.0).abs() < 1e-9, "prefill ratio {r}");
        // A neighbour in a bandwidth-bound step most of the time slows decode: they share the bandwidth.
        half.set_neighbours(Neighbours(vec![Neighbour {
            work: GpuWork {
                memory_s: 0.02,
                compute_s: 0.0,
            },
            cap: 0.5,
            duty: 0.9,
        }]));
        assert!(half.step_time(64, 64_000, 64) > full.step_time(64, 64_000, 64) * 1.1);
    }

    #[test]
    fn decode_step_time_grows_with_batch_and_prefill_with_prompt() {
        let e = engine_with(|_| {});
        assert!(e.step_time(64, 64 * 2000, 64) > e.step_time(1, 2000, 1));
        assert!(e.step_time(2048, 2048, 1) > 2.0 * e.step_time(256, 256, 1));
    }

    #[test]
    fn rejects_what_vllm_rejects() {
        let mut e = engine_with(|_| {});
        assert!(matches!(
            e.submit(Request::new(1, 16_000, 1000), 0.0),
            Err(ModelError::RequestTooLong { .. })
        ));
        assert_eq!(
            e.submit(Request::new(1, 10, 0), 0.0),
            Err(ModelError::ZeroMaxTokens)
        );
        e.submit(Request::new(1, 10, 10), 0.0).unwrap();
        assert_eq!(
            e.submit(Request::new(1, 10, 10), 0.0),
            Err(ModelError::DuplicateRequest(1))
        );
    }

    #[test]
    fn abort_frees_blocks_and_the_rest_go_on() {
        let mut e = engine_with(|_| {});
        e.submit(Request::new(1, 500, 100), 0.0).unwrap();
        e.submit(Request::new(2, 500, 100), 0.0).unwrap();
        e.advance(e.next_event_time().unwrap(), &mut |_| {});
        assert!(e.stats().kv_blocks_used > 0);
        assert!(e.abort(1, 0.5));
        assert!(!e.abort(1, 0.5));
        let ev = drain(&mut e);
        assert!(ev.iter().all(|x| !matches!(x, EngineEvent::Token { id: 1, .. })));
        assert_eq!((e.stats().finished_abort, e.stats().finished_length), (1, 1));
        assert_eq!(e.stats().kv_blocks_used, 0);
    }

    #[test]
    fn histogram_buckets_and_quantiles() {
        assert_eq!(buckets_1_2_5(100), vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]);
        let mut h = Histogram::new(&[1.0, 2.0]);
        for v in [0.5, 1.0, 1.5, 3.0] {
            h.observe(v);
        }
        assert_eq!(h.cumulative(), vec![(1.0, 2), (2.0, 3), (f64::INFINITY, 4)]);
        assert_eq!(h.quantile(0.5), Some(1.0));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Whatever arrives, blocks are never over-allocated, every request finishes with all its tokens,
        /// and time only moves forward.
        #[test]
        fn engine_invariants(
            reqs in prop::collection::vec((0.0f64..5.0, 1u32..600, 1u32..300, prop::option::of(1u32..300)), 1..40),
            kv_tokens in 1_024u64..20_000,
            max_num_seqs in 1u32..64,
        ) {
            let mut e = engine_with(|c| {
                c.memory = MemorySetting::KvCacheBytes(kv_tokens * 57_344);
                c.max_model_len = Some(1024);
                c.max_num_seqs = max_num_seqs;
                c.max_num_batched_tokens = 512.max(max_num_seqs);
            });
            let mut reqs = reqs;
            reqs.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut events = Vec::new();
            let mut last = 0.0f64;
            for (id, (t, p, m, s)) in reqs.iter().enumerate() {
                e.advance(*t, &mut |x| events.push(x));
                e.submit(Request { id: id as u64, prompt_tokens: *p, max_tokens: *m, stop_at: *s }, *t).unwrap();
                prop_assert!(e.stats().kv_blocks_used <= e.kv_blocks_total());
                prop_assert!(e.stats().running <= u64::from(max_num_seqs));
            }
            while let Some(t) = e.next_event_time() {
                prop_assert!(t >= last);
                last = t;
                e.advance(t, &mut |x| events.push(x));
                prop_assert!(e.stats().kv_blocks_used <= e.kv_blocks_total());
            }
            prop_assert!(e.is_idle());
            prop_assert_eq!(e.stats().kv_blocks_used, 0);
            for (id, (_, _, m, s)) in reqs.iter().enumerate() {
                let want = s.map_or(*m, |s| s.clamp(1, *m));
                let got = events.iter().find_map(|x| match x {
                    EngineEvent::Finished { id: i, output_tokens, .. } if *i == id as u64 => Some(*output_tokens),
                    _ => None,
                });
                prop_assert_eq!(got, Some(want));
            }
        }
    }

    #[test]
    fn max_tokens_are_capped_at_the_room_the_prompt_leaves() {
        assert_eq!(capped_max_tokens(1024, 1000, Some(100)), Some(24));
        assert_eq!(capped_max_tokens(1024, 1000, Some(10)), Some(10));
        assert_eq!(
            capped_max_tokens(1024, 1000, None),
            Some(24),
            "unset: the rest of the context"
        );
        assert_eq!(capped_max_tokens(1024, 1024, Some(1)), None, "no room: refused");
        assert_eq!(capped_max_tokens(1024, 2000, None), None);
    }
}
