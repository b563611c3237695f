//! The conformance suite on the in-process backend: every primitive that can
//! act as a mutex (unfair and fair mutex, the write side of a read-write
//! lock, a semaphore of one), and the read-write lock, semaphore, fair-order
//! and election sections.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use distlock_core::mem::MemProvider;
use distlock_core::{LeaseOptions, Lock, Provider};
use futures::future::BoxFuture;
use test_support::conformance::Fixture;
use test_support::primitives::Kind;

/// Clients of one in-process lock table.
struct Mem {
    table: MemProvider,
    kind: Kind,
}

impl Mem {
    fn new(kind: Kind) -> Self {
        Mem {
            table: MemProvider::new(),
            kind,
        }
    }
}

impl Fixture for Mem {
    fn client(&self) -> BoxFuture<'_, Arc<dyn Provider>> {
        let client: Arc<dyn Provider> = Arc::new(self.table.new_client());
        Box::pin(async move { client })
    }

    fn lock(
        &self,
        client: &dyn Provider,
        name: &str,
        lease: LeaseOptions,
    ) -> distlock_core::Result<Arc<dyn Lock>> {
        self.kind.open(client, name, lease)
    }
}

mod mutex {
    test_support::conformance_suite!(super::Mem::new(test_support::primitives::Kind::Mutex));
}

mod fair_mutex {
    test_support::conformance_suite!(super::Mem::new(test_support::primitives::Kind::FairMutex));
    test_support::conformance_suite!(fair super::Mem::new(test_support::primitives::Kind::FairMutex));
}

mod rw_write {
    test_support::conformance_suite!(super::Mem::new(test_support::primitives::Kind::RwWrite));
}

mod rw_lock {
    test_support::conformance_suite!(rw super::Mem::new(test_support::primitives::Kind::RwWrite));
}

mod semaphore_of_one {
    test_support::conformance_suite!(super::Mem::new(test_support::primitives::Kind::Semaphore1));
}

mod semaphore {
    test_support::conformance_suite!(semaphore super::Mem::new(test_support::primitives::Kind::Semaphore1));
}

mod election {
    test_support::conformance_suite!(election super::Mem::new(test_support::primitives::Kind::Mutex));
}

mod operations {
    test_support::conformance_suite!(operations super::Mem::new(test_support::primitives::Kind::Mutex));
    test_support::conformance_suite!(max_hold super::Mem::new(test_support::primitives::Kind::Mutex));
}

mod revocation {
    test_support::conformance_suite!(revocation super::Mem::new(test_support::primitives::Kind::Mutex));
}

mod max_hold_fair {
    test_support::conformance_suite!(max_hold super::Mem::new(test_support::primitives::Kind::FairMutex));
}

mod kinds {
    test_support::conformance_suite!(kinds super::Mem::new(test_support::primitives::Kind::Mutex));
}
