//! What the controller reads, and how it becomes a [`ScaleInput`]: the one input path of [`super::decide`].
//!
//! The controller reads each ready replica's sidecar (`/v1/status`, [`SidecarStatus`]) and every activator pod's
//! stats ([`ActivatorStats`], two documents one poll apart for a rate). The functions here turn those documents
//! into [`ReplicaSignals`] and [`Demand`]; [`scale_input`] assembles the [`ScaleInput`]. The simulator does not
//! shape inputs of its own: it writes the documents the sidecar and the activator would serve at that instant
//! (a sidecar's TTFT p95 over [`RECENT_WINDOW`], from vLLM's bucketed histogram differenced between two scrapes,
//! [`window_ttft_p95`]; the activator's cumulative request counter, polled [`ACTIVATOR_POLL_INTERVAL`] apart)
//! and hands them to these same functions, so a simulated decision is the shipped decision on the same
//! observations — bucketed, windowed and lagged as in production.
//!
//! Missing data is explicit all the way: a replica whose sidecar could not be read, is stale, or whose snapshot
//! is too old counts as not fresh (never a reason to scale down), and a demand with any activator pod unread has
//! no rate and no idle time (never a reason to go to zero).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use super::{Demand, ReplicaSignals, ScaleInput, SloPercentile, Timestamp};
use crate::metrics::Histogram;
use crate::wire::activator::{ActivatorStats, request_rate};
use crate::wire::sidecar::{Quantiles, RecentLatency, SidecarStatus};

/// The sidecar's default `--latency-window`: the `recent` TTFT p95 the SLO guard reads covers about a sync
/// period of scrapes, so an excursion stops counting soon after the replicas it called for are up.
pub const RECENT_WINDOW: Duration = Duration::from_secs(60);

/// The controller's default `--activator-poll-interval`: the rate is the counter delta over one poll.
pub const ACTIVATOR_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// The controller's default `--max-signal-age`: a sidecar snapshot older than this (on the sidecar's clock) is
/// not fresh.
pub const MAX_SIGNAL_AGE: Duration = Duration::from_secs(30);

/// The controller's default `--activator-max-age`: an activator document fetched longer ago is not fresh.
pub const ACTIVATOR_MAX_AGE: Duration = Duration::from_secs(5);

/// The TTFT p95 of a window: what the cumulative histogram `now` gained since `window_start` (or since the
/// replica started, when it is younger than the window), quantile over vLLM's buckets as Prometheus'
/// `histogram_quantile` does. `None` when nothing was observed in the window.
pub fn window_ttft_p95(now: &Histogram, window_start: Option<&Histogram>) -> Option<Duration> {
    window_ttft_quantile(now, window_start, SloPercentile::P95.quantile())
}

/// [`window_ttft_p95`] at any quantile `q` in (0, 1) (the SLO guard's p99 too).
pub fn window_ttft_quantile(now: &Histogram, window_start: Option<&Histogram>, q: f64) -> Option<Duration> {
    let at_q = |h: &Histogram| {
        h.quantile(q)
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(Duration::from_secs_f64)
    };
    match window_start {
        Some(earlier) => at_q(&now.delta(earlier)),
        None => at_q(now),
    }
}

/// Where a trailing window of scrapes starts, as the sidecar picks it: the oldest scrape at or after
/// `last_at − window`. `scrapes` are oldest first; `at` gives a scrape's time in seconds.
pub fn window_start<T>(
    scrapes: impl IntoIterator<Item = T>,
    at: impl Fn(&T) -> f64,
    last_at: f64,
    window: Duration,
) -> Option<T> {
    let from = last_at - window.as_secs_f64();
    scrapes.into_iter().find(|s| at(s) >= from)
}

/// The [`ScaleInput`] of one model: `current_replicas` from the target's `/scale`, one entry in `sidecars` per
/// ready replica (`None` when its status could not be read: counted as missing data), and the model's demand
/// ([`demand_from`]).
///
/// The TTFT p95 every fresh replica carries is the model's: the quantile over all its replicas' first tokens in
/// the window ([`pooled_ttft`]), when every sidecar reports its window's buckets. A mean of per-replica p95s
/// is biased upward, and more so the more replicas share the traffic: each sees fewer requests, and the p95 of
/// a small sample is close to its maximum, so adding replicas would raise the signal that asked for them
/// (measured in the simulator: `docs/simulator-experiments.md`, "The model's TTFT p95"). With a sidecar too old to report
/// buckets, every replica keeps its own p95.
pub fn scale_input(
    current_replicas: u32,
    sidecars: &[Option<&SidecarStatus>],
    max_signal_age: Duration,
    demand: Demand,
) -> ScaleInput {
    let mut replicas: Vec<ReplicaSignals> = sidecars
        .iter()
        .map(|s| match s {
            Some(st) => replica_signals(st, max_signal_age),
            None => ReplicaSignals {
                fresh: false,
                ..ReplicaSignals::default()
            },
        })
        .collect();
    let fresh: Vec<&SidecarStatus> = sidecars
        .iter()
        .zip(&replicas)
        .filter(|(_, r)| r.fresh)
        .filter_map(|(s, _)| *s)
        .collect();
    let count: f64 = fresh
        .iter()
        .filter_map(|st| st.recent.as_ref())
        .map(first_tokens)
        .sum();
    if let Some(pooled) = pooled_ttft(fresh) {
        let (p95, p99) = (
            window_ttft_quantile(&pooled, None, SloPercentile::P95.quantile()),
            window_ttft_quantile(&pooled, None, SloPercentile::P99.quantile()),
        );
        for r in replicas.iter_mut().filter(|r| r.fresh) {
            r.ttft_p95 = p95;
            r.ttft_p99 = p99;
        }
    }
    ScaleInput {
        current_replicas,
        ready_replicas: u32::try_from(sidecars.len()).unwrap_or(u32::MAX),
        replicas,
        demand,
        ttft_window_count: Some(count),
    }
}

/// The GPU's memory as the model's sidecars report it (the first document that knows it): what prices another
/// replica's memory in the joint policy (`joint::ShareRoom::of`). `None` when no sidecar was read, as at zero
/// replicas: the controller then does not know the GPU, and the simulator reads it the same way.
pub fn gpu_memory_bytes(sidecars: &[Option<SidecarStatus>]) -> Option<u64> {
    sidecars
        .iter()
        .flatten()
        .find_map(|d| d.gpu.as_ref().map(|g| g.total_bytes))
}

/// The model's first tokens in `fresh` replicas' short windows, their buckets added together, which its p95 and
/// p99 are read from; `None` when a window has quantiles but no buckets (a sidecar older than the buckets), when
/// bounds differ, or when no first token was seen in any window.
pub fn pooled_ttft<'a>(fresh: impl IntoIterator<Item = &'a SidecarStatus>) -> Option<Histogram> {
    let mut pooled: Option<Histogram> = None;
    // A replica too new for a short window adds nothing to it.
    for recent in fresh.into_iter().filter_map(|st| st.recent.as_ref()) {
        if recent.ttft_buckets.is_empty() {
            // No bucket means no first token in the window only when the quantiles say so too.
            if recent.ttft_seconds.p95.is_some() {
                return None;
            }
            continue;
        }
        let window = Histogram {
            count: first_tokens(recent),
            buckets: recent.ttft_buckets.clone(),
            sum: f64::NAN,
        };
        match pooled.as_mut() {
            None => pooled = Some(window),
            Some(p) if p.same_bounds(&window) => {
                for (a, b) in p.buckets.iter_mut().zip(&window.buckets) {
                    a.cumulative += b.cumulative;
                }
                p.count += window.count;
            }
            Some(_) => return None,
        }
    }
    pooled.filter(|p| p.count > 0.0)
}

/// First tokens in a replica's short window: its buckets' last cumulative count (none without buckets).
fn first_tokens(recent: &RecentLatency) -> f64 {
    recent.ttft_buckets.last().map_or(0.0, |b| b.cumulative)
}

/// One replica's signals from its sidecar status. `max_age`: how old the last good snapshot may be (measured on
/// the sidecar's own clock, so node clock skew does not matter).
pub fn replica_signals(status: &SidecarStatus, max_age: Duration) -> ReplicaSignals {
    let Some(latest) = &status.latest else {
        return ReplicaSignals {
            fresh: false,
            ..ReplicaSignals::default()
        };
    };
    let age = status.generated_at - latest.at;
    let fresh = status.vllm_up && !status.stale && age.is_finite() && age <= max_age.as_secs_f64();
    let count = |v: Option<f64>| v.filter(|x| x.is_finite() && *x >= 0.0).map(|x| x.round() as u32);
    // The short window (about a sync period) when the sidecar has one: over the 10-minute window one excursion
    // keeps the SLO guard firing long after new replicas are up. Older sidecars: the long window.
    let ttft = |pick: fn(&Quantiles) -> Option<f64>| {
        status
            .recent
            .as_ref()
            .map(|r| pick(&r.ttft_seconds))
            .unwrap_or_else(|| status.window.as_ref().and_then(|w| pick(&w.ttft_seconds)))
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(Duration::from_secs_f64)
    };
    ReplicaSignals {
        kv_cache_usage: latest.kv_cache_usage_ratio.filter(|x| x.is_finite()),
        waiting: count(latest.requests_waiting),
        running: count(latest.requests_running),
        ttft_p95: ttft(|q| q.p95),
        // The same window's p99, for a guard on it (`SloPercentile::P99`).
        ttft_p99: ttft(|q| q.p99),
        // The short window's only: a queue time over ten minutes says nothing of the TTFT the target reads now.
        queue_p95: status
            .recent
            .as_ref()
            .and_then(|r| r.queue_time_seconds.p95)
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(Duration::from_secs_f64),
        fresh,
    }
}

/// The last two stats documents of one activator pod, or why the last fetch failed.
///
/// The documents are shared (`Arc`): every model's round reads every pod's sample, and each document names every
/// model the pod routes, so a copy per read made each round's cost grow with the fleet — at 1,000 models copying
/// them was most of the controller's CPU (docs/performance.md, "Fleet scale"). Cloning a sample is now two counts.
#[derive(Debug, Clone, Default)]
pub struct ActivatorSample {
    /// The document before `latest` (for the rate).
    pub previous: Option<Arc<ActivatorStats>>,
    /// The newest document.
    pub latest: Option<Arc<ActivatorStats>>,
    /// When `latest` was fetched, on the controller's clock (Unix ms).
    pub fetched_at_ms: Option<u64>,
    /// Set when the last fetch failed: the demand is then unknown.
    pub last_error: Option<String>,
}

impl ActivatorSample {
    /// Whether this pod's view counts as current at `now_ms`: the last poll succeeded and is at most `max_age` old.
    pub fn is_fresh(&self, now_ms: u64, max_age: Duration) -> bool {
        let max_age = u64::try_from(max_age.as_millis()).unwrap_or(u64::MAX);
        self.last_error.is_none()
            && self.latest.is_some()
            && self
                .fetched_at_ms
                .is_some_and(|t| now_ms.saturating_sub(t) <= max_age)
    }
}

/// The model's demand from every activator pod's samples. `models` are [`model_key`]s (`"<namespace>/<model>"`,
/// contract 1). Idle time and rate are known only when *every* known activator pod gave a fresh document (each
/// pod sees only the requests its Service routed to it) whose rate could be derived; otherwise they are unknown,
/// which never allows a scale-down to zero. In-flight and queued counts are summed from whatever was read: they
/// only ever push up. No activator known: unknown demand.
///
/// [`model_key`]: crate::wire::activator::model_key
pub fn demand_from(samples: &[ActivatorSample], models: &[String], now_ms: u64, max_age: Duration) -> Demand {
    let mut demand = Demand::default();
    if samples.is_empty() {
        return demand;
    }
    let mut rate = Some(0.0);
    let mut total = Some(0u64);
    let mut last: Option<u64> = None;
    let mut known = true;
    for s in samples {
        let fresh = s.is_fresh(now_ms, max_age);
        if !fresh {
            known = false;
            rate = None;
            total = None;
        }
        let Some(latest) = &s.latest else { continue };
        for m in models {
            if let Some(st) = latest.models.get(m) {
                demand.in_flight = demand
                    .in_flight
                    .saturating_add(u32::try_from(st.in_flight).unwrap_or(u32::MAX));
                demand.queued_at_activator = demand
                    .queued_at_activator
                    .saturating_add(u32::try_from(st.queued).unwrap_or(u32::MAX));
            }
            if !fresh {
                continue;
            }
            // The activator's contract: a known model with no request since the activator started has been idle
            // since the start; a model it does not know at all is "no data" (it is not in that request path),
            // which must never allow scale to zero.
            match latest.last_activity_unix_ms(m) {
                Some(seen) => last = Some(last.map_or(seen, |l| l.max(seen))),
                None => known = false,
            }
            total = total.map(|t| t.saturating_add(latest.models.get(m).map_or(0, |st| st.requests_total)));
            rate = match (rate, &s.previous) {
                (Some(r), Some(prev)) => request_rate(prev, latest, m).ok().map(|x| r + x),
                _ => None,
            };
        }
    }
    demand.requests_per_second = rate;
    demand.requests_total = total;
    demand.last_request_at = if known {
        last.map(Timestamp::from_millis)
    } else {
        None
    };
    demand
}

/// The request mix (lanes, streaming, prompt lengths) of the model's names over every fresh activator document,
/// for the workload class rule. Stale documents are left out: a count that is missing only weakens the evidence,
/// and too little evidence reads as real-time.
pub fn mix_from(
    samples: &[ActivatorSample],
    models: &[String],
    now_ms: u64,
    max_age: Duration,
) -> crate::class::RequestMix {
    samples
        .iter()
        .filter(|s| s.is_fresh(now_ms, max_age))
        .filter_map(|s| s.latest.as_ref())
        .flat_map(|doc| models.iter().filter_map(|m| doc.models.get(m)))
        .fold(crate::class::RequestMix::default(), |acc, st| acc.merge(&st.mix))
}

/// Model keys with `queued > 0` in any fresh document: a request is held right now, so the model's reconcile is
/// woken at once (the wake-up from zero, contract 2).
pub fn queued_models(samples: &[ActivatorSample], now_ms: u64, max_age: Duration) -> BTreeSet<String> {
    samples
        .iter()
        .filter(|s| s.is_fresh(now_ms, max_age))
        .filter_map(|s| s.latest.as_ref())
        .flat_map(|doc| doc.models.iter())
        .filter(|(_, st)| st.queued > 0)
        .map(|(k, _)| k.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::metrics::Bucket;
    use crate::wire::activator::ModelStats;

    fn hist(counts: &[(f64, f64)]) -> Histogram {
        Histogram {
            buckets: counts
                .iter()
                .map(|&(le, cumulative)| Bucket { le, cumulative })
                .collect(),
            sum: 0.0,
            count: counts.last().map_or(0.0, |b| b.1),
        }
    }

    #[test]
    fn ttft_p95_is_the_bucketed_quantile_of_the_window_only() {
        // Before the window: 100 fast requests; in it: 20 more, all in the (0.5, 1.0] bucket.
        let start = hist(&[(0.1, 100.0), (0.5, 100.0), (1.0, 100.0), (f64::INFINITY, 100.0)]);
        let now = hist(&[(0.1, 100.0), (0.5, 100.0), (1.0, 120.0), (f64::INFINITY, 120.0)]);
        let p = window_ttft_p95(&now, Some(&start)).unwrap().as_secs_f64();
        assert!((p - 0.975).abs() < 1e-9, "{p}");
        // Without a base (a young replica) the whole history counts, the fast ones too:
        // rank 114 of 120 is the 14th of 20 in (0.5, 1.0].
        let whole = window_ttft_p95(&now, None).unwrap().as_secs_f64();
        assert!((whole - 0.85).abs() < 1e-9, "{whole}");
        // Nothing new in the window: no signal.
        assert_eq!(window_ttft_p95(&start, Some(&start)), None);
    }

    #[test]
    fn the_window_starts_at_the_oldest_scrape_inside_it() {
        let at = [0.0, 5.0, 10.0, 15.0, 20.0];
        let w = |s| Duration::from_secs(s);
        assert_eq!(window_start(at.iter(), |t| **t, 20.0, w(12)), Some(&10.0));
        assert_eq!(window_start(at.iter(), |t| **t, 20.0, w(10)), Some(&10.0));
        assert_eq!(window_start(at.iter(), |t| **t, 20.0, w(60)), Some(&0.0));
        assert_eq!(window_start(at.iter(), |t| **t, 30.0, w(5)), None);
    }

    #[test]
    fn an_unread_sidecar_is_a_missing_replica() {
        let st = status(sidecar_doc(false, 2.0));
        let input = scale_input(3, &[Some(&st), None], MAX_SIGNAL_AGE, Demand::default());
        assert_eq!((input.current_replicas, input.ready_replicas), (3, 2));
        assert!(input.replicas[0].fresh);
        assert!(!input.replicas[1].fresh);
    }

    fn status(json: serde_json::Value) -> SidecarStatus {
        serde_json::from_value(json).unwrap()
    }

    fn sidecar_doc(stale: bool, age: f64) -> serde_json::Value {
        serde_json::json!({
            "schema_version": 1, "generated_at": 1000.0, "vllm_url": "http://127.0.0.1:8000", "vllm_up": true,
            "ready": true, "stale": stale,
            "scrape": {"interval_secs": 5.0, "successes_total": 3},
            "latest": {"at": 1000.0 - age, "kv_cache_usage_ratio": 0.42, "requests_running": 3.0,
                       "requests_waiting": 1.0},
            "window": {"start": 900.0, "end": 1000.0, "samples": 20, "ttft_seconds": {"p95": 0.35}},
            "recommendation": {"outcome": {"state": "not_yet", "code": "too_few_samples", "reason": "warming up"}}
        })
    }

    #[test]
    fn sidecar_status_becomes_replica_signals() {
        let st = status(sidecar_doc(false, 2.0));
        let r = replica_signals(&st, Duration::from_secs(30));
        assert!(r.fresh);
        assert_eq!(r.kv_cache_usage, Some(0.42));
        assert_eq!((r.running, r.waiting), (Some(3), Some(1)));
        assert_eq!(r.ttft_p95, Some(Duration::from_millis(350)));
        let mut old = st.clone();
        old.latest.as_mut().unwrap().at = 900.0;
        assert!(
            !replica_signals(&old, Duration::from_secs(30)).fresh,
            "100 s old snapshot is stale"
        );
        let mut stale = st.clone();
        stale.stale = true;
        assert!(!replica_signals(&stale, Duration::from_secs(30)).fresh);
        let mut down = st;
        down.latest = None;
        assert!(!replica_signals(&down, Duration::from_secs(30)).fresh);
    }

    /// A fresh replica whose short window saw first tokens in buckets `[0.1, 1, +Inf]` with these cumulative
    /// counts (its own p95 as the sidecar computes it).
    /// The model's pooled p95, as `scale_input` gives every fresh replica.
    fn pooled_ttft_p95<'a>(fresh: impl IntoIterator<Item = &'a SidecarStatus>) -> Option<Duration> {
        window_ttft_p95(&pooled_ttft(fresh)?, None)
    }

    fn with_window(cum: [f64; 3]) -> SidecarStatus {
        let mut st = status(sidecar_doc(false, 2.0));
        let h = hist(&[(0.1, cum[0]), (1.0, cum[1]), (f64::INFINITY, cum[2])]);
        st.recent = Some(crate::wire::sidecar::RecentLatency {
            window_secs: 60.0,
            start: 940.0,
            end: 998.0,
            ttft_seconds: crate::wire::sidecar::Quantiles {
                p95: h.quantile(0.95),
                count: Some(cum[2]),
                ..Default::default()
            },
            ttft_buckets: h.buckets.clone(),
            ..Default::default()
        });
        st
    }

    /// The model's p95 is the quantile over all its replicas' first tokens, not the mean of their p95s: a busy
    /// replica (95 fast of 100) has a p95 of 0.10 s and a quiet one (1 fast of 2) 0.91 s, a mean of 0.51 s; over
    /// the model's 102 first tokens, 6 were slow, so its p95 is 0.24 s, and every replica carries it. A sidecar
    /// without buckets (older) leaves every replica its own p95.
    #[test]
    fn the_ttft_p95_is_pooled_over_the_models_replicas() {
        let busy = with_window([95.0, 100.0, 100.0]);
        let quiet = with_window([1.0, 2.0, 2.0]);
        let own: Vec<f64> = [&busy, &quiet]
            .iter()
            .map(|s| replica_signals(s, MAX_SIGNAL_AGE).ttft_p95.unwrap().as_secs_f64())
            .collect();
        let input = scale_input(2, &[Some(&busy), Some(&quiet)], MAX_SIGNAL_AGE, Demand::default());
        let pooled = pooled_ttft_p95([&busy, &quiet]).unwrap();
        let expected = hist(&[(0.1, 96.0), (1.0, 102.0), (f64::INFINITY, 102.0)])
            .quantile(0.95)
            .unwrap();
        assert!(
            (pooled.as_secs_f64() - expected).abs() < 1e-9,
            "{pooled:?} {expected}"
        );
        assert!(
            pooled.as_secs_f64() < (own[0] + own[1]) / 2.0,
            "{pooled:?} {own:?}"
        );
        assert!(input.replicas.iter().all(|r| r.ttft_p95 == Some(pooled)));
        // The p99 the SLO guard may read instead is pooled over the same first tokens.
        let p99 = hist(&[(0.1, 96.0), (1.0, 102.0), (f64::INFINITY, 102.0)])
            .quantile(0.99)
            .unwrap();
        assert!(
            input
                .replicas
                .iter()
                .all(|r| { r.ttft_p99.is_some_and(|d| (d.as_secs_f64() - p99).abs() < 1e-9) })
        );
        assert!(p99 > pooled.as_secs_f64());
        // A sidecar that reports quantiles but no buckets: no pooling, each keeps its own.
        let mut old = quiet.clone();
        old.recent.as_mut().unwrap().ttft_buckets.clear();
        assert_eq!(pooled_ttft_p95([&busy, &old]), None);
        let input = scale_input(2, &[Some(&busy), Some(&old)], MAX_SIGNAL_AGE, Demand::default());
        assert_eq!(input.replicas[0].ttft_p95.map(|d| d.as_secs_f64()), Some(own[0]));
        // Different bounds cannot be added: no pooling either.
        let mut other = quiet;
        other.recent.as_mut().unwrap().ttft_buckets[0].le = 0.2;
        assert_eq!(pooled_ttft_p95([&busy, &other]), None);
    }

    fn stats(instance: &str, observed: u64, models: &[(&str, u64, u64, u64, Option<u64>)]) -> ActivatorStats {
        let models = models.iter().map(|&(m, total, in_flight, queued, last)| {
            (m.to_owned(), ModelStats::counts(total, in_flight, queued, last))
        });
        ActivatorStats::new(instance, 1_000, observed, models)
    }

    const AGE: Duration = Duration::from_secs(3);

    /// A pod's sample whose documents were fetched at their `observed` times, the last poll successful.
    fn sample(previous: Option<ActivatorStats>, latest: ActivatorStats) -> ActivatorSample {
        ActivatorSample {
            fetched_at_ms: Some(latest.observed_at_unix_ms),
            previous: previous.map(Arc::new),
            latest: Some(Arc::new(latest)),
            last_error: None,
        }
    }

    fn keys(k: &[&str]) -> Vec<String> {
        k.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn demand_sums_activator_pods_and_models_by_namespaced_key() {
        let a = sample(
            Some(stats(
                "a",
                10_000,
                &[("ns/m", 10, 0, 0, Some(9_000)), ("ns/alias", 0, 0, 0, None)],
            )),
            stats(
                "a",
                20_000,
                &[
                    ("ns/m", 60, 2, 1, Some(19_000)),
                    ("ns/alias", 0, 0, 0, None),
                    ("other/m", 500, 9, 9, Some(19_500)),
                ],
            ),
        );
        let b = sample(
            Some(stats("b", 10_000, &[("ns/m", 0, 0, 0, None)])),
            stats(
                "b",
                20_000,
                &[("ns/alias", 20, 1, 0, Some(15_000)), ("ns/m", 0, 0, 0, None)],
            ),
        );
        let d = demand_from(&[a.clone(), b], &keys(&["ns/m", "ns/alias"]), 20_500, AGE);
        assert_eq!(
            d.requests_per_second,
            Some(7.0),
            "another namespace's model is not ours"
        );
        assert_eq!((d.in_flight, d.queued_at_activator), (3, 1));
        assert_eq!(d.last_request_at, Some(Timestamp::from_millis(19_000)));
        // The counters the cold-start ledger differences: ours on both pods (60 + 20), not the other namespace's.
        assert_eq!(d.requests_total, Some(80));
        // A single document gives no rate yet.
        let first = ActivatorSample { previous: None, ..a };
        assert_eq!(
            demand_from(&[first], &keys(&["ns/m"]), 20_500, AGE).requests_per_second,
            None
        );
        // No activator at all: unknown.
        assert_eq!(demand_from(&[], &keys(&["ns/m"]), 20_500, AGE), Demand::default());
    }

    /// Item 7: a failed poll used to keep the last two documents' rate (frozen): now the rate and the idle time
    /// are unknown, and what was queued still counts.
    #[test]
    fn a_failed_or_stale_poll_makes_the_rate_unknown_not_frozen() {
        let ok = sample(
            Some(stats("a", 10_000, &[("ns/m", 10, 0, 0, Some(9_000))])),
            stats("a", 20_000, &[("ns/m", 60, 2, 0, Some(19_000))]),
        );
        let failed = ActivatorSample {
            last_error: Some("timeout".into()),
            ..ok.clone()
        };
        let d = demand_from(&[failed], &keys(&["ns/m"]), 21_000, AGE);
        assert_eq!((d.requests_per_second, d.last_request_at), (None, None));
        assert_eq!(d.in_flight, 2);
        // Fetched 3.5 s ago with polls every second: stale, so unknown too.
        let d = demand_from(std::slice::from_ref(&ok), &keys(&["ns/m"]), 23_500, AGE);
        assert_eq!((d.requests_per_second, d.last_request_at), (None, None));
        let d = demand_from(&[ok], &keys(&["ns/m"]), 23_000, AGE);
        assert_eq!(d.requests_per_second, Some(5.0));
    }

    /// Item 3: behind a Service each pod sees part of the traffic; one pod without a fresh document means the model
    /// is not provably idle, however idle the others look.
    #[test]
    fn idle_needs_a_fresh_document_from_every_activator_pod() {
        let idle = |name: &str| {
            sample(
                Some(stats(name, 10_000, &[("ns/m", 0, 0, 0, None)])),
                stats(name, 20_000, &[("ns/m", 0, 0, 0, None)]),
            )
        };
        let both = [idle("a"), idle("b")];
        let d = demand_from(&both, &keys(&["ns/m"]), 20_000, AGE);
        assert_eq!(
            d.last_request_at,
            Some(Timestamp::from_millis(1_000)),
            "idle since the activators started"
        );
        let not_yet_read = ActivatorSample::default();
        let d = demand_from(&[idle("a"), not_yet_read], &keys(&["ns/m"]), 20_000, AGE);
        assert_eq!((d.requests_per_second, d.last_request_at), (None, None));
        let d = demand_from(&both, &keys(&["ns/m", "ns/not-routed-here"]), 20_000, AGE);
        assert_eq!(
            d.last_request_at, None,
            "a model the activator does not know never allows scale to zero"
        );
    }

    #[test]
    fn queued_models_come_only_from_fresh_documents() {
        let held = sample(
            None,
            stats(
                "a",
                20_000,
                &[("ns/m", 1, 0, 2, Some(19_000)), ("ns/idle", 0, 0, 0, None)],
            ),
        );
        assert_eq!(
            queued_models(std::slice::from_ref(&held), 20_000, AGE),
            BTreeSet::from(["ns/m".to_owned()])
        );
        assert!(queued_models(&[held], 30_000, AGE).is_empty());
    }
}
