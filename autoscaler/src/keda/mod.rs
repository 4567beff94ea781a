//! KEDA's external scaler, served by the autoscaler (`--keda-scaler-listen`): a team that keeps its
//! `ScaledObject`s points a trigger at Tessera and scales on Tessera's decision.
//!
//! - In a cluster every autoscaler replica serves it from its own watch of the InferenceAutoscalers: the leader's
//!   decision is in each object's status, so whichever replica KEDA's round-robin reaches answers the same
//!   ([`cluster::ClusterSource`]). The requests held at the activators come from each replica's own activator
//!   poll, so a push reaches KEDA within one poll interval of a held request, leader or not.
//! - With `--no-kube` the autoscaler decides for each `--sidecar` model itself, with the InferenceAutoscaler's
//!   defaults or `--policy FILE` ([`local`]).
//!
//! The rule (which model, which number, active or not, every refusal) is [`tessera_core::keda`]; the gRPC service
//! is the `tessera-keda` crate.

pub mod cluster;
pub mod deadline;
pub mod local;
mod published;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tessera_keda::Source;
use tessera_keda::tls::{Reloading, TlsFiles};
use tokio::sync::watch;
use tracing::info;

pub use published::published_of;

/// The scaler's flags.
#[derive(Debug, Clone, clap::Args)]
pub struct KedaArgs {
    /// Serve KEDA's external scaler (gRPC `externalscaler.ExternalScaler`) on this address. Plaintext is only
    /// allowed on a loopback address; elsewhere give --keda-tls-cert and --keda-tls-key.
    #[arg(long, env = "TESSERA_KEDA_SCALER_LISTEN")]
    pub keda_scaler_listen: Option<SocketAddr>,
    /// PEM certificate chain of the scaler's TLS (the chart mounts the webhook's).
    #[arg(long, env = "TESSERA_KEDA_TLS_CERT", requires = "keda_tls_key")]
    pub keda_tls_cert: Option<PathBuf>,
    /// PEM private key of the scaler's TLS.
    #[arg(long, env = "TESSERA_KEDA_TLS_KEY", requires = "keda_tls_cert")]
    pub keda_tls_key: Option<PathBuf>,
    /// PEM CA: when set, only clients presenting a certificate it signed are served (KEDA's
    /// TriggerAuthentication `tlsClientCert`/`tlsClientKey`).
    #[arg(long, env = "TESSERA_KEDA_CLIENT_CA", requires = "keda_tls_cert")]
    pub keda_client_ca: Option<PathBuf>,
    /// How often an open `StreamIsActive` re-reads its model when nothing told it to (a held request or a new
    /// decision pushes at once).
    #[arg(long, env = "TESSERA_KEDA_PUSH_CHECK", default_value = "1s", value_parser = tessera_runtime::serve::nonzero_duration)]
    pub keda_push_check: Duration,
    /// Longest a call's request message may take to arrive once its headers have; a slower one is cut off
    /// (KEDA sends its few hundred bytes at once).
    #[arg(long, env = "TESSERA_KEDA_REQUEST_TIMEOUT", default_value = "10s", value_parser = tessera_runtime::serve::nonzero_duration)]
    pub keda_request_timeout: Duration,
    /// The most `StreamIsActive` push streams open at once, all clients together (KEDA holds one per
    /// `external-push` trigger); past it a new stream is refused with RESOURCE_EXHAUSTED and KEDA's polls go on.
    #[arg(long, env = "TESSERA_KEDA_MAX_STREAMS", default_value_t = tessera_keda::service::DEFAULT_MAX_STREAMS)]
    pub keda_max_streams: usize,
    /// How long a push stream stays open before the scaler ends it; KEDA opens a new one, so a stream its client
    /// left without closing is held at most this long.
    #[arg(long, env = "TESSERA_KEDA_STREAM_MAX_AGE", default_value = "10m", value_parser = tessera_runtime::serve::nonzero_duration)]
    pub keda_stream_max_age: Duration,
    /// With --no-kube: the InferenceAutoscaler spec (YAML, the `spec:` of an InferenceAutoscaler or the whole
    /// object) every --sidecar model is decided with. Default: minReplicas 0, maxReplicas 8, scale to zero after
    /// 10m idle, a KV-cache utilization target of 0.8, and otherwise the InferenceAutoscaler's defaults.
    #[arg(long, help_heading = "Without Kubernetes (--no-kube)", env = "TESSERA_POLICY")]
    pub policy: Option<PathBuf>,
}

impl KedaArgs {
    /// Checks the flags before anything starts: plaintext gRPC only on loopback.
    pub fn validate(&self) -> anyhow::Result<()> {
        if let Some(addr) = self.keda_scaler_listen
            && self.keda_tls_cert.is_none()
            && !addr.ip().is_loopback()
        {
            anyhow::bail!(
                "--keda-scaler-listen {addr}: plaintext gRPC is only served on a loopback address; give \
                 --keda-tls-cert and --keda-tls-key (the chart mounts its certificate), or listen on 127.0.0.1"
            );
        }
        if self.keda_max_streams == 0 {
            anyhow::bail!(
                "--keda-max-streams 0 would refuse every push stream; give at least 1 (default {})",
                tessera_keda::service::DEFAULT_MAX_STREAMS
            );
        }
        Ok(())
    }
}

/// Binds and serves the scaler over `source` until `stop` turns true, with the autoscaler's connection bounds and
/// its `tessera_keda_*` metrics. Returns `None` when `--keda-scaler-listen` is not set. Takes the scaler's own
/// flags and metrics, not the controller's, so that the controller (which starts it) and this module do not
/// import each other.
pub async fn serve<S: Source>(
    args: &KedaArgs,
    limits: tessera_runtime::serve::ConnLimits,
    source: Arc<S>,
    metrics: tessera_keda::metrics::Metrics,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    let Some(addr) = args.keda_scaler_listen else {
        return Ok(None);
    };
    args.validate()?;
    let tls = match (&args.keda_tls_cert, &args.keda_tls_key) {
        (Some(cert), Some(key)) => Some(
            Reloading::new(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: args.keda_client_ca.clone(),
            })
            .context("loading the KEDA scaler's TLS files")?,
        ),
        _ => None,
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding --keda-scaler-listen {addr}"))?;
    let bound = listener.local_addr()?;
    let scaler = tessera_keda::Scaler::new(source, metrics, args.keda_push_check, stop.clone())
        .with_stream_bounds(args.keda_max_streams, args.keda_stream_max_age);
    let app = tonic::service::Routes::new(scaler.into_server())
        .into_axum_router()
        .layer(axum::middleware::map_request(deadline::bound(
            args.keda_request_timeout,
        )));
    let mut until = stop.clone();
    let stopped = async move {
        let _ = until.wait_for(|s| *s).await;
    };
    info!(keda_listen = %bound, tls = tls.is_some(), client_certificates = args.keda_client_ca.is_some(), "serving KEDA's external scaler (gRPC)");
    let task = match tls {
        Some(tls) => {
            tokio::spawn(tls.clone().run(Duration::from_secs(30), stop));
            tokio::spawn(async move {
                tessera_runtime::serve::serve_tls(listener, app, limits, move || tls.current(), stopped)
                    .await;
            })
        }
        None => tokio::spawn(async move {
            tessera_runtime::serve::serve(listener, app, limits, stopped).await;
        }),
    };
    Ok(Some(task))
}
