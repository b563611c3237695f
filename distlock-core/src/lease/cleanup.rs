//! The cleanup drop-guard: undoes a half-made acquisition (a key that may be
//! set, a node that may exist) or releases a held lease, on the runtime
//! captured when it was armed, unless disarmed.
//!
//! It is disarmed only after the cleanup is confirmed: [`CleanupGuard::run_now`]
//! keeps it armed while the cleanup runs, so a caller cancelled in the middle
//! of its own cleanup (an outer timeout, a `select!`) still leaves the work
//! to the background task that the drop spawns. Cleanups must therefore be
//! idempotent: running one twice finds nothing left the second time.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::runtime::Handle;

use crate::error::{Error, Result};

/// An idempotent undo action: delete what may be ours, never what is not.
#[async_trait]
pub trait Cleanup: Send + Sync + 'static {
    /// Runs the cleanup.
    ///
    /// # Errors
    ///
    /// Whatever the backend reports; the guard logs errors of background
    /// runs.
    ///
    /// # Cancellation safety
    ///
    /// May be dropped at any point and run again: a second run must be
    /// harmless.
    async fn clean_up(&self) -> Result<()>;

    /// How long the backend waits for one answer of its server, if it has
    /// such a bound ([`LeaseBackend::response_timeout`](crate::backend::LeaseBackend::response_timeout)).
    fn response_timeout(&self) -> Option<Duration> {
        None
    }
}

/// Runs a [`Cleanup`] unless disarmed: now with [`CleanupGuard::run_now`], or
/// in a background task on the captured runtime when dropped while armed.
#[must_use = "dropping an armed cleanup guard runs the cleanup at once"]
pub struct CleanupGuard {
    armed: Option<Arc<dyn Cleanup>>,
    handle: Handle,
    what: &'static str,
}

impl CleanupGuard {
    /// Arms `cleanup` on the current runtime; `what` names it in logs.
    ///
    /// # Errors
    ///
    /// [`Error::NoRuntime`] outside a Tokio runtime.
    pub fn arm(what: &'static str, cleanup: Arc<dyn Cleanup>) -> Result<Self> {
        let handle = Handle::try_current().map_err(|_| Error::NoRuntime)?;
        Ok(Self::arm_on(handle, what, cleanup))
    }

    /// Arms `cleanup` on `handle`.
    pub fn arm_on(handle: Handle, what: &'static str, cleanup: Arc<dyn Cleanup>) -> Self {
        CleanupGuard {
            armed: Some(cleanup),
            handle,
            what,
        }
    }

    /// Whether the cleanup is still to run.
    #[must_use]
    pub fn is_armed(&self) -> bool {
        self.armed.is_some()
    }

    /// The runtime the guard was armed on.
    #[must_use]
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// The work is done and kept: nothing to clean up.
    pub fn disarm(&mut self) {
        self.armed = None;
    }

    /// The armed cleanup's [`Cleanup::response_timeout`]; `None` once
    /// disarmed.
    pub fn response_timeout(&self) -> Option<Duration> {
        self.armed.as_ref().and_then(|c| c.response_timeout())
    }

    /// Runs the cleanup now and disarms once it has finished. If this future
    /// is dropped before then, the guard stays armed and its drop runs the
    /// cleanup again in the background.
    ///
    /// # Errors
    ///
    /// The cleanup's error (the guard is disarmed all the same: the cleanup
    /// ran to its end and decided).
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe in the sense above: a cancelled run is finished by
    /// the drop.
    pub async fn run_now(&mut self) -> Result<()> {
        let Some(cleanup) = self.armed.clone() else {
            return Ok(());
        };
        let result = cleanup.clean_up().await;
        self.armed = None;
        result
    }

    /// Hands the armed cleanup to a background task now.
    pub fn run_in_background(&mut self) {
        if let Some(cleanup) = self.armed.take() {
            let what = self.what;
            drop(self.handle.spawn(async move {
                if let Err(e) = cleanup.clean_up().await {
                    tracing::debug!(what, error = %e, "distlock background cleanup failed");
                }
            }));
        }
    }
}

impl Drop for CleanupGuard {
    fn drop(&mut self) {
        // On a runtime that is shutting down the task is dropped unrun; the
        // TTL or the session then ends what was left.
        self.run_in_background();
    }
}

impl fmt::Debug for CleanupGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CleanupGuard")
            .field("what", &self.what)
            .field("armed", &self.is_armed())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use super::*;

    /// Counts starts and finishes; each run takes 50 ms.
    #[derive(Default)]
    struct Slow {
        started: AtomicU32,
        finished: AtomicU32,
    }

    #[async_trait]
    impl Cleanup for Slow {
        async fn clean_up(&self) -> Result<()> {
            self.started.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            self.finished.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_cleanup_cancelled_midway_is_finished_in_the_background() {
        let slow = Arc::new(Slow::default());
        let mut guard = CleanupGuard::arm("test", Arc::clone(&slow) as _).unwrap();
        let cut = tokio::time::timeout(Duration::from_millis(10), guard.run_now()).await;
        assert!(cut.is_err());
        assert!(guard.is_armed(), "disarmed before the cleanup finished");
        drop(guard);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(slow.started.load(Ordering::SeqCst), 2);
        assert_eq!(slow.finished.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn disarmed_or_finished_guards_do_nothing_on_drop() {
        let slow = Arc::new(Slow::default());
        let mut guard = CleanupGuard::arm("test", Arc::clone(&slow) as _).unwrap();
        guard.run_now().await.unwrap();
        drop(guard);
        let mut other = CleanupGuard::arm("test", Arc::clone(&slow) as _).unwrap();
        other.disarm();
        drop(other);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(slow.started.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn arming_outside_a_runtime_is_an_error() {
        let r = CleanupGuard::arm("test", Arc::new(Slow::default()));
        assert!(matches!(r, Err(Error::NoRuntime)));
    }
}
