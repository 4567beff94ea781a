//! A Prometheus text-format (0.0.4) parser that borrows from the page and keeps going past bad lines.
//!
//! What it accepts, and why:
//! - Metric names with colons (`vllm:num_requests_running`): every vLLM metric has one. `prometheus-parse`
//!   drops such names silently, which is the reason this parser exists.
//! - `# HELP` / `# TYPE` lines; other `#` lines are comments. A sample belongs to the family announced by the
//!   last `TYPE`/`HELP` line when its name is the family name or, for histograms and summaries, the family name
//!   plus `_bucket`/`_sum`/`_count`/`_created` (and `_total`/`_created` for counters typed without `_total`).
//!   Any other sample opens an untyped family of its own. vLLM V1 (through `prometheus_client`) announces each
//!   `*_created` series as a separate `gauge` family, so those arrive as families of their own too.
//! - Label values with the escapes `\\`, `\"` and `\n`; like Prometheus, any other backslash pair is kept as
//!   written. Values are borrowed; only a label value that contains an escape is copied when it is read.
//! - Values `NaN`, `+Inf`, `-Inf` (any case) and any decimal float; an optional timestamp: an integer is
//!   milliseconds (text format 0.0.4), a number with a fraction or exponent is OpenMetrics seconds.
//! - OpenMetrics exemplars (`… value [timestamp] # {trace_id="…"} 0.67 [ts]`): the sample is kept and the
//!   exemplar ignored. Dropping such a line would drop a histogram bucket, and a histogram missing a bucket gives
//!   wrong quantiles.
//! - Blank lines, leading blanks, `\r\n` line ends and a last line without a newline.
//!
//! A line that breaks the format becomes a [`LineError`] (1-based line number, what is wrong, the line's text)
//! and is skipped; everything else on the page is kept, so one bad exporter line does not blind the sidecar.
//! No input makes the parser panic (a property test feeds it arbitrary strings).
//!
//! Speed: one pass over the bytes, `memchr` for line ends, no allocation per line (labels are kept as the
//! validated raw `{…}` text and decoded lazily by [`Sample::labels`]). See `docs/performance.md`.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

/// The `# TYPE` of a metric family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetricType {
    Counter,
    Gauge,
    Histogram,
    Summary,
    /// No `# TYPE` line, or `untyped`/`unknown`.
    Untyped,
}

impl MetricType {
    fn from_token(t: &str) -> Option<MetricType> {
        Some(match t {
            "counter" => MetricType::Counter,
            "gauge" => MetricType::Gauge,
            "histogram" => MetricType::Histogram,
            "summary" => MetricType::Summary,
            "untyped" | "unknown" => MetricType::Untyped,
            _ => return None,
        })
    }

    /// The suffixes a sample name may add to the family name and still belong to the family.
    fn member_suffixes(self) -> &'static [&'static str] {
        match self {
            MetricType::Histogram => &["_bucket", "_sum", "_count", "_created"],
            MetricType::Summary => &["_sum", "_count", "_created"],
            MetricType::Counter => &["_total", "_created"],
            MetricType::Gauge | MetricType::Untyped => &[],
        }
    }
}

/// A parsed page: the metric families in page order and the lines that could not be parsed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParsedPage<'a> {
    pub families: Vec<Family<'a>>,
    pub errors: Vec<LineError>,
}

impl<'a> ParsedPage<'a> {
    /// The first family with this exact name (the name on its `# TYPE` line, or the sample name if untyped).
    pub fn family(&self, name: &str) -> Option<&Family<'a>> {
        self.families.iter().find(|f| f.name == name)
    }

    /// Every sample on the page, in page order, whatever family it landed in.
    pub fn samples(&self) -> impl Iterator<Item = &Sample<'a>> {
        self.families.iter().flat_map(|f| f.samples.iter())
    }
}

/// One metric family: its name, type, help text and samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Family<'a> {
    pub name: &'a str,
    pub kind: MetricType,
    /// The `# HELP` text as written on the page (still escaped; see [`Family::help_text`]).
    pub help: Option<&'a str>,
    pub samples: Vec<Sample<'a>>,
}

impl<'a> Family<'a> {
    /// The help text with `\\` and `\n` unescaped.
    pub fn help_text(&self) -> Option<Cow<'a, str>> {
        self.help.map(|h| unescape(h, false))
    }
}

/// One sample line: `name{labels} value [timestamp]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample<'a> {
    /// The full sample name, e.g. `vllm:time_to_first_token_seconds_bucket`.
    pub name: &'a str,
    /// The text between `{` and `}`, already validated by the parser (empty when there are no labels).
    labels_raw: &'a str,
    pub value: f64,
    /// Milliseconds since the epoch, when the exporter wrote one (vLLM does not).
    pub timestamp_ms: Option<i64>,
}

impl<'a> Sample<'a> {
    /// The labels in page order, values unescaped (borrowed unless they contained an escape).
    pub fn labels(&self) -> Labels<'a> {
        Labels {
            c: Cursor {
                s: self.labels_raw,
                i: 0,
            },
        }
    }

    /// The value of one label, if present.
    pub fn label(&self, name: &str) -> Option<Cow<'a, str>> {
        self.labels().find(|(n, _)| *n == name).map(|(_, v)| v)
    }
}

/// Iterator over a sample's labels. The text it walks was validated when the page was parsed, so it
/// cannot meet a syntax error; if it ever did, it would stop rather than panic.
#[derive(Debug, Clone)]
pub struct Labels<'a> {
    c: Cursor<'a>,
}

impl<'a> Iterator for Labels<'a> {
    type Item = (&'a str, Cow<'a, str>);

    fn next(&mut self) -> Option<Self::Item> {
        self.c.skip_blanks();
        self.c.peek()?;
        match self.c.label_pair() {
            Ok(pair) => {
                self.c.skip_blanks();
                if self.c.peek() == Some(b',') {
                    self.c.i += 1;
                }
                Some(pair)
            }
            Err(_) => {
                self.c.i = self.c.s.len();
                None
            }
        }
    }
}

/// A line that could not be parsed and was skipped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("line {line}: {kind} (line text: {text:?})")]
pub struct LineError {
    /// 1-based line number on the page.
    pub line: usize,
    pub kind: LineErrorKind,
    /// The start of the offending line (at most 120 bytes), to find it in the page.
    pub text: String,
}

/// What was wrong with a line. Each variant has a fixed [`label`](LineErrorKind::label) for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "snake_case")]
pub enum LineErrorKind {
    #[error("invalid metric name: a name must match [a-zA-Z_:][a-zA-Z0-9_:]*")]
    InvalidMetricName,
    #[error("invalid label name: a label name must match [a-zA-Z_][a-zA-Z0-9_]*")]
    InvalidLabelName,
    #[error("expected '=' after the label name")]
    ExpectedEquals,
    #[error("expected '\"' to open the label value")]
    ExpectedQuote,
    #[error("label value has no closing '\"' on this line")]
    UnterminatedLabelValue,
    #[error("expected ',' or '}}' after a label value")]
    ExpectedCommaOrBrace,
    #[error("missing sample value after the metric name and labels")]
    MissingValue,
    #[error("sample value is not a number (expected a float, NaN, +Inf or -Inf)")]
    InvalidValue,
    #[error("timestamp is not an integer number of milliseconds")]
    InvalidTimestamp,
    #[error("unexpected text after the value and timestamp")]
    TrailingText,
    #[error("# HELP or # TYPE line without a valid metric name")]
    MalformedComment,
    #[error("unknown metric type: expected counter, gauge, histogram, summary or untyped")]
    UnknownType,
    #[error("second # HELP line for the same metric family (the first is kept)")]
    DuplicateHelp,
    #[error("second # TYPE line for the same metric family (the first is kept)")]
    DuplicateType,
}

impl LineErrorKind {
    /// A fixed, low-cardinality name for this kind of error (metric label value).
    pub fn label(self) -> &'static str {
        match self {
            LineErrorKind::InvalidMetricName => "invalid_metric_name",
            LineErrorKind::InvalidLabelName => "invalid_label_name",
            LineErrorKind::ExpectedEquals => "expected_equals",
            LineErrorKind::ExpectedQuote => "expected_quote",
            LineErrorKind::UnterminatedLabelValue => "unterminated_label_value",
            LineErrorKind::ExpectedCommaOrBrace => "expected_comma_or_brace",
            LineErrorKind::MissingValue => "missing_value",
            LineErrorKind::InvalidValue => "invalid_value",
            LineErrorKind::InvalidTimestamp => "invalid_timestamp",
            LineErrorKind::TrailingText => "trailing_text",
            LineErrorKind::MalformedComment => "malformed_comment",
            LineErrorKind::UnknownType => "unknown_type",
            LineErrorKind::DuplicateHelp => "duplicate_help",
            LineErrorKind::DuplicateType => "duplicate_type",
        }
    }
}

/// Parse a Prometheus text page. Never fails and never panics: malformed lines are listed in
/// [`ParsedPage::errors`] and skipped.
pub fn parse_text(page: &str) -> ParsedPage<'_> {
    let bytes = page.as_bytes();
    let mut out = ParsedPage {
        families: Vec::with_capacity(64),
        errors: Vec::new(),
    };
    let mut start = 0usize;
    let mut line_no = 0usize;
    while start < bytes.len() {
        line_no += 1;
        let end = memchr::memchr(b'\n', &bytes[start..]).map_or(bytes.len(), |p| start + p);
        let mut line_end = end;
        if line_end > start && bytes[line_end - 1] == b'\r' {
            line_end -= 1;
        }
        // Both ends are at ASCII bytes ('\n', '\r' or the page's ends), hence char boundaries.
        let line = &page[start..line_end];
        if let Err(kind) = parse_line(line, &mut out.families) {
            out.errors.push(LineError {
                line: line_no,
                kind,
                text: truncate(line, 120).to_owned(),
            });
        }
        start = end + 1;
    }
    out
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    &s[..cut]
}

fn parse_line<'a>(line: &'a str, families: &mut Vec<Family<'a>>) -> Result<(), LineErrorKind> {
    let mut c = Cursor { s: line, i: 0 };
    c.skip_blanks();
    match c.peek() {
        None => Ok(()),
        Some(b'#') => {
            c.i += 1;
            parse_comment(line, c, families)
        }
        Some(_) => parse_sample(line, c, families),
    }
}

fn parse_comment<'a>(
    line: &'a str,
    mut c: Cursor<'a>,
    families: &mut Vec<Family<'a>>,
) -> Result<(), LineErrorKind> {
    c.skip_blanks();
    let word = c.token();
    let is_help = match word {
        "HELP" => true,
        "TYPE" => false,
        // Any other comment is free text.
        _ => return Ok(()),
    };
    if !c.skip_blanks() {
        return Err(LineErrorKind::MalformedComment);
    }
    let name = c.metric_name().ok_or(LineErrorKind::MalformedComment)?;
    if c.peek().is_some() && !c.skip_blanks() {
        return Err(LineErrorKind::MalformedComment);
    }
    let rest = line.get(c.i..).unwrap_or("");
    let family = open_family(families, name);
    if is_help {
        if family.help.is_some() {
            return Err(LineErrorKind::DuplicateHelp);
        }
        family.help = Some(rest);
    } else {
        let kind =
            MetricType::from_token(rest.trim_end_matches([' ', '\t'])).ok_or(LineErrorKind::UnknownType)?;
        // A TYPE line after samples of the same name, or a second one, would change the meaning of samples
        // already read; keep the first, as Prometheus refuses the second.
        if family.kind != MetricType::Untyped || !family.samples.is_empty() {
            return Err(LineErrorKind::DuplicateType);
        }
        family.kind = kind;
    }
    Ok(())
}

/// The family a HELP/TYPE line for `name` describes: the current one if it has that name, else a new one.
fn open_family<'a, 'f>(families: &'f mut Vec<Family<'a>>, name: &'a str) -> &'f mut Family<'a> {
    let reuse = families.last().is_some_and(|f| f.name == name);
    if !reuse {
        families.push(Family {
            name,
            kind: MetricType::Untyped,
            help: None,
            samples: Vec::new(),
        });
    }
    let idx = families.len() - 1;
    &mut families[idx]
}

fn parse_sample<'a>(
    line: &'a str,
    mut c: Cursor<'a>,
    families: &mut Vec<Family<'a>>,
) -> Result<(), LineErrorKind> {
    let name = c.metric_name().ok_or(LineErrorKind::InvalidMetricName)?;
    let had_blank = c.skip_blanks();
    let mut labels_raw = "";
    if c.peek() == Some(b'{') {
        c.i += 1;
        let open = c.i;
        loop {
            c.skip_blanks();
            match c.peek() {
                Some(b'}') => break,
                None => return Err(LineErrorKind::ExpectedCommaOrBrace),
                Some(_) => {}
            }
            c.label_pair()?;
            c.skip_blanks();
            match c.peek() {
                Some(b',') => c.i += 1,
                Some(b'}') => break,
                _ => return Err(LineErrorKind::ExpectedCommaOrBrace),
            }
        }
        labels_raw = line.get(open..c.i).unwrap_or("");
        c.i += 1;
        if !c.skip_blanks() {
            return Err(if c.peek().is_none() {
                LineErrorKind::MissingValue
            } else {
                LineErrorKind::InvalidValue
            });
        }
    } else if !had_blank {
        return Err(if c.peek().is_none() {
            LineErrorKind::MissingValue
        } else {
            LineErrorKind::InvalidMetricName
        });
    }
    let value_tok = c.token();
    if value_tok.is_empty() {
        return Err(LineErrorKind::MissingValue);
    }
    let value = parse_value(value_tok).ok_or(LineErrorKind::InvalidValue)?;
    let mut timestamp_ms = None;
    if c.skip_blanks() && c.peek() != Some(b'#') {
        let ts = c.token();
        if !ts.is_empty() {
            timestamp_ms = Some(parse_timestamp(ts).ok_or(LineErrorKind::InvalidTimestamp)?);
            c.skip_blanks();
        }
    }
    // An exemplar (`# {labels} value [timestamp]`) ends the sample; what it says is not used here.
    if c.peek() == Some(b'#') {
        let rest = line.get(c.i + 1..).unwrap_or("").trim_start();
        if !rest.starts_with('{') {
            return Err(LineErrorKind::TrailingText);
        }
    } else if c.peek().is_some() {
        return Err(LineErrorKind::TrailingText);
    }
    let sample = Sample {
        name,
        labels_raw,
        value,
        timestamp_ms,
    };
    match families.last_mut() {
        Some(f) if belongs(f, name) => f.samples.push(sample),
        _ => families.push(Family {
            name,
            kind: MetricType::Untyped,
            help: None,
            samples: vec![sample],
        }),
    }
    Ok(())
}

fn belongs(f: &Family<'_>, sample_name: &str) -> bool {
    if f.name == sample_name {
        return true;
    }
    match sample_name.strip_prefix(f.name) {
        Some(suffix) => f.kind.member_suffixes().contains(&suffix),
        None => false,
    }
}

/// A sample timestamp in milliseconds: an integer is milliseconds (text format 0.0.4); a number with a fraction
/// or exponent is OpenMetrics seconds, rounded to the millisecond.
fn parse_timestamp(tok: &str) -> Option<i64> {
    if let Ok(ms) = tok.parse::<i64>() {
        return Some(ms);
    }
    let secs = tok.parse::<f64>().ok().filter(|s| s.is_finite())?;
    let ms = (secs * 1000.0).round();
    (ms.abs() < 9.0e18).then_some(ms as i64)
}

/// Prometheus values: Go float syntax plus `NaN`, `+Inf`, `-Inf`. Rust's `f64::from_str` accepts decimal
/// floats, `inf`/`infinity`/`nan` in any case with an optional sign, which covers what exporters write.
fn parse_value(tok: &str) -> Option<f64> {
    tok.parse::<f64>().ok()
}

#[inline]
fn is_blank(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

#[inline]
fn is_name_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b == b':'
}

#[inline]
fn is_name_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b':'
}

#[inline]
fn is_label_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_'
}

#[inline]
fn is_label_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// A byte position in one line. Every index it slices at sits next to an ASCII byte it has just checked (or
/// at an end), so slicing never splits a UTF-8 character; `get` is used anyway so a mistake cannot panic.
#[derive(Debug, Clone, Copy)]
struct Cursor<'a> {
    s: &'a str,
    i: usize,
}

impl<'a> Cursor<'a> {
    #[inline]
    fn peek(&self) -> Option<u8> {
        self.s.as_bytes().get(self.i).copied()
    }

    /// Skips spaces and tabs; true if it skipped at least one.
    #[inline]
    fn skip_blanks(&mut self) -> bool {
        let start = self.i;
        while self.peek().is_some_and(is_blank) {
            self.i += 1;
        }
        self.i > start
    }

    /// The token up to the next blank or the end of the line.
    #[inline]
    fn token(&mut self) -> &'a str {
        let start = self.i;
        while self.peek().is_some_and(|b| !is_blank(b)) {
            self.i += 1;
        }
        self.s.get(start..self.i).unwrap_or("")
    }

    #[inline]
    fn metric_name(&mut self) -> Option<&'a str> {
        let start = self.i;
        if !self.peek().is_some_and(is_name_start) {
            return None;
        }
        self.i += 1;
        while self.peek().is_some_and(is_name_char) {
            self.i += 1;
        }
        self.s.get(start..self.i)
    }

    /// `name = "value"` with optional blanks around `=`; the cursor ends after the closing quote.
    #[inline]
    fn label_pair(&mut self) -> Result<(&'a str, Cow<'a, str>), LineErrorKind> {
        let start = self.i;
        if !self.peek().is_some_and(is_label_start) {
            return Err(LineErrorKind::InvalidLabelName);
        }
        self.i += 1;
        while self.peek().is_some_and(is_label_char) {
            self.i += 1;
        }
        let name = self.s.get(start..self.i).ok_or(LineErrorKind::InvalidLabelName)?;
        self.skip_blanks();
        if self.peek() != Some(b'=') {
            return Err(LineErrorKind::ExpectedEquals);
        }
        self.i += 1;
        self.skip_blanks();
        if self.peek() != Some(b'"') {
            return Err(LineErrorKind::ExpectedQuote);
        }
        self.i += 1;
        let vstart = self.i;
        let mut escaped = false;
        loop {
            let rest = self.s.as_bytes().get(self.i..).unwrap_or(&[]);
            match memchr::memchr2(b'"', b'\\', rest) {
                None => return Err(LineErrorKind::UnterminatedLabelValue),
                Some(p) => {
                    self.i += p;
                    if self.peek() == Some(b'\\') {
                        escaped = true;
                        // Skip the backslash and whatever it escapes; a backslash at the very end
                        // leaves the value unterminated.
                        self.i += 2;
                        if self.i > self.s.len() {
                            return Err(LineErrorKind::UnterminatedLabelValue);
                        }
                    } else {
                        break;
                    }
                }
            }
        }
        let raw = self
            .s
            .get(vstart..self.i)
            .ok_or(LineErrorKind::UnterminatedLabelValue)?;
        self.i += 1;
        let value = if escaped {
            unescape(raw, true)
        } else {
            Cow::Borrowed(raw)
        };
        Ok((name, value))
    }
}

/// Undo the text format's escapes: `\\` and `\n` always, `\"` in label values. Any other pair is kept as
/// written, which is what Prometheus does.
fn unescape(raw: &str, quotes: bool) -> Cow<'_, str> {
    if !raw.contains('\\') {
        return Cow::Borrowed(raw);
    }
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(ch) = chars.next() {
        if ch != '\\' {
            out.push(ch);
            continue;
        }
        match chars.next() {
            Some('\\') => out.push('\\'),
            Some('n') => out.push('\n'),
            Some('"') if quotes => out.push('"'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn colon_names_help_type_and_labels() {
        let page = "# HELP vllm:num_requests_running Number of requests.\n\
                    # TYPE vllm:num_requests_running gauge\n\
                    vllm:num_requests_running{engine=\"0\",model_name=\"/models/llama 3\"} 3.0\n";
        let p = parse_text(page);
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        let f = p.family("vllm:num_requests_running").unwrap();
        assert_eq!(f.kind, MetricType::Gauge);
        assert_eq!(f.help_text().unwrap(), "Number of requests.");
        assert_eq!(f.samples.len(), 1);
        let s = &f.samples[0];
        assert_eq!(s.value, 3.0);
        assert_eq!(s.label("engine").unwrap(), "0");
        assert_eq!(s.label("model_name").unwrap(), "/models/llama 3");
        assert_eq!(s.label("absent"), None);
    }

    #[test]
    fn escaped_label_values_are_unescaped() {
        let page = r#"m{a="x\\y",b="say \"hi\"",c="two\nlines",d="odd\qpair",e=""} 1"#;
        let p = parse_text(page);
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        let s = &p.families[0].samples[0];
        let labels: Vec<(&str, String)> = s.labels().map(|(n, v)| (n, v.into_owned())).collect();
        assert_eq!(
            labels,
            vec![
                ("a", "x\\y".to_owned()),
                ("b", "say \"hi\"".to_owned()),
                ("c", "two\nlines".to_owned()),
                ("d", "odd\\qpair".to_owned()),
                ("e", String::new()),
            ]
        );
    }

    #[test]
    fn special_values_timestamps_and_no_trailing_newline() {
        let page = "a NaN\nb +Inf\nc -Inf 1700000000000\nd{x=\"1\",} 1.5e-3 -5\r\ne{} 7";
        let p = parse_text(page);
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        let v: Vec<f64> = p.samples().map(|s| s.value).collect();
        assert!(v[0].is_nan());
        assert_eq!(v[1], f64::INFINITY);
        assert_eq!(v[2], f64::NEG_INFINITY);
        assert_eq!(v[3], 1.5e-3);
        assert_eq!(v[4], 7.0);
        let ts: Vec<Option<i64>> = p.samples().map(|s| s.timestamp_ms).collect();
        assert_eq!(ts, vec![None, None, Some(1_700_000_000_000), Some(-5), None]);
        assert_eq!(p.samples().nth(3).unwrap().label("x").unwrap(), "1");
    }

    /// Item 10: exemplars and OpenMetrics float timestamps used to drop the line (and with it a histogram bucket).
    #[test]
    fn exemplars_and_float_timestamps_keep_the_sample() {
        let page = "# TYPE h histogram\n\
                    h_bucket{le=\"0.1\"} 8 # {trace_id=\"KOO5S4vxi0o\"} 0.067 1520879607.789\n\
                    h_bucket{le=\"1\"} 9 1520879607.789 # {trace_id=\"x\"} 0.5\n\
                    h_bucket{le=\"+Inf\"} 10 1520879607789\n\
                    h_count 10 1.5e9\n";
        let p = parse_text(page);
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        let v: Vec<(f64, Option<i64>)> = p.samples().map(|s| (s.value, s.timestamp_ms)).collect();
        assert_eq!(
            v,
            vec![
                (8.0, None),
                (9.0, Some(1_520_879_607_789)),
                (10.0, Some(1_520_879_607_789)),
                (10.0, Some(1_500_000_000_000))
            ]
        );
        // Text after the value that is neither a timestamp nor an exemplar is still an error.
        for bad in ["a 1 # not an exemplar\n", "a 1 2 3\n", "a 1 x\n"] {
            assert_eq!(parse_text(bad).errors.len(), 1, "{bad}");
        }
    }

    #[test]
    fn histogram_members_and_created_families() {
        let page = "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 3\nh_count 2\n\
                    # HELP h_created Created.\n# TYPE h_created gauge\nh_created 1.7e9\n\
                    # TYPE c_total counter\nc_total 4\n# TYPE c_created gauge\nc_created 1.7e9\nloose 1\n";
        let p = parse_text(page);
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        let names: Vec<(&str, MetricType, usize)> = p
            .families
            .iter()
            .map(|f| (f.name, f.kind, f.samples.len()))
            .collect();
        assert_eq!(
            names,
            vec![
                ("h", MetricType::Histogram, 4),
                ("h_created", MetricType::Gauge, 1),
                ("c_total", MetricType::Counter, 1),
                ("c_created", MetricType::Gauge, 1),
                ("loose", MetricType::Untyped, 1),
            ]
        );
    }

    #[test]
    fn broken_lines_are_reported_and_skipped() {
        let page = "good 1\n\
                    bad{a=\"unterminated} 1\n\
                    9bad 1\n\
                    novalue{a=\"b\"}\n\
                    notanumber abc\n\
                    ts 1 notatime\n\
                    extra 1 2 3\n\
                    # TYPE t wibble\n\
                    lbl{9=\"x\"} 1\n\
                    lbl{a \"x\"} 1\n\
                    lbl{a=x} 1\n\
                    lbl{a=\"x\" b=\"y\"} 1\n\
                    \n\
                    # just a comment\n\
                    also_good{a=\"b\"} 2";
        let p = parse_text(page);
        let kinds: Vec<(usize, LineErrorKind)> = p.errors.iter().map(|e| (e.line, e.kind)).collect();
        assert_eq!(
            kinds,
            vec![
                (2, LineErrorKind::UnterminatedLabelValue),
                (3, LineErrorKind::InvalidMetricName),
                (4, LineErrorKind::MissingValue),
                (5, LineErrorKind::InvalidValue),
                (6, LineErrorKind::InvalidTimestamp),
                (7, LineErrorKind::TrailingText),
                (8, LineErrorKind::UnknownType),
                (9, LineErrorKind::InvalidLabelName),
                (10, LineErrorKind::ExpectedEquals),
                (11, LineErrorKind::ExpectedQuote),
                (12, LineErrorKind::ExpectedCommaOrBrace),
            ]
        );
        let kept: Vec<(&str, f64)> = p.samples().map(|s| (s.name, s.value)).collect();
        assert_eq!(kept, vec![("good", 1.0), ("also_good", 2.0)]);
        assert_eq!(p.errors[1].text, "9bad 1");
        assert!(p.errors[0].to_string().contains("line 2"));
    }

    #[test]
    fn duplicate_help_and_type_keep_the_first() {
        let page = "# HELP m one\n# HELP m two\n# TYPE m gauge\n# TYPE m counter\nm 1\n";
        let p = parse_text(page);
        let kinds: Vec<LineErrorKind> = p.errors.iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            vec![LineErrorKind::DuplicateHelp, LineErrorKind::DuplicateType]
        );
        let f = p.family("m").unwrap();
        assert_eq!(
            (f.help, f.kind, f.samples.len()),
            (Some("one"), MetricType::Gauge, 1)
        );
    }

    #[test]
    fn multibyte_text_does_not_split_characters() {
        let page = "m{a=\"héllo ✓\"} 1\n# HELP m ünïcode ✓\nné 1\n";
        let p = parse_text(page);
        assert_eq!(p.samples().next().unwrap().label("a").unwrap(), "héllo ✓");
        assert_eq!(p.errors.len(), 1);
        assert_eq!(p.errors[0].line, 3);
    }

    proptest! {
        #[test]
        fn never_panics_on_arbitrary_text(s in "\\PC*") {
            let p = parse_text(&s);
            for smp in p.samples() {
                for (n, v) in smp.labels() {
                    prop_assert!(!n.is_empty());
                    let _ = v.len();
                }
            }
        }

        #[test]
        fn never_panics_on_prometheus_like_text(
            s in proptest::collection::vec(
                prop_oneof![
                    Just("{".to_owned()), Just("}".to_owned()), Just("\"".to_owned()), Just("\\".to_owned()),
                    Just("=".to_owned()), Just(",".to_owned()), Just(" ".to_owned()), Just("\n".to_owned()),
                    Just("# TYPE ".to_owned()), Just("# HELP ".to_owned()), Just("vllm:x".to_owned()),
                    Just("le".to_owned()), Just("1.5".to_owned()), Just("+Inf".to_owned()), Just("é".to_owned()),
                ],
                0..60,
            )
        ) {
            let page: String = s.concat();
            let p = parse_text(&page);
            let lines = page.split('\n').count();
            for e in &p.errors {
                prop_assert!(e.line >= 1 && e.line <= lines);
            }
            for smp in p.samples() {
                let _ = smp.labels().count();
            }
        }

        /// Any well-formed sample line, with any label values, reads back exactly.
        #[test]
        fn well_formed_lines_round_trip(
            name in "[a-zA-Z_:][a-zA-Z0-9_:]{0,20}",
            labels in proptest::collection::vec(("[a-zA-Z_][a-zA-Z0-9_]{0,8}", "\\PC{0,12}"), 0..4),
            value in proptest::num::f64::ANY,
            ts in proptest::option::of(any::<i64>()),
        ) {
            let mut line = name.clone();
            if !labels.is_empty() {
                line.push('{');
                for (i, (k, v)) in labels.iter().enumerate() {
                    if i > 0 { line.push(','); }
                    let esc = v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
                    line.push_str(&format!("{k}=\"{esc}\""));
                }
                line.push('}');
            }
            let vtext = if value.is_nan() { "NaN".to_owned() }
                else if value.is_infinite() { if value > 0.0 { "+Inf".to_owned() } else { "-Inf".to_owned() } }
                else { format!("{value:?}") };
            line.push(' ');
            line.push_str(&vtext);
            if let Some(t) = ts { line.push_str(&format!(" {t}")); }
            let p = parse_text(&line);
            prop_assert!(p.errors.is_empty(), "{:?} for {line:?}", p.errors);
            let s = p.samples().next().unwrap();
            prop_assert_eq!(s.name, name.as_str());
            if value.is_nan() { prop_assert!(s.value.is_nan()); } else { prop_assert_eq!(s.value, value); }
            prop_assert_eq!(s.timestamp_ms, ts);
            let got: Vec<(String, String)> = s.labels().map(|(k, v)| (k.to_owned(), v.into_owned())).collect();
            prop_assert_eq!(got, labels);
        }
    }
}
