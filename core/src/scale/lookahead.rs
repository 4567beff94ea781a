//! The TTFT SLO guard's look-ahead: a replica asked for now serves its first request a scale-up lead time later
//! (pod start and weights load), so a guard that waits for the p95 to pass the objective leaves every request of
//! that lead time to the replicas already there. The guard therefore also fires while the model's p95 is still
//! under the objective but rising fast enough to pass it within the lead time, extrapolated along its trend over
//! the last [`TREND_WINDOW`].
//!
//! Why a trend and not a lower threshold: a threshold is a target by another name (the replica count would chase
//! it, as with `targets.ttftP95`), and it fires as readily for a p95 that sits still under the objective as for one
//! on its way through it. The trend fires only on the way up, and only as early as the lead time requires: a 34 s
//! start reaches further ahead than a 1 s sleep-mode wake.
//!
//! Why only over busy windows ([`MIN_FIRST_TOKENS`]): a 1-minute p95 over a handful of requests jumps with one slow
//! request, and a slope read off it is noise. Ungated, the look-ahead added 10% GPU-hours on the quiet mix, each
//! false alarm holding a replica for the 5-minute scale-down window. Gated at 50 first tokens, over 96 seeds of the
//! default scenario the median per-seed GPU-hour ratio is ×1.000 (the mean +1%) and the one seed under 99% comes
//! over it; the quiet mix and the 24-hour tools scenario do not move (`docs/simulator-experiments.md`, "A TTFT guard that looks
//! ahead by the lead time").
//!
//! Fails safe: a round without fresh data, or with too few first tokens, adds no sample, so a gap never creates a
//! slope; a falling or flat p95 projects nothing; without a known lead time (no cold start measured yet) the guard
//! reads the p95 as it is.

use std::collections::VecDeque;
use std::time::Duration;

use super::{ScaleInput, SloPercentile, Timestamp};

/// How far back the trend is read: the sidecar's latency window (`--latency-window`, 1 minute), so the slope
/// compares two windows that overlap by no more than half.
pub const TREND_WINDOW: Duration = Duration::from_secs(60);

/// The shortest span a slope is read over: shorter spans are noise (consecutive windows share most requests).
pub const MIN_SPAN: Duration = Duration::from_secs(30);

/// First tokens the fresh replicas' windows must hold together before their p95 counts as a trend (module docs).
pub const MIN_FIRST_TOKENS: f64 = 50.0;

/// At most this many samples are kept (four a minute at the default 15 s sync; a fast caller cannot grow it).
const MAX_SAMPLES: usize = 64;

/// The percentile this round's trend reads (the SLO guard's, p95 by default): the worst fresh one, when the
/// windows hold [`MIN_FIRST_TOKENS`].
pub(crate) fn trend_sample(input: &ScaleInput, pct: SloPercentile) -> Option<Duration> {
    if input.ttft_window_count.unwrap_or(0.0) < MIN_FIRST_TOKENS {
        return None;
    }
    super::worst_ttft(input, pct)
}

/// Keeps this round's sample (if any) and forgets those older than [`TREND_WINDOW`]: the model's
/// [`super::ScaleState::ttft_seen`], fed by [`super::joint::round`].
pub(crate) fn note(seen: &mut VecDeque<(Timestamp, Duration)>, sample: Option<Duration>, now: Timestamp) {
    if let Some(w) = sample
        && seen.back().is_none_or(|(t, _)| *t < now)
    {
        seen.push_back((now, w));
    }
    while seen.front().is_some_and(|(t, _)| !t.is_within(TREND_WINDOW, now)) || seen.len() > MAX_SAMPLES {
        seen.pop_front();
    }
}

/// Where a rising p95 is heading.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Trend {
    /// Seconds of p95 gained per second.
    pub slope: f64,
    /// Over how long the slope was read.
    pub span: Duration,
    /// The p95 extrapolated `lead` ahead.
    pub projected: Duration,
}

/// The p95 `worst` (this round's, already in `seen`) extrapolated `lead` ahead along its slope from the oldest
/// sample at least [`MIN_SPAN`] old; `None` unless it is rising.
pub fn project(
    worst: Duration,
    seen: &VecDeque<(Timestamp, Duration)>,
    lead: Duration,
    now: Timestamp,
) -> Option<Trend> {
    let &(at, then) = seen
        .iter()
        .find(|(t, _)| t.is_within(TREND_WINDOW, now) && now.since(*t) >= MIN_SPAN)?;
    let span = now.since(at);
    let slope = (worst.as_secs_f64() - then.as_secs_f64()) / span.as_secs_f64();
    (slope > 0.0).then(|| Trend {
        slope,
        span,
        projected: Duration::from_secs_f64(worst.as_secs_f64() + slope * lead.as_secs_f64()),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn at(secs: u64) -> Timestamp {
        Timestamp::from_millis(secs * 1000)
    }

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    /// A p95 rising 10 ms a second, read every 15 s: after 30 s of history the slope is read; 34 s ahead it is
    /// 340 ms higher. Samples a minute old leave the window, and the slope is read from the oldest one still in it.
    #[test]
    fn a_rising_p95_is_extrapolated_by_the_lead_time() {
        let mut seen = VecDeque::new();
        for (t, v) in [(0, 1000), (15, 1150)] {
            note(&mut seen, Some(ms(v)), at(t));
            assert_eq!(
                project(ms(v), &seen, Duration::from_secs(34), at(t)),
                None,
                "too short at {t}"
            );
        }
        note(&mut seen, Some(ms(1300)), at(30));
        let trend = project(ms(1300), &seen, Duration::from_secs(34), at(30)).unwrap();
        assert!((trend.slope - 0.01).abs() < 1e-9, "{trend:?}");
        assert_eq!((trend.span, trend.projected), (Duration::from_secs(30), ms(1640)));
        for (t, v) in [(45, 1450), (60, 1600), (75, 1750)] {
            note(&mut seen, Some(ms(v)), at(t));
        }
        let trend = project(ms(1750), &seen, Duration::from_secs(10), at(75)).unwrap();
        assert_eq!((trend.span, trend.projected), (Duration::from_secs(45), ms(1850)));
        assert_eq!(seen.len(), 4, "the samples a minute old or older left the window");
    }

    /// Flat or falling, nothing is projected; a gap in the data adds no sample, and once every sample is older
    /// than the window there is no slope to read.
    #[test]
    fn flat_falling_or_missing_projects_nothing() {
        let mut seen = VecDeque::new();
        for (t, v) in [(0, 1500), (30, 1500)] {
            note(&mut seen, Some(ms(v)), at(t));
        }
        assert_eq!(project(ms(1500), &seen, Duration::from_secs(34), at(30)), None);
        note(&mut seen, Some(ms(1200)), at(45));
        assert_eq!(project(ms(1200), &seen, Duration::from_secs(34), at(45)), None);
        note(&mut seen, None, at(200));
        assert!(seen.is_empty());
        note(&mut seen, Some(ms(1900)), at(215));
        assert_eq!(project(ms(1900), &seen, Duration::from_secs(34), at(215)), None);
    }

    /// A window of few first tokens is no sample: its p95 is one slow request away from any value.
    #[test]
    fn a_quiet_window_is_no_sample() {
        let replica = super::super::ReplicaSignals {
            ttft_p95: Some(ms(1700)),
            fresh: true,
            ..Default::default()
        };
        let mut input = ScaleInput {
            replicas: vec![replica],
            ttft_window_count: Some(MIN_FIRST_TOKENS - 1.0),
            ..ScaleInput::default()
        };
        assert_eq!(trend_sample(&input, SloPercentile::P95), None);
        input.ttft_window_count = Some(MIN_FIRST_TOKENS);
        assert_eq!(trend_sample(&input, SloPercentile::P95), Some(ms(1700)));
        input.ttft_window_count = None;
        assert_eq!(trend_sample(&input, SloPercentile::P95), None);
    }

    /// However fast a caller ticks, the samples stay bounded; the same instant twice is one sample.
    #[test]
    fn bounded() {
        let mut seen = VecDeque::new();
        for t in 0..1000u64 {
            note(&mut seen, Some(ms(1000 + t)), Timestamp::from_millis(t * 50));
            note(&mut seen, Some(ms(1000 + t)), Timestamp::from_millis(t * 50));
        }
        assert_eq!(seen.len(), MAX_SAMPLES);
    }
}
