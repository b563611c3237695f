//! Redis Sentinel: the master found through the Sentinels and found again
//! when it goes away, as the crate docs' [Redis
//! Sentinel](crate#redis-sentinel) section tells. Here: the one multiplexed
//! connection to the current master ([`SentinelConn`]), dropped on the
//! failures that section lists, and the one re-resolve at a time
//! (`redis::sentinel::SentinelClient`, which also checks that the server it
//! names says `ROLE` master) whose outcome the commands arriving meanwhile
//! share. The failed command is reported as [`Error::Connection`]
//! (retryable), also for `READONLY`, so a lease's kept connection is let
//! go too.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use distlock_core::backend::with_timeout;
use distlock_core::{Error, Result};
use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{AsyncConnectionConfig, ConnectionAddr, RedisError, ScriptInvocation};
use tokio::time::Instant;

use crate::error::from_redis;

use crate::options::{RedisOptions, WaitReplicas};

/// Credentials and database of a Sentinel deployment: those of the master
/// (and replicas), and those of the Sentinels themselves, which often
/// differ. `Debug` never prints a password.
///
/// In a `redis+sentinel://` URL, the userinfo is the master's
/// (`redis+sentinel://user:password@h1:p1,h2:p2/mymaster`); the Sentinels'
/// are the query keys `sentinel_user` and `sentinel_password`, the database
/// the query key `db`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SentinelAuth {
    master_user: Option<String>,
    master_password: Option<String>,
    sentinel_user: Option<String>,
    sentinel_password: Option<String>,
    db: i64,
}

impl fmt::Debug for SentinelAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hidden = |p: &Option<String>| p.as_ref().map(|_| "***");
        f.debug_struct("SentinelAuth")
            .field("master_user", &self.master_user)
            .field("master_password", &hidden(&self.master_password))
            .field("sentinel_user", &self.sentinel_user)
            .field("sentinel_password", &hidden(&self.sentinel_password))
            .field("db", &self.db)
            .finish()
    }
}

impl SentinelAuth {
    /// No credentials, database 0.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Authenticates to the master (and any server Sentinel names) with
    /// `password`, as `user` (ACL) or the default user (`None`).
    #[must_use]
    pub fn master(mut self, user: Option<&str>, password: &str) -> Self {
        self.master_user = user.map(str::to_owned);
        self.master_password = Some(password.to_owned());
        self
    }

    /// Authenticates to the Sentinels with `password`, as `user` (ACL) or
    /// the default user (`None`).
    #[must_use]
    pub fn sentinels(mut self, user: Option<&str>, password: &str) -> Self {
        self.sentinel_user = user.map(str::to_owned);
        self.sentinel_password = Some(password.to_owned());
        self
    }

    /// Selects database `db` on the master. Default 0.
    #[must_use]
    pub fn db(mut self, db: i64) -> Self {
        self.db = db;
        self
    }
}

/// A Sentinel address `host:port` as the client wants it.
pub(crate) fn sentinel_addr(addr: &str) -> std::result::Result<ConnectionAddr, String> {
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| format!("Sentinel address {addr:?} is not host:port"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty()
        || host
            .chars()
            .any(|c| c.is_whitespace() || c == '/' || c == '@')
    {
        return Err(format!("Sentinel address {addr:?} has no valid host"));
    }
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("Sentinel address {addr:?} has no valid port"))?;
    Ok(ConnectionAddr::Tcp(host.to_owned(), port))
}

/// Builds the client that asks `sentinels` for `master_name`.
pub(crate) fn client(
    sentinels: &[&str],
    master_name: &str,
    auth: &SentinelAuth,
) -> Result<SentinelClient> {
    if sentinels.is_empty() {
        return Err(Error::InvalidUrl(
            "Sentinel needs at least one Sentinel address (host:port)".into(),
        ));
    }
    if master_name.is_empty()
        || master_name
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(Error::InvalidUrl(format!(
            "{master_name:?} is not a Sentinel master name"
        )));
    }
    let addrs = sentinels
        .iter()
        .map(|a| sentinel_addr(a))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(Error::InvalidUrl)?;
    let mut builder = SentinelClientBuilder::new(addrs, master_name, SentinelServerType::Master)
        .map_err(|e| Error::InvalidUrl(e.to_string()))?;
    if let Some(user) = &auth.master_user {
        builder = builder.set_client_to_redis_username(user);
    }
    if let Some(password) = &auth.master_password {
        builder = builder.set_client_to_redis_password(password);
    }
    if let Some(user) = &auth.sentinel_user {
        builder = builder.set_client_to_sentinel_username(user);
    }
    if let Some(password) = &auth.sentinel_password {
        builder = builder.set_client_to_sentinel_password(password);
    }
    if auth.db != 0 {
        builder = builder.set_client_to_redis_db(auth.db);
    }
    builder
        .build()
        .map_err(|e| Error::InvalidUrl(e.to_string()))
}

/// Asks the Sentinels for the master; shared by the command connection and
/// the subscriber.
pub(crate) struct Resolver {
    client: tokio::sync::Mutex<SentinelClient>,
    /// The address of the master found last: the subscriber moves when the
    /// command connection found another.
    master: tokio::sync::watch::Sender<Option<String>>,
}

impl fmt::Debug for Resolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Resolver")
    }
}

impl Resolver {
    pub(crate) fn new(client: SentinelClient) -> Arc<Self> {
        Arc::new(Resolver {
            client: tokio::sync::Mutex::new(client),
            master: tokio::sync::watch::Sender::new(None),
        })
    }

    /// A client for the server the Sentinels name master and that says so
    /// itself. Unbounded in time: callers bound it.
    pub(crate) async fn master_client(&self) -> redis::RedisResult<redis::Client> {
        let client = self.client.lock().await.async_get_client().await?;
        let addr = address(&client);
        self.master.send_if_modified(|known| {
            let changed = known.as_deref() != Some(addr.as_str());
            if changed {
                *known = Some(addr);
            }
            changed
        });
        Ok(client)
    }

    /// Follows the address of the master found last.
    pub(crate) fn changes(&self) -> tokio::sync::watch::Receiver<Option<String>> {
        self.master.subscribe()
    }
}

/// The address a client connects to, as `host:port`.
pub(crate) fn address(client: &redis::Client) -> String {
    client.get_connection_info().addr().to_string()
}

/// Whether `e` means the connection no longer reaches a usable master. A
/// response timeout (an I/O error to the client) is not one by itself: the
/// master may only be slow, and what was sent may still land, so a lease
/// keeps the connection (see [`SentinelPinned::script`]).
fn leaves_master(e: &RedisError) -> bool {
    !e.is_timeout() && leaves_master_or_timeout(e)
}

fn leaves_master_or_timeout(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
        || matches!(e.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
}

/// The current master's connection, with the number that tells it from
/// the ones before.
#[derive(Clone)]
struct MasterConn {
    conn: MultiplexedConnection,
    generation: u64,
    /// `host:port` of the server.
    addr: Arc<str>,
}

struct Inner {
    resolver: Arc<Resolver>,
    config: AsyncConnectionConfig,
    connect_timeout: Duration,
    current: Mutex<Option<MasterConn>>,
    /// Held while re-resolving: one at a time.
    resolving: tokio::sync::Mutex<()>,
    /// Re-resolves finished so far, and the error of the last failed one.
    resolves: AtomicU64,
    last_error: Mutex<Option<String>>,
    generations: AtomicU64,
    closed: AtomicBool,
}

/// The command connection of a Sentinel provider: the current master,
/// found again when it goes away. Cheap to clone.
#[derive(Clone)]
pub(crate) struct SentinelConn {
    inner: Arc<Inner>,
}

/// One connection to the master of the moment, kept for commands that must
/// stay in order (see [`crate::net::Pinned`]).
#[derive(Clone)]
pub(crate) struct SentinelPinned {
    master: MasterConn,
    owner: SentinelConn,
}

impl SentinelConn {
    pub(crate) fn new(resolver: Arc<Resolver>, options: &RedisOptions) -> Self {
        SentinelConn {
            inner: Arc::new(Inner {
                resolver,
                config: AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(options.connect_timeout))
                    .set_response_timeout(Some(options.response_timeout)),
                connect_timeout: options.connect_timeout,
                current: Mutex::new(None),
                resolving: tokio::sync::Mutex::new(()),
                resolves: AtomicU64::new(0),
                last_error: Mutex::new(None),
                generations: AtomicU64::new(0),
                closed: AtomicBool::new(false),
            }),
        }
    }

    fn kept(&self) -> Option<MasterConn> {
        self.inner
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The connection to the current master, resolving it through the
    /// Sentinels (within the connect timeout) when there is none.
    ///
    /// # Errors
    ///
    /// [`Error::Connection`] when no Sentinel names a reachable master,
    /// [`Error::Timeout`] when that takes longer than the connect timeout,
    /// [`Error::Closed`] once closed.
    pub(crate) async fn pin(&self) -> Result<SentinelPinned> {
        let master = self.master().await?;
        Ok(SentinelPinned {
            master,
            owner: self.clone(),
        })
    }

    async fn master(&self) -> Result<MasterConn> {
        if let Some(master) = self.kept() {
            return Ok(master);
        }
        let seen = self.inner.resolves.load(Ordering::Acquire);
        let _one = self.inner.resolving.lock().await;
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if let Some(master) = self.kept() {
            return Ok(master);
        }
        if self.inner.resolves.load(Ordering::Acquire) != seen {
            // A re-resolve finished while we waited, and failed: share its
            // outcome rather than ask again at once.
            let failed = self
                .inner
                .last_error
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            if let Some(why) = failed {
                return Err(Error::connection("redis", why));
            }
        }
        let timeout = self.inner.connect_timeout;
        let resolved = with_timeout("resolve the master through Sentinel", timeout, async {
            let client = self.inner.resolver.master_client().await?;
            let conn = client
                .get_multiplexed_async_connection_with_config(&self.inner.config)
                .await?;
            Ok::<_, RedisError>((conn, address(&client)))
        })
        .await;
        self.inner.resolves.fetch_add(1, Ordering::AcqRel);
        let failed = match resolved {
            Ok(Ok(conn)) => Ok(conn),
            Err(e) => Err(e),
            Ok(Err(e)) if e.is_timeout() => Err(Error::Timeout {
                operation: "resolve the master through Sentinel",
                after: timeout,
            }),
            Ok(Err(e)) => Err(Error::connection("redis", e)),
        };
        let (conn, addr) = match failed {
            Ok(found) => found,
            Err(e) => {
                *self
                    .inner
                    .last_error
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(e.to_string());
                tracing::debug!(error = %e, "distlock redis: no master through Sentinel");
                return Err(e);
            }
        };
        *self
            .inner
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
        let master = MasterConn {
            conn,
            addr: addr.into(),
            generation: self.inner.generations.fetch_add(1, Ordering::Relaxed) + 1,
        };
        *self
            .inner
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(master.clone());
        tracing::debug!(
            generation = master.generation,
            "distlock redis: connected to the master named by Sentinel"
        );
        Ok(master)
    }

    /// Whether the connection of `generation` is the current one.
    fn is_current(&self, generation: u64) -> bool {
        self.kept().is_some_and(|m| m.generation == generation)
    }

    /// Drops the connection of `generation` if it is still the current one:
    /// the next command resolves the master again.
    fn forget(&self, generation: u64) {
        let mut current = self
            .inner
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if current.as_ref().is_some_and(|m| m.generation == generation) {
            tracing::debug!(
                generation,
                "distlock redis: leaving the master, will ask Sentinel"
            );
            *current = None;
        }
    }

    /// Runs one command on the current master.
    pub(crate) async fn query<T: redis::FromRedisValue>(
        &self,
        timeout: Duration,
        cmd: &redis::Cmd,
    ) -> Result<redis::RedisResult<T>> {
        let master = self.master().await?;
        let watch = Watch::new(self, master.generation, timeout);
        let result = cmd.query_async(&mut master.conn.clone()).await;
        watch.done(result.as_ref().err());
        match result {
            Err(e) if leaves_master(&e) => Err(Error::connection("redis", e)),
            other => Ok(other),
        }
    }

    /// Runs a pipeline on the current master (a command and its `WAIT`).
    pub(crate) async fn query_pipe<T: redis::FromRedisValue>(
        &self,
        timeout: Duration,
        pipe: &redis::Pipeline,
    ) -> Result<redis::RedisResult<T>> {
        let master = self.master().await?;
        let watch = Watch::new(self, master.generation, timeout);
        let result = pipe.query_async(&mut master.conn.clone()).await;
        watch.done(result.as_ref().err());
        match result {
            Err(e) if leaves_master(&e) => Err(Error::connection("redis", e)),
            other => Ok(other),
        }
    }

    /// Lets the connection go; later commands fail with `Closed`.
    pub(crate) fn close(&self) {
        self.inner.closed.store(true, Ordering::Release);
        *self
            .inner
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }
}

impl SentinelPinned {
    /// Runs a script on this connection. An error that means the master is
    /// gone (or is no master any more) is [`Error::Connection`].
    pub(crate) async fn script<T: redis::FromRedisValue>(
        &self,
        operation: &'static str,
        timeout: Duration,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T> {
        Ok(self
            .script_acked(operation, timeout, invocation, None)
            .await?
            .0)
    }

    /// As [`SentinelPinned::script`], followed by `WAIT` in the same
    /// pipeline when `wait` is set (see [`Pinned::script_acked`](crate::net::Pinned::script_acked)).
    pub(crate) async fn script_acked<T: redis::FromRedisValue>(
        &self,
        operation: &'static str,
        timeout: Duration,
        invocation: &ScriptInvocation<'_>,
        wait: Option<WaitReplicas>,
    ) -> Result<(T, Option<u32>)> {
        if !self.owner.is_current(self.master.generation) {
            // This connection was dropped as the master's (a timeout, on
            // it or another). If the Sentinels now name another server,
            // this one is no master any more: let it go (reported as a
            // connection error, so a lease's kept connection moves). If
            // they name the same server, keep it: commands sent on it stay
            // in order. If nobody can tell now, keep it too.
            if let Ok(now) = self.owner.master().await {
                if now.addr != self.master.addr {
                    return Err(Error::connection(
                        "redis",
                        format!(
                            "the master moved from {} to {} (Sentinel)",
                            self.master.addr, now.addr
                        ),
                    ));
                }
            }
        }
        let watch = Watch::new(&self.owner, self.master.generation, timeout);
        let (result, acked) = match wait {
            None => (
                invocation.invoke_async(&mut self.master.conn.clone()).await,
                None,
            ),
            Some(wait) => {
                let (result, acked) = crate::net::wait::with_wait(
                    self.master.conn.clone(),
                    &crate::net::wait::wait_cmd(wait),
                    invocation,
                )
                .await;
                (result, Some(acked))
            }
        };
        watch.done(result.as_ref().err());
        let reply = result.map_err(|e| {
            if leaves_master(&e) {
                Error::connection("redis", e)
            } else {
                from_redis(operation, timeout, e)
            }
        })?;
        Ok((reply, acked))
    }
}

/// Watches one command: a reply that says the master is gone, a command
/// that timed out, or one dropped after waiting its whole response timeout
/// (a caller's own timer fired first), makes the connection be dropped. A
/// master that is frozen, or cut off, never answers; the Sentinels may have
/// promoted another meanwhile.
struct Watch {
    owner: SentinelConn,
    generation: u64,
    timeout: Duration,
    started: Instant,
    finished: bool,
}

impl Watch {
    fn new(owner: &SentinelConn, generation: u64, timeout: Duration) -> Self {
        Watch {
            owner: owner.clone(),
            generation,
            timeout,
            started: Instant::now(),
            finished: false,
        }
    }

    fn done(mut self, error: Option<&RedisError>) {
        self.finished = true;
        if error.is_some_and(leaves_master_or_timeout) {
            self.owner.forget(self.generation);
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if !self.finished && self.started.elapsed() >= self.timeout {
            self.owner.forget(self.generation);
        }
    }
}
