//! The gpu-agent: per-pod GPU memory and SM use from NVML, run in capacity pods with hostPID.

/// `tessera gpu-agent` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Address to serve per-pod GPU use on.
    #[arg(long, env = "TESSERA_LISTEN", default_value = "0.0.0.0:9091")]
    pub listen: std::net::SocketAddr,
}

/// Runs the gpu-agent until SIGTERM.
pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("the gpu-agent is being built (issue 5)")
}
