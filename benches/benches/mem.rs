//! In-process backend: uncontended lock+release and throughput under
//! contention. `cargo bench -p distlock-benches --bench mem`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use distlock::mem::MemProvider;
use distlock::Provider;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn uncontended(c: &mut Criterion) {
    let rt = runtime();
    let locks = MemProvider::new();
    let mut group = c.benchmark_group("uncontended_lock_release");
    group.throughput(Throughput::Elements(1));
    for (label, lock) in [
        ("mem/mutex", locks.mutex("bench/unfair").expect("name")),
        (
            "mem/fair_mutex",
            locks.fair_mutex("bench/fair").expect("name"),
        ),
    ] {
        group.bench_function(BenchmarkId::from_parameter(label), |b| {
            b.to_async(&rt).iter(|| async {
                let guard = lock.lock().await.expect("lock");
                guard.release().await.expect("release");
            });
        });
    }
    group.finish();
}

fn contention(c: &mut Criterion) {
    let rt = runtime();
    let locks = MemProvider::new();
    let mut group = c.benchmark_group("contention_acquisitions");
    group.measurement_time(Duration::from_secs(3));
    for contenders in [1u64, 4, 16, 64] {
        group.throughput(Throughput::Elements(contenders));
        group.bench_with_input(
            BenchmarkId::new("mem/mutex", contenders),
            &contenders,
            |b, &n| {
                b.to_async(&rt).iter_custom(|iters| {
                    let lock = locks.mutex("bench/contended").expect("name");
                    async move {
                        let start = Instant::now();
                        let mut tasks = Vec::new();
                        for _ in 0..n {
                            let lock = Arc::clone(&lock);
                            tasks.push(tokio::spawn(async move {
                                for _ in 0..iters {
                                    let g = lock.lock().await.expect("lock");
                                    g.release().await.expect("release");
                                }
                            }));
                        }
                        for t in tasks {
                            t.await.expect("task");
                        }
                        start.elapsed()
                    }
                });
            },
        );
    }
    group.finish();
}

criterion_group!(benches, uncontended, contention);
criterion_main!(benches);
