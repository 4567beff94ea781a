//! The sidecar's HTTP endpoints (axum): `/metrics`, `/v1/status`, `/live`, `/ready`, `/startup` (the start-up gate).

use crate::Shared;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use std::sync::Arc;

/// The router, separate from [`serve`] so it can be exercised without a socket.
pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/v1/status", get(status))
        .route("/live", get(|| async { "ok\n" }))
        .route("/ready", get(ready))
        .route("/startup", get(startup))
        .with_state(shared)
}

/// Serves until the drain is over (`/ready` fails from the first signal on), then finishes in-flight requests.
pub async fn serve(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    graceful: &tessera_runtime::Graceful,
    limits: tessera_runtime::serve::ConnLimits,
) -> std::io::Result<()> {
    // A pod on the node can reach this port: connections are bounded like every role's (runtime::serve).
    tessera_runtime::serve::serve(
        listener,
        graceful.ready_gate(router(shared)),
        limits,
        graceful.stopping(),
    )
    .await;
    Ok(())
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

/// The startup probe: passes only while this pod holds its GPU's start-up lease, or once the gate is open for
/// good (whole GPU, vLLM ready, timeout). While waiting it answers 503 with who holds the GPU.
async fn startup(State(shared): State<Arc<Shared>>) -> Response {
    let Ok(gate) = shared.gate.lock() else {
        return internal("gate lock poisoned");
    };
    let code = if gate.passes() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, axum::Json(gate.clone())).into_response()
}
