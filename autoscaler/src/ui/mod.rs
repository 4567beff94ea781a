//! The GPU workloads page, `/ui` on the autoscaler's `--metrics-listen` address: which models hold which GPUs,
//! what they really use, what Tessera recommends, and how many GPUs that would free. Read-only, served by the
//! process itself (no Prometheus, no Grafana, nothing fetched at view time).
//!
//! - [`view`]: the page's numbers as a pure function of a [`view::Snapshot`] of controller state, savings included.
//! - [`observe`]: sidecar documents → one model's observation (the controller's reconcile and local mode share it).
//! - [`history`]: 24 h at one point a minute, in memory, bounded.
//! - [`html`]: the HTML, inline SVG and a few lines of sorting script.
//! - [`local`]: `tessera autoscaler --no-kube --sidecar NAME=URL`, the page on one machine with no cluster.
//! - [`day_savings`]: `/ui/savings`, what Tessera would save over the last day, through the simulator.
//!
//! The controller publishes into a [`Store`] after each reconcile ([`Store::observe_model`]); the page reads a
//! snapshot of it. Nothing here can change what the controller decides.

pub mod day_savings;
pub mod history;
pub mod html;
pub mod local;
pub mod observe;
pub mod view;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::extract::State;
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::get;
use tokio::sync::watch;

use history::History;
use view::{DecisionNote, GpuObservation, ModelObservation, Settings, Snapshot};

/// Decisions kept per model for the page.
pub const DECISIONS_KEPT: usize = 5;

/// A sidecar named on the command line: `NAME=URL` (`--sidecar`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidecarTarget {
    /// The model's name on the page (repeat it for each replica of one model).
    pub name: String,
    /// The sidecar's base URL.
    pub url: String,
}

impl std::str::FromStr for SidecarTarget {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, url) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?} is not NAME=URL (e.g. llama=http://127.0.0.1:9090)"))?;
        let (name, url) = (name.trim(), url.trim());
        if name.is_empty() || !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!(
                "{s:?} is not NAME=URL with an http(s) URL (e.g. llama=http://127.0.0.1:9090)"
            ));
        }
        Ok(Self {
            name: name.to_owned(),
            url: url.trim_end_matches('/').to_owned(),
        })
    }
}

/// The page's flags (part of `tessera autoscaler`).
#[derive(Debug, Clone, clap::Args)]
pub struct PageArgs {
    /// Run without Kubernetes: serve only /ui (and /metrics) from the sidecars given with --sidecar. Read-only:
    /// nothing is scaled.
    #[arg(
        help_heading = "Without Kubernetes (--no-kube)",
        long,
        env = "TESSERA_NO_KUBE"
    )]
    pub no_kube: bool,
    /// With --no-kube: a sidecar to show, NAME=URL (repeatable, or comma-separated in the environment variable;
    /// repeat a NAME once per replica of that model).
    #[arg(
        help_heading = "Without Kubernetes (--no-kube)",
        long = "sidecar",
        env = "TESSERA_SIDECARS",
        value_delimiter = ','
    )]
    pub sidecars: Vec<SidecarTarget>,
    /// Price of one GPU-hour (US dollars) for the page's savings. Default: the on-demand list price of the GPU the
    /// replicas report, the one `tessera simulate` uses ($5.12 for an A100-80GB: AWS p4de.24xlarge ÷ 8).
    #[arg(help_heading = "/ui page", long, env = "TESSERA_GPU_HOUR_PRICE", value_parser = tessera_sim::simulate::parse_price)]
    pub gpu_hour_price: Option<f64>,
    /// GPU memory (MiB) the page assumes where a replica's sidecar does not report its GPU.
    #[arg(
        help_heading = "/ui page",
        long,
        env = "TESSERA_UI_GPU_MEMORY_MIB",
        default_value_t = 81920
    )]
    pub ui_gpu_memory_mib: u64,
    /// MiB kept free on every GPU when the page packs recommendations (as a pool's memoryHeadroomMiB).
    #[arg(
        help_heading = "/ui page",
        long,
        env = "TESSERA_UI_HEADROOM_MIB",
        default_value_t = 1024
    )]
    pub ui_headroom_mib: u64,
}

impl PageArgs {
    /// The page settings these flags describe.
    pub fn settings(&self) -> Settings {
        Settings {
            price_per_gpu_hour: self.gpu_hour_price,
            default_gpu_memory_mib: self.ui_gpu_memory_mib,
            headroom_mib: self.ui_headroom_mib,
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// By `namespace/name`: when last observed (Unix ms) and the observation.
    models: BTreeMap<String, (u64, ModelObservation)>,
    gpus: Vec<GpuObservation>,
    history: History,
}

/// What the controller publishes for the page: the latest observation of each model and GPU, and the history.
#[derive(Debug)]
pub struct Store {
    settings: Settings,
    local: bool,
    started_ms: u64,
    /// A model not observed for this long is gone (deleted, or this replica lost the lead).
    forget_after: Duration,
    inner: Mutex<Inner>,
    savings: day_savings::Cache,
}

/// Unix ms now.
pub fn now_ms() -> u64 {
    crate::unix_ms(SystemTime::now())
}

impl Store {
    /// An empty store. `forget_after`: drop a model not observed for this long.
    pub fn new(settings: Settings, local: bool, started_ms: u64, forget_after: Duration) -> Self {
        Self {
            settings,
            local,
            started_ms,
            forget_after,
            inner: Mutex::new(Inner::default()),
            savings: day_savings::Cache::default(),
        }
    }

    /// Publishes one model's latest state. `obs.decisions` holds this round's decision, if any; earlier ones are
    /// kept (the last [`DECISIONS_KEPT`]). A decision that repeats the previous one (same reason, same counts)
    /// is not added again, so a steady model shows what last changed.
    pub fn observe_model(&self, mut obs: ModelObservation, at_ms: u64) {
        let Ok(mut inner) = self.inner.lock() else { return };
        let key = obs.key();
        let mut decisions: Vec<DecisionNote> = inner
            .models
            .remove(&key)
            .map(|(_, o)| o.decisions)
            .unwrap_or_default();
        for d in obs.decisions.drain(..) {
            let repeat = decisions
                .last()
                .is_some_and(|l| l.reason == d.reason && l.from == d.from && l.to == d.to);
            if !repeat {
                decisions.push(d);
            }
        }
        let excess = decisions.len().saturating_sub(DECISIONS_KEPT);
        decisions.drain(..excess);
        obs.decisions = decisions;
        inner.models.insert(key, (at_ms, obs));
    }

    /// Replaces the GPUs of fractional pools.
    pub fn set_gpus(&self, gpus: Vec<GpuObservation>) {
        if let Ok(mut inner) = self.inner.lock() {
            inner.gpus = gpus;
        }
    }

    /// Replaces the GPUs of one pool (each pool manager reports its own).
    pub fn set_pool_gpus(&self, pool: &str, gpus: Vec<GpuObservation>) {
        if let Ok(mut inner) = self.inner.lock() {
            inner.gpus.retain(|g| g.pool != pool);
            inner.gpus.extend(gpus);
        }
    }

    /// Forgets every model (a new leadership term starts from what it observes).
    pub fn clear_models(&self) {
        if let Ok(mut inner) = self.inner.lock() {
            inner.models.clear();
        }
    }

    fn snapshot_locked(&self, inner: &mut Inner, at_ms: u64) -> Snapshot {
        let horizon = u64::try_from(self.forget_after.as_millis()).unwrap_or(u64::MAX);
        inner
            .models
            .retain(|_, (seen, _)| at_ms.saturating_sub(*seen) <= horizon);
        Snapshot {
            at_ms,
            history_since_ms: self.started_ms,
            local: self.local,
            models: inner.models.values().map(|(_, m)| m.clone()).collect(),
            gpus: inner.gpus.clone(),
        }
    }

    /// A snapshot of everything the page shows.
    pub fn snapshot(&self, at_ms: u64) -> Snapshot {
        match self.inner.lock() {
            Ok(mut inner) => self.snapshot_locked(&mut inner, at_ms),
            Err(_) => Snapshot::default(),
        }
    }

    /// Adds this minute's point to the history.
    pub fn record(&self, at_ms: u64) {
        let Ok(mut inner) = self.inner.lock() else { return };
        let v = view::view(&self.snapshot_locked(&mut inner, at_ms), &self.settings);
        inner.history.record(&v);
    }

    /// Heap bytes the history holds (approximate: its points and keys).
    pub fn history_bytes(&self) -> usize {
        self.inner.lock().map_or(0, |i| i.history.approx_bytes())
    }

    /// The page.
    pub fn page(&self, at_ms: u64) -> String {
        let Ok(mut inner) = self.inner.lock() else {
            return "the page's state is unavailable (a thread panicked while holding it)".to_owned();
        };
        let v = view::view(&self.snapshot_locked(&mut inner, at_ms), &self.settings);
        // The page always shows the current minute, even between recorder ticks.
        inner.history.record(&v);
        html::render(&v, &inner.history)
    }

    /// `/ui/savings`: the last day's history through the simulator (cached for [`day_savings::REFRESH`]).
    pub fn savings(&self, at_ms: u64) -> day_savings::Answer {
        let minute = u32::try_from(at_ms / 60_000).unwrap_or(u32::MAX);
        self.savings.get(minute, || {
            let (models, gpu) = match self.inner.lock() {
                Ok(mut inner) => {
                    let snap = self.snapshot_locked(&mut inner, at_ms);
                    let gpu = self
                        .settings
                        .gpu(snap.models.iter().find_map(|m| m.gpu_memory_mib));
                    let models = inner
                        .history
                        .models
                        .iter()
                        .map(|(key, series)| day_savings::DayModel {
                            name: key.clone(),
                            minutes: series
                                .points()
                                .map(|(m, p)| (*m, p.requests_per_second, p.replicas))
                                .collect(),
                            mean_output_tokens: snap.models.iter().find(|m| &m.key() == key).and_then(|m| {
                                let rps = m.signals.requests_per_second.filter(|r| *r > 0.0)?;
                                Some(m.signals.generation_tokens_per_second? / rps)
                            }),
                        })
                        .collect::<Vec<_>>();
                    (models, gpu)
                }
                Err(_) => (Vec::new(), "a100-80gb"),
            };
            // The history lock is released before simulating: the page and the recorder go on meanwhile.
            day_savings::compute(&models, minute, gpu, self.settings.price_per_gpu_hour)
        })
    }

    /// Records the history every `every` until shutdown, so charts fill in whether or not anyone looks.
    pub async fn run_recorder(self: Arc<Self>, every: Duration, mut shutdown: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is immediate: skip it, so the history does not open with the empty state of a start-up.
        tick.tick().await;
        loop {
            tokio::select! {
                _ = tick.tick() => self.record(now_ms()),
                _ = shutdown.wait_for(|s| *s) => return,
            }
        }
    }
}

async fn serve_ui(State(store): State<Arc<Store>>) -> Response {
    off_the_workers(
        move || store.page(now_ms()),
        "rendering the page failed",
        |page| Html(page).into_response(),
    )
    .await
}

async fn serve_savings(State(store): State<Arc<Store>>) -> Response {
    // A day's simulation is seconds of CPU.
    off_the_workers(
        move || store.savings(now_ms()),
        "simulating the day failed",
        |a| Html(a.html).into_response(),
    )
    .await
}

async fn serve_savings_yaml(State(store): State<Arc<Store>>) -> Response {
    off_the_workers(
        move || store.savings(now_ms()),
        "simulating the day failed",
        |a| ([(axum::http::header::CONTENT_TYPE, "application/yaml")], a.yaml).into_response(),
    )
    .await
}

/// Runs the CPU work `work` (rendering on a snapshot under one lock, or simulating a day) off the async workers, so
/// a slow page never delays `/metrics` or a reconcile's I/O; `answer` turns its result into the response, or a 500
/// says `failed`.
async fn off_the_workers<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
    failed: &'static str,
    answer: impl FnOnce(T) -> Response,
) -> Response {
    match tokio::task::spawn_blocking(work).await {
        Ok(done) => answer(done),
        Err(_) => (axum::http::StatusCode::INTERNAL_SERVER_ERROR, failed).into_response(),
    }
}

/// `/ui` (and `/` redirecting to it) over `store`.
pub fn router(store: Arc<Store>) -> Router {
    Router::new()
        .route("/ui", get(serve_ui))
        .route("/ui/savings", get(serve_savings))
        .route("/ui/savings.yaml", get(serve_savings_yaml))
        .route("/", get(|| async { Redirect::temporary("/ui") }))
        .with_state(store)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(name: &str, decision: Option<(u32, u32, &str)>) -> ModelObservation {
        ModelObservation {
            namespace: "ml".into(),
            name: name.into(),
            decisions: decision
                .map(|(from, to, reason)| DecisionNote {
                    at_ms: 0,
                    from,
                    to,
                    reason: reason.into(),
                    message: String::new(),
                })
                .into_iter()
                .collect(),
            ..ModelObservation::default()
        }
    }

    #[test]
    fn sidecar_targets_parse_and_reject_what_is_not_name_equals_url() {
        let t: SidecarTarget = "llama=http://127.0.0.1:9090/".parse().expect("valid");
        assert_eq!(
            (t.name.as_str(), t.url.as_str()),
            ("llama", "http://127.0.0.1:9090")
        );
        assert!("llama".parse::<SidecarTarget>().is_err());
        assert!("=http://x".parse::<SidecarTarget>().is_err());
        assert!("llama=127.0.0.1:9090".parse::<SidecarTarget>().is_err());
    }

    #[test]
    fn decisions_are_kept_bounded_without_repeats_and_old_models_are_forgotten() {
        let store = Store::new(Settings::default(), false, 0, Duration::from_secs(60));
        store.observe_model(obs("a", Some((1, 2, "scale_up"))), 1_000);
        store.observe_model(obs("a", Some((1, 2, "scale_up"))), 2_000);
        store.observe_model(obs("a", None), 3_000);
        assert_eq!(store.snapshot(3_000).models[0].decisions.len(), 1);
        for i in 0..10 {
            store.observe_model(obs("a", Some((i, i + 1, "scale_up"))), 4_000);
        }
        let d = &store.snapshot(4_000).models[0].decisions;
        assert_eq!(d.len(), DECISIONS_KEPT);
        assert_eq!(d.last().map(|d| d.to), Some(10));
        store.observe_model(obs("b", None), 50_000);
        let names: Vec<String> = store
            .snapshot(70_000)
            .models
            .iter()
            .map(|m| m.name.clone())
            .collect();
        assert_eq!(names, ["b"], "a was last seen 66 s ago, over the 60 s horizon");
    }

    #[tokio::test]
    async fn the_savings_page_is_served_from_the_pages_own_history() {
        use tower::ServiceExt;
        async fn get(store: &Arc<Store>, path: &'static str) -> (axum::http::StatusCode, String) {
            let r = router(store.clone())
                .oneshot(
                    axum::http::Request::get(path)
                        .body(axum::body::Body::empty())
                        .expect("request"),
                )
                .await
                .expect("answer");
            let status = r.status();
            let body = axum::body::to_bytes(r.into_body(), 1 << 20).await.expect("body");
            (status, String::from_utf8_lossy(&body).into_owned())
        }
        let empty = Arc::new(Store::new(Settings::default(), true, 0, Duration::from_secs(600)));
        let (status, page) = get(&empty, "/ui/savings").await;
        assert_eq!(status, axum::http::StatusCode::OK);
        assert!(page.contains("No history yet"), "{page}");
        // Three minutes observed: the day so far becomes the scenario `simulate` runs.
        let store = Arc::new(Store::new(Settings::default(), true, 0, Duration::from_secs(600)));
        let minute = now_ms() / 60_000 * 60_000;
        for back in [3, 2, 1] {
            let mut o = obs("chat", None);
            o.replicas.current = 1;
            o.signals.requests_per_second = Some(1.0);
            let at = minute - back * 60_000;
            store.observe_model(o, at);
            store.record(at);
        }
        let (status, page) = get(&store, "/ui/savings").await;
        assert_eq!(status, axum::http::StatusCode::OK);
        assert!(
            page.contains("What Tessera would save") && page.contains("ml/chat"),
            "{page}"
        );
        let (status, yaml) = get(&store, "/ui/savings.yaml").await;
        assert_eq!(status, axum::http::StatusCode::OK);
        assert!(
            yaml.contains("trace: observed") && yaml.contains("name: ml/chat"),
            "{yaml}"
        );
    }

    #[test]
    fn the_page_says_where_history_starts_and_lists_every_model() {
        let store = Store::new(
            Settings::default(),
            true,
            1_800_000_000_000,
            Duration::from_secs(60),
        );
        store.observe_model(obs("chat", None), 1_800_000_060_000);
        let page = store.page(1_800_000_060_000);
        assert!(page.contains("history since 2027-01-15 08:00:00 UTC"), "{page}");
        assert!(page.contains(r#"data-model="ml/chat""#));
        assert!(page.contains("local mode"));
        assert!(
            !page.contains("http://") && !page.contains("https://"),
            "nothing is fetched from elsewhere"
        );
    }
}
