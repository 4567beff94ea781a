//! Throughput of the vLLM `/metrics` parser on real pages, against a naive reference parser in the same run.
//!
//! Run: `cargo bench -p tessera-core --bench parse`. Inputs: the real pages in `testdata/vllm/` (see its
//! SOURCES.md), the hand-built two-engine V1 page, and a large page built from the real KubeAI page with
//! 16 models × 4 engines (what one scrape of a big multi-model host could look like).
//!
//! Three parsers per input:
//! - `parse_text`: `tessera_core::metrics::parse_text`, the parser the sidecar uses;
//! - `snapshot`: `VllmSnapshot::from_text`, parsing plus building the typed per-engine snapshot;
//! - `naive_lines_split`: a straightforward `lines()` / `split` / `String` parser, the kind one writes first.
//!   It allocates per label and does not handle a `,` or `}` inside a quoted label value, so it does *less*
//!   than `parse_text`; it is here as the speed baseline.
//!
//! Each benchmark runs twice: timed by the wall clock (criterion's default; groups `<input>`) and by the
//! benchmark thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`; groups `<input>@cpu`). On a VM shared with other
//! builds the wall clock also counts the time the thread sat descheduled; CPU time does not, so it is the
//! steadier figure for "how much work is one parse".

use std::hint::black_box;

use std::time::Duration;

use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tessera_core::metrics::{VllmSnapshot, parse_text};

const DATADOG_043: &str = include_str!("../../testdata/vllm/v0-metrics-datadog-vllm-0.4.3-opt125m.txt");
const KUBEAI: &str = include_str!("../../testdata/vllm/v0-metrics-kubeai-llama31-8b-fp8.txt");
const MIXED: &str = include_str!("../../testdata/vllm/mixed-v0v1-metrics-datadog-edited-fixture.txt");
const V1_TWO_ENGINES: &str = include_str!("../../testdata/vllm/v1-two-engines-hand-built.txt");

/// The real KubeAI page with every vLLM series repeated for `models` models × `engines` engines, each series'
/// lines kept together inside its family as `prometheus_client` writes them.
fn large_page(models: usize, engines: usize) -> String {
    const MODEL: &str = "model_name=\"neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8\"";
    let mut out = String::with_capacity(KUBEAI.len() * models * engines);
    let mut block: Vec<&str> = Vec::new();
    let flush = |block: &mut Vec<&str>, out: &mut String| {
        for m in 0..models {
            for e in 0..engines {
                let labels =
                    format!("engine=\"{e}\",model_name=\"/mnt/models/tenant-{m}/Meta-Llama-3.1-8B-FP8\"");
                for line in block.iter() {
                    out.push_str(&line.replace(MODEL, &labels));
                    out.push('\n');
                }
            }
        }
        block.clear();
    };
    for line in KUBEAI.lines() {
        if line.contains(MODEL) {
            block.push(line);
            continue;
        }
        flush(&mut block, &mut out);
        out.push_str(line);
        out.push('\n');
    }
    flush(&mut block, &mut out);
    out
}

/// One sample as the naive parser keeps it.
#[allow(dead_code)]
struct NaiveSample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

fn naive_parse(page: &str) -> Vec<NaiveSample> {
    let mut out = Vec::new();
    for line in page.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (head, value) = match line.rsplit_once(' ') {
            Some(x) => x,
            None => continue,
        };
        let Ok(value) = value.parse::<f64>() else { continue };
        let (name, labels) = match head.split_once('{') {
            Some((n, rest)) => {
                let body = rest.trim_end_matches('}');
                let labels = body
                    .split(',')
                    .filter(|kv| !kv.is_empty())
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| {
                        (
                            k.trim().to_string(),
                            v.trim().trim_matches('"').replace("\\\"", "\""),
                        )
                    })
                    .collect();
                (n.to_string(), labels)
            }
            None => (head.to_string(), Vec::new()),
        };
        out.push(NaiveSample { name, labels, value });
    }
    out
}

/// Criterion measurement by the current thread's CPU time (values in nanoseconds, like `WallTime`).
struct ThreadCpuTime {
    wall: WallTime,
}

impl Measurement for ThreadCpuTime {
    type Intermediate = cpu_time::ThreadTime;
    type Value = Duration;

    fn start(&self) -> Self::Intermediate {
        cpu_time::ThreadTime::now()
    }
    fn end(&self, i: Self::Intermediate) -> Self::Value {
        i.elapsed()
    }
    fn add(&self, v1: &Self::Value, v2: &Self::Value) -> Self::Value {
        *v1 + *v2
    }
    fn zero(&self) -> Self::Value {
        Duration::ZERO
    }
    fn to_f64(&self, value: &Self::Value) -> f64 {
        value.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        // Same unit (ns) as wall time, so the same scaling and throughput formatting apply.
        self.wall.formatter()
    }
}

fn bench<M: Measurement>(c: &mut Criterion<M>, suffix: &str) {
    let large = large_page(16, 4);
    let inputs: [(&str, &str); 5] = [
        ("datadog_043", DATADOG_043),
        ("kubeai", KUBEAI),
        ("mixed_v0v1", MIXED),
        ("v1_two_engines", V1_TWO_ENGINES),
        ("large_16x4", &large),
    ];
    for (name, page) in inputs {
        // Same work, checked once so the benchmark cannot silently measure a failure.
        assert!(parse_text(page).errors.is_empty(), "{name} has line errors");
        assert!(VllmSnapshot::from_text(page).is_ok(), "{name} is not a vLLM page");
        let mut g = c.benchmark_group(format!("{name}{suffix}"));
        g.throughput(Throughput::Bytes(page.len() as u64));
        g.bench_function("parse_text", |b| b.iter(|| parse_text(black_box(page))));
        g.bench_function("naive_lines_split", |b| b.iter(|| naive_parse(black_box(page))));
        g.bench_function("snapshot", |b| {
            b.iter(|| VllmSnapshot::from_text(black_box(page)))
        });
        g.finish();
    }
}

fn wall(c: &mut Criterion) {
    bench(c, "");
}

fn cpu(c: &mut Criterion<ThreadCpuTime>) {
    bench(c, "@cpu");
}

fn config<M: Measurement>(m: M) -> Criterion<M> {
    Criterion::default()
        .with_measurement(m)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = wall_clock;
    config = config(WallTime);
    targets = wall
}
criterion_group! {
    name = cpu_time;
    config = config(ThreadCpuTime { wall: WallTime });
    targets = cpu
}
criterion_main!(wall_clock, cpu_time);
