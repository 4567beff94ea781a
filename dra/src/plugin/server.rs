//! The plugin's two unix sockets and the gRPC servers on them, and a client channel to either (what the tests and
//! a person debugging a node dial).
//!
//! The DRA socket is bound first and the registration socket last: the kubelet's plugin watcher dials the
//! endpoint as soon as it sees the registration socket appear. On stop the registration socket goes first (the
//! watcher then deregisters the plugin), then the DRA socket. A socket file left by a previous run is replaced;
//! any other file at that path is an error, never deleted.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint, Server};
use tracing::{info, warn};

use super::PluginError;
use super::pb::dra::dra_plugin_server::DraPluginServer;
use super::pb::registration::registration_server::RegistrationServer;
use super::prepare::Driver;
use super::service::{DraService, Registered, RegistrationService};
use super::source::ClaimSource;
use crate::DRIVER;

/// The DRA socket's file name in the plugin directory.
pub const DRA_SOCKET: &str = "dra.sock";
/// The bound on one call; the kubelet gives up after 45 s and asks again.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Calls served at once on one connection (the kubelet uses one).
pub const CALLS_PER_CONNECTION: usize = 16;

/// The registration socket's path in the kubelet's registry directory: `<driver>-reg.sock`.
pub fn registration_socket(registry_dir: &Path) -> PathBuf {
    registry_dir.join(format!("{DRIVER}-reg.sock"))
}

/// The DRA socket's path in the plugin directory.
pub fn dra_socket(plugin_dir: &Path) -> PathBuf {
    plugin_dir.join(DRA_SOCKET)
}

/// The running servers.
#[derive(Debug)]
pub struct Servers {
    /// What the kubelet last said of the registration.
    pub registration: watch::Receiver<Registered>,
    task: JoinHandle<Result<(), PluginError>>,
}

impl Servers {
    /// Waits until both servers stopped (the stop token was cancelled) and their sockets are removed.
    pub async fn wait(self) -> Result<(), PluginError> {
        self.task.await.unwrap_or_else(|e| {
            Err(PluginError::Serve {
                path: PathBuf::new(),
                detail: format!("server task: {e}"),
            })
        })
    }
}

/// Serves `driver` on `dra` and the registration service on `registration` until `stop` is cancelled.
pub async fn start<S: ClaimSource>(
    driver: Arc<Driver<S>>,
    dra: PathBuf,
    registration: PathBuf,
    stop: CancellationToken,
) -> Result<Servers, PluginError> {
    let dra_listener = bind(&dra)?;
    // The kubelet dials the endpoint as given: a relative path would be relative to the kubelet's directory.
    let endpoint = std::path::absolute(&dra).unwrap_or_else(|_| dra.clone());
    let reg_service = RegistrationService::new(endpoint.display().to_string());
    let status = reg_service.status();
    let reg_listener = bind(&registration)?;
    info!(dra = %dra.display(), registration = %registration.display(), driver = DRIVER, "kubelet plugin serving");

    let (reg_stop, dra_stop) = (CancellationToken::new(), CancellationToken::new());
    let dra_server = Server::builder()
        .timeout(CALL_TIMEOUT)
        .concurrency_limit_per_connection(CALLS_PER_CONNECTION)
        .add_service(DraPluginServer::new(DraService::new(driver)))
        .serve_with_incoming_shutdown(incoming(dra_listener), dra_stop.clone().cancelled_owned());
    let reg_server = Server::builder()
        .timeout(CALL_TIMEOUT)
        .add_service(RegistrationServer::new(reg_service))
        .serve_with_incoming_shutdown(incoming(reg_listener), reg_stop.clone().cancelled_owned());
    let task = tokio::spawn(async move {
        let dra_task = tokio::spawn(dra_server);
        let reg_task = tokio::spawn(reg_server);
        stop.cancelled().await;
        // The registration socket first: the kubelet stops sending calls before the DRA socket goes.
        reg_stop.cancel();
        let reg = reg_task.await;
        remove_socket(&registration);
        dra_stop.cancel();
        let dra_result = dra_task.await;
        remove_socket(&dra);
        info!("kubelet plugin stopped");
        joined(&registration, reg)?;
        joined(&dra, dra_result)
    });
    Ok(Servers {
        registration: status,
        task,
    })
}

fn joined(
    path: &Path,
    r: Result<Result<(), tonic::transport::Error>, tokio::task::JoinError>,
) -> Result<(), PluginError> {
    let detail = match r {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(e)) => e.to_string(),
        Err(e) => e.to_string(),
    };
    Err(PluginError::Serve {
        path: path.into(),
        detail,
    })
}

/// Binds a unix socket at `path`, replacing a stale socket (never another kind of file).
fn bind(path: &Path) -> Result<UnixListener, PluginError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(PluginError::io("socket directory", dir))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(PluginError::io("stale socket", path))?;
        }
        Ok(_) => {
            return Err(PluginError::io("socket", path)(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "a file that is not a socket is in the way",
            )));
        }
        Err(_) => {}
    }
    UnixListener::bind(path).map_err(PluginError::io("socket", path))
}

fn remove_socket(path: &Path) {
    if let Err(e) = std::fs::remove_file(path)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        warn!(socket = %path.display(), error = %e, "cannot remove socket");
    }
}

/// The listener's connections; a failed accept (out of file descriptors) is retried after a pause, not spun on.
fn incoming(listener: UnixListener) -> impl Stream<Item = std::io::Result<UnixStream>> {
    futures::stream::unfold(listener, |l| async move {
        let r = l.accept().await.map(|(s, _)| s);
        if let Err(e) = &r {
            warn!(error = %e, "accept on a plugin socket failed");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Some((r, l))
    })
}

/// A gRPC channel to the unix socket at `path` (connected on first use, as the kubelet's is).
pub fn channel(path: &Path) -> Channel {
    let path = path.to_path_buf();
    // The URI is required by the API and ignored: every connection goes to the socket.
    Endpoint::from_static("http://localhost").connect_with_connector_lazy(tower::service_fn(move |_| {
        let path = path.clone();
        async move { UnixStream::connect(path).await.map(hyper_util::rt::TokioIo::new) }
    }))
}
