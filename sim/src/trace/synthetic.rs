//! Synthetic arrival shapes for the scenario corpus: traffic no trace here holds, in shapes a platform team
//! recognises and can size from its own dashboards.
//!
//! - **diurnal**: a day-like sine between a trough and a peak (`mean_rps`, `peak_to_trough`, `period`), the
//!   shape of interactive traffic over a working day;
//! - **on_off**: `rps` for `on`, then nothing for `off`, repeated (a nightly job, a team that works in sprints,
//!   a demo that runs an hour a day), the shape scale-to-zero is for.
//!
//! Each becomes expected requests per minute, and from there the same path as a per-minute trace
//! ([`super::transform::step_arrivals`]: the count rounded at random, placed uniformly in its minute, the
//! (prompt, output) pair drawn from a real token distribution), so a synthetic model and a real one differ only
//! in their counts.

use std::f64::consts::PI;
use std::time::Duration;

use rand::RngExt;
use serde::{Deserialize, Serialize};

use super::Arrival;
use super::transform::{Transform, step_arrivals};

/// One minute: the step the shapes are counted in.
const MINUTE: f64 = 60.0;

/// A synthetic arrival shape, as written in a scenario (`traffic.synthetic`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "shape", rename_all = "snake_case", deny_unknown_fields)]
pub enum Shape {
    /// A sine between `mean_rps · 2/(1+r)` and `mean_rps · 2r/(1+r)` (`r` = `peak_to_trough`), lowest at the
    /// start of each period and highest half a period in.
    Diurnal {
        /// The mean request rate over a period, requests per second.
        mean_rps: f64,
        /// The peak rate over the trough rate (1 = flat).
        #[serde(default = "default_peak_to_trough")]
        peak_to_trough: f64,
        /// How long one cycle lasts (whole minutes).
        #[serde(default = "default_period", with = "humantime_serde")]
        period: Duration,
    },
    /// `rps` for `on`, then no request for `off`, repeated.
    OnOff {
        /// The rate while on, requests per second.
        rps: f64,
        /// How long it is on (whole minutes).
        #[serde(with = "humantime_serde")]
        on: Duration,
        /// How long it is off (whole minutes).
        #[serde(with = "humantime_serde")]
        off: Duration,
    },
}

fn default_peak_to_trough() -> f64 {
    3.0
}

fn default_period() -> Duration {
    Duration::from_secs(24 * 3600)
}

impl Shape {
    /// What is wrong with the shape, naming the field, or `None`.
    pub fn problem(&self) -> Option<String> {
        let whole_minutes = |name: &str, d: Duration| {
            let s = d.as_secs_f64();
            (s < MINUTE || s % MINUTE != 0.0)
                .then(|| format!("{name} must be whole minutes (at least 1m), got {d:?}"))
        };
        let rate = |name: &str, r: f64| {
            (!(r.is_finite() && r > 0.0))
                .then(|| format!("{name} must be a rate above 0 requests/s, got {r}"))
        };
        match *self {
            Shape::Diurnal {
                mean_rps,
                peak_to_trough,
                period,
            } => rate("mean_rps", mean_rps)
                .or_else(|| {
                    (!(peak_to_trough.is_finite() && peak_to_trough >= 1.0)).then(|| {
                        format!("peak_to_trough must be at least 1 (the peak over the trough), got {peak_to_trough}")
                    })
                })
                .or_else(|| whole_minutes("period", period))
                .or_else(|| {
                    (period.as_secs_f64() < 2.0 * MINUTE).then(|| "period must be at least 2m".to_owned())
                }),
            Shape::OnOff { rps, on, off } => rate("rps", rps)
                .or_else(|| whole_minutes("on", on))
                .or_else(|| whole_minutes("off", off)),
        }
    }

    /// Expected requests in each minute of one cycle.
    pub fn per_minute(&self) -> Vec<f64> {
        match *self {
            Shape::Diurnal {
                mean_rps,
                peak_to_trough,
                period,
            } => {
                let minutes = (period.as_secs_f64() / MINUTE).round() as usize;
                // rate(t) = mean · (1 − a·cos(2πt/T)), a = (r − 1)/(r + 1): mean over a period `mean_rps`, peak
                // over trough `r`. Each minute takes the rate at its middle.
                let a = (peak_to_trough - 1.0) / (peak_to_trough + 1.0);
                (0..minutes)
                    .map(|i| {
                        let phase = 2.0 * PI * (i as f64 + 0.5) / minutes as f64;
                        mean_rps * (1.0 - a * phase.cos()) * MINUTE
                    })
                    .collect()
            }
            Shape::OnOff { rps, on, off } => {
                let on = (on.as_secs_f64() / MINUTE).round() as usize;
                let off = (off.as_secs_f64() / MINUTE).round() as usize;
                std::iter::repeat_n(rps * MINUTE, on)
                    .chain(std::iter::repeat_n(0.0, off))
                    .collect()
            }
        }
    }
}

/// Arrivals over `[0, duration)` of `shape`, shaped by `t` (rate, shift, window in the cycle's own time) and
/// tiled, each with a (prompt, output) pair drawn from `tokens`, its prompt times `prompt_scale` (long-context
/// traffic from a chat trace's lengths: Mooncake's published trace averages 7,590 prompt tokens, the Azure
/// conversation trace 1,155), capped so prompt and output fit `max_total` tokens (the model's context).
pub fn synthetic_arrivals(
    shape: &Shape,
    t: &Transform,
    duration: f64,
    tokens: &[(u32, u32)],
    prompt_scale: f64,
    max_total: u32,
    rng: &mut impl rand::Rng,
) -> Result<Vec<Arrival>, String> {
    if let Some(p) = shape.problem() {
        return Err(p);
    }
    if tokens.is_empty() {
        return Err("the token distribution is empty".into());
    }
    if !(prompt_scale.is_finite() && prompt_scale > 0.0) {
        return Err(format!("prompt_scale must be above 0, got {prompt_scale}"));
    }
    step_arrivals(&shape.per_minute(), MINUTE, t, duration, rng, |rng| {
        let (p, o) = tokens[rng.random_range(0..tokens.len())];
        let room = max_total.saturating_sub(o).max(1);
        let scaled = (f64::from(p) * prompt_scale).round().clamp(1.0, f64::from(room));
        (scaled as u32, o)
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use rand::SeedableRng;

    use super::*;

    fn whole() -> Transform {
        Transform {
            window_start: 0.0,
            window_len: None,
            rate: 1.0,
            shift: 0.0,
        }
    }

    #[test]
    fn a_diurnal_day_holds_its_mean_and_its_peak_over_trough() {
        let s = Shape::Diurnal {
            mean_rps: 2.0,
            peak_to_trough: 4.0,
            period: Duration::from_secs(24 * 3600),
        };
        let m = s.per_minute();
        assert_eq!(m.len(), 1440);
        let mean = m.iter().sum::<f64>() / m.len() as f64 / 60.0;
        assert!((mean - 2.0).abs() < 1e-6, "{mean}");
        let (lo, hi) = m
            .iter()
            .fold((f64::MAX, 0.0f64), |(l, h), &x| (l.min(x), h.max(x)));
        assert!((hi / lo - 4.0).abs() < 0.01, "{}", hi / lo);
        // Lowest at the start, highest half a period in.
        assert!(m[0] < m[720] && m[1439] < m[720]);
    }

    #[test]
    fn on_off_is_on_then_silent_and_tiles() {
        let s = Shape::OnOff {
            rps: 1.0,
            on: Duration::from_secs(600),
            off: Duration::from_secs(3000),
        };
        let tokens = [(100, 10)];
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let a = synthetic_arrivals(&s, &whole(), 7200.0, &tokens, 1.0, u32::MAX, &mut rng).unwrap();
        assert!(
            a.iter().all(|a| a.at % 3600.0 < 600.0),
            "every request in an on stretch"
        );
        // 600 expected per on stretch, two stretches.
        assert!((1100..1300).contains(&a.len()), "{}", a.len());
    }

    #[test]
    fn bad_shapes_name_the_field() {
        let bad = [
            (
                Shape::Diurnal {
                    mean_rps: 0.0,
                    peak_to_trough: 2.0,
                    period: Duration::from_secs(3600),
                },
                "mean_rps",
            ),
            (
                Shape::Diurnal {
                    mean_rps: 1.0,
                    peak_to_trough: 0.5,
                    period: Duration::from_secs(3600),
                },
                "peak_to_trough",
            ),
            (
                Shape::OnOff {
                    rps: 1.0,
                    on: Duration::from_secs(90),
                    off: Duration::from_secs(60),
                },
                "on must be whole minutes",
            ),
        ];
        for (s, field) in bad {
            let p = s.problem().unwrap();
            assert!(p.contains(field), "{p}");
        }
    }
}
