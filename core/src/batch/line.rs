//! Validation of a batch's input file, one JSONL line at a time, all or nothing: the batch starts only when
//! every line passes, and the first bad line is reported with its (1-based) number, what is wrong and how to
//! fix it, so a client can correct the file without guessing.
//!
//! A line is `{"custom_id": "...", "method": "POST", "url": "<the batch's endpoint>", "body": {...}}`, the
//! `body` an object naming a `model` this gateway serves. `custom_id`s are unique within the file: they are how
//! a client matches answers to questions, and how a runner that takes over knows which lines are answered.

use std::collections::HashSet;

use serde::Deserialize;

/// The endpoints a batch may target (OpenAI's, those vLLM serves).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    ChatCompletions,
    /// `/v1/completions`.
    Completions,
    /// `/v1/embeddings`.
    Embeddings,
}

impl Endpoint {
    /// Every endpoint, in the order error messages list them.
    pub const ALL: [Endpoint; 3] = [
        Endpoint::ChatCompletions,
        Endpoint::Completions,
        Endpoint::Embeddings,
    ];

    /// The path, as the batch's `endpoint` and each line's `url` spell it.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
            Endpoint::Embeddings => "/v1/embeddings",
        }
    }

    /// The endpoint a batch's `endpoint` field names.
    pub fn parse(s: &str) -> Result<Endpoint, String> {
        Endpoint::ALL.into_iter().find(|e| e.path() == s).ok_or_else(|| {
            format!(
                "endpoint {s:?} is not supported; use one of {}",
                Endpoint::ALL.map(Endpoint::path).join(", ")
            )
        })
    }
}

/// What a valid line holds that the runner needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidLine {
    /// The client's id for the line.
    pub custom_id: String,
    /// The `model` of its body.
    pub model: String,
}

/// Why a line (or the file) is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, strum::IntoStaticStr)]
pub enum LineError {
    /// Not JSON, or not the line's shape.
    #[error("line {line}: {why}")]
    #[strum(serialize = "invalid_json_line")]
    Malformed {
        /// 1-based line number.
        line: u64,
        /// What is wrong and how to fix it.
        why: String,
    },
    /// A `custom_id` seen on an earlier line.
    #[error(
        "line {line}: custom_id {custom_id:?} is already used on line {first}; every line needs its own custom_id"
    )]
    #[strum(serialize = "duplicate_custom_id")]
    DuplicateId {
        /// 1-based line number.
        line: u64,
        /// The id.
        custom_id: String,
        /// The line that used it first.
        first: u64,
    },
    /// `method` other than POST.
    #[error("line {line}: method {method:?} is not supported; batch lines must use \"POST\"")]
    #[strum(serialize = "invalid_method")]
    Method {
        /// 1-based line number.
        line: u64,
        /// The method given.
        method: String,
    },
    /// `url` other than the batch's endpoint.
    #[error(
        "line {line}: url {url:?} does not match the batch's endpoint {endpoint:?}; every line must target the endpoint the batch was created with"
    )]
    #[strum(serialize = "mismatched_url")]
    Url {
        /// 1-based line number.
        line: u64,
        /// The url given.
        url: String,
        /// The batch's endpoint.
        endpoint: &'static str,
    },
    /// The body's `model` is not one this gateway serves in the batch's namespace.
    #[error(
        "line {line}: model {model:?} is not served here; GET /v1/models lists the models this gateway serves"
    )]
    #[strum(serialize = "model_not_found")]
    UnknownModel {
        /// 1-based line number.
        line: u64,
        /// The model named.
        model: String,
    },
    /// More lines than the limit.
    #[error("the file has more than {max} requests (the limit for one batch); split it into several batches")]
    #[strum(serialize = "too_many_requests")]
    TooMany {
        /// The limit.
        max: u64,
    },
    /// No line at all.
    #[error("the file has no requests; a batch needs at least one line")]
    #[strum(serialize = "empty_file")]
    Empty,
}

impl LineError {
    /// The OpenAI-style error `code` (and metric label).
    pub fn code(&self) -> &'static str {
        self.into()
    }

    /// The 1-based line the error is about, if one.
    pub fn line(&self) -> Option<u64> {
        match self {
            LineError::Malformed { line, .. }
            | LineError::DuplicateId { line, .. }
            | LineError::Method { line, .. }
            | LineError::Url { line, .. }
            | LineError::UnknownModel { line, .. } => Some(*line),
            LineError::TooMany { .. } | LineError::Empty => None,
        }
    }
}

#[derive(Deserialize)]
struct RawLine {
    custom_id: Option<serde_json::Value>,
    method: Option<String>,
    url: Option<String>,
    body: Option<serde_json::Value>,
}

/// Checks a file's lines in order; keeps the `custom_id`s seen (bounded by `max_requests`).
#[derive(Debug)]
pub struct LineValidator {
    endpoint: Endpoint,
    max_requests: u64,
    /// custom_id → the 1-based line that used it.
    seen: std::collections::HashMap<String, u64>,
    /// Lines read so far, blank ones included (numbers match what an editor shows).
    line: u64,
    models: HashSet<String>,
}

impl LineValidator {
    /// A validator for a batch to `endpoint` whose lines may name any of `models`, at most `max_requests` lines.
    pub fn new(endpoint: Endpoint, models: impl IntoIterator<Item = String>, max_requests: u64) -> Self {
        LineValidator {
            endpoint,
            max_requests,
            seen: std::collections::HashMap::new(),
            line: 0,
            models: models.into_iter().collect(),
        }
    }

    /// Checks the next line of the file (without its newline). A blank line (a trailing newline, an empty
    /// last line) is skipped: `Ok(None)`.
    pub fn check(&mut self, raw: &[u8]) -> Result<Option<ValidLine>, LineError> {
        self.line += 1;
        let line = self.line;
        if raw.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        let malformed = |why: String| LineError::Malformed { line, why };
        let parsed: RawLine = serde_json::from_slice(raw).map_err(|e| {
            malformed(format!(
                "not a JSON object ({e}); each line must be {{\"custom_id\": ..., \"method\": \"POST\", \"url\": ..., \"body\": {{...}}}}"
            ))
        })?;
        let custom_id = match parsed.custom_id {
            Some(serde_json::Value::String(s)) if !s.is_empty() => s,
            Some(_) => return Err(malformed("custom_id must be a non-empty string".into())),
            None => {
                return Err(malformed(
                    "custom_id is missing; give every line a unique string custom_id".into(),
                ));
            }
        };
        let method = parsed
            .method
            .ok_or_else(|| malformed("method is missing; use \"POST\"".into()))?;
        if method != "POST" {
            return Err(LineError::Method { line, method });
        }
        let url = parsed
            .url
            .ok_or_else(|| malformed(format!("url is missing; use {:?}", self.endpoint.path())))?;
        if url != self.endpoint.path() {
            return Err(LineError::Url {
                line,
                url,
                endpoint: self.endpoint.path(),
            });
        }
        let body = match parsed.body {
            Some(serde_json::Value::Object(map)) => map,
            Some(_) => {
                return Err(malformed(
                    "body must be a JSON object (the request to send)".into(),
                ));
            }
            None => {
                return Err(malformed(
                    "body is missing; put the request to send in \"body\"".into(),
                ));
            }
        };
        let model = match body.get("model") {
            Some(serde_json::Value::String(m)) if !m.is_empty() => m.clone(),
            _ => {
                return Err(malformed(
                    "body.model is missing or not a string; name the model to run".into(),
                ));
            }
        };
        if !self.models.contains(&model) {
            return Err(LineError::UnknownModel { line, model });
        }
        if let Some(&first) = self.seen.get(&custom_id) {
            return Err(LineError::DuplicateId {
                line,
                custom_id,
                first,
            });
        }
        if self.seen.len() as u64 >= self.max_requests {
            return Err(LineError::TooMany {
                max: self.max_requests,
            });
        }
        self.seen.insert(custom_id.clone(), line);
        Ok(Some(ValidLine { custom_id, model }))
    }

    /// Ends the file: the number of requests, or why the file as a whole is refused.
    pub fn finish(self) -> Result<u64, LineError> {
        if self.seen.is_empty() {
            return Err(LineError::Empty);
        }
        Ok(self.seen.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    fn v() -> LineValidator {
        LineValidator::new(Endpoint::ChatCompletions, ["m".to_string()], 3)
    }

    fn line(id: &str) -> String {
        format!(
            r#"{{"custom_id":"{id}","method":"POST","url":"/v1/chat/completions","body":{{"model":"m"}}}}"#
        )
    }

    #[test]
    fn good_lines_pass_and_blank_lines_count_but_are_skipped() {
        let mut val = v();
        assert_eq!(val.check(line("a").as_bytes()).unwrap().unwrap().custom_id, "a");
        assert_eq!(val.check(b"  ").unwrap(), None);
        let err = val.check(line("a").as_bytes()).unwrap_err();
        assert_eq!(err.line(), Some(3));
        assert_eq!(err.code(), "duplicate_custom_id");
        assert!(err.to_string().contains("already used on line 1"), "{err}");
        assert_eq!(val.finish(), Ok(1));
    }

    #[test]
    fn each_fault_names_its_line_and_the_fix() {
        let cases: [(&str, &str); 8] = [
            ("not json", "invalid_json_line"),
            (
                r#"{"method":"POST","url":"/v1/chat/completions","body":{"model":"m"}}"#,
                "invalid_json_line",
            ),
            (
                r#"{"custom_id":"x","method":"GET","url":"/v1/chat/completions","body":{"model":"m"}}"#,
                "invalid_method",
            ),
            (
                r#"{"custom_id":"x","method":"POST","url":"/v1/embeddings","body":{"model":"m"}}"#,
                "mismatched_url",
            ),
            (
                r#"{"custom_id":"x","method":"POST","url":"/v1/chat/completions","body":[1]}"#,
                "invalid_json_line",
            ),
            (
                r#"{"custom_id":"x","method":"POST","url":"/v1/chat/completions","body":{}}"#,
                "invalid_json_line",
            ),
            (
                r#"{"custom_id":"x","method":"POST","url":"/v1/chat/completions","body":{"model":"other"}}"#,
                "model_not_found",
            ),
            (
                r#"{"custom_id":7,"method":"POST","url":"/v1/chat/completions","body":{"model":"m"}}"#,
                "invalid_json_line",
            ),
        ];
        for (text, code) in cases {
            let mut val = v();
            val.check(line("first").as_bytes()).unwrap();
            let err = val.check(text.as_bytes()).unwrap_err();
            assert_eq!(err.code(), code, "{text}: {err}");
            assert_eq!(err.line(), Some(2), "{text}");
            assert!(err.to_string().starts_with("line 2: "), "{err}");
        }
    }

    #[test]
    fn the_limit_and_the_empty_file() {
        let mut val = v();
        for id in ["a", "b", "c"] {
            val.check(line(id).as_bytes()).unwrap();
        }
        assert_eq!(
            val.check(line("d").as_bytes()).unwrap_err(),
            LineError::TooMany { max: 3 }
        );
        assert_eq!(v().finish(), Err(LineError::Empty));
        assert!(
            Endpoint::parse("/v1/responses")
                .unwrap_err()
                .contains("/v1/embeddings")
        );
        assert_eq!(Endpoint::parse("/v1/embeddings"), Ok(Endpoint::Embeddings));
    }

    proptest! {
        /// A file passes exactly when its ids are unique (and within the limit); the error names the first
        /// repeat's line.
        #[test]
        fn duplicates_are_found_at_their_line(ids in proptest::collection::vec(0u8..6, 1..10)) {
            let mut val = LineValidator::new(Endpoint::ChatCompletions, ["m".to_string()], 100);
            let mut first_dup = None;
            let mut seen = std::collections::HashSet::new();
            for (i, id) in ids.iter().enumerate() {
                if !seen.insert(*id) && first_dup.is_none() { first_dup = Some(i as u64 + 1); }
            }
            let mut got = None;
            for id in &ids {
                if let Err(e) = val.check(line(&format!("id-{id}")).as_bytes()) { got = e.line(); break; }
            }
            prop_assert_eq!(got, first_dup);
        }
    }
}
