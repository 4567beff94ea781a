//! What the plugin has prepared, kept across restarts in `checkpoint.json` in its plugin directory (on the node's
//! disk, beside its socket): each prepared claim's answer to the kubelet and its CDI spec. At start the plugin
//! reads it back and rewrites every spec that is missing (the CDI directory, `/var/run/cdi`, is a tmpfs a reboot
//! empties, while the kubelet's own checkpoint still says the claim is prepared and restarts its containers
//! without asking again). A claim prepared again is answered from it without reading the API server; one
//! unprepared leaves it. Written atomically after every change, as the CDI specs are.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::PluginError;
use super::cdi::{self, write_atomic};

/// The format written; a file of another version is refused rather than misread.
pub const VERSION: u32 = 1;
/// The file's name in the plugin directory.
pub const FILE: &str = "checkpoint.json";

/// Every prepared claim of this node, by claim UID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// [`VERSION`].
    pub version: u32,
    /// By claim UID.
    pub claims: BTreeMap<String, PreparedClaim>,
}

impl Default for Checkpoint {
    fn default() -> Self {
        Self {
            version: VERSION,
            claims: BTreeMap::new(),
        }
    }
}

/// One prepared claim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreparedClaim {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// What the kubelet was answered.
    pub devices: Vec<PreparedDevice>,
    /// The CDI spec written for it.
    pub spec: cdi::Spec,
}

/// One device of a prepared claim, as the kubelet's `Device` message carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedDevice {
    /// The claim's requests this device serves.
    pub request_names: Vec<String>,
    /// The slice's pool.
    pub pool: String,
    /// The device.
    pub device: String,
    /// The share's ID on a shared device.
    pub share_id: Option<String>,
    /// The CDI device IDs the runtime applies.
    pub cdi_device_ids: Vec<String>,
}

/// The checkpoint at `path`; none there is an empty one (a first start).
pub fn load(path: &Path) -> Result<Checkpoint, PluginError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Checkpoint::default()),
        Err(e) => return Err(PluginError::io("checkpoint", path)(e)),
    };
    let bad = |detail: String| PluginError::Checkpoint {
        path: path.into(),
        detail,
    };
    let c: Checkpoint = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
    if c.version != VERSION {
        return Err(bad(format!(
            "version {} (this plugin writes {VERSION})",
            c.version
        )));
    }
    Ok(c)
}

/// Writes `c` to `path` atomically.
pub fn store(path: &Path, c: &Checkpoint) -> Result<(), PluginError> {
    let bytes = serde_json::to_vec_pretty(c).map_err(|e| PluginError::io("checkpoint", path)(e.into()))?;
    write_atomic(path, &bytes, "checkpoint")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_reads_back_what_was_stored_and_refuses_what_it_cannot_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(FILE);
        assert_eq!(load(&path).expect("none yet"), Checkpoint::default());
        let mut c = Checkpoint::default();
        c.claims.insert(
            "u-1".into(),
            PreparedClaim {
                namespace: "models".into(),
                name: "c".into(),
                devices: vec![PreparedDevice {
                    request_names: vec!["gpu".into()],
                    pool: "n".into(),
                    device: "gpu-0".into(),
                    share_id: Some("s".into()),
                    cdi_device_ids: vec!["gpu.tessera.dev/gpu=u-1-gpu-0".into()],
                }],
                spec: cdi::spec(vec![]),
            },
        );
        store(&path, &c).expect("store");
        assert_eq!(load(&path).expect("load"), c);
        std::fs::write(&path, b"{\"version\": 7, \"claims\": {}}").expect("write");
        let e = load(&path).expect_err("another version");
        assert!(
            e.to_string().contains("version 7") && e.to_string().contains("move it away"),
            "{e}"
        );
        std::fs::write(&path, b"{").expect("write");
        assert_eq!(load(&path).expect_err("truncated").reason(), "checkpoint");
    }
}
