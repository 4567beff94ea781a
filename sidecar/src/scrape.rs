//! Fetching and parsing vLLM's `/metrics`: one GET with a timeout and a body-size limit, then the core parser.

use crate::error::ScrapeError;
use std::time::Duration;
use tessera_core::metrics::VllmSnapshot;

/// Largest page accepted. A real vLLM page is 10–100 KB; this bounds memory if the URL points at something
/// else that streams forever.
pub const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// Scrapes one vLLM server.
#[derive(Debug, Clone)]
pub struct Scraper {
    client: reqwest::Client,
    metrics_url: String,
    timeout: Duration,
}

impl Scraper {
    /// A scraper for `<base_url>/metrics` with a per-scrape `timeout` (connect, headers and body together).
    pub fn new(base_url: &str, timeout: Duration) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            // One idle connection is all a once-every-few-seconds scrape needs.
            .pool_max_idle_per_host(1)
            .build()?;
        let metrics_url = format!("{}/metrics", base_url.trim_end_matches('/'));
        Ok(Self {
            client,
            metrics_url,
            timeout,
        })
    }

    /// vLLM's `--max-model-len`, from its OpenAI `/v1/models` (each model card carries `max_model_len`); the
    /// largest over the served models, since the KV cache must hold the longest. `None` when the server does not
    /// say (older servers, or not vLLM): the recommendation then just has no one-sequence floor.
    pub async fn max_model_len(&self) -> Option<u64> {
        let url = format!("{}/v1/models", self.metrics_url.trim_end_matches("/metrics"));
        let resp = self.client.get(&url).send().await.ok()?.error_for_status().ok()?;
        // A model list is a few KiB; bounded like every document read from another process (runtime::body).
        let body = tessera_runtime::body::read_capped(resp, 1024 * 1024).await.ok()?;
        let body: serde_json::Value = serde_json::from_slice(&body).ok()?;
        max_model_len_of(&body)
    }

    /// The URL scraped.
    pub fn url(&self) -> &str {
        &self.metrics_url
    }

    /// Fetches and parses the page once.
    #[tracing::instrument(level = "debug", skip(self), fields(url = %self.metrics_url))]
    pub async fn scrape(&self) -> Result<VllmSnapshot, ScrapeError> {
        let body = self.fetch().await?;
        VllmSnapshot::from_text(&body).map_err(|source| ScrapeError::Parse {
            url: self.metrics_url.clone(),
            source,
        })
    }

    async fn fetch(&self) -> Result<String, ScrapeError> {
        let url = &self.metrics_url;
        let classify = |e: reqwest::Error| {
            if e.is_timeout() {
                ScrapeError::Timeout {
                    url: url.clone(),
                    timeout: self.timeout,
                }
            } else if e.is_connect() || e.is_request() {
                ScrapeError::Connect {
                    url: url.clone(),
                    detail: crate::error::chain(&e),
                }
            } else {
                ScrapeError::Body {
                    url: url.clone(),
                    detail: crate::error::chain(&e),
                }
            }
        };
        let mut resp = self
            .client
            .get(url)
            .header("accept", "text/plain")
            .send()
            .await
            .map_err(classify)?;
        if !resp.status().is_success() {
            return Err(ScrapeError::HttpStatus {
                url: url.clone(),
                status: resp.status().as_u16(),
            });
        }
        if let Some(len) = resp.content_length()
            && len > MAX_BODY_BYTES as u64
        {
            return Err(ScrapeError::Body {
                url: url.clone(),
                detail: format!("{len} bytes, over {MAX_BODY_BYTES}"),
            });
        }
        let mut body = Vec::with_capacity(resp.content_length().unwrap_or(64 * 1024).min(1 << 20) as usize);
        while let Some(chunk) = resp.chunk().await.map_err(classify)? {
            if body.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(ScrapeError::Body {
                    url: url.clone(),
                    detail: format!("over {MAX_BODY_BYTES} bytes"),
                });
            }
            body.extend_from_slice(&chunk);
        }
        String::from_utf8(body).map_err(|e| ScrapeError::Body {
            url: url.clone(),
            detail: format!("not UTF-8: {e}"),
        })
    }
}

/// The largest `data[].max_model_len` of an OpenAI `/v1/models` answer.
pub fn max_model_len_of(body: &serde_json::Value) -> Option<u64> {
    body.get("data")?
        .as_array()?
        .iter()
        .filter_map(|m| m.get("max_model_len")?.as_u64())
        .filter(|n| *n > 0)
        .max()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn max_model_len_from_models_list() {
        let body = serde_json::json!({"object": "list", "data": [
            {"id": "base", "object": "model", "max_model_len": 8192},
            {"id": "lora-a", "object": "model", "max_model_len": null},
            {"id": "long", "object": "model", "max_model_len": 32768}
        ]});
        assert_eq!(max_model_len_of(&body), Some(32768));
        assert_eq!(
            max_model_len_of(&serde_json::json!({"data": [{"id": "x"}]})),
            None
        );
        assert_eq!(max_model_len_of(&serde_json::json!({"error": "nope"})), None);
    }
}
