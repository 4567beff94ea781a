//! The mutation: a pure function from a pod and its context to a JSON patch, a reason to leave the pod alone,
//! or a denial. No I/O, no clock: the handler ([`crate::admit`]) looks up the policy and reserves GPU room, then
//! calls [`plan`] and [`mutate`].
//!
//! The patch is the JSON diff between the pod as it came and the pod as Tessera wants it, so it always applies
//! to the pod it was made for, and running the webhook again on its own output gives an empty patch
//! ([`Unchanged::UpToDate`]) — what `reinvocationPolicy: IfNeeded` needs.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Container, ContainerPort, EnvVar, HTTPGetAction, HostPathVolumeSource, NodeAffinity,
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectFieldSelector, Pod, Probe,
    ResourceRequirements, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tessera_api::crd::{InferenceAutoscaler, RecommendationStatus, Sharing, UpdateMode};
use tessera_pool::{
    ANNOTATION_CAPACITY_POD, ANNOTATION_GPU_UUID, ANNOTATION_RESERVATION, LABEL_CAPACITY_POD, LABEL_POOL,
    Placement, PoolsConfig, SharingMode,
};

use crate::vllm;

mod dra;
mod sidecar;
mod sleep;

use sidecar::inject_sidecar;
pub use sidecar::sidecar;

/// Opt-in label (pod template or namespace) the webhook configuration selects on; as a pod annotation or label,
/// `"false"` opts a single pod out.
pub const INJECT: &str = "tessera.dev/inject";
/// Pod annotation: the compute share, a fraction in (0, 1] (written by Tessera; a user may set it).
pub const ANNOTATION_COMPUTE: &str = "tessera.dev/gpu-compute-fraction";
/// Pod annotation: GPU memory, MiB (written by Tessera; a user may set it).
pub const ANNOTATION_MEMORY: &str = "tessera.dev/gpu-memory";
/// Pod annotation: which container runs vLLM, where the webhook cannot tell.
pub const ANNOTATION_CONTAINER: &str = "tessera.dev/container";
/// Pod annotation: the vLLM version the image runs, where its tag does not say (`0.11.0`).
pub const ANNOTATION_VLLM_VERSION: &str = "tessera.dev/vllm-version";
/// Pod annotation: the inter-token latency objective handed to the sidecar (`--itl-slo`), e.g. `100ms`.
pub const ANNOTATION_ITL_SLO: &str = "tessera.dev/itl-slo";
pub use crate::policy::LABEL_AUTOSCALER;
/// The injected container's name.
pub const SIDECAR_NAME: &str = tessera_core::wire::sidecar::CONTAINER_NAME;
/// The injected container's command: the image's sidecar-only binary (`tessera-sidecar`, same subcommands and
/// flags as `tessera sidecar`). An image given with `--sidecar-image` must hold it at this path.
pub const SIDECAR_COMMAND: &str = "/usr/local/bin/tessera-sidecar";
/// The sidecar's named port.
pub const SIDECAR_PORT_NAME: &str = "tessera";
/// Volume names the webhook adds for MPS.
pub const MPS_PIPE_VOLUME: &str = "tessera-mps-pipe";
/// See [`MPS_PIPE_VOLUME`].
pub const MPS_LOG_VOLUME: &str = "tessera-mps-log";
/// See [`MPS_PIPE_VOLUME`]: the MPS control daemon's `/dev/shm`.
pub const MPS_SHM_VOLUME: &str = "tessera-mps-shm";
/// Where an MPS client expects the shared memory it shares with the MPS server.
const SHM_PATH: &str = "/dev/shm";
/// The first vLLM version with `--kv-cache-memory-bytes`.
pub const KV_BYTES_SINCE: (u32, u32) = (0, 11);

/// What the webhook injects and how (from its flags).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The sidecar's image (the tessera image).
    pub sidecar_image: String,
    /// The sidecar's port (`--listen 0.0.0.0:<port>`).
    pub sidecar_port: u16,
    /// CPU request of the sidecar.
    pub sidecar_cpu: String,
    /// Memory request and limit of the sidecar.
    pub sidecar_memory: String,
    /// The GPU pools, for fractional placement and for validating `tessera.dev/pool`.
    pub pools: Option<std::sync::Arc<PoolsConfig>>,
    /// The MPS pipe directory on the node (`CUDA_MPS_PIPE_DIRECTORY` of the node's MPS control daemon).
    pub mps_pipe_dir: String,
    /// The MPS log directory on the node (`CUDA_MPS_LOG_DIRECTORY`).
    pub mps_log_dir: String,
    /// The node directory that is the MPS control daemon's `/dev/shm`, mounted at `/dev/shm` in MPS clients.
    pub mps_shm_dir: String,
    /// The key the injected sidecars' objective tokens derive from (`--objective-key-file`): each sidecar gets its
    /// namespace's token ([`tessera_runtime::token`]). `None`: no token, and the sidecar refuses objectives over HTTP.
    pub objective_key: Option<std::sync::Arc<tessera_runtime::token::ObjectiveKey>>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            sidecar_image: "ghcr.io/tessera-dev/tessera:latest".into(),
            sidecar_port: 9090,
            sidecar_cpu: "50m".into(),
            sidecar_memory: "64Mi".into(),
            pools: None,
            mps_pipe_dir: "/tmp/nvidia-mps".into(),
            mps_log_dir: "/var/log/nvidia-mps".into(),
            mps_shm_dir: "/dev/shm".into(),
            objective_key: None,
        }
    }
}

/// Everything [`mutate`] decides from besides the pod.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    /// The webhook's configuration.
    pub config: &'a Config,
    /// The pod's InferenceAutoscaler, if it has one.
    pub policy: Option<&'a InferenceAutoscaler>,
    /// In fractional mode: where the reservation landed.
    pub placement: Option<&'a Placement>,
}

/// A pod the webhook refuses: its own `tessera.dev/*` settings are invalid. The message names the field, the
/// value and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}={value:?}: {problem}; {fix}")]
pub struct Deny {
    /// The annotation or label.
    pub field: String,
    /// Its value.
    pub value: String,
    /// What is wrong.
    pub problem: String,
    /// How to fix it.
    pub fix: String,
}

/// Why a pod is admitted unchanged. [`Unchanged::label`] is its fixed metric label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unchanged {
    /// The admission object is not a pod the webhook can read.
    NotAPod(String),
    /// Not a CREATE.
    NotCreate,
    /// `tessera.dev/inject: "false"` on the pod.
    OptedOut,
    /// A capacity pod (Tessera's own).
    CapacityPod,
    /// No container runs vLLM. `asked`: the pod itself carries `tessera.dev/inject: "true"` (a mistake worth a
    /// warning); otherwise it is only in an opted-in namespace, where pods that are not model servers (a job, a
    /// cache, a proxy) are expected and are no failure.
    NoVllmContainer {
        /// Whether the pod asked for injection by its own label or annotation.
        asked: bool,
    },
    /// Another container already uses the sidecar's port.
    PortConflict(u16),
    /// A container of the pod is already named like the sidecar (the pod brings its own, as `e2e/model.yaml`
    /// does): a second one would make the API server reject the pod.
    OwnSidecar,
    /// vLLM's `--port` cannot be read (an environment variable with no literal value): the sidecar would scrape
    /// the wrong port, or take vLLM's own.
    PortUnknown(String),
    /// The pod runs in the node's network namespace: the sidecar would listen on the node's port, one injected
    /// pod per node, and crash-loop if anything else on the node holds it.
    HostNetwork,
    /// The policy cache has not synced yet.
    CacheCold,
    /// Fractional mode, but no compute share or memory is known yet.
    NoShare(String),
    /// Fractional mode, but no pool can be chosen.
    NoPool(String),
    /// Fractional mode, but vLLM's memory flags cannot be set (an opaque shell script): sharing a GPU with an
    /// unbounded vLLM would starve its neighbours.
    FlagsUnsettable(String),
    /// Fractional mode on a dry run: a reservation would be a side effect.
    DryRun,
    /// The reservation failed (label: the pool error's label).
    Reservation {
        /// `reservation_<pool error label>` or `reservation_timeout`.
        label: &'static str,
        /// The error.
        message: String,
    },
    /// The reservation landed on a GPU that is not running yet or has not published its UUID.
    GpuPending(String),
    /// The pod already is as Tessera wants it.
    UpToDate,
    /// The patch, computed from the typed pod, does not apply to the pod as the API server sent it: the pod lacks
    /// a field its schema requires (an env entry without `name`), which the typed reading fills in. Answering the
    /// patch would fail the whole request at the API server; answering nothing lets its validation name the fault.
    Unpatchable(String),
    /// A bug: the patch could not be computed.
    Internal(String),
}

impl Unchanged {
    /// A fixed metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Self::NotAPod(_) => "not_a_pod",
            Self::NotCreate => "not_create",
            Self::OptedOut => "opted_out",
            Self::CapacityPod => "capacity_pod",
            Self::NoVllmContainer { .. } => "no_vllm_container",
            Self::PortConflict(_) => "port_conflict",
            Self::OwnSidecar => "own_sidecar",
            Self::PortUnknown(_) => "port_unknown",
            Self::HostNetwork => "host_network",
            Self::CacheCold => "cache_cold",
            Self::NoShare(_) => "no_share",
            Self::NoPool(_) => "no_pool",
            Self::FlagsUnsettable(_) => "flags_unsettable",
            Self::DryRun => "dry_run",
            Self::Reservation { label, .. } => label,
            Self::GpuPending(_) => "gpu_pending",
            Self::UpToDate => "up_to_date",
            Self::Unpatchable(_) => "unpatchable",
            Self::Internal(_) => "internal",
        }
    }

    /// Whether this is worth an Event on the owner (a pod that wanted something and did not get it).
    pub fn is_failure(&self) -> bool {
        !matches!(
            self,
            Self::NotCreate
                | Self::OptedOut
                | Self::CapacityPod
                | Self::UpToDate
                | Self::DryRun
                | Self::NoVllmContainer { asked: false }
        )
    }
}

impl std::fmt::Display for Unchanged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotAPod(m) => write!(f, "the admission object is not a readable pod: {m}"),
            Self::NotCreate => write!(f, "only pod creation is mutated"),
            Self::OptedOut => write!(f, "the pod sets {INJECT}: \"false\""),
            Self::CapacityPod => write!(f, "capacity pods are Tessera's own and are never mutated"),
            Self::NoVllmContainer { .. } => write!(
                f,
                "no container runs vLLM (`vllm serve` or vllm.entrypoints.openai.api_server); \
                 name it with the {ANNOTATION_CONTAINER} annotation"
            ),
            Self::PortConflict(p) => write!(
                f,
                "a container already uses port {p}, the sidecar's port (--sidecar-port)"
            ),
            Self::OwnSidecar => write!(
                f,
                "a container is already named {SIDECAR_NAME:?} (the pod brings its own sidecar); a second one would \
                 make the API server reject the pod: rename it, or set {INJECT}: \"false\" on the pod template"
            ),
            Self::PortUnknown(why) => write!(f, "{why}"),
            Self::HostNetwork => write!(
                f,
                "the pod uses hostNetwork: the sidecar would listen on the node's port (one such pod per node, and a \
                 crash loop if anything else holds it); run vLLM in the pod network or set {INJECT}: \"false\""
            ),
            Self::CacheCold => write!(f, "the InferenceAutoscaler cache has not synced yet"),
            Self::NoShare(m) | Self::NoPool(m) | Self::FlagsUnsettable(m) | Self::GpuPending(m) => {
                f.write_str(m)
            }
            Self::DryRun => write!(f, "dry run: fractional placement would reserve GPU room"),
            Self::Reservation { message, .. } => write!(f, "GPU reservation failed: {message}"),
            Self::UpToDate => write!(f, "the pod already carries Tessera's sidecar and settings"),
            Self::Unpatchable(m) => write!(
                f,
                "Tessera's patch does not apply to the pod as sent ({m}); a field Kubernetes requires is probably \
                 missing (an env entry's name, a port's containerPort): fix the pod template"
            ),
            Self::Internal(m) => write!(f, "internal error: {m}"),
        }
    }
}

/// Why a pod whose policy asks for a fraction of a GPU gets a whole one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WholeReason {
    /// It asks for more than one GPU (tensor or pipeline parallel).
    MultiGpu(u32),
    /// It asks for no GPU of the pool's resource.
    NoGpuRequest,
    /// Its InferenceAutoscaler's `Isolated` condition is True (the message): the model holds whole GPUs at its
    /// ceiling.
    Isolated(String),
}

impl WholeReason {
    /// A fixed metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Self::MultiGpu(_) => "whole_multi_gpu",
            Self::NoGpuRequest => "whole_no_gpu_request",
            Self::Isolated(_) => "whole_isolated",
        }
    }
}

impl std::fmt::Display for WholeReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::MultiGpu(n) => write!(
                f,
                "the pod asks for {n} GPUs (tensor/pipeline parallel): its shards must sit on {n} whole GPUs \
                 that talk over NVLink/PCIe, which a fraction of one GPU cannot be, so it keeps whole GPUs"
            ),
            Self::NoGpuRequest => write!(f, "the pod asks for no GPU, so there is nothing to share"),
            Self::Isolated(why) => write!(
                f,
                "its InferenceAutoscaler is isolated (condition Isolated: {why}), so it keeps a whole GPU"
            ),
        }
    }
}

/// What a fractional pod needs from the pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FractionalNeed {
    /// The pool.
    pub pool: String,
    /// Compute share, milli-GPUs.
    pub compute_milli: u32,
    /// GPU memory, MiB.
    pub memory_mib: u64,
    /// The model (for spreading replicas across GPUs): `namespace/name` of its policy or owner.
    pub model: String,
    /// The pod's priority.
    pub priority: i32,
    /// The reservation the pod already carries (a re-invocation), to be reused.
    pub reservation: Option<String>,
}

/// What to do with a pod, before any reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Leave it alone.
    Unchanged(Unchanged),
    /// Inject and size it on its own GPU(s); the reason is why a fractional policy did not apply.
    Whole(Option<WholeReason>),
    /// Reserve room, then inject and place it.
    Fractional(FractionalNeed),
}

/// The outcome of [`mutate`].
#[derive(Debug, Clone, PartialEq)]
pub enum Mutation {
    /// Admit with this patch.
    Patch {
        /// RFC 6902 operations against the pod as it came.
        patch: json_patch::Patch,
        /// `whole`, `fractional`, or a [`WholeReason::label`].
        label: &'static str,
        /// Human-readable notes (why whole mode, flags left alone, …).
        notes: Vec<String>,
    },
    /// Admit unchanged.
    Unchanged(Unchanged),
}

fn annotations(pod: &Pod) -> &BTreeMap<String, String> {
    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    pod.metadata.annotations.as_ref().unwrap_or(&EMPTY)
}

fn labels(pod: &Pod) -> &BTreeMap<String, String> {
    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    pod.metadata.labels.as_ref().unwrap_or(&EMPTY)
}

/// A label or annotation (the label wins).
fn setting<'p>(pod: &'p Pod, key: &str) -> Option<&'p str> {
    labels(pod)
        .get(key)
        .or_else(|| annotations(pod).get(key))
        .map(String::as_str)
}

fn deny(field: &str, value: &str, problem: impl Into<String>, fix: impl Into<String>) -> Deny {
    Deny {
        field: field.to_string(),
        value: value.to_string(),
        problem: problem.into(),
        fix: fix.into(),
    }
}

/// Parses a compute fraction in (0, 1] into milli-GPUs (1..=1000), rounded up as everything that reserves a
/// share rounds it (`core::pack::compute_milli`).
pub fn parse_fraction(s: &str) -> Option<u32> {
    let f: f64 = s.trim().parse().ok()?;
    tessera_core::pack::compute_milli(f)
}

fn parse_mib(s: &str) -> Option<u64> {
    s.trim().parse::<u64>().ok().filter(|m| *m > 0)
}

/// Checks the pod's own `tessera.dev/*` settings; the first invalid one denies the pod.
pub fn validate(pod: &Pod, config: &Config) -> Result<(), Deny> {
    if let Some(v) = setting(pod, INJECT)
        && v != "true"
        && v != "false"
    {
        return Err(deny(
            INJECT,
            v,
            "must be \"true\" or \"false\"",
            "quote the value: \"true\"",
        ));
    }
    if let Some(v) = annotations(pod).get(ANNOTATION_COMPUTE)
        && parse_fraction(v).is_none()
    {
        return Err(deny(
            ANNOTATION_COMPUTE,
            v,
            "is not a compute fraction in (0, 1]",
            "set a fraction such as \"0.25\", or remove it to use the InferenceAutoscaler's share",
        ));
    }
    if let Some(v) = annotations(pod).get(ANNOTATION_MEMORY)
        && parse_mib(v).is_none()
    {
        return Err(deny(
            ANNOTATION_MEMORY,
            v,
            "is not a positive whole number of MiB",
            "set MiB without a unit, e.g. \"10240\" for 10 GiB, or remove it to use the recommendation",
        ));
    }
    if let Some(v) = setting(pod, LABEL_POOL) {
        match &config.pools {
            Some(pools) if pools.pool(v).is_none() => {
                let known: Vec<&str> = pools.pools.iter().map(|p| p.name.as_str()).collect();
                return Err(deny(
                    LABEL_POOL,
                    v,
                    "names no configured GPU pool",
                    format!("use one of {known:?} (the webhook's --pools-config)"),
                ));
            }
            _ => {}
        }
    }
    if let Some(v) = annotations(pod).get(ANNOTATION_CONTAINER) {
        let names = pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .map(|c| c.name.as_str());
        if !names.clone().any(|n| n == v) {
            let all: Vec<&str> = names.collect();
            return Err(deny(
                ANNOTATION_CONTAINER,
                v,
                "names no container of the pod",
                format!("name the vLLM container, one of {all:?}"),
            ));
        }
    }
    if let Some(v) = annotations(pod).get(ANNOTATION_VLLM_VERSION)
        && vllm::parse_version(v).is_none()
    {
        return Err(deny(
            ANNOTATION_VLLM_VERSION,
            v,
            "is not a vLLM version",
            "write it as MAJOR.MINOR[.PATCH], e.g. \"0.11.0\"",
        ));
    }
    if let Some(v) = annotations(pod).get(ANNOTATION_ITL_SLO)
        && humantime::parse_duration(v).map_or(true, |d| d.is_zero())
    {
        return Err(deny(
            ANNOTATION_ITL_SLO,
            v,
            "is not a positive duration",
            "write a duration such as \"100ms\"",
        ));
    }
    Ok(())
}

/// The index of the container that runs vLLM.
pub fn vllm_container(pod: &Pod) -> Option<usize> {
    let spec = pod.spec.as_ref()?;
    if let Some(name) = annotations(pod).get(ANNOTATION_CONTAINER) {
        return spec.containers.iter().position(|c| &c.name == name);
    }
    spec.containers.iter().position(vllm::is_vllm)
}

fn quantity_count(q: &Quantity) -> Option<u32> {
    q.0.trim().parse().ok()
}

/// GPUs of `resource` the pod asks for, over all containers (limits, else requests). `None`: a quantity that is
/// not a whole number.
fn gpu_count(pod: &Pod, resource: &str) -> Option<u32> {
    let mut total = 0u32;
    for c in pod.spec.iter().flat_map(|s| s.containers.iter()) {
        let Some(r) = &c.resources else { continue };
        let q = r
            .limits
            .as_ref()
            .and_then(|l| l.get(resource))
            .or_else(|| r.requests.as_ref().and_then(|l| l.get(resource)));
        if let Some(q) = q {
            total = total.saturating_add(quantity_count(q)?);
        }
    }
    Some(total)
}

fn wants_fractional(pod: &Pod, policy: Option<&InferenceAutoscaler>) -> bool {
    let by_policy = policy
        .and_then(|p| p.spec.gpu.as_ref())
        .is_some_and(|g| g.sharing == Sharing::Fractional);
    by_policy || setting(pod, LABEL_POOL).is_some()
}

/// `namespace/name` of what the pod belongs to, for spreading a model's replicas across GPUs.
fn model_key(pod: &Pod, policy: Option<&InferenceAutoscaler>) -> String {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    if let Some(p) = policy {
        return format!(
            "{}/{}",
            p.metadata.namespace.as_deref().unwrap_or(ns),
            p.metadata.name.as_deref().unwrap_or_default()
        );
    }
    let owner = crate::policy::owner_workload(pod).map(|(_, n)| n);
    let name = owner
        .or_else(|| pod.metadata.generate_name.clone())
        .or_else(|| pod.metadata.name.clone())
        .unwrap_or_default();
    format!("{ns}/{name}")
}

/// Decides what to do with `pod` before any reservation: deny, leave alone, whole mode, or what to reserve.
/// `ctx.placement` is ignored.
pub fn plan(pod: &Pod, ctx: &Context<'_>) -> Result<Plan, Deny> {
    validate(pod, ctx.config)?;
    if setting(pod, INJECT) == Some("false") {
        return Ok(Plan::Unchanged(Unchanged::OptedOut));
    }
    if labels(pod).get(LABEL_CAPACITY_POD).map(String::as_str) == Some("true") {
        return Ok(Plan::Unchanged(Unchanged::CapacityPod));
    }
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(Plan::Unchanged(Unchanged::NotAPod("no spec".into())));
    };
    let Some(vi) = vllm_container(pod) else {
        let asked = setting(pod, INJECT) == Some("true");
        return Ok(Plan::Unchanged(Unchanged::NoVllmContainer { asked }));
    };
    if spec.host_network == Some(true) {
        return Ok(Plan::Unchanged(Unchanged::HostNetwork));
    }
    if spec.containers.iter().any(|c| c.name == SIDECAR_NAME) {
        return Ok(Plan::Unchanged(Unchanged::OwnSidecar));
    }
    let vllm_port = match vllm::port(&spec.containers[vi]) {
        Ok(p) => p,
        Err(why) => return Ok(Plan::Unchanged(Unchanged::PortUnknown(why))),
    };
    let port = ctx.config.sidecar_port;
    let clash = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .filter(|c| c.name != SIDECAR_NAME)
        .flat_map(|c| c.ports.iter().flatten())
        .any(|p| p.container_port == i32::from(port));
    if clash || vllm_port == port {
        return Ok(Plan::Unchanged(Unchanged::PortConflict(port)));
    }
    if !wants_fractional(pod, ctx.policy) {
        return Ok(Plan::Whole(None));
    }
    let Some(pools) = ctx.config.pools.as_deref() else {
        return Ok(Plan::Unchanged(Unchanged::NoPool(
            "fractional mode needs GPU pools, and the webhook runs without --pools-config".into(),
        )));
    };
    let pool = match setting(pod, LABEL_POOL) {
        Some(p) => p.to_string(),
        None if pools.pools.len() == 1 => pools.pools[0].name.clone(),
        None => {
            return Ok(Plan::Unchanged(Unchanged::NoPool(format!(
                "{} pools are configured and the pod names none: label the pod template {LABEL_POOL}=<pool>",
                pools.pools.len()
            ))));
        }
    };
    let Some(spec_pool) = pools.pool(&pool) else {
        return Ok(Plan::Unchanged(Unchanged::NoPool(format!(
            "no pool named {pool:?}"
        ))));
    };
    // A pod Tessera already placed (re-invocation) no longer asks for a GPU; its annotations say where it sits.
    // Placed already (a re-invocation): its GPU request is gone, so the count below cannot tell.
    let placed = existing_placement(pod, None).is_some() || dra::claimed(pod);
    match gpu_count(pod, &spec_pool.resource_name) {
        _ if placed => {}
        // At its ceiling and over its objective while sharing, the controller isolated the model: a new pod
        // gets a whole GPU (the controller moves the shared ones off theirs).
        Some(1) if let Some(c) = ctx.policy.and_then(|p| p.status.as_ref()?.isolated()) => {
            return Ok(Plan::Whole(Some(WholeReason::Isolated(c.message.clone()))));
        }
        Some(1) => {}
        Some(0) => return Ok(Plan::Whole(Some(WholeReason::NoGpuRequest))),
        Some(n) => return Ok(Plan::Whole(Some(WholeReason::MultiGpu(n)))),
        None => {
            return Ok(Plan::Unchanged(Unchanged::NoShare(format!(
                "the pod's {} quantity is not a whole number",
                spec_pool.resource_name
            ))));
        }
    }
    if !vllm::flags_settable(&spec.containers[vi]) {
        return Ok(Plan::Unchanged(Unchanged::FlagsUnsettable(
            "vLLM's memory flags cannot be set in this container's shell script, and a vLLM without them \
             would take the memory of every neighbour on a shared GPU"
                .into(),
        )));
    }
    let gpu = ctx.policy.and_then(|p| p.spec.gpu.as_ref());
    let rec = in_force(ctx.policy);
    let rec = rec.as_ref();
    let compute_milli = annotations(pod)
        .get(ANNOTATION_COMPUTE)
        .and_then(|v| parse_fraction(v))
        .or_else(|| {
            gpu.and_then(|g| g.compute_fraction.as_deref())
                .filter(|v| *v != "auto")
                .and_then(parse_fraction)
        })
        .or_else(|| {
            rec.and_then(|r| r.compute_fraction)
                .and_then(|f| parse_fraction(&f.to_string()))
        });
    let memory_mib = annotations(pod)
        .get(ANNOTATION_MEMORY)
        .and_then(|v| parse_mib(v))
        .or_else(|| match gpu.and_then(|g| g.memory.as_ref()) {
            Some(IntOrString::Int(m)) => u64::try_from(*m).ok().filter(|m| *m > 0),
            Some(IntOrString::String(s)) if s != "auto" => parse_mib(s),
            _ => None,
        })
        .or_else(|| {
            rec.and_then(|r| r.gpu_memory_mib)
                .and_then(|m| u64::try_from(m).ok())
                .filter(|m| *m > 0)
        });
    let (Some(compute_milli), Some(memory_mib)) = (compute_milli, memory_mib) else {
        return Ok(Plan::Unchanged(Unchanged::NoShare(
            "fractional mode needs a compute share and GPU memory: set gpu.computeFraction and gpu.memory on \
             the InferenceAutoscaler, or let it run whole until status.recommendation has both"
                .into(),
        )));
    };
    Ok(Plan::Fractional(FractionalNeed {
        pool,
        compute_milli,
        memory_mib,
        model: model_key(pod, ctx.policy),
        priority: spec.priority.unwrap_or(0),
        reservation: annotations(pod).get(ANNOTATION_RESERVATION).cloned(),
    }))
}

/// The pod's required node-affinity terms (where [`pin_to_node`]'s node pin lives), if it has any.
pub fn required_node_terms(spec: &k8s_openapi::api::core::v1::PodSpec) -> Option<&[NodeSelectorTerm]> {
    let required = spec
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?;
    Some(&required.node_selector_terms)
}

/// The placement a pod already carries (Tessera placed it on an earlier invocation): its reservation, capacity
/// pod, GPU UUID, pool label and node pin.
pub fn existing_placement(pod: &Pod, pools_namespace: Option<&str>) -> Option<Placement> {
    let ann = annotations(pod);
    let node = required_node_terms(pod.spec.as_ref()?)?
        .iter()
        .flat_map(|t| t.match_fields.iter().flatten())
        .find(|f| f.key == "metadata.name" && f.operator == "In")
        .and_then(|f| f.values.as_ref()?.first().cloned())?;
    Some(Placement {
        pool: labels(pod).get(LABEL_POOL)?.clone(),
        capacity_pod: ann.get(ANNOTATION_CAPACITY_POD)?.clone(),
        // Capacity pods live in the pools' namespace (the tenant pod does not record it).
        namespace: pools_namespace.unwrap_or_default().to_owned(),
        node: Some(node),
        gpu_uuid: Some(ann.get(ANNOTATION_GPU_UUID)?.clone()),
        reservation_id: ann.get(ANNOTATION_RESERVATION)?.clone(),
        reason: "Existing".into(),
    })
}

/// Whether fractions are written as DRA claims (`mode: dra`) rather than reservations on capacity pods.
pub fn writes_claims(config: &Config) -> bool {
    config
        .pools
        .as_deref()
        .is_some_and(|p| p.mode == tessera_pool::PoolMode::Dra)
}

/// Mutates `pod` in its context: the sidecar, vLLM's memory flags, and in fractional mode the placement.
pub fn mutate(pod: &Pod, ctx: &Context<'_>) -> Result<Mutation, Deny> {
    Ok(apply_plan(pod, ctx, &plan(pod, ctx)?))
}

/// [`mutate`] with the [`plan`] already made for this pod (the handler plans before it reserves; the plan does not
/// depend on `ctx.placement`).
pub fn apply_plan(pod: &Pod, ctx: &Context<'_>, plan: &Plan) -> Mutation {
    let existing = existing_placement(pod, ctx.config.pools.as_deref().map(|p| p.namespace.as_str()));
    let mut notes = Vec::new();
    let (label, fractional) = match plan {
        Plan::Unchanged(u) => return Mutation::Unchanged(u.clone()),
        Plan::Whole(None) => ("whole", None),
        Plan::Whole(Some(why)) => {
            notes.push(why.to_string());
            (why.label(), None)
        }
        Plan::Fractional(need) if dra::on(ctx) => {
            let mut next = pod.clone();
            if let Err(u) = dra::apply(&mut next, ctx, need, &mut notes) {
                return Mutation::Unchanged(u);
            }
            inject_sidecar(&mut next, ctx, Some((need, None)));
            return finish(pod, next, "dra", notes);
        }
        Plan::Fractional(need) => {
            let Some(placement) = ctx.placement.or(existing.as_ref()) else {
                return Mutation::Unchanged(Unchanged::GpuPending(
                    "no placement was made for this fractional pod".into(),
                ));
            };
            let (Some(node), Some(uuid)) = (placement.node.as_deref(), placement.gpu_uuid.as_deref()) else {
                return Mutation::Unchanged(Unchanged::GpuPending(format!(
                    "the reservation landed on capacity pod {}, which has {}; the reservation expires by the \
                     pool's TTL and the pod keeps its whole GPU",
                    placement.capacity_pod,
                    if placement.node.is_none() {
                        "no node yet"
                    } else {
                        "not published its GPU UUID yet"
                    }
                )));
            };
            ("fractional", Some((need, placement, node, uuid)))
        }
    };
    let mut next = pod.clone();
    let result = if let Some((need, placement, node, uuid)) = fractional {
        apply_fractional(&mut next, ctx, need, placement, node, uuid, &mut notes)
    } else {
        apply_whole(&mut next, ctx, &mut notes)
    };
    if let Err(u) = result {
        return Mutation::Unchanged(u);
    }
    inject_sidecar(&mut next, ctx, fractional.map(|(n, p, _, u)| (n, Some((p, u)))));
    finish(pod, next, label, notes)
}

/// The patch from `pod` to `next`, or why there is none.
fn finish(pod: &Pod, next: Pod, label: &'static str, notes: Vec<String>) -> Mutation {
    let Ok(patch) = pod_patch(pod, next) else {
        return Mutation::Unchanged(Unchanged::Internal("pod does not serialize".into()));
    };
    if patch.0.is_empty() {
        return Mutation::Unchanged(Unchanged::UpToDate);
    }
    Mutation::Patch { patch, label, notes }
}

/// The JSON diff from `before` to `after`, both as Tessera's types serialize them (so fields those types do not know
/// are never touched). What the mutation left as it was — containers (most of a pod's JSON, vLLM's own included
/// whenever its flags stay), volumes, the metadata — is blanked on both sides before serializing, since the diff
/// would find nothing in it; the diff compares arrays index by index, so blanks at equal indices yield no
/// operation and every path still points into the real pod.
fn pod_patch(before: &Pod, mut after: Pod) -> Result<json_patch::Patch, serde_json::Error> {
    let mut before = before.clone();
    if before.metadata == after.metadata {
        before.metadata = ObjectMeta::default();
        after.metadata = ObjectMeta::default();
    }
    if let (Some(b), Some(a)) = (before.spec.as_mut(), after.spec.as_mut()) {
        blank_equal(&mut b.containers, &mut a.containers);
        if let (Some(b), Some(a)) = (b.init_containers.as_mut(), a.init_containers.as_mut()) {
            blank_equal(b, a);
        }
        if let (Some(b), Some(a)) = (b.volumes.as_mut(), a.volumes.as_mut()) {
            blank_equal(b, a);
        }
    }
    Ok(json_patch::diff(
        &serde_json::to_value(&before)?,
        &serde_json::to_value(&after)?,
    ))
}

/// Replaces equal elements at equal indices with the default on both sides.
fn blank_equal<T: PartialEq + Default>(before: &mut [T], after: &mut [T]) {
    for (b, a) in before.iter_mut().zip(after.iter_mut()) {
        if b == a {
            *b = T::default();
            *a = T::default();
        }
    }
}

/// Whether `--kv-cache-memory-bytes` may be used: vLLM ≥ 0.11 by the image tag or the version annotation.
fn kv_bytes_supported(pod: &Pod, c: &Container) -> bool {
    annotations(pod)
        .get(ANNOTATION_VLLM_VERSION)
        .and_then(|v| vllm::parse_version(v))
        .or_else(|| vllm::image_version(c))
        .is_some_and(|v| v >= KV_BYTES_SINCE)
}

fn managed(policy: Option<&InferenceAutoscaler>) -> bool {
    policy
        .and_then(|p| p.spec.gpu.as_ref())
        .is_some_and(|g| matches!(g.update_mode, UpdateMode::Initial | UpdateMode::Recreate))
}

/// The allocation in force for new pods, as the controller decided it (`status.allocation.inForce`: the
/// recommendation once stable for the window, fixed policy values winning; `tessera_core::rollout`). `None` while
/// nothing is in force. A status written by a controller that predates `allocation` falls back to the raw
/// `status.recommendation`.
fn in_force(policy: Option<&InferenceAutoscaler>) -> Option<RecommendationStatus> {
    let status = policy?.status.as_ref()?;
    match &status.allocation {
        Some(a) => a.in_force.as_ref().map(|f| RecommendationStatus {
            kv_cache_memory_bytes: f.kv_cache_memory_bytes,
            gpu_memory_utilization: f.gpu_memory_utilization,
            gpu_memory_mib: Some(f.gpu_memory_mib),
            compute_fraction: Some(f.compute_fraction),
            reason: format!("in force ({})", a.reason),
        }),
        None => status.recommendation.clone(),
    }
}

/// Whole mode: vLLM's memory from the recommendation, only where the policy says Tessera manages it
/// (`gpu.updateMode: Initial|Recreate`); otherwise the user's flags stay as written.
fn apply_whole(pod: &mut Pod, ctx: &Context<'_>, notes: &mut Vec<String>) -> Result<(), Unchanged> {
    let rec = in_force(ctx.policy);
    let (Some(rec), true) = (rec, managed(ctx.policy)) else {
        return Ok(());
    };
    let Some(vi) = vllm_container(pod) else {
        return Ok(());
    };
    let kv_ok = kv_bytes_supported(pod, &pod_spec(pod).containers[vi]);
    let c = &mut pod_spec_mut(pod).containers[vi];
    let set = match (
        rec.kv_cache_memory_bytes.filter(|b| *b > 0),
        rec.gpu_memory_utilization,
    ) {
        (Some(bytes), _) if kv_ok => vllm::set_flag(c, "--kv-cache-memory-bytes", &bytes.to_string()),
        (_, Some(u)) if u > 0.0 && u <= 1.0 => {
            vllm::set_flag(c, "--gpu-memory-utilization", &format_ratio(u))
        }
        _ => return Ok(()),
    };
    match set {
        Err(e) => notes.push(format!("vLLM's memory flags left as they are: {}", e.0)),
        Ok(_) => {
            // What this pod runs with, so the controller can tell when running pods drift from the allocation in
            // force (`updateMode: Recreate`). A whole GPU is a compute share of 1.
            if let Some(mib) = rec.gpu_memory_mib.filter(|m| *m > 0) {
                let ann = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
                ann.insert(ANNOTATION_MEMORY.into(), mib.to_string());
                ann.insert(ANNOTATION_COMPUTE.into(), "1".into());
            }
        }
    }
    Ok(())
}

fn pod_spec(pod: &Pod) -> &k8s_openapi::api::core::v1::PodSpec {
    static EMPTY: std::sync::OnceLock<k8s_openapi::api::core::v1::PodSpec> = std::sync::OnceLock::new();
    pod.spec
        .as_ref()
        .unwrap_or_else(|| EMPTY.get_or_init(Default::default))
}

fn pod_spec_mut(pod: &mut Pod) -> &mut k8s_openapi::api::core::v1::PodSpec {
    pod.spec.get_or_insert_with(Default::default)
}

/// A 0–1 ratio with at most three decimals, rounded down so vLLM never asks for more than its share.
fn format_ratio(u: f64) -> String {
    let milli = (u * 1000.0).floor().clamp(1.0, 1000.0) / 1000.0;
    let s = format!("{milli:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn format_fraction(milli: u32) -> String {
    format_ratio(f64::from(milli) / 1000.0)
}

/// What every shared GPU needs of the vLLM container `vi`, whichever way the fraction is written: its memory
/// flags bound to the share (`--gpu-memory-utilization`, and the recommended KV bytes where they belong to the
/// recommended memory), and no request for the pool's whole-GPU resource.
fn bound_vllm(
    pod: &mut Pod,
    vi: usize,
    ctx: &Context<'_>,
    need: &FractionalNeed,
    pool: &tessera_pool::PoolSpec,
    notes: &mut Vec<String>,
) -> Result<(), Unchanged> {
    let kv_ok = kv_bytes_supported(pod, &pod_spec(pod).containers[vi]);
    let rec = in_force(ctx.policy);
    let c = &mut pod_spec_mut(pod).containers[vi];
    // A shared GPU must bound vLLM: its budget is the reserved share of the card, whatever the user wrote.
    let util = need.memory_mib as f64 / pool.gpu_memory_mib as f64;
    vllm::set_flag(c, "--gpu-memory-utilization", &format_ratio(util))
        .map_err(|e| Unchanged::FlagsUnsettable(e.0))?;
    // The recommended KV size belongs with the recommended memory; with a memory the user chose it may not fit.
    let memory_from_rec = rec.as_ref().and_then(|r| r.gpu_memory_mib) == i64::try_from(need.memory_mib).ok();
    if let Some(bytes) = rec
        .as_ref()
        .and_then(|r| r.kv_cache_memory_bytes)
        .filter(|b| *b > 0)
    {
        if kv_ok && memory_from_rec {
            vllm::set_flag(c, "--kv-cache-memory-bytes", &bytes.to_string())
                .map_err(|e| Unchanged::FlagsUnsettable(e.0))?;
        } else if !kv_ok {
            notes.push(
                "--kv-cache-memory-bytes needs vLLM >= 0.11 (image tag or tessera.dev/vllm-version); \
                 sized by --gpu-memory-utilization"
                    .into(),
            );
        }
    }
    for list in [&mut c.resources].into_iter().flatten() {
        for map in [&mut list.limits, &mut list.requests].into_iter().flatten() {
            map.remove(&pool.resource_name);
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn apply_fractional(
    pod: &mut Pod,
    ctx: &Context<'_>,
    need: &FractionalNeed,
    placement: &Placement,
    node: &str,
    uuid: &str,
    notes: &mut Vec<String>,
) -> Result<(), Unchanged> {
    let pools = ctx.config.pools.as_deref();
    let Some(pool) = pools.and_then(|p| p.pool(&need.pool)) else {
        return Err(Unchanged::NoPool(format!("no pool named {:?}", need.pool)));
    };
    let Some(vi) = vllm_container(pod) else {
        return Err(Unchanged::NoVllmContainer {
            asked: setting(pod, INJECT) == Some("true"),
        });
    };
    bound_vllm(pod, vi, ctx, need, pool, notes)?;
    let spec = pod_spec_mut(pod);
    let c = &mut spec.containers[vi];
    vllm::set_env(c, "NVIDIA_VISIBLE_DEVICES", uuid);
    if pool.sharing == SharingMode::Mps {
        apply_mps(spec, vi, ctx.config, need);
    }
    pin_to_node(spec, node);
    let toleration = Toleration {
        key: Some(pool.resource_name.clone()),
        operator: Some("Exists".into()),
        effect: Some("NoSchedule".into()),
        ..Toleration::default()
    };
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    if !tolerations.contains(&toleration) {
        tolerations.push(toleration);
    }
    let ann = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
    ann.insert(ANNOTATION_COMPUTE.into(), format_fraction(need.compute_milli));
    ann.insert(ANNOTATION_MEMORY.into(), need.memory_mib.to_string());
    ann.insert(ANNOTATION_GPU_UUID.into(), uuid.to_string());
    ann.insert(ANNOTATION_CAPACITY_POD.into(), placement.capacity_pod.clone());
    ann.insert(ANNOTATION_RESERVATION.into(), placement.reservation_id.clone());
    pod.metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(LABEL_POOL.into(), need.pool.clone());
    Ok(())
}

/// MPS client settings. From NVIDIA's MPS documentation (docs.nvidia.com/deploy/mps, "Appendix: Environment
/// Variables"): the control daemon, the server and their clients talk over named pipes and UNIX sockets in
/// `CUDA_MPS_PIPE_DIRECTORY`, which must be the same for all of them, so the node's directory is mounted at the same
/// path and named explicitly; clients set `CUDA_MPS_LOG_DIRECTORY` like the daemon; the active thread percentage
/// caps the SMs a client may use and the pinned device memory limit its allocations per device (`"0=<n>M"`: device
/// 0 is the one GPU the container sees). The rest is what NVIDIA's own Kubernetes device plugin gives an MPS
/// client (NVIDIA/k8s-device-plugin, `internal/plugin/mps.go`): the pipe directory and the control daemon's
/// `/dev/shm`, mounted at `/dev/shm` — not the host's IPC namespace, so no `hostIPC`.
fn apply_mps(
    spec: &mut k8s_openapi::api::core::v1::PodSpec,
    vi: usize,
    config: &Config,
    need: &FractionalNeed,
) {
    let c = &mut spec.containers[vi];
    let pct = need.compute_milli.div_ceil(10).clamp(1, 100);
    vllm::set_env(c, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", &pct.to_string());
    vllm::set_env(
        c,
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
        &format!("0={}M", need.memory_mib),
    );
    vllm::set_env(c, "CUDA_MPS_PIPE_DIRECTORY", &config.mps_pipe_dir);
    vllm::set_env(c, "CUDA_MPS_LOG_DIRECTORY", &config.mps_log_dir);
    let mounts = c.volume_mounts.get_or_insert_with(Vec::new);
    for (name, path) in [
        (MPS_PIPE_VOLUME, config.mps_pipe_dir.as_str()),
        (MPS_LOG_VOLUME, config.mps_log_dir.as_str()),
    ] {
        if !mounts.iter().any(|m| m.name == name) {
            mounts.push(VolumeMount {
                name: name.into(),
                mount_path: path.into(),
                ..VolumeMount::default()
            });
        }
    }
    // One mount per path: a /dev/shm the pod brings (vLLM charts mount a memory emptyDir there) is replaced, since
    // the client must see the daemon's; the pod's own volume stays declared, unused.
    let shm = VolumeMount {
        name: MPS_SHM_VOLUME.into(),
        mount_path: SHM_PATH.into(),
        ..VolumeMount::default()
    };
    mounts.retain(|m| m.name == MPS_SHM_VOLUME || m.mount_path.trim_end_matches('/') != SHM_PATH);
    if !mounts.iter().any(|m| m.name == MPS_SHM_VOLUME) {
        mounts.push(shm);
    }
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    for (name, path) in [
        (MPS_PIPE_VOLUME, &config.mps_pipe_dir),
        (MPS_LOG_VOLUME, &config.mps_log_dir),
        (MPS_SHM_VOLUME, &config.mps_shm_dir),
    ] {
        if !volumes.iter().any(|v| v.name == name) {
            volumes.push(Volume {
                name: name.into(),
                // `Directory`, not `DirectoryOrCreate`: an empty directory would make CUDA silently run without
                // MPS (unbounded); a missing one keeps the pod in ContainerCreating with a clear event.
                host_path: Some(HostPathVolumeSource {
                    path: path.clone(),
                    type_: Some("Directory".into()),
                }),
                ..Volume::default()
            });
        }
    }
}

/// Adds `metadata.name In [node]` to every required node selector term (terms are ORed, so each must carry it).
fn pin_to_node(spec: &mut k8s_openapi::api::core::v1::PodSpec, node: &str) {
    let req = NodeSelectorRequirement {
        key: "metadata.name".into(),
        operator: "In".into(),
        values: Some(vec![node.to_string()]),
    };
    let affinity = spec.affinity.get_or_insert_with(Affinity::default);
    let na = affinity.node_affinity.get_or_insert_with(NodeAffinity::default);
    let required = na
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_with(|| NodeSelector {
            node_selector_terms: Vec::new(),
        });
    if required.node_selector_terms.is_empty() {
        required.node_selector_terms.push(NodeSelectorTerm::default());
    }
    for term in &mut required.node_selector_terms {
        let fields = term.match_fields.get_or_insert_with(Vec::new);
        if !fields.contains(&req) {
            fields.push(req.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn ratios_round_down_to_three_decimals() {
        assert_eq!(format_ratio(0.125), "0.125");
        assert_eq!(format_ratio(10240.0 / 81920.0), "0.125");
        assert_eq!(format_ratio(0.33339), "0.333");
        assert_eq!(format_ratio(1.0), "1");
        assert_eq!(format_ratio(0.0), "0.001");
        assert_eq!(format_fraction(250), "0.25");
        assert_eq!(parse_fraction("0.25"), Some(250));
        assert_eq!(parse_fraction("1"), Some(1000));
        assert_eq!(parse_fraction("0"), None);
        assert_eq!(parse_fraction("1.5"), None);
        assert_eq!(parse_fraction("NaN"), None);
    }

    #[test]
    fn node_pinning_is_anded_into_every_term_once() {
        let mut spec = k8s_openapi::api::core::v1::PodSpec::default();
        pin_to_node(&mut spec, "n1");
        pin_to_node(&mut spec, "n1");
        let terms = required_node_terms(&spec).unwrap();
        assert_eq!(terms.len(), 1);
        assert_eq!(terms[0].match_fields.as_ref().unwrap().len(), 1);
    }
}
