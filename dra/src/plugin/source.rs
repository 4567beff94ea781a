//! Where the plugin reads a claim from: the API server in a cluster ([`KubeClaims`]), a fake in tests. The
//! kubelet sends only a claim's namespace, name and UID; the allocation (device, consumed capacity, share) is in
//! the claim's status, which the plugin reads afresh for each claim it has not prepared yet.

use std::future::Future;

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;

/// Reads a ResourceClaim by namespace and name: `Ok(None)` when there is none, `Err` with the client's message
/// when the API server could not say. The caller bounds each read with `--api-timeout`.
pub trait ClaimSource: Send + Sync + 'static {
    /// The claim `namespace/name`, if it exists.
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<ResourceClaim>, String>> + Send;
}

/// Claims read from the API server.
#[derive(Clone)]
pub struct KubeClaims(pub kube::Client);

impl std::fmt::Debug for KubeClaims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KubeClaims")
    }
}

impl ClaimSource for KubeClaims {
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, String> {
        Api::<ResourceClaim>::namespaced(self.0.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(|e| e.to_string())
    }
}
