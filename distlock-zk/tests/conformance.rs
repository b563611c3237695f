//! The conformance suite against real ZooKeeper: fair and unfair mutex on a
//! standalone server, the fair mutex on a 3-node ensemble.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, OnceLock};

use distlock_core::{LeaseOptions, Lock, Provider};
use distlock_zk::{ZkOptions, ZkProvider};
use futures::future::BoxFuture;
use test_support::conformance::Fixture;
use test_support::ZkCluster;

struct Zk {
    hosts: String,
    fair: bool,
}

fn ensemble() -> &'static ZkCluster {
    static ENSEMBLE: OnceLock<ZkCluster> = OnceLock::new();
    ENSEMBLE.get_or_init(|| ZkCluster::start(3))
}

impl Zk {
    fn standalone(fair: bool) -> Self {
        Zk {
            hosts: test_support::zookeeper::shared().connect_string(),
            fair,
        }
    }

    fn ensemble() -> Self {
        Zk {
            hosts: ensemble().connect_string(),
            fair: true,
        }
    }
}

impl Fixture for Zk {
    fn client(&self) -> BoxFuture<'_, Arc<dyn Provider>> {
        Box::pin(async move {
            let client = ZkProvider::connect_with(ZkOptions::new(self.hosts.clone()))
                .await
                .expect("connect to the test ZooKeeper");
            Arc::new(client) as Arc<dyn Provider>
        })
    }

    fn lock(
        &self,
        client: &dyn Provider,
        name: &str,
        _lease: LeaseOptions,
    ) -> distlock_core::Result<Arc<dyn Lock>> {
        // The session is the lease: ZooKeeper refuses other lease options
        // (tested in zookeeper.rs), so the suite's are not passed on.
        if self.fair {
            client.fair_mutex(name)
        } else {
            client.mutex(name)
        }
    }
}

mod fair {
    test_support::conformance_suite!(session super::Zk::standalone(true));
}

mod unfair {
    test_support::conformance_suite!(session super::Zk::standalone(false));
}

mod ensemble_fair {
    test_support::conformance_suite!(session super::Zk::ensemble());
}
