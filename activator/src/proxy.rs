//! The request path: admit, read the body (bounded), find the `model`, pick or wait for a backend, forward,
//! stream the response back.
//!
//! Every request ends in exactly one of two ways: it is forwarded to one backend once, or the activator answers
//! it itself with an explicit status and an OpenAI-style error body. It is sent to another backend only when
//! nothing of it reached the first one (the connection was refused or never established; hyper's pool likewise
//! retries only a request it never started writing to a pooled connection that had closed). A backend that fails
//! after the request was written is a `502`, never a replay: a completion may already be running there.
//!
//! Bounds, each with its own answer: `--max-in-flight` admitted requests (429), `--max-held` held requests across
//! all models and `--queue-size` per model (429 / 503), `--lane-max-held` waiting flex-lane requests, which hold
//! none of the other three (429 with `--lane-retry-after`), `--max-body-size` per body (413, checked against
//! `Content-Length` before reading and again while streaming), `--max-buffered-body-bytes` over every buffered body
//! (429), `--body-read-timeout` (408), `--hold-timeout` (503), `--response-header-timeout` (504). Every 429 and 503
//! carries `Retry-After`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde::Deserialize;
use tessera_core::class::Lane;
use tessera_core::lanes::LaneLimits;
use tessera_runtime::Graceful;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tracing::{Instrument, debug, info_span, warn};

use super::discovery::Discovery;
use super::metrics::{CodeLabels, Metrics, ModelLabels, RejectLabels};
use super::router::{Admitted, HoldRefused, InFlight, LaneHeld, Lease, ModelEntry, Router};

/// The request path's bounds and timeouts (see the module docs).
#[derive(Debug, Clone)]
pub struct Limits {
    /// Longest a request is held waiting for a ready backend.
    pub hold_timeout: Duration,
    /// `Retry-After` on the 429s and 503s the activator answers itself.
    pub retry_after: Duration,
    /// Largest request body read (the `model` is inside it).
    pub max_body_bytes: usize,
    /// Longest the whole request body may take to arrive.
    pub body_read_timeout: Duration,
    /// Longest a backend may take to send response headers once the request is sent.
    pub response_header_timeout: Duration,
    /// Longest a backend may go without sending anything of a response body it has started (a stalled stream).
    pub stream_idle_timeout: Duration,
    /// The flex lane's gate (`tessera_core::lanes`).
    pub lanes: LaneLimits,
    /// Longest a flex-lane request waits for room before its 429.
    pub lane_hold_timeout: Duration,
    /// How often a waiting flex-lane request looks for room again.
    pub lane_poll_interval: Duration,
    /// `Retry-After` on a flex-lane 429.
    pub lane_retry_after: Duration,
    /// Set each request's vLLM `priority` from its lane ([`forwarded_priority`]; only for servers started
    /// with `--scheduling-policy priority`, which refuse a non-zero priority otherwise).
    pub lane_priority: bool,
    /// A streamed request held this long gets headers and an SSE comment, then one per interval (0: never).
    pub keepalive_interval: Duration,
}

/// vLLM's development and admin endpoints (`VLLM_SERVER_DEV_MODE`, runtime LoRA loading): whoever reaches them can
/// put a replica to sleep, run code on its workers or swap its adapters. Only the replica's own sidecar calls them;
/// the gateway refuses them whatever the namespace prefix.
pub const DEV_ENDPOINTS: &[&str] = &[
    "/sleep",
    "/wake_up",
    "/is_sleeping",
    "/collective_rpc",
    "/reset_prefix_cache",
    "/reset_mm_cache",
    "/server_info",
    "/pause",
    "/resume",
    "/is_paused",
    "/scale_elastic_ep",
    "/is_scaling_elastic_ep",
    "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter",
];

/// The development endpoint `path` names, if any: compared on the path the model server routes by, not on the
/// bytes the client sent. The server percent-decodes the path before routing (`/v1/load%5Flora%5Fadapter` is
/// `/v1/load_lora_adapter` to uvicorn), and a proxy in front of the gateway may merge slashes (nginx's default),
/// so the path is decoded once, its slashes merged, its namespace prefix, query and trailing slash dropped, and
/// compared without regard to case.
pub fn dev_endpoint(path: &str) -> Option<&'static str> {
    let path = path.split('?').next().unwrap_or(path);
    let decoded = routed_path(path);
    let (_, path) = namespace_and_path(&decoded, "");
    let path = path.trim_end_matches('/');
    DEV_ENDPOINTS
        .iter()
        .copied()
        .find(|d| d.eq_ignore_ascii_case(path))
}

/// `path` as a server routes it: percent-escapes decoded once (as uvicorn does; a malformed escape stays as
/// written) and runs of `/` merged into one.
fn routed_path(path: &str) -> String {
    fn hex(b: u8) -> Option<u8> {
        match b {
            b'0'..=b'9' => Some(b - b'0'),
            b'a'..=b'f' => Some(b - b'a' + 10),
            b'A'..=b'F' => Some(b - b'A' + 10),
            _ => None,
        }
    }
    let raw = path.as_bytes();
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let escaped = match (raw[i], raw.get(i + 1), raw.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) => hex(h).zip(hex(l)).map(|(h, l)| (h << 4) | l),
            _ => None,
        };
        let byte = match escaped {
            Some(b) => {
                i += 3;
                b
            }
            None => {
                i += 1;
                raw[i - 1]
            }
        };
        if !(byte == b'/' && out.last() == Some(&b'/')) {
            out.push(byte);
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The 404 for a development endpoint, in OpenAI's error shape.
pub fn refuse_dev_endpoint(endpoint: &str) -> Response {
    let body = serde_json::json!({ "error": {
        "message": format!("`{endpoint}` is a model-server development endpoint; the gateway never forwards it (only \
            the replica's sidecar reaches it)"),
        "type": "invalid_request_error", "param": null, "code": "not_found" } });
    (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}

/// What the request path needs, shared by every connection.
#[derive(Debug)]
pub struct App {
    /// Per-model state and the gateway-wide admission bounds.
    pub router: Arc<Router>,
    /// Where readiness comes from (told about connect failures).
    pub discovery: Arc<dyn Discovery>,
    /// Metric families.
    pub metrics: Metrics,
    /// Pooled keep-alive client to the backends.
    pub client: Client<HttpConnector, Full<Bytes>>,
    /// Bounds and timeouts.
    pub limits: Limits,
    /// Bytes of request bodies buffered at once, all requests together (`--max-buffered-body-bytes`).
    pub body_budget: Arc<Semaphore>,
    /// Bytes of bodies held by waiting flex requests (`--lane-max-held-body-bytes`), apart from `body_budget`.
    pub lane_body_budget: Arc<Semaphore>,
    /// Shutdown: once stopping, held requests are answered 503 instead of waiting on.
    pub graceful: Graceful,
    /// The namespace of requests that name none (`/v1/...` rather than `/namespaces/<ns>/v1/...`).
    pub default_namespace: String,
}

/// Marks a request the batch runner sends: it takes the flex lane (the lowest priority) whatever its body says.
/// A request extension, so no client can set it from outside.
#[derive(Debug, Clone, Copy)]
pub struct BatchLane;

/// Which gateway-wide bound shed a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shed {
    /// `--max-in-flight`.
    InFlight,
    /// `--max-held`.
    Held,
    /// `--max-buffered-body-bytes`.
    BodyBytes,
    /// `--lane-max-held`: flex-lane requests waiting, all models together.
    LaneHeld,
}

/// Why the activator answered a request itself.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The body was not JSON with a string `model`.
    #[error("the request body must be a JSON object with a string \"model\" field: {0}")]
    BadRequest(String),
    /// The path has a dot segment (`/v1/../metrics`), plain or percent-encoded, or a backslash: forwarded as is,
    /// the backend would resolve it to a route the gateway never meant to expose.
    #[error(
        "the path {0:?} has a `.` or `..` segment (or an encoded one, or a backslash); send the path without them"
    )]
    BadPath(String),
    /// The body exceeded `--max-body-size`.
    #[error("the request body is larger than {0} bytes (raise --max-body-size if this is intended)")]
    TooLarge(usize),
    /// The body did not arrive within `--body-read-timeout`.
    #[error("the request body did not arrive within {0}")]
    BodyTimeout(String),
    /// No routing for this model name in this namespace.
    #[error(
        "the model `{model}` does not exist in namespace `{namespace}`; GET {models_path} lists the models \
         this gateway serves there"
    )]
    UnknownModel {
        /// The namespace.
        namespace: String,
        /// The model.
        model: String,
        /// Where the list is.
        models_path: String,
    },
    /// A gateway-wide bound is reached: load shedding.
    #[error("the gateway is overloaded ({}); retry later", shed_reason(*.0))]
    Overloaded(Shed),
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
    /// The activator is shutting down and the model has no ready backend.
    #[error(
        "the gateway is shutting down and model `{0}` has no ready replica; retry (another gateway replica will answer)"
    )]
    ShuttingDown(String),
    /// The backend failed after the request was sent.
    #[error("the model server for `{model}` failed: {error}")]
    Upstream {
        /// The model.
        model: String,
        /// What went wrong.
        error: String,
    },
    /// The backend sent no response headers within `--response-header-timeout`.
    #[error("the model server for `{model}` sent no response within {waited}")]
    UpstreamTimeout {
        /// The model.
        model: String,
        /// The timeout, humantime.
        waited: String,
    },
    /// A flex-lane request found no backend with room within `--lane-hold-timeout`: the real-time lanes have
    /// the servers.
    #[error(
        "model `{model}` has no room for flex-tier work now ({why}); real-time requests come first, retry later"
    )]
    LaneFull {
        /// The model.
        model: String,
        /// What the last look found.
        why: String,
    },
}

fn shed_reason(s: Shed) -> &'static str {
    match s {
        Shed::InFlight => "--max-in-flight requests are being served",
        Shed::Held => "--max-held requests are already waiting for models to scale up",
        Shed::BodyBytes => "--max-buffered-body-bytes of request bodies are buffered",
        Shed::LaneHeld => {
            "--lane-max-held flex-tier and batch requests (or --lane-max-held-body-bytes of their bodies) are already waiting; real-time requests are not affected"
        }
    }
}

impl RequestError {
    fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) | Self::BadPath(_) => StatusCode::BAD_REQUEST,
            Self::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::UnknownModel { .. } => StatusCode::NOT_FOUND,
            Self::Overloaded(_) | Self::LaneFull { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::QueueFull(_) | Self::HoldTimeout { .. } | Self::ShuttingDown(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::Upstream { .. } => StatusCode::BAD_GATEWAY,
            Self::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// The fixed label for metrics and the OpenAI `code` field.
    pub fn label(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "bad_request",
            Self::BadPath(_) => "bad_path",
            Self::TooLarge(_) => "body_too_large",
            Self::BodyTimeout(_) => "body_read_timeout",
            Self::UnknownModel { .. } => "model_not_found",
            Self::Overloaded(Shed::InFlight) => "overloaded_in_flight",
            Self::Overloaded(Shed::Held) => "overloaded_held",
            Self::Overloaded(Shed::BodyBytes) => "overloaded_body_bytes",
            Self::Overloaded(Shed::LaneHeld) => "overloaded_lane_held",
            Self::QueueFull(_) => "queue_full",
            Self::HoldTimeout { .. } => "hold_timeout",
            Self::ShuttingDown(_) => "shutting_down",
            Self::Upstream { .. } => "upstream_error",
            Self::UpstreamTimeout { .. } => "upstream_timeout",
            Self::LaneFull { .. } => "lane_full",
        }
    }

    fn openai_type(&self) -> &'static str {
        match self {
            Self::BadRequest(_)
            | Self::BadPath(_)
            | Self::TooLarge(_)
            | Self::BodyTimeout(_)
            | Self::UnknownModel { .. } => "invalid_request_error",
            // What OpenAI's own API answers when a client must slow down.
            Self::Overloaded(_) | Self::LaneFull { .. } => "rate_limit_error",
            Self::QueueFull(_)
            | Self::HoldTimeout { .. }
            | Self::ShuttingDown(_)
            | Self::Upstream { .. }
            | Self::UpstreamTimeout { .. } => "server_error",
        }
    }

    fn into_response(self, retry_after: Duration) -> Response {
        let status = self.status();
        let param = matches!(self, Self::UnknownModel { .. }).then_some("model");
        let body = serde_json::json!({
            "error": { "message": self.to_string(), "type": self.openai_type(), "param": param, "code": self.label() }
        });
        let mut resp = (status, axum::Json(body)).into_response();
        if matches!(
            status,
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS
        ) {
            let secs = retry_after.as_secs().max(1);
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

/// The fields the activator reads: the `model` it routes by, and for the lanes and the class rule the tier asked
/// for, the vLLM priority, whether to stream and how long the prompt is. serde skips the rest of the body
/// without allocating for it, and the prompt is measured, never copied ([`TextLen`]).
#[derive(Deserialize)]
struct RequestFields<'a> {
    #[serde(borrow)]
    model: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default, borrow)]
    service_tier: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    priority: Option<i64>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    prompt: Option<TextLen>,
    #[serde(default)]
    messages: Option<TextLen>,
    #[serde(default)]
    input: Option<TextLen>,
}

/// The bytes of text in a JSON value (strings, in arrays and objects at any depth; keys and numbers not
/// counted): a prompt's length without holding a copy of it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TextLen(pub usize);

impl<'de> Deserialize<'de> for TextLen {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = TextLen;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E>(self, v: &str) -> Result<TextLen, E> {
                Ok(TextLen(v.len()))
            }
            fn visit_bool<E>(self, _: bool) -> Result<TextLen, E> {
                Ok(TextLen(0))
            }
            fn visit_i64<E>(self, _: i64) -> Result<TextLen, E> {
                Ok(TextLen(0))
            }
            fn visit_u64<E>(self, _: u64) -> Result<TextLen, E> {
                Ok(TextLen(0))
            }
            fn visit_f64<E>(self, _: f64) -> Result<TextLen, E> {
                Ok(TextLen(0))
            }
            fn visit_unit<E>(self) -> Result<TextLen, E> {
                Ok(TextLen(0))
            }
            fn visit_none<E>(self) -> Result<TextLen, E> {
                Ok(TextLen(0))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<TextLen, A::Error> {
                let mut n = 0usize;
                while let Some(TextLen(k)) = seq.next_element()? {
                    n = n.saturating_add(k);
                }
                Ok(TextLen(n))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<TextLen, A::Error> {
                let mut n = 0usize;
                while let Some((serde::de::IgnoredAny, TextLen(k))) = map.next_entry()? {
                    n = n.saturating_add(k);
                }
                Ok(TextLen(n))
            }
        }
        d.deserialize_any(Visit)
    }
}

/// What the activator reads of one request body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestInfo {
    /// The OpenAI `model`.
    pub model: String,
    /// The lane: `service_tier` and vLLM `priority` (`tessera_core::class::Lane::of`).
    pub lane: Lane,
    /// `stream`, when the body says.
    pub stream: Option<bool>,
    /// Bytes of text in `prompt`, `messages` or `input`, when the body has one.
    pub prompt_bytes: Option<usize>,
    /// The vLLM `priority` the body gives, if any.
    pub priority: Option<i64>,
    /// `max_completion_tokens`, else `max_tokens`, when the body gives one.
    pub max_tokens: Option<u64>,
}

/// The body with `"priority": p` added; the body as it was when it is not a JSON object (it was parsed once
/// already, so this does not happen).
fn with_priority(body: Bytes, p: i64) -> Bytes {
    match serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&body) {
        Ok(mut map) => {
            map.insert("priority".to_owned(), serde_json::Value::from(p));
            serde_json::to_vec(&map).map(Bytes::from).unwrap_or(body)
        }
        Err(_) => body,
    }
}

/// What the activator reads of an OpenAI request body.
pub fn request_info(body: &[u8]) -> Result<RequestInfo, RequestError> {
    let parsed: RequestFields<'_> =
        serde_json::from_slice(body).map_err(|e| RequestError::BadRequest(e.to_string()))?;
    let model = match parsed.model {
        Some(m) if !m.is_empty() => m.into_owned(),
        _ => return Err(RequestError::BadRequest("\"model\" is missing or empty".into())),
    };
    let prompt_bytes = [parsed.prompt, parsed.messages, parsed.input]
        .into_iter()
        .flatten()
        .map(|t| t.0)
        .reduce(usize::saturating_add);
    Ok(RequestInfo {
        model,
        lane: Lane::of(parsed.service_tier.as_deref(), parsed.priority),
        stream: parsed.stream,
        prompt_bytes,
        priority: parsed.priority,
        max_tokens: parsed.max_completion_tokens.or(parsed.max_tokens),
    })
}

/// The `model` of an OpenAI request body.
pub fn model_of(body: &[u8]) -> Result<String, RequestError> {
    request_info(body).map(|i| i.model)
}

/// Whether `path` holds a segment a server would resolve away: `.` or `..`, literally or percent-encoded
/// (`%2e`, either case), or a backslash (which some servers read as a separator). Such a path is refused, never
/// normalised: a client has no honest reason to send one.
pub fn has_dot_segment(path: &str) -> bool {
    let path = path.split('?').next().unwrap_or(path);
    if path.contains('\\') || path.to_ascii_lowercase().contains("%5c") {
        return true;
    }
    path.split('/').any(|seg| {
        let decoded = seg.to_ascii_lowercase().replace("%2e", ".");
        decoded == "." || decoded == ".."
    })
}

/// The namespace a request addresses and the path to forward: `/namespaces/<ns>/v1/...` → (`ns`, `/v1/...`);
/// anything else → (`default`, the path as is). The query string is kept.
pub fn namespace_and_path<'a>(path_and_query: &'a str, default: &'a str) -> (&'a str, &'a str) {
    if let Some(rest) = path_and_query.strip_prefix("/namespaces/")
        && let Some(slash) = rest.find('/')
        && slash > 0
    {
        return (&rest[..slash], &rest[slash..]);
    }
    (default, path_and_query)
}

/// Handles every OpenAI `POST /v1/...` and `POST /namespaces/<ns>/v1/...` request.
pub async fn handle(State(app): State<Arc<App>>, req: Request) -> Response {
    let arrived = Instant::now();
    // Admission first: a shed request costs no body read, no parse and no memory.
    let raw_path = req.uri().path();
    if let Some(dev) = dev_endpoint(raw_path) {
        return refuse_dev_endpoint(dev);
    }
    if has_dot_segment(raw_path) {
        let err = RequestError::BadPath(raw_path.to_string());
        return reject(&app, None, err);
    }
    let Some(admitted) = app.router.admission().try_admit() else {
        return reject(&app, None, RequestError::Overloaded(Shed::InFlight));
    };
    let (parts, body) = req.into_parts();
    let (body, budget) = match read_body(&app, &parts.headers, body).await {
        Ok(b) => b,
        Err(e) => return reject(&app, None, e),
    };
    let info = match request_info(&body) {
        Ok(i) => i,
        Err(e) => return reject(&app, None, e),
    };
    let model = info.model.clone();
    let full = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
    let (namespace, path) = namespace_and_path(&full, &app.default_namespace);
    let Some(entry) = app.router.get(namespace, &model) else {
        let models_path = if namespace == app.default_namespace {
            "/v1/models".to_string()
        } else {
            format!("/namespaces/{namespace}/v1/models")
        };
        let err = RequestError::UnknownModel {
            namespace: namespace.to_string(),
            model,
            models_path,
        };
        return reject(&app, None, err);
    };
    let span =
        info_span!("request", namespace = %entry.namespace(), model = %model, path = %parts.uri.path());
    let lane = if parts.extensions.get::<BatchLane>().is_some() {
        Lane::Flex
    } else {
        info.lane
    };
    entry.record_mix(lane, info.stream, info.prompt_bytes);
    if lane == Lane::Flex {
        entry.want_gauges();
    }
    let body = match lane.priority_to_send(info.priority) {
        Some(p) if app.limits.lane_priority => with_priority(body, p),
        _ => body,
    };
    // What a flex request may grow to in a backend's KV cache: the gate counts it with those in flight.
    let footprint = if lane == Lane::Flex {
        tessera_core::lanes::footprint_tokens(info.prompt_bytes.unwrap_or(body.len()), info.max_tokens)
    } else {
        0
    };
    let request = Forward {
        parts,
        path: path.to_string(),
        body,
        budget,
        arrived,
        admitted,
        lane,
        footprint,
    };
    let keepalive = app.limits.keepalive_interval;
    let reply = forward(app, entry, request).instrument(span);
    if info.stream == Some(true) && !keepalive.is_zero() {
        return super::keepalive::respond(reply, keepalive).await;
    }
    reply.await
}

/// Reads the body within `--max-body-size`, `--body-read-timeout` and the shared `--max-buffered-body-bytes`
/// budget; the returned permit holds the body's share of the budget until it is dropped.
async fn read_body(
    app: &App,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Bytes, Option<OwnedSemaphorePermit>), RequestError> {
    let max = app.limits.max_body_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    // A declared length over the limit is refused before a byte of it is read.
    if declared.is_some_and(|n| n > max as u64) {
        return Err(RequestError::TooLarge(max));
    }
    let read = async {
        let capacity = declared.map_or(0, |n| usize::try_from(n).unwrap_or(max).min(max));
        let mut buf = BytesMut::with_capacity(capacity);
        let mut permit: Option<OwnedSemaphorePermit> = None;
        let mut body = body;
        while let Some(frame) = body.frame().await {
            let frame =
                frame.map_err(|e| RequestError::BadRequest(format!("could not read the body: {e}")))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            // Checked per chunk as it arrives: a chunked body without a length is cut off at the limit.
            if buf.len() + data.len() > max {
                return Err(RequestError::TooLarge(max));
            }
            let n = u32::try_from(data.len()).map_err(|_| RequestError::TooLarge(max))?;
            let more = app
                .body_budget
                .clone()
                .try_acquire_many_owned(n)
                .map_err(|_| RequestError::Overloaded(Shed::BodyBytes))?;
            match &mut permit {
                Some(p) => p.merge(more),
                None => permit = Some(more),
            }
            buf.extend_from_slice(&data);
        }
        Ok((buf.freeze(), permit))
    };
    match tokio::time::timeout(app.limits.body_read_timeout, read).await {
        Ok(r) => r,
        Err(_) => Err(RequestError::BodyTimeout(fmt_duration(
            app.limits.body_read_timeout,
        ))),
    }
}

fn fmt_duration(d: Duration) -> String {
    humantime::format_duration(Duration::from_millis(
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
    ))
    .to_string()
}

/// Counts and answers a request the activator refuses; `entry` is `None` for requests not (yet) tied to a known
/// model, which are labelled `unknown` so a client cannot grow the metric's cardinality.
fn reject(app: &App, entry: Option<&ModelEntry>, err: RequestError) -> Response {
    debug!(error = %err, "answering with an error");
    let (namespace, model) = entry.map_or(("unknown", "unknown"), |e| (e.namespace(), e.name()));
    let code = err.status().as_u16();
    app.metrics
        .requests
        .get_or_create(&CodeLabels {
            namespace: namespace.to_string(),
            model: model.to_string(),
            code,
        })
        .inc();
    app.metrics
        .rejected
        .get_or_create(&RejectLabels {
            namespace: namespace.to_string(),
            model: model.to_string(),
            reason: err.label(),
        })
        .inc();
    if let Some(e) = entry {
        e.record_rejection();
    }
    let retry_after = if matches!(
        err,
        RequestError::LaneFull { .. } | RequestError::Overloaded(Shed::LaneHeld)
    ) {
        app.limits.lane_retry_after
    } else {
        app.limits.retry_after
    };
    err.into_response(retry_after)
}

/// One request on its way to a backend.
struct Forward {
    parts: http::request::Parts,
    /// The path to send (namespace prefix removed) with its query.
    path: String,
    body: Bytes,
    /// The body's share of `--max-buffered-body-bytes`, released once the backend has answered.
    budget: Option<OwnedSemaphorePermit>,
    arrived: Instant,
    admitted: Admitted,
    /// The request's lane: a flex request goes only to a backend with room.
    lane: Lane,
    /// A flex request's KV footprint in tokens (`tessera_core::lanes::footprint_tokens`; 0 in other lanes).
    footprint: u64,
}

async fn forward(app: Arc<App>, entry: Arc<ModelEntry>, req: Forward) -> Response {
    let Forward {
        parts,
        path,
        body,
        mut budget,
        arrived,
        admitted,
        lane,
        footprint,
    } = req;
    entry.record_arrival(tessera_runtime::unix_ms(SystemTime::now()));
    let labels = ModelLabels {
        namespace: entry.namespace().to_string(),
        model: entry.name().to_string(),
    };
    let model = entry.name().to_string();
    let deadline = arrived + app.limits.hold_timeout;
    // `slot` is the place in the hold queue while waiting; `held` remembers that the request waited at all, so
    // the hold histogram counts it once even if a refused connection sends it back to the queue.
    let mut slot = None;
    let mut held = false;
    // A flex request waiting for room (the gauge of its wait), outside every queue a real-time request waits in.
    let mut flex_wait = None;
    // The request's place in `--max-in-flight`. A flex request gives it up as soon as it has to wait, for a
    // place of `--lane-max-held` (`lane_place`), and never takes one again: waiting flex requests must not use
    // real time's room (`router::Admission`).
    let mut admitted = Some(admitted);
    let mut lane_place = None;
    loop {
        let picked = if lane == Lane::Flex {
            match entry.pick_flex(&app.limits.lanes, Instant::now(), footprint) {
                Ok(lease) => Some(lease),
                // No backend ready: held for a scale from zero (in the lane's own bound, below).
                Err(None) => None,
                Err(Some(no_room)) => {
                    drop(slot.take());
                    app.metrics.lane_no_room(&labels, no_room.label());
                    let lane_deadline = arrived + app.limits.lane_hold_timeout;
                    if Instant::now() + app.limits.lane_poll_interval > lane_deadline
                        || app.graceful.is_stopping()
                    {
                        app.metrics.lane_rejected(&labels, lane);
                        let why = no_room.to_string();
                        return reject(&app, Some(&entry), RequestError::LaneFull { model, why });
                    }
                    if let Err(shed) =
                        wait_in_lane(&app, &mut admitted, &mut lane_place, &mut budget, body.len())
                    {
                        app.metrics.lane_rejected(&labels, lane);
                        return reject(&app, Some(&entry), shed);
                    }
                    flex_wait.get_or_insert_with(|| entry.flex_wait());
                    tokio::time::sleep(app.limits.lane_poll_interval).await;
                    continue;
                }
            }
        } else {
            entry.pick()
        };
        if let Some(lease) = picked {
            drop(slot.take());
            drop(flex_wait.take());
            drop(lane_place.take());
            if lane == Lane::Flex {
                // Sent, a flex request is bounded by the gate's per-backend bounds, not by real time's.
                drop(admitted.take());
            }
            app.metrics.lane_admitted(&labels, lane);
            let in_flight = entry.start_in_flight();
            let sent = tokio::time::timeout(
                app.limits.response_header_timeout,
                send(&app.client, &parts, &path, body.clone(), &lease),
            )
            .await;
            match sent {
                Ok(Ok(resp)) => {
                    if held {
                        observe_hold(&app, &labels, arrived);
                    }
                    count_response(&app, &labels, resp.status().as_u16());
                    // The backend has the body: its buffer and its share of the budget go now.
                    drop(budget);
                    return stream_back(resp, lease, in_flight, admitted, app.limits.stream_idle_timeout);
                }
                Ok(Err(SendError::Connect(e))) => {
                    // Nothing reached the backend, so trying again is not a second delivery.
                    warn!(backend = %lease.backend().base, error = %e, "backend refused the connection; rerouting");
                    app.discovery.connect_failed(&entry, &lease.backend().base);
                    continue;
                }
                Ok(Err(SendError::Other(error))) => {
                    return reject(&app, Some(&entry), RequestError::Upstream { model, error });
                }
                Err(_) => {
                    let waited = fmt_duration(app.limits.response_header_timeout);
                    return reject(
                        &app,
                        Some(&entry),
                        RequestError::UpstreamTimeout { model, waited },
                    );
                }
            }
        }
        if app.graceful.is_stopping() {
            return reject(&app, Some(&entry), RequestError::ShuttingDown(model));
        }
        if slot.is_none() {
            let enqueued = if lane == Lane::Flex {
                match wait_in_lane(&app, &mut admitted, &mut lane_place, &mut budget, body.len()) {
                    Ok(place) => Ok(entry.hold_flex(place)),
                    Err(shed) => {
                        app.metrics.lane_rejected(&labels, lane);
                        return reject(&app, Some(&entry), shed);
                    }
                }
            } else {
                // try_enqueue also wakes discovery (probe now).
                entry.try_enqueue()
            };
            match enqueued {
                Ok(s) => {
                    slot = Some(s);
                    held = true;
                    // The first held request asks a sleeping replica to wake now, not at the next probe or sync.
                    app.discovery.wake(&entry);
                }
                Err(HoldRefused::ModelQueueFull) => {
                    return reject(&app, Some(&entry), RequestError::QueueFull(model));
                }
                Err(HoldRefused::GatewayFull) => {
                    return reject(&app, Some(&entry), RequestError::Overloaded(Shed::Held));
                }
            }
        } else {
            // Woken, but the backend left again before this request could take it: ask discovery once more.
            entry.demand().notify_one();
            app.discovery.wake(&entry);
        }
        let ready = tokio::select! {
            ready = entry.wait_ready(deadline) => ready,
            // The drain is over: answer now rather than be cut off when the process exits.
            () = app.graceful.stopping() => {
                if entry.ready_count() == 0 {
                    return reject(&app, Some(&entry), RequestError::ShuttingDown(model));
                }
                true
            }
        };
        if !ready {
            let waited = fmt_duration(arrived.elapsed());
            observe_hold(&app, &labels, arrived);
            return reject(&app, Some(&entry), RequestError::HoldTimeout { model, waited });
        }
    }
}

/// Observes how long a held request waited, from its arrival: once answered, or once given up on.
fn observe_hold(app: &App, labels: &ModelLabels, arrived: Instant) {
    app.metrics
        .hold_seconds
        .get_or_create(labels)
        .observe(arrived.elapsed().as_secs_f64());
}

/// Counts a backend's answer by its status code.
fn count_response(app: &App, labels: &ModelLabels, code: u16) {
    app.metrics
        .requests
        .get_or_create(&CodeLabels {
            namespace: labels.namespace.clone(),
            model: labels.model.clone(),
            code,
        })
        .inc();
}

/// Moves a flex-lane request that has to wait from its `--max-in-flight` place to one of `--lane-max-held`
/// (kept while it waits, however often it looks again); the place, or the 429 when the lane's bound is full.
fn wait_in_lane<'p>(
    app: &App,
    admitted: &mut Option<Admitted>,
    place: &'p mut Option<LaneHeld>,
    budget: &mut Option<OwnedSemaphorePermit>,
    body_len: usize,
) -> Result<&'p LaneHeld, RequestError> {
    if place.is_none() {
        let held = app
            .router
            .admission()
            .try_hold_lane()
            .ok_or(RequestError::Overloaded(Shed::LaneHeld))?;
        // The body moves to the lane's own budget: real time's `--max-buffered-body-bytes` is not waited in.
        let bytes = u32::try_from(body_len).map_err(|_| RequestError::Overloaded(Shed::LaneHeld))?;
        let lane_bytes = if bytes == 0 {
            None
        } else {
            Some(
                app.lane_body_budget
                    .clone()
                    .try_acquire_many_owned(bytes)
                    .map_err(|_| RequestError::Overloaded(Shed::LaneHeld))?,
            )
        };
        *budget = lane_bytes;
        *place = Some(held);
        drop(admitted.take());
    }
    place.as_ref().ok_or(RequestError::Overloaded(Shed::LaneHeld))
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

fn stream_back(
    resp: http::Response<Incoming>,
    lease: Lease,
    in_flight: InFlight,
    admitted: Option<Admitted>,
    idle: Duration,
) -> Response {
    let (mut parts, incoming) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let body = GuardedBody {
        inner: incoming,
        idle,
        stall: Box::pin(tokio::time::sleep(idle)),
        _lease: lease,
        _in_flight: in_flight,
        _admitted: admitted,
    };
    Response::from_parts(parts, Body::new(body))
}

/// The backend's response body, frame by frame (no buffering: each SSE chunk is written as it arrives), holding
/// the backend lease, the model's in-flight count and the gateway admission until it ends or the client goes away. A backend that dies mid-body
/// surfaces as an error frame, which makes the server abort the client's connection instead of ending it cleanly.
///
/// A backend that stops sending mid-body (hung, or a network partition that keeps the connection open) would hold
/// the client, the lease and the admission for ever: after `idle` with no frame, the body ends with an error (the
/// client's connection is aborted, as for a backend that died) and everything it held is released.
struct GuardedBody {
    inner: Incoming,
    idle: Duration,
    stall: Pin<Box<tokio::time::Sleep>>,
    _lease: Lease,
    _in_flight: InFlight,
    /// `None` for a flex-lane request, which holds no place of `--max-in-flight` once sent.
    _admitted: Option<Admitted>,
}

impl hyper::body::Body for GuardedBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                let idle = self.idle;
                self.stall.as_mut().reset(tokio::time::Instant::now() + idle);
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => match self.stall.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(format!(
                    "the backend sent nothing of its response for {} (--upstream-stream-timeout)",
                    fmt_duration(self.idle)
                )
                .into()))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_endpoints_are_named_whatever_the_prefix() {
        assert_eq!(dev_endpoint("/sleep"), Some("/sleep"));
        assert_eq!(dev_endpoint("/namespaces/ml/wake_up?x=1"), Some("/wake_up"));
        assert_eq!(
            dev_endpoint("/v1/load_lora_adapter/"),
            Some("/v1/load_lora_adapter")
        );
        assert_eq!(dev_endpoint("/COLLECTIVE_RPC"), Some("/collective_rpc"));
        assert_eq!(dev_endpoint("/v1/chat/completions"), None);
        assert_eq!(dev_endpoint("/v1/sleep"), None);
    }

    /// Issue 53 N3: the server decodes the path before it routes, so an encoded spelling reaches the same route.
    #[test]
    fn dev_endpoints_are_named_however_the_path_is_encoded() {
        for (path, want) in [
            ("/v1/load%5Flora%5Fadapter", "/v1/load_lora_adapter"),
            ("/v1/%6Coad_lora_adapter", "/v1/load_lora_adapter"),
            ("/v1/unload%5flora%5fadapter", "/v1/unload_lora_adapter"),
            ("/v1%2Fload_lora_adapter", "/v1/load_lora_adapter"),
            ("/namespaces/ml/v1/load%5Flora%5Fadapter", "/v1/load_lora_adapter"),
            (
                "/namespaces%2Fml%2Fv1%2Fload_lora_adapter",
                "/v1/load_lora_adapter",
            ),
            ("//v1//load_lora_adapter", "/v1/load_lora_adapter"),
            (
                "/namespaces/ml//v1/unload_lora_adapter%2F",
                "/v1/unload_lora_adapter",
            ),
            ("/%73leep?level=1", "/sleep"),
            ("/wake%5Fup", "/wake_up"),
            ("/%77%61%6B%65%5F%75%70", "/wake_up"),
        ] {
            assert_eq!(dev_endpoint(path), Some(want), "{path}");
        }
        // Decoded once, as the server does: a doubly encoded name is not the route, and a stray `%` is kept.
        assert_eq!(dev_endpoint("/v1/load%255Flora_adapter"), None);
        assert_eq!(dev_endpoint("/v1/chat%2Fcompletions"), None);
        assert_eq!(dev_endpoint("/v1/chat/completions%"), None);
        assert_eq!(routed_path("/a%zz%4"), "/a%zz%4");
        assert_eq!(routed_path("/a%C3%A9//b"), "/a\u{e9}/b");
    }

    /// The priority the lane decides (`Lane::priority_to_send`, core) is written into the body.
    #[test]
    fn the_flex_lane_sets_its_priority_whatever_the_body_says() {
        let batch = Lane::Flex.vllm_priority().unwrap_or_default();
        let body = with_priority(Bytes::from_static(br#"{"model":"m","priority":-100}"#), batch);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        assert_eq!(v["priority"], batch);
    }

    #[test]
    fn dot_segments_are_refused_plain_or_encoded() {
        for bad in [
            "/v1/../../metrics",
            "/v1/./chat/completions",
            "/namespaces/a/v1/%2e%2e/%2E%2E/metrics",
            "/v1/chat/..",
            "/v1/x\\..\\metrics",
            "/v1/x%5c..%5cmetrics",
        ] {
            assert!(has_dot_segment(bad), "{bad}");
        }
        for good in [
            "/v1/chat/completions",
            "/v1/models/a..b",
            "/v1/completions?x=../y",
            "/v1/.well",
        ] {
            assert!(!has_dot_segment(good), "{good}");
        }
    }

    #[test]
    fn the_namespace_comes_from_the_path_prefix_or_the_default() {
        assert_eq!(
            namespace_and_path("/namespaces/team-a/v1/chat/completions?x=1", "default"),
            ("team-a", "/v1/chat/completions?x=1")
        );
        assert_eq!(
            namespace_and_path("/v1/completions", "default"),
            ("default", "/v1/completions")
        );
        // Malformed prefixes are not a namespace: they fall through to the default (and then 404).
        assert_eq!(
            namespace_and_path("/namespaces//v1/x", "d"),
            ("d", "/namespaces//v1/x")
        );
        assert_eq!(namespace_and_path("/namespaces/a", "d"), ("d", "/namespaces/a"));
    }

    #[test]
    fn shed_answers_are_openai_errors_with_retry_after() {
        let resp = RequestError::Overloaded(Shed::InFlight).into_response(Duration::from_secs(2));
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "2");
        let resp = RequestError::ShuttingDown("m".into()).into_response(Duration::from_millis(10));
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "1");
        let resp = RequestError::BodyTimeout("1s".into()).into_response(Duration::from_secs(2));
        assert_eq!(resp.status(), StatusCode::REQUEST_TIMEOUT);
        assert!(resp.headers().get(header::RETRY_AFTER).is_none());
    }
}
