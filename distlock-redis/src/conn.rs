//! The command connection: one auto-reconnecting multiplexed connection, a
//! deadpool pool, a Cluster connection, or the master found through
//! Sentinel.

use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use distlock_core::Result;
use redis::aio::{ConnectionManager, MultiplexedConnection};
use redis::{Cmd, FromRedisValue, ScriptInvocation};

use crate::error::{from_redis, map_pool};
use crate::provider::Shared;

#[derive(Clone)]
pub(crate) enum Conn {
    /// One multiplexed connection, reconnected by the client when it drops.
    Single(ConnectionManager),
    /// A deadpool pool of multiplexed connections.
    Pool(deadpool_redis::Pool),
    /// Redis Cluster: commands routed by key slot.
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
    /// The master named by Sentinel, found again when it goes away.
    Sentinel(crate::sentinel::SentinelConn),
}

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Conn::Single(_) => "Single",
            Conn::Pool(_) => "Pool",
            #[cfg(feature = "cluster")]
            Conn::Cluster(_) => "Cluster",
            Conn::Sentinel(_) => "Sentinel",
        })
    }
}

/// One connection held for a sequence of commands that must reach the
/// server in order (an acquire attempt and the cleanup that may undo it):
/// commands sent on one multiplexed connection are written to one socket in
/// the order they were sent. With a pool, two checkouts could be two
/// sockets, and a cleanup could overtake the attempt it undoes.
#[derive(Clone)]
pub(crate) enum Pinned {
    Manager(ConnectionManager),
    Multiplexed(MultiplexedConnection),
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
    /// The connection to the master of the moment; an error that means the
    /// master is gone is [`distlock_core::Error::Connection`], so a
    /// [`Sticky`] lets it go.
    Sentinel(crate::sentinel::SentinelPinned),
}

impl Conn {
    /// A connection for commands that must stay in order; for a pool, one
    /// checkout whose multiplexed connection is kept.
    pub(crate) async fn pin(&self, timeout: Duration) -> Result<Pinned> {
        Ok(match self {
            Conn::Single(c) => Pinned::Manager(c.clone()),
            Conn::Pool(p) => {
                let c = p.get().await.map_err(|e| map_pool(timeout, e))?;
                Pinned::Multiplexed((*c).clone())
            }
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => Pinned::Cluster(c.clone()),
            Conn::Sentinel(c) => Pinned::Sentinel(c.pin().await?),
        })
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
            Conn::Sentinel(c) => return c.query(timeout, cmd).await,
        })
    }

    /// Closes what can be closed now (a pool refuses new checkouts); the
    /// multiplexed connections close when their last clone is dropped.
    pub(crate) fn close(&self) {
        match self {
            Conn::Pool(p) => p.close(),
            Conn::Sentinel(c) => c.close(),
            _ => {}
        }
    }
}

impl Pinned {
    /// Runs a script on this connection.
    pub(crate) async fn script<T: FromRedisValue>(
        &self,
        operation: &'static str,
        timeout: Duration,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T> {
        let result = match self {
            Pinned::Manager(c) => invocation.invoke_async(&mut c.clone()).await,
            Pinned::Multiplexed(c) => invocation.invoke_async(&mut c.clone()).await,
            #[cfg(feature = "cluster")]
            Pinned::Cluster(c) => invocation.invoke_async(&mut c.clone()).await,
            Pinned::Sentinel(c) => return c.script(operation, timeout, invocation).await,
        };
        result.map_err(|e| from_redis(operation, timeout, e))
    }
}

/// The connection a sequence of commands keeps (a lease's renewals and
/// release, a waiter's leave): the one it was given, replaced only when
/// found dead. Nothing more can land from a dead connection, so the
/// sequence still reaches the server in the order it was sent.
pub(crate) struct Sticky {
    conn: Mutex<Option<Pinned>>,
}

impl Sticky {
    /// Keeps `conn`, or pins one at the first command.
    pub(crate) fn new(conn: Option<&Pinned>) -> Self {
        Sticky {
            conn: Mutex::new(conn.cloned()),
        }
    }

    /// Keeps `conn` from now on.
    pub(crate) fn keep(&self, conn: &Pinned) {
        *self.conn.lock().unwrap_or_else(PoisonError::into_inner) = Some(conn.clone());
    }

    /// Lets the kept connection go (the next command pins another).
    pub(crate) fn let_go(&self) {
        *self.conn.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Runs a script on the kept connection (pinning one of the provider's
    /// first if none is kept); a connection error lets the connection go.
    pub(crate) async fn script<T: FromRedisValue>(
        &self,
        shared: &Shared,
        operation: &'static str,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T> {
        let timeout = shared.options.response_timeout;
        let current = self
            .conn
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let pinned = match current {
            Some(pinned) => pinned,
            None => {
                let pinned = shared.conn()?.pin(timeout).await?;
                self.keep(&pinned);
                pinned
            }
        };
        let reply = pinned.script(operation, timeout, invocation).await;
        if matches!(reply, Err(distlock_core::Error::Connection { .. })) {
            self.let_go();
        }
        reply
    }
}
