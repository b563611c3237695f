//! The conformance suite against a real redis-server, one multiplexed
//! connection per client (and a deadpool pool per client for the mutex and
//! the sections): every primitive that can act as a mutex (mutex, fair
//! mutex, the write side of a read-write lock, a semaphore of one) and the
//! read-write lock, semaphore, fair-order and election sections.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use distlock_core::{LeaseOptions, Lock, Provider};
use distlock_redis::{RedisOptions, RedisProvider};
use futures::future::BoxFuture;
use test_support::conformance::Fixture;
use test_support::primitives::Kind;

struct Redis {
    url: String,
    options: RedisOptions,
    kind: Kind,
}

impl Redis {
    fn single(kind: Kind) -> Self {
        Redis {
            url: test_support::redis::shared().url(),
            options: RedisOptions::new(),
            kind,
        }
    }

    fn pool(kind: Kind) -> Self {
        Redis {
            url: test_support::redis::shared().url(),
            options: RedisOptions::new().pool_size(4),
            kind,
        }
    }
}

impl Fixture for Redis {
    fn client(&self) -> BoxFuture<'_, Arc<dyn Provider>> {
        Box::pin(async move {
            let client = RedisProvider::connect_with(&self.url, self.options.clone())
                .await
                .expect("connect to the test redis-server");
            Arc::new(client) as Arc<dyn Provider>
        })
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

mod single {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(super::Redis::single(Kind::Mutex));
}

mod pool {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(super::Redis::pool(Kind::Mutex));
}

mod fair {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(super::Redis::single(Kind::FairMutex));
    test_support::conformance_suite!(fair super::Redis::single(Kind::FairMutex));
}

mod pool_fair {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(fair super::Redis::pool(Kind::FairMutex));
}

mod rw_write {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(super::Redis::single(Kind::RwWrite));
}

mod rw_lock {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(rw super::Redis::single(Kind::RwWrite));
}

mod pool_rw_lock {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(rw super::Redis::pool(Kind::RwWrite));
}

mod semaphore_of_one {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(super::Redis::single(Kind::Semaphore1));
}

mod semaphore {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(semaphore super::Redis::single(Kind::Semaphore1));
}

mod pool_semaphore {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(semaphore super::Redis::pool(Kind::Semaphore1));
}

mod election {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(election super::Redis::single(Kind::Mutex));
}

mod max_hold {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(max_hold super::Redis::single(Kind::Mutex));
}

mod max_hold_rw_write {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(max_hold super::Redis::single(Kind::RwWrite));
}

mod operations {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(operations super::Redis::single(Kind::Mutex));
}

mod pool_operations {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(operations super::Redis::pool(Kind::Mutex));
}

mod revocation {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(revocation super::Redis::single(Kind::Mutex));
}

mod kinds {
    use test_support::primitives::Kind;
    test_support::conformance_suite!(kinds super::Redis::single(Kind::Mutex));
}
