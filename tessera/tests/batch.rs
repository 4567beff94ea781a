//! The OpenAI Batch API over loopback: `tessera vllm-sim` behind `tessera activator --batch-store`.
//!
//! - The official `openai` Python client (`batch_client.py`, installed into `.tools/venv` by scripts/test.sh)
//!   uploads, creates, polls to `completed`, downloads the output and error files, lists and deletes; and
//!   cancels a batch.
//! - Nothing lost, nothing twice: a 20,000-line batch whose runner is SIGKILLed at about a third and again at
//!   two thirds, each time finished by another activator process on the same store; and the same with a cancel
//!   at half; and a runner paused (SIGSTOP) past its lease while another takes over, then woken. Every
//!   `custom_id` is in the output or the error file exactly once and `request_counts` add up.
//! - A running batch leaves real-time TTFT p95 within 10% of its value without the batch; expiry, the limits and
//!   namespaces.
//! - Memory (ignored by default, run by hand; the figure is in docs/performance.md): the activator's peak RSS
//!   while a 200 MB input is uploaded and run.

mod support;

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::batch::{create, create_with, get_batch, input_lines, upload, upload_to, wait_batch};
use support::{Tessera, http_client};

/// The timing test measures latency on a 2-core machine: it runs alone (the write side), the others beside each
/// other (the read side). Tests of one binary run on threads at once; the lock works across their runtimes.
static TIMING: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// The emulator, fast (a hundred times a real GPU) so a 20,000-line batch takes seconds.
fn emulator() -> Tessera {
    Tessera::vllm_sim(&["--served-model-name", "m", "--time-scale", "100"])
}

/// An activator on `store` in front of `sim`, with a short lease so a takeover comes within a second or two,
/// and a flex lane that reads the emulator's gauges often (the batch lines pass its gate).
fn activator(sim: &Tessera, store: &Path) -> Tessera {
    let backend = format!("m={}", sim.base());
    Tessera::activator_for(
        &backend,
        &[
            "--batch-store",
            store.to_str().expect("a UTF-8 path"),
            "--batch-lease-duration",
            "1s",
            "--batch-progress-interval",
            "100ms",
            "--batch-max-in-flight",
            "64",
            "--lane-throttle-in-flight",
            "64",
            // A gauge read per 50 ms admits up to 64 lines per read: above what the debug build answers, and a page
            // render and parse fewer than every 20 ms on a loaded 2-core machine.
            "--lane-poll-interval",
            "50ms",
        ],
    )
}

fn answered(b: &Value) -> u64 {
    b["request_counts"]["completed"].as_u64().unwrap_or(0)
        + b["request_counts"]["failed"].as_u64().unwrap_or(0)
}

/// Leaves what a runner killed mid-renewal leaves: a claim on the lease's next version, never written to the
/// lease itself (the store's layout: `lease.json`, `lease-claims/<version>` holding the claimer's name).
fn plant_a_dead_claim(store: &Path) {
    let lease: Value = serde_json::from_slice(&std::fs::read(store.join("lease.json")).expect("the lease"))
        .expect("the lease as JSON");
    let next = lease["version"].as_u64().expect("a lease version") + 1;
    let claim = store.join("lease-claims").join(next.to_string());
    // The killed runner may have claimed it for real already; either way the claim is there and never written.
    if !claim.exists() {
        std::fs::write(&claim, lease["holder"].as_str().expect("a holder")).expect("a claim");
    }
}

/// Downloads a result file: custom_id → its record.
async fn results(
    http: &reqwest::Client,
    act: &Tessera,
    file: &Value,
    into: &mut HashMap<String, Value>,
) -> u64 {
    let Some(id) = file.as_str() else { return 0 };
    let text = support::get_text(http, &act.url(&format!("/v1/files/{id}/content"))).await;
    let mut n = 0;
    for line in text.lines() {
        let rec: Value = serde_json::from_str(line).expect("a JSON line");
        let cid = rec["custom_id"].as_str().expect("a custom_id").to_owned();
        assert!(into.insert(cid.clone(), rec).is_none(), "{cid} is answered twice");
        n += 1;
    }
    n
}

/// Every custom_id of `total` exactly once across the two files, and the counts add up; returns the records.
async fn check_exactly_once(
    http: &reqwest::Client,
    act: &Tessera,
    b: &Value,
    total: usize,
) -> HashMap<String, Value> {
    let mut all = HashMap::new();
    let outputs = results(http, act, &b["output_file_id"], &mut all).await;
    let errors = results(http, act, &b["error_file_id"], &mut all).await;
    assert_eq!(all.len(), total, "every custom_id once across output + error");
    for i in 0..total {
        assert!(all.contains_key(&format!("c-{i}")), "c-{i} missing");
    }
    assert_eq!(b["request_counts"]["total"].as_u64(), Some(total as u64));
    assert_eq!(b["request_counts"]["completed"].as_u64(), Some(outputs), "{b}");
    assert_eq!(b["request_counts"]["failed"].as_u64(), Some(errors), "{b}");
    all
}

#[tokio::test]
async fn the_openai_python_client_runs_and_cancels_a_batch() {
    let _shared = TIMING.read().await;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace");
    let python = root.join(".tools/venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: scripts/test.sh installs the openai client there",
        python.display()
    );
    let sim = emulator();
    let store = tempfile::tempdir().expect("a temp dir");
    let act = activator(&sim, store.path());
    for (mode, lines) in [("complete", "300"), ("cancel", "3000")] {
        let out = Command::new(&python)
            .arg(root.join("tessera/tests/batch_client.py"))
            .args([&act.base(), "m", mode, lines])
            .output()
            .expect("run batch_client.py");
        assert!(
            out.status.success(),
            "batch_client.py {mode} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let seen: Value = serde_json::from_slice(&out.stdout).expect("the client's summary");
        println!("{mode}: {seen}");
        let total = seen["total"].as_u64().expect("a total");
        assert_eq!(
            seen["completed"].as_u64().unwrap_or(0) + seen["failed"].as_u64().unwrap_or(0),
            total
        );
    }
    let http = http_client(Duration::from_secs(30));
    // The lines are counted by outcome: 299 completed and 1 refused by the model in the first batch, and the
    // cancelled batch's unsent lines.
    let page = support::get_text(&http, &act.admin_url("/metrics")).await;
    let count = |outcome: &str| -> f64 {
        let key =
            format!("tessera_activator_batch_lines_total{{namespace=\"default\",outcome=\"{outcome}\"}} ");
        page.lines()
            .find_map(|l| l.strip_prefix(&key)?.parse().ok())
            .unwrap_or(0.0)
    };
    assert!(count("completed") >= 299.0, "{page}");
    assert!(count("failed") >= 1.0, "{page}");
    assert!(count("cancelled") >= 1.0, "{page}");
    // Bad input is refused with its line number before anything is sent.
    let mut bad = input_lines(3);
    bad.extend_from_slice(b"{\"custom_id\":\"c-0\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"m\"}}\n");
    let file = upload(&http, &act, bad).await;
    let id = create(&http, &act, &file).await;
    let b = wait_batch(&http, &act, &id, Duration::from_secs(20), |b| {
        b["status"] == "failed"
    })
    .await;
    let err = &b["errors"]["data"][0];
    assert_eq!(err["code"], "duplicate_custom_id", "{b}");
    assert_eq!(err["line"], 4, "{b}");
    assert_eq!(answered(&b), 0);
    // The input of a running batch cannot be deleted.
    let file = upload(&http, &act, input_lines(5_000)).await;
    let id = create(&http, &act, &file).await;
    let del = http
        .delete(act.url(&format!("/v1/files/{file}")))
        .send()
        .await
        .expect("DELETE");
    assert_eq!(del.status(), 409);
    let b = wait_batch(&http, &act, &id, Duration::from_secs(40), |b| {
        b["status"] == "completed"
    })
    .await;
    check_exactly_once(&http, &act, &b, 5_000).await;
    let del = http
        .delete(act.url(&format!("/v1/files/{file}")))
        .send()
        .await
        .expect("DELETE");
    assert_eq!(del.status(), 200);
}

const CRASH_LINES: usize = 20_000;

/// A crash test's start: the emulator, a store, an activator on it, and a batch of [`CRASH_LINES`] created.
struct CrashRun {
    sim: Tessera,
    store: tempfile::TempDir,
    http: reqwest::Client,
    started: Instant,
    act: Tessera,
    id: String,
}

async fn start_crash_batch() -> CrashRun {
    let sim = emulator();
    let store = tempfile::tempdir().expect("a temp dir");
    let http = http_client(Duration::from_secs(60));
    let started = Instant::now();
    let act = activator(&sim, store.path());
    let file = upload(&http, &act, input_lines(CRASH_LINES)).await;
    let id = create(&http, &act, &file).await;
    CrashRun {
        sim,
        store,
        http,
        started,
        act,
        id,
    }
}

#[tokio::test]
async fn a_runner_killed_twice_loses_nothing_and_answers_nothing_twice() {
    let _shared = TIMING.read().await;
    let CrashRun {
        sim,
        store,
        http,
        started,
        mut act,
        id,
    } = start_crash_batch().await;
    for third in [1, 2] {
        let at = (CRASH_LINES * third / 3) as u64;
        let b = wait_batch(&http, &act, &id, Duration::from_secs(60), |b| answered(b) >= at).await;
        act.child.kill().expect("SIGKILL the runner");
        let _ = act.child.wait();
        println!(
            "killed the runner at {} of {CRASH_LINES} answered ({:?})",
            answered(&b),
            started.elapsed()
        );
        act = activator(&sim, store.path());
    }
    let b = wait_batch(&http, &act, &id, Duration::from_secs(60), |b| {
        b["status"] == "completed"
    })
    .await;
    let all = check_exactly_once(&http, &act, &b, CRASH_LINES).await;
    assert!(
        all.values().all(|r| r["response"]["status_code"] == 200),
        "every line answered by the model"
    );
    println!(
        "completed after two kills in {:?}: {}",
        started.elapsed(),
        b["request_counts"]
    );
}

/// Sends `signal` (`STOP`, `CONT`) to a child.
fn signal(child: &std::process::Child, signal: &str) {
    let sent = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(sent.success(), "kill -{signal} {}", child.id());
}

/// A runner that is paused (not killed) for longer than the lease, while a second activator on the same store
/// takes over, and then wakes up: it must write nothing more (its answers in flight would be second answers).
#[tokio::test]
async fn a_paused_runner_that_wakes_after_a_takeover_writes_nothing_twice() {
    let _shared = TIMING.read().await;
    let sim = emulator();
    let store = tempfile::tempdir().expect("a temp dir");
    let http = http_client(Duration::from_secs(60));
    let first = activator(&sim, store.path());
    let file = upload(&http, &first, input_lines(8_000)).await;
    let id = create(&http, &first, &file).await;
    // The second activator follows from the start; it serves the API throughout.
    let second = activator(&sim, store.path());
    let b = wait_batch(&http, &second, &id, Duration::from_secs(60), |b| {
        answered(b) >= 2_000
    })
    .await;
    signal(&first.child, "STOP");
    let paused_at = answered(&b);
    // The second takes over after the lease (1 s) and moves the batch on.
    wait_batch(&http, &second, &id, Duration::from_secs(60), |b| {
        answered(b) >= paused_at + 1_500
    })
    .await;
    signal(&first.child, "CONT");
    let b = wait_batch(&http, &second, &id, Duration::from_secs(60), |b| {
        b["status"] == "completed"
    })
    .await;
    check_exactly_once(&http, &second, &b, 8_000).await;
    drop(first);
}

#[tokio::test]
async fn a_cancel_at_half_with_a_killed_runner_still_answers_each_line_once() {
    let _shared = TIMING.read().await;
    let CrashRun {
        sim,
        store,
        http,
        started,
        mut act,
        id,
    } = start_crash_batch().await;
    let third = (CRASH_LINES / 3) as u64;
    wait_batch(&http, &act, &id, Duration::from_secs(60), |b| {
        answered(b) >= third
    })
    .await;
    act.child.kill().expect("SIGKILL the runner");
    let _ = act.child.wait();
    act = activator(&sim, store.path());
    let half = (CRASH_LINES / 2) as u64;
    wait_batch(&http, &act, &id, Duration::from_secs(60), |b| answered(b) >= half).await;
    let resp: Value = http
        .post(act.url(&format!("/v1/batches/{id}/cancel")))
        .send()
        .await
        .expect("cancel")
        .json()
        .await
        .expect("a batch object");
    assert_eq!(resp["status"], "cancelling", "{resp}");
    // The runner dies while cancelling; the next one finishes the cancel.
    act.child.kill().expect("SIGKILL the runner");
    let _ = act.child.wait();
    // And it died, as a renewal may, between claiming the next lease version and writing the lease: the next
    // runner must not wait for that version forever (CI once saw exactly this).
    plant_a_dead_claim(store.path());
    act = activator(&sim, store.path());
    let b = wait_batch(&http, &act, &id, Duration::from_secs(60), |b| {
        b["status"] == "cancelled"
    })
    .await;
    let all = check_exactly_once(&http, &act, &b, CRASH_LINES).await;
    let cancelled = all
        .values()
        .filter(|r| r["error"]["code"] == "batch_cancelled")
        .count();
    let done = all
        .values()
        .filter(|r| r["response"]["status_code"] == 200)
        .count();
    assert!(
        cancelled > 0 && done as u64 >= half,
        "cancelled {cancelled}, done {done}"
    );
    assert_eq!(cancelled + done, CRASH_LINES);
    println!(
        "cancelled at half in {:?}: {done} answered, {cancelled} batch_cancelled",
        started.elapsed()
    );
}

#[tokio::test]
async fn expiry_limits_and_namespaces() {
    let _shared = TIMING.read().await;
    let sim = emulator();
    let store = tempfile::tempdir().expect("a temp dir");
    let backend = format!("m={}", sim.base());
    let act = Tessera::activator_for(
        &backend,
        &[
            "--batch-store",
            store.path().to_str().expect("a UTF-8 path"),
            "--batch-max-file-bytes",
            "2000000",
            "--batch-max-requests",
            "9000",
            "--batch-max-in-flight",
            "8",
            "--batch-progress-interval",
            "100ms",
        ],
    );
    let http = http_client(Duration::from_secs(60));

    // A window shorter than the work: sending stops at the deadline, the rest is `batch_expired`, what finished
    // is kept, and every line is still answered once.
    let file = upload(&http, &act, input_lines(8_000)).await;
    let id = create_with(&http, &act, "", &file, "2s").await;
    let b = wait_batch(&http, &act, &id, Duration::from_secs(40), |b| {
        b["status"] == "expired"
    })
    .await;
    assert!(b["expired_at"].as_u64().is_some(), "{b}");
    let all = check_exactly_once(&http, &act, &b, 8_000).await;
    let expired = all
        .values()
        .filter(|r| r["error"]["code"] == "batch_expired")
        .count();
    assert!(
        expired > 0 && expired < 8_000,
        "expired {expired}: some lines finish, the rest expire"
    );

    // Over the file size limit: 413 naming the flag, and nothing is kept.
    let files_before = std::fs::read_dir(store.path().join("files"))
        .expect("files/")
        .count();
    let resp = http
        .post(act.url("/v1/files"))
        .header("content-type", "multipart/form-data; boundary=B")
        .body(
            [
                &b"--B\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x\"\r\n\r\n"[..],
                &vec![b'x'; 2_100_000],
                b"\r\n--B--\r\n",
            ]
            .concat(),
        )
        .send()
        .await
        .expect("POST /v1/files");
    assert_eq!(resp.status(), 413);
    let err: Value = resp.json().await.expect("an OpenAI error");
    assert_eq!(err["error"]["code"], "file_too_large", "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("--batch-max-file-bytes"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(store.path().join("files"))
            .expect("files/")
            .count(),
        files_before
    );

    // Over the request limit: the batch fails validation, nothing sent.
    let file = upload(&http, &act, input_lines(9_001)).await;
    let id = create(&http, &act, &file).await;
    let b = wait_batch(&http, &act, &id, Duration::from_secs(20), |b| {
        b["status"] == "failed"
    })
    .await;
    assert_eq!(b["errors"]["data"][0]["code"], "too_many_requests", "{b}");

    // Namespaces are tenants: team-a's file is invisible from the default namespace, and team-a has no model `m`.
    let file = upload_to(&http, &act, "/namespaces/team-a", input_lines(2)).await;
    let other = http
        .get(act.url(&format!("/v1/files/{file}")))
        .send()
        .await
        .expect("GET");
    assert_eq!(other.status(), 404);
    let own = http
        .get(act.url(&format!("/namespaces/team-a/v1/files/{file}")))
        .send()
        .await
        .expect("GET");
    assert_eq!(own.status(), 200);
    let id = create_with(&http, &act, "/namespaces/team-a", &file, "24h").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let b = loop {
        let b: Value =
            support::get_json(&http, &act.url(&format!("/namespaces/team-a/v1/batches/{id}"))).await;
        if b["status"] == "failed" || Instant::now() > deadline {
            break b;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(b["errors"]["data"][0]["code"], "model_not_found", "{b}");
    assert_eq!(b["errors"]["data"][0]["line"], 1, "{b}");
    let default_view = http
        .get(act.url(&format!("/v1/batches/{id}")))
        .send()
        .await
        .expect("GET");
    assert_eq!(default_view.status(), 404);
}

/// Real-time requests per second beside the batch (the lanes test's load).
const REALTIME_RATE: f64 = 3.0;
/// Each phase's length.
const PHASE: Duration = Duration::from_secs(30);

/// A batch running on the model that also serves real-time traffic at its usual load: the real-time TTFT p95
/// stays within 10% of the same load without the batch, and the batch still gets work done. The lanes test's
/// set-up and load (`support::realtime`), with the batch runner in place of flex clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a real-time ratio: needs the cores steady; scripts/test.sh runs it with its background builds paused"]
async fn a_running_batch_leaves_real_time_ttft_within_ten_percent() {
    let _alone = TIMING.write().await;
    use support::realtime::{ms, p95, realtime_load};
    let sim = support::realtime::llama_emulator();
    let store = tempfile::tempdir().expect("a temp dir");
    let backend = format!("llama={}", sim.base());
    let act = Tessera::activator_for(
        &backend,
        &[
            "--batch-store",
            store.path().to_str().expect("a UTF-8 path"),
            "--lane-hold-timeout",
            "1s",
            "--lane-poll-interval",
            "100ms",
        ],
    );
    let url = support::realtime::ready_and_warm(&act).await;
    let http = http_client(Duration::from_secs(60));

    let mut alone = realtime_load(url.clone(), "llama", REALTIME_RATE, PHASE).await;

    // A batch job's decode-heavy lines, far more than fit in the phase.
    let mut lines = Vec::new();
    for i in 0..2_000 {
        let line = serde_json::json!({"custom_id": format!("c-{i}"), "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "llama", "max_tokens": 512, "ignore_eos": true, "tessera_prompt_tokens": 512,
                     "messages": [{"role": "user", "content": "Classify this support ticket."}]}});
        lines.extend_from_slice(line.to_string().as_bytes());
        lines.push(b'\n');
    }
    let file = upload(&http, &act, lines).await;
    let id = create(&http, &act, &file).await;
    wait_batch(&http, &act, &id, Duration::from_secs(20), |b| {
        b["status"] == "in_progress"
    })
    .await;
    // The batch runs first, as a job already running when people come in.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut with = realtime_load(url.clone(), "llama", REALTIME_RATE, PHASE).await;
    let during = get_batch(&http, &act, &id).await;
    http.post(act.url(&format!("/v1/batches/{id}/cancel")))
        .send()
        .await
        .expect("cancel");
    let b = wait_batch(&http, &act, &id, Duration::from_secs(60), |b| {
        b["status"] == "cancelled"
    })
    .await;
    check_exactly_once_ids(&http, &act, &b, 2_000).await;

    let (p_alone, p_with) = (p95(&mut alone), p95(&mut with));
    let done = during["request_counts"]["completed"].as_u64().unwrap_or(0);
    println!(
        "batch beside real-time: TTFT p95 alone {:.1} ms ({} requests), with the batch running {:.1} ms ({}), ratio \
         {:.3}; batch lines completed during the phase {done}",
        ms(p_alone),
        alone.len(),
        ms(p_with),
        with.len(),
        p_with.as_secs_f64() / p_alone.as_secs_f64()
    );
    assert!(
        done > 0,
        "the batch gets work done beside the real-time load: {during}"
    );
    assert!(
        p_with.as_secs_f64() <= p_alone.as_secs_f64() * 1.10,
        "real-time TTFT p95 {:.1} ms with the batch vs {:.1} ms alone: more than 10% worse",
        ms(p_with),
        ms(p_alone)
    );
}

/// Every `c-<i>` of `total` exactly once across the two files (counts add up).
async fn check_exactly_once_ids(http: &reqwest::Client, act: &Tessera, b: &Value, total: usize) {
    check_exactly_once(http, act, b, total).await;
}

/// Peak RSS (`VmHWM`) of a process, KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    support::proc_status_kib(pid, "VmHWM").expect("VmHWM in /proc/<pid>/status")
}

/// The activator's memory with a 200 MB input: streamed in, streamed through the runner. Run by hand:
/// `cargo test -p tessera --test batch -- --ignored --nocapture memory`.
#[tokio::test]
#[ignore = "a 200 MB upload and 50,000 lines: minutes on a small machine; run by hand for docs/performance.md"]
async fn memory_with_a_200_mb_input() {
    let _shared = TIMING.read().await;
    let sim = emulator();
    let store = tempfile::tempdir().expect("a temp dir");
    let act = activator(&sim, store.path());
    let http = http_client(Duration::from_secs(600));
    let before = peak_rss_kib(act.child.id());
    // 50,000 lines of about 4,000 bytes: 200 MB.
    let pad = "x".repeat(3_900);
    let mut data = Vec::with_capacity(201 * 1024 * 1024);
    for i in 0..50_000 {
        let line = serde_json::json!({"custom_id": format!("c-{i}"), "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": pad}], "max_tokens": 1}});
        data.extend_from_slice(line.to_string().as_bytes());
        data.push(b'\n');
    }
    let size = data.len();
    let file = upload(&http, &act, data).await;
    let after_upload = peak_rss_kib(act.child.id());
    let id = create(&http, &act, &file).await;
    let b = wait_batch(&http, &act, &id, Duration::from_secs(900), |b| {
        b["status"] == "completed"
    })
    .await;
    let after_run = peak_rss_kib(act.child.id());
    println!(
        "input {size} bytes, {} lines: activator peak RSS {before} KiB at start, {after_upload} KiB after the upload, \
         {after_run} KiB after the run",
        b["request_counts"]["total"]
    );
    assert!(
        after_run < 256 * 1024,
        "peak RSS {after_run} KiB: the input must not be held in memory"
    );
}
