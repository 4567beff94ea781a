//! What a run's batch side did ([`BatchOutcome`]) and the four ways side by side ([`BatchComparison`]): plain
//! data and its table, apart from the world that produces it (`world/batch.rs`) and the comparison that runs it
//! (`batch.rs`), so the report can hold it without importing either.

use serde::Serialize;

/// How the batch jobs are run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchMode {
    /// Spare room through the flex lane, paced onto the cheapest capacity when behind (Tessera).
    Paced,
    /// This many reliable GPUs held all day for batch work.
    Dedicated(u32),
    /// Each job's own reliable replicas from its submission, sized for its deadline.
    AtSubmit,
    /// Each job on every spot GPU it can get, from its submission.
    GreedySpot,
}

impl BatchMode {
    /// A name for reports.
    pub fn name(self) -> &'static str {
        match self {
            BatchMode::Paced => "tessera-paced",
            BatchMode::Dedicated(_) => "dedicated-pool",
            BatchMode::AtSubmit => "at-submit",
            BatchMode::GreedySpot => "greedy-spot",
        }
    }
}

/// The batch part of a strategy run's plan (`world::Plan`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchPlan {
    /// How the jobs run.
    pub mode: BatchMode,
    /// Whether the interactive models run too (false: the batch alone, for modes that never touch them).
    pub interactive: bool,
}

/// What one job did.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct JobOutcome {
    /// The job.
    pub name: String,
    /// Lines answered.
    pub done: u64,
    /// Lines in the job.
    pub lines: u64,
    /// When the last line was answered (seconds), if it was.
    pub finished_at: Option<f64>,
    /// When it was due (seconds).
    pub deadline: f64,
    /// Lines answered in the interactive replicas' spare room.
    pub on_spare: u64,
    /// Lines answered by replicas of its own (or the dedicated pool).
    pub on_own: u64,
    /// Lines lost to a reclaim and sent again.
    pub resent: u64,
}

impl JobOutcome {
    /// Every line answered by the deadline.
    pub fn met(&self) -> bool {
        self.finished_at.is_some_and(|t| t <= self.deadline + 1e-9)
    }
}

/// What the batch side of a run cost and did.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BatchOutcome {
    /// The mode.
    pub mode: &'static str,
    /// Per job.
    pub jobs: Vec<JobOutcome>,
    /// GPU-hours of the batch's own replicas per capacity type (name, GPU-hours, cost).
    pub own: Vec<(String, f64, f64)>,
    /// Reclaims suffered.
    pub reclaims: u64,
    /// Pacing decisions that asked for replicas of its own.
    pub paced_adds: u64,
}

impl BatchOutcome {
    /// GPU-hours of the batch's own replicas.
    pub fn gpu_hours(&self) -> f64 {
        self.own.iter().map(|o| o.1).sum()
    }

    /// Cost of the batch's own replicas.
    pub fn cost(&self) -> f64 {
        self.own.iter().map(|o| o.2).sum()
    }

    /// Jobs not finished by their deadline.
    pub fn misses(&self) -> usize {
        self.jobs.iter().filter(|j| !j.met()).count()
    }
}

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
