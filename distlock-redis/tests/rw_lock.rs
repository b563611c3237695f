//! The Redis read-write lock on a real redis-server (and a real Cluster):
//! sharing and exclusion across clients, writer preference, crashed
//! readers, fencing, cancellation, lost replies.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_core::{LeaseOptions, LockGuard, Provider};
use distlock_redis::{RedisOptions, RedisProvider};
use test_support::redis::RedisServer;
use test_support::{unique_name, Proxy};

const SLACK: Duration = Duration::from_secs(5);

async fn connect(url: &str, options: RedisOptions) -> RedisProvider {
    RedisProvider::connect_with(url, options).await.unwrap()
}

fn long() -> LeaseOptions {
    LeaseOptions::new(Duration::from_secs(30)).unwrap()
}

/// The lock's keys as the crate docs give them.
struct RwKeys {
    writer: String,
    readers: String,
    queue: String,
    alive: String,
}

fn keys(locks: &RedisProvider, name: &str) -> RwKeys {
    let lock = locks.lock_key(name).unwrap();
    let key = |s: &str| format!("{{{lock}}}:rw:{s}");
    RwKeys {
        writer: key("writer"),
        readers: key("readers"),
        queue: key("queue"),
        alive: key("alive"),
    }
}

/// Polls `check` until it holds or `SLACK` passes.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + SLACK;
    while !check() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Nothing but the fencing counter is left of the lock.
async fn nothing_left(redis: &RedisServer, k: &RwKeys) {
    for key in [&k.writer, &k.readers, &k.queue, &k.alive] {
        eventually(&format!("{key} gone"), || {
            redis.cli(&["EXISTS", key.as_str()]) == "0"
        })
        .await;
    }
}

async fn readers_share_and_a_writer_excludes(options: RedisOptions) {
    let redis = test_support::redis::shared();
    let name = unique_name("rw-share");
    let a = connect(&redis.url(), options.clone()).await;
    let b = connect(&redis.url(), options).await;
    let (rwa, rwb) = (a.rw_lock(&name).unwrap(), b.rw_lock(&name).unwrap());
    let r1 = rwa.read().try_lock().await.unwrap().expect("first reader");
    let r2 = rwb.read().try_lock().await.unwrap().expect("readers share");
    assert_ne!(r1.fencing_token(), r2.fencing_token());
    assert!(rwa.write().try_lock().await.unwrap().is_none());
    assert!(rwb.write().try_lock().await.unwrap().is_none());
    assert_eq!(redis.cli(&["ZCARD", &keys(&a, &name).readers]), "2");
    let last_read = r2.fencing_token().max(r1.fencing_token());
    r1.release().await.unwrap();
    assert!(
        rwb.write().try_lock().await.unwrap().is_none(),
        "a writer got in beside a reader"
    );
    r2.release().await.unwrap();
    let w = rwb
        .write()
        .try_lock()
        .await
        .unwrap()
        .expect("free for a writer");
    assert!(w.fencing_token() > last_read);
    assert!(rwa.read().try_lock().await.unwrap().is_none());
    assert!(rwa.write().try_lock().await.unwrap().is_none());
    let write_token = w.fencing_token();
    w.release().await.unwrap();
    let r = rwa.read().try_lock().await.unwrap().unwrap();
    assert!(r.fencing_token() > write_token);
    r.release().await.unwrap();
    nothing_left(redis, &keys(&a, &name)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_across_clients_and_a_writer_excludes() {
    readers_share_and_a_writer_excludes(RedisOptions::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_a_writer_excludes_on_a_pool() {
    readers_share_and_a_writer_excludes(RedisOptions::new().pool_size(4)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_holds_back_new_readers() {
    let redis = test_support::redis::shared();
    let name = unique_name("rw-prefer");
    let a = connect(&redis.url(), RedisOptions::new()).await;
    let b = connect(&redis.url(), RedisOptions::new()).await;
    let c = connect(&redis.url(), RedisOptions::new()).await;
    let k = keys(&a, &name);
    let reader = a.rw_lock(&name).unwrap().read().lock().await.unwrap();
    let write = b.rw_lock(&name).unwrap().write();
    let writer = tokio::spawn(async move { write.lock_timeout(SLACK * 2).await });
    eventually("the writer queues", || {
        redis.cli(&["ZCARD", &k.queue]) == "1"
    })
    .await;
    let rw_c = c.rw_lock(&name).unwrap();
    assert!(
        rw_c.read().try_lock().await.unwrap().is_none(),
        "a new reader overtook a waiting writer"
    );
    // A waiting reader queues behind the writer.
    let read_c = rw_c.read();
    let late_reader = tokio::spawn(async move { read_c.lock_timeout(SLACK * 2).await });
    eventually("the late reader queues", || {
        redis.cli(&["ZCARD", &k.queue]) == "2"
    })
    .await;
    let read_token = reader.fencing_token();
    reader.release().await.unwrap();
    let w = writer.await.unwrap().unwrap().expect("the writer got in");
    assert!(w.fencing_token() > read_token);
    assert!(
        !late_reader.is_finished(),
        "a reader got in beside the writer"
    );
    let write_token = w.fencing_token();
    w.release().await.unwrap();
    let r = late_reader
        .await
        .unwrap()
        .unwrap()
        .expect("the reader behind");
    assert!(r.fencing_token() > write_token);
    r.release().await.unwrap();
    nothing_left(redis, &k).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_reader_frees_the_writer_at_its_ttl() {
    let redis = test_support::redis::shared();
    let name = unique_name("rw-crash");
    let a = connect(&redis.url(), RedisOptions::new()).await;
    let b = connect(&redis.url(), RedisOptions::new()).await;
    let ttl = Duration::from_millis(800);
    let crashed = a
        .with_lease(LeaseOptions::manual(ttl).unwrap())
        .unwrap()
        .rw_lock(&name)
        .unwrap()
        .read()
        .lock()
        .await
        .unwrap();
    let held_from = Instant::now();
    // The holder "crashes": no release, no renewal.
    std::mem::forget(crashed);
    drop(a);
    let w = b
        .rw_lock(&name)
        .unwrap()
        .write()
        .lock_timeout(SLACK)
        .await
        .unwrap()
        .expect("the writer got in once the reader's lease ran out");
    assert!(
        held_from.elapsed() >= ttl - Duration::from_millis(100),
        "the writer got in while the reader's lease ran"
    );
    w.release().await.unwrap();
    nothing_left(redis, &keys(&b, &name)).await;
}

/// A mixed sequence of overlapping readers and writers from three clients:
/// every write token is above every earlier token, every read token above
/// every earlier write token, all distinct.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_order_writes_after_everything_and_reads_after_writes() {
    let redis = test_support::redis::shared();
    let name = unique_name("rw-fence");
    let mut clients = Vec::new();
    for pool in [None, Some(2), None] {
        let mut options = RedisOptions::new();
        if let Some(size) = pool {
            options = options.pool_size(size);
        }
        clients.push(connect(&redis.url(), options).await);
    }
    let log = Arc::new(std::sync::Mutex::new(Vec::<(bool, u64)>::new()));
    let mut tasks = Vec::new();
    for i in 0..12usize {
        let rw = clients[i % 3].rw_lock(&name).unwrap();
        let log = Arc::clone(&log);
        tasks.push(tokio::spawn(async move {
            for round in 0..4usize {
                let write = (i + round) % 3 == 0;
                let side = if write { rw.write() } else { rw.read() };
                let g = side.lock_timeout(SLACK * 4).await.unwrap().unwrap();
                let token = g.fencing_token();
                {
                    // Checked at acquisition, against everything acquired
                    // before (the log is in acquisition order).
                    let mut log = log.lock().unwrap();
                    for &(was_write, earlier) in log.iter() {
                        assert_ne!(earlier, token, "a token repeated");
                        if write || was_write {
                            assert!(
                                token > earlier,
                                "token {token} (write: {write}) after {earlier} (write: {was_write})"
                            );
                        }
                    }
                    log.push((write, token));
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                g.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(log.lock().unwrap().len(), 48);
    nothing_left(redis, &keys(&clients[0], &name)).await;
}

/// Acquisitions of both sides cancelled at random points (the proxy delays
/// traffic so cancellations land while requests are in flight), some while
/// queued behind a writer: nothing is left held or queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquisitions_leave_nothing() {
    let redis = test_support::redis::shared();
    let proxy = Proxy::start(redis.addr());
    proxy.set_delay(Duration::from_micros(700));
    let mut rng = fastrand::Rng::with_seed(7);
    for (size, blocked) in [
        (None, false),
        (Some(4), false),
        (None, true),
        (Some(4), true),
    ] {
        let name = unique_name("rw-cancel");
        let mut options = RedisOptions::new();
        if let Some(size) = size {
            options = options.pool_size(size);
        }
        let locks = connect(&format!("redis://{}", proxy.addr()), options).await;
        let other = connect(&redis.url(), RedisOptions::new()).await;
        let k = keys(&locks, &name);
        let rw = locks.with_lease(long()).unwrap().rw_lock(&name).unwrap();
        // A writer holding makes every attempt queue.
        let blocker = if blocked {
            Some(other.rw_lock(&name).unwrap().write().lock().await.unwrap())
        } else {
            None
        };
        let mut tasks = Vec::new();
        for i in 0..120 {
            let side = if i % 3 == 0 { rw.write() } else { rw.read() };
            let cut = Duration::from_micros(rng.u64(0..6000));
            tasks.push(tokio::spawn(async move {
                if let Ok(Ok(g)) = tokio::time::timeout(cut, side.lock()).await {
                    drop(g);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        if let Some(g) = blocker {
            eventually("the queue empties", || {
                redis.cli(&["EXISTS", &k.queue]) == "0"
            })
            .await;
            g.release().await.unwrap();
        }
        nothing_left(redis, &k).await;
    }
}

/// Cancelled while queued: the entry goes at once (not at its expiry), and
/// the reader it held back gets in, woken by the leaving writer's script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_waiting_writer_leaves_the_queue_and_lets_readers_in() {
    let redis = test_support::redis::shared();
    let name = unique_name("rw-cancel-writer");
    // Long re-checks: only the leaving writer's hand-over lets the reader in.
    let a = connect(
        &redis.url(),
        RedisOptions::new().recheck_interval(Duration::from_secs(20)),
    )
    .await;
    let b = connect(&redis.url(), RedisOptions::new()).await;
    let k = keys(&a, &name);
    let reader = a.rw_lock(&name).unwrap().read().lock().await.unwrap();
    let write = b.rw_lock(&name).unwrap().write();
    let writer = tokio::spawn(async move { write.lock().await });
    eventually("the writer queues", || {
        redis.cli(&["ZCARD", &k.queue]) == "1"
    })
    .await;
    let rw_a = a.rw_lock(&name).unwrap();
    let read_a = rw_a.read();
    let held_back = tokio::spawn(async move { read_a.lock_timeout(SLACK).await });
    eventually("the reader queues", || {
        redis.cli(&["ZCARD", &k.queue]) == "2"
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = a.wakeups();
    writer.abort();
    let started = Instant::now();
    let r2 = held_back
        .await
        .unwrap()
        .unwrap()
        .expect("the reader got in");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "waited for the entry to expire"
    );
    assert_eq!(a.wakeups() - before, 1, "one hand-over to the reader");
    reader.release().await.unwrap();
    r2.release().await.unwrap();
    nothing_left(redis, &k).await;
}

/// A read acquisition lands but its reply is lost, then the connection is
/// cut and blackholed past the response timeout: the share must not stay
/// for the lease's 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_acquire_reply_is_undone() {
    let redis = test_support::redis::shared();
    let proxy = Proxy::start(redis.addr());
    let name = unique_name("rw-lost-reply");
    let victim = connect(
        &format!("redis://{}", proxy.addr()),
        RedisOptions::new().response_timeout(Duration::from_millis(300)),
    )
    .await;
    let other = connect(&redis.url(), RedisOptions::new()).await;
    let k = keys(&victim, &name);
    // Load the scripts first: the EVALSHA below must run, not meet NOSCRIPT.
    let warm = victim
        .rw_lock(&unique_name("warm-up"))
        .unwrap()
        .read()
        .lock()
        .await
        .unwrap();
    warm.release().await.unwrap();
    let read = victim
        .with_lease(long())
        .unwrap()
        .rw_lock(&name)
        .unwrap()
        .read();
    proxy.lose_reply_to(b"EVALSHA");
    let attempt = tokio::spawn(async move { read.lock_timeout(Duration::from_secs(2)).await });
    eventually("the acquire lands", || {
        redis.cli(&["ZCARD", &k.readers]) == "1"
    })
    .await;
    assert!(
        proxy.swallowed_some(Duration::from_secs(3)).await,
        "no reply was lost"
    );
    proxy.cut();
    proxy.set_blackhole(true);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    proxy.heal();
    let got: distlock_core::Result<Option<LockGuard>> = tokio::time::timeout(SLACK * 2, attempt)
        .await
        .expect("the acquisition outlived its timeout")
        .unwrap();
    match got {
        Ok(Some(guard)) => guard.release().await.unwrap(),
        Ok(None) => {}
        Err(e) => assert!(e.is_retryable(), "untyped failure: {e:?}"),
    }
    let w = other
        .rw_lock(&name)
        .unwrap()
        .write()
        .lock_timeout(SLACK * 2)
        .await
        .unwrap()
        .expect("the lost acquisition's share was left for its whole TTL");
    w.release().await.unwrap();
    nothing_left(redis, &k).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_releases_held_shares_and_ends_waiters() {
    let redis = test_support::redis::shared();
    let name = unique_name("rw-close");
    let a = connect(&redis.url(), RedisOptions::new()).await;
    let k = keys(&a, &name);
    let r = a.rw_lock(&name).unwrap().read().lock().await.unwrap();
    let lost = r.lost();
    let write = a.rw_lock(&name).unwrap().write();
    let waiter = tokio::spawn(async move { write.lock().await });
    eventually("the writer queues", || {
        redis.cli(&["ZCARD", &k.queue]) == "1"
    })
    .await;
    a.close().await.unwrap();
    assert!(matches!(
        waiter.await.unwrap(),
        Err(distlock_core::Error::Closed)
    ));
    tokio::time::timeout(SLACK, lost).await.unwrap();
    assert!(matches!(a.rw_lock("x"), Err(distlock_core::Error::Closed)));
    nothing_left(redis, &k).await;
}

#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_keys_share_one_slot_and_the_lock_works() {
    let cluster = test_support::redis::RedisCluster::start(3);
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let a = RedisProvider::connect_cluster(&nodes, RedisOptions::new().key_prefix("app:"))
        .await
        .unwrap();
    let b = RedisProvider::connect_cluster(&nodes, RedisOptions::new().key_prefix("app:"))
        .await
        .unwrap();
    for i in 0..5 {
        let name = unique_name(&format!("rw-cluster{i}"));
        let k = keys(&a, &name);
        let slot = cluster.cli(&["CLUSTER", "KEYSLOT", &a.lock_key(&name).unwrap()]);
        for key in [&k.writer, &k.readers, &k.queue, &k.alive] {
            assert_eq!(cluster.cli(&["CLUSTER", "KEYSLOT", key]), slot, "{key}");
        }
        let r1 = a.rw_lock(&name).unwrap().read().lock().await.unwrap();
        let r2 = b.rw_lock(&name).unwrap().read().lock().await.unwrap();
        let write = b.rw_lock(&name).unwrap().write();
        let writer = tokio::spawn(async move { write.lock_timeout(SLACK).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(a
            .rw_lock(&name)
            .unwrap()
            .read()
            .try_lock()
            .await
            .unwrap()
            .is_none());
        let last = r1.fencing_token().max(r2.fencing_token());
        r1.release().await.unwrap();
        r2.release().await.unwrap();
        let w = writer.await.unwrap().unwrap().expect("the writer got in");
        assert!(w.fencing_token() > last);
        w.release().await.unwrap();
    }
}

/// A writer's release lets every reader queued behind it in, each woken by
/// exactly one message addressed to it, on whichever of 4 providers it
/// waits (nobody waits for a re-check: 20 s here). A writer queued behind
/// them is not woken until the last of them leaves, and then once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writers_release_wakes_each_waiting_reader_once_across_providers() {
    let redis = test_support::redis::shared();
    let name = unique_name("rw-cascade");
    let a = connect(&redis.url(), RedisOptions::new()).await;
    let mut waiting = Vec::new();
    for pool in [None, Some(2), None, Some(3)] {
        let mut options = RedisOptions::new().recheck_interval(Duration::from_secs(20));
        if let Some(size) = pool {
            options = options.pool_size(size);
        }
        waiting.push(connect(&redis.url(), options).await);
    }
    let wakeups = |c: &[RedisProvider]| c.iter().map(RedisProvider::wakeups).sum::<u64>();
    let k = keys(&a, &name);
    let w = a
        .with_lease(long())
        .unwrap()
        .rw_lock(&name)
        .unwrap()
        .write()
        .lock()
        .await
        .unwrap();
    let mut readers = Vec::new();
    for (i, p) in waiting.iter().enumerate() {
        let read = p.with_lease(long()).unwrap().rw_lock(&name).unwrap().read();
        readers.push(tokio::spawn(
            async move { read.lock_timeout(SLACK * 4).await },
        ));
        eventually("the reader queues", || {
            redis.cli(&["ZCARD", &k.queue]) == (i + 1).to_string()
        })
        .await;
    }
    let write = waiting[1]
        .with_lease(long())
        .unwrap()
        .rw_lock(&name)
        .unwrap()
        .write();
    let next_writer = tokio::spawn(async move { write.lock_timeout(SLACK * 4).await });
    eventually("the writer queues behind them", || {
        redis.cli(&["ZCARD", &k.queue]) == "5"
    })
    .await;
    // Let every waiter finish its attempt after subscribing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = wakeups(&waiting);
    let released = Instant::now();
    w.release().await.unwrap();
    let mut guards = Vec::new();
    for r in readers {
        guards.push(r.await.unwrap().unwrap().expect("a reader got in"));
    }
    assert!(
        released.elapsed() < Duration::from_secs(3),
        "readers waited for their re-check"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        wakeups(&waiting) - before,
        4,
        "one wake-up per reader let in, none for the writer"
    );
    assert_eq!(redis.cli(&["ZCARD", &k.readers]), "4");
    assert_eq!(
        redis.cli(&["ZCARD", &k.queue]),
        "1",
        "the writer still waits"
    );
    let before = wakeups(&waiting);
    let last = guards.pop().unwrap();
    for g in guards {
        g.release().await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(wakeups(&waiting), before, "woken while a reader holds");
    last.release().await.unwrap();
    let g = next_writer
        .await
        .unwrap()
        .unwrap()
        .expect("the writer got in");
    assert_eq!(wakeups(&waiting) - before, 1, "the writer woken once");
    g.release().await.unwrap();
    nothing_left(redis, &k).await;
}

/// A read share is its own lease: the watchdog keeps it past its TTL,
/// `extend()` works with manual renewal, and a share taken away fires
/// `lost()` at the next renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_shares_renew_extend_and_report_loss() {
    let redis = test_support::redis::shared();
    let name = unique_name("rw-renew");
    let a = connect(&redis.url(), RedisOptions::new()).await;
    let k = keys(&a, &name);
    let ttl = Duration::from_millis(600);
    let watched = a
        .with_lease(LeaseOptions::new(ttl).unwrap())
        .unwrap()
        .rw_lock(&name)
        .unwrap()
        .read()
        .lock()
        .await
        .unwrap();
    let manual = a
        .with_lease(LeaseOptions::manual(ttl).unwrap())
        .unwrap()
        .rw_lock(&name)
        .unwrap()
        .read()
        .lock()
        .await
        .unwrap();
    manual.extend(Duration::from_secs(3)).await.unwrap();
    tokio::time::sleep(ttl * 2).await;
    assert!(watched.is_held() && manual.is_held());
    assert_eq!(redis.cli(&["ZCARD", &k.readers]), "2", "a share expired");
    assert!(a
        .rw_lock(&name)
        .unwrap()
        .write()
        .try_lock()
        .await
        .unwrap()
        .is_none());
    // Someone takes the watched share away: its next renewal notices.
    let lost = watched.lost();
    let members = redis.cli(&["ZRANGE", &k.readers, "0", "-1"]);
    for m in members.lines() {
        assert_eq!(redis.cli(&["ZREM", &k.readers, m]), "1");
    }
    tokio::time::timeout(SLACK, lost)
        .await
        .expect("lost() never fired");
    assert!(matches!(
        manual.extend(ttl).await,
        Err(distlock_core::Error::NotHeld { .. })
    ));
    nothing_left(redis, &k).await;
}

/// An exhausted fencing counter is a typed error that takes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_counter_is_a_typed_error() {
    let redis = test_support::redis::shared();
    let name = unique_name("rw-exhausted");
    let locks = connect(&redis.url(), RedisOptions::new()).await;
    let k = keys(&locks, &name);
    let fence = format!("{{{}}}:rw:fence", locks.lock_key(&name).unwrap());
    let rw = locks.rw_lock(&name).unwrap();
    assert_eq!(redis.cli(&["SET", &fence, "9007199254740991"]), "OK");
    for side in [rw.read(), rw.write()] {
        assert!(matches!(
            side.try_lock().await,
            Err(distlock_core::Error::Exhausted { .. })
        ));
    }
    nothing_left(redis, &k).await;
}

/// A queued reader or writer whose connection is cut and blackholed keeps
/// its deadline within a response timeout or so, although the client's
/// reconnects may each take the 5 s connect timeout (as the mutex's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_through_a_partition_keeps_the_deadline() {
    let redis = test_support::redis::shared();
    let other = connect(&redis.url(), RedisOptions::new()).await;
    for write in [true, false] {
        let proxy = Proxy::start(redis.addr());
        let options = RedisOptions::new().response_timeout(Duration::from_millis(300));
        let victim = connect(&format!("redis://{}", proxy.addr()), options).await;
        let name = unique_name("rw-deadline");
        let holder = other
            .with_lease(long())
            .unwrap()
            .rw_lock(&name)
            .unwrap()
            .write()
            .lock()
            .await
            .unwrap();
        let rw = victim.with_lease(long()).unwrap().rw_lock(&name).unwrap();
        let side = if write { rw.write() } else { rw.read() };
        test_support::proxy::wait_keeps_its_deadline_through_a_partition(
            &proxy,
            side,
            &format!("write {write}"),
        )
        .await;
        holder.release().await.unwrap();
    }
}
