//! The watchdog and expiry clock of a TTL-based lease, written once for every
//! backend.
//!
//! One task per guard. It fires `lost()` when the local deadline passes
//! (acquire time + TTL − drift, moved on by every successful renewal) and, in
//! watchdog mode, renews the lease every interval. A renewal that finds
//! another owner fires `lost()` at once; one that fails for a transport reason
//! marks the lease suspended and is retried until the deadline, when `lost()`
//! fires. The task stops the moment the guard is released or dropped.

use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::{sleep_until, Instant};

use crate::guard::{LeaseBackend, LeaseSignal, LostReason};
use crate::lease::{clock_drift, LeaseOptions, Renewal};
use crate::name::Name;

/// The guard's handle on its lease task.
pub(crate) struct Keeper {
    deadline: Arc<watch::Sender<Instant>>,
    task: AbortHandle,
}

impl Keeper {
    pub(crate) fn spawn(
        handle: &Handle,
        name: Name,
        signal: LeaseSignal,
        backend: Arc<dyn LeaseBackend>,
        lease: LeaseOptions,
        acquired_at: Instant,
    ) -> Keeper {
        let deadline = Arc::new(watch::Sender::new(local_deadline(acquired_at, lease.ttl())));
        let task = handle
            .spawn(keep(
                name,
                signal,
                backend,
                lease,
                acquired_at,
                Arc::clone(&deadline),
            ))
            .abort_handle();
        Keeper { deadline, task }
    }

    /// Records a successful renewal sent at `started` for `ttl`.
    pub(crate) fn set_deadline(&self, started: Instant, ttl: Duration) {
        self.deadline.send_replace(local_deadline(started, ttl));
    }

    pub(crate) fn stop(&self) {
        self.task.abort();
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// When the holder must consider a lease gone: the server's expiry as seen
/// from the client, less a drift margin.
fn local_deadline(started: Instant, ttl: Duration) -> Instant {
    let valid = ttl.saturating_sub(clock_drift(ttl));
    started.checked_add(valid).unwrap_or(started)
}

async fn keep(
    name: Name,
    signal: LeaseSignal,
    backend: Arc<dyn LeaseBackend>,
    lease: LeaseOptions,
    acquired_at: Instant,
    deadline_tx: Arc<watch::Sender<Instant>>,
) {
    let mut deadline_rx = deadline_tx.subscribe();
    let interval = match lease.renewal() {
        Renewal::Watchdog { interval } => Some(interval),
        Renewal::Manual => None,
    };
    // After a failed renewal, retry sooner than a full interval.
    let retry = interval.map(|i| (i / 4).max(Duration::from_millis(1)));
    let mut next_renew = interval.and_then(|i| acquired_at.checked_add(i));
    loop {
        let deadline = *deadline_rx.borrow_and_update();
        let renew_at = next_renew.unwrap_or(deadline);
        tokio::select! {
            biased;
            () = signal.ended() => return,
            changed = deadline_rx.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = sleep_until(deadline) => {
                signal.lose(LostReason::Expired);
                return;
            }
            () = sleep_until(renew_at), if next_renew.is_some() => {
                let started = Instant::now();
                let outcome = tokio::select! {
                    r = backend.renew(lease.ttl()) => Some(r),
                    () = sleep_until(deadline) => None,
                };
                match outcome {
                    None => {
                        signal.lose(LostReason::Expired);
                        return;
                    }
                    Some(Ok(())) => {
                        next_renew = interval.and_then(|i| started.checked_add(i));
                        tracing::trace!(%name, "distlock lease renewed");
                        signal.suspend(false);
                        // Published through the channel `extend` uses too, so
                        // the two cannot disagree.
                        deadline_tx.send_replace(local_deadline(started, lease.ttl()));
                    }
                    Some(Err(e)) if e.is_not_held() => {
                        signal.lose(LostReason::Taken);
                        return;
                    }
                    Some(Err(e)) => {
                        tracing::warn!(%name, error = %e, "distlock lease renewal failed; retrying");
                        signal.suspend(true);
                        next_renew = retry.and_then(|r| Instant::now().checked_add(r));
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

    use crate::error::{Error, Result};
    use crate::guard::{GuardParts, LeaseBackend, LeaseSignal, LeaseStatus, LockGuard, LostReason};
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
    }

    impl Scripted {
        fn new(answers: &[Answer]) -> Arc<Self> {
            Arc::new(Scripted {
                answers: Mutex::new(answers.iter().rev().copied().collect()),
                renewals: AtomicUsize::new(0),
                releases: AtomicU32::new(0),
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
            self.releases.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    fn guard(backend: &Arc<Scripted>, lease: LeaseOptions) -> LockGuard {
        let parts = GuardParts {
            name: Name::new("x").unwrap(),
            fencing_token: 7,
            signal: LeaseSignal::new(),
            lease: Some(lease),
            acquired_at: Instant::now(),
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

    #[test]
    fn guard_outside_a_runtime_is_an_error_not_a_panic() {
        let backend = Scripted::new(&[]);
        let parts = GuardParts {
            name: Name::new("x").unwrap(),
            fencing_token: 1,
            signal: LeaseSignal::new(),
            lease: None,
            acquired_at: Instant::now(),
        };
        let r = LockGuard::new(parts, backend as Arc<dyn LeaseBackend>);
        assert!(matches!(r, Err(Error::NoRuntime)));
    }
}
