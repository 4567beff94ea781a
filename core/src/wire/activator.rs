//! The activator's per-model request statistics, as served to the autoscaler (being built, issue 4).
