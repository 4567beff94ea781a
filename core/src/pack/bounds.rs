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

/// The cutting-stock LP bound (Gilmore–Gomory), as computed by [`lower_bound_lp`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LpBound {
    /// ⌈best certified dual value⌉, never below [`lower_bound_l2`]: no packing uses fewer bins.
    pub bound: u32,
    /// The best certified dual value (a valid fractional lower bound).
    pub value: f64,
    /// Column-generation iterations run.
    pub iterations: u32,
    /// Whether column generation proved LP optimality (otherwise `value` is still valid, only weaker).
    pub optimal: bool,
}

/// The LP relaxation of the pattern (cutting-stock) formulation, solved by column generation: a revised
/// simplex over the item *types* with a bounded-knapsack pricing step (sizes are integers, so the knapsack is
/// an exact dynamic programme over capacity). Much stronger than L2 when a few sizes repeat many times, as in
/// real GPU-share requests, where it usually proves the packing optimal.
///
/// The bound returned never rests on the simplex being numerically exact: at every iteration the duals are
/// clamped at 0 and scaled by the knapsack optimum (Farley's bound), which makes them feasible for the dual
/// LP, so `Σ dᵢ yᵢ / max(1, z*)` is a valid lower bound whatever rounding happened. O(types × capacity) per
/// iteration; `capacity` should be modest (1000 for milli-GPUs).
pub fn lower_bound_lp(sizes: &[u32], capacity: u32, max_iterations: u32) -> LpBound {
    let l2 = lower_bound_l2(sizes, capacity);
    let c = capacity as usize;
    let mut types: Vec<(usize, u64)> = Vec::new();
    {
        let mut s: Vec<u32> = sizes.iter().copied().filter(|&x| x > 0).collect();
        s.sort_unstable();
        for x in s {
            let x = (x as usize).min(c.max(1));
            match types.last_mut() {
                Some((v, n)) if *v == x => *n += 1,
                _ => types.push((x, 1)),
            }
        }
    }
    let m = types.len();
    if m == 0 || c == 0 {
        return LpBound {
            bound: l2,
            value: 0.0,
            iterations: 0,
            optimal: true,
        };
    }
    let cap_of = |i: usize| (types[i].1).min((c / types[i].0) as u64).max(1);
    // Basis inverse (dense m × m) and basic solution; start from single-type patterns (diagonal basis).
    let mut binv = vec![vec![0.0f64; m]; m];
    let mut x = vec![0.0f64; m];
    for i in 0..m {
        binv[i][i] = 1.0 / cap_of(i) as f64;
        x[i] = types[i].1 as f64 / cap_of(i) as f64;
    }
    let mut best = 0.0f64;
    let mut iterations = 0;
    let mut optimal = false;
    let mut dp = vec![0.0f64; c + 1];
    let mut take: Vec<Vec<bool>> = Vec::new();
    let mut chunks: Vec<(usize, u64)> = Vec::new(); // (type, copies)
    while iterations < max_iterations {
        iterations += 1;
        // Duals y = 1ᵀ B⁻¹, clamped at 0.
        let y: Vec<f64> = (0..m)
            .map(|j| (0..m).map(|i| binv[i][j]).sum::<f64>().max(0.0))
            .collect();
        // Pricing: max Σ yⱼ aⱼ s.t. Σ sⱼ aⱼ ≤ C, aⱼ ≤ min(dⱼ, C / sⱼ) — bounded knapsack by binary splitting.
        chunks.clear();
        for (j, &yj) in y.iter().enumerate() {
            if yj <= 0.0 {
                continue;
            }
            let mut left = cap_of(j);
            let mut k = 1;
            while left > 0 {
                let t = k.min(left);
                chunks.push((j, t));
                left -= t;
                k *= 2;
            }
        }
        dp.fill(0.0);
        if take.len() < chunks.len() {
            take.resize_with(chunks.len(), Vec::new);
        }
        for (q, &(j, t)) in chunks.iter().enumerate() {
            let w = types[j].0 * t as usize;
            let v = y[j] * t as f64;
            let row = &mut take[q];
            row.clear();
            row.resize(c + 1, false);
            if w > c {
                continue;
            }
            for s in (w..=c).rev() {
                if dp[s - w] + v > dp[s] {
                    dp[s] = dp[s - w] + v;
                    row[s] = true;
                }
            }
        }
        let (mut s_best, mut z) = (0, 0.0f64);
        for (s, &v) in dp.iter().enumerate() {
            if v > z {
                z = v;
                s_best = s;
            }
        }
        let dual_value: f64 = (0..m).map(|j| y[j] * types[j].1 as f64).sum();
        best = best.max(dual_value / z.max(1.0));
        if z <= 1.0 + 1e-9 {
            optimal = true;
            break;
        }
        // The entering column.
        let mut a = vec![0.0f64; m];
        let mut s = s_best;
        for q in (0..chunks.len()).rev() {
            if take[q][s] {
                let (j, t) = chunks[q];
                a[j] += t as f64;
                s -= types[j].0 * t as usize;
            }
        }
        let u: Vec<f64> = (0..m).map(|i| (0..m).map(|k| binv[i][k] * a[k]).sum()).collect();
        let mut leave = None;
        let mut theta = f64::INFINITY;
        for i in 0..m {
            if u[i] > 1e-12 {
                let r = x[i] / u[i];
                if r < theta - 1e-12 {
                    theta = r;
                    leave = Some(i);
                }
            }
        }
        let Some(r) = leave else { break };
        for i in 0..m {
            if i != r {
                x[i] -= theta * u[i];
            }
        }
        x[r] = theta;
        let pivot = u[r];
        let row_r: Vec<f64> = binv[r].iter().map(|v| v / pivot).collect();
        for i in 0..m {
            if i == r {
                continue;
            }
            let f = u[i];
            if f != 0.0 {
                for k in 0..m {
                    binv[i][k] -= f * row_r[k];
                }
            }
        }
        binv[r] = row_r;
    }
    // A margin well above floating-point error keeps the rounding on the safe side.
    let lp = (best - 1e-6).ceil().max(0.0);
    let bound = if lp >= f64::from(u32::MAX) {
        u32::MAX
    } else {
        lp as u32
    };
    LpBound {
        bound: bound.max(l2),
        value: best,
        iterations,
        optimal,
    }
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

    /// The smallest number of bins, by trying every assignment (tiny inputs only).
    fn optimum_by_search(sizes: &[u32], c: u32) -> u32 {
        fn go(i: usize, sizes: &[u32], bins: &mut Vec<u32>, c: u32, best: &mut u32) {
            if bins.len() as u32 >= *best {
                return;
            }
            if i == sizes.len() {
                *best = bins.len() as u32;
                return;
            }
            for b in 0..bins.len() {
                if bins[b] + sizes[i] <= c {
                    bins[b] += sizes[i];
                    go(i + 1, sizes, bins, c, best);
                    bins[b] -= sizes[i];
                }
            }
            bins.push(sizes[i]);
            go(i + 1, sizes, bins, c, best);
            bins.pop();
        }
        let mut best = sizes.len() as u32;
        go(0, sizes, &mut Vec::new(), c, &mut best);
        best
    }

    #[test]
    fn lp_bound_beats_l2_where_sizes_repeat() {
        // Nine shares of 340 milli: only two fit a GPU (3 × 340 > 1000), so 5 GPUs are needed. L2 sees only
        // the sum (⌈3060 / 1000⌉ = 4); the LP sees the pattern (9 / 2 = 4.5 → 5).
        let sizes = [340; 9];
        assert_eq!(lower_bound_l2(&sizes, 1000), 4);
        let lp = lower_bound_lp(&sizes, 1000, 1000);
        assert!(lp.optimal, "{lp:?}");
        assert_eq!(lp.bound, 5);
        assert!((lp.value - 4.5).abs() < 1e-9, "{lp:?}");
        assert_eq!(optimum_by_search(&sizes, 1000), 5);
        // Mixed sizes: still between L2 and the optimum.
        let mut mixed = vec![400; 7];
        mixed.extend([350; 7]);
        mixed.extend([300; 7]);
        let lp = lower_bound_lp(&mixed, 1000, 1000);
        assert!(
            lp.bound >= lower_bound_l2(&mixed, 1000) && lp.bound <= 9,
            "{lp:?}"
        );
    }

    proptest! {
        #[test]
        fn lp_bound_is_a_lower_bound_and_at_least_l2(sizes in proptest::collection::vec(1u32..=100, 0..11)) {
            let lp = lower_bound_lp(&sizes, 100, 500);
            prop_assert!(lp.bound >= lower_bound_l2(&sizes, 100));
            prop_assert!(lp.bound <= optimum_by_search(&sizes, 100), "{:?} > optimum for {:?}", lp, sizes);
        }

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
