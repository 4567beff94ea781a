//! `tessera`: one binary, one subcommand per role, so one image serves every role.
//!
//! This file only parses arguments, sets up logging, and hands over to the role's crate. The sidecar beside each
//! replica also ships as `tessera-sidecar` (src/bin/tessera-sidecar.rs), which links the sidecar alone.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tessera::{LogFormat, init_logging, report};

#[derive(Debug, Parser)]
#[command(
    name = "tessera",
    version,
    about = "Serve more models per GPU on Kubernetes: rightsized vLLM memory, \
fractional GPUs, and inference-aware autoscaling with scale to zero."
)]
struct Cli {
    /// Log format: human-readable text or one JSON object per line. The level comes from RUST_LOG (default info;
    /// warn for simulate, pack, sharing and crdgen).
    #[arg(long, global = true, help_heading = "Logging", env = "TESSERA_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run beside a vLLM server: scrape its metrics, recommend its GPU memory and compute, serve /v1/status.
    Sidecar(tessera_sidecar::Args),
    /// Run in a capacity pod: report per-pod GPU memory and utilization from NVML.
    GpuAgent(tessera_sidecar::agent::Args),
    /// Run the InferenceAutoscaler controller (the HPA replacement) and the GPU pool manager.
    Autoscaler(tessera_autoscaler::controller::Args),
    /// Run the OpenAI-API gateway that routes by model and holds requests while a model scales from zero.
    Activator(tessera_activator::Args),
    /// Run the mutating admission webhook: inject the sidecar, set vLLM's memory flags, place fractional pods.
    Webhook(tessera_webhook::Args),
    /// Run on a GPU node as the kubelet plugin of the DRA driver gpu.tessera.dev: prepare claims (CDI specs with
    /// the GPU and the claim's MPS limits) and publish the node's ResourceSlice.
    DraPlugin(tessera_dra::plugin::Args),
    /// Replay real traffic through Tessera's decisions and compare it with whole-GPU baselines.
    Simulate(tessera_sim::simulate::Args),
    /// Pack a GPU-sharing pod trace onto GPUs and compare with the lower bound.
    Pack(tessera_sim::pack::Args),
    /// What if replicas share one GPU: TPOT, throughput and TTFT, alone and shared, from the sharing physics.
    Sharing(tessera_sim::sharing_calc::Args),
    /// Run an emulated vLLM server (OpenAI API and vLLM's /metrics) with a realistic performance model.
    VllmSim(tessera_sim::emulator::Args),
    /// Print the InferenceAutoscaler CustomResourceDefinition as YAML.
    Crdgen,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format, default_level(&cli.command));
    match run(cli.command).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One report, whatever RUST_BACKTRACE=1 says: a user error is not a crash, and its backtrace (anyhow
            // captures one when the variable is set, as many Rust users have it) only buries the message. Asked
            // for with RUST_LIB_BACKTRACE=1 or RUST_BACKTRACE=full (tessera_runtime::report).
            eprintln!("{}", report(&e));
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Sidecar(args) => tessera_sidecar::run(args).await,
        Command::GpuAgent(args) => tessera_sidecar::agent::run(args).await,
        Command::Autoscaler(args) => tessera_autoscaler::run(args).await,
        Command::Activator(args) => tessera_activator::run(args).await,
        Command::Webhook(args) => tessera_webhook::run(args).await,
        Command::DraPlugin(args) => Ok(tessera_dra::plugin::run(args).await?),
        Command::Simulate(args) => tessera_sim::simulate::run(args).await,
        Command::Pack(args) => tessera_sim::pack::run(args).await,
        Command::Sharing(args) => tessera_sim::sharing_calc::run(args).await,
        Command::VllmSim(args) => tessera_sim::emulator::run(args).await,
        Command::Crdgen => {
            print!("{}", tessera_autoscaler::crd::crdgen()?);
            Ok(())
        }
    }
}

/// The roles log what they do (info); the commands a person runs at a terminal (simulate, pack, sharing,
/// crdgen) print their answer on stdout and log only what went wrong, unless RUST_LOG says otherwise.
fn default_level(command: &Command) -> &'static str {
    match command {
        Command::Simulate(_) | Command::Pack(_) | Command::Sharing(_) | Command::Crdgen => "warn",
        _ => "info",
    }
}
