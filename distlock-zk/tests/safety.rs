//! Safety under faults on real ZooKeeper: leader kills in a 3-node ensemble
//! and session expiry through a blackholed proxy. No lost update on a fenced
//! resource, ever. `DISTLOCK_SAFETY_SECS=60` for the long run (SAFETY.md).
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock_core::Provider;
use distlock_zk::{ZkOptions, ZkProvider};
use test_support::safety::{self, Shape, Workload};
use test_support::{unique_name, Proxy, ZkCluster};

const CI: Duration = Duration::from_secs(10);

async fn clients(hosts: &[String], session: Duration) -> Vec<Arc<dyn Provider>> {
    let mut out = Vec::new();
    for h in hosts {
        let options = ZkOptions::new(h.clone())
            .session_timeout(session)
            .operation_timeout(Duration::from_secs(2));
        out.push(Arc::new(ZkProvider::connect_with(options).await.unwrap()) as Arc<dyn Provider>);
    }
    out
}

async fn ensemble_leader_killed_and_restarted(shape: Shape) {
    let zk = ZkCluster::start(3);
    let hosts = zk.connect_string();
    let cluster = Arc::new(Mutex::new(zk));
    let name = unique_name("safety-leader");
    let clients = clients(&vec![hosts; 4], Duration::from_secs(4)).await;
    let report = safety::run_with(
        &shape.scenario("zookeeper: ensemble leader kill -9, restart"),
        &clients,
        2,
        shape.maker(&name, None),
        Workload {
            work: Duration::from_millis(50),
            ..Workload::default()
        },
        safety::scenario_duration(CI),
        |until| async move {
            let mut faults = 0;
            while Instant::now() + Duration::from_secs(4) < until {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let cluster = Arc::clone(&cluster);
                tokio::task::spawn_blocking(move || {
                    let mut zk = cluster.lock().unwrap();
                    if let Some(leader) = zk.leader() {
                        zk.kill(leader);
                        std::thread::sleep(Duration::from_millis(500));
                        zk.restart(leader);
                    }
                })
                .await
                .unwrap();
                faults += 1;
            }
            faults
        },
    )
    .await;
    safety::publish(&report);
    safety::assert_lost_before_next(&report);
    assert!(
        report.faults >= 1 && report.accepted_writes > 0,
        "{report:?}"
    );
}

async fn session_expiry_of_a_blackholed_client(shape: Shape) {
    let zk = test_support::zookeeper::shared();
    let proxy = Proxy::start(zk.addr(0));
    let name = unique_name("safety-expiry");
    // One client behind the proxy, one direct, one worker each: the
    // proxied client holds about half the time, so blackholes land inside
    // its critical sections.
    let hosts = vec![proxy.addr().to_string(), zk.connect_string()];
    let clients = clients(&hosts, Duration::from_millis(1000)).await;
    let report = safety::run_with(
        &shape.scenario("zookeeper: client blackholed past its session timeout"),
        &clients,
        // Two permits need more than two workers to be contended.
        if matches!(shape, Shape::Semaphore(_)) {
            2
        } else {
            1
        },
        shape.maker(&name, None),
        // Longer than the session timeout: a blackhole that starts inside a
        // critical section outlives the session before the write.
        Workload {
            work: Duration::from_millis(1500),
            ..Workload::default()
        },
        safety::scenario_duration(CI),
        |until| async move {
            let mut faults = 0;
            let mut rng = fastrand::Rng::with_seed(17);
            while Instant::now() + Duration::from_secs(4) < until {
                // Long enough up-time for the client to get back in line
                // and reach the head of the queue, at random points.
                tokio::time::sleep(Duration::from_millis(rng.u64(2000..5000))).await;
                proxy.set_blackhole(true);
                tokio::time::sleep(Duration::from_millis(2500)).await;
                proxy.set_blackhole(false);
                faults += 1;
            }
            faults
        },
    )
    .await;
    safety::publish(&report);
    safety::assert_lost_before_next(&report);
    assert!(
        report.faults >= 1 && report.accepted_writes > 0,
        "{report:?}"
    );
}

test_support::every_shape!(fair ensemble_leader_killed_and_restarted);
test_support::every_shape!(fair session_expiry_of_a_blackholed_client);
