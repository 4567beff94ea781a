//! The one accept loop every Tessera server uses, plain or TLS, with the connection bounds `axum::serve` and
//! `axum-server` do not have.
//!
//! What a client can do to a server that has no timers, and what bounds it here:
//!
//! | the client | bound |
//! |---|---|
//! | opens a connection and sends nothing, or part of an HTTP/2 preface, or trickles a header | [`ConnLimits::header_read_timeout`]: no request within it of the connection's start closes the connection, whatever bytes trickle in (the auto builder's version sniff and the HTTP/2 side have no timer of their own) |
//! | stalls a TLS handshake | the same bound around the handshake |
//! | keeps an idle keep-alive or HTTP/2 connection open | [`ConnLimits::idle_timeout`]: no request in flight for that long closes it |
//! | holds a request open (a held request, a long stream) | nothing: a connection with a request in flight, its response body included, is never idle |
//!
//! Without these, ~7,000 stalled TLS connections took the webhook to its memory limit (and with
//! `failurePolicy: Ignore` every pod was then admitted bare), and an activator kept every silent connection.
//!
//! A request counts as in flight from the moment hyper hands it to the router until its response body has been
//! sent or dropped; the cost per request is two atomic operations and one small allocation.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use http::{Request, Response};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, warn};

/// The `Content-Type` of what prometheus-client writes (OpenMetrics: `# EOF`, counter families without `_total`):
/// Prometheus chooses its parser by this header, so every `/metrics` route must say so.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A `/metrics` answer: `page` (OpenMetrics text) with the [`OPENMETRICS`] content type.
pub fn openmetrics(page: String) -> axum::response::Response {
    use axum::response::IntoResponse;
    ([(http::header::CONTENT_TYPE, OPENMETRICS)], page).into_response()
}

/// Bounds on each client connection.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// The longest a new connection may take to complete its TLS handshake (when TLS) and its first request's
    /// headers; also hyper's bound on each later HTTP/1 request's headers.
    pub header_read_timeout: Duration,
    /// The longest a connection may stay open with no request in flight after its first one.
    pub idle_timeout: Duration,
}

impl Default for ConnLimits {
    /// 10 s for headers, 60 s idle: far above any honest client on a cluster network, far below what a
    /// connection-holding client needs to exhaust memory or file descriptors.
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// The `--header-read-timeout` and `--idle-timeout` flags, for roles that expose them.
#[derive(Debug, Clone, clap::Args)]
pub struct ConnArgs {
    /// Longest a client may take, from connecting, to complete a TLS handshake and send its first request's
    /// headers (a slower or silent connection is closed); also bounds each later request's headers.
    #[arg(long, env = "TESSERA_HEADER_READ_TIMEOUT", value_parser = nonzero_duration, default_value = "10s")]
    pub header_read_timeout: Duration,
    /// Longest a client connection may stay open with no request in flight (keep-alive and HTTP/2 included).
    /// A request in flight, held or streaming, never makes its connection idle.
    #[arg(long = "client-idle-timeout", env = "TESSERA_CLIENT_IDLE_TIMEOUT", value_parser = nonzero_duration, default_value = "60s")]
    pub client_idle_timeout: Duration,
}

impl ConnArgs {
    /// The limits these flags set.
    pub fn limits(&self) -> ConnLimits {
        ConnLimits {
            header_read_timeout: self.header_read_timeout,
            idle_timeout: self.client_idle_timeout,
        }
    }
}

/// A humantime duration that must be positive: a zero timeout would close every connection at once, a zero
/// interval turn a probe or wake-up loop into a busy loop. Every role's duration flags of that kind use it.
pub fn nonzero_duration(s: &str) -> Result<Duration, String> {
    let d =
        humantime::parse_duration(s).map_err(|e| format!("{s:?} is not a duration like 20ms or 5s: {e}"))?;
    if d.is_zero() {
        return Err(format!(
            "{s:?}: the interval must be greater than zero (e.g. 20ms)"
        ));
    }
    Ok(d)
}

/// Serves `app` over plain HTTP/1 and HTTP/2 on `listener` until `stop` resolves, then stops accepting, lets
/// each connection finish what it has in flight, and returns once all have.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: ConnLimits,
    stop: impl Future<Output = ()>,
) {
    serve_with(listener, app, limits, stop, |tcp| async move { Ok(tcp) }).await;
}

/// As [`serve`], over TLS: `config` is asked for the current server configuration at each handshake, so a
/// certificate reloaded on disk applies to the next connection.
pub async fn serve_tls(
    listener: TcpListener,
    app: axum::Router,
    limits: ConnLimits,
    config: impl Fn() -> Arc<rustls::ServerConfig> + Send + Sync + 'static,
    stop: impl Future<Output = ()>,
) {
    let config = Arc::new(config);
    serve_with(listener, app, limits, stop, move |tcp| {
        let acceptor = tokio_rustls::TlsAcceptor::from(config());
        async move { acceptor.accept(tcp).await }
    })
    .await;
}

async fn serve_with<U, F, IO>(
    listener: TcpListener,
    app: axum::Router,
    limits: ConnLimits,
    stop: impl Future<Output = ()>,
    upgrade: U,
) where
    U: Fn(TcpStream) -> F,
    F: Future<Output = std::io::Result<IO>> + Send + 'static,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    // Dead peers on HTTP/2 are found by PINGs; a live but unused one is closed by the idle watchdog below.
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(limits.idle_timeout.min(Duration::from_secs(30))))
        .keep_alive_timeout(limits.header_read_timeout);
    let builder = Arc::new(builder);
    let connections = GracefulShutdown::new();
    let mut stop = std::pin::pin!(stop);
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
            () = &mut stop => break,
        };
        // Small SSE chunks must leave at once, not wait for Nagle's algorithm.
        if let Err(e) = tcp.set_nodelay(true) {
            warn!(error = %e, "could not set TCP_NODELAY");
        }
        let upgrading = upgrade(tcp);
        let (builder, app, watcher) = (builder.clone(), app.clone(), connections.watcher());
        tokio::spawn(async move {
            let started = Instant::now();
            let io = match tokio::time::timeout(limits.header_read_timeout, upgrading).await {
                Ok(Ok(io)) => io,
                Ok(Err(e)) => return debug!(error = %e, "connection set-up failed"),
                Err(_) => return debug!("connection set-up (TLS handshake) timed out: closed"),
            };
            let state = Arc::new(ConnState::new(started));
            let service = Counted {
                app,
                state: state.clone(),
            };
            let conn = builder.serve_connection(
                TokioIo::new(io),
                hyper::service::service_fn(move |req| service.call(req)),
            );
            let conn = watcher.watch(conn.into_owned());
            tokio::select! {
                ended = conn => if let Err(e) = ended {
                    debug!(error = %e, "connection ended with an error");
                },
                () = state.idle(limits) => debug!("closing a connection with no request in flight"),
            }
        });
    }
    drop(listener);
    connections.shutdown().await;
}

/// What the idle watchdog of one connection reads.
#[derive(Debug)]
struct ConnState {
    started: Instant,
    in_flight: AtomicUsize,
    /// Requests seen so far (0: the first one is still awaited, under the header bound).
    requests: AtomicU64,
    /// When the last request finished, in ms since `started`.
    last_done_ms: AtomicU64,
}

impl ConnState {
    fn new(started: Instant) -> Self {
        Self {
            started,
            in_flight: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            last_done_ms: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Resolves once the connection has had no request in flight for its bound: the header bound before the
    /// first request, the idle bound after.
    async fn idle(&self, limits: ConnLimits) {
        loop {
            let bound = if self.requests.load(Ordering::Acquire) == 0 {
                limits.header_read_timeout
            } else {
                limits.idle_timeout
            };
            let bound_ms = u64::try_from(bound.as_millis()).unwrap_or(u64::MAX);
            let since = self.last_done_ms.load(Ordering::Acquire);
            let now = self.now_ms();
            let wait_ms = if self.in_flight.load(Ordering::Acquire) > 0 {
                // Busy: look again after one bound; it can only become idle after it finishes.
                bound_ms
            } else if now.saturating_sub(since) >= bound_ms {
                return;
            } else {
                bound_ms - now.saturating_sub(since)
            };
            tokio::time::sleep(Duration::from_millis(wait_ms.max(1))).await;
        }
    }
}

/// Counts one request in flight until dropped (with its response body).
#[derive(Debug)]
struct InFlight(Arc<ConnState>);

impl InFlight {
    fn new(state: Arc<ConnState>) -> Self {
        state.requests.fetch_add(1, Ordering::AcqRel);
        state.in_flight.fetch_add(1, Ordering::AcqRel);
        Self(state)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let now = self.0.now_ms();
        self.0.last_done_ms.fetch_max(now, Ordering::AcqRel);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

#[derive(Debug, Clone)]
struct Counted {
    app: axum::Router,
    state: Arc<ConnState>,
}

impl Counted {
    fn call(
        &self,
        req: Request<Incoming>,
    ) -> impl Future<Output = Result<Response<Body>, Infallible>> + use<> {
        let guard = InFlight::new(self.state.clone());
        let app = self.app.clone();
        async move {
            let resp = tower::ServiceExt::oneshot(app, req).await?;
            Ok(resp.map(|body| Body::new(Guarded { body, _guard: guard })))
        }
    }
}

/// A response body that keeps its request counted as in flight until it is sent or dropped.
#[derive(Debug)]
struct Guarded {
    body: Body,
    _guard: InFlight,
}

impl hyper::body::Body for Guarded {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn start(limits: ConnLimits) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let app = axum::Router::new()
            .route("/", axum::routing::get(|| async { "ok" }))
            .route(
                "/slow",
                axum::routing::get(|| async {
                    tokio::time::sleep(Duration::from_millis(600)).await;
                    "slow"
                }),
            );
        tokio::spawn(serve(listener, app, limits, std::future::pending()));
        addr
    }

    /// Reads until the server closes; true if it closed within `within`.
    async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
        let mut buf = [0u8; 4096];
        let deadline = Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline.into(), s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => continue,
                Err(_) => return false,
            }
        }
    }

    const SHORT: ConnLimits = ConnLimits {
        header_read_timeout: Duration::from_millis(300),
        idle_timeout: Duration::from_millis(400),
    };

    /// A connection to a server with the [`SHORT`] bounds, once `first` (possibly nothing) is written on it.
    async fn connected(first: &[u8]) -> TcpStream {
        let addr = start(SHORT).await;
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(first).await.expect("write");
        s
    }

    #[tokio::test]
    async fn a_silent_connection_is_closed_after_the_header_bound() {
        let mut s = connected(b"").await;
        assert!(closed_within(&mut s, Duration::from_secs(3)).await);
    }

    #[tokio::test]
    async fn a_partial_http2_preface_is_closed_after_the_header_bound() {
        let mut s = connected(b"PRI * HTTP/2.0\r\n").await;
        assert!(closed_within(&mut s, Duration::from_secs(3)).await);
    }

    #[tokio::test]
    async fn an_idle_http2_connection_is_closed_after_the_idle_bound() {
        // A complete preface and an empty SETTINGS frame, then nothing: hyper answers with its SETTINGS and waits.
        let mut s = connected(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00").await;
        assert!(closed_within(&mut s, Duration::from_secs(3)).await);
    }

    #[tokio::test]
    async fn a_keep_alive_connection_is_served_then_closed_when_idle_but_never_mid_request() {
        // A request slower than both bounds is still answered: in flight is never idle.
        let mut s = connected(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n").await;
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf))
            .await
            .expect("answered in time")
            .expect("read");
        let head = String::from_utf8_lossy(&buf[..n]);
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(head.ends_with("slow"), "{head}");
        // Then nothing more: closed after the idle bound.
        assert!(closed_within(&mut s, Duration::from_secs(3)).await);
    }

    #[tokio::test]
    async fn a_client_that_keeps_asking_is_never_closed() {
        let mut s = connected(b"").await;
        let mut buf = vec![0u8; 4096];
        for _ in 0..8 {
            s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
                .await
                .expect("write");
            let n = s.read(&mut buf).await.expect("read");
            assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }
}
