//! One held lease of the plain provider (its token, its renewals and release
//! on one kept connection), the undo of an attempt whose outcome is
//! unknown, and the decoding its scripts' replies share.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::backend::{Cleanup, LeaseBackend};
use distlock_core::{Error, Name, Result};
use redis::ScriptInvocation;
use tokio::time::{sleep_until, Instant};

use crate::context::Shared;
use crate::keys::{Keys, Recipe};
use crate::net::wait::not_replicated;
use crate::net::{Pinned, Sticky};
use crate::scripts::EXTEND;

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

/// One held share, write hold or permit: its token in the holders (or the
/// writer key). Renewals and the release go out on one pinned connection
/// (the acquisition's), replaced only when found dead, as for the mutex.
pub(crate) struct QueuedLease {
    pub(crate) shared: Arc<Shared>,
    pub(crate) recipe: Arc<Recipe>,
    pub(crate) token: String,
    pub(crate) conn: Sticky,
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
    pub(crate) async fn release_as(&self, hold: bool, member: Option<&str>) -> Result<bool> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_128_bit_hex_and_unique() {
        let a = new_token();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a, new_token());
    }
}
