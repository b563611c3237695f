//! Quick start, no server needed: `cargo run --example quickstart`.
//!
//! Four workers contend for one lock on the in-process backend and write to a
//! store that checks fencing tokens; then one lease is lost on purpose (a
//! manual lease never extended), the holder notices through `lost()`, and the
//! store rejects its late write.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::LeaseOptions;

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

    println!("== four workers contend for \"orders/42\" ==");
    let mut workers = Vec::new();
    for worker in 1..=4 {
        let mutex = locks.mutex("orders/42")?;
        let store = Arc::clone(&store);
        workers.push(tokio::spawn(async move {
            for _ in 0..3 {
                let guard = mutex.lock().await?;
                let token = guard.fencing_token();
                let value = store.lock().map_err(|_| "poisoned")?.value;
                tokio::time::sleep(Duration::from_millis(5)).await; // the "work"
                store
                    .lock()
                    .map_err(|_| "poisoned")?
                    .write(token, value + 1)?;
                println!(
                    "worker {worker} holds the lock with fencing token {token:>2}, counter -> {}",
                    value + 1
                );
                guard.release().await?;
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for w in workers {
        w.await?.map_err(|e| e.to_string())?;
    }
    println!(
        "counter = {} (4 workers x 3 rounds, no lost update)",
        store.lock().map_err(|_| "poisoned")?.value
    );

    println!("\n== a lease lost on purpose ==");
    let short = LeaseOptions::manual(Duration::from_millis(200))?;
    let slow = locks.mutex_with("orders/42", short)?.lock().await?;
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
