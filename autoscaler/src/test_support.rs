//! What the crate's unit tests share.

use http::Response;
use kube::client::Body;

/// Answers a request the mocked API server (`tower_test::mock`) received with `status` and `body` as JSON.
pub(crate) fn respond(
    send: tower_test::mock::SendResponse<Response<Body>>,
    status: u16,
    body: &serde_json::Value,
) {
    send.send_response(
        Response::builder()
            .status(status)
            .body(Body::from(serde_json::to_vec(body).expect("a JSON body")))
            .expect("a response"),
    );
}

/// A minimal sidecar `/v1/status` document (scraping, no recommendation yet) with `extra`'s fields added.
pub(crate) fn sidecar_doc(extra: serde_json::Value) -> tessera_core::wire::sidecar::SidecarStatus {
    let mut doc = serde_json::json!({
        "schema_version": 1, "generated_at": 1000.0, "vllm_url": "http://127.0.0.1:8000", "vllm_up": true,
        "ready": true, "stale": false,
        "scrape": {"interval_secs": 5.0, "successes_total": 3},
        "recommendation": {"outcome": {"state": "not_yet", "code": "too_few_samples", "reason": "warming up"}}
    });
    if let (Some(d), Some(e)) = (doc.as_object_mut(), extra.as_object()) {
        d.extend(e.clone());
    }
    serde_json::from_value(doc).expect("a valid sidecar document")
}
