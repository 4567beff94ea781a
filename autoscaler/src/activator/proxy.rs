//! The request path: read the `model`, pick or wait for a backend, forward, stream the response back.
//!
//! Every request ends in exactly one of two ways: it is forwarded to one backend once (a connection that was
//! refused sent nothing, so trying another backend is not a second delivery), or the activator answers it itself
//! with an explicit status and an OpenAI-style error body. Nothing is dropped silently.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde::Deserialize;
use tokio::time::Instant;
use tracing::{Instrument, debug, info_span, warn};

use super::discovery::Discovery;
use super::metrics::{CodeLabels, Metrics, ModelLabels, RejectLabels};
use super::router::{InFlight, Lease, Router};

/// What the request path needs, shared by every connection.
#[derive(Debug)]
pub struct App {
    /// Per-model state.
    pub router: Arc<Router>,
    /// Where readiness comes from (told about connect failures).
    pub discovery: Arc<dyn Discovery>,
    /// Metric families.
    pub metrics: Metrics,
    /// Pooled keep-alive client to the backends.
    pub client: Client<HttpConnector, Full<Bytes>>,
    /// Longest a request is held waiting for a ready backend.
    pub hold_timeout: Duration,
    /// `Retry-After` on 503s the activator answers itself.
    pub retry_after: Duration,
    /// Largest request body read (the `model` is inside it).
    pub max_body_bytes: usize,
}

/// Why the activator answered a request itself.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The body was not JSON with a string `model`.
    #[error("the request body must be a JSON object with a string \"model\" field: {0}")]
    BadRequest(String),
    /// The body exceeded `--max-body-size`.
    #[error("the request body is larger than {0} bytes (raise --max-body-size if this is intended)")]
    TooLarge(usize),
    /// No routing for this model name.
    #[error("the model `{0}` does not exist; GET /v1/models lists the models this gateway serves")]
    UnknownModel(String),
    /// The hold queue for the model is full.
    #[error(
        "model `{0}` is scaling up and already has the most waiting requests --queue-size allows; retry later"
    )]
    QueueFull(String),
    /// No backend became ready within `--hold-timeout`.
    #[error(
        "no replica of model `{model}` became ready within {waited} (it is scaling from zero); retry later"
    )]
    HoldTimeout {
        /// The model.
        model: String,
        /// How long the request waited, humantime.
        waited: String,
    },
    /// The backend failed after the request was sent.
    #[error("the model server for `{model}` failed: {error}")]
    Upstream {
        /// The model.
        model: String,
        /// What went wrong.
        error: String,
    },
}

impl RequestError {
    fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnknownModel(_) => StatusCode::NOT_FOUND,
            Self::QueueFull(_) | Self::HoldTimeout { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::Upstream { .. } => StatusCode::BAD_GATEWAY,
        }
    }

    /// The fixed label for metrics and the OpenAI `code` field.
    pub fn label(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "bad_request",
            Self::TooLarge(_) => "body_too_large",
            Self::UnknownModel(_) => "model_not_found",
            Self::QueueFull(_) => "queue_full",
            Self::HoldTimeout { .. } => "hold_timeout",
            Self::Upstream { .. } => "upstream_error",
        }
    }

    fn openai_type(&self) -> &'static str {
        match self {
            Self::BadRequest(_) | Self::TooLarge(_) | Self::UnknownModel(_) => "invalid_request_error",
            Self::QueueFull(_) | Self::HoldTimeout { .. } | Self::Upstream { .. } => "server_error",
        }
    }

    fn into_response(self, retry_after: Duration) -> Response {
        let status = self.status();
        let param = matches!(self, Self::UnknownModel(_)).then_some("model");
        let body = serde_json::json!({
            "error": { "message": self.to_string(), "type": self.openai_type(), "param": param, "code": self.label() }
        });
        let mut resp = (status, axum::Json(body)).into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            let secs = retry_after.as_secs().max(1);
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

/// Only the field the router needs; serde skips the rest of the body without allocating for it.
#[derive(Deserialize)]
struct ModelField<'a> {
    #[serde(borrow)]
    model: Option<std::borrow::Cow<'a, str>>,
}

/// The `model` of an OpenAI request body.
pub fn model_of(body: &[u8]) -> Result<String, RequestError> {
    let parsed: ModelField<'_> =
        serde_json::from_slice(body).map_err(|e| RequestError::BadRequest(e.to_string()))?;
    match parsed.model {
        Some(m) if !m.is_empty() => Ok(m.into_owned()),
        _ => Err(RequestError::BadRequest("\"model\" is missing or empty".into())),
    }
}

/// Handles every OpenAI `POST /v1/...` request.
pub async fn handle(State(app): State<Arc<App>>, req: Request) -> Response {
    let arrived = Instant::now();
    let (parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, app.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => {
            // The limit surfaces as http-body-util's LengthLimitError; anything else is the client's stream failing.
            let inner = e.into_inner();
            let err = if inner.is::<http_body_util::LengthLimitError>() {
                RequestError::TooLarge(app.max_body_bytes)
            } else {
                RequestError::BadRequest(format!("could not read the body: {inner}"))
            };
            return reject(&app, "unknown", err);
        }
    };
    let model = match model_of(&body) {
        Ok(m) => m,
        Err(e) => return reject(&app, "unknown", e),
    };
    let span = info_span!("request", model = %model, path = %parts.uri.path());
    forward(app, parts, body, model, arrived).instrument(span).await
}

fn reject(app: &App, model: &str, err: RequestError) -> Response {
    debug!(error = %err, "answering with an error");
    let code = err.status().as_u16();
    app.metrics
        .requests
        .get_or_create(&CodeLabels {
            model: model.to_string(),
            code,
        })
        .inc();
    app.metrics
        .rejected
        .get_or_create(&RejectLabels {
            model: model.to_string(),
            reason: err.label(),
        })
        .inc();
    err.into_response(app.retry_after)
}

async fn forward(
    app: Arc<App>,
    parts: http::request::Parts,
    body: Bytes,
    model: String,
    arrived: Instant,
) -> Response {
    let Some(entry) = app.router.get(&model) else {
        return reject(&app, "unknown", RequestError::UnknownModel(model));
    };
    entry.record_arrival(crate::unix_ms(SystemTime::now()));
    let deadline = arrived + app.hold_timeout;
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
    // `slot` is the place in the hold queue while waiting; `held` remembers that the request waited at all, so
    // the hold histogram counts it once even if a refused connection sends it back to the queue.
    let mut slot = None;
    let mut held = false;
    loop {
        if let Some(lease) = entry.pick() {
            drop(slot.take());
            let in_flight = entry.start_in_flight();
            match send(&app.client, &parts, &path, body.clone(), &lease).await {
                Ok(resp) => {
                    if held {
                        app.metrics
                            .hold_seconds
                            .get_or_create(&ModelLabels { model: model.clone() })
                            .observe(arrived.elapsed().as_secs_f64());
                    }
                    let code = resp.status().as_u16();
                    app.metrics
                        .requests
                        .get_or_create(&CodeLabels {
                            model: model.clone(),
                            code,
                        })
                        .inc();
                    return stream_back(resp, lease, in_flight);
                }
                Err(SendError::Connect(e)) => {
                    // Nothing reached the backend, so trying again is not a second delivery.
                    warn!(backend = %lease.backend().base, error = %e, "backend refused the connection; rerouting");
                    app.discovery.connect_failed(&entry, &lease.backend().base);
                    continue;
                }
                Err(SendError::Other(error)) => {
                    entry.record_rejection();
                    return reject(
                        &app,
                        &model,
                        RequestError::Upstream {
                            model: model.clone(),
                            error,
                        },
                    );
                }
            }
        }
        if slot.is_none() {
            // try_enqueue also wakes discovery (probe now / patch the autoscaler).
            match entry.try_enqueue() {
                Some(s) => {
                    slot = Some(s);
                    held = true;
                }
                None => {
                    entry.record_rejection();
                    return reject(&app, &model, RequestError::QueueFull(model.clone()));
                }
            }
        } else {
            // Woken, but the backend left again before this request could take it: ask discovery once more.
            entry.demand().notify_one();
        }
        if !entry.wait_ready(deadline).await {
            entry.record_rejection();
            let waited = humantime::format_duration(Duration::from_millis(
                u64::try_from(arrived.elapsed().as_millis()).unwrap_or(u64::MAX),
            ))
            .to_string();
            app.metrics
                .hold_seconds
                .get_or_create(&ModelLabels { model: model.clone() })
                .observe(arrived.elapsed().as_secs_f64());
            return reject(
                &app,
                &model,
                RequestError::HoldTimeout {
                    model: model.clone(),
                    waited,
                },
            );
        }
    }
}

enum SendError {
    Connect(String),
    Other(String),
}

/// Headers that describe one hop, not the message (RFC 9110 §7.6.1); never forwarded.
const HOP_BY_HOP: [header::HeaderName; 7] = [
    header::CONNECTION,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for h in &HOP_BY_HOP {
        headers.remove(h);
    }
    headers.remove("keep-alive");
}

async fn send(
    client: &Client<HttpConnector, Full<Bytes>>,
    parts: &http::request::Parts,
    path: &str,
    body: Bytes,
    lease: &Lease,
) -> Result<http::Response<Incoming>, SendError> {
    let uri = lease
        .backend()
        .uri_for(path)
        .map_err(|e| SendError::Other(format!("bad backend URL: {e}")))?;
    let mut req = http::Request::new(Full::new(body));
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = uri;
    *req.headers_mut() = parts.headers.clone();
    strip_hop_by_hop(req.headers_mut());
    // The client sets Host for the backend, and the length from the (already complete) body.
    req.headers_mut().remove(header::HOST);
    req.headers_mut().remove(header::CONTENT_LENGTH);
    client.request(req).await.map_err(|e| {
        if e.is_connect() {
            SendError::Connect(e.to_string())
        } else {
            SendError::Other(format!(
                "{e}: {}",
                std::error::Error::source(&e).map_or(String::new(), |s| s.to_string())
            ))
        }
    })
}

fn stream_back(resp: http::Response<Incoming>, lease: Lease, in_flight: InFlight) -> Response {
    let (mut parts, incoming) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let body = GuardedBody {
        inner: incoming,
        _lease: lease,
        _in_flight: in_flight,
    };
    Response::from_parts(parts, Body::new(body))
}

/// The backend's response body, frame by frame (no buffering: each SSE chunk is written as it arrives), holding
/// the backend lease and the in-flight count until it ends or the client goes away. A backend that dies mid-body
/// surfaces as an error frame, which makes the server abort the client's connection instead of ending it cleanly.
struct GuardedBody {
    inner: Incoming,
    _lease: Lease,
    _in_flight: InFlight,
}

impl hyper::body::Body for GuardedBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
