//! Why a model's time to first token is over its `ttftP95` target, from what a sidecar really reports, and what
//! the replica-count target may ask for because of it.
//!
//! A TTFT is the wait in vLLM's queue (or at the activator) plus the prefill. Another replica shortens the wait;
//! it does not shorten a prefill (beyond splitting the next burst), so a target that adds replicas for a
//! prefill-bound TTFT buys GPUs that do not move it (issue 57: 38–60% of two bursty chat models' scale-ups). The
//! evidence must hold over the whole window the TTFT was measured on, not one instant: the `num_requests_waiting`
//! gauge alone misreads a burst that queued and drained between two scrapes as prefill (measured over the corpus,
//! `docs/simulator-experiments.md`, "The lever matches the cause"). So the window's own queue time
//! (`vllm:request_queue_time_seconds`, the sidecar's `recent.queueTimeSeconds`) decides, and the gauge must agree.
//!
//! The rule, per fresh replica whose TTFT p95 is over the target: another replica removes at most that replica's
//! queue time, so when the window's queue-time p95 is smaller than the TTFT's excess over the target, no count
//! of replicas brings it under the target: prefill. A replica with something waiting now, a request held at the
//! activator, or a replica without a queue-time reading (an older vLLM or sidecar) keeps today's answer. The
//! SLO guard (`scale::decide`, step 3) is not touched: an objective missed still asks for a replica.

use std::time::Duration;

use super::{ReplicaSignals, ScaleInput, SignalDecision};

/// What the time over the TTFT target is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TtftCause {
    /// Requests wait: at the activator, in a replica's queue now, or long enough in the window's queue to
    /// explain the excess. Another replica shortens it.
    Queue,
    /// Nothing waits now and each replica over the target queued (p95 over the window) less than its TTFT is
    /// over the target: the time is prefill. `excess` and `queue` are the replica's with the largest excess.
    Prefill {
        /// The TTFT p95 over the target.
        excess: Duration,
        /// That replica's queue-time p95 over the same window.
        queue: Duration,
    },
    /// Nothing waits now, but a replica over the target has no queue-time reading: the gauge says prefill and
    /// nothing confirms it over the window, so the target keeps its answer.
    PrefillByGaugeOnly,
}

/// Why the TTFT is over `target`; `None` when no fresh replica reports a TTFT over it.
pub fn ttft_cause(input: &ScaleInput, target: Duration) -> Option<TtftCause> {
    let fresh: Vec<&ReplicaSignals> = input.replicas.iter().filter(|r| r.fresh).collect();
    let over: Vec<(&ReplicaSignals, Duration)> = fresh
        .iter()
        .filter_map(|r| Some((*r, r.ttft_p95?.checked_sub(target).filter(|e| !e.is_zero())?)))
        .collect();
    if over.is_empty() {
        return None;
    }
    // Missing queue data never reads as "nothing waits".
    let waiting_now = input.demand.queued_at_activator > 0 || fresh.iter().any(|r| r.waiting != Some(0));
    if waiting_now {
        return Some(TtftCause::Queue);
    }
    let mut worst: Option<(Duration, Duration)> = None;
    for (r, excess) in over {
        let Some(queue) = r.queue_p95 else {
            return Some(TtftCause::PrefillByGaugeOnly);
        };
        if queue >= excess {
            return Some(TtftCause::Queue);
        }
        if worst.is_none_or(|(e, _)| excess > e) {
            worst = Some((excess, queue));
        }
    }
    worst.map(|(excess, queue)| TtftCause::Prefill { excess, queue })
}

/// The replica-count target under a prefill-bound TTFT: its proposal is held at the current count (it may still
/// ask for fewer). Returns the cause when it held one, for the decision's message.
pub fn hold_prefill_bound(
    signals: &mut [SignalDecision],
    input: &ScaleInput,
    current: u32,
) -> Option<TtftCause> {
    let s = signals
        .iter_mut()
        .find(|s| s.signal == super::Signal::TtftP95 && s.proposed.is_some_and(|p| p > current))?;
    let cause = ttft_cause(input, Duration::from_secs_f64(s.target.max(0.0)))?;
    if !matches!(cause, TtftCause::Prefill { .. }) {
        return None;
    }
    s.proposed = Some(current);
    Some(cause)
}

impl std::fmt::Display for TtftCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TtftCause::Queue => f.write_str("requests wait: another replica shortens the wait"),
            TtftCause::Prefill { excess, queue } => write!(
                f,
                "the TTFT target asks for no replica: the time is in prefill (queue time p95 {:.3}s over the window, \
                 under the {:.3}s the TTFT p95 is over the target; another replica removes at most the wait)",
                queue.as_secs_f64(),
                excess.as_secs_f64()
            ),
            TtftCause::PrefillByGaugeOnly => f.write_str(
                "nothing waits now, but no queue-time histogram confirms it over the window: the target keeps its answer",
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(ttft_ms: u64, queue_ms: Option<u64>, waiting: Option<u32>) -> ReplicaSignals {
        ReplicaSignals {
            waiting,
            running: Some(3),
            ttft_p95: Some(Duration::from_millis(ttft_ms)),
            queue_p95: queue_ms.map(Duration::from_millis),
            fresh: true,
            ..ReplicaSignals::default()
        }
    }

    fn input(replicas: Vec<ReplicaSignals>, held: u32) -> ScaleInput {
        let mut i = ScaleInput {
            current_replicas: replicas.len() as u32,
            ready_replicas: replicas.len() as u32,
            replicas,
            ..ScaleInput::default()
        };
        i.demand.queued_at_activator = held;
        i
    }

    const TARGET: Duration = Duration::from_secs(1);

    #[test]
    fn a_window_that_queued_less_than_the_excess_is_prefill() {
        let c = ttft_cause(
            &input(
                vec![replica(2_000, Some(100), Some(0)), replica(800, None, Some(0))],
                0,
            ),
            TARGET,
        );
        assert_eq!(
            c,
            Some(TtftCause::Prefill {
                excess: Duration::from_secs(1),
                queue: Duration::from_millis(100)
            })
        );
        let said = c.map(|c| c.to_string()).unwrap_or_default();
        assert!(said.contains("queue time p95 0.100s"), "{said}");
    }

    #[test]
    fn a_wait_anywhere_or_a_missing_reading_keeps_the_targets_answer() {
        let cases = [
            // The window queued as long as the excess: more replicas would help.
            (
                input(vec![replica(2_000, Some(1_000), Some(0))], 0),
                Some(TtftCause::Queue),
            ),
            // Something waits now, on one replica or at the activator.
            (
                input(vec![replica(2_000, Some(10), Some(2))], 0),
                Some(TtftCause::Queue),
            ),
            (
                input(vec![replica(2_000, Some(10), None)], 0),
                Some(TtftCause::Queue),
            ),
            (
                input(vec![replica(2_000, Some(10), Some(0))], 3),
                Some(TtftCause::Queue),
            ),
            // No queue-time histogram (older vLLM or sidecar): the gauge alone is not enough.
            (
                input(vec![replica(2_000, None, Some(0))], 0),
                Some(TtftCause::PrefillByGaugeOnly),
            ),
            // Under the target: nothing to attribute.
            (input(vec![replica(900, Some(10), Some(0))], 0), None),
        ];
        for (i, want) in cases {
            assert_eq!(ttft_cause(&i, TARGET), want, "{i:?}");
        }
    }

    #[test]
    fn only_a_prefill_bound_target_is_held_and_it_may_still_scale_down() {
        let signal = |proposed| SignalDecision {
            signal: super::super::Signal::TtftP95,
            value: Some(2.0),
            target: 1.0,
            proposed: Some(proposed),
            reporting_replicas: 2,
            missing_replicas: 0,
        };
        let prefill = input(vec![replica(2_000, Some(50), Some(0)); 2], 0);
        let mut s = vec![signal(4)];
        assert!(hold_prefill_bound(&mut s, &prefill, 2).is_some());
        assert_eq!(s[0].proposed, Some(2));
        let queued = input(vec![replica(2_000, Some(1_500), Some(0)); 2], 0);
        let mut s = vec![signal(4)];
        assert_eq!(hold_prefill_bound(&mut s, &queued, 2), None);
        assert_eq!(s[0].proposed, Some(4));
        let mut s = vec![signal(1)];
        assert_eq!(hold_prefill_bound(&mut s, &prefill, 2), None);
        assert_eq!(s[0].proposed, Some(1));
    }
}
