//! Tessera's GPU fractions as Dynamic Resource Allocation (`resource.k8s.io/v1`), the second way to write the one
//! decision (DESIGN.md, "Two ways to express a fraction, one decision"): the recommendation, the packer and the pool
//! index are the same as with capacity pods; only what is written differs.
//!
//! - [`slice`]: each GPU node's `ResourceSlice` for the driver [`DRIVER`]: one device per GPU with
//!   `allowMultipleAllocations`, consumable capacity [`MEMORY`] (MiB a tenant can really use) and [`COMPUTE`]
//!   (milli-GPUs, oversubscribed as the pool allows), attributes (product, UUID, memory, sharing).
//!   Published by the pool manager for nodes without Tessera's kubelet plugin (kwok), by `tessera dra-plugin`
//!   on a node with a real kubelet.
//! - [`claim`]: the `ResourceClaimTemplate` sized from one allocation (memory MiB, compute share), named by its
//!   content so the controller (which writes it) and the webhook (which points a pod at it) agree without talking;
//!   and the allocation the scheduler made, read back from a `ResourceClaim`.
//! - [`index`]: slices and allocations folded into the core packer's state, for the pool index (`/ui`,
//!   consolidation, sleepers) and for saying why a claim fits nowhere — through `tessera_core::pack`, the same
//!   decision code capacity pods use.
//! - [`plugin`]: `tessera dra-plugin`, the kubelet plugin: registration and the DRA gRPC service over unix
//!   sockets, a CDI spec per prepared claim (the GPU and its MPS limits), a checkpoint, the node's slice.
//! - [`quantity`]: the few `resource.Quantity` forms these objects carry.

pub mod claim;
pub mod index;
pub mod plugin;
pub mod quantity;
pub mod slice;

/// The driver name in slices, claims' allocations and the DeviceClass's selector.
pub const DRIVER: &str = "gpu.tessera.dev";
/// The DeviceClass the chart installs (selecting [`DRIVER`]'s devices), named like the driver.
pub const DEVICE_CLASS: &str = "gpu.tessera.dev";
/// Consumable capacity: GPU memory a tenant may use, as a binary quantity (`Mi`).
pub const MEMORY: &str = "memory";
/// Consumable capacity: the compute share, in milli-GPUs (1000 = one GPU's SMs), as a plain integer.
pub const COMPUTE: &str = "compute";
/// The request's name inside each claim Tessera writes.
pub const REQUEST: &str = "gpu";
/// The pod-level claim name the webhook adds (`spec.resourceClaims[].name`, `resources.claims[].name`).
pub const POD_CLAIM: &str = "tessera-gpu";
/// Label on templates (and, copied by the resource-claim controller, on their claims): the model they size.
pub const LABEL_MODEL: &str = "tessera.dev/model";
/// Label on templates and slices Tessera writes.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Its value.
pub const MANAGED_BY: &str = "tessera";
/// Who published a driver slice: [`PUBLISHED_BY_POOL_MANAGER`] (kwok nodes, nodes without the plugin) or
/// [`PUBLISHED_BY_PLUGIN`]. The pool manager leaves alone, and never deletes, a slice that is not its own.
pub const LABEL_PUBLISHED_BY: &str = "tessera.dev/published-by";
/// The pool manager's value of [`LABEL_PUBLISHED_BY`].
pub const PUBLISHED_BY_POOL_MANAGER: &str = "pool-manager";
/// `tessera dra-plugin`'s value of [`LABEL_PUBLISHED_BY`].
pub const PUBLISHED_BY_PLUGIN: &str = "dra-plugin";
