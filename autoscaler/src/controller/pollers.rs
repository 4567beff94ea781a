//! The reads every replica keeps running in the background: the HTTP client for sidecars (with the objective
//! key for hand-overs), and the activators — found through `--activator-service`'s EndpointSlices or given as
//! `--activator-url`s — polled every `--activator-poll-interval`.

use std::sync::Arc;
use std::time::SystemTime;

use anyhow::Context as _;
use tokio::sync::watch;
use tracing::warn;

use super::Args;
use super::discovery;
use super::metrics::Metrics;
use super::signals::{ActivatorPoller, HttpSignals, SignalSource};

/// The sidecars' and activators' HTTP client, bounded by `--scrape-timeout` and `--max-document-size`.
pub(super) fn signal_source(args: &Args) -> anyhow::Result<Arc<dyn SignalSource>> {
    let objective_key = match &args.objective_key_file {
        Some(path) => Some(tessera_runtime::token::ObjectiveKey::from_file(path)?),
        None => {
            warn!(
                "no --objective-key-file: latency objectives are not handed to running sidecars (they refuse a \
                 hand-over without their namespace's token); spec edits reach pods as they are recreated"
            );
            None
        }
    };
    Ok(Arc::new(
        HttpSignals::new(args.scrape_timeout, args.max_document_size)
            .context("building the HTTP client for sidecars")?
            .with_objective_key(objective_key),
    ))
}

/// Starts following the activators and polling them; returns the poller the reconcile reads demand from.
pub(super) fn start(
    args: &Args,
    client: &kube::Client,
    source: Arc<dyn SignalSource>,
    metrics: Arc<Metrics>,
    shutdown_rx: watch::Receiver<bool>,
) -> anyhow::Result<ActivatorPoller> {
    let activators = ActivatorPoller::new(&args.activator_urls);
    match &args.activator_service {
        Some((ns, name)) => {
            if !args.activator_urls.is_empty() {
                anyhow::bail!(
                    "--activator-service and --activator-url are exclusive: the Service's pods are the activators"
                );
            }
            tokio::spawn(discovery::follow_service(
                client.clone(),
                ns.clone(),
                name.clone(),
                activators.clone(),
            ));
        }
        None if args.activator_urls.is_empty() => warn!(
            "neither --activator-service nor --activator-url: models will not be scaled to zero and \
             requestsPerSecondPerReplica has no data"
        ),
        None => {}
    }
    tokio::spawn(activators.clone().run(
        source,
        metrics,
        args.activator_poll_interval,
        args.activator_max_age,
        SystemTime::now,
        shutdown_rx,
    ));
    Ok(activators)
}
