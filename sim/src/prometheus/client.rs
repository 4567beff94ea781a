//! A small client for Prometheus's HTTP API: `query` (instant vectors) and `query_range` (matrices).
//!
//! Bounded everywhere: every request has a deadline, every body a size cap (checked while it streams), and a
//! range is asked for in chunks of at most [`MAX_POINTS_PER_QUERY`] steps, under Prometheus's own 11,000-point limit
//! per series. The answers are plain [`Series`]; nothing here knows about vLLM.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::error::PromError;

/// Steps per `query_range` call: Prometheus refuses more than 11,000 points per series.
pub const MAX_POINTS_PER_QUERY: usize = 10_000;
/// The default cap on one answer's body.
pub const DEFAULT_MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// How to reach the server.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Base URL (`http://prometheus:9090`, or a path prefix such as `https://host/prometheus`).
    pub url: String,
    /// A bearer token file (a service account token, an API key).
    pub bearer_token_file: Option<PathBuf>,
    /// A PEM bundle of CAs to trust beside the system's.
    pub ca_file: Option<PathBuf>,
    /// Deadline for each request, connection included.
    pub timeout: Duration,
    /// Cap on each answer's body.
    pub max_body_bytes: usize,
}

/// One series: its labels and its `(unix seconds, value)` points in time order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Series {
    /// Labels, `__name__` included when Prometheus returns it.
    pub labels: BTreeMap<String, String>,
    /// Points, time-ordered.
    pub points: Vec<(f64, f64)>,
}

impl Series {
    /// A label's value, or "".
    pub fn label(&self, name: &str) -> &str {
        self.labels.get(name).map_or("", String::as_str)
    }
}

/// The client.
#[derive(Debug, Clone)]
pub struct PromClient {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
    timeout: Duration,
    max_body: usize,
}

#[derive(Deserialize)]
struct Envelope {
    status: String,
    #[serde(default)]
    data: Option<Data>,
    #[serde(default, rename = "errorType")]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    warnings: Vec<String>,
}

#[derive(Deserialize)]
struct Data {
    #[serde(rename = "resultType")]
    result_type: String,
    result: Vec<RawSeries>,
}

#[derive(Deserialize)]
struct RawSeries {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    #[serde(default)]
    value: Option<(f64, String)>,
    #[serde(default)]
    values: Vec<(f64, String)>,
}

fn parse_value(v: &str) -> f64 {
    // Prometheus writes NaN, +Inf and -Inf as such; Rust's parser reads those spellings.
    v.parse::<f64>().unwrap_or(f64::NAN)
}

impl PromClient {
    /// A client for `cfg`: reads the token and the CA bundle now, so a bad file fails before any query.
    pub fn new(cfg: &ClientConfig) -> Result<PromClient, PromError> {
        let base = cfg.url.trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(PromError::Config(format!(
                "--prometheus {base:?} must be an http:// or https:// URL (e.g. http://prometheus.monitoring:9090)"
            )));
        }
        // reqwest is built without a crypto provider of its own: the ring provider the other roles use.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = reqwest::Client::builder()
            .timeout(cfg.timeout)
            .connect_timeout(cfg.timeout.min(Duration::from_secs(10)));
        if let Some(path) = &cfg.ca_file {
            let pem = std::fs::read(path).map_err(|source| PromError::File {
                what: "--ca-file",
                path: path.clone(),
                source,
            })?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                PromError::Config(format!(
                    "--ca-file {}: not a PEM certificate bundle: {e}",
                    path.display()
                ))
            })?;
            if certs.is_empty() {
                return Err(PromError::Config(format!(
                    "--ca-file {}: holds no PEM certificate",
                    path.display()
                )));
            }
            builder = builder.tls_certs_merge(certs);
        }
        let token = match &cfg.bearer_token_file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|source| PromError::File {
                        what: "--bearer-token-file",
                        path: path.clone(),
                        source,
                    })?
                    .trim()
                    .to_string(),
            ),
            None => None,
        };
        let http = builder
            .build()
            .map_err(|e| PromError::Config(format!("cannot build the HTTP client: {e}")))?;
        Ok(PromClient {
            http,
            base,
            token,
            timeout: cfg.timeout,
            max_body: cfg.max_body_bytes,
        })
    }

    /// The base URL.
    pub fn url(&self) -> &str {
        &self.base
    }

    async fn get(&self, path: &str, params: &[(&str, String)], query: &str) -> Result<Data, PromError> {
        let mut url = reqwest::Url::parse(&format!("{}{path}", self.base))
            .map_err(|e| PromError::Config(format!("--prometheus {}: {e}", self.base)))?;
        url.query_pairs_mut()
            .extend_pairs(params.iter().map(|(k, v)| (*k, v.as_str())));
        let mut req = self.http.get(url);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let transport = |e: reqwest::Error| {
            if e.is_timeout() {
                PromError::Timeout {
                    url: self.base.clone(),
                    after: self.timeout,
                    query: query.to_string(),
                }
            } else {
                PromError::Unreachable {
                    url: self.base.clone(),
                    reason: error_chain(&e),
                }
            }
        };
        let resp = req.send().await.map_err(transport)?;
        let status = resp.status();
        let body = tessera_runtime::body::read_capped(resp, self.max_body)
            .await
            .map_err(|e| match e {
                tessera_runtime::body::BodyError::TooLarge { limit, .. } => PromError::TooLarge {
                    query: query.to_string(),
                    limit,
                },
                tessera_runtime::body::BodyError::Transport(e) => transport(e),
            })?;
        // Prometheus answers its own errors (400 bad_data, 422 execution, 503 timeout) as JSON: read those first.
        let env: Result<Envelope, _> = serde_json::from_slice(&body);
        match env {
            Ok(env) if env.status == "error" => Err(PromError::Api {
                query: query.to_string(),
                error_type: env.error_type.unwrap_or_default(),
                error: env.error.unwrap_or_default(),
            }),
            Ok(env) if status.is_success() && env.status == "success" => {
                if !env.warnings.is_empty() {
                    return Err(PromError::Warnings {
                        query: query.to_string(),
                        warnings: env.warnings.join("; "),
                    });
                }
                env.data.ok_or_else(|| PromError::BadResponse {
                    query: query.to_string(),
                    reason: "no data".into(),
                })
            }
            _ if !status.is_success() => {
                let text = String::from_utf8_lossy(&body[..body.len().min(300)])
                    .trim()
                    .to_string();
                Err(PromError::Http {
                    url: self.base.clone(),
                    status: status.as_u16(),
                    query: query.to_string(),
                    body: text,
                    hint: match status.as_u16() {
                        401 | 403 => " — pass --bearer-token-file with a token allowed to query",
                        404 => " — is --prometheus the server's base URL (without /api/v1)?",
                        _ => "",
                    },
                })
            }
            Ok(env) => Err(PromError::BadResponse {
                query: query.to_string(),
                reason: format!("status {:?}", env.status),
            }),
            Err(e) => Err(PromError::BadResponse {
                query: query.to_string(),
                reason: e.to_string(),
            }),
        }
    }

    /// An instant query at `at` (unix seconds): one point per series.
    pub async fn query(&self, q: &str, at: f64) -> Result<Vec<Series>, PromError> {
        let data = self
            .get(
                "/api/v1/query",
                &[("query", q.to_string()), ("time", fmt_ts(at))],
                q,
            )
            .await?;
        if data.result_type != "vector" {
            return Err(PromError::BadResponse {
                query: q.to_string(),
                reason: format!("resultType {} where a vector was expected", data.result_type),
            });
        }
        Ok(data
            .result
            .into_iter()
            .map(|r| Series {
                labels: r.metric,
                points: r
                    .value
                    .map(|(t, v)| vec![(t, parse_value(&v))])
                    .unwrap_or_default(),
            })
            .collect())
    }

    /// A range query over `[start, end]` every `step` seconds, asked in chunks of at most
    /// [`MAX_POINTS_PER_QUERY`] steps and joined per label set.
    pub async fn query_range(
        &self,
        q: &str,
        start: f64,
        end: f64,
        step: f64,
    ) -> Result<Vec<Series>, PromError> {
        let mut joined: BTreeMap<BTreeMap<String, String>, Vec<(f64, f64)>> = BTreeMap::new();
        let mut from = start;
        while from <= end {
            let to = (from + step * (MAX_POINTS_PER_QUERY - 1) as f64).min(end);
            let data = self
                .get(
                    "/api/v1/query_range",
                    &[
                        ("query", q.to_string()),
                        ("start", fmt_ts(from)),
                        ("end", fmt_ts(to)),
                        ("step", format!("{step}")),
                    ],
                    q,
                )
                .await?;
            if data.result_type != "matrix" {
                return Err(PromError::BadResponse {
                    query: q.to_string(),
                    reason: format!("resultType {} where a matrix was expected", data.result_type),
                });
            }
            for r in data.result {
                joined
                    .entry(r.metric)
                    .or_default()
                    .extend(r.values.iter().map(|(t, v)| (*t, parse_value(v))));
            }
            from = to + step;
        }
        Ok(joined
            .into_iter()
            .map(|(labels, points)| Series { labels, points })
            .collect())
    }
}

fn fmt_ts(t: f64) -> String {
    format!("{t:.3}")
}

/// The error and its sources on one line ("connection refused" sits a few sources down in reqwest's errors).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let more = c.to_string();
        if !s.contains(&more) {
            s.push_str(": ");
            s.push_str(&more);
        }
        cur = c.source();
    }
    s
}
