//! The injected sidecar container: its flags (the pod's objectives, the GPU it was placed on), its probes and
//! its locked-down security context.

use super::*;

use tessera_pool::capacity::field_env;

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
    fractional: Option<(&FractionalNeed, &Placement, &str)>,
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
    if let Some((need, placement, uuid)) = fractional {
        args.extend([
            "--gpu-compute-fraction".into(),
            format_fraction(need.compute_milli),
            "--gpu-shared".into(),
            // The start-up gate: tenants of one GPU start one at a time (docs/fractional-gpus.md); its lease
            // lives beside the capacity pod.
            "--gpu-uuid".into(),
            uuid.to_string(),
            "--gate-namespace".into(),
            placement.namespace.clone(),
        ]);
        if let Some(pool) = cfg.pools.as_deref().and_then(|p| p.pool(&need.pool)) {
            args.extend(["--gpu-memory-mib".into(), pool.gpu_memory_mib.to_string()]);
        }
        env.push(EnvVar {
            name: "NVIDIA_VISIBLE_DEVICES".into(),
            value: Some(uuid.to_string()),
            value_from: None,
        });
    }
    let mut mounts: Option<Vec<VolumeMount>> = None;
    if let Some((dir, mount)) = vllm_c.and_then(model_volume) {
        args.extend(["--model-dir".into(), dir]);
        mounts = Some(vec![mount]);
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
        // The start-up gate: the app containers start once this passes (up to 10 minutes; the GPU start-up
        // lease of the next issue makes it wait for neighbours that are loading).
        // The start-up gate may make a pod wait for its GPU (other tenants loading first): 30 min before kubelet
        // restarts the sidecar, which then waits on.
        startup_probe: Some(probe("/startup", 2, 900)),
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
    fractional: Option<(&FractionalNeed, &Placement, &str)>,
) {
    let container = sidecar(pod, ctx, fractional);
    let sleeps = vllm_container(pod).is_some_and(|i| super::sleep::sleep_mode(&pod_spec(pod).containers[i]));
    if sleeps {
        super::sleep::apply(pod, ctx.config.sidecar_port);
    }
    let inits = pod_spec_mut(pod).init_containers.get_or_insert_with(Vec::new);
    inits.retain(|c| c.name != SIDECAR_NAME);
    inits.push(container);
}
