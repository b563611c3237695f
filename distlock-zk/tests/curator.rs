//! Interop with Apache Curator 5.4 (Debian's `libcurator-recipes-java`): a
//! distlock fair mutex and a Curator `InterProcessMutex` on the same path
//! exclude each other both ways, and Curator's `DistributedAtomicLong` reads
//! a distlock id counter.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use distlock_core::Provider;
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
