//! The rule for a `coordination.k8s.io/v1` Lease, shared by leader election (autoscaler) and the per-GPU start-up
//! gate (sidecar): who may create, renew or take over a lease, given what was read.
//!
//! Expiry is judged by **local observation**, as client-go's leaderelection does: a candidate considers a lease
//! expired when `leaseDurationSeconds` have passed *on its own clock* since it first saw the lease's current
//! `resourceVersion`, not since the `renewTime` written by another machine's clock. Clock skew between nodes
//! therefore cannot make a candidate take a live lease early. Writes carry the `resourceVersion` that was read, so
//! of two candidates racing for an expired lease exactly one wins (the other gets 409 Conflict).

use std::time::Duration;

/// What a candidate should do with the lease it just read. Pure: see [`decide`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseDecision {
    /// No lease exists: create it.
    Create,
    /// We hold it: renew.
    Renew,
    /// Someone else held it and it expired (or nobody holds it): take it over.
    Acquire,
    /// Someone else holds a live lease: follow until it expires.
    Follow {
        /// The current holder.
        holder: String,
        /// Milliseconds (our clock) until we may try to take over.
        expires_in_ms: u64,
    },
}

/// The parts of a lease the decision needs, plus when *we* first saw its current version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseObservation {
    /// `spec.holderIdentity` (None or empty: released).
    pub holder: Option<String>,
    /// `spec.leaseDurationSeconds`.
    pub duration: Duration,
    /// `metadata.resourceVersion`.
    pub resource_version: String,
    /// Our clock (Unix ms) when we first saw this `resource_version`.
    pub first_seen_ms: u64,
}

impl LeaseObservation {
    /// The observation of `resource_version` at `now_ms`, keeping the first-seen time of `previous` when it saw the
    /// same version (a lease nobody renewed keeps ageing on our clock).
    pub fn observe(
        previous: Option<&LeaseObservation>,
        holder: Option<String>,
        duration: Duration,
        resource_version: String,
        now_ms: u64,
    ) -> LeaseObservation {
        let first_seen_ms = match previous {
            Some(p) if p.resource_version == resource_version => p.first_seen_ms,
            _ => now_ms,
        };
        LeaseObservation {
            holder,
            duration,
            resource_version,
            first_seen_ms,
        }
    }
}

/// Decides what to do with a lease. `now_ms` is our clock in Unix milliseconds.
pub fn decide(lease: Option<&LeaseObservation>, me: &str, now_ms: u64) -> LeaseDecision {
    let Some(lease) = lease else {
        return LeaseDecision::Create;
    };
    match lease.holder.as_deref() {
        Some(h) if h == me => LeaseDecision::Renew,
        None | Some("") => LeaseDecision::Acquire,
        Some(holder) => {
            let expires_at = lease
                .first_seen_ms
                .saturating_add(u64::try_from(lease.duration.as_millis()).unwrap_or(u64::MAX));
            if now_ms >= expires_at {
                LeaseDecision::Acquire
            } else {
                LeaseDecision::Follow {
                    holder: holder.to_owned(),
                    expires_in_ms: expires_at - now_ms,
                }
            }
        }
    }
}

/// Whether a holder whose renewals fail must give up: its last successful renewal (Unix ms, `None` when it has
/// not held the lease since) is `renew_deadline` or more before `now_ms`.
pub fn renew_deadline_passed(last_renew_ms: Option<u64>, now_ms: u64, renew_deadline: Duration) -> bool {
    let deadline = u64::try_from(renew_deadline.as_millis()).unwrap_or(u64::MAX);
    last_renew_ms.is_some_and(|t| now_ms.saturating_sub(t) >= deadline)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(holder: Option<&str>, rv: &str, first_seen_ms: u64) -> LeaseObservation {
        LeaseObservation {
            holder: holder.map(str::to_owned),
            duration: Duration::from_secs(15),
            resource_version: rv.to_owned(),
            first_seen_ms,
        }
    }

    #[test]
    fn decisions() {
        assert_eq!(decide(None, "a", 0), LeaseDecision::Create);
        assert_eq!(
            decide(Some(&obs(Some("a"), "1", 0)), "a", 99_000),
            LeaseDecision::Renew
        );
        assert_eq!(decide(Some(&obs(None, "1", 0)), "a", 0), LeaseDecision::Acquire);
        assert_eq!(
            decide(Some(&obs(Some(""), "1", 0)), "a", 0),
            LeaseDecision::Acquire
        );
        assert_eq!(
            decide(Some(&obs(Some("b"), "1", 1_000)), "a", 10_000),
            LeaseDecision::Follow {
                holder: "b".into(),
                expires_in_ms: 6_000
            }
        );
        assert_eq!(
            decide(Some(&obs(Some("b"), "1", 1_000)), "a", 16_000),
            LeaseDecision::Acquire
        );
    }

    #[test]
    fn a_renewed_lease_starts_ageing_again_on_our_clock() {
        // `b` holds the lease at version `rv`, seen at `now_ms`.
        let observe = |prev: Option<&LeaseObservation>, rv: &str, now_ms| {
            LeaseObservation::observe(prev, Some("b".into()), Duration::from_secs(15), rv.into(), now_ms)
        };
        let first = observe(None, "1", 1_000);
        let same = observe(Some(&first), "1", 9_000);
        assert_eq!(same.first_seen_ms, 1_000);
        let renewed = observe(Some(&same), "2", 12_000);
        assert_eq!(renewed.first_seen_ms, 12_000);
    }

    #[test]
    fn deadline_edge() {
        let d = Duration::from_secs(10);
        assert!(!renew_deadline_passed(None, 100_000, d));
        assert!(!renew_deadline_passed(Some(1_000), 10_999, d));
        assert!(renew_deadline_passed(Some(1_000), 11_000, d));
    }
}
