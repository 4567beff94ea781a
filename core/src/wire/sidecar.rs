//! The sidecar's `/v1/status` document (being built, issue 2).
