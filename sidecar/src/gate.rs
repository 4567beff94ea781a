//! The start-up gate's I/O: one `coordination.k8s.io/v1` Lease per shared GPU, so vLLM servers on that GPU start
//! one at a time (the rule, and why, is in [`tessera_core::gate`]).
//!
//! The sidecar is a native sidecar: kubelet starts the vLLM container only after the sidecar's startup probe
//! (`GET /startup`) passes, and it passes only while this pod holds the GPU's lease (or once the gate is open for
//! good). The loop here reads the lease, asks the core rule what to do, writes with the `resourceVersion` it read
//! (of two pods racing, exactly one wins), renews while vLLM loads, and releases as soon as vLLM answers
//! `/health` or the start-up timeout passes.
//!
//! Waiting is visible: a waiting pod adds itself to the lease's `tessera.dev/startup-waiting` annotation
//! (`kubectl describe lease -n POOL tessera-startup-…` shows who holds the GPU, since when, and who waits), its
//! `/startup` answers 503 with the holder, and it logs the holder once per change.
//!
//! It fails open: if the Kubernetes API cannot be reached for `--gate-api-timeout`, the gate opens (the pod
//! starts as it would without Tessera) and says so — never a pod blocked by Tessera being down.
//!
//! RBAC: get, create and update on `leases` in the gate's namespace — nothing else.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use serde::Serialize;
use tessera_core::gate::{self, Action, OpenReason, Phase};
use tessera_core::lease::LeaseObservation;
use tessera_runtime::kube_client::{give_up_lease, hold_lease, lease_facts};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use tessera_core::gate::WAITING_ANNOTATION;
/// At most this many waiters are listed (the annotation stays small whatever happens).
const MAX_WAITERS: usize = 32;
/// A waiter entry older than this is dropped (its pod is most likely gone).
const WAITER_TTL_MS: u64 = 3_600_000;

/// The gate's flags (part of `tessera sidecar`).
#[derive(Debug, Clone, clap::Args)]
pub struct GateArgs {
    /// UUID of the shared GPU this pod was placed on (set by the webhook in fractional mode). Without it the pod
    /// has a whole GPU (or none) and the gate is open from the start.
    #[arg(long, env = "TESSERA_GPU_UUID")]
    pub gpu_uuid: Option<String>,
    /// Namespace of the GPU start-up leases: the GPU pool's namespace, shared by every tenant of the GPU.
    #[arg(long, env = "TESSERA_GATE_NAMESPACE", default_value = "tessera-system")]
    pub gate_namespace: String,
    /// This pod's name (downward API), written as the lease holder `namespace/name`.
    #[arg(long, env = "POD_NAME", default_value = "")]
    pub pod_name: String,
    /// This pod's namespace (downward API).
    #[arg(long, env = "POD_NAMESPACE", default_value = "")]
    pub pod_namespace: String,
    /// Release the lease after this long even if vLLM never became ready, so a broken server cannot block the GPU.
    #[arg(long, env = "TESSERA_STARTUP_TIMEOUT", default_value = "20m", value_parser = humantime::parse_duration)]
    pub startup_timeout: Duration,
    /// Open the gate after waiting this long, whoever holds the lease: a co-tenant that keeps the GPU's lease
    /// (broken, or hostile: the name is derived from the GPU's UUID) cannot keep this pod's vLLM from starting.
    /// Keep it above --startup-timeout by the length of an honest queue of start-ups on one GPU.
    /// The webhook passes its own (45m) and sizes the injected sidecar's startup probe to it plus a slack, so the
    /// kubelet does not restart a sidecar inside its bound; set by hand, keep it below the startup probe's
    /// failureThreshold × periodSeconds.
    #[arg(long, env = "TESSERA_GATE_MAX_WAIT", default_value = "45m", value_parser = humantime::parse_duration)]
    pub gate_max_wait: Duration,
    /// A directory that outlives this container but not its pod (the webhook mounts an `emptyDir`): the time this
    /// pod began to wait for the GPU is kept there, so a restart of the sidecar (the startup probe gives up after
    /// its budget) goes on waiting from then, and --gate-max-wait bounds the pod's whole wait, not each try.
    #[arg(long, env = "TESSERA_GATE_STATE_DIR")]
    pub gate_state_dir: Option<std::path::PathBuf>,
    /// How long the lease lives without renewal: a holder killed with SIGKILL loses it after this long.
    #[arg(long, env = "TESSERA_GATE_LEASE_DURATION", default_value = "15s", value_parser = humantime::parse_duration)]
    pub gate_lease_duration: Duration,
    /// How often the lease is read, taken or renewed.
    #[arg(long, env = "TESSERA_GATE_RETRY_PERIOD", default_value = "2s", value_parser = humantime::parse_duration)]
    pub gate_retry_period: Duration,
    /// Fail open: if the Kubernetes API cannot be reached for this long, open the gate and let vLLM start.
    #[arg(long, env = "TESSERA_GATE_API_TIMEOUT", default_value = "2m", value_parser = humantime::parse_duration)]
    pub gate_api_timeout: Duration,
}

impl GateArgs {
    /// The lease name for this pod's GPU, or `None` when the pod does not share a GPU.
    pub fn lease_name(&self) -> Option<String> {
        self.gpu_uuid.as_deref().filter(|u| !u.is_empty()).map(lease_name)
    }

    /// The identity written as holder.
    pub fn identity(&self) -> String {
        format!("{}/{}", self.pod_namespace, self.pod_name)
    }
}

/// The GPU's start-up Lease name (shared with the autoscaler's GPU page, which shows its holder).
pub use tessera_core::gate::lease_name;

/// What `/startup` reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GateStatus {
    /// `waiting`, `holding` or `open`.
    pub state: &'static str,
    /// Why the gate is open (`not_shared`, `vllm_ready`, `startup_timeout`, `lease_lost`, `api_unavailable`,
    /// `wait_timeout`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    /// The lease this pod uses.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    /// Who holds the GPU's lease while we wait.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// Since when (Unix ms) we wait or hold.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since_unix_ms: Option<u64>,
}

impl GateStatus {
    /// Whether the startup probe passes.
    pub fn passes(&self) -> bool {
        self.state != "waiting"
    }

    fn of(phase: &Phase, lease: Option<&str>, holder: Option<&str>) -> GateStatus {
        let (state, reason, since) = match phase {
            Phase::Waiting { since_ms } => ("waiting", None, Some(*since_ms)),
            Phase::Holding { since_ms } => ("holding", None, Some(*since_ms)),
            Phase::Open(r) => ("open", Some(r.label()), None),
        };
        GateStatus {
            state,
            reason,
            lease: lease.map(str::to_owned),
            holder: holder.map(str::to_owned),
            since_unix_ms: since,
        }
    }
}

impl GateStatus {
    /// As the sidecar's `/v1/status` carries it (`startup_gate`); `None` for a pod that shares no GPU.
    pub fn wire(&self) -> Option<tessera_core::wire::sidecar::StartupGateStatus> {
        self.lease.as_ref()?;
        Some(tessera_core::wire::sidecar::StartupGateStatus {
            state: self.state.to_owned(),
            reason: self.reason.map(str::to_owned),
            holder: self.holder.clone(),
        })
    }

    /// Waiting for `lease` (before the first read).
    pub fn waiting(lease: Option<String>) -> GateStatus {
        GateStatus::of(&Phase::Waiting { since_ms: now_ms() }, lease.as_deref(), None)
    }

    /// Open because the API cannot be reached (fail open).
    pub fn api_unavailable(lease: Option<String>) -> GateStatus {
        GateStatus::of(&Phase::Open(OpenReason::ApiUnavailable), lease.as_deref(), None)
    }
}

/// The gate's current status, shared with the HTTP server.
pub type SharedGate = Arc<Mutex<GateStatus>>;

/// A gate that is open from the start (the pod does not share its GPU).
pub fn open_gate() -> SharedGate {
    Arc::new(Mutex::new(GateStatus::of(
        &Phase::Open(OpenReason::NotShared),
        None,
        None,
    )))
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Reads the waiters annotation, drops stale entries and `me`, and (when `add`) lists `me` since `since_ms`.
/// Returns the new JSON, or `None` when nothing changes.
fn waiters_with(lease: &Lease, me: &str, add: Option<u64>, now: u64) -> Option<String> {
    let raw = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(WAITING_ANNOTATION));
    let before = gate::waiters(raw.map(String::as_str));
    let mut after: BTreeMap<String, u64> = before
        .iter()
        .filter(|(pod, since)| pod.as_str() != me && now.saturating_sub(**since) < WAITER_TTL_MS)
        .map(|(p, s)| (p.clone(), *s))
        .collect();
    if let Some(since) = add {
        after.insert(me.to_owned(), since);
    }
    while after.len() > MAX_WAITERS {
        // Drop the oldest entry: the pods most likely gone.
        let oldest = after.iter().min_by_key(|(_, s)| **s).map(|(p, _)| p.clone());
        match oldest {
            Some(p) => after.remove(&p),
            None => break,
        };
    }
    (after != before).then(|| serde_json::to_string(&after).unwrap_or_else(|_| "{}".into()))
}

/// One write of the gate's lease. Returns `Ok(true)` when it landed, `Ok(false)` on a 409 (someone else wrote).
async fn write(
    api: &Api<Lease>,
    name: &str,
    current: Option<Lease>,
    action: &Action,
    me: &str,
    duration: Duration,
    now: u64,
) -> Result<bool, kube::Error> {
    let secs = i32::try_from(duration.as_secs().max(1)).unwrap_or(i32::MAX);
    let result = match (action, current) {
        (Action::Create, _) => {
            let lease = tessera_runtime::kube_client::new_lease(name, me, secs, now);
            api.create(&PostParams::default(), &lease).await
        }
        (Action::Acquire | Action::Renew, Some(mut lease)) => {
            if let Some(w) = waiters_with(&lease, me, None, now) {
                lease
                    .metadata
                    .annotations
                    .get_or_insert_default()
                    .insert(WAITING_ANNOTATION.into(), w);
            }
            // Acquire finds another holder (or none), Renew finds us: the helper tells them apart the same way.
            hold_lease(&mut lease, me, secs, now);
            api.replace(name, &PostParams::default(), &lease).await
        }
        (Action::Release(_), Some(mut lease)) => {
            // Cleared holder + 1 s duration: the next pod takes it at its next read, not after the full duration.
            if !give_up_lease(&mut lease, me) {
                return Ok(true);
            }
            api.replace(name, &PostParams::default(), &lease).await
        }
        (Action::Wait { .. }, Some(mut lease)) => {
            let Some(w) = waiters_with(&lease, me, Some(now), now).filter(|_| {
                // Only add ourselves once; an existing entry keeps its original time.
                !lease
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(WAITING_ANNOTATION))
                    .is_some_and(|r| r.contains(&format!("\"{me}\"")))
            }) else {
                return Ok(true);
            };
            lease
                .metadata
                .annotations
                .get_or_insert_default()
                .insert(WAITING_ANNOTATION.into(), w);
            api.replace(name, &PostParams::default(), &lease).await
        }
        _ => return Ok(true),
    };
    match result {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether vLLM answers `/health` (within a short timeout).
async fn vllm_healthy(http: &reqwest::Client, url: &str) -> bool {
    matches!(http.get(url).send().await, Ok(r) if r.status().is_success())
}

/// Runs the gate until it opens for good (then returns, the status staying open) or `shutdown` fires (then a held
/// lease is released so the next pod starts at once — a pod deleted while loading does not block its GPU).
pub async fn run(
    api: Api<Lease>,
    args: GateArgs,
    vllm_health_url: String,
    status: SharedGate,
    shutdown: CancellationToken,
) {
    let Some(name) = args.lease_name() else {
        set(
            &status,
            GateStatus::of(&Phase::Open(OpenReason::NotShared), None, None),
        );
        return;
    };
    let me = args.identity();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap_or_default();
    let mut phase = Phase::Waiting {
        since_ms: wait_started(args.gate_state_dir.as_deref(), now_ms()),
    };
    let mut observed: Option<LeaseObservation> = None;
    let mut last_api_ok = now_ms();
    let mut last_holder: Option<String> = None;
    set(&status, GateStatus::of(&phase, Some(&name), None));
    info!(lease = %name, namespace = %args.gate_namespace, identity = %me, "start-up gate: waiting for the GPU's lease");
    loop {
        let now = now_ms();
        let read = tokio::time::timeout(
            args.gate_retry_period.max(Duration::from_secs(1)) * 2,
            api.get_opt(&name),
        )
        .await;
        let current = match read {
            Ok(Ok(lease)) => {
                last_api_ok = now;
                lease
            }
            Ok(Err(e)) => {
                warn!(error = %e, lease = %name, "start-up gate: cannot read the lease");
                if fail_open(&status, &name, now, last_api_ok, args.gate_api_timeout) {
                    return;
                }
                if sleep_or_stop(args.gate_retry_period, &shutdown).await {
                    release_on_stop(&api, &name, &phase, &me, args.gate_lease_duration).await;
                    return;
                }
                continue;
            }
            Err(_) => {
                warn!(lease = %name, "start-up gate: the API did not answer in time");
                if fail_open(&status, &name, now, last_api_ok, args.gate_api_timeout) {
                    return;
                }
                continue;
            }
        };
        observed = current.as_ref().map(|l| {
            let (holder, duration, rv) = lease_facts(l, args.gate_lease_duration);
            LeaseObservation::observe(observed.as_ref(), holder, duration, rv, now)
        });
        let ready = matches!(phase, Phase::Holding { .. }) && vllm_healthy(&http, &vllm_health_url).await;
        let limits = gate::Limits {
            startup_timeout: args.startup_timeout,
            max_wait: args.gate_max_wait,
        };
        let action = gate::step(&phase, observed.as_ref(), &me, ready, now, limits);
        if action == Action::Release(OpenReason::WaitTimeout) {
            warn!(lease = %name, holder = ?observed.as_ref().and_then(|o| o.holder.clone()),
                  waited = %humantime::format_duration(args.gate_max_wait),
                  "start-up gate: the GPU's lease was held past --gate-max-wait; opening the gate (fail open)");
        }
        let holder = match &action {
            Action::Wait { holder, .. } | Action::Lost { holder } => Some(holder.clone()),
            // Kept once open by the bound: `/v1/status` names who held the GPU too long (the controller's Event).
            Action::Release(OpenReason::WaitTimeout) => observed.as_ref().and_then(|o| o.holder.clone()),
            _ => None,
        };
        if holder != last_holder {
            if let Some(h) = &holder {
                info!(lease = %name, holder = %h, "start-up gate: another pod is starting on this GPU; waiting");
            }
            last_holder = holder.clone();
        }
        match write(&api, &name, current, &action, &me, args.gate_lease_duration, now).await {
            Ok(true) => {
                let next = gate::after(&phase, &action, now);
                if next != phase {
                    match &next {
                        Phase::Holding { .. } => {
                            info!(lease = %name, "start-up gate: holding the GPU's lease; vLLM may start")
                        }
                        Phase::Open(r) => {
                            info!(lease = %name, reason = r.label(), "start-up gate: released the GPU's lease")
                        }
                        Phase::Waiting { .. } => {}
                    }
                }
                phase = next;
            }
            Ok(false) => {} // Lost a race: read again next round.
            Err(e) => warn!(error = %e, lease = %name, "start-up gate: lease write failed"),
        }
        set(&status, GateStatus::of(&phase, Some(&name), holder.as_deref()));
        if matches!(phase, Phase::Open(_)) {
            // The start-up is over: a later restart of this sidecar waits afresh, as a new start-up would.
            forget_wait(args.gate_state_dir.as_deref());
            return;
        }
        if sleep_or_stop(args.gate_retry_period, &shutdown).await {
            release_on_stop(&api, &name, &phase, &me, args.gate_lease_duration).await;
            return;
        }
    }
}

/// The file in `--gate-state-dir` holding when this pod began to wait (Unix ms).
const WAIT_FILE: &str = "waiting-since-ms";

/// When this pod began to wait for its GPU: the time kept in `dir` by an earlier run of this sidecar in the
/// same pod, or `now` (then kept there). A time in the future (a clock step back) or an unreadable file counts as
/// none. Without `dir` (or where it cannot be written) each run waits from its own start, and says so.
pub fn wait_started(dir: Option<&std::path::Path>, now: u64) -> u64 {
    let Some(dir) = dir else { return now };
    let path = dir.join(WAIT_FILE);
    let kept = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
        .filter(|since| *since <= now);
    if let Some(since) = kept {
        info!(
            waited_ms = now - since,
            "start-up gate: resuming this pod's wait for the GPU (the sidecar restarted)"
        );
        return since;
    }
    if let Err(e) = std::fs::write(&path, now.to_string()) {
        warn!(error = %e, path = %path.display(),
            "start-up gate: cannot keep the wait's start; a restart of this sidecar would wait afresh");
    }
    now
}

/// Forgets the kept start of the wait (the gate is open).
pub fn forget_wait(dir: Option<&std::path::Path>) {
    if let Some(dir) = dir {
        let _ = std::fs::remove_file(dir.join(WAIT_FILE));
    }
}

fn set(status: &SharedGate, s: GateStatus) {
    if let Ok(mut g) = status.lock() {
        *g = s;
    }
}

fn fail_open(status: &SharedGate, name: &str, now: u64, last_ok: u64, limit: Duration) -> bool {
    if now.saturating_sub(last_ok) < u64::try_from(limit.as_millis()).unwrap_or(u64::MAX) {
        return false;
    }
    warn!(lease = %name, "start-up gate: the Kubernetes API has been unreachable too long; opening the gate (fail open)");
    set(
        status,
        GateStatus::of(&Phase::Open(OpenReason::ApiUnavailable), Some(name), None),
    );
    true
}

/// Sleeps `d`; true when `shutdown` fired first.
async fn sleep_or_stop(d: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = shutdown.cancelled() => true,
    }
}

async fn release_on_stop(api: &Api<Lease>, name: &str, phase: &Phase, me: &str, duration: Duration) {
    if !matches!(phase, Phase::Holding { .. }) {
        return;
    }
    let now = now_ms();
    let current = match tokio::time::timeout(Duration::from_secs(2), api.get_opt(name)).await {
        Ok(Ok(l)) => l,
        _ => return,
    };
    let action = Action::Release(OpenReason::VllmReady);
    match tokio::time::timeout(
        Duration::from_secs(2),
        write(api, name, current, &action, me, duration, now),
    )
    .await
    {
        Ok(Ok(_)) => info!(lease = %name, "start-up gate: released the GPU's lease on shutdown"),
        _ => {
            warn!(lease = %name, "start-up gate: could not release the lease on shutdown; it expires by itself")
        }
    }
}

#[cfg(test)]
mod tests;
