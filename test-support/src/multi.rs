//! Conformance checks of [`LockSet`]: several names at once, all or
//! nothing, on the fixture's primitive (each member is `fx.lock(...)`), run
//! by every instantiation of [`conformance_suite!`](crate::conformance_suite).

// A failed check panics with the value that broke it.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock_core::multi::{LockSet, MultiGuard};
use distlock_core::{Error, LeaseOptions, Lock, Provider};

use crate::conformance::{Fixture, SLACK};
use crate::unique_name;

fn lease<F: Fixture>(fx: &F, client: &dyn Provider, ttl: Duration) -> LeaseOptions {
    if fx.session() {
        client.default_lease()
    } else {
        LeaseOptions::new(ttl).expect("valid TTL")
    }
}

fn long<F: Fixture>(fx: &F, client: &dyn Provider) -> LeaseOptions {
    lease(fx, client, Duration::from_secs(60))
}

fn set<F: Fixture>(
    fx: &F,
    client: &dyn Provider,
    names: &[String],
    lease: LeaseOptions,
) -> LockSet {
    LockSet::from_locks(
        names
            .iter()
            .map(|n| fx.lock(client, n, lease).expect("lock")),
    )
    .expect("a valid set")
}

fn names(test: &str, n: usize) -> Vec<String> {
    let prefix = unique_name(test);
    (0..n).map(|i| format!("{prefix}/{i}")).collect()
}

/// Asserts that `other` can take each of `names` at once (then gives it back).
async fn each_free<F: Fixture>(fx: &F, other: &dyn Provider, names: &[String], what: &str) {
    for name in names {
        let lock = fx.lock(other, name, long(fx, other)).expect("lock");
        let guard = lock
            .try_lock()
            .await
            .expect("try_lock")
            .unwrap_or_else(|| panic!("{what}: {name} is still held"));
        guard.release().await.expect("release");
    }
}

/// Asserts that `other` can take each of `names` within `limit` (a release
/// in the background).
async fn each_free_within<F: Fixture>(
    fx: &F,
    other: &dyn Provider,
    names: &[String],
    limit: Duration,
    what: &str,
) {
    for name in names {
        let lock = fx.lock(other, name, long(fx, other)).expect("lock");
        let guard = lock
            .lock_timeout(limit)
            .await
            .expect("lock_timeout")
            .unwrap_or_else(|| panic!("{what}: {name} still held after {limit:?}"));
        guard.release().await.expect("release");
    }
}

async fn each_held<F: Fixture>(fx: &F, other: &dyn Provider, names: &[String], what: &str) {
    for name in names {
        let lock = fx.lock(other, name, long(fx, other)).expect("lock");
        assert!(
            lock.try_lock().await.expect("try_lock").is_none(),
            "{what}: {name} is free while the set holds it"
        );
    }
}

/// One name of three held by another client: `try_lock` and `lock_timeout`
/// of the set give `None` and hold none of the others afterwards (released
/// before they returned); once it is free the set is taken whole, one token
/// per name, and `release` frees all of them.
pub async fn multi_all_or_nothing<F: Fixture>(fx: &F) {
    let names = names("multi_all_or_nothing", 3);
    let (a, b, c) = (fx.client().await, fx.client().await, fx.client().await);
    let blocker = fx
        .lock(b.as_ref(), &names[1], long(fx, b.as_ref()))
        .expect("lock");
    let held = blocker.try_lock().await.unwrap().expect("free");
    // Given in another order than it is taken.
    let given: Vec<String> = names.iter().rev().cloned().collect();
    let set = set(fx, a.as_ref(), &given, long(fx, a.as_ref()));
    assert!(
        set.try_lock().await.unwrap().is_none(),
        "try_lock took a busy set"
    );
    let others = [names[0].clone(), names[2].clone()];
    each_free(fx, c.as_ref(), &others, "after try_lock of a busy set").await;
    let started = std::time::Instant::now();
    assert!(
        set.lock_timeout(Duration::from_millis(300))
            .await
            .unwrap()
            .is_none(),
        "lock_timeout took a busy set"
    );
    assert!(started.elapsed() < Duration::from_millis(300) + SLACK);
    each_free(fx, c.as_ref(), &others, "after lock_timeout of a busy set").await;
    held.release().await.unwrap();

    let guard = set.try_lock().await.unwrap().expect("the set is free");
    assert!(guard.is_held());
    assert_eq!(guard.tokens().count(), 3);
    for name in &names {
        assert_eq!(
            guard.fencing_token(name),
            guard
                .guard(name)
                .map(distlock_core::LockGuard::fencing_token),
        );
        assert!(guard.fencing_token(name).is_some(), "no token for {name}");
    }
    each_held(fx, c.as_ref(), &names, "held set").await;
    guard.release().await.expect("release of the set");
    each_free(fx, c.as_ref(), &names, "after release").await;
    // Dropping frees all as well (in the background).
    drop(set.try_lock().await.unwrap().expect("free again"));
    each_free_within(fx, c.as_ref(), &names, SLACK, "after drop").await;
}

/// An empty set and a name given twice are typed errors, and make nothing.
pub async fn multi_bad_sets<F: Fixture>(fx: &F) {
    let client = fx.client().await;
    let other = fx.client().await;
    let name = unique_name("multi_bad_sets");
    let empty: [&str; 0] = [];
    assert!(matches!(
        LockSet::new(client.as_ref(), empty),
        Err(Error::InvalidOptions(_))
    ));
    assert!(matches!(
        LockSet::from_locks(Vec::<Arc<dyn Lock>>::new()),
        Err(Error::InvalidOptions(_))
    ));
    let twice = [name.clone(), format!("{name}/x"), name.clone()];
    assert!(matches!(
        LockSet::new(client.as_ref(), &twice),
        Err(Error::InvalidName { .. })
    ));
    assert!(matches!(
        LockSet::fair(client.as_ref(), &twice),
        Err(Error::InvalidName { .. })
    ));
    let lease = long(fx, client.as_ref());
    let locks = twice
        .iter()
        .map(|n| fx.lock(client.as_ref(), n, lease).expect("lock"));
    let err = LockSet::from_locks(locks).unwrap_err();
    assert!(err.is_invalid_input(), "{err:?}");
    assert!(matches!(
        LockSet::new(client.as_ref(), [name.as_str(), "bad//name"]),
        Err(Error::InvalidName { .. })
    ));
    each_free(fx, other.as_ref(), &twice[..2], "after refused sets").await;
}

/// Force-releasing one member fires the set's `lost()`, naming it; the
/// others stay held until the guard goes.
pub async fn multi_lost_when_one_is_force_released<F: Fixture>(fx: &F) {
    let names = names("multi_lost", 2);
    let holder = fx.client().await;
    let operator = fx.client().await;
    // A short lease: a TTL holder learns of the eviction at its next
    // renewal (TTL/3).
    let lease = lease(fx, holder.as_ref(), Duration::from_secs(3));
    let set = set(fx, holder.as_ref(), &names, lease);
    let kind = set.locks()[1].kind();
    let guard: MultiGuard = set.lock().await.expect("lock");
    let mut watch = guard.watch();
    let done = operator
        .force_release(&names[1], kind)
        .await
        .expect("force_release");
    assert_eq!(done.evicted, 1, "{done:?}");
    let (name, _reason) = tokio::time::timeout(Duration::from_secs(3) + SLACK, guard.lost())
        .await
        .expect("lost() of the set never fired");
    assert_eq!(name.as_str(), names[1]);
    assert!(!guard.is_held());
    let (seen, _) = tokio::time::timeout(SLACK, watch.lost())
        .await
        .expect("watch")
        .expect("lost, not released");
    assert_eq!(seen.as_str(), names[1]);
    assert!(guard.guard(&names[0]).expect("member").is_held());
    each_held(fx, operator.as_ref(), &names[..1], "the other member").await;
    assert!(
        guard.release().await.is_err(),
        "releasing a lost member is NotHeld"
    );
    each_free_within(fx, operator.as_ref(), &names, SLACK, "after release").await;
}

/// A `lock()` of a set waiting for its last name, cancelled (at random
/// points), holds nothing afterwards: the names it took are released.
pub async fn multi_cancellation_holds_nothing<F: Fixture>(fx: &F) {
    let names = names("multi_cancel", 3);
    let (a, b, c) = (fx.client().await, fx.client().await, fx.client().await);
    let blocker = fx
        .lock(b.as_ref(), &names[2], long(fx, b.as_ref()))
        .expect("lock");
    let held = blocker.try_lock().await.unwrap().expect("free");
    let set = set(fx, a.as_ref(), &names, long(fx, a.as_ref()));
    // Long enough to have taken the first two and be waiting for the third.
    let waited = tokio::time::timeout(Duration::from_millis(500), set.lock()).await;
    assert!(waited.is_err(), "took a set whose last name is held");
    each_free_within(
        fx,
        c.as_ref(),
        &names[..2],
        SLACK,
        "after a cancelled lock()",
    )
    .await;
    let mut rng = fastrand::Rng::with_seed(fastrand::u64(..));
    for _ in 0..20 {
        let cut = Duration::from_micros(rng.u64(0..5000));
        let _ = tokio::time::timeout(cut, set.lock()).await;
    }
    held.release().await.unwrap();
    for _ in 0..20 {
        let cut = Duration::from_micros(rng.u64(0..5000));
        let _ = tokio::time::timeout(cut, set.lock()).await;
    }
    each_free_within(fx, c.as_ref(), &names, SLACK, "after cancelled lock()s").await;
}

/// Several clients take overlapping sets of 3 or 4 names out of 6, given
/// in random orders, again and again: all finish (no deadlock) and no name
/// ever has two holders.
pub async fn multi_contention<F: Fixture>(fx: &F) {
    const CLIENTS: usize = 4;
    const ROUNDS: usize = 12;
    let pool = Arc::new(names("multi_contention", 6));
    let holders: Arc<Vec<AtomicU64>> = Arc::new((0..6).map(|_| AtomicU64::new(0)).collect());
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let client = fx.client().await;
        let (pool, holders) = (Arc::clone(&pool), Arc::clone(&holders));
        let lease = long(fx, client.as_ref());
        let mut sets = Vec::new();
        let mut rng = fastrand::Rng::with_seed(fastrand::u64(..));
        for _ in 0..ROUNDS {
            let mut picked: Vec<usize> = (0..6).collect();
            rng.shuffle(&mut picked);
            picked.truncate(rng.usize(3..=4));
            let names: Vec<String> = picked.iter().map(|&i| pool[i].clone()).collect();
            sets.push((picked, set(fx, client.as_ref(), &names, lease)));
        }
        tasks.push(tokio::spawn(async move {
            let _client = client;
            for (picked, set) in sets {
                let guard = set.lock().await.expect("lock of the set");
                for &i in &picked {
                    assert_eq!(
                        holders[i].fetch_add(1, Ordering::SeqCst),
                        0,
                        "two holders of {}",
                        pool[i]
                    );
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                for &i in &picked {
                    holders[i].fetch_sub(1, Ordering::SeqCst);
                }
                guard.release().await.expect("release of the set");
            }
        }));
    }
    let all = futures::future::join_all(tasks);
    let done = tokio::time::timeout(Duration::from_secs(60) + SLACK, all)
        .await
        .expect("overlapping sets did not finish: deadlock?");
    for t in done {
        t.expect("task");
    }
}

/// A set of ten free names through `proxy`, every byte of which is delayed
/// so that one request takes about 400 ms (well inside the client's
/// `response_timeout`): `lock_timeout(1 s)` must return within 1 s plus one
/// response timeout (the members taken by then are released, side by
/// side), not one request per member past the deadline, and leave every
/// name free once the proxy is healed. `make` builds the set's member for a
/// name on the proxied client; `direct` checks the names afterwards.
///
/// # Panics
///
/// When the set overran its bound, or a name stayed held; `what` names the
/// case.
pub async fn set_keeps_its_deadline_on_a_slow_server(
    proxy: &crate::proxy::Proxy,
    make: impl Fn(&str) -> Arc<dyn Lock>,
    direct: impl Fn(&str) -> Arc<dyn Lock>,
    response_timeout: Duration,
    what: &str,
) {
    let names = names("multi_slow", 10);
    let set = LockSet::from_locks(names.iter().map(|n| make(n))).expect("a valid set");
    proxy.set_delay(Duration::from_millis(200));
    let timeout = Duration::from_secs(1);
    let started = std::time::Instant::now();
    let got = tokio::time::timeout(Duration::from_secs(30), set.lock_timeout(timeout))
        .await
        .unwrap_or_else(|_| panic!("{what}: lock_timeout(1 s) of a set hung"));
    let took = started.elapsed();
    proxy.set_delay(Duration::ZERO);
    let bound = timeout + response_timeout + SLACK.min(Duration::from_millis(500));
    assert!(
        took <= bound,
        "{what}: lock_timeout({timeout:?}) of ten names took {took:?} (bound {bound:?})"
    );
    match got {
        Ok(None) => {}
        Ok(Some(_)) => panic!("{what}: ten names at ~400 ms each came within 1 s"),
        Err(e) => assert!(e.is_retryable(), "{what}: untyped failure: {e:?}"),
    }
    for name in &names {
        let lock = direct(name);
        let guard = lock
            .lock_timeout(SLACK)
            .await
            .expect("lock_timeout")
            .unwrap_or_else(|| panic!("{what}: {name} still held {SLACK:?} after the set gave up"));
        guard.release().await.expect("release");
    }
}

/// A set of three names through `proxy`, the last held by `blocker`: the
/// set takes the first two and waits for the third; 300 ms before its 1 s
/// deadline the proxy partitions it (blackhole and cut). `lock_timeout`
/// must return within 1 s plus one response timeout, releases of the two
/// it took included, and the two must be free again once the proxy heals.
///
/// # Panics
///
/// When the set overran its bound or acquired, or a name stayed held;
/// `what` names the case.
pub async fn set_keeps_its_deadline_through_a_partition(
    proxy: &crate::proxy::Proxy,
    make: impl Fn(&str) -> Arc<dyn Lock>,
    direct: impl Fn(&str) -> Arc<dyn Lock>,
    response_timeout: Duration,
    what: &str,
) {
    let names = names("multi_partition", 3);
    let held = direct(&names[2])
        .try_lock()
        .await
        .expect("try_lock")
        .expect("a fresh name");
    let set = LockSet::from_locks(names.iter().map(|n| make(n))).expect("a valid set");
    let timeout = Duration::from_secs(1);
    let started = std::time::Instant::now();
    let waiting = tokio::spawn(async move { set.lock_timeout(timeout).await });
    tokio::time::sleep(Duration::from_millis(700)).await;
    proxy.set_blackhole(true);
    proxy.cut();
    let got = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .unwrap_or_else(|_| panic!("{what}: lock_timeout(1 s) of a set hung"))
        .expect("the waiting task");
    let took = started.elapsed();
    proxy.heal();
    let bound = timeout + response_timeout + SLACK.min(Duration::from_millis(500));
    assert!(
        took <= bound,
        "{what}: lock_timeout({timeout:?}) partitioned took {took:?} (bound {bound:?})"
    );
    match got {
        Ok(None) => {}
        Ok(Some(_)) => panic!("{what}: took a set whose last name is held"),
        Err(e) => assert!(e.is_retryable(), "{what}: untyped failure: {e:?}"),
    }
    held.release().await.expect("release");
    // A release left to the background lands once the client is back: a
    // connection attempt made during the partition may first take its
    // connect timeout (5 s on ZooKeeper) to give up.
    for name in &names[..2] {
        let lock = direct(name);
        let guard = lock
            .lock_timeout(Duration::from_secs(5) + SLACK * 2)
            .await
            .expect("lock_timeout")
            .unwrap_or_else(|| panic!("{what}: {name} still held after the set gave up"));
        guard.release().await.expect("release");
    }
}
