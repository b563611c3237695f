//! Nothing left behind: a name's fencing counter expires
//! the fence retention after the last lease on it could have ended, tokens
//! still increase across the expiry, renewals keep the counter while a lease
//! lives, and a force-release of a name nobody holds creates nothing.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use distlock_core::{Error, LeaseOptions, PrimitiveKind, Provider};
use distlock_redis::{RedisOptions, RedisProvider};
use test_support::unique_name;

async fn connect(retention: Duration) -> RedisProvider {
    let url = test_support::redis::shared().url();
    RedisProvider::connect_with(&url, RedisOptions::new().fence_retention(retention))
        .await
        .expect("connect to the test redis-server")
}

/// Every key of `name` (`*` around it: the lock key, `{name}:…`).
fn keys_of(name: &str) -> Vec<String> {
    let out = test_support::redis::shared().cli(&["KEYS", &format!("*{name}*")]);
    out.lines()
        .map(str::to_owned)
        .filter(|l| !l.is_empty())
        .collect()
}

async fn until_no_keys(name: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = keys_of(name);
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name}: keys left behind: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn lease() -> LeaseOptions {
    LeaseOptions::new(Duration::from_millis(500)).unwrap()
}

// A name used once and left alone for longer than the lease and a short
// retention leaves no key; the next lock on it still takes a higher token
// (the counter had no TTL before: it stayed forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unused_name_leaves_no_key_and_tokens_still_increase() {
    let locks = connect(Duration::from_millis(200)).await;
    for kind in ["mutex", "fair", "rw", "semaphore", "election"] {
        let name = unique_name(&format!("retention-{kind}"));
        let take = || async {
            match kind {
                "mutex" => {
                    let g = locks
                        .with_lease(lease())
                        .unwrap()
                        .mutex(&name)
                        .unwrap()
                        .lock()
                        .await;
                    let g = g.unwrap();
                    let t = g.fencing_token();
                    g.release().await.unwrap();
                    t
                }
                "fair" => {
                    let g = locks
                        .with_lease(lease())
                        .unwrap()
                        .fair_mutex(&name)
                        .unwrap()
                        .lock()
                        .await;
                    let g = g.unwrap();
                    let t = g.fencing_token();
                    g.release().await.unwrap();
                    t
                }
                "rw" => {
                    let rw = locks.with_lease(lease()).unwrap().rw_lock(&name).unwrap();
                    let g = rw.write().lock().await.unwrap();
                    let t = g.fencing_token();
                    g.release().await.unwrap();
                    t
                }
                "semaphore" => {
                    let s = locks
                        .with_lease(lease())
                        .unwrap()
                        .semaphore(&name, 2)
                        .unwrap();
                    let g = s.lock().await.unwrap();
                    let t = g.fencing_token();
                    g.release().await.unwrap();
                    t
                }
                _ => {
                    let e = locks.with_lease(lease()).unwrap().election(&name).unwrap();
                    let l = e.campaign("c").await.unwrap();
                    let t = l.term();
                    l.resign().await.unwrap();
                    t
                }
            }
        };
        let first = take().await;
        assert!(!keys_of(&name).is_empty(), "{kind}: the counter is there");
        until_no_keys(&name).await;
        let second = take().await;
        assert!(second > first, "{kind}: token {second} after {first}");
    }
    locks.close().await.unwrap();
}

// While a lease lives, its renewals keep the counter: the lock key never
// exists without it, long after the lease and the retention of the
// acquisition alone have passed (1 s + 300 ms; watched for 4 s). The lease
// is 1 s, renewed every third of it, so a loaded machine's scheduling does
// not lose it (a 300 ms lease did, once, under a load of 10 on 2 cores),
// and redis-cli runs off the runtime's workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_keep_the_counter_while_the_lease_lives() {
    let locks = connect(Duration::from_millis(300)).await;
    let redis = test_support::redis::shared();
    let name = unique_name("retention-renewed");
    let key = locks.lock_key(&name).unwrap();
    let fence = format!("{{{key}}}:fence");
    let guard = locks
        .with_lease(LeaseOptions::new(Duration::from_secs(1)).unwrap())
        .unwrap()
        .mutex(&name)
        .unwrap()
        .lock()
        .await
        .unwrap();
    let started = Instant::now();
    // Both read in one script: atomic.
    let both = "return {redis.call('EXISTS', KEYS[1]), redis.call('EXISTS', KEYS[2])}";
    let mut checked = 0;
    while started.elapsed() < Duration::from_secs(4) {
        let (key, fence) = (key.clone(), fence.clone());
        let out =
            tokio::task::spawn_blocking(move || redis.cli(&["EVAL", both, "2", &key, &fence]))
                .await
                .unwrap();
        let v: Vec<&str> = out.lines().collect();
        if v.first() == Some(&"1") {
            assert_eq!(v.get(1), Some(&"1"), "the lock lives, its counter went");
            checked += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(checked > 0, "the lease never showed");
    let token = guard.fencing_token();
    guard.release().await.unwrap();
    let guard = locks.mutex(&name).unwrap().lock().await.unwrap();
    assert!(guard.fencing_token() > token);
    guard.release().await.unwrap();
    locks.close().await.unwrap();
}

// `unlock --force` of a name nobody ever used: nothing evicted, no fence,
// and no key created (a `{name}:fence` counter was created before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_release_of_an_unused_name_creates_nothing() {
    let locks = connect(Duration::from_secs(3600)).await;
    for kind in [
        PrimitiveKind::Mutex,
        PrimitiveKind::FairMutex,
        PrimitiveKind::ReadWrite,
        PrimitiveKind::Semaphore,
        PrimitiveKind::Election,
    ] {
        let name = unique_name("force-unused");
        let done = locks.force_release(&name, kind).await.unwrap();
        assert_eq!(done.evicted, 0, "{kind}");
        assert_eq!(done.fence, None, "{kind}");
        assert!(keys_of(&name).is_empty(), "{kind}: {:?}", keys_of(&name));
    }
    // A held one: evicted, the counter advanced past the holder's token.
    let name = unique_name("force-held");
    let guard = locks.mutex(&name).unwrap().lock().await.unwrap();
    let done = locks
        .force_release(&name, PrimitiveKind::Mutex)
        .await
        .unwrap();
    assert_eq!(done.evicted, 1);
    assert!(done.fence.unwrap() > guard.fencing_token());
    drop(guard);
    locks.close().await.unwrap();
}

// The retention is an option of the URL too, and out of range is a typed
// error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retention_comes_from_the_url_and_is_bounded() {
    let url = test_support::redis::shared().url();
    let locks = RedisProvider::connect(&format!("{url}?fence_retention_ms=250"))
        .await
        .unwrap();
    assert_eq!(
        locks.options(),
        &RedisOptions::new().fence_retention(Duration::from_millis(250))
    );
    locks.close().await.unwrap();
    for bad in ["0", "50", "999999999999999"] {
        let r = RedisProvider::connect(&format!("{url}?fence_retention_ms={bad}")).await;
        assert!(matches!(r, Err(Error::InvalidOptions(_))), "{bad}: {r:?}");
    }
    let r = RedisProvider::connect(&format!("{url}?fence_retention_ms=soon")).await;
    assert!(matches!(r, Err(Error::InvalidUrl { .. })), "{r:?}");
}
