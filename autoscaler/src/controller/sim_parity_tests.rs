//! The controller and the simulator decide alike from the same observations.
//!
//! The simulator runs the default scenario with Tessera and records, for every replica-count decision, the
//! documents the controller would have fetched at that instant (each ready replica's sidecar `/v1/status`, the
//! activator's last two stats documents), the model's history and the decision. Each recorded instant is then
//! replayed through the controller's real `reconcile`: an API server answering the target's `/scale` and pods, the
//! sidecars and the activator answering the recorded documents, the clock at the recorded time and the model's
//! history loaded. The controller must write the replica count the simulator decided (or leave it), for the same
//! reason, and end with the same history. Before the round, the controller's gathering ([`gather`]) must build the
//! round's input (`core::round::Observed`) the simulator built: the two callers share every rule from there on.
#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use futures::future::BoxFuture;
use http::{Method, Request, Response};
use http_body_util::BodyExt;
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use tessera_core::pack::consolidate::MoveStep;
use tessera_core::scale::joint::ShareRoom;
use tessera_core::scale::{ScalePolicy, SloPercentile};
use tessera_core::wire::activator::ActivatorStats;
use tessera_core::wire::sidecar::SidecarStatus;
use tessera_sim::simulate::observe::{DecisionRecord, MoveRecord, NAMESPACE};
use tessera_sim::simulate::scenario::{self, Source};
use tessera_sim::simulate::world::{Plan, StrategyKind, World};

use super::*;
use crate::controller::signals::{ActivatorPoller, FetchError, SignalSource};

/// Sidecars answer their recorded documents by URL; the activator answers its two recorded documents in turn,
/// then (a re-poll before a scale to zero) the latest again, observed a moment later.
struct Recorded {
    sidecars: HashMap<String, SidecarStatus>,
    activator: Mutex<VecDeque<ActivatorStats>>,
    latest_served: std::sync::atomic::AtomicBool,
}

impl SignalSource for Recorded {
    fn sidecar_status(&self, base: &str) -> BoxFuture<'_, Result<SidecarStatus, FetchError>> {
        let r = self.sidecars.get(base).cloned().ok_or(FetchError::Connect {
            url: base.to_owned(),
            message: "no such replica".into(),
        });
        Box::pin(async move { r })
    }
    fn activator_stats(&self, _base: &str) -> BoxFuture<'_, Result<ActivatorStats, FetchError>> {
        let mut docs = self.activator.lock().unwrap();
        // The last document is served once as recorded (the round's own poll), then a moment later each time.
        let doc = if docs.len() > 1 {
            docs.pop_front()
        } else if !self
            .latest_served
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            docs.front().cloned()
        } else {
            docs.front_mut().map(|d| {
                d.observed_at_unix_ms += 10;
                d.clone()
            })
        };
        Box::pin(async move { Ok(doc.unwrap()) })
    }
}

/// The `InferenceAutoscaler` spec a user would write for the simulated policy: fractional with an automatic
/// share unless the share was fixed.
fn spec_for(name: &str, p: &ScalePolicy, room: ShareRoom) -> Value {
    let secs = |d: Duration| format!("{}ms", d.as_millis());
    let mut targets = serde_json::Map::new();
    if let Some(v) = p.targets.kv_cache_utilization {
        targets.insert("kvCacheUtilization".into(), json!(v));
    }
    if let Some(v) = p.targets.waiting_requests_per_replica {
        targets.insert("waitingRequestsPerReplica".into(), json!(v));
    }
    if let Some(v) = p.targets.ttft_p95 {
        targets.insert("ttftP95".into(), json!(secs(v)));
    }
    if let Some(v) = p.targets.requests_per_second_per_replica {
        targets.insert("requestsPerSecondPerReplica".into(), json!(v));
    }
    let mut spec = json!({
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
        "minReplicas": p.min_replicas, "maxReplicas": p.max_replicas,
        "targets": targets, "modelNames": [name],
    });
    if let Some(slo) = p.ttft_slo {
        spec["ttftSlo"] = json!(secs(slo));
    }
    if p.ttft_slo_percentile == SloPercentile::P99 {
        spec["ttftSloPercentile"] = json!(99);
    }
    if let Some(z) = &p.scale_to_zero {
        spec["scaleToZero"] = json!({"idleAfter": secs(z.idle_after)});
        if let Some(b) = z.cold_start_miss_budget {
            spec["scaleToZero"]["coldStartMissBudget"] = json!(b);
        }
        if let Some(g) = &z.cold_start_budget_group {
            spec["scaleToZero"]["coldStartBudgetGroup"] = json!(g);
        }
    }
    if room != ShareRoom::Fixed {
        spec["gpu"] = json!({"sharing": "fractional", "computeFraction": "auto", "updateMode": "Initial"});
    }
    spec
}

/// The status an earlier reconcile left: the allocation in force is the share the simulator's new replicas get.
fn status_for(room: ShareRoom, gpu_memory_bytes: u64) -> Value {
    match room {
        ShareRoom::Auto {
            share,
            memory_fraction,
        } => {
            let mib = memory_fraction.map_or(0.0, |f| f * gpu_memory_bytes as f64 / 1_048_576.0);
            json!({"allocation": {"reason": "stable",
                   "inForce": {"gpuMemoryMiB": mib.round() as i64, "computeFraction": share}}})
        }
        _ => json!({}),
    }
}

/// What the API server saw during one reconcile.
#[derive(Default)]
struct Seen {
    scaled_to: Option<i64>,
    status: Option<Value>,
    /// Pods given the lowest pod-deletion-cost (leaving a draining GPU).
    marked: Vec<String>,
    unexpected: Vec<String>,
}

/// The capacity pod the replay says is being drained, and the one every other pod sits on.
const DRAINING_GPU: &str = "tessera-gpu-sim-1";
const OTHER_GPU: &str = "tessera-gpu-sim-0";

/// The status condition a round that surged leaves (so the next one takes the surge off `/scale`'s count).
fn surge_condition() -> Value {
    json!({"type": crate::controller::consolidate::CONSOLIDATING, "status": "True", "reason": crate::controller::consolidate::REASON_SURGE,
           "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"})
}

/// Answers the reconcile's API calls: `/scale` at `current`, the pods (ready ones first, with the IPs the
/// sidecar documents are served at), the scale write, Events and the status write.
async fn api_server(
    mut handle: tower_test::mock::Handle<Request<Body>, Response<Body>>,
    name: String,
    current: u32,
    moving: MoveRecord,
    started: (u64, Option<Duration>),
    ias: Value,
    seen: Arc<Mutex<Seen>>,
) {
    let ready = moving.ready_on_draining.len();
    // Each ready pod was created at `at` and turned Ready a cold start later (millisecond timestamps, so the
    // controller measures exactly the simulator's lead time).
    let (at_ms, lead) = started;
    let stamp = |ms: u64| {
        k8s_openapi::jiff::Timestamp::from_millisecond(ms as i64)
            .unwrap()
            .to_string()
    };
    let created = at_ms.saturating_sub(600_000);
    let became_ready = lead.map(|l| created + l.as_millis() as u64);
    while let Some((req, send)) = handle.next_request().await {
        let path = req.uri().path().to_owned();
        let method = req.method().clone();
        let bytes = req.into_body().collect().await.unwrap().to_bytes();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let scale = |r: i64| {
            json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
                   "metadata": {"name": name, "namespace": NAMESPACE, "resourceVersion": "100"},
                   "spec": {"replicas": r}, "status": {"replicas": r, "selector": format!("app={name}")}})
        };
        let (status, answer) = if path.ends_with("/scale") && method == Method::GET {
            (200, scale(i64::from(current)))
        } else if path.ends_with("/scale") && method == Method::PATCH {
            let r = body["spec"]["replicas"].as_i64().unwrap();
            seen.lock().unwrap().scaled_to = Some(r);
            (200, scale(r))
        } else if path.ends_with("/pods") && method == Method::GET {
            let pods: Vec<Value> = (0..current as usize)
                .map(|i| {
                    let mut ready_condition =
                        json!({"type": "Ready", "status": if i < ready { "True" } else { "False" }});
                    if let Some(t) = became_ready {
                        ready_condition["lastTransitionTime"] = json!(stamp(t));
                    }
                    // Ready pods in the simulator's order; of the starting ones, the first few are on the draining GPU.
                    let draining = moving
                        .ready_on_draining
                        .get(i)
                        .copied()
                        .unwrap_or_else(|| i - ready < moving.starting_on_draining as usize);
                    let gpu = if draining { DRAINING_GPU } else { OTHER_GPU };
                    json!({"metadata": {"name": format!("{name}-{i}"), "namespace": NAMESPACE,
                                        "creationTimestamp": stamp(created),
                                        "annotations": {crate::pool::ANNOTATION_CAPACITY_POD: gpu}},
                           "spec": crate::controller::injection::injected_spec(),
                           "status": {"podIP": format!("10.0.0.{}", i + 1), "conditions": [ready_condition]}})
                })
                .collect();
            (
                200,
                json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": pods}),
            )
        } else if path.contains("/pods/") && method == Method::PATCH {
            let pod = path.rsplit('/').next().unwrap().to_owned();
            assert_eq!(
                body,
                json!({"metadata": {"annotations": {crate::pool::POD_DELETION_COST: i32::MIN.to_string()}}})
            );
            seen.lock().unwrap().marked.push(pod.clone());
            (200, json!({"metadata": {"name": pod, "namespace": NAMESPACE}}))
        } else if path.ends_with("/events") && method == Method::POST {
            (201, body)
        } else if path.ends_with("/status") && method == Method::PATCH {
            seen.lock().unwrap().status = Some(body["status"].clone());
            (200, ias.clone())
        } else {
            seen.lock().unwrap().unexpected.push(format!("{method} {path}"));
            (404, json!({"kind": "Status", "code": 404}))
        };
        crate::test_support::respond(send, status, &answer);
    }
}

/// Replays one recorded decision through the controller's reconcile; returns the replica count it wrote (if
/// any), its status and the model's history after it.
async fn replay(
    name: &str,
    rec: &DecisionRecord,
    gpu_memory_bytes: u64,
) -> (Seen, tessera_core::scale::ScaleState) {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(svc, NAMESPACE);
    let mut status = status_for(rec.observed.room, gpu_memory_bytes);
    if rec.moving.surged {
        status["conditions"] = json!([surge_condition()]);
    }
    // The last round isolated the model (`core::scale::isolation`): its `Isolated` condition says so.
    let isolation = rec.observed.isolation.unwrap_or_default();
    if isolation.isolated {
        let mut conditions = status["conditions"].as_array().cloned().unwrap_or_default();
        conditions.push(
            json!({"type": tessera_api::crd::CONDITION_ISOLATED, "status": "True",
            "reason": "CoTenantsAtCeiling", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}),
        );
        status["conditions"] = Value::Array(conditions);
    }
    let obj: Arc<InferenceAutoscaler> = Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "tessera.dev/v1alpha1", "kind": "InferenceAutoscaler",
            "metadata": {"name": name, "namespace": NAMESPACE, "uid": "u-1", "resourceVersion": "5",
                         "generation": 1},
            "spec": spec_for(name, &rec.policy, rec.observed.room),
            "status": status,
        }))
        .unwrap(),
    );
    assert_eq!(
        obj.spec.to_policy().unwrap(),
        rec.policy,
        "the spec must give the simulated policy"
    );
    let sidecars = rec
        .observed
        .sidecars
        .iter()
        .enumerate()
        .map(|(i, d)| (format!("http://10.0.0.{}:9090", i + 1), d.clone().unwrap()))
        .collect();
    let mut docs = VecDeque::new();
    docs.extend(rec.activator.previous.as_deref().cloned());
    docs.extend(rec.activator.latest.as_deref().cloned());
    let clock_ms = rec.at_ms;
    let ctx = super::tests::test_context(
        client,
        Arc::new(Recorded {
            sidecars,
            activator: Mutex::new(docs),
            latest_served: Default::default(),
        }),
        ActivatorPoller::new(&["http://activator:8080".to_owned()]),
        UNIX_EPOCH + Duration::from_millis(clock_ms),
        // The model's history, and the claims its budget group's other members had published.
        std::iter::once((format!("{NAMESPACE}/{name}"), rec.state.clone()))
            .chain(rec.observed.peers.iter().map(|c| {
                let peer = tessera_core::scale::ScaleState {
                    claim: Some(c.clone()),
                    ..Default::default()
                };
                (format!("{NAMESPACE}/{}", c.member), peer)
            }))
            .collect(),
    );
    ctx.consolidation
        .draining
        .set("sim", vec![DRAINING_GPU.to_owned()]);
    // Where the simulator's replicas shared a GPU, the pool says so of theirs: of the leaving ones only while the
    // model is isolated (its shared replicas are the ones leaving), of every one otherwise.
    if isolation.shares_gpu {
        let shared = if isolation.isolated {
            vec![DRAINING_GPU.to_owned()]
        } else {
            vec![DRAINING_GPU.to_owned(), OTHER_GPU.to_owned()]
        };
        ctx.consolidation.shared.set("sim", shared);
    }
    // The poller's two documents, fetched one poll apart as the controller's loop does.
    let poll_ms = tessera_core::scale::inputs::ACTIVATOR_POLL_INTERVAL.as_millis() as u64;
    let age = tessera_core::scale::inputs::ACTIVATOR_MAX_AGE;
    if rec.activator.previous.is_some() {
        ctx.activators
            .poll_once(ctx.signals.as_ref(), &ctx.metrics, clock_ms - poll_ms, age)
            .await;
    }
    ctx.activators
        .poll_once(ctx.signals.as_ref(), &ctx.metrics, clock_ms, age)
        .await;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let server = tokio::spawn(api_server(
        handle,
        name.to_owned(),
        rec.current_replicas + u32::from(rec.moving.surged),
        rec.moving.clone(),
        (rec.at_ms, rec.cold_start),
        serde_json::to_value(&*obj).unwrap(),
        seen.clone(),
    ));
    // The round's input, as the controller gathers it: what the simulator observed.
    let ias_api: kube::Api<InferenceAutoscaler> = kube::Api::namespaced(ctx.client.clone(), NAMESPACE);
    let policy = obj.spec.to_policy().unwrap();
    let now = UNIX_EPOCH + Duration::from_millis(clock_ms);
    let gathered = gather(&ctx, &obj, &ias_api, &policy, now).await.unwrap();
    assert_same_observed(
        gathered.observed,
        &rec.observed,
        &format!("{name} at {clock_ms} ms"),
    );
    reconcile(obj, ctx.clone()).await.unwrap();
    let state = ctx.states.lock().unwrap()[&format!("{NAMESPACE}/{name}")].clone();
    drop(ctx);
    server.abort();
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert!(
        seen.unexpected.is_empty(),
        "unexpected API calls: {:?}",
        seen.unexpected
    );
    (seen, state)
}

/// The controller's `Observed` is the simulator's, but for what differs by design: the controller measures the
/// cold start from its pods' timestamps (to the millisecond; the history check below bounds it) and starts every
/// replica as a pod (one lead for both), where the simulator knows its scenario's; the order in which a budget
/// group's claims are read (the controller's come from a map).
fn assert_same_observed(
    mut ours: tessera_core::round::Observed,
    theirs: &tessera_core::round::Observed,
    at: &str,
) {
    let sim = theirs.leads;
    if let Some(measured) = ours.leads.from_zero {
        let known = sim.from_zero.unwrap();
        assert!(
            measured.abs_diff(known) < Duration::from_secs(1),
            "{at}: lead {measured:?} vs {known:?}"
        );
    }
    assert_eq!(
        ours.leads.scale_up, None,
        "{at}: the controller starts every replica as a pod"
    );
    assert!(
        sim.scale_up.is_none() || sim.scale_up == sim.from_zero,
        "{at}: the simulator's leads {sim:?}"
    );
    ours.leads = sim;
    // The workload class: both classify, from what the model declares and the request mix the activator's
    // document counted (the simulator's recorded document is the one the controller's poller fetched here).
    assert!(ours.class.is_some(), "{at}: the controller always classifies");
    let mut peers = theirs.peers.clone();
    peers.sort_by(|a, b| a.member.cmp(&b.member));
    ours.peers.sort_by(|a, b| a.member.cmp(&b.member));
    let theirs = tessera_core::round::Observed {
        peers,
        ..theirs.clone()
    };
    assert_eq!(ours, theirs, "{at}: the round's input");
}

#[tokio::test]
async fn the_controller_decides_what_the_simulator_decided() {
    use tessera_sim::simulate::scenario::UpdateMode;
    // The default scenario's hour: long enough for scale-ups, holds, scale-downs and scale to zero. Under
    // `updateMode: Initial` (the default), then `Recreate`, so the replay also covers the rounds of a roll (its
    // surge and retirements go through the same move step as consolidation's); and on seed 1, whose hour has a
    // plain ratio scale-up (the default seed's increases all come from the SLO guard and panic mode since the KV
    // floor sits below the replica count's target). The scenario runs as the report's table runs it: the
    // controller cannot put a pod to sleep, so every start is a pod's start and the weights' load. Its tools then
    // keep warm floors (a 28 s start against 3-5 s objectives), so the last replay gives the three that would
    // have slept an objective a cold start meets, and they go to zero and come back.
    let mut covered = Coverage::default();
    for (mode, seed, tools_accept_a_cold_start) in [
        (UpdateMode::Initial, None, false),
        (UpdateMode::Recreate, None, false),
        (UpdateMode::Initial, Some(1), false),
        (UpdateMode::Initial, None, true),
    ] {
        let mut sc = scenario::load(&Source::Default, seed, None).unwrap();
        if tools_accept_a_cold_start {
            for m in sc.models.iter_mut().filter(|m| m.sleep_wake_secs.is_some()) {
                m.slo_ttft = 60.0;
            }
        }
        let mut sc = sc.without_sleep_mode();
        sc.settings.update_mode = mode;
        covered.add(replay_the_hour(&sc).await);
    }
    covered.check();
}

/// What the replays covered, together.
#[derive(Default)]
struct Coverage {
    reasons: HashSet<&'static str>,
    warm_floor: bool,
    share_can_grow: bool,
}

impl Coverage {
    fn add(&mut self, other: Coverage) {
        self.reasons.extend(other.reasons);
        self.warm_floor |= other.warm_floor;
        self.share_can_grow |= other.share_can_grow;
    }

    /// Each kind of change (a plain ratio scale-up, a scale-down, to and from zero), a warm floor (a cold start over
    /// the objective) and the joint rule with a share that can grow.
    fn check(&self) {
        assert!(self.warm_floor, "the replay must cover a warm floor");
        assert!(
            self.share_can_grow,
            "the replay must cover the joint rule with a share that can grow"
        );
        for needed in ["scale_up", "scale_down", "scale_to_zero", "scale_from_zero"] {
            assert!(
                self.reasons.contains(needed),
                "the replay must cover {needed}; it covers {:?}",
                self.reasons
            );
        }
    }
}

/// Runs Tessera over `sc` recording its decisions, replays every change and every 25th hold through the
/// controller, and returns what the replay covered.
async fn replay_the_hour(sc: &scenario::Scenario) -> Coverage {
    // Started as `tessera simulate` starts Tessera: from the allocation the HPA baseline's observations recommend
    // (a recommendation comes into force only after the 30-minute stability window, so one started without would
    // run at vLLM's defaults for most of the replay).
    let histories = World::new(
        sc,
        Plan::starting_from(StrategyKind::Hpa, vec![None; sc.models.len()]),
    )
    .unwrap()
    .run(&mut |_| {})
    .unwrap()
    .histories;
    let initial = tessera_sim::simulate::world::calibrate(sc, &histories);
    let run = World::new(sc, Plan::starting_from(StrategyKind::Tessera, initial))
        .unwrap()
        .recording_decisions()
        .run(&mut |_| {})
        .unwrap();
    let records = run.decisions;
    // Every change the simulator made, and every 25th hold.
    let mut picked: Vec<&DecisionRecord> = Vec::new();
    let mut holds = 0;
    let mut floors = 0;
    for r in &records {
        let floor = r.decision.message.contains("keeps one warm replica");
        if floor {
            floors += 1;
        }
        // Every round of a move off a draining GPU, too.
        if r.decision.is_change() || (floor && floors % 25 == 1) || r.moving.step != MoveStep::Stay {
            picked.push(r);
        } else {
            holds += 1;
            if holds % 25 == 0 {
                picked.push(r);
            }
        }
    }
    let reasons: HashSet<&'static str> = picked.iter().map(|r| r.decision.reason.label()).collect();
    assert!(
        picked.iter().any(|r| r.moving.step != MoveStep::Stay),
        "the replay must cover a move (a consolidation or a roll)"
    );
    assert_replays_alike(sc, &picked).await;
    eprintln!(
        "replayed {} of {} decisions through the controller ({} changes) under {:?}, reasons {reasons:?}",
        picked.len(),
        records.len(),
        picked.iter().filter(|r| r.decision.is_change()).count(),
        sc.settings.update_mode
    );
    Coverage {
        reasons,
        warm_floor: picked
            .iter()
            .any(|r| r.decision.message.contains("keeps one warm replica")),
        share_can_grow: picked
            .iter()
            .any(|r| matches!(r.observed.room, ShareRoom::Auto { .. })),
    }
}

/// Replays each record through the controller's reconcile and checks it writes what the simulator applied (the
/// decision, one over it during a consolidation surge), marks as many pods to leave a draining GPU as the
/// simulator retired, reports the same decision, and ends with the same history.
async fn assert_replays_alike(sc: &scenario::Scenario, picked: &[&DecisionRecord]) {
    for rec in picked {
        let name = &sc.models[rec.model].name;
        let (seen, state) = replay(name, rec, sc.gpu.memory_bytes).await;
        let status = seen.status.unwrap_or(Value::Null);
        let at = format!(
            "{name} at {:.0} s ({}; move {:?})",
            rec.at_ms as f64 / 1000.0,
            rec.decision.message,
            rec.moving
        );
        // What the simulator applied: the decision, one over it during a surge; written when `/scale` differs.
        let applied = rec.moving.step.replicas(rec.decision.desired_replicas);
        let read = rec.current_replicas + u32::from(rec.moving.surged);
        let want = (applied != read).then_some(i64::from(applied));
        assert_eq!(seen.scaled_to, want, "{at}");
        let retired = match rec.moving.step {
            MoveStep::Retire { pods } => pods as usize,
            MoveStep::Stay | MoveStep::Surge => 0,
        };
        assert_eq!(
            seen.marked.len(),
            retired,
            "{at}: pods marked to leave the draining GPU"
        );
        assert_eq!(
            status["desiredReplicas"],
            json!(rec.decision.desired_replicas),
            "{at}"
        );
        assert_eq!(
            status["lastDecisionReason"],
            json!(rec.decision.reason.label()),
            "{at}"
        );
        // What held the count, as the simulator's report sums it (`core::scale::constraint`).
        assert_eq!(status["constraint"], json!(rec.constraint.label()), "{at}");
        // The history as the simulator's round left it (the demand counted into the cold-start ledger, the claim
        // its group reads), then the decision.
        let mut expected = rec.counted.clone();
        // The start the controller measured from the pods' timestamps (to the millisecond; the simulator's is
        // exact), remembered for the rounds at zero.
        let measured = state.last_cold_start;
        assert!(
            match (measured, rec.cold_start) {
                (Some(a), Some(b)) => a.abs_diff(b) < Duration::from_secs(1),
                (a, b) => a == b,
            },
            "{at}: cold start measured {measured:?}, simulated {:?}",
            rec.cold_start
        );
        expected.last_cold_start = measured;
        expected.minutes = state.minutes.clone();
        expected.record(
            &rec.decision,
            tessera_core::scale::Timestamp::from_millis(rec.at_ms),
        );
        assert_eq!(state, expected, "{at}: the history after the decision");
    }
}

/// Consolidation's model half (`core::pack::consolidate::move_step`) alike: functions-day's first hours, where the
/// simulator drains a GPU and moves a tool's replica off it; every round of that move (the surge, the wait for the
/// copy, the retire) is replayed through the controller with its pods placed where the simulator had them.
#[tokio::test]
async fn the_controller_moves_pods_off_a_draining_gpu_as_the_simulator_did() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/functions-day.yaml");
    let sc = scenario::load(
        &Source::File(path.clone()),
        None,
        Some(Duration::from_secs(2 * 3600)),
    )
    .unwrap()
    .without_sleep_mode();
    // Replicas sized from the HPA baseline's observations over the whole day, as `tessera simulate` starts
    // Tessera: small enough to share GPUs, so there is something to consolidate.
    let day = scenario::load(&Source::File(path), None, None)
        .unwrap()
        .without_sleep_mode();
    let baseline = Plan::starting_from(StrategyKind::Hpa, vec![None; sc.models.len()]);
    let histories = World::new(&day, baseline)
        .unwrap()
        .run(&mut |_| {})
        .unwrap()
        .histories;
    let tessera = Plan::starting_from(
        StrategyKind::Tessera,
        tessera_sim::simulate::world::calibrate(&sc, &histories),
    );
    let run = World::new(&sc, tessera)
        .unwrap()
        .recording_decisions()
        .run(&mut |_| {})
        .unwrap();
    let picked: Vec<&DecisionRecord> = run
        .decisions
        .iter()
        .filter(|r| r.moving.step != MoveStep::Stay || r.moving.surged)
        .collect();
    for step in ["Surge", "Retire"] {
        assert!(
            picked.iter().any(|r| r.moving.step.as_str() == step),
            "the replay must cover a consolidation {step}: the simulated run drained no GPU ({} decisions)",
            run.decisions.len()
        );
    }
    assert_replays_alike(&sc, &picked).await;
    eprintln!(
        "replayed {} rounds of consolidation moves through the controller",
        picked.len()
    );
}

/// Tessera over `sc` from no starting recommendation, every replica-count decision recorded.
fn decisions_from_scratch(sc: &scenario::Scenario) -> Vec<DecisionRecord> {
    World::new(
        sc,
        Plan::starting_from(StrategyKind::Tessera, vec![None; sc.models.len()]),
    )
    .unwrap()
    .recording_decisions()
    .run(&mut |_| {})
    .unwrap()
    .decisions
}

/// The cold-start miss budget alike (`core::scale::coldstart`): functions-day's first four hours, whose tools
/// keep a warm replica until an hour of their traffic shows their would-be cold starts within
/// the allowance of the budget the six tools share (`coldstart::group`), then go to zero. The controller counts the
/// same demand into the same ledger from the recorded activator documents, reads the claims the simulator's round
/// read from the other tools, lets the floor go at the same rounds and scales to zero with them.
/// With `ttftSloPercentile: 99` the controller's guard reads the p99 the simulator's did: the default scenario's
/// hour with every model's guard on the p99, each round the guard decided on it (and every 40th other) replayed.
#[tokio::test]
async fn the_controller_guards_the_p99_as_the_simulator_did() {
    let mut sc = scenario::load(&Source::Default, None, Some(Duration::from_secs(1800)))
        .unwrap()
        .without_sleep_mode();
    // The percentile written in the spec, as a user sets it: an explicit field keeps its value under any class
    // (`core::class::policy::apply`), so the guard reads the p99 whatever the class step detects.
    for m in &mut sc.models {
        m.ttft_slo_percentile = SloPercentile::P99;
        m.class_explicit.ttft_slo_percentile = true;
    }
    let decisions = decisions_from_scratch(&sc);
    let on_p99 = |r: &DecisionRecord| r.decision.message.contains("p99 time to first token");
    let picked: Vec<&DecisionRecord> = decisions
        .iter()
        .enumerate()
        .filter(|(i, r)| on_p99(r) || i % 40 == 0)
        .map(|(_, r)| r)
        .collect();
    assert!(
        picked.iter().any(|r| on_p99(r) && r.decision.is_change()),
        "the replay must cover a change the p99 guard made"
    );
    assert_replays_alike(&sc, &picked).await;
    eprintln!(
        "replayed {} rounds ({} on the p99) through the controller",
        picked.len(),
        picked.iter().filter(|r| on_p99(r)).count()
    );
}

#[tokio::test]
async fn the_controller_spends_the_cold_start_budget_as_the_simulator_did() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/functions-day.yaml");
    let sc = scenario::load(&Source::File(path), None, Some(Duration::from_secs(4 * 3600)))
        .unwrap()
        .without_sleep_mode();
    assert!(
        sc.models.iter().any(|m| m.cold_start_miss_budget.is_some()),
        "functions-day sets a cold-start miss budget"
    );
    let decisions = decisions_from_scratch(&sc);
    let within = |r: &&DecisionRecord| r.decision.message.contains("may go to zero though a cold start");
    let mut picked: Vec<&DecisionRecord> = Vec::new();
    for (i, r) in decisions.iter().filter(within).enumerate() {
        if r.decision.is_change() || i % 40 == 0 {
            picked.push(r);
        }
    }
    assert!(
        picked
            .iter()
            .any(|r| r.decision.desired_replicas == 0 && r.decision.is_change()),
        "the replay must cover a scale to zero the budget allowed ({} rounds within it)",
        decisions.iter().filter(within).count()
    );
    // The scenario's tools share one budget: the controller must read the group's claims as the simulator did.
    assert!(
        picked
            .iter()
            .any(|r| !r.observed.peers.is_empty() && r.decision.message.contains("budget group 'tools'")),
        "the replay must cover rounds decided on the budget group's claims"
    );
    // And rounds that kept the floor while the ledger was filling, with the ledger those rounds built.
    picked.extend(
        decisions
            .iter()
            .filter(|r| r.decision.message.contains("keeps one warm replica"))
            .step_by(60),
    );
    assert_replays_alike(&sc, &picked).await;
    eprintln!(
        "replayed {} rounds around the cold-start budget through the controller",
        picked.len()
    );
}
