//! The mutating admission webhook: sidecar injection and GPU placement.
//!
//! Not built yet: no open issue covers it. Placement will call the pool manager's `reserve` in
//! `tessera-autoscaler`, and the pure mutation will live in `tessera-core`.
