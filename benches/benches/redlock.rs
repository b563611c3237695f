//! Redlock, uncontended: `cargo bench -p distlock-benches --bench redlock`.
//!
//! One lock + release, on the same independent redis-servers:
//!
//! * `redis/mutex`: distlock's single-master mutex on master 1 (the floor);
//! * `redlock/3`, `redlock/5`: distlock's Redlock over 3 and 5 masters;
//! * `rslock/3`, `rslock/5`: the peer `rslock` over the same masters.
//!
//! Two passes: criterion (one `BenchmarkId` each, run one after the
//! other), then an interleaved pass that times blocks of 10 operations of
//! each subject in turn, so machine noise hits all alike, and prints
//! medians (per operation) and ratios against the floor: the figures of
//! record. In both, work a subject leaves to the background (Redlock's
//! masters beyond a quorum finish after the call returns) is paid by its
//! own next operations. `DISTLOCK_BENCH_ROUNDS` sets the interleaved
//! operations per subject (default 2000).

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use distlock::redis::{RedisProvider, RedlockProvider};
use distlock::{Lock, Provider};
use test_support::masters::RedisMasters;

fn masters() -> &'static RedisMasters {
    static MASTERS: std::sync::OnceLock<RedisMasters> = std::sync::OnceLock::new();
    MASTERS.get_or_init(|| RedisMasters::start(5))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// The first `n` masters as a `redis+redlock://` URL.
fn redlock_url(n: usize) -> String {
    let m = masters();
    let hosts: Vec<String> = (0..n)
        .map(|i| format!("127.0.0.1:{}", m.node(i).port()))
        .collect();
    format!("redis+redlock://{}", hosts.join(","))
}

enum Subject {
    Distlock(Arc<dyn Lock>),
    Rslock(rslock::LockManager, &'static str),
}

impl Subject {
    async fn run(&self) {
        match self {
            Subject::Distlock(lock) => {
                let guard = lock.lock().await.expect("lock");
                guard.release().await.expect("release");
            }
            Subject::Rslock(manager, resource) => {
                let lock = manager
                    .lock(*resource, Duration::from_secs(30))
                    .await
                    .expect("rslock");
                manager.unlock(&lock).await;
            }
        }
    }
}

/// The subjects by label, floor first.
type Subjects = Vec<(String, Subject)>;

/// The subjects, and the providers kept alive alongside.
fn subjects(rt: &tokio::runtime::Runtime) -> (Subjects, Vec<Arc<dyn Provider>>) {
    let m = masters();
    let single: Arc<dyn Provider> = Arc::new(
        rt.block_on(RedisProvider::connect(&m.node(0).url()))
            .expect("redis"),
    );
    let mut providers = vec![Arc::clone(&single)];
    let mut out = vec![(
        "redis/mutex (master 1)".to_owned(),
        Subject::Distlock(single.mutex("bench/single").expect("name")),
    )];
    for n in [3usize, 5] {
        let redlock: Arc<dyn Provider> = Arc::new(
            rt.block_on(RedlockProvider::connect(&redlock_url(n)))
                .expect("redlock"),
        );
        out.push((
            format!("redlock/{n}"),
            Subject::Distlock(redlock.mutex(&format!("bench/redlock{n}")).expect("name")),
        ));
        providers.push(redlock);
    }
    for (n, resource) in [(3usize, "bench/rslock3"), (5, "bench/rslock5")] {
        let urls: Vec<String> = (0..n).map(|i| m.node(i).url()).collect();
        let manager = rt.block_on(async { rslock::LockManager::new(urls) });
        out.push((format!("rslock/{n}"), Subject::Rslock(manager, resource)));
    }
    (out, providers)
}

fn uncontended(c: &mut Criterion) {
    let rt = runtime();
    let (subjects, _providers) = subjects(&rt);
    let mut group = c.benchmark_group("redlock_uncontended_lock_release");
    group.throughput(Throughput::Elements(1));
    for (label, subject) in &subjects {
        group.bench_function(BenchmarkId::from_parameter(label), |b| {
            b.to_async(&rt).iter(|| subject.run());
        });
    }
    group.finish();
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Operations per timed block of the interleaved pass.
const BLOCK: u32 = 10;

fn interleaved(_: &mut Criterion) {
    let rounds: usize = std::env::var("DISTLOCK_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let rt = runtime();
    let (subjects, _providers) = subjects(&rt);
    let mut times: Vec<Vec<Duration>> = subjects.iter().map(|_| Vec::new()).collect();
    rt.block_on(async {
        for (_, s) in &subjects {
            for _ in 0..50 {
                s.run().await;
            }
        }
        for _ in 0..rounds.div_ceil(BLOCK as usize) {
            for (i, (_, s)) in subjects.iter().enumerate() {
                // A block of BLOCK operations back to back, timed as one:
                // work a subject leaves to the background (Redlock's masters
                // beyond a quorum) is paid by its own next operations, and
                // only the last one's can spill onto the next subject.
                let start = Instant::now();
                for _ in 0..BLOCK {
                    s.run().await;
                }
                times[i].push(start.elapsed() / BLOCK);
            }
        }
    });
    let medians: Vec<Duration> = times.into_iter().map(median).collect();
    let floor = medians[0].as_secs_f64();
    println!("\nRedlock, uncontended lock+release, interleaved blocks of {BLOCK}, {rounds} operations each:");
    println!("| subject | median | × single-master mutex |");
    println!("|---|---|---|");
    for ((label, _), m) in subjects.iter().zip(&medians) {
        println!(
            "| {label} | {:.1} µs | {:.2}× |",
            m.as_secs_f64() * 1e6,
            m.as_secs_f64() / floor
        );
    }
    for n in [3, 5] {
        let redlock = subjects
            .iter()
            .position(|(l, _)| *l == format!("redlock/{n}"));
        let rslock = subjects
            .iter()
            .position(|(l, _)| *l == format!("rslock/{n}"));
        if let (Some(a), Some(b)) = (redlock, rslock) {
            println!(
                "redlock/{n} against rslock/{n}: {:.2}×",
                medians[a].as_secs_f64() / medians[b].as_secs_f64()
            );
        }
    }
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
    targets = uncontended, interleaved
}
criterion_main!(benches);
