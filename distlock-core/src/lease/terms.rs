//! What keeps a held lease: its terms, and the backend's renew and release.

use std::time::Duration;

use async_trait::async_trait;

use super::LeaseOptions;
use crate::error::Result;

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

    /// How long this backend waits for one answer of its server (its
    /// response or operation timeout), if it has such a bound. The core
    /// waits no longer than this for a release it makes on the caller's
    /// behalf past the caller's deadline (a [`LockSet`](crate::multi::LockSet)
    /// undoing what it took); one not done by then finishes in the
    /// background. `None` (the default): no bound, the release is awaited.
    fn response_timeout(&self) -> Option<Duration> {
        None
    }
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
