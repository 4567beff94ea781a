//! The Azure Functions 2019 trace (`HashFunction,HashApp,HashOwner,<minute 1>,…,<minute 1440>`).
//!
//! Each row counts one function's invocations per minute over a day. The minute columns are named `1..1440` in
//! the original dataset and `minute_1..minute_1440` in the invitro samples; both are accepted, and only the
//! count of columns matters. The trace records no request sizes, so turning a row into LLM requests needs a
//! token distribution (see [`super::transform`]).

use std::io::Read;
use std::path::Path;

use super::TraceError;

/// One function's per-minute invocation counts.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionRow {
    /// `HashFunction`.
    pub hash_function: String,
    /// Invocations in each minute, minute 1 first.
    pub per_minute: Vec<u32>,
}

/// A parsed Azure Functions per-minute trace.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionsTrace {
    /// The rows in file order.
    pub rows: Vec<FunctionRow>,
}

impl FunctionsTrace {
    /// Reads a trace file.
    pub fn read(path: &Path) -> Result<Self, TraceError> {
        Self::parse(super::open(path)?, path)
    }

    /// Parses a trace from any reader; `path` only names the source in errors.
    pub fn parse(reader: impl Read, path: &Path) -> Result<Self, TraceError> {
        let (mut rdr, headers) = super::csv_with_header(reader, path)?;
        let names: Vec<String> = headers.iter().map(str::to_string).collect();
        if names.len() < 4 || names[0] != "HashFunction" || names[1] != "HashApp" || names[2] != "HashOwner" {
            return Err(TraceError::Format {
                path: path.to_path_buf(),
                message: format!(
                    "header starts {:?}, expected HashFunction,HashApp,HashOwner followed by one column per minute \
                     (the Azure Functions 2019 invocations format)",
                    names.iter().take(4).collect::<Vec<_>>()
                ),
            });
        }
        let mut rows = Vec::new();
        for record in rdr.records() {
            let record = record.map_err(|e| TraceError::Parse {
                path: path.to_path_buf(),
                line: e.position().map_or(0, |p| p.line()),
                column: 1,
                field: "row".into(),
                message: format!("{e} (every row needs {} columns)", names.len()),
            })?;
            let line = record.position().map_or(0, |p| p.line());
            let mut per_minute = Vec::with_capacity(names.len() - 3);
            for (i, field) in record.iter().enumerate().skip(3) {
                let n = field.parse::<u32>().map_err(|_| TraceError::Parse {
                    path: path.to_path_buf(),
                    line,
                    column: i + 1,
                    field: names[i].clone(),
                    message: format!("'{field}' is not a whole number of invocations"),
                })?;
                per_minute.push(n);
            }
            rows.push(FunctionRow {
                hash_function: record.get(0).unwrap_or_default().to_string(),
                per_minute,
            });
        }
        if rows.is_empty() {
            return Err(TraceError::Empty {
                path: path.to_path_buf(),
                message: "no functions after the header".into(),
            });
        }
        Ok(FunctionsTrace { rows })
    }

    /// The row whose `HashFunction` starts with `prefix` (hashes are long; a unique prefix is enough).
    pub fn find(&self, prefix: &str) -> Option<&FunctionRow> {
        let mut it = self.rows.iter().filter(|r| r.hash_function.starts_with(prefix));
        let first = it.next()?;
        // An ambiguous prefix must not silently pick one of several functions.
        if it.next().is_some() { None } else { Some(first) }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_both_header_styles() {
        let a = "HashFunction,HashApp,HashOwner,1,2,3\nabc,x,y,0,5,1\n";
        let b = "HashFunction,HashApp,HashOwner,minute_1,minute_2,minute_3\nabc,x,y,0,5,1\n";
        for s in [a, b] {
            let t = FunctionsTrace::parse(s.as_bytes(), Path::new("f.csv")).unwrap();
            assert_eq!(t.rows[0].per_minute, vec![0, 5, 1]);
            assert_eq!(t.find("ab").unwrap().hash_function, "abc");
        }
    }

    #[test]
    fn ambiguous_prefix_finds_nothing() {
        let s = "HashFunction,HashApp,HashOwner,1\nabc,x,y,0\nabd,x,y,1\n";
        let t = FunctionsTrace::parse(s.as_bytes(), Path::new("f.csv")).unwrap();
        assert!(t.find("ab").is_none());
        assert!(t.find("abd").is_some());
    }

    #[test]
    fn bad_count_names_line_and_minute_column() {
        let s = "HashFunction,HashApp,HashOwner,1,2\nabc,x,y,0,1\nabd,x,y,3,-1\n";
        let err = FunctionsTrace::parse(s.as_bytes(), Path::new("f.csv"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("f.csv:3: column 5 (2)"), "{err}");
        let s = "HashFunction,HashApp,HashOwner,1,2\nabc,x,y,0\n";
        let err = FunctionsTrace::parse(s.as_bytes(), Path::new("f.csv"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("f.csv:2"), "{err}");
        let err = FunctionsTrace::parse("Name,1\n".as_bytes(), Path::new("f.csv")).unwrap_err();
        assert_eq!(err.label(), "format");
    }
}
