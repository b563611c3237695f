//! One acquisition attempt, the skeleton every family of the plain provider
//! runs (the mutex, the fair queue under the fair mutex and the election,
//! the queued recipes under the read-write lock and the semaphore): a
//! pinned connection, a fresh lease, its undo armed before the script is
//! sent, the script bounded by one response timeout, and what each answer
//! means (taken, refused, already ours, too few replicas, unknown). A
//! family supplies only its script and its decoding, and the few steps of
//! its own around them ([`Family`]); its waiting loop stays its own.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use distlock_core::backend::{with_timeout, CleanupGuard, LeaseBackend};
use distlock_core::{Error, LeaseOptions, LockGuard, Name, Result};
use tokio::time::Instant;

use crate::context::Context;
use crate::lease::{guard_parts, pause_before_retry, Attempt, LeaseKeys, RedisLease, Undo};
use crate::net::Pinned;

/// What a family adds to the skeleton: its script and its decoding, and
/// what it keeps beside the hold (a queued waiter's place).
pub(crate) trait Family: Send {
    /// What a refused attempt tells the waiter (how long to wait, who
    /// holds).
    type Waiting: Send;

    /// Arms, once the attempt's lease exists and before its script is sent,
    /// what the attempt may leave beside a hold (a place in a queue), so
    /// that it is taken back whatever becomes of the attempt.
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] when the provider closed (no cleanup can be armed).
    fn arm(&mut self, _pinned: &Pinned, _lease: &Arc<RedisLease>, _started: Instant) -> Result<()> {
        Ok(())
    }

    /// Sends the family's acquire script with the attempt's `token` on
    /// `pinned` and decodes its answer.
    fn script<'a>(
        &'a mut self,
        pinned: &'a Pinned,
        token: &'a str,
    ) -> impl Future<Output = Result<Attempt<Self::Waiting>>> + Send + 'a;

    /// What became of the script (an answer, a failure, the response
    /// timeout), before the skeleton acts on it.
    fn answered(&mut self, _outcome: &Result<Attempt<Self::Waiting>>) {}

    /// The attempt took the lock with fencing token `token` (its guard is
    /// made next): disarm what [`Family::arm`] armed that the script took
    /// back itself.
    fn acquired(&mut self, token: u64);

    /// The attempt took the lock but too few replicas acknowledged it (the
    /// hold is given back next).
    fn not_replicated(&mut self) {}

    /// The attempt's outcome is unknown and the caller waits on (its hold,
    /// if it landed, is undone in the background).
    fn unknown(&mut self) {}
}

/// How one attempt ended.
pub(crate) enum Outcome<W> {
    /// The lock is ours.
    Acquired(LockGuard),
    /// Try again at once (after any pause the attempt took already).
    Again,
    /// Refused: what the family decoded.
    Waiting(W),
}

/// What stays the same over the attempts of one acquisition.
pub(crate) struct Acquisition<'a> {
    pub(crate) shared: &'a Arc<Context>,
    pub(crate) name: &'a Name,
    pub(crate) lease: LeaseOptions,
    /// Whether the caller waits: a retryable failure is ridden out (after
    /// a pause) rather than returned.
    pub(crate) waits: bool,
    pub(crate) deadline: Option<Instant>,
}

impl Acquisition<'_> {
    /// One attempt: a connection pinned for it, a lease with a fresh token
    /// on `keys`, the undo of an attempt whose outcome is unknown, the
    /// family's script within one response timeout (even while the client
    /// reconnects, which may take its connect timeout: a deadline is passed
    /// by one response timeout at most), and the guard when it took the
    /// lock. `pause` is the back-off between retries of a waiting caller.
    ///
    /// # Errors
    ///
    /// What the attempt failed with and the caller does not ride out.
    pub(crate) async fn attempt<F: Family>(
        &self,
        keys: LeaseKeys,
        family: &mut F,
        pause: &mut Duration,
    ) -> Result<Outcome<F::Waiting>> {
        let shared = self.shared;
        let timeout = shared.options.response_timeout;
        let started = Instant::now();
        let pinned = match shared.conn()?.pin(timeout).await {
            Ok(pinned) => pinned,
            Err(e) if e.is_retryable() && self.waits => {
                if pause_before_retry(self.deadline, pause).await {
                    return Ok(Outcome::Again);
                }
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        // A fresh token per attempt: an undo still running for an earlier
        // attempt can never release a later one's hold.
        let lease = RedisLease::new(shared, keys, self.name, &pinned, self.lease.ttl());
        let mut undo = CleanupGuard::arm(
            "undo acquire",
            Arc::new(Undo {
                lease: Arc::clone(&lease),
                place: None,
                expires: started + self.lease.ttl() + timeout,
            }),
        )?;
        family.arm(&pinned, &lease, started)?;
        let outcome = with_timeout("acquire", timeout, family.script(&pinned, &lease.token))
            .await
            .and_then(|r| r);
        family.answered(&outcome);
        match outcome {
            Ok(Attempt::Acquired(token)) => {
                undo.disarm();
                family.acquired(token);
                let mut parts =
                    guard_parts(self.name, token, self.lease, started, &shared.lifecycle);
                // The lease's renewals hear a request to release there.
                parts.signal = lease.signal.clone();
                // On error (closed meanwhile) the guard released itself.
                LockGuard::new(parts, lease as Arc<dyn LeaseBackend>).map(Outcome::Acquired)
            }
            Ok(Attempt::Waiting(waiting)) => {
                undo.disarm();
                Ok(Outcome::Waiting(waiting))
            }
            Ok(Attempt::AlreadyOurs) => {
                // Give the hold back (on the attempt's connection; for the
                // fair queue that wakes the next waiter) and try again with
                // a fresh token.
                let _ = with_timeout("undo acquire", timeout, undo.run_now()).await;
                Ok(Outcome::Again)
            }
            // Taken but too few replicas have it: give it back before
            // reporting, or try again (at the back of a queue) while
            // waiting.
            Err(e @ Error::NotReplicated { .. }) => {
                family.not_replicated();
                let _ = with_timeout("undo acquire", timeout, undo.run_now()).await;
                if self.waits && pause_before_retry(self.deadline, pause).await {
                    return Ok(Outcome::Again);
                }
                Err(e)
            }
            // Unknown outcome while waiting: `undo` takes the hold back in
            // the background if the attempt took it; the wait rides the
            // outage out.
            Err(e) if e.is_retryable() && self.waits => {
                drop(undo);
                family.unknown();
                if pause_before_retry(self.deadline, pause).await {
                    return Ok(Outcome::Again);
                }
                Err(e)
            }
            // `undo` stays armed and runs in the background: a refused
            // script changed nothing, and compare-and-delete of a token
            // nobody holds is harmless. So does what the family armed.
            Err(e) => Err(e),
        }
    }
}
