//! What happened between two cumulative scrapes: rates, preemptions, latency quantiles (TTFT, inter-token,
//! end-to-end, queue, prefill, decode), prefix-cache hit ratio.
//!
//! vLLM's counters and histograms are cumulative since the server started, so anything "over the last
//! minute" is a difference of two snapshots. A later value below the earlier one means the server restarted
//! (counters start again from zero); then the later value itself is what happened since the restart — the
//! same rule as Prometheus' `increase()`. This can under-count the window (what happened before the restart
//! is lost), never over-count it.
//!
//! Every field is `None` when it cannot be computed (a family absent from either snapshot, no time elapsed,
//! no observations in the window) — never zero for "unknown", so a missing signal cannot drive a scale-down.

use serde::{Deserialize, Serialize};

use super::snapshot::{Histogram, VllmSnapshot};

/// How much a cumulative counter grew from `earlier` to `later`, reset-aware: if `later < earlier` the
/// counter restarted from zero in between, and `later` is the growth since then.
///
/// Non-finite inputs give `NaN` (there is no honest number to return).
pub fn counter_delta(later: f64, earlier: f64) -> f64 {
    if !later.is_finite() || !earlier.is_finite() {
        return f64::NAN;
    }
    if later >= earlier { later - earlier } else { later }
}

/// Quantiles of one latency histogram over a window, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Quantiles {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    /// The mean (`Δsum / Δcount`), when the histogram's sum is known.
    pub mean: Option<f64>,
    /// Observations in the window.
    pub count: f64,
}

impl Quantiles {
    /// p50/p95/p99 of a (window) histogram; `None` when it holds no observations.
    pub fn of(h: &Histogram) -> Option<Quantiles> {
        Some(Quantiles {
            p50: h.quantile(0.5)?,
            p95: h.quantile(0.95)?,
            p99: h.quantile(0.99)?,
            mean: h.mean(),
            count: h.count,
        })
    }
}

/// The activity of one vLLM server between two snapshots.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WindowSummary {
    /// Seconds between the two scrapes, as passed in.
    pub elapsed_secs: f64,
    /// True when some counter or histogram went backwards (the server restarted inside the window).
    pub reset_detected: bool,
    /// Requests finished in the window: the growth of `request_success_total` over all reasons, or, on a
    /// server without it, the growth of the e2e latency histogram's count.
    pub requests_finished: Option<f64>,
    pub requests_per_second: Option<f64>,
    pub prompt_tokens_per_second: Option<f64>,
    pub generation_tokens_per_second: Option<f64>,
    /// Preemptions in the window (a count, not a rate: any preemption means the KV cache was too small).
    pub preemptions: Option<f64>,
    pub ttft: Option<Quantiles>,
    /// The TTFT observations of the window itself (bucket counts since the window's start), so several replicas'
    /// windows can be pooled into the model's quantiles (`core::scale::inputs::pooled_ttft`).
    pub ttft_histogram: Option<Histogram>,
    pub inter_token_latency: Option<Quantiles>,
    pub e2e_latency: Option<Quantiles>,
    pub queue_time: Option<Quantiles>,
    /// Time requests spent in prefill (`vllm:request_prefill_time_seconds`), seconds.
    pub prefill_time: Option<Quantiles>,
    /// Time requests spent in decode (`vllm:request_decode_time_seconds`), seconds.
    pub decode_time: Option<Quantiles>,
    /// Prefix-cache hits / queries in the window (token-weighted in vLLM), when there were queries.
    pub prefix_cache_hit_ratio: Option<f64>,
}

impl WindowSummary {
    /// Summarise the window from `earlier` to `later`, `elapsed_secs` apart (measured by the caller).
    pub fn between(earlier: &VllmSnapshot, later: &VllmSnapshot, elapsed_secs: f64) -> WindowSummary {
        let mut reset = false;
        let mut delta = |l: Option<f64>, e: Option<f64>| -> Option<f64> {
            let (l, e) = (l?, e?);
            reset |= l < e;
            let d = counter_delta(l, e);
            d.is_finite().then_some(d)
        };
        let prompt = delta(later.prompt_tokens_total, earlier.prompt_tokens_total);
        let generation = delta(later.generation_tokens_total, earlier.generation_tokens_total);
        let preemptions = delta(later.preemptions_total, earlier.preemptions_total);
        let queries = delta(
            later.prefix_cache_queries_total,
            earlier.prefix_cache_queries_total,
        );
        let hits = delta(later.prefix_cache_hits_total, earlier.prefix_cache_hits_total);
        let success_sum = |s: &VllmSnapshot| {
            (!s.request_success_total.is_empty()).then(|| s.request_success_total.values().sum::<f64>())
        };
        let mut finished = delta(success_sum(later), success_sum(earlier));

        let mut window_hist = |l: &Option<Histogram>, e: &Option<Histogram>| -> Option<Histogram> {
            let (l, e) = (l.as_ref()?, e.as_ref()?);
            // Different bounds without anything going down is not a restart: one scrape is missing a bucket
            // (a line the parser refused, a truncated page). Its quantiles would be silently wrong (p50 0.5
            // instead of ~0.1 was seen), so the histogram is unusable for this window.
            if !l.same_bounds(e) && l.count >= e.count {
                return None;
            }
            let d = l.delta(e);
            // `delta` returns the later histogram whole when it went backwards or was re-bucketed.
            reset |= d.count != l.count - e.count;
            Some(d)
        };
        let ttft = window_hist(&later.ttft, &earlier.ttft);
        let itl = window_hist(&later.inter_token_latency, &earlier.inter_token_latency);
        let e2e = window_hist(&later.e2e_latency, &earlier.e2e_latency);
        let queue = window_hist(&later.queue_time, &earlier.queue_time);
        let prefill = window_hist(&later.prefill_time, &earlier.prefill_time);
        let decode = window_hist(&later.decode_time, &earlier.decode_time);
        if finished.is_none() {
            finished = e2e.as_ref().map(|h| h.count);
        }

        let rate = |n: Option<f64>| {
            let n = n?;
            (elapsed_secs.is_finite() && elapsed_secs > 0.0).then(|| n / elapsed_secs)
        };
        WindowSummary {
            elapsed_secs,
            reset_detected: reset,
            requests_finished: finished,
            requests_per_second: rate(finished),
            prompt_tokens_per_second: rate(prompt),
            generation_tokens_per_second: rate(generation),
            preemptions,
            ttft: ttft.as_ref().and_then(Quantiles::of),
            ttft_histogram: ttft,
            inter_token_latency: itl.as_ref().and_then(Quantiles::of),
            e2e_latency: e2e.as_ref().and_then(Quantiles::of),
            queue_time: queue.as_ref().and_then(Quantiles::of),
            prefill_time: prefill.as_ref().and_then(Quantiles::of),
            decode_time: decode.as_ref().and_then(Quantiles::of),
            prefix_cache_hit_ratio: match (hits, queries) {
                (Some(h), Some(q)) if q > 0.0 => Some((h / q).clamp(0.0, 1.0)),
                _ => None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    /// A V1-style page for one engine with the given cumulative values.
    fn page(success: f64, prompt: f64, preempt: f64, ttft_cum: [f64; 3], ttft_sum: f64) -> String {
        format!(
            "vllm:request_success_total{{engine=\"0\",finished_reason=\"stop\",model_name=\"m\"}} {success}\n\
             vllm:prompt_tokens_total{{engine=\"0\",model_name=\"m\"}} {prompt}\n\
             vllm:generation_tokens_total{{engine=\"0\",model_name=\"m\"}} {}\n\
             vllm:num_preemptions_total{{engine=\"0\",model_name=\"m\"}} {preempt}\n\
             vllm:prefix_cache_queries_total{{engine=\"0\",model_name=\"m\"}} {prompt}\n\
             vllm:prefix_cache_hits_total{{engine=\"0\",model_name=\"m\"}} {}\n\
             vllm:time_to_first_token_seconds_bucket{{engine=\"0\",le=\"0.1\",model_name=\"m\"}} {}\n\
             vllm:time_to_first_token_seconds_bucket{{engine=\"0\",le=\"1.0\",model_name=\"m\"}} {}\n\
             vllm:time_to_first_token_seconds_bucket{{engine=\"0\",le=\"+Inf\",model_name=\"m\"}} {}\n\
             vllm:time_to_first_token_seconds_sum{{engine=\"0\",model_name=\"m\"}} {ttft_sum}\n\
             vllm:time_to_first_token_seconds_count{{engine=\"0\",model_name=\"m\"}} {}\n",
            prompt * 2.0,
            prompt / 4.0,
            ttft_cum[0],
            ttft_cum[1],
            ttft_cum[2],
            ttft_cum[2],
        )
    }

    #[test]
    fn counter_delta_is_reset_aware() {
        assert_eq!(counter_delta(15.0, 10.0), 5.0);
        assert_eq!(counter_delta(10.0, 10.0), 0.0);
        assert_eq!(counter_delta(3.0, 10.0), 3.0);
        assert!(counter_delta(f64::NAN, 1.0).is_nan());
    }

    #[test]
    fn rates_and_quantiles_over_a_window() {
        let a = VllmSnapshot::from_text(&page(100.0, 1000.0, 2.0, [50.0, 90.0, 100.0], 20.0)).unwrap();
        let b = VllmSnapshot::from_text(&page(160.0, 4000.0, 2.0, [50.0, 140.0, 160.0], 65.0)).unwrap();
        let w = WindowSummary::between(&a, &b, 30.0);
        assert!(!w.reset_detected);
        assert_eq!(w.requests_finished, Some(60.0));
        assert_eq!(w.requests_per_second, Some(2.0));
        assert_eq!(w.prompt_tokens_per_second, Some(100.0));
        assert_eq!(w.generation_tokens_per_second, Some(200.0));
        assert_eq!(w.preemptions, Some(0.0));
        assert_eq!(w.prefix_cache_hit_ratio, Some(0.25));
        // Window TTFT: 0 in (0,0.1], 50 in (0.1,1], 10 above 1s. p50: rank 30 → 0.1 + 0.9*30/50.
        let t = w.ttft.unwrap();
        assert!((t.p50 - 0.64).abs() < 1e-12, "{t:?}");
        assert_eq!(t.p95, 1.0); // rank 57 is in +Inf → highest finite bound
        assert_eq!(t.count, 60.0);
        assert!((t.mean.unwrap() - 0.75).abs() < 1e-12);
        // A window with no new requests has no quantiles (not zeros).
        let still = WindowSummary::between(&b, &b, 30.0);
        assert_eq!(still.ttft, None);
        assert_eq!(still.requests_per_second, Some(0.0));
        assert_eq!(still.prefix_cache_hit_ratio, None);
    }

    #[test]
    fn restart_inside_the_window_counts_what_came_after() {
        let a = VllmSnapshot::from_text(&page(100.0, 1000.0, 5.0, [50.0, 90.0, 100.0], 20.0)).unwrap();
        // Server restarted: everything is small again.
        let b = VllmSnapshot::from_text(&page(6.0, 80.0, 1.0, [2.0, 5.0, 6.0], 1.5)).unwrap();
        let w = WindowSummary::between(&a, &b, 10.0);
        assert!(w.reset_detected);
        assert_eq!(w.requests_finished, Some(6.0));
        assert_eq!(w.preemptions, Some(1.0));
        assert_eq!(w.prompt_tokens_per_second, Some(8.0));
        assert_eq!(w.ttft.unwrap().count, 6.0);
    }

    /// Item 10: one scrape missing the 0.1 bucket used to be read as a restart: the later histogram whole, p50 0.5.
    #[test]
    fn a_histogram_missing_a_bucket_is_unusable_for_the_window() {
        let a = VllmSnapshot::from_text(&page(10.0, 100.0, 0.0, [9.0, 10.0, 10.0], 1.0)).unwrap();
        let full = page(110.0, 1100.0, 0.0, [108.0, 110.0, 110.0], 11.0);
        let missing: String = full
            .lines()
            .filter(|l| !l.contains("le=\"0.1\""))
            .map(|l| format!("{l}\n"))
            .collect();
        let b = VllmSnapshot::from_text(&missing).unwrap();
        let w = WindowSummary::between(&a, &b, 10.0);
        assert_eq!(w.ttft, None, "no quantile from a histogram missing a bucket");
        assert_eq!(
            w.requests_finished,
            Some(100.0),
            "the rest of the window is still read"
        );
        let w = WindowSummary::between(&a, &VllmSnapshot::from_text(&full).unwrap(), 10.0);
        assert!(w.ttft.unwrap().p50 <= 0.1);
    }

    #[test]
    fn missing_families_and_bad_elapsed_give_none() {
        let a = VllmSnapshot::from_text("vllm:num_requests_running 1\n").unwrap();
        let b = VllmSnapshot::from_text(&page(1.0, 1.0, 0.0, [0.0, 1.0, 1.0], 0.5)).unwrap();
        let w = WindowSummary::between(&a, &b, 5.0);
        assert_eq!((w.requests_finished, w.preemptions, w.ttft), (None, None, None));
        let w = WindowSummary::between(&b, &b, 0.0);
        assert_eq!((w.requests_finished, w.requests_per_second), (Some(0.0), None));
    }

    /// Two real pages of one vLLM 0.32 server (`testdata/vllm/real/`, before and after a load): the prefill and
    /// decode quantiles come from the difference of the cumulative histograms, as TTFT's do, and the prefix cache
    /// hit ratio from the difference of the counters (that load repeated no prefix: 4800 tokens queried, no hit).
    #[test]
    fn prefill_decode_and_prefix_cache_over_a_window_of_real_pages() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/vllm/real/");
        let read = |f: &str| std::fs::read_to_string(format!("{dir}{f}")).unwrap();
        let a = VllmSnapshot::from_text(&read("metrics-running.txt")).unwrap();
        let b = VllmSnapshot::from_text(&read("metrics-after-load.txt")).unwrap();
        let w = WindowSummary::between(&a, &b, 60.0);
        assert_eq!(w.prefix_cache_hit_ratio, Some(0.0));
        // Prefill: 13 → 69 requests; of the 56 in the window, 47 took ≤ 0.3 s and 55 ≤ 0.8 s.
        let p = w.prefill_time.unwrap();
        assert_eq!(p.count, 56.0);
        assert!(p.p50 > 0.0 && p.p50 <= 0.3, "{p:?}");
        assert!(p.p95 > 0.5 && p.p95 <= 0.8, "{p:?}");
        let d = w.decode_time.unwrap();
        assert_eq!(d.count, 56.0);
        assert!(d.p50 <= d.p95 && d.p95 <= d.p99, "{d:?}");
        // No request in a window: no quantiles, never zeros.
        let still = WindowSummary::between(&b, &b, 60.0);
        assert_eq!((still.prefill_time, still.decode_time), (None, None));
    }

    /// A prefix-cache hit ratio is hits over queries in the window, not since the start.
    #[test]
    fn the_prefix_cache_hit_ratio_is_the_windows_own() {
        let page = |q: f64, h: f64| {
            VllmSnapshot::from_text(&format!(
                "vllm:prefix_cache_queries_total{{model_name=\"m\"}} {q}\nvllm:prefix_cache_hits_total{{model_name=\"m\"}} {h}\n"
            ))
            .unwrap()
        };
        // Since the start 1000 of 2000 tokens hit (50%); in the window 900 of 1000 (90%).
        let w = WindowSummary::between(&page(1000.0, 100.0), &page(2000.0, 1000.0), 10.0);
        assert_eq!(w.prefix_cache_hit_ratio, Some(0.9));
    }

    proptest! {
        /// A counter delta is never negative and never more than the later value when it went backwards.
        #[test]
        fn counter_delta_never_negative(later in 0.0f64..1e12, earlier in 0.0f64..1e12) {
            let d = counter_delta(later, earlier);
            prop_assert!(d >= 0.0);
            prop_assert!(d <= later);
        }
    }
}
