//! Redlock over N independent Redis masters, with fencing tokens that stay
//! monotone across them: see [`RedlockProvider`].

mod mutex;
mod ops;

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::backend::url::invalid_url;
use distlock_core::backend::{check_permits, Lifecycle};
use distlock_core::{
    Election, Error, ForceReleased, IdGenerator, LeaseOptions, Lock, Name, PrimitiveKind, Provider,
    ReadWriteLock, Result, Semaphore, Snapshot,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, FromRedisValue, Script};

use crate::error::from_redis;
use crate::options::RedisOptions;
use crate::scripts::{REDLOCK_ACQUIRE, REDLOCK_EXTEND, REDLOCK_RAISE, RELEASE};
use crate::wake::subscriber::Subscriber;
use mutex::{RedlockKeys, RedlockMutex};

const BACKEND: &str = "redis+redlock";

/// One master: its command connection and its subscriber.
pub(crate) struct Master {
    conn: ConnectionManager,
    subscriber: Subscriber,
    /// `host:port`, for logs.
    addr: String,
}

impl Master {
    /// Runs `cmd` (an `EVALSHA` of `script`) on this master, unbounded: the
    /// caller bounds the round it belongs to with one timer for all masters
    /// (`timeout` names that bound in errors). On `NOSCRIPT` (a master that
    /// restarted, or whose scripts were flushed) it loads the script and
    /// sends the command again, unless `once` was set meanwhile: a renewal
    /// finishing in the background after its caller moved on must not send
    /// again, since its second send could land after the next renewal and
    /// shorten the key below the guard's deadline. A release sends again
    /// (it acts on our unique token alone: landing late is harmless, and
    /// not sending would leave our key there until its TTL). An acquire
    /// call is dropped, never finished in the background.
    async fn eval<T: FromRedisValue>(
        &self,
        operation: &'static str,
        timeout: Duration,
        script: &Script,
        cmd: &Cmd,
        once: &AtomicBool,
    ) -> Result<T> {
        let mut conn = self.conn.clone();
        let fail = |e| from_redis(operation, timeout, e);
        match cmd.query_async::<T>(&mut conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                script
                    .prepare_invoke()
                    .load_async(&mut conn)
                    .await
                    .map_err(fail)?;
                if once.load(Ordering::SeqCst) {
                    return Err(fail(e));
                }
                cmd.query_async(&mut conn).await.map_err(fail)
            }
            reply => reply.map_err(fail),
        }
    }
}

/// What every mutex of one provider shares.
pub(crate) struct Shared {
    masters: Vec<Master>,
    quorum: usize,
    options: RedisOptions,
    lifecycle: Arc<Lifecycle>,
    /// The owner identity ([`RedisOptions::owner_label`]), stored in each
    /// master's holder record.
    owner: String,
}

/// The time since `started`, in whole milliseconds (for an error message).
fn waited(started: tokio::time::Instant) -> Duration {
    let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(ms)
}

/// Why a connect found no quorum: the source of its [`Error::Connection`].
#[derive(Debug)]
struct NoQuorum {
    masters: usize,
    quorum: usize,
    answered: usize,
    /// `host:port` and its failure (a refusal, or a timeout: no answer
    /// within the response or connect timeout), in the order they came.
    failed: Vec<(String, Error)>,
    /// `host:port` of the masters still loading the scripts (no answer yet)
    /// when the connect ended.
    silent: Vec<String>,
    /// The connect timeout, when it ran out; `None` when the connect ended
    /// before it, as soon as too many masters had failed for a quorum.
    within: Option<Duration>,
}

impl fmt::Display for NoQuorum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.within {
            Some(within) => write!(
                f,
                "{} of {} masters answered within {within:?}, a quorum is {}",
                self.answered, self.masters, self.quorum
            )?,
            None => write!(
                f,
                "{} of {} masters failed and {} answered, a quorum is {}",
                self.failed.len(),
                self.masters,
                self.answered,
                self.quorum
            )?,
        }
        for (addr, e) in &self.failed {
            if e.is_timeout() {
                write!(f, "; {addr}: no answer ({e})")?;
                continue;
            }
            // Each cause once: redis-rs's I/O errors repeat their source.
            let mut said = e.to_string();
            write!(f, "; {addr}: {said}")?;
            let mut source = std::error::Error::source(e);
            while let Some(s) = source {
                let cause = s.to_string();
                if !said.contains(&cause) {
                    write!(f, ": {cause}")?;
                }
                said = cause;
                source = s.source();
            }
        }
        for addr in &self.silent {
            write!(f, "; {addr}: no answer")?;
        }
        Ok(())
    }
}

impl std::error::Error for NoQuorum {}

/// Redlock over N independent Redis masters, with fencing tokens that stay
/// monotone across them.
///
/// ```no_run
/// # mod distlock {
/// #     pub use distlock_core::*;
/// #     pub mod redis { pub use distlock_redis::*; }
/// # }
/// use std::time::Duration;
/// use distlock::redis::RedlockProvider;
/// use distlock::Provider;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
/// let locks = RedlockProvider::connect("redis+redlock://redis-a:6379,redis-b:6379,redis-c:6379").await?;
/// let mutex = locks.mutex("orders/42")?;
/// if let Some(guard) = mutex.lock_timeout(Duration::from_secs(5)).await? {
///     println!("fencing token {}", guard.fencing_token());
///     guard.release().await?;
/// }
/// # Ok(()) }
/// ```
///
/// # What it offers
///
/// [`RedlockProvider`] offers **the mutex only** (`mutex`, also through `with_lease`).
/// The fair mutex, read-write lock, semaphore, election and id generators
/// answer [`Error::Unsupported`] with `backend: "redis+redlock"`: use
/// `redis://` or `redis+sentinel://` for them. Its
/// [`backend()`](distlock_core::Provider::backend) is `"redis+redlock"`.
///
/// # URL and options
///
/// `redis+redlock://[user:password@]host:port,[user:password@]host:port,…[/db][?options]`:
/// N ≥ 1 masters (N = 1 is one master), each named once (a master named
/// twice is an [`Error::InvalidUrl`]: it would count twice in a quorum).
/// Credentials given on the first host apply to every host that has none of
/// its own; a `/db` applies to every host. The query takes the options of
/// [`RedisOptions`]'s URL query (`prefix`, `response_timeout_ms`,
/// `connect_timeout_ms`, `recheck_ms`, `lease_ttl_ms`, and `protocol` for
/// the client) except `pool_size`: Redlock keeps **one multiplexed
/// connection per master** (an auto-reconnecting `ConnectionManager`), and
/// refuses a pool. Unknown or repeated keys are an [`Error::InvalidUrl`],
/// with the password redacted. Masters are told apart by `host:port` as
/// written (host names compared without case): two names of one server
/// (`localhost` and `127.0.0.1`) are not detected, so do not do that.
/// Masters are plain TCP for now: TLS (`rediss://`) and Unix sockets are an
/// [`Error::InvalidUrl`].
///
/// Connecting succeeds once a quorum (N/2 + 1) of masters has loaded the
/// scripts within the connect timeout; the others (a minority down) are connected
/// when they come back.
///
/// # The recipe
///
/// Quorum `Q = N/2 + 1`. On every master the lock key is `PREFIX NAME`
/// (the single-master mutex's, so redis-py's `Lock` on one master sees our
/// token), the fencing counter is `{PREFIX NAME}:redlock:fence` (apart from
/// the single-master mutex's `{PREFIX NAME}:fence`, whose floor is in
/// microseconds: mixing the two would keep the counters of different masters
/// apart, see below), releases publish on `{PREFIX NAME}:released`, and the
/// holder record `{PREFIX NAME}:holder` (the single-master mutex's: the
/// lock's value, this master's counter, the acquisition time and the owner
/// identity, with the lock's TTL; renewals set its fence to the guard's
/// token) is what [`inspect`](Provider::inspect) reads.
/// **Do not mix** a Redlock mutex and a single-master mutex of one name on
/// the same servers: they exclude each other only on the shared master.
///
/// * **Acquire** (one attempt): the attempt's start `t0` is taken, then the
///   script `redlock_acquire` runs on every master in parallel: atomically
///   `SET lock token NX PX ttl` and, if that took the lock,
///   `c := max(c + 1, floor)` on the master's counter, where
///   `floor = TIME seconds × 10⁶`, returning `c`; otherwise it returns
///   "busy" and the holder's `PTTL` there. The attempt goes on as soon as
///   a quorum took the lock, or a quorum answered and the lock is held
///   elsewhere, or the response timeout passed (a paused master costs
///   nothing once a quorum answered). The calls still waiting are dropped:
///   their command went out with the others (then whatever we send that
///   master later, the release or an undo, reaches it after, on the same
///   connection) or never will (a call still waiting for a reconnect is not
///   left to send it after our release). A straggler that took the lock
///   holds our token: released with the rest, undone if the attempt misses.
/// * **Scripts** run by `EVALSHA`; a master that answers `NOSCRIPT` (it
///   restarted) gets `SCRIPT LOAD` and the `EVALSHA` again. Renewals and
///   releases also end at a quorum, but their remaining calls finish in the
///   background, within the response timeout (both are compare-and-act on
///   our token). A release there still sends again after `NOSCRIPT` (late
///   is harmless); a renewal does not (late, it could land after the next
///   renewal and shorten the key below the guard's deadline).
/// * **Fencing token**: `T` = the largest `c` among the masters that took
///   the lock. If fewer than `Q` of them returned exactly `T`, the script
///   `redlock_raise` (`if GET lock == token then c := max(c, T); return 1
///   else return 0`) runs on those that returned less, in parallel. The
///   guard is returned only when at least `Q` masters hold a counter ≥ `T`
///   *under our lock* (those that returned `T`, plus those whose write-back
///   answered 1) and the validity `TTL − (now − t0) − drift` (drift =
///   TTL/100 + 2 ms, checked arithmetic) is still above zero. In the steady
///   state no write-back round is needed: every acquisition increments
///   every master that takes the lock, so once the counters agree they
///   stay so; after a master fell behind or ahead (restarted, unreachable
///   for a while), the first quorum that disagrees is raised to its
///   maximum.
/// * **Missed** (no quorum, no validity, or a write-back short of `Q`): the
///   attempt is undone with compare-and-delete (the release script, which
///   also publishes) at once on every master that took the lock, and in the
///   background, retried until the attempt's key would have expired, on
///   every master that did not answer or failed: a lost reply may have taken
///   the lock. Masters that answered "busy" changed nothing. Then:
///   * fewer than `Q` masters answered at all: an outage, reported as the
///     first connection error or timeout (`try_lock` returns it; a waiting
///     acquisition retries with backoff until its deadline, then returns
///     it). **With a quorum of masters down, `try_lock` is this typed error,
///     not `Ok(None)`.**
///   * the attempt took some masters but not a quorum (a split with other
///     contenders): it tries again after a random pause of up to
///     max(5 ms, 4 × the attempt's duration) (at most the re-check interval),
///     so two contenders do not split again in lockstep.
///   * it took none: the lock is held; the waiter waits (below).
/// * **Guard**: the core's `LockGuard` with `LeaseTerms::Ttl`, acquired at
///   `t0`: its local deadline `t0 + TTL − drift` *is* the Redlock validity.
///   Dropping the acquire future at any await point leaves no key with the
///   attempt's token held past its TTL: an armed cleanup undoes on every
///   master (each attempt has a fresh token, so an undo still running never
///   touches a later attempt's key). One case is left to the TTL: a master
///   whose connection was re-established between the attempt and its undo
///   (a paused master) can run the undo before the late attempt; that key,
///   on a minority of masters, then blocks nobody and expires with its TTL.
/// * **Renew** (watchdog and `extend()`): compare-and-`PEXPIRE` on every
///   master in parallel, from the renewal's start `t1`, decided as soon as
///   a quorum renewed (the others finish in the background). Success needs
///   a quorum renewed and `TTL − (now − t1) − drift > 0`; the core then moves
///   the deadline to `t1 + TTL − drift`. When more than `N − Q` masters say
///   "not ours" (a quorum can no longer be ours) it is `NotHeld` and
///   `lost()` fires at once; any other shortfall is the first error, the
///   lease is suspended, retried, and `lost()` fires at the deadline.
///   Renewal never re-takes a master that lost the key (a restarted one).
///   Each renewal carries its number and a master keeps the latest in the
///   holder record: a renewal finishing in the background that reaches a
///   master after a later one (its connection re-established meanwhile)
///   changes nothing there, so it cannot cut the TTL a later `extend()`
///   set.
/// * **Release**: compare-and-delete plus `PUBLISH` on every master in
///   parallel; done once a quorum had our token (the lock was ours and is
///   now free on a quorum; the others finish in the background). `NotHeld`
///   when fewer than a quorum can have had it (the lock had expired or was
///   taken: a late release of a lost lease, which still deletes our keys
///   left on stragglers). A master that does not answer keeps its key until
///   the TTL (a minority: it blocks nobody).
/// * **Waiting**: one pub/sub subscriber per master (spawned by the
///   provider, opened at the first wait), listening on the release channel
///   on every master; a waiter re-checks when any master's release message
///   arrives, at the earliest holder `PTTL` reported, and every re-check
///   interval: no fixed-sleep polling.
///
/// # Cost per acquisition
///
/// Commands per master: **1** script for the acquire, **0 or 1** write-back
/// (0 in the steady state; only masters behind the maximum), **1** release;
/// plus 1 per renewal (every TTL/3 with the watchdog), and a `SCRIPT LOAD`
/// after a master restarted. All rounds are parallel and end at a quorum,
/// so an uncontended lock + release costs the caller two round trips to the
/// quorum-th fastest master. A missed attempt costs 1 undo per master that
/// took the lock (or did not answer).
///
/// # Why fencing tokens increase
///
/// Call `W(G)` the set of masters that held a counter ≥ `T(G)` while their
/// lock key held `G`'s token, for a guard `G` that was returned. By
/// construction `|W(G)| ≥ Q`.
///
/// 1. **Any two returned guards `G1`, `G2` have distinct, ordered tokens.**
///    `W(G1)` and `W(G2)` are both majorities of the N masters, so they
///    share a master `m`. `G1` and `G2` held `m`'s lock key in disjoint
///    intervals (`SET NX`; a key with a token is removed only by expiry or
///    compare-and-delete of that token). Say `G1`'s came first. `G1` made
///    `m`'s counter ≥ `T1` inside its interval (in the acquire script, or in
///    a write-back that ran only while the key held `G1`'s token), so before
///    `G2`'s acquire script took `m`'s key; counters never decrease, so that
///    script read a counter ≥ `T1` and stored at least `T1 + 1`, which it
///    returned. `T2` is the maximum of what `G2`'s masters returned, so
///    `T2 > T1`.
/// 2. **Successive holders' tokens increase.** If `G2`'s acquisition began
///    after `G1`'s guard was returned, `G1` already held `m`'s key (it was
///    in `W(G1)`) before `G2` sent anything, so `G2`'s interval on `m` is the
///    later one, and `T2 > T1` by 1.
/// 3. **Cancellation** between the acquire round and the write-back, or a
///    write-back short of a quorum: that token's guard was never returned,
///    so no resource ever saw it; its effects are counters raised, which
///    only make later tokens larger. Skipping it is harmless.
///
/// ## Limits (what the proof assumes)
///
/// * **Counters never decrease — except when a master restarts empty.**
///   Without persistence (or with `appendfsync everysec` after a crash) a
///   master comes back with no counter. The floor `TIME seconds × 10⁶` then
///   keeps step 1 true provided (a) the master stays down at least 1 s
///   **and** at least the TTL (Redlock's "delayed restart": it also ensures
///   every lock it held has expired), (b) fewer than 10⁶ tokens per second
///   are issued on the name (so no counter runs ahead of
///   `(current second + 1) × 10⁶`), and (c) the masters' clocks agree to
///   better than the restart delay (a write-back may copy a counter set by
///   another master's clock). A clock stepped back by more than the restart
///   delay breaks it. With `appendonly yes` + `appendfsync always` none of
///   this is needed.
/// * **Clock drift**: the validity assumes the masters expire keys no
///   earlier than `TTL − drift` after `t0` by the client's clock (drift =
///   1% + 2 ms). A client paused (GC, SIGSTOP) past its deadline, or a
///   master whose clock jumps forward, can let two clients hold at once —
///   Redlock's known weakness; the **fencing token is what catches it**:
///   by step 1 the later holder's token is larger, so a fenced resource
///   refuses the earlier holder.
/// * **Tokens stop at 2⁵³** ([`Error::Exhausted`]), as the single-master
///   mutex's: the counter lives in Lua numbers. With the floor in seconds ×
///   10⁶ that is about the year 2255.
/// * A guard renewed on a bare quorum (one master restarted) is lost with
///   one more master: renewal does not re-take masters. The same holds from
///   the start when the acquisition ended at a quorum and the stragglers'
///   calls were dropped: on a loaded machine a lock over 5 is often on 3
///   (SAFETY.md's failover experiment shows both cases). Its `lost()` then
///   fires at its deadline, before anyone else can take it.
///
/// ## The counter's retention
///
/// As the single-master counter (the crate docs, *The counter's
/// retention*), each master's `{PREFIX NAME}:redlock:fence` expires: its TTL
/// is the lease's TTL plus [`RedisOptions::fence_retention`], set by the
/// acquire script that takes the token (`redlock_acquire.lua`), by the
/// write-back (`redlock_raise.lua`) and again by every renewal
/// (`redlock_extend.lua`), on every master; a force-release of a held name
/// sets the retention alone. So "counters never decrease" above holds while
/// a counter lives, and a master's counter outlives every lock key it held
/// by the retention, by that master's clock.
///
/// *Why tokens stay increasing across the expiry.* Take `G1`, `G2` and the
/// shared master `m` of step 1. If `m`'s counter still lives when `G2`'s
/// acquire script runs there, step 1 holds as written. Otherwise it expired:
/// `G1`'s acquire script on `m` set it (to at least its own counter) with
/// the TTL `TTL + retention` when `m`'s clock read `c`, and nothing shortens
/// it, so `G2`'s script runs when `m`'s clock reads at least
/// `c + TTL + retention − s` (`s`: how far it was set back after the expiry)
/// and takes at least the floor, `m`'s whole seconds × 10⁶. `T1` came from
/// some master's counter in the same round, when that master's clock read
/// at most `c + d` (`d`: how far its clock is ahead of `m`'s, the round's
/// span included); by (b) above it is below that clock's next whole second
/// × 10⁶, unless that counter had run ahead of its clock by `e` (a clock
/// set back while it lived). So `T2 > T1` whenever
/// `e + s + d + 1 s < TTL + retention`: **tokens increase across an expiry
/// unless the masters' clocks, set back or apart, account for more than
/// the lease's TTL and the retention less one second** (the floor counts
/// whole seconds; the single-master floor counts microseconds and has no
/// such second). The default retention (24 hours) leaves a day; with a
/// short retention keep `TTL + retention` above a second plus the masters'
/// clock disagreement. A larger step has the cost the crate docs describe:
/// a fenced store refuses the new holder until the clock passes the old
/// token, and two live holders still never share an order.
///
/// Cheap to clone: clones share the connections and subscribers.
/// [`Provider::with_lease`] gives a clone with other lease options.
#[derive(Clone)]
pub struct RedlockProvider {
    shared: Arc<Shared>,
    /// The lease of the mutexes it hands out: the options' default lease,
    /// or the one given to `with_lease`.
    lease: LeaseOptions,
}

impl fmt::Debug for RedlockProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let masters: Vec<&str> = self
            .shared
            .masters
            .iter()
            .map(|m| m.addr.as_str())
            .collect();
        f.debug_struct("RedlockProvider")
            .field("masters", &masters)
            .field("quorum", &self.shared.quorum)
            .field("prefix", &self.shared.options.prefix)
            .finish_non_exhaustive()
    }
}

impl RedlockProvider {
    /// Connects to the masters of `url`
    /// (`redis+redlock://[user:password@]h1:p1,h2:p2,…[/db][?options]`, see
    /// the [type's docs](RedlockProvider)).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for a bad URL (no host, a bad port, a master
    /// named twice, an unknown or repeated option), [`Error::InvalidOptions`]
    /// for a bad option value or `pool_size`. When fewer than a quorum of
    /// masters answer within the connect timeout: [`Error::Timeout`] if the
    /// others only gave no answer in time, else [`Error::Connection`], whose
    /// source names every master that failed (with its error) and every one
    /// that gave no answer; a refusal that retrying will not mend
    /// ([`Error::NotAllowed`] for credentials or an ACL, [`Error::Server`])
    /// comes as it is. Once so many masters failed (refused the connection,
    /// say) that the rest cannot make a quorum, the error comes at once,
    /// not at the end of the connect timeout.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: a dropped connect leaves no connection open.
    pub async fn connect(url: &str) -> Result<Self> {
        let (urls, options) = crate::target::redlock_url(url, RedisOptions::new())?;
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        Self::connect_masters(url, &urls, options).await
    }

    /// Connects to the masters `urls` (`redis://[user:password@]host:port[/db]`
    /// each, with at most the client's own query keys such as `protocol`)
    /// with `options`.
    ///
    /// # Errors
    ///
    /// As [`RedlockProvider::connect`]; distlock's options in a master's URL
    /// query are an [`Error::InvalidUrl`] (they belong in `options`).
    ///
    /// # Cancellation safety
    ///
    /// As [`RedlockProvider::connect`].
    pub async fn connect_with(urls: &[&str], options: RedisOptions) -> Result<Self> {
        let mut clean = Vec::with_capacity(urls.len());
        for url in urls {
            let (client_url, own) = options.clone().from_url(url)?;
            if own != options {
                return Err(invalid_url(
                    url,
                    "sets distlock options: give them in RedisOptions, once for all masters",
                ));
            }
            clean.push(client_url);
        }
        let clean: Vec<&str> = clean.iter().map(String::as_str).collect();
        Self::connect_masters(&urls.join(","), &clean, options).await
    }

    pub(crate) async fn connect_masters(
        whole: &str,
        urls: &[&str],
        options: RedisOptions,
    ) -> Result<Self> {
        options.validate()?;
        options.refuse_tls("redis+redlock")?;
        if options.pool_size.is_some() {
            return Err(Error::InvalidOptions(
                "redis+redlock keeps one connection per master: pool_size is not supported".into(),
            ));
        }
        if options.wait.is_some() {
            return Err(Error::InvalidOptions(
                "redis+redlock masters are independent (no replicas to wait for): wait_replicas is not supported"
                    .into(),
            ));
        }
        if urls.is_empty() {
            return Err(invalid_url(whole, "names no master"));
        }
        let mut seen = HashSet::new();
        let mut clients = Vec::with_capacity(urls.len());
        for url in urls {
            let client =
                redis::Client::open(*url).map_err(|e| invalid_url(url, format_args!("{e}")))?;
            let addr = match &client.get_connection_info().addr() {
                redis::ConnectionAddr::Tcp(host, port) => {
                    format!("{}:{port}", host.to_ascii_lowercase())
                }
                other => {
                    return Err(invalid_url(
                        url,
                        format_args!("is not a plain TCP master: {other}"),
                    ))
                }
            };
            if !seen.insert(addr.clone()) {
                return Err(invalid_url(
                    whole,
                    format_args!("names master {addr} twice: it would count twice in a quorum"),
                ));
            }
            clients.push((client, addr));
        }
        let quorum = clients.len() / 2 + 1;
        let mut masters = Vec::with_capacity(clients.len());
        for (client, addr) in clients {
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(options.connect_timeout))
                .set_response_timeout(Some(options.response_timeout))
                .set_number_of_retries(2)
                .set_min_delay(Duration::from_millis(10))
                .set_max_delay(Duration::from_millis(500));
            let conn = ConnectionManager::new_lazy_with_config(client.clone(), config)
                .map_err(|e| Error::InvalidOptions(e.to_string()))?;
            let subscriber = Subscriber::spawn(
                crate::wake::subscriber::Source::Fixed(Box::new(client)),
                crate::wake::subscriber::Timing::of(&options),
            );
            masters.push(Master {
                conn,
                subscriber,
                addr,
            });
        }
        let owner = distlock_core::inspect::owner_identity(options.owner_label.as_deref())
            .or_else(|_| distlock_core::inspect::owner_identity(None))
            .unwrap_or_else(|_| "unknown".to_owned());
        let lifecycle = Lifecycle::new();
        lifecycle.set_owner(&owner);
        let provider = RedlockProvider {
            lease: options.lease,
            shared: Arc::new(Shared {
                masters,
                quorum,
                owner,
                options,
                lifecycle,
            }),
        };
        provider.wait_for_quorum().await?;
        Ok(provider)
    }

    /// Loads the scripts on every master in parallel (which also checks that
    /// it answers) until a quorum answered, within the connect timeout; the
    /// others go on loading in the background until that timeout or the
    /// provider's close, whichever comes first. A master
    /// that comes later loads them at first use (`NOSCRIPT`).
    ///
    /// Without a quorum: a refusal that retrying will not mend (credentials,
    /// an ACL, a server error) as it is; [`Error::Timeout`] when every master
    /// short of the quorum just gave no answer in time (still loading, or
    /// timed out); else [`Error::Connection`] whose source (`NoQuorum`)
    /// names every master that failed, and how, and every one silent. It
    /// ends as soon as too many failed for the rest to make a quorum.
    async fn wait_for_quorum(&self) -> Result<()> {
        let timeout = self.shared.options.connect_timeout;
        let started = tokio::time::Instant::now();
        let mut pings: futures::stream::FuturesUnordered<_> = self
            .shared
            .masters
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let mut conn = m.conn.clone();
                async move {
                    for script in [
                        &*REDLOCK_ACQUIRE,
                        &*REDLOCK_RAISE,
                        &*RELEASE,
                        &*REDLOCK_EXTEND,
                    ] {
                        if let Err(e) = script.prepare_invoke().load_async(&mut conn).await {
                            // A timeout says how long it waited: the
                            // response timeout or the connect timeout,
                            // whichever ran out.
                            return (i, Err(from_redis("connect", waited(started), e)));
                        }
                    }
                    (i, Ok::<(), Error>(()))
                }
            })
            .collect();
        let until = started + timeout;
        let mut up = Vec::new();
        let mut failed: Vec<(usize, Error)> = Vec::new();
        // The connect timeout, if it ran out.
        let mut ran_out = None;
        while up.len() < self.shared.quorum {
            match tokio::time::timeout_at(until, futures::StreamExt::next(&mut pings)).await {
                Ok(Some((i, Ok(())))) => up.push(i),
                Ok(Some((i, Err(e)))) => {
                    failed.push((i, e));
                    // Too many failed for a quorum: no need to wait for the
                    // rest (a refused connection fails at once).
                    if self.shared.masters.len() - failed.len() < self.shared.quorum {
                        break;
                    }
                }
                Ok(None) | Err(_) => {
                    ran_out = Some(timeout);
                    break;
                }
            }
        }
        if up.len() < self.shared.quorum {
            for m in &self.shared.masters {
                m.subscriber.shut_down();
            }
            return Err(self.no_quorum(&up, failed, ran_out, waited(started)));
        }
        if !pings.is_empty() {
            // Until the connect timeout, or a `close()` (which must not find
            // connections still kept open by this task).
            let lifecycle = Arc::clone(&self.shared.lifecycle);
            drop(tokio::spawn(async move {
                let loading =
                    async { while futures::StreamExt::next(&mut pings).await.is_some() {} };
                tokio::select! {
                    _ = tokio::time::timeout_at(until, loading) => {}
                    () = lifecycle.closed() => {}
                }
            }));
        }
        Ok(())
    }

    /// The error of a connect that found the masters `up` answering, fewer
    /// than a quorum, the masters of `failed` refused or timed out (in the
    /// order they did) and the rest still loading, when the connect timeout
    /// `within` ran out (`None`: before it, once too many had failed for a
    /// quorum), `waited` after it began.
    fn no_quorum(
        &self,
        up: &[usize],
        mut failed: Vec<(usize, Error)>,
        within: Option<Duration>,
        waited: Duration,
    ) -> Error {
        if let Some(at) = failed.iter().position(|(_, e)| !e.is_retryable()) {
            return failed.swap_remove(at).1;
        }
        // Nobody refused: the masters short of a quorum only gave no answer
        // in time (the connect's, or their own response timeout).
        if failed.iter().all(|(_, e)| e.is_timeout()) {
            return Error::Timeout {
                operation: "connect",
                after: within.unwrap_or(waited),
            };
        }
        let masters = &self.shared.masters;
        let silent = (0..masters.len())
            .filter(|i| !up.contains(i) && !failed.iter().any(|(f, _)| f == i))
            .map(|i| masters[i].addr.clone())
            .collect();
        Error::connection(
            "redis",
            NoQuorum {
                masters: masters.len(),
                quorum: self.shared.quorum,
                answered: up.len(),
                failed: failed
                    .into_iter()
                    .map(|(i, e)| (masters[i].addr.clone(), e))
                    .collect(),
                silent,
                within,
            },
        )
    }

    /// The options in force.
    #[must_use]
    pub fn options(&self) -> &RedisOptions {
        &self.shared.options
    }

    /// The number of masters.
    #[must_use]
    pub fn masters(&self) -> usize {
        self.shared.masters.len()
    }

    /// The quorum: N/2 + 1 masters.
    #[must_use]
    pub fn quorum(&self) -> usize {
        self.shared.quorum
    }

    /// The Redis key of the lock `name` on every master: the prefix followed
    /// by the name.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a bad name.
    pub fn lock_key(&self, name: &str) -> Result<String> {
        Ok(RedlockKeys::new(&self.shared.options.prefix, &Name::new(name)?).lock)
    }

    /// The Redis key of the fencing counter of the lock `name` on every
    /// master: `{PREFIX NAME}:redlock:fence`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a bad name.
    pub fn fence_key(&self, name: &str) -> Result<String> {
        Ok(RedlockKeys::new(&self.shared.options.prefix, &Name::new(name)?).fence)
    }

    fn unsupported(what: &'static str) -> Error {
        Error::Unsupported {
            backend: BACKEND,
            what,
        }
    }
}

#[async_trait]
impl Provider for RedlockProvider {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn owner(&self) -> &str {
        &self.shared.owner
    }

    /// The mutex `name` (the only `kind` Redlock has): its holder is the
    /// lock value a quorum of the masters hold, with the owner identity and
    /// the acquisition time of its holder records, the largest of their
    /// fencing counters (the guard's token) and, as lease left, the
    /// quorum-th longest of its keys' PTTLs. Keys on a minority are not a
    /// hold. Reads only, one script per master, all in parallel.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] for another kind; the first master's error
    /// when fewer than a quorum answered, or when the masters that did not
    /// answer decide whether it is held; [`Error::Conflict`] for a key of
    /// the wrong type.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: it only reads.
    async fn inspect(&self, name: &str, kind: PrimitiveKind) -> Result<Snapshot> {
        ops::inspect(&self.shared, &Name::new(name)?, kind).await
    }

    /// Deletes the mutex `name`'s lock key on every master whatever its
    /// value (dangerous: see [`Provider::force_release`]), advances every
    /// master's fencing counter and publishes a release on each, so
    /// waiters try at once. The evicted holder's watchdog finds its key
    /// gone on a quorum at its next renewal and fires `lost()`. The
    /// returned fence is a bound the next holder's token is above: the
    /// (N − quorum + 1)-th largest counter (a master that did not answer
    /// counts as 0). `evicted` is 1 when keys were deleted on masters that
    /// could have made a quorum.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] for another kind; the first master's error
    /// when fewer than a quorum answered (the masters that did answer were
    /// forced; run it again once the others are back);
    /// [`Error::Conflict`] for a key of the wrong type.
    ///
    /// # Cancellation safety
    ///
    /// Not cancellation safe: dropped half-way, some masters may have been
    /// forced and others not; run it again.
    async fn force_release(&self, name: &str, kind: PrimitiveKind) -> Result<ForceReleased> {
        ops::force_release(&self.shared, &Name::new(name)?, kind).await
    }

    async fn close(&self) -> Result<()> {
        let released = self.shared.lifecycle.close().await;
        for m in &self.shared.masters {
            m.subscriber.shut_down();
        }
        released
    }

    fn default_lease(&self) -> LeaseOptions {
        self.lease
    }

    /// A clone sharing the masters' connections, subscribers and held
    /// leases, with `lease`; any TTL lease is accepted.
    fn with_lease(&self, lease: LeaseOptions) -> Result<Arc<dyn Provider>> {
        self.shared.lifecycle.check_open()?;
        Ok(Arc::new(RedlockProvider {
            shared: Arc::clone(&self.shared),
            lease,
        }))
    }

    fn mutex(&self, name: &str) -> Result<Arc<dyn Lock>> {
        self.shared.lifecycle.check_open()?;
        let name = Name::new(name)?;
        Ok(Arc::new(RedlockMutex {
            shared: Arc::clone(&self.shared),
            keys: Arc::new(RedlockKeys::new(&self.shared.options.prefix, &name)),
            name,
            lease: self.lease,
        }))
    }

    fn fair_mutex(&self, name: &str) -> Result<Arc<dyn Lock>> {
        self.shared.lifecycle.check_open()?;
        Name::new(name)?;
        Err(Self::unsupported(
            "the fair mutex (use redis:// or redis+sentinel:// for it)",
        ))
    }

    fn election(&self, name: &str) -> Result<Arc<dyn Election>> {
        self.shared.lifecycle.check_open()?;
        Name::new(name)?;
        Err(Self::unsupported(
            "leader election (use redis:// or redis+sentinel:// for it)",
        ))
    }

    fn rw_lock(&self, name: &str) -> Result<Arc<dyn ReadWriteLock>> {
        self.shared.lifecycle.check_open()?;
        Name::new(name)?;
        Err(Self::unsupported(
            "the read-write lock (use redis:// or redis+sentinel:// for it)",
        ))
    }

    fn semaphore(&self, name: &str, permits: u32) -> Result<Arc<dyn Semaphore>> {
        self.shared.lifecycle.check_open()?;
        Name::new(name)?;
        check_permits(permits)?;
        Err(Self::unsupported(
            "the semaphore (use redis:// or redis+sentinel:// for it)",
        ))
    }

    fn id_generator(&self, name: &str, block_size: u64) -> Result<Arc<dyn IdGenerator>> {
        self.shared.lifecycle.check_open()?;
        Name::new(name)?;
        if block_size == 0 {
            return Err(Error::InvalidOptions(
                "an id generator's block size must be at least 1".into(),
            ));
        }
        Err(Self::unsupported(
            "id generators (use redis:// or redis+sentinel:// for them)",
        ))
    }
}
