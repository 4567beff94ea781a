//! Per-minute request counts over the last day, fed each round from the activators' cumulative counters: what
//! [`super::ShapeStats::of`] reads to tell a diurnal cycle from on/off bursts.
//!
//! Bounded: a day of minutes ([`CAPACITY`]). Missing data stays missing: a minute no round observed is not a
//! zero (a zero would read as idle, and idle reads as batch, which holds less headroom), and a counter that went
//! back (an activator restarted) counts nothing for that step.

use std::collections::VecDeque;

use crate::scale::Timestamp;

/// A day of minutes.
pub const CAPACITY: usize = 24 * 60;

/// Between two observations further apart than this, the minutes in between are left unknown rather than
/// given an even share of the requests: an hour of averages would hide an on/off pattern.
const MAX_SPREAD_MINUTES: u64 = 10;

/// Requests per minute, oldest first.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MinuteSeries {
    /// The minute (since the epoch) of `counts[0]`.
    first_minute: u64,
    /// One entry per minute from `first_minute`; `None` where nothing was observed.
    counts: VecDeque<Option<u32>>,
    /// The last observation: when, and the counter then.
    last: Option<(Timestamp, u64)>,
}

impl MinuteSeries {
    /// Counts what the activators' counter `requests_total` gained since the last call (`None`: no activator
    /// data this round, which records nothing).
    pub fn observe(&mut self, now: Timestamp, requests_total: Option<u64>) {
        let Some(total) = requests_total else { return };
        let now_minute = now.as_millis() / 60_000;
        let previous = self.last.replace((now, total));
        let Some((then, before)) = previous else { return };
        if now <= then {
            return;
        }
        let Some(delta) = total.checked_sub(before) else {
            return;
        };
        let then_minute = then.as_millis() / 60_000;
        let span = now_minute - then_minute;
        if span > MAX_SPREAD_MINUTES {
            // Too long to guess how the requests fell: only the current minute gets them.
            self.add(now_minute, delta);
            return;
        }
        // Spread over the minutes the interval touched, the remainder to the latest.
        let minutes = span + 1;
        let each = delta / minutes;
        for m in then_minute..=now_minute {
            let extra = if m == now_minute { delta % minutes } else { 0 };
            self.add(m, each + extra);
        }
    }

    fn add(&mut self, minute: u64, n: u64) {
        if self.counts.is_empty() {
            self.first_minute = minute;
        }
        if minute < self.first_minute {
            return;
        }
        let Ok(index) = usize::try_from(minute - self.first_minute) else {
            return;
        };
        if index >= self.counts.len() {
            // Minutes skipped since the last entry stay unknown.
            let grow = index + 1 - self.counts.len();
            if grow > CAPACITY {
                self.counts.clear();
                self.first_minute = minute;
            } else {
                self.counts.extend(std::iter::repeat_n(None, grow));
            }
        }
        let index = usize::try_from(minute - self.first_minute).unwrap_or(0);
        if let Some(slot) = self.counts.get_mut(index) {
            let n = u32::try_from(n).unwrap_or(u32::MAX);
            *slot = Some(slot.unwrap_or(0).saturating_add(n));
        }
        while self.counts.len() > CAPACITY {
            self.counts.pop_front();
            self.first_minute += 1;
        }
    }

    /// The observed minutes' counts, oldest first, the current (partial) minute left out.
    pub fn counts(&self) -> Vec<u32> {
        let n = self.counts.len().saturating_sub(1);
        self.counts.iter().take(n).flatten().copied().collect()
    }

    /// A series from whole minutes' counts (a trace replayed minute by minute, a test).
    pub fn from_counts(first_minute: u64, counts: &[u32]) -> Self {
        let mut counts: VecDeque<Option<u32>> = counts.iter().map(|c| Some(*c)).collect();
        while counts.len() > CAPACITY {
            counts.pop_front();
        }
        // The partial minute `counts()` leaves out.
        counts.push_back(None);
        MinuteSeries {
            first_minute,
            counts,
            last: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(min: u64, sec: u64) -> Timestamp {
        Timestamp::from_millis((min * 60 + sec) * 1000)
    }

    #[test]
    fn counts_per_minute_from_a_counter() {
        let mut s = MinuteSeries::default();
        s.observe(at(10, 0), Some(100));
        s.observe(at(10, 30), Some(103));
        s.observe(at(11, 0), Some(105));
        s.observe(at(12, 0), Some(105));
        // Minute 10: 3 + 1 (the 10:30 → 11:00 step spread over 10 and 11); minute 11: 1; minute 12 is partial.
        assert_eq!(s.counts(), vec![4, 1]);
    }

    #[test]
    fn missing_data_and_restarts_are_not_zeros() {
        let mut s = MinuteSeries::default();
        s.observe(at(0, 0), Some(10));
        s.observe(at(1, 0), Some(20));
        s.observe(at(2, 0), None);
        // A restart: the counter went back; nothing is counted for that step.
        s.observe(at(3, 0), Some(2));
        s.observe(at(4, 0), Some(4));
        s.observe(at(5, 0), Some(4));
        assert_eq!(s.counts(), vec![5, 5, 1, 1]);
        // A long silence of the data (an hour with no activator) leaves those minutes unknown.
        s.observe(at(70, 0), Some(10));
        s.observe(at(71, 0), Some(10));
        assert_eq!(s.counts(), vec![5, 5, 1, 1, 0, 6]);
    }

    #[test]
    fn bounded_to_a_day() {
        let mut s = MinuteSeries::default();
        for m in 0..(CAPACITY as u64 + 500) {
            s.observe(at(m, 0), Some(m));
        }
        assert!(s.counts().len() < CAPACITY);
        assert!(s.counts.len() <= CAPACITY);
    }
}
