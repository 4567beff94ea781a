//! Reading a document that another pod serves without trusting its size.
//!
//! The controller reads every ready model pod's `/v1/status` on the port that pod names, every activator's
//! stats and every gpu-agent's `/v1/gpus`. A tenant controls its own pod, so it controls those answers: a
//! 300 MB document buffered whole took the autoscaler past its 512 MiB limit, and since the new leader reads
//! the same pod, both replicas crash-looped and nothing scaled for anyone. Every such read goes through
//! [`read_capped`]: a declared `Content-Length` over the limit is refused before a byte is read, and a body
//! that grows past it while streaming is dropped at the limit. The caller counts the refusal (each role's
//! `*_scrape_failures_total{reason="too_large"}`) and treats the document as missing, which never scales a
//! model down.

/// Why a capped body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// The body is (or declared itself) larger than the limit.
    #[error("the body is larger than the {limit}-byte limit{}", declared.map(|d| format!(" (Content-Length {d})")).unwrap_or_default())]
    TooLarge {
        /// The limit that was applied.
        limit: usize,
        /// The length the server declared, when it declared one.
        declared: Option<u64>,
    },
    /// The connection failed or timed out while reading.
    #[error(transparent)]
    Transport(#[from] reqwest::Error),
}

/// Reads `resp`'s body into memory, refusing anything over `limit` bytes: at most `limit` bytes plus one
/// chunk are ever held.
pub async fn read_capped(mut resp: reqwest::Response, limit: usize) -> Result<Vec<u8>, BodyError> {
    let declared = resp.content_length();
    if let Some(len) = declared
        && len > limit as u64
    {
        return Err(BodyError::TooLarge { limit, declared });
    }
    // Reserve what was declared (already known to be within the limit), or a small start otherwise.
    let start = declared.unwrap_or(16 * 1024).min(limit as u64);
    let mut body = Vec::with_capacity(usize::try_from(start).unwrap_or(0));
    while let Some(chunk) = resp.chunk().await? {
        if body.len() + chunk.len() > limit {
            return Err(BodyError::TooLarge { limit, declared });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Serves one connection with `head` then `len` bytes of `x` (streamed), and returns the URL.
    async fn serve(head: String, len: usize) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            let _ = s.write_all(head.as_bytes()).await;
            let chunk = vec![b'x'; 64 * 1024];
            let mut left = len;
            while left > 0 {
                let n = left.min(chunk.len());
                if s.write_all(&chunk[..n]).await.is_err() {
                    return;
                }
                left -= n;
            }
        });
        format!("http://{addr}/")
    }

    #[tokio::test]
    async fn a_declared_length_over_the_limit_is_refused_before_reading() {
        let url = serve(
            "HTTP/1.1 200 OK\r\ncontent-length: 300000000\r\n\r\n".into(),
            1024,
        )
        .await;
        let resp = reqwest::get(url).await.expect("get");
        let err = read_capped(resp, 1 << 20).await.expect_err("refused");
        assert!(
            matches!(
                err,
                BodyError::TooLarge {
                    limit: 1048576,
                    declared: Some(300_000_000)
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("1048576-byte limit"), "{err}");
    }

    #[tokio::test]
    async fn an_undeclared_body_is_cut_at_the_limit() {
        // No Content-Length: the body runs until the connection closes. 4 MiB sent, 1 MiB allowed.
        let url = serve("HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n".into(), 4 << 20).await;
        let resp = reqwest::get(url).await.expect("get");
        let err = read_capped(resp, 1 << 20).await.expect_err("refused");
        assert!(matches!(err, BodyError::TooLarge { declared: None, .. }), "{err}");
    }

    #[tokio::test]
    async fn a_body_within_the_limit_is_read_whole() {
        let url = serve("HTTP/1.1 200 OK\r\ncontent-length: 70000\r\n\r\n".into(), 70_000).await;
        let resp = reqwest::get(url).await.expect("get");
        let body = read_capped(resp, 70_000).await.expect("read");
        assert_eq!(body.len(), 70_000);
    }
}
