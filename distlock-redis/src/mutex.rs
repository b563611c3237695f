//! The Redis mutex: `SET NX PX` with a fencing `INCR`, compare-and-delete
//! release with `PUBLISH`, compare-and-`PEXPIRE` renewal, waiting on the
//! shared subscriber.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::backend::{
    with_timeout, Cleanup, CleanupGuard, GuardParts, LeaseBackend, LeaseSignal, LeaseTerms,
};
use distlock_core::{Error, LeaseOptions, Lock, LockGuard, Name, Result, Wait};
use tokio::time::{sleep_until, Instant};

use crate::context::Shared;
use crate::net::wait::not_replicated;
use crate::net::{Pinned, Sticky};
use crate::scripts::{ACQUIRE, EXTEND, LINE_ALIVE, MUTEX_PASS, MUTEX_RELEASE, RELEASE};
use crate::wake::subscriber::Subscription;
use crate::wake::woken;

/// How long a release reserves the free lock for the provider it woke: long
/// enough for the woken waiter to ask (a loopback round trip is ~0.1 ms; a
/// busy machine may take milliseconds to schedule it), short enough that a
/// provider that died in between costs little.
pub(crate) const RESERVATION: Duration = Duration::from_millis(50);

/// The first re-check while the holder is a client that does not publish
/// on release (redis-py): re-checks start here and double up to the
/// provider's re-check interval, and start here again whenever the holder
/// has more time left than at the last look (it released and someone took
/// the lock again, or it extended: a busy lock, worth watching closely).
const FOREIGN_RECHECK: Duration = Duration::from_millis(1);

/// The keys of one lock: all in the lock key's Cluster slot.
#[derive(Clone, Debug)]
pub(crate) struct Keys {
    /// prefix + name, exactly (what redis-py's `Lock(name)` uses).
    pub(crate) lock: String,
    /// `{lock}:fence`, the fencing counter.
    pub(crate) fence: String,
    /// `{lock}:released`, the release channel.
    pub(crate) channel: String,
    /// `{lock}:fair:queue`, the fair waiters (zset id -> arrival number).
    pub(crate) queue: String,
    /// `{lock}:fair:timeouts`, their entries' expiry (zset id -> server ms).
    pub(crate) timeouts: String,
    /// `{lock}:holder`, the holder record (hash: `lock` = the lock key's
    /// value, `fence`, `at` = acquired at in server ms, `owner`), with the
    /// lock key's TTL.
    pub(crate) holder: String,
    /// `{lock}:fair:owners`, the fair waiters' owner identities (hash id ->
    /// owner), expiring with the queue.
    pub(crate) owners: String,
    /// A key that lives and dies with the lock (an election's leader
    /// record): set by the acquire, extended and deleted with the lock.
    pub(crate) record: Option<String>,
    /// The mutex's lock key of an election's name (prefix + name): checked
    /// for other kinds, and holding the election's marker while it has a
    /// leader (`kind.lua`); `None` for the mutex's own keys.
    pub(crate) marker: Option<String>,
    /// The plain mutex's line: `{lock}:waiting` (zset of waiting provider
    /// ids), `{lock}:handoff` (the provider a release reserved the lock
    /// for) and `{lock}:waiting:alive` (zset of the waiting providers'
    /// liveness deadlines); `None` for the other users of these keys.
    pub(crate) line: Option<(String, String, String)>,
}

impl Keys {
    /// The mutex's (plain and fair) keys.
    pub(crate) fn new(prefix: &str, name: &Name) -> Keys {
        Keys::from_lock(format!("{prefix}{name}"))
    }

    /// The keys of the lock key `lock` (prefix + name).
    fn from_lock(lock: String) -> Keys {
        Keys {
            fence: format!("{{{lock}}}:fence"),
            channel: format!("{{{lock}}}:released"),
            queue: format!("{{{lock}}}:fair:queue"),
            timeouts: format!("{{{lock}}}:fair:timeouts"),
            holder: format!("{{{lock}}}:holder"),
            owners: format!("{{{lock}}}:fair:owners"),
            record: None,
            marker: None,
            line: None,
            lock,
        }
    }

    /// The plain mutex's keys: [`Keys::new`]'s and its line.
    pub(crate) fn mutex(prefix: &str, name: &Name) -> Keys {
        let mut keys = Keys::new(prefix, name);
        keys.line = Some(line_keys(&keys.lock));
        keys
    }

    /// The plain mutex's keys of the lock whose release channel is
    /// `channel` (`{lock}:released`).
    pub(crate) fn of_channel(channel: &str) -> Option<Keys> {
        let lock = channel.strip_prefix('{')?.strip_suffix("}:released")?;
        let mut keys = Keys::from_lock(lock.to_owned());
        keys.line = Some(line_keys(lock));
        Some(keys)
    }

    /// The script a provider runs when it leaves this lock's line (see
    /// `mutex_pass.lua`); `None` without a line.
    pub(crate) fn pass<'a>(&'a self, provider: &'a str) -> Option<redis::ScriptInvocation<'a>> {
        let (waiting, handoff, alive) = self.line.as_ref()?;
        let mut invocation = MUTEX_PASS.key(&self.lock);
        invocation
            .key(waiting)
            .key(handoff)
            .key(alive)
            .arg(provider)
            .arg(&self.channel)
            .arg(RESERVATION.as_millis().to_string());
        Some(invocation)
    }

    /// The script that keeps `provider`'s place in this lock's line alive
    /// for `alive` more (see `line_alive.lua`); `None` without a line.
    pub(crate) fn keep_alive<'a>(
        &'a self,
        provider: &'a str,
        alive: Duration,
    ) -> Option<redis::ScriptInvocation<'a>> {
        let (waiting, _, deadlines) = self.line.as_ref()?;
        let mut invocation = LINE_ALIVE.key(waiting);
        invocation
            .key(deadlines)
            .arg(provider)
            .arg(alive.as_millis().to_string());
        Some(invocation)
    }

    /// An election's keys: its own lease key, counter, queue and channel,
    /// in the same slot as the mutex of the same name but apart from it.
    pub(crate) fn election(prefix: &str, name: &Name) -> Keys {
        let base = format!("{{{prefix}{name}}}:elect");
        Keys {
            fence: format!("{base}:fence"),
            channel: format!("{base}:events"),
            queue: format!("{base}:queue"),
            timeouts: format!("{base}:timeouts"),
            holder: format!("{base}:holder"),
            owners: format!("{base}:owners"),
            record: Some(format!("{base}:leader")),
            marker: Some(format!("{prefix}{name}")),
            line: None,
            lock: base,
        }
    }

    /// The release script with its keys (the hand-over reads the queue).
    pub(crate) fn release<'a>(&'a self, token: &'a str) -> redis::ScriptInvocation<'a> {
        if let Some((waiting, handoff, alive)) = &self.line {
            let mut invocation = MUTEX_RELEASE.key(&self.lock);
            invocation
                .key(&self.queue)
                .key(&self.timeouts)
                .key(&self.holder)
                .key(&self.owners)
                .key(waiting)
                .key(handoff)
                .key(alive)
                .arg(token)
                .arg(&self.channel)
                .arg(RESERVATION.as_millis().to_string());
            return invocation;
        }
        let mut invocation = RELEASE.key(&self.lock);
        invocation
            .key(&self.queue)
            .key(&self.timeouts)
            .key(&self.holder)
            .key(&self.owners);
        if let Some(record) = &self.record {
            invocation.key(record);
            if let Some(marker) = &self.marker {
                invocation.key(marker);
            }
        }
        invocation.arg(token).arg(&self.channel);
        invocation
    }
}

/// The line keys of the lock key `lock`.
fn line_keys(lock: &str) -> (String, String, String) {
    (
        format!("{{{lock}}}:waiting"),
        format!("{{{lock}}}:handoff"),
        format!("{{{lock}}}:waiting:alive"),
    )
}

/// A Redis mutex (unfair: whoever asks first after a release wins).
pub(crate) struct RedisMutex {
    pub(crate) shared: Arc<Shared>,
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

enum Attempt {
    Acquired(u64),
    /// Held by someone else (or reserved for another provider), who has
    /// this long left (`None`: no TTL); `true` when the holder publishes on
    /// release (a distlock holder, or a reservation).
    Held(Option<Duration>, bool),
    /// The key already holds this attempt's token: the attempt ran before
    /// (resent by the client after a lost reply), its token is unknown.
    AlreadyOurs,
}

/// 128 random bits as 32 hex digits (the shape of redis-py's tokens).
pub(crate) fn new_token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// Undoes an acquire attempt whose outcome is unknown (cancelled, timed out,
/// failed mid-flight): compare-and-delete on the connection the attempt used,
/// so it reaches the server after the attempt did and cannot let a late
/// `SET` land afterwards with nobody to release it. Retried until the lease
/// the attempt asked for would have expired by itself; once the attempt's
/// connection is known dead (nothing more can land from it), another
/// connection is as good.
pub(crate) struct UndoAttempt {
    pub(crate) lease: Arc<RedisLease>,
    /// When the attempt was sent plus its TTL and a response timeout: after
    /// this the key is gone anyway.
    pub(crate) expires: Instant,
}

#[async_trait]
impl Cleanup for UndoAttempt {
    async fn clean_up(&self) -> Result<()> {
        let mut pause = Duration::from_millis(20);
        loop {
            match self.lease.release().await {
                Ok(()) | Err(Error::NotHeld { .. }) => return Ok(()),
                Err(e) if e.is_retryable() && Instant::now() + pause < self.expires => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// How one attempt ended.
enum Step {
    /// The acquire call is over.
    Done(Result<Option<LockGuard>>),
    /// Try again at once (after a pause the attempt took already).
    Again,
    /// Held by someone else: as [`Attempt::Held`].
    Held(Option<Duration>, bool),
}

/// Where a refused attempt puts this provider in the lock's line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Queue {
    /// Not at all (`try_lock`).
    No,
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
        queue: Queue,
        others: bool,
        in_line: bool,
    ) -> Result<Attempt> {
        let subscriber = &self.shared.subscriber;
        let (waiting, handoff, alive) = self
            .keys
            .line
            .as_ref()
            .ok_or_else(|| Error::server("redis", "a plain mutex without its line keys"))?;
        // Whether a hand-over to this provider would be heard: not while
        // its pub/sub connection is not known to deliver (see
        // `Subscriber::alive_for`). Only a waiting attempt asks.
        let alive_ms = if queue == Queue::No {
            0
        } else {
            subscriber.alive_for(&self.keys.channel).as_millis()
        };
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
                    .arg(token)
                    .arg(self.lease.ttl_millis())
                    .arg(&self.shared.owner)
                    .arg(subscriber.id())
                    .arg(match queue {
                        Queue::No => "0",
                        Queue::Back => "1",
                        Queue::Front => "2",
                    })
                    .arg(if others { "1" } else { "0" })
                    .arg(if in_line { "1" } else { "0" })
                    .arg(alive_ms.to_string()),
                self.shared.options.wait,
            )
            .await?;
        match status {
            1 => {
                check_acked(&self.shared, &self.name, "acquisition", acked)?;
                u64::try_from(value)
                    .map(Attempt::Acquired)
                    .map_err(|_| Error::server("redis", "acquire script returned a negative token"))
            }
            0 => Ok(Attempt::Held(
                u64::try_from(value).ok().map(Duration::from_millis),
                publishes == 1,
            )),
            2 => Ok(Attempt::AlreadyOurs),
            -1 => Err(self.conflict(&self.keys.lock, "lock (a string key)")),
            -3 => Err(Error::Exhausted {
                name: self.keys.fence.clone(),
            }),
            -4 => Err(kind_refusal(&self.name, &self.keys.lock, value, "mutex")),
            _ => Err(self.conflict(&self.keys.fence, "fencing counter")),
        }
    }

    /// One attempt of [`Lock::acquire`]: a connection, the script, and the
    /// undo of an attempt whose outcome is unknown.
    async fn step(
        &self,
        wait: Wait,
        deadline: Option<Instant>,
        queue: Queue,
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
        let lease = RedisLease::new(shared, &self.keys, &self.name, &pinned);
        let mut undo = match CleanupGuard::arm(
            "undo acquire",
            Arc::new(UndoAttempt {
                lease: Arc::clone(&lease),
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
        match with_timeout("acquire", timeout, attempt)
            .await
            .and_then(|r| r)
        {
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
            Ok(Attempt::Held(remaining, publishes)) => {
                undo.disarm();
                Step::Held(remaining, publishes)
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

/// The refusal of an acquisition of a `wanted` on `name` whose acquire
/// script found another kind holding it (`kind.lua`'s `kind_other` index: 1
/// read-write lock, 2 semaphore, 3 election, 4 a mutex token (a distlock
/// mutex or fair mutex, or redis-py), 5 a lock key `lock` that is not a
/// string).
pub(crate) fn kind_refusal(name: &Name, lock: &str, index: i64, wanted: &'static str) -> Error {
    let found = match index {
        1 => "read-write lock",
        2 => "semaphore",
        3 => "election",
        4 => "mutex",
        _ => {
            return Error::Conflict {
                what: format!("redis key {lock:?}"),
                expected: "lock (a string key)",
            }
        }
    };
    Error::kind_conflict(name.as_str(), found, wanted)
}

/// `Ok` unless the provider asks replicas to acknowledge writes and fewer
/// than asked did (`acked` is what the pipelined `WAIT` answered).
pub(crate) fn check_acked(
    shared: &Shared,
    name: &Name,
    step: &str,
    acked: Option<u32>,
) -> Result<()> {
    match (shared.options.wait, acked) {
        (Some(wait), Some(acked)) if acked < wait.replicas => Err(not_replicated(
            format!("lock {:?} {step}", name.as_str()),
            acked,
            wait,
        )),
        (Some(wait), None) => Err(not_replicated(
            format!("lock {:?} {step}", name.as_str()),
            0,
            wait,
        )),
        _ => Ok(()),
    }
}

/// Sleeps before another attempt after a retryable failure while waiting;
/// `false` when that would pass the deadline.
pub(crate) async fn pause_before_retry(deadline: Option<Instant>, pause: &mut Duration) -> bool {
    let until = Instant::now() + *pause;
    if deadline.is_some_and(|d| d <= until) {
        return false;
    }
    sleep_until(until).await;
    *pause = (*pause * 2).min(Duration::from_millis(500));
    true
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
            Queue::No
        } else {
            Queue::Back
        };
        // On a channel subscribed already (lingering, or other waiters of
        // this provider), the subscription is queued before the first
        // attempt and needs no second attempt after it (see
        // `Subscriber::start_subscribe`).
        let mut subscription: Option<Subscription> = (queue != Queue::No
            && subscriber.is_live(channel))
        .then(|| subscriber.start_subscribe(channel.clone()));
        let mut pause = Duration::from_millis(20);
        let mut foreign_pause = FOREIGN_RECHECK;
        let mut foreign_left = None;
        // What a leave before returning may take: what is left of one
        // response timeout past the caller's deadline (a wait gives up at
        // most one response timeout late), or one response timeout.
        let leave_within = || {
            deadline.map_or(timeout, |d| {
                (d + timeout).saturating_duration_since(Instant::now())
            })
        };
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
            line.armed |= queue != Queue::No;
            let step = self.step(wait, deadline, queue, (others, in_line), &mut pause, waited);
            // The outcome is boxed, and the step's value gone, before the
            // awaits below: a waiting task keeps no room for a guard.
            let step = match Box::pin(step).await {
                Step::Done(result) => Err(Box::new(result)),
                Step::Again => continue,
                Step::Held(remaining, publishes) => Ok((remaining, publishes)),
            };
            let (remaining, publishes) = match step {
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
            queue = Queue::Back;
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
                queue = Queue::Front;
            }
        }
    }
}

/// A waiter's place in its lock's line: when the last waiter of this
/// provider leaves without the lock (timeout, cancellation, error), the
/// provider leaves the line, passing on a reservation a release may have
/// made for it meanwhile.
struct InLine<'a> {
    subscriber: &'a crate::wake::subscriber::Subscriber,
    channel: &'a str,
    /// Set once an attempt queued; cleared by the acquisition.
    armed: bool,
}

impl<'a> InLine<'a> {
    /// Counted as outstanding work of the provider while it lives, so that
    /// a `close()` lets the waiter it wakes leave the line before the
    /// connection goes.
    fn new(subscriber: &'a crate::wake::subscriber::Subscriber, channel: &'a str) -> Self {
        subscriber.outstanding.enter();
        InLine {
            subscriber,
            channel,
            armed: false,
        }
    }
}

impl InLine<'_> {
    /// Leaves the line now, within `within`, if this was the last waiter
    /// of the provider on this lock (the subscription dropped already):
    /// the caller returns only once the provider is out of line, so a
    /// program that ends then (or drops its provider) leaves nothing that
    /// a release would reserve the lock for. A leave that fails or takes
    /// longer is left to the drop (through the subscriber's line task);
    /// the provider's place expires by itself anyway (see the crate docs).
    async fn leave(&mut self, shared: &Shared, keys: &Keys, within: Duration) {
        if !self.armed {
            return;
        }
        if self.subscriber.plain_waiters(self.channel) > 0 {
            // Others of this provider still wait: they keep the place.
            self.armed = false;
            return;
        }
        if within.is_zero() {
            return;
        }
        let Some(invocation) = keys.pass(self.subscriber.id()) else {
            return;
        };
        let left = tokio::time::timeout(within, async {
            let conn = shared.conn()?.pin(within).await?;
            conn.script::<i64>("leave the line", within, &invocation)
                .await
        })
        .await;
        match left {
            Ok(Ok(_)) => self.armed = false,
            Ok(Err(e)) => {
                tracing::debug!(channel = %self.channel, error = %e, "distlock redis: leaving the line failed");
            }
            Err(_) => {
                tracing::debug!(channel = %self.channel, "distlock redis: leaving the line timed out");
            }
        }
    }
}

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        if self.armed && self.subscriber.plain_waiters(self.channel) == 0 {
            self.subscriber.leave_line(self.channel);
        }
        // After the leave was counted: never zero in between.
        self.subscriber.outstanding.exit();
    }
}

/// One held Redis lease: the lock key and our token.
///
/// Its renewals and its release go out on one pinned connection (the one
/// its acquisition used), so they reach the server in the order they were
/// sent: an `extend()` cancelled in flight cannot land after a later
/// renewal and shorten the lease behind the local deadline. A connection
/// found dead is replaced (nothing more can land from it). The connection
/// is let go once the lease is released.
pub(crate) struct RedisLease {
    shared: Arc<Shared>,
    keys: Arc<Keys>,
    pub(crate) token: String,
    name: Name,
    conn: Sticky,
}

impl RedisLease {
    /// The lease of one acquire attempt, with a fresh token, pinned to the
    /// attempt's connection.
    pub(crate) fn new(
        shared: &Arc<Shared>,
        keys: &Arc<Keys>,
        name: &Name,
        pinned: &Pinned,
    ) -> Arc<RedisLease> {
        // A fresh token per attempt: an undo still running for an earlier
        // attempt can never delete a later one's key.
        Arc::new(RedisLease {
            shared: Arc::clone(shared),
            keys: Arc::clone(keys),
            token: new_token(),
            name: name.clone(),
            conn: Sticky::new(Some(pinned)),
        })
    }

    /// Runs a compare-and-act script; `true` when it acted.
    async fn run(
        &self,
        operation: &'static str,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<bool> {
        let reply: i64 = self
            .conn
            .script(&self.shared.commands, operation, invocation)
            .await?;
        Ok(reply == 1)
    }

    fn owned(&self, acted: bool) -> Result<()> {
        if acted {
            Ok(())
        } else {
            Err(Error::not_held(self.name.as_str()))
        }
    }
}

#[async_trait]
impl LeaseBackend for RedisLease {
    async fn renew(&self, ttl: Duration) -> Result<()> {
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let mut invocation = EXTEND.key(&self.keys.lock);
        invocation.key(&self.keys.holder);
        if let Some(record) = &self.keys.record {
            invocation.key(record);
            if let Some(marker) = &self.keys.marker {
                invocation.key(marker);
            }
        }
        invocation.arg(&self.token).arg(ms);
        let (reply, acked): (i64, _) = self
            .conn
            .script_acked(&self.shared.commands, "extend", &invocation)
            .await?;
        self.owned(reply == 1)?;
        check_acked(&self.shared, &self.name, "renewal", acked)
    }

    async fn release(&self) -> Result<()> {
        let acted = self.run("release", &self.keys.release(&self.token)).await?;
        tracing::debug!(
            name = %self.name,
            owner = %self.shared.owner,
            released = acted,
            "distlock redis lock released"
        );
        // Released or not ours: either way no later command of this lease
        // needs the connection.
        self.conn.let_go();
        self.owned(acted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_the_lock_keys_slot_and_lock_key_is_prefix_plus_name() {
        let k = Keys::new("app:", &Name::new("orders/42").unwrap());
        assert_eq!(k.lock, "app:orders/42");
        assert_eq!(k.fence, "{app:orders/42}:fence");
        assert_eq!(k.channel, "{app:orders/42}:released");
        assert_eq!(slot(&k.lock), slot(&k.fence));
        assert_eq!(slot(&k.lock), slot(&k.channel));
        // The reference value of the Redis Cluster spec: "123456789" -> 0x31C3.
        assert_eq!(crc16(b"123456789"), 0x31C3);
    }

    #[test]
    fn fair_and_election_keys_share_the_slot_and_stay_apart() {
        let name = Name::new("orders/42").unwrap();
        let k = Keys::new("app:", &name);
        assert_eq!(k.queue, "{app:orders/42}:fair:queue");
        assert_eq!(k.timeouts, "{app:orders/42}:fair:timeouts");
        assert_eq!(k.record, None);
        let e = Keys::election("app:", &name);
        assert_eq!(e.lock, "{app:orders/42}:elect");
        assert_eq!(e.record.as_deref(), Some("{app:orders/42}:elect:leader"));
        let slot_of = slot(&k.lock);
        for key in [
            &k.queue,
            &k.timeouts,
            &e.lock,
            &e.fence,
            &e.channel,
            &e.queue,
            &e.timeouts,
        ] {
            assert_eq!(slot(key), slot_of, "{key}");
        }
        for (mine, theirs) in [
            (&e.lock, &k.lock),
            (&e.fence, &k.fence),
            (&e.channel, &k.channel),
        ] {
            assert_ne!(mine, theirs);
        }
    }

    /// CRC16/XMODEM as Redis Cluster computes it.
    fn crc16(data: &[u8]) -> u16 {
        let mut crc: u16 = 0;
        for byte in data {
            crc ^= u16::from(*byte) << 8;
            for _ in 0..8 {
                crc = if crc & 0x8000 != 0 {
                    (crc << 1) ^ 0x1021
                } else {
                    crc << 1
                };
            }
        }
        crc
    }

    /// The key's slot, honouring a `{hash tag}`.
    fn slot(key: &str) -> u16 {
        let hashed = key
            .find('{')
            .and_then(|open| {
                let close = key[open + 1..].find('}')? + open + 1;
                (close > open + 1).then(|| &key[open + 1..close])
            })
            .unwrap_or(key);
        crc16(hashed.as_bytes()) % 16384
    }

    #[test]
    fn tokens_are_128_bit_hex_and_unique() {
        let a = new_token();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a, new_token());
    }
}
