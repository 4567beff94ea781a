//! Keeping a model's class steady: a class from the traffic changes only after it has been seen for a while,
//! leaving real-time takes longest, and a class is kept at least a minimum dwell. A pin or a declaration
//! changes it at once: it is what the user or the workload said, not a reading that may be noise.

use std::time::Duration;

use super::WorkloadClass;
use super::detect::{Detection, Source};
use crate::scale::Timestamp;

/// Least time a model keeps a class before the traffic may move it.
pub const MIN_DWELL: Duration = Duration::from_secs(10 * 60);

/// How long the traffic must show another class, without a break, before a real-time model leaves real-time:
/// wrongly leaving it makes people wait, wrongly staying only costs GPU.
pub const LEAVE_REALTIME_AFTER: Duration = Duration::from_secs(30 * 60);

/// How long the traffic must show another class before any other change (to real-time included).
pub const CHANGE_AFTER: Duration = Duration::from_secs(5 * 60);

/// A model's class over rounds.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClassState {
    /// The class in force; `None` before the first round.
    pub class: Option<WorkloadClass>,
    /// Since when.
    pub since: Option<Timestamp>,
    /// Where the class in force came from.
    pub source: Option<Source>,
    /// Why it is in force.
    pub reason: String,
    /// Another class the traffic has shown without a break, and since when.
    candidate: Option<(WorkloadClass, Timestamp)>,
}

/// The class in force after a round.
#[derive(Debug, Clone, PartialEq)]
pub struct Held {
    /// The class.
    pub class: WorkloadClass,
    /// Where it came from.
    pub source: Source,
    /// Why, with what is pending when the traffic leans elsewhere.
    pub reason: String,
    /// Since when.
    pub since: Timestamp,
    /// The class it had before, when this round changed it.
    pub changed_from: Option<WorkloadClass>,
}

impl ClassState {
    /// A state resumed from what a status recorded (a restarted controller): the class and since when. Its
    /// source is unknown, so it moves only with the traffic's confirmation or a declaration.
    pub fn resume(class: WorkloadClass, since: Timestamp, reason: String) -> Self {
        ClassState {
            class: Some(class),
            since: Some(since),
            source: Some(Source::Observed),
            reason,
            candidate: None,
        }
    }

    /// Takes this round's detection into account and returns the class in force.
    pub fn hold(&mut self, d: Detection, now: Timestamp) -> Held {
        let (Some(current), Some(since)) = (self.class, self.since) else {
            return self.switch(d, now, None);
        };
        if d.class == current {
            self.candidate = None;
            self.source = Some(d.source);
            self.reason = d.reason;
            return self.held(None);
        }
        // A pin, a declaration, or a pin just removed: what someone said, applied at once.
        let was_pinned = self.source == Some(Source::Pinned);
        if matches!(d.source, Source::Pinned | Source::Declared) || was_pinned {
            return self.switch(d, now, Some(current));
        }
        let candidate_since = match self.candidate {
            Some((c, at)) if c == d.class => at,
            _ => now,
        };
        self.candidate = Some((d.class, candidate_since));
        let confirm = if current == WorkloadClass::Realtime {
            LEAVE_REALTIME_AFTER
        } else {
            CHANGE_AFTER
        };
        let seen = now.since(candidate_since);
        let dwelt = now.since(since);
        if seen >= confirm && dwelt >= MIN_DWELL {
            return self.switch(d, now, Some(current));
        }
        let wait = confirm.saturating_sub(seen).max(MIN_DWELL.saturating_sub(dwelt));
        let mut held = self.held(None);
        held.reason = format!(
            "{}; the traffic shows {} ({}), held {} more before changing",
            self.reason,
            d.class,
            d.reason,
            minutes(wait)
        );
        held
    }

    fn switch(&mut self, d: Detection, now: Timestamp, from: Option<WorkloadClass>) -> Held {
        self.class = Some(d.class);
        self.since = Some(now);
        self.source = Some(d.source);
        self.reason = d.reason;
        self.candidate = None;
        self.held(from)
    }

    fn held(&self, changed_from: Option<WorkloadClass>) -> Held {
        Held {
            class: self.class.unwrap_or_default(),
            source: self.source.unwrap_or(Source::Default),
            reason: self.reason.clone(),
            since: self.since.unwrap_or_default(),
            changed_from,
        }
    }
}

/// A wait in whole minutes, rounded up (`"3 min"`).
fn minutes(d: Duration) -> String {
    format!("{} min", d.as_secs().div_ceil(60))
}
