//! What the activator counts of each model's requests for the class rule: the tier each asked for, whether it
//! streamed, and its prompt's length. Also the lane a request takes through the activator's gate ([`Lane::of`]).

use serde::{Deserialize, Serialize};

use super::detect::TierCounts;
use super::shape::Moments;

/// The lane a request takes through the activator: which tier it asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Lane {
    /// OpenAI `service_tier: priority`, or a vLLM `priority` below 0: served first, never gated.
    Priority,
    /// Neither: the real-time lane, never gated.
    Default,
    /// OpenAI `service_tier: flex`, a vLLM `priority` above 0, or a request of a batch-class model: admitted only
    /// while the backend has room.
    Flex,
}

impl Lane {
    /// The vLLM `priority` this lane's requests carry where the server schedules by priority (lower runs first):
    /// flex the batch class's, the priority tier ahead of the default lane's 0; the default lane is left alone.
    pub fn vllm_priority(self) -> Option<i64> {
        match self {
            Lane::Flex => Some(i64::from(
                super::ClassPolicy::of(super::WorkloadClass::Batch).vllm_priority,
            )),
            Lane::Priority => Some(-1),
            Lane::Default => None,
        }
    }

    /// The `priority` to write into a request's body under `--lane-priority`, given the priority the body itself
    /// gives (`None`: send the body as it is).
    ///
    /// A flex-lane request (`service_tier: flex`, and every batch line) always carries the batch class's
    /// priority, whatever its body says: `docs/policies.md` promises that a batch request never runs ahead of a
    /// real-time one, and a body's own `"priority": -100` would otherwise put it first in vLLM's queue. The other
    /// lanes are real time: their own priority is kept, and the priority tier gets its lane's only where the body
    /// has none.
    pub fn priority_to_send(self, own: Option<i64>) -> Option<i64> {
        match (self, own) {
            (Lane::Flex, own) => Lane::Flex.vllm_priority().filter(|p| own != Some(*p)),
            (_, Some(_)) => None,
            (lane, None) => lane.vllm_priority(),
        }
    }

    /// The lane of one request from its body's `service_tier` and vLLM `priority`. An explicit tier wins over the
    /// priority number; anything unrecognised is the default lane (a typo never demotes a request).
    pub fn of(service_tier: Option<&str>, priority: Option<i64>) -> Lane {
        match service_tier {
            Some("flex") => return Lane::Flex,
            Some("priority") => return Lane::Priority,
            _ => {}
        }
        match priority {
            Some(p) if p < 0 => Lane::Priority,
            Some(p) if p > 0 => Lane::Flex,
            _ => Lane::Default,
        }
    }

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Lane::Priority => "priority",
            Lane::Default => "default",
            Lane::Flex => "flex",
        }
    }
}

/// Counts of one model's requests at one activator since it started (or several activators' added up).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestMix {
    /// Requests by lane.
    #[serde(default)]
    pub tiers: TierCounts,
    /// Requests whose body said whether to stream.
    #[serde(default)]
    pub stream_counted: u64,
    /// Of those, the ones that streamed.
    #[serde(default)]
    pub streamed: u64,
    /// The prompts' lengths, in bytes of `prompt` or of the messages' `content` (only their spread is read).
    #[serde(default)]
    pub prompt_bytes: Moments,
}

impl RequestMix {
    /// Counts one request.
    pub fn count(&mut self, lane: Lane, stream: Option<bool>, prompt_bytes: Option<usize>) {
        let t = &mut self.tiers;
        let slot = match lane {
            Lane::Priority => &mut t.priority,
            Lane::Default => &mut t.default,
            Lane::Flex => &mut t.flex,
        };
        *slot = slot.saturating_add(1);
        if let Some(s) = stream {
            self.stream_counted = self.stream_counted.saturating_add(1);
            self.streamed = self.streamed.saturating_add(u64::from(s));
        }
        if let Some(n) = prompt_bytes {
            self.prompt_bytes.push(n as f64);
        }
    }

    /// Two counts as one (a model behind several activators).
    pub fn merge(&self, other: &RequestMix) -> RequestMix {
        RequestMix {
            tiers: self.tiers.add(&other.tiers),
            stream_counted: self.stream_counted.saturating_add(other.stream_counted),
            streamed: self.streamed.saturating_add(other.streamed),
            prompt_bytes: self.prompt_bytes.merge(&other.prompt_bytes),
        }
    }

    /// `(counted, streamed)` when any request said whether to stream.
    pub fn streamed(&self) -> Option<(u64, u64)> {
        (self.stream_counted > 0).then_some((self.stream_counted, self.streamed))
    }
}

#[cfg(test)]
mod tests {

    /// Issue 53 N18: a flex request or batch line never keeps a priority that would put it ahead of real time.
    #[test]
    fn the_flex_lane_sets_its_priority_whatever_the_body_says() {
        let batch =
            i64::from(super::super::ClassPolicy::of(super::super::WorkloadClass::Batch).vllm_priority);
        for own in [None, Some(-100), Some(-1), Some(0), Some(3), Some(1_000)] {
            assert_eq!(Lane::Flex.priority_to_send(own), Some(batch), "flex with {own:?}");
        }
        assert_eq!(Lane::Flex.priority_to_send(Some(batch)), None, "already right");
        assert_eq!(Lane::Priority.priority_to_send(None), Some(-1));
        assert_eq!(Lane::Priority.priority_to_send(Some(-7)), None);
        assert_eq!(Lane::Default.priority_to_send(None), None);
        assert_eq!(Lane::Default.priority_to_send(Some(0)), None);
    }

    use super::*;

    #[test]
    fn lanes_from_tier_and_priority() {
        assert_eq!(Lane::of(Some("flex"), None), Lane::Flex);
        assert_eq!(Lane::of(Some("flex"), Some(-5)), Lane::Flex);
        assert_eq!(Lane::of(Some("priority"), Some(10)), Lane::Priority);
        assert_eq!(Lane::of(Some("auto"), None), Lane::Default);
        assert_eq!(Lane::of(Some("default"), Some(3)), Lane::Flex);
        assert_eq!(Lane::of(None, Some(-1)), Lane::Priority);
        assert_eq!(Lane::of(None, Some(0)), Lane::Default);
        assert_eq!(Lane::of(Some("Flex"), None), Lane::Default, "names are exact");
    }

    #[test]
    fn counts_merge() {
        let mut a = RequestMix::default();
        for i in 0..10 {
            a.count(Lane::Flex, Some(i % 2 == 0), Some(100 + i));
        }
        let mut b = RequestMix::default();
        b.count(Lane::Priority, None, None);
        let m = a.merge(&b);
        assert_eq!(m.tiers.total(), 11);
        assert_eq!(m.tiers.flex, 10);
        assert_eq!(m.streamed(), Some((10, 5)));
        assert_eq!(m.prompt_bytes.count, 10);
        assert!((m.prompt_bytes.mean - 104.5).abs() < 1e-9);
    }
}
