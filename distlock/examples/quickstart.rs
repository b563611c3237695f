//! Quick start, no server needed: `cargo run --example quickstart`.
//!
//! Four workers start at once and contend for one fair mutex on the
//! in-process backend: each waits in line, the lock passes from one to the
//! next, and every holder writes to a store that checks fencing tokens (they
//! rise with every hand-over). A fifth asks with a short deadline and is
//! told "busy". Then one lease is lost on purpose (a manual lease never
//! extended), the holder notices through `lost()`, and the store rejects its
//! late write.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock::{LeaseOptions, PrimitiveKind};

/// A resource that accepts a write only with a fencing token at least as
/// high as any it has seen: a late writer with an old token is refused.
#[derive(Default)]
struct FencedStore {
    highest_token: u64,
    value: u64,
}

impl FencedStore {
    fn write(&mut self, token: u64, value: u64) -> Result<(), String> {
        if token < self.highest_token {
            return Err(format!(
                "token {token} < {}: stale writer refused",
                self.highest_token
            ));
        }
        self.highest_token = token;
        self.value = value;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let locks = distlock::connect("mem://").await?;
    let store = Arc::new(Mutex::new(FencedStore::default()));

    println!(
        "== four workers contend for \"orders/42\" (a fair mutex: first come, first served) =="
    );
    let started = Instant::now();
    let ms = move || started.elapsed().as_millis();
    let start_line = Arc::new(tokio::sync::Barrier::new(4));
    let mut workers = Vec::new();
    for worker in 1..=4 {
        let mutex = locks.fair_mutex("orders/42")?;
        let (locks, store, start_line) = (
            Arc::clone(&locks),
            Arc::clone(&store),
            Arc::clone(&start_line),
        );
        workers.push(tokio::spawn(async move {
            start_line.wait().await;
            for _ in 0..3 {
                let asked = Instant::now();
                println!("{:>4} ms  worker {worker} waits", ms());
                let guard = mutex.lock().await?;
                let token = guard.fencing_token();
                let waiting = locks
                    .inspect("orders/42", PrimitiveKind::FairMutex)
                    .await?
                    .waiters
                    .count;
                let value = store.lock().map_err(|_| "poisoned")?.value;
                println!(
                    "{:>4} ms  worker {worker} holds the lock after waiting {:>3} ms: token {token}, counter {value} -> {}, {waiting} waiting",
                    ms(),
                    asked.elapsed().as_millis(),
                    value + 1,
                );
                tokio::time::sleep(Duration::from_millis(20)).await; // the "work"
                store
                    .lock()
                    .map_err(|_| "poisoned")?
                    .write(token, value + 1)?;
                guard.release().await?;
                // Back to the end of the line: the others were first.
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    let impatient = locks.fair_mutex("orders/42")?;
    match impatient.lock_timeout(Duration::from_millis(10)).await? {
        None => println!(
            "{:>4} ms  worker 5 waited 10 ms and gave up: busy is Ok(None), not an error",
            ms()
        ),
        Some(guard) => guard.release().await?,
    }
    for w in workers {
        w.await?.map_err(|e| e.to_string())?;
    }
    println!(
        "counter = {} (4 workers x 3 turns, no lost update)",
        store.lock().map_err(|_| "poisoned")?.value
    );

    println!("\n== a lease lost on purpose ==");
    let short = LeaseOptions::manual(Duration::from_millis(200))?;
    let slow = locks.with_lease(short)?.mutex("orders/42")?.lock().await?;
    let slow_token = slow.fencing_token();
    println!("slow worker holds token {slow_token} with a 200 ms lease it never extends");
    tokio::select! {
        () = tokio::time::sleep(Duration::from_secs(2)) => println!("slow worker finished (this must not happen)"),
        reason = slow.lost() => println!("slow worker noticed: {reason}; it stops working"),
    }
    let fast = locks.mutex("orders/42")?.lock().await?;
    println!(
        "next worker got the lock with token {}",
        fast.fencing_token()
    );
    store
        .lock()
        .map_err(|_| "poisoned")?
        .write(fast.fencing_token(), 100)?;
    match store.lock().map_err(|_| "poisoned")?.write(slow_token, 999) {
        Ok(()) => println!("stale write accepted (this must not happen)"),
        Err(e) => println!("store: {e}"),
    }
    match slow.release().await {
        Err(e) if e.is_not_held() => {
            println!("slow worker's late release: {e}; the new holder keeps its lock");
        }
        other => println!("slow worker's late release: {other:?}"),
    }
    println!("new holder still holds: {}", fast.is_held());
    fast.release().await?;
    Ok(())
}
