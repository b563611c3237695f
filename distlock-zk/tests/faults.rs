//! The unhappy interleavings on real ZooKeeper: a create that lands but whose
//! reply is lost, then a partition longer than the operation timeout; an
//! acquisition cancelled while its own cleanup runs; a holder partitioned
//! from an ensemble while another client waits; sequence counters past
//! `i32::MAX`; lease options the session cannot honour; a request to
//! release made while its holder is cut off, or whose reply is lost.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_core::{Error, LeaseOptions, Lock, LostReason, PrimitiveKind, Provider};
use distlock_zk::zookeeper_client::{self, Acls, CreateMode};
use distlock_zk::{ZkOptions, ZkProvider};
use test_support::{unique_name, Proxy, ZkCluster};

const SLACK: Duration = Duration::from_secs(3);

async fn provider(hosts: &str) -> ZkProvider {
    ZkProvider::connect_with(ZkOptions::new(hosts))
        .await
        .unwrap()
}

fn lock_of(p: &ZkProvider, name: &str, fair: bool) -> Arc<dyn Lock> {
    if fair {
        p.fair_mutex(name).unwrap()
    } else {
        p.mutex(name).unwrap()
    }
}

/// Whatever the victim's acquisition returned (a guard for its own node, or
/// nothing), nothing of its may be left: another client takes the lock well
/// within the victim's session timeout.
async fn nothing_left_behind(
    got: distlock_core::Result<Option<distlock_core::LockGuard>>,
    other: &ZkProvider,
    name: &str,
    fair: bool,
) {
    match got {
        // It found its own node and holds the lock: release it.
        Ok(Some(guard)) => {
            assert!(guard.is_held());
            guard.release().await.unwrap();
        }
        Ok(None) => {}
        Err(e) => assert!(e.is_retryable(), "untyped failure: {e:?}"),
    }
    let g = lock_of(other, name, fair)
        .lock_timeout(SLACK)
        .await
        .unwrap()
        .expect("the victim left a node behind that blocks the lock");
    g.release().await.unwrap();
}

/// The victim's create reaches the server but its reply is lost; the
/// connection is then cut and blackholed for longer than the operation
/// timeout. Whatever the victim's acquisition returns, nothing of its may be
/// left behind: another client takes the lock well within the victim's
/// (long) session timeout.
async fn lost_create_reply_then_partition(fair: bool) {
    let zk = test_support::zookeeper::shared();
    let proxy = Proxy::start(zk.addr(0));
    let name = unique_name(if fair {
        "lost-reply-fair"
    } else {
        "lost-reply"
    });
    let options = ZkOptions::new(proxy.addr().to_string())
        .session_timeout(Duration::from_secs(20))
        .operation_timeout(Duration::from_millis(400));
    let victim = ZkProvider::connect_with(options).await.unwrap();
    let other = provider(&zk.connect_string()).await;
    let lock = lock_of(&victim, &name, fair);
    proxy.lose_next_reply();
    let started = Instant::now();
    let acquiring = tokio::spawn(async move {
        let r = lock.lock_timeout(Duration::from_secs(3)).await;
        (r, lock)
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(
        proxy.swallowed_some(Duration::from_secs(3)).await,
        "no reply was lost"
    );
    proxy.cut();
    proxy.set_blackhole(true);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    proxy.heal();
    let (got, _lock) = tokio::time::timeout(Duration::from_secs(3) + SLACK * 2, acquiring)
        .await
        .expect("the acquisition outlived its timeout")
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(3) + SLACK * 2,
        "returned late"
    );
    nothing_left_behind(got, &other, &name, fair).await;
    // Not a second node in the queue either.
    let operator = zookeeper_client::Client::connect(&zk.connect_string())
        .await
        .unwrap();
    let dir = victim.path(&name).unwrap();
    let deadline = Instant::now() + SLACK;
    loop {
        let left = operator.list_children(&dir).await.unwrap_or_default();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "stray nodes: {left:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfair_lost_create_reply_then_partition_leaves_nothing() {
    lost_create_reply_then_partition(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_lost_create_reply_then_partition_leaves_nothing() {
    lost_create_reply_then_partition(true).await;
}

/// Waits until the proxy swallows a reply (the armed request was
/// forwarded), then cuts the connection: the client sees a connection loss
/// for a request that took effect.
async fn cut_once_swallowed(proxy: &Proxy) {
    let deadline = Instant::now() + SLACK;
    while !proxy.losing_replies() {
        assert!(Instant::now() < deadline, "the armed request never came");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    proxy.cut();
}

/// The create lands but its reply is lost, and so is the reply of the
/// lookup that follows (both through connection cuts, the connection
/// working again at once): the acquisition must keep looking, never create
/// a second node or wait on its own.
async fn lost_create_and_lookup_replies(fair: bool) {
    let zk = test_support::zookeeper::shared();
    let proxy = Proxy::start(zk.addr(0));
    let name = unique_name(if fair {
        "lost-lookup-fair"
    } else {
        "lost-lookup"
    });
    let victim = ZkProvider::connect_with(
        ZkOptions::new(proxy.addr().to_string())
            .session_timeout(Duration::from_secs(20))
            .operation_timeout(Duration::from_millis(800)),
    )
    .await
    .unwrap();
    let other = provider(&zk.connect_string()).await;
    let lock = lock_of(&victim, &name, fair);
    let dir = victim.path(&name).unwrap();
    // Parents first, so the create below is the lock node's.
    let warm = lock.lock().await.unwrap();
    warm.release().await.unwrap();
    let (create_marker, lookup_marker) = if fair {
        (b"-lock-".to_vec(), dir.clone().into_bytes())
    } else {
        (b"_unfair_lock".to_vec(), b"_unfair_lock".to_vec())
    };
    proxy.lose_reply_to(&create_marker);
    let acquiring = tokio::spawn(async move {
        let r = lock.lock_timeout(Duration::from_secs(3)).await;
        (r, lock)
    });
    cut_once_swallowed(&proxy).await;
    proxy.lose_reply_to(&lookup_marker);
    cut_once_swallowed(&proxy).await;
    let (got, _lock) = tokio::time::timeout(Duration::from_secs(3) + SLACK, acquiring)
        .await
        .expect("the acquisition outlived its timeout")
        .unwrap();
    nothing_left_behind(got, &other, &name, fair).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfair_lost_create_and_lookup_replies_leave_nothing() {
    lost_create_and_lookup_replies(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_lost_create_and_lookup_replies_leave_nothing() {
    lost_create_and_lookup_replies(true).await;
}

/// An acquisition that times out starts deleting its queue node while the
/// connection is down; an outer timeout cancels it in the middle of that
/// cleanup. The node must still go once the connection is back (in the
/// background), not stay for the whole session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_during_its_own_cleanup_still_withdraws() {
    let zk = test_support::zookeeper::shared();
    let proxy = Proxy::start(zk.addr(0));
    let name = unique_name("cancel-cleanup");
    let holder = provider(&zk.connect_string()).await;
    let next = provider(&zk.connect_string()).await;
    let victim = ZkProvider::connect_with(
        ZkOptions::new(proxy.addr().to_string()).session_timeout(Duration::from_secs(20)),
    )
    .await
    .unwrap();
    let guard = holder.fair_mutex(&name).unwrap().lock().await.unwrap();
    let lock = victim.fair_mutex(&name).unwrap();
    let attempt = tokio::spawn(async move {
        // The inner timeout (500 ms) starts the cleanup while the
        // connection is down; the outer one (900 ms) cancels it midway.
        tokio::time::timeout(
            Duration::from_millis(900),
            lock.lock_timeout(Duration::from_millis(500)),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(350)).await;
    proxy.cut();
    proxy.set_blackhole(true);
    let outcome = attempt.await.unwrap();
    assert!(
        outcome.is_err(),
        "the outer timeout did not cut the cleanup: {outcome:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.heal();
    let waiting = next.fair_mutex(&name).unwrap();
    let waiter = tokio::spawn(async move { waiting.lock_timeout(SLACK * 2).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    guard.release().await.unwrap();
    let g = waiter
        .await
        .unwrap()
        .unwrap()
        .expect("the cancelled waiter's node still heads the queue");
    g.release().await.unwrap();
}

/// The unfair holder's delete lands but its reply is lost; a waiter then
/// creates the lock node again (same path, same version 0). The holder's
/// retried release must see the node is no longer its own and leave the new
/// holder's lock alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_delete_reply_never_deletes_the_next_holders_node() {
    let zk = test_support::zookeeper::shared();
    let proxy = Proxy::start(zk.addr(0));
    let name = unique_name("lost-delete");
    let victim = ZkProvider::connect_with(
        ZkOptions::new(proxy.addr().to_string()).session_timeout(Duration::from_secs(20)),
    )
    .await
    .unwrap();
    let next = provider(&zk.connect_string()).await;
    let third = provider(&zk.connect_string()).await;
    let guard = victim.mutex(&name).unwrap().lock().await.unwrap();
    let waiting = next.mutex(&name).unwrap();
    let waiter = tokio::spawn(async move { waiting.lock_timeout(SLACK * 2).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Lose the reply to the delete request alone: on the wire, opcode 2
    // (delete) followed by the length-prefixed path.
    let path = format!("{}/_unfair_lock", victim.path(&name).unwrap());
    let mut delete = vec![0, 0, 0, 2];
    delete.extend_from_slice(&i32::try_from(path.len()).unwrap().to_be_bytes());
    delete.extend_from_slice(path.as_bytes());
    proxy.lose_reply_to(&delete);
    let release = tokio::spawn(async move { guard.release().await });
    cut_once_swallowed(&proxy).await;
    // The old holder cannot reconnect until the waiter holds the new node.
    proxy.set_blackhole(true);
    let taken = waiter
        .await
        .unwrap()
        .unwrap()
        .expect("the delete did not land");
    proxy.heal();
    let released = tokio::time::timeout(SLACK * 2, release)
        .await
        .expect("release hung")
        .unwrap();
    // Its delete did land: the release reports success.
    assert!(released.is_ok(), "{released:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(taken.is_held());
    assert!(
        third
            .mutex(&name)
            .unwrap()
            .try_lock()
            .await
            .unwrap()
            .is_none(),
        "the old holder's retried delete removed the new holder's node"
    );
    taken.release().await.unwrap();
}

/// A holder partitioned from a 3-node ensemble while another client waits:
/// its `lost()` fires before the other client's acquisition returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_partitioned_from_the_ensemble_knows_before_the_next_holder() {
    let zk = ZkCluster::start(3);
    let proxy = Proxy::start(zk.addr(0));
    let name = unique_name("partition");
    let holder = ZkProvider::connect_with(
        ZkOptions::new(proxy.addr().to_string()).session_timeout(Duration::from_secs(4)),
    )
    .await
    .unwrap();
    let timeout = holder.session_timeout().await.unwrap();
    let other = provider(&zk.connect_string()).await;
    let guard = holder.fair_mutex(&name).unwrap().lock().await.unwrap();
    let waiting = other.fair_mutex(&name).unwrap();
    let waiter = tokio::spawn(async move {
        let g = waiting.lock_timeout(Duration::from_secs(30)).await;
        (g, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let lost = guard.lost();
    let lost_at = tokio::spawn(async move { (lost.await, Instant::now()) });
    let cut_at = Instant::now();
    proxy.set_blackhole(true);
    let (taken, taken_at) = waiter.await.unwrap();
    let taken = taken
        .unwrap()
        .expect("the partitioned holder's lock never freed");
    let (reason, lost_at) = lost_at.await.unwrap();
    assert_eq!(reason, LostReason::Expired);
    assert!(
        lost_at <= taken_at,
        "lost() fired {:?} after the next holder acquired",
        lost_at - taken_at
    );
    assert!(lost_at - cut_at <= timeout);
    assert!(taken.fencing_token() > guard.fencing_token());
    taken.release().await.unwrap();
    proxy.set_blackhole(false);
}

/// A lock directory whose sequence counter passed `i32::MAX` (ZooKeeper then
/// prints sequences negative) is a typed conflict, not an endless loop of
/// creates; our node is not left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrapped_sequence_is_a_conflict_not_a_loop() {
    let zk = test_support::zookeeper::shared();
    let locks = provider(&zk.connect_string()).await;
    let name = unique_name("wrapped");
    let dir = locks.path(&name).unwrap();
    let operator = zookeeper_client::Client::connect(&zk.connect_string())
        .await
        .unwrap();
    let open = CreateMode::Persistent.with_acls(Acls::anyone_all());
    operator.mkdir(&dir, &open).await.unwrap();
    // What a kazoo lock node looks like once the counter has wrapped.
    let wrapped = format!("{dir}/abc__lock__-2147483648");
    operator.create(&wrapped, b"", &open).await.unwrap();
    let r = tokio::time::timeout(SLACK, locks.fair_mutex(&name).unwrap().try_lock())
        .await
        .expect("looped on a wrapped sequence");
    assert!(matches!(r, Err(Error::Conflict { .. })), "{r:?}");
    let left = operator.list_children(&dir).await.unwrap();
    assert_eq!(left, vec!["abc__lock__-2147483648".to_owned()]);
}

/// The session is the lease: other lease options are refused with a typed
/// error, and a session lease cannot be extended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_options_the_session_cannot_honour_are_refused() {
    let locks = provider(&test_support::zookeeper::shared().connect_string()).await;
    let name = unique_name("lease-options");
    let manual = LeaseOptions::manual(Duration::from_secs(5)).unwrap();
    // Refused by `with_lease` itself, before any primitive is made.
    let r = locks.with_lease(manual);
    assert!(matches!(r, Err(Error::InvalidOptions(_))), "{r:?}");
    // The message says what to do instead.
    let two_seconds = LeaseOptions::new(Duration::from_secs(2)).unwrap();
    let message = locks.with_lease(two_seconds).unwrap_err().to_string();
    for hint in [
        "a lease of 2s",
        "with_lease",
        "default_lease()",
        "session_timeout_ms",
    ] {
        assert!(message.contains(hint), "{hint:?} not in {message:?}");
    }
    let default = locks.default_lease();
    let guard = locks
        .with_lease(default)
        .unwrap()
        .fair_mutex(&name)
        .unwrap()
        .lock()
        .await
        .unwrap();
    assert_eq!(guard.ttl(), None);
    let r = guard.extend(Duration::from_secs(5)).await;
    assert!(matches!(r, Err(Error::InvalidOptions(_))), "{r:?}");
    guard.release().await.unwrap();
}

/// `close()` ends the session (its connection closes) even while the
/// application still has the provider, a lock and a guard around; a
/// process that closes and exits does not leave its session to time out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_ends_the_session_with_handles_left() {
    let zk = test_support::zookeeper::shared();
    let proxy = Proxy::start(zk.addr(0));
    let locks = ZkProvider::connect_with(
        ZkOptions::new(proxy.addr().to_string()).session_timeout(Duration::from_secs(30)),
    )
    .await
    .unwrap();
    let name = unique_name("close-session");
    let lock = locks.fair_mutex(&name).unwrap();
    let guard = lock.lock().await.unwrap();
    assert_eq!(proxy.open_connections(), 1);
    locks.close().await.unwrap();
    proxy.wait_closed(SLACK, "after close()").await;
    assert!(!guard.is_held());
    assert!(matches!(locks.session_id().await, Err(Error::Closed)));
    drop((lock, guard));
}

/// Dropping every handle closes the session in the background.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_last_handle_ends_the_session() {
    let zk = test_support::zookeeper::shared();
    let proxy = Proxy::start(zk.addr(0));
    let locks = ZkProvider::connect_with(ZkOptions::new(proxy.addr().to_string()))
        .await
        .unwrap();
    let lock = locks.mutex(&unique_name("drop-session")).unwrap();
    let guard = lock.lock().await.unwrap();
    drop(locks);
    drop(lock);
    drop(guard);
    proxy.wait_closed(SLACK, "after the last handle went").await;
}

/// A request to release made while the holder's connection is open but
/// silent (every byte swallowed, shorter than the session) is heard once
/// the connection works again: through the node's data watch, which the
/// client sets again on its new connection, or at the latest at the next
/// session check (session timeout / 4). The request ended nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_made_while_the_holder_is_cut_off_is_heard_after() {
    let zk = test_support::zookeeper::shared();
    let proxy = Proxy::start(zk.addr(0));
    let session = Duration::from_secs(8);
    let holder = ZkProvider::connect_with(
        ZkOptions::new(proxy.addr().to_string())
            .session_timeout(session)
            .operation_timeout(Duration::from_millis(800)),
    )
    .await
    .unwrap();
    let operator = provider(&zk.connect_string()).await;
    for fair in [true, false] {
        let name = unique_name(if fair { "asked-cut-fair" } else { "asked-cut" });
        let kind = if fair {
            PrimitiveKind::FairMutex
        } else {
            PrimitiveKind::Mutex
        };
        let guard = lock_of(&holder, &name, fair).lock().await.unwrap();
        proxy.set_blackhole(true);
        // In a task of its own: on the unfair mutex the call waits (one
        // operation timeout at most) for the holder to take the request
        // over, which a silent holder cannot do.
        let asking = {
            let (operator, name) = (operator.clone(), name.clone());
            tokio::spawn(async move { operator.request_release(&name, kind).await })
        };
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(
            !guard.is_release_requested(),
            "heard through a silent connection"
        );
        proxy.set_blackhole(false);
        let asked = asking.await.unwrap().unwrap();
        assert_eq!(asked.len(), 1, "{asked:?}");
        if tokio::time::timeout(session / 4 + SLACK, guard.release_requested())
            .await
            .is_err()
        {
            panic!(
                "fair={fair}: the request was not heard after the partition; the lease is {:?}",
                guard.status()
            );
        }
        assert!(guard.is_held(), "{:?}", guard.status());
        guard.release().await.unwrap();
        let next = lock_of(&operator, &name, fair).try_lock().await.unwrap();
        next.expect("the asked holder's release left its node")
            .release()
            .await
            .unwrap();
    }
}

/// The operator's request lands but its reply is lost: the call fails with
/// a retryable error, the holder hears the request all the same, and
/// asking again (what a caller does with a retryable error) finds the
/// holder asked and changes nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_reply_is_lost_still_reaches_the_holder() {
    let zk = test_support::zookeeper::shared();
    let proxy = Proxy::start(zk.addr(0));
    let operator = ZkProvider::connect_with(
        ZkOptions::new(proxy.addr().to_string())
            .session_timeout(Duration::from_secs(20))
            .operation_timeout(Duration::from_millis(800)),
    )
    .await
    .unwrap();
    let holder = provider(&zk.connect_string()).await;
    let name = unique_name("asked-lost-reply");
    let guard = holder.rw_lock(&name).unwrap().write().lock().await.unwrap();
    // Only the write carries our nodes' data (the reads before it carry
    // paths): its reply is the one lost.
    proxy.lose_reply_to(b"distlock owner=");
    let e = operator
        .request_release(&name, PrimitiveKind::ReadWrite)
        .await
        .unwrap_err();
    assert!(e.is_retryable(), "{e:?}");
    assert!(proxy.swallowed_some(SLACK).await, "no reply was lost");
    tokio::time::timeout(SLACK, guard.release_requested())
        .await
        .expect("the request that landed was not heard");
    proxy.cut();
    proxy.heal();
    // Asking again, as a caller does after a retryable error (the first
    // tries may meet the connection being replaced).
    let deadline = Instant::now() + SLACK;
    let asked = loop {
        match operator
            .request_release(&name, PrimitiveKind::ReadWrite)
            .await
        {
            Ok(asked) => break asked,
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("asking again failed: {e:?}"),
        }
    };
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert!(asked[0].release_requested, "{asked:?}");
    assert!(guard.is_held(), "{:?}", guard.status());
    guard.release().await.unwrap();
    let snap = holder
        .inspect(&name, PrimitiveKind::ReadWrite)
        .await
        .unwrap();
    assert!(snap.holders.is_empty(), "{:?}", snap.holders);
}
