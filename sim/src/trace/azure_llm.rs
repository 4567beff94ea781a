//! The Azure LLM inference trace 2023 (`TIMESTAMP,ContextTokens,GeneratedTokens`).
//!
//! Timestamps look like `2023-11-16 18:17:03.9799600` (no zone; the trace is one hour of one region). They are
//! turned into seconds since the first request, so the trace starts at 0. Rows may be out of order in other
//! slices of the dataset, so they are sorted after reading.

use std::io::Read;
use std::path::Path;

use super::TraceError;

/// One request of the trace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LlmRequest {
    /// Seconds since the first request of the trace.
    pub at: f64,
    /// `ContextTokens`: the prompt length.
    pub prompt_tokens: u32,
    /// `GeneratedTokens`: the output length.
    pub output_tokens: u32,
}

/// A parsed Azure LLM trace, sorted by arrival.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmTrace {
    /// The requests, sorted by `at`, the first at 0.
    pub requests: Vec<LlmRequest>,
}

impl LlmTrace {
    /// Reads a trace file.
    pub fn read(path: &Path) -> Result<Self, TraceError> {
        Self::parse(super::open(path)?, path)
    }

    /// Parses a trace from any reader; `path` only names the source in errors.
    pub fn parse(reader: impl Read, path: &Path) -> Result<Self, TraceError> {
        let (mut rdr, headers) = super::csv_with_header(reader, path)?;
        let want = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"];
        let got: Vec<&str> = headers.iter().collect();
        if got != want {
            return Err(TraceError::Format {
                path: path.to_path_buf(),
                message: format!(
                    "header is {got:?}, expected {want:?} (the Azure LLM inference trace 2023 format)"
                ),
            });
        }
        let mut raw: Vec<(f64, u32, u32)> = Vec::new();
        for record in rdr.records() {
            let record = record.map_err(|e| {
                let line = e.position().map_or(0, |p| p.line());
                TraceError::Parse {
                    path: path.to_path_buf(),
                    line,
                    column: 1,
                    field: "row".into(),
                    message: e.to_string(),
                }
            })?;
            let line = record.position().map_or(0, |p| p.line());
            let perr = |column: usize, message: String| TraceError::Parse {
                path: path.to_path_buf(),
                line,
                column,
                field: want[column - 1].to_string(),
                message,
            };
            let ts = record.get(0).unwrap_or_default();
            let at = parse_timestamp(ts).map_err(|m| perr(1, m))?;
            let prompt = parse_tokens(record.get(1).unwrap_or_default()).map_err(|m| perr(2, m))?;
            let output = parse_tokens(record.get(2).unwrap_or_default()).map_err(|m| perr(3, m))?;
            raw.push((at, prompt, output));
        }
        if raw.is_empty() {
            return Err(TraceError::Empty {
                path: path.to_path_buf(),
                message: "no requests after the header".into(),
            });
        }
        raw.sort_by(|a, b| a.0.total_cmp(&b.0));
        let t0 = raw[0].0;
        let requests = raw
            .into_iter()
            .map(|(at, prompt_tokens, output_tokens)| LlmRequest {
                at: at - t0,
                prompt_tokens,
                output_tokens,
            })
            .collect();
        Ok(LlmTrace { requests })
    }

    /// Seconds from the first to the last request.
    pub fn span_secs(&self) -> f64 {
        self.requests.last().map_or(0.0, |r| r.at)
    }

    /// The (prompt, output) token pairs, the empirical distribution other traces draw from.
    pub fn token_pairs(&self) -> Vec<(u32, u32)> {
        self.requests
            .iter()
            .map(|r| (r.prompt_tokens, r.output_tokens))
            .collect()
    }
}

pub(crate) fn parse_tokens(s: &str) -> Result<u32, String> {
    s.parse::<u32>()
        .map_err(|_| format!("'{s}' is not a whole number of tokens"))
}

/// Parses `YYYY-MM-DD HH:MM:SS[.fraction]` into seconds since 1970-01-01 (no time zone: only differences matter).
pub fn parse_timestamp(s: &str) -> Result<f64, String> {
    let bad = || format!("'{s}' is not a timestamp like 2023-11-16 18:17:03.9799600");
    let (date, time) = s.split_once([' ', 'T']).ok_or_else(bad)?;
    let mut d = date.splitn(3, '-');
    let year: i64 = d.next().and_then(|x| x.parse().ok()).ok_or_else(bad)?;
    let month: u32 = d.next().and_then(|x| x.parse().ok()).ok_or_else(bad)?;
    let day: u32 = d.next().and_then(|x| x.parse().ok()).ok_or_else(bad)?;
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return Err(bad());
    }
    // A zone suffix (`Z`, `+00:00`, as the 2024 week-long trace and RFC 3339 write it) shifts to UTC.
    let (time, offset) = split_zone(time).ok_or_else(bad)?;
    let mut t = time.splitn(3, ':');
    let hour: u32 = t.next().and_then(|x| x.parse().ok()).ok_or_else(bad)?;
    let minute: u32 = t.next().and_then(|x| x.parse().ok()).ok_or_else(bad)?;
    let sec_str = t.next().ok_or_else(bad)?;
    let second: f64 = sec_str.parse().map_err(|_| bad())?;
    if hour > 23 || minute > 59 || !(0.0..61.0).contains(&second) {
        return Err(bad());
    }
    let days = days_from_civil(year, month, day);
    Ok(days as f64 * 86_400.0 + f64::from(hour * 3600 + minute * 60) + second - offset)
}

/// Splits `HH:MM:SS[.f]` from a trailing `Z` or `±HH:MM`, returning the offset in seconds east of UTC.
fn split_zone(time: &str) -> Option<(&str, f64)> {
    if let Some(t) = time.strip_suffix(['Z', 'z']) {
        return Some((t, 0.0));
    }
    // A sign after the seconds (position ≥ 8 keeps `HH:MM:SS` intact).
    match time.char_indices().skip(8).find(|&(_, c)| c == '+' || c == '-') {
        None => Some((time, 0.0)),
        Some((i, c)) => {
            let (h, m) = time[i + 1..].split_once(':')?;
            let secs = f64::from(h.parse::<u32>().ok()? * 3600 + m.parse::<u32>().ok()? * 60);
            Some((&time[..i], if c == '+' { secs } else { -secs }))
        }
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm), so that a trace crossing
/// midnight or a month end keeps its order.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_rows_and_rebases_time() {
        let csv = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
                   2023-11-16 18:15:46.6805900,374,44\n\
                   2023-11-16 18:15:50.9951690,396,109\n";
        let t = LlmTrace::parse(csv.as_bytes(), Path::new("x.csv")).unwrap();
        assert_eq!(t.requests.len(), 2);
        assert_eq!(t.requests[0].at, 0.0);
        assert!((t.requests[1].at - 4.314579).abs() < 1e-6);
        assert_eq!(t.requests[1].prompt_tokens, 396);
        assert_eq!(t.requests[1].output_tokens, 109);
    }

    #[test]
    fn crossing_midnight_and_month_end_keeps_order() {
        let a = parse_timestamp("2023-11-30 23:59:59.5").unwrap();
        let b = parse_timestamp("2023-12-01 00:00:00.5").unwrap();
        assert!((b - a - 1.0).abs() < 1e-9);
        assert_eq!(parse_timestamp("1970-01-01 00:00:00").unwrap(), 0.0);
        // The 2024 week-long trace and RFC 3339 carry a zone.
        assert_eq!(parse_timestamp("1970-01-01 00:00:01+00:00").unwrap(), 1.0);
        assert_eq!(parse_timestamp("1970-01-01T01:00:00+01:00").unwrap(), 0.0);
        assert_eq!(parse_timestamp("1970-01-01T00:00:02.5Z").unwrap(), 2.5);
    }

    #[test]
    fn bad_field_names_line_and_column() {
        let csv = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n2023-11-16 18:15:47,abc,1\n";
        let err = LlmTrace::parse(csv.as_bytes(), Path::new("t.csv"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("t.csv:3"), "{err}");
        assert!(err.contains("column 2 (ContextTokens)"), "{err}");
        let csv = "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n";
        let err = LlmTrace::parse(csv.as_bytes(), Path::new("t.csv"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("column 1 (TIMESTAMP)"), "{err}");
    }

    #[test]
    fn wrong_header_and_empty_file_are_errors() {
        let err = LlmTrace::parse("a,b,c\n1,2,3\n".as_bytes(), Path::new("t.csv")).unwrap_err();
        assert_eq!(err.label(), "format");
        let err = LlmTrace::parse(
            "TIMESTAMP,ContextTokens,GeneratedTokens\n".as_bytes(),
            Path::new("t.csv"),
        )
        .unwrap_err();
        assert_eq!(err.label(), "empty");
    }
}
