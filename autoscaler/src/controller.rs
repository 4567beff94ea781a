//! The controller (being built, issue 4).

/// `tessera controller` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Address to listen on.
    #[arg(long, env = "TESSERA_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: std::net::SocketAddr,
}

/// Runs the controller until SIGTERM.
pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("the controller is being built (issue 4)")
}
