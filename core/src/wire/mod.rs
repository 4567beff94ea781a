//! Types that cross a process boundary as JSON, shared by the producer and the consumer so they cannot drift:
//! the sidecar's `/v1/status` (read by the autoscaler) and the activator's per-model stats (read by the autoscaler).

pub mod activator;
pub mod sidecar;
