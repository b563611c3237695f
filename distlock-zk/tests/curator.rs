//! Interop with Apache Curator 5.4 (Debian's `libcurator-recipes-java`): a
//! distlock fair mutex and a Curator `InterProcessMutex` on the same path
//! exclude each other both ways, and Curator's `DistributedAtomicLong` reads
//! a distlock id counter; a request to release crosses both ways (a
//! revocable Curator holder lets go when distlock asks; a distlock holder
//! hears Curator's `Revoker`).
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use distlock_core::{PrimitiveKind, Provider};
use distlock_zk::{ZkOptions, ZkProvider};
use test_support::unique_name;

fn curator(hosts: &str, path: &str, args: &[&str]) -> std::process::Child {
    test_support::curator::spawn("CuratorPeer", hosts, path, args)
}

async fn run(hosts: &str, path: &str, args: &[&str]) -> String {
    test_support::curator::run("CuratorPeer", hosts, path, args).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distlock_and_curator_mutexes_exclude_each_other() {
    let hosts = test_support::zookeeper::shared().connect_string();
    let locks = ZkProvider::connect_with(ZkOptions::new(&hosts))
        .await
        .unwrap();
    let name = unique_name("curator");
    let path = locks.path(&name).unwrap();
    let lock = locks.fair_mutex(&name).unwrap();

    let guard = lock.lock().await.unwrap();
    assert_eq!(run(&hosts, &path, &["try"]).await, "busy");
    guard.release().await.unwrap();
    assert_eq!(run(&hosts, &path, &["try"]).await, "acquired");

    let holder = curator(&hosts, &path, &["hold", "1"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match lock.try_lock().await.unwrap() {
            None => break,
            Some(g) => {
                // Curator has not queued yet (JVM start-up): let it.
                g.release().await.unwrap();
                assert!(Instant::now() < deadline, "Curator never took the lock");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    let g = lock
        .lock_timeout(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("Curator's release not seen");
    let out = tokio::task::spawn_blocking(move || test_support::curator::output(holder))
        .await
        .unwrap();
    assert_eq!(out, "acquired\nreleased");
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_reads_a_distlock_id_counter() {
    let hosts = test_support::zookeeper::shared().connect_string();
    let locks = ZkProvider::connect_with(ZkOptions::new(&hosts))
        .await
        .unwrap();
    let name = unique_name("counter");
    let ids = locks.id_generator(&name, 10).unwrap();
    for _ in 0..25 {
        ids.next().await.unwrap();
    }
    // Three blocks of 10 reserved: the counter stands at 30.
    let path = locks.path(&name).unwrap();
    assert_eq!(run(&hosts, &path, &["counter"]).await, "30");
}

/// `request_release` asks a revocable Curator holder (`makeRevocable`) the
/// way Curator's own `Revoker` does, and the Curator holder lets go: the
/// distlock waiter gets the lock long before the Curator holder's own
/// 60 s would end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocable_curator_holder_lets_go_when_distlock_asks() {
    let hosts = test_support::zookeeper::shared().connect_string();
    let locks = ZkProvider::connect_with(ZkOptions::new(&hosts))
        .await
        .unwrap();
    let name = unique_name("curator-asked");
    let path = locks.path(&name).unwrap();
    let lock = locks.fair_mutex(&name).unwrap();
    let holder = curator(&hosts, &path, &["revocable", "60"]);
    // Wait for the Curator holder (JVM start-up) through inspect.
    let deadline = Instant::now() + Duration::from_secs(20);
    let held = loop {
        let snap = locks
            .inspect(&name, PrimitiveKind::FairMutex)
            .await
            .unwrap();
        if !snap.holders.is_empty() {
            break snap.holders;
        }
        assert!(Instant::now() < deadline, "Curator never took the lock");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(held[0].foreign.is_some(), "{held:?}");
    assert!(!held[0].release_requested, "{held:?}");
    let asked = locks
        .request_release(&name, PrimitiveKind::FairMutex)
        .await
        .unwrap();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert!(asked[0].foreign.is_some() && asked[0].release_requested);
    let g = lock
        .lock_timeout(Duration::from_secs(15))
        .await
        .unwrap()
        .expect("the Curator holder did not let go when asked");
    let out = tokio::task::spawn_blocking(move || test_support::curator::output(holder))
        .await
        .unwrap();
    assert_eq!(out, "acquired\nreleased as asked");
    g.release().await.unwrap();
}

/// Curator's `Revoker.attemptRevoke` on a distlock holder's node (it writes
/// `__REVOKE__` there) reaches the distlock guard's `release_requested()`;
/// the guard still holds until it lets go, and then Curator gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_distlock_holder_hears_curators_revoker() {
    let hosts = test_support::zookeeper::shared().connect_string();
    let locks = ZkProvider::connect_with(ZkOptions::new(&hosts))
        .await
        .unwrap();
    let name = unique_name("curator-revoker");
    let path = locks.path(&name).unwrap();
    let guard = locks.fair_mutex(&name).unwrap().lock().await.unwrap();
    assert_eq!(run(&hosts, &path, &["revoke"]).await, "asked 1");
    tokio::time::timeout(Duration::from_secs(10), guard.release_requested())
        .await
        .expect("the Revoker's request was not heard");
    assert!(guard.is_held(), "{:?}", guard.status());
    let snap = locks
        .inspect(&name, PrimitiveKind::FairMutex)
        .await
        .unwrap();
    assert!(
        snap.holders.len() == 1 && snap.holders[0].release_requested,
        "{:?}",
        snap.holders
    );
    // The request ended nothing: Curator still finds the lock busy.
    assert_eq!(run(&hosts, &path, &["try"]).await, "busy");
    guard.release().await.unwrap();
    assert_eq!(run(&hosts, &path, &["try"]).await, "acquired");
}
