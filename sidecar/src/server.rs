//! The sidecar's HTTP endpoints (axum): `/metrics`, `/v1/status`, `PUT /v1/objective` (the controller hands over
//! the InferenceAutoscaler's latency objective, token and ranges checked: [`crate::objective`]), `/live`, `/ready`, `/startup` (the start-up gate), and sleep mode's `POST /tessera/v1/wake` and `GET /tessera/v1/live` (the vLLM container's liveness).

use crate::Shared;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use std::sync::Arc;
use std::time::Duration;

/// Longest `POST /tessera/v1/wake` waits for the wake before answering 202 (the wake goes on).
pub const WAKE_WAIT: Duration = Duration::from_secs(30);

/// The router, separate from [`serve`] so it can be exercised without a socket.
pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/v1/status", get(status))
        .route("/v1/objective", put(crate::objective::put))
        .route("/live", get(|| async { "ok\n" }))
        .route("/ready", get(ready))
        .route("/startup", get(startup))
        .route("/tessera/v1/wake", post(wake))
        .route("/tessera/v1/live", get(vllm_live))
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
        Ok(body) => tessera_runtime::serve::openmetrics(body),
        Err(_) => internal("cannot encode metrics"),
    }
}

async fn status(State(shared): State<Arc<Shared>>) -> Response {
    let Ok(state) = shared.state.lock() else {
        return internal("state lock poisoned");
    };
    let mut doc = state.status(crate::unix_now());
    drop(state);
    doc.rest = shared.rest.status();
    doc.startup_gate = shared.gate.lock().ok().and_then(|g| g.wire());
    axum::Json(doc).into_response()
}

async fn ready(State(shared): State<Arc<Shared>>) -> Response {
    let Ok(state) = shared.state.lock() else {
        return internal("state lock poisoned");
    };
    if !shared.rest.ready() {
        let state = shared.rest.status().map(|r| r.state);
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("vLLM is not awake (sleep mode: {state:?})\n"),
        )
            .into_response()
    } else if state.ready() && (shared.rest.status().is_none() || state.vllm_up()) {
        // With sleep mode on, this is vLLM's own readiness probe (the webhook points it here): the last scrape
        // must have succeeded, not only the first.
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

/// `POST /tessera/v1/wake`: wakes a sleeping vLLM (what any request would cause, so harmless to expose; concurrent
/// calls join one wake). 200 awake, 202 still waking after [`WAKE_WAIT`], 503 failed (the pod is restarting),
/// 404 where sleep mode is off. The body is the replica's `rest` status.
async fn wake(State(shared): State<Arc<Shared>>) -> Response {
    use crate::rest::WakeOutcome;
    match shared.rest.wake(WAKE_WAIT).await {
        WakeOutcome::Off => (StatusCode::NOT_FOUND, "sleep mode is off (no --rest-file)\n").into_response(),
        WakeOutcome::Awake(s) => (StatusCode::OK, axum::Json(s)).into_response(),
        WakeOutcome::Pending(s) => (StatusCode::ACCEPTED, axum::Json(s)).into_response(),
        WakeOutcome::Failed(s) => (StatusCode::SERVICE_UNAVAILABLE, axum::Json(s)).into_response(),
    }
}

/// `GET /tessera/v1/live`: the vLLM container's liveness probe where sleep mode is on. 503 once a sleep or a
/// wake failed its check (the state metric, the memory, the canary), so the kubelet restarts vLLM.
async fn vllm_live(State(shared): State<Arc<Shared>>) -> Response {
    if shared.rest.live() {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        let why = shared.rest.status().and_then(|r| r.refused).unwrap_or_default();
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("a sleep-mode check failed: {why}\n"),
        )
            .into_response()
    }
}
