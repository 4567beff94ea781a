//! Two observed traits of a model's traffic: its shape over the day (from per-minute request counts) and how
//! templated its prompts are (from the spread of their lengths).
//!
//! Both are summaries a bounded amount of state can keep: a day of minute counts ([`super::MinuteSeries`]) and
//! three numbers per model for the lengths ([`Moments`]).

use serde::{Deserialize, Serialize};

/// Fewest minutes of counts before a shape is named: half an hour, so a quiet few minutes are not read as an
/// on/off pattern.
pub const MIN_MINUTES: usize = 30;

/// Traffic with requests in fewer than this share of its minutes comes in on/off bursts (the median Azure
/// Functions 2019 function is active in 27 of 1,440 minutes; the six in `testdata/azure_functions_2019` in 5–38%).
pub const ON_OFF_MAX_ACTIVE: f64 = 0.5;

/// A diurnal cycle is named only on at least this many minutes of counts: half a day shows a peak and a trough.
pub const DIURNAL_MIN_MINUTES: usize = 12 * 60;

/// A diurnal cycle's busiest hour carries at least this many times its quietest hour's requests.
pub const DIURNAL_MIN_PEAK_TO_TROUGH: f64 = 3.0;

/// An idle stretch of at least this many minutes counts as a gap between bursts.
pub const GAP_MINUTES: usize = 5;

/// Fewest prompt lengths before the spread says anything about templating.
pub const MIN_PROMPTS: u64 = 50;

/// Prompts whose lengths' coefficient of variation is at most this are templated (a batch job fills one template
/// with near-equal inputs; the Azure conversation trace's prompts spread with a CV of 0.96).
pub const TEMPLATED_MAX_CV: f64 = 0.10;

/// The daily shape of a model's traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Shape {
    /// Requests in most minutes, busier by day than by night: people.
    Diurnal,
    /// Bursts between idle stretches: tools, functions, scheduled jobs.
    OnOff,
    /// Requests in most minutes at a level that does not cycle over the counts seen.
    Flat,
}

impl Shape {
    /// The name used in reasons and on the page.
    pub fn as_str(self) -> &'static str {
        match self {
            Shape::Diurnal => "diurnal",
            Shape::OnOff => "on/off bursts",
            Shape::Flat => "flat",
        }
    }
}

/// What a shape was named on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShapeStats {
    /// The shape.
    pub shape: Shape,
    /// Minutes counted.
    pub minutes: usize,
    /// Share of those minutes with at least one request, 0–1.
    pub active_share: f64,
    /// Idle stretches of at least [`GAP_MINUTES`].
    pub gaps: usize,
    /// Busiest hour's requests over the quietest's (the quietest counted as at least one); `None` under an hour.
    pub peak_to_trough: Option<f64>,
}

impl ShapeStats {
    /// The shape of per-minute request counts, oldest first; `None` under [`MIN_MINUTES`] (too little to say).
    /// `on_off_max_active` is [`ON_OFF_MAX_ACTIVE`], or a lower bar where the caller wants hysteresis.
    pub fn of(counts: &[u32], on_off_max_active: f64) -> Option<ShapeStats> {
        let minutes = counts.len();
        if minutes < MIN_MINUTES {
            return None;
        }
        let active = counts.iter().filter(|c| **c > 0).count();
        let active_share = active as f64 / minutes as f64;
        let mut gaps = 0;
        let mut run = 0;
        for c in counts {
            if *c == 0 {
                run += 1;
            } else {
                gaps += usize::from(run >= GAP_MINUTES);
                run = 0;
            }
        }
        gaps += usize::from(run >= GAP_MINUTES);
        let hours: Vec<u64> = counts
            .chunks_exact(60)
            .map(|h| h.iter().map(|c| u64::from(*c)).sum())
            .collect();
        let peak_to_trough = (!hours.is_empty()).then(|| {
            let max = hours.iter().copied().max().unwrap_or(0) as f64;
            let min = hours.iter().copied().min().unwrap_or(0).max(1) as f64;
            max / min
        });
        let shape = if active_share < on_off_max_active {
            Shape::OnOff
        } else if minutes >= DIURNAL_MIN_MINUTES
            && peak_to_trough.is_some_and(|r| r >= DIURNAL_MIN_PEAK_TO_TROUGH)
        {
            Shape::Diurnal
        } else {
            Shape::Flat
        };
        Some(ShapeStats {
            shape,
            minutes,
            active_share,
            gaps,
            peak_to_trough,
        })
    }

    /// The shape in words, with what it was named on.
    pub fn describe(&self) -> String {
        format!(
            "{} (requests in {:.0}% of {} minutes, {} idle gaps of {}+ min)",
            self.shape.as_str(),
            self.active_share * 100.0,
            self.minutes,
            self.gaps,
            GAP_MINUTES
        )
    }
}

/// Running count, mean and spread of a quantity (Welford's method): the prompt lengths of a model's requests
/// in three numbers, whatever the number of requests.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Moments {
    /// Values counted.
    pub count: u64,
    /// Their mean.
    pub mean: f64,
    /// Sum of squared differences from the mean.
    pub m2: f64,
}

impl Moments {
    /// Counts one value; non-finite values are ignored.
    pub fn push(&mut self, x: f64) {
        if !x.is_finite() {
            return;
        }
        self.count = self.count.saturating_add(1);
        let delta = x - self.mean;
        self.mean += delta / self.count as f64;
        self.m2 += delta * (x - self.mean);
    }

    /// Two sets of moments as one (Chan et al.'s parallel form): several activators' counts of one model.
    pub fn merge(&self, other: &Moments) -> Moments {
        if self.count == 0 {
            return *other;
        }
        if other.count == 0 {
            return *self;
        }
        let n = self.count.saturating_add(other.count);
        let (na, nb) = (self.count as f64, other.count as f64);
        let delta = other.mean - self.mean;
        Moments {
            count: n,
            mean: self.mean + delta * nb / n as f64,
            m2: self.m2 + other.m2 + delta * delta * na * nb / n as f64,
        }
    }

    /// The coefficient of variation (standard deviation over mean); `None` under [`MIN_PROMPTS`] values or with
    /// a zero mean.
    pub fn cv(&self) -> Option<f64> {
        if self.count < MIN_PROMPTS || self.mean <= 0.0 {
            return None;
        }
        let var = (self.m2 / self.count as f64).max(0.0);
        Some(var.sqrt() / self.mean)
    }
}
