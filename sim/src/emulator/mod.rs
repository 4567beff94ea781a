//! `tessera vllm-sim`: an emulated vLLM server for tests, load tests and demos without a GPU.
//!
//! From the outside it is a vLLM OpenAI-compatible server: the same endpoints, flags, error shapes and
//! `/metrics` page (names, help, labels, buckets). Inside, one task drives the performance model
//! ([`crate::model::Engine`]) in wall-clock time, so latencies, KV cache usage, queueing and preemptions react to
//! load and to the memory flags the way vLLM's do. See `docs/emulator.md`.
//!
//! - [`driver`]: the task that owns the engine.
//! - [`openai`]: the completion endpoints.
//! - [`metrics`]: the `/metrics` page.
//! - [`sleep`]: sleep mode (`--enable-sleep-mode` with `VLLM_SERVER_DEV_MODE=1`) and its faults.

pub mod driver;
pub mod metrics;
pub mod openai;
pub mod sleep;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
pub(crate) use tessera_runtime::size::parse_bytes;
use tokio::sync::Mutex;
use tracing::info;

use crate::model::{Engine, EngineConfig, GIB, GpuSpec, MemorySetting, ModelSpec};

use driver::EngineHandle;

/// vLLM's default KV block size on GPUs (the CPU backend uses 128).
const DEFAULT_BLOCK_SIZE: u32 = 16;
/// vLLM's default `--gpu-memory-utilization` (what `cache_config_info` reports when the cache is sized in bytes).
const DEFAULT_GPU_MEMORY_UTILIZATION: f64 = 0.9;
use metrics::{MetricsVersion, PageInfo, SleepState};
use openai::{ApiError, Endpoint};

/// How the server behaves during `--startup-delay`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StartupMode {
    /// Do not listen until ready: connections are refused, as with a real vLLM loading its weights.
    Refuse,
    /// Listen at once; `/health` and the API answer 503 until ready.
    Unhealthy,
}

/// `tessera vllm-sim` flags. The model flags use vLLM's own names.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Address to serve on.
    #[arg(long, env = "TESSERA_LISTEN", default_value = "0.0.0.0:8000")]
    pub listen: SocketAddr,
    /// Model the performance model imitates: qwen2-7b, llama-3.1-8b, opt-125m, qwen3-14b, llama-3.1-70b.
    #[arg(long, env = "TESSERA_MODEL_PRESET", default_value = "qwen2-7b")]
    pub model_preset: String,
    /// Name(s) the server answers to in the `model` field and reports as `model_name` (vLLM's
    /// --served-model-name; the preset's Hugging Face id when absent). Repeat or comma-separate for several.
    #[arg(long, env = "TESSERA_SERVED_MODEL_NAME", value_delimiter = ',', num_args = 1..)]
    pub served_model_name: Vec<String>,
    /// GPU the performance model imitates: a100-80gb, a100-40gb, h100-80gb, l4.
    #[arg(long, env = "TESSERA_GPU", default_value = "a100-80gb")]
    pub gpu: String,
    /// Override the GPU's total memory in GiB (for a GPU share or a GPU without a preset).
    #[arg(long, env = "TESSERA_GPU_MEMORY_GIB")]
    pub gpu_memory_gib: Option<f64>,
    /// vLLM's --max-model-len (default: the model's own context length).
    #[arg(long, env = "TESSERA_MAX_MODEL_LEN")]
    pub max_model_len: Option<u32>,
    /// vLLM's --max-num-seqs (default as vLLM picks by GPU: 1024 on ≥70 GiB non-A100 GPUs, else 256).
    #[arg(long, env = "TESSERA_MAX_NUM_SEQS")]
    pub max_num_seqs: Option<u32>,
    /// vLLM's --max-num-batched-tokens (default as vLLM picks by GPU: 8192 or 2048).
    #[arg(long, env = "TESSERA_MAX_NUM_BATCHED_TOKENS")]
    pub max_num_batched_tokens: Option<u32>,
    /// vLLM's --block-size: tokens per KV cache block.
    #[arg(long, env = "TESSERA_BLOCK_SIZE", default_value_t = DEFAULT_BLOCK_SIZE)]
    pub block_size: u32,
    /// vLLM's --gpu-memory-utilization: fraction of GPU memory for weights, activations and KV cache.
    #[arg(long, env = "TESSERA_GPU_MEMORY_UTILIZATION", default_value_t = DEFAULT_GPU_MEMORY_UTILIZATION)]
    pub gpu_memory_utilization: f64,
    /// vLLM's --kv-cache-memory-bytes: the KV cache size itself (overrides --gpu-memory-utilization);
    /// a plain byte count or with a suffix (K, M, G, Ki, Mi, Gi).
    #[arg(long, env = "TESSERA_KV_CACHE_MEMORY_BYTES", value_parser = parse_bytes)]
    pub kv_cache_memory_bytes: Option<u64>,
    /// Share of the GPU's compute this server gets (an MPS share or time slice); 0.5 makes steps ~2× longer.
    #[arg(long, env = "TESSERA_COMPUTE_FRACTION", default_value_t = 1.0)]
    pub compute_fraction: f64,
    /// Time to "load the model" before serving (e.g. 30s); see --startup-mode.
    #[arg(long, env = "TESSERA_STARTUP_DELAY", value_parser = humantime::parse_duration, default_value = "0s")]
    pub startup_delay: Duration,
    /// During the start-up delay: refuse connections (like vLLM) or answer 503.
    #[arg(long, env = "TESSERA_STARTUP_MODE", value_enum, default_value_t = StartupMode::Refuse)]
    pub startup_mode: StartupMode,
    /// How long POST /wake_up takes (vLLM's level-1 wake-up takes 0.3-0.8 s for small models).
    #[arg(long, env = "TESSERA_WAKE_UP_DELAY", value_parser = humantime::parse_duration, default_value = "500ms")]
    pub wake_up_delay: Duration,
    /// Seed for generated text and output lengths, so runs repeat.
    #[arg(long, env = "TESSERA_SEED", default_value_t = 0)]
    pub seed: u64,
    /// Metric names to serve: v1 (vLLM ≥ 0.8) or v0 (older servers).
    #[arg(long, env = "TESSERA_METRICS_VERSION", value_enum, default_value_t = MetricsVersion::V1)]
    pub metrics_version: MetricsVersion,
    /// Speed of the emulated GPU relative to a real one (10 = ten times faster); latencies in /metrics
    /// stay in the model's seconds.
    #[arg(long, env = "TESSERA_TIME_SCALE", default_value_t = 1.0)]
    pub time_scale: f64,
    /// Sleep mode and its faults.
    #[command(flatten)]
    pub sleep: sleep::SleepArgs,
    /// Graceful shutdown (`--drain-period`).
    #[command(flatten)]
    pub drain: tessera_runtime::DrainArgs,
}

/// Everything the handlers share.
#[derive(Debug)]
pub struct AppState {
    engine: EngineHandle,
    served_model_names: Vec<String>,
    model_root: String,
    max_model_len: u32,
    seed: u64,
    next_id: AtomicU64,
    ready_at: Instant,
    metrics_version: MetricsVersion,
    wake_up_delay: Duration,
    cache_config: Vec<(String, String)>,
    created_unix: f64,
    /// Last scrape's (time, prompt tokens, generation tokens), for V0's average-throughput gauges.
    last_scrape: Mutex<(Instant, u64, u64)>,
    /// Sleep mode: what is asleep, the faults, the GPU memory held.
    sleep: sleep::SleepSurface,
}

impl AppState {
    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn check_ready(&self) -> Result<(), ApiError> {
        if Instant::now() < self.ready_at {
            return Err(ApiError::unavailable("the server is starting up"));
        }
        Ok(())
    }
}

/// Builds the engine the flags describe (vLLM's start-up checks included).
pub fn build_engine(args: &Args) -> anyhow::Result<Engine> {
    let model = ModelSpec::preset(&args.model_preset)?;
    let mut gpu = GpuSpec::preset(&args.gpu)?;
    if let Some(gib) = args.gpu_memory_gib {
        anyhow::ensure!(
            gib > 0.0 && gib.is_finite(),
            "--gpu-memory-gib must be a positive number, got {gib}"
        );
        gpu.memory_bytes = (gib * GIB as f64) as u64;
    }
    let mut cfg = EngineConfig::vllm_defaults(&gpu);
    if let Some(n) = args.max_num_seqs {
        cfg.max_num_seqs = n;
    }
    if let Some(n) = args.max_num_batched_tokens {
        cfg.max_num_batched_tokens = n;
    }
    cfg.block_size = args.block_size;
    cfg.max_model_len = args.max_model_len;
    cfg.memory = match args.kv_cache_memory_bytes {
        Some(b) => MemorySetting::KvCacheBytes(b),
        None => MemorySetting::GpuMemoryUtilization(args.gpu_memory_utilization),
    };
    cfg.compute_fraction = args.compute_fraction;
    Ok(Engine::new(model, gpu, cfg)?)
}

/// The router with every endpoint; used by [`run`] and by in-process tests.
pub fn router(args: &Args, engine: Engine) -> Router {
    let cache_config = cache_config(
        &engine,
        args.metrics_version,
        args.gpu_memory_utilization,
        args.block_size,
    );
    let names = if args.served_model_name.is_empty() {
        vec![engine.model().name.clone()]
    } else {
        args.served_model_name.clone()
    };
    let state = Arc::new(AppState {
        served_model_names: names,
        model_root: engine.model().name.clone(),
        max_model_len: engine.max_model_len(),
        seed: args.seed,
        next_id: AtomicU64::new(0),
        ready_at: Instant::now()
            + if args.startup_mode == StartupMode::Unhealthy {
                args.startup_delay
            } else {
                Duration::ZERO
            },
        metrics_version: args.metrics_version,
        wake_up_delay: args.wake_up_delay,
        cache_config,
        created_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64()),
        last_scrape: Mutex::new((Instant::now(), 0, 0)),
        sleep: sleep::SleepSurface::new(
            args.sleep.clone(),
            engine.gpu_memory_used_bytes(),
            engine.model().weights_bytes,
        ),
        engine: EngineHandle::spawn(engine, args.time_scale),
    });
    let served = state.sleep.served();
    let r = Router::new()
        .route(
            "/v1/chat/completions",
            post(|State(s): State<Arc<AppState>>, body: Bytes| openai::complete(s, Endpoint::Chat, body)),
        )
        .route(
            "/v1/completions",
            post(|State(s): State<Arc<AppState>>, body: Bytes| {
                openai::complete(s, Endpoint::Completions, body)
            }),
        )
        .route("/v1/models", get(openai::models))
        .route("/health", get(health))
        .route("/ping", get(health))
        .route(
            "/version",
            get(|| async { axum::Json(serde_json::json!({"version": env!("CARGO_PKG_VERSION")})) }),
        )
        .route("/metrics", get(metrics_page));
    // vLLM registers its development endpoints only with sleep mode and VLLM_SERVER_DEV_MODE=1; otherwise 404.
    let r = if served { sleep::routes(r) } else { r };
    r.with_state(state)
}

/// `vllm:cache_config_info`'s labels for `engine` on a page of `version`; `default_util` is what vLLM reports for
/// `gpu_memory_utilization` when the cache is sized in bytes instead (its flag's default, unused).
fn cache_config(
    engine: &Engine,
    version: MetricsVersion,
    default_util: f64,
    block_size: u32,
) -> Vec<(String, String)> {
    let kv_bytes = match engine.config().memory {
        MemorySetting::KvCacheBytes(b) => b.to_string(),
        MemorySetting::GpuMemoryUtilization(_) => "None".into(),
    };
    let util = match engine.config().memory {
        MemorySetting::GpuMemoryUtilization(u) => u,
        MemorySetting::KvCacheBytes(_) => default_util,
    };
    match version {
        MetricsVersion::V1 => cache_config_v1(block_size != DEFAULT_BLOCK_SIZE, engine, kv_bytes, util),
        MetricsVersion::V0 => cache_config_v0(engine, kv_bytes, util),
    }
}

/// The `/metrics` page a server running `engine` serves now, as `model_name` (V1 names, no throughput gauges):
/// what a sidecar beside a simulated replica would scrape (the recommendation parity test replays these pages
/// through the sidecar's own parser and state).
pub fn page_of(engine: &Engine, model_name: &str) -> String {
    let info = PageInfo {
        model_name: model_name.to_owned(),
        cache_config: cache_config(
            engine,
            MetricsVersion::V1,
            DEFAULT_GPU_MEMORY_UTILIZATION,
            engine.config().block_size,
        ),
        created_unix: 0.0,
        avg_prompt_throughput: 0.0,
        avg_generation_throughput: 0.0,
        sleep: SleepState::Awake,
    };
    metrics::render(engine.stats(), &info, MetricsVersion::V1)
}

/// `vllm:cache_config_info` labels of older vLLM (the V0 pages).
fn cache_config_v0(engine: &Engine, kv_bytes: String, util: f64) -> Vec<(String, String)> {
    [
        ("block_size", engine.config().block_size.to_string()),
        ("cache_dtype", "auto".into()),
        ("calculate_kv_scales", "False".into()),
        ("cpu_offload_gb", "0".into()),
        ("enable_prefix_caching", "False".into()),
        ("gpu_memory_utilization", util.to_string()),
        ("is_attention_free", "False".into()),
        ("kv_cache_memory_bytes", kv_bytes),
        ("num_cpu_blocks", "None".into()),
        ("num_gpu_blocks", engine.kv_blocks_total().to_string()),
        ("num_gpu_blocks_override", "None".into()),
        ("sliding_window", "None".into()),
        ("swap_space", "4".into()),
        ("swap_space_bytes", (4 * GIB).to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// `vllm:cache_config_info` labels exactly as vLLM 0.32 writes them (testdata/vllm/real/), values from the flags.
/// `enable_prefix_caching` is "False": the model has no prefix cache (a real 0.32 server says "True").
fn cache_config_v1(user_block: bool, engine: &Engine, kv_bytes: String, util: f64) -> Vec<(String, String)> {
    let block = engine.config().block_size;
    let tokens = engine.kv_blocks_total() * u64::from(block);
    let concurrency = tokens as f64 / f64::from(engine.max_model_len().max(1));
    [
        ("_block_size_resolved", "True".to_string()),
        ("block_size", block.to_string()),
        ("cache_dtype", "auto".into()),
        ("cache_hit_alignment_tokens", "None".into()),
        ("effective_attention_block_size", block.to_string()),
        ("enable_mamba_shared_prefix_checkpoint", "False".into()),
        ("enable_prefix_caching", "False".into()),
        ("gpu_memory_utilization", util.to_string()),
        ("hash_block_size", "None".into()),
        ("is_attention_free", "False".into()),
        ("kv_cache_dtype_skip_layers", "[]".into()),
        ("kv_cache_layout", "None".into()),
        ("kv_cache_max_concurrency", metrics::fmt_f64(concurrency)),
        ("kv_cache_memory_bytes", kv_bytes),
        ("kv_cache_size_tokens", tokens.to_string()),
        ("kv_offloading_backend", "native".into()),
        ("kv_offloading_size", "None".into()),
        ("kv_sharing_fast_prefill", "False".into()),
        ("mamba_block_size", "None".into()),
        ("mamba_cache_dtype", "auto".into()),
        ("mamba_cache_mode", "none".into()),
        ("mamba_page_size_padded", "None".into()),
        ("mamba_ssm_cache_dtype", "auto".into()),
        ("num_cpu_blocks", "None".into()),
        ("num_gpu_blocks", engine.kv_blocks_total().to_string()),
        ("num_gpu_blocks_override", "None".into()),
        ("prefix_cache_retention_interval", "0".into()),
        ("prefix_caching_hash_algo", "sha256".into()),
        ("prefix_match_unit", "None".into()),
        ("replayssm_buffer_len", "16".into()),
        ("skip_page_size_padded", "None".into()),
        ("sliding_window", "None".into()),
        ("swa_bounded_replay", "True".into()),
        ("use_kda_recoverssm", "False".into()),
        ("use_replayssm", "False".into()),
        (
            "user_specified_block_size",
            if user_block { "True" } else { "False" }.into(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

async fn health(State(s): State<Arc<AppState>>) -> Response {
    match s.check_ready() {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => e.into_response(),
    }
}

async fn metrics_page(State(s): State<Arc<AppState>>) -> Response {
    let Ok((stats, sleep)) = s.engine.stats().await else {
        return ApiError::unavailable("the engine has stopped").into_response();
    };
    let (prompt_tps, gen_tps) = {
        let mut last = s.last_scrape.lock().await;
        let dt = last.0.elapsed().as_secs_f64();
        let r = if dt > 0.0 {
            (
                stats.prompt_tokens.saturating_sub(last.1) as f64 / dt,
                stats.generation_tokens.saturating_sub(last.2) as f64 / dt,
            )
        } else {
            (0.0, 0.0)
        };
        *last = (Instant::now(), stats.prompt_tokens, stats.generation_tokens);
        r
    };
    let info = PageInfo {
        model_name: s.served_model_names.first().cloned().unwrap_or_default(),
        cache_config: s.cache_config.clone(),
        created_unix: s.created_unix,
        avg_prompt_throughput: prompt_tps,
        avg_generation_throughput: gen_tps,
        sleep,
    };
    let mut body = metrics::render(&stats, &info, s.metrics_version);
    if s.sleep.served() {
        body.push_str(&s.sleep.metrics_text());
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        body,
    )
        .into_response()
}

/// Runs `tessera vllm-sim`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.time_scale > 0.0 && args.time_scale.is_finite(),
        "--time-scale must be a positive number, got {}",
        args.time_scale
    );
    let engine = build_engine(&args).context("the emulated vLLM engine cannot start with these flags")?;
    let kv_gib = engine.kv_blocks_total() as f64
        * engine.model().bytes_per_kv_token as f64
        * f64::from(engine.config().block_size)
        / GIB as f64;
    let kv_tokens = engine.kv_blocks_total() * u64::from(engine.config().block_size);
    // The same start-up lines a real vLLM V1 server logs, so log-reading tools can be tested too.
    info!(
        "Model loading took {:.4} GiB",
        engine.model().weights_bytes as f64 / GIB as f64
    );
    info!("Available KV cache memory: {kv_gib:.2} GiB");
    info!("GPU KV cache size: {kv_tokens} tokens");
    info!(
        "Maximum concurrency for {} tokens per request: {:.2}x",
        engine.max_model_len(),
        kv_tokens as f64 / f64::from(engine.max_model_len())
    );
    info!(
        "vllm cache_config_info with initialization after num_gpu_blocks is: {}",
        engine.kv_blocks_total()
    );
    if args.startup_mode == StartupMode::Refuse && !args.startup_delay.is_zero() {
        info!(delay = ?args.startup_delay, "emulating model loading; the port opens when ready");
        tokio::time::sleep(args.startup_delay).await;
    }
    let app = router(&args, engine);
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    info!(listen = %listener.local_addr()?, model = %args.model_preset, gpu = %args.gpu, "vllm-sim serving");
    let graceful = tessera_runtime::Graceful::on_signals(args.drain.drain_period);
    let g = graceful.clone();
    axum::serve(listener, graceful.ready_gate(app))
        .with_graceful_shutdown(async move { g.stopping().await })
        .await
        .context("server error")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn byte_counts_with_units() {
        assert_eq!(parse_bytes("1024").unwrap(), 1024);
        assert_eq!(parse_bytes("8Gi").unwrap(), 8 * GIB);
        assert_eq!(parse_bytes("2G").unwrap(), 2_000_000_000);
        assert!(parse_bytes("8X").unwrap_err().contains("not a byte size"));
    }
}
