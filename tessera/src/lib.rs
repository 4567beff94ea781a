//! What the `tessera` and `tessera-sidecar` binaries share: the log set-up and the one-report error format.

use std::io::IsTerminal;

/// Log format: human-readable text or one JSON object per line.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The one-report error format (`Error:` and each cause once; a backtrace only on request), shared with the
/// simulator's stand-alone example.
pub use tessera_runtime::report::report;

/// Logs to stderr at `default_level` unless RUST_LOG says otherwise.
pub fn init_logging(format: LogFormat, default_level: &str) {
    use tracing_subscriber::EnvFilter;
    // Logs go to stderr so that commands whose stdout is data (crdgen, simulate, pack) stay pipeable.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colour only for a terminal: a redirected log keeps no escape codes.
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
