//! The HTTP side: HTTPS for the API server (`POST /mutate`, `/live`, `/ready`), plain HTTP for Prometheus
//! (`/metrics`, `/live`, `/ready`), and the certificate reloader.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum_server::tls_rustls::RustlsConfig;
use kube::core::DynamicObject;
use kube::core::admission::AdmissionReview;
use prometheus_client::registry::Registry;
use serde::Serialize;
use tracing::{info, warn};

use crate::admit::{Admitter, Metrics};

/// The largest admission body accepted: the API server caps objects at ~1.5 MiB, an AdmissionReview carries
/// the object (and, on updates, the old one).
pub const MAX_BODY: usize = 4 << 20;

/// Shared by the routes.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The handler.
    pub admitter: Admitter,
    /// Cleared on shutdown so the API server stops sending admissions here.
    pub serving: Arc<AtomicBool>,
    /// The metrics registry.
    pub registry: Arc<Registry>,
    /// Longest an admission body may take to arrive once its headers have (`--body-read-timeout`).
    pub body_read_timeout: Duration,
}

impl AppState {
    fn ready(&self) -> bool {
        self.serving.load(Ordering::Acquire) && self.admitter.ready()
    }
}

async fn mutate_route(State(s): State<AppState>, req: Request) -> Response {
    // The header timeout ends when the headers are in; without a bound here a client that sends them and then no
    // body (or a trickle) holds the connection and its buffers for as long as it likes (issue 53 M2: 1,000 such
    // connections held 32 MB for 90 s and more). The API server sends the whole review at once.
    let body = match tokio::time::timeout(s.body_read_timeout, Bytes::from_request(req, &s)).await {
        Ok(Ok(body)) => body,
        Ok(Err(rejection)) => return rejection.into_response(),
        Err(_) => return body_timeout(s.body_read_timeout),
    };
    match s.admitter.admit(&body).await {
        Ok(review) => match encode_review(&review) {
            Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
            Err(e) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot encode the response: {e}\n"),
            )
                .into_response(),
        },
        Err(e) => (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    }
}

/// The 408 for a body that did not arrive in time; the connection is closed after it (the rest of the body may
/// still be on its way, and nothing else can be read from it).
fn body_timeout(limit: Duration) -> Response {
    (
        StatusCode::REQUEST_TIMEOUT,
        [(header::CONNECTION, "close")],
        format!(
            "the AdmissionReview body did not arrive within {} of its headers (--body-read-timeout)\n",
            humantime::format_duration(limit)
        ),
    )
        .into_response()
}

/// The answer as the API server reads it, with the patch as a base64 string: Go's `[]byte`, which is how
/// `admission.k8s.io/v1` declares `response.patch` and how the Kubernetes documentation shows it. (kube's own
/// `Serialize` writes the bytes as a JSON array of numbers, which Go also accepts, at about three times the size
/// and a serializer call per byte.)
pub fn encode_review(review: &AdmissionReview<DynamicObject>) -> serde_json::Result<Vec<u8>> {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Review<'a> {
        api_version: &'a str,
        kind: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        response: Option<Answer<'a>>,
    }
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Answer<'a> {
        uid: &'a str,
        allowed: bool,
        status: &'a kube::core::Status,
        #[serde(skip_serializing_if = "Option::is_none")]
        patch: Option<Base64<'a>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        patch_type: Option<&'static str>,
        #[serde(skip_serializing_if = "HashMap::is_empty")]
        audit_annotations: &'a HashMap<String, String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        warnings: Option<&'a Vec<String>>,
    }
    let answer = review.response.as_ref().map(|r| Answer {
        uid: &r.uid,
        allowed: r.allowed,
        status: &r.result,
        patch: r.patch.as_deref().map(Base64),
        // kube sets the type with the patch (`with_patch`), and JSON Patch is the only type there is.
        patch_type: r.patch.as_ref().map(|_| "JSONPatch"),
        audit_annotations: &r.audit_annotations,
        warnings: r.warnings.as_ref(),
    });
    // Sized once for the whole answer: base64 of the patch plus the envelope (growing by doubling would copy it).
    let patch_len = review
        .response
        .as_ref()
        .and_then(|r| r.patch.as_ref())
        .map_or(0, Vec::len);
    let mut out = Vec::with_capacity(patch_len.div_ceil(3) * 4 + 512);
    serde_json::to_writer(
        &mut out,
        &Review {
            api_version: &review.types.api_version,
            kind: &review.types.kind,
            response: answer,
        },
    )?;
    Ok(out)
}

/// Bytes written as standard base64 (RFC 4648, padded) straight into the serializer, through the `base64`
/// crate's `Display` (no intermediate string).
struct Base64<'a>(&'a [u8]);

impl std::fmt::Display for Base64<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        base64::display::Base64Display::new(self.0, &base64::engine::general_purpose::STANDARD).fmt(f)
    }
}

impl Serialize for Base64<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

async fn ready_route(State(s): State<AppState>) -> Response {
    if s.ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "caches not synced or shutting down\n",
        )
            .into_response()
    }
}

async fn metrics_route(State(s): State<AppState>) -> Response {
    let mut out = String::new();
    match prometheus_client::encoding::text::encode(&mut out, &s.registry) {
        Ok(()) => tessera_runtime::serve::openmetrics(out),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics\n").into_response(),
    }
}

/// The HTTPS router.
pub fn webhook_router(state: AppState) -> Router {
    Router::new()
        .route("/mutate", post(mutate_route))
        .route("/live", get(|| async { "ok\n" }))
        .route("/ready", get(ready_route))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

/// The plain-HTTP router for Prometheus and probes.
pub fn metrics_router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(metrics_route))
        .route("/live", get(|| async { "ok\n" }))
        .route("/ready", get(ready_route))
        .with_state(state)
}

/// Reads the certificate and key files.
pub fn read_pair(cert: &PathBuf, key: &PathBuf) -> std::io::Result<(Vec<u8>, Vec<u8>)> {
    Ok((std::fs::read(cert)?, std::fs::read(key)?))
}

/// Every `interval`, re-reads the certificate and key; when either changed, loads them into `tls`. New
/// connections get the new certificate; open ones keep theirs (nothing is dropped). A pair that does not load
/// (a half-written rotation) keeps the old one and is retried at the next tick.
pub async fn reload_certificates(
    tls: RustlsConfig,
    cert: PathBuf,
    key: PathBuf,
    mut loaded: (Vec<u8>, Vec<u8>),
    interval: Duration,
    metrics: Metrics,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let pair = match read_pair(&cert, &key) {
            Ok(p) => p,
            Err(e) => {
                warn!(error = %e, "cannot read the TLS certificate or key; keeping the loaded pair");
                continue;
            }
        };
        if pair == loaded {
            continue;
        }
        match tls.reload_from_pem(pair.0.clone(), pair.1.clone()).await {
            Ok(()) => {
                info!(cert = %cert.display(), "TLS certificate reloaded");
                metrics.tls_reload("ok");
                loaded = pair;
            }
            Err(e) => {
                // Remember the broken pair so it is reported once; the next change to either file retries.
                warn!(error = %e, "the new TLS certificate or key does not load; keeping the old pair");
                metrics.tls_reload("error");
                loaded = pair;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use kube::core::admission::AdmissionResponse;

    #[test]
    fn base64_is_rfc_4648() {
        // The test vectors of RFC 4648, section 10.
        for (raw, b64) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(Base64(raw.as_bytes()).to_string(), b64);
        }
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(
            &Base64(&all).to_string()[..24],
            "AAECAwQFBgcICQoLDA0ODxAR",
            "every 6-bit group maps through the alphabet"
        );
        assert!(Base64(&all).to_string().ends_with("/P3+/w=="));
    }

    #[test]
    fn the_answer_carries_the_patch_as_base64_and_everything_else_as_kube_writes_it() {
        let patch: json_patch::Patch = serde_json::from_value(
            serde_json::json!([{"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}]),
        )
        .unwrap();
        let mut r = AdmissionResponse::invalid("x");
        r.uid = "u-1".into();
        r.allowed = true;
        let mut r = r.with_patch(patch).unwrap();
        r.audit_annotations.insert("mode".into(), "whole".into());
        r.warnings = Some(vec!["w".into()]);
        let review = r.clone().into_review();
        let ours: serde_json::Value = serde_json::from_slice(&encode_review(&review).unwrap()).unwrap();
        let mut kubes = serde_json::to_value(&review).unwrap();
        assert_eq!(
            ours["response"]["patch"],
            Base64(r.patch.as_ref().unwrap()).to_string()
        );
        // Apart from the patch's encoding, the same document kube would write.
        kubes["response"]["patch"] = ours["response"]["patch"].clone();
        assert_eq!(ours, kubes);
        // No patch, no patch fields.
        let plain = AdmissionResponse::invalid("bad").into_review();
        let ours: serde_json::Value = serde_json::from_slice(&encode_review(&plain).unwrap()).unwrap();
        assert_eq!(ours, serde_json::to_value(&plain).unwrap());
    }
}
