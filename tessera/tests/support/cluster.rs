//! What the tiers against a real API server share (tessera/tests/control_plane.rs, tessera/tests/real_node.rs):
//! a kube client from a kubeconfig file, and polling until the cluster reaches a state.

use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use kube::config::{KubeConfigOptions, Kubeconfig};

/// A kube client from the kubeconfig at `path` (one the tier's script wrote).
pub async fn client(path: &Path) -> kube::Client {
    let kc = Kubeconfig::read_from(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("a client config from the kubeconfig");
    kube::Client::try_from(config).expect("a kube client")
}

/// Polls `f` every 200 ms until it returns `Some`, failing with `what` after `within`.
pub async fn eventually<T, Fut>(what: &str, within: Duration, mut f: impl FnMut() -> Fut) -> T
where
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs helm (installed by scripts/check-chart.sh into .tools/bin) against the cluster of `kubeconfig`.
pub fn helm(kubeconfig: &Path, args: &[&str]) -> std::process::Output {
    let helm = super::workspace().join(".tools/bin/helm");
    assert!(
        helm.exists(),
        "{} is missing: scripts/check-chart.sh installs it (scripts/test.sh runs that first)",
        helm.display()
    );
    std::process::Command::new(helm)
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .current_dir(super::workspace())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run helm")
}

/// The stdout of a command that must have succeeded (`what` names it in the failure, with both outputs).
pub fn succeeded(out: &std::process::Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A JSON merge patch of `name` through `api`, which must succeed.
pub async fn merge_patch<K>(api: &kube::Api<K>, name: &str, patch: serde_json::Value) -> K
where
    K: Clone + k8s_openapi::serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(patch),
    )
    .await
    .unwrap_or_else(|e| panic!("patch {name}: {e}"))
}
