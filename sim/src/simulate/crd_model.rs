//! A scenario model that carries its InferenceAutoscaler spec as written (`inference_autoscaler:`, the CRD's
//! camelCase field names, `behavior` included), read by the controller's own reader
//! ([`InferenceAutoscalerSpec::to_policy`]): the same checks, the same messages, one place.
//!
//! ```yaml
//! models:
//!   - name: llama
//!     preset: llama-3.1-8b
//!     hpa_requests_per_second_per_replica: 2
//!     traffic: {trace: azure_llm}
//!     inference_autoscaler:            # copied from the manifest's spec
//!       scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: llama}
//!       minReplicas: 0
//!       maxReplicas: 4
//!       ttftSlo: 2s
//!       scaleToZero: {idleAfter: 5m}
//!       behavior: {scaleDown: {stabilizationWindowSeconds: 120}}
//! ```
//!
//! Before the file is read into [`super::scenario::ScenarioFile`], each such spec is read into the core's
//! [`ScalePolicy`] and the model's Tessera fields (`min_replicas`, `max_replicas`, `targets`, `slo_ttft`, `slo_itl`, …) are
//! written from that policy, so the rest of the simulator sees one kind of model. A spec the controller would
//! refuse is refused here with the controller's message (its `Valid` condition), prefixed by where it is.

use serde_yaml::{Mapping, Value};
use tessera_api::crd::{InferenceAutoscalerSpec, invalid_spec_message};
use tessera_core::scale::ScalePolicy;

/// Why a model's spec cannot be read; the scenario reader says which file.
#[derive(Debug, thiserror::Error)]
pub enum SpecModelError {
    /// The YAML (or a spec in it) does not parse.
    #[error("{0}")]
    Yaml(String),
    /// Specs the controller refuses, or written twice; each problem names the model and the field.
    #[error("{}", .0.join("; "))]
    Invalid(Vec<String>),
}

/// The key of a model that holds its InferenceAutoscaler spec.
pub const KEY: &str = "inference_autoscaler";

/// The scenario's model fields a spec sets: written once, in the spec, or in the scenario's own names.
const OWNED: [(&str, &str); 11] = [
    ("min_replicas", "minReplicas"),
    ("max_replicas", "maxReplicas"),
    ("targets", "targets"),
    ("slo_ttft", "ttftSlo"),
    ("slo_itl", "itlSlo"),
    ("ttft_slo_percentile", "ttftSloPercentile"),
    ("scale_to_zero_after", "scaleToZero.idleAfter"),
    ("cold_start_miss_budget", "scaleToZero.coldStartMissBudget"),
    ("cold_start_budget_group", "scaleToZero.coldStartBudgetGroup"),
    ("compute_fraction", "gpu.computeFraction"),
    ("workload_class", "workloadClass"),
];

/// The policy a model's spec describes, as the controller reads it (`None` without a spec or with an invalid one,
/// which [`expand`] has already refused).
pub fn policy(spec: Option<&InferenceAutoscalerSpec>) -> Option<ScalePolicy> {
    spec.and_then(|s| s.to_policy().ok())
}

/// The scenario as a YAML value with every model's spec read into the model's own fields; `None` when no model
/// carries a spec (the file is then read as it is, keeping serde's line numbers in its errors).
pub fn expand(yaml: &str) -> Result<Option<Value>, SpecModelError> {
    let mut doc: Value = serde_yaml::from_str(yaml).map_err(|e| SpecModelError::Yaml(e.to_string()))?;
    let Some(models) = doc.get_mut("models").and_then(Value::as_sequence_mut) else {
        return Ok(None);
    };
    let mut any = false;
    let mut problems = Vec::new();
    for (i, model) in models.iter_mut().enumerate() {
        let Some(m) = model.as_mapping_mut() else { continue };
        let Some(raw) = m.get(KEY).cloned() else { continue };
        any = true;
        let name = m
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let at = format!("models[{i}] ({name})");
        let spec: InferenceAutoscalerSpec =
            serde_yaml::from_value(raw).map_err(|e| SpecModelError::Yaml(format!("{at}.{KEY}: {e}")))?;
        for (own, theirs) in OWNED {
            if m.contains_key(own) {
                problems.push(format!(
                    "{at}.{own}: the model's {KEY} sets it ({theirs}); write it once, in the spec"
                ));
            }
        }
        match spec.to_policy() {
            Err(errors) => problems.push(format!("{at}.{KEY}: {}", invalid_spec_message(&errors))),
            Ok(p) => match fields(&spec, &p) {
                Ok(fields) => m.extend(fields),
                Err(e) => problems.push(format!("{at}.{KEY}: {e}")),
            },
        }
    }
    if !problems.is_empty() {
        return Err(SpecModelError::Invalid(problems));
    }
    Ok(any.then_some(doc))
}

/// The scenario's model fields that `policy` (read from `spec`) sets.
fn fields(spec: &InferenceAutoscalerSpec, policy: &ScalePolicy) -> Result<Mapping, String> {
    let slo = policy.ttft_slo.ok_or(
        "ttftSlo is needed in a scenario: the report measures attainment against it (e.g. ttftSlo: 2s)",
    )?;
    let secs = |d: std::time::Duration| Value::from(humantime::format_duration(d).to_string());
    let mut out = Mapping::new();
    out.insert("min_replicas".into(), policy.min_replicas.into());
    out.insert("max_replicas".into(), policy.max_replicas.into());
    out.insert("slo_ttft".into(), secs(slo));
    if let Some(itl) = spec.itl_slo() {
        out.insert("slo_itl".into(), secs(itl));
    }
    if let Some(n) = spec.ttft_slo_percentile {
        out.insert("ttft_slo_percentile".into(), n.into());
    }
    let t = &policy.targets;
    let mut targets = Mapping::new();
    let mut target = |key: &str, v: Option<Value>| {
        if let Some(v) = v {
            targets.insert(key.into(), v);
        }
    };
    target("kv_cache_utilization", t.kv_cache_utilization.map(Value::from));
    target(
        "waiting_requests_per_replica",
        t.waiting_requests_per_replica.map(Value::from),
    );
    target("ttft_p95", t.ttft_p95.map(secs));
    target(
        "requests_per_second_per_replica",
        t.requests_per_second_per_replica.map(Value::from),
    );
    out.insert("targets".into(), Value::Mapping(targets));
    if let Some(z) = &policy.scale_to_zero {
        out.insert("scale_to_zero_after".into(), secs(z.idle_after));
        if let Some(b) = z.cold_start_miss_budget {
            out.insert("cold_start_miss_budget".into(), b.into());
        }
        if let Some(g) = &z.cold_start_budget_group {
            out.insert("cold_start_budget_group".into(), g.clone().into());
        }
    }
    if let Some(class) = spec.workload_class.pinned() {
        out.insert("workload_class".into(), class.as_str().into());
    }
    // The spec writes the share as a string ("auto" or "0.25"); to_policy has checked that it parses.
    if let Some(cf) = spec.gpu.as_ref().and_then(|g| g.compute_fraction.as_deref()) {
        let v = cf.parse::<f64>().map_or_else(|_| Value::from(cf), Value::from);
        out.insert("compute_fraction".into(), v);
    }
    Ok(out)
}

#[cfg(test)]
#[path = "crd_model_tests.rs"]
mod tests;
