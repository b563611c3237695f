//! The unhappy interleavings on real redis-server processes: an acquire that
//! lands but whose reply is lost, then a partition longer than the response
//! timeout; many acquisitions cancelled at random on pools; `close()` with
//! guards still held.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_core::{LeaseOptions, LeaseStatus, LostReason, Provider};
use distlock_redis::{RedisOptions, RedisProvider};
use test_support::{unique_name, Proxy};

const SLACK: Duration = Duration::from_secs(3);

async fn connect(url: &str, options: RedisOptions) -> RedisProvider {
    RedisProvider::connect_with(url, options).await.unwrap()
}

/// The lease the victims ask for: long, so a key left behind is noticed.
fn long() -> LeaseOptions {
    LeaseOptions::new(Duration::from_secs(30)).unwrap()
}

/// The victim's acquire script runs on the server but its reply is lost;
/// the connection is cut and blackholed for longer than the response
/// timeout. The key the script set must not stay for the lease's 30 s:
/// the undo, sent on the attempt's connection, is retried until it lands.
async fn lost_acquire_reply_then_partition(pool: Option<usize>) {
    let redis = test_support::redis::shared();
    let proxy = Proxy::start(redis.addr());
    let name = unique_name("lost-reply");
    let mut options = RedisOptions::new().response_timeout(Duration::from_millis(300));
    if let Some(size) = pool {
        options = options.pool_size(size);
    }
    let victim = connect(&format!("redis://{}", proxy.addr()), options).await;
    let other = connect(&redis.url(), RedisOptions::new()).await;
    let key = victim.lock_key(&name).unwrap();
    let lock = victim.with_lease(long()).unwrap().mutex(&name).unwrap();
    // Load the scripts first: the EVALSHA below must run, not meet NOSCRIPT.
    let warm = victim
        .mutex(&unique_name("warm-up"))
        .unwrap()
        .lock()
        .await
        .unwrap();
    warm.release().await.unwrap();
    // The acquire script's EVALSHA, not a pool's health-check PING.
    proxy.lose_reply_to(b"EVALSHA");
    let attempt = tokio::spawn(async move { lock.lock_timeout(Duration::from_secs(2)).await });
    // The script landed: the key is set, with the victim's token.
    let deadline = Instant::now() + SLACK;
    while redis.cli(&["EXISTS", &key]) != "1" {
        assert!(Instant::now() < deadline, "the acquire never landed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The server ran the script before its reply reached the proxy: the
    // swallowed bytes are counted a moment after the key shows (two full
    // runs under load read 0 here, asserted at once).
    assert!(proxy.swallowed_some(SLACK).await, "no reply was lost");
    proxy.cut();
    proxy.set_blackhole(true);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    proxy.heal();
    let got = tokio::time::timeout(SLACK * 2, attempt)
        .await
        .expect("the acquisition outlived its timeout")
        .unwrap();
    match got {
        Ok(Some(guard)) => guard.release().await.unwrap(),
        Ok(None) => {}
        Err(e) => assert!(e.is_retryable(), "untyped failure: {e:?}"),
    }
    let g = other
        .with_lease(long())
        .unwrap()
        .mutex(&name)
        .unwrap()
        .lock_timeout(SLACK * 2)
        .await
        .unwrap()
        .expect("the lost acquisition's key was left for its whole TTL");
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_acquire_reply_then_partition_leaves_nothing() {
    lost_acquire_reply_then_partition(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_acquire_reply_then_partition_leaves_nothing_on_a_pool() {
    lost_acquire_reply_then_partition(Some(4)).await;
}

/// Hundreds of acquisitions on pools, cancelled at random points while the
/// proxy delays traffic (so cancellations land while requests are in
/// flight): none may leave the key set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_cancelled_acquisitions_on_a_pool_leave_nothing() {
    let redis = test_support::redis::shared();
    let proxy = Proxy::start(redis.addr());
    proxy.set_delay(Duration::from_micros(700));
    let mut rng = fastrand::Rng::with_seed(11);
    for size in [1, 4, 16] {
        let name = unique_name("pool-cancel");
        let locks = connect(
            &format!("redis://{}", proxy.addr()),
            RedisOptions::new().pool_size(size),
        )
        .await;
        let key = locks.lock_key(&name).unwrap();
        let lock = locks.with_lease(long()).unwrap().mutex(&name).unwrap();
        let mut tasks = Vec::new();
        for _ in 0..200 {
            let lock = Arc::clone(&lock);
            let cut = Duration::from_micros(rng.u64(0..4000));
            tasks.push(tokio::spawn(async move {
                if let Ok(Ok(g)) = tokio::time::timeout(cut, lock.lock()).await {
                    drop(g);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let deadline = Instant::now() + SLACK;
        while redis.cli(&["EXISTS", &key]) != "0" {
            assert!(
                Instant::now() < deadline,
                "pool of {size}: a cancelled acquisition left the key set"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Closing a provider that holds leases: lost() fires first, then the keys
/// are deleted, so nobody else gets in while a holder still believes it
/// holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_fires_lost_before_the_key_goes() {
    let redis = test_support::redis::shared();
    let locks = connect(&redis.url(), RedisOptions::new()).await;
    let other = connect(&redis.url(), RedisOptions::new()).await;
    let name = unique_name("close");
    let guard = locks
        .with_lease(long())
        .unwrap()
        .mutex(&name)
        .unwrap()
        .lock()
        .await
        .unwrap();
    let watch = guard.watch();
    let waiting = other.with_lease(long()).unwrap().mutex(&name).unwrap();
    let waiter = tokio::spawn(async move {
        let g = waiting.lock().await.unwrap();
        (watch.status(), g)
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    locks.close().await.unwrap();
    let (status_then, g) = tokio::time::timeout(SLACK, waiter).await.unwrap().unwrap();
    assert_eq!(
        status_then,
        distlock_core::LeaseStatus::Lost(LostReason::ProviderClosed)
    );
    g.release().await.unwrap();
}

/// `close()` closes the connections (commands and pub/sub) even while the
/// application still has the provider, a lock and a guard around.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_closes_the_connections_with_handles_left() {
    let redis = test_support::redis::shared();
    let proxy = Proxy::start(redis.addr());
    let locks = connect(&format!("redis://{}", proxy.addr()), RedisOptions::new()).await;
    let other = connect(&redis.url(), RedisOptions::new()).await;
    let name = unique_name("close-conns");
    let held = other.mutex(&name).unwrap().lock().await.unwrap();
    let lock = locks.mutex(&name).unwrap();
    // A wait opens the pub/sub connection too.
    assert!(lock
        .lock_timeout(Duration::from_millis(200))
        .await
        .unwrap()
        .is_none());
    let guard = locks
        .mutex(&unique_name("close-held"))
        .unwrap()
        .lock()
        .await
        .unwrap();
    assert!(proxy.open_connections() >= 2);
    locks.close().await.unwrap();
    proxy.wait_closed(SLACK, "after close()").await;
    assert!(!guard.is_held());
    drop((lock, guard));
    held.release().await.unwrap();
}

/// Dropping every handle (provider, locks, guards) closes the connections
/// in the background.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_last_handle_closes_the_connections() {
    let redis = test_support::redis::shared();
    let proxy = Proxy::start(redis.addr());
    for pool in [None, Some(2)] {
        let mut options = RedisOptions::new();
        if let Some(size) = pool {
            options = options.pool_size(size);
        }
        let locks = connect(&format!("redis://{}", proxy.addr()), options).await;
        let lock = locks.mutex(&unique_name("drop-conns")).unwrap();
        let guard = lock.lock().await.unwrap();
        assert!(proxy.open_connections() >= 1);
        drop(locks);
        drop(lock);
        drop(guard);
        proxy.wait_closed(SLACK, "after the last handle went").await;
    }
}

/// `close()` ends every waiting acquisition with `Closed` at once, wherever
/// it is: waiting on its subscription (woken by the subscriber on its way
/// out, not by a close signal of its own), in the middle of an attempt, or
/// subscribing just as the subscriber goes. The re-check interval is
/// 30 s, so a waiter the close missed would outlive the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_ends_every_waiter_wherever_it_is() {
    let redis = test_support::redis::shared();
    let holder = connect(&redis.url(), RedisOptions::new()).await;
    let mut rng = fastrand::Rng::new();
    for round in 0..12 {
        let name = unique_name("close-race");
        let fair_name = unique_name("close-race-fair");
        let _held = holder
            .with_lease(long())
            .unwrap()
            .mutex(&name)
            .unwrap()
            .lock()
            .await;
        let _held_fair = holder
            .with_lease(long())
            .unwrap()
            .fair_mutex(&fair_name)
            .unwrap()
            .lock()
            .await;
        let options = RedisOptions::new().recheck_interval(Duration::from_secs(30));
        let closing = Arc::new(connect(&redis.url(), options).await);
        let mut waiters = Vec::new();
        for i in 0..8 {
            let lock = if i % 2 == 0 {
                closing.with_lease(long()).unwrap().mutex(&name).unwrap()
            } else {
                closing
                    .with_lease(long())
                    .unwrap()
                    .fair_mutex(&fair_name)
                    .unwrap()
            };
            waiters.push(tokio::spawn(async move { lock.lock().await }));
        }
        // From "none has started" to "all wait on their subscriptions".
        let pause = match round {
            0 => 0,
            1 => 200_000,
            _ => rng.u64(0..5_000),
        };
        tokio::time::sleep(Duration::from_micros(pause)).await;
        closing.close().await.unwrap();
        let closed_at = Instant::now();
        for (i, waiter) in waiters.into_iter().enumerate() {
            let r = tokio::time::timeout(SLACK, waiter)
                .await
                .unwrap_or_else(|_| panic!("round {round}: waiter {i} outlived close()"))
                .unwrap();
            assert!(
                matches!(r, Err(distlock_core::Error::Closed)),
                "round {round}: waiter {i}: {r:?}"
            );
        }
        assert!(closed_at.elapsed() < SLACK, "round {round}");
    }
}

/// A stopped server (SIGSTOP) under a 3 s lease, as `distlock exec --ttl 3`
/// takes: the renewal sent at 1 s never answers. The lease shows
/// `Suspended` while that renewal waits and `Lost(Expired)` at the deadline
/// (before: Held straight to Lost, since the 2 s response timeout ends the
/// renewal after the deadline), and the late `release()` answers `NotHeld`
/// at once, as on ZooKeeper (before: it waited out the response timeout and
/// returned a retryable `Timeout`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_suspends_then_loses_and_release_says_not_held() {
    let redis = test_support::redis::RedisServer::start();
    let locks = connect(&redis.url(), RedisOptions::new()).await;
    let name = unique_name("stopped");
    let lease = LeaseOptions::new(Duration::from_secs(3)).unwrap();
    let guard = locks
        .with_lease(lease)
        .unwrap()
        .mutex(&name)
        .unwrap()
        .lock()
        .await
        .unwrap();
    let mut watch = guard.watch();
    let seen = tokio::spawn(async move {
        let mut seen = vec![watch.status()];
        while watch.changed().await {
            seen.push(watch.status());
        }
        seen.push(watch.status());
        seen
    });
    redis.pause();
    let reason = tokio::time::timeout(Duration::from_secs(3) + SLACK, guard.lost()).await;
    let released = tokio::time::timeout(SLACK, guard.release()).await;
    redis.resume();
    assert_eq!(reason.expect("lost() never fired"), LostReason::Expired);
    let seen = seen.await.unwrap();
    let suspended = seen.iter().position(|s| *s == LeaseStatus::Suspended);
    let lost = seen.iter().position(|s| matches!(s, LeaseStatus::Lost(_)));
    assert!(
        suspended.is_some() && suspended < lost,
        "no Suspended before Lost: {seen:?}"
    );
    let released = released.expect("release() of a lost lease waited on the stopped server");
    assert!(
        matches!(released, Err(distlock_core::Error::NotHeld { .. })),
        "release() of a lost lease gave {released:?}"
    );
}

/// A request to release made while the holder is cut off (a partition
/// shorter than the lease: its bytes are held back, TCP delivers them
/// late and in order) is kept by the server and heard at the holder's
/// first renewal after the partition; the request ended nothing meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_made_while_the_holder_is_partitioned_is_heard_after() {
    let redis = test_support::redis::shared();
    let proxy = Proxy::start(redis.addr());
    let options = RedisOptions::new().response_timeout(Duration::from_millis(300));
    let holder = connect(&format!("redis://{}", proxy.addr()), options).await;
    let operator = connect(&redis.url(), RedisOptions::new()).await;
    let name = unique_name("asked-partitioned");
    // Renewed every 2 s; a partition of 2.5 s makes the first renewal time
    // out (300 ms response timeout) and leaves the lease held.
    let lease = LeaseOptions::new(Duration::from_secs(6)).unwrap();
    let guard = holder
        .with_lease(lease)
        .unwrap()
        .mutex(&name)
        .unwrap()
        .lock()
        .await
        .unwrap();
    proxy.set_delay(Duration::from_millis(1500));
    let asked = operator
        .request_release(&name, distlock_core::PrimitiveKind::Mutex)
        .await
        .unwrap();
    assert_eq!(asked.len(), 1, "{asked:?}");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // A renewal timed out meanwhile, and nothing reached the holder.
    assert_eq!(guard.status(), LeaseStatus::Suspended);
    assert!(!guard.is_release_requested());
    proxy.set_delay(Duration::ZERO);
    if tokio::time::timeout(Duration::from_secs(2) + SLACK, guard.release_requested())
        .await
        .is_err()
    {
        panic!(
            "the request was not heard after the partition; the lease is {:?}",
            guard.status()
        );
    }
    assert!(guard.is_held(), "{:?}", guard.status());
    guard.release().await.unwrap();
}

/// The operator's request lands but its reply is lost: the call fails with
/// a retryable error, the holder hears the request all the same, and asking
/// again (what a caller does with a retryable error) is harmless.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_reply_is_lost_still_reaches_the_holder() {
    let redis = test_support::redis::shared();
    let proxy = Proxy::start(redis.addr());
    let operator = connect(
        &format!("redis://{}", proxy.addr()),
        RedisOptions::new().response_timeout(Duration::from_millis(300)),
    )
    .await;
    let holder = connect(&redis.url(), RedisOptions::new()).await;
    let name = unique_name("asked-lost-reply");
    let lease = LeaseOptions::new(Duration::from_secs(3)).unwrap();
    let guard = holder
        .with_lease(lease)
        .unwrap()
        .rw_lock(&name)
        .unwrap()
        .write()
        .lock()
        .await
        .unwrap();
    // Load the script first, so the request below is one EVALSHA.
    let other = unique_name("asked-warm-up");
    assert!(operator
        .request_release(&other, distlock_core::PrimitiveKind::ReadWrite)
        .await
        .unwrap()
        .is_empty());
    proxy.lose_reply_to(b"EVALSHA");
    let e = operator
        .request_release(&name, distlock_core::PrimitiveKind::ReadWrite)
        .await
        .unwrap_err();
    assert!(e.is_retryable(), "{e:?}");
    assert!(proxy.swallowed_some(SLACK).await, "no reply was lost");
    tokio::time::timeout(Duration::from_secs(1) + SLACK, guard.release_requested())
        .await
        .expect("the request that landed was not heard");
    proxy.cut();
    proxy.heal();
    let asked = operator
        .request_release(&name, distlock_core::PrimitiveKind::ReadWrite)
        .await
        .unwrap();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert!(guard.is_held());
    guard.release().await.unwrap();
}

/// A provider whose connections all go through a new proxy (response
/// timeout 300 ms), holding the mutex of a fresh name under `lease`: the
/// proxy, the provider, the name and the guard.
async fn held_through_proxy(
    prefix: &str,
    lease: LeaseOptions,
) -> (Proxy, RedisProvider, String, distlock_core::LockGuard) {
    let proxy = Proxy::start(test_support::redis::shared().addr());
    let name = unique_name(prefix);
    let locks = connect(
        &format!("redis://{}", proxy.addr()),
        RedisOptions::new().response_timeout(Duration::from_millis(300)),
    )
    .await;
    let guard = locks
        .with_lease(lease)
        .unwrap()
        .mutex(&name)
        .unwrap()
        .lock()
        .await
        .unwrap();
    (proxy, locks, name, guard)
}

/// The held lease's command connection stays open but goes silent for good
/// (a half-open socket: nothing it sends reaches the server, nothing comes
/// back), while new connections work. The watchdog's renewal times out
/// there, moves to a fresh connection and renews: the lease outlives the
/// silence by far more than its TTL and is released as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_whose_connection_goes_silent_renews_on_a_fresh_one() {
    let redis = test_support::redis::shared();
    let ttl = Duration::from_secs(3);
    let (proxy, locks, name, guard) =
        held_through_proxy("silent-holder", LeaseOptions::new(ttl).unwrap()).await;
    let key = locks.lock_key(&name).unwrap();
    let value = redis.cli(&["GET", &key]);
    let before = proxy.accepted_connections();
    assert_eq!(proxy.silence_connections_that_sent(b"EVALSHA"), 1);
    // Three TTLs of silence on the lease's own connection.
    let mut lost = std::pin::pin!(guard.lost());
    assert!(
        tokio::time::timeout(ttl * 3, &mut lost).await.is_err(),
        "the lease was lost to a silent connection: {:?}",
        guard.status()
    );
    assert!(guard.is_held(), "{:?}", guard.status());
    assert_eq!(redis.cli(&["GET", &key]), value, "the hold is still ours");
    assert!(
        redis.cli(&["PTTL", &key]).parse::<i64>().unwrap() > 0,
        "the server's TTL runs"
    );
    assert!(
        proxy.accepted_connections() > before,
        "the renewals moved to a new connection"
    );
    guard.release().await.unwrap();
    assert_eq!(redis.cli(&["EXISTS", &key]), "0");
}

/// Manual mode: an `extend` that times out on a silent connection may
/// still land later there (the socket stays open), so a longer extension
/// sent on a fresh connection could be cut short by it behind the guard's
/// back. After such a timeout the lease moves to a fresh connection, an
/// extension no longer than the unanswered one works, and a longer one is
/// refused with a typed error that changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_extend_that_timed_out_bounds_the_next_ones() {
    let redis = test_support::redis::shared();
    let (proxy, locks, name, guard) = held_through_proxy(
        "silent-extend",
        LeaseOptions::manual(Duration::from_secs(10)).unwrap(),
    )
    .await;
    let key = locks.lock_key(&name).unwrap();
    assert_eq!(proxy.silence_connections_that_sent(b"EVALSHA"), 1);
    let unanswered = guard.extend(Duration::from_secs(10)).await.unwrap_err();
    assert!(unanswered.is_retryable(), "{unanswered:?}");
    let longer = guard.extend(Duration::from_secs(15)).await.unwrap_err();
    assert!(
        matches!(longer, distlock_core::Error::InvalidOptions(_)),
        "{longer:?}"
    );
    let left: i64 = redis.cli(&["PTTL", &key]).parse().unwrap();
    assert!(left > 0 && left <= 10_000, "untouched: {left} ms");
    guard.extend(Duration::from_secs(10)).await.unwrap();
    let left: i64 = redis.cli(&["PTTL", &key]).parse().unwrap();
    assert!(left > 0 && left <= 10_000, "extended to 10 s: {left} ms");
    guard.release().await.unwrap();
    assert_eq!(redis.cli(&["EXISTS", &key]), "0");
}

/// A lock held by `guard` (through the proxy) that `other` (direct) can
/// take: both at once is two holders.
async fn two_holders(guard: &distlock_core::LockGuard, other: &RedisProvider, name: &str) -> bool {
    let g = other.mutex(name).unwrap().try_lock().await.unwrap();
    let both = g.is_some() && guard.is_held();
    if let Some(g) = g {
        g.release().await.unwrap();
    }
    both
}

/// Manual mode. A shorter extension X is held up (proxy delay) and times
/// out; then full-length ones time out behind it. X then reaches the
/// server alone (a prefix of what the socket carried) and the connection
/// is reset before the rest arrives. Were the lease to move to a fresh
/// connection on the full-length timeout and renew there, X's landing would
/// cut the server's TTL short behind the guard's deadline: the guard must
/// never read held while another client can take the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shorter_extension_landing_alone_later_never_makes_two_holders() {
    let redis = test_support::redis::shared();
    let (proxy, _locks, name, guard) = held_through_proxy(
        "prefix-lands",
        LeaseOptions::manual(Duration::from_secs(30)).unwrap(),
    )
    .await;
    let other = connect(&redis.url(), RedisOptions::new()).await;
    let started = Instant::now();
    proxy.set_delay(Duration::from_secs(3));
    let (x, ()) = tokio::join!(guard.extend(Duration::from_millis(2345)), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        proxy.set_delay(Duration::ZERO);
        proxy.reset_after_request(b"$4\r\n2345\r\n");
    });
    assert!(x.is_err(), "X is held up: {x:?}");
    // Full-length extensions, answered or not.
    let _ = guard.extend(Duration::from_secs(30)).await;
    let _ = guard.extend(Duration::from_secs(30)).await;
    while started.elapsed() < Duration::from_secs(8) {
        assert!(!two_holders(&guard, &other, &name).await, "two holders");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(proxy.resets(), 1, "X reached the server, then the reset");
}

/// Watchdog mode: a short extension cancelled by its caller (future
/// dropped) is still on the connection; the watchdog's renewals time out
/// behind it; it then lands alone and the connection is reset. Never two
/// holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_short_extension_landing_later_never_makes_two_holders() {
    let redis = test_support::redis::shared();
    let started = Instant::now();
    let (proxy, _locks, name, guard) = held_through_proxy(
        "cancelled-lands",
        LeaseOptions::new(Duration::from_secs(6)).unwrap(),
    )
    .await;
    let other = connect(&redis.url(), RedisOptions::new()).await;
    // Just before the watchdog's first renewal (at 2 s).
    tokio::time::sleep(Duration::from_millis(1900).saturating_sub(started.elapsed())).await;
    proxy.set_delay(Duration::from_secs(3));
    let x = tokio::time::timeout(
        Duration::from_millis(100),
        guard.extend(Duration::from_millis(1234)),
    )
    .await;
    assert!(x.is_err(), "cancelled in flight");
    proxy.set_delay(Duration::ZERO);
    proxy.reset_after_request(b"$4\r\n1234\r\n");
    while started.elapsed() < Duration::from_secs(9) {
        assert!(!two_holders(&guard, &other, &name).await, "two holders");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Watchdog mode, after one extension longer than the watchdog's TTL was
/// answered: the lease still moves off a connection that goes silent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_extended_once_for_longer_still_moves_off_a_silent_connection() {
    let ttl = Duration::from_secs(3);
    let (proxy, _locks, _name, guard) =
        held_through_proxy("longer-then-silent", LeaseOptions::new(ttl).unwrap()).await;
    guard.extend(ttl * 2).await.unwrap();
    let before = proxy.accepted_connections();
    assert_eq!(proxy.silence_connections_that_sent(b"EVALSHA"), 1);
    let lost = tokio::time::timeout(ttl * 4, guard.lost()).await;
    assert!(lost.is_err(), "lost to a silent connection: {lost:?}");
    assert!(
        proxy.accepted_connections() > before,
        "moved to a new connection"
    );
    guard.release().await.unwrap();
}

/// A server that restarts with a dataset to load answers `LOADING` to every
/// command until it is done. That is a retryable failure: `try_lock` says
/// so (never a server error, which callers do not retry), and `lock()`
/// rides it out and takes the lock once the server has loaded, within its
/// deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_waits_out_a_server_loading_its_dataset() {
    // 20 000 keys at 200 µs each: some 4 s of LOADING after the restart
    // (events are served every KiB loaded, so clients get their answer).
    let mut server = test_support::RedisServer::start_with(&[
        "--key-load-delay",
        "200",
        "--loading-process-events-interval-bytes",
        "1024",
    ]);
    let client = redis::Client::open(server.url()).unwrap();
    let mut raw = client.get_multiplexed_async_connection().await.unwrap();
    let mut fill = redis::pipe();
    for i in 0..20_000 {
        fill.set(format!("ballast:{i}"), i).ignore();
    }
    fill.query_async::<()>(&mut raw).await.unwrap();
    redis::cmd("SAVE")
        .query_async::<()>(&mut raw)
        .await
        .unwrap();
    drop(raw);
    let locks = connect(&server.url(), RedisOptions::new()).await;
    let mutex = locks.mutex(&unique_name("loading")).unwrap();
    server.kill();
    // `restart` returns once the server answers PING, after the load.
    let restarted = std::thread::spawn(move || {
        server.restart();
        server
    });
    // Until the server answers LOADING (refused connections before it).
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < until, "the server never answered LOADING");
        if let Ok(mut c) = client.get_multiplexed_async_connection().await {
            let r = redis::cmd("PING").query_async::<String>(&mut c).await;
            if matches!(&r, Err(e) if e.code() == Some("LOADING")) {
                break;
            }
            assert!(r.is_err(), "loaded before the test saw it load: {r:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The first attempt may meet the connection the restart broke; the
    // ones after it meet LOADING itself.
    for _ in 0..5 {
        let refused = mutex.try_lock().await;
        assert!(
            matches!(&refused, Err(e) if e.is_retryable()),
            "try_lock while the server loads: {refused:?}"
        );
    }
    let guard = mutex
        .lock_timeout(Duration::from_secs(30))
        .await
        .expect("lock() rides out LOADING")
        .expect("acquired within 30 s");
    let server = tokio::task::spawn_blocking(move || restarted.join().unwrap())
        .await
        .unwrap();
    let keys: u64 = server.cli(&["DBSIZE"]).parse().unwrap();
    assert!(keys > 20_000, "the ballast and the lock: {keys} keys");
    guard.release().await.unwrap();
}

/// A provider through a new proxy, with scripts loaded (so that the
/// members run them, not a reload), and one straight to the server.
async fn proxied_and_direct(response_timeout: Duration) -> (Proxy, RedisProvider, RedisProvider) {
    let redis = test_support::redis::shared();
    let proxy = Proxy::start(redis.addr());
    let proxied = connect(
        &format!("redis://{}", proxy.addr()),
        RedisOptions::new().response_timeout(response_timeout),
    )
    .await;
    let warm = proxied
        .mutex(&unique_name("warm-up"))
        .unwrap()
        .lock()
        .await
        .unwrap();
    warm.release().await.unwrap();
    let direct = connect(&redis.url(), RedisOptions::new()).await;
    (proxy, proxied, direct)
}

/// `LockSet::lock_timeout(1 s)` of ten names on a server whose every
/// request takes about 400 ms: within 1 s plus one response timeout
/// (before: a member per request past the deadline, about 4 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_keeps_its_deadline_on_a_slow_server() {
    let response_timeout = Duration::from_secs(1);
    let (proxy, slow, direct) = proxied_and_direct(response_timeout).await;
    test_support::multi::set_keeps_its_deadline_on_a_slow_server(
        &proxy,
        |name| slow.mutex(name).unwrap(),
        |name| direct.mutex(name).unwrap(),
        response_timeout,
        "redis mutex",
    )
    .await;
}

/// `LockSet::lock_timeout(1 s)` partitioned while it holds two names and
/// waits for a third: it returns within 1 s plus one response timeout,
/// the two it took released (or left to their leases) on the way out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_keeps_its_deadline_through_a_partition() {
    let response_timeout = Duration::from_millis(500);
    let (proxy, cut, direct) = proxied_and_direct(response_timeout).await;
    let lease = LeaseOptions::new(Duration::from_secs(5)).unwrap();
    test_support::multi::set_keeps_its_deadline_through_a_partition(
        &proxy,
        |name| cut.with_lease(lease).unwrap().mutex(name).unwrap(),
        |name| direct.mutex(name).unwrap(),
        response_timeout,
        "redis mutex",
    )
    .await;
}

/// A release right after the held lease's connection was closed (as a
/// server's idle `timeout` or a middlebox does) releases: the script goes
/// out again on a fresh connection (before: a broken-pipe error, and the
/// lock stayed held for the rest of its 30 s TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_its_connection_was_closed_releases() {
    let redis = test_support::redis::shared();
    let proxy = Proxy::start(redis.addr());
    let holder = connect(&format!("redis://{}", proxy.addr()), RedisOptions::new()).await;
    let name = unique_name("released-after-close");
    let key = holder.lock_key(&name).unwrap();
    let guard = holder
        .with_lease(long())
        .unwrap()
        .mutex(&name)
        .unwrap()
        .lock()
        .await
        .unwrap();
    proxy.cut();
    // The client has seen its socket closed.
    tokio::time::sleep(Duration::from_millis(100)).await;
    guard.release().await.unwrap();
    assert_eq!(redis.cli(&["EXISTS", &key]), "0", "the lock is still held");
}
