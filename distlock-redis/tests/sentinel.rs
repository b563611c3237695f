//! Redis Sentinel on real processes (`test_support::SentinelGroup`): the
//! conformance suite through a `redis+sentinel://` URL, failover following
//! (commands, pub/sub waiting, held leases), a demoted master answering
//! `READONLY`, and bad input.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use distlock_core::{Error, LeaseOptions, Lock, LostReason, Provider};
use distlock_redis::{RedisOptions, RedisProvider, SentinelAuth};
use futures::future::BoxFuture;
use test_support::conformance::Fixture;
use test_support::primitives::Kind;
use test_support::{unique_name, SentinelGroup};

/// How long a failover may take here: down-after (3 s), the vote, the
/// promotion, with generous slack for a loaded 2-core machine.
const FAILOVER: Duration = Duration::from_secs(30);
/// How long Sentinel may take to turn a restarted old master into a
/// replica: it waits until the instance has been up 8 s (4 × its 2 s
/// publish period) and the new master looks sane. Under load on 2 cores
/// this took over 30 s twice. A wait for the environment, not a promise of
/// ours.
const DEMOTION: Duration = Duration::from_secs(60);

/// One group for the tests that do not break it.
fn shared() -> &'static SentinelGroup {
    static GROUP: OnceLock<SentinelGroup> = OnceLock::new();
    GROUP.get_or_init(|| SentinelGroup::start(1))
}

struct Sentinel {
    kind: Kind,
}

impl Fixture for Sentinel {
    fn client(&self) -> BoxFuture<'_, Arc<dyn Provider>> {
        Box::pin(async move {
            distlock_redis::connect(&shared().url())
                .await
                .expect("connect through Sentinel")
        })
    }

    fn lock(
        &self,
        client: &dyn Provider,
        name: &str,
        lease: LeaseOptions,
    ) -> distlock_core::Result<Arc<dyn Lock>> {
        self.kind.open(client, name, lease)
    }
}

mod mutex {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(super::Sentinel { kind: Kind::Mutex });
}

mod fair {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(fair super::Sentinel { kind: Kind::FairMutex });
}

mod rw_lock {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(rw super::Sentinel { kind: Kind::RwWrite });
}

mod semaphore {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(semaphore super::Sentinel { kind: Kind::Semaphore1 });
}

mod election {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(election super::Sentinel { kind: Kind::Mutex });
}

mod revocation {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(revocation super::Sentinel { kind: Kind::Mutex });
}

fn lease(ttl_ms: u64) -> LeaseOptions {
    LeaseOptions::new(Duration::from_millis(ttl_ms)).unwrap()
}

/// Waits (polling `redis-cli`, test side only) until `check` holds.
async fn eventually(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let until = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < until, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The test topology itself: holding replication back, killing the master
/// and resuming the replica promotes a replica without the last write; the
/// old master comes back empty and Sentinel demotes it.
#[test]
fn group_fails_over_without_the_held_back_write() {
    let mut group = SentinelGroup::start(1);
    let master = group.master_index();
    let replica = group.replica_index(0);
    assert_eq!(group.master().cli(&["SET", "before", "1"]), "OK");
    group.wait_replicas_in_sync();
    group.hold_back_replication(replica);
    assert_eq!(group.master().cli(&["SET", "after", "1"]), "OK");
    let old = group.server(master).port();
    group.server_mut(master).kill();
    group.resume(replica);
    let new = group.wait_for_failover(old, FAILOVER);
    assert_eq!(new, group.server(replica).port());
    assert_eq!(group.master_index(), replica);
    assert_eq!(group.server(replica).cli(&["GET", "before"]), "1");
    assert_eq!(group.server(replica).cli(&["GET", "after"]), "");
    group.server_mut(master).restart();
    group.wait_role(master, "slave", DEMOTION);
}

/// The URL and the code path reach the same master; the lock key is on the
/// master the Sentinels name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_and_code_connect_to_the_named_master() {
    let group = shared();
    let name = unique_name("code");
    let addrs = group.sentinel_addrs();
    let addrs: Vec<&str> = addrs.iter().map(String::as_str).collect();
    let by_code = RedisProvider::connect_sentinel(&addrs, group.master_name(), RedisOptions::new())
        .await
        .unwrap();
    let by_url = RedisProvider::connect(&format!("{}?prefix=app:", group.url()))
        .await
        .unwrap();
    assert_eq!(
        by_url.options().clone(),
        RedisOptions::new().key_prefix("app:")
    );
    let g = by_code.mutex(&name).unwrap().lock().await.unwrap();
    let key = by_code.lock_key(&name).unwrap();
    assert_eq!(group.master().cli(&["EXISTS", &key]), "1");
    assert!(by_code
        .mutex(&name)
        .unwrap()
        .try_lock()
        .await
        .unwrap()
        .is_none());
    let other = by_url.mutex(&name).unwrap();
    assert!(
        other.try_lock().await.unwrap().is_some(),
        "prefix app: is another key"
    );
    g.release().await.unwrap();
    // Credentials the servers do not ask for are refused by them: the
    // password really is sent to the Sentinels.
    let e = RedisProvider::connect_sentinel_with(
        &addrs,
        group.master_name(),
        SentinelAuth::new().sentinels(None, "nope"),
        RedisOptions::new().connect_timeout(Duration::from_secs(2)),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, Error::Connection { .. }), "{e:?}");
}

/// Bad sentinel URLs and options: typed errors, no connection attempt.
#[tokio::test]
async fn bad_input_is_refused() {
    for url in [
        "redis+sentinel://127.0.0.1:1",
        "redis+sentinel://127.0.0.1:1/",
        "redis+sentinel:///mymaster",
        "redis+sentinel://127.0.0.1:99999/mymaster",
        "redis+sentinel://127.0.0.1:x/mymaster",
        "redis+sentinel://127.0.0.1:1/mymaster?nope=1",
        "redis+sentinel://127.0.0.1:1/mymaster?db=2&db=3",
    ] {
        let started = Instant::now();
        let e = distlock_redis::connect(url).await.map(|_| ()).unwrap_err();
        assert!(matches!(e, Error::InvalidUrl(_)), "{url}: {e:?}");
        assert!(started.elapsed() < Duration::from_secs(1), "{url}");
    }
    for url in [
        "redis+sentinel://127.0.0.1:1/mymaster?pool_size=2",
        "redis+sentinel://127.0.0.1:1/mymaster?prefix=a%20b{",
    ] {
        let e = distlock_redis::connect(url).await.map(|_| ()).unwrap_err();
        assert!(matches!(e, Error::InvalidOptions(_)), "{url}: {e:?}");
    }
    let e = RedisProvider::connect_sentinel(&[], "m", RedisOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidUrl(_)), "{e:?}");
    let e = RedisProvider::connect_sentinel(&["127.0.0.1:1"], "", RedisOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidUrl(_)), "{e:?}");
}

/// No Sentinel reachable at connect: refused ports fail at once with a
/// connection error; Sentinels that accept but never answer fail within
/// the connect timeout; an unknown master name is a connection error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_sentinel_no_master_typed_error_within_the_connect_timeout() {
    let refused: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", test_support::free_port()))
        .collect();
    let url = format!(
        "redis+sentinel://{}/mymaster?connect_timeout_ms=1000",
        refused.join(",")
    );
    let started = Instant::now();
    let e = distlock_redis::connect(&url).await.map(|_| ()).unwrap_err();
    assert!(matches!(e, Error::Connection { .. }), "{e:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );

    // Listening sockets that never answer (the kernel accepts, nobody reads).
    let silent: Vec<std::net::TcpListener> = (0..3)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let addrs: Vec<String> = silent
        .iter()
        .map(|l| l.local_addr().unwrap().to_string())
        .collect();
    let url = format!(
        "redis+sentinel://{}/mymaster?connect_timeout_ms=700",
        addrs.join(",")
    );
    let started = Instant::now();
    let e = distlock_redis::connect(&url).await.map(|_| ()).unwrap_err();
    assert!(e.is_retryable() && !e.is_invalid_input(), "{e:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );

    let group = shared();
    let url = format!(
        "redis+sentinel://{}/no-such-master?connect_timeout_ms=2000",
        group.sentinel_addrs().join(",")
    );
    let e = distlock_redis::connect(&url).await.map(|_| ()).unwrap_err();
    assert!(matches!(e, Error::Connection { .. }), "{e:?}");
}

/// The whole failover, followed by one provider:
///
/// * lease `a` was replicated before the master died: its watchdog keeps
///   renewing it on the promoted replica, past its TTL;
/// * lease `b` was taken while replication was held back: the promoted
///   replica never had it, so its watchdog reports it lost (`Taken`: the
///   renewal found nobody holds it), never believing it still holds;
/// * a waiter of `a` on another provider, blocked across the failover, gets
///   `a` once its holder releases it on the new master, woken by the
///   release message on the new master's pub/sub (its re-check interval is
///   far longer than the test);
/// * new locks work on the new master;
/// * the old master comes back empty, Sentinel demotes it, and nothing is
///   sent to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_is_followed_by_commands_leases_and_waiters() {
    let mut group = SentinelGroup::start(1);
    let options = || {
        RedisOptions::new()
            .response_timeout(Duration::from_millis(500))
            .connect_timeout(Duration::from_secs(1))
    };
    let holder = RedisProvider::connect_with(&group.url(), options())
        .await
        .unwrap();
    let waiting = RedisProvider::connect_with(
        &group.url(),
        options().recheck_interval(Duration::from_secs(600)),
    )
    .await
    .unwrap();
    let base = unique_name("failover");
    let (a, b) = (format!("{base}/a"), format!("{base}/b"));
    // 20 s: the waiter's own re-check at the holder's expiry stays out of
    // the way; renewed every ~6.7 s.
    let ga = holder
        .with_lease(lease(20_000))
        .unwrap()
        .mutex(&a)
        .unwrap()
        .lock()
        .await
        .unwrap();
    let wait_a = waiting.mutex(&a).unwrap();
    let waiter = tokio::spawn(async move { wait_a.lock_timeout(Duration::from_secs(120)).await });
    // The waiter is subscribed and waiting.
    let channel_seen = || {
        group
            .master()
            .cli(&["PUBSUB", "NUMSUB", &format!("{{{a}}}:released")])
            .lines()
            .nth(1)
            == Some("1")
    };
    eventually(
        "the waiter subscribes",
        Duration::from_secs(10),
        channel_seen,
    )
    .await;
    group.wait_replicas_in_sync();

    let master = group.master_index();
    let replica = group.replica_index(0);
    let old_port = group.server(master).port();
    group.hold_back_replication(replica);
    let gb = holder
        .with_lease(lease(3_000))
        .unwrap()
        .mutex(&b)
        .unwrap()
        .lock()
        .await;
    group.server_mut(master).kill();
    group.resume(replica);
    let gb = gb.unwrap();
    let killed_at = Instant::now();
    let new_port = group.wait_for_failover(old_port, FAILOVER);
    assert_eq!(new_port, group.server(replica).port());
    let new_master = group.server(replica);

    // b was never replicated: lost, and not by its local deadline alone.
    let reason = tokio::time::timeout(FAILOVER, gb.lost()).await.unwrap();
    assert!(
        matches!(reason, LostReason::Taken | LostReason::Expired),
        "{reason:?}"
    );
    assert!(!gb.is_held());
    drop(gb);

    // New locks work on the new master.
    let c = format!("{base}/c");
    let gc = tokio::time::timeout(FAILOVER, holder.mutex(&c).unwrap().lock())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        new_master.cli(&["EXISTS", &holder.lock_key(&c).unwrap()]),
        "1"
    );
    gc.release().await.unwrap();

    // a is renewed on the new master: still there past its TTL counted from
    // the moment the old master died.
    let key_a = holder.lock_key(&a).unwrap();
    while killed_at.elapsed() < Duration::from_secs(21) {
        assert!(ga.is_held(), "lease a lost: {:?}", ga.status());
        assert_eq!(new_master.cli(&["EXISTS", &key_a]), "1");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(ga.is_held());
    assert!(!waiter.is_finished(), "the waiter got a lock that is held");

    // The waiter's subscriber follows the master too.
    eventually(
        "the waiter resubscribes on the new master",
        FAILOVER,
        || {
            new_master
                .cli(&["PUBSUB", "NUMSUB", &format!("{{{a}}}:released")])
                .lines()
                .nth(1)
                == Some("1")
        },
    )
    .await;
    assert!(waiting.subscriber_connections() >= 2);
    let wakeups = waiting.wakeups();
    let token_a = ga.fencing_token();
    ga.release().await.unwrap();
    let gw = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was not woken by the release on the new master")
        .unwrap()
        .unwrap()
        .expect("the waiter got the lock");
    assert!(waiting.wakeups() > wakeups, "not woken by pub/sub");
    assert!(gw.fencing_token() > token_a);

    // The old master comes back empty and is demoted; every command still
    // goes to the new master.
    group.server_mut(master).restart();
    group.wait_role(master, "slave", DEMOTION);
    for i in 0..20 {
        let name = format!("{base}/after/{i}");
        let g = holder.mutex(&name).unwrap().lock().await.unwrap();
        assert_eq!(
            group
                .server(replica)
                .cli(&["EXISTS", &holder.lock_key(&name).unwrap()]),
            "1"
        );
        g.release().await.unwrap();
    }
    gw.release().await.unwrap();
}

/// A master turned into a replica behind the client's back (the Sentinels
/// frozen meanwhile, so nothing kills its connections): the next command
/// is answered `READONLY`, reported as a connection error (retryable), the
/// connection is dropped, and once the Sentinels name the new master the
/// lock is taken there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readonly_from_a_demoted_master_moves_on() {
    let group = SentinelGroup::start(1);
    let client = RedisProvider::connect_with(
        &group.url(),
        RedisOptions::new()
            .response_timeout(Duration::from_millis(500))
            .connect_timeout(Duration::from_secs(1)),
    )
    .await
    .unwrap();
    let name = unique_name("readonly");
    let lock = client.mutex(&name).unwrap();
    lock.try_lock()
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();

    let master = group.master_index();
    let replica = group.replica_index(0);
    for i in 0..3 {
        group.sentinel(i).pause();
    }
    let replica_port = group.server(replica).port().to_string();
    assert_eq!(group.server(replica).cli(&["REPLICAOF", "NO", "ONE"]), "OK");
    assert_eq!(
        group
            .server(master)
            .cli(&["REPLICAOF", "127.0.0.1", &replica_port]),
        "OK"
    );
    group.wait_role(master, "slave", Duration::from_secs(10));

    let e = lock.try_lock().await.map(|_| ()).unwrap_err();
    assert!(matches!(e, Error::Connection { .. }), "{e:?}");
    assert!(format!("{e:?}").contains("read only replica"), "{e:?}");

    for i in 0..3 {
        group.sentinel(i).resume();
    }
    let g = tokio::time::timeout(FAILOVER + FAILOVER, lock.lock_timeout(FAILOVER + FAILOVER))
        .await
        .unwrap()
        .unwrap()
        .expect("locked on the new master");
    assert_eq!(
        group
            .server(replica)
            .cli(&["EXISTS", &client.lock_key(&name).unwrap()]),
        "1"
    );
    assert_eq!(group.master_index(), replica);
    g.release().await.unwrap();
}

/// A frozen master (SIGSTOP), which keeps its connections open and never
/// answers: commands time out, the Sentinels promote the replica, and the
/// provider moves there, with the lease it holds (renewed on the new
/// master), its waiter's pub/sub (woken by the release there) and new
/// locks, while the old master stays frozen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_master_is_left_for_the_promoted_replica() {
    let group = SentinelGroup::start(1);
    let options = || {
        RedisOptions::new()
            .response_timeout(Duration::from_millis(500))
            .connect_timeout(Duration::from_secs(1))
    };
    let holder = RedisProvider::connect_with(&group.url(), options())
        .await
        .unwrap();
    let waiting = RedisProvider::connect_with(
        &group.url(),
        options().recheck_interval(Duration::from_secs(600)),
    )
    .await
    .unwrap();
    let a = unique_name("frozen");
    // Renewed every 4 s; the waiter re-checks at the holder's expiry.
    let ga = holder
        .with_lease(lease(12_000))
        .unwrap()
        .mutex(&a)
        .unwrap()
        .lock()
        .await
        .unwrap();
    let wait_a = waiting.mutex(&a).unwrap();
    let waiter = tokio::spawn(async move { wait_a.lock_timeout(Duration::from_secs(120)).await });
    let channel = format!("{{{a}}}:released");
    let subscribed = |server: &test_support::RedisServer| {
        server.cli(&["PUBSUB", "NUMSUB", &channel]).lines().nth(1) == Some("1")
    };
    eventually("the waiter subscribes", Duration::from_secs(10), || {
        subscribed(group.master())
    })
    .await;
    group.wait_replicas_in_sync();

    let master = group.master_index();
    let replica = group.replica_index(0);
    let old_port = group.server(master).port();
    group.pause(master);
    let frozen_at = Instant::now();
    let new_port = group.wait_for_failover(old_port, FAILOVER);
    assert_eq!(new_port, group.server(replica).port());
    let new_master = group.server(replica);

    let b = format!("{a}/b");
    let gb = tokio::time::timeout(FAILOVER, holder.mutex(&b).unwrap().lock())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        new_master.cli(&["EXISTS", &holder.lock_key(&b).unwrap()]),
        "1"
    );
    gb.release().await.unwrap();

    // The lease is renewed on the new master past its TTL.
    while frozen_at.elapsed() < Duration::from_secs(14) {
        assert!(ga.is_held(), "lease lost: {:?}", ga.status());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        new_master.cli(&["EXISTS", &holder.lock_key(&a).unwrap()]),
        "1"
    );
    assert!(!waiter.is_finished());
    eventually(
        "the waiter resubscribes on the new master",
        FAILOVER,
        || subscribed(new_master),
    )
    .await;
    let wakeups = waiting.wakeups();
    ga.release().await.unwrap();
    let gw = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was not woken by the release on the new master")
        .unwrap()
        .unwrap()
        .expect("the waiter got the lock");
    assert!(waiting.wakeups() > wakeups, "not woken by pub/sub");
    gw.release().await.unwrap();
    group.resume(master);
}
