//! What a vLLM server looks like from outside, reduced to what must match between the real server and
//! `tessera vllm-sim`: for `/metrics`, each `vllm:` family's TYPE, HELP, label names and bucket bounds; for the
//! JSON answers, the set of key paths with their JSON types (`choices[].delta.content: string`). Values differ
//! between any two servers and are left out.
//!
//! Used by `emulator_vs_real.rs` (against the captured real pages in `testdata/vllm/real/`) and by
//! `real_vllm.rs` (against the live server).
#![allow(dead_code)] // each test crate uses a different part of it

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};
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
            out.push(format!(
                "{name}: listed as emulator-only but the real page has it"
            ));
        }
    }
    for (name, rf) in &r {
        let Some(sf) = s.get(name) else { continue };
        if rf.kind != sf.kind {
            out.push(format!("{name}: TYPE real {} vs emulator {}", rf.kind, sf.kind));
        }
        if rf.help != sf.help {
            out.push(format!(
                "{name}: HELP real {:?} vs emulator {:?}",
                rf.help, sf.help
            ));
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

/// JSON paths the emulator leaves out on purpose, by answer. Every one is `null` on the real server unless a
/// feature the emulator does not have is used (logprobs, tool calls, reasoning, audio, KV transfer, request
/// metrics, prompt echo), so a client that reads them sees the same thing as from a missing key.
pub const NULL_ONLY_FIELDS: &[&str] = &[
    "choices[].message.refusal",
    "choices[].message.annotations",
    "choices[].message.audio",
    "choices[].message.function_call",
    "choices[].message.reasoning",
    "choices[].token_ids",
    "choices[].routed_experts",
    "choices[].prompt_logprobs",
    "choices[].prompt_token_ids",
    "service_tier",
    "system_fingerprint",
    "prompt_logprobs",
    "prompt_token_ids",
    "prompt_text",
    "kv_transfer_params",
    "ec_transfer_params",
    "metrics",
    "usage.prompt_tokens_details",
    "usage.completion_tokens_details",
];

/// How a stream's tokens may be cut into chunks by the server under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunking {
    /// One chunk per token, as the recording has them: the emulator.
    AsRecorded,
    /// A real vLLM sends the tokens produced since the client last read in one chunk (V1's output collector merges
    /// the outputs a request's consumer has not taken yet): on a loaded machine a short stream's tokens may all
    /// arrive with its first or finishing chunk, leaving no content chunk between them. Content chunks are then
    /// compared only when the stream has some.
    MayCoalesce,
}

/// Replays every request recorded in `api.json` against `base` and compares status, content type and JSON shape.
/// `real` is `testdata/vllm/real/api.json`; `emulator_vs_real.rs` replays it against the emulator and
/// `real_vllm.rs` against the live server.
pub async fn api_diff(base: &str, real: &Value, chunking: Chunking) -> Vec<String> {
    let http = reqwest::Client::new();
    let mut out = Vec::new();

    // GET endpoints.
    let health = http.get(format!("{base}/health")).send().await.unwrap();
    let (status, body) = (health.status().as_u16(), health.text().await.unwrap());
    if status != real["/health"]["status"] || body != real["/health"]["body"] {
        out.push(format!(
            "/health: {status} {body:?} vs real {} {}",
            real["/health"]["status"], real["/health"]["body"]
        ));
    }
    let models: Value = crate::support::get_json(&http, &format!("{base}/v1/models")).await;
    let real_models: Value = serde_json::from_str(real["/v1/models"]["body"].as_str().unwrap()).unwrap();
    out.extend(diff_json("/v1/models", &real_models, &models, &[]));
    let version = http.get(format!("{base}/version")).send().await.unwrap();
    let vbody: Value = version.json().await.unwrap_or(Value::Null);
    let real_version: Value = serde_json::from_str(real["/version"]["body"].as_str().unwrap()).unwrap();
    out.extend(diff_json("/version", &real_version, &vbody, &[]));

    // Every recorded POST, replayed.
    let obj = real.as_object().unwrap();
    for (name, entry) in obj.iter().filter(|(_, e)| e.get("request").is_some()) {
        let path = entry["request"]["path"].as_str().unwrap();
        let mut body = entry["request"]["body"].clone();
        if let Some(p) = body["prompt"].as_str() {
            // Recorded abbreviated: "[11] * 1100 (…)" stands for 1,100 copies of token 11.
            let (tok, rest) = p.trim_start_matches('[').split_once("] * ").unwrap();
            let n: usize = rest.split(' ').next().unwrap().parse().unwrap();
            body["prompt"] = json!(vec![tok.parse::<u64>().unwrap(); n]);
        }
        let r = crate::support::post_json(&http, &format!("{base}{path}"), &body).await;
        let status = r.status().as_u16();
        let ctype = r
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let text = r.text().await.unwrap();
        if status != entry["status"] {
            out.push(format!("{name}: status {status} vs real {}", entry["status"]));
            continue;
        }
        let real_ctype = entry["content_type"].as_str().unwrap_or("");
        if mime(&ctype) != mime(real_ctype) {
            out.push(format!("{name}: content-type {ctype:?} vs real {real_ctype:?}"));
        }
        if let Some(sse) = entry.get("sse") {
            let real_lines: Vec<String> = sse
                .as_array()
                .unwrap()
                .iter()
                .map(|l| l.as_str().unwrap().to_string())
                .collect();
            let sim_lines: Vec<String> = text
                .lines()
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect();
            out.extend(diff_stream(name, &real_lines, &sim_lines, chunking));
        } else {
            let real_body: Value = serde_json::from_str(entry["body"].as_str().unwrap()).unwrap();
            let sim_body: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{name}: the answer is not JSON ({e}): {text}"));
            out.extend(diff_json(name, &real_body, &sim_body, NULL_ONLY_FIELDS));
            if name.starts_with("error") {
                for k in ["type", "code", "param"] {
                    if real_body["error"][k] != sim_body["error"][k] {
                        out.push(format!(
                            "{name}: error.{k} {} vs real {}",
                            sim_body["error"][k], real_body["error"][k]
                        ));
                    }
                }
            }
        }
    }
    // The raw bad-JSON body, not replayable from a JSON request.
    let r = http
        .post(format!("{base}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let sim_body: Value = r.json().await.unwrap_or(Value::Null);
    let entry = &real["error bad json"];
    let real_body: Value = serde_json::from_str(entry["body"].as_str().unwrap()).unwrap();
    if status != entry["status"] {
        out.push(format!(
            "error bad json: status {status} vs real {}",
            entry["status"]
        ));
    }
    out.extend(diff_json("error bad json", &real_body, &sim_body, &[]));
    out
}

fn mime(ct: &str) -> String {
    ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase()
}

/// A stream's shape: the first chunk (the role for chat), the content chunks, the chunk that carries
/// `finish_reason`, the usage chunk (when asked for) and `[DONE]` at the end, each compared by JSON shape.
fn diff_stream(name: &str, real: &[String], sim: &[String], chunking: Chunking) -> Vec<String> {
    let (r, r_done) = sse_events(real);
    let (s, s_done) = sse_events(sim);
    let mut out = Vec::new();
    if r_done != s_done {
        out.push(format!("{name}: [DONE] real {r_done} vs emulator {s_done}"));
    }
    let role = |evs: &[Value]| evs.first().map(|e| e["choices"][0]["delta"]["role"].clone());
    if role(&r) != role(&s) {
        out.push(format!(
            "{name}: first chunk's role {:?} vs real {:?}",
            role(&s),
            role(&r)
        ));
    }
    let usage_last = |evs: &[Value]| {
        evs.last()
            .is_some_and(|e| e["choices"] == json!([]) && e.get("usage").is_some())
    };
    if usage_last(&r) != usage_last(&s) {
        out.push(format!(
            "{name}: a final usage chunk with no choices: real {} vs emulator {}",
            usage_last(&r),
            usage_last(&s)
        ));
    }
    // Compare the kinds of chunk one by one: first, every middle chunk merged, the finishing one, the usage one.
    let kinds = |evs: &[Value]| {
        let mut first = None;
        let mut middle = std::collections::BTreeSet::new();
        let mut finish = None;
        let mut usage = None;
        for (i, e) in evs.iter().enumerate() {
            let shape = json_shape(e);
            if e.get("usage").is_some() && e["choices"] == json!([]) {
                usage = Some(e.clone());
            } else if !e["choices"][0]["finish_reason"].is_null() {
                finish = Some(e.clone());
            } else if i == 0 {
                first = Some(e.clone());
            } else {
                middle.extend(shape);
            }
        }
        (first, middle, finish, usage)
    };
    let (rf, rm, rfin, ru) = kinds(&r);
    let (sf, sm, sfin, su) = kinds(&s);
    let pair = |what: &str, a: &Option<Value>, b: &Option<Value>, out: &mut Vec<String>| match (a, b) {
        (Some(a), Some(b)) => out.extend(diff_json(&format!("{name} {what}"), a, b, NULL_ONLY_FIELDS)),
        (None, None) => {}
        _ => out.push(format!(
            "{name}: {what} chunk present real {} vs emulator {}",
            a.is_some(),
            b.is_some()
        )),
    };
    // Coalesced into the finishing chunk, a short stream has no first chunk of its own (compared as finishing).
    let first_coalesced = chunking == Chunking::MayCoalesce && rfin.is_some() && sfin.is_some();
    if !(first_coalesced && (rf.is_none() || sf.is_none())) {
        pair("first chunk", &rf, &sf, &mut out);
    }
    pair("finishing chunk", &rfin, &sfin, &mut out);
    pair("usage chunk", &ru, &su, &mut out);
    if chunking == Chunking::MayCoalesce && sm.is_empty() {
        return out;
    }
    let ignore = |p: &&String| !NULL_ONLY_FIELDS.iter().any(|i| p.starts_with(i));
    for p in rm.difference(&sm).filter(ignore) {
        out.push(format!("{name} content chunks: only real has `{p}`"));
    }
    for p in sm.difference(&rm).filter(ignore) {
        out.push(format!("{name} content chunks: only the emulator has `{p}`"));
    }
    out
}

/// A real server may deliver a short stream's tokens with its first or finishing chunk (`Chunking::MayCoalesce`),
/// as a live vLLM 0.32 did on a loaded 2-core machine: no content chunk between them is then no difference, nor
/// (seen once in a full run) a stream whose every token came with its finishing chunk. From the emulator, which
/// sends a chunk per token, it is one.
#[test]
fn a_stream_without_content_chunks_differs_only_where_chunks_are_as_recorded() {
    let real: Value = serde_json::from_str(include_str!("../../../testdata/vllm/real/api.json")).unwrap();
    let name = "completion stream usage";
    let lines: Vec<String> = real[name]["sse"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap().to_string())
        .collect();
    // First, one content chunk, finishing, usage, [DONE]: the content chunk's tokens arrive with another chunk.
    assert_eq!(lines.len(), 5, "{lines:?}");
    let coalesced: Vec<String> = [0, 2, 3, 4].iter().map(|&i| lines[i].clone()).collect();
    assert_eq!(
        diff_stream(name, &lines, &lines, Chunking::AsRecorded),
        Vec::<String>::new()
    );
    assert_eq!(
        diff_stream(name, &lines, &coalesced, Chunking::MayCoalesce),
        Vec::<String>::new()
    );
    let all_in_the_last: Vec<String> = [2, 3, 4].iter().map(|&i| lines[i].clone()).collect();
    assert_eq!(
        diff_stream(name, &lines, &all_in_the_last, Chunking::MayCoalesce),
        Vec::<String>::new()
    );
    assert!(
        diff_stream(name, &lines, &all_in_the_last, Chunking::AsRecorded)
            .iter()
            .any(|d| d.contains("first chunk chunk present")),
        "as recorded, a missing first chunk is a difference"
    );
    let as_recorded = diff_stream(name, &lines, &coalesced, Chunking::AsRecorded);
    assert!(
        as_recorded
            .iter()
            .any(|d| d.contains("content chunks: only real has")),
        "{as_recorded:?}"
    );
}
