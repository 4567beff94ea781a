//! Prints one model's replica decisions over a Tessera run, round by round: the replicas, the rule that settled
//! the count, what each signal said (value / target → replicas it asked for) and each ready replica's own 1-minute
//! TTFT p95. The run starts as `tessera simulate` starts Tessera (from the HPA baseline's calibration). Used in
//! docs/simulator.md to see why a model sits at its replica count:
//! `cargo run --release -p tessera-sim --example decisions -- SCENARIO.yaml MODEL [EVERY_NTH_ROUND]`.

use anyhow::Context;
use tessera_sim::simulate::{Plan, Source, StrategyKind, scenario, world};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: decisions SCENARIO.yaml MODEL [EVERY_NTH_ROUND]";
    let path = args.next().context(usage)?;
    let name = args.next().context(usage)?;
    let every: usize = args.next().map_or(Ok(1), |n| n.parse()).context(usage)?;
    let sc = scenario::load(&Source::File(path.into()), None, None)?;
    let model = sc
        .models
        .iter()
        .position(|m| m.name == name)
        .with_context(|| format!("no model {name:?} in the scenario"))?;
    let hpa = world::World::new(&sc, Plan::starting_from(StrategyKind::Hpa, Vec::new()))?.run(&mut |_| {})?;
    let initial = world::calibrate(&sc, &hpa.histories);
    let run = world::World::new(&sc, Plan::starting_from(StrategyKind::Tessera, initial))?
        .recording_decisions()
        .run(&mut |_| {})?;
    let round = |v: f64| (v * 100.0).round() / 100.0;
    for r in run
        .decisions
        .iter()
        .filter(|r| r.model == model)
        .step_by(every.max(1))
    {
        let d = &r.decision;
        let signals: Vec<String> = d
            .signals
            .iter()
            .map(|s| {
                let value = s.value.map_or("-".into(), |v| round(v).to_string());
                let asks = s.proposed.map_or("-".into(), |p| p.to_string());
                format!("{}={value}/{}→{asks}", s.signal.label(), round(s.target))
            })
            .collect();
        let own: Vec<String> = r
            .observed
            .sidecars
            .iter()
            .map(|s| {
                s.as_ref()
                    .and_then(|s| s.recent.as_ref())
                    .and_then(|l| l.ttft_seconds.p95)
                    .map_or("-".into(), |v| round(v).to_string())
            })
            .collect();
        println!(
            "{:>6.0}s replicas {}→{} {:<18} {} | replicas' own TTFT p95: {}",
            r.at_ms as f64 / 1000.0,
            d.current_replicas,
            d.desired_replicas,
            d.reason.label(),
            signals.join(" "),
            own.join(" ")
        );
    }
    Ok(())
}
