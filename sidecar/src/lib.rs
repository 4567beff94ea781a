//! The sidecar that runs beside every vLLM server, and the gpu-agent that runs in every capacity pod.
//!
//! `tessera sidecar` scrapes vLLM's `/metrics` every `--scrape-interval`, keeps a `--window` of good scrapes,
//! reads the GPU through NVML when it can, computes this replica's memory and compute recommendation with
//! [`tessera_core::recommend`], and serves it all:
//! - `/metrics`: Prometheus text (`tessera_*`), see [`exporter`];
//! - `/v1/status`: [`tessera_core::wire::sidecar::SidecarStatus`] as JSON, what the autoscaler reads;
//! - `/live` (the process serves) and `/ready` (vLLM has answered a scrape).
//!
//! Layers: [`scrape`] (HTTP), [`gpu`] (NVML behind a trait), [`model`] (the model's files, `--model-dir`),
//! [`state`] (pure bookkeeping, time passed in), [`exporter`] (the registry), [`server`] (axum). This file holds
//! the flags and the loop that ties them.

pub mod agent;
pub mod error;
pub mod exporter;
pub mod gate;
pub mod gpu;
pub mod model;
pub mod objective;
pub mod rest;
pub mod scrape;
pub mod server;
pub mod state;

use anyhow::Context as _;
use error::ConfigError;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;

// `--help` headings: the flags grouped by what a platform engineer sets them for.
const SCRAPE: &str = "vLLM and scraping";
const SERVING: &str = "Serving and shutdown";
const FACTS: &str = "GPU and memory facts";
const RECOMMEND: &str = "Memory recommendation";
const COMPUTE: &str = "Compute share and latency objective";

/// `tessera sidecar` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Base URL of the vLLM server, e.g. http://127.0.0.1:8000 (its /metrics is scraped).
    #[arg(help_heading = SCRAPE, long, env = "TESSERA_VLLM_URL", default_value = "http://127.0.0.1:8000")]
    pub vllm_url: String,
    /// Address to serve /metrics, /v1/status, /live and /ready on.
    #[arg(help_heading = SERVING, long, env = "TESSERA_LISTEN", default_value = "0.0.0.0:9090")]
    pub listen: std::net::SocketAddr,
    /// Client connection bounds (`--header-read-timeout`, `--client-idle-timeout`): a silent, trickling or idle
    /// connection is closed.
    #[command(flatten, next_help_heading = SERVING)]
    pub conn: tessera_runtime::serve::ConnArgs,
    /// How often to scrape vLLM's /metrics.
    #[arg(help_heading = SCRAPE, long, env = "TESSERA_SCRAPE_INTERVAL", default_value = "5s", value_parser = humantime::parse_duration)]
    pub scrape_interval: Duration,
    /// Longest a scrape may take (connect, headers and body); a slower answer counts as an error.
    #[arg(help_heading = SCRAPE, long, env = "TESSERA_SCRAPE_TIMEOUT", default_value = "2s", value_parser = humantime::parse_duration)]
    pub scrape_timeout: Duration,
    /// How much history the recommendation and the window summary look at.
    #[arg(help_heading = SCRAPE, long, env = "TESSERA_WINDOW", default_value = "10m", value_parser = humantime::parse_duration)]
    pub window: Duration,
    /// Trailing window of the short-window latency in /v1/status (`recent`), which the autoscaler's TTFT SLO
    /// guard reads: about its sync cadence, so one excursion does not keep firing for the whole --window.
    #[arg(help_heading = SCRAPE, long, env = "TESSERA_LATENCY_WINDOW", default_value = "1m", value_parser = humantime::parse_duration)]
    pub latency_window: Duration,
    /// Total GPU memory in MiB, used when NVML is not available (NVML's figure wins when it is).
    #[arg(help_heading = FACTS, long, env = "TESSERA_GPU_MEMORY_MIB")]
    pub gpu_memory_mib: Option<u64>,
    /// Bytes of KV cache per token: 2 × layers × kv_heads × head_dim × dtype bytes (1× for MLA models).
    /// Without it, it is derived from vLLM's kv_cache_memory_bytes or the measured process memory.
    #[arg(help_heading = FACTS, long, env = "TESSERA_BYTES_PER_KV_TOKEN")]
    pub bytes_per_kv_token: Option<u64>,
    /// Non-KV GPU memory (weights + activation peak + CUDA context), MiB. Without it, it is measured (NVML on a
    /// dedicated GPU) or derived from vLLM's gpu_memory_utilization × total − KV cache.
    #[arg(help_heading = FACTS, long, env = "TESSERA_NON_KV_MEMORY_MIB")]
    pub non_kv_memory_mib: Option<u64>,
    /// The server's --max-model-len: the KV cache is never recommended below one such sequence. Without it, it
    /// is read from vLLM's /v1/models (`max_model_len` of each model card).
    #[arg(help_heading = FACTS, long, env = "TESSERA_MAX_MODEL_LEN")]
    pub max_model_len: Option<u64>,
    /// NVML index of the GPU this server uses.
    #[arg(help_heading = FACTS, long, env = "TESSERA_NVML_DEVICE_INDEX", default_value_t = 0)]
    pub nvml_device_index: u32,
    /// Do not try NVML at all (the GPU total then comes from --gpu-memory-mib).
    #[arg(help_heading = FACTS, long, env = "TESSERA_NO_NVML")]
    pub no_nvml: bool,
    /// The GPU is shared with other servers: its used memory and busy time are not this server's, so only its
    /// total is used (per-pod use comes from the gpu-agent).
    #[arg(help_heading = FACTS, long, env = "TESSERA_GPU_SHARED")]
    pub gpu_shared: bool,
    /// Percentile of KV usage to size for (0.95 = p95).
    #[arg(help_heading = RECOMMEND, long, env = "TESSERA_PERCENTILE", default_value_t = 0.95)]
    pub percentile: f64,
    /// Headroom over that percentile (0.2 = +20%).
    #[arg(help_heading = RECOMMEND, long, env = "TESSERA_HEADROOM", default_value_t = 0.2)]
    pub headroom: f64,
    /// Fewest good scrapes in the window before recommending.
    #[arg(help_heading = RECOMMEND, long, env = "TESSERA_MIN_SAMPLES", default_value_t = 12)]
    pub min_samples: usize,
    /// Shortest window before recommending.
    #[arg(help_heading = RECOMMEND, long, env = "TESSERA_MIN_WINDOW", default_value = "1m", value_parser = humantime::parse_duration)]
    pub min_window: Duration,
    /// Largest growth per update, as a factor of what runs now.
    #[arg(help_heading = RECOMMEND, long, env = "TESSERA_MAX_STEP_UP", default_value_t = 2.0)]
    pub max_step_up: f64,
    /// Largest shrink per update, as a fraction of what runs now.
    #[arg(help_heading = RECOMMEND, long, env = "TESSERA_MAX_STEP_DOWN", default_value_t = 0.1)]
    pub max_step_down: f64,
    /// The most of the GPU's memory a replica may be given, 0–1.
    #[arg(help_heading = RECOMMEND, long, env = "TESSERA_MAX_GPU_MEMORY_UTILIZATION", default_value_t = 0.95)]
    pub max_gpu_memory_utilization: f64,
    /// The GPU compute share this server runs with, 0–1 (the webhook sets it from the
    /// tessera.dev/gpu-compute-fraction annotation; 1 = whole GPU). Latency is observed at this share, so the
    /// compute recommendation scales from it.
    #[arg(help_heading = COMPUTE, long, env = "TESSERA_GPU_COMPUTE_FRACTION", default_value_t = 1.0)]
    pub gpu_compute_fraction: f64,
    /// Time-to-first-token p95 objective, e.g. 2s. With it, the compute share is sized so the window's TTFT p95
    /// sits near half of it (shrinking in bounded steps while there is room, growing when over). Without any
    /// objective the compute share is never shrunk.
    #[arg(help_heading = COMPUTE, long, env = "TESSERA_TTFT_SLO", value_parser = humantime::parse_duration)]
    pub ttft_slo: Option<Duration>,
    /// Inter-token latency p95 objective, e.g. 100ms: decode steps slow down as the share shrinks, so this keeps
    /// streaming speed. Combined with --ttft-slo, the objective needing the larger share wins.
    #[arg(help_heading = COMPUTE, long, env = "TESSERA_ITL_SLO", value_parser = humantime::parse_duration)]
    pub itl_slo: Option<Duration>,
    /// The KV-cache utilization the model's replica count scales on (its InferenceAutoscaler's
    /// `targets.kvCacheUtilization`, 0–1; the webhook passes it). The recommended cache then holds one
    /// max_model_len sequence below it (max_model_len / target tokens), so one request alone never asks for another
    /// replica, which would load the weights again to relieve a cache a fraction of their size. Without it the
    /// floor is one sequence, vLLM's own minimum.
    #[arg(help_heading = RECOMMEND, long, env = "TESSERA_KV_TARGET_UTILIZATION")]
    pub kv_target_utilization: Option<f64>,
    /// How many GPUs' worth of compute caps this server's pool hands out per GPU (the pool's
    /// `computeOversubscription`, 1–4; the webhook passes it for fractional pods). The compute share is then never
    /// recommended below what the replica's GPU memory already pays for (oversubscription × its memory / the
    /// GPU's): a smaller cap packs nothing tighter and only slows the server while its GPU is idle. Without it,
    /// no such floor.
    #[arg(help_heading = COMPUTE, long, env = "TESSERA_COMPUTE_OVERSUBSCRIPTION")]
    pub compute_oversubscription: Option<f64>,
    /// Directory holding the model's config.json (and its safetensors files), as vLLM loads it. From it come the
    /// exact KV bytes per token in every memory mode (2 × layers × kv_heads × head_dim × dtype bytes; one latent
    /// per layer for MLA models), and the weight bytes as a floor for non-KV memory. The webhook mounts the vLLM
    /// container's model volume read-only and passes its path. Read at start-up, and again once a minute while
    /// config.json is missing (a model still downloading).
    #[arg(help_heading = FACTS, long, env = "TESSERA_MODEL_DIR")]
    pub model_dir: Option<std::path::PathBuf>,
    /// vLLM's --tensor-parallel-size: each GPU holds its share of the KV heads and of the weights.
    #[arg(help_heading = FACTS, long, env = "TESSERA_TENSOR_PARALLEL_SIZE", default_value_t = 1)]
    pub tensor_parallel_size: u32,
    /// vLLM's --dtype (auto, float16, bfloat16, float32): the KV element width when vLLM's cache_dtype is auto.
    #[arg(help_heading = FACTS, long, env = "TESSERA_MODEL_DTYPE", default_value = "auto")]
    pub model_dtype: String,
    /// The per-GPU start-up gate (fractional pods only).
    #[command(flatten, next_help_heading = "Start-up gate")]
    pub gate: gate::GateArgs,
    /// Sleep mode (`--rest-file`): the controller's instruction, performed and checked here.
    #[command(flatten, next_help_heading = "Sleep mode")]
    pub rest: rest::RestArgs,
    /// The token the controller must send to hand this sidecar a latency objective (`PUT /v1/objective`,
    /// `Authorization: Bearer …`): this namespace's HMAC of the chart's objective key, injected by the webhook.
    /// Without it the sidecar refuses every objective over HTTP and keeps --ttft-slo/--itl-slo.
    #[arg(help_heading = COMPUTE, long, env = "TESSERA_OBJECTIVE_TOKEN", hide_env_values = true)]
    pub objective_token: Option<String>,
    /// Graceful shutdown (`--drain-period`).
    #[command(flatten, next_help_heading = SERVING)]
    pub drain: tessera_runtime::DrainArgs,
}

impl Args {
    fn recommend_config(&self) -> tessera_core::recommend::Config {
        tessera_core::recommend::Config {
            percentile: self.percentile,
            headroom: self.headroom,
            min_samples: self.min_samples,
            min_window_secs: self.min_window.as_secs_f64(),
            max_step_up: self.max_step_up,
            max_step_down_ratio: self.max_step_down,
            max_gpu_memory_utilization: self.max_gpu_memory_utilization,
            kv_target_utilization: self.kv_target_utilization,
            compute_oversubscription: self.compute_oversubscription,
            ..Default::default()
        }
    }

    /// Checks the flags, naming the wrong one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(self.vllm_url.starts_with("http://") || self.vllm_url.starts_with("https://")) {
            return Err(ConfigError::VllmUrl(self.vllm_url.clone()));
        }
        if self.scrape_interval.is_zero() || self.scrape_timeout.is_zero() {
            return Err(ConfigError::Duration(
                "--scrape-interval and --scrape-timeout must be above 0".into(),
            ));
        }
        if self.window < self.min_window {
            return Err(ConfigError::Duration(format!(
                "--window ({}) must be at least --min-window ({})",
                humantime::format_duration(self.window),
                humantime::format_duration(self.min_window)
            )));
        }
        if !(self.gpu_compute_fraction.is_finite()
            && self.gpu_compute_fraction > 0.0
            && self.gpu_compute_fraction <= 1.0)
        {
            return Err(ConfigError::Value(format!(
                "--gpu-compute-fraction {} must be in (0, 1]: the share of the GPU this server runs with (1 = whole GPU)",
                self.gpu_compute_fraction
            )));
        }
        if let Some(u) = self.kv_target_utilization
            && !(u.is_finite() && u > 0.0 && u <= 1.0)
        {
            return Err(ConfigError::Value(format!(
                "--kv-target-utilization {u} must be in (0, 1]: the KV-cache utilization the replica count scales on \
                 (targets.kvCacheUtilization, e.g. 0.7), or left out"
            )));
        }
        let most = tessera_core::pack::MAX_COMPUTE_OVERSUBSCRIPTION;
        if let Some(o) = self.compute_oversubscription
            && !(o.is_finite() && (1.0..=most).contains(&o))
        {
            return Err(ConfigError::Value(format!(
                "--compute-oversubscription {o} must be in [1, {most}]: the GPUs' worth of compute caps the pool hands out \
                 per GPU (its computeOversubscription, e.g. 2 under MPS), or left out"
            )));
        }
        for (flag, slo) in [("--ttft-slo", self.ttft_slo), ("--itl-slo", self.itl_slo)] {
            if slo.is_some_and(|d| d.is_zero()) {
                return Err(ConfigError::Duration(format!(
                    "{flag} must be above 0 (e.g. 2s), or left out for no objective"
                )));
            }
        }
        if self.rest.rest_poll.is_zero() || self.rest.rest_timeout.is_zero() {
            return Err(ConfigError::Duration(
                "--rest-poll and --rest-timeout must be above 0".into(),
            ));
        }
        if self.tensor_parallel_size == 0 {
            return Err(ConfigError::Value(
                "--tensor-parallel-size must be at least 1 (vLLM's --tensor-parallel-size)".into(),
            ));
        }
        self.run_dtype()?;
        self.recommend_config().validate()?;
        Ok(())
    }

    /// `--model-dtype` read: `None` for auto.
    fn run_dtype(&self) -> Result<Option<tessera_core::recommend::Dtype>, ConfigError> {
        use tessera_core::recommend::Dtype;
        if self.model_dtype.trim().eq_ignore_ascii_case("auto") {
            return Ok(None);
        }
        match Dtype::parse(&self.model_dtype) {
            Some(d) if d != Dtype::Fp8 => Ok(Some(d)),
            _ => Err(ConfigError::Value(format!(
                "--model-dtype {:?} is not one of vLLM's --dtype values: auto, float16 (half), bfloat16, float32 \
                 (float)",
                self.model_dtype
            ))),
        }
    }
}

/// What the server shares with the scrape loop.
#[derive(Debug)]
pub struct Shared {
    /// The state.
    pub state: Mutex<state::State>,
    /// The registry.
    pub exporter: Mutex<exporter::Exporter>,
    /// The start-up gate's status (`/startup`).
    pub gate: gate::SharedGate,
    /// Sleep mode: the replica's state, readiness, liveness and the wake (`/tessera/v1/wake`).
    pub rest: Arc<rest::Rest>,
    /// The token `PUT /v1/objective` must carry; `None`: objectives are refused (see [`objective`]).
    pub objective_token: Option<objective::Token>,
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Runs the sidecar until SIGTERM or SIGINT.
pub async fn run(args: Args) -> anyhow::Result<()> {
    args.validate()?;
    let settings = state::Settings {
        vllm_url: args.vllm_url.clone(),
        interval_secs: args.scrape_interval.as_secs_f64(),
        window_secs: args.window.as_secs_f64(),
        latency_window_secs: args.latency_window.as_secs_f64(),
        recommend: args.recommend_config(),
        bytes_per_kv_token: args.bytes_per_kv_token,
        non_kv_bytes: args.non_kv_memory_mib.map(state::mib),
        max_model_len: args.max_model_len,
        gpu_shared: args.gpu_shared,
        compute_share: args.gpu_compute_fraction,
        ttft_slo_secs: args.ttft_slo.map(|d| d.as_secs_f64()),
        itl_slo_secs: args.itl_slo.map(|d| d.as_secs_f64()),
        model_dir: args.model_dir.as_ref().map(|d| d.display().to_string()),
        model_dtype: args.run_dtype()?,
        tensor_parallel_size: args.tensor_parallel_size,
    };
    let (probe, nvml_err) = gpu::select(
        !args.no_nvml,
        args.nvml_device_index,
        args.gpu_memory_mib.map(state::mib),
    );
    if let Some(e) = &nvml_err {
        // Said once: a machine without NVML stays without it.
        tracing::warn!(error = %e, fallback = if probe.is_some() { "--gpu-memory-mib" } else { "none" },
            "no NVML: working on vLLM data only");
    }
    let scraper =
        scrape::Scraper::new(&args.vllm_url, args.scrape_timeout).context("building the HTTP client")?;
    let shared = Arc::new(Shared {
        state: Mutex::new(state::State::new(settings)),
        exporter: Mutex::new(exporter::Exporter::new()),
        gate: gate::open_gate(),
        rest: Arc::new(rest::Rest::new(
            args.rest.rest_file.is_some(),
            args.rest.sleep_risks.clone(),
        )),
        objective_token: args
            .objective_token
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(|t| objective::Token(t.to_owned())),
    });
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding --listen {}", args.listen))?;
    tracing::info!(listen = %listener.local_addr()?, vllm = %scraper.url(), interval = ?args.scrape_interval,
        "tessera sidecar serving");

    let graceful = tessera_runtime::Graceful::on_signals(args.drain.drain_period);
    let shutdown = graceful.stop_token();
    let loop_task = tokio::spawn(scrape_loop(
        scraper,
        probe,
        shared.clone(),
        args.scrape_interval,
        args.model_dir.clone(),
        shutdown.clone(),
    ));
    let gate_task = start_gate(&args, shared.gate.clone(), shutdown.clone()).await;
    let rest_task = if args.rest.rest_file.is_some() {
        let client =
            rest::vllm::VllmClient::new(&args.vllm_url, args.scrape_timeout.max(Duration::from_secs(5)))
                .context("building the HTTP client for sleep mode")?;
        // The device's used memory is this server's own only on a dedicated GPU; on a shared one it is unmeasured.
        let own_gpu: Option<Box<dyn gpu::GpuProbe>> = if args.no_nvml || args.gpu_shared {
            None
        } else {
            gpu::NvmlProbe::new(args.nvml_device_index)
                .ok()
                .map(|p| Box::new(p) as Box<dyn gpu::GpuProbe>)
        };
        tracing::info!(file = ?args.rest.rest_file, settle = ?args.rest.rest_settle, "sleep mode on");
        Some(tokio::spawn(rest::run(
            shared.rest.clone(),
            args.rest.clone(),
            client,
            own_gpu,
            shutdown.clone(),
        )))
    } else {
        None
    };
    server::serve(listener, shared, &graceful, args.conn.limits())
        .await
        .context("serving HTTP")?;
    shutdown.cancel();
    loop_task.await.context("scrape loop")?;
    if let Some(t) = rest_task {
        t.await.context("sleep-mode loop")?;
    }
    if let Some(t) = gate_task {
        // The gate releases a held lease on shutdown; wait for it so the next pod on the GPU starts at once.
        let _ = t.await;
    }
    tracing::info!("tessera sidecar stopped");
    Ok(())
}

/// Starts the start-up gate when this pod shares a GPU. Without a Kubernetes client the gate fails open: the pod
/// starts as it would without Tessera, and the log says why.
async fn start_gate(
    args: &Args,
    status: gate::SharedGate,
    shutdown: CancellationToken,
) -> Option<tokio::task::JoinHandle<()>> {
    args.gate.lease_name()?;
    if let Ok(mut s) = status.lock() {
        *s = gate::GateStatus::waiting(args.gate.lease_name());
    }
    let client = match tessera_runtime::kube_client::client().await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "start-up gate: no Kubernetes client; opening the gate (fail open)");
            if let Ok(mut s) = status.lock() {
                *s = gate::GateStatus::api_unavailable(args.gate.lease_name());
            }
            return None;
        }
    };
    let api = kube::Api::namespaced(client, &args.gate.gate_namespace);
    let health = format!("{}/health", args.vllm_url.trim_end_matches('/'));
    Some(tokio::spawn(gate::run(
        api,
        args.gate.clone(),
        health,
        status,
        shutdown,
    )))
}

/// Scrapes every `interval` until cancelled. The GPU is read just before each scrape so both describe the
/// same moment.
async fn scrape_loop(
    scraper: scrape::Scraper,
    probe: Option<Box<dyn gpu::GpuProbe>>,
    shared: Arc<Shared>,
    interval: Duration,
    model_dir: Option<std::path::PathBuf>,
    shutdown: CancellationToken,
) {
    let mut ticker = tokio::time::interval(interval);
    // When to next read --model-dir (while its config.json has not been read; once a minute at most).
    let mut next_model_read = tokio::time::Instant::now();
    let mut last_model_error: Option<String> = None;
    // After a slow scrape, wait a full interval rather than firing a burst to catch up.
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut gpu_failed = false;
    // When to next ask vLLM's /v1/models for max_model_len (while unknown; once a minute at most).
    let mut next_models_query = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        if let Some(dir) = &model_dir
            && tokio::time::Instant::now() >= next_model_read
            && shared.state.lock().is_ok_and(|s| s.needs_model())
        {
            next_model_read = tokio::time::Instant::now() + Duration::from_secs(60);
            let d = dir.clone();
            // File reads (bounded, but up to one safetensors header per shard) stay off the async threads.
            let read = tokio::task::spawn_blocking(move || model::read_model_dir(&d)).await;
            match read {
                Ok(read) => {
                    match &read {
                        Ok(files) => {
                            tracing::info!(dir = %dir.display(), geometry = ?files.geometry,
                                "read the model's config.json");
                            if let Some(risk) = &files.sleep_risk {
                                shared.rest.add_risk(risk.clone());
                            }
                            if let Err(e) = &files.weights {
                                tracing::warn!(error = %e, "the model's weight bytes are unknown");
                            }
                        }
                        Err(e) => {
                            let msg = e.to_string();
                            // Said once per distinct error: a model still downloading fails the same way each minute.
                            if last_model_error.as_ref() != Some(&msg) {
                                tracing::warn!(error = %msg, "cannot read --model-dir; retrying every minute");
                                last_model_error = Some(msg);
                            }
                        }
                    }
                    if let Ok(mut state) = shared.state.lock() {
                        state.set_model(read);
                    }
                }
                Err(e) => tracing::error!(error = %e, "reading --model-dir panicked"),
            }
        }
        let reading = match &probe {
            Some(p) => match p.read() {
                Ok(r) => {
                    gpu_failed = false;
                    Some((p.source(), r))
                }
                Err(e) => {
                    if !gpu_failed {
                        tracing::warn!(error = %e, "GPU read failed; continuing without GPU data");
                    }
                    gpu_failed = true;
                    None
                }
            },
            None => None,
        };
        let result = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = scraper.scrape() => r,
        };
        let want_len = result.is_ok()
            && tokio::time::Instant::now() >= next_models_query
            && shared.state.lock().is_ok_and(|s| s.needs_max_model_len());
        let learned_len = if want_len {
            next_models_query = tokio::time::Instant::now() + Duration::from_secs(60);
            scraper.max_model_len().await
        } else {
            None
        };
        let now = unix_now();
        let (Ok(mut state), Ok(mut exporter)) = (shared.state.lock(), shared.exporter.lock()) else {
            tracing::error!("state lock poisoned; stopping the scrape loop");
            return;
        };
        if let Some(n) = learned_len {
            tracing::info!(max_model_len = n, "learned max_model_len from vLLM's /v1/models");
            state.set_max_model_len(n);
        }
        state.set_gpu(reading.map_or("none", |(s, _)| s), reading.map(|(_, r)| r));
        match result {
            Ok(snapshot) => {
                if !snapshot.line_errors.is_empty() {
                    tracing::debug!(
                        count = snapshot.line_errors.len(),
                        "skipped malformed lines on vLLM's page"
                    );
                }
                if !state.vllm_up() {
                    tracing::info!("vLLM answered a scrape");
                }
                state.record_success(now, snapshot);
            }
            Err(e) => {
                if state.vllm_up() || state.latest().is_none() && state.window_len() == 0 {
                    tracing::warn!(error = %e, reason = e.label(), "scrape failed");
                } else {
                    tracing::debug!(error = %e, reason = e.label(), "scrape failed");
                }
                exporter.count_error(e.label());
                state.record_failure(now, &e);
            }
        }
        exporter.update(&state);
    }
}

#[cfg(test)]
mod default_tests {

    /// The simulator computes a replica's `recent` TTFT p95 over this window: it must be the sidecar's default.
    #[test]
    fn the_simulated_sidecar_uses_the_shipped_latency_window() {
        let a: super::Args =
            tessera_runtime::try_parse_args(&["sidecar", "--vllm-url", "http://127.0.0.1:8000"])
                .expect("flags parse");
        assert_eq!(a.latency_window, tessera_core::scale::inputs::RECENT_WINDOW);
    }
}
