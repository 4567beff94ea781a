//! GPU pool objects as the pool manager writes them, for tests that seed the in-memory API server.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

/// The capacity pods' namespace in these tests.
pub const POOL_NS: &str = "tessera-system";

/// Unix seconds now.
pub fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs()
}

/// Capacity pod `tessera-gpu-p-<slot>` of pool `p`, running on `node-<slot>` with GPU `GPU-<slot>`, holding
/// `reservations` (from [`reservation`]).
pub fn capacity_pod(slot: usize, reservations: &[Value]) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": format!("tessera-gpu-p-{slot}"),
                        "labels": {"tessera.dev/pool": "p", "tessera.dev/capacity-pod": "true"},
                        "annotations": {
                            "tessera.dev/reservations": json!({"version": 1, "reservations": reservations}).to_string(),
                            "tessera.dev/gpu-uuid": format!("GPU-{slot}"),
                            "karpenter.sh/do-not-disrupt": "true"}},
           "spec": {"nodeName": format!("node-{slot}"), "containers": []},
           "status": {"phase": "Running", "podIP": "127.0.0.1"}})
}

/// Puts capacity pod `tessera-gpu-p-0` on `api` holding `reservations` (id, model, milli compute), made now.
pub fn put_one_gpu(api: &super::apiserver::ApiServer, reservations: &[(&str, &str, u32)]) {
    let list: Vec<Value> = reservations
        .iter()
        .map(|(id, model, milli)| reservation(id, model, *milli))
        .collect();
    api.put(super::apiserver::PODS, POOL_NS, capacity_pod(0, &list));
}

/// A reservation of `milli` compute and 20,000 MiB for `model`, made now.
pub fn reservation(id: &str, model: &str, milli: u32) -> Value {
    json!({"id": id, "model": model, "computeMilli": milli, "memoryMiB": 20000, "priority": 0,
           "createdAt": now_s()})
}

/// A model pod's `tessera sidecar` with its start-up gate on (fast lease timings), for pod `pod_ns/pod_name` on GPU
/// `uuid` (none: a whole-GPU pod, gate open), its Leases in `gate_ns`, its vLLM expected on `vllm_port`.
pub fn gate_sidecar(
    kubeconfig: &std::path::Path,
    gate_ns: &str,
    pod_ns: &str,
    pod_name: &str,
    uuid: Option<&str>,
    vllm_port: u16,
) -> super::Tessera {
    let url = format!("http://127.0.0.1:{vllm_port}");
    let mut args = vec![
        "sidecar",
        "--vllm-url",
        &url,
        "--listen",
        "127.0.0.1:0",
        "--no-nvml",
        "--gate-namespace",
        gate_ns,
        "--gate-lease-duration",
        "2s",
        "--gate-retry-period",
        "200ms",
        "--drain-period",
        "0s",
    ];
    if let Some(u) = uuid {
        args.extend(["--gpu-uuid", u]);
    }
    super::Tessera::start_with_env(
        &args,
        &[
            ("KUBECONFIG", kubeconfig.to_str().unwrap_or_default()),
            ("POD_NAME", pod_name),
            ("POD_NAMESPACE", pod_ns),
        ],
    )
}
