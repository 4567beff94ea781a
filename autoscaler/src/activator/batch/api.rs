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
use super::store::{StoreError, check_id};
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

fn namespace(b: &Batches, p: &HashMap<String, String>) -> String {
    p.get("namespace")
        .cloned()
        .unwrap_or_else(|| b.app.default_namespace.clone())
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
async fn upload(State(b): State<Arc<Batches>>, Path(p): Params, req: Request) -> Result<Response, ApiError> {
    let ns = namespace(&b, &p);
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
    let mut form = Multipart::new(req.into_body(), &bound);
    let mut purpose = None;
    let mut stored: Option<(String, String, u64)> = None;
    let result = async {
        while let Some(part) = form.next_part().await.map_err(|e| ApiError::bad("invalid_multipart", None, e.to_string()))? {
            match (part.name.as_str(), part.filename) {
                ("purpose", _) => {
                    let mut text = Vec::new();
                    while let Some(c) = form.chunk().await.map_err(|e| ApiError::bad("invalid_multipart", None, e.to_string()))? {
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
                    while let Some(c) = form.chunk().await.map_err(|e| ApiError::bad("invalid_multipart", None, e.to_string()))? {
                        n += c.len() as u64;
                        if n > b.limits.max_file_bytes {
                            return Err(ApiError::new(
                                StatusCode::PAYLOAD_TOO_LARGE,
                                "file_too_large",
                                Some("file"),
                                format!(
                                    "the file is larger than {} bytes (the limit, --batch-max-file-bytes); split it into several batches",
                                    b.limits.max_file_bytes
                                ),
                            ));
                        }
                        w.write_all(&c).await.map_err(|e| StoreError::Io { path: id.clone(), source: e })?;
                    }
                    w.flush().await.map_err(|e| StoreError::Io { path: id.clone(), source: e })?;
                    if let Some(s) = stored.as_mut() {
                        s.2 = n;
                    }
                }
                _ => while form.chunk().await.map_err(|e| ApiError::bad("invalid_multipart", None, e.to_string()))?.is_some() {},
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

/// Newest first, then the page after `after` of at most `limit` (OpenAI's cursor pages).
fn page(mut items: Vec<(u64, String, serde_json::Value)>, q: &HashMap<String, String>) -> Response {
    items.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)));
    let limit = q
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .unwrap_or(20)
        .clamp(1, 10_000);
    let start = q
        .get("after")
        .and_then(|after| items.iter().position(|i| &i.1 == after).map(|p| p + 1))
        .unwrap_or(0);
    let rest = items.len().saturating_sub(start);
    let data: Vec<serde_json::Value> = items.into_iter().skip(start).take(limit).map(|i| i.2).collect();
    let first = data.first().and_then(|d| d["id"].as_str().map(str::to_owned));
    let last = data.last().and_then(|d| d["id"].as_str().map(str::to_owned));
    axum::Json(serde_json::json!({
        "object": "list", "data": data, "first_id": first, "last_id": last, "has_more": rest > limit,
    }))
    .into_response()
}

async fn list_files(
    State(b): State<Arc<Batches>>,
    Path(p): Params,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let ns = namespace(&b, &p);
    let files = b.store.list_files().await?;
    let items = files
        .into_iter()
        .filter(|f| f.namespace == ns && q.get("purpose").is_none_or(|pp| *pp == f.purpose))
        .map(|f| (f.created_at, f.id.clone(), f.answer()))
        .collect();
    Ok(page(items, &q))
}

async fn get_file(State(b): State<Arc<Batches>>, Path(p): Params) -> Result<Response, ApiError> {
    let f = owned_file(&b, &namespace(&b, &p), &id(&p)?).await?;
    Ok(axum::Json(f.answer()).into_response())
}

/// The file's bytes, streamed from the store 64 KiB at a time.
async fn content(State(b): State<Arc<Batches>>, Path(p): Params) -> Result<Response, ApiError> {
    let f = owned_file(&b, &namespace(&b, &p), &id(&p)?).await?;
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
    let ns = namespace(&b, &p);
    let f = owned_file(&b, &ns, &id(&p)?).await?;
    for batch in b.store.list_batches().await? {
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

/// `POST /v1/batches`.
async fn create(State(b): State<Arc<Batches>>, Path(p): Params, body: Bytes) -> Result<Response, ApiError> {
    let ns = namespace(&b, &p);
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
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            ApiError::bad(
                "invalid_completion_window",
                Some("completion_window"),
                format!("completion_window {window_s:?} is not a duration; use \"24h\""),
            )
        })?;
    let metadata = match &v["metadata"] {
        serde_json::Value::Null => None,
        serde_json::Value::Object(m) if m.len() <= 16 && m.values().all(serde_json::Value::is_string) => {
            Some(m.clone())
        }
        _ => {
            return Err(ApiError::bad(
                "invalid_metadata",
                Some("metadata"),
                "metadata must be an object of at most 16 string values",
            ));
        }
    };
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
        expires_at: Some(created + window.as_secs().max(1)),
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
    let ns = namespace(&b, &p);
    let mut items = Vec::new();
    for x in b.store.list_batches().await? {
        if x.namespace == ns {
            let cancel = b.store.cancel_requested(&x.id).await?;
            items.push((x.created_at, x.id.clone(), x.answer(cancel)));
        }
    }
    Ok(page(items, &q))
}

async fn get_batch(State(b): State<Arc<Batches>>, Path(p): Params) -> Result<Response, ApiError> {
    let x = owned_batch(&b, &namespace(&b, &p), &id(&p)?).await?;
    let cancel = b.store.cancel_requested(&x.id).await?;
    Ok(axum::Json(x.answer(cancel)).into_response())
}

/// `POST /v1/batches/{id}/cancel`: leaves a marker the runner acts on (the runner alone writes the record).
async fn cancel(State(b): State<Arc<Batches>>, Path(p): Params) -> Result<Response, ApiError> {
    let x = owned_batch(&b, &namespace(&b, &p), &id(&p)?).await?;
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
