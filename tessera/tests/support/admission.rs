//! Talking to `tessera webhook` as the API server does: a self-signed certificate, a TLS client that trusts only
//! it, one HTTP/1.1 exchange at a time on a kept-alive connection, and a real pod's `AdmissionReview`.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// A self-signed certificate for `localhost`, as PEM files want it and as a client trusts it.
pub struct Pair {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: CertificateDer<'static>,
}

/// A fresh certificate and key (`rcgen`).
pub fn pair() -> Pair {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    Pair {
        cert_pem: ck.cert.pem(),
        key_pem: ck.signing_key.serialize_pem(),
        der: ck.cert.der().clone(),
    }
}

/// `tessera webhook --no-kube` serving TLS with `pair` (written into `dir` as `tls.crt` and `tls.key`) and its
/// metrics on `metrics_listen`; `extra` adds flags.
pub fn start_webhook(dir: &Path, pair: &Pair, metrics_listen: &str, extra: &[&str]) -> super::Tessera {
    let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&cert, &pair.cert_pem).expect("write the certificate");
    std::fs::write(&key, &pair.key_pem).expect("write the key");
    let mut args = vec![
        "webhook",
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        metrics_listen,
        "--tls-cert",
        cert.to_str().expect("a UTF-8 path"),
        "--tls-key",
        key.to_str().expect("a UTF-8 path"),
        "--no-kube",
    ];
    args.extend_from_slice(extra);
    super::Tessera::start(&args)
}

/// A TLS client trusting only `trusted`.
pub fn connector(trusted: &[&CertificateDer<'static>]) -> TlsConnector {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for c in trusted {
        roots.add((*c).clone()).unwrap();
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    TlsConnector::from(Arc::new(config))
}

/// A TLS connection to `addr` as `localhost`.
pub async fn connect(tls: &TlsConnector, addr: std::net::SocketAddr) -> TlsStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    tls.connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap()
}

/// The certificate the server presented.
pub fn peer(stream: &TlsStream<TcpStream>) -> CertificateDer<'static> {
    stream.get_ref().1.peer_certificates().unwrap()[0]
        .clone()
        .into_owned()
}

/// One HTTP/1.1 exchange on a kept-alive connection: (status, body).
pub async fn exchange(
    stream: &mut TlsStream<TcpStream>,
    method: &str,
    path: &str,
    body: &[u8],
) -> (u16, Vec<u8>) {
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    stream.flush().await.unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16384];
    let (status, len, start) = loop {
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "connection closed before the response headers");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let headers = String::from_utf8_lossy(&buf[..end]).to_string();
            let status: u16 = headers.split(' ').nth(1).unwrap().parse().unwrap();
            let len: usize = headers
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().unwrap())
                })
                .expect("content-length");
            break (status, len, end + 4);
        }
    };
    while buf.len() < start + len {
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "connection closed mid-body");
        buf.extend_from_slice(&chunk[..n]);
    }
    (status, buf[start..start + len].to_vec())
}

/// An `AdmissionReview` of a CREATE of `pod`, as the API server sends it.
pub fn review(uid: &str, pod: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"},
                    "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
                    "requestResource": {"group": "", "version": "v1", "resource": "pods"},
                    "namespace": "default", "operation": "CREATE",
                    "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller",
                                 "groups": ["system:serviceaccounts", "system:authenticated"]},
                    "object": pod, "oldObject": null, "dryRun": false,
                    "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}}
    }))
    .unwrap()
}

/// A real pod spec (`testdata/pods/production-stack-llama3.yaml`, with its provenance there).
pub fn real_pod() -> Value {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/pods/production-stack-llama3.yaml"),
    )
    .unwrap();
    serde_yaml::from_str(&text).unwrap()
}
