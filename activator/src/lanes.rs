//! The flex lane's view of each backend: a background task reads the gauges (KV-cache usage, requests waiting)
//! of the ready backends of every model with flex-tier traffic, every `--lane-poll-interval`, from the
//! backend's own `/metrics`; `router::ModelEntry::pick_flex` admits on them through `tessera_core::lanes`.
//!
//! Why vLLM's page and not the sidecar's document: the gate needs the room as it is now, a fraction of a second
//! old, while the sidecar publishes its view once per scrape interval (5 s by default). The figures are the same
//! two gauges the sidecar reads. Only models that saw a flex request in the last [`ACTIVE_FOR`] are polled: a
//! page render costs the server CPU, and a model without flex traffic needs no gate.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use tessera_core::metrics::VllmSnapshot;
use tokio::time::Instant;
use tracing::debug;

use super::router::{Backend, Router};

/// A model is polled for this long after its last flex request.
pub const ACTIVE_FOR: Duration = Duration::from_secs(60);

/// The largest `/metrics` page read (a server with many LoRA adapters has a long page; this bounds the memory).
const MAX_PAGE_BYTES: usize = 8 * 1024 * 1024;

/// Reads the gauges of the flex-lane models' backends every `interval`, forever.
pub async fn run(router: Arc<Router>, client: Client<HttpConnector, Full<Bytes>>, interval: Duration) {
    let mut active: HashMap<String, Instant> = HashMap::new();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A read slower than a few intervals is no use to a gate that wants the room now.
    let timeout = (interval * 4).max(Duration::from_millis(200));
    loop {
        tick.tick().await;
        let now = Instant::now();
        let mut backends = Vec::new();
        for entry in router.entries() {
            if entry.take_wants_gauges() {
                active.insert(entry.key().to_owned(), now);
            }
            if active
                .get(entry.key())
                .is_some_and(|t| now.saturating_duration_since(*t) <= ACTIVE_FOR)
            {
                backends.extend(entry.ready_backends());
            }
        }
        active.retain(|_, t| now.saturating_duration_since(*t) <= ACTIVE_FOR);
        futures::future::join_all(backends.iter().map(|b| read(&client, b, timeout))).await;
    }
}

/// Reads one backend's gauges into it; a failure leaves the last reading to age (stale gauges read as unknown).
async fn read(client: &Client<HttpConnector, Full<Bytes>>, backend: &Arc<Backend>, timeout: Duration) {
    let fetch = backend
        .get_capped(client, "/metrics", MAX_PAGE_BYTES, timeout)
        .await
        .and_then(|body| String::from_utf8(body.to_vec()).map_err(|e| e.to_string()));
    match fetch {
        Ok(page) => match VllmSnapshot::from_text(&page) {
            Ok(snap) => {
                let capacity = snap
                    .num_gpu_blocks()
                    .zip(snap.block_size())
                    .map(|(blocks, size)| blocks.saturating_mul(size));
                backend.set_gauges(
                    Instant::now(),
                    snap.kv_cache_usage,
                    snap.requests_waiting,
                    capacity,
                )
            }
            Err(e) => debug!(backend = %backend.base, error = %e, "lanes: unreadable /metrics"),
        },
        Err(e) => debug!(backend = %backend.base, error = %e, "lanes: /metrics failed"),
    }
}
