//! The page itself: one server-rendered HTML document with inline CSS, inline SVG charts and a few lines of
//! inline JavaScript to sort the tables. Nothing is fetched at view time (no CDN, no fonts, no scripts from
//! elsewhere), so it works behind `kubectl port-forward` on an air-gapped cluster.

use std::fmt::Write as _;

use k8s_openapi::jiff;

use super::history::{History, POINTS};
use super::view::{GpuRow, ModelObservation, ModelRow, Overview, Sharing, Signals, View};
use tessera_core::pack::GPU_COMPUTE_MILLI;

/// Escapes text for HTML element content and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn time(ms: u64) -> String {
    jiff::Timestamp::from_millisecond(i64::try_from(ms).unwrap_or(i64::MAX))
        .map(|t| t.strftime("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_else(|_| "?".to_owned())
}

/// `$12,345` (whole units, thousands separated).
pub fn money(x: f64) -> String {
    let n = x.round().max(0.0) as u64;
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    format!("${out}")
}

fn gib(mib: u64) -> String {
    let g = mib as f64 / 1024.0;
    if g >= 100.0 {
        format!("{g:.0} GiB")
    } else {
        format!("{g:.1} GiB")
    }
}

fn pct(x: Option<f64>) -> String {
    x.map_or_else(|| "—".to_owned(), |v| format!("{:.0}%", v * 100.0))
}

fn num(x: Option<f64>, digits: usize) -> String {
    x.map_or_else(|| "—".to_owned(), |v| format!("{v:.digits$}"))
}

fn secs(x: Option<f64>) -> String {
    match x {
        None => "—".to_owned(),
        Some(v) if v < 1.0 => format!("{:.0} ms", v * 1000.0),
        Some(v) => format!("{v:.2} s"),
    }
}

/// A sort key for a cell: numbers sort numerically, unknowns last.
fn key(x: Option<f64>) -> String {
    x.filter(|v| v.is_finite())
        .map_or_else(|| "-1e300".to_owned(), |v| format!("{v}"))
}

const CSS: &str = r#"
:root{--fg:#1d2430;--mute:#5f6b7a;--line:#d9dee5;--bg:#f6f7f9;--card:#fff;--good:#137333;--warn:#b3261e;--accent:#1a56db;--held:#8a94a6}
*{box-sizing:border-box}body{margin:0;font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:var(--bg)}
header{display:flex;align-items:baseline;gap:16px;padding:14px 24px;background:#111827;color:#fff;flex-wrap:wrap}
header h1{font-size:18px;margin:0}header .meta{color:#c7ced9;font-size:13px}
header a{color:#fff;text-decoration:underline;text-underline-offset:2px}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;background:#374151;color:#fff}
main{padding:16px 24px;max-width:1920px}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(220px,1fr));gap:12px;margin-bottom:12px}
.card{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:12px 14px}
.card .label{color:var(--mute);font-size:12px;text-transform:uppercase;letter-spacing:.04em}
.card .big{font-size:32px;font-weight:650;line-height:1.15}.card .sub{color:var(--mute);font-size:13px}
.card.save{border-color:#9bd3ae;background:#f0faf3}.card.save .big{color:var(--good)}
.bar{height:10px;background:#eef1f5;border-radius:5px;position:relative;overflow:hidden;margin:6px 0 2px}
.bar span{position:absolute;top:0;bottom:0;left:0;border-radius:5px}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));gap:12px;margin-bottom:16px}
h2{font-size:16px;margin:18px 0 8px}
.note{color:var(--mute);font-size:13px;margin:4px 0 10px}
table{border-collapse:collapse;width:100%;background:var(--card);border:1px solid var(--line);border-radius:8px;font-size:13px}
th,td{padding:5px 7px;border-bottom:1px solid var(--line);text-align:right;white-space:nowrap;vertical-align:top}
th{background:#eef1f5;font-weight:600;cursor:pointer;user-select:none;position:sticky;top:0}
th:first-child,td:first-child,td.l,th.l{text-align:left}
th.sorted-asc::after{content:" ▲"}th.sorted-desc::after{content:" ▼"}
td .s{display:block;color:var(--mute);font-size:12px}
.over{color:var(--warn);font-weight:600}.ok{color:var(--good)}.mute{color:var(--mute)}
.why{white-space:normal;min-width:180px;max-width:260px;text-align:left;font-size:12px}
th{white-space:normal}td .s{white-space:normal}td.class{max-width:170px}
.scroll{overflow-x:auto}
th .s{display:block;color:var(--mute);font-size:11px}
th .s{font-weight:400}
.legend span{margin-right:12px;font-size:12px;color:var(--mute)}.legend i{display:inline-block;width:10px;height:3px;margin-right:4px;vertical-align:middle}
svg text{font-size:10px;fill:#5f6b7a}
.cls{display:inline-block;padding:0 7px;border-radius:9px;font-size:12px;background:#eef1f5}
.cls-realtime{background:#e0ebff;color:#1a56db}.cls-batch{background:#efe7fb;color:#6b3fa0}
.cls-nearRealtime{background:#fff3d6;color:#8a5a00}
"#;

const JS: &str = r#"
document.querySelectorAll('table.sortable').forEach(function(t){
  t.querySelectorAll('th').forEach(function(th,i){th.addEventListener('click',function(){
    var asc=!th.classList.contains('sorted-asc');
    t.querySelectorAll('th').forEach(function(h){h.classList.remove('sorted-asc','sorted-desc')});
    th.classList.add(asc?'sorted-asc':'sorted-desc');
    var b=t.tBodies[0],rows=Array.prototype.slice.call(b.rows);
    rows.sort(function(x,y){var a=x.cells[i].dataset.v,c=y.cells[i].dataset.v,na=parseFloat(a),nc=parseFloat(c);
      var r=(!isNaN(na)&&!isNaN(nc))?na-nc:String(a).localeCompare(String(c));return asc?r:-r});
    rows.forEach(function(r){b.appendChild(r)});
  })});
});
// #sort=N (ascending) or #sort=-N (descending) sorts the models table by column N on load: shareable views.
(function(){var m=/^#sort=(-?)(\d+)$/.exec(location.hash),t=document.getElementById('models');
  if(!m||!t)return;var th=t.querySelectorAll('th')[+m[2]];if(!th)return;th.click();if(m[1])th.click();})();
// #layout records how many pixels the models table overflows its box (0: no sideways scroll) on <body>.
(function(){if(location.hash!=='#layout')return;var w=document.querySelector('.scroll');if(!w)return;
  document.body.setAttribute('data-models-overflow',String(Math.max(0,w.scrollWidth-w.clientWidth)));})();
"#;

/// One line of a chart: label, colour, `(minute, value)` points (NaN breaks the line).
struct Line<'a> {
    label: &'a str,
    color: &'a str,
    points: Vec<(u32, f32)>,
}

/// A 24-hour line chart ending at `now_minute`.
fn chart(out: &mut String, title: &str, unit: &str, lines: &[Line<'_>], now_minute: u32) {
    const W: f32 = 560.0;
    const H: f32 = 150.0;
    const L: f32 = 40.0;
    const B: f32 = 18.0;
    // The x axis spans the history there is (at least an hour, at most a day), so a fresh start is readable.
    let first = lines
        .iter()
        .filter_map(|l| l.points.first().map(|p| p.0))
        .min()
        .unwrap_or(now_minute);
    let span = now_minute.saturating_sub(first).clamp(60, POINTS as u32 - 1);
    let start = now_minute - span.min(now_minute);
    let ymax = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .filter(|v| v.is_finite())
        .fold(0.0f32, f32::max);
    let ymax = if ymax <= 0.0 { 1.0 } else { ymax * 1.15 };
    let x = |m: u32| L + (m.saturating_sub(start)) as f32 / span.max(1) as f32 * (W - L - 8.0);
    let y = |v: f32| 6.0 + (1.0 - v / ymax) * (H - B - 6.0);
    let ago = |minutes: u32| {
        if minutes.is_multiple_of(60) {
            format!("−{} h", minutes / 60)
        } else if minutes >= 120 {
            format!("−{:.0} h", f64::from(minutes) / 60.0)
        } else {
            format!("−{minutes} min")
        }
    };
    let _ = write!(
        out,
        r#"<div class="card"><div class="label">{}</div><svg viewBox="0 0 {W} {H}" width="100%" role="img" aria-label="{}">"#,
        esc(title),
        esc(title)
    );
    for frac in [0.0f32, 0.5, 1.0] {
        let v = ymax / 1.15 * frac;
        let _ = write!(
            out,
            r##"<line x1="{L}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#e3e7ed"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            W - 8.0,
            L - 4.0,
            y(v) + 3.0,
            trim(v),
            y = y(v)
        );
    }
    for (label, m) in [
        (ago(span), start),
        (ago(span / 2), start + span / 2),
        ("now".to_owned(), now_minute),
    ] {
        let _ = write!(
            out,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{label}</text>"#,
            x(m),
            H - 4.0
        );
    }
    for l in lines {
        let mut d = String::new();
        let mut pen_up = true;
        let mut single = None;
        for &(m, v) in &l.points {
            if m < start || !v.is_finite() {
                pen_up = true;
                continue;
            }
            let _ = write!(d, "{}{:.1},{:.1} ", if pen_up { "M" } else { "L" }, x(m), y(v));
            single = if pen_up { Some((x(m), y(v))) } else { None };
            pen_up = false;
        }
        if !d.is_empty() {
            let _ = write!(
                out,
                r#"<path d="{d}" fill="none" stroke="{}" stroke-width="2"><title>{}</title></path>"#,
                l.color,
                esc(l.label)
            );
        }
        // A lone point (the first minute after a start) would not show as a path.
        if let Some((cx, cy)) = single {
            let _ = write!(
                out,
                r#"<circle cx="{cx:.1}" cy="{cy:.1}" r="3" fill="{}"/>"#,
                l.color
            );
        }
    }
    out.push_str(r#"</svg><div class="legend">"#);
    for l in lines {
        let _ = write!(
            out,
            r#"<span><i style="background:{}"></i>{}</span>"#,
            l.color,
            esc(l.label)
        );
    }
    let _ = write!(out, r#"<span>{}</span></div></div>"#, esc(unit));
}

fn trim(v: f32) -> String {
    if v >= 10.0 || v == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// A small 24-hour sparkline of one model value.
/// At most `buckets` points: the mean of the finite values in each run of minutes (a bucket with none stays NaN,
/// which breaks the line). A chart is a few hundred pixels wide; a day has 1440 minutes.
fn downsample(points: &[(u32, f32)], buckets: usize) -> Vec<(u32, f32)> {
    if points.len() <= buckets {
        return points.to_vec();
    }
    let per = points.len().div_ceil(buckets);
    points
        .chunks(per)
        .map(|c| {
            let (sum, n) = c
                .iter()
                .filter(|p| p.1.is_finite())
                .fold((0.0f32, 0u32), |(s, n), p| (s + p.1, n + 1));
            let last = c.last().map_or(0, |p| p.0);
            (last, if n == 0 { f32::NAN } else { sum / n as f32 })
        })
        .collect()
}

fn sparkline(out: &mut String, points: &[(u32, f32)], now_minute: u32, max: Option<f32>) {
    let points = &downsample(points, 110)[..];
    const W: f32 = 110.0;
    const H: f32 = 22.0;
    let start = now_minute.saturating_sub(POINTS as u32 - 1);
    let top = max.unwrap_or_else(|| {
        points
            .iter()
            .map(|p| p.1)
            .filter(|v| v.is_finite())
            .fold(0.0, f32::max)
    });
    let top = if top <= 0.0 { 1.0 } else { top };
    let mut d = String::new();
    let mut pen_up = true;
    for &(m, v) in points {
        if m < start || !v.is_finite() {
            pen_up = true;
            continue;
        }
        let px = (m - start) as f32 / (POINTS as f32 - 1.0) * (W - 2.0) + 1.0;
        let py = 1.0 + (1.0 - (v / top).min(1.0)) * (H - 2.0);
        let _ = write!(d, "{}{px:.1},{py:.1} ", if pen_up { "M" } else { "L" });
        pen_up = false;
    }
    let _ = write!(
        out,
        r##"<svg width="{W}" height="{H}" viewBox="0 0 {W} {H}"><rect width="{W}" height="{H}" fill="#f3f5f8"/><path d="{d}" fill="none" stroke="#1a56db" stroke-width="1.5"/></svg>"##
    );
}

fn bar(out: &mut String, parts: &[(f64, &str)], total: f64) {
    out.push_str(r#"<div class="bar">"#);
    for (v, color) in parts {
        let w = if total > 0.0 {
            (v / total * 100.0).clamp(0.0, 100.0)
        } else {
            0.0
        };
        let _ = write!(out, r#"<span style="width:{w:.1}%;background:{color}"></span>"#);
    }
    out.push_str("</div>");
}

fn model_row(out: &mut String, row: &ModelRow, history: &History, now_minute: u32) {
    let m = &row.model;
    let key_attr = esc(&m.key());
    let _ = write!(out, r#"<tr data-model="{key_attr}">"#);
    name_cells(out, m, &key_attr);
    // Latency next to the model (what a reader looks for first), before what it holds.
    latency_cells(out, &m.signals);
    replica_cells(out, row);
    // Memory: what the pods reserve now → what the recommendation asks for.
    resource_cells(out, row);
    kv_cell(out, m, history, now_minute);
    load_cells(out, &m.signals);
    leading_signal_cell(out, m);
    // The last decisions, or why the recommendation is what it is.
    why_cell(out, m);
    out.push_str("</tr>");
}

/// The model (target, namespace, sharing) and its workload class with why.
fn name_cells(out: &mut String, m: &ModelObservation, key_attr: &str) {
    let _ = write!(
        out,
        r#"<td data-v="{key_attr}" title="{}"><b>{}</b><span class="s">{} · {}</span></td>"#,
        esc(&m.target),
        esc(&m.name),
        esc(&m.namespace),
        m.sharing.as_str()
    );
    match &m.workload_class {
        Some(c) => {
            let _ = write!(
                out,
                r#"<td class="l class" data-v="{0}" title="{1}"><span class="cls cls-{0}">{0}</span><span class="s">{2}</span></td>"#,
                c.class.as_str(),
                esc(&c.reason),
                esc(&c.policy)
            );
        }
        None => out.push_str(r#"<td class="l class mute" data-v="">—</td>"#),
    }
}

/// TTFT and inter-token p95, each against its objective.
fn latency_cells(out: &mut String, s: &Signals) {
    for (v, slo) in [(s.ttft_p95, s.ttft_slo), (s.itl_p95, s.itl_slo)] {
        let over = matches!((v, slo), (Some(a), Some(b)) if a > b);
        let class = if over { "over" } else { "" };
        let objective = slo.map_or_else(
            || "no objective".to_owned(),
            |o| format!("objective {}", secs(Some(o))),
        );
        let _ = write!(
            out,
            r#"<td data-v="{}"><span class="{class}">{}</span><span class="s">{objective}</span></td>"#,
            key(v),
            secs(v)
        );
    }
}

/// Replicas now (→ desired), ready and the policy's bounds; GPUs held.
fn replica_cells(out: &mut String, row: &ModelRow) {
    let r = &row.model.replicas;
    let bounds = match (r.min, r.max) {
        (Some(lo), Some(hi)) => format!("{lo}–{hi}"),
        _ => "no policy".to_owned(),
    };
    let desired = if r.desired != r.current {
        format!(r#" → <b>{}</b>"#, r.desired)
    } else {
        String::new()
    };
    let _ = write!(
        out,
        r#"<td class="replicas" data-v="{}">{}{desired}<span class="s">{} ready · {bounds}</span></td>"#,
        r.current, r.current, r.ready
    );
    let _ = write!(out, r#"<td class="gpus" data-v="{0}">{0:.2}</td>"#, row.gpus_held);
}

/// GPU memory and compute share per replica: now → recommended.
fn resource_cells(out: &mut String, row: &ModelRow) {
    let m = &row.model;
    let reserved = row.reserved_memory_mib.map_or_else(|| "—".to_owned(), gib);
    match &m.recommendation {
        Some(rec) => {
            let flag = format!(
                "KV {:.1} GiB · util {:.2}",
                rec.kv_cache_memory_bytes as f64 / (1u64 << 30) as f64,
                rec.gpu_memory_utilization
            );
            let _ = write!(
                out,
                r#"<td class="mem" data-v="{}">{reserved} → <b>{}</b><span class="s">{flag}{}</span></td>"#,
                rec.gpu_memory_mib,
                gib(rec.gpu_memory_mib),
                if row.memory_step_limited {
                    " · first step down"
                } else {
                    ""
                }
            );
            let now_share = m.running.compute_share.unwrap_or(1.0);
            let _ = write!(
                out,
                r#"<td class="compute" data-v="{}">{:.0}% → <b>{:.0}%</b>{}</td>"#,
                rec.compute_fraction,
                now_share * 100.0,
                rec.compute_fraction * 100.0,
                if row.compute_step_limited {
                    r#"<span class="s" title="shrinks are limited per update, from what runs now">first step down</span>"#
                } else {
                    ""
                }
            );
        }
        None => {
            let _ = write!(
                out,
                r#"<td class="mem" data-v="-1">{reserved} → <span class="mute">not yet</span></td><td data-v="-1" class="mute">—</td>"#
            );
        }
    }
}

/// KV cache usage now, with its history.
fn kv_cell(out: &mut String, m: &ModelObservation, history: &History, now_minute: u32) {
    let s = &m.signals;
    let _ = write!(
        out,
        r#"<td class="kv" data-v="{}">{}"#,
        key(s.kv_cache_usage),
        pct(s.kv_cache_usage)
    );
    if let Some(series) = history.models.get(&m.key()) {
        let pts: Vec<(u32, f32)> = series.points().map(|(t, p)| (*t, p.kv_cache_usage)).collect();
        out.push_str(r#"<span class="s">"#);
        sparkline(out, &pts, now_minute, Some(1.0));
        out.push_str("</span>");
    }
    out.push_str("</td>");
}

/// Waiting requests, requests per second, prefix-cache hit rate, prefill and decode times.
fn load_cells(out: &mut String, s: &Signals) {
    let _ = write!(
        out,
        r#"<td data-v="{}">{}</td>"#,
        key(s.waiting),
        num(s.waiting, 0)
    );
    let _ = write!(
        out,
        r#"<td class="rps" data-v="{}">{}</td>"#,
        key(s.requests_per_second),
        num(s.requests_per_second, 2)
    );
    let _ = write!(
        out,
        r#"<td class="prefix" data-v="{}" title="prefix-cache hits over queried prompt tokens, over the sidecars' window">{}</td>"#,
        key(s.prefix_cache_hit_ratio),
        pct(s.prefix_cache_hit_ratio)
    );
    // Where a request's time goes: prefill (compute-bound, scales with SMs) and decode (memory-bound).
    let _ = write!(
        out,
        r#"<td class="phases" data-v="{}">{} · {}<span class="s">p50 {} · {}</span></td>"#,
        key(s.prefill_p95),
        secs(s.prefill_p95),
        secs(s.decode_p95),
        secs(s.prefill_p50),
        secs(s.decode_p50)
    );
}

/// The signal leading the count, what holds it, and the update mode.
fn leading_signal_cell(out: &mut String, m: &ModelObservation) {
    let _ = write!(
        out,
        r#"<td data-v="{}" class="l">{}<span class="s">{}update {}</span></td>"#,
        esc(m.leading_signal.as_deref().unwrap_or("")),
        esc(m.leading_signal.as_deref().unwrap_or("—")),
        m.constraint
            .as_deref()
            .map(|c| format!("held by {} · ", esc(c)))
            .unwrap_or_default(),
        esc(m.update_mode.as_deref().unwrap_or("—"))
    );
}

/// The last decisions, or why there is (no) recommendation.
fn why_cell(out: &mut String, m: &ModelObservation) {
    out.push_str(r#"<td class="why">"#);
    if m.decisions.is_empty() {
        match (&m.recommendation, &m.no_recommendation_reason) {
            (None, Some(why)) => {
                let _ = write!(
                    out,
                    r#"<span class="mute" title="{}">no recommendation yet: {}</span>"#,
                    esc(why),
                    esc(&clip(why, 90))
                );
            }
            (Some(rec), _) => {
                let why = rec.summary();
                let _ = write!(
                    out,
                    r#"<span class="mute" title="{}">{}</span>"#,
                    esc(&why),
                    esc(&clip(&why, 100))
                );
            }
            _ => out.push('—'),
        }
    }
    for d in m.decisions.iter().rev().take(3) {
        let _ = write!(
            out,
            r#"<div title="{}">{} → {} <b>{}</b> <span class="mute">{}</span></div>"#,
            esc(&d.message),
            d.from,
            d.to,
            esc(&d.reason),
            esc(time(d.at_ms).get(11..16).unwrap_or(""))
        );
    }
    out.push_str("</td>");
}

/// At most `n` characters, with an ellipsis when cut (the full text goes in a tooltip).
fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        let mut out: String = s.chars().take(n).collect();
        out.push('…');
        out
    }
}

/// The page.
pub fn render(view: &View, history: &History) -> String {
    let now_minute = u32::try_from(view.at_ms / 60_000).unwrap_or(u32::MAX);
    let mut out = String::with_capacity(32 * 1024 + view.models.len() * 2048);
    page_head(&mut out, view);
    overview_cards(&mut out, &view.overview);
    charts(&mut out, history, now_minute);
    models_table(&mut out, view, history, now_minute);
    gpus_table(&mut out, view);
    page_foot(&mut out, &view.overview);
    out
}

/// The document's head and the page header: mode, update time, history kept.
fn page_head(out: &mut String, view: &View) {
    out.push_str(r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1"><meta http-equiv="refresh" content="30"><title>Tessera · GPU workloads</title><style>"#);
    out.push_str(CSS);
    out.push_str("</style></head><body><header><h1>Tessera · GPU workloads</h1>");
    let mode = if view.local {
        "local mode · read-only, from --sidecar"
    } else {
        "cluster · read-only"
    };
    let _ = write!(
        out,
        r#"<span class="badge">{mode}</span><span class="meta">updated {} · history since {} (kept in memory: a restart starts it afresh) · <a href="/ui/savings">what Tessera would save over the last day</a></span></header><main>"#,
        time(view.at_ms),
        time(view.history_since_ms)
    );
}

/// The overview cards: GPUs held, needed and freeable; memory and compute held against needed.
fn overview_cards(out: &mut String, o: &Overview) {
    out.push_str(r#"<section class="cards" id="overview">"#);
    let _ = write!(
        out,
        r#"<div class="card"><div class="label">GPUs held now</div><div class="big" id="gpus-held">{}</div><div class="sub">{} · {}</div></div>"#,
        o.gpus_held,
        count(o.models as u64, "model"),
        count(o.replicas as u64, "replica")
    );
    let without = if o.replicas_without_recommendation > 0 {
        format!(
            " · {} replicas without a recommendation yet keep a whole GPU",
            o.replicas_without_recommendation
        )
    } else {
        String::new()
    };
    let without = if o.models_step_limited > 0 {
        format!(
            "{without} · {} model{} still stepping down: the end state needs less",
            o.models_step_limited,
            if o.models_step_limited == 1 { "" } else { "s" }
        )
    } else {
        without
    };
    let _ = write!(
        out,
        r#"<div class="card"><div class="label">GPUs needed, packed</div><div class="big" id="gpus-needed">{}</div><div class="sub">recommendations ask for {:.1} GPUs of compute and {:.1} of memory{without}</div></div>"#,
        o.gpus_needed, o.compute_needed, o.memory_needed_gpus
    );
    let _ = write!(
        out,
        r#"<div class="card save"><div class="label">Could free</div><div class="big" id="gpus-freed">{} GPU{}</div><div class="sub"><b id="monthly-savings">{}</b> a month at ${:.2}/GPU-hour{}</div></div>"#,
        o.gpus_freed,
        if o.gpus_freed == 1 { "" } else { "s" },
        money(o.monthly_savings),
        o.price_per_gpu_hour,
        // Say what holds the GPUs, so a zero is not a mystery.
        if o.gpus_freed > 0 || o.replicas == 0 {
            ""
        } else if o.compute_needed >= o.memory_needed_gpus {
            " · compute shares are what keep the GPUs: two shares over 50% never share one"
        } else {
            " · memory is what keeps the GPUs"
        }
    );
    let _ = write!(
        out,
        r#"<div class="card"><div class="label">GPU memory</div><div class="sub">held {} · reserved by vLLM {} · <b>needed {}</b>{}</div>"#,
        gib(o.memory_held_mib),
        gib(o.memory_reserved_mib),
        gib(o.memory_needed_mib),
        o.memory_measured_mib
            .map_or_else(String::new, |m| format!(" · measured {}", gib(m)))
    );
    bar(
        out,
        &[
            (o.memory_reserved_mib as f64, "#c3cad6"),
            (o.memory_needed_mib as f64, "#1a56db"),
        ],
        o.memory_held_mib as f64,
    );
    out.push_str("</div>");
    let _ = write!(
        out,
        r#"<div class="card"><div class="label">Compute (GPUs)</div><div class="sub">allocated {:.1} · <b>needed {:.1}</b>{}</div>"#,
        o.compute_allocated,
        o.compute_needed,
        o.compute_busy
            .map_or_else(String::new, |b| format!(" · busy {b:.1}"))
    );
    bar(
        out,
        &[(o.compute_allocated, "#c3cad6"), (o.compute_needed, "#1a56db")],
        o.compute_allocated.max(o.compute_needed),
    );
    out.push_str("</div></section>");
}

/// GPUs and GPU memory, held against needed, over the history kept.
fn charts(out: &mut String, history: &History, now_minute: u32) {
    out.push_str(r#"<section class="charts">"#);
    let ov: Vec<_> = history.overview.points().copied().collect();
    let pick = |f: fn(&super::history::OverviewPoint) -> f32| {
        downsample(&ov.iter().map(|(m, p)| (*m, f(p))).collect::<Vec<_>>(), 280)
    };
    chart(
        out,
        "GPUs held vs needed (up to 24 h)",
        "GPUs",
        &[
            Line {
                label: "held",
                color: "#8a94a6",
                points: pick(|p| p.gpus_held),
            },
            Line {
                label: "needed when packed",
                color: "#137333",
                points: pick(|p| p.gpus_needed),
            },
        ],
        now_minute,
    );
    chart(
        out,
        "GPU memory reserved vs needed (up to 24 h)",
        "GiB",
        &[
            Line {
                label: "reserved by vLLM",
                color: "#8a94a6",
                points: pick(|p| p.memory_reserved_gib),
            },
            Line {
                label: "needed (recommendation)",
                color: "#1a56db",
                points: pick(|p| p.memory_needed_gib),
            },
        ],
        now_minute,
    );
    out.push_str("</section>");
}

/// One row per model.
fn models_table(out: &mut String, view: &View, history: &History, now_minute: u32) {
    let _ = write!(
        out,
        r#"<h2>Models <span class="mute">({})</span></h2>"#,
        view.models.len()
    );
    out.push_str(r#"<p class="note">Memory and compute read <i>now → recommended</i> per replica. Latencies are the worst replica's p95 over the sidecar's window; prefix-cache hit rate is the replicas' mean over it. Class: the workload class, whose defaults the policy's unset fields take (below it, where they came from): <i>realtime</i> (someone waits on each token: latency first; the class when unsure), <i>nearRealtime</i> (someone waits on the answer, traffic in bursts: a short wait or a cold start within the objective), <i>batch</i> (nobody waits on one request: throughput first); hover for why. — means not reported (older sidecars). Click a column to sort.</p>"#);
    out.push_str(r#"<div class="scroll"><table class="sortable" id="models"><thead><tr><th class="l">Model</th><th class="l">Class</th><th>TTFT p95</th><th>ITL p95</th><th>Replicas</th><th>GPUs held</th><th>GPU memory / replica<span class="s">now → recommended</span></th><th>Compute share<span class="s">now → recommended</span></th><th>KV cache · 24 h</th><th>Waiting</th><th>Req/s</th><th>Prefix cache<span class="s">hit rate</span></th><th>Prefill · decode<span class="s">p95</span></th><th class="l">Leading signal</th><th class="l">Why / last decisions</th></tr></thead><tbody>"#);
    for row in &view.models {
        model_row(out, row, history, now_minute);
    }
    if view.models.is_empty() {
        out.push_str(r#"<tr><td colspan="15" class="mute">No managed models yet: create an InferenceAutoscaler (or pass --sidecar NAME=URL in local mode).</td></tr>"#);
    }
    out.push_str("</tbody></table></div>");
}

/// The fractional pools' GPUs, or a note that there are none.
fn gpus_table(out: &mut String, view: &View) {
    let _ = write!(
        out,
        r#"<h2>Shared GPUs <span class="mute">({})</span></h2>"#,
        view.gpus.len()
    );
    if view.gpus.is_empty() {
        let whole = view
            .models
            .iter()
            .filter(|r| r.model.sharing == Sharing::Whole)
            .count();
        let _ = write!(
            out,
            r#"<p class="note" id="no-pools">No fractional pools: every replica holds a whole GPU ({whole} model{} above). The "needed" figure shows what sharing would save.</p>"#,
            if whole == 1 { "" } else { "s" }
        );
    } else {
        out.push_str(r#"<table class="sortable" id="gpus"><thead><tr><th class="l">Capacity pod</th><th class="l">Node · GPU</th><th class="l">Tenants (reserved · measured)</th><th>Compute free</th><th>Memory free</th><th class="l">Start-up lease</th></tr></thead><tbody>"#);
        for g in &view.gpus {
            gpu_row(out, g);
        }
        out.push_str("</tbody></table>");
    }
}

/// One shared GPU: its capacity pod, node, tenants and what is free.
fn gpu_row(out: &mut String, g: &GpuRow) {
    let gpu = &g.gpu;
    let _ = write!(
        out,
        r#"<tr><td data-v="{0}"><b>{0}</b><span class="s">pool {1}</span>{5}</td><td class="l" data-v="{2}">{2}<span class="s">{3}</span></td><td class="l" data-v="{4}">"#,
        esc(&gpu.capacity_pod),
        esc(&gpu.pool),
        esc(gpu.node.as_deref().unwrap_or("—")),
        esc(gpu.uuid.as_deref().unwrap_or("uuid unknown")),
        gpu.tenants.len(),
        // Consolidation is emptying it (its tenants fit on the other GPUs): say so, and since when.
        gpu.draining_since.map_or_else(String::new, |t| format!(
            r#"<span class="s">draining since {}: its models move to other GPUs</span>"#,
            time(t.saturating_mul(1000))
        ))
    );
    for t in &gpu.tenants {
        let measured = match (t.measured_memory_mib, t.measured_sm) {
            (None, None) => String::new(),
            (m, s) => format!(" · {} / SM {}", m.map_or_else(|| "—".to_owned(), gib), pct(s)),
        };
        let _ = write!(
            out,
            r#"<div>{} <span class="mute">({})</span> {:.0}% · {}{measured}</div>"#,
            esc(&t.pod),
            esc(&t.model),
            f64::from(t.compute_milli) / 10.0,
            gib(t.memory_mib)
        );
    }
    let _ = write!(
        out,
        r#"</td><td data-v="{0}">{1:.0}%{5}</td><td data-v="{2}">{3}</td><td class="l" data-v="{4}">{4}</td></tr>"#,
        g.free_compute_milli,
        f64::from(g.free_compute_milli) / 10.0,
        g.free_memory_mib,
        gib(g.free_memory_mib),
        esc(gpu.startup_lease_holder.as_deref().unwrap_or("—")),
        // An MPS pool hands out its caps more than once (computeOversubscription): say of how much.
        if gpu.compute_milli == GPU_COMPUTE_MILLI {
            String::new()
        } else {
            format!(
                r#"<span class="s">of {:.0}% (caps oversubscribed)</span>"#,
                f64::from(gpu.compute_milli) / 10.0
            )
        }
    );
}

/// How the figures are computed, and the end of the document.
fn page_foot(out: &mut String, o: &Overview) {
    let _ = write!(
        out,
        r#"<p class="note">GPUs needed: each replica's recommendation (memory MiB, compute share) packed with <code>tessera pack</code>'s packer onto GPUs of its own size; replicas without a recommendation keep a whole GPU. Money: GPUs freed × ${:.2}/GPU-hour ({}; set <code>--gpu-hour-price</code> to what you pay) × 730 h. Also: <a href="/metrics">/metrics</a>.</p>"#,
        o.price_per_gpu_hour,
        esc(&o.price_source)
    );
    out.push_str("</main><script>");
    out.push_str(JS);
    out.push_str("</script></body></html>");
}

/// `1 model`, `2 models`: a count with its noun (the page said "1 models · 1 replicas").
fn count(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn downsampling_keeps_at_most_the_buckets_asked_for_and_gaps() {
        let day: Vec<(u32, f32)> = (0..1440)
            .map(|m| (m, if m < 720 { f32::NAN } else { 2.0 }))
            .collect();
        let d = downsample(&day, 280);
        assert!(d.len() <= 280, "{}", d.len());
        assert!(d[0].1.is_nan(), "a bucket with no data stays a gap");
        assert_eq!(d.last(), Some(&(1439, 2.0)));
        assert_eq!(downsample(&day[..10], 280).len(), 10);
    }

    /// The new per-model cells: class with its reason, prefix-cache hit rate, prefill and decode; "—" for what an
    /// older sidecar does not report.
    #[test]
    fn model_rows_show_class_prefix_cache_prefill_and_decode() {
        use super::super::view::{ModelObservation, Settings, Snapshot, view};
        use tessera_core::class::WorkloadClass;
        use tessera_core::workload::Classified;
        let mut chat = ModelObservation {
            namespace: "ml".into(),
            name: "chat".into(),
            workload_class: Some(Classified {
                class: WorkloadClass::Realtime,
                reason: "90% of 400 requests streamed: someone reads the tokens as they come".into(),
                policy:
                    "history 10m p95 +20%, warm replica kept, TTFT guard p95, co-tenants notBatch, priority 0"
                        .into(),
            }),
            ..ModelObservation::default()
        };
        chat.leading_signal = Some("ttftP95".into());
        chat.constraint = Some("prefill".into());
        chat.signals.prefix_cache_hit_ratio = Some(0.42);
        chat.signals.prefill_p95 = Some(0.25);
        chat.signals.prefill_p50 = Some(0.1);
        chat.signals.decode_p95 = Some(3.5);
        chat.signals.decode_p50 = Some(1.25);
        let old = ModelObservation {
            namespace: "ml".into(),
            name: "old".into(),
            ..ModelObservation::default()
        };
        let v = view(
            &Snapshot {
                models: vec![chat, old],
                ..Snapshot::default()
            },
            &Settings::default(),
        );
        let page = render(&v, &History::default());
        let row = |name: &str| {
            let at = page.find(&format!(r#"data-model="ml/{name}""#)).unwrap();
            let end = page[at..].find("</tr>").unwrap() + at;
            page[at..end].to_owned()
        };
        let chat = row("chat");
        assert!(
            chat.contains(r#"<span class="cls cls-realtime">realtime</span>"#),
            "{chat}"
        );
        assert!(
            chat.contains("90% of 400 requests streamed"),
            "the reason is the tooltip: {chat}"
        );
        assert!(
            chat.contains(r#"<span class="s">history 10m p95 +20%, warm replica kept"#),
            "the policy the class chose is shown: {chat}"
        );
        assert!(
            chat.contains(r#"<td class="prefix" data-v="0.42""#) && chat.contains(">42%</td>"),
            "{chat}"
        );
        assert!(
            chat.contains("250 ms · 3.50 s<span class=\"s\">p50 100 ms · 1.25 s</span>"),
            "{chat}"
        );
        // What held the count beside the leading signal; nothing said when the controller has not decided yet.
        assert!(
            chat.contains(r#"ttftP95<span class="s">held by prefill · update —</span>"#),
            "{chat}"
        );
        let old = row("old");
        assert!(old.contains(r#"—<span class="s">update —</span>"#), "{old}");
        assert!(
            old.contains(r#"<td class="l class mute" data-v="">—</td>"#),
            "{old}"
        );
        assert!(old.contains("— · —<span class=\"s\">p50 — · —</span>"), "{old}");
        // The legend names the classes the badges show, not another set.
        for class in ["<i>realtime</i>", "<i>nearRealtime</i>", "<i>batch</i>"] {
            assert!(page.contains(class), "the legend lacks {class}");
        }
        assert!(!page.contains("<i>interactive</i>") && !page.contains("<i>bursty</i>"));
        // Counts agree with their nouns; the header's link is white on the dark header (17:1), not the accent blue.
        assert!(page.contains("2 models · 0 replicas"), "plurals");
        assert_eq!(count(1, "replica"), "1 replica");
        assert!(page.contains("header a{color:#fff"));
        // Header and cells agree: as many headers as cells in a row.
        let headers = page.matches("<th>").count() + page.matches("<th ").count();
        assert_eq!(headers, 15);
        assert_eq!(chat.matches("<td").count(), headers);
        assert_eq!(old.matches("<td").count(), headers);
    }

    #[test]
    fn money_and_escaping() {
        assert_eq!(money(8979.0), "$8,979");
        assert_eq!(money(1234567.4), "$1,234,567");
        assert_eq!(money(0.0), "$0");
        assert_eq!(esc(r#"<a href="x">&'"#), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;");
    }
}
