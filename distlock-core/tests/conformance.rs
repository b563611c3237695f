//! The conformance suite on the in-process backend: unfair and fair mutex.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use distlock_core::mem::MemProvider;
use distlock_core::{LeaseOptions, Lock, Provider};
use futures::future::BoxFuture;
use test_support::conformance::Fixture;

/// Clients of one in-process lock table.
struct Mem {
    table: MemProvider,
    fair: bool,
}

impl Mem {
    fn new(fair: bool) -> Self {
        Mem {
            table: MemProvider::new(),
            fair,
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
        if self.fair {
            client.fair_mutex_with(name, lease)
        } else {
            client.mutex_with(name, lease)
        }
    }
}

mod mutex {
    test_support::conformance_suite!(super::Mem::new(false));
}

mod fair_mutex {
    test_support::conformance_suite!(super::Mem::new(true));
}
