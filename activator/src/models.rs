//! `GET /v1/models` and `GET /v1/models/{id}`: the models this gateway serves, each described as its server
//! describes it.
//!
//! vLLM's model object carries fields clients read: `max_model_len` above all (k6's script and other clients size
//! their prompts by it and fall back to 4,096 tokens without it), `root`, `parent`. So the gateway asks a ready
//! server of each model for its `/v1/models` (bounded in time and size), keeps the entry whose `id` is the model's
//! name as the model's card, and answers with it, also while the model is at zero and no server can be asked.
//! A model whose server was never read, or does not list it under that name, gets the bare OpenAI object.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use tokio::time::Instant;
use tracing::debug;

use crate::proxy::App;
use crate::router::{Backend, ModelEntry};

/// A card this young is answered without asking the server again: a model's object changes only with a roll.
const CARD_FRESH_FOR: Duration = Duration::from_secs(300);
/// The most one listing waits on a server: a slow server costs its model the bare object, not the list its time.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);
/// The largest `/v1/models` body read from a server (vLLM's lists a few hundred bytes per model).
const MAX_LIST_BYTES: usize = 256 * 1024;
/// The largest model object kept per model (a card over it is not kept: the bare object serves).
const MAX_CARD_BYTES: usize = 16 * 1024;
/// Servers asked at once for one listing.
const ASK_CONCURRENCY: usize = 16;

/// The bare OpenAI model object, for a model whose server has not described it.
fn bare(id: &str, namespace: &str) -> serde_json::Value {
    serde_json::json!({ "id": id, "object": "model", "created": 0, "owned_by": namespace })
}

/// The entry for `id` in a server's `/v1/models` answer, if it lists one and it is a bounded object.
pub fn card_from(list: &serde_json::Value, id: &str) -> Option<serde_json::Value> {
    let card = list
        .get("data")?
        .as_array()?
        .iter()
        .find(|m| m.get("id").and_then(|v| v.as_str()) == Some(id))?;
    (card.is_object() && serde_json::to_vec(card).is_ok_and(|b| b.len() <= MAX_CARD_BYTES))
        .then(|| card.clone())
}

/// `GET {backend}/v1/models`, parsed; `None` on any failure (logged at debug: the bare object serves).
async fn ask(app: &App, backend: &Backend) -> Option<serde_json::Value> {
    let list = backend
        .get_capped(&app.client, "/v1/models", MAX_LIST_BYTES, ASK_TIMEOUT)
        .await
        .and_then(|body| serde_json::from_slice::<serde_json::Value>(&body).map_err(|e| e.to_string()));
    list.map_err(|e| debug!(backend = %backend.base, error = %e, "could not read the server's /v1/models"))
        .ok()
}

/// The model's object: its card when fresh; else read again from a ready server (and kept); else the card it
/// had (a model at zero keeps what its server said); else the bare object.
async fn describe(app: &App, entry: &Arc<ModelEntry>) -> serde_json::Value {
    let now = Instant::now();
    let kept = entry.card();
    if let Some((at, card)) = &kept
        && now.duration_since(*at) < CARD_FRESH_FOR
    {
        return card.clone();
    }
    if let Some(backend) = entry.ready_backends().first()
        && let Some(card) = ask(app, backend)
            .await
            .and_then(|list| card_from(&list, entry.name()))
    {
        entry.set_card(now, card.clone());
        return card;
    }
    kept.map_or_else(|| bare(entry.name(), entry.namespace()), |(_, card)| card)
}

/// `GET /v1/models` for `namespace`: every model it serves there, in name order.
pub async fn list(app: &App, namespace: &str) -> Response {
    let entries: Vec<Arc<ModelEntry>> = app
        .router
        .model_names(namespace)
        .iter()
        .filter_map(|name| app.router.get(namespace, name))
        .collect();
    let data: Vec<serde_json::Value> = futures::stream::iter(entries)
        .map(|e| async move { describe(app, &e).await })
        .buffered(ASK_CONCURRENCY)
        .collect()
        .await;
    axum::Json(serde_json::json!({ "object": "list", "data": data })).into_response()
}

/// `GET /v1/models/{id}` as OpenAI answers it: the model object, or 404 with `model_not_found`. Model names may
/// hold slashes (`meta-llama/Llama-3.1-8B`), hence the catch-all segment.
pub async fn one(app: &App, namespace: &str, id: &str) -> Response {
    if let Some(entry) = app.router.get(namespace, id) {
        return axum::Json(describe(app, &entry).await).into_response();
    }
    let models_path = if namespace == app.default_namespace {
        "/v1/models".to_string()
    } else {
        format!("/namespaces/{namespace}/v1/models")
    };
    let body = serde_json::json!({ "error": {
        "message": format!("the model `{id}` does not exist in namespace `{namespace}`; GET {models_path} lists the models this gateway serves there"),
        "type": "invalid_request_error", "param": "model", "code": "model_not_found" } });
    (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::card_from;

    #[test]
    fn the_card_is_the_servers_entry_for_the_name_with_all_its_fields() {
        let list = serde_json::json!({"object": "list", "data": [
            {"id": "other", "object": "model", "max_model_len": 1},
            {"id": "m", "object": "model", "created": 1, "owned_by": "vllm", "root": "/models/m",
             "parent": null, "max_model_len": 8192, "permission": [{"id": "modelperm-1"}]}]});
        let card = card_from(&list, "m").unwrap();
        assert_eq!(card["max_model_len"], 8192);
        assert_eq!(card["root"], "/models/m");
        assert_eq!(card["owned_by"], "vllm");
        assert!(card_from(&list, "absent").is_none());
    }

    #[test]
    fn a_list_that_is_not_one_or_an_oversized_entry_gives_no_card() {
        assert!(card_from(&serde_json::json!({"data": "nope"}), "m").is_none());
        assert!(card_from(&serde_json::json!([1, 2]), "m").is_none());
        assert!(card_from(&serde_json::json!({"data": ["m"]}), "m").is_none());
        let huge = "x".repeat(super::MAX_CARD_BYTES);
        let list = serde_json::json!({"data": [{"id": "m", "root": huge}]});
        assert!(card_from(&list, "m").is_none());
    }
}
