//! Batch jobs in a scenario: offline work (evaluations, scoring, a backlog to summarise) submitted beside the
//! interactive traffic, each with a deadline, and the capacity types a pool offers for it.
//!
//! ```yaml
//! batch:
//!   capacity:
//!     - { name: spot, price_per_gpu_hour: 1.5, interruptible: true, available: 4, reclaims_per_hour: 0.25 }
//!     - { name: on-demand, price_per_gpu_hour: 4.1, available: 8 }
//!   jobs:
//!     - { name: nightly-eval, model: support-chat, submit_at: 30m, lines: 6000,
//!         prompt_tokens: 700, output_tokens: 180, completion_window: 4h }
//! ```
//!
//! The file is read here ([`BatchFile`], validated with a message per field) and resolved into plain numbers
//! ([`BatchSetup`]); [`super::batch`] runs the ways of running them side by side and
//! [`super::world`]'s batch part carries each out with the same `core` rules as the activator and the controller
//! (`tessera_core::lanes` for the spare room, `tessera_core::batch::pace` for the deadline).
//!
//! The interactive pool's GPUs are priced at the cheapest reliable (non-interruptible) offer: the same list
//! price a team pays for the GPUs it holds today.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The `batch:` section of a scenario.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchFile {
    /// Capacity types for the batch's own replicas (whole GPUs each).
    pub capacity: Vec<CapacityFile>,
    /// The jobs.
    pub jobs: Vec<JobFile>,
    /// Fraction of the time left the pacing rule keeps in reserve (0.1 plans to finish with a tenth to spare).
    #[serde(default = "default_margin")]
    pub margin: f64,
}

fn default_margin() -> f64 {
    0.1
}

/// One capacity type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapacityFile {
    /// Its name (`spot`, `on-demand`, a node pool's label value).
    pub name: String,
    /// List price of one GPU for an hour.
    pub price_per_gpu_hour: f64,
    /// The provider may take it back (spot, preemptible).
    #[serde(default)]
    pub interruptible: bool,
    /// GPUs of this type the pool can get at once.
    pub available: u32,
    /// Interruptible only: how often one GPU is taken back, per hour it runs (an exponential clock per GPU).
    #[serde(default)]
    pub reclaims_per_hour: f64,
    /// Interruptible only: how long a GPU taken back stays unavailable.
    #[serde(default = "default_back_after", with = "humantime_serde")]
    pub back_after: Duration,
}

fn default_back_after() -> Duration {
    Duration::from_secs(15 * 60)
}

/// One batch job: `lines` requests of one shape to one of the scenario's models.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobFile {
    /// A name for the report.
    pub name: String,
    /// The scenario model it calls (by name).
    pub model: String,
    /// When it is submitted, from the start of the scenario.
    #[serde(with = "humantime_serde")]
    pub submit_at: Duration,
    /// Requests in its input file.
    pub lines: u64,
    /// Prompt tokens per request.
    pub prompt_tokens: u32,
    /// Output tokens per request.
    pub output_tokens: u32,
    /// Its completion window (the OpenAI API offers `24h`; a scenario may scale it down with its duration).
    #[serde(with = "humantime_serde")]
    pub completion_window: Duration,
}

/// One capacity type, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Offer {
    /// Its name.
    pub name: String,
    /// Price per GPU-hour.
    pub price_per_gpu_hour: f64,
    /// Interruptible.
    pub interruptible: bool,
    /// GPUs at once.
    pub available: u32,
    /// Reclaims per GPU-hour.
    pub reclaims_per_hour: f64,
    /// Seconds a reclaimed GPU stays away.
    pub back_after_s: f64,
}

/// One job, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// Its name.
    pub name: String,
    /// The model's index in the scenario.
    pub model: usize,
    /// Submitted at, seconds.
    pub submit_at: f64,
    /// Due at, seconds (submit + window).
    pub deadline: f64,
    /// Requests.
    pub lines: u64,
    /// Prompt tokens per request.
    pub prompt_tokens: u32,
    /// Output tokens per request.
    pub output_tokens: u32,
}

/// The batch section, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchSetup {
    /// The capacity types, in file order.
    pub offers: Vec<Offer>,
    /// The jobs, in file order.
    pub jobs: Vec<Job>,
    /// The pacing rule's margin.
    pub margin: f64,
    /// The index of the cheapest reliable offer: the interactive pool's price and the dedicated pool's GPUs.
    pub reliable: usize,
}

impl BatchSetup {
    /// Price of one interactive (or dedicated) GPU-hour.
    pub fn reliable_price(&self) -> f64 {
        self.offers[self.reliable].price_per_gpu_hour
    }
}

impl BatchFile {
    /// Every problem, each naming its field and the fix (empty = valid). `models` are the scenario's model
    /// names, `duration` its length.
    pub fn validate(&self, models: &[String], duration: Duration) -> Vec<String> {
        let mut p = Vec::new();
        if self.capacity.is_empty() {
            p.push(
                "batch.capacity is empty: list at least one reliable (non-interruptible) capacity type"
                    .into(),
            );
        }
        if !self.capacity.iter().any(|c| !c.interruptible) {
            p.push(
                "batch.capacity has no reliable type: add one without `interruptible: true` (on-demand), which \
                 prices the interactive pool and takes over when spot runs out"
                    .into(),
            );
        }
        for (i, c) in self.capacity.iter().enumerate() {
            let at = format!("batch.capacity[{i}] ({})", c.name);
            if c.name.is_empty() {
                p.push(format!("batch.capacity[{i}].name is empty"));
            }
            if self.capacity[..i].iter().any(|o| o.name == c.name) {
                p.push(format!(
                    "{at}: the name is used twice; give each capacity type its own"
                ));
            }
            if !(c.price_per_gpu_hour.is_finite() && c.price_per_gpu_hour > 0.0) {
                p.push(format!(
                    "{at}.price_per_gpu_hour must be above 0, got {}",
                    c.price_per_gpu_hour
                ));
            }
            if c.available == 0 || c.available > 1_000 {
                p.push(format!(
                    "{at}.available must be 1..=1000 GPUs, got {}",
                    c.available
                ));
            }
            if !(c.reclaims_per_hour.is_finite() && (0.0..=60.0).contains(&c.reclaims_per_hour)) {
                p.push(format!(
                    "{at}.reclaims_per_hour must be in 0..=60, got {}",
                    c.reclaims_per_hour
                ));
            }
            if !c.interruptible && c.reclaims_per_hour > 0.0 {
                p.push(format!(
                    "{at}: reclaims_per_hour is set on a type that is not interruptible; add `interruptible: true` \
                     or remove it"
                ));
            }
        }
        if self.jobs.is_empty() {
            p.push("batch.jobs is empty: list at least one job, or remove the batch section".into());
        }
        if self.jobs.len() > 100 {
            p.push(format!("batch.jobs has {} jobs; at most 100", self.jobs.len()));
        }
        for (i, j) in self.jobs.iter().enumerate() {
            let at = format!("batch.jobs[{i}] ({})", j.name);
            if !models.contains(&j.model) {
                p.push(format!(
                    "{at}.model: no model named {:?} in the scenario (models: {})",
                    j.model,
                    models.join(", ")
                ));
            }
            if j.lines == 0 || j.lines > 50_000 {
                p.push(format!(
                    "{at}.lines must be 1..=50000 (the Batch API's limit per file), got {}",
                    j.lines
                ));
            }
            if j.prompt_tokens == 0 || j.output_tokens == 0 {
                p.push(format!(
                    "{at}: prompt_tokens and output_tokens must be at least 1"
                ));
            }
            if j.completion_window < Duration::from_secs(60) {
                p.push(format!(
                    "{at}.completion_window must be at least 1m, got {:?}",
                    j.completion_window
                ));
            }
            let due = j.submit_at + j.completion_window;
            if due > duration {
                p.push(format!(
                    "{at}: due at {} (submit_at + completion_window), after the scenario's end at {}; lengthen \
                     `duration` or shorten the window",
                    humantime::format_duration(due),
                    humantime::format_duration(duration)
                ));
            }
        }
        if !(self.margin.is_finite() && (0.0..0.9).contains(&self.margin)) {
            p.push(format!("batch.margin must be in [0, 0.9), got {}", self.margin));
        }
        p
    }

    /// The resolved section. Call after [`BatchFile::validate`] found nothing.
    pub fn resolve(&self, models: &[String]) -> BatchSetup {
        let offers: Vec<Offer> = self
            .capacity
            .iter()
            .map(|c| Offer {
                name: c.name.clone(),
                price_per_gpu_hour: c.price_per_gpu_hour,
                interruptible: c.interruptible,
                available: c.available,
                reclaims_per_hour: if c.interruptible { c.reclaims_per_hour } else { 0.0 },
                back_after_s: c.back_after.as_secs_f64(),
            })
            .collect();
        let reliable = offers
            .iter()
            .enumerate()
            .filter(|(_, o)| !o.interruptible)
            .min_by(|a, b| a.1.price_per_gpu_hour.total_cmp(&b.1.price_per_gpu_hour))
            .map_or(0, |(i, _)| i);
        let jobs = self
            .jobs
            .iter()
            .map(|j| Job {
                name: j.name.clone(),
                model: models.iter().position(|m| *m == j.model).unwrap_or(0),
                submit_at: j.submit_at.as_secs_f64(),
                deadline: (j.submit_at + j.completion_window).as_secs_f64(),
                lines: j.lines,
                prompt_tokens: j.prompt_tokens,
                output_tokens: j.output_tokens,
            })
            .collect();
        BatchSetup {
            offers,
            jobs,
            margin: self.margin,
            reliable,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn file() -> BatchFile {
        serde_yaml::from_str(
            "capacity:\n  - { name: spot, price_per_gpu_hour: 1.5, interruptible: true, available: 4, reclaims_per_hour: 0.25 }\n  - { name: on-demand, price_per_gpu_hour: 4.1, available: 8 }\njobs:\n  - { name: eval, model: chat, submit_at: 30m, lines: 6000, prompt_tokens: 700, output_tokens: 180, completion_window: 4h }\n",
        )
        .expect("valid YAML")
    }

    #[test]
    fn a_valid_section_resolves_and_prices_the_pool_at_the_cheapest_reliable_type() {
        let f = file();
        let models = vec!["chat".to_owned()];
        assert_eq!(
            f.validate(&models, Duration::from_secs(6 * 3600)),
            Vec::<String>::new()
        );
        let s = f.resolve(&models);
        assert_eq!(s.reliable, 1);
        assert!((s.reliable_price() - 4.1).abs() < 1e-9);
        assert!((s.jobs[0].deadline - 4.5 * 3600.0).abs() < 1e-9);
        assert!((s.offers[0].back_after_s - 900.0).abs() < 1e-9);
    }

    #[test]
    fn each_mistake_names_its_field_and_the_fix() {
        let mut f = file();
        f.jobs[0].model = "nope".into();
        f.capacity[1].interruptible = true;
        f.capacity[0].price_per_gpu_hour = 0.0;
        let p = f.validate(&["chat".to_owned()], Duration::from_secs(3600));
        let all = p.join("\n");
        assert!(
            all.contains("batch.jobs[0] (eval).model: no model named \"nope\""),
            "{all}"
        );
        assert!(all.contains("no reliable type"), "{all}");
        assert!(
            all.contains("batch.capacity[0] (spot).price_per_gpu_hour must be above 0"),
            "{all}"
        );
        assert!(
            all.contains("after the scenario's end at 1h; lengthen `duration`"),
            "{all}"
        );
        let unknown = serde_yaml::from_str::<BatchFile>("capacity: []\njobs: []\nspot: 1\n")
            .expect_err("an unknown field is refused");
        assert!(unknown.to_string().contains("unknown field `spot`"), "{unknown}");
    }
}
