//! "Today": what a model held and met in the cluster it was observed in, and what a GPU-hour costs.
//!
//! `simulate --prometheus` writes a [`TodayFile`] per model into the scenario; the report compares every strategy
//! with it (cost saved vs today's setup). A scenario without it (a trace file) compares with the static strategy,
//! a whole GPU per replica sized for the peak, which is how most clusters run vLLM before Tessera.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What one model held and met where it was observed. Informational but for `gpu_hours`, which the report's
/// "today" is made of.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TodayFile {
    /// GPU-hours its replicas held: replica-hours × `gpus_per_replica`.
    pub gpu_hours: f64,
    /// Mean replicas serving (pods exporting vLLM metrics).
    pub replicas_mean: f64,
    /// Most replicas at once.
    pub replicas_max: u32,
    /// Whole GPUs per replica. Metrics do not say (tensor parallelism is not exported): 1 is assumed.
    #[serde(default = "one")]
    pub gpus_per_replica: f64,
    /// TTFT p95 over the window (from vLLM's histogram: a bucket bound, not an exact value).
    #[serde(default, with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub ttft_p95: Option<Duration>,
    /// Inter-token latency p95 over the window (a bucket bound).
    #[serde(default, with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub itl_p95: Option<Duration>,
    /// Highest KV cache usage any replica reported (0–1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_usage_max: Option<f64>,
    /// Most requests running at once on one replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_max: Option<f64>,
    /// Most requests waiting at once on one replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_max: Option<f64>,
}

fn one() -> f64 {
    1.0
}

/// A documented list price per GPU-hour.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ListPrice {
    /// The GPU preset it prices.
    pub gpu: &'static str,
    /// US dollars per GPU-hour.
    pub usd_per_gpu_hour: f64,
    /// Where the number comes from.
    pub source: &'static str,
}

/// On-demand list prices per GPU-hour (AWS EC2, us-east-1, Linux, the instance's hourly price divided by its GPUs;
/// the instance's CPU, memory and disk come with it). See docs/simulator.md, "What a GPU-hour costs". A team
/// with reserved, spot or committed prices sets `--gpu-hour-price`.
pub const LIST_PRICES: &[ListPrice] = &[
    ListPrice {
        gpu: "a100-80gb",
        usd_per_gpu_hour: 5.12,
        source: "AWS p4de.24xlarge on-demand, $40.96/h for 8 A100-80GB",
    },
    ListPrice {
        gpu: "a100-40gb",
        usd_per_gpu_hour: 4.10,
        source: "AWS p4d.24xlarge on-demand, $32.77/h for 8 A100-40GB",
    },
    ListPrice {
        gpu: "h100-80gb",
        usd_per_gpu_hour: 6.88,
        source: "AWS p5.48xlarge on-demand, $55.04/h for 8 H100-80GB (after the June 2025 price cut)",
    },
    ListPrice {
        gpu: "h200",
        usd_per_gpu_hour: 7.91,
        source: "AWS p5en.48xlarge on-demand, $63.296/h for 8 H200 (us-east-1, as dstack's AWS offers listed it in August 2026)",
    },
    ListPrice {
        gpu: "l4",
        usd_per_gpu_hour: 0.80,
        source: "AWS g6.xlarge on-demand, $0.8048/h for 1 L4",
    },
];

/// The list price of a GPU preset.
pub fn list_price(gpu: &str) -> Option<ListPrice> {
    LIST_PRICES.iter().copied().find(|p| p.gpu == gpu)
}

/// The price a report uses: the user's, else the list price of the GPU, with where it comes from.
pub fn price_for(gpu: &str, user: Option<f64>) -> (f64, String) {
    match (user, list_price(gpu)) {
        (Some(p), _) => (p, "--gpu-hour-price".to_string()),
        (None, Some(l)) => (l.usd_per_gpu_hour, format!("list price: {}", l.source)),
        (None, None) => (0.0, format!("no list price for {gpu}: set --gpu-hour-price")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::GpuSpec;

    /// Presets whose on-demand price is not documented here: the report says to set `--gpu-hour-price`.
    const UNPRICED: [&str; 2] = ["l40s", "b200"];

    #[test]
    fn every_gpu_preset_has_a_list_price_or_asks_for_one() {
        for g in GpuSpec::PRESETS {
            if UNPRICED.contains(g) {
                assert!(
                    list_price(g).is_none(),
                    "{g} has a price now: take it off UNPRICED"
                );
                assert!(price_for(g, None).1.contains("--gpu-hour-price"), "{g}");
            } else {
                assert!(list_price(g).is_some(), "{g}");
            }
        }
        assert_eq!(price_for("a100-80gb", Some(2.0)).0, 2.0);
        assert_eq!(price_for("a100-80gb", None).0, 5.12);
    }
}
