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

use serde::Serialize;

use super::SimError;
use super::report::StrategyReport;
use super::scenario::Scenario;
use super::world::{BatchMode, BatchOutcome, BatchPlan, RunResult};

/// Most GPUs the dedicated pool is tried at before it is reported as missing deadlines anyway.
const MAX_DEDICATED: u32 = 64;

/// One way of running the batch jobs, with the day's totals.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BatchRow {
    /// `tessera-paced`, `dedicated-pool`, `at-submit`, `greedy-spot`.
    pub way: String,
    /// GPU-hours of the interactive pool.
    pub interactive_gpu_hours: f64,
    /// GPU-hours of the batch's own replicas (or the dedicated pool).
    pub batch_gpu_hours: f64,
    /// Cost of both.
    pub cost: f64,
    /// Cost of the batch's own replicas.
    pub batch_cost: f64,
    /// Jobs finished after their deadline (or not at all).
    pub deadline_misses: usize,
    /// Interactive requests within their TTFT objective.
    pub interactive_attainment: f64,
    /// Batch lines answered in the interactive replicas' spare room, of all answered.
    pub spare_share: f64,
    /// What the batch side did, job by job.
    pub outcome: BatchOutcome,
}

impl BatchRow {
    /// GPU-hours of both.
    pub fn gpu_hours(&self) -> f64 {
        self.interactive_gpu_hours + self.batch_gpu_hours
    }
}

/// The four ways side by side.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BatchComparison {
    /// Price of a reliable GPU-hour (the interactive pool's and the dedicated pool's).
    pub reliable_price: f64,
    /// GPUs of the dedicated pool (the fewest that miss no deadline, or the most tried).
    pub dedicated_gpus: u32,
    /// The rows, in the order of the module table.
    pub rows: Vec<BatchRow>,
}

impl BatchComparison {
    /// The row of `way`.
    pub fn row(&self, way: &str) -> Option<&BatchRow> {
        self.rows.iter().find(|r| r.way == way)
    }

    /// The table the report prints.
    pub fn table(&self) -> String {
        let mut out = format!(
            "Batch jobs ({} GPU-hour reliable price; dedicated pool of {} GPUs):\n",
            self.reliable_price, self.dedicated_gpus
        );
        out.push_str(&format!(
            "  {:<15} {:>9} {:>9} {:>9} {:>10} {:>10} {:>7} {:>10} {:>7}\n",
            "way",
            "inter GPUh",
            "batch GPUh",
            "total GPUh",
            "batch cost",
            "total cost",
            "misses",
            "TTFT ok",
            "spare"
        ));
        for r in &self.rows {
            out.push_str(&format!(
                "  {:<15} {:>9.2} {:>9.2} {:>9.2} {:>10.2} {:>10.2} {:>7} {:>9.2}% {:>6.0}%\n",
                r.way,
                r.interactive_gpu_hours,
                r.batch_gpu_hours,
                r.gpu_hours(),
                r.batch_cost,
                r.cost,
                r.deadline_misses,
                r.interactive_attainment * 100.0,
                r.spare_share * 100.0
            ));
        }
        out
    }
}

fn row(way: BatchMode, interactive: &StrategyReport, outcome: BatchOutcome, price: f64) -> BatchRow {
    let answered: u64 = outcome.jobs.iter().map(|j| j.on_spare + j.on_own).sum();
    let spare: u64 = outcome.jobs.iter().map(|j| j.on_spare).sum();
    BatchRow {
        way: way.name().to_owned(),
        interactive_gpu_hours: interactive.gpu_hours,
        batch_gpu_hours: outcome.gpu_hours(),
        cost: interactive.gpu_hours * price + outcome.cost(),
        batch_cost: outcome.cost(),
        deadline_misses: outcome.misses(),
        interactive_attainment: interactive.slo_attainment,
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
    alone: &StrategyReport,
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
        rows.push(row(BatchMode::Paced, &paced.report, b, price));
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
