//! The `InferenceAutoscaler` custom resource (`tessera.dev/v1alpha1`, short name `ias`): one per model deployment.
//!
//! The Rust types are the source of truth: `tessera crdgen` prints the CRD generated from them, and the committed
//! `deploy/crds/inferenceautoscaler.yaml` must equal that output (a unit test and the test script both check it).
//!
//! Validation happens twice, on purpose:
//! - in the API server, through OpenAPI bounds and CEL `x-kubernetes-validations` rules in the schema, so
//!   `kubectl apply` of nonsense (max < min, fractions outside 0–1, minReplicas 0 without scaleToZero) fails at once
//!   with a message a user understands;
//! - in Rust, [`InferenceAutoscalerSpec::validate`], with the same messages, because a cluster may run the CRD
//!   without CEL (older API servers) and because the controller reports problems as a status condition.
//!
//! Here: the spec's types and the CRD they generate ([`crdgen`]). In `policy.rs`: the spec read into the core's
//! [`tessera_core::scale::ScalePolicy`], every check with its message. In `status.rs`: what the controller writes
//! back.
//!
//! Field names and semantics follow HPA (`autoscaling/v2`) where one exists (`scaleTargetRef`, `minReplicas`,
//! `maxReplicas`, `behavior` with `stabilizationWindowSeconds`, `selectPolicy`, `policies`), so moving from an HPA
//! is a matter of renaming the metrics (see `docs/autoscaling.md`).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

mod policy;
mod status;

pub use policy::{SpecError, invalid_spec_message};
pub use status::{
    AllocationStatus, AllocationValues, CONDITION_ISOLATED, ColdStartLedgerStatus, FlexNeighbour,
    FlexNeighboursStatus, InferenceAutoscalerStatus, RecommendationStatus, RestStatus, SignalStatus,
};

/// API group of every Tessera resource.
pub const GROUP: &str = "tessera.dev";
/// Version of the InferenceAutoscaler API.
pub const VERSION: &str = "v1alpha1";

/// Pattern for duration strings such as `30s`, `5m`, `1h30m`, `500ms` (Go `time.ParseDuration` units that
/// humantime also reads).
const DURATION_PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$";

/// Scales a model server on inference signals (KV cache, queue, time to first token, request rate), to zero when
/// idle, and recommends its GPU memory and compute share.
// kube's `printcolumn(...)` repeats `type_ = "integer"` by design; clippy reads that as a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "tessera.dev",
    version = "v1alpha1",
    kind = "InferenceAutoscaler",
    namespaced,
    shortname = "ias",
    category = "tessera",
    status = "InferenceAutoscalerStatus",
    derive = "PartialEq",
    doc = "InferenceAutoscaler scales a vLLM model server on inference signals, to zero when idle, and recommends \
           its GPU memory and compute share.",
    printcolumn(
        name = "Target",
        type_ = "string",
        json_path = ".status.target",
        description = "The scaled workload, as Kind/name"
    ),
    printcolumn(name = "Min", type_ = "integer", json_path = ".spec.minReplicas"),
    printcolumn(name = "Max", type_ = "integer", json_path = ".spec.maxReplicas"),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".status.replicas"),
    printcolumn(name = "Desired", type_ = "integer", json_path = ".status.desiredReplicas"),
    printcolumn(
        name = "Signal",
        type_ = "string",
        json_path = ".status.leadingSignal",
        description = "The signal that asked for the most replicas"
    ),
    printcolumn(
        name = "Held-By",
        type_ = "string",
        json_path = ".status.constraint",
        priority = 1,
        description = "What held the replica count in the last decision (kubectl get -o wide)"
    ),
    printcolumn(
        name = "GPU-MiB",
        type_ = "integer",
        json_path = ".status.recommendation.gpuMemoryMiB",
        priority = 1,
        description = "Recommended GPU memory per replica, MiB (kubectl get -o wide)"
    ),
    printcolumn(
        name = "Compute",
        type_ = "number",
        json_path = ".status.recommendation.computeFraction",
        priority = 1,
        description = "Recommended compute share per replica, 0-1 (kubectl get -o wide)"
    ),
    printcolumn(
        name = "KV-Bytes",
        type_ = "integer",
        json_path = ".status.recommendation.kvCacheMemoryBytes",
        priority = 1,
        description = "Recommended --kv-cache-memory-bytes (kubectl get -o wide)"
    ),
    printcolumn(
        name = "Sharing",
        type_ = "string",
        json_path = ".spec.gpu.sharing",
        priority = 1,
        description = "GPU class: whole GPUs or fractional shares (kubectl get -o wide)"
    ),
    printcolumn(
        name = "Class",
        type_ = "string",
        json_path = ".status.workloadClass",
        priority = 1,
        description = "Workload class: realtime, nearRealtime or batch, pinned or detected (kubectl get -o wide)"
    ),
    printcolumn(
        name = "Class-Source",
        type_ = "string",
        json_path = ".status.workloadClassSource",
        priority = 1,
        description = "Where the class came from: pinned, declared, observed or default (kubectl get -o wide)"
    ),
    printcolumn(
        name = "Update",
        type_ = "string",
        json_path = ".spec.gpu.updateMode",
        priority = 1,
        description = "When the recommendation is applied: Off, Initial, Recreate (kubectl get -o wide)"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[x_kube(validation = Rule::new("self.maxReplicas >= self.minReplicas")
    .message("maxReplicas must be >= minReplicas"))]
#[x_kube(validation = Rule::new("!has(self.scaleToZero) || (has(self.modelNames) && size(self.modelNames) > 0)")
    .message("scaleToZero needs modelNames: the activator holds, counts and routes requests by their OpenAI model name"))]
#[x_kube(validation = Rule::new(
    "!has(self.targets) || !has(self.targets.requestsPerSecondPerReplica) || \
     (has(self.modelNames) && size(self.modelNames) > 0)")
    .message("targets.requestsPerSecondPerReplica needs modelNames: the activator counts requests by model name"))]
#[x_kube(validation = Rule::new("!has(self.ttftSlo) || duration(self.ttftSlo) > duration('0s')")
    .message("ttftSlo must be more than 0 (e.g. 500ms): a zero SLO is breached by every request"))]
#[x_kube(validation = Rule::new("!has(self.itlSlo) || duration(self.itlSlo) > duration('0s')")
    .message("itlSlo must be more than 0 (e.g. 100ms), or left out for no inter-token objective"))]
#[x_kube(validation = Rule::new("!has(self.ttftSloPercentile) || self.ttftSloPercentile in [95, 99]")
    .message("ttftSloPercentile must be 95 or 99 (the percentiles the sidecar reports)"))]
#[x_kube(validation = Rule::new("!has(self.ttftSloPercentile) || has(self.ttftSlo)")
    .message("ttftSloPercentile needs ttftSlo: it says which percentile the SLO holds"))]
#[x_kube(validation = Rule::new("self.minReplicas > 0 || has(self.scaleToZero)")
    .message("minReplicas 0 requires scaleToZero (set scaleToZero.idleAfter, e.g. 10m), or set minReplicas >= 1"))]
#[serde(rename_all = "camelCase")]
pub struct InferenceAutoscalerSpec {
    /// The workload to scale: anything with a /scale subresource (Deployment, StatefulSet, ...), in this namespace.
    pub scale_target_ref: ScaleTargetRef,
    /// Lowest replica count (default 1). 0 allows scale to zero and requires `scaleToZero`.
    #[serde(default = "default_min_replicas")]
    #[schemars(range(min = 0))]
    pub min_replicas: i32,
    /// Highest replica count.
    #[schemars(range(min = 1))]
    pub max_replicas: i32,
    /// Per-replica targets, one per signal; set at least one to scale on load (none: only scale to and from zero).
    #[serde(default)]
    pub targets: Targets,
    /// Scale to zero after this long without requests (needs the Tessera activator in the request path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_to_zero: Option<ScaleToZero>,
    /// Time-to-first-token SLO, e.g. `500ms`: while the model's p95 (or the percentile `ttftSloPercentile` names)
    /// is over it, never scale down and add one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"))]
    pub ttft_slo: Option<String>,
    /// Which percentile of the time to first token `ttftSlo` holds: 95 (default) or 99. 99 matches an objective
    /// stated as "99% of requests within the SLO": the guard then also sees the slowest 1%, which a p95 under the
    /// SLO hides, for about 2% more GPU-hours (`docs/autoscaling.md`). Over a window of under 50 requests it reads
    /// the p95, since a p99 there is one request. Needs `ttftSlo`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 95, max = 99))]
    pub ttft_slo_percentile: Option<u32>,
    /// Inter-token latency objective (p95), e.g. `100ms`: each replica's compute share keeps streaming at least this
    /// fast (with `ttftSlo`, the objective needing the larger share wins). Handed to the running sidecars, so an
    /// edit takes effect within one sync; unset, a replica keeps its `tessera.dev/itl-slo` annotation's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"))]
    pub itl_slo: Option<String>,
    /// How fast to scale: stabilization windows and rate limits (as HPA's `behavior`), and panic mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub behavior: Option<Behavior>,
    /// How the model's replicas use GPUs (whole or shared) and how their memory and compute are sized.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuSpec>,
    /// The Service in front of the model's pods, whose EndpointSlices the activator routes to (default: the
    /// target's name, the usual convention when Deployment and Service share a name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
    /// OpenAI `model` names the activator routes to this workload. Required for scale to zero and for
    /// `requestsPerSecondPerReplica`, which both come from the activator.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub model_names: Vec<String>,
    /// Who writes the target's `/scale`: `Tessera` (default), or `KEDA` — a ScaledObject whose trigger is
    /// Tessera's external scaler scales the workload on Tessera's decision, and Tessera decides, reports and
    /// serves that decision but never writes `/scale` (docs/autoscaling.md, "With KEDA").
    #[serde(default, skip_serializing_if = "ScaledBy::is_tessera")]
    pub scaled_by: ScaledBy,
    /// The workload class whose defaults the policy takes where this spec leaves a knob unset: `auto` (default:
    /// detected from what the workload declares — a Job owner, a Kueue queue, its requests' `service_tier` — and
    /// then from its traffic; `realtime` when unsure), or `realtime`, `nearRealtime`, `batch` to pin it.
    /// `status.policyFromClass` lists which values came from the class (docs/policies.md, "Workload classes").
    #[serde(default, skip_serializing_if = "WorkloadClassSpec::is_auto")]
    pub workload_class: WorkloadClassSpec,
    /// vLLM sleep mode as the way back from zero: at zero, the last replica sleeps on its GPU (its weights in
    /// host memory at level 1, dropped at level 2) instead of going away, where its wake meets the TTFT objective
    /// that a cold start would miss. The server must run with `--enable-sleep-mode` and `VLLM_SERVER_DEV_MODE=1`;
    /// the webhook then gives the sidecar the pod's instruction and points the probes at it (docs/webhook.md,
    /// "Sleep mode"). Off unless set (docs/autoscaling.md, "Sleeping replicas").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sleep: Option<SleepSpec>,
}

/// `spec.sleep`: whether and how the model's replicas sleep at zero.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SleepSpec {
    /// Sleep at zero rather than go (default false).
    #[serde(default)]
    pub enabled: bool,
    /// The sleep level: 1 (weights kept in host memory: a wake copies them back, about a second for a small
    /// model; needs the vLLM container's memory limit to hold a copy of the weights) or 2 (weights dropped: a wake
    /// reloads them from disk). Unset: 2 unless the node's free host memory is known to hold a copy (it is not
    /// read today, so set 1 where the container's limit allows it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 2))]
    pub level: Option<u8>,
    /// Sleep even where a replica's sidecar finds a risky combination (LoRA adapters, tensor parallel, a hybrid
    /// or sliding-window model, a vLLM outside the tested range): vLLM has returned wrong answers after a wake
    /// there. The sidecar still checks every wake with a canary request and restarts the pod on a wrong answer.
    #[serde(default)]
    pub allow_risky: bool,
    /// The wake to plan for until the replicas measured one, e.g. `1s` (without it and without the model's weights
    /// in the sidecar's `--model-dir` to estimate from, a model never sleeps a first time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"))]
    pub expected_wake: Option<String>,
}

impl SleepSpec {
    /// The core's policy.
    pub fn policy(&self) -> tessera_core::sleep::rule::SleepPolicy {
        tessera_core::sleep::rule::SleepPolicy {
            enabled: self.enabled,
            level: self
                .level
                .and_then(tessera_core::sleep::command::SleepLevel::from_u8),
            allow_risky: self.allow_risky,
            // The pattern above admits only what humantime reads.
            expected_wake: self
                .expected_wake
                .as_deref()
                .and_then(|w| humantime::parse_duration(w).ok()),
        }
    }
}

/// `spec.workloadClass`: detected, or pinned to one class.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum WorkloadClassSpec {
    /// Detected: declared signals first, observed second, real-time when unsure.
    #[default]
    Auto,
    /// Someone waits on each token.
    Realtime,
    /// Someone waits on the answer; traffic in bursts.
    NearRealtime,
    /// Nobody waits on one request.
    Batch,
}

impl WorkloadClassSpec {
    fn is_auto(&self) -> bool {
        *self == WorkloadClassSpec::Auto
    }

    /// The pinned class; `None` for `auto`.
    pub fn pinned(self) -> Option<tessera_core::class::WorkloadClass> {
        use tessera_core::class::WorkloadClass;
        match self {
            WorkloadClassSpec::Auto => None,
            WorkloadClassSpec::Realtime => Some(WorkloadClass::Realtime),
            WorkloadClassSpec::NearRealtime => Some(WorkloadClass::NearRealtime),
            WorkloadClassSpec::Batch => Some(WorkloadClass::Batch),
        }
    }
}

/// Who writes an InferenceAutoscaler's target's `/scale` (one owner per `/scale`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum ScaledBy {
    /// Tessera's controller.
    #[default]
    Tessera,
    /// KEDA, through a ScaledObject whose trigger is Tessera's external scaler.
    #[serde(rename = "KEDA")]
    Keda,
}

impl ScaledBy {
    fn is_tessera(&self) -> bool {
        *self == ScaledBy::Tessera
    }

    /// The core's name for it.
    pub fn owner(self) -> tessera_core::keda::ScaleOwner {
        match self {
            ScaledBy::Tessera => tessera_core::keda::ScaleOwner::Tessera,
            ScaledBy::Keda => tessera_core::keda::ScaleOwner::Keda,
        }
    }
}

fn default_min_replicas() -> i32 {
    1
}

/// A reference to the scaled workload, as in HPA.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScaleTargetRef {
    /// API version of the target, e.g. `apps/v1`.
    #[serde(default = "default_api_version")]
    #[schemars(regex(pattern = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?v[0-9]+((alpha|beta)[0-9]+)?$"))]
    pub api_version: String,
    /// Kind of the target, e.g. `Deployment` or `StatefulSet`.
    #[schemars(length(min = 1))]
    pub kind: String,
    /// Name of the target.
    #[schemars(length(min = 1))]
    pub name: String,
}

fn default_api_version() -> String {
    "apps/v1".to_owned()
}

/// Per-replica targets. A replica count is proposed per signal with HPA's rule, and the largest wins.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Targets {
    /// Mean KV cache usage per replica, a fraction in (0, 1], e.g. 0.7. The webhook also passes it to each
    /// pod's sidecar, whose recommended KV cache then holds one max_model_len sequence below it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.01, max = 1.0))]
    pub kv_cache_utilization: Option<f64>,
    /// Mean requests waiting in each replica's queue, e.g. 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.01))]
    pub waiting_requests_per_replica: Option<f64>,
    /// The model's p95 time to first token over all its replicas' requests in the sidecars' latency window, e.g. `800ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"))]
    pub ttft_p95: Option<String>,
    /// Requests per second per replica, from the model's total rate at the activator, e.g. 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.001))]
    pub requests_per_second_per_replica: Option<f64>,
}

/// Scale to zero settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScaleToZero {
    /// Go to zero after this long with no requests and nothing in flight or queued, e.g. `10m`.
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"))]
    pub idle_after: String,
    /// The share of requests that may miss `ttftSlo` by waiting through a cold start, e.g. 0.005 (0.5%). A
    /// model whose cold start (pod start and weights load, measured from its ready pods) is longer than `ttftSlo` keeps
    /// one warm replica instead of going to zero, unless its own traffic over the last day (at least an hour of
    /// it, counted by the controller from the activator) shows that going to zero would have missed no more than
    /// this. Unset: always keep the warm replica. Spend at most part of the attainment goal here: other misses
    /// (bursts, long prompts) count against it too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 0.5))]
    pub cold_start_miss_budget: Option<f64>,
    /// Share `coldStartMissBudget` with the other models of this namespace that name the same group: together
    /// they may miss that share of *their combined* requests through cold starts, and the controller spends it
    /// on the warm replicas that would sit idle longest per missed request (a tool idle for hours and rarely
    /// woken first). A model whose own misses are over the budget may then go to zero while a busier member's
    /// requests leave room for them. Members that declare different budgets share the smallest. Needs
    /// `coldStartMissBudget`. Unset: the budget is this model's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub cold_start_budget_group: Option<String>,
}

/// Scaling speed, as HPA's `behavior`, plus Knative-style panic mode. Unset fields take HPA's defaults.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Behavior {
    /// Rules for adding replicas (default: no window; max(100%, 4 pods) per 15 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_up: Option<ScalingRules>,
    /// Rules for removing replicas (default: 300 s window; 100% per 15 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_down: Option<ScalingRules>,
    /// Panic mode (default on: 6 s window, 60 s stable window, 200% threshold).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub panic: Option<Panic>,
}

/// One direction's scaling rules (HPA `HPAScalingRules`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScalingRules {
    /// Seconds of past recommendations to consider; the most conservative wins (0–3600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 3600))]
    pub stabilization_window_seconds: Option<i32>,
    /// Which policy applies when several are listed: `Max` (largest change, default), `Min`, or `Disabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub select_policy: Option<SelectPolicy>,
    /// Rate limits; unset takes HPA's default for this direction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policies: Option<Vec<RatePolicy>>,
}

/// Which rate policy wins.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum SelectPolicy {
    /// The policy allowing the largest change.
    Max,
    /// The policy allowing the smallest change.
    Min,
    /// No scaling in this direction.
    Disabled,
}

/// A rate limit (HPA `HPAScalingPolicy`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RatePolicy {
    /// `Pods` or `Percent`.
    #[serde(rename = "type")]
    pub kind: RatePolicyKind,
    /// How many pods, or what percent of the replicas at the start of the period (> 0).
    #[schemars(range(min = 1))]
    pub value: i32,
    /// The sliding period in seconds (1–1800).
    #[schemars(range(min = 1, max = 1800))]
    pub period_seconds: i32,
}

/// The unit of a rate limit.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum RatePolicyKind {
    /// An absolute number of pods.
    Pods,
    /// A percentage of current replicas.
    Percent,
}

/// Knative-style panic mode.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Panic {
    /// Set false to turn panic mode off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Seconds over which the panic signal is averaged (default 6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 600))]
    pub window_seconds: Option<i32>,
    /// Seconds without a burst before panic ends and scale-down may resume (default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub stable_window_seconds: Option<i32>,
    /// Panic when demand reaches this percent of the ready replicas (default 200, must be > 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 101, max = 10000))]
    pub threshold_percent: Option<i32>,
}

/// How the model uses GPUs.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct GpuSpec {
    /// `whole` (a GPU per replica, default) or `fractional` (packed with other models on shared GPUs).
    #[serde(default)]
    pub sharing: Sharing,
    /// GPU memory per replica: `auto` (from the sidecar's recommendation, default) or a number of MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("type(self) == string ? self == 'auto' : self > 0")
        .message("gpu.memory must be \"auto\" or a positive number of MiB"))]
    pub memory: Option<IntOrString>,
    /// Compute share per replica: `"auto"` (default) or a fraction in (0, 1] as a quoted string, e.g. `"0.25"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(auto|0?\.[0-9]*[1-9][0-9]*|1(\.0*)?)$"))]
    pub compute_fraction: Option<String>,
    /// When the recommendation is applied: `Off` (status only, default), `Initial` (to new pods), `Recreate`
    /// (also replaces running pods whose allocation drifted).
    #[serde(default)]
    pub update_mode: UpdateMode,
}

/// GPU sharing mode.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Sharing {
    /// One GPU per replica.
    #[default]
    Whole,
    /// A fraction of a shared GPU per replica.
    Fractional,
}

/// When the GPU recommendation is applied to pods.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum UpdateMode {
    /// Report only.
    #[default]
    Off,
    /// Apply to pods as they are created.
    Initial,
    /// Apply to new pods and replace running ones that drifted.
    Recreate,
}

/// `(group, version)` of an `apiVersion`: `group/version` (`apps/v1`), or a core `version` (`v1`) with group `""`.
/// `None` for anything else (empty, `a/b/c`, an empty part).
pub fn group_version(api_version: &str) -> Option<(&str, &str)> {
    match api_version.split_once('/') {
        Some((g, v)) if !g.is_empty() && !v.is_empty() && !v.contains('/') => Some((g, v)),
        None if !api_version.is_empty() => Some(("", api_version)),
        _ => None,
    }
}

/// Parses a Kubernetes-style duration (`500ms`, `30s`, `10m`, `1h30m`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    // The schema pattern accepts exactly the Go units humantime also reads; check the same here so a spec that
    // slipped past a CEL-less API server fails with the same wording.
    let ok = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'm' | 's' | 'h'))
        && s.chars().next().is_some_and(|c| c.is_ascii_digit());
    if !ok {
        return Err(format!(
            "expected digits with units ms, s, m or h (pattern {DURATION_PATTERN})"
        ));
    }
    humantime::parse_duration(s).map_err(|e| e.to_string())
}

/// The CRD manifest as YAML, for `tessera crdgen` and `deploy/crds/inferenceautoscaler.yaml`.
pub fn crdgen() -> Result<String, serde_yaml::Error> {
    let crd = InferenceAutoscaler::crd();
    let yaml = quote_yaml11_booleans(&serde_yaml::to_string(&crd)?);
    Ok(format!(
        "# Generated by `tessera crdgen` from api/src/crd/. Do not edit: regenerate with\n\
         #   cargo run -- crdgen > deploy/crds/inferenceautoscaler.yaml\n{yaml}"
    ))
}

/// serde_yaml writes YAML 1.2, where `Off` is a string; kubectl and most Kubernetes tooling read YAML 1.1, where a
/// plain `Off` (or `on`, `yes`, `n`, ...) is a boolean. Quote such plain scalar values so `updateMode: Off` stays a
/// string everywhere.
fn quote_yaml11_booleans(yaml: &str) -> String {
    const WORDS: [&str; 22] = [
        "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "on", "On", "ON", "off", "Off", "OFF",
        "true", "True", "TRUE", "false", "False", "FALSE",
    ];
    let mut out = String::with_capacity(yaml.len() + 16);
    for line in yaml.lines() {
        let (head, value) = match line.rfind(": ") {
            Some(i) => line.split_at(i + 2),
            None => match line.trim_start().strip_prefix("- ") {
                Some(v) => line.split_at(line.len() - v.len()),
                None => (line, ""),
            },
        };
        // Real booleans (`true`/`false` from a bool field) are left alone; only words that came from strings and
        // would be misread are quoted. serde_yaml already quotes the strings "true"/"false" itself.
        if WORDS.contains(&value) && !matches!(value, "true" | "false") {
            out.push_str(head);
            out.push('\'');
            out.push_str(value);
            out.push('\'');
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests;
