//! The OpenAI-compatible API: `/v1/chat/completions`, `/v1/completions`, `/v1/models`, and errors in
//! OpenAI's JSON shape.
//!
//! Requests are read as loose JSON (like vLLM, unknown fields are ignored) so that any OpenAI client works.
//! The text the emulator "generates" is words from a fixed list, one token each, chosen by a per-request
//! random generator seeded from `--seed` and the request's number, so runs repeat.
//!
//! Prompt tokens: counted exactly when the prompt is a list of token ids (`/v1/completions`, as in vLLM), or
//! taken from the extension field `tessera_prompt_tokens`; otherwise estimated as one token per 4 characters
//! (OpenAI's rule of thumb) plus a few tokens of chat template per message.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tracing::warn;

use super::AppState;
use super::driver::Tok;
use crate::model::{FinishReason, ModelError, Request};

/// An error answered in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
    param: Option<String>,
}

impl ApiError {
    /// 400 Bad Request.
    pub fn bad_request(message: impl Into<String>, param: Option<&'static str>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "BadRequestError",
            message: message.into(),
            param: param.map(str::to_owned),
        }
    }

    /// 400 for a body that fails vLLM's request schema before any handler runs (FastAPI/pydantic validation):
    /// vLLM 0.32 answers these with type "Bad Request" and `param` = pydantic's location, e.g. `body.messages`.
    pub fn validation(kind: &str, loc: String, msg: &str, input: &str) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "Bad Request",
            message: format!(
                "1 validation error:\n  {{'type': '{kind}', 'loc': '{loc}', 'msg': '{msg}', 'input': '{input}'}}"
            ),
            param: Some(loc),
        }
    }

    /// 400 for a prompt that alone fills the context (vLLM 0.32's wording; `param` is `input_tokens`).
    pub fn prompt_too_long(max_model_len: u32, prompt: u32) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "BadRequestError",
            message: format!(
                "This model's maximum context length is {max_model_len} tokens. However, your prompt contains \
                 {prompt} input tokens, which exceeds this limit even without any output tokens. Please reduce the \
                 length of the input prompt. (parameter=input_tokens, value={prompt})"
            ),
            param: Some("input_tokens".into()),
        }
    }

    /// 404 for an unknown model (vLLM's wording).
    pub fn model_not_found(model: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            kind: "NotFoundError",
            message: format!("The model `{model}` does not exist."),
            param: Some("model".into()),
        }
    }

    /// 503 while starting, asleep or shutting down.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "ServiceUnavailableError",
            message: message.into(),
            param: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.status.as_u16(),
            }
        });
        (self.status, axum::Json(body)).into_response()
    }
}

/// Words the emulator "generates"; each is one token.
const WORDS: &[&str] = &[
    " the", " of", " and", " to", " a", " in", " is", " that", " for", " it", " as", " with", " on", " was",
    " be", " by", " this", " are", " or", " from", " at", " an", " which", " have", " not", " can", " model",
    " GPU", " memory", " cache", " token", " request", " batch", " server", " latency", " queue", " block",
    " share", " load", " time", " first", " more", " each", " when", " one", " will", " its", " all",
    " also", " than", " into", " only", " other", " some", " such", " these", " there", " their", " then",
    " used", " we", " you", " new", " scale",
];

/// The two endpoints differ only in their JSON shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completions,
}

/// A parsed request.
#[derive(Debug)]
struct Parsed {
    model: String,
    prompt_tokens: u32,
    max_tokens: Option<u32>,
    stream: bool,
    include_usage: bool,
    ignore_eos: bool,
    /// OpenAI's `seed`: the same seed gives the same text (as vLLM at temperature 0 does).
    seed: Option<u64>,
}

fn get_u32(body: &Value, key: &'static str) -> Result<Option<u32>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| {
                ApiError::bad_request(
                    format!("{key} must be a non-negative integer, got {v}"),
                    Some(key),
                )
            }),
    }
}

fn get_bool(body: &Value, key: &'static str) -> Result<bool, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(ApiError::bad_request(
            format!("{key} must be a boolean, got {v}"),
            Some(key),
        )),
    }
}

/// Rough token count of text: one token per 4 characters, at least one.
fn estimate_tokens(text: &str) -> u32 {
    u32::try_from(text.chars().count().div_ceil(4))
        .unwrap_or(u32::MAX)
        .max(1)
}

/// A required field that is absent (or of the wrong kind), reported the way vLLM's request schema does.
fn missing_field(body: &Value, field: &str) -> ApiError {
    let items = body.as_object().map_or(0, serde_json::Map::len);
    let (kind, msg) = if body.get(field).is_some() {
        ("list_type", "Input should be a valid list")
    } else {
        ("missing", "Field required")
    };
    ApiError::validation(
        kind,
        format!("body.{field}"),
        msg,
        &format!("<dict of {items} items>"),
    )
}

fn parse(endpoint: Endpoint, raw: &[u8]) -> Result<Parsed, ApiError> {
    let body: Value = serde_json::from_slice(raw).map_err(|e| {
        // pydantic reports the character offset of the error; serde's column is 1-based.
        let offset = e.column().saturating_sub(1);
        ApiError::validation(
            "json_invalid",
            format!("body.{offset}"),
            "JSON decode error",
            "<dict of 0 items>",
        )
    })?;
    if !body.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
            None,
        ));
    }
    let model = match body.get("model") {
        Some(Value::String(m)) => m.clone(),
        _ => {
            return Err(ApiError::bad_request(
                "`model` is required and must be a string",
                Some("model"),
            ));
        }
    };
    if let Some(n) = get_u32(&body, "n")?
        && n != 1
    {
        return Err(ApiError::bad_request("the emulator serves n = 1 only", Some("n")));
    }
    let estimated = match endpoint {
        Endpoint::Chat => {
            let Some(Value::Array(msgs)) = body.get("messages") else {
                return Err(missing_field(&body, "messages"));
            };
            if msgs.is_empty() {
                return Err(ApiError::bad_request(
                    "`messages` must not be empty",
                    Some("messages"),
                ));
            }
            // About 4 tokens of chat template per message plus 3 for the assistant header (Llama/Qwen templates).
            let mut total: u32 = 3;
            for m in msgs {
                let content = match m.get("content") {
                    Some(Value::String(s)) => estimate_tokens(s),
                    Some(Value::Array(parts)) => parts
                        .iter()
                        .filter_map(|p| p.get("text").and_then(Value::as_str))
                        .map(estimate_tokens)
                        .fold(0u32, u32::saturating_add),
                    _ => 0,
                };
                total = total.saturating_add(4).saturating_add(content);
            }
            total
        }
        Endpoint::Completions => match body.get("prompt") {
            Some(Value::String(s)) => estimate_tokens(s),
            // A list of token ids is counted exactly, as vLLM does.
            Some(Value::Array(items)) if items.iter().all(Value::is_number) && !items.is_empty() => {
                u32::try_from(items.len()).unwrap_or(u32::MAX)
            }
            Some(Value::Array(items)) if items.len() == 1 => match &items[0] {
                Value::String(s) => estimate_tokens(s),
                Value::Array(ids) if !ids.is_empty() => u32::try_from(ids.len()).unwrap_or(u32::MAX),
                _ => {
                    return Err(ApiError::bad_request(
                        "`prompt` must not be empty",
                        Some("prompt"),
                    ));
                }
            },
            Some(Value::Array(_)) => {
                return Err(ApiError::bad_request(
                    "the emulator serves one prompt per request (a batch of prompts is not supported)",
                    Some("prompt"),
                ));
            }
            _ => return Err(missing_field(&body, "prompt")),
        },
    };
    let prompt_tokens = match get_u32(&body, "tessera_prompt_tokens")? {
        Some(0) => {
            return Err(ApiError::bad_request(
                "tessera_prompt_tokens must be at least 1",
                Some("tessera_prompt_tokens"),
            ));
        }
        Some(n) => n,
        None => estimated,
    };
    let max_tokens = match get_u32(&body, "max_completion_tokens")? {
        Some(n) => Some(n),
        None => get_u32(&body, "max_tokens")?,
    };
    let include_usage = match body.get("stream_options") {
        Some(o) if o.is_object() => get_bool(o, "include_usage")?,
        _ => false,
    };
    Ok(Parsed {
        model,
        prompt_tokens,
        max_tokens,
        stream: get_bool(&body, "stream")?,
        include_usage,
        ignore_eos: get_bool(&body, "ignore_eos")?,
        seed: match body.get("seed") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_i64().map(|n| n as u64).ok_or_else(|| {
                ApiError::bad_request(format!("seed must be an integer, got {v}"), Some("seed"))
            })?),
        },
    })
}

/// A draw from a log-normal with the median and spread of the Azure LLM 2023 conversation trace's output
/// lengths (median 129 tokens, mean 211 → σ ≈ 0.99): where the emulated model would stop on its own.
fn natural_length(rng: &mut ChaCha8Rng) -> u32 {
    let (u1, u2): (f64, f64) = (rng.random::<f64>().max(f64::MIN_POSITIVE), rng.random::<f64>());
    let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
    let len = (129f64.ln() + 0.99 * z).exp();
    len.round().clamp(1.0, 1e9) as u32
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Handles both completion endpoints.
pub async fn complete(state: Arc<AppState>, endpoint: Endpoint, raw: Bytes) -> Response {
    match complete_inner(state, endpoint, raw).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn complete_inner(state: Arc<AppState>, endpoint: Endpoint, raw: Bytes) -> Result<Response, ApiError> {
    state.check_ready()?;
    let p = parse(endpoint, &raw)?;
    if !state.served_model_names.contains(&p.model) {
        return Err(ApiError::model_not_found(&p.model));
    }
    let seq = state.next_id();
    // A seeded request's text depends on its seed alone (and on the weights being right: the sleep surface's salt
    // is non-zero after a wake that went wrong), so a canary sent before and after a sleep can be compared.
    let stream_seed = match p.seed {
        Some(seed) => seed.wrapping_mul(0xD1B5_4A32_D192_ED03) ^ state.sleep.answer_salt(),
        None => seq.wrapping_mul(0x9E37_79B9_7F4A_7C15),
    };
    let mut rng = ChaCha8Rng::seed_from_u64(state.seed ^ stream_seed);
    let max_model_len = state.max_model_len;
    // vLLM 0.32 caps max_tokens at what is left of the context (its default, too) instead of refusing.
    let Some(max_tokens) = crate::model::capped_max_tokens(max_model_len, p.prompt_tokens, p.max_tokens)
    else {
        return Err(ApiError::prompt_too_long(max_model_len, p.prompt_tokens));
    };
    let stop_at = if p.ignore_eos {
        None
    } else {
        Some(natural_length(&mut rng))
    };
    let req = Request {
        id: seq,
        prompt_tokens: p.prompt_tokens,
        max_tokens,
        stop_at,
    };
    let rx = match state.engine.submit(req).await {
        Ok(Ok(rx)) => rx,
        Ok(Err(e @ (ModelError::RequestTooLong { .. } | ModelError::ZeroMaxTokens))) => {
            return Err(ApiError::bad_request(e.to_string(), Some("max_tokens")));
        }
        Ok(Err(e)) => return Err(ApiError::bad_request(e.to_string(), None)),
        Err(e) => return Err(ApiError::unavailable(e.to_string())),
    };
    let ctx = Ctx {
        endpoint,
        id: match endpoint {
            Endpoint::Chat => format!("chatcmpl-{seq:016x}"),
            Endpoint::Completions => format!("cmpl-{seq:016x}"),
        },
        created: now_unix(),
        model: p.model,
        prompt_tokens: p.prompt_tokens,
        rng,
    };
    if p.stream {
        Ok(stream_response(ctx, rx, p.include_usage))
    } else {
        Ok(full_response(ctx, rx).await)
    }
}

struct Ctx {
    endpoint: Endpoint,
    id: String,
    created: u64,
    model: String,
    prompt_tokens: u32,
    rng: ChaCha8Rng,
}

impl Ctx {
    fn word(&mut self) -> &'static str {
        WORDS[self.rng.random_range(0..WORDS.len())]
    }

    fn usage(&self, completion: u32) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": u64::from(self.prompt_tokens) + u64::from(completion),
            "completion_tokens": completion,
        })
    }

    /// One SSE event for a chunk whose choice is `choice` (already JSON).
    fn chunk(&self, choice: &str) -> String {
        let object = match self.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completions => "text_completion",
        };
        format!(
            "data: {{\"id\":\"{}\",\"object\":\"{object}\",\"created\":{},\"model\":{},\"choices\":[{choice}]}}\n\n",
            self.id,
            self.created,
            Value::String(self.model.clone())
        )
    }

    fn token_choice(&self, text: &str, finish: Option<FinishReason>) -> String {
        let finish = finish.map_or("null".to_owned(), |r| format!("\"{}\"", r.as_str()));
        match self.endpoint {
            // vLLM adds `stop_reason` to a chat chunk only when it finishes, and to every completion chunk.
            Endpoint::Chat if finish == "null" => format!(
                "{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}},\"logprobs\":null,\"finish_reason\":null}}"
            ),
            Endpoint::Chat => format!(
                "{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}},\"logprobs\":null,\"finish_reason\":{finish},\
                 \"stop_reason\":null}}"
            ),
            Endpoint::Completions => format!(
                "{{\"index\":0,\"text\":\"{text}\",\"logprobs\":null,\"finish_reason\":{finish},\"stop_reason\":null}}"
            ),
        }
    }
}

/// What the stream has left to do.
enum Phase {
    Tokens,
    Done,
}

fn stream_response(ctx: Ctx, rx: mpsc::UnboundedReceiver<Tok>, include_usage: bool) -> Response {
    let mut first = String::new();
    if ctx.endpoint == Endpoint::Chat {
        // vLLM's first chat chunk carries the role and empty content.
        first = ctx.chunk("{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}");
    }
    let head =
        futures::stream::iter((!first.is_empty()).then(|| Ok::<Bytes, Infallible>(Bytes::from(first))));
    let body = futures::stream::unfold(
        (rx, ctx_box(ctx), Phase::Tokens),
        move |(mut rx, mut ctx, phase)| async move {
            if matches!(phase, Phase::Done) {
                return None;
            }
            let first = rx.recv().await;
            let mut out = String::new();
            let mut next = first;
            // Drain whatever else is ready, so a burst of tokens becomes one write.
            loop {
                match next {
                    Some(Tok::Token) => {
                        let w = ctx.word();
                        out.push_str(&ctx.chunk(&ctx.token_choice(w, None)));
                    }
                    Some(Tok::Finished {
                        reason,
                        output_tokens,
                    }) => {
                        out.push_str(&ctx.chunk(&ctx.token_choice("", Some(reason))));
                        if include_usage {
                            let usage = ctx.usage(output_tokens);
                            let object = match ctx.endpoint {
                                Endpoint::Chat => "chat.completion.chunk",
                                Endpoint::Completions => "text_completion",
                            };
                            let chunk = json!({
                                "id": ctx.id, "object": object, "created": ctx.created, "model": ctx.model,
                                "choices": [], "usage": usage,
                            });
                            out.push_str(&format!("data: {chunk}\n\n"));
                        }
                        out.push_str("data: [DONE]\n\n");
                        return Some((Ok(Bytes::from(out)), (rx, ctx, Phase::Done)));
                    }
                    None => {
                        // The engine dropped the request (shutdown): end the stream the way vLLM does on abort.
                        if out.is_empty() {
                            return None;
                        }
                        return Some((Ok(Bytes::from(out)), (rx, ctx, Phase::Done)));
                    }
                }
                match rx.try_recv() {
                    Ok(t) => next = Some(t),
                    Err(_) => break,
                }
            }
            Some((Ok(Bytes::from(out)), (rx, ctx, Phase::Tokens)))
        },
    );
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream; charset=utf-8")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(head.chain(body)))
        .unwrap_or_else(|e| {
            warn!(error = %e, "could not build the streaming response");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        })
}

fn ctx_box(ctx: Ctx) -> Box<Ctx> {
    Box::new(ctx)
}

async fn full_response(mut ctx: Ctx, mut rx: mpsc::UnboundedReceiver<Tok>) -> Response {
    let mut text = String::new();
    let (reason, output_tokens) = loop {
        match rx.recv().await {
            Some(Tok::Token) => text.push_str(ctx.word()),
            Some(Tok::Finished {
                reason,
                output_tokens,
            }) => break (reason, output_tokens),
            None => {
                return ApiError::unavailable("the engine stopped before the request finished")
                    .into_response();
            }
        }
    };
    let choice = match ctx.endpoint {
        Endpoint::Chat => json!({
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": null,
            "finish_reason": reason.as_str(),
            "stop_reason": null,
        }),
        Endpoint::Completions => json!({
            "index": 0, "text": text, "logprobs": null, "finish_reason": reason.as_str(), "stop_reason": null,
        }),
    };
    let object = match ctx.endpoint {
        Endpoint::Chat => "chat.completion",
        Endpoint::Completions => "text_completion",
    };
    axum::Json(json!({
        "id": ctx.id, "object": object, "created": ctx.created, "model": ctx.model,
        "choices": [choice], "usage": ctx.usage(output_tokens),
    }))
    .into_response()
}

/// The model card's `permission` entry, with the values vLLM 0.32 always writes.
fn permission(created: u64) -> Value {
    json!({
        "id": format!("modelperm-{created:016x}"), "object": "model_permission", "created": created,
        "allow_create_engine": false, "allow_sampling": true, "allow_logprobs": true,
        "allow_search_indices": false, "allow_view": true, "allow_fine_tuning": false, "organization": "*",
        "group": null, "is_blocking": false,
    })
}

/// `GET /v1/models`.
pub async fn models(State(state): State<Arc<AppState>>) -> Response {
    let created = now_unix();
    let data: Vec<Value> = state
        .served_model_names
        .iter()
        .map(|name| {
            json!({
                "id": name, "object": "model", "created": created, "owned_by": "vllm",
                "root": state.model_root, "parent": null, "max_model_len": state.max_model_len,
                "permission": [permission(created)],
            })
        })
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_chat_and_completions() {
        let p = parse(
            Endpoint::Chat,
            br#"{"model":"m","messages":[{"role":"user","content":"abcdefgh"}],"max_tokens":5,"stream":true,
                "stream_options":{"include_usage":true}}"#,
        )
        .unwrap();
        assert_eq!(
            (p.prompt_tokens, p.max_tokens, p.stream, p.include_usage),
            (3 + 4 + 2, Some(5), true, true)
        );
        let p = parse(Endpoint::Completions, br#"{"model":"m","prompt":[1,2,3,4,5]}"#).unwrap();
        assert_eq!(p.prompt_tokens, 5);
        let p = parse(
            Endpoint::Completions,
            br#"{"model":"m","prompt":"x","tessera_prompt_tokens":900}"#,
        )
        .unwrap();
        assert_eq!(p.prompt_tokens, 900);
    }

    #[test]
    fn bad_requests_say_what_is_wrong() {
        let e = parse(Endpoint::Chat, b"{not json").unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let e = parse(Endpoint::Chat, br#"{"model":"m"}"#).unwrap_err();
        assert!(e.message.contains("messages"));
        let e = parse(
            Endpoint::Completions,
            br#"{"model":"m","prompt":"x","max_tokens":-1}"#,
        )
        .unwrap_err();
        assert!(e.message.contains("max_tokens"));
    }

    #[test]
    fn natural_lengths_follow_the_azure_median() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut v: Vec<u32> = (0..4001).map(|_| natural_length(&mut rng)).collect();
        v.sort_unstable();
        let median = v[2000];
        assert!((110..150).contains(&median), "median {median}");
    }
}
