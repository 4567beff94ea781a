//! Users' own traffic: a generic CSV, BurstGPT's CSV and Mooncake's JSONL, read into the same [`LlmTrace`] the
//! Azure LLM reader produces (sorted, rebased to start at 0), so every scenario transform applies to them.
//!
//! - **csv**: a header naming `timestamp`, `prompt_tokens`, `output_tokens` and optionally `model`, in any order
//!   (other columns are ignored); timestamps in seconds (a number) or RFC 3339 (`2024-05-10T00:00:00.5Z`).
//! - **burstgpt**: `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type` (timestamps in
//!   seconds); failed requests (0 response tokens) are kept as one-token requests, as the load still arrived.
//! - **mooncake**: one JSON object per line with `timestamp` (milliseconds), `input_length`, `output_length`
//!   (other fields such as `hash_ids` are ignored).
//!
//! All three are read row by row from a buffered reader (nothing but the parsed numbers is kept), and every
//! error names the file, the line and the column.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use serde::Deserialize;

use super::azure_llm::{parse_timestamp, parse_tokens};
use super::{LlmRequest, LlmTrace, TraceError};

/// Which user format a file is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `timestamp, prompt_tokens, output_tokens[, model]`.
    Csv,
    /// BurstGPT.
    BurstGpt,
    /// Mooncake JSONL.
    Mooncake,
}

/// Reads a file in `format`, keeping only rows of `model` when given (multi-model files).
pub fn read(format: Format, path: &Path, model: Option<&str>) -> Result<LlmTrace, TraceError> {
    parse(format, super::open(path)?, path, model)
}

/// Parses from any reader; `path` only names the source in errors.
pub fn parse(
    format: Format,
    reader: impl Read,
    path: &Path,
    model: Option<&str>,
) -> Result<LlmTrace, TraceError> {
    let raw = match format {
        Format::Csv => csv_rows(reader, path, model)?,
        Format::BurstGpt => burstgpt_rows(reader, path, model)?,
        Format::Mooncake => mooncake_rows(reader, path)?,
    };
    finish(raw, path, model)
}

fn finish(mut raw: Vec<(f64, u32, u32)>, path: &Path, model: Option<&str>) -> Result<LlmTrace, TraceError> {
    if raw.is_empty() {
        return Err(TraceError::Empty {
            path: path.to_path_buf(),
            message: match model {
                Some(m) => format!("no requests of model {m:?} after the header"),
                None => "no requests after the header".into(),
            },
        });
    }
    raw.sort_by(|a, b| a.0.total_cmp(&b.0));
    let t0 = raw[0].0;
    Ok(LlmTrace {
        requests: raw
            .into_iter()
            .map(|(at, prompt_tokens, output_tokens)| LlmRequest {
                at: at - t0,
                prompt_tokens,
                output_tokens: output_tokens.max(1),
            })
            .collect(),
    })
}

fn parse_err(path: &Path, line: u64, column: usize, field: &str, message: String) -> TraceError {
    TraceError::Parse {
        path: path.to_path_buf(),
        line,
        column,
        field: field.to_string(),
        message,
    }
}

/// Seconds (a number) or an RFC 3339 timestamp.
fn seconds_or_rfc3339(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        Ok(_) => Err(format!("'{s}' is not a finite number of seconds")),
        Err(_) => parse_timestamp(s).map_err(|_| {
            format!("'{s}' is neither seconds nor an RFC 3339 timestamp (2024-05-10T00:00:00Z)")
        }),
    }
}

fn csv_rows(reader: impl Read, path: &Path, model: Option<&str>) -> Result<Vec<(f64, u32, u32)>, TraceError> {
    let (mut rdr, header) = super::csv_with_header(reader, path)?;
    let find = |name: &str| header.iter().position(|h| h.eq_ignore_ascii_case(name));
    let need = |name: &str| {
        find(name).ok_or_else(|| TraceError::Format {
            path: path.to_path_buf(),
            message: format!(
                "header {:?} has no `{name}` column; expected timestamp, prompt_tokens, output_tokens[, model]",
                header.iter().collect::<Vec<_>>()
            ),
        })
    };
    let (ts, prompt, output) = (need("timestamp")?, need("prompt_tokens")?, need("output_tokens")?);
    let model_col = find("model");
    if model.is_some() && model_col.is_none() {
        return Err(TraceError::Format {
            path: path.to_path_buf(),
            message: "traffic.model filters on a `model` column, but the header has none".into(),
        });
    }
    rows(&mut rdr, path, |record, line| {
        if let (Some(want), Some(c)) = (model, model_col)
            && record.get(c) != Some(want)
        {
            return Ok(None);
        }
        let field = |c: usize| record.get(c).unwrap_or_default();
        let at = seconds_or_rfc3339(field(ts)).map_err(|m| parse_err(path, line, ts + 1, "timestamp", m))?;
        let p =
            parse_tokens(field(prompt)).map_err(|m| parse_err(path, line, prompt + 1, "prompt_tokens", m))?;
        let o =
            parse_tokens(field(output)).map_err(|m| parse_err(path, line, output + 1, "output_tokens", m))?;
        Ok(Some((at, p, o)))
    })
}

fn burstgpt_rows(
    reader: impl Read,
    path: &Path,
    model: Option<&str>,
) -> Result<Vec<(f64, u32, u32)>, TraceError> {
    let (mut rdr, header) = super::csv_with_header(reader, path)?;
    let want = ["Timestamp", "Model", "Request tokens", "Response tokens"];
    let got: Vec<&str> = header.iter().collect();
    if got.len() < want.len() || got[..want.len()] != want {
        return Err(TraceError::Format {
            path: path.to_path_buf(),
            message: format!("header is {got:?}, expected it to start with {want:?} (the BurstGPT format)"),
        });
    }
    rows(&mut rdr, path, |record, line| {
        if model.is_some_and(|m| record.get(1) != Some(m)) {
            return Ok(None);
        }
        let field = |c: usize| record.get(c).unwrap_or_default();
        let at = field(0)
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .ok_or_else(|| {
                parse_err(
                    path,
                    line,
                    1,
                    want[0],
                    format!("'{}' is not a number of seconds", field(0)),
                )
            })?;
        let p = parse_tokens(field(2)).map_err(|m| parse_err(path, line, 3, want[2], m))?;
        let o = parse_tokens(field(3)).map_err(|m| parse_err(path, line, 4, want[3], m))?;
        Ok(Some((at, p, o)))
    })
}

/// Streams the records of a CSV trace through `row`, which gets each record with its line and returns the parsed
/// row, or `None` to skip it (another model); a malformed record stops the read, naming its line.
fn rows<R: Read>(
    rdr: &mut csv::Reader<R>,
    path: &Path,
    mut row: impl FnMut(&csv::StringRecord, u64) -> Result<Option<(f64, u32, u32)>, TraceError>,
) -> Result<Vec<(f64, u32, u32)>, TraceError> {
    let mut out = Vec::new();
    let mut record = csv::StringRecord::new();
    loop {
        match rdr.read_record(&mut record) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => {
                let line = e.position().map_or(0, |p| p.line());
                return Err(parse_err(path, line, 1, "row", e.to_string()));
            }
        }
        let line = record.position().map_or(0, |p| p.line());
        if let Some(r) = row(&record, line)? {
            out.push(r);
        }
    }
    Ok(out)
}

#[derive(Deserialize)]
struct MooncakeRow {
    timestamp: f64,
    input_length: u32,
    output_length: u32,
}

fn mooncake_rows(reader: impl Read, path: &Path) -> Result<Vec<(f64, u32, u32)>, TraceError> {
    let mut out = Vec::new();
    let mut buf = BufReader::new(reader);
    let mut line = String::new();
    let mut n = 0u64;
    loop {
        line.clear();
        let read = buf.read_line(&mut line).map_err(|source| TraceError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        if read == 0 {
            break;
        }
        n += 1;
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        let row: MooncakeRow = serde_json::from_str(text).map_err(|e| {
            parse_err(
                path,
                n,
                e.column(),
                "json",
                format!("{e}; expected {{\"timestamp\": ms, \"input_length\": n, \"output_length\": n}}"),
            )
        })?;
        if !row.timestamp.is_finite() {
            return Err(parse_err(
                path,
                n,
                1,
                "timestamp",
                "not a finite number of ms".into(),
            ));
        }
        out.push((row.timestamp / 1000.0, row.input_length, row.output_length));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn p(f: Format, text: &str, model: Option<&str>) -> Result<LlmTrace, TraceError> {
        parse(f, text.as_bytes(), Path::new("t"), model)
    }

    #[test]
    fn generic_csv_any_column_order_seconds_or_rfc3339_and_model_filter() {
        let t = p(
            Format::Csv,
            "model,output_tokens,timestamp,prompt_tokens\na,5,10.5,100\nb,6,11,200\na,7,12,300\n",
            Some("a"),
        )
        .unwrap();
        assert_eq!(t.requests.len(), 2);
        assert_eq!(
            (
                t.requests[1].at,
                t.requests[1].prompt_tokens,
                t.requests[1].output_tokens
            ),
            (1.5, 300, 7)
        );
        let t = p(
            Format::Csv,
            "timestamp,prompt_tokens,output_tokens\n2024-05-10T00:00:01Z,1,1\n2024-05-10T00:00:00.5Z,2,2\n",
            None,
        )
        .unwrap();
        assert_eq!(t.requests[0].prompt_tokens, 2);
        assert!((t.requests[1].at - 0.5).abs() < 1e-9);
    }

    #[test]
    fn errors_name_file_line_and_column() {
        let e = p(
            Format::Csv,
            "timestamp,prompt_tokens,output_tokens\n1,2,3\n2,x,3\n",
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("t:3: column 2 (prompt_tokens)"), "{e}");
        let e = p(Format::Csv, "time,prompt_tokens,output_tokens\n", None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no `timestamp` column"), "{e}");
        let e = p(
            Format::Mooncake,
            "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1}\n{\"timestamp\": 5,",
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("t:2: column"), "{e}");
        let e = p(Format::BurstGpt, "Timestamp,Model\n", None).unwrap_err();
        assert_eq!(e.label(), "format");
        let e = p(
            Format::Csv,
            "timestamp,prompt_tokens,output_tokens,model\n1,1,1,a\n",
            Some("b"),
        )
        .unwrap_err();
        assert_eq!(e.label(), "empty");
    }

    #[test]
    fn burstgpt_and_mooncake() {
        let t = p(
            Format::BurstGpt,
            "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n\
             5,ChatGPT,472,18,490,Conversation log\n8,GPT-4,1000,0,1000,Conversation log\n9,ChatGPT,10,20,30,API log\n",
            Some("ChatGPT"),
        )
        .unwrap();
        assert_eq!(t.requests.len(), 2);
        assert_eq!(t.requests[1].at, 4.0);
        let t = p(
            Format::Mooncake,
            "{\"timestamp\": 0, \"input_length\": 6955, \"output_length\": 52, \"hash_ids\": [1, 2]}\n\n\
             {\"timestamp\": 1500, \"input_length\": 10, \"output_length\": 0}\n",
            None,
        )
        .unwrap();
        assert_eq!(t.requests[1].at, 1.5);
        assert_eq!(t.requests[1].output_tokens, 1);
    }

    /// A million rows parse in one pass (timed in release for docs/performance.md: run with `--nocapture`).
    #[test]
    fn a_million_rows_stream() {
        let mut text = String::with_capacity(20_000_000);
        text.push_str("timestamp,prompt_tokens,output_tokens\n");
        for i in 0..1_000_000u32 {
            text.push_str(&format!("{}.5,{},{}\n", i, i % 4000, i % 500));
        }
        let started = std::time::Instant::now();
        let t = p(Format::Csv, &text, None).unwrap();
        println!("1,000,000 csv rows parsed in {:?}", started.elapsed());
        assert_eq!(t.requests.len(), 1_000_000);
        assert_eq!(t.requests[999_999].at, 999_999.0);
    }
}
