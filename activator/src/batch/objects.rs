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

/// The part of a response body usage is read from: serde skips every other field without building it, so a
/// large answer costs no more than its bytes to read.
#[derive(Deserialize, Default)]
struct BodyUsage {
    #[serde(default)]
    usage: Option<UsageIn>,
}

#[derive(Deserialize, Default)]
struct UsageIn {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

impl Usage {
    /// Adds one response body's `usage` (`prompt_tokens`, `completion_tokens`), if it has one.
    pub fn add_raw(&mut self, body: &[u8]) {
        let u = serde_json::from_slice::<BodyUsage>(body)
            .ok()
            .and_then(|b| b.usage)
            .unwrap_or_default();
        self.input_tokens += u.prompt_tokens;
        self.output_tokens += u.completion_tokens;
        self.total_tokens += u.prompt_tokens + u.completion_tokens;
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
    /// The one model every line names, found by validation (empty: several, or not validated yet): the batch
    /// takes its turn among that model's batches (`tessera_core::batch::schedule`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub model: String,
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
        shown.model.clear();
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

/// A successful or failed answer's result line around the model's body as it came, in three pieces (head, body,
/// tail) so the body is never copied nor parsed into a tree: a JSON body is embedded as it is (its newlines, which
/// JSON allows only between tokens, made spaces so the line stays one line), anything else as a JSON string.
pub fn answer_line(
    batch_id: &str,
    index: u64,
    custom_id: &str,
    status: u16,
    body: bytes::Bytes,
) -> [bytes::Bytes; 3] {
    let head = serde_json::to_string(&serde_json::json!({
        "id": format!("batch_req_{batch_id}_{index}"), "custom_id": custom_id,
    }))
    .unwrap_or_default();
    let request_id = serde_json::to_string(&format!("{batch_id}-{index}")).unwrap_or_default();
    // `{"id":…,"custom_id":…` + `,"response":{"status_code":S,"request_id":R,"body":` + body + `},"error":null}\n`
    let head = format!(
        "{},\"response\":{{\"status_code\":{status},\"request_id\":{request_id},\"body\":",
        head.trim_end_matches('}')
    );
    let body = if serde_json::from_slice::<serde::de::IgnoredAny>(&body).is_ok() {
        if memchr::memchr2(b'\n', b'\r', &body).is_some() {
            let mut flat = body.to_vec();
            for b in &mut flat {
                if *b == b'\n' || *b == b'\r' {
                    *b = b' ';
                }
            }
            bytes::Bytes::from(flat)
        } else {
            body
        }
    } else {
        bytes::Bytes::from(serde_json::to_vec(&String::from_utf8_lossy(&body)).unwrap_or_default())
    };
    [
        bytes::Bytes::from(head),
        body,
        bytes::Bytes::from_static(b"},\"error\":null}\n"),
    ]
}

/// What a result line is read back for: its id (the input line's index) and its body's usage. serde skips the
/// rest without building it.
#[derive(Deserialize)]
struct StoredLine<'a> {
    #[serde(borrow)]
    id: std::borrow::Cow<'a, str>,
    #[serde(default)]
    response: Option<StoredResponse>,
}

#[derive(Deserialize)]
struct StoredResponse {
    #[serde(default)]
    body: AnyBodyUsage,
}

/// The usage of a stored body, whatever the body is (an object, or the string a non-JSON answer became):
/// read field by field, every other value skipped unbuilt.
#[derive(Default)]
struct AnyBodyUsage(Usage);

impl<'de> Deserialize<'de> for AnyBodyUsage {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = AnyBodyUsage;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a response body")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<AnyBodyUsage, A::Error> {
                let mut usage = Usage::default();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    if key == "usage" {
                        let u: Option<UsageIn> = map.next_value().unwrap_or_default();
                        let u = u.unwrap_or_default();
                        usage.input_tokens += u.prompt_tokens;
                        usage.output_tokens += u.completion_tokens;
                        usage.total_tokens += u.prompt_tokens + u.completion_tokens;
                    } else {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
                Ok(AnyBodyUsage(usage))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<AnyBodyUsage, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(AnyBodyUsage::default())
            }
            fn visit_str<E>(self, _: &str) -> Result<AnyBodyUsage, E> {
                Ok(AnyBodyUsage::default())
            }
            fn visit_bool<E>(self, _: bool) -> Result<AnyBodyUsage, E> {
                Ok(AnyBodyUsage::default())
            }
            fn visit_i64<E>(self, _: i64) -> Result<AnyBodyUsage, E> {
                Ok(AnyBodyUsage::default())
            }
            fn visit_u64<E>(self, _: u64) -> Result<AnyBodyUsage, E> {
                Ok(AnyBodyUsage::default())
            }
            fn visit_f64<E>(self, _: f64) -> Result<AnyBodyUsage, E> {
                Ok(AnyBodyUsage::default())
            }
            fn visit_unit<E>(self) -> Result<AnyBodyUsage, E> {
                Ok(AnyBodyUsage::default())
            }
        }
        d.deserialize_any(V)
    }
}

/// A result line read back: the input line index it records (if it is one of ours) and its body's usage.
pub fn read_result(line: &[u8]) -> Option<(u64, Usage)> {
    let stored: StoredLine<'_> = serde_json::from_slice(line).ok()?;
    let index = stored.id.rsplit('_').next()?.parse().ok()?;
    let mut usage = Usage::default();
    if let Some(r) = stored.response {
        usage = r.body.0;
    }
    Some((index, usage))
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
        assert_eq!(read_result(&line).map(|r| r.0), Some(42));
        assert_eq!(v["error"]["code"], "batch_cancelled");
        assert_eq!(v["custom_id"], "c-1");
    }

    #[test]
    fn an_answer_line_embeds_the_body_as_it_came_and_stays_one_line() {
        let join = |p: [bytes::Bytes; 3]| p.iter().flat_map(|b| b.to_vec()).collect::<Vec<u8>>();
        let pretty = bytes::Bytes::from_static(
            b"{\n  \"usage\": {\"prompt_tokens\": 3, \"completion_tokens\": 4},\r\n  \"x\": \"a\\nb\"\n}",
        );
        let line = join(answer_line("batch_x", 7, "c\"7", 200, pretty));
        assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1, "one line");
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["custom_id"], "c\"7");
        assert_eq!(v["response"]["status_code"], 200);
        assert_eq!(v["response"]["request_id"], "batch_x-7");
        assert_eq!(
            v["response"]["body"]["x"], "a\nb",
            "an escaped newline inside a string is kept"
        );
        assert!(v["error"].is_null());
        let (index, usage) = read_result(&line).unwrap();
        assert_eq!((index, usage.total_tokens), (7, 7));
        // Not JSON: kept as a string.
        let line = join(answer_line(
            "batch_x",
            8,
            "c",
            502,
            bytes::Bytes::from_static(b"<html>bad\ngateway"),
        ));
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["response"]["body"], "<html>bad\ngateway");
        assert_eq!(read_result(&line).map(|r| r.0), Some(8));
    }
}
