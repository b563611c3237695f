//! The Redis fence as the fence conformance suite and the safety suite
//! drive it ([`FencedStore`]): fenced writes through `RedisFence`, reads
//! on a connection of their own.

use std::sync::LazyLock;

use distlock_core::fence::{FenceToken, Highest};
use distlock_core::Result;
use distlock_redis::redis::{self, AsyncCommands};
use distlock_redis::{GuardedScript, RedisFence};
use futures::future::BoxFuture;
use test_support::fence_conformance::FencedStore;

/// A fenced read: `GET`, run only if the token is admitted.
static GET: LazyLock<GuardedScript> =
    LazyLock::new(|| GuardedScript::new("return redis.call('GET', KEYS[1])"));

/// How a suite reads values back: its own connection, beside the fence's.
#[allow(dead_code)] // The safety suite reads one server only.
pub enum Reader {
    /// One server's client.
    Single(Box<redis::Client>),
    #[cfg(feature = "cluster")]
    /// A Cluster connection.
    Cluster(redis::cluster_async::ClusterConnection),
}

pub struct Store {
    /// The fenced writes.
    pub fence: RedisFence,
    /// The reads.
    pub reader: Reader,
}

impl FencedStore for Store {
    fn write<'a>(
        &'a self,
        resource: &'a str,
        token: FenceToken,
        value: u64,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.fence.set(resource, value, token))
    }

    fn admit_read<'a>(
        &'a self,
        resource: &'a str,
        token: FenceToken,
    ) -> BoxFuture<'a, Result<Option<u64>>> {
        Box::pin(async move {
            self.fence
                .eval(&GET, resource, &[resource], &[] as &[&str], token)
                .await
        })
    }

    fn read<'a>(&'a self, resource: &'a str) -> BoxFuture<'a, Result<Option<u64>>> {
        Box::pin(async move {
            // A connection of its own per read: one cut by a fault is gone
            // (a retryable error), the next read connects again.
            let got: redis::RedisResult<Option<u64>> = match &self.reader {
                Reader::Single(client) => match client.get_multiplexed_async_connection().await {
                    Ok(mut c) => c.get(resource).await,
                    Err(e) => Err(e),
                },
                #[cfg(feature = "cluster")]
                Reader::Cluster(c) => c.clone().get(resource).await,
            };
            got.map_err(|e| distlock_core::Error::connection("redis", e))
        })
    }

    fn highest<'a>(&'a self, resource: &'a str) -> BoxFuture<'a, Result<Highest>> {
        Box::pin(self.fence.highest(resource))
    }
}

impl Store {
    /// A store over a single connection to `url`.
    ///
    /// # Panics
    ///
    /// When the server cannot be reached.
    #[allow(dead_code)]
    pub async fn single(url: &str, options: distlock_redis::RedisOptions) -> Store {
        let provider = distlock_redis::RedisProvider::connect_with(url, options)
            .await
            .expect("connect the fenced store");
        let reader = Box::new(redis::Client::open(url).expect("url"));
        Store {
            fence: RedisFence::new(&provider),
            reader: Reader::Single(reader),
        }
    }
}
