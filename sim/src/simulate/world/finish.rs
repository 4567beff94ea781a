//! The end of a run: the last accounting and the strategy's report.

use super::*;

/// What the requests of every model a run served add up to.
struct Totals {
    all_ttft: Vec<f64>,
    /// TTFTs of the requests arriving in each chart interval.
    buckets: Vec<Vec<f64>>,
    met: u64,
    total: u64,
    completed: u64,
    failed: u64,
    held_n: u64,
    held_sum: f64,
    held_max: f64,
}

/// One model's requests, counted.
struct ModelCounts {
    /// TTFTs of the requests it completed, sorted.
    ttft: Vec<f64>,
    met: u64,
    failed: u64,
}

impl World<'_> {
    pub(super) fn finish(mut self) -> RunResult {
        let duration = self.sc.duration;
        self.now = self.now.max(duration);
        self.account_gpus();
        for m in 0..self.models.len() {
            self.account_replicas(m);
        }
        let mut totals = Totals {
            all_ttft: Vec::new(),
            buckets: vec![Vec::new(); TTFT_BUCKETS as usize],
            met: 0,
            total: 0,
            completed: 0,
            failed: 0,
            held_n: 0,
            held_sum: 0.0,
            held_max: 0.0,
        };
        let bucket = duration / TTFT_BUCKETS;
        let mut models = Vec::new();
        for m in 0..self.models.len() {
            if !self.active[m] {
                continue;
            }
            let counts = self.count_requests(m, bucket, &mut totals);
            models.push(self.model_report(m, &counts));
        }
        totals.all_ttft.sort_by(f64::total_cmp);
        for (b, v) in totals.buckets.iter_mut().enumerate() {
            v.sort_by(f64::total_cmp);
            self.series.ttft_t.push(b as f64 * bucket);
            self.series.ttft_p95.push(quantile_sorted(v, 0.95));
        }
        let samples = self.capacity_acc;
        let mem_cap = samples * self.sc.gpu.memory_bytes as f64;
        let report = StrategyReport {
            strategy: self.plan.kind.name().to_string(),
            description: self.plan.kind.description().to_string(),
            gpu_hours: self.gpu_seconds / 3600.0,
            gpus_peak: self.gpus_peak,
            gpus_mean: self.gpu_seconds / duration,
            memory_used_ratio: ratio(self.mem_used_acc, mem_cap),
            memory_reserved_ratio: ratio(self.mem_reserved_acc, mem_cap),
            compute_ratio: ratio(self.compute_acc, samples),
            compute_allocated_ratio: ratio(self.allocated_acc, samples),
            requests: totals.total,
            completed: totals.completed,
            failed: totals.failed,
            ttft_p50: quantile_sorted(&totals.all_ttft, 0.50),
            ttft_p95: quantile_sorted(&totals.all_ttft, 0.95),
            ttft_p99: quantile_sorted(&totals.all_ttft, 0.99),
            slo_attainment: if totals.total == 0 {
                1.0
            } else {
                totals.met as f64 / totals.total as f64
            },
            cold_starts: self.models.iter().map(|m| m.cold_starts).sum(),
            starts_from_zero: self.models.iter().map(|m| m.starts_from_zero).sum(),
            sleep_wakes: self.models.iter().map(|m| m.sleep_wakes).sum(),
            sleepers_lost: self.models.iter().map(|m| m.sleepers_lost).sum(),
            held_requests: totals.held_n,
            held_mean_secs: if totals.held_n == 0 {
                0.0
            } else {
                totals.held_sum / totals.held_n as f64
            },
            held_max_secs: totals.held_max,
            preemptions: self.preemptions,
            arrival_digest: format!("{:016x}", self.processed_digest),
            arrivals_processed: self.processed,
            models,
            consolidation: (self.plan.kind == StrategyKind::Tessera).then_some(self.consolidation),
            rollouts: (self.plan.kind == StrategyKind::Tessera).then(|| self.rollouts.clone()),
            series: self.series,
        };
        let histories = self
            .replicas
            .into_iter()
            .map(|r| ReplicaHistory {
                model: r.model,
                geometry: geometry(&r.engine),
                memory: r.memory,
                ttft: r.engine.stats().ttft.clone(),
                itl: r.engine.stats().itl.clone(),
                compute_fraction: r.compute_fraction,
                observations: r.observations,
            })
            .collect();
        RunResult {
            report,
            histories,
            decisions: self.decisions.take().unwrap_or_default(),
            recommendations: self.recommendations.take().unwrap_or_default(),
            batch: self.batch.as_ref().map(|b| b.outcome(duration)),
        }
    }

    /// Counts model `m`'s requests into its own numbers and `totals`; `bucket` is the chart interval's length.
    fn count_requests(&self, m: usize, bucket: f64, totals: &mut Totals) -> ModelCounts {
        let rt = &self.models[m];
        let setup = &self.sc.models[m];
        let mut t = Vec::new();
        let mut m_met = 0u64;
        let mut m_failed = 0u64;
        for (i, st) in rt.requests.iter().enumerate() {
            totals.total += 1;
            // Not finished by the end of the drain allowance (`request_timeout` past the duration): its client
            // has given up, so it failed — every request is completed or failed, none is left uncounted.
            let ok = st.ttft.filter(|_| !st.failed && st.done);
            match ok {
                Some(v) => {
                    t.push(v);
                    let b = ((self.sc.arrivals[m][i].at / bucket) as usize).min(totals.buckets.len() - 1);
                    totals.buckets[b].push(v);
                    if v <= setup.slo_ttft {
                        m_met += 1;
                    }
                }
                None => m_failed += 1,
            }
            if st.done && !st.failed {
                totals.completed += 1;
            }
            if st.held > 0.0 {
                totals.held_n += 1;
                totals.held_sum += st.held;
                totals.held_max = totals.held_max.max(st.held);
            }
        }
        totals.met += m_met;
        totals.failed += m_failed;
        totals.all_ttft.extend_from_slice(&t);
        t.sort_by(f64::total_cmp);
        ModelCounts {
            ttft: t,
            met: m_met,
            failed: m_failed,
        }
    }

    /// Model `m`'s section of the report.
    fn model_report(&self, m: usize, counts: &ModelCounts) -> ModelReport {
        let rt = &self.models[m];
        let setup = &self.sc.models[m];
        let rec = rt.rec.as_ref();
        let (kv, cf, mib) = self.allocation_shown(m);
        let duration = self.sc.duration;
        let preemptions = rt
            .replicas
            .iter()
            .map(|&r| self.replicas[r].engine.stats().num_preemptions)
            .sum();
        ModelReport {
            model: setup.name.clone(),
            requests: rt.requests.len() as u64,
            failed: counts.failed,
            ttft_p95: quantile_sorted(&counts.ttft, 0.95),
            slo_attainment: if rt.requests.is_empty() {
                1.0
            } else {
                counts.met as f64 / rt.requests.len() as f64
            },
            replicas_max: rt.replicas_max,
            surge_max: rt.surge_max,
            replicas_mean: rt.replica_seconds / duration,
            memory_gpu_hours: rt.memory_byte_seconds / self.sc.gpu.memory_bytes as f64 / 3600.0,
            cold_starts: rt.cold_starts,
            starts_from_zero: rt.starts_from_zero,
            preemptions,
            kv_cache_gib: kv,
            compute_fraction: cf,
            compute_fraction_min: rt
                .replicas
                .iter()
                .map(|&r| self.replicas[r].compute_fraction)
                .fold(f64::INFINITY, f64::min)
                .min(cf),
            gpu_memory_mib: mib,
            recommendation_reasons: match self.plan.kind {
                StrategyKind::Tessera => rec
                    .map(|r| r.reasons.iter().map(ToString::to_string).collect())
                    .unwrap_or_default(),
                _ => Vec::new(),
            },
            initial_recommendation: match self.plan.kind {
                StrategyKind::Tessera => self
                    .plan
                    .initial_recommendations
                    .get(m)
                    .cloned()
                    .flatten()
                    .map(|r| (r.kv_cache_memory_bytes as f64 / GIB as f64, r.compute_fraction)),
                _ => None,
            },
            scale_changes: rt.scale_changes.clone(),
            isolated: (rt.isolation.began > 0).then(|| {
                (
                    f64::from(rt.isolation.rounds) / f64::from(rt.rounds.max(1)),
                    rt.isolation.began,
                )
            }),
            next_unit: match self.plan.kind {
                StrategyKind::Tessera => rt.next_unit.map(|n| n.to_string()),
                _ => None,
            },
            held_by: {
                let total: u32 = rt.held_by.values().sum();
                rt.held_by
                    .iter()
                    .map(|(k, &n)| (k.label().to_string(), f64::from(n) / f64::from(total.max(1))))
                    .collect()
            },
            latency_on_share: self.share_of_rounds(rt, rt.rounds_latency_on_share),
            prefill_bound: self.share_of_rounds(rt, rt.rounds_prefill_bound),
            behind_while_urgent: self.share_of_rounds(rt, rt.rounds_behind_while_urgent),
            workload_class: rt.class.as_ref().map(|c| super::super::report::ClassReport {
                class: c.held.class.as_str().to_owned(),
                source: c.held.source.as_str().to_owned(),
                reason: c.held.reason.clone(),
                policy_from_class: c.resolved.from_class.iter().map(|f| (*f).to_owned()).collect(),
                policy: c.resolved.summary(),
            }),
            warm_floor: self.warm_floor_reason(m),
        }
    }

    /// The KV cache (GiB), compute share and GPU memory (MiB) a model's report shows: Tessera's allocation in
    /// force, else what its last replica was started with.
    fn allocation_shown(&self, m: usize) -> (f64, f64, u64) {
        let rt = &self.models[m];
        let last = rt.replicas.iter().rev().map(|&r| &self.replicas[r]).next();
        match (self.plan.kind, rt.allocation.in_force, last) {
            (StrategyKind::Tessera, Some(a), _) => (
                a.kv_cache_memory_bytes.unwrap_or(0) as f64 / GIB as f64,
                a.compute_fraction,
                a.memory_mib,
            ),
            (_, _, Some(rep)) => (
                rep.engine.kv_cache_bytes_configured() as f64 / GIB as f64,
                rep.compute_fraction,
                rep.engine.gpu_memory_used_bytes().div_ceil(1 << 20),
            ),
            _ => (0.0, 0.0, 0),
        }
    }

    /// Tessera's rounds that went one way, as a share of its rounds.
    fn share_of_rounds(&self, rt: &ModelRt, n: u32) -> Option<f64> {
        (self.plan.kind == StrategyKind::Tessera && rt.rounds > 0)
            .then(|| f64::from(n) / f64::from(rt.rounds))
    }

    /// Why model `m` kept one warm replica instead of going to zero, where it did.
    fn warm_floor_reason(&self, m: usize) -> Option<String> {
        let rt = &self.models[m];
        let setup = &self.sc.models[m];
        rt.warm_floor.map(|w| {
            let mut why = format!(
                "cold start {:.0} s > TTFT objective {:.0} s",
                w.cold_start.as_secs_f64(),
                w.ttft_slo.as_secs_f64()
            );
            if rt.rounds_zero_within_budget > 0 {
                // The floor held until the model's traffic showed its cold starts fit the miss budget.
                let budget = match &setup.cold_start_budget_group {
                    Some(g) => format!("the cold-start miss budget of group '{g}'"),
                    None => "its cold-start miss budget".to_owned(),
                };
                why.push_str(&format!(
                    "; free to go to zero within {budget} in {:.0}% of decisions",
                    100.0
                        * self
                            .share_of_rounds(rt, rt.rounds_zero_within_budget)
                            .unwrap_or(0.0)
                ));
            }
            why
        })
    }
}

/// `part / whole`, 0 when nothing was accumulated.
fn ratio(part: f64, whole: f64) -> f64 {
    if whole > 0.0 { part / whole } else { 0.0 }
}
