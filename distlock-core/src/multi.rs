//! Several names at once, all or nothing: [`LockSet`] and its [`MultiGuard`].
//!
//! A job that moves money between `accounts/7` and `accounts/9` needs both
//! locks at once. Taken one by one in the order each job sees them, two jobs
//! that see them the other way round deadlock. A [`LockSet`] takes every
//! name of the set or none, in one total order whatever order the caller
//! gave, so overlapping sets never deadlock:
//!
//! ```
//! # mod distlock {
//! #     pub use distlock_core::*;
//! #     pub async fn connect(_url: &str) -> Result<std::sync::Arc<dyn Provider>> {
//! #         Ok(std::sync::Arc::new(mem::MemProvider::new()))
//! #     }
//! # }
//! use std::time::Duration;
//! use distlock::multi::LockSet;
//!
//! # async fn transfer(_from: u64, _to: u64) {}
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
//! let locks = distlock::connect("mem://").await?; // or "redis://…", "zk://…"
//! // Either order: the set is taken as accounts/7, then accounts/9.
//! let accounts = LockSet::new(&*locks, ["accounts/9", "accounts/7"])?;
//! if let Some(guard) = accounts.lock_timeout(Duration::from_secs(5)).await? {
//!     // One fencing token per name: each resource gets its own name's.
//!     let (from, to) = (guard.fencing_token("accounts/7"), guard.fencing_token("accounts/9"));
//!     tokio::select! {
//!         () = transfer(from.unwrap(), to.unwrap()) => guard.release().await?,
//!         (name, reason) = guard.lost() => eprintln!("{name}: {reason}"), // stop writing
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! # How it is taken
//!
//! The set is sorted by the names' bytes (the order of [`Name`]'s `Ord`)
//! and each name is taken on its own, through the backend's own mutex (or
//! fair mutex, [`LockSet::fair`]): the next name only once the previous one
//! is held. Every client takes any two names in the same order, so no two
//! sets can each hold what the other waits for, and every wait ends (that is
//! the classic total-order argument; the contention check of the conformance
//! suite runs overlapping sets in random orders). While it waits for a later
//! name, an acquisition holds the earlier ones: a holder of `b` delays a
//! set `{a, b}` and, through it, anybody who wants `a` alone.
//!
//! All or nothing is by undo, not by a single atomic step: when a name
//! cannot be had (`try_lock` finds it busy, the deadline of `lock_timeout`
//! passes, an error), the names already taken are released, and awaited,
//! before the call returns (each for at most one response timeout of its
//! backend: one not done by then, in a partition, finishes in the
//! background); between the two another client may have seen
//! them held, which is harmless (a set never shows as half-held to its own
//! holder: it gets a [`MultiGuard`] or nothing). A cancelled acquisition
//! (its future dropped) releases what it took in the background, as a
//! dropped [`LockGuard`] does; the lease TTL or session is the safety net.
//!
//! This holds on every backend alike, because it uses only what every
//! backend's mutex gives. In particular, **on Redis Cluster** each name is
//! taken on its own shard (its key's slot), one after the other: there is no
//! cross-shard transaction, so no instant at which all of them are taken at
//! once; the set is held from the moment the last name is taken until the
//! first is released or lost. On Redlock each name is taken on a quorum of
//! its masters, as a single Redlock mutex is. On ZooKeeper each name is its
//! own node (a `multi` transaction would make the take atomic, but the
//! waiting, which is per name, would not be).
//!
//! The fair variant is FIFO per name (each name's own queue), not across the
//! set: a set waits in the queue of its first busy name only.
//!
//! # One guard, one lease per name
//!
//! Each member keeps its own lease and its own watchdog task, as a
//! [`LockGuard`] does: a renewal is the backend's per-lease operation (one
//! key on one shard, one quorum, a session shared already on ZooKeeper), so
//! one task renewing all of them would still send one request per name, and
//! would tie the members' deadlines together. The cost is a Tokio task and
//! one renewal per member per renewal interval (8 names with the default
//! 30 s lease: 8 small requests every 10 s). In exchange each member's lost
//! signal is exact: [`MultiGuard::lost`] says which name was lost and why.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::StreamExt;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::guard::{LeaseStatus, LeaseWatch, LockGuard, LostReason};
use crate::lock::{Lock, Wait};
use crate::name::Name;
use crate::provider::Provider;

/// A set of named locks taken all together or not at all.
///
/// Built from names with [`LockSet::new`] (mutexes) or [`LockSet::fair`]
/// (fair mutexes) on one provider, or from any locks with
/// [`LockSet::from_locks`] (other lease options, a read-write lock's write
/// side, a semaphore of one, several providers). Making a set does no I/O.
/// See the [module docs](self) for the order in which names are taken and the
/// atomicity that gives.
#[derive(Clone)]
pub struct LockSet {
    /// Sorted by name, no two alike, never empty.
    locks: Vec<Arc<dyn Lock>>,
}

impl LockSet {
    /// A set of (unfair) mutexes of `provider`, with its default lease.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a bad name or a name given twice;
    /// [`Error::InvalidOptions`] for an empty set. Nothing is made then.
    pub fn new<P, I>(provider: &P, names: I) -> Result<Self>
    where
        P: Provider + ?Sized,
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let names = checked_names(names)?;
        Self::build(&names, |name| provider.mutex(name))
    }

    /// A set of fair mutexes of `provider`, with its default lease: FIFO per
    /// name.
    ///
    /// # Errors
    ///
    /// As [`LockSet::new`].
    pub fn fair<P, I>(provider: &P, names: I) -> Result<Self>
    where
        P: Provider + ?Sized,
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let names = checked_names(names)?;
        Self::build(&names, |name| provider.fair_mutex(name))
    }

    /// A set of the given locks, whatever their kind, lease or provider.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for two locks of one name;
    /// [`Error::InvalidOptions`] for an empty set.
    pub fn from_locks<I>(locks: I) -> Result<Self>
    where
        I: IntoIterator<Item = Arc<dyn Lock>>,
    {
        let mut locks: Vec<Arc<dyn Lock>> = locks.into_iter().collect();
        if locks.is_empty() {
            return Err(empty());
        }
        locks.sort_by(|a, b| a.name().cmp(b.name()));
        if let Some(pair) = locks.windows(2).find(|w| w[0].name() == w[1].name()) {
            return Err(duplicate(pair[0].name().as_str()));
        }
        Ok(LockSet { locks })
    }

    fn build(names: &[Name], mut make: impl FnMut(&str) -> Result<Arc<dyn Lock>>) -> Result<Self> {
        let locks = names
            .iter()
            .map(|name| make(name.as_str()))
            .collect::<Result<Vec<_>>>()?;
        Ok(LockSet { locks })
    }

    /// The names of the set, in the order they are taken.
    pub fn names(&self) -> impl Iterator<Item = &Name> {
        self.locks.iter().map(|lock| lock.name())
    }

    /// The number of names (at least one).
    #[must_use]
    pub fn len(&self) -> usize {
        self.locks.len()
    }

    /// Always `false`: a set has at least one name.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.locks.is_empty()
    }

    /// The locks of the set, in the order they are taken.
    #[must_use]
    pub fn locks(&self) -> &[Arc<dyn Lock>] {
        &self.locks
    }

    /// Takes every name, waiting as `wait` allows (one deadline for the whole
    /// set). `Ok(None)` when the wait ended without all of them; those taken
    /// meanwhile are released before it returns.
    ///
    /// # Errors
    ///
    /// The first error of a member's acquisition (as
    /// [`Lock::acquire`]); the names taken before it are released first.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: dropping the future at any await point leaves
    /// nothing held. The names taken so far are then released in the
    /// background, as a dropped [`LockGuard`] is; the member being acquired
    /// cleans up as [`Lock::acquire`] does.
    pub async fn acquire(&self, wait: Wait) -> Result<Option<MultiGuard>> {
        let started = std::time::Instant::now();
        // A deadline already reached asks no wait of anyone: each name once,
        // as `try_lock` does, rather than none at all.
        let wait = match wait {
            Wait::Until(at) if at <= Instant::now() => Wait::No,
            wait => wait,
        };
        let mut taken: Vec<LockGuard> = Vec::with_capacity(self.locks.len());
        for lock in &self.locks {
            let got = match wait {
                Wait::No => lock.try_lock().await,
                Wait::Forever => lock.lock().await.map(Some),
                // The member in flight at the set's deadline is dropped
                // there (cancellation safe: what it made is removed in the
                // background). Left to its own `lock_timeout`, each member
                // could answer up to one response timeout past the
                // deadline, and the next one would still be tried: one
                // response timeout per member on a slow server.
                Wait::Until(at) => tokio::time::timeout_at(
                    at,
                    lock.lock_timeout(at.saturating_duration_since(Instant::now())),
                )
                .await
                .unwrap_or(Ok(None)),
            };
            match got {
                Ok(Some(guard)) => taken.push(guard),
                Ok(None) => {
                    tracing::debug!(name = %lock.name(), taken = taken.len(), "distlock lock set: a member is busy, undoing");
                    undo(taken).await;
                    return Ok(None);
                }
                Err(error) => {
                    tracing::debug!(name = %lock.name(), taken = taken.len(), %error, "distlock lock set: a member failed, undoing");
                    undo(taken).await;
                    return Err(error);
                }
            }
        }
        tracing::debug!(
            names = taken.len(),
            elapsed_us = started.elapsed().as_micros(),
            "distlock lock set acquired"
        );
        Ok(Some(MultiGuard { guards: taken }))
    }

    /// Takes every name if each is free now; `Ok(None)` (holding none) when
    /// one is busy.
    ///
    /// # Errors
    ///
    /// As [`LockSet::acquire`].
    ///
    /// # Cancellation safety
    ///
    /// As [`LockSet::acquire`].
    pub async fn try_lock(&self) -> Result<Option<MultiGuard>> {
        self.acquire(Wait::No).await
    }

    /// Waits until every name is taken.
    ///
    /// # Errors
    ///
    /// As [`LockSet::acquire`]; [`Error::Closed`] when a member's provider
    /// was closed during the wait.
    ///
    /// # Cancellation safety
    ///
    /// As [`LockSet::acquire`].
    pub async fn lock(&self) -> Result<MultiGuard> {
        self.acquire(Wait::Forever).await?.ok_or(Error::Closed)
    }

    /// Waits at most `timeout` (counted from this call, for the whole set)
    /// for every name; `Ok(None)`, holding none, when they did not all come.
    ///
    /// A positive `timeout` returns within `timeout` plus one response
    /// timeout of the backend, however many names the set has: the member
    /// being acquired at the deadline is dropped there, no later member is
    /// tried, and the members taken are released side by side, each awaited
    /// for one response timeout at most (one not done by then finishes in
    /// the background). A zero `timeout` is [`LockSet::try_lock`]: each name
    /// is tried once, one request after the other, so a slow server makes
    /// it take a request's time per name (a deadline that passes before the
    /// first request would take none at all).
    ///
    /// # Errors
    ///
    /// As [`LockSet::acquire`].
    ///
    /// # Cancellation safety
    ///
    /// As [`LockSet::acquire`].
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<Option<MultiGuard>> {
        self.acquire(Wait::timeout(timeout)).await
    }
}

impl fmt::Debug for LockSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockSet")
            .field("names", &self.names().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// Releases what an acquisition took before it gave up, side by side, each
/// awaited for at most its backend's response timeout
/// ([`LeaseBackend::response_timeout`](crate::backend::LeaseBackend::response_timeout)):
/// a release not done by then (a partition) finishes in the background, as
/// a dropped guard's does, so that the caller is not held past its bound.
async fn undo(taken: Vec<LockGuard>) {
    let results = futures::future::join_all(taken.into_iter().map(|guard| {
        let name = guard.name().clone();
        let bound = guard.response_timeout();
        async move {
            let released = match bound {
                Some(bound) => tokio::time::timeout(bound, guard.release()).await,
                None => Ok(guard.release().await),
            };
            (name, released)
        }
    }))
    .await;
    for (name, result) in results {
        match result {
            Ok(Ok(())) => {}
            // The lease or session ends it if the release did not land.
            Ok(Err(error)) => {
                tracing::warn!(%name, %error, "distlock lock set: undoing a member failed");
            }
            Err(_) => {
                tracing::debug!(%name, "distlock lock set: undoing a member goes on in the background");
            }
        }
    }
}

fn checked_names<I>(names: I) -> Result<Vec<Name>>
where
    I: IntoIterator,
    I::Item: AsRef<str>,
{
    let mut names = names
        .into_iter()
        .map(Name::new)
        .collect::<Result<Vec<_>>>()?;
    if names.is_empty() {
        return Err(empty());
    }
    names.sort();
    if let Some(pair) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(duplicate(pair[0].as_str()));
    }
    Ok(names)
}

fn empty() -> Error {
    Error::InvalidOptions("a lock set needs at least one name".into())
}

fn duplicate(name: &str) -> Error {
    Error::InvalidName {
        name: name.chars().take(64).collect(),
        reason: "appears twice in the lock set",
    }
}

/// Proof of holding every name of a [`LockSet`].
///
/// It owns one [`LockGuard`] per name, sorted by name. Dropping it releases
/// every member in the background; [`MultiGuard::release`] releases them all
/// and reports. Not `Clone`.
#[must_use = "dropping the guard releases every lock of the set at once"]
pub struct MultiGuard {
    /// Sorted by name.
    guards: Vec<LockGuard>,
}

impl MultiGuard {
    /// The member guards, sorted by name.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// The member guard of `name`, if it is in the set.
    #[must_use]
    pub fn guard(&self, name: &str) -> Option<&LockGuard> {
        self.guards
            .binary_search_by(|g| g.name().as_str().cmp(name))
            .ok()
            .map(|i| &self.guards[i])
    }

    /// The fencing token of `name` (what that name's resource must see), if
    /// it is in the set.
    #[must_use]
    pub fn fencing_token(&self, name: &str) -> Option<u64> {
        self.guard(name).map(LockGuard::fencing_token)
    }

    /// Every name with its fencing token, sorted by name.
    pub fn tokens(&self) -> impl Iterator<Item = (&Name, u64)> {
        self.guards.iter().map(|g| (g.name(), g.fencing_token()))
    }

    /// Whether every member's lease is (as far as the library knows) still
    /// held.
    #[must_use]
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(LockGuard::is_held)
    }

    /// Every member's lease status, sorted by name.
    pub fn statuses(&self) -> impl Iterator<Item = (&Name, LeaseStatus)> {
        self.guards.iter().map(|g| (g.name(), g.status()))
    }

    /// Resolves with the name and the reason when any member's lease is lost
    /// (the first one lost). It never resolves while all are held, so
    /// `select!` your work against it.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: it only observes.
    pub fn lost(&self) -> impl Future<Output = (Name, LostReason)> + Send + 'static {
        let members: Vec<_> = self
            .guards
            .iter()
            .map(|g| {
                let (name, lost) = (g.name().clone(), g.lost());
                Box::pin(async move { (name, lost.await) })
            })
            .collect();
        async move { futures::future::select_all(members).await.0 }
    }

    /// Resolves with the name of the first member whose holder is asked to
    /// release ([`LockGuard::release_requested`]): the set is held as one,
    /// so a request for any member is a request to let go of the set. It
    /// never resolves otherwise; `select!` it beside [`MultiGuard::lost`].
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: it only observes.
    pub fn release_requested(&self) -> impl Future<Output = Name> + Send + 'static {
        let members: Vec<_> = self
            .guards
            .iter()
            .map(|g| {
                let (name, asked) = (g.name().clone(), g.release_requested());
                Box::pin(async move {
                    asked.await;
                    name
                })
            })
            .collect();
        async move {
            if members.is_empty() {
                std::future::pending::<()>().await;
            }
            futures::future::select_all(members).await.0
        }
    }

    /// The members whose holders were asked to release, sorted by name.
    pub fn release_requests(&self) -> impl Iterator<Item = &Name> {
        self.guards
            .iter()
            .filter(|g| g.is_release_requested())
            .map(LockGuard::name)
    }

    /// An owned view of every member's lease status, for another task.
    #[must_use]
    pub fn watch(&self) -> MultiWatch {
        MultiWatch {
            members: self
                .guards
                .iter()
                .map(|g| (g.name().clone(), g.watch()))
                .collect(),
        }
    }

    /// Releases every member (all at once) and stops their watchdogs.
    ///
    /// # Errors
    ///
    /// The error of the first member (by name) whose release failed, as
    /// [`LockGuard::release`] reports it; every other member was released
    /// all the same. [`MultiGuard::release_each`] gives each member's outcome.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: the releases not finished are finished in the
    /// background (as on drop).
    pub async fn release(self) -> Result<()> {
        self.release_each()
            .await
            .into_iter()
            .map(|(_, result)| result)
            .collect::<Result<Vec<()>>>()
            .map(drop)
    }

    /// Releases every member (all at once) and gives each one's outcome,
    /// sorted by name.
    ///
    /// # Cancellation safety
    ///
    /// As [`MultiGuard::release`].
    pub async fn release_each(self) -> Vec<(Name, Result<()>)> {
        futures::future::join_all(self.guards.into_iter().map(|guard| {
            let name = guard.name().clone();
            async move { (name, guard.release().await) }
        }))
        .await
    }

    /// The member guards, sorted by name, to keep or release one by one.
    #[must_use]
    pub fn into_guards(self) -> Vec<LockGuard> {
        self.guards
    }
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.guards).finish()
    }
}

/// An owned view of a [`MultiGuard`]'s member leases, for tasks that outlive
/// a borrow of the guard.
#[derive(Clone, Debug)]
pub struct MultiWatch {
    members: Vec<(Name, LeaseWatch)>,
}

impl MultiWatch {
    /// Every member's status, sorted by name.
    pub fn statuses(&self) -> impl Iterator<Item = (&Name, LeaseStatus)> {
        self.members.iter().map(|(name, w)| (name, w.status()))
    }

    /// The status of `name`, if it is in the set.
    #[must_use]
    pub fn status(&self, name: &str) -> Option<LeaseStatus> {
        self.members
            .iter()
            .find(|(n, _)| n.as_str() == name)
            .map(|(_, w)| w.status())
    }

    /// Resolves with the first member lost and why, or with `None` once
    /// every member was released normally.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe.
    pub async fn lost(&mut self) -> Option<(Name, LostReason)> {
        let mut pending: FuturesUnordered<_> = self
            .members
            .iter_mut()
            .map(|(name, w)| async move { (name.clone(), w.lost().await) })
            .collect();
        while let Some((name, reason)) = pending.next().await {
            if let Some(reason) = reason {
                return Some((name, reason));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemProvider;

    #[tokio::test]
    async fn bad_sets_are_refused_before_anything_is_made() {
        let p = MemProvider::new();
        let empty: [&str; 0] = [];
        assert!(matches!(
            LockSet::new(&p, empty),
            Err(Error::InvalidOptions(_))
        ));
        assert!(matches!(
            LockSet::new(&p, ["a", "b", "a"]),
            Err(Error::InvalidName { .. })
        ));
        assert!(matches!(
            LockSet::fair(&p, ["a", ""]),
            Err(Error::InvalidName { .. })
        ));
        let a = p.mutex("a").unwrap();
        assert!(matches!(
            LockSet::from_locks([Arc::clone(&a), a]),
            Err(Error::InvalidName { .. })
        ));
    }

    #[tokio::test]
    async fn names_are_taken_in_byte_order() {
        let p = MemProvider::new();
        let set = LockSet::new(&p, ["b", "a/x", "C", "a"]).unwrap();
        let names: Vec<_> = set.names().map(Name::as_str).collect();
        assert_eq!(names, ["C", "a", "a/x", "b"]);
        let guard = set.try_lock().await.unwrap().expect("free");
        assert!(guard.fencing_token("a/x").is_some());
        assert!(guard.fencing_token("zz").is_none());
        guard.release().await.unwrap();
    }
}
