//! A streaming `multipart/form-data` reader for `POST /v1/files`: parts arrive one at a time and a part's content
//! is handed on chunk by chunk, so a 200 MB upload goes to the store without being held in memory. Only what
//! the Files API needs: each part's `name` and `filename`; part headers are bounded.

use axum::body::{Body, BodyDataStream};
use bytes::{Buf, Bytes, BytesMut};
use futures::StreamExt;

/// The most bytes of one part's headers.
const MAX_HEADERS: usize = 16 * 1024;

/// Why an upload could not be read.
#[derive(Debug, thiserror::Error)]
pub enum MultipartError {
    /// No `boundary` in the `Content-Type`.
    #[error(
        "the request must be multipart/form-data with a boundary (send the file as a form field named \"file\")"
    )]
    NoBoundary,
    /// The body ended inside a part, or is not multipart at all.
    #[error("the multipart body is malformed: {0}")]
    Malformed(&'static str),
    /// The connection failed while reading.
    #[error("could not read the upload: {0}")]
    Read(String),
    /// Nothing arrived for the idle bound (a client that opened an upload and stopped sending).
    #[error("no bytes of the upload arrived for {0:?} (--body-read-timeout); send the file without pausing")]
    Stalled(std::time::Duration),
}

/// One part's headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// The form field's name.
    pub name: String,
    /// The uploaded file's name, for a file part.
    pub filename: Option<String>,
}

/// Reads a multipart body part by part.
#[derive(Debug)]
pub struct Multipart {
    body: BodyDataStream,
    buf: BytesMut,
    /// `\r\n--<boundary>`.
    delim: Vec<u8>,
    started: bool,
    in_part: bool,
    done: bool,
    eof: bool,
    /// Longest wait for the next bytes of the body.
    idle: std::time::Duration,
}

/// The `boundary` parameter of a `multipart/form-data` content type.
pub fn boundary(content_type: &str) -> Option<String> {
    let (mime, params) = content_type.split_once(';')?;
    if !mime.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.split(';').find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| v.trim().trim_matches('"').to_owned())
    })
}

fn param(header: &str, key: &str) -> Option<String> {
    header.split(';').find_map(|p| {
        let (k, v) = p.split_once('=')?;
        (k.trim().eq_ignore_ascii_case(key)).then(|| v.trim().trim_matches('"').to_owned())
    })
}

impl Multipart {
    /// A reader of `body` with parts separated by `boundary`, failing when no bytes arrive for `idle` (a 200 MB
    /// upload may take long; a silent one may not).
    pub fn new(body: Body, boundary: &str, idle: std::time::Duration) -> Multipart {
        // The first delimiter has no CRLF before it; starting the buffer with one lets one search find them all.
        let mut buf = BytesMut::new();
        buf.extend_from_slice(b"\r\n");
        Multipart {
            body: body.into_data_stream(),
            buf,
            delim: format!("\r\n--{boundary}").into_bytes(),
            started: false,
            in_part: false,
            done: false,
            eof: false,
            idle,
        }
    }

    async fn fill(&mut self) -> Result<bool, MultipartError> {
        if self.eof {
            return Ok(false);
        }
        let Ok(next) = tokio::time::timeout(self.idle, self.body.next()).await else {
            return Err(MultipartError::Stalled(self.idle));
        };
        match next {
            Some(Ok(b)) => {
                self.buf.extend_from_slice(&b);
                Ok(true)
            }
            Some(Err(e)) => Err(MultipartError::Read(e.to_string())),
            None => {
                self.eof = true;
                Ok(false)
            }
        }
    }

    fn find(&self, needle: &[u8]) -> Option<usize> {
        memchr::memmem::find(&self.buf, needle)
    }

    /// The next part's headers; `None` after the last part.
    pub async fn next_part(&mut self) -> Result<Option<Part>, MultipartError> {
        while self.in_part {
            self.chunk().await?;
        }
        if self.done {
            return Ok(None);
        }
        if !self.started {
            // Skip the preamble up to and through the first delimiter.
            loop {
                if let Some(at) = self.find(&self.delim.clone()) {
                    self.buf.advance(at + self.delim.len());
                    break;
                }
                let keep = self.delim.len();
                if self.buf.len() > keep {
                    let cut = self.buf.len() - keep;
                    self.buf.advance(cut);
                }
                if !self.fill().await? {
                    return Err(MultipartError::Malformed("no boundary found"));
                }
            }
            self.started = true;
        }
        while self.buf.len() < 2 {
            if !self.fill().await? {
                return Err(MultipartError::Malformed("the body ends after a boundary"));
            }
        }
        if self.buf.starts_with(b"--") {
            self.done = true;
            return Ok(None);
        }
        let headers_end = loop {
            if let Some(at) = self.find(b"\r\n\r\n") {
                break at;
            }
            if self.buf.len() > MAX_HEADERS {
                return Err(MultipartError::Malformed("a part's headers are too long"));
            }
            if !self.fill().await? {
                return Err(MultipartError::Malformed("the body ends inside a part's headers"));
            }
        };
        let headers = self.buf.split_to(headers_end + 4);
        let text = String::from_utf8_lossy(&headers);
        let disposition = text
            .split("\r\n")
            .find(|l| l.to_ascii_lowercase().starts_with("content-disposition:"))
            .ok_or(MultipartError::Malformed("a part has no Content-Disposition"))?;
        let name = param(disposition, "name").ok_or(MultipartError::Malformed("a part has no name"))?;
        self.in_part = true;
        Ok(Some(Part {
            name,
            filename: param(disposition, "filename"),
        }))
    }

    /// The next chunk of the current part's content; `None` at its end.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, MultipartError> {
        if !self.in_part {
            return Ok(None);
        }
        loop {
            if let Some(at) = self.find(&self.delim.clone()) {
                if at > 0 {
                    return Ok(Some(self.buf.split_to(at).freeze()));
                }
                self.buf.advance(self.delim.len());
                self.in_part = false;
                return Ok(None);
            }
            // Everything but a possible start of the delimiter can go.
            let keep = self.delim.len() - 1;
            if self.buf.len() > keep + 8 * 1024 {
                let n = self.buf.len() - keep;
                return Ok(Some(self.buf.split_to(n).freeze()));
            }
            if !self.fill().await? {
                if self.buf.len() > keep {
                    let n = self.buf.len() - keep;
                    return Ok(Some(self.buf.split_to(n).freeze()));
                }
                return Err(MultipartError::Malformed("the body ends inside a part"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    async fn parts(body: &'static [u8], chunk: usize) -> Vec<(Part, Vec<u8>)> {
        let chunks: Vec<Result<Bytes, std::io::Error>> =
            body.chunks(chunk).map(|c| Ok(Bytes::from_static(c))).collect();
        let body = Body::from_stream(futures::stream::iter(chunks));
        let mut m = Multipart::new(body, "XyZ", std::time::Duration::from_secs(5));
        let mut out = Vec::new();
        while let Some(p) = m.next_part().await.unwrap() {
            let mut data = Vec::new();
            while let Some(c) = m.chunk().await.unwrap() {
                data.extend_from_slice(&c);
            }
            out.push((p, data));
        }
        out
    }

    proptest::proptest! {
        /// Any file content without the delimiter in it, cut into chunks of any size, reads back byte for byte
        /// (near-delimiters such as "\r\n--Xy" included).
        #[test]
        fn any_content_any_split(
            content in proptest::collection::vec(proptest::sample::select(b"\r\n-XyZab".to_vec()), 0..300),
            chunk in 1usize..40,
        ) {
            proptest::prop_assume!(memchr::memmem::find(&content, b"\r\n--XyZ").is_none());
            let mut body = b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\r\n".to_vec();
            body.extend_from_slice(&content);
            body.extend_from_slice(b"\r\n--XyZ--\r\n");
            let body: &'static [u8] = Box::leak(body.into_boxed_slice());
            let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
            let got = rt.block_on(parts(body, chunk));
            proptest::prop_assert_eq!(got.len(), 1);
            proptest::prop_assert_eq!(&got[0].1, &content);
        }
    }

    #[tokio::test]
    async fn parts_split_anywhere_read_the_same() {
        let body: &'static [u8] = b"preamble\r\n--XyZ\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\nContent-Type: application/octet-stream\r\n\r\n{\"a\":1}\r\n--Xy\n{\"b\":2}\n\r\n--XyZ--\r\n";
        for chunk in [1, 2, 3, 7, 64, 1024] {
            let got = parts(body, chunk).await;
            assert_eq!(got.len(), 2, "chunk {chunk}");
            assert_eq!(got[0].0.name, "purpose");
            assert_eq!(got[0].1, b"batch");
            assert_eq!(got[1].0.filename.as_deref(), Some("in.jsonl"));
            assert_eq!(got[1].1, b"{\"a\":1}\r\n--Xy\n{\"b\":2}\n", "chunk {chunk}");
        }
        assert_eq!(
            boundary("multipart/form-data; boundary=\"abc\""),
            Some("abc".into())
        );
        assert_eq!(boundary("application/json"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn an_upload_that_stops_sending_fails_at_the_idle_bound() {
        let head: Vec<Result<Bytes, std::io::Error>> = vec![Ok(Bytes::from_static(
            b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nsome",
        ))];
        // The client sent the start of a part and then nothing, its connection open.
        let body = Body::from_stream(futures::stream::iter(head).chain(futures::stream::pending()));
        let mut m = Multipart::new(body, "XyZ", std::time::Duration::from_secs(30));
        assert!(m.next_part().await.unwrap().is_some());
        let started = tokio::time::Instant::now();
        let mut got = Vec::new();
        let err = loop {
            match m.chunk().await {
                Ok(Some(c)) => got.extend_from_slice(&c),
                Ok(None) => panic!("the body never ended"),
                Err(e) => break e,
            }
        };
        assert!(matches!(err, MultipartError::Stalled(_)), "{err}");
        assert_eq!(started.elapsed(), std::time::Duration::from_secs(30));
    }
}
