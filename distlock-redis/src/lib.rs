//! Redis backend of [distlock](https://docs.rs/distlock): the lock of
//! `SET key token NX PX ttl` done right.
//!
//! Through the facade (`distlock`, feature `redis`) it is
//! `distlock::connect("redis://…")`, or `distlock::redis::RedisProvider` for
//! the Redis options; alone, the same names are under `distlock_redis::`
//! (and the core's under `distlock_redis::distlock_core::`).
//!
//! ```no_run
//! # mod distlock {
//! #     pub use distlock_core::*;
//! #     pub mod redis { pub use distlock_redis::*; }
//! # }
//! use std::time::Duration;
//! use distlock::redis::RedisProvider;
//! use distlock::Provider;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
//! let locks = RedisProvider::connect("redis://127.0.0.1:6379").await?;
//! let mutex = locks.mutex("orders/42")?;
//! if let Some(guard) = mutex.lock_timeout(Duration::from_secs(5)).await? {
//!     println!("fencing token {}", guard.fencing_token());
//!     guard.release().await?;
//! }
//! # Ok(()) }
//! ```
//!
//! Each protocol is told once, here, with its bounds: [the
//! mutex](#the-mutex), [the fair mutex](#the-fair-mutex), [leader
//! election](#leader-election), [the read-write lock and the
//! semaphore](#read-write-lock-and-semaphore-keys), what every acquisition
//! does when it is cancelled or its outcome is unknown
//! ([Cancellation](#cancellation)), [liveness](#liveness) (what nothing
//! dead or silent may cost), [fencing tokens](#fencing-tokens),
//! [ids](#ids) and [Redlock](#redlock). The modules say how they implement
//! their part and point here.
//!
//! # The mutex
//!
//! * **Acquire**: one Lua script runs `SET key value NX PX ttl` and, on
//!   success, takes the fencing token ([Fencing tokens](#fencing-tokens));
//!   otherwise it returns the holder's remaining `PTTL`. The lock key's value is `<token>|<owner identity>`:
//!   the token is 128 random bits, unique per acquisition, never logged;
//!   the value is the holder record too (no other key is written). An
//!   uncontended lock + release runs 6 commands inside its scripts (`SET NX
//!   PX GET`, `TIME`, `SET GET`; `GET`, `DEL`, one `EXISTS` of the fair
//!   queue, the line, the listeners and the streak).
//! * **Release**: compare-and-delete (only our value), then, when anyone
//!   waits or listens, the hand-over and a `PUBLISH` on the lock's channel
//!   (a hand-over to the line overwrites our value with the reservation, in
//!   the same script, rather than deleting it first). **Extend**: compare-and-`PEXPIRE`. Both have redis-py's
//!   `Lock` semantics. Scripts run by `EVALSHA`, loaded on `NOSCRIPT`.
//! * **Watchdog**: the core watchdog renews at TTL/3 while the guard lives;
//!   a renewal that finds another owner fires `lost()`.
//! * **Waiting without polling**: one shared pub/sub connection per provider
//!   wakes waiters on the release message; waiters also re-check when the
//!   holder's `PTTL` runs out and every re-check interval (500 ms by
//!   default), so an expiry or a release by a client that does not publish
//!   is noticed. A cancelled or failed acquisition deletes a key it may have
//!   set ([Cancellation](#cancellation)).
//! * **Providers take turns, one wake-up per release.** A refused `lock()`
//!   puts its provider in the lock's line (`{PREFIX NAME}:waiting`, once per
//!   provider however many of its tasks wait) inside the same script call.
//!   A release takes the first provider off the line, reserves the free lock
//!   for it for 50 ms (the lock key holds `distlock:handoff:<provider id>`
//!   meanwhile, so every other `SET NX` fails by itself) and publishes
//!   `to:<provider id>`: that provider's subscriber wakes one of its
//!   waiters, nobody else wakes, and a client that asks meanwhile is refused
//!   and joins the line. So at 16 processes a handoff costs the release and
//!   one acquire, not one attempt per process, and no process re-takes the
//!   lock over and over while others wait. The mutex stays unfair in that a
//!   free lock with nobody in line goes to whoever asks, and within a
//!   provider any of its waiters may be the one woken. A provider whose last
//!   waiter leaves takes itself off the line and passes a reservation made
//!   for it on (`mutex_pass`): a waiter that times out or fails does so
//!   **before `lock_timeout` returns** (within what is left of one response
//!   timeout past its deadline), so a program that ends right after leaves
//!   nothing behind; a cancelled one, through the provider's line task. A
//!   waiter that gets the lock while the other waiters of its provider
//!   left during its attempt takes the provider off the line too (the
//!   attempt was sent while they still waited). So does a provider being
//!   closed: `close()` wakes its waiters and waits, at most one response
//!   timeout, until they have left the lines (and the fair mutex's queues)
//!   before its connection goes. A place in line lives only as long as its
//!   provider is known to hear hand-overs (see [Liveness](#liveness)): a
//!   dead, closed or silent provider drops out by itself, and a release
//!   skips it. A waiter that listens but could not join the line (its
//!   pub/sub connection not known to deliver) puts its provider in
//!   `{PREFIX NAME}:listening` until its next look, so a release with
//!   nobody in line still publishes `released` for it; with nobody waiting
//!   or listening a release publishes nothing. `try_lock` (and any
//!   other kind of primitive) takes a reserved lock: a free lock is free. The channel stays subscribed 2 s after its last
//!   waiter left, so a lock contended again and again costs no `SUBSCRIBE`
//!   per wait. Mutual exclusion never depends on the reservation; a
//!   redis-py `Lock` waits it out too (at most 50 ms). When a `try_lock`
//!   took the reserved lock, the reserved provider's woken waiter, finding
//!   the lock taken, queues again at the front of the line.
//! * **Clients outside the line get turns.** A client that is not in the
//!   line — redis-py or anything else polling with `SET NX`, which leaves
//!   no trace when refused — would never find the key free while hand-overs
//!   follow one another. So a release after a streak of hand-overs leaves
//!   the lock free instead (`{PREFIX NAME}:streak` counts them; the line
//!   keeps its order) and publishes `turn:3:<provider id>`: every waiter
//!   of this version holds back for 3 ms, and so does the releasing
//!   provider's next `lock()`; then one waiter of the first live provider
//!   in line asks (one wake-up per turn). The hold-back ends early once
//!   someone takes the turn (the lock key is found set, or changes, through
//!   client tracking). A streak is 64 hand-overs at
//!   first; once a waiter of this version saw someone take a turn, or found
//!   a holder outside the line, it is 3, and every turn nobody takes
//!   doubles it again (6, 12, … up to 64). So **a client outside the line
//!   that asks at least every 3 ms gets the lock within 65 acquisitions of
//!   a contended name, and while it keeps asking, within about 4**; in a
//!   run of 2 distlock and 2 redis-py processes (polling every millisecond)
//!   the lock passes between the groups in about 3 acquisitions of 10. A
//!   turn nobody takes leaves the lock free for 3 ms at most, once every 65
//!   acquisitions on a name only distlock uses: what the guarantee costs.
//!   Right after clients outside the line took turns, the streak stays
//!   short until turns nobody takes have doubled it back (six of them) or a
//!   minute passed, so a provider left alone on the name meanwhile pays a
//!   few such turns too. A client outside the line that holds when the
//!   waiter named by a turn gives up (its deadline) is noticed by the next
//!   waiter within one re-check interval, as any release that does not
//!   publish is.
//!   A provider of an earlier distlock version that waits in the line (its
//!   place has no liveness entry: that version kept none) gets its
//!   hand-over that version's way: the lock key left free,
//!   `{PREFIX NAME}:handoff` set to it, and a turn for this version's
//!   waiters; so both versions on one name take turns during a rolling
//!   upgrade. Contended, a release costs one `INCR` more (a `SET` at each
//!   turn), and an attempt after a taken turn or behind a foreign holder
//!   one `SET`; uncontended, nothing. Mutual exclusion and fencing never
//!   depend on turns.
//! * **Next to clients that do not publish** (redis-py): a refused attempt
//!   tells whether the holder is a distlock holder (the lock's value is
//!   `<token>|<owner>`, or an earlier version's holder record matches it). While it is not, the waiter has the server
//!   tell it when the key changes: the provider keeps one extra connection
//!   (RESP3, opened at the first such wait) with client tracking on
//!   (`CLIENT TRACKING ON`, Redis 6+), reads the key there (`EXISTS`), and
//!   the server pushes an `invalidate` message at the key's next change —
//!   deleted, set, expired, its TTL changed. The waiter tries again within
//!   a round trip of the release rather than at its next poll. Waiters of
//!   one key in a provider share one read. Where tracking is not available
//!   (a server that refuses `CLIENT`, or before 6; Redis Cluster;
//!   Sentinel), the waiter re-checks after 1 ms, doubling up to the
//!   re-check interval, and back to 1 ms whenever the holder has more time
//!   left than at the last look (a new hold). A tracking connection that
//!   drops or stops answering within the response timeout is replaced by
//!   the next wait, and its waiters are woken to re-check and read the key
//!   again on the new one.
//!
//! # Liveness
//!
//! Nothing dead or silent stalls a lock for long, and no wait depends on
//! pub/sub alone. With the re-check interval `R` (500 ms by default), the
//! response timeout `T` (2 s) and the health-check interval `H = min(R, 1
//! s)` (500 ms):
//!
//! * **The pub/sub connection is health-checked.** While any channel is
//!   subscribed (a waiter, an observer, or a channel lingering after its
//!   last waiter), the subscriber sends `PING` on it every `H` (RESP2 and
//!   RESP3 allow it while subscribed). A message read after the `PING`
//!   was sent answers it too (under a flood of messages the reply waits in
//!   the socket behind them; the connection plainly delivers), so a flood
//!   never gets a healthy connection replaced; a silent one is then found
//!   once what its socket had buffered is read. A `PING` or `SUBSCRIBE` with no
//!   answer within `T` drops the connection: a silent (half-open)
//!   connection is found at most `H + T` (2.5 s) after it last answered.
//!   Every waiter and observer is then woken to look again, and the
//!   subscriber reconnects and resubscribes while anyone waits (within the
//!   connect timeout, 5 s by default, retried with backoff up to 1 s). On
//!   Redis Cluster it reconnects to the next seed node given to
//!   `connect_cluster` (the first after the last), so a dead, frozen or
//!   silent node costs one connect timeout at most, not every reconnect.
//!   Meanwhile, and always, waiters re-check every `R` and at the holder's
//!   expiry; `observe()` re-reads the leader record every `R` too.
//! * **A half-open command connection is replaced.** Without
//!   `pool_size` the provider's commands share one multiplexed connection,
//!   which the client reconnects when the socket drops but not when replies
//!   stop (a response timeout is no reconnect trigger in redis-rs). A
//!   command left unanswered for `T` (its reply timed out, or its caller
//!   gave up on it after at least three quarters of `T`) replaces the
//!   connection with a fresh one, which connects at its next command:
//!   commands sent from then on recover, so a silent command connection
//!   costs the commands in flight on it (each one response timeout) and
//!   nothing after the first of them times out (recovery within about one
//!   `T` after that command was sent, plus the connect). Answered commands
//!   change nothing. A command path that lost its return direction still
//!   runs what it sends (a pool's connections, and Redis Cluster's, are
//!   not replaced on a timeout): so after one command of the provider went
//!   unanswered, its waiting attempts take it off the plain mutex's line
//!   rather than queue it, and the line's refreshes wait until a `PING` on
//!   the command path is answered; a provider that cannot hear replies
//!   drops out of every line at most `H + T` after its last refresh that
//!   ran, itself at most `H` after the path went deaf.
//! * **A held lease moves off a silent connection.** A lease's renewals
//!   and release keep to one connection, so they land in the order sent.
//!   A renewal left unanswered for `T` lets that connection go, and the
//!   watchdog's next try (a quarter of the renewal interval later) goes out
//!   on a fresh one: a lease outlives a command connection that stays open
//!   but goes silent for good, provided `T` plus that pause fits in the
//!   time left (with the defaults, 2 s of the 20 s a renewal leaves).
//!   What the old socket still carried may land later, alone or as a
//!   prefix (a socket can deliver some requests and die before the rest),
//!   and set its TTL then. So the lease counts every renewal sent on its
//!   connection and not answered (cancelled ones too; an answer to a later
//!   one proves they ran), and:
//!   * it lets the connection go on a timeout only when the renewal that
//!     timed out is the shortest of them and no shorter than the lease's
//!     TTL. Otherwise it keeps the connection, and later renewals queue
//!     behind what it holds: a shorter manual `extend` cancelled or
//!     unanswered costs this recovery, never safety;
//!   * the shortest TTL left unanswered on a connection it let go (on a
//!     timeout or a connection error) bounds every later renewal. The
//!     watchdog renews with the lease's TTL and does not meet this bound
//!     after a timeout of its own; a manual `extend` for longer is refused
//!     with [`Error::InvalidOptions`](distlock_core::Error::InvalidOptions)
//!     (extend for at most that TTL, or release).
//!
//!   With `pool_size` or on Redis Cluster there is **no such recovery**:
//!   the next connection is whatever the pool or the cluster client gives,
//!   which may be the same silent one (neither replaces a connection on a
//!   timeout), and the lease then ends at its deadline.
//! * **A place in the plain mutex's line expires by itself.** Each place
//!   has a deadline (`{PREFIX NAME}:waiting:alive`, by the server's `TIME`)
//!   that its provider pushes on only while its pub/sub connection is known
//!   to deliver: each attempt of a waiter carries how long that is (until
//!   the next health check's answer is due, at most `H + T`; `0` takes the
//!   provider off the line rather than queuing it, its waiter then relying
//!   on re-checks), and each answered health check refreshes the places
//!   of the locks its plain waiters wait on (`line_alive`, one script call
//!   per lock and health check, only while someone waits). Refreshes are
//!   coalesced (at most one pending per lock: a slow command connection
//!   never queues them up), run apart from the leaves (a leave never waits
//!   behind them), and each vouches only for what is left of its answer's
//!   `H + T` (none left, or no waiter of this provider on that lock any
//!   more: not sent); so a refresh that ran late never keeps a place past
//!   `H + T` after the answer it stands for. A release, and
//!   a pass, hand over to the first place whose deadline has not passed,
//!   dropping the others. So **a provider that died (even `SIGKILL`: nothing
//!   runs at exit), was cut off, or whose pub/sub connection went silent
//!   drops out of every line at most `H + T` (2.5 s by default) after its
//!   last sign of life**, and no release reserves the lock for it after
//!   that. A release within that window still reserves the lock for it
//!   once: the waiters behind it lose the reservation (50 ms, for a waiter
//!   refused by it) or at most one re-check interval `R`; the place is gone
//!   with that release. A provider that is alive but whose place lapsed
//!   (its refresh came late: a stalled runtime) is not left waiting for
//!   its re-check: the next refresh finds the place gone and wakes one of
//!   its waiters, whose attempt queues it again (within `H`).
//! * **Queues expire by themselves**: a read-write lock's or a semaphore's
//!   queue entry lives `2R + T` (3 s) after its waiter's last attempt, a
//!   fair waiter's (fair mutex, election candidate) `min(2R + T, lease
//!   TTL)`; a waiter refreshes its entry at every attempt, at least every
//!   `R` (a fair waiter every `min(R, entry life / 3)`), so a crashed
//!   waiter holds nobody back longer than its entry's life. Entries expire
//!   side by side: several dead waiters cost one entry life, not one each.
//!   A hand-over to a waiter whose subscriber is silent costs the queue at
//!   most its waiter's next heartbeat, or the subscriber's replacement,
//!   whichever comes first.
//! * **Every wait keeps the caller's deadline**, subscribing included: a
//!   waiter never waits for the `SUBSCRIBE` reply (its subscription wakes
//!   it to look again when the reply comes), so `lock_timeout(d)` returns
//!   at `d` plus its last attempt and its leave, one response timeout at
//!   most, even when the reply never comes.
//!
//! # Keys
//!
//! | key | what |
//! |---|---|
//! | `PREFIX NAME` | the lock (plain and fair mutex): value = `<token>\|<owner identity>`, TTL = lease; for 50 ms after a hand-over, `distlock:handoff:<provider id>` (free, reserved); while another kind holds the name, its marker (see [One name is one lock](#one-name-is-one-lock)) |
//! | `{PREFIX NAME}:fence` | fencing counter (an integer string: `max(previous + 1, server TIME in µs)`), TTL = lease + [fence retention](RedisOptions::fence_retention), set again at every acquisition and renewal (see [Fencing tokens](#fencing-tokens)) |
//! | `{PREFIX NAME}:released` | pub/sub channel of release and hand-over messages |
//! | `{PREFIX NAME}:fair:queue` | fair waiters: zset waiter id → arrival number |
//! | `{PREFIX NAME}:fair:timeouts` | fair waiters' entry expiry: zset waiter id → server ms |
//! | `{PREFIX NAME}:holder` | the holder record of each Redlock master, and of plain and fair mutex holds of earlier distlock versions (read, never written, by this version's mutexes): hash `lock` (the lock key's value it belongs to), `fence`, `at` (acquired at, server ms), `owner`; same TTL as the lock |
//! | `{PREFIX NAME}:fair:owners` | fair waiters' owner identities: hash waiter id → owner, expiring with the queue |
//! | `{PREFIX NAME}:waiting` | the plain mutex's line of waiting providers: zset provider id (`RedisProvider::line_id`) → place, expiring 60 s after the last join |
//! | `{PREFIX NAME}:waiting:alive` | the line's liveness: zset provider id → server ms until which it is known to hear hand-overs (see [Liveness](#liveness)), expiring with the line |
//! | `{PREFIX NAME}:listening` | the plain mutex's listeners that are not in line: zset provider id → server ms until which it listens (its re-check interval plus one response timeout), taken off when it joins the line, acquires or leaves; while it exists, a release with nobody in line publishes `released` |
//! | `{PREFIX NAME}:handoff` | the reservation of earlier versions (a provider id, 50 ms): read by their clients; this version sets it when it hands over to a provider of such a version in the line, and deletes it once someone holds the lock |
//! | `{PREFIX NAME}:streak` | the plain mutex's hand-overs since the last turn, plus 1024 × the hand-overs due before the next turn (0: 64), an integer expiring 60 s after the last turn; an attempt that saw a turn taken or a holder outside the line sets it to 3 × 1024; deleted by a release with nobody in line while turns are not taken (see [the mutex](#the-mutex)) |
//! | `{PREFIX NAME}:elect` | an election's lease: value = `<token>\|<owner identity>`, TTL = lease |
//! | `{PREFIX NAME}:elect:leader` | the leader record `"<term> <candidate id>"`, same TTL |
//! | `{PREFIX NAME}:elect:fence` | the election's term counter (as `:fence`) |
//! | `{PREFIX NAME}:elect:queue`, `…:elect:timeouts` | candidates, as the fair queue |
//! | `{PREFIX NAME}:elect:owners` | the candidates' owners, as `:fair:owners` (`…:elect:holder`: earlier versions' leader record, as `:holder`) |
//! | `{PREFIX NAME}:elect:events` | pub/sub channel of wins, resignations, hand-overs |
//! | `{PREFIX NAME}:revoke` | requests to release (`Provider::request_release`) of mutex and fair mutex holds: hash lock key value → `1`, expiring with the longest hold asked; `…:rw:revoke`, `…:sem:revoke` (token → `1`) and `…:elect:revoke` for the other kinds. Read by the holder's renewal script (`extend` answers 3: extended and asked) |
//! | `{PREFIX NAME}:ids` | id generator counter (`INCRBY`) |
//! | `{PREFIX NAME}:redlock:fence` | [Redlock](#redlock)'s fencing counter, on each master; TTL = lease + [fence retention](RedisOptions::fence_retention), as `:fence` ([why tokens still increase](crate::RedlockProvider#the-counters-retention)) |
//!
//! The prefix is empty by default, so the lock key is the name itself.
//! Auxiliary keys wrap the lock key in a hash tag, so in Redis Cluster they
//! share its slot (names and prefixes never contain braces).
//!
//! Scripts (`src/scripts/*.lua`, each opening with its keys, arguments and
//! replies): `acquire` (plain), `fair_acquire` (fair mutex and election),
//! `release` and `extend` (every lease of this kind; the plain mutex
//! releases with `mutex_release`, which also hands over to its line, and
//! leaves the line with `mutex_pass`; both pick the first live provider
//! with the `line_pop` prelude, and `line_alive` keeps a place alive),
//! `fair_leave` (a fair
//! waiter or candidate leaving), `elect_leader` (reading the leader record),
//! `inspect_lock` and `force_lock` (see [Inspect and
//! force-release](#inspect-and-force-release)).
//!
//! # The fair mutex
//!
//! The fair mutex takes **the plain mutex's lock key and fencing counter**,
//! so a plain mutex, a fair mutex and a redis-py `Lock` of one name exclude
//! each other, and fencing tokens increase across all of them. Fair waiters
//! queue in arrival order at the server; **plain acquirers (and redis-py)
//! may barge** ahead of the queue: they take the free lock without looking
//! at it.
//!
//! * **A dead waiter never blocks the queue.** Each entry expires by itself
//!   (its life and refresh are in [Liveness](#liveness)); a waiter refreshes
//!   it with the same script that tries the lock, and every such call first
//!   drops expired entries. Dead
//!   entries expire side by side, so several dead waiters cost the queue one
//!   entry TTL, not one each; the queue keys themselves expire with their
//!   last entry. A waiter whose entry lapsed (a paused process, a long
//!   partition) is **queued again at the back** by its next call and keeps
//!   waiting.
//! * **One wake-up per hand-over.** A release (fair or plain) drops expired
//!   entries and publishes `to:<waiter id>` of the first live waiter on the
//!   release channel (`released` when nobody queues). The shared subscriber
//!   of each provider wakes only its own waiter with that id, so one release
//!   wakes one waiter across every provider; that waiter takes the lock with
//!   one script call. Plain waiters are not woken by a hand-over: they look
//!   again at the holder's expiry and every re-check interval.
//! * **No hand-over is lost for good.** A release that publishes nothing (an
//!   expiry, redis-py) or a hand-over to a waiter that just died is covered
//!   by the waiters' own re-checks: at the holder's `PTTL`, at the expiry of
//!   a dead head while the lock is free, and every re-check interval.
//! * **Cancellation.** A waiter that times out or is dropped removes its
//!   entry with `fair_leave` ([Cancellation](#cancellation)).
//!
//! # Leader election
//!
//! An election is the fair queue's machinery on keys of its own
//! (`{PREFIX NAME}:elect…`: same slot as the mutex of that name, but a
//! different thing). Candidates queue in campaign order; the winner's
//! acquire writes the leader record next to the lease and publishes
//! `elected`; the watchdog extends both, a resignation or a dropped
//! [`Leadership`](distlock_core::Leadership) deletes both and hands over.
//! The term is the election's fencing token. `observe()` re-reads the record
//! on every message of the election's channel, when the record expires
//! (an expiry publishes nothing) and every re-check interval (a message
//! lost to a silent pub/sub connection); an observer that falls behind
//! sees the latest leader.
//!
//! # Read-write lock and semaphore keys
//!
//! Both are "holders plus a queue", all keys hash-tagged on the lock key
//! (one Cluster slot); `K` stands for `PREFIX NAME`:
//!
//! | read-write lock | semaphore | what |
//! |---|---|---|
//! | `{K}:rw:writer` | `{K}:sem:permits` | the writer (value = token, `PX` = lease) / the number of permits the holders were admitted under (kept while holders exist) |
//! | `{K}:rw:readers` | `{K}:sem:holders` | sorted set: one member per read share / permit (its token), scored by its expiry in server ms |
//! | `{K}:rw:queue` | `{K}:sem:queue` | sorted set: waiters (`r:…`/`w:…` for the lock) scored by arrival (server µs): the FIFO order |
//! | `{K}:rw:alive` | `{K}:sem:alive` | sorted set: the same waiters scored by the expiry of their entry |
//! | `{K}:rw:fence` | `{K}:sem:fence` | fencing counter (as the mutex's) |
//! | `{K}:rw:released` | `{K}:sem:released` | pub/sub channel of wake-ups addressed to one waiter (`to:<waiter id>`) |
//! | `{K}:rw:info` | `{K}:sem:info` | holder records: hash token → `"<fence> <at ms> <owner>"` (the writer: field `w` → `"<token> <fence> <at ms> <owner>"`), fields purged with their holders, the hash living as long as the longest hold |
//! | `{K}:rw:owners` | `{K}:sem:owners` | waiters' owner identities: hash waiter → owner, fields purged with their waiters, expiring with the queue |
//!
//! * **Scripts** (`rw_acquire`/`sem_acquire`, `…_release`, `…_extend`):
//!   every script first purges expired holders (`TIME` of the server) and
//!   dead waiters (entries whose `alive` score passed). An acquire admits a
//!   writer when nobody holds and no live waiter is queued ahead of it; a
//!   reader when no writer holds and no writer is queued ahead of it (so once
//!   a writer waits, later readers queue behind it); a permit when holders +
//!   waiters ahead < permits. Admitted: the fencing token (the one rule of
//!   [Fencing tokens](#fencing-tokens)), the hold, and the waiter leaves
//!   the queue. Not admitted and waiting: the waiter enters (or keeps its
//!   place in) the queue and refreshes its entry (its life in
//!   [Liveness](#liveness)); the script returns the earliest expiry that
//!   could change the answer. A
//!   semaphore asked with another number of permits while holders exist
//!   fails with `PermitsMismatch` and changes nothing. Extend re-scores the
//!   token only while it is a member (the writer: compare-and-`PEXPIRE`);
//!   release removes it. The zsets carry a `PEXPIREAT` at their last score,
//!   so nothing outlives its holders and waiters (the fence counter stays
//!   for the [fence retention](RedisOptions::fence_retention) more, as the
//!   mutex's).
//! * **Cancellation**: as every acquisition's ([Cancellation](#cancellation)).
//! * **Wake-ups**: every acquire and release script compares the queued
//!   waiters an attempt would admit (none while a writer holds; the head
//!   writer once no reader holds; the run of readers at the head of the
//!   queue; the first permits − holders waiters) before and after its
//!   changes, and publishes `to:<waiter id>` for each waiter it newly let in:
//!   a release (a writer's wakes the run of readers queued behind it, one
//!   message each; the last reader's wakes the head writer; a permit wakes
//!   the next waiter), a waiter leaving the queue (it hands over if it was
//!   one that could have got in, or if it held the ones behind back), and a
//!   purge of expired holders or dead waiters noticed by any script. An
//!   admission lets nobody new in (the ones it could free were let in with
//!   it). Waiters subscribe under their queue id, so each message wakes
//!   exactly that waiter on whichever provider it waits: one wake-up per
//!   admission across all providers. An expiry publishes nothing by itself:
//!   waiters also re-check at the earliest expiry their script reported
//!   (a holder, a waiter's entry) and every re-check interval, which also
//!   covers a wake-up lost with the pub/sub connection.
//! * **Fairness**: FIFO among waiters for both (as the in-process backend);
//!   an acquisition that does not wait (`try_lock`) counts every live
//!   waiter as ahead of it (a reader: every queued writer), so a waiter is
//!   never starved by newcomers.
//!   A waiter that cannot reach the server for longer than its entry lives
//!   loses its place and queues again at the end.
//!
//! # Cancellation
//!
//! Every acquisition of [`RedisProvider`]'s primitives (the mutex, the
//! fair mutex, the election, the read-write lock, the semaphore) runs the
//! same attempt, each family supplying only its script:
//!
//! * each attempt has a **fresh token** (an undo still running for an
//!   earlier attempt never touches a later one's hold), goes out on one
//!   pinned connection, and is bounded by the response timeout `T` even
//!   while the client reconnects (so every wait keeps the caller's
//!   deadline, as [Liveness](#liveness) bounds it);
//! * before the script is sent, its **undo is armed**: an attempt that is
//!   cancelled, times out or fails mid-flight is taken back by
//!   compare-and-delete of its own value (never someone else's), on the
//!   attempt's connection so that it reaches the server after the attempt,
//!   retried (20 ms doubling to 500 ms) until what it takes back would have
//!   expired by itself (the lease TTL + `T` after the attempt was sent). A
//!   queued waiter's place (fair queue, read-write lock, semaphore) is left
//!   the same way, until its entry would have expired; a waiter that times
//!   out leaves before `lock_timeout` returns, a dropped one in the
//!   background;
//! * an attempt answered **already ours** (the client resent it after a
//!   lost reply, so its fencing token is unknown) is given back and tried
//!   again with a fresh token; one that **fewer replicas acknowledged**
//!   than asked ([`WAIT`](#replica-acknowledgement-wait)) is given back
//!   before the call returns;
//! * while the caller waits, a retryable failure (a connection error, a
//!   timeout, a server that answers `LOADING` while it loads its dataset
//!   after a restart) is ridden out with the same back-off until its
//!   deadline; `try_lock` returns it.
//!
//! # Ids
//!
//! An id generator takes blocks of `block_size` ids from the counter
//! `{PREFIX NAME}:ids` with one `INCRBY` each (so ids are unique and
//! increasing across every provider of the name, one round trip per
//! block), and hands a block's ids out in-process. With `WAIT`, a block
//! fewer replicas acknowledged is dropped (its ids are skipped, never
//! handed out twice after a failover). The counter has no clock floor (see
//! [Running Redis for distlock](#running-redis-for-distlock)); at
//! `i64::MAX` it is `Exhausted`.
//!
//! # One name is one lock
//!
//! The kinds of one name exclude each other as distlock-core's table says
//! (the mutex and the fair mutex wait for each other; every other pair is
//! [`Error::Conflict`](distlock_core::Error::Conflict)). The mutex and the
//! fair mutex share the lock key `PREFIX NAME`. While a read-write lock, a
//! semaphore or an election holds the name, the lock key holds that kind's
//! **marker** (`distlock:rw`, `distlock:semaphore`, `distlock:election`:
//! never a token, which is 32 hex digits for distlock and redis-py alike),
//! set and checked in the same script as the hold (`kind.lua`), expiring
//! 1 ms after the kind's latest hold, re-timed by every extend and release,
//! and deleted with the last hold. So:
//!
//! * the mutex's and the fair mutex's `SET NX` fails on a marker by itself,
//!   and only their failure path reads it and refuses with `Conflict`: the
//!   uncontended acquire and release cost no extra server call;
//! * a redis-py `Lock` waits for the marker to go, as for any holder;
//! * the read-write lock's, the semaphore's and the election's acquire
//!   scripts read the lock key and refuse when it holds a token (a mutex,
//!   a fair mutex, redis-py) or another kind's marker;
//! * check and hold run in one script on keys of one Cluster slot (the lock
//!   key `x` and `{x}:…` hash alike), so two kinds arriving at once never
//!   both get in: the first script wins, the second is refused.
//!
//! A waiter is not counted: one that finds another kind holding the name
//! when it next tries is refused then. `inspect` of the mutex or the fair
//! mutex shows no holder while the lock key holds a marker (it is no mutex
//! hold), and their `force_release` leaves it alone (nothing evicted); the
//! marker's own kind's `force_release` deletes it. [`RedlockProvider`]
//! offers the mutex only and writes no marker.
//!
//! # Inspect and force-release
//!
//! Every provider has an **owner identity**, `host:pid` or `label@host:pid`
//! with [`RedisOptions::owner_label`] (URL query `owner=<label>`), returned
//! by [`Provider::owner`]. The acquire
//! scripts store it with every hold, **in the same script call** (no extra
//! round trip), in the hold's slot. The mutex, fair mutex and election
//! fold it into the lock key's value (`<token>|<owner>`: redis-py's `Lock`
//! still shares the lock, it only needs the key), their fencing token is
//! the counter's value while they hold, and the acquisition time is that
//! token's server `TIME` (`inspect` shows none when the counter had run
//! ahead of the clock). The read-write lock and the semaphore keep holder
//! records (the `w` field and the token fields of `{K}:rw:info`, the token
//! fields of `{K}:sem:info`) with the owner, the fencing token and the
//! acquisition time by the server's `TIME`. It is extended with the hold, deleted at its release, and purged
//! with expired holders. Queued waiters' owners are in the `…:owners`
//! hashes.
//!
//! [`Provider::inspect`] is **one Lua
//! script** (`inspect_lock`, `inspect_queued`; one round trip whatever the
//! number of holders and waiters) that only reads: holders with owner,
//! fencing token, acquired at and lease left (`PTTL`, or the holder's zset
//! score), the live waiters in queue order with their owners, an election's
//! leader and term, a semaphore's permits. The fair mutex and the mutex
//! share one lock key, so both kinds show the same holder and the fair
//! queue. A hold whose record does not belong to the lock's current value
//! (compared inside the script; the token is never returned) is **foreign**
//! — redis-py, another client, a key set by hand: `foreign: Some("not
//! distlock (redis-py or another client)")`, no owner, no token, the lease
//! from `PTTL` (`NoExpiry` without one). Data of another type under one of
//! the name's keys is `Conflict`, and nothing is changed.
//!
//! [`Provider::force_release`] is
//! **dangerous**: for an operator whose holder is stuck or gone. One script
//! per kind (`force_lock`, `rw_force`, `sem_force`) deletes every hold
//! (distlock's or foreign) and its records, advances the fencing counter
//! with the acquire scripts' rule ([Fencing tokens](#fencing-tokens), so
//! the next holder's token is above it; returned as `fence`; a name nobody
//! holds is left exactly as it is, no counter is created, and `fence` is
//! `None`), and publishes exactly
//! what a release would: the next fair waiter's `to:<id>` (or `released`),
//! the read-write lock's and semaphore's addressed wake-ups of the waiters
//! now admitted. The evicted holders are not told: each learns at its next
//! renewal (the extend finds the hold not its own: `lost()` with
//! `Taken`), up to a third of the TTL later, and **until then it still
//! believes it holds** and may write. Hand `fence` to the protected resource
//! at once to refuse the evicted tokens. A force-release of a name nobody
//! holds evicts nothing but still advances the counter.
//!
//! [`RedlockProvider`] stores no holder records: it has an owner identity
//! but answers `Unsupported` to inspect and force-release.
//!
//! # Redis Sentinel
//!
//! `redis+sentinel://[user:password@]host:port[,host:port…]/master-name[?query]`
//! (or [`RedisProvider::connect_sentinel`] /
//! [`RedisProvider::connect_sentinel_with`] in code) names the **Sentinels**
//! and the master name they monitor. The userinfo is the **master's**
//! credentials (sent to whichever server the Sentinels name); the
//! Sentinels' own are the query keys `sentinel_user` and
//! `sentinel_password` (hidden in error messages), the database the query
//! key `db`. The other query keys are the [`RedisOptions`] keys; any other
//! key is an error. TLS to Sentinel deployments is not supported, nor is
//! `pool_size` (refused with `InvalidOptions`: one multiplexed connection
//! to the master serves every command, as for a plain `redis://` URL).
//!
//! * **Discovery.** The master is the server the Sentinels name (`SENTINEL
//!   MASTERS`, asked of each Sentinel in turn, skipping one that flags it
//!   down) and that answers `ROLE` master itself (the `redis` crate's
//!   `SentinelClient`). Connect resolves it and connects within the connect
//!   timeout, or fails with a typed error (no Sentinel reachable, no
//!   master: `Connection`; too slow: `Timeout`).
//! * **Following failovers.** A command that fails with a connection
//!   error, is answered `READONLY`, `MASTERDOWN` or `LOADING` (a demoted
//!   master, a replica, a server not ready), or gets no answer within the
//!   response timeout (a frozen or cut-off master) drops the connection to
//!   that master. That command fails with `Error::Connection` (retryable;
//!   `READONLY` included), and the next one asks the Sentinels again and
//!   connects to the master they name now. One re-resolve runs at a time:
//!   commands that arrive meanwhile wait for it and share its outcome.
//!   While no master can be found (between the old master's death and the
//!   promotion: Sentinel's `down-after-milliseconds` plus the vote),
//!   commands fail with retryable errors; `lock()` and the other waiting
//!   calls ride it out until their deadline.
//! * **Held leases.** A lease's renewals and release keep the connection
//!   they were acquired on (so they reach the server in the order they were
//!   sent); a connection error or `READONLY` on it lets it go, and so does
//!   the Sentinels naming another server after a command on it timed out
//!   (a frozen master). The next renewal goes to the new master. If the promoted replica
//!   had the lock key, the watchdog keeps renewing it there; if it did not
//!   (the acquisition had not been replicated when the master died), the
//!   renewal finds no key and the guard's `lost()` fires. A holder never
//!   silently believes it holds; but between the promotion and that
//!   renewal (at most a third of the TTL) **another client may take the
//!   lock on the new master**: asynchronous replication loses
//!   acknowledged writes, which is what fencing tokens are for (the new
//!   master's tokens stay above the old ones as long as its clock is not
//!   behind, see *Fencing tokens*).
//! * **Waiting.** The pub/sub connection asks the Sentinels for the master
//!   at each (re)connect. When it drops (the master died, or Sentinel
//!   reconfigured it and closed its clients), every waiter is woken to
//!   re-check, and it resubscribes on the new master, where the releases
//!   are now published.
//!
//! # Working with redis-py
//!
//! A distlock mutex and a redis-py `Lock` on the same key (`Lock(r,
//! "PREFIX NAME")`) exclude each other both ways: both take the key with
//! `SET NX PX` and release or extend only with their own token. How a
//! distlock waiter learns of a redis-py release (which publishes nothing)
//! is in [the mutex](#the-mutex)'s "Next to clients that do not publish";
//! how a redis-py client gets turns on a name distlock processes contend
//! for, in its "Clients outside the line get turns".
//! redis-py's lock carries no fencing token.
//!
//! # Fencing tokens
//!
//! A fencing token is `max({…}:fence + 1, server TIME in microseconds)`,
//! taken inside the acquire script and stored in the counter (`TIME`, then
//! `SET {…}:fence <TIME µs> PX <ttl> GET`, and `SET <previous + 1>` only when
//! the counter is ahead of the clock; GET + SET before Redis 6.2). It is
//! the rule `INCR` raised to `TIME` of earlier versions, so both take
//! increasing tokens from one counter during a rolling upgrade. A counter
//! that is not an integer keeps its value (`Error::Conflict`; its TTL
//! becomes the counter's, the write having replaced it). **Tokens never go below the Redis server's `TIME` in
//! microseconds**, so they keep increasing even when the counter is lost (a
//! restart without persistence, an eviction, a failover to a replica that
//! had not received the last `INCR`), as long as the server's clock does not
//! step back (after a failover: the new master's clock is not behind the
//! moment the last token was handed out). Tokens are therefore large numbers
//! (microseconds since 1970, about 1.8 × 10¹⁵ at the time of writing), not
//! 1, 2, 3: compare them as `u64`, never assume they are dense.
//!
//! ## The counter's retention
//!
//! A counter per name ever locked would stay forever (a lock per order id
//! leaves millions). So the counter expires: its TTL is the lease's TTL
//! plus the **fence retention** ([`RedisOptions::fence_retention`], URL
//! `fence_retention_ms`; default 24 hours, between 100 ms and 365 days),
//! set by every acquisition (the `SET … PX` above) and every renewal, so it
//! outlives every lease on the name by the retention; a force-release of a
//! held name sets the retention alone (no lease is left), and one of a name
//! nobody holds creates nothing. The counter is not needed for the order:
//! it guards only against the server's clock stepping back.
//!
//! *Why tokens stay increasing across the expiry.* Let `T` be the last
//! token taken before the counter expires, when the server's clock read
//! `c`. Then `T ≤ c + e`, where `e` is how far the counter had run ahead of
//! the clock: 0, unless the clock was set back while the counter lived
//! (then at most that step). The counter expires when the clock reads at
//! least `c + retention` (Redis expires by its own clock, the one `TIME`
//! reads; a step back while the key lives delays the expiry by as much).
//! The next token is then at least the clock, `c + retention − s`, `s` being
//! how far the clock was set back after the expiry. So it is above `T`
//! whenever `e + s < retention`: **tokens increase across an expiry unless
//! the server's clock was set back, in all between the last token and the
//! next one, by more than the retention.** NTP steps (fractions of a
//! second), a leap second and a clock set to a wrong time zone (at most a
//! day) are within the default.
//!
//! *A larger step back* makes the next token of an unused name lower than
//! its last one, as losing the counter (a restart without persistence)
//! would under the same step: a store that checks tokens refuses the new
//! holder's writes (it has seen a higher one) until the clock passes the
//! old token. The old holder's lease ended at least the retention before,
//! so two live holders never share an order; what is at stake is the new
//! holder's progress, not exclusion.
//!
//! # Fencing Redis keys
//!
//! A token is only worth what the resource checks. [`RedisFence`] does the
//! check for data kept in Redis, by the rule of [`distlock_core::fence`]: a
//! write with token `t` lands only if `t` is at least the highest token the
//! key admitted (for a shared token, a read guard's or a permit's: the
//! highest exclusive one), atomically with the write; a refused write is
//! [`Error::Stale`](distlock_core::Error::Stale) and changes nothing.
//! Fenced `SET`, `HSET`, `DEL`, `INCRBY`, and any script of yours
//! ([`GuardedScript`], [`RedisFence::eval`]), each one Lua script
//! (`scripts/guarded_*.lua`). A key's fence is the hash
//! `{KEY}:distlock:highest` (`token`, `exclusive`), or
//! `{TAG}:distlock:highest:KEY` for a key with a hash tag: in the key's
//! Cluster slot. A lost reply is a retryable error, never "admitted" or
//! "stale": retry with the same token (see [`RedisFence`]).
//!
//! ```no_run
//! # mod distlock {
//! #     pub use distlock_core::*;
//! #     pub mod redis { pub use distlock_redis::*; }
//! # }
//! use distlock::fence::FenceToken;
//! use distlock::redis::{RedisFence, RedisProvider};
//! use distlock::Provider;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
//! let locks = RedisProvider::connect("redis://127.0.0.1:6379").await?;
//! let data = RedisFence::new(&RedisProvider::connect("redis://127.0.0.1:6380").await?);
//! let guard = locks.mutex("orders/42")?.lock().await?;
//! match data.set("orders:42", "paid", FenceToken::of(&guard)).await {
//!     Ok(()) => {}
//!     Err(e) if e.is_stale() => { /* a newer holder wrote: stop */ }
//!     Err(e) => return Err(e), // retryable: try again with the same token
//! }
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Running Redis for distlock
//!
//! * **`maxmemory-policy noeviction`.** An `allkeys-*` policy can evict the
//!   fence counter (without the clock floor above, tokens would then go
//!   backwards; with it, they fall back to the clock), the id counters (ids
//!   then repeat) and the lock key itself. A `volatile-*` policy can evict
//!   the lock key, which has a TTL: a second client then takes the lock
//!   while the first still works (its `lost()` fires at its next renewal).
//!   Under `noeviction` a full server refuses the write and the acquisition
//!   fails with an error instead.
//! * **`appendonly yes`**, with `appendfsync always` for no loss;
//!   `appendfsync everysec` can lose the last second of writes on a crash.
//!   Without persistence, a restart loses every lock (any client can take
//!   one while its old holder still works; the holder's `lost()` fires at
//!   its next renewal) and every counter.
//! * **Id generators have no clock floor**: their `{…}:ids` counters start
//!   again after a restart without persistence (or an eviction, or a
//!   failover that lost the last `INCRBY`), and ids repeat.
//!
//! # Replica acknowledgement (`WAIT`)
//!
//! A lock written to the master is lost with the master if the replica that
//! Sentinel (or the Cluster) promotes never received it: a second client
//! then takes the lock while the first still works. With
//! [`RedisOptions::wait_for_replicas`] (`?wait_replicas=N&wait_timeout_ms=T`)
//! every acquisition and every renewal is followed, in the same pipeline on
//! the same connection, by `WAIT N T`:
//!
//! * an acquisition fewer than `N` replicas acknowledged is undone before
//!   the call returns and fails with the retryable
//!   [`Error::NotReplicated`](distlock_core::Error::NotReplicated) —
//!   never "not acquired", so a lagging replica does not look like a busy
//!   lock; `lock()` / `lock_timeout()` keep trying until their deadline;
//! * a renewal fewer acknowledged counts as failed (the guard turns
//!   `Suspended`; `lost()` fires at the last acknowledged expiry);
//! * an id block fewer acknowledged is dropped (its ids are skipped, never
//!   handed out twice after a failover);
//! * in a Cluster the `WAIT` goes to the lock key's shard (the pipeline is
//!   routed by the script's key).
//!
//! Cost: one round trip to the replicas per acquisition and renewal (see
//! `benches/README.md`), and with replicas down, up to `T` per attempt on
//! the connection. `WAIT` is not consensus: a failover can still promote a
//! replica that did not acknowledge (one that was down, or with
//! `replica-priority` forcing it); SAFETY.md's failover experiment measures
//! what it changes.
//!
//! # Redlock
//!
//! [`RedlockProvider`] (`redis+redlock://h1:p1,h2:p2,h3:p3`) runs the mutex
//! over N independent masters with a quorum of N/2 + 1, and fencing tokens
//! that increase across the masters. The recipe, its keys and scripts
//! (`redlock_acquire`, `redlock_raise`, and the mutex's `release` and
//! `extend`), the proof that tokens increase, its limits (clock drift,
//! delayed restart of an empty master) and the cost per acquisition are in
//! [`RedlockProvider`]'s documentation
//! ([proof](crate::RedlockProvider#why-fencing-tokens-increase)).
//!
//! # Feature flags
//!
//! * `cluster` — `RedisProvider::connect_cluster` for Redis Cluster.
//! * `tls` — `rediss://` URLs, through rustls with the webpki roots.
//!
//! # Supported Rust versions
//!
//! Rust 1.89 or later.

mod acquire;
mod context;
mod election;
mod error;
mod fair_mutex;
mod fair_queue;
mod fence;
mod ids;
mod keys;
mod lease;
mod line;
mod mutex;
mod net;
mod ops;
mod options;
mod provider;
mod queued;
mod redlock;
mod rw_lock;
mod scripts;
mod semaphore;
mod target;
mod wake;

use std::sync::Arc;

pub use deadpool_redis;
pub use distlock_core;
pub use redis;

pub use fence::{GuardedScript, RedisFence};
pub use net::sentinel::SentinelAuth;
pub use options::RedisOptions;
pub use provider::RedisProvider;
pub use redlock::RedlockProvider;

use distlock_core::{Provider, Result};

/// Connects to Redis at `url` and returns the provider as a trait object
/// (what `distlock::connect` does for `redis://`, `rediss://`,
/// `redis+cluster://` and `redis+sentinel://`).
///
/// `redis+cluster://[user:password@]host:port,host:port[?options]` names the
/// seed nodes of a Redis Cluster (feature `cluster`).
/// `redis+sentinel://[user:password@]host:port,host:port/master-name[?options]`
/// names the Sentinels of a master (see [Redis Sentinel](crate#redis-sentinel)).
/// `redis+redlock://[user:password@]host:port,host:port,host:port[?options]`
/// names independent masters for [`RedlockProvider`] (the mutex only).
///
/// # Errors
///
/// As [`RedisProvider::connect`]; [`Error::UnsupportedBackend`](distlock_core::Error::UnsupportedBackend) for a
/// cluster URL without the `cluster` feature.
///
/// # Cancellation safety
///
/// Cancellation safe: a dropped connect leaves no connection open.
pub async fn connect(url: &str) -> Result<Arc<dyn Provider>> {
    // Boxed: the connect futures are large, and the facade's `connect`
    // holds whichever one the URL names.
    match target::Target::parse(url, RedisOptions::new())? {
        target::Target::Server(server) => Ok(Arc::new(
            Box::pin(RedisProvider::connect_server(server)).await?,
        )),
        #[cfg(feature = "cluster")]
        target::Target::Cluster { nodes, options } => {
            let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
            Ok(Arc::new(
                RedisProvider::connect_cluster(&nodes, options).await?,
            ))
        }
        target::Target::Redlock { masters, options } => {
            let masters: Vec<&str> = masters.iter().map(String::as_str).collect();
            Ok(Arc::new(
                Box::pin(RedlockProvider::connect_masters(url, &masters, options)).await?,
            ))
        }
    }
}
