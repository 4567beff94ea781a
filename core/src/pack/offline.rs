//! Packing a whole set of replicas at once (capacity planning, the what-if simulator, `tessera pack`).
//!
//! The main algorithm is Minimum Bin Slack (Gupta & Ho 1999) in the variant that puts the largest remaining
//! item in every new GPU first (Fleszar & Hindi 2002), with the rest of the GPU filled by an *exact* subset
//! choice instead of a search: compute shares are integers ≤ 1000, so a dynamic programme over "compute used"
//! finds the fullest subset of the remaining replicas for each GPU in O(1000 × item groups). With memory
//! present the programme keeps, for every compute total, the smallest memory that reaches it (so the memory
//! limit is respected exactly) and picks the total that leaves the least normalised room on both dimensions.
//!
//! Fixing the largest item first matters: filling each GPU as full as possible without it strands the big
//! items at the end, one per GPU. Best- and first-fit decreasing (through the online [`Packer`]) run as well
//! and the best result is kept, so the answer is never worse than either.

use super::{FitPolicy, GpuShape, PackError, Packer, ReplicaRequest, check_request};

/// Which algorithm produced an [`OfflinePacking`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OfflineAlgorithm {
    /// Minimum Bin Slack with the largest item fixed and an exact subset-sum per GPU.
    MinimumBinSlack,
    /// Best-fit decreasing.
    BestFitDecreasing,
    /// First-fit decreasing (only from [`pack_first_fit_decreasing`], the baseline).
    FirstFitDecreasing,
}

impl OfflineAlgorithm {
    /// A short fixed name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::MinimumBinSlack => "mbs",
            Self::BestFitDecreasing => "bfd",
            Self::FirstFitDecreasing => "ffd",
        }
    }
}

/// The result of an offline packing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfflinePacking {
    /// For each GPU used, the indices (into the input slice) of the replicas on it.
    pub gpus: Vec<Vec<usize>>,
    /// For each input replica, the index of its GPU in [`OfflinePacking::gpus`].
    pub assignment: Vec<usize>,
    /// The algorithm whose result this is.
    pub algorithm: OfflineAlgorithm,
}

impl OfflinePacking {
    /// How many GPUs the packing uses.
    pub fn gpus_used(&self) -> usize {
        self.gpus.len()
    }

    fn from_bins(gpus: Vec<Vec<usize>>, n: usize, algorithm: OfflineAlgorithm) -> Self {
        let mut assignment = vec![0; n];
        for (g, items) in gpus.iter().enumerate() {
            for &i in items {
                assignment[i] = g;
            }
        }
        Self {
            gpus,
            assignment,
            algorithm,
        }
    }
}

/// Packs every replica onto as few GPUs of `shape` as this can find (never more than best- or first-fit
/// decreasing, which run too).
/// Fails only on a request no GPU of this shape could hold (compute outside 1..=1000, too much memory) or a
/// shape with no usable memory; ids need not be unique here (the result is by index).
pub fn pack_offline(items: &[ReplicaRequest], shape: &GpuShape) -> Result<OfflinePacking, PackError> {
    shape.validate()?;
    for r in items {
        check_request(r, shape)?;
    }
    // MBS first so that it wins ties; the two cheap greedy passes only matter where memory makes the
    // per-GPU programme's choice (fullest on compute, then least memory) a poor one.
    let candidates = [
        minimum_bin_slack(items, shape),
        decreasing(items, shape, FitPolicy::BestFit),
        decreasing(items, shape, FitPolicy::FirstFit),
    ];
    let mut best: Option<OfflinePacking> = None;
    for c in candidates {
        if best.as_ref().is_none_or(|b| c.gpus_used() < b.gpus_used()) {
            best = Some(c);
        }
    }
    Ok(best.unwrap_or_else(|| OfflinePacking::from_bins(Vec::new(), 0, OfflineAlgorithm::MinimumBinSlack)))
}

/// First-fit decreasing: the classic baseline (11/9 OPT + 6/9 in the worst case), for comparisons.
pub fn pack_first_fit_decreasing(
    items: &[ReplicaRequest],
    shape: &GpuShape,
) -> Result<OfflinePacking, PackError> {
    shape.validate()?;
    for r in items {
        check_request(r, shape)?;
    }
    Ok(decreasing(items, shape, FitPolicy::FirstFit))
}

/// The items' indices, largest weight first; ties by index for determinism.
fn heaviest_first(items: &[ReplicaRequest], shape: &GpuShape) -> Vec<usize> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by(|&a, &b| {
        items[b]
            .weight(shape)
            .total_cmp(&items[a].weight(shape))
            .then(a.cmp(&b))
    });
    order
}

/// Sorts largest first and places each with the online packer's rule (which also spreads replicas of a model).
fn decreasing(items: &[ReplicaRequest], shape: &GpuShape, policy: FitPolicy) -> OfflinePacking {
    let order = heaviest_first(items, shape);
    let mut packer = Packer::with_policy(*shape, policy);
    let mut bins: Vec<Vec<usize>> = Vec::new();
    for i in order {
        // Ids are made unique per index: the input may repeat ids, the packing is by position.
        let mut r = items[i].clone();
        r.id = i.to_string();
        match packer.place_or_open(r) {
            Ok((gpu, _)) => {
                // GPU ids are handed out densely from 0, so the id is the bin index.
                let g = gpu.0 as usize;
                if g >= bins.len() {
                    bins.resize_with(g + 1, Vec::new);
                }
                bins[g].push(i);
            }
            // Unreachable after check_request; keeping the item out would hide it, so give it its own GPU.
            Err(_) => bins.push(vec![i]),
        }
    }
    let algorithm = match policy {
        FitPolicy::BestFit => OfflineAlgorithm::BestFitDecreasing,
        FitPolicy::FirstFit => OfflineAlgorithm::FirstFitDecreasing,
    };
    OfflinePacking::from_bins(bins, items.len(), algorithm)
}

/// Marker for "no subset reaches this compute total".
const UNREACHABLE: u64 = u64::MAX;

/// Minimum Bin Slack, largest item fixed, exact per-GPU subset choice (see the module docs).
fn minimum_bin_slack(items: &[ReplicaRequest], shape: &GpuShape) -> OfflinePacking {
    let mem_cap = shape.usable_memory_mib();
    let c_total = shape.compute_milli as usize;
    // groups[c] = remaining item indices with compute c, memory ascending: taking copies from a group takes
    // the cheapest in memory first.
    let mut groups: Vec<Vec<usize>> = vec![Vec::new(); c_total + 1];
    for (i, r) in items.iter().enumerate() {
        groups[r.compute_milli as usize].push(i);
    }
    for g in &mut groups {
        g.sort_by_key(|&i| (items[i].memory_mib, i));
    }
    let by_weight = heaviest_first(items, shape);
    let mut placed = vec![false; items.len()];
    let mut next_largest = 0;
    let mut bins: Vec<Vec<usize>> = Vec::new();
    // Reused buffers: dp over compute totals, and one row of choice bits per chunk.
    let mut dp = vec![UNREACHABLE; c_total + 1];
    let mut choice: Vec<Vec<bool>> = Vec::new();
    let mut chunks: Vec<Chunk> = Vec::new();

    loop {
        while next_largest < by_weight.len() && placed[by_weight[next_largest]] {
            next_largest += 1;
        }
        let Some(&first) = by_weight.get(next_largest) else {
            break;
        };
        placed[first] = true;
        let fc = items[first].compute_milli as usize;
        groups[fc].retain(|&i| i != first);
        let cap_c = c_total - fc;
        let cap_m = mem_cap - items[first].memory_mib;

        // Split each group's remaining items into binary chunks (1, 2, 4, … items), so any count of copies is a
        // union of chunks and the 0/1 programme stays small.
        chunks.clear();
        for (c, group) in groups.iter().enumerate() {
            if c == 0 || c > cap_c || group.is_empty() {
                continue;
            }
            let mut left = group.len().min(cap_c / c);
            let mut start = 0;
            let mut size = 1;
            while left > 0 {
                let k = size.min(left);
                let members = &group[start..start + k];
                let mem: u64 = members.iter().map(|&i| items[i].memory_mib).sum();
                if mem <= cap_m {
                    chunks.push(Chunk {
                        compute: c * k,
                        memory: mem,
                        group: c,
                        start,
                        len: k,
                    });
                }
                start += k;
                left -= k;
                size *= 2;
            }
        }

        dp[..=cap_c].fill(UNREACHABLE);
        dp[0] = 0;
        if choice.len() < chunks.len() {
            choice.resize_with(chunks.len(), Vec::new);
        }
        for (j, ch) in chunks.iter().enumerate() {
            let row = &mut choice[j];
            row.clear();
            row.resize(cap_c + 1, false);
            for s in (ch.compute..=cap_c).rev() {
                let prev = dp[s - ch.compute];
                if prev == UNREACHABLE {
                    continue;
                }
                let m = prev + ch.memory;
                if m <= cap_m && m < dp[s] {
                    dp[s] = m;
                    row[s] = true;
                }
            }
        }
        // The fullest GPU: least normalised room left on compute + memory.
        let mut best_s = 0;
        let mut best_score = f64::NEG_INFINITY;
        for (s, &m) in dp[..=cap_c].iter().enumerate() {
            if m == UNREACHABLE {
                continue;
            }
            let score = s as f64 / c_total as f64 + m as f64 / mem_cap.max(1) as f64;
            if score > best_score {
                best_score = score;
                best_s = s;
            }
        }
        let mut bin = vec![first];
        let mut s = best_s;
        let mut taken: Vec<(usize, usize, usize)> = Vec::new();
        for j in (0..chunks.len()).rev() {
            if s == 0 {
                break;
            }
            if choice[j][s] {
                let ch = &chunks[j];
                taken.push((ch.group, ch.start, ch.len));
                s -= ch.compute;
            }
        }
        for &(g, start, len) in &taken {
            for &i in &groups[g][start..start + len] {
                placed[i] = true;
                bin.push(i);
            }
        }
        for &(g, _, _) in &taken {
            groups[g].retain(|&i| !placed[i]);
        }
        bins.push(bin);
    }
    OfflinePacking::from_bins(bins, items.len(), OfflineAlgorithm::MinimumBinSlack)
}

/// A run of `len` items of one group (compute value), taken together by the subset programme.
#[derive(Debug, Clone, Copy)]
struct Chunk {
    compute: usize,
    memory: u64,
    group: usize,
    start: usize,
    len: usize,
}
