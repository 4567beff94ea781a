//! The compute share.

use super::*;

/// The compute share and why (see [`recommend_compute`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ComputeDecision {
    /// The recommended share, within `[min_compute_fraction, 1]`, in hundredths rounded up.
    pub share: f64,
    /// Why, in the order the rules applied (each with `field: ComputeFraction`).
    pub reasons: Vec<Reason>,
}

/// What one latency objective says about the share it was observed at.
struct Objective {
    name: &'static str,
    slo: f64,
    /// `Some((p95, samples))` when there is enough evidence.
    seen: Option<(f64, f64)>,
    samples: f64,
}

/// True when a sample shows the replica saturated at its share: requests waiting while the GPU was busy all the
/// time, or while it preempted. Returns (saturated samples, samples that could show it).
fn saturation(window: &[Observation], config: &Config) -> (usize, usize) {
    let mut prev_preemptions: Option<f64> = None;
    let (mut saturated, mut seen) = (0, 0);
    for o in window {
        let preempted = match (prev_preemptions, o.preemptions_total) {
            (Some(p), Some(c)) if c.is_finite() => c > p || (c < p && c > 0.0),
            _ => false,
        };
        if o.preemptions_total.is_some_and(f64::is_finite) {
            prev_preemptions = o.preemptions_total;
        }
        let busy = o.sm_utilization.filter(|b| b.is_finite());
        if busy.is_none() && o.preemptions_total.is_none() {
            continue;
        }
        seen += 1;
        let waiting = o.requests_waiting.is_some_and(|w| w.is_finite() && w > 0.0);
        if waiting && (busy.is_some_and(|b| b >= config.saturation_busy_ratio) || preempted) {
            saturated += 1;
        }
    }
    (saturated, seen)
}

/// The compute-share rule. Pure; `window` is sorted oldest first.
///
/// Time-busy is not a measure of need for an LLM server (a memory-bound decode step keeps the GPU busy with one
/// request as with fifty), so the share is sized against latency, which does scale with it: prefill and decode
/// steps both take about `1 / share` as long. In order:
/// 1. **Evidence.** Each configured objective (TTFT p95, inter-token p95) with at least `min_latency_samples`
///    observations gives `r = observed p95 / (latency_target_ratio × SLO)`; within `1 ± latency_tolerance`
///    it counts as 1 (no change). With an objective over target (`r > 1 + tolerance`): `current × max r`, and
///    never below what runs now or the previous recommendation. With all objectives under target:
///    `current × max r`. An objective without enough observations (idle, or missing data) blocks any shrink:
///    keep the previous recommendation (or the current share). No objective at all: keep it too — there is no
///    evidence a smaller share is safe; GPU busy time is reported, never used to shrink.
/// 2. **Saturation** (at least `saturation_min_ratio` of the samples busy ≥ `saturation_busy_ratio` or
///    preempting while requests waited) → at least `max(current, previous) × compute_max_step_up`; never shrink.
/// 3. **Bounded step** from the previous recommendation (or the current share): at most
///    `× compute_max_step_up` up and `compute_max_step_down_ratio` down per update; a grow signal is never
///    capped below `max(current, previous)`.
/// 4. Rounded up to hundredths, clamped to `[min_compute_fraction, 1]`.
pub fn recommend_compute(
    window: &[Observation],
    facts: &ComputeFacts,
    previous: Option<f64>,
    config: &Config,
) -> ComputeDecision {
    let current = facts.current_share.filter(usable).map_or(1.0, |s| s.min(1.0));
    let reference = previous.filter(usable).map_or(current, |s| s.min(1.0));
    let mut reasons = Vec::new();
    let busy_note = busy_note(window);

    // Rule 1: latency evidence.
    let objectives = objectives(facts, config);
    let (mut desired, mut pressure) =
        latency_rule(&objectives, current, reference, &busy_note, config, &mut reasons);

    // Rule 2: saturation at the current share.
    if let Some(grown) = saturation_rule(window, current, reference, config, &mut reasons) {
        pressure = true;
        if grown > desired {
            desired = grown;
        }
    }

    // A whole GPU is the most one replica can have. Asked for more while already there, the next unit of
    // capacity is another replica: say so in a reason of its own, which the replica-scaling policy can read.
    if pressure && current.max(reference) >= 1.0 && desired >= 1.0 {
        reasons.push(compute_reason(
            ReasonCode::ReplicaIsNextUnit,
            "more compute is needed at share 1.00 (the whole GPU): the next unit of capacity is another replica"
                .to_string(),
        ));
    }
    desired = desired.min(1.0);

    // Rule 3: bounded step from the previous recommendation (or what runs now).
    let floor = if pressure { current.max(reference) } else { 0.0 };
    desired = step_bounded(desired, reference, floor, config, &mut reasons).max(floor);

    // Rule 4: hundredths rounded up (the epsilon keeps 0.75 from becoming 0.76 through float noise), clamped.
    let share = ((desired * 100.0 - 1e-9).ceil() / 100.0).clamp(config.min_compute_fraction, 1.0);
    ComputeDecision { share, reasons }
}

/// A share or SLO that can be used: finite and positive.
fn usable(v: &f64) -> bool {
    v.is_finite() && *v > 0.0
}

fn compute_reason(code: ReasonCode, message: String) -> Reason {
    Reason {
        field: Field::ComputeFraction,
        code,
        message,
    }
}

/// The average GPU busy time, appended to the reasons for operators: reported, never used to size the share.
fn busy_note(window: &[Observation]) -> String {
    let busy: Vec<f64> = window
        .iter()
        .filter_map(|o| o.sm_utilization)
        .filter(|b| b.is_finite())
        .collect();
    if busy.is_empty() {
        String::new()
    } else {
        format!(
            "; GPU busy {:.0}% of the time on average at this share (reported only: a decode step keeps the GPU \
             busy at any batch size)",
            100.0 * busy.iter().sum::<f64>() / busy.len() as f64
        )
    }
}

/// The configured objectives (TTFT, then inter-token latency), each with its evidence when there is enough.
fn objectives(facts: &ComputeFacts, config: &Config) -> Vec<Objective> {
    [
        ("TTFT", facts.ttft_slo_secs, facts.ttft),
        ("inter-token latency", facts.itl_slo_secs, facts.itl),
    ]
    .into_iter()
    .filter_map(|(name, slo, seen)| {
        let slo = slo.filter(usable)?;
        let samples = seen.map_or(0.0, |l| if l.samples.is_finite() { l.samples } else { 0.0 });
        let seen = seen
            .filter(|l| l.p95_secs.is_finite() && l.p95_secs >= 0.0)
            .filter(|_| samples >= config.min_latency_samples as f64)
            .map(|l| (l.p95_secs, samples));
        Some(Objective {
            name,
            slo,
            seen,
            samples,
        })
    })
    .collect()
}

impl Objective {
    /// Its evidence against its target, or how many observations it lacks.
    fn describe(&self, config: &Config) -> String {
        match self.seen {
            Some((p95, n)) => format!(
                "{} p95 {:.3} s over {n:.0} observations vs target {:.3} s ({:.0}% of the {:.3} s objective)",
                self.name,
                p95,
                config.latency_target_ratio * self.slo,
                config.latency_target_ratio * 100.0,
                self.slo
            ),
            None => format!(
                "{} has {:.0} observations in the window ({} needed)",
                self.name, self.samples, config.min_latency_samples
            ),
        }
    }
}

/// Rule 1: the share the latency evidence asks for, and whether an objective is over its target (pressure).
fn latency_rule(
    objectives: &[Objective],
    current: f64,
    reference: f64,
    busy_note: &str,
    config: &Config,
    reasons: &mut Vec<Reason>,
) -> (f64, bool) {
    let mut reason = |code, message: String| reasons.push(compute_reason(code, message));
    if objectives.is_empty() {
        reason(
            ReasonCode::NoLatencyObjective,
            format!(
                "no latency objective (--ttft-slo / --itl-slo): no evidence a smaller share is safe, keeping \
                 {reference:.2}{busy_note}"
            ),
        );
        return (reference, false);
    }
    let band = |r: f64| {
        if (r - 1.0).abs() <= config.latency_tolerance {
            1.0
        } else {
            r
        }
    };
    // The objective asking the most decides (the max over TTFT and inter-token latency).
    let mut worst: Option<(f64, &Objective)> = None;
    for o in objectives {
        if let Some((p95, _)) = o.seen {
            let r = band(p95 / (config.latency_target_ratio * o.slo));
            if worst.is_none_or(|(w, _)| r > w) {
                worst = Some((r, o));
            }
        }
    }
    let missing: Vec<&Objective> = objectives.iter().filter(|o| o.seen.is_none()).collect();
    match worst {
        Some((r, o)) if r > 1.0 => {
            let desired = current * r;
            // A share cannot exceed the whole GPU: the reason shows the capped value, never more than 1.
            let shown = if desired > 1.0 {
                "1.00 (the whole GPU; more would be another replica)".to_string()
            } else {
                format!("{desired:.2}")
            };
            reason(
                ReasonCode::LatencyOverObjective,
                format!(
                    "{}: grow {current:.2} × {r:.2} = {shown}, never below {:.2} (what runs now or was \
                     recommended){busy_note}",
                    o.describe(config),
                    current.max(reference)
                ),
            );
            (desired, true)
        }
        _ if !missing.is_empty() => {
            reason(
                ReasonCode::TooFewLatencySamples,
                format!(
                    "{}: not enough evidence to shrink, keeping {reference:.2}{busy_note}",
                    missing
                        .iter()
                        .map(|o| o.describe(config))
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
            );
            (reference, false)
        }
        Some((r, o)) if r >= 1.0 => {
            reason(
                ReasonCode::LatencyWithinObjective,
                format!(
                    "{}: within ±{:.0}%, keeping {current:.2}{busy_note}",
                    o.describe(config),
                    config.latency_tolerance * 100.0
                ),
            );
            (current, false)
        }
        Some((r, o)) => {
            let desired = current * r;
            reason(
                ReasonCode::LatencyUnderObjective,
                format!(
                    "{} (the objective asking the most): shrink {current:.2} × {r:.2} = {desired:.2}{busy_note}",
                    o.describe(config)
                ),
            );
            (desired, false)
        }
        // Unreachable in practice: no evidence means `missing` is not empty. Keep, to be safe.
        None => (reference, false),
    }
}

/// Rule 2: when the replica is saturated at its share in enough of the samples, the share to grow to at least
/// (one step up from what runs now or was recommended, at most the whole GPU); `None` when it is not.
fn saturation_rule(
    window: &[Observation],
    current: f64,
    reference: f64,
    config: &Config,
    reasons: &mut Vec<Reason>,
) -> Option<f64> {
    let (saturated, seen) = saturation(window, config);
    if !(saturated > 0 && saturated as f64 >= config.saturation_min_ratio * seen as f64) {
        return None;
    }
    let grown = (current.max(reference) * config.compute_max_step_up).min(1.0);
    let what = if current.max(reference) >= 1.0 {
        "already at the whole GPU (1.00), so the share cannot grow".to_string()
    } else {
        format!("grow to at least {grown:.2}, never shrink")
    };
    reasons.push(compute_reason(
        ReasonCode::ComputeSaturated,
        format!(
            "{saturated} of {seen} samples busy ≥ {:.0}% (or preempting) while requests waited at share \
             {current:.2}: {what}",
            config.saturation_busy_ratio * 100.0
        ),
    ));
    Some(grown)
}

/// Rule 3: `desired` within one step of `reference` (at most `× compute_max_step_up` up, at most
/// `compute_max_step_down_ratio` down), the upper bound never below `floor`.
fn step_bounded(desired: f64, reference: f64, floor: f64, config: &Config, reasons: &mut Vec<Reason>) -> f64 {
    let upper = (reference * config.compute_max_step_up).max(floor).min(1.0);
    let lower = reference * (1.0 - config.compute_max_step_down_ratio);
    if desired > upper {
        reasons.push(compute_reason(
            ReasonCode::StepLimitedUp,
            format!(
                "compute share growth capped at ×{} per update: {desired:.2} → {upper:.2} (from {reference:.2})",
                config.compute_max_step_up
            ),
        ));
        upper
    } else if desired < lower {
        reasons.push(compute_reason(
            ReasonCode::StepLimitedDown,
            format!(
                "compute share shrink limited to {:.0}% per update: {desired:.2} → {lower:.2} (from {reference:.2})",
                config.compute_max_step_down_ratio * 100.0
            ),
        ));
        lower
    } else {
        desired
    }
}

/// The compute share's last rule: never below the share the replica's GPU memory already pays for in a pool
/// handing out `oversubscription` GPUs' worth of caps per GPU (see [`Config::compute_oversubscription`]). Rounded
/// *down* to hundredths, so that replicas filling a GPU's memory never add up to more caps than it hands out.
pub(super) fn memory_paid_share(
    share: f64,
    need: u64,
    total: u64,
    config: &Config,
    reasons: &mut Vec<Reason>,
) -> f64 {
    let Some(o) = config
        .compute_oversubscription
        .filter(|o| o.is_finite() && *o >= 1.0)
    else {
        return share;
    };
    let memory_fraction = need as f64 / total.max(1) as f64;
    let paid = ((o * memory_fraction * 100.0 + 1e-9).floor() / 100.0).min(1.0);
    if paid <= share {
        return share;
    }
    reasons.push(compute_reason(
        ReasonCode::MemoryPaysForShare,
        format!(
            "raised {share:.2} → {paid:.2}: the replica's {:.1}% of the GPU's memory, in a pool handing out {o} \
             GPUs of compute caps per GPU, already pays for {paid:.2}; a smaller cap packs nothing tighter and only \
             slows the replica while its GPU is idle",
            memory_fraction * 100.0
        ),
    ));
    paid
}
