//! The activator (being built, issue 4).

/// `tessera activator` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Address to listen on.
    #[arg(long, env = "TESSERA_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: std::net::SocketAddr,
}

/// Runs the activator until SIGTERM.
pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("the activator is being built (issue 4)")
}
