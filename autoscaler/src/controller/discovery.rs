//! Finding every activator pod: the EndpointSlices of `--activator-service NAMESPACE/NAME`.
//!
//! Behind a Service each request reaches one activator pod, so each pod's stats describe only its share of the
//! traffic; polling the Service address would read one random pod per poll and miss the others' requests. The
//! controller therefore watches the Service's EndpointSlices (label `kubernetes.io/service-name`) and polls every
//! serving endpoint directly. An endpoint that is not serving (starting, or draining after SIGTERM) gets no new
//! requests and is left out.
//!
//! The stats are read on each pod's admin listener (the activator's `--admin-listen`), never on the public port
//! the Service's clients use: the slice's port named `admin` (the chart's admin Service), else
//! [`DEFAULT_ACTIVATOR_ADMIN_PORT`] on the endpoint's address. The public port does not serve the stats, so a
//! slice's other ports are never a fallback.

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client};
use tracing::{info, warn};

use super::signals::ActivatorPoller;

/// The port the activator serves its stats on when the slice has no port named [`ADMIN_PORT_NAME`]: the
/// activator's default `--admin-listen` port.
pub const DEFAULT_ACTIVATOR_ADMIN_PORT: i32 = tessera_core::wire::activator::DEFAULT_ADMIN_PORT as i32;

/// The EndpointSlice port name of the activator's admin listener.
pub const ADMIN_PORT_NAME: &str = "admin";

/// Parses `NAMESPACE/NAME`.
pub fn parse_service(s: &str) -> Result<(String, String), String> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_owned(), name.to_owned()))
        }
        _ => Err(format!(
            "{s:?} is not NAMESPACE/NAME (e.g. tessera/tessera-activator)"
        )),
    }
}

/// Every serving endpoint of the slices: target name (the pod's name, else its address) → base URL of its admin
/// listener. The port is the slice's port named [`ADMIN_PORT_NAME`], else [`DEFAULT_ACTIVATOR_ADMIN_PORT`].
pub fn targets_from_slices<'a>(
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for slice in slices {
        let ports = slice.ports.as_deref().unwrap_or_default();
        let port = ports
            .iter()
            .find(|p| p.name.as_deref() == Some(ADMIN_PORT_NAME))
            .and_then(|p| p.port)
            .unwrap_or(DEFAULT_ACTIVATOR_ADMIN_PORT);
        for ep in slice.endpoints.as_deref().unwrap_or_default() {
            // Kubernetes: a nil condition means "unknown", which consumers should read as true.
            let conditions = ep.conditions.as_ref();
            let serving = conditions.and_then(|c| c.serving.or(c.ready)).unwrap_or(true);
            if !serving {
                continue;
            }
            let Some(addr) = ep.addresses.first() else {
                continue;
            };
            let host = if addr.contains(':') {
                format!("[{addr}]")
            } else {
                addr.clone()
            };
            let name = ep
                .target_ref
                .as_ref()
                .and_then(|r| r.name.clone())
                .unwrap_or_else(|| addr.clone());
            out.insert(name, format!("http://{host}:{port}"));
        }
    }
    out
}

/// Watches the Service's EndpointSlices and keeps `poller`'s targets equal to its serving endpoints, until the
/// stream ends (never, short of the process stopping). Watch errors back off and retry.
pub async fn follow_service(client: Client, namespace: String, service: String, poller: ActivatorPoller) {
    let api: Api<EndpointSlice> = Api::namespaced(client, &namespace);
    let config =
        super::super::kube_client::watcher_config().labels(&format!("kubernetes.io/service-name={service}"));
    let (reader, writer) = reflector::store();
    let mut stream = reflector(writer, watcher(api, config).default_backoff()).boxed();
    let mut last: Option<BTreeMap<String, String>> = None;
    while let Some(event) = stream.next().await {
        if let Err(e) = event {
            warn!(error = %e, %namespace, %service, "watching the activator's EndpointSlices failed; retrying");
            continue;
        }
        let slices = reader.state();
        let targets = targets_from_slices(slices.iter().map(|s| s.as_ref()));
        if last.as_ref() != Some(&targets) {
            info!(
                service = %format!("{namespace}/{service}"),
                pods = ?targets.keys().collect::<Vec<_>>(),
                slices = slices.len(),
                "activator pods"
            );
            poller.set_targets(targets.clone());
            last = Some(targets);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn slice(v: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn serving_endpoints_become_targets() {
        let a = slice(json!({
            "metadata": {"name": "act-abc", "namespace": "tessera",
                         "labels": {"kubernetes.io/service-name": "tessera-activator"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080}, {"name": "admin", "port": 9191}],
            "endpoints": [
                {"addresses": ["10.0.0.1"], "conditions": {"ready": true}, "targetRef": {"kind": "Pod", "name": "act-1"}},
                {"addresses": ["10.0.0.2"], "conditions": {"ready": false, "serving": false}, "targetRef": {"kind": "Pod", "name": "act-2"}},
                {"addresses": ["10.0.0.3"], "targetRef": {"kind": "Pod", "name": "act-3"}},
                {"addresses": [], "conditions": {"ready": true}}
            ]
        }));
        let b = slice(json!({
            // The public port alone (a Service of the API only): the admin listener's default port, never 8080.
            "metadata": {"name": "act-v6"}, "addressType": "IPv6", "ports": [{"name": "http", "port": 8080}],
            "endpoints": [{"addresses": ["fd00::4"], "conditions": {"ready": true}}]
        }));
        let t = targets_from_slices([&a, &b]);
        assert_eq!(
            t,
            BTreeMap::from([
                ("act-1".to_owned(), "http://10.0.0.1:9191".to_owned()),
                ("act-3".to_owned(), "http://10.0.0.3:9191".to_owned()),
                ("fd00::4".to_owned(), "http://[fd00::4]:9090".to_owned()),
            ])
        );
    }

    #[test]
    fn service_flag() {
        assert_eq!(
            parse_service("tessera/tessera-activator").unwrap(),
            ("tessera".to_owned(), "tessera-activator".to_owned())
        );
        for bad in ["tessera", "/x", "x/", "a/b/c"] {
            assert!(parse_service(bad).is_err(), "{bad}");
        }
    }
}
