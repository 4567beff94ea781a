//! The gpu-agent: per-pod GPU memory and SM use from NVML, run in capacity pods with `hostPID: true`.
//!
//! NVML lists the processes on each GPU by *host* PID (`running_compute_processes`, with their memory) and
//! samples each one's SM use (`process_utilization_stats`). A model pod cannot see host PIDs, which is why this
//! runs in the capacity pod that holds the GPU: it reads `/proc/<pid>/cgroup` for each PID, where the kubelet's
//! cgroup path carries the pod UID ([`pod_from_cgroup`], pure and tested on both cgroup v1 and v2 layouts and
//! both cgroup drivers), and serves the per-pod totals on `/metrics` and `/v1/gpus`
//! ([`tessera_core::wire::sidecar::GpuAgentStatus`]).
//!
//! The parts: `cgroup` (PID → pod, pure), `probe` (NVML per process behind [`ProcessProbe`], and the per-pod
//! totals), `publish` (the UUID label), and this file (the registry, the HTTP server and the loops).
//!
//! NVML sits behind [`ProcessProbe`] so tests use [`FakeProcessProbe`]. Without NVML the agent still serves,
//! reports `tessera_gpu_agent_nvml_up 0`, answers `/ready` with 503, and retries NVML once a minute.
//!
//! It also publishes its GPU's UUID on its own pod as `tessera.dev/gpu-uuid` ([`publish`]): the UUID comes
//! from the same NVML readings (the device `NVIDIA_VISIBLE_DEVICES` names, see [`publish::select_gpu_uuid`]),
//! and a separate task writes it with retries and re-checks it every `--uuid-recheck`. `/ready` answers 200
//! only once the UUID is published (or, in a local run without pod identity, known): a capacity pod whose GPU
//! is unidentified is not ready, and the pool manager does not place new tenants on it either.

mod cgroup;
mod probe;
pub mod publish;

pub use cgroup::{PodRef, pod_from_cgroup, pod_from_cgroup_path, pod_of_pid};
pub use probe::{DeviceReading, FakeProcessProbe, NvmlProcessProbe, ProcessProbe, ProcessUse, per_pod};

use crate::error::GpuError;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use publish::{Backoff, UuidPublisher};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tessera_core::wire::sidecar::{GpuAgentStatus, SCHEMA_VERSION};
use tessera_runtime::metrics::register;
use tokio_util::sync::CancellationToken;

/// `tessera gpu-agent` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Address to serve /metrics, /v1/gpus, /live and /ready on.
    #[arg(long, env = "TESSERA_LISTEN", default_value = "0.0.0.0:9091")]
    pub listen: std::net::SocketAddr,
    /// Client connection bounds (`--header-read-timeout`, `--client-idle-timeout`): a silent, trickling or idle
    /// connection is closed.
    #[command(flatten)]
    pub conn: tessera_runtime::serve::ConnArgs,
    /// How often to read NVML.
    #[arg(long, env = "TESSERA_INTERVAL", default_value = "5s", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// Where the host's /proc is (the pod needs hostPID: true; or mount the host's /proc and point here).
    #[arg(long, env = "TESSERA_PROC_ROOT", default_value = "/proc")]
    pub proc_root: PathBuf,
    /// This pod's name, to publish the GPU UUID on it (default: the downward API's POD_NAME). Without a pod
    /// name and namespace nothing is published (a local run).
    #[arg(long, env = "TESSERA_POD_NAME")]
    pub pod_name: Option<String>,
    /// This pod's namespace (default: the downward API's POD_NAMESPACE).
    #[arg(long, env = "TESSERA_POD_NAMESPACE")]
    pub pod_namespace: Option<String>,
    /// How often to re-read the pod and re-publish the GPU UUID if the annotation was removed or changed.
    #[arg(long, env = "TESSERA_UUID_RECHECK", default_value = "10m", value_parser = humantime::parse_duration)]
    pub uuid_recheck: Duration,
    /// First delay after a failed publish; it doubles per failure up to one minute.
    #[arg(long, env = "TESSERA_UUID_RETRY", default_value = "1s", value_parser = humantime::parse_duration)]
    pub uuid_retry: Duration,
    /// Graceful shutdown (`--drain-period`).
    #[command(flatten)]
    pub drain: tessera_runtime::DrainArgs,
}

// ---------------------------------------------------------------------------------------------------------
// Serving.

type Labels = Vec<(&'static str, String)>;
type FGauge = Gauge<f64, AtomicU64>;

/// The agent's registry.
#[derive(Debug)]
struct AgentMetrics {
    registry: Registry,
    nvml_up: FGauge,
    uuid_published: FGauge,
    total: Family<Labels, FGauge>,
    used: Family<Labels, FGauge>,
    pod_mem: Family<Labels, FGauge>,
    pod_sm: Family<Labels, FGauge>,
}

impl AgentMetrics {
    fn new() -> Self {
        let mut registry = Registry::default();
        let nvml_up = register(
            &mut registry,
            "tessera_gpu_agent_nvml_up",
            "1 when the last NVML reading succeeded",
        );
        let uuid_published = register(
            &mut registry,
            "tessera_gpu_agent_uuid_published",
            "1 when this pod's GPU UUID is known and published on it (or known, where no pod identity was given)",
        );
        let total = register(
            &mut registry,
            "tessera_gpu_memory_total_bytes",
            "GPU total memory",
        );
        let used = register(
            &mut registry,
            "tessera_gpu_memory_used_bytes",
            "GPU used memory (whole device)",
        );
        let pod_mem = register(
            &mut registry,
            "tessera_gpu_pod_memory_bytes",
            "GPU memory used by a pod's processes (pod_uid empty: host processes)",
        );
        let pod_sm = register(
            &mut registry,
            "tessera_gpu_pod_sm_utilization_ratio",
            "SM utilization of a pod's processes over NVML's last sample period, 0-1",
        );
        Self {
            registry,
            nvml_up,
            uuid_published,
            total,
            used,
            pod_mem,
            pod_sm,
        }
    }

    fn update(&self, status: &GpuAgentStatus) {
        self.nvml_up.set(if status.nvml_up { 1.0 } else { 0.0 });
        for f in [&self.total, &self.used, &self.pod_mem, &self.pod_sm] {
            f.clear();
        }
        for d in &status.devices {
            let gpu = vec![("gpu_uuid", d.uuid.clone())];
            self.total.get_or_create(&gpu).set(d.total_bytes as f64);
            self.used.get_or_create(&gpu).set(d.used_bytes as f64);
            for p in d.pods.iter().chain(d.unattributed.iter()) {
                let l = vec![("gpu_uuid", d.uuid.clone()), ("pod_uid", p.pod_uid.clone())];
                if let Some(m) = p.memory_bytes {
                    self.pod_mem.get_or_create(&l).set(m as f64);
                }
                if let Some(u) = p.sm_utilization {
                    self.pod_sm.get_or_create(&l).set(u);
                }
            }
        }
    }
}

/// Where this pod's GPU UUID stands; `/ready` and `tessera_gpu_agent_uuid_published` report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UuidState {
    /// Not known yet: why (no NVML, no reading yet, several GPUs visible, …).
    Unknown(String),
    /// Known, and no pod identity was given (a local run): nothing to publish, so this counts as done.
    Local(String),
    /// Known and being published; the last failure, if any.
    Publishing {
        /// The UUID.
        uuid: String,
        /// The last attempt's error.
        error: Option<String>,
    },
    /// Known and on the pod as `tessera.dev/gpu-uuid`.
    Published(String),
}

impl UuidState {
    /// Whether the GPU is identified as far as the pool manager is concerned.
    pub fn is_done(&self) -> bool {
        matches!(self, Self::Local(_) | Self::Published(_))
    }
}

#[derive(Debug)]
struct AgentShared {
    status: Mutex<GpuAgentStatus>,
    uuid: Mutex<UuidState>,
    metrics: AgentMetrics,
}

impl AgentShared {
    fn new() -> Self {
        Self {
            status: Mutex::new(GpuAgentStatus {
                schema_version: SCHEMA_VERSION,
                generated_at: crate::unix_now(),
                nvml_up: false,
                error: Some("no reading yet".into()),
                read_at: None,
                devices: Vec::new(),
            }),
            uuid: Mutex::new(UuidState::Unknown("no NVML reading yet".into())),
            metrics: AgentMetrics::new(),
        }
    }

    fn set_uuid(&self, next: UuidState) {
        self.metrics
            .uuid_published
            .set(if next.is_done() { 1.0 } else { 0.0 });
        if let Ok(mut u) = self.uuid.lock() {
            *u = next;
        }
    }

    fn uuid(&self) -> UuidState {
        self.uuid
            .lock()
            .map(|u| u.clone())
            .unwrap_or_else(|_| UuidState::Unknown("state lock poisoned".into()))
    }
}

/// `/ready`'s answer: ready only when NVML answers *and* the GPU UUID is published (or known, in a local run).
/// A capacity pod whose GPU cannot be identified must not look usable: the webhook needs the UUID to point a
/// tenant at the device, and the pool manager does not place new tenants on such a pod.
fn readiness(nvml_up: bool, nvml_error: Option<&str>, uuid: &UuidState) -> (StatusCode, String) {
    if !nvml_up {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("NVML not up: {}; GPU UUID unknown\n", nvml_error.unwrap_or("")),
        );
    }
    match uuid {
        UuidState::Published(u) => (StatusCode::OK, format!("ready: GPU UUID {u} published\n")),
        UuidState::Local(u) => (
            StatusCode::OK,
            format!("ready: GPU UUID {u} (no pod identity: not published)\n"),
        ),
        UuidState::Unknown(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("GPU UUID unknown: {why}\n"),
        ),
        UuidState::Publishing { uuid, error } => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "GPU UUID {uuid} not published yet: {}\n",
                error.as_deref().unwrap_or("first attempt in flight")
            ),
        ),
    }
}

fn agent_router(shared: Arc<AgentShared>) -> Router {
    Router::new()
        .route("/metrics", get(agent_metrics))
        .route("/v1/gpus", get(agent_status))
        .route("/live", get(|| async { "ok\n" }))
        .route("/ready", get(agent_ready))
        .with_state(shared)
}

async fn agent_metrics(State(s): State<Arc<AgentShared>>) -> Response {
    let mut out = String::new();
    match encode(&mut out, &s.metrics.registry) {
        Ok(()) => tessera_runtime::serve::openmetrics(out),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics\n").into_response(),
    }
}

async fn agent_status(State(s): State<Arc<AgentShared>>) -> Response {
    match s.status.lock() {
        Ok(st) => {
            let mut doc = st.clone();
            doc.generated_at = crate::unix_now();
            axum::Json(doc).into_response()
        }
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "state lock poisoned\n").into_response(),
    }
}

async fn agent_ready(State(s): State<Arc<AgentShared>>) -> Response {
    let uuid = s.uuid();
    match s.status.lock() {
        Ok(st) => readiness(st.nvml_up, st.error.as_deref(), &uuid).into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "state lock poisoned\n").into_response(),
    }
}

/// One reading: probe, resolve PIDs, new status.
fn reading(
    probe: Option<&dyn ProcessProbe>,
    proc_root: &Path,
    now: f64,
    prev: &GpuAgentStatus,
) -> GpuAgentStatus {
    let Some(probe) = probe else {
        // The caller already put NVML's initialisation error in `prev.error`.
        return GpuAgentStatus {
            nvml_up: false,
            generated_at: now,
            ..prev.clone()
        };
    };
    let result = probe.read();
    match result {
        Ok(devices) => GpuAgentStatus {
            schema_version: SCHEMA_VERSION,
            generated_at: now,
            nvml_up: true,
            error: None,
            read_at: Some(now),
            devices: per_pod(&devices, |pid| pod_of_pid(proc_root, pid)),
        },
        // Keep the last devices (with their read_at) so a reader sees how old they are.
        Err(e) => GpuAgentStatus {
            nvml_up: false,
            error: Some(e.to_string()),
            generated_at: now,
            ..prev.clone()
        },
    }
}

/// Runs the gpu-agent until SIGTERM or SIGINT.
pub async fn run(args: Args) -> anyhow::Result<()> {
    if args.interval.is_zero() {
        anyhow::bail!("--interval must be above 0");
    }
    if args.uuid_recheck.is_zero() || args.uuid_retry.is_zero() {
        anyhow::bail!("--uuid-recheck and --uuid-retry must be above 0 (e.g. 10m and 1s)");
    }
    let shared = Arc::new(AgentShared::new());
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| anyhow::anyhow!("binding --listen {}: {e}", args.listen))?;
    tracing::info!(listen = %listener.local_addr()?, "tessera gpu-agent serving");
    let graceful = tessera_runtime::Graceful::on_signals(args.drain.drain_period);
    let shutdown = graceful.stop_token();
    let (uuid_tx, uuid_rx) = tokio::sync::watch::channel(None);
    let identity = publish::pod_identity(args.pod_name.as_deref(), args.pod_namespace.as_deref(), |k| {
        std::env::var(k).ok()
    });
    let publisher = match identity {
        None => {
            tracing::info!(
                "no pod identity (POD_NAME/POD_NAMESPACE or --pod-name/--pod-namespace): the GPU UUID will not be published"
            );
            None
        }
        Some(pod) => match tessera_runtime::kube_client::client().await {
            Ok(client) => Some(UuidPublisher::new(
                client,
                pod,
                Backoff {
                    initial: args.uuid_retry,
                    max: Duration::from_secs(60).max(args.uuid_retry),
                },
            )),
            Err(e) => {
                // The pod stays not-ready (UUID unknown to the cluster) and says why; restarting is the fix.
                tracing::error!(error = %e, pod = %pod.name, "no Kubernetes client: cannot publish the GPU UUID");
                shared.set_uuid(UuidState::Unknown(format!(
                    "no Kubernetes client to publish it: {e}"
                )));
                None
            }
        },
    };
    let publishing = publisher.is_some();
    let mut tasks = tokio::task::JoinSet::new();
    let loop_cfg = LoopConfig {
        interval: args.interval,
        proc_root: args.proc_root.clone(),
        visible_devices: std::env::var("NVIDIA_VISIBLE_DEVICES").ok(),
        publishing,
    };
    tasks.spawn(agent_loop(
        loop_cfg,
        || NvmlProcessProbe::new().map(|p| Box::new(p) as Box<dyn ProcessProbe>),
        shared.clone(),
        uuid_tx,
        shutdown.clone(),
    ));
    if let Some(publisher) = publisher {
        tasks.spawn(publish_loop(
            publisher,
            uuid_rx,
            args.uuid_recheck,
            shared.clone(),
            shutdown.clone(),
        ));
    }
    tessera_runtime::serve::serve(
        listener,
        graceful.ready_gate(agent_router(shared)),
        args.conn.limits(),
        shutdown.clone().cancelled_owned(),
    )
    .await;
    shutdown.cancel();
    while let Some(r) = tasks.join_next().await {
        r?;
    }
    tracing::info!("tessera gpu-agent stopped");
    Ok(())
}

/// What the reading loop needs besides the probe.
#[derive(Debug, Clone)]
struct LoopConfig {
    interval: Duration,
    proc_root: PathBuf,
    /// `NVIDIA_VISIBLE_DEVICES` as the container sees it.
    visible_devices: Option<String>,
    /// Whether a publisher task takes the UUID (else a known UUID is final: [`UuidState::Local`]).
    publishing: bool,
}

/// Reads NVML every `interval` (initialising it through `init`, retried once a minute), updates the status,
/// and sends this pod's GPU UUID to the publisher whenever it is known.
async fn agent_loop<F>(
    cfg: LoopConfig,
    init: F,
    shared: Arc<AgentShared>,
    uuid_tx: tokio::sync::watch::Sender<Option<String>>,
    shutdown: CancellationToken,
) where
    F: Fn() -> Result<Box<dyn ProcessProbe>, GpuError>,
{
    let mut probe: Option<Box<dyn ProcessProbe>> = None;
    let mut next_init = tokio::time::Instant::now();
    let mut warned = false;
    let mut last_uuid_error: Option<String> = None;
    let mut ticker = tokio::time::interval(cfg.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let mut init_error = None;
        if probe.is_none() && tokio::time::Instant::now() >= next_init {
            next_init = tokio::time::Instant::now() + Duration::from_secs(60);
            match init() {
                Ok(p) => {
                    tracing::info!("NVML initialised");
                    probe = Some(p);
                }
                Err(e) => {
                    if !warned {
                        tracing::warn!(error = %e, "no NVML: serving without GPU data, retrying once a minute");
                        warned = true;
                    }
                    init_error = Some(e.to_string());
                }
            }
        }
        let status = {
            let Ok(mut status) = shared.status.lock() else {
                return;
            };
            if let Some(e) = init_error {
                status.error = Some(e);
            }
            let next = reading(probe.as_deref(), &cfg.proc_root, crate::unix_now(), &status);
            *status = next;
            shared.metrics.update(&status);
            status.clone()
        };
        // The UUID only changes with a successful reading; an NVML error keeps the last one.
        if !status.nvml_up {
            if !shared.uuid().is_done() && status.read_at.is_none() {
                shared.set_uuid(UuidState::Unknown(
                    status.error.clone().unwrap_or_else(|| "NVML not up".into()),
                ));
            }
            continue;
        }
        let listed: Vec<String> = status.devices.iter().map(|d| d.uuid.clone()).collect();
        match publish::select_gpu_uuid(cfg.visible_devices.as_deref(), &listed) {
            Ok(uuid) => {
                last_uuid_error = None;
                let changed = uuid_tx.send_if_modified(|cur| {
                    let differs = cur.as_deref() != Some(uuid.as_str());
                    if differs {
                        *cur = Some(uuid.clone());
                    }
                    differs
                });
                if changed {
                    tracing::info!(%uuid, "GPU UUID identified");
                    shared.set_uuid(if cfg.publishing {
                        UuidState::Publishing { uuid, error: None }
                    } else {
                        UuidState::Local(uuid)
                    });
                }
            }
            Err(e) => {
                let text = e.to_string();
                if last_uuid_error.as_deref() != Some(text.as_str()) {
                    tracing::error!(error = %text, "cannot tell which GPU is this pod's; not publishing a UUID");
                    last_uuid_error = Some(text.clone());
                }
                uuid_tx.send_if_modified(|cur| cur.take().is_some());
                shared.set_uuid(UuidState::Unknown(text));
            }
        }
    }
}

/// Publishes each UUID the reading loop sends, with retries, then re-checks every `recheck` (the annotation
/// may be removed by hand, or the pod recreated under the same name) and whenever the UUID changes.
async fn publish_loop(
    publisher: UuidPublisher,
    mut uuid_rx: tokio::sync::watch::Receiver<Option<String>>,
    recheck: Duration,
    shared: Arc<AgentShared>,
    shutdown: CancellationToken,
) {
    loop {
        let current = uuid_rx.borrow_and_update().clone();
        if let Some(uuid) = current {
            let on_failure = |e: &publish::PublishError| {
                shared.set_uuid(UuidState::Publishing {
                    uuid: uuid.clone(),
                    error: Some(e.to_string()),
                });
            };
            match publisher.ensure(&uuid, &shutdown, on_failure).await {
                // Only if the UUID was not replaced meanwhile (the reading loop owns the other states).
                Some(_) if uuid_rx.borrow().as_deref() == Some(uuid.as_str()) => {
                    shared.set_uuid(UuidState::Published(uuid));
                }
                Some(_) => {}
                None => return,
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            r = uuid_rx.changed() => if r.is_err() { return },
            () = tokio::time::sleep(recheck) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const UID: &str = "0f3c6a0e-5b7d-4c2f-9c1e-2a3b4c5d6e7f";
    const CID: &str = "8c2f4e6a1b3d5f7091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708";

    #[test]
    fn cgroup_v2_systemd_containerd() {
        let content = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{CID}.scope\n",
            UID.replace('-', "_")
        );
        let p = pod_from_cgroup(&content).unwrap();
        assert_eq!(
            p,
            PodRef {
                uid: UID.into(),
                qos: "burstable",
                container_id: Some(CID.into())
            }
        );
    }

    #[test]
    fn cgroup_v2_guaranteed_systemd_crio() {
        let content = format!(
            "0::/kubepods.slice/kubepods-pod{}.slice/crio-{CID}.scope",
            UID.replace('-', "_")
        );
        let p = pod_from_cgroup(&content).unwrap();
        assert_eq!(
            (p.uid.as_str(), p.qos, p.container_id.as_deref()),
            (UID, "guaranteed", Some(CID))
        );
        // CRI-O's conmon runs in the pod but is not a container.
        let conmon = format!(
            "0::/kubepods.slice/kubepods-pod{}.slice/crio-conmon-{CID}.scope",
            UID.replace('-', "_")
        );
        assert_eq!(pod_from_cgroup(&conmon).unwrap().container_id, None);
    }

    #[test]
    fn cgroup_v1_cgroupfs_docker_lines() {
        let content = format!(
            "12:hugetlb:/kubepods/besteffort/pod{UID}/{CID}\n\
             11:memory:/kubepods/besteffort/pod{UID}/{CID}\n\
             1:name=systemd:/kubepods/besteffort/pod{UID}/{CID}\n"
        );
        let p = pod_from_cgroup(&content).unwrap();
        assert_eq!(
            p,
            PodRef {
                uid: UID.into(),
                qos: "besteffort",
                container_id: Some(CID.into())
            }
        );
        let guaranteed = format!("4:cpu,cpuacct:/kubepods/pod{UID}/{CID}");
        assert_eq!(pod_from_cgroup(&guaranteed).unwrap().qos, "guaranteed");
    }

    #[test]
    fn cgroup_v1_systemd_docker_and_nested_kind_node() {
        let v1 = format!(
            "9:devices:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/docker-{CID}.scope",
            UID.replace('-', "_")
        );
        assert_eq!(pod_from_cgroup(&v1).unwrap().container_id.as_deref(), Some(CID));
        // A kind node: the node container's own cgroup prefixes the kubelet's hierarchy.
        let kind = format!(
            "0::/system.slice/docker-{CID}.scope/kubelet.slice/kubelet-kubepods.slice/\
             kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod{}.slice/cri-containerd-{CID}.scope",
            UID.replace('-', "_")
        );
        let p = pod_from_cgroup(&kind).unwrap();
        assert_eq!((p.uid.as_str(), p.qos), (UID, "burstable"));
        // A static pod: the UID is the config hash.
        let hash = "6b7bd3b4c2f1e0a9d8c7b6a5f4e3d2c1";
        let p = pod_from_cgroup(&format!("0::/kubepods/burstable/pod{hash}/{CID}")).unwrap();
        assert_eq!(p.uid, hash);
    }

    #[test]
    fn processes_outside_pods_are_none() {
        for c in [
            "0::/system.slice/nvidia-persistenced.service",
            "0::/user.slice/user-1000.slice/session-3.scope",
            "0::/",
            "0::/kubepods.slice/kubepods-burstable.slice", // a QoS slice, no pod
            "0::/kubepods/burstable/podnot-a-uid/abc",
            "",
            "garbage without colons",
        ] {
            assert_eq!(pod_from_cgroup(c), None, "{c}");
        }
    }

    #[test]
    fn per_pod_sums_processes_and_keeps_host_apart() {
        let devices = vec![DeviceReading {
            index: 0,
            uuid: "GPU-1".into(),
            total_bytes: 80 << 30,
            used_bytes: 50 << 30,
            processes: vec![
                ProcessUse {
                    pid: 200,
                    used_bytes: Some(20 << 30),
                    sm_utilization: Some(0.3),
                },
                ProcessUse {
                    pid: 100,
                    used_bytes: Some(10 << 30),
                    sm_utilization: Some(0.1),
                },
                ProcessUse {
                    pid: 300,
                    used_bytes: None,
                    sm_utilization: None,
                },
                ProcessUse {
                    pid: 400,
                    used_bytes: Some(1 << 30),
                    sm_utilization: Some(0.0),
                },
            ],
        }];
        let other = "11111111-2222-3333-4444-555555555555";
        let resolve = |pid: u32| match pid {
            100 | 200 => Some(PodRef {
                uid: UID.into(),
                qos: "burstable",
                container_id: Some(CID.into()),
            }),
            300 => Some(PodRef {
                uid: other.into(),
                qos: "guaranteed",
                container_id: None,
            }),
            _ => None,
        };
        let d = &per_pod(&devices, resolve)[0];
        assert_eq!(d.pods.len(), 2);
        assert_eq!(d.pods[0].pod_uid, UID);
        assert_eq!(d.pods[0].pids, vec![100, 200]);
        assert_eq!(d.pods[0].memory_bytes, Some(30 << 30));
        assert!((d.pods[0].sm_utilization.unwrap() - 0.4).abs() < 1e-9);
        assert_eq!(d.pods[0].container_ids, vec![CID.to_string()]);
        assert_eq!(
            (d.pods[1].memory_bytes, d.pods[1].sm_utilization),
            (None, None),
            "unknown stays unknown"
        );
        let host = d.unattributed.as_ref().unwrap();
        assert_eq!((host.pids.clone(), host.memory_bytes), (vec![400], Some(1 << 30)));
    }

    #[test]
    fn reading_resolves_pids_through_proc_and_keeps_last_devices_on_error() {
        let dir = tempfile::tempdir().unwrap();
        let pid_dir = dir.path().join("4242");
        std::fs::create_dir_all(&pid_dir).unwrap();
        std::fs::write(
            pid_dir.join("cgroup"),
            format!("0::/kubepods/burstable/pod{UID}/{CID}\n"),
        )
        .unwrap();
        let probe = FakeProcessProbe {
            readings: Mutex::new(Some(vec![DeviceReading {
                index: 0,
                uuid: "GPU-abc".into(),
                total_bytes: 100,
                used_bytes: 60,
                processes: vec![
                    ProcessUse {
                        pid: 4242,
                        used_bytes: Some(40),
                        sm_utilization: Some(0.25),
                    },
                    ProcessUse {
                        pid: 9999,
                        used_bytes: Some(5),
                        sm_utilization: None,
                    }, // exited: no /proc entry
                ],
            }])),
        };
        let empty = GpuAgentStatus {
            schema_version: SCHEMA_VERSION,
            generated_at: 0.0,
            nvml_up: false,
            error: None,
            read_at: None,
            devices: vec![],
        };
        let s = reading(Some(&probe), dir.path(), 10.0, &empty);
        assert!(s.nvml_up);
        assert_eq!(s.devices[0].pods[0].pod_uid, UID);
        assert_eq!(s.devices[0].pods[0].memory_bytes, Some(40));
        assert_eq!(s.devices[0].unattributed.as_ref().unwrap().pids, vec![9999]);
        let m = AgentMetrics::new();
        m.update(&s);
        let mut text = String::new();
        encode(&mut text, &m.registry).unwrap();
        assert!(text.contains(&format!(
            "tessera_gpu_pod_memory_bytes{{gpu_uuid=\"GPU-abc\",pod_uid=\"{UID}\"}} 40.0"
        )));
        assert!(text.contains("tessera_gpu_agent_nvml_up 1.0"));

        *probe.readings.lock().unwrap() = None;
        let s2 = reading(Some(&probe), dir.path(), 20.0, &s);
        assert!(!s2.nvml_up && s2.error.is_some());
        assert_eq!((s2.read_at, s2.devices.clone()), (Some(10.0), s.devices.clone()));
    }

    /// The reading loop with a fake NVML probe feeds the publisher, which patches the pod through the mock
    /// API; `/ready` turns 200 only once the patch has landed.
    #[tokio::test(start_paused = true)]
    async fn a_fake_nvml_uuid_is_published_and_then_the_agent_is_ready() {
        use http::{Request, Response};
        use kube::client::Body;
        use publish::PodIdentity;
        const GPU: &str = "GPU-2f8e1c3a-7b5d-4e6f-8a9b-0c1d2e3f4a5b";
        let dir = tempfile::tempdir().unwrap();
        let shared = Arc::new(AgentShared::new());
        let (tx, rx) = tokio::sync::watch::channel(None);
        let shutdown = CancellationToken::new();
        let cfg = LoopConfig {
            interval: Duration::from_secs(5),
            proc_root: dir.path().to_path_buf(),
            visible_devices: Some(GPU.into()),
            publishing: true,
        };
        let init = || {
            Ok(Box::new(FakeProcessProbe {
                readings: Mutex::new(Some(vec![DeviceReading {
                    index: 0,
                    uuid: GPU.into(),
                    total_bytes: 80 << 30,
                    used_bytes: 0,
                    processes: vec![],
                }])),
            }) as Box<dyn ProcessProbe>)
        };
        let readings = tokio::spawn(agent_loop(cfg, init, shared.clone(), tx, shutdown.clone()));
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let publisher = UuidPublisher::new(
            kube::Client::new(svc, "default"),
            PodIdentity {
                namespace: "ns".into(),
                name: "cap-0".into(),
            },
            Backoff::default(),
        );
        let publishing = tokio::spawn(publish_loop(
            publisher,
            rx,
            Duration::from_secs(600),
            shared.clone(),
            shutdown.clone(),
        ));
        let pod = |ann: serde_json::Value| {
            Response::builder()
                .status(200)
                .header("content-type", "application/json")
                .body(Body::from(
                    serde_json::to_vec(&serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": "cap-0", "namespace": "ns", "annotations": ann}}))
                    .unwrap(),
                ))
                .unwrap()
        };
        let (req, send) = handle.next_request().await.unwrap();
        assert_eq!(req.uri().path(), "/api/v1/namespaces/ns/pods/cap-0");
        // The GET is in flight: the UUID is known, not yet published, so the pod is not ready.
        let (code, text) = readiness(true, None, &shared.uuid());
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE, "{text}");
        assert!(text.contains("not published yet"), "{text}");
        send.send_response(pod(serde_json::json!({})));
        let (req, send) = handle.next_request().await.unwrap();
        assert_eq!(req.method().as_str(), "PATCH");
        send.send_response(pod(serde_json::json!({"tessera.dev/gpu-uuid": GPU})));
        // Let the publisher record the success.
        while !shared.uuid().is_done() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(shared.uuid(), UuidState::Published(GPU.into()));
        assert_eq!(readiness(true, None, &shared.uuid()).0, StatusCode::OK);
        // Ten minutes later it re-reads the pod: someone removed the annotation, so it is written again.
        let (req, send) = handle.next_request().await.unwrap();
        assert_eq!(req.method().as_str(), "GET");
        send.send_response(pod(serde_json::json!({})));
        let (req, send) = handle.next_request().await.unwrap();
        assert_eq!(req.method().as_str(), "PATCH");
        send.send_response(pod(serde_json::json!({"tessera.dev/gpu-uuid": GPU})));
        shutdown.cancel();
        readings.await.unwrap();
        publishing.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn without_nvml_nothing_is_published_and_ready_says_why() {
        let shared = Arc::new(AgentShared::new());
        let (tx, rx) = tokio::sync::watch::channel(None);
        let shutdown = CancellationToken::new();
        let cfg = LoopConfig {
            interval: Duration::from_secs(5),
            proc_root: PathBuf::from("/nonexistent"),
            visible_devices: None,
            publishing: true,
        };
        let init = || Err(GpuError::Unavailable("libnvidia-ml.so.1: cannot open".into()));
        let readings = tokio::spawn(agent_loop(cfg, init, shared.clone(), tx, shutdown.clone()));
        tokio::time::sleep(Duration::from_secs(120)).await;
        assert!(rx.borrow().is_none(), "no UUID is sent to the publisher");
        let st = shared.status.lock().unwrap().clone();
        let (code, text) = readiness(st.nvml_up, st.error.as_deref(), &shared.uuid());
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            text.contains("libnvidia-ml") && text.contains("GPU UUID unknown"),
            "{text}"
        );
        assert!(matches!(shared.uuid(), UuidState::Unknown(w) if w.contains("libnvidia-ml")));
        shutdown.cancel();
        readings.await.unwrap();
    }
}
