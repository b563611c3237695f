//! The Redis mutex (unfair). The protocol (the line of providers, the
//! hand-over reservation, waiting next to redis-py) is told once, in the
//! crate docs' [mutex](crate#the-mutex) section, its keys in
//! [Keys](crate#keys). Here: a waiter's loop of attempts (`acquire.lua`,
//! through the [skeleton](crate::acquire)), where each attempt puts this
//! provider in the line, and its wait (the subscriber, or client tracking
//! behind a holder that does not publish).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::{Error, LeaseOptions, Lock, LockGuard, Name, Result, Wait};
use tokio::time::Instant;

use crate::acquire::{Acquisition, Family, Outcome};
use crate::context::Context;
use crate::keys::{Keys, LineKeys, STREAK_UNIT, TURN_AFTER};
use crate::lease::{decode, kind_refusal, leave_budget, Attempt};
use crate::line::InLine;
use crate::net::Pinned;
use crate::scripts::ACQUIRE;
use crate::wake::subscriber::Subscription;
use crate::wake::tracker::KeyWatch;
use crate::wake::woken;

/// The first re-check while the holder is a client that does not publish
/// on release (redis-py): re-checks start here and double up to the
/// provider's re-check interval, and start here again whenever the holder
/// has more time left than at the last look (it released and someone took
/// the lock again, or it extended: a busy lock, worth watching closely).
const FOREIGN_RECHECK: Duration = Duration::from_millis(1);

/// Whole milliseconds as a script argument: a `u64`, which the client
/// writes in place (a `u128`'s `to_string()` cost a formatting and an
/// allocation per argument on the hot path; the bytes sent are the same).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

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
        turn_taken: bool,
    ) -> Result<Attempt<Held>> {
        let subscriber = &self.shared.subscriber;
        let LineKeys {
            waiting,
            handoff,
            alive,
            listening,
            streak,
            ..
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
            millis(subscriber.alive_for(&self.keys.channel))
        };
        // How long a waiter that is not in line marks that it listens: up
        // to its next look (a re-check, or one response timeout more).
        let listening_ms =
            millis(self.shared.options.recheck_interval + self.shared.options.response_timeout);
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
                    .key(streak)
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
                    .arg(alive_ms)
                    .arg(listening_ms)
                    .arg(self.shared.options.fence_ttl_ms(self.lease.ttl_millis()))
                    .arg(TURN_AFTER * STREAK_UNIT)
                    .arg(if turn_taken { "1" } else { "0" }),
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

    /// One attempt of [`Lock::acquire`]: the [skeleton](crate::acquire)
    /// with the mutex's script.
    async fn step(
        &self,
        wait: Wait,
        deadline: Option<Instant>,
        queue: LinePlace,
        (others, in_line, turn_taken): (bool, bool, bool),
        pause: &mut Duration,
        waited: Instant,
    ) -> Step {
        let acquisition = Acquisition {
            shared: &self.shared,
            name: &self.name,
            lease: self.lease,
            waits: wait != Wait::No,
            deadline,
        };
        let mut family = MutexAttempt {
            mutex: self,
            queue,
            others,
            in_line,
            turn_taken,
            waited,
        };
        match acquisition
            .attempt((&self.keys).into(), &mut family, pause)
            .await
        {
            Ok(Outcome::Acquired(guard)) => Step::Done(Ok(Some(guard))),
            Ok(Outcome::Again) => Step::Again,
            Ok(Outcome::Waiting(held)) => Step::Held(held),
            Err(e) => Step::Done(Err(e)),
        }
    }

    /// Holds back while this provider's waiters do on this lock (a turn
    /// for clients outside the line, see `mutex_release.lua`): until the
    /// turn ends (or `deadline`), or someone takes it — the lock key is
    /// found set, or changes (client tracking) — whichever comes first.
    /// `true` when someone took it: the next attempt tells the releases
    /// (`acquire.lua`), even when that hold is over by then.
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] when the provider is closed meanwhile.
    async fn hold_back(&self, deadline: Option<Instant>) -> Result<bool> {
        let subscriber = &self.shared.subscriber;
        let channel = &self.keys.channel;
        let Some(until) = subscriber.held_back(channel) else {
            return Ok(false);
        };
        let until = deadline.map_or(until, |d| d.min(until));
        let mut taken = self.shared.tracker.watch(&self.keys.lock, until).await;
        if taken.as_ref().and_then(KeyWatch::found) == Some(true) {
            // Its hold is waited out as any other.
            subscriber.turn_taken(channel);
            return Ok(true);
        }
        tokio::select! {
            () = tokio::time::sleep_until(until) => Ok(false),
            () = turn_taken(taken.as_mut()) => {
                subscriber.turn_taken(channel);
                Ok(true)
            }
            () = self.shared.lifecycle.closed() => Err(Error::Closed),
        }
    }

    fn conflict(&self, key: &str, expected: &'static str) -> Error {
        Error::Conflict {
            what: format!("redis key {key:?}"),
            expected,
        }
    }
}

/// The mutex's part of one attempt: its script, where the attempt puts
/// this provider in the line, and the replies it counts.
struct MutexAttempt<'a> {
    mutex: &'a RedisMutex,
    queue: LinePlace,
    others: bool,
    in_line: bool,
    /// Whether someone took a turn this provider held back for (see
    /// `acquire.lua`'s ARGV[12]).
    turn_taken: bool,
    waited: Instant,
}

impl Family for MutexAttempt<'_> {
    type Waiting = Held;

    fn script<'a>(
        &'a mut self,
        pinned: &'a Pinned,
        token: &'a str,
    ) -> impl std::future::Future<Output = Result<Attempt<Held>>> + Send + 'a {
        self.mutex.attempt(
            pinned,
            token,
            self.queue,
            self.others,
            self.in_line,
            self.turn_taken,
        )
    }

    fn answered(&mut self, outcome: &Result<Attempt<Held>>) {
        self.mutex.shared.replies.note(outcome);
    }

    fn acquired(&mut self, token: u64) {
        tracing::debug!(
            name = %self.mutex.name,
            owner = %self.mutex.shared.owner,
            token,
            waited_us = self.waited.elapsed().as_micros(),
            "distlock redis lock acquired"
        );
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
            // A release left the lock free as a turn for clients outside
            // the line: they ask first (one local look while nobody holds
            // back; no server call). Boxed: only a wait that holds back
            // keeps its state.
            let turn_taken = if queue == LinePlace::Out {
                false
            } else if let Ok(taken) = Box::pin(self.hold_back(deadline)).await {
                taken
            } else {
                drop(subscription);
                Box::pin(line.leave(&self.shared, &self.keys, leave_within())).await;
                return Err(Error::Closed);
            };
            // Armed before the attempt: one that may queue us and whose
            // answer is lost (an error, a cancellation) leaves the line too.
            line.armed |= queue != LinePlace::Out;
            let step = self.step(
                wait,
                deadline,
                queue,
                (others, in_line, turn_taken),
                &mut pause,
                waited,
            );
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

/// Resolves when the lock key changes after `watch`'s read (someone took
/// a turn); never without a watch.
async fn turn_taken(watch: Option<&mut KeyWatch>) {
    match watch {
        Some(watch) => Box::pin(watch.next_change()).await,
        None => std::future::pending().await,
    }
}
