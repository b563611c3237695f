//! The Redis fence against a real redis-server: the fence conformance suite
//! over a single connection, a pool and (feature `cluster`) a 3-master
//! Cluster; the fenced writes one by one; wrong types; a lost reply.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use distlock_core::fence::{FenceToken, Highest};
use distlock_core::{Error, Provider};
use distlock_redis::redis::{self, AsyncCommands};
use distlock_redis::{GuardedScript, RedisFence, RedisOptions, RedisProvider};
use futures::future::BoxFuture;
use test_support::fence_conformance::{FenceFixture, FencedStore};

mod fenced_store;
use fenced_store::{Reader, Store};
use test_support::unique_name;

struct Single {
    options: RedisOptions,
}

impl FenceFixture for Single {
    fn store(&self) -> BoxFuture<'_, Arc<dyn FencedStore>> {
        Box::pin(async move {
            let url = test_support::redis::shared().url();
            let provider = RedisProvider::connect_with(&url, self.options.clone())
                .await
                .unwrap();
            let reader = Box::new(redis::Client::open(url.as_str()).unwrap());
            Arc::new(Store {
                fence: RedisFence::new(&provider),
                reader: Reader::Single(reader),
            }) as Arc<dyn FencedStore>
        })
    }
}

mod single {
    test_support::fence_conformance_suite!(super::Single {
        options: distlock_redis::RedisOptions::new()
    });
}

mod pool {
    test_support::fence_conformance_suite!(super::Single {
        options: distlock_redis::RedisOptions::new().pool_size(4)
    });
}

#[cfg(feature = "cluster")]
mod cluster {
    use std::sync::{Arc, OnceLock};

    use distlock_redis::{redis, RedisFence, RedisOptions, RedisProvider};
    use futures::future::BoxFuture;
    use test_support::fence_conformance::{FenceFixture, FencedStore};
    use test_support::redis::RedisCluster;

    use super::fenced_store::{Reader, Store};

    fn cluster() -> &'static RedisCluster {
        static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
        CLUSTER.get_or_init(|| RedisCluster::start(3))
    }

    pub(super) struct Cluster;

    impl FenceFixture for Cluster {
        fn store(&self) -> BoxFuture<'_, Arc<dyn FencedStore>> {
            Box::pin(async move {
                let urls = cluster().urls();
                let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
                let provider = RedisProvider::connect_cluster(&nodes, RedisOptions::new())
                    .await
                    .unwrap();
                let reader = redis::cluster::ClusterClient::new(urls.clone())
                    .unwrap()
                    .get_async_connection()
                    .await
                    .unwrap();
                Arc::new(Store {
                    fence: RedisFence::new(&provider),
                    reader: Reader::Cluster(reader),
                }) as Arc<dyn FencedStore>
            })
        }
    }

    mod suite {
        test_support::fence_conformance_suite!(super::Cluster);
    }

    /// Every fenced write on Cluster, keys with and without a hash tag:
    /// no CROSSSLOT, fences in their key's slot.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fenced_writes_run_on_any_master() {
        let c = cluster();
        let urls = c.urls();
        let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
        let provider = RedisProvider::connect_cluster(&nodes, RedisOptions::new())
            .await
            .unwrap();
        let fence = RedisFence::new(&provider);
        let t = distlock_core::fence::FenceToken::exclusive(5);
        for i in 0..12 {
            let plain = test_support::unique_name(&format!("k{i}"));
            let tagged = format!("{{{plain}}}:profile");
            for key in [&plain, &tagged] {
                let f = RedisFence::fence_key(key).unwrap();
                assert_eq!(
                    c.cli(&["CLUSTER", "KEYSLOT", key]),
                    c.cli(&["CLUSTER", "KEYSLOT", &f]),
                    "{key} / {f}"
                );
                fence.set(key, "v", t).await.unwrap();
                fence.hset(&format!("{key}h"), "f", 1, t).await.unwrap();
                assert_eq!(
                    fence.incr(&format!("{tagged}:n"), 2, t).await.unwrap() % 2,
                    0
                );
                assert!(fence.del(key, t).await.unwrap());
            }
        }
    }
}

async fn single_fence() -> (RedisFence, redis::aio::MultiplexedConnection) {
    let url = test_support::redis::shared().url();
    let provider = RedisProvider::connect(&url).await.unwrap();
    let conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    (RedisFence::new(&provider), conn)
}

fn x(t: u64) -> FenceToken {
    FenceToken::exclusive(t)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hset_del_incr_are_fenced_and_a_refusal_changes_nothing() {
    let (fence, mut conn) = single_fence().await;
    let h = unique_name("hash");
    assert!(fence.hset(&h, "a", "1", x(10)).await.unwrap());
    assert!(!fence.hset(&h, "a", "2", x(10)).await.unwrap());
    let e = fence.hset(&h, "a", "3", x(9)).await.unwrap_err();
    assert!(
        matches!(
            e,
            Error::Stale {
                token: 9,
                highest: 10
            }
        ),
        "{e:?}"
    );
    let a: String = conn.hget(&h, "a").await.unwrap();
    assert_eq!(a, "2");

    let n = unique_name("counter");
    assert_eq!(fence.incr(&n, 5, x(3)).await.unwrap(), 5);
    assert_eq!(fence.incr(&n, -2, x(4)).await.unwrap(), 3);
    assert!(fence.incr(&n, 100, x(3)).await.unwrap_err().is_stale());
    let v: i64 = conn.get(&n).await.unwrap();
    assert_eq!(v, 3);

    assert!(fence.del(&n, x(2)).await.unwrap_err().is_stale());
    assert!(fence.del(&n, x(4)).await.unwrap());
    assert!(!fence.del(&n, x(4)).await.unwrap());
    // The fence outlives the key: a stale holder stays out.
    assert!(fence.set(&n, 1, x(3)).await.unwrap_err().is_stale());
    let exists: bool = conn.exists(&n).await.unwrap();
    assert!(!exists);
    assert_eq!(
        fence.highest(&n).await.unwrap(),
        Highest {
            token: 4,
            exclusive: 4
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarded_script_runs_only_when_admitted() {
    let (fence, mut conn) = single_fence().await;
    let log = unique_name("log");
    let append = GuardedScript::new(
        "redis.call('RPUSH', KEYS[1], ARGV[1]) return redis.call('LLEN', KEYS[1])",
    );
    let n: i64 = fence
        .eval(&append, &log, &[&log], &["a"], x(7))
        .await
        .unwrap();
    assert_eq!(n, 1);
    let n: i64 = fence
        .eval(&append, &log, &[&log], &["b"], FenceToken::shared(8))
        .await
        .unwrap();
    assert_eq!(n, 2);
    let e = fence
        .eval::<i64, _>(&append, &log, &[&log], &["c"], x(6))
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Stale {
                token: 6,
                highest: 8
            }
        ),
        "{e:?}"
    );
    let items: Vec<String> = conn.lrange(&log, 0, -1).await.unwrap();
    assert_eq!(items, ["a", "b"]);
    // An error reply of the body records nothing.
    let fails = GuardedScript::new("return redis.error_reply('ERR mine')");
    let e = fence
        .eval::<(), &str>(&fails, &log, &[], &[], x(20))
        .await
        .unwrap_err();
    assert!(!e.is_stale() && !e.is_retryable(), "{e:?}");
    assert_eq!(fence.highest(&log).await.unwrap().token, 8);
    // A body returning nothing.
    let nothing = GuardedScript::new("local _ = 1");
    let () = fence
        .eval(&nothing, &log, &[], &[] as &[&str], x(9))
        .await
        .unwrap();
    assert_eq!(fence.highest(&log).await.unwrap().exclusive, 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_types_are_conflicts_and_record_nothing() {
    let (fence, mut conn) = single_fence().await;
    let list = unique_name("list");
    let () = conn.rpush(&list, "x").await.unwrap();
    let e = fence.hset(&list, "f", "v", x(5)).await.unwrap_err();
    assert!(e.is_conflict(), "{e:?}");
    let e = fence.incr(&list, 1, x(5)).await.unwrap_err();
    assert!(!e.is_stale(), "{e:?}");
    assert_eq!(fence.highest(&list).await.unwrap(), Highest::default());

    // A fence key that is not a fence: of another type, or a hash with
    // foreign fields.
    let key = unique_name("foreign");
    let f = RedisFence::fence_key(&key).unwrap();
    let () = conn.set(&f, "not a hash").await.unwrap();
    assert!(fence.set(&key, 1, x(1)).await.unwrap_err().is_conflict());
    assert!(fence.highest(&key).await.unwrap_err().is_conflict());
    let () = conn.del(&f).await.unwrap();
    let () = conn.hset(&f, "token", "soon").await.unwrap();
    let e = fence.set(&key, 1, x(1)).await.unwrap_err();
    assert!(e.is_conflict(), "{e:?}");
    assert!(fence.highest(&key).await.unwrap_err().is_conflict());
    let exists: bool = conn.exists(&key).await.unwrap();
    assert!(!exists);

    // A key with a '}' and no hash tag: refused before any command.
    assert!(fence
        .set("a}b", 1, x(1))
        .await
        .unwrap_err()
        .is_invalid_input());
}

/// The reply of a fenced write is lost after the write landed: the caller
/// sees a retryable error (never "admitted" nor "stale"), and the retry with
/// the same token is admitted as the same holder's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_is_retryable_and_the_retry_is_admitted_as_equal() {
    let server = test_support::redis::shared();
    let proxy = test_support::Proxy::start(server.addr());
    let options = RedisOptions::new().response_timeout(Duration::from_millis(500));
    let provider = RedisProvider::connect_with(&format!("redis://{}", proxy.addr()), options)
        .await
        .unwrap();
    let fence = RedisFence::new(&provider);
    let key = unique_name("lost");
    fence.set(&key, "first", x(5)).await.unwrap();
    let marker = format!("lost-reply-{}", fastrand::u64(..));
    proxy.lose_reply_to(marker.as_bytes());
    let e = fence.set(&key, marker.as_str(), x(6)).await.unwrap_err();
    assert!(e.is_retryable() && !e.is_stale(), "{e:?}");
    assert!(
        proxy.swallowed_some(test_support::conformance::SLACK).await,
        "no reply was lost"
    );
    // The proxy swallows every reply from then on: cut, the client
    // reconnects.
    proxy.cut();
    // It landed.
    assert_eq!(server.cli(&["GET", &key]), marker);
    assert_eq!(fence.highest(&key).await.unwrap().token, 6);
    // The retry: admitted (equal token), the same write again.
    fence.set(&key, marker.as_str(), x(6)).await.unwrap();
    assert_eq!(server.cli(&["GET", &key]), marker);
    // The lost reply of a refused write is no admission either.
    proxy.lose_reply_to(b"stale-and-lost");
    let e = fence.set(&key, "stale-and-lost", x(4)).await.unwrap_err();
    assert!(e.is_retryable(), "{e:?}");
    assert!(proxy.swallowed_some(test_support::conformance::SLACK).await);
    proxy.cut();
    assert!(matches!(
        fence.set(&key, "stale-and-lost", x(4)).await.unwrap_err(),
        Error::Stale {
            token: 4,
            highest: 6
        }
    ));
    assert_eq!(server.cli(&["GET", &key]), marker);
    provider.close().await.unwrap();
}

/// A key's fence is no key to write through a fence: `del`, `hset` (of its
/// own fields), `set`, `incr`, `admit` and a guarded script (as its
/// resource or among its keys) on `{k}:distlock:highest` are
/// `Error::InvalidName`, sent to no server, and `k`'s highest is what it
/// was: a stale token on `k` stays refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_cannot_be_written_through_a_fence() {
    let (fence, mut conn) = single_fence().await;
    let k = unique_name("fenced");
    fence.set(&k, "hundred", x(100)).await.unwrap();
    let before = fence.highest(&k).await.unwrap();
    let tagged = format!("{{{k}}}:profile");
    fence.set(&tagged, "p", x(100)).await.unwrap();
    let wipe = GuardedScript::new("return redis.call('DEL', KEYS[1])");
    let other = unique_name("other");
    for f in [
        RedisFence::fence_key(&k).unwrap(),
        RedisFence::fence_key(&tagged).unwrap(),
    ] {
        let raw_before: Vec<(String, String)> = conn.hgetall(&f).await.unwrap();
        assert!(!raw_before.is_empty(), "{f}");
        for t in [x(5), x(1000)] {
            let invalid = |e: Error| matches!(e, Error::InvalidName { .. });
            assert!(invalid(fence.del(&f, t).await.unwrap_err()), "del {f}");
            assert!(invalid(fence.hset(&f, "token", 5, t).await.unwrap_err()));
            assert!(invalid(
                fence.hset(&f, "exclusive", 5, t).await.unwrap_err()
            ));
            assert!(invalid(fence.set(&f, 5, t).await.unwrap_err()));
            assert!(invalid(fence.incr(&f, -95, t).await.unwrap_err()));
            assert!(invalid(fence.admit(&f, t).await.unwrap_err()));
            assert!(invalid(
                fence
                    .eval::<i64, &str>(&wipe, &f, &[&f], &[], t)
                    .await
                    .unwrap_err()
            ));
            assert!(invalid(
                fence
                    .eval::<i64, &str>(&wipe, &other, &[&f], &[], t)
                    .await
                    .unwrap_err()
            ));
            assert!(invalid(fence.highest(&f).await.unwrap_err()));
            assert!(invalid(RedisFence::fence_key(&f).unwrap_err()));
        }
        let raw_after: Vec<(String, String)> = conn.hgetall(&f).await.unwrap();
        assert_eq!(raw_after, raw_before, "{f}");
    }
    assert_eq!(fence.highest(&k).await.unwrap(), before);
    assert_eq!(fence.highest(&tagged).await.unwrap(), before);
    assert!(fence.set(&k, "five", x(5)).await.unwrap_err().is_stale());
    let v: String = conn.get(&k).await.unwrap();
    assert_eq!(v, "hundred");
    assert_eq!(
        fence.highest(&other).await.unwrap(),
        Highest::default(),
        "a refused script admitted nothing on its resource"
    );
}

/// A lock's internals (its fencing counter, line, queue, records) are no
/// keys to write through a fence either: every fenced write on them is
/// `Error::InvalidName`, the counter keeps its value and the next holder's
/// token is still above the last one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locks_internals_cannot_be_written_through_a_fence() {
    let (fence, mut conn) = single_fence().await;
    let url = test_support::redis::shared().url();
    let locks = RedisProvider::connect(&url).await.unwrap();
    let name = unique_name("locked");
    let first = locks.mutex(&name).unwrap().lock().await.unwrap();
    let token = first.fencing_token();
    let counter = format!("{{{name}}}:fence");
    let counted: String = conn.get(&counter).await.unwrap();
    let high = x(u64::MAX);
    for suffix in [
        "fence",
        "released",
        "holder",
        "revoke",
        "waiting",
        "waiting:alive",
        "listening",
        "handoff",
        "fair:queue",
        "fair:timeouts",
        "fair:owners",
        "elect",
        "elect:fence",
        "rw:fence",
        "sem:fence",
        "ids",
        "redlock:fence",
    ] {
        let key = format!("{{{name}}}:{suffix}");
        let invalid = |e: Error| matches!(e, Error::InvalidName { .. });
        assert!(invalid(fence.del(&key, high).await.unwrap_err()), "{key}");
        assert!(invalid(fence.set(&key, "1", high).await.unwrap_err()));
        assert!(invalid(fence.incr(&key, -1, high).await.unwrap_err()));
        assert!(invalid(fence.hset(&key, "f", "v", high).await.unwrap_err()));
    }
    let after: String = conn.get(&counter).await.unwrap();
    assert_eq!(after, counted);
    first.release().await.unwrap();
    let second = locks.mutex(&name).unwrap().lock().await.unwrap();
    assert!(second.fencing_token() > token);
    second.release().await.unwrap();
}
