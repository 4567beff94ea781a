//! The controller's instruction to one pod: the `tessera.dev/rest` annotation.
//!
//! Absent: stay awake. `sleep level=1 since=1764240000000`: sleep at that level once idle. `since` (Unix
//! milliseconds, the controller's clock) is the moment the controller decided; a sidecar that was woken after it
//! (a request arrived) does not fall asleep again on the same instruction, so a wake can never race with a stale
//! annotation. The controller writes a new instruction (a later `since`) when the model has been idle again.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The pod annotation the controller writes and the sidecar reads.
pub const ANNOTATION: &str = "tessera.dev/rest";

/// vLLM's sleep levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SleepLevel {
    /// Weights offloaded to pinned host memory (needs host memory for a copy of them), KV cache dropped.
    One,
    /// Weights and KV cache dropped; a wake reloads the weights (slower wake, no host memory).
    Two,
}

impl SleepLevel {
    /// The number vLLM's `/sleep?level=` takes.
    pub fn as_u8(self) -> u8 {
        match self {
            SleepLevel::One => 1,
            SleepLevel::Two => 2,
        }
    }

    /// From vLLM's number.
    pub fn from_u8(n: u8) -> Option<Self> {
        match n {
            1 => Some(SleepLevel::One),
            2 => Some(SleepLevel::Two),
            _ => None,
        }
    }
}

/// The instruction in [`ANNOTATION`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestCommand {
    /// The level to sleep at.
    pub level: SleepLevel,
    /// When the controller decided (Unix ms).
    pub since_unix_ms: u64,
}

impl fmt::Display for RestCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "sleep level={} since={}",
            self.level.as_u8(),
            self.since_unix_ms
        )
    }
}

/// Why an annotation value is not an instruction.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{ANNOTATION}={value:?} is not an instruction: {why} (expected `sleep level=1|2 since=<unix ms>`)")]
pub struct BadRestCommand {
    /// The value read.
    pub value: String,
    /// What is wrong with it.
    pub why: &'static str,
}

impl FromStr for RestCommand {
    type Err = BadRestCommand;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let bad = |why| BadRestCommand {
            value: value.chars().take(200).collect(),
            why,
        };
        let mut words = value.split_whitespace();
        if words.next() != Some("sleep") {
            return Err(bad("it does not start with `sleep`"));
        }
        let (mut level, mut since) = (None, None);
        for word in words {
            match word.split_once('=') {
                Some(("level", v)) => {
                    level = Some(
                        v.parse::<u8>()
                            .ok()
                            .and_then(SleepLevel::from_u8)
                            .ok_or_else(|| bad("level is not 1 or 2"))?,
                    )
                }
                Some(("since", v)) => {
                    since = Some(
                        v.parse::<u64>()
                            .map_err(|_| bad("since is not Unix milliseconds"))?,
                    )
                }
                _ => return Err(bad("an unknown word")),
            }
        }
        Ok(RestCommand {
            level: level.ok_or_else(|| bad("level is missing"))?,
            since_unix_ms: since.ok_or_else(|| bad("since is missing"))?,
        })
    }
}

/// What to do with one pod's instruction after a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Instruct {
    /// Leave the annotation as it is.
    Keep,
    /// Write this instruction.
    Write(RestCommand),
    /// Take the annotation off: the model does not sleep now, and a woken pod serving rising traffic must not fall
    /// asleep on an old instruction.
    Clear,
}

/// The pod's instruction after a round that chose `sleep` (the level the model sleeps at zero, `None` when it does
/// not sleep now), given the pod's `current` instruction and when its sidecar last turned awake (`awake_since_ms`,
/// Unix ms): a pod with none, one at another level, or one woken after its instruction (demand came) gets a fresh
/// one dated `now_ms`.
pub fn instruct(
    sleep: Option<SleepLevel>,
    current: Option<RestCommand>,
    awake_since_ms: Option<f64>,
    now_ms: u64,
) -> Instruct {
    let fresh = |level| {
        Instruct::Write(RestCommand {
            level,
            since_unix_ms: now_ms,
        })
    };
    match (sleep, current) {
        (Some(level), None) => fresh(level),
        (Some(level), Some(c))
            if c.level != level || awake_since_ms.is_some_and(|t| t > c.since_unix_ms as f64) =>
        {
            fresh(level)
        }
        (None, Some(_)) => Instruct::Clear,
        _ => Instruct::Keep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_gets_a_fresh_instruction_only_when_it_has_none_or_woke_since() {
        let c = RestCommand {
            level: SleepLevel::One,
            since_unix_ms: 1_000,
        };
        let one = Some(SleepLevel::One);
        assert_eq!(
            instruct(one, None, None, 5_000),
            Instruct::Write(RestCommand {
                since_unix_ms: 5_000,
                ..c
            })
        );
        assert_eq!(instruct(one, Some(c), Some(500.0), 5_000), Instruct::Keep);
        assert_eq!(
            instruct(one, Some(c), Some(2_000.0), 5_000),
            Instruct::Write(RestCommand {
                since_unix_ms: 5_000,
                ..c
            })
        );
        assert_eq!(
            instruct(Some(SleepLevel::Two), Some(c), None, 5_000),
            Instruct::Write(RestCommand {
                level: SleepLevel::Two,
                since_unix_ms: 5_000
            })
        );
        assert_eq!(instruct(None, Some(c), None, 5_000), Instruct::Clear);
        assert_eq!(instruct(None, None, None, 5_000), Instruct::Keep);
    }

    #[test]
    fn round_trips_and_names_what_is_wrong() {
        let c = RestCommand {
            level: SleepLevel::Two,
            since_unix_ms: 1_764_240_000_000,
        };
        assert_eq!(c.to_string().parse::<RestCommand>(), Ok(c));
        for (v, why) in [
            ("wake", "it does not start with `sleep`"),
            ("sleep level=3 since=1", "level is not 1 or 2"),
            ("sleep level=1", "since is missing"),
            ("sleep since=5", "level is missing"),
            ("sleep level=1 since=x", "since is not Unix milliseconds"),
            ("sleep level=1 since=1 now=2", "an unknown word"),
        ] {
            assert_eq!(v.parse::<RestCommand>().map_err(|e| e.why), Err(why), "{v}");
        }
    }
}
