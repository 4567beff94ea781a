//! Unit tests of the whole simulation on small scenarios whose answers can be worked out by hand.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use proptest::prelude::*;

use super::scenario::{
    ColdStartFile, ComputeFraction, HamiFile, ModelSetup, Scenario, StrategySettings, TargetsFile,
};
use super::*;
use crate::model::{GIB, GpuSpec, ModelSpec};
use crate::trace::Arrival;

fn model(name: &str, min_replicas: u32, max_replicas: u32) -> ModelSetup {
    let spec = ModelSpec::preset("llama-3.1-8b").unwrap();
    let load_secs = spec.weights_bytes as f64 / (ColdStartFile::default().load_bandwidth_gbps * 1e9);
    ModelSetup {
        name: name.into(),
        spec,
        max_model_len: Some(16_384),
        slo_ttft: 5.0,
        slo_itl: None,
        ttft_slo_percentile: Default::default(),
        min_replicas,
        max_replicas,
        targets: TargetsFile {
            waiting_requests_per_replica: Some(2.0),
            ..TargetsFile::default()
        },
        hpa_rps_per_replica: 5.0,
        cold_start_miss_budget: None,
        cold_start_budget_group: None,
        scale_to_zero_after: (min_replicas == 0).then_some(Duration::from_secs(60)),
        load_secs,
        sleep_wake_secs: None,
        compute_fraction: ComputeFraction::Auto,
        hami: HamiFile::default(),
        today: None,
        policy: None,
        workload_class: None,
        class_explicit: tessera_core::class::Explicit::default(),
    }
}

fn scenario(models: Vec<ModelSetup>, arrivals: Vec<Vec<Arrival>>, duration: f64) -> Scenario {
    Scenario {
        name: "test".into(),
        description: String::new(),
        seed: 1,
        duration,
        gpu: GpuSpec::preset("a100-80gb").unwrap(),
        settings: StrategySettings::default(),
        models,
        arrivals,
        batch: None,
    }
}

fn at(times: &[f64]) -> Vec<Arrival> {
    times
        .iter()
        .map(|&t| Arrival {
            at: t,
            prompt_tokens: 100,
            output_tokens: 10,
        })
        .collect()
}

fn run(sc: &Scenario) -> Report {
    simulate(sc, &mut |_, _| {}).unwrap()
}

/// One model, five lone requests ten seconds apart, one minute: every strategy holds exactly one GPU for one
/// minute (static sizes to one replica; HPA and Tessera stay at their minimum of one), every request finishes,
/// and since each request finds the engine empty, all five TTFTs are the same single prefill step.
#[test]
fn hand_worked_one_model_five_requests() {
    let sc = scenario(
        vec![model("m", 1, 2)],
        vec![at(&[0.0, 10.0, 20.0, 30.0, 40.0])],
        60.0,
    );
    let r = run(&sc);
    assert_eq!(r.static_sizing[0].replicas, 1);
    assert_eq!(r.strategies.len(), StrategyKind::ALL.len());
    // KubeAI samples in-flight requests every sync and averages them; lone 10 ms requests are never caught in
    // flight, so its average reads zero and it scales to zero after its 30 s delay (and back on the next
    // request; here none comes). Every other strategy keeps its one replica.
    for s in r.strategies.iter().filter(|s| s.strategy != "kubeai") {
        assert_eq!(s.requests, 5, "{}", s.strategy);
        assert_eq!(s.completed, 5, "{}", s.strategy);
        assert_eq!(s.failed, 0, "{}", s.strategy);
        assert_eq!(s.arrivals_processed, 5, "{}", s.strategy);
        assert!(
            (s.gpu_hours - 60.0 / 3600.0).abs() < 1e-12,
            "{}: {}",
            s.strategy,
            s.gpu_hours
        );
        let (p50, p99) = (s.ttft_p50.unwrap(), s.ttft_p99.unwrap());
        assert!((p50 - p99).abs() < 1e-9, "{}: {p50} {p99}", s.strategy);
        assert_eq!(s.slo_attainment, 1.0);
        assert_eq!(s.cold_starts, 0);
    }
    let kubeai = r.strategy("kubeai").unwrap();
    assert_eq!(kubeai.completed, 5);
    // Zero at 45 s: the first sync (15 s) asks for zero, the 30 s delay passes at the third (45 s).
    assert!(
        (kubeai.gpu_hours - 45.0 / 3600.0).abs() < 1e-9,
        "{}",
        kubeai.gpu_hours
    );
    // The bounds: each tiny request can be served anywhere in its 5 s objective, so with free cold starts no
    // instant is forced (0); through the 29 s cold start each forces its model resident from a cold start before
    // its latest admission, and the five windows overlap into one from 0 s to just after the last arrival.
    assert_eq!(r.lower_bound_gpu_hours, 0.0);
    let cold = r.lower_bound_with_cold_starts_gpu_hours * 3600.0;
    assert!((40.0..41.0).contains(&cold), "{cold}");
    // By hand, from the performance model's roofline (sim/src/model.rs, vLLM defaults on an A100-80GB): one
    // prefill step of 100 tokens reads the weights plus 100 tokens of KV,
    //   (14.96 GiB + 100 × 131072 B) / (2.039e12 B/s × 0.8) = 9.8555 ms,
    // which beats the compute time 2 × 8.03e9 × 100 / (312e12 × 0.6) = 8.58 ms; plus the host part for one
    // sequence of an 8.03B model: 1 ms + 0.25 ms × 8.03 + 0.03 ms = 3.0375 ms (model::sharing::host_time_s).
    let by_hand =
        (14.96 * GIB as f64 + 100.0 * 131_072.0) / (2.039e12 * 0.8) + 0.001 + 0.000_25 * 8.03 + 0.000_03;
    for s in &r.strategies[..2] {
        let t = s.ttft_p50.unwrap();
        assert!((t - by_hand).abs() < 1e-6, "{}: {t} vs {by_hand}", s.strategy);
    }
}

/// Static with a fixed count holds count × duration.
#[test]
fn static_gpu_hours_are_replicas_times_duration() {
    let sc = scenario(
        vec![model("a", 1, 3), model("b", 1, 3)],
        vec![at(&[1.0]), at(&[2.0])],
        1800.0,
    );
    let plan = Plan::fixed(vec![3, 2]);
    let r = world::World::new(&sc, plan).unwrap().run(&mut |_| {}).unwrap();
    assert!(
        (r.report.gpu_hours - 5.0 * 0.5).abs() < 1e-12,
        "{}",
        r.report.gpu_hours
    );
    assert_eq!(r.report.gpus_peak, 5);
}

/// Scale to zero and back: a model idle after its first requests goes to zero and gives its GPU back; the
/// request at 400 s is held while a replica cold-starts, for exactly pod start + weights / bandwidth (the GPU
/// is fresh, so nobody else holds its start-up lease).
#[test]
fn scale_to_zero_holds_the_request_for_the_cold_start() {
    let mut m = model("m", 0, 1);
    // An objective a cold start can meet: the joint rule lets it go to zero.
    m.slo_ttft = 60.0;
    let expect = StrategySettings::default().pod_start.as_secs_f64() + m.load_secs;
    let sc = scenario(vec![m], vec![at(&[0.0, 5.0, 10.0, 400.0])], 600.0);
    let r = run(&sc);
    let t = r.strategy("tessera").unwrap();
    assert_eq!(t.completed, 4);
    assert_eq!(t.starts_from_zero, 1);
    assert_eq!(t.held_requests, 1);
    assert!(
        (t.held_max_secs - expect).abs() < 1e-9,
        "{} vs {expect}",
        t.held_max_secs
    );
    let st = r.strategy("static").unwrap();
    assert!(
        t.gpu_hours < 0.7 * st.gpu_hours,
        "tessera {} static {}",
        t.gpu_hours,
        st.gpu_hours
    );
    // The held request's TTFT includes the hold.
    assert!(t.ttft_p99.unwrap() >= expect);
    // The HPA baseline never goes to zero.
    assert_eq!(r.strategy("hpa").unwrap().held_requests, 0);
}

/// A model whose cold start is longer than its TTFT objective keeps one warm replica (the joint rule's warm
/// floor): nothing is held, nothing starts from zero, and the report says why.
#[test]
fn a_cold_start_over_the_objective_keeps_a_warm_replica() {
    let m = model("m", 0, 1);
    let lead = StrategySettings::default().pod_start.as_secs_f64() + m.load_secs;
    assert!(
        lead > m.slo_ttft,
        "the objective must be shorter than the cold start"
    );
    let sc = scenario(vec![m], vec![at(&[0.0, 5.0, 10.0, 400.0])], 600.0);
    let t = run(&sc).strategy("tessera").unwrap().clone();
    assert_eq!((t.starts_from_zero, t.held_requests), (0, 0));
    let floor = t.models[0].warm_floor.clone().unwrap_or_default();
    assert!(floor.starts_with("cold start"), "{floor}");
}

/// A model with a sleep-mode wake: the table's run puts it to sleep at zero (the round's rest rule, as the
/// controller's), and the wake replaces the pod start and the load; the extra run without sleep mode keeps a warm
/// replica instead, because a cold start would miss the objective.
#[test]
fn sleep_mode_is_the_tables_run_and_the_extra_run_goes_without() {
    // A second, always-busy model keeps the GPU, so the sleeping pod's GPU is not given back.
    let mut m = model("m", 0, 1);
    m.sleep_wake_secs = Some(0.5);
    let busy = model("busy", 1, 1);
    let busy_at: Vec<f64> = (0..60).map(|i| f64::from(i) * 10.0).collect();
    let sc = scenario(vec![m, busy], vec![at(&[0.0, 400.0]), at(&busy_at)], 600.0);
    let r = run(&sc);
    assert_eq!(r.sleep_mode_models, ["m"]);
    // The table: asleep at zero, woken once on its GPU.
    let t = r.strategy("tessera").unwrap().clone();
    assert_eq!((t.sleep_wakes, t.sleepers_lost), (1, 0), "{t:?}");
    assert!(t.models[0].warm_floor.is_none(), "{:?}", t.models[0].warm_floor);
    // Without sleep mode: a cold start would miss the objective, so the model keeps a warm replica.
    let plain = r.tessera_without_sleep.expect("a run without sleep mode");
    assert_eq!((plain.sleep_wakes, plain.sleepers_lost), (0, 0));
    assert!(t.gpu_hours <= plain.gpu_hours, "{t:?} against {plain:?}");
    let said = "Sleep mode (m): at zero, Tessera puts a model's last replica to sleep";
    assert!(r.table().contains(said), "{}", r.table());
    assert!(r.table().contains(&format!(
        "Without sleep mode Tessera would hold {:.2} GPU-hours",
        plain.gpu_hours
    )));
    assert!(super::html::render(&r).contains(said));
    // Without one, nothing is said.
    let none = run(&scenario(vec![model("m", 0, 1)], vec![at(&[0.0])], 60.0));
    assert!(none.sleep_mode_models.is_empty() && none.sleep_mode_note().is_none());
    assert_eq!(none.tessera_without_sleep, None);
}

/// Issue 57, "the table's Tessera row is what the chart's defaults do": a sleeping pod keeps its whole share, as
/// the pool does without `gpuPools.lendSleepers`, so a newcomer that needs its room opens a GPU and the sleeper
/// wakes where it slept; with lending on, the newcomer takes the room and the sleeper's next start is cold.
#[test]
fn a_sleeping_pod_keeps_its_whole_share_unless_lending_is_on() {
    // Whole-GPU compute caps: two fill one GPU under the 2x MPS oversubscription, so the newcomer fits beside the
    // busy model only in the sleeper's room.
    let whole = |mut m: ModelSetup| {
        m.compute_fraction = ComputeFraction::Fixed(1.0);
        m
    };
    let mut sleeper = whole(model("sleeper", 0, 1));
    sleeper.sleep_wake_secs = Some(0.5);
    let busy = whole(model("busy", 1, 1));
    // An objective its cold start meets, so it goes to zero (no warm floor) and comes back at 300 s while the
    // sleeper sleeps, busy until after the sleeper's request at 600 s.
    let mut newcomer = whole(model("newcomer", 0, 1));
    newcomer.slo_ttft = 60.0;
    let busy_at: Vec<f64> = (0..90).map(|i| f64::from(i) * 10.0).collect();
    let mut sc = scenario(
        vec![sleeper, busy, newcomer],
        vec![
            at(&[0.0, 600.0]),
            at(&busy_at),
            at(&[0.0, 300.0, 350.0, 400.0, 450.0, 500.0, 550.0, 600.0, 650.0]),
        ],
        900.0,
    );
    // No drain: consolidation would empty the sleeper's GPU and lose it either way.
    sc.settings.consolidation = false;
    let kept = run(&sc).strategy("tessera").unwrap().clone();
    assert_eq!((kept.sleep_wakes, kept.sleepers_lost), (1, 0), "{kept:?}");
    sc.settings.lend_sleepers = true;
    let r = run(&sc);
    let lent = r.strategy("tessera").unwrap().clone();
    assert_eq!((lent.sleep_wakes, lent.sleepers_lost), (0, 1), "{lent:?}");
    assert!(r.table().contains("lend_sleepers on"), "{}", r.table());
}

/// Issue 57: the simulator's round runs the workload-class step the controller runs, and the report names each
/// model's class and the knobs its defaults set. A model pinned to `batch` gets the batch class's cold-start miss
/// budget (half its requests may wait through a start) in the policy its rounds decide with.
#[test]
fn the_class_step_runs_in_the_simulators_round_and_the_report_names_it() {
    let arrivals = || vec![at(&[0.0, 5.0, 10.0, 400.0, 405.0, 800.0])];
    let realtime = run(&scenario(vec![model("m", 0, 1)], arrivals(), 1200.0));
    let t = realtime.strategy("tessera").unwrap();
    let class = t.models[0].workload_class.clone().unwrap();
    assert_eq!(class.class, "realtime", "{class:?}");
    assert!(class.policy.contains("warm replica kept"), "{class:?}");
    let mut m = model("m", 0, 1);
    m.workload_class = Some(tessera_core::class::WorkloadClass::Batch);
    let batch = run(&scenario(vec![m], arrivals(), 1200.0));
    let t = batch.strategy("tessera").unwrap();
    let class = t.models[0].workload_class.clone().unwrap();
    assert_eq!(
        (class.class.as_str(), class.source.as_str()),
        ("batch", "pinned"),
        "{class:?}"
    );
    assert!(
        class
            .policy_from_class
            .iter()
            .any(|f| f == "scaleToZero.coldStartMissBudget"),
        "{class:?}"
    );
    // The batch class's cold-start budget is in the policy the round decided with.
    assert!(class.policy.contains("cold-start budget 50.0%"), "{class:?}");
    assert!(
        batch.table().contains("Workload class") && batch.table().contains("m batch (pinned"),
        "{}",
        batch.table()
    );
    let json = serde_json::to_string(&batch).unwrap();
    assert!(
        json.contains("\"policy_from_class\""),
        "report.json names the class: {json}"
    );
}

/// Issue 57: "GPU compute allocated 112%" is explained where it is shown: under MPS a share is a cap.
#[test]
fn compute_shares_over_the_gpus_held_are_explained() {
    let mut r = run(&scenario(vec![model("m", 1, 1)], vec![at(&[0.0])], 60.0));
    assert!(r.compute_shares_note().is_none());
    let t = r.strategies.iter_mut().find(|s| s.strategy == "tessera").unwrap();
    t.compute_allocated_ratio = 1.12;
    let note = r.compute_shares_note().unwrap();
    assert!(note.contains("tessera 112%") && note.contains("a cap"), "{note}");
    assert!(r.table().contains(&note), "{}", r.table());
}

/// A replica alone on its GPU does not sleep there: asleep it would hold the GPU as a warm replica does, and be
/// lost when the idle GPU is given back, after which the warm floor starts it cold again (a cycle of cold starts).
/// It stays warm, and the request 300 s in is met.
#[test]
fn a_replica_alone_on_its_gpu_stays_warm_rather_than_sleep() {
    let mut m = model("m", 0, 1);
    m.sleep_wake_secs = Some(0.5);
    let sc = scenario(vec![m], vec![at(&[0.0, 300.0])], 600.0);
    let t = run(&sc).strategy("tessera").unwrap().clone();
    assert_eq!((t.sleep_wakes, t.sleepers_lost), (0, 0), "{t:?}");
    assert_eq!(t.slo_attainment, 1.0, "{t:?}");
}

/// Two models scaling from zero onto one GPU load one after the other (the start-up lease): the second waits
/// for the first's load.
#[test]
fn start_ups_on_one_gpu_are_serialized() {
    let mut a = model("a", 0, 1);
    let mut b = model("b", 0, 1);
    a.slo_ttft = 60.0;
    b.slo_ttft = 60.0;
    // Small fixed shares so both fit on one GPU.
    a.compute_fraction = ComputeFraction::Fixed(0.25);
    b.compute_fraction = ComputeFraction::Fixed(0.25);
    let load = a.load_secs;
    // Calibrated on the baseline, each replica's memory shrinks to about 19 GiB, so both fit on one GPU.
    let sc = scenario(vec![a, b], vec![at(&[0.0, 400.0]), at(&[0.0, 400.0])], 600.0);
    let r = run(&sc);
    let t = r.strategy("tessera").unwrap();
    let pod_start = sc.settings.pod_start.as_secs_f64();
    assert_eq!(t.held_requests, 2);
    // a: pod start + load; b: waits for a's load to finish, then loads.
    assert!(
        (t.held_max_secs - (pod_start + 2.0 * load)).abs() < 1e-6,
        "{}",
        t.held_max_secs
    );
    assert!(
        (t.held_mean_secs - (pod_start + 1.5 * load)).abs() < 1e-6,
        "{}",
        t.held_mean_secs
    );
}

/// The compute share Tessera starts from (calibrated on the HPA baseline's latency at a whole GPU): a model with
/// too few requests keeps the whole GPU (missing data never shrinks it); a steadily served one with latency room
/// gets less than a GPU, and an inter-token objective can only raise that share.
#[test]
fn compute_share_follows_latency_evidence_not_busy_time() {
    let initial = |m: ModelSetup, arrivals: Vec<Arrival>| {
        let sc = scenario(vec![m], vec![arrivals], 1200.0);
        let r = run(&sc);
        let t = r.strategy("tessera").unwrap().clone();
        (t.models[0].initial_recommendation.expect("calibrated").1, t)
    };
    // Five requests in twenty minutes: not enough TTFT observations to shrink.
    let (idle, _) = initial(model("m", 1, 1), at(&[0.0, 10.0, 20.0, 30.0, 40.0]));
    assert_eq!(idle, 1.0);
    // One request every two seconds for twenty minutes, 100 tokens in, 10 out, 5 s TTFT objective.
    let steady: Vec<f64> = (0..600).map(|i| 2.0 * f64::from(i)).collect();
    let (ttft_only, t) = initial(model("m", 1, 1), at(&steady));
    assert!((0.05..1.0).contains(&ttft_only), "{ttft_only}");
    assert_eq!(t.slo_attainment, 1.0, "a smaller share still meets the objective");
    let mut with_itl = model("m", 1, 1);
    with_itl.slo_itl = Some(0.1);
    let (itl, t) = initial(with_itl, at(&steady));
    assert!(
        itl >= ttft_only && itl < 1.0,
        "ITL objective {itl} vs TTFT only {ttft_only}"
    );
    assert_eq!(t.slo_attainment, 1.0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Whatever the traffic: every request is accounted for, every strategy processes the same arrivals in the
    /// same order, and no strategy holds more GPUs than its replicas could.
    #[test]
    fn invariants_hold(
        times_a in proptest::collection::vec(0.0f64..300.0, 0..40),
        times_b in proptest::collection::vec(0.0f64..300.0, 1..40),
        prompt in 1u32..3000,
        output in 1u32..400,
    ) {
        let mk = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v.into_iter().map(|t| Arrival { at: t, prompt_tokens: prompt, output_tokens: output }).collect::<Vec<_>>()
        };
        let sc = scenario(vec![model("a", 0, 2), model("b", 1, 2)], vec![mk(times_a), mk(times_b)], 300.0);
        let r = run(&sc);
        let digest = &r.strategies[0].arrival_digest;
        for s in &r.strategies {
            prop_assert_eq!(s.completed + s.failed, s.requests, "{}", &s.strategy);
            prop_assert_eq!(&s.arrival_digest, digest);
            prop_assert!(s.slo_attainment >= 0.0 && s.slo_attainment <= 1.0);
            // At most max_replicas per model plus one surge (a make-before-break move: a roll, consolidation, or
            // isolation at the ceiling, whose new replica goes to a GPU of its own), one GPU each at worst; the GPU
            // count never exceeds that. (Found by this test: two isolated models at their ceiling of 2 held 5.)
            let most: u32 = sc.models.iter().map(|m| m.max_replicas + 1).sum();
            prop_assert!(s.gpus_peak <= most, "{} peak {} over {most}", &s.strategy, s.gpus_peak);
            prop_assert!(s.gpu_hours <= f64::from(most) * 300.0 / 3600.0 + 1e-9);
        }
        let st = r.strategy("static").unwrap();
        let replicas: u32 = r.static_sizing.iter().map(|z| z.replicas).sum();
        prop_assert!((st.gpu_hours - f64::from(replicas) * 300.0 / 3600.0).abs() < 1e-9);
        // Memory never over-reserved: a GPU's tenants fit in it.
        for s in &r.strategies {
            prop_assert!(s.memory_reserved_ratio <= 1.0 + 1e-9, "{} {}", &s.strategy, s.memory_reserved_ratio);
            // The memory each model reserved fits in what was held (sampled once per scrape interval, so within
            // one interval of the peak).
            let reserved: f64 = s.models.iter().map(|m| m.memory_gpu_hours).sum();
            let slack = f64::from(s.gpus_peak) * sc.settings.scrape_interval.as_secs_f64() / 3600.0;
            prop_assert!(reserved <= s.gpu_hours + slack + 1e-9, "{} {reserved} {}", &s.strategy, s.gpu_hours);
            // Nor compute beyond what the pool hands out: the packer never over-commits a GPU's shares.
            prop_assert!(
                s.compute_allocated_ratio <= r.compute_oversubscription + 1e-9,
                "{} {}",
                &s.strategy,
                s.compute_allocated_ratio
            );
        }
    }
}

/// As vLLM 0.32's API: a trace row whose prompt and output exceed `max_model_len` runs with its output capped at
/// what the prompt leaves; only a prompt that fills the context fails.
#[test]
fn requests_longer_than_the_context_are_capped_not_refused() {
    let row = |at: f64, prompt_tokens: u32, output_tokens: u32| Arrival {
        at,
        prompt_tokens,
        output_tokens,
    };
    // max_model_len 16,384: 16,000 + 1,000 runs with 384 output tokens; 16,384 + 10 is refused.
    let sc = scenario(
        vec![model("m", 1, 1)],
        vec![vec![row(1.0, 16_000, 1_000), row(2.0, 16_384, 10)]],
        600.0,
    );
    let t = run(&sc).strategy("static").unwrap().clone();
    assert_eq!((t.completed, t.failed), (1, 1));
}

/// A client gives up on a request that has waited `request_timeout` for its first token, wherever it waits: 300
/// prompts of 2,000 tokens at once on one replica queue in its vLLM for about a minute, so with a 20 s client
/// timeout the last of them fail (vLLM aborts them) instead of reporting a TTFT no client would have waited for.
/// Before clients gave up, every one of them completed, the slowest with a TTFT near a minute.
#[test]
fn clients_give_up_on_a_first_token_after_the_request_timeout() {
    let burst: Vec<Arrival> = (0..300)
        .map(|i| Arrival {
            at: 1.0 + f64::from(i) * 0.001,
            prompt_tokens: 2_000,
            output_tokens: 20,
        })
        .collect();
    let mut sc = scenario(vec![model("m", 1, 1)], vec![burst], 300.0);
    sc.settings.request_timeout = Duration::from_secs(20);
    let r = simulate_strategies(&sc, &[StrategyKind::Static], Extras::NONE, &mut |_, _| {}).unwrap();
    let t = r.strategy("static").unwrap();
    assert_eq!(t.requests, 300);
    assert!(t.failed > 50, "the burst's tail gives up: {} failed", t.failed);
    assert_eq!(t.completed + t.failed, 300);
    let p99 = t.ttft_p99.unwrap();
    assert!(
        p99 <= 20.0,
        "no first token comes after its client left: p99 {p99}"
    );
    assert!(t.slo_attainment < 1.0 - t.failed as f64 / 300.0 + 1e-9);
}

/// The ideal latencies of the tests' 100-token prompts on the 8B model (A100-80GB, vLLM defaults), by hand from
/// the bound's roofline: a weights read (14.96 GiB at 2.039e12 B/s × 0.8 = 9.85 ms) beats the prefill's compute
/// (2 × 8.03e9 × 100 / (312e12 × 0.6) = 8.58 ms), so the prefill is one read, and each further output token
/// another. Returns (prefill, ideal latency) for `output` tokens.
fn ideal_of_100_token_prompt(output: u32) -> (f64, f64) {
    let read = 14.96 * GIB as f64 / (2.039e12 * 0.8);
    (read, read * f64::from(output))
}

/// The cold-start bound, by hand. The model starts in 20 s (pod) + 14.96 GiB at the default load bandwidth and its
/// objective is 5 s: a request meeting it was admitted by `at + 5 s − prefill`, on a replica that began to start a
/// cold start before that, and stays until `at + ideal` at least. Each request forces `cold start − 5 s + prefill +
/// ideal` seconds of one GPU; two requests 100 s apart force two such windows, two requests 1 s apart one window
/// one second longer. With free cold starts a 10-token answer forces nothing: it can be served anywhere in its
/// objective.
#[test]
fn the_cold_start_bound_charges_the_lead_before_each_arrival() {
    let m = model("m", 0, 1);
    let (prefill, ideal) = ideal_of_100_token_prompt(10);
    let window = m.cold_start_secs(&StrategySettings::default()) - m.slo_ttft + prefill + ideal;
    assert!(window > 20.0, "{window}");
    let apart = scenario(vec![m.clone()], vec![at(&[200.0, 300.0])], 600.0);
    let b = bound::lower_bounds(&apart, 1.0);
    assert_eq!(b.free, 0.0);
    assert!(
        (b.cold_starts * 3600.0 - 2.0 * window).abs() < 1e-6,
        "{b:?} {window}"
    );
    assert_eq!(b.at_attainment, b.cold_starts);
    // Excusing one of two apart requests (a 50% goal) takes back exactly the window it alone needed.
    let half = bound::lower_bounds(&apart, 0.5).at_attainment;
    assert!((half * 3600.0 - window).abs() < 1e-6, "{half} {window}");

    let close = scenario(vec![m.clone()], vec![at(&[200.0, 201.0])], 600.0);
    let b = bound::lower_bounds(&close, 1.0);
    assert!(
        (b.cold_starts * 3600.0 - (window + 1.0)).abs() < 1e-6,
        "{b:?} {window}"
    );
    // Excusing one of the two close ones frees an instant only where that one alone covers it: one second at each
    // end costs a second of its window each; the rest is covered twice, so its remaining `window − 2` seconds
    // free half as much. What is left: `window + 1 − (2 + (window − 2) / 2) = window / 2`.
    let half = bound::lower_bounds(&close, 0.5).at_attainment;
    assert!((half * 3600.0 - window / 2.0).abs() < 1e-6, "{half} {window}");

    // A model whose cold start fits in its objective with time to spare is charged nothing.
    let quick = ModelSetup { slo_ttft: 600.0, ..m };
    let sc = scenario(vec![quick], vec![at(&[200.0, 300.0])], 600.0);
    let b = bound::lower_bounds(&sc, 1.0);
    assert_eq!((b.free, b.cold_starts), (0.0, 0.0));
}

/// What 1% of requests may excuse depends on how much else covers them: one request out of a hundred that
/// overlap one another frees almost nothing; one lone request of a hundred frees its whole window.
#[test]
fn excusing_a_request_frees_only_what_it_alone_covers() {
    let m = model("m", 0, 1);
    let (prefill, ideal) = ideal_of_100_token_prompt(10);
    let window = m.cold_start_secs(&StrategySettings::default()) - m.slo_ttft + prefill + ideal;
    // A hundred arrivals 0.1 s apart: one window of `window + 9.9` seconds, its middle covered by all hundred.
    let dense: Vec<f64> = (0..100).map(|i| 100.0 + f64::from(i) * 0.1).collect();
    let b = bound::lower_bounds(&scenario(vec![m.clone()], vec![at(&dense)], 600.0), 0.99);
    assert!((b.cold_starts * 3600.0 - (window + 9.9)).abs() < 1e-6, "{b:?}");
    // One excused request's window (the budget) buys the 0.1 s at each end covered once (0.2 s for 0.2 s of
    // budget), then the 0.1 s at each end covered twice (0.2 s for 0.4 s), …: `n` levels cost 0.1·n(n+1) seconds
    // and free 0.2·n, so about 2.9 s of a 23 s window, where subtracting the request's whole window would free it
    // all.
    let freed = (b.cold_starts - b.at_attainment) * 3600.0;
    let levels = ((1.0 + 40.0 * window).sqrt() - 1.0) / 2.0;
    assert!(
        (freed - 0.2 * levels).abs() < 0.01,
        "{freed} of a {window} s window"
    );
    // A hundred arrivals a minute apart: each alone in its window, so one excused frees one whole window.
    let sparse: Vec<f64> = (0..100).map(|i| 40.0 + f64::from(i) * 60.0).collect();
    let b = bound::lower_bounds(&scenario(vec![m], vec![at(&sparse)], 6_100.0), 0.99);
    let freed = (b.cold_starts - b.at_attainment) * 3600.0;
    assert!((freed - window).abs() < 1e-6, "{freed} {window}");
}

/// Where the GPU-hours go, by hand. Static holds one whole GPU for the 900 s run and vLLM reserves 0.9 of its
/// memory: 0.225 of the 0.25 GPU-hours are the model's, the rest held with no replica's memory in it. Three
/// 1,000-token answers force their model's weights and smallest cache over each one's latest admission to its
/// ideal end: that, in one GPU's usable memory, is the model's share of the first bound.
#[test]
fn the_report_says_where_the_gpu_hours_go() {
    let m = model("m", 1, 1);
    let (prefill, ideal) = ideal_of_100_token_prompt(1_000);
    let forced = ideal - (m.slo_ttft - prefill);
    let long = [100.0, 400.0, 700.0].map(|at| Arrival {
        at,
        prompt_tokens: 100,
        output_tokens: 1_000,
    });
    let smallest = m.spec.weights_bytes + m.spec.overhead_bytes + 16_384 * m.spec.bytes_per_kv_token;
    let sc = scenario(vec![m], vec![long.to_vec()], 900.0);
    let usable = sc.gpu.memory_bytes as f64 - sc.settings.gpu_headroom_mib as f64 * 1_048_576.0;
    let want = 3.0 * forced * smallest as f64 / usable / 3600.0;
    assert!(
        (bound::lower_bounds(&sc, 1.0).forced_memory[0] - want).abs() < 1e-9,
        "{want}"
    );
    let r = run(&sc);
    let st = r.strategy("static").unwrap();
    assert!(
        (st.models[0].memory_gpu_hours - 0.9 * 900.0 / 3600.0).abs() < 1e-9,
        "{:?}",
        st.models[0]
    );
    let said = r.where_memory_goes(st);
    assert!(
        said.contains(&format!("m {:.2} ({want:.2})", st.models[0].memory_gpu_hours)),
        "{said}"
    );
    assert!(said.ends_with("the empty-GPU grace): 0.03."), "{said}");
    assert!(super::html::render(&r).contains("the empty-GPU grace): 0.03."));
}

/// vLLM starts no engine whose KV cache cannot hold one `max_model_len` request, so a resident model holds at
/// least that much cache however little is in flight. Four 8B models with one request each at the same instant,
/// long enough (1,000 output tokens) that some of it is forced with free cold starts too: at a 1,024-token
/// context their weights and caches fit one GPU; at 131,072 tokens each cache is 16 GiB, so the four need two
/// GPUs for the same interval — exactly twice the bound.
#[test]
fn the_bound_counts_the_kv_cache_a_max_model_len_request_needs() {
    let bound_at = |len: u32| {
        let models = (0..4)
            .map(|i| ModelSetup {
                max_model_len: Some(len),
                ..model(&format!("m{i}"), 0, 1)
            })
            .collect();
        let long = || {
            vec![Arrival {
                at: 10.0,
                prompt_tokens: 100,
                output_tokens: 1_000,
            }]
        };
        let sc = scenario(models, (0..4).map(|_| long()).collect(), 60.0);
        bound::lower_bounds(&sc, 1.0)
    };
    let (short, long) = (bound_at(1_024), bound_at(131_072));
    // With free cold starts, from the latest admission (10 + 5 s − prefill) to the ideal end (10 s + ideal).
    let (prefill, ideal) = ideal_of_100_token_prompt(1_000);
    assert!(
        (short.free * 3600.0 - (ideal - 5.0 + prefill)).abs() < 1e-6,
        "{short:?}"
    );
    assert!((long.free / short.free - 2.0).abs() < 1e-9, "{long:?} {short:?}");
    // Through the cold start: while the four pods start they hold one GPU (their memory is not in it yet), so
    // the long context adds only the second GPU over the same interval the first bound counts.
    assert!(
        ((long.cold_starts - short.cold_starts) - (long.free - short.free)).abs() < 1e-12,
        "{long:?} {short:?}"
    );
}

/// Consolidation (`core::pack::consolidate`): three models at half a GPU each on a pool that hands each GPU out
/// once start on two GPUs (a and b share one, c has the other). b goes to zero after its only request; from then
/// on one GPU could hold a and c. After the settle time the pool drains one of the two GPUs: its replica is
/// surged onto the other, the old copy retired once the new one is ready, and the emptied GPU is released after
/// the grace. Every request still meets its objective, and fewer GPU-hours are held than with consolidation off.
#[test]
fn consolidation_moves_a_replica_and_releases_the_gpu() {
    let mut models = Vec::new();
    for (name, min) in [("a", 1), ("b", 0), ("c", 1)] {
        let mut m = model(name, min, 1);
        m.slo_ttft = 60.0;
        m.compute_fraction = ComputeFraction::Fixed(0.5);
        models.push(m);
    }
    let steady: Vec<f64> = (0..120).map(|i| f64::from(i) * 30.0).collect();
    let mut sc = scenario(models, vec![at(&steady), at(&[0.0]), at(&steady)], 3600.0);
    sc.settings.compute_oversubscription = Some(1.0);
    let on = run(&sc);
    let t = on.strategy("tessera").unwrap();
    let c = t.consolidation.unwrap();
    assert_eq!((c.drains, c.drained, c.cancelled, c.moves), (1, 1, 0, 1), "{c:?}");
    assert_eq!(t.failed, 0);
    assert!((t.slo_attainment - 1.0).abs() < 1e-12, "{}", t.slo_attainment);
    sc.settings.consolidation = false;
    let off = run(&sc);
    let o = off.strategy("tessera").unwrap();
    assert_eq!(o.consolidation.unwrap().drains, 0);
    // Off: two GPUs all hour. On: one of them goes about settle + a cold start + the grace after b left.
    assert!((o.gpu_hours - 2.0).abs() < 0.01, "{}", o.gpu_hours);
    let saved = o.gpu_hours - t.gpu_hours;
    assert!(saved > 0.7, "on {} off {}", t.gpu_hours, o.gpu_hours);
}

/// A replica started on a small compute share whose TTFT goes over the objective: the share rule asks for more,
/// and under `updateMode: Recreate` the controller's rollout rule (`core::rollout`) brings the growth into force
/// at once and rolls the running replica onto it (an urgent growth), make-before-break; under `initial` the
/// growth still reaches new pods at once, but the running replica keeps its share.
#[test]
fn a_replica_over_the_ttft_objective_on_a_smaller_share_is_rolled_at_once() {
    use super::scenario::UpdateMode;
    use super::world::{Plan, World, calibrate};
    let mut m = model("m", 1, 1);
    m.slo_ttft = 1.0;
    // A 2,000-token prompt every second: 0.17 s of prefill on a whole A100, 1.7 s on a tenth of it.
    let arrivals: Vec<Arrival> = (0..1800)
        .map(|i| Arrival {
            at: f64::from(i),
            prompt_tokens: 2000,
            output_tokens: 20,
        })
        .collect();
    let mut sc = scenario(vec![m], vec![arrivals], 1800.0);
    sc.settings.update_mode = UpdateMode::Recreate;
    let hpa = World::new(&sc, Plan::starting_from(StrategyKind::Hpa, Vec::new()))
        .unwrap()
        .run(&mut |_| {})
        .unwrap();
    let mut initial = calibrate(&sc, &hpa.histories);
    // The share a quiet week would have recommended: a tenth of the GPU.
    initial[0].as_mut().expect("calibrated").compute_fraction = 0.1;
    let tessera = |sc: &Scenario| {
        World::new(sc, Plan::starting_from(StrategyKind::Tessera, initial.clone()))
            .unwrap()
            .run(&mut |_| {})
            .unwrap()
            .report
    };
    let recreate = tessera(&sc);
    let r = recreate.rollouts.clone().unwrap();
    assert!(r.rolls.get("urgent_growth").copied().unwrap_or(0) >= 1, "{r:?}");
    assert!(r.replaced >= 1, "{r:?}");
    assert!(
        !r.rolls.contains_key("grow"),
        "nothing waited for the 30 min window: {r:?}"
    );
    let grown = recreate.models[0].compute_fraction;
    assert!(grown > 0.1 * 1.15, "the growth came into force: {grown}");
    sc.settings.update_mode = UpdateMode::Initial;
    let initial_mode = tessera(&sc);
    let i = initial_mode.rollouts.clone().unwrap();
    assert!(i.rolls.is_empty() && i.replaced == 0, "{i:?}");
    assert!(
        initial_mode.models[0].compute_fraction > 0.1 * 1.15,
        "new pods still get the urgent growth"
    );
    // The report names what Initial left behind, and Recreate leaves it behind for less of the run.
    let behind = |r: &super::report::StrategyReport| r.models[0].behind_while_urgent.unwrap_or(0.0);
    assert!(behind(&initial_mode) > 0.0, "{:?}", initial_mode.models[0]);
    assert!(
        behind(&recreate) < behind(&initial_mode),
        "{} vs {}",
        behind(&recreate),
        behind(&initial_mode)
    );
    // The one replica kept its tenth of the GPU for the whole run.
    assert!(
        recreate.models[0].slo_attainment > initial_mode.models[0].slo_attainment,
        "recreate {} vs initial {}",
        recreate.models[0].slo_attainment,
        initial_mode.models[0].slo_attainment
    );
}

/// At the ceiling, buy isolation (`scenarios/ceiling-bursty.yaml`): a bursty 14B model held at `max_replicas: 4`
/// while sharing GPUs keeps at least the attainment of the same four replicas on whole GPUs (a static run holding
/// every model at its `max_replicas`), because Tessera gives it whole GPUs once its TTFT is over the objective at
/// its ceiling.
#[test]
fn at_the_ceiling_a_shared_model_buys_isolation() {
    use super::world::{Plan, World};
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/ceiling-bursty.yaml");
    let sc = super::scenario::load(&super::scenario::Source::File(path), None, None).unwrap();
    let r = simulate_strategies(&sc, &[StrategyKind::Tessera], Extras::NONE, &mut |_, _| {}).unwrap();
    let whole = Plan::fixed(sc.models.iter().map(|m| m.max_replicas).collect());
    let w = World::new(&sc, whole).unwrap().run(&mut |_| {}).unwrap();
    let st = w.report.models.iter().find(|m| m.model == "burst-14b").unwrap();
    let tessera = r.strategy("tessera").unwrap();
    let t = tessera.models.iter().find(|m| m.model == "burst-14b").unwrap();
    println!(
        "burst-14b: four whole GPUs attainment {:.4} (p95 {:?}); tessera max {} replicas, attainment {:.4} (p95 {:?}), \
         share {:.2}, isolated {:?}, cold starts {}, held by {:?}; tessera {:.2} GPU-hours vs {:.2} for every model at \
         its maximum on whole GPUs",
        st.slo_attainment,
        st.ttft_p95,
        t.replicas_max,
        t.slo_attainment,
        t.ttft_p95,
        t.compute_fraction,
        t.isolated,
        t.cold_starts,
        t.held_by,
        tessera.gpu_hours,
        w.report.gpu_hours
    );
    assert_eq!(st.replicas_max, 4);
    assert!(t.replicas_max >= 4, "tessera reached its ceiling");
    assert!(
        t.slo_attainment >= st.slo_attainment,
        "tessera {:.4} vs four whole GPUs {:.4}",
        t.slo_attainment,
        st.slo_attainment
    );
}

/// The isolation rule inside the simulator: a model held at its ceiling (`min = max = 2`) whose prompt bursts
/// meet a busy co-tenant's prefills on shared GPUs goes over its TTFT objective; Tessera then places its
/// replicas alone (`core::scale::isolation`). The rule reacts to a measured breach, so the burst that reveals it
/// is lost (the first one, 16 of 480 requests): after that the model keeps two whole GPUs' attainment, so over
/// the run it is within one burst of it.
#[test]
fn isolation_fires_at_the_ceiling_and_recovers_whole_gpu_attainment() {
    use super::world::{Plan, World};
    let long = |at: f64, prompt: u32| Arrival {
        at,
        prompt_tokens: prompt,
        output_tokens: 20,
    };
    let mut hot = model("hot", 2, 2);
    hot.slo_ttft = 3.0;
    let mut busy = model("busy", 1, 1);
    busy.slo_ttft = 10.0;
    // Bursts of 16 prompts of 3,000 tokens every minute for the hot model; a steady 2,000-token prompt every
    // second for its neighbour.
    let bursts: Vec<Arrival> = (0..30)
        .flat_map(|k| (0..16).map(move |i| long(30.0 + 60.0 * f64::from(k) + 0.01 * f64::from(i), 3000)))
        .collect();
    let steady: Vec<Arrival> = (0..1800).map(|i| long(f64::from(i), 2000)).collect();
    let sc = scenario(vec![hot, busy], vec![bursts, steady], 1800.0);
    let r = simulate_strategies(&sc, &[StrategyKind::Tessera], Extras::NONE, &mut |_, _| {}).unwrap();
    let whole = Plan::fixed(vec![2, 1]);
    let w = World::new(&sc, whole).unwrap().run(&mut |_| {}).unwrap();
    let st = &w.report.models[0];
    let t = &r.strategy("tessera").unwrap().models[0];
    println!(
        "hot: two whole GPUs {:.4} (p95 {:?}); tessera {:.4} (p95 {:?}), isolated {:?}, share {:.2}",
        st.slo_attainment, st.ttft_p95, t.slo_attainment, t.ttft_p95, t.isolated, t.compute_fraction
    );
    // Its shared replicas were replaced make-before-break, each new pod started before the one it replaced left:
    // that is a surge, counted apart, so "at most" stays within `max_replicas` (it read 3 for a ceiling of 2).
    assert_eq!(t.replicas_max, 2, "at most its maxReplicas by decision");
    assert!(t.surge_max >= 1, "the replacements surged: {}", t.surge_max);
    assert!(t.replicas_mean_max().ends_with(&format!("/2+{}", t.surge_max)));
    let (share, began) = t.isolated.unwrap();
    assert!(
        began == 1 && share > 0.9,
        "isolated once, early, and for good: {:?}",
        t.isolated
    );
    assert!(
        t.slo_attainment >= st.slo_attainment - 16.0 / 480.0,
        "{} vs {}",
        t.slo_attainment,
        st.slo_attainment
    );
}

/// Batch jobs, every way: every line is answered once and the job meets its deadline; the paced way answers
/// lines in the interactive replica's spare room; a spot reclaim sends its lines in flight again and still loses
/// none; the dedicated pool is billed all day.
#[test]
fn batch_jobs_every_way_answer_every_line_by_the_deadline() {
    use super::batch_jobs::{BatchFile, CapacityFile, JobFile};
    use super::world::{BatchMode, BatchPlan};
    let mut sc = scenario(
        vec![model("chat", 1, 2)],
        vec![at(&(0..600).map(|i| f64::from(i) * 2.0).collect::<Vec<_>>())],
        1800.0,
    );
    let file = BatchFile {
        capacity: vec![
            CapacityFile {
                name: "spot".into(),
                price_per_gpu_hour: 2.0,
                interruptible: true,
                available: 2,
                reclaims_per_hour: 60.0,
                back_after: Duration::from_secs(60),
            },
            CapacityFile {
                name: "on-demand".into(),
                price_per_gpu_hour: 5.0,
                interruptible: false,
                available: 4,
                reclaims_per_hour: 0.0,
                back_after: Duration::from_secs(60),
            },
        ],
        jobs: vec![JobFile {
            name: "eval".into(),
            model: "chat".into(),
            submit_at: Duration::from_secs(60),
            lines: 8_000,
            prompt_tokens: 500,
            output_tokens: 100,
            completion_window: Duration::from_secs(1_200),
        }],
        margin: 0.1,
    };
    let names = vec!["chat".to_owned()];
    assert_eq!(
        file.validate(&names, Duration::from_secs(1800)),
        Vec::<String>::new()
    );
    sc.batch = Some(file.resolve(&names));
    let run = |mode, interactive| {
        let plan = Plan {
            kind: StrategyKind::Tessera,
            static_replicas: Vec::new(),
            initial_recommendations: Vec::new(),
            only_models: Vec::new(),
            batch: Some(BatchPlan { mode, interactive }),
        };
        world::World::new(&sc, plan).unwrap().run(&mut |_| {}).unwrap()
    };
    let paced = run(BatchMode::Paced, true);
    let b = paced.batch.as_ref().unwrap();
    let j = &b.jobs[0];
    assert_eq!((j.done, j.on_spare + j.on_own), (8_000, 8_000), "{b:?}");
    assert!(j.met() && j.on_spare > 0, "{b:?}");
    // Batch lines never count as interactive requests.
    assert_eq!(paced.report.requests, 600);
    let spot = run(BatchMode::GreedySpot, false).batch.unwrap();
    assert!(spot.reclaims > 0 && spot.jobs[0].resent > 0, "{spot:?}");
    assert_eq!(spot.jobs[0].on_spare, 0);
    assert_eq!(spot.jobs[0].done, 8_000, "{spot:?}");
    assert!(spot.own.iter().all(|o| o.0 == "spot"), "{spot:?}");
    let submit = run(BatchMode::AtSubmit, false).batch.unwrap();
    assert!(
        submit.jobs[0].met() && submit.own.iter().all(|o| o.0 == "on-demand"),
        "{submit:?}"
    );
    let pool = run(BatchMode::Dedicated(2), false).batch.unwrap();
    assert!(pool.jobs[0].met(), "{pool:?}");
    assert!((pool.gpu_hours() - 2.0 * 0.5).abs() < 1e-9, "{pool:?}");
}

/// The progress bar of a single run: strategies report side by side (and the static sizing's trial runs each
/// start again from 0), yet the one overall position only moves forward and ends at the duration once per run.
#[test]
fn the_overall_progress_only_moves_forward() {
    let sc = scenario(
        vec![model("a", 1, 2)],
        vec![at(&[1.0, 11.0, 21.0, 31.0, 41.0])],
        60.0,
    );
    let mut overall = Overall::new(&sc, &[]);
    assert_eq!(overall.len(), 60.0 * StrategyKind::ALL.len() as f64);
    let mut positions = Vec::new();
    simulate(&sc, &mut |phase, t| positions.push(overall.advance(phase, t))).unwrap();
    assert!(!positions.is_empty());
    assert!(
        positions.windows(2).all(|w| w[1] >= w[0]),
        "the bar ran backwards: {positions:?}"
    );
    assert!(*positions.last().unwrap() <= overall.len());
    // Interleaved reports from two runs, one of them late with an earlier time, and a sizing trial from 0.
    let mut o = Overall::new(&sc, &[StrategyKind::Hpa, StrategyKind::Tessera]);
    assert_eq!(o.len(), 120.0);
    let seq = [
        (Phase::StaticSizing, 50.0),
        (Phase::Strategy(StrategyKind::Hpa), 30.0),
        (Phase::Strategy(StrategyKind::Tessera), 10.0),
        (Phase::Strategy(StrategyKind::Hpa), 20.0),
        (Phase::StaticSizing, 0.0),
        (Phase::Strategy(StrategyKind::Tessera), 60.0),
        (Phase::Strategy(StrategyKind::Hpa), 60.0),
    ];
    let got: Vec<f64> = seq.iter().map(|&(p, t)| o.advance(p, t)).collect();
    assert_eq!(got, vec![0.0, 30.0, 40.0, 40.0, 40.0, 90.0, 120.0]);
}
