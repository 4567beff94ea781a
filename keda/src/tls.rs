//! The scaler's TLS: the server certificate (the chart's, the webhook's issuer), HTTP/2 by ALPN (gRPC clients
//! refuse a TLS server that does not offer `h2`), and, with a client CA, client certificates required — the
//! certificate KEDA presents from the `TriggerAuthentication` (`tlsClientCert`/`tlsClientKey`, `caCert`).
//!
//! Files are re-read when they change ([`Reloading`]), so a rotated certificate applies to the next connection.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tracing::{info, warn};

/// Why the TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or holds no PEM item of the kind needed.
    #[error("{what} {path}: {source}")]
    Pem {
        /// What the file should hold.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why it failed.
        source: rustls::pki_types::pem::Error,
    },
    /// rustls refused the pair or the CA.
    #[error("the TLS configuration is invalid: {0}")]
    Config(String),
}

/// The files of the scaler's TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
    /// PEM CA whose client certificates are accepted; `None`: no client certificate is asked for.
    pub client_ca: Option<PathBuf>,
}

fn pem_err(what: &'static str, path: &Path) -> impl FnOnce(rustls::pki_types::pem::Error) -> TlsError {
    let path = path.to_owned();
    move |source| TlsError::Pem { what, path, source }
}

/// Builds the server configuration from `files`.
pub fn server_config(files: &TlsFiles) -> Result<ServerConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(pem_err("the certificate chain", &files.cert))?;
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(pem_err("the private key", &files.key))?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(ca).map_err(pem_err("the client CA", ca))? {
                roots
                    .add(cert.map_err(pem_err("the client CA", ca))?)
                    .map_err(|e| TlsError::Config(format!("client CA {}: {e}", ca.display())))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::Config(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// A server configuration that follows its files: [`Reloading::current`] is what each handshake uses, and
/// [`Reloading::run`] swaps it when a file's modification time changes and the new files load. A pair that does
/// not load keeps the old one (and says so).
#[derive(Debug, Clone)]
pub struct Reloading {
    files: TlsFiles,
    current: Arc<RwLock<Arc<ServerConfig>>>,
}

impl Reloading {
    /// Loads `files` once; an error here stops the process (a typo should not wait for the first client).
    pub fn new(files: TlsFiles) -> Result<Self, TlsError> {
        let config = server_config(&files)?;
        Ok(Self {
            files,
            current: Arc::new(RwLock::new(Arc::new(config))),
        })
    }

    /// The configuration in force.
    pub fn current(&self) -> Arc<ServerConfig> {
        match self.current.read() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn stamps(&self) -> Vec<Option<SystemTime>> {
        let files = [
            Some(&self.files.cert),
            Some(&self.files.key),
            self.files.client_ca.as_ref(),
        ];
        files
            .into_iter()
            .flatten()
            .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
            .collect()
    }

    /// Re-reads the files every `interval` until `stop` turns true.
    pub async fn run(self, interval: Duration, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut seen = self.stamps();
        loop {
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            let now = self.stamps();
            if now == seen {
                continue;
            }
            seen = now;
            match server_config(&self.files) {
                Ok(c) => {
                    if let Ok(mut cur) = self.current.write() {
                        *cur = Arc::new(c);
                    }
                    info!(cert = %self.files.cert.display(), "KEDA scaler: TLS files reloaded");
                }
                Err(e) => {
                    warn!(error = %e, "KEDA scaler: the new TLS files do not load; keeping the old ones")
                }
            }
        }
    }
}
