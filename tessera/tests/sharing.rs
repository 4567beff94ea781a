//! `tessera sharing` as a user runs it: the real binary, its report, its last `key=value` line, and its errors.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::process::Command;

fn sharing(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .arg("sharing")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// The script line's numbers (`fits` read as 1 or 0).
fn last_line(stdout: &str) -> HashMap<String, f64> {
    stdout
        .lines()
        .last()
        .unwrap()
        .split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            let v = match v {
                "true" => 1.0,
                "false" => 0.0,
                v => v.parse().unwrap(),
            };
            (k.to_string(), v)
        })
        .collect()
}

/// The worked example: two Qwen3 14B replicas on an A100 80GB, each decoding 8 sequences.
const WORKED_EXAMPLE: [&str; 8] = [
    "--gpu",
    "a100-80gb",
    "--model",
    "qwen3-14b",
    "--batch",
    "8",
    "--tenants",
    "2",
];

/// Two 14B replicas on an A100, each decoding 8 sequences: the worked example. Each slows by well over
/// ×1.2 (they share ~30 GB-a-step of bandwidth while their GPU parts overlap) and the two together serve less
/// than 1.3 × one alone (one alone keeps the HBM busy ~79% of its step).
#[test]
fn two_14b_replicas_on_an_a100() {
    let (ok, stdout, stderr) = sharing(
        &[
            &WORKED_EXAMPLE[..],
            &["--context", "1000", "--share", "0.5", "--mode", "mps"],
        ]
        .concat(),
    );
    assert!(ok, "{stderr}");
    assert!(stdout.contains("fits"), "{stdout}");
    let kv = last_line(&stdout);
    for key in [
        "tpot_alone_ms",
        "tpot_shared_ms",
        "tpot_ratio",
        "throughput_ratio",
        "aggregate_ratio",
        "fits",
    ] {
        assert!(kv.contains_key(key), "{key} missing: {stdout}");
    }
    assert_eq!(kv["fits"], 1.0, "{stdout}");
    let (alone, shared) = (kv["tpot_alone_ms"], kv["tpot_shared_ms"]);
    assert!((kv["tpot_ratio"] - shared / alone).abs() < 1e-3);
    assert!(kv["tpot_ratio"] > 1.4, "{stdout}");
    assert!((kv["aggregate_ratio"] - 2.0 * kv["throughput_ratio"]).abs() < 1e-3);
    assert!(kv["aggregate_ratio"] < 1.3, "{stdout}");
    // Time-slicing on the same pair: turns with a switch cost serve no more than MPS does.
    let (ok, ts, _) = sharing(&[&WORKED_EXAMPLE[..], &["--mode", "time_slicing"]].concat());
    assert!(ok);
    assert!(last_line(&ts)["aggregate_ratio"] <= kv["aggregate_ratio"]);
    // The chart's spelling (gpuPools' sharing: time-slicing) names the same mode.
    let (ok, chart_spelling, stderr) = sharing(&[&WORKED_EXAMPLE[..], &["--mode", "time-slicing"]].concat());
    assert!(ok, "{stderr}");
    assert_eq!(chart_spelling, ts);
}

/// Explicit numbers instead of presets, with units, and a memory that does not fit.
#[test]
fn explicit_gpu_and_model_numbers() {
    let (ok, stdout, stderr) = sharing(&[
        "--gpu-bandwidth",
        "2.039TB/s",
        "--gpu-flops",
        "312T",
        "--gpu-memory",
        "16GiB",
        "--model-params",
        "8.03e9",
        "--weights-bytes",
        "14.96GiB",
        "--kv-bytes-per-token",
        "131072",
        "--batch",
        "16",
        "--tenants",
        "2",
    ]);
    // The figures are still shown, marked; the script line says fits=false and the command fails with the fix.
    assert!(!ok, "tenants that do not fit must not exit 0");
    assert!(stdout.contains("DOES NOT FIT"), "{stdout}");
    assert!(stdout.lines().last().unwrap().ends_with("fits=false"), "{stdout}");
    assert!(last_line(&stdout)["tpot_alone_ms"] > 0.0);
    assert!(
        stderr.starts_with("Error: 2 tenants need") && stderr.contains("--tenants"),
        "{stderr}"
    );
}

#[test]
fn bad_input_is_refused_with_the_fix() {
    let (ok, _, stderr) = sharing(&["--model", "qwen3-14b"]);
    assert!(!ok);
    assert!(stderr.contains("--gpu PRESET"), "{stderr}");
    let (ok, _, stderr) = sharing(&["--gpu", "a100", "--model", "qwen3-14b", "--share", "0"]);
    assert!(!ok);
    assert!(stderr.contains("--share"), "{stderr}");
    let (ok, _, stderr) = sharing(&["--gpu", "a100", "--model", "gpt-5"]);
    assert!(!ok);
    assert!(stderr.contains("known presets"), "{stderr}");
}
