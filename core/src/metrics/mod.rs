//! Prometheus text parsing and the typed vLLM snapshot (see issue 2).
