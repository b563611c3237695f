//! The conformance suite and slot placement on a real 3-master Redis Cluster.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]
#![cfg(feature = "cluster")]

use std::sync::{Arc, OnceLock};

use distlock_core::{LeaseOptions, Lock, Provider};
use distlock_redis::{RedisOptions, RedisProvider};
use futures::future::BoxFuture;
use test_support::conformance::Fixture;
use test_support::redis::RedisCluster;
use test_support::unique_name;

fn cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| RedisCluster::start(3))
}

struct Cluster;

impl Fixture for Cluster {
    fn client(&self) -> BoxFuture<'_, Arc<dyn Provider>> {
        Box::pin(async move {
            let urls = cluster().urls();
            let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
            let client = RedisProvider::connect_cluster(&nodes, RedisOptions::new())
                .await
                .expect("connect to the test cluster");
            Arc::new(client) as Arc<dyn Provider>
        })
    }

    fn lock(
        &self,
        client: &dyn Provider,
        name: &str,
        lease: LeaseOptions,
    ) -> distlock_core::Result<Arc<dyn Lock>> {
        client.with_lease(lease).and_then(|p| p.mutex(name))
    }
}

mod conformance {
    test_support::conformance_suite!(super::Cluster);
}

mod revocation {
    test_support::conformance_suite!(revocation super::Cluster);
}

mod operations {
    test_support::conformance_suite!(operations super::Cluster);
}

/// One name is one lock in Cluster too: the marker and the kinds' keys
/// share a slot (no CROSSSLOT).
mod kinds {
    test_support::conformance_suite!(kinds super::Cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locks_keys_share_one_slot_and_names_spread_over_masters() {
    let c = cluster();
    let urls = c.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let locks = RedisProvider::connect_cluster(&nodes, RedisOptions::new().key_prefix("app:"))
        .await
        .unwrap();
    let mut masters = std::collections::HashSet::new();
    for i in 0..30 {
        let name = unique_name(&format!("slot{i}"));
        let key = locks.lock_key(&name).unwrap();
        let slot = c.cli(&["CLUSTER", "KEYSLOT", &key]);
        for aux in [
            "fence",
            "released",
            "ids",
            "holder",
            "fair:owners",
            "rw:info",
            "sem:owners",
        ] {
            let aux_key = format!("{{{key}}}:{aux}");
            assert_eq!(c.cli(&["CLUSTER", "KEYSLOT", &aux_key]), slot, "{aux_key}");
        }
        let guard = locks.mutex(&name).unwrap().lock().await.unwrap();
        assert!(guard.fencing_token() >= 1);
        // Which master holds the key.
        for n in 0..3 {
            if c.node(n).cli(&["EXISTS", &key]) == "1" {
                masters.insert(n);
            }
        }
        guard.release().await.unwrap();
        let ids = locks.id_generator(&name, 10).unwrap();
        assert_eq!(ids.next().await.unwrap(), 1);
    }
    assert!(masters.len() >= 2, "30 names all landed on one master");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_messages_reach_waiters_across_masters() {
    use std::time::{Duration, Instant};
    let urls = cluster().urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let slow = RedisOptions::new().recheck_interval(Duration::from_secs(30));
    let holder = RedisProvider::connect_cluster(&nodes, RedisOptions::new())
        .await
        .unwrap();
    let waiter = RedisProvider::connect_cluster(&nodes, slow).await.unwrap();
    let long = LeaseOptions::new(Duration::from_secs(60)).unwrap();
    // Several names, so some live on masters other than the subscriber's node.
    for i in 0..6 {
        let name = unique_name(&format!("wake{i}"));
        let guard = holder
            .with_lease(long)
            .unwrap()
            .mutex(&name)
            .unwrap()
            .lock()
            .await
            .unwrap();
        let lock = waiter.with_lease(long).unwrap().mutex(&name).unwrap();
        let task = tokio::spawn(async move { lock.lock().await.map(|g| (Instant::now(), g)) });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let released = Instant::now();
        guard.release().await.unwrap();
        let (acquired, g) = tokio::time::timeout(Duration::from_secs(3), task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(acquired.duration_since(released) < Duration::from_secs(1));
        g.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_url_connects_through_its_seed_nodes() {
    let hosts: Vec<String> = cluster()
        .urls()
        .iter()
        .map(|u| u.trim_start_matches("redis://").to_owned())
        .collect();
    let url = format!("redis+cluster://{}?prefix=svc:", hosts[..2].join(","));
    let locks = distlock_redis::connect(&url).await.unwrap();
    let name = unique_name("url");
    let g = locks.mutex(&name).unwrap().lock().await.unwrap();
    assert_eq!(cluster().cli(&["EXISTS", &format!("svc:{name}")]), "1");
    g.release().await.unwrap();
}

/// The fair mutex over masters: its queue keys share the lock key's slot,
/// and hand-overs reach waiters on two providers in arrival order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_waiters_take_turns_in_arrival_order_across_masters() {
    use std::time::Duration;
    let c = cluster();
    let urls = c.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let slow = RedisOptions::new().recheck_interval(Duration::from_secs(30));
    let a = RedisProvider::connect_cluster(&nodes, slow.clone())
        .await
        .unwrap();
    let b = RedisProvider::connect_cluster(&nodes, slow).await.unwrap();
    let long = LeaseOptions::new(Duration::from_secs(60)).unwrap();
    for i in 0..3 {
        let name = unique_name(&format!("fair{i}"));
        let key = a.lock_key(&name).unwrap();
        let slot = c.cli(&["CLUSTER", "KEYSLOT", &key]);
        for aux in ["fair:queue", "fair:timeouts"] {
            let aux_key = format!("{{{key}}}:{aux}");
            assert_eq!(c.cli(&["CLUSTER", "KEYSLOT", &aux_key]), slot, "{aux_key}");
        }
        let holder = a
            .with_lease(long)
            .unwrap()
            .fair_mutex(&name)
            .unwrap()
            .lock()
            .await
            .unwrap();
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for w in 0..4 {
            let lock = [&a, &b][w % 2]
                .with_lease(long)
                .unwrap()
                .fair_mutex(&name)
                .unwrap();
            let order = Arc::clone(&order);
            tasks.push(tokio::spawn(async move {
                let g = lock.lock().await.unwrap();
                order.lock().unwrap().push(w);
                g.release().await.unwrap();
            }));
            let queue = format!("{{{key}}}:fair:queue");
            while c.cli(&["ZCARD", &queue]) != (w + 1).to_string() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let before = a.wakeups() + b.wakeups();
        holder.release().await.unwrap();
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(5), t)
                .await
                .unwrap()
                .unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3]);
        assert_eq!(a.wakeups() + b.wakeups() - before, 4);
    }
}

async fn next(seen: &mut distlock_core::LeaderStream) -> Option<distlock_core::LeaderInfo> {
    use futures::StreamExt;
    tokio::time::timeout(std::time::Duration::from_secs(3), seen.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
}

/// An election on a cluster: its keys share one slot, one leader at a time,
/// observers on another provider see each change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_on_a_cluster_elects_one_and_is_observed() {
    use std::time::Duration;
    let c = cluster();
    let urls = c.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let a = RedisProvider::connect_cluster(&nodes, RedisOptions::new())
        .await
        .unwrap();
    let b = RedisProvider::connect_cluster(&nodes, RedisOptions::new())
        .await
        .unwrap();
    let name = unique_name("elect");
    let base = format!("{{{name}}}:elect");
    let slot = c.cli(&["CLUSTER", "KEYSLOT", &name]);
    for aux in ["", ":fence", ":leader", ":queue", ":timeouts", ":events"] {
        let key = format!("{base}{aux}");
        assert_eq!(c.cli(&["CLUSTER", "KEYSLOT", &key]), slot, "{key}");
    }
    let mut seen = b.election(&name).unwrap().observe();
    assert_eq!(next(&mut seen).await, None);
    let first = a.election(&name).unwrap().campaign("a").await.unwrap();
    assert_eq!(next(&mut seen).await.unwrap().id, "a");
    let eb = b.election(&name).unwrap();
    let second = tokio::spawn(async move { eb.campaign("b").await.unwrap() });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!second.is_finished(), "two leaders");
    let t1 = first.term();
    first.resign().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(3), second)
        .await
        .unwrap()
        .unwrap();
    assert!(second.term() > t1);
    // The observer may see the gap between the two leaders, or not.
    let mut now = next(&mut seen).await;
    if now.is_none() {
        now = next(&mut seen).await;
    }
    assert_eq!(now.unwrap().id, "b");
    second.resign().await.unwrap();
}

/// A Cluster provider's pub/sub connection is not tied to its first seed:
/// when the node it listens on goes silent (a proxy in front of the first
/// seed swallows every byte from now on, new connections included), the
/// subscriber finds it, moves to the next seed, and the waiter hears its
/// hand-over there, long before its 30 s re-check. Before, it asked the
/// silent seed again at every reconnect and the waiter heard nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subscriber_moves_to_another_seed_when_its_node_goes_silent() {
    use std::time::{Duration, Instant};
    let c = cluster();
    let urls = c.urls();
    let proxy = test_support::Proxy::start(c.node(0).addr());
    let proxied = format!("redis://{}", proxy.addr());
    let seeds: Vec<&str> = std::iter::once(proxied.as_str())
        .chain(urls.iter().map(String::as_str))
        .collect();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let options = RedisOptions::new()
        .recheck_interval(Duration::from_secs(30))
        .response_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500));
    let waiting = RedisProvider::connect_cluster(&seeds, options)
        .await
        .unwrap();
    let holding = RedisProvider::connect_cluster(&nodes, RedisOptions::new())
        .await
        .unwrap();
    let lease = LeaseOptions::new(Duration::from_secs(30)).unwrap();
    let name = unique_name("seed-moves");
    let lock = waiting.with_lease(lease).unwrap().mutex(&name).unwrap();
    let holder = holding.with_lease(lease).unwrap().mutex(&name).unwrap();

    // A first wait subscribes, through the proxy (the first seed).
    let held = holder.lock().await.unwrap();
    let task = {
        let lock = Arc::clone(&lock);
        tokio::spawn(async move { lock.lock().await })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while waiting.subscriber_connections() == 0 {
        assert!(Instant::now() < deadline, "the waiter never subscribed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(proxy.open_connections() > 0, "the first seed is the proxy");
    let before = waiting.subscriber_connections();
    proxy.set_blackhole(true);

    // Found silent within a health check and a response timeout (1.5 s),
    // then one connect timed out on the silent seed at most (0.5 s): a new
    // connection, on another node.
    let deadline = Instant::now() + Duration::from_secs(10);
    while waiting.subscriber_connections() == before {
        assert!(
            Instant::now() < deadline,
            "the subscriber never reconnected away from the silent seed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Let the waiter's re-subscribed wait settle, then hand over.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released = Instant::now();
    {
        let pname = loop {
            let n = unique_name("probe");
            if c.shard_of(&n).0 != 0 {
                break n;
            }
        };
        let probe = holding.with_lease(lease).unwrap().mutex(&pname).unwrap();
        for _ in 0..4 {
            let t = Instant::now();
            let r = probe.try_lock().await;
            eprintln!(
                "PROBE try_lock {:?} in {:?}",
                r.as_ref().map(Option::is_some),
                t.elapsed()
            );
            if let Ok(Some(g)) = r {
                let t = Instant::now();
                let e = g.release().await;
                eprintln!("PROBE release {e:?} in {:?}", t.elapsed());
            }
        }
    }
    let t = Instant::now();
    let e = held.release().await;
    eprintln!("PROBE held release {e:?} in {:?}", t.elapsed());
    e.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the waiter heard its hand-over on another seed, before its 30 s re-check")
        .unwrap()
        .unwrap();
    println!(
        "hand-over heard {:?} after the release, on a subscriber moved off its silent seed",
        released.elapsed()
    );
    g.release().await.unwrap();
    proxy.set_blackhole(false);
}

/// The first seed's node is killed (SIGKILL of its redis-server) under a
/// subscribed waiter; the promise (crate docs, Liveness): the subscriber
/// moves to the next seed, so the dead node costs one connect timeout at
/// most. Asserted: moved within `H + T + connect timeout + the reconnect
/// backoff (1 s)` with 3 s of slack, then the waiter hears its hand-over on
/// the new node, long before its 30 s re-check. On a cluster of its own: a
/// dead node would break the other tests of this binary on the shared one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subscriber_moves_to_another_seed_when_its_node_is_killed() {
    use std::time::{Duration, Instant};
    let c = RedisCluster::start(3);
    // A dead master must not take the cluster down for the others' slots.
    for i in 0..3 {
        let ok = c
            .node(i)
            .cli(&["CONFIG", "SET", "cluster-require-full-coverage", "no"]);
        assert_eq!(ok, "OK", "node {i}");
    }
    let urls = c.urls();
    let seeds: Vec<&str> = urls.iter().map(String::as_str).collect();
    let (health, response, connect) = (
        Duration::from_secs(1),
        Duration::from_millis(500),
        Duration::from_millis(500),
    );
    let options = RedisOptions::new()
        .recheck_interval(Duration::from_secs(30))
        .response_timeout(response)
        .connect_timeout(connect);
    let waiting = RedisProvider::connect_cluster(&seeds, options)
        .await
        .unwrap();
    let holding = RedisProvider::connect_cluster(&seeds[1..], RedisOptions::new())
        .await
        .unwrap();
    // A name served by a node that stays up (the prefix is empty: the lock
    // key is the name).
    let name = loop {
        let name = unique_name("seed-killed");
        if c.shard_of(&name).0 != 0 {
            break name;
        }
    };
    let lease = LeaseOptions::new(Duration::from_secs(30)).unwrap();
    let lock = waiting.with_lease(lease).unwrap().mutex(&name).unwrap();
    let holder = holding.with_lease(lease).unwrap().mutex(&name).unwrap();

    let held = holder.lock().await.unwrap();
    let task = {
        let lock = Arc::clone(&lock);
        tokio::spawn(async move { lock.lock().await })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while waiting.subscriber_connections() == 0 || c.node(0).cli(&["PUBSUB", "CHANNELS"]).is_empty()
    {
        assert!(
            Instant::now() < deadline,
            "the waiter never subscribed on the first seed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let before = waiting.subscriber_connections();
    let info = c.node(0).cli(&["INFO", "server"]);
    let pid = info
        .lines()
        .find_map(|l| l.trim().strip_prefix("process_id:"))
        .expect("INFO server names the process id")
        .to_owned();
    let killed = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid])
        .status()
        .unwrap();
    assert!(status.success(), "kill -KILL {pid}");
    let bound = health + response + connect + Duration::from_secs(1);
    let slack = Duration::from_secs(3);
    while waiting.subscriber_connections() == before {
        assert!(
            killed.elapsed() < bound + slack,
            "the subscriber did not reconnect away from its killed seed within {:?}",
            bound + slack
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let moved = killed.elapsed();
    // Let the waiter's re-subscribed wait settle, then hand over.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the waiter heard its hand-over on another seed, before its 30 s re-check")
        .unwrap()
        .unwrap();
    println!(
        "killed seed: subscriber moved after {moved:?} (bound {bound:?}); hand-over heard {:?} after the release",
        released.elapsed()
    );
    g.release().await.unwrap();
}
