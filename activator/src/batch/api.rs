//! The Files and Batches routes, at `/v1/...` (the default namespace) and `/namespaces/<ns>/v1/...`. A file or
//! batch belongs to the namespace it was created in; another namespace sees a 404, as for any unknown id.
//! Every refusal is an OpenAI error object naming what is wrong and how to fix it.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use tessera_core::batch::{BatchStatus, Endpoint, RequestCounts};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::{info, warn};

use super::multipart::{Multipart, boundary};
use super::objects::{BatchObject, FileObject, Usage};
use super::store::{Listed, StoreError, check_id};
use super::{Batches, unix_s};

/// An API refusal: status, OpenAI `type`, `code`, `param` and a message.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    param: Option<&'static str>,
    message: String,
}

impl ApiError {
    fn new(
        status: StatusCode,
        code: &'static str,
        param: Option<&'static str>,
        message: impl Into<String>,
    ) -> Self {
        ApiError {
            status,
            code,
            param,
            message: message.into(),
        }
    }

    fn bad(code: &'static str, param: Option<&'static str>, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, param, message)
    }

    fn not_found(what: &str, id: &str, list: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            None,
            format!("no {what} with id {id:?} in this namespace; GET {list} lists them"),
        )
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        warn!(error = %e, "batch store");
        match e {
            StoreError::BadId(_) => Self::bad("invalid_id", None, e.to_string()),
            _ => Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "store_error",
                None,
                e.to_string(),
            ),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = if self.status.is_server_error() {
            "server_error"
        } else {
            "invalid_request_error"
        };
        let body = serde_json::json!({ "error": {
            "message": self.message, "type": kind, "param": self.param, "code": self.code } });
        (self.status, axum::Json(body)).into_response()
    }
}

type Params = Path<HashMap<String, String>>;

/// The namespace a route addresses: `/namespaces/<ns>/…`, or the default one. It names a folder of the store's
/// listings, so it is checked like an id.
fn namespace(b: &Batches, p: &HashMap<String, String>) -> Result<String, ApiError> {
    let ns = p
        .get("namespace")
        .cloned()
        .unwrap_or_else(|| b.app.default_namespace.clone());
    check_id(&ns).map_err(|_| {
        ApiError::bad(
            "invalid_namespace",
            None,
            format!(
                "namespace {:?} is not a Kubernetes namespace name (lowercase letters, digits and '-')",
                truncated(&ns)
            ),
        )
    })?;
    Ok(ns)
}

/// At most 64 characters of what a client sent, for an error message.
fn truncated(s: &str) -> String {
    match s.char_indices().nth(64) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// OpenAI's bounds on a batch's `metadata`: 16 pairs, keys of at most 64 characters, values of at most 512.
const METADATA_PAIRS: usize = 16;
const METADATA_KEY_CHARS: usize = 64;
const METADATA_VALUE_CHARS: usize = 512;
/// The longest completion window accepted: a week (OpenAI offers 24h). Longer would keep a batch's lines and
/// files on the shared volume for that long, and a huge one would overflow the deadline.
const MAX_COMPLETION_WINDOW: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);
/// The largest `POST /v1/batches` body: its fields, with the metadata at OpenAI's bounds even if every character
/// is escaped (16 × 576 characters × 6 bytes), and room to spare.
const MAX_CREATE_BODY: usize = 128 * 1024;
/// The most items one list page holds (OpenAI's bound).
const MAX_PAGE: usize = 100;

/// Checks a batch's `metadata` against OpenAI's bounds, naming the first pair at fault.
fn check_metadata(
    v: &serde_json::Value,
) -> Result<Option<serde_json::Map<String, serde_json::Value>>, ApiError> {
    let bad = |msg: String| ApiError::bad("invalid_metadata", Some("metadata"), msg);
    let m = match v {
        serde_json::Value::Null => return Ok(None),
        serde_json::Value::Object(m) => m,
        _ => return Err(bad("metadata must be an object of string values".into())),
    };
    if m.len() > METADATA_PAIRS {
        return Err(bad(format!(
            "metadata has {} pairs; at most {METADATA_PAIRS} are kept",
            m.len()
        )));
    }
    for (k, val) in m {
        if k.chars().count() > METADATA_KEY_CHARS {
            return Err(bad(format!(
                "metadata key {:?} is longer than {METADATA_KEY_CHARS} characters",
                truncated(k)
            )));
        }
        match val {
            serde_json::Value::String(text) if text.chars().count() <= METADATA_VALUE_CHARS => {}
            serde_json::Value::String(_) => {
                return Err(bad(format!(
                    "metadata value of {:?} is longer than {METADATA_VALUE_CHARS} characters",
                    truncated(k)
                )));
            }
            _ => {
                return Err(bad(format!(
                    "metadata value of {:?} must be a string",
                    truncated(k)
                )));
            }
        }
    }
    Ok(Some(m.clone()))
}

/// A namespace over one of its quotas: 429, naming the flag and what to do.
fn over_quota(what: String) -> ApiError {
    ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "namespace_quota_exceeded",
        None,
        what,
    )
}

fn id(p: &HashMap<String, String>) -> Result<String, ApiError> {
    let id = p.get("id").cloned().unwrap_or_default();
    check_id(&id).map_err(ApiError::from)?;
    Ok(id)
}

/// The routes, with `batches` as their state. Without a store every route answers 404 saying how to enable it.
pub fn routes(batches: Option<Arc<Batches>>) -> axum::Router {
    let Some(batches) = batches else {
        let off = || async {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "batch_api_disabled",
                None,
                "the Files and Batches API is off; start the activator with --batch-store <dir>",
            )
        };
        let mut r = axum::Router::new();
        for prefix in ["", "/namespaces/{namespace}"] {
            r = r
                .route(&format!("{prefix}/v1/files"), get(off).post(off))
                .route(&format!("{prefix}/v1/files/{{id}}"), get(off).delete(off))
                .route(&format!("{prefix}/v1/files/{{id}}/content"), get(off))
                .route(&format!("{prefix}/v1/batches"), get(off).post(off))
                .route(&format!("{prefix}/v1/batches/{{id}}"), get(off))
                .route(&format!("{prefix}/v1/batches/{{id}}/cancel"), post(off));
        }
        return r;
    };
    let mut r = axum::Router::new();
    for prefix in ["", "/namespaces/{namespace}"] {
        r = r
            .route(&format!("{prefix}/v1/files"), get(list_files).post(upload))
            .route(
                &format!("{prefix}/v1/files/{{id}}"),
                get(get_file).delete(delete_file),
            )
            .route(&format!("{prefix}/v1/files/{{id}}/content"), get(content))
            .route(&format!("{prefix}/v1/batches"), get(list_batches).post(create))
            .route(&format!("{prefix}/v1/batches/{{id}}"), get(get_batch))
            .route(&format!("{prefix}/v1/batches/{{id}}/cancel"), post(cancel));
    }
    r.with_state(batches)
}

/// `POST /v1/files`: the `file` part streams to the store, counted against `--batch-max-file-bytes`.
/// A multipart read error as an API error: a stalled upload is `408`, as the proxy answers a stalled body.
fn multipart_error(e: super::multipart::MultipartError) -> ApiError {
    match e {
        super::multipart::MultipartError::Stalled(_) => ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "body_read_timeout",
            None,
            e.to_string(),
        ),
        _ => ApiError::bad("invalid_multipart", None, e.to_string()),
    }
}

async fn upload(State(b): State<Arc<Batches>>, Path(p): Params, req: Request) -> Result<Response, ApiError> {
    let ns = namespace(&b, &p)?;
    // The namespace's quotas, from its listing (sizes are kept in the entries, no document is read). Two uploads
    // racing may each pass with the last room: the bound is overshot by at most one file per concurrent upload.
    let listed = b.store.list_files(&ns).await?;
    if listed.len() as u64 >= b.limits.max_files_per_namespace {
        return Err(over_quota(format!(
            "namespace {ns} holds {} files, the most it may (--batch-max-files-per-namespace); delete files it no longer needs (DELETE /v1/files/{{id}})",
            listed.len()
        )));
    }
    let used: u64 = listed.iter().map(|l| l.bytes).sum();
    let room = b.limits.max_namespace_bytes.saturating_sub(used);
    if room == 0 {
        return Err(over_quota(format!(
            "namespace {ns} holds {used} bytes of files, the most it may (--batch-max-namespace-bytes); delete files it no longer needs (DELETE /v1/files/{{id}})"
        )));
    }
    let max_bytes = b.limits.max_file_bytes.min(room);
    let ct = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let Some(bound) = boundary(ct) else {
        return Err(ApiError::bad(
            "invalid_content_type",
            None,
            super::multipart::MultipartError::NoBoundary.to_string(),
        ));
    };
    let mut form = Multipart::new(req.into_body(), &bound, b.app.limits.body_read_timeout);
    let mut purpose = None;
    let mut stored: Option<(String, String, u64)> = None;
    let result = async {
        while let Some(part) = form.next_part().await.map_err(multipart_error)? {
            match (part.name.as_str(), part.filename) {
                ("purpose", _) => {
                    let mut text = Vec::new();
                    while let Some(c) = form.chunk().await.map_err(multipart_error)? {
                        if text.len() + c.len() > 64 {
                            return Err(ApiError::bad("invalid_purpose", Some("purpose"), "purpose must be \"batch\""));
                        }
                        text.extend_from_slice(&c);
                    }
                    purpose = Some(String::from_utf8_lossy(&text).trim().to_owned());
                }
                ("file", filename) if stored.is_none() => {
                    let id = b.new_id("file", '-');
                    let mut w = b.store.create_data(&id).await?;
                    stored = Some((id.clone(), filename.unwrap_or_else(|| "upload.jsonl".into()), 0));
                    let mut n = 0u64;
                    while let Some(c) = form.chunk().await.map_err(multipart_error)? {
                        n += c.len() as u64;
                        if n > max_bytes {
                            return Err(if max_bytes < b.limits.max_file_bytes {
                                over_quota(format!(
                                    "the file is larger than the {max_bytes} bytes left to namespace {ns} (--batch-max-namespace-bytes); delete files it no longer needs"
                                ))
                            } else {
                                ApiError::new(
                                    StatusCode::PAYLOAD_TOO_LARGE,
                                    "file_too_large",
                                    Some("file"),
                                    format!(
                                        "the file is larger than {} bytes (the limit, --batch-max-file-bytes); split it into several batches",
                                        b.limits.max_file_bytes
                                    ),
                                )
                            });
                        }
                        w.write_all(&c).await.map_err(|e| StoreError::Io { path: id.clone(), source: e })?;
                    }
                    w.flush().await.map_err(|e| StoreError::Io { path: id.clone(), source: e })?;
                    if let Some(s) = stored.as_mut() {
                        s.2 = n;
                    }
                }
                _ => while form.chunk().await.map_err(multipart_error)?.is_some() {},
            }
        }
        Ok(())
    }
    .await;
    let cleanup = |b: Arc<Batches>, id: String| async move {
        if let Err(e) = b.store.delete_file(&id).await {
            warn!(file = %id, error = %e, "could not remove a refused upload");
        }
    };
    if let Err(e) = result {
        if let Some((id, ..)) = stored {
            cleanup(b.clone(), id).await;
        }
        return Err(e);
    }
    let Some((id, filename, bytes)) = stored else {
        return Err(ApiError::bad(
            "missing_file",
            Some("file"),
            "no file part; send the JSONL file as the form field \"file\"",
        ));
    };
    if purpose.as_deref() != Some("batch") {
        cleanup(b.clone(), id).await;
        return Err(ApiError::bad(
            "invalid_purpose",
            Some("purpose"),
            format!(
                "purpose {:?} is not supported here; use purpose=batch",
                purpose.unwrap_or_default()
            ),
        ));
    }
    let file = FileObject {
        id,
        object: "file".into(),
        bytes,
        created_at: unix_s(),
        filename,
        purpose: "batch".into(),
        status: "processed".into(),
        namespace: ns,
    };
    b.store.put_file(&file).await?;
    info!(file = %file.id, bytes, namespace = %file.namespace, "batch file uploaded");
    Ok(axum::Json(file.answer()).into_response())
}

async fn owned_file(b: &Batches, ns: &str, id: &str) -> Result<FileObject, ApiError> {
    match b.store.get_file(id).await? {
        Some(f) if f.namespace == ns => Ok(f),
        _ => Err(ApiError::not_found("file", id, "/v1/files")),
    }
}

async fn owned_batch(b: &Batches, ns: &str, id: &str) -> Result<BatchObject, ApiError> {
    match b.store.get_batch(id).await? {
        Some(x) if x.namespace == ns => Ok(x),
        _ => Err(ApiError::not_found("batch", id, "/v1/batches")),
    }
}

/// OpenAI's cursor page over a listing (newest first): the items after `after`, at most `limit` (≤ 100), each
/// loaded by `load` (`None`: not shown, e.g. another purpose). Only the page's documents are read, plus the ones a
/// filter skips.
async fn page<F, Fut>(
    listed: Vec<Listed>,
    q: &HashMap<String, String>,
    mut load: F,
) -> Result<Response, ApiError>
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = Result<Option<serde_json::Value>, ApiError>>,
{
    let limit = q
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .unwrap_or(20)
        .clamp(1, MAX_PAGE);
    // Ids sort by creation (`store::newest_first`), so the cursor needs no document, and a deleted one still
    // marks its place.
    let after = q.get("after");
    let mut data = Vec::with_capacity(limit);
    let mut has_more = false;
    for l in listed
        .into_iter()
        .filter(|l| after.is_none_or(|a| l.id.as_str() < a.as_str()))
    {
        let Some(item) = load(l.id).await? else { continue };
        if data.len() == limit {
            has_more = true;
            break;
        }
        data.push(item);
    }
    let first = data.first().and_then(|d| d["id"].as_str().map(str::to_owned));
    let last = data.last().and_then(|d| d["id"].as_str().map(str::to_owned));
    Ok(axum::Json(serde_json::json!({
        "object": "list", "data": data, "first_id": first, "last_id": last, "has_more": has_more,
    }))
    .into_response())
}

async fn list_files(
    State(b): State<Arc<Batches>>,
    Path(p): Params,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let ns = namespace(&b, &p)?;
    let listed = b.store.list_files(&ns).await?;
    let purpose = q.get("purpose").cloned();
    let (b, ns) = (&b, &ns);
    page(listed, &q, |id| {
        let purpose = purpose.clone();
        async move {
            Ok(b.store
                .get_file(&id)
                .await?
                .filter(|f| f.namespace == *ns && purpose.as_ref().is_none_or(|pp| *pp == f.purpose))
                .map(|f| f.answer()))
        }
    })
    .await
}

async fn get_file(State(b): State<Arc<Batches>>, Path(p): Params) -> Result<Response, ApiError> {
    let f = owned_file(&b, &namespace(&b, &p)?, &id(&p)?).await?;
    Ok(axum::Json(f.answer()).into_response())
}

/// The file's bytes, streamed from the store 64 KiB at a time.
async fn content(State(b): State<Arc<Batches>>, Path(p): Params) -> Result<Response, ApiError> {
    let f = owned_file(&b, &namespace(&b, &p)?, &id(&p)?).await?;
    let reader = b.store.open_data(&f.id).await?;
    let stream = futures::stream::unfold(reader, |mut r| async move {
        let mut buf = vec![0u8; 64 * 1024];
        match r.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok::<Bytes, std::io::Error>(Bytes::from(buf)), r))
            }
            Err(e) => Some((Err(e), r)),
        }
    });
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from_stream(stream),
    )
        .into_response())
}

/// `DELETE /v1/files/{id}`: refused (409) while a batch that is not final reads it or writes it.
async fn delete_file(State(b): State<Arc<Batches>>, Path(p): Params) -> Result<Response, ApiError> {
    let ns = namespace(&b, &p)?;
    let f = owned_file(&b, &ns, &id(&p)?).await?;
    // Only a batch not final yet can be reading or writing it: the active ones, read one at a time.
    for active in b.store.active_batches().await? {
        let Some(batch) = b.store.get_batch(&active).await? else {
            continue;
        };
        if batch.status.is_running()
            && (batch.input_file_id == f.id || batch.output_data == f.id || batch.error_data == f.id)
        {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "file_in_use",
                None,
                format!(
                    "batch {} ({}) uses this file; cancel it or wait until it ends, then delete",
                    batch.id,
                    batch.status.as_str()
                ),
            ));
        }
    }
    b.store.delete_file(&f.id).await?;
    Ok(axum::Json(serde_json::json!({ "id": f.id, "object": "file", "deleted": true })).into_response())
}

/// A small JSON body, read whole within `--body-read-timeout` and at most [`MAX_CREATE_BODY`] bytes.
async fn read_small_body(b: &Batches, req: Request) -> Result<Bytes, ApiError> {
    use http_body_util::BodyExt;
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            None,
            format!(
                "a batch request is at most {MAX_CREATE_BODY} bytes; the input goes in a file (POST /v1/files)"
            ),
        )
    };
    let limit = b.app.limits.body_read_timeout;
    let read = http_body_util::Limited::new(req.into_body(), MAX_CREATE_BODY).collect();
    match tokio::time::timeout(limit, read).await {
        Ok(Ok(c)) => Ok(c.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => Err(too_large()),
        Ok(Err(e)) => Err(ApiError::bad(
            "invalid_body",
            None,
            format!("could not read the body: {e}"),
        )),
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "body_read_timeout",
            None,
            format!("the body did not arrive within {limit:?} (--body-read-timeout)"),
        )),
    }
}

/// `POST /v1/batches`.
async fn create(State(b): State<Arc<Batches>>, Path(p): Params, req: Request) -> Result<Response, ApiError> {
    let ns = namespace(&b, &p)?;
    let body = read_small_body(&b, req).await?;
    let v: serde_json::Value = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad(
            "invalid_json",
            None,
            format!("the body must be a JSON object: {e}"),
        )
    })?;
    let input = v["input_file_id"].as_str().ok_or_else(|| {
        ApiError::bad(
            "missing_input_file_id",
            Some("input_file_id"),
            "input_file_id is required (the id POST /v1/files answered)",
        )
    })?;
    check_id(input)?;
    let file = owned_file(&b, &ns, input).await?;
    if file.purpose != "batch" {
        return Err(ApiError::bad(
            "invalid_input_file",
            Some("input_file_id"),
            format!(
                "file {input} has purpose {:?}; upload the input with purpose=batch",
                file.purpose
            ),
        ));
    }
    let endpoint = v["endpoint"].as_str().unwrap_or_default();
    Endpoint::parse(endpoint).map_err(|e| ApiError::bad("invalid_endpoint", Some("endpoint"), e))?;
    let window_s = v["completion_window"].as_str().unwrap_or_default();
    let window = humantime::parse_duration(window_s)
        .ok()
        .filter(|d| !d.is_zero() && *d <= MAX_COMPLETION_WINDOW)
        .ok_or_else(|| {
            ApiError::bad(
                "invalid_completion_window",
                Some("completion_window"),
                format!(
                    "completion_window {:?} is not a duration between 1s and {}; use \"24h\"",
                    truncated(window_s),
                    humantime::format_duration(MAX_COMPLETION_WINDOW)
                ),
            )
        })?;
    let metadata = check_metadata(&v["metadata"])?;
    // The namespace's bound on batches not final yet (each holds a share of the runner and of the volume).
    let mut active = 0u64;
    for id in b.store.active_batches().await? {
        if b.store
            .get_batch(&id)
            .await?
            .is_some_and(|x| x.namespace == ns && !x.status.is_final())
        {
            active += 1;
        }
    }
    if active >= b.limits.max_active_per_namespace {
        return Err(over_quota(format!(
            "namespace {ns} has {active} batches not finished, the most it may (--batch-max-active-per-namespace); wait for one to end or cancel one"
        )));
    }
    let id = b.new_id("batch", '_');
    let tail = id.trim_start_matches("batch_");
    let created = unix_s();
    let batch = BatchObject {
        id: id.clone(),
        object: "batch".into(),
        endpoint: endpoint.to_owned(),
        errors: None,
        input_file_id: file.id,
        completion_window: window_s.to_owned(),
        status: BatchStatus::Validating,
        output_file_id: None,
        error_file_id: None,
        created_at: created,
        in_progress_at: None,
        expires_at: Some(created.saturating_add(window.as_secs().max(1))),
        finalizing_at: None,
        completed_at: None,
        failed_at: None,
        expired_at: None,
        cancelling_at: None,
        cancelled_at: None,
        request_counts: RequestCounts::default(),
        usage: Usage::default(),
        metadata,
        namespace: ns,
        output_data: format!("file-{tail}-output"),
        error_data: format!("file-{tail}-errors"),
        model: String::new(),
    };
    b.store.put_batch(&batch).await?;
    info!(batch = %batch.id, input = %batch.input_file_id, namespace = %batch.namespace, "batch created");
    b.wake.notify_one();
    Ok(axum::Json(batch.answer(false)).into_response())
}

async fn list_batches(
    State(b): State<Arc<Batches>>,
    Path(p): Params,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let ns = namespace(&b, &p)?;
    let listed = b.store.list_batches(&ns).await?;
    let (b, ns) = (&b, &ns);
    page(listed, &q, |id| async move {
        let Some(x) = b.store.get_batch(&id).await?.filter(|x| x.namespace == *ns) else {
            return Ok(None);
        };
        let cancel = b.store.cancel_requested(&x.id).await?;
        Ok(Some(x.answer(cancel)))
    })
    .await
}

async fn get_batch(State(b): State<Arc<Batches>>, Path(p): Params) -> Result<Response, ApiError> {
    let x = owned_batch(&b, &namespace(&b, &p)?, &id(&p)?).await?;
    let cancel = b.store.cancel_requested(&x.id).await?;
    Ok(axum::Json(x.answer(cancel)).into_response())
}

/// `POST /v1/batches/{id}/cancel`: leaves a marker the runner acts on (the runner alone writes the record).
async fn cancel(State(b): State<Arc<Batches>>, Path(p): Params) -> Result<Response, ApiError> {
    let x = owned_batch(&b, &namespace(&b, &p)?, &id(&p)?).await?;
    x.status
        .on(tessera_core::batch::BatchEvent::CancelRequested)
        .map_err(|e| {
            ApiError::new(
                StatusCode::CONFLICT,
                "batch_not_cancellable",
                None,
                format!("{e}; only a validating or in-progress batch can be cancelled"),
            )
        })?;
    b.store.request_cancel(&x.id).await?;
    info!(batch = %x.id, "batch cancel requested");
    b.wake.notify_one();
    let mut answer = x.answer(true);
    if answer["cancelling_at"].is_null() {
        answer["cancelling_at"] = serde_json::Value::from(unix_s());
    }
    Ok(axum::Json(answer).into_response())
}
