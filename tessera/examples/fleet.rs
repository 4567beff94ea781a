//! The fleet for `scripts/bench-fleet.sh` and the control-plane tier's small fleet check (tessera/tests/fleet.rs):
//! N models on a real control plane, their sidecars played by this one process, and a schedule of demand.
//!
//! 1. Creates `--namespaces` namespaces and N model Deployments (one GPU each, on the kwok GPU nodes) with their
//!    InferenceAutoscalers; every fifth model has `minReplicas: 0` (scale to zero and back through the activator).
//! 2. Watches the fleet's pods and, for each running one, listens at the pod's address (kwok hands out loopback
//!    addresses) on `--sidecar-port`, answering `/v1/status` with its model's current demand. The controller
//!    reaches it exactly as it reaches a sidecar in a cluster: pod IP from the API server, the sidecar port.
//! 3. Once `--go-file` exists (the benchmark started the controller), waits `--warmup`, then runs the schedule
//!    for `--duration`: every `--phase`, a share of the steady models bursts (KV cache 95%, a queue) and the last
//!    phase's bursts calm down; models at zero get a request through the activator. It watches the Deployments and
//!    measures the reaction: from the document change (or the request) to the `/scale` write being seen.
//! 4. Writes the result (JSON) to `--out`: reaction p50/p99, wake p50/p99, how many models got a decision.
//!
//! One process holds every listener, so the fleet's own cost is not the measured one; it is a load generator,
//! not a sidecar (the real sidecar's footprint is measured by scripts/sidecar-footprint.sh).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::watcher;
use serde_json::{Value, json};

#[derive(Debug, Parser)]
struct Args {
    /// How many models (one Deployment and one InferenceAutoscaler each).
    #[arg(long)]
    models: usize,
    /// Namespaces the models are spread over.
    #[arg(long, default_value_t = 10)]
    namespaces: usize,
    /// The port the controller reads sidecars on (its --sidecar-port).
    #[arg(long, default_value_t = 9090)]
    sidecar_port: u16,
    /// The activator's serving URL (requests for models at zero go there).
    #[arg(long)]
    activator: Option<String>,
    /// Created by the benchmark once the controller runs: the schedule starts after it.
    #[arg(long)]
    go_file: PathBuf,
    /// Written once every pod runs and is served.
    #[arg(long)]
    ready_file: PathBuf,
    /// Written when the schedule starts (the steady state's measurement begins).
    #[arg(long)]
    steady_file: PathBuf,
    /// The result document.
    #[arg(long)]
    out: PathBuf,
    /// After the go file: time for the controller's first decisions before the schedule.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// How long the schedule runs.
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// One step of the schedule.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    phase: Duration,
    /// Share of the steady models that burst each phase.
    #[arg(long, default_value_t = 0.1)]
    burst_fraction: f64,
    /// The longest the fleet waits for its pods to run.
    #[arg(long, default_value = "600s", value_parser = humantime::parse_duration)]
    setup_timeout: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Level {
    /// No requests: a `minReplicas: 0` model goes to zero.
    Idle,
    /// Comfortably under the target.
    Steady,
    /// KV cache nearly full and a queue: the controller must add a replica.
    Burst,
}

/// What each model's sidecars answer now, and the Deployments' counts as the watch last saw them.
struct Fleet {
    levels: Mutex<Vec<Level>>,
    replicas: Mutex<Vec<Option<i32>>>,
    /// Per model: (when its demand rose, the count then) until the watch sees the count rise.
    pending: Mutex<HashMap<usize, (Instant, i32, Kind)>>,
    reactions: Mutex<Vec<(Kind, f64)>>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Burst,
    Wake,
}

fn name(i: usize) -> String {
    format!("m{i:04}")
}

fn namespace_of(i: usize, namespaces: usize) -> String {
    format!("fleet-{}", i % namespaces)
}

fn min_zero(i: usize) -> bool {
    i.is_multiple_of(5)
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// A `/v1/status` document (core/src/wire/sidecar.rs) for one replica at `level`, fresh as of now.
fn document(level: Level, model: &str) -> Vec<u8> {
    let now = unix_now();
    let (kv, running, waiting) = match level {
        Level::Idle => (0.0, 0.0, 0.0),
        Level::Steady => (0.35, 2.0, 0.0),
        Level::Burst => (0.95, 8.0, 6.0),
    };
    serde_json::to_vec(&json!({
        "schema_version": 1, "generated_at": now, "vllm_url": "http://127.0.0.1:8000", "vllm_up": true,
        "ready": true, "stale": false,
        "scrape": {"interval_secs": 1.0, "last_attempt_at": now, "last_success_at": now, "successes_total": 100},
        "latest": {"at": now, "model_names": [model], "kv_cache_usage_ratio": kv,
                   "requests_running": running, "requests_waiting": waiting},
        "recommendation": {"outcome": {"state": "not_yet", "code": "too_few_samples", "reason": "a fleet replica"}}
    }))
    .expect("a document serializes")
}

async fn status(State((fleet, i)): State<(Arc<Fleet>, usize)>) -> impl axum::response::IntoResponse {
    let level = fleet.levels.lock().unwrap()[i];
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        document(level, &name(i)),
    )
}

fn deployment(i: usize, ns: &str) -> Value {
    let n = name(i);
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": n, "namespace": ns, "labels": {"tessera.dev/fleet": "true"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": n}},
            "template": {
                "metadata": {"labels": {"app": n, "tessera.dev/fleet": "true", "tessera.dev/fleet-model": i.to_string()}},
                "spec": {
                    "nodeSelector": {"tessera.dev/fleet": "true"},
                    // The sidecar as the webhook injects it would be (the controller tells injected pods by its
                    // name); this process answers for it at the pod's address.
                    "containers": [{"name": "vllm", "image": "vllm/vllm-openai:fleet",
                                    "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                                   {"name": "tessera-sidecar", "image": "tessera:fleet"}]
                }
            }
        }
    })
}

fn autoscaler(i: usize, ns: &str) -> Value {
    let n = name(i);
    let mut spec = json!({
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": n},
        "minReplicas": if min_zero(i) { 0 } else { 1 }, "maxReplicas": 3,
        "modelNames": [n],
        "targets": {"kvCacheUtilization": 0.7, "waitingRequestsPerReplica": 2}
    });
    if min_zero(i) {
        spec["scaleToZero"] = json!({"idleAfter": "20s"});
    }
    json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "InferenceAutoscaler",
           "metadata": {"name": n, "namespace": ns}, "spec": spec})
}

fn ias_api(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "tessera.dev",
        "v1alpha1",
        "InferenceAutoscaler",
    ));
    Api::namespaced_with(client.clone(), ns, &ar)
}

/// Creates what is missing (a rerun against the same control plane adds nothing twice).
async fn create<K>(api: &Api<K>, obj: Value) -> anyhow::Result<()>
where
    K: kube::Resource
        + Clone
        + k8s_openapi::serde::de::DeserializeOwned
        + k8s_openapi::serde::Serialize
        + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(obj)?;
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

async fn set_up(client: &kube::Client, args: &Args) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for k in 0..args.namespaces.min(args.models) {
        let ns = format!("fleet-{k}");
        create(
            &namespaces,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .await?;
    }
    // A bounded number of creations in flight: the API server's inflight limit is shared with everything else.
    futures::stream::iter(0..args.models)
        .map(|i| {
            let client = client.clone();
            let ns = namespace_of(i, args.namespaces);
            async move {
                create(
                    &Api::<Deployment>::namespaced(client.clone(), &ns),
                    deployment(i, &ns),
                )
                .await?;
                create(&ias_api(&client, &ns), autoscaler(i, &ns)).await
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Keeps one listener per running fleet pod at the pod's address, and returns how many are served.
async fn serve_pods(client: kube::Client, fleet: Arc<Fleet>, port: u16, served: Arc<Mutex<usize>>) {
    let pods: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().labels("tessera.dev/fleet=true");
    let mut listeners: HashMap<String, (usize, tokio::task::JoinHandle<()>)> = HashMap::new();
    let mut stream = watcher(pods, config).boxed();
    while let Some(event) = stream.next().await {
        let (pods, deleted) = match event {
            Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => (vec![p], false),
            Ok(watcher::Event::Delete(p)) => (vec![p], true),
            Ok(_) => continue,
            Err(e) => {
                eprintln!("fleet: pod watch: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        for p in pods {
            let ip = p
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.clone())
                .filter(|ip| !ip.is_empty());
            let model = p
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("tessera.dev/fleet-model"))
                .and_then(|m| m.parse::<usize>().ok());
            let (Some(ip), Some(i)) = (ip, model) else {
                continue;
            };
            let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            let gone = deleted || p.metadata.deletion_timestamp.is_some() || !running;
            if gone {
                if let Some((_, h)) = listeners.remove(&ip) {
                    h.abort();
                }
                continue;
            }
            if listeners
                .get(&ip)
                .is_some_and(|(m, h)| *m == i && !h.is_finished())
            {
                continue;
            }
            if let Some((_, h)) = listeners.remove(&ip) {
                h.abort();
            }
            let addr: SocketAddr = format!("{ip}:{port}").parse().expect("a pod address");
            let listener = match bind(addr).await {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("fleet: cannot listen at {addr}: {e}");
                    continue;
                }
            };
            let app = axum::Router::new()
                .route("/v1/status", axum::routing::get(status))
                .with_state((fleet.clone(), i));
            let h = tokio::spawn(async move {
                let _ = axum::serve(listener, app).await;
            });
            listeners.insert(ip, (i, h));
        }
        *served.lock().unwrap() = listeners.len();
    }
}

/// A pod's address may still be held by the listener of a pod just deleted (kwok reuses addresses): retry briefly.
async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let mut last = None;
    for _ in 0..20 {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(last.expect("at least one attempt"))
}

/// Follows the Deployments' counts; a count rising above the one a model had when its demand rose is the reaction.
async fn follow_scale(client: kube::Client, fleet: Arc<Fleet>, index: Arc<HashMap<String, usize>>) {
    let deployments: Api<Deployment> = Api::all(client);
    let config = watcher::Config::default().labels("tessera.dev/fleet=true");
    let mut stream = watcher(deployments, config).boxed();
    while let Some(event) = stream.next().await {
        let d = match event {
            Ok(watcher::Event::Apply(d) | watcher::Event::InitApply(d)) => d,
            Ok(_) => continue,
            Err(e) => {
                eprintln!("fleet: deployment watch: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let key = format!(
            "{}/{}",
            d.metadata.namespace.as_deref().unwrap_or_default(),
            d.metadata.name.as_deref().unwrap_or_default()
        );
        let Some(&i) = index.get(&key) else { continue };
        let count = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
        fleet.replicas.lock().unwrap()[i] = Some(count);
        let mut pending = fleet.pending.lock().unwrap();
        if let Some((at, before, kind)) = pending.get(&i).copied()
            && count > before
        {
            pending.remove(&i);
            fleet
                .reactions
                .lock()
                .unwrap()
                .push((kind, at.elapsed().as_secs_f64()));
        }
    }
}

/// A request for a model at zero through the activator: it holds it and wakes the model. The answer does not
/// matter (no backend serves completions here); the client gives up after a while.
fn wake(http: reqwest::Client, activator: String, ns: String, model: String) {
    tokio::spawn(async move {
        let _ = http
            .post(format!("{activator}/namespaces/{ns}/v1/chat/completions"))
            .json(&json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}))
            .send()
            .await;
    });
}

/// A small deterministic generator: the same schedule on every run.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

async fn schedule(args: &Args, fleet: &Arc<Fleet>) -> BTreeMap<&'static str, Value> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
        .expect("an HTTP client");
    let mut rng = Lcg(59);
    let started = Instant::now();
    let mut bursts = 0usize;
    let mut wakes = 0usize;
    while started.elapsed() < args.duration {
        {
            let mut levels = fleet.levels.lock().unwrap();
            let replicas = fleet.replicas.lock().unwrap().clone();
            let mut pending = fleet.pending.lock().unwrap();
            for (i, level) in levels.iter_mut().enumerate() {
                let count = replicas[i].unwrap_or(0);
                match *level {
                    // Last phase's burst calms down (a scale-down waits out its stabilization window).
                    Level::Burst => {
                        *level = Level::Steady;
                        pending.remove(&i);
                    }
                    Level::Steady if (1..3).contains(&count) && rng.next() < args.burst_fraction => {
                        *level = Level::Burst;
                        pending.insert(i, (Instant::now(), count, Kind::Burst));
                        bursts += 1;
                    }
                    // A model that went to zero is asked for again.
                    Level::Idle if count == 0 && !pending.contains_key(&i) => {
                        if let Some(a) = &args.activator {
                            pending.insert(i, (Instant::now(), 0, Kind::Wake));
                            wake(http.clone(), a.clone(), namespace_of(i, args.namespaces), name(i));
                            wakes += 1;
                        }
                    }
                    _ => {}
                }
            }
        }
        tokio::time::sleep(args.phase).await;
    }
    // The last changes get one more phase to be seen.
    tokio::time::sleep(args.phase).await;
    let reactions = fleet.reactions.lock().unwrap().clone();
    let pending = fleet.pending.lock().unwrap().clone();
    let stats = |kind: Kind| {
        let mut v: Vec<f64> = reactions
            .iter()
            .filter(|(k, _)| *k == kind)
            .map(|(_, s)| *s)
            .collect();
        v.sort_by(f64::total_cmp);
        let missed = pending.values().filter(|(_, _, k)| *k == kind).count();
        (quantile(&v, 0.5), quantile(&v, 0.99), v.len(), missed)
    };
    let (b50, b99, bn, bmissed) = stats(Kind::Burst);
    let (w50, w99, wn, wmissed) = stats(Kind::Wake);
    BTreeMap::from([
        ("bursts", json!(bursts)),
        ("reaction_p50_s", json!(b50)),
        ("reaction_p99_s", json!(b99)),
        ("reactions", json!(bn)),
        ("reactions_missed", json!(bmissed)),
        ("wakes", json!(wakes)),
        ("wake_p50_s", json!(w50)),
        ("wake_p99_s", json!(w99)),
        ("wakes_seen", json!(wn)),
        ("wakes_missed", json!(wmissed)),
    ])
}

/// How many InferenceAutoscalers carry a decision in status (`desiredReplicas` and the AbleToScale condition).
async fn decided(client: &kube::Client, args: &Args) -> anyhow::Result<usize> {
    let mut n = 0;
    for k in 0..args.namespaces.min(args.models) {
        let list = ias_api(client, &format!("fleet-{k}"))
            .list(&ListParams::default())
            .await?;
        n += list
            .items
            .iter()
            .filter(|o| {
                o.data["status"]["desiredReplicas"].is_number() && o.data["status"]["conditions"].is_array()
            })
            .count();
    }
    Ok(n)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let client = kube::Client::try_default().await?;
    let setup = Instant::now();
    set_up(&client, &args).await?;
    eprintln!(
        "fleet: {} models created in {:.1} s",
        args.models,
        setup.elapsed().as_secs_f64()
    );

    let levels = (0..args.models)
        .map(|i| if min_zero(i) { Level::Idle } else { Level::Steady })
        .collect();
    let fleet = Arc::new(Fleet {
        levels: Mutex::new(levels),
        replicas: Mutex::new(vec![None; args.models]),
        pending: Mutex::new(HashMap::new()),
        reactions: Mutex::new(Vec::new()),
    });
    let index: Arc<HashMap<String, usize>> = Arc::new(
        (0..args.models)
            .map(|i| (format!("{}/{}", namespace_of(i, args.namespaces), name(i)), i))
            .collect(),
    );
    let served = Arc::new(Mutex::new(0usize));
    tokio::spawn(serve_pods(
        client.clone(),
        fleet.clone(),
        args.sidecar_port,
        served.clone(),
    ));
    tokio::spawn(follow_scale(client.clone(), fleet.clone(), index));

    // Every model's first pod runs and is served before the controller starts.
    while *served.lock().unwrap() < args.models {
        anyhow::ensure!(
            setup.elapsed() < args.setup_timeout,
            "only {} of {} pods ran and were served within {:?}",
            served.lock().unwrap(),
            args.models,
            args.setup_timeout
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let setup_s = setup.elapsed().as_secs_f64();
    eprintln!("fleet: every model's pod runs and is served after {setup_s:.1} s");
    std::fs::write(&args.ready_file, format!("{setup_s}\n"))?;
    while !args.go_file.exists() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(args.warmup).await;
    std::fs::write(&args.steady_file, format!("{}\n", unix_now()))?;
    let mut result = schedule(&args, &fleet).await;
    result.insert("steady_end_unix", json!(unix_now()));
    result.insert("models", json!(args.models));
    result.insert("setup_s", json!(setup_s));
    result.insert("decided", json!(decided(&client, &args).await?));
    result.insert("pods_served", json!(*served.lock().unwrap()));
    std::fs::write(&args.out, serde_json::to_vec_pretty(&result)?)?;
    eprintln!("fleet: {}", serde_json::to_string(&result)?);
    Ok(())
}
