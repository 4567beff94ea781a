//! The token that lets the controller, and only the controller, hand a sidecar its latency objective
//! (`PUT /v1/objective`).
//!
//! A sidecar listens on the pod IP, which every pod of the cluster can reach, so the objective cannot be taken
//! from whoever sends it. The autoscaler and the webhook share one secret key (the chart's
//! `<release>-objective-key` Secret). At injection the webhook gives each sidecar its namespace's token,
//! `HMAC-SHA256(key, namespace)`; the controller sends the same token as `Authorization: Bearer …` when it hands
//! an objective over. Why per namespace and not one token for all: a tenant can read its own pods' environment, so
//! what it learns there must open only its own namespace's sidecars, which it can already steer through its own
//! InferenceAutoscaler. The key itself never reaches a tenant's pod.

use std::path::Path;

use subtle::ConstantTimeEq;

/// Shortest key accepted, in bytes: HMAC-SHA256's own output size, so the key is not the weak part.
pub const MIN_KEY_BYTES: usize = 32;

/// Why a key cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The key file cannot be read.
    #[error("cannot read the objective key file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The key is too short to be a secret.
    #[error(
        "the objective key in {path} has {len} bytes (after trimming whitespace); it needs at least {MIN_KEY_BYTES}: \
         generate one with `head -c 48 /dev/urandom | base64` (the chart generates it)"
    )]
    TooShort {
        /// The file.
        path: String,
        /// Its length.
        len: usize,
    },
}

/// The shared secret the objective tokens derive from. Its `Debug` never shows the key.
#[derive(Clone)]
pub struct ObjectiveKey(ring::hmac::Key);

impl std::fmt::Debug for ObjectiveKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ObjectiveKey(..)")
    }
}

/// Two keys are equal when they sign alike (the key bytes are not kept to compare).
impl PartialEq for ObjectiveKey {
    fn eq(&self, other: &Self) -> bool {
        tokens_match(&self.token_for(""), &other.token_for(""))
    }
}

impl ObjectiveKey {
    /// A key from its bytes; refused under [`MIN_KEY_BYTES`] (`what` names the source in the error).
    pub fn from_bytes(bytes: &[u8], what: &str) -> Result<Self, TokenError> {
        let bytes = bytes.trim_ascii();
        if bytes.len() < MIN_KEY_BYTES {
            return Err(TokenError::TooShort {
                path: what.to_owned(),
                len: bytes.len(),
            });
        }
        Ok(Self(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, bytes)))
    }

    /// The key in `path` (a mounted Secret's item). Surrounding whitespace (a trailing newline) is not part of it.
    pub fn from_file(path: &Path) -> Result<Self, TokenError> {
        let bytes = std::fs::read(path).map_err(|source| TokenError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_bytes(&bytes, &path.display().to_string())
    }

    /// The token of `namespace`'s sidecars: lowercase hex of HMAC-SHA256(key, context ‖ namespace). The context
    /// string keeps this key's MACs from meaning anything anywhere else.
    pub fn token_for(&self, namespace: &str) -> String {
        let mut ctx = ring::hmac::Context::with_key(&self.0);
        ctx.update(b"tessera.dev/objective-token/v1\0");
        ctx.update(namespace.as_bytes());
        ctx.sign().as_ref().iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Whether `offered` is `expected`, compared in constant time (the length, 64 hex characters, is no secret).
pub fn tokens_match(offered: &str, expected: &str) -> bool {
    offered.len() == expected.len() && bool::from(offered.as_bytes().ct_eq(expected.as_bytes()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn key(b: u8) -> ObjectiveKey {
        ObjectiveKey::from_bytes(&[b; 40], "test").unwrap()
    }

    #[test]
    fn a_token_opens_its_own_namespace_only() {
        let k = key(7);
        let a = k.token_for("team-a");
        assert_eq!(a.len(), 64);
        assert_eq!(
            a,
            k.token_for("team-a"),
            "deterministic: the webhook and the controller agree"
        );
        assert_ne!(a, k.token_for("team-b"));
        assert_ne!(a, key(8).token_for("team-a"), "another key, another token");
        assert!(tokens_match(&a, &k.token_for("team-a")));
        assert!(!tokens_match(&a, &k.token_for("team-b")));
        assert!(!tokens_match(&a[..63], &a));
        assert!(!tokens_match("", &a));
    }

    #[test]
    fn a_short_key_is_refused_with_how_to_make_one() {
        let e = ObjectiveKey::from_bytes(b"  short\n", "/etc/key")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/etc/key") && e.contains("5 bytes") && e.contains("at least 32"),
            "{e}"
        );
        let p = std::env::temp_dir().join(format!("tessera-objective-key-{}", std::process::id()));
        std::fs::write(&p, format!("{}\n", "x".repeat(40))).unwrap();
        assert_eq!(
            ObjectiveKey::from_file(&p).unwrap().token_for("ns"),
            ObjectiveKey::from_bytes(&[b'x'; 40], "k")
                .unwrap()
                .token_for("ns"),
            "the trailing newline is not part of the key"
        );
        std::fs::remove_file(&p).unwrap();
        assert!(matches!(
            ObjectiveKey::from_file(&p),
            Err(TokenError::Read { .. })
        ));
    }
}
