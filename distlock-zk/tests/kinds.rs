//! One name is one lock on ZooKeeper, beyond the cross-kind suite
//! (`conformance.rs`, `kinds`): a Curator mutex counts as a fair mutex, and
//! a mutex or fair mutex that yields to the other and gives up leaves no
//! node behind.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use distlock_core::Provider;
use distlock_zk::{ZkOptions, ZkProvider};
use test_support::proxy::Proxy;
use test_support::unique_name;

fn hosts() -> String {
    test_support::zookeeper::shared().connect_string()
}

async fn provider() -> ZkProvider {
    ZkProvider::connect_with(ZkOptions::new(hosts()))
        .await
        .unwrap()
}

/// A Curator `InterProcessMutex` holding the path is a fair mutex to
/// distlock: a semaphore and a read side on the same name are refused with
/// `Conflict`, and get in once Curator released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_mutex_refuses_other_kinds_until_released() {
    let hosts = hosts();
    let locks = provider().await;
    let name = unique_name("curator-kind");
    let path = locks.path(&name).unwrap();
    let holder = test_support::curator::spawn("CuratorPeer", &hosts, &path, &["hold", "3"]);
    let fair = locks.fair_mutex(&name).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match fair.try_lock().await.unwrap() {
            None => break,
            Some(g) => {
                g.release().await.unwrap();
                assert!(Instant::now() < deadline, "Curator never took the lock");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    let refused = locks.semaphore(&name, 2).unwrap().try_lock().await;
    assert!(
        refused
            .as_ref()
            .is_err_and(distlock_core::Error::is_conflict),
        "{refused:?}"
    );
    let refused = locks.rw_lock(&name).unwrap().read().try_lock().await;
    assert!(
        refused
            .as_ref()
            .is_err_and(distlock_core::Error::is_conflict),
        "{refused:?}"
    );
    let out = tokio::task::spawn_blocking(move || test_support::curator::output(holder))
        .await
        .unwrap();
    assert_eq!(out, "acquired\nreleased");
    let reader = locks.rw_lock(&name).unwrap().read();
    reader
        .lock_timeout(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("free after Curator's release")
        .release()
        .await
        .unwrap();
}

/// The unfair mutex yields to an older fair holder (and the fair head to an
/// older unfair holder) keeping its node; when it gives up (a try, a
/// timeout) the node is deleted, so nothing of it blocks the name after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutex_that_yields_and_gives_up_leaves_no_node() {
    let (a, b) = (provider().await, provider().await);
    let raw = zookeeper_client::Client::connect(&hosts()).await.unwrap();
    for fair_first in [true, false] {
        let name = unique_name("yield");
        let dir = a.path(&name).unwrap();
        let (first, second) = if fair_first {
            (a.fair_mutex(&name).unwrap(), b.mutex(&name).unwrap())
        } else {
            (a.mutex(&name).unwrap(), b.fair_mutex(&name).unwrap())
        };
        let held = first.lock().await.unwrap();
        let before = raw.list_children(&dir).await.unwrap();
        assert!(second.try_lock().await.unwrap().is_none());
        let started = Instant::now();
        assert!(second
            .lock_timeout(Duration::from_millis(300))
            .await
            .unwrap()
            .is_none());
        assert!(started.elapsed() >= Duration::from_millis(300));
        let after = raw.list_children(&dir).await.unwrap();
        assert_eq!(after, before, "fair first: {fair_first}: a node was left");
        held.release().await.unwrap();
        second
            .lock_timeout(Duration::from_secs(5))
            .await
            .unwrap()
            .expect("free after the release")
            .release()
            .await
            .unwrap();
    }
}

/// The fair head that yields to an older unfair node waits for the very
/// node it compared, not for the path `_unfair_lock`: when that node is
/// released and another unfair mutex creates `_unfair_lock` again between
/// the head's check and its watch, the head compares again (the new node is
/// younger than the head, which holds; the new unfair node yields to it).
/// Before, the head watched the new, younger node, which in turn yielded to
/// the older head and watched it: each waited for the other and nobody got
/// the free lock.
///
/// The fair mutex runs behind a proxy that delays every chunk by `D`, so
/// its check's stat and its watch reach the server `2 D` apart; the unfair
/// holder hands over to another unfair mutex inside that window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_head_that_yields_watches_the_unfair_node_it_compared() {
    // Hand-over offsets after the fair node shows, in units of D / 2.
    let mut stuck = Vec::new();
    for half_ds in [7, 8, 9, 10, 11, 12] {
        if let Some(report) = yield_trial(half_ds).await {
            stuck.push(report);
        }
    }
    assert!(stuck.is_empty(), "nobody got the free lock: {stuck:#?}");
}

/// One trial: `None` when someone got the lock after the hand-over.
async fn yield_trial(half_ds: u32) -> Option<String> {
    const D: Duration = Duration::from_millis(400);
    let zk = test_support::zookeeper::shared();
    let proxy = Proxy::start(zk.addr(0));
    let slow = ZkProvider::connect_with(ZkOptions::new(proxy.addr().to_string()))
        .await
        .unwrap();
    let (a, b) = (provider().await, provider().await);
    let raw = zookeeper_client::Client::connect(&hosts()).await.unwrap();
    let name = unique_name("review-yield-watch");
    let dir = a.path(&name).unwrap();
    let first = a.mutex(&name).unwrap().lock().await.unwrap();
    proxy.set_delay(D);
    let fair = slow.fair_mutex(&name).unwrap();
    let mut fair_task =
        tokio::spawn(async move { fair.lock_timeout(Duration::from_secs(30)).await });
    let seen = loop {
        let children = raw.list_children(&dir).await.unwrap();
        if children.iter().any(|c| c.contains("-lock-")) {
            break Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    tokio::time::sleep(D * half_ds / 2).await;
    let second = b.mutex(&name).unwrap();
    first.release().await.unwrap();
    let mut second_task =
        tokio::spawn(async move { second.lock_timeout(Duration::from_secs(30)).await });
    let handed = seen.elapsed();
    // The fair mutex's requests already on their way drain; after that
    // nothing is slow.
    tokio::time::sleep(4 * D).await;
    proxy.set_delay(Duration::ZERO);
    let got = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::select! {
            f = &mut fair_task => ("fair", f.unwrap().unwrap().is_some()),
            s = &mut second_task => ("second unfair", s.unwrap().unwrap().is_some()),
        }
    })
    .await;
    let children = raw.list_children(&dir).await.unwrap();
    proxy.set_delay(Duration::ZERO);
    let mut owners = Vec::new();
    for child in &children {
        if let Ok((_, stat)) = raw.get_data(&format!("{dir}/{child}")).await {
            owners.push(format!(
                "{child}: czxid {} session {:#x}",
                stat.czxid, stat.ephemeral_owner
            ));
        }
    }
    let watches = watches_under(&dir);
    eprintln!("offset {half_ds}/2 D: handed over {handed:?} after the fair node showed: {got:?}");
    fair_task.abort();
    second_task.abort();
    if matches!(got, Ok((_, true))) {
        None
    } else {
        Some(format!(
            "offset {half_ds}/2 D (hand-over {handed:?} after the fair node showed): {got:?}, nodes {owners:?}, watches (wchp) {watches}"
        ))
    }
}

/// The server's watches (`wchp`: path, then the watching sessions) on the
/// paths under `dir`.
fn watches_under(dir: &str) -> String {
    use std::io::{Read, Write};
    let zk = test_support::zookeeper::shared();
    let mut s = std::net::TcpStream::connect(zk.addr(0)).unwrap();
    s.write_all(b"wchp").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let mut lines = Vec::new();
    let mut ours = false;
    for line in out.lines() {
        if line.starts_with('/') {
            ours = line.starts_with(dir);
        }
        if ours {
            lines.push(line.trim().to_owned());
        }
    }
    lines.join(" ")
}

/// An unfair mutex yields to an older fair holder (its `_unfair_lock` node
/// waits); `force_release(name, Mutex)` acts on the mutex family: it evicts
/// the fair holder (the real holder of the one lock), not the yielding
/// waiter's node, and `inspect(Mutex)` showed the fair holder as the holder.
/// The yielder then gets the lock with a guard that holds. Before, it
/// deleted the yielder's node, left the fair holder holding, and the
/// yielder's `lock_timeout` later returned a guard for a node long gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_of_the_mutex_evicts_the_fair_holder_not_a_yielding_node() {
    let (a, b, c) = (provider().await, provider().await, provider().await);
    let raw = zookeeper_client::Client::connect(&hosts()).await.unwrap();
    let name = unique_name("review-yield-force");
    let dir = a.path(&name).unwrap();
    let fair = a.fair_mutex(&name).unwrap().lock().await.unwrap();
    let unfair = b.mutex(&name).unwrap();
    let waiter = tokio::spawn(async move { unfair.lock_timeout(Duration::from_secs(10)).await });
    let deadline = Instant::now() + Duration::from_secs(5);
    while !raw
        .list_children(&dir)
        .await
        .unwrap()
        .iter()
        .any(|c| c == "_unfair_lock")
    {
        assert!(Instant::now() < deadline, "the unfair mutex never yielded");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mutex_kind = distlock_core::PrimitiveKind::Mutex;
    let before = a.inspect(&name, mutex_kind).await.unwrap();
    let forced = a.force_release(&name, mutex_kind).await.unwrap();
    let after = a.inspect(&name, mutex_kind).await.unwrap();
    let left = raw.list_children(&dir).await.unwrap();
    eprintln!("inspect(Mutex) before: {:?}", before.holders);
    assert_eq!(
        before
            .holders
            .iter()
            .map(|h| h.fencing_token)
            .collect::<Vec<_>>(),
        vec![Some(fair.fencing_token())],
        "inspect(Mutex) shows the fair holder as the holder"
    );
    assert_eq!(before.waiters.count, 1, "and the yielding node as a waiter");
    eprintln!("force_release(Mutex): {forced:?}; nodes left {left:?}");
    eprintln!("inspect(Mutex) after: {:?}", after.holders);
    let mut defects = Vec::new();
    if fair.is_held() && left.iter().any(|c| c.contains("-lock-")) {
        defects.push(format!(
            "force_release(Mutex) evicted {} node(s) but the fair holder still holds; inspect(Mutex) after shows {} holder(s)",
            forced.evicted,
            after.holders.len()
        ));
    }
    // The fair holder was evicted (its release says so): the yielder's
    // watch on it fired.
    let released = fair.release().await;
    assert!(
        matches!(released, Err(distlock_core::Error::NotHeld { .. })),
        "the evicted fair holder's release: {released:?}"
    );
    let got = waiter.await.unwrap();
    eprintln!("the yielder got {got:?}");
    match got {
        Ok(Some(g)) => {
            let other = c.mutex(&name).unwrap().try_lock().await.unwrap();
            if !g.is_held() || other.is_some() {
                defects.push(format!(
                    "lock_timeout returned a guard whose node was gone ({:?}); another mutex got in: {}",
                    g.status(),
                    other.is_some()
                ));
            }
        }
        other => defects.push(format!("the yielder did not get the free lock: {other:?}")),
    }
    assert!(defects.is_empty(), "{defects:#?}");
}

/// A yielding node deleted while it waits (by an operator, or by an older
/// distlock's `force_release`) never comes back as a held guard: when the
/// holder it waited for releases, the acquisition finds its node gone and
/// joins again, and its guard then holds a node of its own (another mutex
/// is refused). Before, `lock_timeout` returned a guard for the deleted
/// node while another mutex could get in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_yielding_node_deleted_meanwhile_does_not_come_back_held() {
    let (a, b, c) = (provider().await, provider().await, provider().await);
    let raw = zookeeper_client::Client::connect(&hosts()).await.unwrap();
    let name = unique_name("yield-deleted");
    let dir = a.path(&name).unwrap();
    let node = format!("{dir}/_unfair_lock");
    let fair = a.fair_mutex(&name).unwrap().lock().await.unwrap();
    let unfair = b.mutex(&name).unwrap();
    let waiter = tokio::spawn(async move { unfair.lock_timeout(Duration::from_secs(10)).await });
    let deadline = Instant::now() + Duration::from_secs(5);
    while raw.check_stat(&node).await.unwrap().is_none() {
        assert!(Instant::now() < deadline, "the unfair mutex never yielded");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Yielding (its watch on the fair holder set) well before this.
    tokio::time::sleep(Duration::from_millis(200)).await;
    raw.delete(&node, None).await.unwrap();
    fair.release().await.unwrap();
    let got = waiter.await.unwrap().unwrap();
    let g = got.expect("the yielder gets the free lock");
    let other = c.mutex(&name).unwrap().try_lock().await.unwrap();
    assert!(
        g.is_held() && other.is_none(),
        "the yielder's guard holds ({:?}) and another mutex is refused (it got in: {})",
        g.status(),
        other.is_some()
    );
    let czxid = raw.check_stat(&node).await.unwrap().map(|s| s.czxid);
    assert_eq!(czxid, i64::try_from(g.fencing_token()).ok());
}

/// The mirror of the case above: a fair head yields to an older unfair
/// holder; `force_release(FairMutex)` evicts the unfair holder, not the
/// waiting head (before, `inspect(FairMutex)` showed the waiting head as
/// the holder and `force_release` deleted it, leaving the unfair holder
/// holding).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_of_the_fair_mutex_evicts_the_holder_not_a_yielding_head() {
    let (a, b) = (provider().await, provider().await);
    let raw = zookeeper_client::Client::connect(&hosts()).await.unwrap();
    let name = unique_name("review-fair-force");
    let dir = a.path(&name).unwrap();
    let unfair = a.mutex(&name).unwrap().lock().await.unwrap();
    let fair = b.fair_mutex(&name).unwrap();
    let waiter = tokio::spawn(async move { fair.lock_timeout(Duration::from_secs(3)).await });
    let deadline = Instant::now() + Duration::from_secs(5);
    while !raw
        .list_children(&dir)
        .await
        .unwrap()
        .iter()
        .any(|c| c.contains("-lock-"))
    {
        assert!(Instant::now() < deadline, "the fair mutex never queued");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let fair_kind = distlock_core::PrimitiveKind::FairMutex;
    let before = a.inspect(&name, fair_kind).await.unwrap();
    let forced = a.force_release(&name, fair_kind).await.unwrap();
    let left = raw.list_children(&dir).await.unwrap();
    eprintln!(
        "inspect(FairMutex) before: {} holder(s), {:?} waiters; force_release: {forced:?}; nodes left {left:?}; the unfair holder is_held {}",
        before.holders.len(),
        before.waiters.count,
        unfair.is_held()
    );
    assert_eq!(
        before
            .holders
            .iter()
            .map(|h| h.fencing_token)
            .collect::<Vec<_>>(),
        vec![Some(unfair.fencing_token())],
        "inspect(FairMutex) shows the unfair holder as the holder"
    );
    assert_eq!(before.waiters.count, 1, "and the yielding head as a waiter");
    assert_eq!(forced.evicted, 1);
    assert!(
        left.iter().any(|c| c.contains("-lock-")) && !left.iter().any(|c| c == "_unfair_lock"),
        "force_release(FairMutex) evicts the unfair holder, not the yielding head: {left:?}"
    );
    let got = waiter.await.unwrap();
    eprintln!("the fair waiter got {got:?}");
    let g = got
        .unwrap()
        .expect("the fair head gets the lock once the holder is evicted");
    assert!(g.is_held());
}

/// A name whose segment is another lock's internal node (the mutex's
/// `_unfair_lock`, the semaphore's `locks` and `leases`, a queue node) is
/// refused as invalid input by every primitive and operation, before any
/// request: held, `X/_unfair_lock` would be the node that shows the mutex
/// `X` held, and `Y/leases` a permit of the semaphore `Y`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_that_is_another_locks_internal_node_is_invalid() {
    let locks = provider().await;
    let base = unique_name("internal");
    let invalid = |r: Result<(), distlock_core::Error>, what: &str| match r {
        Err(distlock_core::Error::InvalidName { .. }) => {}
        other => panic!("{what}: {other:?}"),
    };
    for child in [
        "_unfair_lock",
        "_unfair_lock-asked-42",
        "locks",
        "leases",
        "_c_0f1e2d3c-lock-0000000001",
        "k__lock__0000000001",
        "_c_0f1e2d3c-latch-0000000001",
        "_c_0f1e2d3c-__READ__0000000001",
        "_c_0f1e2d3c-__WRIT__0000000001",
    ] {
        let name = format!("{base}/{child}");
        invalid(locks.mutex(&name).map(drop), &name);
        invalid(locks.fair_mutex(&name).map(drop), &name);
        invalid(locks.rw_lock(&name).map(drop), &name);
        invalid(locks.semaphore(&name, 1).map(drop), &name);
        invalid(locks.election(&name).map(drop), &name);
        invalid(locks.id_generator(&name, 1).map(drop), &name);
        invalid(locks.path(&name).map(drop), &name);
        for kind in [
            distlock_core::PrimitiveKind::Mutex,
            distlock_core::PrimitiveKind::Semaphore,
        ] {
            invalid(locks.inspect(&name, kind).await.map(drop), &name);
            invalid(locks.request_release(&name, kind).await.map(drop), &name);
            invalid(locks.force_release(&name, kind).await.map(drop), &name);
        }
    }
    // Nothing was created under the name.
    let session = zookeeper_client::Client::connect(&hosts()).await.unwrap();
    let dir = locks.path(&base).unwrap();
    assert_eq!(
        session.check_stat(&dir).await.unwrap(),
        None,
        "{dir} was created"
    );

    // The names next to them are independent locks: the mutex `X` and
    // the mutex `X/unfair_lock` are held at once, and the semaphore `Y` of
    // one permit is free while the mutex `Y/lease` is held.
    let x = locks.mutex(&base).unwrap().try_lock().await.unwrap();
    let x = x.expect("X is free");
    let beside = locks.mutex(&format!("{base}/unfair_lock")).unwrap();
    let beside = beside.try_lock().await.unwrap().expect("independent of X");
    x.release().await.unwrap();
    beside.release().await.unwrap();
    let y = unique_name("internal-sem");
    let lease = locks.mutex(&format!("{y}/lease")).unwrap();
    let lease = lease.try_lock().await.unwrap().expect("free");
    let permit = locks.semaphore(&y, 1).unwrap().try_lock().await.unwrap();
    permit
        .expect("the semaphore's one permit")
        .release()
        .await
        .unwrap();
    lease.release().await.unwrap();
}
