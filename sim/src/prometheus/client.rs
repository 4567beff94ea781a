//! A small client for Prometheus's HTTP API: `query` (instant vectors) and `query_range` (matrices).
//!
//! Bounded everywhere: every request has a deadline, every body a size cap (checked while it streams), and a
//! range is asked for in chunks of at most [`MAX_POINTS_PER_QUERY`] steps, under Prometheus's own 11,000-point limit
//! per series. The answers are plain [`Series`]; nothing here knows about vLLM.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::error::{PromError, body_preview, printable};

/// Steps per `query_range` call: Prometheus refuses more than 11,000 points per series.
pub const MAX_POINTS_PER_QUERY: usize = 10_000;
/// The default cap on one answer's body.
pub const DEFAULT_MAX_BODY_BYTES: usize = 64 * 1024 * 1024;
/// The default cap on all answers of one run together: the history of a day of a few dozen models at a minute's
/// step is a few MB; a run that reads more is asking for more than a scenario needs (narrow it, or step longer).
pub const DEFAULT_MAX_TOTAL_BYTES: usize = 512 * 1024 * 1024;

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
    /// Cap on every answer's body of the run together (the client's clones share the count).
    pub max_total_bytes: usize,
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

type Https = hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>;

/// The client.
#[derive(Debug, Clone)]
pub struct PromClient {
    http: hyper_util::client::legacy::Client<Https, http_body_util::Empty<bytes::Bytes>>,
    base: String,
    token: Option<String>,
    timeout: Duration,
    max_body: usize,
    /// Bytes of answers read so far by this client and its clones, against `max_total`.
    read_total: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    max_total: usize,
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
    value: Option<Point>,
    #[serde(default)]
    values: Vec<Point>,
}

/// One `[unix seconds, "value"]` pair, its value parsed as it is read: a long answer becomes 16 bytes a point,
/// never a string a point on the way.
#[derive(Debug, Clone, Copy)]
struct Point(f64, f64);

impl<'de> Deserialize<'de> for Point {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Point, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Point;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a [time, \"value\"] pair")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Point, A::Error> {
                use serde::de::Error;
                let t: f64 = seq
                    .next_element()?
                    .ok_or_else(|| A::Error::invalid_length(0, &self))?;
                let v: std::borrow::Cow<'de, str> = seq
                    .next_element()?
                    .ok_or_else(|| A::Error::invalid_length(1, &self))?;
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(Point(t, parse_value(&v)))
            }
        }
        d.deserialize_seq(V)
    }
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
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let builder = hyper_rustls::HttpsConnectorBuilder::new();
        let builder = match &cfg.ca_file {
            // A private CA: trust exactly the bundle given, as `curl --cacert` does.
            Some(path) => {
                use rustls::pki_types::pem::PemObject;
                let pem = std::fs::read(path).map_err(|source| PromError::File {
                    what: "--ca-file",
                    path: path.clone(),
                    source,
                })?;
                let mut roots = rustls::RootCertStore::empty();
                for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
                    let cert = cert.map_err(|e| {
                        PromError::Config(format!(
                            "--ca-file {}: not a PEM certificate bundle: {e}",
                            path.display()
                        ))
                    })?;
                    roots.add(cert).map_err(|e| {
                        PromError::Config(format!(
                            "--ca-file {}: a certificate is unusable: {e}",
                            path.display()
                        ))
                    })?;
                }
                if roots.is_empty() {
                    return Err(PromError::Config(format!(
                        "--ca-file {}: holds no PEM certificate",
                        path.display()
                    )));
                }
                let tls = rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(|e| PromError::Config(format!("TLS: {e}")))?
                    .with_root_certificates(roots)
                    .with_no_client_auth();
                builder.with_tls_config(tls)
            }
            None => builder.with_provider_and_native_roots(provider).map_err(|e| {
                PromError::Config(format!("cannot load the system's certificate authorities: {e}"))
            })?,
        };
        let connector = builder.https_or_http().enable_http1().build();
        let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
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
        Ok(PromClient {
            http,
            base,
            token,
            timeout: cfg.timeout,
            max_body: cfg.max_body_bytes,
            read_total: std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            max_total: cfg.max_total_bytes,
        })
    }

    /// The base URL.
    pub fn url(&self) -> &str {
        &self.base
    }

    async fn get(&self, path: &str, params: &[(&str, String)], query: &str) -> Result<Data, PromError> {
        let timeout = || PromError::Timeout {
            url: self.base.clone(),
            after: self.timeout,
            query: query.to_string(),
        };
        // One deadline for the connection, the headers and the whole body.
        let (status, body) = tokio::time::timeout(self.timeout, self.fetch(path, params, query))
            .await
            .map_err(|_| timeout())??;
        // Prometheus answers its own errors (400 bad_data, 422 execution, 503 timeout) as JSON: read those first.
        let env: Result<Envelope, _> = serde_json::from_slice(&body);
        match env {
            Ok(env) if env.status == "error" => Err(PromError::Api {
                query: query.to_string(),
                error_type: printable(&env.error_type.unwrap_or_default()),
                error: printable(&env.error.unwrap_or_default()),
            }),
            Ok(env) if status.is_success() && env.status == "success" => {
                if !env.warnings.is_empty() {
                    return Err(PromError::Warnings {
                        query: query.to_string(),
                        warnings: printable(&env.warnings.join("; ")),
                    });
                }
                env.data.ok_or_else(|| PromError::BadResponse {
                    query: query.to_string(),
                    reason: "no data".into(),
                })
            }
            _ if !status.is_success() => {
                let text = body_preview(&body);
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

    async fn fetch(
        &self,
        path: &str,
        params: &[(&str, String)],
        query: &str,
    ) -> Result<(http::StatusCode, bytes::Bytes), PromError> {
        use http_body_util::BodyExt;
        let encoded: String = params
            .iter()
            .map(|(k, v)| format!("{k}={}", percent_encode(v)))
            .collect::<Vec<_>>()
            .join("&");
        let uri: http::Uri = format!("{}{path}?{encoded}", self.base)
            .parse()
            .map_err(|e| PromError::Config(format!("--prometheus {}: {e}", self.base)))?;
        let mut req = http::Request::get(uri).header(http::header::ACCEPT, "application/json");
        if let Some(t) = &self.token {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let req = req
            .body(http_body_util::Empty::new())
            .map_err(|e| PromError::Config(format!("cannot build the request: {e}")))?;
        let unreachable = |e: &dyn std::error::Error| {
            let mut reason = error_chain(e);
            if reason.contains("certificate") {
                reason
                    .push_str(" (the server's certificate is not trusted here: pass --ca-file with its CA)");
            }
            PromError::Unreachable {
                url: self.base.clone(),
                reason,
            }
        };
        let resp = self.http.request(req).await.map_err(|e| unreachable(&e))?;
        let status = resp.status();
        let too_large = || PromError::TooLarge {
            query: query.to_string(),
            limit: self.max_body,
        };
        if resp
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .is_some_and(|n| n > self.max_body as u64)
        {
            return Err(too_large());
        }
        // Streamed under the cap: at most the cap plus one frame is ever held.
        let body = http_body_util::Limited::new(resp.into_body(), self.max_body)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    too_large()
                } else {
                    unreachable(e.as_ref())
                }
            })?
            .to_bytes();
        // The run's answers together are bounded too: each is parsed and reduced to its points before the next is
        // asked, but a run of many long answers would otherwise hold them all.
        let total = self
            .read_total
            .fetch_add(body.len(), std::sync::atomic::Ordering::Relaxed)
            + body.len();
        if total > self.max_total {
            return Err(PromError::TooLargeTotal {
                query: query.to_string(),
                limit: self.max_total,
            });
        }
        Ok((status, body))
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
                points: r.value.map(|Point(t, v)| vec![(t, v)]).unwrap_or_default(),
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
                    .extend(r.values.iter().map(|Point(t, v)| (*t, *v)));
            }
            from = to + step;
        }
        Ok(joined
            .into_iter()
            .map(|(labels, points)| Series { labels, points })
            .collect())
    }
}

/// Percent-encoding for a query parameter (PromQL is full of braces, quotes and brackets).
fn percent_encode(v: &str) -> String {
    let mut out = String::with_capacity(v.len() * 3);
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn fmt_ts(t: f64) -> String {
    format!("{t:.3}")
}

/// The error and its sources on one line ("connection refused" sits a few sources down in hyper's errors).
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A range longer than Prometheus's per-query limit is asked in chunks and joined into one series per label
    /// set, every step once; an answer over the cap is refused.
    #[tokio::test]
    async fn long_ranges_are_chunked_and_joined_and_large_answers_refused() {
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = calls.clone();
        let app = axum::Router::new().route(
            "/api/v1/query_range",
            axum::routing::get(
                move |axum::extract::Query(q): axum::extract::Query<BTreeMap<String, String>>| {
                    let seen = seen.clone();
                    async move {
                        seen.fetch_add(1, Ordering::Relaxed);
                        let n = |k: &str| q[k].parse::<f64>().unwrap();
                        let (start, end, step) = (n("start"), n("end"), n("step"));
                        let mut values = Vec::new();
                        let mut t = start;
                        while t <= end + 1e-9 {
                            values.push(serde_json::json!([t, format!("{t}")]));
                            t += step;
                        }
                        axum::Json(
                            serde_json::json!({"status": "success", "data": {"resultType": "matrix",
                            "result": [{"metric": {"model_name": "m"}, "values": values}]}}),
                        )
                    }
                },
            ),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let cfg = |max_body_bytes| ClientConfig {
            url: url.clone(),
            bearer_token_file: None,
            ca_file: None,
            timeout: Duration::from_secs(10),
            max_body_bytes,
            max_total_bytes: DEFAULT_MAX_TOTAL_BYTES,
        };
        let c = PromClient::new(&cfg(DEFAULT_MAX_BODY_BYTES)).unwrap();
        let steps = 25_000;
        let s = c
            .query_range("x", 1000.0, 1000.0 + steps as f64, 1.0)
            .await
            .unwrap();
        assert_eq!(calls.load(Ordering::Relaxed), 3);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].points.len(), steps + 1);
        assert!(s[0].points.windows(2).all(|w| w[1].0 - w[0].0 == 1.0));
        let small = PromClient::new(&cfg(10_000)).unwrap();
        let err = small.query_range("x", 0.0, 5000.0, 1.0).await.unwrap_err();
        assert!(matches!(err, PromError::TooLarge { .. }), "{err}");
        // Each answer under its cap, but the run's answers together over theirs (issue 53 N8: 63 MB answers, one
        // after another, took a run to 6.19 GB): refused naming what to narrow, the client's clones counting alike.
        let bounded = PromClient::new(&ClientConfig {
            max_total_bytes: 500_000,
            ..cfg(DEFAULT_MAX_BODY_BYTES)
        })
        .unwrap();
        let clone = bounded.clone();
        bounded.query_range("x", 0.0, 9_000.0, 1.0).await.unwrap();
        let err = clone.query_range("x", 0.0, 30_000.0, 1.0).await.unwrap_err();
        assert!(matches!(err, PromError::TooLargeTotal { .. }), "{err}");
        assert!(err.to_string().contains("--since"), "{err}");
    }
}
