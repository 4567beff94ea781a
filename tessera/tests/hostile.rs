//! What a hostile or broken tenant pod or client can do to Tessera's servers, over loopback against the real
//! binary ("no tenant can stop the control plane, and nothing is held open"). Each test names what the other side
//! does and what Tessera must do; docs/failure-modes.md has a row for each.

mod support;

use std::time::Duration;

use support::{Tessera, free_port, http_client};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A "sidecar" that answers every request with `total` bytes of JSON-looking padding, as fast as loopback
/// allows; with `declare`, a Content-Length says so up front, otherwise the body runs until the connection closes.
async fn flooding_pod(total: usize, declare: bool) -> std::net::SocketAddr {
    raw_server(move |mut s| async move {
        let mut buf = [0u8; 4096];
        let _ = s.read(&mut buf).await;
        let head = if declare {
            format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {total}\r\n\r\n")
        } else {
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n".to_owned()
        };
        if s.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        let chunk = [b' '; 256 * 1024];
        let mut left = total;
        while left > 0 {
            let n = left.min(chunk.len());
            if s.write_all(&chunk[..n]).await.is_err() {
                return; // the reader hung up: what a bounded reader does
            }
            left -= n;
        }
    })
    .await
}

/// A raw TCP server on loopback that runs `answer` on each connection it accepts (a misbehaving peer); its address.
async fn raw_server<F, Fut>(answer: F) -> std::net::SocketAddr
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(answer(s));
        }
    });
    addr
}

/// The emulator serving `m` behind an activator.
fn m_behind_activator() -> (Tessera, Tessera) {
    let vllm = Tessera::vllm_sim(&["--served-model-name", "m"]);
    let activator = Tessera::activator_for(&format!("m={}", vllm.base()), &[]);
    (vllm, activator)
}

/// The peak resident memory of a process (`VmHWM`), in MiB.
fn peak_rss_mib(pid: u32) -> u64 {
    support::proc_status_kib(pid, "VmHWM").expect("VmHWM in /proc/pid/status") / 1024
}

/// Waits until the autoscaler's /metrics shows `want`, returning the page.
async fn wait_metric(ctl: &Tessera, want: &str, within: Duration) -> String {
    let client = http_client(Duration::from_secs(5));
    let deadline = std::time::Instant::now() + within;
    loop {
        let page = support::get_text(&client, &ctl.url("/metrics")).await;
        if page.contains(want) {
            return page;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "metrics never showed {want}:\n{page}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A tenant pod answers its `/v1/status` with 300 MB (the reported attack took the autoscaler to 619 MB, over the
/// chart's 512Mi limit, and both replicas crash-looped). The autoscaler must refuse the document at its bound,
/// count the refusal, and stay small; the model reads as having no data (which never scales it down).
/// `POST path` with a JSON `body` written byte for byte on a new connection (no client library normalises the
/// path), and the whole answer read, within 10 s.
async fn raw_post(addr: std::net::SocketAddr, path: &str, body: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(
        format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .expect("write");
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut answer))
        .await
        .expect("answered in time")
        .expect("read");
    answer
}

#[tokio::test]
async fn a_pod_answering_300_mb_cannot_run_the_autoscaler_out_of_memory() {
    const BIG: usize = 300 * 1024 * 1024;
    let declared = flooding_pod(BIG, true).await;
    let streamed = flooding_pod(BIG, false).await;
    let ctl = Tessera::start(&[
        "autoscaler",
        "--no-kube",
        "--sidecar",
        &format!("declared=http://{declared}"),
        "--sidecar",
        &format!("streamed=http://{streamed}"),
        "--metrics-listen",
        "127.0.0.1:0",
        "--sync-period",
        "200ms",
        // Long enough to read 300 MB over loopback many times over: only the size bound can stop it.
        "--scrape-timeout",
        "20s",
    ]);
    let page = wait_metric(
        &ctl,
        r#"tessera_autoscaler_scrape_failures_total{source="sidecar",reason="too_large"} 4"#,
        Duration::from_secs(60),
    )
    .await;
    assert!(page.contains("too_large"), "{page}");
    let peak = peak_rss_mib(ctl.child.id());
    // Two reads at a time, each bounded at 8 MiB: far under 100 MiB whatever the pods send.
    assert!(
        peak < 100,
        "the autoscaler's peak RSS reached {peak} MiB reading 300 MB documents"
    );
}

/// Reads until the server closes the connection; true if it did within `within`.
async fn closed_within<S: tokio::io::AsyncRead + Unpin>(s: &mut S, within: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

/// What a connection-holding client sends before going silent.
const HOLDS: [(&str, &[u8]); 4] = [
    ("nothing", b""),
    (
        "half a request head",
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n",
    ),
    ("part of the HTTP/2 preface", b"PRI * HTTP/2.0\r\n"),
    (
        "the HTTP/2 preface and SETTINGS, then nothing (an idle HTTP/2 connection)",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00",
    ),
];

/// Every plain-HTTP server closes each kind of held connection within its bounds (1 s for headers and idle
/// here): before, the activator kept them (its version sniff and HTTP/2 side had no timer) and the sidecar's,
/// the autoscaler's and the webhook's metrics servers had no header timeout at all.
#[tokio::test]
async fn every_server_closes_silent_half_open_and_idle_connections() {
    let bounds = ["--header-read-timeout", "1s", "--client-idle-timeout", "1s"];
    let vllm = Tessera::vllm_sim(&["--served-model-name", "m"]);
    let mut activator_args = vec!["--backend", "m=http://127.0.0.1:9"];
    activator_args.extend_from_slice(&bounds);
    let activator = Tessera::activator(&activator_args);
    let sidecar = Tessera::quick_sidecar(&vllm.base(), &bounds, &[]);
    let mut ctl_args = vec!["autoscaler", "--no-kube", "--metrics-listen", "127.0.0.1:0"];
    let sidecar_flag = format!("m={}", sidecar.base());
    ctl_args.extend_from_slice(&["--sidecar", &sidecar_flag]);
    ctl_args.extend_from_slice(&bounds);
    let ctl = Tessera::start(&ctl_args);
    for (role, addr) in [
        ("activator", activator.addr),
        (
            "activator's admin listener",
            activator.admin.expect("the admin address"),
        ),
        ("sidecar", sidecar.addr),
        ("autoscaler", ctl.addr),
    ] {
        for (what, bytes) in HOLDS {
            let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
            s.write_all(bytes).await.expect("write");
            assert!(
                closed_within(&mut s, Duration::from_secs(5)).await,
                "{role} kept a connection that sent {what}"
            );
        }
        // And a client that asks is still answered on a kept-alive connection.
        let live = http_client(Duration::from_secs(5))
            .get(format!("http://{addr}/live"))
            .send()
            .await
            .expect("GET /live");
        assert!(live.status().is_success(), "{role}: {}", live.status());
    }
}

/// The webhook over TLS: a stalled handshake and a connection that completes its handshake and sends nothing are
/// both closed (before: kept ≥ 60 s, ~32 KB each; ~7,000 of them reached its memory limit, and with
/// `failurePolicy: Ignore` every pod was then admitted bare). Its metrics port is bounded the same way.
#[tokio::test]
async fn the_webhook_closes_stalled_tls_connections() {
    let dir = tempfile::tempdir().expect("tempdir");
    let metrics_listen = format!("127.0.0.1:{}", free_port());
    let pair = support::admission::pair();
    let hook = support::admission::start_webhook(
        dir.path(),
        &pair,
        &metrics_listen,
        &["--header-read-timeout", "1s", "--client-idle-timeout", "1s"],
    );
    // Nothing at all: the handshake never starts.
    let mut raw = tokio::net::TcpStream::connect(hook.addr).await.expect("connect");
    assert!(
        closed_within(&mut raw, Duration::from_secs(5)).await,
        "a stalled handshake was kept"
    );
    // A complete handshake, then nothing.
    let tls = support::admission::connector(&[&pair.der]);
    let mut stream = support::admission::connect(&tls, hook.addr).await;
    assert!(
        closed_within(&mut stream, Duration::from_secs(5)).await,
        "a silent TLS connection was kept"
    );
    // The metrics port.
    let mut plain = tokio::net::TcpStream::connect(&metrics_listen)
        .await
        .expect("connect");
    assert!(
        closed_within(&mut plain, Duration::from_secs(5)).await,
        "a silent metrics connection was kept"
    );
    // An admission still works.
    let mut stream = support::admission::connect(&tls, hook.addr).await;
    let review = support::admission::review("uid-1", support::admission::real_pod());
    let (status, body) = support::admission::exchange(&mut stream, "POST", "/mutate", &review).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
}

/// A client sends dot segments (`/v1/../../metrics`, plain or encoded) to reach routes behind the gateway: refused
/// with 400 and the reason, never forwarded. And `GET /v1/models/{id}` answers as OpenAI's API does.
#[tokio::test]
async fn the_activator_refuses_dot_segments_and_answers_a_model_lookup() {
    let (_vllm, activator) = m_behind_activator();
    let client = http_client(Duration::from_secs(10));
    for path in [
        "/v1/../../metrics",
        "/v1/%2e%2e/%2E%2E/metrics",
        "/namespaces/default/v1/./../x",
    ] {
        // Sent raw: an HTTP client library would normalise the path before it leaves.
        let answer = raw_post(
            activator.addr,
            path,
            r#"{"model":"m","prompt":"hi","max_tokens":1}"#,
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{path}: {answer}");
        assert!(answer.contains("bad_path"), "{path}: {answer}");
    }
    let got = support::get(&client, &activator.url("/v1/models/m")).await;
    assert_eq!(got.status(), 200);
    let model: serde_json::Value = got.json().await.expect("json");
    assert_eq!(model["id"], "m");
    assert_eq!(model["object"], "model");
    let missing = support::get(&client, &activator.url("/v1/models/nope")).await;
    assert_eq!(missing.status(), 404);
    let err: serde_json::Value = missing.json().await.expect("json");
    assert_eq!(err["error"]["code"], "model_not_found");
}

/// A tenant reads the activator's stats and `/metrics` on the public port (the OpenAI API port every tenant
/// reaches) to see every other namespace's models and load: both answer 404 there, naming the admin listener, and
/// are served on `--admin-listen` only, which does not serve the API. Before, the public port served both.
#[tokio::test]
async fn a_tenant_cannot_read_every_namespaces_traffic_on_the_public_port() {
    let (_vllm, activator) = m_behind_activator();
    let client = http_client(Duration::from_secs(10));
    let one_token = serde_json::json!({"model": "m", "prompt": "hi", "max_tokens": 1});
    let sent = support::post_json(&client, &activator.url("/v1/completions"), &one_token).await;
    assert_eq!(sent.status(), 200, "a request through the public port");

    for path in [
        "/tessera/v1/stats",
        "/tessera/v1/stats?schema=2",
        "/metrics",
        "/metrics/",
    ] {
        let got = client.get(activator.url(path)).send().await.expect("GET");
        assert_eq!(got.status(), 404, "the public port served {path}");
        let text = got.text().await.expect("body");
        assert!(
            text.contains("--admin-listen") && text.contains("not_found"),
            "{path}: the refusal must name where it is served: {text}"
        );
        // Nothing of the traffic leaks into the refusal.
        assert!(
            !text.contains("requestsTotal") && !text.contains("tessera_activator_"),
            "{path}: {text}"
        );
    }

    // The admin listener serves both, with the request just made.
    let stats = support::get_json(&client, &activator.admin_url("/tessera/v1/stats")).await;
    assert_eq!(stats["models"]["default/m"]["requestsTotal"], 1, "{stats}");
    let page = support::get(&client, &activator.admin_url("/metrics")).await;
    assert_eq!(page.status(), 200);
    let page = page.text().await.expect("body");
    assert!(page.contains("tessera_activator_"), "{page}");
    for probe in ["/live", "/ready"] {
        let got = client.get(activator.admin_url(probe)).send().await.expect("GET");
        assert_eq!(got.status(), 200, "admin {probe}");
    }
    // And the API is not on the admin listener: it is no second way in for a client.
    let api = support::post_json(&client, &activator.admin_url("/v1/completions"), &one_token).await;
    assert_eq!(api.status(), 404, "the admin listener served the API");
}

/// A backend starts a streamed answer and then sends nothing, keeping its connection open: the activator aborts the
/// client's stream after `--upstream-stream-timeout` and releases the backend (before: held for ever).
#[tokio::test]
async fn a_stalled_upstream_stream_is_cut_after_its_idle_bound() {
    let backend = raw_server(|mut s| async move {
        let mut buf = vec![0u8; 65536];
        let Ok(n) = s.read(&mut buf).await else { return };
        let head = String::from_utf8_lossy(&buf[..n]).to_string();
        if head.starts_with("GET") {
            // The health probe.
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await;
            return;
        }
        let _ = s
            .write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n\
                          13\r\ndata: {\"first\":1}\n\n\r\n",
            )
            .await;
        // Then nothing, with the connection open.
        tokio::time::sleep(Duration::from_secs(60)).await;
    })
    .await;
    let backend_flag = format!("m=http://{backend}");
    let activator = Tessera::activator_for(&backend_flag, &["--upstream-stream-timeout", "1s"]);
    let started = std::time::Instant::now();
    let resp = http_client(Duration::from_secs(30))
        .post(activator.url("/v1/chat/completions"))
        .json(&serde_json::json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("headers arrive");
    assert_eq!(resp.status(), 200);
    let body = resp.bytes().await;
    let took = started.elapsed();
    assert!(body.is_err(), "the stalled stream ended cleanly: {body:?}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(10),
        "cut after {took:?}"
    );
    // The model's in-flight count is released with it.
    activator
        .wait_activator_stats("nothing in flight", Duration::from_secs(5), |s| {
            s["models"]["default/m"]["requestsTotal"] == 1 && s["models"]["default/m"]["inFlight"] == 0
        })
        .await;
}

/// A client spells vLLM's runtime-LoRA and sleep endpoints with percent-escapes, merged or doubled slashes and a
/// namespace prefix (`/v1/load%5Flora%5Fadapter`, `/v1/%6Coad_lora_adapter`, ...): the model server decodes the
/// path before routing, so each is the endpoint itself. All are refused with the development-endpoint 404 and
/// none reaches the backend (issue 53 N3; before, the encoded spellings were forwarded).
#[tokio::test]
async fn the_activator_refuses_development_endpoints_however_they_are_spelled() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let reached = Arc::new(AtomicUsize::new(0));
    let seen = reached.clone();
    let backend = support::serve(
        axum::Router::new()
            .route("/health", axum::routing::get(|| async { "ok" }))
            .fallback(move || {
                let seen = seen.clone();
                async move {
                    seen.fetch_add(1, Ordering::SeqCst);
                    "{}"
                }
            }),
    )
    .await;
    let activator = Tessera::activator_for(&format!("m=http://{backend}"), &[]);
    activator
        .wait_activator_stats("a ready backend", Duration::from_secs(30), |s| {
            s["models"]["default/m"]["readyBackends"] == 1
        })
        .await;
    let body = r#"{"model":"m","lora_name":"x","lora_path":"/tmp/x"}"#;
    for path in [
        "/v1/load%5Flora%5Fadapter",
        "/v1/%6Coad_lora_adapter",
        "/v1/unload%5Flora%5Fadapter",
        "/v1/load_lora%5fadapter",
        "/namespaces/default/v1/load%5Flora%5Fadapter",
        "/v1//load_lora_adapter",
        "/v1%2Fload_lora_adapter",
        "/v1/unload_lora_adapter%2F",
        "/%73leep?level=1",
        "/wake%5Fup",
        "/namespaces/default/%77ake_up",
    ] {
        // Sent raw: an HTTP client library could re-encode or normalise the path before it leaves.
        let answer = raw_post(activator.addr, path, body).await;
        assert!(answer.starts_with("HTTP/1.1 404"), "{path}: {answer}");
        assert!(answer.contains("development endpoint"), "{path}: {answer}");
    }
    assert_eq!(
        reached.load(Ordering::SeqCst),
        0,
        "a development endpoint reached the backend"
    );
    // The API itself still goes through.
    let ok = support::post_json(
        &http_client(Duration::from_secs(10)),
        &activator.url("/v1/chat/completions"),
        &serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(ok.status(), 200);
    assert_eq!(reached.load(Ordering::SeqCst), 1);
}

/// A client completes the TLS handshake and sends a whole `POST /mutate` head announcing a body, then no body
/// (or a byte of it): the webhook answers 408 after `--body-read-timeout` and closes the connection (issue 53
/// M2: before, such a connection was held 90 s and more, past every header timeout; 1,000 of them held 32 MB).
/// A real admission is still answered.
#[tokio::test]
async fn the_webhook_bounds_the_time_an_admission_body_takes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let metrics_listen = format!("127.0.0.1:{}", free_port());
    let pair = support::admission::pair();
    // The header and idle bounds long, so only the body bound can close these connections in time.
    let hook = support::admission::start_webhook(
        dir.path(),
        &pair,
        &metrics_listen,
        &[
            "--header-read-timeout",
            "60s",
            "--client-idle-timeout",
            "60s",
            "--body-read-timeout",
            "1s",
        ],
    );
    let tls = support::admission::connector(&[&pair.der]);
    for sent in [&b""[..], &b"{"[..]] {
        let mut stream = support::admission::connect(&tls, hook.addr).await;
        let started = std::time::Instant::now();
        stream
            .write_all(
                b"POST /mutate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 4096\r\n\r\n",
            )
            .await
            .expect("write the head");
        stream.write_all(sent).await.expect("write");
        stream.flush().await.expect("flush");
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(8), stream.read_to_end(&mut answer)).await;
        let took = started.elapsed();
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            read.is_ok(),
            "a connection that sent {} body bytes of 4096 was kept past 8 s",
            sent.len()
        );
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("--body-read-timeout"), "{answer}");
        assert!(took >= Duration::from_millis(900), "answered after {took:?}");
    }
    let mut stream = support::admission::connect(&tls, hook.addr).await;
    let review = support::admission::review("uid-1", support::admission::real_pod());
    let (status, body) = support::admission::exchange(&mut stream, "POST", "/mutate", &review).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
}
