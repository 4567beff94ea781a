//! Priority lanes at the activator: whether a flex-lane request (OpenAI `service_tier: flex`, a vLLM `priority`
//! above 0) may go to a backend now. Real-time lanes (priority and default) are never gated: batch work fills the
//! room they leave and is refused before it can slow them.
//!
//! The backend's room is read from its own gauges (KV-cache usage and requests waiting), a fraction of a second
//! old. Under [`LaneLimits::admit_below`] of KV in use a flex request goes at once (up to
//! [`LaneLimits::max_in_flight`] flex requests on the backend); between that and [`LaneLimits::stop_at`] it is
//! throttled to [`LaneLimits::throttle_in_flight`]; at or above it, or while any request waits in the backend's
//! queue beyond [`LaneLimits::max_waiting`], none goes. Whatever the band, at most
//! [`LaneLimits::throttle_in_flight`] flex requests go between two readings of the gauges, so a burst cannot land
//! before the gauges show the first of it. Gauges missing or stale count as the throttled band: room
//! unknown is neither full (batch would starve on a metrics outage) nor empty (it could flood a busy server).
//!
//! The KV in use is read **with what the flex requests in flight are promised**: each counts at its whole
//! footprint (prompt plus `max_tokens`, [`footprint_tokens`]) over the cache's size in tokens, on top of the
//! gauge. A flex request admitted at 30% grows as it decodes; counted only as the gauge shows it, dozens of them
//! fill the cache past the autoscaler's KV target a few seconds later, and the interactive model scales up for
//! batch work (measured in the simulator: 0.64 GPU-hours on `scenarios/batch-beside-chat.yaml`, `docs/batch.md`).
//! A request's part already in the cache is counted twice, so the gate errs towards less batch work.

use std::time::Duration;

/// The gate's thresholds (the activator's `--lane-*` flags).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LaneLimits {
    /// KV-cache usage under which flex requests are admitted freely (0.5).
    pub admit_below: f64,
    /// KV-cache usage at or above which no flex request is admitted (0.6).
    pub stop_at: f64,
    /// Requests waiting in the backend's own queue above which no flex request is admitted (0: any waiting
    /// request is a real-time one that the flex lane must not delay further).
    pub max_waiting: f64,
    /// Most flex requests in flight on one backend in the throttled band (and while its gauges are unknown).
    pub throttle_in_flight: u64,
    /// Most flex requests in flight on one backend below `admit_below`.
    pub max_in_flight: u64,
    /// Oldest gauges still read as the backend's room.
    pub max_age: Duration,
    /// The TTFT pressure ([`ttft_pressure`]) of another model's pod on the backend's GPU at or above which no flex
    /// request goes to that backend (0.8: a neighbour at 80% of its TTFT objective).
    pub neighbour_stop_at: f64,
}

impl Default for LaneLimits {
    fn default() -> Self {
        LaneLimits {
            admit_below: 0.5,
            stop_at: 0.6,
            max_waiting: 0.0,
            throttle_in_flight: 1,
            max_in_flight: 64,
            max_age: Duration::from_secs(2),
            neighbour_stop_at: 0.8,
        }
    }
}

impl LaneLimits {
    /// Checks the thresholds, naming the first wrong one.
    pub fn validate(&self) -> Result<(), String> {
        let frac = |v: f64| v.is_finite() && (0.0..=1.0).contains(&v);
        if !frac(self.admit_below) || !frac(self.stop_at) || self.admit_below > self.stop_at {
            return Err(format!(
                "lane KV thresholds must satisfy 0 <= admit-below ({}) <= stop-at ({}) <= 1",
                self.admit_below, self.stop_at
            ));
        }
        if !self.max_waiting.is_finite() || self.max_waiting < 0.0 {
            return Err(format!("lane max-waiting must be >= 0, got {}", self.max_waiting));
        }
        if !self.neighbour_stop_at.is_finite() || self.neighbour_stop_at <= 0.0 {
            return Err(format!(
                "lane neighbour-stop-at must be > 0 (a share of the co-tenants' TTFT target), got {}",
                self.neighbour_stop_at
            ));
        }
        if self.max_in_flight == 0 {
            return Err("lane max-in-flight must be at least 1".to_owned());
        }
        Ok(())
    }
}

/// What the activator knows of one backend's room.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BackendRoom {
    /// KV-cache usage, 0–1, from the backend's last gauges.
    pub kv: Option<f64>,
    /// Requests waiting in the backend's queue.
    pub waiting: Option<f64>,
    /// How old those gauges are; `None` when never read.
    pub age: Option<Duration>,
    /// Flex requests this activator has in flight on the backend.
    pub flex_in_flight: u64,
    /// Flex requests sent to the backend since its gauges were read: their load is not in `kv` yet.
    pub flex_unseen: u64,
    /// The footprints (tokens) of the flex requests in flight on this backend ([`footprint_tokens`]).
    pub flex_tokens: u64,
    /// The KV cache's size in tokens (vLLM's `cache_config_info`: `num_gpu_blocks × block_size`), if known.
    pub kv_capacity_tokens: Option<u64>,
    /// The highest TTFT pressure among the other models' pods sharing the backend's GPU
    /// ([`neighbour_pressures`]), as the controller's last round saw it; `None` on a GPU of its own or unknown.
    pub neighbours: Option<f64>,
    /// How old that figure is (since the controller read the neighbours' sidecars).
    pub neighbours_age: Option<Duration>,
}

/// A neighbour figure older than this is not read ([`admit_flex`]), and the controller forgets a model whose rounds
/// have been silent this long: a controller that stopped writing must neither close the lane for ever nor keep it
/// open on old news.
pub const NEIGHBOURS_MAX_AGE: Duration = Duration::from_secs(120);

/// Why a flex request may not go to a backend now.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum NoRoom {
    /// KV-cache usage at or above the stop threshold.
    #[error("KV cache {:.0}% in use (flex stops at {:.0}%)", .kv * 100.0, .stop_at * 100.0)]
    KvFull {
        /// The usage.
        kv: f64,
        /// The threshold.
        stop_at: f64,
    },
    /// Requests are waiting in the backend's queue.
    #[error(
        "KV cache {:.0}% in use and {:.0}% promised to flex requests (flex stops at {:.0}%)",
        .kv * 100.0, .promised * 100.0, .stop_at * 100.0
    )]
    KvPromised { kv: f64, promised: f64, stop_at: f64 },
    /// Another model on the backend's GPU is close to its TTFT objective: batch work stepping beside it would
    /// slow its steps and cost it a bigger share or a replica.
    #[error(
        "a model sharing the GPU is at {:.0}% of its TTFT objective (flex stops at {:.0}%)",
        .pressure * 100.0, .stop_at * 100.0
    )]
    Neighbour {
        /// The neighbour's pressure.
        pressure: f64,
        /// The threshold.
        stop_at: f64,
    },
    #[error("{waiting} requests waiting in the server's queue")]
    Queue {
        /// How many.
        waiting: f64,
    },
    /// The flex lane already has its share in flight on the backend.
    #[error("{in_flight} flex requests in flight (at most {limit} at this load)")]
    Throttled {
        /// In flight now.
        in_flight: u64,
        /// The limit at this load.
        limit: u64,
    },
}

impl NoRoom {
    /// The metric label.
    pub fn label(&self) -> &'static str {
        self.into()
    }
}

/// Whether a flex request may go to the backend whose room is `room` (see the module docs).
pub fn admit_flex(room: &BackendRoom, limits: &LaneLimits, request_tokens: u64) -> Result<(), NoRoom> {
    let neighbours_fresh = room.neighbours_age.is_some_and(|a| a <= NEIGHBOURS_MAX_AGE);
    if let Some(p) = room.neighbours.filter(|p| neighbours_fresh && p.is_finite())
        && p >= limits.neighbour_stop_at
    {
        return Err(NoRoom::Neighbour {
            pressure: p,
            stop_at: limits.neighbour_stop_at,
        });
    }
    let fresh = room.age.is_some_and(|a| a <= limits.max_age);
    let kv = room.kv.filter(|k| fresh && k.is_finite());
    let waiting = room.waiting.filter(|w| fresh && w.is_finite());
    if let Some(kv) = kv
        && kv >= limits.stop_at
    {
        return Err(NoRoom::KvFull {
            kv,
            stop_at: limits.stop_at,
        });
    }
    // What the flex requests in flight, and this one, may still grow to.
    let promised = room
        .kv_capacity_tokens
        .filter(|c| *c > 0)
        .map(|c| room.flex_tokens.saturating_add(request_tokens) as f64 / c as f64);
    let kv = match (kv, promised) {
        (Some(kv), Some(p)) => {
            if kv + p >= limits.stop_at {
                return Err(NoRoom::KvPromised {
                    kv,
                    promised: p,
                    stop_at: limits.stop_at,
                });
            }
            Some(kv + p)
        }
        (kv, _) => kv,
    };
    if let Some(w) = waiting
        && w > limits.max_waiting
    {
        return Err(NoRoom::Queue { waiting: w });
    }
    let limit = match kv {
        Some(kv) if kv < limits.admit_below => limits.max_in_flight,
        _ => limits.throttle_in_flight,
    };
    if room.flex_in_flight >= limit {
        return Err(NoRoom::Throttled {
            in_flight: room.flex_in_flight,
            limit,
        });
    }
    // The gauges lag the admissions: a burst admitted on one reading would all land before the next shows it.
    // At most `throttle_in_flight` flex requests go per reading, so the lane ramps up at the poll's pace.
    if room.flex_unseen >= limits.throttle_in_flight {
        return Err(NoRoom::Throttled {
            in_flight: room.flex_in_flight,
            limit: room.flex_in_flight,
        });
    }
    Ok(())
}

/// A replica's TTFT pressure: its sidecar's TTFT p95 over the last window (`recent.ttftSeconds.p95`) as a share of
/// its model's TTFT objective (`ttftSlo`). `None` when either is unknown.
pub fn ttft_pressure(recent_p95_secs: Option<f64>, slo_secs: Option<f64>) -> Option<f64> {
    let slo = slo_secs.filter(|s| s.is_finite() && *s > 0.0)?;
    recent_p95_secs
        .filter(|p| p.is_finite() && *p >= 0.0)
        .map(|p| p / slo)
}

/// One pod as the controller's round saw it, for the flex gate of the other pods on its GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct Tenant<P, M, G> {
    /// The pod (a name, an address: whatever the caller keys pods by).
    pub pod: P,
    /// Its model.
    pub model: M,
    /// The GPU it runs on (its capacity pod); `None` on a GPU of its own.
    pub gpu: Option<G>,
    /// Its [`ttft_pressure`].
    pub pressure: Option<f64>,
}

/// For each pod on a shared GPU, the highest [`ttft_pressure`] among the pods of *other* models on that GPU (the
/// figure [`BackendRoom::neighbours`] carries to the gate). Pods of one model are left out of each other's figure:
/// a model's own latency is guarded by its own gauges (KV, queue). Pods with no known neighbour are absent.
///
/// Why: a GPU's tenants share its bandwidth (`sim/src/model/sharing.rs`), so batch lines stepping on one tenant
/// lengthen the others' steps; a neighbour already near its objective answers with a bigger share or another
/// replica, which costs more than the batch saves (measured: `docs/batch.md`, "What it costs").
pub fn neighbour_pressures<P, M, G>(tenants: &[Tenant<P, M, G>]) -> Vec<(P, f64)>
where
    P: Clone,
    M: PartialEq,
    G: Ord,
{
    // Grouped by GPU first: a cluster's pods are compared only with the few on the same GPU, not with each other.
    let mut by_gpu: std::collections::BTreeMap<&G, Vec<&Tenant<P, M, G>>> = std::collections::BTreeMap::new();
    for t in tenants {
        if let Some(g) = &t.gpu {
            by_gpu.entry(g).or_default().push(t);
        }
    }
    tenants
        .iter()
        .filter_map(|t| {
            let worst = by_gpu
                .get(t.gpu.as_ref()?)?
                .iter()
                .filter(|o| o.model != t.model)
                .filter_map(|o| o.pressure)
                .reduce(f64::max)?;
            Some((t.pod.clone(), worst))
        })
        .collect()
}

/// `max_tokens` assumed for a request that gives none: vLLM would let it run to the model's length, which the
/// activator does not know; 1,024 is a long answer for a chat or batch line.
pub const DEFAULT_MAX_TOKENS: u64 = 1_024;

/// How many KV tokens a request may grow to: its prompt (estimated as a token per 4 bytes of its text, which
/// over-counts for most tokenizers: the safe side) plus its `max_tokens` ([`DEFAULT_MAX_TOKENS`] when it gives
/// none). The activator passes what it already read of the body (the prompt's text bytes, `max_tokens` or
/// `max_completion_tokens`), so nothing is parsed twice.
pub fn footprint_tokens(prompt_bytes: usize, max_tokens: Option<u64>) -> u64 {
    (prompt_bytes as u64)
        .div_ceil(4)
        .saturating_add(max_tokens.unwrap_or(DEFAULT_MAX_TOKENS))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn admit_flex_test(room: &BackendRoom, l: &LaneLimits) -> Result<(), NoRoom> {
        admit_flex(room, l, 0)
    }

    #[test]
    fn flex_requests_in_flight_count_at_what_they_will_grow_to() {
        let l = LaneLimits::default();
        // 30% in use; 20 flex requests of 1,000 tokens promised in a 100,000-token cache: 50% would be in use.
        let mut r = room(0.3, 0.0, 20);
        r.flex_tokens = 20_000;
        r.kv_capacity_tokens = Some(100_000);
        // Between admit-below and stop-at: throttled to one in flight, and 20 are.
        assert!(matches!(
            admit_flex(&r, &l, 1_000),
            Err(NoRoom::Throttled { limit: 1, .. })
        ));
        // 25 promised: at stop-at, refused with both figures.
        r.flex_tokens = 29_000;
        let e = admit_flex(&r, &l, 1_000).unwrap_err();
        assert_eq!(e.label(), "kv_promised");
        assert_eq!(
            e.to_string(),
            "KV cache 30% in use and 30% promised to flex requests (flex stops at 60%)"
        );
        // Unknown capacity: the gauge alone, as before.
        r.kv_capacity_tokens = None;
        assert_eq!(admit_flex(&r, &l, 1_000), Ok(()));
        // A small promise under admit-below admits up to max-in-flight.
        r.kv_capacity_tokens = Some(1_000_000);
        r.flex_tokens = 10_000;
        assert_eq!(admit_flex(&r, &l, 1_000), Ok(()));
    }

    #[test]
    fn a_pod_reads_the_worst_other_model_on_its_gpu() {
        let t = |pod: &'static str, model: &'static str, gpu: Option<&'static str>, p: Option<f64>| Tenant {
            pod,
            model,
            gpu,
            pressure: p,
        };
        let tenants = [
            t("chat-0", "chat", Some("gpu-a"), Some(0.9)),
            t("chat-1", "chat", Some("gpu-b"), Some(0.2)),
            t("eval-0", "eval", Some("gpu-a"), Some(0.1)),
            t("code-0", "code", Some("gpu-a"), None),
            t("solo-0", "solo", None, Some(5.0)),
        ];
        let got = neighbour_pressures(&tenants);
        // eval-0 sits beside chat-0 (0.9) and code-0 (unknown): 0.9. chat-0 beside eval-0 (0.1). chat-1 has no
        // other model on gpu-b, solo-0 no GPU to share: absent.
        assert_eq!(got, vec![("chat-0", 0.1), ("eval-0", 0.9), ("code-0", 0.9)]);
        let mut room = room(0.1, 0.0, 0);
        room.neighbours = Some(0.9);
        room.neighbours_age = Some(Duration::from_secs(20));
        let e = admit_flex(&room, &LaneLimits::default(), 0).unwrap_err();
        assert_eq!(e.label(), "neighbour");
        assert_eq!(
            e.to_string(),
            "a model sharing the GPU is at 90% of its TTFT objective (flex stops at 80%)"
        );
        // A figure older than the bound (the controller stopped writing) is not read.
        room.neighbours_age = Some(NEIGHBOURS_MAX_AGE + Duration::from_secs(1));
        assert_eq!(admit_flex(&room, &LaneLimits::default(), 0), Ok(()));
        room.neighbours_age = Some(Duration::from_secs(20));
        room.neighbours = Some(0.5);
        assert_eq!(admit_flex(&room, &LaneLimits::default(), 0), Ok(()));
        assert_eq!(ttft_pressure(Some(1.5), Some(2.0)), Some(0.75));
        assert_eq!(ttft_pressure(Some(1.5), Some(0.0)), None);
        assert_eq!(ttft_pressure(None, Some(2.0)), None);
    }

    #[test]
    fn a_footprint_is_the_prompt_estimate_plus_max_tokens() {
        assert_eq!(footprint_tokens(401, Some(100)), 101 + 100);
        assert_eq!(footprint_tokens(0, None), DEFAULT_MAX_TOKENS);
    }

    fn room(kv: f64, waiting: f64, flex: u64) -> BackendRoom {
        BackendRoom {
            kv: Some(kv),
            waiting: Some(waiting),
            age: Some(Duration::from_millis(100)),
            flex_in_flight: flex,
            flex_unseen: 0,
            flex_tokens: 0,
            kv_capacity_tokens: None,
            neighbours: None,
            neighbours_age: None,
        }
    }

    #[test]
    fn admit_under_half_throttle_to_sixty_stop_above() {
        let l = LaneLimits::default();
        assert_eq!(admit_flex_test(&room(0.3, 0.0, 10), &l), Ok(()));
        assert!(matches!(
            admit_flex_test(&room(0.3, 0.0, 64), &l),
            Err(NoRoom::Throttled { limit: 64, .. })
        ));
        assert_eq!(admit_flex_test(&room(0.55, 0.0, 0), &l), Ok(()));
        assert!(matches!(
            admit_flex_test(&room(0.55, 0.0, 1), &l),
            Err(NoRoom::Throttled { limit: 1, .. })
        ));
        let full = admit_flex_test(&room(0.6, 0.0, 0), &l).unwrap_err();
        assert_eq!(full.label(), "kv_full");
        assert_eq!(full.to_string(), "KV cache 60% in use (flex stops at 60%)");
        assert!(matches!(
            admit_flex_test(&room(0.1, 1.0, 0), &l),
            Err(NoRoom::Queue { .. })
        ));
    }

    #[test]
    fn unknown_or_stale_room_is_the_throttled_band() {
        let l = LaneLimits::default();
        let never = BackendRoom::default();
        assert_eq!(admit_flex(&never, &l, 0), Ok(()));
        let busy = BackendRoom {
            flex_in_flight: 1,
            ..never
        };
        assert!(admit_flex(&busy, &l, 0).is_err());
        // Stale gauges saying "full" are not believed either way.
        let stale = BackendRoom {
            age: Some(Duration::from_secs(60)),
            ..room(0.95, 3.0, 0)
        };
        assert_eq!(admit_flex(&stale, &l, 0), Ok(()));
    }

    #[test]
    fn limits_are_checked() {
        assert!(LaneLimits::default().validate().is_ok());
        let bad = LaneLimits {
            admit_below: 0.7,
            stop_at: 0.6,
            ..LaneLimits::default()
        };
        assert!(bad.validate().unwrap_err().contains("admit-below"));
    }
}
