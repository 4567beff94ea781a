//! A compact copy of a model's [`ColdStartLedger`], so the day of evidence survives the controller that counted
//! it. The controller keeps the ledger in memory; without a copy, a restart or a new leader starts every ledger
//! empty, and each model with a `coldStartMissBudget` goes back to its warm floor for [`MIN_HISTORY`] (an hour of
//! a GPU per model, on every upgrade). The controller writes the copy into the InferenceAutoscaler's status and
//! restores it when it first meets a model it holds no state for.
//!
//! What is kept, and why it reads the same:
//! - Every wake, with the samples that a cold start of up to `exact_for` after it reaches (the syncs the
//!   evidence counts as its misses), exactly.
//! - Everything else merged into buckets of at most [`BUCKET`], each stamped with its *first* sync. The evidence
//!   reads other samples only through the window's requests, which a bucket keeps; a bucket that straddles the
//!   window's start drops out whole when its first sync leaves the window, so a restored ledger may count a few
//!   minutes fewer requests, never more. A cold start longer than `exact_for` reaches buckets whose first sync
//!   it covers and counts all their requests: more misses, never fewer.
//! - At most [`MAX_SAMPLES`] samples, the newest: a shorter window of the same traffic.
//!
//! A restored ledger resumes from the copy's last sync. The counters say how many requests arrived while no
//! controller counted, but not how they were spread: if any arrived, the first sync after the gap is a wake
//! whenever the model had been without requests for `idleAfter` by *then* (measured to now rather than to the
//! previous sync), and every request of the gap counts as one of its misses. So a gap adds misses, never hides
//! them: missing data never lets a floor go.
//!
//! Pure, like the rest of `core`: the controller (`autoscaler::controller::reconcile`) does the reading and the
//! writing.

use std::time::Duration;

#[cfg(doc)]
use super::MIN_HISTORY;
use super::{ColdStartLedger, Sample, WINDOW};
use crate::scale::Timestamp;

/// Samples outside any wake's reach are merged into buckets of at most this span.
pub const BUCKET: Duration = Duration::from_secs(300);

/// How often, at most, a copy is worth taking ([`crate::scale::ScaleState::copy_due`]).
pub const COPY_EVERY: Duration = Duration::from_secs(60);

/// A copy taken up to this long after `now` is read anyway: the controller that wrote it ran on another node,
/// whose clock may be a little ahead (the syncs then resume once this clock passes the copy's).
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(60);

/// A copy holds at most this many samples (the newest). A day of steady traffic is 288 buckets; each wake adds
/// the few syncs its cold start spans.
pub const MAX_SAMPLES: usize = 1024;

/// One sync, or a bucket of syncs, in a [`LedgerCheckpoint`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointSample {
    /// The sync (a bucket's first).
    pub at: Timestamp,
    /// Requests counted at it (a bucket's sum).
    pub requests: u64,
    /// Set on a wake: how long the idle spell before it would have kept the model at zero.
    pub at_zero: Option<Duration>,
}

/// What a [`ColdStartLedger`] needs to resume: its samples, compacted, and the last sync it counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerCheckpoint {
    /// The last sync counted.
    pub taken_at: Timestamp,
    /// The last request the activators had seen at that sync.
    pub last_request_at: Timestamp,
    /// The activators' request counters, added up, at that sync.
    pub requests_total: u64,
    /// The last cold start the controller measured: a model at zero has no pod to measure it again.
    pub cold_start: Option<Duration>,
    /// Oldest first, at strictly increasing times, none after `taken_at`.
    pub samples: Vec<CheckpointSample>,
}

/// Why a copy cannot be restored. The ledger then starts empty (the warm floors hold for an hour): safe.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    /// Samples out of order, or after the copy was taken: not a copy this code wrote.
    #[error("the samples are not in increasing time order up to the copy's last sync ({0})")]
    OutOfOrder(usize),
    /// More samples than a copy holds.
    #[error("{0} samples, more than the {MAX_SAMPLES} a copy holds")]
    TooLong(usize),
    /// Taken more than [`MAX_CLOCK_SKEW`] after `now`: the clocks of the controller that wrote it and this one
    /// disagree by more than nodes' clocks do.
    #[error(
        "the copy was taken {0:?} after now, more than the {MAX_CLOCK_SKEW:?} two nodes' clocks may disagree"
    )]
    FromTheFuture(Duration),
}

impl ColdStartLedger {
    /// The ledger's compact copy at `now` (module docs): samples within a day of `now`, exact for cold starts up to
    /// `exact_for`. `None` before the first sync was counted, or after the data broke (nothing to resume from).
    /// The copy's `cold_start` is left unset: [`crate::scale::ScaleState::checkpoint`] fills it.
    pub fn checkpoint(&self, exact_for: Duration, now: Timestamp) -> Option<LedgerCheckpoint> {
        let (taken_at, last_request_at, requests_total) = self.previous?;
        let start = self.samples.partition_point(|s| !s.at.is_within(WINDOW, now));
        let mut samples: Vec<CheckpointSample> = Vec::new();
        // Until when the last wake's cold start reaches, and whether the last entry pushed is exact (a wake or a
        // sample in its reach: it takes no other sample) or a bucket still open.
        let mut reach: Option<Timestamp> = None;
        let mut last_exact = true;
        let mut wakes = self.wakes.iter().peekable();
        for s in self.samples.iter().skip(start) {
            if s.wake {
                // `wakes` holds one entry per wake sample, in order; skip those before the window.
                while wakes.next_if(|(w, _)| *w < s.at).is_some() {}
                let at_zero = wakes
                    .next_if(|(w, _)| *w == s.at)
                    .map_or(Duration::ZERO, |(_, z)| *z);
                reach = Some(s.at.plus(exact_for));
                samples.push(CheckpointSample {
                    at: s.at,
                    requests: s.requests,
                    at_zero: Some(at_zero),
                });
                last_exact = true;
                continue;
            }
            let exact = reach.is_some_and(|r| s.at <= r);
            match samples.last_mut() {
                Some(b) if !exact && !last_exact && s.at.since(b.at) < BUCKET => b.requests += s.requests,
                _ => samples.push(CheckpointSample {
                    at: s.at,
                    requests: s.requests,
                    at_zero: None,
                }),
            }
            last_exact = exact;
        }
        if samples.len() > MAX_SAMPLES {
            samples.drain(..samples.len() - MAX_SAMPLES);
        }
        Some(LedgerCheckpoint {
            taken_at,
            last_request_at,
            requests_total,
            cold_start: None,
            samples,
        })
    }

    /// The last sync counted and the activators' request counters then: what a copy taken now would say it covers
    /// (a caller deciding whether its kept copy is out of date need not take one). `None` as for [`Self::checkpoint`].
    pub fn last_sync(&self) -> Option<(Timestamp, u64)> {
        self.previous.map(|(at, _, total)| (at, total))
    }

    /// The ledger a copy resumes (module docs). `now` only checks the copy against this controller's clock.
    pub fn restore(copy: &LedgerCheckpoint, now: Timestamp) -> Result<Self, CheckpointError> {
        if copy.samples.len() > MAX_SAMPLES {
            return Err(CheckpointError::TooLong(copy.samples.len()));
        }
        if copy.taken_at > now.plus(MAX_CLOCK_SKEW) {
            return Err(CheckpointError::FromTheFuture(copy.taken_at.since(now)));
        }
        let mut ledger = ColdStartLedger::default();
        let mut previous: Option<Timestamp> = None;
        for (i, s) in copy.samples.iter().enumerate() {
            if previous.is_some_and(|p| s.at <= p) || s.at > copy.taken_at {
                return Err(CheckpointError::OutOfOrder(i));
            }
            previous = Some(s.at);
            ledger.counted = ledger.counted.saturating_add(s.requests);
            ledger.samples.push_back(Sample {
                at: s.at,
                requests: s.requests,
                counted: ledger.counted,
                wake: s.at_zero.is_some(),
            });
            if let Some(z) = s.at_zero {
                ledger.wakes.push_back((s.at, z));
            }
        }
        ledger.previous = Some((copy.taken_at, copy.last_request_at, copy.requests_total));
        ledger.resumed = true;
        Ok(ledger)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::tests::{COLD, IDLE, at, demand};
    use super::*;
    use crate::scale::Demand;

    /// Bursty traffic from a deterministic pseudo-random walk (no RNG crate in core's tests): busy half-hours with
    /// gaps of every length between requests, 7–60 s between syncs. `feed(t, total, last)` is called per sync.
    struct Traffic {
        t: u64,
        total: u64,
        last: u64,
        x: u64,
    }

    impl Traffic {
        fn new(seed: u64) -> Self {
            Traffic {
                t: 0,
                total: 0,
                last: 0,
                x: seed,
            }
        }

        fn next(&mut self, m: u64) -> u64 {
            self.x = self
                .x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (self.x >> 33) % m
        }

        /// The next sync's time and demand.
        fn sync(&mut self) -> (Timestamp, Demand) {
            self.t += 7 + self.next(54);
            let busy = (self.t / 1800) % 3 != 1 && self.next(4) != 0;
            if busy {
                self.total += 1 + self.next(20);
                self.last = self.t;
            }
            (at(self.t), demand(self.total, self.last))
        }
    }

    /// Evidence of `a` and `b` for the same cold start agree on everything but the requests of the bucket that
    /// straddles the window's start, which only `b` (the restored ledger) may have lost.
    fn assert_same(a: &ColdStartLedger, b: &ColdStartLedger, cold: Duration, now: Timestamp, what: &str) {
        let (ea, eb) = (a.evidence(cold, now), b.evidence(cold, now));
        let (Some(ea), Some(eb)) = (ea, eb) else {
            assert_eq!(ea.is_some(), eb.is_some(), "{what}: {ea:?} {eb:?}");
            return;
        };
        assert_eq!(
            (ea.cold_starts, ea.misses, ea.at_zero),
            (eb.cold_starts, eb.misses, eb.at_zero),
            "{what}"
        );
        assert!(
            eb.requests <= ea.requests && ea.requests - eb.requests <= 60 * 20,
            "{what}: {ea:?} {eb:?}"
        );
        assert!(
            eb.observed <= ea.observed && ea.observed - eb.observed < BUCKET,
            "{what}"
        );
    }

    /// A copy taken at any hour of two bursty days reads as the ledger did, then and after both are fed the same
    /// syncs for another day (the copy exact for cold starts up to 60 s; a longer one counts more misses).
    #[test]
    fn a_restored_copy_reads_as_the_ledger_did_and_goes_on_alike() {
        let mut traffic = Traffic::new(12_345);
        let mut live = ColdStartLedger::default();
        let mut copies: Vec<(ColdStartLedger, usize)> = Vec::new();
        let mut hour = 0;
        let mut checked = 0;
        while traffic.t < 3 * 86_400 {
            let (now, d) = traffic.sync();
            live.observe(&d, IDLE, now);
            for (copy, _) in &mut copies {
                copy.observe(&d, IDLE, now);
            }
            if traffic.t / 3600 != hour {
                hour = traffic.t / 3600;
                if hour < 48 {
                    let copy = live.checkpoint(Duration::from_secs(60), now).unwrap();
                    assert!(copy.samples.len() <= MAX_SAMPLES);
                    let restored = ColdStartLedger::restore(&copy, now).unwrap();
                    assert_same(&live, &restored, COLD, now, &format!("restored at hour {hour}"));
                    let longer = Duration::from_secs(200);
                    if let (Some(a), Some(b)) = (live.evidence(longer, now), restored.evidence(longer, now)) {
                        assert!(b.misses >= a.misses, "hour {hour}: {a:?} {b:?}");
                    }
                    copies.push((restored, hour as usize));
                }
                for (copy, from) in &copies {
                    assert_same(
                        &live,
                        copy,
                        COLD,
                        now,
                        &format!("restored at hour {from}, now hour {hour}"),
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked > 1000, "{checked}");
        // A day of bursty traffic at 7–60 s syncs is a few thousand samples; its copy is a few hundred.
        let copy = live.checkpoint(Duration::from_secs(60), at(traffic.t)).unwrap();
        assert!(
            live.samples.len() > 2000 && copy.samples.len() < 700,
            "{} {}",
            live.samples.len(),
            copy.samples.len()
        );
    }

    /// While no controller counts, requests arrive: the ledger resumed after the gap counts at least the misses the
    /// one that never stopped counted, whatever the gap held, and the same requests.
    #[test]
    fn a_gap_while_no_one_counts_adds_misses_never_hides_them() {
        for seed in 1..40 {
            let mut traffic = Traffic::new(seed);
            let mut live = ColdStartLedger::default();
            while traffic.t < 2 * 3600 {
                let (now, d) = traffic.sync();
                live.observe(&d, IDLE, now);
            }
            let copy = live.checkpoint(COLD, at(traffic.t)).unwrap();
            // A gap of 2 to 40 minutes, then an hour more.
            let gap_end = traffic.t + 120 + traffic.next(2280);
            while traffic.t < gap_end {
                let (now, d) = traffic.sync();
                live.observe(&d, IDLE, now);
            }
            let mut resumed = ColdStartLedger::restore(&copy, at(traffic.t)).unwrap();
            let end = traffic.t + 3600;
            while traffic.t < end {
                let (now, d) = traffic.sync();
                live.observe(&d, IDLE, now);
                resumed.observe(&d, IDLE, now);
            }
            let now = at(traffic.t);
            let (a, b) = (
                live.evidence(COLD, now).unwrap(),
                resumed.evidence(COLD, now).unwrap(),
            );
            assert!(b.misses >= a.misses, "seed {seed}: {a:?} {b:?}");
            assert_eq!(a.requests, b.requests, "seed {seed}");
        }
    }

    /// A wake every other sync for a day (the worst case for exact samples) still fits, as its newest part.
    #[test]
    fn a_copy_is_bounded() {
        let mut l = ColdStartLedger::default();
        let (mut total, mut last) = (0, 0);
        for t in (0..86_400).step_by(15) {
            if t % 330 == 0 {
                total += 1;
                last = t;
            }
            l.observe(&demand(total, last), IDLE, at(t));
        }
        let copy = l.checkpoint(Duration::from_secs(600), at(86_385)).unwrap();
        assert_eq!(copy.samples.len(), MAX_SAMPLES);
        assert_eq!(copy.samples.last().unwrap().at, at(86_385));
        assert!(ColdStartLedger::restore(&copy, at(86_400)).is_ok());
    }

    /// A copy is worth writing only once the kept one is a minute old and something new was counted since:
    /// requests, or another cold start measured.
    #[test]
    fn a_new_copy_is_due_a_minute_on_and_only_with_something_new() {
        use crate::scale::ScaleState;
        let at_sync = |total, secs| {
            let mut s = ScaleState::default();
            s.cold_starts.observe(&demand(total, 0), IDLE, at(secs));
            s.last_cold_start = Some(COLD);
            s
        };
        let written = at_sync(10, 100);
        assert!(!at_sync(12, 130).copy_due(&written), "younger than a minute");
        assert!(!at_sync(10, 400).copy_due(&written), "nothing new");
        assert!(at_sync(12, 160).copy_due(&written));
        let mut slower = at_sync(10, 400);
        slower.last_cold_start = Some(Duration::from_secs(40));
        assert!(slower.copy_due(&written), "another cold start measured");
        assert!(!ScaleState::default().copy_due(&written), "nothing counted yet");
        assert!(at_sync(10, 100).copy_due(&ScaleState::default()), "nothing kept");
    }

    /// A copy this code did not write is refused, with what is wrong; the caller then starts an empty ledger.
    #[test]
    fn a_bad_copy_is_refused() {
        let sample = |secs, requests| CheckpointSample {
            at: at(secs),
            requests,
            at_zero: None,
        };
        let copy = LedgerCheckpoint {
            taken_at: at(100),
            last_request_at: at(90),
            requests_total: 7,
            cold_start: None,
            samples: vec![sample(10, 3), sample(10, 4)],
        };
        assert_eq!(
            ColdStartLedger::restore(&copy, at(200)),
            Err(CheckpointError::OutOfOrder(1))
        );
        let late = LedgerCheckpoint {
            samples: vec![sample(10, 3), sample(110, 4)],
            ..copy.clone()
        };
        assert_eq!(
            ColdStartLedger::restore(&late, at(200)),
            Err(CheckpointError::OutOfOrder(1))
        );
        // A clock a little behind the writer's reads the copy; one over a minute behind does not.
        let empty = LedgerCheckpoint {
            samples: vec![],
            ..copy.clone()
        };
        assert!(ColdStartLedger::restore(&empty, at(40)).is_ok());
        assert_eq!(
            ColdStartLedger::restore(&empty, at(30)),
            Err(CheckpointError::FromTheFuture(Duration::from_secs(70)))
        );
        let long = LedgerCheckpoint {
            samples: (0..=MAX_SAMPLES as u64).map(|i| sample(i, 1)).collect(),
            taken_at: at(5000),
            ..copy
        };
        assert_eq!(
            ColdStartLedger::restore(&long, at(5000)).unwrap_err().to_string(),
            "1025 samples, more than the 1024 a copy holds"
        );
    }
}
