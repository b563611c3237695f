//! A provider's lifecycle: the leases it holds, and closing.
//!
//! Every guard registers here while its lease is active. `close()` marks the
//! provider closed (new operations and waiting acquisitions get
//! [`Error::Closed`]), fires `lost()` of every lease still held and then
//! releases it, so the holders stop before anybody else can get in.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::Notify;

use super::{LeaseBackend, LeaseSignal};
use crate::error::{Error, Result};
use crate::guard::LostReason;

struct Held {
    signal: LeaseSignal,
    backend: Arc<dyn LeaseBackend>,
}

/// The open or closed state of one provider and the leases it holds.
pub struct Lifecycle {
    closed: AtomicBool,
    /// Wakes [`Lifecycle::closed`] waiters (a `Notify` rather than a
    /// `watch`: every waiting acquisition keeps this future).
    on_close: Notify,
    /// Held through a whole `close()`: a second caller waits for the first
    /// to finish rather than return while leases are still being released.
    closing: tokio::sync::Mutex<()>,
    held: Mutex<HashMap<u64, Held>>,
    next_id: AtomicU64,
    /// The provider's owner identity, for tracing events.
    owner: Mutex<Arc<str>>,
    /// See [`Lifecycle::with_timer_anchor`].
    anchor: Option<Arc<Anchor>>,
}

/// How far ahead the anchor's timer is due (and how often it fires while
/// the provider is busy).
const ANCHOR_TICK: Duration = Duration::from_millis(100);
/// Ticks without an operation after which the anchor stops.
const ANCHOR_IDLE_TICKS: u32 = 5;

/// The state of a provider's timer anchor: a task that keeps one timer of
/// the runtime pending while operations come (see
/// [`Lifecycle::with_timer_anchor`]).
#[derive(Default)]
struct Anchor {
    /// Operations started, bumped by [`Lifecycle::check_open`].
    ops: AtomicU64,
    /// The anchor task runs (or is being started).
    running: AtomicBool,
    /// Anchor tasks started (for tests).
    started: AtomicU64,
}

impl Anchor {
    /// Counts an operation, and starts the task if it is not running (on
    /// the caller's runtime; outside one, nothing).
    fn touch(self: &Arc<Self>) {
        self.ops.fetch_add(1, Ordering::Relaxed);
        if self.running.load(Ordering::Relaxed) || self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                self.started.fetch_add(1, Ordering::Relaxed);
                drop(handle.spawn(anchor(Arc::downgrade(self))));
            }
            Err(_) => self.running.store(false, Ordering::Release),
        }
    }
}

/// Sleeps one tick at a time while operations come; ends after
/// [`ANCHOR_IDLE_TICKS`] quiet ticks, or when the provider is gone.
async fn anchor(state: Weak<Anchor>) {
    let mut seen = None;
    let mut idle = 0;
    loop {
        tokio::time::sleep(ANCHOR_TICK).await;
        let Some(state) = state.upgrade() else {
            return;
        };
        let ops = state.ops.load(Ordering::Relaxed);
        if seen != Some(ops) {
            seen = Some(ops);
            idle = 0;
            continue;
        }
        idle += 1;
        if idle < ANCHOR_IDLE_TICKS {
            continue;
        }
        state.running.store(false, Ordering::Release);
        // An operation that came just before the store saw the task
        // running and started none: keep going for it.
        if state.ops.load(Ordering::Relaxed) == ops || state.running.swap(true, Ordering::AcqRel) {
            return;
        }
        idle = 0;
    }
}

impl std::fmt::Debug for Lifecycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lifecycle")
            .field("closed", &self.is_closed())
            .field("held", &self.held_count())
            .finish()
    }
}

impl Lifecycle {
    /// An open provider holding nothing.
    #[must_use]
    pub fn new() -> Arc<Self> {
        Self::build(None)
    }

    fn build(anchor: Option<Arc<Anchor>>) -> Arc<Self> {
        Arc::new(Lifecycle {
            closed: AtomicBool::new(false),
            on_close: Notify::new(),
            closing: tokio::sync::Mutex::new(()),
            held: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            owner: Mutex::new(Arc::from("")),
            anchor,
        })
    }

    /// As [`Lifecycle::new`], for a provider whose operations arm Tokio
    /// timers (response timeouts, renewal schedules): while operations
    /// come, one timer of the runtime stays pending, due within 100 ms.
    ///
    /// Tokio wakes the thread parked in its I/O driver whenever a timer is
    /// armed that is due before every pending one; between two operations
    /// of a provider no timer is usually pending, so each operation's
    /// timers cost such a wake-up (an `eventfd` write and an `epoll`
    /// return, on another core or in a context switch). The anchor's timer
    /// is due sooner than any timer an operation arms (timeouts of 100 ms
    /// or more), so they wake nobody. Measured on the uncontended Redis
    /// lock+release loop of `benches/examples/uncontended_profile.rs`
    /// (`strace -f -c`, 5 500 rounds): 6.4 `write`, 8.7 `epoll_wait` and
    /// 14.5 `futex` calls per lock+release without the anchor, 3.0, 6.1 and
    /// 8.4 with it (the raw client's loop: 3.4, 5.5 and 8.6); the median of
    /// five alternating runs went from 233 to 206 µs per lock+release.
    /// The anchor task fires 10 times a second while the provider is busy
    /// and stops after half a second without an operation. It only
    /// relies on when Tokio wakes its driver: were that to change, it
    /// would cost one timer and help nothing.
    #[must_use]
    pub fn with_timer_anchor() -> Arc<Self> {
        Self::build(Some(Arc::new(Anchor::default())))
    }

    /// Sets the provider's owner identity (see
    /// [`owner_identity`](crate::inspect::owner_identity)), which tracing
    /// events about its leases carry.
    pub fn set_owner(&self, owner: &str) {
        *self.owner.lock().unwrap_or_else(PoisonError::into_inner) = Arc::from(owner);
    }

    /// The provider's owner identity; empty until [`set_owner`](Self::set_owner).
    #[must_use]
    pub fn owner(&self) -> Arc<str> {
        Arc::clone(&self.owner.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Whether `close()` has been called.
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// `Ok` while open.
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] once closed.
    pub fn check_open(&self) -> Result<()> {
        if self.is_closed() {
            return Err(Error::Closed);
        }
        if let Some(anchor) = &self.anchor {
            anchor.touch();
        }
        Ok(())
    }

    /// Resolves once the provider is closed (at once if it is). Waiting
    /// acquisitions select on it.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: it only observes.
    pub async fn closed(&self) {
        let notified = self.on_close.notified();
        tokio::pin!(notified);
        // Registered before the flag is read: a close in between is not
        // missed.
        notified.as_mut().enable();
        if self.is_closed() {
            return;
        }
        notified.await;
    }

    /// Leases held right now.
    #[must_use]
    pub fn held_count(&self) -> usize {
        self.lock().len()
    }

    /// Marks the provider closed, fires `lost()` of every lease still held
    /// and releases each.
    ///
    /// # Errors
    ///
    /// The first release error (every lease is tried; the provider is closed
    /// whatever happens).
    ///
    /// # Cancellation safety
    ///
    /// If cancelled, the provider is closed and every held lease reported
    /// lost; the releases not yet done are left to the TTL or session.
    pub async fn close(&self) -> Result<()> {
        let _one_at_a_time = self.closing.lock().await;
        self.closed.store(true, Ordering::SeqCst);
        self.on_close.notify_waiters();
        let held: Vec<Held> = self.lock().drain().map(|(_, h)| h).collect();
        for h in &held {
            h.signal.lose(LostReason::ProviderClosed);
        }
        let mut first_error = None;
        for h in held {
            match h.backend.release().await {
                Ok(()) | Err(Error::NotHeld { .. }) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "distlock release at close failed");
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    pub(crate) fn register(&self, signal: LeaseSignal, backend: Arc<dyn LeaseBackend>) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, Held { signal, backend });
        id
    }

    pub(crate) fn unregister(&self, id: u64) {
        self.lock().remove(&id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Held>> {
        // Nothing panics while the map is locked; recover it if it ever did.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anchor(lifecycle: &Lifecycle) -> &Anchor {
        lifecycle.anchor.as_deref().expect("an anchor")
    }

    #[tokio::test(start_paused = true)]
    async fn the_timer_anchor_runs_while_operations_come_and_stops_when_idle() {
        let lifecycle = Lifecycle::with_timer_anchor();
        lifecycle.check_open().unwrap();
        assert!(anchor(&lifecycle).running.load(Ordering::SeqCst));
        // Operations every 50 ms: one task throughout.
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            lifecycle.check_open().unwrap();
        }
        assert_eq!(anchor(&lifecycle).started.load(Ordering::SeqCst), 1);
        assert!(anchor(&lifecycle).running.load(Ordering::SeqCst));
        // Quiet: it stops, and the next operation starts it again.
        tokio::time::sleep(ANCHOR_TICK * (ANCHOR_IDLE_TICKS + 2)).await;
        assert!(!anchor(&lifecycle).running.load(Ordering::SeqCst));
        lifecycle.check_open().unwrap();
        assert_eq!(anchor(&lifecycle).started.load(Ordering::SeqCst), 2);
        // A closed provider starts nothing and counts nothing.
        lifecycle.close().await.unwrap();
        let ops = anchor(&lifecycle).ops.load(Ordering::SeqCst);
        assert!(lifecycle.check_open().is_err());
        assert_eq!(anchor(&lifecycle).ops.load(Ordering::SeqCst), ops);
    }

    #[test]
    fn outside_a_runtime_the_anchor_starts_nothing() {
        let lifecycle = Lifecycle::with_timer_anchor();
        lifecycle.check_open().unwrap();
        assert!(!anchor(&lifecycle).running.load(Ordering::SeqCst));
        assert_eq!(anchor(&lifecycle).started.load(Ordering::SeqCst), 0);
        assert!(Lifecycle::new().anchor.is_none());
    }
}
