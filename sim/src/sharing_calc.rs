//! `tessera sharing`: what happens to replicas that share one GPU, from the simulator's own sharing physics
//! (`model::sharing`). It answers the questions a platform engineer asks before packing models together: how
//! much slower does each decode, how much longer does a prompt take to its first token, and how much more does
//! the GPU serve in all?
//!
//! Each tenant decodes `batch` sequences with `context` tokens each, stepping back to back (a loaded server);
//! its step is the engine's roofline plus the host part. The answer is the steady state where each tenant's
//! duty (the share of its step on the GPU) is what its own stretched steps give, given the others' duties.
//! The tenants are either N identical ones (`--tenants`, `--model`, `--batch`, `--share`) or each its own
//! (`--tenant model=…,share=…,batch=…`, repeated: an 8B chat beside a 3B model).
//!
//! With `--prompt`, it also times one prompt's prefill (its TTFT without a queue): the prompt's chunks of at
//! most vLLM's `max_num_batched_tokens` on a replica with nothing else of its own to run, alone on the whole GPU
//! and then at its share while the co-tenants decode as in the steady state.

use clap::{Args as ClapArgs, ValueEnum};

use crate::model::sharing::{SteadyState, StepCost, neighbours_of, steady_states};
use crate::model::{EngineConfig, GIB, GpuSpec, ModelSpec, Neighbours, SharingModel};
use tessera_runtime::size::parse_bytes;

/// Most tenants one answer takes (the physics enumerates the eight busiest co-tenants and folds the rest).
pub const MAX_TENANTS: usize = 16;

/// How the tenants share the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum Mode {
    /// MPS with an SM cap of `--share` each (Tessera's pools).
    Mps,
    /// Time-slicing: no cap; tenants take turns while more than one is on the GPU. `time-slicing` (the chart's
    /// spelling) is accepted too.
    #[value(alias = "time-slicing")]
    TimeSlicing,
    /// The pessimistic bound: each tenant always gets exactly `--share` of everything.
    Proportional,
}

impl From<Mode> for SharingModel {
    fn from(m: Mode) -> SharingModel {
        match m {
            Mode::Mps => SharingModel::Mps,
            Mode::TimeSlicing => SharingModel::TimeSlicing,
            Mode::Proportional => SharingModel::Proportional,
        }
    }
}

fn gpu_help() -> String {
    format!(
        "GPU preset ({}); or give --gpu-bandwidth and --gpu-flops",
        GpuSpec::PRESETS.join(", ")
    )
}

fn model_help() -> String {
    format!(
        "Model preset ({}); or give --model-params, --weights-bytes and --kv-bytes-per-token. With --tenant, \
         the model of every tenant that names none",
        ModelSpec::PRESETS.join(", ")
    )
}

/// `tessera sharing` flags.
#[derive(Debug, Clone, ClapArgs)]
pub struct Args {
    /// GPU preset; or give --gpu-bandwidth and --gpu-flops (the help lists the presets).
    #[arg(long, env = "TESSERA_SHARING_GPU", help = gpu_help())]
    pub gpu: Option<String>,
    /// Peak HBM bandwidth in bytes per second (2.039e12, 2039G, 2.039T), instead of --gpu.
    #[arg(long, env = "TESSERA_SHARING_GPU_BANDWIDTH", value_parser = parse_rate)]
    pub gpu_bandwidth: Option<f64>,
    /// Peak dense bf16 FLOPs per second (312e12, 312T), instead of --gpu.
    #[arg(long, env = "TESSERA_SHARING_GPU_FLOPS", value_parser = parse_rate)]
    pub gpu_flops: Option<f64>,
    /// GPU memory (16GiB, 80G, bytes); overrides the preset's. Only used to say whether the tenants fit.
    #[arg(long, env = "TESSERA_SHARING_GPU_MEMORY", value_parser = parse_bytes)]
    pub gpu_memory: Option<u64>,
    /// Model preset; or give --model-params, --weights-bytes and --kv-bytes-per-token (the help lists the
    /// presets).
    #[arg(long, env = "TESSERA_SHARING_MODEL", help = model_help())]
    pub model: Option<String>,
    /// Parameter count (8.03e9, 8.03G), instead of --model.
    #[arg(long, env = "TESSERA_SHARING_MODEL_PARAMS", value_parser = parse_rate)]
    pub model_params: Option<f64>,
    /// Bytes of weights on the GPU (16G, 14.96GiB), instead of --model.
    #[arg(long, env = "TESSERA_SHARING_WEIGHTS_BYTES", value_parser = parse_bytes)]
    pub weights_bytes: Option<u64>,
    /// KV cache bytes per token (2 × layers × KV heads × head dim × dtype bytes), instead of --model.
    #[arg(long, env = "TESSERA_SHARING_KV_BYTES_PER_TOKEN", value_parser = parse_bytes)]
    pub kv_bytes_per_token: Option<u64>,
    /// Sequences each tenant decodes at once (with --tenant: for every tenant without batch=).
    #[arg(long, env = "TESSERA_SHARING_BATCH", default_value_t = 32)]
    pub batch: u64,
    /// Tokens of context per sequence, prompt plus output so far (with --tenant: for every tenant without
    /// context=).
    #[arg(long, env = "TESSERA_SHARING_CONTEXT", default_value_t = 1000)]
    pub context: u64,
    /// Identical tenants on the GPU (use --tenant, repeated, for tenants that differ).
    #[arg(
        long,
        env = "TESSERA_SHARING_TENANTS",
        default_value_t = 2,
        conflicts_with = "tenant"
    )]
    pub tenants: u32,
    /// Each tenant's share: its SM cap under MPS (0 < share ≤ 1; ignored by time-slicing). With --tenant: for
    /// every tenant without share=.
    #[arg(long, env = "TESSERA_SHARING_SHARE", default_value_t = 0.5)]
    pub share: f64,
    /// How the tenants share the GPU.
    #[arg(long, env = "TESSERA_SHARING_MODE", value_enum, default_value_t = Mode::Mps)]
    pub mode: Mode,
    /// One tenant, repeated once per tenant: comma-separated key=value pairs, any of model=PRESET (or
    /// params=, weights= and kv=, as --model-params, --weights-bytes and --kv-bytes-per-token), share=, batch=,
    /// context=, prompt=, host-time=. A key left out takes the flag's value. Example: --tenant
    /// model=llama-3.1-8b,share=0.6,batch=32 --tenant model=llama-3.2-3b,share=0.4,batch=64.
    #[arg(
        long = "tenant",
        value_name = "SPEC",
        env = "TESSERA_SHARING_TENANT",
        value_delimiter = ';',
        value_parser = parse_tenant
    )]
    pub tenant: Vec<TenantArg>,
    /// Also time the prefill of one prompt of this many tokens (its time to first token without a queue),
    /// alone on the whole GPU and shared. With --tenant: for every tenant without prompt=.
    #[arg(long, env = "TESSERA_SHARING_PROMPT")]
    pub prompt: Option<u64>,
    /// Host part of each step (26.8ms, 800us, 0), instead of the simulator's formula (1 ms + 0.25 ms per billion
    /// parameters + 30 µs per sequence). For a measured deployment, or 0 for a bare GPU kernel loop. With
    /// --tenant: for every tenant without host-time=.
    #[arg(long, env = "TESSERA_SHARING_HOST_TIME", value_parser = parse_seconds)]
    pub host_time: Option<f64>,
}

/// One `--tenant` spec as given: what it leaves out comes from the flags.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TenantArg {
    /// `model=`: a model preset.
    pub model: Option<String>,
    /// `params=`: parameter count.
    pub params: Option<f64>,
    /// `weights=`: bytes of weights.
    pub weights: Option<u64>,
    /// `kv=`: KV bytes per token.
    pub kv: Option<u64>,
    /// `share=`: SM cap.
    pub share: Option<f64>,
    /// `batch=`: sequences decoded at once.
    pub batch: Option<u64>,
    /// `context=`: tokens per sequence.
    pub context: Option<u64>,
    /// `prompt=`: tokens of the prompt whose prefill is timed.
    pub prompt: Option<u64>,
    /// `host-time=`: host part of each step, seconds.
    pub host_s: Option<f64>,
}

const TENANT_KEYS: &str = "model, params (or model-params), weights (or weights-bytes), kv (or kv-bytes-per-token), \
                           share, batch, context, prompt, host-time (or host)";

/// Parses one `--tenant` spec: `model=llama-3.1-8b,share=0.6,batch=32`.
fn parse_tenant(s: &str) -> Result<TenantArg, String> {
    let mut t = TenantArg::default();
    if s.trim().is_empty() {
        return Err(format!(
            "empty tenant: give key=value pairs, e.g. model=llama-3.1-8b,share=0.6,batch=32 (keys: {TENANT_KEYS})"
        ));
    }
    for pair in s.split(',') {
        let pair = pair.trim();
        let Some((key, value)) = pair.split_once('=') else {
            return Err(format!(
                "{pair:?} is not key=value (e.g. model=llama-3.1-8b,share=0.6; keys: {TENANT_KEYS})"
            ));
        };
        let (key, value) = (key.trim().to_ascii_lowercase(), value.trim());
        let int = |what: &str| {
            value
                .parse::<u64>()
                .map_err(|_| format!("{key}={value:?}: {what} must be a whole number"))
        };
        let dup = match key.as_str() {
            "model" => t.model.replace(value.to_owned()).is_some(),
            "params" | "model-params" => t
                .params
                .replace(parse_rate(value).map_err(|e| format!("{key}=: {e}"))?)
                .is_some(),
            "weights" | "weights-bytes" => t
                .weights
                .replace(parse_bytes(value).map_err(|e| format!("{key}=: {e}"))?)
                .is_some(),
            "kv" | "kv-bytes-per-token" => {
                t.kv.replace(parse_bytes(value).map_err(|e| format!("{key}=: {e}"))?)
                    .is_some()
            }
            "share" => t
                .share
                .replace(value.parse::<f64>().map_err(|_| {
                    format!("share={value:?} is not a number (0 < share ≤ 1, e.g. share=0.6)")
                })?)
                .is_some(),
            "batch" => t.batch.replace(int("the batch (sequences)")?).is_some(),
            "context" => t.context.replace(int("the context (tokens)")?).is_some(),
            "prompt" => t.prompt.replace(int("the prompt (tokens)")?).is_some(),
            "host-time" | "host_time" | "host" => t.host_s.replace(parse_seconds(value)?).is_some(),
            _ => return Err(format!("unknown key {key:?}; known keys: {TENANT_KEYS}")),
        };
        if dup {
            return Err(format!("{key}= is given twice in one tenant"));
        }
    }
    Ok(t)
}

/// A number with an optional SI suffix (K, M, G, T, P) and an optional `B/s`, `/s` or `FLOPS` unit.
fn parse_rate(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let t = ["B/s", "/s", "FLOPS", "flops"]
        .iter()
        .find_map(|u| t.strip_suffix(u))
        .unwrap_or(t)
        .trim();
    let (num, mult) = match t.chars().last() {
        Some('K') => (&t[..t.len() - 1], 1e3),
        Some('M') => (&t[..t.len() - 1], 1e6),
        Some('G') => (&t[..t.len() - 1], 1e9),
        Some('T') => (&t[..t.len() - 1], 1e12),
        Some('P') => (&t[..t.len() - 1], 1e15),
        _ => (t, 1.0),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number (e.g. 2.039e12, 2039G, 2.039T)"))?;
    if !(n.is_finite() && n > 0.0) {
        return Err(format!("{s:?} must be a positive number"));
    }
    Ok(n * mult)
}

/// A time in seconds from `26.8ms`, `800us` (or `µs`), `0.0268s` or a bare `0`; never negative.
fn parse_seconds(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let (num, mult) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix("us").or_else(|| t.strip_suffix("µs")) {
        (n, 1e-6)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else {
        (t, f64::NAN)
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a time (e.g. 4ms, 26.8ms, 800us, 0)"))?;
    if !(n.is_finite() && n >= 0.0) {
        return Err(format!("{s:?} must be a time ≥ 0 (e.g. 4ms, 0)"));
    }
    if mult.is_nan() {
        // A bare number is only unambiguous at zero.
        return if n == 0.0 {
            Ok(0.0)
        } else {
            Err(format!("{s:?} needs a unit: {s}ms, {s}us or {s}s"))
        };
    }
    Ok(n * mult)
}

/// One tenant as computed: its inputs, its step alone and shared, and its prompt's prefill.
#[derive(Debug, Clone)]
pub struct TenantAnswer {
    /// The model.
    pub model: ModelSpec,
    /// Its SM cap (MPS, proportional).
    pub share: f64,
    /// Sequences it decodes at once.
    pub batch: u64,
    /// Tokens of context per sequence.
    pub context: u64,
    /// One decode step, alone with the whole GPU.
    pub cost: StepCost,
    /// Alone (whole GPU) and shared (at its share, beside the others).
    pub state: SteadyState,
    /// Bytes it holds (weights, activations, its batch's KV cache).
    pub bytes: u64,
    /// The prefill of its `--prompt`, when one was asked for.
    pub prefill: Option<Prefill>,
}

/// One prompt's prefill: its chunks' steps back to back, alone and shared.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prefill {
    /// Prompt tokens.
    pub tokens: u64,
    /// Steps it takes (vLLM prefills at most `max_num_batched_tokens` a step).
    pub chunks: u64,
    /// Seconds alone on the whole GPU.
    pub alone_s: f64,
    /// Seconds at its share beside the co-tenants' steady state.
    pub shared_s: f64,
}

impl TenantAnswer {
    /// Time per output token alone (a decode step yields one token per sequence), ms.
    pub fn tpot_alone_ms(&self) -> f64 {
        self.state.alone.duration_s * 1000.0
    }
    /// Time per output token shared, ms.
    pub fn tpot_shared_ms(&self) -> f64 {
        self.state.shared.duration_s * 1000.0
    }
    /// Tokens per second alone.
    pub fn throughput_alone(&self) -> f64 {
        self.batch as f64 / self.state.alone.duration_s
    }
    /// Tokens per second shared.
    pub fn throughput_shared(&self) -> f64 {
        self.batch as f64 / self.state.shared.duration_s
    }
    /// Shared throughput over alone.
    pub fn throughput_ratio(&self) -> f64 {
        self.throughput_shared() / self.throughput_alone()
    }
}

/// What `tessera sharing` computes, before printing.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The GPU.
    pub gpu: GpuSpec,
    /// How they share it.
    pub mode: SharingModel,
    /// The tenants, in the order given (N copies of one without `--tenant`).
    pub tenants: Vec<TenantAnswer>,
    /// Whether they came from `--tenant` (each its own) rather than `--tenants N` (identical).
    pub distinct: bool,
}

impl Answer {
    /// The sum over tenants of each one's shared throughput over its own alone: how many tenants' worth of
    /// work the GPU does (N × the throughput ratio for identical tenants).
    pub fn aggregate_ratio(&self) -> f64 {
        self.tenants.iter().map(TenantAnswer::throughput_ratio).sum()
    }
    /// Bytes all tenants hold.
    pub fn bytes(&self) -> u64 {
        self.tenants.iter().map(|t| t.bytes).sum()
    }
}

fn invalid(msg: impl Into<String>) -> anyhow::Error {
    anyhow::anyhow!(msg.into())
}

/// The model from `--model` or the explicit flags; `None` when none of them is given.
fn top_model(args: &Args) -> anyhow::Result<Option<ModelSpec>> {
    let explicit = (args.model_params, args.weights_bytes, args.kv_bytes_per_token);
    match (&args.model, explicit) {
        (None, (None, None, None)) => Ok(None),
        (Some(name), (None, None, None)) => Ok(Some(ModelSpec::preset(name)?)),
        (Some(_), _) => Err(invalid(
            "give either --model PRESET or --model-params, --weights-bytes and --kv-bytes-per-token, not both",
        )),
        (None, (Some(p), Some(w), Some(kv))) => Ok(Some(custom_model(p, w, kv))),
        (None, (p, w, kv)) => Err(invalid(format!(
            "--model-params, --weights-bytes and --kv-bytes-per-token go together: missing {}",
            missing(&[
                ("--model-params", p.is_some()),
                ("--weights-bytes", w.is_some()),
                ("--kv-bytes-per-token", kv.is_some())
            ])
        ))),
    }
}

fn missing(given: &[(&str, bool)]) -> String {
    given
        .iter()
        .filter(|(_, g)| !g)
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(" and ")
}

fn custom_model(params: f64, weights_bytes: u64, kv: u64) -> ModelSpec {
    ModelSpec {
        name: "custom".into(),
        params,
        weights_bytes,
        bytes_per_kv_token: kv,
        max_model_len: u32::MAX,
        overhead_bytes: GIB,
    }
}

/// One tenant's inputs, resolved from its spec and the flags.
struct Resolved {
    model: ModelSpec,
    share: f64,
    batch: u64,
    context: u64,
    prompt: Option<u64>,
    host_s: Option<f64>,
}

/// Resolves `--tenant` number `n` (1-based) over the flags.
fn resolve_tenant(n: usize, t: &TenantArg, args: &Args, top: &Option<ModelSpec>) -> anyhow::Result<Resolved> {
    let who = format!("--tenant #{n}");
    let model = match (&t.model, t.params, t.weights, t.kv) {
        (Some(name), None, None, None) => ModelSpec::preset(name).map_err(|e| invalid(format!("{who}: {e}")))?,
        (Some(_), ..) => {
            return Err(invalid(format!(
                "{who}: give model=PRESET or params=, weights= and kv=, not both"
            )));
        }
        (None, Some(p), Some(w), Some(kv)) => custom_model(p, w, kv),
        (None, None, None, None) => top.clone().ok_or_else(|| {
            invalid(format!(
                "{who} names no model: add model=PRESET ({}) or params=, weights= and kv= to it, or give --model for \
                 every tenant that names none",
                ModelSpec::PRESETS.join(", ")
            ))
        })?,
        (None, p, w, kv) => {
            return Err(invalid(format!(
                "{who}: params=, weights= and kv= go together: missing {}",
                missing(&[
                    ("params=", p.is_some()),
                    ("weights=", w.is_some()),
                    ("kv=", kv.is_some())
                ])
            )));
        }
    };
    Ok(Resolved {
        model,
        share: t.share.unwrap_or(args.share),
        batch: t.batch.unwrap_or(args.batch),
        context: t.context.unwrap_or(args.context),
        prompt: t.prompt.or(args.prompt),
        host_s: t.host_s.or(args.host_time),
    })
}

/// Checks one tenant's numbers; `who` names where they came from (`--tenant #2` or the flags).
fn check(r: &Resolved, who: Option<&str>) -> anyhow::Result<()> {
    let name = |flag: &str, key: &str, value: String| match who {
        Some(w) => format!("{key}={value} in {w}"),
        None => format!("--{flag} {value}"),
    };
    if r.batch == 0 {
        return Err(invalid(format!(
            "{} must be at least 1 sequence",
            name("batch", "batch", "0".into())
        )));
    }
    if !(r.share > 0.0 && r.share <= 1.0) {
        return Err(invalid(format!(
            "{} is outside (0, 1]: it is the tenant's SM cap (0.5 = half the SMs)",
            name("share", "share", r.share.to_string())
        )));
    }
    if let Some(p) = r.prompt {
        if p == 0 {
            return Err(invalid(format!(
                "{} must be at least 1 token",
                name("prompt", "prompt", "0".into())
            )));
        }
        if p > u64::from(r.model.max_model_len) {
            return Err(invalid(format!(
                "{} is longer than {} allows ({} tokens): give a shorter prompt",
                name("prompt", "prompt", p.to_string()),
                r.model.name,
                r.model.max_model_len
            )));
        }
    }
    Ok(())
}

/// One step's cost as the engine prices it ([`crate::model::step_cost`]), with the host part given where
/// `host_s` is.
fn step_cost(
    gpu: &GpuSpec,
    model: &ModelSpec,
    cfg: &EngineConfig,
    tokens: u64,
    kv_tokens: u64,
    seqs: u64,
    host_s: Option<f64>,
) -> StepCost {
    let cost = crate::model::step_cost(gpu, model, cfg, tokens, kv_tokens, seqs);
    StepCost {
        overhead_s: host_s.unwrap_or(cost.overhead_s),
        ..cost
    }
}

/// Computes the answer, refusing bad input with a message that names the flag and the fix.
pub fn answer(args: &Args) -> anyhow::Result<Answer> {
    let mut gpu = match (&args.gpu, args.gpu_bandwidth, args.gpu_flops) {
        (Some(name), None, None) => GpuSpec::preset(name)?,
        (None, Some(bw), Some(flops)) => GpuSpec {
            name: "custom".into(),
            memory_bytes: args.gpu_memory.unwrap_or(0),
            hbm_bandwidth_bytes_per_s: bw,
            flops,
        },
        (Some(_), _, _) => {
            return Err(invalid(
                "give either --gpu PRESET or --gpu-bandwidth and --gpu-flops, not both",
            ));
        }
        (None, _, _) => {
            return Err(invalid(format!(
                "no GPU: give --gpu PRESET ({}) or both --gpu-bandwidth B/s and --gpu-flops F",
                GpuSpec::PRESETS.join(", ")
            )));
        }
    };
    if let Some(m) = args.gpu_memory {
        gpu.memory_bytes = m;
    }
    if args.prompt == Some(0) {
        return Err(invalid("--prompt 0 must be at least 1 token"));
    }
    let top = top_model(args)?;
    let distinct = !args.tenant.is_empty();
    let resolved: Vec<Resolved> = if distinct {
        if args.tenant.len() > MAX_TENANTS {
            return Err(invalid(format!(
                "--tenant is given {} times: at most {MAX_TENANTS} tenants share one GPU here",
                args.tenant.len()
            )));
        }
        let mut v = Vec::with_capacity(args.tenant.len());
        for (i, t) in args.tenant.iter().enumerate() {
            let r = resolve_tenant(i + 1, t, args, &top)?;
            check(&r, Some(&format!("--tenant #{}", i + 1)))?;
            v.push(r);
        }
        v
    } else {
        let model = top.ok_or_else(|| {
            invalid(format!(
                "no model: give --model PRESET ({}) or all of --model-params, --weights-bytes and \
                 --kv-bytes-per-token (or one --tenant model=…,share=… per tenant)",
                ModelSpec::PRESETS.join(", ")
            ))
        })?;
        if args.tenants == 0 || args.tenants as usize > MAX_TENANTS {
            return Err(invalid(format!(
                "--tenants {} is outside 1..={MAX_TENANTS}",
                args.tenants
            )));
        }
        let r = Resolved {
            model,
            share: args.share,
            batch: args.batch,
            context: args.context,
            prompt: args.prompt,
            host_s: args.host_time,
        };
        check(&r, None)?;
        (0..args.tenants)
            .map(|_| Resolved {
                model: r.model.clone(),
                ..r
            })
            .collect()
    };
    let cfg = EngineConfig::vllm_defaults(&gpu);
    let mode = SharingModel::from(args.mode);
    let costs: Vec<(StepCost, f64)> = resolved
        .iter()
        .map(|r| {
            let kv = r.batch.saturating_mul(r.context);
            (
                step_cost(&gpu, &r.model, &cfg, r.batch, kv, r.batch, r.host_s),
                r.share,
            )
        })
        .collect();
    let (states, duty) = steady_states(mode, &costs);
    let none = Neighbours::default();
    let tenants = resolved
        .into_iter()
        .zip(states)
        .enumerate()
        .map(|(i, (r, state))| {
            let prefill = r.prompt.map(|p| {
                let neighbours = neighbours_of(i, &costs, &duty);
                let chunk = u64::from(cfg.max_num_batched_tokens).max(1);
                let (mut done, mut chunks, mut alone_s, mut shared_s) = (0u64, 0u64, 0.0, 0.0);
                while done < p {
                    let n = chunk.min(p - done);
                    let c = step_cost(&gpu, &r.model, &cfg, n, done + n, 1, r.host_s);
                    alone_s += mode.step(c, 1.0, &none).duration_s;
                    shared_s += mode.step(c, r.share, &neighbours).duration_s;
                    done += n;
                    chunks += 1;
                }
                Prefill {
                    tokens: p,
                    chunks,
                    alone_s,
                    shared_s,
                }
            });
            let kv_bytes = r
                .batch
                .saturating_mul(r.context)
                .saturating_mul(r.model.bytes_per_kv_token);
            TenantAnswer {
                bytes: r
                    .model
                    .weights_bytes
                    .saturating_add(r.model.overhead_bytes)
                    .saturating_add(kv_bytes),
                cost: costs[i].0,
                model: r.model,
                share: r.share,
                batch: r.batch,
                context: r.context,
                state,
                prefill,
            }
        })
        .collect();
    Ok(Answer {
        gpu,
        mode,
        tenants,
        distinct,
    })
}

fn gib(b: f64) -> f64 {
    b / GIB as f64
}

fn ms(s: f64) -> f64 {
    s * 1000.0
}

/// One tenant's step alone, by part: `1.23 ms on the GPU (memory …, compute …) + … ms host`.
fn step_parts(t: &TenantAnswer) -> String {
    format!(
        "{:.2} ms on the GPU (memory {:.2} ms, compute {:.2} ms) + {:.2} ms host",
        ms(t.state.alone.gpu_s),
        ms(t.cost.memory_s),
        ms(t.cost.compute_s),
        ms(t.cost.overhead_s)
    )
}

fn gpu_line(gpu: &GpuSpec) -> String {
    format!(
        "GPU {}: {:.0} GB/s, {:.0} TFLOPS{}\n",
        gpu.name,
        gpu.hbm_bandwidth_bytes_per_s / 1e9,
        gpu.flops / 1e12,
        if gpu.memory_bytes > 0 {
            format!(", {:.1} GiB", gib(gpu.memory_bytes as f64))
        } else {
            String::new()
        }
    )
}

fn fits_word(ok: bool) -> &'static str {
    if ok {
        "fits"
    } else {
        "DOES NOT FIT (the figures below assume it did)"
    }
}

fn fits_key(a: &Answer) -> &'static str {
    fits(a).map_or("unknown", |(ok, ..)| if ok { "true" } else { "false" })
}

fn prefill_line(p: &Prefill, indent: &str) -> String {
    format!(
        "{indent}prefill of a {}-token prompt ({} step{}, nothing else of its own running): alone {:.2} ms, shared \
         {:.2} ms (×{:.2})\n",
        p.tokens,
        p.chunks,
        if p.chunks == 1 { "" } else { "s" },
        ms(p.alone_s),
        ms(p.shared_s),
        p.shared_s / p.alone_s
    )
}

fn prefill_keys(p: &Prefill, prefix: &str) -> String {
    format!(
        "{prefix}ttft_alone_ms={:.3} {prefix}ttft_shared_ms={:.3} {prefix}ttft_ratio={:.4} ",
        ms(p.alone_s),
        ms(p.shared_s),
        p.shared_s / p.alone_s
    )
}

/// The report `tessera sharing` prints; its last line is `key=value` pairs for scripts.
pub fn render(args: &Args, a: &Answer) -> String {
    if a.distinct {
        render_distinct(a)
    } else {
        render_identical(args, a)
    }
}

/// N identical tenants (`--tenants`): one set of figures.
fn render_identical(args: &Args, a: &Answer) -> String {
    let t = &a.tenants[0];
    let n = a.tenants.len();
    let mut out = gpu_line(&a.gpu);
    out.push_str(&format!(
        "model {}: {:.2}B parameters, {:.2} GiB of weights, {} KV bytes per token\n",
        t.model.name,
        t.model.params / 1e9,
        gib(t.model.weights_bytes as f64),
        t.model.bytes_per_kv_token
    ));
    out.push_str(&format!(
        "{} tenant(s), each decoding {} sequences at {} tokens of context; {} with share {}\n",
        n,
        t.batch,
        args.context,
        a.mode.name(),
        args.share
    ));
    if let Some((ok, need, have)) = fits(a) {
        out.push_str(&format!(
            "memory: {} × {:.1} GiB (weights, activations, this batch's KV) = {:.1} GiB of {:.1} GiB: {}\n",
            n,
            gib(t.bytes as f64),
            gib(need),
            gib(have),
            fits_word(ok)
        ));
    }
    out.push_str(&format!("one step alone: {}\n", step_parts(t)));
    out.push_str(&format!(
        "alone (whole GPU):  step {:.2} ms, TPOT {:.2} ms, GPU busy {:.0}% of the step, {:.0} tokens/s\n",
        t.tpot_alone_ms(),
        t.tpot_alone_ms(),
        t.state.alone.busy * 100.0,
        t.throughput_alone()
    ));
    out.push_str(&format!(
        "shared ({} tenants): step {:.2} ms, TPOT {:.2} ms, GPU busy {:.0}% of the step, {:.0} tokens/s each, {:.0} in all\n",
        n,
        t.tpot_shared_ms(),
        t.tpot_shared_ms(),
        t.state.shared.busy * 100.0,
        t.throughput_shared(),
        t.throughput_shared() * n as f64
    ));
    if let Some(p) = &t.prefill {
        out.push_str(&prefill_line(p, ""));
    }
    out.push_str(&format!(
        "tpot_alone_ms={:.3} tpot_shared_ms={:.3} tpot_ratio={:.4} throughput_ratio={:.4} aggregate_ratio={:.4} {}fits={}\n",
        t.tpot_alone_ms(),
        t.tpot_shared_ms(),
        t.tpot_shared_ms() / t.tpot_alone_ms(),
        t.throughput_ratio(),
        a.aggregate_ratio(),
        t.prefill.as_ref().map(|p| prefill_keys(p, "")).unwrap_or_default(),
        fits_key(a)
    ));
    out
}

/// Tenants given one by one (`--tenant`): figures per tenant, and the script line's keys prefixed `t1_`, `t2_`, …
fn render_distinct(a: &Answer) -> String {
    let mut out = gpu_line(&a.gpu);
    let shares: f64 = a.tenants.iter().map(|t| t.share).sum();
    out.push_str(&format!(
        "{} tenant(s) under {}{}:\n",
        a.tenants.len(),
        a.mode.name(),
        match a.mode {
            SharingModel::TimeSlicing =>
                " (shares ignored: no SM cap, turns while more than one is on the GPU)",
            _ => "",
        }
    ));
    for (i, t) in a.tenants.iter().enumerate() {
        out.push_str(&format!(
            "  t{} {}: {:.2}B parameters, {:.2} GiB of weights; decodes {} sequences at {} tokens of context; share {}\n",
            i + 1,
            t.model.name,
            t.model.params / 1e9,
            gib(t.model.weights_bytes as f64),
            t.batch,
            t.context,
            t.share
        ));
    }
    if a.mode != SharingModel::TimeSlicing && shares > 1.0 + 1e-9 {
        out.push_str(&format!(
            "note: the shares add up to {shares:.2}; caps are limits, not reservations, so tenants in their GPU part \
             at the same moment are scaled down in proportion\n"
        ));
    }
    if let Some((ok, need, have)) = fits(a) {
        let each: Vec<String> = a
            .tenants
            .iter()
            .map(|t| format!("{:.1}", gib(t.bytes as f64)))
            .collect();
        out.push_str(&format!(
            "memory: {} GiB (weights, activations, each batch's KV) = {:.1} GiB of {:.1} GiB: {}\n",
            each.join(" + "),
            gib(need),
            gib(have),
            fits_word(ok)
        ));
    }
    let mut keys = format!("tenants={} ", a.tenants.len());
    for (i, t) in a.tenants.iter().enumerate() {
        out.push_str(&format!("t{}: one step alone {}\n", i + 1, step_parts(t)));
        out.push_str(&format!(
            "    alone (whole GPU): TPOT {:.2} ms, GPU busy {:.0}% of the step, {:.0} tokens/s\n",
            t.tpot_alone_ms(),
            t.state.alone.busy * 100.0,
            t.throughput_alone()
        ));
        out.push_str(&format!(
            "    shared:            TPOT {:.2} ms (×{:.2}), GPU busy {:.0}% of the step, {:.0} tokens/s ({:.0}% of alone)\n",
            t.tpot_shared_ms(),
            t.tpot_shared_ms() / t.tpot_alone_ms(),
            t.state.shared.busy * 100.0,
            t.throughput_shared(),
            t.throughput_ratio() * 100.0
        ));
        if let Some(p) = &t.prefill {
            out.push_str(&prefill_line(p, "    "));
        }
        let prefix = format!("t{}_", i + 1);
        keys.push_str(&format!(
            "{prefix}tpot_alone_ms={:.3} {prefix}tpot_shared_ms={:.3} {prefix}tpot_ratio={:.4} {prefix}throughput_ratio={:.4} ",
            t.tpot_alone_ms(),
            t.tpot_shared_ms(),
            t.tpot_shared_ms() / t.tpot_alone_ms(),
            t.throughput_ratio()
        ));
        if let Some(p) = &t.prefill {
            keys.push_str(&prefill_keys(p, &prefix));
        }
    }
    out.push_str(&format!(
        "in all: each tenant's tokens/s over its own alone add up to {:.2} (one GPU's worth of tenants alone = 1)\n",
        a.aggregate_ratio()
    ));
    out.push_str(&format!(
        "{keys}aggregate_ratio={:.4} fits={}\n",
        a.aggregate_ratio(),
        fits_key(a)
    ));
    out
}

/// Whether the tenants' memory fits the GPU's (`None` when the GPU's memory is not known: explicit bandwidth and
/// flops without `--gpu-memory`).
fn fits(a: &Answer) -> Option<(bool, f64, f64)> {
    (a.gpu.memory_bytes > 0).then(|| {
        let need = a.bytes() as f64;
        let have = a.gpu.memory_bytes as f64;
        (need <= have, need, have)
    })
}

/// Runs `tessera sharing`. Tenants that do not fit are an answer too: the figures are printed (marked) with
/// `fits=false` on the script line, and the command fails, so a script never takes tokens/s of a GPU that cannot
/// hold them for a yes.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let a = answer(&args)?;
    print!("{}", render(&args, &a));
    if let Some((false, need, have)) = fits(&a) {
        anyhow::bail!(
            "{} tenants need {:.1} GiB of GPU memory and the GPU has {:.1} GiB: fewer tenants (--tenants or \
             --tenant), a smaller batch or context, or a GPU with more memory",
            a.tenants.len(),
            need / GIB as f64,
            have / GIB as f64
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::model::Engine;
    use crate::model::sharing::{host_time_s, steady_state};

    fn args(a: &[&str]) -> Args {
        tessera_runtime::try_parse_args(&[&["sharing"], a].concat()).unwrap()
    }

    fn rel(a: f64, b: f64) -> f64 {
        (a / b - 1.0).abs()
    }

    #[test]
    fn presets_and_explicit_numbers_give_the_same_answer() {
        let p = answer(&args(&[
            "--gpu",
            "a100-80gb",
            "--model",
            "qwen3-14b",
            "--batch",
            "8",
        ]))
        .unwrap();
        let g = GpuSpec::preset("a100-80gb").unwrap();
        let m = ModelSpec::preset("qwen3-14b").unwrap();
        let e = answer(&args(&[
            "--gpu-bandwidth",
            &g.hbm_bandwidth_bytes_per_s.to_string(),
            "--gpu-flops",
            &format!("{}T", g.flops / 1e12),
            "--model-params",
            &m.params.to_string(),
            "--weights-bytes",
            &m.weights_bytes.to_string(),
            "--kv-bytes-per-token",
            &m.bytes_per_kv_token.to_string(),
            "--batch",
            "8",
        ]))
        .unwrap();
        assert_eq!(p.tenants[0].state, e.tenants[0].state);
    }

    /// The calculator's step is the engine's step: the same roofline and host part for decode and for
    /// prefill chunks, so the two never drift apart.
    #[test]
    fn step_cost_is_the_engines_step_time() {
        for (g, m) in [
            ("a100-80gb", "qwen3-14b"),
            ("h100-80gb", "llama-3.2-3b"),
            ("l4", "llama-3.2-1b"),
        ] {
            let gpu = GpuSpec::preset(g).unwrap();
            let model = ModelSpec::preset(m).unwrap();
            let cfg = EngineConfig::vllm_defaults(&gpu);
            let engine = Engine::new(model.clone(), gpu.clone(), cfg.clone()).unwrap();
            for (tokens, kv, seqs) in [(32, 32_000, 32), (2048, 2048, 1), (1, 1, 1), (512, 90_000, 256)] {
                let mine = SharingModel::Mps
                    .step(
                        step_cost(&gpu, &model, &cfg, tokens, kv, seqs, None),
                        1.0,
                        &Neighbours::default(),
                    )
                    .duration_s;
                let engine_s = engine.step_time(tokens, kv, seqs);
                assert!(
                    rel(mine, engine_s) < 1e-12,
                    "{g} {m} {tokens}: {mine} vs {engine_s}"
                );
            }
        }
    }

    #[test]
    fn one_tenant_is_its_own_baseline_and_more_never_exceed_the_gpu() {
        let one = answer(&args(&[
            "--gpu",
            "h100",
            "--model",
            "llama-3.1-8b",
            "--tenants",
            "1",
            "--share",
            "1",
        ]))
        .unwrap();
        let t = &one.tenants[0];
        assert!((t.tpot_shared_ms() - t.tpot_alone_ms()).abs() < 1e-9);
        for mode in ["mps", "time_slicing"] {
            let a = answer(&args(&[
                "--gpu",
                "a100",
                "--model",
                "qwen3-14b",
                "--batch",
                "8",
                "--tenants",
                "3",
                "--mode",
                mode,
            ]))
            .unwrap();
            let t = &a.tenants[0];
            // Three tenants read at most the GPU's bandwidth: aggregate ≤ 1 / (alone's GPU duty).
            assert!(
                a.aggregate_ratio() <= 1.0 / t.state.alone.busy + 1e-9,
                "{mode}: {}",
                a.aggregate_ratio()
            );
            assert!((a.aggregate_ratio() - 3.0 * t.throughput_ratio()).abs() < 1e-12);
            assert!(t.tpot_shared_ms() > t.tpot_alone_ms(), "{mode}");
        }
    }

    /// Identical tenants given one by one are the same answer as `--tenants N`, and both are the physics' own
    /// steady state for identical tenants.
    #[test]
    fn identical_tenants_given_one_by_one_match_the_tenants_flag() {
        for mode in ["mps", "time_slicing", "proportional"] {
            let n = answer(&args(&[
                "--gpu",
                "a100",
                "--model",
                "qwen3-14b",
                "--batch",
                "8",
                "--tenants",
                "3",
                "--mode",
                mode,
            ]))
            .unwrap();
            let spec = "model=qwen3-14b,batch=8,share=0.5";
            let each = answer(&args(&[
                "--gpu", "a100", "--tenant", spec, "--tenant", spec, "--tenant", spec, "--mode", mode,
            ]))
            .unwrap();
            assert!(each.distinct && !n.distinct);
            let physics = steady_state(
                SharingModel::from(args(&["--mode", mode]).mode),
                n.tenants[0].cost,
                0.5,
                3,
            );
            for t in each.tenants.iter().chain(&n.tenants) {
                assert!(
                    rel(t.state.shared.duration_s, physics.shared.duration_s) < 1e-12,
                    "{mode}"
                );
                assert!(
                    rel(t.state.alone.duration_s, physics.alone.duration_s) < 1e-12,
                    "{mode}"
                );
            }
        }
    }

    /// An 8B chat at 0.6 beside a 3B model at 0.4 on an H100: both slow down, neither below what a fixed
    /// partition of its share gives it, and together they never read more than the GPU's bandwidth.
    #[test]
    fn unequal_tenants_share_one_gpu() {
        let a = answer(&args(&[
            "--gpu",
            "h100-80gb",
            "--tenant",
            "model=llama-3.1-8b,share=0.6,batch=32",
            "--tenant",
            "model=llama-3.2-3b,share=0.4,batch=64,context=500",
        ]))
        .unwrap();
        let (chat, small) = (&a.tenants[0], &a.tenants[1]);
        assert_eq!(chat.model.name, "meta-llama/Llama-3.1-8B-Instruct");
        assert_eq!((small.batch, small.context, small.share), (64, 500, 0.4));
        assert_eq!(chat.context, 1000, "context= left out takes --context");
        for t in &a.tenants {
            assert!(t.tpot_shared_ms() > t.tpot_alone_ms());
            let fixed = SharingModel::Proportional.step(t.cost, t.share, &Neighbours::default());
            assert!(t.state.shared.duration_s <= fixed.duration_s + 1e-12);
        }
        // HBM busy in all: each one's shared steps per second × its GPU time per step alone.
        let hbm: f64 = a
            .tenants
            .iter()
            .map(|t| t.throughput_ratio() * t.state.alone.gpu_s / t.state.alone.duration_s)
            .sum();
        assert!(hbm <= 1.0 + 1e-6, "HBM busy {hbm}");
        assert!(a.aggregate_ratio() > 1.0 && a.aggregate_ratio() < 2.0);
        // The same pair with the shares swapped: each tenant's lot follows its own share.
        let b = answer(&args(&[
            "--gpu",
            "h100-80gb",
            "--tenant",
            "model=llama-3.1-8b,share=0.4,batch=32",
            "--tenant",
            "model=llama-3.2-3b,share=0.6,batch=64,context=500",
        ]))
        .unwrap();
        assert!(b.tenants[0].throughput_ratio() <= a.tenants[0].throughput_ratio() + 1e-12);
        let report = render(&args(&["--gpu", "h100-80gb"]), &a);
        assert!(report.contains("t2 meta-llama/Llama-3.2-3B-Instruct"), "{report}");
        assert!(
            report
                .lines()
                .last()
                .unwrap()
                .starts_with("tenants=2 t1_tpot_alone_ms="),
            "{report}"
        );
    }

    /// A prompt's prefill is bound by the SMs: at an MPS share it stretches by about 1 / share, a long one
    /// takes several chunks of `max_num_batched_tokens`, and a bigger share is a shorter TTFT.
    #[test]
    fn prefill_alone_and_shared() {
        let gpu = GpuSpec::preset("a100-80gb").unwrap();
        let model = ModelSpec::preset("llama-3.1-8b").unwrap();
        let cfg = EngineConfig::vllm_defaults(&gpu);
        let a = answer(&args(&[
            "--gpu",
            "a100-80gb",
            "--model",
            "llama-3.1-8b",
            "--tenants",
            "1",
            "--share",
            "0.5",
            "--prompt",
            "2000",
        ]))
        .unwrap();
        let p = a.tenants[0].prefill.unwrap();
        assert_eq!((p.tokens, p.chunks), (2000, 1));
        let by_hand = 2.0 * model.params * 2000.0 / (gpu.flops * cfg.compute_efficiency)
            + host_time_s(cfg.step_overhead_s, model.params, 1);
        assert!(rel(p.alone_s, by_hand) < 1e-12, "{} vs {by_hand}", p.alone_s);
        // Alone at half the SMs: the compute part doubles, the host part does not.
        let host = host_time_s(cfg.step_overhead_s, model.params, 1);
        assert!(rel(p.shared_s - host, 2.0 * (p.alone_s - host)) < 1e-9);
        // 5,000 tokens on an A100 (2,048 a step): three chunks, each reading the KV written so far.
        let long = answer(&args(&[
            "--gpu",
            "a100-80gb",
            "--model",
            "llama-3.1-8b",
            "--tenants",
            "1",
            "--prompt",
            "5000",
        ]))
        .unwrap();
        assert_eq!(long.tenants[0].prefill.unwrap().chunks, 3);
        // Beside a busy 3B decoder: the bigger share, the shorter prefill; both longer than alone.
        let ttft = |share: &str| {
            let a = answer(&args(&[
                "--gpu",
                "a100-80gb",
                "--prompt",
                "2000",
                "--tenant",
                &format!("model=llama-3.1-8b,share={share},batch=8"),
                "--tenant",
                "model=llama-3.2-3b,share=0.5,batch=64",
            ]))
            .unwrap();
            a.tenants[0].prefill.unwrap()
        };
        let (small, big) = (ttft("0.3"), ttft("0.7"));
        assert!(small.shared_s > big.shared_s && big.shared_s > big.alone_s);
        assert!(
            rel(small.alone_s, big.alone_s) < 1e-12,
            "alone is the whole GPU whatever the share"
        );
        // Time-slicing: no cap, so the prompt alone is the whole GPU, and the busy neighbour takes turns.
        let ts = answer(&args(&[
            "--gpu",
            "a100-80gb",
            "--model",
            "llama-3.1-8b",
            "--mode",
            "time_slicing",
            "--prompt",
            "2000",
        ]))
        .unwrap();
        let p = ts.tenants[0].prefill.unwrap();
        assert!(p.shared_s > p.alone_s);
    }

    /// `--host-time` replaces the formula's host part (0 for a bare kernel loop): two memory-bound tenants with
    /// no host time split the bandwidth under MPS, so together they serve exactly one GPU's worth.
    #[test]
    fn host_time_overrides_the_formula() {
        let a = answer(&args(&[
            "--gpu",
            "h200",
            "--model",
            "llama-3.1-8b",
            "--batch",
            "8",
            "--host-time",
            "0",
            "--tenants",
            "2",
        ]))
        .unwrap();
        assert_eq!(a.tenants[0].cost.overhead_s, 0.0);
        assert!(rel(a.aggregate_ratio(), 1.0) < 1e-6, "{}", a.aggregate_ratio());
        let b = answer(&args(&[
            "--gpu",
            "h200",
            "--model",
            "llama-3.1-8b",
            "--host-time",
            "26.8ms",
        ]))
        .unwrap();
        assert!(rel(b.tenants[0].cost.overhead_s, 0.0268) < 1e-12);
        let t = answer(&args(&[
            "--gpu",
            "h200",
            "--model",
            "llama-3.1-8b",
            "--tenant",
            "host=800us",
            "--tenant",
            "batch=4",
        ]))
        .unwrap();
        assert!(rel(t.tenants[0].cost.overhead_s, 0.0008) < 1e-12);
        assert!(rel(t.tenants[1].cost.overhead_s, host_time_s(0.001, 8.03e9, 4)) < 1e-12);
        assert_eq!(parse_seconds("0").unwrap(), 0.0);
        assert!(parse_seconds("4").unwrap_err().contains("4ms"));
        assert!(parse_seconds("-1ms").is_err() && parse_seconds("soon").is_err());
    }

    #[test]
    fn gpu_and_model_help_name_every_preset() {
        let (g, m) = (gpu_help(), model_help());
        for p in GpuSpec::PRESETS {
            assert!(g.contains(p), "{p} missing from --gpu help: {g}");
        }
        for p in ModelSpec::PRESETS {
            assert!(m.contains(p), "{p} missing from --model help: {m}");
        }
    }

    #[test]
    fn bad_input_names_the_flag() {
        for (a, want) in [
            (vec!["--model", "qwen3-14b"], "--gpu"),
            (vec!["--gpu", "a100"], "--model"),
            (
                vec!["--gpu", "a100", "--model", "qwen3-14b", "--share", "1.5"],
                "--share",
            ),
            (
                vec!["--gpu", "a100", "--model", "qwen3-14b", "--tenants", "0"],
                "--tenants",
            ),
            (
                vec!["--gpu", "a100", "--model", "qwen3-14b", "--batch", "0"],
                "--batch",
            ),
            (vec!["--gpu", "b300", "--model", "qwen3-14b"], "b300"),
            (
                vec!["--gpu", "a100", "--model", "qwen3-14b", "--prompt", "0"],
                "--prompt",
            ),
            (
                vec!["--gpu", "a100", "--model", "qwen3-14b", "--prompt", "50000"],
                "shorter prompt",
            ),
            (
                vec!["--gpu", "a100", "--model-params", "8G"],
                "missing --weights-bytes and --kv-bytes-per-token",
            ),
            (
                vec!["--gpu", "a100", "--tenant", "share=0.5"],
                "--tenant #1 names no model",
            ),
            (
                vec![
                    "--gpu",
                    "a100",
                    "--model",
                    "qwen3-14b",
                    "--tenant",
                    "batch=4",
                    "--tenant",
                    "share=1.5",
                ],
                "share=1.5 in --tenant #2",
            ),
            (
                vec!["--gpu", "a100", "--tenant", "model=gpt-5"],
                "--tenant #1: unknown model preset",
            ),
            (
                vec!["--gpu", "a100", "--tenant", "params=8G,weights=16G"],
                "missing kv=",
            ),
            (
                vec!["--gpu", "a100", "--tenant", "model=qwen3-14b,params=8G"],
                "not both",
            ),
            (
                vec!["--gpu", "a100", "--tenant", "model=qwen3-14b,batch=0"],
                "batch=0 in --tenant #1",
            ),
            (
                vec!["--gpu", "a100", "--tenant", "model=qwen3-14b,prompt=0"],
                "prompt=0 in --tenant #1",
            ),
        ] {
            let err = answer(&args(&a)).unwrap_err().to_string();
            assert!(err.contains(want), "{a:?}: {err}");
        }
        let many: Vec<&str> = std::iter::repeat_n(["--tenant", "model=opt-125m"], 17)
            .flatten()
            .collect();
        let err = answer(&args(&[&["--gpu", "a100"], &many[..]].concat()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("--tenant is given 17 times"), "{err}");
        // What clap refuses names the flag too.
        for (a, want) in [
            (
                vec!["--tenants", "2", "--tenant", "model=qwen3-14b"],
                "cannot be used with",
            ),
            (vec!["--tenant", "model=qwen3-14b,size=3"], "unknown key \"size\""),
            (vec!["--tenant", "model"], "is not key=value"),
            (vec!["--tenant", "batch=many"], "must be a whole number"),
            (vec!["--tenant", "batch=2,batch=3"], "given twice"),
            (vec!["--tenant", "share=half"], "is not a number"),
            (vec!["--host-time", "5"], "needs a unit"),
        ] {
            let err = tessera_runtime::try_parse_args::<Args>(&[&["sharing"], &a[..]].concat())
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{a:?}: {err}");
            assert!(
                err.contains("--tenant") || err.contains("--host-time"),
                "{a:?}: {err}"
            );
        }
        assert!(parse_rate("fast").is_err() && parse_rate("-1").is_err());
        assert!((parse_rate("2.039TB/s").unwrap() / 2.039e12 - 1.0).abs() < 1e-12);
    }
}
