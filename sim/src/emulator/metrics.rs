//! The emulator's `/metrics` page: vLLM's own metric names, HELP texts, types, label sets and bucket bounds.
//!
//! Names, help texts and buckets follow `vllm/v1/metrics/loggers.py` (V1, the default) and the V0 pages in
//! `../shared/fixtures/vllm/` (`--metrics-version v0`). The page is written in the Prometheus text format the way
//! `prometheus_client` writes it: labels sorted by name, floats with a decimal point, `+Inf` for the last
//! bucket, and on V1 a separate `*_created` gauge family after each counter and histogram.

use std::fmt::Write as _;

use crate::model::{EngineStats, Histogram, PARAMS_N_BUCKETS};

/// Which generation of vLLM's metric names to serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MetricsVersion {
    /// V1 engine names (`vllm:kv_cache_usage_perc`, `engine` label, `*_created` series).
    V1,
    /// V0 engine names (`vllm:gpu_cache_usage_perc`, `vllm:time_per_output_token_seconds`, no `engine` label).
    V0,
}

/// Sleep state, as `vllm:engine_sleep_state` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SleepState {
    /// Serving.
    Awake,
    /// `POST /sleep?level=1`: weights offloaded to CPU, KV cache discarded.
    Level1,
    /// `POST /sleep?level=2`: weights and KV cache discarded.
    Level2,
}

/// What the page shows besides the engine's statistics.
#[derive(Debug, Clone)]
pub struct PageInfo {
    /// `model_name` label value (the first served model name).
    pub model_name: String,
    /// Labels of `vllm:cache_config_info`, in the order they are written (sorted on output).
    pub cache_config: Vec<(String, String)>,
    /// Unix time the metrics were created (the `*_created` values).
    pub created_unix: f64,
    /// Prompt and generation throughput over the last interval, tokens/s (V0's `avg_*_throughput` gauges).
    pub avg_prompt_throughput: f64,
    /// See `avg_prompt_throughput`.
    pub avg_generation_throughput: f64,
    /// Sleep state.
    pub sleep: SleepState,
}

/// Formats a float the way Python's `prometheus_client` does (`1.0`, `0.25`, `+Inf`).
pub fn fmt_f64(v: f64) -> String {
    if v.is_infinite() {
        return if v > 0.0 { "+Inf".into() } else { "-Inf".into() };
    }
    if v.is_nan() {
        return "NaN".into();
    }
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

fn escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Writes metric families; keeps the common labels (`model_name`, and `engine` on V1).
struct Page {
    out: String,
    base: Vec<(&'static str, String)>,
    created: Option<f64>,
}

impl Page {
    fn labels(&self, extra: &[(&str, String)]) -> String {
        let mut all: Vec<(&str, &str)> = self.base.iter().map(|(k, v)| (*k, v.as_str())).collect();
        all.extend(extra.iter().map(|(k, v)| (*k, v.as_str())));
        all.sort_by(|a, b| a.0.cmp(b.0));
        let body: Vec<String> = all
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
            .collect();
        format!("{{{}}}", body.join(","))
    }

    fn head(&mut self, name: &str, help: &str, kind: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn gauge(&mut self, name: &str, help: &str, v: f64) {
        self.head(name, help, "gauge");
        let l = self.labels(&[]);
        let _ = writeln!(self.out, "{name}{l} {}", fmt_f64(v));
    }

    fn created(&mut self, name: &str, help: &str, series: &[Vec<(&str, String)>]) {
        let Some(t) = self.created else { return };
        let cname = format!("{name}_created");
        self.head(&cname, help, "gauge");
        for extra in series {
            let l = self.labels(extra);
            let _ = writeln!(self.out, "{cname}{l} {}", fmt_f64(t));
        }
    }

    /// A counter; `base` is the name without `_total` (V1 writes `_created` with the base name).
    fn counter(&mut self, base: &str, help: &str, series: &[(Vec<(&str, String)>, f64)]) {
        let name = format!("{base}_total");
        self.head(&name, help, "counter");
        for (extra, v) in series {
            let l = self.labels(extra);
            let _ = writeln!(self.out, "{name}{l} {}", fmt_f64(*v));
        }
        let extras: Vec<Vec<(&str, String)>> = series.iter().map(|(e, _)| e.clone()).collect();
        self.created(base, help, &extras);
    }

    /// A counter without the `engine` label (vLLM's API-server-side counters, e.g. admission rejections).
    fn counter_without_engine(&mut self, base: &str, help: &str, series: &[(Vec<(&str, String)>, f64)]) {
        let saved = self.base.clone();
        self.base.retain(|(k, _)| *k != "engine");
        self.counter(base, help, series);
        self.base = saved;
    }

    /// The three counters both page versions write alike, in this order.
    fn preemption_and_token_counters(&mut self, s: &EngineStats) {
        self.counter(
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            &[(vec![], s.num_preemptions as f64)],
        );
        self.counter(
            "vllm:prompt_tokens",
            "Number of prefill tokens processed.",
            &[(vec![], s.prompt_tokens as f64)],
        );
        self.counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            &[(vec![], s.generation_tokens as f64)],
        );
    }

    fn histogram(&mut self, name: &str, help: &str, h: &Histogram) {
        self.head(name, help, "histogram");
        for (le, c) in h.cumulative() {
            let l = self.labels(&[("le", fmt_f64(le))]);
            let _ = writeln!(self.out, "{name}_bucket{l} {}", fmt_f64(c as f64));
        }
        let l = self.labels(&[]);
        let _ = writeln!(self.out, "{name}_count{l} {}", fmt_f64(h.count as f64));
        let _ = writeln!(self.out, "{name}_sum{l} {}", fmt_f64(h.sum));
        self.created(name, help, &[vec![]]);
    }

    fn info(&mut self, name: &str, help: &str, labels: &[(String, String)]) {
        self.head(name, help, "gauge");
        let mut all: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        all.sort_by(|a, b| a.0.cmp(b.0));
        let body: Vec<String> = all
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
            .collect();
        let _ = writeln!(self.out, "{name}{{{}}} 1.0", body.join(","));
    }
}

/// Renders the whole page.
pub fn render(stats: &EngineStats, info: &PageInfo, version: MetricsVersion) -> String {
    match version {
        MetricsVersion::V1 => render_v1(stats, info),
        MetricsVersion::V0 => render_v0(stats, info),
    }
}

/// `vllm:request_params_n`: the emulator serves n = 1 only, so every finished request observes 1.
fn params_n(stats: &EngineStats) -> Histogram {
    let mut h = Histogram::new(PARAMS_N_BUCKETS);
    let finished = stats.request_prompt_tokens.count;
    h.counts[0] = finished;
    h.count = finished;
    h.sum = finished as f64;
    h
}

fn render_v1(s: &EngineStats, info: &PageInfo) -> String {
    let mut p = Page {
        out: String::with_capacity(32 * 1024),
        base: vec![("model_name", info.model_name.clone()), ("engine", "0".into())],
        created: Some(info.created_unix),
    };
    v1_mfu_counters(&mut p);
    v1_scheduler_state(&mut p, s, info);
    v1_cache_counters(&mut p, s);
    v1_token_counters(&mut p, s);
    v1_request_counters(&mut p, s);
    v1_histograms(&mut p, s);
    let mut cc = info.cache_config.clone();
    cc.push(("engine".into(), "0".into()));
    p.info(
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        &cc,
    );
    p.out
}

fn v1_mfu_counters(p: &mut Page) {
    // Model-FLOPs-utilization counters: vLLM 0.32 always publishes them and leaves them at 0 unless its MFU
    // metrics are switched on, as a default real server shows.
    for (base, help) in [
        (
            "vllm:estimated_flops_per_gpu",
            "Estimated number of floating point operations per GPU (for Model Flops Utilization calculations).",
        ),
        (
            "vllm:estimated_read_bytes_per_gpu",
            "Estimated number of bytes read from memory per GPU (for Model Flops Utilization calculations).",
        ),
        (
            "vllm:estimated_write_bytes_per_gpu",
            "Estimated number of bytes written to memory per GPU (for Model Flops Utilization calculations).",
        ),
    ] {
        p.counter(base, help, &[(vec![], 0.0)]);
    }
}

/// The scheduler's queues, the engine's sleep state and the KV cache's fill.
fn v1_scheduler_state(p: &mut Page, s: &EngineStats, info: &PageInfo) {
    p.gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        s.running as f64,
    );
    p.gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        s.waiting as f64,
    );
    p.head(
        "vllm:num_requests_waiting_by_reason",
        "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; \
         'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). Sum of all \
         reasons equals vllm:num_requests_waiting.",
        "gauge",
    );
    // Everything the model queues waits for capacity (no LoRA, no KV transfer).
    for (reason, v) in [("capacity", s.waiting as f64), ("deferred", 0.0)] {
        let l = p.labels(&[("reason", reason.into())]);
        let _ = writeln!(p.out, "vllm:num_requests_waiting_by_reason{l} {}", fmt_f64(v));
    }
    p.head(
        "vllm:engine_sleep_state",
        "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; \
         weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
        "gauge",
    );
    for (state, on) in [
        ("awake", info.sleep == SleepState::Awake),
        ("weights_offloaded", info.sleep == SleepState::Level1),
        ("discard_all", info.sleep == SleepState::Level2),
    ] {
        let l = p.labels(&[("sleep_state", state.into())]);
        let _ = writeln!(
            p.out,
            "vllm:engine_sleep_state{l} {}",
            if on { "1.0" } else { "0.0" }
        );
    }
    p.gauge(
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        s.kv_usage,
    );
}

fn v1_cache_counters(p: &mut Page, s: &EngineStats) {
    p.counter(
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        &[(vec![], s.prefix_cache_queries as f64)],
    );
    p.counter(
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        &[(vec![], s.prefix_cache_hits as f64)],
    );
    // No KV connector and no multi-modal inputs: these stay at 0, as on a text-only vLLM without one.
    p.counter(
        "vllm:external_prefix_cache_queries",
        "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of \
         queried tokens.",
        &[(vec![], 0.0)],
    );
    p.counter(
        "vllm:external_prefix_cache_hits",
        "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of \
         cached tokens.",
        &[(vec![], 0.0)],
    );
    p.counter(
        "vllm:mm_cache_queries",
        "Multi-modal cache queries, in terms of number of queried items.",
        &[(vec![], 0.0)],
    );
    p.counter(
        "vllm:mm_cache_hits",
        "Multi-modal cache hits, in terms of number of cached items.",
        &[(vec![], 0.0)],
    );
}

fn v1_token_counters(p: &mut Page, s: &EngineStats) {
    p.counter(
        "vllm:num_preemptions",
        "Cumulative number of preemption from the engine.",
        &[(vec![], s.num_preemptions as f64)],
    );
    p.counter(
        "vllm:prompt_tokens",
        "Number of prefill tokens processed.",
        &[(vec![], s.prompt_tokens as f64)],
    );
    let cached = s.prefix_cache_hits as f64;
    p.counter(
        "vllm:prompt_tokens_by_source",
        "Number of prompt tokens by source.",
        &[
            (
                vec![("source", "local_compute".into())],
                s.prompt_tokens as f64 - cached,
            ),
            (vec![("source", "local_cache_hit".into())], cached),
            (vec![("source", "external_kv_transfer".into())], 0.0),
        ],
    );
    p.counter(
        "vllm:prompt_tokens_cached",
        "Number of cached prompt tokens (local + external).",
        &[(vec![], cached)],
    );
    p.counter(
        "vllm:prompt_tokens_cached_by_source",
        "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded to \
         DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at admission; \
         sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
        &[
            (vec![("source", "device".into())], cached),
            (vec![("source", "host".into())], 0.0),
            (vec![("source", "p2p".into())], 0.0),
            (vec![("source", "disk".into())], 0.0),
            (vec![("source", "external_unspecified".into())], 0.0),
        ],
    );
    p.counter(
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        &[(vec![], s.generation_tokens as f64)],
    );
}

fn v1_request_counters(p: &mut Page, s: &EngineStats) {
    p.counter(
        "vllm:request_success",
        "Count of successfully processed requests.",
        &[
            (vec![("finished_reason", "stop".into())], s.finished_stop as f64),
            (
                vec![("finished_reason", "length".into())],
                s.finished_length as f64,
            ),
            (vec![("finished_reason", "abort".into())], s.finished_abort as f64),
            // The model never fails a request or stops one for repeating itself.
            (vec![("finished_reason", "error".into())], 0.0),
            (vec![("finished_reason", "repetition".into())], 0.0),
        ],
    );
    // The emulator has no queue limit (vLLM's --max-num-queued-*), so nothing is rejected at admission.
    p.counter_without_engine(
        "vllm:admission_rejections",
        "Number of admission attempts rejected by a queue limit, by reason.",
        &[
            (vec![("reason", "max_num_queued_reqs".into())], 0.0),
            (vec![("reason", "max_num_queued_tokens".into())], 0.0),
        ],
    );
}

fn v1_histograms(p: &mut Page, s: &EngineStats) {
    p.histogram(
        "vllm:request_prompt_tokens",
        "Number of prefill tokens processed.",
        &s.request_prompt_tokens,
    );
    p.histogram(
        "vllm:request_generation_tokens",
        "Number of generation tokens processed.",
        &s.request_generation_tokens,
    );
    p.histogram(
        "vllm:iteration_tokens_total",
        "Histogram of number of tokens per engine_step.",
        &s.iteration_tokens,
    );
    p.histogram(
        "vllm:request_max_num_generation_tokens",
        "Histogram of maximum number of requested generation tokens.",
        &s.request_max_tokens,
    );
    p.histogram(
        "vllm:request_params_n",
        "Histogram of the n request parameter.",
        &params_n(s),
    );
    p.histogram(
        "vllm:request_params_max_tokens",
        "Histogram of the max_tokens request parameter.",
        &s.request_max_tokens,
    );
    p.histogram(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        &s.ttft,
    );
    p.histogram(
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        &s.itl,
    );
    p.histogram(
        "vllm:request_time_per_output_token_seconds",
        "Histogram of time_per_output_token_seconds per request.",
        &s.tpot,
    );
    p.histogram(
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        &s.e2e,
    );
    p.histogram(
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        &s.queue_time,
    );
    p.histogram(
        "vllm:request_inference_time_seconds",
        "Histogram of time spent in RUNNING phase for request.",
        &s.inference_time,
    );
    p.histogram(
        "vllm:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
        &s.prefill_time,
    );
    p.histogram(
        "vllm:request_decode_time_seconds",
        "Histogram of time spent in DECODE phase for request.",
        &s.decode_time,
    );
    p.histogram(
        "vllm:request_num_preemptions",
        "Histogram of the number of times a request was preempted.",
        &s.request_num_preemptions,
    );
    p.histogram(
        "vllm:request_prefill_kv_computed_tokens",
        "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
        &s.request_prefill_kv_computed_tokens,
    );
}

fn render_v0(s: &EngineStats, info: &PageInfo) -> String {
    let mut p = Page {
        out: String::with_capacity(16 * 1024),
        base: vec![("model_name", info.model_name.clone())],
        created: None,
    };
    p.info(
        "vllm:cache_config_info",
        "information of cache_config",
        &info.cache_config,
    );
    p.gauge(
        "vllm:num_requests_running",
        "Number of requests currently running on GPU.",
        s.running as f64,
    );
    p.gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        s.waiting as f64,
    );
    p.gauge(
        "vllm:num_requests_swapped",
        "Number of requests swapped to CPU.",
        0.0,
    );
    p.gauge(
        "vllm:gpu_cache_usage_perc",
        "GPU KV-cache usage. 1 means 100 percent usage.",
        s.kv_usage,
    );
    p.gauge(
        "vllm:cpu_cache_usage_perc",
        "CPU KV-cache usage. 1 means 100 percent usage.",
        0.0,
    );
    p.preemption_and_token_counters(s);
    p.histogram(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        &s.ttft,
    );
    p.histogram(
        "vllm:time_per_output_token_seconds",
        "Histogram of time per output token in seconds.",
        &s.itl,
    );
    p.histogram(
        "vllm:e2e_request_latency_seconds",
        "Histogram of end to end request latency in seconds.",
        &s.e2e,
    );
    p.histogram(
        "vllm:request_prompt_tokens",
        "Number of prefill tokens processed.",
        &s.request_prompt_tokens,
    );
    p.histogram(
        "vllm:request_generation_tokens",
        "Number of generation tokens processed.",
        &s.request_generation_tokens,
    );
    p.histogram(
        "vllm:request_params_n",
        "Histogram of the n request parameter.",
        &params_n(s),
    );
    // V0 only counted finished requests by reason; aborts were not in this counter.
    p.counter(
        "vllm:request_success",
        "Count of successfully processed requests.",
        &[
            (vec![("finished_reason", "stop".into())], s.finished_stop as f64),
            (
                vec![("finished_reason", "length".into())],
                s.finished_length as f64,
            ),
        ],
    );
    p.gauge(
        "vllm:avg_prompt_throughput_toks_per_s",
        "Average prefill throughput in tokens/s.",
        info.avg_prompt_throughput,
    );
    p.gauge(
        "vllm:avg_generation_throughput_toks_per_s",
        "Average generation throughput in tokens/s.",
        info.avg_generation_throughput,
    );
    p.out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::model::{Engine, EngineConfig, GpuSpec, MemorySetting, ModelSpec, Request};
    use proptest::prelude::*;
    use tessera_core::metrics::{VllmSnapshot, parse_text};

    fn info(model_name: &str) -> PageInfo {
        PageInfo {
            model_name: model_name.into(),
            cache_config: vec![
                ("block_size".into(), "16".into()),
                ("num_gpu_blocks".into(), "123".into()),
            ],
            created_unix: 1.7e9,
            avg_prompt_throughput: 1.5,
            avg_generation_throughput: 2.5,
            sleep: SleepState::Awake,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        /// Whatever the engine went through and whatever the model is called, both pages parse without a single
        /// malformed line and read back the engine's values.
        #[test]
        fn pages_parse_and_read_back(
            reqs in prop::collection::vec((1u32..400, 1u32..100), 0..30),
            name in "[a-zA-Z0-9/_\\-\\.\"\\\\ ]{1,30}",
            kv_tokens in 1_024u64..8_000,
        ) {
            let gpu = GpuSpec::preset("a100-80gb").unwrap();
            let mut cfg = EngineConfig::vllm_defaults(&gpu);
            cfg.max_model_len = Some(1024);
            cfg.memory = MemorySetting::KvCacheBytes(kv_tokens * 57_344);
            let mut e = Engine::new(ModelSpec::preset("qwen2-7b").unwrap(), gpu, cfg).unwrap();
            for (i, (p, o)) in reqs.iter().enumerate() {
                e.submit(Request::new(i as u64, *p, *o), i as f64 * 0.01).unwrap();
            }
            // Stop half-way, so gauges are non-zero too.
            e.advance(0.2, &mut |_| {});
            let s = e.stats();
            for v in [MetricsVersion::V1, MetricsVersion::V0] {
                let text = render(s, &info(&name), v);
                let page = parse_text(&text);
                prop_assert!(page.errors.is_empty(), "{:?}", page.errors);
                let snap = VllmSnapshot::from_text(&text).unwrap();
                prop_assert_eq!(snap.model_names.clone(), vec![name.clone()]);
                prop_assert_eq!(snap.requests_running, Some(s.running as f64));
                prop_assert_eq!(snap.requests_waiting, Some(s.waiting as f64));
                prop_assert_eq!(snap.kv_cache_usage, Some(s.kv_usage));
                prop_assert_eq!(snap.generation_tokens_total, Some(s.generation_tokens as f64));
                prop_assert_eq!(snap.preemptions_total, Some(s.num_preemptions as f64));
                prop_assert_eq!(snap.ttft.as_ref().map(|h| h.count), Some(s.ttft.count as f64));
            }
        }
    }

    #[test]
    fn floats_look_like_prometheus_client() {
        assert_eq!(fmt_f64(1.0), "1.0");
        assert_eq!(fmt_f64(0.25), "0.25");
        assert_eq!(fmt_f64(f64::INFINITY), "+Inf");
        assert_eq!(escape("a\"b\\c"), "a\\\"b\\\\c");
    }
}
