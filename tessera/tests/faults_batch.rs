//! The Batch API tried as a hostile tenant would (issue 53's third hardening pass), against the real activator
//! over loopback. Each test prints one `FAULT ...` line of figures (docs/failure-modes.md).
//!
//! - N1: metadata at OpenAI's bounds; lists read only their page, so batch documents left on the shared volume by
//!   an older release (2 MB of metadata each) cost the activator one document at a time.
//! - N2: a model answering with huge JSON arrays: answers are held within a per-line and a total byte budget and
//!   never parsed into a tree.
//! - N5: a batch whose model never has room holds up no other model's batch; an earlier deadline of the same
//!   model goes first.
//! - N13, N16: a huge completion window, a too-long line, a byte order mark; per-namespace quotas.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::batch::{create, create_with, get_batch, input_lines, post_file, upload, upload_to, wait_batch};
use support::{Tessera, http_client};

/// A test's batch store, removed when dropped (after the processes declared before it, which may still write).
struct StoreDir(PathBuf);

impl Drop for StoreDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The fast emulator serving `m` and an activator in front of it on a fresh store, with `extra` flags.
struct Gateway {
    act: Tessera,
    _sim: Tessera,
    _store: StoreDir,
}

impl Gateway {
    fn start(what: &str, extra: &[&str]) -> Gateway {
        let sim = Tessera::vllm_sim(&["--served-model-name", "m", "--time-scale", "100"]);
        let store = StoreDir(store_dir(what));
        let act = activator(&store.0, &[format!("m={}", sim.base())], extra);
        Gateway {
            act,
            _sim: sim,
            _store: store,
        }
    }
}

fn store_dir(what: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos();
    std::env::temp_dir().join(format!(
        "tessera-faults-batch-{what}-{}-{nanos}",
        std::process::id()
    ))
}

fn kib(t: &Tessera, field: &str) -> u64 {
    support::proc_status_kib(t.child.id(), field).expect("a field of /proc/<pid>/status")
}

/// An activator on `store` with `backends` (`model=url`, …) and a fast runner.
fn activator(store: &Path, backends: &[String], extra: &[&str]) -> Tessera {
    let mut args = vec![
        "--batch-store",
        store.to_str().expect("a UTF-8 path"),
        "--batch-progress-interval",
        "100ms",
    ];
    for b in backends {
        args.extend(["--backend", b.as_str()]);
    }
    args.extend_from_slice(extra);
    Tessera::activator(&args)
}

async fn create_raw(http: &reqwest::Client, act: &Tessera, body: &Value) -> (u16, Value) {
    let resp = http
        .post(act.url("/v1/batches"))
        .json(body)
        .send()
        .await
        .expect("POST /v1/batches");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn n1_metadata_is_bounded_and_a_list_reads_only_its_page() {
    let http = http_client(Duration::from_secs(60));
    let sim = Tessera::vllm_sim(&["--served-model-name", "m", "--time-scale", "100"]);
    let store_guard = StoreDir(store_dir("n1"));
    let store = store_guard.0.clone();
    let backends = [format!("m={}", sim.base())];
    let act = activator(&store, &backends, &[]);
    let file = upload(&http, &act, input_lines(2)).await;
    let with = |metadata: Value| json!({"input_file_id": file, "endpoint": "/v1/chat/completions", "completion_window": "24h", "metadata": metadata});
    let many: serde_json::Map<String, Value> = (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
    for (bad, names) in [
        (Value::Object(many), "17 pairs"),
        (json!({ "k".repeat(65): "v" }), "longer than 64"),
        (json!({"k": "v".repeat(513)}), "longer than 512"),
        (json!({"k": 7}), "must be a string"),
    ] {
        let (status, answer) = create_raw(&http, &act, &with(bad)).await;
        assert_eq!(status, 400, "{answer}");
        assert_eq!(answer["error"]["code"], "invalid_metadata");
        let message = answer["error"]["message"].as_str().unwrap_or_default().to_owned();
        assert!(
            message.contains(names.split(' ').next_back().unwrap_or(names)),
            "{message}"
        );
    }
    let full: serde_json::Map<String, Value> = (0..16)
        .map(|i| (format!("{i:0>64}"), json!("é".repeat(512))))
        .collect();
    let (status, answer) = create_raw(&http, &act, &with(Value::Object(full))).await;
    assert_eq!(status, 200, "16 pairs at the bounds are kept: {answer}");
    let id = answer["id"].as_str().expect("an id").to_owned();
    let done = wait_batch(&http, &act, &id, Duration::from_secs(60), |b| {
        b["status"] == "completed"
    })
    .await;
    drop(act);

    // What an older release left on the volume: finished batches with 2 MB of metadata each. The store is opened
    // again as an upgraded activator opens it (its listings built once, a document at a time).
    let doc: Value = serde_json::from_slice(
        &std::fs::read(store.join("batches").join(format!("{id}.json"))).expect("the document"),
    )
    .expect("JSON");
    let old = 60;
    for i in 0..old {
        let mut d = doc.clone();
        let planted = format!("batch_{:016x}{i:x}", 1u64 << 60);
        d["id"] = json!(planted);
        d["metadata"] = json!({"blob": "x".repeat(2 * 1024 * 1024)});
        std::fs::write(
            store.join("batches").join(format!("{planted}.json")),
            d.to_string(),
        )
        .expect("plant");
    }
    std::fs::remove_dir_all(store.join("index")).expect("drop the listings, as before they existed");
    let act = activator(&store, &backends, &[]);
    let rss_before = kib(&act, "VmRSS");
    let started = Instant::now();
    let mut seen = Vec::new();
    for _ in 0..5 {
        let url = act.url("/v1/batches?limit=1");
        let pages = (0..4).map(|_| support::get_json(&http, &url));
        for page in futures::future::join_all(pages).await {
            assert_eq!(page["data"].as_array().map(Vec::len), Some(1), "{page}");
            assert_eq!(page["has_more"], true);
            assert_eq!(
                page["data"][0]["id"],
                json!(id),
                "newest first: the batch made here"
            );
        }
    }
    // Paging on: the cursor walks the old batches without repeating one.
    let mut after = id.clone();
    for _ in 0..3 {
        let page = support::get_json(&http, &act.url(&format!("/v1/batches?limit=2&after={after}"))).await;
        for b in page["data"].as_array().expect("data") {
            let bid = b["id"].as_str().expect("an id").to_owned();
            assert!(!seen.contains(&bid), "{bid} twice");
            seen.push(bid);
        }
        after = page["last_id"].as_str().expect("a last id").to_owned();
    }
    assert_eq!(seen.len(), 6);
    let lists_ms = started.elapsed().as_millis();
    // The runner idles beside them: it reads active batches only.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let hwm = kib(&act, "VmHWM");
    println!(
        "FAULT batch-metadata: old_docs={old} doc_mib=2 rss_before_kib={rss_before} peak_kib={hwm} lists=20+3 lists_ms={lists_ms} completed={}",
        done["request_counts"]["completed"]
    );
    // Before the bound and the listings: every list and every runner pass read all 120 MB (861 MB seen with 100).
    assert!(hwm < 160 * 1024, "the activator peaked at {hwm} KiB");
}

/// A backend that answers every completion with a JSON array of zeros: `declared` bytes with a length, or (for the
/// prompts `line 7`, `line 15`, …) `chunked` bytes without one. Other requests go to `sim` (its gauges, models).
async fn hostile_backend(sim: String, declared: usize, chunked: usize) -> std::net::SocketAddr {
    fn zeros(n: usize) -> axum::body::Bytes {
        let mut v = Vec::with_capacity(n);
        v.push(b'[');
        while v.len() + 3 < n {
            v.extend_from_slice(b"0,");
        }
        v.extend_from_slice(b"0]");
        axum::body::Bytes::from(v)
    }
    let (small, big) = (zeros(declared), zeros(chunked));
    let client = http_client(Duration::from_secs(30));
    let app = axum::Router::new()
        .route(
            "/v1/chat/completions",
            axum::routing::post(move |body: String| {
                let (small, big) = (small.clone(), big.clone());
                async move {
                    if body.contains("line 7\"")
                        || body.contains("line 15\"")
                        || body.contains("line 23\"")
                        || body.contains("line 31\"")
                    {
                        let stream = futures::stream::iter(
                            big.chunks(64 * 1024)
                                .map(|c| Ok::<_, std::io::Error>(axum::body::Bytes::copy_from_slice(c)))
                                .collect::<Vec<_>>(),
                        );
                        axum::response::Response::builder()
                            .header("content-type", "application/json")
                            .body(axum::body::Body::from_stream(stream))
                            .expect("a response")
                    } else {
                        axum::response::Response::builder()
                            .header("content-type", "application/json")
                            .body(axum::body::Body::from(small))
                            .expect("a response")
                    }
                }
            }),
        )
        .fallback(move |req: axum::extract::Request| {
            let (client, sim) = (client.clone(), sim.clone());
            async move {
                client
                    .get(format!("{sim}{}", req.uri()))
                    .send()
                    .await
                    .expect("the emulator")
                    .text()
                    .await
                    .unwrap_or_default()
            }
        });
    support::serve(app).await
}

#[tokio::test]
async fn n2_huge_answers_stay_within_the_answer_budget() {
    let http = http_client(Duration::from_secs(120));
    let sim = Tessera::vllm_sim(&["--served-model-name", "m", "--time-scale", "100"]);
    let mib = 1024 * 1024;
    let backend = hostile_backend(sim.base(), 3 * mib, 5 * mib).await;
    let store_guard = StoreDir(store_dir("n2"));
    let store = store_guard.0.clone();
    let act = activator(
        &store,
        &[format!("m=http://{backend}")],
        &[
            "--batch-max-answer-bytes",
            "4194304",
            "--lane-throttle-in-flight",
            "64",
            "--lane-poll-interval",
            "50ms",
        ],
    );
    let lines = 32;
    let id = create(&http, &act, &upload(&http, &act, input_lines(lines)).await).await;
    let b = wait_batch(&http, &act, &id, Duration::from_secs(120), |b| {
        b["status"] == "completed"
    })
    .await;
    let hwm = kib(&act, "VmHWM");
    assert_eq!(b["request_counts"]["completed"], 28, "{b}");
    assert_eq!(b["request_counts"]["failed"], 4, "{b}");
    let out = support::get_text(
        &http,
        &act.url(&format!(
            "/v1/files/{}/content",
            b["output_file_id"].as_str().expect("an output")
        )),
    )
    .await;
    let mut answered = 0;
    for line in out.lines() {
        // Checked without building the 1.5-million-element array (a debug build takes seconds per line).
        let head: String = line.chars().take(400).collect();
        assert!(
            head.contains("\"status_code\":200") && head.contains("\"body\":[0,0,"),
            "{head}"
        );
        assert!(
            line.len() > 3_000_000 && line.ends_with("0]},\"error\":null}"),
            "the body as it came, whole"
        );
        answered += 1;
    }
    assert_eq!(answered, 28);
    let errors = support::get_text(
        &http,
        &act.url(&format!(
            "/v1/files/{}/content",
            b["error_file_id"].as_str().expect("errors")
        )),
    )
    .await;
    for line in errors.lines() {
        let rec: Value = serde_json::from_str(line).expect("JSON");
        assert_eq!(rec["error"]["code"], "response_too_large", "{rec}");
        assert!(
            rec["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains("--batch-max-answer-bytes")
        );
    }
    println!("FAULT batch-huge-answers: lines={lines} answer_mib=3 over_limit_mib=5 peak_kib={hwm}");
    // Before: each answer parsed into a serde_json::Value, 16 at once (1.21 GB seen with 16 MiB answers).
    assert!(hwm < 200 * 1024, "the activator peaked at {hwm} KiB");
}

#[tokio::test]
async fn n5_a_stuck_model_blocks_no_other_batch_and_an_earlier_deadline_goes_first() {
    let http = http_client(Duration::from_secs(60));
    // Slow enough that a 3,000-line batch takes far longer than the test's window for the others.
    let sim = Tessera::vllm_sim(&["--served-model-name", "m", "--time-scale", "5"]);
    let dead = support::free_port();
    let store_guard = StoreDir(store_dir("n5"));
    let store = store_guard.0.clone();
    let act = activator(
        &store,
        &[
            format!("m={}", sim.base()),
            format!("stuck=http://127.0.0.1:{dead}"),
        ],
        &["--hold-timeout", "5s"],
    );
    let stuck_line = json!({"custom_id": "s-0", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "stuck", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}});
    // The stuck model's batch has the earliest deadline of all and comes first.
    let stuck = create_with(
        &http,
        &act,
        "",
        &upload(&http, &act, format!("{stuck_line}\n").into_bytes()).await,
        "1h",
    )
    .await;
    wait_batch(&http, &act, &stuck, Duration::from_secs(30), |b| {
        b["status"] == "in_progress"
    })
    .await;
    let long = create(&http, &act, &upload(&http, &act, input_lines(3000)).await).await;
    wait_batch(&http, &act, &long, Duration::from_secs(30), |b| {
        b["request_counts"]["completed"].as_u64() > Some(0)
    })
    .await;
    let started = Instant::now();
    let urgent = create_with(&http, &act, "", &upload(&http, &act, input_lines(5)).await, "2h").await;
    let done = wait_batch(&http, &act, &urgent, Duration::from_secs(60), |b| {
        b["status"] == "completed"
    })
    .await;
    let urgent_s = started.elapsed().as_secs_f64();
    let (l, s) = (
        get_batch(&http, &act, &long).await,
        get_batch(&http, &act, &stuck).await,
    );
    println!(
        "FAULT batch-scheduling: urgent_completed_s={urgent_s:.2} long_answered={} stuck_status={}",
        l["request_counts"]["completed"], s["status"]
    );
    assert_eq!(done["request_counts"]["completed"], 5);
    assert_eq!(
        s["status"], "in_progress",
        "the stuck batch is still waiting for room"
    );
    assert_eq!(
        l["status"], "in_progress",
        "the long batch yielded and resumes after: {l}"
    );
    assert!(l["request_counts"]["completed"].as_u64() < Some(3000));
}

#[tokio::test]
async fn n13_window_bounded_long_line_numbered_and_a_bom_read() {
    let http = http_client(Duration::from_secs(60));
    let gw = Gateway::start("n13", &["--max-body-size", "2048"]);
    let act = &gw.act;
    let file = upload(&http, act, input_lines(2)).await;
    let (status, answer) = create_raw(
        &http,
        act,
        &json!({"input_file_id": file, "endpoint": "/v1/chat/completions", "completion_window": "18446744073709551615s"}),
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["code"], "invalid_completion_window");

    let mut long = input_lines(2);
    let big = json!({"custom_id": "c-2", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "m", "messages": [{"role": "user", "content": "x".repeat(8000)}]}});
    long.extend_from_slice(format!("{big}\n").as_bytes());
    let id = create(&http, act, &upload(&http, act, long).await).await;
    let b = wait_batch(&http, act, &id, Duration::from_secs(30), |b| {
        b["status"] == "failed"
    })
    .await;
    assert_eq!(b["errors"]["data"][0]["code"], "line_too_long", "{b}");
    assert_eq!(b["errors"]["data"][0]["line"], 3, "{b}");
    assert!(
        b["errors"]["data"][0]["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with("line 3:"),
        "{b}"
    );

    let mut bom = b"\xEF\xBB\xBF".to_vec();
    bom.extend(input_lines(3));
    let id = create(&http, act, &upload(&http, act, bom).await).await;
    let b = wait_batch(&http, act, &id, Duration::from_secs(30), |b| {
        b["status"]
            .as_str()
            .is_some_and(|s| s == "completed" || s == "failed")
    })
    .await;
    assert_eq!(
        b["status"], "completed",
        "a file saved with a byte order mark runs: {b}"
    );
    assert_eq!(b["request_counts"]["completed"], 3);
}

#[tokio::test]
async fn n16_namespace_quotas_on_files_and_bytes() {
    let http = http_client(Duration::from_secs(60));
    let gw = Gateway::start(
        "n16",
        &[
            "--batch-max-files-per-namespace",
            "3",
            "--batch-max-namespace-bytes",
            "20000",
        ],
    );
    let act = &gw.act;
    for _ in 0..3 {
        upload(&http, act, input_lines(1)).await;
    }
    let refused = post_file(&http, act, "", input_lines(1)).await;
    assert_eq!(refused.status(), 429);
    let e: Value = refused.json().await.expect("an OpenAI error");
    assert_eq!(e["error"]["code"], "namespace_quota_exceeded");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("--batch-max-files-per-namespace"),
        "{e}"
    );
    // Another namespace has its own room; its bytes are bounded too.
    upload_to(&http, act, "/namespaces/team-b", vec![b'x'; 15_000]).await;
    let refused = post_file(&http, act, "/namespaces/team-b", vec![b'x'; 6_000]).await;
    assert_eq!(refused.status(), 429);
    let e: Value = refused.json().await.expect("an OpenAI error");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("--batch-max-namespace-bytes"),
        "{e}"
    );
    let bad = support::get(&http, &act.url("/namespaces/..%2F..%2Fetc/v1/files")).await;
    assert!(
        bad.status().is_client_error(),
        "a namespace that is no name is refused"
    );
}

#[tokio::test]
async fn n9_a_batch_body_that_never_arrives_is_cut_at_the_body_read_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let gw = Gateway::start("n9", &["--body-read-timeout", "2s"]);
    let act = &gw.act;
    let mut answers = Vec::new();
    for head in [
        "POST /v1/batches HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"input",
        "POST /v1/files HTTP/1.1\r\nhost: x\r\ncontent-type: multipart/form-data; boundary=B\r\ncontent-length: 100000\r\n\r\n--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\n{\"custom_id\"",
    ] {
        let mut conn = tokio::net::TcpStream::connect(act.addr).await.expect("connect");
        conn.write_all(head.as_bytes()).await.expect("send the head");
        let started = Instant::now();
        let mut answer = Vec::new();
        // The client sends nothing more and keeps its connection open; the activator answers and closes.
        let read = tokio::time::timeout(Duration::from_secs(20), conn.read_to_end(&mut answer)).await;
        assert!(
            read.is_ok(),
            "the activator still holds the connection after 20 s"
        );
        let text = String::from_utf8_lossy(&answer).into_owned();
        assert!(text.starts_with("HTTP/1.1 408"), "{text}");
        assert!(text.contains("body_read_timeout"), "{text}");
        answers.push(started.elapsed().as_secs_f64());
    }
    println!(
        "FAULT batch-stalled-body: create_cut_s={:.2} upload_cut_s={:.2}",
        answers[0], answers[1]
    );
    assert!(answers.iter().all(|s| *s < 10.0), "{answers:?}");
}
