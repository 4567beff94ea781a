//! A deadline on each gRPC request's body: KEDA sends its whole (small) request message at once, so a client
//! that sends headers and then trickles, or never finishes, the message is cut off at the deadline instead of
//! holding a stream, and its memory, for as long as it likes (issue 53, N9). The response side (a push stream
//! that stays open) is not bounded here: that is `--keda-stream-max-age`.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use hyper::body::{Frame, SizeHint};

/// Why a request body was cut off.
#[derive(Debug, thiserror::Error)]
#[error("the request message did not arrive within {0:?} (--keda-request-timeout)")]
pub struct BodyTimedOut(pub Duration);

/// `inner`, failing once `limit` has passed before its last frame.
#[derive(Debug)]
pub struct DeadlineBody {
    inner: Body,
    limit: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
    done: bool,
}

impl DeadlineBody {
    /// Starts the clock now.
    pub fn new(inner: Body, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            sleep: Box::pin(tokio::time::sleep(limit)),
            done: false,
        }
    }
}

impl HttpBody for DeadlineBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        if !this.done {
            if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
                if frame.is_none() {
                    this.done = true;
                }
                return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
            }
            if this.sleep.as_mut().poll(cx).is_ready() {
                this.done = true;
                return Poll::Ready(Some(Err(Box::new(BodyTimedOut(this.limit)))));
            }
            return Poll::Pending;
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Wraps every request's body in a [`DeadlineBody`] of `limit` (an axum `map_request` step).
pub fn bound(
    limit: Duration,
) -> impl Fn(axum::extract::Request) -> std::future::Ready<axum::extract::Request> + Clone {
    move |req: axum::extract::Request| std::future::ready(req.map(|b| Body::new(DeadlineBody::new(b, limit))))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test(start_paused = true)]
    async fn a_body_that_never_finishes_fails_at_the_deadline() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        tx.send(Ok(Bytes::from_static(b"\0\0\0\0\x10half")))
            .await
            .unwrap();
        let stream = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) });
        let body = DeadlineBody::new(Body::from_stream(stream), Duration::from_secs(10));
        let started = tokio::time::Instant::now();
        let e = body.collect().await.err().unwrap();
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        assert!(e.to_string().contains("--keda-request-timeout"), "{e}");
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn a_whole_body_is_passed_on() {
        let body = DeadlineBody::new(Body::from("message"), Duration::from_secs(10));
        assert_eq!(body.collect().await.unwrap().to_bytes(), "message");
    }
}
