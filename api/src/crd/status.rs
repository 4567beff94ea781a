//! What the controller writes back to an `InferenceAutoscaler`: its status, the allocation in force, and the copy of
//! the cold-start ledger a new leader resumes from.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tessera_core::scale::{self, Timestamp, coldstart};

/// The condition that says the model's replicas hold whole GPUs (`core::scale::isolation`, the round's last step):
/// True while the round isolates it at its ceiling. The controller writes it; the webhook reads it and gives new
/// pods of the model whole GPUs while it is True.
pub const CONDITION_ISOLATED: &str = "Isolated";

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
    /// Sleep mode (`spec.sleep`): the replicas asleep now, and what the round chose at rest and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rest: Option<RestStatus>,
    /// The workload class in force: `realtime`, `nearRealtime` or `batch` (the CLASS column of `kubectl get ias
    /// -o wide`). Its defaults fill the knobs the spec leaves unset (`policyFromClass`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_class: Option<String>,
    /// Why the workload class is what it is, and what the traffic shows when it leans elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_class_reason: Option<String>,
    /// Where the class came from: `pinned` (spec.workloadClass), `declared` (a Job owner, a Kueue queue, the
    /// requests' tier), `observed` (the traffic) or `default` (nothing conclusive: real-time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_class_source: Option<String>,
    /// When the class in force took effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_since: Option<Time>,
    /// The class's policy in words (history, percentile, headroom, cold-start budget, guard, co-tenants, priority).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_policy: Option<String>,
    /// The knobs whose values came from the class rather than the spec (e.g. `scaleToZero.coldStartMissBudget`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policy_from_class: Vec<String>,
    /// The controller's copy of the model's last day of demand, for `scaleToZero.coldStartMissBudget`: a
    /// restarted controller or a new leader resumes from it instead of keeping the warm floor for an hour. Written
    /// at most once a minute, and only when requests arrived or a cold start was measured. Not for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_start_ledger: Option<ColdStartLedgerStatus>,
    /// For the activator's flex lane: this model's pods that share a GPU with other models, each with the worst
    /// TTFT pressure among those neighbours (`tessera_core::lanes::neighbour_pressures`). The activator sends no
    /// batch (flex-tier) request to a pod whose figure is at or above `--lane-neighbour-stop-at`. Absent when no
    /// pod shares a GPU with a model whose pressure is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flex_neighbours: Option<FlexNeighboursStatus>,
}

/// `status.flexNeighbours`: what the flex lane's gate reads of each pod's GPU neighbours.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlexNeighboursStatus {
    /// When the controller read the neighbours' sidecars. The activator ignores figures older than two minutes
    /// (a controller that stopped writing must not close the lane for ever, nor keep it open on old news).
    pub observed_at: Time,
    /// One entry per pod on a shared GPU.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1024))]
    pub pods: Vec<FlexNeighbour>,
}

/// One pod's GPU neighbours, as the flex lane reads them.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlexNeighbour {
    /// The pod's name.
    pub pod: String,
    /// The pod's IP, which is how the activator knows its backends (EndpointSlice addresses).
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "podIP")]
    pub pod_ip: Option<String>,
    /// The worst TTFT p95 over its objective among the other models' pods on the same GPU (1 = at the objective).
    #[schemars(range(min = 0))]
    pub pressure: f64,
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

impl InferenceAutoscalerStatus {
    /// The [`CONDITION_ISOLATED`] condition when it is True: the replicas hold whole GPUs.
    pub fn isolated(&self) -> Option<&Condition> {
        self.conditions
            .iter()
            .find(|c| c.type_ == CONDITION_ISOLATED && c.status == "True")
    }
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

/// `status.rest`: sleep or zero at rest (`core::sleep::rule`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestStatus {
    /// Replicas asleep now (as their sidecars report), counted in `/scale`'s replicas.
    pub sleeping: u32,
    /// At zero the last replica `sleep`s (at `level`) or goes to `zero`.
    pub at_zero: String,
    /// The sleep level, when it sleeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<u8>,
    /// The wake the round counts on, seconds (measured by the sidecars, else estimated from the weights).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wake_seconds: Option<f64>,
    /// A stable code: `sleep_mode_off`, `refused`, `cold_start_meets_objective`, `wake_no_faster`,
    /// `no_sleeper_room`, `alone_on_gpu`, `wake_shortens_cold_start`.
    pub reason: String,
    /// The reason in words.
    pub message: String,
}
