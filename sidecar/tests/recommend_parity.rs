//! The sidecar and the simulator recommend alike from the same scrapes.
//!
//! The simulator runs the default scenario with Tessera and records, for a sample of its replicas'
//! recommendations, every `/metrics` page the replica's sidecar would have scraped (the emulator's rendering of the
//! simulated engine), the GPU reading it would have had, and what the simulator recommended. Each record is then
//! replayed through the sidecar's own parser ([`VllmSnapshot::from_text`]) and state ([`State`]), started with the
//! flags the webhook would give it: the sidecar must recommend the same memory and compute share for the same
//! reasons, or say "not yet" alike. The replica-count path has its parity test in the controller
//! (`autoscaler/src/controller/sim_parity_tests.rs`); this is the recommendation path's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tessera_core::metrics::VllmSnapshot;
use tessera_core::recommend::Outcome;
use tessera_core::scale::SloPercentile;
use tessera_core::wire::sidecar::Objective;
use tessera_sidecar::gpu::GpuReading;
use tessera_sidecar::state::{Settings, State};
use tessera_sim::simulate::observe::{RecommendationRecord, SidecarSetup};
use tessera_sim::simulate::scenario::{self, Source};
use tessera_sim::simulate::world::{Plan, StrategyKind, World, calibrate};

/// How many recommendations to replay (each one's sidecar is fed its whole window of pages).
const RECORDS: usize = 1_000;

/// The sidecar's settings for a replica, as the webhook writes its flags.
fn settings(s: &SidecarSetup) -> Settings {
    Settings {
        vllm_url: "http://127.0.0.1:8000".into(),
        interval_secs: 1.0,
        window_secs: s.window_secs,
        latency_window_secs: 60.0,
        recommend: s.config,
        bytes_per_kv_token: s.bytes_per_kv_token,
        non_kv_bytes: s.non_kv_bytes,
        max_model_len: s.max_model_len,
        gpu_shared: s.gpu_shared,
        compute_share: s.compute_share,
        ttft_slo_secs: s.ttft_slo_secs,
        itl_slo_secs: s.itl_slo_secs,
        model_dir: None,
        model_dtype: None,
        tensor_parallel_size: 1,
    }
}

/// Replays one record's pages through a fresh sidecar state; returns what it recommends at the last page.
fn replay(r: &RecommendationRecord) -> Outcome {
    let mut st = State::new(settings(&r.sidecar));
    // The objective's percentile is handed over by the controller (not a flag).
    st.set_objective(&Objective {
        ttft_slo_secs: r.sidecar.ttft_slo_secs,
        ttft_slo_percentile: match r.sidecar.ttft_percentile {
            SloPercentile::P95 => 95,
            SloPercentile::P99 => 99,
        },
        itl_slo_secs: r.sidecar.itl_slo_secs,
    });
    for p in &r.pages {
        st.set_gpu(
            "nvml",
            Some(GpuReading {
                total_bytes: r.sidecar.gpu_total_bytes,
                used_bytes: r.sidecar.process_gpu_bytes,
                busy_ratio: p.busy,
            }),
        );
        let snapshot = VllmSnapshot::from_text(&p.text).expect("the emulator's page parses");
        st.record_success(p.at, snapshot);
    }
    st.outcome().clone()
}

/// The part of an outcome both must agree on: the memory and compute recommended and the reasons' codes, or
/// "not yet" and why.
fn essence(o: &Outcome) -> String {
    match o {
        Outcome::Ready(r) => format!(
            "ready kv={} util={:?} mib={} compute={:.2} reasons={:?}",
            r.kv_cache_memory_bytes,
            r.gpu_memory_utilization,
            r.gpu_memory_mib,
            r.compute_fraction,
            r.reasons.iter().map(|x| x.code).collect::<Vec<_>>()
        ),
        Outcome::NotYet { code, .. } => format!("not yet: {code:?}"),
    }
}

#[test]
fn the_sidecar_recommends_what_the_simulator_recommended() {
    let sc = scenario::load(&Source::Default, None, None)
        .unwrap()
        .without_sleep_mode();
    // Started as `tessera simulate` starts Tessera: from the HPA baseline's calibrated allocation.
    let histories = World::new(
        &sc,
        Plan::starting_from(StrategyKind::Hpa, vec![None; sc.models.len()]),
    )
    .unwrap()
    .run(&mut |_| {})
    .unwrap()
    .histories;
    let initial = calibrate(&sc, &histories);
    let run = World::new(&sc, Plan::starting_from(StrategyKind::Tessera, initial))
        .unwrap()
        .recording_recommendations(RECORDS)
        .run(&mut |_| {})
        .unwrap();
    let records = run.recommendations;
    assert!(
        records.len() >= 100,
        "the run made only {} recommendations",
        records.len()
    );
    let (mut ready, mut shared, mut differ) = (0, 0, Vec::new());
    for r in &records {
        let ours = essence(&replay(r));
        let theirs = essence(&r.outcome);
        ready += usize::from(matches!(r.outcome, Outcome::Ready(_)));
        shared += usize::from(r.sidecar.gpu_shared);
        if ours != theirs {
            differ.push(format!(
                "{} at {:.0} s ({} pages{}): sidecar {ours}\n    simulator {theirs}",
                sc.models[r.model].name,
                r.at,
                r.pages.len(),
                if r.sidecar.gpu_shared { ", shared GPU" } else { "" }
            ));
        }
    }
    eprintln!(
        "{} recommendations replayed ({ready} ready, {shared} on shared GPUs), {} differ",
        records.len(),
        differ.len()
    );
    assert!(
        differ.is_empty(),
        "{} of {} recommendations differ; the first:\n{}",
        differ.len(),
        records.len(),
        differ.iter().take(5).cloned().collect::<Vec<_>>().join("\n")
    );
    // The replay must cover both kinds of replica and both outcomes.
    assert!(
        ready > 0 && ready < records.len(),
        "{ready} of {} ready",
        records.len()
    );
    assert!(shared > 0, "no replica on a shared GPU was replayed");
}
