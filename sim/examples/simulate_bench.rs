//! Times `tessera simulate` without the rest of the binary: loads a scenario (the default without an argument),
//! runs every strategy, prints the wall time and the summary line. Used for docs/performance.md:
//! `cargo run --release -p tessera-sim --example simulate_bench -- [SCENARIO.yaml]`.

use std::time::Instant;

use tessera_sim::simulate::{Source, scenario, simulate};

fn main() -> anyhow::Result<()> {
    let source = match std::env::args().nth(1) {
        Some(p) => Source::File(p.into()),
        None => Source::Default,
    };
    let started = Instant::now();
    let sc = scenario::load(&source, None, None)?;
    let loaded = started.elapsed();
    let report = simulate(&sc, &mut |_, _| {})?;
    let total = started.elapsed();
    let requests: usize = sc.arrivals.iter().map(Vec::len).sum();
    println!(
        "models={} requests={} load_s={:.3} total_s={:.3}",
        sc.models.len(),
        requests,
        loaded.as_secs_f64(),
        total.as_secs_f64()
    );
    println!("{}", report.summary_line());
    Ok(())
}
