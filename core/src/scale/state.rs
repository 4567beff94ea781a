//! The history one model's decisions need ([`ScaleState`]): the recommendations and scale events the windows and
//! rate limits read, the panic state, and what the cold-start rules carry from round to round (the day's ledger,
//! the claim a budget group reads, the last cold start measured). A plain value the caller keeps and passes back in.

use std::time::Duration;

#[cfg(doc)]
use super::joint;
use super::{Demand, ScaleDecision, ScalePolicy, Timestamp, coldstart};

/// A recommendation remembered for the stabilization windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recommendation {
    /// When it was made.
    pub at: Timestamp,
    /// Replicas recommended before stabilization.
    pub replicas: u32,
}

/// A scale that was carried out, remembered for the rate limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScaleEvent {
    /// When.
    pub at: Timestamp,
    /// From how many replicas.
    pub from: u32,
    /// To how many.
    pub to: u32,
}

/// The history one model's decisions need: a plain value the caller keeps and passes back in.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScaleState {
    /// Recent recommendations, oldest first.
    pub recommendations: Vec<Recommendation>,
    /// Recent scale events, oldest first.
    pub events: Vec<ScaleEvent>,
    /// When the panic condition was last true; panic lasts a stable window after it.
    pub last_panic_at: Option<Timestamp>,
    /// The highest replica count reached during the current panic (panic never scales below it).
    pub panic_peak: u32,
    /// What scaling to zero would have cost in missed objectives over the last day ([`coldstart`]), fed each round
    /// by [`joint::round`].
    pub cold_starts: coldstart::ColdStartLedger,
    /// What this model's last round published for its budget group's other members to read
    /// ([`coldstart::group`]; [`joint::round`] keeps [`joint::JointPolicy::claim`] here).
    pub claim: Option<coldstart::BudgetClaim>,
    /// The last cold start the caller measured ([`ScaleState::cold_start`]): a model at zero has no pod to measure.
    pub last_cold_start: Option<Duration>,
    /// The worst fresh TTFT p95 of the last minute's rounds, the trend the SLO guard's look-ahead reads
    /// ([`super::lookahead`]; fed by [`joint::round`]).
    pub ttft_seen: std::collections::VecDeque<(Timestamp, Duration)>,
    /// The workload class in force and the traffic's pending one ([`crate::class::stable`]; fed by
    /// [`crate::round::round`]).
    pub class: crate::class::ClassState,
    /// A day of per-minute request counts, for the class's traffic shape ([`crate::class::series`]).
    pub minutes: crate::class::MinuteSeries,
}

/// A copy of the ledger is exact for cold starts at least this long, whatever was measured: a start that grows
/// (a larger model version) reads buckets whole, which only adds misses.
const CHECKPOINT_EXACT_FOR: Duration = Duration::from_secs(120);

/// Upper bound on remembered recommendations, so a caller ticking very fast cannot grow the state without limit.
const MAX_HISTORY: usize = 4096;

impl ScaleState {
    /// Counts a round's demand into the cold-start ledger, before deciding: only for a policy with a
    /// `coldStartMissBudget`, the one reader of the ledger, so a model without one keeps no day of samples.
    /// [`joint::round`] calls this every round, whatever is decided.
    pub(crate) fn count_demand(&mut self, policy: &ScalePolicy, demand: &Demand, now: Timestamp) {
        if let Some(z) = policy
            .scale_to_zero
            .as_ref()
            .filter(|_| policy.keeps_cold_start_ledger())
        {
            self.cold_starts.observe(demand, z.idle_after, now);
        }
    }

    /// The model's cold start for this round: what the caller `measured` (the controller: its fastest ready pod),
    /// else the last it measured, so a model gone to zero still knows what a start from zero costs (its warm
    /// floor, and its part in a budget group, do not lapse while it has no pod). `None` until one was measured.
    pub(crate) fn cold_start(&mut self, measured: Option<Duration>) -> Option<Duration> {
        if measured.is_some() {
            self.last_cold_start = measured;
        }
        self.last_cold_start
    }

    /// A copy of what the cold-start rules carry past this process (the day's ledger and the last cold start
    /// measured), for the caller to keep where a successor can read it ([`coldstart::checkpoint`]). `None` when
    /// there is nothing to resume from.
    pub fn checkpoint(&self, now: Timestamp) -> Option<coldstart::LedgerCheckpoint> {
        let exact_for = self
            .last_cold_start
            .map_or(CHECKPOINT_EXACT_FOR, |c| c.max(CHECKPOINT_EXACT_FOR));
        let mut copy = self.cold_starts.checkpoint(exact_for, now)?;
        copy.cold_start = self.last_cold_start;
        Some(copy)
    }

    /// Whether a copy taken now is worth writing over `written` (the state resumed from the copy the caller keeps):
    /// only once the kept copy is [`coldstart::checkpoint::COPY_EVERY`] old and something new was counted since
    /// (requests, or another cold start measured), so a model at zero costs no writes and a busy one one a
    /// [`coldstart::checkpoint::COPY_EVERY`]. Never before the ledger has counted a sync.
    pub fn copy_due(&self, written: &ScaleState) -> bool {
        let Some((at, total)) = self.cold_starts.last_sync() else {
            return false;
        };
        let Some((written_at, written_total)) = written.cold_starts.last_sync() else {
            return true;
        };
        let young = at.since(written_at) < coldstart::checkpoint::COPY_EVERY;
        let same = total == written_total && self.last_cold_start == written.last_cold_start;
        !(young || same)
    }

    /// The state a successor starts from: the ledger and the last cold start of a copy [`ScaleState::checkpoint`]
    /// wrote, and no windows (a scale-down waits a whole window again, which is safe). `now` checks the copy
    /// against this process's clock.
    pub fn resume(
        copy: &coldstart::LedgerCheckpoint,
        now: Timestamp,
    ) -> Result<Self, coldstart::CheckpointError> {
        Ok(ScaleState {
            cold_starts: coldstart::ColdStartLedger::restore(copy, now)?,
            last_cold_start: copy.cold_start,
            ..ScaleState::default()
        })
    }

    /// Remembers a decision the caller acted on (or chose to keep), and forgets what no window can see any more.
    pub fn record(&mut self, decision: &ScaleDecision, now: Timestamp) {
        self.recommendations.push(Recommendation {
            at: now,
            replicas: decision.recommendation,
        });
        if decision.is_change() {
            self.events.push(ScaleEvent {
                at: now,
                from: decision.current_replicas,
                to: decision.desired_replicas,
            });
        }
        if decision.panicking {
            if decision.panic_triggered || self.last_panic_at.is_none() {
                self.last_panic_at = Some(now);
            }
            self.panic_peak = self.panic_peak.max(decision.desired_replicas);
        } else {
            self.last_panic_at = None;
            self.panic_peak = 0;
        }
        let horizon = decision.history_horizon;
        self.recommendations.retain(|r| r.at.is_within(horizon, now));
        self.events.retain(|e| e.at.is_within(horizon, now));
        if self.recommendations.len() > MAX_HISTORY {
            let excess = self.recommendations.len() - MAX_HISTORY;
            self.recommendations.drain(..excess);
        }
        if self.events.len() > MAX_HISTORY {
            let excess = self.events.len() - MAX_HISTORY;
            self.events.drain(..excess);
        }
    }
}
