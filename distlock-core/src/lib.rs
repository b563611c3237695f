//! Core of [distlock](https://docs.rs/distlock): the traits every backend
//! implements, lease semantics, the watchdog, errors, names, and the
//! in-process backend.
//!
//! Most programs depend on the facade crate, `distlock`, which re-exports
//! everything users need from here; the examples name it so (`distlock::`
//! is `distlock_core::` in them).
//!
//! ```
//! # use distlock_core as distlock;
//! use std::time::Duration;
//! use distlock::{mem::MemProvider, Provider};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
//! let locks = MemProvider::new();
//! let mutex = locks.mutex("orders/42")?;
//! if let Some(guard) = mutex.lock_timeout(Duration::from_secs(5)).await? {
//!     let token = guard.fencing_token(); // hand it to the storage you protect
//!     tokio::select! {
//!         () = async { /* work under the lock, carrying `token` */ } => {}
//!         reason = guard.lost() => panic!("lease lost: {reason}"),
//!     }
//!     guard.release().await?;
//! }
//! # Ok(()) }
//! ```
//!
//! # Primitives
//!
//! A [`Provider`] hands out, by name: mutexes and fair mutexes ([`Lock`]),
//! read-write locks ([`ReadWriteLock`], whose two sides are [`Lock`]s),
//! counting semaphores ([`Semaphore`], a [`Lock`] of N holders), leader
//! elections ([`Election`]) and id generators ([`IdGenerator`]). Every
//! backend offers every primitive. A [`LockSet`] takes several names at
//! once, all or nothing, on any backend ([`multi`]).
//!
//! # Semantics shared by every backend
//!
//! * A [`LockGuard`] owns the lease. [`LockGuard::release`] releases and
//!   reports errors; dropping the guard releases in the background.
//! * Every guard has a fencing token, strictly greater than every earlier
//!   holder's of the same name.
//! * [`LockGuard::lost`] resolves as soon as the lease may be gone; it never
//!   fires for a lease released normally.
//! * TTL-based leases are renewed by a [watchdog](LeaseOptions) at TTL/3 by
//!   default, or extended by hand in [`Renewal::Manual`] mode.
//! * A provider's primitives use its lease options
//!   ([`Provider::default_lease`]); [`Provider::with_lease`] is the one way
//!   to others: a view of the same client whose primitives use them (see
//!   "Lease options" below).
//! * Every acquire future can be dropped at any await point without leaving
//!   anything held.
//! * Locks are not reentrant.
//! * [`Provider::close`] releases what a provider holds and closes its
//!   connections or session; later calls get [`Error::Closed`].
//! * One name is one lock: see below.
//!
//! # Lease options
//!
//! ```
//! # use distlock_core as distlock;
//! use std::time::Duration;
//! use distlock::{mem::MemProvider, LeaseOptions, Provider};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
//! let locks = MemProvider::new();
//! let short = locks.with_lease(LeaseOptions::new(Duration::from_secs(5))?)?;
//! let m = short.mutex("jobs/hourly")?;
//! let guard = m.lock().await?;
//! assert_eq!(guard.ttl(), Some(Duration::from_secs(5)));
//! // One client: the original is excluded while the view holds.
//! assert!(locks.mutex("jobs/hourly")?.try_lock().await?.is_none());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! The view shares everything with the original (connections or session,
//! owner, held leases): closing either closes both. A backend refuses lease
//! options it cannot honour there, in `with_lease`, with
//! [`Error::InvalidOptions`] (ZooKeeper: any TTL or renewal but its
//! default; it honours [`LeaseOptions::max_hold`]).
//!
//! # One name is one lock
//!
//! Every kind of primitive on one name is the same lock. While one kind
//! holds a name, another kind either **waits** for it (the two exclude each
//! other as one lock does) or is **refused** with [`Error::Conflict`] naming
//! both kinds (nothing is acquired or changed; the `distlock` command exits
//! 65). Two kinds never both hold a name, also when they arrive at once.
//!
//! | while this holds ↓, an acquisition of → | mutex | fair mutex | read side | write side | semaphore | election |
//! |---|---|---|---|---|---|---|
//! | **mutex** | waits | waits | Conflict | Conflict | Conflict | Conflict |
//! | **fair mutex** | waits | waits | Conflict | Conflict | Conflict | Conflict |
//! | **read side** | Conflict | Conflict | shares | waits | Conflict | Conflict |
//! | **write side** | Conflict | Conflict | waits | waits | Conflict | Conflict |
//! | **semaphore** | Conflict | Conflict | Conflict | Conflict | a permit or waits (same permits; else [`Error::PermitsMismatch`]) | Conflict |
//! | **election** | Conflict | Conflict | Conflict | Conflict | Conflict | waits (a candidate) |
//!
//! Why this table: the mutex and the fair mutex are two orders of admission
//! to one exclusive lock (a plain acquirer may barge ahead of the fair
//! queue), so waiting for each other is what a user of either expects. The
//! other kinds share or count holds by rules the others do not know (a
//! reader would have to wait for a permit, a leader for a read share):
//! waiting would only hide an operator's mistake (two programs that picked
//! different kinds for one job), so it is refused at once.
//!
//! What counts as a hold of another kind:
//!
//! * a live hold (a lease not expired, a node in a live session); an
//!   expired hold, a dead holder's lease after its TTL or session, or an
//!   empty directory left by earlier use counts for nothing;
//! * on ZooKeeper and in-process, also a waiter of another kind queued
//!   *ahead* (it came first: its node, or its place in the queue, is
//!   older); on Redis a waiter is not counted (a waiter of one kind that
//!   finds another kind holding when it next tries is refused then);
//! * a foreign holder counts as its kind: a redis-py `Lock` as a mutex, a
//!   Curator or kazoo lock node as a fair mutex, Curator's read-write,
//!   semaphore and leader-latch nodes as theirs.
//!
//! **Only distlock clients are refused.** Foreign clients (Curator, kazoo,
//! redis-py) do not run distlock's kind check and never get a `Conflict`:
//! they follow their own recipe's keys or nodes only. On ZooKeeper a
//! Curator `InterProcessMutex` (or a kazoo `Lock`) reads only the lock
//! nodes of its own queue: it takes a path that a distlock plain mutex
//! (`_unfair_lock`), write side or semaphore holds, and holds beside it. On
//! Redis a redis-py `Lock` is kept out by the lock key itself (it waits
//! while the key holds another kind's marker), not by a check. A distlock
//! client arriving after a foreign holder is refused (or waits) by the
//! table above. Keep one kind per name when other libraries share it.
//!
//! Of two kinds arriving at once, the first gets in and the other is
//! refused (or waits, for the mutex pair); each backend's docs say how it
//! makes that atomic. On ZooKeeper both can be refused in one case: a
//! waiter of one kind that comes to hold while a refused node of another
//! kind, older than its own, is not deleted yet. [`Provider::inspect`] of
//! one kind shows that kind's holders only (the mutex and the fair mutex
//! show each other's: one lock, one holder).
//!
//! # Telling failures apart
//!
//! "The lock is busy" is never an error, and "the backend is down" never
//! looks like "busy": the table of what happened and what you get is in
//! the [`error`] module.
//!
//! Backends implement the traits of [`backend`]; users never need it.
//!
//! # Fencing at the resource
//!
//! [`fence`] states the rule the protected store checks (a write with
//! token `t` only if `t` is at least the highest it admitted, atomically
//! with the write), with [`MemFence`] in process; `distlock_redis`
//! implements it in Redis.
//!
//! # Supported Rust versions
//!
//! Rust 1.89 or later.

#![cfg_attr(docsrs, feature(doc_cfg))]

// The modules in layers: each uses only those on the lines above it.
//   error, name
//   lease: options, status and its cell, terms, lifecycle, cleanup
//   inspect (the kinds, and what a snapshot reads)
//   metrics
//   watchdog, then guard
//   the primitives: lock, election, rwlock, semaphore, ids
//   backend (the kit a backend crate builds with), provider
//   multi (sets of names, over the provider's mutexes)
//   mem (the in-process backend)
pub mod backend;
pub mod election;
pub mod error;
pub mod fence;
pub mod guard;
pub mod ids;
pub mod inspect;
pub mod lease;
pub mod lock;
pub mod mem;
pub mod metrics;
pub mod multi;
pub mod name;
pub mod provider;
pub mod rwlock;
pub mod semaphore;
mod watchdog;

pub use election::{Election, LeaderInfo, LeaderStream, Leadership};
pub use error::{BoxError, Error, Result};
pub use fence::{Fence, FenceToken, Highest, MemFence};
pub use guard::{LeaseStatus, LeaseWatch, LockGuard, LostReason};
pub use ids::IdGenerator;
pub use inspect::{HoldRole, Holder, LeaseLeft, PrimitiveKind, Snapshot, Waiters};
pub use lease::{LeaseOptions, Renewal};
pub use lock::{Lock, LockFuture, Wait};
pub use multi::{LockSet, MultiGuard, MultiWatch};
pub use name::Name;
pub use provider::{ForceReleased, Provider};
pub use rwlock::ReadWriteLock;
pub use semaphore::Semaphore;
