//! Why a Prometheus history could not become a scenario. Every message names what is missing and how to get it:
//! a wrong report is worse than none.

use std::path::PathBuf;
use std::time::Duration;

/// The scrape job that gives Tessera what it reads, for the messages that need one.
/// What a server sent, made safe to print: control characters (an escape sequence can retitle or recolour the
/// terminal) and the Unicode bidirectional overrides (which reorder what is shown) become visible `\u{..}` escapes,
/// line breaks a space. Label values (`model_name`), error bodies and warnings all pass through here before they
/// reach a message, a report or the scenario file.
pub fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\n' | '\r' | '\t' => out.push(' '),
            c if c.is_control()
                || ('\u{202a}'..='\u{202e}').contains(&c)
                || ('\u{2066}'..='\u{2069}').contains(&c) =>
            {
                out.push_str(&format!("\\u{{{:x}}}", c as u32));
            }
            c => out.push(c),
        }
    }
    out
}

/// An error body as a message can show it: the start of its text, printable; an HTML page (a proxy's or a
/// server's error page, not Prometheus's API) is named rather than pasted.
pub fn body_preview(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(300)])
        .trim()
        .to_string();
    let lower = text.to_ascii_lowercase();
    if lower.starts_with("<!doctype html") || lower.starts_with("<html") || lower.contains("<body") {
        return "(an HTML page, not Prometheus's JSON API)".to_owned();
    }
    printable(&text)
}

pub const SCRAPE_CONFIG_HINT: &str = "\
add a scrape job for the vLLM pods' /metrics, for example:
  scrape_configs:
    - job_name: vllm
      kubernetes_sd_configs: [{ role: pod }]
      relabel_configs:
        - source_labels: [__meta_kubernetes_pod_container_port_name]
          regex: http|metrics
          action: keep
        - source_labels: [__meta_kubernetes_namespace]
          target_label: namespace
        - source_labels: [__meta_kubernetes_pod_name]
          target_label: pod
(or a PodMonitor selecting the vLLM pods, with the Prometheus Operator)";

/// Why `simulate --prometheus` stopped.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum PromError {
    /// A flag's value cannot be used.
    #[error("{0}")]
    Config(String),
    /// A file named by a flag (token, CA) could not be read.
    #[error("cannot read {what} {path}: {source}")]
    File {
        /// What the file is for.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// No connection could be made.
    #[error(
        "cannot reach Prometheus at {url}: {reason}. Check --prometheus (from outside the cluster: \
         `kubectl -n monitoring port-forward svc/prometheus-operated 9090` and --prometheus http://127.0.0.1:9090)"
    )]
    Unreachable {
        /// The base URL.
        url: String,
        /// The transport's reason.
        reason: String,
    },
    /// Prometheus did not answer in time.
    #[error(
        "Prometheus at {url} did not answer within {}: {query}. Raise --prometheus-timeout, or ask for less: a \
         longer --step or a shorter --since", humantime::format_duration(*after)
    )]
    Timeout {
        /// The base URL.
        url: String,
        /// The limit.
        after: Duration,
        /// The query that timed out.
        query: String,
    },
    /// An HTTP status that is not Prometheus's answer (a proxy, an auth layer, a wrong path).
    #[error("Prometheus at {url} answered HTTP {status} to {query}: {body}{hint}")]
    Http {
        /// The base URL.
        url: String,
        /// The status.
        status: u16,
        /// The query.
        query: String,
        /// The start of the body.
        body: String,
        /// What to do about it.
        hint: &'static str,
    },
    /// Prometheus refused the query.
    #[error("Prometheus refused {query}: {error_type}: {error}")]
    Api {
        /// The query.
        query: String,
        /// Prometheus's `errorType`.
        error_type: String,
        /// Prometheus's `error`.
        error: String,
    },
    /// The answer is larger than the cap.
    #[error(
        "Prometheus's answer to {query} is larger than {limit} bytes: narrow it with --namespace/--selector, or \
         ask for fewer steps (a longer --step or a shorter --since)"
    )]
    TooLarge {
        /// The query.
        query: String,
        /// The cap.
        limit: usize,
    },
    /// The answer is not Prometheus's JSON.
    #[error(
        "Prometheus's answers so far, {query} included, are larger than {limit} bytes together: ask for less \
         history (a shorter --since, a longer --step) or fewer models (--namespace/--selector)"
    )]
    TooLargeTotal { query: String, limit: usize },
    #[error(
        "the answer to {query} is not Prometheus's HTTP API JSON ({reason}); is --prometheus the server's base URL?"
    )]
    BadResponse {
        /// The query.
        query: String,
        /// What was wrong.
        reason: String,
    },
    /// Prometheus said its answer is partial (a federated or remote-read source failed).
    #[error(
        "Prometheus answered {query} with warnings, so the data may be partial: {warnings}. Fix the source it \
         names, or narrow the window"
    )]
    Warnings {
        /// The query.
        query: String,
        /// Prometheus's warnings, joined.
        warnings: String,
    },
    /// Prometheus holds no vLLM metrics in the window.
    #[error(
        "Prometheus at {url} holds no vLLM metrics (vllm:*{selector}) between {from} and {to}. Tessera reads vLLM's \
         own metrics; {SCRAPE_CONFIG_HINT}"
    )]
    NoVllmMetrics {
        /// The base URL.
        url: String,
        /// The label matchers applied.
        selector: String,
        /// Start of the window (RFC 3339).
        from: String,
        /// End of the window.
        to: String,
    },
    /// A metric the conversion needs is missing for a model.
    #[error(
        "model {model}: Prometheus has no {metric} in the window, so {why}. It is exported by vLLM's /metrics: \
         check that the scrape job keeps it (no metric_relabel_configs dropping vllm:* series){extra}"
    )]
    MissingMetric {
        /// The model.
        model: String,
        /// The metric.
        metric: String,
        /// What cannot be known without it.
        why: String,
        /// More advice.
        extra: String,
    },
    /// The history starts later than the window asked for.
    #[error(
        "Prometheus holds vLLM metrics only from {first_seen}, {percent:.0}% into the window asked for ({from} to \
         {to}): pass --since {suggest} (or an --until inside the history), or raise the server's retention \
         (--storage.tsdb.retention.time)"
    )]
    Partial {
        /// The first step with data.
        first_seen: String,
        /// How far into the window that is.
        percent: f64,
        /// Window start.
        from: String,
        /// Window end.
        to: String,
        /// A --since that fits the history.
        suggest: String,
        /// The seconds of history held, whole steps (what `fetch` reads instead).
        covered_s: f64,
    },
}

impl PromError {
    /// A fixed label per variant, for logs.
    pub fn label(&self) -> &'static str {
        self.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_shows_control_characters_and_bidi_overrides_escaped() {
        assert_eq!(printable("chat\u{1b}]0;x\u{7}"), "chat\\u{1b}]0;x\\u{7}");
        assert_eq!(printable("a\u{202e}b"), "a\\u{202e}b");
        assert_eq!(printable("line\none\ttab"), "line one tab");
        assert_eq!(
            printable("Qwen/Qwen2.5-7B-Instruct é"),
            "Qwen/Qwen2.5-7B-Instruct é"
        );
        assert_eq!(
            body_preview(b"<html><body>nope</body></html>"),
            "(an HTML page, not Prometheus's JSON API)"
        );
        assert_eq!(body_preview(b"  no token \x1b[0m "), "no token \\u{1b}[0m");
    }
}
