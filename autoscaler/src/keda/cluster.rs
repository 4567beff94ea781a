//! The scaler's source in a cluster: every autoscaler replica's own watch of the InferenceAutoscalers (the
//! leader's decisions, in their status) and its own activator poll (the requests held right now).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use kube::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use tessera_core::keda::{ModelRef, Published};
use tessera_core::scale::inputs::demand_from;
use tokio::sync::{broadcast, watch};
use tracing::warn;

use super::published::{activator_keys, published_of};
use crate::controller::signals::ActivatorPoller;
use crate::crd::InferenceAutoscaler;

/// Reads a model's published decision from the watch and its held requests from the activator poll.
#[derive(Debug, Clone)]
pub struct ClusterSource {
    store: Store<InferenceAutoscaler>,
    activators: ActivatorPoller,
    activator_max_age: Duration,
    changes: broadcast::Sender<ModelRef>,
}

impl ClusterSource {
    /// Starts watching `api` and following `activators`' wake-ups until `stop`; the watch retries with backoff
    /// on errors (a model it has not seen yet is `NOT_FOUND`, never a zero).
    pub fn start(
        api: Api<InferenceAutoscaler>,
        activators: ActivatorPoller,
        activator_max_age: Duration,
        stop: watch::Receiver<bool>,
    ) -> Arc<Self> {
        let (store, stream) = crate::kube_client::reflect(api);
        let (changes, _) = broadcast::channel(1024);
        let source = Arc::new(Self {
            store,
            activators: activators.clone(),
            activator_max_age,
            changes: changes.clone(),
        });
        // The watch: every applied object may carry a new decision.
        let mut stop_watch = stop.clone();
        let tx = changes.clone();
        tokio::spawn(async move {
            futures::pin_mut!(stream);
            loop {
                tokio::select! {
                    next = stream.next() => match next {
                        Some(Ok(ia)) => { let _ = tx.send(model_ref(&ia)); }
                        Some(Err(e)) => warn!(error = %e, "KEDA scaler: watching InferenceAutoscalers failed; retrying"),
                        None => return,
                    },
                    _ = stop_watch.wait_for(|s| *s) => return,
                }
            }
        });
        // Held requests: the activator poll's wake-ups name `namespace/model`; a push stream re-reads at once.
        let mut wakes = activators.subscribe();
        let (store, tx, mut stop_wakes) = (source.store.clone(), changes, stop);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    key = wakes.recv() => match key {
                        Ok(key) => {
                            for r in crate::controller::reconcile::objects_for_model(&store.state(), &key) {
                                let _ = tx.send(ModelRef {
                                    namespace: r.namespace.unwrap_or_default(),
                                    name: r.name,
                                });
                            }
                        }
                        Err(broadcast::error::RecvError::Lagged(_)) => {}
                        Err(broadcast::error::RecvError::Closed) => return,
                    },
                    _ = stop_wakes.wait_for(|s| *s) => return,
                }
            }
        });
        source
    }
}

fn model_ref(ia: &InferenceAutoscaler) -> ModelRef {
    use kube::ResourceExt;
    ModelRef {
        namespace: ia.namespace().unwrap_or_default(),
        name: ia.name_any(),
    }
}

impl tessera_keda::Source for ClusterSource {
    fn published(&self, model: &ModelRef) -> Option<Published> {
        let ia = self
            .store
            .get(&ObjectRef::new(&model.name).within(&model.namespace))?;
        let demand = demand_from(
            &self.activators.samples(),
            &activator_keys(&ia),
            crate::unix_ms(SystemTime::now()),
            self.activator_max_age,
        );
        Some(published_of(&ia, demand.queued_at_activator))
    }

    fn changes(&self) -> broadcast::Receiver<ModelRef> {
        self.changes.subscribe()
    }
}
