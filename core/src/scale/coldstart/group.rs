//! A miss budget shared by a group of models (`scaleToZero.coldStartBudgetGroup`): the group's models together
//! may miss their objective through cold starts for `coldStartMissBudget` of *their combined* requests, and the
//! group spends that allowance on the warm floors that would sit idle longest per missed request.
//!
//! Why a group: a budget per model cannot spend a team's error budget where it is cheapest. On the 24-hour tools
//! scenario, report-summarizer's 15 cold starts a day would miss 31 of its own 490 requests (6.3%), far over a
//! 0.5% budget of its own, though the tools' 1% of 9,341 requests has room for them, and its warm floor is held
//! for 22 idle hours (`docs/simulator-experiments.md`, "Warm floors against a miss budget").
//!
//! How the members agree without talking: each model's own round publishes a [`BudgetClaim`] (its evidence from
//! its [`super::ColdStartLedger`], and whether its cold start is over its objective),
//! which the caller keeps in the model's [`crate::scale::ScaleState`]. Each member then runs the same allotment,
//! [`share`], over the claims it can read: the same claims give every member the same answer. Claims are at most a
//! sync apart, and the evidence they carry moves slowly (a day's window), so members that read them a sync apart
//! can disagree only for that sync, at the margin of the allowance. A member whose round has not run in this process
//! (a restarted controller) is read from the copy of its ledger ([`crate::scale::joint::standing_claim`]).
//!
//! Fails safe, as the per-model budget does: a member without an hour of history, or whose claim is older than
//! [`CLAIM_MAX_AGE`] (its controller stopped reconciling it, or it was deleted), adds no requests to the
//! allowance and is allotted nothing; members that declare different budgets share the smallest.

use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use super::ColdStartEvidence;
use crate::scale::Timestamp;

/// A claim older than this is not read: its model is not being reconciled (a few sync periods at the default
/// 15 s), so its requests and its misses are unknown.
pub const CLAIM_MAX_AGE: Duration = Duration::from_secs(300);

/// One member's part in its group's budget, as its own round last published it.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetClaim {
    /// The model (its name; the group is within a namespace).
    pub member: String,
    /// The group it shares a budget with.
    pub group: String,
    /// The share of requests its policy allows to miss through a cold start.
    pub budget: f64,
    /// When it was published.
    pub at: Timestamp,
    /// What its last day shows; `None` without an hour of history or a known cold start.
    pub evidence: Option<ColdStartEvidence>,
    /// Its cold start is longer than its objective: without the budget it keeps a warm replica.
    pub over_objective: bool,
}

impl BudgetClaim {
    /// Seconds at zero per missed request, what dropping this member's floor would save: the allotment's order
    /// (highest first). Time, not GPU-time: what a replica holds is known only while it runs (a member at zero
    /// could not say), and a group's tools are usually of a size. A member whose cold starts miss nothing costs
    /// nothing.
    fn saving_per_miss(&self) -> f64 {
        match self.evidence {
            Some(e) if e.misses > 0 => e.at_zero.as_secs_f64() / e.misses as f64,
            Some(_) => f64::INFINITY,
            None => 0.0,
        }
    }
}

/// How the group's allowance was spent, for one member's decision and its status.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupSpend {
    /// The group.
    pub group: String,
    /// The members read (fresh claims), this one included.
    pub members: usize,
    /// Their requests over their windows (members with evidence only).
    pub requests: u64,
    /// The budget applied: the smallest any member read declares.
    pub budget: f64,
    /// Requests the group may miss: `budget × requests`, rounded down.
    pub allowance: u64,
    /// Misses of the members allotted to go to zero, this one included when allotted.
    pub spent: u64,
    /// Whether this member may go to zero.
    pub allotted: bool,
    /// This member's own would-be misses.
    pub own_misses: u64,
}

/// The allotment: `own`'s claim among the claims of the other models it can read (any group; only `own.group`'s
/// fresh ones count). Members over their objective with evidence are taken in order of time at zero per missed
/// request (ties by name, so every member orders them alike) while their misses fit what is left.
pub fn share(own: &BudgetClaim, others: &[BudgetClaim], now: Timestamp) -> GroupSpend {
    // One claim per member (the first read), so a namespace's many models cost a sort, not a scan each.
    let mut seen: BTreeSet<&str> = BTreeSet::from([own.member.as_str()]);
    let mut members: Vec<&BudgetClaim> = vec![own];
    for c in others {
        if c.group == own.group && c.at.is_within(CLAIM_MAX_AGE, now) && seen.insert(c.member.as_str()) {
            members.push(c);
        }
    }
    let budget = members
        .iter()
        .map(|m| m.budget)
        .filter(|b| b.is_finite())
        .fold(own.budget, f64::min)
        .clamp(0.0, 1.0);
    let requests: u64 = members
        .iter()
        .filter_map(|m| m.evidence.map(|e| e.requests))
        .sum();
    let allowance = (budget * requests as f64).floor() as u64;
    let mut candidates: Vec<&BudgetClaim> = members
        .iter()
        .copied()
        .filter(|m| m.over_objective && m.evidence.is_some())
        .collect();
    candidates.sort_by(|a, b| {
        b.saving_per_miss()
            .partial_cmp(&a.saving_per_miss())
            .unwrap_or(Ordering::Equal)
            .then_with(|| a.member.cmp(&b.member))
    });
    let mut spent = 0u64;
    let mut allotted = false;
    for c in candidates {
        let misses = c.evidence.map_or(0, |e| e.misses);
        if spent.saturating_add(misses) <= allowance {
            spent += misses;
            allotted |= c.member == own.member;
        }
    }
    GroupSpend {
        group: own.group.clone(),
        members: members.len(),
        requests,
        budget,
        allowance,
        spent,
        allotted,
        own_misses: own.evidence.map_or(0, |e| e.misses),
    }
}

impl fmt::Display for GroupSpend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "budget group '{}' ({} model(s), {} requests over their last day) may miss {} ({:.2}%), {} of them spent \
             on the floors idle longest per miss",
            self.group,
            self.members,
            self.requests,
            self.allowance,
            self.budget * 100.0,
            self.spent
        )?;
        if !self.allotted {
            write!(f, "; this model's {} do not fit what is left", self.own_misses)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> Timestamp {
        Timestamp::from_millis(secs * 1000)
    }

    fn claim(member: &str, requests: u64, misses: u64, hours_at_zero: u64) -> BudgetClaim {
        BudgetClaim {
            member: member.to_owned(),
            group: "tools".to_owned(),
            budget: 0.01,
            at: at(86_400),
            evidence: Some(ColdStartEvidence {
                requests,
                cold_starts: misses.min(1) as u32,
                misses,
                observed: Duration::from_secs(86_400),
                at_zero: Duration::from_secs(hours_at_zero * 3600),
            }),
            over_objective: true,
        }
    }

    /// The functions-day shape: three tools over their objective, three others that only add requests. The
    /// allowance (1% of 9,341 = 93) goes to the floors that save the most per miss: report-summarizer (22 h at
    /// zero for 31 misses) and eval-runner (14 h for 20); nightly-digest's 159 do not fit.
    #[test]
    fn spends_the_groups_allowance_on_the_cheapest_floors() {
        let summarizer = claim("report-summarizer", 490, 31, 22);
        let eval = claim("eval-runner", 3724, 20, 14);
        let digest = claim("nightly-digest", 501, 159, 19);
        let mut others = vec![eval.clone(), digest.clone()];
        for (name, requests) in [("translate", 2000), ("sql", 1500), ("ticket", 1126)] {
            let mut c = claim(name, requests, 0, 0);
            c.over_objective = false;
            others.push(c);
        }
        let now = at(86_400);
        let s = share(&summarizer, &others, now);
        assert_eq!((s.members, s.requests, s.allowance), (6, 9341, 93), "{s:?}");
        assert!(s.allotted, "{s}");
        assert_eq!(s.spent, 51, "{s}");
        // Every member reads the same claims and agrees.
        let all: Vec<BudgetClaim> = std::iter::once(summarizer.clone())
            .chain(others.clone())
            .collect();
        let of = |c: &BudgetClaim| share(c, &all, now);
        assert!(of(&eval).allotted);
        let d = of(&digest);
        assert!(!d.allotted);
        assert_eq!(d.spent, 51);
        assert!(
            d.to_string().contains("this model's 159 do not fit what is left"),
            "{d}"
        );
        // Half the budget (46): only the best saving per miss fits, report-summarizer's 22 h / 31 = 2,555 s at zero
        // per miss against eval-runner's 14 h / 20 = 2,520 s, and eval-runner's 20 no longer fit.
        let half: Vec<BudgetClaim> = all
            .iter()
            .map(|c| BudgetClaim {
                budget: 0.005,
                ..c.clone()
            })
            .collect();
        let s = share(&half[0], &half, now);
        assert_eq!(s.allowance, 46);
        assert!(s.allotted && s.spent == 31, "{s}");
        assert!(!share(&half[1], &half, now).allotted);
    }

    /// Fails safe: a stale claim or one without evidence adds no requests; the smallest budget applies; another
    /// group's claims are not read.
    #[test]
    fn stale_claims_other_groups_and_larger_budgets_do_not_widen_the_allowance() {
        let now = at(86_400);
        let own = claim("a", 1000, 10, 10);
        let mut stale = claim("b", 100_000, 0, 0);
        stale.at = now.minus(CLAIM_MAX_AGE + Duration::from_secs(1));
        let mut other_group = claim("c", 100_000, 0, 0);
        other_group.group = "elsewhere".to_owned();
        let mut no_history = claim("d", 0, 0, 0);
        no_history.evidence = None;
        let s = share(&own, &[stale, other_group, no_history], now);
        assert_eq!((s.members, s.requests, s.allowance), (2, 1000, 10), "{s:?}");
        assert!(s.allotted);
        let mut strict = claim("e", 1000, 0, 0);
        strict.budget = 0.001;
        let s = share(&own, &[strict], now);
        assert_eq!((s.budget, s.allowance), (0.001, 2), "{s:?}");
        assert!(!s.allotted);
    }

    /// A member whose cold starts miss nothing goes first and spends nothing; a claim under the member's own name
    /// from elsewhere is not counted twice.
    #[test]
    fn a_member_that_misses_nothing_is_free_and_no_member_counts_twice() {
        let now = at(86_400);
        let quiet = claim("quiet", 500, 0, 0);
        let busy = claim("busy", 500, 50, 20);
        let s = share(&quiet, &[busy.clone(), quiet.clone()], now);
        assert_eq!((s.members, s.requests), (2, 1000));
        assert!(s.allotted && s.spent == 0, "{s}");
    }
}
