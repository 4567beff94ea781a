//! Tessera against a real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager and
//! kube-scheduler built from upstream source, and kwok playing the kubelets of fake GPU nodes
//! (`scripts/control-plane.sh`; what this tier proves and what it cannot: e2e/README.md).
//!
//! Ignored by default: `scripts/test.sh` builds the control plane (first run) and runs this file with `--ignored
//! --test-threads=1` (each test starts its own control plane; `TESSERA_SKIP_CONTROL_PLANE=1` skips the tier).
//! Every test is one user story, in the order of issue 37:
//! a. `helm install` of the chart (the API server validates every object; the CRD's CEL rules refuse a bad
//!    InferenceAutoscaler with the documented message); `helm uninstall` leaves nothing but the kept CRD;
//! b. the API server calls the webhook through the chart's MutatingWebhookConfiguration on a real pod creation;
//!    with the webhook down, the pod is still admitted (fail open) and the InferenceAutoscaler's status names it
//!    (`SidecarsInjected=False`) until it is replaced;
//! c. the controller scales a real Deployment through `/scale`: to zero when idle, back when the activator holds
//!    a request; the ReplicaSet and pods follow;
//! d. two controllers on a real Lease: the leader is SIGSTOPped, the follower leads within the lease time, the old
//!    leader resumed steps down without writing (the API server's audit log says who wrote what);
//! e. RBAC: each role with its own ServiceAccount's token does its job; the writes it must not make are refused;
//! f. the pool manager's capacity pods are bound by the real scheduler to GPU nodes;
//! g. the activator finds its backends through EndpointSlices written by the real controller-manager;
//! h. the KEDA operator and its metrics adapter (built from their published module) scale a real Deployment
//!    1 → 0 → 1 → 3 → 0 from Tessera's external scaler over TLS with client certificates — above one through the
//!    HPA KEDA creates, reading Tessera's metric through the external metrics API — and the autoscaler never writes
//!    `/scale` (issue 43).
//!
//! Processes talk over loopback only. `TESSERA_TEST_LOGS=1` shows the children's logs; `TESSERA_CONTROL_PLANE_KEEP=1`
//! keeps a failed test's control plane (its DIR is printed) for inspection.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

mod support;
use support::cluster::eventually;
use support::{Killed, free_port, http_client, workspace};

/// One control plane at a time: each is five processes, and the machine this runs on may have two cores.
static SERIAL: Mutex<()> = Mutex::new(());

/// A control plane started by `scripts/control-plane.sh up`, stopped (`down`) on drop.
/// The pools file the chart renders (its `tessera-pools` ConfigMap), written where the chart's pods would mount
/// it; its path, as `--pools-config` takes it.
async fn chart_pools_file(cp: &ControlPlane, client: &kube::Client) -> String {
    let cm = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), "tessera-system")
        .get("tessera-pools")
        .await
        .expect("the chart's pools ConfigMap");
    let pools = cp.dir.join("pools.yaml");
    std::fs::write(&pools, &cm.data.expect("data")["pools.yaml"]).expect("write the pools file");
    pools.to_str().expect("a UTF-8 path").to_owned()
}

impl ControlPlane {
    async fn client(&self) -> kube::Client {
        support::cluster::client(&self.kubeconfig).await
    }

    /// A kubeconfig that authenticates with `token` (a ServiceAccount's), written into the control plane's dir.
    fn token_kubeconfig(&self, name: &str, token: &str) -> PathBuf {
        let path = self.dir.join(format!("{name}.token.kubeconfig"));
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: \"{}\", certificate-authority: \"{}\"}}\n\
                 users:\n- name: u\n  user: {{token: \"{token}\"}}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\n\
                 current-context: c\n",
                self.server,
                self.dir.join("ca.crt").display()
            ),
        )
        .expect("write a token kubeconfig");
        path
    }

    async fn token_client(&self, kubeconfig: &Path) -> kube::Client {
        support::cluster::client(kubeconfig).await
    }

    /// Runs helm (installed by scripts/check-chart.sh into .tools/bin) against this control plane.
    fn helm(&self, args: &[&str]) -> Output {
        support::cluster::helm(&self.kubeconfig, args)
    }

    /// `helm install tessera charts/tessera -n tessera-system --create-namespace --wait` with `sets`, as a user
    /// runs it: the API server validates every object; `--wait` needs every Deployment's pods Ready (kwok).
    fn helm_install(&self, sets: &[&str]) {
        let extra: Vec<&str> = sets.iter().flat_map(|s| ["--set", *s]).collect();
        self.helm_install_with(&extra);
    }

    /// As [`ControlPlane::helm_install`], with helm arguments as given (`--set-json`, ...).
    fn helm_install_with(&self, extra: &[&str]) {
        let mut args = vec![
            "install",
            "tessera",
            "charts/tessera",
            "--namespace",
            "tessera-system",
            "--create-namespace",
            "--wait",
            "--timeout",
            "3m",
            "--set",
            "image.repository=tessera",
            "--set",
            "image.tag=control-plane-test",
        ];
        args.extend_from_slice(extra);
        let out = self.helm(&args);
        assert!(
            out.status.success(),
            "helm install failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The last lines of a component's log (for a failure message).
    fn log_tail(&self, component: &str) -> String {
        let text = std::fs::read_to_string(self.dir.join(format!("{component}.log"))).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// Successful writes of `name`'s `/scale` by `user`, as the audit log recorded them.
    fn scale_writes(&self, name: &str, user: &str) -> usize {
        self.audit()
            .into_iter()
            .filter(|e| {
                e["objectRef"]["subresource"] == "scale"
                    && e["objectRef"]["name"] == name
                    && e["user"]["username"] == user
                    && e["responseStatus"]["code"] == 200
            })
            .count()
    }

    /// The API server's audit log (scripts/control-plane.sh's policy: Lease and /scale writes with their bodies).
    fn audit(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.join("audit.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

use support::control_plane::ControlPlane;

/// Runs one story on its own control plane, one at a time.
fn story<F, Fut>(f: F)
where
    F: FnOnce(std::sync::Arc<ControlPlane>) -> Fut,
    Fut: Future<Output = ()>,
{
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cp = std::sync::Arc::new(ControlPlane::up());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let started = Instant::now();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt.block_on(f(cp.clone()))));
    drop(rt);
    if let Err(panic) = result {
        // The components' own words, for a failure that is theirs (an object refused, a pod never bound).
        for c in [
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok",
        ] {
            eprintln!("---- last lines of {c}'s log ----\n{}", cp.log_tail(c));
        }
        std::panic::resume_unwind(panic);
    }
    eprintln!("story done in {:.1} s", started.elapsed().as_secs_f64());
}

fn ias_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("tessera.dev", "v1alpha1", "InferenceAutoscaler"),
        "inferenceautoscalers",
    )
}

fn ias_api(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &ias_resource())
}

fn ias(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "InferenceAutoscaler",
        "metadata": {"name": name}, "spec": spec
    }))
    .expect("an InferenceAutoscaler")
}

async fn namespace(client: &kube::Client, name: &str, labels: Value) {
    let ns: Namespace = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}
    }))
    .unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("create a namespace");
    // The controller-manager's ServiceAccount controller must create `default` before a pod can be admitted.
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), name);
    eventually("the default ServiceAccount", Duration::from_secs(30), || async {
        sas.get_opt("default").await.ok().flatten()
    })
    .await;
}

/// A Deployment of `replicas` pods that look like a vLLM server (the kwok "kubelet" runs nothing: the test runs
/// the processes at the pod addresses where it needs them). `node_selector` picks the fake nodes.
fn model_deployment(name: &str, replicas: i32, pod_labels: Value, node_selector: Value) -> Deployment {
    let gpu = node_selector.get("nvidia.com/gpu.present").is_some();
    let mut labels = json!({"app": name});
    if let (Some(l), Some(extra)) = (labels.as_object_mut(), pod_labels.as_object()) {
        l.extend(extra.clone());
    }
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": node_selector,
                    "containers": [{
                        "name": "vllm",
                        "image": "vllm/vllm-openai:v0.11.0",
                        "command": ["vllm", "serve", "facebook/opt-125m", "--port", "8000",
                                    "--gpu-memory-utilization", "0.9"],
                        "ports": [{"name": "http", "containerPort": 8000}],
                        "resources": if gpu { json!({"limits": {"nvidia.com/gpu": "1"}}) } else { json!({}) }
                    }]
                }
            }
        }
    }))
    .expect("a Deployment")
}

/// Pods of `app` in `ns` that are Running with an address, sorted by name.
async fn running_pods(client: &kube::Client, ns: &str, app: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut list: Vec<Pod> = pods
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .expect("list pods")
        .items
        .into_iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.status
                    .as_ref()
                    .is_some_and(|s| s.phase.as_deref() == Some("Running") && s.pod_ip.is_some())
        })
        .collect();
    list.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    list
}

fn pod_ip(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("a pod IP")
}

fn has_sidecar(p: &Pod) -> bool {
    let spec = p.spec.as_ref().expect("a pod spec");
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .any(|c| c.name == "tessera-sidecar")
}

/// A ServiceAccount token from the TokenRequest API (what a pod's projected token is), bound to nothing, 1 h.
async fn sa_token(client: &kube::Client, ns: &str, sa: &str) -> String {
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), ns);
    let req: k8s_openapi::api::authentication::v1::TokenRequest = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"audiences": [], "expirationSeconds": 3600}
    }))
    .unwrap();
    let tr: k8s_openapi::api::authentication::v1::TokenRequest = sas
        .create_subresource("token", sa, &PostParams::default(), &req)
        .await
        .unwrap_or_else(|e| panic!("TokenRequest for {ns}/{sa}: {e}"));
    tr.status.and_then(|s| s.token).expect("a token")
}

/// The `jti` of a ServiceAccount token: the API server's audit log names the credential by it
/// (`user.extra["authentication.kubernetes.io/credential-id"]`), which tells two holders of one ServiceAccount apart.
fn token_jti(token: &str) -> String {
    let payload = token.split('.').nth(1).expect("a JWT");
    let v: Value = serde_json::from_slice(&base64url(payload)).expect("a JSON JWT payload");
    v["jti"].as_str().expect("a jti claim").to_owned()
}

/// Decodes unpadded base64url (a JWT segment).
fn base64url(s: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'-' => 62,
        b'_' => 63,
        _ => panic!("not base64url: {c}"),
    };
    let (mut out, mut acc, mut bits) = (Vec::new(), 0u32, 0u32);
    for c in s.trim_end_matches('=').bytes() {
        acc = (acc << 6) | u32::from(value(c));
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(u8::try_from((acc >> bits) & 0xff).unwrap());
        }
    }
    out
}

/// `tessera <args>` as a child with `KUBECONFIG`, its stderr shown with TESSERA_TEST_LOGS=1.
fn tessera(args: &[&str], kubeconfig: &Path, env: &[(&str, &str)]) -> Killed {
    let logs = std::env::var_os("TESSERA_TEST_LOGS").is_some();
    let child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["--log-format", "json"])
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info,kube=warn")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(if logs { Stdio::inherit() } else { Stdio::null() })
        .spawn()
        .expect("start tessera");
    Killed(child)
}

/// `tessera autoscaler` as the chart's autoscaler ServiceAccount (a token of its own), not leader-elected, deciding
/// every second; `extra` adds the flags a story tests. Returns the process and its metrics port.
async fn controller(cp: &ControlPlane, client: &kube::Client, extra: &[&str]) -> (Killed, u16) {
    let kubeconfig = cp.token_kubeconfig(
        "autoscaler",
        &sa_token(client, "tessera-system", "tessera-autoscaler").await,
    );
    let metrics_port = free_port();
    let metrics = format!("127.0.0.1:{metrics_port}");
    let mut args = vec![
        "autoscaler",
        "--metrics-listen",
        &metrics,
        "--sync-period",
        "1s",
        "--leader-elect=false",
    ];
    args.extend_from_slice(extra);
    (tessera(&args, &kubeconfig, &[]), metrics_port)
}

/// Waits until `url` answers 2xx.
async fn wait_ok(url: &str, within: Duration) {
    let client = http_client(Duration::from_secs(5));
    eventually(&format!("{url} to answer"), within, || {
        let client = client.clone();
        async move {
            client
                .get(url)
                .send()
                .await
                .ok()
                .filter(|r| r.status().is_success())
                .map(|_| ())
        }
    })
    .await;
}

fn kill(pid: u32, signal: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .expect("run kill")
        .success();
    assert!(ok, "kill -{signal} {pid} failed");
}

// ---------------------------------------------------------------------------------------------------------------
// a. helm install / CEL / helm uninstall
// ---------------------------------------------------------------------------------------------------------------

#[test]
#[ignore = "needs the control plane: scripts/control-plane.sh build (scripts/test.sh runs it)"]
fn a_helm_install_validates_every_object_cel_refuses_bad_policies_and_uninstall_leaves_nothing() {
    story(|cp| async move {
        let client = cp.client().await;
        cp.helm_install(&[]);

        // Every Deployment of the chart is available (the scheduler bound its pods, kwok ran them).
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), "tessera-system");
        let names: Vec<String> = deployments
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|d| {
                let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                let ready = d.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0);
                let name = d.metadata.name.clone().unwrap_or_default();
                assert_eq!(ready, want, "deployment {name}: {ready} of {want} ready");
                name
            })
            .collect();
        assert_eq!(
            names,
            ["tessera-activator", "tessera-autoscaler", "tessera-webhook"],
            "the chart's Deployments"
        );

        // The CRD's CEL rules, enforced by the API server with the messages docs/autoscaling.md promises.
        namespace(&client, "models", json!({})).await;
        let api = ias_api(&client, "models");
        let refused = |spec: Value| {
            let api = api.clone();
            async move {
                match api.create(&PostParams::default(), &ias("bad", spec)).await {
                    Ok(_) => panic!("the API server accepted a bad InferenceAutoscaler"),
                    Err(kube::Error::Api(e)) => {
                        assert_eq!(e.code, 422, "{e:?}");
                        e.message
                    }
                    Err(e) => panic!("unexpected error: {e}"),
                }
            }
        };
        let target = json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"});
        let msg = refused(json!({"scaleTargetRef": target, "minReplicas": 0, "maxReplicas": 3})).await;
        assert!(
            msg.contains("minReplicas 0 requires scaleToZero (set scaleToZero.idleAfter, e.g. 10m), or set minReplicas >= 1"),
            "{msg}"
        );
        let msg = refused(json!({"scaleTargetRef": target, "minReplicas": 4, "maxReplicas": 3})).await;
        assert!(msg.contains("maxReplicas must be >= minReplicas"), "{msg}");
        let msg = refused(json!({"scaleTargetRef": target, "maxReplicas": 3,
                                 "scaleToZero": {"idleAfter": "10m"}, "minReplicas": 0}))
        .await;
        assert!(msg.contains("scaleToZero needs modelNames"), "{msg}");
        let msg = refused(json!({"scaleTargetRef": target, "maxReplicas": 3, "ttftSlo": "0s"})).await;
        assert!(msg.contains("ttftSlo must be more than 0"), "{msg}");
        // And a good one is accepted as written.
        api.create(
            &PostParams::default(),
            &ias(
                "llama",
                json!({"scaleTargetRef": target, "minReplicas": 0, "maxReplicas": 3,
                                 "modelNames": ["llama"], "scaleToZero": {"idleAfter": "10m"},
                                 "ttftSlo": "500ms", "ttftSloPercentile": 99}),
            ),
        )
        .await
        .expect("a valid InferenceAutoscaler is accepted");

        // helm uninstall: every object the release rendered is gone, but the CRD (crds.keep: an uninstall must
        // never delete every InferenceAutoscaler with it); the Deployments' pods are garbage-collected.
        let manifest = cp.helm(&["get", "manifest", "tessera", "-n", "tessera-system"]);
        assert!(manifest.status.success());
        let objects: Vec<Value> = String::from_utf8_lossy(&manifest.stdout)
            .split("\n---")
            .filter_map(|doc| serde_yaml::from_str::<Value>(doc).ok())
            .filter(Value::is_object)
            .collect();
        assert!(
            objects.len() > 20,
            "the release's manifest has {} objects",
            objects.len()
        );
        let out = cp.helm(&[
            "uninstall",
            "tessera",
            "-n",
            "tessera-system",
            "--wait",
            "--timeout",
            "2m",
        ]);
        assert!(
            out.status.success(),
            "helm uninstall: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let discovery = kube::Discovery::new(client.clone())
            .run()
            .await
            .expect("discovery");
        let mut left = Vec::new();
        for o in &objects {
            let (api_version, kind) = (o["apiVersion"].as_str().unwrap(), o["kind"].as_str().unwrap());
            let name = o["metadata"]["name"].as_str().unwrap();
            let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
            let (ar, caps) = discovery
                .resolve_gvk(&GroupVersionKind::gvk(group, version, kind))
                .unwrap_or_else(|| panic!("the API server does not serve {api_version} {kind}"));
            let api: Api<DynamicObject> = match caps.scope {
                kube::discovery::Scope::Namespaced => Api::namespaced_with(
                    client.clone(),
                    o["metadata"]["namespace"].as_str().unwrap_or("tessera-system"),
                    &ar,
                ),
                kube::discovery::Scope::Cluster => Api::all_with(client.clone(), &ar),
            };
            if api.get_opt(name).await.unwrap().is_some() {
                left.push(format!("{kind}/{name}"));
            }
        }
        assert_eq!(
            left,
            ["CustomResourceDefinition/inferenceautoscalers.tessera.dev"],
            "what helm uninstall left behind"
        );
        let pods: Api<Pod> = Api::namespaced(client.clone(), "tessera-system");
        eventually(
            "the chart's pods to be garbage-collected",
            Duration::from_secs(60),
            || async {
                pods.list(&ListParams::default())
                    .await
                    .unwrap()
                    .items
                    .is_empty()
                    .then_some(())
            },
        )
        .await;
        // The user's InferenceAutoscaler survived with its CRD.
        assert!(api.get_opt("llama").await.unwrap().is_some());
    });
}

// ---------------------------------------------------------------------------------------------------------------
// b. the webhook, called by the API server
// ---------------------------------------------------------------------------------------------------------------

/// Signs a serving certificate for 127.0.0.1 with the chart's own webhook CA (from its Secret), with openssl.
fn serving_cert_from_chart_ca(dir: &Path, ca_crt: &[u8], ca_key: &[u8]) -> (PathBuf, PathBuf) {
    std::fs::write(dir.join("webhook-ca.crt"), ca_crt).unwrap();
    std::fs::write(dir.join("webhook-ca.key"), ca_key).unwrap();
    std::fs::write(
        dir.join("webhook-ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("run openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "webhook.key",
        "-out",
        "webhook.csr",
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        "webhook.csr",
        "-CA",
        "webhook-ca.crt",
        "-CAkey",
        "webhook-ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "webhook-ext.cnf",
        "-out",
        "webhook.crt",
    ]);
    (dir.join("webhook.crt"), dir.join("webhook.key"))
}

/// `tessera webhook` on loopback, called by the API server through the chart's MutatingWebhookConfiguration.
///
/// The chart's Service would route the API server to the webhook pod's address, which kwok hands out and nothing
/// serves (no pod network here); so the installed configuration is pointed at a loopback URL instead, and the
/// webhook serves a certificate for 127.0.0.1 signed by the CA the chart generated (from the chart's Secret).
/// Everything else of the configuration (rules, selectors, failurePolicy, timeout, sideEffects,
/// reinvocationPolicy, the caBundle) stays the chart's. The webhook runs with its ServiceAccount's token.
struct LoopbackWebhook {
    args: Vec<String>,
    kubeconfig: PathBuf,
    metrics_port: u16,
}

impl LoopbackWebhook {
    async fn set_up(cp: &ControlPlane, client: &kube::Client, extra: &[&str]) -> LoopbackWebhook {
        let secret = Api::<Secret>::namespaced(client.clone(), "tessera-system")
            .get("tessera-webhook-tls")
            .await
            .expect("the chart's webhook Secret");
        let data = secret.data.expect("Secret data");
        let (cert, key) = serving_cert_from_chart_ca(&cp.dir, &data["ca.crt"].0, &data["ca.key"].0);
        let port = free_port();
        let metrics_port = free_port();
        let kubeconfig = cp.token_kubeconfig(
            "webhook",
            &sa_token(client, "tessera-system", "tessera-webhook").await,
        );
        let mut args: Vec<String> = [
            "webhook",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--metrics-listen",
            &format!("127.0.0.1:{metrics_port}"),
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--sidecar-image",
            "tessera:control-plane-test",
        ]
        .iter()
        .map(|a| (*a).to_owned())
        .collect();
        args.extend(extra.iter().map(|a| (*a).to_owned()));

        let gvk = GroupVersionKind::gvk(
            "admissionregistration.k8s.io",
            "v1",
            "MutatingWebhookConfiguration",
        );
        let mwcs: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk));
        let mut mwc = mwcs
            .get("tessera-webhook-tessera-system")
            .await
            .expect("the chart's webhook configuration");
        let hooks = mwc.data["webhooks"].as_array_mut().expect("webhooks");
        for h in hooks.iter_mut() {
            assert_eq!(h["failurePolicy"], "Ignore");
            assert_eq!(h["sideEffects"], "NoneOnDryRun");
            assert_eq!(h["reinvocationPolicy"], "IfNeeded");
            let ca = h["clientConfig"]["caBundle"].clone();
            h["clientConfig"] = json!({"url": format!("https://127.0.0.1:{port}/mutate"), "caBundle": ca});
        }
        mwcs.replace("tessera-webhook-tessera-system", &PostParams::default(), &mwc)
            .await
            .expect("point the webhook configuration at the loopback webhook");
        LoopbackWebhook {
            args,
            kubeconfig,
            metrics_port,
        }
    }

    fn start(&self) -> Killed {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        tessera(&args, &self.kubeconfig, &[])
    }

    async fn wait_ready(&self) {
        wait_ok(
            &format!("http://127.0.0.1:{}/ready", self.metrics_port),
            Duration::from_secs(60),
        )
        .await;
    }
}

#[test]
#[ignore = "needs the control plane: scripts/control-plane.sh build (scripts/test.sh runs it)"]
fn b_the_api_server_calls_the_webhook_on_pod_creation_and_admits_pods_when_it_is_down() {
    story(|cp| async move {
        let client = cp.client().await;
        cp.helm_install(&[
            "webhook.replicas=1",
            "activator.enabled=false",
            "autoscaler.replicas=1",
        ]);

        let hook = LoopbackWebhook::set_up(&cp, &client, &[]).await;
        let webhook = hook.start();
        hook.wait_ready().await;
        let metrics_port = hook.metrics_port;

        namespace(&client, "models", json!({})).await;
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), "models");
        deployments
            .create(
                &PostParams::default(),
                &model_deployment(
                    "llama",
                    1,
                    json!({"tessera.dev/inject": "true"}),
                    json!({"nvidia.com/gpu.present": "true"}),
                ),
            )
            .await
            .unwrap();
        let pods = eventually("the injected pod to run", Duration::from_secs(60), || async {
            let p = running_pods(&client, "models", "llama").await;
            (!p.is_empty()).then_some(p)
        })
        .await;
        let pod = &pods[0];
        assert!(
            has_sidecar(pod),
            "the API server's pod has no tessera-sidecar: {:?}",
            pod.spec
        );
        let admitted = support::first_sample(
            &format!("http://127.0.0.1:{metrics_port}/metrics"),
            "tessera_webhook_admission_duration_seconds_count",
        )
        .await
        .unwrap_or(0.0);
        assert!(admitted >= 1.0, "the webhook counted {admitted} admissions");

        // The webhook down: a new pod is admitted unchanged (failurePolicy Ignore), promptly.
        drop(webhook);
        support::cluster::merge_patch(&deployments, "llama", json!({"spec": {"replicas": 2}})).await;
        let started = Instant::now();
        let pods = eventually(
            "a second pod with the webhook down",
            Duration::from_secs(60),
            || async {
                let p = running_pods(&client, "models", "llama").await;
                (p.len() == 2).then_some(p)
            },
        )
        .await;
        let unmanaged: Vec<&Pod> = pods.iter().filter(|p| !has_sidecar(p)).collect();
        assert_eq!(
            unmanaged.len(),
            1,
            "exactly the pod created while the webhook was down lacks the sidecar"
        );
        eprintln!(
            "fail open: pod admitted without the webhook in {:.1} s",
            started.elapsed().as_secs_f64()
        );

        // Back up: the next pod is injected again.
        let _webhook = hook.start();
        hook.wait_ready().await;
        support::cluster::merge_patch(&deployments, "llama", json!({"spec": {"replicas": 3}})).await;
        let pods = eventually("a third pod", Duration::from_secs(60), || async {
            let p = running_pods(&client, "models", "llama").await;
            (p.len() == 3).then_some(p)
        })
        .await;
        assert_eq!(pods.iter().filter(|p| has_sidecar(p)).count(), 2);

        // The status says so: the controller, with the chart's token, names the pod admitted bare and what to do
        // (a count pinned at 3, so only the condition is under test); deleting that pod, as the message says, gets
        // an injected replacement and the condition turns True.
        let bare = pods
            .iter()
            .find(|p| !has_sidecar(p))
            .and_then(|p| p.metadata.name.clone())
            .unwrap();
        ias_api(&client, "models")
            .create(
                &PostParams::default(),
                &ias(
                    "llama",
                    json!({"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"},
                           "minReplicas": 3, "maxReplicas": 3}),
                ),
            )
            .await
            .unwrap();
        let (_controller, _) = controller(&cp, &client, &[]).await;
        let injected = |want: &'static str| {
            let client = client.clone();
            move || {
                let client = client.clone();
                async move {
                    let o = ias_api(&client, "models").get("llama").await.ok()?;
                    o.data["status"]["conditions"]
                        .as_array()?
                        .iter()
                        .find(|c| c["type"] == "SidecarsInjected" && c["status"] == want)
                        .and_then(|c| c["message"].as_str().map(str::to_owned))
                }
            }
        };
        let message = eventually(
            "status SidecarsInjected=False naming the pod admitted without the webhook",
            Duration::from_secs(60),
            injected("False"),
        )
        .await;
        assert!(
            message.starts_with(&format!("1 of 3 pods run without tessera-sidecar ({bare})")),
            "{message}"
        );
        eprintln!("status: {message}");
        Api::<Pod>::namespaced(client.clone(), "models")
            .delete(&bare, &DeleteParams::default())
            .await
            .unwrap();
        let message = eventually(
            "status SidecarsInjected=True once the bare pod is replaced",
            Duration::from_secs(90),
            injected("True"),
        )
        .await;
        eprintln!("status after the bare pod was deleted: {message}");
    });
}

// ---------------------------------------------------------------------------------------------------------------
// d. two controllers on a real Lease
// ---------------------------------------------------------------------------------------------------------------

#[test]
#[ignore = "needs the control plane: scripts/control-plane.sh build (scripts/test.sh runs it)"]
fn d_two_controllers_on_a_real_lease_the_stopped_leader_is_replaced_and_steps_down_without_writing() {
    story(|cp| async move {
        let client = cp.client().await;
        cp.helm_install(&["activator.enabled=false", "webhook.enabled=false"]);
        // Two controllers as the chart's autoscaler ServiceAccount, each with a token of its own (the audit log
        // tells their writes apart by the token's credential id).
        let (lease_s, renew_s, retry_s) = (6u64, 4u64, 1u64);
        let mut procs = Vec::new();
        let mut jtis = Vec::new();
        let mut metrics_urls = Vec::new();
        for id in ["ctl-a", "ctl-b"] {
            let token = sa_token(&client, "tessera-system", "tessera-autoscaler").await;
            jtis.push(token_jti(&token));
            let kubeconfig = cp.token_kubeconfig(id, &token);
            let port = free_port();
            metrics_urls.push(format!("http://127.0.0.1:{port}/metrics"));
            procs.push(tessera(
                &[
                    "autoscaler",
                    "--metrics-listen",
                    &format!("127.0.0.1:{port}"),
                    "--sync-period",
                    "1s",
                    "--leader-elect=true",
                    "--lease-name",
                    "tessera-autoscaler",
                    "--lease-namespace",
                    "tessera-system",
                    "--identity",
                    id,
                    "--lease-duration",
                    &format!("{lease_s}s"),
                    "--renew-deadline",
                    &format!("{renew_s}s"),
                    "--retry-period",
                    &format!("{retry_s}s"),
                ],
                &kubeconfig,
                &[],
            ));
            if id == "ctl-a" {
                // ctl-a first, so it is the leader.
                let leases: Api<Lease> = Api::namespaced(client.clone(), "tessera-system");
                eventually("ctl-a to take the Lease", Duration::from_secs(60), || async {
                    let l = leases.get_opt("tessera-autoscaler").await.ok().flatten()?;
                    (l.spec?.holder_identity.as_deref() == Some("ctl-a")).then_some(())
                })
                .await;
            }
        }
        eventually(
            "ctl-b to report itself a follower",
            Duration::from_secs(60),
            || async {
                (support::first_sample(&metrics_urls[1], "tessera_autoscaler_leader").await == Some(0.0))
                    .then_some(())
            },
        )
        .await;

        // Stop the leader. The follower must lead within the lease duration (plus its retry period and the
        // API server's round trips).
        let leader_pid = procs[0].0.id();
        kill(leader_pid, "STOP");
        let stopped = Instant::now();
        let leases: Api<Lease> = Api::namespaced(client.clone(), "tessera-system");
        eventually(
            "ctl-b to take over the Lease",
            Duration::from_secs(lease_s + 3 * retry_s + 10),
            || async {
                let l = leases.get_opt("tessera-autoscaler").await.ok().flatten()?;
                (l.spec?.holder_identity.as_deref() == Some("ctl-b")).then_some(())
            },
        )
        .await;
        let took_over = stopped.elapsed();
        assert!(
            took_over <= Duration::from_secs(lease_s + 2 * retry_s + 2),
            "the follower took {took_over:?} to lead (lease {lease_s} s)"
        );
        assert_eq!(
            support::first_sample(&metrics_urls[1], "tessera_autoscaler_leader").await,
            Some(1.0)
        );

        // Resume the old leader: it must step down (its renew deadline passed while it was stopped) and never
        // write the Lease again.
        let resumed_at = Timestamp::now();
        kill(leader_pid, "CONT");
        eventually(
            "the resumed leader to step down",
            Duration::from_secs(30),
            || async {
                (support::first_sample(&metrics_urls[0], "tessera_autoscaler_leader").await == Some(0.0))
                    .then_some(())
            },
        )
        .await;
        tokio::time::sleep(Duration::from_secs(lease_s)).await;
        let l = leases.get("tessera-autoscaler").await.unwrap();
        assert_eq!(l.spec.unwrap().holder_identity.as_deref(), Some("ctl-b"));
        let writes_by_old: Vec<Value> = cp
            .audit()
            .into_iter()
            .filter(|e| {
                e["stage"] == "ResponseComplete"
                    && matches!(e["verb"].as_str(), Some("create" | "update" | "patch" | "delete"))
                    && e["requestReceivedTimestamp"]
                        .as_str()
                        .and_then(|t| t.parse::<Timestamp>().ok())
                        .is_some_and(|t| t > resumed_at)
                    && e["user"]["extra"]["authentication.kubernetes.io/credential-id"][0]
                        .as_str()
                        .is_some_and(|c| c.ends_with(&jtis[0]))
                    && e["responseStatus"]["code"]
                        .as_i64()
                        .is_some_and(|c| (200..300).contains(&c))
            })
            .collect();
        assert!(
            writes_by_old.is_empty(),
            "the resumed old leader wrote: {writes_by_old:#?}"
        );
        // The audit log did see both controllers (so the filter above can match them).
        let seen = cp.audit();
        for (id, jti) in ["ctl-a", "ctl-b"].iter().zip(&jtis) {
            assert!(
                seen.iter().any(
                    |e| e["user"]["extra"]["authentication.kubernetes.io/credential-id"][0]
                        .as_str()
                        .is_some_and(|c| c.ends_with(jti.as_str()))
                ),
                "no audit event from {id}'s token"
            );
        }
        eprintln!(
            "lease: follower led {:.1} s after the leader stopped",
            took_over.as_secs_f64()
        );
    });
}

// ---------------------------------------------------------------------------------------------------------------
// e. RBAC per role
// ---------------------------------------------------------------------------------------------------------------

#[test]
#[ignore = "needs the control plane: scripts/control-plane.sh build (scripts/test.sh runs it)"]
fn e_each_role_does_its_job_with_its_own_service_account_and_is_refused_the_rest() {
    story(|cp| async move {
        let admin = cp.client().await;
        cp.helm_install(&[]);
        namespace(&admin, "models", json!({})).await;
        Api::<Deployment>::namespaced(admin.clone(), "models")
            .create(
                &PostParams::default(),
                &model_deployment("llama", 1, json!({}), json!({"nvidia.com/gpu.present": "true"})),
            )
            .await
            .unwrap();
        ias_api(&admin, "models")
            .create(
                &PostParams::default(),
                &ias(
                    "llama",
                    json!({"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"},
                                     "minReplicas": 1, "maxReplicas": 3}),
                ),
            )
            .await
            .unwrap();

        let mut report = Vec::new();
        let mut wrong = Vec::new();
        for role in ["autoscaler", "activator", "webhook"] {
            let token = sa_token(&admin, "tessera-system", &format!("tessera-{role}")).await;
            let c = cp.token_client(&cp.token_kubeconfig(role, &token)).await;
            for (what, expect_allowed, result) in rbac_checks(role, &c).await {
                // Authorization is decided before anything else: a 404 (no such object) or 409 / 422 means the
                // request was authorized; only 403 is a refusal.
                let allowed = match &result {
                    Ok(()) => true,
                    Err(kube::Error::Api(e)) if e.code == 403 => false,
                    Err(kube::Error::Api(e)) if matches!(e.code, 404 | 409 | 422) => true,
                    Err(e) => panic!("{role}: {what}: not an authorization answer: {e}"),
                };
                report.push(format!(
                    "{role:<10} {:<8} {what}",
                    if allowed { "allowed" } else { "refused" }
                ));
                if allowed != expect_allowed {
                    wrong.push(format!(
                        "{role}: {what}: allowed={allowed}, expected {expect_allowed}"
                    ));
                }
            }
        }
        eprintln!(
            "RBAC, as the API server answered each role's own token:\n{}",
            report.join("\n")
        );
        assert!(
            wrong.is_empty(),
            "RBAC differs from the roles' needs:\n{}",
            wrong.join("\n")
        );
    });
}

type Check = (&'static str, bool, Result<(), kube::Error>);

/// Only whether a call was authorized matters, not what it returned.
fn ok<T>(r: Result<T, kube::Error>) -> Result<(), kube::Error> {
    r.map(|_| ())
}

async fn rbac_checks(role: &str, c: &kube::Client) -> Vec<Check> {
    let ias = ias_api(c, "models");
    let deployments: Api<Deployment> = Api::namespaced(c.clone(), "models");
    let pods: Api<Pod> = Api::namespaced(c.clone(), "models");
    let secrets: Api<Secret> = Api::namespaced(c.clone(), "tessera-system");
    let leases: Api<Lease> = Api::namespaced(c.clone(), "tessera-system");
    let replicasets: Api<ReplicaSet> = Api::namespaced(c.clone(), "models");
    let slices: Api<k8s_openapi::api::discovery::v1::EndpointSlice> = Api::namespaced(c.clone(), "models");
    let lp = ListParams::default();
    let scale = Patch::Merge(json!({"spec": {"replicas": 2}}));
    let pp = PatchParams::default();
    let mut checks: Vec<Check> = vec![
        ("list InferenceAutoscalers", true, ok(ias.list(&lp).await)),
        ("list Secrets in the release namespace", false, ok(secrets.list(&lp).await)),
        ("create pods in a model namespace", false, ok(pods.create(&PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "x"}, "spec": {"containers": [{"name": "x", "image": "x"}]}})).unwrap()).await)),
        ("delete a Deployment", false, ok(deployments.delete("llama", &DeleteParams::default()).await)),
        ("change an InferenceAutoscaler's spec", false,
            ok(ias.patch("llama", &pp, &Patch::Merge(json!({"spec": {"maxReplicas": 9}}))).await)),
    ];
    match role {
        "autoscaler" => {
            checks.push((
                "read a Deployment's /scale",
                true,
                ok(deployments.get_scale("llama").await),
            ));
            checks.push((
                "patch a Deployment's /scale",
                true,
                ok(deployments.patch_scale("llama", &pp, &scale).await),
            ));
            checks.push(("list pods", true, ok(pods.list(&lp).await)));
            checks.push((
                "patch an InferenceAutoscaler's status",
                true,
                ok(ias
                    .patch_status(
                        "llama",
                        &pp,
                        &Patch::Merge(json!({"status": {"desiredReplicas": 2}})),
                    )
                    .await),
            ));
            checks.push(("create its leader Lease", true, ok(leases.create(&PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "tessera-autoscaler"}, "spec": {"holderIdentity": "rbac-test"}})).unwrap()).await)));
            checks.push((
                "update its leader Lease",
                true,
                ok(async {
                    let mut l = leases.get("tessera-autoscaler").await?;
                    l.spec.get_or_insert_default().holder_identity = Some("rbac-test-2".into());
                    leases
                        .replace("tessera-autoscaler", &PostParams::default(), &l)
                        .await
                }
                .await),
            ));
            checks.push((
                "update another Lease",
                false,
                ok(async {
                    leases
                        .create(
                            &PostParams::default(),
                            &serde_json::from_value(json!({"metadata": {"name": "someone-else"}})).unwrap(),
                        )
                        .await?;
                    let l = leases.get("someone-else").await?;
                    leases.replace("someone-else", &PostParams::default(), &l).await
                }
                .await),
            ));
        }
        "activator" => {
            checks.push(("list EndpointSlices", true, ok(slices.list(&lp).await)));
            // EndpointSlices name their Service in a label: the activator never reads a Service.
            checks.push((
                "list Services",
                false,
                ok(
                    Api::<k8s_openapi::api::core::v1::Service>::namespaced(c.clone(), "models")
                        .list(&lp)
                        .await,
                ),
            ));
            checks.push((
                "patch a Deployment's /scale",
                false,
                ok(deployments.patch_scale("llama", &pp, &scale).await),
            ));
            checks.push(("list pods", false, ok(pods.list(&lp).await)));
            checks.push((
                "patch an InferenceAutoscaler's status",
                false,
                ok(ias
                    .patch_status(
                        "llama",
                        &pp,
                        &Patch::Merge(json!({"status": {"desiredReplicas": 2}})),
                    )
                    .await),
            ));
        }
        "webhook" => {
            // The Deployment comes from the ReplicaSet's name and the pod-template-hash: never read.
            checks.push((
                "get a ReplicaSet",
                false,
                ok(async {
                    let rs = admin_free_name(&replicasets).await;
                    replicasets.get(&rs).await
                }
                .await),
            ));
            checks.push((
                "patch a Deployment's /scale",
                false,
                ok(deployments.patch_scale("llama", &pp, &scale).await),
            ));
            checks.push((
                "patch pods",
                false,
                ok(pods.patch("x", &pp, &Patch::Merge(json!({}))).await),
            ));
        }
        _ => unreachable!(),
    }
    checks
}

/// The name of the model Deployment's ReplicaSet, read through `rs` itself when it may list (else a name that
/// does not exist, whose 404 still proves `get` was authorized).
async fn admin_free_name(rs: &Api<ReplicaSet>) -> String {
    match rs.list(&ListParams::default()).await {
        Ok(l) => l
            .items
            .first()
            .and_then(|r| r.metadata.name.clone())
            .unwrap_or_default(),
        Err(_) => "llama-missing".into(),
    }
}

// ---------------------------------------------------------------------------------------------------------------
// c. the controller scales a real Deployment through /scale
// ---------------------------------------------------------------------------------------------------------------

/// The chart's grants and ValidatingAdmissionPolicy over the capacity namespace, enforced by the real API server:
/// the gpu-agent's and the webhook's pod grants there (patch) cannot re-image a capacity pod (which would run code
/// of their choosing with hostPID), and neither may create a pod at all — capacity pods are the autoscaler's pool
/// manager's (spares it makes and opens). The agent's annotation and the webhook's booking are the story's happy
/// path around this.
async fn refused_outside_capacity_pods(cp: &ControlPlane, client: &kube::Client, agent: Api<Pod>, cap: &str) {
    let hook = cp
        .token_client(&cp.token_kubeconfig(
            "webhook",
            &sa_token(client, "tessera-system", "tessera-webhook").await,
        ))
        .await;
    let hook: Api<Pod> = Api::namespaced(hook, "tessera-gpus");
    let reimage =
        json!({"spec": {"containers": [{"name": "gpu-agent", "image": "registry.example/evil:1"}]}});
    let refused = |what: &str, r: Result<Pod, kube::Error>, want: &str| match r {
        Err(kube::Error::Api(e)) => {
            assert!(e.code == 403 || e.code == 422, "{what}: {e:?}");
            assert!(e.message.contains(want), "{what}: {}", e.message);
        }
        other => panic!("{what} was not refused: {other:?}"),
    };
    for (who, api) in [("the gpu-agent", &agent), ("the webhook", &hook)] {
        refused(
            &format!("{who} re-imaging a capacity pod"),
            api.patch(cap, &PatchParams::default(), &Patch::Strategic(&reimage))
                .await,
            "never change their spec",
        );
    }
    // Even a pod shaped exactly like a capacity pod: RBAC grants neither of them create (issue 42).
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "not-a-capacity-pod", "labels": {"tessera.dev/capacity-pod": "true"}},
        "spec": {"hostPID": true, "serviceAccountName": "tessera-gpu-agent",
                 "containers": [{"name": "gpu-agent", "image": "ghcr.io/tessera-dev/tessera:0.1.0", "args": ["gpu-agent"]}]}
    }))
    .unwrap();
    for (who, api) in [("the webhook", &hook), ("the gpu-agent", &agent)] {
        refused(
            &format!("{who} creating a pod in the capacity namespace"),
            api.create(&PostParams::default(), &pod).await,
            "forbidden",
        );
    }
}

/// `gpuPools.lendSleepers`: with the chart's grants, the autoscaler's own token may delete a model pod (the sleeper
/// whose room was lent) and create a GPU's start-up Lease in the capacity namespace (held while that pod goes);
/// the webhook's may do neither. Checked with server-side dry runs, so nothing is deleted or created.
async fn lending_grants(cp: &ControlPlane, client: &kube::Client) {
    let token = |sa: &'static str| async move {
        cp.token_client(&cp.token_kubeconfig(
            sa,
            &sa_token(client, "tessera-system", &format!("tessera-{sa}")).await,
        ))
        .await
    };
    let (autoscaler, webhook) = (token("autoscaler").await, token("webhook").await);
    let victim = running_pods(client, "models", "llama")
        .await
        .into_iter()
        .next()
        .expect("a llama pod");
    let name = victim.metadata.name.clone().unwrap();
    let dry = DeleteParams {
        dry_run: true,
        ..DeleteParams::default()
    };
    let lease: k8s_openapi::api::coordination::v1::Lease = serde_json::from_value(json!({
        "metadata": {"name": "tessera-startup-gpu-dry-run"},
        "spec": {"holderIdentity": "tessera-pool/evicting/models/x", "leaseDurationSeconds": 60}
    }))
    .unwrap();
    let pp = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let mut results = Vec::new();
    for (who, c) in [("autoscaler", &autoscaler), ("webhook", &webhook)] {
        let deleted = Api::<Pod>::namespaced(c.clone(), "models")
            .delete(&name, &dry)
            .await;
        let created = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(c.clone(), "tessera-gpus")
            .create(&pp, &lease)
            .await;
        results.push((who, deleted.is_ok(), created.is_ok()));
        for (what, e) in [("delete", deleted.err()), ("create lease", created.err())] {
            if let Some(kube::Error::Api(e)) = e {
                assert_eq!(e.code, 403, "{who} {what}: {e:?}");
            }
        }
    }
    assert_eq!(
        results,
        [("autoscaler", true, true), ("webhook", false, false)],
        "lendSleepers grants the autoscaler (only) pod delete and the capacity namespace's Leases"
    );
    assert!(
        running_pods(client, "models", "llama")
            .await
            .iter()
            .any(|p| p.metadata.name.as_deref() == Some(&name)),
        "a dry run deletes nothing"
    );
}

/// The emulator and the sidecar for one model pod, the sidecar at the pod's address (kwok gave it a loopback one).
/// The activator and the autoscaler, each with its own ServiceAccount's token from the chart, the autoscaler
/// deciding every second for sidecars on `sidecar_port` and reading the activator's demand; `extra` adds flags.
async fn activator_and_controller(
    cp: &ControlPlane,
    client: &kube::Client,
    sidecar_port: u16,
    extra: &[&str],
) -> (support::Tessera, Killed) {
    let act_kubeconfig = cp.token_kubeconfig(
        "activator",
        &sa_token(client, "tessera-system", "tessera-activator").await,
    );
    let activator = support::Tessera::start_with_env(
        &["activator", "--listen", "127.0.0.1:0", "--hold-timeout", "90s"],
        &[("KUBECONFIG", act_kubeconfig.to_str().unwrap())],
    );
    let (sidecar_port, activator_url) = (sidecar_port.to_string(), activator.admin_base());
    let mut args = vec![
        "--sidecar-port",
        &sidecar_port,
        "--activator-url",
        &activator_url,
        "--activator-poll-interval",
        "300ms",
    ];
    args.extend_from_slice(extra);
    let (ctl, _) = controller(cp, client, &args).await;
    (activator, ctl)
}

/// A chat request for `llama` in `models` through the activator, sent in the background; returns once the
/// activator holds it (the model is at zero).
async fn held_request(activator: &support::Tessera) -> tokio::task::JoinHandle<Result<u16, reqwest::Error>> {
    let url = activator.url("/namespaces/models/v1/chat/completions");
    let held = tokio::spawn(async move {
        http_client(Duration::from_secs(120))
            .post(url)
            .json(
                &json!({"model": "llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
            )
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    activator
        .wait_activator_stats("the request held", Duration::from_secs(30), |s| {
            s["models"]["models/llama"]["queued"] == 1
        })
        .await;
    held
}

/// A Deployment `llama` of one pod on a GPU node and its InferenceAutoscaler (`minReplicas: 0`, `maxReplicas: 3`,
/// to zero after 8 s idle, plus `extra` spec fields); returns the Deployments API and the running pod.
async fn llama_on_a_gpu(client: &kube::Client, extra: Value) -> (Api<Deployment>, Vec<Pod>) {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "models");
    deployments
        .create(
            &PostParams::default(),
            &model_deployment("llama", 1, json!({}), json!({"nvidia.com/gpu.present": "true"})),
        )
        .await
        .unwrap();
    let mut spec = json!({
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"},
        "minReplicas": 0, "maxReplicas": 3, "modelNames": ["llama"],
        "scaleToZero": {"idleAfter": "8s"}
    });
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    ias_api(client, "models")
        .create(&PostParams::default(), &ias("llama", spec))
        .await
        .unwrap();
    let pods = eventually("the model pod to run", Duration::from_secs(60), || async {
        let p = running_pods(client, "models", "llama").await;
        (p.len() == 1).then_some(p)
    })
    .await;
    (deployments, pods)
}

fn model_processes(pod_ip: &str, sidecar_port: u16) -> (support::Tessera, support::Tessera) {
    model_processes_with(pod_ip, sidecar_port, &[])
}

/// As [`model_processes`], with more of the emulator's flags (`--max-num-seqs 1`: a queue with little load).
fn model_processes_with(
    pod_ip: &str,
    sidecar_port: u16,
    emulator: &[&str],
) -> (support::Tessera, support::Tessera) {
    let mut args = vec![
        "--model-preset",
        "opt-125m",
        "--gpu",
        "l4",
        "--served-model-name",
        "llama",
    ];
    args.extend_from_slice(emulator);
    let sim = support::Tessera::vllm_sim(&args);
    let sidecar = support::Tessera::start(&[
        "sidecar",
        "--vllm-url",
        &sim.base(),
        "--listen",
        &format!("{pod_ip}:{sidecar_port}"),
        "--scrape-interval",
        "200ms",
        "--no-nvml",
    ]);
    (sim, sidecar)
}

async fn replicas(deployments: &Api<Deployment>, name: &str) -> (i32, i32) {
    let d = deployments.get(name).await.expect("get the Deployment");
    (
        d.spec.and_then(|s| s.replicas).unwrap_or(0),
        d.status.and_then(|s| s.ready_replicas).unwrap_or(0),
    )
}

#[test]
#[ignore = "needs the control plane: scripts/control-plane.sh build (scripts/test.sh runs it)"]
fn c_the_controller_scales_a_real_deployment_to_zero_when_idle_and_back_for_a_held_request() {
    story(|cp| async move {
        let client = cp.client().await;
        cp.helm_install(&["webhook.enabled=false"]);
        namespace(&client, "models", json!({})).await;
        let (deployments, pods) = llama_on_a_gpu(&client, json!({})).await;
        let ip = pod_ip(&pods[0]);
        assert!(ip.starts_with("127.77."), "kwok gave the GPU node's pod {ip}");
        let sidecar_port = free_port();
        let model = model_processes(&ip, sidecar_port);

        // The activator and the controller, each with its own ServiceAccount's token from the chart.
        let (activator, _controller) = activator_and_controller(&cp, &client, sidecar_port, &[]).await;

        // Idle (no request through the activator for idleAfter): to zero through /scale; the ReplicaSet and its
        // pod follow.
        let started = Instant::now();
        eventually(
            "the controller to scale the Deployment to zero",
            Duration::from_secs(90),
            || async { (replicas(&deployments, "llama").await.0 == 0).then_some(()) },
        )
        .await;
        let to_zero = started.elapsed();
        eventually("the pods to go", Duration::from_secs(60), || async {
            running_pods(&client, "models", "llama")
                .await
                .is_empty()
                .then_some(())
        })
        .await;
        drop(model);
        let rs: Api<ReplicaSet> = Api::namespaced(client.clone(), "models");
        let sets = rs
            .list(&ListParams::default().labels("app=llama"))
            .await
            .unwrap()
            .items;
        assert!(
            sets.iter()
                .all(|r| r.spec.as_ref().and_then(|s| s.replicas) == Some(0)),
            "the ReplicaSet did not follow the Deployment to zero"
        );

        // A request at zero: the activator holds it, the controller reads the held request from the activator's
        // stats and scales back to one; the ReplicaSet creates a pod, the scheduler binds it, kwok runs it.
        let held = held_request(&activator).await;
        let woke = Instant::now();
        eventually(
            "the controller to scale back to one",
            Duration::from_secs(60),
            || async { (replicas(&deployments, "llama").await.0 == 1).then_some(()) },
        )
        .await;
        let back = woke.elapsed();
        eventually("a new pod to run", Duration::from_secs(60), || async {
            (running_pods(&client, "models", "llama").await.len() == 1).then_some(())
        })
        .await;
        eprintln!(
            "controller: to zero {:.1} s after start (idleAfter 8 s), back to one {:.1} s after the request was held",
            to_zero.as_secs_f64(),
            back.as_secs_f64()
        );
        // The held request cannot be answered here: the new pod's address is a loopback one, which the API server
        // refuses in EndpointSlices, so the activator never sees it ready (story g shows discovery with routable
        // addresses; e2e/README.md says what only a cluster with a pod network proves).
        held.abort();
        // What the controller wrote, as the API server recorded it: /scale patches by its token.
        let scale_writes =
            cp.scale_writes("llama", "system:serviceaccount:tessera-system:tessera-autoscaler");
        assert!(
            scale_writes >= 2,
            "{scale_writes} /scale writes by the controller in the audit log"
        );
    });
}

// ---------------------------------------------------------------------------------------------------------------
// g. the activator's backends from EndpointSlices written by the real controller-manager
// ---------------------------------------------------------------------------------------------------------------

#[test]
#[ignore = "needs the control plane: scripts/control-plane.sh build (scripts/test.sh runs it)"]
fn g_the_activator_finds_backends_through_endpointslices_written_by_the_controller_manager() {
    story(|cp| async move {
        let client = cp.client().await;
        cp.helm_install(&["webhook.enabled=false"]);
        namespace(&client, "models", json!({})).await;
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), "models");
        // On the CPU node, whose pod CIDR is not loopback: the API server refuses loopback addresses in
        // EndpointSlices. These addresses are never dialled.
        deployments
            .create(
                &PostParams::default(),
                &model_deployment("llama", 2, json!({}), json!({"kubernetes.io/hostname": "cpu-a"})),
            )
            .await
            .unwrap();
        let svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "llama"},
            "spec": {"selector": {"app": "llama"}, "ports": [{"name": "http", "port": 8000, "targetPort": "http"}]}
        }))
        .unwrap();
        Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), "models")
            .create(&PostParams::default(), &svc)
            .await
            .unwrap();
        ias_api(&client, "models")
            .create(
                &PostParams::default(),
                &ias(
                    "llama",
                    json!({
                        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"},
                        "minReplicas": 1, "maxReplicas": 3, "modelNames": ["llama"]
                    }),
                ),
            )
            .await
            .unwrap();
        let act_kubeconfig = cp.token_kubeconfig(
            "activator",
            &sa_token(&client, "tessera-system", "tessera-activator").await,
        );
        let activator = support::Tessera::start_with_env(
            &["activator", "--listen", "127.0.0.1:0"],
            &[("KUBECONFIG", act_kubeconfig.to_str().unwrap())],
        );
        let ready = |n: u64| {
            let activator = &activator;
            async move {
                activator
                    .wait_activator_stats(&format!("{n} ready backends"), Duration::from_secs(60), |s| {
                        s["models"]["models/llama"]["readyBackends"] == n
                    })
                    .await
            }
        };
        ready(2).await;
        // The slices are the controller-manager's, with the pods' addresses.
        let slices: Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
            Api::namespaced(client.clone(), "models");
        let list = slices
            .list(&ListParams::default().labels("kubernetes.io/service-name=llama"))
            .await
            .unwrap()
            .items;
        assert!(!list.is_empty());
        for s in &list {
            assert_eq!(
                s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("endpointslice.kubernetes.io/managed-by"))
                    .map(String::as_str),
                Some("endpointslice-controller.k8s.io")
            );
        }
        let mut addresses: Vec<String> = list
            .iter()
            .flat_map(|s| s.endpoints.iter().flatten().flat_map(|e| e.addresses.clone()))
            .collect();
        addresses.sort();
        let mut pods: Vec<String> = running_pods(&client, "models", "llama")
            .await
            .iter()
            .map(pod_ip)
            .collect();
        pods.sort();
        assert_eq!(addresses, pods, "the slices list the running pods");

        // Scale out and in: the slices follow the pods, the activator follows the slices.
        for n in [3, 1] {
            deployments
                .patch_scale(
                    "llama",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"replicas": n}})),
                )
                .await
                .unwrap();
            ready(u64::try_from(n).unwrap()).await;
        }
    });
}

// ---------------------------------------------------------------------------------------------------------------
// f. the pool manager's capacity pods, bound by the real scheduler
// ---------------------------------------------------------------------------------------------------------------

fn is_capacity_pod(p: &Pod) -> bool {
    p.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key("tessera.dev/capacity-pod"))
}

#[test]
#[ignore = "needs the control plane: scripts/control-plane.sh build (scripts/test.sh runs it)"]
#[expect(
    clippy::too_many_lines,
    reason = "one story against real processes, told in order: each step starts from the state the last one left"
)]
fn f_capacity_pods_are_bound_by_the_scheduler_fractional_pods_land_beside_them_and_empty_gpus_are_released() {
    story(|cp| async move {
        let client = cp.client().await;
        // Capacity pods get a namespace of their own (the chart refuses the release namespace: tenants get Lease
        // grants there), labelled for hostPID as docs/install.md says.
        namespace(
            &client,
            "tessera-gpus",
            json!({"pod-security.kubernetes.io/enforce": "privileged"}),
        )
        .await;
        cp.helm_install_with(&[
            "--set", "gpuPools.namespace=tessera-gpus",
            "--set", "webhook.replicas=1", "--set", "autoscaler.replicas=1", "--set", "activator.enabled=false",
            "--set", "gpuPools.enabled=true", "--set", "gpuPools.lendSleepers=true",
            // The first replica's reservation lands before its capacity pod has a node, so that replica is
            // admitted with its whole GPU and the reservation lapses by this TTL (a short one, for the test).
            "--set", "gpuPools.reservationTtl=10s",
            "--set-json",
            r#"gpuPools.pools=[{"name":"l4","nodeSelector":{"nvidia.com/gpu.product":"NVIDIA-L4"},"gpuMemoryMiB":23034,"sharing":"time-slicing","maxGpus":4,"emptyGpuGracePeriod":"30s"}]"#,
        ]);
        let pools_arg = chart_pools_file(&cp, &client).await;

        let hook = LoopbackWebhook::set_up(&cp, &client, &["--pools-config", &pools_arg]).await;
        let _webhook = hook.start();
        hook.wait_ready().await;
        let (_controller, metrics_port) = controller(
            &cp,
            &client,
            &["--pools-config", &pools_arg, "--pool-interval", "1s"],
        )
        .await;
        wait_ok(
            &format!("http://127.0.0.1:{metrics_port}/ready"),
            Duration::from_secs(60),
        )
        .await;

        namespace(&client, "models", json!({})).await;
        ias_api(&client, "models")
            .create(
                &PostParams::default(),
                &ias("llama", json!({
                    "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"},
                    "minReplicas": 1, "maxReplicas": 3,
                    "gpu": {"sharing": "fractional", "memory": 8000, "computeFraction": "0.3", "updateMode": "Initial"}
                })),
            )
            .await
            .unwrap();
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), "models");
        deployments
            .create(
                &PostParams::default(),
                &model_deployment(
                    "llama",
                    1,
                    json!({"tessera.dev/inject": "true"}),
                    json!({"nvidia.com/gpu.present": "true"}),
                ),
            )
            .await
            .unwrap();

        // The first fractional pod's admission books on the leader's spare capacity pod (the webhook creates no pod);
        // the leader lifts its gate and the real scheduler binds it to a GPU node.
        let capacity: Api<Pod> = Api::namespaced(client.clone(), "tessera-gpus");
        let cap = eventually(
            "a capacity pod bound to a GPU node",
            Duration::from_secs(60),
            || async {
                capacity
                    .list(&ListParams::default().labels("tessera.dev/capacity-pod"))
                    .await
                    .ok()?
                    .items
                    .into_iter()
                    .find(|p| {
                        is_capacity_pod(p)
                            && p.spec
                                .as_ref()
                                .and_then(|s| s.node_name.as_deref())
                                .is_some_and(|n| n.starts_with("gpu-"))
                            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    })
            },
        )
        .await;
        let cap_name = cap.metadata.name.clone().unwrap();
        let node = cap.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap();
        // Play the gpu-agent (kwok runs no container): publish the GPU's UUID on the capacity pod with the agent's
        // own ServiceAccount token, as sidecar/src/agent/publish.rs does.
        let agent = cp
            .token_client(&cp.token_kubeconfig(
                "gpu-agent",
                &sa_token(&client, "tessera-gpus", "tessera-gpu-agent").await,
            ))
            .await;
        let agent_api = Api::<Pod>::namespaced(agent, "tessera-gpus");
        agent_api
            .patch(
                &cap_name,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {"tessera.dev/gpu-uuid": format!("GPU-{node}-0")}}}),
                ),
            )
            .await
            .expect("the gpu-agent's token may annotate its capacity pod");
        refused_outside_capacity_pods(&cp, &client, agent_api, &cap_name).await;
        lending_grants(&cp, &client).await;

        // The next replica is placed on that GPU: it lands on the capacity pod's node, beside it.
        deployments
            .patch_scale(
                "llama",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 2}})),
            )
            .await
            .unwrap();
        let placed = eventually(
            "a fractional replica placed beside the capacity pod",
            Duration::from_secs(60),
            || async {
                running_pods(&client, "models", "llama")
                    .await
                    .into_iter()
                    .find(|p| {
                        p.metadata
                            .annotations
                            .as_ref()
                            .is_some_and(|a| a.contains_key("tessera.dev/gpu-memory"))
                    })
            },
        )
        .await;
        assert_eq!(
            placed.spec.as_ref().and_then(|s| s.node_name.as_deref()),
            Some(node.as_str()),
            "the fractional replica's node"
        );
        // The memory flag and the GPU the webhook wrote, as the API server stored them: 8000 MiB of a 23034 MiB
        // GPU, and the UUID the agent published.
        let vllm = placed
            .spec
            .as_ref()
            .and_then(|s| s.containers.iter().find(|c| c.name == "vllm"))
            .expect("the vllm container");
        let words: Vec<&str> = vllm
            .command
            .iter()
            .flatten()
            .chain(vllm.args.iter().flatten())
            .map(String::as_str)
            .collect();
        let util: f64 = words
            .iter()
            .position(|w| *w == "--gpu-memory-utilization")
            .and_then(|i| words.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no --gpu-memory-utilization in {words:?}"));
        assert!(
            (util - 8000.0 / 23034.0).abs() < 0.01,
            "--gpu-memory-utilization {util} in {words:?}"
        );
        let visible = vllm
            .env
            .iter()
            .flatten()
            .find(|e| e.name == "NVIDIA_VISIBLE_DEVICES")
            .and_then(|e| e.value.clone());
        assert_eq!(visible, Some(format!("GPU-{node}-0")));

        // No tenants left (the model is deleted; scaling it to zero would be undone by the controller, which keeps
        // minReplicas): once the first replica's unused reservation has lapsed (10 s TTL) and the pool's
        // empty-GPU grace (30 s: long enough that a loaded machine sees the capacity pod bound before the first,
        // expired reservation leaves it empty) has passed, the pool manager deletes the capacity pod.
        ias_api(&client, "models")
            .delete("llama", &DeleteParams::default())
            .await
            .unwrap();
        deployments
            .delete("llama", &DeleteParams::foreground())
            .await
            .unwrap();
        let emptied = Instant::now();
        eventually(
            "the empty GPU's capacity pod to be deleted",
            Duration::from_secs(90),
            || async { capacity.get_opt(&cap_name).await.ok()?.is_none().then_some(()) },
        )
        .await;
        eprintln!(
            "pools: capacity pod {cap_name} on {node} deleted {:.1} s after its last tenant left (TTL 10 s, grace 30 s)",
            emptied.elapsed().as_secs_f64()
        );
    });
}

// ---------------------------------------------------------------------------------------------------------------
// h. the KEDA operator scales a real Deployment from Tessera's external scaler
// ---------------------------------------------------------------------------------------------------------------

/// The KEDA operator built by `scripts/control-plane.sh build` (and its CRDs), run as a process against the control
/// plane with the admin kubeconfig (KEDA's own RBAC is not what this story tests). Its log goes to the control
/// plane's dir.
fn keda_operator(cp: &ControlPlane, cert_dir: &Path, metrics_service_port: u16) -> Killed {
    let bin = workspace().join(".tools/control-plane/bin/keda-operator");
    assert!(
        bin.exists(),
        "{} is missing: scripts/control-plane.sh build builds it",
        bin.display()
    );
    let log = std::fs::File::create(cp.dir.join("keda-operator.log")).expect("the operator's log file");
    let child = Command::new(bin)
        .args([
            &format!("--metrics-bind-address=127.0.0.1:{}", free_port()),
            &format!("--health-probe-bind-address=127.0.0.1:{}", free_port()),
            &format!("--metrics-service-bind-address=127.0.0.1:{metrics_service_port}"),
            &format!("--cert-dir={}", cert_dir.display()),
            "--leader-elect=false",
            "--enable-webhook-patching=false",
            "--enable-apiservice-patching=false",
        ])
        .env("KUBECONFIG", &cp.kubeconfig)
        .env("WATCH_NAMESPACE", "")
        .env("KEDA_CLUSTER_OBJECT_NAMESPACE", "keda")
        .env("POD_NAMESPACE", "keda")
        .env("POD_NAME", "keda-operator-0")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("dup the log"))
        .stderr(log)
        .spawn()
        .expect("start keda-operator");
    Killed(child)
}

/// KEDA's CRDs (from its module, copied by the build), applied and Established.
async fn keda_crds(client: &kube::Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let dir = workspace().join(".tools/control-plane/bin/keda-crds");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        let crd: CustomResourceDefinition = serde_yaml::from_str(&text).expect("a CRD");
        names.push(crd.metadata.name.clone().unwrap());
        crds.create(&PostParams::default(), &crd)
            .await
            .expect("create a KEDA CRD");
    }
    for name in names {
        eventually(
            &format!("CRD {name} to be Established"),
            Duration::from_secs(30),
            || async {
                let c = crds.get(&name).await.ok()?;
                c.status?
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
                    .then_some(())
            },
        )
        .await;
    }
}

/// `Some` when `obj`'s status has a condition of type `kind` that is True.
fn condition_true(obj: &DynamicObject, kind: &str) -> Option<()> {
    obj.data["status"]["conditions"]
        .as_array()?
        .iter()
        .any(|c| c["type"] == kind && c["status"] == "True")
        .then_some(())
}

/// The address KEDA's metrics adapter serves at: the ClusterIP of its Service, in a loopback ServiceCIDR.
const METRICS_API_IP: &str = "127.96.0.10";

/// KEDA's metrics adapter (`keda-adapter`, built beside the operator), serving `external.metrics.k8s.io` — the API
/// the HPA that KEDA creates reads a trigger's metric from, to go above one replica.
///
/// The kube-apiserver reaches an aggregated API at its Service's ClusterIP (it routes to endpoints only with
/// `--enable-aggregator-routing`), and nothing stops a ClusterIP from being a loopback address when a ServiceCIDR
/// holds it, while endpoint addresses may never be loopback. So: a ServiceCIDR `127.96.0.0/24`, the Service at
/// [`METRICS_API_IP`] with the adapter listening there, and an EndpointSlice whose (never dialled) address only
/// satisfies the aggregator's availability check, which wants a ready endpoint with the Service's port name. The
/// API server authenticates to the adapter as the front proxy (`scripts/control-plane.sh`'s
/// `--proxy-client-cert-file`); the adapter trusts that from `extension-apiserver-authentication`, as in a cluster.
async fn keda_metrics_adapter(
    cp: &ControlPlane,
    client: &kube::Client,
    certs: &Path,
    operator_grpc: u16,
) -> Killed {
    let bin = workspace().join(".tools/control-plane/bin/keda-adapter");
    assert!(
        bin.exists(),
        "{} is missing: scripts/control-plane.sh build builds it",
        bin.display()
    );
    let port = free_port();
    let dynamic = |group: &str, version: &str, kind: &str, plural: &str| {
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
    };
    let create = |res: ApiResource, ns: Option<&'static str>, obj: Value| {
        let client = client.clone();
        async move {
            let api = match ns {
                Some(ns) => Api::<DynamicObject>::namespaced_with(client, ns, &res),
                None => Api::<DynamicObject>::all_with(client, &res),
            };
            let what = format!("{} {}", res.kind, obj["metadata"]["name"]);
            api.create(&PostParams::default(), &serde_json::from_value(obj).unwrap())
                .await
                .unwrap_or_else(|e| panic!("create {what}: {e}"));
        }
    };
    create(
        dynamic("networking.k8s.io", "v1", "ServiceCIDR", "servicecidrs"),
        None,
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
               "metadata": {"name": "tessera-loopback"}, "spec": {"cidrs": ["127.96.0.0/24"]}}),
    )
    .await;
    // A new ServiceCIDR is Ready for allocation a moment after it is created.
    let cidrs = Api::<DynamicObject>::all_with(
        client.clone(),
        &dynamic("networking.k8s.io", "v1", "ServiceCIDR", "servicecidrs"),
    );
    eventually(
        "the loopback ServiceCIDR to be Ready",
        Duration::from_secs(30),
        || async { condition_true(&cidrs.get("tessera-loopback").await.ok()?, "Ready") },
    )
    .await;
    create(
        dynamic("", "v1", "Service", "services"),
        Some("keda"),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "keda-metrics-apiserver"},
               "spec": {"clusterIP": METRICS_API_IP,
                        "ports": [{"name": "https", "port": port, "targetPort": port}]}}),
    )
    .await;
    create(
        dynamic("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices"),
        Some("keda"),
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"name": "keda-metrics-apiserver-availability",
                            "labels": {"kubernetes.io/service-name": "keda-metrics-apiserver"}},
               "addressType": "IPv4",
               "endpoints": [{"addresses": ["10.77.0.250"], "conditions": {"ready": true}}],
               "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}),
    )
    .await;
    let ca = std::fs::read(certs.join("ca.crt")).unwrap();
    let services = dynamic("apiregistration.k8s.io", "v1", "APIService", "apiservices");
    create(
        services.clone(),
        None,
        json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
               "metadata": {"name": "v1beta1.external.metrics.k8s.io"},
               "spec": {"service": {"name": "keda-metrics-apiserver", "namespace": "keda", "port": port},
                        "group": "external.metrics.k8s.io", "version": "v1beta1",
                        "groupPriorityMinimum": 100, "versionPriority": 100,
                        // ByteString serializes as base64, as the API's `format: byte` wants.
                        "caBundle": serde_json::to_value(k8s_openapi::ByteString(ca)).unwrap()}}),
    )
    .await;
    let log = std::fs::File::create(cp.dir.join("keda-adapter.log")).expect("the adapter's log file");
    let kubeconfig = cp.kubeconfig.display().to_string();
    let cert_dir = certs.display().to_string();
    let child = Command::new(bin)
        .args([
            format!("--secure-port={port}"),
            format!("--bind-address={METRICS_API_IP}"),
            format!("--tls-cert-file={cert_dir}/tls.crt"),
            format!("--tls-private-key-file={cert_dir}/tls.key"),
            format!("--cert-dir={cert_dir}"),
            format!("--lister-kubeconfig={kubeconfig}"),
            format!("--authentication-kubeconfig={kubeconfig}"),
            format!("--authorization-kubeconfig={kubeconfig}"),
            format!("--metrics-service-address=127.0.0.1:{operator_grpc}"),
            "--port=0".to_owned(),
        ])
        .env("KUBECONFIG", &cp.kubeconfig)
        .env("WATCH_NAMESPACE", "")
        .env("POD_NAMESPACE", "keda")
        .env("KEDA_CLUSTER_OBJECT_NAMESPACE", "keda")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("dup the log"))
        .stderr(log)
        .spawn()
        .expect("start keda-adapter");
    let adapter = Killed(child);
    let apis = Api::<DynamicObject>::all_with(client.clone(), &services);
    eventually(
        "the external metrics API (KEDA's adapter at a loopback ClusterIP) to be Available",
        Duration::from_secs(60),
        || async {
            condition_true(
                &apis.get("v1beta1.external.metrics.k8s.io").await.ok()?,
                "Available",
            )
        },
    )
    .await;
    adapter
}

#[test]
#[ignore = "needs the control plane: scripts/control-plane.sh build (scripts/test.sh runs it)"]
#[expect(
    clippy::too_many_lines,
    reason = "one story against real processes, told in order: each step starts from the state the last one left"
)]
fn h_the_keda_operator_and_its_hpa_scale_a_real_deployment_from_zero_to_three_and_back_on_tesseras_scaler() {
    story(|cp| async move {
        let client = cp.client().await;
        namespace(&client, "keda", json!({})).await;
        cp.helm_install(&["webhook.enabled=false"]);
        namespace(&client, "models", json!({})).await;
        keda_crds(&client).await;

        // The scaler's TLS: served by Tessera, trusted and authenticated by KEDA through a ClusterTriggerAuthentication.
        let pki_dir = cp.dir.join("keda-scaler-pki");
        std::fs::create_dir_all(&pki_dir).unwrap();
        let support::pki::Pki {
            ca,
            server_cert: cert,
            server_key: key,
            client_cert,
            client_key,
        } = support::pki::pki(&pki_dir, &["127.0.0.1", "localhost"]);
        let secret: Secret = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tessera-keda-client"},
            "stringData": {"ca.crt": std::fs::read_to_string(&ca).unwrap(),
                           "tls.crt": std::fs::read_to_string(&client_cert).unwrap(),
                           "tls.key": std::fs::read_to_string(&client_key).unwrap()}
        }))
        .unwrap();
        Api::<Secret>::namespaced(client.clone(), "keda")
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
        // KEDA's own certificates (its --cert-dir): the operator's gRPC metrics service and the metrics adapter dial
        // each other with the one certificate, and the API server checks the adapter's against the APIService's CA.
        let keda_certs = cp.dir.join("keda-certs");
        std::fs::create_dir_all(&keda_certs).unwrap();
        support::pki::peer_pki(
            &keda_certs,
            &["127.0.0.1", "keda-metrics-apiserver.keda.svc", METRICS_API_IP],
        );
        let operator_grpc = free_port();
        let _keda = keda_operator(&cp, &keda_certs, operator_grpc);
        let _metrics_api = keda_metrics_adapter(&cp, &client, &keda_certs, operator_grpc).await;

        // One request running and the rest waiting (`--max-num-seqs 1`) is what asks for more replicas: Tessera's
        // target is one waiting request per replica. Scale-down is not held back (this story's clock is short).
        let (deployments, pods) = llama_on_a_gpu(
            &client,
            json!({"scaledBy": "KEDA", "targets": {"waitingRequestsPerReplica": 1},
                   "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}}}),
        )
        .await;
        let sidecar_port = free_port();
        const QUEUE: &[&str] = &["--max-num-seqs", "1"];
        let model = model_processes_with(&pod_ip(&pods[0]), sidecar_port, QUEUE);

        // The activator and the autoscaler with their own ServiceAccounts' tokens; the autoscaler serves the scaler
        // over TLS with client certificates required.
        let keda_port = free_port();
        let keda_listen = format!("127.0.0.1:{keda_port}");
        let (activator, _controller) = activator_and_controller(
            &cp,
            &client,
            sidecar_port,
            &[
                "--keda-scaler-listen",
                &keda_listen,
                "--keda-tls-cert",
                cert.to_str().unwrap(),
                "--keda-tls-key",
                key.to_str().unwrap(),
                "--keda-client-ca",
                ca.to_str().unwrap(),
            ],
        )
        .await;

        // The ScaledObject and its ClusterTriggerAuthentication, as in deploy/examples/keda-scaledobject.yaml.
        let cta = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("keda.sh", "v1alpha1", "ClusterTriggerAuthentication"),
            "clustertriggerauthentications",
        );
        Api::<DynamicObject>::all_with(client.clone(), &cta)
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "keda.sh/v1alpha1", "kind": "ClusterTriggerAuthentication",
                    "metadata": {"name": "tessera-scaler"},
                    "spec": {"secretTargetRef": [
                        {"parameter": "caCert", "name": "tessera-keda-client", "key": "ca.crt"},
                        {"parameter": "tlsClientCert", "name": "tessera-keda-client", "key": "tls.crt"},
                        {"parameter": "tlsClientKey", "name": "tessera-keda-client", "key": "tls.key"}]}
                }))
                .unwrap(),
            )
            .await
            .unwrap();
        let so = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("keda.sh", "v1alpha1", "ScaledObject"),
            "scaledobjects",
        );
        let started = Instant::now();
        Api::<DynamicObject>::namespaced_with(client.clone(), "models", &so)
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
                    "metadata": {"name": "llama"},
                    "spec": {
                        "scaleTargetRef": {"name": "llama"},
                        "minReplicaCount": 0, "maxReplicaCount": 3,
                        "pollingInterval": 2, "cooldownPeriod": 5,
                        "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}}}},
                        "triggers": [{
                            "type": "external-push",
                            "metadata": {"scalerAddress": format!("127.0.0.1:{keda_port}"), "model": "llama"},
                            "authenticationRef": {"kind": "ClusterTriggerAuthentication", "name": "tessera-scaler"}
                        }]
                    }
                }))
                .unwrap(),
            )
            .await
            .unwrap();

        // KEDA made its HPA; Tessera's status names the ScaledObject as the owner of /scale.
        eventually(
            "KEDA's HPA for the ScaledObject",
            Duration::from_secs(60),
            || async {
                let hpas: Api<k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler> =
                    Api::namespaced(client.clone(), "models");
                hpas.get_opt("keda-hpa-llama").await.ok().flatten().map(|_| ())
            },
        )
        .await;
        eventually(
            "status AbleToScale: ScaledByKEDA",
            Duration::from_secs(30),
            || async {
                let o = ias_api(&client, "models").get("llama").await.ok()?;
                o.data["status"]["conditions"]
                    .as_array()?
                    .iter()
                    .any(|c| {
                        c["type"] == "AbleToScale"
                            && c["reason"] == "ScaledByKEDA"
                            && c["message"]
                                .as_str()
                                .is_some_and(|m| m.contains("ScaledObject llama"))
                    })
                    .then_some(())
            },
        )
        .await;

        // Idle: Tessera decides zero, IsActive turns false, KEDA's operator scales the Deployment to zero.
        eventually(
            "KEDA to scale the Deployment to zero on Tessera's decision",
            Duration::from_secs(120),
            || async { (replicas(&deployments, "llama").await.0 == 0).then_some(()) },
        )
        .await;
        let to_zero = started.elapsed();
        drop(model);

        // A request at zero: held by the activator, pushed to KEDA on StreamIsActive, KEDA scales to one.
        let held = held_request(&activator).await;
        let woke = Instant::now();
        eventually(
            "KEDA to scale back to one on the push",
            Duration::from_secs(60),
            || async { (replicas(&deployments, "llama").await.0 == 1).then_some(()) },
        )
        .await;
        let back = woke.elapsed();
        // The new pod runs its model processes; the client gives up on the held request (no pod network here to
        // answer it: e2e/README.md), the model goes idle, and KEDA takes it to zero once more.
        let pods = eventually("the new model pod to run", Duration::from_secs(60), || async {
            let p = running_pods(&client, "models", "llama").await;
            (p.len() == 1).then_some(p)
        })
        .await;
        let mut running = std::collections::HashMap::new();
        running.insert(
            pod_ip(&pods[0]),
            model_processes_with(&pod_ip(&pods[0]), sidecar_port, QUEUE),
        );
        held.abort();

        // Above one: four clients keep the first replica's queue at three (no pod network here, so they reach
        // its emulator directly, as a Service would). Tessera decides three replicas; KEDA's HPA reads that
        // through the external metrics API (adapter → operator → Tessera's scaler) and the real HPA controller
        // scales the Deployment. Each new pod gets its model processes at its address, so every replica is seen.
        let target = running[&pod_ip(&pods[0])].0.base();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let load: Vec<_> = (0..4)
            .map(|_| {
                let (url, stop) = (format!("{target}/v1/completions"), stop.clone());
                tokio::spawn(async move {
                    let http = http_client(Duration::from_secs(60));
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let _ = http
                            .post(&url)
                            .json(&json!({"model": "llama", "prompt": "hi", "max_tokens": 400,
                                          "ignore_eos": true}))
                            .send()
                            .await;
                    }
                })
            })
            .collect();
        let loaded = Instant::now();
        let scaled_up = loop {
            for p in running_pods(&client, "models", "llama").await {
                running
                    .entry(pod_ip(&p))
                    .or_insert_with(|| model_processes_with(&pod_ip(&p), sidecar_port, QUEUE));
            }
            let (want, ready) = replicas(&deployments, "llama").await;
            if want >= 3 && ready >= 3 {
                break want;
            }
            assert!(
                loaded.elapsed() < Duration::from_secs(120),
                "timed out waiting for the HPA that KEDA made to scale the Deployment above one on Tessera's \
                 decision ({want} wanted, {ready} ready); the adapter's log: {}",
                std::fs::read_to_string(cp.dir.join("keda-adapter.log"))
                    .unwrap_or_default()
                    .lines()
                    .rev()
                    .take(5)
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let up = loaded.elapsed();
        let hpas: Api<k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler> =
            Api::namespaced(client.clone(), "models");
        let hpa = hpas.get("keda-hpa-llama").await.unwrap();
        let reading = serde_json::to_value(&hpa.status).unwrap()["currentMetrics"][0]["external"].clone();
        eprintln!("KEDA's HPA: {reading}");
        assert!(
            reading["metric"]["name"]
                .as_str()
                .is_some_and(|n| n.contains("tessera")),
            "the HPA reads Tessera's metric through the external metrics API: {reading}"
        );
        // The real HPA controller wrote the Deployment's scale, with its own ServiceAccount (not KEDA's operator,
        // which only takes a target from and to zero).
        let hpa_writes = cp.scale_writes(
            "llama",
            "system:serviceaccount:kube-system:horizontal-pod-autoscaler",
        );
        assert!(
            hpa_writes >= 1,
            "the HPA controller wrote /scale {hpa_writes} times"
        );

        // The load ends: Tessera decides zero; the HPA steps down and KEDA takes the Deployment to zero.
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for l in load {
            l.abort();
        }
        let idle = Instant::now();
        eventually(
            "KEDA to scale the Deployment to zero again",
            Duration::from_secs(120),
            || async { (replicas(&deployments, "llama").await.0 == 0).then_some(()) },
        )
        .await;
        let again = idle.elapsed();
        eprintln!(
            "KEDA: to zero {:.1} s after the ScaledObject (idleAfter 8 s, cooldownPeriod 5 s), back to one {:.1} s \
             after the request was held (pollingInterval 2 s), to {scaled_up} {:.1} s after the load began \
             (through KEDA's HPA), to zero again {:.1} s after the load ended",
            to_zero.as_secs_f64(),
            back.as_secs_f64(),
            up.as_secs_f64(),
            again.as_secs_f64()
        );
        drop(running);
        // Who wrote /scale: KEDA (the admin kubeconfig it runs with), never Tessera's autoscaler.
        assert_eq!(
            cp.scale_writes("llama", "system:serviceaccount:tessera-system:tessera-autoscaler"),
            0,
            "spec.scaledBy: KEDA: the autoscaler must never write /scale"
        );
        let keda_writes = cp
            .audit()
            .into_iter()
            .filter(|e| {
                e["objectRef"]["resource"] == "deployments"
                    && e["objectRef"]["name"] == "llama"
                    && e["user"]["username"] == "tessera-test-admin"
                    && matches!(e["verb"].as_str(), Some("update" | "patch"))
            })
            .count();
        assert!(
            keda_writes >= 2,
            "{keda_writes} Deployment writes by KEDA in the audit log"
        );
    });
}

// ---------------------------------------------------------------------------------------------------------------
// dra. gpuPools.mode: dra — claims allocated by the real kube-scheduler (issue 56, stories a-c)
// ---------------------------------------------------------------------------------------------------------------

/// Each claim's `(pool, device, memory MiB, compute milli)` as the scheduler allocated it, by claim name.
async fn dra_allocations(
    client: &kube::Client,
    ns: &str,
) -> std::collections::BTreeMap<String, (String, String, u64, u32)> {
    use k8s_openapi::api::resource::v1::ResourceClaim;
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), ns);
    let mut out = std::collections::BTreeMap::new();
    for c in claims
        .list(&ListParams::default())
        .await
        .expect("list claims")
        .items
    {
        for a in tessera_dra::claim::allocations(&c, |_, _| tessera_dra::claim::ClaimShape {
            memory_mib: u64::MAX,
            compute_milli: u32::MAX,
        }) {
            out.insert(a.claim.clone(), (a.pool, a.device, a.memory_mib, a.compute_milli));
        }
    }
    out
}

/// The value of a metric line `name{labels}` in a Prometheus text page.
fn metric(page: &str, name_and_labels: &str) -> Option<f64> {
    page.lines()
        .find(|l| l.starts_with(name_and_labels))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
#[ignore = "needs the control plane: scripts/control-plane.sh build (scripts/test.sh runs it)"]
#[expect(
    clippy::too_many_lines,
    reason = "one story against real processes, told in order: each step starts from the state the last one left"
)]
fn dra_claims_are_allocated_by_the_scheduler_rolled_onto_a_new_template_and_explained_when_they_fit_nowhere()
{
    story(|cp| async move {
        let client = cp.client().await;
        namespace(&client, "tessera-gpus", json!({})).await;
        // The chart in DRA mode: the API server validates the DeviceClass (resource.k8s.io/v1) and the grants.
        cp.helm_install_with(&[
            "--set", "gpuPools.namespace=tessera-gpus",
            "--set", "webhook.replicas=1", "--set", "autoscaler.replicas=1", "--set", "activator.enabled=false",
            "--set", "gpuPools.enabled=true", "--set", "gpuPools.mode=dra",
            "--set-json",
            r#"gpuPools.pools=[{"name":"l4","nodeSelector":{"nvidia.com/gpu.product":"NVIDIA-L4"},"gpuMemoryMiB":23034,"sharing":"mps","maxGpus":4}]"#,
        ]);
        let classes: Api<k8s_openapi::api::resource::v1::DeviceClass> = Api::all(client.clone());
        classes
            .get(tessera_dra::DEVICE_CLASS)
            .await
            .expect("the chart's DeviceClass");
        let pools_arg = chart_pools_file(&cp, &client).await;
        let hook = LoopbackWebhook::set_up(&cp, &client, &["--pools-config", &pools_arg]).await;
        let _webhook = hook.start();
        hook.wait_ready().await;
        // The controller and pool manager with the chart's own ServiceAccount: its DRA grants are what it uses.
        let (_controller, metrics_port) = controller(
            &cp,
            &client,
            &[
                "--pools-config",
                &pools_arg,
                "--pool-interval",
                "1s",
                // Story b's roll waits for a drift to last this long (30 min by default).
                "--rollout-stability-window",
                "2s",
            ],
        )
        .await;
        let metrics_url = format!("http://127.0.0.1:{metrics_port}/metrics");
        wait_ok(
            &format!("http://127.0.0.1:{metrics_port}/ready"),
            Duration::from_secs(60),
        )
        .await;

        // The pool manager publishes one slice per kwok GPU node (2 GPUs each): 23034 MiB minus the 1024 MiB
        // headroom, and MPS's default two GPUs' worth of compute caps.
        let slices: Api<k8s_openapi::api::resource::v1::ResourceSlice> = Api::all(client.clone());
        let published = eventually(
            "a gpu.tessera.dev slice per GPU node",
            Duration::from_secs(60),
            || async {
                let items = slices.list(&ListParams::default()).await.ok()?.items;
                let ours: Vec<_> = items
                    .into_iter()
                    .filter(|s| s.spec.driver == tessera_dra::DRIVER)
                    .collect();
                (ours.len() == 2).then_some(ours)
            },
        )
        .await;
        for s in &published {
            let (devices, errors) = tessera_dra::slice::published(s);
            assert!(errors.is_empty(), "{errors:?}");
            assert_eq!(devices.len(), 2, "{:?}", s.metadata.name);
            assert!(
                devices
                    .iter()
                    .all(|d| d.memory_mib == 22010 && d.compute_milli == 2000),
                "{devices:?}"
            );
        }

        // a. Three models, five replicas, claims sized by each model's allocation.
        namespace(&client, "models", json!({})).await;
        let models = [
            ("llama", 2, 9000, "0.3"),
            ("qwen", 2, 6000, "0.25"),
            ("mistral", 1, 12000, "0.5"),
        ];
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), "models");
        for (name, replicas, memory, compute) in models {
            ias_api(&client, "models")
                .create(&PostParams::default(), &ias(name, json!({
                    "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                    "minReplicas": replicas, "maxReplicas": 3,
                    "gpu": {"sharing": "fractional", "memory": memory, "computeFraction": compute, "updateMode": "Recreate"}
                })))
                .await
                .unwrap();
            deployments
                .create(
                    &PostParams::default(),
                    &model_deployment(
                        name,
                        replicas,
                        json!({"tessera.dev/inject": "true"}),
                        json!({"nvidia.com/gpu.present": "true"}),
                    ),
                )
                .await
                .unwrap();
        }
        let allocated = eventually(
            "five claims allocated by the scheduler",
            Duration::from_secs(120),
            || async {
                let a = dra_allocations(&client, "models").await;
                (a.len() == 5).then_some(a)
            },
        )
        .await;
        let mut per_device: std::collections::BTreeMap<(String, String), (u64, u32, usize)> =
            Default::default();
        for (claim, (pool, device, memory, compute)) in &allocated {
            let model = models
                .iter()
                .find(|m| claim.starts_with(&format!("models/{}-", m.0)))
                .expect("a model's claim");
            assert_eq!(
                *memory, model.2,
                "{claim}: the consumed memory is the model's allocation"
            );
            let e = per_device.entry((pool.clone(), device.clone())).or_default();
            *e = (e.0 + memory, e.1 + compute, e.2 + 1);
        }
        for ((pool, device), (memory, compute, _)) in &per_device {
            assert!(
                *memory <= 22010 && *compute <= 2000,
                "{pool}/{device} over capacity: {memory} MiB, {compute}m"
            );
        }
        for (name, replicas, _, _) in models {
            let pods = eventually(
                &format!("{name}'s pods running"),
                Duration::from_secs(60),
                || async {
                    let p = running_pods(&client, "models", name).await;
                    (p.len() == replicas as usize).then_some(p)
                },
            )
            .await;
            for p in &pods {
                let claims = p
                    .spec
                    .as_ref()
                    .and_then(|s| s.resource_claims.clone())
                    .unwrap_or_default();
                assert!(
                    claims.iter().any(|c| c.name == tessera_dra::POD_CLAIM),
                    "{:?} has Tessera's claim",
                    p.metadata.name
                );
                assert!(
                    !p.metadata
                        .annotations
                        .as_ref()
                        .unwrap()
                        .contains_key("tessera.dev/capacity-pod")
                );
            }
        }
        // Tessera's pool index agrees with what the scheduler booked, device by device.
        let http = http_client(Duration::from_secs(5));
        let page = eventually(
            "the pool index to agree with the allocations",
            Duration::from_secs(30),
            || async {
                let page = http.get(&metrics_url).send().await.ok()?.text().await.ok()?;
                per_device
                    .iter()
                    .all(|((pool, device), (memory, _, claims))| {
                        let labels = format!("{{node=\"{pool}\",device=\"{device}\"}}");
                        metric(&page, &format!("tessera_pool_dra_memory_used_mib{labels}"))
                            == Some(*memory as f64)
                            && metric(&page, &format!("tessera_pool_dra_claims{labels}"))
                                == Some(*claims as f64)
                    })
                    .then_some(page)
            },
        )
        .await;
        assert_eq!(metric(&page, "tessera_pool_dra_overbooked_claims"), Some(0.0));
        eprintln!(
            "dra a: 5 claims on {} devices; GPUs held by the scheduler's placement {:?}, by Tessera's offline packer {:?}, LP bound {:?}",
            per_device.len(),
            metric(&page, "tessera_pool_dra_gpus{placement=\"scheduler\"}"),
            metric(&page, "tessera_pool_dra_gpus{placement=\"packer\"}"),
            metric(&page, "tessera_pool_dra_gpus{placement=\"bound\"}"),
        );

        // b. A new allocation for llama (9000 -> 11000 MiB) is a new template, and the Recreate roll moves its
        // replicas onto claims of the new size.
        ias_api(&client, "models")
            .patch(
                "llama",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"gpu": {"memory": 11000}}})),
            )
            .await
            .unwrap();
        let templates: Api<k8s_openapi::api::resource::v1::ResourceClaimTemplate> =
            Api::namespaced(client.clone(), "models");
        eventually("the new template", Duration::from_secs(60), || async {
            templates.get_opt("llama-gpu-11000mi-300m").await.ok().flatten()
        })
        .await;
        eventually(
            "llama's replicas on 11000 MiB claims",
            Duration::from_secs(180),
            || async {
                let a = dra_allocations(&client, "models").await;
                let llama: Vec<_> = a.iter().filter(|(c, _)| c.starts_with("models/llama-")).collect();
                let pods = running_pods(&client, "models", "llama").await;
                (pods.len() == 2 && llama.len() == 2 && llama.iter().all(|(_, v)| v.2 == 11000)).then_some(())
            },
        )
        .await;
        eprintln!("dra b: llama rolled onto llama-gpu-11000mi-300m");

        // c. A model whose claim fits no GPU (30000 MiB of 22010 usable) stays Pending; its status and an Event
        // say why and what would make room.
        ias_api(&client, "models")
            .create(&PostParams::default(), &ias("huge", json!({
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "huge"},
                "minReplicas": 1, "maxReplicas": 1,
                "gpu": {"sharing": "fractional", "memory": 30000, "computeFraction": "0.5", "updateMode": "Initial"}
            })))
            .await
            .unwrap();
        deployments
            .create(
                &PostParams::default(),
                &model_deployment(
                    "huge",
                    1,
                    json!({"tessera.dev/inject": "true"}),
                    json!({"nvidia.com/gpu.present": "true"}),
                ),
            )
            .await
            .unwrap();
        let message = eventually(
            "GpuClaimsAllocated=False on huge",
            Duration::from_secs(90),
            || async {
                let obj = ias_api(&client, "models").get("huge").await.ok()?;
                let conditions = obj.data["status"]["conditions"].as_array()?.clone();
                conditions
                    .iter()
                    .find(|c| {
                        c["type"] == "GpuClaimsAllocated"
                            && c["status"] == "False"
                            && c["reason"] == "NoGpuRoom"
                    })
                    .and_then(|c| c["message"].as_str().map(str::to_owned))
            },
        )
        .await;
        assert!(
            message.contains("30000 MiB") && message.contains("largest: 22010 MiB"),
            "{message}"
        );
        let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), "models");
        eventually("a NoGpuRoom Event", Duration::from_secs(30), || async {
            events
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("NoGpuRoom"))
        })
        .await;
        let pending = Api::<Pod>::namespaced(client.clone(), "models")
            .list(&ListParams::default().labels("app=huge"))
            .await
            .unwrap()
            .items;
        assert!(
            pending
                .iter()
                .all(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none()),
            "huge's pod is never bound"
        );
        eprintln!("dra c: {message}");
    });
}
