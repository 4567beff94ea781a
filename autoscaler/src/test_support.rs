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
