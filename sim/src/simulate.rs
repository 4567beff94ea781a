//! `tessera simulate` (being built, issue 6).

/// `tessera simulate` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {}

/// Runs `tessera simulate`.
pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("tessera simulate is being built (issue 6)")
}
