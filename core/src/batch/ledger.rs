//! Which input lines of a batch have their answer in a result file. A runner that takes over a batch rebuilds
//! this from the result files (each record carries its input line's index) and sends only the lines not in
//! it; a line answered twice (two runners for a moment, a record written just before a crash) is noticed here
//! and its second answer dropped, so every `custom_id` appears exactly once across the output and error files.
//!
//! One bit per line: 50,000 lines cost about 6 KiB, whatever the size of the file.

/// The set of answered line indices (0-based, over non-blank lines).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ledger {
    bits: Vec<u64>,
    total: u64,
    answered: u64,
}

impl Ledger {
    /// An empty ledger for `total` lines.
    pub fn new(total: u64) -> Self {
        let words = usize::try_from(total.div_ceil(64)).unwrap_or(usize::MAX);
        Ledger {
            bits: vec![0; words],
            total,
            answered: 0,
        }
    }

    /// Records that line `index` is answered; false when it already was (or is outside the batch): the caller
    /// must not write that answer again.
    pub fn mark(&mut self, index: u64) -> bool {
        if index >= self.total {
            return false;
        }
        let (w, b) = (index / 64, index % 64);
        let Some(word) = usize::try_from(w).ok().and_then(|w| self.bits.get_mut(w)) else {
            return false;
        };
        if *word & (1 << b) != 0 {
            return false;
        }
        *word |= 1 << b;
        self.answered += 1;
        true
    }

    /// Whether line `index` is answered.
    pub fn is_answered(&self, index: u64) -> bool {
        let (w, b) = (index / 64, index % 64);
        usize::try_from(w)
            .ok()
            .and_then(|w| self.bits.get(w))
            .is_some_and(|word| word & (1 << b) != 0)
    }

    /// Lines answered.
    pub fn answered(&self) -> u64 {
        self.answered
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_second_answer_is_refused() {
        let mut l = Ledger::new(65);
        assert!(l.mark(64));
        assert!(!l.mark(64));
        assert!(!l.mark(65), "outside the batch");
        assert!(l.is_answered(64) && !l.is_answered(0));
        assert_eq!(l.answered(), 1);
    }

    proptest! {
        /// However often and in whatever order lines are marked, each counts once.
        #[test]
        fn each_line_counts_once(total in 1u64..300, marks in proptest::collection::vec(0u64..300, 0..600)) {
            let mut l = Ledger::new(total);
            let mut set = std::collections::BTreeSet::new();
            for m in marks {
                let fresh = m < total && set.insert(m);
                prop_assert_eq!(l.mark(m), fresh);
            }
            prop_assert_eq!(l.answered(), set.len() as u64);
        }
    }
}
