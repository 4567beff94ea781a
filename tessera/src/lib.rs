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

/// `Error: <what>` and each cause below it once: a cause whose text the line above already says (an error
/// that formats its source into its own message) is not printed again.
pub fn report(e: &anyhow::Error) -> String {
    let mut out = format!("Error: {e}");
    let mut last = e.to_string();
    for cause in e.chain().skip(1) {
        let text = cause.to_string();
        if !last.contains(&text) {
            out.push_str(&format!("\n  caused by: {text}"));
        }
        last = text;
    }
    out
}

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
