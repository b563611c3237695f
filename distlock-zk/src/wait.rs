//! How long an acquisition waits: the time each request may take before
//! and after the deadline ([`within`], [`slack`]), the pauses before a
//! retry or a second create, the future that waits for a watch, and the
//! bounded run of a withdraw.

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::Duration;

use distlock_core::backend::{with_timeout, CleanupGuard};
use distlock_core::{Error, Result, Wait};
use tokio::time::Instant;
use zookeeper_client::{OneshotWatcher, WatchedEvent};

use crate::context::Context;

/// How long a request of an acquisition that waits until `deadline` may
/// take: the operation timeout, but not past the deadline, so that the
/// deadline's only slack is the create's and the cleanup's ([`slack`]).
/// A try (`deadline` now) and a wait without a deadline get the operation
/// timeout.
pub(crate) fn within(timeout: Duration, wait: Wait) -> Duration {
    match wait {
        Wait::Until(d) => timeout
            .min(d.saturating_duration_since(Instant::now()))
            .max(Duration::from_millis(1)),
        Wait::No | Wait::Forever => timeout,
    }
}

/// How long a request that may end past the deadline may take: a create
/// (every acquisition makes one whole attempt) and a withdraw or other
/// cleanup after giving up. The operation timeout, but not past the
/// deadline plus one operation timeout, so that `lock_timeout(d)` returns
/// within `d` and one operation timeout whatever came before: a create
/// sent before the deadline gets the whole operation timeout, one sent
/// after it (a second create: a semaphore's lease, a session's end) only
/// what is left, and a withdraw only what the create left (a cleanup cut
/// short finishes in the background, for as long as the session lives).
/// A try and a wait without a deadline get the operation timeout.
pub(crate) fn slack(timeout: Duration, wait: Wait) -> Duration {
    match wait {
        Wait::Until(d) => (d + timeout)
            .saturating_duration_since(Instant::now())
            .min(timeout)
            .max(Duration::from_millis(1)),
        Wait::No | Wait::Forever => timeout,
    }
}

pub(crate) fn passed(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}

/// Waits a moment before a retry; `false` when that would pass the deadline.
pub(crate) async fn pause_before_retry(deadline: Option<Instant>) -> bool {
    let until = Instant::now() + Duration::from_millis(50);
    if deadline.is_some_and(|d| d <= until) {
        return false;
    }
    tokio::time::sleep_until(until).await;
    true
}

/// How many creates a try ([`Wait::No`]) sends in all when lookups keep
/// finding that the last one did not happen; then it fails with the last
/// create's (retryable) error.
pub(crate) const TRY_CREATES: u32 = 3;

/// The creates of one acquisition sent again after a lookup found that a
/// create of unknown outcome did not happen: each waits first, 50 ms
/// doubling to 1 s, so that no error can make an acquisition spin; a wait
/// stops at its deadline, a try after [`TRY_CREATES`] creates.
pub(crate) struct Recreate {
    creates: u32,
    pause: Duration,
}

impl Recreate {
    pub(crate) fn new() -> Self {
        Recreate {
            creates: 1,
            pause: Duration::from_millis(50),
        }
    }

    /// Waits before the next create; `false` when there is none to send
    /// (the deadline would pass first, or a try has sent its creates).
    pub(crate) async fn pause(&mut self, wait: Wait) -> bool {
        let until = Instant::now() + self.pause;
        let go = match wait {
            Wait::No => self.creates < TRY_CREATES,
            Wait::Until(d) => until < d,
            Wait::Forever => true,
        };
        if !go {
            return false;
        }
        tokio::time::sleep_until(until).await;
        self.creates += 1;
        self.pause = (self.pause * 2).min(Duration::from_secs(1));
        true
    }
}

/// Waits for a watch to fire; `false` when the deadline came first. The
/// caller counts a fired watch with [`watch_noticed`].
///
/// # Errors
///
/// [`Error::Closed`] when the provider is closed meanwhile.
///
/// Not an `async fn`: a small future of its own (the watcher's, the close
/// signal, and a deadline timer only with a deadline, boxed), since every
/// waiting acquisition keeps one for as long as it waits.
pub(crate) fn watch_fired(
    ctx: &Context,
    watcher: OneshotWatcher,
    deadline: Option<Instant>,
) -> WatchFired<'_, impl std::future::Future<Output = WatchedEvent> + Send> {
    WatchFired {
        changed: watcher.changed(),
        closed: ctx.lifecycle.closed(),
        timer: deadline.map(|d| Box::pin(tokio::time::sleep_until(d))),
    }
}

/// A oneshot watch's event, or `None` when the client dropped the watch
/// unfired: its connection task ended (the session closed, or its last
/// handle went) while a task of ours that holds no handle (a guard's node
/// watch, an election observer) still waited. zookeeper-client 0.11
/// panics inside `OneshotWatcher::changed` then (it unwraps the cancelled
/// channel); the panic is caught here, so it ends no task of ours.
pub(crate) async fn event_of(watcher: OneshotWatcher) -> Option<WatchedEvent> {
    use futures::FutureExt;
    std::panic::AssertUnwindSafe(watcher.changed())
        .catch_unwind()
        .await
        .ok()
}

/// Counts a watch that fired for a waiter (stats, and the core's wake-up
/// count).
pub(crate) fn watch_noticed(ctx: &Context) {
    ctx.stats.watch_events.fetch_add(1, Ordering::Relaxed);
    distlock_core::backend::woke();
}

pin_project_lite::pin_project! {
    /// The future of [`watch_fired`].
    pub(crate) struct WatchFired<'a, F> {
        #[pin]
        changed: F,
        closed: distlock_core::backend::Closed<'a>,
        timer: Option<Pin<Box<tokio::time::Sleep>>>,
    }
}

impl<F: std::future::Future<Output = WatchedEvent>> std::future::Future for WatchFired<'_, F> {
    type Output = Result<bool>;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Result<bool>> {
        let this = self.project();
        // Closed first: a closed provider's waiter ends with `Closed`
        // whatever else happened meanwhile.
        if Pin::new(this.closed).poll(cx).is_ready() {
            return Poll::Ready(Err(Error::Closed));
        }
        if this.changed.poll(cx).is_ready() {
            return Poll::Ready(Ok(true));
        }
        if let Some(timer) = this.timer {
            if timer.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Ok(false));
            }
        }
        Poll::Pending
    }
}

/// Runs an armed cleanup now, for at most the operation timeout; if it does
/// not finish, the guard's drop finishes it in the background.
pub(crate) async fn withdraw_now(mut withdrawal: CleanupGuard, timeout: Duration) {
    let _ = with_timeout("withdraw", timeout, withdrawal.run_now()).await;
}
