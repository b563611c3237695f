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
