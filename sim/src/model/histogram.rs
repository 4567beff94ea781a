//! vLLM's histogram bucket bounds and a cumulative histogram with them, as `/metrics` shows it.

use serde::{Deserialize, Serialize};

/// Bucket upper bounds of vLLM's `vllm:time_to_first_token_seconds` (vllm/v1/metrics/loggers.py).
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
];
/// Bucket bounds of `vllm:inter_token_latency_seconds` and `vllm:time_per_output_token_seconds`.
pub const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
];
/// Bucket bounds vLLM shares among e2e, queue, inference, prefill and decode time histograms.
pub const REQUEST_LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
];
/// Bucket bounds of `vllm:iteration_tokens_total`.
pub const ITERATION_TOKENS_BUCKETS: &[f64] = &[
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];
/// Bucket bounds of `vllm:request_params_n`.
pub const PARAMS_N_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0];
/// `vllm:request_num_preemptions` bucket bounds (as a real vLLM 0.32.0 page shows them).
pub const NUM_PREEMPTIONS_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0];

/// vLLM's `build_1_2_5_buckets(max)`: 1, 2, 5, 10, 20, 50, … up to `max` (token-count histograms).
pub fn buckets_1_2_5(max: u64) -> Vec<f64> {
    let mut out = Vec::new();
    let mut scale: u64 = 1;
    loop {
        for m in [1u64, 2, 5] {
            let v = m.saturating_mul(scale);
            if v > max {
                return out;
            }
            out.push(v as f64);
        }
        scale = scale.saturating_mul(10);
    }
}

/// A cumulative Prometheus-style histogram with fixed bounds (plus the implicit `+Inf`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    /// Upper bounds, ascending, without `+Inf`.
    pub bounds: Vec<f64>,
    /// Observations per bucket (not cumulative); one more entry than `bounds`, the last being `+Inf`.
    pub counts: Vec<u64>,
    /// Sum of observations.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
}

impl Histogram {
    /// An empty histogram with these upper bounds.
    pub fn new(bounds: &[f64]) -> Histogram {
        Histogram {
            bounds: bounds.to_vec(),
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    /// Records one value (`le` semantics: a value equal to a bound falls in that bucket).
    pub fn observe(&mut self, v: f64) {
        let i = self.bounds.partition_point(|b| *b < v);
        self.counts[i] += 1;
        self.sum += v;
        self.count += 1;
    }

    /// `(le, cumulative count)` pairs, ending with `(+Inf, count)`.
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut acc = 0;
        let mut out = Vec::with_capacity(self.counts.len());
        for (i, c) in self.counts.iter().enumerate() {
            acc += c;
            out.push((self.bounds.get(i).copied().unwrap_or(f64::INFINITY), acc));
        }
        out
    }

    /// The same observations as the cumulative histogram vLLM's `/metrics` shows and the project's parser reads
    /// (`tessera_core::metrics::Histogram`), so windows and quantiles use the one implementation the sidecar uses.
    pub fn to_cumulative(&self) -> tessera_core::metrics::Histogram {
        let mut acc = 0u64;
        let buckets = self
            .bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(&self.counts)
            .map(|(le, c)| {
                acc += c;
                tessera_core::metrics::Bucket {
                    le,
                    cumulative: acc as f64,
                }
            })
            .collect();
        tessera_core::metrics::Histogram {
            buckets,
            sum: self.sum,
            count: self.count as f64,
        }
    }

    /// The `q` quantile as Prometheus' `histogram_quantile` computes it (`tessera_core::metrics::Histogram::quantile`).
    pub fn quantile(&self, q: f64) -> Option<f64> {
        self.to_cumulative().quantile(q)
    }
}
