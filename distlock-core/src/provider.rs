//! The provider: one connected backend handing out named primitives.

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;

use crate::election::Election;
use crate::error::{Error, Result};
use crate::ids::IdGenerator;
use crate::inspect::{Holder, PrimitiveKind, Snapshot};
use crate::lease::LeaseOptions;
use crate::lock::Lock;
use crate::rwlock::ReadWriteLock;
use crate::semaphore::Semaphore;

/// A connected backend that hands out named primitives.
///
/// Names are validated by [`Name`](crate::Name)'s rule; handing out a
/// primitive does no I/O. Its primitives use its lease options
/// ([`Provider::default_lease`]); [`Provider::with_lease`] gives a view of
/// the same client with others. Session-based backends (ZooKeeper) accept
/// only their default lease options (the session is the lease) and refuse
/// others with [`Error::InvalidOptions`].
///
/// Dropping the last handle of a provider (the provider, its clones, the
/// primitives and guards it handed out) closes its connections or session in
/// the background; [`Provider::close`] does it now and reports.
///
/// `distlock::connect(url)` gives one for the backend the URL names; the
/// rest of a program does not change with the backend.
///
/// ```
/// # mod distlock {
/// #     pub use distlock_core::*;
/// #     pub async fn connect(_url: &str) -> Result<std::sync::Arc<dyn Provider>> {
/// #         Ok(std::sync::Arc::new(mem::MemProvider::new()))
/// #     }
/// # }
/// use std::time::Duration;
/// use distlock::{LeaseOptions, Provider};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
/// let locks = distlock::connect("mem://").await?; // or "redis://…", "zk://…"
/// let nightly = locks.mutex("jobs/nightly")?; // default lease: 30 s, renewed every 10 s
/// let deploys = locks.fair_mutex("deploy/prod")?; // first come, first served
/// let catalog = locks.rw_lock("catalog")?; // catalog.read(), catalog.write()
/// let pool = locks.semaphore("db-connections", 8)?; // at most 8 holders
/// let scheduler = locks.election("scheduler")?;
/// let ids = locks.id_generator("orders", 100)?; // 100 ids per round trip
/// let short = locks.with_lease(LeaseOptions::new(Duration::from_secs(5))?)?; // same client
/// let hourly = short.mutex("jobs/hourly")?; // its lease: 5 s
///
/// let guard = nightly.lock().await?;
/// println!("order id {}", ids.next().await?);
/// guard.release().await?;
/// # drop((deploys, catalog, pool, scheduler, hourly));
/// locks.close().await?; // fires lost() of what is still held, releases it, closes
/// # Ok(()) }
/// ```
#[async_trait]
pub trait Provider: Send + Sync + Debug {
    /// The backend's short name: `"mem"`, `"redis"`, `"zookeeper"`.
    fn backend(&self) -> &'static str;

    /// The lease options of the primitives this provider hands out: the
    /// backend's default, or the one given to [`Provider::with_lease`].
    fn default_lease(&self) -> LeaseOptions;

    /// A view of this provider whose primitives use `lease`: the same
    /// connections (or session), owner identity and held leases, only
    /// [`Provider::default_lease`] differs. This is the one way to give a
    /// primitive other lease options:
    ///
    /// ```
    /// # mod distlock {
    /// #     pub use distlock_core::*;
    /// #     pub async fn connect(_url: &str) -> Result<std::sync::Arc<dyn Provider>> {
    /// #         Ok(std::sync::Arc::new(mem::MemProvider::new()))
    /// #     }
    /// # }
    /// use std::time::Duration;
    /// use distlock::LeaseOptions;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
    /// let locks = distlock::connect("mem://").await?;
    /// let short = locks.with_lease(LeaseOptions::new(Duration::from_secs(5))?)?;
    /// let m = short.mutex("jobs/hourly")?;
    /// let guard = m.lock().await?;
    /// // The view is the same client: the original cannot take it meanwhile.
    /// assert!(locks.mutex("jobs/hourly")?.try_lock().await?.is_none());
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// The view and the original are one client: closing either
    /// ([`Provider::close`]) closes the shared connections or session and
    /// ends the leases held through both; dropping the view alone closes
    /// nothing while another handle lives.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for lease options the backend cannot
    /// honour: a session-based backend (ZooKeeper) accepts only its default
    /// TTL and renewal (plus a [`LeaseOptions::max_hold`]), and says what
    /// to do instead; [`Error::Closed`] once the provider is closed.
    fn with_lease(&self, lease: LeaseOptions) -> Result<Arc<dyn Provider>>;

    /// An unfair mutex (whoever asks first after a release wins) with this
    /// provider's lease ([`Provider::default_lease`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a bad name.
    fn mutex(&self, name: &str) -> Result<Arc<dyn Lock>>;

    /// A fair (first come, first served) mutex with this provider's lease.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a bad name.
    fn fair_mutex(&self, name: &str) -> Result<Arc<dyn Lock>>;

    /// A leader election whose leadership lease is this provider's.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a bad name.
    fn election(&self, name: &str) -> Result<Arc<dyn Election>>;

    /// A read-write lock whose read and write leases are this provider's.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a bad name.
    fn rw_lock(&self, name: &str) -> Result<Arc<dyn ReadWriteLock>>;

    /// A counting semaphore of `permits` whose permits' leases are this
    /// provider's.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a bad name,
    /// [`Error::InvalidOptions`] for 0 permits.
    fn semaphore(&self, name: &str, permits: u32) -> Result<Arc<dyn Semaphore>>;

    /// An id generator reserving `block_size` ids per round trip.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a bad name,
    /// [`Error::InvalidOptions`] for a block
    /// size of 0.
    fn id_generator(&self, name: &str, block_size: u64) -> Result<Arc<dyn IdGenerator>>;

    /// Closes the provider: new operations and waiting acquisitions fail
    /// with [`Error::Closed`], `lost()` fires for every
    /// lease it still holds (reason
    /// [`LostReason::ProviderClosed`](crate::LostReason::ProviderClosed)),
    /// each is released, and the connections or session are closed.
    /// Closing twice is harmless.
    ///
    /// # Errors
    ///
    /// The first error met while releasing or closing; the provider is
    /// closed whatever happens (leases not released end with their TTL or
    /// session).
    ///
    /// # Cancellation safety
    ///
    /// If cancelled, the provider is closed and its leases reported lost;
    /// the releases not yet done are left to the TTL or session.
    async fn close(&self) -> Result<()>;

    /// The owner identity this provider stores with every hold
    /// (`host:pid`, or `label@host:pid`; see
    /// [`owner_identity`](crate::inspect::owner_identity)).
    fn owner(&self) -> &str {
        default_owner()
    }

    /// A snapshot of `name` as the primitive `kind`: holders (owner
    /// identity, fencing token, acquired at, lease left), waiters, leader
    /// and term, a semaphore's permits. Takes no lock and changes nothing;
    /// holds made by foreign clients are shown as such.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a bad name;
    /// [`Error::Conflict`] when what is stored
    /// under the name is not that primitive's; connection errors.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: it only reads.
    async fn inspect(&self, name: &str, kind: PrimitiveKind) -> Result<Snapshot> {
        let _ = (name, kind);
        Err(Error::Unsupported {
            backend: self.backend(),
            what: "inspect",
        })
    }

    /// Asks every current holder of `name` as the primitive `kind` to let
    /// go: marks each hold as asked, which its guard hears
    /// ([`LockGuard::release_requested`](crate::LockGuard::release_requested),
    /// [`Leadership::release_requested`](crate::Leadership::release_requested)),
    /// and returns the holders asked, as [`Provider::inspect`] shows them
    /// (none when nobody holds it). Cooperative: the request ends no lease,
    /// the holder releases when its work allows; an operator who cannot
    /// wait uses [`Provider::force_release`] after a grace period (what
    /// `distlock unlock` does).
    ///
    /// How the request is stored: on Redis as a mark beside the hold (a
    /// hash in the name's slot), read by the holder's next renewal; on
    /// ZooKeeper on the holding node itself (its data written, as Curator's
    /// `Revoker` does), heard through the holder's node watch at once; in
    /// process at once. A request stays until the hold ends (the next
    /// holder is not asked), and asking again is harmless. Redlock has no
    /// way to tell its holders and answers [`Error::Unsupported`].
    ///
    /// Backends that implement it keep a clone of the lease's
    /// [`LeaseSignal`](crate::backend::LeaseSignal) and call its
    /// `request_release()` when they hear the mark.
    ///
    /// # Errors
    ///
    /// As [`Provider::inspect`]; [`Error::Unsupported`] where the backend
    /// has no way to tell its holders (Redlock).
    ///
    /// # Cancellation safety
    ///
    /// Each hold is asked or not; a cancelled call may have asked some.
    async fn request_release(&self, name: &str, kind: PrimitiveKind) -> Result<Vec<Holder>> {
        let _ = (name, kind);
        Err(Error::Unsupported {
            backend: self.backend(),
            what: "request_release",
        })
    }

    /// **Dangerous: for operators.** Removes every current hold of `name` as
    /// the primitive `kind`, whoever its owner, and advances the name's
    /// fencing counter, so the next holder's token is above every evicted
    /// one. The evicted holders are not asked: their `lost()` fires when
    /// their backend can tell (a TTL lease at its next renewal, a ZooKeeper
    /// holder when its node is deleted), and until then they may still be
    /// working. Hand [`ForceReleased::fence`] to the protected resource to
    /// refuse the evicted tokens at once. Waiters stay queued.
    ///
    /// # Errors
    ///
    /// As [`Provider::inspect`].
    ///
    /// # Cancellation safety
    ///
    /// Each hold is removed or not; a cancelled call may have removed some.
    async fn force_release(&self, name: &str, kind: PrimitiveKind) -> Result<ForceReleased> {
        let _ = (name, kind);
        Err(Error::Unsupported {
            backend: self.backend(),
            what: "force_release",
        })
    }
}

/// What [`Provider::force_release`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForceReleased {
    /// Holds removed.
    pub evicted: usize,
    /// The fencing counter after it was advanced: above every evicted
    /// holder's token, at or below the next holder's. `None` where the
    /// backend's tokens need no counter (ZooKeeper's are node ids).
    pub fence: Option<u64>,
}

/// The process's owner identity without a label, computed once.
pub(crate) fn default_owner() -> &'static str {
    static OWNER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    OWNER.get_or_init(|| {
        crate::inspect::owner_identity(None).unwrap_or_else(|_| "unknown".to_owned())
    })
}
