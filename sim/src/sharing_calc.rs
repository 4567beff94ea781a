//! `tessera sharing`: what happens to N identical replicas that share one GPU, from the simulator's own
//! sharing physics (`model::sharing`). It answers the question a platform engineer asks before packing two
//! models together: how much slower does each decode, and how much more does the GPU serve in all?
//!
//! Each tenant decodes `--batch` sequences with `--context` tokens each, stepping back to back (a loaded
//! server); its step is the engine's roofline plus the host part. The answer is the steady state where each
//! tenant's duty (the share of its step on the GPU) is what its own stretched steps give.

use clap::{Args as ClapArgs, ValueEnum};

use crate::model::sharing::{SteadyState, StepCost, host_time_s, steady_state};
use crate::model::{EngineConfig, GIB, GpuSpec, ModelSpec, SharingModel};
use tessera_runtime::size::parse_bytes;

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

/// `tessera sharing` flags.
#[derive(Debug, Clone, ClapArgs)]
pub struct Args {
    /// GPU preset (a100-80gb, a100-40gb, h100-80gb, l4); or give --gpu-bandwidth and --gpu-flops.
    #[arg(long, env = "TESSERA_SHARING_GPU")]
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
    /// Model preset (qwen2-7b, llama-3.1-8b, opt-125m, qwen3-14b, llama-3.1-70b); or give --model-params,
    /// --weights-bytes and --kv-bytes-per-token.
    #[arg(long, env = "TESSERA_SHARING_MODEL")]
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
    /// Sequences each tenant decodes at once.
    #[arg(long, env = "TESSERA_SHARING_BATCH", default_value_t = 32)]
    pub batch: u64,
    /// Tokens of context per sequence (prompt plus output so far).
    #[arg(long, env = "TESSERA_SHARING_CONTEXT", default_value_t = 1000)]
    pub context: u64,
    /// Identical tenants on the GPU.
    #[arg(long, env = "TESSERA_SHARING_TENANTS", default_value_t = 2)]
    pub tenants: u32,
    /// Each tenant's share: its SM cap under MPS (0 < share ≤ 1; ignored by time-slicing).
    #[arg(long, env = "TESSERA_SHARING_SHARE", default_value_t = 0.5)]
    pub share: f64,
    /// How the tenants share the GPU.
    #[arg(long, env = "TESSERA_SHARING_MODE", value_enum, default_value_t = Mode::Mps)]
    pub mode: Mode,
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

/// What `tessera sharing` computes, before printing.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The GPU.
    pub gpu: GpuSpec,
    /// The model.
    pub model: ModelSpec,
    /// One decode step of one tenant, alone with the whole GPU.
    pub cost: StepCost,
    /// Alone and shared.
    pub state: SteadyState,
    /// Tenants.
    pub tenants: u32,
    /// Sequences per tenant.
    pub batch: u64,
    /// Bytes each tenant holds (weights, activations, its batch's KV cache).
    pub bytes_per_tenant: u64,
}

impl Answer {
    /// Time per output token alone (a decode step yields one token per sequence), ms.
    pub fn tpot_alone_ms(&self) -> f64 {
        self.state.alone.duration_s * 1000.0
    }
    /// Time per output token shared, ms.
    pub fn tpot_shared_ms(&self) -> f64 {
        self.state.shared.duration_s * 1000.0
    }
    /// One tenant's tokens per second alone.
    pub fn throughput_alone(&self) -> f64 {
        self.batch as f64 / self.state.alone.duration_s
    }
    /// One tenant's tokens per second shared.
    pub fn throughput_shared(&self) -> f64 {
        self.batch as f64 / self.state.shared.duration_s
    }
}

fn invalid(msg: impl Into<String>) -> anyhow::Error {
    anyhow::anyhow!(msg.into())
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
            return Err(invalid(
                "no GPU: give --gpu PRESET (a100-80gb, a100-40gb, h100-80gb, l4) or both --gpu-bandwidth B/s \
                 and --gpu-flops F",
            ));
        }
    };
    if let Some(m) = args.gpu_memory {
        gpu.memory_bytes = m;
    }
    let model = match (
        &args.model,
        args.model_params,
        args.weights_bytes,
        args.kv_bytes_per_token,
    ) {
        (Some(name), None, None, None) => ModelSpec::preset(name)?,
        (None, Some(params), Some(weights_bytes), Some(kv)) => ModelSpec {
            name: "custom".into(),
            params,
            weights_bytes,
            bytes_per_kv_token: kv,
            max_model_len: u32::MAX,
            overhead_bytes: GIB,
        },
        (Some(_), _, _, _) => {
            return Err(invalid(
                "give either --model PRESET or --model-params, --weights-bytes and --kv-bytes-per-token, not both",
            ));
        }
        (None, ..) => {
            return Err(invalid(
                "no model: give --model PRESET (qwen2-7b, llama-3.1-8b, opt-125m, qwen3-14b, llama-3.1-70b) or all \
                 of --model-params, --weights-bytes and --kv-bytes-per-token",
            ));
        }
    };
    if args.batch == 0 {
        return Err(invalid("--batch must be at least 1 sequence"));
    }
    if args.tenants == 0 || args.tenants > 16 {
        return Err(invalid(format!("--tenants {} is outside 1..=16", args.tenants)));
    }
    if !(args.share > 0.0 && args.share <= 1.0) {
        return Err(invalid(format!(
            "--share {} is outside (0, 1]: it is each tenant's SM cap (0.5 = half the SMs)",
            args.share
        )));
    }
    let cfg = EngineConfig::vllm_defaults(&gpu);
    let kv_bytes = args
        .batch
        .saturating_mul(args.context)
        .saturating_mul(model.bytes_per_kv_token);
    let bytes = model.weights_bytes as f64 + kv_bytes as f64;
    let cost = StepCost {
        memory_s: bytes / (gpu.hbm_bandwidth_bytes_per_s * cfg.memory_efficiency),
        compute_s: 2.0 * model.params * args.batch as f64 / (gpu.flops * cfg.compute_efficiency),
        overhead_s: host_time_s(cfg.step_overhead_s, model.params, args.batch),
    };
    let state = steady_state(args.mode.into(), cost, args.share, args.tenants);
    Ok(Answer {
        bytes_per_tenant: model.weights_bytes + model.overhead_bytes + kv_bytes,
        gpu,
        model,
        cost,
        state,
        tenants: args.tenants,
        batch: args.batch,
    })
}

/// The report `tessera sharing` prints; its last line is `key=value` pairs for scripts.
pub fn render(args: &Args, a: &Answer) -> String {
    let gib = |b: f64| b / GIB as f64;
    let ms = |s: f64| s * 1000.0;
    let mut out = String::new();
    out.push_str(&format!(
        "GPU {}: {:.0} GB/s, {:.0} TFLOPS{}\n",
        a.gpu.name,
        a.gpu.hbm_bandwidth_bytes_per_s / 1e9,
        a.gpu.flops / 1e12,
        if a.gpu.memory_bytes > 0 {
            format!(", {:.1} GiB", gib(a.gpu.memory_bytes as f64))
        } else {
            String::new()
        }
    ));
    out.push_str(&format!(
        "model {}: {:.2}B parameters, {:.2} GiB of weights, {} KV bytes per token\n",
        a.model.name,
        a.model.params / 1e9,
        gib(a.model.weights_bytes as f64),
        a.model.bytes_per_kv_token
    ));
    out.push_str(&format!(
        "{} tenant(s), each decoding {} sequences at {} tokens of context; {} with share {}\n",
        a.tenants,
        a.batch,
        args.context,
        SharingModel::from(args.mode).name(),
        args.share
    ));
    if let Some((ok, need, have)) = fits(a) {
        out.push_str(&format!(
            "memory: {} × {:.1} GiB (weights, activations, this batch's KV) = {:.1} GiB of {:.1} GiB: {}\n",
            a.tenants,
            gib(a.bytes_per_tenant as f64),
            gib(need),
            gib(have),
            if ok {
                "fits"
            } else {
                "DOES NOT FIT (the figures below assume it did)"
            }
        ));
    }
    out.push_str(&format!(
        "one step alone: {:.2} ms on the GPU (memory {:.2} ms, compute {:.2} ms) + {:.2} ms host\n",
        ms(a.state.alone.gpu_s),
        ms(a.cost.memory_s),
        ms(a.cost.compute_s),
        ms(a.cost.overhead_s)
    ));
    out.push_str(&format!(
        "alone (whole GPU):  step {:.2} ms, TPOT {:.2} ms, GPU busy {:.0}% of the step, {:.0} tokens/s\n",
        a.tpot_alone_ms(),
        a.tpot_alone_ms(),
        a.state.alone.busy * 100.0,
        a.throughput_alone()
    ));
    out.push_str(&format!(
        "shared ({} tenants): step {:.2} ms, TPOT {:.2} ms, GPU busy {:.0}% of the step, {:.0} tokens/s each, {:.0} in all\n",
        a.tenants,
        a.tpot_shared_ms(),
        a.tpot_shared_ms(),
        a.state.shared.busy * 100.0,
        a.throughput_shared(),
        a.throughput_shared() * f64::from(a.tenants)
    ));
    let tpot_ratio = a.tpot_shared_ms() / a.tpot_alone_ms();
    let throughput_ratio = a.throughput_shared() / a.throughput_alone();
    let aggregate_ratio = throughput_ratio * f64::from(a.tenants);
    out.push_str(&format!(
        "tpot_alone_ms={:.3} tpot_shared_ms={:.3} tpot_ratio={:.4} throughput_ratio={:.4} aggregate_ratio={:.4} fits={}\n",
        a.tpot_alone_ms(),
        a.tpot_shared_ms(),
        tpot_ratio,
        throughput_ratio,
        aggregate_ratio,
        fits(a).map_or("unknown", |(ok, ..)| if ok { "true" } else { "false" })
    ));
    out
}

/// Whether the tenants' memory fits the GPU's (`None` when the GPU's memory is not known: explicit bandwidth and
/// flops without `--gpu-memory`).
fn fits(a: &Answer) -> Option<(bool, f64, f64)> {
    (a.gpu.memory_bytes > 0).then(|| {
        let need = a.bytes_per_tenant as f64 * f64::from(a.tenants);
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
            "{} tenants need {:.1} GiB of GPU memory and the GPU has {:.1} GiB: fewer --tenants, a smaller --batch or \
             --context, or a GPU with more memory",
            a.tenants,
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

    fn args(a: &[&str]) -> Args {
        tessera_runtime::try_parse_args(&[&["sharing"], a].concat()).unwrap()
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
        assert_eq!(p.state, e.state);
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
        assert!((one.tpot_shared_ms() - one.tpot_alone_ms()).abs() < 1e-9);
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
            // Three tenants read at most the GPU's bandwidth: aggregate ≤ 1 / (alone's GPU duty).
            let aggregate = 3.0 * a.throughput_shared() / a.throughput_alone();
            assert!(
                aggregate <= 1.0 / a.state.alone.busy + 1e-9,
                "{mode}: {aggregate}"
            );
            assert!(a.tpot_shared_ms() > a.tpot_alone_ms(), "{mode}");
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
        ] {
            let err = answer(&args(&a)).unwrap_err().to_string();
            assert!(err.contains(want), "{a:?}: {err}");
        }
        assert!(parse_rate("fast").is_err() && parse_rate("-1").is_err());
        assert!((parse_rate("2.039TB/s").unwrap() / 2.039e12 - 1.0).abs() < 1e-12);
    }
}
