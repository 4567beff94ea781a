//! The sidecar that runs beside every vLLM server, and the gpu-agent that runs in every capacity pod.

pub mod agent;

/// `tessera sidecar` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Base URL of the vLLM server, e.g. http://127.0.0.1:8000 (its /metrics is scraped).
    #[arg(long, env = "TESSERA_VLLM_URL", default_value = "http://127.0.0.1:8000")]
    pub vllm_url: String,
    /// Address to serve /metrics, /v1/status, /live and /ready on.
    #[arg(long, env = "TESSERA_LISTEN", default_value = "0.0.0.0:9090")]
    pub listen: std::net::SocketAddr,
}

/// Runs the sidecar until SIGTERM.
pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("the sidecar is being built (issue 2)")
}
