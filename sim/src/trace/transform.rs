//! Shaping one trace into one model's traffic: window, rate multiplier, circular time shift, tiling.
//!
//! - **window**: the part of the trace to use, `[start, start + len)` in the trace's own time. It becomes one
//!   *period* of traffic.
//! - **rate**: a multiplier on the request rate. Below 1 each request is kept with probability `rate`
//!   (thinning). Above 1 the period is superposed with copies of itself, each rotated by a random offset, plus
//!   one thinned copy for the fractional part; copying at the same instants would create bursts the real
//!   traffic never had. For the per-minute Functions trace the count of each minute is multiplied instead.
//! - **shift**: rotates the period by this many seconds (wrapping around), so models built on the same trace
//!   peak at different times.
//! - the period is **tiled** to fill the simulated duration when it is shorter.
//!
//! Everything draws from the caller's seeded generator, so the same seed gives the same arrivals.

use rand::RngExt;

use super::{Arrival, FunctionRow, LlmTrace};

/// How a trace becomes one model's arrivals.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Transform {
    /// Start of the window in the trace's own seconds.
    pub window_start: f64,
    /// Length of the window in seconds; `None` runs to the end of the trace.
    pub window_len: Option<f64>,
    /// Request-rate multiplier (> 0).
    pub rate: f64,
    /// Circular shift of the window in seconds (≥ 0).
    pub shift: f64,
}

impl Default for Transform {
    fn default() -> Self {
        Transform {
            window_start: 0.0,
            window_len: None,
            rate: 1.0,
            shift: 0.0,
        }
    }
}

impl Transform {
    fn check(&self) -> Result<(), String> {
        if !(self.rate.is_finite() && self.rate > 0.0) {
            return Err(format!("rate must be a number above 0, got {}", self.rate));
        }
        if !(self.shift.is_finite() && self.shift >= 0.0) {
            return Err(format!(
                "shift must be a duration of 0 or more, got {}s",
                self.shift
            ));
        }
        if !(self.window_start.is_finite() && self.window_start >= 0.0) {
            return Err(format!(
                "window start must be 0 or more, got {}s",
                self.window_start
            ));
        }
        if let Some(len) = self.window_len
            && !(len.is_finite() && len > 0.0)
        {
            return Err(format!("window length must be above 0, got {len}s"));
        }
        Ok(())
    }
}

/// Arrivals over `[0, duration)` from the Azure LLM trace.
pub fn llm_arrivals(
    trace: &LlmTrace,
    t: &Transform,
    duration: f64,
    rng: &mut impl rand::Rng,
) -> Result<Vec<Arrival>, String> {
    t.check()?;
    let span = trace.span_secs();
    if t.window_start > span {
        return Err(format!(
            "window starts at {}s but the trace lasts only {span:.0}s",
            t.window_start
        ));
    }
    let (base, period) = match t.window_len {
        Some(len) => {
            let end = t.window_start + len;
            let base: Vec<Arrival> = trace
                .requests
                .iter()
                .filter(|r| r.at >= t.window_start && r.at < end)
                .map(|r| shifted(r, t.window_start))
                .collect();
            (base, len)
        }
        None => {
            // To the end of the trace, last request included. The period adds one mean gap after the last
            // request, so tiling keeps the trace's rate instead of putting two requests at the seam.
            let base: Vec<Arrival> = trace
                .requests
                .iter()
                .filter(|r| r.at >= t.window_start)
                .map(|r| shifted(r, t.window_start))
                .collect();
            let span = span - t.window_start;
            let n = base.len() as f64;
            let period = if n > 1.0 { span * n / (n - 1.0) } else { 1.0 };
            (base, period.max(1e-3))
        }
    };
    if base.is_empty() {
        return Err(format!(
            "no requests in the window starting at {}s of the trace",
            t.window_start
        ));
    }
    let whole = t.rate.floor() as u64;
    let frac = t.rate - t.rate.floor();
    let mut one_period = Vec::with_capacity((base.len() as f64 * t.rate) as usize + 1);
    for copy in 0..whole {
        let offset = if copy == 0 {
            0.0
        } else {
            rng.random::<f64>() * period
        };
        one_period.extend(base.iter().map(|a| Arrival {
            at: a.at + offset,
            ..*a
        }));
    }
    if frac > 0.0 {
        let offset = if whole == 0 {
            0.0
        } else {
            rng.random::<f64>() * period
        };
        for a in &base {
            if rng.random::<f64>() < frac {
                one_period.push(Arrival {
                    at: a.at + offset,
                    ..*a
                });
            }
        }
    }
    Ok(rotate_and_tile(one_period, period, t.shift, duration))
}

fn shifted(r: &crate::trace::LlmRequest, start: f64) -> Arrival {
    Arrival {
        at: r.at - start,
        prompt_tokens: r.prompt_tokens,
        output_tokens: r.output_tokens,
    }
}

/// Arrivals over `[0, duration)` from one Azure Functions row: the minute counts (times `rate`, rounded at
/// random so the expectation is exact) placed uniformly at random within their minute — a Poisson process
/// conditioned on the count — each with a (prompt, output) pair drawn from `tokens`.
pub fn function_arrivals(
    row: &FunctionRow,
    t: &Transform,
    duration: f64,
    tokens: &[(u32, u32)],
    rng: &mut impl rand::Rng,
) -> Result<Vec<Arrival>, String> {
    if tokens.is_empty() {
        return Err("the token distribution is empty".into());
    }
    step_arrivals(&row.per_minute, 60.0, t, duration, rng, |rng| {
        tokens[rng.random_range(0..tokens.len())]
    })
}

/// Arrivals over `[0, duration)` from request counts per step of `step` seconds (a per-minute trace, or what
/// Prometheus counted per query step): each step's count (times `rate`, rounded at random so the expectation is
/// exact) placed uniformly at random within its step — a Poisson process conditioned on the count, which is all
/// a count says about when within the step requests came — each with the (prompt, output) pair `draw` gives.
/// The window is whole steps. One path for both sources, so the same seed draws the same way for both.
pub fn step_arrivals<R: rand::Rng, C: Copy + Into<f64>>(
    per_step: &[C],
    step: f64,
    t: &Transform,
    duration: f64,
    rng: &mut R,
    mut draw: impl FnMut(&mut R) -> (u32, u32),
) -> Result<Vec<Arrival>, String> {
    t.check()?;
    if !(step.is_finite() && step > 0.0) {
        return Err(format!("step must be above 0, got {step}s"));
    }
    let steps_total = per_step.len();
    let first = (t.window_start / step).floor() as usize;
    if first >= steps_total {
        return Err(format!(
            "window starts at step {} but the trace has only {steps_total} steps of {step}s",
            first + 1
        ));
    }
    let steps = match t.window_len {
        Some(len) => ((len / step).ceil() as usize).max(1),
        None => steps_total - first,
    };
    if first + steps > steps_total {
        return Err(format!(
            "window of {steps} steps from step {} runs past the end of the trace ({steps_total} steps of {step}s)",
            first + 1
        ));
    }
    let period = steps as f64 * step;
    let mut one_period = Vec::new();
    for (i, &count) in per_step[first..first + steps].iter().enumerate() {
        let expected = count.into() * t.rate;
        let mut n = expected.floor() as u64;
        if rng.random::<f64>() < expected - expected.floor() {
            n += 1;
        }
        for _ in 0..n {
            let at = (i as f64 + rng.random::<f64>()) * step;
            let (prompt_tokens, output_tokens) = draw(rng);
            one_period.push(Arrival {
                at,
                prompt_tokens,
                output_tokens,
            });
        }
    }
    Ok(rotate_and_tile(one_period, period, t.shift, duration))
}

/// Wraps every arrival into `[0, period)` after adding `shift`, repeats the period until `duration`, sorts.
fn rotate_and_tile(one_period: Vec<Arrival>, period: f64, shift: f64, duration: f64) -> Vec<Arrival> {
    let mut rotated: Vec<Arrival> = one_period
        .into_iter()
        .map(|a| Arrival {
            at: (a.at + shift).rem_euclid(period),
            ..a
        })
        .collect();
    rotated.sort_by(|a, b| a.at.total_cmp(&b.at));
    let mut out = Vec::new();
    let mut base = 0.0;
    while base < duration {
        for a in &rotated {
            let at = base + a.at;
            if at >= duration {
                break;
            }
            out.push(Arrival { at, ..*a });
        }
        base += period;
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::trace::LlmRequest;

    fn trace(n: usize, gap: f64) -> LlmTrace {
        LlmTrace {
            requests: (0..n)
                .map(|i| LlmRequest {
                    at: i as f64 * gap,
                    prompt_tokens: i as u32 + 1,
                    output_tokens: 7,
                })
                .collect(),
        }
    }

    #[test]
    fn identity_keeps_every_request() {
        let tr = trace(10, 1.0);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let a = llm_arrivals(&tr, &Transform::default(), 10.0, &mut rng).unwrap();
        assert_eq!(a.len(), 10);
        assert_eq!(a[3].at, 3.0);
        assert_eq!(a[3].prompt_tokens, 4);
    }

    #[test]
    fn shift_rotates_within_the_period() {
        let tr = trace(10, 1.0);
        let t = Transform {
            shift: 2.0,
            ..Transform::default()
        };
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let a = llm_arrivals(&tr, &t, 10.0, &mut rng).unwrap();
        // Requests at 0..=9 s, period 10 s: the one at 8 s wraps to (8 + 2) mod 10 = 0 s, the one at 9 s to
        // 1 s, and the one at 0 s moves to 2 s.
        assert_eq!(a.len(), 10);
        assert_eq!(a[0].at, 0.0);
        assert_eq!(a[0].prompt_tokens, 9);
        assert_eq!(a[1].at, 1.0);
        assert_eq!(a[1].prompt_tokens, 10);
        assert_eq!(a[2].prompt_tokens, 1);
    }

    #[test]
    fn tiles_a_short_period() {
        let tr = trace(3, 1.0); // requests at 0, 1, 2 s: period 3 s
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let a = llm_arrivals(&tr, &Transform::default(), 7.5, &mut rng).unwrap();
        let at: Vec<f64> = a.iter().map(|x| x.at).collect();
        assert_eq!(at, vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
        // A window cuts the trace: [1 s, 3 s) holds the requests at 1 and 2 s, period 2 s.
        let t = Transform {
            window_start: 1.0,
            window_len: Some(2.0),
            ..Transform::default()
        };
        let a = llm_arrivals(&tr, &t, 4.0, &mut rng).unwrap();
        let at: Vec<f64> = a.iter().map(|x| x.at).collect();
        assert_eq!(at, vec![0.0, 1.0, 2.0, 3.0]);
    }

    #[test]
    fn function_counts_land_in_their_minute() {
        let row = FunctionRow {
            hash_function: "f".into(),
            per_minute: vec![0, 3, 0, 2],
        };
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let a = function_arrivals(&row, &Transform::default(), 240.0, &[(10, 5)], &mut rng).unwrap();
        assert_eq!(a.len(), 5);
        assert!(a[..3].iter().all(|x| (60.0..120.0).contains(&x.at)));
        assert!(a[3..].iter().all(|x| (180.0..240.0).contains(&x.at)));
        assert!(a.iter().all(|x| x.prompt_tokens == 10 && x.output_tokens == 5));
    }

    #[test]
    fn bad_transforms_are_errors() {
        let tr = trace(4, 1.0);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for t in [
            Transform {
                rate: 0.0,
                ..Transform::default()
            },
            Transform {
                rate: f64::NAN,
                ..Transform::default()
            },
            Transform {
                shift: -1.0,
                ..Transform::default()
            },
            Transform {
                window_start: 100.0,
                ..Transform::default()
            },
        ] {
            assert!(llm_arrivals(&tr, &t, 10.0, &mut rng).is_err(), "{t:?}");
        }
        let row = FunctionRow {
            hash_function: "f".into(),
            per_minute: vec![1, 1],
        };
        let t = Transform {
            window_start: 60.0,
            window_len: Some(120.0),
            ..Transform::default()
        };
        assert!(function_arrivals(&row, &t, 10.0, &[(1, 1)], &mut rng).is_err());
    }

    proptest! {
        /// Arrivals are sorted, inside the duration, and their expected count follows the rate.
        #[test]
        fn arrivals_sorted_and_bounded(rate in 0.1f64..4.0, shift in 0.0f64..500.0, seed in 0u64..1000) {
            let tr = trace(200, 0.5);
            let t = Transform { rate, shift, ..Transform::default() };
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let a = llm_arrivals(&tr, &t, 99.5, &mut rng).unwrap();
            prop_assert!(a.windows(2).all(|w| w[0].at <= w[1].at));
            prop_assert!(a.iter().all(|x| x.at >= 0.0 && x.at < 99.5));
            let expect = 199.0 * rate; // 200 requests per 100 s period, 99.5 s simulated
            prop_assert!((a.len() as f64 - expect).abs() <= 4.0 * expect.sqrt() + 2.0,
                "{} arrivals for rate {rate}", a.len());
        }

        /// The same seed gives the same arrivals.
        #[test]
        fn deterministic(seed in 0u64..1000, rate in 0.1f64..3.0) {
            let row = FunctionRow { hash_function: "f".into(), per_minute: vec![3, 0, 7, 1] };
            let t = Transform { rate, ..Transform::default() };
            let a = function_arrivals(&row, &t, 1000.0, &[(1, 2), (3, 4)], &mut ChaCha8Rng::seed_from_u64(seed)).unwrap();
            let b = function_arrivals(&row, &t, 1000.0, &[(1, 2), (3, 4)], &mut ChaCha8Rng::seed_from_u64(seed)).unwrap();
            prop_assert_eq!(a, b);
        }
    }
}
