//! A small PKI for TLS with client certificates: a CA, a server certificate and a client certificate it signs, as
//! PEM files (the KEDA scaler's tests: `--keda-tls-cert`/`--keda-client-ca` on the server, the client pair as a
//! TriggerAuthentication would carry it).
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
    IsCa, KeyPair,
};

/// The files written.
pub struct Pki {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

/// Writes the CA, a server certificate for `server_names` (DNS names or IP addresses) and a client certificate
/// into `dir`.
pub fn pki(dir: &Path, server_names: &[&str]) -> Pki {
    build(dir, server_names, false)
}

/// As [`pki`], but the server certificate is a client certificate too: for peers that dial each other with the one
/// certificate in their `--cert-dir` (KEDA's operator and its metrics adapter).
#[allow(dead_code)]
pub fn peer_pki(dir: &Path, server_names: &[&str]) -> Pki {
    build(dir, server_names, true)
}

fn build(dir: &Path, server_names: &[&str], server_is_client: bool) -> Pki {
    // Each its own subject: a certificate whose subject equals its issuer's reads as self-signed to OpenSSL.
    let named = |cn: &str| {
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        dn
    };
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.distinguished_name = named("tessera test CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let names: Vec<String> = server_names.iter().map(|s| (*s).to_owned()).collect();
    let mut server = CertificateParams::new(names).unwrap();
    server.distinguished_name = named(server_names.first().copied().unwrap_or("server"));
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    if server_is_client {
        server
            .extended_key_usages
            .push(ExtendedKeyUsagePurpose::ClientAuth);
    }
    let server_key = KeyPair::generate().unwrap();
    let server_cert = server.signed_by(&server_key, &ca).unwrap();
    let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
    client.distinguished_name = named("keda-operator");
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client_key = KeyPair::generate().unwrap();
    let client_cert = client.signed_by(&client_key, &ca).unwrap();
    let write = |name: &str, pem: String| {
        let p = dir.join(name);
        std::fs::write(&p, pem).unwrap();
        p
    };
    Pki {
        ca: write("ca.crt", ca.pem()),
        server_cert: write("tls.crt", server_cert.pem()),
        server_key: write("tls.key", server_key.serialize_pem()),
        client_cert: write("client.crt", client_cert.pem()),
        client_key: write("client.key", client_key.serialize_pem()),
    }
}
