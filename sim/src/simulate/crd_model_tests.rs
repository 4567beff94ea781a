//! A scenario model written with its InferenceAutoscaler spec (`crd_model`).
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use super::super::scenario::{ComputeFraction, ScenarioError, ScenarioFile, Source, load, resolve};
use super::*;

/// A one-model scenario in YAML's flow style, the model's own fields `model` (`inference_autoscaler: SPEC`, or
/// the scenario's names).
fn scenario_with(model: &str) -> String {
    format!(
        "{{name: t, duration: 10m, gpu: a100-80gb, models: [{{name: chat, preset: llama-3.1-8b, \
         hpa_requests_per_second_per_replica: 4, traffic: {{trace: azure_llm, rate: 0.1}}, {model}}}]}}"
    )
}

/// A model with `spec` (YAML flow, as in a manifest) under `inference_autoscaler`.
fn scenario(spec: &str) -> String {
    scenario_with(&format!("inference_autoscaler: {spec}"))
}

fn problems(yaml: &str) -> Vec<String> {
    match ScenarioFile::parse(yaml, "m.yaml") {
        Err(ScenarioError::Invalid { problems, .. }) => problems,
        other => panic!("expected problems, got {other:?}"),
    }
}

#[test]
fn the_shipped_crd_scenario_reads_the_spec_behavior_included() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/crd-spec.yaml");
    let s = load(&Source::File(path), None, None).unwrap();
    let chat = &s.models[0];
    assert_eq!((chat.min_replicas, chat.max_replicas, chat.slo_ttft), (1, 4, 2.0));
    assert_eq!(chat.ttft_slo_percentile, tessera_core::scale::SloPercentile::P99);
    assert_eq!(chat.targets.kv_cache_utilization, Some(0.7));
    assert_eq!(chat.slo_itl, Some(0.1));
    let policy = chat.policy.as_ref().expect("the spec's policy");
    assert_eq!(
        policy.behavior.scale_down.stabilization_window,
        Duration::from_secs(300)
    );
    let tool = &s.models[1];
    assert_eq!(tool.min_replicas, 0);
    assert_eq!(tool.scale_to_zero_after, Some(Duration::from_secs(300)));
    assert_eq!(tool.compute_fraction, ComputeFraction::Fixed(0.5));
    assert_eq!(
        tool.policy
            .as_ref()
            .map(|p| p.behavior.scale_up.stabilization_window),
        Some(Duration::ZERO)
    );
}

/// The message is the controller's (`invalid_spec_message` of `to_policy`'s problems, its `Valid`
/// condition), after where the spec is; the autoscaler's reconcile test holds the condition against it too.
#[test]
fn a_wrong_field_gets_the_controllers_message() {
    let spec = "{scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: chat}, minReplicas: 5, \
                maxReplicas: 2, ttftSlo: 2s, ttftSloPercentile: 90}";
    let parsed: InferenceAutoscalerSpec = serde_yaml::from_str(spec).unwrap();
    let controller = invalid_spec_message(&parsed.to_policy().unwrap_err());
    assert!(
        controller.contains("maxReplicas (2) must be >= minReplicas (5)"),
        "{controller}"
    );
    assert!(
        controller.contains("ttftSloPercentile must be 95 or 99"),
        "{controller}"
    );
    assert_eq!(
        problems(&scenario(spec)),
        [format!("models[0] (chat).inference_autoscaler: {controller}")]
    );
}

#[test]
fn a_field_written_twice_or_a_missing_slo_is_named() {
    let spec = "{scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: chat}, maxReplicas: 2}";
    let twice = scenario_with(&format!("max_replicas: 3, inference_autoscaler: {spec}"));
    let p = problems(&twice);
    assert!(
        p.iter().any(|m| m.contains(
            "models[0] (chat).max_replicas: the model's inference_autoscaler sets it (maxReplicas)"
        )),
        "{p:?}"
    );
    assert!(
        p.iter().any(|m| m.contains("ttftSlo is needed in a scenario")),
        "{p:?}"
    );
}

#[test]
fn a_scenario_without_a_spec_is_read_as_before() {
    let yaml = scenario_with("slo_ttft: 2s, max_replicas: 2");
    assert!(expand(&yaml).unwrap().is_none());
    let f = ScenarioFile::parse(&yaml, "m.yaml").unwrap();
    assert!(resolve(&f, "m.yaml", None).unwrap().models[0].policy.is_none());
}
