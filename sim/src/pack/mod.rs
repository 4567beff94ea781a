//! `tessera pack`: the packing benchmark on a real GPU-sharing pod trace.
//!
//! Offline, every fractional pod of the file is packed at once with [`tessera_core::pack::pack_offline`] and
//! compared with the Martello–Toth L2 lower bound and with first-fit decreasing, both computed in the same run.
//! The packing is re-verified here from the input (each pod once, no GPU over either capacity) with code that
//! shares nothing with the packer. `--online` replays arrivals and departures in time order through the online
//! packer (best fit + defragmentation) and, in the same run, through first fit, and reports GPU-hours against
//! the time-integrated per-instant L2 bound. See `docs/fractional-gpus.md` and `docs/performance.md`.

pub mod input;
pub mod online;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use tessera_core::pack::{
    FitPolicy, GPU_COMPUTE_MILLI, GpuShape, OfflinePacking, ReplicaRequest, lower_bound_l2, lower_bound_lp,
    pack_first_fit_decreasing, pack_offline,
};

use input::{Pod, read_pod_list};
use online::{OnlineConfig, OnlineResult, lower_bound_gpu_seconds, replay};

/// `tessera pack` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Pod list in the Alibaba openb format (header name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,
    /// pod_phase,creation_time,deletion_time,scheduled_time; optional gpu_memory_mib). Pods with num_gpu == 1
    /// and gpu_milli < 1000 are packed; the rest are counted and skipped.
    #[arg(long, env = "TESSERA_PACK_INPUT")]
    pub input: PathBuf,
    /// Memory of one GPU in MiB. Only used when the input has a gpu_memory_mib column.
    #[arg(long, env = "TESSERA_PACK_GPU_MEMORY_MIB", default_value_t = 81920)]
    pub gpu_memory_mib: u64,
    /// MiB kept free on every GPU for CUDA contexts. Only used with a gpu_memory_mib column.
    #[arg(long, env = "TESSERA_PACK_HEADROOM_MIB", default_value_t = 0)]
    pub headroom_mib: u64,
    /// Write the offline packing as CSV rows `pod,gpu` to this file (offline only).
    #[arg(long, env = "TESSERA_PACK_ASSIGNMENTS", conflicts_with = "online")]
    pub assignments: Option<PathBuf>,
    /// Replay creations and deletions in time order instead of packing everything at once.
    #[arg(long, env = "TESSERA_PACK_ONLINE")]
    pub online: bool,
    /// Online: at most this many replica moves to empty one GPU (0 disables defragmentation).
    #[arg(long, env = "TESSERA_PACK_DEFRAG_MAX_MOVES", default_value_t = 2)]
    pub defrag_max_moves: usize,
    /// Online: at most this many GPUs emptied by defragmentation after one departure time.
    #[arg(long, env = "TESSERA_PACK_DEFRAG_PLANS_PER_EVENT", default_value_t = 1)]
    pub defrag_plans_per_event: usize,
}

/// Runs `tessera pack`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    // CPU-bound and short: run it on the blocking pool so the runtime stays responsive.
    tokio::task::spawn_blocking(move || run_blocking(&args))
        .await
        .context("tessera pack panicked")?
}

fn run_blocking(args: &Args) -> anyhow::Result<()> {
    let list = read_pod_list(&args.input)?;
    eprintln!(
        "input: {} rows, {} fractional pods packed, {} whole-GPU and {} CPU-only skipped, memory column: {}",
        list.rows,
        list.pods.len(),
        list.whole_gpu,
        list.cpu_only,
        if list.has_memory {
            "yes"
        } else {
            "no (compute only)"
        }
    );
    let shape = if list.has_memory {
        GpuShape::new(args.gpu_memory_mib, args.headroom_mib)
            .context("check --gpu-memory-mib and --headroom-mib")?
    } else {
        // Compute only: memory requests are all 0, so any valid shape leaves memory unconstrained.
        GpuShape {
            memory_mib: args.gpu_memory_mib.max(1),
            headroom_mib: 0,
            compute_milli: GPU_COMPUTE_MILLI,
        }
    };
    if args.online {
        run_online(&list.pods, &shape, args)
    } else {
        run_offline(&list.pods, &shape, list.has_memory, args.assignments.as_deref())
    }
}

/// The L2 bound on compute, and on memory where there is a memory column; the larger holds.
pub fn lower_bound(pods: &[Pod], shape: &GpuShape, has_memory: bool) -> u32 {
    let compute: Vec<u32> = pods.iter().map(|p| p.gpu_milli).collect();
    let mut lb = lower_bound_l2(&compute, GPU_COMPUTE_MILLI);
    if has_memory {
        let memory: Vec<u32> = pods
            .iter()
            .map(|p| u32::try_from(p.gpu_memory_mib.unwrap_or(0)).unwrap_or(u32::MAX))
            .collect();
        let cap = u32::try_from(shape.usable_memory_mib()).unwrap_or(u32::MAX);
        lb = lb.max(lower_bound_l2(&memory, cap));
    }
    lb
}

/// Checks a packing against the pods with its own arithmetic: every pod on exactly one GPU, every GPU within
/// 1000 milli and the usable memory, no empty GPU counted.
pub fn verify(pods: &[Pod], shape: &GpuShape, packing: &OfflinePacking) -> anyhow::Result<()> {
    let mut count = vec![0u32; pods.len()];
    for (g, bin) in packing.gpus.iter().enumerate() {
        anyhow::ensure!(!bin.is_empty(), "packing bug: GPU {g} is empty");
        let mut milli = 0u64;
        let mut mib = 0u64;
        for &i in bin {
            let p = pods
                .get(i)
                .with_context(|| format!("packing bug: GPU {g} holds unknown pod index {i}"))?;
            milli += u64::from(p.gpu_milli);
            mib += p.gpu_memory_mib.unwrap_or(0);
            count[i] += 1;
        }
        anyhow::ensure!(milli <= 1000, "packing bug: GPU {g} holds {milli} milli-GPUs");
        anyhow::ensure!(
            mib <= shape.usable_memory_mib(),
            "packing bug: GPU {g} holds {mib} MiB"
        );
    }
    if let Some(i) = count.iter().position(|&n| n != 1) {
        anyhow::bail!("packing bug: pod {} is placed {} times", pods[i].name, count[i]);
    }
    Ok(())
}

fn run_offline(pods: &[Pod], shape: &GpuShape, has_memory: bool, out: Option<&Path>) -> anyhow::Result<()> {
    let items: Vec<ReplicaRequest> = pods.iter().map(Pod::request).collect();
    let started = Instant::now();
    let packing = pack_offline(&items, shape)?;
    let elapsed = started.elapsed();
    verify(pods, shape, &packing)?;
    let lb = lower_bound(pods, shape, has_memory);

    let ffd_started = Instant::now();
    let ffd = pack_first_fit_decreasing(&items, shape)?;
    let ffd_elapsed = ffd_started.elapsed();
    verify(pods, shape, &ffd)?;

    // The cutting-stock LP bound on compute (valid with memory too: it ignores a constraint). Stronger than L2
    // when sizes repeat; when it meets gpus_used the packing is optimal.
    let lp_started = Instant::now();
    let compute: Vec<u32> = pods.iter().map(|p| p.gpu_milli).collect();
    let lp = lower_bound_lp(&compute, GPU_COMPUTE_MILLI, 10_000);
    let lp_elapsed = lp_started.elapsed();

    if let Some(path) = out {
        write_assignments(path, pods, &packing)
            .with_context(|| format!("cannot write assignments to {}", path.display()))?;
    }
    eprintln!(
        "baseline first-fit decreasing: gpus_used={} ({:+.2}% vs L2) elapsed_ms={:.1}",
        ffd.gpus_used(),
        pct_over(ffd.gpus_used() as f64, f64::from(lb)),
        ffd_elapsed.as_secs_f64() * 1e3
    );
    eprintln!(
        "tessera ({}): gpus_used={} ({:+.2}% vs L2), {} fewer GPUs than first-fit decreasing",
        packing.algorithm.as_str(),
        packing.gpus_used(),
        pct_over(packing.gpus_used() as f64, f64::from(lb)),
        ffd.gpus_used() as i64 - packing.gpus_used() as i64
    );
    eprintln!(
        "LP (Gilmore-Gomory) lower bound: {} (LP value {:.3}, {} iterations{}, {:.1} ms){}",
        lp.bound,
        lp.value,
        lp.iterations,
        if lp.optimal { "" } else { ", stopped early" },
        lp_elapsed.as_secs_f64() * 1e3,
        if lp.bound as usize >= packing.gpus_used() {
            ": the packing is optimal"
        } else {
            ""
        }
    );
    println!(
        "gpus_used={} lower_bound={} pods={} elapsed_ms={:.1}",
        packing.gpus_used(),
        lb,
        pods.len(),
        elapsed.as_secs_f64() * 1e3
    );
    Ok(())
}

fn write_assignments(path: &Path, pods: &[Pod], packing: &OfflinePacking) -> anyhow::Result<()> {
    let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(w, "pod,gpu")?;
    for (i, p) in pods.iter().enumerate() {
        writeln!(w, "{},gpu-{}", csv_field(&p.name), packing.assignment[i])?;
    }
    w.flush()?;
    Ok(())
}

/// Quotes a CSV field when it needs it.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn pct_over(x: f64, base: f64) -> f64 {
    if base > 0.0 { (x / base - 1.0) * 100.0 } else { 0.0 }
}

fn run_online(pods: &[Pod], shape: &GpuShape, args: &Args) -> anyhow::Result<()> {
    let lb = lower_bound_gpu_seconds(pods, shape);
    let hours = |s: u128| s as f64 / 3600.0;
    let ratio = |r: &OnlineResult| {
        if lb > 0 {
            r.gpu_seconds as f64 / lb as f64
        } else {
            0.0
        }
    };

    let ff_cfg = OnlineConfig {
        policy: FitPolicy::FirstFit,
        defrag_max_moves: 0,
        defrag_plans_per_event: 0,
    };
    let started = Instant::now();
    let ff = replay(pods, shape, &ff_cfg)?;
    let ff_elapsed = started.elapsed();
    let bf_cfg = OnlineConfig {
        policy: FitPolicy::BestFit,
        defrag_max_moves: 0,
        defrag_plans_per_event: 0,
    };
    let bf = replay(pods, shape, &bf_cfg)?;
    let cfg = OnlineConfig {
        policy: FitPolicy::BestFit,
        defrag_max_moves: args.defrag_max_moves,
        defrag_plans_per_event: args.defrag_plans_per_event,
    };
    let started = Instant::now();
    let tessera = replay(pods, shape, &cfg)?;
    let elapsed = started.elapsed();

    eprintln!(
        "lower bound: integral of the per-instant Martello-Toth L2 bound of the active pods{}",
        if pods.iter().any(|p| p.gpu_memory_mib.is_some()) {
            " (max of compute and memory)"
        } else {
            ""
        }
    );
    eprintln!(
        "baseline first-fit: gpu_hours={:.1} ratio={:.4} peak_gpus={} elapsed_ms={:.1}",
        hours(ff.gpu_seconds),
        ratio(&ff),
        ff.peak_gpus,
        ff_elapsed.as_secs_f64() * 1e3
    );
    eprintln!(
        "best-fit without defragmentation: gpu_hours={:.1} ratio={:.4} peak_gpus={}",
        hours(bf.gpu_seconds),
        ratio(&bf),
        bf.peak_gpus
    );
    eprintln!(
        "tessera best-fit + defragmentation (max {} moves per GPU, {} GPUs per departure): ratio={:.4} \
         gpus_emptied={} peak_gpus={}",
        args.defrag_max_moves,
        args.defrag_plans_per_event,
        ratio(&tessera),
        tessera.plans,
        tessera.peak_gpus
    );
    println!(
        "gpu_hours={:.1} lower_bound_gpu_hours={:.1} moves={} elapsed_ms={:.1}",
        hours(tessera.gpu_seconds),
        hours(lb),
        tessera.moves,
        elapsed.as_secs_f64() * 1e3
    );
    Ok(())
}
