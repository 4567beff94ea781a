//! Tessera's KEDA external scaler, called as KEDA calls it, over loopback with real processes: the activator in
//! front of `tessera vllm-sim`, the autoscaler with `--no-kube --keda-scaler-listen`, and a "Deployment" whose
//! replicas are emulator + sidecar processes that this test starts and stops as KEDA would scale them.
//!
//! The client follows KEDA's scale loop: `GetMetricSpec` once; per polling interval `GetMetrics` then `IsActive`
//! (inactive: scale to zero after the cooldown; active at zero: to one; otherwise HPA's `AverageValue`,
//! `ceil(value / target)`); an `external-push` stream on `StreamIsActive`, reconnected when it drops, whose
//! `true` scales from zero at once.
//!
//! A second client, generated from the same .proto with Python's grpcio-tools, must get the same answers
//! (`keda_client.py`; `TESSERA_SKIP_GRPC_PYTHON=1` skips it, printed).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tessera_keda::pb;
use tessera_keda::pb::external_scaler_client::ExternalScalerClient;
use tonic::transport::Channel;

mod support;
use support::{Tessera, free_port, http_client};

const WAIT: Duration = Duration::from_secs(30);
/// The test's KEDA polling interval (KEDA's default is 30 s: a scale from zero then rests on the push).
const POLL: Duration = Duration::from_secs(2);

/// The policy the autoscaler decides with: to zero after 3 s idle, no scale-down stabilization (KEDA's cooldown
/// is the one that counts here).
const POLICY: &str = "\
minReplicas: 0
maxReplicas: 1
scaleToZero:
  idleAfter: 3s
targets:
  kvCacheUtilization: 0.8
behavior:
  scaleDown:
    stabilizationWindowSeconds: 0
";

fn scaled_object(model: &str, namespace: &str) -> pb::ScaledObjectRef {
    pb::ScaledObjectRef {
        name: "chat-so".into(),
        namespace: namespace.into(),
        scaler_metadata: HashMap::from([("model".to_owned(), model.to_owned())]),
    }
}

async fn connect(port: u16) -> ExternalScalerClient<Channel> {
    let deadline = Instant::now() + WAIT;
    loop {
        match ExternalScalerClient::connect(format!("http://127.0.0.1:{port}")).await {
            Ok(c) => return c,
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "the scaler on port {port} never accepted: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// The model's replicas: each an emulator and its sidecar on fixed ports (the activator's backend, the
/// autoscaler's `--sidecar`), started and stopped by KEDA's loop below.
struct Deployment {
    emulator_port: u16,
    sidecar_port: u16,
    running: Option<(Tessera, Tessera)>,
    /// Every change: (when, replicas).
    history: Vec<(Instant, u32)>,
}

impl Deployment {
    async fn scale(&mut self, replicas: u32) {
        let now = self.running.is_some() as u32;
        if replicas == now {
            return;
        }
        if replicas == 0 {
            self.running = None;
        } else {
            let (emu, side) = (self.emulator_port, self.sidecar_port);
            self.running = Some(
                tokio::task::spawn_blocking(move || {
                    let sim = Tessera::start(&[
                        "vllm-sim",
                        "--served-model-name",
                        "chat",
                        "--listen",
                        &format!("127.0.0.1:{emu}"),
                        "--time-scale",
                        "20",
                    ]);
                    let sidecar = Tessera::quick_sidecar_at(
                        &format!("http://127.0.0.1:{emu}"),
                        &format!("127.0.0.1:{side}"),
                        &[],
                        &[],
                    );
                    (sim, sidecar)
                })
                .await
                .unwrap(),
            );
        }
        self.history.push((Instant::now(), replicas));
    }
}

/// KEDA's scale loop for one ScaledObject (max one replica here: one `--sidecar`). Runs until dropped.
async fn keda_loop(
    mut client: ExternalScalerClient<Channel>,
    so: pb::ScaledObjectRef,
    deployment: Arc<tokio::sync::Mutex<Deployment>>,
    pushes: Arc<Mutex<Vec<(Instant, bool)>>>,
) {
    let spec = client.get_metric_spec(so.clone()).await.unwrap().into_inner();
    let spec = &spec.metric_specs[0];
    let target = if spec.target_size_float > 0.0 {
        spec.target_size_float
    } else {
        spec.target_size as f64
    };
    // The push stream, reconnected whenever it ends or fails (KEDA does the same).
    let (tx, mut rx) = tokio::sync::mpsc::channel::<bool>(16);
    let (mut push_client, push_so) = (client.clone(), so.clone());
    let push = tokio::spawn(async move {
        loop {
            if let Ok(stream) = push_client.stream_is_active(push_so.clone()).await {
                let mut stream = stream.into_inner();
                while let Ok(Some(m)) = stream.message().await {
                    pushes.lock().unwrap().push((Instant::now(), m.result));
                    let _ = tx.send(m.result).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let _abort = AbortOnDrop(push);
    let mut tick = tokio::time::interval(POLL);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let metric = client
                    .get_metrics(pb::GetMetricsRequest { scaled_object_ref: Some(so.clone()), metric_name: format!("s0-{}", spec.metric_name) })
                    .await;
                let active = client.is_active(so.clone()).await;
                // KEDA keeps the count when the scaler errors.
                let (Ok(metric), Ok(active)) = (metric, active) else { continue };
                let v = &metric.into_inner().metric_values[0];
                let value = if v.metric_value_float != 0.0 { v.metric_value_float } else { v.metric_value as f64 };
                let mut d = deployment.lock().await;
                let current = d.running.is_some() as u32;
                let want = match (active.into_inner().result, current) {
                    (false, _) => 0,
                    (true, 0) => 1,
                    (true, _) => ((value / target).ceil() as u32).clamp(1, 1),
                };
                d.scale(want).await;
            }
            Some(active) = rx.recv() => {
                if active {
                    let mut d = deployment.lock().await;
                    if d.running.is_none() {
                        d.scale(1).await;
                    }
                }
            }
        }
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);
impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// The autoscaler in local mode with the scaler on `keda_port`; `extra` adds flags.
fn autoscaler(
    sidecar_port: u16,
    activator: &str,
    keda_listen: &str,
    policy: &Path,
    extra: &[&str],
) -> Tessera {
    let sidecar = format!("chat=http://127.0.0.1:{sidecar_port}");
    let mut args = vec![
        "autoscaler",
        "--no-kube",
        "--sidecar",
        &sidecar,
        "--activator-url",
        activator,
        "--keda-scaler-listen",
        keda_listen,
        "--metrics-listen",
        "127.0.0.1:0",
        "--sync-period",
        "1s",
        "--policy",
        policy.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    Tessera::start(&args)
}

/// The Python client's answers (`None` when skipped on purpose).
fn python_answers(addr: &str, namespace: &str, model: &str, tls: &[&str]) -> Option<serde_json::Value> {
    if std::env::var("TESSERA_SKIP_GRPC_PYTHON").as_deref() == Ok("1") {
        println!("SKIPPED the Python grpcio client: TESSERA_SKIP_GRPC_PYTHON=1");
        return None;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let python = root.join(".tools/venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: scripts/test.sh installs grpcio-tools there (or set TESSERA_SKIP_GRPC_PYTHON=1)",
        python.display()
    );
    let out = Command::new(python)
        .arg(root.join("tessera/tests/keda_client.py"))
        .args([addr, namespace, model])
        .args(tls)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "keda_client.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(serde_json::from_slice(&out.stdout).unwrap())
}

/// What the Rust client gets for the same three calls, in the Python client's shape.
async fn rust_answers(
    client: &mut ExternalScalerClient<Channel>,
    namespace: &str,
    model: &str,
) -> serde_json::Value {
    let so = scaled_object(model, namespace);
    let err = |s: tonic::Status| serde_json::json!({"code": code_name(s.code()), "message": s.message()});
    let spec = match client.get_metric_spec(so.clone()).await {
        Ok(r) => {
            let s = &r.get_ref().metric_specs[0];
            serde_json::json!({"ok": {"metricName": s.metric_name, "targetSize": s.target_size, "targetSizeFloat": s.target_size_float}})
        }
        Err(s) => err(s),
    };
    let metrics = match client
        .get_metrics(pb::GetMetricsRequest {
            scaled_object_ref: Some(so.clone()),
            metric_name: "s0-tessera-desired-replicas".into(),
        })
        .await
    {
        Ok(r) => {
            let v = &r.get_ref().metric_values[0];
            serde_json::json!({"ok": {"metricName": v.metric_name, "metricValue": v.metric_value, "metricValueFloat": v.metric_value_float}})
        }
        Err(s) => err(s),
    };
    let active = match client.is_active(so).await {
        Ok(r) => serde_json::json!({"ok": r.get_ref().result}),
        Err(s) => err(s),
    };
    serde_json::json!({"spec": spec, "metrics": metrics, "active": active})
}

fn code_name(c: tonic::Code) -> &'static str {
    match c {
        tonic::Code::NotFound => "NOT_FOUND",
        tonic::Code::PermissionDenied => "PERMISSION_DENIED",
        tonic::Code::InvalidArgument => "INVALID_ARGUMENT",
        tonic::Code::Unavailable => "UNAVAILABLE",
        tonic::Code::FailedPrecondition => "FAILED_PRECONDITION",
        _ => "OTHER",
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keda_scales_a_deployment_from_zero_and_back_on_tesseras_decision() {
    let dir = tempfile::tempdir().unwrap();
    let policy = write(dir.path(), "policy.yaml", POLICY);
    let (emulator_port, sidecar_port, keda_port) = (free_port(), free_port(), free_port());
    let act = Tessera::activator_for(
        &format!("chat=http://127.0.0.1:{emulator_port}"),
        &["--hold-timeout", "60s"],
    );
    let keda_listen = format!("127.0.0.1:{keda_port}");
    let scaler = autoscaler(sidecar_port, &act.admin_base(), &keda_listen, &policy, &[]);
    let mut client = connect(keda_port).await;

    // At zero and idle: inactive, a metric of 0 in both fields, against a target of 1.
    let deadline = Instant::now() + WAIT;
    let at_zero = loop {
        let a = rust_answers(&mut client, "default", "chat").await;
        if a["active"]["ok"] == false {
            break a;
        }
        assert!(
            Instant::now() < deadline,
            "the idle model never became inactive: {a}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(at_zero["spec"]["ok"]["metricName"], "tessera-desired-replicas");
    assert_eq!(at_zero["spec"]["ok"]["targetSize"], 1);
    assert_eq!(at_zero["metrics"]["ok"]["metricValue"], 0);
    // Refusals, never a zero: a model nobody declared, and another namespace's model.
    let unknown = rust_answers(&mut client, "default", "nope").await;
    assert_eq!(unknown["metrics"]["code"], "NOT_FOUND", "{unknown}");
    let other = rust_answers(&mut client, "team-b", "default/chat").await;
    assert_eq!(other["active"]["code"], "PERMISSION_DENIED", "{other}");
    // The independent client gets the same answers.
    for (ns, model, rust) in [
        ("default", "chat", &at_zero),
        ("default", "nope", &unknown),
        ("team-b", "default/chat", &other),
    ] {
        if let Some(py) = python_answers(&keda_listen, ns, model, &[]) {
            assert_eq!(&py, rust, "Python and Rust clients disagree on {ns}/{model}");
        }
    }

    // KEDA's loop takes over the Deployment.
    let deployment = Arc::new(tokio::sync::Mutex::new(Deployment {
        emulator_port,
        sidecar_port,
        running: None,
        history: Vec::new(),
    }));
    let pushes = Arc::new(Mutex::new(Vec::new()));
    let keda = AbortOnDrop(tokio::spawn(keda_loop(
        client.clone(),
        scaled_object("chat", "default"),
        deployment.clone(),
        pushes.clone(),
    )));
    // Let the push stream open and send its first (false).
    tokio::time::sleep(Duration::from_millis(500)).await;

    // A request at zero is held by the activator; the push brings a replica without waiting for a poll.
    let sent = Instant::now();
    let url = act.url("/v1/chat/completions");
    let body = serde_json::json!({ "model": "chat", "max_tokens": 8,
        "messages": [{ "role": "user", "content": "Why is the sky blue?" }] });
    let resp = tokio::time::timeout(WAIT, http_client(WAIT).post(url).json(&body).send())
        .await
        .expect("the held request is answered")
        .unwrap();
    assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
    let answered = sent.elapsed();
    let pushed_true = pushes
        .lock()
        .unwrap()
        .iter()
        .find(|(t, v)| *v && *t >= sent)
        .map(|(t, _)| t.duration_since(sent))
        .expect("a true was pushed on StreamIsActive");
    assert!(
        pushed_true < Duration::from_secs(3),
        "the push came {pushed_true:?} after the request (activator poll 1 s)"
    );

    // Then idle: Tessera decides zero after 3 s, IsActive turns false, KEDA scales the Deployment away.
    let deadline = Instant::now() + WAIT;
    loop {
        {
            let d = deployment.lock().await;
            if d.history.len() >= 2 {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the Deployment was never scaled back to zero"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(keda);
    let d = deployment.lock().await;
    let replicas: Vec<u32> = d.history.iter().map(|(_, r)| *r).collect();
    assert_eq!(replicas, vec![1, 0], "0 -> 1 -> 0");
    let up = d.history[0].0.duration_since(sent);
    let down = d.history[1].0.duration_since(d.history[0].0);
    println!(
        "KEDA loop: pushed true {pushed_true:?} after the request, replica started at {up:?}, request answered at \
         {answered:?}, back to zero {down:?} later (idleAfter 3s, poll {POLL:?})"
    );

    // The scaler's own metrics.
    let page = support::get_text(&http_client(WAIT), &scaler.url("/metrics")).await;
    for want in [
        "tessera_keda_calls_total{method=\"GetMetrics\",outcome=\"ok\"}",
        "tessera_keda_calls_total{method=\"GetMetrics\",outcome=\"not_found\"}",
        "tessera_keda_pushes_total{method=\"StreamIsActive\",outcome=\"true\"}",
        "tessera_keda_open_streams",
        "tessera_keda_call_duration_seconds_bucket",
    ] {
        assert!(page.contains(want), "/metrics lacks {want}:\n{page}");
    }
}

#[test]
fn plaintext_grpc_is_refused_off_loopback() {
    let err = support::refused(&[
        "autoscaler",
        "--no-kube",
        "--sidecar",
        "m=http://127.0.0.1:1",
        "--keda-scaler-listen",
        "0.0.0.0:0",
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    assert!(err.contains("--keda-tls-cert"), "{err}");
}

#[tokio::test]
async fn with_a_client_ca_only_a_client_with_a_certificate_is_answered() {
    if std::env::var("TESSERA_SKIP_GRPC_PYTHON").as_deref() == Ok("1") {
        println!("SKIPPED the TLS check (it uses the Python grpcio client): TESSERA_SKIP_GRPC_PYTHON=1");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = support::pki::pki(dir.path(), &["localhost"]);
    let policy = write(dir.path(), "policy.yaml", POLICY);
    let keda_port = free_port();
    let listen = format!("127.0.0.1:{keda_port}");
    let _scaler = autoscaler(
        free_port(),
        "http://127.0.0.1:1",
        &listen,
        &policy,
        &[
            "--keda-tls-cert",
            p.server_cert.to_str().unwrap(),
            "--keda-tls-key",
            p.server_key.to_str().unwrap(),
            "--keda-client-ca",
            p.ca.to_str().unwrap(),
        ],
    );
    let ca = p.ca.to_str().unwrap();
    let with_cert = [
        "--ca",
        ca,
        "--cert",
        p.client_cert.to_str().unwrap(),
        "--key",
        p.client_key.to_str().unwrap(),
    ];
    // The activator is unreachable here, so the model has no decision that could scale it to zero: the spec is
    // answered, and the metric is UNAVAILABLE or a value — either way over TLS with a client certificate.
    let deadline = Instant::now() + WAIT;
    loop {
        let ok = python_answers(&listen, "default", "chat", &with_cert).unwrap();
        if ok["spec"]["ok"]["targetSize"] == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "no answer over TLS: {ok}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let without = python_answers(&listen, "default", "chat", &["--ca", ca]).unwrap();
    assert_eq!(
        without["spec"]["code"], "UNAVAILABLE",
        "a client without a certificate must not be answered: {without}"
    );
}

/// KEDA keeps an `external-push` stream open and reconnects when it drops: a scaler that stops ends its streams
/// (so connections drain), and the first value on a new stream is the model's state then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_stream_ends_when_the_scaler_stops_and_a_reconnect_gets_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let policy = write(dir.path(), "policy.yaml", POLICY);
    let act = Tessera::activator(&["--backend", &format!("chat=http://127.0.0.1:{}", free_port())]);
    let keda_port = free_port();
    let listen = format!("127.0.0.1:{keda_port}");
    let sidecar_port = free_port();
    let mut scaler = autoscaler(sidecar_port, &act.admin_base(), &listen, &policy, &[]);
    let mut client = connect(keda_port).await;
    let so = scaled_object("chat", "default");
    // Wait for the first decision (idle at zero: inactive).
    let deadline = Instant::now() + WAIT;
    while client
        .is_active(so.clone())
        .await
        .map(|r| r.into_inner().result)
        .ok()
        != Some(false)
    {
        assert!(Instant::now() < deadline, "no decision");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut stream = client.stream_is_active(so.clone()).await.unwrap().into_inner();
    assert_eq!(
        stream.message().await.unwrap().map(|m| m.result),
        Some(false),
        "the state at once"
    );
    // SIGTERM: the stream ends instead of hanging the client.
    support::sigterm(&scaler.child);
    let ended = tokio::time::timeout(Duration::from_secs(10), stream.message()).await;
    assert!(
        matches!(ended, Ok(Ok(None)) | Ok(Err(_))),
        "the stream must end when the scaler stops: {ended:?}"
    );
    let _ = support::terminate(&mut scaler.child, Duration::from_secs(10)).await;
    drop(scaler);
    // A new scaler on the same address; KEDA's reconnect gets the state again.
    let _scaler = autoscaler(sidecar_port, &act.admin_base(), &listen, &policy, &[]);
    let mut client = connect(keda_port).await;
    let deadline = Instant::now() + WAIT;
    let first = loop {
        if let Ok(s) = client.stream_is_active(so.clone()).await {
            break s.into_inner().message().await.unwrap().map(|m| m.result);
        }
        assert!(Instant::now() < deadline, "no stream after the restart");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(first, Some(false));
}
