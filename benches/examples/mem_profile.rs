//! What a waiting `lock()` future keeps on the heap, allocation by
//! allocation: for the Redis mutex and fair mutex and the ZooKeeper fair
//! and unfair mutexes, K = 200 futures wait on a held lock, driven by one
//! task, and a counting allocator reports the live allocations they added,
//! by size, per waiter (the `processes` bench's "heap per waiting future"
//! is the same figure read from glibc, with malloc's chunk headers).
//!
//! ```sh
//! cargo run --release -p distlock-benches --example mem_profile
//! # only some, and where the live allocations of one size come from:
//! DISTLOCK_MEM_ONLY=redis-fair DISTLOCK_MEM_TRACE=184 \
//!     CARGO_PROFILE_RELEASE_DEBUG=1 \
//!     cargo run --release -p distlock-benches --example mem_profile
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::redis::RedisProvider;
use distlock::zk::{ZkOptions, ZkProvider};
use distlock::{Lock, Provider};
use distlock_benches::AllPending;

/// Waiting futures per implementation.
const K: usize = 200;
/// Sizes at or above this are counted together.
const MAX: usize = 16384;

static COUNTS: [AtomicI64; MAX + 1] = [const { AtomicI64::new(0) }; MAX + 1];
static ON: AtomicBool = AtomicBool::new(false);
static TRACE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static TRACING: Cell<bool> = const { Cell::new(false) };
}

/// Counts live allocations by size while `ON`.
struct Counting;

fn counted(size: usize, delta: i64, ptr: *mut u8) {
    if ON.load(Ordering::Relaxed) {
        COUNTS[size.min(MAX)].fetch_add(delta, Ordering::Relaxed);
        if size == TRACE.load(Ordering::Relaxed) {
            trace(delta, ptr as usize);
        }
    }
}

/// The allocations of the traced size made while counting, with where they
/// were made (resolved only when printed): those still live at the count
/// are the ones a waiter keeps.
static TRACES: std::sync::Mutex<Vec<(usize, std::backtrace::Backtrace)>> =
    std::sync::Mutex::new(Vec::new());

fn trace(delta: i64, ptr: usize) {
    TRACING.with(|busy| {
        if busy.replace(true) {
            return;
        }
        let mut traces = TRACES
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if delta > 0 {
            if traces.len() < 4 * K {
                traces.push((ptr, std::backtrace::Backtrace::force_capture()));
            }
        } else if let Some(i) = traces.iter().position(|(p, _)| *p == ptr) {
            drop(traces.swap_remove(i));
        }
        drop(traces);
        busy.set(false);
    });
}

/// Prints where two of the traced allocations still live were made.
fn print_traces(size: usize) {
    let traces = std::mem::take(
        &mut *TRACES
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    eprintln!("{} live allocations of {size} B traced", traces.len());
    for (_, trace) in traces.iter().take(2) {
        let trace = trace.to_string();
        let ours: Vec<&str> = trace
            .lines()
            .filter(|l| {
                l.contains("distlock")
                    || l.contains("zookeeper")
                    || l.contains("redis::")
                    || l.contains("asyncs")
            })
            .take(16)
            .collect();
        eprintln!("--- a live allocation of {size} B:\n{}", ours.join("\n"));
    }
}

// SAFETY: every call is forwarded to the system allocator unchanged; the
// counting touches only atomics (and, tracing one size, a mutex guarded
// against re-entry).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc`, passed on.
        let ptr = unsafe { System.alloc(layout) };
        counted(layout.size(), 1, ptr);
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        counted(layout.size(), -1, ptr);
        // SAFETY: the caller's contract for `dealloc`, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        counted(layout.size(), -1, ptr);
        // SAFETY: the caller's contract for `realloc`, passed on.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        counted(new_size, 1, new);
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// K waiting futures on `lock` while `holder` (another provider) holds it.
/// How long the waiters get to reach their wait before the count:
/// `DISTLOCK_MEM_SETTLE_SECS`, 2 s by default.
fn settle() -> Duration {
    std::env::var("DISTLOCK_MEM_SETTLE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(Duration::from_secs(2), Duration::from_secs_f64)
}

async fn profile(label: &str, holder: &Arc<dyn Lock>, lock: &Arc<dyn Lock>) {
    let held = holder.lock().await.expect("hold");
    // One waiter first: the per-provider machinery is not per waiter.
    let first = {
        let lock = Arc::clone(lock);
        tokio::spawn(async move { lock.lock().await })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut slots = Vec::with_capacity(K);
    for count in &COUNTS {
        count.store(0, Ordering::SeqCst);
    }
    ON.store(true, Ordering::SeqCst);
    for _ in 0..K {
        slots.push(Some(lock.lock()));
    }
    let mut all = AllPending(slots);
    tokio::select! {
        () = &mut all => {}
        () = tokio::time::sleep(settle()) => {}
    }
    ON.store(false, Ordering::SeqCst);
    let traced = TRACE.load(Ordering::SeqCst);
    if traced != 0 {
        print_traces(traced);
    }
    let waiters = K as f64;
    let mut total = 0.0;
    let mut lines = Vec::new();
    for (size, count) in COUNTS.iter().enumerate() {
        let n = count.load(Ordering::SeqCst);
        if n != 0 {
            total += n as f64 * size as f64;
            lines.push(format!(
                "  {size:>6} B x {:.2} per waiter",
                n as f64 / waiters
            ));
        }
    }
    println!(
        "{label}: {:.0} B of live allocations per waiting future",
        total / waiters
    );
    for line in lines {
        println!("{line}");
    }
    drop(all);
    first.abort();
    held.release().await.expect("release");
}

fn main() {
    let only = std::env::var("DISTLOCK_MEM_ONLY").unwrap_or_default();
    let trace = std::env::var("DISTLOCK_MEM_TRACE")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    TRACE.store(trace, Ordering::SeqCst);
    let redis = test_support::RedisServer::start();
    let zk = test_support::ZkCluster::start(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let redis_provider = || async {
            Arc::new(RedisProvider::connect(&redis.url()).await.expect("redis"))
                as Arc<dyn Provider>
        };
        let zk_provider = || async {
            Arc::new(
                ZkProvider::connect_with(ZkOptions::new(zk.connect_string()))
                    .await
                    .expect("zookeeper"),
            ) as Arc<dyn Provider>
        };
        let (r1, r2) = (redis_provider().await, redis_provider().await);
        let (z1, z2) = (zk_provider().await, zk_provider().await);
        for (label, p1, p2, fair) in [
            ("redis-mutex", &r1, &r2, false),
            ("redis-fair", &r1, &r2, true),
            ("zk-fair", &z1, &z2, true),
            ("zk-unfair", &z1, &z2, false),
        ] {
            if !only.is_empty() && !only.split(',').any(|o| o == label) {
                continue;
            }
            let name = format!("mem-profile-{label}");
            let (holder, lock) = if fair {
                (p1.fair_mutex(&name), p2.fair_mutex(&name))
            } else {
                (p1.mutex(&name), p2.mutex(&name))
            };
            profile(label, &holder.expect("name"), &lock.expect("name")).await;
        }
    });
}
