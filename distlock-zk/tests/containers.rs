//! Nothing left behind: every node distlock creates for a
//! name is ephemeral, or a container the server deletes once it is empty,
//! so a name no longer used leaves no node; and a force-release of a name
//! nobody used creates none.
//!
//! One test on a server of its own, whose container manager looks every
//! 200 ms (ZooKeeper's default is a minute; `znode.container.checkIntervalMs`
//! is a JVM property, given through `JDK_JAVA_OPTIONS` before the server
//! starts, the only test of this binary).
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use distlock_core::{PrimitiveKind, Provider};
use distlock_zk::zookeeper_client;
use distlock_zk::{ZkOptions, ZkProvider};
use test_support::unique_name;

async fn gone(raw: &zookeeper_client::Client, path: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match raw.check_stat(path).await.unwrap() {
            None => return,
            Some(_) => {
                let children = raw
                    .get_children(path)
                    .await
                    .map(|(c, _)| c)
                    .unwrap_or_default();
                assert!(
                    Instant::now() < deadline,
                    "{path} is still there, children {children:?}"
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unused_name_leaves_no_node() {
    // SAFETY: the only test of this binary, before any thread of ours
    // reads the environment; the server's JVM reads it.
    unsafe {
        std::env::set_var(
            "JDK_JAVA_OPTIONS",
            "-Dznode.container.checkIntervalMs=200 -Dznode.container.maxPerMinute=100000",
        );
    }
    let server = test_support::ZkCluster::standalone();
    let hosts = server.connect_string();
    let locks = ZkProvider::connect_with(ZkOptions::new(hosts.clone()))
        .await
        .unwrap();
    let raw = zookeeper_client::Client::connect(&hosts).await.unwrap();

    // A force-release of a name nobody used: nothing evicted, no node.
    for kind in [
        PrimitiveKind::Mutex,
        PrimitiveKind::FairMutex,
        PrimitiveKind::ReadWrite,
        PrimitiveKind::Semaphore,
        PrimitiveKind::Election,
    ] {
        let name = unique_name("force-unused");
        let done = locks.force_release(&name, kind).await.unwrap();
        assert_eq!(done.evicted, 0, "{kind}");
        let dir = locks.path(&name).unwrap();
        assert!(
            raw.check_stat(&dir).await.unwrap().is_none(),
            "{kind}: {dir}"
        );
    }

    // Each kind used once and released: its directory goes.
    for kind in ["mutex", "fair", "rw", "semaphore", "election"] {
        let name = unique_name(&format!("containers-{kind}"));
        let dir = locks.path(&name).unwrap();
        match kind {
            "mutex" => {
                let g = locks.mutex(&name).unwrap().lock().await.unwrap();
                g.release().await.unwrap();
            }
            "fair" => {
                let g = locks.fair_mutex(&name).unwrap().lock().await.unwrap();
                g.release().await.unwrap();
            }
            "rw" => {
                let rw = locks.rw_lock(&name).unwrap();
                let r = rw.read().lock().await.unwrap();
                r.release().await.unwrap();
                let w = rw.write().lock().await.unwrap();
                w.release().await.unwrap();
            }
            "semaphore" => {
                let s = locks.semaphore(&name, 2).unwrap();
                let g = s.lock().await.unwrap();
                g.release().await.unwrap();
            }
            _ => {
                let e = locks.election(&name).unwrap();
                let l = e.campaign("c").await.unwrap();
                l.resign().await.unwrap();
            }
        }
        gone(&raw, &dir).await;
    }
    locks.close().await.unwrap();
}
