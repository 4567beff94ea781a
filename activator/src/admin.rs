//! The activator's admin listener (`--admin-listen`): what only the control plane and Prometheus may read.
//!
//! The stats document ([`STATS_PATH`]) and `/metrics` carry every namespace's traffic (model names, request
//! counts, queue depths). The public port is the OpenAI API every tenant reaches, so a tenant reading them there
//! would see every other team's models and load. They are served on a second listener instead, which the chart
//! admits only from the autoscaler's pods and Prometheus's namespaces (a NetworkPolicy); the public port answers
//! them `404` naming the admin listener ([`refuse_on_public_port`]), so a scrape left on the old port fails loudly
//! rather than reading nothing.
//!
//! `/live` and `/ready` are served on both: they say nothing about tenants, and either port can then be probed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
pub use tessera_core::wire::activator::DEFAULT_ADMIN_PORT;
use tessera_core::wire::activator::STATS_PATH;

use super::proxy::App;

/// The paths served on the admin listener only.
const ADMIN_ONLY: [&str; 2] = [STATS_PATH, "/metrics"];

/// The admin listener's routes: the stats document, `/metrics`, `/live`, `/ready`.
pub fn routes(app: Arc<App>) -> axum::Router {
    axum::Router::new()
        .route(STATS_PATH, get(stats))
        .route("/metrics", get(prometheus))
        .route("/live", get(|| async { "ok" }))
        .route("/ready", get(ready))
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                format!(
                    "the activator's admin listener serves GET {STATS_PATH}, /metrics, /live and /ready\n"
                ),
            )
        })
        .with_state(app)
}

/// The admin path `path` names, if it is one (a query string and a trailing slash do not hide it).
pub fn admin_only(path: &str) -> Option<&'static str> {
    let path = path.split('?').next().unwrap_or(path);
    let path = path.trim_end_matches('/');
    ADMIN_ONLY.iter().copied().find(|p| *p == path)
}

/// The public port's answer to an admin path: 404 in OpenAI's error shape, naming where it is served.
pub fn refuse_on_public_port(path: &str) -> Response {
    let body = serde_json::json!({ "error": {
        "message": format!("`{path}` is not served on the gateway's public port: it describes every namespace's \
            traffic, so the activator serves it on its admin listener (--admin-listen, port {DEFAULT_ADMIN_PORT} by \
            default), which only the control plane and Prometheus reach"),
        "type": "invalid_request_error", "param": null, "code": "not_found" } });
    (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}

/// Refuses an `--admin-listen` that would be `--listen` itself (the same port on the same or an unspecified
/// address): the admin documents would be back on the port every tenant reaches. The second bind would fail
/// anyway; this says why and what to do.
pub fn check_distinct(listen: SocketAddr, admin: SocketAddr) -> Result<(), String> {
    let same_host = listen.ip() == admin.ip() || listen.ip().is_unspecified() || admin.ip().is_unspecified();
    if listen.port() != 0 && listen.port() == admin.port() && same_host {
        return Err(format!(
            "--admin-listen {admin} uses the port of --listen {listen}: the stats and /metrics must be on a port \
             of their own, which tenants cannot reach; choose another port (e.g. --admin-listen 0.0.0.0:{DEFAULT_ADMIN_PORT})"
        ));
    }
    Ok(())
}

async fn stats(State(app): State<Arc<App>>) -> Response {
    axum::Json(app.router.stats(tessera_runtime::unix_ms(SystemTime::now()))).into_response()
}

async fn prometheus(State(app): State<Arc<App>>) -> Response {
    match app.metrics.encode(&app.router, &app.discovery.collisions()) {
        Ok(text) => tessera_runtime::serve::openmetrics(text),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics failed: {e}"),
        )
            .into_response(),
    }
}

/// Ready once backend discovery has synced (both listeners answer alike).
pub async fn ready(State(app): State<Arc<App>>) -> Response {
    if app.discovery.synced() {
        (StatusCode::OK, "ok").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "backend discovery has not synced yet",
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn admin_paths_are_recognised_with_or_without_a_query_or_a_slash() {
        assert_eq!(admin_only("/metrics"), Some("/metrics"));
        assert_eq!(admin_only("/metrics/"), Some("/metrics"));
        assert_eq!(admin_only("/tessera/v1/stats?x=1"), Some(STATS_PATH));
        assert_eq!(admin_only("/v1/metrics"), None);
        assert_eq!(admin_only("/live"), None);
    }

    #[test]
    fn the_admin_port_must_differ_from_the_public_one() {
        let at = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(check_distinct(at("0.0.0.0:8080"), at("0.0.0.0:9090")).is_ok());
        // Port 0 asks the OS for a port: two binds never get the same one.
        assert!(check_distinct(at("127.0.0.1:0"), at("127.0.0.1:0")).is_ok());
        let e = check_distinct(at("0.0.0.0:8080"), at("127.0.0.1:8080")).unwrap_err();
        assert!(e.contains("--admin-listen") && e.contains("another port"), "{e}");
        // One port on two distinct addresses is two listeners (the admin one on loopback only, say).
        assert!(check_distinct(at("10.0.0.1:8080"), at("127.0.0.1:8080")).is_ok());
    }
}
