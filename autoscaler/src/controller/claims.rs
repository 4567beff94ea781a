//! `gpuPools.mode: dra`: the controller's half of DRA claims — the `ResourceClaimTemplate` for each model's
//! allocation in force, and the `GpuClaimsAllocated` condition that says why a replica's claim fits nowhere.
//!
//! The allocation in force is folded as with capacity pods (`super::allocation`); in DRA mode it is also written as
//! a template named by its content (`tessera_dra::claim::template_name`), the name the webhook points new pods at.
//! A new recommendation is a new template; the pods move onto it the way they move onto a new allocation (Recreate,
//! drifted pods first on scale-down), so nothing here rolls anything. Templates of this model that are no longer in
//! force are deleted once they are older than [`KEEP_OLD`] (a pod admitted just before the change still gets its
//! claim made from its template).
//!
//! A replica whose claim the scheduler cannot allocate stays Pending. The condition names what it needs, the most
//! room any GPU has, and what would make room, from the pool manager's index (`tessera_pool::DraView`) through the
//! core packer — with a Warning Event when it first turns False.
//!
//! RBAC: get/create/patch/list/delete on `resourceclaimtemplates` (resource.k8s.io) in the models' namespaces.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::events::EventType;
use tessera_dra::claim::{ClaimShape, template, template_name};
use tessera_dra::index::{DraIndex, Fit};
use tracing::{info, warn};

use super::context::{Context, publish};
use crate::crd::{AllocationStatus, InferenceAutoscaler, Sharing};

/// The condition type.
pub const GPU_CLAIMS_ALLOCATED: &str = "GpuClaimsAllocated";
/// The field manager of template writes.
const FIELD_MANAGER: &str = "tessera-controller";
/// How long a template no longer in force is kept.
const KEEP_OLD: Duration = Duration::from_secs(600);

/// The claim shape new pods of `obj` get: the allocation in force, as the webhook reads it.
pub fn shape_in_force(allocation: &AllocationStatus) -> Option<ClaimShape> {
    let f = allocation.in_force.as_ref()?;
    Some(ClaimShape {
        memory_mib: u64::try_from(f.gpu_memory_mib).ok().filter(|m| *m > 0)?,
        compute_milli: tessera_core::pack::compute_milli(f.compute_fraction)?,
    })
}

/// Step 7b in DRA mode: the template for the allocation in force exists, and the condition on the model's claims.
/// `None` when DRA mode is off or the model does not share GPUs.
pub async fn apply(
    ctx: &Context,
    obj: &InferenceAutoscaler,
    allocation: &AllocationStatus,
    pods: &[Pod],
) -> Option<(bool, &'static str, String)> {
    let fractional = obj
        .spec
        .gpu
        .as_ref()
        .is_some_and(|g| g.sharing == Sharing::Fractional);
    if !ctx.consolidation.dra.enabled() || !fractional {
        return None;
    }
    let ns = obj.namespace()?;
    let model = obj.name_any();
    let Some(shape) = shape_in_force(allocation) else {
        return Some((
            false,
            "NoAllocationInForce",
            "no allocation is in force yet (status.allocation): new pods get no claim template and run whole \
             until the recommendation settles, or set gpu.memory and gpu.computeFraction"
                .into(),
        ));
    };
    let name = template_name(&model, shape);
    ensure_template(ctx, &ns, &model, shape, &name).await;
    let (ok, reason, message) = condition(ctx.consolidation.dra.index().as_deref(), &model, shape, pods);
    let was_false = obj
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == GPU_CLAIMS_ALLOCATED))
        .is_some_and(|c| c.status == "False");
    if !ok && !was_false {
        warn!(%message, "a claim fits nowhere");
        publish(ctx, obj, EventType::Warning, reason, "AllocateClaim", &message).await;
    }
    Some((ok, reason, message))
}

/// Writes the template unless this process already knows it exists; then lets go of old ones of the model.
async fn ensure_template(ctx: &Context, ns: &str, model: &str, shape: ClaimShape, name: &str) {
    let key = format!("{ns}/{name}");
    let known = ctx
        .dra_templates
        .lock()
        .map(|t| t.contains(&key))
        .unwrap_or(false);
    if known {
        return;
    }
    let api: Api<ResourceClaimTemplate> = Api::namespaced(ctx.client.clone(), ns);
    let t = template(ns, model, shape);
    let body = serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": t.metadata, "spec": t.spec,
    });
    match api
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
    {
        Ok(_) => {
            info!(template = %key, memory_mib = shape.memory_mib, compute_milli = shape.compute_milli, "claim template written");
            if let Ok(mut t) = ctx.dra_templates.lock() {
                t.insert(key);
            }
            let now = (ctx.clock)();
            collect_old(&api, model, name, now).await;
        }
        Err(e) => warn!(template = %key, error = %e, "cannot write the claim template; new pods wait for it"),
    }
}

/// Deletes `model`'s templates other than `keep` created more than [`KEEP_OLD`] ago.
async fn collect_old(api: &Api<ResourceClaimTemplate>, model: &str, keep: &str, now: std::time::SystemTime) {
    let selector = format!("{}={model}", tessera_dra::LABEL_MODEL);
    let Ok(list) = api.list(&ListParams::default().labels(&selector)).await else {
        return;
    };
    for t in list.items {
        let name = t.name_any();
        let old = t
            .metadata
            .creation_timestamp
            .as_ref()
            .and_then(|c| std::time::SystemTime::from(c.0).checked_add(KEEP_OLD))
            .is_some_and(|until| until < now);
        if name != keep && old {
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => info!(template = %name, "deleted a claim template no longer in force"),
                Err(e) => warn!(template = %name, error = %e, "cannot delete an old claim template"),
            }
        }
    }
}

/// The condition for `model`'s pods: a Pending pod that the scheduler could not place is explained from the index
/// (`None` until the pool manager's first pass built one). Pure: the caller reads the index.
fn condition(
    index: Option<&DraIndex>,
    model: &str,
    shape: ClaimShape,
    pods: &[Pod],
) -> (bool, &'static str, String) {
    let unschedulable: Vec<&str> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending"))
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| {
                    c.iter().any(|c| {
                        c.type_ == "PodScheduled"
                            && c.status == "False"
                            && c.reason.as_deref() == Some("Unschedulable")
                    })
                })
        })
        .filter_map(|p| p.metadata.name.as_deref())
        .collect();
    if unschedulable.is_empty() {
        return (
            true,
            "Allocated",
            format!(
                "every scheduled pod's claim was allocated ({} MiB, {}m compute per replica)",
                shape.rounded().memory_mib,
                shape.rounded().compute_milli
            ),
        );
    }
    let names = unschedulable.join(", ");
    match index.map(|i| i.fit(model, shape)) {
        Some(Fit::Nowhere(why)) => (
            false,
            "NoGpuRoom",
            format!("pods {names} stay Pending: their claim {why}"),
        ),
        Some(Fit::Room(at)) => (
            false,
            "Unschedulable",
            format!(
                "pods {names} are unschedulable although {at} has room for their claim: the scheduler's message \
                 on the pod says what else holds them (node selectors, taints, other resources)"
            ),
        ),
        None => (
            false,
            "Unschedulable",
            format!("pods {names} are unschedulable; the GPU index is not built yet"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::AllocationValues;

    #[test]
    fn the_template_shape_is_the_allocation_in_force_as_the_webhook_reads_it() {
        let mut a = AllocationStatus::default();
        assert_eq!(shape_in_force(&a), None, "nothing in force: no template");
        a.in_force = Some(AllocationValues {
            gpu_memory_mib: 20480,
            compute_fraction: 0.3,
            kv_cache_memory_bytes: None,
            gpu_memory_utilization: None,
        });
        let shape = shape_in_force(&a).expect("in force");
        assert_eq!((shape.memory_mib, shape.compute_milli), (20480, 300));
        // The webhook names the template from the same values (webhook/tests/pods.rs, real_pods_dra_mode).
        assert_eq!(template_name("llama3", shape), "llama3-gpu-20480mi-300m");
    }
}
