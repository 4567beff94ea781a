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
//! Field names and semantics follow HPA (`autoscaling/v2`) where one exists (`scaleTargetRef`, `minReplicas`,
//! `maxReplicas`, `behavior` with `stabilizationWindowSeconds`, `selectPolicy`, `policies`), so moving from an HPA
//! is a matter of renaming the metrics (see `docs/autoscaling.md`).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tessera_core::scale::{self, Timestamp, coldstart};

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
        description = "Workload class: interactive, batch, bursty, idle or unknown (kubectl get -o wide)"
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

/// What the controller observed and decided.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InferenceAutoscalerStatus {
    /// The spec generation this status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The scaled workload as `Kind/name` (the TARGET column).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Replicas the target had at the last reconcile.
    #[serde(default)]
    pub replicas: i32,
    /// Ready replicas at the last reconcile.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Replicas the controller wants.
    #[serde(default)]
    pub desired_replicas: i32,
    /// When the controller last changed the replica count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_time: Option<Time>,
    /// The signal that asked for the most replicas (the SIGNAL column).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leading_signal: Option<String>,
    /// Why the last decision came out as it did (a stable snake_case label, e.g. `scale_up`, `stabilizing`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_decision_reason: Option<String>,
    /// What held the replica count in the last decision, in the joint policy's words (a stable snake_case label):
    /// `ttft_objective` (the SLO guard), `ttft_target`, `prefill` (the TTFT target over with nothing queued),
    /// `kv_cache`, `queue`, `request_rate`, `burst` (panic mode), `stabilization_window`, `rate_limit`,
    /// `cold_start` (a warm floor: a start from zero would miss the TTFT objective), `min_replicas`,
    /// `max_replicas`, `missing_metrics`, `scale_to_zero` or `none`. The `ScalingActive` message says the rest,
    /// with what the next unit of capacity would cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraint: Option<String>,
    /// Current value, target and proposal of each configured signal.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub current_metrics: Vec<SignalStatus>,
    /// AbleToScale, ScalingActive, ScalingLimited (as HPA) and Valid.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The GPU memory and compute the replicas need, from their sidecars.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recommendation: Option<RecommendationStatus>,
    /// The allocation in force (what the webhook gives new pods under `updateMode: Initial`/`Recreate`), the
    /// candidate settling towards it, and the last roll.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation: Option<AllocationStatus>,
    /// How the model is used, from what its sidecars observed over their window: `interactive` (steady traffic,
    /// a latency objective), `batch` (steady, none), `bursty` (requests in under half of the window), `idle` (none,
    /// or scaled to zero) or `unknown` (the CLASS column of `kubectl get ias -o wide`). For people: no decision
    /// reads it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_class: Option<String>,
    /// Why the workload class is what it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_class_reason: Option<String>,
    /// The controller's copy of the model's last day of demand, for `scaleToZero.coldStartMissBudget`: a
    /// restarted controller or a new leader resumes from it instead of keeping the warm floor for an hour. Written
    /// at most once a minute, and only when requests arrived or a cold start was measured. Not for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_start_ledger: Option<ColdStartLedgerStatus>,
}

/// A compact copy of a model's cold-start ledger (`tessera_core::scale::coldstart::checkpoint`): the syncs a cold
/// start reaches after each would-be wake exactly, the rest in five-minute buckets.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ColdStartLedgerStatus {
    /// The last sync counted, Unix milliseconds.
    #[schemars(range(min = 0))]
    pub taken_at_unix_ms: i64,
    /// The last request the activators had seen then, Unix milliseconds.
    #[schemars(range(min = 0))]
    pub last_request_at_unix_ms: i64,
    /// The activators' request counters then, added up.
    #[schemars(range(min = 0))]
    pub requests_total: i64,
    /// The last cold start measured (creation to Ready of the fastest pod), milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub cold_start_ms: Option<i64>,
    /// Oldest first: `[milliseconds before takenAt, requests]` per sync or bucket, and
    /// `[milliseconds before takenAt, requests, milliseconds the model would have spent at zero before it]` for a
    /// request after an idle spell of `idleAfter` (a cold start the model would have paid at zero).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1024))]
    pub samples: Vec<Vec<i64>>,
}

impl ColdStartLedgerStatus {
    /// The status form of a copy.
    pub fn from_checkpoint(c: &coldstart::LedgerCheckpoint) -> Self {
        let ms = |t: Timestamp| i64::try_from(t.as_millis()).unwrap_or(i64::MAX);
        let dur = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        ColdStartLedgerStatus {
            taken_at_unix_ms: ms(c.taken_at),
            last_request_at_unix_ms: ms(c.last_request_at),
            requests_total: count(c.requests_total),
            cold_start_ms: c.cold_start.map(dur),
            samples: c
                .samples
                .iter()
                .map(|s| {
                    let mut v = vec![dur(c.taken_at.since(s.at)), count(s.requests)];
                    v.extend(s.at_zero.map(dur));
                    v
                })
                .collect(),
        }
    }

    /// The model's state resumed from this copy ([`scale::ScaleState::resume`]), or what is wrong with the copy.
    pub fn resume(&self, now: Timestamp) -> Result<scale::ScaleState, String> {
        let copy = self.to_checkpoint()?;
        scale::ScaleState::resume(&copy, now).map_err(|e| e.to_string())
    }

    /// The copy this status holds, or what is wrong with it (a field edited by hand, or written by another
    /// version).
    pub fn to_checkpoint(&self) -> Result<coldstart::LedgerCheckpoint, String> {
        let non_negative =
            |v: i64, what: &str| u64::try_from(v).map_err(|_| format!("{what} is negative ({v})"));
        let taken_at = Timestamp::from_millis(non_negative(self.taken_at_unix_ms, "takenAtUnixMs")?);
        let samples = self
            .samples
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let field = |j: usize, what: &str| non_negative(v[j], &format!("samples[{i}] {what}"));
                if !(2..=3).contains(&v.len()) {
                    return Err(format!("samples[{i}] has {} numbers, not 2 or 3", v.len()));
                }
                let before = Duration::from_millis(field(0, "milliseconds before takenAt")?);
                Ok(coldstart::CheckpointSample {
                    at: taken_at.minus(before),
                    requests: field(1, "requests")?,
                    at_zero: match v.get(2) {
                        Some(_) => Some(Duration::from_millis(field(2, "milliseconds at zero")?)),
                        None => None,
                    },
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(coldstart::LedgerCheckpoint {
            taken_at,
            last_request_at: Timestamp::from_millis(non_negative(
                self.last_request_at_unix_ms,
                "lastRequestAtUnixMs",
            )?),
            requests_total: non_negative(self.requests_total, "requestsTotal")?,
            cold_start: self
                .cold_start_ms
                .map(|c| non_negative(c, "coldStartMs").map(Duration::from_millis))
                .transpose()?,
            samples,
        })
    }
}

/// One replica's GPU allocation, as written in status.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AllocationValues {
    /// GPU memory per replica, MiB.
    #[serde(rename = "gpuMemoryMiB")]
    pub gpu_memory_mib: i64,
    /// Compute share per replica, 0–1.
    pub compute_fraction: f64,
    /// `--kv-cache-memory-bytes` for vLLM, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_memory_bytes: Option<i64>,
    /// `--gpu-memory-utilization` for vLLM, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_utilization: Option<f64>,
}

/// What is in force, what is settling, and the last roll (`gpu.updateMode`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AllocationStatus {
    /// The allocation new pods get; absent while nothing is in force (no stable recommendation, nothing fixed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_force: Option<AllocationValues>,
    /// Why it is in force (`stable`, `urgent_growth`, `policy_fixed`, `settling`, `no_recommendation`).
    pub reason: String,
    /// The latest recommendation and since when it has been stable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate: Option<AllocationValues>,
    /// When the candidate last moved by more than the tolerance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate_since: Option<Time>,
    /// Since when running pods have drifted from the allocation in force (`Recreate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift_since: Option<Time>,
    /// The hash written on the pod template by the last roll.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_hash: Option<String>,
    /// When the last roll started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_roll_time: Option<Time>,
    /// Why the last roll happened, or why the controller holds (`roll_*` / `hold_*` labels).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roll_reason: Option<String>,
}

/// One signal's state.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SignalStatus {
    /// The signal's spec field name, e.g. `kvCacheUtilization`.
    pub name: String,
    /// Current per-replica value (seconds for TTFT); absent when no replica reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<f64>,
    /// The target (seconds for TTFT).
    pub target: f64,
    /// Replicas this signal alone asks for; absent when it could not be computed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proposed_replicas: Option<i32>,
    /// Replicas whose data went into `current`.
    #[serde(default)]
    pub reporting_replicas: i32,
}

/// GPU sizing for the model's replicas (the largest need across replicas).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecommendationStatus {
    /// KV cache bytes to give vLLM (`--kv-cache-memory-bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_memory_bytes: Option<i64>,
    /// The equivalent `--gpu-memory-utilization`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_utilization: Option<f64>,
    /// GPU memory per replica, MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(rename = "gpuMemoryMiB")]
    pub gpu_memory_mib: Option<i64>,
    /// Compute share per replica, 0–1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_fraction: Option<f64>,
    /// Why, in words.
    pub reason: String,
}

/// Errors turning a spec into a policy.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// One or more fields are invalid; each message names the field and how to fix it.
    #[error("invalid InferenceAutoscaler spec: {}", .0.join("; "))]
    Invalid(Vec<String>),
}

impl InferenceAutoscalerSpec {
    /// Checks everything the schema checks (for API servers without CEL) and what only Rust can check (durations
    /// parse, the policy makes sense). Each message names the field and how to fix it.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        self.to_policy().map(|_| ())
    }

    /// The core policy this spec describes, or every problem found.
    pub fn to_policy(&self) -> Result<scale::ScalePolicy, Vec<String>> {
        let mut errors = Vec::new();
        let min = u32::try_from(self.min_replicas).unwrap_or_else(|_| {
            errors.push(format!("minReplicas must be >= 0, got {}", self.min_replicas));
            0
        });
        let max = u32::try_from(self.max_replicas).unwrap_or_else(|_| {
            errors.push(format!("maxReplicas must be >= 1, got {}", self.max_replicas));
            0
        });
        if self.scale_target_ref.kind.is_empty() || self.scale_target_ref.name.is_empty() {
            errors
                .push("scaleTargetRef needs kind and name, e.g. {kind: Deployment, name: llama}".to_owned());
        }
        let api_version = &self.scale_target_ref.api_version;
        if group_version(api_version).is_none() {
            errors.push(format!(
                "scaleTargetRef.apiVersion {api_version:?} must be group/version (e.g. apps/v1) or a core version (v1)"
            ));
        }
        let mut duration = |field: &str, v: &Option<String>| -> Option<Duration> {
            let s = v.as_deref()?;
            match parse_duration(s) {
                Ok(d) => Some(d),
                Err(e) => {
                    errors.push(format!(
                        "{field} {s:?} is not a duration like 500ms, 30s, 10m: {e}"
                    ));
                    None
                }
            }
        };
        let ttft_target = duration("targets.ttftP95", &self.targets.ttft_p95);
        let ttft_slo = duration("ttftSlo", &self.ttft_slo);
        let idle_after = duration(
            "scaleToZero.idleAfter",
            &self.scale_to_zero.as_ref().map(|s| s.idle_after.clone()),
        );
        if self.targets.ttft_p95.is_some() && ttft_target.is_some_and(|d| d.is_zero()) {
            errors.push("targets.ttftP95 must be more than 0".to_owned());
        }
        let ttft_slo_percentile = match self.ttft_slo_percentile {
            None => scale::SloPercentile::default(),
            Some(n) => {
                if self.ttft_slo.is_none() {
                    errors.push(format!(
                        "ttftSloPercentile {n} needs ttftSlo: it says which percentile the SLO holds (set ttftSlo, \
                         e.g. 2s, or remove ttftSloPercentile)"
                    ));
                }
                scale::SloPercentile::from_number(n).unwrap_or_else(|| {
                    errors.push(format!(
                        "ttftSloPercentile must be 95 or 99 (the percentiles the sidecar reports), got {n}"
                    ));
                    scale::SloPercentile::default()
                })
            }
        };
        if ttft_slo.is_some_and(|d| d.is_zero()) {
            errors.push(
                "ttftSlo must be more than 0 (e.g. 500ms): a zero SLO is breached by every request"
                    .to_owned(),
            );
        }
        if let Some(gpu) = &self.gpu {
            if let Some(m) = &gpu.memory {
                match m {
                    IntOrString::Int(n) if *n <= 0 => errors.push(format!(
                        "gpu.memory must be \"auto\" or a positive number of MiB, got {n}"
                    )),
                    IntOrString::String(s) if s != "auto" => errors.push(format!(
                        "gpu.memory must be \"auto\" or a positive number of MiB (unquoted), got {s:?}"
                    )),
                    _ => {}
                }
            }
            if let Some(cf) = &gpu.compute_fraction
                && cf != "auto"
            {
                match cf.parse::<f64>() {
                    Ok(f) if f > 0.0 && f <= 1.0 => {}
                    _ => errors.push(format!(
                        "gpu.computeFraction must be \"auto\" or a fraction in (0, 1] as a quoted string like \
                         \"0.25\", got {cf:?}"
                    )),
                }
            }
        }
        for (i, name) in self.model_names.iter().enumerate() {
            if name.trim().is_empty() {
                errors.push(format!("modelNames[{i}] is empty"));
            }
        }
        if self.model_names.is_empty() {
            // Same wording as the CEL rules, for API servers without CEL.
            if self.scale_to_zero.is_some() {
                errors.push(
                    "scaleToZero needs modelNames: the activator holds, counts and routes requests by their OpenAI \
                     model name"
                        .to_owned(),
                );
            }
            if self.targets.requests_per_second_per_replica.is_some() {
                errors.push(
                    "targets.requestsPerSecondPerReplica needs modelNames: the activator counts requests by model \
                     name"
                        .to_owned(),
                );
            }
        }
        let behavior = self.behavior.clone().unwrap_or_default();
        let policy = scale::ScalePolicy {
            min_replicas: min,
            max_replicas: max,
            targets: scale::Targets {
                kv_cache_utilization: self.targets.kv_cache_utilization,
                waiting_requests_per_replica: self.targets.waiting_requests_per_replica,
                ttft_p95: ttft_target,
                requests_per_second_per_replica: self.targets.requests_per_second_per_replica,
            },
            tolerance: scale::DEFAULT_TOLERANCE,
            scale_to_zero: idle_after
                .zip(self.scale_to_zero.as_ref())
                .map(|(idle_after, z)| scale::ScaleToZero {
                    idle_after,
                    cold_start_miss_budget: z.cold_start_miss_budget,
                    cold_start_budget_group: z.cold_start_budget_group.clone(),
                }),
            behavior: scale::Behavior {
                scale_up: rules(
                    behavior.scale_up.as_ref(),
                    scale::ScalingRules::default_up(),
                    "scaleUp",
                    &mut errors,
                ),
                scale_down: rules(
                    behavior.scale_down.as_ref(),
                    scale::ScalingRules::default_down(),
                    "scaleDown",
                    &mut errors,
                ),
            },
            panic: panic_mode(behavior.panic.as_ref()),
            ttft_slo,
            ttft_slo_percentile,
            // Set each round by the joint policy from the model's cold start (`core::scale::lookahead`).
            ttft_guard_lead: None,
        };
        // The core's checks carry the same wording as the CEL rules (maxReplicas >= minReplicas, etc.).
        if let Err(core_errors) = policy.validate() {
            for e in core_errors {
                if !errors.contains(&e) {
                    errors.push(e);
                }
            }
        }
        if errors.is_empty() {
            Ok(policy)
        } else {
            Err(errors)
        }
    }
}

fn rules(
    spec: Option<&ScalingRules>,
    default: scale::ScalingRules,
    path: &str,
    errors: &mut Vec<String>,
) -> scale::ScalingRules {
    let Some(spec) = spec else { return default };
    let mut out = default;
    if let Some(w) = spec.stabilization_window_seconds {
        match u64::try_from(w) {
            Ok(w) => out.stabilization_window = Duration::from_secs(w),
            Err(_) => errors.push(format!(
                "behavior.{path}.stabilizationWindowSeconds must be >= 0, got {w}"
            )),
        }
    }
    if let Some(p) = spec.select_policy {
        out.select_policy = match p {
            SelectPolicy::Max => scale::SelectPolicy::Max,
            SelectPolicy::Min => scale::SelectPolicy::Min,
            SelectPolicy::Disabled => scale::SelectPolicy::Disabled,
        };
    }
    if let Some(policies) = &spec.policies {
        out.policies = policies
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                let value = u32::try_from(p.value).ok().filter(|v| *v > 0);
                let period = u64::try_from(p.period_seconds).ok().filter(|v| *v > 0);
                match (value, period) {
                    (Some(value), Some(period)) => Some(scale::RatePolicy {
                        kind: match p.kind {
                            RatePolicyKind::Pods => scale::RatePolicyKind::Pods,
                            RatePolicyKind::Percent => scale::RatePolicyKind::Percent,
                        },
                        value,
                        period: Duration::from_secs(period),
                    }),
                    _ => {
                        errors.push(format!(
                            "behavior.{path}.policies[{i}] needs value > 0 and periodSeconds in 1..=1800"
                        ));
                        None
                    }
                }
            })
            .collect();
    }
    out
}

fn panic_mode(spec: Option<&Panic>) -> Option<scale::PanicMode> {
    let default = scale::PanicMode::default();
    let Some(p) = spec else { return Some(default) };
    if p.enabled == Some(false) {
        return None;
    }
    let secs = |v: Option<i32>, d: Duration| {
        v.and_then(|s| u64::try_from(s).ok())
            .map_or(d, Duration::from_secs)
    };
    Some(scale::PanicMode {
        window: secs(p.window_seconds, default.window),
        stable_window: secs(p.stable_window_seconds, default.stable_window),
        threshold: p
            .threshold_percent
            .map_or(default.threshold, |t| f64::from(t) / 100.0),
    })
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
pub fn crdgen() -> anyhow::Result<String> {
    let crd = InferenceAutoscaler::crd();
    let yaml = quote_yaml11_booleans(&serde_yaml::to_string(&crd)?);
    Ok(format!(
        "# Generated by `tessera crdgen` from autoscaler/src/crd.rs. Do not edit: regenerate with\n\
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
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn spec(yaml: &str) -> InferenceAutoscalerSpec {
        serde_yaml::from_str(yaml).unwrap()
    }

    const GOOD: &str = r#"
scaleTargetRef: {kind: Deployment, name: llama}
minReplicas: 0
maxReplicas: 8
targets: {kvCacheUtilization: 0.7, waitingRequestsPerReplica: 2, ttftP95: 800ms, requestsPerSecondPerReplica: 5}
scaleToZero: {idleAfter: 10m}
ttftSlo: 2s
behavior:
  scaleDown:
    stabilizationWindowSeconds: 120
    policies: [{type: Pods, value: 1, periodSeconds: 60}]
  panic: {thresholdPercent: 300}
gpu: {sharing: fractional, memory: 10240, computeFraction: "0.25", updateMode: Initial}
modelNames: [meta-llama/Llama-3.1-8B-Instruct]
"#;

    #[test]
    fn committed_crd_matches_generated() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../deploy/crds/inferenceautoscaler.yaml"
        );
        let committed = std::fs::read_to_string(path).unwrap();
        assert!(
            committed == crdgen().unwrap(),
            "deploy/crds/inferenceautoscaler.yaml is stale: run 'cargo run -- crdgen > deploy/crds/inferenceautoscaler.yaml'"
        );
    }

    #[test]
    fn crd_has_names_columns_status_and_rules() {
        let crd = InferenceAutoscaler::crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("inferenceautoscalers.tessera.dev")
        );
        assert_eq!(crd.spec.names.short_names, Some(vec!["ias".to_owned()]));
        assert_eq!(crd.spec.scope, "Namespaced");
        let v = &crd.spec.versions[0];
        assert_eq!(v.name, "v1alpha1");
        assert!(v.subresources.as_ref().unwrap().status.is_some());
        let cols: Vec<_> = v
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(
            cols,
            [
                "Target", "Min", "Max", "Replicas", "Desired", "Signal", "Held-By", "GPU-MiB", "Compute",
                "KV-Bytes", "Sharing", "Class", "Update", "Age"
            ]
        );
        // The recommendation, the sharing mode and the workload class show with `kubectl get ias -o wide` only.
        let wide: Vec<_> = v
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .filter(|c| c.priority == Some(1))
            .map(|c| c.json_path.as_str())
            .collect();
        assert_eq!(
            wide,
            [
                ".status.constraint",
                ".status.recommendation.gpuMemoryMiB",
                ".status.recommendation.computeFraction",
                ".status.recommendation.kvCacheMemoryBytes",
                ".spec.gpu.sharing",
                ".status.workloadClass",
                ".spec.gpu.updateMode"
            ]
        );
        let json = serde_json::to_string(&crd).unwrap();
        assert!(json.contains("maxReplicas must be >= minReplicas"));
        assert!(json.contains("minReplicas 0 requires scaleToZero"));
        assert!(
            json.contains("duration(self.ttftSlo) > duration('0s')"),
            "ttftSlo: 0s is refused by the API"
        );
        assert!(json.contains("self.ttftSloPercentile in [95, 99]"));
        assert!(json.contains("x-kubernetes-int-or-string"));
        // YAML 1.1 readers (kubectl) would turn a plain Off into false.
        let yaml = crdgen().unwrap();
        assert!(
            yaml.contains("default: 'Off'") && yaml.contains("- 'Off'"),
            "{yaml}"
        );
        assert!(!yaml.lines().any(|l| l.ends_with(": Off") || l.ends_with("- Off")));
    }

    /// The status form of a ledger's copy reads back as the same copy, stays small at its longest (it is rewritten
    /// up to once a minute, and every watcher of the object receives it), and names what is wrong with one edited
    /// by hand.
    #[test]
    fn a_ledger_copy_round_trips_through_status_and_stays_small() {
        use tessera_core::scale::coldstart::{CheckpointSample, LedgerCheckpoint, checkpoint};
        // The longest copy: a day of entries a minute and a half apart, every fourth a wake after a long spell,
        // requests in the thousands.
        let taken_at = Timestamp::from_millis(1_800_000_000_000);
        let n = checkpoint::MAX_SAMPLES as u64;
        let copy = LedgerCheckpoint {
            taken_at,
            last_request_at: taken_at.minus(Duration::from_secs(40)),
            requests_total: 987_654_321,
            cold_start: Some(Duration::from_millis(28_250)),
            samples: (0..n)
                .map(|i| CheckpointSample {
                    at: taken_at.minus(Duration::from_millis((n - i) * 84_375)),
                    requests: 1_000 + i,
                    at_zero: (i % 4 == 0).then(|| Duration::from_millis(3_600_000 + i)),
                })
                .collect(),
        };
        let status = ColdStartLedgerStatus::from_checkpoint(&copy);
        let json = serde_json::to_string(&status).unwrap();
        assert!(json.len() < 24 * 1024, "{} bytes", json.len());
        let back: ColdStartLedgerStatus = serde_json::from_str(&json).unwrap();
        assert_eq!(back.to_checkpoint().unwrap(), copy);
        let mut edited = back.clone();
        edited.samples[2] = vec![5, -1];
        assert_eq!(
            edited.to_checkpoint().unwrap_err(),
            "samples[2] requests is negative (-1)"
        );
        edited.samples[2] = vec![5];
        assert_eq!(
            edited.to_checkpoint().unwrap_err(),
            "samples[2] has 1 numbers, not 2 or 3"
        );
    }

    #[test]
    fn a_full_spec_becomes_a_policy() {
        let s = spec(GOOD);
        assert_eq!(s.scale_target_ref.api_version, "apps/v1");
        let p = s.to_policy().unwrap();
        assert_eq!((p.min_replicas, p.max_replicas), (0, 8));
        let zero = p.scale_to_zero.clone().unwrap();
        assert_eq!(zero.idle_after, Duration::from_secs(600));
        assert_eq!(zero.cold_start_miss_budget, None);
        assert_eq!(zero.cold_start_budget_group, None);
        let grouped = spec(&GOOD.replace(
            "scaleToZero: {idleAfter: 10m}",
            "scaleToZero: {idleAfter: 10m, coldStartMissBudget: 0.005, coldStartBudgetGroup: batch-tools}",
        ));
        assert_eq!(
            grouped
                .to_policy()
                .unwrap()
                .scale_to_zero
                .unwrap()
                .cold_start_budget_group
                .as_deref(),
            Some("batch-tools")
        );
        // A group without a budget, and a name no label could carry, are refused with the field named.
        for (bad, says) in [
            (
                "{idleAfter: 10m, coldStartBudgetGroup: tools}",
                "needs scaleToZero.coldStartMissBudget",
            ),
            (
                "{idleAfter: 10m, coldStartMissBudget: 0.01, coldStartBudgetGroup: Batch_Tools}",
                "scaleToZero.coldStartBudgetGroup must be 1-63 lowercase letters",
            ),
        ] {
            let err = spec(&GOOD.replace("scaleToZero: {idleAfter: 10m}", &format!("scaleToZero: {bad}")))
                .to_policy()
                .unwrap_err()
                .join("; ");
            assert!(err.contains(says), "{err}");
        }
        let budgeted = spec(&GOOD.replace(
            "scaleToZero: {idleAfter: 10m}",
            "scaleToZero: {idleAfter: 10m, coldStartMissBudget: 0.005}",
        ));
        assert_eq!(
            budgeted
                .to_policy()
                .unwrap()
                .scale_to_zero
                .unwrap()
                .cold_start_miss_budget,
            Some(0.005)
        );
        assert_eq!(p.targets.ttft_p95, Some(Duration::from_millis(800)));
        assert_eq!(p.ttft_slo, Some(Duration::from_secs(2)));
        assert_eq!(p.ttft_slo_percentile, scale::SloPercentile::P95);
        let p99 = spec(&GOOD.replace("ttftSlo: 2s", "ttftSlo: 2s\nttftSloPercentile: 99"));
        assert_eq!(
            p99.to_policy().unwrap().ttft_slo_percentile,
            scale::SloPercentile::P99
        );
        assert_eq!(
            p.behavior.scale_down.stabilization_window,
            Duration::from_secs(120)
        );
        assert_eq!(p.behavior.scale_down.policies.len(), 1);
        // Unset direction keeps HPA's defaults.
        assert_eq!(p.behavior.scale_up, scale::ScalingRules::default_up());
        assert_eq!(p.panic.unwrap().threshold, 3.0);
        assert_eq!(s.model_names, ["meta-llama/Llama-3.1-8B-Instruct"]);
    }

    #[test]
    fn nonsense_is_rejected_with_clear_messages() {
        let cases = [
            (
                "scaleTargetRef: {kind: Deployment, name: a}\nminReplicas: 3\nmaxReplicas: 2",
                "maxReplicas (2) must be >= minReplicas (3)",
            ),
            (
                "scaleTargetRef: {kind: Deployment, name: a}\nminReplicas: 0\nmaxReplicas: 2",
                "minReplicas 0 requires scaleToZero",
            ),
            (
                "scaleTargetRef: {kind: Deployment, name: a}\nmaxReplicas: 2\ntargets: {kvCacheUtilization: 1.5}",
                "kvCacheUtilization is a fraction",
            ),
            (
                "scaleTargetRef: {kind: Deployment, name: a}\nmaxReplicas: 2\ntargets: {ttftP95: soon}",
                "targets.ttftP95 \"soon\" is not a duration",
            ),
            (
                "scaleTargetRef: {kind: Deployment, name: a}\nmaxReplicas: 2\ngpu: {computeFraction: \"1.5\"}",
                "gpu.computeFraction must be",
            ),
            (
                "scaleTargetRef: {kind: Deployment, name: a}\nmaxReplicas: 2\ngpu: {memory: lots}",
                "gpu.memory must be",
            ),
            (
                "scaleTargetRef: {kind: Deployment, name: a}\nmaxReplicas: 2\nbehavior: {scaleUp: {policies: [{type: Pods, value: 0, periodSeconds: 15}]}}",
                "behavior.scaleUp.policies[0]",
            ),
            (
                "scaleTargetRef: {apiVersion: apps/v1/x, kind: Deployment, name: a}\nmaxReplicas: 2",
                "scaleTargetRef.apiVersion \"apps/v1/x\" must be group/version",
            ),
            (
                "scaleTargetRef: {kind: Deployment, name: a}\nminReplicas: 0\nmaxReplicas: 2\nscaleToZero: {idleAfter: 5m}",
                "scaleToZero needs modelNames",
            ),
            (
                "scaleTargetRef: {kind: Deployment, name: a}\nmaxReplicas: 2\ntargets: {requestsPerSecondPerReplica: 3}",
                "targets.requestsPerSecondPerReplica needs modelNames",
            ),
            (
                "scaleTargetRef: {kind: Deployment, name: a}\nmaxReplicas: 2\nttftSlo: 0s",
                "ttftSlo must be more than 0",
            ),
            (
                "scaleTargetRef: {kind: Deployment, name: a}\nmaxReplicas: 2\nttftSlo: 2s\nttftSloPercentile: 90",
                "ttftSloPercentile must be 95 or 99",
            ),
            (
                "scaleTargetRef: {kind: Deployment, name: a}\nmaxReplicas: 2\nttftSloPercentile: 99",
                "ttftSloPercentile 99 needs ttftSlo",
            ),
            (
                "scaleTargetRef: {kind: Deployment, name: a}\nminReplicas: 0\nmaxReplicas: 2\nmodelNames: [m]\nscaleToZero: {idleAfter: 5m, coldStartMissBudget: 0.7}",
                "scaleToZero.coldStartMissBudget is a share of requests in [0, 0.5]",
            ),
        ];
        for (yaml, want) in cases {
            let errors = spec(yaml).validate().unwrap_err();
            assert!(
                errors.iter().any(|e| e.contains(want)),
                "{yaml}: {errors:?} lacks {want:?}"
            );
        }
    }

    /// Every InferenceAutoscaler in `deploy/examples/` and `e2e/model.yaml` parses and passes validation (other
    /// kinds are skipped).
    #[test]
    fn examples_are_valid() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/examples");
        let e2e = std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../e2e/model.yaml"));
        let mut seen = 0;
        let paths = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .chain(std::iter::once(e2e));
        for path in paths {
            if path.extension().is_none_or(|e| e != "yaml") {
                continue;
            }
            // The e2e model is a template; fill its placeholders as the e2e test does.
            let text = std::fs::read_to_string(&path)
                .unwrap()
                .replace("${NAMESPACE}", "e2e")
                .replace("${IMAGE}", "img");
            for doc in serde_yaml::Deserializer::from_str(&text) {
                let value = serde_yaml::Value::deserialize(doc).unwrap();
                if value.get("kind").and_then(|k| k.as_str()) != Some("InferenceAutoscaler") {
                    continue;
                }
                let ias: InferenceAutoscaler =
                    serde_yaml::from_value(value).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                if let Err(errors) = ias.spec.validate() {
                    panic!("{}: {errors:?}", path.display());
                }
                seen += 1;
            }
        }
        assert!(seen >= 4, "expected the examples in {dir} and the e2e manifests");
    }

    #[test]
    fn durations_parse_like_kubernetes() {
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert!(parse_duration("5 minutes").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn status_serializes_camel_case() {
        let st = InferenceAutoscalerStatus {
            desired_replicas: 3,
            recommendation: Some(RecommendationStatus {
                gpu_memory_mib: Some(10240),
                ..Default::default()
            }),
            ..Default::default()
        };
        let v = serde_json::to_value(&st).unwrap();
        assert_eq!(v["desiredReplicas"], 3);
        assert_eq!(v["recommendation"]["gpuMemoryMiB"], 10240);
    }
}
