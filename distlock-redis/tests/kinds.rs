//! One name is one lock on Redis, beyond the cross-kind suite
//! (`conformance.rs`, `kinds`): the marker another kind keeps in the
//! mutex's lock key expires with a dead holder, `inspect` and
//! `force_release` of the mutex leave it alone, a redis-py `Lock` waits
//! for it, and the plain mutex's uncontended acquire and release cost the
//! same server calls as before.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::process::Stdio;
use std::time::{Duration, Instant};

use distlock_core::{LeaseOptions, PrimitiveKind, Provider};
use distlock_redis::{RedisOptions, RedisProvider};
use test_support::unique_name;

const SLACK: Duration = Duration::from_secs(3);

async fn connect(url: &str) -> RedisProvider {
    RedisProvider::connect_with(
        url,
        RedisOptions::new().recheck_interval(Duration::from_millis(100)),
    )
    .await
    .unwrap()
}

/// A semaphore and a read-write lock whose holder died (its guard
/// forgotten, no watchdog): the mutex is refused with `Conflict` until the
/// lease runs out, then gets in; nothing of the marker outlives the hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_holders_marker_expires_with_its_lease() {
    let redis = test_support::redis::shared();
    let p = connect(&redis.url()).await;
    let short = LeaseOptions::manual(Duration::from_millis(800)).unwrap();
    for kind in ["semaphore", "rw"] {
        let name = unique_name("dead-marker");
        let guard = if kind == "semaphore" {
            p.with_lease(short)
                .unwrap()
                .semaphore(&name, 3)
                .unwrap()
                .try_lock()
                .await
        } else {
            p.with_lease(short)
                .unwrap()
                .rw_lock(&name)
                .unwrap()
                .read()
                .try_lock()
                .await
        };
        std::mem::forget(guard.unwrap().unwrap());
        let mutex = p.mutex(&name).unwrap();
        let refused = mutex.try_lock().await;
        assert!(
            refused
                .as_ref()
                .is_err_and(distlock_core::Error::is_conflict),
            "{kind}: {refused:?}"
        );
        let deadline = Instant::now() + SLACK * 2;
        let g = loop {
            match mutex.try_lock().await {
                Ok(Some(g)) => break g,
                Ok(None) => panic!("{kind}: the mutex waits: a marker is not a mutex hold"),
                Err(e) if e.is_conflict() => {}
                Err(e) => panic!("{kind}: {e}"),
            }
            assert!(
                Instant::now() < deadline,
                "{kind}: the marker outlived the lease"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        g.release().await.unwrap();
    }
}

/// While a read-write lock holds, the mutex's `inspect` shows no holder
/// (the marker is no mutex hold) and its `force_release` evicts nothing
/// and leaves the marker: the mutex is still refused, the reader still
/// holds. The read-write lock's own `inspect` shows its reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mutexs_inspect_and_force_release_leave_another_kind_alone() {
    let redis = test_support::redis::shared();
    let p = connect(&redis.url()).await;
    let name = unique_name("marker-ops");
    let reader = p.rw_lock(&name).unwrap().read().lock().await.unwrap();
    let seen = p.inspect(&name, PrimitiveKind::Mutex).await.unwrap();
    assert!(seen.holders.is_empty(), "{seen:?}");
    let seen = p.inspect(&name, PrimitiveKind::FairMutex).await.unwrap();
    assert!(seen.holders.is_empty(), "{seen:?}");
    let seen = p.inspect(&name, PrimitiveKind::ReadWrite).await.unwrap();
    assert_eq!(seen.holders.len(), 1, "{seen:?}");
    let forced = p.force_release(&name, PrimitiveKind::Mutex).await.unwrap();
    assert_eq!(forced.evicted, 0);
    let refused = p.mutex(&name).unwrap().try_lock().await;
    assert!(
        refused
            .as_ref()
            .is_err_and(distlock_core::Error::is_conflict),
        "{refused:?}"
    );
    assert!(reader.is_held());
    reader.release().await.unwrap();
    let keys = redis.cli(&["EXISTS", &name]);
    assert_eq!(keys, "0", "the marker outlived the last holder");
}

fn redis_py(url: &str, key: &str, args: &[&str]) -> std::process::Child {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/redis_py_lock.py");
    std::process::Command::new("python3")
        .arg(script)
        .args([url, key])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs (scripts/install-servers.sh installs redis-py)")
}

fn output(child: std::process::Child) -> String {
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "redis-py helper failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A redis-py `Lock` on a name a semaphore holds is busy (its `SET NX` fails
/// on the marker) and gets in once the semaphore is released; a semaphore
/// on a name redis-py holds is refused with `Conflict`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_waits_for_a_semaphore_and_refuses_one() {
    let redis = test_support::redis::shared();
    let url = redis.url();
    let p = connect(&url).await;
    let name = unique_name("py-kind");
    let permit = p.semaphore(&name, 2).unwrap().lock().await.unwrap();
    let py = {
        let (url, key) = (url.clone(), name.clone());
        tokio::task::spawn_blocking(move || output(redis_py(&url, &key, &["try"])))
    };
    assert_eq!(py.await.unwrap(), "busy");
    permit.release().await.unwrap();
    let holder = redis_py(&url, &name, &["hold", "1"]);
    let deadline = Instant::now() + test_support::PEER_START;
    while redis.cli(&["EXISTS", &name]) != "1" {
        assert!(Instant::now() < deadline, "redis-py never took the lock");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let refused = p.semaphore(&name, 2).unwrap().try_lock().await;
    assert!(
        refused
            .as_ref()
            .is_err_and(distlock_core::Error::is_conflict),
        "{refused:?}"
    );
    let out = tokio::task::spawn_blocking(move || output(holder))
        .await
        .unwrap();
    assert_eq!(out, "acquired\nreleased");
}

/// Every server call (`INFO commandstats`, scripts' calls included) of one
/// command, summed.
fn all_calls(redis: &test_support::RedisServer) -> u64 {
    redis
        .cli(&["INFO", "commandstats"])
        .lines()
        .filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// The plain mutex's uncontended `try_lock` + `release` costs no more
/// server calls than before the kind check (the marker is read only on the
/// acquire's failure path; the release script is unchanged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mutexs_uncontended_calls_do_not_grow() {
    let redis = test_support::RedisServer::start();
    let p = connect(&redis.url()).await;
    let name = unique_name("calls");
    let mutex = p.mutex(&name).unwrap();
    // Warm up: scripts loaded, connection made.
    mutex
        .try_lock()
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
    let before = all_calls(&redis);
    for _ in 0..10 {
        mutex
            .try_lock()
            .await
            .unwrap()
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let per_pair = (all_calls(&redis) - before) / 10;
    println!("server calls per uncontended try_lock + release: {per_pair}");
    assert!(per_pair <= PER_PAIR, "{per_pair} server calls per pair");
}

/// What the pair cost before the kind check, every call the server counts
/// (`EVALSHA` and the scripts' calls), measured with this test on the old
/// code (b1cdfc2); an upper bound, so that cutting the hot path passes.
const PER_PAIR: u64 = 13;

/// A name that looks like another's internal key (`X:fence`, `X:holder`,
/// `X:elect`, `X:sem:permits`…) is a lock of its own: held with `X`, and
/// `X`'s fencing tokens go on from where they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_that_looks_like_an_internal_key_is_an_independent_lock() {
    let redis = test_support::redis::shared();
    let locks = connect(&redis.url()).await;
    let x = unique_name("suffix");
    let held = locks.mutex(&x).unwrap().try_lock().await.unwrap().unwrap();
    let first = held.fencing_token();
    let mut beside = Vec::new();
    for suffix in [
        "fence",
        "released",
        "holder",
        "revoke",
        "waiting",
        "handoff",
        "listening",
        "elect",
        "ids",
        "rw:writer",
        "sem:permits",
        "fair:queue",
        "redlock:fence",
    ] {
        let name = format!("{x}:{suffix}");
        let guard = locks.mutex(&name).unwrap().try_lock().await.unwrap();
        beside.push(guard.unwrap_or_else(|| panic!("{name} is not free")));
        // The name is a lock of its own: another kind on it is refused.
        let permit = locks.semaphore(&name, 1).unwrap().try_lock().await;
        assert!(
            permit
                .as_ref()
                .is_err_and(distlock_core::Error::is_conflict),
            "{name}: {permit:?}"
        );
    }
    let inspected = locks.inspect(&x, PrimitiveKind::Mutex).await.unwrap();
    assert_eq!(inspected.holders.len(), 1, "{inspected:?}");
    assert_eq!(inspected.holders[0].fencing_token, Some(first));
    for guard in beside {
        guard.release().await.unwrap();
    }
    held.release().await.unwrap();
    let next = locks.mutex(&x).unwrap().try_lock().await.unwrap().unwrap();
    assert!(next.fencing_token() > first);
    next.release().await.unwrap();
}
