//! The Redis id counter: `INCRBY` on `{prefix + name}:ids`.

use std::sync::Arc;

use async_trait::async_trait;
use distlock_core::backend::IdSource;
use distlock_core::{Error, Name, Result};

use crate::context::Context;
use crate::error::from_redis;
use crate::net::wait::not_replicated;

/// The counter behind a Redis id generator.
pub(crate) struct RedisIds {
    pub(crate) shared: Arc<Context>,
    pub(crate) name: Name,
    pub(crate) key: String,
}

#[async_trait]
impl IdSource for RedisIds {
    async fn reserve(&self, n: u64) -> Result<u64> {
        let exhausted = || Error::Exhausted {
            name: self.name.to_string(),
        };
        // Redis counters are signed 64-bit: ids end at i64::MAX.
        let n = i64::try_from(n).map_err(|_| exhausted())?;
        let timeout = self.shared.options.response_timeout;
        let wait = self.shared.options.wait;
        let reply: redis::RedisResult<(i64, Option<u32>)> = self
            .shared
            .conn()?
            .query_acked(timeout, redis::cmd("INCRBY").arg(&self.key).arg(n), wait)
            .await?;
        match reply {
            Ok((last, acked)) => {
                // A block the replicas do not have could be handed out again
                // after a failover: it is dropped (those ids are skipped).
                if let (Some(wait), Some(acked)) = (wait, acked) {
                    if acked < wait.replicas {
                        return Err(not_replicated(
                            format!("id block of {:?}", self.name.as_str()),
                            acked,
                            wait,
                        ));
                    }
                }
                u64::try_from(last).map_err(|_| Error::Conflict {
                    what: format!("redis key {:?}", self.key),
                    expected: "id counter (it is negative)",
                })
            }
            Err(e) if e.code() == Some("WRONGTYPE") => Err(Error::Conflict {
                what: format!("redis key {:?}", self.key),
                expected: "id counter (a string key)",
            }),
            Err(e) if e.to_string().contains("would overflow") => Err(exhausted()),
            Err(e) if e.to_string().contains("not an integer") => Err(Error::Conflict {
                what: format!("redis key {:?}", self.key),
                expected: "id counter (an integer)",
            }),
            Err(e) => Err(from_redis("incrby", timeout, e)),
        }
    }
}
