//! The status cell of one lease, with the local deadline it carries: the
//! guard, its watchdog and the backend's watchers all read and write it.

use std::sync::{Arc, OnceLock};

use tokio::sync::watch;
use tokio::time::{sleep_until, Instant};

use super::status::{LeaseStatus, LostReason};

/// What a guard runs when its lease is first asked to release, or found
/// lost (its metrics count it).
pub(crate) struct Hook(pub(crate) Box<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hook")
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct State {
    status: LeaseStatus,
    /// When the holder must treat the lease as gone unless it is renewed:
    /// the server's earliest possible expiry less the drift margin.
    deadline: Option<Instant>,
    /// The end of the longest hold allowed (`LeaseOptions::max_hold`).
    hold_end: Option<Instant>,
    /// Someone asked the holder to let go (`Provider::request_release`).
    /// Never cleared while the lease lasts; it ends no lease by itself.
    release_requested: bool,
}

/// The shared status cell of one lease.
///
/// Reading it is honest on its own: [`LeaseSignal::status`] compares the
/// clock with the lease's deadline itself, so a starved runtime (a watchdog
/// that cannot run) cannot make a lapsed lease look held. A lease ends once:
/// lost or released, never held again.
#[derive(Clone, Debug)]
pub struct LeaseSignal {
    tx: Arc<watch::Sender<State>>,
    /// What the guard does, once it owns this lease, when a request to
    /// release is first heard (its metrics count it) and when the lease is
    /// found lost (its metrics stop counting it as suspended or asked).
    /// One allocation for both.
    hooks: Arc<Hooks>,
}

/// The guard's hooks on its lease's signal, each set once.
#[derive(Debug, Default)]
struct Hooks {
    on_request: OnceLock<Hook>,
    on_lost: OnceLock<Hook>,
}

impl Default for LeaseSignal {
    fn default() -> Self {
        Self::new()
    }
}

impl LeaseSignal {
    /// A new signal in the [`LeaseStatus::Held`] state, with no deadline.
    #[must_use]
    pub fn new() -> Self {
        LeaseSignal {
            tx: Arc::new(watch::Sender::new(State {
                status: LeaseStatus::Held,
                deadline: None,
                hold_end: None,
                release_requested: false,
            })),
            hooks: Arc::default(),
        }
    }

    /// Marks that someone asked the holder to release (a backend calls it
    /// when it hears [`Provider::request_release`](crate::Provider::request_release)'s
    /// mark on the hold). Wakes `release_requested()` and `changed()`
    /// waiters; the lease stays held. Returns whether this call made the
    /// change (`false` for a lease that ended or was asked already).
    pub fn request_release(&self) -> bool {
        let changed = self.tx.send_if_modified(|s| {
            if !s.status.is_active() || s.release_requested {
                return false;
            }
            s.release_requested = true;
            true
        });
        if changed {
            if let Some(hook) = self.hooks.on_request.get() {
                (hook.0)();
            }
            tracing::info!("distlock holder asked to release");
        }
        changed
    }

    /// Whether someone asked the holder to release (see
    /// [`LeaseSignal::request_release`]).
    #[must_use]
    pub fn is_release_requested(&self) -> bool {
        self.tx.borrow().release_requested
    }

    /// Resolves `true` once a release is requested, `false` if the lease
    /// ends (lost or released) without one.
    pub(crate) async fn requested(&self, rx: &mut watch::Receiver<State>) -> bool {
        loop {
            if rx.borrow().release_requested {
                return true;
            }
            if !self.next_change(rx).await {
                return rx.borrow().release_requested;
            }
        }
    }

    /// Sets what runs when a request to release is first heard (once).
    pub(crate) fn on_request(&self, hook: Hook) {
        let _ = self.hooks.on_request.set(hook);
    }

    /// Sets what runs when the lease is found lost (once).
    pub(crate) fn on_lost(&self, hook: Hook) {
        let _ = self.hooks.on_lost.set(hook);
    }

    /// Runs the lost hook, if set.
    fn run_lost_hook(&self) {
        if let Some(hook) = self.hooks.on_lost.get() {
            (hook.0)();
        }
    }

    /// The current status; a lease whose deadline has passed is marked
    /// [`LostReason::Expired`] by this call.
    #[must_use]
    pub fn status(&self) -> LeaseStatus {
        self.expire_if_due();
        self.tx.borrow().status
    }

    /// Marks the lease [`LostReason::Expired`] if its deadline, as it stands
    /// at this moment (a renewal may just have moved it), has passed, or
    /// [`LostReason::MaxHold`] if its hold limit passed first.
    /// Returns whether this call made the change.
    fn expire_if_due(&self) -> bool {
        let now = Instant::now();
        let mut reason = LostReason::Expired;
        let expired = self.tx.send_if_modified(|s| {
            if !s.status.is_active() {
                return false;
            }
            let lapsed = s.deadline.filter(|d| now >= *d);
            let ended = s.hold_end.filter(|h| now >= *h);
            let next = match (lapsed, ended) {
                // The earlier of the two says why.
                (Some(d), Some(h)) if h <= d => LostReason::MaxHold,
                (Some(_), _) => LostReason::Expired,
                (None, Some(_)) => LostReason::MaxHold,
                (None, None) => return false,
            };
            reason = next;
            s.status = LeaseStatus::Lost(next);
            true
        });
        if expired {
            tracing::warn!(%reason, "distlock lease lost");
            self.run_lost_hook();
        }
        expired
    }

    /// The local deadline, if the lease has one.
    #[must_use]
    pub fn deadline(&self) -> Option<Instant> {
        self.tx.borrow().deadline
    }

    /// The instant until which the lease is known held: the earlier of the
    /// local deadline and the hold limit, `None` without either. Once the
    /// lease ended, what it was then (a lost lease's deadline no longer
    /// moves).
    #[must_use]
    pub fn held_until(&self) -> Option<Instant> {
        let s = self.tx.borrow();
        match (s.deadline, s.hold_end) {
            (Some(d), Some(h)) => Some(d.min(h)),
            (d, h) => d.or(h),
        }
    }

    /// Sets the local deadline (after a confirmed renewal, or a new bound
    /// from the backend). An ended lease is left as it is.
    pub fn set_deadline(&self, deadline: Option<Instant>) {
        self.tx.send_if_modified(|s| {
            if !s.status.is_active() || s.deadline == deadline {
                return false;
            }
            s.deadline = deadline;
            true
        });
    }

    /// Ends the lease at `at` whatever its renewals (`LeaseOptions::max_hold`):
    /// from then on it reads as lost with [`LostReason::MaxHold`], unless it
    /// was lost or released before. Only ever moves the limit earlier.
    pub fn set_hold_limit(&self, at: Instant) {
        self.tx.send_if_modified(|s| {
            if !s.status.is_active() || s.hold_end.is_some_and(|h| h <= at) {
                return false;
            }
            s.hold_end = Some(at);
            true
        });
    }

    /// Moves the deadline earlier to `bound`, never later (a renewal of
    /// unknown outcome may have shortened the lease on the server).
    pub fn cap_deadline(&self, bound: Instant) {
        self.tx.send_if_modified(|s| {
            if !s.status.is_active() || s.deadline.is_some_and(|d| d <= bound) {
                return false;
            }
            s.deadline = Some(bound);
            true
        });
    }

    /// Marks the lease lost, unless it already ended. Returns whether this
    /// call made the change.
    pub fn lose(&self, reason: LostReason) -> bool {
        let changed = self.transition(|s| s.is_active().then_some(LeaseStatus::Lost(reason)));
        if changed {
            tracing::warn!(%reason, "distlock lease lost");
            self.run_lost_hook();
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

    /// Resolves once the lease is lost (its deadline passing included) or
    /// released.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: it only observes.
    pub async fn ended(&self) {
        let mut rx = self.tx.subscribe();
        while self.next_change(&mut rx).await {}
    }

    /// Waits for the next change of status (a deadline passing counts);
    /// `false` once the lease has ended.
    pub(crate) async fn next_change(&self, rx: &mut watch::Receiver<State>) -> bool {
        let deadline = {
            let state = rx.borrow_and_update();
            if !state.status.is_active() {
                return false;
            }
            match (state.deadline, state.hold_end) {
                (Some(d), Some(h)) => Some(d.min(h)),
                (d, h) => d.or(h),
            }
        };
        if deadline.is_some_and(|d| Instant::now() >= d) && self.expire_if_due() {
            rx.mark_unchanged();
            return true;
        }
        tokio::select! {
            // The sender lives in `self`: `changed` cannot fail.
            _ = rx.changed() => {}
            () = sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                // Only if the deadline has not moved meanwhile; else the
                // caller looks again and sleeps until the new one.
                if self.expire_if_due() {
                    rx.mark_unchanged();
                }
            }
        }
        true
    }

    /// The status as last recorded, without marking a passed deadline.
    pub(crate) fn peek(&self) -> LeaseStatus {
        self.tx.borrow().status
    }

    pub(crate) fn mark_released(&self) {
        self.transition(|s| s.is_active().then_some(LeaseStatus::Released));
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<State> {
        self.tx.subscribe()
    }

    fn transition(&self, f: impl FnOnce(LeaseStatus) -> Option<LeaseStatus>) -> bool {
        self.tx.send_if_modified(|s| match f(s.status) {
            Some(next) => {
                s.status = next;
                true
            }
            None => false,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_passed_deadline_reads_as_lost_without_any_task() {
        let s = LeaseSignal::new();
        s.set_deadline(Some(Instant::now() + Duration::from_millis(300)));
        assert_eq!(s.status(), LeaseStatus::Held);
        tokio::time::advance(Duration::from_millis(300)).await;
        assert_eq!(s.status(), LeaseStatus::Lost(LostReason::Expired));
        // Ended for good: a late renewal cannot bring it back.
        s.set_deadline(Some(Instant::now() + Duration::from_secs(10)));
        assert_eq!(s.status(), LeaseStatus::Lost(LostReason::Expired));
    }

    #[tokio::test(start_paused = true)]
    async fn the_earlier_of_deadline_and_hold_limit_says_why() {
        let s = LeaseSignal::new();
        let start = Instant::now();
        s.set_deadline(Some(start + Duration::from_secs(5)));
        s.set_hold_limit(start + Duration::from_secs(2));
        s.set_hold_limit(start + Duration::from_secs(3));
        let ended = tokio::spawn({
            let s = s.clone();
            async move { s.ended().await }
        });
        tokio::time::advance(Duration::from_millis(1999)).await;
        assert_eq!(s.status(), LeaseStatus::Held);
        tokio::time::advance(Duration::from_millis(1)).await;
        ended.await.unwrap();
        assert_eq!(s.status(), LeaseStatus::Lost(LostReason::MaxHold));
        let t = LeaseSignal::new();
        t.set_deadline(Some(start + Duration::from_secs(1)));
        t.set_hold_limit(start + Duration::from_secs(4));
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(t.status(), LeaseStatus::Lost(LostReason::Expired));
    }

    #[tokio::test(start_paused = true)]
    async fn held_until_is_the_earlier_of_deadline_and_hold_limit() {
        let s = LeaseSignal::new();
        assert_eq!(s.held_until(), None);
        let start = Instant::now();
        s.set_deadline(Some(start + Duration::from_secs(5)));
        assert_eq!(s.held_until(), Some(start + Duration::from_secs(5)));
        s.set_hold_limit(start + Duration::from_secs(3));
        assert_eq!(s.held_until(), Some(start + Duration::from_secs(3)));
        s.set_deadline(Some(start + Duration::from_secs(2)));
        assert_eq!(s.held_until(), Some(start + Duration::from_secs(2)));
        // Lost: the last deadline stays, a late renewal does not move it.
        s.lose(LostReason::Taken);
        s.set_deadline(Some(start + Duration::from_secs(9)));
        assert_eq!(s.held_until(), Some(start + Duration::from_secs(2)));
    }

    #[tokio::test(start_paused = true)]
    async fn ended_wakes_at_the_deadline_and_cap_only_shortens() {
        let s = LeaseSignal::new();
        let start = Instant::now();
        s.set_deadline(Some(start + Duration::from_secs(5)));
        s.cap_deadline(start + Duration::from_secs(9));
        assert_eq!(s.deadline(), Some(start + Duration::from_secs(5)));
        s.cap_deadline(start + Duration::from_secs(2));
        s.ended().await;
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        assert_eq!(s.status(), LeaseStatus::Lost(LostReason::Expired));
    }
}
