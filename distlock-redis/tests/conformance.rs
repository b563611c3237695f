//! The conformance suite against a real redis-server: one multiplexed
//! connection per client, and a deadpool pool per client.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use distlock_core::{LeaseOptions, Lock, Provider};
use distlock_redis::{RedisOptions, RedisProvider};
use futures::future::BoxFuture;
use test_support::conformance::Fixture;

struct Redis {
    url: String,
    options: RedisOptions,
}

impl Redis {
    fn single() -> Self {
        Redis {
            url: test_support::redis::shared().url(),
            options: RedisOptions::new(),
        }
    }

    fn pool() -> Self {
        Redis {
            url: test_support::redis::shared().url(),
            options: RedisOptions::new().pool_size(4),
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
        client.mutex_with(name, lease)
    }
}

mod single {
    test_support::conformance_suite!(super::Redis::single());
}

mod pool {
    test_support::conformance_suite!(super::Redis::pool());
}
