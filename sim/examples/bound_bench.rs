//! Times the three lower bounds alone (`tessera_sim::simulate::bound::lower_bounds`) on a scenario (the default
//! without an argument), the median of `RUNS` walks, and prints them. Used for docs/performance.md:
//! `cargo run --release -p tessera-sim --example bound_bench -- [SCENARIO.yaml] [RUNS]`.

use std::time::Instant;

use tessera_sim::simulate::{Source, bound, scenario};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let source = match args.next() {
        Some(p) if p != "-" => Source::File(p.into()),
        _ => Source::Default,
    };
    let runs: usize = args.next().map_or(Ok(5), |n| n.parse())?;
    let sc = scenario::load(&source, None, None)?;
    let requests: usize = sc.arrivals.iter().map(Vec::len).sum();
    let mut times = Vec::with_capacity(runs.max(1));
    let mut last = None;
    for _ in 0..runs.max(1) {
        let started = Instant::now();
        last = Some(bound::lower_bounds(&sc, sc.settings.static_attainment_target));
        times.push(started.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let b = last.expect("at least one run");
    println!(
        "models={} requests={} bounds_median_s={:.4} free={:.3} cold_starts={:.3} at_goal={:.3}",
        sc.models.len(),
        requests,
        times[times.len() / 2],
        b.free,
        b.cold_starts,
        b.at_attainment
    );
    Ok(())
}
