//! Placing a replica beside sleeping pods (vLLM sleep mode): the rule the simulator's pool runs, and the pool
//! manager's with `lendSleepers` (`tessera_pool::PoolIndex::decide`; `docs/fractional-gpus.md`, "Lending a sleeping
//! replica's room"); and the sleeper budget ([`admit`]), which the simulator and the controller apply when a
//! model's last replica would fall asleep (`autoscaler::controller::sleep_room`).
//!
//! A sleeping pod's weights sit in host memory, but its CUDA context does not move: it can wake only on the GPU it
//! slept on. So the packer counts none of its memory or compute (it lends its room), yet a new replica takes that
//! room only where the alternative is opening a GPU. Taking it turns the sleeping pod's next wake into a cold start
//! somewhere else, which costs its model's objective; opening a GPU costs a GPU.

use super::{GpuId, PackError, Packer, Placement, ReplicaRequest};

impl Packer {
    /// Places `request` leaving `sleeping` pods' room (each a GPU and the share the pod held there, with an id no
    /// replica in the packer has) where another GPU has room: first with every sleeping pod's share held where it
    /// still fits, then, if no GPU has room that way, as [`Packer::place_or_open`] would with that room free.
    /// Returns the GPU it went to; the packer ends holding `request` and nothing of the sleeping shares.
    pub fn place_beside_sleeping(
        &mut self,
        request: ReplicaRequest,
        sleeping: impl IntoIterator<Item = (GpuId, ReplicaRequest)>,
    ) -> Result<GpuId, PackError> {
        let placed = self.with_held(sleeping, |p| p.place(request.clone()));
        match placed? {
            Placement::Gpu { gpu, .. } => Ok(gpu),
            Placement::NoRoom(_) => self.place_or_open(request).map(|(g, _)| g),
        }
    }

    /// Runs `f` with `held` (shares that keep memory while their pods sleep) assigned where each still fits, then
    /// takes them off again: what `f` places never takes the memory a sleeping pod keeps. A share that no longer
    /// fits (its room was lent earlier) holds nothing: that pod will start cold anyway.
    pub fn with_held<T>(
        &mut self,
        held: impl IntoIterator<Item = (GpuId, ReplicaRequest)>,
        f: impl FnOnce(&mut Packer) -> T,
    ) -> T {
        let ids: Vec<String> = held
            .into_iter()
            .filter_map(|(g, share)| {
                let id = share.id.clone();
                self.assign(g, share).is_ok().then_some(id)
            })
            .collect();
        let out = f(self);
        for id in &ids {
            self.remove(id);
        }
        out
    }
}

/// A sleeping pod on a GPU, as the sleeper budget weighs it.
#[derive(Debug, Clone, PartialEq)]
pub struct Sleeper {
    /// The sleeping pod (or, for a newcomer, the replica about to sleep).
    pub id: String,
    /// GPU memory it keeps while asleep (its measured residue), MiB.
    pub residue_mib: u64,
    /// What a wake saves over a cold start for its model (cold start − wake).
    pub saved: std::time::Duration,
    /// Its model's typical idle gap (how often it is woken); `None` when not yet seen.
    pub typical_gap: Option<std::time::Duration>,
}

/// A GPU's room for sleepers: how many, and how much of its memory their residue may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SleeperBudget {
    /// Most sleeping pods on one GPU.
    pub max_sleepers: u32,
    /// Most GPU memory all its sleepers' residue may take, MiB.
    pub max_residue_mib: u64,
}

/// GPU memory a sleeping pod is counted to keep until its residue is measured, MiB: the level-1 residue reported
/// for vLLM on an H100 (issue 44); a PyTorch process alone kept 0.94 GiB on an H200 (`docs/performance.md`).
pub const DEFAULT_RESIDUE_MIB: u64 = 1_434;

/// How many of a model's last idle gaps its typical gap is the mean of (the simulator's models and the sidecar's
/// `rest.idle_gaps_secs` keep this many).
pub const GAPS_KEPT: usize = 8;

/// An unknown idle gap is valued as one wake an hour: neither the most nor the least worth keeping.
const UNKNOWN_GAP: std::time::Duration = std::time::Duration::from_secs(3600);

impl SleeperBudget {
    /// A GPU of `memory_mib` holding at most `max_sleepers` sleeping pods, whose residue together takes at most a
    /// quarter of its memory: the rest is for the replicas that serve.
    pub fn of_gpu(memory_mib: u64, max_sleepers: u32) -> Self {
        SleeperBudget {
            max_sleepers,
            max_residue_mib: memory_mib / 4,
        }
    }
}

impl Sleeper {
    /// The sleeper of a model whose new pod takes `cold` and whose wake takes `wake`, having sat out `gaps` (its
    /// last idle gaps; none yet leaves the gap unknown). The simulator and the controller value sleepers by this.
    pub fn new(
        id: impl Into<String>,
        residue_mib: u64,
        cold: std::time::Duration,
        wake: std::time::Duration,
        gaps: &[std::time::Duration],
    ) -> Self {
        Sleeper {
            id: id.into(),
            residue_mib,
            saved: cold.saturating_sub(wake),
            typical_gap: u32::try_from(gaps.len())
                .ok()
                .filter(|n| *n > 0)
                .map(|n| gaps.iter().sum::<std::time::Duration>() / n),
        }
    }

    /// A sleeper whose worth is not known (its controller has not said since this process started): valued above
    /// any other, so missing facts never evict a sleeper; a newcomer that would need it gone goes to zero instead.
    pub fn unknown(id: impl Into<String>, residue_mib: u64) -> Self {
        Sleeper {
            id: id.into(),
            residue_mib,
            saved: std::time::Duration::MAX,
            typical_gap: None,
        }
    }

    /// The expected cost of losing it: the waiting a wake saves, times how often it is woken (seconds of waiting
    /// per hour). Keeping the most valuable sleepers is not keeping the newest: a tool woken every few minutes
    /// that starts in 90 s is worth more than a model slept a minute ago that is woken once a day.
    pub fn value(&self) -> f64 {
        let gap = self.typical_gap.unwrap_or(UNKNOWN_GAP).as_secs_f64().max(1.0);
        self.saved.as_secs_f64() * 3600.0 / gap
    }
}

/// What the budget says to a newcomer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admit {
    /// It fits beside the sleepers there.
    Fits,
    /// It fits once these sleepers (the least valuable) are evicted: each is worth less than the newcomer.
    Evict(Vec<String>),
    /// It is worth less than what it would displace (or alone exceeds the budget): it goes to zero instead.
    Refuse,
}

/// Whether `newcomer` may sleep on a GPU whose sleepers are `present`, under `budget`: the least valuable are
/// evicted first, and only ones worth less than the newcomer.
pub fn admit(present: &[Sleeper], newcomer: &Sleeper, budget: SleeperBudget) -> Admit {
    let fits = |kept: &[&Sleeper]| {
        kept.len() < budget.max_sleepers as usize
            && kept.iter().map(|s| s.residue_mib).sum::<u64>() + newcomer.residue_mib
                <= budget.max_residue_mib
    };
    let mut kept: Vec<&Sleeper> = present.iter().collect();
    if fits(&kept) {
        return Admit::Fits;
    }
    // Cheapest first; ties by id, so the same state always evicts the same pod.
    kept.sort_by(|a, b| a.value().total_cmp(&b.value()).then_with(|| a.id.cmp(&b.id)));
    let mut evicted = Vec::new();
    while !fits(&kept) {
        match kept.first() {
            Some(cheapest) if cheapest.value() < newcomer.value() => {
                evicted.push(cheapest.id.clone());
                kept.remove(0);
            }
            _ => return Admit::Refuse,
        }
    }
    Admit::Evict(evicted)
}

/// The room for a model's last running replica to sleep on its GPU: the round's `SleepFacts::{alone_on_gpu,
/// no_room}` and the sleepers its sleep lets go. The simulator and the controller both read it here.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Room {
    /// No other running replica there: a sleeper would be all that keeps the GPU.
    pub alone_on_gpu: bool,
    /// The budget is full and the replica is worth less than every sleeper there: it goes to zero instead.
    pub no_room: bool,
    /// The sleepers (their ids) the budget lets go once it sleeps, cheapest first.
    pub displaces: Vec<String>,
    /// What the newcomer and each displaced sleeper are worth ([`Sleeper::value`]), for the Event.
    pub why: String,
}

/// The room for `newcomer` on a GPU where `others_awake` other replicas run and the sleepers `present` (but it)
/// sleep, under `budget`.
pub fn room(others_awake: bool, present: &[Sleeper], newcomer: &Sleeper, budget: SleeperBudget) -> Room {
    let (no_room, displaces) = match admit(present, newcomer, budget) {
        Admit::Fits => (false, Vec::new()),
        Admit::Evict(ids) => (false, ids),
        Admit::Refuse => (true, Vec::new()),
    };
    let why = if displaces.is_empty() {
        String::new()
    } else {
        let others: Vec<String> = present
            .iter()
            .filter(|s| displaces.contains(&s.id))
            .map(|s| format!("{}'s {:.1}", s.id, s.value()))
            .collect();
        format!(
            "{} asleep saves {:.1} s of waiting per hour against {}",
            newcomer.id,
            newcomer.value(),
            others.join(", ")
        )
    };
    Room {
        alone_on_gpu: !others_awake,
        no_room,
        displaces,
        why,
    }
}

/// Whether sleeper `me`, among all the sleepers of a GPU (`me` included), is one to let go because together they
/// exceed `budget`: the least valuable go first (ties by id), as [`admit`] would have chosen. Two models whose last
/// replicas fell asleep at the same moment can both pass [`admit`]; each then asks this of itself, and only the
/// cheapest goes, so the GPU comes back within its budget without two rounds evicting each other.
pub fn over_budget(all: &[Sleeper], me: &str, budget: SleeperBudget) -> bool {
    let mut kept: Vec<&Sleeper> = all.iter().collect();
    kept.sort_by(|a, b| a.value().total_cmp(&b.value()).then_with(|| a.id.cmp(&b.id)));
    while kept.len() > budget.max_sleepers as usize
        || kept.iter().map(|s| s.residue_mib).sum::<u64>() > budget.max_residue_mib
    {
        if kept.remove(0).id == me {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::super::GpuShape;
    use super::*;

    /// Two GPUs of 10,000 MiB (no headroom): GPU 0 holds 5,000 MiB and a sleeping pod's 4,000 lent, GPU 1 holds
    /// `other` MiB.
    fn pool(other: u64) -> (Packer, (GpuId, ReplicaRequest), GpuId) {
        let mut p = Packer::new(GpuShape::new(10_000, 0).unwrap());
        let (g0, g1) = (p.add_gpu(), p.add_gpu());
        p.assign(g0, ReplicaRequest::new("a-0", "a", 100, 5_000)).unwrap();
        p.assign(g1, ReplicaRequest::new("b-0", "b", 100, other)).unwrap();
        (
            p,
            (g0, ReplicaRequest::new("asleep/tool", "tool", 100, 4_000)),
            g1,
        )
    }

    /// A new replica goes where it fits with the sleeping pod's share held, although the lent room is the better
    /// fit (best fit alone would pick GPU 0), so the sleeping pod can still wake.
    #[test]
    fn a_new_replica_leaves_a_sleeping_pods_room_where_another_gpu_has_some() {
        let (mut p, asleep, g1) = pool(4_000);
        let g = p
            .place_beside_sleeping(ReplicaRequest::new("c-0", "c", 100, 3_000), [asleep.clone()])
            .unwrap();
        assert_eq!(g, g1);
        assert!(
            p.gpu(asleep.0).unwrap().fits(&asleep.1, p.shape()),
            "the sleeping pod's room is left"
        );
        // Nothing of the held share stays behind.
        assert_eq!(p.replica_count(), 3);
    }

    /// Where the alternative is opening a GPU, the lent room is taken (the sleeping pod will start cold).
    #[test]
    fn a_new_replica_takes_lent_room_rather_than_open_a_gpu() {
        let (mut p, asleep, _) = pool(7_000);
        let g0 = asleep.0;
        let g = p
            .place_beside_sleeping(ReplicaRequest::new("c-0", "c", 100, 4_500), [asleep.clone()])
            .unwrap();
        assert_eq!(g, g0);
        assert_eq!(p.gpus().count(), 2, "no GPU opened");
        assert!(!p.gpu(g0).unwrap().fits(&asleep.1, p.shape()));
        // And where not even the lent room holds it, a GPU opens.
        let g = p
            .place_beside_sleeping(ReplicaRequest::new("d-0", "d", 100, 8_000), [asleep])
            .unwrap();
        assert_eq!(p.gpus().count(), 3);
        assert_eq!(p.gpu(g).unwrap().replicas_of("d"), 1);
    }

    fn sleeper(id: &str, saved: u64, gap: Option<u64>) -> Sleeper {
        Sleeper {
            id: id.into(),
            residue_mib: 1_434,
            saved: std::time::Duration::from_secs(saved),
            typical_gap: gap.map(std::time::Duration::from_secs),
        }
    }

    /// The budget keeps the sleepers worth most (saved waiting × wakes per hour), not the newest.
    #[test]
    fn a_full_budget_evicts_the_cheapest_sleeper_not_the_oldest() {
        let budget = SleeperBudget {
            max_sleepers: 2,
            max_residue_mib: 10_000,
        };
        // Woken every 5 min, 90 s saved: 1,080 s/h. Woken once a day, 27 s saved: ~1.1 s/h.
        let present = [
            sleeper("often", 90, Some(300)),
            sleeper("daily", 27, Some(86_400)),
        ];
        assert_eq!(
            admit(&present[..1], &sleeper("new", 27, Some(600)), budget),
            Admit::Fits
        );
        assert_eq!(
            admit(&present, &sleeper("new", 27, Some(600)), budget),
            Admit::Evict(vec!["daily".into()])
        );
        // A newcomer worth less than every sleeper there goes to zero instead.
        assert_eq!(
            admit(&present, &sleeper("rare", 10, Some(172_800)), budget),
            Admit::Refuse
        );
        // Residue bounds it too.
        let tight = SleeperBudget {
            max_sleepers: 8,
            max_residue_mib: 2_000,
        };
        assert_eq!(
            admit(&present[..1], &sleeper("new", 90, Some(60)), tight),
            Admit::Evict(vec!["often".into()])
        );
    }

    /// The room a replica would sleep in: alone where nothing else runs, the budget's answer, and why, in words.
    #[test]
    fn room_reads_the_budget_and_says_what_each_side_is_worth() {
        let budget = SleeperBudget {
            max_sleepers: 1,
            max_residue_mib: 10_000,
        };
        let daily = [sleeper("daily", 27, Some(3_600))];
        let r = room(false, &daily, &sleeper("often", 90, Some(3_600)), budget);
        assert!(r.alone_on_gpu && !r.no_room);
        assert_eq!(r.displaces, ["daily"]);
        assert_eq!(
            r.why,
            "often asleep saves 90.0 s of waiting per hour against daily's 27.0"
        );
        let r = room(true, &daily, &sleeper("rare", 10, Some(3_600)), budget);
        assert!(!r.alone_on_gpu && r.no_room && r.why.is_empty());
    }

    /// Three asleep under a budget of two (two fell asleep at once): only the cheapest lets itself go.
    #[test]
    fn over_budget_the_cheapest_lets_itself_go_and_no_other() {
        let budget = SleeperBudget {
            max_sleepers: 2,
            max_residue_mib: 10_000,
        };
        let all = [
            sleeper("often", 90, Some(300)),
            sleeper("daily", 27, Some(86_400)),
            sleeper("hourly", 27, Some(3_600)),
        ];
        let gone: Vec<&str> = all
            .iter()
            .filter(|s| over_budget(&all, &s.id, budget))
            .map(|s| s.id.as_str())
            .collect();
        assert_eq!(gone, ["daily"]);
        assert!(!over_budget(&all[..2], "daily", budget), "within the budget");
        // Equal worth: the id decides, so exactly one goes.
        let twins = [sleeper("b", 27, None), sleeper("a", 27, None)];
        let one = SleeperBudget {
            max_sleepers: 1,
            ..budget
        };
        assert_eq!(
            (over_budget(&twins, "a", one), over_budget(&twins, "b", one)),
            (true, false)
        );
    }
}
