//! The watchdog of a lease, written once for every backend.
//!
//! One task per guard. Every renewal of the lease, the watchdog's own and
//! `extend()`'s, goes through one [`Renewer`], which serialises them and
//! keeps the lease's local deadline honest:
//!
//! * a confirmed renewal for `ttl` sent at `t` sets the deadline to
//!   `t + ttl − drift` and schedules the next renewal no later than half of
//!   that, so a shorter `extend()` in watchdog mode reschedules the watchdog;
//! * a renewal of unknown outcome (failed, timed out, cancelled) may have
//!   shortened the lease on the server, so it can only move the deadline
//!   earlier (`min(deadline, t + ttl − drift)`), never later;
//! * a renewal that finds another owner fires `lost()` at once; one that
//!   fails for a transport reason marks the lease suspended and is retried
//!   until the deadline, when `lost()` fires.
//!
//! The deadline itself lives in the lease's [`LeaseSignal`], honest without
//! this task (see there). The task stops the moment the guard is released or
//! dropped.

use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::{sleep_until, Instant};

use crate::error::{Error, Result};
use crate::lease::signal::LeaseSignal;
use crate::lease::status::{LeaseStatus, LostReason};
use crate::lease::terms::LeaseBackend;
use crate::lease::{local_deadline, max_interval};
use crate::name::Name;

/// Runs every renewal of one lease, one at a time.
pub(crate) struct Renewer {
    name: Name,
    signal: LeaseSignal,
    backend: Arc<dyn LeaseBackend>,
    /// The watchdog's TTL and interval; `None` in manual mode.
    watchdog: Option<(Duration, Duration)>,
    turn: tokio::sync::Mutex<()>,
    next_renewal: watch::Sender<Option<Instant>>,
    /// The guard's metric labels, once set.
    metrics: crate::metrics::Cell,
}

/// Caps the deadline unless the renewal's outcome became known.
struct UnknownOutcome<'a> {
    signal: &'a LeaseSignal,
    bound: Option<Instant>,
}

impl Drop for UnknownOutcome<'_> {
    fn drop(&mut self) {
        if let Some(bound) = self.bound {
            self.signal.cap_deadline(bound);
        }
    }
}

impl Renewer {
    /// Renews the lease for `ttl`, after any renewal in flight.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] when the lease has ended (and `lost()` fires if a
    /// renewal found another owner); the backend's errors otherwise.
    ///
    /// # Cancellation safety
    ///
    /// A renewal of unknown outcome, as the module docs say: the deadline
    /// only moves earlier.
    pub(crate) async fn renew(&self, ttl: Duration) -> Result<()> {
        let _turn = self.turn.lock().await;
        if !self.signal.status().is_active() {
            return Err(Error::not_held(self.name.as_str()));
        }
        let sent = Instant::now();
        let mut outcome = UnknownOutcome {
            signal: &self.signal,
            bound: Some(local_deadline(sent, ttl)),
        };
        let result = self.backend.renew(ttl).await;
        match &result {
            Ok(()) => {
                outcome.bound = None;
                if !self.signal.status().is_active() {
                    // Confirmed too late: the lease had already been given
                    // up for lost, and a lost lease stays lost.
                    return Err(Error::not_held(self.name.as_str()));
                }
                self.signal.set_deadline(Some(local_deadline(sent, ttl)));
                self.metrics.suspended(false);
                self.signal.suspend(false);
                if let Some(labels) = self.metrics.get() {
                    crate::metrics::renewal(labels, true);
                }
                if let Some((_, interval)) = self.watchdog {
                    let next = interval.min(max_interval(ttl));
                    self.next_renewal.send_replace(sent.checked_add(next));
                }
                tracing::trace!(name = %self.name, ttl_ms = ttl.as_millis(), "distlock lease renewed");
            }
            Err(e) if e.is_not_held() => {
                outcome.bound = None;
                self.metrics.suspended(false);
                self.signal.lose(LostReason::Taken);
            }
            Err(_) => {
                if let Some(labels) = self.metrics.get() {
                    crate::metrics::renewal(labels, false);
                }
            }
        }
        result
    }
}

/// The guard's handle on its lease's watchdog task.
pub(crate) struct Watchdog {
    renewer: Arc<Renewer>,
    /// No task in manual mode: the deadline in the signal ends the lease.
    task: Option<AbortHandle>,
}

impl Watchdog {
    /// Starts the task for a lease acquired at `acquired_at` for `ttl`.
    /// `interval`: renew every `interval` (watchdog mode), or never
    /// (`None`, manual mode: the deadline alone ends the lease).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn spawn(
        handle: &Handle,
        name: Name,
        signal: LeaseSignal,
        backend: Arc<dyn LeaseBackend>,
        ttl: Duration,
        interval: Option<Duration>,
        acquired_at: Instant,
        metrics: crate::metrics::Cell,
    ) -> Watchdog {
        signal.set_deadline(Some(local_deadline(acquired_at, ttl)));
        let first = interval.and_then(|i| acquired_at.checked_add(i));
        let renewer = Arc::new(Renewer {
            name,
            signal,
            backend,
            watchdog: interval.map(|i| (ttl, i)),
            turn: tokio::sync::Mutex::new(()),
            next_renewal: watch::Sender::new(first),
            metrics,
        });
        let task = interval.map(|_| handle.spawn(run(Arc::clone(&renewer))).abort_handle());
        Watchdog { renewer, task }
    }

    pub(crate) fn renewer(&self) -> &Renewer {
        &self.renewer
    }

    pub(crate) fn stop(&self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn run(renewer: Arc<Renewer>) {
    let signal = renewer.signal.clone();
    let mut status = signal.subscribe();
    let mut schedule = renewer.next_renewal.subscribe();
    let Some((ttl, interval)) = renewer.watchdog else {
        return;
    };
    // After a failed renewal, retry sooner than a full interval.
    let retry = (interval / 4).max(Duration::from_millis(1));
    loop {
        let next = *schedule.borrow_and_update();
        tokio::select! {
            biased;
            active = signal.next_change(&mut status) => {
                if !active {
                    if signal.status() == LeaseStatus::Lost(LostReason::MaxHold) {
                        // Held as long as allowed: give it back now rather
                        // than at the TTL.
                        if let Err(e) = renewer.backend.release().await {
                            tracing::debug!(name = %renewer.name, error = %e, "distlock release at max_hold failed");
                        }
                    }
                    return;
                }
            }
            changed = schedule.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => {
                // Bounded by the lease's current deadline (which an
                // `extend()` holding the turn may still move), not by the
                // one read now. A renewal still unanswered after `retry`
                // marks the lease suspended while it waits: a server that
                // stopped answering shows as Suspended before the deadline
                // makes it Lost, not only once the response timeout ends
                // the request (which can be after the deadline on a short
                // TTL).
                let renewal = renewer.renew(ttl);
                tokio::pin!(renewal);
                let late = tokio::time::sleep(retry);
                tokio::pin!(late);
                let mut marked_late = false;
                let outcome = loop {
                    tokio::select! {
                        r = &mut renewal => break Some(r),
                        () = signal.ended() => break None,
                        () = &mut late, if !marked_late => {
                            marked_late = true;
                            if signal.status().is_active() {
                                renewer.metrics.suspended(true);
                                signal.suspend(true);
                            }
                        }
                    }
                };
                match outcome {
                    None => return,
                    Some(Ok(())) => {}
                    Some(Err(e)) if e.is_not_held() => return,
                    Some(Err(e)) => {
                        tracing::warn!(name = %renewer.name, error = %e, "distlock lease renewal failed; retrying");
                        renewer.metrics.suspended(true);
                        signal.suspend(true);
                        renewer.next_renewal.send_replace(Instant::now().checked_add(retry));
                    }
                }
            }
        }
    }
}
#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
    use std::sync::Mutex;

    use async_trait::async_trait;

    use crate::backend::{GuardParts, LeaseBackend, LeaseSignal, LeaseTerms, Lifecycle};
    use crate::error::{Error, Result};
    use crate::guard::{LeaseStatus, LockGuard, LostReason};
    use crate::lease::LeaseOptions;
    use crate::name::Name;

    use super::*;

    /// What the scripted backend answers to each renewal.
    #[derive(Clone, Copy)]
    enum Answer {
        Ok,
        NotHeld,
        Fail,
        Hang,
    }

    struct Scripted {
        answers: Mutex<Vec<Answer>>,
        renewals: AtomicUsize,
        releases: AtomicU32,
        hang_release: std::sync::atomic::AtomicBool,
    }

    impl Scripted {
        fn new(answers: &[Answer]) -> Arc<Self> {
            Arc::new(Scripted {
                answers: Mutex::new(answers.iter().rev().copied().collect()),
                renewals: AtomicUsize::new(0),
                releases: AtomicU32::new(0),
                hang_release: std::sync::atomic::AtomicBool::new(false),
            })
        }
    }

    #[async_trait]
    impl LeaseBackend for Scripted {
        async fn renew(&self, _ttl: Duration) -> Result<()> {
            self.renewals.fetch_add(1, Ordering::SeqCst);
            let answer = self.answers.lock().unwrap().pop().unwrap_or(Answer::Ok);
            match answer {
                Answer::Ok => Ok(()),
                Answer::NotHeld => Err(Error::not_held("x")),
                Answer::Fail => Err(Error::connection("test", "refused")),
                Answer::Hang => std::future::pending().await,
            }
        }

        async fn release(&self) -> Result<()> {
            if self.hang_release.load(Ordering::SeqCst) {
                self.releases.fetch_add(1, Ordering::SeqCst);
                return std::future::pending().await;
            }
            // As a server would: the second release finds nothing to delete.
            if self.releases.fetch_add(1, Ordering::SeqCst) == 0 {
                Ok(())
            } else {
                Err(Error::not_held("x"))
            }
        }
    }

    fn guard(backend: &Arc<Scripted>, lease: LeaseOptions) -> LockGuard {
        let parts = GuardParts {
            name: Name::new("x").unwrap(),
            fencing_token: 7,
            signal: LeaseSignal::new(),
            terms: LeaseTerms::Ttl(lease),
            acquired_at: Instant::now(),
            lifecycle: Lifecycle::new(),
        };
        LockGuard::new(parts, Arc::clone(backend) as Arc<dyn LeaseBackend>).unwrap()
    }

    fn ttl(ms: u64) -> LeaseOptions {
        LeaseOptions::new(Duration::from_millis(ms)).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn renews_at_a_third_of_the_ttl_and_stops_at_release() {
        let backend = Scripted::new(&[]);
        let g = guard(&backend, ttl(3000));
        tokio::time::sleep(Duration::from_millis(3500)).await;
        assert_eq!(backend.renewals.load(Ordering::SeqCst), 3);
        assert!(g.is_held());
        g.release().await.unwrap();
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(
            backend.renewals.load(Ordering::SeqCst),
            3,
            "renewed after release"
        );
        assert_eq!(backend.releases.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn renewal_finding_another_owner_fires_lost_at_once() {
        let backend = Scripted::new(&[Answer::NotHeld]);
        let g = guard(&backend, ttl(3000));
        let start = Instant::now();
        assert_eq!(g.lost().await, LostReason::Taken);
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        assert!(!g.is_held());
    }

    #[tokio::test(start_paused = true)]
    async fn failing_renewal_suspends_then_recovers() {
        let backend = Scripted::new(&[Answer::Fail, Answer::Ok]);
        let g = guard(&backend, ttl(3000));
        let mut watch = g.watch();
        assert!(watch.changed().await);
        assert_eq!(watch.status(), LeaseStatus::Suspended);
        assert!(g.is_held());
        assert!(watch.changed().await);
        assert_eq!(watch.status(), LeaseStatus::Held);
    }

    #[tokio::test(start_paused = true)]
    async fn renewals_failing_until_the_deadline_lose_the_lease() {
        let backend = Scripted::new(&[Answer::Fail; 100]);
        let g = guard(&backend, ttl(3000));
        let start = Instant::now();
        assert_eq!(g.lost().await, LostReason::Expired);
        // TTL less the drift margin (30 ms + 2 ms).
        assert_eq!(start.elapsed(), Duration::from_millis(3000 - 32));
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_renewal_cannot_outlive_the_deadline() {
        let backend = Scripted::new(&[Answer::Hang]);
        let g = guard(&backend, ttl(3000));
        let start = Instant::now();
        assert_eq!(g.lost().await, LostReason::Expired);
        assert!(start.elapsed() < Duration::from_secs(3));
    }

    /// A renewal that never answers (a stopped server) shows as Suspended
    /// a quarter interval after it was sent, well before the deadline makes
    /// the lease Lost; before, the status went from Held to Lost directly.
    #[tokio::test(start_paused = true)]
    async fn a_hanging_renewal_suspends_before_the_deadline() {
        let backend = Scripted::new(&[Answer::Hang]);
        let g = guard(&backend, ttl(3000));
        let start = Instant::now();
        let mut watch = g.watch();
        assert!(watch.changed().await);
        assert_eq!(watch.status(), LeaseStatus::Suspended);
        assert_eq!(start.elapsed(), Duration::from_millis(1250));
        assert!(g.is_held());
        assert_eq!(g.lost().await, LostReason::Expired);
    }

    /// A guard whose lease is known lost answers `release()` at once with
    /// `NotHeld`, whatever the server does (here: a release that never
    /// answers); the release itself still runs in the background.
    #[tokio::test(start_paused = true)]
    async fn release_of_a_lost_lease_answers_at_once() {
        let backend = Scripted::new(&[Answer::Hang]);
        backend.hang_release.store(true, Ordering::SeqCst);
        let g = guard(&backend, ttl(3000));
        assert_eq!(g.lost().await, LostReason::Expired);
        let start = Instant::now();
        let r = tokio::time::timeout(Duration::from_secs(60), g.release())
            .await
            .expect("release of a lost lease waited for the server");
        assert!(r.as_ref().is_err_and(Error::is_not_held), "{r:?}");
        assert_eq!(start.elapsed(), Duration::ZERO);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(
            backend.releases.load(Ordering::SeqCst),
            1,
            "no release in the background"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn manual_lease_expires_unless_extended() {
        let backend = Scripted::new(&[]);
        let lease = LeaseOptions::manual(Duration::from_secs(1)).unwrap();
        let g = guard(&backend, lease);
        tokio::time::sleep(Duration::from_millis(500)).await;
        g.extend(Duration::from_secs(2)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(g.is_held(), "extension ignored");
        assert_eq!(
            backend.renewals.load(Ordering::SeqCst),
            1,
            "manual lease renewed by itself"
        );
        assert_eq!(g.lost().await, LostReason::Expired);
    }

    #[tokio::test(start_paused = true)]
    async fn extend_that_finds_another_owner_fires_lost() {
        let backend = Scripted::new(&[Answer::NotHeld]);
        let g = guard(
            &backend,
            LeaseOptions::manual(Duration::from_secs(10)).unwrap(),
        );
        assert!(g
            .extend(Duration::from_secs(10))
            .await
            .unwrap_err()
            .is_not_held());
        assert_eq!(g.status(), LeaseStatus::Lost(LostReason::Taken));
    }

    #[tokio::test]
    async fn drop_releases_in_the_background() {
        let backend = Scripted::new(&[]);
        let g = guard(&backend, ttl(3000));
        let mut watch = g.watch();
        drop(g);
        assert_eq!(watch.lost().await, None);
        for _ in 0..100 {
            if backend.releases.load(Ordering::SeqCst) == 1 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("dropped guard never released");
    }

    /// A backend that models the server's expiry: each renewal lands after
    /// `delay` and sets the expiry to landing time + TTL; with `lose_reply`
    /// the renewal lands but its reply never comes.
    struct Modelled {
        expiry: Mutex<Instant>,
        delay: Duration,
        lose_reply: std::sync::atomic::AtomicBool,
    }

    impl Modelled {
        fn new(ttl: Duration, delay: Duration) -> Arc<Self> {
            Arc::new(Modelled {
                expiry: Mutex::new(Instant::now() + ttl),
                delay,
                lose_reply: std::sync::atomic::AtomicBool::new(false),
            })
        }

        fn expiry(&self) -> Instant {
            *self.expiry.lock().unwrap()
        }
    }

    #[async_trait]
    impl LeaseBackend for Modelled {
        async fn renew(&self, ttl: Duration) -> Result<()> {
            tokio::time::sleep(self.delay).await;
            *self.expiry.lock().unwrap() = Instant::now() + ttl;
            if self.lose_reply.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            Ok(())
        }

        async fn release(&self) -> Result<()> {
            Ok(())
        }
    }

    fn modelled_guard(backend: &Arc<Modelled>, lease: LeaseOptions) -> (LockGuard, LeaseSignal) {
        let signal = LeaseSignal::new();
        let parts = GuardParts {
            name: Name::new("x").unwrap(),
            fencing_token: 1,
            signal: signal.clone(),
            terms: LeaseTerms::Ttl(lease),
            acquired_at: Instant::now(),
            lifecycle: Lifecycle::new(),
        };
        let guard = LockGuard::new(parts, Arc::clone(backend) as Arc<dyn LeaseBackend>).unwrap();
        (guard, signal)
    }

    #[tokio::test(start_paused = true)]
    async fn a_shorter_extend_under_a_watchdog_reschedules_it() {
        let backend = Modelled::new(Duration::from_secs(30), Duration::from_millis(1));
        let (g, signal) = modelled_guard(&backend, ttl(30_000));
        g.extend(Duration::from_secs(2)).await.unwrap();
        // The old schedule would renew at 10 s: the lease would be gone at 2 s.
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(g.is_held(), "lease lost after a shorter extend");
            assert!(
                Instant::now() < backend.expiry(),
                "server expired the lease"
            );
            assert!(signal.deadline().unwrap() <= backend.expiry());
        }
        g.release().await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_extends_and_renewals_never_outrun_the_server() {
        let backend = Modelled::new(Duration::from_millis(3000), Duration::from_millis(7));
        let (g, signal) = modelled_guard(&backend, ttl(3000));
        let g = Arc::new(g);
        let mut rng = fastrand_seed();
        for _ in 0..200 {
            let extend_to = Duration::from_millis(500 + rng() % 5000);
            let g2 = Arc::clone(&g);
            let extension = tokio::spawn(async move { g2.extend(extend_to).await });
            tokio::time::sleep(Duration::from_millis(rng() % 400)).await;
            let deadline = signal.deadline().unwrap();
            assert!(
                deadline <= backend.expiry(),
                "local deadline past the server's expiry"
            );
            assert!(g.is_held());
            extension.await.unwrap().unwrap();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_extend_can_only_shorten_the_local_deadline() {
        let lease = LeaseOptions::manual(Duration::from_secs(30)).unwrap();
        let backend = Modelled::new(Duration::from_secs(30), Duration::from_millis(5));
        let (g, signal) = modelled_guard(&backend, lease);
        backend.lose_reply.store(true, Ordering::SeqCst);
        let cut =
            tokio::time::timeout(Duration::from_millis(50), g.extend(Duration::from_secs(1))).await;
        assert!(cut.is_err());
        // The extension landed: the server now expires the lease in ~1 s.
        assert!(signal.deadline().unwrap() <= backend.expiry());
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!g.is_held(), "held past the server's expiry");
    }

    #[test]
    fn a_starved_runtime_cannot_make_a_lapsed_lease_look_held() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let backend = Scripted::new(&[]);
            let g = guard(&backend, ttl(300));
            let lost = g.lost();
            // Blocks the only thread: the watchdog cannot run.
            std::thread::sleep(Duration::from_millis(700));
            assert!(!g.is_held(), "is_held() trusted a starved watchdog");
            assert_eq!(g.status(), LeaseStatus::Lost(LostReason::Expired));
            assert_eq!(lost.await, LostReason::Expired);
        });
    }

    #[tokio::test]
    async fn session_leases_cannot_be_extended_and_have_no_ttl() {
        let backend = Scripted::new(&[]);
        let parts = GuardParts {
            name: Name::new("x").unwrap(),
            fencing_token: 1,
            signal: LeaseSignal::new(),
            terms: LeaseTerms::Session {
                timeout: Duration::from_secs(6),
            },
            acquired_at: Instant::now(),
            lifecycle: Lifecycle::new(),
        };
        let g = LockGuard::new(parts, Arc::clone(&backend) as Arc<dyn LeaseBackend>).unwrap();
        assert_eq!(g.ttl(), None);
        assert!(matches!(
            g.extend(Duration::from_secs(1)).await,
            Err(Error::InvalidOptions(_))
        ));
        g.release().await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn closing_the_provider_fires_lost_then_releases() {
        let backend = Scripted::new(&[]);
        let lifecycle = Lifecycle::new();
        let parts = GuardParts {
            name: Name::new("x").unwrap(),
            fencing_token: 1,
            signal: LeaseSignal::new(),
            terms: LeaseTerms::Ttl(ttl(3000)),
            acquired_at: Instant::now(),
            lifecycle: Arc::clone(&lifecycle),
        };
        let g = LockGuard::new(parts, Arc::clone(&backend) as Arc<dyn LeaseBackend>).unwrap();
        assert_eq!(lifecycle.held_count(), 1);
        lifecycle.close().await.unwrap();
        assert_eq!(g.lost().await, LostReason::ProviderClosed);
        assert_eq!(backend.releases.load(Ordering::SeqCst), 1);
        assert!(matches!(g.release().await, Err(Error::Closed)));
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(backend.releases.load(Ordering::SeqCst) <= 2);
        assert_eq!(lifecycle.held_count(), 0);
    }

    fn fastrand_seed() -> impl FnMut() -> u64 {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    #[test]
    fn guard_outside_a_runtime_is_an_error_not_a_panic() {
        let backend = Scripted::new(&[]);
        let parts = GuardParts {
            name: Name::new("x").unwrap(),
            fencing_token: 1,
            signal: LeaseSignal::new(),
            terms: LeaseTerms::Ttl(LeaseOptions::default()),
            acquired_at: Instant::now(),
            lifecycle: Lifecycle::new(),
        };
        let r = LockGuard::new(parts, backend as Arc<dyn LeaseBackend>);
        assert!(matches!(r, Err(Error::NoRuntime)));
    }
}
