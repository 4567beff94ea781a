//! `tessera pack` (being built, issue 5).

/// `tessera pack` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {}

/// Runs `tessera pack`.
pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("tessera pack is being built (issue 5)")
}
