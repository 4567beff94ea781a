//! From what the controller reads (each replica's sidecar `/v1/status`) to one [`ModelObservation`]. The
//! controller's reconcile and the `--no-kube` local mode call the same function, so the page reads the same in
//! both.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use tessera_core::recommend::{Outcome, largest_need};

use tessera_core::wire::sidecar::{GpuAgentStatus, GpuDeviceUse, SidecarStatus};
use tessera_core::workload::{ClassInput, Classified, classify};

use super::view::{GpuObservation, ModelObservation, Replicas, RunningWith, Signals, TenantObservation};

const MIB: u64 = 1 << 20;

/// A replica's documents count when the sidecar says its snapshot is current and vLLM is up.
fn fresh(s: &SidecarStatus) -> bool {
    s.vllm_up && !s.stale && s.latest.is_some()
}

fn sum(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    values
        .flatten()
        .filter(|v| v.is_finite())
        .fold(None, |acc, v| Some(acc.unwrap_or(0.0) + v))
}

fn mean(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let v: Vec<f64> = values.flatten().filter(|v| v.is_finite()).collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

fn max(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    values
        .flatten()
        .filter(|v| v.is_finite())
        .fold(None, |acc: Option<f64>, v| Some(acc.map_or(v, |a| a.max(v))))
}

/// A `cache_config_info` value that is a number (vLLM writes `"None"` for unset ones).
fn config_number(s: &SidecarStatus, key: &str) -> Option<f64> {
    s.latest
        .as_ref()?
        .cache_config
        .get(key)?
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v > 0.0)
}

/// One model from its replicas' sidecar documents (those that answered). Replica counts and policy fields are
/// the caller's; this fills signals, recommendation, what the pods run with, and the GPU.
pub fn model_from_sidecars(
    namespace: &str,
    name: &str,
    replicas: Replicas,
    docs: &[SidecarStatus],
) -> ModelObservation {
    let live: Vec<&SidecarStatus> = docs.iter().filter(|s| fresh(s)).collect();
    let latest = || live.iter().filter_map(|s| s.latest.as_ref());
    let window = || live.iter().filter_map(|s| s.window.as_ref());
    let signals = Signals {
        kv_cache_usage: mean(latest().map(|l| l.kv_cache_usage_ratio)),
        waiting: sum(latest().map(|l| l.requests_waiting)),
        running: sum(latest().map(|l| l.requests_running)),
        requests_per_second: sum(window().map(|w| w.requests_per_second)),
        generation_tokens_per_second: sum(window().map(|w| w.generation_tokens_per_second)),
        ttft_p95: max(window().map(|w| w.ttft_seconds.p95)),
        itl_p95: max(window().map(|w| w.inter_token_latency_seconds.p95)),
        ttft_slo: max(live.iter().map(|s| s.compute.and_then(|c| c.ttft_slo_secs))),
        itl_slo: max(live.iter().map(|s| s.compute.and_then(|c| c.itl_slo_secs))),
        preemptions: sum(window().map(|w| w.preemptions)),
        prefix_cache_hit_ratio: mean(window().map(|w| w.prefix_cache_hit_ratio)),
        prefill_p50: max(window().map(|w| w.prefill_time_seconds.p50)),
        prefill_p95: max(window().map(|w| w.prefill_time_seconds.p95)),
        decode_p50: max(window().map(|w| w.decode_time_seconds.p50)),
        decode_p95: max(window().map(|w| w.decode_time_seconds.p95)),
        active_ratio: max(window().map(|w| w.active_ratio)),
    };
    let recommendation = largest_need(live.iter().filter_map(|s| s.recommendation()));
    let no_recommendation_reason = if recommendation.is_some() {
        None
    } else {
        docs.iter()
            .find_map(|s| match &s.recommendation.outcome {
                Outcome::NotYet { reason, .. } => Some(reason.clone()),
                Outcome::Ready(_) => None,
            })
            .or_else(|| Some("no replica has reported fresh data".to_owned()))
    };
    let running = RunningWith {
        gpu_memory_utilization: max(live.iter().map(|s| config_number(s, "gpu_memory_utilization"))),
        kv_cache_memory_bytes: max(live.iter().map(|s| config_number(s, "kv_cache_memory_bytes")))
            .map(|v| v as u64),
        compute_share: max(live.iter().map(|s| s.compute.map(|c| c.current_share))),
    };
    let gpus = || docs.iter().filter_map(|s| s.gpu.as_ref());
    let measured: Vec<u64> = gpus().filter_map(|g| g.used_bytes).collect();
    ModelObservation {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        target: String::new(),
        replicas,
        reporting: u32::try_from(live.len()).unwrap_or(u32::MAX),
        signals,
        leading_signal: None,
        constraint: None,
        recommendation,
        no_recommendation_reason,
        running,
        gpu_memory_mib: gpus().map(|g| g.total_bytes / MIB).max(),
        measured_memory_mib: (!measured.is_empty()).then(|| measured.iter().sum::<u64>() / MIB),
        measured_sm: mean(gpus().map(|g| g.sm_utilization)),
        workload_class: Some(classify(&class_input(&signals, None))),
        ..ModelObservation::default()
    }
}

/// The workload class's input from a model's signals where no round runs; `ttft_objective_secs` is the policy's
/// when it has one (else the sidecars' `--ttft-slo`).
fn class_input(signals: &Signals, ttft_objective_secs: Option<f64>) -> ClassInput {
    ClassInput {
        active_ratio: signals.active_ratio,
        ttft_objective_secs: ttft_objective_secs.or(signals.ttft_slo),
        itl_objective_secs: signals.itl_slo,
    }
}

/// One model as a reconcile saw it: its sidecars' documents, the policy, and the decision just taken.
// Each argument is one thing the reconcile already holds; a struct for them would only be built to be taken apart.
#[allow(clippy::too_many_arguments)]
pub fn model_from_reconcile(
    obj: &crate::crd::InferenceAutoscaler,
    policy: &tessera_core::scale::ScalePolicy,
    docs: &[SidecarStatus],
    decision: &tessera_core::scale::ScaleDecision,
    constraint: tessera_core::scale::constraint::Constraint,
    ready: u32,
    class: Option<&tessera_core::class::ClassRound>,
    at_ms: u64,
) -> ModelObservation {
    use kube::ResourceExt as _;
    let replicas = Replicas {
        current: decision.current_replicas,
        ready,
        desired: decision.desired_replicas,
        min: Some(policy.min_replicas),
        max: Some(policy.max_replicas),
    };
    let ns = obj.namespace().unwrap_or_default();
    let mut m = model_from_sidecars(&ns, &obj.name_any(), replicas, docs);
    // The policy's TTFT objective (its target, else its SLO guard) is the one the model is held to.
    let objective = policy
        .targets
        .ttft_p95
        .or(policy.ttft_slo)
        .map(|d| d.as_secs_f64());
    // The round's class when it took one (the controller's always does); the objectives alone otherwise.
    m.workload_class = Some(match class {
        Some(c) => Classified::of_round(c),
        None => classify(&class_input(&m.signals, objective)),
    });
    let target = &obj.spec.scale_target_ref;
    m.target = format!("{}/{}", target.kind, target.name);
    m.leading_signal = decision.leading_signal.map(|s| s.field().to_owned());
    m.constraint = Some(constraint.label().to_owned());
    if let Some(gpu) = &obj.spec.gpu {
        m.sharing = match gpu.sharing {
            crate::crd::Sharing::Whole => super::view::Sharing::Whole,
            crate::crd::Sharing::Fractional => super::view::Sharing::Fractional,
        };
        m.update_mode = serde_json::to_value(gpu.update_mode)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned));
    } else {
        m.update_mode = Some("Off".to_owned());
    }
    m.decisions = vec![super::view::DecisionNote {
        at_ms,
        from: decision.current_replicas,
        to: decision.desired_replicas,
        reason: decision.reason.label().to_owned(),
        message: decision.message.clone(),
    }];
    m
}

/// The page's rows for one fractional pool, from the pool manager's index: one per capacity pod that is not gone,
/// each tenant named by its pod where the pod is known (else by its reservation id, while it is being admitted).
/// `shape`: the pool's GPU memory and the compute each GPU hands out. `agents`: each capacity pod's gpu-agent `/v1/gpus` document, by capacity
/// pod name ([`read_agents`]); a tenant's measured memory and SM use come from it, matched by pod UID on the
/// capacity pod's GPU. `holders`: who holds each GPU's start-up Lease, by lease name ([`startup_holders`]).
pub fn gpus_from_pool(
    index: &crate::pool::PoolIndex,
    pool: &str,
    shape: &tessera_core::pack::GpuShape,
    agents: &BTreeMap<String, GpuAgentStatus>,
    holders: &BTreeMap<String, String>,
) -> Vec<GpuObservation> {
    let tenant_of = index.tenant_by_reservation();
    index
        .capacity()
        // A spare (gated) holds no GPU: not a row until a booking opens it.
        .filter(|c| !c.gone && !c.spare)
        .map(|c| {
            let device = agents
                .get(&c.name)
                .and_then(|a| agent_device(a, c.gpu_uuid.as_deref()));
            GpuObservation {
                pool: pool.to_owned(),
                capacity_pod: c.name.clone(),
                node: c.node.clone(),
                uuid: c.gpu_uuid.clone().or_else(|| device.map(|d| d.uuid.clone())),
                memory_mib: shape.memory_mib,
                compute_milli: shape.compute_milli,
                tenants: c
                    .reservation_list()
                    .iter()
                    .map(|r| {
                        let tenant = tenant_of.get(r.id.as_str());
                        let used = tenant
                            .and_then(|t| t.uid.as_deref())
                            .zip(device)
                            .and_then(|(uid, d)| d.pods.iter().find(|p| p.pod_uid == uid));
                        TenantObservation {
                            pod: tenant
                                .map(|t| t.key.clone())
                                .or_else(|| r.pod.clone())
                                .unwrap_or_else(|| format!("reservation {}", r.id)),
                            model: r.model.clone(),
                            compute_milli: r.compute_milli,
                            memory_mib: r.memory_mib,
                            measured_memory_mib: used.and_then(|u| u.memory_bytes).map(|b| b / MIB),
                            measured_sm: used.and_then(|u| u.sm_utilization),
                        }
                    })
                    .collect(),
                startup_lease_holder: c
                    .gpu_uuid
                    .as_deref()
                    .and_then(|u| holders.get(&tessera_core::gate::lease_name(u)).cloned()),
                draining_since: c.draining_since,
            }
        })
        .collect()
}

/// Who holds each GPU's start-up Lease (the sidecars' gate, `tessera-startup-<uuid>` in the pool namespace), by
/// lease name, as the page shows it: `"<namespace>/<pod>"`, then `(expired)` when its holder stopped renewing
/// (a SIGKILLed holder; the next waiter takes it over), and how many pods wait. Released leases are left out.
/// `now_ms`: Unix ms.
pub fn startup_holders(leases: &[Lease], now_ms: u64) -> BTreeMap<String, String> {
    leases
        .iter()
        .filter_map(|l| {
            let name = l.metadata.name.as_deref()?;
            if !name.starts_with(tessera_core::gate::LEASE_NAME_PREFIX) {
                return None;
            }
            let spec = l.spec.as_ref()?;
            let holder = spec.holder_identity.as_deref().filter(|h| !h.is_empty())?;
            let renewed_ms = spec
                .renew_time
                .as_ref()
                .map(|t| t.0.as_millisecond())
                .and_then(|ms| u64::try_from(ms).ok());
            let duration_ms = spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map_or(0, |s| s * 1000);
            let expired = renewed_ms.is_none_or(|r| r.saturating_add(duration_ms) < now_ms);
            let waiting = tessera_core::gate::waiters(
                l.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(tessera_core::gate::WAITING_ANNOTATION))
                    .map(String::as_str),
            )
            .len();
            let mut shown = holder.to_owned();
            if expired {
                shown.push_str(" (expired)");
            }
            if waiting > 0 {
                shown.push_str(&format!(" · {waiting} waiting"));
            }
            Some((name.to_owned(), shown))
        })
        .collect()
}

/// Lists the start-up Leases of the pool namespace `namespace` (one list call, bounded by the client's
/// timeouts). An error leaves the column empty for this round: the page never blocks on it.
pub async fn read_startup_leases(client: &kube::Client, namespace: &str) -> Vec<Lease> {
    let api: kube::Api<Lease> = kube::Api::namespaced(client.clone(), namespace);
    match api.list(&kube::api::ListParams::default()).await {
        Ok(list) => list.items,
        Err(e) => {
            tracing::debug!(namespace, error = %e, "start-up leases unreadable: the page shows no holders");
            Vec::new()
        }
    }
}

/// The capacity pod's GPU in its agent's document: the device with the UUID the pod published, or, before it
/// published one, the only device the agent sees (a capacity pod holds one GPU). `None` while NVML is down.
fn agent_device<'a>(agent: &'a GpuAgentStatus, uuid: Option<&str>) -> Option<&'a GpuDeviceUse> {
    if !agent.nvml_up {
        return None;
    }
    match uuid {
        Some(u) => agent.devices.iter().find(|d| d.uuid == u),
        None if agent.devices.len() == 1 => agent.devices.first(),
        None => None,
    }
}

/// Reads the gpu-agent's `/v1/gpus` of every running capacity pod of `index` that has an IP (at `port`, the
/// agent's [`AGENT_PORT`](crate::pool::capacity::AGENT_PORT) in a cluster), concurrently, each within the
/// client's timeout. A capacity pod whose agent does not answer is left out: its tenants show no measured use.
pub async fn read_agents(
    client: &reqwest::Client,
    index: &crate::pool::PoolIndex,
    port: u16,
    max_body: usize,
    refused: &(dyn Fn(&'static str) + Sync),
) -> BTreeMap<String, GpuAgentStatus> {
    let targets: Vec<(String, String)> = index
        .capacity()
        .filter(|c| c.running && !c.gone)
        .filter_map(|c| {
            let ip = c.pod_ip.as_deref()?;
            // An IPv6 pod IP goes in brackets in a URL.
            let host = if ip.contains(':') {
                format!("[{ip}]")
            } else {
                ip.to_owned()
            };
            Some((c.name.clone(), format!("http://{host}:{port}/v1/gpus")))
        })
        .collect();
    let reads = targets.into_iter().map(|(name, url)| async move {
        let doc = async {
            let r = client.get(&url).send().await.ok()?;
            if !r.status().is_success() {
                return None;
            }
            // The agent's pod is ours, but a node's hostPID agent is still a document from another pod: bounded
            // like every other (runtime::body).
            match tessera_runtime::body::read_capped(r, max_body).await {
                Ok(body) => serde_json::from_slice::<GpuAgentStatus>(&body).ok(),
                Err(tessera_runtime::body::BodyError::TooLarge { limit, .. }) => {
                    tracing::warn!(capacity_pod = %name, %url, limit, "gpu-agent document over the size bound: refused");
                    refused("too_large");
                    None
                }
                Err(_) => None,
            }
        }
        .await;
        if doc.is_none() {
            tracing::debug!(capacity_pod = %name, %url, "gpu-agent unavailable: no measured use for its tenants");
        }
        doc.map(|d| (name, d))
    });
    futures::future::join_all(reads)
        .await
        .into_iter()
        .flatten()
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::pool::state::{Reservation, encode_reservations};
    use k8s_openapi::api::core::v1::Pod;

    /// An 80 GiB A100 pool handing each GPU out once.
    const A100: tessera_core::pack::GpuShape = tessera_core::pack::GpuShape {
        memory_mib: 81920,
        headroom_mib: 1024,
        compute_milli: tessera_core::pack::GPU_COMPUTE_MILLI,
    };

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).expect("a pod")
    }

    /// A fresh replica's document: `window` as given, no recommendation yet.
    fn doc(
        window: Option<tessera_core::wire::sidecar::WindowStatus>,
        ttft_slo: Option<f64>,
    ) -> SidecarStatus {
        use tessera_core::wire::sidecar::{
            ComputeStatus, RecommendationStatus, ScrapeStatus, SnapshotSummary,
        };
        SidecarStatus {
            schema_version: 1,
            generated_at: 100.0,
            vllm_url: "http://127.0.0.1:8000".into(),
            vllm_up: true,
            ready: true,
            stale: false,
            scrape: ScrapeStatus::default(),
            max_model_len: None,
            latest: Some(SnapshotSummary::default()),
            window,
            recent: None,
            gpu: None,
            recommendation: RecommendationStatus {
                computed_at: None,
                outcome: Outcome::NotYet {
                    code: tessera_core::recommend::NotYetCode::TooFewSamples,
                    reason: "warming up".into(),
                },
            },
            compute: Some(ComputeStatus {
                current_share: 1.0,
                ttft_slo_secs: ttft_slo,
                ttft_slo_percentile: None,
                itl_slo_secs: None,
            }),
            memory: None,
            rest: None,
            startup_gate: None,
        }
    }

    fn q(p50: f64, p95: f64) -> tessera_core::wire::sidecar::Quantiles {
        tessera_core::wire::sidecar::Quantiles {
            p50: Some(p50),
            p95: Some(p95),
            p99: Some(p95),
            count: Some(10.0),
        }
    }

    /// Prefix-cache hit rate is the replicas' mean, prefill and decode the worst replica's, activity the busiest
    /// replica's; an older sidecar's missing fields count as unknown, never as zero.
    #[test]
    fn prefix_cache_prefill_decode_and_class_over_replicas() {
        use tessera_core::class::WorkloadClass;
        use tessera_core::wire::sidecar::WindowStatus;
        let new = |hit: f64, prefill: f64, decode: f64, active: f64| WindowStatus {
            requests_per_second: Some(2.0),
            prefix_cache_hit_ratio: Some(hit),
            prefill_time_seconds: q(prefill / 2.0, prefill),
            decode_time_seconds: q(decode / 2.0, decode),
            active_ratio: Some(active),
            ..WindowStatus::default()
        };
        let old = WindowStatus {
            requests_per_second: Some(1.0),
            ..WindowStatus::default()
        };
        let docs = [
            doc(Some(new(0.2, 0.3, 4.0, 0.9)), Some(2.0)),
            doc(Some(new(0.6, 0.5, 3.0, 0.7)), Some(2.0)),
            doc(Some(old.clone()), Some(2.0)),
        ];
        let replicas = Replicas {
            current: 3,
            ..Replicas::default()
        };
        let m = model_from_sidecars("ml", "chat", replicas, &docs);
        let s = m.signals;
        assert!((s.prefix_cache_hit_ratio.unwrap() - 0.4).abs() < 1e-12, "{s:?}");
        assert_eq!((s.prefill_p95, s.prefill_p50), (Some(0.5), Some(0.25)));
        assert_eq!((s.decode_p95, s.decode_p50), (Some(4.0), Some(2.0)));
        assert_eq!(s.active_ratio, Some(0.9));
        assert_eq!(s.requests_per_second, Some(5.0));
        let c = m.workload_class.unwrap();
        // Nothing declared, no history where no round runs: real-time, whatever the activity.
        assert_eq!(c.class, WorkloadClass::Realtime, "{}", c.reason);
        assert!(c.reason.contains("requests in 90%"), "{}", c.reason);

        // Only older sidecars: every new figure unknown.
        let m = model_from_sidecars("ml", "chat", replicas, &[doc(Some(old), None)]);
        assert_eq!(
            (
                m.signals.prefix_cache_hit_ratio,
                m.signals.prefill_p95,
                m.signals.decode_p95
            ),
            (None, None, None)
        );
        assert_eq!(m.workload_class.unwrap().class, WorkloadClass::Realtime);
    }

    #[test]
    fn pool_rows_name_tenants_by_pod_and_skip_gone_gpus() {
        let reservations = encode_reservations(&[
            Reservation {
                id: "r1".into(),
                model: "ml/chat".into(),
                compute_milli: 250,
                memory_mib: 20000,
                priority: 0,
                created_at: 1,
                pod: None,
                evicted_at: None,
                asleep_since: None,
            },
            Reservation {
                id: "r2".into(),
                model: "ml/embed".into(),
                compute_milli: 100,
                memory_mib: 4000,
                priority: 0,
                created_at: 1,
                pod: None,
                evicted_at: None,
                asleep_since: None,
            },
        ]);
        let mut index = crate::pool::PoolIndex::new("a100");
        index.apply_capacity(&pod(serde_json::json!({
            "metadata": {"name": "cap-0", "namespace": "tessera-system",
                "labels": {"tessera.dev/pool": "a100", "tessera.dev/capacity-pod": "true"},
                "annotations": {"tessera.dev/reservations": reservations, "tessera.dev/gpu-uuid": "GPU-1"}},
            "spec": {"nodeName": "node-a", "containers": []},
            "status": {"phase": "Running", "podIP": "10.0.0.7"}
        })));
        index.apply_capacity(&pod(serde_json::json!({
            "metadata": {"name": "cap-1", "namespace": "tessera-system",
                "labels": {"tessera.dev/pool": "a100", "tessera.dev/capacity-pod": "true"}},
            "spec": {"containers": []},
            "status": {"phase": "Failed"}
        })));
        index.apply_tenant(&pod(serde_json::json!({
            "metadata": {"name": "chat-0", "namespace": "ml", "uid": "uid-chat-0",
                "labels": {"tessera.dev/pool": "a100"},
                "annotations": {"tessera.dev/reservation": "r1", "tessera.dev/capacity-pod": "cap-0"}},
            "spec": {"containers": []}
        })));
        let rows = gpus_from_pool(&index, "a100", &A100, &BTreeMap::new(), &BTreeMap::new());
        assert_eq!(rows.len(), 1, "the failed capacity pod is not a GPU anyone holds");
        let g = &rows[0];
        assert_eq!(
            (g.capacity_pod.as_str(), g.node.as_deref(), g.uuid.as_deref()),
            ("cap-0", Some("node-a"), Some("GPU-1"))
        );
        let pods: Vec<&str> = g.tenants.iter().map(|t| t.pod.as_str()).collect();
        assert_eq!(pods, ["ml/chat-0", "reservation r2"]);
        assert_eq!(g.tenants[0].compute_milli, 250);
        assert_eq!(
            g.tenants[0].measured_memory_mib, None,
            "no agent read: nothing measured"
        );
        assert_eq!(
            index.capacity_pod("cap-0").unwrap().pod_ip.as_deref(),
            Some("10.0.0.7")
        );

        // The capacity pod's gpu-agent: chat-0 by its UID on GPU-1; a neighbour's pod on another GPU the agent
        // also sees is not this GPU's.
        let agent = |nvml_up: bool| GpuAgentStatus {
            schema_version: 1,
            generated_at: 10.0,
            nvml_up,
            error: None,
            read_at: Some(10.0),
            devices: vec![
                GpuDeviceUse {
                    index: 0,
                    uuid: "GPU-0".into(),
                    total_bytes: 80 << 30,
                    used_bytes: 1 << 30,
                    pods: vec![use_of("uid-chat-0", 1 << 30, 0.9)],
                    unattributed: None,
                },
                GpuDeviceUse {
                    index: 1,
                    uuid: "GPU-1".into(),
                    total_bytes: 80 << 30,
                    used_bytes: 20 << 30,
                    pods: vec![
                        use_of("uid-chat-0", 18_000 * MIB, 0.3),
                        use_of("uid-other", MIB, 0.1),
                    ],
                    unattributed: None,
                },
            ],
        };
        let agents = BTreeMap::from([("cap-0".to_owned(), agent(true))]);
        let g = &gpus_from_pool(&index, "a100", &A100, &agents, &BTreeMap::new())[0];
        assert_eq!(g.tenants[0].measured_memory_mib, Some(18_000));
        assert_eq!(g.tenants[0].measured_sm, Some(0.3));
        assert_eq!(
            (g.tenants[1].measured_memory_mib, g.tenants[1].measured_sm),
            (None, None),
            "r2 has no pod yet: nothing to match"
        );
        // NVML down: the agent's document says nothing measured.
        let agents = BTreeMap::from([("cap-0".to_owned(), agent(false))]);
        assert_eq!(
            gpus_from_pool(&index, "a100", &A100, &agents, &BTreeMap::new())[0].tenants[0].measured_sm,
            None
        );
    }

    fn use_of(uid: &str, bytes: u64, sm: f64) -> tessera_core::wire::sidecar::PodGpuUse {
        tessera_core::wire::sidecar::PodGpuUse {
            pod_uid: uid.into(),
            container_ids: Vec::new(),
            pids: vec![1],
            memory_bytes: Some(bytes),
            sm_utilization: Some(sm),
        }
    }

    /// The agents are read over HTTP from each running capacity pod's IP; one that does not answer is left out.
    #[tokio::test]
    async fn agents_are_read_from_running_capacity_pods() {
        let doc = GpuAgentStatus {
            schema_version: 1,
            generated_at: 1.0,
            nvml_up: true,
            error: None,
            read_at: Some(1.0),
            devices: Vec::new(),
        };
        let served = doc.clone();
        let app = axum::Router::new().route(
            "/v1/gpus",
            axum::routing::get(move || {
                let d = served.clone();
                async move { axum::Json(d) }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let mut index = crate::pool::PoolIndex::new("a100");
        for (name, ip, phase) in [
            ("cap-0", Some("127.0.0.1"), "Running"),
            ("cap-1", Some("127.0.0.2"), "Pending"),
            ("cap-2", None, "Running"),
        ] {
            index.apply_capacity(&pod(serde_json::json!({
                "metadata": {"name": name, "namespace": "tessera-system",
                    "labels": {"tessera.dev/pool": "a100", "tessera.dev/capacity-pod": "true"}},
                "spec": {"containers": []},
                "status": {"phase": phase, "podIP": ip}
            })));
        }
        let client = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(2))
            .build()
            .unwrap();
        let got = read_agents(&client, &index, port, 1 << 20, &|_| {}).await;
        assert_eq!(got.len(), 1, "only the running pod with an IP is read: {got:?}");
        assert_eq!(got["cap-0"], doc);
    }

    #[test]
    fn the_gpu_page_shows_who_holds_each_start_up_lease() {
        let lease = |name: &str, holder: &str, renewed_ms: i64, waiting: &str| -> Lease {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "tessera-gpus",
                             "annotations": {"tessera.dev/startup-waiting": waiting}},
                "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                         "renewTime": k8s_openapi::jiff::Timestamp::from_millisecond(renewed_ms).unwrap().to_string()}
            }))
            .unwrap()
        };
        let now = 1_800_000_000_000u64;
        let leases = [
            lease(
                "tessera-startup-gpu-1",
                "ml/chat-1",
                now as i64 - 5_000,
                r#"{"ml/code-0": 1}"#,
            ),
            lease("tessera-startup-gpu-2", "ml/old-0", now as i64 - 60_000, "{}"),
            lease("tessera-startup-gpu-3", "", now as i64, "{}"),
            lease("tessera-autoscaler", "autoscaler-0", now as i64, "{}"),
        ];
        let holders = startup_holders(&leases, now);
        assert_eq!(
            holders,
            BTreeMap::from([
                (
                    "tessera-startup-gpu-1".to_owned(),
                    "ml/chat-1 · 1 waiting".to_owned()
                ),
                (
                    "tessera-startup-gpu-2".to_owned(),
                    "ml/old-0 (expired)".to_owned()
                ),
            ]),
            "released leases and other leases are not shown"
        );
        let mut index = crate::pool::PoolIndex::new("a100");
        index.apply_capacity(&pod(serde_json::json!({
            "metadata": {"name": "cap-0", "namespace": "tessera-gpus",
                "labels": {"tessera.dev/pool": "a100", "tessera.dev/capacity-pod": "true"},
                "annotations": {"tessera.dev/gpu-uuid": "GPU-1"}},
            "spec": {"nodeName": "node-a", "containers": []},
            "status": {"phase": "Running"}
        })));
        let rows = gpus_from_pool(&index, "a100", &A100, &BTreeMap::new(), &holders);
        assert_eq!(
            rows[0].startup_lease_holder.as_deref(),
            Some("ml/chat-1 · 1 waiting")
        );
    }
}
