//! The queued acquisition ("holders plus a queue") under the read-write
//! lock and the semaphore. The protocol (admission, expiring entries, the
//! addressed wake-ups, fairness, cancellation) and the keys are told once,
//! in the crate docs' [read-write lock and semaphore
//! keys](crate#read-write-lock-and-semaphore-keys). Here: a waiter's loop of
//! attempts, subscribed under its queue id
//! ([`Subscriber::subscribe_as`](crate::wake::subscriber::Subscriber)) so
//! that a wake-up addressed to it wakes it alone, on whichever provider it
//! waits.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::backend::{with_timeout, CleanupGuard};
use distlock_core::{Error, LeaseOptions, Lock, LockGuard, Name, Result, Wait};
use tokio::time::{sleep_until, Instant};

use crate::acquire::{Acquisition, Family, Outcome};
use crate::context::Context;
use crate::keys::{Claim, Recipe};
use crate::lease::{decode, kind_refusal, leave_budget, new_token, Attempt, RedisLease, Undo};
use crate::net::Pinned;

/// A queued acquisition: the read or write side of a read-write lock, or a
/// semaphore.
pub(crate) struct Queued {
    pub(crate) shared: Arc<Context>,
    pub(crate) recipe: Arc<Recipe>,
    pub(crate) lease: LeaseOptions,
}

impl fmt::Debug for Queued {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Queued")
            .field("name", &self.recipe.name)
            .field("side", &self.recipe.claim)
            .field("holders", &self.recipe.keys.holders)
            .finish_non_exhaustive()
    }
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
    ) -> Result<Attempt<Option<Duration>>> {
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
            .arg(&self.shared.owner)
            .arg(self.shared.options.fence_ttl_ms(self.lease.ttl_millis()));
        let ((status, value), acked): ((i64, i64), _) = conn
            .script_acked(
                "acquire",
                self.shared.options.response_timeout,
                &invocation,
                self.shared.options.wait,
            )
            .await?;
        decode(
            (&self.shared, &recipe.name, &recipe.keys.fence),
            (status, value),
            acked,
            |recheck| recheck,
            |status, value| match status {
                -1 => recipe.conflict(value),
                -5 => kind_refusal(
                    &recipe.name,
                    &recipe.lock,
                    value,
                    match recipe.claim {
                        Claim::Permit(_) => "semaphore",
                        Claim::Read | Claim::Write => "read-write lock",
                    },
                ),
                -4 => Error::PermitsMismatch {
                    name: recipe.name.to_string(),
                    held: u32::try_from(value).unwrap_or(0),
                    asked: match recipe.claim {
                        Claim::Permit(n) => n,
                        Claim::Read | Claim::Write => 0,
                    },
                },
                _ => recipe.conflict(5),
            },
        )
    }
}

/// A queued recipe's part of one attempt: its script, and the leave of the
/// queue that follows each attempt that may queue us on its connection.
struct QueuedAttempt<'a> {
    queued: &'a Queued,
    /// Our entry in the queue.
    member: &'a str,
    /// Whether the attempt queues us (the caller waits).
    queue_up: bool,
    /// Takes our entry out of the server's queue unless disarmed; always
    /// on the connection of the latest attempt that may have queued us,
    /// so it lands after that attempt.
    place: &'a mut Option<CleanupGuard>,
    /// The queue guards of attempts whose outcome is unknown: such an
    /// attempt may still land on its connection, so its own guard (on
    /// that connection) runs when we leave, whatever the outcome.
    unknown: &'a mut Vec<CleanupGuard>,
    waited: Instant,
}

impl Family for QueuedAttempt<'_> {
    type Waiting = Option<Duration>;

    fn arm(&mut self, _pinned: &Pinned, lease: &Arc<RedisLease>, started: Instant) -> Result<()> {
        if self.queue_up {
            let timeout = self.queued.shared.options.response_timeout;
            let next = CleanupGuard::arm(
                "leave the queue",
                Arc::new(Undo {
                    lease: Arc::clone(lease),
                    place: Some(self.member.to_owned()),
                    expires: started + self.queued.entry_ttl() + timeout,
                }),
            )?;
            if let Some(mut previous) = self.place.replace(next) {
                previous.disarm();
            }
        }
        Ok(())
    }

    fn script<'a>(
        &'a mut self,
        pinned: &'a Pinned,
        token: &'a str,
    ) -> impl std::future::Future<Output = Result<Attempt<Option<Duration>>>> + Send + 'a {
        self.queued
            .attempt(pinned, token, self.member, self.queue_up)
    }

    fn acquired(&mut self, token: u64) {
        if let Some(mut place) = self.place.take() {
            // The script took us out of the queue.
            place.disarm();
        }
        let recipe = &self.queued.recipe;
        tracing::debug!(
            name = %recipe.name,
            side = ?recipe.claim,
            owner = %self.queued.shared.owner,
            token,
            waited_us = self.waited.elapsed().as_micros(),
            "distlock redis queued lock acquired"
        );
    }

    fn not_replicated(&mut self) {
        // The script took us out of the queue.
        if let Some(mut place) = self.place.take() {
            place.disarm();
        }
    }

    fn unknown(&mut self) {
        // `place` stays for the queue entry, on the attempt's connection.
        self.unknown.extend(self.place.take());
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
        match self.recipe.claim {
            Claim::Permit(_) => distlock_core::PrimitiveKind::Semaphore,
            Claim::Read | Claim::Write => distlock_core::PrimitiveKind::ReadWrite,
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
        // What the attempts leave in the queue (see `QueuedAttempt`).
        let mut place: Option<CleanupGuard> = None;
        let mut unknown: Vec<CleanupGuard> = Vec::new();
        let mut pause = Duration::from_millis(20);
        loop {
            let acquisition = Acquisition {
                shared,
                name: &self.recipe.name,
                lease: self.lease,
                waits: queue,
                deadline,
            };
            let mut family = QueuedAttempt {
                queued: self,
                member: &member,
                queue_up: queue,
                place: &mut place,
                unknown: &mut unknown,
                waited,
            };
            // Boxed: the attempt's state is large, and a waiter should not
            // carry it while it sleeps between attempts.
            let attempt = acquisition.attempt((&self.recipe).into(), &mut family, &mut pause);
            let recheck = match Box::pin(attempt).await? {
                Outcome::Acquired(guard) => return Ok(Some(guard)),
                Outcome::Again => continue,
                Outcome::Waiting(recheck) => recheck,
            };
            pause = Duration::from_millis(20);
            let now = Instant::now();
            if !queue || deadline.is_some_and(|d| now >= d) {
                // Within one response timeout past the deadline, this
                // attempt included; a leave cut short runs in the
                // background (the guard's drop).
                let within = leave_budget(deadline, timeout);
                if let Some(mut place) = place.take().filter(|_| !within.is_zero()) {
                    let _ = with_timeout("leave the queue", within, place.run_now()).await;
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
