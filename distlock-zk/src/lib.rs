//! ZooKeeper backend of [distlock](https://docs.rs/distlock): fair and unfair
//! locks, read-write locks, counting semaphores, leader election and ids,
//! with the session as the lease.
//!
//! Through the facade (`distlock`, feature `zookeeper`) it is
//! `distlock::connect("zk://…")`, or `distlock::zk::ZkProvider` for the
//! ZooKeeper options; alone, the same names are under `distlock_zk::` (and
//! the core's under `distlock_zk::distlock_core::`).
//!
//! ```no_run
//! # mod distlock {
//! #     pub use distlock_core::*;
//! #     pub mod zk { pub use distlock_zk::*; }
//! # }
//! use distlock::zk::ZkProvider;
//! use distlock::Provider;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
//! let locks = ZkProvider::connect("zk://127.0.0.1:2181/app").await?;
//! let guard = locks.fair_mutex("orders/42")?.lock().await?;
//! println!("fencing token (czxid) {}", guard.fencing_token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Nodes
//!
//! Every primitive named `NAME` lives at `ROOT/NAME`, where `ROOT` is the
//! chroot of the URL followed by the base path (`/distlock` by default, the
//! query key `base` changes it). Parents are created as container nodes,
//! and every node of a hold or a wait is ephemeral, so a name no longer used
//! leaves no node: the server deletes a container once its last child is
//! gone (ZooKeeper 3.5+, every `znode.container.checkIntervalMs`, a minute
//! by default), `ROOT/NAME` and a semaphore's `locks` and `leases` alike.
//! Curator's recipes create their parents as containers too
//! (`creatingParentContainersIfNeeded`). A force-release or an inspect of a
//! name nobody used creates nothing. Only an id generator's node stays: it
//! is the counter.
//!
//! | primitive | nodes under `ROOT/NAME` |
//! |---|---|
//! | fair mutex | `_c_<uuid>-lock-<seq10>`, ephemeral sequential (Curator `InterProcessMutex` names), holding `distlock owner=<identity>`; kazoo's `…__lock__<seq10>` are queued too |
//! | unfair mutex | `_unfair_lock`, ephemeral, holding `distlock owner=<identity> id=<uuid>` |
//! | read-write lock | `_c_<uuid>-__READ__<seq10>` and `_c_<uuid>-__WRIT__<seq10>`, ephemeral sequential, one per hold (Curator `InterProcessReadWriteLock` names), holding `distlock owner=<identity>` |
//! | election | `_c_<uuid>-o=<identity>-latch-<seq10>`, ephemeral sequential, holding the candidate id (Curator `LeaderLatch` order and data) |
//! | id generator | `ROOT/NAME` itself: 8 bytes big-endian (Curator `DistributedAtomicLong`) |
//! | semaphore | `locks/_c_<uuid>-lock-<seq10>` (the internal fair mutex, holding `distlock owner=<identity>`) and `leases/_c_<uuid>-lease-<seq10>`, ephemeral sequential, one lease node per permit held, holding `distlock permits=N owner=<identity>` (Curator `InterProcessSemaphoreV2`) |
//!
//! A name never reaches into another lock's nodes: `Name` refuses a
//! segment after the first that is one of the node names above
//! (`_unfair_lock`, `locks`, `leases`, a queue node), so `orders/_unfair_lock`
//! is invalid input rather than the node that shows the mutex `orders`
//! held. Names still nest as paths: `orders/42` lives inside `orders`'s
//! node, which is harmless for locks (their recipes ignore children they
//! do not know) but not for an id generator, whose node is its counter:
//! an id generator `orders` whose counter is made first keeps working
//! while locks `orders/…` come and go below it, but one made while a
//! primitive `orders/…` has nodes, or shortly after, is refused with
//! `Error::Conflict`: `orders` is then that primitive's parent directory,
//! a container node the server deletes once it is empty, and a counter kept
//! there could be deleted with it (and ids handed out again). It works
//! once the server has deleted the empty directory, which takes up to
//! `znode.container.checkIntervalMs` (a minute by default) after the last
//! `orders/…` node is gone. So give an id generator a name that no other
//! primitive's name begins with, or create its counter (one `next()`)
//! before any of them is used.
//!
//! A Curator `InterProcessMutex` on `ROOT/NAME` queues with a distlock fair
//! mutex of the same name (same node names, same order). A kazoo `Lock`
//! there is one-way: distlock orders kazoo's `…__lock__<seq>` nodes into its
//! queue and waits behind them, but kazoo counts only `__lock__` contenders,
//! so it does not wait behind distlock's nodes: exclusion is not mutual, and
//! a lock path must not be shared by kazoo and distlock writers.
//!
//! A Curator `InterProcessSemaphoreV2` on `ROOT/NAME` shares the permits of a
//! distlock semaphore of the same name, both ways: the same internal lock,
//! the same lease nodes, the same count (every child of `leases`). Curator
//! does not read our `distlock permits=N`, and its lease nodes carry its own
//! data (the client's IP address by default), so the permits mismatch check
//! covers distlock clients only: Curator clients must be given the same
//! `maxLeases` by hand.
//!
//! A Curator `InterProcessReadWriteLock` on `ROOT/NAME` is the same lock as a
//! distlock read-write lock of that name, both ways: the same node names, the
//! same order (by the sequence after `__READ__` / `__WRIT__`) and the same
//! rules for who holds, so readers of both share, and a writer of either
//! excludes readers and writers of both. (A Curator thread that holds the
//! write lock may also take the read lock, by its own bookkeeping: its read
//! node then holds behind its write node, and distlock waits for both.)
//!
//! # The recipes
//!
//! * **Fair mutex** — the create of our node and the listing of the
//!   directory go out together (ZooKeeper answers a session's requests in
//!   order), so an uncontended acquisition costs one round trip. The lowest
//!   sequence holds; every other waiter watches only its predecessor, so a
//!   release wakes one waiter (no herd). A waiter whose predecessor leaves
//!   looks again. A connection loss during the create is recovered by finding
//!   our node by its `_c_<uuid>-` prefix (owned by our session), never by
//!   creating a second one. A waiter that times out or is cancelled deletes
//!   its node.
//! * **Semaphore** — Curator's `InterProcessSemaphoreV2` algorithm: take
//!   the internal fair mutex in `locks`, create our lease node in `leases`,
//!   list `leases` with a watch: at most N children (ours counted) and the
//!   permit is held; else wait for that watch and count again. The internal
//!   lock is released once the permit is held, or after our lease node is
//!   deleted when giving up. Only the head of `locks` watches `leases`, so a
//!   release wakes one waiter (and its successor in `locks` once it has the
//!   permit). `try_lock` takes the internal lock only if nobody is ahead in
//!   `locks` (as Curator's `acquire(0, …)`): it is refused while another
//!   acquisition is in progress. Each permit is a session lease of its own,
//!   with the `czxid` of its lease node as fencing token (not the sequence:
//!   `leases` is a container that the server deletes when empty, and its
//!   sequence then restarts). Our lease nodes hold `distlock permits=N
//!   owner=<identity>`; an
//!   acquisition that finds a distlock holder admitted under another N
//!   deletes its nodes and fails with `Error::PermitsMismatch`.
//!   Why it is safe: every holder listed at most `permits` lease nodes after
//!   its own was created. Of the holders present at any instant, the last to
//!   create its node saw all the others (created before it and not deleted
//!   since), so there are at most `permits` of them. The internal lock
//!   makes the queue fair and keeps acquirers from pushing each other over
//!   the limit, but the bound does not depend on it.
//! * **Read-write lock** — one queue of read and write nodes, joined like
//!   the fair mutex's (the same create, lookup and withdraw). A writer holds
//!   as the lowest node and watches its predecessor; a reader holds when no
//!   write node is before its own, and otherwise watches the last write node
//!   before its own (Curator's reader watches the first; with several
//!   writers queued that wakes readers only to wait again). Once a writer
//!   queues, later readers queue behind it: no writer starvation. Each hold
//!   is its own node, so its own session lease: a reader's share ends with
//!   its session. Fencing tokens are the nodes' `czxid`s: a hold that
//!   conflicts with an earlier one begins only after the earlier node is
//!   gone, and was created after it, so every write token exceeds every
//!   earlier token and every read token every earlier write token.
//! * **Unfair mutex** — one ephemeral node; losers watch it and race again
//!   when it is deleted. Every waiter is woken by each release: the herd
//!   effect, measured by the benches.
//! * **Leases** — the session is the lease. The server may expire a
//!   session as soon as it has not heard it for the session timeout, so the
//!   holder treats its lease as lost **3/4 of the session timeout − drift**
//!   (the drift margin of TTL leases: timeout/100 + 2 ms) after the server
//!   was last heard: every timeout/4 the core watchdog `sync`s through the
//!   leader and checks that the node is still ours, and each confirmed check
//!   moves that deadline on. The quarter kept back covers a touch that a
//!   follower forwards to the leader late (followers forward session touches
//!   in their pings, every tickTime/2, and ZooKeeper keeps session timeouts
//!   at 2 × tickTime or more). So a lease outlives any outage of its
//!   connection, a leader's failover included, that ends within about
//!   **timeout/2 − timeout/16** (the last check may be a quarter old when
//!   the outage starts; a failed one is retried every timeout/16): 2.6 s
//!   with the default 6 s session. Choose the session timeout for the
//!   elections your ensemble takes (`ZkOptions::session_timeout`). A partitioned
//!   holder's `lost()` (reason `Expired`) therefore fires before the server
//!   can expire the session and hand the lock to anybody else, not when the
//!   client library gives up on the session (zookeeper-client does so at
//!   about 7/5 of the timeout). The window this leaves: a partition that
//!   heals between the holder's deadline and the server's expiry ends a
//!   lease the server still honours (the holder then releases it); nothing
//!   can make a holder that is not running (a stalled process) stop in
//!   time, which is what the fencing token is for. `lost()` also fires when
//!   the session expires or closes, or the node is deleted (by an operator,
//!   say); a disconnected session is reported as `LeaseStatus::Suspended`.
//!   The node is watched with a data watch (`getData`, checking the node's
//!   `czxid`: a node at the path that is not ours counts as deleted), kept
//!   until the release's own delete fires it, so no `removeWatches`. The
//!   unfair mutex watches at once (its path is shared: the next holder may
//!   create it again right after a force-release). A queue node (fair
//!   mutex, read-write lock, semaphore, election) is watched from 20 ms
//!   into the hold: its path is never used again, so a lock held for less —
//!   most critical sections — costs no watch request, and a deletion in
//!   those first 20 ms is seen by the watch's first read, at most 20 ms
//!   late. An uncontended lock and release is three requests for the unfair
//!   mutex (create, the watch, delete) and three for the fair mutex (create
//!   and list, pipelined, then delete). An unfair hold that lasts past
//!   20 ms also lists its directory with a children watch, to hear a
//!   request to release at once (see "Asking a holder to let go").
//!   Lease options other than the provider's default are refused with
//!   `Error::InvalidOptions`, and `extend()` too: set the session timeout
//!   instead. The one exception is `LeaseOptions::max_hold`
//!   (`provider.default_lease().max_hold(d)`): the hold ends at the limit,
//!   `lost()` fires with `LostReason::MaxHold` and the node is deleted. The provider opens a new session at the next operation after
//!   one expires. A waiting acquisition whose session ended while the
//!   ensemble is out of reach keeps trying to open the next one (a pause
//!   doubling from 50 ms to 1 s between attempts, each bounded by the
//!   connect timeout and by the caller's deadline) until its deadline, as
//!   for any retryable error while waiting; a try fails at once.
//! * **Unknown outcomes** — a request may take effect without its reply
//!   coming back. zookeeper-client says so in several ways: a connection
//!   loss, a socket error such as `ECONNRESET` or `EPIPE` and its own
//!   no-response timeout (2/5 of the session timeout: shorter than the
//!   operation timeout with the defaults) as `Error::Custom`, a reply it
//!   cannot read, and our own operation timeout. All of these are
//!   **unknown outcomes**, never refusals. Every error code in a server's
//!   reply is an answer instead (the request did not take effect), and so
//!   is the session's end: `NoNode`, `NodeExists`, `BadVersion`, `NoAuth`,
//!   …, and a code zookeeper-client has no variant for
//!   (`UnexpectedErrorCode`, such as -120 `EPHEMERALONLOCALSESSION` from an
//!   ensemble whose local sessions are never upgraded: every lock then
//!   fails at once with `Error::Server`); `SessionMoved` and `Throttled`
//!   map to a retryable `Error::Connection`, with no lookup. After a
//!   create of unknown outcome, only the lookup is retried (after a
//!   `sync`, so a server we reconnected to has seen our create), never
//!   the create: a node with our owner id or `_c_<uuid>-` prefix in our
//!   session is ours; of several, the lowest is kept and the rest
//!   deleted. A late create (one the server read but ran only after our
//!   lookup answered) is covered the same way: every listing of a queue
//!   counts each node with our prefix as ours (the lowest of our session
//!   is kept, the others deleted, so an acquisition never waits behind its
//!   own node), and an acquisition that had a create of unknown outcome
//!   deletes every node with its prefix in its session when it gives up,
//!   and in the background after its release. A create sent again after
//!   a lookup found that the last one did not happen first pauses (50 ms,
//!   doubling to 1 s): a wait stops at its deadline, a try after three
//!   creates (with the last one's retryable error), so no error makes an
//!   acquisition spin. An acquisition that ends
//!   without the lock deletes what it may have created, finishing in the
//!   background if it is cancelled midway. A failed operation maps to a
//!   retryable error (`Error::Connection` or `Error::Timeout`) unless the
//!   server refused.
//! * **Cleanup bounds** — a node whose create had an unknown outcome
//!   holds its lock up only until the client has reconnected (within its
//!   connect timeout once the server is reachable) and one lookup (`sync`,
//!   list, stat) has answered: the acquisition then holds with it, or
//!   deletes it if it gives up. A delete of our own node (a release, a
//!   withdraw) is retried after every unknown outcome, with a pause that
//!   doubles from 20 ms to 500 ms, **for as long as the session lives**
//!   (until the delete is answered, or the session expires or closes and
//!   its ephemeral nodes go with it): a node of a live session would
//!   block its lock for as long as the process lives. `release()` waits
//!   for that delete for one operation timeout at most, then leaves it to
//!   a background task. **`lock_timeout(d)` returns within `d` plus one
//!   operation timeout** (plus scheduling), whatever the network does: a
//!   create sent before the deadline keeps its whole operation timeout
//!   (so a free lock is taken with any timeout), one sent after it (a
//!   semaphore's lease create behind its internal lock, a create after a
//!   session ended) gets only what is left of `d` plus one operation
//!   timeout; every request a waiter sends besides (listings, watches,
//!   lookups, the pauses between them) is cut short at the deadline; and
//!   the withdraw of a waiter that gives up (the kind check's too) is
//!   bounded by what is left of `d` plus one operation timeout, and by one
//!   operation timeout, the rest of it finishing in the background for as
//!   long as the session lives. `release()` completes or fails with a
//!   retryable error (never a plain server error). While the connection works, the node is gone as soon as the
//!   client has reconnected and the delete is answered; while it does
//!   not, the node stays at most until the server expires the session
//!   (the session timeout after it last heard the client).
//! * **Bad input is refused, never waited for** — a node in a queue
//!   that no session owns (persistent, container or TTL) would never go:
//!   a waiter whose predecessor it is fails with `Error::Conflict` (its
//!   `Stat` comes with the watch, no extra request), and withdraws its
//!   node (`try_lock`, which sets no watch, answers busy, `Ok(None)`: the
//!   lock is not free, and it does not wait to learn why); so does a semaphore acquisition that finds one in `leases`
//!   (where it would take a permit forever: its `Stat` comes with the
//!   read of the other lease nodes' data, done once per node anyway, so
//!   an uncontended admission sends no extra request). A name whose node holds data (an id counter) or is ephemeral
//!   is no lock's directory: every lock on it fails with `Error::Conflict`
//!   and leaves nothing under it. The check rides along with the create,
//!   pipelined: the listing that goes with a queue node's create returns
//!   the directory's stat; a semaphore's internal-lock create takes the
//!   semaphore directory's stat along (and reads it before making any
//!   missing `locks` directory); the unfair mutex takes it along with the
//!   first create of each handle only (so later acquisitions cost no
//!   request: a name turned into an id counter while a handle that has
//!   already locked it lives is not seen by that handle). A node created
//!   before the refusal is deleted before the error is returned.
//! * **Closing** — `close()` reports every held lease lost, deletes its
//!   node and closes the session; dropping the last handle closes the
//!   session too (zookeeper-client sends `closeSession`), so a process that
//!   exits does not leave its session to time out.
//! * **Fencing token** — the `czxid` of the holder's node: strictly greater
//!   for every later holder, across clients, and across leader failover.
//! * **Election** — LeaderLatch-style queue of latch nodes; a candidate is
//!   leader for a node whose `ephemeralOwner` is its current session.
//!   `observe()` follows the head of the queue with a children watch.
//! * **Ids** — versioned `setData` on the counter node, retried with a
//!   jittered back-off on conflict; with a block size, one write serves many
//!   ids. A node that is no counter is refused with `Error::Conflict` and
//!   nothing is written: ephemeral, a container, data other than 8 bytes,
//!   or children (a lock's directory, made persistent by another client:
//!   its empty data would otherwise read as a counter at 0). A lock that
//!   takes a still-empty directory between the counter's read and its
//!   versioned write is not seen (a child does not change the data
//!   version): the race this leaves, after which later locks on the name
//!   are refused.
//! * **One name is one lock** — every kind keeps its nodes under the same
//!   directory, so a node about to hold lists it (create, then list) and
//!   compares the oldest node of each kind present by `czxid`: if another
//!   kind's is older than its own kind's, it deletes its node and fails with
//!   [`Error::Conflict`](distlock_core::Error::Conflict); the mutex and the
//!   fair mutex instead wait for each other (the younger of the unfair node
//!   and the fair queue's head watches the older). Of two kinds arriving at
//!   once the older node wins. The check costs one listing (and one
//!   `exists` per other kind present) when a node comes to hold; Curator's
//!   and kazoo's nodes count as their kinds, and their same-kind interop is
//!   unchanged. The protocol and its proof are told in `src/kinds.rs`.
//!
//! # Inspect and force-release
//!
//! Every hold records its provider's **owner identity** (`host:pid`, or
//! `label@host:pid` with [`ZkOptions::owner_label`] or the URL query key
//! `owner=`), without an extra request: it is written by the create that
//! queues or takes the lock.
//!
//! * Lock nodes (fair mutex, read-write lock, the semaphore's internal
//!   lock) hold `distlock owner=<identity>`, the unfair lock's node
//!   `distlock owner=<identity> id=<uuid>`, and semaphore lease nodes
//!   `distlock permits=N owner=<identity>` (the older `distlock permits=N`
//!   still parses). Curator ignores the data of lock and lease nodes
//!   (except `__REVOKE__`, a request to release: see below), so interop
//!   is unchanged.
//! * Election nodes keep the candidate id as their data, since Curator's
//!   `LeaderLatch` reads the participant id from there; the identity goes
//!   into the node's name, `_c_<uuid>-o=<identity>-latch-<seq10>`, with every
//!   byte other than ASCII letters, digits, `_`, `.`, `:`, `@` escaped as
//!   `%XX` (so the name has no `/`, and no `-` before `-latch-`). Curator
//!   orders latch nodes by the sequence after the last `latch-`, as we do.
//!
//! [`Provider::inspect`] reads a name in **two round trips** whatever the
//! number of waiters: a `sync` (so that a follower answers with every
//! write committed before it, a hold another client was just given
//! included) with one multi-read of the directory's data and children (of
//! `locks` and `leases` for a semaphore) pipelined behind it, then one
//! multi-read of the data and stat of every child (one more per 512
//! children). It shows
//! each holder's owner, its fencing token (the node's `czxid`, the
//! guard's token), when it acquired (the node's `ctime`), and its lease
//! (`LeaseLeft::Session` with the node's `ephemeralOwner`); the waiters
//! behind the holders in queue order, with their identities (an unfair
//! mutex's waiters are not queued and do not show); an
//! election's leader (the candidate id from the head's data, its `czxid` as
//! term); a semaphore's permits as its distlock holders recorded them. The
//! holders of a semaphore are its first N lease nodes by `czxid` (a waiter
//! at the head of `locks` may have a lease node that does not hold yet: it
//! is always the newest), and its waiters are the nodes of `locks`. The
//! mutex and the fair mutex are one lock: `inspect` of either reads the
//! unfair node and the fair queue, and shows the older of the unfair node
//! and the queue's head (by `czxid`) as the holder, the other as a waiter
//! (an unfair node that yields to an older fair holder is a waiter);
//! `force_release` of either evicts that holder. A node that waited is
//! looked up before its acquisition returns: one deleted while it waited
//! is never handed back as held (the acquisition joins again). A node
//! whose data does not begin with `distlock` (or an election node without
//! `o=`) is **foreign**: `owner: None`, `foreign: Some("lock node <name>,
//! data \"127.0.1.1\"")` — a Curator client's IP address, a kazoo
//! identifier, a LeaderLatch participant id — the data shown when it is
//! short printable text, else its length. A name whose node holds data (an
//! id counter) or is ephemeral, or whose `_unfair_lock` is persistent, is a
//! `Conflict`.
//!
//! [`Provider::force_release`] is **dangerous**: it deletes the holding
//! nodes, whoever made them (any session may delete another's ephemeral
//! node, unless digest ACLs forbid it). The waiters' watches fire as on a
//! release and the next one gets in; each evicted distlock holder's
//! `lost()` fires (`LostReason::Deleted`) as soon as the watch every guard
//! sets on its own node reports the deletion. Until
//! then the evicted holder may still be working: hand its successor's token
//! to the protected resource. `fence` is `None`: tokens are `czxid`s, and
//! every later node has a larger one.
//!
//! # Asking a holder to let go
//!
//! [`Provider::request_release`] asks the way Curator's cooperative
//! revocation does: after the two reads of `inspect`, one `setData` on
//! each holding queue node (pipelined). A distlock node gets its own data again,
//! at the data version read: the owner identity stays, and the node's
//! data version going above 0 is the mark (nothing else sets a holder's
//! data after its create). A foreign lock or lease node gets `__REVOKE__`,
//! what Curator's `Revoker.attemptRevoke` writes and a revocable
//! `InterProcessMutex` (`makeRevocable`) listens for. A foreign election
//! leader (a `LeaderLatch`, which has no revocation) gets its own data,
//! its participant id, again. A write that finds another version
//! (`BadVersion`: asked by someone else meanwhile) counts as asked; a node
//! deleted meanwhile was released and is not returned. Nothing is created
//! on a name nobody holds.
//!
//! The unfair mutex's node is the exception: its path is shared, and a
//! node created there again starts at data version 0 like the one read,
//! so a versioned write could land on the next holder's node and replace
//! its owner record. Its hold is asked by its `czxid` instead: an
//! ephemeral node `_unfair_lock-asked-<czxid>` beside it (in the asking
//! session, holding the asker's `distlock owner=<identity>`), created
//! with a look at the unfair node pipelined behind it. If the node read is
//! still there, it was asked (an existing request node counts too); if
//! not, nobody was asked, the request node is deleted again and the
//! holder not returned. The next holder's node is never touched. Its
//! holder hears the request at once through a children watch on the
//! directory, set from 20 ms into the hold like a queue node's watch (a
//! shorter hold costs no request; a request made before is in the watch's
//! listing; the watch fires at the holder's own release, so it costs no
//! `removeWatches`), and at the latest at its next session check (every
//! session timeout / 4; that check rides along with the one it makes
//! anyway). A heard request's node is made the holder's own ephemeral
//! node (a delete and a create in one multi), so the request lasts as long
//! as the hold, not only as long as the asking session (a `distlock
//! unlock` that exits), and the holder's release deletes it. The call
//! returns once that has happened (a children watch on the directory tells
//! the asker, usually within a few milliseconds), so the asker may close
//! its session right after it; or once the hold has ended: the request
//! node is then deleted at once, and a hold that ended before its holder
//! heard the request is not returned (it let go by itself). The wait lasts
//! at most one operation timeout; past it (a holder that does not answer,
//! or a holder of an older distlock, which never takes a request over) the
//! call returns the hold as asked, and the request lives only as long as
//! the asking session: the holder hears it at its next session check if
//! that session is still there, and a request whose hold ends first stays
//! until the asking session ends. A cancelled call leaves its request in
//! the same way.
//! `inspect` shows the hold asked while its request node is there. No recipe counts a request node as a contender (it is of
//! no kind, and Curator and kazoo sort it after their own nodes), and
//! names cannot reach it (`Name` refuses such segments). An unfair holder
//! of a distlock version that asked by writing its node's data hears only
//! such writes, so it is not asked by this one.
//!
//! A distlock holder hears a request (ours, or a Curator `Revoker`'s)
//! through the data watch its guard keeps on its node (the same watch that
//! reports a force-release), and at the latest at its next session check
//! (every session timeout / 4), which reads the node's data version: a
//! watch event missed across a reconnection is caught there. Waiters
//! watching an asked node wake once, look again and wait on. A holder's release
//! is unchanged, except that the unfair node's one-request delete (at
//! data version 0) is skipped once asked, for the checked delete.
//!
//! # Security
//!
//! With digest credentials (`zk://user:password@…`) every node is created
//! with the creator-only ACL, so no other identity can delete a holder's
//! node; without, nodes are open to everyone, as Curator's default. TLS is
//! behind the `tls` feature (`ZkOptions::tls`).
//!
//! # Feature flags
//!
//! * `tls` — TLS connections through zookeeper-client's `tls` feature.
//!
//! # Supported Rust versions
//!
//! Rust 1.89 or later.

mod acquire;
mod context;
mod election;
mod error;
mod fair_mutex;
mod ids;
mod kinds;
mod layout;
mod lease;
mod node;
mod ops;
mod options;
mod provider;
mod queue;
mod rw_lock;
mod semaphore;
mod session;
mod unfair_mutex;
mod wait;

use std::sync::Arc;

pub use distlock_core;
pub use zookeeper_client;
#[cfg(feature = "tls")]
pub use zookeeper_client::TlsOptions;

#[cfg(feature = "tls")]
pub use options::install_crypto_provider;
pub use options::ZkOptions;
pub use provider::ZkProvider;

use distlock_core::{Provider, Result};

/// Connects to ZooKeeper at `url` and returns the provider as a trait object
/// (what `distlock::connect` does for `zk://`).
///
/// # Errors
///
/// As [`ZkProvider::connect`].
///
/// # Cancellation safety
///
/// Cancellation safe: a dropped connect leaves no session open.
pub async fn connect(url: &str) -> Result<Arc<dyn Provider>> {
    Ok(Arc::new(ZkProvider::connect(url).await?))
}
