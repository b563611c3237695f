//! The Redis read-write lock, and the queued acquisition it shares with the
//! semaphore.
//!
//! Both are "holders plus a queue" over five keys in one Cluster slot (see
//! the crate docs' key layout): holders with their own tokens and expiries,
//! a FIFO queue of waiters whose entries expire unless refreshed, and a
//! fencing counter. One Lua script decides an attempt atomically (purging
//! expired holders and dead waiters first); a waiter sleeps until a wake-up
//! addressed to it, the earliest expiry the script reported, or the recheck
//! interval.
//!
//! Wake-ups: every script that changes who may get in (a release, a waiter
//! leaving, a purge of expired holders or dead waiters) compares the queued
//! waiters an attempt would admit before and after, and publishes
//! `to:<waiter id>` for each one newly let in. A waiter subscribes under its
//! queue id ([`Subscriber::subscribe_as`](crate::wake::subscriber::Subscriber)),
//! so the message wakes exactly that waiter on whichever provider it waits:
//! one wake-up per admission across all providers.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::backend::{
    with_timeout, Cleanup, CleanupGuard, GuardParts, LeaseBackend, LeaseSignal, LeaseTerms,
};
use distlock_core::{Error, LeaseOptions, Lock, LockGuard, Name, ReadWriteLock, Result, Wait};
use redis::{Script, ScriptInvocation};
use tokio::time::{sleep_until, Instant};

use crate::context::Shared;
use crate::mutex::{check_acked, kind_refusal, Keys};
use crate::net::{Pinned, Sticky};
use crate::scripts::{RW_ACQUIRE, RW_EXTEND, RW_RELEASE, SEM_ACQUIRE, SEM_EXTEND, SEM_RELEASE};

/// What a queued acquisition asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    /// A read share of a read-write lock.
    Read,
    /// The write side of a read-write lock.
    Write,
    /// One permit of a semaphore of this many.
    Permit(u32),
}

/// One primitive's keys, channel and scripts.
pub(crate) struct Recipe {
    pub(crate) name: Name,
    /// KEYS[1..=7] of every script: the exclusive key (writer / permits),
    /// the holders, the queue, the queue entries' expiries, the fencing
    /// counter, the holder records (hash), the waiters' owners (hash).
    pub(crate) keys: [String; 7],
    /// KEYS[8] of the acquire, release, extend and force scripts: the
    /// mutex's lock key of the name (prefix + name), checked for other kinds
    /// and holding this kind's marker while it has holders (`kind.lua`).
    pub(crate) lock: String,
    pub(crate) channel: String,
    pub(crate) side: Side,
    /// The script argument after the channel: `r`, `w` or the number of
    /// permits.
    mode: String,
}

impl Recipe {
    /// The recipe of `side` of `name`: `{lock}:rw:…` keys for a read-write
    /// lock's sides, `{lock}:sem:…` for a semaphore.
    pub(crate) fn new(prefix: &str, name: Name, side: Side) -> Recipe {
        let lock = Keys::new(prefix, &name).lock;
        let kind = if matches!(side, Side::Permit(_)) {
            "sem"
        } else {
            "rw"
        };
        let key = |suffix: &str| format!("{{{lock}}}:{kind}:{suffix}");
        let first = if kind == "sem" { "permits" } else { "writer" };
        let channel = key("released");
        Recipe {
            name,
            keys: [
                key(first),
                key(if kind == "sem" { "holders" } else { "readers" }),
                key("queue"),
                key("alive"),
                key("fence"),
                key("info"),
                key("owners"),
            ],
            lock,
            channel,
            side,
            mode: match side {
                Side::Read => "r".to_owned(),
                Side::Write => "w".to_owned(),
                Side::Permit(n) => n.to_string(),
            },
        }
    }

    fn scripts(&self) -> [&'static Script; 3] {
        match self.side {
            Side::Permit(_) => [&*SEM_ACQUIRE, &*SEM_RELEASE, &*SEM_EXTEND],
            Side::Read | Side::Write => [&*RW_ACQUIRE, &*RW_RELEASE, &*RW_EXTEND],
        }
    }

    fn invocation(&self, script: &'static Script) -> ScriptInvocation<'static> {
        let mut invocation = script.prepare_invoke();
        for key in &self.keys {
            invocation.key(key);
        }
        invocation.key(&self.lock);
        invocation
    }

    fn member_prefix(&self) -> &'static str {
        match self.side {
            Side::Read => "r:",
            Side::Write => "w:",
            Side::Permit(_) => "",
        }
    }

    fn conflict(&self, index: i64) -> Error {
        let (key, expected) = match index {
            1 if matches!(self.side, Side::Permit(_)) => (&self.keys[0], "permits (a string key)"),
            1 => (&self.keys[0], "writer (a string key)"),
            2 => (&self.keys[1], "holders (a sorted set)"),
            3 => (&self.keys[2], "queue (a sorted set)"),
            4 => (&self.keys[3], "queue entries (a sorted set)"),
            6 => (&self.keys[5], "holder records (a hash)"),
            7 => (&self.keys[6], "waiters' owners (a hash)"),
            _ => (&self.keys[4], "fencing counter"),
        };
        Error::Conflict {
            what: format!("redis key {key:?}"),
            expected,
        }
    }
}

/// 128 random bits as 32 hex digits.
fn new_token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// A queued acquisition: the read or write side of a read-write lock, or a
/// semaphore.
pub(crate) struct Queued {
    pub(crate) shared: Arc<Shared>,
    pub(crate) recipe: Arc<Recipe>,
    pub(crate) lease: LeaseOptions,
}

impl fmt::Debug for Queued {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Queued")
            .field("name", &self.recipe.name)
            .field("side", &self.recipe.side)
            .field("holders", &self.recipe.keys[1])
            .finish_non_exhaustive()
    }
}

enum Attempt {
    /// Admitted with this fencing token.
    Acquired(u64),
    /// Not admitted; re-check within this (an expiry that may change the
    /// answer).
    Waiting(Option<Duration>),
    /// The attempt token already holds: a resent attempt, its fencing token
    /// unknown.
    AlreadyOurs,
}

/// Sleeps before another attempt after a retryable failure while waiting;
/// `false` when that would pass the deadline.
async fn pause_before_retry(deadline: Option<Instant>, pause: &mut Duration) -> bool {
    let until = Instant::now() + *pause;
    if deadline.is_some_and(|d| d <= until) {
        return false;
    }
    sleep_until(until).await;
    *pause = (*pause * 2).min(Duration::from_millis(500));
    true
}

impl Queued {
    /// How long a queue entry lives unless refreshed: a waiter refreshes it
    /// at every attempt, at least every recheck interval.
    fn entry_ttl(&self) -> Duration {
        self.shared.options.recheck_interval * 2 + self.shared.options.response_timeout
    }

    async fn attempt(
        &self,
        conn: &Pinned,
        token: &str,
        member: &str,
        queue: bool,
    ) -> Result<Attempt> {
        let recipe = &self.recipe;
        let mut invocation = recipe.invocation(recipe.scripts()[0]);
        invocation
            .arg(token)
            .arg(self.lease.ttl_millis())
            .arg(member)
            .arg(if queue { "1" } else { "0" })
            .arg(u64::try_from(self.entry_ttl().as_millis()).unwrap_or(u64::MAX))
            .arg(&recipe.mode)
            .arg(&recipe.channel)
            .arg(&self.shared.owner);
        let ((status, value), acked): ((i64, i64), _) = conn
            .script_acked(
                "acquire",
                self.shared.options.response_timeout,
                &invocation,
                self.shared.options.wait,
            )
            .await?;
        match status {
            1 => {
                check_acked(&self.shared, &self.recipe.name, "acquisition", acked)?;
                u64::try_from(value)
                    .map(Attempt::Acquired)
                    .map_err(|_| Error::server("redis", "acquire script returned a negative token"))
            }
            0 => Ok(Attempt::Waiting(
                u64::try_from(value).ok().map(Duration::from_millis),
            )),
            2 => Ok(Attempt::AlreadyOurs),
            -1 => Err(recipe.conflict(value)),
            -3 => Err(Error::Exhausted {
                name: recipe.keys[4].clone(),
            }),
            -5 => Err(kind_refusal(
                &recipe.name,
                &recipe.lock,
                value,
                match recipe.side {
                    Side::Permit(_) => "semaphore",
                    Side::Read | Side::Write => "read-write lock",
                },
            )),
            -4 => Err(Error::PermitsMismatch {
                name: recipe.name.to_string(),
                held: u32::try_from(value).unwrap_or(0),
                asked: match recipe.side {
                    Side::Permit(n) => n,
                    Side::Read | Side::Write => 0,
                },
            }),
            _ => Err(recipe.conflict(5)),
        }
    }

    fn lease_on(&self, token: String, conn: &Pinned) -> Arc<QueuedLease> {
        Arc::new(QueuedLease {
            shared: Arc::clone(&self.shared),
            recipe: Arc::clone(&self.recipe),
            token,
            conn: Sticky::new(Some(conn)),
        })
    }
}

#[async_trait]
impl Lock for Queued {
    fn name(&self) -> &Name {
        &self.recipe.name
    }

    fn backend(&self) -> &'static str {
        "redis"
    }

    fn kind(&self) -> distlock_core::PrimitiveKind {
        match self.recipe.side {
            Side::Permit(_) => distlock_core::PrimitiveKind::Semaphore,
            Side::Read | Side::Write => distlock_core::PrimitiveKind::ReadWrite,
        }
    }

    #[allow(clippy::too_many_lines)]
    async fn acquire(&self, wait: Wait) -> Result<Option<LockGuard>> {
        tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let shared = &self.shared;
        shared.lifecycle.check_open()?;
        let deadline = wait.deadline();
        let timeout = shared.options.response_timeout;
        let queue = wait != Wait::No;
        let member = format!("{}{}", self.recipe.member_prefix(), new_token());
        let waited = Instant::now();
        let mut subscription = None;
        // Takes our entry out of the server's queue unless disarmed; always
        // on the connection of the latest attempt that may have queued us,
        // so it lands after that attempt.
        let mut place: Option<CleanupGuard> = None;
        // The queue guards of attempts whose outcome is unknown: such an
        // attempt may still land on its connection, so its own guard (on
        // that connection) runs when we leave, whatever the outcome.
        let mut unknown: Vec<CleanupGuard> = Vec::new();
        let mut pause = Duration::from_millis(20);
        loop {
            let started = Instant::now();
            let pinned = match shared.conn()?.pin(timeout).await {
                Ok(pinned) => pinned,
                Err(e) if e.is_retryable() && queue => {
                    if pause_before_retry(deadline, &mut pause).await {
                        continue;
                    }
                    return Err(e);
                }
                Err(e) => return Err(e),
            };
            // A fresh token per attempt: an undo still running for an
            // earlier attempt can never release a later one's hold.
            let lease = self.lease_on(new_token(), &pinned);
            let mut undo = CleanupGuard::arm(
                "undo acquire",
                Arc::new(Undo {
                    lease: Arc::clone(&lease),
                    hold: true,
                    member: None,
                    expires: started + self.lease.ttl() + timeout,
                }),
            )?;
            if queue {
                let next = CleanupGuard::arm(
                    "leave the queue",
                    Arc::new(Undo {
                        lease: Arc::clone(&lease),
                        hold: false,
                        member: Some(member.clone()),
                        expires: started + self.entry_ttl() + timeout,
                    }),
                )?;
                if let Some(mut previous) = place.replace(next) {
                    previous.disarm();
                }
            }
            // Boxed: the attempt's state is large, and a waiter should not
            // carry it while it sleeps between attempts. Bounded by the
            // response timeout even while the client reconnects (which may
            // take its connect timeout), as the mutex's: a deadline is passed
            // by one response timeout at most.
            let attempt = Box::pin(self.attempt(&pinned, &lease.token, &member, queue));
            let result = with_timeout("acquire", timeout, attempt)
                .await
                .and_then(|r| r);
            let recheck = match result {
                Ok(Attempt::Acquired(token)) => {
                    undo.disarm();
                    if let Some(mut place) = place.take() {
                        // The script took us out of the queue.
                        place.disarm();
                    }
                    tracing::debug!(
                        name = %self.recipe.name,
                        side = ?self.recipe.side,
                        owner = %shared.owner,
                        token,
                        waited_us = waited.elapsed().as_micros(),
                        "distlock redis queued lock acquired"
                    );
                    let parts = GuardParts {
                        name: self.recipe.name.clone(),
                        fencing_token: token,
                        signal: LeaseSignal::new(),
                        terms: LeaseTerms::Ttl(self.lease),
                        acquired_at: started,
                        lifecycle: Arc::clone(&shared.lifecycle),
                    };
                    // On error (closed meanwhile) the guard released itself.
                    return LockGuard::new(parts, lease as Arc<dyn LeaseBackend>).map(Some);
                }
                Ok(Attempt::Waiting(recheck)) => {
                    undo.disarm();
                    recheck
                }
                Ok(Attempt::AlreadyOurs) => {
                    let _ = with_timeout("undo acquire", timeout, undo.run_now()).await;
                    continue;
                }
                // Taken but too few replicas have it: the script took us out
                // of the queue; give the hold back before reporting, or
                // queue again (at the back) while waiting.
                Err(e @ Error::NotReplicated { .. }) => {
                    if let Some(mut place) = place.take() {
                        place.disarm();
                    }
                    let _ = with_timeout("undo acquire", timeout, undo.run_now()).await;
                    if queue && pause_before_retry(deadline, &mut pause).await {
                        continue;
                    }
                    return Err(e);
                }
                // Unknown outcome while waiting: `undo` releases the hold if
                // the attempt landed; `place` stays for the queue entry.
                Err(e) if e.is_retryable() && queue => {
                    drop(undo);
                    unknown.extend(place.take());
                    if pause_before_retry(deadline, &mut pause).await {
                        continue;
                    }
                    return Err(e);
                }
                // Both guards stay armed and run in the background:
                // releasing a token nobody holds is harmless.
                Err(e) => return Err(e),
            };
            pause = Duration::from_millis(20);
            let now = Instant::now();
            if !queue || deadline.is_some_and(|d| now >= d) {
                if let Some(mut place) = place.take() {
                    let _ = with_timeout("leave the queue", timeout, place.run_now()).await;
                }
                return Ok(None);
            }
            if subscription.is_none() {
                // Subscribe under our queue id; its confirmation wakes the
                // wait below to try again: a wake-up between the attempt
                // and the subscription is not missed, and a slow
                // confirmation never holds the caller past its deadline.
                subscription = Some(
                    shared
                        .subscriber
                        .subscribe_as(self.recipe.channel.clone(), Arc::from(member.as_str())),
                );
            }
            let mut wake = now + shared.options.recheck_interval;
            if let Some(left) = recheck {
                wake = wake.min(now + left + Duration::from_millis(1));
            }
            if let Some(d) = deadline {
                wake = wake.min(d);
            }
            // The next look: a wake-up addressed to us (a script let us in,
            // or the subscriber reconnected), the earliest expiry, the
            // re-check interval (which also refreshes our queue entry), the
            // caller's deadline.
            if let Some(sub) = &mut subscription {
                tokio::select! {
                    _ = sub.changed() => {}
                    () = sleep_until(wake) => {}
                    () = shared.lifecycle.closed() => return Err(Error::Closed),
                }
            }
        }
    }
}

/// Undoes an acquire attempt whose outcome is unknown (its hold), or takes
/// a waiter out of the queue: on the attempt's connection (so it lands after
/// the attempt), retried until the hold or entry would have expired anyway.
struct Undo {
    lease: Arc<QueuedLease>,
    /// Release the lease's token if it holds.
    hold: bool,
    /// Take this waiter out of the queue.
    member: Option<String>,
    expires: Instant,
}

#[async_trait]
impl Cleanup for Undo {
    async fn clean_up(&self) -> Result<()> {
        let mut pause = Duration::from_millis(20);
        loop {
            match self
                .lease
                .release_as(self.hold, self.member.as_deref())
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if e.is_retryable() && Instant::now() + pause < self.expires => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// One held share, write hold or permit: its token in the holders (or the
/// writer key). Renewals and the release go out on one pinned connection
/// (the acquisition's), replaced only when found dead, as for the mutex.
pub(crate) struct QueuedLease {
    shared: Arc<Shared>,
    recipe: Arc<Recipe>,
    token: String,
    conn: Sticky,
}

impl QueuedLease {
    /// Runs a compare-and-act script; `true` when it acted.
    async fn run(
        &self,
        operation: &'static str,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<bool> {
        let reply: i64 = self
            .conn
            .script(&self.shared.commands, operation, invocation)
            .await?;
        Ok(reply == 1)
    }

    /// Releases the hold (when `hold`) and takes `member` out of the queue;
    /// `true` when the hold was ours.
    async fn release_as(&self, hold: bool, member: Option<&str>) -> Result<bool> {
        let recipe = &self.recipe;
        let mut invocation = recipe.invocation(recipe.scripts()[1]);
        invocation
            .arg(if hold { self.token.as_str() } else { "" })
            .arg(member.unwrap_or(""))
            .arg(&recipe.channel)
            .arg(&recipe.mode);
        self.run("release", &invocation).await
    }

    fn owned(&self, acted: bool) -> Result<()> {
        if acted {
            Ok(())
        } else {
            Err(Error::not_held(self.recipe.name.as_str()))
        }
    }
}

#[async_trait]
impl LeaseBackend for QueuedLease {
    async fn renew(&self, ttl: Duration) -> Result<()> {
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let recipe = &self.recipe;
        let mut invocation = recipe.invocation(recipe.scripts()[2]);
        invocation.arg(&self.token).arg(ms).arg(&recipe.mode);
        let (reply, acked): (i64, _) = self
            .conn
            .script_acked(&self.shared.commands, "extend", &invocation)
            .await?;
        self.owned(reply == 1)?;
        check_acked(&self.shared, &recipe.name, "renewal", acked)
    }

    async fn release(&self) -> Result<()> {
        let acted = self.release_as(true, None).await?;
        tracing::debug!(
            name = %self.recipe.name,
            side = ?self.recipe.side,
            owner = %self.shared.owner,
            released = acted,
            "distlock redis queued lock released"
        );
        // Released or not ours: either way no later command of this lease
        // needs the connection.
        self.conn.let_go();
        self.owned(acted)
    }
}

/// A Redis read-write lock: its two sides.
struct RedisRwLock {
    name: Name,
    read: Arc<Queued>,
    write: Arc<Queued>,
}

impl fmt::Debug for RedisRwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisRwLock")
            .field("name", &self.name)
            .field("writer", &self.write.recipe.keys[0])
            .finish_non_exhaustive()
    }
}

impl ReadWriteLock for RedisRwLock {
    fn name(&self) -> &Name {
        &self.name
    }

    fn read(&self) -> Arc<dyn Lock> {
        Arc::clone(&self.read) as Arc<dyn Lock>
    }

    fn write(&self) -> Arc<dyn Lock> {
        Arc::clone(&self.write) as Arc<dyn Lock>
    }
}

/// The Redis read-write lock `name`.
///
/// # Errors
///
/// None today; the signature leaves room for refused options.
pub(crate) fn rw_lock(
    shared: &Arc<Shared>,
    name: Name,
    lease: LeaseOptions,
) -> Result<Arc<dyn ReadWriteLock>> {
    let side = |side| {
        Arc::new(Queued {
            shared: Arc::clone(shared),
            recipe: Arc::new(Recipe::new(&shared.options.prefix, name.clone(), side)),
            lease,
        })
    };
    Ok(Arc::new(RedisRwLock {
        read: side(Side::Read),
        write: side(Side::Write),
        name,
    }))
}
