//! The lock guard: owns a lease, reports its loss, releases it.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::runtime::Handle;
use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::lease::cleanup::{Cleanup, CleanupGuard};
use crate::lease::lifecycle::Lifecycle;
use crate::lease::parts::GuardParts;
use crate::lease::signal::{Hook, LeaseSignal, State as SignalState};
pub use crate::lease::status::{LeaseStatus, LostReason};
use crate::lease::terms::{LeaseBackend, LeaseTerms};
use crate::lease::{LeaseOptions, Renewal};
use crate::name::Name;
use crate::watchdog::Watchdog;

/// An owned view of a guard's lease status, for tasks that outlive a borrow of
/// the guard. Like the guard, it compares the clock with the lease's deadline
/// itself.
#[derive(Clone, Debug)]
pub struct LeaseWatch {
    signal: LeaseSignal,
    rx: watch::Receiver<SignalState>,
}

impl LeaseWatch {
    /// The current status.
    #[must_use]
    pub fn status(&self) -> LeaseStatus {
        self.signal.status()
    }

    /// The instant until which the lease is known held (see
    /// [`LockGuard::held_until`]).
    #[must_use]
    pub fn held_until(&self) -> Option<std::time::Instant> {
        self.signal.held_until().map(tokio::time::Instant::into_std)
    }

    /// Resolves with the reason when the lease is lost (at its deadline at
    /// the latest), or with `None` when it was released normally.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe.
    pub async fn lost(&mut self) -> Option<LostReason> {
        while self.signal.next_change(&mut self.rx).await {}
        match self.signal.status() {
            LeaseStatus::Lost(reason) => Some(reason),
            _ => None,
        }
    }

    /// Resolves at the next status change (a deadline passing counts, and
    /// so does a renewal that moves [`LeaseWatch::held_until`]); `false`
    /// once no change can come.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe.
    pub async fn changed(&mut self) -> bool {
        self.signal.next_change(&mut self.rx).await
    }

    /// Whether someone asked the holder to release
    /// ([`Provider::request_release`](crate::Provider::request_release)).
    /// The lease is still held (or not) as [`LeaseWatch::status`] says: a
    /// request ends nothing by itself.
    #[must_use]
    pub fn is_release_requested(&self) -> bool {
        self.signal.is_release_requested()
    }

    /// Resolves `true` when someone asks the holder to release (at once if
    /// asked already), or `false` when the lease ends (lost or released)
    /// without a request.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe.
    pub async fn release_requested(&mut self) -> bool {
        self.signal.requested(&mut self.rx).await
    }
}

/// What the guard holds while its lease is active.
struct Held {
    release: CleanupGuard,
    watchdog: Watchdog,
    lifecycle: Arc<Lifecycle>,
    registration: u64,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.watchdog.stop();
        self.lifecycle.unregister(self.registration);
        // `release` drops after this: armed, it releases in the background.
    }
}

/// The cleanup of a held lease: its release.
struct Release(Arc<dyn LeaseBackend>);

#[async_trait]
impl Cleanup for Release {
    async fn clean_up(&self) -> Result<()> {
        self.0.release().await
    }

    fn response_timeout(&self) -> Option<Duration> {
        self.0.response_timeout()
    }
}

/// Proof of holding a lease on a named lock.
///
/// The guard owns the lease, not the task or thread that acquired it: move it
/// freely. [`LockGuard::release`] releases and reports errors; dropping the
/// guard releases in the background on the Tokio runtime captured at acquire
/// time (the TTL or session is the safety net if that never runs). A guard is
/// not `Clone`.
///
/// Work under the lock runs against [`LockGuard::lost`], and carries the
/// fencing token to what it writes:
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
/// # async fn write_order(_token: u64) {}
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
/// let locks = distlock::connect("mem://").await?;
/// let guard = locks.mutex("orders/42")?.lock().await?;
/// let token = guard.fencing_token(); // strictly above every earlier holder's
/// tokio::select! {
///     () = write_order(token) => guard.release().await?,
///     reason = guard.lost() => {
///         // Someone else may hold the lock now: stop, write nothing more.
///         eprintln!("orders/42: {reason}");
///     }
/// }
///
/// // A manual lease: no watchdog, the holder extends it while it works.
/// let lease = LeaseOptions::manual(Duration::from_secs(10))?;
/// let guard = locks.with_lease(lease)?.mutex("batch/7")?.lock().await?;
/// guard.extend(Duration::from_secs(10)).await?;
/// assert!(guard.is_held());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    name: Name,
    token: u64,
    terms: LeaseTerms,
    signal: LeaseSignal,
    held: Option<Held>,
    /// Metric labels, once the acquire call that made it set them (shared
    /// with the watchdog's renewer).
    metrics: crate::metrics::Cell,
    /// When the guard was made, for the hold time.
    since: std::time::Instant,
}

impl LockGuard {
    /// Builds a guard for a lease that `backend` just acquired, and starts
    /// its watchdog: TTL leases are renewed as their options say, session
    /// leases are checked every `timeout / 4`.
    ///
    /// # Errors
    ///
    /// [`Error::NoRuntime`] outside a Tokio runtime; [`Error::Closed`] when
    /// the provider was closed meanwhile (the lease is then released in the
    /// background).
    #[doc(hidden)] // for backends (see `distlock_core::backend`), not users
    pub fn new(parts: GuardParts, backend: Arc<dyn LeaseBackend>) -> Result<Self> {
        let handle = Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let (ttl, interval) = match parts.terms {
            LeaseTerms::Ttl(lease) => (
                lease.ttl(),
                match lease.renewal() {
                    Renewal::Watchdog { interval } => Some(interval),
                    Renewal::Manual => None,
                },
            ),
            LeaseTerms::Session { timeout } => {
                // One check interval of margin: see `LeaseTerms::Session`.
                let interval = (timeout / 4).max(Duration::from_millis(1));
                (timeout.saturating_sub(interval), Some(interval))
            }
        };
        if let LeaseTerms::Ttl(lease) = parts.terms {
            if let Some(limit) = lease.hold_limit() {
                parts.signal.set_hold_limit(
                    parts
                        .acquired_at
                        .checked_add(limit)
                        .unwrap_or(parts.acquired_at),
                );
            }
        }
        let metrics = crate::metrics::Cell::new();
        let cell = metrics.clone();
        parts
            .signal
            .on_request(Hook(Box::new(move || cell.release_requested(true))));
        // A lost lease is neither suspended nor asked any more, though its
        // guard may live on.
        let cell = metrics.clone();
        parts.signal.on_lost(Hook(Box::new(move || cell.ended())));
        let watchdog = Watchdog::spawn(
            &handle,
            parts.name.clone(),
            parts.signal.clone(),
            Arc::clone(&backend),
            ttl,
            interval,
            parts.acquired_at,
            metrics.clone(),
        );
        let registration = parts
            .lifecycle
            .register(parts.signal.clone(), Arc::clone(&backend));
        let release = CleanupGuard::arm_on(handle, "release", Arc::new(Release(backend)));
        tracing::debug!(name = %parts.name, token = parts.fencing_token, owner = %parts.lifecycle.owner(), "distlock lease acquired");
        let closed = parts.lifecycle.is_closed();
        let guard = LockGuard {
            name: parts.name,
            token: parts.fencing_token,
            terms: parts.terms,
            signal: parts.signal,
            metrics,
            since: std::time::Instant::now(),
            held: Some(Held {
                release,
                watchdog,
                lifecycle: parts.lifecycle,
                registration,
            }),
        };
        if closed {
            // `close()` ran between the acquisition and now: give it back.
            guard.signal.lose(LostReason::ProviderClosed);
            drop(guard);
            return Err(Error::Closed);
        }
        Ok(guard)
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
        match self.terms {
            LeaseTerms::Ttl(lease) => Some(lease.ttl()),
            LeaseTerms::Session { .. } => None,
        }
    }

    /// Whether the lease is (as far as the library knows) still held. Turns
    /// false the moment [`LockGuard::lost`] fires, and by itself once the
    /// lease's local deadline has passed, whether or not any task of the
    /// runtime could run meanwhile. A suspended lease counts as held; see
    /// [`LockGuard::status`].
    #[must_use]
    pub fn is_held(&self) -> bool {
        self.signal.status().is_active()
    }

    /// The lease's current status (checked against the lease's deadline).
    #[must_use]
    pub fn status(&self) -> LeaseStatus {
        self.signal.status()
    }

    /// The instant until which the lease is known held, unless lost
    /// earlier: the lease's local deadline, at which [`LockGuard::lost`]
    /// fires and [`LockGuard::is_held`] turns false unless a renewal moved
    /// it on. It comes before the earliest moment the server could hand the
    /// lock to someone else by itself (a force release or a deleted key or
    /// node hands it on at once), by the drift margin: a TTL lease's last
    /// confirmed renewal (or acquisition) was sent at `t`, the server
    /// expires it at `t + TTL` at the earliest, and this is
    /// `t + TTL − drift` ([`clock_drift`](crate::lease::clock_drift)); a
    /// session lease (ZooKeeper) is held until `3/4 × timeout − drift`
    /// after its last confirmed check was sent (one check interval of
    /// margin inside the session timeout). The hold limit
    /// ([`LeaseOptions::max_hold`]) when it comes first.
    ///
    /// Each confirmed renewal moves it later; a renewal of unknown outcome
    /// may move it earlier. Once the lease ended (lost or released), it is
    /// the instant it last stood at, and may be past. `None` for a lease
    /// without deadline (every built-in backend gives its leases one).
    ///
    /// What must stop before anyone else can hold the lock (a process the
    /// holder supervises, a write in flight) must stop by this instant;
    /// [`LeaseWatch::changed`] wakes when it moves.
    #[must_use]
    pub fn held_until(&self) -> Option<std::time::Instant> {
        self.signal.held_until().map(tokio::time::Instant::into_std)
    }

    /// Resolves when the lease is lost: renewal failed or found another
    /// owner, the deadline passed without renewal, the session ended, the
    /// lease was deleted, or the provider was closed. It never resolves while
    /// the lease is held, so `select!` your work against it.
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

    /// Resolves when someone asks this holder to let go
    /// ([`Provider::request_release`](crate::Provider::request_release), a
    /// Curator `Revoker`, `distlock unlock`): finish or abandon the work
    /// where it is safe, then [`LockGuard::release`]. The request ends
    /// nothing by itself: the lease stays held and renewed until released,
    /// lost, or forced by an operator. It never resolves otherwise (nor
    /// once the lease ended without a request), so `select!` it beside
    /// [`LockGuard::lost`].
    ///
    /// When it is heard: ZooKeeper's holder hears it through a watch on
    /// its node at once (and at the next session check, every `timeout /
    /// 4`, if a watch event was missed); Redis's at its next renewal (every
    /// `ttl / 3` by default: the renewal script reads the request, so
    /// hearing it costs no command of its own); the in-process backend at
    /// once. A lease with manual renewal ([`Renewal::Manual`]) hears it at
    /// its next [`LockGuard::extend`] on Redis.
    ///
    /// ```
    /// # mod distlock {
    /// #     pub use distlock_core::*;
    /// #     pub async fn connect(_url: &str) -> Result<std::sync::Arc<dyn Provider>> {
    /// #         Ok(std::sync::Arc::new(mem::MemProvider::new()))
    /// #     }
    /// # }
    /// use distlock::PrimitiveKind;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
    /// let locks = distlock::connect("mem://").await?;
    /// let guard = locks.mutex("reports/daily")?.lock().await?;
    /// // Elsewhere, an operator (or `distlock unlock reports/daily`):
    /// let asked = locks.request_release("reports/daily", PrimitiveKind::Mutex).await?;
    /// assert_eq!(asked.len(), 1);
    /// tokio::select! {
    ///     () = guard.release_requested() => {
    ///         // Stop at a safe point, then let go.
    ///         guard.release().await?;
    ///     }
    ///     reason = guard.lost() => eprintln!("lost: {reason}"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: it only observes.
    pub fn release_requested(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut watch = self.watch();
        async move {
            if !watch.release_requested().await {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Whether someone asked this holder to release (see
    /// [`LockGuard::release_requested`]).
    #[must_use]
    pub fn is_release_requested(&self) -> bool {
        self.signal.is_release_requested()
    }

    /// An owned view of the lease status, for another task.
    #[must_use]
    pub fn watch(&self) -> LeaseWatch {
        LeaseWatch {
            signal: self.signal.clone(),
            rx: self.signal.subscribe(),
        }
    }

    /// Sets the lease's remaining time to `ttl`. Renewals are serialised:
    /// with a watchdog, the next renewal is rescheduled to come before the
    /// new deadline (a shorter extension cannot outlive the watchdog's
    /// schedule), and the watchdog's own renewals then set the configured TTL
    /// again.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for a TTL out of range, or for a session
    /// lease (ZooKeeper: the session is the lease, it cannot be extended);
    /// [`Error::NotHeld`] when the lease is no longer held (and `lost()`
    /// fires); a connection error when the server could not be asked (the
    /// lease may still run out). On Redis, also [`Error::InvalidOptions`]
    /// for a TTL longer than an earlier extension that went unanswered on a
    /// connection since given up (it may still land; see the Redis crate's
    /// liveness docs): extend for at most that TTL, or release.
    ///
    /// # Cancellation safety
    ///
    /// If cancelled, the extension may or may not have reached the server;
    /// the guard's local deadline then becomes the earlier of the old one and
    /// the one this extension would have given, so it is never later than the
    /// server's.
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        let lease = LeaseOptions::manual(ttl)?;
        if let LeaseTerms::Session { .. } = self.terms {
            return Err(Error::InvalidOptions(
                "a session lease cannot be extended: it lasts as long as its session".into(),
            ));
        }
        let held = self.held.as_ref().ok_or_else(|| self.not_held())?;
        held.watchdog.renewer().renew(lease.ttl()).await?;
        tracing::debug!(name = %self.name, ttl_ms = lease.ttl_millis(), "distlock lease extended");
        Ok(())
    }

    /// Releases the lease and stops its watchdog. `lost()` does not fire for
    /// a lease released this way.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] when the lease had already expired or been taken:
    /// nothing was deleted, the new holder keeps its lock. A guard whose
    /// lease is known lost ([`LockGuard::lost`] fired, or its deadline
    /// passed) gets `NotHeld` at once on every backend, without asking the
    /// server (whatever may be left of it is released in the background,
    /// as on drop). A connection error
    /// when the server could not be reached (the TTL or session then ends the
    /// lease). [`Error::Closed`] when the provider was closed (which released
    /// the lease already).
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: if this future is dropped before the release
    /// finished, the release is finished in the background (as on drop).
    pub async fn release(mut self) -> Result<()> {
        let lost = matches!(self.signal.status(), LeaseStatus::Lost(_));
        let Some(mut held) = self.take_held() else {
            return Err(self.not_held());
        };
        if lost {
            // Known lost: the answer is NotHeld on every backend, at once,
            // not after a round trip to a server that may be what lost it
            // (a stopped Redis made this wait out the response timeout).
            // Dropping `held` still releases in the background whatever may
            // be left of it (compare-and-delete: never another's).
            let closed = held.lifecycle.is_closed();
            drop(held);
            tracing::debug!(name = %self.name, token = self.token, "distlock release of a lost lease");
            return Err(if closed {
                Error::Closed
            } else {
                self.not_held()
            });
        }
        let started = std::time::Instant::now();
        // Runs here, without a hop to another task; the cleanup guard
        // finishes it in the background if this future is dropped half-way.
        // Run even when the provider is closing: `close()` may not have
        // reached this lease yet.
        let result = held.release.run_now().await;
        let result = match result {
            Err(_) if held.lifecycle.is_closed() => Err(Error::Closed),
            other => other,
        };
        tracing::debug!(name = %self.name, token = self.token, owner = %held.lifecycle.owner(), ok = result.is_ok(), elapsed_us = started.elapsed().as_micros(), "distlock lease released");
        result
    }

    /// How long the backend waits for one answer of its server
    /// ([`LeaseBackend::response_timeout`]); `None` once released, or when
    /// the backend has no such bound.
    pub(crate) fn response_timeout(&self) -> Option<Duration> {
        self.held
            .as_ref()
            .and_then(|held| held.release.response_timeout())
    }

    fn take_held(&mut self) -> Option<Held> {
        let held = self.held.take()?;
        held.watchdog.stop();
        self.metrics.suspended(false);
        self.metrics.release_requested(false);
        if let Some(labels) = self.metrics.get() {
            let lost = match self.signal.peek() {
                LeaseStatus::Lost(reason) => Some(reason),
                _ => None,
            };
            crate::metrics::hold_ended(labels, self.since.elapsed(), lost);
        }
        self.signal.mark_released();
        Some(held)
    }

    /// Sets the guard's metric labels (once) and counts it as a hold.
    pub(crate) fn attach_metrics(&self, labels: crate::metrics::Labels) {
        if self.held.is_some() && self.metrics.get().is_none() {
            crate::metrics::hold_started(&labels);
            self.metrics.set(labels);
        }
    }

    fn not_held(&self) -> Error {
        Error::not_held(self.name.as_str())
    }
}

impl crate::metrics::Acquisition for Option<LockGuard> {
    fn acquired(&self) -> bool {
        self.is_some()
    }

    fn count_hold(&self, labels: crate::metrics::Labels) {
        if let Some(guard) = self {
            guard.attach_metrics(labels);
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        // Dropping `Held` releases in the background on the captured runtime.
        drop(self.take_held());
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
