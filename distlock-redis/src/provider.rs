//! The Redis provider: connections, the shared subscriber, and the
//! primitives it hands out.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use async_trait::async_trait;
use distlock_core::backend::check_permits;
use distlock_core::backend::{with_timeout, BlockIds, Lifecycle};
use distlock_core::inspect::owner_identity;
use distlock_core::{
    Election, Error, ForceReleased, Holder, IdGenerator, LeaseOptions, Lock, Name, PrimitiveKind,
    Provider, ReadWriteLock, Result, Semaphore, Snapshot,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::context::Context;
use crate::error::from_redis;
use crate::ids::RedisIds;
use crate::keys::Keys;
use crate::line::{pass_unclaimed, refresh_places};
use crate::mutex::RedisMutex;
use crate::net::{Commands, Conn};
use crate::options::RedisOptions;
use crate::target::Server;
use crate::wake::subscriber::{Source, Subscriber};
use crate::wake::tracker::Tracker;

/// A connected Redis backend.
///
/// Cheap to clone: clones share the connection (or pool) and the pub/sub
/// subscriber. Two providers made by separate `connect` calls are separate
/// clients. [`Provider::with_lease`] gives a clone with other lease options.
#[derive(Clone)]
pub struct RedisProvider {
    pub(crate) shared: Arc<Context>,
    /// The lease of the primitives it hands out: the options' default
    /// lease, or the one given to `with_lease`.
    lease: LeaseOptions,
}

impl fmt::Debug for RedisProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisProvider")
            .field("conn", &self.shared.commands)
            .field("prefix", &self.shared.options.prefix)
            .finish_non_exhaustive()
    }
}

/// Runs a connect within `timeout`, mapping both ways it can fail.
async fn connect_within<T>(
    timeout: std::time::Duration,
    connect: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<T> {
    with_timeout("connect", timeout, connect)
        .await?
        .map_err(|e| from_redis("connect", timeout, e))
}

fn open_client(url: &str, options: &RedisOptions) -> Result<redis::Client> {
    let invalid = |e: redis::RedisError| Error::InvalidUrl(format!("{e}"));
    #[cfg(feature = "tls")]
    {
        // rustls needs a process-wide crypto provider; install ring's unless
        // the application chose one.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let tls = &options.tls;
        if tls.root_cert.is_some() || tls.client_cert.is_some() {
            let certificates = redis::TlsCertificates {
                client_tls: tls.client_cert.clone().map(|(client_cert, client_key)| {
                    redis::ClientTlsConfig {
                        client_cert,
                        client_key,
                    }
                }),
                root_cert: tls.root_cert.clone(),
            };
            return redis::Client::build_with_tls(url, certificates).map_err(invalid);
        }
    }
    #[cfg(not(feature = "tls"))]
    let _ = options;
    redis::Client::open(url).map_err(invalid)
}

impl RedisProvider {
    /// Connects to `url` (`redis://[user:password@]host:port[/db][?options]`,
    /// `rediss://…` with the `tls` feature,
    /// `redis+sentinel://[user:password@]host:port[,host:port…]/master-name[?options]`
    /// through Sentinel, see [the crate docs](crate#redis-sentinel)), with
    /// options from the URL's query (see [`RedisOptions`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] / [`Error::InvalidOptions`] for a bad URL or
    /// option; [`Error::Connection`] or [`Error::Timeout`] when the server
    /// cannot be reached within the connect timeout.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: a dropped connect leaves no connection open.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, RedisOptions::new()).await
    }

    /// Connects with `options`; the URL's query may still override them.
    ///
    /// # Errors
    ///
    /// As [`RedisProvider::connect`].
    ///
    /// # Cancellation safety
    ///
    /// As [`RedisProvider::connect`].
    pub async fn connect_with(url: &str, options: RedisOptions) -> Result<Self> {
        // Boxed: a future of its own keeps the callers' connect futures
        // (one more level deep since the URL is read first) shallow.
        Box::pin(Self::connect_server(Server::parse(url, options)?)).await
    }

    /// Connects to the server a URL named (see [`Server::parse`]).
    pub(crate) async fn connect_server(server: Server) -> Result<Self> {
        let (url, options) = match server {
            Server::Sentinel(parsed) => {
                let sentinels: Vec<&str> = parsed.sentinels.iter().map(String::as_str).collect();
                return Self::connect_sentinel_with(
                    &sentinels,
                    &parsed.master_name,
                    parsed.auth,
                    parsed.options,
                )
                .await;
            }
            Server::Single { url, options } => (url, options),
        };
        options.validate()?;
        let client = open_client(&url, &options)?;
        let timeout = options.connect_timeout;
        let conn = match options.pool_size {
            None => {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(options.connect_timeout))
                    .set_response_timeout(Some(options.response_timeout))
                    .set_number_of_retries(2)
                    .set_min_delay(std::time::Duration::from_millis(10))
                    .set_max_delay(std::time::Duration::from_millis(500));
                let manager = connect_within(
                    timeout,
                    ConnectionManager::new_with_config(client.clone(), config.clone()),
                )
                .await?;
                Conn::Single(crate::net::Single::new(
                    client.clone(),
                    config,
                    options.response_timeout,
                    manager,
                ))
            }
            Some(size) => {
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(options.connect_timeout))
                    .set_response_timeout(Some(options.response_timeout));
                let manager = deadpool_redis::Manager::new_with_config(
                    client.get_connection_info().clone(),
                    config,
                )
                .map_err(|e| Error::InvalidUrl(e.to_string()))?;
                let pool = deadpool_redis::Pool::builder(manager)
                    .max_size(size)
                    .wait_timeout(Some(options.connect_timeout))
                    .create_timeout(Some(options.connect_timeout))
                    .recycle_timeout(Some(options.response_timeout))
                    .runtime(deadpool_redis::Runtime::Tokio1)
                    .build()
                    .map_err(|e| Error::InvalidOptions(e.to_string()))?;
                // Fail now, not at the first lock, if the server is not there.
                drop(
                    pool.get()
                        .await
                        .map_err(|e| crate::error::map_pool(timeout, e))?,
                );
                Conn::Pool(pool)
            }
        };
        let tracker = Tracker::new(Some(&client), options.response_timeout);
        Ok(Self::from_parts(
            conn,
            Source::Fixed(Box::new(client)),
            tracker,
            options,
        ))
    }

    /// Connects to a Redis Cluster through any of its `nodes`
    /// (`redis://host:port` each). A lock's keys all live in its lock key's
    /// slot; release messages use classic pub/sub, which the cluster
    /// broadcasts to every node, so the provider's pub/sub connection may
    /// be on any node: it starts on the first of `nodes` and moves to the
    /// next when its node fails or goes silent (see the crate docs,
    /// "Liveness").
    ///
    /// # Errors
    ///
    /// As [`RedisProvider::connect`]; [`Error::InvalidUrl`] for no nodes.
    ///
    /// # Cancellation safety
    ///
    /// As [`RedisProvider::connect`].
    #[cfg(feature = "cluster")]
    pub async fn connect_cluster(nodes: &[&str], options: RedisOptions) -> Result<Self> {
        options.validate()?;
        if nodes.is_empty() {
            return Err(Error::InvalidUrl(
                "a cluster needs at least one node".into(),
            ));
        }
        // The subscriber may use any node: it starts at the first seed and
        // moves to the next when one fails or goes silent.
        let clients = nodes
            .iter()
            .map(|node| open_client(node, &options))
            .collect::<Result<Vec<_>>>()?;
        let timeout = options.connect_timeout;
        let cluster = redis::cluster::ClusterClient::builder(nodes.iter().copied())
            .connection_timeout(options.connect_timeout)
            .response_timeout(options.response_timeout)
            .retries(2)
            .build()
            .map_err(|e| Error::InvalidUrl(e.to_string()))?;
        let conn = connect_within(timeout, cluster.get_async_connection()).await?;
        // No client tracking: a key's changes are pushed by the node that
        // holds its slot, and the tracker keeps one connection.
        let tracker = Tracker::new(None, options.response_timeout);
        Ok(Self::from_parts(
            Conn::Cluster(conn),
            Source::Seeds { clients, at: 0 },
            tracker,
            options,
        ))
    }

    /// Connects to the master that the Sentinels at `sentinels` (`host:port`
    /// each) name `master_name`, without credentials; see
    /// [`RedisProvider::connect_sentinel_with`].
    ///
    /// # Errors
    ///
    /// As [`RedisProvider::connect_sentinel_with`].
    ///
    /// # Cancellation safety
    ///
    /// As [`RedisProvider::connect`].
    pub async fn connect_sentinel(
        sentinels: &[&str],
        master_name: &str,
        options: RedisOptions,
    ) -> Result<Self> {
        Self::connect_sentinel_with(sentinels, master_name, crate::SentinelAuth::new(), options)
            .await
    }

    /// Connects to the master that the Sentinels at `sentinels` (`host:port`
    /// each) name `master_name`, with `auth` for the master and the
    /// Sentinels, and follows failovers: see [the crate
    /// docs](crate#redis-sentinel). A pool (`pool_size`) is not supported
    /// with Sentinel.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for no Sentinel, a bad address or master name;
    /// [`Error::InvalidOptions`] for a bad option or a `pool_size`;
    /// [`Error::Connection`] when no Sentinel answers or none names a
    /// reachable master, [`Error::Timeout`] when finding and connecting to
    /// it takes longer than the connect timeout.
    ///
    /// # Cancellation safety
    ///
    /// As [`RedisProvider::connect`].
    pub async fn connect_sentinel_with(
        sentinels: &[&str],
        master_name: &str,
        auth: crate::SentinelAuth,
        options: RedisOptions,
    ) -> Result<Self> {
        options.validate()?;
        options.refuse_tls("redis+sentinel")?;
        if options.pool_size.is_some() {
            return Err(Error::InvalidOptions(
                "pool_size is not supported with Sentinel (one multiplexed connection to the master)"
                    .into(),
            ));
        }
        let client = crate::net::sentinel::client(sentinels, master_name, &auth)?;
        let resolver = crate::net::sentinel::Resolver::new(client);
        let conn = crate::net::sentinel::SentinelConn::new(Arc::clone(&resolver), &options);
        // Fail now, not at the first lock, if no master can be found.
        conn.pin().await?;
        // No client tracking: its connection would have to follow the
        // master through failovers; foreign holders are polled.
        let tracker = Tracker::new(None, options.response_timeout);
        Ok(Self::from_parts(
            Conn::Sentinel(conn),
            Source::Sentinel(resolver),
            tracker,
            options,
        ))
    }

    fn from_parts(conn: Conn, client: Source, tracker: Tracker, options: RedisOptions) -> Self {
        let subscriber = Subscriber::spawn(client, crate::wake::subscriber::Timing::of(&options));
        // The label was checked by `validate`; an identity without it is
        // the fallback that cannot fail.
        let owner = owner_identity(options.owner_label.as_deref())
            .or_else(|_| owner_identity(None))
            .unwrap_or_else(|_| "unknown".to_owned());
        let lifecycle = Lifecycle::new();
        lifecycle.set_owner(&owner);
        let unclaimed = subscriber.take_unclaimed();
        let refreshes = subscriber.take_refreshes();
        let shared = Arc::new(Context {
            commands: Commands::new(conn, options.response_timeout, options.wait),
            subscriber,
            tracker,
            options,
            lifecycle,
            owner,
            replies: crate::context::Replies::default(),
        });
        if let Some(unclaimed) = unclaimed {
            tokio::spawn(pass_unclaimed(Arc::downgrade(&shared), unclaimed));
            if let Some(refreshes) = refreshes {
                tokio::spawn(refresh_places(Arc::downgrade(&shared), refreshes));
            }
        }
        RedisProvider {
            lease: shared.options.lease,
            shared,
        }
    }

    /// The options in force.
    #[must_use]
    pub fn options(&self) -> &RedisOptions {
        &self.shared.options
    }

    /// The Redis key of the lock `name`: the prefix followed by the name.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a bad name.
    pub fn lock_key(&self, name: &str) -> Result<String> {
        Ok(Keys::lock(&self.shared.options.prefix, &Name::new(name)?).lock)
    }

    /// Wake-ups the shared subscriber has delivered to waiters so far (for
    /// benches and tests): a release message that woke a waiter of a name,
    /// or a hand-over addressed to one fair waiter.
    #[must_use]
    pub fn wakeups(&self) -> u64 {
        self.shared
            .subscriber
            .stats
            .messages
            .load(Ordering::Relaxed)
    }

    /// This provider's id in the line of a plain mutex's waiting providers
    /// (`{PREFIX NAME}:waiting`, see the crate docs' key table): `p` and 32
    /// hex digits, new for each provider.
    #[must_use]
    pub fn line_id(&self) -> &str {
        self.shared.subscriber.id()
    }

    /// Pub/sub connections the shared subscriber has opened so far.
    #[must_use]
    pub fn subscriber_connections(&self) -> u64 {
        self.shared
            .subscriber
            .stats
            .connections
            .load(Ordering::Relaxed)
    }

    /// Script calls (`EVALSHA` of `line_alive`) this provider has made so
    /// far to keep its places in plain mutexes' lines alive after its
    /// pub/sub connection answered a health check (see
    /// [Liveness](crate#liveness)); for tests and benches that count a
    /// waiter's server calls.
    #[must_use]
    pub fn line_refreshes(&self) -> u64 {
        self.shared
            .subscriber
            .stats
            .refreshes
            .load(Ordering::Relaxed)
    }
}

#[async_trait]
impl Provider for RedisProvider {
    fn backend(&self) -> &'static str {
        "redis"
    }

    async fn close(&self) -> Result<()> {
        // Waiters wake and leave, held leases are reported lost and released
        // while the connection is still there; then it goes.
        self.shared.subscriber.closing();
        let released = self.shared.lifecycle.close().await;
        // The waiters woken by the close leave their lines and queues on
        // this connection (a waiting fair waiter keeps none of its own, and
        // a plain waiter's line leave goes through the pass task): bounded,
        // a leave gives up after a response timeout, and an entry expires
        // by itself anyway.
        let leaves = self.shared.options.response_timeout;
        self.shared.subscriber.outstanding.drained(leaves).await;
        self.shared.subscriber.shut_down();
        self.shared.tracker.shut_down();
        if let Some(conn) = self.shared.commands.take() {
            conn.close();
        }
        released
    }

    fn default_lease(&self) -> LeaseOptions {
        self.lease
    }

    /// A clone sharing the connection (or pool), subscriber and held
    /// leases, with `lease`; any TTL lease is accepted.
    fn with_lease(&self, lease: LeaseOptions) -> Result<Arc<dyn Provider>> {
        self.shared.lifecycle.check_open()?;
        Ok(Arc::new(RedisProvider {
            shared: Arc::clone(&self.shared),
            lease,
        }))
    }

    fn owner(&self) -> &str {
        &self.shared.owner
    }

    /// One Lua script (one round trip): see [the crate
    /// docs](crate#inspect-and-force-release). The fair mutex shares the
    /// mutex's lock key, so both kinds show the same holder and the fair
    /// queue's waiters. Fencing tokens and acquisition times are the holder
    /// records' (server `TIME`); a foreign hold shows its lease (PTTL) only.
    async fn inspect(&self, name: &str, kind: PrimitiveKind) -> Result<Snapshot> {
        crate::ops::inspect(&self.shared, name, kind).await
    }

    /// Marks every hold of `name` as `kind` in the kind's requests hash
    /// (`{name}:revoke`, `…:rw:revoke`, `…:sem:revoke`, `…:elect:revoke`;
    /// one script), then reads the holders back as
    /// [`inspect`](Provider::inspect) does. The holder hears it at its
    /// next renewal (every `ttl / 3` by default): there is no message, as
    /// a holder listens to nothing while it holds. A foreign holder
    /// (redis-py) is marked and returned, but cannot hear it.
    async fn request_release(&self, name: &str, kind: PrimitiveKind) -> Result<Vec<Holder>> {
        crate::ops::request_release(&self.shared, name, kind).await
    }

    /// One Lua script per kind (one round trip): deletes the hold(s) and
    /// their records, advances the fencing counter as an acquisition does,
    /// and publishes what a release would (the queued waiters let in are
    /// woken). See [the crate docs](crate#inspect-and-force-release).
    async fn force_release(&self, name: &str, kind: PrimitiveKind) -> Result<ForceReleased> {
        crate::ops::force_release(&self.shared, name, kind).await
    }

    fn mutex(&self, name: &str) -> Result<Arc<dyn Lock>> {
        self.shared.lifecycle.check_open()?;
        let name = Name::new(name)?;
        Ok(Arc::new(RedisMutex {
            shared: Arc::clone(&self.shared),
            keys: Arc::new(Keys::plain_mutex(&self.shared.options.prefix, &name)),
            name,
            lease: self.lease,
        }))
    }

    fn fair_mutex(&self, name: &str) -> Result<Arc<dyn Lock>> {
        self.shared.lifecycle.check_open()?;
        crate::fair_mutex::fair_mutex(&self.shared, Name::new(name)?, self.lease)
    }

    fn election(&self, name: &str) -> Result<Arc<dyn Election>> {
        self.shared.lifecycle.check_open()?;
        crate::election::election(&self.shared, Name::new(name)?, self.lease)
    }

    fn rw_lock(&self, name: &str) -> Result<Arc<dyn ReadWriteLock>> {
        self.shared.lifecycle.check_open()?;
        crate::rw_lock::rw_lock(&self.shared, Name::new(name)?, self.lease)
    }

    fn semaphore(&self, name: &str, permits: u32) -> Result<Arc<dyn Semaphore>> {
        self.shared.lifecycle.check_open()?;
        let name = Name::new(name)?;
        crate::semaphore::semaphore(&self.shared, name, check_permits(permits)?, self.lease)
    }

    fn id_generator(&self, name: &str, block_size: u64) -> Result<Arc<dyn IdGenerator>> {
        self.shared.lifecycle.check_open()?;
        let name = Name::new(name)?;
        let source = RedisIds {
            shared: Arc::clone(&self.shared),
            key: format!("{{{}{name}}}:ids", self.shared.options.prefix),
            name: name.clone(),
        };
        Ok(Arc::new(BlockIds::new(name, source, block_size)?))
    }
}
