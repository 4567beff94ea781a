//! Keeping a batch on pace for its deadline at the least cost.
//!
//! A batch first fills the spare room of the model's existing replicas (the lowest-priority lane: free, and
//! refused before it can slow a real-time request). That is enough while the lines left, at the rate the spare
//! room has measured, finish before the deadline with a safety margin. When it is not, the batch asks for
//! replicas of its own, as few as finish the rest in time, on the cheapest capacity type that still makes it:
//!
//! - an interruptible type (spot) must leave room for one reclaim: its replicas are sized to finish in the time
//!   left less **two** cold starts (the first start, and the replacement of a reclaimed pod, whose in-flight lines
//!   go back to the queue);
//! - a reliable type (on-demand) needs room for one cold start.
//!
//! So the expensive type is chosen only once the slack, cold starts included, has run out for the cheaper one.
//! When even a reliable replica would come up after the deadline, adding one is no use and the rule says so.
//!
//! The rule is stateless: it returns the replicas the batch should have *now* (not a change), so a round that
//! runs again while the replicas are still starting asks for the same number, not more.

use std::time::Duration;

/// How long the spare room's rate is measured before it is trusted (see [`PaceInput::spare_measured_for`]).
pub const MEASURE_SPARE: Duration = Duration::from_secs(120);

/// A capacity type the pool offers for batch replicas.
#[derive(Debug, Clone, PartialEq)]
pub struct CapacityOffer {
    /// Its name (`spot`, `on-demand`, a node pool's label value).
    pub name: String,
    /// List price of one replica's GPU share, per hour.
    pub price_per_hour: f64,
    /// Replicas of this type that can be placed now, besides those already serving the batch.
    pub available: u32,
    /// Replicas of this type already serving the batch (warm: they need no cold start to keep going).
    pub ready: u32,
    /// The provider may take it back at short notice (spot, preemptible).
    pub interruptible: bool,
}

/// What the pacing rule looks at for one batch.
#[derive(Debug, Clone, PartialEq)]
pub struct PaceInput {
    /// When the batch started running (Unix ms).
    pub started_ms: u64,
    /// When it must be done (Unix ms): creation plus the completion window.
    pub deadline_ms: u64,
    /// Now (Unix ms).
    pub now_ms: u64,
    /// Lines answered.
    pub done: u64,
    /// Lines left.
    pub remaining: u64,
    /// Lines per second the batch gets now from the spare room of the shared replicas (measured).
    pub spare_lines_per_s: f64,
    /// How long the spare rate has been measured for: a rate measured for less than [`MEASURE_SPARE`] says
    /// little, so the rule fills spare room for that long before it pays for replicas, while the deadline allows.
    pub spare_measured_for: Duration,
    /// Lines per second one replica of its own answers (measured, or the model's estimate).
    pub per_replica_lines_per_s: f64,
    /// Time from asking for a replica to its first answer.
    pub cold_start: Duration,
    /// Fraction of the time left kept in reserve (0.1: plan to finish with a tenth of the window to spare).
    pub margin: f64,
    /// The capacity types on offer.
    pub offers: Vec<CapacityOffer>,
}

/// What to do for the batch.
#[derive(Debug, Clone, PartialEq)]
pub enum PaceAction {
    /// Nothing left to do.
    Done,
    /// Fill the shared replicas' spare room only (no replicas of its own).
    FillSpare,
    /// Have `replicas` replicas of capacity type `offer` for this batch (besides the spare room).
    Add {
        /// The capacity type's name.
        offer: String,
        /// How many replicas in all.
        replicas: u32,
    },
}

/// Why, with the figures behind it.
#[derive(Debug, Clone, PartialEq)]
pub enum PaceReason {
    /// Every line is answered.
    Finished,
    /// The spare room's rate is still being measured, and waiting for it leaves time to add replicas after.
    Measuring {
        /// Seconds it has been measured for.
        measured_s: f64,
    },
    /// The spare room alone finishes in time.
    SpareSuffices {
        /// Seconds to finish on spare room at the measured rate.
        finish_in_s: f64,
        /// Seconds left to the deadline.
        left_s: f64,
        /// Whether progress is at or ahead of a uniform pace over the window.
        ahead_of_pace: bool,
    },
    /// Spare room is not enough; the cheapest offer that makes the deadline.
    Behind {
        /// Seconds to finish on spare room (infinite without any).
        finish_on_spare_s: f64,
        /// Seconds left to the deadline.
        left_s: f64,
        /// Cost per hour of the choice.
        cost_per_hour: f64,
    },
    /// No offer has enough replicas available: the most that can be had, still short of the deadline.
    Short {
        /// Replicas the deadline needs on the offer chosen.
        needed: u32,
    },
    /// A replica asked for now would start after the deadline: adding one cannot help.
    TooLate {
        /// Seconds left to the deadline.
        left_s: f64,
        /// The cold start, seconds.
        cold_start_s: f64,
    },
    /// Replicas of its own are needed but their rate is unknown (no measurement yet), or no offer exists.
    NoEstimate,
}

impl std::fmt::Display for PaceReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PaceReason::Finished => write!(f, "every line is answered"),
            PaceReason::Measuring { measured_s } => write!(
                f,
                "measuring the spare room's rate ({measured_s:.0}s of {}s) before paying for replicas",
                MEASURE_SPARE.as_secs()
            ),
            PaceReason::SpareSuffices {
                finish_in_s,
                left_s,
                ahead_of_pace,
            } => write!(
                f,
                "spare room finishes in {finish_in_s:.0}s of the {left_s:.0}s left ({} uniform pace)",
                if *ahead_of_pace {
                    "at or ahead of"
                } else {
                    "behind"
                }
            ),
            PaceReason::Behind {
                finish_on_spare_s,
                left_s,
                cost_per_hour,
            } => write!(
                f,
                "spare room alone would take {finish_on_spare_s:.0}s of the {left_s:.0}s left; cheapest capacity that \
                 meets the deadline costs {cost_per_hour:.2}/h"
            ),
            PaceReason::Short { needed } => {
                write!(
                    f,
                    "the deadline needs {needed} replicas and fewer are available; taking what there is"
                )
            }
            PaceReason::TooLate { left_s, cold_start_s } => write!(
                f,
                "{left_s:.0}s left is less than a cold start ({cold_start_s:.0}s): a new replica would come too late"
            ),
            PaceReason::NoEstimate => write!(
                f,
                "behind pace, but no replica rate is measured or no capacity is offered"
            ),
        }
    }
}

/// The rule's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct PaceDecision {
    /// What to do.
    pub action: PaceAction,
    /// Why.
    pub reason: PaceReason,
}

/// Replicas of `per_replica` lines/s that, with `spare` lines/s beside them, finish `remaining` lines within
/// `usable_s` seconds, `ready` of them already serving. Shrinking to at most `ready` needs no start; growing past it
/// waits `startup_s` for the new ones (while the spare room and the ready ones keep working).
fn replicas_for(
    remaining: f64,
    spare: f64,
    per_replica: f64,
    startup_s: f64,
    usable_s: f64,
    ready: u32,
) -> Option<u32> {
    if per_replica <= 0.0 || usable_s <= 0.0 {
        return None;
    }
    let warm = ((remaining / usable_s - spare) / per_replica).ceil().max(0.0);
    if warm <= f64::from(ready) {
        return Some(warm as u32);
    }
    let run_s = usable_s - startup_s;
    if run_s <= 0.0 {
        return None;
    }
    let during_start = (spare + f64::from(ready) * per_replica) * startup_s;
    let after_start = (remaining - during_start).max(0.0);
    let rate = after_start / run_s - spare;
    if rate <= 0.0 {
        return Some(ready);
    }
    let n = (rate / per_replica).ceil().max(f64::from(ready));
    (n <= f64::from(u32::MAX)).then_some(n as u32)
}

/// What keeps the batch on pace (see the module docs). `now` is in the input.
pub fn pace(input: &PaceInput) -> PaceDecision {
    let decide = |action, reason| PaceDecision { action, reason };
    if input.remaining == 0 {
        return decide(PaceAction::Done, PaceReason::Finished);
    }
    let left_s = input.deadline_ms.saturating_sub(input.now_ms) as f64 / 1000.0;
    let spare = if input.spare_lines_per_s.is_finite() {
        input.spare_lines_per_s.max(0.0)
    } else {
        0.0
    };
    let remaining = input.remaining as f64;
    let finish_on_spare_s = if spare > 0.0 {
        remaining / spare
    } else {
        f64::INFINITY
    };
    let margin = if input.margin.is_finite() {
        input.margin.clamp(0.0, 0.9)
    } else {
        0.1
    };
    let usable_s = left_s * (1.0 - margin);
    let cold_s = input.cold_start.as_secs_f64();
    let measure_left = MEASURE_SPARE
        .saturating_sub(input.spare_measured_for)
        .as_secs_f64();
    let serving: u32 = input.offers.iter().map(|o| o.ready).sum();
    // Keep measuring while nothing of its own serves yet and the wait still leaves time for two cold starts (a
    // spot replica and its replacement) after it.
    if measure_left > 0.0 && serving == 0 && usable_s - measure_left > 2.0 * cold_s {
        return decide(
            PaceAction::FillSpare,
            PaceReason::Measuring {
                measured_s: input.spare_measured_for.as_secs_f64(),
            },
        );
    }
    if finish_on_spare_s <= usable_s {
        let window = input.deadline_ms.saturating_sub(input.started_ms).max(1) as f64;
        let elapsed = input.now_ms.saturating_sub(input.started_ms) as f64;
        let total = (input.done + input.remaining) as f64;
        let ahead_of_pace = input.done as f64 >= total * (elapsed / window).min(1.0);
        return decide(
            PaceAction::FillSpare,
            PaceReason::SpareSuffices {
                finish_in_s: finish_on_spare_s,
                left_s,
                ahead_of_pace,
            },
        );
    }
    if left_s <= cold_s && serving == 0 {
        return decide(
            PaceAction::FillSpare,
            PaceReason::TooLate {
                left_s,
                cold_start_s: cold_s,
            },
        );
    }
    let per = if input.per_replica_lines_per_s.is_finite() {
        input.per_replica_lines_per_s
    } else {
        0.0
    };
    // Each offer with the replicas it needs: interruptible ones budget a second cold start for a reclaim.
    let sized: Vec<(&CapacityOffer, Option<u32>)> = input
        .offers
        .iter()
        .map(|o| {
            let starts = if o.interruptible { 2.0 } else { 1.0 };
            (
                o,
                replicas_for(remaining, spare, per, cold_s * starts, usable_s, o.ready),
            )
        })
        .collect();
    let best = sized
        .iter()
        .filter_map(|(o, n)| {
            n.filter(|n| n.saturating_sub(o.ready) <= o.available)
                .map(|n| (*o, n))
        })
        .min_by(|a, b| {
            (a.0.price_per_hour * f64::from(a.1)).total_cmp(&(b.0.price_per_hour * f64::from(b.1)))
        });
    if let Some((offer, replicas)) = best {
        return decide(
            PaceAction::Add {
                offer: offer.name.clone(),
                replicas: replicas.max(1),
            },
            PaceReason::Behind {
                finish_on_spare_s,
                left_s,
                cost_per_hour: offer.price_per_hour * f64::from(replicas.max(1)),
            },
        );
    }
    // Nothing available is enough: the reliable offer with the most room (a reclaim now would only lose more),
    // then any offer, taking all it has.
    let fallback = sized
        .iter()
        .filter_map(|(o, n)| n.map(|n| (*o, n)))
        .filter(|(o, _)| o.available + o.ready > 0)
        .max_by_key(|(o, _)| (!o.interruptible, o.available + o.ready));
    match fallback {
        Some((offer, needed)) => decide(
            PaceAction::Add {
                offer: offer.name.clone(),
                replicas: offer.available + offer.ready,
            },
            PaceReason::Short { needed },
        ),
        None => decide(PaceAction::FillSpare, PaceReason::NoEstimate),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    fn offers(spot_avail: u32, od_avail: u32) -> Vec<CapacityOffer> {
        vec![
            CapacityOffer {
                name: "on-demand".into(),
                price_per_hour: 4.0,
                available: od_avail,
                ready: 0,
                interruptible: false,
            },
            CapacityOffer {
                name: "spot".into(),
                price_per_hour: 1.2,
                available: spot_avail,
                ready: 0,
                interruptible: true,
            },
        ]
    }

    /// A day-long window, `hours_left` of it left, `remaining` lines, 10 lines/s per replica, 2 min cold start.
    fn input(hours_left: f64, remaining: u64, spare: f64) -> PaceInput {
        let deadline_ms = 86_400_000;
        PaceInput {
            started_ms: 0,
            deadline_ms,
            now_ms: deadline_ms - (hours_left * 3_600_000.0) as u64,
            done: 1_000,
            remaining,
            spare_lines_per_s: spare,
            spare_measured_for: MEASURE_SPARE,
            per_replica_lines_per_s: 10.0,
            cold_start: Duration::from_secs(120),
            margin: 0.1,
            offers: offers(10, 10),
        }
    }

    #[test]
    fn spare_room_is_enough_while_it_finishes_in_time() {
        let d = pace(&input(10.0, 100_000, 5.0));
        assert_eq!(d.action, PaceAction::FillSpare);
        assert!(
            d.reason.to_string().contains("spare room finishes in 20000s"),
            "{}",
            d.reason
        );
    }

    #[test]
    fn behind_pace_takes_spot_then_on_demand_when_the_slack_runs_out() {
        // 1 h left, 100,000 lines, 5 lines/s spare: needs ~3 replicas of its own; spot has the room.
        let d = pace(&input(1.0, 100_000, 5.0));
        assert_eq!(
            d.action,
            PaceAction::Add {
                offer: "spot".into(),
                replicas: 3
            }
        );
        // No spot available: on-demand.
        let mut i = input(1.0, 100_000, 5.0);
        i.offers = offers(0, 10);
        assert!(matches!(pace(&i).action, PaceAction::Add { ref offer, .. } if offer == "on-demand"));
        // 5 min left: a spot replica plus a reclaim's replacement would not fit; on-demand still does.
        let mut i = input(5.0 / 60.0, 3_000, 0.0);
        i.offers = offers(100, 100);
        let d = pace(&i);
        assert!(
            matches!(d.action, PaceAction::Add { ref offer, .. } if offer == "on-demand"),
            "{d:?}"
        );
        // 90 s left with a 120 s cold start: too late to add anything.
        let d = pace(&input(90.0 / 3600.0, 3_000, 0.0));
        assert_eq!(d.action, PaceAction::FillSpare);
        assert!(matches!(d.reason, PaceReason::TooLate { .. }));
        assert_eq!(pace(&input(1.0, 0, 0.0)).action, PaceAction::Done);
    }

    #[test]
    fn it_measures_the_spare_room_first_and_counts_warm_replicas_without_a_start() {
        // Just submitted, spare rate unmeasured: fill spare for the measuring time, the deadline allows it.
        let mut i = input(10.0, 1_000_000, 0.0);
        i.spare_measured_for = Duration::from_secs(30);
        assert!(matches!(pace(&i).reason, PaceReason::Measuring { .. }));
        // With 5 minutes left there is no time to measure: it decides at once.
        let mut i = input(5.0 / 60.0, 3_000, 0.0);
        i.spare_measured_for = Duration::ZERO;
        i.offers = offers(100, 100);
        assert!(matches!(pace(&i).action, PaceAction::Add { .. }));
        // Three spot replicas serve already: 1 h left, 100,000 lines, 5 lines/s spare needs 3 without a start,
        // where from nothing it needs the same 3 only because the start is short; at 10 minutes left, warm ones
        // keep the count where new ones would need more.
        let mut warm = input(10.0 / 60.0, 5_000, 0.0);
        warm.offers = offers(10, 10);
        let cold = pace(&warm);
        warm.offers[1].ready = 1;
        warm.offers[1].available = 9;
        let d = pace(&warm);
        assert_eq!(
            d.action,
            PaceAction::Add {
                offer: "spot".into(),
                replicas: 1
            },
            "{d:?} (from nothing: {cold:?})"
        );
        assert!(
            matches!(cold.action, PaceAction::Add { ref offer, replicas } if offer != "spot" || replicas > 1),
            "{cold:?}"
        );
    }

    #[test]
    fn short_of_capacity_takes_all_there_is_of_the_reliable_kind() {
        let mut i = input(1.0, 1_000_000, 0.0);
        i.offers = offers(3, 4);
        let d = pace(&i);
        assert_eq!(
            d.action,
            PaceAction::Add {
                offer: "on-demand".into(),
                replicas: 4
            }
        );
        assert!(matches!(d.reason, PaceReason::Short { .. }));
        i.per_replica_lines_per_s = 0.0;
        assert_eq!(pace(&i).reason, PaceReason::NoEstimate);
    }

    proptest! {
        /// Whatever the figures: an added choice is within what is available (unless short), and, when not
        /// short, the replicas chosen (with the spare room) finish the lines before the deadline even after the
        /// cold starts the capacity type budgets.
        #[test]
        fn a_choice_meets_the_deadline(
            hours_left in 0.01f64..24.0, remaining in 1u64..2_000_000, spare in 0.0f64..50.0,
            per in 0.5f64..50.0, cold in 10u64..900, spot in 0u32..50, od in 0u32..50,
        ) {
            let mut i = input(hours_left, remaining, spare);
            i.per_replica_lines_per_s = per;
            i.cold_start = Duration::from_secs(cold);
            i.offers = offers(spot, od);
            let d = pace(&i);
            let left = i.deadline_ms.saturating_sub(i.now_ms) as f64 / 1000.0;
            match (&d.action, &d.reason) {
                (PaceAction::FillSpare, PaceReason::SpareSuffices { finish_in_s, .. }) => {
                    prop_assert!(*finish_in_s <= left);
                }
                (PaceAction::Add { offer, replicas }, PaceReason::Behind { .. }) => {
                    let o = i.offers.iter().find(|o| &o.name == offer).unwrap();
                    prop_assert!(*replicas <= o.available.max(1));
                    let starts = if o.interruptible { 2.0 } else { 1.0 };
                    let start = cold as f64 * starts;
                    let lines = spare * left + f64::from(*replicas) * per * (left * 0.9 - start);
                    prop_assert!(lines + 1e-6 >= remaining as f64, "{lines} < {remaining}");
                    // Never the dearer offer when the cheaper one has room for what it needs.
                    if !o.interruptible {
                        let spot_n = replicas_for(remaining as f64, spare, per, start * 2.0, left * 0.9, 0);
                        prop_assert!(spot_n.is_none_or(|n| n > spot || 1.2 * f64::from(n) > 4.0 * f64::from(*replicas)));
                    }
                }
                (PaceAction::Add { offer, replicas }, PaceReason::Short { .. }) => {
                    let o = i.offers.iter().find(|o| &o.name == offer).unwrap();
                    prop_assert_eq!(*replicas, o.available);
                }
                (PaceAction::FillSpare, PaceReason::TooLate { .. } | PaceReason::NoEstimate) => {}
                other => prop_assert!(false, "unexpected {other:?}"),
            }
        }
    }
}
