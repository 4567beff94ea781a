//! Keep-alive for streamed requests held while a model has no ready replica (a cold start or a wake).
//!
//! A client or proxy with an idle timeout (many are 30–60 s) drops a connection on which nothing arrives, and a
//! cold start can take longer. A streamed request (`"stream": true`) held longer than `--keepalive-interval`
//! therefore gets its response headers (200, `text/event-stream`) and an SSE comment line
//! ([`COMMENT`], which every SSE parser skips), then one per interval, and then the backend's stream as it comes.
//! If the hold then ends in an error (the hold timeout, a backend failure), the status can no longer change: the
//! stream ends with one `data: {"error": {...}}` event in OpenAI's shape and closes, which the OpenAI clients raise
//! as an API error. A non-streamed request is never sent anything early: its client expects one JSON document.

use std::future::Future;
use std::time::Duration;

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::BodyExt;
use tokio::sync::mpsc;

/// The comment line sent while waiting.
pub const COMMENT: &[u8] = b": tessera: waiting for a replica\n\n";

/// Largest error body turned into the final SSE event.
const MAX_ERROR_BODY: usize = 64 * 1024;

type Chunk = Result<Bytes, std::io::Error>;

/// Answers with `reply`'s response if it is ready within `interval`; otherwise starts an SSE response at once and
/// keeps it alive until `reply` is ready (see the module docs). A client that goes away drops `reply`, which gives
/// up its place in the hold queue.
pub async fn respond<F>(reply: F, interval: Duration) -> Response
where
    F: Future<Output = Response> + Send + 'static,
{
    let mut reply = Box::pin(reply);
    tokio::select! {
        r = &mut reply => return r,
        () = tokio::time::sleep(interval) => {}
    }
    // A few chunks of slack: the relay waits for the client rather than buffering a fast backend's stream.
    let (tx, rx) = mpsc::channel::<Chunk>(16);
    tokio::spawn(async move {
        if tx.send(Ok(Bytes::from_static(COMMENT))).await.is_err() {
            return;
        }
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        let resp = loop {
            tokio::select! {
                r = &mut reply => break r,
                _ = tick.tick() => {
                    if tx.send(Ok(Bytes::from_static(COMMENT))).await.is_err() {
                        return;
                    }
                }
                () = tx.closed() => return,
            }
        };
        relay(resp, tx).await;
    });
    let body = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream; charset=utf-8")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "could not build the keep-alive response");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        })
}

/// Sends the backend's answer down a stream whose headers are already out.
async fn relay(resp: Response, tx: mpsc::Sender<Chunk>) {
    let status = resp.status();
    let mut body = resp.into_body();
    if status.is_success() {
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(f) => {
                    if let Ok(data) = f.into_data()
                        && tx.send(Ok(data)).await.is_err()
                    {
                        return;
                    }
                }
                Err(e) => {
                    // The backend died mid-stream: an error makes the server abort the client's connection, as it
                    // would without the keep-alive.
                    let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
                    return;
                }
            }
        }
        return;
    }
    let bytes = axum::body::to_bytes(body, MAX_ERROR_BODY)
        .await
        .unwrap_or_default();
    let _ = tx.send(Ok(error_event(status, &bytes))).await;
}

/// The final `data:` event for an answer that was an error: its OpenAI `error` object as is, or one made from
/// the status and the text.
pub fn error_event(status: StatusCode, body: &[u8]) -> Bytes {
    let parsed: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let error = match parsed {
        Some(v) if v.get("error").is_some_and(serde_json::Value::is_object) => v,
        _ => serde_json::json!({ "error": {
            "message": String::from_utf8_lossy(body).chars().take(1000).collect::<String>(),
            "type": "server_error", "param": null, "code": status.as_u16() } }),
    };
    Bytes::from(format!("data: {error}\n\n"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    async fn collect(r: Response) -> (StatusCode, String) {
        let status = r.status();
        let b = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
        (status, String::from_utf8(b.to_vec()).unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn a_quick_answer_goes_as_is_and_a_slow_one_is_kept_alive() {
        let quick = respond(
            async { (StatusCode::CREATED, "x").into_response() },
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(collect(quick).await, (StatusCode::CREATED, "x".into()));

        let slow = async {
            tokio::time::sleep(Duration::from_secs(12)).await;
            (StatusCode::OK, "data: [DONE]\n\n").into_response()
        };
        let (status, text) = collect(respond(slow, Duration::from_secs(5)).await).await;
        assert_eq!(status, StatusCode::OK);
        let comment = String::from_utf8(COMMENT.to_vec()).unwrap();
        assert_eq!(
            text,
            format!("{comment}{comment}data: [DONE]\n\n"),
            "at 5 s and 10 s, then the stream"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_error_after_the_headers_ends_the_stream_with_an_error_event() {
        let failing = async {
            tokio::time::sleep(Duration::from_secs(7)).await;
            let body = r#"{"error":{"message":"no replica","type":"server_error","param":null,"code":"hold_timeout"}}"#;
            (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
        };
        let (status, text) = collect(respond(failing, Duration::from_secs(5)).await).await;
        assert_eq!(status, StatusCode::OK);
        assert!(text.ends_with("data: {\"error\":{\"code\":\"hold_timeout\",\"message\":\"no replica\",\"param\":null,\"type\":\"server_error\"}}\n\n"), "{text}");
        let plain = error_event(StatusCode::BAD_GATEWAY, b"boom");
        assert!(
            String::from_utf8(plain.to_vec())
                .unwrap()
                .contains("\"code\":502")
        );
    }
}
