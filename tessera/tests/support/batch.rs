//! The OpenAI Batch API's client side for the tests (`batch.rs`, `faults_batch.rs`): input lines, an upload (a
//! hand-made multipart body: the tests' reqwest has no multipart), a batch created and polled.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::Tessera;

/// `n` chat lines for the model `m`, custom ids `c-0`…
pub fn input_lines(n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..n {
        let line = serde_json::json!({"custom_id": format!("c-{i}"), "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": format!("line {i}")}], "max_tokens": 2}});
        out.extend_from_slice(line.to_string().as_bytes());
        out.push(b'\n');
    }
    out
}

/// Uploads `data` as a batch input file (a hand-made multipart body: the test's reqwest has no multipart).
pub async fn upload(http: &reqwest::Client, act: &Tessera, data: Vec<u8>) -> String {
    upload_to(http, act, "", data).await
}

/// As [`upload`], under `prefix` (`/namespaces/<ns>` or nothing).
pub async fn upload_to(http: &reqwest::Client, act: &Tessera, prefix: &str, data: Vec<u8>) -> String {
    let len = data.len();
    let resp = post_file(http, act, prefix, data).await;
    assert_eq!(resp.status(), 200);
    let file: Value = resp.json().await.expect("a file object");
    assert_eq!(file["bytes"].as_u64(), Some(len as u64));
    file["id"].as_str().expect("an id").to_owned()
}

/// `POST <prefix>/v1/files` of `data` with purpose batch, whatever the answer (a test of a refusal reads it).
pub async fn post_file(
    http: &reqwest::Client,
    act: &Tessera,
    prefix: &str,
    data: Vec<u8>,
) -> reqwest::Response {
    let mut body = b"--BOUNDARY\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--BOUNDARY\r\n\
Content-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\nContent-Type: application/jsonl\r\n\r\n"
        .to_vec();
    body.extend_from_slice(&data);
    body.extend_from_slice(b"\r\n--BOUNDARY--\r\n");
    http.post(act.url(&format!("{prefix}/v1/files")))
        .header("content-type", "multipart/form-data; boundary=BOUNDARY")
        .body(body)
        .send()
        .await
        .expect("POST /v1/files")
}

/// Creates a 24h chat batch of `file`; its id.
pub async fn create(http: &reqwest::Client, act: &Tessera, file: &str) -> String {
    create_with(http, act, "", file, "24h").await
}

/// As [`create`], under `prefix` and with a completion window.
pub async fn create_with(
    http: &reqwest::Client,
    act: &Tessera,
    prefix: &str,
    file: &str,
    window: &str,
) -> String {
    let batch: Value = http
        .post(act.url(&format!("{prefix}/v1/batches")))
        .json(&serde_json::json!({"input_file_id": file, "endpoint": "/v1/chat/completions", "completion_window": window}))
        .send()
        .await
        .expect("POST /v1/batches")
        .json()
        .await
        .expect("a batch object");
    assert_eq!(batch["status"], "validating", "{batch}");
    batch["id"].as_str().expect("an id").to_owned()
}

/// The batch `id` as the API answers it.
pub async fn get_batch(http: &reqwest::Client, act: &Tessera, id: &str) -> Value {
    super::get_json(http, &act.url(&format!("/v1/batches/{id}"))).await
}

/// Polls until `pred` holds (panics after `within`).
pub async fn wait_batch(
    http: &reqwest::Client,
    act: &Tessera,
    id: &str,
    within: Duration,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let b = get_batch(http, act, id).await;
        if pred(&b) {
            return b;
        }
        assert!(Instant::now() < deadline, "batch never got there: {b}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
