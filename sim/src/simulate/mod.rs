//! `tessera simulate`: the what-if simulator.
//!
//! It replays real request traces through three strategies on the same arrivals and reports GPU-hours,
//! utilization and latency for each:
//! - **static**: a whole GPU per replica, replicas fixed for the peak (each model gets the smallest count that
//!   meets its TTFT SLO for the scenario's attainment target, found by simulating that model alone);
//! - **hpa**: a whole GPU per replica, HPA's rule on requests per second per replica, at least one replica;
//! - **tessera**: fractional replicas packed onto GPUs, memory and compute from the recommendation, replica
//!   counts from the inference-signal autoscaler, scale to zero with cold starts held at the activator.
//!
//! Every replica's queueing, KV blocks, preemptions and TTFT come from the performance model
//! ([`crate::model`]); every decision comes from `tessera-core` ([`world`] only carries them out). The
//! simulation itself ([`simulate`]) is pure and deterministic for a seed; [`run`] adds the files, the progress
//! bar and the output. See `docs/simulator.md`.

pub mod batch;
pub mod batch_jobs;
pub mod batch_outcome;
pub mod bound;
pub mod crd_model;
pub mod html;
pub mod missing_fields;
pub mod observe;
pub mod peers;
pub mod report;
pub mod scenario;
pub mod summary;
pub mod sweep;
pub mod today;
pub mod world;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

use anyhow::Context;

pub use report::Report;
pub use scenario::{Scenario, ScenarioError, Source};
pub use world::{Plan, SimError, StrategyKind};

use report::StaticSizing;
use world::World;

/// `tessera simulate` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Scenario file (YAML; see docs/simulator.md), the same as --scenario.
    #[arg(conflicts_with = "scenario", value_name = "SCENARIO")]
    pub file: Option<PathBuf>,
    /// Scenario file (YAML; see docs/simulator.md). Without it (and without --prometheus), the bundled default
    /// scenario runs: nine models on A100-80GB replaying the Azure LLM 2023 and Azure Functions 2019 traces.
    #[arg(long, env = "TESSERA_SIMULATE_SCENARIO")]
    pub scenario: Option<PathBuf>,
    /// Reading the scenario from a Prometheus server instead.
    #[command(flatten)]
    pub prom: crate::prometheus::PromArgs,
    /// After the short table and the advice, print every number and every reason (bounds, utilization, what
    /// held each model's replica count, the assumptions made).
    #[arg(long, env = "TESSERA_SIMULATE_EXPLAIN")]
    pub explain: bool,
    /// Price of one GPU-hour in dollars, for the cost columns (default: the GPU's on-demand list price, see
    /// docs/simulator.md "What a GPU-hour costs").
    #[arg(long, env = "TESSERA_SIMULATE_GPU_HOUR_PRICE", value_parser = parse_price)]
    pub gpu_hour_price: Option<f64>,
    /// Seed for every random draw; overrides the scenario's.
    #[arg(long, env = "TESSERA_SIMULATE_SEED", conflicts_with = "seeds")]
    pub seed: Option<u64>,
    /// Run the scenario once per seed and report each strategy's spread (median, least and most GPU-hours, the
    /// worst seed's attainment, the seeds under the goal): a range, a list or both (`1-24`, `1,5,9`, `1-8,42`).
    #[arg(long, env = "TESSERA_SIMULATE_SEEDS", value_parser = parse_seeds_arg)]
    pub seeds: Option<Seeds>,
    /// Simulated time (e.g. `30m`, `2h`); overrides the scenario's. Traces shorter than this are tiled.
    #[arg(long, env = "TESSERA_SIMULATE_DURATION", value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// Write `report.json` and a self-contained `report.html` (charts, no network) into this folder; with
    /// `--seeds`, `sweep.json` (each seed's GPU-hours and attainment per strategy, and their spread).
    #[arg(long, env = "TESSERA_SIMULATE_OUT")]
    pub out: Option<PathBuf>,
    /// Print only the last summary line (`gpu_hours_lower_bound=… gpu_hours_static=… …`; with `--seeds`,
    /// `seeds=… gpu_hours_median_tessera=… …`), no table or progress.
    #[arg(long, env = "TESSERA_SIMULATE_QUIET")]
    pub quiet: bool,
    /// Strategies to run, comma-separated: static, hpa, kubeai, aibrix, keda-http, hami-static, tessera
    /// (default: all of them).
    #[arg(long, env = "TESSERA_SIMULATE_STRATEGIES", value_delimiter = ',', value_parser = StrategyKind::parse)]
    pub strategies: Vec<StrategyKind>,
    /// Print the result as a Markdown table (what `scripts/sim-results.sh` puts in docs/simulator.md).
    #[arg(long, env = "TESSERA_SIMULATE_MARKDOWN")]
    pub markdown: bool,
    /// Let sleeping pods lend their room beyond their residue to new replicas, as the chart's
    /// `gpuPools.lendSleepers: true` does (off by default, as in the chart; overrides `strategies.lend_sleepers`).
    #[arg(long, env = "TESSERA_SIMULATE_LEND_SLEEPERS")]
    pub lend_sleepers: bool,
}

impl Args {
    /// What these flags set over the scenario file, with `seed` for this run.
    fn overrides(&self, seed: Option<u64>) -> scenario::Overrides {
        scenario::Overrides {
            seed,
            duration: self.duration,
            // The flag only turns lending on: without it the scenario's own setting stands.
            lend_sleepers: self.lend_sleepers.then_some(true),
        }
    }
}

/// The seeds of a sweep (`--seeds`), parsed by [`sweep::parse_seeds`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seeds(pub Vec<u64>);

/// A price in US dollars per GPU-hour (`2.5` or `$2.5`), for every `--gpu-hour-price`.
pub fn parse_price(s: &str) -> Result<f64, String> {
    match s.trim_start_matches('$').parse::<f64>() {
        Ok(p) if p.is_finite() && p >= 0.0 => Ok(p),
        _ => Err(format!("{s:?} is not a price in dollars per GPU-hour (e.g. 2.5)")),
    }
}

fn parse_seeds_arg(spec: &str) -> Result<Seeds, sweep::SeedsError> {
    sweep::parse_seeds(spec).map(Seeds)
}

/// Which phase of a run progress is reported for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Sizing the static strategy (model by model).
    StaticSizing,
    /// Running a strategy on all models.
    Strategy(StrategyKind),
}

/// Runs every strategy on the scenario and returns the report. Pure: no I/O, no clock; `progress` is told the
/// phase and the virtual seconds reached.
pub fn simulate(sc: &Scenario, progress: &mut (dyn FnMut(Phase, f64) + Send)) -> Result<Report, SimError> {
    simulate_strategies(sc, &StrategyKind::ALL, Extras::ALL, progress)
}

/// Runs beside the strategies that only a single run's report shows (a sweep leaves them out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extras {
    /// Where the scenario gives models a sleep-mode wake, Tessera again with sleep mode off
    /// ([`Report::tessera_without_sleep`]): what putting those models to sleep saved.
    pub without_sleep: bool,
}

impl Extras {
    /// Every extra run.
    pub const ALL: Extras = Extras { without_sleep: true };
    /// None.
    pub const NONE: Extras = Extras { without_sleep: false };
}

/// Runs the given strategies (in report order, each once) on the scenario and returns the report. Independent
/// runs (the static sizing of each model, every strategy but Tessera, which starts from the HPA baseline) go on
/// up to `available_parallelism` threads; each is its own world, so the report is the same for any thread count.
pub fn simulate_strategies(
    scenario: &Scenario,
    kinds: &[StrategyKind],
    extras: Extras,
    progress: &mut (dyn FnMut(Phase, f64) + Send),
) -> Result<Report, SimError> {
    // Models the scenario gives a sleep-mode wake: Tessera's rounds decide whether their last replica sleeps at
    // zero, as the controller's do; an extra run without sleep mode shows what it saved.
    let sleep_mode_models: Vec<String> = scenario
        .models
        .iter()
        .filter(|m| m.sleep_wake_secs.is_some())
        .map(|m| m.name.clone())
        .collect();
    let without_sleep = (!sleep_mode_models.is_empty()).then(|| scenario.without_sleep_mode());
    let sc = scenario;
    let progress = Mutex::new(progress);
    let tell = |phase: Phase, t: f64| {
        if let Ok(mut p) = progress.lock() {
            p(phase, t);
        }
    };
    let mut kinds = strategy_list(kinds);
    let mut failures: Vec<report::StrategyFailure> = Vec::new();
    let sizing = size_statics(sc, &mut kinds, &mut failures, &tell);
    let runner = Runner {
        static_replicas: sizing.iter().map(|s| s.replicas).collect(),
        tell: &tell,
    };
    let (mut reports, hpa_histories) = runner.baselines(sc, &kinds, &mut failures);
    let mut no_sleep = None;
    let mut batch_comparison = None;
    if kinds.contains(&StrategyKind::Tessera) {
        let without_sleep = without_sleep.as_ref().filter(|_| extras.without_sleep);
        let t = runner.tessera(sc, without_sleep, hpa_histories, &mut failures)?;
        no_sleep = t.without_sleep;
        batch_comparison = t.batch;
        if let Some(r) = t.report {
            reports.push(r);
        }
    }
    let bounds = bound::lower_bounds(sc, sc.settings.static_attainment_target);
    Ok(Report {
        scenario: sc.name.clone(),
        description: sc.description.clone(),
        seed: sc.seed,
        duration_secs: sc.duration,
        gpu: sc.gpu.name.clone(),
        sharing_model: sc.settings.sharing_model.name().to_string(),
        compute_oversubscription: sc.settings.compute_oversubscription(),
        update_mode: sc.settings.update_mode,
        lend_sleepers: sc.settings.lend_sleepers,
        models: sc.models.iter().map(|m| m.name.clone()).collect(),
        requests_per_model: sc.arrivals.iter().map(|a| a.len() as u64).collect(),
        forced_memory_gpu_hours: bounds.forced_memory,
        lower_bound_gpu_hours: bounds.free,
        lower_bound_with_cold_starts_gpu_hours: bounds.cold_starts,
        attainment_goal: sc.settings.static_attainment_target,
        lower_bound_at_goal_gpu_hours: bounds.at_attainment,
        sleep_mode_models,
        tessera_without_sleep: no_sleep,
        batch: batch_comparison,
        static_sizing: sizing,
        strategies: reports,
        failures,
        today: sc.models.iter().map(|m| m.today.clone()).collect(),
        scale_to_zero_after_secs: sc
            .models
            .iter()
            .map(|m| {
                (m.min_replicas == 0)
                    .then(|| m.scale_to_zero_after.map(|d| d.as_secs_f64()))
                    .flatten()
            })
            .collect(),
        slo_ttft_secs: sc.models.iter().map(|m| m.slo_ttft).collect(),
    })
}

/// (a) Static sizing (static and hami-static), when one of them runs: the smallest whole-GPU count per model that
/// meets the SLO target alone. A model no whole GPU can run fails both strategies sized this way, which leave
/// `kinds`; the others still run.
fn size_statics(
    sc: &Scenario,
    kinds: &mut Vec<StrategyKind>,
    failures: &mut Vec<report::StrategyFailure>,
    tell: &(dyn Fn(Phase, f64) + Sync),
) -> Vec<StaticSizing> {
    let needs_sizing = kinds
        .iter()
        .any(|k| matches!(k, StrategyKind::Static | StrategyKind::HamiStatic));
    if !needs_sizing {
        return Vec::new();
    }
    match par_map(&(0..sc.models.len()).collect::<Vec<_>>(), |&m| {
        size_static(sc, m, tell)
    })
    .into_iter()
    .collect::<Result<Vec<_>, _>>()
    {
        Ok(s) => s,
        Err(e) => {
            for k in [StrategyKind::Static, StrategyKind::HamiStatic] {
                if kinds.contains(&k) {
                    failures.push(report::StrategyFailure::of(k, &e));
                }
            }
            kinds.retain(|k| !matches!(k, StrategyKind::Static | StrategyKind::HamiStatic));
            Vec::new()
        }
    }
}

/// Runs strategies' worlds, each with the static sizing every plan carries.
struct Runner<'a> {
    static_replicas: Vec<u32>,
    tell: &'a (dyn Fn(Phase, f64) + Sync),
}

/// Tessera's part of the report: its own section, and what its extra runs beside it showed.
struct TesseraRuns {
    report: Option<report::StrategyReport>,
    without_sleep: Option<report::Outcome>,
    batch: Option<batch_outcome::BatchComparison>,
}

impl Runner<'_> {
    /// One world. `shown`: the run tells `progress` how far it got (an extra run beside it does not, so the bar
    /// does not jump).
    fn run(
        &self,
        sc: &Scenario,
        kind: StrategyKind,
        initial: Vec<Option<tessera_core::recommend::Recommendation>>,
        shown: bool,
        batch: Option<world::BatchPlan>,
    ) -> Result<world::RunResult, SimError> {
        World::new(
            sc,
            Plan {
                kind,
                static_replicas: self.static_replicas.clone(),
                initial_recommendations: initial,
                only_models: Vec::new(),
                batch,
            },
        )?
        .run(&mut |t| {
            if shown {
                (self.tell)(Phase::Strategy(kind), t);
            }
        })
    }

    /// Everything but Tessera at once; the HPA baseline also when only Tessera needs it (for calibration), then
    /// kept out of the reports. Returns the reports and the HPA run's histories.
    fn baselines(
        &self,
        sc: &Scenario,
        kinds: &[StrategyKind],
        failures: &mut Vec<report::StrategyFailure>,
    ) -> (Vec<report::StrategyReport>, Option<Vec<world::ReplicaHistory>>) {
        let tessera = kinds.contains(&StrategyKind::Tessera);
        let mut first: Vec<StrategyKind> = kinds
            .iter()
            .copied()
            .filter(|&k| k != StrategyKind::Tessera)
            .collect();
        let hpa_only_for_calibration =
            tessera && sc.settings.calibrate_from_baseline && !first.contains(&StrategyKind::Hpa);
        if hpa_only_for_calibration {
            first.push(StrategyKind::Hpa);
        }
        let mut reports = Vec::new();
        let mut hpa_histories = None;
        for (kind, r) in first
            .iter()
            .zip(par_map(&first, |&k| self.run(sc, k, Vec::new(), true, None)))
        {
            // One strategy's failure (a declared share vLLM would refuse to start in) is reported, not the run's.
            let r = match r {
                Ok(r) => r,
                Err(e) => {
                    if !(hpa_only_for_calibration && *kind == StrategyKind::Hpa) {
                        failures.push(report::StrategyFailure::of(*kind, &e));
                    }
                    continue;
                }
            };
            if *kind == StrategyKind::Hpa {
                hpa_histories = Some(r.histories);
                if hpa_only_for_calibration {
                    continue;
                }
            }
            reports.push(r.report);
        }
        (reports, hpa_histories)
    }

    /// Tessera, starting from what its sidecars would have recommended watching the whole-GPU baseline; beside it
    /// on their own threads, the same run with sleep mode off (`without_sleep`: what sleep mode saved) and, with
    /// batch jobs in the scenario, the run with them paced into its spare room (`batch.rs`).
    fn tessera(
        &self,
        sc: &Scenario,
        without_sleep: Option<&Scenario>,
        hpa_histories: Option<Vec<world::ReplicaHistory>>,
        failures: &mut Vec<report::StrategyFailure>,
    ) -> Result<TesseraRuns, SimError> {
        let initial = match hpa_histories {
            Some(h) if sc.settings.calibrate_from_baseline => world::calibrate(sc, &h),
            _ => vec![None; sc.models.len()],
        };
        let paced = sc.batch.as_ref().map(|_| world::BatchPlan {
            mode: world::BatchMode::Paced,
            interactive: true,
        });
        let worlds: Vec<(&Scenario, bool, Option<world::BatchPlan>)> = std::iter::once((sc, true, None))
            .chain(without_sleep.map(|w| (w, false, None)))
            .chain(paced.map(|p| (sc, false, Some(p))))
            .collect();
        let mut runs = par_map(&worlds, |&(w, shown, batch)| {
            self.run(w, StrategyKind::Tessera, initial.clone(), shown, batch)
        })
        .into_iter();
        let alone = match runs.next() {
            Some(Ok(r)) => Some(r.report),
            Some(Err(e)) => {
                failures.push(report::StrategyFailure::of(StrategyKind::Tessera, &e));
                None
            }
            None => None,
        };
        let mut no_sleep = None;
        if without_sleep.is_some()
            && let Some(Ok(r)) = runs.next()
        {
            let r = r.report;
            no_sleep = Some(report::Outcome {
                gpu_hours: r.gpu_hours,
                slo_attainment: r.slo_attainment,
                sleep_wakes: r.sleep_wakes,
                sleepers_lost: r.sleepers_lost,
            });
        }
        let mut batch_comparison = None;
        if let (Some(alone), Some(paced)) = (&alone, runs.next()) {
            let only =
                |p: world::BatchPlan| self.run(sc, StrategyKind::Tessera, initial.clone(), false, Some(p));
            let alone_side = batch::Interactive {
                gpu_hours: alone.gpu_hours,
                attainment: alone.slo_attainment,
            };
            batch_comparison = batch::compare(sc, alone_side, paced?, &only)?;
        }
        Ok(TesseraRuns {
            report: alone,
            without_sleep: no_sleep,
            batch: batch_comparison,
        })
    }
}

/// The static rule for model `m` alone: the smallest whole-GPU count whose TTFT meets the SLO target.
fn size_static(
    sc: &Scenario,
    m: usize,
    tell: &(dyn Fn(Phase, f64) + Sync),
) -> Result<StaticSizing, SimError> {
    let n = sc.models.len();
    let setup = &sc.models[m];
    let target = sc.settings.static_attainment_target;
    let mut last_attainment = 0.0;
    for count in 1..=setup.max_replicas.max(1) {
        let mut replicas = vec![0; n];
        replicas[m] = count;
        let plan = Plan {
            only_models: vec![m],
            ..Plan::fixed(replicas)
        };
        let r = World::new(sc, plan)?.run(&mut |t| tell(Phase::StaticSizing, t))?;
        last_attainment = r.report.slo_attainment;
        if last_attainment >= target {
            return Ok(StaticSizing {
                model: setup.name.clone(),
                replicas: count,
                attainment: last_attainment,
                reason: format!(
                    "smallest count whose TTFT ≤ {:.1}s for {:.2}% ≥ {:.0}% of requests",
                    setup.slo_ttft,
                    last_attainment * 100.0,
                    target * 100.0
                ),
            });
        }
    }
    Ok(StaticSizing {
        model: setup.name.clone(),
        replicas: setup.max_replicas.max(1),
        attainment: last_attainment,
        reason: format!(
            "no count up to max_replicas {} meets {:.0}% (best {:.2}%): using max_replicas",
            setup.max_replicas,
            target * 100.0,
            last_attainment * 100.0
        ),
    })
}

/// `f` over every item on up to `available_parallelism` scoped threads, results in item order.
fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(items.len());
    if threads <= 1 {
        return items.iter().map(&f).collect();
    }
    let next = AtomicUsize::new(0);
    let mut done: Vec<(usize, R)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, AtomicOrdering::Relaxed);
                        let Some(item) = items.get(i) else { break };
                        mine.push((i, f(item)));
                    }
                    mine
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
            .collect()
    });
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, r)| r).collect()
}

/// Runs `tessera simulate`.
pub async fn run(mut args: Args) -> anyhow::Result<()> {
    if let Some(f) = args.file.take() {
        args.scenario = Some(f);
    }
    let mut assumptions = Vec::new();
    if let Some(url) = args.prom.prometheus.clone() {
        // Read, write, then simulate the file as written: the numbers are exactly what `tessera simulate FILE`
        // gives, before or after an edit.
        let fetched = crate::prometheus::fetch(&url, &args.prom).await?;
        let path = args.prom.write_scenario.clone();
        std::fs::write(&path, &fetched.yaml)
            .with_context(|| format!("cannot write the scenario to {}", path.display()))?;
        tracing::info!(scenario = %path.display(), models = fetched.file.models.len(), "scenario written");
        eprintln!(
            "Wrote the traffic Prometheus saw to {p}: edit it and run `tessera simulate {p}` again.",
            p = path.display()
        );
        assumptions = fetched.assumptions;
        args.scenario = Some(path);
    }
    // The simulation is CPU-bound and synchronous: keep it off the async runtime's worker threads.
    tokio::task::spawn_blocking(move || run_blocking(&args, &assumptions))
        .await
        .context("the simulation thread panicked")?
}

fn run_blocking(args: &Args, assumptions: &[String]) -> anyhow::Result<()> {
    let started = Instant::now();
    let source = match &args.scenario {
        Some(p) => Source::File(p.clone()),
        None => Source::Default,
    };
    if let Some(seeds) = &args.seeds {
        return run_sweep(args, &source, &seeds.0);
    }
    let bundled = source == Source::Default;
    let sc = scenario::load_with(&source, args.overrides(args.seed))?;
    let requests: usize = sc.arrivals.iter().map(Vec::len).sum();
    tracing::info!(scenario = %sc.name, models = sc.models.len(), requests, seed = sc.seed, "simulating");
    // One overall bar: the strategies run side by side, so it shows how far all of them got together.
    let mut overall = Overall::new(&sc, &args.strategies);
    let bar = progress_bar(args.quiet, overall.len(), "virtual s, all strategies");
    let mut phase_seen = None;
    let report = simulate_strategies(&sc, &args.strategies, Extras::ALL, &mut |phase, t| {
        let sizing = phase == Phase::StaticSizing;
        if phase_seen != Some(sizing) {
            phase_seen = Some(sizing);
            bar.set_message(if sizing { "sizing static" } else { "strategies" });
        }
        bar.set_position(overall.advance(phase, t) as u64);
    })?;
    bar.finish_and_clear();
    if report.strategies.is_empty() && !report.failures.is_empty() {
        // Nothing ran: there is no report to read, only the reasons.
        let lines: Vec<String> = report.failures.iter().map(|f| f.line()).collect();
        anyhow::bail!("no strategy could run the scenario:\n  {}", lines.join("\n  "));
    }
    for z in &report.static_sizing {
        tracing::info!(model = %z.model, replicas = z.replicas, reason = %z.reason, "static sizing");
    }
    tracing::info!(
        elapsed_ms = started.elapsed().as_millis() as u64,
        "simulation done"
    );
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create output folder {}", dir.display()))?;
        let json = serde_json::to_string_pretty(&report)?;
        let jp = dir.join("report.json");
        std::fs::write(&jp, json).with_context(|| format!("cannot write {}", jp.display()))?;
        let hp = dir.join("report.html");
        std::fs::write(
            &hp,
            html::render_priced(&report, &summary::Price::for_report(&report, args.gpu_hour_price)),
        )
        .with_context(|| format!("cannot write {}", hp.display()))?;
        tracing::info!(json = %jp.display(), html = %hp.display(), "report written");
    }
    let price = summary::Price::for_report(&report, args.gpu_hour_price);
    print_result(
        args,
        || report.markdown(),
        || report.summary_line(),
        || {
            let mut o = summary::first_screen(&report, &price, assumptions, bundled);
            if args.explain {
                o.push_str("\n──── explained ────\n");
                if !report.description.is_empty() {
                    o.push_str(&format!("{}\n", report.description));
                }
                for a in assumptions {
                    o.push_str(&format!("assumed: {a}\n"));
                }
                o.push_str(&report.table());
            } else {
                o.push_str(&report.summary_line());
                o.push('\n');
            }
            o
        },
    );
    Ok(())
}

/// Prints a run's or a sweep's result the way the flags ask: Markdown and the summary line, the summary line
/// alone, or the table.
fn print_result(
    args: &Args,
    markdown: impl FnOnce() -> String,
    summary: impl Fn() -> String,
    table: impl FnOnce() -> String,
) {
    if args.markdown {
        print!("{}", markdown());
        println!();
        println!("{}", summary());
    } else if args.quiet {
        println!("{}", summary());
    } else {
        print!("{}", table());
    }
}

/// `--seeds`: the scenario once per seed (seeds in parallel, each run's own strategies too), folded into a
/// [`sweep::Sweep`].
fn run_sweep(args: &Args, source: &Source, seeds: &[u64]) -> anyhow::Result<()> {
    let started = Instant::now();
    // Loaded once up front so a bad scenario fails before anything runs, and for the name and the goal.
    let first = scenario::load_with(source, args.overrides(seeds.first().copied()))?;
    tracing::info!(scenario = %first.name, seeds = seeds.len(), "sweeping seeds");
    let bar = progress_bar(args.quiet, seeds.len() as f64, "seeds");
    bar.set_message("seeds");
    let done = AtomicUsize::new(0);
    let results = par_map(seeds, |&seed| -> anyhow::Result<sweep::SeedResult> {
        let sc = scenario::load_with(source, args.overrides(Some(seed)))?;
        let report = simulate_strategies(&sc, &args.strategies, Extras::NONE, &mut |_, _| {})
            .with_context(|| format!("seed {seed}"))?;
        let n = done.fetch_add(1, AtomicOrdering::Relaxed) + 1;
        bar.set_position(n as u64);
        tracing::debug!(seed, done = n, "seed done");
        Ok(sweep::SeedResult::of(&report))
    });
    bar.finish_and_clear();
    let results = results.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    let sweep = sweep::Sweep::new(
        &first.name,
        first.duration,
        first.settings.static_attainment_target,
        results,
    )?;
    tracing::info!(elapsed_ms = started.elapsed().as_millis() as u64, "sweep done");
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create output folder {}", dir.display()))?;
        let jp = dir.join("sweep.json");
        std::fs::write(&jp, serde_json::to_string_pretty(&sweep)?)
            .with_context(|| format!("cannot write {}", jp.display()))?;
        tracing::info!(json = %jp.display(), "sweep written");
    }
    print_result(
        args,
        || sweep.markdown(),
        || sweep.summary_line(),
        || sweep.table(),
    );
    Ok(())
}

/// A single run's progress, all strategies together: the strategies run in parallel and each reports the
/// virtual seconds it reached, so the position is the sum of each run's furthest point. It only moves forward
/// (a bar set to whichever run spoke last jumped between them and ran backwards), and ends at
/// [`Overall::len`]: the scenario's duration once per strategy run that reports.
#[derive(Debug)]
struct Overall {
    duration: f64,
    runs: usize,
    reached: Vec<(StrategyKind, f64)>,
}

/// The strategies a run takes, in order and each once: `kinds`, or all of them when empty.
fn strategy_list(kinds: &[StrategyKind]) -> Vec<StrategyKind> {
    let mut kinds: Vec<StrategyKind> = if kinds.is_empty() {
        StrategyKind::ALL.to_vec()
    } else {
        kinds.to_vec()
    };
    kinds.sort();
    kinds.dedup();
    kinds
}

impl Overall {
    /// For the strategies `kinds` (empty: all) on `sc`, as [`simulate_strategies`] runs them: each once, and the
    /// HPA baseline as well when only Tessera's calibration needs it.
    fn new(sc: &Scenario, kinds: &[StrategyKind]) -> Overall {
        let kinds = strategy_list(kinds);
        let calibration = kinds.contains(&StrategyKind::Tessera)
            && sc.settings.calibrate_from_baseline
            && !kinds.contains(&StrategyKind::Hpa);
        Overall {
            duration: sc.duration,
            runs: kinds.len() + usize::from(calibration),
            reached: Vec::new(),
        }
    }

    /// Where the bar ends: the duration once per run.
    fn len(&self) -> f64 {
        self.duration * self.runs as f64
    }

    /// Records that `phase` reached `t` virtual seconds and returns the overall position, never less than the
    /// last one. The static sizing (several trial runs per model, each from 0) moves nothing.
    fn advance(&mut self, phase: Phase, t: f64) -> f64 {
        if let Phase::Strategy(kind) = phase {
            let t = t.clamp(0.0, self.duration);
            match self.reached.iter_mut().find(|(k, _)| *k == kind) {
                Some((_, r)) => *r = r.max(t),
                None => self.reached.push((kind, t)),
            }
        }
        self.reached.iter().map(|(_, t)| t).sum::<f64>().min(self.len())
    }
}

fn progress_bar(quiet: bool, len: f64, unit: &str) -> indicatif::ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar =
        indicatif::ProgressBar::with_draw_target(Some(len as u64), indicatif::ProgressDrawTarget::stderr());
    if let Ok(style) = indicatif::ProgressStyle::with_template(&format!(
        "{{msg:>14}} [{{bar:40}}] {{pos}}/{{len}} {unit} ({{elapsed}})"
    )) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

#[cfg(test)]
mod tests;
