//! Core of [distlock](https://docs.rs/distlock): the traits every backend
//! implements, lease semantics, the watchdog, errors, names, and the
//! in-process backend.
//!
//! ```
//! use std::time::Duration;
//! use distlock_core::{mem::MemProvider, Provider};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock_core::Result<()> {
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
//! backend offers every primitive.
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
//! * Every acquire future can be dropped at any await point without leaving
//!   anything held.
//! * Locks are not reentrant.
//! * [`Provider::close`] releases what a provider holds and closes its
//!   connections or session; later calls get [`Error::Closed`].
//!
//! Backends implement the traits of [`backend`]; users never need it.
//!
//! # Supported Rust versions
//!
//! Rust 1.88 or later.

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backend;
pub mod election;
pub mod error;
pub mod guard;
pub mod ids;
pub mod inspect;
pub mod lease;
pub mod lock;
pub mod mem;
pub mod name;
pub mod provider;
pub mod rwlock;
pub mod semaphore;
mod watchdog;

pub use election::{Election, LeaderInfo, LeaderStream, Leadership};
pub use error::{BoxError, Error, Result};
pub use guard::{LeaseStatus, LeaseWatch, LockGuard, LostReason};
pub use ids::IdGenerator;
pub use inspect::{HoldRole, Holder, LeaseLeft, PrimitiveKind, Snapshot, Waiters};
pub use lease::{LeaseOptions, Renewal};
pub use lock::{Lock, Wait};
pub use name::Name;
pub use provider::{ForceReleased, Provider};
pub use rwlock::ReadWriteLock;
pub use semaphore::Semaphore;
