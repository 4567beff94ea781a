//! Latency of `/ui` with 50 models and 20 shared GPUs of state and a full 24 h history, side by side with
//! `/metrics`, over loopback HTTP. Run: `cargo run --release -p tessera-autoscaler --example ui_bench`
//! (results in docs/performance.md).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_autoscaler::controller::metrics::Metrics;
use tessera_autoscaler::ui::view::{
    DecisionNote, GpuObservation, ModelObservation, Replicas, RunningWith, Settings, Sharing, Signals,
    TenantObservation,
};
use tessera_autoscaler::ui::{Store, now_ms};
use tessera_core::recommend::{Recommendation, Source};
use tessera_core::scale::ScaleReason;
use tessera_core::workload::{ClassInput, classify};

const MODELS: usize = 50;
const GPUS: usize = 20;
const REQUESTS: usize = 1000;

fn model(i: usize, at_ms: u64) -> ModelObservation {
    let replicas = 1 + (i % 4) as u32;
    ModelObservation {
        namespace: format!("team-{}", i % 5),
        name: format!("model-{i:02}"),
        target: format!("Deployment/model-{i:02}"),
        replicas: Replicas {
            current: replicas,
            ready: replicas,
            desired: replicas + u32::from(i.is_multiple_of(7)),
            min: Some(1),
            max: Some(8),
        },
        reporting: replicas,
        signals: Signals {
            kv_cache_usage: Some((i % 10) as f64 / 10.0),
            waiting: Some((i % 3) as f64),
            running: Some(4.0),
            requests_per_second: Some(1.5 * i as f64),
            generation_tokens_per_second: Some(100.0),
            ttft_p95: Some(0.1 + (i % 5) as f64 * 0.2),
            itl_p95: Some(0.02),
            ttft_slo: Some(0.5),
            itl_slo: Some(0.05),
            preemptions: Some(0.0),
            prefix_cache_hit_ratio: Some((i % 10) as f64 / 10.0),
            prefill_p50: Some(0.05),
            prefill_p95: Some(0.12),
            decode_p50: Some(1.5),
            decode_p95: Some(4.0),
            active_ratio: Some(if i.is_multiple_of(3) { 0.2 } else { 0.9 }),
        },
        leading_signal: Some("kvCacheUtilization".into()),
        constraint: Some("ttft_target".into()),
        recommendation: Some(Recommendation {
            kv_cache_memory_bytes: (2 + (i % 8) as u64) << 30,
            kv_cache_tokens: 100_000,
            gpu_memory_utilization: 0.3,
            gpu_memory_mib: 8000 + 1000 * (i % 20) as u64,
            compute_fraction: 0.1 + (i % 6) as f64 * 0.1,
            bytes_per_kv_token: 131_072,
            bytes_per_kv_token_source: Source::Configured,
            non_kv_bytes: 16 << 30,
            non_kv_source: Source::VllmBudgetRule,
            reasons: Vec::new(),
        }),
        no_recommendation_reason: None,
        running: RunningWith {
            gpu_memory_utilization: Some(0.9),
            kv_cache_memory_bytes: None,
            compute_share: Some(if i.is_multiple_of(2) { 1.0 } else { 0.5 }),
        },
        gpu_memory_mib: Some(81920),
        measured_memory_mib: None,
        measured_sm: None,
        sharing: if i.is_multiple_of(2) {
            Sharing::Whole
        } else {
            Sharing::Fractional
        },
        update_mode: Some("Off".into()),
        workload_class: Some(classify(&ClassInput {
            active_ratio: Some(if i.is_multiple_of(3) { 0.2 } else { 0.9 }),
            ttft_objective_secs: Some(0.5),
            itl_objective_secs: None,
        })),
        decisions: (0..5)
            .map(|d| DecisionNote {
                at_ms: at_ms - d * 60_000,
                from: replicas,
                to: replicas + 1,
                reason: format!("scale_up_{d}"),
                message: "kvCacheUtilization 0.8 over target 0.6 on 2 replicas asks for 3".into(),
            })
            .collect(),
    }
}

fn gpu(i: usize) -> GpuObservation {
    GpuObservation {
        pool: "a100".into(),
        capacity_pod: format!("tessera-capacity-a100-{i}"),
        node: Some(format!("node-{}", i / 4)),
        uuid: Some(format!("GPU-{i:08x}-0000-0000-0000-000000000000")),
        memory_mib: 81920,
        compute_milli: 2000,
        tenants: (0..3)
            .map(|t| TenantObservation {
                pod: format!("model-{:02}-{t}", (i * 3 + t) % MODELS),
                model: format!("team-0/model-{:02}", (i * 3 + t) % MODELS),
                compute_milli: 250,
                memory_mib: 20000,
                measured_memory_mib: Some(18000),
                measured_sm: Some(0.3),
            })
            .collect(),
        startup_lease_holder: None,
        draining_since: None,
    }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1000.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let now = now_ms();
    let day_ago = now - 24 * 3600 * 1000;
    let store = Arc::new(Store::new(
        Settings::default(),
        false,
        day_ago,
        Duration::from_secs(3 * 86400),
    ));
    // A full day of history: one record a minute.
    let fill = Instant::now();
    for minute in 0..1440u64 {
        let t = day_ago + minute * 60_000;
        for i in 0..MODELS {
            store.observe_model(model(i, t), t);
        }
        store.set_gpus((0..GPUS).map(gpu).collect());
        store.record(t);
    }
    for i in 0..MODELS {
        store.observe_model(model(i, now), now);
    }
    eprintln!("filled 24 h of history in {:.1} s", fill.elapsed().as_secs_f64());

    // In-process cost of one page (snapshot, view with packing, history, HTML), no HTTP.
    for _ in 0..3 {
        let t = Instant::now();
        let v = tessera_autoscaler::ui::view::view(&store.snapshot(now), &Settings::default());
        let view_ms = t.elapsed().as_secs_f64() * 1000.0;
        let t = Instant::now();
        let page = store.page(now);
        eprintln!(
            "view {view_ms:.2} ms ({} GPUs needed of {}); whole page {:.2} ms, {} bytes",
            v.overview.gpus_needed,
            v.overview.gpus_held,
            t.elapsed().as_secs_f64() * 1000.0,
            page.len()
        );
    }
    let metrics = Arc::new(Metrics::new());
    for r in [
        ScaleReason::ScaleUp,
        ScaleReason::ScaleDown,
        ScaleReason::InvalidPolicy,
    ] {
        for _ in 0..MODELS {
            metrics.decision(r);
        }
    }
    metrics.reconcile_took(0.01);
    let app = metrics
        .router()
        .merge(tessera_autoscaler::ui::router(store.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });

    let client = reqwest::Client::new();
    for path in ["/ui", "/metrics"] {
        let url = format!("http://{addr}{path}");
        let fetch = || async {
            client
                .get(&url)
                .send()
                .await
                .expect("GET")
                .bytes()
                .await
                .expect("body")
        };
        let mut bytes = 0;
        for _ in 0..20 {
            bytes = fetch().await.len();
        }
        let mut took = Vec::with_capacity(REQUESTS);
        for _ in 0..REQUESTS {
            let t = Instant::now();
            let body = fetch().await;
            took.push(t.elapsed());
            assert!(!body.is_empty());
        }
        took.sort();
        println!(
            "{path:9} {REQUESTS} sequential requests, {bytes} bytes: p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            percentile(&took, 0.50),
            percentile(&took, 0.95),
            percentile(&took, 0.99),
            percentile(&took, 1.0)
        );
    }
    // UI_BENCH_SERVE=SECONDS keeps serving the synthetic state that long (for a screenshot of a busy cluster).
    if let Some(secs) = std::env::var("UI_BENCH_SERVE")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        println!("serving http://{addr}/ui for {secs} s");
        tokio::time::sleep(Duration::from_secs(secs)).await;
    }
    let snap = store.snapshot(now_ms());
    println!(
        "state: {} models, {} GPUs, 1440 history points a series, history {:.1} MiB",
        snap.models.len(),
        snap.gpus.len(),
        store.history_bytes() as f64 / (1024.0 * 1024.0)
    );
}
