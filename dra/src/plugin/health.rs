//! The plugin's `/live` and `/ready` on `--health-listen`, for the DaemonSet's probes and a person asking why a
//! node starts no fractional replica: ready once the kubelet has accepted the registration and the node's slice
//! has been published at least once (or `--no-publish`), each not-yet answered with what is missing.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::PluginError;
use super::service::Registered;

/// What readiness reads: the kubelet's word on the registration, and the slice's first publication.
#[derive(Debug)]
pub struct Health {
    registration: watch::Receiver<Registered>,
    /// `None` until the first attempt; `Some(Ok)` once published; an error only while never published.
    published: Mutex<Option<Result<(), String>>>,
}

impl Health {
    /// Readiness over `registration`; `publishing: false` (`--no-publish`) counts the slice as someone else's.
    pub fn new(registration: watch::Receiver<Registered>, publishing: bool) -> Arc<Self> {
        Arc::new(Self {
            registration,
            published: Mutex::new((!publishing).then_some(Ok(()))),
        })
    }

    /// The outcome of one publication: once published, a later failure leaves the slice there (still ready).
    pub fn published(&self, outcome: Result<(), String>) {
        if let Ok(mut p) = self.published.lock()
            && !matches!(*p, Some(Ok(())))
        {
            *p = Some(outcome);
        }
    }

    /// `Ok` when ready, else what is missing.
    pub fn ready(&self) -> Result<(), String> {
        match &*self.registration.borrow() {
            None => return Err("the kubelet has not confirmed the registration yet".into()),
            Some(Err(e)) => return Err(format!("the kubelet refused the registration: {e}")),
            Some(Ok(())) => {}
        }
        match self.published.lock().map(|p| p.clone()) {
            Ok(Some(Ok(()))) => Ok(()),
            Ok(None) => Err("the node's ResourceSlice: first publication in flight".into()),
            Ok(Some(Err(e))) => Err(format!("the node's ResourceSlice is not published: {e}")),
            Err(_) => Err("state lock poisoned".into()),
        }
    }
}

/// Serves `/live` and `/ready` on `addr` until `stop`.
pub async fn serve(
    addr: SocketAddr,
    health: Arc<Health>,
    stop: CancellationToken,
) -> Result<(), PluginError> {
    let listener = TcpListener::bind(addr).await.map_err(|e| PluginError::Serve {
        path: addr.to_string().into(),
        detail: format!("cannot listen for the health probes: {e}"),
    })?;
    let app = Router::new()
        .route("/live", get(|| async { "ok\n" }))
        .route("/ready", get(ready))
        .with_state(health);
    tessera_runtime::serve::serve(
        listener,
        app,
        tessera_runtime::serve::ConnLimits::default(),
        stop.cancelled_owned(),
    )
    .await;
    Ok(())
}

async fn ready(State(h): State<Arc<Health>>) -> (StatusCode, String) {
    match h.ready() {
        Ok(()) => (StatusCode::OK, "ok\n".into()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_once_registered_and_published_and_a_later_failure_keeps_it() {
        let (tx, rx) = watch::channel::<Registered>(None);
        let h = Health::new(rx, true);
        assert!(h.ready().expect_err("not ready").contains("registration"));
        tx.send_replace(Some(Err("version".into())));
        assert!(
            h.ready()
                .expect_err("not ready")
                .contains("refused the registration: version")
        );
        tx.send_replace(Some(Ok(())));
        assert!(h.ready().expect_err("not ready").contains("in flight"));
        h.published(Err("forbidden".into()));
        assert!(h.ready().expect_err("not ready").contains("forbidden"));
        h.published(Ok(()));
        assert_eq!(h.ready(), Ok(()));
        h.published(Err("timeout".into()));
        assert_eq!(h.ready(), Ok(()), "the slice published once is still there");
        let (_tx, rx) = watch::channel::<Registered>(Some(Ok(())));
        assert_eq!(
            Health::new(rx, false).ready(),
            Ok(()),
            "--no-publish: the slice is not ours"
        );
    }
}
