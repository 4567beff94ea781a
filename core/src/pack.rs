//! Packing fractional replicas onto GPUs (see issue 5).
