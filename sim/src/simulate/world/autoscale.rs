//! The autoscaler's side of a run: each model's replica round (the core rule's decision, consolidation's
//! move step, the baselines' own rules), GPU draining, and Tessera's recommendation round.

use tessera_core::class::{ClassSignals, Declared};
use tessera_core::round;
use tessera_core::wire::sidecar::SidecarStatus;

use super::*;
use tessera_core::scale::SloPercentile;

impl World<'_> {
    /// One autoscaler round for model `m`: observe, decide with the core round (`core::round`, the controller's),
    /// act.
    pub(super) fn scale_model(&mut self, m: usize) -> Result<(), SimError> {
        if self.models[m].concurrency.is_some() {
            return self.scale_on_in_flight(m);
        }
        let Some(declared) = self.models[m].policy.clone() else {
            return Ok(());
        };
        let live = self.live(m);
        let (observed, sample, leaving) = self.observe_model(m, &declared, &live);
        let now = Timestamp::from_millis(secs_to_ms(self.now));
        let before = self.decisions.is_some().then(|| self.models[m].state.clone());
        let r = round::round(&declared, &observed, &mut self.models[m].state, now);
        self.count_round(m, &r);
        // At the ceiling, over the objective while sharing: its shared replicas are replaced by ones placed alone
        // (`core::scale::isolation`, the round's step 6); they leave from the next round's placement on.
        self.apply_isolation(m, &r, &live);
        if let Some(before) = before {
            let record = self.decision_record(m, observed, sample, declared, before, &r, &leaving);
            self.decisions.get_or_insert_with(Vec::new).push(record);
        }
        self.models[m].state.record(&r.decision, now);
        self.models[m].sleeps_at_zero = r.rest.as_ref().is_some_and(|rest| rest.sleep.is_some());
        self.apply_move(m, r.decision.desired_replicas, r.step, &leaving, &live)?;
        if self.plan.kind == StrategyKind::Tessera {
            let live = self.live(m);
            self.fold_allocation(m, r.urgency, &live, r.decision.desired_replicas);
        }
        Ok(())
    }

    /// What the controller would observe of model `m` now (`core::round::Observed`), the activator's documents it
    /// was read from, and the live replicas on a draining GPU (or replaced by a roll), which leave first.
    fn observe_model(
        &self,
        m: usize,
        declared: &ScalePolicy,
        live: &[usize],
    ) -> (round::Observed, inputs::ActivatorSample, Vec<usize>) {
        let tessera = self.plan.kind == StrategyKind::Tessera;
        let setup = &self.sc.models[m];
        let settings = &self.sc.settings;
        let rt = &self.models[m];
        // How long new capacity takes here: the pod's start and the weights' load (the round shortens the way
        // back from zero to a wake where the model sleeps). The controller measures its own from its pods; only
        // Tessera's policy knows its lead times (the baselines scale as declared).
        let leads = if tessera {
            let pod = Some(Duration::from_secs_f64(setup.scale_up_secs(settings)));
            joint::LeadTimes {
                from_zero: pod,
                scale_up: pod,
            }
        } else {
            joint::LeadTimes::default()
        };
        // What the controller reads: each ready replica's sidecar status and the activator's last two documents.
        let sidecars: Vec<Option<SidecarStatus>> = live
            .iter()
            .filter(|&&r| self.replicas[r].phase == Phase::Ready)
            .map(|&r| {
                Some(observe::sidecar_status(
                    self.replicas[r].scrapes.iter(),
                    self.sc.gpu.memory_bytes,
                    self.now,
                    settings.scrape_interval,
                    settings.ttft_window,
                ))
            })
            .collect();
        // Tessera decides replicas and share jointly (`core::scale::joint`), as the controller does, with the
        // GPU's size as its sidecars report it; the baselines decide on their declared policy.
        let room = ShareRoom::of(
            tessera,
            setup.compute_fraction == ComputeFraction::Auto,
            rt.allocation.in_force.map(|a| (a.compute_fraction, a.memory_mib)),
            inputs::gpu_memory_bytes(&sidecars),
        );
        let poll = inputs::ACTIVATOR_POLL_INTERVAL;
        let since_poll = rt
            .recent
            .iter()
            .rev()
            .take_while(|&&t| t > self.now - poll.as_secs_f64())
            .count() as u64;
        let latest = observe::ActivatorCounts {
            requests_total: rt.arrived,
            in_flight: self.in_flight(m) as u64,
            queued: rt.held.len() as u64,
            last_request_at_ms: rt.last_request_at.map(secs_to_ms),
            mix: rt.mix,
        };
        let previous = observe::ActivatorCounts {
            requests_total: rt.arrived - since_poll,
            ..latest
        };
        let now_ms = secs_to_ms(self.now);
        let key = model_key(observe::NAMESPACE, &setup.name);
        let sample = observe::activator_sample(&key, now_ms, poll, previous, latest);
        let demand = inputs::demand_from(
            std::slice::from_ref(&sample),
            std::slice::from_ref(&key),
            now_ms,
            inputs::ACTIVATOR_MAX_AGE,
        );
        // HPA's and AIBrix's rate is a Prometheus-style rate over `rate_window` (their external metric).
        let external_rate = (!tessera).then(|| {
            let window = settings.rate_window.as_secs_f64();
            let recent = rt.recent.iter().filter(|&&t| t >= self.now - window).count();
            recent as f64 / window.min(self.now.max(1.0))
        });
        // A budget group's members read each other's last claims, as the controller reads them from its states.
        let grouped = declared
            .scale_to_zero
            .as_ref()
            .is_some_and(|z| z.cold_start_budget_group.is_some());
        let peers = if grouped {
            self.models
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != m)
                .filter_map(|(_, rt)| rt.state.claim.clone())
                .collect()
        } else {
            Vec::new()
        };
        let (placement, leaving) = self.move_placement(0, live);
        let observed = round::Observed {
            name: setup.name.clone(),
            replicas: live.len() as u32,
            // A surge (one replica over the decision, to move a pod off a draining GPU) is not a count the rule
            // chose: the round takes it off, as the controller's takes it off `/scale`'s count.
            surged: rt.surging,
            sidecars,
            demand,
            external_rate,
            room,
            leads,
            peers,
            placement,
            max_signal_age: inputs::MAX_SIGNAL_AGE,
            // The class step runs for Tessera as the controller runs it; the baselines scale as their products do.
            class: tessera.then(|| ClassSignals {
                declared: Declared {
                    pinned: setup.workload_class,
                    ..Declared::default()
                },
                // Read from the activator's document, as the controller reads it (`inputs::mix_from`).
                mix: inputs::mix_from(
                    std::slice::from_ref(&sample),
                    std::slice::from_ref(&key),
                    now_ms,
                    inputs::ACTIVATOR_MAX_AGE,
                ),
                explicit: setup.class_explicit,
            }),
            // Sleep mode is Tessera's: the baselines' products cannot put a pod to sleep.
            sleep: if tessera { self.sleep_facts(m, live) } else { None },
            isolation: self.isolation_facts(m, live),
        };
        (observed, sample, leaving)
    }

    /// The report's counts of one round of model `m`.
    fn count_round(&mut self, m: usize, r: &round::Round) {
        let rt = &mut self.models[m];
        if let Some(w) = r.joint.warm_floor {
            rt.warm_floor = Some(w);
        }
        if r.class.is_some() {
            rt.class.clone_from(&r.class);
        }
        rt.rounds_zero_within_budget += u32::from(r.joint.zero_within_budget.is_some());
        rt.rounds_latency_on_share += u32::from(r.joint.latency == LatencyOwner::Share);
        rt.rounds_prefill_bound += u32::from(
            r.decision.prefill_held.is_some() || joint::latency_without_queue(&r.input, &r.decision),
        );
        rt.rounds += 1;
        *rt.held_by.entry(r.constraint).or_default() += 1;
        rt.next_unit = r.joint.next_unit;
        let d = &r.decision;
        if d.is_change() {
            let key = match d.leading_signal {
                Some(sig) => format!("{}/{}", d.reason.label(), sig.label()),
                None => d.reason.label().to_string(),
            };
            *rt.scale_changes.entry(key).or_default() += 1;
            tracing::trace!(model = %self.sc.models[m].name, at = self.now, from = d.current_replicas,
                to = d.desired_replicas, reason = %d.reason, message = %d.message, "scale");
        }
    }

    /// The parity test's record of one round of model `m`.
    #[allow(clippy::too_many_arguments)]
    fn decision_record(
        &self,
        m: usize,
        observed: round::Observed,
        activator: inputs::ActivatorSample,
        policy: ScalePolicy,
        state: ScaleState,
        r: &round::Round,
        leaving: &[usize],
    ) -> observe::DecisionRecord {
        let rt = &self.models[m];
        let ready: Vec<usize> = self
            .live(m)
            .into_iter()
            .filter(|&r| self.replicas[r].phase == Phase::Ready)
            .collect();
        observe::DecisionRecord {
            model: m,
            at_ms: secs_to_ms(self.now),
            current_replicas: r.input.current_replicas,
            activator,
            policy,
            cold_start: rt.state.last_cold_start,
            state,
            counted: rt.state.clone(),
            decision: r.decision.clone(),
            constraint: r.constraint,
            moving: observe::MoveRecord {
                surged: observed.surged,
                ready_on_draining: ready.iter().map(|r| leaving.contains(r)).collect(),
                starting_on_draining: leaving
                    .iter()
                    .filter(|&&r| self.replicas[r].phase == Phase::Starting)
                    .count() as u32,
                step: r.step,
            },
            observed,
        }
    }

    /// Requests model `m`'s replicas have accepted and not finished (what the activator counts as forwarded).
    fn in_flight(&self, m: usize) -> usize {
        self.models[m]
            .replicas
            .iter()
            .filter(|&&r| self.replicas[r].phase != Phase::Gone)
            .map(|&r| self.replicas[r].engine.in_flight())
            .sum()
    }

    /// Where model `m`'s live replicas are relative to a draining GPU, for the consolidation move rule
    /// (`core::pack::consolidate::move_step`, as the controller reads it from its pods), and the ones on it.
    pub(super) fn move_placement(&self, desired: u32, live: &[usize]) -> (ModelPlacement, Vec<usize>) {
        let draining = |r: usize| {
            self.replicas[r]
                .gpu
                .zip(self.packer.as_ref())
                .and_then(|(g, p)| p.gpu(g))
                .is_some_and(|g| g.is_draining())
        };
        // A roll's old pods leave the same way: one surge, then the old pod once the new one is ready.
        let (on, off): (Vec<usize>, Vec<usize>) = live
            .iter()
            .partition(|&&r| draining(r) || self.replaced_by_roll(r));
        let placement = ModelPlacement {
            desired,
            on_draining: on.len() as u32,
            off_ready: off
                .iter()
                .filter(|&&r| self.replicas[r].phase == Phase::Ready)
                .count() as u32,
            off_starting: off
                .iter()
                .filter(|&&r| self.replicas[r].phase == Phase::Starting)
                .count() as u32,
        };
        (placement, on)
    }

    /// Applies a replica decision of `desired` for model `m` with the move `step`: replicas on a draining GPU
    /// (`on`) leave by a surge onto another GPU, then their retirement once the new one is ready.
    pub(super) fn apply_move(
        &mut self,
        m: usize,
        desired: u32,
        step: MoveStep,
        on: &[usize],
        live: &[usize],
    ) -> Result<(), SimError> {
        let was_surging = std::mem::replace(&mut self.models[m].surging, step == MoveStep::Surge);
        self.models[m].decided = desired;
        match step {
            MoveStep::Stay => self.apply_count(m, desired as usize, live),
            MoveStep::Surge => {
                if !was_surging && on.iter().any(|&r| !self.replaced_by_roll(r)) {
                    self.consolidation.moves += 1;
                }
                self.apply_count(m, step.replicas(desired) as usize, live)
            }
            MoveStep::Retire { pods } => {
                // The pods on the draining GPU go first (the pod-deletion-cost the controller sets).
                let retired = self.retire(on, pods as usize);
                self.rollouts.replaced +=
                    retired.iter().filter(|&&r| self.replaced_by_roll(r)).count() as u64;
                let left: Vec<usize> = live.iter().copied().filter(|r| !retired.contains(r)).collect();
                self.apply_count(m, desired as usize, &left)
            }
        }
    }

    /// Stops up to `n` of `among` in the order a ReplicaSet removes pods: starting ones first (nothing to drain),
    /// then the lowest `pod-deletion-cost` — under Tessera, replicas whose allocation drifted from the one in force
    /// (`core::rollout::drifted`, the cost the controller gives them) — then the newest. The ReplicaSet cannot see
    /// requests in flight, so neither does this order; those with requests in flight drain. Returns the ones
    /// removed.
    pub(super) fn retire(&mut self, among: &[usize], n: usize) -> Vec<usize> {
        let threshold = self.sc.settings.rollout().drift_threshold;
        let mut victims = among.to_vec();
        victims.sort_by_key(|&r| {
            let rep = &self.replicas[r];
            let drifted = self.models[rep.model]
                .allocation
                .in_force
                .zip(rep.allocation)
                .is_some_and(|(f, a)| tessera_core::rollout::drifted(&f, &a, threshold));
            (rep.phase == Phase::Ready, !drifted, std::cmp::Reverse(r))
        });
        victims.truncate(n);
        for &r in &victims {
            if self.replicas[r].phase == Phase::Starting || self.replicas[r].engine.is_idle() {
                self.stop_replica(r);
            } else {
                self.replicas[r].phase = Phase::Draining;
            }
        }
        victims
    }

    /// Tessera's pool manager tick: the consolidation rule (`core::pack::consolidate::pool_step`) marks, keeps or
    /// clears the GPU being emptied; the models move off it in their own rounds ([`World::apply_move`]).
    pub(super) fn consolidate(&mut self) {
        if self.plan.kind != StrategyKind::Tessera {
            return;
        }
        let cfg = self.sc.settings.consolidation();
        let now = self.now as u64;
        let Some(packer) = self.packer.as_mut() else {
            return;
        };
        // Every replica here is a Deployment's pod; one still starting has no place to move from yet. The packer
        // holds exactly the replicas on GPUs (the tenants), so only those are looked up.
        let ready: std::collections::HashSet<&str> = self
            .tenants
            .values()
            .flatten()
            .map(|&r| &self.replicas[r])
            .filter(|r| r.phase == Phase::Ready)
            .map(|r| r.name.as_str())
            .collect();
        let step = consolidate::pool_step(packer, self.candidate, now, &cfg, |r| {
            ready.contains(r.id.as_str())
        });
        self.candidate = step.candidate();
        if let Some((gpu, since)) = step.mark(now) {
            packer.set_draining(gpu, since);
        }
        match step {
            PoolStep::Drain(plan) => {
                self.consolidation.drains += 1;
                tracing::debug!(at = self.now, gpu = %plan.gpu, moves = plan.moves.len(), "draining a GPU");
            }
            PoolStep::Drained(_) => self.consolidation.drained += 1,
            PoolStep::Cancel { gpu, reason } => {
                self.consolidation.cancelled += 1;
                tracing::debug!(at = self.now, %gpu, reason = reason.as_str(), "drain cancelled");
            }
            PoolStep::Idle | PoolStep::Settling { .. } | PoolStep::Draining(_) => {}
        }
    }

    /// KubeAI's and KEDA HTTP's rule: in-flight requests counted at their proxy, held ones included.
    pub(super) fn scale_on_in_flight(&mut self, m: usize) -> Result<(), SimError> {
        let live = self.live(m);
        let in_flight = self.in_flight(m) + self.models[m].held.len();
        let max = self.sc.models[m].max_replicas;
        let now = self.now;
        let Some((rule, state)) = self.models[m].concurrency.as_mut() else {
            return Ok(());
        };
        let want = concurrency_desired(rule, state, now, in_flight as f64, live.len() as u32, max);
        if want as usize != live.len() {
            let key = if want as usize > live.len() {
                "scale_up/in_flight"
            } else {
                "scale_down/in_flight"
            };
            *self.models[m].scale_changes.entry(key.to_string()).or_default() += 1;
        }
        self.models[m].decided = want;
        self.apply_count(m, want as usize, &live)
    }

    /// Starts or stops replicas of model `m` to reach `want`.
    pub(super) fn apply_count(&mut self, m: usize, want: usize, live: &[usize]) -> Result<(), SimError> {
        let have = live.len();
        if want > have {
            for _ in have..want {
                self.start_replica(m, false)?;
            }
        } else if want < have {
            self.retire(live, have - want);
        }
        Ok(())
    }

    /// Tessera's recommendation round: each model's recommendation from its ready replicas' windows.
    pub(super) fn on_recommend(&mut self) {
        let window = self.sc.settings.recommend_window.as_secs_f64();
        for m in 0..self.models.len() {
            let cfg = sidecar_config(&self.sc.models[m], self.sc.settings.compute_oversubscription());
            let mut best: Option<Recommendation> = None;
            for &r in &self.models[m].replicas {
                let rep = &self.replicas[r];
                if rep.phase != Phase::Ready {
                    continue;
                }
                // What the replica's sidecar holds: its recommendation was computed at its last scrape, over the
                // scrapes of the window before it (`sidecar/src/state.rs`; the recommendation parity test,
                // `sidecar/tests/recommend_parity.rs`, replays these replicas through it).
                let Some(last) = rep.scrapes.back() else {
                    continue;
                };
                let horizon = last.at - window;
                let start = rep.observations.partition_point(|o| o.at_secs < horizon);
                // The window's latency: the difference of its first and last scrapes' histograms, measured at the
                // share it runs with; none with a single scrape in the window.
                let first = rep
                    .scrapes
                    .iter()
                    .find(|s| s.at >= horizon)
                    .filter(|f| f.at < last.at);
                // The sidecar's input (`recommend::Input::of_replica`): the step bounded from what the replica runs.
                let input = recommend::Input::of_replica(
                    &rep.observations[start..],
                    geometry(&rep.engine),
                    rep.memory,
                    compute_facts(
                        &self.sc.models[m],
                        rep.compute_fraction,
                        first.and_then(|f| {
                            window_latency(&last.ttft, Some(&f.ttft), self.sc.models[m].ttft_slo_percentile)
                        }),
                        first.and_then(|f| window_latency(&last.itl, Some(&f.itl), SloPercentile::P95)),
                    ),
                );
                let outcome = recommend::recommend(&input, &cfg);
                if let Some(records) = self
                    .recommendations
                    .as_mut()
                    .filter(|r| r.len() < self.recommendations_limit)
                {
                    records.push(observe::RecommendationRecord {
                        model: m,
                        at: self.now,
                        sidecar: observe::SidecarSetup {
                            window_secs: window,
                            config: cfg,
                            compute_share: rep.compute_fraction,
                            ttft_slo_secs: Some(self.sc.models[m].slo_ttft),
                            itl_slo_secs: self.sc.models[m].slo_itl,
                            ttft_percentile: self.sc.models[m].ttft_slo_percentile,
                            bytes_per_kv_token: rep.memory.bytes_per_kv_token,
                            non_kv_bytes: rep.memory.non_kv_bytes,
                            max_model_len: Some(u64::from(rep.engine.max_model_len())),
                            gpu_shared: rep.gpu_shared(),
                            gpu_total_bytes: rep.memory.gpu_total_bytes.unwrap_or(self.sc.gpu.memory_bytes),
                            process_gpu_bytes: rep.memory.process_gpu_bytes,
                        },
                        pages: rep.pages.iter().cloned().collect(),
                        outcome: outcome.clone(),
                    });
                }
                if let Outcome::Ready(rec) = outcome {
                    best = Some(match best {
                        None => rec,
                        Some(b) => b.covering(&rec),
                    });
                }
            }
            // No recommendation (too little data) keeps what the model had: missing data never shrinks it.
            if let Some(rec) = best {
                self.models[m].rec = Some(rec);
            }
        }
    }
}

/// The KV geometry a sidecar reads from `cache_config_info`.
pub(super) fn geometry(engine: &Engine) -> KvGeometry {
    KvGeometry {
        num_gpu_blocks: engine.kv_blocks_total(),
        block_size: u64::from(engine.config().block_size),
        max_model_len: Some(u64::from(engine.max_model_len())),
    }
}

/// The `percentile` (the objective's: `ttftSloPercentile`; a p95 for the inter-token objective) and count of what a
/// cumulative histogram gained since `earlier` (`None`: since it started), as the sidecar computes a window's
/// quantile from two scrapes, read as the scale guard reads it (`SloPercentile::for_window`: the p95 over too few
/// samples for a p99); `None` when nothing was observed.
pub(super) fn window_latency(
    later: &Histogram,
    earlier: Option<&Histogram>,
    percentile: tessera_core::scale::SloPercentile,
) -> Option<recommend::LatencyObservation> {
    let later = later.to_cumulative();
    let d = match earlier {
        Some(e) => later.delta(&e.to_cumulative()),
        None => later,
    };
    let q = percentile.for_window(Some(d.count)).quantile();
    Some(recommend::LatencyObservation {
        p95_secs: d.quantile(q)?,
        samples: d.count,
    })
}

/// What the compute-share rule gets for a replica of `setup` running at `share`: the sidecar's
/// `--gpu-compute-fraction`, `--ttft-slo` and `--itl-slo`, and the window's latency.
pub(super) fn compute_facts(
    setup: &ModelSetup,
    share: f64,
    ttft: Option<recommend::LatencyObservation>,
    itl: Option<recommend::LatencyObservation>,
) -> recommend::ComputeFacts {
    recommend::ComputeFacts {
        current_share: Some(share),
        ttft_slo_secs: Some(setup.slo_ttft),
        itl_slo_secs: setup.slo_itl,
        ttft,
        itl,
    }
}

/// The recommendation settings of a model's sidecars, as the webhook starts them: the defaults, and the replica
/// count's KV-utilization target (`--kv-target-utilization`, from the policy's `targets.kvCacheUtilization`) and
/// the pool's compute oversubscription (`--compute-oversubscription`, from the pool's `computeOversubscription`).
fn sidecar_config(setup: &ModelSetup, oversubscription: f64) -> recommend::Config {
    recommend::Config {
        kv_target_utilization: setup.targets.kv_cache_utilization,
        compute_oversubscription: Some(oversubscription),
        ..recommend::Config::default()
    }
}

/// The steady-state recommendation for each model from whole-GPU histories: what a sidecar watching the
/// baseline would converge to, applying the recommendation rule update after update (each step is bounded, so
/// it is iterated until it stops moving). The compute share sees the baseline's own latency (vLLM's TTFT and
/// inter-token histograms over the run) at the share it ran with (the whole GPU), against the model's
/// objectives, as a sidecar started with `--ttft-slo`/`--itl-slo` would. Models with too little history get `None`.
pub fn calibrate(sc: &Scenario, histories: &[ReplicaHistory]) -> Vec<Option<Recommendation>> {
    (0..sc.models.len())
        .map(|m| {
            let cfg = sidecar_config(&sc.models[m], sc.settings.compute_oversubscription());
            let mut best: Option<Recommendation> = None;
            for h in histories.iter().filter(|h| h.model == m) {
                let mut prev: Option<Recommendation> = None;
                for _ in 0..200 {
                    // The steady state: the replica's input, its step bounded from the last answer of this search
                    // (what a replica would run once the answer before had rolled out).
                    let input = recommend::Input {
                        previous: prev.as_ref(),
                        // Latency over the whole baseline run, at the share the baseline ran with (whole GPU).
                        ..recommend::Input::of_replica(
                            &h.observations,
                            h.geometry,
                            h.memory,
                            compute_facts(
                                &sc.models[m],
                                h.compute_fraction,
                                window_latency(&h.ttft, None, sc.models[m].ttft_slo_percentile),
                                window_latency(&h.itl, None, SloPercentile::P95),
                            ),
                        )
                    };
                    match recommend::recommend(&input, &cfg) {
                        Outcome::Ready(r) => {
                            let same = prev.as_ref().is_some_and(|p| {
                                p.kv_cache_memory_bytes == r.kv_cache_memory_bytes
                                    && p.compute_fraction == r.compute_fraction
                            });
                            prev = Some(r);
                            if same {
                                break;
                            }
                        }
                        Outcome::NotYet { .. } => break,
                    }
                }
                if let Some(r) = prev {
                    best = Some(match best {
                        None => r,
                        Some(b) => b.covering(&r),
                    });
                }
            }
            best
        })
        .collect()
}
