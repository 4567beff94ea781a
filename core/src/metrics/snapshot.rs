//! The typed vLLM snapshot: the families Tessera decides on, per `(model_name, engine)` series and aggregated.
//!
//! Samples are matched by their *sample* name (not the `# TYPE` line), so a page without TYPE lines or with
//! families in an unusual order still reads. Both generations of vLLM names are accepted; where a series has
//! both (an upgrade in progress, or the mixed test page), the newer name wins for that series:
//!
//! | field | current name | older name |
//! |---|---|---|
//! | `kv_cache_usage` | `vllm:kv_cache_usage_perc` | `vllm:gpu_cache_usage_perc` (deprecated 0.9.2, removed 0.12) |
//! | `prefix_cache_queries_total` / `_hits_total` | `vllm:prefix_cache_queries_total` / `_hits_total` | `vllm:gpu_prefix_cache_queries_total` / `_hits_total` |
//! | `inter_token_latency` | `vllm:inter_token_latency_seconds` | `vllm:time_per_output_token_seconds` |
//!
//! Non-finite values (`NaN`, `±Inf`) of gauges and counters are treated as *absent*: a `NaN` KV usage says
//! "unknown", and unknown must never read as zero (zero usage would let the recommendation shrink memory).
//! Out-of-range values are absent too: a negative count or gauge, or a KV usage outside `[0, 1]`, is a broken
//! exporter (or a hostile page), not a measurement; a negative KV usage read as real would shrink memory.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::MetricsError;
use super::text::{LineError, ParsedPage, Sample, parse_text};

/// One histogram bucket: the count of observations `<= le`, cumulative as Prometheus exposes it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Bucket {
    /// Upper bound, read from the `le` label; the last bucket is `+Inf`.
    #[serde(with = "super::nonfinite")]
    pub le: f64,
    pub cumulative: f64,
}

/// A Prometheus histogram: cumulative buckets sorted by bound, the last one `+Inf`, plus sum and count.
///
/// Always well-formed when built by this module: buckets sorted by `le`, no duplicate bounds, the last
/// bound `+Inf`, and `count` equal to the `+Inf` bucket. `sum` is `NaN` if the page had no `_sum` sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    pub buckets: Vec<Bucket>,
    #[serde(with = "super::nonfinite")]
    pub sum: f64,
    pub count: f64,
}

impl Histogram {
    /// Whether both histograms have exactly the same bucket bounds.
    pub fn same_bounds(&self, other: &Histogram) -> bool {
        self.buckets.len() == other.buckets.len()
            && self.buckets.iter().zip(&other.buckets).all(|(a, b)| a.le == b.le)
    }

    /// Observations between an earlier cumulative scrape and this (later) one.
    ///
    /// Reset-aware: if the count or any bucket went down, or the bounds changed, the server restarted (or was
    /// reconfigured) in between, and everything this histogram holds was observed since — so it is returned
    /// whole, as Prometheus' `increase()` treats a counter reset.
    pub fn delta(&self, earlier: &Histogram) -> Histogram {
        let same_bounds = self.same_bounds(earlier);
        let went_down = self.count < earlier.count
            || (same_bounds
                && self
                    .buckets
                    .iter()
                    .zip(&earlier.buckets)
                    .any(|(a, b)| a.cumulative < b.cumulative));
        if !same_bounds || went_down {
            return self.clone();
        }
        Histogram {
            buckets: self
                .buckets
                .iter()
                .zip(&earlier.buckets)
                .map(|(a, b)| Bucket {
                    le: a.le,
                    cumulative: a.cumulative - b.cumulative,
                })
                .collect(),
            sum: self.sum - earlier.sum,
            count: self.count - earlier.count,
        }
    }

    /// The `q`-quantile (0 ≤ q ≤ 1) with Prometheus `histogram_quantile` semantics: linear interpolation
    /// inside the bucket holding the rank (from 0 for the first bucket when its bound is positive), and the
    /// highest finite bound when the rank falls in the `+Inf` bucket.
    ///
    /// `None` when it is undefined: no observations, `q` outside `[0, 1]` or `NaN`, or no finite bucket.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if !(0.0..=1.0).contains(&q) || self.buckets.len() < 2 {
            return None;
        }
        // Buckets are cumulative, but a broken exporter (or a delta mixing two scrapes) can break that;
        // Prometheus forces monotonicity the same way before interpolating.
        let mut cum: Vec<f64> = Vec::with_capacity(self.buckets.len());
        let mut running_max = 0.0f64;
        for b in &self.buckets {
            running_max = running_max.max(if b.cumulative.is_finite() {
                b.cumulative
            } else {
                0.0
            });
            cum.push(running_max);
        }
        let total = *cum.last()?;
        if total <= 0.0 {
            return None;
        }
        let rank = q * total;
        let idx = cum.iter().position(|&c| c >= rank)?;
        let last = self.buckets.len() - 1;
        if idx == last && self.buckets[last].le.is_infinite() {
            return Some(self.buckets[last - 1].le);
        }
        let upper = self.buckets[idx].le;
        if idx == 0 && upper <= 0.0 {
            return Some(upper);
        }
        let (lower, below) = if idx == 0 {
            (0.0, 0.0)
        } else {
            (self.buckets[idx - 1].le, cum[idx - 1])
        };
        let in_bucket = cum[idx] - below;
        if in_bucket <= 0.0 {
            return Some(upper);
        }
        Some(lower + (upper - lower) * ((rank - below) / in_bucket))
    }

    /// Mean observation (`sum / count`), when both are known and there is at least one observation.
    pub fn mean(&self) -> Option<f64> {
        let m = self.sum / self.count;
        (self.count > 0.0 && m.is_finite()).then_some(m)
    }

    /// The sum of several histograms (e.g. one per engine).
    ///
    /// With identical bounds this is exact. With different bounds the result has the union of the bounds,
    /// and each input contributes, at bound `b`, its cumulative count at its own largest bound `<= b`. That
    /// can only under-count at a bound an input lacks, which moves quantiles *up* — the conservative side for
    /// latency targets.
    pub fn merge<'h>(hists: impl IntoIterator<Item = &'h Histogram>) -> Option<Histogram> {
        let hists: Vec<&Histogram> = hists.into_iter().collect();
        if hists.is_empty() {
            return None;
        }
        let mut bounds: Vec<f64> = hists
            .iter()
            .flat_map(|h| h.buckets.iter().map(|b| b.le))
            .collect();
        bounds.sort_by(f64::total_cmp);
        bounds.dedup();
        let buckets = bounds
            .iter()
            .map(|&le| Bucket {
                le,
                cumulative: hists
                    .iter()
                    .map(|h| {
                        h.buckets
                            .iter()
                            .take_while(|b| b.le <= le)
                            .last()
                            .map_or(0.0, |b| b.cumulative)
                    })
                    .sum(),
            })
            .collect();
        Some(Histogram {
            buckets,
            sum: hists.iter().map(|h| h.sum).sum(),
            count: hists.iter().map(|h| h.count).sum(),
        })
    }
}

/// The vLLM values of one series: one `(model_name, engine)` pair, or the aggregate of all of them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Series {
    /// KV-cache usage as a 0–1 fraction (vLLM's `_perc` names are fractions despite the name).
    pub kv_cache_usage: Option<f64>,
    pub requests_running: Option<f64>,
    pub requests_waiting: Option<f64>,
    pub preemptions_total: Option<f64>,
    pub prompt_tokens_total: Option<f64>,
    pub generation_tokens_total: Option<f64>,
    pub prefix_cache_queries_total: Option<f64>,
    pub prefix_cache_hits_total: Option<f64>,
    /// `vllm:request_success_total` by its `finished_reason` label (`stop`, `length`, `abort`, …).
    pub request_success_total: BTreeMap<String, f64>,
    pub ttft: Option<Histogram>,
    pub inter_token_latency: Option<Histogram>,
    pub e2e_latency: Option<Histogram>,
    pub queue_time: Option<Histogram>,
    pub prefill_time: Option<Histogram>,
    pub decode_time: Option<Histogram>,
    /// The labels of `vllm:cache_config_info` (`block_size`, `num_gpu_blocks`, `gpu_memory_utilization`, …).
    pub cache_config: BTreeMap<String, String>,
}

/// The values of one `(model_name, engine)` series as found on the page (`None` where the label is absent:
/// V0 servers have no `engine` label, and `vllm:cache_config_info` had no `model_name` before V1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineSeries {
    pub model_name: Option<String>,
    pub engine: Option<String>,
    #[serde(flatten)]
    pub values: Series,
}

/// A typed reading of one vLLM `/metrics` page.
///
/// The top-level fields are the **aggregate** over every `(model_name, engine)` series on the page, which is
/// what the rest of Tessera decides on; [`VllmSnapshot::per_engine`] keeps each series as found. The rule:
/// - counters, the running/waiting gauges, `request_success_total` per reason, and histograms are **summed**
///   across series (histograms with different bounds: see [`Histogram::merge`]);
/// - `kv_cache_usage` is the **maximum** over series: engines have separate KV pools of the same size, and the
///   fullest one is what memory sizing must cover (a mean would hide a saturated engine);
/// - `cache_config` is the first series' map (in `per_engine` order) that has one; engines of one server
///   share the cache config;
/// - `model_names` lists every distinct `model_name` label value seen on the samples read here, sorted.
///
/// A field is `None` (or empty) only when no series has it — never zero for "missing".
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VllmSnapshot {
    pub kv_cache_usage: Option<f64>,
    pub requests_running: Option<f64>,
    pub requests_waiting: Option<f64>,
    pub preemptions_total: Option<f64>,
    pub prompt_tokens_total: Option<f64>,
    pub generation_tokens_total: Option<f64>,
    pub prefix_cache_queries_total: Option<f64>,
    pub prefix_cache_hits_total: Option<f64>,
    pub request_success_total: BTreeMap<String, f64>,
    pub ttft: Option<Histogram>,
    pub inter_token_latency: Option<Histogram>,
    pub e2e_latency: Option<Histogram>,
    pub queue_time: Option<Histogram>,
    pub prefill_time: Option<Histogram>,
    pub decode_time: Option<Histogram>,
    pub cache_config: BTreeMap<String, String>,
    pub model_names: Vec<String>,
    /// Each `(model_name, engine)` series, sorted by model name then engine number.
    pub per_engine: Vec<EngineSeries>,
    /// Lines of the page that could not be parsed and were skipped.
    pub line_errors: Vec<LineError>,
}

impl VllmSnapshot {
    /// Parse a `/metrics` page and read the vLLM families from it.
    ///
    /// Malformed lines are skipped and listed in `line_errors`. Fails only when the page has no `vllm:*`
    /// sample at all (not a vLLM page, or an error page), see [`MetricsError::NoVllmFamilies`].
    pub fn from_text(page: &str) -> Result<VllmSnapshot, MetricsError> {
        Self::from_page(&parse_text(page))
    }

    /// Read the vLLM families from an already parsed page.
    pub fn from_page(page: &ParsedPage<'_>) -> Result<VllmSnapshot, MetricsError> {
        let mut builders: Vec<SeriesBuilder<'_>> = Vec::new();
        let mut vllm_samples = 0usize;
        // Exporters write each series' samples together (all buckets of one label set, then the next), so
        // the series of the previous sample is checked first; the scan below is for the first of a run.
        let mut last = 0usize;
        for family in &page.families {
            if !family.name.starts_with("vllm:") {
                continue;
            }
            for sample in &family.samples {
                let Some(name) = sample.name.strip_prefix("vllm:") else {
                    continue;
                };
                vllm_samples += 1;
                // Decide from the name alone whether the snapshot reads this sample, before paying for
                // its labels: most of a vLLM page is histograms Tessera does not use.
                let Some(field) = Field::of(name) else {
                    continue;
                };
                let key = SeriesKey::of(sample);
                let is_key = |b: &SeriesBuilder<'_>| b.engine == key.engine && b.model_name == key.model_name;
                let idx = if builders.get(last).is_some_and(is_key) {
                    last
                } else if let Some(i) = builders.iter().position(is_key) {
                    i
                } else {
                    builders.push(SeriesBuilder::new(key.model_name.clone(), key.engine.clone()));
                    builders.len() - 1
                };
                last = idx;
                builders[idx].add(field, sample, &key);
            }
        }
        if vllm_samples == 0 {
            return Err(MetricsError::NoVllmFamilies {
                families: page.families.len(),
                line_errors: page.errors.len(),
            });
        }
        let per_engine: Vec<EngineSeries> = builders.into_iter().map(SeriesBuilder::finish).collect();
        let mut per_engine = attach_cache_config(per_engine);
        per_engine.sort_by(|a, b| {
            a.model_name
                .cmp(&b.model_name)
                .then_with(|| engine_order(&a.engine).cmp(&engine_order(&b.engine)))
        });
        let mut model_names: Vec<String> = per_engine.iter().filter_map(|e| e.model_name.clone()).collect();
        model_names.sort();
        model_names.dedup();
        let agg = aggregate(per_engine.iter().map(|e| &e.values));
        Ok(VllmSnapshot {
            kv_cache_usage: agg.kv_cache_usage,
            requests_running: agg.requests_running,
            requests_waiting: agg.requests_waiting,
            preemptions_total: agg.preemptions_total,
            prompt_tokens_total: agg.prompt_tokens_total,
            generation_tokens_total: agg.generation_tokens_total,
            prefix_cache_queries_total: agg.prefix_cache_queries_total,
            prefix_cache_hits_total: agg.prefix_cache_hits_total,
            request_success_total: agg.request_success_total,
            ttft: agg.ttft,
            inter_token_latency: agg.inter_token_latency,
            e2e_latency: agg.e2e_latency,
            queue_time: agg.queue_time,
            prefill_time: agg.prefill_time,
            decode_time: agg.decode_time,
            cache_config: agg.cache_config,
            model_names,
            per_engine,
            line_errors: page.errors.clone(),
        })
    }

    /// The aggregate values as a [`Series`] (the same numbers as the top-level fields).
    pub fn totals(&self) -> Series {
        Series {
            kv_cache_usage: self.kv_cache_usage,
            requests_running: self.requests_running,
            requests_waiting: self.requests_waiting,
            preemptions_total: self.preemptions_total,
            prompt_tokens_total: self.prompt_tokens_total,
            generation_tokens_total: self.generation_tokens_total,
            prefix_cache_queries_total: self.prefix_cache_queries_total,
            prefix_cache_hits_total: self.prefix_cache_hits_total,
            request_success_total: self.request_success_total.clone(),
            ttft: self.ttft.clone(),
            inter_token_latency: self.inter_token_latency.clone(),
            e2e_latency: self.e2e_latency.clone(),
            queue_time: self.queue_time.clone(),
            prefill_time: self.prefill_time.clone(),
            decode_time: self.decode_time.clone(),
            cache_config: self.cache_config.clone(),
        }
    }

    /// Each model's values: its engines' series in [`VllmSnapshot::per_engine`] combined by the same rule as
    /// the top-level fields (KV usage the fullest engine's, the rest summed). Series without a `model_name`
    /// are left out.
    pub fn per_model(&self) -> BTreeMap<String, Series> {
        let mut names: Vec<&str> = self
            .per_engine
            .iter()
            .filter_map(|e| e.model_name.as_deref())
            .collect();
        names.sort_unstable();
        names.dedup();
        names
            .into_iter()
            .map(|m| {
                let engines = self
                    .per_engine
                    .iter()
                    .filter(move |e| e.model_name.as_deref() == Some(m));
                (m.to_string(), aggregate(engines.map(|e| &e.values)))
            })
            .collect()
    }

    /// `vllm:cache_config_info`'s `num_gpu_blocks`, when present and a whole number.
    pub fn num_gpu_blocks(&self) -> Option<u64> {
        self.cache_config.get("num_gpu_blocks")?.trim().parse().ok()
    }

    /// `vllm:cache_config_info`'s `block_size` (tokens per KV block), when present and a whole number.
    pub fn block_size(&self) -> Option<u64> {
        self.cache_config.get("block_size")?.trim().parse().ok()
    }
}

/// `vllm:cache_config_info` carries no `model_name` label (and no `engine` label before V1), so it lands in
/// a series of its own. Give its map to every series of the same engine instead, so each engine's entry is
/// complete; keep it as its own entry only if no such series exists.
fn attach_cache_config(series: Vec<EngineSeries>) -> Vec<EngineSeries> {
    let (orphans, mut rest): (Vec<EngineSeries>, Vec<EngineSeries>) = series.into_iter().partition(|s| {
        s.model_name.is_none()
            && !s.values.cache_config.is_empty()
            && Series {
                cache_config: s.values.cache_config.clone(),
                ..Series::default()
            } == s.values
    });
    for orphan in orphans {
        let mut attached = false;
        for s in rest
            .iter_mut()
            .filter(|s| s.engine == orphan.engine && s.values.cache_config.is_empty())
        {
            s.values.cache_config.clone_from(&orphan.values.cache_config);
            attached = true;
        }
        if !attached {
            rest.push(orphan);
        }
    }
    rest
}

/// Engines sort by number ("2" before "10"), then anything non-numeric by text; absent first.
fn engine_order(e: &Option<String>) -> (u8, u64, &str) {
    match e {
        None => (0, 0, ""),
        Some(s) => match s.parse::<u64>() {
            Ok(n) => (1, n, ""),
            Err(_) => (2, 0, s.as_str()),
        },
    }
}

/// The aggregate rule of [`VllmSnapshot`] over some series (all of a page's, or one model's).
fn aggregate<'a>(series: impl Iterator<Item = &'a Series> + Clone) -> Series {
    let vals = || series.clone();
    let sum = |f: fn(&Series) -> Option<f64>| vals().filter_map(f).reduce(|a, b| a + b);
    let mut request_success_total = BTreeMap::new();
    for s in vals() {
        for (reason, v) in &s.request_success_total {
            *request_success_total.entry(reason.clone()).or_insert(0.0) += v;
        }
    }
    let hist = |f: fn(&Series) -> Option<&Histogram>| Histogram::merge(vals().filter_map(f));
    Series {
        kv_cache_usage: vals().filter_map(|s| s.kv_cache_usage).reduce(f64::max),
        requests_running: sum(|s| s.requests_running),
        requests_waiting: sum(|s| s.requests_waiting),
        preemptions_total: sum(|s| s.preemptions_total),
        prompt_tokens_total: sum(|s| s.prompt_tokens_total),
        generation_tokens_total: sum(|s| s.generation_tokens_total),
        prefix_cache_queries_total: sum(|s| s.prefix_cache_queries_total),
        prefix_cache_hits_total: sum(|s| s.prefix_cache_hits_total),
        request_success_total,
        ttft: hist(|s| s.ttft.as_ref()),
        inter_token_latency: hist(|s| s.inter_token_latency.as_ref()),
        e2e_latency: hist(|s| s.e2e_latency.as_ref()),
        queue_time: hist(|s| s.queue_time.as_ref()),
        prefill_time: hist(|s| s.prefill_time.as_ref()),
        decode_time: hist(|s| s.decode_time.as_ref()),
        cache_config: vals()
            .map(|s| &s.cache_config)
            .find(|m| !m.is_empty())
            .cloned()
            .unwrap_or_default(),
    }
}

/// The labels of a sample that the snapshot cares about, read in one pass.
struct SeriesKey<'a> {
    model_name: Option<Cow<'a, str>>,
    engine: Option<Cow<'a, str>>,
    le: Option<Cow<'a, str>>,
    finished_reason: Option<Cow<'a, str>>,
}

impl<'a> SeriesKey<'a> {
    fn of(sample: &Sample<'a>) -> SeriesKey<'a> {
        let mut k = SeriesKey {
            model_name: None,
            engine: None,
            le: None,
            finished_reason: None,
        };
        for (name, value) in sample.labels() {
            match name {
                "model_name" => k.model_name = Some(value),
                "engine" => k.engine = Some(value),
                "le" => k.le = Some(value),
                "finished_reason" => k.finished_reason = Some(value),
                _ => {}
            }
        }
        k
    }
}

/// A histogram being assembled from `_bucket`, `_sum` and `_count` samples.
#[derive(Default)]
struct HistBuilder {
    buckets: Vec<Bucket>,
    sum: Option<f64>,
    count: Option<f64>,
}

impl HistBuilder {
    fn add(&mut self, part: HistPart, sample: &Sample<'_>, key: &SeriesKey<'_>) {
        let v = sample.value;
        match part {
            HistPart::Bucket => {
                let Some(le) = key.le.as_deref().and_then(|s| s.trim().parse::<f64>().ok()) else {
                    return;
                };
                if le.is_nan() || !v.is_finite() {
                    return;
                }
                // Pages list buckets in increasing order, so the common case is an append. Extra labels
                // beyond model_name/engine (none in vLLM today) fold into the same series.
                match self.buckets.last_mut() {
                    Some(last) if last.le < le => self.buckets.push(Bucket { le, cumulative: v }),
                    None => self.buckets.push(Bucket { le, cumulative: v }),
                    Some(_) => match self.buckets.iter_mut().find(|b| b.le == le) {
                        Some(b) => b.cumulative += v,
                        None => self.buckets.push(Bucket { le, cumulative: v }),
                    },
                }
            }
            HistPart::Sum => self.sum = Some(self.sum.unwrap_or(0.0) + v),
            HistPart::Count if v.is_finite() => self.count = Some(self.count.unwrap_or(0.0) + v),
            HistPart::Count => {}
        }
    }

    /// A well-formed histogram, or `None` when the page had no bucket for it. A missing `+Inf` bucket is
    /// taken from `_count` (or the largest bucket), since every observation is `<= +Inf`.
    fn finish(mut self) -> Option<Histogram> {
        if self.buckets.is_empty() {
            return None;
        }
        self.buckets.sort_by(|a, b| a.le.total_cmp(&b.le));
        let largest = self.buckets.iter().map(|b| b.cumulative).fold(0.0, f64::max);
        if self.buckets.last().is_none_or(|b| b.le != f64::INFINITY) {
            self.buckets.push(Bucket {
                le: f64::INFINITY,
                cumulative: self.count.unwrap_or(largest),
            });
        }
        let count = self.buckets.last().map_or(0.0, |b| b.cumulative);
        Some(Histogram {
            buckets: self.buckets,
            sum: self.sum.unwrap_or(f64::NAN),
            count,
        })
    }
}

/// Which snapshot value a sample feeds, decided from its name (without the `vllm:` prefix).
#[derive(Debug, Clone, Copy)]
enum Field {
    KvNew,
    KvOld,
    Running,
    Waiting,
    Preemptions,
    PromptTokens,
    GenerationTokens,
    PrefixQueriesNew,
    PrefixQueriesOld,
    PrefixHitsNew,
    PrefixHitsOld,
    RequestSuccess,
    CacheConfig,
    Hist(Hist, HistPart),
}

#[derive(Debug, Clone, Copy)]
enum Hist {
    Ttft,
    ItlNew,
    ItlOld,
    E2e,
    Queue,
    Prefill,
    Decode,
}

#[derive(Debug, Clone, Copy)]
enum HistPart {
    Bucket,
    Sum,
    Count,
}

impl Field {
    /// The one list of vLLM names the snapshot reads (see the table in the module docs).
    fn of(name: &str) -> Option<Field> {
        Some(match name {
            "kv_cache_usage_perc" => Field::KvNew,
            "gpu_cache_usage_perc" => Field::KvOld,
            "num_requests_running" => Field::Running,
            "num_requests_waiting" => Field::Waiting,
            "num_preemptions_total" => Field::Preemptions,
            "prompt_tokens_total" => Field::PromptTokens,
            "generation_tokens_total" => Field::GenerationTokens,
            "prefix_cache_queries_total" => Field::PrefixQueriesNew,
            "gpu_prefix_cache_queries_total" => Field::PrefixQueriesOld,
            "prefix_cache_hits_total" => Field::PrefixHitsNew,
            "gpu_prefix_cache_hits_total" => Field::PrefixHitsOld,
            "request_success_total" => Field::RequestSuccess,
            "cache_config_info" => Field::CacheConfig,
            _ => {
                let (base, part) = if let Some(b) = name.strip_suffix("_bucket") {
                    (b, HistPart::Bucket)
                } else if let Some(b) = name.strip_suffix("_sum") {
                    (b, HistPart::Sum)
                } else if let Some(b) = name.strip_suffix("_count") {
                    (b, HistPart::Count)
                } else {
                    return None;
                };
                let which = match base {
                    "time_to_first_token_seconds" => Hist::Ttft,
                    "inter_token_latency_seconds" => Hist::ItlNew,
                    "time_per_output_token_seconds" => Hist::ItlOld,
                    "e2e_request_latency_seconds" => Hist::E2e,
                    "request_queue_time_seconds" => Hist::Queue,
                    "request_prefill_time_seconds" => Hist::Prefill,
                    "request_decode_time_seconds" => Hist::Decode,
                    _ => return None,
                };
                Field::Hist(which, part)
            }
        })
    }
}

struct SeriesBuilder<'a> {
    model_name: Option<Cow<'a, str>>,
    engine: Option<Cow<'a, str>>,
    kv_new: Option<f64>,
    kv_old: Option<f64>,
    running: Option<f64>,
    waiting: Option<f64>,
    preemptions: Option<f64>,
    prompt: Option<f64>,
    generation: Option<f64>,
    prefix_queries_new: Option<f64>,
    prefix_queries_old: Option<f64>,
    prefix_hits_new: Option<f64>,
    prefix_hits_old: Option<f64>,
    success: BTreeMap<String, f64>,
    ttft: HistBuilder,
    itl_new: HistBuilder,
    itl_old: HistBuilder,
    e2e: HistBuilder,
    queue: HistBuilder,
    prefill: HistBuilder,
    decode: HistBuilder,
    cache_config: BTreeMap<String, String>,
}

/// Adds a finite value into a slot (series that differ only in labels we do not key on are summed).
fn add(slot: &mut Option<f64>, v: f64) {
    // Every summed family is a count or a gauge of things: below zero it is not a reading.
    if v.is_finite() && v >= 0.0 {
        *slot = Some(slot.unwrap_or(0.0) + v);
    }
}

/// Keeps the larger value (for usage fractions, where a sum would be meaningless); only a fraction in `[0, 1]`
/// is a reading.
fn max_into(slot: &mut Option<f64>, v: f64) {
    if (0.0..=1.0).contains(&v) {
        *slot = Some(slot.map_or(v, |s| s.max(v)));
    }
}

impl<'a> SeriesBuilder<'a> {
    fn new(model_name: Option<Cow<'a, str>>, engine: Option<Cow<'a, str>>) -> Self {
        SeriesBuilder {
            model_name,
            engine,
            kv_new: None,
            kv_old: None,
            running: None,
            waiting: None,
            preemptions: None,
            prompt: None,
            generation: None,
            prefix_queries_new: None,
            prefix_queries_old: None,
            prefix_hits_new: None,
            prefix_hits_old: None,
            success: BTreeMap::new(),
            ttft: HistBuilder::default(),
            itl_new: HistBuilder::default(),
            itl_old: HistBuilder::default(),
            e2e: HistBuilder::default(),
            queue: HistBuilder::default(),
            prefill: HistBuilder::default(),
            decode: HistBuilder::default(),
            cache_config: BTreeMap::new(),
        }
    }

    fn add(&mut self, field: Field, sample: &Sample<'a>, key: &SeriesKey<'a>) {
        let v = sample.value;
        match field {
            Field::KvNew => max_into(&mut self.kv_new, v),
            Field::KvOld => max_into(&mut self.kv_old, v),
            Field::Running => add(&mut self.running, v),
            Field::Waiting => add(&mut self.waiting, v),
            Field::Preemptions => add(&mut self.preemptions, v),
            Field::PromptTokens => add(&mut self.prompt, v),
            Field::GenerationTokens => add(&mut self.generation, v),
            Field::PrefixQueriesNew => add(&mut self.prefix_queries_new, v),
            Field::PrefixQueriesOld => add(&mut self.prefix_queries_old, v),
            Field::PrefixHitsNew => add(&mut self.prefix_hits_new, v),
            Field::PrefixHitsOld => add(&mut self.prefix_hits_old, v),
            Field::RequestSuccess => {
                if v.is_finite() {
                    let reason = key.finished_reason.as_deref().unwrap_or("unknown");
                    match self.success.get_mut(reason) {
                        Some(slot) => *slot += v,
                        None => {
                            self.success.insert(reason.to_owned(), v);
                        }
                    }
                }
            }
            Field::CacheConfig => {
                for (label, value) in sample.labels() {
                    if label != "model_name" && label != "engine" {
                        self.cache_config.insert(label.to_owned(), value.into_owned());
                    }
                }
            }
            Field::Hist(which, part) => {
                let target = match which {
                    Hist::Ttft => &mut self.ttft,
                    Hist::ItlNew => &mut self.itl_new,
                    Hist::ItlOld => &mut self.itl_old,
                    Hist::E2e => &mut self.e2e,
                    Hist::Queue => &mut self.queue,
                    Hist::Prefill => &mut self.prefill,
                    Hist::Decode => &mut self.decode,
                };
                target.add(part, sample, key);
            }
        }
    }

    fn finish(self) -> EngineSeries {
        let itl_new = self.itl_new.finish();
        let prefer = |new: Option<f64>, old: Option<f64>| new.or(old);
        EngineSeries {
            model_name: self.model_name.map(Cow::into_owned),
            engine: self.engine.map(Cow::into_owned),
            values: Series {
                kv_cache_usage: prefer(self.kv_new, self.kv_old),
                requests_running: self.running,
                requests_waiting: self.waiting,
                preemptions_total: self.preemptions,
                prompt_tokens_total: self.prompt,
                generation_tokens_total: self.generation,
                prefix_cache_queries_total: prefer(self.prefix_queries_new, self.prefix_queries_old),
                prefix_cache_hits_total: prefer(self.prefix_hits_new, self.prefix_hits_old),
                request_success_total: self.success,
                ttft: self.ttft.finish(),
                inter_token_latency: if itl_new.is_some() {
                    itl_new
                } else {
                    self.itl_old.finish()
                },
                e2e_latency: self.e2e.finish(),
                queue_time: self.queue.finish(),
                prefill_time: self.prefill.finish(),
                decode_time: self.decode.finish(),
                cache_config: self.cache_config,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    fn hist(bounds_cum: &[(f64, f64)], sum: f64) -> Histogram {
        Histogram {
            buckets: bounds_cum
                .iter()
                .map(|&(le, cumulative)| Bucket { le, cumulative })
                .collect(),
            sum,
            count: bounds_cum.last().unwrap().1,
        }
    }

    #[test]
    fn quantile_matches_prometheus_histogram_quantile() {
        // 10 observations: 2 in (0,0.1], 6 in (0.1,0.5], 2 in (0.5,1].
        let h = hist(&[(0.1, 2.0), (0.5, 8.0), (1.0, 10.0), (f64::INFINITY, 10.0)], 4.0);
        // rank 5 → bucket (0.1,0.5], 3 of 6 in → 0.1 + 0.4*0.5
        assert!((h.quantile(0.5).unwrap() - 0.3).abs() < 1e-12);
        // rank 1 → first bucket, from 0: 0.1 * 1/2
        assert!((h.quantile(0.1).unwrap() - 0.05).abs() < 1e-12);
        // rank 9.5 → (0.5,1], 1.5 of 2
        assert!((h.quantile(0.95).unwrap() - 0.875).abs() < 1e-12);
        assert_eq!(h.quantile(1.5), None);
        assert_eq!(h.quantile(f64::NAN), None);
        // Observations above the largest finite bound → that bound.
        let h = hist(&[(0.1, 1.0), (f64::INFINITY, 10.0)], 50.0);
        assert_eq!(h.quantile(0.99), Some(0.1));
        // No observations → undefined, not zero.
        let h = hist(&[(0.1, 0.0), (f64::INFINITY, 0.0)], 0.0);
        assert_eq!(h.quantile(0.5), None);
        assert_eq!(h.mean(), None);
    }

    #[test]
    fn delta_subtracts_and_detects_resets() {
        let a = hist(&[(1.0, 2.0), (f64::INFINITY, 3.0)], 4.0);
        let b = hist(&[(1.0, 5.0), (f64::INFINITY, 9.0)], 10.0);
        let d = b.delta(&a);
        assert_eq!(d, hist(&[(1.0, 3.0), (f64::INFINITY, 6.0)], 6.0));
        // Restarted server: later has fewer observations than earlier → everything since the restart.
        let restarted = hist(&[(1.0, 1.0), (f64::INFINITY, 1.0)], 0.5);
        assert_eq!(restarted.delta(&b), restarted);
        // Changed bounds → also the later histogram whole.
        let rebucketed = hist(&[(2.0, 10.0), (f64::INFINITY, 12.0)], 11.0);
        assert_eq!(rebucketed.delta(&b), rebucketed);
    }

    #[test]
    fn merge_with_different_bounds_is_conservative() {
        let a = hist(&[(0.1, 1.0), (0.5, 2.0), (f64::INFINITY, 2.0)], 0.6);
        let b = hist(&[(0.2, 1.0), (f64::INFINITY, 3.0)], 2.0);
        let m = Histogram::merge([&a, &b]).unwrap();
        let got: Vec<(f64, f64)> = m.buckets.iter().map(|b| (b.le, b.cumulative)).collect();
        assert_eq!(
            got,
            vec![(0.1, 1.0), (0.2, 2.0), (0.5, 3.0), (f64::INFINITY, 5.0)]
        );
        assert_eq!(m.count, 5.0);
        assert!(Histogram::merge(std::iter::empty()).is_none());
    }

    #[test]
    fn histogram_json_round_trips_inf_bound() {
        let h = hist(&[(0.1, 1.0), (f64::INFINITY, 2.0)], 0.3);
        let json = serde_json::to_string(&h).unwrap();
        assert!(json.contains("\"+Inf\""), "{json}");
        let back: Histogram = serde_json::from_str(&json).unwrap();
        assert_eq!(back, h);
    }

    #[test]
    fn non_vllm_page_is_refused_with_a_reason() {
        let err = VllmSnapshot::from_text("process_cpu_seconds_total 1\n<html>oops</html>\n").unwrap_err();
        assert_eq!(
            err,
            MetricsError::NoVllmFamilies {
                families: 1,
                line_errors: 1
            }
        );
        assert_eq!(err.label(), "no_vllm_families");
        assert!(err.to_string().contains("vLLM server's /metrics"));
        assert!(VllmSnapshot::from_text("").is_err());
    }

    #[test]
    fn nan_gauge_is_absent_not_zero() {
        let s = VllmSnapshot::from_text(
            "vllm:kv_cache_usage_perc{engine=\"0\"} NaN\nvllm:num_requests_waiting 2\n",
        )
        .unwrap();
        assert_eq!(s.kv_cache_usage, None);
        assert_eq!(s.requests_waiting, Some(2.0));
    }

    #[test]
    fn out_of_range_values_are_absent_not_readings() {
        for kv in ["-0.5", "1.5", "-1e9"] {
            let s = VllmSnapshot::from_text(&format!(
                "vllm:kv_cache_usage_perc{{engine=\"0\"}} {kv}\nvllm:num_requests_waiting -3\nvllm:num_requests_running 1\n"
            ))
            .unwrap();
            assert_eq!(s.kv_cache_usage, None, "KV usage {kv}");
            assert_eq!(s.requests_waiting, None, "a negative queue");
            assert_eq!(s.requests_running, Some(1.0));
        }
        // The bounds themselves are readings.
        let s = VllmSnapshot::from_text("vllm:kv_cache_usage_perc 1\n").unwrap();
        assert_eq!(s.kv_cache_usage, Some(1.0));
    }

    fn arb_hist() -> impl Strategy<Value = Histogram> {
        proptest::collection::vec((0.001f64..100.0, 0u32..1000), 1..8).prop_map(|mut v| {
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            v.dedup_by(|a, b| a.0 == b.0);
            let mut cum = 0.0;
            let mut buckets: Vec<Bucket> = v
                .into_iter()
                .map(|(le, n)| {
                    cum += f64::from(n);
                    Bucket { le, cumulative: cum }
                })
                .collect();
            buckets.push(Bucket {
                le: f64::INFINITY,
                cumulative: cum,
            });
            Histogram {
                buckets,
                sum: cum,
                count: cum,
            }
        })
    }

    proptest! {
        /// Quantiles are monotone in q and stay within [0, largest finite bound].
        #[test]
        fn quantiles_are_monotone_and_bounded(h in arb_hist(), q1 in 0.0f64..=1.0, q2 in 0.0f64..=1.0) {
            let (lo, hi) = if q1 <= q2 { (q1, q2) } else { (q2, q1) };
            let max_finite = h.buckets[h.buckets.len() - 2].le;
            match (h.quantile(lo), h.quantile(hi)) {
                (Some(a), Some(b)) => {
                    prop_assert!(a <= b + 1e-9, "q({lo})={a} > q({hi})={b}");
                    prop_assert!(a >= 0.0 && b <= max_finite + 1e-9);
                }
                (None, None) => prop_assert_eq!(h.count, 0.0),
                other => prop_assert!(false, "inconsistent {:?}", other),
            }
        }

        /// later.delta(earlier) after adding observations gives exactly the added observations.
        #[test]
        fn delta_recovers_added_observations(a in arb_hist(), extra in proptest::collection::vec(0u32..50, 8)) {
            let mut b = a.clone();
            let mut add = 0.0;
            for (i, bucket) in b.buckets.iter_mut().enumerate() {
                add += f64::from(extra[i.min(extra.len() - 1)]);
                bucket.cumulative += add;
            }
            b.count = b.buckets.last().unwrap().cumulative;
            b.sum += add;
            let d = b.delta(&a);
            prop_assert!(d.buckets.iter().all(|x| x.cumulative >= 0.0));
            prop_assert_eq!(d.count, b.count - a.count);
            prop_assert_eq!(d.buckets.len(), a.buckets.len());
        }

        /// Merging never loses observations, and merging one histogram gives it back.
        #[test]
        fn merge_preserves_counts(a in arb_hist(), b in arb_hist()) {
            let m = Histogram::merge([&a, &b]).unwrap();
            prop_assert_eq!(m.count, a.count + b.count);
            prop_assert_eq!(m.buckets.last().unwrap().cumulative, a.count + b.count);
            prop_assert!(m.buckets.windows(2).all(|w| w[0].le < w[1].le && w[0].cumulative <= w[1].cumulative));
            prop_assert_eq!(Histogram::merge([&a]).unwrap(), a);
        }
    }
}
