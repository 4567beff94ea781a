//! `tessera-sidecar`: the sidecar and gpu-agent roles alone, in a binary that links nothing else.
//!
//! One runs beside every model replica, so its memory is paid once per replica. The `tessera` binary holds every
//! role, and the pages of its code the sidecar touches are spread over 28 MB of text: on a real vLLM V1 page the
//! sidecar in `tessera` held 14.8 MiB of RSS, 12.4 MiB of it code pages; alone, 9.2 MiB (docs/performance.md).
//! Same subcommands and flags as `tessera sidecar` / `tessera gpu-agent`; the webhook injects this one.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tessera::{LogFormat, init_logging, report};

#[derive(Debug, Parser)]
#[command(
    name = "tessera-sidecar",
    version,
    about = "Tessera's sidecar (beside a vLLM server) and gpu-agent (in a capacity pod), without the other roles."
)]
struct Cli {
    /// Log format: human-readable text or one JSON object per line. The level comes from RUST_LOG (default info).
    #[arg(long, global = true, help_heading = "Logging", env = "TESSERA_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start-up and moved into the role: the size of the larger variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Command {
    /// Run beside a vLLM server: scrape its metrics, recommend its GPU memory and compute, serve /v1/status.
    Sidecar(tessera_sidecar::Args),
    /// Run in a capacity pod: report per-pod GPU memory and utilization from NVML.
    GpuAgent(tessera_sidecar::agent::Args),
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format, "info");
    let result = match cli.command {
        Command::Sidecar(args) => tessera_sidecar::run(args).await,
        Command::GpuAgent(args) => tessera_sidecar::agent::run(args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}", report(&e));
            ExitCode::FAILURE
        }
    }
}
