//! PID → pod, from `/proc/<pid>/cgroup` (pure): the kubelet's cgroup path carries the pod UID.

use std::path::Path;

/// A process's pod, read from its cgroup path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    /// The pod's `metadata.uid`, with dashes (the systemd driver writes underscores; they are turned back).
    pub uid: String,
    /// `guaranteed`, `burstable` or `besteffort` (from the kubepods hierarchy).
    pub qos: &'static str,
    /// The container ID, runtime prefix (`cri-containerd-`, `docker-`, `crio-`) and `.scope` removed.
    pub container_id: Option<String>,
}

/// Finds the pod of a process from the contents of its `/proc/<pid>/cgroup`.
///
/// Handles every layout the kubelet produces:
/// - cgroup v1 (`N:controllers:/path` lines) and v2 (`0::/path`);
/// - the cgroupfs driver (`/kubepods/burstable/pod<uid>/<container-id>`; guaranteed pods sit directly under
///   `/kubepods/`) and the systemd driver (`/kubepods.slice/kubepods-burstable.slice/
///   kubepods-burstable-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope`);
/// - nested prefixes (kind/k3d nodes put everything under another cgroup, e.g. `/kubelet.slice/…` or
///   `/docker/<id>/kubepods/…`).
///
/// Returns `None` for a process in no pod (host daemons, the CUDA MPS server).
pub fn pod_from_cgroup(content: &str) -> Option<PodRef> {
    content.lines().find_map(|line| {
        // hierarchy-ID:controller-list:path — the path itself may contain ':'.
        let mut parts = line.splitn(3, ':');
        let (_, _, path) = (parts.next()?, parts.next()?, parts.next()?);
        pod_from_cgroup_path(path.trim())
    })
}

/// Finds the pod in one cgroup path (see [`pod_from_cgroup`]).
pub fn pod_from_cgroup_path(path: &str) -> Option<PodRef> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let start = segments.iter().position(|s| s.contains("kubepods"))?;
    let rest = &segments[start..];
    let (pod_idx, uid) = rest
        .iter()
        .enumerate()
        .find_map(|(i, seg)| pod_uid_of_segment(seg).map(|u| (i, u)))?;
    let qos_text = rest[..=pod_idx].join("/");
    let qos = if qos_text.contains("besteffort") {
        "besteffort"
    } else if qos_text.contains("burstable") {
        "burstable"
    } else {
        "guaranteed"
    };
    let container_id = rest.get(pod_idx + 1).and_then(|s| container_id_of_segment(s));
    Some(PodRef {
        uid,
        qos,
        container_id,
    })
}

/// `pod<uid>` (cgroupfs) or `kubepods[-qos]-pod<uid_with_underscores>.slice` (systemd).
fn pod_uid_of_segment(seg: &str) -> Option<String> {
    let raw = if let Some(s) = seg.strip_suffix(".slice") {
        let at = s.rfind("-pod")?;
        &s[at + 4..]
    } else {
        seg.strip_prefix("pod")?
    };
    let uid = raw.replace('_', "-");
    is_pod_uid(&uid).then_some(uid)
}

/// A pod UID: an RFC 4122 UUID (API pods), or 32 hex digits (static pods' config hash).
fn is_pod_uid(s: &str) -> bool {
    let hex = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_hexdigit());
    let parts: Vec<&str> = s.split('-').collect();
    match parts.as_slice() {
        [a, b, c, d, e] => {
            [a.len(), b.len(), c.len(), d.len(), e.len()] == [8, 4, 4, 4, 12] && parts.iter().all(|p| hex(p))
        }
        [one] => one.len() == 32 && hex(one),
        _ => false,
    }
}

/// `cri-containerd-<id>.scope`, `docker-<id>.scope`, `crio-<id>.scope`, or a bare `<id>` (cgroupfs).
fn container_id_of_segment(seg: &str) -> Option<String> {
    let s = seg.strip_suffix(".scope").unwrap_or(seg);
    // conmon (CRI-O's monitor) is not the container and never uses the GPU.
    if s.starts_with("crio-conmon-") {
        return None;
    }
    let id = ["cri-containerd-", "docker-", "crio-", "containerd-"]
        .iter()
        .find_map(|p| s.strip_prefix(p))
        .unwrap_or(s);
    (id.len() >= 12 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_string())
}

/// Reads `<proc_root>/<pid>/cgroup` and finds the pod (`None`: gone, unreadable, or in no pod).
pub fn pod_of_pid(proc_root: &Path, pid: u32) -> Option<PodRef> {
    let content = std::fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup")).ok()?;
    pod_from_cgroup(&content)
}
