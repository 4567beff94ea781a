//! Reading a vLLM `/metrics` page: Prometheus text parsing, the typed snapshot, and windowed rates and quantiles.
//!
//! Three layers, each usable on its own:
//! - [`text`]: a hand-written parser for the Prometheus text exposition format (0.0.4). It borrows every
//!   name and label from the page (no allocation per line), records a malformed line as a [`LineError`]
//!   and keeps the rest of the page, and never panics on any input. We write our own because the
//!   `prometheus-parse` crate silently drops every metric whose name contains a colon — which is every one
//!   of vLLM's (`vllm:num_requests_running`, …) — and mangles escaped label values (per the project's design
//!   notes, which also put it at ~45 MB/s; this parser reads real vLLM pages at 750+ MiB/s on the dev VM,
//!   see `docs/performance.md`).
//! - [`snapshot`]: [`VllmSnapshot`], the vLLM families Tessera decides on, per `(model_name, engine)` series
//!   and aggregated across them (the aggregation rule is documented on [`VllmSnapshot`]). Both generations of
//!   vLLM metric names are accepted (`vllm:kv_cache_usage_perc` / `vllm:gpu_cache_usage_perc`, …).
//! - [`window`]: what happened *between* two cumulative scrapes: request and token rates, preemptions, and
//!   p50/p95/p99 of the latency histograms, with counter resets (a restarted server) handled.
//!
//! Like the rest of `tessera-core` this module does no I/O and reads no clock: the sidecar fetches the page and
//! passes the elapsed time between scrapes.

pub mod snapshot;
pub mod text;
pub mod window;

pub use snapshot::{Bucket, EngineSeries, Histogram, Series, VllmSnapshot};
pub use text::{Family, LineError, LineErrorKind, MetricType, ParsedPage, Sample, parse_text};
pub use window::{Quantiles, WindowSummary, counter_delta};

/// Why a page could not be turned into a [`VllmSnapshot`].
///
/// Malformed *lines* are not errors of the page: they are skipped and listed in
/// [`VllmSnapshot::line_errors`]. Only a page that carries no vLLM data at all is refused, because building
/// an all-empty snapshot from it would look like "vLLM is idle" to the decisions downstream.
#[derive(Debug, Clone, PartialEq, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum MetricsError {
    /// Not one `vllm:*` sample was found on the page.
    #[error(
        "the page has no vllm:* metric ({families} metric families, {line_errors} malformed lines); \
         check that the URL points at a vLLM server's /metrics endpoint"
    )]
    NoVllmFamilies {
        /// How many metric families the page did have (0 for an empty page or an HTML error page).
        families: usize,
        /// How many lines could not be parsed.
        line_errors: usize,
    },
}

impl MetricsError {
    /// A fixed, low-cardinality name for this error, for a metric label such as `reason="no_vllm_families"`.
    pub fn label(&self) -> &'static str {
        self.into()
    }
}

/// Serde helpers for `f64` values that may be `NaN` or infinite (a histogram's `+Inf` bound, a missing sum).
///
/// JSON has no non-finite numbers and `serde_json` would write `null`, which does not read back as `f64`;
/// these are written as the strings Prometheus uses (`"+Inf"`, `"-Inf"`, `"NaN"`) and read back from either form.
pub(crate) mod nonfinite {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        if v.is_finite() {
            s.serialize_f64(*v)
        } else if v.is_nan() {
            s.serialize_str("NaN")
        } else if *v > 0.0 {
            s.serialize_str("+Inf")
        } else {
            s.serialize_str("-Inf")
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum NumOrStr {
            Num(f64),
            Str(String),
        }
        match NumOrStr::deserialize(d)? {
            NumOrStr::Num(v) => Ok(v),
            NumOrStr::Str(s) => match s.as_str() {
                "NaN" => Ok(f64::NAN),
                "+Inf" | "Inf" => Ok(f64::INFINITY),
                "-Inf" => Ok(f64::NEG_INFINITY),
                other => Err(serde::de::Error::custom(format!(
                    "expected a number or one of \"NaN\", \"+Inf\", \"-Inf\", got {other:?}"
                ))),
            },
        }
    }
}

#[cfg(test)]
mod fixture_tests;
