//! The fair queue under the fair (FIFO) mutex (on the plain mutex's lock
//! key and fencing counter) and the election (on keys of its own). The
//! protocol (expiring entries, one wake-up per hand-over, the re-checks
//! that make up for a lost one, plain acquirers barging, cancellation) is
//! told once, in the crate docs' [fair mutex](crate#the-fair-mutex)
//! section, its keys in [Keys](crate#keys). Here: a waiter's loop of
//! attempts (`fair_acquire.lua`, which also refreshes its entry) and its
//! leave (`fair_leave.lua`).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::backend::{with_timeout, Cleanup, CleanupGuard};
use distlock_core::{Error, LeaseOptions, LockGuard, Name, Result, Wait};
use tokio::time::Instant;

use crate::acquire::{Acquisition, Family, Outcome};
use crate::context::Context;
use crate::keys::Keys;
use crate::lease::{decode, kind_refusal, leave_budget, new_token, retried, Attempt, RedisLease};
use crate::net::{Pinned, Sticky};
use crate::scripts::{FAIR_ACQUIRE, FAIR_LEAVE};

/// A lock taken in arrival order: the fair mutex, and (on keys of its own,
/// with a leader record) the election.
pub(crate) struct FairQueue {
    pub(crate) shared: Arc<Context>,
    pub(crate) name: Name,
    pub(crate) keys: Arc<Keys>,
    pub(crate) lease: LeaseOptions,
}

/// Where a fair waiter stands after an attempt that did not get the lock.
struct Place {
    /// Wait at most this long before looking again (`None`: no bound from
    /// the server).
    wait: Option<Duration>,
    /// Our 0-based place (-1: not queued).
    position: i64,
    /// Whether the call added our entry (the first call, or ours had
    /// expired).
    added: bool,
}

/// Leaves the queue: removes our entry and, if that frees the way, wakes
/// the next waiter. Sent on the connection of the last attempt, so it
/// reaches the server after it; retried until our entry would have expired
/// by itself.
struct LeaveQueue {
    shared: Arc<Context>,
    keys: Arc<Keys>,
    id: Arc<str>,
    conn: Sticky,
    /// When our entry expires by itself (plus a response timeout).
    expires: Mutex<Instant>,
}

impl LeaveQueue {
    fn sent_on(&self, conn: &Pinned, expires: Instant) {
        self.conn.keep(conn);
        *self.expires.lock().unwrap_or_else(PoisonError::into_inner) = expires;
    }

    async fn leave_once(&self) -> Result<()> {
        let timeout = self.shared.options.response_timeout;
        let mut invocation = FAIR_LEAVE.key(&self.keys.lock);
        invocation
            .key(&self.keys.queue)
            .key(&self.keys.timeouts)
            .key(&self.keys.holder)
            .key(&self.keys.owners);
        if let Some(record) = &self.keys.record {
            invocation.key(record);
        }
        invocation.arg(&*self.id).arg("").arg(&self.keys.channel);
        let reply: Result<i64> = with_timeout(
            "leave queue",
            timeout,
            self.conn
                .script(&self.shared.commands, "leave queue", &invocation),
        )
        .await
        .and_then(|r| r);
        reply.map(drop)
    }
}

impl Drop for LeaveQueue {
    fn drop(&mut self) {
        // Counted from its creation in `FairQueue::acquire`: gone once the
        // acquisition and its cleanup are both over.
        self.shared.subscriber.outstanding.exit();
    }
}

#[async_trait]
impl Cleanup for LeaveQueue {
    async fn clean_up(&self) -> Result<()> {
        let expires = || *self.expires.lock().unwrap_or_else(PoisonError::into_inner);
        retried(expires, || self.leave_once()).await
    }
}

impl FairQueue {
    /// How long a waiter's entry lives unless refreshed: two re-check
    /// intervals and a response timeout (as the read-write lock's and the
    /// semaphore's queues), or the lease TTL if shorter. A waiter refreshes
    /// it at least every third of that, so a dead waiter holds the queue up
    /// for seconds, never for a long lease.
    fn entry_ttl(&self) -> Duration {
        let options = &self.shared.options;
        (options.recheck_interval * 2 + options.response_timeout).min(self.lease.ttl())
    }

    async fn attempt(
        &self,
        conn: &Pinned,
        id: &str,
        token: &str,
        queue: bool,
        candidate: Option<&str>,
    ) -> Result<Attempt<Place>> {
        let timeout = self.shared.options.response_timeout;
        let keys = &self.keys;
        let mut invocation = FAIR_ACQUIRE.key(&keys.lock);
        invocation
            .key(&keys.fence)
            .key(&keys.queue)
            .key(&keys.timeouts)
            .key(&keys.holder)
            .key(&keys.owners);
        if let Some(record) = &keys.record {
            invocation.key(record);
            if let Some(marker) = &keys.marker {
                invocation.key(marker);
            }
        }
        invocation
            .arg(id)
            .arg(token)
            .arg(self.lease.ttl_millis())
            .arg(u64::try_from(self.entry_ttl().as_millis()).unwrap_or(u64::MAX))
            .arg(if queue { "1" } else { "0" })
            .arg(&keys.channel)
            .arg(candidate.unwrap_or(""))
            .arg(&self.shared.owner)
            .arg(self.shared.options.fence_ttl_ms(self.lease.ttl_millis()));
        let (reply, acked): (Vec<i64>, _) = conn
            .script_acked("acquire", timeout, &invocation, self.shared.options.wait)
            .await?;
        let bad = || Error::server("redis", "fair acquire script returned an unknown reply");
        let (status, value) = match reply.as_slice() {
            [status, value, ..] => (*status, *value),
            _ => return Err(bad()),
        };
        decode(
            (&self.shared, &self.name, &keys.fence),
            (status, value),
            acked,
            |wait| Place {
                wait,
                position: reply.get(2).copied().unwrap_or(-1),
                added: reply.get(3) == Some(&1),
            },
            |status, value| match status {
                -1 => conflict(&keys.lock, "lock (a string key)"),
                -4 => conflict(&keys.queue, "fair queue (sorted sets)"),
                -5 => kind_refusal(
                    &self.name,
                    keys.marker.as_deref().unwrap_or(&keys.lock),
                    value,
                    if keys.record.is_some() {
                        "election"
                    } else {
                        "fair mutex"
                    },
                ),
                _ => conflict(&keys.fence, "fencing counter"),
            },
        )
    }

    /// One attempt of [`FairQueue::acquire`]: the
    /// [skeleton](crate::acquire) with the fair queue's script. Boxed by
    /// the caller, so a waiter keeps none of this (the family's part
    /// included) while it waits.
    #[allow(clippy::too_many_arguments)]
    async fn step(
        &self,
        queue_up: bool,
        candidate: Option<&str>,
        leave: &Arc<LeaveQueue>,
        in_queue: &mut Option<CleanupGuard>,
        queued: &mut bool,
        (deadline, waited): (Option<Instant>, Instant),
        pause: &mut Duration,
    ) -> Result<Outcome<Option<Duration>>> {
        let acquisition = Acquisition {
            shared: &self.shared,
            name: &self.name,
            lease: self.lease,
            waits: queue_up,
            deadline,
        };
        let mut family = FairAttempt {
            queue: self,
            queue_up,
            candidate,
            leave,
            in_queue,
            queued,
            waited,
        };
        acquisition
            .attempt((&self.keys).into(), &mut family, pause)
            .await
    }

    /// Waits in the queue for the lock; with `candidate`, the lock is an
    /// election's lease and the leader record is written with it.
    pub(crate) async fn acquire(
        &self,
        wait: Wait,
        candidate: Option<&str>,
    ) -> Result<Option<LockGuard>> {
        tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let shared = &self.shared;
        shared.lifecycle.check_open()?;
        let deadline = wait.deadline();
        let queue = wait != Wait::No;
        let waited = Instant::now();
        shared.subscriber.outstanding.enter();
        let leave = Arc::new(LeaveQueue {
            shared: Arc::clone(shared),
            keys: Arc::clone(&self.keys),
            id: Arc::from(new_token()),
            conn: Sticky::new(None),
            expires: Mutex::new(waited),
        });
        // Armed before the first attempt that may queue us, disarmed only
        // when the lock is ours (the acquire removed our entry).
        let mut in_queue: Option<CleanupGuard> = None;
        let mut queued = false;
        let mut subscription = None;
        let mut pause = Duration::from_millis(20);
        loop {
            // The attempt is boxed: a waiter keeps only the small state of
            // its wait between attempts (see `benches/README.md`, memory
            // per waiting contender).
            let step = self.step(
                queue,
                candidate,
                &leave,
                &mut in_queue,
                &mut queued,
                (deadline, waited),
                &mut pause,
            );
            let remaining = match Box::pin(step).await? {
                Outcome::Acquired(guard) => return Ok(Some(guard)),
                Outcome::Again => continue,
                Outcome::Waiting(remaining) => remaining,
            };
            pause = Duration::from_millis(20);
            // The attempt answered: nothing of ours is in flight, so the
            // leave need not follow it on its connection. Let it go while
            // waiting (the next attempt keeps its own); a leave from the
            // wait pins one.
            leave.conn.let_go();
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                let within = leave_budget(deadline, shared.options.response_timeout);
                Box::pin(leave_now(in_queue.take(), within)).await;
                return Ok(None);
            }
            if subscription.is_none() {
                // Subscribe; its confirmation wakes the wait below to look
                // again: a hand-over between the attempt and the
                // subscription is not missed, and a slow confirmation never
                // holds the caller past its deadline.
                subscription = Some(
                    shared
                        .subscriber
                        .subscribe_as(self.keys.channel.clone(), Arc::clone(&leave.id)),
                );
            }
            // The next look: a hand-over message, the holder's expiry (or a
            // dead head's), the heartbeat that keeps our entry, the re-check
            // interval, the caller's deadline.
            let mut wake = now + shared.options.recheck_interval.min(self.entry_ttl() / 3);
            if let Some(left) = remaining {
                wake = wake.min(now + left + Duration::from_millis(1));
            }
            if let Some(d) = deadline {
                wake = wake.min(d);
            }
            if let Some(sub) = &mut subscription {
                let never = std::future::pending();
                Box::pin(crate::wake::woken_or(sub, never, wake, &shared.lifecycle)).await?;
            }
        }
    }
}

/// Leaves the queue now, if `in_queue` is armed, within `timeout` (see
/// [`leave_budget`]). If this times out, the
/// guard's drop finishes it in the background; the entry expires by itself
/// anyway. A function of its own, so that the waiting future does not keep
/// room for the guard.
async fn leave_now(in_queue: Option<CleanupGuard>, timeout: Duration) {
    if let Some(mut guard) = in_queue {
        if timeout.is_zero() {
            return;
        }
        let _ = with_timeout("leave queue", timeout, guard.run_now()).await;
    }
}

/// The fair queue's part of one attempt: its script, and the leave of the
/// queue armed before an attempt that may queue us.
struct FairAttempt<'a> {
    queue: &'a FairQueue,
    /// Whether the attempt queues us (the caller waits).
    queue_up: bool,
    candidate: Option<&'a str>,
    leave: &'a Arc<LeaveQueue>,
    /// Armed before the first attempt that may queue us, disarmed only
    /// when the lock is ours (the acquire removed our entry).
    in_queue: &'a mut Option<CleanupGuard>,
    /// Whether an attempt queued us.
    queued: &'a mut bool,
    waited: Instant,
}

impl Family for FairAttempt<'_> {
    type Waiting = Option<Duration>;

    fn arm(&mut self, pinned: &Pinned, _lease: &Arc<RedisLease>, started: Instant) -> Result<()> {
        if self.queue_up {
            let timeout = self.queue.shared.options.response_timeout;
            self.leave
                .sent_on(pinned, started + self.queue.entry_ttl() + timeout);
            if self.in_queue.is_none() {
                *self.in_queue = Some(CleanupGuard::arm(
                    "leave queue",
                    Arc::clone(self.leave) as Arc<dyn Cleanup>,
                )?);
            }
        }
        Ok(())
    }

    async fn script(&mut self, pinned: &Pinned, token: &str) -> Result<Attempt<Option<Duration>>> {
        let attempt = self
            .queue
            .attempt(pinned, &self.leave.id, token, self.queue_up, self.candidate)
            .await?;
        Ok(match attempt {
            Attempt::Acquired(token) => Attempt::Acquired(token),
            Attempt::AlreadyOurs => Attempt::AlreadyOurs,
            Attempt::Waiting(Place {
                wait,
                position,
                added,
            }) => {
                if added && *self.queued {
                    tracing::debug!(
                        name = %self.queue.name,
                        position,
                        "distlock redis fair waiter lost its place (its entry expired); queued again at the back"
                    );
                }
                *self.queued |= position >= 0;
                Attempt::Waiting(wait)
            }
        })
    }

    fn acquired(&mut self, token: u64) {
        if let Some(guard) = self.in_queue.as_mut() {
            guard.disarm();
        }
        tracing::debug!(
            name = %self.queue.name,
            owner = %self.queue.shared.owner,
            token,
            waited_us = self.waited.elapsed().as_micros(),
            "distlock redis fair lock acquired"
        );
    }
}

fn conflict(key: &str, expected: &'static str) -> Error {
    Error::Conflict {
        what: format!("redis key {key:?}"),
        expected,
    }
}
