//! How the `tessera` command reports a user's mistake: one `Error:` line and each cause once, exit status 1, no
//! backtrace even with `RUST_BACKTRACE=1` (common among Rust users), no log noise or colour codes from the
//! commands a person runs at a terminal.

use std::process::Command;

fn tessera(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .env_remove("RUST_LOG")
        .output()
        .expect("run tessera")
}

#[test]
fn a_user_error_is_one_report_without_a_backtrace() {
    let out = tessera(&["simulate", "--scenario", "/nonexistent/scenario.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("Error: cannot read scenario /nonexistent/scenario.yaml"),
        "{err}"
    );
    assert!(!err.to_lowercase().contains("backtrace"), "{err}");
    assert_eq!(
        err.matches("No such file or directory").count(),
        1,
        "the cause once: {err}"
    );
    assert!(
        !err.contains(" INFO "),
        "simulate logs warnings only by default: {err}"
    );
    assert!(
        !err.contains('\u{1b}'),
        "no colour codes when stderr is not a terminal: {err}"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn a_role_still_logs_what_it_does() {
    // A role's refusal of a bad flag comes from clap (exit 2), before logging; an accepted start logs at info.
    let out = tessera(&["sidecar", "--listen", "not-an-address"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--listen"), "{err}");
}

/// One byte-size parser for every role: the units a platform engineer writes (Kubernetes' `Mi`, vLLM's `MiB`,
/// decimal `MB`) are taken everywhere a flag holds bytes, and a wrong one is named with the accepted forms.
#[test]
fn byte_sizes_are_taken_with_units_by_every_role() {
    for (role, flag, value) in [
        ("activator", "--max-body-size", "16MiB"),
        ("activator", "--max-buffered-body-bytes", "256Mi"),
        ("autoscaler", "--max-document-size", "8MB"),
        ("vllm-sim", "--kv-cache-memory-bytes", "2GiB"),
    ] {
        // `--help` after the flag: clap parses the value first, so a refused value fails before help is printed.
        let out = tessera(&[role, flag, value, "--help"]);
        assert!(
            out.status.success(),
            "{role} {flag} {value}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = tessera(&["activator", "--max-body-size", "16 parsecs"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--max-body-size") && err.contains("not a byte size") && err.contains("MiB/Mi"),
        "{err}"
    );
}
