//! One held lease of the plain provider (its token, its renewals and release
//! on one kept connection), the undo of an attempt whose outcome is
//! unknown, and the decoding its scripts' replies share.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::backend::{
    Cleanup, GuardParts, LeaseBackend, LeaseSignal, LeaseTerms, Lifecycle,
};
use distlock_core::{Error, LeaseOptions, Name, Result};
use redis::ScriptInvocation;
use tokio::time::{sleep_until, Instant};

use crate::context::Context;
use crate::keys::{Keys, Recipe, TURN};
use crate::net::wait::not_replicated;
use crate::net::{Pinned, Sticky};

/// 128 random bits as 32 hex digits (the shape of redis-py's tokens).
pub(crate) fn new_token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// `ttl` in whole milliseconds, saturating.
fn millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)
}

/// Undoes what an acquire attempt may have left (cancelled, timed out,
/// failed mid-flight): its hold (compare-and-delete of its token, so a late
/// `SET` cannot land afterwards with nobody to release it), or a queued
/// waiter's place. Sent on the connection the attempt used, so it reaches
/// the server after the attempt did; retried ([`retried`]) until what it
/// takes back would have expired by itself. Once the attempt's connection
/// is known dead (nothing more can land from it), another connection is as
/// good.
pub(crate) struct Undo {
    pub(crate) lease: Arc<RedisLease>,
    /// `None`: the attempt's hold; `Some`: this waiter's place in a queued
    /// recipe's queue.
    pub(crate) place: Option<String>,
    /// When the attempt was sent plus the TTL of what it may have left and
    /// a response timeout: after this it is gone anyway.
    pub(crate) expires: Instant,
}

#[async_trait]
impl Cleanup for Undo {
    async fn clean_up(&self) -> Result<()> {
        let place = self.place.as_deref();
        retried(|| self.expires, || self.lease.take_back(place))
            .await
            .map(drop)
    }
}

/// Runs `once` until it succeeds, fails with an error that is not
/// retryable, or the next try (after a pause of 20 ms, doubling up to
/// 500 ms) would start after `expires()`: the back-off of every cleanup
/// (an undo, a waiter leaving its queue, Redlock's undo on each master).
pub(crate) async fn retried<T, F: std::future::Future<Output = Result<T>>>(
    expires: impl Fn() -> Instant,
    mut once: impl FnMut() -> F,
) -> Result<T> {
    let mut pause = Duration::from_millis(20);
    loop {
        match once().await {
            Ok(done) => return Ok(done),
            Err(e) if e.is_retryable() && Instant::now() + pause < expires() => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            Err(e) => return Err(e),
        }
    }
}

/// The keys a lease's scripts act on.
pub(crate) enum LeaseKeys {
    /// The lock family's (mutex, fair mutex, election).
    Lock(Arc<Keys>),
    /// A queued recipe's (a read-write lock's side, a semaphore).
    Queued(Arc<Recipe>),
}

impl From<&Arc<Keys>> for LeaseKeys {
    fn from(keys: &Arc<Keys>) -> Self {
        LeaseKeys::Lock(Arc::clone(keys))
    }
}

impl From<&Arc<Recipe>> for LeaseKeys {
    fn from(recipe: &Arc<Recipe>) -> Self {
        LeaseKeys::Queued(Arc::clone(recipe))
    }
}

/// The parts of the guard of a lease just taken (a single-master lease,
/// [`RedisLease`], or a Redlock one): `name`'s hold with the fencing
/// `token`, for the TTL `lease`, counted from `acquired_at` (when the
/// acquire request was sent; for Redlock the core's deadline, acquired_at +
/// TTL − drift, is exactly the end of the validity), ended by the
/// provider's `lifecycle`.
pub(crate) fn guard_parts(
    name: &Name,
    token: u64,
    lease: LeaseOptions,
    acquired_at: Instant,
    lifecycle: &Arc<Lifecycle>,
) -> GuardParts {
    GuardParts {
        name: name.clone(),
        fencing_token: token,
        signal: LeaseSignal::new(),
        terms: LeaseTerms::Ttl(lease),
        acquired_at,
        lifecycle: Arc::clone(lifecycle),
    }
}

/// One held Redis lease: its keys and our token; the same for every
/// primitive of the plain provider, which differ only in their scripts
/// ([`LeaseKeys`]).
///
/// Its renewals and its release go out on one pinned connection (the one
/// its acquisition used), so they reach the server in the order they were
/// sent: an `extend()` cancelled in flight cannot land after a later
/// renewal and shorten the lease behind the local deadline. A connection
/// found dead is replaced (nothing more can land from it). The connection
/// is let go once the lease is released.
///
/// A renewal left unanswered for the response timeout may let its
/// connection go too, so a connection that stays open but goes silent for
/// good does not take the lease with it: the next renewal pins a fresh one
/// (the provider has replaced its silent connection by then). What was
/// sent on the old socket and never answered may still land later, alone
/// or as a prefix of what was sent (a socket can deliver some requests and
/// die before the rest), and set its TTL then; a renewal sent afterwards on
/// the fresh connection for a longer TTL could be cut short by it behind
/// the guard's back. So the lease keeps the TTLs of its renewals sent on
/// the current connection and not yet answered ([`RedisLease::unanswered`],
/// cancelled ones included: an answer to a later renewal on the same
/// connection proves every earlier one ran, and clears them), and:
///
/// * a timed-out renewal lets the connection go only if it is the shortest
///   of them and no shorter than the acquisition's TTL (the watchdog's), so
///   the watchdog never meets the bound that follows; otherwise the
///   connection is kept, and later renewals go out behind what it holds;
/// * the shortest unanswered TTL of a connection let go (on a timeout or a
///   connection error) bounds every later renewal of the lease
///   ([`RedisLease::floor_ms`]): a longer one is refused, unsent.
pub(crate) struct RedisLease {
    shared: Arc<Context>,
    keys: LeaseKeys,
    pub(crate) token: String,
    name: Name,
    conn: Sticky,
    /// The shortest TTL (ms) of a renewal given up unanswered on a
    /// connection let go (`u64::MAX`: none): the longest renewal that is
    /// safe to send on another connection.
    floor_ms: AtomicU64,
    /// The acquisition's TTL (ms): the watchdog's.
    acquired_ms: u64,
    /// The TTLs (ms) of the renewals sent on the current connection and not
    /// answered yet (timed out or cancelled).
    unanswered: Mutex<Vec<u64>>,
    /// The lease's status cell (the guard's): a renewal that finds the
    /// hold asked to release says so there.
    pub(crate) signal: LeaseSignal,
}

impl RedisLease {
    /// The lease of one acquire attempt for `ttl`, with a fresh token,
    /// pinned to the attempt's connection.
    pub(crate) fn new(
        shared: &Arc<Context>,
        keys: LeaseKeys,
        name: &Name,
        pinned: &Pinned,
        ttl: Duration,
    ) -> Arc<RedisLease> {
        // A fresh token per attempt: an undo still running for an earlier
        // attempt can never delete a later one's key. The lock family's
        // lock key value is the holder record too: `<token>|<owner>` (see
        // `holds.lua`); a queued recipe keeps its holders' owners apart.
        let token = match keys {
            LeaseKeys::Lock(_) => {
                // One allocation for the value (a `format!` of a fresh
                // `new_token()` took two).
                let mut value = String::with_capacity(33 + shared.owner.len());
                value.push_str(
                    uuid::Uuid::new_v4()
                        .simple()
                        .encode_lower(&mut uuid::Uuid::encode_buffer()),
                );
                value.push('|');
                value.push_str(&shared.owner);
                value
            }
            LeaseKeys::Queued(_) => new_token(),
        };
        Arc::new(RedisLease {
            shared: Arc::clone(shared),
            keys,
            token,
            name: name.clone(),
            conn: Sticky::new(Some(pinned)),
            floor_ms: AtomicU64::new(u64::MAX),
            acquired_ms: millis(ttl),
            unanswered: Mutex::new(Vec::new()),
            signal: LeaseSignal::new(),
        })
    }

    fn unanswered(&self) -> std::sync::MutexGuard<'_, Vec<u64>> {
        self.unanswered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

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

    /// Takes back what the attempt of this lease may have left: its hold
    /// (`place` `None`), or the queued waiter `place`'s entry; `true` when
    /// the script acted (the hold was ours). The connection stays kept.
    async fn take_back(&self, place: Option<&str>) -> Result<bool> {
        match (&self.keys, place) {
            (LeaseKeys::Lock(keys), _) => {
                let reply: i64 = self
                    .conn
                    .script(&self.shared.commands, "release", &keys.release(&self.token))
                    .await?;
                if reply == 2 {
                    // Left free as a turn for clients outside the line
                    // (`mutex_release.lua`): this provider's waiters, and
                    // its next `lock()`, hold back as the others' do.
                    self.shared.subscriber.hold_back(&keys.channel, TURN);
                }
                Ok(reply == 1 || reply == 2)
            }
            (LeaseKeys::Queued(recipe), None) => {
                self.run("release", &recipe.release(&self.token, "")).await
            }
            (LeaseKeys::Queued(recipe), Some(member)) => {
                self.run("release", &recipe.release("", member)).await
            }
        }
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
        let ms = millis(ttl);
        let fence_ms = self.shared.options.fence_ttl_ms(ms);
        let invocation = match &self.keys {
            LeaseKeys::Lock(keys) => keys.extend(&self.token, ms, fence_ms),
            LeaseKeys::Queued(recipe) => recipe.extend(&self.token, ms, fence_ms),
        };
        let floor = self.floor_ms.load(Ordering::SeqCst);
        if ms > floor {
            return Err(Error::InvalidOptions(format!(
                "a renewal of {ms} ms: an earlier one of {floor} ms was left unanswered on a \
                 connection that may still deliver it, so this lease can be renewed for at most \
                 {floor} ms"
            )));
        }
        // Unanswered until its reply says otherwise (a cancelled renewal
        // stays so).
        self.unanswered().push(ms);
        let reply = self
            .conn
            .script_acked(&self.shared.commands, "extend", &invocation)
            .await;
        match &reply {
            Err(Error::Timeout { .. }) => {
                let mut unanswered = self.unanswered();
                let shortest = unanswered.iter().copied().min().unwrap_or(ms);
                if shortest == ms && ms >= self.acquired_ms {
                    // The connection may be silent for good: the next
                    // renewal goes out on a fresh one, bounded by this one.
                    self.floor_ms.fetch_min(ms, Ordering::SeqCst);
                    unanswered.clear();
                    self.conn.let_go();
                }
            }
            Err(Error::Connection { .. }) => {
                // Let go already: whatever it still held bounds the rest.
                let mut unanswered = self.unanswered();
                if let Some(shortest) = unanswered.iter().copied().min() {
                    self.floor_ms.fetch_min(shortest, Ordering::SeqCst);
                }
                unanswered.clear();
            }
            // Answered (a reply, or the server's error): everything sent
            // before on this connection ran.
            Ok(_) | Err(Error::Server { .. } | Error::NotAllowed { .. }) => {
                self.unanswered().clear();
            }
            // Not sent, or no word from the server: nothing is known.
            Err(_) => {}
        }
        let (reply, acked): (i64, _) = reply?;
        self.owned(reply == 1 || reply == 3)?;
        // 3: extended, and someone asked this hold to release.
        if reply == 3 && self.signal.request_release() {
            tracing::info!(name = %self.name, owner = %self.shared.owner, "distlock redis hold asked to release");
        }
        check_acked(&self.shared, &self.name, "renewal", acked)
    }

    async fn release(&self) -> Result<()> {
        let acted = match self.take_back(None).await {
            // The connection was found dead and let go (an idle one the
            // server or a middlebox closed, say): nothing more can land
            // from it, so one more try goes out on a fresh one rather than
            // leaving the hold to its TTL.
            Err(Error::Connection { .. }) => self.take_back(None).await,
            other => other,
        }?;
        match &self.keys {
            LeaseKeys::Lock(_) => tracing::debug!(
                name = %self.name,
                owner = %self.shared.owner,
                released = acted,
                "distlock redis lock released"
            ),
            LeaseKeys::Queued(recipe) => tracing::debug!(
                name = %self.name,
                side = ?recipe.claim,
                owner = %self.shared.owner,
                released = acted,
                "distlock redis queued lock released"
            ),
        }
        // Released or not ours: either way no later command of this lease
        // needs the connection.
        self.conn.let_go();
        self.owned(acted)
    }

    fn response_timeout(&self) -> Option<Duration> {
        Some(self.shared.commands.timeout)
    }
}

/// How an acquire script answered, for every family: `W` is what a
/// refused attempt learns (how long to wait, who holds, where it stands).
pub(crate) enum Attempt<W> {
    /// `1`: taken, with this fencing token.
    Acquired(u64),
    /// `0`: not taken.
    Waiting(W),
    /// `2`: the key already holds this attempt's token: the attempt ran
    /// before (resent by the client after a lost reply), its fencing token
    /// is unknown.
    AlreadyOurs,
}

/// Decodes an acquire script's `{status, value}` once for every family:
/// `1` taken (counted only once the replicas acknowledged it as asked,
/// `acked`, see [`check_acked`]), `0` refused (`waiting` makes the
/// family's `W` from `value`, the milliseconds to look again within,
/// `None` when negative: no bound from the server), `2` already ours, `-3`
/// the fencing counter `fence` is exhausted; any other status is a refusal
/// the family names (`refused(status, value)`).
pub(crate) fn decode<W>(
    (shared, name, fence): (&Context, &Name, &str),
    (status, value): (i64, i64),
    acked: Option<u32>,
    waiting: impl FnOnce(Option<Duration>) -> W,
    refused: impl FnOnce(i64, i64) -> Error,
) -> Result<Attempt<W>> {
    match status {
        1 => {
            check_acked(shared, name, "acquisition", acked)?;
            u64::try_from(value)
                .map(Attempt::Acquired)
                .map_err(|_| Error::server("redis", "acquire script returned a negative token"))
        }
        0 => Ok(Attempt::Waiting(waiting(
            u64::try_from(value).ok().map(Duration::from_millis),
        ))),
        2 => Ok(Attempt::AlreadyOurs),
        -3 => Err(Error::Exhausted {
            name: fence.to_owned(),
        }),
        status => Err(refused(status, value)),
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
    shared: &Context,
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

/// What a wait's leave (of a line or a queue) may take before the caller
/// returns: what is left of one response timeout `timeout` past the
/// caller's `deadline` (a wait gives up at most one response timeout late,
/// its last attempt included), or one response timeout without a deadline.
/// A leave cut short finishes in the background (its guard's drop); the
/// entry expires by itself anyway.
pub(crate) fn leave_budget(deadline: Option<Instant>, timeout: Duration) -> Duration {
    deadline.map_or(timeout, |d| {
        (d + timeout)
            .saturating_duration_since(Instant::now())
            .min(timeout)
    })
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
