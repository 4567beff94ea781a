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
