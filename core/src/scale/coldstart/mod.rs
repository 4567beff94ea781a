//! What scaling to zero would cost in missed objectives, from the model's own traffic: the evidence that lets a
//! model whose cold start is longer than its TTFT objective go to zero anyway, when the requests that would wait
//! through a cold start fit in a budget the policy names (`scaleToZero.coldStartMissBudget`).
//!
//! A warm floor ([`super::joint::WarmFloor`]) is always right for a model that is never idle long, and always
//! costly for one that is idle for hours between bursts: on the 24-hour tools scenario the two tools kept warm
//! all day would have paid 10 and 15 cold starts, about 51 requests over their objective out of 9,341, well
//! inside a 99% attainment goal, and holding them warm cost about a quarter of the run's GPU-hours
//! (`docs/simulator-experiments.md`, "Warm floors against a miss budget").
//!
//! The ledger counts, per controller sync, from the activator's demand alone (so it reads the same whether the
//! model is at zero, warm or serving):
//! - **requests**: what the activators' request counters gained since the last sync;
//! - **would-be cold starts**: a request after a spell with no request as long as `idleAfter` (the model would
//!   have been at zero), each missing the objective for every request counted from that sync until the start
//!   would have ended. Those that arrive in its last `objective` seconds wait less than the objective for the
//!   start itself, but then queue behind the burst the start releases at once onto one fresh replica: on the
//!   24-hour tools scenario, counting only the requests for which the start alone runs past the objective gave
//!   27 misses for report-summarizer's day where the simulated run missed 35; counting the whole start gives 35
//!   (`docs/simulator-experiments.md`, "Warm floors against a miss budget"). Counting from the sync rather than from the
//!   first request errs towards more misses.
//!
//! It is counterfactual on purpose: what it counts does not depend on whether the floor was kept, so dropping a
//! floor cannot feed back into the evidence for keeping it. It fails safe: without `MIN_HISTORY` of
//! observations (a budget just set, activator data missing) there is no evidence and the floor stays. A restarted
//! controller resumes from a compact copy ([`checkpoint`]) rather than starting that hour again.
//!
//! Models may also share one budget across a group (`scaleToZero.coldStartBudgetGroup`, [`group`]): the group's
//! combined requests set the allowance, spent on the floors that would sit idle longest per missed request.

use std::collections::VecDeque;
use std::time::Duration;

use super::{Demand, Timestamp};

pub mod checkpoint;
pub mod group;
pub use checkpoint::{CheckpointError, CheckpointSample, LedgerCheckpoint};
pub use group::{BudgetClaim, GroupSpend};

/// How much history the ledger needs before it can let a floor go: an hour of the model's own traffic, so one
/// quiet morning is not read as a model that is always quiet.
pub const MIN_HISTORY: Duration = Duration::from_secs(3600);

/// How far back the ledger looks: a day, the period of most internal tools' traffic.
pub const WINDOW: Duration = Duration::from_secs(24 * 3600);

/// The largest `coldStartMissBudget`: half of the requests.
pub const MAX_MISS_BUDGET: f64 = 0.5;

/// Whether `b` is a share of requests a policy may name as its `coldStartMissBudget`: in `[0, MAX_MISS_BUDGET]`.
pub fn is_miss_budget(b: f64) -> bool {
    b.is_finite() && (0.0..=MAX_MISS_BUDGET).contains(&b)
}

/// Whether `g` can name a `coldStartBudgetGroup`: what a label value allows, lowercase (1–63 letters, digits or
/// '-', starting and ending with a letter or digit).
pub fn is_group_name(g: &str) -> bool {
    let b = g.as_bytes();
    let ok = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    (1..=63).contains(&b.len())
        && b.iter().all(|c| ok(c) || *c == b'-')
        && b.first().is_some_and(ok)
        && b.last().is_some_and(ok)
}

/// At most this many syncs are remembered (a day at a 15 s sync period is 5,760), so a caller ticking fast cannot
/// grow the ledger without limit.
const MAX_SAMPLES: usize = 8192;

/// One sync's counts.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Sample {
    at: Timestamp,
    /// Requests since the previous sync.
    requests: u64,
    /// Requests the ledger counted up to and including this sync: a window's requests are two lookups.
    counted: u64,
    /// A request arrived after an idle spell of at least `idleAfter`: a cold start the model would have paid at
    /// zero.
    wake: bool,
}

/// The model's recent traffic, as scaling to zero would have met it (module docs).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ColdStartLedger {
    /// Oldest first, at strictly increasing times.
    samples: VecDeque<Sample>,
    /// The samples that are wakes, by time, each with how long the idle spell before it would have kept the model
    /// at zero: evidence visits these, not every sync of the day.
    wakes: VecDeque<(Timestamp, Duration)>,
    /// Requests counted since the ledger began (never reset, so `Sample::counted` differences are exact).
    counted: u64,
    /// The previous sync: when, the last request the activators had seen then, and their request counters.
    previous: Option<(Timestamp, Timestamp, u64)>,
    /// Restored from a copy ([`checkpoint`]) and not fed since: the next sync may follow a gap of any length.
    resumed: bool,
}

/// What the ledger shows over its window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ColdStartEvidence {
    /// Requests in the window.
    pub requests: u64,
    /// Cold starts the model would have paid at zero.
    pub cold_starts: u32,
    /// Requests that would have missed the objective through a cold start: those that arrived while it ran.
    pub misses: u64,
    /// How long the window observed covers.
    pub observed: Duration,
    /// How long the model would have spent at zero over the window: each idle spell before a wake, less
    /// `idleAfter` (what going to zero saves; a spell still running now is not counted).
    pub at_zero: Duration,
}

impl ColdStartEvidence {
    /// The share of requests that would have missed the objective through a cold start (0 with no requests).
    pub fn miss_share(&self) -> f64 {
        if self.requests > 0 {
            self.misses as f64 / self.requests as f64
        } else {
            0.0
        }
    }
}

impl ColdStartLedger {
    /// Counts one sync's demand. `idle_after` is the policy's scale-to-zero delay. Unknown demand (no activator
    /// data, or no counter) counts nothing and breaks the chain, so a spell is never measured across a gap in the
    /// data. A counter that went back (an activator restarted) counts no request for that sync: fewer requests
    /// only make the misses' share larger.
    pub fn observe(&mut self, demand: &Demand, idle_after: Duration, now: Timestamp) {
        let (Some(total), Some(last_request)) = (demand.requests_total, demand.last_request_at) else {
            self.previous = None;
            self.resumed = false;
            return;
        };
        if let Some((at, _, _)) = self.previous
            && now <= at
        {
            return; // the same sync twice, or a clock gone back: nothing new to count
        }
        let resumed = std::mem::take(&mut self.resumed);
        let (requests, wake) = match self.previous {
            // A new request, and at the previous sync the model had been idle long enough to be at zero (for as
            // long as the spell ran past `idle_after`, measured to the previous sync: the shorter, never longer).
            // Resumed from a copy, the previous sync may be long ago and the gap's requests spread in any way: the
            // spell is tested to now, so a wake in the gap is counted, with every request of the gap among its
            // misses ([`checkpoint`]: a gap adds misses, never hides them).
            Some((at, seen, counted)) => {
                let spell_end = if resumed { now } else { at };
                (
                    total.saturating_sub(counted),
                    (last_request > seen && spell_end.since(seen) >= idle_after)
                        .then(|| at.since(seen).saturating_sub(idle_after)),
                )
            }
            None => (0, None),
        };
        self.counted = self.counted.saturating_add(requests);
        self.previous = Some((now, last_request, total));
        if let Some(at_zero) = wake {
            self.wakes.push_back((now, at_zero));
        }
        self.samples.push_back(Sample {
            at: now,
            requests,
            counted: self.counted,
            wake: wake.is_some(),
        });
        while self.samples.front().is_some_and(|s| !s.at.is_within(WINDOW, now))
            || self.samples.len() > MAX_SAMPLES
        {
            if self.samples.pop_front().is_some_and(|s| s.wake) {
                self.wakes.pop_front();
            }
        }
    }

    /// The window's evidence for a model whose cold start takes `cold_start` (longer than its objective: the
    /// caller asks only then); `None` until [`MIN_HISTORY`] is observed.
    pub fn evidence(&self, cold_start: Duration, now: Timestamp) -> Option<ColdStartEvidence> {
        // Samples are in time order: the window is a suffix, found by bisection.
        let start = self.samples.partition_point(|s| !s.at.is_within(WINDOW, now));
        let first = self.samples.get(start)?;
        let last = self.samples.back()?;
        let observed = now.since(first.at);
        if observed < MIN_HISTORY {
            return None;
        }
        // Requests counted over samples `from..=to`.
        let between = |from: &Sample, to: &Sample| to.counted - (from.counted - from.requests);
        let mut e = ColdStartEvidence {
            requests: between(first, last),
            cold_starts: 0,
            misses: 0,
            observed,
            at_zero: Duration::ZERO,
        };
        for &(wake, at_zero) in self.wakes.iter().filter(|(w, _)| w.is_within(WINDOW, now)) {
            let i = self.samples.partition_point(|s| s.at < wake);
            // The waking sync's requests, and those of the syncs while the start would still run (module docs);
            // at least the waking request.
            let j = self.samples.partition_point(|s| s.at <= wake.plus(cold_start));
            if let (Some(from), Some(to)) = (
                self.samples.get(i),
                j.checked_sub(1).and_then(|j| self.samples.get(j)),
            ) {
                e.cold_starts += 1;
                e.misses += between(from, to).max(1);
                e.at_zero += at_zero;
            }
        }
        e.requests = e.requests.max(u64::from(e.cold_starts));
        Some(e)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// `secs` after the epoch (also read by [`super::checkpoint`]'s tests).
    pub(super) fn at(secs: u64) -> Timestamp {
        Timestamp::from_millis(secs * 1000)
    }

    /// What the activators say: `total` requests so far, the last at `last` s.
    pub(super) fn demand(total: u64, last: u64) -> Demand {
        Demand {
            requests_total: Some(total),
            last_request_at: Some(at(last)),
            ..Demand::default()
        }
    }

    pub(super) const IDLE: Duration = Duration::from_secs(300);
    pub(super) const COLD: Duration = Duration::from_secs(28);

    /// Syncs every 15 s from 0 to `end`, `per_sync(t)` requests arriving in the 15 s before the sync at `t`.
    fn feed(l: &mut ColdStartLedger, end: u64, per_sync: impl Fn(u64) -> u64) {
        let (mut total, mut last) = (0, 0);
        for t in (0..=end).step_by(15) {
            let n = if t == 0 { 0 } else { per_sync(t) };
            if n > 0 {
                total += n;
                last = t;
            }
            l.observe(&demand(total, last), IDLE, at(t));
        }
    }

    /// Two hours: 1 request every 5 s for the first half hour, idle for an hour, then a burst at 1 request/s.
    /// One would-be cold start (the burst): the waking sync's 15 requests and the next sync's 15 (the 28 s start
    /// reaches into it) miss.
    #[test]
    fn counts_requests_and_the_cold_starts_an_idle_spell_would_cost() {
        let mut l = ColdStartLedger::default();
        feed(&mut l, 7200, |t| match t {
            0..=1800 => 3,
            5400.. => 15,
            _ => 0,
        });
        let e = l.evidence(COLD, at(7200)).unwrap();
        assert_eq!(e.cold_starts, 1);
        assert_eq!(e.misses, 30, "{e:?}");
        // A 60 s start: every request counted until it would have ended misses, those of the syncs at 5,400 s to
        // 5,460 s, though the last ones would have waited less than a 10 s objective for the start itself (they
        // queue behind the burst it releases).
        assert_eq!(l.evidence(Duration::from_secs(60), at(7200)).unwrap().misses, 75);
        // At zero from 300 s after the last request (1,800 s) to the sync before the burst (5,385 s).
        assert_eq!(e.at_zero, Duration::from_secs(5385 - 1800 - 300), "{e:?}");
        // 120 syncs of 3 requests, 121 of 15.
        assert_eq!(e.requests, 120 * 3 + 121 * 15, "{e:?}");
        assert!((e.miss_share() - 30.0 / 2175.0).abs() < 1e-12);
    }

    /// A spell shorter than `idleAfter` is no cold start: the model would still have been up.
    #[test]
    fn a_short_pause_is_not_a_cold_start() {
        let mut l = ColdStartLedger::default();
        // Four minutes of silence every ten minutes.
        feed(&mut l, 3900, |t| if t % 600 < 360 { 15 } else { 0 });
        let e = l.evidence(COLD, at(3900)).unwrap();
        assert_eq!(e.cold_starts, 0);
        assert_eq!(e.misses, 0);
        assert!(e.requests > 0);
    }

    /// No evidence before an hour of history; a gap in the activator's data breaks the chain, so an idle spell is
    /// never measured across it (it might have held requests nobody counted); a counter that went back (an
    /// activator restarted) counts nothing for that sync.
    #[test]
    fn no_evidence_without_history_no_spell_across_missing_data_no_count_across_a_restart() {
        let mut l = ColdStartLedger::default();
        for t in (0..3000).step_by(15) {
            l.observe(&demand(t, t), IDLE, at(t));
        }
        assert_eq!(l.evidence(COLD, at(3000)), None);
        for t in (3000..4200).step_by(15) {
            l.observe(&Demand::default(), IDLE, at(t));
        }
        l.observe(&demand(4200, 4200), IDLE, at(4200));
        l.observe(&demand(4215, 4215), IDLE, at(4215));
        // The activator restarts: its counter starts again from zero.
        l.observe(&demand(10, 4230), IDLE, at(4230));
        l.observe(&demand(25, 4245), IDLE, at(4245));
        let e = l.evidence(COLD, at(4245)).unwrap();
        assert_eq!(e.cold_starts, 0, "{e:?}");
        // 199 syncs of 15 before the gap, then 15 and 15 after it; nothing for the restart.
        assert_eq!(e.requests, 199 * 15 + 15 + 15, "{e:?}");
    }

    /// The bisections give what a scan of every sync in the window gives, on two days of bursty traffic (idle
    /// spells of every length, 7 s to 60 s between syncs) and at every hour.
    #[test]
    fn evidence_matches_a_plain_scan() {
        let scan = |l: &ColdStartLedger, late: Duration, now: Timestamp| {
            let w: Vec<&Sample> = l.samples.iter().filter(|s| s.at.is_within(WINDOW, now)).collect();
            let mut misses = 0;
            let mut starts = 0;
            for (i, s) in w.iter().enumerate().filter(|(_, s)| s.wake) {
                starts += 1;
                let during: u64 = w[i..]
                    .iter()
                    .take_while(|t| t.at <= s.at.plus(late))
                    .map(|t| t.requests)
                    .sum();
                misses += during.max(1);
            }
            let requests: u64 = w.iter().map(|s| s.requests).sum();
            (requests.max(starts), starts as u32, misses)
        };
        let mut l = ColdStartLedger::default();
        let (mut t, mut total, mut last) = (0u64, 0u64, 0u64);
        // A deterministic pseudo-random walk (no RNG crate in core's tests).
        let mut x: u64 = 12_345;
        let mut next = |m: u64| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (x >> 33) % m
        };
        let mut checked = 0;
        while t < 2 * 86_400 {
            t += 7 + next(54);
            let busy = (t / 1800) % 3 != 1 && next(4) != 0;
            if busy {
                total += 1 + next(20);
                last = t;
            }
            l.observe(&demand(total, last), IDLE, at(t));
            if t / 3600 != (t - 1) / 3600 || next(50) == 0 {
                let now = at(t);
                if let Some(e) = l.evidence(COLD, now) {
                    let (requests, starts, misses) = scan(&l, COLD, now);
                    assert_eq!(
                        (e.requests, e.cold_starts, e.misses),
                        (requests, starts, misses),
                        "at {t}"
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked > 40, "{checked}");
    }

    /// The window is a day; the ledger stays bounded however fast it is fed.
    #[test]
    fn forgets_beyond_the_window_and_stays_bounded() {
        let mut l = ColdStartLedger::default();
        // A wake at the start, then two days of steady traffic at 1 s syncs.
        l.observe(&demand(0, 0), IDLE, at(1000));
        for t in 1001..1001 + 2 * 86_400 {
            l.observe(&demand(t, t), IDLE, at(t));
        }
        assert!(l.samples.len() <= MAX_SAMPLES);
        let e = l.evidence(COLD, at(1000 + 2 * 86_400)).unwrap();
        assert_eq!(e.cold_starts, 0);
        assert!(e.observed <= WINDOW);
    }
}
