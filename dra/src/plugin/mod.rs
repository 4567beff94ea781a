//! `tessera dra-plugin`: the kubelet plugin of the driver [`DRIVER`](crate::DRIVER), one per GPU node (a
//! DaemonSet), speaking the kubelet's published gRPC APIs (vendored in `proto/`, with their license).
//!
//! ```text
//!  kubelet ─plugin watcher─▶ <registry dir>/gpu.tessera.dev-reg.sock  Registration: GetInfo, NotifyRegistrationStatus
//!          ─DRA manager────▶ <plugin dir>/dra.sock   v1.DRAPlugin: NodePrepareResources, NodeUnprepareResources
//!                               │  reads the ResourceClaim (its allocation: device, consumed capacity, share)
//!                               ▼
//!               <cdi dir>/gpu.tessera.dev-<claim uid>.json   CDI spec: the GPU and the claim's MPS limits
//!               <plugin dir>/checkpoint.json                 what is prepared, read back at start
//!  API server ◀── the node's ResourceSlice (server-side apply), unless --no-publish
//! ```
//!
//! - [`inventory`]: the node's GPUs, from flags (NVML discovery is a follow-up: it needs a GPU node to test on);
//! - [`prepare`]: what the two DRA calls do, per claim, bounded and idempotent; [`checkpoint`]: restart safety;
//! - [`cdi`]: the CDI spec of a prepared claim; [`service`]: the gRPC services; [`server`]: their sockets;
//! - [`publish`]: the node's slice; [`source`]: where claims are read from (a fake in tests: [`testing`]);
//! - [`health`]: `/live` and `/ready` (registered with the kubelet, slice published) for the DaemonSet's probes.

pub mod cdi;
pub mod checkpoint;
pub mod error;
pub mod health;
pub mod inventory;
pub mod prepare;
pub mod publish;
pub mod server;
pub mod service;
pub mod source;
pub mod testing;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use error::PluginError;
use inventory::{Inventory, InventorySpec, Sharing};
use prepare::{Driver, DriverConfig};

/// The messages, servers and clients generated from the kubelet's protos.
pub mod pb {
    /// `k8s.io/kubelet/pkg/apis/dra/v1`: the DRA service.
    #[allow(missing_docs, clippy::all, clippy::pedantic, missing_debug_implementations)]
    pub mod dra {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
    }
    /// `k8s.io/kubelet/pkg/apis/pluginregistration/v1`: plugin registration.
    #[allow(missing_docs, clippy::all, clippy::pedantic, missing_debug_implementations)]
    pub mod registration {
        tonic::include_proto!("pluginregistration");
    }
}

const KUBELET: &str = "Kubelet";
const NODE: &str = "Node inventory";
const API: &str = "Kubernetes API";
const LIMITS: &str = "Limits";
const MPS: &str = "MPS";

/// `tessera dra-plugin`'s flags.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The plugin's directory: its DRA socket (dra.sock) and its checkpoint. Give the kubelet's path on the node
    /// (mount it at the same path in the container): the kubelet dials the socket path the plugin reports.
    #[arg(help_heading = KUBELET, long, env = "TESSERA_DRA_PLUGIN_DIR", default_value = "/var/lib/kubelet/plugins/gpu.tessera.dev")]
    pub plugin_dir: PathBuf,
    /// The kubelet's plugin registry directory, where the registration socket (gpu.tessera.dev-reg.sock) goes.
    #[arg(help_heading = KUBELET, long, env = "TESSERA_DRA_REGISTRY_DIR", default_value = "/var/lib/kubelet/plugins_registry")]
    pub registry_dir: PathBuf,
    /// Where the CDI specs of prepared claims are written (the container runtime's CDI directory).
    #[arg(help_heading = KUBELET, long, env = "TESSERA_CDI_DIR", default_value = "/var/run/cdi")]
    pub cdi_dir: PathBuf,

    /// This node's name (the downward API's spec.nodeName): its slice's pool, and the allocations prepared here.
    #[arg(help_heading = NODE, long, env = "NODE_NAME")]
    pub node: String,
    /// How many GPUs the node has (devices gpu-0 … gpu-<N-1>). Without it, the Node's allocatable
    /// `--gpu-resource` (what a device plugin advertised) is read at start.
    #[arg(help_heading = NODE, long, env = "TESSERA_GPUS")]
    pub gpus: Option<u32>,
    /// The extended resource whose allocatable count stands in for `--gpus` when that is not given.
    #[arg(help_heading = NODE, long, env = "TESSERA_GPU_RESOURCE", default_value = "nvidia.com/gpu")]
    pub gpu_resource: String,
    /// Each GPU's memory, MiB (the pool's gpuMemoryMiB).
    #[arg(help_heading = NODE, long, env = "TESSERA_GPU_MEMORY_MIB")]
    pub gpu_memory_mib: u64,
    /// MiB of each GPU never handed out (the driver and CUDA contexts; the pool's memoryHeadroomMiB).
    #[arg(help_heading = NODE, long, env = "TESSERA_MEMORY_HEADROOM_MIB", default_value_t = 1024)]
    pub memory_headroom_mib: u64,
    /// GPUs' worth of compute shares one GPU hands out (the pool's computeOversubscription; default 2.0 under
    /// MPS, else 1.0; above 1.0 only under MPS).
    #[arg(help_heading = NODE, long, env = "TESSERA_COMPUTE_OVERSUBSCRIPTION")]
    pub compute_oversubscription: Option<f64>,
    /// How tenants share a GPU: mps sets each claim's memory and compute limits; time-slicing and none give
    /// the GPU alone.
    #[arg(help_heading = NODE, long, env = "TESSERA_SHARING", value_enum, default_value_t = Sharing::Mps)]
    pub sharing: Sharing,
    /// The GPUs' UUIDs in index order (comma-separated; `nvidia-smi -L`): NVIDIA_VISIBLE_DEVICES names them.
    /// Without them the index is used, right only where the plugin's indices are the driver's.
    #[arg(help_heading = NODE, long, env = "TESSERA_GPU_UUIDS", value_delimiter = ',')]
    pub gpu_uuids: Vec<String>,
    /// The GPUs' product name, published as the devices' productName attribute.
    #[arg(help_heading = NODE, long, env = "TESSERA_GPU_PRODUCT")]
    pub product: Option<String>,

    /// Do not publish the node's ResourceSlice (the pool manager or someone else does).
    #[arg(help_heading = API, long, env = "TESSERA_NO_PUBLISH")]
    pub no_publish: bool,
    /// Where `/live` and `/ready` are served (the DaemonSet's probes).
    #[arg(help_heading = API, long, env = "TESSERA_HEALTH_LISTEN", default_value = "0.0.0.0:9097")]
    pub health_listen: std::net::SocketAddr,
    /// How often the node's slice is applied again (restoring one the kubelet removed while unregistered).
    #[arg(help_heading = API, long, env = "TESSERA_PUBLISH_INTERVAL", default_value = "1m", value_parser = tessera_runtime::serve::nonzero_duration)]
    pub publish_interval: Duration,
    /// Bound on each read of a ResourceClaim; a claim not read in time gets an error the kubelet retries.
    #[arg(help_heading = API, long, env = "TESSERA_API_TIMEOUT", default_value = "10s", value_parser = tessera_runtime::serve::nonzero_duration)]
    pub api_timeout: Duration,

    /// Claims looked at in one NodePrepareResources call; the rest get an error and the kubelet asks again.
    #[arg(help_heading = LIMITS, long, env = "TESSERA_MAX_CLAIMS_PER_CALL", default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_claims_per_call: u32,
    /// Claims held prepared on this node at once.
    #[arg(help_heading = LIMITS, long, env = "TESSERA_MAX_PREPARED", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_prepared: u32,

    /// The MPS pipe directory on the node (CUDA_MPS_PIPE_DIRECTORY of its MPS control daemon), mounted in clients.
    #[arg(help_heading = MPS, long, env = "TESSERA_MPS_PIPE_DIR", default_value = "/tmp/nvidia-mps")]
    pub mps_pipe_dir: String,
    /// The MPS log directory on the node (CUDA_MPS_LOG_DIRECTORY), mounted in clients.
    #[arg(help_heading = MPS, long, env = "TESSERA_MPS_LOG_DIR", default_value = "/var/log/nvidia-mps")]
    pub mps_log_dir: String,
    /// The node directory that is the MPS control daemon's /dev/shm, mounted at /dev/shm in clients.
    #[arg(help_heading = MPS, long, env = "TESSERA_MPS_SHM_DIR", default_value = "/dev/shm")]
    pub mps_shm_dir: String,
}

impl Args {
    /// The inventory the flags describe, with `gpus` GPUs (`--gpus`, or the Node's count: [`node_gpus`]).
    pub fn inventory(&self, gpus: u32) -> InventorySpec {
        InventorySpec {
            node: self.node.clone(),
            gpus,
            memory_mib: self.gpu_memory_mib,
            headroom_mib: self.memory_headroom_mib,
            compute_oversubscription: self.compute_oversubscription,
            sharing: self.sharing,
            uuids: self.gpu_uuids.clone(),
            product: self.product.clone(),
        }
    }

    /// Where the driver writes and what it takes on.
    pub fn driver(&self) -> DriverConfig {
        DriverConfig {
            cdi_dir: self.cdi_dir.clone(),
            checkpoint: self.plugin_dir.join(checkpoint::FILE),
            mps: cdi::MpsPaths {
                pipe_dir: self.mps_pipe_dir.clone(),
                log_dir: self.mps_log_dir.clone(),
                shm_dir: self.mps_shm_dir.clone(),
            },
            max_claims_per_call: self.max_claims_per_call as usize,
            max_prepared: self.max_prepared as usize,
            api_timeout: self.api_timeout,
        }
    }
}

/// Runs the plugin until SIGTERM or Ctrl-C: both sockets served, the node's slice published unless
/// `--no-publish`. On a signal it stops at once (no drain: the kubelet's calls are retried).
pub async fn run(args: Args) -> Result<(), PluginError> {
    // With --gpus the flags alone make the inventory: a wrong one fails at once, naming itself, before the API
    // is reached (and whether or not it can be).
    let given = args
        .gpus
        .map(|n| Inventory::new(&args.inventory(n)))
        .transpose()?;
    let client = tessera_runtime::kube_client::client()
        .await
        .map_err(|e| PluginError::Client(e.to_string()))?;
    let inventory = match given {
        Some(inventory) => inventory,
        None => {
            let gpus = node_gpus(&client, &args.node, &args.gpu_resource, args.api_timeout).await?;
            Inventory::new(&args.inventory(gpus))?
        }
    };
    let driver = Arc::new(Driver::open(
        args.driver(),
        inventory.clone(),
        source::KubeClaims(client.clone()),
    )?);
    let graceful = tessera_runtime::Graceful::on_signals(Duration::ZERO);
    let stop = graceful.stop_token();
    let servers = server::start(
        driver,
        server::dra_socket(&args.plugin_dir),
        server::registration_socket(&args.registry_dir),
        stop.clone(),
    )
    .await?;
    let health = health::Health::new(servers.registration.clone(), !args.no_publish);
    let probes = tokio::spawn(health::serve(args.health_listen, health.clone(), stop.clone()));
    if args.no_publish {
        tracing::info!("--no-publish: the node's slice is left to the pool manager");
    } else {
        tokio::spawn(publish::run(
            client,
            inventory,
            args.publish_interval,
            health,
            stop,
        ));
    }
    // A health listener that cannot bind is a start-up error, not a plugin that serves the kubelet unprobed.
    tokio::select! {
        served = servers.wait() => served,
        Ok(Err(e)) = probes => Err(e),
    }
}

/// The node's GPU count from its allocatable `resource`, for a plugin started without `--gpus`.
pub async fn node_gpus(
    client: &kube::Client,
    node: &str,
    resource: &str,
    timeout: Duration,
) -> Result<u32, PluginError> {
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    let got = tokio::time::timeout(timeout, nodes.get(node))
        .await
        .map_err(|_| PluginError::Client(format!("reading node {node}: no answer within {timeout:?}")))?
        .map_err(|e| PluginError::Client(format!("reading node {node}: {e}")))?;
    count_of(&got, resource).ok_or_else(|| {
        PluginError::Inventory(format!(
            "--gpus is not set and node {node} has no allocatable {resource}: set --gpus (TESSERA_GPUS) to its \
             GPU count, or --gpu-resource to the resource its device plugin advertises"
        ))
    })
}

/// The node's allocatable count of `resource`, zero being no inventory (the same answer as none listed).
fn count_of(node: &k8s_openapi::api::core::v1::Node, resource: &str) -> Option<u32> {
    crate::slice::allocatable_gpus(node, resource).filter(|&n| n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flags_have_the_kubelets_paths_by_default_and_read_the_inventory() {
        let a: Args = tessera_runtime::try_parse_args(&[
            "dra-plugin",
            "--node",
            "n1",
            "--gpus",
            "2",
            "--gpu-memory-mib",
            "81920",
            "--gpu-uuids",
            "GPU-a,GPU-b",
        ])
        .expect("parse");
        assert_eq!(
            server::dra_socket(&a.plugin_dir),
            PathBuf::from("/var/lib/kubelet/plugins/gpu.tessera.dev/dra.sock")
        );
        assert_eq!(
            server::registration_socket(&a.registry_dir),
            PathBuf::from("/var/lib/kubelet/plugins_registry/gpu.tessera.dev-reg.sock")
        );
        assert_eq!(
            a.driver().checkpoint,
            PathBuf::from("/var/lib/kubelet/plugins/gpu.tessera.dev/checkpoint.json")
        );
        assert_eq!(a.cdi_dir, PathBuf::from("/var/run/cdi"));
        assert_eq!(a.sharing, Sharing::Mps);
        assert_eq!(
            a.inventory(2).uuids,
            vec!["GPU-a".to_string(), "GPU-b".to_string()]
        );
        assert_eq!(a.api_timeout, Duration::from_secs(10));
        let refused = tessera_runtime::try_parse_args::<Args>(&["dra-plugin", "--node", "n1"]);
        assert!(refused.is_err(), "--gpu-memory-mib is required");
        assert_eq!(a.gpus, Some(2));
        assert_eq!(a.gpu_resource, "nvidia.com/gpu");
    }

    #[test]
    fn without_gpus_the_nodes_allocatable_count_is_read() {
        let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1"},
            "status": {"allocatable": {"nvidia.com/gpu": "4", "cpu": "8", "example.com/gpu": "0"}}
        }))
        .expect("a Node");
        assert_eq!(count_of(&node, "nvidia.com/gpu"), Some(4));
        assert_eq!(
            count_of(&node, "example.com/gpu"),
            None,
            "zero GPUs is no inventory"
        );
        assert_eq!(count_of(&node, "amd.com/gpu"), None);
    }
}
