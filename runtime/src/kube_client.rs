//! The one way every role builds its Kubernetes client: explicit connect, read and write timeouts.
//!
//! kube's defaults (30 s connect, 295 s read, 295 s write) let one hung request hold a caller for five minutes —
//! a leader renewing its Lease, a reconcile writing `/scale`. With a read timeout shorter than a watch's
//! server-side timeout, an idle watch would be cut and re-listed, so every watch built on this client uses
//! [`watcher_config`], whose server-side timeout ends the watch cleanly before the read timeout fires.
//! Calls that must finish by a deadline (the Lease) still bound themselves with `tokio::time::timeout`.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, Config};

/// Connect timeout: an API server that does not accept a TCP/TLS connection within this is down or partitioned.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Read timeout between bytes of an answer. Watches are closed by the server before this (see [`WATCH_TIMEOUT_SECS`]).
pub const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Write timeout for a request body.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(15);
/// Server-side watch timeout: shorter than [`READ_TIMEOUT`], so an idle watch ends cleanly and is resumed from its
/// resourceVersion instead of being cut by the client.
pub const WATCH_TIMEOUT_SECS: u32 = 50;

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No in-cluster config and no usable kubeconfig.
    #[error("finding the Kubernetes API (in-cluster config or KUBECONFIG): {0}")]
    Infer(#[from] kube::config::InferConfigError),
    /// The config was found but the client could not be built (TLS, proxy).
    #[error("building the Kubernetes client: {0}")]
    Build(#[from] kube::Error),
}

/// Sets this module's timeouts on a config.
pub fn with_timeouts(mut config: Config) -> Config {
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.read_timeout = Some(READ_TIMEOUT);
    config.write_timeout = Some(WRITE_TIMEOUT);
    config
}

/// A client from the in-cluster config or KUBECONFIG, with [`with_timeouts`].
pub async fn client() -> Result<Client, Error> {
    let config = with_timeouts(Config::infer().await?);
    Ok(Client::try_from(config)?)
}

/// Unix milliseconds as the `MicroTime` a Lease's `acquireTime`/`renewTime` carries (the epoch if out of range).
pub fn micro_time(unix_ms: u64) -> MicroTime {
    let ts = i64::try_from(unix_ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    MicroTime(ts)
}

/// A new Lease `name` held by `holder` from `now_ms` for `duration_secs` (acquired and renewed now, no transitions
/// yet): what a role creates when no lease exists.
pub fn new_lease(
    name: &str,
    holder: &str,
    duration_secs: i32,
    now_ms: u64,
) -> k8s_openapi::api::coordination::v1::Lease {
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    Lease {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.to_owned()),
            lease_duration_seconds: Some(duration_secs),
            acquire_time: Some(micro_time(now_ms)),
            renew_time: Some(micro_time(now_ms)),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        }),
    }
}

/// What the Lease rule (`tessera_core::lease`) reads of `lease`: its holder, its duration (`default` when unset or
/// out of range) and its resourceVersion — the arguments of `LeaseObservation::observe` after the previous one.
pub fn lease_facts(
    lease: &k8s_openapi::api::coordination::v1::Lease,
    default: std::time::Duration,
) -> (Option<String>, std::time::Duration, String) {
    let spec = lease.spec.as_ref();
    (
        spec.and_then(|s| s.holder_identity.clone()),
        spec.and_then(|s| s.lease_duration_seconds)
            .and_then(|s| u64::try_from(s).ok())
            .map_or(default, std::time::Duration::from_secs),
        lease.metadata.resource_version.clone().unwrap_or_default(),
    )
}

/// Marks `lease` held by `holder` at `now_ms` for `duration_secs`: a renewal when `holder` already holds it, an
/// acquisition otherwise (holder, acquire time, one more transition). Returns whether it was an acquisition. What
/// leader election, the start-up gate and the pool manager's eviction write before their guarded replace.
pub fn hold_lease(
    lease: &mut k8s_openapi::api::coordination::v1::Lease,
    holder: &str,
    duration_secs: i32,
    now_ms: u64,
) -> bool {
    let spec = lease.spec.get_or_insert_default();
    let acquired = spec.holder_identity.as_deref() != Some(holder);
    if acquired {
        spec.holder_identity = Some(holder.to_owned());
        spec.acquire_time = Some(micro_time(now_ms));
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
    }
    spec.renew_time = Some(micro_time(now_ms));
    spec.lease_duration_seconds = Some(duration_secs);
    acquired
}

/// Gives `lease` up if `holder` holds it: the holder cleared and a 1 s duration, so the next candidate takes it at
/// its next read rather than after the full duration. Returns `false` (and changes nothing) when `holder` does not
/// hold it.
pub fn give_up_lease(lease: &mut k8s_openapi::api::coordination::v1::Lease, holder: &str) -> bool {
    let spec = lease.spec.get_or_insert_default();
    if spec.holder_identity.as_deref() != Some(holder) {
        return false;
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    true
}

/// The watcher config every watch on a [`client`] uses (server-side timeout below the read timeout).
pub fn watcher_config() -> watcher::Config {
    watcher::Config::default().timeout(WATCH_TIMEOUT_SECS)
}

/// A cache of `api`'s objects: the store, and the watch (on [`watcher_config`], retried with backoff) that fills
/// it. The watch does nothing until its stream is polled; it yields each object applied, or the error of a try.
pub fn reflect<K>(
    api: kube::Api<K>,
) -> (
    reflector::Store<K>,
    impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    reflect_modified(api, |_| {})
}

/// [`reflect`], each object passed through `modify` before it is stored (to drop fields nothing reads).
pub fn reflect_modified<K>(
    api: kube::Api<K>,
    modify: impl FnMut(&mut K) + Send + 'static,
) -> (
    reflector::Store<K>,
    impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (reader, writer) = reflector::store();
    let stream = watcher(api, watcher_config())
        .default_backoff()
        .modify(modify)
        .reflect(writer)
        .applied_objects();
    (reader, stream)
}

/// A watched cache that answers only once its first list is in: until then (or where the watch never starts, for
/// want of RBAC) [`Cached::store`] is `None`, so a cache that cannot answer never stands in for an empty one.
pub struct Cached<K: kube::Resource + 'static>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store: std::sync::Arc<std::sync::RwLock<Option<reflector::Store<K>>>>,
}

impl<K: kube::Resource + 'static> std::fmt::Debug for Cached<K>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ready = self.store.read().is_ok_and(|s| s.is_some());
        f.debug_struct("Cached").field("ready", &ready).finish()
    }
}

impl<K: kube::Resource + 'static> Clone for Cached<K>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
        }
    }
}

impl<K: kube::Resource + 'static> Default for Cached<K>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    fn default() -> Self {
        Self {
            store: std::sync::Arc::default(),
        }
    }
}

impl<K> Cached<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    /// Watches `api` until `stop` (objects passed through `modify` before they are stored); a failed try is logged
    /// at debug naming `what` and retried with backoff.
    pub fn start(
        api: kube::Api<K>,
        what: &'static str,
        modify: impl FnMut(&mut K) + Send + 'static,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> Self {
        use futures::StreamExt;
        let cache = Self::default();
        let (reader, stream) = reflect_modified(api, modify);
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            loop {
                tokio::select! {
                    next = stream.next() => match next {
                        Some(Ok(_)) => {}
                        Some(Err(e)) => tracing::debug!(error = %e, "watching {what} failed; retrying"),
                        None => return,
                    },
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        });
        let published = cache.store.clone();
        tokio::spawn(async move {
            if reader.wait_until_ready().await.is_ok()
                && let Ok(mut s) = published.write()
            {
                *s = Some(reader);
            }
        });
        cache
    }
}

impl<K: kube::Resource + 'static> Cached<K>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    /// A cache over a store someone else fills (a test's, or a caller's own watch), answering at once.
    pub fn of(store: reflector::Store<K>) -> Self {
        Self {
            store: std::sync::Arc::new(std::sync::RwLock::new(Some(store))),
        }
    }

    /// The store, once its first list is in.
    pub fn store(&self) -> Option<reflector::Store<K>> {
        self.store.read().ok()?.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_ends_before_the_read_timeout_cuts_it() {
        assert!(Duration::from_secs(u64::from(WATCH_TIMEOUT_SECS)) + Duration::from_secs(5) < READ_TIMEOUT);
        let c = with_timeouts(Config::new("http://127.0.0.1:1".parse().unwrap_or_default()));
        assert_eq!(
            (c.connect_timeout, c.read_timeout, c.write_timeout),
            (Some(CONNECT_TIMEOUT), Some(READ_TIMEOUT), Some(WRITE_TIMEOUT))
        );
        assert_eq!(watcher_config().timeout, Some(WATCH_TIMEOUT_SECS));
    }
}
