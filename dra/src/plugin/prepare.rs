//! Preparing and unpreparing claims: what the kubelet's two calls do, apart from gRPC.
//!
//! `prepare` answers each claim on its own (one claim's failure is that claim's error string, never the call's):
//! - a claim already prepared is answered from the checkpoint, its CDI spec rewritten if it went missing, so a
//!   retry or a second pod sharing the claim gets the same answer and the API server is not read again;
//! - any other is read from the API server (concurrently, each read bounded by `--api-timeout`), checked (the
//!   UID the kubelet sent, an allocation, devices of [`DRIVER`](crate::DRIVER) on this node that the inventory
//!   has), and becomes a CDI spec written before the checkpoint records it.
//!
//! Bounded: at most `--max-claims-per-call` claims of one call are looked at (the rest get an error and the
//! kubelet asks again), at most `--max-prepared` are held. Unprepare removes the spec (by its UID's path, so
//! even a claim the checkpoint never recorded leaves nothing behind) and the record; an unknown claim is already
//! unprepared.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;
use tokio::sync::Mutex;
use tracing::{info, warn};

use super::PluginError;
use super::cdi::{self, MpsPaths};
use super::checkpoint::{self, Checkpoint, PreparedClaim, PreparedDevice};
use super::inventory::Inventory;
use super::source::ClaimSource;
use crate::DRIVER;
use crate::claim::allocations;

/// Where the plugin writes and how much it takes on.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// The CDI spec directory the container runtime reads (`/var/run/cdi`).
    pub cdi_dir: PathBuf,
    /// The checkpoint file (`<plugin dir>/checkpoint.json`).
    pub checkpoint: PathBuf,
    /// The MPS daemon's directories, given to MPS clients.
    pub mps: MpsPaths,
    /// Claims looked at per call.
    pub max_claims_per_call: usize,
    /// Claims held prepared at once.
    pub max_prepared: usize,
    /// Bound on each API read.
    pub api_timeout: Duration,
}

/// A claim as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRef {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.uid`: the key of the answer.
    pub uid: String,
    /// `metadata.name`.
    pub name: String,
}

impl ClaimRef {
    fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The prepared claims of this node and how to prepare more.
#[derive(Debug)]
pub struct Driver<S> {
    cfg: DriverConfig,
    inventory: Inventory,
    source: S,
    state: Mutex<Checkpoint>,
}

/// One answer per claim UID.
pub type Answers<T> = BTreeMap<String, Result<T, PluginError>>;

impl<S: ClaimSource> Driver<S> {
    /// The driver with the checkpoint read back and every missing CDI spec of it rewritten.
    pub fn open(cfg: DriverConfig, inventory: Inventory, source: S) -> Result<Self, PluginError> {
        std::fs::create_dir_all(&cfg.cdi_dir).map_err(PluginError::io("CDI directory", &cfg.cdi_dir))?;
        if let Some(dir) = cfg.checkpoint.parent() {
            std::fs::create_dir_all(dir).map_err(PluginError::io("plugin directory", dir))?;
        }
        let state = checkpoint::load(&cfg.checkpoint)?;
        let mut restored = 0;
        for (uid, c) in &state.claims {
            if !cdi::spec_path(&cfg.cdi_dir, uid).exists() {
                cdi::write_spec(&cfg.cdi_dir, uid, &c.spec)?;
                restored += 1;
            }
        }
        info!(
            prepared = state.claims.len(),
            restored,
            checkpoint = %cfg.checkpoint.display(),
            "prepared claims read back from the checkpoint"
        );
        Ok(Self {
            cfg,
            inventory,
            source,
            state: Mutex::new(state),
        })
    }

    /// The node's inventory.
    pub fn inventory(&self) -> &Inventory {
        &self.inventory
    }

    /// The prepared claims, by UID.
    pub async fn prepared(&self) -> BTreeMap<String, PreparedClaim> {
        self.state.lock().await.claims.clone()
    }

    /// Prepares `claims`: the devices to hand each one's containers, or why not.
    #[tracing::instrument(skip_all, fields(claims = claims.len()))]
    pub async fn prepare(&self, claims: &[ClaimRef]) -> Answers<Vec<PreparedDevice>> {
        let claims = distinct(claims);
        let mut out = Answers::new();
        let max = self.cfg.max_claims_per_call;
        for c in claims.iter().skip(max) {
            out.insert(
                c.uid.clone(),
                Err(PluginError::TooManyInCall {
                    claims: claims.len(),
                    max,
                }),
            );
        }
        let mut todo = Vec::new();
        {
            let state = self.state.lock().await;
            for c in claims.iter().take(max) {
                if let Err(e) = valid(c) {
                    out.insert(c.uid.clone(), Err(e));
                } else if let Some(p) = state.claims.get(&c.uid) {
                    out.insert(
                        c.uid.clone(),
                        self.ensure_spec(&c.uid, p).map(|()| p.devices.clone()),
                    );
                } else {
                    todo.push(*c);
                }
            }
        }
        // Read outside the lock: a slow API server holds up only the claims it is reading.
        let read = futures::future::join_all(todo.iter().map(|c| self.read(c))).await;
        let mut state = self.state.lock().await;
        let mut added = Vec::new();
        for (c, r) in todo.iter().zip(read) {
            let answer = match r {
                Err(e) => Err(e),
                // Prepared by a concurrent call meanwhile: the same answer.
                Ok(_) if state.claims.contains_key(&c.uid) => Ok(state.claims[&c.uid].devices.clone()),
                Ok(_) if state.claims.len() >= self.cfg.max_prepared => {
                    Err(PluginError::Full { max: self.cfg.max_prepared })
                }
                Ok(p) => cdi::write_spec(&self.cfg.cdi_dir, &c.uid, &p.spec).map(|path| {
                    info!(claim = %c.key(), uid = %c.uid, spec = %path.display(), devices = p.devices.len(), "claim prepared");
                    let devices = p.devices.clone();
                    state.claims.insert(c.uid.clone(), p);
                    added.push(c.uid.clone());
                    devices
                }),
            };
            out.insert(c.uid.clone(), answer);
        }
        if !added.is_empty()
            && let Err(e) = checkpoint::store(&self.cfg.checkpoint, &state)
        {
            // Nothing stays prepared that a restart would not know of: undone, and the kubelet asks again.
            warn!(error = %e, claims = added.len(), "checkpoint not written: the claims just prepared are undone");
            for uid in added {
                state.claims.remove(&uid);
                let _ = cdi::remove_spec(&self.cfg.cdi_dir, &uid);
                out.insert(uid, Err(PluginError::NotRecorded(e.to_string())));
            }
        }
        for (uid, r) in &out {
            if let Err(e) = r {
                warn!(uid = %uid, reason = e.reason(), error = %e, "claim not prepared");
            }
        }
        out
    }

    /// Unprepares `claims`: their CDI specs removed, their records dropped.
    #[tracing::instrument(skip_all, fields(claims = claims.len()))]
    pub async fn unprepare(&self, claims: &[ClaimRef]) -> Answers<()> {
        let mut out = Answers::new();
        let mut state = self.state.lock().await;
        let mut removed = Vec::new();
        for c in distinct(claims) {
            // Only the UID matters here (it names the spec file), and it must be safe as a file name.
            let answer = valid_uid(&c.uid).and_then(|()| cdi::remove_spec(&self.cfg.cdi_dir, &c.uid));
            if answer.is_ok()
                && let Some(p) = state.claims.remove(&c.uid)
            {
                info!(claim = %c.key(), uid = %c.uid, "claim unprepared");
                removed.push((c.uid.clone(), p));
            }
            out.insert(c.uid.clone(), answer);
        }
        if !removed.is_empty()
            && let Err(e) = checkpoint::store(&self.cfg.checkpoint, &state)
        {
            // Kept as prepared, so the kubelet's retry writes the checkpoint again; the spec is rewritten if the
            // claim is prepared once more.
            warn!(error = %e, "checkpoint not written: the claims just unprepared stay recorded");
            for (uid, p) in removed {
                state.claims.insert(uid.clone(), p);
                out.insert(uid, Err(PluginError::NotRecorded(e.to_string())));
            }
        }
        out
    }

    fn ensure_spec(&self, uid: &str, p: &PreparedClaim) -> Result<(), PluginError> {
        if cdi::spec_path(&self.cfg.cdi_dir, uid).exists() {
            return Ok(());
        }
        cdi::write_spec(&self.cfg.cdi_dir, uid, &p.spec).map(|_| ())
    }

    async fn read(&self, c: &ClaimRef) -> Result<PreparedClaim, PluginError> {
        let timeout = self.cfg.api_timeout;
        let claim = match tokio::time::timeout(timeout, self.source.get(&c.namespace, &c.name)).await {
            Err(_) => {
                return Err(PluginError::Timeout {
                    claim: c.key(),
                    timeout,
                });
            }
            Ok(Err(detail)) => {
                return Err(PluginError::Read {
                    claim: c.key(),
                    detail,
                });
            }
            Ok(Ok(None)) => return Err(PluginError::NotFound { claim: c.key() }),
            Ok(Ok(Some(claim))) => claim,
        };
        resolve(c, &claim, &self.inventory, &self.cfg.mps)
    }
}

/// What `claim` (read for the kubelet's `c`) prepares to on this node: its devices and their CDI spec.
pub fn resolve(
    c: &ClaimRef,
    claim: &ResourceClaim,
    inventory: &Inventory,
    mps: &MpsPaths,
) -> Result<PreparedClaim, PluginError> {
    let found = claim.metadata.uid.as_deref().unwrap_or_default();
    if found != c.uid {
        return Err(PluginError::UidMismatch {
            claim: c.key(),
            wanted: c.uid.clone(),
            found: if found.is_empty() {
                "none".into()
            } else {
                found.into()
            },
        });
    }
    let Some(allocation) = claim.status.as_ref().and_then(|s| s.allocation.as_ref()) else {
        return Err(PluginError::NotAllocated { claim: c.key() });
    };
    let results = allocation.devices.as_ref().and_then(|d| d.results.as_ref());
    let here: Vec<_> = allocations(claim, |_, _| inventory.whole())
        .into_iter()
        .filter(|a| a.pool == inventory.node)
        .collect();
    if here.is_empty() {
        return Err(PluginError::NotOnThisNode {
            claim: c.key(),
            node: inventory.node.clone(),
        });
    }
    let mut devices = Vec::new();
    let mut cdi_devices = Vec::new();
    let mut names = BTreeSet::new();
    for (i, a) in here.iter().enumerate() {
        let Some(gpu) = inventory.gpu(&a.device) else {
            return Err(PluginError::UnknownDevice {
                claim: c.key(),
                device: a.device.clone(),
                node: inventory.node.clone(),
            });
        };
        let mut d = cdi::device(&c.uid, a, gpu, inventory.sharing, mps);
        // Two shares of one device in one claim (two requests) get two CDI devices.
        if !names.insert(d.name.clone()) {
            d.name = format!("{}-{i}", d.name);
            names.insert(d.name.clone());
        }
        // The requests this device serves, so the kubelet gives it only to the containers naming them.
        let request_names = results
            .into_iter()
            .flatten()
            .filter(|r| {
                r.driver == DRIVER && r.pool == a.pool && r.device == a.device && r.share_id == a.share_id
            })
            .map(|r| r.request.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        devices.push(PreparedDevice {
            request_names,
            pool: a.pool.clone(),
            device: a.device.clone(),
            share_id: a.share_id.clone(),
            cdi_device_ids: vec![cdi::device_id(&d.name)],
        });
        cdi_devices.push(d);
    }
    Ok(PreparedClaim {
        namespace: c.namespace.clone(),
        name: c.name.clone(),
        devices,
        spec: cdi::spec(cdi_devices),
    })
}

/// Each UID once, first occurrence kept (the kubelet's map has one answer per UID).
fn distinct(claims: &[ClaimRef]) -> Vec<&ClaimRef> {
    let mut seen = BTreeSet::new();
    claims.iter().filter(|c| seen.insert(c.uid.as_str())).collect()
}

fn valid(c: &ClaimRef) -> Result<(), PluginError> {
    if c.namespace.is_empty() || c.name.is_empty() {
        return Err(PluginError::BadClaim(format!(
            "claim {} has no namespace or name",
            c.uid
        )));
    }
    valid_uid(&c.uid)
}

/// A UID is a UUID: it names files, so nothing but letters, digits and '-' is accepted.
fn valid_uid(uid: &str) -> Result<(), PluginError> {
    if uid.is_empty() || uid.len() > 64 || !uid.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '-') {
        return Err(PluginError::BadClaim(format!("{uid:?} is not a claim UID")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::ClaimShape;
    use crate::plugin::inventory::{InventorySpec, Sharing};
    use crate::plugin::testing::{FakeClaims, SHARE_ID, allocated_claim, unallocated_claim};

    const NODE: &str = "gpu-node-1";
    const SHAPE: ClaimShape = ClaimShape {
        memory_mib: 20480,
        compute_milli: 250,
    };

    struct Fixture {
        dir: tempfile::TempDir,
        claims: FakeClaims,
    }

    impl Fixture {
        fn new() -> Self {
            Self {
                dir: tempfile::tempdir().expect("tempdir"),
                claims: FakeClaims::default(),
            }
        }

        fn config(&self) -> DriverConfig {
            DriverConfig {
                cdi_dir: self.dir.path().join("cdi"),
                checkpoint: self.dir.path().join("plugin").join(checkpoint::FILE),
                mps: MpsPaths::default(),
                max_claims_per_call: 4,
                max_prepared: 8,
                api_timeout: Duration::from_millis(200),
            }
        }

        fn driver(&self, cfg: DriverConfig) -> Driver<FakeClaims> {
            let inventory = Inventory::new(&InventorySpec {
                node: NODE.into(),
                gpus: 2,
                memory_mib: 81920,
                headroom_mib: 1024,
                compute_oversubscription: None,
                sharing: Sharing::Mps,
                uuids: vec!["GPU-0000".into(), "GPU-1111".into()],
                product: None,
            })
            .expect("inventory");
            Driver::open(cfg, inventory, self.claims.clone()).expect("open")
        }

        /// A claim allocated on `node`'s `device`, known to the fake API server; its reference.
        fn claim(&self, name: &str, node: &str, device: &str) -> ClaimRef {
            let uid = format!("uid-{name}");
            self.claims
                .put(allocated_claim("models", name, &uid, node, device, SHAPE));
            ClaimRef {
                namespace: "models".into(),
                uid,
                name: name.into(),
            }
        }

        fn spec(&self, uid: &str) -> Option<cdi::Spec> {
            let bytes = std::fs::read(cdi::spec_path(&self.dir.path().join("cdi"), uid)).ok()?;
            Some(serde_json::from_slice(&bytes).expect("a CDI spec"))
        }
    }

    fn reason<T: std::fmt::Debug>(r: &Result<T, PluginError>) -> &'static str {
        r.as_ref().err().map_or("ok", PluginError::reason)
    }

    #[tokio::test]
    async fn a_claim_is_prepared_once_and_answered_the_same_from_then_on() {
        let f = Fixture::new();
        let d = f.driver(f.config());
        let c = f.claim("llama-0", NODE, "gpu-1");
        let first = d.prepare(std::slice::from_ref(&c)).await;
        let devices = first[&c.uid].as_ref().expect("prepared");
        assert_eq!(devices.len(), 1);
        assert_eq!(devices[0].request_names, vec!["gpu".to_string()]);
        assert_eq!(
            (devices[0].pool.as_str(), devices[0].device.as_str()),
            (NODE, "gpu-1")
        );
        assert_eq!(devices[0].share_id.as_deref(), Some(SHARE_ID));
        assert_eq!(
            devices[0].cdi_device_ids,
            vec!["gpu.tessera.dev/gpu=uid-llama-0-gpu-1".to_string()]
        );
        let spec = f.spec(&c.uid).expect("spec written");
        let dev = &spec.devices[0];
        assert_eq!(dev.env("NVIDIA_VISIBLE_DEVICES"), Some("GPU-1111"));
        assert_eq!(dev.env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), Some("0=20480M"));
        assert_eq!(dev.env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), Some("25"));

        let again = d.prepare(&[c.clone(), c.clone()]).await;
        assert_eq!(again.len(), 1, "one answer per UID");
        assert_eq!(again[&c.uid].as_ref().expect("again"), devices);
        assert_eq!(
            f.claims.reads(),
            1,
            "a prepared claim is answered without reading the API server"
        );
    }

    #[tokio::test]
    async fn each_claim_fails_on_its_own_with_its_reason() {
        let f = Fixture::new();
        let d = f.driver(f.config());
        let good = f.claim("good", NODE, "gpu-0");
        let elsewhere = f.claim("elsewhere", "gpu-node-2", "gpu-0");
        let unknown = f.claim("unknown-device", NODE, "gpu-7");
        let mut wrong_uid = f.claim("recreated", NODE, "gpu-0");
        wrong_uid.uid = "uid-of-the-old-one".into();
        f.claims
            .put(unallocated_claim("models", "pending", "uid-pending", SHAPE));
        let pending = ClaimRef {
            namespace: "models".into(),
            uid: "uid-pending".into(),
            name: "pending".into(),
        };
        let answers = d
            .prepare(&[
                good.clone(),
                elsewhere.clone(),
                unknown.clone(),
                wrong_uid.clone(),
            ])
            .await;
        assert_eq!(reason(&answers[&good.uid]), "ok");
        assert_eq!(reason(&answers[&elsewhere.uid]), "not_on_this_node");
        assert_eq!(reason(&answers[&unknown.uid]), "unknown_device");
        assert_eq!(reason(&answers[&wrong_uid.uid]), "uid_mismatch");
        let msg = answers[&wrong_uid.uid]
            .as_ref()
            .expect_err("mismatch")
            .to_string();
        assert!(
            msg.contains("uid-recreated") && msg.contains("uid-of-the-old-one"),
            "{msg}"
        );
        let missing = ClaimRef {
            name: "gone".into(),
            uid: "uid-gone".into(),
            ..good.clone()
        };
        let traversal = ClaimRef {
            uid: "../../etc/passwd".into(),
            ..good.clone()
        };
        let answers = d
            .prepare(&[pending.clone(), missing.clone(), traversal.clone()])
            .await;
        assert_eq!(reason(&answers[&pending.uid]), "not_allocated");
        assert_eq!(reason(&answers[&missing.uid]), "not_found");
        assert_eq!(reason(&answers[&traversal.uid]), "bad_claim");
        assert!(f.spec(&elsewhere.uid).is_none() && f.spec(&wrong_uid.uid).is_none());

        f.claims.fail(Some("connection refused"));
        let other = f.claim("other", NODE, "gpu-0");
        let answers = d.prepare(std::slice::from_ref(&other)).await;
        assert_eq!(reason(&answers[&other.uid]), "read");
        f.claims.fail(None);
        f.claims.hang(true);
        let answers = d.prepare(std::slice::from_ref(&other)).await;
        assert_eq!(
            reason(&answers[&other.uid]),
            "timeout",
            "bounded by --api-timeout"
        );
    }

    #[tokio::test]
    async fn a_call_and_the_node_are_bounded() {
        let f = Fixture::new();
        let d = f.driver(DriverConfig {
            max_claims_per_call: 2,
            max_prepared: 3,
            ..f.config()
        });
        let cs: Vec<_> = (0..5).map(|i| f.claim(&format!("c{i}"), NODE, "gpu-0")).collect();
        let answers = d.prepare(&cs[..3]).await;
        assert_eq!(reason(&answers[&cs[0].uid]), "ok");
        assert_eq!(reason(&answers[&cs[1].uid]), "ok");
        assert_eq!(reason(&answers[&cs[2].uid]), "too_many_in_call");
        let answers = d.prepare(&cs[2..4]).await;
        assert_eq!(reason(&answers[&cs[2].uid]), "ok");
        assert_eq!(reason(&answers[&cs[3].uid]), "full");
        assert_eq!(d.prepared().await.len(), 3);
        d.unprepare(&cs[..1]).await;
        assert_eq!(
            reason(&d.prepare(&cs[3..4]).await[&cs[3].uid]),
            "ok",
            "room again after an unprepare"
        );
    }

    #[tokio::test]
    async fn a_restart_reads_back_what_was_prepared_and_rewrites_lost_specs() {
        let f = Fixture::new();
        let c = f.claim("llama-0", NODE, "gpu-0");
        let first = {
            let d = f.driver(f.config());
            d.prepare(std::slice::from_ref(&c))
                .await
                .remove(&c.uid)
                .expect("answer")
                .expect("prepared")
        };
        let spec = f.spec(&c.uid).expect("spec");
        // A reboot empties the CDI tmpfs; the kubelet may restart containers without preparing again.
        std::fs::remove_file(cdi::spec_path(&f.config().cdi_dir, &c.uid)).expect("rm");
        f.claims.fail(Some("the API server is down"));
        let d = f.driver(f.config());
        assert_eq!(
            f.spec(&c.uid).as_ref(),
            Some(&spec),
            "rewritten from the checkpoint at start"
        );
        let again = d.prepare(std::slice::from_ref(&c)).await;
        assert_eq!(again[&c.uid].as_ref().expect("from the checkpoint"), &first);
        let gone = d.unprepare(std::slice::from_ref(&c)).await;
        assert!(gone[&c.uid].is_ok());
        assert!(f.spec(&c.uid).is_none());
        assert!(
            f.driver(f.config()).prepared().await.is_empty(),
            "the checkpoint forgot it"
        );
    }

    #[tokio::test]
    async fn unprepare_is_idempotent_and_removes_even_an_unrecorded_spec() {
        let f = Fixture::new();
        let d = f.driver(f.config());
        let unknown = ClaimRef {
            namespace: "models".into(),
            uid: "uid-never-seen".into(),
            name: "x".into(),
        };
        // A crash between the spec and the checkpoint leaves a spec the checkpoint does not know.
        cdi::write_spec(&f.config().cdi_dir, &unknown.uid, &cdi::spec(vec![])).expect("write");
        let answers = d.unprepare(&[unknown.clone(), unknown.clone()]).await;
        assert_eq!(answers.len(), 1);
        assert!(answers[&unknown.uid].is_ok());
        assert!(f.spec(&unknown.uid).is_none());
        assert!(d.unprepare(std::slice::from_ref(&unknown)).await[&unknown.uid].is_ok());
        let bad = ClaimRef {
            uid: "a/b".into(),
            ..unknown
        };
        assert_eq!(
            reason(&d.unprepare(std::slice::from_ref(&bad)).await[&bad.uid]),
            "bad_claim"
        );
    }

    #[tokio::test]
    async fn a_checkpoint_that_cannot_be_written_undoes_the_prepare() {
        let f = Fixture::new();
        let cfg = f.config();
        let d = f.driver(cfg.clone());
        // A directory where the checkpoint goes: the rename over it fails.
        std::fs::create_dir_all(cfg.checkpoint.join("in-the-way")).expect("mkdir");
        let c = f.claim("llama-0", NODE, "gpu-0");
        let answers = d.prepare(std::slice::from_ref(&c)).await;
        assert_eq!(reason(&answers[&c.uid]), "not_recorded");
        assert!(f.spec(&c.uid).is_none(), "the spec is removed with it");
        assert!(d.prepared().await.is_empty());
    }
}
