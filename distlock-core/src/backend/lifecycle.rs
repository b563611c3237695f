//! A provider's lifecycle: the leases it holds, and closing.
//!
//! Every guard registers here while its lease is active. `close()` marks the
//! provider closed (new operations and waiting acquisitions get
//! [`Error::Closed`]), fires `lost()` of every lease still held and then
//! releases it, so the holders stop before anybody else can get in.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

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
        Arc::new(Lifecycle {
            closed: AtomicBool::new(false),
            on_close: Notify::new(),
            closing: tokio::sync::Mutex::new(()),
            held: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            owner: Mutex::new(Arc::from("")),
        })
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
            Err(Error::Closed)
        } else {
            Ok(())
        }
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
