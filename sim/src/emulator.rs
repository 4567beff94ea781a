//! `tessera vllm-sim` (being built, issue 3).

/// `tessera vllm-sim` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {}

/// Runs `tessera vllm-sim`.
pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("tessera vllm-sim is being built (issue 3)")
}
