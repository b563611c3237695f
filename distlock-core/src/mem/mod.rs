//! The in-process backend: every primitive, with real TTLs, fencing tokens,
//! lost signal and watchdog, and no server.
//!
//! It behaves as the networked backends do, so it serves as the embedded
//! default for examples and for users' own unit tests. Providers of the same
//! table ([`MemProvider::new_client`], or [`MemProvider::shared`] with the
//! same name) are separate "clients" of one lock table, each with its own
//! [`Provider::close`]; clones of one provider are the same client, as
//! clones of a networked provider share its connection. A fresh
//! [`MemProvider::new`] is a table of its own.
//!
//! ```
//! # use distlock_core as distlock;
//! use distlock::{mem::MemProvider, Provider};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
//! let locks = MemProvider::new();
//! let mutex = locks.mutex("orders/42")?;
//! let guard = mutex.lock().await?;
//! assert!(mutex.try_lock().await?.is_none());
//! println!("fencing token {}", guard.fencing_token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! Each name ever used keeps a small entry (its fencing counter), as the
//! servers keep their fencing keys.
//!
//! One name is one lock ([table](crate#one-name-is-one-lock)): every kind
//! of one name shares one slot of the table, which records the kind of each
//! holder and waiter; an acquisition that finds another kind holding, or
//! queued ahead of it, is refused with [`Error::Conflict`] under the table's
//! lock, so of two kinds arriving at once the first queued wins. The mutex
//! and the fair mutex are one kind here (they wait for each other).

mod store;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use async_trait::async_trait;

use crate::backend::{check_permits, validate_candidate, BlockIds, IdSource, Lifecycle};
use crate::election::{Election, LeaderInfo, LeaderStream, Leadership};
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::ids::IdGenerator;
use crate::inspect::{Holder, PrimitiveKind, Snapshot};
use crate::lease::LeaseOptions;
use crate::lock::{Lock, Wait};
use crate::name::Name;
use crate::provider::{default_owner, ForceReleased, Provider};
use crate::rwlock::ReadWriteLock;
use crate::semaphore::Semaphore;
use store::{Kind, SlotKey, Store, Want};

/// A provider of in-process primitives.
///
/// Each [`MemProvider::new`] or [`MemProvider::shared`] call is one client:
/// its clones share its held leases and [`Provider::close`].
#[derive(Clone)]
pub struct MemProvider {
    store: Arc<Store>,
    lease: LeaseOptions,
    lifecycle: Arc<Lifecycle>,
    owner: Arc<str>,
}

/// A new lifecycle that tags its tracing events with `owner`.
fn owned_lifecycle(owner: &str) -> Arc<Lifecycle> {
    let lifecycle = Lifecycle::new();
    lifecycle.set_owner(owner);
    lifecycle
}

impl MemProvider {
    /// A new client of `store`, with the process's owner identity.
    fn client(store: Arc<Store>, lease: LeaseOptions) -> Self {
        let owner: Arc<str> = Arc::from(default_owner());
        MemProvider {
            store,
            lease,
            lifecycle: owned_lifecycle(&owner),
            owner,
        }
    }

    /// A provider over a new, private lock table.
    #[must_use]
    pub fn new() -> Self {
        Self::client(Arc::new(Store::default()), LeaseOptions::default())
    }

    /// A provider over the process-wide table called `table` (made on first
    /// use): every provider of the same table shares its locks. The URL
    /// `mem://` is the table `""`, `mem://jobs` the table `"jobs"`.
    #[must_use]
    pub fn shared(table: &str) -> Self {
        static TABLES: OnceLock<Mutex<HashMap<String, Arc<Store>>>> = OnceLock::new();
        let mut tables = TABLES
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let store = tables.entry(table.to_owned()).or_default();
        Self::client(Arc::clone(store), LeaseOptions::default())
    }

    /// Another client of the same table: it contends with this one, and
    /// closing either leaves the other open.
    #[must_use]
    pub fn new_client(&self) -> Self {
        Self::client(Arc::clone(&self.store), self.lease)
    }

    /// The same table with other default lease options.
    #[must_use]
    pub fn with_default_lease(self, lease: LeaseOptions) -> Self {
        MemProvider { lease, ..self }
    }

    /// The same client with the owner identity `label@host:pid` (see
    /// [`owner_identity`](crate::inspect::owner_identity)).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for a bad label.
    pub fn with_owner_label(self, label: &str) -> Result<Self> {
        let owner: Arc<str> = Arc::from(crate::inspect::owner_identity(Some(label))?);
        self.lifecycle.set_owner(&owner);
        Ok(MemProvider { owner, ..self })
    }

    /// A lock of this client on `key`, wanting `want`.
    fn lock(&self, key: SlotKey, want: Want, lease: LeaseOptions) -> MemMutex {
        MemMutex {
            store: Arc::clone(&self.store),
            lifecycle: Arc::clone(&self.lifecycle),
            owner: Arc::clone(&self.owner),
            key,
            want,
            lease,
        }
    }

    fn key(kind: Kind, name: &str) -> Result<SlotKey> {
        Ok(SlotKey {
            kind,
            name: Name::new(name)?,
        })
    }
}

impl Default for MemProvider {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemProvider")
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Provider for MemProvider {
    fn backend(&self) -> &'static str {
        "mem"
    }

    async fn close(&self) -> Result<()> {
        self.lifecycle.close().await
    }

    fn default_lease(&self) -> LeaseOptions {
        self.lease
    }

    fn owner(&self) -> &str {
        &self.owner
    }

    async fn inspect(&self, name: &str, kind: PrimitiveKind) -> Result<Snapshot> {
        self.lifecycle.check_open()?;
        Ok(self.store.inspect(&Self::key(slot_kind(kind), name)?, kind))
    }

    async fn request_release(&self, name: &str, kind: PrimitiveKind) -> Result<Vec<Holder>> {
        self.lifecycle.check_open()?;
        Ok(self
            .store
            .request_release(&Self::key(slot_kind(kind), name)?, kind))
    }

    async fn force_release(&self, name: &str, kind: PrimitiveKind) -> Result<ForceReleased> {
        self.lifecycle.check_open()?;
        self.store.force_release(&Self::key(slot_kind(kind), name)?)
    }

    /// A clone of this client (same table, held leases, owner and
    /// [`Provider::close`]) with `lease`.
    fn with_lease(&self, lease: LeaseOptions) -> Result<Arc<dyn Provider>> {
        self.lifecycle.check_open()?;
        Ok(Arc::new(self.clone().with_default_lease(lease)))
    }

    fn mutex(&self, name: &str) -> Result<Arc<dyn Lock>> {
        let lease = self.lease;
        self.lifecycle.check_open()?;
        let key = Self::key(Kind::Mutex, name)?;
        Ok(Arc::new(self.lock(
            key,
            Want::Exclusive { fair: false },
            lease,
        )))
    }

    fn fair_mutex(&self, name: &str) -> Result<Arc<dyn Lock>> {
        let lease = self.lease;
        self.lifecycle.check_open()?;
        let key = Self::key(Kind::FairMutex, name)?;
        Ok(Arc::new(self.lock(
            key,
            Want::Exclusive { fair: true },
            lease,
        )))
    }

    fn election(&self, name: &str) -> Result<Arc<dyn Election>> {
        let lease = self.lease;
        self.lifecycle.check_open()?;
        Ok(Arc::new(MemElection {
            store: Arc::clone(&self.store),
            lifecycle: Arc::clone(&self.lifecycle),
            owner: Arc::clone(&self.owner),
            key: Self::key(Kind::Election, name)?,
            lease,
        }))
    }

    fn rw_lock(&self, name: &str) -> Result<Arc<dyn ReadWriteLock>> {
        let lease = self.lease;
        self.lifecycle.check_open()?;
        let key = Self::key(Kind::RwLock, name)?;
        let side = |want| -> Arc<dyn Lock> { Arc::new(self.lock(key.clone(), want, lease)) };
        Ok(Arc::new(MemRwLock {
            read: side(Want::Read),
            write: side(Want::Write),
            name: key.name.clone(),
        }))
    }

    fn semaphore(&self, name: &str, permits: u32) -> Result<Arc<dyn Semaphore>> {
        let lease = self.lease;
        self.lifecycle.check_open()?;
        let key = Self::key(Kind::Semaphore, name)?;
        check_permits(permits)?;
        Ok(Arc::new(self.lock(key, Want::Permit(permits), lease)))
    }

    fn id_generator(&self, name: &str, block_size: u64) -> Result<Arc<dyn IdGenerator>> {
        self.lifecycle.check_open()?;
        let name = Name::new(name)?;
        let source = MemIds {
            lifecycle: Arc::clone(&self.lifecycle),
            store: Arc::clone(&self.store),
            name: name.clone(),
        };
        Ok(Arc::new(BlockIds::new(name, source, block_size)?))
    }
}

/// The table's kind of a primitive.
fn slot_kind(kind: PrimitiveKind) -> Kind {
    match kind {
        PrimitiveKind::FairMutex => Kind::FairMutex,
        PrimitiveKind::ReadWrite => Kind::RwLock,
        PrimitiveKind::Semaphore => Kind::Semaphore,
        PrimitiveKind::Election => Kind::Election,
        _ => Kind::Mutex,
    }
}

/// An in-process lock: a mutex (fair or unfair), one side of a read-write
/// lock, or a semaphore, as `want` says.
struct MemMutex {
    store: Arc<Store>,
    lifecycle: Arc<Lifecycle>,
    owner: Arc<str>,
    key: SlotKey,
    want: Want,
    lease: LeaseOptions,
}

impl fmt::Debug for MemMutex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemMutex")
            .field("name", &self.key.name)
            .field("want", &self.want)
            .finish_non_exhaustive()
    }
}

impl Semaphore for MemMutex {
    fn permits(&self) -> u32 {
        match self.want {
            Want::Permit(permits) => permits,
            _ => 1,
        }
    }
}

/// An in-process read-write lock: its two sides.
#[derive(Debug)]
struct MemRwLock {
    name: Name,
    read: Arc<dyn Lock>,
    write: Arc<dyn Lock>,
}

impl ReadWriteLock for MemRwLock {
    fn name(&self) -> &Name {
        &self.name
    }

    fn read(&self) -> Arc<dyn Lock> {
        Arc::clone(&self.read)
    }

    fn write(&self) -> Arc<dyn Lock> {
        Arc::clone(&self.write)
    }
}

#[async_trait]
impl Lock for MemMutex {
    fn name(&self) -> &Name {
        &self.key.name
    }

    fn backend(&self) -> &'static str {
        "mem"
    }

    fn kind(&self) -> PrimitiveKind {
        match self.key.kind {
            Kind::FairMutex => PrimitiveKind::FairMutex,
            Kind::RwLock => PrimitiveKind::ReadWrite,
            Kind::Semaphore => PrimitiveKind::Semaphore,
            Kind::Election => PrimitiveKind::Election,
            Kind::Mutex => PrimitiveKind::Mutex,
        }
    }

    async fn acquire(&self, wait: Wait) -> Result<Option<LockGuard>> {
        self.store
            .acquire(
                &self.lifecycle,
                &self.key,
                self.want,
                wait,
                self.lease,
                None,
                &self.owner,
            )
            .await
    }
}

/// An in-process election: a fair lease whose holder is the leader.
struct MemElection {
    store: Arc<Store>,
    lifecycle: Arc<Lifecycle>,
    owner: Arc<str>,
    key: SlotKey,
    lease: LeaseOptions,
}

impl fmt::Debug for MemElection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemElection")
            .field("name", &self.key.name)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Election for MemElection {
    fn name(&self) -> &Name {
        &self.key.name
    }

    async fn campaign(&self, candidate: &str) -> Result<Leadership> {
        validate_candidate(candidate)?;
        crate::backend::measured_campaign("mem", &self.key.name, async {
            let guard = self
                .store
                .acquire(
                    &self.lifecycle,
                    &self.key,
                    Want::Exclusive { fair: true },
                    Wait::Forever,
                    self.lease,
                    Some(Arc::from(candidate)),
                    &self.owner,
                )
                .await?
                .ok_or(Error::Closed)?;
            Ok(Leadership::new(guard, candidate))
        })
        .await
    }

    async fn leader(&self) -> Result<Option<LeaderInfo>> {
        self.lifecycle.check_open()?;
        Ok(self.store.leader(&self.key))
    }

    fn observe(&self) -> LeaderStream {
        let store = Arc::clone(&self.store);
        let key = self.key.clone();
        let first: Option<Option<LeaderInfo>> = None;
        Box::pin(futures::stream::unfold(
            (store, key, first),
            |(store, key, mut last)| async move {
                loop {
                    let (now, mut changes, expires) = store.watch_leader(&key);
                    if last.as_ref() != Some(&now) {
                        last = Some(now.clone());
                        return Some((Ok(now), (store, key, last)));
                    }
                    tokio::select! {
                        _ = changes.changed() => {}
                        () = tokio::time::sleep_until(expires.unwrap_or_else(tokio::time::Instant::now)), if expires.is_some() => {}
                    }
                }
            },
        ))
    }
}

/// The in-process id counter.
struct MemIds {
    lifecycle: Arc<Lifecycle>,
    store: Arc<Store>,
    name: Name,
}

#[async_trait]
impl IdSource for MemIds {
    async fn reserve(&self, n: u64) -> Result<u64> {
        self.lifecycle.check_open()?;
        self.store.reserve(&self.name, n)
    }
}
