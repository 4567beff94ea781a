//! The class rule: declared signals first, observed second, real-time when unsure. First match wins:
//!
//! 1. **Pinned**: `spec.workloadClass` other than `auto`.
//! 2. **Declared real-time**: at least [`PRIORITY_MIN_SHARE`] of the counted requests asked for OpenAI
//!    `service_tier: priority` (or a vLLM `priority` below 0, which vLLM serves first). Real-time declarations are
//!    read before batch ones: calling an interactive model batch makes people wait, calling a batch model
//!    real-time only costs GPU.
//! 3. **Declared batch**: the workload is owned by a Job or CronJob (it runs to completion), carries a Kueue
//!    queue label (it was queued as a batch job), or at least [`FLEX_MIN_SHARE`] of its requests asked for
//!    `service_tier: flex` (or a vLLM `priority` above 0) or came through the batch API.
//! 4. **Observed** (each needs enough evidence, or it is skipped):
//!    - an inter-token objective, or at least [`STREAMED_MIN_SHARE`] of requests streamed → real-time
//!      (someone reads the tokens as they come);
//!    - prompts of near-equal length (templated) with no tight TTFT objective and little streaming → batch;
//!    - a TTFT objective over [`BATCH_MIN_TTFT_SECS`] → batch (nobody waits that long on purpose);
//!    - on/off bursts: with a TTFT objective → near-real-time, without one → batch;
//!    - a TTFT objective over [`REALTIME_MAX_TTFT_SECS`] → near-real-time;
//!    - diurnal or flat traffic → real-time.
//! 5. **Default**: real-time, until the traffic shows otherwise.
//!
//! Hysteresis: the tier shares and the observed thresholds are harder to cross away from the class the model has now
//! ([`Bars::leaving`]), so a model near a threshold does not alternate; [`super::stable`] adds the dwell.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::WorkloadClass;
use super::shape::{self, Moments, Shape, ShapeStats};

/// Fewest requests with a tier counted before their tiers say anything.
pub const MIN_TIER_REQUESTS: u64 = 20;

/// A model with at least this share of `priority`-tier requests is real-time: a few clients asking to go first is
/// a declaration that someone waits.
pub const PRIORITY_MIN_SHARE: f64 = 0.05;

/// A model with at least this share of flex-tier (or batch-API) requests is batch.
pub const FLEX_MIN_SHARE: f64 = 0.9;

/// Fewest requests with a streaming flag counted before the streamed share says anything.
pub const MIN_STREAM_REQUESTS: u64 = 50;

/// A model with at least this share of streamed requests is real-time.
pub const STREAMED_MIN_SHARE: f64 = 0.5;

/// Templated prompts count as an offline job only while at most this share of requests stream.
pub const TEMPLATED_MAX_STREAMED: f64 = 0.1;

/// A TTFT objective at most this long is one a person waits on.
pub const REALTIME_MAX_TTFT_SECS: f64 = 10.0;

/// A TTFT objective over this long is not one anybody waits on.
pub const BATCH_MIN_TTFT_SECS: f64 = 60.0;

/// What a model declares about itself.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Declared {
    /// `spec.workloadClass` when not `auto`.
    pub pinned: Option<WorkloadClass>,
    /// The kind of the workload's controlling owner (`Job`, `CronJob`, ...), when it has one.
    pub owner_kind: Option<String>,
    /// The Kueue queue (`kueue.x-k8s.io/queue-name` label) the workload was submitted to.
    pub kueue_queue: Option<String>,
    /// Requests by tier, as counted by the activators.
    pub tiers: TierCounts,
}

/// Requests by the tier they asked for, as the activators count them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TierCounts {
    /// `service_tier: priority`, or a vLLM `priority` below 0.
    pub priority: u64,
    /// Neither: the default tier.
    pub default: u64,
    /// `service_tier: flex`, a vLLM `priority` above 0, or the batch API.
    pub flex: u64,
}

impl TierCounts {
    /// Every request counted.
    pub fn total(&self) -> u64 {
        self.priority
            .saturating_add(self.default)
            .saturating_add(self.flex)
    }

    /// Two activators' counts as one.
    pub fn add(&self, other: &TierCounts) -> TierCounts {
        TierCounts {
            priority: self.priority.saturating_add(other.priority),
            default: self.default.saturating_add(other.default),
            flex: self.flex.saturating_add(other.flex),
        }
    }
}

/// What is observed of a model's traffic and what it is held to.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ObservedTraffic {
    /// The TTFT objective, seconds (`targets.ttftP95`, else `ttftSlo`).
    pub ttft_objective_secs: Option<f64>,
    /// The inter-token latency objective, seconds.
    pub itl_objective_secs: Option<f64>,
    /// Requests whose `stream` flag was counted, and how many of them streamed.
    pub streamed: Option<(u64, u64)>,
    /// Per-minute request counts, oldest first ([`super::MinuteSeries::counts`]).
    pub minute_counts: Vec<u32>,
    /// The prompt lengths' moments (bytes or tokens: only their spread is read).
    pub prompt_lengths: Moments,
    /// Share of the sidecars' scrapes with a request running or waiting (the busiest replica's).
    pub active_ratio: Option<f64>,
}

/// Where a class came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Source {
    /// `spec.workloadClass`.
    Pinned,
    /// What the workload or its requests declare.
    Declared,
    /// What its traffic does.
    Observed,
    /// Nothing conclusive: real-time.
    Default,
}

impl Source {
    /// The name in `status.workloadClassSource`.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Pinned => "pinned",
            Source::Declared => "declared",
            Source::Observed => "observed",
            Source::Default => "default",
        }
    }
}

/// A class and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Detection {
    /// The class.
    pub class: WorkloadClass,
    /// Where it came from.
    pub source: Source,
    /// Why, in words.
    pub reason: String,
}

/// The observed thresholds, moved away from the class a model has now so that crossing back needs a clear
/// change (hysteresis).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bars {
    streamed_min_share: f64,
    templated_max_cv: f64,
    on_off_max_active: f64,
    priority_min_share: f64,
    flex_min_share: f64,
}

impl Bars {
    /// The bars for a model whose class is `current` (`None`: first detection, the plain thresholds).
    pub fn leaving(current: Option<WorkloadClass>) -> Bars {
        let plain = Bars {
            streamed_min_share: STREAMED_MIN_SHARE,
            templated_max_cv: shape::TEMPLATED_MAX_CV,
            on_off_max_active: shape::ON_OFF_MAX_ACTIVE,
            priority_min_share: PRIORITY_MIN_SHARE,
            flex_min_share: FLEX_MIN_SHARE,
        };
        match current {
            // Leaving real-time takes clearer evidence: fewer streamed requests, tighter templating, sparser
            // traffic.
            // The tiers' declarations apply at once, so their bars move too: a share hovering at a threshold
            // must not switch the class every round.
            Some(WorkloadClass::Realtime) => Bars {
                streamed_min_share: 0.3,
                templated_max_cv: 0.05,
                on_off_max_active: 0.4,
                priority_min_share: 0.02,
                flex_min_share: 0.95,
            },
            // Back to real-time from the others also needs a clear change.
            Some(WorkloadClass::NearRealtime | WorkloadClass::Batch) => Bars {
                streamed_min_share: 0.7,
                templated_max_cv: 0.15,
                on_off_max_active: 0.6,
                priority_min_share: 0.1,
                flex_min_share: 0.8,
            },
            None => plain,
        }
    }
}

/// The class of one model (see the module docs for the rule); `current` is the class it has now, for the
/// hysteresis.
pub fn detect(declared: &Declared, observed: &ObservedTraffic, current: Option<WorkloadClass>) -> Detection {
    let bars = Bars::leaving(current);
    if let Some(class) = declared.pinned {
        return found(
            class,
            Source::Pinned,
            format!("pinned by spec.workloadClass: {class}"),
        );
    }
    let tiers = declared.tiers;
    let total = tiers.total();
    if total >= MIN_TIER_REQUESTS {
        let share = |n: u64| n as f64 / total as f64;
        if share(tiers.priority) >= bars.priority_min_share {
            return found(
                WorkloadClass::Realtime,
                Source::Declared,
                format!(
                    "{:.0}% of {total} requests asked for service_tier priority (or a vLLM priority < 0)",
                    share(tiers.priority) * 100.0
                ),
            );
        }
    }
    if let Some(kind) = declared
        .owner_kind
        .as_deref()
        .filter(|k| matches!(*k, "Job" | "CronJob"))
    {
        return found(
            WorkloadClass::Batch,
            Source::Declared,
            format!("owned by a {kind}: it runs to completion and nobody waits on one request"),
        );
    }
    if let Some(queue) = &declared.kueue_queue {
        return found(
            WorkloadClass::Batch,
            Source::Declared,
            format!("submitted to Kueue queue {queue:?}: queued as a batch job"),
        );
    }
    if total >= MIN_TIER_REQUESTS && tiers.flex as f64 / total as f64 >= bars.flex_min_share {
        return found(
            WorkloadClass::Batch,
            Source::Declared,
            format!(
                "{:.0}% of {total} requests asked for service_tier flex, a vLLM priority > 0 or the batch API",
                tiers.flex as f64 * 100.0 / total as f64
            ),
        );
    }
    observed_class(observed, bars)
}

fn found(class: WorkloadClass, source: Source, reason: String) -> Detection {
    Detection {
        class,
        source,
        reason,
    }
}

/// Steps 4 and 5 of the rule.
fn observed_class(o: &ObservedTraffic, bars: Bars) -> Detection {
    let observed = |class, reason| found(class, Source::Observed, reason);
    let ttft = o.ttft_objective_secs.filter(|t| t.is_finite() && *t > 0.0);
    if let Some(itl) = o.itl_objective_secs.filter(|t| t.is_finite() && *t > 0.0) {
        return observed(
            WorkloadClass::Realtime,
            format!("inter-token objective {itl} s: someone reads the tokens as they stream"),
        );
    }
    let streamed = o
        .streamed
        .filter(|(counted, _)| *counted >= MIN_STREAM_REQUESTS)
        .map(|(counted, streamed)| (counted, streamed.min(counted) as f64 / counted as f64));
    if let Some((counted, share)) = streamed
        && share >= bars.streamed_min_share
    {
        return observed(
            WorkloadClass::Realtime,
            format!(
                "{:.0}% of {counted} requests streamed: someone reads the tokens as they come",
                share * 100.0
            ),
        );
    }
    let tight = ttft.is_some_and(|t| t <= REALTIME_MAX_TTFT_SECS);
    if let Some(cv) = o.prompt_lengths.cv()
        && cv <= bars.templated_max_cv
        && !tight
        && streamed.is_none_or(|(_, s)| s <= TEMPLATED_MAX_STREAMED)
    {
        let mut why = format!(
            "{} prompts of near-equal length (spread {:.1}%, at most {:.0}%)",
            o.prompt_lengths.count,
            cv * 100.0,
            bars.templated_max_cv * 100.0
        );
        if let Some((_, s)) = streamed {
            let _ = write!(why, ", {:.0}% streamed", s * 100.0);
        }
        why.push_str(": a templated offline job");
        return observed(WorkloadClass::Batch, why);
    }
    if let Some(t) = ttft
        && t > BATCH_MIN_TTFT_SECS
    {
        return observed(
            WorkloadClass::Batch,
            format!("TTFT objective {t} s is over {BATCH_MIN_TTFT_SECS} s: nobody waits on it"),
        );
    }
    let shape = ShapeStats::of(&o.minute_counts, bars.on_off_max_active);
    if let Some(s) = shape
        && s.shape == Shape::OnOff
    {
        return match ttft {
            Some(t) => observed(
                WorkloadClass::NearRealtime,
                format!(
                    "{} with a TTFT objective of {t} s: someone waits on the answer, between idle stretches",
                    s.describe()
                ),
            ),
            None => observed(
                WorkloadClass::Batch,
                format!("{} and no latency objective", s.describe()),
            ),
        };
    }
    if let Some(t) = ttft
        && t > REALTIME_MAX_TTFT_SECS
    {
        return observed(
            WorkloadClass::NearRealtime,
            format!(
                "TTFT objective {t} s: an answer someone waits for, not token by token (over {REALTIME_MAX_TTFT_SECS} s)"
            ),
        );
    }
    if let Some(s) = shape {
        let objective = ttft.map_or_else(
            || "no latency objective".to_owned(),
            |t| format!("TTFT objective {t} s"),
        );
        let spread = o
            .prompt_lengths
            .cv()
            .map(|cv| format!(", prompts spread {:.0}%", cv * 100.0))
            .unwrap_or_default();
        return observed(
            WorkloadClass::Realtime,
            format!("{}{spread}, {objective}: traffic people send", s.describe()),
        );
    }
    let mut why = "nothing declared and too little traffic observed to tell".to_owned();
    if let Some(a) = o.active_ratio {
        let _ = write!(
            why,
            " (requests in {:.0}% of the sidecars' recent scrapes)",
            a * 100.0
        );
    }
    why.push_str(": real-time until shown otherwise");
    found(WorkloadClass::Realtime, Source::Default, why)
}
