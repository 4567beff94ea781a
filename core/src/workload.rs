//! The workload class as the GPU workloads page shows it: the class in force, why, and the policy it chose.
//!
//! The class itself is decided in [`crate::class`] (inside the controller's round, [`crate::round`]); this
//! module only carries it to the page, and classifies where no round runs (the page served with `--no-kube`
//! from sidecars given on the command line): there nothing is declared and no history is kept, so the rule sees
//! only the objectives the sidecars report, and says real-time unless they say otherwise.

use crate::class::{self, Declared, ObservedTraffic, WorkloadClass};

/// What the page's class is derived from where no round runs: one model, over the sidecars' window.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ClassInput {
    /// The TTFT objective, seconds (the policy's `targets.ttftP95`, or the sidecar's `--ttft-slo`).
    pub ttft_objective_secs: Option<f64>,
    /// The inter-token latency objective, seconds.
    pub itl_objective_secs: Option<f64>,
    /// Share of the window's scrapes that found a request running or waiting (the busiest replica's), 0–1.
    pub active_ratio: Option<f64>,
}

/// The class, why, and the policy it chose.
#[derive(Debug, Clone, PartialEq)]
pub struct Classified {
    /// The class.
    pub class: WorkloadClass,
    /// Why, in words (the status field's reason and the page's tooltip).
    pub reason: String,
    /// The class's policy in words, with the knobs that came from it.
    pub policy: String,
}

impl Classified {
    /// The page's view of a round's class step.
    pub fn of_round(c: &class::ClassRound) -> Self {
        Classified {
            class: c.held.class,
            reason: c.held.reason.clone(),
            policy: c.resolved.summary(),
        }
    }
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

/// The class where no round runs: [`class::detect`] on the objectives alone, no declaration, no history.
pub fn classify(input: &ClassInput) -> Classified {
    let observed = ObservedTraffic {
        ttft_objective_secs: input.ttft_objective_secs,
        itl_objective_secs: input.itl_objective_secs,
        active_ratio: input.active_ratio,
        ..ObservedTraffic::default()
    };
    let d = class::detect(&Declared::default(), &observed, None);
    let mut policy = crate::scale::ScalePolicy::default();
    let resolved = class::policy::apply(d.class, &mut policy, class::Explicit::default());
    Classified {
        class: d.class,
        reason: d.reason,
        policy: resolved.summary(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objectives_alone_decide_where_no_round_runs() {
        let c = classify(&ClassInput::default());
        assert_eq!(c.class, WorkloadClass::Realtime);
        assert!(
            c.reason.contains("real-time until shown otherwise"),
            "{}",
            c.reason
        );
        let lax = classify(&ClassInput {
            ttft_objective_secs: Some(120.0),
            ..ClassInput::default()
        });
        assert_eq!(lax.class, WorkloadClass::Batch, "{}", lax.reason);
        assert!(lax.policy.contains("priority 10"), "{}", lax.policy);
        let itl = classify(&ClassInput {
            itl_objective_secs: Some(0.05),
            ttft_objective_secs: Some(120.0),
            ..ClassInput::default()
        });
        assert_eq!(itl.class, WorkloadClass::Realtime);
    }

    #[test]
    fn active_ratio_counts_only_reporting_scrapes() {
        assert_eq!(active_ratio([]), None);
        assert_eq!(active_ratio([(None, None)]), None);
        assert_eq!(
            active_ratio([(Some(1.0), None), (Some(0.0), Some(0.0)), (None, None)]),
            Some(0.5)
        );
    }
}
