//! The Redlock mutex: one acquire round on every master in parallel, the
//! fencing token from the quorum's counters (written back when they differ),
//! renewal and release on every master, waiting on every master's release
//! channel. The reasoning is in the [`RedlockProvider`](super::RedlockProvider) docs.

use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::backend::{clock_drift, Cleanup, CleanupGuard, LeaseBackend};
use distlock_core::{Error, LeaseOptions, Lock, LockGuard, Name, Result, Wait};
use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use redis::{Cmd, FromRedisValue, Script};
use tokio::time::{sleep_until, timeout_at, Instant, Sleep};

use super::Shared;
use crate::keys::Keys;
use crate::lease::{guard_parts, new_token, pause_before_retry, retried};
use crate::scripts::{REDLOCK_ACQUIRE, REDLOCK_EXTEND, REDLOCK_RAISE, RELEASE};
use crate::wake::subscriber::Subscription;

/// The keys of one Redlock mutex, the same on every master.
#[derive(Clone, Debug)]
pub(crate) struct RedlockKeys {
    /// prefix + name, exactly as the single-master mutex's (and redis-py's).
    pub(crate) lock: String,
    /// `{lock}:redlock:fence`, this master's fencing counter.
    pub(crate) fence: String,
    /// `{lock}:released`, the release channel (the single-master mutex's).
    pub(crate) channel: String,
    /// `{lock}:holder`, the holder record (the single-master mutex's), for
    /// inspect: lock = our token, fence = this master's counter, at, owner.
    pub(crate) holder: String,
    /// The single-master fair mutex's queue, its deadlines and its waiters'
    /// owners: never written by Redlock; the release and force-release
    /// scripts take them (and find them empty).
    pub(crate) queue: String,
    pub(crate) timeouts: String,
    pub(crate) owners: String,
}

impl RedlockKeys {
    pub(crate) fn new(prefix: &str, name: &Name) -> RedlockKeys {
        let keys = Keys::lock(prefix, name);
        RedlockKeys {
            fence: format!("{{{}}}:redlock:fence", keys.lock),
            channel: keys.channel,
            holder: keys.holder,
            queue: keys.queue,
            timeouts: keys.timeouts,
            owners: keys.owners,
            lock: keys.lock,
        }
    }
}

/// A mutex over the provider's independent masters.
pub(crate) struct RedlockMutex {
    pub(crate) shared: Arc<Shared>,
    pub(crate) name: Name,
    pub(crate) keys: Arc<RedlockKeys>,
    pub(crate) lease: LeaseOptions,
}

impl fmt::Debug for RedlockMutex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockMutex")
            .field("name", &self.name)
            .field("key", &self.keys.lock)
            .field("masters", &self.shared.masters.len())
            .finish_non_exhaustive()
    }
}

/// One master's answer to the acquire script.
#[derive(Debug)]
enum Reply {
    /// Taken; the master's counter is now this.
    Took(u64),
    /// Held by someone else, who has this long left there.
    Busy(Option<Duration>),
    /// Already holds this attempt's token (a resent script): taken, but its
    /// counter is unknown, so it cannot count.
    AlreadyOurs,
    /// Refused or unanswered: the script may or may not have run.
    Failed(Error),
}

/// Why an attempt did not give a guard, and what it leaves to undo.
struct Missed {
    /// Masters whose lock key may hold this attempt's token and that
    /// answered (undone at once).
    answered: Vec<usize>,
    /// Masters that did not answer or failed: their key may hold the token
    /// (a lost reply), undone in the background, retried.
    unknown: Vec<usize>,
    /// The attempt took at least one master: it split with others.
    took_some: bool,
    /// The earliest a holder's key runs out on a master that answered busy.
    remaining: Option<Duration>,
    /// Set when the outcome is an error rather than "held elsewhere": fewer
    /// than a quorum answered, or a master refused the script.
    error: Option<Error>,
}

enum Attempt {
    Won(u64),
    Missed(Missed),
}

/// `ttl − elapsed − drift > 0`, in checked arithmetic: the Redlock validity
/// of an acquisition or renewal whose round started at `started`.
pub(crate) fn still_valid(started: Instant, ttl: Duration) -> bool {
    valid_after(started.elapsed(), ttl)
}

/// `ttl − elapsed − drift > 0`, never panicking.
fn valid_after(elapsed: Duration, ttl: Duration) -> bool {
    ttl.checked_sub(elapsed)
        .and_then(|left| left.checked_sub(clock_drift(ttl)))
        .is_some_and(|left| !left.is_zero())
}

/// A random number in `0..=bound` (128 fresh random bits from `uuid`).
fn random_up_to(bound: u64) -> u64 {
    let bits = uuid::Uuid::new_v4().as_u128();
    let low = u64::try_from(bits & u128::from(u64::MAX)).unwrap_or(0);
    low % bound.saturating_add(1).max(1)
}

impl RedlockMutex {
    fn classify(&self, reply: Result<(i64, i64)>) -> Reply {
        match reply {
            Ok((1, counter)) => u64::try_from(counter).map_or_else(
                |_| {
                    Reply::Failed(Error::server(
                        "redis",
                        "redlock acquire script returned a negative counter",
                    ))
                },
                Reply::Took,
            ),
            Ok((0, left)) => Reply::Busy(u64::try_from(left).ok().map(Duration::from_millis)),
            Ok((2, _)) => Reply::AlreadyOurs,
            Ok((-1, _)) => Reply::Failed(conflict(&self.keys.lock, "lock (a string key)")),
            Ok((-2, _)) => Reply::Failed(conflict(&self.keys.fence, "fencing counter")),
            Ok((-3, _)) => Reply::Failed(Error::Exhausted {
                name: self.keys.fence.clone(),
            }),
            Ok(_) => Reply::Failed(Error::server(
                "redis",
                "redlock acquire script gave an unknown reply",
            )),
            Err(e) => Reply::Failed(e),
        }
    }

    /// Runs the acquire script on every master in parallel; stops when all
    /// answered or failed, when a quorum took the lock, when a quorum
    /// answered and the lock is decided to be held elsewhere, or when the
    /// response timeout passed. `None`: no answer (yet). The round comes
    /// back with the masters still to answer.
    async fn ask_all(
        &self,
        lease: &Arc<RedlockLease>,
        started: Instant,
    ) -> (Vec<Option<Reply>>, Round<(i64, i64)>) {
        let shared = &self.shared;
        let mut cmd = evalsha(
            &REDLOCK_ACQUIRE,
            &[&self.keys.lock, &self.keys.fence, &self.keys.holder],
        );
        cmd.arg(&lease.token)
            .arg(self.lease.ttl_millis())
            .arg(&shared.owner)
            .arg(shared.options.fence_ttl_ms(self.lease.ttl_millis()));
        let all: Vec<usize> = (0..shared.masters.len()).collect();
        let mut round = lease.round("acquire", &all, &REDLOCK_ACQUIRE, cmd, started);
        let n = all.len();
        let quorum = shared.quorum;
        let mut replies: Vec<Option<Reply>> = (0..n).map(|_| None).collect();
        // `answered`: took, busy or already ours (a definite answer);
        // `collected`: those and the failures.
        let (mut took, mut answered, mut collected) = (0, 0, 0);
        while took < quorum && !(answered >= quorum && took + (n - collected) < quorum) {
            let Some((i, reply)) = round.next().await else {
                break;
            };
            let reply = self.classify(reply);
            collected += 1;
            match reply {
                Reply::Took(_) => {
                    took += 1;
                    answered += 1;
                }
                Reply::Busy(_) | Reply::AlreadyOurs => answered += 1,
                Reply::Failed(_) => {}
            }
            replies[i] = Some(reply);
        }
        (replies, round)
    }

    /// One acquisition attempt: the acquire round, the write-back of the
    /// token if the quorum's counters differ, the validity check.
    async fn attempt(&self, lease: &Arc<RedlockLease>, started: Instant) -> Attempt {
        let shared = &self.shared;
        let quorum = shared.quorum;
        let (replies, stragglers) = self.ask_all(lease, started).await;
        // Their acquire went out with the others (or never will): what they
        // answer is known to nobody (counted as unknown below, and undone if
        // the attempt misses). Dropped, not finished in the background: a
        // call still waiting for its connection (a reconnect) could send the
        // script after our release or undo and leave our key until its TTL.
        drop(stragglers);
        let took: Vec<(usize, u64)> = replies
            .iter()
            .enumerate()
            .filter_map(|(i, r)| match r {
                Some(Reply::Took(c)) => Some((i, *c)),
                _ => None,
            })
            .collect();
        let mut error: Option<Error> = None;
        if took.len() >= quorum {
            let token = took.iter().map(|(_, c)| *c).max().unwrap_or(0);
            let mut holding = took.iter().filter(|(_, c)| *c == token).count();
            if holding < quorum {
                let behind: Vec<usize> = took
                    .iter()
                    .filter(|(_, c)| *c < token)
                    .map(|(i, _)| *i)
                    .collect();
                let mut cmd = evalsha(&REDLOCK_RAISE, &[&self.keys.lock, &self.keys.fence]);
                cmd.arg(&lease.token)
                    .arg(token.to_string())
                    .arg(shared.options.fence_ttl_ms(self.lease.ttl_millis()));
                let mut round = lease.round(
                    "raise fencing token",
                    &behind,
                    &REDLOCK_RAISE,
                    cmd,
                    Instant::now(),
                );
                while let Some((_, reply)) = round.next().await {
                    match reply {
                        Ok(1) => holding += 1,
                        Ok(-2) => {
                            error.get_or_insert_with(|| {
                                conflict(&self.keys.fence, "fencing counter")
                            });
                        }
                        // Not ours any more there (expired): does not count.
                        Ok(_) => {}
                        // Unknown: does not count; a retry settles it.
                        Err(e) if e.is_retryable() => {}
                        Err(e) => {
                            error.get_or_insert(e);
                        }
                    }
                }
            }
            if holding >= quorum && error.is_none() && still_valid(started, self.lease.ttl()) {
                return Attempt::Won(token);
            }
        }
        let mut missed = Missed {
            answered: Vec::new(),
            unknown: Vec::new(),
            took_some: false,
            remaining: None,
            error,
        };
        let mut answers = 0;
        let mut first_failure = None;
        for (i, reply) in replies.into_iter().enumerate() {
            match reply {
                Some(Reply::Took(_)) | Some(Reply::AlreadyOurs) => {
                    answers += 1;
                    missed.took_some = true;
                    missed.answered.push(i);
                }
                Some(Reply::Busy(left)) => {
                    answers += 1;
                    if let Some(left) = left {
                        missed.remaining = Some(missed.remaining.map_or(left, |r| r.min(left)));
                    }
                }
                Some(Reply::Failed(e)) => {
                    missed.unknown.push(i);
                    if !e.is_retryable() {
                        missed.error.get_or_insert(e);
                    } else if first_failure.is_none() {
                        first_failure = Some(e);
                    }
                }
                None => missed.unknown.push(i),
            }
        }
        if answers < quorum && missed.error.is_none() {
            // No quorum could even be asked: an outage, not contention.
            missed.error = Some(first_failure.unwrap_or(Error::Timeout {
                operation: "acquire",
                after: shared.options.response_timeout,
            }));
        }
        Attempt::Missed(missed)
    }

    /// Undoes a missed attempt: at once on the masters that answered, in the
    /// background (retried) on the others and on any that fails now. The
    /// armed `undo` (every master) stays armed until this has handed over,
    /// so a cancellation here still undoes everything.
    async fn undo_missed(
        &self,
        undo: &mut CleanupGuard,
        lease: &Arc<RedlockLease>,
        missed: &Missed,
        expires: Instant,
    ) {
        let mut later = missed.unknown.clone();
        for (i, reply) in lease.release_on("undo acquire", &missed.answered).await {
            if reply.is_err() {
                later.push(i);
            }
        }
        if !later.is_empty() {
            let mut rest = CleanupGuard::arm_on(
                undo.handle().clone(),
                "undo redlock acquire",
                Arc::new(UndoOn {
                    lease: Arc::clone(lease),
                    masters: later,
                    expires,
                }),
            );
            rest.run_in_background();
        }
        undo.disarm();
    }

    /// Subscribes to the release channel on every master, in parallel; a
    /// master whose subscriber does not answer within the response timeout
    /// (or by the deadline) is not listened to in this acquisition.
    async fn subscribe_all(&self, deadline: Option<Instant>) -> Vec<Subscription> {
        let mut until = Instant::now() + self.shared.options.response_timeout;
        if let Some(d) = deadline {
            until = until.min(d);
        }
        let subscribing = self.shared.masters.iter().map(|m| {
            let mut sub = m.subscriber.subscribe(self.keys.channel.clone());
            timeout_at(until, async move {
                sub.ready().await;
                sub
            })
        });
        futures::future::join_all(subscribing)
            .await
            .into_iter()
            .filter_map(std::result::Result::ok)
            .collect()
    }
}

fn conflict(key: &str, expected: &'static str) -> Error {
    Error::Conflict {
        what: format!("redis key {key:?}"),
        expected,
    }
}

/// Resolves when any of `subscriptions` is woken; never when there is none.
async fn any_woken(subscriptions: &mut [Subscription]) {
    if subscriptions.is_empty() {
        return std::future::pending().await;
    }
    let waits = subscriptions.iter_mut().map(|s| Box::pin(s.changed()));
    let _ = futures::future::select_all(waits).await;
}

#[async_trait]
impl Lock for RedlockMutex {
    fn name(&self) -> &Name {
        &self.name
    }

    fn backend(&self) -> &'static str {
        "redis+redlock"
    }

    fn kind(&self) -> distlock_core::PrimitiveKind {
        distlock_core::PrimitiveKind::Mutex
    }

    async fn acquire(&self, wait: Wait) -> Result<Option<LockGuard>> {
        tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let shared = &self.shared;
        shared.lifecycle.check_open()?;
        let deadline = wait.deadline();
        let timeout = shared.options.response_timeout;
        let mut subscriptions: Option<Vec<Subscription>> = None;
        let mut pause = Duration::from_millis(20);
        loop {
            shared.lifecycle.check_open()?;
            // Taken before the first master is asked: the lease's validity
            // (and the guard's deadline) counts from here.
            let started = Instant::now();
            let lease = Arc::new(RedlockLease {
                shared: Arc::clone(shared),
                keys: Arc::clone(&self.keys),
                token: new_token(),
                name: self.name.clone(),
                fence: std::sync::atomic::AtomicU64::new(0),
                rounds: std::sync::atomic::AtomicU64::new(0),
            });
            let expires = started
                .checked_add(self.lease.ttl() + timeout)
                .unwrap_or(started);
            let mut undo = CleanupGuard::arm(
                "undo redlock acquire",
                Arc::new(UndoOn {
                    lease: Arc::clone(&lease),
                    masters: (0..shared.masters.len()).collect(),
                    expires,
                }),
            )?;
            let missed = match Box::pin(self.attempt(&lease, started)).await {
                Attempt::Won(token) => {
                    undo.disarm();
                    tracing::debug!(name = %self.name, token, "distlock redlock acquired");
                    lease.fence.store(token, Ordering::SeqCst);
                    // The core's deadline is acquired_at + TTL − drift:
                    // exactly the end of the Redlock validity.
                    let parts =
                        guard_parts(&self.name, token, self.lease, started, &shared.lifecycle);
                    return LockGuard::new(parts, lease as Arc<dyn LeaseBackend>).map(Some);
                }
                Attempt::Missed(missed) => missed,
            };
            self.undo_missed(&mut undo, &lease, &missed, expires).await;
            if let Some(e) = missed.error {
                if e.is_retryable()
                    && wait != Wait::No
                    && pause_before_retry(deadline, &mut pause).await
                {
                    continue;
                }
                return Err(e);
            }
            pause = Duration::from_millis(20);
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(None);
            }
            if missed.took_some {
                // A split (nobody has a quorum, or we lost ours): try again
                // after a random pause, so that two contenders do not split
                // again in lockstep; not woken by the release messages of
                // the other party's undo.
                let round = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                let recheck =
                    u64::try_from(shared.options.recheck_interval.as_micros()).unwrap_or(u64::MAX);
                let bound = round.saturating_mul(4).max(5_000).min(recheck);
                let mut wake = now + Duration::from_micros(random_up_to(bound));
                if let Some(d) = deadline {
                    wake = wake.min(d);
                }
                tokio::select! {
                    () = sleep_until(wake) => {}
                    () = shared.lifecycle.closed() => return Err(Error::Closed),
                }
                continue;
            }
            let Some(subs) = &mut subscriptions else {
                // Subscribe, then try again at once: a release between the
                // attempt and the subscription is not missed.
                subscriptions = Some(self.subscribe_all(deadline).await);
                continue;
            };
            let mut wake = now + shared.options.recheck_interval;
            if let Some(left) = missed.remaining {
                wake = wake.min(now + left + Duration::from_millis(1));
            }
            if let Some(d) = deadline {
                wake = wake.min(d);
            }
            tokio::select! {
                () = any_woken(subs) => {}
                () = sleep_until(wake) => {}
                () = shared.lifecycle.closed() => return Err(Error::Closed),
            }
        }
    }
}

/// Undoes an acquire attempt on some masters: compare-and-delete of the
/// attempt's token (on the master's one connection, so after the attempt),
/// retried while retryable until the attempt's key would have expired anyway.
struct UndoOn {
    lease: Arc<RedlockLease>,
    masters: Vec<usize>,
    /// When the attempt was sent plus its TTL and a response timeout.
    expires: Instant,
}

impl UndoOn {
    async fn on(&self, i: usize) -> Result<()> {
        retried(
            || self.expires,
            || async {
                match self.lease.release_on("undo acquire", &[i]).await.pop() {
                    Some((_, Err(e))) => Err(e),
                    None | Some((_, Ok(_))) => Ok(()),
                }
            },
        )
        .await
    }
}

#[async_trait]
impl Cleanup for UndoOn {
    async fn clean_up(&self) -> Result<()> {
        let results = futures::future::join_all(self.masters.iter().map(|&i| self.on(i))).await;
        results.into_iter().find(Result::is_err).unwrap_or(Ok(()))
    }
}

/// One held Redlock lease: the lock key on every master, with our token.
pub(crate) struct RedlockLease {
    shared: Arc<Shared>,
    keys: Arc<RedlockKeys>,
    token: String,
    name: Name,
    /// The guard's fencing token once decided (0 before), which renewals
    /// write into the holder records.
    fence: std::sync::atomic::AtomicU64,
    /// Renewals sent so far: each carries its number, and a master keeps
    /// the latest, so a straggler that lands after a later renewal changes
    /// nothing (`redlock_extend.lua`).
    rounds: std::sync::atomic::AtomicU64,
}

impl RedlockLease {
    /// Starts one script (`cmd`, an `EVALSHA` of `script`) on the masters
    /// `which`, in parallel, bounded as a whole by the response timeout
    /// from `started`.
    fn round<T: FromRedisValue + Send + 'static>(
        &self,
        operation: &'static str,
        which: &[usize],
        script: &'static Script,
        cmd: Cmd,
        started: Instant,
    ) -> Round<T> {
        let timeout = self.shared.options.response_timeout;
        let once = Arc::new(AtomicBool::new(false));
        let cmd = Arc::new(cmd);
        let pending = which
            .iter()
            .map(|&i| {
                let shared = Arc::clone(&self.shared);
                let (cmd, once) = (Arc::clone(&cmd), Arc::clone(&once));
                let call: BoxFuture<'static, (usize, Result<T>)> = Box::pin(async move {
                    let master = &shared.masters[i];
                    let reply = master.eval(operation, timeout, script, &cmd, &once);
                    (i, reply.await)
                });
                call
            })
            .collect();
        Round {
            pending,
            once,
            until: Box::pin(sleep_until(started.checked_add(timeout).unwrap_or(started))),
            operation,
            timeout,
        }
    }

    /// Compare-and-delete with a release message on the masters `which`,
    /// waiting for all of them (a master that does not answer in time gives
    /// [`Error::Timeout`]).
    async fn release_on(
        &self,
        operation: &'static str,
        which: &[usize],
    ) -> Vec<(usize, Result<i64>)> {
        let cmd = self.release_cmd();
        self.round(operation, which, &RELEASE, cmd, Instant::now())
            .all(which)
            .await
    }

    /// Compare-and-delete of the lock key (and its holder record) with a
    /// release message, as the single-master mutex's.
    fn release_cmd(&self) -> Cmd {
        let k = &self.keys;
        let mut cmd = evalsha(
            &RELEASE,
            &[&k.lock, &k.queue, &k.timeouts, &k.holder, &k.owners],
        );
        cmd.arg(&self.token).arg(&k.channel);
        cmd
    }

    fn all(&self) -> Vec<usize> {
        (0..self.shared.masters.len()).collect()
    }
}

#[async_trait]
impl LeaseBackend for RedlockLease {
    async fn renew(&self, ttl: Duration) -> Result<()> {
        let started = Instant::now();
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let mut cmd = evalsha(
            &REDLOCK_EXTEND,
            &[&self.keys.lock, &self.keys.holder, &self.keys.fence],
        );
        cmd.arg(&self.token)
            .arg(ms)
            .arg(self.fence.load(Ordering::SeqCst))
            .arg(self.rounds.fetch_add(1, Ordering::SeqCst) + 1)
            .arg(self.shared.options.fence_ttl_ms(ms));
        let n = self.shared.masters.len();
        let quorum = self.shared.quorum;
        let mut round = self.round("renew", &self.all(), &REDLOCK_EXTEND, cmd, started);
        let (mut renewed, mut not_ours, mut first_error) = (0, 0, None);
        // Decided once a quorum renewed or can no longer renew; the others
        // finish in the background.
        while renewed < quorum && not_ours <= n - quorum {
            let Some((_, reply)) = round.next().await else {
                break;
            };
            match reply {
                Ok(1) => renewed += 1,
                Ok(_) => not_ours += 1,
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        round.detach();
        if renewed >= quorum {
            if still_valid(started, ttl) {
                return Ok(());
            }
            return Err(Error::Timeout {
                operation: "renew (the round outlasted the lease's validity)",
                after: ttl,
            });
        }
        if not_ours > n - quorum {
            // A quorum can no longer be ours.
            return Err(Error::not_held(self.name.as_str()));
        }
        Err(first_error.unwrap_or(Error::Timeout {
            operation: "renew",
            after: self.shared.options.response_timeout,
        }))
    }

    async fn release(&self) -> Result<()> {
        let cmd = self.release_cmd();
        let n = self.shared.masters.len();
        let quorum = self.shared.quorum;
        let mut round = self.round("release", &self.all(), &RELEASE, cmd, Instant::now());
        let (mut released, mut answered, mut first_error) = (0, 0, None);
        // Done once a quorum had our token (the lock was ours, and is now
        // free for a quorum); the others finish in the background. Fewer
        // than a quorum means the lock was not ours any more (expired, or
        // taken): the stragglers' keys are cleaned up all the same, and the
        // release is `NotHeld`.
        while released < quorum && answered < n {
            let Some((_, reply)) = round.next().await else {
                break;
            };
            match reply {
                Ok(1) => {
                    released += 1;
                    answered += 1;
                }
                Ok(_) => answered += 1,
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        round.detach_resending();
        if released >= quorum {
            return Ok(());
        }
        if answered == n || released + (n - answered) < quorum {
            return Err(Error::not_held(self.name.as_str()));
        }
        Err(first_error.unwrap_or(Error::Timeout {
            operation: "release",
            after: self.shared.options.response_timeout,
        }))
    }

    fn response_timeout(&self) -> Option<Duration> {
        Some(self.shared.options.response_timeout)
    }
}

/// `EVALSHA` of `script` with `keys` (arguments to be added).
pub(crate) fn evalsha(script: &Script, keys: &[&str]) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(keys.len());
    for key in keys {
        cmd.arg(*key);
    }
    cmd
}

/// One parallel round of a script on some masters, with one timer.
pub(crate) struct Round<T> {
    pending: FuturesUnordered<BoxFuture<'static, (usize, Result<T>)>>,
    /// Set when a renewal round is left to finish in the background: its
    /// calls then never send their script a second time (see
    /// [`Master::eval`](super::Master)).
    once: Arc<AtomicBool>,
    until: Pin<Box<Sleep>>,
    operation: &'static str,
    timeout: Duration,
}

impl<T: Send + 'static> Round<T> {
    /// The next answer; `None` once all answered or the round's time is up.
    async fn next(&mut self) -> Option<(usize, Result<T>)> {
        if self.pending.is_empty() {
            return None;
        }
        tokio::select! {
            biased;
            next = self.pending.next() => next,
            () = self.until.as_mut() => None,
        }
    }

    /// Every answer of `which`: a master that did not answer in time gives
    /// [`Error::Timeout`].
    async fn all(mut self, which: &[usize]) -> Vec<(usize, Result<T>)> {
        let mut out = Vec::with_capacity(which.len());
        while let Some(reply) = self.next().await {
            out.push(reply);
        }
        for &i in which {
            if !out.iter().any(|(j, _)| *j == i) {
                out.push((
                    i,
                    Err(Error::Timeout {
                        operation: self.operation,
                        after: self.timeout,
                    }),
                ));
            }
        }
        out
    }

    /// Lets the masters that have not answered finish in a background task
    /// (until the round's time is up), never sending a script twice: their
    /// commands went out with the round, in order on each master's
    /// connection, so whatever the caller sends next lands after them. For
    /// renewals.
    fn detach(self) {
        self.once.store(true, Ordering::SeqCst);
        self.finish_in_background();
    }

    /// As [`Round::detach`], but a call that meets `NOSCRIPT` still loads
    /// the script and sends again: for releases, which must land (else our
    /// key stays until its TTL) and are harmless late.
    fn detach_resending(self) {
        self.finish_in_background();
    }

    /// Drains the calls still waiting in a spawned task, until the round's
    /// time is up.
    fn finish_in_background(self) {
        if self.pending.is_empty() {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Round {
            mut pending, until, ..
        } = self;
        drop(handle.spawn(async move {
            let drain = async { while pending.next().await.is_some() {} };
            let _ = tokio::time::timeout_at(until.deadline(), drain).await;
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_the_mutexs_lock_key_and_channel_with_a_redlock_counter() {
        let k = RedlockKeys::new("app:", &Name::new("orders/42").unwrap());
        assert_eq!(k.lock, "app:orders/42");
        assert_eq!(k.fence, "{app:orders/42}:redlock:fence");
        assert_eq!(k.channel, "{app:orders/42}:released");
    }

    #[test]
    fn validity_is_ttl_minus_elapsed_minus_drift_and_never_panics() {
        let ttl = Duration::from_millis(1000);
        // drift = 10 ms + 2 ms: valid while elapsed < 988 ms.
        assert!(valid_after(Duration::from_millis(987), ttl));
        assert!(!valid_after(Duration::from_millis(988), ttl));
        assert!(!valid_after(Duration::from_secs(3600), ttl));
        assert!(!valid_after(Duration::MAX, ttl));
        assert!(!valid_after(Duration::ZERO, Duration::ZERO));
        assert!(!valid_after(Duration::ZERO, Duration::from_millis(2)));
        assert!(valid_after(Duration::ZERO, Duration::MAX));
        assert!(!valid_after(Duration::MAX, Duration::MAX));
    }

    #[test]
    fn jitter_stays_in_bounds() {
        for bound in [0, 1, 7, 5_000, u64::MAX] {
            for _ in 0..100 {
                assert!(random_up_to(bound) <= bound);
            }
        }
    }
}
