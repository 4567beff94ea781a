//! `tessera simulate` end to end: the real binary, real scenario files, real output files.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

mod support;

/// Runs `tessera simulate <args>` and waits at most `limit`.
fn simulate(args: &[&str], limit: Duration) -> Output {
    support::simulate(None, args, limit)
}

/// Writes the scenario `yaml` as `<name>.yaml` in a new temp dir; returns the dir (keep it) and the file's path.
fn scenario_file(name: &str, yaml: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{name}.yaml"));
    std::fs::write(&path, yaml).unwrap();
    (dir, path.display().to_string())
}

/// Every strategy, in report order, as the last line names it.
const STRATEGIES: [&str; 7] = [
    "static",
    "hpa",
    "kubeai",
    "aibrix",
    "keda_http",
    "hami_static",
    "tessera",
];

/// Parses the last line: `gpu_hours_lower_bound=… gpu_hours_<strategy>=… … slo_attainment_<strategy>=…`, and
/// checks every key is there (the keys scripts used before the peers were added among them).
fn summary(stdout: &str) -> BTreeMap<String, f64> {
    summary_of(stdout, &STRATEGIES)
}

/// [`summary`] for a run of `strategies` only (as the last line names them).
fn summary_of(stdout: &str, strategies: &[&str]) -> BTreeMap<String, f64> {
    let last = stdout.lines().last().expect("some output");
    let fields: BTreeMap<String, f64> = last
        .split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=').expect("key=value");
            (k.to_string(), v.parse().expect("a number"))
        })
        .collect();
    let mut want = vec![
        "gpu_hours_lower_bound".to_string(),
        "gpu_hours_lower_bound_cold_starts".to_string(),
        "gpu_hours_lower_bound_at_goal".to_string(),
    ];
    for s in strategies {
        want.push(format!("gpu_hours_{s}"));
        want.push(format!("slo_attainment_{s}"));
    }
    let mut got: Vec<&String> = fields.keys().collect();
    got.sort();
    want.sort();
    assert_eq!(got, want.iter().collect::<Vec<_>>(), "{last}");
    fields
}

#[test]
fn default_scenario_runs_with_no_arguments_and_prints_the_table() {
    let out = simulate(&["--explain"], Duration::from_secs(300));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The first screen: one short table (today = static on a scenario file) and a line of advice per model, before
    // anything explained.
    let (first, explained) = stdout
        .split_once("──── explained ────")
        .expect("--explain adds the long report after the first screen");
    assert!(
        first.contains("saved vs today") && first.contains("static=today") && first.contains("per GPU-hour"),
        "{first}"
    );
    assert!(
        first.contains("What to do (from Tessera's run):") && first.contains("  support-chat: "),
        "{first}"
    );
    assert!(
        first.lines().count() < 30,
        "the first screen fits a screen:\n{first}"
    );
    assert!(explained.contains("× lower bound"), "{explained}");
    for row in [
        "GPU-hours",
        "TTFT p95",
        "TTFT SLO attainment",
        "cold starts",
        "preemptions",
        "requests failed",
    ] {
        assert!(stdout.contains(row), "missing row {row}:\n{stdout}");
    }
    assert!(
        stdout.contains("lower bound") && stdout.contains("keda-http"),
        "{stdout}"
    );
    let s = summary(&stdout);
    // Nine models, at least one whole GPU each for the static strategy over one hour.
    assert!(s["gpu_hours_static"] >= 9.0, "{s:?}");
    assert!(
        s["gpu_hours_tessera"] > 0.0 && (0.0..=1.0).contains(&s["slo_attainment_tessera"]),
        "{s:?}"
    );
    // The bounds: charging the cold starts can only add residency; excusing 1% of the requests can only take
    // some back, never below zero.
    let bound = s["gpu_hours_lower_bound"];
    assert!(bound > 0.0, "{s:?}");
    assert!(s["gpu_hours_lower_bound_cold_starts"] >= bound, "{s:?}");
    let goal = s["gpu_hours_lower_bound_at_goal"];
    assert!(
        goal > 0.0 && goal <= s["gpu_hours_lower_bound_cold_starts"],
        "{s:?}"
    );
    // No strategy that reaches the goal beats the bound for it.
    for st in STRATEGIES {
        if s[&format!("slo_attainment_{st}")] >= 0.99 {
            assert!(
                s[&format!("gpu_hours_{st}")] >= goal,
                "{st} below the bound at goal: {s:?}"
            );
        }
    }
}

#[test]
fn same_seed_same_report_and_strategies_see_the_same_arrivals() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    let b = dir.path().join("b");
    let c = dir.path().join("c");
    let args = |out: &Path, seed: &str| {
        vec![
            "--duration".to_string(),
            "10m".into(),
            "--seed".into(),
            seed.into(),
            "--out".into(),
            out.display().to_string(),
        ]
    };
    for (out, seed) in [(&a, "7"), (&b, "7"), (&c, "8")] {
        let args = args(out, seed);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = simulate(&args, Duration::from_secs(120));
        assert!(
            o.status.success(),
            "stderr: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let ja = std::fs::read_to_string(a.join("report.json")).unwrap();
    let jb = std::fs::read_to_string(b.join("report.json")).unwrap();
    assert_eq!(ja, jb, "same seed must give the same report");
    let report: serde_json::Value = serde_json::from_str(&ja).unwrap();
    let strategies = report["strategies"].as_array().unwrap();
    assert_eq!(strategies.len(), STRATEGIES.len());
    let digests: Vec<&str> = strategies
        .iter()
        .map(|s| s["arrival_digest"].as_str().unwrap())
        .collect();
    assert!(digests.iter().all(|d| *d == digests[0]), "{digests:?}");
    let processed: Vec<u64> = strategies
        .iter()
        .map(|s| s["arrivals_processed"].as_u64().unwrap())
        .collect();
    let total: u64 = report["requests_per_model"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert!(
        processed.iter().all(|&p| p == total && p > 0),
        "{processed:?} vs {total}"
    );
    // Another seed draws other arrivals (the Functions-based models are Poisson within each minute).
    let jc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(c.join("report.json")).unwrap()).unwrap();
    assert_ne!(
        jc["strategies"][0]["arrival_digest"],
        report["strategies"][0]["arrival_digest"]
    );
    // The HTML page is self-contained: charts inline, nothing fetched.
    let html = std::fs::read_to_string(a.join("report.html")).unwrap();
    assert!(html.contains("<svg") && html.contains("GPUs held") && html.contains("replicas — tessera"));
    // Each autoscaled model's row says what held its count and what the next unit of capacity costs.
    assert!(
        html.contains("<th>held by (share of decisions)</th>") && html.contains("another replica: "),
        "the per-model tables name the constraint and the next unit"
    );
    // No external resources (the only URL is the SVG namespace, which is never fetched).
    for external in ["<script src", "<link", "https://", "@import"] {
        assert!(!html.contains(external), "report.html references {external}");
    }
}

/// One model, five requests ten seconds apart, one minute, at most one replica: each strategy holds exactly
/// one GPU for one minute = 1/60 GPU-hour, and serves all five requests within the SLO.
#[test]
fn hand_worked_tiny_scenario_from_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("five.csv"),
        "TIMESTAMP,ContextTokens,GeneratedTokens\n\
         2023-11-16 18:00:00.0000000,100,10\n\
         2023-11-16 18:00:10.0000000,100,10\n\
         2023-11-16 18:00:20.0000000,100,10\n\
         2023-11-16 18:00:30.0000000,100,10\n\
         2023-11-16 18:00:40.0000000,100,10\n\
         2023-11-16 18:10:00.0000000,100,10\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("tiny.yaml"),
        "name: tiny\nduration: 1m\ngpu: a100-80gb\nmodels:\n  - name: m\n    preset: llama-3.1-8b\n    \
         max_model_len: 16384\n    slo_ttft: 1s\n    max_replicas: 1\n    hpa_requests_per_second_per_replica: 5\n    \
         traffic: { trace: azure_llm, file: five.csv }\n",
    )
    .unwrap();
    let out = dir.path().join("out");
    let scenario = dir.path().join("tiny.yaml").display().to_string();
    let o = simulate(
        &[
            "--scenario",
            &scenario,
            "--quiet",
            "--out",
            &out.display().to_string(),
        ],
        Duration::from_secs(60),
    );
    assert!(
        o.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let s = summary(&String::from_utf8_lossy(&o.stdout));
    let hour = 60.0 / 3600.0;
    // Printed with three decimals. KubeAI's 10 s in-flight samples never catch these 10 ms requests, so it
    // goes to zero after its 30 s delay (45 s); every other strategy holds one GPU all minute.
    for st in STRATEGIES.iter().filter(|s| **s != "kubeai") {
        let v = s[&format!("gpu_hours_{st}")];
        assert!((v - hour).abs() < 0.0005 + 1e-12, "{st}={v}");
        assert_eq!(s[&format!("slo_attainment_{st}")], 1.0, "{st}");
    }
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    for st in report["strategies"].as_array().unwrap() {
        assert_eq!(st["requests"], 5);
        assert_eq!(st["completed"], 5);
        if st["strategy"] != "kubeai" {
            assert!((st["gpu_hours"].as_f64().unwrap() - hour).abs() < 1e-9, "{st}");
        }
    }
}

/// A peer whose declared share cannot hold a model's max_model_len cannot run it: that strategy is reported unable,
/// with vLLM's reason, and every other strategy finishes.
#[test]
fn one_strategys_failure_is_not_the_runs() {
    let (_dir, path) = scenario_file(
        "long",
        "name: long\nduration: 5m\ngpu: a100-80gb\nmodels:\n  - name: chat\n    preset: llama-3.1-8b\n    slo_ttft: 2s\n    \
         max_replicas: 2\n    hpa_requests_per_second_per_replica: 4\n    traffic: { trace: azure_llm, rate: 0.1 }\n  \
         - name: long-context\n    preset: llama-3.1-8b\n    max_model_len: 131072\n    slo_ttft: 2s\n    \
         max_replicas: 2\n    hpa_requests_per_second_per_replica: 4\n    hami: { cores: 0.5, memory_fraction: 0.3 }\n    \
         traffic: { trace: azure_llm, rate: 0.05 }\n",
    );
    let o = simulate(&[&path], Duration::from_secs(120));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        stdout.contains("hami-static      unable  cannot run long-context: The model's max seq len (131072) is larger than \
                         the maximum number of tokens that can be stored in KV cache"),
        "{stdout}"
    );
    let s = summary_of(
        &stdout,
        &["static", "hpa", "kubeai", "aibrix", "keda_http", "tessera"],
    );
    assert!(s["gpu_hours_tessera"] > 0.0, "{s:?}");
}

#[test]
fn bad_scenarios_fail_with_the_field_named() {
    let (_dir, path) = scenario_file(
        "bad",
        "name: bad\nduration: 1h\ngpu: a100-80gb\nmodels:\n  - name: m\n    preset: llama-3.1-8b\n    slo_ttft: 1s\n    \
         min_replicas: 0\n    max_replicas: 1\n    hpa_requests_per_second_per_replica: 5\n    \
         traffic: { trace: azure_llm, rate: -1 }\n",
    );
    let o = simulate(&["--scenario", &path], Duration::from_secs(30));
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("traffic.rate must be above 0"), "{err}");
    assert!(err.contains("scale_to_zero_after"), "{err}");
    let o = simulate(
        &["--scenario", "/nonexistent/scenario.yaml"],
        Duration::from_secs(30),
    );
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/scenario.yaml"));
}

/// The same scenario read from the shared folder's full Azure LLM trace gives the same answer as the bundled
/// copy (they are the same bytes); skipped where `../shared` is absent.
#[test]
fn shared_trace_matches_the_bundled_copy() {
    let Some(shared) = support::shared_file("traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let yaml = |file: &str| {
        format!(
            "name: s\nduration: 5m\ngpu: a100-80gb\nmodels:\n  - name: m\n    preset: qwen2-7b\n    max_model_len: 16384\n    \
             slo_ttft: 2s\n    max_replicas: 2\n    hpa_requests_per_second_per_replica: 5\n    \
             traffic: {{ trace: azure_llm, file: {file}, rate: 0.3 }}\n"
        )
    };
    std::fs::write(
        dir.path().join("shared.yaml"),
        yaml(&shared.display().to_string()),
    )
    .unwrap();
    std::fs::write(dir.path().join("builtin.yaml"), yaml("builtin")).unwrap();
    let run = |name: &str| {
        let p = dir.path().join(name).display().to_string();
        let o = simulate(&["--scenario", &p, "--quiet"], Duration::from_secs(120));
        assert!(
            o.status.success(),
            "stderr: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).to_string()
    };
    assert_eq!(run("shared.yaml"), run("builtin.yaml"));
}

/// `--seeds` runs the scenario once per seed: each seed's numbers in `sweep.json` are exactly what that seed gives
/// alone, the medians and counts follow from them, and a bad value is refused with the item named.
#[test]
fn a_seed_sweep_is_each_seed_run_alone_folded_together() {
    let dir = tempfile::tempdir().unwrap();
    let common = ["--duration", "10m", "--strategies", "static,tessera"];
    let out = dir.path().join("sweep");
    let mut args: Vec<&str> = common.to_vec();
    let out_s = out.display().to_string();
    args.extend(["--seeds", "7-8,11", "--out", &out_s, "--quiet"]);
    let o = simulate(&args, Duration::from_secs(240));
    assert!(
        o.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let line = String::from_utf8_lossy(&o.stdout);
    assert!(line.starts_with("seeds=3 "), "{line}");
    let sweep: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("sweep.json")).unwrap()).unwrap();
    let seeds = sweep["seeds"].as_array().unwrap();
    assert_eq!(
        seeds
            .iter()
            .map(|s| s["seed"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [7, 8, 11]
    );
    let mut tessera_hours = Vec::new();
    for s in seeds {
        let seed = s["seed"].as_u64().unwrap().to_string();
        let mut alone: Vec<&str> = common.to_vec();
        alone.extend(["--seed", &seed, "--quiet"]);
        let o = simulate(&alone, Duration::from_secs(120));
        assert!(
            o.status.success(),
            "stderr: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let one = summary_of(&String::from_utf8_lossy(&o.stdout), &["static", "tessera"]);
        for st in s["strategies"].as_array().unwrap() {
            let name = st["strategy"].as_str().unwrap().replace('-', "_");
            let hours = st["gpu_hours"].as_f64().unwrap();
            let attainment = st["slo_attainment"].as_f64().unwrap();
            assert_eq!(
                format!("{hours:.3}"),
                format!("{:.3}", one[&format!("gpu_hours_{name}")]),
                "seed {seed}"
            );
            assert_eq!(
                format!("{attainment:.4}"),
                format!("{:.4}", one[&format!("slo_attainment_{name}")]),
                "seed {seed}"
            );
            if name == "tessera" {
                tessera_hours.push(hours);
            }
        }
    }
    tessera_hours.sort_by(f64::total_cmp);
    let tessera = &sweep["strategies"][1];
    assert_eq!(tessera["strategy"], "tessera");
    assert_eq!(tessera["gpu_hours"]["median"].as_f64().unwrap(), tessera_hours[1]);
    assert_eq!(tessera["gpu_hours"]["min"].as_f64().unwrap(), tessera_hours[0]);
    assert_eq!(tessera["gpu_hours"]["max"].as_f64().unwrap(), tessera_hours[2]);
    // Bad values name what is wrong; one seed and a sweep at once is refused.
    for (bad, says) in [
        (vec!["--seeds", "9-3"], "runs backwards"),
        (vec!["--seeds", "1,x"], "\"x\" is not a seed"),
        (vec!["--seeds", "1-2", "--seed", "4"], "cannot be used with"),
    ] {
        let o = simulate(&bad, Duration::from_secs(30));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(says), "{bad:?}: {err}");
    }
}

/// Issue 57, "the table's Tessera row is what the chart's defaults do": a pool left at its defaults (the chart
/// renders only what its values set) runs the rules the simulator's defaults run: the empty-GPU grace (it was ten
/// minutes in the pool and one in the simulator, 18% of the default scenario's GPU-hours apart), consolidation, the
/// MPS oversubscription, the sleeper budget and lending. So a scenario that sets none of these shows what that pool
/// does, and the bundled ones that set the grace set the pool's.
#[test]
fn a_pool_left_at_its_defaults_runs_what_the_simulator_runs() {
    let cfg = tessera_pool::PoolsConfig::from_yaml(
        "pools:\n- name: p\n  gpuMemoryMiB: 81920\n  sharing: mps\n  maxGpus: 4\n",
    )
    .expect("a minimal pool");
    let pool = &cfg.pools[0];
    let sim = tessera_sim::simulate::scenario::StrategySettings::default();
    assert_eq!(
        pool.empty_gpu_grace_period, sim.gpu_release_grace,
        "the empty-GPU grace"
    );
    assert_eq!(pool.consolidation(), sim.consolidation(), "consolidation");
    assert_eq!(
        pool.compute_oversubscription(),
        sim.compute_oversubscription(),
        "MPS oversubscription"
    );
    assert_eq!(
        pool.max_sleepers_per_gpu, sim.max_sleepers_per_gpu,
        "sleepers per GPU"
    );
    assert_eq!(
        pool.sleep_residue_mib, sim.sleep_residue_mib,
        "a sleeper's residue"
    );
    assert_eq!(cfg.lend_sleepers, sim.lend_sleepers, "lending a sleeper's room");
    assert_eq!(
        pool.memory_headroom_mib, sim.gpu_headroom_mib,
        "the packer's headroom"
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for name in [
        "default",
        "platform-mix-quiet",
        "ceiling-bursty",
        "pinned-half-gpu",
    ] {
        let path = root.join(format!("scenarios/{name}.yaml"));
        let yaml = std::fs::read_to_string(&path).expect("a bundled scenario");
        let file = tessera_sim::simulate::scenario::ScenarioFile::parse(&yaml, &path.display().to_string())
            .expect("it parses");
        assert_eq!(
            file.strategies.gpu_release_grace, pool.empty_gpu_grace_period,
            "{name}: the grace"
        );
        assert_eq!(
            file.strategies.gpu_headroom_mib, pool.memory_headroom_mib,
            "{name}: the headroom"
        );
    }
}
