//! Cooperative revocation, written once for every backend
//! (`conformance_suite!(revocation fixture)`): `request_release` asks every
//! holder of a name as one kind, returns them, and creates nothing on a name
//! nobody holds; the holder's guard hears it (`release_requested()`,
//! `is_release_requested()`, its `watch()`), keeps its lease, and the next
//! holder is not asked; a set of names hears a request on any member.
// Checks unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use distlock_core::{Error, LeaseOptions, LockGuard, LockSet, PrimitiveKind, Provider};

use crate::conformance::{Fixture, SLACK};
use crate::unique_name;

/// The lease of the holders here: a TTL lease renewed every second (a
/// TTL holder hears a request at its next renewal at the latest), or the
/// session's.
fn lease<F: Fixture>(fx: &F, client: &dyn Provider) -> LeaseOptions {
    if fx.session() {
        client.default_lease()
    } else {
        LeaseOptions::new(Duration::from_secs(3)).expect("valid TTL")
    }
}

/// How long a holder may take to hear a request: one renewal interval (1 s
/// for [`lease`]'s TTL) plus slack.
const HEARD: Duration = Duration::from_secs(1).saturating_add(SLACK);

/// Takes `name` as `kind` through `client`: the guard (a leadership's
/// guard is reached through its own methods, so an election is handled
/// apart).
async fn hold(client: &Arc<dyn Provider>, name: &str, kind: PrimitiveKind) -> LockGuard {
    let lock = match kind {
        PrimitiveKind::Mutex => client.mutex(name),
        PrimitiveKind::FairMutex => client.fair_mutex(name),
        PrimitiveKind::ReadWrite => client.rw_lock(name).map(|rw| rw.write()),
        _ => client
            .semaphore(name, 2)
            .map(|s| s as Arc<dyn distlock_core::Lock>),
    }
    .unwrap();
    tokio::time::timeout(SLACK, lock.lock())
        .await
        .unwrap_or_else(|_| panic!("{kind}: {name} is free"))
        .unwrap()
}

/// Nobody holds `name` as `kind`: asking asks nobody, and leaves nothing
/// that `inspect` (or a later holder) could see.
async fn ask_nobody(operator: &Arc<dyn Provider>, name: &str, kind: PrimitiveKind) {
    let asked = operator.request_release(name, kind).await.unwrap();
    assert!(asked.is_empty(), "{kind}: asked {asked:?}");
    let snapshot = operator.inspect(name, kind).await.unwrap();
    assert!(
        !snapshot.is_held() && snapshot.waiters.count == 0,
        "{kind}: {snapshot:?}"
    );
}

/// Each kind: the holder is asked, hears it, keeps its lease; asking again
/// is harmless; `inspect` shows the request; after its release the next
/// holder of the name is not asked.
pub async fn request_release_asks_the_holder<F: Fixture>(fx: &F) {
    let holder = fx.client().await;
    let operator = fx.client().await;
    let holder = holder.with_lease(lease(fx, holder.as_ref())).unwrap();
    for kind in [
        PrimitiveKind::Mutex,
        PrimitiveKind::FairMutex,
        PrimitiveKind::ReadWrite,
        PrimitiveKind::Semaphore,
    ] {
        let name = unique_name("ask");
        ask_nobody(&operator, &name, kind).await;
        let guard = hold(&holder, &name, kind).await;
        assert!(!guard.is_release_requested(), "{kind}");
        let mut watch = guard.watch();
        let asked = operator.request_release(&name, kind).await.unwrap();
        assert_eq!(asked.len(), 1, "{kind}: {asked:?}");
        assert_eq!(
            asked[0].fencing_token,
            Some(guard.fencing_token()),
            "{kind}: {asked:?}"
        );
        assert_eq!(asked[0].owner.as_deref(), Some(holder.owner()), "{kind}");
        assert!(asked[0].release_requested, "{kind}: {asked:?}");
        tokio::time::timeout(HEARD, guard.release_requested())
            .await
            .unwrap_or_else(|_| panic!("{kind}: the holder did not hear the request"));
        assert!(guard.is_release_requested(), "{kind}");
        assert!(watch.is_release_requested(), "{kind}");
        assert!(watch.release_requested().await, "{kind}");
        // The request ends nothing: still held, and the name still taken.
        assert!(guard.is_held(), "{kind}: {:?}", guard.status());
        let snapshot = operator.inspect(&name, kind).await.unwrap();
        assert_eq!(snapshot.holders.len(), 1, "{kind}: {snapshot:?}");
        assert!(
            snapshot.holders[0].release_requested,
            "{kind}: {snapshot:?}"
        );
        let again = operator.request_release(&name, kind).await.unwrap();
        assert_eq!(again.len(), 1, "{kind}: {again:?}");
        assert!(guard.is_held(), "{kind}");
        guard.release().await.unwrap();

        // The next holder is a new hold: not asked, now or after a renewal.
        let next = hold(&holder, &name, kind).await;
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert!(!next.is_release_requested(), "{kind}: a stale request");
        let snapshot = operator.inspect(&name, kind).await.unwrap();
        assert!(
            snapshot.holders.iter().all(|h| !h.release_requested),
            "{kind}: {snapshot:?}"
        );
        next.release().await.unwrap();
    }
}

/// Several holders at once (two readers, two permits): every one is asked.
pub async fn request_release_asks_every_holder<F: Fixture>(fx: &F) {
    let a = fx.client().await;
    let b = fx.client().await;
    let operator = fx.client().await;
    let a = a.with_lease(lease(fx, a.as_ref())).unwrap();
    let b = b.with_lease(lease(fx, b.as_ref())).unwrap();
    let name = unique_name("readers");
    let r1 = a.rw_lock(&name).unwrap().read().lock().await.unwrap();
    let r2 = b.rw_lock(&name).unwrap().read().lock().await.unwrap();
    let asked = operator
        .request_release(&name, PrimitiveKind::ReadWrite)
        .await
        .unwrap();
    assert_eq!(asked.len(), 2, "{asked:?}");
    for guard in [&r1, &r2] {
        tokio::time::timeout(HEARD, guard.release_requested())
            .await
            .expect("every reader hears it");
        assert!(guard.is_held());
    }
    r1.release().await.unwrap();
    r2.release().await.unwrap();

    let name = unique_name("permits");
    let p1 = hold(&a, &name, PrimitiveKind::Semaphore).await;
    let p2 = hold(&b, &name, PrimitiveKind::Semaphore).await;
    let asked = operator
        .request_release(&name, PrimitiveKind::Semaphore)
        .await
        .unwrap();
    assert_eq!(asked.len(), 2, "{asked:?}");
    for guard in [&p1, &p2] {
        tokio::time::timeout(HEARD, guard.release_requested())
            .await
            .expect("every permit holder hears it");
    }
    p1.release().await.unwrap();
    p2.release().await.unwrap();
}

/// A leader asked to step down hears it and stays leader until it resigns;
/// the next leader is not asked.
pub async fn request_release_asks_the_leader<F: Fixture>(fx: &F) {
    let a = fx.client().await;
    let operator = fx.client().await;
    let a = a.with_lease(lease(fx, a.as_ref())).unwrap();
    let name = unique_name("leader");
    ask_nobody(&operator, &name, PrimitiveKind::Election).await;
    let election = a.election(&name).unwrap();
    let leader = election.campaign("first").await.unwrap();
    let asked = operator
        .request_release(&name, PrimitiveKind::Election)
        .await
        .unwrap();
    assert_eq!(asked.len(), 1, "{asked:?}");
    tokio::time::timeout(HEARD, leader.release_requested())
        .await
        .expect("the leader hears it");
    assert!(leader.is_release_requested() && leader.is_leader());
    assert_eq!(
        election.leader().await.unwrap().map(|l| l.id),
        Some("first".to_owned())
    );
    leader.resign().await.unwrap();
    let next = election.campaign("second").await.unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(!next.is_release_requested());
    next.resign().await.unwrap();
}

/// A set of names hears a request on any member, and names it.
pub async fn request_release_reaches_a_set<F: Fixture>(fx: &F) {
    let a = fx.client().await;
    let operator = fx.client().await;
    let a = a.with_lease(lease(fx, a.as_ref())).unwrap();
    let (x, y) = (unique_name("set-x"), unique_name("set-y"));
    let set = LockSet::new(a.as_ref(), [x.as_str(), y.as_str()]).unwrap();
    let guard = set.lock().await.unwrap();
    assert_eq!(guard.release_requests().count(), 0);
    let asked = operator
        .request_release(&y, PrimitiveKind::Mutex)
        .await
        .unwrap();
    assert_eq!(asked.len(), 1, "{asked:?}");
    let named = tokio::time::timeout(HEARD, guard.release_requested())
        .await
        .expect("the set hears it");
    assert_eq!(named.as_str(), y);
    assert_eq!(
        guard
            .release_requests()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        vec![y.clone()]
    );
    assert!(guard.is_held());
    guard.release().await.unwrap();
}

/// Bad input is a typed error and creates nothing.
pub async fn request_release_bad_input<F: Fixture>(fx: &F) {
    let operator = fx.client().await;
    for bad in ["", "a\0b", &"x".repeat(10_000)] {
        let e = operator
            .request_release(bad, PrimitiveKind::Mutex)
            .await
            .unwrap_err();
        assert!(matches!(e, Error::InvalidName { .. }), "{bad:?}: {e:?}");
    }
    // Another kind holds the name: that holder is not this kind's, and is
    // not asked.
    let holder = fx.client().await;
    let holder = holder.with_lease(lease(fx, holder.as_ref())).unwrap();
    let name = unique_name("other-kind");
    let guard = hold(&holder, &name, PrimitiveKind::Semaphore).await;
    match operator.request_release(&name, PrimitiveKind::Mutex).await {
        Ok(asked) => assert!(asked.is_empty(), "{asked:?}"),
        Err(e) => assert!(matches!(e, Error::Conflict { .. }), "{e:?}"),
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(!guard.is_release_requested());
    guard.release().await.unwrap();
}
