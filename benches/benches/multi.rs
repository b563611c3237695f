//! Several names at once (`LockSet`) against taking them one by one, in
//! process, on Redis and on ZooKeeper: `cargo bench -p distlock-benches --bench multi`.
//!
//! * `lock_all/<backend>/<n>`: `LockSet::lock` + `MultiGuard::release` of
//!   `n` names (taken in order, released all at once).
//! * `one_by_one/<backend>/<n>`: `lock` of each name in turn, then
//!   `release` of each in turn (what a caller writes by hand, in an order
//!   fixed by the caller).

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use distlock::mem::MemProvider;
use distlock::redis::RedisProvider;
use distlock::zk::{ZkOptions, ZkProvider};
use distlock::{LockSet, Provider};
use test_support::{RedisServer, ZkCluster};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn sets(c: &mut Criterion) {
    let rt = runtime();
    let redis = RedisServer::start();
    let zk = ZkCluster::standalone();
    let providers: Vec<(&str, Arc<dyn Provider>)> = vec![
        ("mem", Arc::new(MemProvider::new())),
        (
            "redis",
            Arc::new(
                rt.block_on(RedisProvider::connect(&redis.url()))
                    .expect("connect"),
            ),
        ),
        (
            "zk",
            Arc::new(
                rt.block_on(ZkProvider::connect_with(ZkOptions::new(
                    zk.connect_string(),
                )))
                .expect("zk"),
            ),
        ),
    ];
    let mut group = c.benchmark_group("multi");
    for (backend, provider) in &providers {
        for n in [2usize, 8] {
            let names: Vec<String> = (0..n).map(|i| format!("bench/multi/{n}/{i}")).collect();
            group.throughput(Throughput::Elements(1));
            let set = LockSet::new(provider.as_ref(), &names).expect("set");
            group.bench_function(BenchmarkId::new(format!("lock_all/{backend}"), n), |b| {
                b.to_async(&rt).iter(|| async {
                    let guard = set.lock().await.expect("lock");
                    guard.release().await.expect("release");
                });
            });
            let locks: Vec<_> = names
                .iter()
                .map(|n| provider.mutex(n).expect("mutex"))
                .collect();
            group.bench_function(BenchmarkId::new(format!("one_by_one/{backend}"), n), |b| {
                b.to_async(&rt).iter(|| async {
                    let mut guards = Vec::with_capacity(locks.len());
                    for lock in &locks {
                        guards.push(lock.lock().await.expect("lock"));
                    }
                    for guard in guards {
                        guard.release().await.expect("release");
                    }
                });
            });
        }
    }
    group.finish();
}

criterion_group!(benches, sets);
criterion_main!(benches);
