//! What every Tessera role shares at run time: one graceful shutdown, one way to build a Kubernetes client
//! (explicit timeouts: [`kube_client`]), one accept loop with connection bounds ([`serve`]), and one bounded way
//! to read a document another pod serves ([`body`]).
//!
//! ```text
//!  Serving ──SIGTERM/Ctrl-C──▶ Draining ──--drain-period elapsed (or a second signal)──▶ Stopping ──▶ exit
//!            /ready: 200         /ready: 503, everything else still served     stop accepting, answer what is
//!                                                                              held (503 + Retry-After), let
//!                                                                              in-flight responses finish
//! ```
//!
//! Why a drain at all: when Kubernetes deletes a pod it sends SIGTERM and removes the pod from its Services'
//! EndpointSlices *at the same time*; kube-proxy, ingress controllers and the activator learn of the removal
//! seconds later. A server that stops accepting at once refuses the requests still routed to it in between. So a
//! role first fails `/ready` (the endpoint turns not-ready everywhere), keeps serving for `--drain-period`, and
//! only then stops. Anything it still *holds* at that point (the activator's requests waiting for a scale from
//! zero) is answered with `503` and `Retry-After` rather than cut off by the kubelet's SIGKILL at the end of the
//! grace period.
//!
//! Every role uses [`Graceful`]: [`Graceful::on_signals`] at start-up, [`Graceful::ready_gate`] around its HTTP
//! router, and [`Graceful::stopping`] / [`Graceful::stop_token`] where its server and loops stop.

pub mod body;
pub mod kube_client;
pub mod metrics;
pub mod pod;
pub mod report;
pub mod security;
pub mod serve;
pub mod size;
pub mod token;
pub mod watch_events;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Parses a command line (`argv[0]` is the program name) into a role's flattened `Args`, as its subcommand
/// would: for tests of its flags and defaults.
pub fn try_parse_args<A: clap::Args>(argv: &[&str]) -> Result<A, clap::Error> {
    #[derive(clap::Parser)]
    struct Cli<A: clap::Args> {
        #[command(flatten)]
        args: A,
    }
    <Cli<A> as clap::Parser>::try_parse_from(argv).map(|cli| cli.args)
}

/// Where a role is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// Normal operation.
    Serving,
    /// A stop was asked for: `/ready` fails, everything else is still served.
    Draining,
    /// The drain is over: stop accepting, answer what is held, finish in-flight work, exit.
    Stopping,
}

/// The `--drain-period` flag, flattened into the arguments of every role that serves traffic.
#[derive(Debug, Clone, clap::Args)]
pub struct DrainArgs {
    /// After SIGTERM, how long to keep serving with `/ready` failing before stopping (time for the endpoint
    /// removal to reach every load balancer). Keep the pod's terminationGracePeriodSeconds above it.
    #[arg(long, env = "TESSERA_DRAIN_PERIOD", value_parser = humantime::parse_duration, default_value = "5s")]
    pub drain_period: Duration,
}

/// The shared shutdown state of one process; cheap to clone.
#[derive(Debug, Clone)]
pub struct Graceful {
    phase: Arc<watch::Sender<Phase>>,
    stop: CancellationToken,
}

impl Default for Graceful {
    fn default() -> Self {
        Self::new()
    }
}

impl Graceful {
    /// A handle in [`Phase::Serving`] that no signal moves (tests, and roles that drive it themselves).
    pub fn new() -> Self {
        Self {
            phase: Arc::new(watch::Sender::new(Phase::Serving)),
            stop: CancellationToken::new(),
        }
    }

    /// A handle driven by SIGTERM and Ctrl-C: the first signal starts a drain of `drain_period`, a second one ends
    /// it at once. Must be called inside a Tokio runtime.
    pub fn on_signals(drain_period: Duration) -> Self {
        let g = Self::new();
        let driver = g.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            info!(
                drain_period = %humantime::format_duration(drain_period),
                "shutdown requested: /ready now fails; still serving during the drain period"
            );
            driver.drain(drain_period, wait_for_signal()).await;
        });
        g
    }

    /// Starts a drain of `drain_period` now (what a signal does), then stops. Returns at once.
    pub fn begin_drain(&self, drain_period: Duration) {
        let g = self.clone();
        tokio::spawn(async move { g.drain(drain_period, std::future::pending()).await });
    }

    async fn drain(&self, drain_period: Duration, cut_short: impl std::future::Future<Output = ()>) {
        self.advance(Phase::Draining);
        tokio::select! {
            () = tokio::time::sleep(drain_period) => {}
            () = cut_short => info!("second signal: ending the drain early"),
            () = self.stop.cancelled() => {}
        }
        self.stop_now();
    }

    /// Skips whatever is left of the drain: [`Phase::Stopping`] now.
    pub fn stop_now(&self) {
        if self.advance(Phase::Stopping) {
            info!("drain over: stopping (answering held requests, finishing in-flight ones)");
        }
        self.stop.cancel();
    }

    /// Moves forward only (a late signal never brings a stopping process back to draining); true if it moved.
    fn advance(&self, to: Phase) -> bool {
        self.phase.send_if_modified(|p| {
            let moved = *p < to;
            if moved {
                *p = to;
            }
            moved
        })
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        *self.phase.borrow()
    }

    /// True from the first signal on: `/ready` must fail.
    pub fn is_draining(&self) -> bool {
        self.phase() >= Phase::Draining
    }

    /// True once the drain is over.
    pub fn is_stopping(&self) -> bool {
        self.phase() >= Phase::Stopping
    }

    /// Resolves when the drain begins.
    pub async fn draining(&self) {
        let mut rx = self.phase.subscribe();
        // The sender lives in `self`, so the channel cannot close while this waits.
        let _ = rx.wait_for(|p| *p >= Phase::Draining).await;
    }

    /// Resolves when the drain is over; hand it to `axum::serve(..).with_graceful_shutdown`.
    pub async fn stopping(&self) {
        self.stop.cancelled().await;
    }

    /// A token cancelled when the drain is over, for loops that stop on a [`CancellationToken`].
    pub fn stop_token(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Wraps `router` so that `GET /ready` answers 503 from the first signal on, whatever the role's own readiness
    /// says; every other route is served as before, but an HTTP/1 response then carries `Connection: close`, so a
    /// keep-alive client opens its next request elsewhere instead of being cut mid-request when the drain ends.
    pub fn ready_gate<S>(&self, router: axum::Router<S>) -> axum::Router<S>
    where
        S: Clone + Send + Sync + 'static,
    {
        router.layer(axum::middleware::from_fn_with_state(self.clone(), gate))
    }
}

async fn gate(State(g): State<Graceful>, req: Request, next: Next) -> Response {
    if g.is_draining() && req.uri().path() == "/ready" {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting down: draining before exit\n",
        )
            .into_response();
    }
    let http1 = req.version() < axum::http::Version::HTTP_2;
    let mut resp = next.run(req).await;
    // HTTP/2 has no Connection header (the server's GOAWAY at the stop does the same job).
    if http1 && g.is_draining() {
        resp.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
    resp
}

/// SIGTERM (what the kubelet sends) or Ctrl-C.
async fn wait_for_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            warn!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops this process gracefully");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { () = ctrl_c => {}, () = term => {} }
}

/// Unix milliseconds of a clock reading (0 before the epoch), the unit of every time on the wire and in the core.
pub fn unix_ms(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use axum::body::Body;
    use axum::routing::get;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn get_status(app: &axum::Router, path: &str) -> (StatusCode, String) {
        let resp = app
            .clone()
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn drain_fails_ready_keeps_serving_then_stops() {
        let g = Graceful::new();
        let app = g.ready_gate(
            axum::Router::new()
                .route("/ready", get(|| async { "ok" }))
                .route("/work", get(|| async { "done" })),
        );
        assert_eq!(get_status(&app, "/ready").await.0, StatusCode::OK);
        let connection = |app: &axum::Router| {
            let app = app.clone();
            async move {
                let resp = app
                    .oneshot(Request::get("/work").body(Body::empty()).unwrap())
                    .await
                    .unwrap();
                resp.headers()
                    .get("connection")
                    .map(|v| v.to_str().unwrap().to_owned())
            }
        };
        assert_eq!(connection(&app).await, None, "keep-alive while serving");
        g.begin_drain(Duration::from_millis(500));
        g.draining().await;
        assert_eq!(g.phase(), Phase::Draining);
        let (code, body) = get_status(&app, "/ready").await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("shutting down"), "{body}");
        assert_eq!(get_status(&app, "/work").await, (StatusCode::OK, "done".into()));
        // Draining: keep-alive clients are told to take their next request elsewhere.
        assert_eq!(connection(&app).await.as_deref(), Some("close"));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!g.stop_token().is_cancelled(), "stopped before the drain period");
        tokio::time::timeout(Duration::from_secs(5), g.stopping())
            .await
            .unwrap();
        assert!(g.is_stopping());
    }

    #[tokio::test]
    async fn stop_now_skips_the_drain_and_phases_never_go_back() {
        let g = Graceful::new();
        g.begin_drain(Duration::from_secs(3600));
        g.draining().await;
        g.stop_now();
        tokio::time::timeout(Duration::from_millis(100), g.stopping())
            .await
            .unwrap();
        // A late drain request cannot reopen a stopping process.
        g.begin_drain(Duration::from_secs(1));
        tokio::task::yield_now().await;
        assert_eq!(g.phase(), Phase::Stopping);
    }
}
