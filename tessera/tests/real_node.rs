//! Tessera on a real node: a kubelet and containerd built from upstream (`scripts/real-node.sh`), joined to the
//! control plane of the control-plane tier (a real kube-apiserver, controller-manager and scheduler), pulling
//! Tessera's image and chart from a real OCI registry on loopback (`scripts/registry.sh`). Here containers run:
//! images are pulled, probes are judged by the kubelet, the injected native sidecar starts before the server, the
//! kubelet sends SIGTERM at scale-down, and the pods reach each other over a real pod network (a CNI bridge).
//!
//! Ignored by default: `scripts/test.sh` runs it with `--ignored` after the image tier (`TESSERA_SKIP_REAL_NODE=1`
//! skips the tier, and says so). One node per machine (it is the host's bridge and address), so the stories run in
//! one test, in order, on one cluster — a bring-up costs a control plane, a node and a `helm install`:
//! a. the chart installed from the registry as a user installs it (`helm install tessera oci://…`); the webhook and
//!    the activator run as pods on the node; a model Deployment labelled for injection, whose server is the same
//!    image's `tessera vllm-sim`, gets the sidecar injected, passes its start-up gate and probes, and is Ready; its
//!    recommendation is read from the sidecar inside the pod;
//! b. scale to zero and back: idle → 0 pods, the kubelet stopping the pod with SIGTERM while a request is in
//!    flight, which is answered in full; a request through the activator at zero is held, the kubelet starts the
//!    pod, the request is answered — the time from request to answer is printed;
//! c. a changed allocation rolled (`gpu.updateMode: Recreate`) with no request lost: the policy fixes less memory
//!    than the pods run with (a GPU-less node gives the sidecar no GPU memory to recommend from, so the change
//!    comes from the policy, `policy_fixed`); the controller patches the template, the Deployment controller and
//!    the kubelet replace the pod make-before-break, and every request sent through the activator meanwhile is
//!    answered;
//! d. what the chart promises, read from the running containers' process status (`/proc/PID/status` and the root
//!    mount of the container's init process, found by its container ID in `/proc/PID/cgroup`), not the manifest:
//!    non-root, no capabilities, no new privileges, seccomp on, read-only root.
//!
//! The image is `TESSERA_IMAGE_ARCHIVE` (what `scripts/image.sh build` wrote; scripts/test.sh passes the image
//! tier's), else it is built here from this test's `tessera` binary. `TESSERA_REAL_NODE_KEEP=1` keeps a failed
//! run's node, control plane and registry running (their directories are printed).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

mod support;
use support::cluster::eventually;
use support::{http_client, workspace};

const NODE: &str = "tessera-node";
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// `KEY=VALUE` lines a script printed.
fn field(stdout: &str, key: &str) -> String {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= line in:\n{stdout}"))
        .to_owned()
}

/// Runs a script of the repository; its stdout, or a failure with its stderr.
fn script(args: &[&str], env: &[(&str, &str)]) -> String {
    let out = Command::new(workspace().join(args[0]))
        .args(&args[1..])
        .envs(env.iter().copied())
        .current_dir(workspace())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", args[0]));
    support::cluster::succeeded(&out, &args.join(" "))
}

/// The registry, the control plane and the node, stopped (in that order's reverse) on drop.
struct RealNode {
    tmp: PathBuf,
    dir: PathBuf,
    kubeconfig: PathBuf,
    registry: String,
}

impl RealNode {
    fn up() -> RealNode {
        let tmp = tempfile::Builder::new()
            .prefix("tessera-real-node.")
            .tempdir()
            .expect("a temp dir")
            .keep();
        let started = Instant::now();
        let registry_dir = tmp.join("registry");
        let registry = field(
            &script(
                &["scripts/registry.sh", "up", registry_dir.to_str().unwrap()],
                &[],
            ),
            "REGISTRY",
        );
        let archive = match std::env::var("TESSERA_IMAGE_ARCHIVE") {
            Ok(a) => a,
            Err(_) => field(
                &script(
                    &["scripts/image.sh", "build"],
                    &[("TESSERA_BIN", env!("CARGO_BIN_EXE_tessera"))],
                ),
                "image",
            ),
        };
        script(&["scripts/image.sh", "push", &registry, &archive], &[]);
        let mut node = RealNode {
            dir: tmp.join("node"),
            kubeconfig: PathBuf::new(),
            registry,
            tmp,
        };
        let out = script(
            &[
                "scripts/real-node.sh",
                "up",
                node.dir.to_str().unwrap(),
                &node.registry,
            ],
            &[],
        );
        node.kubeconfig = PathBuf::from(field(&out, "KUBECONFIG"));
        eprintln!(
            "registry {} and real node {NODE} up in {:.1} s ({})",
            node.registry,
            started.elapsed().as_secs_f64(),
            node.tmp.display()
        );
        node
    }

    /// Runs helm (installed by scripts/check-chart.sh into .tools/bin) against this cluster.
    fn helm(&self, args: &[&str]) -> String {
        let out = support::cluster::helm(&self.kubeconfig, args);
        support::cluster::succeeded(&out, &format!("helm {}", args.join(" ")))
    }

    /// The last lines of one of the node's logs (kubelet, containerd).
    fn log_tail(&self, name: &str, lines: usize) -> String {
        let text = std::fs::read_to_string(self.dir.join(format!("node/{name}.log"))).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The log of `container` of `pod` as the kubelet wrote it (DIR/node/pod-logs), while the pod exists.
    fn container_log(&self, ns: &str, pod: &str, container: &str) -> Option<String> {
        let logs = self.dir.join("node/pod-logs");
        let entry = std::fs::read_dir(&logs).ok()?.flatten().find(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("{ns}_{pod}_"))
        })?;
        let mut text = String::new();
        for f in std::fs::read_dir(entry.path().join(container)).ok()?.flatten() {
            text.push_str(&std::fs::read_to_string(f.path()).unwrap_or_default());
        }
        Some(text)
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- kubelet ----\n{}", self.log_tail("kubelet", 40));
            eprintln!("---- containerd ----\n{}", self.log_tail("containerd", 20));
            if std::env::var_os("TESSERA_REAL_NODE_KEEP").is_some() {
                eprintln!(
                    "TESSERA_REAL_NODE_KEEP: left running (scripts/real-node.sh down {}; scripts/registry.sh down {})",
                    self.dir.display(),
                    self.tmp.join("registry").display()
                );
                return;
            }
        }
        for args in [
            ["scripts/real-node.sh", "down", self.dir.to_str().unwrap()],
            [
                "scripts/registry.sh",
                "down",
                self.tmp.join("registry").to_str().unwrap(),
            ],
        ] {
            let _ = Command::new(workspace().join(args[0]))
                .args(&args[1..])
                .stdin(Stdio::null())
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

fn ias_api(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    let res = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("tessera.dev", "v1alpha1", "InferenceAutoscaler"),
        "inferenceautoscalers",
    );
    Api::namespaced_with(client.clone(), ns, &res)
}

fn pod_ready(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn pod_ip(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("a pod IP")
}

/// Ready pods matching `labels` in `ns`, sorted by name.
async fn ready_pods(client: &kube::Client, ns: &str, labels: &str) -> Vec<Pod> {
    let mut pods: Vec<Pod> = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(labels))
        .await
        .expect("list pods")
        .items
        .into_iter()
        .filter(pod_ready)
        .collect();
    pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    pods
}

/// `(container name, container ID without the runtime prefix)` of every running container of `pod`, init
/// (native sidecar) containers included.
fn container_ids(p: &Pod) -> Vec<(String, String)> {
    let s = p.status.as_ref().expect("a pod status");
    s.init_container_statuses
        .iter()
        .flatten()
        .chain(s.container_statuses.iter().flatten())
        .filter(|c| c.state.as_ref().is_some_and(|st| st.running.is_some()))
        .map(|c| {
            let id = c.container_id.clone().expect("a running container has an ID");
            let bare = id
                .strip_prefix("containerd://")
                .unwrap_or_else(|| panic!("container {} is not containerd's: {id}", c.name));
            (c.name.clone(), bare.to_owned())
        })
        .collect()
}

/// The host PID of a container's init process: the process whose cgroup path ends in the container's ID (the
/// kubelet's cgroupfs layout, kubepods/<qos>/pod<uid>/<id>), and whose parent is not in it.
fn container_pid(id: &str) -> u32 {
    let mut inside = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        if cgroup.lines().any(|l| l.ends_with(&format!("/{id}"))) {
            inside.push(pid);
        }
    }
    let ppid = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .and_then(|v| v.trim().parse::<u32>().ok())
    };
    inside
        .iter()
        .copied()
        .find(|&pid| ppid(pid).is_some_and(|pp| !inside.contains(&pp)))
        .unwrap_or_else(|| panic!("no process of container {id} in /proc/*/cgroup"))
}

/// What `/proc/PID/status` and `/proc/PID/mountinfo` say about a process: (field → value) for the fields read,
/// and the root mount's options.
fn process_facts(pid: u32) -> (BTreeMap<String, String>, String) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/PID/status");
    let fields = status
        .lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(k, _)| {
            [
                "Uid",
                "Gid",
                "CapEff",
                "CapPrm",
                "CapBnd",
                "CapAmb",
                "NoNewPrivs",
                "Seccomp",
            ]
            .contains(k)
        })
        .map(|(k, v)| (k.to_owned(), v.split_whitespace().collect::<Vec<_>>().join(" ")))
        .collect();
    // mountinfo: id parent major:minor root mount-point options ...; the container's root is mount point "/".
    let mountinfo =
        std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).expect("read /proc/PID/mountinfo");
    let root = mountinfo
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.get(4) == Some(&"/"))
        .map(|f| f[5].to_owned())
        .expect("a root mount in mountinfo");
    (fields, root)
}

async fn chat(client: &reqwest::Client, url: &str, max_tokens: u32) -> Result<Value, String> {
    let r = client
        .post(url)
        .json(
            &json!({"model": "llama", "messages": [{"role": "user", "content": "hello"}],
                      "max_tokens": max_tokens, "ignore_eos": true}),
        )
        .send()
        .await
        .map_err(|e| format!("no response: {e}"))?;
    let status = r.status();
    let body: Value = r.json().await.map_err(|e| format!("{status}: not JSON: {e}"))?;
    if status.is_success() {
        Ok(body)
    } else {
        Err(format!("{status}: {body}"))
    }
}

/// The model under test: `tessera vllm-sim` from the same image, labelled for injection (`tessera.dev/container`
/// names its server container: the webhook recognises vLLM's own command lines, not the emulator's). The
/// emulated GPU runs at 1/20 of an L4's speed so that a 150-token answer takes seconds: long enough to be in
/// flight when the kubelet stops the pod.
fn model(image: &str) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "llama"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "llama"}},
            "template": {
                "metadata": {"labels": {"app": "llama", "tessera.dev/inject": "true"},
                             // What each pod runs with, as the webhook records it for a whole GPU (16 GiB of
                             // an L4's 23): the roll in story c is judged against these.
                             "annotations": {"tessera.dev/container": "vllm",
                                             "tessera.dev/gpu-memory": "16384",
                                             "tessera.dev/gpu-compute-fraction": "1"}},
                "spec": {
                    "terminationGracePeriodSeconds": 30,
                    "containers": [{
                        "name": "vllm",
                        "image": image,
                        "args": ["vllm-sim", "--listen", "0.0.0.0:8000", "--model-preset", "opt-125m", "--gpu", "l4",
                                 "--served-model-name", "llama", "--time-scale", "0.05"],
                        "ports": [{"name": "http", "containerPort": 8000}],
                        "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 1}
                    }]
                }
            }
        }
    }))
    .expect("a Deployment")
}

#[test]
#[ignore = "needs a real node: scripts/real-node.sh build (scripts/test.sh runs the tier)"]
fn real_node_stories() {
    let node = RealNode::up();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    rt.block_on(async {
        let client = support::cluster::client(&node.kubeconfig).await;
        let t = Instant::now();
        story_a(&node, &client).await;
        eprintln!("story a passed in {:.1} s", t.elapsed().as_secs_f64());
        let t = Instant::now();
        story_d(&client).await;
        eprintln!("story d passed in {:.1} s", t.elapsed().as_secs_f64());
        let t = Instant::now();
        let model_ip = story_c(&client).await;
        eprintln!("story c passed in {:.1} s", t.elapsed().as_secs_f64());
        let t = Instant::now();
        story_b(&node, &client, &model_ip).await;
        eprintln!("story b passed in {:.1} s", t.elapsed().as_secs_f64());
    });
}

/// The activator's OpenAI endpoint for namespace `models`, at the first ready activator pod's address.
async fn activator_url(client: &kube::Client) -> String {
    let pods = ready_pods(client, "tessera-system", "app.kubernetes.io/component=activator").await;
    let p = pods.first().expect("a ready activator pod");
    format!("http://{}:8080/namespaces/models/v1/chat/completions", pod_ip(p))
}

#[expect(
    clippy::too_many_lines,
    reason = "one story against real processes, told in order: each step starts from the state the last one left"
)]
async fn story_a(node: &RealNode, client: &kube::Client) {
    // Published as a user's registry would hold it: the image (pushed by RealNode::up) and the chart.
    let charts = node.tmp.join("charts");
    std::fs::create_dir_all(&charts).unwrap();
    node.helm(&["package", "charts/tessera", "-d", charts.to_str().unwrap()]);
    let tgz = charts.join(format!("tessera-{VERSION}.tgz"));
    let oci = format!("oci://{}/charts", node.registry);
    node.helm(&["push", tgz.to_str().unwrap(), &oci, "--plain-http"]);
    let t = Instant::now();
    let repository = format!("image.repository={}/tessera", node.registry);
    node.helm(&[
        "install",
        "tessera",
        &format!("{oci}/tessera"),
        "--version",
        VERSION,
        "--plain-http",
        "--namespace",
        "tessera-system",
        "--create-namespace",
        "--wait",
        "--timeout",
        "5m",
        "--set",
        &repository,
        // Decide every 2 s instead of 15 s, and hold a drift 3 s instead of 30 min before rolling: the tier waits
        // for the controller's decisions.
        "--set",
        "autoscaler.syncPeriod=2s",
        "--set",
        "autoscaler.extraArgs={--rollout-stability-window=3s}",
    ]);
    eprintln!(
        "helm install from oci://{} with --wait: {:.1} s",
        node.registry,
        t.elapsed().as_secs_f64()
    );

    // Every pod of the chart runs on the real node, in containers containerd started from the registry's image.
    let pods = Api::<Pod>::namespaced(client.clone(), "tessera-system")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let mut components = Vec::new();
    for p in &pods {
        let name = p.metadata.name.clone().unwrap_or_default();
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(
            spec.node_name.as_deref(),
            Some(NODE),
            "{name} is not on the real node"
        );
        assert!(pod_ready(p), "{name} is not Ready");
        for s in p.status.as_ref().unwrap().container_statuses.iter().flatten() {
            assert!(
                s.image.starts_with(&format!("{}/tessera:", node.registry)),
                "{name}/{} runs {}",
                s.name,
                s.image
            );
            assert!(
                s.container_id
                    .as_deref()
                    .is_some_and(|i| i.starts_with("containerd://"))
            );
        }
        let labels = p.metadata.labels.clone().unwrap_or_default();
        components.push(
            labels
                .get("app.kubernetes.io/component")
                .cloned()
                .unwrap_or_default(),
        );
    }
    eprintln!("chart pods on {NODE}: {components:?}");
    for want in ["webhook", "activator", "autoscaler"] {
        assert!(
            components.iter().any(|c| c == want),
            "no {want} pod: {components:?}"
        );
    }

    // The model: a Service (the activator routes through its EndpointSlices), its policy, its Deployment.
    let ns: Namespace = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "models"}}),
    )
    .unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    eventually(
        "the default ServiceAccount in models",
        Duration::from_secs(30),
        || async {
            Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(client.clone(), "models")
                .get_opt("default")
                .await
                .ok()
                .flatten()
        },
    )
    .await;
    let svc: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "llama"},
        "spec": {"selector": {"app": "llama"}, "ports": [{"name": "http", "port": 8000, "targetPort": 8000}]}
    }))
    .unwrap();
    Api::<Service>::namespaced(client.clone(), "models")
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    // minReplicas 1 for now: story b lowers it to 0.
    let ias: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "InferenceAutoscaler", "metadata": {"name": "llama"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"},
                 "minReplicas": 1, "maxReplicas": 1, "modelNames": ["llama"],
                 "scaleToZero": {"idleAfter": "10s"}}
    }))
    .unwrap();
    ias_api(client, "models")
        .create(&PostParams::default(), &ias)
        .await
        .unwrap();
    let t = Instant::now();
    let image = format!("{}/tessera:{VERSION}", node.registry);
    Api::<Deployment>::namespaced(client.clone(), "models")
        .create(&PostParams::default(), &model(&image))
        .await
        .unwrap();
    let pod = eventually("the model pod to be Ready", Duration::from_secs(180), || async {
        ready_pods(client, "models", "app=llama").await.into_iter().next()
    })
    .await;
    let name = pod.metadata.name.clone().unwrap();
    eprintln!(
        "model pod {name} Ready {:.1} s after the Deployment was created",
        t.elapsed().as_secs_f64()
    );

    // The sidecar was injected as a native sidecar, and its start-up gate (the startup probe) passed before the
    // kubelet started the server: the server's container started after the sidecar was `started`.
    let spec = pod.spec.as_ref().unwrap();
    let injected = spec
        .init_containers
        .iter()
        .flatten()
        .find(|c| c.name == "tessera-sidecar")
        .expect("the webhook injected tessera-sidecar");
    assert_eq!(
        injected.restart_policy.as_deref(),
        Some("Always"),
        "a native sidecar"
    );
    assert!(injected.startup_probe.is_some(), "the start-up gate");
    let status = pod.status.as_ref().unwrap();
    let side = status
        .init_container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == "tessera-sidecar")
        .expect("the sidecar's status");
    assert_eq!(side.started, Some(true), "the sidecar's startup probe passed");
    assert!(side.ready, "the sidecar is ready");
    let server = status
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == "vllm")
        .expect("the server's status");
    assert!(server.ready, "the server passed its readiness probe");
    let started_at = |s: &k8s_openapi::api::core::v1::ContainerStatus| {
        s.state
            .as_ref()
            .and_then(|st| st.running.as_ref())
            .and_then(|r| r.started_at.clone())
            .unwrap()
            .0
    };
    assert!(
        started_at(side) <= started_at(server),
        "the server started before its sidecar"
    );
    eprintln!(
        "sidecar started {}, server started {} (after the start-up gate)",
        started_at(side),
        started_at(server)
    );

    // Requests through the activator reach the pod over the pod network; the sidecar, scraping the server
    // inside the pod, has a recommendation.
    let http = http_client(Duration::from_secs(60));
    let url = activator_url(client).await;
    for _ in 0..5 {
        chat(&http, &url, 4)
            .await
            .expect("a request through the activator");
    }
    let ip = pod_ip(&pod);
    let status_url = format!("http://{ip}:9090/v1/status");
    // On this GPU-less node the sidecar has no NVML (and the webhook hands `--gpu-memory-mib` only to fractional
    // replicas, placed on a GPU pool), so what it says once it has scraped the server is why it cannot size the
    // GPU yet; the document is the sidecar's own, read over the pod network.
    let rec = eventually(
        "the sidecar's recommendation document",
        Duration::from_secs(90),
        || {
            let (http, status_url) = (http.clone(), status_url.clone());
            async move {
                let doc: Value = http.get(&status_url).send().await.ok()?.json().await.ok()?;
                (doc["vllm_up"] == true).then_some(())?;
                doc.get("recommendation")
                    .filter(|r| r["outcome"].is_object())
                    .cloned()
            }
        },
    )
    .await;
    eprintln!("recommendation from the sidecar in {name} ({status_url}): {rec}");
}

async fn story_d(client: &kube::Client) {
    let mut rows = Vec::new();
    let mut pods = Api::<Pod>::namespaced(client.clone(), "tessera-system")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    pods.extend(ready_pods(client, "models", "app=llama").await);
    for p in &pods {
        let pod = p.metadata.name.clone().unwrap();
        let ns = p.metadata.namespace.clone().unwrap();
        for (container, id) in container_ids(p) {
            // The model's own server is the user's container: only what the chart and the webhook make is judged.
            if ns == "models" && container != "tessera-sidecar" {
                continue;
            }
            let pid = container_pid(&id);
            let (f, root) = process_facts(pid);
            let who = format!("{pod}/{container} (pid {pid})");
            assert_eq!(f["Uid"], "65532 65532 65532 65532", "{who}: {f:?}");
            assert_eq!(f["Gid"], "65532 65532 65532 65532", "{who}: {f:?}");
            for cap in ["CapEff", "CapPrm", "CapBnd", "CapAmb"] {
                assert_eq!(f[cap], "0000000000000000", "{who}: {cap} {f:?}");
            }
            assert_eq!(f["NoNewPrivs"], "1", "{who}: {f:?}");
            assert_eq!(
                f["Seccomp"], "2",
                "{who}: seccomp filter mode (RuntimeDefault) {f:?}"
            );
            assert!(root.split(',').any(|o| o == "ro"), "{who}: root mounted {root}");
            if container == "tessera-sidecar" {
                // The injected sidecar runs the image's sidecar-only binary (less memory beside every replica).
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let exe = cmdline.split(|b| *b == 0).next().unwrap_or_default();
                assert_eq!(
                    exe,
                    b"/usr/local/bin/tessera-sidecar",
                    "{who}: {}",
                    String::from_utf8_lossy(&cmdline)
                );
                let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
                    .unwrap_or_default()
                    .lines()
                    .find_map(|l| l.strip_prefix("VmRSS:").map(|v| v.trim().to_owned()))
                    .unwrap_or_default();
                eprintln!("{who}: /usr/local/bin/tessera-sidecar, VmRSS {rss} (debug build)");
            }
            rows.push(format!(
                "{who:<62} Uid {} CapEff {} NoNewPrivs {} Seccomp {} root {}",
                f["Uid"], f["CapEff"], f["NoNewPrivs"], f["Seccomp"], root
            ));
        }
    }
    assert!(rows.len() >= 7, "every container was judged: {rows:?}");
    eprintln!("story d, from /proc/PID/status and /proc/PID/mountinfo of each container's init process:");
    for r in rows {
        eprintln!("  {r}");
    }
}

async fn story_b(node: &RealNode, client: &kube::Client, model_ip: &str) {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "models");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "models");
    let old = ready_pods(client, "models", "app=llama").await.remove(0);
    let old_name = old.metadata.name.clone().unwrap();
    support::cluster::merge_patch(
        &ias_api(client, "models"),
        "llama",
        json!({"spec": {"minReplicas": 0}}),
    )
    .await;
    let t = Instant::now();
    eventually(
        "the controller to scale to zero when idle",
        Duration::from_secs(120),
        || async {
            let d = deployments.get("llama").await.ok()?;
            (d.spec?.replicas == Some(0)).then_some(())
        },
    )
    .await;
    eprintln!(
        "idle → replicas 0 {:.1} s after minReplicas 0 (idleAfter 10 s)",
        t.elapsed().as_secs_f64()
    );

    // A long answer asked of the pod itself as it is being stopped: the kubelet's SIGTERM starts the server's
    // drain, and what is in flight is finished, not cut.
    let http = http_client(Duration::from_secs(60));
    let direct = format!("http://{model_ip}:8000/v1/chat/completions");
    let sent = Instant::now();
    let in_flight = tokio::spawn({
        let http = http.clone();
        async move { (chat(&http, &direct, 150).await, sent.elapsed()) }
    });
    let mut terminating_seen = None;
    let mut last_status = None;
    let mut log: Option<String> = None;
    let mut reads = 0_u32;
    let gone = Instant::now() + Duration::from_secs(60);
    loop {
        match pods.get_opt(&old_name).await.unwrap() {
            None => break,
            Some(p) => {
                if p.metadata.deletion_timestamp.is_some() && terminating_seen.is_none() {
                    terminating_seen = Some(sent.elapsed());
                }
                // The longest read wins: the kubelet removes the log with the pod, and a read racing that
                // removal (or a rotation) must not replace what an earlier read saw.
                reads += 1;
                if let Some(l) = node.container_log("models", &old_name, "vllm")
                    && l.len() >= log.as_ref().map_or(0, String::len)
                {
                    log = Some(l);
                }
                last_status = p.status.clone();
            }
        }
        assert!(
            Instant::now() < gone,
            "pod {old_name} was not removed within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (answer, took) = in_flight.await.unwrap();
    let answer = answer.expect("the request in flight when the kubelet stopped the pod was answered");
    let tokens = answer["usage"]["completion_tokens"].as_u64().unwrap_or(0);
    assert_eq!(tokens, 150, "the answer was finished: {answer}");
    let terminating = terminating_seen.expect("the pod was seen terminating");
    assert!(
        took > terminating,
        "the request ended ({took:?}) after the pod began terminating ({terminating:?})"
    );
    let log = log.unwrap_or_default();
    assert!(
        log.contains("shutdown requested"),
        "the server's log shows no SIGTERM (the kubelet's stop signal), longest of {reads} reads:\n{log}"
    );
    let exit = last_status
        .and_then(|s| s.container_statuses)
        .into_iter()
        .flatten()
        .find(|c| c.name == "vllm")
        .and_then(|c| c.state.and_then(|s| s.terminated))
        .map(|t| t.exit_code);
    if let Some(code) = exit {
        assert_eq!(
            code, 0,
            "the server exited {code} (137 would be the kubelet's SIGKILL)"
        );
    }
    eprintln!(
        "scale-down: {old_name} terminating {:.1} s after the request was sent, the 150-token answer finished at \
         {:.1} s, server exit code {exit:?} (seen before removal), SIGTERM in its log",
        terminating.as_secs_f64(),
        took.as_secs_f64()
    );

    // At zero: the activator holds a request, the controller scales up, the kubelet starts a pod, the answer
    // comes.
    let url = activator_url(client).await;
    let t = Instant::now();
    let answer = chat(&http_client(Duration::from_secs(120)), &url, 4)
        .await
        .expect("the request held at zero is answered");
    let cold = t.elapsed();
    let new = ready_pods(client, "models", "app=llama").await;
    assert_eq!(new.len(), 1, "one pod again");
    assert_ne!(
        new[0].metadata.name.as_deref(),
        Some(old_name.as_str()),
        "a new pod"
    );
    assert_eq!(answer["usage"]["completion_tokens"], 4, "{answer}");
    eprintln!(
        "scale from zero on the real node: request → answer {:.1} s (activator hold, controller /scale, scheduler, \
         kubelet: sandbox, image present, sidecar start-up gate, server readiness, EndpointSlice)",
        cold.as_secs_f64()
    );
}

async fn story_c(client: &kube::Client) -> String {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "models");
    let old = ready_pods(client, "models", "app=llama").await.remove(0);
    let old_name = old.metadata.name.clone().unwrap();
    // Requests through the activator, one after another, for the whole roll.
    let url = activator_url(client).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = tokio::spawn({
        let stop = stop.clone();
        async move {
            let http = http_client(Duration::from_secs(60));
            let (mut ok, mut failed) = (0u32, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match chat(&http, &url, 4).await {
                    Ok(_) => ok += 1,
                    Err(e) => failed.push(e),
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (ok, failed)
        }
    });
    let t = Instant::now();
    ias_api(client, "models")
        .patch(
            "llama",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"gpu": {"memory": 8192, "computeFraction": "1", "updateMode": "Recreate"}}}),
            ),
        )
        .await
        .unwrap();
    let hash = eventually(
        "the controller to roll the Deployment",
        Duration::from_secs(90),
        || async {
            let d = deployments.get("llama").await.ok()?;
            d.spec?
                .template
                .metadata?
                .annotations?
                .get("tessera.dev/allocation-hash")
                .cloned()
        },
    )
    .await;
    let rolled = t.elapsed();
    let new = eventually(
        "the replacement pod Ready and the old one gone",
        Duration::from_secs(120),
        || async {
            let pods = Api::<Pod>::namespaced(client.clone(), "models")
                .list(&ListParams::default().labels("app=llama"))
                .await
                .ok()?
                .items;
            let old_gone = pods
                .iter()
                .all(|p| p.metadata.name.as_deref() != Some(old_name.as_str()));
            let ready: Vec<Pod> = pods.into_iter().filter(pod_ready).collect();
            (old_gone && ready.len() == 1).then(|| ready.into_iter().next())?
        },
    )
    .await;
    let replaced = t.elapsed();
    // A few more requests on the new pod alone.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, failed) = load.await.unwrap();
    assert!(failed.is_empty(), "requests lost during the roll: {failed:?}");
    assert!(ok >= 10, "only {ok} requests went through during the roll");
    let ias = ias_api(client, "models").get("llama").await.unwrap();
    eprintln!(
        "roll: template hash {hash} written {:.1} s after the policy change, {} replaced by {} at {:.1} s; {ok} \
         requests through the activator meanwhile, none lost; status.allocation {}",
        rolled.as_secs_f64(),
        old_name,
        new.metadata.name.as_deref().unwrap_or_default(),
        replaced.as_secs_f64(),
        ias.data["status"]["allocation"]
    );
    pod_ip(&new)
}
