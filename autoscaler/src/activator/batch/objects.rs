//! The OpenAI objects the batch API serves (`file`, `batch`) and the lines of its result files, as stored and as
//! answered. The stored record is the answered object plus the namespace it belongs to, so what a client reads
//! is exactly what was written.

use serde::{Deserialize, Serialize};
use tessera_core::batch::{BatchStatus, RequestCounts};

/// OpenAI's `file` object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileObject {
    /// `file-…`.
    pub id: String,
    /// Always `file`.
    pub object: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Unix seconds.
    pub created_at: u64,
    /// The name the client uploaded it under.
    pub filename: String,
    /// `batch` (uploaded), `batch_output` (a batch's results).
    pub purpose: String,
    /// `processed` once stored.
    pub status: String,
    /// The namespace (tenant) that owns it; not an OpenAI field, kept out of answers.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
}

impl FileObject {
    /// The object as answered (without Tessera's own fields).
    pub fn answer(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.id, "object": "file", "bytes": self.bytes, "created_at": self.created_at,
            "filename": self.filename, "purpose": self.purpose, "status": self.status,
        })
    }
}

/// One validation error of a batch (OpenAI's `errors.data[]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchErrorItem {
    /// A fixed code (`tessera_core::batch::LineError::code`).
    pub code: String,
    /// What is wrong and how to fix it.
    pub message: String,
    /// The field at fault, if one.
    pub param: Option<String>,
    /// The 1-based input line, if one.
    pub line: Option<u64>,
}

/// OpenAI's `errors` list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchErrors {
    /// Always `list`.
    pub object: String,
    /// The errors.
    pub data: Vec<BatchErrorItem>,
}

/// Token usage summed over the batch's answered lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Generated tokens.
    pub output_tokens: u64,
    /// Both.
    pub total_tokens: u64,
}

impl Usage {
    /// Adds one response body's `usage` (`prompt_tokens`, `completion_tokens`), if it has one.
    pub fn add_body(&mut self, body: &serde_json::Value) {
        let u = &body["usage"];
        let input = u["prompt_tokens"].as_u64().unwrap_or(0);
        let output = u["completion_tokens"].as_u64().unwrap_or(0);
        self.input_tokens += input;
        self.output_tokens += output;
        self.total_tokens += input + output;
    }
}

/// OpenAI's `batch` object, plus the namespace that owns it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchObject {
    /// `batch_…`.
    pub id: String,
    /// Always `batch`.
    pub object: String,
    /// The endpoint every line targets.
    pub endpoint: String,
    /// Validation errors (status `failed`).
    pub errors: Option<BatchErrors>,
    /// The input file.
    pub input_file_id: String,
    /// `24h` (or the duration the client gave).
    pub completion_window: String,
    /// The status.
    pub status: BatchStatus,
    /// Successful answers, once finalized.
    pub output_file_id: Option<String>,
    /// Failed lines, once finalized (when there are any).
    pub error_file_id: Option<String>,
    /// Unix seconds.
    pub created_at: u64,
    /// Unix seconds.
    pub in_progress_at: Option<u64>,
    /// Unix seconds: the deadline.
    pub expires_at: Option<u64>,
    /// Unix seconds.
    pub finalizing_at: Option<u64>,
    /// Unix seconds.
    pub completed_at: Option<u64>,
    /// Unix seconds.
    pub failed_at: Option<u64>,
    /// Unix seconds.
    pub expired_at: Option<u64>,
    /// Unix seconds.
    pub cancelling_at: Option<u64>,
    /// Unix seconds.
    pub cancelled_at: Option<u64>,
    /// Lines in, answered, failed.
    pub request_counts: RequestCounts,
    /// Tokens used by the answered lines.
    pub usage: Usage,
    /// The client's key/value pairs.
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
    /// The namespace (tenant); not an OpenAI field, kept out of answers.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Where the runner appends successful answers (exposed as `output_file_id` once finalized).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub output_data: String,
    /// Where the runner appends failed lines (exposed as `error_file_id` once finalized).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error_data: String,
}

impl BatchObject {
    /// The object as answered: Tessera's own fields removed, `status` as the client should see it
    /// (`cancelling` once a cancel is asked for and the runner has not finished it yet).
    pub fn answer(&self, cancel_requested: bool) -> serde_json::Value {
        let mut shown = self.clone();
        if cancel_requested
            && shown
                .status
                .on(tessera_core::batch::BatchEvent::CancelRequested)
                .is_ok()
        {
            shown.status = tessera_core::batch::BatchStatus::Cancelling;
        }
        shown.namespace.clear();
        shown.output_data.clear();
        shown.error_data.clear();
        serde_json::to_value(&shown).unwrap_or(serde_json::Value::Null)
    }
}

/// One line of a result file: OpenAI's shape. The record id ends in the input line's index, which is how a
/// runner that takes over knows which lines are answered.
pub fn result_line(
    batch_id: &str,
    index: u64,
    custom_id: &str,
    response: Option<(u16, serde_json::Value)>,
    error: Option<(&str, String)>,
) -> Vec<u8> {
    let response = response.map(|(status, body)| {
        serde_json::json!({ "status_code": status, "request_id": format!("{batch_id}-{index}"), "body": body })
    });
    let error = error.map(|(code, message)| serde_json::json!({ "code": code, "message": message }));
    let mut line = serde_json::to_vec(&serde_json::json!({
        "id": format!("batch_req_{batch_id}_{index}"), "custom_id": custom_id, "response": response, "error": error,
    }))
    .unwrap_or_default();
    line.push(b'\n');
    line
}

/// The input line index a result line records, if it is one of ours.
pub fn result_index(line: &serde_json::Value) -> Option<u64> {
    line["id"].as_str()?.rsplit('_').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_result_line_carries_its_index() {
        let line = result_line(
            "batch_x",
            42,
            "c-1",
            None,
            Some(("batch_cancelled", "cancelled".into())),
        );
        assert_eq!(*line.last().unwrap(), b'\n');
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(result_index(&v), Some(42));
        assert_eq!(v["error"]["code"], "batch_cancelled");
        assert_eq!(v["custom_id"], "c-1");
    }
}
