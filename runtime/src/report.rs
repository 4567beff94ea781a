//! How a command reports the error it ends with: `Error: <what>` and each cause below it once, whatever
//! `RUST_BACKTRACE` says. A user's mistake (a missing file, a bad flag value, a wrong URL) is not a crash, and the
//! backtrace anyhow captures when that variable is set (as many Rust users have it) only buries the message.
//! Where the error was made is printed only on request: `RUST_LIB_BACKTRACE=1` or `RUST_BACKTRACE=full`. A panic
//! (a bug) keeps the standard library's report and its backtrace under `RUST_BACKTRACE=1`.

use std::backtrace::BacktraceStatus;

/// The report of `e`, with its backtrace when the environment asks for it ([`backtrace_requested`]).
pub fn report(e: &anyhow::Error) -> String {
    report_with(e, backtrace_requested())
}

/// `Error: <what>` and each cause below it once: a cause whose text the line above already says (an error that
/// formats its source into its own message) is not printed again. With `backtrace`, where the error was made
/// (when anyhow captured it).
pub fn report_with(e: &anyhow::Error, backtrace: bool) -> String {
    let mut out = format!("Error: {e}");
    let mut last = e.to_string();
    for cause in e.chain().skip(1) {
        let text = cause.to_string();
        if !last.contains(&text) {
            out.push_str(&format!("\n  caused by: {text}"));
        }
        last = text;
    }
    let bt = e.backtrace();
    if backtrace && bt.status() == BacktraceStatus::Captured {
        out.push_str(&format!("\n\nwhere the error was made:\n{bt}"));
    }
    out
}

/// Whether the person asked for errors' backtraces, not only panics': `RUST_LIB_BACKTRACE` set to anything but
/// `0`, or `RUST_BACKTRACE=full`.
pub fn backtrace_requested() -> bool {
    let var = |name| std::env::var(name).ok();
    var("RUST_LIB_BACKTRACE").is_some_and(|v| v != "0") || var("RUST_BACKTRACE").as_deref() == Some("full")
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context as _;

    fn missing_file() -> anyhow::Error {
        let io = std::fs::read("/nonexistent/tessera-report-test").expect_err("no such file");
        Err::<(), _>(io)
            .context("cannot read scenario /nonexistent/tessera-report-test")
            .expect_err("an error")
    }

    #[test]
    fn each_cause_once_and_no_backtrace_unless_asked() {
        let text = report_with(&missing_file(), false);
        assert!(text.starts_with("Error: cannot read scenario"), "{text}");
        assert_eq!(text.matches("No such file").count(), 1, "{text}");
        assert!(!text.contains("where the error was made"), "{text}");
    }

    #[test]
    fn a_cause_the_message_already_says_is_not_repeated() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
        let e = anyhow::Error::new(io).context("cannot read x: gone");
        assert_eq!(report_with(&e, false), "Error: cannot read x: gone");
    }
}
