//! The conformance suite: written once, run against every backend and every
//! primitive that can act as a mutex.
//!
//! A backend implements [`Fixture`] and instantiates the suite with
//! [`conformance_suite!`](crate::conformance_suite), which writes one
//! `#[tokio::test]` per check.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock_core::{Error, LeaseOptions, Lock, LostReason, Name, Provider, Renewal};
use futures::future::BoxFuture;

use crate::unique_name;

/// The backend and primitive under test.
pub trait Fixture: Send + Sync + 'static {
    /// A new, independent client (own connection or session) of the backend.
    fn client(&self) -> BoxFuture<'_, Arc<dyn Provider>>;

    /// The primitive under test, named `name`, on `client`.
    ///
    /// # Errors
    ///
    /// Whatever the provider returns for a bad name.
    fn lock(
        &self,
        client: &dyn Provider,
        name: &str,
        lease: LeaseOptions,
    ) -> distlock_core::Result<Arc<dyn Lock>>;

    /// Whether the backend's lease is its session (ZooKeeper): lease options
    /// other than the provider's default are then refused, and the sections
    /// of other primitives pass the default.
    fn session(&self) -> bool {
        false
    }
}

/// Generous slack for deadline checks on a loaded 2-core machine.
pub const SLACK: Duration = Duration::from_secs(3);

/// Lease options for tests that must see a leaked lease: long enough that
/// waiting it out is a failure, not a pass.
fn long_lease() -> LeaseOptions {
    LeaseOptions::new(Duration::from_secs(60)).expect("valid TTL")
}

async fn clients<F: Fixture>(fx: &F, n: usize) -> Vec<Arc<dyn Provider>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(fx.client().await);
    }
    out
}

async fn free_within<F: Fixture>(fx: &F, client: &dyn Provider, name: &str, limit: Duration) {
    let lock = fx.lock(client, name, long_lease()).expect("lock");
    let guard = lock
        .lock_timeout(limit)
        .await
        .expect("acquire")
        .unwrap_or_else(|| panic!("{name} is still held after {limit:?}: something leaked"));
    guard.release().await.expect("release");
}

/// Retries `try_lock` until it succeeds, for a backend coming back from a
/// fault; errors and `None` are retried until `within` has passed.
///
/// # Panics
///
/// When the lock was not taken in time, naming `what` recovered.
pub async fn eventually_locks(
    lock: &dyn Lock,
    within: Duration,
    what: &str,
) -> distlock_core::LockGuard {
    let deadline = Instant::now() + within;
    loop {
        match lock.try_lock().await {
            Ok(Some(guard)) => return guard,
            other => assert!(
                Instant::now() < deadline,
                "{what} did not recover: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Tasks spread over several clients each do a non-atomic read-modify-write
/// under the lock; no update is lost and no two holders overlap.
pub async fn mutual_exclusion<F: Fixture>(fx: &F) {
    const TASKS: usize = 8;
    const ROUNDS: u64 = 40;
    let name = unique_name("mutual_exclusion");
    let clients = clients(fx, 4).await;
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let lock = fx
            .lock(clients[t % clients.len()].as_ref(), &name, long_lease())
            .expect("lock");
        let (counter, inside) = (Arc::clone(&counter), Arc::clone(&inside));
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let guard = lock.lock().await.expect("lock");
                assert_eq!(
                    inside.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two holders at once"
                );
                let seen = counter.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_micros(200)).await;
                counter.store(seen + 1, Ordering::SeqCst);
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(
        counter.load(Ordering::SeqCst),
        TASKS as u64 * ROUNDS,
        "lost update"
    );
}

/// `try_lock` gives `None` while another client holds, `Some` after release.
pub async fn try_lock_semantics<F: Fixture>(fx: &F) {
    let name = unique_name("try_lock");
    let c = clients(fx, 2).await;
    let a = fx.lock(c[0].as_ref(), &name, long_lease()).expect("lock");
    let b = fx.lock(c[1].as_ref(), &name, long_lease()).expect("lock");
    let held = a
        .try_lock()
        .await
        .expect("try_lock")
        .expect("free lock taken");
    assert!(held.is_held());
    assert!(
        b.try_lock().await.expect("try_lock").is_none(),
        "taken twice"
    );
    assert!(
        a.try_lock().await.expect("try_lock").is_none(),
        "not reentrant"
    );
    held.release().await.expect("release");
    let again = b
        .try_lock()
        .await
        .expect("try_lock")
        .expect("free after release");
    again.release().await.expect("release");
}

/// `lock_timeout` returns `None` near its deadline while held and leaves
/// nothing behind; a huge timeout on a free lock acquires at once.
pub async fn lock_timeout_semantics<F: Fixture>(fx: &F) {
    let name = unique_name("lock_timeout");
    let c = clients(fx, 3).await;
    let holder = fx.lock(c[0].as_ref(), &name, long_lease()).expect("lock");
    let waiter = fx.lock(c[1].as_ref(), &name, long_lease()).expect("lock");
    let guard = holder.lock().await.expect("lock");
    for timeout in [Duration::ZERO, Duration::from_millis(300)] {
        let start = Instant::now();
        let got = waiter.lock_timeout(timeout).await.expect("lock_timeout");
        let took = start.elapsed();
        assert!(got.is_none(), "acquired a held lock");
        assert!(took >= timeout, "gave up early: {took:?} < {timeout:?}");
        assert!(took <= timeout + SLACK, "overslept: {took:?}");
    }
    guard.release().await.expect("release");
    // Nothing left behind: a third client takes it at once.
    let third = fx.lock(c[2].as_ref(), &name, long_lease()).expect("lock");
    let g = third
        .try_lock()
        .await
        .expect("try_lock")
        .expect("timed-out waiter left something behind");
    g.release().await.expect("release");
    let g = waiter
        .lock_timeout(Duration::MAX)
        .await
        .expect("lock_timeout(MAX)")
        .expect("free lock");
    g.release().await.expect("release");
}

/// Fencing tokens strictly increase over 1000 acquisitions by 4 clients.
pub async fn fencing_monotonic<F: Fixture>(fx: &F) {
    const TOTAL: usize = 1000;
    let name = unique_name("fencing");
    let clients = clients(fx, 4).await;
    let seen = Arc::new(Mutex::new(Vec::with_capacity(TOTAL)));
    let mut tasks = Vec::new();
    for client in &clients {
        let lock = fx.lock(client.as_ref(), &name, long_lease()).expect("lock");
        let seen = Arc::clone(&seen);
        tasks.push(tokio::spawn(async move {
            for _ in 0..TOTAL / 4 {
                let guard = lock.lock().await.expect("lock");
                // Recorded while holding: the vector's order is holding order.
                seen.lock().expect("poisoned").push(guard.fencing_token());
                guard.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let seen = seen.lock().expect("poisoned");
    assert_eq!(seen.len(), TOTAL);
    for pair in seen.windows(2) {
        assert!(
            pair[0] < pair[1],
            "fencing token went from {} to {}",
            pair[0],
            pair[1]
        );
    }
}

/// A manual lease that is not extended expires: `lost()` fires, another
/// client takes the lock with a higher token, and the late `release()` is
/// `NotHeld` and leaves the new holder alone.
pub async fn lease_expiry<F: Fixture>(fx: &F) {
    let name = unique_name("lease_expiry");
    let c = clients(fx, 3).await;
    let ttl = Duration::from_millis(400);
    let a = fx
        .lock(
            c[0].as_ref(),
            &name,
            LeaseOptions::manual(ttl).expect("ttl"),
        )
        .expect("lock");
    let b = fx.lock(c[1].as_ref(), &name, long_lease()).expect("lock");
    let start = Instant::now();
    let old = a.lock().await.expect("lock");
    assert_eq!(old.ttl(), Some(ttl));
    let reason = tokio::time::timeout(ttl + SLACK, old.lost())
        .await
        .expect("lost() did not fire after the TTL");
    assert_eq!(reason, LostReason::Expired);
    assert!(start.elapsed() <= ttl + SLACK);
    assert!(!old.is_held());
    let new = b
        .lock_timeout(SLACK)
        .await
        .expect("lock")
        .expect("expired lease not taken over");
    assert!(new.fencing_token() > old.fencing_token());
    let late = old.release().await;
    assert!(
        matches!(late, Err(Error::NotHeld { .. })),
        "late release gave {late:?}"
    );
    let third = fx.lock(c[2].as_ref(), &name, long_lease()).expect("lock");
    assert!(
        third.try_lock().await.expect("try_lock").is_none(),
        "late release deleted the new holder's lock"
    );
    assert!(new.is_held());
    new.release().await.expect("new holder releases");
}

/// The watchdog keeps a short lease alive for 3x its TTL, and stops at
/// release: `lost()` never fires for a released lease.
pub async fn watchdog_keeps_lease<F: Fixture>(fx: &F) {
    let name = unique_name("watchdog");
    let c = clients(fx, 2).await;
    let lease = LeaseOptions::new(Duration::from_millis(600)).expect("ttl");
    assert!(matches!(lease.renewal(), Renewal::Watchdog { .. }));
    let a = fx.lock(c[0].as_ref(), &name, lease).expect("lock");
    let b = fx.lock(c[1].as_ref(), &name, long_lease()).expect("lock");
    let guard = a.lock().await.expect("lock");
    let mut watch = guard.watch();
    tokio::select! {
        reason = guard.lost() => panic!("lease lost under watchdog: {reason}"),
        () = tokio::time::sleep(Duration::from_millis(1800)) => {}
    }
    assert!(guard.is_held());
    assert!(
        b.try_lock().await.expect("try_lock").is_none(),
        "lease ran out under watchdog"
    );
    guard.release().await.expect("release");
    assert_eq!(
        watch.lost().await,
        None,
        "lost() fired for a released lease"
    );
    let g = b
        .try_lock()
        .await
        .expect("try_lock")
        .expect("free after release");
    g.release().await.expect("release");
}

/// A manual lease extended by hand outlives its first TTL.
pub async fn manual_extend<F: Fixture>(fx: &F) {
    let name = unique_name("extend");
    let c = clients(fx, 2).await;
    let ttl = Duration::from_millis(500);
    let a = fx
        .lock(
            c[0].as_ref(),
            &name,
            LeaseOptions::manual(ttl).expect("ttl"),
        )
        .expect("lock");
    let b = fx.lock(c[1].as_ref(), &name, long_lease()).expect("lock");
    let guard = a.lock().await.expect("lock");
    tokio::time::sleep(Duration::from_millis(200)).await;
    guard.extend(Duration::from_secs(5)).await.expect("extend");
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(guard.is_held(), "extended lease reported lost");
    assert!(
        b.try_lock().await.expect("try_lock").is_none(),
        "extended lease ran out"
    );
    assert!(matches!(
        guard.extend(Duration::ZERO).await,
        Err(Error::InvalidOptions(_))
    ));
    guard.release().await.expect("release");
}

/// Dropping a guard without `release()` lets the next waiter in.
pub async fn drop_releases<F: Fixture>(fx: &F) {
    let name = unique_name("drop_releases");
    let c = clients(fx, 2).await;
    let a = fx.lock(c[0].as_ref(), &name, long_lease()).expect("lock");
    let b = fx.lock(c[1].as_ref(), &name, long_lease()).expect("lock");
    let guard = a.lock().await.expect("lock");
    let waiter = tokio::spawn(async move { b.lock_timeout(SLACK * 2).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(guard);
    let got = waiter.await.expect("task").expect("lock_timeout");
    let g = got.expect("a dropped guard did not let the waiter in");
    g.release().await.expect("release");
}

/// Cancelling acquisitions at random points, while the lock is held and while
/// it is free, never leaves it held.
pub async fn cancellation_leaves_nothing<F: Fixture>(fx: &F) {
    let name = unique_name("cancellation");
    let c = clients(fx, 3).await;
    let holder = fx.lock(c[0].as_ref(), &name, long_lease()).expect("lock");
    let waiter = fx.lock(c[1].as_ref(), &name, long_lease()).expect("lock");
    let mut rng = fastrand::Rng::with_seed(fastrand::u64(..));
    // While held: waiters give up at random points of their wait.
    let guard = holder.lock().await.expect("lock");
    for _ in 0..50 {
        let cut = Duration::from_micros(rng.u64(0..3000));
        let r = tokio::time::timeout(cut, waiter.lock()).await;
        assert!(r.is_err(), "acquired a held lock");
    }
    guard.release().await.expect("release");
    // While free: cancel at random points of a racing acquisition; a guard
    // that completes is dropped (released in the background).
    for _ in 0..100 {
        let cut = Duration::from_micros(rng.u64(0..2000));
        let _ = tokio::time::timeout(cut, waiter.lock()).await;
    }
    free_within(fx, c[2].as_ref(), &name, SLACK).await;
}

/// `close()` fires `lost()` of what the provider holds (before anybody else
/// can get in), releases it, ends its waiting acquisitions with `Closed`,
/// and refuses later calls; closing twice is harmless.
pub async fn close_releases_and_refuses<F: Fixture>(fx: &F) {
    let name = unique_name("close");
    let c = clients(fx, 2).await;
    let closing = &c[0];
    let lock = fx
        .lock(closing.as_ref(), &name, long_lease())
        .expect("lock");
    let guard = lock.lock().await.expect("lock");
    let other_name = unique_name("close-wait");
    let other = fx
        .lock(c[1].as_ref(), &other_name, long_lease())
        .expect("lock");
    let held_elsewhere = other.lock().await.expect("lock");
    let waiting = fx
        .lock(closing.as_ref(), &other_name, long_lease())
        .expect("lock");
    let waiter = tokio::spawn(async move { waiting.lock().await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let lost = guard.lost();
    let closed_at = Instant::now();
    tokio::time::timeout(SLACK, closing.close())
        .await
        .expect("close() hung")
        .expect("close");
    let reason = tokio::time::timeout(SLACK, lost)
        .await
        .expect("lost() did not fire at close");
    assert_eq!(reason, LostReason::ProviderClosed);
    let waited = tokio::time::timeout(SLACK, waiter)
        .await
        .expect("a waiting acquisition outlived close()")
        .expect("task");
    assert!(
        matches!(waited, Err(Error::Closed)),
        "waiter after close: {waited:?}"
    );
    // Released, not left to the lease: the other client gets in at once.
    let next = fx.lock(c[1].as_ref(), &name, long_lease()).expect("lock");
    let g = next
        .lock_timeout(SLACK)
        .await
        .expect("lock")
        .expect("close() did not release the lock");
    assert!(closed_at.elapsed() < SLACK * 2);
    assert!(g.fencing_token() > guard.fencing_token());
    assert!(matches!(guard.release().await, Err(Error::Closed)));
    for r in [
        closing.mutex(&name).map(|_| ()),
        closing.fair_mutex(&name).map(|_| ()),
        closing.election(&name).map(|_| ()),
        closing.id_generator(&name, 1).map(|_| ()),
        closing.rw_lock(&name).map(|_| ()),
        closing.semaphore(&name, 2).map(|_| ()),
    ] {
        assert!(matches!(r, Err(Error::Closed)), "after close: {r:?}");
    }
    assert!(matches!(lock.try_lock().await, Err(Error::Closed)));
    closing.close().await.expect("second close");
    g.release().await.expect("release");
    held_elsewhere.release().await.expect("release");
}

/// Invalid names give typed errors, never a panic; TTLs are checked.
pub async fn bad_input<F: Fixture>(fx: &F) {
    let client = fx.client().await;
    let long = "x".repeat(Name::MAX_LEN + 1);
    for bad in [
        "",
        "/",
        "a//b",
        "a/",
        "/a",
        "a b",
        "{tag}",
        "ü",
        "..",
        &long,
        // Another name's internal node on ZooKeeper: refused everywhere.
        "a/_unfair_lock",
        "a/leases",
        "a/b-lock-0000000001",
    ] {
        let r = fx.lock(client.as_ref(), bad, long_lease());
        assert!(
            matches!(r, Err(Error::InvalidName { .. })),
            "name {bad:?} gave {r:?}"
        );
        let r = client.mutex(bad);
        assert!(matches!(r, Err(Error::InvalidName { .. })), "{bad:?}");
        let r = client.election(bad);
        assert!(matches!(r, Err(Error::InvalidName { .. })), "{bad:?}");
        let r = client.id_generator(bad, 1);
        assert!(matches!(r, Err(Error::InvalidName { .. })), "{bad:?}");
        let r = client.rw_lock(bad);
        assert!(matches!(r, Err(Error::InvalidName { .. })), "{bad:?}");
        let r = client.semaphore(bad, 2);
        assert!(matches!(r, Err(Error::InvalidName { .. })), "{bad:?}");
    }
    let r = client.semaphore(&unique_name("sem"), 0);
    assert!(
        matches!(r, Err(Error::InvalidOptions(_))),
        "0 permits gave {r:?}"
    );
    for ttl in [Duration::ZERO, Duration::from_nanos(1), Duration::MAX] {
        assert!(LeaseOptions::new(ttl).is_err_and(|e| e.is_invalid_input()));
        assert!(LeaseOptions::manual(ttl).is_err_and(|e| e.is_invalid_input()));
    }
    let r = client.id_generator(&unique_name("ids"), 0);
    assert!(
        matches!(r, Err(Error::InvalidOptions(_))),
        "block size 0 gave {r:?}"
    );
}

/// The primitives of one provider's view, as `(what, kind, lock)`: the
/// mutex, fair mutex, both sides of a read-write lock and a semaphore of
/// one, each named `name` + a suffix; those the backend does not offer
/// (Redlock) are left out, and the mutex must be there.
fn view_primitives(
    view: &dyn Provider,
    name: &str,
) -> Vec<(&'static str, distlock_core::PrimitiveKind, Arc<dyn Lock>)> {
    use distlock_core::PrimitiveKind as K;
    let mut out: Vec<(&'static str, K, Arc<dyn Lock>)> = Vec::new();
    let keep = |r: distlock_core::Result<Arc<dyn Lock>>| match r {
        Ok(lock) => Some(lock),
        Err(Error::Unsupported { .. }) => None,
        Err(e) => panic!("a primitive of the view: {e:?}"),
    };
    out.push((
        "mutex",
        K::Mutex,
        view.mutex(&format!("{name}-m")).expect("mutex"),
    ));
    if let Some(l) = keep(view.fair_mutex(&format!("{name}-f"))) {
        out.push(("fair mutex", K::FairMutex, l));
    }
    if let Some(l) = keep(view.rw_lock(&format!("{name}-w")).map(|rw| rw.write())) {
        out.push(("write side", K::ReadWrite, l));
    }
    if let Some(l) = keep(view.rw_lock(&format!("{name}-r")).map(|rw| rw.read())) {
        out.push(("read side", K::ReadWrite, l));
    }
    if let Some(l) = keep(
        view.semaphore(&format!("{name}-s"), 1)
            .map(|s| s as Arc<dyn Lock>),
    ) {
        out.push(("semaphore", K::Semaphore, l));
    }
    out
}

/// `with_lease` gives a view of the same client whose primitives use its
/// lease: each primitive's guard (and, for a TTL lease, the server's
/// record seen by `inspect`) has the view's lease, not the default; a
/// lock held through the view excludes one through the original and the
/// reverse; both are one client (one owner, one ZooKeeper session, one
/// close); lease options the backend cannot honour are a typed error.
pub async fn lease_view<F: Fixture>(fx: &F) {
    let name = unique_name("lease-view");
    let client = fx.client().await;
    let base = client.default_lease();
    // Unlike the default in TTL and renewal (a TTL backend), or the one
    // option a session honours (ZooKeeper).
    let wanted = if fx.session() {
        let refused = client.with_lease(LeaseOptions::manual(Duration::from_secs(5)).expect("ttl"));
        assert!(
            matches!(refused, Err(Error::InvalidOptions(_))),
            "a session backend took a TTL lease: {refused:?}"
        );
        base.max_hold(Duration::from_secs(1)).expect("max_hold")
    } else {
        let wanted = LeaseOptions::manual(base.ttl() + Duration::from_secs(17)).expect("ttl");
        assert!(wanted.ttl() > LeaseOptions::DEFAULT_TTL);
        wanted
    };
    assert_ne!(wanted, base);
    let view = client.with_lease(wanted).expect("with_lease");
    assert_eq!(view.default_lease(), wanted);
    assert_eq!(client.default_lease(), base, "the original changed");
    assert_eq!(view.backend(), client.backend());
    assert_eq!(view.owner(), client.owner());

    for (what, kind, lock) in view_primitives(view.as_ref(), &name) {
        let guard = lock.try_lock().await.expect("try_lock").expect("free");
        if fx.session() {
            assert_eq!(guard.ttl(), None, "{what}");
        } else {
            assert_eq!(guard.ttl(), Some(wanted.ttl()), "{what}: the view's TTL");
            let snapshot = client
                .inspect(lock.name().as_str(), kind)
                .await
                .expect("inspect");
            let left = snapshot
                .holders
                .iter()
                .find(|h| h.fencing_token == Some(guard.fencing_token()))
                .map(|h| h.lease);
            // Above the default TTL: the server was given the view's.
            assert!(
                matches!(left, Some(distlock_core::LeaseLeft::Ttl(d))
                    if d > base.ttl() && d <= wanted.ttl()),
                "{what}: lease left {left:?}, wanted {:?}",
                wanted.ttl()
            );
        }
        guard.release().await.expect("release");
    }

    // One client: a hold through the view excludes the original, and the
    // reverse.
    let through_view = view.mutex(&name).expect("mutex");
    let through_client = client.mutex(&name).expect("mutex");
    let held = through_view
        .try_lock()
        .await
        .expect("try_lock")
        .expect("free");
    assert!(through_client.try_lock().await.expect("try_lock").is_none());
    held.release().await.expect("release");
    let held = through_client
        .try_lock()
        .await
        .expect("try_lock")
        .expect("free");
    assert!(through_view.try_lock().await.expect("try_lock").is_none());
    held.release().await.expect("release");

    let other = format!("{name}-other");
    let by_view = through_view.lock().await.expect("lock");
    let by_client = client
        .mutex(&other)
        .expect("mutex")
        .lock()
        .await
        .expect("lock");
    if fx.session() {
        // One session: both holds are on it.
        let session = |n: &str| {
            let client = Arc::clone(&client);
            let n = n.to_owned();
            async move {
                let s = client
                    .inspect(&n, distlock_core::PrimitiveKind::Mutex)
                    .await
                    .expect("inspect");
                s.holders.first().map(|h| h.lease)
            }
        };
        let (a, b) = (session(&name).await, session(&other).await);
        assert!(
            matches!(a, Some(distlock_core::LeaseLeft::Session { .. })) && a == b,
            "view {a:?}, original {b:?}"
        );
        // The view's max_hold is honoured.
        let reason = tokio::time::timeout(Duration::from_secs(1) + SLACK, by_view.lost())
            .await
            .expect("the view's max_hold did not end the hold");
        assert_eq!(reason, LostReason::MaxHold);
    }
    // One close: closing the original ends the view's holds and the view.
    drop(by_view);
    let by_view = through_view.lock().await.expect("lock");
    let lost = by_view.lost();
    client.close().await.expect("close");
    let reason = tokio::time::timeout(SLACK, lost)
        .await
        .expect("the view's hold outlived the original's close");
    assert_eq!(reason, LostReason::ProviderClosed);
    assert!(matches!(view.mutex(&name), Err(Error::Closed)));
    assert!(matches!(view.with_lease(base), Err(Error::Closed)));
    assert!(matches!(by_client.release().await, Err(Error::Closed)));
}

/// Id generators: 8 tasks over two clients take 1000 ids each, for block
/// sizes 1 and 100; every id is unique and at least 1, and each task's ids
/// increase. Returns the name used for each block size, for backend checks
/// of the stored counter.
pub async fn ids_unique_and_increasing(clients: [Arc<dyn Provider>; 2]) -> Vec<(u64, String)> {
    let mut names = Vec::new();
    for block in [1, 100] {
        let name = unique_name("ids");
        let mut tasks = Vec::new();
        for t in 0..8 {
            let ids = clients[t % 2]
                .id_generator(&name, block)
                .expect("id generator");
            tasks.push(tokio::spawn(async move {
                let mut got = Vec::with_capacity(1000);
                for _ in 0..1000 {
                    got.push(ids.next().await.expect("id"));
                }
                got
            }));
        }
        let mut all = std::collections::HashSet::new();
        for t in tasks {
            let got = t.await.expect("task");
            assert!(
                got.windows(2).all(|w| w[0] < w[1]),
                "block {block}: not increasing"
            );
            for id in got {
                assert!(id >= 1, "block {block}: id 0");
                assert!(all.insert(id), "block {block}: id {id} handed out twice");
            }
        }
        assert_eq!(all.len(), 8000);
        names.push((block, name));
    }
    names
}

/// Writes one `#[tokio::test]` per conformance check for a fixture
/// expression (evaluated in each test). `session` drops the checks of TTL
/// leases (expiry, watchdog, manual extension) for backends whose lease is a
/// session; those backends test session loss in their own suites.
///
/// ```text
/// test_support::conformance_suite!(MemFixture::mutex());
/// test_support::conformance_suite!(session ZkFixture::fair());
/// test_support::conformance_suite!(rw MemFixture::mutex());      // read-write lock sections
/// test_support::conformance_suite!(semaphore session ZkFixture::fair());
/// test_support::conformance_suite!(fair MemFixture::mutex());    // FIFO order
/// test_support::conformance_suite!(election MemFixture::mutex());
/// test_support::conformance_suite!(kinds MemFixture::mutex());    // one name is one lock
/// ```
///
/// The plain and `session` arms also run the lock-set checks
/// of [`multi`](crate::multi), each member made by the fixture's `lock`.
///
/// The `rw`, `semaphore`, `fair` and `election` arms run the sections of
/// [`primitives`](crate::primitives) on the fixture's clients (its `lock`
/// is not used there), and so does the `kinds` arm, the cross-kind checks
/// of [`kinds`](crate::kinds).
#[macro_export]
macro_rules! conformance_suite {
    (rw session $fixture:expr) => {
        $crate::conformance_suite!(@in primitives $fixture;
            rw_readers_share, rw_writer_excludes, rw_no_writer_starvation, rw_fencing,
            rw_exclusion_under_load, rw_cancellation);
    };
    (rw $fixture:expr) => {
        $crate::conformance_suite!(@in primitives $fixture;
            rw_readers_share, rw_writer_excludes, rw_no_writer_starvation, rw_fencing,
            rw_exclusion_under_load, rw_cancellation, rw_dead_reader_frees_writer);
    };
    (semaphore session $fixture:expr) => {
        $crate::conformance_suite!(@in primitives $fixture;
            semaphore_bounds, semaphore_try_and_timeout, semaphore_permits_mismatch,
            semaphore_cancellation);
    };
    (semaphore $fixture:expr) => {
        $crate::conformance_suite!(@in primitives $fixture;
            semaphore_bounds, semaphore_try_and_timeout, semaphore_permits_mismatch,
            semaphore_cancellation, semaphore_dead_holder_reclaimed);
    };
    (fair $fixture:expr) => {
        $crate::conformance_suite!(@in primitives $fixture; fair_fifo);
    };
    (election session $fixture:expr) => {
        $crate::conformance_suite!(@in primitives $fixture;
            election_one_leader, election_observe, election_cancelled_campaign_withdraws);
    };
    (election $fixture:expr) => {
        $crate::conformance_suite!(@in primitives $fixture;
            election_one_leader, election_observe, election_cancelled_campaign_withdraws,
            election_expiry);
    };
    (operations $fixture:expr) => {
        $crate::conformance_suite!(@in operations $fixture;
            inspect_mutexes, inspect_rw_lock, inspect_semaphore, inspect_election,
            force_release_evicts);
    };
    (revocation $fixture:expr) => {
        $crate::conformance_suite!(@in revocation $fixture;
            request_release_asks_the_holder, request_release_asks_every_holder,
            request_release_asks_the_leader, request_release_reaches_a_set,
            request_release_bad_input);
    };
    (kinds $fixture:expr) => {
        $crate::conformance_suite!(@in kinds $fixture; cross_kind_pairs, cross_kind_race);
    };
    (max_hold $fixture:expr) => {
        $crate::conformance_suite!(@in operations $fixture; max_hold_ends_the_hold);
    };
    (session $fixture:expr) => {
        $crate::conformance_suite!(@tests $fixture;
            mutual_exclusion, try_lock_semantics, lock_timeout_semantics,
            fencing_monotonic, drop_releases, cancellation_leaves_nothing,
            close_releases_and_refuses, bad_input, lease_view);
        $crate::conformance_suite!(@in multi $fixture;
            multi_all_or_nothing, multi_bad_sets, multi_lost_when_one_is_force_released,
            multi_cancellation_holds_nothing, multi_contention);
    };
    ($fixture:expr) => {
        $crate::conformance_suite!(@tests $fixture;
            mutual_exclusion, try_lock_semantics, lock_timeout_semantics,
            fencing_monotonic, lease_expiry, watchdog_keeps_lease, manual_extend,
            drop_releases, cancellation_leaves_nothing, close_releases_and_refuses,
            bad_input, lease_view);
        $crate::conformance_suite!(@in multi $fixture;
            multi_all_or_nothing, multi_bad_sets, multi_lost_when_one_is_force_released,
            multi_cancellation_holds_nothing, multi_contention);
    };
    (@tests $fixture:expr; $($check:ident),+) => {
        $crate::conformance_suite!(@in conformance $fixture; $($check),+);
    };
    (@in $module:ident $fixture:expr; $($check:ident),+) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let fixture = $fixture;
                $crate::$module::$check(&fixture).await;
            }
        )+
    };
}
