//! Publishing the capacity pod's GPU UUID as the annotation `tessera.dev/gpu-uuid` on its own pod.
//!
//! The pool manager reads that annotation to know which physical GPU a capacity pod holds, and the webhook
//! turns it into the tenant's `NVIDIA_VISIBLE_DEVICES`, so it must name exactly the device the device plugin
//! gave this pod. Three layers:
//! - [`select_gpu_uuid`] (pure): which of the UUIDs NVML lists is this pod's, given `NVIDIA_VISIBLE_DEVICES`;
//! - [`annotation_patch`] (pure): what merge patch, if any, makes the pod's annotations carry that UUID;
//! - [`UuidPublisher`] (thin kube layer): reads the pod, asks [`annotation_patch`], sends the patch, and
//!   retries with capped exponential backoff ([`Backoff`]) until it has succeeded or the agent stops.
//!
//! The pod's identity comes from the downward API (`POD_NAME` / `POD_NAMESPACE`, which the capacity pod spec
//! sets) or from `--pod-name` / `--pod-namespace` ([`pod_identity`]). Without it (a local run) nothing is
//! published. The RBAC this needs (`get` and `patch` on `pods` in the capacity pods' namespace) is in
//! `docs/fractional-gpus.md`.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use tokio_util::sync::CancellationToken;

/// The annotation the pool manager reads (`tessera_pool::ANNOTATION_GPU_UUID`).
pub const ANNOTATION_GPU_UUID: &str = "tessera.dev/gpu-uuid";

/// Why no UUID could be chosen from what NVML lists.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UuidError {
    /// NVML answered with no device at all.
    #[error(
        "NVML lists no GPU in this container; the capacity pod must request one GPU (limits: nvidia.com/gpu: 1) and run with the NVIDIA runtime"
    )]
    NoDevice,
    /// `NVIDIA_VISIBLE_DEVICES` names UUIDs none of which NVML lists.
    #[error(
        "NVIDIA_VISIBLE_DEVICES={visible:?} names no GPU that NVML lists ({listed:?}); MIG instances are not supported as capacity pods' devices"
    )]
    NotListed {
        /// The variable's value.
        visible: String,
        /// What NVML lists.
        listed: Vec<String>,
    },
    /// More than one GPU is visible and nothing says which is this pod's.
    #[error(
        "this container sees {} GPUs ({listed:?}) and NVIDIA_VISIBLE_DEVICES={visible:?} does not pick one; a capacity pod must hold exactly one GPU",
        listed.len()
    )]
    Ambiguous {
        /// The variable's value (`<unset>` when absent).
        visible: String,
        /// The candidates.
        listed: Vec<String>,
    },
}

/// Picks this pod's GPU UUID among the `listed` UUIDs NVML reports, given `NVIDIA_VISIBLE_DEVICES`.
///
/// The device plugin's default (`envvar`) strategy sets the variable to the allocated UUID(s); NVML inside
/// the container then usually lists just those, but with `hostPID` and a privileged or misconfigured runtime
/// it may list every GPU of the node, so a UUID in the variable wins. Other strategies (`volume-mounts`,
/// `cdi-annotations`) set a path or `void`, and old setups use indexes (which NVML re-numbers inside the
/// container); then the only safe answer is "the single GPU NVML sees".
pub fn select_gpu_uuid(visible: Option<&str>, listed: &[String]) -> Result<String, UuidError> {
    let shown = visible.unwrap_or("<unset>").to_string();
    let named: Vec<&str> = visible
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|t| t.starts_with("GPU-") || t.starts_with("MIG-"))
        .collect();
    if !named.is_empty() {
        let mut hits: Vec<&String> = listed.iter().filter(|u| named.contains(&u.as_str())).collect();
        hits.dedup();
        return match hits.as_slice() {
            [one] => Ok((*one).clone()),
            [] => Err(UuidError::NotListed {
                visible: shown,
                listed: listed.to_vec(),
            }),
            _ => Err(UuidError::Ambiguous {
                visible: shown,
                listed: hits.into_iter().cloned().collect(),
            }),
        };
    }
    match listed {
        [one] => Ok(one.clone()),
        [] => Err(UuidError::NoDevice),
        _ => Err(UuidError::Ambiguous {
            visible: shown,
            listed: listed.to_vec(),
        }),
    }
}

/// What the pod's annotations need, decided by [`annotation_patch`].
#[derive(Debug, Clone, PartialEq)]
pub enum AnnotationChange {
    /// The annotation already names this UUID: nothing to write.
    UpToDate,
    /// The annotation is absent (a new pod, or someone removed it): add it.
    Missing {
        /// The JSON merge patch to send.
        patch: serde_json::Value,
    },
    /// The annotation names another UUID (a pod restarted onto another device, or a hand edit): replace it.
    Different {
        /// What it said.
        previous: String,
        /// The JSON merge patch to send.
        patch: serde_json::Value,
    },
}

impl AnnotationChange {
    /// The patch to send, if any.
    pub fn patch(&self) -> Option<&serde_json::Value> {
        match self {
            Self::UpToDate => None,
            Self::Missing { patch } | Self::Different { patch, .. } => Some(patch),
        }
    }

    /// A short reason for logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::UpToDate => "up-to-date",
            Self::Missing { .. } => "missing",
            Self::Different { .. } => "different",
        }
    }
}

/// Decides what merge patch makes `annotations` carry `uuid` as [`ANNOTATION_GPU_UUID`]. The patch touches
/// only that key, so it cannot disturb the reservations the pool manager writes on the same pod, and it
/// carries no `resourceVersion`: the agent owns this key alone, so last-writer-wins is correct and a
/// concurrent reservation write never makes it fail.
pub fn annotation_patch(annotations: Option<&BTreeMap<String, String>>, uuid: &str) -> AnnotationChange {
    let patch = serde_json::json!({"metadata": {"annotations": {ANNOTATION_GPU_UUID: uuid}}});
    match annotations.and_then(|a| a.get(ANNOTATION_GPU_UUID)) {
        Some(v) if v == uuid => AnnotationChange::UpToDate,
        Some(v) => AnnotationChange::Different {
            previous: v.clone(),
            patch,
        },
        None => AnnotationChange::Missing { patch },
    }
}

/// The pod this agent runs in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodIdentity {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
}

/// The pod's identity from the flags (`--pod-name`, `--pod-namespace`, which also read `TESSERA_POD_NAME` /
/// `TESSERA_POD_NAMESPACE`), else from the downward API variables `POD_NAME` / `POD_NAMESPACE` read through
/// `env`. `None` when either part is missing or empty (a local run): then nothing is published.
pub fn pod_identity(
    flag_name: Option<&str>,
    flag_namespace: Option<&str>,
    env: impl Fn(&str) -> Option<String>,
) -> Option<PodIdentity> {
    let pick = |flag: Option<&str>, var: &str| {
        flag.map(str::to_string)
            .or_else(|| env(var))
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    Some(PodIdentity {
        name: pick(flag_name, "POD_NAME")?,
        namespace: pick(flag_namespace, "POD_NAMESPACE")?,
    })
}

/// Capped exponential backoff between failed attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first delay.
    pub initial: Duration,
    /// The longest delay.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
        }
    }
}

impl Backoff {
    /// The delay after failed attempt `attempt` (1-based): initial × 2^(attempt−1), at most `max`.
    pub fn delay(&self, attempt: u32) -> Duration {
        let factor = 1u32 << attempt.saturating_sub(1).min(20);
        self.initial.saturating_mul(factor).min(self.max)
    }
}

/// Why one publish attempt failed. [`PublishError::label`] is a fixed label per variant.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum PublishError {
    /// The pod named by `POD_NAME` / `--pod-name` does not exist in that namespace.
    #[error(
        "pod {namespace}/{name} not found: check POD_NAME / POD_NAMESPACE (downward API) or --pod-name / --pod-namespace"
    )]
    PodNotFound {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// The API refused with 401/403: the service account lacks the rights.
    #[error(
        "not allowed to {verb} pod {namespace}/{name}: grant the capacity pods' service account get and patch on pods (see docs/fractional-gpus.md): {source}"
    )]
    Forbidden {
        /// `get` or `patch`.
        verb: &'static str,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The API's answer.
        source: kube::Error,
    },
    /// Any other API or transport failure (409, 5xx, timeouts): retried.
    #[error("kubernetes API during {verb}: {source}")]
    Kube {
        /// `get` or `patch`.
        verb: &'static str,
        /// The error.
        source: kube::Error,
    },
}

impl PublishError {
    /// A fixed label for logs and metrics.
    pub fn label(&self) -> &'static str {
        self.into()
    }
}

/// The thin kube layer: reads and patches this agent's own pod.
#[derive(Clone)]
pub struct UuidPublisher {
    pods: Api<Pod>,
    pod: PodIdentity,
    backoff: Backoff,
}

impl std::fmt::Debug for UuidPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UuidPublisher")
            .field("pod", &self.pod)
            .field("backoff", &self.backoff)
            .finish_non_exhaustive()
    }
}

impl UuidPublisher {
    /// A publisher for `pod`, through `client`.
    pub fn new(client: kube::Client, pod: PodIdentity, backoff: Backoff) -> Self {
        Self {
            pods: Api::namespaced(client, &pod.namespace),
            pod,
            backoff,
        }
    }

    /// The pod written to.
    pub fn pod(&self) -> &PodIdentity {
        &self.pod
    }

    fn classify(&self, verb: &'static str, e: kube::Error) -> PublishError {
        match &e {
            kube::Error::Api(s) if s.code == 404 => PublishError::PodNotFound {
                namespace: self.pod.namespace.clone(),
                name: self.pod.name.clone(),
            },
            kube::Error::Api(s) if s.code == 401 || s.code == 403 => PublishError::Forbidden {
                verb,
                namespace: self.pod.namespace.clone(),
                name: self.pod.name.clone(),
                source: e,
            },
            _ => PublishError::Kube { verb, source: e },
        }
    }

    /// One attempt: reads the pod, decides with [`annotation_patch`], and sends the patch if one is needed.
    /// Returns what was needed.
    pub async fn ensure_once(&self, uuid: &str) -> Result<AnnotationChange, PublishError> {
        let pod = self
            .pods
            .get(&self.pod.name)
            .await
            .map_err(|e| self.classify("get", e))?;
        let change = annotation_patch(pod.metadata.annotations.as_ref(), uuid);
        if let Some(patch) = change.patch() {
            self.pods
                .patch(&self.pod.name, &PatchParams::default(), &Patch::Merge(patch))
                .await
                .map_err(|e| self.classify("patch", e))?;
        }
        Ok(change)
    }

    /// Attempts until one succeeds, sleeping [`Backoff::delay`] between failures and calling `on_failure`
    /// with each error (so the caller can show it on `/ready`). Returns `None` if `shutdown` fires first.
    /// Every error is retried, 403 and 404 included: RBAC and a mistyped name get fixed by people while the
    /// pod runs, and the log line says how.
    pub async fn ensure(
        &self,
        uuid: &str,
        shutdown: &CancellationToken,
        mut on_failure: impl FnMut(&PublishError),
    ) -> Option<AnnotationChange> {
        let mut attempt = 0u32;
        loop {
            attempt = attempt.saturating_add(1);
            let result = tokio::select! {
                () = shutdown.cancelled() => return None,
                r = self.ensure_once(uuid) => r,
            };
            match result {
                Ok(change) => {
                    match &change {
                        AnnotationChange::UpToDate => {
                            tracing::debug!(pod = %self.pod.name, uuid, "GPU UUID annotation is up to date")
                        }
                        AnnotationChange::Missing { .. } => {
                            tracing::info!(pod = %self.pod.name, uuid, attempt, "published the GPU UUID")
                        }
                        AnnotationChange::Different { previous, .. } => tracing::warn!(
                            pod = %self.pod.name, uuid, %previous, attempt,
                            "the pod named another GPU UUID; replaced it"
                        ),
                    }
                    return Some(change);
                }
                Err(e) => {
                    let delay = self.backoff.delay(attempt);
                    tracing::warn!(
                        pod = %self.pod.name, error = %e, kind = e.label(), attempt, retry_in = ?delay,
                        "could not publish the GPU UUID; retrying"
                    );
                    on_failure(&e);
                    tokio::select! {
                        () = shutdown.cancelled() => return None,
                        () = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    const A: &str = "GPU-2f8e1c3a-7b5d-4e6f-8a9b-0c1d2e3f4a5b";
    const B: &str = "GPU-9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d";

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn one_visible_gpu_is_this_pods() {
        for visible in [
            None,
            Some("all"),
            Some(A),
            Some("0"),
            Some("/var/run/nvidia-container-devices"),
        ] {
            assert_eq!(select_gpu_uuid(visible, &s(&[A])).unwrap(), A, "{visible:?}");
        }
    }

    #[test]
    fn the_variable_picks_among_several() {
        assert_eq!(select_gpu_uuid(Some(B), &s(&[A, B])).unwrap(), B);
        assert_eq!(select_gpu_uuid(Some(&format!(" {B} ")), &s(&[A, B])).unwrap(), B);
        assert!(matches!(
            select_gpu_uuid(Some(&format!("{A},{B}")), &s(&[A, B])),
            Err(UuidError::Ambiguous { .. })
        ));
        assert!(matches!(
            select_gpu_uuid(Some("all"), &s(&[A, B])),
            Err(UuidError::Ambiguous { .. })
        ));
        assert!(matches!(
            select_gpu_uuid(None, &s(&[A, B])),
            Err(UuidError::Ambiguous { .. })
        ));
        let e = select_gpu_uuid(Some("GPU-unknown"), &s(&[A])).unwrap_err();
        assert!(e.to_string().contains("GPU-unknown"), "{e}");
        assert_eq!(select_gpu_uuid(Some("all"), &[]), Err(UuidError::NoDevice));
    }

    #[test]
    fn the_patch_is_needed_only_when_missing_or_different() {
        assert!(matches!(
            annotation_patch(None, A),
            AnnotationChange::Missing { .. }
        ));
        let mut ann = BTreeMap::from([("tessera.dev/reservations".to_string(), "{}".to_string())]);
        let missing = annotation_patch(Some(&ann), A);
        assert_eq!(missing.reason(), "missing");
        assert_eq!(
            missing.patch().unwrap(),
            &serde_json::json!({"metadata": {"annotations": {"tessera.dev/gpu-uuid": A}}})
        );
        ann.insert(ANNOTATION_GPU_UUID.into(), A.into());
        assert_eq!(annotation_patch(Some(&ann), A), AnnotationChange::UpToDate);
        match annotation_patch(Some(&ann), B) {
            AnnotationChange::Different { previous, patch } => {
                assert_eq!(previous, A);
                assert_eq!(patch["metadata"]["annotations"][ANNOTATION_GPU_UUID], B);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn identity_prefers_flags_then_downward_api() {
        let env = |k: &str| match k {
            "POD_NAME" => Some("tessera-gpu-p-0".to_string()),
            "POD_NAMESPACE" => Some("tessera-system".to_string()),
            _ => None,
        };
        assert_eq!(
            pod_identity(None, None, env),
            Some(PodIdentity {
                namespace: "tessera-system".into(),
                name: "tessera-gpu-p-0".into()
            })
        );
        assert_eq!(pod_identity(Some("x"), None, env).unwrap().name, "x");
        assert_eq!(pod_identity(None, None, |_| None), None);
        assert_eq!(
            pod_identity(Some("x"), Some(" "), |_| None),
            None,
            "blank is absent"
        );
    }

    #[test]
    fn backoff_doubles_to_its_cap() {
        let b = Backoff::default();
        let d: Vec<u64> = (1..=9).map(|a| b.delay(a).as_secs()).collect();
        assert_eq!(d, vec![1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(b.delay(u32::MAX), b.max);
    }

    mod against_the_api {
        #![allow(clippy::unwrap_used)]
        use super::*;
        use http::{Request, Response};
        use kube::client::Body;
        use std::sync::{Arc, Mutex};

        pub(crate) const NS: &str = "tessera-system";
        pub(crate) const NAME: &str = "tessera-gpu-p-0";
        pub(crate) const PATH: &str = "/api/v1/namespaces/tessera-system/pods/tessera-gpu-p-0";

        pub(crate) fn pod_json(uuid: Option<&str>) -> Vec<u8> {
            let mut ann =
                serde_json::json!({"tessera.dev/reservations": "{\"version\":1,\"reservations\":[]}"});
            if let Some(u) = uuid {
                ann[ANNOTATION_GPU_UUID] = u.into();
            }
            serde_json::to_vec(&serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": NAME, "namespace": NS, "resourceVersion": "7", "annotations": ann}}))
            .unwrap()
        }

        pub(crate) fn reply(code: u16, body: Vec<u8>) -> Response<Body> {
            let body = if code < 300 {
                body
            } else {
                serde_json::to_vec(
                    &serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                    "status": "Failure", "message": "injected", "reason": "Injected", "code": code}),
                )
                .unwrap()
            };
            Response::builder()
                .status(code)
                .header("content-type", "application/json")
                .body(Body::from(body))
                .unwrap()
        }

        fn publisher() -> (
            UuidPublisher,
            tower_test::mock::Handle<Request<Body>, Response<Body>>,
        ) {
            let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
            let p = UuidPublisher::new(
                kube::Client::new(svc, "default"),
                PodIdentity {
                    namespace: NS.into(),
                    name: NAME.into(),
                },
                Backoff {
                    initial: Duration::from_secs(1),
                    max: Duration::from_secs(60),
                },
            );
            (p, handle)
        }

        #[tokio::test(start_paused = true)]
        async fn sends_one_merge_patch_and_retries_500_and_409_with_backoff() {
            let (p, mut handle) = publisher();
            let failures = Arc::new(Mutex::new(Vec::new()));
            let seen = failures.clone();
            let shutdown = CancellationToken::new();
            let t0 = tokio::time::Instant::now();
            let task = tokio::spawn(async move {
                p.ensure(A, &shutdown, |e| seen.lock().unwrap().push(e.label()))
                    .await
            });
            for patch_code in [500u16, 409, 200] {
                let (req, send) = handle.next_request().await.unwrap();
                assert_eq!((req.method().as_str(), req.uri().path()), ("GET", PATH));
                send.send_response(reply(200, pod_json(None)));
                let (req, send) = handle.next_request().await.unwrap();
                assert_eq!((req.method().as_str(), req.uri().path()), ("PATCH", PATH));
                assert_eq!(
                    req.headers()["content-type"].to_str().unwrap(),
                    "application/merge-patch+json"
                );
                let body: serde_json::Value =
                    serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
                assert_eq!(
                    body,
                    serde_json::json!({"metadata": {"annotations": {"tessera.dev/gpu-uuid": A}}}),
                    "only the UUID key, no resourceVersion"
                );
                send.send_response(reply(patch_code, pod_json(Some(A))));
            }
            let change = task.await.unwrap().unwrap();
            assert_eq!(change.reason(), "missing");
            assert_eq!(*failures.lock().unwrap(), vec!["kube", "kube"]);
            // Backoff 1 s then 2 s, on tokio's paused clock.
            assert_eq!(t0.elapsed().as_secs(), 3);
        }

        #[tokio::test(start_paused = true)]
        async fn up_to_date_sends_no_patch_and_a_stale_uuid_is_replaced() {
            let (p, mut handle) = publisher();
            let shutdown = CancellationToken::new();
            let p2 = p.clone();
            let s2 = shutdown.clone();
            let task = tokio::spawn(async move { p2.ensure(A, &s2, |_| {}).await });
            let (req, send) = handle.next_request().await.unwrap();
            assert_eq!(req.method().as_str(), "GET");
            send.send_response(reply(200, pod_json(Some(A))));
            assert_eq!(task.await.unwrap(), Some(AnnotationChange::UpToDate));
            // A restarted pod whose annotation names another device (e.g. copied by hand).
            let task = tokio::spawn(async move { p.ensure(A, &shutdown, |_| {}).await });
            let (_, send) = handle.next_request().await.unwrap();
            send.send_response(reply(200, pod_json(Some(B))));
            let (req, send) = handle.next_request().await.unwrap();
            assert_eq!(req.method().as_str(), "PATCH");
            send.send_response(reply(200, pod_json(Some(A))));
            assert!(matches!(
                task.await.unwrap(),
                Some(AnnotationChange::Different { previous, .. }) if previous == B
            ));
        }

        #[tokio::test(start_paused = true)]
        async fn forbidden_is_named_and_retried_until_shutdown() {
            let (p, mut handle) = publisher();
            let shutdown = CancellationToken::new();
            let errors = Arc::new(Mutex::new(Vec::new()));
            let seen = errors.clone();
            let s2 = shutdown.clone();
            let task = tokio::spawn(async move {
                p.ensure(A, &s2, |e| seen.lock().unwrap().push(e.to_string()))
                    .await
            });
            for _ in 0..2 {
                let (_, send) = handle.next_request().await.unwrap();
                send.send_response(reply(403, Vec::new()));
            }
            // The third GET is in flight; stop instead of answering.
            let _pending = handle.next_request().await.unwrap();
            shutdown.cancel();
            assert_eq!(task.await.unwrap(), None);
            let errors = errors.lock().unwrap();
            assert_eq!(errors.len(), 2);
            assert!(errors[0].contains("get and patch on pods"), "{}", errors[0]);
        }
    }

    proptest! {
        /// After the patch is applied the annotation says `uuid`, and the decision then says up to date.
        #[test]
        fn applying_the_patch_converges(prev in proptest::option::of("[A-Za-z0-9-]{0,20}"), uuid in "GPU-[a-f0-9-]{1,36}") {
            let mut ann = BTreeMap::new();
            if let Some(p) = &prev {
                ann.insert(ANNOTATION_GPU_UUID.to_string(), p.clone());
            }
            let change = annotation_patch(Some(&ann), &uuid);
            prop_assert_eq!(change.patch().is_none(), prev.as_deref() == Some(uuid.as_str()));
            if let Some(p) = change.patch() {
                let v = p["metadata"]["annotations"][ANNOTATION_GPU_UUID].as_str().unwrap();
                ann.insert(ANNOTATION_GPU_UUID.to_string(), v.to_string());
            }
            prop_assert_eq!(annotation_patch(Some(&ann), &uuid), AnnotationChange::UpToDate);
        }

        /// Whatever NVML lists, a chosen UUID is one NVML listed.
        #[test]
        fn a_chosen_uuid_is_listed(listed in proptest::collection::vec("GPU-[a-f0-9]{4}", 0..4), pick in proptest::option::of(0usize..4)) {
            let visible = pick.and_then(|i| listed.get(i).cloned());
            if let Ok(u) = select_gpu_uuid(visible.as_deref(), &listed) {
                prop_assert!(listed.contains(&u));
            }
        }
    }
}
