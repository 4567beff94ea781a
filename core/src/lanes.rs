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
}

/// Why a flex request may not go to a backend now.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
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
        match self {
            NoRoom::KvFull { .. } => "kv_full",
            NoRoom::KvPromised { .. } => "kv_promised",
            NoRoom::Queue { .. } => "queue",
            NoRoom::Throttled { .. } => "throttled",
        }
    }
}

/// Whether a flex request may go to the backend whose room is `room` (see the module docs).
pub fn admit_flex(room: &BackendRoom, limits: &LaneLimits, request_tokens: u64) -> Result<(), NoRoom> {
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
