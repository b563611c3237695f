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
use distlock_core::backend::{
    with_timeout, CleanupGuard, GuardParts, LeaseBackend, LeaseSignal, LeaseTerms,
};
use distlock_core::{Error, LeaseOptions, Lock, LockGuard, Name, Result, Wait};
use tokio::time::{sleep_until, Instant};

use crate::context::Context;
use crate::keys::{Claim, Recipe};
use crate::lease::{
    decode, kind_refusal, leave_budget, new_token, pause_before_retry, Attempt, RedisLease, Undo,
};
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
            let lease = RedisLease::new(shared, (&self.recipe).into(), &self.recipe.name, &pinned);
            let mut undo = CleanupGuard::arm(
                "undo acquire",
                Arc::new(Undo {
                    lease: Arc::clone(&lease),
                    place: None,
                    expires: started + self.lease.ttl() + timeout,
                }),
            )?;
            if queue {
                let next = CleanupGuard::arm(
                    "leave the queue",
                    Arc::new(Undo {
                        lease: Arc::clone(&lease),
                        place: Some(member.clone()),
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
                        side = ?self.recipe.claim,
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
