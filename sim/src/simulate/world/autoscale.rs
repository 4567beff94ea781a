//! The autoscaler's side of a run: each model's replica round (the core rule's decision, consolidation's
//! move step, the baselines' own rules), GPU draining, and Tessera's recommendation round.

use tessera_core::rollout::Urgency;
use tessera_core::scale::coldstart::BudgetClaim;
use tessera_core::scale::constraint::Constraint;

use super::*;

impl World<'_> {
    /// One autoscaler round for model `m`: observe, decide with the core rule, act.
    pub(super) fn scale_model(&mut self, m: usize) -> Result<(), SimError> {
        if self.models[m].concurrency.is_some() {
            return self.scale_on_in_flight(m);
        }
        let Some(declared) = self.models[m].policy.clone() else {
            return Ok(());
        };
        // Tessera decides replicas and share jointly (`core::scale::joint`), as the controller does; the
        // baselines decide on their declared policy.
        let room = ShareRoom::of(
            self.plan.kind == StrategyKind::Tessera,
            self.sc.models[m].compute_fraction == ComputeFraction::Auto,
            self.models[m]
                .allocation
                .in_force
                .map(|a| (a.compute_fraction, a.memory_mib)),
            Some(self.sc.gpu.memory_bytes),
        );
        // How long new capacity takes here: from zero a sleep-mode wake, or the pod's start and the weights' load;
        // another replica beside a running one always the pod's start and the load. Only Tessera's policy knows its
        // lead times (the baselines scale as declared).
        let setup = &self.sc.models[m];
        let leads = if self.plan.kind == StrategyKind::Tessera {
            // A wake needs a sleeping pod: one the model has now, or the one its last replica leaves when it goes.
            let sleeping_pod =
                setup.sleep_wake_secs.is_some() && (self.sleepers.contains_key(&m) || self.live_count(m) > 0);
            joint::LeadTimes::may_sleep(
                Duration::from_secs_f64(setup.scale_up_secs(&self.sc.settings)),
                setup.sleep_wake_secs.map(Duration::from_secs_f64),
                sleeping_pod,
            )
        } else {
            joint::LeadTimes::default()
        };
        let now_ts = Timestamp::from_millis((self.now * 1000.0).round() as u64);
        let live = self.live(m);
        let ready: Vec<usize> = live
            .iter()
            .copied()
            .filter(|&r| self.replicas[r].phase == Phase::Ready)
            .collect();
        // What the controller reads: each ready replica's sidecar status and the activator's last two documents,
        // turned into the decision's input by the controller's own functions (`core::scale::inputs`).
        let settings = &self.sc.settings;
        let docs: Vec<SidecarStatus> = ready
            .iter()
            .map(|&r| {
                observe::sidecar_status(
                    self.replicas[r].scrapes.iter(),
                    self.sc.gpu.memory_bytes,
                    self.now,
                    settings.scrape_interval,
                    settings.ttft_window,
                )
            })
            .collect();
        let read: Vec<Option<&SidecarStatus>> = docs.iter().map(Some).collect();
        // What hurries a growth onto the pods, read as the controller reads it (`core::rollout::Urgency`).
        let urgency = Urgency::of(&read, declared.ttft_slo, inputs::MAX_SIGNAL_AGE);
        let in_flight = self.in_flight(m);
        let rt = &self.models[m];
        let poll = inputs::ACTIVATOR_POLL_INTERVAL;
        let since_poll = rt
            .recent
            .iter()
            .rev()
            .take_while(|&&t| t > self.now - poll.as_secs_f64())
            .count() as u64;
        let latest = observe::ActivatorCounts {
            requests_total: rt.arrived,
            in_flight: in_flight as u64,
            queued: rt.held.len() as u64,
            last_request_at_ms: rt.last_request_at.map(secs_to_ms),
        };
        let previous = observe::ActivatorCounts {
            requests_total: rt.arrived - since_poll,
            ..latest
        };
        let now_ms = now_ts.as_millis();
        let key = model_key(observe::NAMESPACE, &self.sc.models[m].name);
        let sample = observe::activator_sample(&key, now_ms, poll, previous, latest);
        let mut demand = inputs::demand_from(
            std::slice::from_ref(&sample),
            std::slice::from_ref(&key),
            now_ms,
            inputs::ACTIVATOR_MAX_AGE,
        );
        if self.plan.kind != StrategyKind::Tessera {
            // HPA's and AIBrix's rate is a Prometheus-style rate over `rate_window` (their external metric).
            let window = settings.rate_window.as_secs_f64();
            let horizon = self.now - window;
            let recent = rt.recent.iter().filter(|&&t| t >= horizon).count();
            demand.requests_per_second = Some(recent as f64 / window.min(self.now.max(1.0)));
        }
        // A surge (one replica over the decision, to move a pod off a draining GPU) is not a count the rule chose:
        // the controller takes it off `/scale`'s count the same way.
        let current = consolidate::count_before_surge(live.len() as u32, rt.surging);
        let input = inputs::scale_input(current, &read, inputs::MAX_SIGNAL_AGE, demand);
        let state_before = self.decisions.is_some().then(|| self.models[m].state.clone());
        // A budget group's members read each other's last claims, as the controller reads them from its states.
        let group: Vec<BudgetClaim> = if declared
            .scale_to_zero
            .as_ref()
            .is_some_and(|z| z.cold_start_budget_group.is_some())
        {
            self.models
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != m)
                .filter_map(|(_, rt)| rt.state.claim.clone())
                .collect()
        } else {
            Vec::new()
        };
        // The controller's round (`joint::round`): the demand counted into the cold-start ledger, the start's length
        // (which the simulator knows) resolved as the controller resolves what it measured, the joint policy, and
        // the claim the model's group reads.
        let joint = joint::round(
            &declared,
            room,
            leads,
            &input,
            &mut self.models[m].state,
            &joint::BudgetPeers {
                name: &self.sc.models[m].name,
                claims: &group,
            },
            now_ts,
        );
        if let Some(w) = joint.warm_floor {
            self.models[m].warm_floor = Some(w);
        }
        if joint.zero_within_budget.is_some() {
            self.models[m].rounds_zero_within_budget += 1;
        }
        if joint.latency == LatencyOwner::Share {
            self.models[m].rounds_latency_on_share += 1;
        }
        self.models[m].rounds += 1;
        let rt = &self.models[m];
        let d = joint::decide(&input, &joint, &rt.state, now_ts);
        let prefill_bound = joint::latency_without_queue(&input, &d);
        let held = Constraint::of(&input, &joint, &d);
        *self.models[m].held_by.entry(held).or_default() += 1;
        self.models[m].next_unit = joint.next_unit;
        self.isolation_round(m, &declared, &input, &live);
        let (placement, leaving) = self.move_placement(d.desired_replicas, &live);
        let step = consolidate::move_step(placement);
        let rt = &self.models[m];
        if let Some(log) = self.decisions.as_mut() {
            log.push(observe::DecisionRecord {
                model: m,
                at_ms: now_ms,
                current_replicas: input.current_replicas,
                sidecars: docs,
                activator: sample,
                policy: declared,
                room,
                cold_start: rt.state.last_cold_start,
                state: state_before.unwrap_or_default(),
                counted: rt.state.clone(),
                group,
                decision: d.clone(),
                constraint: held,
                moving: observe::MoveRecord {
                    surged: rt.surging,
                    ready_on_draining: ready.iter().map(|r| leaving.contains(r)).collect(),
                    starting_on_draining: leaving
                        .iter()
                        .filter(|&&r| self.replicas[r].phase == Phase::Starting)
                        .count() as u32,
                    step,
                },
            });
        }
        self.models[m].state.record(&d, now_ts);
        if prefill_bound {
            self.models[m].rounds_prefill_bound += 1;
        }
        if d.is_change() {
            let key = match d.leading_signal {
                Some(sig) => format!("{}/{}", d.reason.label(), sig.label()),
                None => d.reason.label().to_string(),
            };
            *self.models[m].scale_changes.entry(key).or_default() += 1;
            tracing::trace!(model = %self.sc.models[m].name, at = self.now, from = d.current_replicas,
                to = d.desired_replicas, reason = %d.reason, message = %d.message, "scale");
        }
        self.apply_move(m, d.desired_replicas, step, &leaving, &live)?;
        if self.plan.kind == StrategyKind::Tessera {
            let live = self.live(m);
            self.fold_allocation(m, urgency, &live, d.desired_replicas);
        }
        Ok(())
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
        let horizon = self.now - self.sc.settings.recommend_window.as_secs_f64();
        for m in 0..self.models.len() {
            let cfg = sidecar_config(&self.sc.models[m]);
            let mut best: Option<Recommendation> = None;
            for &r in &self.models[m].replicas {
                let rep = &self.replicas[r];
                if rep.phase != Phase::Ready {
                    continue;
                }
                let start = rep.observations.partition_point(|o| o.at_secs < horizon);
                // The window's latency: the replica's histograms now minus at the window's start (or since
                // it started, when it is younger than the window), measured at the share it runs with.
                let base = rep.scrapes.iter().rev().find(|s| s.at <= horizon);
                let st = rep.engine.stats();
                let input = recommend::Input {
                    window: &rep.observations[start..],
                    geometry: geometry(&rep.engine),
                    memory: rep.memory,
                    previous: self.models[m].rec.as_ref(),
                    compute: compute_facts(
                        &self.sc.models[m],
                        rep.compute_fraction,
                        window_p95(&st.ttft, base.map(|s| &s.ttft)),
                        window_p95(&st.itl, base.map(|s| &s.itl)),
                    ),
                };
                if let Outcome::Ready(rec) = recommend::recommend(&input, &cfg) {
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

/// p95 and count of what a cumulative histogram gained since `earlier` (`None`: since it started), as the
/// sidecar computes a window's quantile from two scrapes; `None` when nothing was observed.
pub(super) fn window_p95(
    later: &Histogram,
    earlier: Option<&Histogram>,
) -> Option<recommend::LatencyObservation> {
    let later = later.to_cumulative();
    let d = match earlier {
        Some(e) => later.delta(&e.to_cumulative()),
        None => later,
    };
    Some(recommend::LatencyObservation {
        p95_secs: d.quantile(0.95)?,
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
/// count's KV-utilization target (`--kv-target-utilization`, from the policy's `targets.kvCacheUtilization`).
fn sidecar_config(setup: &ModelSetup) -> recommend::Config {
    recommend::Config {
        kv_target_utilization: setup.targets.kv_cache_utilization,
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
            let cfg = sidecar_config(&sc.models[m]);
            let mut best: Option<Recommendation> = None;
            for h in histories.iter().filter(|h| h.model == m) {
                let mut prev: Option<Recommendation> = None;
                for _ in 0..200 {
                    let input = recommend::Input {
                        window: &h.observations,
                        geometry: h.geometry,
                        memory: h.memory,
                        previous: prev.as_ref(),
                        // Latency over the whole baseline run, at the share the baseline ran with (whole GPU).
                        compute: compute_facts(
                            &sc.models[m],
                            h.compute_fraction,
                            window_p95(&h.ttft, None),
                            window_p95(&h.itl, None),
                        ),
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
