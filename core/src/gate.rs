//! The start-up gate: vLLM servers sharing one GPU start one at a time.
//!
//! vLLM sizes its KV cache by profiling free GPU memory at start-up; a neighbour that loads at the same moment is
//! counted as its own usage (vLLM issues #55827, #9198, #10533), so two servers starting together on one GPU can
//! both mis-size their caches or fail to start. The sidecar runs as a native sidecar (it starts before vLLM), and
//! its startup probe passes only once it holds the GPU's start-up `Lease`; kubelet starts the vLLM container only
//! after that. The sidecar renews the lease while vLLM loads and releases it when vLLM answers `/health`, or when
//! the start-up timeout runs out (a server that never becomes healthy must not block the GPU forever).
//!
//! This module is the pure rule: given the phase, the lease as read and whether vLLM is ready, what to do next.
//! The I/O (reading and writing the Lease) is in the sidecar.

use std::time::Duration;

use crate::lease::{LeaseDecision, LeaseObservation, decide};

/// Where a pod is in its start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Not holding the GPU's lease yet; vLLM has not been started.
    Waiting {
        /// When this sidecar began to wait (Unix ms).
        since_ms: u64,
    },
    /// Holding the lease: vLLM is loading.
    Holding {
        /// When the lease was taken (Unix ms).
        since_ms: u64,
    },
    /// The gate is open for the rest of the pod's life.
    Open(OpenReason),
}

/// Why the gate is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenReason {
    /// The pod has a whole GPU (or no GPU): nobody shares its memory, so there is nothing to serialise.
    NotShared,
    /// vLLM answered `/health`: its profiling is over, the next pod may start.
    VllmReady,
    /// vLLM did not become ready within the start-up timeout; the lease was released so the GPU is not blocked.
    StartupTimeout,
    /// Another pod took the lease while this one was still loading (our renewals failed past the lease duration).
    LeaseLost,
    /// The Kubernetes API could not be reached for too long: the gate fails open rather than block the pod.
    ApiUnavailable,
    /// This pod waited longer than any honest start-up queue takes: the holder keeps renewing past a start-up
    /// (a broken co-tenant, or a hostile one that guessed the lease's name and took it). The gate fails open, so
    /// no tenant can keep another's vLLM from starting; it then starts unserialised, as without Tessera.
    WaitTimeout,
}

impl OpenReason {
    /// A stable snake_case label for metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            OpenReason::NotShared => "not_shared",
            OpenReason::VllmReady => "vllm_ready",
            OpenReason::StartupTimeout => "startup_timeout",
            OpenReason::LeaseLost => "lease_lost",
            OpenReason::ApiUnavailable => "api_unavailable",
            OpenReason::WaitTimeout => "wait_timeout",
        }
    }
}

/// What the sidecar must do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Create the lease (none exists) with us as holder.
    Create,
    /// Take the released or expired lease (a write carrying the read `resourceVersion`).
    Acquire,
    /// We hold it and vLLM is still loading: renew.
    Renew,
    /// Give the lease up (clear the holder) and open the gate for good.
    Release(OpenReason),
    /// Another pod holds a live lease: keep waiting (the startup endpoint keeps failing, saying who holds it).
    Wait {
        /// The holder (`namespace/pod`).
        holder: String,
        /// Our clock's milliseconds until we may take an unrenewed lease over.
        expires_in_ms: u64,
    },
    /// Open and not holding: nothing to do.
    Nothing,
    /// Another pod took over our lease while vLLM was loading; open the gate (vLLM already started) and stop.
    Lost {
        /// Who holds it now.
        holder: String,
    },
}

/// Decides the next step. `lease` is what was just read (`None`: no lease object), `me` the identity written as
/// holder, `vllm_ready` whether vLLM answered `/health`.
/// How long a start-up may hold the GPU, and how long a pod waits for it at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A holder releases the lease after this long even if vLLM never became ready.
    pub startup_timeout: Duration,
    /// A waiter opens its gate after this long, whoever holds the lease: the lease's name is derived from the
    /// GPU's UUID, which every tenant of the GPU sees, and every tenant may write Leases there, so a co-tenant
    /// can hold it and renew forever. Above `startup_timeout` by the length of an honest queue.
    pub max_wait: Duration,
}

pub fn step(
    phase: &Phase,
    lease: Option<&LeaseObservation>,
    me: &str,
    vllm_ready: bool,
    now_ms: u64,
    limits: Limits,
) -> Action {
    match phase {
        Phase::Open(_) => Action::Nothing,
        Phase::Holding { since_ms } => {
            if vllm_ready {
                return Action::Release(OpenReason::VllmReady);
            }
            let timeout = u64::try_from(limits.startup_timeout.as_millis()).unwrap_or(u64::MAX);
            if now_ms.saturating_sub(*since_ms) >= timeout {
                return Action::Release(OpenReason::StartupTimeout);
            }
            match decide(lease, me, now_ms) {
                LeaseDecision::Renew => Action::Renew,
                // The lease vanished or was released by someone else: take it back, we are still loading.
                LeaseDecision::Create => Action::Create,
                LeaseDecision::Acquire => Action::Acquire,
                LeaseDecision::Follow { holder, .. } => Action::Lost { holder },
            }
        }
        Phase::Waiting { since_ms } => match decide(lease, me, now_ms) {
            LeaseDecision::Create => Action::Create,
            LeaseDecision::Acquire => Action::Acquire,
            // We hold it already (the sidecar container restarted while holding): carry on holding.
            LeaseDecision::Renew => Action::Renew,
            // Waited past any honest queue: open (writing nothing, the lease is not ours).
            LeaseDecision::Follow { .. }
                if now_ms.saturating_sub(*since_ms)
                    >= u64::try_from(limits.max_wait.as_millis()).unwrap_or(u64::MAX) =>
            {
                Action::Release(OpenReason::WaitTimeout)
            }
            LeaseDecision::Follow {
                holder,
                expires_in_ms,
            } => Action::Wait {
                holder,
                expires_in_ms,
            },
        },
    }
}

/// The phase after `action` was carried out successfully at `now_ms` (a failed or conflicting write leaves the
/// phase as it was: the next round reads the lease again).
pub fn after(phase: &Phase, action: &Action, now_ms: u64) -> Phase {
    match (phase, action) {
        (Phase::Waiting { .. }, Action::Create | Action::Acquire | Action::Renew) => {
            Phase::Holding { since_ms: now_ms }
        }
        (_, Action::Release(reason)) => Phase::Open(*reason),
        (_, Action::Lost { .. }) => Phase::Open(OpenReason::LeaseLost),
        _ => phase.clone(),
    }
}

/// Whether the startup endpoint passes: only while holding the lease, or once open for good.
pub fn passes(phase: &Phase) -> bool {
    !matches!(phase, Phase::Waiting { .. })
}

/// The prefix of every start-up Lease's name ([`lease_name`]).
pub const LEASE_NAME_PREFIX: &str = "tessera-startup-";

/// The annotation on a start-up Lease listing the pods waiting for it: a JSON object, pod → Unix ms since it
/// waits ([`waiters`] reads it).
pub const WAITING_ANNOTATION: &str = "tessera.dev/startup-waiting";

/// The pods listed in a [`WAITING_ANNOTATION`] value (pod → Unix ms since it waits); an absent or unreadable
/// value lists none.
pub fn waiters(annotation: Option<&str>) -> std::collections::BTreeMap<String, u64> {
    annotation
        .and_then(|r| serde_json::from_str(r).ok())
        .unwrap_or_default()
}

/// The name of a GPU's start-up Lease (in the pool namespace): `tessera-startup-<uuid>`, lower-cased with anything
/// outside `[a-z0-9-]` replaced, cut to a valid object name. The sidecar's gate takes and renews it; the
/// autoscaler's GPU page shows who holds it.
pub fn lease_name(gpu_uuid: &str) -> String {
    let clean: String = gpu_uuid
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let mut name = format!("{LEASE_NAME_PREFIX}{}", clean.trim_matches('-'));
    name.truncate(253);
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Limits = Limits {
        startup_timeout: Duration::from_secs(600),
        max_wait: Duration::from_secs(1_800),
    };

    fn held_by(holder: &str, rv: &str, first_seen_ms: u64) -> LeaseObservation {
        LeaseObservation {
            holder: Some(holder.to_owned()),
            duration: Duration::from_secs(15),
            resource_version: rv.to_owned(),
            first_seen_ms,
        }
    }

    #[test]
    fn startup_gate_first_pod_creates_the_lease_and_passes() {
        let waiting = Phase::Waiting { since_ms: 0 };
        assert!(!passes(&waiting));
        let action = step(&waiting, None, "ns/a", false, 1_000, T);
        assert_eq!(action, Action::Create);
        let holding = after(&waiting, &action, 1_000);
        assert_eq!(holding, Phase::Holding { since_ms: 1_000 });
        assert!(passes(&holding));
    }

    #[test]
    fn startup_gate_second_pod_waits_and_names_the_holder() {
        let waiting = Phase::Waiting { since_ms: 0 };
        let action = step(
            &waiting,
            Some(&held_by("ns/a", "7", 1_000)),
            "ns/b",
            false,
            5_000,
            T,
        );
        assert_eq!(
            action,
            Action::Wait {
                holder: "ns/a".into(),
                expires_in_ms: 11_000
            }
        );
        assert_eq!(after(&waiting, &action, 5_000), waiting);
        assert!(!passes(&waiting));
    }

    #[test]
    fn startup_gate_releases_when_vllm_is_ready_and_stays_open() {
        let holding = Phase::Holding { since_ms: 1_000 };
        let action = step(
            &holding,
            Some(&held_by("ns/a", "8", 2_000)),
            "ns/a",
            true,
            60_000,
            T,
        );
        assert_eq!(action, Action::Release(OpenReason::VllmReady));
        let open = after(&holding, &action, 60_000);
        assert_eq!(open, Phase::Open(OpenReason::VllmReady));
        assert!(passes(&open));
        assert_eq!(step(&open, None, "ns/a", false, 70_000, T), Action::Nothing);
    }

    #[test]
    fn startup_gate_renews_while_loading_and_releases_at_the_timeout() {
        let holding = Phase::Holding { since_ms: 0 };
        let lease = held_by("ns/a", "8", 0);
        assert_eq!(
            step(&holding, Some(&lease), "ns/a", false, 599_999, T),
            Action::Renew
        );
        assert_eq!(
            step(&holding, Some(&lease), "ns/a", false, 600_000, T),
            Action::Release(OpenReason::StartupTimeout)
        );
    }

    #[test]
    fn startup_gate_a_crashed_holder_is_taken_over_after_the_lease_duration() {
        let waiting = Phase::Waiting { since_ms: 0 };
        // Seen first at 1 s and never renewed (same resourceVersion): expired on our clock at 16 s.
        let stale = held_by("ns/dead", "9", 1_000);
        assert!(matches!(
            step(&waiting, Some(&stale), "ns/b", false, 15_999, T),
            Action::Wait { .. }
        ));
        assert_eq!(
            step(&waiting, Some(&stale), "ns/b", false, 16_000, T),
            Action::Acquire
        );
    }

    #[test]
    fn startup_gate_a_released_lease_is_taken_at_once() {
        let released = LeaseObservation {
            holder: None,
            duration: Duration::from_secs(1),
            resource_version: "10".into(),
            first_seen_ms: 50_000,
        };
        assert_eq!(
            step(
                &Phase::Waiting { since_ms: 0 },
                Some(&released),
                "ns/b",
                false,
                50_000,
                T
            ),
            Action::Acquire
        );
    }

    #[test]
    fn startup_gate_whole_gpu_pods_are_open_from_the_start() {
        let open = Phase::Open(OpenReason::NotShared);
        assert!(passes(&open));
        assert_eq!(
            step(&open, Some(&held_by("ns/x", "1", 0)), "ns/a", false, 1, T),
            Action::Nothing
        );
    }

    #[test]
    fn startup_gate_a_holder_that_lost_its_lease_opens_instead_of_waiting_forever() {
        let holding = Phase::Holding { since_ms: 0 };
        let action = step(
            &holding,
            Some(&held_by("ns/c", "11", 20_000)),
            "ns/a",
            false,
            21_000,
            T,
        );
        assert_eq!(
            action,
            Action::Lost {
                holder: "ns/c".into()
            }
        );
        assert_eq!(
            after(&holding, &action, 21_000),
            Phase::Open(OpenReason::LeaseLost)
        );
    }

    #[test]
    fn startup_gate_a_holder_that_never_lets_go_cannot_keep_a_waiter_from_starting() {
        // A co-tenant took the GPU's lease (its name is guessable) and renews it forever: the resourceVersion
        // changes at every read, so it never looks expired.
        let waiting = Phase::Waiting { since_ms: 0 };
        let renewed = |rv: u64, at: u64| held_by("other-team/squatter", &rv.to_string(), at);
        assert!(matches!(
            step(
                &waiting,
                Some(&renewed(1, 1_799_000)),
                "ns/a",
                false,
                1_799_999,
                T
            ),
            Action::Wait { .. }
        ));
        let at_bound = step(
            &waiting,
            Some(&renewed(2, 1_800_000)),
            "ns/a",
            false,
            1_800_000,
            T,
        );
        assert_eq!(at_bound, Action::Release(OpenReason::WaitTimeout));
        assert_eq!(
            after(&waiting, &at_bound, 1_800_000),
            Phase::Open(OpenReason::WaitTimeout)
        );
        assert!(passes(&Phase::Open(OpenReason::WaitTimeout)));
        // A free lease at the same moment is still taken: the bound only ends a wait behind someone else.
        assert_eq!(step(&waiting, None, "ns/a", false, 1_800_000, T), Action::Create);
    }
}
