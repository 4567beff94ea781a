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
    /// Its dash pattern (`stroke-dasharray`), `None` solid: past the palette's ten colours a line repeats a colour
    /// with a dash, so no two lines of a chart look alike.
    dash: Option<&'static str>,
    points: Vec<(f64, Option<f64>)>,
}

/// The `i`-th line's colour and dash: the palette's colours solid, then dashed, then dotted.
fn style(i: usize) -> (&'static str, Option<&'static str>) {
    const DASHES: &[Option<&str>] = &[None, Some("7 3"), Some("2 2")];
    (
        COLORS[i % COLORS.len()],
        DASHES[(i / COLORS.len()) % DASHES.len()],
    )
}

/// How a chart's y axis maps values.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Axis {
    /// From 0 to a round ceiling: counts.
    Linear,
    /// Decades, from the one below the smallest positive value to the one above the largest: latencies, where one
    /// replica's cold start (tens of seconds) beside everyone else's tenths would flatten every other line at 0.
    Log,
}

/// One line per strategy, coloured by its position in the report.
fn strategy_lines<'a>(
    r: &'a Report,
    points: impl Fn(&StrategyReport) -> Vec<(f64, Option<f64>)>,
) -> Vec<Line<'a>> {
    r.strategies
        .iter()
        .enumerate()
        .map(|(i, st)| {
            let (color, dash) = style(i);
            Line {
                name: &st.strategy,
                color,
                dash,
                points: points(st),
            }
        })
        .collect()
}

/// A line chart as an SVG element. Step lines for counts (`step`), straight segments otherwise.
fn chart(title: &str, y_label: &str, lines: &[Line<'_>], x_max: f64, step: bool, axis: Axis) -> String {
    let (w, h) = (860.0, 260.0);
    let (left, right, top, bottom) = (56.0, 170.0, 28.0, 34.0);
    let pw = w - left - right;
    let ph = h - top - bottom;
    let values = || lines.iter().flat_map(|l| l.points.iter().filter_map(|p| p.1));
    let y_max = values().fold(0.0_f64, f64::max).max(1e-9);
    let (y_bottom, y_top, ticks) = match axis {
        Axis::Linear => {
            let top = nice_ceiling(y_max);
            (
                0.0,
                top,
                (0..=4).map(|i| top * f64::from(i) / 4.0).collect::<Vec<_>>(),
            )
        }
        Axis::Log => {
            let (low, high) = decades(values());
            (low, high, log_ticks(low, high))
        }
    };
    let x = |v: f64| left + pw * (v / x_max.max(1e-9));
    let y = |v: f64| match axis {
        Axis::Linear => top + ph * (1.0 - v / y_top),
        Axis::Log => {
            let v = v.clamp(y_bottom, y_top);
            top + ph * (1.0 - (v / y_bottom).log10() / (y_top / y_bottom).log10())
        }
    };
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
    for v in ticks {
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
        let dash = l
            .dash
            .map(|d| format!(r#" stroke-dasharray="{d}""#))
            .unwrap_or_default();
        let _ = write!(
            s,
            r#"<path d="{d}" fill="none" stroke="{}" stroke-width="1.8"{dash}/>"#,
            l.color
        );
        let ly = top + 14.0 * i as f64 + 6.0;
        let _ = write!(
            s,
            r#"<line x1="{:.1}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="{}" stroke-width="2.5"{dash}/><text x="{:.1}" y="{:.1}" font-size="11">{}</text>"#,
            left + pw + 10.0,
            left + pw + 26.0,
            ly - 1.5,
            ly - 1.5,
            l.color,
            left + pw + 30.0,
            ly + 1.0,
            esc(l.name)
        );
    }
    s.push_str("</svg>");
    s
}

/// The decades a log axis spans: from the power of ten at or below the smallest positive value to the one at or
/// above the largest, at least one decade, and not below 1 ms (a TTFT chart has nothing to show under it).
fn decades(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| *v > 0.0)
        .fold((f64::INFINITY, 0.0_f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if hi == 0.0 {
        return (0.01, 1.0);
    }
    let low = 10f64.powf(lo.max(1e-3).log10().floor());
    let high = 10f64.powf(hi.log10().ceil()).max(low * 10.0);
    (low, high)
}

/// A log axis's ticks: each decade from `low` to `high`, and the 2 and 5 within each when it spans two decades or
/// fewer (so a short span still reads).
fn log_ticks(low: f64, high: f64) -> Vec<f64> {
    let spans = (high / low).log10().round() as i32;
    let mut ticks = Vec::new();
    for k in 0..=spans {
        let d = low * 10f64.powi(k);
        ticks.push(d);
        if spans <= 2 && k < spans {
            ticks.extend([2.0 * d, 5.0 * d]);
        }
    }
    ticks
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
    } else if v >= 0.01 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
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
    intro(&mut s, r);
    at_a_glance(&mut s, r, price);
    summary_table(&mut s, r);
    charts(&mut s, r);
    per_model_tables(&mut s, r);
    static_sizing_table(&mut s, r);
    let _ = writeln!(s, "<p><code>{}</code></p></body></html>", esc(&r.summary_line()));
    s
}

/// The page's head and the run in a paragraph: the scenario, the arrivals, the lower bounds.
fn intro(s: &mut String, r: &Report) {
    let _ = write!(
        s,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Tessera what-if: {}</title>\
         <style>body{{font-family:system-ui,sans-serif;margin:24px;max-width:1100px;color:#222}}\
         table{{border-collapse:collapse;margin:8px 0 20px}}td,th{{border:1px solid #ccc;padding:4px 10px;text-align:right}}\
         th:first-child,td:first-child{{text-align:left}}td{{white-space:nowrap}}td.prose{{white-space:normal;text-align:left;min-width:16em}}\
         code{{background:#f4f4f4;padding:1px 4px}}</style></head><body>",
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
}

/// Every strategy's totals side by side, one row per number.
fn summary_table(s: &mut String, r: &Report) {
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
}

/// GPUs held and TTFT p95 over time for every strategy, then each strategy's replicas per model.
fn charts(s: &mut String, r: &Report) {
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
    s.push_str(&chart("GPUs held", "GPUs", &lines, x_max, true, Axis::Linear));

    s.push_str(
        "<h2>Time to first token over time</h2><p>p95 of the requests arriving in each interval, on a log scale (a \
         cold start's tens of seconds beside everyone else's tenths would flatten the other lines at 0).</p>",
    );
    let lines = strategy_lines(r, |st| {
        st.series
            .ttft_t
            .iter()
            .zip(&st.series.ttft_p95)
            .map(|(&t, &v)| (t, v))
            .collect()
    });
    s.push_str(&chart("TTFT p95", "seconds", &lines, x_max, false, Axis::Log));

    s.push_str("<h2>Replicas per model</h2>");
    for st in &r.strategies {
        let lines: Vec<Line<'_>> = r
            .models
            .iter()
            .enumerate()
            .map(|(m, name)| Line {
                name,
                color: style(m).0,
                dash: style(m).1,
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
            Axis::Linear,
        ));
    }
}

/// Per strategy, one row per model, and where its memory went.
fn per_model_tables(s: &mut String, r: &Report) {
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
                 <td>{}</td><td>{:.1}</td><td>{}</td><td>{}</td><td class=\"prose\">{}</td><td class=\"prose\">{}</td></tr>",
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
}

fn static_sizing_table(s: &mut String, r: &Report) {
    s.push_str("<h2>Static sizing</h2><table><tr><th>model</th><th>replicas</th><th>attainment alone</th><th>why</th></tr>");
    for z in &r.static_sizing {
        let _ = write!(
            s,
            "<tr><td>{}</td><td>{}</td><td>{:.2}%</td><td class=\"prose\">{}</td></tr>",
            esc(&z.model),
            z.replicas,
            z.attainment * 100.0,
            esc(&z.reason)
        );
    }
    s.push_str("</table>");
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
            "<tr><td>{}</td><td colspan=\"5\" class=\"prose\">unable: {}</td></tr>",
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
    fn a_log_axis_spans_whole_decades_around_the_values() {
        // One 115 s spike beside tenths of a second: the axis runs 0.1 to 1000 s, so the tenths sit a third of the
        // way up instead of at 0.
        assert_eq!(decades([0.12, 0.4, 115.0].into_iter()), (0.1, 1000.0));
        assert_eq!(log_ticks(0.1, 1000.0), vec![0.1, 1.0, 10.0, 100.0, 1000.0]);
        // A short span gets 2 and 5 within each decade; zeros and no data do not break it.
        assert_eq!(decades([0.0, 0.3, 0.7].into_iter()), (0.1, 1.0));
        assert_eq!(log_ticks(0.1, 1.0), vec![0.1, 0.2, 0.5, 1.0]);
        assert_eq!(decades(std::iter::empty()), (0.01, 1.0));
        assert_eq!(decades([0.000_2].into_iter()), (0.001, 0.01));
    }

    #[test]
    fn lines_past_the_palette_are_dashed_so_none_look_alike() {
        let styles: Vec<_> = (0..2 * COLORS.len()).map(style).collect();
        for (i, a) in styles.iter().enumerate() {
            assert!(
                styles[i + 1..].iter().all(|b| b != a),
                "line {i} looks like a later one"
            );
        }
        assert_eq!(style(0).1, None);
        assert!(style(COLORS.len()).1.is_some());
    }

    #[test]
    fn the_ttft_chart_puts_a_spike_and_the_tenths_on_one_readable_axis() {
        let line = |name, last| Line {
            name,
            color: "#000",
            dash: None,
            points: vec![(0.0, Some(0.2)), (60.0, Some(last))],
        };
        let lines = [line("calm", 0.4), line("spike", 115.0)];
        // The calm line's y coordinates: "M{x},{y}L{x},{y}".
        let ys = |svg: &str| -> Vec<f64> {
            let d = svg
                .split("<path d=\"M")
                .nth(1)
                .and_then(|p| p.split('"').next())
                .expect("a first path");
            d.split('L')
                .filter_map(|xy| xy.split(',').nth(1)?.parse().ok())
                .collect()
        };
        // On a linear axis up to 200 s, 0.2 s and 0.4 s are the same pixel; on decades they are apart.
        let linear = ys(&chart("TTFT p95", "seconds", &lines, 60.0, false, Axis::Linear));
        let log = ys(&chart("TTFT p95", "seconds", &lines, 60.0, false, Axis::Log));
        assert!((linear[0] - linear[1]).abs() < 1.0, "linear {linear:?}");
        assert!((log[0] - log[1]).abs() > 10.0, "log {log:?}");
        let svg = chart("TTFT p95", "seconds", &lines, 60.0, false, Axis::Log);
        assert!(
            svg.contains(">1000<") && svg.contains(">0.10<"),
            "decade ticks: {svg}"
        );
    }

    #[test]
    fn escapes_markup() {
        assert_eq!(esc("<a&\"b\">"), "&lt;a&amp;&quot;b&quot;&gt;");
    }
}
