//! The lock guard: owns a lease, reports its loss, releases it.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::lease::LeaseOptions;
use crate::name::Name;
use crate::watchdog::Keeper;

/// What a backend does for one held lease: renew it and release it.
///
/// Backends implement this once per lease they hand out; the core
/// [`LockGuard`] and its watchdog drive it.
#[async_trait]
pub trait LeaseBackend: Send + Sync + 'static {
    /// Sets the lease's remaining time to `ttl`, if the caller still owns it.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] when the lease has another owner or none; any other
    /// error when the server could not be asked (the lease may still be held).
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
    /// [`Error::NotHeld`] when the lease has another owner or none; any other
    /// error when the server could not be asked.
    ///
    /// # Cancellation safety
    ///
    /// May be dropped at any point; the core then calls it again in a task of
    /// its own, so a second call must be harmless (it finds the lease gone and
    /// returns [`Error::NotHeld`]).
    async fn release(&self) -> Result<()>;
}

/// Why a lease was lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// The TTL ran out without a successful renewal.
    Expired,
    /// A renewal found that somebody else (or nobody) holds the lease.
    Taken,
    /// The session that owned the lease expired (ZooKeeper).
    SessionExpired,
    /// The session that owned the lease was closed.
    SessionClosed,
    /// The lease's node or key was deleted by someone else.
    Deleted,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::Expired => "lease expired without renewal",
            LostReason::Taken => "lease is held by someone else",
            LostReason::SessionExpired => "session expired",
            LostReason::SessionClosed => "session closed",
            LostReason::Deleted => "lease was deleted",
        })
    }
}

/// The state of a lease as its holder knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseStatus {
    /// Held, and the last renewal (or the acquisition) succeeded.
    Held,
    /// Probably still held, but the server cannot be reached right now
    /// (renewals failing, ZooKeeper session disconnected). Stop writing if in
    /// doubt; [`LeaseStatus::Lost`] follows if it does not come back in time.
    Suspended,
    /// Gone: the holder must stop working under it.
    Lost(LostReason),
    /// Released by its holder (by `release()` or by dropping the guard).
    Released,
}

impl LeaseStatus {
    /// Held or suspended.
    #[must_use]
    pub fn is_active(self) -> bool {
        matches!(self, LeaseStatus::Held | LeaseStatus::Suspended)
    }
}

/// The shared status cell of one lease: the guard reads it, the watchdog and
/// the backend (session watcher, node watcher) write it.
#[derive(Clone, Debug)]
pub struct LeaseSignal {
    tx: Arc<watch::Sender<LeaseStatus>>,
}

impl Default for LeaseSignal {
    fn default() -> Self {
        Self::new()
    }
}

impl LeaseSignal {
    /// A new signal in the [`LeaseStatus::Held`] state.
    #[must_use]
    pub fn new() -> Self {
        LeaseSignal {
            tx: Arc::new(watch::Sender::new(LeaseStatus::Held)),
        }
    }

    /// The current status.
    #[must_use]
    pub fn status(&self) -> LeaseStatus {
        *self.tx.borrow()
    }

    /// Marks the lease lost, unless it already ended. Returns whether this
    /// call made the change.
    pub fn lose(&self, reason: LostReason) -> bool {
        let changed = self.transition(|s| s.is_active().then_some(LeaseStatus::Lost(reason)));
        if changed {
            tracing::warn!(%reason, "distlock lease lost");
        }
        changed
    }

    /// Marks an active lease suspended (`true`) or held again (`false`).
    pub fn suspend(&self, suspended: bool) {
        self.transition(|s| match (s, suspended) {
            (LeaseStatus::Held, true) => Some(LeaseStatus::Suspended),
            (LeaseStatus::Suspended, false) => Some(LeaseStatus::Held),
            _ => None,
        });
    }

    /// Resolves once the lease is lost or released.
    pub async fn ended(&self) {
        let mut rx = self.tx.subscribe();
        // The sender lives as long as `self`, so `wait_for` cannot fail here.
        let _ = rx.wait_for(|s| !s.is_active()).await;
    }

    fn mark_released(&self) {
        self.transition(|s| s.is_active().then_some(LeaseStatus::Released));
    }

    fn subscribe(&self) -> watch::Receiver<LeaseStatus> {
        self.tx.subscribe()
    }

    fn transition(&self, f: impl FnOnce(LeaseStatus) -> Option<LeaseStatus>) -> bool {
        self.tx.send_if_modified(|s| match f(*s) {
            Some(next) => {
                *s = next;
                true
            }
            None => false,
        })
    }
}

/// An owned view of a guard's lease status, for tasks that outlive a borrow of
/// the guard.
#[derive(Clone, Debug)]
pub struct LeaseWatch {
    rx: watch::Receiver<LeaseStatus>,
}

impl LeaseWatch {
    /// The current status.
    #[must_use]
    pub fn status(&self) -> LeaseStatus {
        *self.rx.borrow()
    }

    /// Resolves with the reason when the lease is lost, or with `None` when it
    /// was released normally (or its guard is gone).
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe.
    pub async fn lost(&mut self) -> Option<LostReason> {
        let status = self.rx.wait_for(|s| !s.is_active()).await.ok().map(|s| *s);
        match status {
            Some(LeaseStatus::Lost(reason)) => Some(reason),
            _ => None,
        }
    }

    /// Resolves at the next status change; `false` once no change can come.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe.
    pub async fn changed(&mut self) -> bool {
        self.rx.changed().await.is_ok()
    }
}

/// What a backend hands the core to build a [`LockGuard`].
#[derive(Debug)]
pub struct GuardParts {
    /// The lock's name.
    pub name: Name,
    /// The fencing token of this acquisition.
    pub fencing_token: u64,
    /// The lease's status cell; the backend may keep a clone to report loss.
    pub signal: LeaseSignal,
    /// The lease options for TTL-based backends, `None` for session-based ones.
    pub lease: Option<LeaseOptions>,
    /// When the acquire request was sent: the TTL counts from here.
    pub acquired_at: Instant,
}

struct Held {
    backend: Arc<dyn LeaseBackend>,
    keeper: Option<Keeper>,
    handle: Handle,
}

/// Proof of holding a lease on a named lock.
///
/// The guard owns the lease, not the task or thread that acquired it: move it
/// freely. [`LockGuard::release`] releases and reports errors; dropping the
/// guard releases in the background on the Tokio runtime captured at acquire
/// time (the TTL or session is the safety net if that never runs). A guard is
/// not `Clone`.
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    name: Name,
    token: u64,
    ttl: Option<Duration>,
    signal: LeaseSignal,
    held: Option<Held>,
}

impl LockGuard {
    /// Builds a guard for a lease that `backend` just acquired, and starts its
    /// watchdog and expiry clock for TTL-based leases.
    ///
    /// # Errors
    ///
    /// [`Error::NoRuntime`] outside a Tokio runtime.
    pub fn new(parts: GuardParts, backend: Arc<dyn LeaseBackend>) -> Result<Self> {
        let handle = Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let keeper = parts.lease.map(|lease| {
            Keeper::spawn(
                &handle,
                parts.name.clone(),
                parts.signal.clone(),
                Arc::clone(&backend),
                lease,
                parts.acquired_at,
            )
        });
        tracing::debug!(name = %parts.name, token = parts.fencing_token, "distlock lease acquired");
        Ok(LockGuard {
            name: parts.name,
            token: parts.fencing_token,
            ttl: parts.lease.map(|l| l.ttl()),
            signal: parts.signal,
            held: Some(Held {
                backend,
                keeper,
                handle,
            }),
        })
    }

    /// The lock's name.
    #[must_use]
    pub fn name(&self) -> &Name {
        &self.name
    }

    /// The fencing token: strictly greater than the token of every earlier
    /// holder of this name. Pass it to the storage you protect and have it
    /// reject writes with a lower token than it has seen.
    #[must_use]
    pub fn fencing_token(&self) -> u64 {
        self.token
    }

    /// The lease TTL, or `None` for a session-based lease.
    #[must_use]
    pub fn ttl(&self) -> Option<Duration> {
        self.ttl
    }

    /// Whether the lease is (as far as the library knows) still held. Turns
    /// false the moment [`LockGuard::lost`] fires. A suspended lease counts as
    /// held; see [`LockGuard::status`].
    #[must_use]
    pub fn is_held(&self) -> bool {
        self.signal.status().is_active()
    }

    /// The lease's current status.
    #[must_use]
    pub fn status(&self) -> LeaseStatus {
        self.signal.status()
    }

    /// Resolves when the lease is lost: renewal failed or found another
    /// owner, the TTL passed without renewal, the session ended, or the lease
    /// was deleted. It never resolves while the lease is held, so `select!`
    /// your work against it.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: it only observes.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let mut watch = self.watch();
        async move {
            match watch.lost().await {
                Some(reason) => reason,
                // Released: cannot happen while the guard is borrowed, but a
                // released lease is never "lost".
                None => std::future::pending().await,
            }
        }
    }

    /// An owned view of the lease status, for another task.
    #[must_use]
    pub fn watch(&self) -> LeaseWatch {
        LeaseWatch {
            rx: self.signal.subscribe(),
        }
    }

    /// Sets the lease's remaining time to `ttl` (manual renewal). With a
    /// watchdog the next renewal sets it back to the configured TTL.
    /// Session-based leases need no extension; this only checks they are held.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for a TTL out of range; [`Error::NotHeld`]
    /// when the lease is no longer held (and `lost()` fires); a connection
    /// error when the server could not be asked (the lease may still run out).
    ///
    /// # Cancellation safety
    ///
    /// If cancelled, the extension may or may not have reached the server;
    /// the guard then keeps its previous local deadline, which is never later
    /// than the server's.
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        let lease = LeaseOptions::manual(ttl)?;
        let held = self.held.as_ref().ok_or_else(|| self.not_held())?;
        if !self.signal.status().is_active() {
            return Err(self.not_held());
        }
        let Some(keeper) = &held.keeper else {
            return Ok(());
        };
        let started = Instant::now();
        match held.backend.renew(lease.ttl()).await {
            Ok(()) => {
                keeper.set_deadline(started, lease.ttl());
                tracing::debug!(name = %self.name, ttl_ms = lease.ttl_millis(), "distlock lease extended");
                Ok(())
            }
            Err(e) if e.is_not_held() => {
                self.signal.lose(LostReason::Taken);
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Releases the lease and stops its watchdog. `lost()` does not fire for
    /// a lease released this way.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] when the lease had already expired or been taken:
    /// nothing was deleted, the new holder keeps its lock. A connection error
    /// when the server could not be reached (the TTL or session then ends the
    /// lease).
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: if this future is dropped before the release
    /// finished, the release is finished in the background (as on drop).
    pub async fn release(mut self) -> Result<()> {
        let Some(held) = self.take_held() else {
            return Err(self.not_held());
        };
        let started = std::time::Instant::now();
        // Runs here, without a hop to another task; the guard finishes it in
        // the background if this future is dropped half-way.
        let mut unfinished = Unfinished {
            held: Some(held),
            name: &self.name,
        };
        let result = match &unfinished.held {
            Some(held) => held.backend.release().await,
            None => Err(Error::Closed),
        };
        unfinished.held = None;
        tracing::debug!(name = %self.name, ok = result.is_ok(), elapsed_us = started.elapsed().as_micros(), "distlock lease released");
        result
    }

    fn take_held(&mut self) -> Option<Held> {
        let held = self.held.take()?;
        if let Some(keeper) = &held.keeper {
            keeper.stop();
        }
        self.signal.mark_released();
        Some(held)
    }

    fn not_held(&self) -> Error {
        Error::not_held(self.name.as_str())
    }
}

impl Held {
    /// Releases on the runtime captured at acquire time. Runs even if the
    /// caller's task is gone; if the runtime is shutting down the task is
    /// dropped and the TTL or session ends the lease.
    fn release_in_background(self, name: &Name) {
        let name = name.clone();
        drop(self.handle.spawn(async move {
            if let Err(e) = self.backend.release().await {
                tracing::debug!(%name, error = %e, "distlock background release failed");
            }
        }));
    }
}

/// A release in progress in `LockGuard::release`; finished in the background
/// if dropped before it completed.
struct Unfinished<'a> {
    held: Option<Held>,
    name: &'a Name,
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            held.release_in_background(self.name);
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(held) = self.take_held() {
            held.release_in_background(&self.name);
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.name)
            .field("fencing_token", &self.token)
            .field("status", &self.signal.status())
            .finish_non_exhaustive()
    }
}
