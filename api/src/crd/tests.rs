#![allow(clippy::unwrap_used)]

use super::*;
use tessera_core::scale::{self, Timestamp};

fn spec(yaml: &str) -> InferenceAutoscalerSpec {
    serde_yaml::from_str(yaml).unwrap()
}

const GOOD: &str = r#"
scaleTargetRef: {kind: Deployment, name: llama}
minReplicas: 0
maxReplicas: 8
targets: {kvCacheUtilization: 0.7, waitingRequestsPerReplica: 2, ttftP95: 800ms, requestsPerSecondPerReplica: 5}
scaleToZero: {idleAfter: 10m}
ttftSlo: 2s
behavior:
  scaleDown:
    stabilizationWindowSeconds: 120
    policies: [{type: Pods, value: 1, periodSeconds: 60}]
  panic: {thresholdPercent: 300}
gpu: {sharing: fractional, memory: 10240, computeFraction: "0.25", updateMode: Initial}
modelNames: [meta-llama/Llama-3.1-8B-Instruct]
"#;

#[test]
fn committed_crd_matches_generated() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/crds/inferenceautoscaler.yaml"
    );
    let committed = std::fs::read_to_string(path).unwrap();
    assert!(
        committed == crdgen().unwrap(),
        "deploy/crds/inferenceautoscaler.yaml is stale: run 'cargo run -- crdgen > deploy/crds/inferenceautoscaler.yaml'"
    );
}

#[test]
fn crd_has_names_columns_status_and_rules() {
    let crd = InferenceAutoscaler::crd();
    assert_eq!(
        crd.metadata.name.as_deref(),
        Some("inferenceautoscalers.tessera.dev")
    );
    assert_eq!(crd.spec.names.short_names, Some(vec!["ias".to_owned()]));
    assert_eq!(crd.spec.scope, "Namespaced");
    let v = &crd.spec.versions[0];
    assert_eq!(v.name, "v1alpha1");
    assert!(v.subresources.as_ref().unwrap().status.is_some());
    let cols: Vec<_> = v
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        cols,
        [
            "Target",
            "Min",
            "Max",
            "Replicas",
            "Desired",
            "Signal",
            "Held-By",
            "GPU-MiB",
            "Compute",
            "KV-Bytes",
            "Sharing",
            "Class",
            "Class-Source",
            "Update",
            "Age"
        ]
    );
    // The recommendation, the sharing mode and the workload class show with `kubectl get ias -o wide` only.
    let wide: Vec<_> = v
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .filter(|c| c.priority == Some(1))
        .map(|c| c.json_path.as_str())
        .collect();
    assert_eq!(
        wide,
        [
            ".status.constraint",
            ".status.recommendation.gpuMemoryMiB",
            ".status.recommendation.computeFraction",
            ".status.recommendation.kvCacheMemoryBytes",
            ".spec.gpu.sharing",
            ".status.workloadClass",
            ".status.workloadClassSource",
            ".spec.gpu.updateMode"
        ]
    );
    let json = serde_json::to_string(&crd).unwrap();
    assert!(json.contains("maxReplicas must be >= minReplicas"));
    assert!(json.contains("minReplicas 0 requires scaleToZero"));
    assert!(
        json.contains("duration(self.ttftSlo) > duration('0s')"),
        "ttftSlo: 0s is refused by the API"
    );
    assert!(json.contains("self.ttftSloPercentile in [95, 99]"));
    assert!(json.contains("x-kubernetes-int-or-string"));
    // YAML 1.1 readers (kubectl) would turn a plain Off into false.
    let yaml = crdgen().unwrap();
    assert!(
        yaml.contains("default: 'Off'") && yaml.contains("- 'Off'"),
        "{yaml}"
    );
    assert!(!yaml.lines().any(|l| l.ends_with(": Off") || l.ends_with("- Off")));
}

/// The status form of a ledger's copy reads back as the same copy, stays small at its longest (it is rewritten
/// up to once a minute, and every watcher of the object receives it), and names what is wrong with one edited
/// by hand.
#[test]
fn a_ledger_copy_round_trips_through_status_and_stays_small() {
    use tessera_core::scale::coldstart::{CheckpointSample, LedgerCheckpoint, checkpoint};
    // The longest copy: a day of entries a minute and a half apart, every fourth a wake after a long spell,
    // requests in the thousands.
    let taken_at = Timestamp::from_millis(1_800_000_000_000);
    let n = checkpoint::MAX_SAMPLES as u64;
    let copy = LedgerCheckpoint {
        taken_at,
        last_request_at: taken_at.minus(Duration::from_secs(40)),
        requests_total: 987_654_321,
        cold_start: Some(Duration::from_millis(28_250)),
        samples: (0..n)
            .map(|i| CheckpointSample {
                at: taken_at.minus(Duration::from_millis((n - i) * 84_375)),
                requests: 1_000 + i,
                at_zero: (i % 4 == 0).then(|| Duration::from_millis(3_600_000 + i)),
            })
            .collect(),
    };
    let status = ColdStartLedgerStatus::from_checkpoint(&copy);
    let json = serde_json::to_string(&status).unwrap();
    assert!(json.len() < 24 * 1024, "{} bytes", json.len());
    let back: ColdStartLedgerStatus = serde_json::from_str(&json).unwrap();
    assert_eq!(back.to_checkpoint().unwrap(), copy);
    let mut edited = back.clone();
    edited.samples[2] = vec![5, -1];
    assert_eq!(
        edited.to_checkpoint().unwrap_err(),
        "samples[2] requests is negative (-1)"
    );
    edited.samples[2] = vec![5];
    assert_eq!(
        edited.to_checkpoint().unwrap_err(),
        "samples[2] has 1 numbers, not 2 or 3"
    );
}

#[test]
fn a_full_spec_becomes_a_policy() {
    let s = spec(GOOD);
    assert_eq!(s.scale_target_ref.api_version, "apps/v1");
    let p = s.to_policy().unwrap();
    assert_eq!((p.min_replicas, p.max_replicas), (0, 8));
    let zero = p.scale_to_zero.clone().unwrap();
    assert_eq!(zero.idle_after, Duration::from_secs(600));
    assert_eq!(zero.cold_start_miss_budget, None);
    assert_eq!(zero.cold_start_budget_group, None);
    let grouped = spec(&GOOD.replace(
        "scaleToZero: {idleAfter: 10m}",
        "scaleToZero: {idleAfter: 10m, coldStartMissBudget: 0.005, coldStartBudgetGroup: batch-tools}",
    ));
    assert_eq!(
        grouped
            .to_policy()
            .unwrap()
            .scale_to_zero
            .unwrap()
            .cold_start_budget_group
            .as_deref(),
        Some("batch-tools")
    );
    // A group without a budget, and a name no label could carry, are refused with the field named.
    for (bad, says) in [
        (
            "{idleAfter: 10m, coldStartBudgetGroup: tools}",
            "needs scaleToZero.coldStartMissBudget",
        ),
        (
            "{idleAfter: 10m, coldStartMissBudget: 0.01, coldStartBudgetGroup: Batch_Tools}",
            "scaleToZero.coldStartBudgetGroup must be 1-63 lowercase letters",
        ),
    ] {
        let err = spec(&GOOD.replace("scaleToZero: {idleAfter: 10m}", &format!("scaleToZero: {bad}")))
            .to_policy()
            .unwrap_err()
            .join("; ");
        assert!(err.contains(says), "{err}");
    }
    let budgeted = spec(&GOOD.replace(
        "scaleToZero: {idleAfter: 10m}",
        "scaleToZero: {idleAfter: 10m, coldStartMissBudget: 0.005}",
    ));
    assert_eq!(
        budgeted
            .to_policy()
            .unwrap()
            .scale_to_zero
            .unwrap()
            .cold_start_miss_budget,
        Some(0.005)
    );
    assert_eq!(p.targets.ttft_p95, Some(Duration::from_millis(800)));
    assert_eq!(p.ttft_slo, Some(Duration::from_secs(2)));
    assert_eq!(p.ttft_slo_percentile, scale::SloPercentile::P95);
    let p99 = spec(&GOOD.replace("ttftSlo: 2s", "ttftSlo: 2s\nttftSloPercentile: 99"));
    assert_eq!(
        p99.to_policy().unwrap().ttft_slo_percentile,
        scale::SloPercentile::P99
    );
    assert_eq!(
        p.behavior.scale_down.stabilization_window,
        Duration::from_secs(120)
    );
    assert_eq!(p.behavior.scale_down.policies.len(), 1);
    // Unset direction keeps HPA's defaults.
    assert_eq!(p.behavior.scale_up, scale::ScalingRules::default_up());
    assert_eq!(p.panic.unwrap().threshold, 3.0);
    assert_eq!(s.model_names, ["meta-llama/Llama-3.1-8B-Instruct"]);
}

#[test]
fn nonsense_is_rejected_with_clear_messages() {
    let cases = [
        (
            "scaleTargetRef: {kind: Deployment, name: a}\nminReplicas: 3\nmaxReplicas: 2",
            "maxReplicas (2) must be >= minReplicas (3)",
        ),
        (
            "scaleTargetRef: {kind: Deployment, name: a}\nminReplicas: 0\nmaxReplicas: 2",
            "minReplicas 0 requires scaleToZero",
        ),
        (
            "scaleTargetRef: {kind: Deployment, name: a}\nmaxReplicas: 2\ntargets: {kvCacheUtilization: 1.5}",
            "kvCacheUtilization is a fraction",
        ),
        (
            "scaleTargetRef: {kind: Deployment, name: a}\nmaxReplicas: 2\ntargets: {ttftP95: soon}",
            "targets.ttftP95 \"soon\" is not a duration",
        ),
        (
            "scaleTargetRef: {kind: Deployment, name: a}\nmaxReplicas: 2\ngpu: {computeFraction: \"1.5\"}",
            "gpu.computeFraction must be",
        ),
        (
            "scaleTargetRef: {kind: Deployment, name: a}\nmaxReplicas: 2\ngpu: {memory: lots}",
            "gpu.memory must be",
        ),
        (
            "scaleTargetRef: {kind: Deployment, name: a}\nmaxReplicas: 2\nbehavior: {scaleUp: {policies: [{type: Pods, value: 0, periodSeconds: 15}]}}",
            "behavior.scaleUp.policies[0]",
        ),
        (
            "scaleTargetRef: {apiVersion: apps/v1/x, kind: Deployment, name: a}\nmaxReplicas: 2",
            "scaleTargetRef.apiVersion \"apps/v1/x\" must be group/version",
        ),
        (
            "scaleTargetRef: {kind: Deployment, name: a}\nminReplicas: 0\nmaxReplicas: 2\nscaleToZero: {idleAfter: 5m}",
            "scaleToZero needs modelNames",
        ),
        (
            "scaleTargetRef: {kind: Deployment, name: a}\nmaxReplicas: 2\ntargets: {requestsPerSecondPerReplica: 3}",
            "targets.requestsPerSecondPerReplica needs modelNames",
        ),
        (
            "scaleTargetRef: {kind: Deployment, name: a}\nmaxReplicas: 2\nttftSlo: 0s",
            "ttftSlo must be more than 0",
        ),
        (
            "scaleTargetRef: {kind: Deployment, name: a}\nmaxReplicas: 2\nitlSlo: 0ms",
            "itlSlo must be more than 0",
        ),
        (
            "scaleTargetRef: {kind: Deployment, name: a}\nmaxReplicas: 2\nitlSlo: fast",
            "itlSlo \"fast\" is not a duration",
        ),
        (
            "scaleTargetRef: {kind: Deployment, name: a}\nmaxReplicas: 2\nttftSlo: 2s\nttftSloPercentile: 90",
            "ttftSloPercentile must be 95 or 99",
        ),
        (
            "scaleTargetRef: {kind: Deployment, name: a}\nmaxReplicas: 2\nttftSloPercentile: 99",
            "ttftSloPercentile 99 needs ttftSlo",
        ),
        (
            "scaleTargetRef: {kind: Deployment, name: a}\nminReplicas: 0\nmaxReplicas: 2\nmodelNames: [m]\nscaleToZero: {idleAfter: 5m, coldStartMissBudget: 0.7}",
            "scaleToZero.coldStartMissBudget is a share of requests in [0, 0.5]",
        ),
    ];
    for (yaml, want) in cases {
        let errors = spec(yaml).validate().unwrap_err();
        assert!(
            errors.iter().any(|e| e.contains(want)),
            "{yaml}: {errors:?} lacks {want:?}"
        );
    }
}

/// Every InferenceAutoscaler in `deploy/examples/` and `e2e/model.yaml` parses and passes validation (other
/// kinds are skipped).
#[test]
fn examples_are_valid() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/examples");
    let e2e = std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../e2e/model.yaml"));
    let mut seen = 0;
    let paths = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .chain(std::iter::once(e2e));
    for path in paths {
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        // The e2e model is a template; fill its placeholders as the e2e test does.
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("${NAMESPACE}", "e2e")
            .replace("${IMAGE}", "img");
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value = serde_yaml::Value::deserialize(doc).unwrap();
            if value.get("kind").and_then(|k| k.as_str()) != Some("InferenceAutoscaler") {
                continue;
            }
            let ias: InferenceAutoscaler =
                serde_yaml::from_value(value).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            if let Err(errors) = ias.spec.validate() {
                panic!("{}: {errors:?}", path.display());
            }
            seen += 1;
        }
    }
    assert!(seen >= 4, "expected the examples in {dir} and the e2e manifests");
}

#[test]
fn durations_parse_like_kubernetes() {
    assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
    assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
    assert!(parse_duration("5 minutes").is_err());
    assert!(parse_duration("").is_err());
}

#[test]
fn status_serializes_camel_case() {
    let st = InferenceAutoscalerStatus {
        desired_replicas: 3,
        recommendation: Some(RecommendationStatus {
            gpu_memory_mib: Some(10240),
            ..Default::default()
        }),
        ..Default::default()
    };
    let v = serde_json::to_value(&st).unwrap();
    assert_eq!(v["desiredReplicas"], 3);
    assert_eq!(v["recommendation"]["gpuMemoryMiB"], 10240);
}
