//! Input shaping: what the sidecar and the activator report, from raw observations, as pure functions.
//!
//! The controller receives a replica's TTFT p95 from its sidecar (the difference of two cumulative vLLM
//! histogram scrapes `window` apart, quantile by Prometheus' `histogram_quantile` over vLLM's buckets) and a
//! model's request rate from its activator (the difference of two cumulative request counters one poll apart).
//! The simulator computes the same two numbers from the same kind of raw data with these functions, so a
//! simulated policy sees what the shipped one sees — bucketed, windowed, lagged — rather than an exact quantile
//! over a window of its own choosing.

use std::time::Duration;

use crate::metrics::Histogram;

/// The sidecar's default `--window`: its TTFT p95 covers the last 10 minutes of scrapes.
pub const SIDECAR_WINDOW: Duration = Duration::from_secs(600);

/// The controller's default `--activator-poll-interval`: the rate is the counter delta over one poll.
pub const ACTIVATOR_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// The TTFT p95 the sidecar reports: what the cumulative histogram `now` gained since `window_start` (or since
/// the replica started, when it is younger than the window), quantile over vLLM's buckets. `None` when nothing
/// was observed in the window.
pub fn window_ttft_p95(now: &Histogram, window_start: Option<&Histogram>) -> Option<Duration> {
    let delta = match window_start {
        Some(earlier) => now.delta(earlier),
        None => now.clone(),
    };
    delta
        .quantile(0.95)
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
}

/// The request rate the activator's stats give between two polls: the counter delta over the elapsed time.
/// `None` when the counter went backwards (a restart) or no time passed, as the controller then has no rate.
pub fn poll_rate(
    earlier_count: u64,
    earlier_at: Duration,
    later_count: u64,
    later_at: Duration,
) -> Option<f64> {
    let dt = later_at.checked_sub(earlier_at)?.as_secs_f64();
    if dt <= 0.0 || later_count < earlier_count {
        return None;
    }
    Some((later_count - earlier_count) as f64 / dt)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::metrics::Bucket;

    fn hist(counts: &[(f64, f64)]) -> Histogram {
        Histogram {
            buckets: counts
                .iter()
                .map(|&(le, cumulative)| Bucket { le, cumulative })
                .collect(),
            sum: 0.0,
            count: counts.last().map_or(0.0, |b| b.1),
        }
    }

    #[test]
    fn ttft_p95_is_the_bucketed_quantile_of_the_window_only() {
        // Before the window: 100 fast requests; in it: 20 more, all in the (0.5, 1.0] bucket.
        let start = hist(&[(0.1, 100.0), (0.5, 100.0), (1.0, 100.0), (f64::INFINITY, 100.0)]);
        let now = hist(&[(0.1, 100.0), (0.5, 100.0), (1.0, 120.0), (f64::INFINITY, 120.0)]);
        let p = window_ttft_p95(&now, Some(&start)).unwrap().as_secs_f64();
        assert!((p - 0.975).abs() < 1e-9, "{p}");
        // Without a base (a young replica) the whole history counts, the fast ones too:
        // rank 114 of 120 is the 14th of 20 in (0.5, 1.0].
        let whole = window_ttft_p95(&now, None).unwrap().as_secs_f64();
        assert!((whole - 0.85).abs() < 1e-9, "{whole}");
        // Nothing new in the window: no signal.
        assert_eq!(window_ttft_p95(&start, Some(&start)), None);
    }

    #[test]
    fn rate_is_the_counter_delta_and_refuses_restarts() {
        let s = Duration::from_secs;
        assert_eq!(poll_rate(10, s(5), 30, s(10)), Some(4.0));
        assert_eq!(poll_rate(30, s(5), 10, s(10)), None);
        assert_eq!(poll_rate(10, s(5), 30, s(5)), None);
    }
}
