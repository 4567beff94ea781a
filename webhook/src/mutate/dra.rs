//! `mode: dra`: a fractional pod gets a DRA claim instead of a reservation on a capacity pod.
//!
//! The webhook reserves nothing: the pod is pointed at the ResourceClaimTemplate sized for its model's allocation
//! (`tessera_dra::claim::template_name`, the name the controller wrote the template under), the vLLM container
//! references the claim, its memory flags are bounded to the share as with capacity pods, and the whole-GPU
//! request goes. The kube-scheduler then books memory and compute on a device of a `gpu.tessera.dev` slice, and
//! Tessera's kubelet plugin gives the container its GPU and MPS limits (CDI). No capacity-pod annotation, node
//! pin or GPU UUID is written: the device is chosen after admission.

use k8s_openapi::api::core::v1::{Pod, ResourceRequirements};
use tessera_dra::claim::{ClaimShape, pod_claims, template_name};
use tessera_pool::LABEL_POOL;

use super::{
    ANNOTATION_COMPUTE, ANNOTATION_MEMORY, Context, FractionalNeed, Unchanged, bound_vllm, format_fraction,
    pod_spec_mut, vllm_container,
};

/// Whether fractions are written as DRA claims in this webhook's pools.
pub(super) fn on(ctx: &Context<'_>) -> bool {
    super::writes_claims(ctx.config)
}

/// Whether `pod` already carries Tessera's claim (the webhook ran on it before).
pub(super) fn claimed(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.name == tessera_dra::POD_CLAIM))
}

/// Points `pod` at its model's claim template and bounds its vLLM to the share.
pub(super) fn apply(
    pod: &mut Pod,
    ctx: &Context<'_>,
    need: &FractionalNeed,
    notes: &mut Vec<String>,
) -> Result<(), Unchanged> {
    let Some(pool) = ctx.config.pools.as_deref().and_then(|p| p.pool(&need.pool)) else {
        return Err(Unchanged::NoPool(format!("no pool named {:?}", need.pool)));
    };
    // The template is the controller's: without an InferenceAutoscaler nothing writes it, and the pod would wait
    // for a claim forever.
    let Some(model) = ctx.policy.and_then(|p| p.metadata.name.as_deref()) else {
        return Err(Unchanged::NoShare(
            "in DRA mode a fractional pod needs an InferenceAutoscaler: its controller writes the claim \
             template the pod is pointed at"
                .into(),
        ));
    };
    let Some(vi) = vllm_container(pod) else {
        return Err(Unchanged::NoVllmContainer { asked: true });
    };
    bound_vllm(pod, vi, ctx, need, pool, notes)?;
    let shape = ClaimShape {
        memory_mib: need.memory_mib,
        compute_milli: need.compute_milli,
    };
    let template = template_name(model, shape);
    let (pod_claim, container_claim) = pod_claims(&template);
    let spec = pod_spec_mut(pod);
    let claims = spec.resource_claims.get_or_insert_with(Vec::new);
    claims.retain(|c| c.name != pod_claim.name);
    claims.push(pod_claim);
    let resources = spec.containers[vi]
        .resources
        .get_or_insert_with(ResourceRequirements::default);
    let refs = resources.claims.get_or_insert_with(Vec::new);
    if !refs.iter().any(|c| c.name == container_claim.name) {
        refs.push(container_claim);
    }
    let ann = pod.metadata.annotations.get_or_insert_with(Default::default);
    ann.insert(ANNOTATION_COMPUTE.into(), format_fraction(need.compute_milli));
    ann.insert(ANNOTATION_MEMORY.into(), need.memory_mib.to_string());
    pod.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(LABEL_POOL.into(), need.pool.clone());
    notes.push(format!("claim from template {template}"));
    Ok(())
}
