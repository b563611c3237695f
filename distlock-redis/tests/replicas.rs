//! Replica acknowledgement (`wait_replicas`): every acquisition and renewal
//! is followed by `WAIT` in the same pipeline. On a real master with a real
//! replica: what the replica acknowledged is on the replica when the guard
//! is returned; with the replica frozen (SIGSTOP) an acquisition is undone
//! and reported as `NotReplicated` (never as "busy"), renewals fail until the
//! lease is lost, waiters get the lock once the replica is back, and id
//! blocks are refused.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_core::{Error, LeaseOptions, LeaseStatus, Lock, Provider};
use distlock_redis::{RedisOptions, RedisProvider};
use test_support::primitives::Kind;
use test_support::replicas::Replicated;
use test_support::unique_name;

/// Long enough that a replica that is up always acknowledges in time on a
/// loaded machine; the frozen-replica cases pay it once per attempt.
const WAIT_TIMEOUT: Duration = Duration::from_secs(1);
const SLACK: Duration = Duration::from_secs(3);

fn acked(replicas: u32) -> RedisOptions {
    RedisOptions::new()
        .response_timeout(Duration::from_secs(3))
        .wait_for_replicas(replicas, WAIT_TIMEOUT)
}

async fn connect(set: &Replicated, options: RedisOptions) -> RedisProvider {
    RedisProvider::connect_with(&set.master().url(), options)
        .await
        .unwrap()
}

fn ttl(ms: u64) -> LeaseOptions {
    LeaseOptions::new(Duration::from_millis(ms)).unwrap()
}

/// Every kind of lock, the read side of a read-write lock included.
fn every_lock(client: &dyn Provider, name: &str, lease: LeaseOptions) -> Vec<Arc<dyn Lock>> {
    let mut locks: Vec<Arc<dyn Lock>> = [
        Kind::Mutex,
        Kind::FairMutex,
        Kind::RwWrite,
        Kind::Semaphore1,
    ]
    .into_iter()
    .enumerate()
    .map(|(i, kind)| kind.open(client, &format!("{name}-{i}"), lease).unwrap())
    .collect();
    locks.push(
        client
            .with_lease(lease)
            .unwrap()
            .rw_lock(&format!("{name}-r"))
            .unwrap()
            .read(),
    );
    locks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_hold_is_on_the_replica_when_the_guard_is_returned() {
    let set = Replicated::start(1);
    let client = connect(&set, acked(1)).await;
    let name = unique_name("acked");
    for lock in every_lock(&client, &name, ttl(30_000)) {
        let guard = lock.try_lock().await.unwrap().expect("free");
        // Read at once, with no wait: WAIT answered only after the replica
        // had the write.
        let on_replica = set.replica(0).cli(&["KEYS", &format!("*{}*", lock.name())]);
        assert!(
            !on_replica.is_empty(),
            "{}: the replica does not have the hold",
            lock.name()
        );
        guard.release().await.unwrap();
    }
    let ids = client.id_generator(&name, 10).unwrap();
    assert!(ids.next().await.unwrap() > 0);
    assert_eq!(
        set.replica(0).cli(&["EXISTS", &format!("{{{name}}}:ids")]),
        "1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_the_replica_does_not_acknowledge_is_undone_and_reported() {
    let set = Replicated::start(1);
    let client = connect(&set, acked(1)).await;
    let plain = connect(&set, RedisOptions::new()).await;
    let name = unique_name("unacked");
    // Load the scripts first, so the frozen replica is the only difference.
    for lock in every_lock(&client, &format!("{name}-warm"), ttl(30_000)) {
        lock.try_lock()
            .await
            .unwrap()
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    set.replica(0).pause();
    for (lock, other) in every_lock(&client, &name, ttl(30_000))
        .into_iter()
        .zip(every_lock(&plain, &name, ttl(30_000)))
    {
        let started = Instant::now();
        match lock.try_lock().await {
            Err(Error::NotReplicated {
                acked: 0,
                wanted: 1,
                after,
                ..
            }) => assert_eq!(after, WAIT_TIMEOUT),
            other => panic!("{}: {other:?}", lock.name()),
        }
        assert!(started.elapsed() < WAIT_TIMEOUT + SLACK);
        // Undone before the error was returned: a client that does not wait
        // for replicas gets it at once.
        let taken = other.try_lock().await.unwrap();
        assert!(taken.is_some(), "{}: left held", lock.name());
        taken.unwrap().release().await.unwrap();
    }
    let ids = client.id_generator(&name, 10).unwrap();
    assert!(matches!(
        ids.next().await,
        Err(Error::NotReplicated { acked: 0, .. })
    ));
    set.replica(0).resume();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_passed_for_want_of_replicas_is_not_reported_as_busy() {
    let set = Replicated::start(1);
    let client = connect(&set, acked(1)).await;
    let name = unique_name("deadline");
    let lock = client
        .with_lease(ttl(30_000))
        .unwrap()
        .mutex(&name)
        .unwrap();
    lock.try_lock()
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
    set.replica(0).pause();
    let started = Instant::now();
    let result = lock.lock_timeout(Duration::from_secs(1)).await;
    assert!(
        matches!(result, Err(Error::NotReplicated { .. })),
        "{result:?}"
    );
    assert!(started.elapsed() >= Duration::from_secs(1) - WAIT_TIMEOUT);
    assert!(started.elapsed() < Duration::from_secs(1) + SLACK);
    assert_eq!(set.master().cli(&["EXISTS", &name]), "0");
    set.replica(0).resume();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_get_the_lock_once_the_replica_is_back() {
    let set = Replicated::start(1);
    let client = connect(&set, acked(1)).await;
    let name = unique_name("back");
    let locks = every_lock(&client, &name, ttl(30_000));
    for lock in &locks {
        lock.try_lock()
            .await
            .unwrap()
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    set.replica(0).pause();
    let waiters: Vec<_> = locks
        .iter()
        .map(|lock| {
            let lock = Arc::clone(lock);
            tokio::spawn(async move { lock.lock().await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(waiters.iter().all(|w| !w.is_finished()));
    set.replica(0).resume();
    for (waiter, lock) in waiters.into_iter().zip(&locks) {
        let guard = tokio::time::timeout(SLACK, waiter)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(
            !set.replica(0)
                .cli(&["KEYS", &format!("*{}*", lock.name())])
                .is_empty(),
            "{}",
            lock.name()
        );
        guard.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_the_replica_does_not_acknowledge_suspend_then_lose_the_lease() {
    let set = Replicated::start(1);
    let client = connect(&set, acked(1)).await;
    let name = unique_name("renew");
    for lock in every_lock(&client, &name, ttl(3_000)) {
        let guard = lock.try_lock().await.unwrap().unwrap();
        let mut watch = guard.watch();
        set.replica(0).pause();
        let frozen = Instant::now();
        let mut suspended = false;
        let reason = tokio::time::timeout(Duration::from_millis(3_000) + SLACK, async {
            loop {
                match watch.status() {
                    LeaseStatus::Suspended => suspended = true,
                    LeaseStatus::Lost(reason) => return reason,
                    _ => {}
                }
                watch.changed().await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{}: never lost", lock.name()));
        assert!(suspended, "{}: lost without being suspended", lock.name());
        // Lost at the expiry of the last acknowledged renewal or acquisition:
        // not before the replica was frozen plus a renewal interval.
        assert!(frozen.elapsed() >= Duration::from_millis(400), "{reason:?}");
        set.replica(0).resume();
        set.wait_in_sync();
        drop(guard);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asking_for_more_replicas_than_there_are_never_acquires() {
    let set = Replicated::start(1);
    let client = connect(&set, acked(2)).await;
    let name = unique_name("two");
    let lock = client.mutex(&name).unwrap();
    match lock.try_lock().await {
        Err(Error::NotReplicated {
            acked: 1,
            wanted: 2,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(set.master().cli(&["EXISTS", &name]), "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_url_query_turns_it_on() {
    let set = Replicated::start(1);
    let url = format!(
        "{}?wait_replicas=1&wait_timeout_ms=900&response_timeout_ms=3000",
        set.master().url()
    );
    let client = RedisProvider::connect(&url).await.unwrap();
    let name = unique_name("url");
    let lock = client.mutex(&name).unwrap();
    lock.try_lock()
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
    set.replica(0).pause();
    match lock.try_lock().await {
        Err(Error::NotReplicated { after, .. }) => {
            assert_eq!(after, Duration::from_millis(900));
        }
        other => panic!("{other:?}"),
    }
    set.replica(0).resume();
    for (bad, invalid_url) in [
        ("wait_timeout_ms=100", true),
        ("wait_replicas=x", true),
        ("wait_replicas=1&wait_timeout_ms=0", false),
        ("wait_replicas=1&wait_timeout_ms=5000", false),
    ] {
        let url = format!("{}?{bad}", set.master().url());
        match RedisProvider::connect(&url).await {
            Err(Error::InvalidUrl(_)) if invalid_url => {}
            Err(Error::InvalidOptions(_)) if !invalid_url => {}
            other => panic!("{bad}: {other:?}"),
        }
    }
    assert_eq!(set.master().cli(&["EXISTS", &name]), "0");
}

/// The pipelined acquire and `WAIT` land, their replies are lost and the
/// connection is cut: the acquisition is not reported as held, and the key
/// it set does not stay for its 30 s TTL (the undo is retried on a new
/// connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_to_an_acknowledged_acquisition_leaves_nothing() {
    let set = Replicated::start(1);
    let proxy = test_support::Proxy::start(set.master().addr());
    let options = RedisOptions::new()
        .response_timeout(Duration::from_millis(1200))
        .wait_for_replicas(1, Duration::from_millis(500));
    let victim = RedisProvider::connect_with(&format!("redis://{}", proxy.addr()), options)
        .await
        .unwrap();
    let name = unique_name("lost-reply");
    let lock = victim
        .with_lease(ttl(30_000))
        .unwrap()
        .mutex(&name)
        .unwrap();
    // A first acquisition (connection made, replica acknowledging). Under
    // load the replica may miss the 500 ms WAIT: that is `NotReplicated`,
    // with nothing left held; try again.
    let deadline = Instant::now() + SLACK;
    loop {
        match lock.try_lock().await {
            Ok(Some(g)) => {
                g.release().await.unwrap();
                break;
            }
            Err(Error::NotReplicated { .. }) if Instant::now() < deadline => {}
            other => panic!("{other:?}"),
        }
    }
    // With a WAIT behind it the script goes as EVAL (no NOSCRIPT resend).
    proxy.lose_reply_to(b"EVAL");
    let attempt = tokio::spawn({
        let lock = Arc::clone(&lock);
        async move { lock.try_lock().await }
    });
    let deadline = Instant::now() + SLACK;
    while set.master().cli(&["EXISTS", &name]) != "1" {
        assert!(Instant::now() < deadline, "the acquire never landed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    proxy.cut();
    let got = tokio::time::timeout(SLACK, attempt).await.unwrap().unwrap();
    assert!(
        matches!(&got, Err(e) if e.is_retryable()),
        "a lost reply was reported as {got:?}"
    );
    proxy.heal();
    let deadline = Instant::now() + SLACK * 2;
    while set.master().cli(&["EXISTS", &name]) != "0" {
        assert!(Instant::now() < deadline, "the landed acquisition was left");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// In a Cluster, `WAIT` goes to the shard of the lock's key: a frozen
/// replica of another shard changes nothing, the shard's own replica
/// decides.
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_the_lock_keys_own_shard_acknowledges() {
    let cluster = test_support::redis::RedisCluster::start_with_replicas(3, 1);
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let client = RedisProvider::connect_cluster(&nodes, acked(1))
        .await
        .unwrap();
    let name = unique_name("shard");
    let key = client.lock_key(&name).unwrap();
    let (_, own) = cluster.shard_of(&key);
    assert_eq!(own.len(), 1, "one replica per shard");
    let other = (0..urls.len())
        .find(|i| !own.contains(i) && cluster.node(*i).cli(&["ROLE"]).starts_with("slave"))
        .expect("a replica of another shard");
    let lock = client.mutex(&name).unwrap();
    lock.try_lock()
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
    cluster.node(other).pause();
    let guard = lock.try_lock().await.unwrap().expect("free");
    // KEYS: a replica answers it (it would redirect EXISTS to its master).
    assert_eq!(cluster.node(own[0]).cli(&["KEYS", &key]), key);
    guard.release().await.unwrap();
    cluster.node(other).resume();
    cluster.node(own[0]).pause();
    match lock.try_lock().await {
        Err(Error::NotReplicated { acked: 0, .. }) => {}
        other => panic!("{other:?}"),
    }
    cluster.node(own[0]).resume();
    let guard = lock.try_lock().await.unwrap().expect("undone, so free");
    guard.release().await.unwrap();
}
