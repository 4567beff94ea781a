//! Property tests: on any pod JSON the webhook never panics, and every answer is one of admit-unchanged,
//! admit-with-a-patch-that-applies (and is idempotent), or deny-with-a-message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use proptest::prelude::*;
use serde_json::{Map, Value, json};
use tessera_api::crd::InferenceAutoscaler;
use tessera_pool::{Placement, PoolsConfig};
use tessera_webhook::admit::Admitter;
use tessera_webhook::mutate::{self, Config, Context, Mutation, Unchanged};

const POOLS: &str = "pools:\n- name: a100\n  gpuMemoryMiB: 81920\n  sharing: mps\n  maxGpus: 4\n";

fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("vllm".to_string()),
        Just("serve".to_string()),
        Just("python3".to_string()),
        Just("-m".to_string()),
        Just("vllm.entrypoints.openai.api_server".to_string()),
        Just("sh".to_string()),
        Just("-c".to_string()),
        Just("--port".to_string()),
        Just("9090".to_string()),
        Just("8000".to_string()),
        Just("--gpu-memory-utilization".to_string()),
        Just("--gpu_memory_utilization=0.9".to_string()),
        Just("--kv-cache-memory-bytes".to_string()),
        Just("--model".to_string()),
        Just("/models/m".to_string()),
        Just("$(X)".to_string()),
        Just("${X}".to_string()),
        Just("vllm serve m --gpu-memory-utilization $X".to_string()),
        ".{0,12}",
    ]
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        ".{0,8}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map(".{0,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn annotation() -> impl Strategy<Value = (String, String)> {
    let keys = prop_oneof![
        Just("tessera.dev/gpu-compute-fraction"),
        Just("tessera.dev/gpu-memory"),
        Just("tessera.dev/pool"),
        Just("tessera.dev/inject"),
        Just("tessera.dev/container"),
        Just("tessera.dev/vllm-version"),
        Just("tessera.dev/itl-slo"),
        Just("tessera.dev/reservation"),
        Just("tessera.dev/gpu-uuid"),
        Just("tessera.dev/capacity-pod"),
        Just("app"),
    ];
    let values = prop_oneof![
        Just("0.25".to_string()),
        Just("1".to_string()),
        Just("2".to_string()),
        Just("10240".to_string()),
        Just("a100".to_string()),
        Just("true".to_string()),
        Just("false".to_string()),
        Just("vllm".to_string()),
        Just("0.11.0".to_string()),
        Just("100ms".to_string()),
        ".{0,8}",
    ];
    (keys, values).prop_map(|(k, v)| (k.to_string(), v))
}

fn container() -> impl Strategy<Value = Value> {
    (
        prop_oneof![Just("vllm"), Just("server"), Just("tessera-sidecar"), Just("x")],
        prop::option::of(prop_oneof![
            Just("vllm/vllm-openai:v0.11.0"),
            Just("vllm/vllm-openai:latest"),
            Just("nginx")
        ]),
        prop::option::of(prop::collection::vec(word(), 0..6)),
        prop::option::of(prop::collection::vec(word(), 0..6)),
        prop::option::of(prop_oneof![Just("1"), Just("2"), Just("0"), Just("x")]),
        prop::option::of(prop_oneof![Just(8000), Just(9090), Just(-1)]),
        prop::option::of(value()),
    )
        .prop_map(|(name, image, command, args, gpu, port, junk)| {
            let mut c = Map::new();
            c.insert("name".into(), json!(name));
            if let Some(i) = image {
                c.insert("image".into(), json!(i));
            }
            if let Some(v) = command {
                c.insert("command".into(), json!(v));
            }
            if let Some(v) = args {
                c.insert("args".into(), json!(v));
            }
            if let Some(g) = gpu {
                c.insert("resources".into(), json!({"limits": {"nvidia.com/gpu": g}}));
            }
            if let Some(p) = port {
                c.insert("ports".into(), json!([{"containerPort": p}]));
            }
            if let Some(j) = junk {
                c.insert("env".into(), j);
            }
            Value::Object(c)
        })
}

fn pod() -> impl Strategy<Value = Value> {
    (
        prop::collection::vec(container(), 0..3),
        prop::option::of(prop::collection::vec(container(), 0..2)),
        prop::collection::vec(annotation(), 0..4),
        prop::collection::vec(annotation(), 0..2),
        prop::option::of(value()),
    )
        .prop_map(|(containers, inits, ann, labels, affinity)| {
            let mut spec = Map::new();
            spec.insert("containers".into(), json!(containers));
            if let Some(i) = inits {
                spec.insert("initContainers".into(), json!(i));
            }
            if let Some(a) = affinity {
                spec.insert("affinity".into(), a);
            }
            let ann: Map<String, Value> = ann.into_iter().map(|(k, v)| (k, json!(v))).collect();
            let labels: Map<String, Value> = labels.into_iter().map(|(k, v)| (k, json!(v))).collect();
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"generateName": "p-", "namespace": "default", "annotations": ann, "labels": labels},
                   "spec": spec})
        })
}

fn review(object: &Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"},
                    "namespace": "default", "operation": "CREATE", "userInfo": {"username": "x"},
                    "object": object}
    }))
    .unwrap()
}

fn policy(sharing: &str) -> InferenceAutoscaler {
    serde_json::from_value(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "InferenceAutoscaler",
        "metadata": {"name": "m", "namespace": "default"},
        "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "m"}, "maxReplicas": 2,
                 "gpu": {"sharing": sharing, "updateMode": "Initial"}},
        "status": {"recommendation": {"kvCacheMemoryBytes": 1073741824_i64, "gpuMemoryUtilization": 0.3,
                   "gpuMemoryMiB": 8192, "computeFraction": 0.2, "reason": "r"}}
    }))
    .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// Any object inside a well-formed review: a well-formed answer; a patch applies; a denial says why.
    #[test]
    fn any_object_gets_a_well_formed_answer(object in prop_oneof![pod(), value()]) {
        let admitter = Admitter::without_kube(Config::default());
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let answer = rt.block_on(admitter.admit(&review(&object))).expect("a review always gets an answer");
        let r = answer.response.expect("a response");
        prop_assert_eq!(r.uid.as_str(), "u-1");
        if r.allowed {
            if let Some(bytes) = r.patch {
                let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
                let mut doc = object.clone();
                prop_assert!(json_patch::patch(&mut doc, &patch).is_ok(), "patch {patch:?} on {object}");
            }
        } else {
            prop_assert!(!r.result.message.is_empty());
        }
    }

    /// `mutate` itself, with policies and a placement: unchanged, or a patch that applies and is idempotent.
    #[test]
    fn mutate_is_total_and_idempotent(object in pod(), fractional in any::<bool>()) {
        let Ok(p) = serde_json::from_value::<Pod>(object.clone()) else { return Ok(()) };
        let cfg = Config { pools: Some(Arc::new(PoolsConfig::from_yaml(POOLS).unwrap())), ..Config::default() };
        let ias = policy(if fractional { "fractional" } else { "whole" });
        let place = Placement {
            pool: "a100".into(), capacity_pod: "cap-0".into(), namespace: "tessera-system".into(),
            node: Some("n1".into()), gpu_uuid: Some("GPU-1".into()), reservation_id: "r1".into(), reason: "BestFit".into(),
        };
        let ctx = Context { config: &cfg, policy: Some(&ias), placement: Some(&place) };
        match mutate::mutate(&p, &ctx) {
            Err(deny) => prop_assert!(!deny.to_string().is_empty()),
            Ok(Mutation::Unchanged(_)) => {}
            Ok(Mutation::Patch { patch, .. }) => {
                let before = serde_json::to_value(&p).unwrap();
                let mut doc = before.clone();
                prop_assert!(json_patch::patch(&mut doc, &patch).is_ok());
                let again: Pod = serde_json::from_value(doc).unwrap();
                prop_assert_eq!(mutate::mutate(&again, &ctx).unwrap(), Mutation::Unchanged(Unchanged::UpToDate));
            }
        }
    }
}
