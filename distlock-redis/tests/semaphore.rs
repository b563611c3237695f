//! The Redis counting semaphore on a real redis-server (and a real
//! Cluster): never over N, fencing tokens, reclaimed permits, permits
//! mismatch, cancellation, one wake-up per release across providers, lost
//! replies.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_core::{Error, LeaseOptions, LockGuard, Provider};
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

/// The semaphore's keys as the crate docs give them.
struct SemKeys {
    permits: String,
    holders: String,
    queue: String,
    alive: String,
}

fn keys(locks: &RedisProvider, name: &str) -> SemKeys {
    let lock = locks.lock_key(name).unwrap();
    let key = |s: &str| format!("{{{lock}}}:sem:{s}");
    SemKeys {
        permits: key("permits"),
        holders: key("holders"),
        queue: key("queue"),
        alive: key("alive"),
    }
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + SLACK;
    while !check() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn nothing_left(redis: &RedisServer, k: &SemKeys) {
    for key in [&k.permits, &k.holders, &k.queue, &k.alive] {
        eventually(&format!("{key} gone"), || {
            redis.cli(&["EXISTS", key.as_str()]) == "0"
        })
        .await;
    }
}

/// `ZRANGE key 0 -1 WITHSCORES` as member -> score.
fn scores(redis: &RedisServer, key: &str) -> BTreeMap<String, String> {
    let out = redis.cli(&["ZRANGE", key, "0", "-1", "WITHSCORES"]);
    let lines: Vec<&str> = out.lines().collect();
    lines
        .chunks(2)
        .filter(|c| c.len() == 2)
        .map(|c| (c[0].to_owned(), c[1].to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_than_n_holders_under_contention() {
    let redis = test_support::redis::shared();
    let name = unique_name("sem-n");
    let mut clients = Vec::new();
    for pool in [None, Some(4), None, Some(2)] {
        let mut options = RedisOptions::new();
        if let Some(size) = pool {
            options = options.pool_size(size);
        }
        clients.push(connect(&redis.url(), options).await);
    }
    let inside = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..16usize {
        let sem = clients[i % 4].semaphore(&name, 3).unwrap();
        let (inside, most, tokens) = (Arc::clone(&inside), Arc::clone(&most), Arc::clone(&tokens));
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                let g = sem.lock_timeout(SLACK * 4).await.unwrap().unwrap();
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                assert!(now <= 3, "{now} holders of 3 permits");
                tokens.lock().unwrap().push(g.fencing_token());
                tokio::time::sleep(Duration::from_millis(10)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                g.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(most.load(Ordering::SeqCst), 3, "no contention happened");
    let distinct: HashSet<u64> = tokens.lock().unwrap().iter().copied().collect();
    assert_eq!(distinct.len(), 80, "fencing tokens repeated");
    nothing_left(redis, &keys(&clients[0], &name)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_and_try_when_full_gets_nothing() {
    let redis = test_support::redis::shared();
    let name = unique_name("sem-tokens");
    let locks = connect(&redis.url(), RedisOptions::new()).await;
    let sem = locks.semaphore(&name, 2).unwrap();
    assert_eq!(sem.permits(), 2);
    let a = sem.try_lock().await.unwrap().unwrap();
    let b = sem.try_lock().await.unwrap().unwrap();
    assert!(b.fencing_token() > a.fencing_token());
    assert!(
        sem.try_lock().await.unwrap().is_none(),
        "a third permit of 2"
    );
    let timed = Instant::now();
    assert!(sem
        .lock_timeout(Duration::from_millis(300))
        .await
        .unwrap()
        .is_none());
    assert!(timed.elapsed() >= Duration::from_millis(300));
    let k = keys(&locks, &name);
    eventually("the timed-out waiter leaves the queue", || {
        redis.cli(&["EXISTS", &k.queue]) == "0"
    })
    .await;
    let last = b.fencing_token();
    a.release().await.unwrap();
    let c = sem.try_lock().await.unwrap().unwrap();
    assert!(c.fencing_token() > last);
    b.release().await.unwrap();
    c.release().await.unwrap();
    nothing_left(redis, &k).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_permit_is_reclaimed() {
    let redis = test_support::redis::shared();
    let name = unique_name("sem-expired");
    let a = connect(&redis.url(), RedisOptions::new()).await;
    let b = connect(&redis.url(), RedisOptions::new()).await;
    let ttl = Duration::from_millis(800);
    let crashed = a
        .with_lease(LeaseOptions::manual(ttl).unwrap())
        .unwrap()
        .semaphore(&name, 1)
        .unwrap()
        .lock()
        .await
        .unwrap();
    let held_from = Instant::now();
    std::mem::forget(crashed);
    drop(a);
    let g = b
        .semaphore(&name, 1)
        .unwrap()
        .lock_timeout(SLACK)
        .await
        .unwrap()
        .expect("the expired permit was reclaimed");
    assert!(held_from.elapsed() >= ttl - Duration::from_millis(100));
    g.release().await.unwrap();
    nothing_left(redis, &keys(&b, &name)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_number_of_permits_while_held_is_a_mismatch() {
    let redis = test_support::redis::shared();
    let name = unique_name("sem-mismatch");
    let a = connect(&redis.url(), RedisOptions::new()).await;
    let b = connect(&redis.url(), RedisOptions::new()).await;
    let k = keys(&a, &name);
    let g = a.semaphore(&name, 2).unwrap().lock().await.unwrap();
    for wait in [None, Some(Duration::from_millis(200))] {
        let sem = b.semaphore(&name, 3).unwrap();
        let got = match wait {
            None => sem.try_lock().await,
            Some(t) => sem.lock_timeout(t).await,
        };
        match got {
            Err(Error::PermitsMismatch {
                name: n,
                held,
                asked,
            }) => {
                assert_eq!((n.as_str(), held, asked), (name.as_str(), 2, 3));
            }
            other => panic!("expected a mismatch, got {other:?}"),
        }
    }
    assert_eq!(
        redis.cli(&["ZCARD", &k.holders]),
        "1",
        "the mismatch changed holders"
    );
    assert_eq!(redis.cli(&["GET", &k.permits]), "2");
    assert_eq!(redis.cli(&["EXISTS", &k.queue]), "0", "the mismatch queued");
    g.release().await.unwrap();
    // Nothing held: the next holder's number applies.
    let g3 = b
        .semaphore(&name, 3)
        .unwrap()
        .try_lock()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(redis.cli(&["GET", &k.permits]), "3");
    g3.release().await.unwrap();
    nothing_left(redis, &k).await;
}

/// One release wakes exactly one waiter across all providers: the first in
/// line (FIFO), by a message addressed to it; nobody else re-runs its script
/// (the others' queue entries are not refreshed). A stray plain message on
/// the channel wakes nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_release_wakes_exactly_one_waiter_across_providers() {
    let redis = test_support::redis::shared();
    let name = unique_name("sem-wake");
    let holder = connect(&redis.url(), RedisOptions::new()).await;
    // Long re-checks: only wake-ups make waiters try again.
    let mut waiting = Vec::new();
    for pool in [None, Some(2), None, Some(3)] {
        let mut options = RedisOptions::new().recheck_interval(Duration::from_secs(20));
        if let Some(size) = pool {
            options = options.pool_size(size);
        }
        waiting.push(connect(&redis.url(), options).await);
    }
    let wakeups = |c: &[RedisProvider]| c.iter().map(RedisProvider::wakeups).sum::<u64>();
    let k = keys(&holder, &name);
    let sem = holder
        .with_lease(long())
        .unwrap()
        .semaphore(&name, 2)
        .unwrap();
    let mut held = vec![sem.lock().await.unwrap(), sem.lock().await.unwrap()];
    let mut waiters = Vec::new();
    for i in 0..8 {
        let sem = waiting[i % 4]
            .with_lease(long())
            .unwrap()
            .semaphore(&name, 2)
            .unwrap();
        waiters.push(tokio::spawn(async move {
            sem.lock_timeout(Duration::from_secs(30)).await
        }));
        eventually("the waiter queues", || {
            redis.cli(&["ZCARD", &k.queue]) == (i + 1).to_string()
        })
        .await;
    }
    // Let every waiter finish its attempt after subscribing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let channel = format!("{{{}}}:sem:released", holder.lock_key(&name).unwrap());
    let before = wakeups(&waiting);
    assert_eq!(redis.cli(&["PUBLISH", &channel, "stray"]), "4");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(wakeups(&waiting), before, "a stray message woke a waiter");
    let by_arrival = |redis: &RedisServer| {
        let mut queue: Vec<(u64, String)> = scores(redis, &k.queue)
            .into_iter()
            .map(|(m, s)| (s.parse().unwrap(), m))
            .collect();
        queue.sort();
        queue.into_iter().map(|(_, m)| m).collect::<Vec<_>>()
    };
    for round in 0..2u64 {
        let queue = by_arrival(redis);
        let alive = scores(redis, &k.alive);
        let before = wakeups(&waiting);
        held.pop().unwrap().release().await.unwrap();
        eventually("a waiter gets the permit", || {
            redis.cli(&["ZCARD", &k.queue]) == (7 - round).to_string()
                && redis.cli(&["ZCARD", &k.holders]) == "2"
        })
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            wakeups(&waiting) - before,
            1,
            "one wake-up across the providers"
        );
        let after = scores(redis, &k.alive);
        assert!(
            !after.contains_key(&queue[0]),
            "the first in line did not get in"
        );
        assert_eq!(by_arrival(redis), queue[1..], "the queue order changed");
        for (member, score) in &after {
            assert_eq!(
                alive.get(member),
                Some(score),
                "a waiter that was not first in line tried again"
            );
        }
    }
    // The two first to queue won (FIFO); the six others still wait.
    let finished: Vec<bool> = waiters
        .iter()
        .map(tokio::task::JoinHandle::is_finished)
        .collect();
    assert_eq!(
        finished,
        [true, true, false, false, false, false, false, false]
    );
    let mut winners = Vec::new();
    for (i, w) in waiters.into_iter().enumerate() {
        if i < 2 {
            winners.push(w.await.unwrap().unwrap().expect("a winner"));
        } else {
            w.abort();
        }
    }
    for g in winners {
        g.release().await.unwrap();
    }
    nothing_left(redis, &k).await;
}

/// Acquisitions cancelled at random points while the semaphore is free,
/// and while it is full (so they queue): nothing is left held or queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquisitions_leave_nothing() {
    let redis = test_support::redis::shared();
    let proxy = Proxy::start(redis.addr());
    proxy.set_delay(Duration::from_micros(700));
    let mut rng = fastrand::Rng::with_seed(5);
    for (size, full) in [
        (None, false),
        (Some(4), false),
        (None, true),
        (Some(4), true),
    ] {
        let name = unique_name("sem-cancel");
        let mut options = RedisOptions::new();
        if let Some(size) = size {
            options = options.pool_size(size);
        }
        let locks = connect(&format!("redis://{}", proxy.addr()), options).await;
        let other = connect(&redis.url(), RedisOptions::new()).await;
        let k = keys(&locks, &name);
        let sem = locks
            .with_lease(long())
            .unwrap()
            .semaphore(&name, 2)
            .unwrap();
        let mut blockers = Vec::new();
        if full {
            for _ in 0..2 {
                blockers.push(other.semaphore(&name, 2).unwrap().lock().await.unwrap());
            }
        }
        let mut tasks = Vec::new();
        for _ in 0..120 {
            let sem = Arc::clone(&sem);
            let cut = Duration::from_micros(rng.u64(0..6000));
            tasks.push(tokio::spawn(async move {
                if let Ok(Ok(g)) = tokio::time::timeout(cut, sem.lock()).await {
                    drop(g);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        if full {
            eventually("the queue empties", || {
                redis.cli(&["EXISTS", &k.queue]) == "0"
            })
            .await;
            assert_eq!(redis.cli(&["ZCARD", &k.holders]), "2");
            for g in blockers {
                g.release().await.unwrap();
            }
        }
        nothing_left(redis, &k).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_acquire_reply_is_undone() {
    let redis = test_support::redis::shared();
    let proxy = Proxy::start(redis.addr());
    let name = unique_name("sem-lost-reply");
    let victim = connect(
        &format!("redis://{}", proxy.addr()),
        RedisOptions::new()
            .response_timeout(Duration::from_millis(300))
            .pool_size(2),
    )
    .await;
    let other = connect(&redis.url(), RedisOptions::new()).await;
    let k = keys(&victim, &name);
    let warm = victim
        .semaphore(&unique_name("warm-up"), 1)
        .unwrap()
        .lock()
        .await
        .unwrap();
    warm.release().await.unwrap();
    let sem = victim
        .with_lease(long())
        .unwrap()
        .semaphore(&name, 1)
        .unwrap();
    proxy.lose_reply_to(b"EVALSHA");
    let attempt = tokio::spawn(async move { sem.lock_timeout(Duration::from_secs(2)).await });
    eventually("the acquire lands", || {
        redis.cli(&["ZCARD", &k.holders]) == "1"
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
    let g = other
        .semaphore(&name, 1)
        .unwrap()
        .lock_timeout(SLACK * 2)
        .await
        .unwrap()
        .expect("the lost acquisition's permit was left for its whole TTL");
    g.release().await.unwrap();
    nothing_left(redis, &k).await;
}

#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_keys_share_one_slot_and_permits_hold() {
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
        let name = unique_name(&format!("sem-cluster{i}"));
        let k = keys(&a, &name);
        let slot = cluster.cli(&["CLUSTER", "KEYSLOT", &a.lock_key(&name).unwrap()]);
        for key in [&k.permits, &k.holders, &k.queue, &k.alive] {
            assert_eq!(cluster.cli(&["CLUSTER", "KEYSLOT", key]), slot, "{key}");
        }
        let g1 = a.semaphore(&name, 2).unwrap().lock().await.unwrap();
        let g2 = b.semaphore(&name, 2).unwrap().lock().await.unwrap();
        assert!(g2.fencing_token() > g1.fencing_token());
        assert!(a
            .semaphore(&name, 2)
            .unwrap()
            .try_lock()
            .await
            .unwrap()
            .is_none());
        assert!(matches!(
            b.semaphore(&name, 5).unwrap().try_lock().await,
            Err(Error::PermitsMismatch {
                held: 2,
                asked: 5,
                ..
            })
        ));
        let sem = b.semaphore(&name, 2).unwrap();
        let waiter = tokio::spawn(async move { sem.lock_timeout(SLACK).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        g1.release().await.unwrap();
        let g3 = waiter.await.unwrap().unwrap().expect("the waiter got in");
        assert!(g3.fencing_token() > g2.fencing_token());
        g2.release().await.unwrap();
        g3.release().await.unwrap();
    }
}

/// Bad state on the server is a typed error that takes nothing: an
/// exhausted fencing counter, a key of the wrong type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_counter_or_a_foreign_key_is_a_typed_error() {
    let redis = test_support::redis::shared();
    let name = unique_name("sem-bad");
    let locks = connect(&redis.url(), RedisOptions::new()).await;
    let k = keys(&locks, &name);
    let fence = format!("{{{}}}:sem:fence", locks.lock_key(&name).unwrap());
    let sem = locks.semaphore(&name, 2).unwrap();
    assert_eq!(redis.cli(&["SET", &fence, "9007199254740991"]), "OK");
    assert!(matches!(sem.try_lock().await, Err(Error::Exhausted { .. })));
    assert_eq!(redis.cli(&["EXISTS", &k.holders]), "0");
    assert_eq!(redis.cli(&["DEL", &fence]), "1");
    assert_eq!(redis.cli(&["SET", &k.holders, "not a zset"]), "OK");
    assert!(matches!(
        sem.lock_timeout(Duration::from_millis(200)).await,
        Err(Error::Conflict { .. })
    ));
    assert_eq!(redis.cli(&["DEL", &k.holders]), "1");
    let g = sem.try_lock().await.unwrap().unwrap();
    g.release().await.unwrap();
    nothing_left(redis, &k).await;
}

/// A waiter's attempt lands (it queues) but its reply is lost, then a
/// partition outlasts the wait: its queue entry goes when the connection
/// heals, not when the entry would expire (about 10 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_while_queueing_leaves_no_entry() {
    let redis = test_support::redis::shared();
    let proxy = Proxy::start(redis.addr());
    let name = unique_name("sem-lost-queue");
    let victim = connect(
        &format!("redis://{}", proxy.addr()),
        RedisOptions::new()
            .response_timeout(Duration::from_millis(300))
            .recheck_interval(Duration::from_secs(5)),
    )
    .await;
    let other = connect(&redis.url(), RedisOptions::new()).await;
    let k = keys(&victim, &name);
    let warm = victim
        .semaphore(&unique_name("warm-up"), 1)
        .unwrap()
        .lock()
        .await
        .unwrap();
    warm.release().await.unwrap();
    let held = other.semaphore(&name, 1).unwrap().lock().await.unwrap();
    let sem = victim
        .with_lease(long())
        .unwrap()
        .semaphore(&name, 1)
        .unwrap();
    proxy.lose_reply_to(b"EVALSHA");
    let attempt = tokio::spawn(async move { sem.lock_timeout(Duration::from_secs(2)).await });
    eventually("the waiter queues", || {
        redis.cli(&["ZCARD", &k.queue]) == "1"
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
    let got = tokio::time::timeout(SLACK * 2, attempt)
        .await
        .expect("the acquisition outlived its timeout")
        .unwrap();
    match got {
        Ok(None) => {}
        Ok(Some(_)) => panic!("acquired a permit that is held"),
        Err(e) => assert!(e.is_retryable(), "untyped failure: {e:?}"),
    }
    let left_at = Instant::now();
    eventually("the queue entry goes", || {
        redis.cli(&["EXISTS", &k.queue]) == "0"
    })
    .await;
    assert!(
        left_at.elapsed() < Duration::from_secs(4),
        "the entry had to expire"
    );
    held.release().await.unwrap();
    nothing_left(redis, &k).await;
}

/// A queued waiter whose connection is cut and blackholed keeps its
/// deadline within a response timeout or so, although the client's
/// reconnects may each take the 5 s connect timeout (as the mutex's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_through_a_partition_keeps_the_deadline() {
    let redis = test_support::redis::shared();
    let other = connect(&redis.url(), RedisOptions::new()).await;
    let proxy = Proxy::start(redis.addr());
    let options = RedisOptions::new().response_timeout(Duration::from_millis(300));
    let victim = connect(&format!("redis://{}", proxy.addr()), options).await;
    let name = unique_name("sem-deadline");
    let holder = other
        .with_lease(long())
        .unwrap()
        .semaphore(&name, 1)
        .unwrap()
        .lock()
        .await
        .unwrap();
    let sem = victim
        .with_lease(long())
        .unwrap()
        .semaphore(&name, 1)
        .unwrap();
    test_support::proxy::wait_keeps_its_deadline_through_a_partition(&proxy, sem, "semaphore")
        .await;
    holder.release().await.unwrap();
}
