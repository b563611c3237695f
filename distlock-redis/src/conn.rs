//! The command connection: one auto-reconnecting multiplexed connection, a
//! deadpool pool, or a Cluster connection.

use std::fmt;
use std::time::Duration;

use distlock_core::Result;
use redis::aio::ConnectionManager;
use redis::{Cmd, FromRedisValue, ScriptInvocation};

use crate::error::{map, map_pool};

#[derive(Clone)]
pub(crate) enum Conn {
    /// One multiplexed connection, reconnected by the client when it drops.
    Single(ConnectionManager),
    /// A deadpool pool of multiplexed connections.
    Pool(deadpool_redis::Pool),
    /// Redis Cluster: commands routed by key slot.
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Conn::Single(_) => "Single",
            Conn::Pool(_) => "Pool",
            #[cfg(feature = "cluster")]
            Conn::Cluster(_) => "Cluster",
        })
    }
}

impl Conn {
    /// Runs a script (EVALSHA, loading it on NOSCRIPT).
    pub(crate) async fn script<T: FromRedisValue>(
        &self,
        operation: &'static str,
        timeout: Duration,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T> {
        let result = match self {
            Conn::Single(c) => invocation.invoke_async(&mut c.clone()).await,
            Conn::Pool(p) => {
                let mut c = p.get().await.map_err(|e| map_pool(timeout, e))?;
                invocation.invoke_async(&mut c).await
            }
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => invocation.invoke_async(&mut c.clone()).await,
        };
        result.map_err(|e| map(operation, timeout, e))
    }

    /// Runs one command, returning the client's own error.
    pub(crate) async fn query<T: FromRedisValue>(
        &self,
        timeout: Duration,
        cmd: &Cmd,
    ) -> Result<redis::RedisResult<T>> {
        Ok(match self {
            Conn::Single(c) => cmd.query_async(&mut c.clone()).await,
            Conn::Pool(p) => {
                let mut c = p.get().await.map_err(|e| map_pool(timeout, e))?;
                cmd.query_async(&mut c).await
            }
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => cmd.query_async(&mut c.clone()).await,
        })
    }
}
