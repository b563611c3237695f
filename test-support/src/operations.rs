//! The operations checks, written once for every backend
//! (`conformance_suite!(operations fixture)`): `inspect` shows the right
//! holders (owner identity, fencing token, acquired at, lease left),
//! waiters, leader and permits for every primitive, reading changes nothing,
//! and `force_release` lets the next waiter in, fires the evicted holder's
//! `lost()` and advances the fence past the evicted token.
// Checks unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use distlock_core::{
    HoldRole, LeaseLeft, LeaseOptions, LockGuard, PrimitiveKind, Provider, Snapshot,
};

use crate::conformance::{Fixture, SLACK};
use crate::unique_name;

/// A lease long enough that only a force-release ends it in a test.
fn lease<F: Fixture>(fx: &F, client: &dyn Provider) -> LeaseOptions {
    if fx.session() {
        client.default_lease()
    } else {
        LeaseOptions::new(Duration::from_secs(30)).expect("valid TTL")
    }
}

/// Polls `inspect` until `done` holds (waiters queue asynchronously).
async fn inspect_until(
    client: &dyn Provider,
    name: &str,
    kind: PrimitiveKind,
    done: impl Fn(&Snapshot) -> bool,
) -> Snapshot {
    let deadline = tokio::time::Instant::now() + SLACK;
    loop {
        let snapshot = client.inspect(name, kind).await.expect("inspect");
        if done(&snapshot) || tokio::time::Instant::now() >= deadline {
            return snapshot;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Checks one distlock holder against the guard it holds.
fn check_holder(
    snapshot: &Snapshot,
    guard: &LockGuard,
    owner: &str,
    role: HoldRole,
    before: SystemTime,
    session: bool,
) {
    let holder = snapshot
        .holders
        .iter()
        .find(|h| h.fencing_token == Some(guard.fencing_token()))
        .unwrap_or_else(|| {
            panic!(
                "no holder with token {}: {snapshot:?}",
                guard.fencing_token()
            )
        });
    assert_eq!(holder.role, role, "{snapshot:?}");
    assert_eq!(holder.owner.as_deref(), Some(owner), "{snapshot:?}");
    assert_eq!(holder.foreign, None, "{snapshot:?}");
    let at = holder.acquired_at.expect("acquired at");
    // Server clocks: the same machine, with slack for rounding.
    assert!(
        at + SLACK >= before && at <= SystemTime::now() + SLACK,
        "acquired at {at:?}, before {before:?}: {snapshot:?}"
    );
    match holder.lease {
        LeaseLeft::Ttl(left) => {
            assert!(!session, "{snapshot:?}");
            assert!(
                left > Duration::ZERO && left <= Duration::from_secs(30),
                "{snapshot:?}"
            );
        }
        LeaseLeft::Session { .. } => assert!(session, "{snapshot:?}"),
        other => panic!("lease {other:?}: {snapshot:?}"),
    }
}

/// A mutex and a fair mutex: the holder, and for the fair mutex its queued
/// waiter with identity; an unheld name is empty; reading changes nothing.
pub async fn inspect_mutexes<F: Fixture>(fx: &F) {
    let holder = fx.client().await;
    let waiter = fx.client().await;
    let reader = fx.client().await;
    for kind in [PrimitiveKind::Mutex, PrimitiveKind::FairMutex] {
        let name = unique_name("inspect");
        let empty = reader.inspect(&name, kind).await.unwrap();
        assert!(!empty.is_held() && empty.waiters.count == 0, "{empty:?}");
        let before = SystemTime::now();
        let lease = lease(fx, holder.as_ref());
        let holder = holder.with_lease(lease).unwrap();
        let lock = match kind {
            PrimitiveKind::Mutex => holder.mutex(&name),
            _ => holder.fair_mutex(&name),
        }
        .unwrap();
        let guard = lock.try_lock().await.unwrap().expect("free");
        let waiter = waiter.with_lease(lease).unwrap();
        let waiting = match kind {
            PrimitiveKind::Mutex => waiter.mutex(&name),
            _ => waiter.fair_mutex(&name),
        }
        .unwrap();
        let task = tokio::spawn(async move { waiting.lock().await });
        let fair = kind == PrimitiveKind::FairMutex;
        let snapshot = inspect_until(reader.as_ref(), &name, kind, |s| {
            !fair || s.waiters.count == 1
        })
        .await;
        assert_eq!(snapshot.kind, kind);
        assert_eq!(snapshot.name.as_str(), name);
        assert_eq!(snapshot.holders.len(), 1, "{snapshot:?}");
        check_holder(
            &snapshot,
            &guard,
            holder.owner(),
            HoldRole::Exclusive,
            before,
            fx.session(),
        );
        if fair {
            assert_eq!(snapshot.waiters.count, 1, "{snapshot:?}");
            assert_eq!(snapshot.waiters.owners, vec![waiter.owner().to_owned()]);
        }
        // Reading took nothing and changed nothing.
        assert!(guard.is_held());
        assert!(!task.is_finished());
        guard.release().await.unwrap();
        let next = tokio::time::timeout(SLACK, task)
            .await
            .expect("the waiter got the lock")
            .unwrap()
            .unwrap();
        let snapshot = reader.inspect(&name, kind).await.unwrap();
        check_holder(
            &snapshot,
            &next,
            waiter.owner(),
            HoldRole::Exclusive,
            before,
            fx.session(),
        );
        next.release().await.unwrap();
        let snapshot = reader.inspect(&name, kind).await.unwrap();
        assert!(!snapshot.is_held(), "{snapshot:?}");
    }
}

/// A read-write lock: two readers held, a writer queued behind them.
pub async fn inspect_rw_lock<F: Fixture>(fx: &F) {
    let a = fx.client().await;
    let b = fx.client().await;
    let name = unique_name("inspect-rw");
    let before = SystemTime::now();
    let lease_a = lease(fx, a.as_ref());
    let r1 = a
        .with_lease(lease_a)
        .unwrap()
        .rw_lock(&name)
        .unwrap()
        .read()
        .try_lock()
        .await;
    let r2 = b
        .with_lease(lease(fx, b.as_ref()))
        .unwrap()
        .rw_lock(&name)
        .unwrap()
        .read()
        .try_lock()
        .await;
    let (r1, r2) = (r1.unwrap().unwrap(), r2.unwrap().unwrap());
    let writer = b
        .with_lease(lease(fx, b.as_ref()))
        .unwrap()
        .rw_lock(&name)
        .unwrap()
        .write();
    let task = tokio::spawn(async move { writer.lock().await });
    let snapshot = inspect_until(a.as_ref(), &name, PrimitiveKind::ReadWrite, |s| {
        s.waiters.count == 1
    })
    .await;
    assert_eq!(snapshot.holders.len(), 2, "{snapshot:?}");
    check_holder(
        &snapshot,
        &r1,
        a.owner(),
        HoldRole::Read,
        before,
        fx.session(),
    );
    check_holder(
        &snapshot,
        &r2,
        b.owner(),
        HoldRole::Read,
        before,
        fx.session(),
    );
    assert_eq!(snapshot.waiters.count, 1, "{snapshot:?}");
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    let w = tokio::time::timeout(SLACK, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let snapshot = a.inspect(&name, PrimitiveKind::ReadWrite).await.unwrap();
    check_holder(
        &snapshot,
        &w,
        b.owner(),
        HoldRole::Write,
        before,
        fx.session(),
    );
    w.release().await.unwrap();
}

/// A semaphore of 3 with 2 permits taken: both permits, and the number.
pub async fn inspect_semaphore<F: Fixture>(fx: &F) {
    let a = fx.client().await;
    let name = unique_name("inspect-sem");
    let before = SystemTime::now();
    let sem = a
        .with_lease(lease(fx, a.as_ref()))
        .unwrap()
        .semaphore(&name, 3)
        .unwrap();
    let p1 = sem.try_lock().await.unwrap().unwrap();
    let p2 = sem.try_lock().await.unwrap().unwrap();
    let snapshot = a.inspect(&name, PrimitiveKind::Semaphore).await.unwrap();
    assert_eq!(snapshot.holders.len(), 2, "{snapshot:?}");
    assert_eq!(snapshot.permits, Some(3), "{snapshot:?}");
    check_holder(
        &snapshot,
        &p1,
        a.owner(),
        HoldRole::Permit,
        before,
        fx.session(),
    );
    check_holder(
        &snapshot,
        &p2,
        a.owner(),
        HoldRole::Permit,
        before,
        fx.session(),
    );
    p1.release().await.unwrap();
    p2.release().await.unwrap();
}

/// An election: the leader and its term, a second candidate waiting.
pub async fn inspect_election<F: Fixture>(fx: &F) {
    let a = fx.client().await;
    let b = fx.client().await;
    let name = unique_name("inspect-elect");
    let leader = a.election(&name).unwrap().campaign("node-a").await.unwrap();
    let other = b.election(&name).unwrap();
    let task = tokio::spawn(async move { other.campaign("node-b").await });
    let snapshot = inspect_until(b.as_ref(), &name, PrimitiveKind::Election, |s| {
        s.waiters.count == 1
    })
    .await;
    let info = snapshot.leader.clone().expect("a leader");
    assert_eq!((info.id.as_str(), info.term), ("node-a", leader.term()));
    assert_eq!(snapshot.holders.len(), 1, "{snapshot:?}");
    assert_eq!(snapshot.holders[0].role, HoldRole::Leader);
    assert_eq!(snapshot.holders[0].owner.as_deref(), Some(a.owner()));
    assert_eq!(snapshot.waiters.count, 1, "{snapshot:?}");
    leader.resign().await.unwrap();
    let next = tokio::time::timeout(SLACK, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    next.resign().await.unwrap();
}

/// Force-release of every kind: the holder is evicted, its `lost()` fires,
/// the next waiter gets in with a token above the evicted one and at or
/// above the advanced fence.
pub async fn force_release_evicts<F: Fixture>(fx: &F) {
    let holder = fx.client().await;
    let waiter = fx.client().await;
    let operator = fx.client().await;
    for kind in [
        PrimitiveKind::Mutex,
        PrimitiveKind::FairMutex,
        PrimitiveKind::ReadWrite,
        PrimitiveKind::Semaphore,
    ] {
        let name = unique_name("force");
        let open = |client: &Arc<dyn Provider>| {
            let client = client.with_lease(lease(fx, client.as_ref())).unwrap();
            match kind {
                PrimitiveKind::Mutex => client.mutex(&name),
                PrimitiveKind::FairMutex => client.fair_mutex(&name),
                PrimitiveKind::ReadWrite => client.rw_lock(&name).map(|rw| rw.write()),
                _ => client
                    .semaphore(&name, 1)
                    .map(|s| s as Arc<dyn distlock_core::Lock>),
            }
            .unwrap()
        };
        let evicted = open(&holder).try_lock().await.unwrap().expect("free");
        let waiting = open(&waiter);
        let task = tokio::spawn(async move { waiting.lock().await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!task.is_finished(), "{kind}: the waiter got in while held");
        let done = operator.force_release(&name, kind).await.unwrap();
        assert_eq!(done.evicted, 1, "{kind}: {done:?}");
        if let Some(fence) = done.fence {
            assert!(fence > evicted.fencing_token(), "{kind}: {done:?}");
        }
        let next = tokio::time::timeout(SLACK * 2, task)
            .await
            .unwrap_or_else(|_| panic!("{kind}: the waiter did not get in"))
            .unwrap()
            .unwrap();
        assert!(next.fencing_token() > evicted.fencing_token(), "{kind}");
        if let Some(fence) = done.fence {
            assert!(next.fencing_token() >= fence, "{kind}: {done:?}");
        }
        // The evicted holder learns of it: at its next renewal (TTL/3 of a
        // 30 s lease) or when its node goes.
        let reason = tokio::time::timeout(Duration::from_secs(10) + SLACK, evicted.lost())
            .await
            .unwrap_or_else(|_| panic!("{kind}: the evicted holder's lost() never fired"));
        assert!(!evicted.is_held(), "{kind}: {reason:?}");
        next.release().await.unwrap();
        let nothing = operator.force_release(&name, kind).await.unwrap();
        assert_eq!(nothing.evicted, 0, "{kind}: {nothing:?}");
    }
}

/// `LeaseOptions::max_hold`: a lease renewed by its watchdog is still held
/// before the limit, then lost with `MaxHold` on time and released, so the
/// next client gets in; renewing after the limit is refused.
pub async fn max_hold_ends_the_hold<F: Fixture>(fx: &F) {
    use distlock_core::LostReason;

    let holder = fx.client().await;
    let other = fx.client().await;
    let name = unique_name("max-hold");
    let limit = Duration::from_millis(1500);
    let base = if fx.session() {
        holder.default_lease()
    } else {
        LeaseOptions::new(Duration::from_millis(600)).expect("valid TTL")
    };
    let lease = base.max_hold(limit).expect("valid max_hold");
    let lock = fx.lock(holder.as_ref(), &name, lease).expect("lock");
    let started = tokio::time::Instant::now();
    let guard = lock.try_lock().await.unwrap().expect("free");
    // Past several TTLs the watchdog still renews.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        guard.is_held(),
        "lost before max_hold: {:?}",
        guard.status()
    );
    let reason = tokio::time::timeout(limit + SLACK, guard.lost())
        .await
        .expect("lost() fired");
    assert_eq!(reason, LostReason::MaxHold);
    assert!(started.elapsed() >= limit - Duration::from_millis(50));
    assert!(guard.extend(Duration::from_secs(1)).await.is_err());
    // Released at the limit: the next client gets in well before the TTL
    // (or the session) would have run out.
    let next = fx
        .lock(other.as_ref(), &name, other.default_lease())
        .expect("lock")
        .lock_timeout(SLACK)
        .await
        .unwrap()
        .expect("released at max_hold");
    assert!(next.fencing_token() > guard.fencing_token());
    next.release().await.unwrap();
}
