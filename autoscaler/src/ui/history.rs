//! The page's over-time charts: a bounded, in-memory history of what the controller already reads, one point per
//! minute for 24 hours, for the overview, each model and each GPU. Nothing is persisted: a restart (or a new
//! leader) starts afresh, and the page says since when it has history.
//!
//! Bounds: [`POINTS`] points per series (a later point in the same minute replaces the earlier one), series not
//! updated for [`POINTS`] minutes are dropped, and at most [`MAX_SERIES`] model and GPU series are kept (the least
//! recently updated go first). Points are `f32`: a chart needs no more. The memory cost is in
//! `docs/performance.md`.

use std::collections::{HashMap, VecDeque};

use super::view::View;

/// Points per series: 24 h at one a minute.
pub const POINTS: usize = 24 * 60;
/// Most model or GPU series kept (each).
pub const MAX_SERIES: usize = 500;

const MINUTE_MS: u64 = 60_000;

/// One minute of the overview.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct OverviewPoint {
    /// GPUs held.
    pub gpus_held: f32,
    /// GPUs needed when packed.
    pub gpus_needed: f32,
    /// Memory reserved, GiB.
    pub memory_reserved_gib: f32,
    /// Memory the recommendations ask for, GiB.
    pub memory_needed_gib: f32,
    /// Compute allocated, GPUs.
    pub compute_allocated: f32,
    /// Compute recommended, GPUs.
    pub compute_needed: f32,
}

/// One minute of a model.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ModelPoint {
    /// Replicas.
    pub replicas: f32,
    /// KV cache usage, 0–1 (NaN when unknown).
    pub kv_cache_usage: f32,
    /// Waiting requests (NaN when unknown).
    pub waiting: f32,
    /// Requests per second (NaN when unknown).
    pub requests_per_second: f32,
    /// TTFT p95, seconds (NaN when unknown).
    pub ttft_p95: f32,
    /// Recommended GPU memory per replica, MiB (NaN when none).
    pub recommended_memory_mib: f32,
}

/// One minute of a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct GpuPoint {
    /// Reserved compute (the tenants' caps), in GPUs: above 1 where the pool oversubscribes MPS caps.
    pub compute_reserved: f32,
    /// Reserved memory, MiB.
    pub memory_reserved_mib: f32,
    /// Measured memory, MiB (NaN when unmeasured).
    pub memory_measured_mib: f32,
    /// Measured SM utilization, 0–1 (NaN when unmeasured).
    pub sm: f32,
}

/// One series: `(minute since the epoch, point)`, oldest first.
#[derive(Debug, Clone, PartialEq)]
pub struct Series<P> {
    points: VecDeque<(u32, P)>,
}

impl<P> Default for Series<P> {
    fn default() -> Self {
        Self {
            points: VecDeque::new(),
        }
    }
}

impl<P: Copy> Series<P> {
    fn push(&mut self, minute: u32, p: P) {
        // Grow by doubling but never past a day's points, so a full series costs POINTS points, not 2048.
        if self.points.len() == self.points.capacity() && self.points.capacity() < POINTS {
            let want = (self.points.capacity() * 2).clamp(16, POINTS);
            self.points.reserve_exact(want - self.points.len());
        }
        match self.points.back_mut() {
            Some((m, last)) if *m == minute => *last = p,
            // A clock that went back: keep the series ordered by dropping what is now "in the future".
            Some((m, _)) if *m > minute => {
                while self.points.back().is_some_and(|(m, _)| *m >= minute) {
                    self.points.pop_back();
                }
                self.points.push_back((minute, p));
            }
            _ => {
                // Make room first: pushing onto a full deque would grow it past a day.
                if self.points.len() >= POINTS {
                    self.points.pop_front();
                }
                self.points.push_back((minute, p));
            }
        }
        let oldest = minute.saturating_sub(POINTS as u32 - 1);
        while self.points.len() > POINTS || self.points.front().is_some_and(|(m, _)| *m < oldest) {
            self.points.pop_front();
        }
    }

    /// The points, oldest first.
    pub fn points(&self) -> impl Iterator<Item = &(u32, P)> {
        self.points.iter()
    }

    /// Number of points.
    pub fn len(&self) -> usize {
        self.points.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    fn last_minute(&self) -> Option<u32> {
        self.points.back().map(|(m, _)| *m)
    }
}

/// The whole history.
#[derive(Debug, Clone, Default)]
pub struct History {
    /// The overview.
    pub overview: Series<OverviewPoint>,
    /// By model key (`namespace/name`).
    pub models: HashMap<String, Series<ModelPoint>>,
    /// By `pool/capacity pod`.
    pub gpus: HashMap<String, Series<GpuPoint>>,
}

fn opt(v: Option<f64>) -> f32 {
    v.map_or(f32::NAN, |x| x as f32)
}

fn bound<P: Copy>(map: &mut HashMap<String, Series<P>>, minute: u32) {
    let oldest = minute.saturating_sub(POINTS as u32 - 1);
    map.retain(|_, s| s.last_minute().is_some_and(|m| m >= oldest));
    if map.len() > MAX_SERIES {
        let mut by_age: Vec<(u32, String)> = map
            .iter()
            .map(|(k, s)| (s.last_minute().unwrap_or(0), k.clone()))
            .collect();
        by_age.sort();
        for (_, k) in by_age.into_iter().take(map.len() - MAX_SERIES) {
            map.remove(&k);
        }
    }
}

impl History {
    /// Records the view's numbers in the minute of `view.at_ms`.
    pub fn record(&mut self, view: &View) {
        let minute = u32::try_from(view.at_ms / MINUTE_MS).unwrap_or(u32::MAX);
        let o = &view.overview;
        let gib = |mib: u64| mib as f32 / 1024.0;
        self.overview.push(
            minute,
            OverviewPoint {
                gpus_held: o.gpus_held as f32,
                gpus_needed: o.gpus_needed as f32,
                memory_reserved_gib: gib(o.memory_reserved_mib),
                memory_needed_gib: gib(o.memory_needed_mib),
                compute_allocated: o.compute_allocated as f32,
                compute_needed: o.compute_needed as f32,
            },
        );
        for row in &view.models {
            let m = &row.model;
            self.models.entry(m.key()).or_default().push(
                minute,
                ModelPoint {
                    replicas: m.replicas.current as f32,
                    kv_cache_usage: opt(m.signals.kv_cache_usage),
                    waiting: opt(m.signals.waiting),
                    requests_per_second: opt(m.signals.requests_per_second),
                    ttft_p95: opt(m.signals.ttft_p95),
                    recommended_memory_mib: row.recommended_memory_mib.map_or(f32::NAN, |v| v as f32),
                },
            );
        }
        for row in &view.gpus {
            let g = &row.gpu;
            let measured: Vec<u64> = g.tenants.iter().filter_map(|t| t.measured_memory_mib).collect();
            let sm: Vec<f64> = g.tenants.iter().filter_map(|t| t.measured_sm).collect();
            self.gpus
                .entry(format!("{}/{}", g.pool, g.capacity_pod))
                .or_default()
                .push(
                    minute,
                    GpuPoint {
                        compute_reserved: g.compute_milli.saturating_sub(row.free_compute_milli) as f32
                            / 1000.0,
                        memory_reserved_mib: g.memory_mib.saturating_sub(row.free_memory_mib) as f32,
                        memory_measured_mib: if measured.is_empty() {
                            f32::NAN
                        } else {
                            measured.iter().sum::<u64>() as f32
                        },
                        sm: if sm.is_empty() {
                            f32::NAN
                        } else {
                            sm.iter().sum::<f64>() as f32
                        },
                    },
                );
        }
        bound(&mut self.models, minute);
        bound(&mut self.gpus, minute);
    }

    /// Approximate heap bytes held (points only), for the documentation's arithmetic and a test.
    pub fn approx_bytes(&self) -> usize {
        fn series<P>(s: &Series<P>) -> usize {
            s.points.capacity() * std::mem::size_of::<(u32, P)>()
        }
        series(&self.overview)
            + self
                .models
                .iter()
                .map(|(k, s)| k.capacity() + series(s))
                .sum::<usize>()
            + self
                .gpus
                .iter()
                .map(|(k, s)| k.capacity() + series(s))
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ui::view::{ModelObservation, Replicas, Settings, Snapshot, view};

    fn snapshot(at_ms: u64, replicas: u32) -> View {
        view(
            &Snapshot {
                at_ms,
                models: vec![ModelObservation {
                    namespace: "ml".into(),
                    name: "chat".into(),
                    replicas: Replicas {
                        current: replicas,
                        ..Replicas::default()
                    },
                    ..ModelObservation::default()
                }],
                ..Snapshot::default()
            },
            &Settings::default(),
        )
    }

    #[test]
    fn one_point_a_minute_for_24_hours_and_no_more() {
        let mut h = History::default();
        let start = 1_800_000_000_000;
        h.record(&snapshot(start, 1));
        h.record(&snapshot(start + 10_000, 2));
        assert_eq!(h.overview.len(), 1, "the same minute replaces its point");
        assert_eq!(
            h.models["ml/chat"].points().next().map(|p| p.1.replicas),
            Some(2.0)
        );
        for i in 1..(POINTS as u64 + 100) {
            h.record(&snapshot(start + i * MINUTE_MS, 1));
        }
        assert_eq!(h.overview.len(), POINTS);
        assert_eq!(h.models["ml/chat"].len(), POINTS);
        // 24 h of one model stays within its documented cost (docs/performance.md: ~40 KB a series).
        assert!(h.approx_bytes() < 2 * 48 * 1024, "{}", h.approx_bytes());
    }

    #[test]
    fn series_not_updated_for_a_day_are_dropped() {
        let mut h = History::default();
        let start = 1_800_000_000_000;
        h.record(&snapshot(start, 1));
        let later = View {
            models: Vec::new(),
            ..snapshot(start + POINTS as u64 * MINUTE_MS, 1)
        };
        h.record(&later);
        assert!(h.models.is_empty());
    }
}
