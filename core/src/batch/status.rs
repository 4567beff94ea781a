//! The batch object's statuses (OpenAI's names) and the one table of which event moves a batch from which
//! status to which. The runner and the API both go through [`BatchStatus::on`], so a cancel arriving while a
//! batch finalizes, or a second runner replaying an event after a crash, cannot put a batch in a state the API
//! never promised.

use serde::{Deserialize, Serialize};

/// A batch's status, as the OpenAI API spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchStatus {
    /// The input file is being checked (all or nothing).
    Validating,
    /// The input failed validation; no line was sent.
    Failed,
    /// Lines are being sent.
    InProgress,
    /// Every line is answered; the result files are being closed.
    Finalizing,
    /// Done: every line is in the output or the error file.
    Completed,
    /// The completion window passed; unfinished lines are in the error file as `batch_expired`.
    Expired,
    /// A cancel was asked for; lines in flight finish, the rest go to the error file as `batch_cancelled`.
    Cancelling,
    /// Cancelled: every line is in the output or the error file.
    Cancelled,
}

/// What happens to a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchEvent {
    /// The whole input file passed validation.
    Validated,
    /// A line of the input failed validation.
    ValidationFailed,
    /// Every line has its answer in a result file.
    AllAnswered,
    /// The result files are closed.
    Finalized,
    /// A client asked for a cancel.
    CancelRequested,
    /// Every line of a cancelled batch has its answer (sent, or `batch_cancelled`).
    CancelDone,
    /// The completion window passed with lines unanswered (they were written as `batch_expired`).
    DeadlinePassed,
}

/// An event that does not apply to a batch in its status (e.g. cancelling a completed batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a batch that is {} cannot take {event:?}", from.as_str())]
pub struct BadTransition {
    /// The status the batch was in.
    pub from: BatchStatus,
    /// The event refused.
    pub event: BatchEvent,
}

impl BatchStatus {
    /// The OpenAI spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            BatchStatus::Validating => "validating",
            BatchStatus::Failed => "failed",
            BatchStatus::InProgress => "in_progress",
            BatchStatus::Finalizing => "finalizing",
            BatchStatus::Completed => "completed",
            BatchStatus::Expired => "expired",
            BatchStatus::Cancelling => "cancelling",
            BatchStatus::Cancelled => "cancelled",
        }
    }

    /// Whether nothing more happens to the batch.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            BatchStatus::Failed | BatchStatus::Completed | BatchStatus::Expired | BatchStatus::Cancelled
        )
    }

    /// Whether a runner has work to do on the batch (its input file may not be deleted meanwhile).
    pub fn is_running(self) -> bool {
        matches!(
            self,
            BatchStatus::Validating
                | BatchStatus::InProgress
                | BatchStatus::Finalizing
                | BatchStatus::Cancelling
        )
    }

    /// The status after `event`. A cancel of a batch already cancelling is the same status (the API answers
    /// the batch, as OpenAI does), every other event outside the table is refused.
    pub fn on(self, event: BatchEvent) -> Result<BatchStatus, BadTransition> {
        use BatchEvent as E;
        use BatchStatus as S;
        let next = match (self, event) {
            (S::Validating, E::Validated) => S::InProgress,
            (S::Validating, E::ValidationFailed) => S::Failed,
            (S::InProgress, E::AllAnswered) => S::Finalizing,
            (S::Finalizing, E::Finalized) => S::Completed,
            (S::Validating | S::InProgress | S::Cancelling, E::CancelRequested) => S::Cancelling,
            (S::Cancelling, E::CancelDone) => S::Cancelled,
            // A batch that passed its window while validating or running ends expired; one that is cancelling
            // ends cancelled whatever the clock says (the client asked for that first).
            (S::Validating | S::InProgress, E::DeadlinePassed) => S::Expired,
            _ => return Err(BadTransition { from: self, event }),
        };
        Ok(next)
    }
}

/// OpenAI's `request_counts`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RequestCounts {
    /// Lines in the input.
    pub total: u64,
    /// Lines answered with a 2xx from the model (in the output file).
    pub completed: u64,
    /// Lines answered otherwise (in the error file: an error from the model, cancelled, expired).
    pub failed: u64,
}

impl RequestCounts {
    /// Lines with no answer yet.
    pub fn remaining(&self) -> u64 {
        self.total.saturating_sub(self.completed + self.failed)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    const ALL: [BatchStatus; 8] = [
        BatchStatus::Validating,
        BatchStatus::Failed,
        BatchStatus::InProgress,
        BatchStatus::Finalizing,
        BatchStatus::Completed,
        BatchStatus::Expired,
        BatchStatus::Cancelling,
        BatchStatus::Cancelled,
    ];
    const EVENTS: [BatchEvent; 7] = [
        BatchEvent::Validated,
        BatchEvent::ValidationFailed,
        BatchEvent::AllAnswered,
        BatchEvent::Finalized,
        BatchEvent::CancelRequested,
        BatchEvent::CancelDone,
        BatchEvent::DeadlinePassed,
    ];

    #[test]
    fn the_happy_path_and_the_cancel_path() {
        let s = BatchStatus::Validating.on(BatchEvent::Validated).unwrap();
        assert_eq!(s, BatchStatus::InProgress);
        let s = s.on(BatchEvent::AllAnswered).unwrap();
        assert_eq!(s.on(BatchEvent::Finalized), Ok(BatchStatus::Completed));
        let c = BatchStatus::InProgress.on(BatchEvent::CancelRequested).unwrap();
        assert_eq!(c.on(BatchEvent::CancelRequested), Ok(BatchStatus::Cancelling));
        assert_eq!(c.on(BatchEvent::CancelDone), Ok(BatchStatus::Cancelled));
        let err = BatchStatus::Completed
            .on(BatchEvent::CancelRequested)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "a batch that is completed cannot take CancelRequested"
        );
        assert_eq!(
            serde_json::to_string(&BatchStatus::InProgress).unwrap(),
            "\"in_progress\""
        );
    }

    #[test]
    fn counts_remaining_never_underflows() {
        let c = RequestCounts {
            total: 3,
            completed: 2,
            failed: 2,
        };
        assert_eq!(c.remaining(), 0);
    }

    proptest! {
        /// A final status takes no event; every reachable status is reachable from `validating`; the spelling
        /// round-trips through serde.
        #[test]
        fn final_statuses_are_final(events in proptest::collection::vec(0usize..7, 0..20)) {
            let mut s = BatchStatus::Validating;
            for e in events {
                match s.on(EVENTS[e]) {
                    Ok(next) => { prop_assert!(!s.is_final()); s = next; }
                    Err(err) => prop_assert_eq!(err.from, s),
                }
                let round: BatchStatus = serde_json::from_str(&format!("\"{}\"", s.as_str())).unwrap();
                prop_assert_eq!(round, s);
            }
            for st in ALL {
                if st.is_final() {
                    for e in EVENTS { prop_assert!(st.on(e).is_err()); }
                }
                prop_assert!(!(st.is_final() && st.is_running()));
            }
        }
    }
}
