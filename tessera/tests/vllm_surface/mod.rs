//! What a vLLM server looks like from outside, reduced to what must match between the real server and
//! `tessera vllm-sim`: for `/metrics`, each `vllm:` family's TYPE, HELP, label names and bucket bounds; for the
//! JSON answers, the set of key paths with their JSON types (`choices[].delta.content: string`). Values differ
//! between any two servers and are left out.
//!
//! Used by `emulator_vs_real.rs` (against the captured real pages in `testdata/vllm/real/`) and by
//! `real_vllm.rs` (against the live server).
#![allow(dead_code)] // each test crate uses a different part of it

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use tessera_core::metrics::{MetricType, parse_text};

/// One `vllm:` family as a scraper sees it, without values.
#[derive(Debug, Clone, PartialEq)]
pub struct FamilyShape {
    pub kind: &'static str,
    pub help: String,
    /// Every label name on any of the family's samples, `le` excepted.
    pub labels: BTreeSet<String>,
    /// The `le` bounds of the first series' buckets, in page order (histograms only).
    pub buckets: Vec<f64>,
}

fn kind_name(k: MetricType) -> &'static str {
    match k {
        MetricType::Counter => "counter",
        MetricType::Gauge => "gauge",
        MetricType::Histogram => "histogram",
        MetricType::Summary => "summary",
        MetricType::Untyped => "untyped",
    }
}

/// The shapes of every `vllm:` family on `page`, by family name. Panics on a malformed page.
pub fn metric_shapes(page: &str) -> BTreeMap<String, FamilyShape> {
    let parsed = parse_text(page);
    assert!(parsed.errors.is_empty(), "malformed page: {:?}", parsed.errors);
    let mut out = BTreeMap::new();
    for f in parsed.families.iter().filter(|f| f.name.starts_with("vllm:")) {
        let mut labels = BTreeSet::new();
        let mut buckets = Vec::new();
        let mut first_series: Option<Vec<(String, String)>> = None;
        for s in &f.samples {
            let ls: Vec<(String, String)> = s
                .labels()
                .map(|(k, v)| (k.to_string(), v.into_owned()))
                .filter(|(k, _)| k != "le")
                .collect();
            labels.extend(ls.iter().map(|(k, _)| k.clone()));
            if s.name.ends_with("_bucket") {
                let series = first_series.get_or_insert_with(|| ls.clone());
                if *series == ls
                    && let Some(le) = s.label("le")
                {
                    buckets.push(parse_le(&le));
                }
            }
        }
        out.insert(
            f.name.to_string(),
            FamilyShape {
                kind: kind_name(f.kind),
                help: f.help_text().map(|h| h.into_owned()).unwrap_or_default(),
                labels,
                buckets,
            },
        );
    }
    out
}

fn parse_le(le: &str) -> f64 {
    match le {
        "+Inf" => f64::INFINITY,
        v => v.parse().unwrap_or(f64::NAN),
    }
}

/// The differences between two pages' `vllm:` families, one line each (empty when they agree).
/// `expected_only_real` / `expected_only_sim`: families known (and documented) to exist on one side only.
pub fn diff_metrics(
    real: &str,
    sim: &str,
    expected_only_real: &[&str],
    expected_only_sim: &[&str],
) -> Vec<String> {
    let r = metric_shapes(real);
    let s = metric_shapes(sim);
    let mut out = Vec::new();
    for name in r.keys().filter(|n| !s.contains_key(*n)) {
        if !expected_only_real.contains(&name.as_str()) {
            out.push(format!("{name}: only on the real page"));
        }
    }
    for name in s.keys().filter(|n| !r.contains_key(*n)) {
        if !expected_only_sim.contains(&name.as_str()) {
            out.push(format!("{name}: only on the emulator's page"));
        }
    }
    for name in expected_only_real {
        if s.contains_key(*name) {
            out.push(format!("{name}: listed as real-only but the emulator has it now"));
        }
    }
    for name in expected_only_sim {
        if r.contains_key(*name) {
            out.push(format!("{name}: listed as emulator-only but the real page has it"));
        }
    }
    for (name, rf) in &r {
        let Some(sf) = s.get(name) else { continue };
        if rf.kind != sf.kind {
            out.push(format!("{name}: TYPE real {} vs emulator {}", rf.kind, sf.kind));
        }
        if rf.help != sf.help {
            out.push(format!("{name}: HELP real {:?} vs emulator {:?}", rf.help, sf.help));
        }
        if rf.labels != sf.labels {
            let only_r: Vec<_> = rf.labels.difference(&sf.labels).collect();
            let only_s: Vec<_> = sf.labels.difference(&rf.labels).collect();
            out.push(format!(
                "{name}: labels only real {only_r:?}, only emulator {only_s:?}"
            ));
        }
        if rf.buckets != sf.buckets {
            out.push(format!(
                "{name}: buckets real {:?} vs emulator {:?}",
                rf.buckets, sf.buckets
            ));
        }
    }
    out
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Every key path in `v` with its JSON type: `{"a": [{"b": 1}]}` → `a: array`, `a[].b: number`.
pub fn json_shape(v: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    walk(v, "", &mut out);
    out
}

fn walk(v: &Value, path: &str, out: &mut BTreeSet<String>) {
    if !path.is_empty() {
        out.insert(format!("{path}: {}", type_name(v)));
    }
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                walk(child, &p, out);
            }
        }
        Value::Array(items) => {
            for child in items {
                walk(child, &format!("{path}[]"), out);
            }
        }
        _ => {}
    }
}

/// The differences between two JSON documents' shapes, minus `ignore` (paths known to differ, documented).
pub fn diff_json(what: &str, real: &Value, sim: &Value, ignore: &[&str]) -> Vec<String> {
    let r = json_shape(real);
    let s = json_shape(sim);
    let keep = |p: &&String| !ignore.iter().any(|i| p.starts_with(i));
    let mut out: Vec<String> = r
        .difference(&s)
        .filter(keep)
        .map(|p| format!("{what}: only real has `{p}`"))
        .collect();
    out.extend(
        s.difference(&r)
            .filter(keep)
            .map(|p| format!("{what}: only the emulator has `{p}`")),
    );
    out
}

/// The JSON documents of an SSE body (`data: {...}` lines), and whether it ended with `data: [DONE]`.
pub fn sse_events(lines: &[String]) -> (Vec<Value>, bool) {
    let mut events = Vec::new();
    let mut done = false;
    for l in lines {
        let Some(data) = l.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            done = true;
        } else {
            events.push(serde_json::from_str(data).unwrap_or_else(|e| panic!("bad SSE JSON {data}: {e}")));
        }
    }
    (events, done)
}
