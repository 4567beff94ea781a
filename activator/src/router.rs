//! Per-model routing state: which backends are ready, how many requests each has outstanding, and the bounded
//! hold queue for a model with no ready backend; plus the gateway-wide [`Admission`] bounds.
//!
//! Tenants are namespaces: a model is `(namespace, model)`, keyed by [`model_key`], so the same `model` name in
//! two namespaces is two entries with their own backends, queue and counters.
//!
//! The hot path (picking a backend for a request) touches only atomics and a `watch` channel's read lock, so it
//! costs well under a microsecond. Readiness is *pushed* by a discovery source ([`super::discovery`]) through
//! [`ModelEntry::set_ready`] / [`ModelEntry::replace_ready`]; a held request waits on the `watch` channel, so it
//! is forwarded the moment a backend turns ready instead of on the next tick of a poll loop.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use http::Uri;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use tessera_core::class::{Lane, RequestMix};
use tessera_core::lanes::{BackendRoom, LaneLimits, NoRoom, admit_flex};
use tessera_core::wire::activator::{ActivatorStats, ModelStats, model_key};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

/// One backend (a model server replica) and its outstanding requests.
#[derive(Debug)]
pub struct Backend {
    /// Base URL, e.g. `http://10.0.0.7:8000` (no trailing slash); request paths are appended to it.
    pub base: String,
    outstanding: AtomicU64,
    /// Flex-lane requests among `outstanding`.
    flex: AtomicU64,
    /// Flex-lane requests sent since the gauges were last read.
    flex_unseen: AtomicU64,
    /// What the flex-lane requests in flight may grow to in the KV cache, tokens (`tessera_core::lanes`).
    flex_tokens: AtomicU64,
    /// The backend's last gauges (KV-cache usage, requests waiting) and when they were read (`super::lanes`).
    gauges: Mutex<Option<Gauges>>,
    /// The worst TTFT pressure among the other models on its GPU and when the controller read it
    /// (`status.flexNeighbours`, `tessera_core::lanes::neighbour_pressures`).
    neighbours: Mutex<Option<(std::time::SystemTime, f64)>>,
}

/// A backend's gauges as last read from its `/metrics`.
#[derive(Debug, Clone, Copy)]
struct Gauges {
    at: Instant,
    kv: Option<f64>,
    waiting: Option<f64>,
    /// The KV cache's size in tokens (`num_gpu_blocks × block_size`).
    kv_capacity_tokens: Option<u64>,
}

impl Backend {
    fn new(base: &str) -> Self {
        Self {
            base: base.trim_end_matches('/').to_string(),
            outstanding: AtomicU64::new(0),
            flex: AtomicU64::new(0),
            flex_unseen: AtomicU64::new(0),
            flex_tokens: AtomicU64::new(0),
            gauges: Mutex::new(None),
            neighbours: Mutex::new(None),
        }
    }

    /// Records the controller's neighbour figure for this backend (`None`: it has none).
    pub fn set_neighbours(&self, figure: Option<(std::time::SystemTime, f64)>) {
        *lock(&self.neighbours) = figure;
    }

    /// The address of the base URL as EndpointSlices and pod IPs write it (`10.0.0.7`, `fd00::7`: no brackets).
    pub fn address(&self) -> Option<String> {
        let uri: Uri = self.base.parse().ok()?;
        Some(
            uri.host()?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
        )
    }

    /// Records the backend's gauges read at `at` (KV-cache usage 0–1, requests waiting, the cache's size in
    /// tokens).
    pub fn set_gauges(
        &self,
        at: Instant,
        kv: Option<f64>,
        waiting: Option<f64>,
        kv_capacity_tokens: Option<u64>,
    ) {
        *lock(&self.gauges) = Some(Gauges {
            at,
            kv,
            waiting,
            kv_capacity_tokens,
        });
        self.flex_unseen.store(0, Ordering::Relaxed);
    }

    /// What the flex lane's gate reads of this backend at `now`.
    pub fn room(&self, now: Instant) -> BackendRoom {
        let g = *lock(&self.gauges);
        let neighbours = *lock(&self.neighbours);
        BackendRoom {
            kv: g.and_then(|g| g.kv),
            waiting: g.and_then(|g| g.waiting),
            age: g.map(|g| now.saturating_duration_since(g.at)),
            flex_in_flight: self.flex.load(Ordering::Relaxed),
            flex_unseen: self.flex_unseen.load(Ordering::Relaxed),
            flex_tokens: self.flex_tokens.load(Ordering::Relaxed),
            kv_capacity_tokens: g.and_then(|g| g.kv_capacity_tokens),
            neighbours: neighbours.map(|(_, p)| p),
            // How old is for the gate to judge (`tessera_core::lanes::admit_flex`).
            neighbours_age: neighbours.map(|(at, _)| {
                std::time::SystemTime::now()
                    .duration_since(at)
                    .unwrap_or_default()
            }),
        }
    }

    /// Requests sent to this backend whose responses have not finished.
    pub fn outstanding(&self) -> u64 {
        self.outstanding.load(Ordering::Relaxed)
    }

    /// The full URI for `path_and_query` on this backend.
    pub fn uri_for(&self, path_and_query: &str) -> Result<Uri, http::uri::InvalidUri> {
        format!("{}{}", self.base, path_and_query).parse()
    }

    /// `GET path` on this backend: the body of a 2xx answer, at most `limit` bytes, within `timeout`; otherwise
    /// why not, in words for a debug line (what the gateway reads of a backend beside the traffic: its gauges,
    /// its model list).
    pub async fn get_capped(
        &self,
        client: &Client<HttpConnector, Full<Bytes>>,
        path: &str,
        limit: usize,
        timeout: std::time::Duration,
    ) -> Result<Bytes, String> {
        let uri = self.uri_for(path).map_err(|e| e.to_string())?;
        let fetch = async {
            let resp = client.get(uri).await.map_err(|e| e.to_string())?;
            if !resp.status().is_success() {
                return Err(format!("status {}", resp.status()));
            }
            Limited::new(resp.into_body(), limit)
                .collect()
                .await
                .map(http_body_util::Collected::to_bytes)
                .map_err(|e| e.to_string())
        };
        tokio::time::timeout(timeout, fetch)
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {timeout:?}")))
    }
}

/// A backend chosen for one request; its outstanding count drops when this is dropped (when the response body
/// ends, fails, or the client goes away).
#[derive(Debug)]
pub struct Lease {
    backend: Arc<Backend>,
    /// A flex-lane request: counted in the backend's flex in-flight too, with its footprint in tokens.
    flex: Option<u64>,
}

impl Lease {
    /// The chosen backend.
    pub fn backend(&self) -> &Arc<Backend> {
        &self.backend
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.backend.outstanding.fetch_sub(1, Ordering::Relaxed);
        if let Some(tokens) = self.flex {
            self.backend.flex.fetch_sub(1, Ordering::Relaxed);
            self.backend.flex_tokens.fetch_sub(tokens, Ordering::Relaxed);
        }
    }
}

/// Flex-lane requests waiting for room at a model; the gauge drops when the wait ends, however it ends.
#[derive(Debug)]
pub struct FlexWait<'a> {
    entry: &'a ModelEntry,
}

impl Drop for FlexWait<'_> {
    fn drop(&mut self) {
        self.entry.flex_waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

type ReadySet = Arc<Vec<Arc<Backend>>>;

/// Gateway-wide bounds, shared by every model: requests admitted (reading their body, held, forwarded or
/// streaming back) and requests held; and, apart from both, flex-lane requests waiting (`--lane-max-held`).
/// Each is a counter with a ceiling; a request over one is shed.
///
/// Why the flex lane has its own: a flex request (or batch line) waits for room for up to
/// `--lane-hold-timeout`, by design, while the lane is closed. Counted in `--max-in-flight` or `--max-held`,
/// enough of them fill the gateway and real-time requests are shed (issue 53: 4,200 flex requests waiting on a
/// closed lane filled `--max-in-flight 4096`). So a flex request counts in `--max-in-flight` only until its body
/// is read and its lane known; from then on it waits in the lane's own bound and is sent under the flex gate's
/// per-backend bounds, and real time keeps every place of its own.
#[derive(Debug)]
pub struct Admission {
    in_flight: AtomicU64,
    max_in_flight: u64,
    held: AtomicU64,
    max_held: u64,
    lane_held: AtomicU64,
    max_lane_held: u64,
}

/// A flex-lane request's place among the `--lane-max-held` waiting ones; released when dropped (when it is sent
/// or answered).
#[derive(Debug)]
pub struct LaneHeld {
    admission: Arc<Admission>,
}

impl Drop for LaneHeld {
    fn drop(&mut self) {
        self.admission.lane_held.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One admitted request; releases its place when dropped (when its response body ends).
#[derive(Debug)]
pub struct Admitted {
    admission: Arc<Admission>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.admission.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Admission {
    /// At most `max_in_flight` requests admitted and `max_held` held at once, and as many flex-lane requests
    /// waiting as `max_held`.
    pub fn new(max_in_flight: u64, max_held: u64) -> Arc<Self> {
        Self::with_lane(max_in_flight, max_held, max_held)
    }

    /// As [`Admission::new`], with at most `max_lane_held` flex-lane requests waiting at once.
    pub fn with_lane(max_in_flight: u64, max_held: u64, max_lane_held: u64) -> Arc<Self> {
        Arc::new(Self {
            in_flight: AtomicU64::new(0),
            max_in_flight,
            held: AtomicU64::new(0),
            max_held,
            lane_held: AtomicU64::new(0),
            max_lane_held,
        })
    }

    /// A place for one flex-lane request to wait (for room, or for a replica), or `None` when `--lane-max-held`
    /// are already waiting.
    pub fn try_hold_lane(self: &Arc<Self>) -> Option<LaneHeld> {
        take(&self.lane_held, self.max_lane_held).then(|| LaneHeld {
            admission: self.clone(),
        })
    }

    /// Flex-lane requests waiting now, all models together.
    pub fn lane_held(&self) -> u64 {
        self.lane_held.load(Ordering::Relaxed)
    }

    /// Admits one request, or `None` when `max_in_flight` are already admitted.
    pub fn try_admit(self: &Arc<Self>) -> Option<Admitted> {
        take(&self.in_flight, self.max_in_flight).then(|| Admitted {
            admission: self.clone(),
        })
    }

    /// Requests admitted now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Requests held now, all models together.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }
}

/// Increments `counter` unless it is at `max`; true if it did.
fn take(counter: &AtomicU64, max: u64) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        })
        .is_ok()
}

/// Why a request could not be held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldRefused {
    /// This model's queue is full (`--queue-size`).
    ModelQueueFull,
    /// The gateway holds `--max-held` requests already.
    GatewayFull,
}

/// Everything the activator tracks for one model of one namespace.
#[derive(Debug)]
pub struct ModelEntry {
    namespace: String,
    name: String,
    key: String,
    /// Every backend ever reported for this model and still listed, by base URL, so that a backend that flaps
    /// keeps its outstanding count.
    known: Mutex<BTreeMap<String, Arc<Backend>>>,
    ready: watch::Sender<ReadySet>,
    /// Wakes the discovery source (probe now / patch the controller) when a request has to be held.
    demand: Arc<Notify>,
    queue_size: u64,
    admission: Arc<Admission>,
    requests_total: AtomicU64,
    rejected_total: AtomicU64,
    in_flight: AtomicU64,
    queued: AtomicU64,
    /// Unix ms of the last arrival; 0 means none yet.
    last_request_ms: AtomicU64,
    /// The lanes, streaming and prompt lengths of the requests counted, for the workload class rule.
    mix: Mutex<RequestMix>,
    /// Flex-lane requests waiting for room.
    flex_waiting: AtomicU64,
    /// Flex-lane requests held for a replica (counted in `queued` for the controller, bounded by
    /// `--lane-max-held` rather than `--queue-size` and `--max-held`).
    flex_held: AtomicU64,
    /// A flex request arrived since the lanes' poller last looked.
    wants_gauges: AtomicBool,
    /// The model object its server last gave for it (`GET /v1/models`) and when it was read: what the gateway's
    /// `/v1/models` answers with, also while the model is at zero (crate::models).
    card: Mutex<Option<(Instant, serde_json::Value)>>,

    /// Rotates the starting point of the least-outstanding scan so ties spread round-robin.
    rr: AtomicUsize,
}

/// Held-request accounting: decrements `queued` when the request stops waiting, however it stops.
#[derive(Debug)]
pub struct QueueSlot<'a> {
    entry: &'a ModelEntry,
    /// A flex-lane request's hold, counted apart from the real-time bounds.
    flex: bool,
}

impl Drop for QueueSlot<'_> {
    fn drop(&mut self) {
        if self.flex {
            self.entry.flex_held.fetch_sub(1, Ordering::Relaxed);
        } else {
            self.entry.queued.fetch_sub(1, Ordering::Relaxed);
            self.entry.admission.held.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// In-flight accounting for a forwarded request; owned by the response body so it lasts until the body ends.
#[derive(Debug)]
pub struct InFlight {
    entry: Arc<ModelEntry>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.entry.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ModelEntry {
    fn new(namespace: &str, name: &str, queue_size: u64, admission: Arc<Admission>) -> Self {
        let (ready, _) = watch::channel(Arc::new(Vec::new()));
        Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
            key: model_key(namespace, name),
            known: Mutex::new(BTreeMap::new()),
            ready,
            demand: Arc::new(Notify::new()),
            queue_size,
            admission,
            requests_total: AtomicU64::new(0),
            rejected_total: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            last_request_ms: AtomicU64::new(0),
            mix: Mutex::new(RequestMix::default()),
            flex_waiting: AtomicU64::new(0),
            flex_held: AtomicU64::new(0),
            wants_gauges: AtomicBool::new(false),
            card: Mutex::new(None),

            rr: AtomicUsize::new(0),
        }
    }

    /// The model name (the OpenAI `model` field).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace the model lives in.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// `"<namespace>/<model>"`, the key in the stats document.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The notifier a discovery source waits on to learn that requests are being held for this model.
    pub fn demand(&self) -> Arc<Notify> {
        self.demand.clone()
    }

    /// Counts an arriving request.
    pub fn record_arrival(&self, now_unix_ms: u64) {
        self.requests_total.fetch_add(1, Ordering::Relaxed);
        // max, not store: concurrent arrivals may record out of order.
        self.last_request_ms
            .fetch_max(now_unix_ms.max(1), Ordering::Relaxed);
    }

    /// Counts an arriving request's lane, whether it streams and its prompt's length (the class rule's input).
    pub fn record_mix(&self, lane: Lane, stream: Option<bool>, prompt_bytes: Option<usize>) {
        if let Ok(mut m) = self.mix.lock() {
            m.count(lane, stream, prompt_bytes);
        }
    }

    /// Counts a request the activator answered itself with an error (overflow, timeout, no backend).
    pub fn record_rejection(&self) {
        self.rejected_total.fetch_add(1, Ordering::Relaxed);
    }

    /// Marks one request as forwarded and not yet finished.
    pub fn start_in_flight(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight { entry: self.clone() }
    }

    /// Takes a place in the hold queue: one of this model's `--queue-size` and one of the gateway's `--max-held`.
    pub fn try_enqueue(&self) -> Result<QueueSlot<'_>, HoldRefused> {
        if !take(&self.admission.held, self.admission.max_held) {
            return Err(HoldRefused::GatewayFull);
        }
        if !take(&self.queued, self.queue_size) {
            self.admission.held.fetch_sub(1, Ordering::Relaxed);
            return Err(HoldRefused::ModelQueueFull);
        }
        // Tell discovery at once; Notify keeps a permit if nobody is waiting yet, so no wake-up is lost.
        self.demand.notify_one();
        Ok(QueueSlot {
            entry: self,
            flex: false,
        })
    }

    /// Holds a flex-lane request for a replica. It takes none of this model's `--queue-size` nor of the
    /// gateway's `--max-held` (real time's room): the caller holds its [`LaneHeld`] place, which bounds it. It
    /// is demand all the same: counted in [`ModelEntry::queued`], so a model at zero wakes for it.
    pub fn hold_flex(&self, _place: &LaneHeld) -> QueueSlot<'_> {
        self.flex_held.fetch_add(1, Ordering::Relaxed);
        self.demand.notify_one();
        QueueSlot {
            entry: self,
            flex: true,
        }
    }

    /// Requests currently held, flex-lane ones included.
    pub fn queued(&self) -> u64 {
        self.queued
            .load(Ordering::Relaxed)
            .saturating_add(self.flex_held.load(Ordering::Relaxed))
    }

    /// Requests currently forwarded and unfinished.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Ready backends now.
    pub fn ready_count(&self) -> usize {
        self.ready.borrow().len()
    }

    /// Picks the ready backend with the fewest outstanding requests (ties: the next one round-robin) and counts
    /// the request against it; `None` when no backend is ready.
    pub fn pick(&self) -> Option<Lease> {
        let ready = self.ready.borrow();
        let backend = pick_least_outstanding(&ready, self.rr.fetch_add(1, Ordering::Relaxed))?.clone();
        drop(ready);
        backend.outstanding.fetch_add(1, Ordering::Relaxed);
        Some(Lease { backend, flex: None })
    }

    /// Picks a backend for a flex-lane request that may grow to `tokens` in the KV cache
    /// (`tessera_core::lanes::footprint_tokens`): the least outstanding among the ready ones with room
    /// (`tessera_core::lanes::admit_flex`). `Err(None)`: no backend is ready (the hold path applies);
    /// `Err(Some(why))`: backends are ready but none has room.
    pub fn pick_flex(&self, limits: &LaneLimits, now: Instant, tokens: u64) -> Result<Lease, Option<NoRoom>> {
        let ready = self.ready.borrow();
        if ready.is_empty() {
            return Err(None);
        }
        let mut why = None;
        let mut best: Option<&Arc<Backend>> = None;
        for b in ready.iter() {
            match admit_flex(&b.room(now), limits, tokens) {
                Ok(()) => {
                    if best.is_none_or(|x| b.outstanding() < x.outstanding()) {
                        best = Some(b);
                    }
                }
                Err(e) => why = Some(e),
            }
        }
        let Some(backend) = best.cloned() else {
            return Err(why);
        };
        drop(ready);
        backend.outstanding.fetch_add(1, Ordering::Relaxed);
        backend.flex.fetch_add(1, Ordering::Relaxed);
        backend.flex_unseen.fetch_add(1, Ordering::Relaxed);
        backend.flex_tokens.fetch_add(tokens, Ordering::Relaxed);
        Ok(Lease {
            backend,
            flex: Some(tokens),
        })
    }

    /// Counts a flex-lane request waiting for room until the guard drops.
    pub fn flex_wait(&self) -> FlexWait<'_> {
        self.flex_waiting.fetch_add(1, Ordering::Relaxed);
        self.wants_gauges.store(true, Ordering::Relaxed);
        FlexWait { entry: self }
    }

    /// Flex-lane requests waiting for room now.
    pub fn flex_waiting(&self) -> u64 {
        self.flex_waiting.load(Ordering::Relaxed)
    }

    /// Whether the lanes' poller should read this model's backends' gauges: a flex request has arrived since
    /// the last call. Reading `/metrics` costs the server a page render, so models without flex traffic pay
    /// nothing.
    pub fn take_wants_gauges(&self) -> bool {
        self.wants_gauges.swap(false, Ordering::Relaxed)
    }

    /// Marks that a flex request arrived: the poller reads this model's gauges from now on.
    pub fn want_gauges(&self) {
        self.wants_gauges.store(true, Ordering::Relaxed);
    }

    /// The model object its server last described it with, and when that was read.
    pub fn card(&self) -> Option<(Instant, serde_json::Value)> {
        lock(&self.card).clone()
    }

    /// Keeps the model object its server gave, read at `at`.
    pub fn set_card(&self, at: Instant, card: serde_json::Value) {
        *lock(&self.card) = Some((at, card));
    }

    /// The ready backends now.
    pub fn ready_backends(&self) -> Vec<Arc<Backend>> {
        self.ready.borrow().iter().cloned().collect()
    }

    /// Waits until at least one backend is ready or `deadline` passes; true if one is ready.
    pub async fn wait_ready(&self, deadline: Instant) -> bool {
        let mut rx = self.ready.subscribe();
        let ready = async { rx.wait_for(|set| !set.is_empty()).await.is_ok() };
        tokio::time::timeout_at(deadline, ready).await.unwrap_or(false)
    }

    /// Sets the controller's neighbour figures (`at`, pressure by pod IP) on the backends listed; a backend whose
    /// address is not listed gets none.
    pub fn set_neighbours(&self, figures: Option<&(std::time::SystemTime, BTreeMap<String, f64>)>) {
        for backend in lock(&self.known).values() {
            let figure =
                figures.and_then(|(at, by_address)| by_address.get(&backend.address()?).map(|p| (*at, *p)));
            backend.set_neighbours(figure);
        }
    }

    /// Sets one backend's readiness (static discovery: one probe result).
    pub fn set_ready(&self, base: &str, ready: bool) {
        let backend = {
            let mut known = lock(&self.known);
            let key = base.trim_end_matches('/').to_string();
            known
                .entry(key)
                .or_insert_with(|| Arc::new(Backend::new(base)))
                .clone()
        };
        self.ready.send_if_modified(|set| {
            let present = set.iter().any(|b| Arc::ptr_eq(b, &backend));
            match (present, ready) {
                (false, true) => Arc::make_mut(set).push(backend.clone()),
                (true, false) => Arc::make_mut(set).retain(|b| !Arc::ptr_eq(b, &backend)),
                _ => return false,
            }
            true
        });
    }

    /// Replaces the whole ready set (Kubernetes discovery: the EndpointSlices' ready addresses). Backends no longer
    /// listed are forgotten; their in-flight requests keep their own reference until they finish.
    pub fn replace_ready(&self, bases: &[String]) {
        let next: Vec<Arc<Backend>> = {
            let mut known = lock(&self.known);
            let keys: Vec<String> = bases
                .iter()
                .map(|b| b.trim_end_matches('/').to_string())
                .collect();
            known.retain(|k, _| keys.contains(k));
            keys.iter()
                .map(|k| {
                    known
                        .entry(k.clone())
                        .or_insert_with(|| Arc::new(Backend::new(k)))
                        .clone()
                })
                .collect()
        };
        self.ready.send_if_modified(|set| {
            let same = set.len() == next.len() && set.iter().zip(&next).all(|(a, b)| Arc::ptr_eq(a, b));
            if !same {
                *set = Arc::new(next);
            }
            !same
        });
    }

    /// This model's counters as the wire type.
    pub fn stats(&self) -> ModelStats {
        let last = self.last_request_ms.load(Ordering::Relaxed);
        ModelStats {
            requests_total: self.requests_total.load(Ordering::Relaxed),
            rejected_total: self.rejected_total.load(Ordering::Relaxed),
            in_flight: self.in_flight(),
            queued: self.queued(),
            ready_backends: u32::try_from(self.ready_count()).unwrap_or(u32::MAX),
            last_request_at_unix_ms: (last > 0).then_some(last),
            mix: self.mix.lock().map(|m| *m).unwrap_or_default(),
        }
    }
}

/// The least-outstanding choice, scanning from `start` so that equal candidates take turns.
pub fn pick_least_outstanding(ready: &[Arc<Backend>], start: usize) -> Option<&Arc<Backend>> {
    let n = ready.len();
    (0..n)
        .map(|i| &ready[(start + i) % n])
        .min_by_key(|b| b.outstanding())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding this lock cannot leave the map half-updated (each update is one insert/retain),
    // so a poisoned lock is still safe to use.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Every model the activator knows, by [`model_key`].
#[derive(Debug)]
pub struct Router {
    models: RwLock<HashMap<String, Arc<ModelEntry>>>,
    queue_size: u64,
    admission: Arc<Admission>,
    instance: String,
    started_at_unix_ms: u64,
}

impl Router {
    /// An empty router whose per-model hold queues take at most `queue_size` requests, within the gateway-wide
    /// bounds of `admission`.
    pub fn new(
        queue_size: u64,
        admission: Arc<Admission>,
        instance: String,
        started_at_unix_ms: u64,
    ) -> Self {
        Self {
            models: RwLock::new(HashMap::new()),
            queue_size,
            admission,
            instance,
            started_at_unix_ms,
        }
    }

    /// The gateway-wide bounds.
    pub fn admission(&self) -> &Arc<Admission> {
        &self.admission
    }

    /// The entry for `model` in `namespace`, if known.
    pub fn get(&self, namespace: &str, model: &str) -> Option<Arc<ModelEntry>> {
        self.get_key(&model_key(namespace, model))
    }

    /// The entry for a [`model_key`], if known.
    pub fn get_key(&self, key: &str) -> Option<Arc<ModelEntry>> {
        self.models
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned()
    }

    /// The entry for `model` in `namespace`, created (with no ready backend) when new.
    pub fn ensure(&self, namespace: &str, model: &str) -> Arc<ModelEntry> {
        let key = model_key(namespace, model);
        if let Some(e) = self.get_key(&key) {
            return e;
        }
        let mut models = self.models.write().unwrap_or_else(|e| e.into_inner());
        models
            .entry(key)
            .or_insert_with(|| {
                Arc::new(ModelEntry::new(
                    namespace,
                    model,
                    self.queue_size,
                    self.admission.clone(),
                ))
            })
            .clone()
    }

    /// Forgets a model (its routing config was deleted). Held requests for it keep their entry and time out.
    pub fn remove_key(&self, key: &str) {
        self.models.write().unwrap_or_else(|e| e.into_inner()).remove(key);
    }

    /// Every known [`model_key`], sorted.
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .models
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect();
        keys.sort();
        keys
    }

    /// The model names known in `namespace`, sorted.
    pub fn model_names(&self, namespace: &str) -> Vec<String> {
        let mut names: Vec<String> = self
            .models
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|e| e.namespace == namespace)
            .map(|e| e.name.clone())
            .collect();
        names.sort();
        names
    }

    /// Every entry, for metrics.
    pub fn entries(&self) -> Vec<Arc<ModelEntry>> {
        self.models
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// The stats document at `now_unix_ms`.
    pub fn stats(&self, now_unix_ms: u64) -> ActivatorStats {
        ActivatorStats::new(
            self.instance.clone(),
            self.started_at_unix_ms,
            now_unix_ms,
            self.entries().iter().map(|e| (e.key.clone(), e.stats())),
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    fn entry(queue: u64, max_held: u64) -> ModelEntry {
        ModelEntry::new("ns", "m", queue, Admission::new(1_000, max_held))
    }

    #[test]
    fn a_flex_lease_promises_its_footprint_until_it_ends() {
        let e = entry(10, 10);
        e.set_ready("http://b:8000", true);
        let b = e.ready_backends()[0].clone();
        let limits = LaneLimits {
            throttle_in_flight: 100,
            ..LaneLimits::default()
        };
        // 10% in use of a 10,000-token cache: two requests of 2,000 tokens fit under 60%, a third does not.
        b.set_gauges(Instant::now(), Some(0.1), Some(0.0), Some(10_000));
        let first = e.pick_flex(&limits, Instant::now(), 2_000).unwrap();
        let _second = e.pick_flex(&limits, Instant::now(), 2_000).unwrap();
        assert_eq!(b.room(Instant::now()).flex_tokens, 4_000);
        let refused = e.pick_flex(&limits, Instant::now(), 2_000).unwrap_err().unwrap();
        assert_eq!(refused.label(), "kv_promised");
        // The first ends: its promise goes with it.
        drop(first);
        assert_eq!(b.room(Instant::now()).flex_tokens, 2_000);
        assert!(e.pick_flex(&limits, Instant::now(), 2_000).is_ok());
    }

    #[test]
    fn gateway_bounds_hold_across_models_and_release_on_drop() {
        let admission = Admission::new(2, 3);
        let router = Router::new(2, admission.clone(), "t".into(), 0);
        let a = router.ensure("team-a", "m");
        let b = router.ensure("team-b", "m");
        assert!(!Arc::ptr_eq(&a, &b), "one name in two namespaces is two models");
        let _a1 = a.try_enqueue().unwrap();
        let _a2 = a.try_enqueue().unwrap();
        assert_eq!(a.try_enqueue().err(), Some(HoldRefused::ModelQueueFull));
        let b1 = b.try_enqueue().unwrap();
        // Three held in all: the gateway bound refuses b although its own queue has room.
        assert_eq!(b.try_enqueue().err(), Some(HoldRefused::GatewayFull));
        assert_eq!(admission.held(), 3);
        drop(b1);
        assert!(b.try_enqueue().is_ok());
        let r1 = admission.try_admit().unwrap();
        let _r2 = admission.try_admit().unwrap();
        assert!(admission.try_admit().is_none());
        drop(r1);
        assert!(admission.try_admit().is_some());
        assert_eq!(router.keys(), vec!["team-a/m", "team-b/m"]);
        assert_eq!(router.model_names("team-a"), vec!["m"]);
        let stats = router.stats(5);
        assert_eq!(stats.schema_version, 2);
        assert!(stats.models.contains_key("team-b/m"));
    }

    /// Issue 53 N4: waiting flex requests fill their own bound, never the real-time ones.
    #[test]
    fn waiting_flex_requests_take_none_of_real_times_places() {
        let admission = Admission::with_lane(4, 4, 2);
        let router = Router::new(1, admission.clone(), "t".into(), 0);
        let m = router.ensure("ns", "m");
        let a = admission.try_hold_lane().unwrap();
        let b = admission.try_hold_lane().unwrap();
        assert!(admission.try_hold_lane().is_none(), "--lane-max-held");
        // Held for a replica: demand for the controller, but no place of --queue-size (1) nor --max-held.
        let ha = m.hold_flex(&a);
        let hb = m.hold_flex(&b);
        assert_eq!(m.queued(), 2);
        assert_eq!(admission.held(), 0);
        assert_eq!(admission.in_flight(), 0);
        let realtime = m.try_enqueue().expect("real time's queue place is free");
        assert_eq!(m.queued(), 3);
        assert_eq!(m.try_enqueue().err(), Some(HoldRefused::ModelQueueFull));
        assert!(admission.try_admit().is_some());
        drop((ha, hb, realtime));
        assert_eq!(m.queued(), 0);
        drop(a);
        assert_eq!(admission.lane_held(), 1);
        assert!(admission.try_hold_lane().is_some());
    }

    #[test]
    fn least_outstanding_then_round_robin() {
        let e = entry(4, 100);
        e.set_ready("http://a", true);
        e.set_ready("http://b/", true);
        let l1 = e.pick().unwrap();
        let l2 = e.pick().unwrap();
        assert_ne!(
            l1.backend().base,
            l2.backend().base,
            "a tie must spread over both"
        );
        drop(l1);
        // One backend has 1 outstanding, the other 0: the idle one wins whatever the rotation.
        let idle = e.pick().unwrap();
        assert_ne!(idle.backend().base, l2.backend().base);
    }

    #[test]
    fn queue_is_bounded_and_released_on_drop() {
        let e = entry(2, 100);
        let a = e.try_enqueue().unwrap();
        let _b = e.try_enqueue().unwrap();
        assert_eq!(e.try_enqueue().err(), Some(HoldRefused::ModelQueueFull));
        drop(a);
        assert!(e.try_enqueue().is_ok());
    }

    #[tokio::test]
    async fn held_request_wakes_when_a_backend_turns_ready() {
        let e = Arc::new(entry(2, 100));
        let waiter = {
            let e = e.clone();
            tokio::spawn(async move {
                e.wait_ready(Instant::now() + std::time::Duration::from_secs(5))
                    .await
            })
        };
        tokio::task::yield_now().await;
        e.set_ready("http://a", true);
        assert!(waiter.await.unwrap());
        assert!(!entry(1, 100).wait_ready(Instant::now()).await);
    }

    #[test]
    fn replace_keeps_counts_of_surviving_backends() {
        let e = entry(2, 100);
        e.replace_ready(&["http://a".into(), "http://b".into()]);
        let lease = e.pick().unwrap();
        let base = lease.backend().base.clone();
        e.replace_ready(&[base.clone(), "http://c".into()]);
        assert_eq!(e.ready_count(), 2);
        let survivor = e.ready.borrow().iter().find(|b| b.base == base).unwrap().clone();
        assert_eq!(survivor.outstanding(), 1);
        e.replace_ready(&[]);
        assert!(e.pick().is_none());
    }

    proptest! {
        /// The chosen backend always has the minimum outstanding count, whatever the rotation.
        #[test]
        fn pick_is_a_minimum(counts in proptest::collection::vec(0u64..5, 1..8), start in 0usize..100) {
            let set: Vec<Arc<Backend>> = counts.iter().enumerate().map(|(i, c)| {
                let b = Backend::new(&format!("http://b{i}"));
                b.outstanding.store(*c, Ordering::Relaxed);
                Arc::new(b)
            }).collect();
            let chosen = pick_least_outstanding(&set, start).unwrap();
            prop_assert_eq!(chosen.outstanding(), *counts.iter().min().unwrap());
        }
    }
}
