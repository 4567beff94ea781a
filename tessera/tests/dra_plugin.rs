//! Story d of issue 56, in the control-plane tier: the real `tessera dra-plugin` binary prepares and unprepares a
//! ResourceClaim allocated through a real kube-apiserver, driven over its unix sockets by a gRPC client the way
//! the kubelet drives it (registration, NodePrepareResources, NodeUnprepareResources).
//!
//! The claim is Tessera's own shape (`tessera_dra::claim::template`), created in the API server, and its
//! allocation — a share of kwok node `gpu-a`'s `gpu-1` with consumed memory and compute — is written through the
//! claim's status subresource, as the scheduler writes it (no pod runs: kwok has no kubelet to call the plugin).
//! The plugin reads the claim from the API server, writes the CDI spec with the claim's limits, and publishes
//! `gpu-a`'s ResourceSlice itself (server-side apply, owned by the Node). What only a real kubelet and a GPU node
//! can prove (the kubelet's own calls, the runtime applying the spec, MPS enforcing it) is not claimed here.
//!
//! Ignored by default like tessera/tests/control_plane.rs; skipped with a message where the control plane is not
//! built, with `TESSERA_SKIP_CONTROL_PLANE=1`, or where its API server is older than 1.36 (consumed capacity,
//! `DRAConsumableCapacity`, is on by default from 1.36; an older server drops it from the status).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tessera_dra::claim::{ClaimShape, template};
use tessera_dra::plugin::pb::dra::dra_plugin_client::DraPluginClient;
use tessera_dra::plugin::pb::dra::{Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest};
use tessera_dra::plugin::pb::registration::InfoRequest;
use tessera_dra::plugin::pb::registration::registration_client::RegistrationClient;
use tessera_dra::plugin::server::channel;
use tessera_dra::plugin::testing::allocation;

mod support;
use support::Killed;
use support::cluster::eventually;

const NODE: &str = "gpu-a";
const NAMESPACE: &str = "models";

use support::control_plane::ControlPlane;

/// Why this run cannot hold the story, if it cannot (said on stderr by the caller).
fn not_runnable() -> Option<String> {
    if std::env::var("TESSERA_SKIP_CONTROL_PLANE").as_deref() == Ok("1") {
        return Some("TESSERA_SKIP_CONTROL_PLANE=1".into());
    }
    let cache = std::env::var_os("TESSERA_TOOLS_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/tessera")))
        .unwrap_or_default();
    let apiserver = cache.join("control-plane/bin/kube-apiserver");
    (!apiserver.exists()).then(|| {
        format!(
            "the control plane is not built ({} is missing): scripts/control-plane.sh build",
            apiserver.display()
        )
    })
}

/// The plugin's directories, its log, and the plugin while it runs.
struct Plugin {
    dir: tempfile::TempDir,
    child: Option<Killed>,
    /// `/live` and `/ready`.
    health: String,
}

impl Plugin {
    fn dra(&self) -> PathBuf {
        self.dir.path().join("plugins/gpu.tessera.dev/dra.sock")
    }

    fn registration(&self) -> PathBuf {
        self.dir.path().join("plugins_registry/gpu.tessera.dev-reg.sock")
    }

    fn cdi(&self, uid: &str) -> PathBuf {
        self.dir.path().join(format!("cdi/gpu.tessera.dev-{uid}.json"))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("plugin.log")).unwrap_or_default()
    }

    fn start(kubeconfig: &Path) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = std::fs::File::create(dir.path().join("plugin.log")).unwrap();
        let health = format!("127.0.0.1:{}", support::free_port());
        let child = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .arg("dra-plugin")
            // No --gpus: the count is read from the Node's allocatable nvidia.com/gpu (2 on kwok's gpu-a).
            .args(["--node", NODE, "--gpu-memory-mib", "81920"])
            .args([
                "--gpu-uuids",
                "GPU-4f1e0c9a-aaaa,GPU-4f1e0c9a-bbbb",
                "--sharing",
                "mps",
            ])
            .args(["--product", "NVIDIA A100-SXM4-80GB", "--publish-interval", "1s"])
            .arg("--plugin-dir")
            .arg(dir.path().join("plugins/gpu.tessera.dev"))
            .arg("--registry-dir")
            .arg(dir.path().join("plugins_registry"))
            .arg("--cdi-dir")
            .arg(dir.path().join("cdi"))
            .args(["--health-listen", &health])
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn tessera dra-plugin");
        Self {
            dir,
            child: Some(Killed(child)),
            health: format!("http://{health}"),
        }
    }

    /// SIGTERM, as the kubelet sends it to the DaemonSet's pod; the plugin must exit cleanly.
    fn terminate(&mut self) -> std::process::ExitStatus {
        let mut killed = self.child.take().expect("running");
        let pid = killed.0.id().to_string();
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill -TERM");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = killed.0.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the plugin did not exit within 10 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn env<'a>(spec: &'a serde_json::Value, name: &str) -> Option<&'a str> {
    spec["devices"][0]["containerEdits"]["env"]
        .as_array()?
        .iter()
        .filter_map(|e| e.as_str())
        .find_map(|e| e.strip_prefix(name)?.strip_prefix('='))
}

#[test]
#[ignore = "needs the control plane: scripts/control-plane.sh build (scripts/test.sh runs it)"]
fn dra_plugin_prepares_and_unprepares_a_claim_allocated_through_the_real_api_server() {
    if let Some(why) = not_runnable() {
        eprintln!("SKIPPED story d (tessera dra-plugin against the real API server): {why}");
        return;
    }
    let cp = ControlPlane::up();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut plugin = None;
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rt.block_on(story(&cp, &mut plugin))
    }));
    if let Err(panic) = result {
        if let Some(p) = &plugin {
            eprintln!("---- tessera dra-plugin's log ----\n{}", p.log());
        }
        std::panic::resume_unwind(panic);
    }
}

#[expect(
    clippy::too_many_lines,
    reason = "one story against real processes, told in order: each step starts from the state the last one left"
)]
async fn story(cp: &ControlPlane, slot: &mut Option<Plugin>) {
    let client = support::cluster::client(&cp.kubeconfig).await;
    let version = client
        .apiserver_version()
        .await
        .expect("the API server's version");
    let number = |s: &str| s.trim_end_matches('+').parse::<u32>().unwrap_or(0);
    if (number(&version.major), number(&version.minor)) < (1, 36) {
        eprintln!(
            "SKIPPED story d: the control plane is Kubernetes {}.{} (consumed capacity needs 1.36: its \
             DRAConsumableCapacity gate is on by default from then); rebuild with scripts/control-plane.sh build",
            version.major, version.minor
        );
        return;
    }
    let plugin = slot.insert(Plugin::start(&cp.kubeconfig));

    // Registration, as the kubelet's plugin watcher does it once the socket appears.
    eventually("the registration socket", Duration::from_secs(30), || async {
        plugin.registration().exists().then_some(())
    })
    .await;
    let info = RegistrationClient::new(channel(&plugin.registration()))
        .get_info(InfoRequest {})
        .await
        .expect("GetInfo")
        .into_inner();
    assert_eq!(
        (info.r#type.as_str(), info.name.as_str()),
        ("DRAPlugin", "gpu.tessera.dev")
    );
    assert_eq!(info.endpoint, plugin.dra().display().to_string());
    assert_eq!(info.supported_versions, vec!["v1.DRAPlugin".to_string()]);
    // Not ready until the kubelet confirms the registration; then ready once the slice is published.
    let http = support::http_client(Duration::from_secs(5));
    let ready = |http: reqwest::Client, url: String| async move {
        let r = http.get(format!("{url}/ready")).send().await.ok()?;
        Some((r.status().as_u16(), r.text().await.unwrap_or_default()))
    };
    let (status, why) = eventually("the plugin's /ready to answer", Duration::from_secs(10), || {
        ready(http.clone(), plugin.health.clone())
    })
    .await;
    assert_eq!(status, 503, "{why}");
    assert!(why.contains("registration"), "{why}");
    RegistrationClient::new(channel(&plugin.registration()))
        .notify_registration_status(tessera_dra::plugin::pb::registration::RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .expect("NotifyRegistrationStatus");
    eventually("the plugin ready", Duration::from_secs(30), || async {
        ready(http.clone(), plugin.health.clone())
            .await
            .filter(|(s, _)| *s == 200)
    })
    .await;

    // The node's slice, published by the plugin itself: owned by the Node, marked as the plugin's.
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let slice = eventually("gpu-a's ResourceSlice", Duration::from_secs(30), || async {
        slices.get_opt("gpu-a-gpu.tessera.dev").await.ok().flatten()
    })
    .await;
    assert_eq!(slice.spec.node_name.as_deref(), Some(NODE));
    assert_eq!(slice.spec.devices.as_ref().map(Vec::len), Some(2));
    let labels = slice.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("tessera.dev/published-by").map(String::as_str),
        Some("dra-plugin")
    );
    let owner = &slice
        .metadata
        .owner_references
        .as_ref()
        .expect("owned by the Node")[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Node", NODE));
    let managers: Vec<_> = slice
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(managers.iter().any(|m| m == "tessera-dra-plugin"), "{managers:?}");

    // A claim of Tessera's shape, allocated as the scheduler would: 20 GiB and 33% of gpu-a's gpu-1.
    let shape = ClaimShape {
        memory_mib: 20480,
        compute_milli: 330,
    };
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).unwrap(),
        )
        .await
        .expect("create the namespace");
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let new = ResourceClaim {
        metadata: kube::api::ObjectMeta {
            name: Some("llama-0-tessera-gpu".into()),
            namespace: Some(NAMESPACE.into()),
            ..Default::default()
        },
        spec: template(NAMESPACE, "llama", shape).spec.spec,
        status: None,
    };
    let created = claims
        .create(&PostParams::default(), &new)
        .await
        .expect("create the claim");
    let allocated = claims
        .patch_status(
            "llama-0-tessera-gpu",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"allocation": allocation(NODE, "gpu-1", shape)}})),
        )
        .await
        .expect("write the allocation through the status subresource");
    let consumed = allocated
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .and_then(|r| r.first())
        .and_then(|r| r.consumed_capacity.clone());
    assert!(
        consumed.is_some(),
        "the API server kept the consumed capacity: {allocated:?}"
    );
    let uid = created.metadata.uid.clone().expect("a UID");
    let claim = Claim {
        namespace: NAMESPACE.into(),
        uid: uid.clone(),
        name: "llama-0-tessera-gpu".into(),
    };

    // NodePrepareResources, as the kubelet calls it before the pod's containers start.
    let mut dra = DraPluginClient::new(channel(&plugin.dra()));
    let wrong = Claim {
        uid: "0f0e0d0c-0b0a-4909-8807-060504030201".into(),
        ..claim.clone()
    };
    let resp = dra
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![claim.clone(), wrong.clone()],
        })
        .await
        .expect("NodePrepareResources")
        .into_inner();
    let answer = &resp.claims[&uid];
    assert_eq!(answer.error, "", "{resp:?}");
    let cdi_id = format!("gpu.tessera.dev/gpu={uid}-gpu-1");
    assert_eq!(answer.devices[0].cdi_device_ids, vec![cdi_id]);
    assert_eq!(
        (
            answer.devices[0].pool_name.as_str(),
            answer.devices[0].device_name.as_str()
        ),
        (NODE, "gpu-1")
    );
    assert!(
        resp.claims[&wrong.uid].error.contains(&format!("has UID {uid}")),
        "a claim the API server knows by another UID fails alone: {resp:?}"
    );

    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(plugin.cdi(&uid)).expect("the CDI spec is written")).unwrap();
    assert_eq!(spec["kind"], "gpu.tessera.dev/gpu");
    assert_eq!(env(&spec, "NVIDIA_VISIBLE_DEVICES"), Some("GPU-4f1e0c9a-bbbb"));
    assert_eq!(env(&spec, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), Some("0=20480M"));
    assert_eq!(env(&spec, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), Some("33"));

    // NodeUnprepareResources, after the pod is gone: the spec goes.
    let gone = dra
        .node_unprepare_resources(NodeUnprepareResourcesRequest { claims: vec![claim] })
        .await
        .expect("NodeUnprepareResources")
        .into_inner();
    assert_eq!(gone.claims[&uid].error, "");
    assert!(!plugin.cdi(&uid).exists(), "the CDI spec is removed");

    let status = plugin.terminate();
    assert!(
        status.success(),
        "the plugin exits cleanly on SIGTERM: {status:?}"
    );
    assert!(
        !plugin.registration().exists() && !plugin.dra().exists(),
        "its sockets are removed"
    );
    eprintln!(
        "story d: claim {uid} prepared on Kubernetes {}.{} (CDI spec: 0=20480M, 33%) and unprepared; gpu-a's slice published",
        version.major, version.minor
    );
}

/// `tessera dra-plugin --help` groups its flags and names each one's environment variable.
#[test]
fn dra_plugin_help_groups_its_flags() {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["dra-plugin", "--help"])
        .env_remove("NODE_NAME")
        .output()
        .expect("run tessera dra-plugin --help");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for heading in [
        "Kubelet:",
        "Node inventory:",
        "Kubernetes API:",
        "Limits:",
        "MPS:",
    ] {
        assert!(help.contains(heading), "no {heading} group:\n{help}");
    }
    for flag in [
        "--plugin-dir",
        "--registry-dir",
        "--cdi-dir",
        "--gpu-uuids",
        "--no-publish",
        "--max-prepared",
    ] {
        assert!(help.contains(flag), "{flag} missing:\n{help}");
    }
    assert!(
        help.contains("[env: NODE_NAME=]") && help.contains("[env: TESSERA_CDI_DIR=]"),
        "{help}"
    );
    assert!(
        help.contains("[default: /var/lib/kubelet/plugins_registry]"),
        "{help}"
    );
    let refused = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "dra-plugin",
            "--node",
            "n",
            "--gpus",
            "0",
            "--gpu-memory-mib",
            "81920",
            "--no-publish",
        ])
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .expect("run tessera dra-plugin");
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("--gpus 0 is out of range"), "{stderr}");
}
