//! The container security context every Tessera container runs with (docs/install.md): non-root, read-only root
//! filesystem, no privilege escalation, every capability dropped, seccomp `RuntimeDefault`. The chart's own pods
//! set it in YAML; the pods Tessera builds itself (the injected sidecar, capacity pods) take it from here, so the
//! two cannot drift apart.

use k8s_openapi::api::core::v1::{Capabilities, SeccompProfile, SecurityContext};

/// The restricted security context (the Pod Security Standards' `restricted` level, for one container).
pub fn restricted() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Capabilities::default()
        }),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..SeccompProfile::default()
        }),
        ..SecurityContext::default()
    }
}
