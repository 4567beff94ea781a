//! `/ui/savings`: what Tessera would save over the last day, from what this autoscaler observed.
//!
//! Installed with `updateMode: Off`, Tessera only watches; the page already keeps a day of per-minute history per
//! model (finished requests per second and replicas, [`super::history`]). This module turns that history into the
//! same scenario `tessera simulate --prometheus` writes — through the same conversion
//! (`tessera_sim::prometheus::convert::scenario`) — and runs the same simulation on it, so the numbers are the ones
//! `simulate` gives for that day. `/ui/savings.yaml` serves the scenario itself: `tessera simulate savings.yaml`
//! reproduces the page's numbers exactly.
//!
//! Bounded: at most one day of one-minute steps per model, at most [`MAX_REQUESTS`] simulated requests, and one
//! computation per [`REFRESH`] (later requests get the cached answer).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

use tessera_sim::prometheus::convert::{self, ConvertOptions, Grid, ModelObservation, Observer};
use tessera_sim::simulate::scenario::ScenarioFile;
use tessera_sim::simulate::{Report, summary, today};
use tessera_sim::trace::observed::{Bucket, TokenHistogram};

/// How long a computed answer is served before it is computed again.
pub const REFRESH: Duration = Duration::from_secs(15 * 60);
/// The most requests a day may hold for the page to simulate it in-process; above, the page says to run
/// `tessera simulate --prometheus` offline.
pub const MAX_REQUESTS: u64 = 2_000_000;
/// The prompt length assumed: the sidecar reports no prompt-length distribution (only generated tokens per second).
pub const ASSUMED_PROMPT_TOKENS: f64 = 1000.0;
/// The output length assumed where a model's generated-token rate is not known.
pub const ASSUMED_OUTPUT_TOKENS: f64 = 200.0;

/// One model's day, as the page holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct DayModel {
    /// `namespace/name`.
    pub name: String,
    /// `(minute since the epoch, finished requests per second, replicas)`, oldest first; NaN is unknown.
    pub minutes: Vec<(u32, f32, f32)>,
    /// Mean generated tokens per request, when the sidecars report both rates.
    pub mean_output_tokens: Option<f64>,
}

/// The scenario for the day ending at `now_minute` (`None`: no history yet), and what was assumed.
pub fn scenario(
    models: &[DayModel],
    now_minute: u32,
    gpu: &str,
    price_note: &str,
) -> Result<Option<(ScenarioFile, Vec<String>)>, String> {
    let oldest = now_minute.saturating_sub(super::history::POINTS as u32 - 1);
    let first = models
        .iter()
        .filter_map(|m| m.minutes.iter().map(|p| p.0).find(|&t| t >= oldest))
        .min();
    let Some(first) = first else { return Ok(None) };
    if now_minute <= first {
        return Ok(None);
    }
    let grid = Grid {
        start: f64::from(first) * 60.0,
        step: 60.0,
        steps: (now_minute - first) as usize,
    };
    let mut total = 0.0;
    let obs: Vec<ModelObservation> = models
        .iter()
        .map(|m| {
            let mut finished = vec![0.0; grid.steps];
            let mut replicas = vec![0.0; grid.steps + 1];
            for &(minute, rps, reps) in &m.minutes {
                if minute < first || minute > now_minute {
                    continue;
                }
                let k = (minute - first) as usize;
                if reps.is_finite() {
                    replicas[k] = f64::from(reps);
                }
                // The point of minute k is the rate over the minute before it: step k−1.
                if k > 0 && rps.is_finite() && rps > 0.0 {
                    finished[k - 1] = f64::from(rps) * 60.0;
                }
            }
            total += finished.iter().sum::<f64>();
            let one = |mean: f64| TokenHistogram {
                mean,
                buckets: vec![Bucket { le: mean, count: 1.0 }],
            };
            ModelObservation {
                name: m.name.clone(),
                finished,
                replicas,
                prompt_tokens: Some(one(ASSUMED_PROMPT_TOKENS)),
                output_tokens: Some(one(m
                    .mean_output_tokens
                    .unwrap_or(ASSUMED_OUTPUT_TOKENS)
                    .max(1.0))),
                ..ModelObservation::default()
            }
        })
        .collect();
    if total > MAX_REQUESTS as f64 {
        return Err(format!(
            "the last day holds about {total:.0} requests, over the {MAX_REQUESTS} this page simulates in-process: \
             run `tessera simulate --prometheus URL --since 1d` on a workstation instead"
        ));
    }
    let opts = ConvertOptions {
        name: "last-day".into(),
        observer: Observer::AutoscalerPage,
        source: format!("this autoscaler's page history ({price_note})"),
        gpu: gpu.to_string(),
        gpu_reason: "from the GPU memory the sidecars report".into(),
        slo_ttft: Duration::from_secs(2),
        scale_to_zero_after: Duration::from_secs(600),
        presets: BTreeMap::new(),
        max_model_len: None,
        seed: 1,
    };
    let (file, mut assumptions) = convert::scenario(&obs, &grid, &opts).map_err(|e| e.to_string())?;
    assumptions.push(format!(
        "prompt lengths: the sidecars report none, so {ASSUMED_PROMPT_TOKENS:.0} tokens on average is assumed; \
         output lengths from generated tokens per second over requests per second (else {ASSUMED_OUTPUT_TOKENS:.0})"
    ));
    assumptions.push(
        "requests per minute: the page's per-minute finished-request rate (history starts when this autoscaler did)"
            .to_string(),
    );
    Ok(Some((file, assumptions)))
}

/// A computed answer: the HTML fragment and the scenario YAML.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The minute it was computed for.
    pub minute: u32,
    /// The page.
    pub html: String,
    /// The scenario (empty when there was none).
    pub yaml: String,
}

/// The cached answer (one computation per [`REFRESH`]).
#[derive(Debug, Default)]
pub struct Cache {
    answer: Mutex<Option<Answer>>,
}

impl Cache {
    /// The answer for `now_minute`, computed by `compute` when the cached one is older than [`REFRESH`]. The lock
    /// is held while computing, so concurrent requests wait for one computation instead of starting their own.
    pub fn get(&self, now_minute: u32, compute: impl FnOnce() -> Answer) -> Answer {
        let Ok(mut a) = self.answer.lock() else {
            return compute();
        };
        let fresh = a
            .as_ref()
            .is_some_and(|x| now_minute.saturating_sub(x.minute) < (REFRESH.as_secs() / 60) as u32);
        if !fresh {
            *a = Some(compute());
        }
        a.clone().unwrap_or_else(|| Answer {
            minute: now_minute,
            html: String::new(),
            yaml: String::new(),
        })
    }
}

/// `$1.23`, or `−$1.23` where Tessera would cost more.
fn dollars(x: f64) -> String {
    if x < -0.005 {
        format!("−${:.2}", -x)
    } else {
        format!("${:.2}", x.max(0.0))
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Runs the day's scenario and renders the answer.
pub fn compute(models: &[DayModel], now_minute: u32, gpu: &str, price: Option<f64>) -> Answer {
    let (usd, source) = today::price_for(gpu, price);
    let page = |body: String, yaml: String| Answer {
        minute: now_minute,
        html: format!(
            "<!doctype html><html><head><meta charset=\"utf-8\"><title>Tessera — savings over the last day</title>\
             <style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:70em}}table{{border-collapse:collapse}}\
             td,th{{padding:.3em .8em;border-bottom:1px solid #ddd;text-align:right}}td:first-child,th:first-child\
             {{text-align:left}}</style></head><body><p><a href=\"/ui\">← GPU workloads</a></p>\
             <h1>What Tessera would save over the last day</h1>{body}</body></html>"
        ),
        yaml,
    };
    let (file, assumptions) = match scenario(models, now_minute, gpu, &source) {
        Ok(Some(x)) => x,
        Ok(None) => {
            return page(
                "<p>No history yet: come back after a few minutes of observation.</p>".into(),
                String::new(),
            );
        }
        Err(e) => return page(format!("<p>{}</p>", esc(&e)), String::new()),
    };
    let yaml = convert::to_yaml(&file, &assumptions).unwrap_or_default();
    let report: Result<Report, String> = tessera_sim::simulate::scenario::resolve(&file, "last-day", None)
        .map_err(|e| e.to_string())
        .and_then(|sc| tessera_sim::simulate::simulate(&sc, &mut |_, _| {}).map_err(|e| e.to_string()));
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            return page(
                format!("<p>The day could not be simulated: {}</p>", esc(&e)),
                yaml,
            );
        }
    };
    page(render(&report, usd, &source, &assumptions), yaml)
}

/// Per model and in total: today's GPU-hours, Tessera's, and what the difference costs.
pub fn render(r: &Report, usd: f64, source: &str, assumptions: &[String]) -> String {
    let mut o = String::new();
    let today_total: f64 = r.today.iter().flatten().map(|t| t.gpu_hours).sum();
    let Some(t) = r.strategy("tessera") else {
        let _ = write!(o, "<p>Tessera could not run the day:</p><ul>");
        for f in &r.failures {
            let _ = write!(o, "<li>{}</li>", esc(&f.line()));
        }
        o.push_str("</ul>");
        return o;
    };
    let _ = write!(
        o,
        "<p>Over the last {}, the models here held <b>{today_total:.1} GPU-hours</b>; Tessera would hold \
         <b>{:.1}</b> and meet the TTFT objective for {:.1}% of requests: <b>{} saved</b> at ${usd:.2} per \
         GPU-hour ({}). The same numbers as <code>tessera simulate savings.yaml</code> on \
         <a href=\"/ui/savings.yaml\">this scenario</a>.</p>",
        humantime::format_duration(Duration::from_secs(r.duration_secs.round() as u64)),
        t.gpu_hours,
        t.slo_attainment * 100.0,
        dollars((today_total - t.gpu_hours) * usd),
        esc(source)
    );
    o.push_str(
        "<table><tr><th>model</th><th>requests</th><th>today, GPU-hours</th><th>Tessera, GPU-hours (its memory \
         share)</th><th>saved</th><th>what would do</th></tr>",
    );
    for (i, m) in t.models.iter().enumerate() {
        let today = r
            .today
            .get(i)
            .and_then(|x| x.as_ref())
            .map_or(0.0, |x| x.gpu_hours);
        let advice = summary::advice(r, t, i).unwrap_or_default();
        let _ = write!(
            o,
            "<tr><td>{}</td><td>{}</td><td>{today:.2}</td><td>{:.2}</td><td>{}</td><td style=\"text-align:left\">{}</td></tr>",
            esc(&m.model),
            m.requests,
            m.memory_gpu_hours,
            dollars((today - m.memory_gpu_hours) * usd),
            esc(advice.split_once(": ").map_or(advice.as_str(), |x| x.1))
        );
    }
    // What packing leaves empty belongs to no model: its own row, so the column adds up to the total (a page
    // once showed "$0.03 saved" on a model above a total of "$0.00").
    let shares: f64 = t.models.iter().map(|m| m.memory_gpu_hours).sum();
    let empty = (t.gpu_hours - shares).max(0.0);
    let _ = write!(
        o,
        "<tr><td>held with no model in it (what packing leaves empty)</td><td></td><td>0.00</td><td>{empty:.2}</td>\
         <td>{}</td><td></td></tr>",
        dollars(-empty * usd)
    );
    let _ = write!(
        o,
        "<tr><th>total</th><th>{}</th><th>{today_total:.2}</th><th>{:.2}</th><th>{}</th><th></th></tr></table>\
         <p>Per model, Tessera's GPU-hours are its replicas' memory share of the GPUs they were packed on; the row \
         above the total is the rest of those GPUs. \"What would do\" is the simulated day's, from its assumed \
         prompt lengths: the live memory recommendation of each replica is on <a href=\"/ui\">/ui</a>.</p>\
         <h2>What the page's history cannot say, and what was assumed</h2><ul>",
        t.requests,
        t.gpu_hours,
        dollars((today_total - t.gpu_hours) * usd)
    );
    for a in assumptions {
        let _ = write!(o, "<li>{}</li>", esc(a));
    }
    o.push_str("</ul>");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day() -> Vec<DayModel> {
        let base = 29_000_000;
        vec![
            DayModel {
                name: "ml/chat".into(),
                minutes: (0..30).map(|i| (base + i, 2.0, 1.0)).collect(),
                mean_output_tokens: Some(150.0),
            },
            DayModel {
                name: "ml/tools".into(),
                minutes: (0..30)
                    .map(|i| (base + i, if i < 5 { 0.5 } else { 0.0 }, 1.0))
                    .collect(),
                mean_output_tokens: None,
            },
        ]
    }

    /// The day, the minute the page is asked at, and the scenario it converts to with its assumptions.
    fn day_scenario() -> (Vec<DayModel>, u32, ScenarioFile, Vec<String>) {
        let models = day();
        let now = 29_000_000 + 29;
        let (file, assumptions) = scenario(&models, now, "a100-80gb", "list")
            .expect("converts")
            .expect("has history");
        (models, now, file, assumptions)
    }

    #[test]
    fn the_pages_day_is_the_scenario_simulate_runs_and_says_what_it_saved() {
        let (models, now, file, assumptions) = day_scenario();
        assert_eq!(file.models.len(), 2);
        let today: f64 = file
            .models
            .iter()
            .filter_map(|m| m.today.as_ref())
            .map(|t| t.gpu_hours)
            .sum();
        assert!((today - 2.0 * 29.0 / 60.0).abs() < 1e-9, "{today}");
        assert!(assumptions.iter().any(|a| a.contains("prompt lengths")));
        let a = compute(&models, now, "a100-80gb", Some(2.0));
        assert!(
            a.html.contains("What Tessera would save") && a.html.contains("ml/chat"),
            "{}",
            a.html
        );
        assert!(a.html.contains("$2.00 per GPU-hour"), "{}", a.html);
        // The served scenario runs in `tessera simulate` and gives the page's Tessera GPU-hours.
        let back = ScenarioFile::parse(&a.yaml, "savings.yaml").expect("parses");
        let sc = tessera_sim::simulate::scenario::resolve(&back, "savings.yaml", None).expect("resolves");
        let r = tessera_sim::simulate::simulate(&sc, &mut |_, _| {}).expect("runs");
        let t = r.strategy("tessera").expect("tessera ran");
        assert!(
            a.html.contains(&format!("<b>{:.1}</b>", t.gpu_hours)),
            "{}",
            a.html
        );
    }

    /// The table's rows add up to its total (models' memory shares plus what packing leaves empty), and the page's
    /// assumptions describe the page's own history, not a Prometheus it never read.
    #[test]
    fn the_rows_add_up_and_the_assumptions_are_the_pages() {
        let (models, now, file, assumptions) = day_scenario();
        assert!(
            assumptions
                .iter()
                .all(|a| !a.contains("Prometheus") && !a.contains("histograms")),
            "{assumptions:?}"
        );
        assert!(
            file.description.starts_with("Observed by this autoscaler's page"),
            "{}",
            file.description
        );
        let a = compute(&models, now, "a100-80gb", Some(1.0));
        // The "saved" column: every row's dollars, then the total's.
        let cells: Vec<f64> = a
            .html
            .split("<tr>")
            .skip(2)
            .filter_map(|row| {
                let cell = row.split("<t").nth(5)?;
                let v = cell.split_once('>')?.1.split('<').next()?;
                let neg = v.starts_with('−');
                let x: f64 = v.trim_start_matches('−').trim_start_matches('$').parse().ok()?;
                Some(if neg { -x } else { x })
            })
            .collect();
        assert_eq!(cells.len(), 4, "two models, the empty row, the total: {}", a.html);
        let (rows, total) = cells.split_at(3);
        assert!((rows.iter().sum::<f64>() - total[0]).abs() < 0.02, "{cells:?}");
    }

    #[test]
    fn no_history_and_too_much_history_say_so() {
        assert_eq!(scenario(&[], 10, "a100-80gb", ""), Ok(None));
        let busy = vec![DayModel {
            name: "ml/busy".into(),
            minutes: (0..1440).map(|i| (i, 100.0, 10.0)).collect(),
            mean_output_tokens: None,
        }];
        let err = scenario(&busy, 1439, "a100-80gb", "").expect_err("too many");
        assert!(err.contains("tessera simulate --prometheus"), "{err}");
        assert_eq!(crate::ui::view::gpu_for_memory(Some(40_960)), "a100-40gb");
        assert_eq!(crate::ui::view::gpu_for_memory(None), "a100-80gb");
    }
}
