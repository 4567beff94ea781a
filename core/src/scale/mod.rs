//! Replica decisions: the HPA replacement for model servers, including scale to zero and back.
//!
//! [`decide`] answers "how many replicas should this model have right now?" from what was observed
//! ([`ScaleInput`]), the user's policy ([`ScalePolicy`]), the history the caller keeps ([`ScaleState`]) and the
//! time it is ([`Timestamp`]). It never reads a clock and does no I/O, so the controller and the what-if simulator run
//! exactly the same rules; the simulator just passes virtual time.
//!
//! The rules, in the order `decide` applies them, each anchored to the system whose behaviour it copies:
//! 1. **Per-signal proposal** — Kubernetes HPA's replica calculator: `ceil(ready × value / target)`, no change while
//!    `|value/target − 1| ≤ tolerance` (default 0.1). Replicas whose data is missing or stale count as 100% of target
//!    when the others say "scale down" and 0% when they say "scale up", so missing data never causes a scale-down.
//!    Pods that are not ready yet count as 0% on the way up. See `scale/ratio.rs`.
//!    A `ttftP95` target over while the time is prefill, not a queue (the window's queue time under the TTFT's
//!    excess, nothing waiting: [`cause`]), asks for no replica: its proposal is held at the current count.
//! 2. **Maximum over signals**; if any configured signal could not be computed at all, no scale-down this round
//!    (HPA skips scale-down when a metric fails).
//! 3. **TTFT SLO guard**: when a fresh replica's p95 (or p99: [`SloPercentile`]) time to first token is over
//!    `ttft_slo`, ask for one more replica and never scale down; while replicas asked for earlier are still
//!    starting (`current > ready`), hold instead of asking again. The guard's own step never enters panic mode. The caller should feed it a p95 over a
//!    window about as long as its sync period (the sidecar's `recent` window), not the recommendation's 10 minutes.
//! 4. **Scale to zero** only when the policy allows it (`min_replicas == 0` and `scale_to_zero` set), nothing has
//!    arrived for `idle_after`, and nothing is in flight or queued anywhere. **From zero**, any demand gives at least
//!    one replica at once, with no stabilization on the way up.
//! 5. **Panic mode** (Knative's KPA): when the proposal reaches `threshold` (200%) of the ready replicas, scale up at
//!    once (skipping the scale-up window and rate limit) and never scale down until a stable window (60 s) passes
//!    without panic.
//! 6. **Stabilization windows** (HPA `behavior`): the scale-up result is the lowest recommendation within the up window
//!    (default 0 s), the scale-down result the highest within the down window (default 300 s).
//! 7. **Rate limits** (HPA `behavior` policies): up by max(100%, 4 pods) per 15 s, down by 100% per 15 s by default.
//! 8. **Clamp** to `[min_replicas, max_replicas]`.
//!
//! The controller and the simulator reach `decide` the same way: [`inputs::scale_input`] turns the documents the
//! sidecars and the activator serve into the [`ScaleInput`], and [`joint::decide`] applies the joint policy
//! (who owns the latency target, warm floors for slow cold starts, and when a `coldStartMissBudget` lets one go,
//! from the day of demand [`coldstart`] counts) before calling it; [`constraint::Constraint::of`] names what held
//! the result (`status.constraint`, the simulator's `held_by`).
//!
//! The caller keeps one [`ScaleState`] per model and starts each round with [`joint::round`], which counts the
//! round's demand into the model's cold-start ledger, resolves its cold start (remembered for rounds at zero) and
//! keeps the claim a budget group's members read ([`ScaleState::claim`], [`coldstart::group`]); a model in a group
//! passes its namespace's other models' last claims. The caller then calls [`ScaleState::record`] with each decision
//! it acts on. Losing the state is safe: it only
//! restarts the windows, so a scale-down waits a full window again, and a warm floor that a budget had let go comes
//! back until an hour of demand is counted again.

mod behavior;
pub mod cause;
pub mod coldstart;
pub mod constraint;
pub mod inputs;
pub mod isolation;
pub mod joint;
pub mod lookahead;
mod objective;
mod ratio;
mod state;
pub use state::{Recommendation, ScaleEvent, ScaleState};
#[cfg(test)]
mod tests;

use std::fmt;
use std::time::Duration;

pub use behavior::{Behavior, RatePolicy, RatePolicyKind, ScalingRules, SelectPolicy};

/// HPA's default tolerance: no change while the usage ratio is within ±10% of 1
/// (`--horizontal-pod-autoscaler-tolerance`, kube-controller-manager).
pub const DEFAULT_TOLERANCE: f64 = 0.1;

/// A point in time, in milliseconds since an arbitrary epoch chosen by the caller.
///
/// The controller uses milliseconds since the Unix epoch; the simulator uses milliseconds since the start of the trace.
/// Only differences between timestamps matter, so any epoch works as long as one [`ScaleState`] sees one epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// The timestamp `millis` milliseconds after the epoch.
    pub const fn from_millis(millis: u64) -> Self {
        Self(millis)
    }

    /// Milliseconds since the epoch.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// How long after `earlier` this is; zero when `earlier` is later (clocks that step back never panic).
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }

    /// Whether this is less than `window` before `now` (HPA's "after the cutoff"); a zero window holds nothing.
    pub fn is_within(self, window: Duration, now: Timestamp) -> bool {
        now.since(self) < window
    }

    /// The timestamp `d` before this one, saturating at the epoch.
    pub fn minus(self, d: Duration) -> Timestamp {
        Timestamp(self.0.saturating_sub(duration_millis(d)))
    }

    /// The timestamp `d` after this one, saturating at the end of time.
    pub fn plus(self, d: Duration) -> Timestamp {
        Timestamp(self.0.saturating_add(duration_millis(d)))
    }
}

fn duration_millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What the user asked for: bounds, targets, and how fast to move.
#[derive(Debug, Clone, PartialEq)]
pub struct ScalePolicy {
    /// Lowest replica count. 0 only together with [`ScalePolicy::scale_to_zero`].
    pub min_replicas: u32,
    /// Highest replica count (≥ `min_replicas`, ≥ 1).
    pub max_replicas: u32,
    /// The signals to scale on, each with its per-replica target. All unset means "only scale to/from zero".
    pub targets: Targets,
    /// No change while `|value/target − 1|` is within this (HPA default 0.1).
    pub tolerance: f64,
    /// Scale to zero after this long without requests. Requires `min_replicas == 0`.
    pub scale_to_zero: Option<ScaleToZero>,
    /// Stabilization windows and rate limits, as HPA's `behavior`.
    pub behavior: Behavior,
    /// Knative-style panic mode; `None` disables it.
    pub panic: Option<PanicMode>,
    /// Time-to-first-token service level: the p95 (or `ttft_slo_percentile`) over it on any fresh replica blocks
    /// scale-down and asks for one more.
    pub ttft_slo: Option<Duration>,
    /// Which percentile of the time to first token the SLO guard holds under `ttft_slo` (p95 unless asked).
    pub ttft_slo_percentile: SloPercentile,
    /// How far ahead the TTFT SLO guard looks ([`lookahead`]): the time a replica asked for now takes to serve.
    /// The joint policy sets it from the model's cold start ([`joint::replica_policy`]); `None` reads the p95 as it
    /// is.
    pub ttft_guard_lead: Option<Duration>,
}

impl Default for ScalePolicy {
    /// One to ten replicas, no targets, HPA's tolerance and behavior, Knative's panic mode, no scale to zero.
    fn default() -> Self {
        Self {
            min_replicas: 1,
            max_replicas: 10,
            targets: Targets::default(),
            tolerance: DEFAULT_TOLERANCE,
            scale_to_zero: None,
            behavior: Behavior::default(),
            panic: Some(PanicMode::default()),
            ttft_slo: None,
            ttft_slo_percentile: SloPercentile::P95,
            ttft_guard_lead: None,
        }
    }
}

/// First tokens a window must hold before a guard on the p99 reads its p99 ([`SloPercentile::for_window`]). It is
/// the look-ahead's own gate ([`lookahead::MIN_FIRST_TOKENS`]) on purpose: the trend takes a sample only over as
/// many, so under a p99 guard every sample it keeps is a p99, and a slope never comes from a p95 followed by a p99.
pub const P99_MIN_FIRST_TOKENS: f64 = lookahead::MIN_FIRST_TOKENS;

/// The percentile of the model's time to first token that the SLO guard holds under `ttft_slo`
/// (`ttftSloPercentile`).
///
/// p95 by default, as HPA-style latency targets usually are. p99 is for an objective stated as "99% of requests
/// within the SLO": a p95 can sit under the objective while the slowest 1% miss it, and the guard never sees them.
/// Measured in the simulator over seeds 1–48 of the default scenario: GPU-hours ×1.018 (median of the per-seed
/// ratios), attainment +0.11 points (median), worst seed 99.12% instead of 99.01%; the quiet mix and the day of
/// tools do not move (`docs/simulator-experiments.md`, "A guard on the p99").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SloPercentile {
    /// The 95th percentile.
    #[default]
    P95,
    /// The 99th percentile.
    P99,
}

impl SloPercentile {
    /// The number a user writes for it (95 or 99).
    pub fn number(self) -> u32 {
        match self {
            Self::P95 => 95,
            Self::P99 => 99,
        }
    }

    /// From the number a user writes (95 or 99); `None` for any other, which the sidecar does not report.
    pub fn from_number(n: u32) -> Option<Self> {
        match n {
            95 => Some(Self::P95),
            99 => Some(Self::P99),
            _ => None,
        }
    }

    /// The percentile the guard reads over a window that holds `first_tokens` (all fresh replicas together;
    /// `None` when unknown, i.e. sidecars too old to send buckets): a p99 only over at least
    /// [`P99_MIN_FIRST_TOKENS`], the p95 below that. Over a few dozen requests the p99 is the minute's slowest
    /// request: read ungated, it held 14% more GPU-hours on the quiet mix (a few requests a minute per model) for
    /// 0.03 points of attainment.
    pub fn for_window(self, first_tokens: Option<f64>) -> Self {
        match (self, first_tokens) {
            (Self::P99, Some(n)) if n < P99_MIN_FIRST_TOKENS => Self::P95,
            (p, _) => p,
        }
    }

    /// The quantile, for a histogram.
    pub fn quantile(self) -> f64 {
        match self {
            Self::P95 => 0.95,
            Self::P99 => 0.99,
        }
    }

    /// `p95` or `p99`, for messages and status.
    pub fn label(self) -> &'static str {
        match self {
            Self::P95 => "p95",
            Self::P99 => "p99",
        }
    }

    /// This percentile of one replica's signals. A replica that reports no p99 (a sidecar that does not send
    /// it) gives its p95: a guard asked to be stricter never ends up with no guard.
    pub fn of(self, r: &ReplicaSignals) -> Option<Duration> {
        match self {
            Self::P95 => r.ttft_p95,
            Self::P99 => r.ttft_p99.or(r.ttft_p95),
        }
    }
}

impl ScalePolicy {
    /// The percentile the SLO guard and its look-ahead read this round: the policy's, over the first tokens the
    /// round's windows hold ([`SloPercentile::for_window`]).
    pub fn guard_percentile(&self, input: &ScaleInput) -> SloPercentile {
        self.ttft_slo_percentile.for_window(input.ttft_window_count)
    }

    /// Whether the model keeps a day-long cold-start ledger: only with a `coldStartMissBudget`, its one reader
    /// ([`coldstart`]), so a model without one keeps no day of samples (and no copy of them).
    pub fn keeps_cold_start_ledger(&self) -> bool {
        self.scale_to_zero
            .as_ref()
            .is_some_and(|z| z.cold_start_miss_budget.is_some())
    }

    /// Checks the policy for values no decision can be made with; each message names the field and the fix.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let mut errors = Vec::new();
        if self.max_replicas == 0 {
            errors.push("maxReplicas must be at least 1".to_owned());
        }
        if self.max_replicas < self.min_replicas {
            errors.push(format!(
                "maxReplicas ({}) must be >= minReplicas ({})",
                self.max_replicas, self.min_replicas
            ));
        }
        if self.min_replicas == 0 && self.scale_to_zero.is_none() {
            errors.push(
                "minReplicas 0 requires scaleToZero (set scaleToZero.idleAfter, or minReplicas >= 1)"
                    .to_owned(),
            );
        }
        if let Some(b) = self.scale_to_zero.as_ref().and_then(|z| z.cold_start_miss_budget)
            && !coldstart::is_miss_budget(b)
        {
            errors.push(format!(
                "scaleToZero.coldStartMissBudget is a share of requests in [0, 0.5] (0.005 = 0.5%), got {b}"
            ));
        }
        if let Some(z) = &self.scale_to_zero
            && let Some(g) = &z.cold_start_budget_group
        {
            if z.cold_start_miss_budget.is_none() {
                errors.push(format!(
                    "scaleToZero.coldStartBudgetGroup '{g}' needs scaleToZero.coldStartMissBudget: the group shares \
                     that budget"
                ));
            }
            if !coldstart::is_group_name(g) {
                errors.push(format!(
                    "scaleToZero.coldStartBudgetGroup must be 1-63 lowercase letters, digits or '-', starting and \
                     ending with a letter or digit (like a label value), got '{g}'"
                ));
            }
        }
        if !(self.tolerance.is_finite() && (0.0..1.0).contains(&self.tolerance)) {
            errors.push(format!("tolerance must be in [0, 1), got {}", self.tolerance));
        }
        for (signal, target) in self.targets.iter() {
            if !(target.is_finite() && target > 0.0) {
                errors.push(format!(
                    "targets.{} must be a positive number, got {target}",
                    signal.field()
                ));
            }
        }
        if let Some(kv) = self.targets.kv_cache_utilization
            && kv > 1.0
        {
            errors.push(format!(
                "targets.kvCacheUtilization is a fraction in (0, 1], got {kv}"
            ));
        }
        if let Some(p) = &self.panic
            && !(p.threshold.is_finite() && p.threshold > 1.0)
        {
            errors.push(format!(
                "panic threshold must be > 1 (2.0 means 200%), got {}",
                p.threshold
            ));
        }
        errors.extend(self.behavior.validate());
        if errors.is_empty() { Ok(()) } else { Err(errors) }
    }

    /// The lowest replica count while the model is not idle: scale to zero is a separate, explicit decision.
    fn active_floor(&self) -> u32 {
        self.min_replicas.max(1)
    }

    /// How long decisions must be remembered for every window and rate-limit period to see them.
    fn history_horizon(&self) -> Duration {
        let mut h = self.behavior.horizon();
        if let Some(p) = &self.panic {
            h = h.max(p.window).max(p.stable_window);
        }
        h
    }
}

/// Per-replica targets, one per signal. A signal with no target is not used.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Targets {
    /// Mean KV cache usage, a 0–1 fraction (vLLM `kv_cache_usage_perc`).
    pub kv_cache_utilization: Option<f64>,
    /// Mean requests waiting in each replica's queue (vLLM `num_requests_waiting`).
    pub waiting_requests_per_replica: Option<f64>,
    /// The model's p95 time to first token over its replicas' requests (pooled, `inputs::pooled_ttft`).
    pub ttft_p95: Option<Duration>,
    /// Requests per second per replica, from the model's total request rate (the activator counts it).
    pub requests_per_second_per_replica: Option<f64>,
}

impl Targets {
    /// The configured signals and their targets (TTFT in seconds).
    pub fn iter(&self) -> impl Iterator<Item = (Signal, f64)> + '_ {
        [
            (Signal::KvCacheUtilization, self.kv_cache_utilization),
            (
                Signal::WaitingRequestsPerReplica,
                self.waiting_requests_per_replica,
            ),
            (Signal::TtftP95, self.ttft_p95.map(|d| d.as_secs_f64())),
            (
                Signal::RequestsPerSecondPerReplica,
                self.requests_per_second_per_replica,
            ),
        ]
        .into_iter()
        .filter_map(|(s, t)| t.map(|t| (s, t)))
    }
}

/// Scale to zero settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ScaleToZero {
    /// How long without any request (and with nothing in flight or queued) before going to zero.
    pub idle_after: Duration,
    /// The share of requests (0–0.5) that may miss the TTFT objective by waiting through a cold start. A model
    /// whose cold start is longer than its objective keeps a warm replica ([`joint::WarmFloor`]) unless its own
    /// traffic over the last day shows that going to zero misses no more than this ([`coldstart`]). `None`:
    /// always keep the floor.
    pub cold_start_miss_budget: Option<f64>,
    /// A group of models (in one namespace) that share the budget: together they may miss the budget's share of
    /// their combined requests, spent on the floors that would sit idle longest per miss ([`coldstart::group`]).
    /// `None`: the budget is the model's own.
    pub cold_start_budget_group: Option<String>,
}

impl ScaleToZero {
    /// Scale to zero after `idle_after`, with no cold-start miss budget.
    pub fn after(idle_after: Duration) -> Self {
        Self {
            idle_after,
            cold_start_miss_budget: None,
            cold_start_budget_group: None,
        }
    }
}

/// Knative KPA's panic mode: react at once to a burst, then hold.
///
/// Defaults follow Knative Serving: `panic-window-percentage` 10% of a 60 s stable window (6 s) and
/// `panic-threshold-percentage` 200%.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PanicMode {
    /// Recommendations within this window are averaged for the panic decision (when the caller ticks faster than it).
    pub window: Duration,
    /// Panic ends once this long passes without the panic condition; until then, no scale-down.
    pub stable_window: Duration,
    /// Panic when the proposal is at least this multiple of the ready replicas (2.0 = 200%).
    pub threshold: f64,
}

impl Default for PanicMode {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(6),
            stable_window: Duration::from_secs(60),
            threshold: 2.0,
        }
    }
}

/// What was observed about the model: its replicas and its demand.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScaleInput {
    /// Replicas the target asks for now (`/scale` `spec.replicas`).
    pub current_replicas: u32,
    /// Replicas that are ready (`/scale` `status.replicas` counts all; the controller counts ready pods).
    pub ready_replicas: u32,
    /// One entry per ready replica, with what its sidecar reported (or `fresh: false` when it could not be read).
    pub replicas: Vec<ReplicaSignals>,
    /// Requests seen by the activator for this model.
    pub demand: Demand,
    /// First tokens in the fresh replicas' short windows, added up (from their buckets); `None` when unknown.
    /// The SLO guard's look-ahead reads a trend only over busy windows ([`lookahead::MIN_FIRST_TOKENS`]).
    pub ttft_window_count: Option<f64>,
}

/// One replica's signals, from its sidecar's `/v1/status`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplicaSignals {
    /// KV cache usage, 0–1.
    pub kv_cache_usage: Option<f64>,
    /// Requests waiting in vLLM's queue.
    pub waiting: Option<u32>,
    /// Requests being processed.
    pub running: Option<u32>,
    /// p95 time to first token over the sidecar's window.
    pub ttft_p95: Option<Duration>,
    /// p99 time to first token over the same window (what the SLO guard reads at [`SloPercentile::P99`]).
    pub ttft_p99: Option<Duration>,
    /// p95 of the time requests waited in vLLM's queue over the same window (`vllm:request_queue_time_seconds`),
    /// when the sidecar reports it: what tells a queue from a prefill ([`cause`]).
    pub queue_p95: Option<Duration>,
    /// False when the status could not be read or is older than the controller accepts: the values are then ignored
    /// and the replica counts as "missing" (never a reason to scale down).
    pub fresh: bool,
}

/// The model's demand as the activator sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Demand {
    /// Requests per second over the activator's window; `None` when unknown.
    pub requests_per_second: Option<f64>,
    /// Requests forwarded and not yet answered.
    pub in_flight: u32,
    /// Requests held because no replica is ready.
    pub queued_at_activator: u32,
    /// When the last request arrived. `None` means unknown (no activator data), which never allows scale to zero;
    /// neither does an unknown `requests_per_second`.
    /// An activator that has seen no request since it started reports its start time.
    pub last_request_at: Option<Timestamp>,
    /// The activators' request counters added up (requests since each started); `None` when unknown. Only
    /// differences mean anything, and a counter goes back when an activator restarts.
    pub requests_total: Option<u64>,
}

impl Demand {
    /// Whether anything is waiting for or being served by this model right now.
    pub fn has_work(&self) -> bool {
        self.in_flight > 0
            || self.queued_at_activator > 0
            || self.requests_per_second.is_some_and(|r| r > 0.0)
    }
}

/// A scaling signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    /// Mean KV cache usage.
    KvCacheUtilization,
    /// Mean waiting requests per replica.
    WaitingRequestsPerReplica,
    /// Mean p95 time to first token (seconds).
    TtftP95,
    /// Total requests per second divided by replicas.
    RequestsPerSecondPerReplica,
}

impl Signal {
    /// Every signal, in the order the spec lists them.
    pub const ALL: [Signal; 4] = [
        Signal::KvCacheUtilization,
        Signal::WaitingRequestsPerReplica,
        Signal::TtftP95,
        Signal::RequestsPerSecondPerReplica,
    ];

    /// The signal whose spec and status field name is `field` (`kvCacheUtilization`, ...).
    pub fn from_field(field: &str) -> Option<Signal> {
        Self::ALL.into_iter().find(|s| s.field() == field)
    }

    /// Stable snake_case label, for metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            Signal::KvCacheUtilization => "kv_cache_utilization",
            Signal::WaitingRequestsPerReplica => "waiting_requests_per_replica",
            Signal::TtftP95 => "ttft_p95",
            Signal::RequestsPerSecondPerReplica => "requests_per_second_per_replica",
        }
    }

    /// The camelCase field name used in the InferenceAutoscaler spec and status.
    pub fn field(self) -> &'static str {
        match self {
            Signal::KvCacheUtilization => "kvCacheUtilization",
            Signal::WaitingRequestsPerReplica => "waitingRequestsPerReplica",
            Signal::TtftP95 => "ttftP95",
            Signal::RequestsPerSecondPerReplica => "requestsPerSecondPerReplica",
        }
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// What one signal said this round.
#[derive(Debug, Clone, PartialEq)]
pub struct SignalDecision {
    /// Which signal.
    pub signal: Signal,
    /// Its current per-replica value (TTFT in seconds); `None` when no replica reported it.
    pub value: Option<f64>,
    /// Its target (TTFT in seconds).
    pub target: f64,
    /// Replicas this signal alone asks for; `None` when it could not be computed.
    pub proposed: Option<u32>,
    /// Replicas whose value went into `value`.
    pub reporting_replicas: u32,
    /// Ready replicas without a fresh value (counted at target on scale-down, 0 on scale-up).
    pub missing_replicas: u32,
}

/// Why the replica count is what it is. `label()` is stable (a metric label); `Display` is for people.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScaleReason {
    /// The policy is invalid; the replica count is left alone.
    InvalidPolicy,
    /// Signals are over target: scaling up.
    ScaleUp,
    /// Signals are under target: scaling down.
    ScaleDown,
    /// Every signal is within tolerance of its target (or no targets are set): no change.
    WithinTolerance,
    /// A configured signal could not be computed, so no scale-down this round.
    MissingMetrics,
    /// A scale-down is held back by the scale-down stabilization window (or a scale-up by the up window).
    Stabilizing,
    /// The change was cut by a `behavior` rate-limit policy.
    RateLimited,
    /// Held at `max_replicas`.
    TooManyReplicas,
    /// Held at `min_replicas` (or at one replica while not idle).
    TooFewReplicas,
    /// Time to first token is over the SLO: one more replica, no scale-down.
    TtftSloBreached,
    /// Time to first token is under the SLO but rising to pass it before a replica asked for now could serve
    /// ([`lookahead`]): one more replica, no scale-down.
    TtftSloAtRisk,
    /// Demand reached the panic threshold: scaled up at once and holding.
    Panic,
    /// Demand arrived while at zero: at least one replica at once.
    ScaleFromZero,
    /// Idle for `idle_after` with nothing in flight or queued: to zero.
    ScaleToZero,
    /// At zero with no demand: staying there.
    IdleAtZero,
}

impl ScaleReason {
    /// Stable snake_case label for metrics (`tessera_autoscaler_decisions_total{reason}`) and condition reasons.
    pub fn label(self) -> &'static str {
        match self {
            ScaleReason::InvalidPolicy => "invalid_policy",
            ScaleReason::ScaleUp => "scale_up",
            ScaleReason::ScaleDown => "scale_down",
            ScaleReason::WithinTolerance => "within_tolerance",
            ScaleReason::MissingMetrics => "missing_metrics",
            ScaleReason::Stabilizing => "stabilizing",
            ScaleReason::RateLimited => "rate_limited",
            ScaleReason::TooManyReplicas => "too_many_replicas",
            ScaleReason::TooFewReplicas => "too_few_replicas",
            ScaleReason::TtftSloBreached => "ttft_slo_breached",
            ScaleReason::TtftSloAtRisk => "ttft_slo_at_risk",
            ScaleReason::Panic => "panic",
            ScaleReason::ScaleFromZero => "scale_from_zero",
            ScaleReason::ScaleToZero => "scale_to_zero",
            ScaleReason::IdleAtZero => "idle_at_zero",
        }
    }

    /// CamelCase form, for Kubernetes condition `reason` fields (which must be CamelCase).
    pub fn condition_reason(self) -> &'static str {
        match self {
            ScaleReason::InvalidPolicy => "InvalidPolicy",
            ScaleReason::ScaleUp => "ScaleUp",
            ScaleReason::ScaleDown => "ScaleDown",
            ScaleReason::WithinTolerance => "WithinTolerance",
            ScaleReason::MissingMetrics => "MissingMetrics",
            ScaleReason::Stabilizing => "Stabilizing",
            ScaleReason::RateLimited => "RateLimited",
            ScaleReason::TooManyReplicas => "TooManyReplicas",
            ScaleReason::TooFewReplicas => "TooFewReplicas",
            ScaleReason::TtftSloBreached => "TtftSloBreached",
            ScaleReason::TtftSloAtRisk => "TtftSloAtRisk",
            ScaleReason::Panic => "Panic",
            ScaleReason::ScaleFromZero => "ScaleFromZero",
            ScaleReason::ScaleToZero => "ScaleToZero",
            ScaleReason::IdleAtZero => "IdleAtZero",
        }
    }
}

impl fmt::Display for ScaleReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// The decision: how many replicas, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct ScaleDecision {
    /// Replicas the target should have.
    pub desired_replicas: u32,
    /// Replicas it had when the decision was made.
    pub current_replicas: u32,
    /// The recommendation before stabilization, rate limits and clamping (what the windows remember).
    pub recommendation: u32,
    /// The rule that settled the count.
    pub reason: ScaleReason,
    /// A sentence for people (status condition message, Event note, log).
    pub message: String,
    /// What each configured signal said.
    pub signals: Vec<SignalDecision>,
    /// The signal that asked for the most replicas.
    pub leading_signal: Option<Signal>,
    /// Whether panic mode is on after this decision.
    pub panicking: bool,
    /// Whether the panic condition itself was met this round (restarts the panic's stable window).
    pub panic_triggered: bool,
    /// HPA's `ScalingActive`: false when no signal could be computed (or the policy is invalid).
    pub scaling_active: bool,
    /// HPA's `ScalingLimited`: the count was cut by min/max or a rate limit.
    pub scaling_limited: bool,
    /// How long [`ScaleState`] must keep history for this policy (set from the policy by `decide`).
    pub history_horizon: Duration,
    /// Set when the TTFT target's proposal was held at the count because the time is in prefill
    /// ([`cause::hold_prefill_bound`]).
    pub prefill_held: Option<cause::TtftCause>,
}

impl ScaleDecision {
    /// Whether acting on this decision changes the replica count.
    pub fn is_change(&self) -> bool {
        self.desired_replicas != self.current_replicas
    }
}

/// Decides the replica count. Pure: the same arguments always give the same decision.
pub fn decide(input: &ScaleInput, policy: &ScalePolicy, state: &ScaleState, now: Timestamp) -> ScaleDecision {
    let current = input.current_replicas;
    let mut d = ScaleDecision {
        desired_replicas: current,
        current_replicas: current,
        recommendation: current,
        reason: ScaleReason::WithinTolerance,
        message: String::new(),
        signals: Vec::new(),
        leading_signal: None,
        panicking: false,
        panic_triggered: false,
        scaling_active: true,
        scaling_limited: false,
        history_horizon: policy.history_horizon(),
        prefill_held: None,
    };
    if let Err(errors) = policy.validate() {
        d.reason = ScaleReason::InvalidPolicy;
        d.scaling_active = false;
        d.message = format!(
            "policy is invalid, leaving {current} replicas: {}",
            errors.join("; ")
        );
        return d;
    }

    if current == 0 {
        return decide_at_zero(input, policy, d);
    }

    // 1–2. Per-signal proposals and their maximum.
    let (mut raw, mut reason) = propose(&mut d, input, policy);

    // 3. TTFT SLO guard. Replicas asked for but not ready yet are the guard's earlier answer still starting:
    // asking for current+1 again on every sync while they load (minutes for a large model) would add one
    // replica per sync period for the same excursion, so the guard holds until they are ready.
    let starting = current.saturating_sub(input.ready_replicas);
    let guard = (raw <= current)
        .then(|| ttft_guard(input, policy, state, now))
        .flatten();
    if let Some((why, what)) = &guard {
        reason = *why;
        if starting > 0 {
            raw = current;
            d.message = format!("{what}: waiting for {starting} starting replica(s) before asking for more");
        } else {
            raw = current.saturating_add(1);
            d.message = format!("{what}: asking for one more replica");
        }
    }
    let guard_fired = guard.is_some();

    // 4. Scale to zero.
    if let Some(stz) = &policy.scale_to_zero
        && policy.min_replicas == 0
        && let Some(idle_for) = idle_for(input, now)
        && idle_for >= stz.idle_after
        && !guard_fired
    {
        let limit = behavior::scale_down_limit(&policy.behavior.scale_down, current, &state.events, now);
        d.recommendation = 0;
        d.desired_replicas = limit.min(current);
        d.reason = if d.desired_replicas == 0 {
            ScaleReason::ScaleToZero
        } else {
            ScaleReason::RateLimited
        };
        d.scaling_limited = d.desired_replicas > 0;
        d.message = format!(
            "no requests for {}s (idle after {}s) and nothing in flight or queued: scaling {} -> {}",
            idle_for.as_secs(),
            stz.idle_after.as_secs(),
            current,
            d.desired_replicas
        );
        return d;
    }
    d.recommendation = raw;

    // 5. Panic mode.
    let asked = Proposal {
        raw,
        reason,
        guard_fired,
    };
    if panic_mode(&mut d, asked, input, policy, state, now) {
        return d;
    }

    // 6. Stabilization windows.
    let stabilized = behavior::stabilize(raw, current, &policy.behavior, &state.recommendations, now);
    if stabilized != raw && stabilized == current && raw != current {
        reason = ScaleReason::Stabilizing;
    }

    // 7–8. Rate limits and clamp.
    let (desired, limit) = behavior::limit_rate(stabilized, current, policy, &state.events, now);
    d.desired_replicas = desired;
    if let Some(limit) = limit {
        d.scaling_limited = true;
        reason = limit;
    }
    d.reason = reason;
    if d.message.is_empty() {
        d.message = describe(&d, stabilized);
    }
    d
}

/// Steps 1–2: each signal's proposal (into `d.signals`) and the count the largest asks for, with why. A signal
/// that could not be computed holds the count: missing data never scales down.
fn propose(d: &mut ScaleDecision, input: &ScaleInput, policy: &ScalePolicy) -> (u32, ScaleReason) {
    let current = d.current_replicas;
    d.signals = policy
        .targets
        .iter()
        .map(|(signal, target)| ratio::propose(signal, target, input, policy))
        .collect();
    // 1b. A TTFT over its target that another replica would not shorten (the time is prefill) asks for none.
    d.prefill_held = cause::hold_prefill_bound(&mut d.signals, input, current);
    let any_missing = d.signals.iter().any(|s| s.proposed.is_none());
    let best = d
        .signals
        .iter()
        .filter_map(|s| s.proposed.map(|p| (p, s.signal)))
        .max_by_key(|(p, _)| *p);
    let mut reason;
    let mut raw = match best {
        Some((p, signal)) => {
            d.leading_signal = Some(signal);
            reason = if p > current {
                ScaleReason::ScaleUp
            } else if p < current {
                ScaleReason::ScaleDown
            } else {
                ScaleReason::WithinTolerance
            };
            p
        }
        None => {
            reason = if d.signals.is_empty() {
                ScaleReason::WithinTolerance
            } else {
                ScaleReason::MissingMetrics
            };
            d.scaling_active = d.signals.is_empty();
            current
        }
    };
    if any_missing && raw < current {
        raw = current;
        reason = ScaleReason::MissingMetrics;
    }
    (raw, reason)
}

/// What steps 1–3 ask for, before scale-to-zero, panic, stabilization and rate limits.
#[derive(Debug, Clone, Copy)]
struct Proposal {
    /// The replica count asked for.
    raw: u32,
    /// The rule behind it.
    reason: ScaleReason,
    /// Whether the TTFT SLO guard asked for it.
    guard_fired: bool,
}

/// Step 5: panic mode, when a burst triggers it or its stable window still runs. Returns whether it settled `d`
/// (panic skips stabilization and rate limits).
fn panic_mode(
    d: &mut ScaleDecision,
    asked: Proposal,
    input: &ScaleInput,
    policy: &ScalePolicy,
    state: &ScaleState,
    now: Timestamp,
) -> bool {
    let Some(panic) = &policy.panic else {
        return false;
    };
    let Proposal {
        raw,
        reason,
        guard_fired,
    } = asked;
    let current = d.current_replicas;
    let ready = input.ready_replicas.max(1);
    let panic_rec = panic_recommendation(raw, state, now, panic.window);
    // The guard's one extra replica is not a burst: with one ready replica, current+1 is already 200% of it,
    // and panic would then skip the rate limits and hold the guard's own runaway for a stable window.
    let triggered =
        !guard_fired && f64::from(panic_rec) >= panic.threshold * f64::from(ready) && panic_rec > current;
    let still = state
        .last_panic_at
        .is_some_and(|t| now.since(t) < panic.stable_window);
    if !(triggered || still) {
        return false;
    }
    d.panicking = true;
    d.panic_triggered = triggered;
    // Never below what the panic already reached: Knative holds the panic peak until the stable window ends.
    let floor = current.max(state.panic_peak);
    let want = if triggered { panic_rec } else { raw };
    let desired = want.max(floor);
    let clamped = desired.clamp(policy.active_floor(), policy.max_replicas);
    d.desired_replicas = clamped;
    d.scaling_limited = clamped < desired;
    d.reason = if clamped < desired {
        ScaleReason::TooManyReplicas
    } else if triggered || want < floor {
        ScaleReason::Panic
    } else {
        reason
    };
    if d.message.is_empty() {
        d.message = if triggered {
            format!(
                "panic mode: demand asks for {panic_rec} replicas, {:.1}x the {ready} ready; scaling {} -> {} \
                 and not scaling down for {}s",
                f64::from(panic_rec) / f64::from(ready),
                current,
                clamped,
                panic.stable_window.as_secs()
            )
        } else {
            format!(
                "panic mode until {}s pass without a burst: recommendation {raw}, holding at least {floor}; \
                 {} -> {}",
                panic.stable_window.as_secs(),
                current,
                clamped
            )
        };
    }
    true
}

/// Whether the TTFT SLO guard fires, and what it says: the worst fresh p95 over the objective now, or rising to
/// pass it within the time a replica asked for now takes to serve ([`lookahead`]).
fn ttft_guard(
    input: &ScaleInput,
    policy: &ScalePolicy,
    state: &ScaleState,
    now: Timestamp,
) -> Option<(ScaleReason, String)> {
    let pct = policy.guard_percentile(input);
    let (slo, worst) = (policy.ttft_slo?, worst_ttft(input, pct)?);
    if worst > slo {
        return Some((
            ScaleReason::TtftSloBreached,
            format!(
                "{} time to first token {:.3}s is over the SLO {:.3}s",
                pct.label(),
                worst.as_secs_f64(),
                slo.as_secs_f64()
            ),
        ));
    }
    let lead = policy.ttft_guard_lead?;
    let trend = lookahead::project(lookahead::trend_sample(input, pct)?, &state.ttft_seen, lead, now)
        .filter(|t| t.projected > slo)?;
    Some((
        ScaleReason::TtftSloAtRisk,
        format!(
            "{} time to first token {:.3}s, rising {:.3} s/s over the last {} s, would pass the SLO {:.3}s within \
             the {:.0} s a new replica takes to serve",
            pct.label(),
            worst.as_secs_f64(),
            trend.slope,
            trend.span.as_secs(),
            slo.as_secs_f64(),
            lead.as_secs_f64()
        ),
    ))
}

/// The worst time to first token at `pct` among the fresh replicas: what the TTFT SLO guard reads.
pub(crate) fn worst_ttft(input: &ScaleInput, pct: SloPercentile) -> Option<Duration> {
    input
        .replicas
        .iter()
        .filter(|r| r.fresh)
        .filter_map(|r| pct.of(r))
        .max()
}

/// At zero: wake on any demand, else stay (or go to `min_replicas` when the policy now asks for more).
fn decide_at_zero(input: &ScaleInput, policy: &ScalePolicy, mut d: ScaleDecision) -> ScaleDecision {
    let demand = &input.demand;
    if demand.has_work() {
        // From zero nothing is stabilized or rate limited: the request that woke the model is waiting.
        let by_rate = match (
            demand.requests_per_second,
            policy.targets.requests_per_second_per_replica,
        ) {
            (Some(rps), Some(target)) if rps > 0.0 => ceil_u32(rps / target),
            _ => 1,
        };
        let wanted = by_rate.max(1).max(policy.min_replicas);
        d.recommendation = wanted;
        d.desired_replicas = wanted.min(policy.max_replicas);
        d.scaling_limited = d.desired_replicas < wanted;
        d.reason = ScaleReason::ScaleFromZero;
        d.message = format!(
            "demand at zero replicas ({} queued at the activator, {} in flight): scaling 0 -> {}",
            demand.queued_at_activator, demand.in_flight, d.desired_replicas
        );
    } else if policy.min_replicas > 0 {
        d.recommendation = policy.min_replicas;
        d.desired_replicas = policy.min_replicas;
        d.scaling_limited = true;
        d.reason = ScaleReason::TooFewReplicas;
        d.message = format!(
            "at 0 replicas, below minReplicas {}: scaling up",
            policy.min_replicas
        );
    } else {
        d.recommendation = 0;
        d.reason = ScaleReason::IdleAtZero;
        d.message = "no demand: staying at zero".to_owned();
    }
    d
}

/// How long the model has been idle, or `None` when it is not provably idle (work anywhere, or data missing).
fn idle_for(input: &ScaleInput, now: Timestamp) -> Option<Duration> {
    if input.demand.has_work() {
        return None;
    }
    // An unknown rate (an activator poll failed, or only one document so far) is missing data, and missing data
    // never scales down: a model whose traffic we cannot count must not look idle.
    input.demand.requests_per_second?;
    // Every ready replica must have fresh data saying it has nothing running or waiting: a replica we cannot see
    // might be serving clients that bypass the activator.
    let fresh = input.replicas.iter().filter(|r| r.fresh).count();
    if u32::try_from(fresh).unwrap_or(u32::MAX) < input.ready_replicas {
        return None;
    }
    let busy = input
        .replicas
        .iter()
        .any(|r| !r.fresh || r.running.is_none_or(|n| n > 0) || r.waiting.is_none_or(|n| n > 0));
    if busy {
        return None;
    }
    input.demand.last_request_at.map(|t| now.since(t))
}

/// Knative averages the panic signal over a short window; with only instantaneous proposals, average the proposals
/// made within that window (this one included). When the caller ticks slower than the window this is just `raw`.
fn panic_recommendation(raw: u32, state: &ScaleState, now: Timestamp, window: Duration) -> u32 {
    let (sum, n) = state
        .recommendations
        .iter()
        .filter(|r| r.at.is_within(window, now))
        .fold((u64::from(raw), 1u64), |(s, n), r| {
            (s + u64::from(r.replicas), n + 1)
        });
    u32::try_from(sum.div_ceil(n)).unwrap_or(u32::MAX)
}

fn describe(d: &ScaleDecision, stabilized: u32) -> String {
    let lead = d
        .leading_signal
        .and_then(|s| d.signals.iter().find(|x| x.signal == s))
        .map(|s| {
            format!(
                "{} {} vs target {}",
                s.signal,
                s.value
                    .map_or_else(|| "unknown".to_owned(), |v| format!("{v:.3}")),
                s.target
            )
        })
        .unwrap_or_else(|| "no signal".to_owned());
    match d.reason {
        ScaleReason::ScaleUp | ScaleReason::ScaleDown => {
            format!("{lead}: scaling {} -> {}", d.current_replicas, d.desired_replicas)
        }
        ScaleReason::WithinTolerance if d.signals.is_empty() => {
            format!("no targets set: keeping {} replicas", d.current_replicas)
        }
        ScaleReason::WithinTolerance => format!("{lead}: within tolerance, keeping {}", d.current_replicas),
        ScaleReason::MissingMetrics => {
            let missing: Vec<_> = d
                .signals
                .iter()
                .filter(|s| s.proposed.is_none())
                .map(|s| s.signal.label())
                .collect();
            format!(
                "no data for {}: not scaling down (recommendation {}, keeping {})",
                missing.join(", "),
                d.recommendation,
                d.desired_replicas
            )
        }
        ScaleReason::Stabilizing => format!(
            "{lead}: recommends {} but the stabilization window holds {}",
            d.recommendation, stabilized
        ),
        ScaleReason::RateLimited => format!(
            "{lead}: recommends {}, rate limit allows {} -> {}",
            stabilized, d.current_replicas, d.desired_replicas
        ),
        ScaleReason::TooManyReplicas => format!(
            "{lead}: recommends {}, held at maxReplicas {}",
            stabilized, d.desired_replicas
        ),
        ScaleReason::TooFewReplicas => format!(
            "{lead}: recommends {}, held at the minimum {}",
            stabilized, d.desired_replicas
        ),
        other => format!("{other}: {} -> {}", d.current_replicas, d.desired_replicas),
    }
}

pub(crate) fn ceil_u32(x: f64) -> u32 {
    if !x.is_finite() || x <= 0.0 {
        return 0;
    }
    let c = x.ceil();
    if c >= f64::from(u32::MAX) {
        u32::MAX
    } else {
        c as u32
    }
}
