//! A provider's lifecycle: the leases it holds, and closing.
//!
//! Every guard registers here while its lease is active. `close()` marks the
//! provider closed (new operations and waiting acquisitions get
//! [`Error::Closed`]), fires `lost()` of every lease still held and then
//! releases it, so the holders stop before anybody else can get in.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

use super::signal::LeaseSignal;
use super::status::LostReason;
use super::terms::LeaseBackend;
use crate::error::{Error, Result};

struct Held {
    signal: LeaseSignal,
    backend: Arc<dyn LeaseBackend>,
}

/// The open or closed state of one provider and the leases it holds.
pub struct Lifecycle {
    closed: AtomicBool,
    /// The wakers of the [`Closed`] futures pending now, woken by the close.
    /// Kept here, not in the futures: every waiting acquisition keeps one,
    /// and a slot here is 16 bytes where a `Notify`'s `Notified` is 64.
    on_close: Mutex<Wakers>,
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
            on_close: Mutex::new(Wakers::default()),
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
    /// Cancellation safe: it only observes (dropped, it gives back its
    /// waker's slot).
    pub fn closed(&self) -> Closed<'_> {
        Closed {
            lifecycle: self,
            slot: NO_SLOT,
        }
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
        // The flag is set before the wakers are taken, and a `Closed` reads
        // it with the wakers locked after storing its own: none is missed.
        let wakers = std::mem::take(&mut *self.wakers());
        for waker in wakers.slots.into_iter().flatten() {
            waker.wake();
        }
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
        // Dropped after the lock is released (its drop may run anything).
        let removed = self.lock().remove(&id);
        drop(removed);
    }

    fn wakers(&self) -> std::sync::MutexGuard<'_, Wakers> {
        self.on_close.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Held>> {
        // Nothing panics while the map is locked; recover it if it ever did.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The wakers of pending [`Closed`] futures: a slot each, reused.
#[derive(Default)]
struct Wakers {
    slots: Vec<Option<Waker>>,
    free: Vec<usize>,
}

/// The future of [`Lifecycle::closed`]: resolves once the provider is
/// closed. It keeps a reference and a slot number; its waker lives in the
/// lifecycle while it is pending.
#[must_use = "futures do nothing unless polled"]
pub struct Closed<'a> {
    lifecycle: &'a Lifecycle,
    /// Our waker's slot in the lifecycle; [`NO_SLOT`] before the first
    /// pending poll (a sentinel, not an `Option`: 16 bytes, not 24).
    slot: usize,
}

/// [`Closed::slot`] before the future holds one.
const NO_SLOT: usize = usize::MAX;

impl std::fmt::Debug for Closed<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Closed")
            .field("closed", &self.lifecycle.is_closed())
            .finish_non_exhaustive()
    }
}

impl Future for Closed<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let lifecycle = self.lifecycle;
        if lifecycle.is_closed() {
            return Poll::Ready(());
        }
        let mut wakers = lifecycle.wakers();
        // Read again under the lock: the close sets the flag before it
        // takes the wakers, so either it sees this waker or this sees it.
        if lifecycle.is_closed() {
            return Poll::Ready(());
        }
        let waker = cx.waker();
        match self.slot {
            i if i != NO_SLOT => {
                let mut replaced = None;
                if let Some(slot) = wakers.slots.get_mut(i) {
                    if !slot.as_ref().is_some_and(|w| w.will_wake(waker)) {
                        replaced = slot.replace(waker.clone());
                    }
                }
                // A waker's drop may run anything (even drop another
                // `Closed` of this lifecycle): never under the lock.
                drop(wakers);
                drop(replaced);
            }
            _ => {
                let i = if let Some(i) = wakers.free.pop() {
                    wakers.slots[i] = Some(waker.clone());
                    i
                } else {
                    wakers.slots.push(Some(waker.clone()));
                    wakers.slots.len() - 1
                };
                drop(wakers);
                self.slot = i;
            }
        }
        Poll::Pending
    }
}

impl Drop for Closed<'_> {
    fn drop(&mut self) {
        let i = self.slot;
        if i == NO_SLOT {
            return;
        }
        let mut wakers = self.lifecycle.wakers();
        // After a close the slots were taken: nothing to give back.
        let ours = wakers.slots.get_mut(i).and_then(Option::take);
        if ours.is_some() {
            wakers.free.push(i);
        }
        // Dropped outside the lock, as in `poll`.
        drop(wakers);
        drop(ours);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn close_wakes_every_pending_closed_and_gives_back_dropped_slots() {
        let lifecycle = Lifecycle::new();
        let mut pending: Vec<_> = (0..8).map(|_| Box::pin(lifecycle.closed())).collect();
        for c in &mut pending {
            assert!(futures::poll!(c.as_mut()).is_pending());
        }
        assert_eq!(lifecycle.wakers().slots.len(), 8);
        // Dropped futures give their slots back; new ones reuse them.
        pending.truncate(5);
        assert_eq!(lifecycle.wakers().free.len(), 3);
        let mut again = Box::pin(lifecycle.closed());
        assert!(futures::poll!(again.as_mut()).is_pending());
        assert_eq!(lifecycle.wakers().slots.len(), 8);
        assert_eq!(lifecycle.wakers().free.len(), 2);
        // A future that was never polled holds no slot.
        let never_polled = lifecycle.closed();
        let waiting = tokio::spawn({
            let lifecycle = Arc::clone(&lifecycle);
            async move { lifecycle.closed().await }
        });
        tokio::task::yield_now().await;
        lifecycle.close().await.unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("a pending closed() was not woken by close()")
            .unwrap();
        for c in &mut pending {
            assert!(futures::poll!(c.as_mut()).is_ready());
        }
        assert!(futures::poll!(again.as_mut()).is_ready());
        never_polled.await;
        // Polled for the first time after the close: ready at once.
        lifecycle.closed().await;
        drop(pending);
        assert!(lifecycle.wakers().slots.is_empty());
    }

    /// A waker whose drop drops a `Closed` of the same lifecycle: the
    /// lifecycle's lock must not be held when `poll` replaces a waker or
    /// `drop` gives one back, or this deadlocks.
    #[test]
    fn a_waker_dropped_by_closed_may_drop_another_closed_of_the_same_lifecycle() {
        /// Kept only to be dropped with the waker.
        struct Keeps(#[allow(dead_code)] Mutex<Option<Pin<Box<Closed<'static>>>>>);
        impl std::task::Wake for Keeps {
            fn wake(self: Arc<Self>) {}
        }
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let lifecycle: &'static Lifecycle = Box::leak(Box::new(Lifecycle::new()));
            let mut noop = Context::from_waker(Waker::noop());
            let keeping = |lifecycle: &'static Lifecycle| {
                let mut inner = Box::pin(lifecycle.closed());
                assert!(inner
                    .as_mut()
                    .poll(&mut Context::from_waker(Waker::noop()))
                    .is_pending());
                Waker::from(Arc::new(Keeps(Mutex::new(Some(inner)))))
            };
            // Replaced in `poll`.
            let mut outer = Box::pin(lifecycle.closed());
            let waker = keeping(lifecycle);
            assert!(outer
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending());
            drop(waker);
            assert!(outer.as_mut().poll(&mut noop).is_pending());
            // Given back in `drop`.
            let waker = keeping(lifecycle);
            assert!(outer
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending());
            drop(waker);
            drop(outer);
            let wakers = lifecycle.wakers();
            done.send((wakers.slots.iter().flatten().count(), wakers.free.len()))
                .unwrap();
        });
        let (pending, free) = finished
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("a waker's drop deadlocked on the lifecycle's lock");
        assert_eq!((pending, free), (0, 2));
    }
}
