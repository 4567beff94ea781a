//! The end of a run: the last accounting and the strategy's report.

use super::*;

impl World<'_> {
    pub(super) fn finish(mut self) -> RunResult {
        let duration = self.sc.duration;
        self.now = self.now.max(duration);
        self.account_gpus();
        for m in 0..self.models.len() {
            self.account_replicas(m);
        }
        let mut all_ttft = Vec::new();
        let mut met = 0u64;
        let mut total = 0u64;
        let mut completed = 0u64;
        let mut failed = 0u64;
        let mut held_n = 0u64;
        let mut held_sum = 0.0;
        let mut held_max: f64 = 0.0;
        let mut models = Vec::new();
        let mut bucket_ttfts: Vec<Vec<f64>> = vec![Vec::new(); TTFT_BUCKETS as usize];
        let bucket = duration / TTFT_BUCKETS;
        for (m, rt) in self.models.iter().enumerate() {
            if !self.active[m] {
                continue;
            }
            let setup = &self.sc.models[m];
            let mut t = Vec::new();
            let mut m_met = 0u64;
            let mut m_failed = 0u64;
            for (i, st) in rt.requests.iter().enumerate() {
                total += 1;
                // Not finished by the end of the drain allowance (`request_timeout` past the duration): its client
                // has given up, so it failed — every request is completed or failed, none is left uncounted.
                let ok = st.ttft.filter(|_| !st.failed && st.done);
                match ok {
                    Some(v) => {
                        t.push(v);
                        let b = ((self.sc.arrivals[m][i].at / bucket) as usize).min(bucket_ttfts.len() - 1);
                        bucket_ttfts[b].push(v);
                        if v <= setup.slo_ttft {
                            m_met += 1;
                        }
                    }
                    None => m_failed += 1,
                }
                if st.done && !st.failed {
                    completed += 1;
                }
                if st.held > 0.0 {
                    held_n += 1;
                    held_sum += st.held;
                    held_max = held_max.max(st.held);
                }
            }
            met += m_met;
            failed += m_failed;
            all_ttft.extend_from_slice(&t);
            t.sort_by(f64::total_cmp);
            let last = rt.replicas.iter().rev().map(|&r| &self.replicas[r]).next();
            let rec = rt.rec.as_ref();
            let (kv, cf, mib) = match (self.plan.kind, rt.allocation.in_force, last) {
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
            };
            // Tessera's rounds that went one way, as a share of its rounds.
            let share_of_rounds = |n: u32| {
                (self.plan.kind == StrategyKind::Tessera && rt.rounds > 0)
                    .then(|| f64::from(n) / f64::from(rt.rounds))
            };
            let preemptions = rt
                .replicas
                .iter()
                .map(|&r| self.replicas[r].engine.stats().num_preemptions)
                .sum();
            models.push(ModelReport {
                model: setup.name.clone(),
                requests: rt.requests.len() as u64,
                failed: m_failed,
                ttft_p95: quantile_sorted(&t, 0.95),
                slo_attainment: if rt.requests.is_empty() {
                    1.0
                } else {
                    m_met as f64 / rt.requests.len() as f64
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
                latency_on_share: share_of_rounds(rt.rounds_latency_on_share),
                prefill_bound: share_of_rounds(rt.rounds_prefill_bound),
                behind_while_urgent: share_of_rounds(rt.rounds_behind_while_urgent),
                workload_class: rt.class.as_ref().map(|c| super::super::report::ClassReport {
                    class: c.held.class.as_str().to_owned(),
                    source: c.held.source.as_str().to_owned(),
                    reason: c.held.reason.clone(),
                    policy_from_class: c.resolved.from_class.iter().map(|f| (*f).to_owned()).collect(),
                    policy: c.resolved.summary(),
                }),
                warm_floor: rt.warm_floor.map(|w| {
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
                            100.0 * share_of_rounds(rt.rounds_zero_within_budget).unwrap_or(0.0)
                        ));
                    }
                    why
                }),
            });
        }
        all_ttft.sort_by(f64::total_cmp);
        for (b, v) in bucket_ttfts.iter_mut().enumerate() {
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
            requests: total,
            completed,
            failed,
            ttft_p50: quantile_sorted(&all_ttft, 0.50),
            ttft_p95: quantile_sorted(&all_ttft, 0.95),
            ttft_p99: quantile_sorted(&all_ttft, 0.99),
            slo_attainment: if total == 0 {
                1.0
            } else {
                met as f64 / total as f64
            },
            cold_starts: self.models.iter().map(|m| m.cold_starts).sum(),
            starts_from_zero: self.models.iter().map(|m| m.starts_from_zero).sum(),
            sleep_wakes: self.models.iter().map(|m| m.sleep_wakes).sum(),
            sleepers_lost: self.models.iter().map(|m| m.sleepers_lost).sum(),
            held_requests: held_n,
            held_mean_secs: if held_n == 0 {
                0.0
            } else {
                held_sum / held_n as f64
            },
            held_max_secs: held_max,
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
}

/// `part / whole`, 0 when nothing was accumulated.
fn ratio(part: f64, whole: f64) -> f64 {
    if whole > 0.0 { part / whole } else { 0.0 }
}
