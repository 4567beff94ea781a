//! Offline packing speed and quality on the real Alibaba openb GPU-sharing trace, against first-fit
//! decreasing in the same run; plus the online packer's placement rate and the lower bounds' cost.
//!
//! Run: `cargo bench -p tessera-core --bench pack`. Input: the 3,078 fractional pods (`num_gpu == 1 &&
//! gpu_milli < 1000`) of `../shared/traces/alibaba_gpu_v2023_openb/openb_pod_list_default.csv`, read at run
//! time (the trace's terms forbid copying it into the project). When it is absent the bench says so and uses
//! a synthetic set with the same size distribution shape (a deterministic generator, no trace data).

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use tessera_core::pack::{
    GPU_COMPUTE_MILLI, GpuShape, Packer, ReplicaRequest, lower_bound_l2, lower_bound_lp,
    pack_first_fit_decreasing, pack_offline,
};

const TRACE: &str = "../shared/traces/alibaba_gpu_v2023_openb/openb_pod_list_default.csv";

/// The trace's fractional compute shares, or a synthetic stand-in.
fn sizes() -> Vec<u32> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(TRACE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let mut lines = text.lines();
            let header: Vec<&str> = lines.next().unwrap_or("").split(',').collect();
            let col = |n: &str| header.iter().position(|h| *h == n).expect("openb header");
            let (num, milli) = (col("num_gpu"), col("gpu_milli"));
            lines
                .filter_map(|l| {
                    let f: Vec<&str> = l.split(',').collect();
                    let m: u32 = f.get(milli)?.parse().ok()?;
                    (f.get(num) == Some(&"1") && m > 0 && m < 1000).then_some(m)
                })
                .collect()
        }
        Err(_) => {
            eprintln!(
                "{} absent: benchmarking a synthetic set of 3,078 shares instead",
                path.display()
            );
            let mut x: u64 = 0x2545_f491_4f6c_dd1d;
            (0..3078)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    [810, 810, 810, 470, 470, 320, 650, 230, 460, 160][(x % 10) as usize]
                })
                .collect()
        }
    }
}

fn bench(c: &mut Criterion) {
    let sizes = sizes();
    let shape = GpuShape {
        memory_mib: 81920,
        headroom_mib: 0,
        compute_milli: GPU_COMPUTE_MILLI,
    };
    let items: Vec<ReplicaRequest> = sizes
        .iter()
        .enumerate()
        .map(|(i, &m)| ReplicaRequest::new(format!("pod-{i}"), format!("pod-{i}"), m, 0))
        .collect();
    let ours = pack_offline(&items, &shape).expect("valid items");
    let ffd = pack_first_fit_decreasing(&items, &shape).expect("valid items");
    let l2 = lower_bound_l2(&sizes, GPU_COMPUTE_MILLI);
    let lp = lower_bound_lp(&sizes, GPU_COMPUTE_MILLI, 10_000);
    eprintln!(
        "pods={} gpus_used={} ({}) ffd={} l2={} lp={}",
        sizes.len(),
        ours.gpus_used(),
        ours.algorithm.as_str(),
        ffd.gpus_used(),
        l2,
        lp.bound
    );

    let mut g = c.benchmark_group("pack_offline_openb");
    g.sample_size(20);
    g.bench_function("tessera_pack_offline", |b| {
        b.iter(|| pack_offline(black_box(&items), &shape))
    });
    g.bench_function("first_fit_decreasing", |b| {
        b.iter(|| pack_first_fit_decreasing(black_box(&items), &shape))
    });
    g.bench_function("lower_bound_l2", |b| {
        b.iter(|| lower_bound_l2(black_box(&sizes), GPU_COMPUTE_MILLI))
    });
    g.bench_function("lower_bound_lp", |b| {
        b.iter(|| lower_bound_lp(black_box(&sizes), GPU_COMPUTE_MILLI, 10_000))
    });
    g.finish();

    // Online: place the whole set one by one into a fresh packer (what the pool manager does per admission).
    let mut g = c.benchmark_group("pack_online_openb");
    g.sample_size(10);
    g.bench_function("place_or_open_all", |b| {
        b.iter(|| {
            let mut p = Packer::new(shape);
            for r in &items {
                p.place_or_open(r.clone()).expect("valid");
            }
            black_box(p.utilization())
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
