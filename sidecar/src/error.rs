//! The sidecar's typed errors. Each scrape failure has a fixed, low-cardinality reason label, used both on
//! `tessera_scrape_errors_total{reason=…}` and in `/v1/status`.

/// Why one scrape of vLLM's `/metrics` failed.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum ScrapeError {
    /// The server could not be reached (refused, reset, DNS).
    #[error("cannot connect to {url}: {detail}")]
    Connect {
        /// The URL scraped.
        url: String,
        /// The client error with its causes (reqwest's own message alone says only "error sending request").
        detail: String,
    },
    /// No complete answer within `--scrape-timeout`.
    #[error("no answer from {url} within {timeout:?}")]
    Timeout {
        /// The URL scraped.
        url: String,
        /// The timeout that expired.
        timeout: std::time::Duration,
    },
    /// The server answered with a non-2xx status.
    #[error("{url} answered HTTP {status}")]
    HttpStatus {
        /// The URL scraped.
        url: String,
        /// The status.
        status: u16,
    },
    /// The body could not be read, was too large, or was not UTF-8.
    #[error("bad body from {url}: {detail}")]
    Body {
        /// The URL scraped.
        url: String,
        /// What was wrong.
        detail: String,
    },
    /// The body was read but is not a vLLM metrics page.
    #[error("{url} is not a vLLM metrics page: {source}")]
    Parse {
        /// The URL scraped.
        url: String,
        /// The parser's reason.
        source: tessera_core::metrics::MetricsError,
    },
}

impl ScrapeError {
    /// The fixed label for this error (`reason` on `tessera_scrape_errors_total`).
    pub fn label(&self) -> &'static str {
        self.into()
    }
}

/// An error and its chain of causes on one line.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cur = c.source();
    }
    out
}

/// Every label [`ScrapeError::label`] can return, so the counter shows zeros before the first error.
pub const SCRAPE_ERROR_LABELS: [&str; 5] = ["connect", "timeout", "http_status", "body", "parse"];

/// Why the GPU could not be read.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// NVML is not usable here (no driver library, no device, no permission).
    #[error("NVML is not available: {0}")]
    Unavailable(String),
    /// A query failed on an initialised device.
    #[error("NVML query {query} failed: {detail}")]
    Query {
        /// Which query.
        query: &'static str,
        /// NVML's message.
        detail: String,
    },
}

impl GpuError {
    /// Wraps NVML's error for `query`, for `map_err`.
    pub fn query(query: &'static str) -> impl Fn(nvml_wrapper::error::NvmlError) -> GpuError {
        move |e| GpuError::Query {
            query,
            detail: e.to_string(),
        }
    }
}

/// Bad command-line configuration, named so the user can fix it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `--vllm-url` is not an http(s) URL.
    #[error("--vllm-url {0:?} must be an http:// or https:// URL such as http://127.0.0.1:8000")]
    VllmUrl(String),
    /// A duration flag is zero or out of order.
    #[error("{0}")]
    Duration(String),
    /// A flag's value is out of its range (the message names the flag and the range).
    #[error("{0}")]
    Value(String),
    /// A recommendation tunable is out of range.
    #[error(transparent)]
    Recommend(#[from] tessera_core::recommend::ConfigError),
}
