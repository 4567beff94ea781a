//! The injected sidecar container: its flags (the pod's objectives, the GPU it was placed on), its probes and
//! its locked-down security context.

use super::*;

use k8s_openapi::api::core::v1::EmptyDirVolumeSource;
use tessera_pool::capacity::field_env;

/// The sidecar's variable holding its namespace's objective token (`tessera sidecar --objective-token`).
pub const OBJECTIVE_TOKEN_ENV: &str = "TESSERA_OBJECTIVE_TOKEN";

/// The longest a gated pod waits for its GPU's start-up lease before it starts anyway (the sidecar's
/// `--gate-max-wait`, passed explicitly so that it and the startup probe below are one decision).
pub const GATE_MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(45 * 60);
/// The startup probe's period, seconds.
pub const STARTUP_PROBE_PERIOD_SECS: i32 = 2;
/// How long past [`GATE_MAX_WAIT`] the startup probe still waits (lease reads and writes, a slow API server) before
/// the kubelet restarts the sidecar.
pub const STARTUP_PROBE_SLACK: std::time::Duration = std::time::Duration::from_secs(5 * 60);
/// The emptyDir where a gated sidecar keeps when its pod began to wait (`--gate-state-dir`): it outlives a restart
/// of the sidecar, so the wait's bound holds across restarts.
pub const GATE_STATE_VOLUME: &str = "tessera-gate";
/// Where the sidecar mounts it.
pub const GATE_STATE_DIR: &str = "/var/run/tessera-gate";

/// The startup probe's failure threshold: the probe's budget covers the longest wait and its slack, so the kubelet
/// never restarts a sidecar that is still inside its bound (issue 53, M8).
pub fn startup_probe_failures() -> i32 {
    let budget = (GATE_MAX_WAIT + STARTUP_PROBE_SLACK).as_secs();
    i32::try_from(budget.div_ceil(STARTUP_PROBE_PERIOD_SECS.unsigned_abs().into())).unwrap_or(i32::MAX)
}

/// The model directory to hand the sidecar (`--model-dir`) and the vLLM volume mount it lives on.
fn model_volume(c: &Container) -> Option<(String, VolumeMount)> {
    let model = vllm::model(c)?;
    if !model.starts_with('/') {
        return None;
    }
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| {
            let base = m.mount_path.trim_end_matches('/');
            model == base || model.starts_with(&format!("{base}/"))
        })
        .max_by_key(|m| m.mount_path.len())?;
    Some((
        model,
        VolumeMount {
            name: mount.name.clone(),
            mount_path: mount.mount_path.clone(),
            sub_path: mount.sub_path.clone(),
            sub_path_expr: mount.sub_path_expr.clone(),
            read_only: Some(true),
            ..VolumeMount::default()
        },
    ))
}

/// The recommendation's knobs from the model's workload class (`status.workloadClass`; docs/policies.md,
/// "Workload classes"): its history window, percentile and headroom. Real-time's are the sidecar's own
/// defaults, so a real-time model (or one not classified yet) gets no flag and its pods are unchanged. Applied at
/// admission: a class change reaches the pods created after it.
pub fn class_flags(policy: Option<&InferenceAutoscaler>) -> Vec<String> {
    use tessera_core::class::{ClassPolicy, WorkloadClass};
    let class = policy
        .and_then(|p| p.status.as_ref())
        .and_then(|s| s.workload_class.as_deref())
        .and_then(WorkloadClass::from_name)
        .filter(|c| *c != WorkloadClass::Realtime);
    let Some(class) = class else {
        return Vec::new();
    };
    let b = ClassPolicy::of(class);
    vec![
        "--window".into(),
        format!("{}s", b.history_window.as_secs()),
        "--percentile".into(),
        b.percentile.to_string(),
        "--headroom".into(),
        b.headroom.to_string(),
    ]
}

/// The injected sidecar (see `docs/webhook.md`, "The injected container"), placed as the last init container.
pub fn sidecar(
    pod: &Pod,
    ctx: &Context<'_>,
    fractional: Option<(&FractionalNeed, Option<(&Placement, &str)>)>,
) -> Container {
    let cfg = ctx.config;
    let vllm_c = vllm_container(pod).map(|i| &pod_spec(pod).containers[i]);
    // `plan` admitted the pod unchanged where the port cannot be read, so this always reads it.
    let vllm_port = vllm_c
        .and_then(|c| vllm::port(c).ok())
        .unwrap_or(vllm::DEFAULT_PORT);
    let mut args = vec![
        "sidecar".to_string(),
        "--vllm-url".into(),
        format!("http://127.0.0.1:{vllm_port}"),
        "--listen".into(),
        format!("0.0.0.0:{}", cfg.sidecar_port),
    ];
    if let Some(slo) = ctx.policy.and_then(|p| p.spec.ttft_slo.as_ref()) {
        args.extend(["--ttft-slo".into(), slo.clone()]);
    }
    // The InferenceAutoscaler's `itlSlo` first (the controller hands later edits over at run time); the pod's
    // annotation where the spec names none.
    let itl_slo = ctx.policy.and_then(|p| p.spec.itl_slo.as_ref());
    if let Some(slo) = itl_slo.or(annotations(pod).get(ANNOTATION_ITL_SLO)) {
        args.extend(["--itl-slo".into(), slo.clone()]);
    }
    // The replica count's KV target: the recommended cache holds one max_model_len sequence below it, so one
    // request never asks for another replica (core::recommend, rule 4).
    if let Some(u) = ctx
        .policy
        .and_then(|p| p.spec.targets.kv_cache_utilization)
        .filter(|u| u.is_finite() && *u > 0.0 && *u <= 1.0)
    {
        args.extend(["--kv-target-utilization".into(), u.to_string()]);
    }
    args.extend(class_flags(ctx.policy));
    let mut env = vec![
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        field_env("POD_UID", "metadata.uid"),
        field_env("NODE_NAME", "spec.nodeName"),
    ];
    // The token the controller must send to hand this sidecar an objective: this namespace's only, so a tenant
    // that reads it from its pod can steer nothing it could not already steer through its InferenceAutoscaler.
    let namespace = pod
        .metadata
        .namespace
        .as_deref()
        .or(ctx.policy.and_then(|p| p.metadata.namespace.as_deref()));
    if let (Some(key), Some(ns)) = (cfg.objective_key.as_deref(), namespace) {
        env.push(EnvVar {
            name: OBJECTIVE_TOKEN_ENV.into(),
            value: Some(key.token_for(ns)),
            value_from: None,
        });
    }
    if let Some((need, placed)) = fractional {
        args.extend([
            "--gpu-compute-fraction".into(),
            format_fraction(need.compute_milli),
            "--gpu-shared".into(),
        ]);
        // The start-up gate: tenants of one GPU start one at a time (docs/fractional-gpus.md); its lease lives
        // beside the capacity pod. A DRA claim's device is chosen by the scheduler after admission, so such a pod
        // has no GPU to gate on here.
        if let Some((placement, uuid)) = placed {
            args.extend([
                "--gpu-uuid".into(),
                uuid.to_string(),
                "--gate-namespace".into(),
                placement.namespace.clone(),
                "--gate-max-wait".into(),
                humantime::format_duration(GATE_MAX_WAIT).to_string(),
                "--gate-state-dir".into(),
                GATE_STATE_DIR.into(),
            ]);
        }
        if let Some(pool) = cfg.pools.as_deref().and_then(|p| p.pool(&need.pool)) {
            args.extend(["--gpu-memory-mib".into(), pool.gpu_memory_mib.to_string()]);
            // The compute share is never recommended below what the replica's memory pays for in this pool.
            args.extend([
                "--compute-oversubscription".into(),
                pool.compute_oversubscription().to_string(),
            ]);
        }
        if let Some((_, uuid)) = placed {
            env.push(EnvVar {
                name: "NVIDIA_VISIBLE_DEVICES".into(),
                value: Some(uuid.to_string()),
                value_from: None,
            });
        }
    }
    let gated = matches!(fractional, Some((_, Some(_))));
    let mut mounts: Option<Vec<VolumeMount>> = None;
    if let Some((dir, mount)) = vllm_c.and_then(model_volume) {
        args.extend(["--model-dir".into(), dir]);
        mounts = Some(vec![mount]);
    }
    if gated {
        mounts.get_or_insert_with(Vec::new).push(VolumeMount {
            name: GATE_STATE_VOLUME.into(),
            mount_path: GATE_STATE_DIR.into(),
            ..VolumeMount::default()
        });
    }
    // Sleep mode: the controller's instruction arrives in the pod's annotations (docs/webhook.md, "Sleep mode").
    if let Some(c) = vllm_c.filter(|c| super::sleep::sleep_mode(c)) {
        let (flags, mount) = super::sleep::sidecar_parts();
        args.extend(flags);
        // What makes sleep risky on this server (LoRA, tensor parallel, an untested vLLM): the sidecar reports
        // it and the controller sleeps it only with spec.sleep.allowRisky.
        for risk in tessera_core::sleep::risk::from_command(&crate::vllm::words(c), c.image.as_deref()) {
            args.extend(["--sleep-risk".into(), risk]);
        }
        mounts.get_or_insert_with(Vec::new).push(mount);
    }
    let probe = |path: &str, period: i32, failures: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(i32::from(cfg.sidecar_port)),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Probe::default()
    };
    Container {
        name: SIDECAR_NAME.into(),
        image: Some(cfg.sidecar_image.clone()),
        // The image's lean binary for this role (it links the sidecar alone): it runs beside every replica, and
        // in the one `tessera` binary the code pages it touches cost about 5 MiB of RSS more per pod.
        command: Some(vec![SIDECAR_COMMAND.into()]),
        args: Some(args),
        // A native sidecar: starts before the app containers, runs beside them, never blocks pod completion.
        restart_policy: Some("Always".into()),
        ports: Some(vec![ContainerPort {
            name: Some(SIDECAR_PORT_NAME.into()),
            container_port: i32::from(cfg.sidecar_port),
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        }]),
        env: Some(env),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity(cfg.sidecar_cpu.clone())),
                ("memory".to_string(), Quantity(cfg.sidecar_memory.clone())),
            ])),
            limits: Some(BTreeMap::from([(
                "memory".to_string(),
                Quantity(cfg.sidecar_memory.clone()),
            )])),
            ..ResourceRequirements::default()
        }),
        // The start-up gate: the app containers start once this passes, which may wait for the GPU (other
        // tenants loading first) up to GATE_MAX_WAIT; the probe's budget covers that and its slack. A sidecar
        // restarted all the same resumes its wait from the emptyDir (GATE_STATE_DIR), never from zero.
        startup_probe: Some(probe(
            "/startup",
            STARTUP_PROBE_PERIOD_SECS,
            startup_probe_failures(),
        )),
        liveness_probe: Some(probe("/live", 10, 3)),
        volume_mounts: mounts,
        security_context: Some(tessera_runtime::security::restricted()),
        ..Container::default()
    }
}

/// Puts the sidecar last among the init containers, replacing an earlier copy (never two).
pub(super) fn inject_sidecar(
    pod: &mut Pod,
    ctx: &Context<'_>,
    fractional: Option<(&FractionalNeed, Option<(&Placement, &str)>)>,
) {
    let container = sidecar(pod, ctx, fractional);
    let sleeps = vllm_container(pod).is_some_and(|i| super::sleep::sleep_mode(&pod_spec(pod).containers[i]));
    if sleeps {
        super::sleep::apply(pod, ctx.config.sidecar_port);
    }
    if matches!(fractional, Some((_, Some(_)))) {
        let volumes = pod_spec_mut(pod).volumes.get_or_insert_with(Vec::new);
        if !volumes.iter().any(|v| v.name == GATE_STATE_VOLUME) {
            volumes.push(Volume {
                name: GATE_STATE_VOLUME.into(),
                // A few bytes; in memory, so nothing of it reaches the node's disk.
                empty_dir: Some(EmptyDirVolumeSource {
                    medium: Some("Memory".into()),
                    size_limit: Some(Quantity("1Mi".into())),
                }),
                ..Volume::default()
            });
        }
    }
    let inits = pod_spec_mut(pod).init_containers.get_or_insert_with(Vec::new);
    inits.retain(|c| c.name != SIDECAR_NAME);
    inits.push(container);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;
    use std::sync::Arc;
    use tessera_runtime::token::ObjectiveKey;

    fn pod(namespace: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: namespace.map(str::to_owned),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "vllm".into(),
                    image: Some("vllm/vllm-openai:v0.11.0".into()),
                    args: Some(vec!["--model".into(), "m".into()]),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    fn token_env(c: &Container) -> Option<String> {
        c.env
            .iter()
            .flatten()
            .find(|e| e.name == OBJECTIVE_TOKEN_ENV)
            .and_then(|e| e.value.clone())
    }

    #[test]
    fn each_sidecar_gets_its_own_namespaces_objective_token() {
        let key = Arc::new(ObjectiveKey::from_bytes(&[b'k'; 32], "test").unwrap());
        let cfg = Config {
            objective_key: Some(key.clone()),
            ..Config::default()
        };
        let ctx = Context {
            config: &cfg,
            policy: None,
            placement: None,
        };
        let a = token_env(&sidecar(&pod(Some("team-a")), &ctx, None)).unwrap();
        assert_eq!(a, key.token_for("team-a"));
        assert_ne!(a, key.token_for("team-b"));
        assert_eq!(
            token_env(&sidecar(&pod(None), &ctx, None)),
            None,
            "no namespace known: no token rather than another namespace's"
        );
        let plain = Config::default();
        let ctx = Context {
            config: &plain,
            ..ctx
        };
        assert_eq!(
            token_env(&sidecar(&pod(Some("team-a")), &ctx, None)),
            None,
            "no key, no token"
        );
    }

    /// Issue 53, M8: a gated sidecar's wait is bounded across restarts (its start is kept in an emptyDir) and
    /// inside the startup probe's budget (the probe used to restart it at 30 min, under the 45 min bound).
    #[test]
    fn a_gated_sidecar_waits_inside_its_probe_and_across_restarts() {
        let need = FractionalNeed {
            pool: "a100".into(),
            compute_milli: 250,
            memory_mib: 10_240,
            model: "team-a/llama".into(),
            priority: 0,
            reservation: None,
        };
        let place = Placement {
            pool: "a100".into(),
            capacity_pod: "cap-0".into(),
            namespace: "tessera-gpus".into(),
            node: Some("n1".into()),
            gpu_uuid: Some("GPU-1".into()),
            reservation_id: "r".into(),
            reason: "test".into(),
        };
        let cfg = Config::default();
        let ctx = Context {
            config: &cfg,
            policy: None,
            placement: Some(&place),
        };
        let mut p = pod(Some("team-a"));
        inject_sidecar(&mut p, &ctx, Some((&need, Some((&place, "GPU-1")))));
        inject_sidecar(&mut p, &ctx, Some((&need, Some((&place, "GPU-1")))));
        let spec = p.spec.unwrap();
        let c = spec.init_containers.unwrap().pop().unwrap();
        let probe = c.startup_probe.unwrap();
        let budget = i64::from(probe.period_seconds.unwrap()) * i64::from(probe.failure_threshold.unwrap());
        let args = c.args.unwrap();
        let flag = |f: &str| args.iter().position(|a| a == f).map(|i| args[i + 1].clone());
        let max_wait = humantime::parse_duration(&flag("--gate-max-wait").unwrap()).unwrap();
        assert!(
            budget >= i64::try_from((max_wait + STARTUP_PROBE_SLACK).as_secs()).unwrap(),
            "the probe's {budget} s must cover the {max_wait:?} wait"
        );
        assert_eq!(flag("--gate-state-dir").as_deref(), Some(GATE_STATE_DIR));
        let mount = c
            .volume_mounts
            .unwrap()
            .into_iter()
            .find(|m| m.name == GATE_STATE_VOLUME)
            .unwrap();
        assert_eq!(mount.mount_path, GATE_STATE_DIR);
        let vols: Vec<_> = spec
            .volumes
            .unwrap()
            .into_iter()
            .filter(|v| v.name == GATE_STATE_VOLUME)
            .collect();
        assert_eq!(vols.len(), 1, "added once");
        assert!(
            vols[0].empty_dir.is_some(),
            "outlives a container restart, not the pod"
        );
        // A whole-GPU pod has no gate: no state volume.
        let mut whole = pod(Some("team-a"));
        inject_sidecar(&mut whole, &ctx, None);
        assert!(whole.spec.unwrap().volumes.is_none());
    }
}
