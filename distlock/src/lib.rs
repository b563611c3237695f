#![doc = include_str!("../README.md")]
//!
//! # Where to start in these docs
//!
//! [`connect`] gives a [`Provider`] for a URL; the provider hands out, by
//! name, [`Lock`]s (mutex, fair mutex, the sides of a [`ReadWriteLock`], a
//! [`Semaphore`]), [`Election`]s and [`IdGenerator`]s; acquiring gives a
//! [`LockGuard`] (or a [`Leadership`]). Each has an example: waiting with a
//! deadline and cancelling with `tokio::time::timeout` on [`Lock`],
//! `select!` against [`LockGuard::lost`] on [`LockGuard`], observing a
//! leader on [`Election`] (with [`election::StreamExt`]). Which error means
//! what, and how to tell "busy" from "down": the table in [`error`].
//!
//! # What differs between backends
//!
//! Only the URL changes between backends; every primitive, guard and error
//! behaves the same, except for what follows (each backend crate's docs give
//! the details).
//!
//! | | in-process `mem://` | Redis | ZooKeeper |
//! |---|---|---|---|
//! | what the lease is | a TTL, renewed by the watchdog at TTL/3 | a TTL on the key (`PX`), renewed by the watchdog at TTL/3 | the client's session: `lost()` fires 3/4 of the session timeout (less the drift) after the server was last heard |
//! | lease options ([`Provider::with_lease`]: TTL, manual renewal, watchdog interval) | honoured | honoured | refused by `with_lease` with [`Error::InvalidOptions`], saying what to do: only `max_hold` is honoured; set the session timeout (`?session_timeout_ms=` on the URL) instead |
//! | [`LockGuard::extend`], [`LockGuard::ttl`] | yes, `Some(ttl)` | yes, `Some(ttl)` | [`Error::InvalidOptions`], `None` |
//! | [`LeaseStatus::Suspended`] | never (nothing to lose touch with) | a renewal failed for a transport reason, or is unanswered a quarter of the renewal interval after it was sent (a stopped server); `Lost(Expired)` at the deadline if no renewal gets through | the session is disconnected; `Lost(SessionExpired)` (or `Expired` at the local deadline) if it does not reconnect in time |
//! | fencing tokens | 1, 2, 3, … per name | at least the server's `TIME` in µs (about 1.8 × 10¹⁵), so they survive a lost counter | the holder node's `czxid` |
//! | a [`Provider::force_release`]d holder learns it | at once | at its next renewal (within TTL/3) | when its node is deleted (a watch, at once) |
//! | a waiter of another kind queued ahead (one name is one lock) | refuses with [`Error::Conflict`] | not counted (refused when it next tries) | refuses with [`Error::Conflict`] |
//! | ids ([`IdGenerator`]) after a restart | start again (the table lives in the process) | repeat without persistence (`appendonly`) | persistent |
//! | primitives | all | all; `redis+redlock://`: the mutex only | all |
//!
//! The same everywhere, and easy to assume otherwise: `release()` of a guard
//! whose lease is known lost ([`LockGuard::lost`] fired) answers
//! [`Error::NotHeld`] at once, without asking the server; busy is `Ok(None)`,
//! never an error; a URL whose backend's feature is off is an
//! [`Error::UnsupportedBackend`].
//!
//! # Lease options
//!
//! A provider's primitives use its lease ([`Provider::default_lease`]: 30 s,
//! renewed by the watchdog every 10 s, unless the URL or the backend's
//! options say otherwise). For other lease options, take a view of the same
//! provider with [`Provider::with_lease`] and ask it for primitives: every
//! primitive gets its lease this one way.
//!
//! ```
//! use std::time::Duration;
//! use distlock::LeaseOptions;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
//! let locks = distlock::connect("mem://").await?;
//! let short = locks.with_lease(LeaseOptions::new(Duration::from_secs(5))?)?;
//! let m = short.mutex("jobs/hourly")?;
//! let guard = m.lock().await?;
//! assert_eq!(guard.ttl(), Some(Duration::from_secs(5)));
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! The view is the same client as `locks` (same connections or session,
//! owner identity and held leases): a lock held through one excludes the
//! other, and closing either closes both. ZooKeeper, whose lease is the
//! session, refuses any TTL or renewal but its default in `with_lease`
//! (typed, [`Error::InvalidOptions`], saying what to do) and honours
//! [`LeaseOptions::max_hold`].
//!
//! # Feature flags
//!
//! * `redis` — the Redis backend (`redis://`, `redis+sentinel://`,
//!   `redis+redlock://`), re-exported as `distlock::redis` when on.
//! * `redis-cluster` — Redis Cluster (`redis+cluster://`), implies `redis`.
//! * `redis-tls` — `rediss://` URLs, implies `redis`.
//! * `zookeeper` — the ZooKeeper backend (`zk://`), re-exported as
//!   `distlock::zk` when on.
//! * `zookeeper-tls` — TLS for ZooKeeper, implies `zookeeper`.
//! * `fence-postgres` — `distlock::fence::postgres::PgFence`: PostgreSQL
//!   rows fenced inside the caller's tokio-postgres transaction.
//! * `fence-tower` — `distlock::fence::tower::FenceLayer`: a tower layer
//!   (axum, hyper) for an HTTP service that is the protected resource, and
//!   the client side's `Fencing-Token` header.
//! * `metrics` — records acquisitions, holds, waits, handoffs, renewals and
//!   lost leases through the [`metrics`](https://docs.rs/metrics) crate's
//!   facade (see [`metrics`](mod@metrics)); off by default, and nothing is
//!   recorded (at no cost) without it.
//!
//! The in-process backend (`mem://`) is always there.
//!
//! # Fencing at the resource
//!
//! A holder paused past its lease (a GC pause, a starved watchdog, a
//! partition) can still write after the next holder did; only the resource
//! can refuse it, by the guard's fencing token. [`fence`] has the rule and
//! the in-process fence ([`MemFence`]); with `redis`,
//! `distlock::redis::RedisFence` fences Redis keys with scripts that check
//! and write in one step.
//!
//! ```
//! use distlock::fence::{FenceToken, MemFence};
//! use distlock::{mem::MemProvider, Provider};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
//! let locks = MemProvider::new();
//! let orders: MemFence<u64> = MemFence::new();
//!
//! let old = locks.mutex("orders/42")?.lock().await?;
//! let stale = FenceToken::of(&old);
//! old.release().await?; // say its lease ran out while it was paused
//!
//! let new = locks.mutex("orders/42")?.lock().await?;
//! orders.write("orders/42", FenceToken::of(&new), |v| *v = Some(7))?;
//!
//! // The paused holder wakes up and writes: refused, nothing changed.
//! let err = orders.write("orders/42", stale, |v| *v = Some(1)).unwrap_err();
//! assert!(err.is_stale());
//! assert_eq!(orders.read("orders/42"), Some(7));
//! new.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Supported Rust versions
//!
//! Rust 1.89 or later.

use std::sync::Arc;

// An explicit list: what users call. What backends implement
// (`distlock_core::backend`) is not re-exported.
pub use distlock_core::{
    election, error, guard, ids, inspect, lease, lock, mem, metrics, multi, name, provider, rwlock,
    semaphore, BoxError, Election, Error, Fence, FenceToken, ForceReleased, Highest, HoldRole,
    Holder, IdGenerator, LeaderInfo, LeaderStream, Leadership, LeaseLeft, LeaseOptions,
    LeaseStatus, LeaseWatch, Lock, LockGuard, LockSet, LostReason, MemFence, MultiGuard,
    MultiWatch, Name, PrimitiveKind, Provider, ReadWriteLock, Renewal, Result, Semaphore, Snapshot,
    Wait, Waiters,
};

/// Fencing at the resource: the rule, the in-process fence, and the
/// stores' fences behind features.
///
/// The rule and its two numbers are told once, in
/// [`Highest::check`](distlock_core::fence::Highest::check) and the
/// module docs of `distlock_core::fence`; everything here implements
/// [`Fence`]:
///
/// * [`MemFence`]: in process;
/// * `distlock::redis::RedisFence` (feature `redis`): Redis keys;
/// * `postgres::PgFence` (feature `fence-postgres`): PostgreSQL rows,
///   admitted inside the caller's transaction;
/// * `tower::FenceLayer` (feature `fence-tower`): an HTTP service that is
///   itself the resource (`Fencing-Token` header, `409 Conflict`).
pub mod fence {
    pub use distlock_core::fence::*;

    #[cfg(feature = "fence-postgres")]
    pub use distlock_fence::postgres;
    #[cfg(feature = "fence-tower")]
    pub use distlock_fence::tower;
}

/// The Redis backend crate.
#[cfg(feature = "redis")]
pub use distlock_redis as redis;

/// The ZooKeeper backend crate.
#[cfg(feature = "zookeeper")]
pub use distlock_zk as zk;

/// The backend a connection URL names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Scheme {
    /// `mem://[table]`: the in-process backend.
    Mem,
    /// `redis://…`, `rediss://…`, `redis+cluster://…`, `redis+sentinel://…`
    /// or `redis+redlock://…`.
    Redis,
    /// `zk://host:port[,host:port…][/chroot]`.
    ZooKeeper,
}

impl Scheme {
    /// The scheme of `url`.
    ///
    /// ```
    /// use distlock::Scheme;
    ///
    /// assert_eq!(Scheme::of("zk://u:s3cret@h:2181/app")?, Scheme::ZooKeeper);
    /// for bad in ["u:s3cret@h:6379", "u:s3cret@h://x"] {
    ///     let e = Scheme::of(bad).unwrap_err();
    ///     assert!(e.is_invalid_input());
    ///     assert!(e.to_string().contains("u:***@h") && !e.to_string().contains("s3cret"));
    /// }
    /// # Ok::<(), distlock::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] when `url` has no `scheme://`;
    /// [`Error::UnsupportedBackend`] for a scheme distlock does not know.
    /// Messages never show a password (it is replaced by `***`).
    pub fn of(url: &str) -> Result<Scheme> {
        let (scheme, _) = url
            .split_once("://")
            .ok_or_else(|| distlock_core::backend::url::invalid_url(url, "has no scheme://"))?;
        match scheme.to_ascii_lowercase().as_str() {
            "mem" => Ok(Scheme::Mem),
            "redis" | "rediss" | "redis+unix" | "redis+cluster" | "redis+sentinel"
            | "redis+redlock" => Ok(Scheme::Redis),
            "zk" | "zookeeper" => Ok(Scheme::ZooKeeper),
            // What stands before "://" may be credentials (`u:pw@h://…`).
            other => Err(Error::UnsupportedBackend(format!(
                "unknown scheme {:?}: use mem://, redis://, rediss:// or zk://",
                distlock_core::backend::url::redact(other)
            ))),
        }
    }
}

/// Connects to the backend named by `url` and returns its provider.
///
/// * `mem://` — the process-wide in-process table; `mem://NAME` a named one
///   (see [`mem::MemProvider::shared`]).
/// * `redis://…`, `rediss://…` — Redis (feature `redis`);
///   `redis+cluster://h1:p1,h2:p2` — Redis Cluster (feature `redis-cluster`);
///   `redis+sentinel://s1:p1,s2:p2/master-name` — the master Redis Sentinel
///   names, followed through failovers; `redis+redlock://h1:p1,h2:p2,h3:p3` —
///   Redlock over independent masters, with fencing tokens (the mutex only).
///   Add `?wait_replicas=1` to wait for a replica's acknowledgement of every
///   acquisition (see `distlock_redis`'s crate docs).
/// * `zk://h1:2181,h2:2181/chroot` — ZooKeeper (feature `zookeeper`).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
/// let locks = distlock::connect("mem://").await?;
/// let guard = locks.mutex("jobs/nightly")?.lock().await?;
/// guard.release().await?;
/// assert!(distlock::connect("ftp://x").await.unwrap_err().is_invalid_input());
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// [`Error::InvalidUrl`] for a malformed URL; [`Error::UnsupportedBackend`]
/// for an unknown scheme or one whose cargo feature is off; the backend's
/// connection errors.
///
/// # Cancellation safety
///
/// Cancellation safe: a dropped connect leaves no connection open.
pub async fn connect(url: &str) -> Result<Arc<dyn Provider>> {
    match Scheme::of(url)? {
        Scheme::Mem => {
            let rest = url.split_once("://").map_or("", |(_, rest)| rest);
            Ok(Arc::new(mem::MemProvider::shared(
                rest.trim_end_matches('/'),
            )))
        }
        Scheme::Redis => connect_redis(url).await,
        Scheme::ZooKeeper => connect_zk(url).await,
    }
}

#[cfg(feature = "redis")]
async fn connect_redis(url: &str) -> Result<Arc<dyn Provider>> {
    distlock_redis::connect(url).await
}

#[cfg(not(feature = "redis"))]
#[allow(clippy::unused_async)]
async fn connect_redis(url: &str) -> Result<Arc<dyn Provider>> {
    let _ = url;
    Err(Error::UnsupportedBackend(
        "redis:// needs distlock's `redis` feature".into(),
    ))
}

#[cfg(feature = "zookeeper")]
async fn connect_zk(url: &str) -> Result<Arc<dyn Provider>> {
    distlock_zk::connect(url).await
}

#[cfg(not(feature = "zookeeper"))]
#[allow(clippy::unused_async)]
async fn connect_zk(url: &str) -> Result<Arc<dyn Provider>> {
    let _ = url;
    Err(Error::UnsupportedBackend(
        "zk:// needs distlock's `zookeeper` feature".into(),
    ))
}
