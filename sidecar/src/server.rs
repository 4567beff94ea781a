//! The sidecar's HTTP endpoints (axum): `/metrics`, `/v1/status`, `/live`, `/ready`, and `/startup` (the
//! injected sidecar's startup probe: 200 once the sidecar serves; the GPU start-up gate will hold it).

use crate::Shared;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// The router, separate from [`serve`] so it can be exercised without a socket.
pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/v1/status", get(status))
        .route("/live", get(|| async { "ok\n" }))
        .route("/startup", get(|| async { "started\n" }))
        .route("/ready", get(ready))
        .with_state(shared)
}

/// Serves until `shutdown` is cancelled, then finishes in-flight requests.
pub async fn serve(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router(shared))
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

fn internal(what: &str) -> Response {
    (StatusCode::INTERNAL_SERVER_ERROR, format!("{what}\n")).into_response()
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    let Ok(exporter) = shared.exporter.lock() else {
        return internal("metrics registry lock poisoned");
    };
    match exporter.render() {
        Ok(body) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(_) => internal("cannot encode metrics"),
    }
}

async fn status(State(shared): State<Arc<Shared>>) -> Response {
    let Ok(state) = shared.state.lock() else {
        return internal("state lock poisoned");
    };
    axum::Json(state.status(crate::unix_now())).into_response()
}

async fn ready(State(shared): State<Arc<Shared>>) -> Response {
    let Ok(state) = shared.state.lock() else {
        return internal("state lock poisoned");
    };
    if state.ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "vLLM has not answered a scrape yet\n",
        )
            .into_response()
    }
}
