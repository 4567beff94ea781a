//! What every replica serves, leader or not: `/metrics`, the `/ui` page, `/live` and `/ready`, on
//! `--metrics-listen`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::routing::get;
use tokio::sync::watch;
use tracing::info;

use super::{Args, Health, serve_ready};

/// Binds `--metrics-listen` and serves there until shutdown; returns the page's store (the reconcile publishes each
/// model's round to it) and the server's task.
pub(super) async fn serve(
    args: &Args,
    graceful: &tessera_runtime::Graceful,
    health: Arc<Health>,
    shutdown_rx: watch::Receiver<bool>,
) -> anyhow::Result<(
    Arc<crate::ui::Store>,
    tokio::task::JoinHandle<Result<(), std::io::Error>>,
)> {
    let listener = tokio::net::TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("binding --metrics-listen {}", args.metrics_listen))?;
    info!(listen = %listener.local_addr()?, "serving /metrics, /ui, /live, /ready");
    // Models not reconciled for 10 sync periods are gone (deleted, or another replica leads).
    let ui = Arc::new(crate::ui::Store::new(
        args.ui.settings(),
        false,
        crate::ui::now_ms(),
        args.sync_period * 10,
    ));
    tokio::spawn(
        ui.clone()
            .run_recorder(Duration::from_secs(60), shutdown_rx.clone()),
    );
    let app = graceful.ready_gate(
        Router::new()
            .route("/live", get(|| async { "ok" }))
            .route("/ready", get(serve_ready))
            .with_state(health.clone())
            .merge(health.metrics.router())
            .merge(crate::ui::router(ui.clone())),
    );
    let mut server_shutdown = shutdown_rx;
    let limits = args.conn.limits();
    let server = tokio::spawn(async move {
        // The page and /metrics are read by people and Prometheus only; bounded connections all the same.
        tessera_runtime::serve::serve(listener, app, limits, async move {
            let _ = server_shutdown.wait_for(|s| *s).await;
        })
        .await;
        Ok::<(), std::io::Error>(())
    });
    Ok((ui, server))
}
