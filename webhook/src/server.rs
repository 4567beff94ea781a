//! The HTTP side: HTTPS for the API server (`POST /mutate`, `/live`, `/ready`), plain HTTP for Prometheus
//! (`/metrics`, `/live`, `/ready`), and the certificate reloader.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum_server::tls_rustls::RustlsConfig;
use prometheus_client::registry::Registry;
use tracing::{info, warn};

use crate::admit::{Admitter, Metrics};

/// The largest admission body accepted: the API server caps objects at ~1.5 MiB, an AdmissionReview carries
/// the object (and, on updates, the old one).
pub const MAX_BODY: usize = 4 << 20;

/// Shared by the routes.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The handler.
    pub admitter: Admitter,
    /// Cleared on shutdown so the API server stops sending admissions here.
    pub serving: Arc<AtomicBool>,
    /// The metrics registry.
    pub registry: Arc<Registry>,
}

impl AppState {
    fn ready(&self) -> bool {
        self.serving.load(Ordering::Acquire) && self.admitter.ready()
    }
}

async fn mutate_route(State(s): State<AppState>, body: Bytes) -> Response {
    match s.admitter.admit(&body).await {
        Ok(review) => match serde_json::to_vec(&review) {
            Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
            Err(e) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot encode the response: {e}\n"),
            )
                .into_response(),
        },
        Err(e) => (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    }
}

async fn ready_route(State(s): State<AppState>) -> Response {
    if s.ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "caches not synced or shutting down\n",
        )
            .into_response()
    }
}

async fn metrics_route(State(s): State<AppState>) -> Response {
    let mut out = String::new();
    match prometheus_client::encoding::text::encode(&mut out, &s.registry) {
        Ok(()) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            out,
        )
            .into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics\n").into_response(),
    }
}

/// The HTTPS router.
pub fn webhook_router(state: AppState) -> Router {
    Router::new()
        .route("/mutate", post(mutate_route))
        .route("/live", get(|| async { "ok\n" }))
        .route("/ready", get(ready_route))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

/// The plain-HTTP router for Prometheus and probes.
pub fn metrics_router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(metrics_route))
        .route("/live", get(|| async { "ok\n" }))
        .route("/ready", get(ready_route))
        .with_state(state)
}

/// Reads the certificate and key files.
pub fn read_pair(cert: &PathBuf, key: &PathBuf) -> std::io::Result<(Vec<u8>, Vec<u8>)> {
    Ok((std::fs::read(cert)?, std::fs::read(key)?))
}

/// Every `interval`, re-reads the certificate and key; when either changed, loads them into `tls`. New
/// connections get the new certificate; open ones keep theirs (nothing is dropped). A pair that does not load
/// (a half-written rotation) keeps the old one and is retried at the next tick.
pub async fn reload_certificates(
    tls: RustlsConfig,
    cert: PathBuf,
    key: PathBuf,
    mut loaded: (Vec<u8>, Vec<u8>),
    interval: Duration,
    metrics: Metrics,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let pair = match read_pair(&cert, &key) {
            Ok(p) => p,
            Err(e) => {
                warn!(error = %e, "cannot read the TLS certificate or key; keeping the loaded pair");
                continue;
            }
        };
        if pair == loaded {
            continue;
        }
        match tls.reload_from_pem(pair.0.clone(), pair.1.clone()).await {
            Ok(()) => {
                info!(cert = %cert.display(), "TLS certificate reloaded");
                metrics.tls_reload("ok");
                loaded = pair;
            }
            Err(e) => {
                // Remember the broken pair so it is reported once; the next change to either file retries.
                warn!(error = %e, "the new TLS certificate or key does not load; keeping the old pair");
                metrics.tls_reload("error");
                loaded = pair;
            }
        }
    }
}
