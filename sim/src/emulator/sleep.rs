//! vLLM's sleep mode as the emulator serves it: `/sleep`, `/wake_up`, `/is_sleeping`, `/collective_rpc`
//! (`reload_weights` only) and `/reset_prefix_cache`, plus faults on demand so every path of the sidecar that
//! performs and checks a sleep can be tested without a GPU.
//!
//! As in vLLM, the endpoints exist only when the server runs with `--enable-sleep-mode` *and*
//! `VLLM_SERVER_DEV_MODE=1` (they are development endpoints: no auth, same port); otherwise they answer 404.
//!
//! What is modelled, and what is not (see `docs/emulator.md`):
//! - the engine pauses while asleep (no step runs) and `vllm:engine_sleep_state` shows the level;
//! - `mode=abort` aborts the requests in flight, `mode=wait` answers once they have finished, `mode=keep` keeps
//!   them paused with their KV blocks and resumes them after the wake (vLLM would have to recompute them);
//! - `/wake_up?tags=weights` / `tags=kv_cache` wake one part; the engine runs once both are awake;
//! - level 2 discards the weights: until `POST /collective_rpc {"method":"reload_weights"}` the answers are
//!   wrong (a seeded request gets other text), which is the failure the sidecar's canary exists to catch;
//! - the GPU memory the server holds is `tessera_emulator_gpu_memory_used_bytes` on `/metrics` (weights +
//!   activations + KV cache awake; the residue asleep), the emulator's stand-in for the gpu-agent's per-pod
//!   NVML reading.

use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use tracing::{info, warn};

use super::AppState;
use super::metrics::SleepState;
use super::openai::ApiError;

/// GPU memory a sleeping server keeps when no `--fault-sleep-residue-bytes` is given: about one CUDA context.
pub const DEFAULT_RESIDUE_BYTES: u64 = 512 * 1024 * 1024;

/// How often `mode=wait` looks whether the requests in flight have finished.
const WAIT_POLL: Duration = Duration::from_millis(10);

/// Sleep-mode flags (`tessera vllm-sim`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SleepArgs {
    /// vLLM's --enable-sleep-mode: serve the sleep endpoints (also needs VLLM_SERVER_DEV_MODE=1).
    #[arg(long, env = "TESSERA_ENABLE_SLEEP_MODE")]
    pub enable_sleep_mode: bool,
    /// vLLM's development mode, read from the environment variable vLLM itself reads: the sleep endpoints are
    /// development endpoints and exist only with it.
    #[arg(long, env = "VLLM_SERVER_DEV_MODE", hide = true, value_parser = clap::builder::FalseyValueParser::new())]
    pub server_dev_mode: bool,
    /// Fault: `POST /wake_up` never completes (the engine stays asleep).
    #[arg(long, env = "TESSERA_FAULT_WAKE_HANG")]
    pub fault_wake_hang: bool,
    /// Fault: after a wake, answers differ from before the sleep (a seeded request gets other text).
    #[arg(long, env = "TESSERA_FAULT_WAKE_WRONG_ANSWER")]
    pub fault_wake_wrong_answer: bool,
    /// Fault (or setting): the GPU memory the server still holds while asleep, bytes (K, M, G, Ki, Mi, Gi
    /// suffixes); default 512 MiB, a CUDA context.
    #[arg(long, env = "TESSERA_FAULT_SLEEP_RESIDUE_BYTES", value_parser = super::parse_bytes)]
    pub fault_sleep_residue_bytes: Option<u64>,
}

impl SleepArgs {
    /// True when the sleep endpoints are served.
    pub fn served(&self) -> bool {
        self.enable_sleep_mode && self.server_dev_mode
    }
}

/// Which parts of the server are asleep.
#[derive(Debug, Default, Clone, Copy)]
struct Parts {
    /// The level slept at, while any part is asleep.
    level: Option<u8>,
    weights_asleep: bool,
    kv_asleep: bool,
    /// Level 2 discarded the weights: wrong answers until `reload_weights`.
    weights_discarded: bool,
    /// A wake has completed at least once (for `--fault-wake-wrong-answer`).
    woken: bool,
}

/// The sleep surface's state and faults.
#[derive(Debug)]
pub struct SleepSurface {
    args: SleepArgs,
    parts: Mutex<Parts>,
    /// GPU memory held awake (weights + activations + KV cache), bytes.
    awake_bytes: u64,
    /// The weights alone, bytes (held once `tags=weights` woke them).
    weights_bytes: u64,
}

impl SleepSurface {
    /// The surface for a server holding `awake_bytes` of GPU memory, `weights_bytes` of it weights.
    pub fn new(args: SleepArgs, awake_bytes: u64, weights_bytes: u64) -> Self {
        Self {
            args,
            parts: Mutex::new(Parts::default()),
            awake_bytes,
            weights_bytes,
        }
    }

    /// True when the endpoints are served.
    pub fn served(&self) -> bool {
        self.args.served()
    }

    fn parts(&self) -> Parts {
        self.parts.lock().map(|p| *p).unwrap_or_default()
    }

    fn update(&self, f: impl FnOnce(&mut Parts)) -> Parts {
        match self.parts.lock() {
            Ok(mut p) => {
                f(&mut p);
                *p
            }
            Err(_) => Parts::default(),
        }
    }

    /// Mixed into a seeded request's generator: 0 while answers are right, something else while they are wrong
    /// (level 2 before `reload_weights`, or `--fault-wake-wrong-answer` after a wake).
    pub fn answer_salt(&self) -> u64 {
        let p = self.parts();
        if p.weights_discarded {
            0x005E_ED0F_D15C
        } else if self.args.fault_wake_wrong_answer && p.woken {
            0x00BA_DA11_5EED
        } else {
            0
        }
    }

    /// GPU memory the server holds now, bytes.
    pub fn gpu_memory_used_bytes(&self) -> u64 {
        let p = self.parts();
        let residue = self
            .args
            .fault_sleep_residue_bytes
            .unwrap_or(DEFAULT_RESIDUE_BYTES);
        match (p.weights_asleep, p.kv_asleep) {
            (false, false) => self.awake_bytes,
            (false, true) => residue.saturating_add(self.weights_bytes),
            (true, false) => residue.saturating_add(self.awake_bytes.saturating_sub(self.weights_bytes)),
            (true, true) => residue,
        }
    }

    /// The extra family on `/metrics` (only where sleep mode is served).
    pub fn metrics_text(&self) -> String {
        format!(
            "# HELP tessera_emulator_gpu_memory_used_bytes GPU memory this emulated server holds (the emulator's \
             stand-in for the gpu-agent's per-pod reading).\n\
             # TYPE tessera_emulator_gpu_memory_used_bytes gauge\n\
             tessera_emulator_gpu_memory_used_bytes {}\n",
            super::metrics::fmt_f64(self.gpu_memory_used_bytes() as f64)
        )
    }
}

/// The routes (added by [`super::router`] only when [`SleepSurface::served`]).
pub fn routes(r: axum::Router<Arc<AppState>>) -> axum::Router<Arc<AppState>> {
    use axum::routing::{get, post};
    r.route("/sleep", post(sleep))
        .route("/wake_up", post(wake_up))
        .route("/is_sleeping", get(is_sleeping))
        .route("/collective_rpc", post(collective_rpc))
        .route("/reset_prefix_cache", post(reset_prefix_cache))
}

/// `key=value` pairs of a query string (values not percent-decoded: every value read here is plain).
fn query_pairs(q: Option<&str>) -> impl Iterator<Item = (&str, &str)> {
    q.unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| kv.split_once('=').unwrap_or((kv, "")))
}

/// How `/sleep` treats the requests in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Abort,
    Wait,
    Keep,
}

async fn sleep(State(s): State<Arc<AppState>>, RawQuery(q): RawQuery) -> Response {
    let (mut level, mut mode) = (1u8, Mode::Keep);
    for (k, v) in query_pairs(q.as_deref()) {
        match k {
            "level" => match v {
                "1" => level = 1,
                "2" => level = 2,
                _ => {
                    return ApiError::bad_request(
                        format!("sleep level must be 1 or 2, got {v}"),
                        Some("level"),
                    )
                    .into_response();
                }
            },
            "mode" => {
                mode = match v {
                    "abort" => Mode::Abort,
                    "wait" => Mode::Wait,
                    "keep" => Mode::Keep,
                    _ => {
                        return ApiError::bad_request(
                            format!("sleep mode must be abort, wait or keep, got {v}"),
                            Some("mode"),
                        )
                        .into_response();
                    }
                }
            }
            _ => {}
        }
    }
    let engine = &s.engine;
    match mode {
        Mode::Abort => {
            if let Err(e) = engine.abort_all().await {
                return ApiError::unavailable(e.to_string()).into_response();
            }
        }
        // Unbounded, as vLLM's: the caller bounds its own wait (a disconnect drops this future).
        Mode::Wait => loop {
            match engine.stats().await {
                Ok((st, _)) if st.running + st.waiting == 0 => break,
                Ok(_) => tokio::time::sleep(WAIT_POLL).await,
                Err(e) => return ApiError::unavailable(e.to_string()).into_response(),
            }
        },
        Mode::Keep => {}
    }
    let state = if level == 2 {
        SleepState::Level2
    } else {
        SleepState::Level1
    };
    if let Err(e) = engine.sleep(state).await {
        return ApiError::unavailable(e.to_string()).into_response();
    }
    s.sleep.update(|p| {
        p.level = Some(level);
        p.weights_asleep = true;
        p.kv_asleep = true;
        p.weights_discarded |= level == 2;
    });
    info!(level, ?mode, "asleep");
    StatusCode::OK.into_response()
}

async fn wake_up(State(s): State<Arc<AppState>>, RawQuery(q): RawQuery) -> Response {
    let mut tags: Vec<&str> = Vec::new();
    for (k, v) in query_pairs(q.as_deref()) {
        if k == "tags" {
            tags.extend(v.split(',').filter(|t| !t.is_empty()));
        }
    }
    if let Some(bad) = tags.iter().find(|t| !matches!(**t, "weights" | "kv_cache")) {
        return ApiError::bad_request(
            format!("unknown wake_up tag {bad:?}: weights or kv_cache"),
            Some("tags"),
        )
        .into_response();
    }
    let all = tags.is_empty();
    let (weights, kv) = (
        all || tags.contains(&"weights"),
        all || tags.contains(&"kv_cache"),
    );
    let before = s.sleep.parts();
    if before.weights_asleep || before.kv_asleep {
        if s.sleep.args.fault_wake_hang {
            warn!("--fault-wake-hang: this wake never completes");
            std::future::pending::<()>().await;
        }
        if weights && before.weights_asleep {
            // Moving the weights back to the GPU is what a wake spends its time on.
            tokio::time::sleep(s.wake_up_delay).await;
        }
    }
    let after = s.sleep.update(|p| {
        p.weights_asleep &= !weights;
        p.kv_asleep &= !kv;
    });
    if !after.weights_asleep && !after.kv_asleep && after.level.is_some() {
        if let Err(e) = s.engine.wake_up().await {
            return ApiError::unavailable(e.to_string()).into_response();
        }
        s.sleep.update(|p| {
            p.level = None;
            p.woken = true;
        });
        info!("awake");
    }
    StatusCode::OK.into_response()
}

async fn is_sleeping(State(s): State<Arc<AppState>>) -> Response {
    match s.engine.stats().await {
        Ok((_, state)) => {
            Json(serde_json::json!({"is_sleeping": state != SleepState::Awake})).into_response()
        }
        Err(e) => ApiError::unavailable(e.to_string()).into_response(),
    }
}

/// `POST /collective_rpc {"method": "reload_weights"}`: level 2's reload (the emulator implements no other
/// method).
async fn collective_rpc(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    let method = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v.get("method").and_then(Value::as_str).map(str::to_owned));
    match method.as_deref() {
        Some("reload_weights") => {
            s.sleep.update(|p| p.weights_discarded = false);
            info!("weights reloaded");
            Json(serde_json::json!({"results": [null]})).into_response()
        }
        Some(m) => ApiError::bad_request(
            format!("the emulator implements collective_rpc method reload_weights only, not {m:?}"),
            Some("method"),
        )
        .into_response(),
        None => ApiError::bad_request("the body must be JSON with a string `method`", Some("method"))
            .into_response(),
    }
}

/// `POST /reset_prefix_cache`: the emulated engine has no prefix cache, so there is nothing to drop.
async fn reset_prefix_cache() -> Response {
    StatusCode::OK.into_response()
}
