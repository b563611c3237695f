//! The command connection: one auto-reconnecting multiplexed connection, a
//! deadpool pool, a Cluster connection, or the master found through
//! Sentinel.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use distlock_core::{Error, Result};
use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::{Cmd, FromRedisValue, Pipeline, RedisFuture, ScriptInvocation, Value};

use crate::error::{from_redis, map_pool};
use crate::options::WaitReplicas;
use wait::{wait_cmd, with_wait};

pub(crate) mod sentinel;
pub(crate) mod wait;

/// A provider's command connection (`None` once closed), with the response
/// timeout and the `WAIT` its commands obey: what a sequence of commands
/// ([`Sticky`]) needs of the provider, and nothing of its callers.
pub(crate) struct Commands {
    conn: RwLock<Option<Conn>>,
    /// The response timeout `T`.
    pub(crate) timeout: Duration,
    /// The replicas a write waits for, if any.
    pub(crate) wait: Option<WaitReplicas>,
}

impl fmt::Debug for Commands {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Commands")
            .field(&*self.conn.read().unwrap_or_else(PoisonError::into_inner))
            .finish()
    }
}

impl Commands {
    pub(crate) fn new(conn: Conn, timeout: Duration, wait: Option<WaitReplicas>) -> Commands {
        Commands {
            conn: RwLock::new(Some(conn)),
            timeout,
            wait,
        }
    }

    /// The command connection.
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] once the provider is closed.
    pub(crate) fn conn(&self) -> Result<Conn> {
        self.conn
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or(Error::Closed)
    }

    /// Takes the connection out (the provider closes).
    pub(crate) fn take(&self) -> Option<Conn> {
        self.conn
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

#[derive(Clone)]
pub(crate) enum Conn {
    /// One multiplexed connection, reconnected by the client when it drops,
    /// and replaced when it leaves a command unanswered (see [`Single`]).
    Single(Single),
    /// A deadpool pool of multiplexed connections.
    Pool(deadpool_redis::Pool),
    /// Redis Cluster: commands routed by key slot.
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
    /// The master named by Sentinel, found again when it goes away.
    Sentinel(crate::net::sentinel::SentinelConn),
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
    Manager(Watched),
    Multiplexed(MultiplexedConnection),
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
    /// The connection to the master of the moment; an error that means the
    /// master is gone is [`Error::Connection`](distlock_core::Error::Connection), so a
    /// [`Sticky`] lets it go.
    Sentinel(crate::net::sentinel::SentinelPinned),
}

impl Conn {
    /// A connection for commands that must stay in order; for a pool, one
    /// checkout whose multiplexed connection is kept.
    pub(crate) async fn pin(&self, timeout: Duration) -> Result<Pinned> {
        Ok(match self {
            Conn::Single(c) => Pinned::Manager(c.current()),
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
            Conn::Single(c) => cmd.query_async(&mut c.current()).await,
            Conn::Pool(p) => {
                let mut c = p.get().await.map_err(|e| map_pool(timeout, e))?;
                cmd.query_async(&mut c).await
            }
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => cmd.query_async(&mut c.clone()).await,
            Conn::Sentinel(c) => return c.query(timeout, cmd).await,
        })
    }

    /// Runs one command followed by the provider's `WAIT` (if `wait` is
    /// set) in one pipeline; returns the command's reply (the client's own
    /// error) and the replicas that acknowledged (`None` without `wait`).
    pub(crate) async fn query_acked<T: FromRedisValue>(
        &self,
        timeout: Duration,
        cmd: &Cmd,
        wait: Option<WaitReplicas>,
    ) -> Result<redis::RedisResult<(T, Option<u32>)>> {
        let Some(wait) = wait else {
            return Ok(self.query(timeout, cmd).await?.map(|reply| (reply, None)));
        };
        let mut pipe = redis::pipe();
        pipe.add_command(cmd.clone()).add_command(wait_cmd(wait));
        let reply: redis::RedisResult<(T, i64)> = match self {
            Conn::Single(c) => pipe.query_async(&mut c.current()).await,
            Conn::Pool(p) => {
                let mut c = p.get().await.map_err(|e| map_pool(timeout, e))?;
                pipe.query_async(&mut c).await
            }
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => pipe.query_async(&mut c.clone()).await,
            Conn::Sentinel(c) => c.query_pipe(timeout, &pipe).await?,
        };
        Ok(reply.map(|(reply, acked)| (reply, Some(u32::try_from(acked).unwrap_or(0)))))
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

/// The single command connection ([`Conn::Single`]): redis-rs's
/// `ConnectionManager` reconnects when the socket drops, but a response
/// timeout is no reconnect trigger for it (it retries on the same
/// connection), so a half-open connection would time every command out
/// for good. Here a command left unanswered for a response timeout (its
/// reply timed out, or its caller gave up on it after most of one: the
/// provider's own timeouts are the same `T`) replaces the manager with a
/// fresh one (connecting at its first command); commands already on the
/// old one finish or time out there. Nothing changes while commands are
/// answered.
#[derive(Clone)]
pub(crate) struct Single(Arc<SingleSlot>);

struct SingleSlot {
    client: redis::Client,
    config: ConnectionManagerConfig,
    /// The response timeout `T`.
    timeout: Duration,
    /// The manager of the moment and its generation (counts replacements).
    current: Mutex<(u64, ConnectionManager)>,
}

impl Single {
    /// `manager`, made from `client` with `config`, replaced by a fresh one
    /// made alike when it leaves a command unanswered for `timeout`.
    pub(crate) fn new(
        client: redis::Client,
        config: ConnectionManagerConfig,
        timeout: Duration,
        manager: ConnectionManager,
    ) -> Single {
        Single(Arc::new(SingleSlot {
            client,
            config,
            timeout,
            current: Mutex::new((0, manager)),
        }))
    }

    /// The manager of the moment.
    fn current(&self) -> Watched {
        let current = self
            .0
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Watched {
            conn: current.1.clone(),
            generation: current.0,
            slot: Arc::clone(&self.0),
        }
    }
}

impl SingleSlot {
    /// Replaces the manager of `generation` (not a newer one).
    fn replace(&self, generation: u64) {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if current.0 != generation {
            return;
        }
        match ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone()) {
            Ok(fresh) => {
                tracing::debug!("distlock redis command connection does not answer: replacing it");
                *current = (generation + 1, fresh);
            }
            Err(e) => {
                tracing::debug!(error = %e, "distlock redis cannot replace the command connection");
            }
        }
    }
}

/// One manager of a [`Single`], as the commands sent through it see it.
#[derive(Clone)]
pub(crate) struct Watched {
    conn: ConnectionManager,
    generation: u64,
    slot: Arc<SingleSlot>,
}

/// A command in flight on a [`Watched`]: dropped unanswered (timed out, or
/// given up after three quarters of a response timeout), it replaces the
/// manager.
struct Unanswered {
    slot: Arc<SingleSlot>,
    generation: u64,
    since: tokio::time::Instant,
    answered: bool,
}

impl Unanswered {
    fn new(on: &Watched) -> Unanswered {
        Unanswered {
            slot: Arc::clone(&on.slot),
            generation: on.generation,
            since: tokio::time::Instant::now(),
            answered: false,
        }
    }

    fn over<T>(mut self, result: &redis::RedisResult<T>) {
        self.answered = !matches!(result, Err(e) if e.is_timeout());
    }
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        if !self.answered && self.since.elapsed() >= self.slot.timeout * 3 / 4 {
            self.slot.replace(self.generation);
        }
    }
}

impl ConnectionLike for Watched {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let watch = Unanswered::new(self);
            let result = self.conn.req_packed_command(cmd).await;
            watch.over(&result);
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let watch = Unanswered::new(self);
            let result = self.conn.req_packed_commands(pipeline, offset, count).await;
            watch.over(&result);
            result
        })
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
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

    /// Runs a script on this connection, followed by `WAIT` in the same
    /// pipeline when `wait` is set: both reach the server on one socket, one
    /// after the other, so the `WAIT` counts replicas that have the script's
    /// write (a `WAIT` sent alone after a reconnect would count nothing and
    /// answer at once). Returns the script's reply and the number of
    /// replicas that acknowledged (`None` without `wait`).
    pub(crate) async fn script_acked<T: FromRedisValue>(
        &self,
        operation: &'static str,
        timeout: Duration,
        invocation: &ScriptInvocation<'_>,
        wait: Option<WaitReplicas>,
    ) -> Result<(T, Option<u32>)> {
        let Some(wait) = wait else {
            return Ok((self.script(operation, timeout, invocation).await?, None));
        };
        let wait_cmd = wait_cmd(wait);
        let (result, acked) = match self {
            Pinned::Manager(c) => with_wait(c.clone(), &wait_cmd, invocation).await,
            Pinned::Multiplexed(c) => with_wait(c.clone(), &wait_cmd, invocation).await,
            #[cfg(feature = "cluster")]
            Pinned::Cluster(c) => with_wait(c.clone(), &wait_cmd, invocation).await,
            Pinned::Sentinel(c) => {
                return c
                    .script_acked(operation, timeout, invocation, Some(wait))
                    .await
            }
        };
        let reply = result.map_err(|e| from_redis(operation, timeout, e))?;
        Ok((reply, Some(acked)))
    }
}

/// The connection a sequence of commands keeps (a lease's renewals and
/// release, a waiter's leave): the one it was given, replaced only when
/// found dead. Nothing more can land from a dead connection, so the
/// sequence still reaches the server in the order it was sent.
pub(crate) struct Sticky {
    /// Boxed: a fair waiter lets it go while it waits, and then keeps only
    /// the pointer's room.
    conn: Mutex<Option<Box<Pinned>>>,
}

impl Sticky {
    /// Keeps `conn`, or pins one at the first command.
    pub(crate) fn new(conn: Option<&Pinned>) -> Self {
        Sticky {
            conn: Mutex::new(conn.map(|c| Box::new(c.clone()))),
        }
    }

    /// Keeps `conn` from now on.
    pub(crate) fn keep(&self, conn: &Pinned) {
        *self.conn.lock().unwrap_or_else(PoisonError::into_inner) = Some(Box::new(conn.clone()));
    }

    /// Lets the kept connection go (the next command pins another).
    pub(crate) fn let_go(&self) {
        *self.conn.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// The kept connection, or one of the provider's pinned and kept.
    async fn pinned(&self, commands: &Commands) -> Result<Pinned> {
        let current = self
            .conn
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_deref()
            .cloned();
        match current {
            Some(pinned) => Ok(pinned),
            None => {
                let pinned = commands.conn()?.pin(commands.timeout).await?;
                self.keep(&pinned);
                Ok(pinned)
            }
        }
    }

    /// Runs a script on the kept connection (pinning one of the provider's
    /// first if none is kept); a connection error lets the connection go.
    pub(crate) async fn script<T: FromRedisValue>(
        &self,
        commands: &Commands,
        operation: &'static str,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T> {
        let timeout = commands.timeout;
        let pinned = self.pinned(commands).await?;
        let reply = pinned.script(operation, timeout, invocation).await;
        if matches!(reply, Err(distlock_core::Error::Connection { .. })) {
            self.let_go();
        }
        reply
    }

    /// As [`Sticky::script`], followed by the provider's `WAIT` (if set) in
    /// the same pipeline; see [`Pinned::script_acked`].
    pub(crate) async fn script_acked<T: FromRedisValue>(
        &self,
        commands: &Commands,
        operation: &'static str,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<(T, Option<u32>)> {
        let timeout = commands.timeout;
        let pinned = self.pinned(commands).await?;
        let reply = pinned
            .script_acked(operation, timeout, invocation, commands.wait)
            .await;
        if matches!(reply, Err(distlock_core::Error::Connection { .. })) {
            self.let_go();
        }
        reply
    }
}
