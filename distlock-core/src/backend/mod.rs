//! What a backend implements and the helpers it builds on: the lease it
//! hands to a [`LockGuard`](crate::LockGuard), the status cell, the cleanup
//! drop-guard, the provider's lifecycle, id blocks, timeouts and settings.
//!
//! Users of distlock do not need this module; the facade does not re-export
//! it.

mod cleanup;
mod ids;
mod lifecycle;
mod signal;
mod timeout;
pub mod url;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

pub use crate::election::validate_candidate;
use crate::error::Result;
use crate::lease::LeaseOptions;
pub use crate::lease::{check_setting, clock_drift};
use crate::name::Name;
pub use cleanup::{Cleanup, CleanupGuard};
pub use ids::{BlockIds, IdSource};
pub use lifecycle::{Closed, Lifecycle};
pub use signal::LeaseSignal;
pub(crate) use signal::State as SignalState;
pub use timeout::with_timeout;

/// What a backend does for one held lease: renew it and release it.
///
/// Backends implement this once per lease they hand out; the core
/// [`LockGuard`](crate::LockGuard) and its watchdog drive it.
#[async_trait]
pub trait LeaseBackend: Send + Sync + 'static {
    /// Sets the lease's remaining time to `ttl`, if the caller still owns it.
    /// For a session lease (`ttl` is then the session timeout), confirms the
    /// lease is still ours: a success proves the server heard the session
    /// at or after the moment the request was sent.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`](crate::Error::NotHeld) when the lease has another
    /// owner or none; any other error when the server could not be asked
    /// (the lease may still be held).
    ///
    /// # Cancellation safety
    ///
    /// May be dropped at any point: the renewal then happened or not.
    async fn renew(&self, ttl: Duration) -> Result<()>;

    /// Releases the lease if the caller still owns it; never touches a lease
    /// owned by someone else.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`](crate::Error::NotHeld) when the lease has another
    /// owner or none; any other error when the server could not be asked.
    ///
    /// # Cancellation safety
    ///
    /// May be dropped at any point; the core then calls it again in a task of
    /// its own, so a second call must be harmless (it finds the lease gone and
    /// returns `NotHeld`).
    async fn release(&self) -> Result<()>;
}

/// How long a lease lasts and what keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseTerms {
    /// A TTL lease (Redis, in-process): the server expires it after the TTL;
    /// renewed by the watchdog or by `extend()`.
    Ttl(LeaseOptions),
    /// A session lease (ZooKeeper): the server may end it `timeout` after it
    /// last heard the session. The core confirms it every `timeout / 4` with
    /// [`LeaseBackend::renew`] and treats it as lost `3/4 × timeout` − drift
    /// after the last confirmed check was sent (one check interval of margin
    /// for a touch that a follower forwards to the leader late: followers
    /// forward touches in their pings, every `tickTime / 2`, and ZooKeeper
    /// keeps session timeouts at `2 × tickTime` or more). It cannot be
    /// extended.
    Session {
        /// The session timeout negotiated with the server.
        timeout: Duration,
    },
}

/// What a backend hands the core to build a [`LockGuard`](crate::LockGuard).
#[derive(Debug)]
pub struct GuardParts {
    /// The lock's name.
    pub name: Name,
    /// The fencing token of this acquisition.
    pub fencing_token: u64,
    /// The lease's status cell; the backend may keep a clone to report loss.
    pub signal: LeaseSignal,
    /// The lease's terms.
    pub terms: LeaseTerms,
    /// When the acquire request was sent: the lease counts from here.
    pub acquired_at: Instant,
    /// The provider the lease belongs to; `close()` there ends it.
    pub lifecycle: Arc<Lifecycle>,
}

/// Checks a semaphore's number of permits: at least 1.
///
/// # Errors
///
/// [`Error::InvalidOptions`](crate::Error::InvalidOptions) for 0.
pub fn check_permits(permits: u32) -> Result<u32> {
    if permits == 0 {
        return Err(crate::Error::InvalidOptions(
            "a semaphore needs at least one permit".into(),
        ));
    }
    Ok(permits)
}

/// Notes that the acquire call (or campaign) running in this task was just
/// woken by a sign that the lock came free (a release message, a watch
/// event): the start of a handoff, for the `distlock_handoff_seconds`
/// metric. Does nothing outside an acquire call, or without the `metrics`
/// feature.
#[inline]
pub fn woke() {
    crate::metrics::note_wakeup();
}

/// Runs an election's `campaign` future, recording it in the metrics as
/// an acquire call of primitive `election` and its leadership as a hold
/// (feature `metrics`; a plain `.await` without it). Backends wrap the body
/// of [`Election::campaign`](crate::Election::campaign) in it.
///
/// # Errors
///
/// The campaign's.
///
/// # Cancellation safety
///
/// As the campaign's: dropping it drops the campaign.
pub async fn measured_campaign(
    backend: &'static str,
    name: &crate::name::Name,
    campaign: impl std::future::Future<Output = crate::error::Result<crate::election::Leadership>>,
) -> crate::error::Result<crate::election::Leadership> {
    crate::metrics::campaign(backend, name, campaign).await
}
