//! What scaling to zero would cost in missed objectives, from the model's own traffic: the evidence that lets a
//! model whose cold start is longer than its TTFT objective go to zero anyway, when the requests that would wait
//! through a cold start fit in a budget the policy names (`scaleToZero.coldStartMissBudget`).
//!
//! A warm floor ([`super::joint::WarmFloor`]) is always right for a model that is never idle long, and always
//! costly for one that is idle for hours between bursts: on the 24-hour tools scenario the two tools kept warm
//! all day would have paid 10 and 15 cold starts, about 51 requests over their objective out of 9,341, well
//! inside a 99% attainment goal, and holding them warm cost about a quarter of the run's GPU-hours
//! (`docs/simulator.md`, "Warm floors against an attainment budget").
//!
//! The ledger counts, per controller sync, from the activator's demand alone (so it reads the same whether the
//! model is at zero, warm or serving):
//! - **requests**: the activator's rate times the time since the last sync;
//! - **would-be cold starts**: a request after a spell with no request as long as `idleAfter` (the model would
//!   have been at zero), each missing the objective for the first request and for those arriving during the
//!   start beyond the objective (the rate at the wake times `cold start − objective`).
//!
//! It is counterfactual on purpose: what it counts does not depend on whether the floor was kept, so dropping a
//! floor cannot feed back into the evidence for keeping it. It fails safe: without `MIN_HISTORY` of
//! observations (a controller just restarted, activator data missing) there is no evidence and the floor stays.

use std::collections::VecDeque;
use std::time::Duration;

use super::{Demand, Timestamp};

/// How much history the ledger needs before it can let a floor go: an hour of the model's own traffic, so one
/// quiet morning is not read as a model that is always quiet.
pub const MIN_HISTORY: Duration = Duration::from_secs(3600);

/// How far back the ledger looks: a day, the period of most internal tools' traffic.
pub const WINDOW: Duration = Duration::from_secs(24 * 3600);

/// A sync longer than this after the last counts only this long: a controller that was down does not get to
/// spread the rate it sees now over the time it saw nothing.
const MAX_STEP: Duration = Duration::from_secs(60);

/// At most this many syncs are remembered (a day at a 15 s sync period is 5,760), so a caller ticking fast cannot
/// grow the ledger without limit.
const MAX_SAMPLES: usize = 8192;

/// One sync's counts.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Sample {
    at: Timestamp,
    /// Requests since the previous sync, estimated from the rate.
    requests: f64,
    /// `Some(rate)` when a request arrived after an idle spell of at least `idleAfter`: a cold start the model
    /// would have paid at zero, and the request rate at that moment.
    wake_rate: Option<f64>,
}

/// The model's recent traffic, as scaling to zero would have met it (module docs).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ColdStartLedger {
    samples: VecDeque<Sample>,
    /// The previous sync: when, and the last request the activator had seen then.
    previous: Option<(Timestamp, Timestamp)>,
}

/// What the ledger shows over its window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ColdStartEvidence {
    /// Requests in the window (estimated from the rate).
    pub requests: f64,
    /// Cold starts the model would have paid at zero.
    pub cold_starts: u32,
    /// Requests that would have waited through a cold start beyond the objective.
    pub misses: f64,
    /// How long the window observed covers.
    pub observed: Duration,
}

impl ColdStartEvidence {
    /// The share of requests that would have missed the objective through a cold start (0 with no requests).
    pub fn miss_share(&self) -> f64 {
        if self.requests > 0.0 {
            self.misses / self.requests
        } else {
            0.0
        }
    }
}

impl ColdStartLedger {
    /// Counts one sync's demand. `idle_after` is the policy's scale-to-zero delay. Unknown demand (no activator
    /// data) counts nothing and breaks the chain, so a spell is never measured across a gap in the data.
    pub fn observe(&mut self, demand: &Demand, idle_after: Duration, now: Timestamp) {
        let (Some(rate), Some(last_request)) = (demand.requests_per_second, demand.last_request_at) else {
            self.previous = None;
            return;
        };
        let rate = if rate.is_finite() { rate.max(0.0) } else { 0.0 };
        if let Some((at, _)) = self.previous
            && now <= at
        {
            return; // the same sync twice, or a clock gone back: nothing new to count
        }
        let mut sample = Sample {
            at: now,
            requests: 0.0,
            wake_rate: None,
        };
        if let Some((at, seen)) = self.previous {
            sample.requests = rate * now.since(at).min(MAX_STEP).as_secs_f64();
            // A new request, and at the previous sync the model had been idle long enough to be at zero.
            if last_request > seen && at.since(seen) >= idle_after {
                sample.wake_rate = Some(rate);
            }
        }
        self.previous = Some((now, last_request));
        self.samples.push_back(sample);
        while self.samples.front().is_some_and(|s| !s.at.is_within(WINDOW, now))
            || self.samples.len() > MAX_SAMPLES
        {
            self.samples.pop_front();
        }
    }

    /// The window's evidence for a model whose cold start takes `cold_start` against a `ttft_slo` objective;
    /// `None` until [`MIN_HISTORY`] is observed.
    pub fn evidence(
        &self,
        cold_start: Duration,
        ttft_slo: Duration,
        now: Timestamp,
    ) -> Option<ColdStartEvidence> {
        let first = self.samples.iter().find(|s| s.at.is_within(WINDOW, now))?;
        let observed = now.since(first.at);
        if observed < MIN_HISTORY {
            return None;
        }
        let late = cold_start.saturating_sub(ttft_slo).as_secs_f64();
        let mut e = ColdStartEvidence {
            requests: 0.0,
            cold_starts: 0,
            misses: 0.0,
            observed,
        };
        for s in self.samples.iter().filter(|s| s.at.is_within(WINDOW, now)) {
            e.requests += s.requests;
            if let Some(rate) = s.wake_rate {
                e.cold_starts += 1;
                // The waking request, and those arriving while the start runs past the objective.
                e.misses += 1.0 + rate * late;
            }
        }
        // The waking requests themselves are requests, whatever the rate estimate said.
        e.requests = e.requests.max(f64::from(e.cold_starts));
        Some(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> Timestamp {
        Timestamp::from_millis(secs * 1000)
    }

    fn demand(rate: f64, last: u64) -> Demand {
        Demand {
            requests_per_second: Some(rate),
            last_request_at: Some(at(last)),
            ..Demand::default()
        }
    }

    const IDLE: Duration = Duration::from_secs(300);
    const COLD: Duration = Duration::from_secs(28);
    const SLO: Duration = Duration::from_secs(10);

    /// Two hours at 15 s syncs: steady traffic at 0.2 req/s for the first half hour, idle for an hour, then a
    /// burst at 1 req/s. One would-be cold start (the burst), missing the waking request and 18 s × 1 req/s.
    #[test]
    fn counts_requests_and_the_cold_starts_an_idle_spell_would_cost() {
        let mut l = ColdStartLedger::default();
        let mut last = 0;
        for t in (0..=7200).step_by(15) {
            let (rate, arrived) = match t {
                0..=1800 => (0.2, true),
                5400.. => (1.0, true),
                _ => (0.0, false),
            };
            if arrived {
                last = t;
            }
            l.observe(&demand(rate, last), IDLE, at(t));
        }
        let e = l.evidence(COLD, SLO, at(7200)).unwrap();
        assert_eq!(e.cold_starts, 1);
        assert!((e.misses - 19.0).abs() < 1e-9, "{e:?}");
        // Each sync counts the 15 s before it at the rate it sees: 120 syncs at 0.2 (15 s to 1800 s), 121 at 1.0
        // (5400 s to 7200 s).
        assert!((e.requests - (120.0 * 3.0 + 121.0 * 15.0)).abs() < 1e-6, "{e:?}");
        assert!((e.miss_share() - 19.0 / 2175.0).abs() < 1e-9);
    }

    /// A spell shorter than `idleAfter` is no cold start: the model would still have been up.
    #[test]
    fn a_short_pause_is_not_a_cold_start() {
        let mut l = ColdStartLedger::default();
        let mut last = 0;
        for t in (0..=3900).step_by(15) {
            // Four minutes of silence every ten minutes.
            let busy = t % 600 < 360;
            if busy {
                last = t;
            }
            l.observe(&demand(if busy { 0.5 } else { 0.0 }, last), IDLE, at(t));
        }
        let e = l.evidence(COLD, SLO, at(3900)).unwrap();
        assert_eq!(e.cold_starts, 0);
        assert_eq!(e.misses, 0.0);
    }

    /// No evidence before an hour of history, and a gap in the activator's data restarts nothing but the chain:
    /// an idle spell is never measured across it (it might have held requests nobody counted).
    #[test]
    fn no_evidence_without_history_and_no_spell_across_missing_data() {
        let mut l = ColdStartLedger::default();
        for t in (0..3000).step_by(15) {
            l.observe(&demand(0.1, t), IDLE, at(t));
        }
        assert_eq!(l.evidence(COLD, SLO, at(3000)), None);
        // The activator goes quiet (no data) for 20 minutes, then reports a request long after the last one.
        for t in (3000..4200).step_by(15) {
            l.observe(&Demand::default(), IDLE, at(t));
        }
        l.observe(&demand(0.1, 4200), IDLE, at(4200));
        l.observe(&demand(0.1, 4215), IDLE, at(4215));
        let e = l.evidence(COLD, SLO, at(4215)).unwrap();
        assert_eq!(e.cold_starts, 0, "{e:?}");
    }

    /// The window is a day; the ledger stays bounded however fast it is fed.
    #[test]
    fn forgets_beyond_the_window_and_stays_bounded() {
        let mut l = ColdStartLedger::default();
        // A wake at the start, then two days of steady traffic at 1 s syncs.
        l.observe(&demand(0.0, 0), IDLE, at(1000));
        for t in (1001..1001 + 2 * 86_400).step_by(1) {
            l.observe(&demand(1.0, t), IDLE, at(t));
        }
        assert!(l.samples.len() <= MAX_SAMPLES);
        let now = at(1000 + 2 * 86_400);
        let e = l.evidence(COLD, SLO, now).unwrap();
        assert_eq!(e.cold_starts, 0);
        assert!(e.observed <= WINDOW);
    }
}
