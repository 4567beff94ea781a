//! The batch runner: one per store, chosen by a lease kept in the store, so a second activator on the same store
//! takes the batches over when the first dies.
//!
//! Which batches run is `tessera_core::batch::schedule`'s: per model the earliest deadline, batches of different
//! models side by side (at most `--batch-max-running`), so a batch whose model never has room holds up nobody
//! else. For each batch it runs: validate the whole input (all or nothing), then
//! rebuild which lines are answered from the result files, then stream the input and send every other line
//! through the activator's own request path in the flex lane, at most `--batch-max-in-flight` at once. One
//! writer appends each answer with its line index and drops a second answer to the same line, so the files
//! hold each `custom_id` once. A cancel (a marker the API leaves) or the deadline stops the sending; the lines
//! in flight finish, and every line left goes to the error file as `batch_cancelled` / `batch_expired`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use tessera_core::batch::{
    BatchEvent, BatchStatus, Endpoint, Ledger, LineValidator, RequestCounts, schedule,
};
use tessera_core::lease::{LeaseDecision, LeaseObservation, decide};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::sync::{Semaphore, mpsc};
use tracing::{debug, info, warn};

use crate::metrics::{BatchLabels, BatchLineLabels};

use super::objects::{
    BatchErrorItem, BatchErrors, BatchObject, FileObject, Usage, answer_line, read_result, result_line,
};
use super::store::{BatchStore, DataReader, StoreError};
use super::{Batches, unix_s};

/// Reads the next line (without its newline) into `buf`, at most `max` bytes; `Ok(false)` at the end. A longer
/// line is an error: a line is one request, and one request is bounded like any the activator reads.
pub async fn read_line<R: AsyncBufRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<bool> {
    buf.clear();
    loop {
        let avail = r.fill_buf().await?;
        if avail.is_empty() {
            return Ok(!buf.is_empty());
        }
        let (take, done) = match memchr::memchr(b'\n', avail) {
            Some(i) => (i + 1, true),
            None => (avail.len(), false),
        };
        if buf.len() + take > max {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a line is longer than {max} bytes"),
            ));
        }
        buf.extend_from_slice(&avail[..take]);
        r.consume(take);
        if done {
            buf.pop();
            if buf.last() == Some(&b'\r') {
                buf.pop();
            }
            return Ok(true);
        }
    }
}

fn now_ms() -> u64 {
    tessera_runtime::unix_ms(std::time::SystemTime::now())
}

/// Whether this runner still holds the lease, as the writer asks before every answer it appends.
///
/// Not only "no renewal has failed": also "the last renewal is recent". A taker waits a whole lease duration
/// without seeing a renewal before it takes over, so a runner whose last renewal is younger than three quarters of
/// that cannot have been replaced; one that was paused (stopped, swapped out, a stalled store) longer than that
/// stops writing the moment it wakes, before its renewal task has even run.
#[derive(Debug)]
struct Held {
    ok: AtomicBool,
    base: tokio::time::Instant,
    renewed_ms: std::sync::atomic::AtomicU64,
    max_age: Duration,
    /// The batches whose result files this tenure has fenced ([`super::store::BatchStore::fence_data`]): once per batch per
    /// tenure, since only a runner that held the lease before this one can have appends still queued. An entry is
    /// dropped when its batch ends, so the set holds at most the batches not final yet.
    fenced: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl Held {
    fn new(lease: Duration) -> Held {
        Held {
            ok: AtomicBool::new(true),
            base: tokio::time::Instant::now(),
            renewed_ms: std::sync::atomic::AtomicU64::new(0),
            max_age: lease * 3 / 4,
            fenced: std::sync::Mutex::default(),
        }
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Records a renewal that *started* at `started_ms` (from [`Held::elapsed_ms`]): a renewal that stalled
    /// past a lease duration between its claim and its write must not count as fresh when it finally returns.
    fn renewed(&self, started_ms: u64) {
        self.renewed_ms.fetch_max(started_ms, Ordering::Relaxed);
    }

    fn lost(&self) {
        self.ok.store(false, Ordering::Relaxed);
    }

    /// Whether `batch` still needs its fence in this tenure (and counts it as fenced from now on).
    fn first_run(&self, batch: &str) -> bool {
        // A poisoned lock only means another batch's task panicked mid-insert: the set is still a set.
        let mut fenced = self
            .fenced
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        fenced.insert(batch.to_owned())
    }

    fn ended(&self, batch: &str) {
        let mut fenced = self
            .fenced
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        fenced.remove(batch);
    }

    fn is_held(&self) -> bool {
        let age = self
            .elapsed_ms()
            .saturating_sub(self.renewed_ms.load(Ordering::Relaxed));
        self.ok.load(Ordering::Relaxed) && u128::from(age) < self.max_age.as_millis()
    }
}

/// Runs the lease and the batches forever.
pub async fn run(b: Arc<Batches>) {
    // Validation checks each line's model against the routing table: before discovery has synced it is
    // incomplete, and a valid batch would fail with model_not_found.
    while !b.app.discovery.synced() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut seen: Option<LeaseObservation> = None;
    loop {
        match acquire(&b, &mut seen).await {
            Ok(true) => {
                info!(instance = %b.instance, "batch runner: holding the lease");
                let held = Arc::new(Held::new(b.limits.lease_duration));
                let renew = tokio::spawn(renew(b.clone(), held.clone()));
                let mut running = Running::default();
                while held.is_held() {
                    if let Err(e) = schedule_pass(&b, &held, &mut running).await {
                        warn!(error = %e, "batch runner: store error; trying again");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    // A created batch, a cancel or a batch that ended wakes the next pass at once.
                    let _ = tokio::time::timeout(Duration::from_millis(500), b.wake.notified()).await;
                }
                // Every running batch sees the lost lease within a watcher turn and stops writing.
                running.join_all().await;
                renew.abort();
                warn!(instance = %b.instance, "batch runner: lost the lease");
            }
            Ok(false) => {}
            Err(e) => warn!(error = %e, "batch runner: cannot read the lease"),
        }
        tokio::time::sleep(b.limits.lease_duration / 4).await;
    }
}

/// The batches this runner is running: each its task and the flag that asks it to yield.
#[derive(Debug, Default)]
struct Running {
    tasks: std::collections::HashMap<String, (tokio::task::JoinHandle<()>, Arc<AtomicBool>)>,
}

impl Running {
    fn reap(&mut self) {
        self.tasks.retain(|_, (task, _)| !task.is_finished());
    }

    async fn join_all(&mut self) {
        for (_, (task, _)) in self.tasks.drain() {
            let _ = task.await;
        }
    }
}

/// One pass: reads the active batches (only those: a final batch is never read again), asks core which to run
/// and which to yield, and starts them.
async fn schedule_pass(b: &Arc<Batches>, held: &Arc<Held>, running: &mut Running) -> Result<(), StoreError> {
    running.reap();
    let now_s = unix_s();
    let mut queued = Vec::new();
    for id in b.store.active_batches().await? {
        let Some(batch) = b.store.get_batch(&id).await? else {
            continue;
        };
        if batch.status.is_final() {
            // Final but still listed active (a crash between the two writes): the write drops the entry.
            b.store.put_batch(&batch).await?;
            continue;
        }
        queued.push(queued_of(b, &batch, now_s).await?);
    }
    let ids: std::collections::HashSet<String> = running.tasks.keys().cloned().collect();
    let plan = schedule::plan(&queued, &ids, b.limits.max_running);
    for id in &plan.yield_now {
        if let Some((_, flag)) = running.tasks.get(id) {
            debug!(batch = %id, "batch runner: an earlier deadline of the same model waits; yielding");
            flag.store(true, Ordering::Relaxed);
        }
    }
    for id in plan.start {
        let flag = Arc::new(AtomicBool::new(false));
        let (b2, held2, flag2, id2) = (b.clone(), held.clone(), flag.clone(), id.clone());
        let task = tokio::spawn(async move {
            let result = match b2.store.get_batch(&id2).await {
                Ok(Some(batch)) if !batch.status.is_final() => run_batch(&b2, batch, &held2, &flag2).await,
                Ok(_) => Ok(()),
                Err(e) => Err(e),
            };
            if let Err(e) = result {
                warn!(batch = %id2, error = %e, "batch runner: store error; the batch is tried again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            // The next pass plans without waiting out its timer.
            b2.wake.notify_one();
        });
        running.tasks.insert(id, (task, flag));
    }
    Ok(())
}

/// What core schedules `batch` by (its turn: `RunKey::of`), read from its document and its cancel marker.
async fn queued_of(b: &Batches, batch: &BatchObject, now_s: u64) -> Result<schedule::Queued, StoreError> {
    let deadline_s = batch.expires_at.unwrap_or(u64::MAX);
    let cancel = b.store.cancel_requested(&batch.id).await?;
    Ok(schedule::Queued {
        id: batch.id.clone(),
        key: schedule::RunKey::of(
            batch.status == BatchStatus::InProgress,
            &batch.model,
            cancel,
            deadline_s,
            now_s,
        ),
        deadline_s,
        created_s: batch.created_at,
    })
}

/// Takes the lease when it is free or its holder stopped renewing it (judged on this process's clock:
/// `tessera_core::lease`). Every write claims its version exclusively first (`claim_lease_version`): of two
/// takers, or a taker and a holder that stalled and woke, exactly one gets the next version.
async fn acquire(b: &Batches, seen: &mut Option<LeaseObservation>) -> Result<bool, StoreError> {
    let lease = b.store.get_lease().await?;
    let claim = b.store.latest_lease_claim().await?;
    let now = now_ms();
    let obs = newest_lease(lease.as_ref(), claim.as_ref(), b.limits.lease_duration).map(
        |(holder, version, duration)| {
            LeaseObservation::observe(seen.as_ref(), Some(holder), duration, version.to_string(), now)
        },
    );
    *seen = obs.clone();
    match decide(obs.as_ref(), &b.instance, now) {
        LeaseDecision::Follow {
            holder,
            expires_in_ms,
        } => {
            debug!(%holder, expires_in_ms, "batch runner: following");
            Ok(false)
        }
        _ => {
            let version = obs
                .as_ref()
                .and_then(|o| o.resource_version.parse::<u64>().ok())
                .unwrap_or(0)
                + 1;
            if !b.store.claim_lease_version(version, &b.instance).await? {
                debug!(
                    version,
                    "batch runner: another runner claimed this lease version first"
                );
                return Ok(false);
            }
            let doc = super::store::LeaseDoc {
                holder: b.instance.clone(),
                version,
                duration_ms: u64::try_from(b.limits.lease_duration.as_millis()).unwrap_or(u64::MAX),
            };
            b.store.put_lease(&doc).await?;
            Ok(true)
        }
    }
}

/// The lease as a taker must judge it: the lease document, or a claim newer than it (holder, version, duration).
///
/// Every lease write claims its version before writing the document, so a holder killed between the two leaves a
/// claim one version ahead of the document. Judging the document alone, every taker would wait it out and then
/// claim that same dead version forever. Judging the newest claim, the takers wait a whole duration without a
/// newer one and claim the next: still exactly one of them wins it. A claim whose claimer is unknown (it died
/// before writing its name) is followed like any holder, never taken at once.
fn newest_lease(
    lease: Option<&super::store::LeaseDoc>,
    claim: Option<&super::store::LeaseClaim>,
    ours: Duration,
) -> Option<(String, u64, Duration)> {
    let newer_claim = claim.filter(|c| lease.is_none_or(|l| c.version > l.version));
    match (lease, newer_claim) {
        (_, Some(c)) => {
            let holder = if c.holder.is_empty() {
                "(a claimer that left no name)".to_owned()
            } else {
                c.holder.clone()
            };
            // The claimer's duration is not written yet: the document's, or this runner's own.
            let duration = lease.map_or(ours, |l| Duration::from_millis(l.duration_ms));
            Some((holder, c.version, duration))
        }
        (Some(l), None) => Some((l.holder.clone(), l.version, Duration::from_millis(l.duration_ms))),
        (None, None) => None,
    }
}

/// Renews the lease every quarter duration; clears `held` when another holder is found or renewals failed for
/// a whole duration (another runner may have taken over by then).
async fn renew(b: Arc<Batches>, held: Arc<Held>) {
    let every = b.limits.lease_duration / 4;
    let mut last_ok = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(every).await;
        let started = held.elapsed_ms();
        let step = async {
            let lease = b.store.get_lease().await?;
            match lease {
                Some(l) if l.holder == b.instance => {
                    let next = super::store::LeaseDoc {
                        version: l.version + 1,
                        ..l
                    };
                    // A taker that judged this lease expired claims the same next version: whoever claims it
                    // first holds the lease, the other stops.
                    if !b.store.claim_lease_version(next.version, &b.instance).await? {
                        return Ok(false);
                    }
                    b.store.put_lease(&next).await.map(|()| true)
                }
                _ => Ok(false),
            }
        };
        match step.await {
            Ok(true) => {
                last_ok = tokio::time::Instant::now();
                held.renewed(started);
            }
            Ok(false) => {
                held.lost();
                return;
            }
            Err(e) => {
                warn!(error = %e, "batch runner: cannot renew the lease");
                if last_ok.elapsed() >= b.limits.lease_duration {
                    held.lost();
                    return;
                }
            }
        }
    }
}

/// The input file, past a UTF-8 byte order mark if it starts with one (editors on Windows write it): every
/// pass (validation, sending, the cancel fill) reads the same lines.
async fn input_reader(b: &Batches, batch: &BatchObject) -> Result<BufReader<DataReader>, StoreError> {
    let mut r = BufReader::with_capacity(64 * 1024, b.store.open_data(&batch.input_file_id).await?);
    skip_bom(&mut r).await.map_err(io_err(&batch.input_file_id))?;
    Ok(r)
}

/// Consumes a leading UTF-8 byte order mark.
async fn skip_bom<R: AsyncBufRead + Unpin>(r: &mut R) -> std::io::Result<()> {
    const BOM: &[u8] = b"\xEF\xBB\xBF";
    // The first fill of a 64 KiB buffer holds the three bytes unless the file is shorter.
    if r.fill_buf().await?.starts_with(BOM) {
        r.consume(BOM.len());
    }
    Ok(())
}

fn io_err(path: &str) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Validates the input file whole: the number of requests and the one model every line names (empty when they
/// name several), or the first bad line.
async fn validate(
    b: &Batches,
    batch: &BatchObject,
) -> Result<Result<(u64, String), BatchErrorItem>, StoreError> {
    let Ok(endpoint) = Endpoint::parse(&batch.endpoint) else {
        return Ok(Err(BatchErrorItem {
            code: "invalid_endpoint".into(),
            message: format!("endpoint {:?} is not supported", batch.endpoint),
            param: Some("endpoint".into()),
            line: None,
        }));
    };
    let models = b.app.router.model_names(&batch.namespace);
    let mut v = LineValidator::new(endpoint, models, b.limits.max_requests);
    let mut r = input_reader(b, batch).await?;
    let mut line = Vec::new();
    let max = b.app.limits.max_body_bytes + 4096;
    // The model of the lines so far: `Some(m)` while they all name `m`, `Some("")` once two differ.
    let mut model: Option<String> = None;
    let mut number = 0u64;
    loop {
        number += 1;
        match read_line(&mut r, &mut line, max).await {
            Ok(true) => match v.check(&line) {
                Ok(Some(valid)) => match &model {
                    None => model = Some(valid.model),
                    Some(m) if *m != valid.model => model = Some(String::new()),
                    Some(_) => {}
                },
                Ok(None) => {}
                Err(e) => {
                    return Ok(Err(BatchErrorItem {
                        code: e.code().into(),
                        message: e.to_string(),
                        param: None,
                        line: e.line(),
                    }));
                }
            },
            Ok(false) => break,
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                return Ok(Err(BatchErrorItem {
                    code: "line_too_long".into(),
                    message: format!("line {number}: {e}; a line is one request (raise --max-body-size)"),
                    param: None,
                    line: Some(number),
                }));
            }
            Err(e) => return Err(io_err(&batch.input_file_id)(e)),
        }
    }
    Ok(v.finish()
        .map(|total| (total, model.unwrap_or_default()))
        .map_err(|e| BatchErrorItem {
            code: e.code().into(),
            message: e.to_string(),
            param: None,
            line: e.line(),
        }))
}

/// What the result files already hold.
#[derive(Debug)]
struct Recovered {
    ledger: Ledger,
    counts: RequestCounts,
    usage: Usage,
}

/// Reads a result file back: marks its lines in the ledger, counts them, sums usage, and cuts a torn last line
/// (a crash mid-write) off. A line answered twice is counted once.
async fn recover_file(
    store: &dyn BatchStore,
    id: &str,
    ok: bool,
    rec: &mut Recovered,
) -> Result<(), StoreError> {
    if store.data_len(id).await? == 0 {
        return Ok(());
    }
    let mut r = BufReader::new(store.open_data(id).await?);
    let mut good_len = 0u64;
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let n = r.read_until(b'\n', &mut buf).await.map_err(io_err(id))?;
        if n == 0 || buf.last() != Some(&b'\n') {
            break;
        }
        // Read for its index and usage only: a line holding a large answer is never built into a tree.
        let Some((index, usage)) = read_result(&buf) else {
            break;
        };
        good_len += n as u64;
        if rec.ledger.mark(index) {
            if ok {
                rec.counts.completed += 1;
                rec.usage.input_tokens += usage.input_tokens;
                rec.usage.output_tokens += usage.output_tokens;
                rec.usage.total_tokens += usage.total_tokens;
            } else {
                rec.counts.failed += 1;
            }
        }
    }
    if good_len < store.data_len(id).await? {
        warn!(
            file = id,
            keep = good_len,
            "batch runner: cutting a torn last line left by a crash"
        );
        store.truncate_data(id, good_len).await?;
    }
    Ok(())
}

/// One line's answer, for the writer: its result line in pieces (the model's body is one of them, as it came),
/// and the share of `--batch-max-answer-bytes-in-flight` it holds until it is written.
struct Answer {
    index: u64,
    parts: Vec<Bytes>,
    ok: bool,
    usage: Usage,
    _budget: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Answer {
    /// A failed line's answer (no body held).
    fn error(batch_id: &str, index: u64, custom_id: &str, code: &str, message: String) -> Answer {
        Answer {
            index,
            parts: vec![Bytes::from(result_line(
                batch_id,
                index,
                custom_id,
                None,
                Some((code, message)),
            ))],
            ok: false,
            usage: Usage::default(),
            _budget: None,
        }
    }
}

/// Why the sending stopped before the end of the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Cancel,
    Expire,
    LostLease,
    /// The input ended with lines unanswered (a stop raced the end): the next pass sends them.
    Incomplete,
    /// An earlier deadline of the same model waits (`tessera_core::batch::schedule`): the rest is sent when this
    /// batch's turn comes again.
    Yield,
}

/// What a batch stopped before its end writes for every line not sent, and the events around it.
#[derive(Debug, Clone, Copy)]
struct Unsent {
    /// The error code each unsent line gets.
    code: &'static str,
    /// Its message.
    message: &'static str,
    /// The `batch_lines_total` outcome.
    outcome: &'static str,
    /// Recorded (and saved) before the lines are filled.
    first: Option<BatchEvent>,
    /// Ends the batch once they are.
    ends: BatchEvent,
}

impl Stop {
    /// The lines left to write for a stop that ends the batch (cancel, expiry); `None` for the others.
    fn unsent(self) -> Option<Unsent> {
        match self {
            Stop::Cancel => Some(Unsent {
                code: "batch_cancelled",
                message: "the batch was cancelled before this request was sent",
                outcome: "cancelled",
                first: Some(BatchEvent::CancelRequested),
                ends: BatchEvent::CancelDone,
            }),
            Stop::Expire => Some(Unsent {
                code: "batch_expired",
                message: "the batch's completion window ended before this request was sent",
                outcome: "expired",
                first: None,
                ends: BatchEvent::DeadlinePassed,
            }),
            Stop::LostLease | Stop::Incomplete | Stop::Yield => None,
        }
    }
}

async fn save(b: &Batches, batch: &BatchObject) -> Result<(), StoreError> {
    b.store.put_batch(batch).await
}

/// Moves `batch` by `event` (the status table in `tessera_core::batch`), stamping the time.
fn step(batch: &mut BatchObject, event: BatchEvent) {
    match batch.status.on(event) {
        Ok(next) => {
            let now = Some(unix_s());
            match next {
                BatchStatus::InProgress => batch.in_progress_at = now,
                BatchStatus::Failed => batch.failed_at = now,
                BatchStatus::Finalizing => batch.finalizing_at = now,
                BatchStatus::Completed => batch.completed_at = now,
                BatchStatus::Expired => batch.expired_at = now,
                BatchStatus::Cancelling => batch.cancelling_at = batch.cancelling_at.or(now),
                BatchStatus::Cancelled => batch.cancelled_at = now,
                BatchStatus::Validating => {}
            }
            batch.status = next;
        }
        Err(e) => warn!(batch = %batch.id, error = %e, "batch runner: ignored"),
    }
}

async fn run_batch(
    b: &Arc<Batches>,
    mut batch: BatchObject,
    held: &Arc<Held>,
    yield_now: &Arc<AtomicBool>,
) -> Result<(), StoreError> {
    if batch.status == BatchStatus::Validating {
        match validate(b, &batch).await? {
            Ok((total, model)) => {
                batch.request_counts.total = total;
                batch.model = model;
                step(&mut batch, BatchEvent::Validated);
                info!(batch = %batch.id, total, model = %batch.model, "batch valid; running");
            }
            Err(item) => {
                info!(batch = %batch.id, error = %item.message, "batch failed validation");
                batch.errors = Some(BatchErrors {
                    object: "list".into(),
                    data: vec![item],
                });
                step(&mut batch, BatchEvent::ValidationFailed);
                return save(b, &batch).await;
            }
        }
        if !held.is_held() {
            return Ok(());
        }
        // Saved, and left for the next pass to schedule in its model's turn.
        return save(b, &batch).await;
    }
    let mut rec = Recovered {
        ledger: Ledger::new(batch.request_counts.total),
        counts: RequestCounts {
            total: batch.request_counts.total,
            completed: 0,
            failed: 0,
        },
        usage: Usage::default(),
    };
    // A runner that held the lease before this tenure may have been paused, not killed, with answers queued for
    // these files: fenced first, its late appends land in copies nobody reads, and what it had written before
    // is recovered below as answered.
    if held.first_run(&batch.id) {
        b.store.fence_data(&batch.output_data).await?;
        b.store.fence_data(&batch.error_data).await?;
    }
    recover_file(b.store.as_ref(), &batch.output_data, true, &mut rec).await?;
    recover_file(b.store.as_ref(), &batch.error_data, false, &mut rec).await?;
    batch.request_counts = rec.counts;
    batch.usage = rec.usage;
    if rec.ledger.answered() > 0 {
        info!(batch = %batch.id, answered = rec.ledger.answered(), total = rec.counts.total, "batch runner: taking over; skipping answered lines");
    }

    let mut stop = None;
    if batch.status == BatchStatus::InProgress {
        stop = send_all(b, &mut batch, &mut rec, held, yield_now).await?;
    } else if batch.status == BatchStatus::Cancelling {
        stop = Some(Stop::Cancel);
    }
    if stop == Some(Stop::LostLease) || !held.is_held() {
        return Ok(());
    }
    if matches!(stop, Some(Stop::Incomplete | Stop::Yield)) {
        return save(b, &batch).await;
    }
    match stop.and_then(Stop::unsent) {
        Some(unsent) => {
            if let Some(first) = unsent.first {
                step(&mut batch, first);
                save(b, &batch).await?;
            }
            if !fill_rest(b, &mut batch, &mut rec, &unsent, held).await? {
                return Ok(());
            }
            finalize_files(b, &mut batch).await?;
            step(&mut batch, unsent.ends);
        }
        None => {
            step(&mut batch, BatchEvent::AllAnswered);
            save(b, &batch).await?;
            finalize_files(b, &mut batch).await?;
            step(&mut batch, BatchEvent::Finalized);
        }
    }
    let labels = BatchLabels {
        namespace: batch.namespace.clone(),
        batch: batch.id.clone(),
    };
    b.app.metrics.batch_slack.remove(&labels);
    b.app.metrics.batch_remaining.remove(&labels);
    info!(batch = %batch.id, status = batch.status.as_str(), completed = batch.request_counts.completed, failed = batch.request_counts.failed, "batch ended");
    held.ended(&batch.id);
    save(b, &batch).await
}

/// Registers the result files as files (`purpose: batch_output`) and names them on the batch.
async fn finalize_files(b: &Batches, batch: &mut BatchObject) -> Result<(), StoreError> {
    for (data, ok) in [
        (batch.output_data.clone(), true),
        (batch.error_data.clone(), false),
    ] {
        let bytes = b.store.data_len(&data).await?;
        if bytes == 0 {
            continue;
        }
        let file = FileObject {
            id: data.clone(),
            object: "file".into(),
            bytes,
            created_at: unix_s(),
            filename: format!("{}_{}.jsonl", batch.id, if ok { "output" } else { "error" }),
            purpose: "batch_output".into(),
            status: "processed".into(),
            namespace: batch.namespace.clone(),
        };
        b.store.put_file(&file).await?;
        if ok {
            batch.output_file_id = Some(data);
        } else {
            batch.error_file_id = Some(data);
        }
    }
    Ok(())
}

/// The input's lines not answered yet, in order, with their indexes (blank lines are no requests and get none):
/// what the sending and the cancel/expiry fill both walk.
struct Unanswered {
    r: BufReader<DataReader>,
    /// The line [`Unanswered::next`] returned the index of, without its newline.
    line: Vec<u8>,
    index: u64,
    max: usize,
    input: String,
}

impl Unanswered {
    async fn open(b: &Batches, batch: &BatchObject) -> Result<Unanswered, StoreError> {
        Ok(Unanswered {
            r: input_reader(b, batch).await?,
            line: Vec::new(),
            index: 0,
            max: b.app.limits.max_body_bytes + 4096,
            input: batch.input_file_id.clone(),
        })
    }

    /// The next line `ledger` does not hold an answer to (in `self.line`), or `None` at the end of the input.
    async fn next(&mut self, ledger: &Ledger) -> Result<Option<u64>, StoreError> {
        while read_line(&mut self.r, &mut self.line, self.max)
            .await
            .map_err(io_err(&self.input))?
        {
            if self.line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let i = self.index;
            self.index += 1;
            if !ledger.is_answered(i) {
                return Ok(Some(i));
            }
        }
        Ok(None)
    }
}

/// Writes `unsent.code` to the error file for every line not answered yet.
async fn fill_rest(
    b: &Batches,
    batch: &mut BatchObject,
    rec: &mut Recovered,
    unsent: &Unsent,
    held: &Held,
) -> Result<bool, StoreError> {
    let mut w = BufWriter::new(b.store.append_data(&batch.error_data).await?);
    let mut lines = Unanswered::open(b, batch).await?;
    let mut filled = 0u64;
    while let Some(i) = lines.next(&rec.ledger).await? {
        if !held.is_held() {
            // Another runner may be filling the same lines now: stop, and drop what is buffered unwritten.
            return Ok(false);
        }
        let custom_id = custom_id_of(&lines.line);
        w.write_all(&result_line(
            &batch.id,
            i,
            &custom_id,
            None,
            Some((unsent.code, unsent.message.to_owned())),
        ))
        .await
        .map_err(io_err(&batch.error_data))?;
        rec.ledger.mark(i);
        batch.request_counts.failed += 1;
        filled += 1;
    }
    b.app
        .metrics
        .batch_lines
        .get_or_create(&BatchLineLabels {
            namespace: batch.namespace.clone(),
            outcome: unsent.outcome,
        })
        .inc_by(filled);
    if !held.is_held() {
        return Ok(false);
    }
    w.flush().await.map_err(io_err(&batch.error_data))?;
    Ok(true)
}

fn custom_id_of(line: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(line)
        .ok()
        .and_then(|v| v["custom_id"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// Sends every unanswered line; returns why it stopped early, if it did.
async fn send_all(
    b: &Arc<Batches>,
    batch: &mut BatchObject,
    rec: &mut Recovered,
    held: &Arc<Held>,
    yield_now: &Arc<AtomicBool>,
) -> Result<Option<Stop>, StoreError> {
    let stopping = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel::<Answer>(b.limits.max_in_flight);
    // The writer: the only one appending to this batch's result files.
    let writer = tokio::spawn(write_answers(
        b.clone(),
        batch.clone(),
        rec.ledger.clone(),
        held.clone(),
        rx,
    ));
    let deadline_ms = batch.expires_at.map_or(u64::MAX, |s| s.saturating_mul(1000));
    // Looks for a cancel and the deadline while lines are sent.
    let watcher = tokio::spawn(watch_for_stop(
        b.clone(),
        batch.id.clone(),
        stopping.clone(),
        held.clone(),
        yield_now.clone(),
        deadline_ms,
    ));
    let slots = Arc::new(Semaphore::new(b.limits.max_in_flight));
    let mut lines = Unanswered::open(b, batch).await?;
    let path = format!("/namespaces/{}{}", batch.namespace, batch.endpoint);
    let mut tasks = tokio::task::JoinSet::new();
    while !stopping.load(Ordering::Relaxed) {
        let Some(i) = lines.next(&rec.ledger).await? else {
            break;
        };
        let Ok(permit) = slots.clone().acquire_owned().await else {
            break;
        };
        // Reap finished sends so the set stays as small as what is in flight.
        while tasks.try_join_next().is_some() {}
        let (b2, tx, stopping, path, batch_id, raw) = (
            b.clone(),
            tx.clone(),
            stopping.clone(),
            path.clone(),
            batch.id.clone(),
            lines.line.clone(),
        );
        tasks.spawn(async move {
            let _permit = permit;
            if let Some(answer) = send_line(&b2, &path, &batch_id, i, &raw, &stopping).await {
                let _ = tx.send(answer).await;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    drop(tx);
    let stop = if stopping.load(Ordering::Relaxed) {
        watcher.await.ok()
    } else {
        watcher.abort();
        None
    };
    match writer.await {
        Ok(Ok((ledger, counts, usage))) => {
            rec.ledger = ledger;
            batch.request_counts = counts;
            batch.usage = usage;
        }
        Ok(Err(e)) => return Err(e),
        Err(e) => {
            return Err(StoreError::Io {
                path: batch.id.clone(),
                source: std::io::Error::other(e.to_string()),
            });
        }
    }
    // Lines the input ran out of while a stop was being noticed are handled by the caller (cancel/expire fill).
    if stop.is_none() && rec.ledger.answered() < batch.request_counts.total {
        // Lines given up on (a stop raced the end of the input): send them on the next pass, never finalize.
        return Ok(Some(Stop::Incomplete));
    }
    Ok(stop)
}

/// Appends each answer to the result files, once per line, while this runner holds the lease, and saves the
/// batch's progress every progress interval. Returns the ledger, counts and usage it ends with.
async fn write_answers(
    b: Arc<Batches>,
    mut batch: BatchObject,
    mut ledger: Ledger,
    held: Arc<Held>,
    mut rx: mpsc::Receiver<Answer>,
) -> Result<(Ledger, RequestCounts, Usage), StoreError> {
    let mut out = BufWriter::new(b.store.append_data(&batch.output_data).await?);
    let mut err = BufWriter::new(b.store.append_data(&batch.error_data).await?);
    let mut last_save = tokio::time::Instant::now();
    let started = last_save;
    let mut answered_here = 0u64;
    while let Some(a) = rx.recv().await {
        if !held.is_held() {
            // Another runner may own the files now: write nothing more.
            continue;
        }
        if !ledger.mark(a.index) {
            continue;
        }
        answered_here += 1;
        b.app
            .metrics
            .batch_lines
            .get_or_create(&BatchLineLabels {
                namespace: batch.namespace.clone(),
                outcome: if a.ok { "completed" } else { "failed" },
            })
            .inc();
        if a.ok {
            for part in &a.parts {
                out.write_all(part).await.map_err(io_err(&batch.output_data))?;
            }
            batch.request_counts.completed += 1;
            batch.usage.input_tokens += a.usage.input_tokens;
            batch.usage.output_tokens += a.usage.output_tokens;
            batch.usage.total_tokens += a.usage.total_tokens;
        } else {
            for part in &a.parts {
                err.write_all(part).await.map_err(io_err(&batch.error_data))?;
            }
            batch.request_counts.failed += 1;
        }
        // Flush whenever nothing else is waiting (each answer reaches the store within one loop turn, and
        // a busy batch still writes in large pieces), and at least every progress interval.
        if rx.is_empty() || last_save.elapsed() >= b.limits.progress_interval {
            // Answers buffered by a runner that lost the lease meanwhile (paused past it) are the new
            // runner's to give: they are dropped, never flushed.
            if !held.is_held() {
                continue;
            }
            out.flush().await.map_err(io_err(&batch.output_data))?;
            err.flush().await.map_err(io_err(&batch.error_data))?;
            if last_save.elapsed() >= b.limits.progress_interval && held.is_held() {
                pace_gauges(
                    &b,
                    &batch,
                    started.elapsed(),
                    batch.request_counts.remaining(),
                    answered_here,
                );
                b.store.put_batch(&batch).await?;
                last_save = tokio::time::Instant::now();
            }
        }
    }
    if held.is_held() {
        out.flush().await.map_err(io_err(&batch.output_data))?;
        err.flush().await.map_err(io_err(&batch.error_data))?;
    }
    Ok((ledger, batch.request_counts, batch.usage))
}

/// Watches for the reasons to stop sending (a yield, a cancel, the deadline, a lost lease); sets `stopping` and
/// returns the first one seen.
async fn watch_for_stop(
    b: Arc<Batches>,
    id: String,
    stopping: Arc<AtomicBool>,
    held: Arc<Held>,
    yield_now: Arc<AtomicBool>,
    deadline_ms: u64,
) -> Stop {
    loop {
        if yield_now.load(Ordering::Relaxed) {
            stopping.store(true, Ordering::Relaxed);
            return Stop::Yield;
        }
        if b.store.cancel_requested(&id).await.unwrap_or(false) {
            stopping.store(true, Ordering::Relaxed);
            return Stop::Cancel;
        }
        if now_ms() >= deadline_ms {
            stopping.store(true, Ordering::Relaxed);
            return Stop::Expire;
        }
        if !held.is_held() {
            stopping.store(true, Ordering::Relaxed);
            return Stop::LostLease;
        }
        tokio::time::sleep(b.limits.progress_interval.min(Duration::from_millis(200))).await;
    }
}

/// Sets a running batch's pace gauges: lines left, and the slack to its deadline at the rate this runner has
/// measured (`answered` lines in `elapsed`).
fn pace_gauges(b: &Batches, batch: &BatchObject, elapsed: Duration, remaining: u64, answered: u64) {
    let labels = BatchLabels {
        namespace: batch.namespace.clone(),
        batch: batch.id.clone(),
    };
    b.app
        .metrics
        .batch_remaining
        .get_or_create(&labels)
        .set(i64::try_from(remaining).unwrap_or(i64::MAX));
    let rate = answered as f64 / elapsed.as_secs_f64().max(1e-3);
    let to_deadline = batch
        .expires_at
        .map_or(f64::INFINITY, |e| e as f64 - now_ms() as f64 / 1000.0);
    let needed = if rate > 0.0 {
        remaining as f64 / rate
    } else {
        f64::INFINITY
    };
    let slack = to_deadline - needed;
    if slack.is_finite() {
        b.app.metrics.batch_slack.get_or_create(&labels).set(slack);
    }
}

/// Sends one line through the activator's request path in the flex lane; retries while the lane has no room
/// (429) or no replica answers (503), with a doubling wait, until the batch stops. `None`: not answered (the
/// batch is stopping; the line stays for the cancel/expiry fill or the next runner).
async fn send_line(
    b: &Batches,
    path: &str,
    batch_id: &str,
    index: u64,
    raw: &[u8],
    stopping: &AtomicBool,
) -> Option<Answer> {
    // The line passed validation, so it parses; were the file changed under the batch, the line is answered
    // with an error rather than left to be retried for ever.
    let parsed: serde_json::Value = serde_json::from_slice(raw).unwrap_or_default();
    let custom_id = parsed["custom_id"].as_str().unwrap_or_default().to_owned();
    let Some(body) = parsed.get("body").and_then(|v| serde_json::to_vec(v).ok()) else {
        return Some(Answer::error(
            batch_id,
            index,
            &custom_id,
            "invalid_line",
            "the line is no longer valid JSON".into(),
        ));
    };
    let body = Bytes::from(body);
    let max = b.limits.max_answer_bytes;
    let mut wait = Duration::from_millis(50);
    loop {
        if stopping.load(Ordering::Relaxed) {
            return None;
        }
        let mut req = http::Request::builder()
            .method(http::Method::POST)
            .uri(path)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.clone()))
            .ok()?;
        req.extensions_mut().insert(crate::proxy::BatchLane);
        let resp = crate::proxy::handle(State(b.app.clone()), req).await;
        let status = resp.status();
        if status == http::StatusCode::TOO_MANY_REQUESTS || status == http::StatusCode::SERVICE_UNAVAILABLE {
            debug!(
                batch = batch_id,
                index,
                status = status.as_u16(),
                "batch line refused; retrying"
            );
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(b.limits.retry_max);
            continue;
        }
        let too_large = || {
            Answer::error(
                batch_id,
                index,
                &custom_id,
                "response_too_large",
                format!(
                    "the model answered {} with more than {max} bytes, the most kept for one line (--batch-max-answer-bytes)",
                    status.as_u16()
                ),
            )
        };
        // What this answer may hold of the runner's budget: its declared length, or the per-line bound when it
        // declares none (a stream). Taken before its body is read, released once the writer has written it.
        let declared = resp
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > u64::from(max)) {
            return Some(too_large());
        }
        let need = declared.map_or(max, |n| u32::try_from(n).unwrap_or(max)).max(1);
        let Ok(permit) = b.answer_budget.clone().acquire_many_owned(need).await else {
            return None;
        };
        let bytes = match Limited::new(resp.into_body(), need as usize).collect().await {
            Ok(c) => c.to_bytes(),
            Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
                return Some(too_large());
            }
            Err(e) => {
                return Some(Answer::error(
                    batch_id,
                    index,
                    &custom_id,
                    "response_unreadable",
                    e.to_string(),
                ));
            }
        };
        let ok = status.is_success();
        let mut usage = Usage::default();
        if ok {
            usage.add_raw(&bytes);
        }
        return Some(Answer {
            index,
            parts: answer_line(batch_id, index, &custom_id, status.as_u16(), bytes).to_vec(),
            ok,
            usage,
            _budget: Some(permit),
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::batch::store::{LeaseClaim, LeaseDoc, LocalStore};

    #[test]
    fn a_claim_newer_than_the_lease_is_what_a_taker_waits_out() {
        let ours = Duration::from_secs(15);
        let doc = LeaseDoc {
            holder: "a".into(),
            version: 7,
            duration_ms: 1_000,
        };
        let claim = |version, holder: &str| LeaseClaim {
            version,
            holder: holder.into(),
        };
        // The usual case: the document is as new as the newest claim.
        assert_eq!(
            newest_lease(Some(&doc), Some(&claim(7, "a")), ours),
            Some(("a".into(), 7, Duration::from_secs(1)))
        );
        // The holder was killed between claiming 8 and writing it: the taker judges 8 and will claim 9.
        assert_eq!(
            newest_lease(Some(&doc), Some(&claim(8, "a")), ours),
            Some(("a".into(), 8, Duration::from_secs(1)))
        );
        // A claimer that died before writing its name is followed, never taken at once.
        let (holder, version, _) = newest_lease(None, Some(&claim(1, "")), ours).unwrap();
        assert!(!holder.is_empty());
        assert_eq!(version, 1);
        assert!(matches!(
            decide(
                Some(&LeaseObservation::observe(
                    None,
                    Some(holder),
                    ours,
                    "1".into(),
                    0
                )),
                "b",
                0
            ),
            LeaseDecision::Follow { .. }
        ));
        assert_eq!(newest_lease(None, None, ours), None);
    }

    #[tokio::test]
    async fn a_torn_last_line_is_cut_and_a_repeat_counted_once() {
        let dir = super::super::store::scratch_dir("recover");
        let store = LocalStore::open(&dir).unwrap();
        let body = serde_json::json!({"usage": {"prompt_tokens": 3, "completion_tokens": 2}});
        let mut data = Vec::new();
        data.extend(result_line("batch_x", 0, "a", Some((200, body.clone())), None));
        data.extend(result_line("batch_x", 2, "c", Some((200, body.clone())), None));
        data.extend(result_line("batch_x", 0, "a", Some((200, body)), None));
        let whole = data.len() as u64;
        data.extend_from_slice(b"{\"id\":\"batch_req_batch_x_1\",\"custom_id\":\"b\",\"resp");
        let mut w = store.create_data("out").await.unwrap();
        w.write_all(&data).await.unwrap();
        w.flush().await.unwrap();
        let mut rec = Recovered {
            ledger: Ledger::new(3),
            counts: RequestCounts {
                total: 3,
                completed: 0,
                failed: 0,
            },
            usage: Usage::default(),
        };
        recover_file(&store, "out", true, &mut rec).await.unwrap();
        assert_eq!(
            store.data_len("out").await.unwrap(),
            whole,
            "the torn line is cut"
        );
        assert_eq!(rec.counts.completed, 2, "line 0 twice counts once");
        assert_eq!(rec.usage.total_tokens, 10);
        assert!(rec.ledger.is_answered(0) && rec.ledger.is_answered(2) && !rec.ledger.is_answered(1));
        let mut r = BufReader::new(&b"a\r\nbb\n\nccc"[..]);
        let mut line = Vec::new();
        let mut got = Vec::new();
        while read_line(&mut r, &mut line, 3).await.unwrap() {
            got.push(String::from_utf8(line.clone()).unwrap());
        }
        assert_eq!(got, ["a", "bb", "", "ccc"]);
        let mut long = BufReader::new(&b"abcd\n"[..]);
        assert!(read_line(&mut long, &mut line, 3).await.is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
