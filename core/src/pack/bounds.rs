//! Lower bounds on the number of bins (GPUs) any packing needs, so a packing can say how far from optimal it
//! is at most.
//!
//! Martello and Toth's L2 (1990): for a threshold `k` in `0..=C/2`, items larger than `C − k` (J1) each need
//! their own bin; items in `(C/2, C − k]` (J2) each need their own bin too and can share it only with items
//! below `k`; items in `[k, C/2]` (J3) must go into the room J2 leaves or into new bins. L2 is the best such
//! count over `k`, and never below the simple `⌈Σ sizes / C⌉`. Only `k = 0` and the distinct sizes `≤ C/2`
//! need trying: between two of them, raising `k` moves items from J2 to J1, which cannot lower the count.

/// The Martello–Toth L2 lower bound for bin capacity `capacity` (sizes above it count one bin each;
/// zero sizes count nothing). O(n log n).
pub fn lower_bound_l2(sizes: &[u32], capacity: u32) -> u32 {
    if capacity == 0 {
        return 0;
    }
    let mut s: Vec<u64> = sizes.iter().copied().filter(|&x| x > 0).map(u64::from).collect();
    s.sort_unstable();
    let c = u64::from(capacity);
    let mut prefix = Vec::with_capacity(s.len() + 1);
    prefix.push(0u64);
    for &x in &s {
        prefix.push(prefix.last().copied().unwrap_or(0) + x);
    }
    // Index of the first item with size > v (sizes sorted ascending).
    let above = |v: u64| s.partition_point(|&x| x <= v);
    let at_least = |v: u64| s.partition_point(|&x| x < v);
    let half = c / 2; // x ≤ C/2  ⇔  x ≤ ⌊C/2⌋ for integers
    let mut candidates: Vec<u64> = vec![0];
    candidates.extend(s.iter().copied().filter(|&x| x <= half));
    candidates.dedup();
    let n = s.len();
    let mut best = 0u64;
    for k in candidates {
        let j1_start = above(c - k);
        let j2_start = above(half);
        let j3_start = at_least(k.max(1));
        let n1 = (n - j1_start) as u64;
        let n2 = (j1_start - j2_start) as u64;
        let sum2 = prefix[j1_start] - prefix[j2_start];
        let sum3 = prefix[j2_start] - prefix[j3_start.min(j2_start)];
        let free2 = n2 * c - sum2;
        let extra = sum3.saturating_sub(free2).div_ceil(c);
        best = best.max(n1 + n2 + extra);
    }
    let simple = prefix[n].div_ceil(c);
    u32::try_from(best.max(simple)).unwrap_or(u32::MAX)
}

/// L2 from a histogram: `counts[x]` items of size `x` for `x` in `0..=capacity` (longer slices: the extra
/// entries are sizes above the capacity and count one bin each). O(capacity), for callers that keep a
/// histogram of a changing set (the online replay computes a bound at every event).
pub fn lower_bound_l2_counts(counts: &[u64], capacity: u32) -> u64 {
    let c = capacity as usize;
    if c == 0 {
        return 0;
    }
    let over: u64 = counts.iter().skip(c + 1).sum();
    // cnt_le[v] = items of size 1..=v; sum_le[v] = their total size.
    let mut cnt_le = vec![0u64; c + 1];
    let mut sum_le = vec![0u64; c + 1];
    for v in 1..=c {
        let n = counts.get(v).copied().unwrap_or(0);
        cnt_le[v] = cnt_le[v - 1] + n;
        sum_le[v] = sum_le[v - 1] + n * v as u64;
    }
    let half = c / 2;
    let cap = c as u64;
    let mut best = sum_le[c].div_ceil(cap) + over;
    for k in 0..=half {
        if k > 0 && counts.get(k).copied().unwrap_or(0) == 0 {
            continue;
        }
        let hi = c - k; // J1: sizes in (hi, C]
        let n1 = cnt_le[c] - cnt_le[hi] + over;
        let n2 = cnt_le[hi] - cnt_le[half];
        let sum2 = sum_le[hi] - sum_le[half];
        let lo = k.max(1) - 1; // J3: sizes in [max(k,1), half]
        let sum3 = sum_le[half] - sum_le[lo];
        let extra = sum3.saturating_sub(n2 * cap - sum2).div_ceil(cap);
        best = best.max(n1 + n2 + extra);
    }
    best
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    /// The definition, over every k, with no shortcuts.
    fn l2_by_definition(sizes: &[u32], c: u32) -> u64 {
        let c = u64::from(c);
        let mut best = sizes.iter().map(|&x| u64::from(x)).sum::<u64>().div_ceil(c);
        for k in 0..=c / 2 {
            let (mut n1, mut n2, mut s2, mut s3) = (0u64, 0u64, 0u64, 0u64);
            for &x in sizes {
                let x = u64::from(x);
                if x == 0 {
                    continue;
                }
                if x > c - k {
                    n1 += 1;
                } else if 2 * x > c {
                    n2 += 1;
                    s2 += x;
                } else if x >= k {
                    s3 += x;
                }
            }
            best = best.max(n1 + n2 + s3.saturating_sub(n2 * c - s2).div_ceil(c));
        }
        best
    }

    #[test]
    fn textbook_examples() {
        // Three items of 60 in bins of 100 need three bins although the sum says two.
        assert_eq!(lower_bound_l2(&[60, 60, 60], 100), 3);
        // Each 60 leaves room for one 30; the other three 30s need a fourth bin (the sum alone says 4 too).
        assert_eq!(lower_bound_l2(&[60, 60, 60, 30, 30, 30, 30, 30, 30], 100), 4);
        // k = 50: the 60s leave 40 each, the 50s cannot use it, so 3 + ⌈150 / 100⌉ = 5 > ⌈330 / 100⌉ = 4.
        assert_eq!(lower_bound_l2(&[60, 60, 60, 50, 50, 50], 100), 5);
        assert_eq!(lower_bound_l2(&[], 100), 0);
        assert_eq!(lower_bound_l2(&[100, 100], 100), 2);
        assert_eq!(lower_bound_l2(&[50, 50, 50], 100), 2);
    }

    proptest! {
        #[test]
        fn fast_versions_equal_the_definition(
            sizes in proptest::collection::vec(0u32..=120, 0..40), c in 1u32..=120
        ) {
            let sizes: Vec<u32> = sizes.into_iter().map(|x| x.min(c)).collect();
            let def = l2_by_definition(&sizes, c);
            prop_assert_eq!(u64::from(lower_bound_l2(&sizes, c)), def);
            let mut counts = vec![0u64; c as usize + 1];
            for &x in &sizes { counts[x as usize] += 1; }
            prop_assert_eq!(lower_bound_l2_counts(&counts, c), def);
        }
    }
}
