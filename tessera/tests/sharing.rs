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

/// "What if my 8B chat and my 3B model share a GPU": two different tenants, each with its own share and batch,
/// and the TTFT of a 2,000-token prompt alone and shared. The script line carries each tenant's figures under
/// `t1_` and `t2_`, and the figures follow the shares: the tenant with more SMs prefills faster.
#[test]
fn two_different_tenants_with_a_prompt() {
    let (ok, stdout, stderr) = sharing(&[
        "--gpu",
        "h100-80gb",
        "--prompt",
        "2000",
        "--tenant",
        "model=llama-3.1-8b,share=0.6,batch=32",
        "--tenant",
        "model=llama-3.2-3b,share=0.4,batch=64,context=500",
    ]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("t1 meta-llama/Llama-3.1-8B-Instruct"), "{stdout}");
    assert!(stdout.contains("t2 meta-llama/Llama-3.2-3B-Instruct"), "{stdout}");
    assert!(stdout.contains("prefill of a 2000-token prompt"), "{stdout}");
    let kv = last_line(&stdout);
    assert_eq!(kv["tenants"], 2.0);
    assert_eq!(kv["fits"], 1.0);
    for t in ["t1", "t2"] {
        let k = |key: &str| kv[&format!("{t}_{key}")];
        assert!(k("tpot_shared_ms") > k("tpot_alone_ms"), "{t}: {stdout}");
        assert!((k("tpot_ratio") - k("tpot_shared_ms") / k("tpot_alone_ms")).abs() < 1e-3);
        assert!(k("ttft_shared_ms") > k("ttft_alone_ms"), "{t}: {stdout}");
        // A prefill is bound by the SMs: at a share s it takes about 1/s as long, never more than that plus
        // the neighbour's bandwidth.
        assert!(k("ttft_ratio") > 1.2, "{t}: {stdout}");
    }
    // The 8B at 0.6 of the SMs stretches its prefill less than the 3B at 0.4.
    assert!(kv["t1_ttft_ratio"] < kv["t2_ttft_ratio"], "{stdout}");
    let sum = kv["t1_throughput_ratio"] + kv["t2_throughput_ratio"];
    assert!((kv["aggregate_ratio"] - sum).abs() < 1e-3, "{stdout}");
    assert!(
        kv["aggregate_ratio"] > 1.0 && kv["aggregate_ratio"] < 2.0,
        "{stdout}"
    );
}

/// `--prompt` with identical tenants adds the TTFT keys to the same script line, before `fits`.
#[test]
fn identical_tenants_with_a_prompt() {
    let (ok, stdout, stderr) = sharing(&[&WORKED_EXAMPLE[..], &["--prompt", "3000"]].concat());
    assert!(ok, "{stderr}");
    let line = stdout.lines().last().unwrap();
    assert!(line.ends_with("fits=true"), "{stdout}");
    let kv = last_line(&stdout);
    // 3,000 tokens on an A100 (2,048 a step): two chunks; at half the SMs beside a busy 14B decoder.
    assert!(stdout.contains("(2 steps"), "{stdout}");
    assert!(kv["ttft_ratio"] > 1.9, "{stdout}");
    assert!((kv["ttft_ratio"] - kv["ttft_shared_ms"] / kv["ttft_alone_ms"]).abs() < 1e-3);
}

/// `--help` names every GPU and model preset the calculator accepts, and the new flags.
#[test]
fn help_names_the_presets_and_the_new_flags() {
    let (ok, stdout, _) = sharing(&["--help"]);
    assert!(ok);
    let flat = stdout.split_whitespace().collect::<Vec<_>>().join(" ");
    for p in [
        "a100-80gb",
        "a100-40gb",
        "h100-80gb",
        "h200",
        "l40s",
        "l4",
        "b200",
        "llama-3.2-1b",
        "llama-3.2-3b",
        "qwen3-14b",
    ] {
        assert!(flat.contains(p), "{p} missing from --help: {stdout}");
    }
    for flag in ["--tenant <SPEC>", "--prompt <PROMPT>", "--host-time <HOST_TIME>"] {
        assert!(flat.contains(flag), "{flag} missing from --help: {stdout}");
    }
}

#[test]
fn bad_tenants_are_refused_with_the_fix() {
    for (args, want) in [
        (
            vec!["--gpu", "a100", "--tenant", "share=0.5"],
            "--tenant #1 names no model",
        ),
        (
            vec![
                "--gpu",
                "a100",
                "--tenant",
                "model=qwen3-14b",
                "--tenant",
                "model=qwen3-14b,share=2",
            ],
            "share=2 in --tenant #2 is outside (0, 1]",
        ),
        (
            vec!["--gpu", "a100", "--tenant", "model=qwen3-14b,colour=red"],
            "unknown key \"colour\"",
        ),
        (
            vec!["--gpu", "a100", "--tenants", "3", "--tenant", "model=qwen3-14b"],
            "cannot be used with",
        ),
        (
            vec!["--gpu", "a100", "--model", "qwen3-14b", "--prompt", "0"],
            "--prompt 0 must be at least 1 token",
        ),
        (
            vec!["--gpu", "a100", "--model", "qwen3-14b", "--host-time", "3"],
            "needs a unit",
        ),
    ] {
        let (ok, stdout, stderr) = sharing(&args);
        assert!(!ok, "{args:?} must fail: {stdout}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
}
