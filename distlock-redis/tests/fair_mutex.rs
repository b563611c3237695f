//! The Redis fair mutex on a real redis-server: FIFO order across providers,
//! one wake-up per hand-over, dead waiters, exclusion with the plain mutex
//! and raw `SET NX PX`, cancellation, fencing, a lost reply.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock_core::{LeaseOptions, Provider};
use distlock_redis::{RedisOptions, RedisProvider};
use test_support::{unique_name, Proxy, RedisServer};

const SLACK: Duration = Duration::from_secs(3);

async fn connect(url: &str, options: RedisOptions) -> RedisProvider {
    RedisProvider::connect_with(url, options).await.unwrap()
}

fn long() -> LeaseOptions {
    LeaseOptions::new(Duration::from_secs(30)).unwrap()
}

fn queue_key(lock_key: &str) -> String {
    format!("{{{lock_key}}}:fair:queue")
}

fn timeouts_key(lock_key: &str) -> String {
    format!("{{{lock_key}}}:fair:timeouts")
}

fn queue_len(redis: &RedisServer, lock_key: &str) -> usize {
    redis.cli(&["ZCARD", &queue_key(lock_key)]).parse().unwrap()
}

/// Waits until the queue holds `n` entries.
async fn until_queued(redis: &RedisServer, lock_key: &str, n: usize) {
    let deadline = Instant::now() + SLACK;
    while queue_len(redis, lock_key) != n {
        assert!(Instant::now() < deadline, "the queue never held {n}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until neither queue key exists.
async fn until_queue_gone(redis: &RedisServer, lock_key: &str, within: Duration, what: &str) {
    let deadline = Instant::now() + within;
    loop {
        let left = redis.cli(&["EXISTS", &queue_key(lock_key), &timeouts_key(lock_key)]);
        if left == "0" {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: queue keys left");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn providers(n: usize, options: &RedisOptions) -> Vec<RedisProvider> {
    let url = test_support::redis::shared().url();
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(connect(&url, options.clone()).await);
    }
    out
}

/// Waiters queue one after another (each confirmed queued on the server
/// before the next arrives), spread over four providers: they get the lock
/// in exactly that order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_over_several_providers_get_the_lock_in_arrival_order() {
    let redis = test_support::redis::shared();
    let clients = providers(4, &RedisOptions::new()).await;
    let name = unique_name("fifo");
    let key = clients[0].lock_key(&name).unwrap();
    let holder = clients[0]
        .with_lease(long())
        .unwrap()
        .fair_mutex(&name)
        .unwrap()
        .lock()
        .await
        .unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..10 {
        let lock = clients[i % 4]
            .with_lease(long())
            .unwrap()
            .fair_mutex(&name)
            .unwrap();
        let order = Arc::clone(&order);
        tasks.push(tokio::spawn(async move {
            let g = lock.lock().await.unwrap();
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(10)).await;
            g.release().await.unwrap();
        }));
        until_queued(redis, &key, i + 1).await;
    }
    holder.release().await.unwrap();
    for t in tasks {
        tokio::time::timeout(SLACK * 3, t).await.unwrap().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..10).collect::<Vec<_>>());
    until_queue_gone(redis, &key, SLACK, "after every waiter left").await;
}

/// Sixty-four waiters over four providers: each release wakes exactly one
/// waiter, on whichever provider it waits (not one per provider, not all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_hand_over_wakes_exactly_one_waiter_across_providers() {
    let redis = test_support::redis::shared();
    // No timer re-checks during the test: every wake-up is a message.
    let options = RedisOptions::new().recheck_interval(Duration::from_secs(20));
    let clients = providers(4, &options).await;
    let name = unique_name("one-wakeup");
    let key = clients[0].lock_key(&name).unwrap();
    let lease = LeaseOptions::new(Duration::from_secs(60)).unwrap();
    let holder = clients[0]
        .with_lease(lease)
        .unwrap()
        .fair_mutex(&name)
        .unwrap()
        .lock()
        .await
        .unwrap();
    let handed = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    const WAITERS: usize = 64;
    for i in 0..WAITERS {
        let lock = clients[i % 4]
            .with_lease(lease)
            .unwrap()
            .fair_mutex(&name)
            .unwrap();
        let handed = Arc::clone(&handed);
        tasks.push(tokio::spawn(async move {
            let g = lock.lock().await.unwrap();
            handed.lock().unwrap().push(i);
            g.release().await.unwrap();
        }));
    }
    until_queued(redis, &key, WAITERS).await;
    // Every waiter has subscribed once its entry is there and it looked
    // again; give the last ones a moment to finish that look.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let wakeups = |c: &[RedisProvider]| c.iter().map(RedisProvider::wakeups).sum::<u64>();
    let before = wakeups(&clients);
    holder.release().await.unwrap();
    for t in tasks {
        tokio::time::timeout(SLACK * 3, t).await.unwrap().unwrap();
    }
    assert_eq!(handed.lock().unwrap().len(), WAITERS);
    assert_eq!(
        wakeups(&clients) - before,
        WAITERS as u64,
        "one wake-up per hand-over"
    );
}

/// A waiter whose runtime stalls while queued (its heartbeat stops) holds
/// the queue up only until its entry expires; when it comes back it queues
/// again at the back and still gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_waiter_does_not_block_the_queue_beyond_its_entry() {
    let redis = test_support::redis::shared();
    let url = redis.url();
    let name = unique_name("stalled");
    let entry = Duration::from_millis(800);
    let lease = LeaseOptions::new(entry).unwrap();
    let a = connect(&url, RedisOptions::new()).await;
    let key = a.lock_key(&name).unwrap();
    let holder = a
        .with_lease(lease)
        .unwrap()
        .fair_mutex(&name)
        .unwrap()
        .lock()
        .await
        .unwrap();
    // The stalled waiter, alone on a runtime of its own.
    let (queued_tx, queued_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let (stall_url, stall_name, stall_key) = (url.clone(), name.clone(), key.clone());
    let stalled = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let p = connect(&stall_url, RedisOptions::new()).await;
            let lock = p
                .with_lease(lease)
                .unwrap()
                .fair_mutex(&stall_name)
                .unwrap();
            let task = tokio::spawn(async move {
                let g = lock.lock().await.unwrap();
                g.release().await.unwrap();
                Instant::now()
            });
            let redis = test_support::redis::shared();
            while queue_len(redis, &stall_key) != 1 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            // Let it subscribe, then stall the whole runtime.
            tokio::time::sleep(Duration::from_millis(100)).await;
            queued_tx.send(()).unwrap();
            std::thread::sleep(Duration::from_secs(4));
            let _ = done_tx.send(task.await.unwrap());
        });
    });
    queued_rx.recv().unwrap();
    let b = connect(&url, RedisOptions::new()).await;
    let behind = b.with_lease(lease).unwrap().fair_mutex(&name).unwrap();
    let waiter = tokio::spawn(async move {
        let g = behind.lock().await.unwrap();
        let at = Instant::now();
        tokio::time::sleep(Duration::from_millis(300)).await;
        g.release().await.unwrap();
        at
    });
    until_queued(redis, &key, 2).await;
    let released = Instant::now();
    holder.release().await.unwrap();
    let got = tokio::time::timeout(SLACK * 2, waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(
        got.duration_since(released) < entry + Duration::from_millis(1200),
        "the waiter behind a stalled one waited {:?}",
        got.duration_since(released)
    );
    // The stalled one comes back, finds its entry gone, queues again and
    // gets the lock after the live waiter.
    let stalled_got = tokio::time::timeout(SLACK * 3, done_rx)
        .await
        .unwrap()
        .unwrap();
    assert!(stalled_got > got);
    stalled.join().unwrap();
    until_queue_gone(redis, &key, SLACK, "after the stall").await;
}

/// A provider dropped while its waiter queues: its entry expires and the
/// next waiter gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_left_behind_by_a_dropped_runtime_expires() {
    let redis = test_support::redis::shared();
    let url = redis.url();
    let name = unique_name("dropped");
    let lease = LeaseOptions::new(Duration::from_millis(600)).unwrap();
    let a = connect(&url, RedisOptions::new()).await;
    let key = a.lock_key(&name).unwrap();
    let holder = a
        .with_lease(lease)
        .unwrap()
        .fair_mutex(&name)
        .unwrap()
        .lock()
        .await
        .unwrap();
    // A runtime that dies with its waiter queued: its cleanup never runs.
    let (dead_url, dead_name, dead_key) = (url.clone(), name.clone(), key.clone());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let p = connect(&dead_url, RedisOptions::new()).await;
            let lock = p.with_lease(lease).unwrap().fair_mutex(&dead_name).unwrap();
            drop(tokio::spawn(async move { lock.lock().await }));
            while queue_len(test_support::redis::shared(), &dead_key) != 1 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        rt.shutdown_background();
    })
    .join()
    .unwrap();
    let behind = connect(&url, RedisOptions::new()).await;
    let lock = behind.with_lease(lease).unwrap().fair_mutex(&name).unwrap();
    let waiter = tokio::spawn(async move { lock.lock_timeout(SLACK).await });
    until_queued(redis, &key, 2).await;
    holder.release().await.unwrap();
    let g = waiter
        .await
        .unwrap()
        .unwrap()
        .expect("blocked by a dead waiter");
    g.release().await.unwrap();
}

/// Plain mutex, fair mutex and a redis-py-like `SET NX PX` on one name
/// exclude each other; fencing tokens increase across plain and fair.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_fair_and_raw_set_exclude_each_other_and_share_fencing() {
    let redis = test_support::redis::shared();
    let p = connect(&redis.url(), RedisOptions::new()).await;
    let name = unique_name("mixed");
    let key = p.lock_key(&name).unwrap();
    let plain = p.with_lease(long()).unwrap().mutex(&name).unwrap();
    let fair = p.with_lease(long()).unwrap().fair_mutex(&name).unwrap();
    // Raw SET holds: neither gets in.
    assert_eq!(redis.cli(&["SET", &key, "py", "NX", "PX", "30000"]), "OK");
    assert!(fair.try_lock().await.unwrap().is_none());
    assert!(plain.try_lock().await.unwrap().is_none());
    let _ = redis.cli(&["DEL", &key]);
    // Fair holds: neither raw nor plain gets in.
    let f1 = fair.try_lock().await.unwrap().unwrap();
    assert_eq!(redis.cli(&["SET", &key, "py", "NX", "PX", "30000"]), "");
    assert!(plain.try_lock().await.unwrap().is_none());
    let t1 = f1.fencing_token();
    f1.release().await.unwrap();
    // Plain holds: neither raw nor fair gets in.
    let p1 = plain.try_lock().await.unwrap().unwrap();
    assert_eq!(redis.cli(&["SET", &key, "py", "NX", "PX", "30000"]), "");
    assert!(fair.try_lock().await.unwrap().is_none());
    let t2 = p1.fencing_token();
    p1.release().await.unwrap();
    let f2 = fair.lock().await.unwrap();
    let t3 = f2.fencing_token();
    f2.release().await.unwrap();
    assert!(t1 < t2 && t2 < t3, "{t1} {t2} {t3}");
    // A try_lock never queues.
    assert_eq!(queue_len(redis, &key), 0);
}

/// The queue head gets in after a release that publishes nothing (a raw
/// DEL, as redis-py releases), after an expiry, and after a plain release,
/// which hands over to it by id (one wake-up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_head_gets_in_after_a_silent_release_an_expiry_and_a_plain_release() {
    let redis = test_support::redis::shared();
    let p = connect(&redis.url(), RedisOptions::new()).await;
    let name = unique_name("silent");
    let key = p.lock_key(&name).unwrap();
    let fair = p.with_lease(long()).unwrap().fair_mutex(&name).unwrap();
    // Raw holder released with a DEL.
    let _ = redis.cli(&["SET", &key, "py", "PX", "30000"]);
    let f = Arc::clone(&fair);
    let waiter = tokio::spawn(async move { f.lock_timeout(SLACK).await });
    until_queued(redis, &key, 1).await;
    let _ = redis.cli(&["DEL", &key]);
    waiter
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
    // Raw holder that expires.
    let _ = redis.cli(&["SET", &key, "py", "PX", "400"]);
    let f = Arc::clone(&fair);
    let waiter = tokio::spawn(async move { f.lock_timeout(SLACK).await });
    waiter
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
    // A plain holder's release wakes the fair head by id.
    let other = connect(&redis.url(), RedisOptions::new()).await;
    let plain = other
        .with_lease(long())
        .unwrap()
        .mutex(&name)
        .unwrap()
        .lock()
        .await
        .unwrap();
    let f = Arc::clone(&fair);
    let waiter = tokio::spawn(async move { f.lock_timeout(SLACK).await });
    until_queued(redis, &key, 1).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = p.wakeups();
    plain.release().await.unwrap();
    waiter
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
    assert!(p.wakeups() > before, "the plain release woke nobody");
}

/// A queued waiter that times out or is cancelled leaves no entry, and the
/// waiters behind it move up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_and_timed_out_waiters_leave_no_entry() {
    let redis = test_support::redis::shared();
    let p = connect(&redis.url(), RedisOptions::new()).await;
    let name = unique_name("cancel");
    let key = p.lock_key(&name).unwrap();
    let fair = p.with_lease(long()).unwrap().fair_mutex(&name).unwrap();
    let holder = fair.lock().await.unwrap();
    // Timed out.
    assert!(fair
        .lock_timeout(Duration::from_millis(300))
        .await
        .unwrap()
        .is_none());
    assert_eq!(queue_len(redis, &key), 0);
    // Cancelled at once, and cancelled while waiting.
    for cut in [Duration::from_micros(500), Duration::from_millis(300)] {
        let f = Arc::clone(&fair);
        let r = tokio::time::timeout(cut, async move { f.lock().await }).await;
        assert!(r.is_err());
        until_queue_gone(redis, &key, SLACK, "a cancelled waiter").await;
    }
    // One cancelled between two live waiters: the second still gets in.
    let first = Arc::clone(&fair);
    let first = tokio::spawn(async move { first.lock().await.unwrap().release().await });
    until_queued(redis, &key, 1).await;
    let middle = Arc::clone(&fair);
    let middle = tokio::spawn(async move { middle.lock().await });
    until_queued(redis, &key, 2).await;
    let last = Arc::clone(&fair);
    let last = tokio::spawn(async move { last.lock().await.unwrap().release().await });
    until_queued(redis, &key, 3).await;
    middle.abort();
    until_queued(redis, &key, 2).await;
    holder.release().await.unwrap();
    tokio::time::timeout(SLACK, first)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    tokio::time::timeout(SLACK, last)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    until_queue_gone(redis, &key, SLACK, "at the end").await;
}

/// The fair acquire runs on the server (it takes the free lock) but its
/// reply is lost and the connection is blackholed: the lock must not stay
/// taken for the lease's 30 s, nor an entry stay queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_fair_acquire_reply_then_partition_leaves_nothing() {
    let redis = test_support::redis::shared();
    let proxy = Proxy::start(redis.addr());
    let name = unique_name("fair-lost-reply");
    let options = RedisOptions::new().response_timeout(Duration::from_millis(300));
    let victim = connect(&format!("redis://{}", proxy.addr()), options).await;
    let other = connect(&redis.url(), RedisOptions::new()).await;
    let key = victim.lock_key(&name).unwrap();
    // Load the scripts first: the EVALSHA below must run, not meet NOSCRIPT.
    let warm = victim.fair_mutex(&unique_name("warm-up")).unwrap();
    warm.lock().await.unwrap().release().await.unwrap();
    let lock = victim
        .with_lease(long())
        .unwrap()
        .fair_mutex(&name)
        .unwrap();
    proxy.lose_reply_to(b"EVALSHA");
    let attempt = tokio::spawn(async move { lock.lock_timeout(Duration::from_secs(2)).await });
    let deadline = Instant::now() + SLACK;
    while redis.cli(&["EXISTS", &key]) != "1" {
        assert!(Instant::now() < deadline, "the acquire never landed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        proxy.swallowed_some(Duration::from_secs(3)).await,
        "no reply was lost"
    );
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
        .fair_mutex(&name)
        .unwrap()
        .lock_timeout(SLACK * 2)
        .await
        .unwrap()
        .expect("the lost acquisition's key was left for its whole TTL");
    g.release().await.unwrap();
    until_queue_gone(redis, &key, SLACK, "after the lost reply").await;
}

/// A fair acquire that queues (the lock is held) but whose reply is lost,
/// then a partition longer than the response timeout while it waits: once
/// it gives up, its entry must not stay in the queue for its 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_enqueue_reply_then_partition_leaves_no_entry() {
    let redis = test_support::redis::shared();
    let proxy = Proxy::start(redis.addr());
    let name = unique_name("fair-lost-enqueue");
    // A reconnection started inside the blackhole hangs until the connect
    // timeout: keep it short so the leave gets through soon after the heal.
    let options = RedisOptions::new()
        .response_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(500));
    let victim = connect(&format!("redis://{}", proxy.addr()), options).await;
    let other = connect(&redis.url(), RedisOptions::new()).await;
    let key = victim.lock_key(&name).unwrap();
    let warm = victim.fair_mutex(&unique_name("warm-up")).unwrap();
    warm.lock().await.unwrap().release().await.unwrap();
    let holder = other
        .with_lease(long())
        .unwrap()
        .mutex(&name)
        .unwrap()
        .lock()
        .await
        .unwrap();
    let lock = victim
        .with_lease(long())
        .unwrap()
        .fair_mutex(&name)
        .unwrap();
    proxy.lose_reply_to(b"EVALSHA");
    let attempt = tokio::spawn(async move { lock.lock_timeout(Duration::from_secs(2)).await });
    until_queued(redis, &key, 1).await;
    assert!(proxy.swallowed_bytes() > 0 || proxy.losing_replies());
    proxy.cut();
    proxy.set_blackhole(true);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    proxy.heal();
    let got = tokio::time::timeout(SLACK * 2, attempt)
        .await
        .expect("the acquisition outlived its timeout")
        .unwrap();
    match got {
        Ok(None) => {}
        Ok(Some(_)) => panic!("acquired a held lock"),
        Err(e) => assert!(e.is_retryable(), "untyped failure: {e:?}"),
    }
    // Gone well before the entry's own 30 s: the leave was retried (the
    // client's reconnection after the heal may take a few seconds).
    until_queue_gone(redis, &key, SLACK * 5, "after the lost enqueue reply").await;
    holder.release().await.unwrap();
}

/// A queue entry without a deadline (left by a deadline key that expired
/// first, or by hand) cannot hold the queue up: it is dropped as dead by the
/// next acquire, release or leave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_without_a_deadline_does_not_block_the_queue() {
    let redis = test_support::redis::shared();
    let p = connect(&redis.url(), RedisOptions::new()).await;
    let name = unique_name("orphan-entry");
    let key = p.lock_key(&name).unwrap();
    let _ = redis.cli(&["ZADD", &queue_key(&key), "0", "ghost"]);
    let lock = p.with_lease(long()).unwrap().fair_mutex(&name).unwrap();
    let g = lock
        .lock_timeout(Duration::from_secs(2))
        .await
        .unwrap()
        .expect("a waiter without a deadline blocked the queue");
    // Behind a holder: an orphan put ahead of a queued live waiter is
    // dropped by the release, whose hand-over goes to the live waiter (a
    // hand-over to the orphan would wake nobody: the waiter would get in
    // only at its re-check).
    let waiter = p.with_lease(long()).unwrap().fair_mutex(&name).unwrap();
    let waiting = tokio::spawn(async move { waiter.lock_timeout(Duration::from_secs(5)).await });
    until_queued(redis, &key, 1).await;
    let _ = redis.cli(&["ZADD", &queue_key(&key), "-1", "ghost"]);
    let before = p.wakeups();
    g.release().await.unwrap();
    let next = waiting
        .await
        .unwrap()
        .unwrap()
        .expect("the waiter never got the lock");
    assert!(
        p.wakeups() > before,
        "the hand-over went to the entry without a deadline"
    );
    assert_eq!(redis.cli(&["ZSCORE", &queue_key(&key), "ghost"]), "");
    next.release().await.unwrap();
}

/// Queue keys of another type are conflicts, and stay untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_key_of_another_type_is_a_conflict() {
    let redis = test_support::redis::shared();
    let p = connect(&redis.url(), RedisOptions::new()).await;
    let name = unique_name("wrong-queue");
    let key = p.lock_key(&name).unwrap();
    let _ = redis.cli(&["SET", &queue_key(&key), "x"]);
    let r = p.fair_mutex(&name).unwrap().try_lock().await;
    assert!(
        matches!(r, Err(distlock_core::Error::Conflict { .. })),
        "{r:?}"
    );
    assert_eq!(redis.cli(&["GET", &queue_key(&key)]), "x");
    assert_eq!(redis.cli(&["EXISTS", &key]), "0");
    // The plain mutex's release ignores the odd queue key.
    let g = p.mutex(&name).unwrap().lock().await.unwrap();
    g.release().await.unwrap();
    assert_eq!(redis.cli(&["GET", &queue_key(&key)]), "x");
}

/// Closing a provider with waiters queued: they get `Closed` and their
/// entries go by the time `close()` returns, not at their expiry (a few
/// seconds): the closing provider holds nothing, so its close has no
/// release of its own to wait for, and the waiters keep no connection
/// while they wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_with_a_queued_waiter_leaves_no_entry() {
    let redis = test_support::redis::shared();
    let holder_client = connect(&redis.url(), RedisOptions::new()).await;
    let closing = connect(&redis.url(), RedisOptions::new()).await;
    let name = unique_name("close-queued");
    let key = closing.lock_key(&name).unwrap();
    let holder = holder_client
        .with_lease(long())
        .unwrap()
        .fair_mutex(&name)
        .unwrap()
        .lock()
        .await
        .unwrap();
    let mut waiters = Vec::new();
    for _ in 0..3 {
        let lock = closing
            .with_lease(long())
            .unwrap()
            .fair_mutex(&name)
            .unwrap();
        waiters.push(tokio::spawn(async move { lock.lock().await }));
    }
    until_queued(redis, &key, 3).await;
    closing.close().await.unwrap();
    // At once: well under the entry's own expiry.
    until_queue_gone(redis, &key, Duration::from_millis(200), "after close").await;
    for waiter in waiters {
        let r = tokio::time::timeout(SLACK, waiter).await.unwrap().unwrap();
        assert!(matches!(r, Err(distlock_core::Error::Closed)), "{r:?}");
    }
    holder.release().await.unwrap();
}

/// A waiter (fair or plain) whose connection is cut and blackholed keeps
/// its deadline within a response timeout or so, although the client's
/// reconnects may each take the 5 s connect timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_through_a_partition_keeps_the_deadline() {
    let redis = test_support::redis::shared();
    let other = connect(&redis.url(), RedisOptions::new()).await;
    for fair in [true, false] {
        let proxy = Proxy::start(redis.addr());
        let options = RedisOptions::new().response_timeout(Duration::from_millis(300));
        let victim = connect(&format!("redis://{}", proxy.addr()), options).await;
        let name = unique_name("deadline");
        let holder = other
            .with_lease(long())
            .unwrap()
            .mutex(&name)
            .unwrap()
            .lock()
            .await
            .unwrap();
        let lock = if fair {
            victim
                .with_lease(long())
                .unwrap()
                .fair_mutex(&name)
                .unwrap()
        } else {
            victim.with_lease(long()).unwrap().mutex(&name).unwrap()
        };
        test_support::proxy::wait_keeps_its_deadline_through_a_partition(
            &proxy,
            lock,
            &format!("fair {fair}"),
        )
        .await;
        holder.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_fair_acquisition_is_small() {
    // What a waiting task keeps: the acquire future (each attempt's state,
    // its lease and undo among it, is boxed and dropped before the wait).
    // It was 7.9 KB, then 912 B while an attempt's locals lived on through
    // the wait, then 432 B; 304 B now (no second async body around it, and
    // the deadline's leave-queue step in a function of its own).
    let url = test_support::redis::shared().url();
    let locks = connect(&url, RedisOptions::new()).await;
    let lock = locks.fair_mutex(&unique_name("fair-size")).unwrap();
    let waiting = lock.acquire(distlock_core::Wait::Forever);
    let size = std::mem::size_of_val(&*waiting);
    println!("Redis fair mutex acquire future: {size} bytes");
    assert!(size <= 384, "{size} bytes");
}
