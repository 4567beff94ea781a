//! The scaler on one machine: `tessera autoscaler --no-kube --sidecar m=URL --activator-url URL
//! --keda-scaler-listen 127.0.0.1:PORT [--policy FILE]`.
//!
//! With no cluster there is no `/scale` to read and no status to publish in, so this process decides itself:
//! every sync period (and at once when an activator holds a request) it takes each model's round in core
//! ([`tessera_core::round::round`], the controller's and the simulator's), with the policy of `--policy` or
//! [`DEFAULT_POLICY`], and publishes the decision for the scaler. Models are in the namespace `default` (the
//! activator's default for its `--backend`s).
//!
//! The replicas a model has are its `--sidecar`s that answer: one that refuses the connection has no process
//! behind it (KEDA scaled it away, or it has not started); one that answers slowly or wrongly is a replica with
//! missing data, which never lets the model scale down.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use tessera_core::keda::{ModelRef, Published, ScaleOwner};
use tessera_core::round::{Observed, round};
use tessera_core::scale::inputs::demand_from;
use tessera_core::scale::joint::{LeadTimes, ShareRoom};
use tessera_core::scale::{ScalePolicy, ScaleState, Timestamp};
use tessera_core::wire::activator::model_key;
use tokio::sync::{broadcast, watch};
use tracing::{debug, info};

use crate::controller::metrics::Metrics;
use crate::controller::signals::{ActivatorPoller, FetchError, SignalSource};
use crate::crd::InferenceAutoscalerSpec;

/// The namespace of every model in local mode.
pub const NAMESPACE: &str = "default";

/// The policy of a model when no `--policy` is given: the InferenceAutoscaler's defaults (one replica at least
/// unless idle, `behavior` as HPA's) with scale to zero after 10 minutes idle and a KV-cache target, so that a
/// first try scales both ways. `scaleTargetRef` and `modelNames` are the `--sidecar` NAME.
pub const DEFAULT_POLICY: &str = "\
minReplicas: 0
maxReplicas: 8
scaleToZero:
  idleAfter: 10m
targets:
  kvCacheUtilization: 0.8
";

/// Reads `--policy` (the `spec:` of an InferenceAutoscaler or the whole object), or the default.
pub fn policy_spec(path: Option<&Path>) -> anyhow::Result<serde_yaml::Value> {
    let text = match path {
        Some(p) => std::fs::read_to_string(p).with_context(|| format!("reading --policy {}", p.display()))?,
        None => DEFAULT_POLICY.to_owned(),
    };
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).with_context(|| {
        format!(
            "--policy {}: not YAML",
            path.map_or("(default)".into(), |p| p.display().to_string())
        )
    })?;
    Ok(doc.get("spec").cloned().unwrap_or(doc))
}

/// The spec of model `name`: `spec` with the target and model name filled in where it leaves them out, checked
/// as the controller checks an InferenceAutoscaler.
pub fn model_policy(
    spec: &serde_yaml::Value,
    name: &str,
) -> anyhow::Result<(InferenceAutoscalerSpec, ScalePolicy)> {
    let mut spec = spec.clone();
    if let Some(map) = spec.as_mapping_mut() {
        map.entry("scaleTargetRef".into()).or_insert_with(|| {
            serde_yaml::to_value(BTreeMap::from([("kind", "Deployment"), ("name", name)])).unwrap_or_default()
        });
        map.entry("modelNames".into())
            .or_insert_with(|| serde_yaml::Value::Sequence(vec![name.into()]));
    }
    let spec: InferenceAutoscalerSpec = serde_yaml::from_value(spec)
        .with_context(|| format!("--policy for model {name}: not an InferenceAutoscaler spec"))?;
    let policy = spec
        .to_policy()
        .map_err(|e| anyhow::anyhow!("--policy for model {name}: {}", e.join("; ")))?;
    Ok((spec, policy))
}

/// What the local loop published, for the scaler.
#[derive(Debug)]
pub struct LocalSource {
    models: Mutex<BTreeMap<ModelRef, Published>>,
    activators: ActivatorPoller,
    activator_max_age: Duration,
    keys: BTreeMap<ModelRef, Vec<String>>,
    changes: broadcast::Sender<ModelRef>,
}

impl tessera_keda::Source for LocalSource {
    fn published(&self, model: &ModelRef) -> Option<Published> {
        let mut p = self.models.lock().ok()?.get(model)?.clone();
        // Held requests are read now, not at the last round: a push must not wait for the next sync.
        let demand = demand_from(
            &self.activators.samples(),
            self.keys.get(model)?,
            crate::unix_ms(SystemTime::now()),
            self.activator_max_age,
        );
        p.held = demand.queued_at_activator;
        Some(p)
    }

    fn changes(&self) -> broadcast::Receiver<ModelRef> {
        self.changes.subscribe()
    }
}

/// One model of the local loop.
struct Model {
    name: String,
    policy: ScalePolicy,
    sidecars: Vec<String>,
    state: ScaleState,
}

/// Starts deciding for `groups` (NAME → sidecar URLs) every `sync_period` and at every held request; returns the
/// source the scaler reads.
#[allow(clippy::too_many_arguments)]
pub fn start(
    groups: &BTreeMap<String, Vec<String>>,
    spec: &serde_yaml::Value,
    signals: Arc<dyn SignalSource>,
    activators: ActivatorPoller,
    metrics: Arc<Metrics>,
    sync_period: Duration,
    max_signal_age: Duration,
    activator_max_age: Duration,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<Arc<LocalSource>> {
    let mut models = Vec::new();
    let mut keys = BTreeMap::new();
    for (name, urls) in groups {
        let (spec, policy) = model_policy(spec, name)?;
        keys.insert(
            ModelRef {
                namespace: NAMESPACE.into(),
                name: name.clone(),
            },
            spec.model_names.iter().map(|m| model_key(NAMESPACE, m)).collect(),
        );
        models.push(Model {
            name: name.clone(),
            policy,
            sidecars: urls.clone(),
            state: ScaleState::default(),
        });
    }
    let (changes, _) = broadcast::channel(256);
    let source = Arc::new(LocalSource {
        models: Mutex::new(BTreeMap::new()),
        activators: activators.clone(),
        activator_max_age,
        keys,
        changes,
    });
    let out = source.clone();
    let mut wakes = activators.subscribe();
    let mut stop = stop;
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(sync_period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                // A held request: decide now (from zero, the round brings a replica at once).
                Ok(_) = wakes.recv() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            for m in &mut models {
                decide(m, &out, signals.as_ref(), &metrics, max_signal_age).await;
            }
        }
    });
    info!(
        models = groups.len(),
        "KEDA scaler: deciding locally for each --sidecar model"
    );
    Ok(source)
}

/// One round for one model, published.
async fn decide(
    m: &mut Model,
    out: &LocalSource,
    signals: &dyn SignalSource,
    metrics: &Metrics,
    max_signal_age: Duration,
) {
    let results = futures::future::join_all(m.sidecars.iter().map(|u| signals.sidecar_status(u))).await;
    let mut sidecars = Vec::new();
    for (url, r) in m.sidecars.iter().zip(results) {
        match r {
            Ok(doc) => sidecars.push(Some(doc)),
            // Nothing listens: no replica there.
            Err(FetchError::Connect { .. }) => {}
            Err(e) => {
                debug!(%url, error = %e, "sidecar unavailable: a replica with missing data");
                metrics.scrape_failure("sidecar", e.label());
                sidecars.push(None);
            }
        }
    }
    let now_ms = crate::unix_ms(SystemTime::now());
    let model = ModelRef {
        namespace: NAMESPACE.into(),
        name: m.name.clone(),
    };
    let keys = out.keys.get(&model).cloned().unwrap_or_default();
    let demand = demand_from(&out.activators.samples(), &keys, now_ms, out.activator_max_age);
    let observed = Observed {
        name: m.name.clone(),
        replicas: u32::try_from(sidecars.len()).unwrap_or(u32::MAX),
        surged: false,
        sidecars,
        demand,
        external_rate: None,
        room: ShareRoom::Fixed,
        leads: LeadTimes::one(None),
        peers: Vec::new(),
        placement: Default::default(),
        max_signal_age,
        // The local scaler decides on the policy it was given: no spec, no owner, no class.
        class: None,
        // Sleep mode needs a pod to put to sleep: not on one machine's local scaler.
        sleep: None,
        // Nor are its replicas placed on shared GPUs by Tessera here.
        isolation: None,
    };
    let now = Timestamp::from_millis(now_ms);
    let r = round(&m.policy, &observed, &mut m.state, now);
    m.state.record(&r.decision, now);
    metrics.decision(r.decision.reason);
    debug!(model = %m.name, current = observed.replicas, desired = r.decision.desired_replicas, reason = r.decision.reason.label(), "decided");
    let published = Published {
        owner: ScaleOwner::Keda,
        desired_replicas: Some(r.decision.desired_replicas),
        current_replicas: observed.replicas,
        signals: r
            .decision
            .signals
            .iter()
            .map(|s| tessera_core::keda::PublishedSignal {
                signal: s.signal,
                current: s.value,
                target: s.target,
            })
            .collect(),
        held: demand.queued_at_activator,
    };
    let changed = out
        .models
        .lock()
        .map(|mut map| map.insert(model.clone(), published.clone()) != Some(published))
        .unwrap_or(false);
    if changed {
        let _ = out.changes.send(model);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    /// `--policy`'s help states the default in words (no internal name in `--help`): it must say what
    /// [`super::DEFAULT_POLICY`] holds.
    #[test]
    fn the_policy_flags_help_states_the_default_policy() {
        let spec: serde_yaml::Value = serde_yaml::from_str(super::DEFAULT_POLICY).unwrap();
        assert_eq!(spec["minReplicas"].as_u64(), Some(0));
        assert_eq!(spec["maxReplicas"].as_u64(), Some(8));
        assert_eq!(spec["scaleToZero"]["idleAfter"].as_str(), Some("10m"));
        assert_eq!(spec["targets"]["kvCacheUtilization"].as_f64(), Some(0.8));
        let cmd = <crate::keda::KedaArgs as clap::Args>::augment_args(clap::Command::new("autoscaler"));
        let help = cmd
            .get_arguments()
            .find(|a| a.get_id() == "policy")
            .and_then(|a| a.get_help().map(|h| h.to_string()))
            .unwrap();
        for words in [
            "minReplicas 0",
            "maxReplicas 8",
            "10m idle",
            "utilization target of 0.8",
        ] {
            assert!(help.contains(words), "{words:?} not in {help:?}");
        }
    }
}
