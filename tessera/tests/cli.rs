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

/// Where the error was made is there for whoever asks (`RUST_LIB_BACKTRACE=1` or `RUST_BACKTRACE=full`), after
/// the same one report; `RUST_BACKTRACE=1` alone still gets the report only.
#[test]
fn an_errors_backtrace_only_on_request() {
    for (var, value) in [("RUST_LIB_BACKTRACE", "1"), ("RUST_BACKTRACE", "full")] {
        let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["simulate", "--scenario", "/nonexistent/scenario.yaml"])
            .env_remove("RUST_BACKTRACE")
            .env(var, value)
            .output()
            .expect("run tessera");
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.starts_with("Error: cannot read scenario"),
            "{var}={value}: {err}"
        );
        assert!(
            err.contains("\n\nwhere the error was made:\n"),
            "{var}={value}: {err}"
        );
    }
}

/// A bad flag value and a wrong URL: one clear line each, no backtrace, under `RUST_BACKTRACE=1`.
#[test]
fn a_bad_value_or_url_is_one_line() {
    let out = tessera(&["simulate", "--prometheus", "not-a-url"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("Error: --prometheus \"not-a-url\""), "{err}");
    let out = tessera(&["simulate", "--seeds", "abc"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("error: invalid value 'abc' for '--seeds"),
        "{err}"
    );
    assert!(!err.to_lowercase().contains("backtrace"), "{err}");
}

/// `tessera simulate` with its stderr in a file: the table on stdout, and on stderr no INFO lines (it logs
/// warnings only unless RUST_LOG says otherwise), no colour codes and no progress bar.
#[test]
fn simulate_writes_no_log_noise_or_escape_codes_to_a_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("stderr.txt");
    let file = std::fs::File::create(&path).expect("create");
    let status = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["simulate"])
        .env("RUST_BACKTRACE", "1")
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(file)
        .status()
        .expect("run tessera");
    assert!(status.success());
    let err = std::fs::read(&path).expect("read");
    assert!(
        !err.contains(&0x1b),
        "an escape code: {}",
        String::from_utf8_lossy(&err)
    );
    let err = String::from_utf8_lossy(&err);
    assert!(!err.contains(" INFO ") && !err.contains("tessera_sim::"), "{err}");
}

/// Each role's `--help` groups its flags under headings, and no internal Rust name (`module::ITEM`) leaks into
/// a flag's help or default.
#[test]
fn role_help_has_headings_and_no_internal_names() {
    let sidecar_bin = env!("CARGO_BIN_EXE_tessera-sidecar");
    for (bin, role, expected) in [
        (
            env!("CARGO_BIN_EXE_tessera"),
            "sidecar",
            &[
                "vLLM and scraping:",
                "Memory recommendation:",
                "Compute share and latency objective:",
                "GPU and memory facts:",
                "Start-up gate:",
                "Sleep mode:",
                "Serving and shutdown:",
                "Logging:",
            ][..],
        ),
        (
            sidecar_bin,
            "sidecar",
            &["vLLM and scraping:", "Start-up gate:", "Logging:"][..],
        ),
        (
            env!("CARGO_BIN_EXE_tessera"),
            "activator",
            &[
                "Serving and shutdown:",
                "Static backends (no Kubernetes):",
                "Kubernetes:",
                "Holding requests (scale from zero):",
                "Limits and timeouts:",
                "Flex lane (service_tier: flex, batch):",
                "Batch API (Files and Batches):",
                "Logging:",
            ][..],
        ),
        (
            env!("CARGO_BIN_EXE_tessera"),
            "autoscaler",
            &[
                "Serving:",
                "Scaling rounds:",
                "Sidecars:",
                "Activator:",
                "Leader election:",
                "GPU pools:",
                "/ui page:",
                "Without Kubernetes (--no-kube):",
                "KEDA external scaler:",
                "Logging:",
            ][..],
        ),
    ] {
        let out = Command::new(bin).args([role, "--help"]).output().expect("run");
        assert!(out.status.success());
        let help = String::from_utf8_lossy(&out.stdout);
        let headings: Vec<&str> = help
            .lines()
            .filter(|l| !l.starts_with(' ') && l.ends_with(':'))
            .collect();
        for h in expected {
            assert!(headings.contains(h), "{role}: no heading {h:?} in {headings:?}");
        }
        // Flags left under the catch-all heading: only --help (and --version where there is one).
        let mut heading = "";
        let mut under_options = Vec::new();
        for line in help.lines() {
            if !line.starts_with(' ') && line.ends_with(':') {
                heading = line;
            } else if heading == "Options:" && line.trim_start().starts_with('-') {
                under_options.push(line.trim());
            }
        }
        assert!(
            under_options.len() <= 2,
            "{role}: flags without a heading: {under_options:?}"
        );
        assert!(
            !help.contains("::"),
            "{role}: an internal name in --help:\n{help}"
        );
    }
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

/// A scenario with several fields missing names them all in one run (serde alone names the first, so three gaps
/// took three runs), with the first one's line.
#[test]
fn every_missing_scenario_field_in_one_report() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("gaps.yaml");
    std::fs::write(
        &file,
        "name: gaps\nduration: 1h\nmodels:\n  - name: chat\n    preset: llama-3.1-8b\n    max_replicas: 2\n",
    )
    .expect("write the scenario");
    let out = tessera(&["simulate", "--scenario", file.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("missing fields: "), "{err}");
    for field in [
        "`gpu`",
        "`models[0].slo_ttft`",
        "`models[0].hpa_requests_per_second_per_replica`",
        "`models[0].traffic`",
    ] {
        assert!(err.contains(field), "{field} named with the others: {err}");
    }
    assert!(err.contains("line"), "the first one's place: {err}");
}
