//! Which batches run now: by deadline and by model, so a batch whose model never has room holds up only later
//! batches of that same model, never another model's or another namespace's.
//!
//! Lines of one model's batches compete for the same spare room (the flex lane of that model's replicas), so
//! running two of them at once buys no throughput and only splits the room; running batches of different
//! models at once costs nothing, since each waits at its own model's gate. Hence:
//! - per model, the queued batch with the earliest deadline runs; one that runs while an earlier-deadline batch
//!   of its model waits yields (it stops sending, keeps what it answered, and resumes when it is first again:
//!   the result files are the ledger, so a yield loses nothing);
//! - a batch that names several models, is still being validated, is being cancelled or is past its deadline
//!   runs on its own: it either spreads over several gates or only writes its files;
//! - at most `max_running` batches run at once (each holds a bounded number of lines in flight); the ones that
//!   only write their files go first, then the earliest deadlines.

use std::collections::{HashMap, HashSet};

/// How a queued batch is scheduled.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RunKey {
    /// Every line names this model: it takes its turn among that model's batches.
    Model(String),
    /// It runs when there is a slot, beside anything (validation, cancel, expiry, several models).
    Alone,
}

impl RunKey {
    /// A batch's turn: in its model's while it is in progress and every line names that `model`; on its own
    /// when it only has files to write (validating, a cancel asked for, past its deadline) or names several
    /// models (`model` empty).
    pub fn of(in_progress: bool, model: &str, cancel_requested: bool, deadline_s: u64, now_s: u64) -> RunKey {
        if !in_progress || model.is_empty() || cancel_requested || now_s >= deadline_s {
            RunKey::Alone
        } else {
            RunKey::Model(model.to_owned())
        }
    }
}

/// A batch not yet final, as the scheduler sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queued {
    /// The batch id.
    pub id: String,
    /// Its turn.
    pub key: RunKey,
    /// Unix seconds: when its completion window ends (`u64::MAX` without one).
    pub deadline_s: u64,
    /// Unix seconds: when it was created (ties between equal deadlines: first come, first served).
    pub created_s: u64,
}

/// What to do now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Batches to start, in order.
    pub start: Vec<String>,
    /// Running batches to ask to yield (an earlier deadline of the same model waits).
    pub yield_now: Vec<String>,
}

/// The plan for `queued` (every batch not final, running ones included) while `running` run, with at most
/// `max_running` at once.
pub fn plan(queued: &[Queued], running: &HashSet<String>, max_running: usize) -> Plan {
    let order = |q: &Queued| (q.deadline_s, q.created_s, q.id.clone());
    // Per model, the batch whose turn it is.
    let mut first: HashMap<&str, &Queued> = HashMap::new();
    for q in queued {
        if let RunKey::Model(m) = &q.key {
            first
                .entry(m.as_str())
                .and_modify(|f| {
                    if order(q) < order(f) {
                        *f = q;
                    }
                })
                .or_insert(q);
        }
    }
    let mut plan = Plan::default();
    let mut model_busy: HashSet<&str> = HashSet::new();
    for q in queued.iter().filter(|q| running.contains(&q.id)) {
        if let RunKey::Model(m) = &q.key {
            model_busy.insert(m.as_str());
            if first.get(m.as_str()).is_some_and(|f| f.id != q.id) {
                plan.yield_now.push(q.id.clone());
            }
        }
    }
    plan.yield_now.sort();
    let mut candidates: Vec<&Queued> = queued
        .iter()
        .filter(|q| !running.contains(&q.id))
        .filter(|q| match &q.key {
            RunKey::Alone => true,
            // A model's turn starts once its running batch (if any) has yielded and ended.
            RunKey::Model(m) => {
                !model_busy.contains(m.as_str()) && first.get(m.as_str()).is_some_and(|f| f.id == q.id)
            }
        })
        .collect();
    candidates.sort_by_key(|q| (q.key != RunKey::Alone, order(q)));
    let free = max_running.saturating_sub(running.len());
    plan.start = candidates.into_iter().take(free).map(|q| q.id.clone()).collect();
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(id: &str, model: Option<&str>, deadline_s: u64) -> Queued {
        Queued {
            id: id.into(),
            key: model.map_or(RunKey::Alone, |m| RunKey::Model(m.into())),
            deadline_s,
            created_s: 0,
        }
    }

    fn set(ids: &[&str]) -> HashSet<String> {
        ids.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_stuck_model_holds_up_only_its_own_later_batches() {
        // `stuck` has a model that never has room; `other` and `later` queue behind it.
        let queued = [
            q("stuck", Some("a"), 10),
            q("other", Some("b"), 20),
            q("later", Some("a"), 30),
        ];
        let p = plan(&queued, &set(&["stuck"]), 8);
        assert_eq!(
            p.start,
            ["other"],
            "another model's batch runs beside the stuck one"
        );
        assert!(p.yield_now.is_empty());
    }

    #[test]
    fn an_earlier_deadline_of_the_same_model_makes_the_running_one_yield() {
        let queued = [q("long", Some("a"), 1000), q("urgent", Some("a"), 100)];
        let p = plan(&queued, &set(&["long"]), 8);
        assert_eq!(p.yield_now, ["long"]);
        assert!(p.start.is_empty(), "urgent starts once long has stopped");
        let p = plan(&queued, &set(&[]), 8);
        assert_eq!(p.start, ["urgent"]);
    }

    #[test]
    fn file_only_work_goes_first_and_the_slots_bound_what_runs() {
        let queued = [
            q("a1", Some("a"), 5),
            q("b1", Some("b"), 6),
            q("cancel", None, 50),
            q("c1", Some("c"), 7),
        ];
        let p = plan(&queued, &set(&[]), 2);
        assert_eq!(p.start, ["cancel", "a1"]);
        let p = plan(&queued, &set(&["cancel", "a1"]), 2);
        assert!(p.start.is_empty(), "no slot left");
        let p = plan(&queued, &set(&["a1"]), 3);
        assert_eq!(p.start, ["cancel", "b1"]);
    }

    #[test]
    fn a_batch_with_only_files_to_write_runs_on_its_own() {
        assert_eq!(RunKey::of(true, "m", false, 100, 50), RunKey::Model("m".into()));
        assert_eq!(
            RunKey::of(false, "m", false, 100, 50),
            RunKey::Alone,
            "validating"
        );
        assert_eq!(RunKey::of(true, "m", true, 100, 50), RunKey::Alone, "cancelling");
        assert_eq!(RunKey::of(true, "m", false, 100, 100), RunKey::Alone, "expired");
        assert_eq!(
            RunKey::of(true, "", false, 100, 50),
            RunKey::Alone,
            "several models"
        );
    }

    #[test]
    fn ties_go_to_the_first_created() {
        let mut early = q("z-early", Some("a"), 10);
        early.created_s = 1;
        let mut late = q("a-late", Some("a"), 10);
        late.created_s = 2;
        assert_eq!(plan(&[late, early], &set(&[]), 8).start, ["z-early"]);
    }
}
