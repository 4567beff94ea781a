//! The activator's per-model request statistics, as served on [`STATS_PATH`] and read by the controller.
//!
//! The activator is the only component that sees every request before a replica exists, so it is the source of
//! two scaling signals the sidecars cannot give: the request rate of a model at zero replicas, and how long a model
//! has been idle. It also tells the controller, through `queued`, that somebody is waiting right now — the
//! controller must never scale a model to zero while `in_flight + queued > 0`.
//!
//! Counters (`requests_total`, `rejected_total`) are cumulative since the activator process started
//! (`started_at_unix_ms`); a consumer derives rates from two documents with [`request_rate`], which detects
//! restarts instead of reading them as a negative rate. Times are Unix milliseconds so that this crate stays free
//! of a clock and of a date library, and so that they compare exactly across processes.
//!
//! Models are keyed by [`model_key`] (`"<namespace>/<model>"`, [`SCHEMA_VERSION`] 2): tenants are namespaces,
//! so the same `model` name in two namespaces is two models.
//!
//! Wake-up from zero: the activator writes nothing to the Kubernetes API for it. The controller polls every
//! activator pod's [`STATS_PATH`] and treats a fresh document with `queued > 0` for a model as a wake-up.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The activator's admin listener's default port (its stats document and `/metrics`; the port every Tessera role
/// serves its metrics on in the chart). The controller dials it on the activator's pods.
pub const DEFAULT_ADMIN_PORT: u16 = 9090;

/// Where the activator serves [`ActivatorStats`] as JSON (`GET`).
pub const STATS_PATH: &str = "/tessera/v1/stats";

/// The key of a model in [`ActivatorStats::models`]: `"<namespace>/<model>"`.
///
/// Tenants are namespaces: the same OpenAI `model` name in two namespaces is two models, routed and counted
/// apart. Routes configured statically (`--backend`) live in the activator's own `--namespace`.
pub fn model_key(namespace: &str, model: &str) -> String {
    format!("{namespace}/{model}")
}

/// Splits a [`model_key`] back into `(namespace, model)`; `None` when the key has no `/`.
/// The model part may itself contain `/` (vLLM model names are often paths), so the split is at the first `/`.
pub fn split_model_key(key: &str) -> Option<(&str, &str)> {
    key.split_once('/')
}

/// The version of this document's shape; bumped on an incompatible change so a reader can refuse it clearly.
pub const SCHEMA_VERSION: u32 = 2;

/// One activator's view of every model it knows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActivatorStats {
    /// [`SCHEMA_VERSION`] of the producer.
    pub schema_version: u32,
    /// Which activator instance produced this (the pod name in a cluster, or the listen address).
    pub instance: String,
    /// When the activator process started; counters restart from zero when this changes.
    pub started_at_unix_ms: u64,
    /// When this document was produced.
    pub observed_at_unix_ms: u64,
    /// Per [`model_key`] (`"<namespace>/<model>"`), sorted so the JSON is stable.
    pub models: BTreeMap<String, ModelStats>,
}

/// Request counts for one model at one activator.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelStats {
    /// Requests received for this model since the activator started, whatever their outcome.
    pub requests_total: u64,
    /// Requests for this model the activator answered itself with an error since start: hold queue full, hold
    /// timeout, or the backend failing before it sent a response.
    pub rejected_total: u64,
    /// Requests forwarded to a backend whose response has not finished yet.
    pub in_flight: u64,
    /// Requests held because the model has no ready backend (waiting for a scale from zero).
    pub queued: u64,
    /// Ready backends the activator currently routes to.
    pub ready_backends: u32,
    /// When the last request for this model arrived; `None` if none has since the activator started.
    pub last_request_at_unix_ms: Option<u64>,
    /// The lanes, streaming and prompt lengths of the requests counted (the workload class rule reads them;
    /// absent from older activators, which reads as nothing counted).
    #[serde(default)]
    pub mix: crate::class::RequestMix,
}

impl ModelStats {
    /// The counters the autoscaler reads (the rest zero): requests received, forwarded and not finished, held,
    /// and when the last one arrived.
    pub fn counts(
        requests_total: u64,
        in_flight: u64,
        queued: u64,
        last_request_at_unix_ms: Option<u64>,
    ) -> Self {
        ModelStats {
            requests_total,
            in_flight,
            queued,
            last_request_at_unix_ms,
            ..ModelStats::default()
        }
    }
}

/// Why no request rate could be derived from two documents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RateError {
    /// The two documents come from different activator processes (a restart): the counter began again at zero.
    #[error("the activator restarted between the two samples; wait for the next sample")]
    Restarted,
    /// The later document is not later than the earlier one.
    #[error("the samples are not in time order (or are the same sample)")]
    NotLater,
    /// The counter went backwards within one process, which a correct activator never does.
    #[error("requests_total went backwards within one activator process")]
    CounterDecreased,
}

/// Requests per second for `model` between two stats documents from the same activator.
///
/// A model absent from `earlier` but present in `later` was first seen in between, so its count started at zero;
/// a model absent from `later` has rate zero only if it is also absent from `earlier`, and is otherwise treated as
/// a counter going backwards (the activator never forgets a model).
pub fn request_rate(earlier: &ActivatorStats, later: &ActivatorStats, model: &str) -> Result<f64, RateError> {
    if earlier.instance != later.instance || earlier.started_at_unix_ms != later.started_at_unix_ms {
        return Err(RateError::Restarted);
    }
    if later.observed_at_unix_ms <= earlier.observed_at_unix_ms {
        return Err(RateError::NotLater);
    }
    let before = earlier.models.get(model).map_or(0, |m| m.requests_total);
    let after = later.models.get(model).map_or(0, |m| m.requests_total);
    let delta = after.checked_sub(before).ok_or(RateError::CounterDecreased)?;
    let seconds = (later.observed_at_unix_ms - earlier.observed_at_unix_ms) as f64 / 1000.0;
    Ok(delta as f64 / seconds)
}

impl ActivatorStats {
    /// The document of the current schema from `instance`, started at `started_at_unix_ms`, observed at
    /// `observed_at_unix_ms`, with `models` by [`model_key`].
    pub fn new(
        instance: impl Into<String>,
        started_at_unix_ms: u64,
        observed_at_unix_ms: u64,
        models: impl IntoIterator<Item = (String, ModelStats)>,
    ) -> Self {
        ActivatorStats {
            schema_version: SCHEMA_VERSION,
            instance: instance.into(),
            started_at_unix_ms,
            observed_at_unix_ms,
            models: models.into_iter().collect(),
        }
    }

    /// When `model` last saw activity at this activator: its last request, or — if it has seen none since the
    /// activator started — the start time (it has certainly been idle since then; this is what
    /// `tessera_core::scale::Demand::last_request_at` expects). `None` when this activator does not know the model,
    /// which a consumer must treat as "no data" (never a reason to scale to zero).
    pub fn last_activity_unix_ms(&self, model: &str) -> Option<u64> {
        self.models
            .get(model)
            .map(|m| m.last_request_at_unix_ms.unwrap_or(self.started_at_unix_ms))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn doc(observed: u64, total: u64) -> ActivatorStats {
        ActivatorStats::new(
            "a-0",
            1_000,
            observed,
            [(model_key("ns", "m"), ModelStats::counts(total, 0, 0, None))],
        )
    }

    #[test]
    fn json_shape_is_camel_case_and_round_trips() {
        let d = doc(2_000, 7);
        let json = serde_json::to_value(&d).unwrap();
        assert_eq!(json["schemaVersion"], 2);
        assert_eq!(json["models"]["ns/m"]["requestsTotal"], 7);
        assert!(json["models"]["ns/m"]["lastRequestAtUnixMs"].is_null());
        let back: ActivatorStats = serde_json::from_value(json).unwrap();
        assert_eq!(back, d);
    }

    #[test]
    fn rate_from_two_samples() {
        assert_eq!(request_rate(&doc(2_000, 10), &doc(4_000, 30), "ns/m"), Ok(10.0));
        // A model first seen between the samples counted from zero.
        assert_eq!(request_rate(&doc(2_000, 10), &doc(4_000, 30), "other"), Ok(0.0));
    }

    #[test]
    fn rate_refuses_restart_and_disorder() {
        let mut restarted = doc(4_000, 3);
        restarted.started_at_unix_ms = 3_500;
        assert_eq!(
            request_rate(&doc(2_000, 10), &restarted, "ns/m"),
            Err(RateError::Restarted)
        );
        assert_eq!(
            request_rate(&doc(4_000, 10), &doc(2_000, 30), "ns/m"),
            Err(RateError::NotLater)
        );
        assert_eq!(
            request_rate(&doc(2_000, 10), &doc(4_000, 5), "ns/m"),
            Err(RateError::CounterDecreased)
        );
    }

    #[test]
    fn activity_falls_back_to_the_start_time() {
        let mut d = doc(5_000, 0);
        assert_eq!(d.last_activity_unix_ms("ns/m"), Some(1_000));
        assert_eq!(d.last_activity_unix_ms("unknown"), None);
        d.models.get_mut("ns/m").unwrap().last_request_at_unix_ms = Some(4_000);
        assert_eq!(d.last_activity_unix_ms("ns/m"), Some(4_000));
    }
}
