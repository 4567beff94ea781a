//! The first screen of `tessera simulate`: one short table and what to do per model.
//!
//! A person deciding whether Tessera is worth installing needs three numbers per strategy (GPU-hours, what they
//! cost against today's setup, and whether latency held) and, per model, the allocation that would do. Everything
//! else (bounds, utilization, reasons) is behind `--explain` and in `report.html`.

use std::fmt::Write as _;

use super::report::{ModelReport, Report, StrategyReport};
use crate::model::{GIB, GpuSpec};

/// What a GPU-hour costs in this report, and where that number comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct Price {
    /// Dollars per GPU-hour.
    pub usd_per_gpu_hour: f64,
    /// Its source (`--gpu-hour-price`, or the list price's).
    pub source: String,
}

impl Price {
    /// The user's price, else the GPU's list price.
    pub fn for_report(r: &Report, user: Option<f64>) -> Price {
        let (usd_per_gpu_hour, source) = super::today::price_for(&r.gpu, user);
        Price {
            usd_per_gpu_hour,
            source,
        }
    }
}

/// Today's GPU-hours and what they are: the observed replicas when every model has them, else the static
/// strategy (a whole GPU per replica, sized for the peak: how vLLM runs before Tessera).
pub fn today(r: &Report) -> Option<(f64, &'static str)> {
    let observed: Option<Vec<f64>> = r.today.iter().map(|t| t.as_ref().map(|t| t.gpu_hours)).collect();
    match observed {
        Some(v) if !v.is_empty() && v.len() == r.models.len() => Some((v.iter().sum(), "observed")),
        _ => r.strategy("static").map(|s| (s.gpu_hours, "static")),
    }
}

/// What a strategy using `gpu_hours` saves against `today` (see [`today`]): the GPU-hours and the percentage saved,
/// or `None` where there is no today to compare with.
pub fn saving(today: Option<(f64, &str)>, gpu_hours: f64) -> Option<(f64, f64)> {
    match today {
        Some((h, _)) if h > 0.0 => Some((h - gpu_hours, (1.0 - gpu_hours / h) * 100.0)),
        _ => None,
    }
}

/// The model's GPU share per replica: the larger of its compute share and its memory over the GPU's.
fn gpu_share(m: &ModelReport, gpu_memory: u64) -> f64 {
    let memory = m.gpu_memory_mib as f64 * 1024.0 * 1024.0 / gpu_memory.max(1) as f64;
    m.compute_fraction.max(memory).min(1.0)
}

/// One "what to do" line for model `i` from Tessera's run.
pub fn advice(r: &Report, t: &StrategyReport, i: usize) -> Option<String> {
    let m = t.models.get(i)?;
    let gpu_memory = GpuSpec::preset(&r.gpu)
        .map(|g| g.memory_bytes)
        .unwrap_or(80 * GIB);
    let mut line = format!(
        "{}: {:.2} GPU per replica ({:.2} compute, {:.1} GiB memory with {:.1} GiB KV) would do",
        m.model,
        gpu_share(m, gpu_memory),
        m.compute_fraction,
        m.gpu_memory_mib as f64 / 1024.0,
        m.kv_cache_gib
    );
    let _ = write!(
        line,
        "; {:.1} replicas on average, {} at most",
        m.replicas_mean, m.replicas_max
    );
    if m.surge_max > 0 {
        let _ = write!(
            line,
            " (and {} more for a moment while a pod moved: started before the one it replaced left)",
            m.surge_max
        );
    }
    if let Some(Some(today)) = r.today.get(i) {
        let _ = write!(
            line,
            " (today {:.1} whole GPUs{})",
            today.replicas_mean * today.gpus_per_replica,
            today
                .kv_cache_usage_max
                .map(|k| format!(", KV at most {:.0}% used", k * 100.0))
                .unwrap_or_default()
        );
    }
    match (
        r.scale_to_zero_after_secs.get(i).copied().flatten(),
        &m.warm_floor,
    ) {
        // The floor is what the rule asked for while a cold start would miss; what the run did is what the line
        // says, so a model that still went to zero (its misses within a budget, a floor that came late) is not
        // told to "keep one warm" beside its own cold starts.
        (Some(_), Some(_)) if m.starts_from_zero == 0 => {
            line.push_str("; kept one replica warm (a cold start would miss the TTFT objective)")
        }
        (Some(_), Some(_)) => {
            let _ = write!(
                line,
                "; kept one replica warm while a cold start would miss the TTFT objective, and still started from \
                 zero {} time(s) ({} cold start(s) in all)",
                m.starts_from_zero, m.cold_starts
            );
        }
        (Some(after), None) => {
            let _ = write!(
                line,
                "; scale to zero after {}",
                humantime::format_duration(std::time::Duration::from_secs(after.round() as u64))
            );
        }
        (None, _) => {}
    }
    if m.slo_attainment < r.attainment_goal {
        let _ = write!(
            line,
            " — but only {:.1}% of its requests met the TTFT objective{}",
            m.slo_attainment * 100.0,
            r.slo_ttft_secs
                .get(i)
                .map(|s| format!(" of {s:.1}s"))
                .unwrap_or_default()
        );
    }
    line.push('.');
    Some(line)
}

/// The first screen; `bundled` when the run is the bundled example rather than the user's own scenario or history.
pub fn first_screen(r: &Report, price: &Price, assumptions: &[String], bundled: bool) -> String {
    let mut o = String::new();
    let total: u64 = r.requests_per_model.iter().sum();
    if bundled {
        let _ = writeln!(
            o,
            "This is the bundled example (public traces, not your traffic). For your cluster: tessera simulate \
             --prometheus URL --since 1d; for your own traffic: a scenario file (docs/simulator.md).\n"
        );
    }
    let _ = writeln!(
        o,
        "{}: {} models on {}, {} simulated, {} requests",
        r.scenario,
        r.models.len(),
        r.gpu,
        humantime::format_duration(std::time::Duration::from_secs(r.duration_secs.round() as u64)),
        total
    );
    let today = today(r);
    let cost = |h: f64| {
        let usd = h * price.usd_per_gpu_hour;
        if usd < 0.0 {
            format!("-${:.2}", -usd)
        } else {
            format!("${usd:.2}")
        }
    };
    // Whether a strategy met the run's attainment goal: a saving that misses it is not one.
    let goal = r.attainment_goal * 100.0;
    let goal_head = format!("{goal:.0}% goal");
    let meets = |s: &StrategyReport| {
        if s.slo_attainment >= r.attainment_goal {
            "met"
        } else {
            "MISSED"
        }
    };
    let _ = writeln!(
        o,
        "\n{:<12} {:>10} {:>10} {:>16} {:>14} {:>9}",
        "strategy", "GPU-hours", "cost", "saved vs today", "TTFT within SLO", goal_head
    );
    if let Some((h, "observed")) = today {
        let _ = writeln!(
            o,
            "{:<12} {:>10.2} {:>10} {:>16} {:>14}",
            "today",
            h,
            cost(h),
            "—",
            "—"
        );
    }
    for s in &r.strategies {
        let saved = match saving(today, s.gpu_hours) {
            Some((hours, percent)) => format!("{} ({percent:.0}%)", cost(hours)),
            None => "—".to_string(),
        };
        let name = match today {
            Some((_, "static")) if s.strategy == "static" => "static=today".to_string(),
            _ => s.strategy.clone(),
        };
        let _ = writeln!(
            o,
            "{:<12} {:>10.2} {:>10} {:>16} {:>13.1}% {:>9}",
            name,
            s.gpu_hours,
            cost(s.gpu_hours),
            saved,
            s.slo_attainment * 100.0,
            meets(s)
        );
    }
    for f in &r.failures {
        let _ = writeln!(
            o,
            "{:<12} {:>10}  cannot run {}: {}",
            f.strategy,
            "unable",
            if f.model.is_empty() {
                "the scenario"
            } else {
                f.model.as_str()
            },
            f.reason
        );
    }
    let _ = writeln!(
        o,
        "(${:.2} per GPU-hour: {}. Today = {}.)",
        price.usd_per_gpu_hour,
        price.source,
        match today {
            Some((_, "observed")) => "what Prometheus saw the replicas hold, one whole GPU each",
            Some(_) => "static: a whole GPU per replica, replicas fixed for the peak",
            None => "not known (no static run)",
        }
    );
    if let Some(b) = &r.batch {
        let _ = write!(o, "\n{}", b.table());
    }
    if let Some(t) = r.strategy("tessera") {
        let _ = writeln!(o, "\nWhat to do (from Tessera's run):");
        for i in 0..t.models.len() {
            if let Some(line) = advice(r, t, i) {
                let _ = writeln!(o, "  {line}");
            }
        }
    }
    if !assumptions.is_empty() {
        let _ = writeln!(
            o,
            "\nMetrics cannot say everything; {} assumptions were made (--explain lists them; so does the scenario \
             file's header).",
            assumptions.len()
        );
    }
    let _ = writeln!(
        o,
        "\nWhy, per model and per strategy: --explain. Charts: --out DIR (report.html). Your cluster: --prometheus \
         URL. Docs: docs/simulator.md."
    );
    o
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn advice_names_the_share_the_kv_and_scale_to_zero() {
        let m = ModelReport {
            model: "support-chat".into(),
            requests: 10,
            failed: 0,
            ttft_p95: Some(0.5),
            slo_attainment: 1.0,
            replicas_max: 2,
            surge_max: 0,
            replicas_mean: 1.2,
            memory_gpu_hours: 0.0,
            cold_starts: 0,
            starts_from_zero: 0,
            preemptions: 0,
            kv_cache_gib: 6.0,
            compute_fraction: 0.4,
            compute_fraction_min: 0.4,
            gpu_memory_mib: 21 * 1024,
            recommendation_reasons: vec![],
            initial_recommendation: None,
            scale_changes: Default::default(),
            latency_on_share: None,
            prefill_bound: None,
            behind_while_urgent: None,
            workload_class: None,
            warm_floor: None,
            isolated: None,
            held_by: Default::default(),
            next_unit: None,
        };
        let t = StrategyReport {
            strategy: "tessera".into(),
            models: vec![m],
            ..serde_json::from_str::<StrategyReport>(&serde_json::to_string(&empty_strategy()).unwrap())
                .unwrap()
        };
        let r = Report {
            scale_to_zero_after_secs: vec![Some(600.0)],
            slo_ttft_secs: vec![2.0],
            ..empty_report()
        };
        let line = advice(&r, &t, 0).unwrap();
        assert!(line.starts_with("support-chat: 0.40 GPU per replica"), "{line}");
        assert!(
            line.contains("6.0 GiB KV") && line.contains("scale to zero after 10m"),
            "{line}"
        );
        // Issue 57: a warm floor beside starts from zero says what happened, not "keep one replica warm".
        let mut t = t;
        t.models[0].warm_floor = Some("cold start 28 s > TTFT objective 3 s".into());
        let line = advice(&r, &t, 0).unwrap();
        assert!(line.contains("; kept one replica warm (a cold start"), "{line}");
        t.models[0].starts_from_zero = 8;
        t.models[0].cold_starts = 9;
        let line = advice(&r, &t, 0).unwrap();
        assert!(
            line.contains("still started from zero 8 time(s) (9 cold start(s) in all)")
                && !line.contains("keep one replica warm"),
            "{line}"
        );
    }

    /// Issue 58: the first table marks which strategies met the goal, and the bundled example says it is one and
    /// how to run the user's own cluster instead.
    #[test]
    fn the_first_screen_marks_the_goal_and_names_the_bundled_example() {
        let strategy = |name: &str, hours: f64, attainment: f64| StrategyReport {
            strategy: name.into(),
            gpu_hours: hours,
            slo_attainment: attainment,
            ..empty_strategy()
        };
        let r = Report {
            attainment_goal: 0.99,
            strategies: vec![
                strategy("static", 10.0, 0.9997),
                strategy("hami-static", 5.0, 0.881),
            ],
            ..empty_report()
        };
        let price = Price::for_report(&r, Some(2.0));
        let bundled = first_screen(&r, &price, &[], true);
        assert!(bundled.starts_with("This is the bundled example"), "{bundled}");
        assert!(bundled.contains("--prometheus URL --since 1d"), "{bundled}");
        assert!(bundled.contains("99% goal"), "{bundled}");
        let row = |name: &str| bundled.lines().find(|l| l.starts_with(name)).unwrap().to_owned();
        assert!(row("static").ends_with("met"), "{bundled}");
        assert!(row("hami-static").ends_with("MISSED"), "{bundled}");
        let own = first_screen(&r, &price, &[], false);
        assert!(!own.contains("bundled example"), "{own}");
    }

    fn empty_strategy() -> StrategyReport {
        serde_json::from_value(serde_json::json!({
            "strategy": "x", "description": "", "gpu_hours": 1.0, "gpus_peak": 1, "gpus_mean": 1.0,
            "memory_used_ratio": 0.0, "memory_reserved_ratio": 0.0, "compute_ratio": 0.0, "requests": 0,
            "completed": 0, "failed": 0, "ttft_p50": null, "ttft_p95": null, "ttft_p99": null,
            "slo_attainment": 1.0, "cold_starts": 0, "starts_from_zero": 0, "held_requests": 0,
            "held_mean_secs": 0.0, "held_max_secs": 0.0, "preemptions": 0, "arrival_digest": "",
            "arrivals_processed": 0, "models": [],
            "series": {"t": [], "gpus": [], "replicas": [], "ttft_t": [], "ttft_p95": []}
        }))
        .unwrap()
    }

    fn empty_report() -> Report {
        serde_json::from_value(serde_json::json!({
            "scenario": "s", "description": "", "seed": 1, "duration_secs": 60.0, "gpu": "a100-80gb",
            "models": ["support-chat"], "requests_per_model": [10], "lower_bound_gpu_hours": 0.0,
            "sharing_model": "mps", "static_sizing": [], "strategies": []
        }))
        .unwrap()
    }
}
