//! Batch inference (the OpenAI Batch API): the rules, without I/O or a clock.
//!
//! A batch is an uploaded JSONL file of requests to one endpoint, answered line by line into an output file
//! (successes) and an error file (failures), each input `custom_id` exactly once across the two.
//!
//! - [`status`]: the batch object's life (`validating` → `in_progress` → `finalizing` → `completed`, or
//!   `failed` / `expired` / `cancelling` / `cancelled`): which step follows which event, and which are final.
//! - [`line`]: the all-or-nothing validation of the input file, one line at a time, with the line number in
//!   every error.
//! - [`pacing`]: what keeps a batch on pace for its deadline at the least cost: fill spare room only, or add
//!   replicas of the cheapest capacity type that still meets the deadline.
//! - [`ledger`]: which input lines are answered already (rebuilt from the result files after a crash), so a
//!   runner that takes over answers each remaining line once.
//! - [`schedule`]: which batches run now, by deadline and per model.

pub mod ledger;
pub mod line;
pub mod pacing;
pub mod schedule;
pub mod status;

pub use ledger::Ledger;
pub use line::{Endpoint, LineError, LineValidator, ValidLine};
pub use pacing::{CapacityOffer, MEASURE_SPARE, PaceAction, PaceDecision, PaceInput, PaceReason, pace};
pub use status::{BadTransition, BatchEvent, BatchStatus, RequestCounts};
