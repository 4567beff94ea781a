//! The kubelet plugin's two gRPC servers on real unix sockets, driven by a real tonic client over them — as the
//! kubelet's plugin watcher and DRA manager call them — with claims from an in-memory API server: registration,
//! prepare (the CDI spec's values from the claim's consumed capacity), prepare again, a restart from the
//! checkpoint, unprepare, and claims that must fail on their own.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tessera_dra::claim::ClaimShape;
use tessera_dra::plugin::cdi::{self, MpsPaths};
use tessera_dra::plugin::checkpoint;
use tessera_dra::plugin::inventory::{Inventory, InventorySpec, Sharing};
use tessera_dra::plugin::pb::dra::dra_plugin_client::DraPluginClient;
use tessera_dra::plugin::pb::dra::{
    Claim, NodePrepareResourcesRequest, NodePrepareResourcesResponse, NodeUnprepareResourcesRequest,
};
use tessera_dra::plugin::pb::registration::registration_client::RegistrationClient;
use tessera_dra::plugin::pb::registration::{InfoRequest, RegistrationStatus};
use tessera_dra::plugin::prepare::{Driver, DriverConfig};
use tessera_dra::plugin::server::{self, Servers, channel};
use tessera_dra::plugin::testing::{FakeClaims, SHARE_ID, allocated_claim};
use tokio_util::sync::CancellationToken;

const NODE: &str = "gpu-node-1";

/// A plugin's directories in a tempdir, and the plugin while it runs.
struct Node {
    dir: tempfile::TempDir,
    claims: FakeClaims,
}

struct Running {
    stop: CancellationToken,
    servers: Servers,
}

impl Node {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
            claims: FakeClaims::default(),
        }
    }

    fn plugin_dir(&self) -> PathBuf {
        self.dir.path().join("plugins/gpu.tessera.dev")
    }

    fn dra(&self) -> PathBuf {
        server::dra_socket(&self.plugin_dir())
    }

    fn registration(&self) -> PathBuf {
        server::registration_socket(&self.dir.path().join("plugins_registry"))
    }

    fn cdi_dir(&self) -> PathBuf {
        self.dir.path().join("cdi")
    }

    async fn start(&self) -> Running {
        let inventory = Inventory::new(&InventorySpec {
            node: NODE.into(),
            gpus: 2,
            memory_mib: 81920,
            headroom_mib: 1024,
            compute_oversubscription: None,
            sharing: Sharing::Mps,
            uuids: vec!["GPU-0d5e".into(), "GPU-7a21".into()],
            product: Some("NVIDIA A100-SXM4-80GB".into()),
        })
        .unwrap();
        let cfg = DriverConfig {
            cdi_dir: self.cdi_dir(),
            checkpoint: self.plugin_dir().join(checkpoint::FILE),
            mps: MpsPaths::default(),
            max_claims_per_call: 8,
            max_prepared: 64,
            api_timeout: std::time::Duration::from_secs(2),
        };
        let driver = Arc::new(Driver::open(cfg, inventory, self.claims.clone()).unwrap());
        let stop = CancellationToken::new();
        let servers = server::start(driver, self.dra(), self.registration(), stop.clone())
            .await
            .unwrap();
        Running { stop, servers }
    }

    /// A claim allocated on this node (or `node`) and known to the API server; what the kubelet sends for it.
    fn claim(&self, name: &str, node: &str, device: &str, shape: ClaimShape) -> Claim {
        let uid = format!("uid-{name}");
        self.claims
            .put(allocated_claim("models", name, &uid, node, device, shape));
        Claim {
            namespace: "models".into(),
            uid,
            name: name.into(),
        }
    }

    fn spec(&self, uid: &str) -> Option<serde_json::Value> {
        let bytes = std::fs::read(cdi::spec_path(&self.cdi_dir(), uid)).ok()?;
        Some(serde_json::from_slice(&bytes).unwrap())
    }
}

impl Running {
    async fn stop(self) {
        self.stop.cancel();
        self.servers.wait().await.unwrap();
    }
}

async fn prepare(socket: &Path, claims: &[Claim]) -> NodePrepareResourcesResponse {
    DraPluginClient::new(channel(socket))
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: claims.to_vec(),
        })
        .await
        .expect("the call itself never fails")
        .into_inner()
}

fn env<'a>(device: &'a serde_json::Value, name: &str) -> Option<&'a str> {
    device["containerEdits"]["env"]
        .as_array()?
        .iter()
        .filter_map(|e| e.as_str())
        .find_map(|e| e.strip_prefix(name)?.strip_prefix('='))
}

#[tokio::test]
async fn the_kubelet_registers_the_plugin_and_prepares_and_unprepares_a_claim_over_its_sockets() {
    let node = Node::new();
    // A socket left by a crashed run is replaced.
    drop(std::os::unix::net::UnixListener::bind({
        std::fs::create_dir_all(node.plugin_dir()).unwrap();
        node.dra()
    }));
    let running = node.start().await;

    // The plugin watcher's two calls.
    let mut reg = RegistrationClient::new(channel(&node.registration()));
    let info = reg.get_info(InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "gpu.tessera.dev");
    assert_eq!(info.endpoint, node.dra().display().to_string());
    assert_eq!(info.supported_versions, vec!["v1.DRAPlugin".to_string()]);
    let mut registered = running.servers.registration.clone();
    reg.notify_registration_status(RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    })
    .await
    .unwrap();
    registered.wait_for(|s| s.is_some()).await.unwrap();
    assert_eq!(*registered.borrow(), Some(Ok(())));

    // A share of gpu-1: 20 GiB and a third of its SMs, as the scheduler booked it.
    let shape = ClaimShape {
        memory_mib: 20480,
        compute_milli: 330,
    };
    let claim = node.claim("llama-0-tessera-gpu", NODE, "gpu-1", shape);
    let first = prepare(&node.dra(), std::slice::from_ref(&claim)).await;
    let answer = &first.claims[&claim.uid];
    assert_eq!(answer.error, "");
    assert_eq!(answer.devices.len(), 1);
    let d = &answer.devices[0];
    assert_eq!((d.pool_name.as_str(), d.device_name.as_str()), (NODE, "gpu-1"));
    assert_eq!(d.request_names, vec!["gpu".to_string()]);
    assert_eq!(d.share_id.as_deref(), Some(SHARE_ID));
    let cdi_name = format!("{}-gpu-1", claim.uid);
    assert_eq!(d.cdi_device_ids, vec![format!("gpu.tessera.dev/gpu={cdi_name}")]);

    let spec = node.spec(&claim.uid).expect("the CDI spec is written");
    assert_eq!(spec["cdiVersion"], "0.6.0");
    assert_eq!(spec["kind"], "gpu.tessera.dev/gpu");
    let dev = &spec["devices"][0];
    assert_eq!(dev["name"], cdi_name.as_str());
    assert_eq!(env(dev, "NVIDIA_VISIBLE_DEVICES"), Some("GPU-7a21"));
    assert_eq!(env(dev, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), Some("0=20480M"));
    assert_eq!(env(dev, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), Some("33"));
    assert_eq!(env(dev, "CUDA_MPS_PIPE_DIRECTORY"), Some("/tmp/nvidia-mps"));

    // The kubelet retries after a timeout, and a second pod may share the claim: the same answer.
    let again = prepare(&node.dra(), std::slice::from_ref(&claim)).await;
    assert_eq!(again, first);
    assert_eq!(node.claims.reads(), 1);

    // A restart: the API server is down meanwhile, and the CDI tmpfs was emptied (a reboot).
    running.stop().await;
    assert!(
        !node.dra().exists() && !node.registration().exists(),
        "sockets removed on stop"
    );
    std::fs::remove_file(cdi::spec_path(&node.cdi_dir(), &claim.uid)).unwrap();
    node.claims.fail(Some("connection refused"));
    let running = node.start().await;
    assert_eq!(
        node.spec(&claim.uid).as_ref(),
        Some(&spec),
        "rewritten from the checkpoint"
    );
    assert_eq!(prepare(&node.dra(), std::slice::from_ref(&claim)).await, first);
    node.claims.fail(None);

    // Unprepare: the spec goes; an unknown claim is already unprepared.
    let unknown = Claim {
        namespace: "models".into(),
        uid: "0b7c2d4e-1111-4000-8000-000000000000".into(),
        name: "never-prepared".into(),
    };
    let mut dra = DraPluginClient::new(channel(&node.dra()));
    let gone = dra
        .node_unprepare_resources(NodeUnprepareResourcesRequest {
            claims: vec![claim.clone(), unknown.clone()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(gone.claims.len(), 2, "an entry for every claim");
    assert!(gone.claims.values().all(|c| c.error.is_empty()), "{gone:?}");
    assert!(node.spec(&claim.uid).is_none(), "the CDI spec is removed");
    let cp: serde_json::Value =
        serde_json::from_slice(&std::fs::read(node.plugin_dir().join(checkpoint::FILE)).unwrap()).unwrap();
    assert_eq!(cp["claims"], serde_json::json!({}), "the checkpoint forgot it");
    running.stop().await;
}

#[tokio::test]
async fn a_claim_that_is_not_this_nodes_fails_alone_in_its_entry() {
    let node = Node::new();
    let running = node.start().await;
    let shape = ClaimShape {
        memory_mib: 8192,
        compute_milli: 100,
    };
    let good = node.claim("good", NODE, "gpu-0", shape);
    let elsewhere = node.claim("elsewhere", "gpu-node-2", "gpu-0", shape);
    // The kubelet's claim of that name was deleted and re-created: the API server has another UID.
    let mut recreated = node.claim("recreated", NODE, "gpu-0", shape);
    let api_uid = recreated.uid.clone();
    recreated.uid = "5d9e8f70-2222-4000-8000-000000000000".into();

    let resp = prepare(&node.dra(), &[good.clone(), elsewhere.clone(), recreated.clone()]).await;
    assert_eq!(resp.claims.len(), 3, "an entry for every claim");
    assert_eq!(resp.claims[&good.uid].error, "");
    let e = &resp.claims[&elsewhere.uid];
    assert!(
        e.error
            .contains("no device of gpu.tessera.dev allocated on node gpu-node-1")
            && e.devices.is_empty(),
        "{e:?}"
    );
    let e = &resp.claims[&recreated.uid];
    assert!(e.error.contains("has UID") && e.error.contains(&api_uid), "{e:?}");
    assert!(node.spec(&elsewhere.uid).is_none() && node.spec(&recreated.uid).is_none());
    assert!(node.spec(&good.uid).is_some());
    running.stop().await;
}
