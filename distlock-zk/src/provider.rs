//! The ZooKeeper provider.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::backend::check_permits;
use distlock_core::backend::{BlockIds, Lifecycle};
use distlock_core::{
    Election, Error, ForceReleased, Holder, IdGenerator, LeaseOptions, Lock, Name, PrimitiveKind,
    Provider, ReadWriteLock, Result, Semaphore, Snapshot,
};

use crate::context::{Context, Stats};
use crate::election::ZkElection;
use crate::fair_mutex::FairMutex;
use crate::ids::ZkIds;
use crate::layout::{dir, owner_data};
use crate::options::ZkOptions;
use crate::session::{self, Sessions};
use crate::unfair_mutex::UnfairMutex;

/// A connected ZooKeeper backend.
///
/// Cheap to clone: clones share the session. The session is the lease of
/// every lock it holds; when it expires, those leases are lost and the
/// provider opens a new session by itself at the next operation.
/// [`Provider::with_lease`] gives a clone whose primitives have a
/// [`LeaseOptions::max_hold`], the one lease option a session honours.
#[derive(Clone)]
pub struct ZkProvider {
    ctx: Arc<Context>,
    /// The lease of the primitives it hands out: the session's default,
    /// with the `max_hold` given to `with_lease`, if any.
    lease: LeaseOptions,
}

impl fmt::Debug for ZkProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkProvider")
            .field("hosts", &self.ctx.sessions.options().hosts)
            .field("root", &self.ctx.sessions.options().root)
            .finish_non_exhaustive()
    }
}

impl ZkProvider {
    /// Connects to `zk://[user:password@]host:port[,host:port…][/chroot][?options]`
    /// (see [`ZkOptions::from_url`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`](distlock_core::Error::InvalidUrl) or
    /// [`Error::InvalidOptions`](distlock_core::Error::InvalidOptions) for a
    /// bad URL; [`Error::Timeout`](distlock_core::Error::Timeout) or a
    /// connection error when no session can be opened within the connect
    /// timeout.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: a dropped connect leaves no session open.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(ZkOptions::from_url(url)?).await
    }

    /// Connects with `options`.
    ///
    /// # Errors
    ///
    /// As [`ZkProvider::connect`].
    ///
    /// # Cancellation safety
    ///
    /// As [`ZkProvider::connect`].
    pub async fn connect_with(options: ZkOptions) -> Result<Self> {
        options.validate()?;
        let owner = options.owner()?;
        let first = session::open(&options).await?;
        let lifecycle = Lifecycle::new();
        lifecycle.set_owner(&owner);
        Ok(ZkProvider {
            lease: LeaseOptions::default(),
            ctx: Arc::new(Context {
                authenticated: options.digest.is_some(),
                timeout: options.operation_timeout,
                sessions: Sessions::new(options, first),
                stats: Stats::default(),
                lifecycle,
                owner_data: owner_data(&owner),
                owner,
            }),
        })
    }

    /// The node path of the primitive `name`: root + `/` + name.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`](distlock_core::Error::InvalidName) for a bad
    /// name.
    pub fn path(&self, name: &str) -> Result<String> {
        Ok(dir(&self.ctx.sessions.options().root, &Name::new(name)?))
    }

    /// The id of the current session, opening one if needed.
    ///
    /// # Errors
    ///
    /// A connection error when no session can be opened.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe.
    pub async fn session_id(&self) -> Result<i64> {
        Ok(self.ctx.sessions.get().await?.id)
    }

    /// The current session's timeout as negotiated with the server.
    ///
    /// # Errors
    ///
    /// A connection error when no session can be opened.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe.
    pub async fn session_timeout(&self) -> Result<Duration> {
        Ok(self.ctx.sessions.get().await?.timeout())
    }

    /// Watch notifications that woke a waiter so far (for benches and tests).
    #[must_use]
    pub fn watch_events(&self) -> u64 {
        self.ctx.stats.watch_events.load(Ordering::Relaxed)
    }

    /// A primitive's name and directory, after the check every primitive
    /// makes: the provider is open.
    fn named(&self, name: &str) -> Result<(Name, String)> {
        self.ctx.lifecycle.check_open()?;
        let name = Name::new(name)?;
        let dir = dir(&self.ctx.sessions.options().root, &name);
        Ok((name, dir))
    }

    /// The lease's `max_hold`: the only lease option a session lease can
    /// honour (the guard ends the hold and deletes its node at the limit).
    fn hold(&self) -> Option<Duration> {
        self.lease.hold_limit()
    }
}

/// Refuses lease options a session cannot honour: any TTL or renewal other
/// than the session's default.
fn check_lease(lease: LeaseOptions) -> Result<()> {
    let default = LeaseOptions::default();
    if lease.ttl() == default.ttl() && lease.renewal() == default.renewal() {
        return Ok(());
    }
    let asked = match lease.renewal() {
        distlock_core::Renewal::Manual => format!("a manual lease of {:?}", lease.ttl()),
        _ => format!("a lease of {:?}", lease.ttl()),
    };
    Err(Error::InvalidOptions(format!(
        "ZooKeeper cannot honour {asked}: its leases are the session. Keep the provider's \
         default lease (no `with_lease`, or `with_lease(provider.default_lease().max_hold(..)?)` \
         for a hold limit), and set how long a lease outlives a silent holder with the session \
         timeout (`?session_timeout_ms=` on the zk:// URL, or ZkOptions::session_timeout)"
    )))
}

#[async_trait]
impl Provider for ZkProvider {
    fn backend(&self) -> &'static str {
        "zookeeper"
    }

    async fn close(&self) -> Result<()> {
        let released = self.ctx.lifecycle.close().await;
        self.ctx.sessions.close(self.ctx.timeout).await;
        released
    }

    fn default_lease(&self) -> LeaseOptions {
        self.lease
    }

    /// A clone sharing the session and held leases, whose primitives end
    /// their holds at `lease`'s [`LeaseOptions::max_hold`], if any.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`](distlock_core::Error::InvalidOptions) for
    /// any TTL or renewal other than the default's: the session is the
    /// lease (the message says what to do instead);
    /// [`Error::Closed`](distlock_core::Error::Closed) once closed.
    fn with_lease(&self, lease: LeaseOptions) -> Result<Arc<dyn Provider>> {
        self.ctx.lifecycle.check_open()?;
        check_lease(lease)?;
        Ok(Arc::new(ZkProvider {
            ctx: Arc::clone(&self.ctx),
            lease,
        }))
    }

    fn owner(&self) -> &str {
        &self.ctx.owner
    }

    /// Reads the name's nodes in two round trips (see the crate docs,
    /// "Inspect and force-release"): a `sync` and a multi-read of the
    /// directory and its children, then one multi-read of every child's
    /// data and stat.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`](distlock_core::Error::InvalidName) for a bad
    /// name; [`Error::Conflict`](distlock_core::Error::Conflict) when the
    /// name's node holds data (an id counter) or is ephemeral, or the
    /// unfair lock's node is persistent, or a queue's sequence wrapped;
    /// connection errors and timeouts.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: it only reads.
    async fn inspect(&self, name: &str, kind: PrimitiveKind) -> Result<Snapshot> {
        let (name, dir) = self.named(name)?;
        crate::ops::inspect(&self.ctx, &name, &dir, kind).await
    }

    /// Asks every holder of the name as `kind` to let go, the way Curator's
    /// `Revoker.attemptRevoke` does: one `setData` on each holding node
    /// (pipelined, after the two reads of [`inspect`](Provider::inspect)).
    /// A distlock holder's queue node gets its own data again (at the
    /// version read, so the owner identity stays and the node's data
    /// version goes above 0: the mark); the unfair mutex's hold gets a
    /// request node of its own (below); a foreign lock or lease node (a Curator or kazoo
    /// holder) gets `__REVOKE__`, which a revocable Curator holder
    /// (`InterProcessMutex.makeRevocable`) hears; a foreign election leader
    /// (a Curator `LeaderLatch`, which has no revocation) keeps its data,
    /// its participant id. A distlock holder hears a request (ours or
    /// Curator's `__REVOKE__`) through the data watch on its node, and at
    /// the latest at its next session check (every session timeout / 4).
    /// Returns the holders asked, as `inspect` shows them; a holder that
    /// released meanwhile is not among them. Nothing is created on a name
    /// nobody holds: it is only read.
    ///
    /// Waiters watching an asked node wake once, look again and wait on.
    ///
    /// The unfair mutex's node has one fixed path, and a node created there
    /// again starts at data version 0 like the one read, so its hold is
    /// asked apart, by the creation `czxid` read (its fencing token): an
    /// ephemeral node `_unfair_lock-asked-<czxid>` beside it, in this
    /// provider's session, then a look at the unfair node. A request that
    /// races with its holder's release asks nobody (the next holder's node
    /// is never touched) and does not return the holder. The holder hears
    /// it through a children watch (at the latest at its next session
    /// check, every session timeout / 4), makes the request node its own,
    /// so that the request lasts as long as the hold, and deletes it when
    /// it releases. Unfair holders of distlock versions that asked by
    /// writing the unfair node's data do not hear it.
    ///
    /// # Errors
    ///
    /// As [`inspect`](Provider::inspect); a server error (no auth) when the
    /// ACL forbids the write (nodes made with other digest credentials).
    ///
    /// # Cancellation safety
    ///
    /// Each holder is asked or not; a cancelled call may have asked some.
    async fn request_release(&self, name: &str, kind: PrimitiveKind) -> Result<Vec<Holder>> {
        let (name, dir) = self.named(name)?;
        crate::ops::request_release(&self.ctx, &name, &dir, kind).await
    }

    /// **Dangerous: for operators.** Deletes every holding node of the name
    /// as `kind` (any session may delete another's ephemeral node, unless
    /// the nodes were made with digest credentials: then only the same
    /// user may). The waiters' watches fire as on a release, and each
    /// evicted distlock holder's `lost()` fires (`LostReason::Deleted`)
    /// when its node watch reports the deletion. `fence` is `None`: tokens
    /// are the nodes' `czxid`s, and every later node has a larger one.
    ///
    /// The unfair mutex's node has one fixed path, so two races remain:
    /// a node the next client created just before the delete is deleted
    /// too, and an evicted holder releasing just as the next client
    /// created the node deletes the new node (its release is one delete at
    /// version 0). Either way that client's guard sees its node deleted
    /// and fires `lost()`, and the holder after it gets a larger token.
    ///
    /// # Errors
    ///
    /// As [`ZkProvider::inspect`](Provider::inspect); a server error (no
    /// auth) when the ACL forbids the delete.
    ///
    /// # Cancellation safety
    ///
    /// The deletes are sent together; a cancelled call may have deleted
    /// some holders' nodes.
    async fn force_release(&self, name: &str, kind: PrimitiveKind) -> Result<ForceReleased> {
        let (name, dir) = self.named(name)?;
        crate::ops::force_release(&self.ctx, &name, &dir, kind).await
    }

    fn mutex(&self, name: &str) -> Result<Arc<dyn Lock>> {
        let (name, dir) = self.named(name)?;
        let hold = self.hold();
        Ok(Arc::new(UnfairMutex {
            ctx: Arc::clone(&self.ctx),
            name,
            dir,
            hold,
            dir_checked: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    fn fair_mutex(&self, name: &str) -> Result<Arc<dyn Lock>> {
        let (name, dir) = self.named(name)?;
        let hold = self.hold();
        Ok(Arc::new(FairMutex {
            ctx: Arc::clone(&self.ctx),
            name,
            dir: Arc::from(dir),
            hold,
        }))
    }

    fn election(&self, name: &str) -> Result<Arc<dyn Election>> {
        let (name, dir) = self.named(name)?;
        let hold = self.hold();
        Ok(Arc::new(ZkElection {
            ctx: Arc::clone(&self.ctx),
            name,
            dir: Arc::from(dir),
            hold,
        }))
    }

    fn rw_lock(&self, name: &str) -> Result<Arc<dyn ReadWriteLock>> {
        let (name, dir) = self.named(name)?;
        let hold = self.hold();
        crate::rw_lock::rw_lock(&self.ctx, name, dir, hold)
    }

    fn semaphore(&self, name: &str, permits: u32) -> Result<Arc<dyn Semaphore>> {
        let (name, dir) = self.named(name)?;
        let hold = self.hold();
        crate::semaphore::semaphore(&self.ctx, name, dir, check_permits(permits)?, hold)
    }

    fn id_generator(&self, name: &str, block_size: u64) -> Result<Arc<dyn IdGenerator>> {
        let (name, node) = self.named(name)?;
        let source = ZkIds {
            ctx: Arc::clone(&self.ctx),
            name: name.clone(),
            node,
        };
        Ok(Arc::new(BlockIds::new(name, source, block_size)?))
    }
}
