//! What the scenario's batch jobs cost, run four ways beside the same interactive day (issue: batch on spare
//! and cheaper capacity).
//!
//! | way | interactive models | batch lines |
//! |---|---|---|
//! | `tessera-paced` | Tessera, sharing its replicas' spare room with the lines | flex lane, then the pacing rule's own replicas (spot first) |
//! | `dedicated-pool` | Tessera alone | a pool of reliable GPUs held all day, sized to miss no deadline |
//! | `at-submit` | Tessera alone | each job's own reliable replicas from its submission, sized for its deadline |
//! | `greedy-spot` | Tessera alone | every spot GPU to be had from its submission, no fallback |
//!
//! The last three never touch an interactive replica, so their interactive side is Tessera's run without
//! batch jobs and their batch side runs alone (`BatchPlan::interactive` off). Costs: the interactive pool's
//! GPU-hours at the cheapest reliable price, the batch's own at their capacity type's price.

use super::SimError;
use super::batch_outcome::{BatchComparison, BatchMode, BatchOutcome, BatchPlan, BatchRow};
use super::scenario::Scenario;
use super::world::RunResult;

/// What the comparison reads of a run's interactive side.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interactive {
    /// GPU-hours of the interactive pool.
    pub gpu_hours: f64,
    /// Interactive requests within their TTFT objective.
    pub attainment: f64,
}

/// Most GPUs the dedicated pool is tried at before it is reported as missing deadlines anyway.
const MAX_DEDICATED: u32 = 64;

fn row(way: BatchMode, interactive: Interactive, outcome: BatchOutcome, price: f64) -> BatchRow {
    let answered: u64 = outcome.jobs.iter().map(|j| j.on_spare + j.on_own).sum();
    let spare: u64 = outcome.jobs.iter().map(|j| j.on_spare).sum();
    BatchRow {
        way: way.name().to_owned(),
        interactive_gpu_hours: interactive.gpu_hours,
        batch_gpu_hours: outcome.gpu_hours(),
        cost: interactive.gpu_hours * price + outcome.cost(),
        batch_cost: outcome.cost(),
        deadline_misses: outcome.misses(),
        interactive_attainment: interactive.attainment,
        spare_share: if answered > 0 {
            spare as f64 / answered as f64
        } else {
            0.0
        },
        outcome,
    }
}

/// Compares the four ways. `alone` is Tessera's run without batch jobs, `paced` Tessera's run with them
/// (`BatchMode::Paced`); `run` runs the batch alone in a given way.
pub fn compare(
    sc: &Scenario,
    alone: Interactive,
    paced: RunResult,
    run: &(dyn Fn(BatchPlan) -> Result<RunResult, SimError> + Sync),
) -> Result<Option<BatchComparison>, SimError> {
    let Some(setup) = &sc.batch else { return Ok(None) };
    let price = setup.reliable_price();
    let only = |mode| {
        run(BatchPlan {
            mode,
            interactive: false,
        })
        .map(|r| {
            r.batch
                .unwrap_or_else(|| unreachable!("a batch plan reports its batch"))
        })
    };
    let mut rows = Vec::new();
    if let Some(b) = paced.batch {
        let with_batch = Interactive {
            gpu_hours: paced.report.gpu_hours,
            attainment: paced.report.slo_attainment,
        };
        rows.push(row(BatchMode::Paced, with_batch, b, price));
    }
    // The dedicated pool: the fewest reliable GPUs that miss nothing, found by doubling then bisecting.
    let cap = setup.offers[setup.reliable].available.min(MAX_DEDICATED);
    let mut lo = 0u32;
    let mut hi = 1u32;
    let mut best = only(BatchMode::Dedicated(hi))?;
    while best.misses() > 0 && hi < cap {
        lo = hi;
        hi = (hi * 2).min(cap);
        best = only(BatchMode::Dedicated(hi))?;
    }
    if best.misses() == 0 {
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            let o = only(BatchMode::Dedicated(mid))?;
            if o.misses() == 0 {
                hi = mid;
                best = o;
            } else {
                lo = mid;
            }
        }
    }
    rows.push(row(BatchMode::Dedicated(hi), alone, best, price));
    for mode in [BatchMode::AtSubmit, BatchMode::GreedySpot] {
        rows.push(row(mode, alone, only(mode)?, price));
    }
    Ok(Some(BatchComparison {
        reliable_price: price,
        dedicated_gpus: hi,
        rows,
    }))
}
