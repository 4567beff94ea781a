//! Traffic as a Prometheus server saw it: request counts per query step and token-length histograms.
//!
//! `tessera simulate --prometheus` writes this into the scenario file (`traffic: { trace: observed, … }`) so a
//! person can read it, edit it and run it again without the Prometheus server. Memory is bounded by the step count:
//! the file holds one number per step and one count per histogram bucket, never a request.
//!
//! What metrics cannot say, and what is assumed instead (the report repeats it):
//! - **when within a step** each request came: counts are spread uniformly at random over their step (a Poisson
//!   process conditioned on the count, [`super::transform::step_arrivals`]), so bursts shorter than the step are
//!   smoothed;
//! - **when a request arrived**: `tessera simulate --prometheus` counts a request when vLLM sends its first token
//!   and moves it back by the mean TTFT of its step, so `requests` are arrivals and `finish_to_arrival` is 0; counts
//!   taken at the finish (vLLM's finished-request counter) are moved earlier by `finish_to_arrival`, a mean
//!   end-to-end latency;
//! - **a request's own lengths**: prompt and output lengths are drawn independently from their histograms, uniform
//!   within a bucket, scaled so their means equal the exact means (`_sum / _count`).

use std::fmt;
use std::time::Duration;

use rand::RngExt;
use serde::{Deserialize, Serialize};

use super::Arrival;
use super::transform::{Transform, step_arrivals};

/// One model's observed traffic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObservedTraffic {
    /// The length of one step of `requests`.
    #[serde(with = "humantime_serde")]
    pub step: Duration,
    /// Requests per step, space-separated, from the start of the window: arrivals, or finishes when
    /// `finish_to_arrival` is set.
    pub requests: StepCounts,
    /// How much earlier than its count a request arrived: 0 for arrivals, the mean end-to-end latency for counts
    /// taken at the finish.
    #[serde(with = "humantime_serde", default)]
    pub finish_to_arrival: Duration,
    /// Prompt lengths, tokens.
    pub prompt_tokens: TokenHistogram,
    /// Output lengths, tokens.
    pub output_tokens: TokenHistogram,
}

/// Counts per step, written as one line of space-separated numbers so a week of one-minute steps stays one
/// readable line instead of ten thousand.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepCounts(pub Vec<u32>);

impl fmt::Display for StepCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, n) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{n}")?;
        }
        Ok(())
    }
}

impl Serialize for StepCounts {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for StepCounts {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.split_whitespace()
            .enumerate()
            .map(|(i, w)| {
                w.parse::<u32>().map_err(|_| {
                    serde::de::Error::custom(format!(
                        "requests: step {} is {w:?}, expected a whole number of requests",
                        i + 1
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(StepCounts)
    }
}

/// One bucket of a histogram: how many observations fell at or below `le` and above the previous bucket's.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bucket {
    /// Upper bound, inclusive (`.inf` for the last).
    pub le: f64,
    /// Observations in this bucket alone (not cumulative).
    pub count: f64,
}

/// A length distribution: buckets in increasing `le` and the exact mean.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenHistogram {
    /// The exact mean (`_sum / _count` over the window).
    pub mean: f64,
    /// Non-cumulative bucket counts.
    pub buckets: Vec<Bucket>,
}

impl TokenHistogram {
    /// From cumulative `(le, count)` pairs as Prometheus holds them (any order; `+Inf` included).
    pub fn from_cumulative(mut cumulative: Vec<(f64, f64)>, mean: f64) -> TokenHistogram {
        cumulative.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut below = 0.0;
        let buckets = cumulative
            .into_iter()
            .map(|(le, c)| {
                // Bucket totals differenced per series are not always monotone across buckets (a restart between
                // two points loses a different part of each), and a hand-written file need not hold whole
                // counts: three decimals keep the shares and read well in the file.
                let count = ((c - below).max(0.0) * 1000.0).round() / 1000.0;
                below = below.max(c);
                Bucket { le, count }
            })
            .collect();
        TokenHistogram { mean, buckets }
    }

    /// Observations in all buckets.
    pub fn total(&self) -> f64 {
        self.buckets.iter().map(|b| b.count).sum()
    }

    /// Each bucket's range `(lower, upper]` for drawing: the first starts at 1 token (or at 0 for bounds under
    /// 1); the open last one is taken as twice its lower bound (nothing says how far it reaches).
    fn ranges(&self) -> Vec<(f64, f64, f64)> {
        let mut lower: f64 = 0.0;
        let mut out = Vec::with_capacity(self.buckets.len());
        for b in &self.buckets {
            let upper = if b.le.is_finite() {
                b.le
            } else {
                (lower * 2.0).max(lower + 1.0)
            };
            if b.count > 0.0 {
                out.push((lower, upper, b.count));
            }
            lower = upper;
        }
        out
    }

    /// Checks the histogram can be drawn from; the message names what is wrong.
    pub fn check(&self) -> Result<(), String> {
        if self.buckets.is_empty() || self.total() <= 0.0 {
            return Err("the histogram has no observations".into());
        }
        if !(self.mean.is_finite() && self.mean > 0.0) {
            return Err(format!("mean must be above 0, got {}", self.mean));
        }
        if self
            .buckets
            .iter()
            .any(|b| b.le.is_nan() || b.count.is_nan() || b.count < 0.0)
        {
            return Err("every bucket needs a bound and a count of 0 or more".into());
        }
        Ok(())
    }

    /// A sampler: bucket by its share, uniform within it, scaled so the draws' mean is the exact mean.
    pub fn sampler(&self) -> Result<LengthSampler, String> {
        self.check()?;
        let ranges = self.ranges();
        let total: f64 = ranges.iter().map(|r| r.2).sum();
        let expected: f64 = ranges.iter().map(|(lo, hi, c)| (lo + hi) / 2.0 * c).sum::<f64>() / total;
        let mut cumulative = Vec::with_capacity(ranges.len());
        let mut acc = 0.0;
        for (lo, hi, c) in ranges {
            acc += c / total;
            cumulative.push((acc, lo, hi));
        }
        Ok(LengthSampler {
            cumulative,
            scale: if expected > 0.0 { self.mean / expected } else { 1.0 },
        })
    }
}

/// Draws lengths from a [`TokenHistogram`].
#[derive(Debug, Clone)]
pub struct LengthSampler {
    cumulative: Vec<(f64, f64, f64)>,
    scale: f64,
}

impl LengthSampler {
    /// One length, at least 1 token.
    pub fn draw(&self, rng: &mut impl rand::Rng) -> u32 {
        let u = rng.random::<f64>();
        let (_, lo, hi) = self
            .cumulative
            .iter()
            .find(|(c, _, _)| u < *c)
            .or(self.cumulative.last())
            .copied()
            .unwrap_or((1.0, 1.0, 1.0));
        let x = (lo + rng.random::<f64>() * (hi - lo)) * self.scale;
        x.round().clamp(1.0, f64::from(u32::MAX)) as u32
    }
}

impl ObservedTraffic {
    /// Checks the traffic can be turned into arrivals; the message names the field.
    pub fn check(&self) -> Result<(), String> {
        if self.step.is_zero() {
            return Err("step must be above 0".into());
        }
        if self.requests.0.is_empty() {
            return Err("requests holds no step".into());
        }
        if self.requests.0.iter().all(|&n| n == 0) {
            // An idle model: no length is ever drawn, so its histograms may be empty.
            return Ok(());
        }
        self.prompt_tokens
            .check()
            .map_err(|e| format!("prompt_tokens: {e}"))?;
        self.output_tokens
            .check()
            .map_err(|e| format!("output_tokens: {e}"))
    }

    /// The steps' span, seconds.
    pub fn span_secs(&self) -> f64 {
        self.step.as_secs_f64() * self.requests.0.len() as f64
    }
}

/// Arrivals over `[0, duration)` from observed traffic, shaped by `t` in whole steps (see the module overview for
/// what is assumed).
pub fn observed_arrivals(
    o: &ObservedTraffic,
    t: &Transform,
    duration: f64,
    rng: &mut impl rand::Rng,
) -> Result<Vec<Arrival>, String> {
    o.check()?;
    if o.requests.0.iter().all(|&n| n == 0) {
        return Ok(Vec::new());
    }
    let prompt = o.prompt_tokens.sampler()?;
    let output = o.output_tokens.sampler()?;
    let mut arrivals = step_arrivals(&o.requests.0, o.step.as_secs_f64(), t, duration, rng, |rng| {
        (prompt.draw(rng), output.draw(rng))
    })?;
    let early = o.finish_to_arrival.as_secs_f64();
    if early > 0.0 {
        // Counted at their finish: each arrived about one end-to-end latency earlier. The first ones cannot go
        // before the window's start; the order is unchanged by a common shift.
        for a in &mut arrivals {
            a.at = (a.at - early).max(0.0);
        }
    }
    Ok(arrivals)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn hist() -> TokenHistogram {
        TokenHistogram::from_cumulative(
            vec![
                (100.0, 10.0),
                (f64::INFINITY, 40.0),
                (1000.0, 40.0),
                (500.0, 30.0),
            ],
            400.0,
        )
    }

    #[test]
    fn cumulative_buckets_become_counts_and_the_mean_is_kept() {
        let h = hist();
        let counts: Vec<f64> = h.buckets.iter().map(|b| b.count).collect();
        assert_eq!(counts, vec![10.0, 20.0, 10.0, 0.0]);
        let s = h.sampler().unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let n = 20_000;
        let draws: Vec<u32> = (0..n).map(|_| s.draw(&mut rng)).collect();
        let mean = draws.iter().map(|&d| f64::from(d)).sum::<f64>() / f64::from(n);
        assert!((mean - 400.0).abs() < 8.0, "{mean}");
        assert!(draws.iter().all(|&d| d >= 1));
    }

    #[test]
    fn counts_round_trip_as_one_line_and_bad_words_are_named() {
        let o = ObservedTraffic {
            step: Duration::from_secs(15),
            requests: StepCounts(vec![0, 3, 12]),
            finish_to_arrival: Duration::from_millis(1500),
            prompt_tokens: hist(),
            output_tokens: hist(),
        };
        let y = serde_yaml::to_string(&o).unwrap();
        assert!(y.contains("requests: 0 3 12"), "{y}");
        let back: ObservedTraffic = serde_yaml::from_str(&y).unwrap();
        assert_eq!(back, o);
        let err = serde_yaml::from_str::<ObservedTraffic>(&y.replace("0 3 12", "0 x 12"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("step 2 is \"x\""), "{err}");
    }

    #[test]
    fn arrivals_keep_every_steps_count_and_move_back_by_the_latency() {
        let o = ObservedTraffic {
            step: Duration::from_secs(10),
            requests: StepCounts(vec![5, 0, 20, 1]),
            finish_to_arrival: Duration::from_secs(2),
            prompt_tokens: hist(),
            output_tokens: hist(),
        };
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let a = observed_arrivals(&o, &Transform::default(), 40.0, &mut rng).unwrap();
        assert_eq!(a.len(), 26);
        let in_step = |lo: f64, hi: f64| a.iter().filter(|x| x.at >= lo - 2.0 && x.at < hi - 2.0).count();
        assert_eq!(in_step(20.0, 30.0), 20);
        assert!(a.windows(2).all(|w| w[0].at <= w[1].at));
        assert!(a.iter().all(|x| x.at >= 0.0));
    }
}
