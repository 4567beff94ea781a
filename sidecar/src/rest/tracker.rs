//! The replica's sleep bookkeeping: its [`RestState`], what the last transitions measured, when to obey an
//! instruction, and what the readiness and liveness probes answer. No I/O and no clock: every change takes the
//! time it happened, so the rules are tested directly.

use tessera_core::sleep::command::{RestCommand, SleepLevel};
use tessera_core::wire::sidecar::{RestState, RestStatus};

/// The bookkeeping behind `/v1/status`'s `rest`.
#[derive(Debug, Clone)]
pub struct Tracker {
    status: RestStatus,
    /// When the last wake completed (Unix ms): an instruction older than it is stale (demand came after it).
    last_wake_ms: Option<u64>,
    /// The `since` of an instruction this sidecar will not try again (it failed or was refused).
    given_up_on: Option<u64>,
    /// Since when vLLM has had nothing running or waiting (Unix ms), while an instruction waits.
    idle_since_ms: Option<u64>,
}

impl Default for Tracker {
    fn default() -> Self {
        Self::new()
    }
}

impl Tracker {
    /// Awake, nothing measured yet.
    pub fn new() -> Self {
        Self {
            status: RestStatus {
                state: RestState::Awake,
                level: None,
                since: None,
                residue_bytes: None,
                freed_bytes: None,
                last_sleep_secs: None,
                last_wake_secs: None,
                wakes_total: 0,
                idle_gaps_secs: Vec::new(),
                canary_failures_total: 0,
                refused: None,
                risks: Vec::new(),
            },
            last_wake_ms: None,
            given_up_on: None,
            idle_since_ms: None,
        }
    }

    /// The risks of this server for sleep mode, as found outside the sidecar and from its model directory.
    pub fn set_risks(&mut self, risks: Vec<String>) {
        self.status.risks = risks;
    }

    /// The status document's `rest`.
    pub fn status(&self) -> &RestStatus {
        &self.status
    }

    /// The state.
    pub fn state(&self) -> RestState {
        self.status.state
    }

    /// The level slept at (while falling asleep, sleeping or waking).
    pub fn level(&self) -> Option<SleepLevel> {
        self.status.level
    }

    /// Readiness for the model: only an awake replica whose last wake passed its canary takes requests; while it
    /// falls asleep, sleeps, wakes or has failed, the activator holds requests as during a cold start.
    pub fn ready(&self) -> bool {
        self.status.state == RestState::Awake
    }

    /// Liveness of the vLLM container: fails once a transition failed its check, so the kubelet restarts it.
    pub fn live(&self) -> bool {
        self.status.state != RestState::Failed
    }

    /// Whether `cmd` is an instruction to act on now: awake, not woken after it (a wake after `since` means
    /// demand arrived; a newer instruction is needed), and not one already given up on.
    pub fn obeys(&self, cmd: &RestCommand) -> bool {
        self.status.state == RestState::Awake
            && self.last_wake_ms.is_none_or(|w| w <= cmd.since_unix_ms)
            && self.given_up_on != Some(cmd.since_unix_ms)
    }

    /// Records vLLM's requests in flight at `now_ms` under an instruction to obey; true once it has been idle
    /// for `settle_ms`.
    pub fn idle_for(&mut self, in_flight: f64, now_ms: u64, settle_ms: u64) -> bool {
        if in_flight > 0.0 {
            self.idle_since_ms = None;
            return false;
        }
        let since = *self.idle_since_ms.get_or_insert(now_ms);
        now_ms.saturating_sub(since) >= settle_ms
    }

    /// Forgets idleness (no instruction to obey).
    pub fn not_asked(&mut self) {
        self.idle_since_ms = None;
    }

    fn enter(&mut self, state: RestState, now: f64) {
        self.status.state = state;
        self.status.since = Some(now);
    }

    /// `/sleep` is about to be sent.
    pub fn falling_asleep(&mut self, level: SleepLevel, now: f64) {
        self.idle_since_ms = None;
        self.status.level = Some(level);
        self.status.refused = None;
        self.enter(RestState::FallingAsleep, now);
    }

    /// The server will not sleep (no sleep endpoints, no canary answer): stay awake, say why, and do not try this
    /// instruction again.
    pub fn refuse(&mut self, cmd: &RestCommand, why: String, now: f64) {
        self.given_up_on = Some(cmd.since_unix_ms);
        self.status.refused = Some(why);
        self.status.level = None;
        self.idle_since_ms = None;
        self.enter(RestState::Awake, now);
    }

    /// The sleep checked out: asleep, with what the memory reading measured (`None` where not measured).
    pub fn asleep(&mut self, before: Option<u64>, after: Option<u64>, took_secs: f64, now: f64) {
        self.status.residue_bytes = after;
        self.status.freed_bytes = before.zip(after).map(|(b, a)| b.saturating_sub(a));
        self.status.last_sleep_secs = Some(took_secs);
        self.enter(RestState::Sleeping, now);
    }

    /// `/wake_up` is about to be sent: the sleep that ends counts as one of the model's idle gaps.
    pub fn waking(&mut self, now: f64) {
        if self.status.state == RestState::Sleeping
            && let Some(since) = self.status.since
        {
            let gaps = &mut self.status.idle_gaps_secs;
            if gaps.len() == tessera_core::pack::sleeping::GAPS_KEPT {
                gaps.remove(0);
            }
            gaps.push((now - since).max(0.0));
        }
        self.enter(RestState::Waking, now);
    }

    /// The wake checked out (the canary answered as before the sleep).
    pub fn woke(&mut self, took_secs: f64, now: f64) {
        self.status.wakes_total += 1;
        self.status.last_wake_secs = Some(took_secs);
        self.status.level = None;
        self.last_wake_ms = Some((now * 1000.0) as u64);
        self.enter(RestState::Awake, now);
    }

    /// A transition failed its check: the pod must restart (liveness fails from now on).
    pub fn failed(&mut self, why: String, canary: bool, now: f64) {
        if canary {
            self.status.canary_failures_total += 1;
        }
        self.status.refused = Some(why);
        self.enter(RestState::Failed, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(since: u64) -> RestCommand {
        RestCommand {
            level: SleepLevel::One,
            since_unix_ms: since,
        }
    }

    #[test]
    fn a_wake_after_the_instruction_waits_for_a_newer_one() {
        let mut t = Tracker::new();
        assert!(t.obeys(&cmd(1_000)) && t.ready() && t.live());
        t.falling_asleep(SleepLevel::One, 2.0);
        assert!(!t.ready() && !t.obeys(&cmd(1_000)));
        t.asleep(Some(10_000), Some(1_000), 0.2, 2.2);
        assert_eq!(
            (t.status().freed_bytes, t.status().residue_bytes),
            (Some(9_000), Some(1_000))
        );
        assert_eq!(t.state(), RestState::Sleeping);
        t.waking(5.0);
        assert!(!t.ready());
        t.woke(0.5, 5.5);
        assert!(t.ready());
        assert_eq!(t.status().wakes_total, 1);
        assert_eq!(
            t.status().idle_gaps_secs,
            [5.0 - 2.2],
            "asleep at 2.2 s, woken at 5 s"
        );
        assert!(
            !t.obeys(&cmd(1_000)),
            "woken at 5.5 s, after the instruction of 1 s"
        );
        assert!(t.obeys(&cmd(6_000)), "a newer instruction");
    }

    #[test]
    fn idleness_must_last_the_settle_period() {
        let mut t = Tracker::new();
        assert!(!t.idle_for(0.0, 1_000, 500));
        assert!(!t.idle_for(1.0, 1_200, 500), "a request restarts the wait");
        assert!(!t.idle_for(0.0, 1_300, 500));
        assert!(t.idle_for(0.0, 1_800, 500));
    }

    #[test]
    fn a_refusal_is_not_retried_and_a_failure_fails_liveness() {
        let mut t = Tracker::new();
        t.refuse(&cmd(7), "no /sleep".into(), 1.0);
        assert!(t.ready() && !t.obeys(&cmd(7)) && t.obeys(&cmd(8)));
        assert_eq!(t.status().refused.as_deref(), Some("no /sleep"));
        t.failed("canary differs".into(), true, 2.0);
        assert!(!t.live() && !t.ready());
        assert_eq!(t.status().canary_failures_total, 1);
        // Unmeasured memory stays unmeasured.
        let mut t = Tracker::new();
        t.asleep(None, None, 0.1, 1.0);
        assert_eq!((t.status().freed_bytes, t.status().residue_bytes), (None, None));
    }
}
