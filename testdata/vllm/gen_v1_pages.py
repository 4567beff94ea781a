#!/usr/bin/env python3
"""Writes the hand-built V1-style vLLM /metrics pages in this directory (see SOURCES.md).

No vLLM server produced these. They follow the names, types, label sets and default bucket bounds of
vLLM's V1 Prometheus logger and the way prometheus_client writes a page (labels sorted by name, counters
announced with their `_total` name, every `*_created` series as a separate gauge family, floats in Python
repr). Run it from anywhere: `python3 testdata/vllm/gen_v1_pages.py`; it rewrites the two .txt files.
"""
import os

HERE = os.path.dirname(os.path.abspath(__file__))

TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
REQ = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
       960.0, 1920.0, 7680.0]


def esc(v):
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def labels(d):
    if not d:
        return ""
    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in sorted(d.items())) + "}"


def num(x):
    """prometheus_client's floatToGoString: +Inf/-Inf/NaN, and Go-style exponents for large values."""
    d = float(x)
    if d == float("inf"):
        return "+Inf"
    if d == float("-inf"):
        return "-Inf"
    if d != d:
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return s


class Page:
    def __init__(self, created=1763000123.456789):
        self.out = []
        self.created = created

    def family(self, name, kind, help_, series):
        """series: list of (labels dict, value)."""
        self.out.append(f"# HELP {name} {help_}")
        self.out.append(f"# TYPE {name} {kind}")
        for lab, v in series:
            self.out.append(f"{name}{labels(lab)} {num(v)}")

    def counter(self, base, help_, series, created=True):
        self.family(base + "_total", "counter", help_, series)
        if created:
            self.family(base + "_created", "gauge", help_, [(lab, self.created) for lab, _ in series])

    def histogram(self, name, help_, bounds, per_series, created=True):
        """per_series: list of (labels, counts per bucket incl. +Inf overflow (len(bounds)+1), sum)."""
        self.out.append(f"# HELP {name} {help_}")
        self.out.append(f"# TYPE {name} histogram")
        for lab, counts, total in per_series:
            assert len(counts) == len(bounds) + 1
            cum = 0
            for le, c in zip(bounds + [None], counts):
                cum += c
                le_s = "+Inf" if le is None else num(le)
                self.out.append(f"{name}_bucket{labels(dict(lab, le=le_s))} {num(cum)}")
            self.out.append(f"{name}_count{labels(lab)} {num(cum)}")
            self.out.append(f"{name}_sum{labels(lab)} {num(total)}")
        if created:
            self.family(name + "_created", "gauge", help_, [(lab, self.created) for lab, _, _ in per_series])

    def text(self, trailing_newline=True):
        return "\n".join(self.out) + ("\n" if trailing_newline else "")


def spread(bounds, placements):
    """Counts per bucket from {bucket index: count}; index len(bounds) is the +Inf overflow."""
    c = [0] * (len(bounds) + 1)
    for i, n in placements.items():
        c[i] += n
    return c


def two_engines():
    model = "/mnt/models/Qwen2.5-7B-Instruct"
    e = [{"engine": "0", "model_name": model}, {"engine": "1", "model_name": model}]
    p = Page()
    p.out.append("# HELP python_gc_objects_collected_total Objects collected during gc")
    p.out.append("# TYPE python_gc_objects_collected_total counter")
    p.out.append('python_gc_objects_collected_total{generation="0"} 12345.0')
    p.family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
             [(e[0], 3), (e[1], 5)])
    p.family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
             [(e[0], 1), (e[1], 0)])
    p.family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
             [(e[0], 0.42), (e[1], 0.61)])
    p.counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
              [(e[0], 12000), (e[1], 9000)])
    p.counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
              [(e[0], 3000), (e[1], 1500)])
    p.counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
              [(e[0], 2), (e[1], 0)])
    p.counter("vllm:prompt_tokens", "Number of prefill tokens processed.", [(e[0], 12000), (e[1], 9000)])
    p.counter("vllm:generation_tokens", "Number of generation tokens processed.",
              [(e[0], 34000), (e[1], 30000)])
    succ = []
    for lab, (stop, length, abort) in zip(e, [(40, 5, 1), (35, 7, 0)]):
        for reason, n in (("abort", abort), ("length", length), ("stop", stop)):
            succ.append((dict(lab, finished_reason=reason), n))
    p.counter("vllm:request_success", "Count of successfully processed requests.", succ)
    # TTFT: engine 0 46 requests mostly 0.1-0.25s; engine 1 42 requests, slower.
    p.histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT, [
        (e[0], spread(TTFT, {7: 10, 8: 30, 9: 6}), 7.9),
        (e[1], spread(TTFT, {8: 12, 9: 20, 10: 8, 13: 2}), 22.5),
    ])
    p.histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL, [
        (e[0], spread(ITL, {1: 30000, 2: 3954}), 950.0),
        (e[1], spread(ITL, {1: 20000, 2: 9958}), 880.0),
    ])
    p.histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", REQ, [
        (e[0], spread(REQ, {8: 30, 9: 16}), 480.0),
        (e[1], spread(REQ, {8: 20, 9: 20, 10: 2}), 520.0),
    ])
    p.histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", REQ, [
        (e[0], spread(REQ, {0: 46}), 1.2),
        (e[1], spread(REQ, {0: 40, 1: 2}), 2.9),
    ])
    p.histogram("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
                REQ, [(e[0], spread(REQ, {0: 46}), 6.1), (e[1], spread(REQ, {0: 42}), 7.0)])
    p.histogram("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
                REQ, [(e[0], spread(REQ, {8: 46}), 470.0), (e[1], spread(REQ, {8: 42}), 505.0)])
    cache = {"block_size": "16", "cache_dtype": "auto", "calculate_kv_scales": "False",
             "enable_prefix_caching": "True", "gpu_memory_utilization": "0.9", "is_attention_free": "False",
             "kv_cache_memory_bytes": "None", "num_cpu_blocks": "None", "num_gpu_blocks": "27342",
             "num_gpu_blocks_override": "None", "prefix_caching_hash_algo": "sha256", "sliding_window": "None",
             "swap_space": "4", "swap_space_bytes": "4294967296"}
    p.family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig",
             [(dict(cache, engine="0"), 1), (dict(cache, engine="1"), 1)])
    return p.text()


def older_names_escaped():
    # An early V1 server (vLLM 0.8-0.9 names), one engine, a served model name with characters that must be
    # escaped, a NaN gauge, exporter timestamps, and no newline at the end of the page.
    model = 'team "alpha"\\llama\nprod'
    lab = {"engine": "0", "model_name": model}
    p = Page()
    p.family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", [(lab, 2)])
    p.family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", [(lab, 7)])
    p.family("vllm:gpu_cache_usage_perc", "gauge", "GPU KV-cache usage. 1 means 100 percent usage.", [(lab, 0.875)])
    p.family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage (not yet computed).", [(lab, float("nan"))])
    p.counter("vllm:gpu_prefix_cache_queries", "GPU prefix cache queries, in terms of number of queried tokens.",
              [(lab, 800)])
    p.counter("vllm:gpu_prefix_cache_hits", "GPU prefix cache hits, in terms of number of cached tokens.",
              [(lab, 200)])
    p.counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", [(lab, 11)])
    p.counter("vllm:prompt_tokens", "Number of prefill tokens processed.", [(lab, 800)])
    p.counter("vllm:generation_tokens", "Number of generation tokens processed.", [(lab, 5000)])
    p.counter("vllm:request_success", "Count of successfully processed requests.",
              [(dict(lab, finished_reason="stop"), 19), (dict(lab, finished_reason="length"), 1)])
    p.histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT,
                [(lab, spread(TTFT, {11: 10, 12: 10}), 25.0)])
    p.histogram("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", ITL,
                [(lab, spread(ITL, {3: 4980}), 350.0)])
    p.histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", REQ,
                [(lab, spread(REQ, {10: 20}), 380.0)])
    p.family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig",
             [({"engine": "0", "block_size": "32", "cache_dtype": "fp8_e5m2", "gpu_memory_utilization": "0.45",
                "num_gpu_blocks": "1200", "note": 'a "quoted"\\path\nnext'}, 1)])
    # Exporter timestamps (ms): vLLM does not write them, other exporters may.
    p.out = [line + " 1763000000000" if line.startswith("vllm:num_requests") else line for line in p.out]
    return p.text(trailing_newline=False)


if __name__ == "__main__":
    for name, text in (("v1-two-engines-hand-built.txt", two_engines()),
                       ("v1-older-names-escaped-hand-built.txt", older_names_escaped())):
        with open(os.path.join(HERE, name), "w", newline="\n") as f:
            f.write(text)
        print(name, len(text.encode()), "bytes")
