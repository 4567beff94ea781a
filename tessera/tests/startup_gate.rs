//! The start-up gate with real processes over loopback: `tessera sidecar` pairs sharing one GPU UUID, against the
//! in-memory API server (real Lease objects, resourceVersion, 409s), with the emulator standing in for vLLM and the
//! test standing in for kubelet: it starts a pod's "vLLM" only once that pod's sidecar passes `/startup`.

#![allow(clippy::unwrap_used)] // test: a failed request is a test failure

mod support;

use std::time::{Duration, Instant};

use support::Tessera;
use support::apiserver::{ApiServer, LEASES};

const LEASE: &str = "tessera-startup-gpu-0000-shared";

/// A model pod: its sidecar (running) and the port its vLLM will listen on once kubelet starts it.
struct Pod {
    sidecar: Tessera,
    vllm_port: u16,
    vllm: Option<Tessera>,
}

fn sidecar(kubeconfig: &std::path::Path, name: &str, uuid: Option<&str>, vllm_port: u16) -> Tessera {
    support::pool::gate_sidecar(kubeconfig, "pool", "team-a", name, uuid, vllm_port)
}

fn pod(kubeconfig: &std::path::Path, name: &str, uuid: Option<&str>) -> Pod {
    let vllm_port = support::free_port();
    Pod {
        sidecar: sidecar(kubeconfig, name, uuid, vllm_port),
        vllm_port,
        vllm: None,
    }
}

async fn passes(http: &reqwest::Client, p: &Pod) -> bool {
    matches!(http.get(p.sidecar.url("/startup")).send().await, Ok(r) if r.status().is_success())
}

async fn holder(api: &ApiServer) -> Option<String> {
    api.get(LEASES, "pool", LEASE)
        .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
}

/// "kubelet": the startup probe passed, so the pod's vLLM starts (the emulator, 1 s of loading).
fn start_vllm(p: &mut Pod) {
    let listen = format!("127.0.0.1:{}", p.vllm_port);
    p.vllm = Some(Tessera::vllm_sim_at(
        &listen,
        &["--served-model-name", "m", "--startup-delay", "1s"],
    ));
}

async fn until(what: &str, limit: Duration, mut f: impl AsyncFnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if f().await {
            return t0.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out after {limit:?} waiting for {what}");
}

/// The in-memory API server, a kubeconfig for it (in a temp dir the caller keeps alive) and an HTTP client.
async fn cluster() -> (ApiServer, tempfile::TempDir, std::path::PathBuf, reqwest::Client) {
    let api = ApiServer::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kc = api.kubeconfig(dir.path());
    (api, dir, kc, reqwest::Client::new())
}

/// [`cluster`] with pod `a` on the shared GPU, once `a` holds it (its sidecar passes `/startup`).
async fn a_holds_the_gpu() -> (
    ApiServer,
    tempfile::TempDir,
    std::path::PathBuf,
    reqwest::Client,
    Pod,
) {
    let (api, dir, kc, http) = cluster().await;
    let a = pod(&kc, "a", Some("GPU-0000-shared"));
    until("a to take the GPU", Duration::from_secs(20), async || {
        passes(&http, &a).await
    })
    .await;
    (api, dir, kc, http, a)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_gate_two_sidecars_on_one_gpu_never_hold_the_lease_at_once() {
    let (api, _dir, kc, http, mut a) = a_holds_the_gpu().await;
    let mut b = pod(&kc, "b", Some("GPU-0000-shared"));
    // b waits while a's vLLM has not even started: the GPU's lease is a's.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !passes(&http, &b).await,
        "b passed /startup while a holds the GPU"
    );
    let body: serde_json::Value = support::get_json(&http, &b.sidecar.url("/startup")).await;
    assert_eq!(body["holder"], "team-a/a", "{body}");
    // The same in the document the controller reads (an opening by the gate's bound becomes its Warning Event).
    let status: serde_json::Value = support::get_json(&http, &b.sidecar.url("/v1/status")).await;
    assert_eq!(status["startup_gate"]["state"], "waiting", "{status}");
    assert_eq!(status["startup_gate"]["holder"], "team-a/a", "{status}");
    assert_eq!(holder(&api).await.as_deref(), Some("team-a/a"));
    // a's vLLM starts and loads; only when it answers /health does b get the GPU.
    start_vllm(&mut a);
    let a_ready_at = Instant::now();
    let mut overlap = false;
    until("b to take the GPU", Duration::from_secs(30), async || {
        let b_passes = passes(&http, &b).await;
        let a_healthy = matches!(
            http.get(format!("http://127.0.0.1:{}/health", a.vllm_port)).send().await,
            Ok(r) if r.status().is_success()
        );
        overlap |= b_passes && !a_healthy;
        b_passes
    })
    .await;
    assert!(!overlap, "b passed /startup before a's vLLM was ready");
    assert_eq!(holder(&api).await.as_deref(), Some("team-a/b"));
    start_vllm(&mut b);
    until("b to release", Duration::from_secs(30), async || {
        holder(&api).await.is_none()
    })
    .await;
    println!(
        "startup_gate: a loaded alone, b took the GPU {:.1} s after a's vLLM started; lease released after b's",
        a_ready_at.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_gate_a_holder_killed_with_sigkill_loses_the_lease_after_its_duration() {
    let (api, _dir, kc, http, mut a) = a_holds_the_gpu().await;
    let b = pod(&kc, "b", Some("GPU-0000-shared"));
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!passes(&http, &b).await);
    a.sidecar.child.kill().expect("SIGKILL a's sidecar");
    let killed = Instant::now();
    until("b to take over", Duration::from_secs(20), async || {
        passes(&http, &b).await
    })
    .await;
    let after = killed.elapsed();
    assert_eq!(holder(&api).await.as_deref(), Some("team-a/b"));
    // Not before the 2 s lease ran out on b's clock (minus b's read period).
    assert!(
        after >= Duration::from_millis(1_500),
        "b took over {after:?} after the kill"
    );
    println!(
        "startup_gate: holder SIGKILLed, the next pod took the GPU {:.1} s later (lease 2 s)",
        after.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_gate_opens_at_once_for_a_whole_gpu_pod() {
    let (api, _dir, kc, http) = cluster().await;
    let w = pod(&kc, "w", None);
    let took = until(
        "the whole-GPU pod's /startup",
        Duration::from_secs(20),
        async || passes(&http, &w).await,
    )
    .await;
    let body: serde_json::Value = support::get_json(&http, &w.sidecar.url("/startup")).await;
    assert_eq!(body["reason"], "not_shared", "{body}");
    assert!(
        api.list(LEASES).is_empty(),
        "a whole-GPU pod never touches a lease"
    );
    println!(
        "startup_gate: whole-GPU pod passed /startup {} ms after its sidecar bound",
        took.as_millis()
    );
}
