//! The sidecar's own `/metrics`, one `prometheus-client` registry updated after every scrape attempt.
//!
//! Gauges mirror the state; series whose value is unknown are removed rather than set to 0, so a dashboard
//! shows a gap, not a false "idle". `tessera_preemptions_total` is a real counter: it advances by vLLM's
//! counter delta (restarts handled), so it never goes backwards even when vLLM restarts.

use crate::error::SCRAPE_ERROR_LABELS;
use crate::state::State;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use tessera_runtime::metrics::register;

type Labels = Vec<(&'static str, String)>;
type FGauge = Gauge<f64, AtomicU64>;

/// The registry and handles to its metrics.
#[derive(Debug)]
pub struct Exporter {
    registry: Registry,
    kv_usage: Family<Labels, FGauge>,
    waiting: Family<Labels, FGauge>,
    running: Family<Labels, FGauge>,
    ttft: Family<Labels, FGauge>,
    itl: Family<Labels, FGauge>,
    compute_share: FGauge,
    preemptions: Family<Labels, Counter<f64, AtomicU64>>,
    last_preemptions: std::collections::BTreeMap<String, f64>,
    // Families with no labels, so that "no recommendation yet" can remove the series (a plain gauge always renders).
    rec_util: Family<Labels, FGauge>,
    rec_kv: Family<Labels, FGauge>,
    rec_mib: Family<Labels, FGauge>,
    rec_compute: Family<Labels, FGauge>,
    scrape_errors: Family<Labels, Counter>,
    vllm_up: FGauge,
    stale: FGauge,
    window_samples: FGauge,
}

impl Default for Exporter {
    fn default() -> Self {
        Self::new()
    }
}

impl Exporter {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let kv_usage = register(
            &mut registry,
            "tessera_kv_cache_usage_ratio",
            "vLLM KV cache usage, 0-1 (the fullest engine of each model)",
        );
        let waiting = register(
            &mut registry,
            "tessera_requests_waiting",
            "Requests waiting in vLLM",
        );
        let running = register(
            &mut registry,
            "tessera_requests_running",
            "Requests running in vLLM",
        );
        let ttft = register(
            &mut registry,
            "tessera_ttft_seconds",
            "Time to first token over the window, from the difference of vLLM's cumulative histograms",
        );
        let itl = register(
            &mut registry,
            "tessera_inter_token_latency_seconds",
            "Inter-token latency over the window, from the difference of vLLM's cumulative histograms",
        );
        let compute_share = register(
            &mut registry,
            "tessera_gpu_compute_fraction",
            "The GPU compute share this server runs with (--gpu-compute-fraction), 0-1",
        );
        let preemptions = register(
            &mut registry,
            "tessera_preemptions",
            "vLLM preemptions seen by this sidecar",
        );
        let rec_util = register(
            &mut registry,
            "tessera_recommended_gpu_memory_utilization",
            "Recommended --gpu-memory-utilization",
        );
        let rec_kv = register(
            &mut registry,
            "tessera_recommended_kv_cache_memory_bytes",
            "Recommended --kv-cache-memory-bytes",
        );
        let rec_mib = register(
            &mut registry,
            "tessera_recommended_gpu_memory_mib",
            "Recommended GPU memory for the pod (tessera.dev/gpu-memory), MiB",
        );
        let rec_compute = register(
            &mut registry,
            "tessera_recommended_gpu_compute_fraction",
            "Recommended GPU compute fraction (tessera.dev/gpu-compute-fraction), 0-1",
        );
        let scrape_errors: Family<Labels, Counter> = register(
            &mut registry,
            "tessera_scrape_errors",
            "Failed scrapes of vLLM /metrics, by reason",
        );
        let vllm_up = register(
            &mut registry,
            "tessera_vllm_up",
            "1 when the last scrape of vLLM /metrics succeeded, else 0",
        );
        let stale = register(
            &mut registry,
            "tessera_stale",
            "1 when the values shown are from an earlier scrape than the last",
        );
        let window_samples = register(
            &mut registry,
            "tessera_window_samples",
            "Good scrapes in the recommendation window",
        );
        for reason in SCRAPE_ERROR_LABELS {
            let _ = scrape_errors.get_or_create(&vec![("reason", reason.to_string())]);
        }
        Self {
            registry,
            kv_usage,
            waiting,
            running,
            ttft,
            itl,
            compute_share,
            preemptions,
            last_preemptions: Default::default(),
            rec_util,
            rec_kv,
            rec_mib,
            rec_compute,
            scrape_errors,
            vllm_up,
            stale,
            window_samples,
        }
    }

    /// Counts one failed scrape.
    pub fn count_error(&self, reason: &'static str) {
        self.scrape_errors
            .get_or_create(&vec![("reason", reason.to_string())])
            .inc();
    }

    /// Brings every gauge in line with `state`.
    pub fn update(&mut self, state: &State) {
        let up = state.vllm_up();
        self.vllm_up.set(if up { 1.0 } else { 0.0 });
        self.stale.set(if up { 0.0 } else { 1.0 });
        let per_model = state.per_model();
        for f in [&self.kv_usage, &self.waiting, &self.running] {
            f.clear();
        }
        for (model, v) in &per_model {
            let l = vec![("model_name", model.clone())];
            let set = |f: &Family<Labels, FGauge>, v: Option<f64>| {
                if let Some(v) = v.filter(|v| v.is_finite()) {
                    f.get_or_create(&l).set(v);
                }
            };
            set(&self.kv_usage, v.kv_cache_usage);
            set(&self.waiting, v.requests_waiting);
            set(&self.running, v.requests_running);
            if let Some(now) = v.preemptions_total.filter(|p| p.is_finite() && *p >= 0.0) {
                let c = self.preemptions.get_or_create(&l);
                // First sight of a model: start at vLLM's value so the counter matches vLLM's total.
                let delta = match self.last_preemptions.get(model) {
                    Some(prev) => tessera_core::metrics::counter_delta(now, *prev),
                    None => now,
                };
                if delta.is_finite() && delta > 0.0 {
                    c.inc_by(delta);
                }
                self.last_preemptions.insert(model.clone(), now);
            }
        }
        // A model that left a page vLLM did answer (its `model_name` changed, or it was unloaded) takes its
        // counter with it: the series would otherwise live for ever, one per name the server ever had. A failed
        // scrape prunes nothing (a gap, not a reset).
        if up {
            let gone: Vec<String> = self
                .last_preemptions
                .keys()
                .filter(|m| !per_model.contains_key(*m))
                .cloned()
                .collect();
            for model in gone {
                self.preemptions.remove(&vec![("model_name", model.clone())]);
                self.last_preemptions.remove(&model);
            }
        }
        self.ttft.clear();
        self.itl.clear();
        if let Some((_, _, w)) = state.window_summary() {
            for (family, q) in [(&self.ttft, w.ttft), (&self.itl, w.inter_token_latency)] {
                let Some(q) = q else { continue };
                for (label, v) in [("0.5", q.p50), ("0.95", q.p95), ("0.99", q.p99)] {
                    if v.is_finite() {
                        family
                            .get_or_create(&vec![("quantile", label.to_string())])
                            .set(v);
                    }
                }
            }
        }
        self.compute_share.set(state.compute_share());
        self.window_samples.set(state.window_len() as f64);
        // No recommendation yet: no series at all (as for every unknown value here); 0 would read as "needs
        // nothing", and NaN breaks alert rules that compare against it.
        for g in [&self.rec_util, &self.rec_kv, &self.rec_mib, &self.rec_compute] {
            g.clear();
        }
        if let Some(r) = state.outcome().recommendation() {
            let none: Labels = Vec::new();
            self.rec_util.get_or_create(&none).set(r.gpu_memory_utilization);
            self.rec_kv
                .get_or_create(&none)
                .set(r.kv_cache_memory_bytes as f64);
            self.rec_mib.get_or_create(&none).set(r.gpu_memory_mib as f64);
            self.rec_compute.get_or_create(&none).set(r.compute_fraction);
        }
    }

    /// The registry in the Prometheus/OpenMetrics text format.
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::with_capacity(4096);
        encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::state::tests::settings;
    use tessera_core::metrics::snapshot::VllmSnapshot;

    fn page(model: &str, preemptions: u32) -> VllmSnapshot {
        VllmSnapshot::from_text(&format!(
            "vllm:num_preemptions_total{{model_name=\"{model}\"}} {preemptions}\nvllm:num_requests_waiting{{model_name=\"{model}\"}} 0\n"
        ))
        .unwrap()
    }

    /// vLLM restarted under another `--served-model-name`: the old name's counter goes, it does not pile up one
    /// series per name the server ever had. A failed scrape in between prunes nothing.
    #[test]
    fn a_model_that_left_the_page_takes_its_preemption_series_with_it() {
        let mut st = State::new(settings());
        let mut ex = Exporter::new();
        st.record_success(1.0, page("old-name", 3));
        ex.update(&st);
        assert!(ex.render().unwrap().contains("model_name=\"old-name\""));
        st.record_failure(
            2.0,
            &crate::error::ScrapeError::HttpStatus {
                url: "u".into(),
                status: 503,
            },
        );
        ex.update(&st);
        st.record_success(3.0, page("new-name", 1));
        ex.update(&st);
        let text = ex.render().unwrap();
        assert!(!text.contains("old-name"), "{text}");
        assert!(
            text.contains("tessera_preemptions_total{model_name=\"new-name\"} 1"),
            "{text}"
        );
    }
}
