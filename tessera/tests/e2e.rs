//! End to end on a real cluster (ignored by default): the whole scale-to-zero loop with real Kubernetes.
//!
//! Needs `kubectl` on PATH, a cluster in `KUBECONFIG` (kind, k3d, minikube, or a real one) and an image holding the
//! `tessera` binary that the cluster can pull, named by `TESSERA_E2E_IMAGE`. See `e2e/README.md`:
//!
//! ```sh
//! TESSERA_E2E_IMAGE=tessera:e2e cargo test -p tessera --test e2e -- --ignored --nocapture
//! ```
//!
//! It applies the CRD, `e2e/manifests.yaml` (the Helm chart rendered with `e2e/values.yaml`: the activator, two
//! autoscaler replicas with leader election, their RBAC) and `e2e/model.yaml` (an emulated vLLM model with the
//! tessera sidecar, and an InferenceAutoscaler with minReplicas 0), then:
//! 1. drives requests through the activator (via `kubectl port-forward`) and waits for a scale-up on request rate;
//! 2. stops, and waits for the model to reach zero replicas after `idleAfter`;
//! 3. sends one request to the model at zero: it is held, wakes the controller, and is answered once a replica is
//!    ready.
//!
//! The namespace is deleted at the end (and on failure), unless `TESSERA_E2E_KEEP=1`.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const NAMESPACE: &str = "tessera-e2e";

fn kubectl(args: &[&str]) -> Result<String, String> {
    let out = Command::new("kubectl")
        .args(args)
        .output()
        .map_err(|e| format!("running kubectl: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn kubectl_apply(yaml: &str) {
    let mut child = Command::new("kubectl")
        .args(["apply", "-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("running kubectl apply");
    {
        use std::io::Write;
        let stdin = child.stdin.as_mut().expect("kubectl stdin");
        stdin
            .write_all(yaml.as_bytes())
            .expect("writing manifests to kubectl");
    }
    let status = child.wait().expect("kubectl apply");
    assert!(status.success(), "kubectl apply failed");
}

struct Cleanup(Option<Child>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::env::var("TESSERA_E2E_KEEP").as_deref() != Ok("1") {
            let _ = kubectl(&["delete", "namespace", NAMESPACE, "--wait=false"]);
        }
    }
}

fn replicas() -> i64 {
    kubectl(&[
        "-n",
        NAMESPACE,
        "get",
        "deployment",
        "e2e-model",
        "-o",
        "jsonpath={.spec.replicas}",
    ])
    .ok()
    .and_then(|s| s.trim().parse().ok())
    .unwrap_or(-1)
}

fn wait_until(what: &str, timeout: Duration, f: impl Fn() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        if Instant::now() > deadline {
            let ias =
                kubectl(&["-n", NAMESPACE, "get", "ias", "e2e-model", "-o", "yaml"]).unwrap_or_default();
            panic!("timed out waiting for {what}; InferenceAutoscaler:\n{ias}");
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    eprintln!("e2e: {what}");
}

async fn chat(client: &reqwest::Client, base: &str) -> reqwest::StatusCode {
    let body = serde_json::json!({
        "model": "e2e-model", "max_tokens": 16,
        "messages": [{"role": "user", "content": "Say hello."}]
    });
    match client
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
    {
        Ok(r) => r.status(),
        Err(e) => panic!("request through the activator failed: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a Kubernetes cluster (KUBECONFIG), kubectl and TESSERA_E2E_IMAGE; see e2e/README.md"]
async fn scale_up_to_zero_and_back_on_a_real_cluster() {
    let Ok(image) = std::env::var("TESSERA_E2E_IMAGE") else {
        panic!(
            "set TESSERA_E2E_IMAGE to an image with the tessera binary the cluster can pull (see e2e/README.md)"
        );
    };
    kubectl(&["version"]).expect("kubectl cannot reach the cluster in KUBECONFIG");
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let crd =
        std::fs::read_to_string(format!("{root}/deploy/crds/inferenceautoscaler.yaml")).expect("the CRD");
    kubectl_apply(&crd);
    kubectl(&[
        "wait",
        "--for=condition=Established",
        "crd/inferenceautoscalers.tessera.dev",
        "--timeout=60s",
    ])
    .expect("CRD established");
    let manifests = std::fs::read_to_string(format!("{root}/e2e/manifests.yaml"))
        .expect("e2e/manifests.yaml")
        .replace("${NAMESPACE}", NAMESPACE)
        .replace("${IMAGE}", &image);
    let model = std::fs::read_to_string(format!("{root}/e2e/model.yaml"))
        .expect("e2e/model.yaml")
        .replace("${NAMESPACE}", NAMESPACE)
        .replace("${IMAGE}", &image);
    let mut cleanup = Cleanup(None);
    kubectl_apply(&manifests);
    kubectl_apply(&model);
    for d in ["tessera-activator", "tessera-autoscaler", "e2e-model"] {
        kubectl(&[
            "-n",
            NAMESPACE,
            "rollout",
            "status",
            &format!("deployment/{d}"),
            "--timeout=180s",
        ])
        .unwrap_or_else(|e| panic!("{d} did not roll out: {e}"));
    }
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    cleanup.0 = Some(
        Command::new("kubectl")
            .args([
                "-n",
                NAMESPACE,
                "port-forward",
                "svc/tessera-activator",
                &format!("{port}:8080"),
            ])
            .stdout(Stdio::null())
            .spawn()
            .expect("kubectl port-forward"),
    );
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(150))
        .build()
        .expect("client");
    let deadline = Instant::now() + Duration::from_secs(30);
    while chat(&client, &base).await != reqwest::StatusCode::OK {
        assert!(
            Instant::now() < deadline,
            "the activator never answered 200 through the port-forward"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // 1. ~6 requests/s against a target of 2 per replica: the controller scales up on the activator's rate.
    let load_until = Instant::now() + Duration::from_secs(60);
    let mut scaled_up = false;
    while Instant::now() < load_until && !scaled_up {
        let batch: Vec<_> = (0..6).map(|_| chat(&client, &base)).collect();
        let codes = futures::future::join_all(batch).await;
        assert!(
            codes.iter().all(|c| c.is_success()),
            "requests failed under load: {codes:?}"
        );
        scaled_up = replicas() > 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(scaled_up, "no scale-up under load");
    eprintln!("e2e: scaled up to {}", replicas());

    // 2. Idle: idleAfter 30s, then to zero.
    wait_until("scale to zero", Duration::from_secs(180), || replicas() == 0);

    // 3. One request at zero: held by the activator, wakes the controller, answered when a replica is ready.
    let started = Instant::now();
    assert_eq!(
        chat(&client, &base).await,
        reqwest::StatusCode::OK,
        "the request that woke the model failed"
    );
    eprintln!("e2e: answered from zero in {:?}", started.elapsed());
    assert!(replicas() >= 1);
    let events = kubectl(&[
        "-n",
        NAMESPACE,
        "get",
        "events",
        "--field-selector",
        "reason=SuccessfulRescale",
    ])
    .unwrap_or_default();
    eprintln!("{events}");
    assert!(
        events.contains("SuccessfulRescale"),
        "no SuccessfulRescale events recorded"
    );
}
