//! One name is one lock on ZooKeeper, beyond the cross-kind suite
//! (`conformance.rs`, `kinds`): a Curator mutex counts as a fair mutex, and
//! a mutex or fair mutex that yields to the other and gives up leaves no
//! node behind.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use distlock_core::Provider;
use distlock_zk::{ZkOptions, ZkProvider};
use test_support::unique_name;

fn hosts() -> String {
    test_support::zookeeper::shared().connect_string()
}

async fn provider() -> ZkProvider {
    ZkProvider::connect_with(ZkOptions::new(hosts()))
        .await
        .unwrap()
}

/// A Curator `InterProcessMutex` holding the path is a fair mutex to
/// distlock: a semaphore and a read side on the same name are refused with
/// `Conflict`, and get in once Curator released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_mutex_refuses_other_kinds_until_released() {
    let hosts = hosts();
    let locks = provider().await;
    let name = unique_name("curator-kind");
    let path = locks.path(&name).unwrap();
    let holder = test_support::curator::spawn("CuratorPeer", &hosts, &path, &["hold", "3"]);
    let fair = locks.fair_mutex(&name).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match fair.try_lock().await.unwrap() {
            None => break,
            Some(g) => {
                g.release().await.unwrap();
                assert!(Instant::now() < deadline, "Curator never took the lock");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    let refused = locks.semaphore(&name, 2).unwrap().try_lock().await;
    assert!(
        refused
            .as_ref()
            .is_err_and(distlock_core::Error::is_conflict),
        "{refused:?}"
    );
    let refused = locks.rw_lock(&name).unwrap().read().try_lock().await;
    assert!(
        refused
            .as_ref()
            .is_err_and(distlock_core::Error::is_conflict),
        "{refused:?}"
    );
    let out = tokio::task::spawn_blocking(move || test_support::curator::output(holder))
        .await
        .unwrap();
    assert_eq!(out, "acquired\nreleased");
    let reader = locks.rw_lock(&name).unwrap().read();
    reader
        .lock_timeout(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("free after Curator's release")
        .release()
        .await
        .unwrap();
}

/// The unfair mutex yields to an older fair holder (and the fair head to an
/// older unfair holder) keeping its node; when it gives up (a try, a
/// timeout) the node is deleted, so nothing of it blocks the name after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutex_that_yields_and_gives_up_leaves_no_node() {
    let (a, b) = (provider().await, provider().await);
    let raw = zookeeper_client::Client::connect(&hosts()).await.unwrap();
    for fair_first in [true, false] {
        let name = unique_name("yield");
        let dir = a.path(&name).unwrap();
        let (first, second) = if fair_first {
            (a.fair_mutex(&name).unwrap(), b.mutex(&name).unwrap())
        } else {
            (a.mutex(&name).unwrap(), b.fair_mutex(&name).unwrap())
        };
        let held = first.lock().await.unwrap();
        let before = raw.list_children(&dir).await.unwrap();
        assert!(second.try_lock().await.unwrap().is_none());
        let started = Instant::now();
        assert!(second
            .lock_timeout(Duration::from_millis(300))
            .await
            .unwrap()
            .is_none());
        assert!(started.elapsed() >= Duration::from_millis(300));
        let after = raw.list_children(&dir).await.unwrap();
        assert_eq!(after, before, "fair first: {fair_first}: a node was left");
        held.release().await.unwrap();
        second
            .lock_timeout(Duration::from_secs(5))
            .await
            .unwrap()
            .expect("free after the release")
            .release()
            .await
            .unwrap();
    }
}
