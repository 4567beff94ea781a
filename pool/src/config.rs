//! GPU pool configuration: what the chart writes into a ConfigMap and the pool manager reads at start.
//!
//! ```yaml
//! namespace: tessera-system          # where capacity pods live
//! image: ghcr.io/tessera-dev/tessera:0.1.0
//! reservationTtl: 2m                 # a reservation whose pod never appears is dropped after this
//! lendSleepers: false                # lend a sleeping replica's room rather than open a GPU (docs/fractional-gpus.md)
//! mode: capacity-pods                # or dra: fractions as DRA claims the kube-scheduler allocates (docs/fractional-gpus.md)
//! pools:
//!   - name: a100-80gb
//!     nodeSelector: { nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB }
//!     gpuMemoryMiB: 81920
//!     resourceName: nvidia.com/gpu     # default
//!     sharing: mps                     # mps | time-slicing | none
//!     maxGpus: 16
//!     spareCapacityPods: 1             # gated capacity pods ready to become GPUs (only the leader creates them)
//!     emptyGpuGracePeriod: 1m          # default: then the capacity pod goes, its node when the node autoscaler says
//!     memoryHeadroomMiB: 1024
//!     computeOversubscription: 2.0     # mps only (its default): the caps on one GPU may add up to 2 GPUs
//!     maxSleepersPerGpu: 4             # sleep mode: the GPU's sleeper budget (residue also ≤ a quarter of memory)
//!     sleepResidueMiB: 1434            # sleep mode: a sleeper's residue until measured
//! ```
//! Unknown keys are errors (a typo must not silently fall back to a default), and every check names the pool
//! and the field.

use std::collections::BTreeMap;
use std::time::Duration;

use tessera_core::pack::consolidate::ConsolidationConfig;
use tessera_core::pack::{
    GPU_COMPUTE_MILLI, GpuShape, MAX_COMPUTE_OVERSUBSCRIPTION, default_compute_oversubscription,
};

/// How tenants share a GPU. See `docs/fractional-gpus.md` for what each isolates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SharingMode {
    /// NVIDIA Multi-Process Service: tenants run concurrently; the webhook sets
    /// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` and `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` per tenant.
    Mps,
    /// The device plugin's time-slicing: tenants take turns; no memory limit is enforced by the driver.
    TimeSlicing,
    /// No sharing mechanism: only vLLM's own memory flags bound a tenant.
    None,
}

impl SharingMode {
    /// The value as written in the config.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Mps => "mps",
            Self::TimeSlicing => "time-slicing",
            Self::None => "none",
        }
    }
}

fn default_resource_name() -> String {
    "nvidia.com/gpu".to_string()
}

fn default_grace() -> Duration {
    tessera_core::pack::DEFAULT_EMPTY_GRACE
}

fn default_ttl() -> Duration {
    Duration::from_secs(120)
}

fn default_spares() -> u32 {
    1
}

fn default_headroom() -> u64 {
    tessera_core::pack::DEFAULT_HEADROOM_MIB
}

fn default_max_sleepers() -> u32 {
    4
}

fn default_sleep_residue() -> u64 {
    tessera_core::pack::sleeping::DEFAULT_RESIDUE_MIB
}

/// Namespaces the pools may not use: every tenant's sidecar may `update` Leases in the pool namespace, and in
/// these Kubernetes keeps its own Leases (node heartbeats in `kube-node-lease`, the controller-manager's and the
/// scheduler's leader Leases in `kube-system`) or every user's objects (`default`, `kube-public`).
pub const RESERVED_NAMESPACES: [&str; 4] = ["kube-system", "kube-node-lease", "kube-public", "default"];

fn default_namespace() -> String {
    "tessera-system".to_string()
}

fn default_image() -> String {
    "ghcr.io/tessera-dev/tessera:latest".to_string()
}

/// One pool of identical GPUs.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolSpec {
    /// A DNS label: it becomes the `tessera.dev/pool` label value and part of capacity pod names.
    pub name: String,
    /// Nodes with this pool's GPUs (copied into every capacity pod).
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    /// One GPU's memory in MiB.
    #[serde(rename = "gpuMemoryMiB")]
    pub gpu_memory_mib: u64,
    /// The extended resource a capacity pod requests one of.
    #[serde(default = "default_resource_name")]
    pub resource_name: String,
    /// How tenants share a GPU.
    pub sharing: SharingMode,
    /// The most GPUs (capacity pods) this pool may hold.
    pub max_gpus: u32,
    /// Gated capacity pods kept ready to become GPUs (`spec.schedulingGates`: no node, no GPU, ignored by the
    /// cluster autoscaler). A replica that fits on no GPU books on one; the leader then lifts its gate (the GPU is
    /// requested) and makes the next. Only the leader creates capacity pods: the webhook never does. 0: the pool
    /// never grows.
    #[serde(default = "default_spares")]
    pub spare_capacity_pods: u32,
    /// How long an empty capacity pod is kept before it is deleted (a replica that comes back within it finds its
    /// GPU, with any sleeping pods on it). Default [`tessera_core::pack::DEFAULT_EMPTY_GRACE`], one minute: the
    /// node stays until the cluster's node autoscaler removes it, on its own delay.
    #[serde(default = "default_grace", with = "humantime_serde")]
    pub empty_gpu_grace_period: Duration,
    /// MiB of each GPU never handed out (CUDA contexts, fragmentation).
    #[serde(rename = "memoryHeadroomMiB", default = "default_headroom")]
    pub memory_headroom_mib: u64,
    /// Optional priority class for capacity pods (so they can preempt lower-priority work for a GPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// How many GPUs' worth of compute shares the tenants of one GPU may hold together: 1.0 hands each GPU
    /// out once; above it only under `mps`, whose default is 2.0 (others: 1.0). An MPS share caps the SMs a
    /// client may use; it reserves nothing, so tenants that are rarely busy at the same moment can hold caps
    /// adding up to more than the GPU and slow each other only while they run together (each then gets SMs
    /// in proportion to its cap). Memory is never oversubscribed. See `docs/fractional-gpus.md`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_oversubscription: Option<f64>,
    /// Emptying a GPU whose few replicas fit on the others (`tessera_core::pack::consolidate`).
    #[serde(default)]
    pub consolidation: ConsolidationSpec,
    /// Sleep mode: most sleeping pods on one GPU (their residue together may also take at most a quarter of its
    /// memory). A model whose last replica would sleep where the budget is full sleeps only if it is worth more
    /// than a sleeper there, which is then let go (`tessera_core::pack::sleeping::admit`); else it goes to zero.
    #[serde(default = "default_max_sleepers")]
    pub max_sleepers_per_gpu: u32,
    /// Sleep mode: GPU memory a sleeping pod is counted to keep (its CUDA context), MiB, until its sidecar measured
    /// its residue. 1434 MiB is the level-1 residue reported for vLLM on an H100.
    #[serde(rename = "sleepResidueMiB", default = "default_sleep_residue")]
    pub sleep_residue_mib: u64,
}

impl PoolSpec {
    /// The GPU's budget for sleeping pods (`tessera_core::pack::sleeping`).
    pub fn sleeper_budget(&self) -> tessera_core::pack::sleeping::SleeperBudget {
        tessera_core::pack::sleeping::SleeperBudget::of_gpu(self.gpu_memory_mib, self.max_sleepers_per_gpu)
    }
}

/// A pool's `consolidation` block: when a GPU whose replicas fit elsewhere is drained. The defaults are
/// [`ConsolidationConfig::default`]'s, except `settle`, which defaults to the pool's `emptyGpuGracePeriod`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ConsolidationSpec {
    /// Off: no GPU is drained (placement is unchanged).
    pub enabled: bool,
    /// The most replicas moved to empty one GPU; each costs its model a cold start on another GPU.
    pub max_moves: usize,
    /// How long a GPU must stay emptiable before it is drained; unset, the pool's `emptyGpuGracePeriod`: a GPU
    /// that has stayed emptiable as long as an empty one is kept is worth emptying.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub settle: Option<Duration>,
    /// A drain not finished in this long is called off (a model nobody moves).
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
}

impl Default for ConsolidationSpec {
    fn default() -> Self {
        let c = ConsolidationConfig::default();
        Self {
            enabled: c.enabled,
            max_moves: c.max_moves,
            settle: None,
            drain_timeout: c.drain_timeout,
        }
    }
}

impl PoolSpec {
    /// The consolidation rule's configuration for this pool.
    pub fn consolidation(&self) -> ConsolidationConfig {
        let c = &self.consolidation;
        ConsolidationConfig::for_pool(
            c.enabled,
            c.max_moves,
            c.settle,
            self.empty_gpu_grace_period,
            c.drain_timeout,
        )
    }
}

/// The most moves one drain may take: each is a cold start, and a GPU with more tenants than this is not
/// cheap to empty.
pub const MAX_CONSOLIDATION_MOVES: usize = 8;

impl PoolSpec {
    /// The oversubscription in force: the configured one, or the default for this pool's sharing.
    pub fn compute_oversubscription(&self) -> f64 {
        self.compute_oversubscription
            .unwrap_or_else(|| default_compute_oversubscription(self.sharing == SharingMode::Mps))
    }

    /// The GPU shape the packer uses, checked by the packer's own rule ([`GpuShape::validate`]).
    pub fn try_shape(&self) -> Result<GpuShape, tessera_core::pack::PackError> {
        self.shape_once()
            .with_compute_oversubscription(self.compute_oversubscription())
    }

    /// The GPU shape the packer uses. [`PoolsConfig::validate`] has checked it; were it invalid, each GPU is handed
    /// out once, which never overbooks.
    pub fn shape(&self) -> GpuShape {
        self.try_shape().unwrap_or_else(|_| self.shape_once())
    }

    fn shape_once(&self) -> GpuShape {
        GpuShape {
            memory_mib: self.gpu_memory_mib,
            headroom_mib: self.memory_headroom_mib,
            compute_milli: GPU_COMPUTE_MILLI,
        }
    }
}

/// How a fraction is written (DESIGN.md, "Two ways to express a fraction, one decision").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PoolMode {
    /// Capacity pods hold whole GPUs; tenants carry reservations (annotations) the webhook books.
    #[default]
    CapacityPods,
    /// Dynamic Resource Allocation: each GPU node publishes a ResourceSlice of the driver `gpu.tessera.dev`, each
    /// replica gets a ResourceClaim from a template sized by its recommendation, and the kube-scheduler allocates
    /// memory and compute on a device (`tessera_dra`).
    Dra,
}

/// The whole pool configuration.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolsConfig {
    /// Namespace of the capacity pods.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// The tessera image capacity pods run (`tessera gpu-agent`).
    #[serde(default = "default_image")]
    pub image: String,
    /// Service account of capacity pods (needs to patch its own pod to publish the GPU UUID).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// How long a reservation waits for its pod before it is dropped.
    #[serde(default = "default_ttl", with = "humantime_serde")]
    pub reservation_ttl: Duration,
    /// The only namespace whose tenant pods share these GPUs (the chart sets it to `watchNamespace`). Unset: tenant
    /// pods are watched in every namespace, which needs a cluster-wide grant to list pods; with a namespaced Role
    /// such a watch is refused and the pool manager would never start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_namespace: Option<String>,
    /// Lend a sleeping pod's room (`spec.sleep`) to a new replica where the alternative is opening a GPU, as the
    /// simulator's pool does: the sleeper's pod is deleted (its next start is cold) and the newcomer's vLLM starts
    /// once it is gone. Off: a sleeping pod keeps its whole share. Needs `delete` on tenant pods and the start-up
    /// Leases (the chart grants both only with `gpuPools.lendSleepers`).
    #[serde(default)]
    pub lend_sleepers: bool,
    /// How fractions are written: capacity pods (the default) or DRA claims.
    #[serde(default)]
    pub mode: PoolMode,
    /// The pools.
    pub pools: Vec<PoolSpec>,
}

/// What is wrong with a pool configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolConfigError {
    /// Not valid YAML, or a key is unknown or of the wrong type.
    #[error("pool config is not valid: {0}")]
    Parse(String),
    /// A field has an unusable value.
    #[error("pool {pool:?}: {field}: {why}")]
    Invalid {
        /// The pool (empty for top-level fields).
        pool: String,
        /// The field, as spelled in the YAML.
        field: &'static str,
        /// What is wrong and what is expected.
        why: String,
    },
}

impl PoolsConfig {
    /// Parses and validates YAML.
    pub fn from_yaml(yaml: &str) -> Result<Self, PoolConfigError> {
        let cfg: Self = serde_yaml::from_str(yaml).map_err(|e| PoolConfigError::Parse(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads, parses and validates a file (the mounted ConfigMap).
    pub fn from_file(path: &std::path::Path) -> Result<Self, PoolConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| PoolConfigError::Parse(format!("cannot read {}: {e}", path.display())))?;
        Self::from_yaml(&text).map_err(|e| match e {
            PoolConfigError::Parse(m) => PoolConfigError::Parse(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    /// A pool by name.
    pub fn pool(&self, name: &str) -> Option<&PoolSpec> {
        self.pools.iter().find(|p| p.name == name)
    }

    /// Checks every field; the first problem is returned.
    pub fn validate(&self) -> Result<(), PoolConfigError> {
        let top = |field: &'static str, why: String| PoolConfigError::Invalid {
            pool: String::new(),
            field,
            why,
        };
        if !is_dns_label(&self.namespace) {
            return Err(top(
                "namespace",
                format!("{:?} is not a namespace name (a DNS label)", self.namespace),
            ));
        }
        if RESERVED_NAMESPACES.contains(&self.namespace.as_str()) {
            return Err(top(
                "namespace",
                format!(
                    "{:?} is a namespace Kubernetes itself uses: every tenant's sidecar gets `update` on the \
                     Leases of the pool namespace (the GPU start-up gate), which there would include the node \
                     heartbeats or the control plane's leader Leases; give the pools a namespace of their own \
                     (e.g. tessera-gpus)",
                    self.namespace
                ),
            ));
        }
        if self.image.trim().is_empty() {
            return Err(top(
                "image",
                "must name the tessera image capacity pods run".into(),
            ));
        }
        if self.reservation_ttl.is_zero() {
            return Err(top(
                "reservationTtl",
                "must be positive (e.g. 2m): a 0 TTL drops every reservation".into(),
            ));
        }
        if self.pools.is_empty() {
            return Err(top("pools", "at least one pool is needed".into()));
        }
        let mut names = std::collections::HashSet::new();
        for p in &self.pools {
            let bad = |field: &'static str, why: String| PoolConfigError::Invalid {
                pool: p.name.clone(),
                field,
                why,
            };
            // Capacity pod names are "tessera-gpu-<pool>-<10 chars>": keep the pool name short enough.
            if !is_dns_label(&p.name) || p.name.len() > 40 {
                return Err(bad(
                    "name",
                    "must be a DNS label (lower-case letters, digits, '-') of at most 40 characters".into(),
                ));
            }
            if !names.insert(p.name.as_str()) {
                return Err(bad("name", "appears twice; pool names must be unique".into()));
            }
            if p.gpu_memory_mib == 0 {
                return Err(bad(
                    "gpuMemoryMiB",
                    "must be the GPU's memory in MiB, e.g. 81920 for 80 GiB".into(),
                ));
            }
            if p.memory_headroom_mib >= p.gpu_memory_mib {
                return Err(bad(
                    "memoryHeadroomMiB",
                    format!(
                        "{} leaves nothing of gpuMemoryMiB {}; use a few hundred to a few thousand MiB",
                        p.memory_headroom_mib, p.gpu_memory_mib
                    ),
                ));
            }
            if p.max_sleepers_per_gpu > 0 && p.sleep_residue_mib > p.sleeper_budget().max_residue_mib {
                return Err(bad(
                    "sleepResidueMiB",
                    format!(
                        "{} MiB is over a quarter of gpuMemoryMiB {} (what sleepers may keep of a GPU), so no \
                         sleeping pod would ever fit; give the measured residue (about 1434 for vLLM on an H100), or \
                         set maxSleepersPerGpu: 0 to keep sleepers off this pool",
                        p.sleep_residue_mib, p.gpu_memory_mib
                    ),
                ));
            }
            let most = MAX_COMPUTE_OVERSUBSCRIPTION;
            let oversubscription = p.compute_oversubscription();
            // Memory and headroom passed above, so the packer's refusal is about the oversubscription.
            if p.try_shape().is_err() {
                return Err(bad(
                    "computeOversubscription",
                    format!(
                        "{} is out of range: 1.0 hands each GPU out once, up to {most} lets MPS caps add up to \
                         that many GPUs",
                        oversubscription
                    ),
                ));
            }
            if oversubscription > 1.0 && p.sharing != SharingMode::Mps {
                return Err(bad(
                    "computeOversubscription",
                    format!(
                        "is {} but sharing is {}: only MPS caps can be oversubscribed (time-slicing and none \
                         have no per-tenant cap); set it to 1.0 or use sharing: mps",
                        oversubscription,
                        p.sharing.as_str()
                    ),
                ));
            }
            if p.max_gpus == 0 {
                return Err(bad("maxGpus", "must be at least 1".into()));
            }
            if p.consolidation.max_moves > MAX_CONSOLIDATION_MOVES {
                return Err(bad(
                    "consolidation.maxMoves",
                    format!(
                        "{} is more than {MAX_CONSOLIDATION_MOVES}: each move is a cold start; use 1–{MAX_CONSOLIDATION_MOVES}, \
                         or enabled: false to turn consolidation off",
                        p.consolidation.max_moves
                    ),
                ));
            }
            if p.consolidation.drain_timeout.is_zero() {
                return Err(bad(
                    "consolidation.drainTimeout",
                    "must be positive (e.g. 30m): it must cover a cold start of every model moved".into(),
                ));
            }
            let (prefix, res) = p.resource_name.split_once('/').unwrap_or(("", ""));
            if prefix.is_empty() || res.is_empty() || p.resource_name.contains(char::is_whitespace) {
                return Err(bad(
                    "resourceName",
                    format!(
                        "{:?} is not an extended resource name like nvidia.com/gpu",
                        p.resource_name
                    ),
                ));
            }
            for (k, v) in &p.node_selector {
                if k.is_empty() || k.contains(char::is_whitespace) || v.contains(char::is_whitespace) {
                    return Err(bad(
                        "nodeSelector",
                        format!("{k:?}: {v:?} is not a valid label selector entry"),
                    ));
                }
            }
        }
        Ok(())
    }
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const EXAMPLE: &str = include_str!("../../deploy/examples/gpu-pools.yaml");

    #[test]
    fn the_example_file_is_valid() {
        let cfg = PoolsConfig::from_yaml(EXAMPLE).unwrap();
        assert!(cfg.pools.len() >= 2);
        let p = &cfg.pools[0];
        assert_eq!(p.resource_name, "nvidia.com/gpu");
        assert!(p.shape().validate().is_ok());
    }

    #[test]
    fn defaults_apply() {
        let cfg = PoolsConfig::from_yaml(
            "pools:\n- name: a\n  gpuMemoryMiB: 24576\n  sharing: time-slicing\n  maxGpus: 2\n",
        )
        .unwrap();
        let p = &cfg.pools[0];
        assert_eq!(p.resource_name, "nvidia.com/gpu");
        // One minute, as the simulator's scenarios run (it was ten minutes: issue 57, the table's Tessera row is
        // what a pool at its defaults does).
        assert_eq!(p.empty_gpu_grace_period, Duration::from_secs(60));
        assert_eq!(p.memory_headroom_mib, 1024);
        assert_eq!(p.sharing, SharingMode::TimeSlicing);
        assert_eq!(cfg.reservation_ttl, Duration::from_secs(120));
        assert_eq!(cfg.namespace, "tessera-system");
    }

    /// Issue 53, N17: a pool namespace where Kubernetes keeps its own Leases would hand every tenant `update` on
    /// them (the start-up gate's grant).
    #[test]
    fn kubernetes_own_namespaces_are_refused_as_the_pool_namespace() {
        let base = "pools:\n- name: a\n  gpuMemoryMiB: 24576\n  sharing: mps\n  maxGpus: 2\n";
        for ns in ["kube-system", "kube-node-lease", "kube-public", "default"] {
            let e = PoolsConfig::from_yaml(&format!("namespace: {ns}\n{base}"))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!(
                    "namespace: \"{ns}\" is a namespace Kubernetes itself uses"
                )),
                "{e}"
            );
            assert!(e.contains("a namespace of their own"), "{e}");
        }
        assert!(PoolsConfig::from_yaml(&format!("namespace: tessera-gpus\n{base}")).is_ok());
    }

    #[test]
    fn errors_name_the_pool_and_field() {
        let base = "pools:\n- name: a\n  gpuMemoryMiB: 24576\n  sharing: mps\n  maxGpus: 2\n";
        let e = PoolsConfig::from_yaml(&format!("{base}  memoryHeadroomMiB: 30000\n")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("pool \"a\": memoryHeadroomMiB: 30000 leaves nothing"),
            "{e}"
        );
        let e = PoolsConfig::from_yaml(&base.replace("maxGpus: 2", "maxGpus: 0")).unwrap_err();
        assert_eq!(e.to_string(), "pool \"a\": maxGpus: must be at least 1");
        let e = PoolsConfig::from_yaml(&base.replace("sharing: mps", "sharing: mig")).unwrap_err();
        assert!(e.to_string().contains("unknown variant `mig`"), "{e}");
        let e = PoolsConfig::from_yaml(&format!("{base}  maxGPUs: 3\n")).unwrap_err();
        assert!(e.to_string().contains("unknown field `maxGPUs`"), "{e}");
        let e = PoolsConfig::from_yaml(&format!("{base}  resourceName: gpu\n")).unwrap_err();
        assert!(e.to_string().contains("resourceName"), "{e}");
        let e = PoolsConfig::from_yaml(&format!("{base}  emptyGpuGracePeriod: soon\n")).unwrap_err();
        assert!(e.to_string().contains("emptyGpuGracePeriod"), "{e}");
        let e = PoolsConfig::from_yaml(&base.replace("name: a", "name: A_B")).unwrap_err();
        assert!(e.to_string().contains("DNS label"), "{e}");
        let twice = format!(
            "{base}- name: a\n  gpuMemoryMiB: 1\n  sharing: none\n  maxGpus: 1\n  memoryHeadroomMiB: 0\n"
        );
        assert!(
            PoolsConfig::from_yaml(&twice)
                .unwrap_err()
                .to_string()
                .contains("appears twice")
        );
        let e = PoolsConfig::from_yaml("pools: []\n").unwrap_err();
        assert!(e.to_string().contains("at least one pool"), "{e}");
        let e = PoolsConfig::from_yaml(&format!("{base}  consolidation: {{maxMoves: 9}}\n")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("pool \"a\": consolidation.maxMoves: 9 is more than 8"),
            "{e}"
        );
        let e =
            PoolsConfig::from_yaml(&format!("{base}  consolidation: {{drainTimeout: 0s}}\n")).unwrap_err();
        assert!(e.to_string().contains("consolidation.drainTimeout"), "{e}");
        let e = PoolsConfig::from_yaml(&format!("{base}  consolidation: {{settel: 5m}}\n")).unwrap_err();
        assert!(e.to_string().contains("unknown field `settel`"), "{e}");
    }

    #[test]
    fn consolidation_defaults_to_the_core_rule_and_can_be_tuned_or_turned_off() {
        let base = "pools:\n- name: a\n  gpuMemoryMiB: 24576\n  sharing: mps\n  maxGpus: 2\n";
        let cfg = PoolsConfig::from_yaml(base).unwrap();
        // The default grace is one minute, so the default settle is too.
        assert_eq!(cfg.pools[0].consolidation(), ConsolidationConfig::default());
        let cfg = PoolsConfig::from_yaml(&format!("{base}  emptyGpuGracePeriod: 3m\n")).unwrap();
        assert_eq!(cfg.pools[0].consolidation().settle, Duration::from_secs(180));
        let cfg = PoolsConfig::from_yaml(&format!(
            "{base}  consolidation: {{settle: 2m, enabled: false}}\n"
        ))
        .unwrap();
        let c = cfg.pools[0].consolidation();
        assert_eq!(
            (c.enabled, c.settle, c.max_moves),
            (false, Duration::from_secs(120), 2)
        );
        assert_eq!(
            PoolsConfig::from_yaml(EXAMPLE).unwrap().pools[0].consolidation(),
            ConsolidationConfig::default()
        );
    }

    #[test]
    fn mps_pools_oversubscribe_compute_by_default_and_others_cannot() {
        let mps = "pools:\n- name: a\n  gpuMemoryMiB: 81920\n  sharing: mps\n  maxGpus: 2\n";
        let cfg = PoolsConfig::from_yaml(mps).unwrap();
        assert_eq!(cfg.pools[0].shape().compute_milli, 2000);
        // Two 700-milli caps share one GPU under the default; memory is still counted once.
        let mut packer = tessera_core::pack::Packer::new(cfg.pools[0].shape());
        let g = packer.add_gpu();
        for id in ["x", "y"] {
            packer
                .assign(g, tessera_core::pack::ReplicaRequest::new(id, id, 700, 30_000))
                .unwrap();
        }
        assert!(
            packer
                .assign(g, tessera_core::pack::ReplicaRequest::new("z", "z", 100, 30_000))
                .is_err(),
            "memory is never oversubscribed"
        );
        let once = PoolsConfig::from_yaml(&format!("{mps}  computeOversubscription: 1.0\n")).unwrap();
        assert_eq!(once.pools[0].shape().compute_milli, 1000);
        let slicing = mps.replace("sharing: mps", "sharing: time-slicing");
        assert_eq!(
            PoolsConfig::from_yaml(&slicing).unwrap().pools[0]
                .shape()
                .compute_milli,
            1000
        );
        let e = PoolsConfig::from_yaml(&format!("{slicing}  computeOversubscription: 1.5\n")).unwrap_err();
        assert!(
            e.to_string().contains("only MPS caps can be oversubscribed"),
            "{e}"
        );
        for bad in ["0.5", "4.5", ".nan"] {
            let e = PoolsConfig::from_yaml(&format!("{mps}  computeOversubscription: {bad}\n")).unwrap_err();
            assert!(e.to_string().contains("computeOversubscription"), "{bad}: {e}");
        }
    }
}
