//! The conformance suite against real ZooKeeper: every primitive that can
//! act as a mutex (fair and unfair mutex, the write side of a read-write
//! lock, a semaphore of one) and the read-write lock, semaphore, fair-order
//! and election sections on a standalone server; the fair mutex on a 3-node
//! ensemble.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, OnceLock};

use distlock_core::{LeaseOptions, Lock, Provider};
use distlock_zk::{ZkOptions, ZkProvider};
use futures::future::BoxFuture;
use test_support::conformance::Fixture;
use test_support::primitives::Kind;
use test_support::ZkCluster;

struct Zk {
    hosts: String,
    kind: Kind,
}

fn ensemble() -> &'static ZkCluster {
    static ENSEMBLE: OnceLock<ZkCluster> = OnceLock::new();
    ENSEMBLE.get_or_init(|| ZkCluster::start(3))
}

impl Zk {
    fn standalone(kind: Kind) -> Self {
        Zk {
            hosts: test_support::zookeeper::shared().connect_string(),
            kind,
        }
    }

    fn ensemble() -> Self {
        Zk {
            hosts: ensemble().connect_string(),
            kind: Kind::FairMutex,
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
        lease: LeaseOptions,
    ) -> distlock_core::Result<Arc<dyn Lock>> {
        // The session is the lease: ZooKeeper refuses other lease options
        // (tested in zookeeper.rs), so the suite's are not passed on; only
        // `max_hold`, which a session lease honours.
        let session = match lease.hold_limit() {
            Some(limit) => client.default_lease().max_hold(limit)?,
            None => client.default_lease(),
        };
        self.kind.open(client, name, session)
    }

    fn session(&self) -> bool {
        true
    }
}

mod fair {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(session super::Zk::standalone(Kind::FairMutex));
    test_support::conformance_suite!(fair super::Zk::standalone(Kind::FairMutex));
}

mod unfair {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(session super::Zk::standalone(Kind::Mutex));
}

mod ensemble_fair {
    test_support::conformance_suite!(session super::Zk::ensemble());
}

mod rw_write {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(session super::Zk::standalone(Kind::RwWrite));
}

mod rw_lock {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(rw session super::Zk::standalone(Kind::RwWrite));
}

mod semaphore_of_one {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(session super::Zk::standalone(Kind::Semaphore1));
}

mod semaphore {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(semaphore session super::Zk::standalone(Kind::Semaphore1));
}

mod election {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(election session super::Zk::standalone(Kind::Mutex));
}

mod operations {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(operations super::Zk::standalone(Kind::FairMutex));
}

mod max_hold {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(max_hold super::Zk::standalone(Kind::FairMutex));
}

mod max_hold_unfair {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(max_hold super::Zk::standalone(Kind::Mutex));
}

mod max_hold_semaphore {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(max_hold super::Zk::standalone(Kind::Semaphore1));
}

mod kinds {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(kinds super::Zk::standalone(Kind::Mutex));
}

mod revocation {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(revocation super::Zk::standalone(Kind::FairMutex));
}
