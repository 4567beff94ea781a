//! Trace readers: real request arrivals for the what-if simulator.
//!
//! Two public formats are read:
//! - the **Azure LLM inference trace 2023** ([`azure_llm`]): one row per request with its arrival time and its
//!   prompt and output token counts;
//! - the **Azure Functions 2019 trace** ([`azure_functions`]): invocations per minute per function over a day. It
//!   carries no token counts, so arrivals are drawn as a Poisson process within each minute (seeded) and each
//!   request takes its (prompt, output) pair from an empirical token distribution, normally the LLM trace's.
//!
//! Both become a list of [`Arrival`]s in seconds from the start of the simulation, shaped per model by a
//! [`Transform`] (window, rate multiplier, circular time shift). Everything here is deterministic for a seed.

pub mod azure_functions;
pub mod azure_llm;
pub mod formats;
pub mod observed;
pub mod synthetic;
pub mod transform;

use std::io::Read;
use std::path::{Path, PathBuf};

pub use azure_functions::{FunctionRow, FunctionsTrace};
pub use azure_llm::{LlmRequest, LlmTrace};
pub use transform::Transform;

/// One request arriving at the cluster, in virtual seconds from the start of the simulation.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Arrival {
    /// Arrival time, seconds since the start of the simulation.
    pub at: f64,
    /// Prompt length in tokens.
    pub prompt_tokens: u32,
    /// Tokens the request generates (its `max_tokens`; the trace records what was actually generated).
    pub output_tokens: u32,
}

/// Why a trace could not be read. Every variant names the file, and parse errors the line and column.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum TraceError {
    /// The file could not be opened or read.
    #[error("cannot read trace {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A row or field is malformed.
    #[error("{path}:{line}: column {column} ({field}): {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// 1-based column number.
        column: usize,
        /// The column's name.
        field: String,
        /// What is wrong and what was expected.
        message: String,
    },
    /// The header is not the one this format has.
    #[error("{path}: {message}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong and what was expected.
        message: String,
    },
    /// The file holds no usable rows.
    #[error("{path}: {message}")]
    Empty {
        /// The file.
        path: PathBuf,
        /// What was looked for.
        message: String,
    },
}

/// Opens a trace file; the error names it.
fn open(path: &Path) -> Result<std::fs::File, TraceError> {
    std::fs::File::open(path).map_err(|source| TraceError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// A CSV reader over a trace (header row, fields trimmed) and its header; `path` only names the source in errors.
/// Both trace formats are CSV with a fixed header, so they share this and check their own column names.
fn csv_with_header<R: Read>(
    reader: R,
    path: &Path,
) -> Result<(csv::Reader<R>, csv::StringRecord), TraceError> {
    let mut rdr = csv::ReaderBuilder::new()
        .has_headers(true)
        .trim(csv::Trim::All)
        .from_reader(reader);
    let header = rdr
        .headers()
        .map_err(|e| TraceError::Format {
            path: path.to_path_buf(),
            message: format!("bad header: {e}"),
        })?
        .clone();
    Ok((rdr, header))
}

impl TraceError {
    /// A fixed label per variant, for metrics and logs.
    pub fn label(&self) -> &'static str {
        self.into()
    }
}
