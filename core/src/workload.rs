//! The workload class of a model: a one-word description of how it is used, derived from what is observed,
//! for people reading the GPU workloads page and `kubectl get ias -o wide`. It decides nothing: scaling and
//! sizing never read it. It says which of Tessera's levers matter for a model — an `interactive` model is
//! held to its latency objective, a `batch` model can trade latency for packing, a `bursty` or `idle` one is
//! where scale to zero frees GPUs.
//!
//! The rule, first match wins (thresholds are [`INTERACTIVE_MAX_TTFT_SECS`] and [`BURSTY_MAX_ACTIVE_RATIO`]):
//! 1. **`idle`**: no replica runs (scaled to zero), or no request finished over the window and none was seen
//!    running or waiting in it.
//! 2. **`unknown`**: replicas run but none reported a window yet (no request rate): nothing to classify on.
//! 3. **`bursty`**: requests were running or waiting in fewer than half of the window's scrapes: the model is
//!    idle most of the time (the sidecars' `active_ratio`; unknown from older sidecars, which never makes a
//!    model bursty).
//! 4. **`interactive`**: steady traffic and a latency objective someone waits on: a TTFT objective of at most
//!    10 s, or an inter-token latency objective.
//! 5. **`batch`**: steady traffic and no such objective: throughput is what counts.

use serde::{Deserialize, Serialize};

/// A TTFT objective above this many seconds is not one a person waits on: such a model is `batch`.
pub const INTERACTIVE_MAX_TTFT_SECS: f64 = 10.0;

/// A model with requests in fewer than this share of its window's scrapes is `bursty`.
pub const BURSTY_MAX_ACTIVE_RATIO: f64 = 0.5;

/// How a model is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkloadClass {
    /// Steady traffic with a latency objective.
    Interactive,
    /// Steady traffic, no latency objective.
    Batch,
    /// Traffic in fewer than half of the window's scrapes.
    Bursty,
    /// Scaled to zero, or no traffic over the window.
    Idle,
    /// Nothing observed yet.
    Unknown,
}

impl WorkloadClass {
    /// The lower-case name (the status field's value and the page's label).
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadClass::Interactive => "interactive",
            WorkloadClass::Batch => "batch",
            WorkloadClass::Bursty => "bursty",
            WorkloadClass::Idle => "idle",
            WorkloadClass::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for WorkloadClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the class is derived from: one model, over the sidecars' window.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ClassInput {
    /// Replicas the model has now.
    pub replicas: u32,
    /// Finished requests per second over the window, summed over replicas; `None` when no replica reported one.
    pub requests_per_second: Option<f64>,
    /// Share of the window's scrapes that found a request running or waiting (the busiest replica's), 0–1;
    /// `None` from older sidecars.
    pub active_ratio: Option<f64>,
    /// The TTFT objective, seconds (the policy's `targets.ttftP95`, or the sidecar's `--ttft-slo`).
    pub ttft_objective_secs: Option<f64>,
    /// The inter-token latency objective, seconds.
    pub itl_objective_secs: Option<f64>,
}

/// The class and the sentence that says why.
#[derive(Debug, Clone, PartialEq)]
pub struct Classified {
    /// The class.
    pub class: WorkloadClass,
    /// Why, in words (the status field's reason and the page's tooltip).
    pub reason: String,
}

/// A replica's [`ClassInput::active_ratio`] from its window's scrapes, each as (requests running, requests
/// waiting): a scrape is active when it found a request running or waiting; one that reported neither is not
/// counted either way. `None` when no scrape reported either.
pub fn active_ratio(scrapes: impl IntoIterator<Item = (Option<f64>, Option<f64>)>) -> Option<f64> {
    let (mut active, mut counted) = (0usize, 0usize);
    for (running, waiting) in scrapes {
        if running.is_some() || waiting.is_some() {
            counted += 1;
            active += usize::from(running.unwrap_or(0.0) > 0.0 || waiting.unwrap_or(0.0) > 0.0);
        }
    }
    (counted > 0).then(|| active as f64 / counted as f64)
}

/// The class of one model (see the module documentation for the rule).
pub fn classify(input: &ClassInput) -> Classified {
    let done = |class, reason: String| Classified { class, reason };
    let rps = input.requests_per_second.filter(|v| v.is_finite());
    let active = input.active_ratio.filter(|v| v.is_finite());
    if input.replicas == 0 {
        return done(WorkloadClass::Idle, "scaled to zero".to_owned());
    }
    let Some(rps) = rps else {
        return done(
            WorkloadClass::Unknown,
            "no replica has reported a window of traffic yet".to_owned(),
        );
    };
    if rps <= 0.0 && active.is_none_or(|a| a <= 0.0) {
        return done(
            WorkloadClass::Idle,
            "no request over the sidecars' window".to_owned(),
        );
    }
    if let Some(a) = active
        && a < BURSTY_MAX_ACTIVE_RATIO
    {
        return done(
            WorkloadClass::Bursty,
            format!(
                "requests in {:.0}% of the window's scrapes (under {:.0}%): idle most of the time",
                a * 100.0,
                BURSTY_MAX_ACTIVE_RATIO * 100.0
            ),
        );
    }
    let steady = match active {
        Some(a) => format!("requests in {:.0}% of the window's scrapes", a * 100.0),
        None => format!("{rps:.2} requests/s"),
    };
    match (input.ttft_objective_secs, input.itl_objective_secs) {
        (Some(t), _) if t <= INTERACTIVE_MAX_TTFT_SECS => done(
            WorkloadClass::Interactive,
            format!("{steady}, TTFT objective {t} s"),
        ),
        (_, Some(i)) => done(
            WorkloadClass::Interactive,
            format!("{steady}, inter-token objective {i} s"),
        ),
        (Some(t), None) => done(
            WorkloadClass::Batch,
            format!(
                "{steady}, TTFT objective {t} s is over {INTERACTIVE_MAX_TTFT_SECS} s: nobody waits on it"
            ),
        ),
        (None, None) => done(WorkloadClass::Batch, format!("{steady}, no latency objective")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steady() -> ClassInput {
        ClassInput {
            replicas: 2,
            requests_per_second: Some(3.0),
            active_ratio: Some(0.9),
            ..ClassInput::default()
        }
    }

    fn class(i: ClassInput) -> WorkloadClass {
        classify(&i).class
    }

    #[test]
    fn steady_traffic_is_interactive_with_an_objective_and_batch_without() {
        assert_eq!(class(steady()), WorkloadClass::Batch);
        let with_ttft = ClassInput {
            ttft_objective_secs: Some(2.0),
            ..steady()
        };
        assert_eq!(class(with_ttft), WorkloadClass::Interactive);
        assert!(classify(&with_ttft).reason.contains("TTFT objective 2 s"));
        let with_itl = ClassInput {
            itl_objective_secs: Some(0.1),
            ..steady()
        };
        assert_eq!(class(with_itl), WorkloadClass::Interactive);
        // A 10 s objective is the edge; over it, nobody waits: batch.
        let edge = ClassInput {
            ttft_objective_secs: Some(INTERACTIVE_MAX_TTFT_SECS),
            ..steady()
        };
        assert_eq!(class(edge), WorkloadClass::Interactive);
        let lax = ClassInput {
            ttft_objective_secs: Some(60.0),
            ..steady()
        };
        assert_eq!(class(lax), WorkloadClass::Batch);
    }

    #[test]
    fn idle_most_of_the_window_is_bursty_and_no_traffic_is_idle() {
        let sparse = ClassInput {
            active_ratio: Some(0.2),
            ttft_objective_secs: Some(1.0),
            ..steady()
        };
        assert_eq!(
            class(sparse),
            WorkloadClass::Bursty,
            "the traffic shape comes first"
        );
        assert!(classify(&sparse).reason.contains("20%"));
        // Exactly half is steady enough.
        let half = ClassInput {
            active_ratio: Some(BURSTY_MAX_ACTIVE_RATIO),
            ..steady()
        };
        assert_eq!(class(half), WorkloadClass::Batch);
        let zero = ClassInput {
            replicas: 0,
            requests_per_second: None,
            ..steady()
        };
        assert_eq!(class(zero), WorkloadClass::Idle);
        let quiet = ClassInput {
            requests_per_second: Some(0.0),
            active_ratio: Some(0.0),
            ..steady()
        };
        assert_eq!(class(quiet), WorkloadClass::Idle);
        // No request finished, but one is running (a long generation): not idle.
        let long = ClassInput {
            requests_per_second: Some(0.0),
            active_ratio: Some(1.0),
            ..steady()
        };
        assert_eq!(class(long), WorkloadClass::Batch);
    }

    #[test]
    fn missing_data_never_guesses() {
        let none = ClassInput {
            requests_per_second: None,
            ..steady()
        };
        assert_eq!(class(none), WorkloadClass::Unknown);
        // An older sidecar (no activity share) is never called bursty; its rate still tells idle from busy.
        let old = ClassInput {
            active_ratio: None,
            ..steady()
        };
        assert_eq!(class(old), WorkloadClass::Batch);
        let old_quiet = ClassInput {
            active_ratio: None,
            requests_per_second: Some(0.0),
            ..steady()
        };
        assert_eq!(class(old_quiet), WorkloadClass::Idle);
        let nan = ClassInput {
            requests_per_second: Some(f64::NAN),
            ..steady()
        };
        assert_eq!(class(nan), WorkloadClass::Unknown);
    }

    #[test]
    fn names_are_stable() {
        let all = [
            WorkloadClass::Interactive,
            WorkloadClass::Batch,
            WorkloadClass::Bursty,
            WorkloadClass::Idle,
            WorkloadClass::Unknown,
        ];
        let names: Vec<&str> = all.iter().map(|c| c.as_str()).collect();
        assert_eq!(names, ["interactive", "batch", "bursty", "idle", "unknown"]);
        for c in all {
            assert_eq!(
                serde_json::to_value(c).unwrap_or_default(),
                serde_json::Value::String(c.to_string())
            );
        }
    }
}
