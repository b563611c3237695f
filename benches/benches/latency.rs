//! Uncontended latency with its floors, and id generation, side by side on
//! the same servers: `cargo bench -p distlock-benches --bench latency`.
//!
//! * `floor`: one Redis round trip (`PING`); raw `SET NX PX` + `EVALSHA`
//!   compare-and-delete on one connection; raw ZooKeeper create + delete of
//!   an ephemeral sequential node.
//! * `uncontended_lock_release`: lock + release on every backend, and the
//!   peer `rslock` on the same redis-server.
//! * `ids`: one id, for block sizes 1, 100 and 1000.

use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use distlock::mem::MemProvider;
use distlock::redis::redis;
use distlock::redis::{RedisOptions, RedisProvider};
use distlock::zk::zookeeper_client::{self, Acls, CreateMode};
use distlock::zk::{ZkOptions, ZkProvider};
use distlock::Provider;
use test_support::{RedisServer, ZkCluster};

struct Servers {
    redis: RedisServer,
    zk: ZkCluster,
}

fn servers() -> &'static Servers {
    static SERVERS: std::sync::OnceLock<Servers> = std::sync::OnceLock::new();
    SERVERS.get_or_init(|| Servers {
        redis: RedisServer::start(),
        zk: ZkCluster::standalone(),
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

const RELEASE_LUA: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

fn floors(c: &mut Criterion) {
    let rt = runtime();
    let s = servers();
    let mut group = c.benchmark_group("floor");
    group.throughput(Throughput::Elements(1));
    let client = redis::Client::open(s.redis.url()).expect("url");
    let conn = rt
        .block_on(client.get_multiplexed_async_connection())
        .expect("connect");
    group.bench_function(BenchmarkId::from_parameter("redis/ping"), |b| {
        b.to_async(&rt).iter(|| {
            let mut conn = conn.clone();
            async move {
                let _: String = redis::cmd("PING")
                    .query_async(&mut conn)
                    .await
                    .expect("ping");
            }
        });
    });
    let release = redis::Script::new(RELEASE_LUA);
    group.bench_function(
        BenchmarkId::from_parameter("redis/set_nx_px+evalsha_del"),
        |b| {
            b.to_async(&rt).iter(|| {
                let mut conn = conn.clone();
                let release = &release;
                async move {
                    let ok: Option<String> = redis::cmd("SET")
                        .arg("floor/key")
                        .arg("token")
                        .arg("NX")
                        .arg("PX")
                        .arg(30_000)
                        .query_async(&mut conn)
                        .await
                        .expect("set");
                    assert!(ok.is_some());
                    let deleted: i64 = release
                        .key("floor/key")
                        .arg("token")
                        .invoke_async(&mut conn)
                        .await
                        .expect("release");
                    assert_eq!(deleted, 1);
                }
            });
        },
    );
    let zk = rt
        .block_on(zookeeper_client::Client::connect(&s.zk.connect_string()))
        .expect("zk connect");
    let open = CreateMode::Persistent.with_acls(Acls::anyone_all());
    rt.block_on(zk.mkdir("/floor", &open)).expect("mkdir");
    let ephemeral = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
    group.bench_function(BenchmarkId::from_parameter("zk/create+delete"), |b| {
        b.to_async(&rt).iter(|| {
            let (zk, ephemeral) = (&zk, &ephemeral);
            async move {
                let (_, seq) = zk
                    .create("/floor/n-", &[], ephemeral)
                    .await
                    .expect("create");
                zk.delete(&format!("/floor/n-{seq}"), None)
                    .await
                    .expect("delete");
            }
        });
    });
    group.finish();
}

fn uncontended(c: &mut Criterion) {
    let rt = runtime();
    let s = servers();
    let mem = MemProvider::new();
    let redis = rt
        .block_on(RedisProvider::connect(&s.redis.url()))
        .expect("redis");
    let redis_pool = rt
        .block_on(RedisProvider::connect_with(
            &s.redis.url(),
            RedisOptions::new().pool_size(4),
        ))
        .expect("redis pool");
    let zk = rt
        .block_on(ZkProvider::connect_with(ZkOptions::new(
            s.zk.connect_string(),
        )))
        .expect("zk");
    let mut group = c.benchmark_group("uncontended_lock_release");
    group.throughput(Throughput::Elements(1));
    let locks: Vec<(&str, Arc<dyn distlock::Lock>)> = vec![
        ("mem/mutex", mem.mutex("bench/u").expect("name")),
        ("redis/mutex", redis.mutex("bench/u").expect("name")),
        (
            "redis/mutex(pool)",
            redis_pool.mutex("bench/upool").expect("name"),
        ),
        ("zk/fair_mutex", zk.fair_mutex("bench/ufair").expect("name")),
        ("zk/unfair_mutex", zk.mutex("bench/uunfair").expect("name")),
    ];
    for (label, lock) in &locks {
        group.bench_function(BenchmarkId::from_parameter(label), |b| {
            b.to_async(&rt).iter(|| async {
                let guard = lock.lock().await.expect("lock");
                guard.release().await.expect("release");
            });
        });
    }
    let rslock = rslock::LockManager::new(vec![s.redis.url()]);
    group.bench_function(BenchmarkId::from_parameter("rslock"), |b| {
        b.to_async(&rt).iter(|| async {
            let lock = rslock
                .lock("bench/rslock", Duration::from_secs(30))
                .await
                .expect("rslock");
            rslock.unlock(&lock).await;
        });
    });
    group.finish();
}

fn ids(c: &mut Criterion) {
    let rt = runtime();
    let s = servers();
    let redis = rt
        .block_on(RedisProvider::connect(&s.redis.url()))
        .expect("redis");
    let zk = rt
        .block_on(ZkProvider::connect_with(ZkOptions::new(
            s.zk.connect_string(),
        )))
        .expect("zk");
    let mut group = c.benchmark_group("ids");
    group.throughput(Throughput::Elements(1));
    for block in [1u64, 100, 1000] {
        for (backend, provider) in [
            ("redis", &redis as &dyn Provider),
            ("zk", &zk as &dyn Provider),
        ] {
            let ids = provider
                .id_generator(&format!("bench/ids-{block}"), block)
                .expect("ids");
            group.bench_function(BenchmarkId::new(format!("{backend}/block"), block), |b| {
                b.to_async(&rt).iter(|| async {
                    ids.next().await.expect("id");
                });
            });
        }
    }
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = floors, uncontended, ids
}
criterion_main!(benches);
