//! Sleep mode (`docs/webhook.md`, "Sleep mode"): for a vLLM container started with `--enable-sleep-mode`, the pod
//! gets what lets the sidecar perform and check a sleep, and lets the kubelet restart a replica whose wake failed:
//! - a downward-API volume with the pod's annotations, which the sidecar reads (`--rest-file`): the controller's
//!   instruction (`tessera.dev/rest`) reaches the pod only through its own annotations, never a network call;
//! - vLLM's liveness probe on the sidecar's `/tessera/v1/live`, which fails once a sleep or a wake failed its check
//!   (the state metric, the memory, the canary answer);
//! - vLLM's readiness probe on the sidecar's `/ready`, which fails while the replica falls asleep, sleeps or wakes
//!   (vLLM's own `/health` answers 200 while asleep): the Service and the activator then treat a sleeper as not
//!   ready, and the activator asks its sidecar to wake it (`--sidecar-port`).
//!
//! Not done here (stated in the docs): binding vLLM to 127.0.0.1 with the sidecar fronting the pod port, which
//! would keep vLLM's development endpoints from other pods on the pod network. Until then they are reachable on
//! the pod IP by whatever the namespace's network policy lets in; the activator never forwards them.

use super::*;
use k8s_openapi::api::core::v1::{DownwardAPIVolumeFile, DownwardAPIVolumeSource};

/// The volume holding the pod's annotations.
pub const PODINFO_VOLUME: &str = "tessera-podinfo";
/// Where the sidecar mounts it.
pub const PODINFO_DIR: &str = "/etc/tessera/podinfo";
/// The annotations file the sidecar reads (`--rest-file`).
pub const REST_FILE: &str = "/etc/tessera/podinfo/annotations";

/// Whether the vLLM container runs with sleep mode (`--enable-sleep-mode`, either spelling, or `=true`).
pub fn sleep_mode(c: &Container) -> bool {
    vllm::words(c).iter().any(|w| {
        let w = w.trim_matches(|ch| ch == '"' || ch == '\'');
        match w.split_once('=') {
            Some((f, v)) => {
                matches!(f, "--enable-sleep-mode" | "--enable_sleep_mode") && v.eq_ignore_ascii_case("true")
            }
            None => matches!(w, "--enable-sleep-mode" | "--enable_sleep_mode"),
        }
    })
}

/// The sidecar's flags and mount for sleep mode.
pub fn sidecar_parts() -> (Vec<String>, VolumeMount) {
    (
        vec!["--rest-file".into(), REST_FILE.into()],
        VolumeMount {
            name: PODINFO_VOLUME.into(),
            mount_path: PODINFO_DIR.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        },
    )
}

/// Adds the annotations volume and points the vLLM container's liveness and readiness probes at the sidecar
/// (replacing the pod's own: a replica whose wake answered wrongly must restart, and a sleeping one must not be
/// ready, whatever else its probes checked).
pub fn apply(pod: &mut Pod, sidecar_port: u16) {
    let Some(vi) = vllm_container(pod) else {
        return;
    };
    let spec = pod_spec_mut(pod);
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    if !volumes.iter().any(|v| v.name == PODINFO_VOLUME) {
        volumes.push(Volume {
            name: PODINFO_VOLUME.into(),
            downward_api: Some(DownwardAPIVolumeSource {
                items: Some(vec![DownwardAPIVolumeFile {
                    path: "annotations".into(),
                    field_ref: Some(ObjectFieldSelector {
                        field_path: "metadata.annotations".into(),
                        ..ObjectFieldSelector::default()
                    }),
                    ..DownwardAPIVolumeFile::default()
                }]),
                ..DownwardAPIVolumeSource::default()
            }),
            ..Volume::default()
        });
    }
    let probe = |path: &str, period: i32, failures: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(i32::from(sidecar_port)),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Probe::default()
    };
    spec.containers[vi].liveness_probe = Some(probe("/tessera/v1/live", 5, 2));
    // Every second, once: a woken replica turns ready within about a second of its canary passing.
    spec.containers[vi].readiness_probe = Some(probe("/ready", 1, 1));
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;

    fn pod(args: &[&str]) -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "vllm".into(),
                    image: Some("vllm/vllm-openai:v0.11.0".into()),
                    args: Some(args.iter().map(|s| s.to_string()).collect()),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn sleep_mode_gets_the_annotations_file_and_the_sidecar_liveness() {
        for args in [
            ["--enable-sleep-mode"],
            ["--enable_sleep_mode"],
            ["--enable-sleep-mode=True"],
        ] {
            assert!(sleep_mode(&pod(&args).spec.unwrap().containers[0]), "{args:?}");
        }
        assert!(!sleep_mode(
            &pod(&["--enable-sleep-mode=false"]).spec.unwrap().containers[0]
        ));
        let mut p = pod(&["--model", "/m", "--enable-sleep-mode"]);
        apply(&mut p, 9090);
        apply(&mut p, 9090);
        let spec = p.spec.unwrap();
        let vols = spec.volumes.unwrap();
        assert_eq!(vols.len(), 1, "added once");
        let items = vols[0].downward_api.as_ref().unwrap().items.as_ref().unwrap();
        assert_eq!(
            items[0].field_ref.as_ref().unwrap().field_path,
            "metadata.annotations"
        );
        let live = spec.containers[0]
            .liveness_probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap();
        assert_eq!(
            (live.path.as_deref(), &live.port),
            (Some("/tessera/v1/live"), &IntOrString::Int(9090))
        );
        let ready = spec.containers[0].readiness_probe.as_ref().unwrap();
        assert_eq!(ready.http_get.as_ref().unwrap().path.as_deref(), Some("/ready"));
        let (flags, mount) = sidecar_parts();
        assert_eq!(flags, ["--rest-file", REST_FILE]);
        assert!(REST_FILE.starts_with(&mount.mount_path));
    }
}
