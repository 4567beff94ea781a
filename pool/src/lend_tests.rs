//! Lending a sleeping pod's room (`lendSleepers`): the decision (`PoolIndex::decide`, through
//! `core::pack::sleeping`) and the leader's eviction (`manager/lend.rs`) against the in-memory API server of
//! `tests.rs`, which answers pods and Leases with resourceVersion and uid preconditions.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use super::state::{self, Decision, LENT_BY_SLEEPERS, PoolIndex};
use super::tests::{capacity, client, request, reservations_on, resv, seeded, tenant, with_spares};
use super::*;

/// The pool config of `tests.rs` (3 GPUs, each handed out once) with one spare capacity pod, lending on or off.
fn cfg(lend: bool) -> Arc<PoolsConfig> {
    let mut c = (*with_spares(3, 1)).clone();
    c.lend_sleepers = lend;
    Arc::new(c)
}

/// A tenant pod with a uid, Ready or not, told to sleep or not.
fn pod(name: &str, reservation: &str, cap: &str, ready: bool, told_to_sleep: bool) -> Pod {
    let mut p = tenant("team", name, reservation, cap);
    p.metadata.uid = Some(format!("uid-{name}"));
    if told_to_sleep {
        p.metadata.annotations.as_mut().unwrap().insert(
            tessera_core::sleep::command::ANNOTATION.into(),
            "sleep level=1 since=1000".into(),
        );
    }
    p.status = Some(
        serde_json::from_value(json!({"phase": "Running",
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}))
        .unwrap(),
    );
    p
}

/// gpu-a: an awake tenant (300) and a sleeping one (600, its reservation marked asleep by the leader or not yet);
/// gpu-b: 800 taken. A newcomer of 500 fits on neither.
fn pool(sleeper_ready: bool, marked: bool) -> Vec<Pod> {
    let c = cfg(true);
    let mut s = resv("s", 600, 0);
    s.asleep_since = marked.then_some(3);
    vec![
        capacity(&c, "gpu-a", &[resv("w", 300, 0), s], "node-1", "GPU-a"),
        capacity(&c, "gpu-b", &[resv("o", 800, 0)], "node-2", "GPU-b"),
        pod("w", "w", "gpu-a", true, false),
        // Told to sleep and not Ready: asleep. Told to sleep but Ready again: woken by a request.
        pod("s", "s", "gpu-a", sleeper_ready, true),
        pod("o", "o", "gpu-b", true, false),
    ]
}

fn index(pods: &[Pod]) -> PoolIndex {
    let mut idx = PoolIndex::new("p");
    for p in pods {
        idx.apply_capacity(p);
        idx.apply_tenant(p);
    }
    idx
}

#[test]
fn a_newcomer_takes_a_sleepers_room_only_where_the_alternative_is_opening_a_gpu() {
    let shape = cfg(true).pools[0].shape();
    let idx = index(&pool(false, true));
    // Lending off: no room, a GPU opens.
    assert!(matches!(
        idx.decide(&shape, &resv("n", 500, 5), false, 3).unwrap(),
        Decision::NoRoom { .. }
    ));
    // Lending on: the sleeper's room on gpu-a, the sleeper marked lent in the same write.
    match idx.decide(&shape, &resv("n", 500, 5), true, 3).unwrap() {
        Decision::Place {
            capacity_pod,
            reservations,
            reason,
            evicts,
            ..
        } => {
            assert_eq!((capacity_pod.as_str(), reason), ("gpu-a", LENT_BY_SLEEPERS));
            assert_eq!(evicts, ["s"]);
            let s = reservations.iter().find(|r| r.id == "s").unwrap();
            assert_eq!(s.evicted_at, Some(5));
            assert!(reservations.iter().any(|r| r.id == "n" && r.evicted_at.is_none()));
        }
        other => panic!("expected a lent placement, got {other:?}"),
    }
    // Where even the sleeper's room is too small, a GPU opens and nobody is evicted.
    assert!(matches!(
        idx.decide(&shape, &resv("big", 800, 5), true, 3).unwrap(),
        Decision::NoRoom { .. }
    ));
    // A newcomer that fits beside the sleeper goes there without lending anything.
    match idx.decide(&shape, &resv("small", 150, 5), true, 3).unwrap() {
        Decision::Place {
            capacity_pod, evicts, ..
        } => assert_eq!((capacity_pod.as_str(), evicts.len()), ("gpu-b", 0)),
        other => panic!("expected gpu-b, got {other:?}"),
    }
    // A reservation not marked asleep is never lent, whatever its pod looks like to this replica.
    let unmarked = index(&pool(false, false));
    assert!(matches!(
        unmarked.decide(&shape, &resv("n", 500, 5), true, 3).unwrap(),
        Decision::NoRoom { .. }
    ));
    // Once lent, its room is the newcomer's: the packer counts the lent reservation as nothing.
    let mut lent = resv("s", 600, 0);
    lent.evicted_at = Some(5);
    let c = cfg(true);
    let after = index(&[capacity(
        &c,
        "gpu-a",
        &[resv("w", 300, 0), lent, resv("n", 500, 5)],
        "node-1",
        "GPU-a",
    )]);
    let (packer, _) = after.packer(&shape);
    assert_eq!(packer.replica_count(), 2);
}

#[test]
fn the_leader_marks_a_sleeping_pods_reservation_and_clears_the_mark_once_it_is_awake() {
    // Told to sleep and not Ready: marked.
    let marks = index(&pool(false, false)).sleep_marks(7);
    assert_eq!(marks.len(), 1);
    let (name, _, list) = &marks[0];
    assert_eq!(name, "gpu-a");
    let s = list.iter().find(|r| r.id == "s").unwrap();
    assert_eq!(s.asleep_since, Some(7));
    assert!(
        list.iter()
            .filter(|r| r.id != "s")
            .all(|r| r.asleep_since.is_none())
    );
    // Already marked: nothing to write.
    assert!(index(&pool(false, true)).sleep_marks(8).is_empty());
    // Woken by a request (Ready again, the instruction still there): the mark goes.
    let marks = index(&pool(true, true)).sleep_marks(9);
    assert_eq!(marks.len(), 1);
    assert!(marks[0].2.iter().all(|r| r.asleep_since.is_none()));
    // A reservation whose pod is gone or not yet there is not asleep.
    let c = cfg(true);
    let mut orphan = resv("x", 100, 0);
    orphan.asleep_since = Some(1);
    let marks = index(&[capacity(&c, "gpu-c", &[orphan], "node-3", "GPU-c")]).sleep_marks(9);
    assert!(marks[0].2[0].asleep_since.is_none());
}

#[tokio::test]
async fn the_leader_evicts_the_lent_sleeper_behind_the_gpus_startup_lease_then_releases_it() {
    let api = seeded(&pool(false, false));
    let kube = client(api.clone());
    let webhook = PoolManager::new(kube.clone(), cfg(true), "p").unwrap();
    let leader = PoolManager::new(kube, cfg(true), "p").unwrap();
    leader.rebuild().await.unwrap();
    // The leader marks the sleeper's reservation; the webhook, which reads capacity pods only, then sees it.
    leader.reconcile(9).await.unwrap();
    let s = reservations_on(&api, "gpu-a")
        .into_iter()
        .find(|r| r.id == "s")
        .unwrap();
    assert_eq!(s.asleep_since, Some(9));
    webhook.rebuild().await.unwrap();

    // Lending comes before the spare: the spare is a GPU opened.
    let pods_before = api.lock().unwrap().pods.len();
    let placed = webhook.reserve(request("n", 500), 10).await.unwrap();
    assert_eq!(
        (placed.capacity_pod.as_str(), placed.reason.as_str()),
        ("gpu-a", LENT_BY_SLEEPERS)
    );
    assert_eq!(
        api.lock().unwrap().pods.len(),
        pods_before,
        "no capacity pod created"
    );
    assert!(
        reservations_on(&api, "tessera-gpu-p-0").is_empty(),
        "the spare is not booked"
    );

    // The leader learns of the loan (its watch; here a re-read) and carries it out.
    leader.rebuild().await.unwrap();
    let report = leader.reconcile(11).await.unwrap();
    assert_eq!(report.sleepers_evicted, 1);
    {
        let a = api.lock().unwrap();
        assert!(a.pod("team", "s").is_none(), "the sleeper's pod is deleted");
        let delete = a
            .log
            .iter()
            .find(|l| l.method == "DELETE" && l.path.ends_with("/namespaces/team/pods/s"))
            .unwrap();
        assert_eq!(
            delete.body["preconditions"]["uid"], "uid-s",
            "only that pod, not one reusing its name"
        );
        let lease = &a.leases[&("tessera-system".to_string(), "tessera-startup-gpu-a".to_string())];
        assert_eq!(lease["spec"]["holderIdentity"], "tessera-pool/evicting/team/s");
        assert!(a.pod("team", "w").is_some() && a.pod("team", "o").is_some());
    }

    // The pod is gone (the tenant watch): its reservation goes, and the next pass releases the Lease, so the
    // newcomer's sidecar takes it at its next read.
    assert!(leader.tenant_deleted("team/s", 12).await.unwrap());
    let ids: Vec<String> = reservations_on(&api, "gpu-a").into_iter().map(|r| r.id).collect();
    assert_eq!(ids, ["w", "n"]);
    leader.reconcile(13).await.unwrap();
    let a = api.lock().unwrap();
    let lease = &a.leases[&("tessera-system".to_string(), "tessera-startup-gpu-a".to_string())];
    assert!(lease["spec"]["holderIdentity"].is_null(), "released: {lease}");
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 1);
}

#[tokio::test]
async fn without_lending_a_sleepers_room_is_kept_and_a_gpu_opens() {
    let api = seeded(&pool(false, true));
    let leader = PoolManager::new(client(api.clone()), cfg(false), "p").unwrap();
    leader.rebuild().await.unwrap();
    leader.reconcile(9).await.unwrap();
    let webhook = PoolManager::new(client(api.clone()), cfg(false), "p").unwrap();
    webhook.rebuild().await.unwrap();
    let placed = webhook.reserve(request("n", 500), 10).await.unwrap();
    assert_eq!(
        (placed.capacity_pod.as_str(), placed.reason.as_str()),
        ("tessera-gpu-p-0", state::BOOKED_SPARE),
        "the spare: a GPU opens"
    );
    assert!(
        reservations_on(&api, "gpu-a")
            .iter()
            .all(|r| r.evicted_at.is_none())
    );
    let report = leader.reconcile(11).await.unwrap();
    assert_eq!(report.sleepers_evicted, 0);
    assert!(api.lock().unwrap().pod("team", "s").is_some());
}

/// What the pool publishes for the controller's sleeper budget (`PoolIndex::gpu_tenants`): each GPU's tenants,
/// asleep or not, a let-go sleeper flagged, and a lent reservation (leaving) left out.
#[test]
fn gpu_tenants_show_sleepers_and_let_go_ones_and_leave_lent_ones_out() {
    let mut pods = pool(false, true);
    let idx = index(&pods);
    let mut t = idx.gpu_tenants();
    t.sort_by(|a, b| a.0.cmp(&b.0));
    type View = Vec<(String, Vec<(Option<String>, bool, bool)>)>;
    let view = |t: &[(String, Vec<crate::sleepers::GpuTenant>)]| -> View {
        t.iter()
            .map(|(g, list)| {
                (
                    g.clone(),
                    list.iter()
                        .map(|x| (x.pod.clone(), x.asleep, x.evicted))
                        .collect(),
                )
            })
            .collect()
    };
    let key = |n: &str| Some(format!("team/{n}"));
    assert_eq!(
        view(&t),
        [
            (
                "gpu-a".into(),
                vec![(key("w"), false, false), (key("s"), true, false)]
            ),
            ("gpu-b".into(), vec![(key("o"), false, false)]),
        ]
    );
    // Let go by its model's controller after its instruction: still asleep, no longer a sleeper the budget counts.
    pods[3].metadata.annotations.as_mut().unwrap().insert(
        tessera_core::sleep::evict::ANNOTATION.into(),
        "at=2000 reason=budget".into(),
    );
    let t = index(&pods).gpu_tenants();
    let a = &t.iter().find(|(g, _)| g == "gpu-a").unwrap().1;
    assert_eq!((a[1].asleep, a[1].evicted), (true, true));
    // Lent (evictedAt on the reservation): leaving, not a tenant.
    let c = cfg(true);
    let mut s = resv("s", 600, 0);
    s.evicted_at = Some(5);
    pods[0] = capacity(&c, "gpu-a", &[resv("w", 300, 0), s], "node-1", "GPU-a");
    let t = index(&pods).gpu_tenants();
    assert_eq!(t.iter().find(|(g, _)| g == "gpu-a").unwrap().1.len(), 1);
}
