//! The Redis mutex: `SET NX PX` with a fencing `INCR`, compare-and-delete
//! release with `PUBLISH`, compare-and-`PEXPIRE` renewal, waiting on the
//! shared subscriber.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::backend::{
    with_timeout, CleanupGuard, GuardParts, LeaseBackend, LeaseSignal, LeaseTerms,
};
use distlock_core::{Error, LeaseOptions, Lock, LockGuard, Name, Result, Wait};
use tokio::time::Instant;

use crate::context::Context;
use crate::keys::{Keys, LineKeys};
use crate::lease::{
    decode, kind_refusal, leave_budget, pause_before_retry, Attempt, RedisLease, Undo,
};
use crate::line::InLine;
use crate::net::Pinned;
use crate::scripts::ACQUIRE;
use crate::wake::subscriber::Subscription;
use crate::wake::woken;

/// The first re-check while the holder is a client that does not publish
/// on release (redis-py): re-checks start here and double up to the
/// provider's re-check interval, and start here again whenever the holder
/// has more time left than at the last look (it released and someone took
/// the lock again, or it extended: a busy lock, worth watching closely).
const FOREIGN_RECHECK: Duration = Duration::from_millis(1);

/// A Redis mutex (unfair: whoever asks first after a release wins).
pub(crate) struct RedisMutex {
    pub(crate) shared: Arc<Context>,
    pub(crate) name: Name,
    pub(crate) keys: Arc<Keys>,
    pub(crate) lease: LeaseOptions,
}

impl fmt::Debug for RedisMutex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisMutex")
            .field("name", &self.name)
            .field("key", &self.keys.lock)
            .finish_non_exhaustive()
    }
}

/// Who holds a lock an attempt did not get.
struct Held {
    /// How long the holder (or the reservation for another provider) has
    /// left (`None`: no TTL).
    left: Option<Duration>,
    /// Whether the holder publishes on release (a distlock holder, or a
    /// reservation).
    publishes: bool,
}

/// How one attempt ended.
enum Step {
    /// The acquire call is over.
    Done(Result<Option<LockGuard>>),
    /// Try again at once (after a pause the attempt took already).
    Again,
    /// Held by someone else.
    Held(Held),
}

/// Where a refused attempt puts this provider in the lock's line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LinePlace {
    /// Not at all (`try_lock`).
    Out,
    /// At the back, unless it is in line already.
    Back,
    /// At the front: a waiter that was woken by the hand-over and lost the
    /// lock to someone who did not wait.
    Front,
}

impl RedisMutex {
    async fn attempt(
        &self,
        conn: &Pinned,
        token: &str,
        queue: LinePlace,
        others: bool,
        in_line: bool,
    ) -> Result<Attempt<Held>> {
        let subscriber = &self.shared.subscriber;
        let LineKeys {
            waiting,
            handoff,
            alive,
            listening,
        } = self
            .keys
            .line
            .as_ref()
            .ok_or_else(|| Error::server("redis", "a plain mutex without its line keys"))?;
        // Whether a hand-over to this provider would be heard: not while
        // its pub/sub connection is not known to deliver (see
        // `Subscriber::alive_for`). Only a waiting attempt asks.
        let alive_ms = if queue == LinePlace::Out || !self.shared.replies.heard() {
            0
        } else {
            subscriber.alive_for(&self.keys.channel).as_millis()
        };
        // How long a waiter that is not in line marks that it listens: up
        // to its next look (a re-check, or one response timeout more).
        let listening_ms = (self.shared.options.recheck_interval
            + self.shared.options.response_timeout)
            .as_millis();
        let ((status, value, publishes), acked): ((i64, i64, i64), _) = conn
            .script_acked(
                "acquire",
                self.shared.options.response_timeout,
                ACQUIRE
                    .key(&self.keys.lock)
                    .key(&self.keys.fence)
                    .key(&self.keys.holder)
                    .key(waiting)
                    .key(handoff)
                    .key(alive)
                    .key(listening)
                    .arg(token)
                    .arg(self.lease.ttl_millis())
                    .arg(&self.shared.owner)
                    .arg(subscriber.id())
                    .arg(match queue {
                        LinePlace::Out => "0",
                        LinePlace::Back => "1",
                        LinePlace::Front => "2",
                    })
                    .arg(if others { "1" } else { "0" })
                    .arg(if in_line { "1" } else { "0" })
                    .arg(alive_ms.to_string())
                    .arg(listening_ms.to_string())
                    .arg(self.shared.options.fence_ttl_ms(self.lease.ttl_millis())),
                self.shared.options.wait,
            )
            .await?;
        decode(
            (&self.shared, &self.name, &self.keys.fence),
            (status, value),
            acked,
            |left| Held {
                left,
                publishes: publishes == 1,
            },
            |status, value| match status {
                -1 => self.conflict(&self.keys.lock, "lock (a string key)"),
                -4 => kind_refusal(&self.name, &self.keys.lock, value, "mutex"),
                _ => self.conflict(&self.keys.fence, "fencing counter"),
            },
        )
    }

    /// One attempt of [`Lock::acquire`]: a connection, the script, and the
    /// undo of an attempt whose outcome is unknown.
    async fn step(
        &self,
        wait: Wait,
        deadline: Option<Instant>,
        queue: LinePlace,
        (others, in_line): (bool, bool),
        pause: &mut Duration,
        waited: Instant,
    ) -> Step {
        let shared = &self.shared;
        let timeout = shared.options.response_timeout;
        let started = Instant::now();
        let conn = match shared.conn() {
            Ok(conn) => conn,
            Err(e) => return Step::Done(Err(e)),
        };
        let pinned = match conn.pin(timeout).await {
            Ok(pinned) => pinned,
            Err(e) if e.is_retryable() && wait != Wait::No => {
                if Box::pin(pause_before_retry(deadline, pause)).await {
                    return Step::Again;
                }
                return Step::Done(Err(e));
            }
            Err(e) => return Step::Done(Err(e)),
        };
        let lease = RedisLease::new(shared, (&self.keys).into(), &self.name, &pinned);
        let mut undo = match CleanupGuard::arm(
            "undo acquire",
            Arc::new(Undo {
                lease: Arc::clone(&lease),
                place: None,
                expires: started + self.lease.ttl() + timeout,
            }),
        ) {
            Ok(undo) => undo,
            Err(e) => return Step::Done(Err(e)),
        };
        // Boxed: the attempt's state is large, and a waiter should not
        // carry it while it sleeps between attempts. Bounded by the
        // response timeout even while the client reconnects (which may
        // take its connect timeout), so a deadline is passed by one
        // response timeout at most.
        let attempt = Box::pin(self.attempt(&pinned, &lease.token, queue, others, in_line));
        let outcome = with_timeout("acquire", timeout, attempt)
            .await
            .and_then(|r| r);
        shared.replies.note(&outcome);
        match outcome {
            Ok(Attempt::Acquired(token)) => {
                undo.disarm();
                tracing::debug!(
                    name = %self.name,
                    owner = %shared.owner,
                    token,
                    waited_us = waited.elapsed().as_micros(),
                    "distlock redis lock acquired"
                );
                let parts = GuardParts {
                    name: self.name.clone(),
                    fencing_token: token,
                    signal: LeaseSignal::new(),
                    terms: LeaseTerms::Ttl(self.lease),
                    acquired_at: started,
                    lifecycle: Arc::clone(&shared.lifecycle),
                };
                // On error (closed meanwhile) the guard released itself.
                Step::Done(LockGuard::new(parts, lease as Arc<dyn LeaseBackend>).map(Some))
            }
            Ok(Attempt::Waiting(held)) => {
                undo.disarm();
                Step::Held(held)
            }
            Ok(Attempt::AlreadyOurs) => {
                // Give the key back (on the attempt's connection) and
                // try again with a fresh token.
                let _ = with_timeout("undo acquire", timeout, undo.run_now()).await;
                Step::Again
            }
            // Taken but too few replicas have it: give it back before
            // reporting (or retrying, while waiting).
            Err(e @ Error::NotReplicated { .. }) => {
                let _ = with_timeout("undo acquire", timeout, undo.run_now()).await;
                if wait != Wait::No && pause_before_retry(deadline, pause).await {
                    return Step::Again;
                }
                Step::Done(Err(e))
            }
            // Unknown outcome while waiting: `undo` deletes the key if
            // our SET landed; the wait rides the outage out.
            Err(e) if e.is_retryable() && wait != Wait::No => {
                drop(undo);
                if pause_before_retry(deadline, pause).await {
                    return Step::Again;
                }
                Step::Done(Err(e))
            }
            // `undo` stays armed: a refused script changed nothing, and
            // compare-and-delete of a token nobody holds is harmless.
            Err(e) => Step::Done(Err(e)),
        }
    }

    fn conflict(&self, key: &str, expected: &'static str) -> Error {
        Error::Conflict {
            what: format!("redis key {key:?}"),
            expected,
        }
    }
}

#[async_trait]
impl Lock for RedisMutex {
    fn name(&self) -> &Name {
        &self.name
    }

    fn backend(&self) -> &'static str {
        "redis"
    }

    fn kind(&self) -> distlock_core::PrimitiveKind {
        distlock_core::PrimitiveKind::Mutex
    }

    async fn acquire(&self, wait: Wait) -> Result<Option<LockGuard>> {
        tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let shared = &self.shared;
        shared.lifecycle.check_open()?;
        let deadline = wait.deadline();
        let waited = Instant::now();
        let timeout = shared.options.response_timeout;
        let subscriber = &shared.subscriber;
        let channel = &self.keys.channel;
        // Declared before the subscription: dropped after it, so it counts
        // the waiters that are left without this one.
        let mut line = InLine::new(subscriber, channel);
        let mut queue = if wait == Wait::No {
            LinePlace::Out
        } else {
            LinePlace::Back
        };
        // On a channel subscribed already (lingering, or other waiters of
        // this provider), the subscription is queued before the first
        // attempt and needs no second attempt after it (see
        // `Subscriber::start_subscribe`).
        let mut subscription: Option<Subscription> = (queue != LinePlace::Out
            && subscriber.is_live(channel))
        .then(|| subscriber.start_subscribe(channel.clone()));
        let mut pause = Duration::from_millis(20);
        let mut foreign_pause = FOREIGN_RECHECK;
        let mut foreign_left = None;
        // What a leave before returning may take: what is left of one
        // response timeout past the caller's deadline (a wait gives up at
        // most one response timeout late), or one response timeout.
        let leave_within = || leave_budget(deadline, timeout);
        loop {
            // The attempt is boxed: a waiter keeps only the small state of
            // its wait between attempts (see `benches/README.md`, memory
            // per waiting contender).
            let counted = subscription.is_some();
            // Other waiters of this provider on this lock besides this one
            // (a waiter is `counted` once it subscribed).
            let others = subscriber.plain_waiters(channel) > usize::from(counted);
            let in_line = line.armed;
            // Armed before the attempt: one that may queue us and whose
            // answer is lost (an error, a cancellation) leaves the line too.
            line.armed |= queue != LinePlace::Out;
            let step = self.step(wait, deadline, queue, (others, in_line), &mut pause, waited);
            // The outcome is boxed, and the step's value gone, before the
            // awaits below: a waiting task keeps no room for a guard.
            let step = match Box::pin(step).await {
                Step::Done(result) => Err(Box::new(result)),
                Step::Again => continue,
                Step::Held(held) => Ok(held),
            };
            let Held {
                left: remaining,
                publishes,
            } = match step {
                Ok(held) => held,
                Err(done) => {
                    if matches!(*done, Ok(Some(_))) {
                        // The script left the line, or stayed for the others.
                        line.armed = false;
                        // Reconciled with the waiters there are now: the
                        // script's choice was made with the count of before.
                        let others_now = subscriber.plain_waiters(channel) > usize::from(counted);
                        if others && !others_now {
                            // They left while the attempt was in flight, and
                            // it put this provider back in line for them:
                            // leave (the lock is ours: nothing is passed on).
                            line.armed = true;
                        } else if !others && others_now {
                            // One came meanwhile, and the attempt took this
                            // provider off the line: it looks again now and
                            // queues, rather than at its next re-check.
                            if let Some(sub) = &subscription {
                                sub.nudge();
                            }
                        }
                    }
                    // Out of line before returning (given up, failed, or
                    // holding with nobody else of ours waiting).
                    drop(subscription);
                    Box::pin(line.leave(&self.shared, &self.keys, leave_within())).await;
                    return *done;
                }
            };
            pause = Duration::from_millis(20);
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                // Out of line before returning: a program that ends now
                // leaves nothing behind that releases would reserve the
                // lock for.
                drop(subscription);
                Box::pin(line.leave(&self.shared, &self.keys, leave_within())).await;
                return Ok(None);
            }
            // Subscribed after an attempt, the subscription's confirmation
            // wakes the wait below to look again: a release in between is
            // not missed, and a slow confirmation never holds the caller
            // past its deadline.
            let sub = subscription.get_or_insert_with(|| subscriber.subscribe(channel.clone()));
            let mut wake = now + shared.options.recheck_interval;
            let mut key_watch = None;
            if publishes {
                foreign_pause = FOREIGN_RECHECK;
                foreign_left = None;
            } else {
                // The holder will not announce its release (redis-py): the
                // server tells when the key changes (client tracking, see
                // `tracker.rs`), or else short re-checks, growing while the
                // same hold runs down.
                let until = deadline.map_or(wake, |d| d.min(wake));
                // Boxed: only a waiter behind such a holder keeps it.
                key_watch = Box::pin(shared.tracker.watch(&self.keys.lock, until))
                    .await
                    .map(Box::new);
                if key_watch.is_none() {
                    if remaining > foreign_left {
                        foreign_pause = FOREIGN_RECHECK;
                    }
                    foreign_left = remaining;
                    wake = wake.min(now + foreign_pause);
                    foreign_pause = (foreign_pause * 2).min(shared.options.recheck_interval);
                }
            }
            if let Some(left) = remaining {
                wake = wake.min(now + left + Duration::from_millis(1));
            }
            if let Some(d) = deadline {
                wake = wake.min(d);
            }
            queue = LinePlace::Back;
            // Woken by the hand-over: if someone who did not wait takes
            // the lock first, back to the front.
            if Box::pin(woken(
                sub,
                key_watch.as_deref_mut(),
                wake,
                &shared.lifecycle,
            ))
            .await?
            {
                queue = LinePlace::Front;
            }
        }
    }
}
