//! kube-runtime watcher events folded into the three index updates every watch-fed index takes: apply one,
//! delete one, reset to a full list. A relist (Init, InitApply…, InitDone) is staged and becomes one reset, so an
//! index never sees half a list and drops objects that vanished while the watch was down.

use kube::runtime::watcher::Event;

/// One update for an index.
#[derive(Debug, PartialEq, Eq)]
pub enum Change<K> {
    /// Added or modified.
    Apply(K),
    /// Deleted.
    Delete(K),
    /// The full list after a (re)list.
    Reset(Vec<K>),
}

/// Feeds `ev` to `update`, staging a relist in `staged` until it is complete.
pub fn fold_event<K>(ev: Event<K>, staged: &mut Vec<K>, mut update: impl FnMut(Change<K>)) {
    match ev {
        Event::Apply(o) => update(Change::Apply(o)),
        Event::Delete(o) => update(Change::Delete(o)),
        Event::Init => staged.clear(),
        Event::InitApply(o) => staged.push(o),
        Event::InitDone => update(Change::Reset(std::mem::take(staged))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fold(events: Vec<Event<u32>>) -> Vec<Change<u32>> {
        let mut staged = Vec::new();
        let mut out = Vec::new();
        for ev in events {
            fold_event(ev, &mut staged, |c| out.push(c));
        }
        out
    }

    #[test]
    fn a_relist_becomes_one_reset_and_single_events_pass_through() {
        let out = fold(vec![
            Event::Apply(1),
            Event::Init,
            Event::InitApply(2),
            Event::InitApply(3),
            Event::Delete(1),
            Event::InitDone,
            // A relist that restarts drops what the broken one had staged.
            Event::Init,
            Event::InitApply(4),
            Event::Init,
            Event::InitApply(5),
            Event::InitDone,
        ]);
        assert_eq!(
            out,
            vec![
                Change::Apply(1),
                Change::Delete(1),
                Change::Reset(vec![2, 3]),
                Change::Reset(vec![5]),
            ]
        );
    }
}
