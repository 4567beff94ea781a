//! `tessera activator` as a real process over loopback: holding at zero, overflow, hold timeout, a backend dying
//! mid-stream, unbuffered streaming, least-outstanding balancing, and OpenAI-shaped errors.
//!
//! Backends are small axum servers inside the test (so each test controls exactly when a backend starts, answers,
//! or dies) plus `tessera vllm-sim` processes where the real emulator's behaviour is the point. Every wait is
//! bounded, and child processes are killed on drop, so a failing test fails instead of hanging.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::Response;
use axum::routing::{get, post};
use tokio::sync::{Notify, Semaphore};

mod support;
use support::{Tessera, free_port, http_client};

const WAIT: Duration = Duration::from_secs(20);

/// A minimal OpenAI-ish backend inside the test process.
#[derive(Default)]
struct Backend {
    /// Completion requests received.
    received: AtomicUsize,
    /// When set, each completion waits for one permit before answering (to keep requests outstanding).
    gate: Option<Arc<Semaphore>>,
    /// Signalled on every completion request received.
    arrived: Notify,
}

async fn serve_backend(listener: tokio::net::TcpListener, backend: Arc<Backend>) {
    let app = axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/v1/chat/completions", post(complete))
        .route("/v1/stream-then-die", post(stream_then_die))
        .route("/v1/stream-gated", post(stream_gated))
        .with_state(backend);
    axum::serve(listener, app).await.unwrap();
}

async fn start_backend(port: u16, backend: Arc<Backend>) -> tokio::task::JoinHandle<()> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    tokio::spawn(serve_backend(listener, backend))
}

async fn complete(State(b): State<Arc<Backend>>, body: Bytes) -> axum::Json<serde_json::Value> {
    let n = b.received.fetch_add(1, Ordering::SeqCst) + 1;
    b.arrived.notify_waiters();
    if let Some(gate) = &b.gate {
        gate.acquire().await.unwrap().forget();
    }
    let req: serde_json::Value = serde_json::from_slice(&body).unwrap();
    axum::Json(
        serde_json::json!({ "object": "chat.completion", "model": req["model"], "seq": n,
        "choices": [{ "index": 0, "message": { "role": "assistant", "content": "hi" }, "finish_reason": "stop" }] }),
    )
}

/// Two SSE events, then the connection breaks without the terminating chunk (a backend that died).
async fn stream_then_die() -> Response {
    // Pauses between events, as a generating model has; without them the server would see the error before
    // flushing anything and fail the whole response instead of breaking it mid-stream.
    let s = futures::stream::unfold(1u32, |n| async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        match n {
            1 | 2 => Some((Ok(Bytes::from(format!("data: {{\"n\":{n}}}\n\n"))), n + 1)),
            3 => Some((Err(std::io::Error::other("backend died")), n + 1)),
            _ => None,
        }
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(s))
        .unwrap()
}

/// One SSE event, then the next only after the test releases the gate: proves the activator does not buffer.
async fn stream_gated(State(b): State<Arc<Backend>>) -> Response {
    let gate = b.gate.clone().expect("gated backend");
    let s = gated_stream(gate);
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(s))
        .unwrap()
}

fn chat(model: &str) -> serde_json::Value {
    serde_json::json!({ "model": model, "messages": [{ "role": "user", "content": "hello" }] })
}

/// The activator's stats for `model` (`namespace/name`) once nothing is in flight for it.
async fn idle_model(act: &Tessera, model: &str) -> serde_json::Value {
    let s = act
        .wait_activator_stats("nothing in flight", WAIT, |s| s["models"][model]["inFlight"] == 0)
        .await;
    s["models"][model].clone()
}

fn client() -> reqwest::Client {
    http_client(WAIT)
}

/// POSTs `body` to the activator's chat completions endpoint.
async fn post_chat(act: &Tessera, body: &serde_json::Value) -> reqwest::Response {
    support::post_json(&client(), &act.url("/v1/chat/completions"), body).await
}

#[tokio::test]
async fn holds_while_the_backend_is_down_and_forwards_once_it_starts() {
    let port = free_port();
    let act = Tessera::activator_at_port("m", port, &["--hold-timeout", "15s"]);
    let url = act.url("/v1/chat/completions");
    let held = tokio::spawn(async move { client().post(url).json(&chat("m")).send().await.unwrap() });
    let s = act
        .wait_activator_stats("the condition", WAIT, |s| s["models"]["default/m"]["queued"] == 1)
        .await;
    assert_eq!(s["models"]["default/m"]["readyBackends"], 0);
    // Still held a while later: nothing was answered while no backend exists.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !held.is_finished(),
        "the request must wait for the backend, not fail"
    );

    let backend = Arc::new(Backend::default());
    let ready_at = Instant::now();
    let _server = start_backend(port, backend.clone()).await;
    let resp = tokio::time::timeout(WAIT, held)
        .await
        .expect("held request finishes")
        .unwrap();
    let after_ready = ready_at.elapsed();
    assert_eq!(resp.status(), 200);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["model"], "m");
    assert_eq!(
        backend.received.load(Ordering::SeqCst),
        1,
        "forwarded exactly once"
    );
    // The probe runs every 20 ms while a request is held; allow generous slack for a loaded 2-core machine.
    assert!(
        after_ready < Duration::from_secs(2),
        "took {after_ready:?} after the backend started"
    );
    let idle = idle_model(&act, "default/m").await;
    assert_eq!(idle["queued"], 0);
    assert_eq!(idle["requestsTotal"], 1);
    assert_eq!(idle["readyBackends"], 1);
    assert!(s["models"]["default/m"]["lastRequestAtUnixMs"].as_u64().unwrap() > 0);

    let metrics = support::get_text(&client(), &act.admin_url("/metrics")).await;
    assert!(
        metrics
            .contains("tessera_activator_requests_total{namespace=\"default\",model=\"m\",code=\"200\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tessera_activator_hold_seconds_count{namespace=\"default\",model=\"m\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn overflow_answers_503_with_retry_after() {
    let port = free_port();
    let act = Tessera::activator_at_port(
        "m",
        port,
        &[
            "--queue-size",
            "1",
            "--hold-timeout",
            "10s",
            "--retry-after",
            "7s",
        ],
    );
    let url = act.url("/v1/chat/completions");
    let first = tokio::spawn(async move { client().post(url).json(&chat("m")).send().await.unwrap() });
    act.wait_activator_stats("the condition", WAIT, |s| s["models"]["default/m"]["queued"] == 1)
        .await;
    let resp = post_chat(&act, &chat("m")).await;
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()["retry-after"], "7");
    let err: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["code"], "queue_full");
    assert!(err["error"]["message"].as_str().unwrap().contains("--queue-size"));
    // The first request is still held and is served once a backend appears: overflow did not disturb it.
    let backend = Arc::new(Backend::default());
    let _server = start_backend(port, backend.clone()).await;
    assert_eq!(
        tokio::time::timeout(WAIT, first).await.unwrap().unwrap().status(),
        200
    );
    assert_eq!(backend.received.load(Ordering::SeqCst), 1);
    let s = act.activator_stats().await;
    assert_eq!(s["models"]["default/m"]["rejectedTotal"], 1);
    assert_eq!(s["models"]["default/m"]["requestsTotal"], 2);
}

#[tokio::test]
async fn hold_timeout_answers_503_with_an_openai_error() {
    let port = free_port();
    let act = Tessera::activator_at_port("m", port, &["--hold-timeout", "300ms"]);
    let start = Instant::now();
    let resp = support::post_json(&client(), &act.url("/v1/completions"), &chat("m")).await;
    let waited = start.elapsed();
    assert_eq!(resp.status(), 503);
    assert!(resp.headers().contains_key("retry-after"));
    let err: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["code"], "hold_timeout");
    assert_eq!(err["error"]["type"], "server_error");
    assert!(
        waited >= Duration::from_millis(300),
        "answered after {waited:?}, before the hold timeout"
    );
    assert!(waited < Duration::from_secs(5), "answered after {waited:?}");
    let s = act
        .wait_activator_stats("the condition", WAIT, |s| s["models"]["default/m"]["queued"] == 0)
        .await;
    assert_eq!(s["models"]["default/m"]["rejectedTotal"], 1);
}

#[tokio::test]
async fn backend_dying_mid_stream_is_an_error_not_a_hang() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let _server = tokio::spawn(serve_backend(listener, Arc::new(Backend::default())));
    let act = Tessera::activator(&["--backend", &format!("m=http://127.0.0.1:{port}")]);
    let resp = support::post_json(&client(), &act.url("/v1/stream-then-die"), &chat("m")).await;
    assert_eq!(resp.status(), 200);
    let mut resp = resp;
    let (got, outcome) = read_to_end(&mut resp, "the backend").await;
    assert!(
        outcome.is_err(),
        "a broken stream must end in an error, not a clean end"
    );
    assert!(
        String::from_utf8_lossy(&got).contains("\"n\":2"),
        "events before the failure arrive: {got:?}"
    );
    let idle = idle_model(&act, "default/m").await;
    assert_eq!(idle["requestsTotal"], 1);
}

#[tokio::test]
async fn streaming_passes_through_chunk_by_chunk() {
    let gate = Arc::new(Semaphore::new(0));
    let backend = Arc::new(Backend {
        gate: Some(gate.clone()),
        ..Default::default()
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let _server = tokio::spawn(serve_backend(listener, backend));
    let act = Tessera::activator(&["--backend", &format!("m=http://127.0.0.1:{port}")]);
    let mut resp = support::post_json(&client(), &act.url("/v1/stream-gated"), &chat("m")).await;
    if resp.headers()["content-type"] != "text/event-stream" {
        let status = resp.status();
        panic!("not a stream: {status} {}", resp.text().await.unwrap_or_default());
    }
    // The first event arrives while the backend is still blocked before its second: nothing is buffered.
    let first = next_chunk(&mut resp).await;
    assert!(first.contains("\"n\":1"), "{first}");
    for n in 2..=3 {
        gate.add_permits(1);
        let chunk = next_chunk(&mut resp).await;
        assert!(chunk.contains(&format!("\"n\":{n}")), "{chunk}");
    }
    gate.add_permits(1);
    assert!(next_chunk(&mut resp).await.contains("[DONE]"));
}

#[tokio::test]
async fn least_outstanding_balances_two_backends() {
    let mut backends = Vec::new();
    let mut flags = Vec::new();
    let gate = Arc::new(Semaphore::new(0));
    for _ in 0..2 {
        let b = Arc::new(Backend {
            gate: Some(gate.clone()),
            ..Default::default()
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(serve_backend(listener, b.clone()));
        flags.push(format!("m=http://127.0.0.1:{port}"));
        backends.push(b);
    }
    let act = Tessera::activator(&["--backend", &flags[0], "--backend", &flags[1]]);
    act.wait_activator_stats("the condition", WAIT, |s| {
        s["models"]["default/m"]["readyBackends"] == 2
    })
    .await;
    // Requests stay open (gated), one at a time: each new one must go to the backend with fewer open.
    let mut open = Vec::new();
    for i in 1..=6 {
        let url = act.url("/v1/chat/completions");
        open.push(tokio::spawn(async move {
            client().post(url).json(&chat("m")).send().await.unwrap()
        }));
        let deadline = Instant::now() + WAIT;
        while backends
            .iter()
            .map(|b| b.received.load(Ordering::SeqCst))
            .sum::<usize>()
            < i
        {
            assert!(Instant::now() < deadline, "request {i} never reached a backend");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let counts: Vec<usize> = backends
            .iter()
            .map(|b| b.received.load(Ordering::SeqCst))
            .collect();
        assert!(
            counts[0].abs_diff(counts[1]) <= 1,
            "unbalanced after {i} requests: {counts:?}"
        );
    }
    let s = act.activator_stats().await;
    assert_eq!(s["models"]["default/m"]["inFlight"], 6);
    gate.add_permits(6);
    for r in open {
        assert_eq!(
            tokio::time::timeout(WAIT, r).await.unwrap().unwrap().status(),
            200
        );
    }
    assert_eq!(backends[0].received.load(Ordering::SeqCst), 3);
    assert_eq!(backends[1].received.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn unknown_model_and_bad_bodies_get_openai_errors() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(serve_backend(listener, Arc::new(Backend::default())));
    let act = Tessera::activator_at_port(
        "b-model",
        port,
        &[
            "--backend",
            &format!("a-model=http://127.0.0.1:{port}"),
            "--max-body-size",
            "1000",
        ],
    );
    let resp = post_chat(&act, &chat("nope")).await;
    assert_eq!(resp.status(), 404);
    let err: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["code"], "model_not_found");
    assert_eq!(err["error"]["param"], "model");
    assert_eq!(err["error"]["type"], "invalid_request_error");

    let resp = client()
        .post(act.url("/v1/chat/completions"))
        .body("not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let resp = support::post_json(
        &client(),
        &act.url("/v1/embeddings"),
        &serde_json::json!({ "input": "x" }),
    )
    .await;
    assert_eq!(resp.status(), 400);
    let big = serde_json::json!({ "model": "a-model", "prompt": "x".repeat(2000) });
    let resp = support::post_json(&client(), &act.url("/v1/completions"), &big).await;
    assert_eq!(resp.status(), 413);

    // Tenants are namespaces: `--backend` routes live in the default namespace; the same name addressed in
    // another namespace is another (unknown) model, and the prefix is removed before forwarding.
    // `a-model` addressed in the namespace `ns`.
    let chat_in = |ns: &str| {
        let url = act.url(&format!("/namespaces/{ns}/v1/chat/completions"));
        async move { support::post_json(&client(), &url, &chat("a-model")).await }
    };
    let resp = chat_in("team-b").await;
    assert_eq!(resp.status(), 404);
    let err: serde_json::Value = resp.json().await.unwrap();
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("namespace `team-b`"),
        "{err}"
    );
    let resp = chat_in("default").await;
    assert_eq!(resp.status(), 200);
    let listed: serde_json::Value =
        support::get_json(&client(), &act.url("/namespaces/team-b/v1/models")).await;
    assert_eq!(listed["data"].as_array().unwrap().len(), 0);

    let models: serde_json::Value = support::get_json(&client(), &act.url("/v1/models")).await;
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["a-model", "b-model"]);
    assert_eq!(client().get(act.url("/live")).send().await.unwrap().status(), 200);
    assert_eq!(
        client().get(act.url("/ready")).send().await.unwrap().status(),
        200
    );
    // Unknown names are counted under one label, so clients cannot blow up the metric's cardinality.
    let metrics = support::get_text(&client(), &act.admin_url("/metrics")).await;
    assert!(
        metrics.contains(
            "tessera_activator_requests_total{namespace=\"unknown\",model=\"unknown\",code=\"404\"} 2"
        ),
        "{metrics}"
    );
}

#[test]
fn bad_flags_fail_with_a_clear_message() {
    let stderr = support::refused(&["activator", "--listen", "127.0.0.1:0", "--backend", "no-url-here"]);
    assert!(stderr.contains("expected <model>=<url>"), "{stderr}");
    let stderr = support::refused(&[
        "activator",
        "--listen",
        "127.0.0.1:0",
        "--backend",
        "m=http://h:1",
        "--probe-interval-held",
        "0s",
    ]);
    assert!(stderr.contains("greater than zero"), "{stderr}");
}

fn gated_stream(gate: Arc<Semaphore>) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> {
    futures::stream::unfold(1u32, move |n| {
        let gate = gate.clone();
        async move {
            if n > 4 {
                return None;
            }
            if n > 1 {
                gate.acquire().await.ok()?.forget();
            }
            let event = if n == 4 {
                "data: [DONE]\n\n".to_string()
            } else {
                format!("data: {{\"n\":{n}}}\n\n")
            };
            Some((Ok(Bytes::from(event)), n + 1))
        }
    })
}

/// A streamed chat completion of `max_tokens` (EOS ignored) for `qwen` through the activator, answered 200.
async fn stream_qwen(act: &Tessera, max_tokens: u32, content: &str) -> reqwest::Response {
    let body = serde_json::json!({ "model": "qwen", "max_tokens": max_tokens, "ignore_eos": true, "stream": true,
        "messages": [{ "role": "user", "content": content }] });
    let resp = post_chat(act, &body).await;
    assert_eq!(resp.status(), 200);
    resp
}

/// Reads `resp` to its end, failing the test if that takes 10 s (`what` hung); the bytes read, and whether the
/// stream ended cleanly or with an error.
async fn read_to_end(resp: &mut reqwest::Response, what: &str) -> (Vec<u8>, Result<(), reqwest::Error>) {
    let mut got = Vec::new();
    let outcome = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match resp.chunk().await {
                Ok(Some(c)) => got.extend_from_slice(&c),
                Ok(None) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the client must not hang when {what} dies"));
    (got, outcome)
}

async fn next_chunk(resp: &mut reqwest::Response) -> String {
    let chunk = tokio::time::timeout(Duration::from_secs(10), resp.chunk())
        .await
        .expect("the next event must arrive, not be held back")
        .expect("stream error")
        .expect("stream ended early");
    String::from_utf8_lossy(&chunk).into_owned()
}

// ---- against the real emulator: `tessera vllm-sim` ----

/// Starts `tessera vllm-sim` serving `model` on `listen` (off the async runtime: it blocks until the port opens).
async fn vllm_sim(model: &str, listen: &str, extra: &[&str]) -> Tessera {
    let mut args: Vec<String> = ["vllm-sim", "--served-model-name", model, "--listen", listen]
        .map(String::from)
        .into();
    args.extend(extra.iter().map(|s| s.to_string()));
    tokio::task::spawn_blocking(move || Tessera::start(&args.iter().map(String::as_str).collect::<Vec<_>>()))
        .await
        .unwrap()
}

/// A real-time emulator serving `qwen` behind an activator that already counts it ready: `(sim, activator)`.
async fn qwen_behind_activator() -> (Tessera, Tessera) {
    let sim = vllm_sim("qwen", "127.0.0.1:0", &["--time-scale", "1"]).await;
    let act = Tessera::activator(&["--backend", &format!("qwen=http://{}", sim.addr)]);
    act.wait_activator_stats("the condition", WAIT, |s| {
        s["models"]["default/qwen"]["readyBackends"] == 1
    })
    .await;
    (sim, act)
}

/// Requests the emulator finished, from its own vLLM counter (summed over finish reasons).
async fn finished_at(sim: &Tessera) -> f64 {
    let page = support::get_text(&client(), &sim.url("/metrics")).await;
    support::metric_sum(&page, "vllm:request_success_total")
}

#[tokio::test]
async fn vllm_sim_starting_from_zero_gets_the_held_request_exactly_once() {
    let port = free_port();
    let act = Tessera::activator_at_port("qwen", port, &["--hold-timeout", "30s"]);
    let url = act.url("/v1/chat/completions");
    let body = serde_json::json!({ "model": "qwen", "max_tokens": 8,
        "messages": [{ "role": "user", "content": "Why is the sky blue?" }] });
    let held = tokio::spawn(async move { client().post(url).json(&body).send().await.unwrap() });
    act.wait_activator_stats("the condition", WAIT, |s| {
        s["models"]["default/qwen"]["queued"] == 1
    })
    .await;
    // Like vLLM loading weights, the emulator refuses connections for its start-up delay, then opens the port.
    let sim = vllm_sim(
        "qwen",
        &format!("127.0.0.1:{port}"),
        &["--startup-delay", "1s", "--time-scale", "20"],
    )
    .await;
    let resp = tokio::time::timeout(WAIT, held)
        .await
        .expect("held request finishes")
        .unwrap();
    assert_eq!(resp.status(), 200);
    let reply: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(reply["model"], "qwen");
    assert!(
        reply["choices"][0]["message"]["content"]
            .as_str()
            .is_some_and(|c| !c.is_empty()),
        "{reply}"
    );
    assert_eq!(
        finished_at(&sim).await,
        1.0,
        "the emulator must have served the held request exactly once"
    );
}

#[tokio::test]
async fn vllm_sim_stream_arrives_token_by_token() {
    let (_sim, act) = qwen_behind_activator().await;
    let mut resp = stream_qwen(&act, 40, "Count to forty.").await;
    let (mut reads, mut text) = (Vec::new(), String::new());
    while let Some(chunk) = tokio::time::timeout(WAIT, resp.chunk())
        .await
        .expect("no stall")
        .unwrap()
    {
        reads.push(Instant::now());
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(
        text.matches("data: ").count() >= 40,
        "one event per token expected: {text}"
    );
    // 40 decode steps of an emulated 7B model take a few hundred ms; a buffering proxy would deliver them in one
    // or two reads at the end instead of spread over that time.
    let spread = *reads.last().unwrap() - reads[0];
    assert!(
        reads.len() >= 10,
        "only {} reads: the stream was buffered",
        reads.len()
    );
    assert!(
        spread >= Duration::from_millis(100),
        "all events arrived within {spread:?}: buffered"
    );
}

#[tokio::test]
async fn vllm_sim_killed_mid_stream_ends_the_client_stream_with_an_error() {
    let (sim, act) = qwen_behind_activator().await;
    // Long enough (thousands of tokens) that only the kill can end it within the test's bounds.
    let mut resp = stream_qwen(&act, 4000, "Write a long story.").await;
    assert!(next_chunk(&mut resp).await.contains("data: "));
    drop(sim); // SIGKILL: the model server dies with the response half written.
    let (_, outcome) = read_to_end(&mut resp, "the model server").await;
    assert!(
        outcome.is_err(),
        "a stream cut by a dying server must end in an error, not a clean end"
    );
    let idle = idle_model(&act, "default/qwen").await;
    assert_eq!(idle["requestsTotal"], 1);
}

#[tokio::test]
async fn vllm_sim_replica_dying_between_requests_is_routed_around() {
    let a = vllm_sim("qwen", "127.0.0.1:0", &["--time-scale", "20"]).await;
    let b = vllm_sim("qwen", "127.0.0.1:0", &["--time-scale", "20"]).await;
    let act = Tessera::activator_for(
        &format!("qwen=http://{}", a.addr),
        &[
            "--backend",
            &format!("qwen=http://{}", b.addr),
            // Long enough that only a refused connection, not a probe, can take the dead replica out of rotation.
            "--probe-interval",
            "60s",
        ],
    );
    act.wait_activator_stats("the condition", WAIT, |s| {
        s["models"]["default/qwen"]["readyBackends"] == 2
    })
    .await;
    let body = serde_json::json!({ "model": "qwen", "max_tokens": 4,
        "messages": [{ "role": "user", "content": "hi" }] });
    for _ in 0..4 {
        let resp = post_chat(&act, &body).await;
        assert_eq!(resp.status(), 200);
    }
    assert_eq!(finished_at(&a).await + finished_at(&b).await, 4.0);
    let before_a = finished_at(&a).await;
    drop(b); // SIGKILL between requests: its port now refuses connections.
    for i in 0..6 {
        let resp = post_chat(&act, &body).await;
        assert_eq!(resp.status(), 200, "request {i} after the replica died");
    }
    // Every request after the death was served by the survivor, each exactly once.
    assert_eq!(finished_at(&a).await - before_a, 6.0);
    let s = act.activator_stats().await;
    assert_eq!(s["models"]["default/qwen"]["readyBackends"], 1);
    assert_eq!(s["models"]["default/qwen"]["rejectedTotal"], 0);
}

#[tokio::test]
async fn models_are_listed_as_their_server_describes_them_also_at_zero() {
    let (sim, act) = qwen_behind_activator().await;
    let direct: serde_json::Value = support::get_json(&client(), &sim.url("/v1/models")).await;
    let max_len = direct["data"][0]["max_model_len"].clone();
    assert!(
        max_len.is_u64(),
        "the emulator says its max_model_len as vLLM does: {direct}"
    );
    let listed: serde_json::Value = support::get_json(&client(), &act.url("/v1/models")).await;
    assert_eq!(
        listed["data"][0], direct["data"][0],
        "vLLM's object, passed through"
    );
    let one: serde_json::Value = support::get_json(&client(), &act.url("/v1/models/qwen")).await;
    assert_eq!(one["max_model_len"], max_len);
    // The server gone (a model at zero): the gateway still says what it said, not a bare object.
    drop(sim);
    let listed: serde_json::Value = support::get_json(&client(), &act.url("/v1/models")).await;
    assert_eq!(listed["data"][0]["max_model_len"], max_len, "{listed}");
}
