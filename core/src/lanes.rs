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
            NoRoom::Queue { .. } => "queue",
            NoRoom::Throttled { .. } => "throttled",
        }
    }
}

/// Whether a flex request may go to the backend whose room is `room` (see the module docs).
pub fn admit_flex(room: &BackendRoom, limits: &LaneLimits) -> Result<(), NoRoom> {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn room(kv: f64, waiting: f64, flex: u64) -> BackendRoom {
        BackendRoom {
            kv: Some(kv),
            waiting: Some(waiting),
            age: Some(Duration::from_millis(100)),
            flex_in_flight: flex,
            flex_unseen: 0,
        }
    }

    #[test]
    fn admit_under_half_throttle_to_sixty_stop_above() {
        let l = LaneLimits::default();
        assert_eq!(admit_flex(&room(0.3, 0.0, 10), &l), Ok(()));
        assert!(matches!(
            admit_flex(&room(0.3, 0.0, 64), &l),
            Err(NoRoom::Throttled { limit: 64, .. })
        ));
        assert_eq!(admit_flex(&room(0.55, 0.0, 0), &l), Ok(()));
        assert!(matches!(
            admit_flex(&room(0.55, 0.0, 1), &l),
            Err(NoRoom::Throttled { limit: 1, .. })
        ));
        let full = admit_flex(&room(0.6, 0.0, 0), &l).unwrap_err();
        assert_eq!(full.label(), "kv_full");
        assert_eq!(full.to_string(), "KV cache 60% in use (flex stops at 60%)");
        assert!(matches!(
            admit_flex(&room(0.1, 1.0, 0), &l),
            Err(NoRoom::Queue { .. })
        ));
    }

    #[test]
    fn unknown_or_stale_room_is_the_throttled_band() {
        let l = LaneLimits::default();
        let never = BackendRoom::default();
        assert_eq!(admit_flex(&never, &l), Ok(()));
        let busy = BackendRoom {
            flex_in_flight: 1,
            ..never
        };
        assert!(admit_flex(&busy, &l).is_err());
        // Stale gauges saying "full" are not believed either way.
        let stale = BackendRoom {
            age: Some(Duration::from_secs(60)),
            ..room(0.95, 3.0, 0)
        };
        assert_eq!(admit_flex(&stale, &l), Ok(()));
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
