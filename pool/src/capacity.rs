//! The capacity pod: one per GPU, holding the whole device for the pool's tenants.
//!
//! It requests one of the pool's extended resource (so the device plugin hands it a GPU and the scheduler
//! counts the GPU as taken), runs `tessera gpu-agent` with `hostPID` (NVML reports host PIDs; the agent maps
//! them to pods through `/proc/<pid>/cgroup`), and publishes the GPU's UUID on itself as
//! `tessera.dev/gpu-uuid`. While Pending it is what makes the cluster autoscaler or Karpenter add a node.
//!
//! The agent learns its own pod from the downward API (`POD_NAME`, `POD_NAMESPACE`), and its readiness probe
//! is the agent's `/ready`, which passes only once the UUID is published: a capacity pod is Ready exactly when
//! its GPU is identified, matching the pool manager's rule of not placing on running, unidentified GPUs.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction, ObjectFieldSelector, Pod, PodSpec, Probe,
    ResourceRequirements, SecurityContext, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::config::{PoolSpec, PoolsConfig};
pub use super::state::capacity_pod_name;
use super::state::{Reservation, encode_reservations};
use super::{
    ANNOTATION_RESERVATIONS, ANNOTATION_SHARING, KARPENTER_DO_NOT_DISRUPT, LABEL_CAPACITY_POD, LABEL_POOL,
};

/// The gpu-agent's user and group: not the image's 65532, which every injected sidecar runs as (see the capacity
/// pod's security context).
pub const GPU_AGENT_UID: i64 = 65533;

/// The port the gpu-agent serves `/metrics`, `/v1/gpus`, `/live` and `/ready` on (its `--listen` default).
pub const AGENT_PORT: i32 = 9091;

/// An environment variable taken from the pod's own `field_path` (the downward API: `metadata.name`,
/// `spec.nodeName`, …).
pub fn field_env(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: field_path.to_string(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

/// Builds the capacity pod for `pool`, created already holding `reservations` (so the reservation that
/// needed a new GPU is recorded in the same write that creates it).
pub fn capacity_pod(cfg: &PoolsConfig, pool: &PoolSpec, name: &str, reservations: &[Reservation]) -> Pod {
    let labels = BTreeMap::from([
        (LABEL_POOL.to_string(), pool.name.clone()),
        (LABEL_CAPACITY_POD.to_string(), "true".to_string()),
        (
            "app.kubernetes.io/name".to_string(),
            "tessera-capacity".to_string(),
        ),
        ("app.kubernetes.io/managed-by".to_string(), "tessera".to_string()),
    ]);
    let mut annotations = BTreeMap::from([
        (
            ANNOTATION_RESERVATIONS.to_string(),
            encode_reservations(reservations),
        ),
        (ANNOTATION_SHARING.to_string(), pool.sharing.as_str().to_string()),
    ]);
    if !reservations.is_empty() {
        annotations.insert(KARPENTER_DO_NOT_DISRUPT.to_string(), "true".to_string());
    }
    let gpu = BTreeMap::from([(pool.resource_name.clone(), Quantity("1".to_string()))]);
    let http_probe = |path: &str, period: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_string()),
            port: IntOrString::String("metrics".to_string()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        ..Probe::default()
    };
    let container = Container {
        name: "gpu-agent".to_string(),
        ports: Some(vec![ContainerPort {
            name: Some("metrics".to_string()),
            container_port: AGENT_PORT,
            ..ContainerPort::default()
        }]),
        readiness_probe: Some(http_probe("/ready", 5)),
        liveness_probe: Some(Probe {
            failure_threshold: Some(6),
            ..http_probe("/live", 10)
        }),
        image: Some(cfg.image.clone()),
        args: Some(vec!["gpu-agent".to_string()]),
        env: Some(vec![
            field_env("POD_NAME", "metadata.name"),
            field_env("POD_NAMESPACE", "metadata.namespace"),
            field_env("NODE_NAME", "spec.nodeName"),
            EnvVar {
                name: "TESSERA_POOL".into(),
                value: Some(pool.name.clone()),
                ..EnvVar::default()
            },
            EnvVar {
                name: "TESSERA_SHARING".into(),
                value: Some(pool.sharing.as_str().to_string()),
                ..EnvVar::default()
            },
        ]),
        // Like every Tessera container (docs/install.md): non-root, read-only root, no capabilities, seccomp. NVML
        // lists a GPU's processes and /proc/<pid>/cgroup is world-readable, so hostPID is the only privilege, and
        // the agent runs as a user of its own: with hostPID it sees every process of the node, and under the
        // image's user (65532, every injected sidecar's) it could read their /proc/<pid>/environ and signal them.
        security_context: Some(SecurityContext {
            run_as_user: Some(GPU_AGENT_UID),
            run_as_group: Some(GPU_AGENT_UID),
            ..tessera_runtime::security::restricted()
        }),
        resources: Some(ResourceRequirements {
            // Extended resources must have requests == limits; setting limits implies the request. The agent
            // holds a few KiB per process on its GPU: 128 MiB bounds it with room.
            limits: Some({
                let mut limits = gpu;
                limits.insert("memory".to_string(), Quantity("128Mi".to_string()));
                limits
            }),
            requests: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("50m".to_string())),
                ("memory".to_string(), Quantity("64Mi".to_string())),
            ])),
            ..ResourceRequirements::default()
        }),
        ..Container::default()
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(cfg.namespace.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![container],
            host_pid: Some(true),
            node_selector: (!pool.node_selector.is_empty()).then(|| pool.node_selector.clone()),
            priority_class_name: pool.priority_class_name.clone(),
            service_account_name: cfg.service_account_name.clone(),
            // GPU nodes are commonly tainted so that only GPU work lands there.
            tolerations: Some(vec![Toleration {
                key: Some(pool.resource_name.clone()),
                operator: Some("Exists".to_string()),
                effect: Some("NoSchedule".to_string()),
                ..Toleration::default()
            }]),
            restart_policy: Some("Always".to_string()),
            termination_grace_period_seconds: Some(10),
            ..PodSpec::default()
        }),
        status: None,
    }
}

/// A spare capacity pod for `pool`: as [`capacity_pod`] with no reservation, gated by [`crate::SPARE_GATE`] so it
/// is not scheduled (no GPU, no node scale-up) until the leader lifts the gate.
pub fn spare_capacity_pod(cfg: &PoolsConfig, pool: &PoolSpec, name: &str) -> Pod {
    let mut pod = capacity_pod(cfg, pool, name, &[]);
    if let Some(spec) = pod.spec.as_mut() {
        spec.scheduling_gates = Some(vec![k8s_openapi::api::core::v1::PodSchedulingGate {
            name: crate::SPARE_GATE.to_string(),
        }]);
    }
    pod
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::state::CapacityGpu;

    #[test]
    fn the_pod_requests_one_gpu_and_is_labelled() {
        let cfg = PoolsConfig::from_yaml(include_str!("../../deploy/examples/gpu-pools.yaml")).unwrap();
        let pool = &cfg.pools[0];
        let r = Reservation {
            id: "r1".into(),
            model: "m".into(),
            compute_milli: 250,
            memory_mib: 10240,
            priority: 0,
            created_at: 1,
            pod: None,
            evicted_at: None,
            asleep_since: None,
        };
        let name = capacity_pod_name(&pool.name, 0);
        assert_eq!(name, "tessera-gpu-a100-80gb-0");
        let pod = capacity_pod(&cfg, pool, &name, std::slice::from_ref(&r));
        let spec = pod.spec.as_ref().unwrap();
        let c = &spec.containers[0];
        assert_eq!(c.args.as_deref(), Some(&["gpu-agent".to_string()][..]));
        assert_eq!(
            c.resources.as_ref().unwrap().limits.as_ref().unwrap()["nvidia.com/gpu"].0,
            "1"
        );
        assert_eq!(spec.host_pid, Some(true));
        // Bounded and unprivileged beyond hostPID, as docs/install.md promises.
        assert_eq!(
            c.resources.as_ref().unwrap().limits.as_ref().unwrap()["memory"].0,
            "128Mi"
        );
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.run_as_non_root, Some(true));
        // With hostPID, not the sidecars' user (the image's 65532): it cannot read their environment or signal them.
        assert_eq!((sc.run_as_user, sc.run_as_group), (Some(65533), Some(65533)));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop.as_deref(),
            Some(&["ALL".to_string()][..])
        );
        // The agent finds its own pod through the downward API, and is ready once the UUID is published.
        let env = c.env.as_ref().unwrap();
        for (var, field) in [
            ("POD_NAME", "metadata.name"),
            ("POD_NAMESPACE", "metadata.namespace"),
        ] {
            let e = env.iter().find(|e| e.name == var).unwrap();
            let from = e.value_from.as_ref().unwrap().field_ref.as_ref().unwrap();
            assert_eq!(from.field_path, field);
        }
        let ready = c.readiness_probe.as_ref().unwrap().http_get.as_ref().unwrap();
        assert_eq!(ready.path.as_deref(), Some("/ready"));
        assert_eq!(c.ports.as_ref().unwrap()[0].container_port, AGENT_PORT);
        assert_eq!(
            spec.node_selector.as_ref().unwrap()["nvidia.com/gpu.product"],
            "NVIDIA-A100-SXM4-80GB"
        );
        let ann = pod.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann[KARPENTER_DO_NOT_DISRUPT], "true");
        // What we build, we read back.
        let gpu = CapacityGpu::from_pod(&pod, &pool.name).unwrap();
        assert_eq!(gpu.reservations.unwrap(), vec![r]);
        assert!(CapacityGpu::from_pod(&pod, "l4").is_none());
        // For checking by hand against the Kubernetes schema:
        // TESSERA_DUMP_CAPACITY_POD=/tmp/pod.yaml cargo test … && kubernetes-validate --strict /tmp/pod.yaml
        if let Ok(path) = std::env::var("TESSERA_DUMP_CAPACITY_POD") {
            let mut v = serde_json::to_value(&pod).unwrap();
            v["apiVersion"] = "v1".into();
            v["kind"] = "Pod".into();
            std::fs::write(path, serde_yaml::to_string(&v).unwrap()).unwrap();
        }
    }
}
