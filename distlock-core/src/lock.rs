//! The lock trait every backend's mutexes implement.

use std::fmt::Debug;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::inspect::PrimitiveKind;
use crate::name::Name;

/// How long an acquisition may wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Do not wait: take the lock if it is free now.
    No,
    /// Wait until this instant at the latest.
    Until(Instant),
    /// Wait as long as it takes.
    Forever,
}

impl Wait {
    /// Waiting at most `timeout` from now. A timeout too large to add to the
    /// clock waits forever.
    #[must_use]
    pub fn timeout(timeout: Duration) -> Wait {
        Instant::now()
            .checked_add(timeout)
            .map_or(Wait::Forever, Wait::Until)
    }

    /// The deadline, if any (`No` is "now").
    #[must_use]
    pub fn deadline(self) -> Option<Instant> {
        match self {
            Wait::No => Some(Instant::now()),
            Wait::Until(at) => Some(at),
            Wait::Forever => None,
        }
    }
}

/// A named distributed mutex (fair or not, on any backend).
///
/// Locks are not reentrant: a second acquisition from the same process, even
/// the same task, contends like any other client's (and so deadlocks if it
/// waits for its own guard).
///
/// The three ways to ask, and cancelling a wait from outside:
///
/// ```
/// # mod distlock {
/// #     pub use distlock_core::*;
/// #     pub async fn connect(_url: &str) -> Result<std::sync::Arc<dyn Provider>> {
/// #         Ok(std::sync::Arc::new(mem::MemProvider::new()))
/// #     }
/// # }
/// use std::time::Duration;
/// use distlock::Provider;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
/// let locks = distlock::connect("mem://").await?;
/// let lock = locks.mutex("reports/daily")?;
///
/// // Without waiting: `None` while somebody else holds it.
/// let guard = lock.try_lock().await?.expect("nobody holds it yet");
///
/// // Waiting at most 100 ms: `None` if it did not come, nothing left behind.
/// assert!(lock.lock_timeout(Duration::from_millis(100)).await?.is_none());
///
/// // Every acquire future can be dropped at any point, leaving nothing held
/// // or queued: here `tokio::time::timeout` cancels a `lock()` (a `select!`
/// // against a shutdown signal does the same).
/// let waited = tokio::time::timeout(Duration::from_millis(100), lock.lock()).await;
/// assert!(waited.is_err(), "cancelled while the lock was held");
///
/// guard.release().await?;
/// let guard = lock.lock().await?; // free now: waits no time
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[async_trait]
pub trait Lock: Send + Sync + Debug {
    /// The lock's name.
    fn name(&self) -> &Name;

    /// The backend it lives on (`"mem"`, `"redis"`, `"zookeeper"`, ...), as
    /// [`Provider::backend`](crate::Provider::backend) says.
    fn backend(&self) -> &'static str;

    /// Which primitive it is (a read-write lock's sides are
    /// [`PrimitiveKind::ReadWrite`]).
    fn kind(&self) -> PrimitiveKind;

    /// Acquires the lock, waiting as `wait` allows. `Ok(None)` when the wait
    /// ended without the lock; nothing is then left behind on the server.
    ///
    /// # Errors
    ///
    /// Connection and server errors of the backend; [`Error::Conflict`] when
    /// the name holds data that is not this kind of lock; [`Error::NoRuntime`]
    /// outside a Tokio runtime.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: dropping the future at any await point leaves
    /// nothing held; a key or node made before the cancellation is removed.
    async fn acquire(&self, wait: Wait) -> Result<Option<LockGuard>>;

    /// Takes the lock if it is free now.
    ///
    /// # Errors
    ///
    /// As [`Lock::acquire`].
    ///
    /// # Cancellation safety
    ///
    /// As [`Lock::acquire`].
    fn try_lock(&self) -> BoxFuture<'_, Result<Option<LockGuard>>> {
        measured(self, Wait::No)
    }

    /// Waits until the lock is acquired.
    ///
    /// # Errors
    ///
    /// As [`Lock::acquire`].
    ///
    /// # Cancellation safety
    ///
    /// As [`Lock::acquire`].
    fn lock(&self) -> LockFuture<'_> {
        LockFuture(measured(self, Wait::Forever))
    }

    /// Waits at most `timeout` for the lock, counted from this call (as
    /// [`tokio::time::timeout`] counts); `Ok(None)` when it did not come.
    ///
    /// # Errors
    ///
    /// As [`Lock::acquire`].
    ///
    /// # Cancellation safety
    ///
    /// As [`Lock::acquire`].
    fn lock_timeout(&self, timeout: Duration) -> BoxFuture<'_, Result<Option<LockGuard>>> {
        measured(self, Wait::timeout(timeout))
    }
}

/// The future of [`Lock::lock`]: the backend's acquire future itself,
/// read as "the lock, or why not" (no second box or async body around it:
/// a waiting task keeps this).
#[must_use = "futures do nothing unless polled"]
pub struct LockFuture<'a>(BoxFuture<'a, Result<Option<LockGuard>>>);

impl std::fmt::Debug for LockFuture<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockFuture").finish_non_exhaustive()
    }
}

impl std::future::Future for LockFuture<'_> {
    type Output = Result<LockGuard>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<LockGuard>> {
        // A wait without a deadline ends without the lock only when the
        // provider closes.
        self.0.as_mut().poll(cx).map(|r| r?.ok_or(Error::Closed))
    }
}

/// `lock.acquire(wait)`, recorded in the metrics (feature `metrics`; a
/// plain call without it).
///
/// Two versions rather than one with a runtime test: a waiting task keeps
/// this future, and without metrics it is only the backend's (see
/// `benches/README.md`, memory per waiting contender).
#[cfg(not(feature = "metrics"))]
fn measured<L: Lock + ?Sized>(lock: &L, wait: Wait) -> BoxFuture<'_, Result<Option<LockGuard>>> {
    lock.acquire(wait)
}

/// `lock.acquire(wait)`, recorded in the metrics.
#[cfg(feature = "metrics")]
fn measured<L: Lock + ?Sized>(lock: &L, wait: Wait) -> BoxFuture<'_, Result<Option<LockGuard>>> {
    let labels = crate::metrics::Labels {
        backend: lock.backend(),
        primitive: lock.kind(),
        name: lock.name().clone(),
    };
    Box::pin(crate::metrics::measured(
        labels,
        wait != Wait::No,
        false,
        lock.acquire(wait),
    ))
}
