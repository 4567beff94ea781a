//! The activator's accept loop: axum's `serve` sets no header-read timeout, so a client that opens connections
//! and trickles its headers (slowloris) would hold each one forever. This loop serves the same router through
//! hyper with `--header-read-timeout`, TCP_NODELAY, and the shared graceful shutdown: at the end of the drain it
//! stops accepting, lets each connection finish its current exchange, and returns once all have.

use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tessera_runtime::Graceful;
use tracing::{debug, warn};

/// Serves `app` on `listener` until the drain is over and every connection has finished.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    header_read_timeout: Duration,
    graceful: Graceful,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    let connections = GracefulShutdown::new();
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of file descriptors, typically: pause instead of spinning, keep serving the others.
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = graceful.stopping() => break,
        };
        // Small SSE chunks must leave at once, not wait for Nagle's algorithm.
        if let Err(e) = tcp.set_nodelay(true) {
            warn!(error = %e, "could not set TCP_NODELAY");
        }
        let service = TowerToHyperService::new(app.clone());
        let conn = builder.serve_connection(TokioIo::new(tcp), service).into_owned();
        let conn = connections.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    connections.shutdown().await;
}
