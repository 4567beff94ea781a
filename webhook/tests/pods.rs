//! `mutate` on real pod specs (`testdata/pods/`, see its README): every patch applies to the pod it was made for
//! (with `json-patch`, as the API server would), applying the webhook again changes nothing, and each pod's
//! vLLM flags, sidecar and placement come out as the table says. Also writes/checks the before/after examples in
//! `docs/webhook.md` (set `TESSERA_BLESS=1` to regenerate them).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, Pod};
use serde_json::{Value, json};
use tessera_api::crd::InferenceAutoscaler;
use tessera_pool::{Placement, PoolsConfig};
use tessera_webhook::mutate::{self, Config, Context, Mutation, SIDECAR_NAME, Unchanged};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn load(file: &str) -> Value {
    let text = std::fs::read_to_string(root().join("testdata/pods").join(file)).unwrap();
    serde_yaml::from_str(&text).unwrap()
}

pub const POOLS: &str = "namespace: tessera-system\nimage: tessera:test\npools:\n\
- name: a100\n  gpuMemoryMiB: 81920\n  sharing: mps\n  maxGpus: 4\n";

fn config() -> Config {
    Config {
        sidecar_image: "ghcr.io/tessera-dev/tessera:0.1.0".into(),
        pools: Some(Arc::new(PoolsConfig::from_yaml(POOLS).unwrap())),
        ..Config::default()
    }
}

fn policy(sharing: &str, update_mode: &str) -> InferenceAutoscaler {
    serde_json::from_value(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "InferenceAutoscaler",
        "metadata": {"name": "llama3", "namespace": "default"},
        "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "vllm-llama3-deployment-vllm"},
                 "maxReplicas": 4, "ttftSlo": "2s", "targets": {"kvCacheUtilization": 0.7},
                 "gpu": {"sharing": sharing, "updateMode": update_mode}},
        "status": {"recommendation": {"kvCacheMemoryBytes": 8589934592_i64, "gpuMemoryUtilization": 0.42,
                   "gpuMemoryMiB": 20480, "computeFraction": 0.3, "reason": "p95 KV usage 61% of 12 GiB"}}
    }))
    .unwrap()
}

fn placement() -> Placement {
    Placement {
        pool: "a100".into(),
        capacity_pod: "tessera-gpu-a100-0".into(),
        namespace: "tessera-system".into(),
        node: Some("gpu-node-7".into()),
        gpu_uuid: Some("GPU-8f0c2a7e-3b1d-4c55-9e2f-6a7b8c9d0e1f".into()),
        reservation_id: "4b3f1c2e-admission-uid".into(),
        reason: "BestFit".into(),
    }
}

/// Mutates `raw`, applies the patch, checks that a second run leaves the result alone, and returns it.
fn run(raw: &Value, ctx: &Context<'_>) -> (Value, &'static str) {
    let pod: Pod = serde_json::from_value(raw.clone()).unwrap();
    match mutate::mutate(&pod, ctx).unwrap() {
        Mutation::Patch { patch, label, .. } => {
            let mut out = raw.clone();
            json_patch::patch(&mut out, &patch).expect("the patch applies to the pod it was made for");
            let again: Pod = serde_json::from_value(out.clone()).unwrap();
            // Exactly the JSON diff of the whole typed pods: what the webhook skips while diffing (equal
            // containers, volumes, metadata) changes nothing in the patch.
            let whole = json_patch::diff(
                &serde_json::to_value(&pod).unwrap(),
                &serde_json::to_value(&again).unwrap(),
            );
            assert_eq!(patch, whole, "the patch is the whole diff");
            assert_eq!(
                mutate::mutate(&again, ctx).unwrap(),
                Mutation::Unchanged(Unchanged::UpToDate),
                "the webhook is idempotent"
            );
            (out, label)
        }
        Mutation::Unchanged(u) => (raw.clone(), u.label()),
    }
}

fn containers(v: &Value, key: &str) -> Vec<Container> {
    serde_json::from_value(v["spec"][key].clone()).unwrap_or_default()
}

fn vllm_words(v: &Value) -> Vec<String> {
    let pod: Pod = serde_json::from_value(v.clone()).unwrap();
    let i = mutate::vllm_container(&pod).unwrap();
    tessera_webhook::vllm::words(&pod.spec.unwrap().containers[i])
}

struct Row {
    file: &'static str,
    vllm_container: &'static str,
    vllm_port: u16,
    /// The flag (as written in the pod after a managed whole-mode mutation) and its value.
    managed_flag: (&'static str, &'static str),
    /// The user's memory flag before, left alone when the policy does not manage memory.
    user_flag: Option<(&'static str, &'static str)>,
    /// `fractional`, or the reason it is not.
    fractional: &'static str,
    model_dir: Option<&'static str>,
}

const TABLE: &[Row] = &[
    Row {
        file: "production-stack-llama3.yaml",
        vllm_container: "vllm",
        vllm_port: 8000,
        // `vllm/vllm-openai:latest` says no version: the utilization, replaced where the user wrote 0.8.
        managed_flag: ("--gpu-memory-utilization", "0.42"),
        user_flag: Some(("--gpu-memory-utilization", "0.8")),
        fractional: "fractional",
        model_dir: None,
    },
    Row {
        file: "production-stack-qwen7b-tp2.yaml",
        vllm_container: "vllm",
        vllm_port: 8000,
        managed_flag: ("--gpu_memory_utilization", "0.42"),
        user_flag: Some(("--gpu_memory_utilization", "0.9")),
        fractional: "whole_multi_gpu",
        model_dir: None,
    },
    Row {
        file: "kserve-vllm-runtime.yaml",
        vllm_container: "kserve-container",
        vllm_port: 8080,
        // vLLM 0.28 ≥ 0.11: the KV size itself.
        managed_flag: ("--kv-cache-memory-bytes", "8589934592"),
        user_flag: None,
        fractional: "fractional",
        model_dir: Some("/mnt/models"),
    },
    Row {
        file: "kubeai-vllm.yaml",
        vllm_container: "server",
        vllm_port: 8000,
        managed_flag: ("--gpu-memory-utilization", "0.42"),
        user_flag: None,
        fractional: "fractional",
        model_dir: None,
    },
    Row {
        file: "aibrix-qwen-coder.yaml",
        vllm_container: "vllm-openai",
        vllm_port: 8000,
        managed_flag: ("--gpu-memory-utilization", "0.42"),
        user_flag: None,
        fractional: "fractional",
        model_dir: None,
    },
    Row {
        file: "llm-d-qwen3-32b.yaml",
        vllm_container: "vllm",
        vllm_port: 8000,
        managed_flag: ("--gpu-memory-utilization", "0.42"),
        user_flag: Some(("--gpu-memory-utilization", "0.95")),
        fractional: "whole_multi_gpu",
        model_dir: None,
    },
    Row {
        file: "handwritten-shell-env.yaml",
        vllm_container: "server",
        vllm_port: 8080,
        managed_flag: ("--kv-cache-memory-bytes", "8589934592"),
        user_flag: Some(("--gpu-memory-utilization", "${GPU_UTIL}")),
        fractional: "fractional",
        model_dir: Some("/models/mistral-7b"),
    },
];

fn flag(words: &[String], name: &str) -> Option<String> {
    tessera_webhook::vllm::flag_value(words, name)
}

#[test]
fn real_pods_whole_mode() {
    let cfg = config();
    let managed = policy("whole", "Initial");
    let report_only = policy("whole", "Off");
    for row in TABLE {
        let raw = load(row.file);
        let pod: Pod = serde_json::from_value(raw.clone()).unwrap();
        let i = mutate::vllm_container(&pod).unwrap_or_else(|| panic!("{}: no vLLM container", row.file));
        assert_eq!(
            pod.spec.as_ref().unwrap().containers[i].name,
            row.vllm_container,
            "{}",
            row.file
        );

        // Without a policy (or with updateMode Off): the sidecar only; the user's flags stay.
        for ias in [None, Some(&report_only)] {
            let ctx = Context {
                config: &cfg,
                policy: ias,
                placement: None,
            };
            let (out, label) = run(&raw, &ctx);
            assert_eq!(label, "whole", "{}", row.file);
            assert_eq!(vllm_words(&out), vllm_words(&raw), "{}: vLLM untouched", row.file);
            let inits = containers(&out, "initContainers");
            assert_eq!(
                inits.iter().filter(|c| c.name == SIDECAR_NAME).count(),
                1,
                "{}",
                row.file
            );
            let sidecar = inits.last().unwrap();
            assert_eq!(
                sidecar.name, SIDECAR_NAME,
                "{}: the sidecar is the last init container",
                row.file
            );
            assert_eq!(sidecar.restart_policy.as_deref(), Some("Always"));
            let args = sidecar.args.as_ref().unwrap();
            assert_eq!(
                &args[..5],
                [
                    "sidecar",
                    "--vllm-url",
                    &format!("http://127.0.0.1:{}", row.vllm_port),
                    "--listen",
                    "0.0.0.0:9090"
                ],
                "{}",
                row.file
            );
            assert_eq!(
                flag(args, "--model-dir").as_deref(),
                row.model_dir,
                "{}",
                row.file
            );
            if row.model_dir.is_some() {
                let m = &sidecar.volume_mounts.as_ref().unwrap()[0];
                assert_eq!(
                    m.read_only,
                    Some(true),
                    "{}: the model volume is read-only",
                    row.file
                );
            }
            let probe = sidecar.startup_probe.as_ref().unwrap().http_get.as_ref().unwrap();
            assert_eq!(probe.path.as_deref(), Some("/startup"));
            // Other containers are never touched.
            let before = containers(&raw, "containers");
            let after = containers(&out, "containers");
            assert_eq!(
                before, after,
                "{}: whole mode without management changes no container",
                row.file
            );
            if let Some((name, value)) = row.user_flag {
                assert_eq!(
                    flag(&vllm_words(&out), name).as_deref(),
                    Some(value),
                    "{}",
                    row.file
                );
            }
        }

        // Managed (updateMode Initial): the recommendation replaces, never duplicates, the memory flag.
        let ctx = Context {
            config: &cfg,
            policy: Some(&managed),
            placement: None,
        };
        let (out, _) = run(&raw, &ctx);
        let words = vllm_words(&out);
        let (name, value) = row.managed_flag;
        let seen: Vec<&String> = words
            .iter()
            .filter(|w| w.starts_with(name) || w.contains(&format!(" {name}")))
            .collect();
        assert_eq!(seen.len(), 1, "{}: {name} appears once: {words:?}", row.file);
        if row.file.starts_with("handwritten") {
            // The shell script keeps its `${GPU_UTIL}`; Tessera's KV flag went in after the entry point.
            assert!(words.iter().any(|w| w == &format!("{name}={value}")), "{words:?}");
        } else {
            assert_eq!(
                flag(&words, name).as_deref(),
                Some(value),
                "{}: {words:?}",
                row.file
            );
        }
        let sidecar = containers(&out, "initContainers").pop().unwrap();
        assert_eq!(
            flag(sidecar.args.as_ref().unwrap(), "--ttft-slo").as_deref(),
            Some("2s")
        );
        // The replica count's KV target reaches the sidecar's recommendation (its KV floor).
        assert_eq!(
            flag(sidecar.args.as_ref().unwrap(), "--kv-target-utilization").as_deref(),
            Some("0.7")
        );
    }
}

/// The inter-token objective: the InferenceAutoscaler's `itlSlo` where it names one (the controller hands later
/// edits to the running sidecar), else the pod's `tessera.dev/itl-slo` annotation.
#[test]
fn the_specs_inter_token_objective_comes_before_the_annotation() {
    let cfg = config();
    let mut raw = load("production-stack-llama3.yaml");
    raw["metadata"]["annotations"]["tessera.dev/itl-slo"] = json!("200ms");
    let itl = |spec_itl: Option<&str>| {
        let mut p = policy("whole", "Off");
        p.spec.itl_slo = spec_itl.map(str::to_owned);
        let ctx = Context {
            config: &cfg,
            policy: Some(&p),
            placement: None,
        };
        let (out, _) = run(&raw, &ctx);
        flag(
            &containers(&out, "initContainers").pop().unwrap().args.unwrap(),
            "--itl-slo",
        )
    };
    assert_eq!(itl(None).as_deref(), Some("200ms"));
    assert_eq!(itl(Some("100ms")).as_deref(), Some("100ms"));
}

/// The workload class's recommendation knobs reach the sidecar at admission; real-time's are the sidecar's
/// defaults, so a real-time model's pods are unchanged.
#[test]
fn the_workload_class_sets_the_sidecars_recommendation_knobs() {
    let cfg = config();
    let raw = load("production-stack-llama3.yaml");
    let sidecar_args = |class: Option<&str>| {
        let mut p = policy("whole", "Off");
        if let Some(c) = class {
            p.status.as_mut().unwrap().workload_class = Some(c.into());
        }
        let ctx = Context {
            config: &cfg,
            policy: Some(&p),
            placement: None,
        };
        let (out, _) = run(&raw, &ctx);
        containers(&out, "initContainers").pop().unwrap().args.unwrap()
    };
    let plain = sidecar_args(None);
    assert_eq!(sidecar_args(Some("realtime")), plain);
    assert_eq!(flag(&plain, "--window"), None);
    let batch = sidecar_args(Some("batch"));
    assert_eq!(flag(&batch, "--window").as_deref(), Some("1800s"));
    assert_eq!(flag(&batch, "--percentile").as_deref(), Some("0.9"));
    assert_eq!(flag(&batch, "--headroom").as_deref(), Some("0.05"));
    let near = sidecar_args(Some("nearRealtime"));
    assert_eq!(flag(&near, "--window").as_deref(), Some("300s"));
    assert_eq!(flag(&near, "--headroom").as_deref(), Some("0.1"));
    // A name from an older release classifies nothing.
    assert_eq!(sidecar_args(Some("bursty")), plain);
}

/// Sleep mode: a vLLM started with `--enable-sleep-mode` gets the annotations file on its sidecar, and what makes
/// sleep risky on it (`core::sleep::risk`) reaches the sidecar as `--sleep-risk`, which reports it for the
/// controller to weigh against `spec.sleep.allowRisky`.
#[test]
fn sleep_mode_hands_the_sidecar_its_instruction_file_and_the_servers_risks() {
    let cfg = config();
    let p = policy("whole", "Off");
    let ctx = Context {
        config: &cfg,
        policy: Some(&p),
        placement: None,
    };
    let mut raw = load("production-stack-llama3.yaml");
    raw["spec"]["containers"][0]["image"] = json!("vllm/vllm-openai:v0.11.0");
    let cmd = raw["spec"]["containers"][0]["command"].as_array_mut().unwrap();
    cmd.push(json!("--enable-sleep-mode"));
    let (plain, _) = run(&raw, &ctx);
    let args = containers(&plain, "initContainers").pop().unwrap().args.unwrap();
    assert_eq!(
        flag(&args, "--rest-file").as_deref(),
        Some("/etc/tessera/podinfo/annotations")
    );
    assert_eq!(
        flag(&args, "--sleep-risk"),
        None,
        "a plain server in the range: no risk"
    );
    let cmd = raw["spec"]["containers"][0]["command"].as_array_mut().unwrap();
    cmd.extend([
        json!("--enable-lora"),
        json!("--tensor-parallel-size"),
        json!("2"),
    ]);
    let (risky, _) = run(&raw, &ctx);
    let args = containers(&risky, "initContainers").pop().unwrap().args.unwrap();
    let risks: Vec<&String> = args
        .iter()
        .zip(args.iter().skip(1))
        .filter(|(f, _)| *f == "--sleep-risk")
        .map(|(_, v)| v)
        .collect();
    assert_eq!(risks.len(), 2, "{args:?}");
    assert!(
        risks[0].starts_with("LoRA") && risks[1].starts_with("tensor parallel (2 GPUs)"),
        "{risks:?}"
    );
}

/// A model the controller isolated at its ceiling (condition `Isolated` True): its new pods keep their whole GPU,
/// even where a share would be placed; once the condition turns False they share again.
#[test]
fn an_isolated_models_new_pods_keep_whole_gpus() {
    let cfg = config();
    let place = placement();
    let raw = load("production-stack-llama3.yaml");
    let with_isolated = |status: &str| {
        let mut p = policy("fractional", "Off");
        p.status.as_mut().unwrap().conditions = serde_json::from_value(json!([{
            "type": "Isolated", "status": status, "reason": "CoTenantsAtCeiling",
            "message": "at its ceiling (4 replicas) …", "lastTransitionTime": "2026-11-28T00:00:00Z"}]))
        .unwrap();
        p
    };
    let isolated = with_isolated("True");
    let ctx = Context {
        config: &cfg,
        policy: Some(&isolated),
        placement: Some(&place),
    };
    let (out, label) = run(&raw, &ctx);
    assert_eq!(label, "whole_isolated");
    let pod: Pod = serde_json::from_value(out).unwrap();
    let vllm = &pod.spec.as_ref().unwrap().containers[mutate::vllm_container(&pod).unwrap()];
    assert!(
        vllm.resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get("nvidia.com/gpu"))
            .is_some(),
        "an isolated model's pod keeps its whole GPU"
    );
    let shared_again = with_isolated("False");
    let ctx = Context {
        config: &cfg,
        policy: Some(&shared_again),
        placement: Some(&place),
    };
    assert_eq!(run(&raw, &ctx).1, "fractional");
}

#[test]
fn real_pods_fractional_mode() {
    let cfg = config();
    let frac = policy("fractional", "Off");
    let place = placement();
    for row in TABLE {
        let raw = load(row.file);
        let ctx = Context {
            config: &cfg,
            policy: Some(&frac),
            placement: Some(&place),
        };
        let (out, label) = run(&raw, &ctx);
        assert_eq!(label, row.fractional, "{}", row.file);
        let pod: Pod = serde_json::from_value(out.clone()).unwrap();
        let spec = pod.spec.as_ref().unwrap();
        let vllm = &spec.containers[mutate::vllm_container(&pod).unwrap()];
        let gpus = vllm
            .resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get("nvidia.com/gpu"));
        if label != "fractional" {
            assert!(gpus.is_some(), "{}: whole mode keeps the GPU request", row.file);
            assert!(
                spec.affinity
                    .as_ref()
                    .and_then(|a| a.node_affinity.as_ref())
                    .is_none()
                    || raw["spec"]["affinity"].is_object()
            );
            continue;
        }
        assert!(gpus.is_none(), "{}: the GPU request is gone", row.file);
        let env = |n: &str| {
            vllm.env
                .iter()
                .flatten()
                .find(|e| e.name == n)
                .and_then(|e| e.value.clone())
        };
        assert_eq!(
            env("NVIDIA_VISIBLE_DEVICES").as_deref(),
            place.gpu_uuid.as_deref()
        );
        assert_eq!(env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE").as_deref(), Some("30"));
        assert_eq!(
            env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT").as_deref(),
            Some("0=20480M")
        );
        // NVIDIA's device plugin gives MPS clients the daemon's /dev/shm and pipe directory, not hostIPC; a
        // /dev/shm the pod brought is replaced (two mounts on one path would be rejected).
        assert_ne!(spec.host_ipc, Some(true), "{}", row.file);
        let shm: Vec<_> = vllm
            .volume_mounts
            .iter()
            .flatten()
            .filter(|m| m.mount_path == "/dev/shm")
            .collect();
        assert_eq!(shm.len(), 1, "{}: one /dev/shm", row.file);
        assert_eq!(shm[0].name, "tessera-mps-shm");
        assert!(
            spec.volumes.iter().flatten().any(|v| v.name == "tessera-mps-shm"
                && v.host_path.as_ref().map(|h| h.path.as_str()) == Some("/dev/shm")),
            "{}",
            row.file
        );
        let terms = mutate::required_node_terms(spec).expect("a required node affinity");
        assert!(terms.iter().all(|t| {
            t.match_fields
                .iter()
                .flatten()
                .any(|f| f.values.as_deref() == Some(&["gpu-node-7".to_string()][..]))
        }));
        // vLLM is bounded to its share: 20480 / 81920 MiB.
        let words = vllm_words(&out);
        if row.file.starts_with("handwritten") {
            assert_eq!(
                env("GPU_UTIL").as_deref(),
                Some("0.25"),
                "the variable carries the share"
            );
        } else {
            let f = words
                .iter()
                .position(|w| {
                    w.starts_with("--gpu-memory-utilization") || w.starts_with("--gpu_memory_utilization")
                })
                .unwrap();
            let v = words[f]
                .split_once('=')
                .map_or_else(|| words[f + 1].as_str(), |(_, v)| v);
            assert_eq!(v, "0.25", "{}", row.file);
        }
        let ann = pod.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann["tessera.dev/gpu-compute-fraction"], "0.3");
        assert_eq!(ann["tessera.dev/gpu-memory"], "20480");
        assert_eq!(ann["tessera.dev/capacity-pod"], "tessera-gpu-a100-0");
        assert_eq!(ann["tessera.dev/reservation"], "4b3f1c2e-admission-uid");
        assert_eq!(pod.metadata.labels.as_ref().unwrap()["tessera.dev/pool"], "a100");
        let sidecar = containers(&out, "initContainers").pop().unwrap();
        let args = sidecar.args.unwrap();
        assert_eq!(flag(&args, "--gpu-compute-fraction").as_deref(), Some("0.3"));
        assert!(args.contains(&"--gpu-shared".to_string()));
        // The pool's oversubscription (an MPS pool: 2 by default), so the share never drops below what the
        // replica's memory pays for.
        assert_eq!(flag(&args, "--compute-oversubscription").as_deref(), Some("2"));
    }
}

/// `mode: dra`: the same real pods get a claim from the template the controller writes for the allocation
/// (`llama3-gpu-20480mi-300m`), their vLLM bounded to it, no reservation, node pin or GPU UUID (the scheduler picks
/// the device after admission, the kubelet plugin hands it over), and a sidecar with no start-up gate.
#[test]
fn real_pods_dra_mode() {
    let cfg = Config {
        pools: Some(Arc::new(
            PoolsConfig::from_yaml(&POOLS.replace("pools:\n", "mode: dra\npools:\n")).unwrap(),
        )),
        ..config()
    };
    let frac = policy("fractional", "Off");
    for row in TABLE {
        let raw = load(row.file);
        let ctx = Context {
            config: &cfg,
            policy: Some(&frac),
            placement: None,
        };
        let (out, label) = run(&raw, &ctx);
        if row.fractional != "fractional" {
            assert_eq!(label, row.fractional, "{}: left as with capacity pods", row.file);
            continue;
        }
        assert_eq!(label, "dra", "{}", row.file);
        let pod: Pod = serde_json::from_value(out.clone()).unwrap();
        let spec = pod.spec.as_ref().unwrap();
        let claims = spec.resource_claims.as_ref().expect("a pod claim");
        assert_eq!(claims.len(), 1, "{}", row.file);
        assert_eq!(claims[0].name, tessera_dra::POD_CLAIM);
        assert_eq!(
            claims[0].resource_claim_template_name.as_deref(),
            Some("llama3-gpu-20480mi-300m")
        );
        let vllm = &spec.containers[mutate::vllm_container(&pod).unwrap()];
        let res = vllm.resources.as_ref().unwrap();
        assert_eq!(
            res.claims.as_ref().map(|c| c[0].name.as_str()),
            Some(tessera_dra::POD_CLAIM)
        );
        assert!(
            res.limits
                .as_ref()
                .and_then(|l| l.get("nvidia.com/gpu"))
                .is_none(),
            "{}: the whole-GPU request is gone",
            row.file
        );
        assert!(mutate::required_node_terms(spec).is_none() || raw["spec"]["affinity"].is_object());
        let env = |n: &str| vllm.env.iter().flatten().any(|e| e.name == n);
        assert!(
            !env("NVIDIA_VISIBLE_DEVICES") && !env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
            "{}: the plugin's",
            row.file
        );
        let ann = pod.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann["tessera.dev/gpu-memory"], "20480");
        assert!(
            !ann.contains_key("tessera.dev/capacity-pod") && !ann.contains_key("tessera.dev/reservation")
        );
        if !row.file.starts_with("handwritten") {
            let words = vllm_words(&out);
            assert!(
                words.iter().any(|w| w.contains("0.25")),
                "{}: vLLM bounded to 20480 of 81920 MiB: {words:?}",
                row.file
            );
        }
        let args = containers(&out, "initContainers").pop().unwrap().args.unwrap();
        assert_eq!(flag(&args, "--gpu-compute-fraction").as_deref(), Some("0.3"));
        assert!(
            flag(&args, "--gpu-uuid").is_none(),
            "no GPU known at admission: no gate"
        );
    }
    // Without an InferenceAutoscaler nothing writes the template: the pod is left alone, with the reason.
    let raw = load(TABLE.iter().find(|r| r.fractional == "fractional").unwrap().file);
    let ctx = Context {
        config: &cfg,
        policy: None,
        placement: None,
    };
    let (_, label) = run(&raw, &ctx);
    assert_ne!(label, "dra");
}

#[test]
fn invalid_settings_are_denied_with_field_value_and_fix() {
    let cfg = config();
    let raw = load("production-stack-llama3.yaml");
    for (key, value, expect) in [
        ("tessera.dev/gpu-compute-fraction", "1.5", "(0, 1]"),
        ("tessera.dev/gpu-compute-fraction", "0", "(0, 1]"),
        ("tessera.dev/gpu-memory", "10Gi", "MiB"),
        ("tessera.dev/gpu-memory", "-5", "MiB"),
        ("tessera.dev/pool", "h100", "[\"a100\"]"),
        ("tessera.dev/container", "sidecar", "[\"vllm\"]"),
        ("tessera.dev/vllm-version", "eleven", "MAJOR.MINOR"),
        ("tessera.dev/itl-slo", "fast", "duration"),
        ("tessera.dev/inject", "yes", "\"true\""),
    ] {
        let mut v = raw.clone();
        v["metadata"]["annotations"] = json!({ key: value });
        let pod: Pod = serde_json::from_value(v).unwrap();
        let ctx = Context {
            config: &cfg,
            policy: None,
            placement: None,
        };
        let deny = mutate::mutate(&pod, &ctx).unwrap_err();
        let msg = deny.to_string();
        assert!(msg.starts_with(&format!("{key}={value:?}: ")), "{msg}");
        assert!(msg.contains(expect), "{msg}");
    }
}

/// A pod that is no model server, in a namespace opted in as a whole, is what such a namespace holds (a job, a
/// cache): left alone without a warning or an Event. The same pod asking for injection itself is a mistake, said.
#[test]
fn a_pod_without_vllm_is_a_failure_only_when_it_asked_for_injection() {
    let cfg = config();
    let ctx = Context {
        config: &cfg,
        policy: None,
        placement: None,
    };
    let mut plain = load("production-stack-llama3.yaml");
    plain["spec"]["containers"][0]["command"] = json!(["redis-server"]);
    plain["spec"]["containers"][0]["image"] = json!("redis:7");
    let mut asked = plain.clone();
    asked["metadata"]["labels"]["tessera.dev/inject"] = json!("true");
    for (v, failure) in [(plain, false), (asked, true)] {
        let pod: Pod = serde_json::from_value(v).unwrap();
        match mutate::mutate(&pod, &ctx).unwrap() {
            Mutation::Unchanged(u) => {
                assert_eq!(u.label(), "no_vllm_container");
                assert_eq!(u.is_failure(), failure, "{u}");
            }
            other => panic!("expected no_vllm_container, got {other:?}"),
        }
    }
}

#[test]
fn reasons_to_leave_a_pod_alone() {
    let cfg = config();
    let raw = load("production-stack-llama3.yaml");
    let ctx = Context {
        config: &cfg,
        policy: None,
        placement: None,
    };
    let check = |v: Value, want: &str| {
        let pod: Pod = serde_json::from_value(v).unwrap();
        match mutate::mutate(&pod, &ctx).unwrap() {
            Mutation::Unchanged(u) => assert_eq!(u.label(), want, "{u}"),
            other => panic!("expected {want}, got {other:?}"),
        }
    };
    let mut opted_out = raw.clone();
    opted_out["metadata"]["labels"]["tessera.dev/inject"] = json!("false");
    check(opted_out, "opted_out");
    let mut no_vllm = raw.clone();
    no_vllm["spec"]["containers"][0]["command"] = json!(["nginx"]);
    no_vllm["spec"]["containers"][0]["image"] = json!("nginx:1.27");
    check(no_vllm, "no_vllm_container");
    let mut clash = raw.clone();
    clash["spec"]["containers"][0]["ports"][1]["containerPort"] = json!(9090);
    check(clash, "port_conflict");
    let mut cap = raw.clone();
    cap["metadata"]["labels"]["tessera.dev/capacity-pod"] = json!("true");
    check(cap, "capacity_pod");
    // A pod that runs its own sidecar under the injected one's name (as e2e/model.yaml does): a second container
    // of that name would make the API server reject the pod.
    let mut own = raw.clone();
    own["spec"]["containers"].as_array_mut().unwrap().push(
        json!({"name": "tessera-sidecar", "image": "ghcr.io/tessera-dev/tessera:latest",
                     "args": ["sidecar", "--listen", "0.0.0.0:9091"]}),
    );
    check(own, "own_sidecar");
    // The node's network: the sidecar would take the node's port.
    let mut host = raw.clone();
    host["spec"]["hostNetwork"] = json!(true);
    check(host, "host_network");
    // vLLM's port from an environment variable with no literal value: the sidecar cannot know where to scrape.
    let mut from_env = raw.clone();
    from_env["spec"]["containers"][0]["args"] = json!(["--port=$(VLLM_PORT)"]);
    check(from_env.clone(), "port_unknown");
    // The same variable with a literal value is read: the pod is injected, and the sidecar scrapes that port.
    from_env["spec"]["containers"][0]["env"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "VLLM_PORT", "value": "8123"}));
    let (out, label) = run(&from_env, &ctx);
    assert_eq!(label, "whole");
    let sidecar = containers(&out, "initContainers").pop().unwrap();
    let args = sidecar.args.unwrap();
    assert!(args.contains(&"http://127.0.0.1:8123".to_string()), "{args:?}");
    // Fractional without a share known yet, and with an opaque shell script.
    let bare: InferenceAutoscaler = {
        let mut p = policy("fractional", "Off");
        p.status = None;
        p
    };
    let pod: Pod = serde_json::from_value(raw.clone()).unwrap();
    let c2 = Context {
        config: &cfg,
        policy: Some(&bare),
        placement: None,
    };
    assert_eq!(
        mutate::mutate(&pod, &c2).unwrap(),
        Mutation::Unchanged(Unchanged::NoShare(match mutate::plan(&pod, &c2).unwrap() {
            mutate::Plan::Unchanged(Unchanged::NoShare(m)) => m,
            other => panic!("{other:?}"),
        }))
    );
    let mut opaque = raw.clone();
    opaque["spec"]["containers"][0]["command"] = json!(["sh", "-c", "/start-vllm.sh"]);
    opaque["metadata"]["annotations"] = json!({"tessera.dev/container": "vllm"});
    let frac = policy("fractional", "Off");
    let pod: Pod = serde_json::from_value(opaque).unwrap();
    let c3 = Context {
        config: &cfg,
        policy: Some(&frac),
        placement: None,
    };
    assert!(matches!(
        mutate::plan(&pod, &c3).unwrap(),
        mutate::Plan::Unchanged(Unchanged::FlagsUnsettable(_))
    ));
    // A placement on a capacity pod that has no node yet: unchanged (the reservation expires by TTL).
    let pod: Pod = serde_json::from_value(raw).unwrap();
    let pending = Placement {
        node: None,
        ..placement()
    };
    let c4 = Context {
        config: &cfg,
        policy: Some(&frac),
        placement: Some(&pending),
    };
    assert!(matches!(
        mutate::mutate(&pod, &c4).unwrap(),
        Mutation::Unchanged(Unchanged::GpuPending(_))
    ));
}

/// The examples in docs/webhook.md, regenerated from the real production-stack pod so they cannot drift.
#[test]
fn docs_examples_are_current() {
    let cfg = config();
    let raw = load("production-stack-llama3.yaml");
    let managed = policy("whole", "Initial");
    let frac = policy("fractional", "Off");
    let place = placement();
    let (whole, _) = run(
        &raw,
        &Context {
            config: &cfg,
            policy: Some(&managed),
            placement: None,
        },
    );
    let (fractional, _) = run(
        &raw,
        &Context {
            config: &cfg,
            policy: Some(&frac),
            placement: Some(&place),
        },
    );
    let yaml = |v: &Value| serde_yaml::to_string(v).unwrap();
    let diff = |a: &Value, b: &Value| {
        let patch = json_patch::diff(a, b);
        serde_yaml::to_string(&patch).unwrap()
    };
    let blocks = [
        ("before", yaml(&raw)),
        ("whole-patch", diff(&raw, &whole)),
        ("fractional-patch", diff(&raw, &fractional)),
        ("fractional-after", yaml(&fractional)),
    ];
    let path = root().join("docs/webhook.md");
    let mut doc = std::fs::read_to_string(&path).unwrap();
    let bless = std::env::var_os("TESSERA_BLESS").is_some();
    for (name, body) in blocks {
        let start = format!("<!-- generated:{name} -->\n```yaml\n");
        let end = format!("```\n<!-- /generated:{name} -->");
        let s = doc
            .find(&start)
            .unwrap_or_else(|| panic!("docs/webhook.md lacks the {name} block"));
        let e = doc[s..].find(&end).unwrap() + s;
        let current = &doc[s + start.len()..e];
        if current != body {
            assert!(
                bless,
                "docs/webhook.md's {name} example is stale: run TESSERA_BLESS=1 cargo test -p tessera-webhook --test pods"
            );
            doc.replace_range(s + start.len()..e, &body);
        }
    }
    if bless {
        std::fs::write(&path, doc).unwrap();
    }
}

/// The AdmissionReview the latency benchmark posts (`load-tests/webhook-review.json`): the same real pod.
#[test]
fn benchmark_review_is_current() {
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "6f1e0d4c-bench", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"},
                    "namespace": "default", "operation": "CREATE",
                    "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
                    "object": load("production-stack-llama3.yaml"), "dryRun": false}
    });
    let body = format!("{}\n", serde_json::to_string(&review).unwrap());
    let path = root().join("load-tests/webhook-review.json");
    if std::env::var_os("TESSERA_BLESS").is_some() {
        std::fs::write(&path, &body).unwrap();
    }
    assert_eq!(
        std::fs::read_to_string(&path).unwrap_or_default(),
        body,
        "load-tests/webhook-review.json is stale: run TESSERA_BLESS=1 cargo test -p tessera-webhook --test pods"
    );
}
