//! Where a replica's sidecar answers: its pod's IP and the sidecar port (the workload's annotation, else the
//! controller's default). Read by the round's gather (ready pods) and by sleep mode (a sleeping pod is not ready).

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

/// Pod annotation that overrides the sidecar port for one workload.
pub const SIDECAR_PORT_ANNOTATION: &str = "tessera.dev/sidecar-port";

/// A pod's sidecar base URL if the pod is ready (Ready condition true, has an IP, not terminating).
pub fn ready_pod_url(pod: &Pod, default_port: u16) -> Option<(String, String)> {
    if !crate::pod_ready(pod) {
        return None;
    }
    pod_url(pod, default_port)
}

/// A pod's sidecar base URL, ready or not (a sleeping replica is not ready), if it has an IP and is not
/// terminating.
pub fn pod_url(pod: &Pod, default_port: u16) -> Option<(String, String)> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let ip = pod.status.as_ref()?.pod_ip.as_ref().filter(|ip| !ip.is_empty())?;
    let port = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SIDECAR_PORT_ANNOTATION))
        .and_then(|p| p.parse::<u16>().ok())
        .unwrap_or(default_port);
    // IPv6 pod IPs need brackets in a URL.
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.clone()
    };
    Some((pod.name_any(), format!("http://{host}:{port}")))
}
