//! The sidecar's calls to vLLM's sleep endpoints (development endpoints: only the sidecar reaches them), the
//! canary completion, and the reading of one `/metrics` page for the sleep state, the requests in flight and
//! the GPU memory the server holds.

use std::time::Duration;

use serde_json::{Value, json};
use tessera_core::metrics::parse_text;
use tessera_core::sleep::command::SleepLevel;

/// Largest answer read from any of these calls (a metrics page is the largest, tens of KiB).
const MAX_BODY: usize = 8 * 1024 * 1024;

/// Added to a transition's bound for each of its calls, so the transition's own bound (and its clearer message)
/// ends a hung call, not the HTTP client's.
const CALL_SLACK: Duration = Duration::from_secs(1);

/// The prompt of the canary: short, fixed; with a fixed seed and temperature 0 its answer repeats exactly while
/// the weights are the same.
pub const CANARY_PROMPT: &str = "Tessera canary: the quick brown fox";
/// The canary's seed.
pub const CANARY_SEED: u64 = 44;
/// Tokens the canary asks for.
pub const CANARY_TOKENS: u32 = 8;

/// Why a call to vLLM failed.
#[derive(Debug, thiserror::Error)]
pub enum VllmCallError {
    /// No answer (refused, reset, timed out).
    #[error("{what}: {detail}")]
    Transport {
        /// The call.
        what: String,
        /// The client error with its causes.
        detail: String,
    },
    /// A non-2xx answer.
    #[error("{what} answered HTTP {status}: {body}")]
    Status {
        /// The call.
        what: String,
        /// The status.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// The answer was not what the call expects.
    #[error("{what}: {detail}")]
    Shape {
        /// The call.
        what: String,
        /// What was wrong.
        detail: String,
    },
}

impl VllmCallError {
    /// The HTTP status, when vLLM answered one.
    pub fn status(&self) -> Option<u16> {
        match self {
            VllmCallError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// The sleep state `vllm:engine_sleep_state` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineSleep {
    /// `awake` = 1.
    Awake,
    /// Asleep at this level (`weights_offloaded` = 1: level 1, `discard_all` = 1: level 2).
    Asleep(SleepLevel),
}

/// What one `/metrics` page says that sleep mode reads.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PageReading {
    /// `vllm:engine_sleep_state`, when the page has it (older servers do not).
    pub sleep: Option<EngineSleep>,
    /// `vllm:num_requests_running` + `vllm:num_requests_waiting`, summed over engines.
    pub in_flight: Option<f64>,
    /// `tessera_emulator_gpu_memory_used_bytes` (the emulator's stand-in for a per-pod GPU reading).
    pub gpu_used_bytes: Option<u64>,
}

/// Reads a page (pure).
pub fn read_page(text: &str) -> PageReading {
    let page = parse_text(text);
    let sum = |name: &str| {
        page.family(name)
            .map(|f| f.samples.iter().map(|s| s.value).sum::<f64>())
    };
    let in_flight = match (sum("vllm:num_requests_running"), sum("vllm:num_requests_waiting")) {
        (None, None) => None,
        (r, w) => Some(r.unwrap_or(0.0) + w.unwrap_or(0.0)),
    };
    let sleep = page.family("vllm:engine_sleep_state").map(|f| {
        let on = |state: &str| {
            f.samples
                .iter()
                .any(|s| s.value >= 0.5 && s.label("sleep_state").as_deref() == Some(state))
        };
        if on("discard_all") {
            EngineSleep::Asleep(SleepLevel::Two)
        } else if on("weights_offloaded") {
            EngineSleep::Asleep(SleepLevel::One)
        } else if on("awake") {
            EngineSleep::Awake
        } else {
            // awake = 0 with neither level set: asleep, level unknown; level 1 is vLLM's default.
            EngineSleep::Asleep(SleepLevel::One)
        }
    });
    let gpu_used_bytes = page
        .family("tessera_emulator_gpu_memory_used_bytes")
        .and_then(|f| f.samples.first())
        .filter(|s| s.value.is_finite() && s.value >= 0.0)
        .map(|s| s.value as u64);
    PageReading {
        sleep,
        in_flight,
        gpu_used_bytes,
    }
}

/// A client for one vLLM server's sleep surface.
#[derive(Debug, Clone)]
pub struct VllmClient {
    client: reqwest::Client,
    base: String,
}

impl VllmClient {
    /// A client for `base` (`--vllm-url`); `call_timeout` bounds each call except the ones given their own.
    pub fn new(base: &str, call_timeout: Duration) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .timeout(call_timeout)
            .connect_timeout(call_timeout)
            .pool_max_idle_per_host(2)
            .build()?;
        Ok(Self {
            client,
            base: base.trim_end_matches('/').to_owned(),
        })
    }

    async fn call(&self, req: reqwest::RequestBuilder, what: String) -> Result<Vec<u8>, VllmCallError> {
        let resp = req.send().await.map_err(|e| VllmCallError::Transport {
            what: what.clone(),
            detail: crate::error::chain(&e),
        })?;
        let status = resp.status();
        let body = tessera_runtime::body::read_capped(resp, MAX_BODY)
            .await
            .map_err(|e| VllmCallError::Transport {
                what: what.clone(),
                detail: e.to_string(),
            })?;
        if !status.is_success() {
            return Err(VllmCallError::Status {
                what,
                status: status.as_u16(),
                body: String::from_utf8_lossy(&body).chars().take(300).collect(),
            });
        }
        Ok(body)
    }

    /// `GET /metrics`, read.
    pub async fn page(&self) -> Result<PageReading, VllmCallError> {
        let what = format!("GET {}/metrics", self.base);
        let body = self
            .call(self.client.get(format!("{}/metrics", self.base)), what)
            .await?;
        Ok(read_page(&String::from_utf8_lossy(&body)))
    }

    /// `GET /is_sleeping` (for servers whose page has no `vllm:engine_sleep_state`).
    pub async fn is_sleeping(&self) -> Result<bool, VllmCallError> {
        let what = format!("GET {}/is_sleeping", self.base);
        let body = self
            .call(
                self.client.get(format!("{}/is_sleeping", self.base)),
                what.clone(),
            )
            .await?;
        serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v.get("is_sleeping").and_then(Value::as_bool))
            .ok_or_else(|| VllmCallError::Shape {
                what,
                detail: "no boolean is_sleeping".into(),
            })
    }

    /// `POST /sleep?level=N&mode=wait`: the requests in flight finish first. A server that refuses the `mode`
    /// parameter with a 4xx other than 404 (an older vLLM) is asked again without it; 404 means the server has no
    /// sleep endpoints at all.
    pub async fn sleep(&self, level: SleepLevel, limit: Duration) -> Result<(), VllmCallError> {
        let limit = limit + CALL_SLACK;
        let n = level.as_u8();
        let with_mode = format!("{}/sleep?level={n}&mode=wait", self.base);
        match self
            .call(
                self.client.post(&with_mode).timeout(limit),
                format!("POST {with_mode}"),
            )
            .await
        {
            Err(e) if e.status().is_some_and(|s| (400..500).contains(&s) && s != 404) => {
                tracing::info!(error = %e, "the server refused mode=wait; sleeping without it");
                let plain = format!("{}/sleep?level={n}", self.base);
                self.call(self.client.post(&plain).timeout(limit), format!("POST {plain}"))
                    .await
                    .map(drop)
            }
            r => r.map(drop),
        }
    }

    /// The wake sequence: level 1 `POST /wake_up`; level 2 (weights discarded) `wake_up?tags=weights`, then
    /// `collective_rpc reload_weights`, then `wake_up?tags=kv_cache` and `reset_prefix_cache`, as vLLM documents
    /// for a level-2 wake that keeps the same model.
    pub async fn wake(&self, level: SleepLevel, limit: Duration) -> Result<(), VllmCallError> {
        let limit = limit + CALL_SLACK;
        let post = |path: &str| {
            let url = format!("{}{path}", self.base);
            (self.client.post(&url).timeout(limit), format!("POST {url}"))
        };
        match level {
            SleepLevel::One => {
                let (r, w) = post("/wake_up");
                self.call(r, w).await.map(drop)
            }
            SleepLevel::Two => {
                let (r, w) = post("/wake_up?tags=weights");
                self.call(r, w).await?;
                let (r, w) = post("/collective_rpc");
                self.call(r.json(&json!({"method": "reload_weights"})), w).await?;
                let (r, w) = post("/wake_up?tags=kv_cache");
                self.call(r, w).await?;
                let (r, w) = post("/reset_prefix_cache");
                self.call(r, w).await.map(drop)
            }
        }
    }

    /// The first model `/v1/models` lists (what the canary asks for).
    pub async fn first_model(&self) -> Result<String, VllmCallError> {
        let what = format!("GET {}/v1/models", self.base);
        let body = self
            .call(self.client.get(format!("{}/v1/models", self.base)), what.clone())
            .await?;
        string_at(&body, "/data/0/id", what, "no model in data[0].id")
    }

    /// The canary: a fixed-seed, temperature-0 completion of [`CANARY_TOKENS`] tokens; its text.
    pub async fn canary(&self, model: &str) -> Result<String, VllmCallError> {
        let url = format!("{}/v1/completions", self.base);
        let body = json!({
            "model": model, "prompt": CANARY_PROMPT, "max_tokens": CANARY_TOKENS, "temperature": 0,
            "seed": CANARY_SEED,
        });
        let what = format!("POST {url} (canary)");
        let answer = self
            .call(self.client.post(&url).json(&body), what.clone())
            .await?;
        string_at(&answer, "/choices/0/text", what, "no choices[0].text")
    }
}

/// The string at `pointer` (a JSON pointer) in the JSON `body` that `what` answered, or a
/// [`VllmCallError::Shape`] saying `detail`.
fn string_at(body: &[u8], pointer: &str, what: String, detail: &str) -> Result<String, VllmCallError> {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.pointer(pointer)?.as_str().map(str::to_owned))
        .ok_or_else(|| VllmCallError::Shape {
            what,
            detail: detail.into(),
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reads_the_sleep_state_the_requests_and_the_memory() {
        let page = |awake: u8, l1: u8, l2: u8| {
            format!(
                "# TYPE vllm:engine_sleep_state gauge\n\
                 vllm:engine_sleep_state{{engine=\"0\",model_name=\"m\",sleep_state=\"awake\"}} {awake}.0\n\
                 vllm:engine_sleep_state{{engine=\"0\",model_name=\"m\",sleep_state=\"weights_offloaded\"}} {l1}.0\n\
                 vllm:engine_sleep_state{{engine=\"0\",model_name=\"m\",sleep_state=\"discard_all\"}} {l2}.0\n\
                 vllm:num_requests_running{{engine=\"0\",model_name=\"m\"}} 2.0\n\
                 vllm:num_requests_waiting{{engine=\"0\",model_name=\"m\"}} 1.0\n\
                 tessera_emulator_gpu_memory_used_bytes 5.36870912e+08\n"
            )
        };
        let r = read_page(&page(1, 0, 0));
        assert_eq!(r.sleep, Some(EngineSleep::Awake));
        assert_eq!(r.in_flight, Some(3.0));
        assert_eq!(r.gpu_used_bytes, Some(512 * 1024 * 1024));
        assert_eq!(
            read_page(&page(0, 1, 0)).sleep,
            Some(EngineSleep::Asleep(SleepLevel::One))
        );
        assert_eq!(
            read_page(&page(0, 0, 1)).sleep,
            Some(EngineSleep::Asleep(SleepLevel::Two))
        );
        let bare = read_page("vllm:num_requests_running 0\n");
        assert_eq!(
            (bare.sleep, bare.in_flight, bare.gpu_used_bytes),
            (None, Some(0.0), None)
        );
    }
}
