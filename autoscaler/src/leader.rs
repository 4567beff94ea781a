//! Leader election with a `coordination.k8s.io/v1` `Lease`, written directly so the rules are visible and tested.
//!
//! Only the leader reconciles; the other replicas of `tessera autoscaler` stand by and take over when the lease
//! expires. Correctness rests on two things:
//! - **Optimistic concurrency**: every write is a PUT carrying the `resourceVersion` that was read, so of two
//!   candidates racing for an expired lease exactly one wins; the other gets 409 Conflict and stays a follower.
//! - **Expiry by local observation**, as client-go's leaderelection does: a follower considers the lease expired
//!   when `leaseDurationSeconds` have passed *on its own clock* since it first saw the current `resourceVersion`,
//!   not since the `renewTime` written by another machine's clock. Clock skew between nodes therefore cannot make a
//!   follower take over a healthy leader early.
//!
//! A leader that cannot renew for `renew_deadline` (shorter than the lease duration) steps down by itself, so it
//! stops writing before anyone else can have taken over.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tracing::{debug, info, warn};

// The Lease rule (create / renew / take over / follow, expiry judged on our own clock) is shared with the
// sidecar's start-up gate, so it lives in the core.
pub use tessera_core::lease::{LeaseDecision, LeaseObservation, decide, renew_deadline_passed};

/// Time left until the renew deadline of a lease last renewed at `last_renew_ms` (zero once passed; the whole
/// deadline when there was no renewal).
pub fn time_left(last_renew_ms: Option<u64>, now_ms: u64, renew_deadline: Duration) -> Duration {
    match last_renew_ms {
        Some(t) => renew_deadline.saturating_sub(Duration::from_millis(now_ms.saturating_sub(t))),
        None => renew_deadline,
    }
}

/// Settings for [`LeaderElector`].
#[derive(Debug, Clone)]
pub struct ElectionConfig {
    /// Lease name (in the elector's namespace).
    pub lease_name: String,
    /// This candidate's identity (the pod name).
    pub identity: String,
    /// How long a lease lives without renewal.
    pub lease_duration: Duration,
    /// A leader that has not renewed for this long steps down (must be < `lease_duration`).
    pub renew_deadline: Duration,
    /// How often to try to acquire or renew.
    pub retry_period: Duration,
}

/// A candidate for the lease. Call [`LeaderElector::try_acquire_or_renew`] periodically, or [`LeaderElector::run`].
#[derive(Debug)]
pub struct LeaderElector {
    api: Api<Lease>,
    config: ElectionConfig,
    observed: Option<LeaseObservation>,
}

impl LeaderElector {
    /// A candidate for `config.lease_name` through `api` (a namespaced `Api<Lease>`).
    pub fn new(api: Api<Lease>, config: ElectionConfig) -> Self {
        Self {
            api,
            config,
            observed: None,
        }
    }

    /// One round: read the lease, then create, renew or take it over if we may. Returns whether we lead now.
    /// A 409 Conflict (someone else wrote first) is "not leader", not an error.
    pub async fn try_acquire_or_renew(&mut self, now_ms: u64) -> Result<bool, kube::Error> {
        let name = self.config.lease_name.clone();
        let current = self.api.get_opt(&name).await?;
        let observation = current.as_ref().map(|lease| self.observe(lease, now_ms));
        let decision = decide(observation.as_ref(), &self.config.identity, now_ms);
        let duration_secs = i32::try_from(self.config.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let result = match (&decision, current) {
            (LeaseDecision::Create, _) => {
                let lease =
                    crate::kube_client::new_lease(&name, &self.config.identity, duration_secs, now_ms);
                self.api.create(&PostParams::default(), &lease).await
            }
            (LeaseDecision::Renew, Some(mut lease)) => {
                crate::kube_client::hold_lease(&mut lease, &self.config.identity, duration_secs, now_ms);
                self.api.replace(&name, &PostParams::default(), &lease).await
            }
            (LeaseDecision::Acquire, Some(mut lease)) => {
                let previous = lease.spec.as_ref().and_then(|s| s.holder_identity.clone());
                crate::kube_client::hold_lease(&mut lease, &self.config.identity, duration_secs, now_ms);
                match previous.as_deref() {
                    None | Some("") => info!(lease = %name, "lease released: taking it"),
                    Some(p) => info!(lease = %name, previous = %p, "lease expired: taking over"),
                }
                self.api.replace(&name, &PostParams::default(), &lease).await
            }
            (
                LeaseDecision::Follow {
                    holder,
                    expires_in_ms,
                },
                _,
            ) => {
                debug!(lease = %name, %holder, expires_in_ms, "following");
                return Ok(false);
            }
            // Renew/Acquire always come with a lease; this arm only satisfies the match.
            (_, None) => return Ok(false),
        };
        match result {
            Ok(written) => {
                self.observe(&written, now_ms);
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                debug!(lease = %name, "lost the race for the lease (409 Conflict)");
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Gives the lease up (on shutdown) so a standby takes over at once instead of after the lease duration.
    pub async fn release(&mut self) -> Result<(), kube::Error> {
        let name = self.config.lease_name.clone();
        let Some(mut lease) = self.api.get_opt(&name).await? else {
            return Ok(());
        };
        if !crate::kube_client::give_up_lease(&mut lease, &self.config.identity) {
            return Ok(());
        }
        match self.api.replace(&name, &PostParams::default(), &lease).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Runs the election until `shutdown` fires, publishing leadership on `leader`. Releases the lease on shutdown.
    ///
    /// As client-go's leaderelection: each attempt of a leader is bounded by the time left to its renew deadline
    /// (a hung GET or PUT is abandoned when that time runs out), and a leader that has not renewed within the
    /// deadline steps down *before* the lease can expire for the others. A candidate's attempt is bounded by the
    /// renew deadline.
    pub async fn run(
        mut self,
        leader: watch::Sender<bool>,
        mut shutdown: watch::Receiver<bool>,
        now_ms: impl Fn() -> u64,
    ) {
        let deadline = self.config.renew_deadline;
        let mut last_renew: Option<u64> = None;
        loop {
            let now = now_ms();
            let leading = *leader.borrow();
            let budget = if leading {
                time_left(last_renew, now, deadline)
            } else {
                deadline
            };
            let attempt = tokio::time::timeout(budget, self.try_acquire_or_renew(now)).await;
            match attempt {
                Ok(Ok(true)) => {
                    if !leading {
                        info!(identity = %self.config.identity, lease = %self.config.lease_name, "became leader");
                    }
                    last_renew = Some(now);
                    leader.send_replace(true);
                }
                Ok(Ok(false)) => {
                    if leading {
                        warn!(identity = %self.config.identity, "lost the lease: stepping down");
                    }
                    last_renew = None;
                    leader.send_replace(false);
                }
                Ok(Err(e)) => warn!(error = %e, "lease request failed"),
                Err(_) => warn!(
                    budget_ms = budget.as_millis(),
                    "lease request did not answer in time: abandoned"
                ),
            }
            if *leader.borrow() && renew_deadline_passed(last_renew, now_ms(), deadline) {
                warn!("could not renew the lease within the renew deadline: stepping down");
                leader.send_replace(false);
                last_renew = None;
            }
            // A leader whose deadline comes before the next retry wakes for it, so it steps down on time.
            let wait = if *leader.borrow() {
                self.config
                    .retry_period
                    .min(time_left(last_renew, now_ms(), deadline))
            } else {
                self.config.retry_period
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.changed() => break,
            }
        }
        if *leader.borrow() {
            leader.send_replace(false);
            match tokio::time::timeout(deadline, self.release()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => warn!(error = %e, "could not release the lease"),
                Err(_) => warn!("releasing the lease did not answer in time"),
            }
        }
    }

    fn observe(&mut self, lease: &Lease, now_ms: u64) -> LeaseObservation {
        let (holder, duration, rv) = crate::kube_client::lease_facts(lease, self.config.lease_duration);
        let obs = LeaseObservation::observe(self.observed.as_ref(), holder, duration, rv, now_ms);
        self.observed = Some(obs.clone());
        obs
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use http::{Method, Request, Response};
    use kube::Client;
    use kube::client::Body;
    use serde_json::{Value, json};

    use super::*;
    use crate::test_support::respond;

    #[test]
    fn a_leader_steps_down_once_renewals_failed_for_the_renew_deadline() {
        let deadline = Duration::from_secs(10);
        assert!(
            !renew_deadline_passed(None, 99_000, deadline),
            "never renewed: nothing to step down from"
        );
        assert!(!renew_deadline_passed(Some(1_000), 10_999, deadline));
        assert!(renew_deadline_passed(Some(1_000), 11_000, deadline));
        assert!(
            !renew_deadline_passed(Some(5_000), 1_000, deadline),
            "a clock step back is not a failure"
        );
    }

    fn config(identity: &str) -> ElectionConfig {
        ElectionConfig {
            lease_name: "tessera-autoscaler".into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    fn lease_json(holder: &str, rv: &str, transitions: i32) -> Value {
        json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "tessera-autoscaler", "namespace": "tessera", "resourceVersion": rv},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "leaseTransitions": transitions,
                     "renewTime": "2026-01-01T00:00:00.000000Z", "acquireTime": "2026-01-01T00:00:00.000000Z"}
        })
    }

    fn status_409() -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409,
               "message": "the object has been modified"})
    }

    async fn body_json(req: Request<Body>) -> Value {
        use http_body_util::BodyExt;
        let bytes = req.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&bytes).unwrap()
    }

    const PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/tessera/leases/tessera-autoscaler";

    fn elector(
        identity: &str,
    ) -> (
        LeaderElector,
        tower_test::mock::Handle<Request<Body>, Response<Body>>,
    ) {
        let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(svc, "tessera");
        (
            LeaderElector::new(Api::namespaced(client, "tessera"), config(identity)),
            handle,
        )
    }

    #[tokio::test]
    async fn creates_a_missing_lease_then_renews_it() {
        let (mut el, mut handle) = elector("pod-a");
        let server = tokio::spawn(async move {
            let (req, send) = handle.next_request().await.unwrap();
            assert_eq!((req.method(), req.uri().path()), (&Method::GET, PATH));
            respond(
                send,
                404,
                &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}),
            );
            let (req, send) = handle.next_request().await.unwrap();
            assert_eq!(req.method(), Method::POST);
            assert_eq!(
                req.uri().path(),
                "/apis/coordination.k8s.io/v1/namespaces/tessera/leases"
            );
            let body = body_json(req).await;
            assert_eq!(body["spec"]["holderIdentity"], "pod-a");
            assert_eq!(body["spec"]["leaseDurationSeconds"], 15);
            assert_eq!(body["spec"]["leaseTransitions"], 0);
            respond(send, 201, &lease_json("pod-a", "1", 0));
            // Renewal: GET, then PUT with the resourceVersion that was read.
            let (_, send) = handle.next_request().await.unwrap();
            respond(send, 200, &lease_json("pod-a", "1", 0));
            let (req, send) = handle.next_request().await.unwrap();
            assert_eq!((req.method(), req.uri().path()), (&Method::PUT, PATH));
            let body = body_json(req).await;
            assert_eq!(body["metadata"]["resourceVersion"], "1");
            assert_eq!(body["spec"]["holderIdentity"], "pod-a");
            assert_ne!(body["spec"]["renewTime"], "2026-01-01T00:00:00.000000Z");
            respond(send, 200, &lease_json("pod-a", "2", 0));
        });
        assert!(el.try_acquire_or_renew(1_000).await.unwrap());
        assert!(el.try_acquire_or_renew(3_000).await.unwrap());
        server.await.unwrap();
    }

    #[tokio::test]
    async fn follows_a_live_lease_and_takes_over_once_it_expires() {
        let (mut el, mut handle) = elector("pod-a");
        let server = tokio::spawn(async move {
            // Seen at t=1s, still the same version at t=10s: follow (no write).
            for _ in 0..2 {
                let (req, send) = handle.next_request().await.unwrap();
                assert_eq!(req.method(), Method::GET);
                respond(send, 200, &lease_json("pod-b", "7", 3));
            }
            // t=17s: 16 s since first seen > 15 s: take over with a PUT on version 7.
            let (_, send) = handle.next_request().await.unwrap();
            respond(send, 200, &lease_json("pod-b", "7", 3));
            let (req, send) = handle.next_request().await.unwrap();
            assert_eq!(req.method(), Method::PUT);
            let body = body_json(req).await;
            assert_eq!(body["metadata"]["resourceVersion"], "7");
            assert_eq!(body["spec"]["holderIdentity"], "pod-a");
            assert_eq!(body["spec"]["leaseTransitions"], 4);
            respond(send, 200, &lease_json("pod-a", "8", 4));
        });
        assert!(!el.try_acquire_or_renew(1_000).await.unwrap());
        assert!(!el.try_acquire_or_renew(10_000).await.unwrap());
        assert!(el.try_acquire_or_renew(17_000).await.unwrap());
        server.await.unwrap();
    }

    #[tokio::test]
    async fn a_renewed_lease_restarts_the_expiry_clock() {
        let (mut el, mut handle) = elector("pod-a");
        let server = tokio::spawn(async move {
            let (_, send) = handle.next_request().await.unwrap();
            respond(send, 200, &lease_json("pod-b", "7", 0));
            // The holder renewed (new version) at some point: expiry counts from when we saw version 8.
            let (_, send) = handle.next_request().await.unwrap();
            respond(send, 200, &lease_json("pod-b", "8", 0));
            let (req, send) = handle.next_request().await.unwrap();
            assert_eq!(
                req.method(),
                Method::GET,
                "no takeover of a lease renewed 6 s ago"
            );
            respond(send, 200, &lease_json("pod-b", "8", 0));
        });
        assert!(!el.try_acquire_or_renew(0).await.unwrap());
        assert!(!el.try_acquire_or_renew(14_000).await.unwrap());
        assert!(!el.try_acquire_or_renew(20_000).await.unwrap());
        server.await.unwrap();
    }

    /// A clock in Unix ms that follows tokio's (paused) time, starting at 1,000,000 ms.
    fn tokio_clock() -> impl Fn() -> u64 {
        let start = tokio::time::Instant::now();
        move || 1_000_000 + u64::try_from(start.elapsed().as_millis()).unwrap()
    }

    /// Item 2: a renewal whose GET never answers. Before, the leader stayed leader for as long as the call hung
    /// (120 s seen) while a follower took over at 15 s; now it steps down at the 10 s renew deadline.
    #[tokio::test(start_paused = true)]
    async fn run_steps_down_when_a_renewal_hangs_past_the_deadline() {
        let (el, mut handle) = elector("pod-a");
        let (leader_tx, mut leader_rx) = watch::channel(false);
        let (_shutdown_tx, shutdown_rx) = watch::channel(false);
        let started = tokio::time::Instant::now();
        let run = tokio::spawn(el.run(leader_tx, shutdown_rx, tokio_clock()));
        // t=0: no lease, create it.
        let (_, send) = handle.next_request().await.unwrap();
        respond(
            send,
            404,
            &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}),
        );
        let (req, send) = handle.next_request().await.unwrap();
        assert_eq!(req.method(), Method::POST);
        respond(send, 201, &lease_json("pod-a", "1", 0));
        leader_rx.wait_for(|l| *l).await.unwrap();
        // t=2s: the renewal's GET hangs (the API server is unreachable); keep its responder so it never fails.
        let (req, _hung) = handle.next_request().await.unwrap();
        assert_eq!(req.method(), Method::GET);
        tokio::time::timeout(Duration::from_secs(120), leader_rx.wait_for(|l| !*l))
            .await
            .expect("still leader 120 s into a hung renewal")
            .unwrap();
        let stepped_down_at = started.elapsed();
        assert!(
            stepped_down_at <= Duration::from_secs(10),
            "stepped down {stepped_down_at:?} after the last renewal; the lease lets others in at 15 s"
        );
        assert!(
            stepped_down_at >= Duration::from_secs(9),
            "not before the deadline: {stepped_down_at:?}"
        );
        // It keeps trying as a candidate, each attempt bounded too.
        let (req, _hung2) = handle.next_request().await.unwrap();
        assert_eq!(req.method(), Method::GET);
        run.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn run_renews_and_releases_the_lease_on_shutdown() {
        let (el, mut handle) = elector("pod-a");
        let (leader_tx, mut leader_rx) = watch::channel(false);
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let run = tokio::spawn(el.run(leader_tx, shutdown_rx, tokio_clock()));
        let (_, send) = handle.next_request().await.unwrap();
        respond(send, 200, &lease_json("", "4", 1));
        let (req, send) = handle.next_request().await.unwrap();
        assert_eq!(req.method(), Method::PUT);
        respond(send, 200, &lease_json("pod-a", "5", 2));
        leader_rx.wait_for(|l| *l).await.unwrap();
        // Renewals every retry period keep it leading well past the renew deadline.
        for rv in 5..12 {
            let (_, send) = handle.next_request().await.unwrap();
            respond(send, 200, &lease_json("pod-a", &rv.to_string(), 2));
            let (req, send) = handle.next_request().await.unwrap();
            assert_eq!(req.method(), Method::PUT);
            respond(send, 200, &lease_json("pod-a", &(rv + 1).to_string(), 2));
        }
        assert!(*leader_rx.borrow());
        shutdown_tx.send_replace(true);
        // Release: GET, then PUT with no holder.
        let (_, send) = handle.next_request().await.unwrap();
        respond(send, 200, &lease_json("pod-a", "12", 2));
        let (req, send) = handle.next_request().await.unwrap();
        let body = body_json(req).await;
        assert_eq!(body["spec"]["holderIdentity"], Value::Null);
        respond(send, 200, &lease_json("", "13", 2));
        run.await.unwrap();
        assert!(!*leader_rx.borrow());
    }

    #[test]
    fn time_left_to_the_deadline() {
        let d = Duration::from_secs(10);
        assert_eq!(time_left(Some(1_000), 3_000, d), Duration::from_secs(8));
        assert_eq!(time_left(Some(1_000), 30_000, d), Duration::ZERO);
        assert_eq!(time_left(None, 30_000, d), d);
    }

    #[tokio::test]
    async fn losing_the_race_is_not_an_error() {
        let (mut el, mut handle) = elector("pod-a");
        let server = tokio::spawn(async move {
            let (_, send) = handle.next_request().await.unwrap();
            respond(send, 200, &lease_json("", "7", 0));
            let (req, send) = handle.next_request().await.unwrap();
            assert_eq!(req.method(), Method::PUT);
            respond(send, 409, &status_409());
        });
        assert!(!el.try_acquire_or_renew(0).await.unwrap());
        server.await.unwrap();
    }
}
