//! Sleep mode, performed and checked: the sidecar alone reaches vLLM's sleep endpoints.
//!
//! The controller's instruction is the pod annotation [`tessera_core::sleep::command::ANNOTATION`], which the
//! kubelet writes into a downward-API file (`--rest-file`); no network call can put a replica to sleep, so a tenant
//! cannot sleep another's model. The loop here:
//! 1. reads the file every `--rest-poll`; with an instruction to obey ([`tracker::Tracker::obeys`]) and vLLM idle
//!    (nothing running or waiting) for `--rest-settle`, it records a canary answer (fixed seed, temperature 0,
//!    a few tokens), sends `POST /sleep?level=N&mode=wait`, waits for `vllm:engine_sleep_state` to read asleep,
//!    and measures the GPU memory freed and left (`null` where nothing measures it);
//! 2. wakes on `POST /tessera/v1/wake` (the activator holding a request), when a request reached the sleeping
//!    server itself (vLLM shows it waiting), or when the instruction is withdrawn:
//!    the wake sequence ([`vllm::VllmClient::wake`]), the state metric reading awake, then the canary again — a
//!    different answer fails the replica (`failed`, `/tessera/v1/live` answers 503, the kubelet restarts vLLM).
//!
//! Every transition is bounded by `--rest-timeout`; a wake that does not complete in it fails the replica the
//! same way. `/ready` is false from the moment the sidecar starts putting vLLM to sleep until a wake has passed
//! its canary, so the activator holds requests exactly as during a cold start.

pub mod annotations;
pub mod tracker;
pub mod vllm;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tessera_core::sleep::command::{ANNOTATION, RestCommand, SleepLevel};
use tessera_core::wire::sidecar::{RestState, RestStatus};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::gpu::GpuProbe;
use tracker::Tracker;
use vllm::{EngineSleep, VllmClient};

/// Largest annotations file read (the kubelet's file holds every annotation of the pod; 256 KiB is the API's
/// limit for all of them together).
const MAX_FILE_BYTES: u64 = 512 * 1024;

/// How often a transition polls the state metric.
const STATE_POLL: Duration = Duration::from_millis(10);

/// Sleep-mode flags (`tessera sidecar`).
#[derive(Debug, Clone, clap::Args)]
pub struct RestArgs {
    /// The pod's annotations as a downward-API file (`fieldRef: metadata.annotations`; the webhook mounts it when
    /// sleep mode is on). Sleep mode is off without it.
    #[arg(long, env = "TESSERA_REST_FILE")]
    pub rest_file: Option<PathBuf>,
    /// How often the annotations file and vLLM's idleness are read.
    #[arg(long, env = "TESSERA_REST_POLL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub rest_poll: Duration,
    /// How long vLLM must have had nothing running or waiting before it is put to sleep.
    #[arg(long, env = "TESSERA_REST_SETTLE", default_value = "10s", value_parser = humantime::parse_duration)]
    pub rest_settle: Duration,
    /// Longest a sleep or a wake (the calls, the state metric, the canary) may take; a wake that takes longer fails
    /// the replica's liveness.
    #[arg(long, env = "TESSERA_REST_TIMEOUT", default_value = "60s", value_parser = humantime::parse_duration)]
    pub rest_timeout: Duration,
    /// A risky set-up of this server for sleep mode (repeatable; the webhook passes the risks it finds in vLLM's
    /// command line and image). Reported as `rest.risks`; the controller decides whether to sleep anyway
    /// (`spec.sleep.allowRisky`).
    #[arg(long = "sleep-risk")]
    pub sleep_risks: Vec<String>,
}

/// What the HTTP server shares with the loop.
#[derive(Debug)]
pub struct Rest {
    enabled: bool,
    tracker: Mutex<Tracker>,
    wake_wanted: AtomicBool,
    kick: Notify,
    changed: watch::Sender<u64>,
}

/// What a wake asked over HTTP ended in.
#[derive(Debug, Clone, PartialEq)]
pub enum WakeOutcome {
    /// Sleep mode is off (no `--rest-file`).
    Off,
    /// Awake (now or already).
    Awake(RestStatus),
    /// The replica failed a check; it is being restarted.
    Failed(RestStatus),
    /// Not awake within the caller's bound.
    Pending(RestStatus),
}

impl Rest {
    /// Sleep mode on when `enabled`, with the server's `risks` (reported, not acted on here).
    pub fn new(enabled: bool, risks: Vec<String>) -> Self {
        let mut tracker = Tracker::new();
        tracker.set_risks(risks);
        Self {
            enabled,
            tracker: Mutex::new(tracker),
            wake_wanted: AtomicBool::new(false),
            kick: Notify::new(),
            changed: watch::Sender::new(0),
        }
    }

    /// A risk found later (the model directory's config, read once it is there); added once.
    pub fn add_risk(&self, risk: String) {
        if let Ok(mut t) = self.tracker.lock() {
            let mut risks = t.status().risks.clone();
            if !risks.contains(&risk) {
                risks.push(risk);
                t.set_risks(risks);
            }
        }
    }

    fn with<T>(&self, f: impl FnOnce(&Tracker) -> T) -> Option<T> {
        self.tracker.lock().ok().map(|t| f(&t))
    }

    fn update(&self, f: impl FnOnce(&mut Tracker)) {
        if let Ok(mut t) = self.tracker.lock() {
            f(&mut t);
        }
        self.changed.send_modify(|g| *g = g.wrapping_add(1));
    }

    /// `/v1/status`'s `rest`: `None` where sleep mode is off.
    pub fn status(&self) -> Option<RestStatus> {
        if !self.enabled {
            return None;
        }
        self.with(|t| t.status().clone())
    }

    /// Ready for requests as far as sleep mode goes (always, where it is off).
    pub fn ready(&self) -> bool {
        !self.enabled || self.with(Tracker::ready).unwrap_or(false)
    }

    /// The vLLM container's liveness as far as sleep mode goes.
    pub fn live(&self) -> bool {
        !self.enabled || self.with(Tracker::live).unwrap_or(false)
    }

    /// Asks for a wake and waits for it at most `limit`. Concurrent callers join the same wake: each only raises
    /// the flag the loop reads, and the loop performs one wake at a time.
    pub async fn wake(&self, limit: Duration) -> WakeOutcome {
        if !self.enabled {
            return WakeOutcome::Off;
        }
        let mut seen = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + limit;
        let mut asked = false;
        loop {
            let Some(status) = self.with(|t| t.status().clone()) else {
                return WakeOutcome::Off;
            };
            match status.state {
                RestState::Awake => return WakeOutcome::Awake(status),
                RestState::Failed => return WakeOutcome::Failed(status),
                _ => {}
            }
            if !asked {
                self.wake_wanted.store(true, Ordering::Release);
                self.kick.notify_one();
                asked = true;
            }
            if tokio::time::timeout_at(deadline, seen.changed()).await.is_err() {
                return WakeOutcome::Pending(status);
            }
        }
    }
}

/// Reads the instruction from the annotations file: `Ok(None)` when the file or the annotation is absent.
pub async fn read_command(path: &Path) -> Result<Option<RestCommand>, String> {
    use tokio::io::AsyncReadExt as _;
    let file = match tokio::fs::File::open(path).await {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot open {}: {e}", path.display())),
    };
    let mut text = String::new();
    file.take(MAX_FILE_BYTES)
        .read_to_string(&mut text)
        .await
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let all = annotations::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    all.get(ANNOTATION)
        .map(|v| v.parse::<RestCommand>().map_err(|e| e.to_string()))
        .transpose()
}

fn unix_now() -> f64 {
    crate::unix_now()
}

/// The loop's own state: the canary recorded before the sleep.
struct Canary {
    model: String,
    answer: String,
}

/// Runs sleep mode until `shutdown`. `gpu` is a probe whose used memory is this server's alone (a dedicated GPU),
/// or `None`.
pub async fn run(
    rest: std::sync::Arc<Rest>,
    args: RestArgs,
    client: VllmClient,
    gpu: Option<Box<dyn GpuProbe>>,
    shutdown: CancellationToken,
) {
    let Some(path) = args.rest_file.clone() else {
        return;
    };
    let mut canary: Option<Canary> = None;
    let mut last_error: Option<String> = None;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(args.rest_poll) => {}
            () = rest.kick.notified() => {}
        }
        let cmd = match read_command(&path).await {
            Ok(c) => {
                last_error = None;
                c
            }
            Err(e) => {
                if last_error.as_ref() != Some(&e) {
                    tracing::warn!(error = %e, "cannot read the sleep instruction; staying awake");
                    last_error = Some(e);
                }
                None
            }
        };
        let state = rest.with(Tracker::state).unwrap_or(RestState::Failed);
        match state {
            RestState::Awake => {
                rest.wake_wanted.store(false, Ordering::Release);
                let Some(c) = cmd.filter(|c| rest.with(|t| t.obeys(c)).unwrap_or(false)) else {
                    rest.update(Tracker::not_asked);
                    continue;
                };
                let in_flight = match client.page().await {
                    Ok(p) => p.in_flight,
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot read vLLM's requests in flight");
                        None
                    }
                };
                let now_ms = (unix_now() * 1000.0) as u64;
                let settle_ms = u64::try_from(args.rest_settle.as_millis()).unwrap_or(u64::MAX);
                let mut idle = false;
                // Unknown is not idle: a replica is never put to sleep on a guess.
                if let Some(n) = in_flight {
                    rest.update(|t| idle = t.idle_for(n, now_ms, settle_ms));
                }
                if idle {
                    canary = fall_asleep(&rest, &c, &client, gpu.as_deref(), args.rest_timeout).await;
                }
            }
            RestState::Sleeping => {
                let wanted = rest.wake_wanted.swap(false, Ordering::AcqRel);
                // A request that reached the server itself while it slept (a router that had not yet seen the
                // replica turn unready) waits in vLLM's queue: it is demand, and nothing else would wake it.
                let reached = !wanted
                    && cmd.is_some()
                    && matches!(client.page().await, Ok(p) if p.in_flight.is_some_and(|n| n > 0.0));
                if wanted || reached || cmd.is_none() {
                    let why = if wanted {
                        "a request is waiting"
                    } else if reached {
                        "a request reached the sleeping server"
                    } else {
                        "the instruction was withdrawn"
                    };
                    tracing::info!(why, "waking vLLM");
                    wake(&rest, &client, canary.as_ref(), args.rest_timeout).await;
                }
            }
            RestState::Failed => rest.wake_wanted.store(false, Ordering::Release),
            RestState::FallingAsleep | RestState::Waking => {}
        }
    }
}

/// GPU memory this server holds now: the emulator's gauge where the page has it, else the dedicated GPU's used
/// memory, else unmeasured.
async fn memory(client: &VllmClient, gpu: Option<&dyn GpuProbe>) -> Option<u64> {
    if let Ok(p) = client.page().await
        && let Some(b) = p.gpu_used_bytes
    {
        return Some(b);
    }
    gpu.and_then(|g| g.read().ok()).and_then(|r| r.used_bytes)
}

/// Polls until the server's sleep state is `want` (the state metric, or `/is_sleeping` where the page has none).
async fn reach(client: &VllmClient, want: EngineSleep) {
    loop {
        let now = match client.page().await {
            Ok(p) => match p.sleep {
                Some(s) => Some(s),
                None => client
                    .is_sleeping()
                    .await
                    .ok()
                    .map(|asleep| match (asleep, want) {
                        (true, EngineSleep::Asleep(l)) => EngineSleep::Asleep(l),
                        (true, EngineSleep::Awake) => EngineSleep::Asleep(SleepLevel::One),
                        (false, _) => EngineSleep::Awake,
                    }),
            },
            Err(_) => None,
        };
        if now == Some(want) {
            return;
        }
        tokio::time::sleep(STATE_POLL).await;
    }
}

async fn fall_asleep(
    rest: &Rest,
    cmd: &RestCommand,
    client: &VllmClient,
    gpu: Option<&dyn GpuProbe>,
    limit: Duration,
) -> Option<Canary> {
    let level = cmd.level;
    let recorded = async {
        let model = client.first_model().await?;
        let answer = client.canary(&model).await?;
        Ok::<_, vllm::VllmCallError>(Canary { model, answer })
    };
    let canary = match tokio::time::timeout(limit, recorded).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            let why = format!("no canary answer to check a wake against, so no sleep: {e}");
            tracing::warn!(%why, "not sleeping");
            rest.update(|t| t.refuse(cmd, why, unix_now()));
            return None;
        }
        Err(_) => {
            let why = format!(
                "the canary did not answer within {}",
                humantime::format_duration(limit)
            );
            rest.update(|t| t.refuse(cmd, why, unix_now()));
            return None;
        }
    };
    let before = memory(client, gpu).await;
    rest.update(|t| t.falling_asleep(level, unix_now()));
    let started = Instant::now();
    let slept = tokio::time::timeout(limit, async {
        client.sleep(level, limit).await?;
        reach(client, EngineSleep::Asleep(level)).await;
        Ok::<_, vllm::VllmCallError>(())
    })
    .await;
    match slept {
        Ok(Ok(())) => {}
        Ok(Err(e)) if e.status() == Some(404) => {
            let why =
                "the server has no /sleep: start vLLM with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1"
                    .to_owned();
            tracing::warn!(error = %e, "{why}");
            rest.update(|t| t.refuse(cmd, why, unix_now()));
            return None;
        }
        Ok(Err(e)) => {
            // What state the server is in after a failed /sleep decides: still awake is a refusal, anything else
            // is a replica in an unknown state.
            let still_awake = matches!(client.page().await, Ok(p) if p.sleep == Some(EngineSleep::Awake));
            let why = format!("the sleep failed: {e}");
            tracing::warn!(%why, still_awake, "sleep failed");
            if still_awake {
                rest.update(|t| t.refuse(cmd, why, unix_now()));
            } else {
                rest.update(|t| t.failed(why, false, unix_now()));
            }
            return None;
        }
        Err(_) => {
            let why = format!(
                "vllm:engine_sleep_state did not read asleep at level {} within {}",
                level.as_u8(),
                humantime::format_duration(limit)
            );
            tracing::error!(%why, "sleep failed its check");
            rest.update(|t| t.failed(why, false, unix_now()));
            return None;
        }
    }
    let took = started.elapsed().as_secs_f64();
    let after = memory(client, gpu).await;
    if let (Some(b), Some(a)) = (before, after)
        && a >= b
    {
        let why = format!("the sleep gave back no GPU memory ({b} bytes before, {a} after)");
        tracing::error!(%why, "sleep failed its check");
        rest.update(|t| t.failed(why, false, unix_now()));
        return None;
    }
    tracing::info!(
        level = level.as_u8(),
        took_secs = took,
        before,
        after,
        "vLLM asleep"
    );
    rest.update(|t| t.asleep(before, after, took, unix_now()));
    Some(canary)
}

async fn wake(rest: &Rest, client: &VllmClient, canary: Option<&Canary>, limit: Duration) {
    let level = rest.with(Tracker::level).flatten().unwrap_or(SleepLevel::One);
    rest.update(|t| t.waking(unix_now()));
    let started = Instant::now();
    let woke = tokio::time::timeout(limit, async {
        client.wake(level, limit).await?;
        reach(client, EngineSleep::Awake).await;
        match canary {
            Some(c) => client.canary(&c.model).await.map(Some),
            None => Ok(None),
        }
    })
    .await;
    let now = unix_now();
    match (woke, canary) {
        (Err(_), _) => {
            let why = format!(
                "the wake did not complete within {}",
                humantime::format_duration(limit)
            );
            tracing::error!(%why, "wake failed; liveness fails so the kubelet restarts vLLM");
            rest.update(|t| t.failed(why, false, now));
        }
        (Ok(Err(e)), _) => {
            let why = format!("the wake failed: {e}");
            tracing::error!(%why, "wake failed; liveness fails so the kubelet restarts vLLM");
            rest.update(|t| t.failed(why, false, now));
        }
        (Ok(Ok(Some(got))), Some(c)) if got != c.answer => {
            let why = format!(
                "the canary answered {got:?} after the wake, {:?} before the sleep: the server is not the same",
                c.answer
            );
            tracing::error!(%why, "canary failed; liveness fails so the kubelet restarts vLLM");
            rest.update(|t| t.failed(why, true, now));
        }
        (Ok(Ok(_)), _) => {
            let took = started.elapsed().as_secs_f64();
            tracing::info!(took_secs = took, "vLLM awake; canary answered as before");
            rest.update(|t| t.woke(took, now));
        }
    }
}
