//! Why the plugin could not prepare a claim or could not start. A claim's error goes into the kubelet's answer
//! for that claim (the kubelet retries it and shows it in the pod's events); only a start-up error ends the
//! process. [`PluginError::reason`] is a fixed label per variant, for logs.

use std::path::PathBuf;
use std::time::Duration;

use crate::DRIVER;

/// One thing that went wrong.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum PluginError {
    /// The kubelet sent a claim without a namespace, name or well-formed UID.
    #[error("bad claim in the request: {0}")]
    BadClaim(String),
    /// The call carried more claims than `--max-claims-per-call`; these were not looked at.
    #[error(
        "not prepared: the call carries {claims} claims, at most {max} are prepared per call (the kubelet retries)"
    )]
    TooManyInCall {
        /// Claims in the call.
        claims: usize,
        /// The bound.
        max: usize,
    },
    /// `--max-prepared` claims are already prepared on this node.
    #[error("not prepared: {max} claims are already prepared on this node (--max-prepared)")]
    Full {
        /// The bound.
        max: usize,
    },
    /// The API server could not be read.
    #[error("reading ResourceClaim {claim}: {detail}")]
    Read {
        /// `namespace/name`.
        claim: String,
        /// The client's error.
        detail: String,
    },
    /// The API server did not answer within `--api-timeout`.
    #[error("reading ResourceClaim {claim}: no answer within {}", humantime::format_duration(*timeout))]
    Timeout {
        /// `namespace/name`.
        claim: String,
        /// The bound.
        timeout: Duration,
    },
    /// No such claim.
    #[error("ResourceClaim {claim} not found")]
    NotFound {
        /// `namespace/name`.
        claim: String,
    },
    /// The claim of that name is another one than the kubelet means (deleted and re-created).
    #[error("ResourceClaim {claim} has UID {found}, the kubelet asked for {wanted}")]
    UidMismatch {
        /// `namespace/name`.
        claim: String,
        /// The UID the kubelet sent.
        wanted: String,
        /// The UID the API server has.
        found: String,
    },
    /// The claim has no allocation yet.
    #[error("ResourceClaim {claim} is not allocated")]
    NotAllocated {
        /// `namespace/name`.
        claim: String,
    },
    /// The claim's allocation holds no device of this driver on this node.
    #[error("ResourceClaim {claim} has no device of {DRIVER} allocated on node {node}")]
    NotOnThisNode {
        /// `namespace/name`.
        claim: String,
        /// This node.
        node: String,
    },
    /// The allocation names a device this node's inventory does not have (a slice of another inventory).
    #[error("ResourceClaim {claim} was allocated device {device}, which is not one of node {node}'s GPUs")]
    UnknownDevice {
        /// `namespace/name`.
        claim: String,
        /// The device.
        device: String,
        /// This node.
        node: String,
    },
    /// A file could not be written, read or removed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What the file is.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// The OS's error.
        source: std::io::Error,
    },
    /// The claim was prepared but the checkpoint could not be written, so it was undone.
    #[error("not recorded in the checkpoint, undone (the kubelet retries): {0}")]
    NotRecorded(String),
    /// The checkpoint cannot be read back.
    #[error(
        "checkpoint {} cannot be read ({detail}): move it away to start with no prepared claims (the kubelet prepares its pods' claims again)",
        path.display()
    )]
    Checkpoint {
        /// Where.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// The node's inventory given on the command line is inconsistent.
    #[error("inventory: {0}")]
    Inventory(String),
    /// No Kubernetes client could be built (no in-cluster config, no usable KUBECONFIG).
    #[error("{0}")]
    Client(String),
    /// A gRPC server stopped with an error.
    #[error("gRPC server on {}: {detail}", path.display())]
    Serve {
        /// Its socket.
        path: PathBuf,
        /// The transport's error.
        detail: String,
    },
}

impl PluginError {
    /// The fixed label of this variant (`uid_mismatch`, `not_on_this_node`, …).
    pub fn reason(&self) -> &'static str {
        self.into()
    }

    /// A file error, for `map_err`.
    pub(crate) fn io(what: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { what, path, source }
    }
}
