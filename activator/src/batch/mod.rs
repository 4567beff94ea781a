//! The OpenAI Batch API, served by the activator for every model it routes: upload a JSONL file of requests,
//! create a batch, and a runner answers each line through the activator's own request path at the lowest
//! priority (the flex lane: only into the spare room of the model's replicas, refused before it slows a
//! real-time request), appending each answer to the batch's output or error file as it completes.
//!
//! ```text
//!  POST /v1/files (multipart) ──stream──▶ BatchStore (files/<id>.data)        one runner per store, by lease
//!  POST /v1/batches ──▶ batch record (validating) ──▶ runner: validate all ──▶ in_progress ──▶ each line:
//!       proxy::handle (flex lane) ──▶ model ──▶ append to output/error file (line index in the record id)
//!  POST /v1/batches/{id}/cancel ──▶ cancel marker ──▶ runner: rest of the lines → batch_cancelled
//! ```
//!
//! - [`objects`]: the OpenAI `file` and `batch` objects and result lines.
//! - [`store`]: the [`store::BatchStore`] interface and the local-directory store.
//! - [`multipart`]: the streaming upload reader.
//! - [`api`]: the HTTP handlers.
//! - [`runner`]: the lease and the runner (validate, send, append, cancel, expire, take over after a crash).
//!
//! Nothing lost, nothing twice: every answer is appended with its input line's index before the next status is
//! written; a runner that takes over rebuilds which lines are answered from the result files
//! (`tessera_core::batch::Ledger`) and sends only the others, so every `custom_id` is in the output or the error
//! file exactly once.

pub mod api;
pub mod multipart;
pub mod objects;
pub mod runner;
pub mod store;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};

use self::store::BatchStore;
use super::proxy::App;

/// `tessera activator` flags for the batch API.
#[derive(Debug, Clone, clap::Args)]
pub struct BatchArgs {
    /// Serve the OpenAI Files and Batches API, keeping files, batches, results and the runner's lease in this
    /// directory (a volume shared by every activator that may take over a batch). Without it the batch routes
    /// answer 404.
    #[arg(long, env = "TESSERA_BATCH_STORE")]
    pub batch_store: Option<PathBuf>,

    /// Most requests (lines) in one batch.
    #[arg(long, env = "TESSERA_BATCH_MAX_REQUESTS", default_value_t = 50_000)]
    pub batch_max_requests: u64,

    /// Largest file accepted by `POST /v1/files`, in bytes (200 MB, as OpenAI).
    #[arg(long, env = "TESSERA_BATCH_MAX_FILE_BYTES", default_value = "200MiB", value_parser = tessera_runtime::size::parse_bytes)]
    pub batch_max_file_bytes: u64,

    /// Lines of one batch in flight at once (each also passes the flex lane's gate). More lines waiting at the
    /// gate buy no throughput (the gate lets one go per gauge reading) but keep more decode work on the server
    /// whenever it has room, which a real-time prompt then waits behind: measured, 64 took the real-time TTFT
    /// p95 19% over its value alone for the same batch throughput, 16 kept it within 6% (docs/performance.md).
    #[arg(long, env = "TESSERA_BATCH_MAX_IN_FLIGHT", default_value_t = 16)]
    pub batch_max_in_flight: usize,

    /// How long the runner's lease lasts without a renewal: a second activator on the same store takes the
    /// batches over this long after the runner died.
    #[arg(long, env = "TESSERA_BATCH_LEASE_DURATION", value_parser = humantime::parse_duration, default_value = "15s")]
    pub batch_lease_duration: Duration,

    /// Longest wait before a line refused by the flex lane (429) or unanswered (503) is tried again; the wait
    /// doubles from 50ms up to this.
    #[arg(long, env = "TESSERA_BATCH_RETRY_MAX", value_parser = humantime::parse_duration, default_value = "2s")]
    pub batch_retry_max: Duration,

    /// Most files (uploads and results) one namespace may keep in the store; an upload beyond is refused with 429
    /// until files are deleted.
    #[arg(long, env = "TESSERA_BATCH_MAX_FILES_PER_NAMESPACE", default_value_t = 1000)]
    pub batch_max_files_per_namespace: u64,

    /// Most bytes of files (uploads and results) one namespace may keep in the store, so one tenant cannot fill
    /// the volume every namespace shares (the chart's default claim is 20Gi).
    #[arg(long, env = "TESSERA_BATCH_MAX_NAMESPACE_BYTES", default_value = "4GiB", value_parser = tessera_runtime::size::parse_bytes)]
    pub batch_max_namespace_bytes: u64,

    /// Most batches not finished yet one namespace may have; creating another is refused with 429.
    #[arg(long, env = "TESSERA_BATCH_MAX_ACTIVE_PER_NAMESPACE", default_value_t = 100)]
    pub batch_max_active_per_namespace: u64,

    /// Most batches run at once. Per model only the batch with the earliest deadline runs (its lines share that
    /// model's spare room), so this bounds batches of different models running side by side.
    #[arg(long, env = "TESSERA_BATCH_MAX_RUNNING", default_value_t = 8)]
    pub batch_max_running: usize,

    /// Largest answer kept for one line, in bytes; a longer one is recorded in the error file as
    /// `response_too_large`.
    #[arg(long, env = "TESSERA_BATCH_MAX_ANSWER_BYTES", default_value = "8MiB", value_parser = tessera_runtime::size::parse_bytes)]
    pub batch_max_answer_bytes: u64,

    /// Most bytes of answers the runner holds at once, over every line in flight of every batch (a line waits for
    /// room before it is sent). At least `--batch-max-answer-bytes`.
    #[arg(long, env = "TESSERA_BATCH_MAX_ANSWER_BYTES_IN_FLIGHT", default_value = "64MiB", value_parser = tessera_runtime::size::parse_bytes)]
    pub batch_max_answer_bytes_in_flight: u64,

    /// How often a running batch's `request_counts` are written to the store (and a cancel looked for).
    #[arg(long, env = "TESSERA_BATCH_PROGRESS_INTERVAL", value_parser = humantime::parse_duration, default_value = "500ms")]
    pub batch_progress_interval: Duration,
}

/// The batch API's bounds.
#[derive(Debug, Clone)]
pub struct BatchLimits {
    /// `--batch-max-requests`.
    pub max_requests: u64,
    /// `--batch-max-file-bytes`.
    pub max_file_bytes: u64,
    /// `--batch-max-in-flight`.
    pub max_in_flight: usize,
    /// `--batch-lease-duration`.
    pub lease_duration: Duration,
    /// `--batch-retry-max`.
    pub retry_max: Duration,
    /// `--batch-progress-interval`.
    pub progress_interval: Duration,
    /// `--batch-max-files-per-namespace`.
    pub max_files_per_namespace: u64,
    /// `--batch-max-namespace-bytes`.
    pub max_namespace_bytes: u64,
    /// `--batch-max-active-per-namespace`.
    pub max_active_per_namespace: u64,
    /// `--batch-max-running`.
    pub max_running: usize,
    /// `--batch-max-answer-bytes`.
    pub max_answer_bytes: u32,
    /// `--batch-max-answer-bytes-in-flight` (at least `max_answer_bytes`).
    pub max_answer_bytes_in_flight: u32,
}

impl BatchArgs {
    /// The bounds from the flags.
    pub fn limits(&self) -> BatchLimits {
        BatchLimits {
            max_requests: self.batch_max_requests,
            max_file_bytes: self.batch_max_file_bytes,
            max_in_flight: self.batch_max_in_flight.max(1),
            lease_duration: self.batch_lease_duration.max(Duration::from_millis(300)),
            retry_max: self.batch_retry_max.max(Duration::from_millis(50)),
            progress_interval: self.batch_progress_interval.max(Duration::from_millis(10)),
            max_files_per_namespace: self.batch_max_files_per_namespace.max(1),
            max_namespace_bytes: self.batch_max_namespace_bytes.max(1),
            max_active_per_namespace: self.batch_max_active_per_namespace.max(1),
            max_running: self.batch_max_running.max(1),
            // Held as semaphore permits (u32): up to 4 GiB, which no answer should approach.
            max_answer_bytes: answer_bytes(self.batch_max_answer_bytes),
            max_answer_bytes_in_flight: answer_bytes(
                self.batch_max_answer_bytes_in_flight
                    .max(self.batch_max_answer_bytes),
            ),
        }
    }
}

fn answer_bytes(n: u64) -> u32 {
    u32::try_from(n.max(1024)).unwrap_or(u32::MAX)
}

/// What the batch API and its runner share.
#[derive(Debug)]
pub struct Batches {
    /// Where everything is kept.
    pub store: Arc<dyn BatchStore>,
    /// Bounds.
    pub limits: BatchLimits,
    /// The activator's request path (lines go through it) and its routing (the models a line may name).
    pub app: Arc<App>,
    /// This process's name in the lease.
    pub instance: String,
    /// Wakes the runner when a batch is created.
    pub wake: Notify,
    /// Bytes of answers held by lines in flight (`--batch-max-answer-bytes-in-flight`).
    pub answer_budget: Arc<Semaphore>,
    ids: AtomicU64,
}

impl Batches {
    /// The batch service over `store`.
    pub fn new(
        store: Arc<dyn BatchStore>,
        limits: BatchLimits,
        app: Arc<App>,
        instance: String,
    ) -> Arc<Batches> {
        let answer_budget = Arc::new(Semaphore::new(limits.max_answer_bytes_in_flight as usize));
        Arc::new(Batches {
            store,
            limits,
            answer_budget,
            app,
            instance,
            wake: Notify::new(),
            ids: AtomicU64::new(0),
        })
    }

    /// A new id with `prefix` (`file`, `batch`): unique across processes sharing a store (time, process id and
    /// a counter), and only characters a store path can hold. It begins with the time as 16 hex digits, so ids
    /// sort by creation (the store's listings rely on it).
    pub fn new_id(&self, prefix: &str, sep: char) -> String {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let n = self.ids.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}{sep}{nanos:016x}{:x}{n:x}", std::process::id())
    }
}

/// Unix seconds now.
pub(crate) fn unix_s() -> u64 {
    tessera_runtime::unix_ms(std::time::SystemTime::now()) / 1000
}
