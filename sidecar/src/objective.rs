//! `PUT /v1/objective`: the controller hands a sidecar its InferenceAutoscaler's latency objective.
//!
//! The port is on the pod IP, reachable from every pod of the cluster, so two things hold before an objective
//! moves the share rule:
//! - **who sends it**: `Authorization: Bearer <token>` must be this pod's namespace token
//!   ([`tessera_runtime::token`]: the webhook injects it as `TESSERA_OBJECTIVE_TOKEN`, the controller derives the
//!   same from the chart's key). A sidecar without a token takes no objective at all: its flags stand.
//! - **what it says**: each figure within [`validate`]'s ranges, else 400 naming the field and the range.
//!
//! The body is small and read with a deadline ([`BODY_TIMEOUT`], [`MAX_BODY`]): a caller that sends headers and
//! then trickles, or never finishes, is answered 408 instead of holding the connection.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tessera_core::wire::sidecar::Objective;

use crate::Shared;

/// Longest the body of `PUT /v1/objective` may take to arrive once the headers have.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest body taken (an objective is three numbers, under 100 bytes).
pub const MAX_BODY: usize = 4096;
/// The shortest latency objective taken, seconds: below a millisecond no vLLM step can meet it.
pub const MIN_SLO_SECS: f64 = 0.001;
/// The longest latency objective taken, seconds (an hour: beyond it, no objective is the honest setting).
pub const MAX_SLO_SECS: f64 = 3600.0;

/// This pod's namespace token (`--objective-token`). Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(pub String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

/// Why an objective is refused; the message names the field and the valid range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ObjectiveError {
    /// A seconds figure outside [`MIN_SLO_SECS`, `MAX_SLO_SECS`] (or not a number).
    #[error(
        "{field} = {value} is out of range: a latency objective is between {MIN_SLO_SECS} and {MAX_SLO_SECS} \
         seconds, or absent for none"
    )]
    Seconds {
        /// `ttftSloSecs` or `itlSloSecs`.
        field: &'static str,
        /// What was sent.
        value: f64,
    },
    /// A percentile other than 95 or 99.
    #[error("ttftSloPercentile = {0} is not one the TTFT objective can hold: 95 or 99")]
    Percentile(u32),
}

/// Checks each figure of `o` against its range.
pub fn validate(o: &Objective) -> Result<(), ObjectiveError> {
    for (field, v) in [("ttftSloSecs", o.ttft_slo_secs), ("itlSloSecs", o.itl_slo_secs)] {
        if let Some(value) = v
            && !(value.is_finite() && (MIN_SLO_SECS..=MAX_SLO_SECS).contains(&value))
        {
            return Err(ObjectiveError::Seconds { field, value });
        }
    }
    if tessera_core::scale::SloPercentile::from_number(o.ttft_slo_percentile).is_none() {
        return Err(ObjectiveError::Percentile(o.ttft_slo_percentile));
    }
    Ok(())
}

fn refuse(code: StatusCode, why: impl std::fmt::Display) -> Response {
    (code, format!("{why}\n")).into_response()
}

/// Whether the request carries this sidecar's token; `Err` is the status and reason to answer.
fn authorize(headers: &HeaderMap, expected: Option<&Token>) -> Result<(), (StatusCode, &'static str)> {
    let Some(expected) = expected else {
        return Err((
            StatusCode::FORBIDDEN,
            "this sidecar takes no objective over HTTP: it has no --objective-token (TESSERA_OBJECTIVE_TOKEN, \
             injected by the webhook where the chart's objective key is set); its --ttft-slo/--itl-slo stand",
        ));
    };
    let offered = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match offered {
        Some(t) if tessera_runtime::token::tokens_match(t.trim(), &expected.0) => Ok(()),
        Some(_) => Err((
            StatusCode::UNAUTHORIZED,
            "the bearer token is not this namespace's objective token: only the Tessera controller hands \
             objectives over",
        )),
        None => Err((
            StatusCode::UNAUTHORIZED,
            "missing `Authorization: Bearer <token>`: only the Tessera controller hands objectives over",
        )),
    }
}

/// The handler (204 taken, 400 invalid, 401 wrong or no token, 403 no token configured, 408 slow body, 413 too
/// large). Like the flags it replaces, an objective only moves this replica's recommendation, which the
/// controller reads and bounds.
pub async fn put(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Body) -> Response {
    // Who first: an unauthorized caller's body is never read.
    if let Err((code, why)) = authorize(&headers, shared.objective_token.as_ref()) {
        return refuse(code, why);
    }
    let bytes = match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, MAX_BODY)).await {
        Err(_) => {
            return refuse(
                StatusCode::REQUEST_TIMEOUT,
                format_args!("the body did not arrive within {}s", BODY_TIMEOUT.as_secs()),
            );
        }
        Ok(Err(_)) => {
            return refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                format_args!(
                    "the body is over {MAX_BODY} bytes (or was cut off); an objective is three numbers"
                ),
            );
        }
        Ok(Ok(b)) => b,
    };
    let o: Objective = match serde_json::from_slice(&bytes) {
        Ok(o) => o,
        Err(e) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                format_args!(
                    "the body is not an objective ({e}): {{\"ttftSloSecs\": 2.0, \"ttftSloPercentile\": 95, \
                     \"itlSloSecs\": 0.1}}"
                ),
            );
        }
    };
    if let Err(e) = validate(&o) {
        return refuse(StatusCode::BAD_REQUEST, e);
    }
    let Ok(mut state) = shared.state.lock() else {
        return refuse(StatusCode::INTERNAL_SERVER_ERROR, "state lock poisoned");
    };
    if state.set_objective(&o) {
        tracing::info!(
            ttft_slo_secs = o.ttft_slo_secs,
            ttft_slo_percentile = o.ttft_slo_percentile,
            itl_slo_secs = o.itl_slo_secs,
            "latency objective handed over by the controller (namespace token checked)"
        );
    }
    StatusCode::NO_CONTENT.into_response()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    const TOKEN: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn shared(token: Option<&str>) -> Arc<Shared> {
        Arc::new(Shared {
            state: std::sync::Mutex::new(crate::state::State::new(crate::state::tests::settings())),
            exporter: std::sync::Mutex::new(crate::exporter::Exporter::new()),
            gate: crate::gate::open_gate(),
            rest: Arc::new(crate::rest::Rest::new(false, Vec::new())),
            objective_token: token.map(|t| Token(t.to_owned())),
        })
    }

    async fn put_to(s: &Arc<Shared>, auth: Option<&str>, body: Body) -> (u16, String) {
        let mut req = Request::put("/v1/objective").header("content-type", "application/json");
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let resp = crate::server::router(s.clone())
            .oneshot(req.body(body).unwrap())
            .await
            .unwrap();
        let code = resp.status().as_u16();
        let text = resp.into_body().collect().await.unwrap().to_bytes();
        (code, String::from_utf8_lossy(&text).into_owned())
    }

    fn held(s: &Arc<Shared>) -> Option<f64> {
        s.state
            .lock()
            .unwrap()
            .status(0.0)
            .compute
            .and_then(|c| c.ttft_slo_secs)
    }

    #[tokio::test]
    async fn only_the_namespace_token_sets_an_objective() {
        let s = shared(Some(TOKEN));
        let body = || Body::from(r#"{"ttftSloSecs": 0.5, "ttftSloPercentile": 99}"#);
        let (code, text) = put_to(&s, None, body()).await;
        assert_eq!(code, 401, "{text}");
        assert!(text.contains("Authorization: Bearer"), "{text}");
        let wrong = format!("Bearer {}", TOKEN.replace('0', "1"));
        assert_eq!(put_to(&s, Some(&wrong), body()).await.0, 401);
        assert_eq!(put_to(&s, Some(TOKEN), body()).await.0, 401, "no Bearer scheme");
        assert_eq!(held(&s), None, "nothing taken from a stranger");
        let (code, text) = put_to(&s, Some(&format!("Bearer {TOKEN}")), body()).await;
        assert_eq!(code, 204, "{text}");
        assert_eq!(held(&s), Some(0.5));
    }

    #[tokio::test]
    async fn a_sidecar_without_a_token_takes_no_objective() {
        let s = shared(None);
        let (code, text) = put_to(
            &s,
            Some(&format!("Bearer {TOKEN}")),
            Body::from(r#"{"ttftSloSecs": 1}"#),
        )
        .await;
        assert_eq!(code, 403);
        assert!(text.contains("TESSERA_OBJECTIVE_TOKEN"), "{text}");
        assert_eq!(held(&s), None);
    }

    #[tokio::test]
    async fn out_of_range_figures_are_refused_naming_the_field_and_range() {
        let s = shared(Some(TOKEN));
        let auth = format!("Bearer {TOKEN}");
        for (body, said) in [
            (r#"{"ttftSloSecs": -1}"#, "ttftSloSecs = -1"),
            (r#"{"ttftSloSecs": 0}"#, "ttftSloSecs = 0"),
            (r#"{"ttftSloSecs": 1e-6}"#, "ttftSloSecs = 0.000001"),
            (r#"{"ttftSloSecs": 1e300}"#, "between 0.001 and 3600"),
            (r#"{"itlSloSecs": 0}"#, "itlSloSecs = 0"),
            (
                r#"{"ttftSloSecs": 2, "ttftSloPercentile": 4294967295}"#,
                "95 or 99",
            ),
            (
                r#"{"ttftSloSecs": 2, "ttftSloPercentile": 50}"#,
                "ttftSloPercentile = 50",
            ),
            (r#"{"ttftSloSecs": "2s"}"#, "not an objective"),
        ] {
            let (code, text) = put_to(&s, Some(&auth), Body::from(body)).await;
            assert_eq!(code, 400, "{body}: {text}");
            assert!(text.contains(said), "{body}: {text}");
        }
        assert_eq!(held(&s), None);
        let big = format!(r#"{{"ttftSloSecs": 2{}}}"#, " ".repeat(MAX_BODY));
        assert_eq!(put_to(&s, Some(&auth), Body::from(big)).await.0, 413);
    }

    /// A body that never finishes is answered 408 at [`BODY_TIMEOUT`] rather than held.
    #[tokio::test(start_paused = true)]
    async fn a_body_that_never_finishes_is_answered_at_the_deadline() {
        let s = shared(Some(TOKEN));
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<axum::body::Bytes, std::io::Error>>(1);
        tx.send(Ok(axum::body::Bytes::from_static(b"{\"ttftSl")))
            .await
            .unwrap();
        let body = Body::from_stream(tokio_stream_from(rx));
        let started = tokio::time::Instant::now();
        let (code, text) = put_to(&s, Some(&format!("Bearer {TOKEN}")), body).await;
        assert_eq!(code, 408, "{text}");
        assert_eq!(started.elapsed(), BODY_TIMEOUT);
        drop(tx);
    }

    fn tokio_stream_from<T: Send + 'static>(
        mut rx: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures::Stream<Item = T> + Send {
        futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }
}
