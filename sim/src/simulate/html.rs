//! The self-contained HTML report: a summary table and inline SVG charts, no scripts and no network, so it
//! opens offline in any browser and can be attached to a ticket as one file.

use std::fmt::Write as _;

use super::report::{Report, StrategyReport};

/// One summary row: how to print a strategy's value.
type Cell = Box<dyn Fn(&StrategyReport) -> String>;

const COLORS: &[&str] = &[
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
    "#17becf",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// One line of a chart: a name, a colour, and points (a `None` y breaks the line).
struct Line<'a> {
    name: &'a str,
    color: &'a str,
    points: Vec<(f64, Option<f64>)>,
}

/// One line per strategy, coloured by its position in the report.
fn strategy_lines<'a>(
    r: &'a Report,
    points: impl Fn(&StrategyReport) -> Vec<(f64, Option<f64>)>,
) -> Vec<Line<'a>> {
    r.strategies
        .iter()
        .enumerate()
        .map(|(i, st)| Line {
            name: &st.strategy,
            color: COLORS[i % COLORS.len()],
            points: points(st),
        })
        .collect()
}

/// A line chart as an SVG element. Step lines for counts (`step`), straight segments otherwise.
fn chart(title: &str, y_label: &str, lines: &[Line<'_>], x_max: f64, step: bool) -> String {
    let (w, h) = (860.0, 260.0);
    let (left, right, top, bottom) = (56.0, 170.0, 28.0, 34.0);
    let pw = w - left - right;
    let ph = h - top - bottom;
    let y_max = lines
        .iter()
        .flat_map(|l| l.points.iter().filter_map(|p| p.1))
        .fold(0.0_f64, f64::max)
        .max(1e-9);
    let y_top = nice_ceiling(y_max);
    let x = |v: f64| left + pw * (v / x_max.max(1e-9));
    let y = |v: f64| top + ph * (1.0 - v / y_top);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{t}">"#,
        t = esc(title)
    );
    let _ = write!(
        s,
        r#"<text x="{left}" y="18" font-size="14" font-weight="bold">{}</text>"#,
        esc(title)
    );
    for i in 0..=4 {
        let v = y_top * f64::from(i) / 4.0;
        let yy = y(v);
        let _ = write!(
            s,
            r##"<line x1="{left}" x2="{}" y1="{yy:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" font-size="11" text-anchor="end">{}</text>"##,
            left + pw,
            left - 6.0,
            yy + 4.0,
            fmt_num(v)
        );
    }
    let minutes = x_max / 60.0;
    let tick = if minutes > 240.0 {
        60.0
    } else if minutes > 60.0 {
        15.0
    } else {
        10.0
    };
    let mut t = 0.0;
    while t <= minutes + 1e-9 {
        let xx = x(t * 60.0);
        let _ = write!(
            s,
            r#"<text x="{xx:.1}" y="{:.1}" font-size="11" text-anchor="middle">{t:.0}</text>"#,
            top + ph + 16.0
        );
        t += tick;
    }
    let _ = write!(
        s,
        r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle">minutes</text><text x="12" y="{:.1}" font-size="11" transform="rotate(-90 12 {:.1})" text-anchor="middle">{}</text>"#,
        left + pw / 2.0,
        h - 4.0,
        top + ph / 2.0,
        top + ph / 2.0,
        esc(y_label)
    );
    for (i, l) in lines.iter().enumerate() {
        let mut d = String::new();
        let mut pen_down = false;
        let mut prev_y = None;
        for &(px, py) in &l.points {
            match py {
                Some(v) => {
                    let (xx, yy) = (x(px), y(v));
                    if !pen_down {
                        let _ = write!(d, "M{xx:.1},{yy:.1}");
                        pen_down = true;
                    } else if step {
                        let _ = write!(d, "H{xx:.1}V{yy:.1}");
                    } else {
                        let _ = write!(d, "L{xx:.1},{yy:.1}");
                    }
                    prev_y = Some(yy);
                }
                None => pen_down = false,
            }
        }
        let _ = prev_y;
        let _ = write!(
            s,
            r#"<path d="{d}" fill="none" stroke="{}" stroke-width="1.8"/>"#,
            l.color
        );
        let ly = top + 14.0 * i as f64 + 6.0;
        let _ = write!(
            s,
            r#"<rect x="{:.1}" y="{:.1}" width="12" height="3" fill="{}"/><text x="{:.1}" y="{:.1}" font-size="11">{}</text>"#,
            left + pw + 12.0,
            ly - 3.0,
            l.color,
            left + pw + 28.0,
            ly + 1.0,
            esc(l.name)
        );
    }
    s.push_str("</svg>");
    s
}

fn nice_ceiling(v: f64) -> f64 {
    let mag = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * mag >= v {
            return m * mag;
        }
    }
    10.0 * mag
}

fn fmt_num(v: f64) -> String {
    if v >= 100.0 || v == v.round() {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn pct(v: f64) -> String {
    format!("{:.1}%", v * 100.0)
}

fn opt_secs(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |s| format!("{s:.3} s"))
}

/// Renders the report as one HTML page.
pub fn render(r: &Report) -> String {
    render_priced(r, &super::summary::Price::for_report(r, None))
}

/// [`render`] with the price the run was given (`--gpu-hour-price`): the page opens with the first screen's table,
/// the cost against today's setup, and the advice per model, then the charts and the details.
pub fn render_priced(r: &Report, price: &super::summary::Price) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Tessera what-if: {}</title>\
         <style>body{{font-family:system-ui,sans-serif;margin:24px;max-width:1100px;color:#222}}\
         table{{border-collapse:collapse;margin:8px 0 20px}}td,th{{border:1px solid #ccc;padding:4px 10px;text-align:right}}\
         th:first-child,td:first-child{{text-align:left}}code{{background:#f4f4f4;padding:1px 4px}}</style></head><body>",
        esc(&r.scenario)
    );
    let total: u64 = r.requests_per_model.iter().sum();
    let _ = write!(
        s,
        "<h1>Tessera what-if simulation: {}</h1><p>{}</p><p>{} models on <b>{}</b>, {:.0} minutes simulated, {} \
         requests, seed {}. Every strategy saw the same arrivals (digest <code>{}</code>). Lower bound: <b>{:.2} \
         GPU-hours</b> for a policy meeting every TTFT objective with cold starts free, {:.2} through its cold \
         starts, {:.2} for one meeting it for {:.0}% of requests through its cold starts; sharing model \
         <code>{}</code>.</p>",
        esc(&r.scenario),
        esc(&r.description),
        r.models.len(),
        esc(&r.gpu),
        r.duration_secs / 60.0,
        total,
        r.seed,
        r.strategies.first().map_or("", |x| x.arrival_digest.as_str()),
        r.lower_bound_gpu_hours,
        r.lower_bound_with_cold_starts_gpu_hours,
        r.lower_bound_at_goal_gpu_hours,
        r.attainment_goal * 100.0,
        esc(&r.sharing_model)
    );
    if let Some(note) = r.sleep_mode_note() {
        let _ = write!(s, "<p><b>Not yet in the controller:</b> {}</p>", esc(&note));
    }
    at_a_glance(&mut s, r, price);
    s.push_str("<h2>Summary</h2><table><tr><th></th>");
    for st in &r.strategies {
        let _ = write!(s, "<th>{}</th>", esc(&st.strategy));
    }
    s.push_str("</tr>");
    let rows: Vec<(&str, Cell)> = vec![
        ("GPU-hours", Box::new(|x| format!("{:.2}", x.gpu_hours))),
        ("× lower bound", {
            let bound = r.lower_bound_gpu_hours;
            Box::new(move |x| super::report::times(x.gpu_hours, bound))
        }),
        ("× bound at goal", {
            let bound = r.lower_bound_at_goal_gpu_hours;
            Box::new(move |x| super::report::times(x.gpu_hours, bound))
        }),
        (
            "GPUs held, mean / peak",
            Box::new(|x| format!("{:.1} / {}", x.gpus_mean, x.gpus_peak)),
        ),
        (
            "GPU memory used (held GPUs)",
            Box::new(|x| pct(x.memory_used_ratio)),
        ),
        (
            "GPU memory reserved (held GPUs)",
            Box::new(|x| pct(x.memory_reserved_ratio)),
        ),
        ("GPU compute busy (held GPUs)", Box::new(|x| pct(x.compute_ratio))),
        (
            "GPU compute allocated (held GPUs)",
            Box::new(|x| pct(x.compute_allocated_ratio)),
        ),
        ("TTFT p50", Box::new(|x| opt_secs(x.ttft_p50))),
        ("TTFT p95", Box::new(|x| opt_secs(x.ttft_p95))),
        ("TTFT p99", Box::new(|x| opt_secs(x.ttft_p99))),
        (
            "TTFT SLO attainment",
            Box::new(|x| format!("{:.2}%", x.slo_attainment * 100.0)),
        ),
        (
            "cold starts (from zero)",
            Box::new(|x| format!("{} ({})", x.cold_starts, x.starts_from_zero)),
        ),
        (
            "requests held at activator",
            Box::new(|x| x.held_requests.to_string()),
        ),
        (
            "added latency mean / max",
            Box::new(|x| format!("{:.1} s / {:.1} s", x.held_mean_secs, x.held_max_secs)),
        ),
        ("preemptions", Box::new(|x| x.preemptions.to_string())),
        ("requests failed", Box::new(|x| x.failed.to_string())),
    ];
    for (label, f) in &rows {
        let _ = write!(s, "<tr><td>{label}</td>");
        for st in &r.strategies {
            let _ = write!(s, "<td>{}</td>", esc(&f(st)));
        }
        s.push_str("</tr>");
    }
    s.push_str("</table>");

    let x_max = r.duration_secs;
    s.push_str("<h2>GPUs held over time</h2>");
    let lines = strategy_lines(r, |st| {
        st.series
            .t
            .iter()
            .zip(&st.series.gpus)
            .map(|(&t, &g)| (t, Some(f64::from(g))))
            .collect()
    });
    s.push_str(&chart("GPUs held", "GPUs", &lines, x_max, true));

    s.push_str("<h2>Time to first token over time</h2><p>p95 of the requests arriving in each interval.</p>");
    let lines = strategy_lines(r, |st| {
        st.series
            .ttft_t
            .iter()
            .zip(&st.series.ttft_p95)
            .map(|(&t, &v)| (t, v))
            .collect()
    });
    s.push_str(&chart("TTFT p95", "seconds", &lines, x_max, false));

    s.push_str("<h2>Replicas per model</h2>");
    for st in &r.strategies {
        let lines: Vec<Line<'_>> = r
            .models
            .iter()
            .enumerate()
            .map(|(m, name)| Line {
                name,
                color: COLORS[m % COLORS.len()],
                points: st
                    .series
                    .t
                    .iter()
                    .zip(st.series.replicas.get(m).map(Vec::as_slice).unwrap_or_default())
                    .map(|(&t, &n)| (t, Some(f64::from(n))))
                    .collect(),
            })
            .collect();
        s.push_str(&chart(
            &format!("replicas — {}", st.strategy),
            "replicas",
            &lines,
            x_max,
            true,
        ));
    }

    s.push_str("<h2>Per model</h2>");
    for st in &r.strategies {
        let _ = write!(
            s,
            "<h3>{} — {}</h3><table><tr><th>model</th><th>requests</th><th>failed</th><th>TTFT p95</th>\
             <th>SLO met</th><th>replicas mean / max</th><th>cold starts</th><th>preemptions</th><th>KV GiB</th>\
             <th>GPU MiB</th><th>compute</th><th>held by (share of decisions)</th><th>next unit of capacity</th></tr>",
            esc(&st.strategy),
            esc(&st.description)
        );
        for m in &st.models {
            let _ = write!(
                s,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.2}%</td><td>{:.2} / {}</td><td>{}</td>\
                 <td>{}</td><td>{:.1}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&m.model),
                m.requests,
                m.failed,
                opt_secs(m.ttft_p95),
                m.slo_attainment * 100.0,
                m.replicas_mean,
                match m.surge_max {
                    0 => m.replicas_max.to_string(),
                    s => format!("{} (+{s} surging)", m.replicas_max),
                },
                m.cold_starts,
                m.preemptions,
                m.kv_cache_gib,
                m.gpu_memory_mib,
                m.compute_shares(),
                esc(&m.held_by_ranked(usize::MAX).unwrap_or_else(|| "—".to_string())),
                esc(m.next_unit.as_deref().unwrap_or("—"))
            );
        }
        let _ = write!(s, "</table><p>{}</p>", esc(&r.where_memory_goes(st)));
    }
    s.push_str("<h2>Static sizing</h2><table><tr><th>model</th><th>replicas</th><th>attainment alone</th><th>why</th></tr>");
    for z in &r.static_sizing {
        let _ = write!(
            s,
            "<tr><td>{}</td><td>{}</td><td>{:.2}%</td><td style=\"text-align:left\">{}</td></tr>",
            esc(&z.model),
            z.replicas,
            z.attainment * 100.0,
            esc(&z.reason)
        );
    }
    let _ = writeln!(
        s,
        "</table><p><code>{}</code></p></body></html>",
        esc(&r.summary_line())
    );
    s
}

/// The first screen of the terminal output as HTML: per strategy GPU-hours, cost, saved vs today, TTFT
/// attainment; strategies that could not run, with vLLM's reason; what to do per model.
fn at_a_glance(s: &mut String, r: &Report, price: &super::summary::Price) {
    let today = super::summary::today(r);
    let usd = |h: f64| h * price.usd_per_gpu_hour;
    let _ = write!(
        s,
        "<h2>At a glance</h2><table><tr><th>strategy</th><th>GPU-hours</th><th>cost</th><th>saved vs today</th>\
         <th>TTFT within SLO</th><th>{:.0}% goal</th></tr>",
        r.attainment_goal * 100.0
    );
    if let Some((h, "observed")) = today {
        let _ = write!(
            s,
            "<tr><td>today (observed)</td><td>{h:.2}</td><td>${:.2}</td><td>—</td><td>—</td><td>—</td></tr>",
            usd(h)
        );
    }
    for st in &r.strategies {
        let saved = match super::summary::saving(today, st.gpu_hours) {
            Some((hours, percent)) => format!("${:.2} ({percent:.0}%)", usd(hours)),
            None => "—".to_string(),
        };
        let _ = write!(
            s,
            "<tr><td>{}</td><td>{:.2}</td><td>${:.2}</td><td>{saved}</td><td>{:.1}%</td><td>{}</td></tr>",
            esc(&st.strategy),
            st.gpu_hours,
            usd(st.gpu_hours),
            st.slo_attainment * 100.0,
            if st.slo_attainment >= r.attainment_goal {
                "met"
            } else {
                "<b>missed</b>"
            }
        );
    }
    for f in &r.failures {
        let _ = write!(
            s,
            "<tr><td>{}</td><td colspan=\"5\" style=\"text-align:left\">unable: {}</td></tr>",
            esc(&f.strategy),
            esc(&f.line())
        );
    }
    let _ = write!(
        s,
        "</table><p>${:.2} per GPU-hour ({}). Today: {}.</p>",
        price.usd_per_gpu_hour,
        esc(&price.source),
        match today {
            Some((_, "observed")) => "the replicas the metrics showed, one whole GPU each",
            Some(_) => "the static strategy, a whole GPU per replica fixed for the peak",
            None => "not known",
        }
    );
    if let Some(t) = r.strategy("tessera") {
        s.push_str("<h3>What to do</h3><ul>");
        for i in 0..t.models.len() {
            if let Some(line) = super::summary::advice(r, t, i) {
                let _ = write!(s, "<li>{}</li>", esc(&line));
            }
        }
        s.push_str("</ul>");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_ceilings() {
        assert_eq!(nice_ceiling(3.2), 5.0);
        assert_eq!(nice_ceiling(10.0), 10.0);
        assert_eq!(nice_ceiling(0.12), 0.2);
    }

    #[test]
    fn escapes_markup() {
        assert_eq!(esc("<a&\"b\">"), "&lt;a&amp;&quot;b&quot;&gt;");
    }
}
