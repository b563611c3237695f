//! The queue of ephemeral sequential nodes behind the fair mutex, the
//! election and the read-write lock: joining it, finding our own node,
//! parsing sequences, and withdrawing. Which node holds, and which one a
//! waiter watches, is each recipe's [`QueueRules`].
//!
//! The rule for a create whose outcome is unknown (the connection dropped or
//! the reply did not come in time): never create again in that session until
//! a lookup has answered definitively. The lookup `sync`s the directory first
//! (a server we reconnected to may not have seen our create yet) and lists
//! it; every child with our `_c_<uuid>-` prefix and our session as owner is
//! ours: the lowest is kept, the rest are deleted.

use std::borrow::Cow;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::backend::{with_timeout, Cleanup, CleanupGuard};
use distlock_core::{Error, Result, Wait};
use tokio::time::Instant;
use zookeeper_client::{
    CreateMode, CreateSequence, Error as ZkError, OneshotWatcher, WatchedEvent,
};

use crate::error::{triage, triage_timed, Triage};
use crate::node::{acls, delete_retrying, make_parents};
use crate::provider::Shared;
use crate::session::Session;

/// A lease just acquired: our node in our session.
pub(crate) struct Acquired {
    pub(crate) session: Arc<Session>,
    pub(crate) node: String,
    pub(crate) czxid: i64,
    /// When the request whose answer showed us the holder was sent: the
    /// server heard the session at or after this instant.
    pub(crate) heard_at: Instant,
    /// The directory's children as that answer listed them, after our node
    /// was created (for the kind check, `kinds`), if it was a listing.
    pub(crate) listing: Option<Vec<String>>,
}

/// A queue's sequence counter went past `i32::MAX`: the server prints it
/// negative, and the queue order is lost.
#[derive(Debug)]
pub(crate) struct Wrapped;

/// The sequence number of a queue child of `marker` (`lock`, `latch`):
/// Curator's `…-lock-0000000042` and, for locks, kazoo's
/// `…__lock__0000000042`. `Ok(None)` for a child that is not a queue node;
/// `Err(Wrapped)` for a sequence the server printed negative.
pub(crate) fn sequence(child: &str, marker: &str) -> std::result::Result<Option<u64>, Wrapped> {
    let curator = format!("-{marker}-");
    let kazoo = format!("__{marker}__");
    let Some(digits) = child
        .rsplit_once(curator.as_str())
        .or_else(|| {
            (marker == "lock")
                .then(|| child.rsplit_once(kazoo.as_str()))
                .flatten()
        })
        .map(|(_, d)| d)
    else {
        return Ok(None);
    };
    sequence_digits(digits)
}

/// The sequence a server appended to a node name (`0000000042`): `Ok(None)`
/// for anything else, `Err(Wrapped)` for a sequence printed negative.
pub(crate) fn sequence_digits(digits: &str) -> std::result::Result<Option<u64>, Wrapped> {
    if let Some(negative) = digits.strip_prefix('-') {
        if !negative.is_empty() && negative.bytes().all(|b| b.is_ascii_digit()) {
            return Err(Wrapped);
        }
    }
    if digits.len() < 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(None);
    }
    Ok(digits.parse().ok())
}

/// Queue children of `marker`, in queue order.
pub(crate) fn sorted_queue(
    children: Vec<String>,
    marker: &str,
) -> std::result::Result<Vec<(u64, String)>, Wrapped> {
    let mut queue = Vec::with_capacity(children.len());
    for child in children {
        if let Some(seq) = sequence(&child, marker)? {
            queue.push((seq, child));
        }
    }
    queue.sort();
    Ok(queue)
}

/// Where our node stands in a queue, after a listing.
pub(crate) enum Standing {
    /// It holds.
    Holds,
    /// It waits for this child (its name) to go.
    Behind(String),
    /// It is not in the listing: someone deleted it.
    Missing,
}

/// The rules of one kind of queue: how its nodes are named, and which of
/// them hold.
pub(crate) trait QueueRules: Sync {
    /// What Curator calls the lock name: our node is `_c_<uuid>-`, this and
    /// the server's sequence (`lock-`, `latch-`, `__READ__`).
    fn node_name(&self) -> Cow<'static, str>;

    /// Where `own` stands among `children`. Only the name of the child to
    /// watch outlives the call: a waiter must not keep the whole listing
    /// while it waits (O(n²) memory).
    fn standing(&self, children: Vec<String>, own: &str) -> std::result::Result<Standing, Wrapped>;
}

impl<T: QueueRules + ?Sized> QueueRules for &T {
    fn node_name(&self) -> Cow<'static, str> {
        (**self).node_name()
    }

    fn standing(&self, children: Vec<String>, own: &str) -> std::result::Result<Standing, Wrapped> {
        (**self).standing(children, own)
    }
}

/// A FIFO queue of `marker` nodes: the lowest sequence holds, every other
/// node waits for its predecessor.
struct Fifo<'a>(&'a str);

impl QueueRules for Fifo<'_> {
    fn node_name(&self) -> Cow<'static, str> {
        match self.0 {
            // The markers in use: no copy per acquisition.
            "lock" => Cow::Borrowed("lock-"),
            "latch" => Cow::Borrowed("latch-"),
            marker => Cow::Owned(format!("{marker}-")),
        }
    }

    fn standing(&self, children: Vec<String>, own: &str) -> std::result::Result<Standing, Wrapped> {
        let mut queue = sorted_queue(children, self.0)?;
        Ok(match queue.iter().position(|(_, n)| n == own) {
            None => Standing::Missing,
            Some(0) => Standing::Holds,
            Some(p) => Standing::Behind(queue.swap_remove(p - 1).1),
        })
    }
}

fn wrapped(dir: &str) -> Error {
    Error::Conflict {
        what: format!("zookeeper node {dir:?}"),
        expected: "lock directory whose sequence counter has not passed 2^31 (delete the directory to reset it)",
    }
}

pub(crate) fn conflict(dir: &str) -> Error {
    Error::Conflict {
        what: format!("zookeeper node {dir:?}"),
        expected: "lock directory (it is ephemeral, so it cannot hold lock nodes)",
    }
}

pub(crate) fn passed(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}

/// Waits a moment before a retry; `false` when that would pass the deadline.
pub(crate) async fn pause_before_retry(deadline: Option<Instant>) -> bool {
    let until = Instant::now() + Duration::from_millis(50);
    if deadline.is_some_and(|d| d <= until) {
        return false;
    }
    tokio::time::sleep_until(until).await;
    true
}

/// Waits for a watch to fire; `false` when the deadline came first. The
/// caller counts a fired watch with [`watch_noticed`].
///
/// # Errors
///
/// [`Error::Closed`] when the provider is closed meanwhile.
///
/// Not an `async fn`: a small future of its own (the watcher's, the close
/// signal, and a deadline timer only with a deadline, boxed), since every
/// waiting acquisition keeps one for as long as it waits.
pub(crate) fn watch_fired(
    shared: &Shared,
    watcher: OneshotWatcher,
    deadline: Option<Instant>,
) -> WatchFired<'_, impl std::future::Future<Output = WatchedEvent> + Send> {
    WatchFired {
        changed: watcher.changed(),
        closed: shared.lifecycle.closed(),
        timer: deadline.map(|d| Box::pin(tokio::time::sleep_until(d))),
    }
}

/// Counts a watch that fired for a waiter (stats, and the core's wake-up
/// count).
pub(crate) fn watch_noticed(shared: &Shared) {
    shared.stats.watch_events.fetch_add(1, Ordering::Relaxed);
    distlock_core::backend::woke();
}

pin_project_lite::pin_project! {
    /// The future of [`watch_fired`].
    pub(crate) struct WatchFired<'a, F> {
        #[pin]
        changed: F,
        closed: distlock_core::backend::Closed<'a>,
        timer: Option<Pin<Box<tokio::time::Sleep>>>,
    }
}

impl<F: std::future::Future<Output = WatchedEvent>> std::future::Future for WatchFired<'_, F> {
    type Output = Result<bool>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<bool>> {
        let this = self.project();
        // Closed first: a closed provider's waiter ends with `Closed`
        // whatever else happened meanwhile.
        if Pin::new(this.closed).poll(cx).is_ready() {
            return Poll::Ready(Err(Error::Closed));
        }
        if this.changed.poll(cx).is_ready() {
            return Poll::Ready(Ok(true));
        }
        if let Some(timer) = this.timer {
            if timer.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Ok(false));
            }
        }
        Poll::Pending
    }
}

/// The session ended and took every ephemeral node of ours with it:
/// nothing is left to clean up, and the caller starts over on a new
/// session.
pub(crate) async fn start_over(shared: &Shared, session: &Arc<Session>, undo: &mut CleanupGuard) {
    undo.disarm();
    shared.sessions.ended(session).await;
}

/// Runs an armed cleanup now, for at most the operation timeout; if it does
/// not finish, the guard's drop finishes it in the background.
pub(crate) async fn clean_up_now(mut undo: CleanupGuard, timeout: Duration) {
    let _ = with_timeout("withdraw", timeout, undo.run_now()).await;
}

/// Our queue nodes in `dir` (prefix and session), lowest first, after a
/// `sync` so that a create of ours that reached the leader is seen.
async fn find_ours(
    session: &Session,
    dir: &str,
    prefix: &str,
    timeout: Duration,
) -> std::result::Result<Vec<(String, i64)>, Triage> {
    triage_timed(
        "sync",
        timeout,
        with_timeout("sync", timeout, session.client.sync(dir)).await,
    )
    .or_else(|t| match t {
        // No directory: nothing of ours in it.
        Triage::Fail(_) => Ok(()),
        other => Err(other),
    })?;
    let listed = with_timeout("list", timeout, session.client.list_children(dir)).await;
    let children = match listed {
        Ok(Err(ZkError::NoNode)) => return Ok(Vec::new()),
        other => triage_timed("list", timeout, other)?,
    };
    let mut ours = Vec::new();
    for child in children.into_iter().filter(|c| c.starts_with(prefix)) {
        let node = format!("{dir}/{child}");
        let stat = with_timeout("stat", timeout, session.client.check_stat(&node)).await;
        if let Some(stat) = triage_timed("stat", timeout, stat)? {
            if stat.ephemeral_owner == session.id {
                let seq = child
                    .strip_prefix(prefix)
                    .and_then(|digits| sequence_digits(digits).ok().flatten())
                    .unwrap_or(u64::MAX);
                ours.push((seq, node, stat.czxid));
            }
        }
    }
    ours.sort();
    Ok(ours.into_iter().map(|(_, n, c)| (n, c)).collect())
}

/// Deletes every queue node of one acquisition: the known one, or all
/// children with its prefix in its session.
pub(crate) struct Withdraw {
    session: Arc<Session>,
    /// The queue's directory (the primitive's, shared).
    dir: Arc<str>,
    /// Our nodes are `_c_<uuid>-<name><seq>` (Curator's protected names),
    /// kept as their parts rather than as a string: a waiting acquisition
    /// keeps this for as long as it waits.
    uuid: uuid::Uuid,
    name: Cow<'static, str>,
    known: Mutex<Known>,
    /// The operation timeout, in nanoseconds (8 bytes, not a 16-byte
    /// `Duration`: a waiting acquisition keeps this withdraw for as long
    /// as it waits).
    timeout_ns: u64,
}

/// The node a [`Withdraw`] deletes, once known.
enum Known {
    /// Not known: every node of ours with the prefix.
    Nothing,
    /// `dir/prefix<seq>`: kept as its sequence, not a second copy of the
    /// path (a waiting acquisition keeps this for as long as it waits).
    Seq(CreateSequence),
    /// Any other node.
    Path(Box<str>),
}

impl Withdraw {
    /// Withdraws the nodes `_c_<uuid>-<name>…` in `dir` made in `session`.
    pub(crate) fn new(
        session: &Arc<Session>,
        dir: Arc<str>,
        (uuid, name): (uuid::Uuid, Cow<'static, str>),
        timeout: Duration,
    ) -> Arc<Self> {
        Arc::new(Withdraw {
            session: Arc::clone(session),
            dir,
            uuid,
            name,
            known: Mutex::new(Known::Nothing),
            timeout_ns: u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX),
        })
    }

    /// The operation timeout.
    fn timeout(&self) -> Duration {
        Duration::from_nanos(self.timeout_ns)
    }

    /// The prefix of our nodes' names: `_c_<uuid>-<name>`.
    fn prefix(&self) -> String {
        format!("_c_{}-{}", self.uuid, self.name)
    }

    /// `dir/` and the prefix.
    fn path_prefix(&self) -> String {
        format!("{}/{}", self.dir, self.prefix())
    }

    /// Deletes the one known `node` of `session`.
    pub(crate) fn node(session: &Arc<Session>, node: &str, timeout: Duration) -> Arc<Self> {
        let withdraw = Self::new(
            session,
            Arc::from(""),
            (uuid::Uuid::nil(), Cow::Borrowed("")),
            timeout,
        );
        withdraw.know(node);
        withdraw
    }

    fn know(&self, node: &str) {
        *self.known.lock().unwrap_or_else(PoisonError::into_inner) = Known::Path(node.into());
    }

    /// Our node is `dir/prefix<seq>`.
    fn know_seq(&self, seq: CreateSequence) {
        *self.known.lock().unwrap_or_else(PoisonError::into_inner) = Known::Seq(seq);
    }

    /// The known node's path, if any.
    fn known(&self) -> Option<String> {
        match &*self.known.lock().unwrap_or_else(PoisonError::into_inner) {
            Known::Nothing => None,
            Known::Seq(seq) => Some(format!("{}{seq}", self.path_prefix())),
            Known::Path(path) => Some(path.to_string()),
        }
    }
}

#[async_trait]
impl Cleanup for Withdraw {
    async fn clean_up(&self) -> Result<()> {
        // Retry for as long as the session may live: a node left behind
        // would stay (and block the queue) until the session ends.
        let budget = self.session.timeout() * 2;
        let deadline = Instant::now() + budget;
        if let Some(node) = self.known() {
            delete_retrying(&self.session, &node, None, budget).await?;
            return Ok(());
        }
        loop {
            if self.session.is_dead() {
                return Ok(());
            }
            match find_ours(&self.session, &self.dir, &self.prefix(), self.timeout()).await {
                Ok(nodes) => {
                    for (node, _) in nodes {
                        let left = deadline.saturating_duration_since(Instant::now());
                        delete_retrying(&self.session, &node, None, left).await?;
                    }
                    return Ok(());
                }
                Err(Triage::SessionEnded) => return Ok(()),
                Err(Triage::Fail(e)) => return Err(e),
                Err(Triage::Retry) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(Triage::Retry) => {
                    return Err(Error::Timeout {
                        operation: "withdraw from queue",
                        after: budget,
                    })
                }
            }
        }
    }
}

/// What a lookup after a create of unknown outcome found.
enum Lookup {
    /// Our node (the lowest of ours; any others are being deleted).
    Found(String, i64, Instant),
    /// The create did not happen: creating again is safe.
    Absent,
    SessionEnded,
    DeadlinePassed,
    Failed(Error),
}

async fn look_for_ours(
    session: &Arc<Session>,
    withdraw: &Withdraw,
    deadline: Option<Instant>,
) -> Lookup {
    loop {
        let sent = Instant::now();
        match find_ours(
            session,
            &withdraw.dir,
            &withdraw.prefix(),
            withdraw.timeout(),
        )
        .await
        {
            Ok(nodes) => {
                let mut nodes = nodes.into_iter();
                let Some((node, czxid)) = nodes.next() else {
                    return Lookup::Absent;
                };
                for (extra, _) in nodes {
                    // A second node of ours would queue behind us and block
                    // the queue after our release: delete it for sure.
                    let extra = Withdraw::node(session, &extra, withdraw.timeout());
                    if let Ok(mut undo) = CleanupGuard::arm("extra queue node", extra) {
                        undo.run_in_background();
                    }
                }
                return Lookup::Found(node, czxid, sent);
            }
            Err(Triage::SessionEnded) => return Lookup::SessionEnded,
            Err(Triage::Fail(e)) => return Lookup::Failed(e),
            Err(Triage::Retry) => {
                if !pause_before_retry(deadline).await {
                    return Lookup::DeadlinePassed;
                }
            }
        }
    }
}

/// What one attempt to create a queue node came to.
pub(crate) enum Joined {
    /// Our node, which the withdraw now knows; with the listing of the
    /// directory sent along with the create, when asked for and answered.
    Node {
        node: String,
        czxid: i64,
        children: Option<Vec<String>>,
        /// When the request that showed our node was sent.
        heard_at: Instant,
    },
    /// Nothing of ours is there (parents were just made, or the create did
    /// not happen; the undo is disarmed): create again.
    Again,
    /// The session ended with every ephemeral node of ours (the undo is
    /// disarmed and the session dropped): start over on a new one.
    SessionEnded,
    /// The deadline passed while looking for a node of unknown fate: the
    /// caller cleans up (the undo is still armed) and gives up.
    DeadlinePassed,
}

/// Creates one ephemeral sequential node `withdraw.dir/withdraw.prefix<seq>`
/// in `withdraw`'s session, with `data`; with `list`, the listing of the
/// directory is pipelined with the create. A create of unknown outcome is
/// never sent again: the node is looked for by its prefix (after a `sync`).
///
/// `undo` must be armed with `withdraw`, before this is called.
///
/// # Errors
///
/// [`Error::Conflict`] for an ephemeral directory; server errors (the undo
/// then stays armed when a node of ours may exist).
pub(crate) async fn join(
    shared: &Shared,
    withdraw: &Withdraw,
    undo: &mut CleanupGuard,
    data: &[u8],
    list: bool,
    deadline: Option<Instant>,
) -> Result<Joined> {
    let timeout = shared.timeout;
    let session = &withdraw.session;
    let dir = &*withdraw.dir;
    let path_prefix = withdraw.path_prefix();
    let create = CreateMode::EphemeralSequential.with_acls(acls(shared.authenticated));
    // Pipelined: both requests leave now, and ZooKeeper answers a session's
    // requests in order, so the listing includes our node.
    let sent = Instant::now();
    let created = session.client.create(&path_prefix, data, &create);
    let listed = list.then(|| session.client.list_children(dir));
    let outcome = with_timeout("create", timeout, async {
        match listed {
            Some(listed) => {
                let (created, listed) = futures::join!(created, listed);
                (created, listed.ok())
            }
            None => (created.await, None),
        }
    })
    .await;
    let (created, children) = match outcome {
        Ok((created, listed)) => (created, listed),
        Err(_) => (Err(ZkError::Timeout), None),
    };
    let (node, czxid, children, heard_at) = match created {
        Ok((stat, seq)) => {
            withdraw.know_seq(seq);
            (format!("{path_prefix}{seq}"), stat.czxid, children, sent)
        }
        Err(ZkError::NoNode) => {
            undo.disarm();
            make_parents(session, &path_prefix, shared.authenticated, timeout).await?;
            return Ok(Joined::Again);
        }
        Err(ZkError::NoChildrenForEphemerals) => {
            undo.disarm();
            return Err(conflict(dir));
        }
        Err(e) => match triage("create", timeout, e) {
            Triage::SessionEnded => {
                start_over(shared, session, undo).await;
                return Ok(Joined::SessionEnded);
            }
            Triage::Fail(e) => {
                undo.disarm();
                return Err(e);
            }
            // The create may have happened: look, never create twice.
            Triage::Retry => match look_for_ours(session, withdraw, deadline).await {
                Lookup::Found(node, czxid, heard_at) => {
                    withdraw.know(&node);
                    (node, czxid, None, heard_at)
                }
                Lookup::Absent => {
                    undo.disarm();
                    return Ok(Joined::Again);
                }
                Lookup::SessionEnded => {
                    start_over(shared, session, undo).await;
                    return Ok(Joined::SessionEnded);
                }
                Lookup::DeadlinePassed => return Ok(Joined::DeadlinePassed),
                Lookup::Failed(e) => return Err(e),
            },
        },
    };
    Ok(Joined::Node {
        node,
        czxid,
        children,
        heard_at,
    })
}

/// Joins the queue of `marker` nodes in `dir` and waits for the head of it.
///
/// Cancellation safe: as [`join_queue`].
pub(crate) fn enter_queue<'a>(
    shared: &'a Shared,
    dir: &'a Arc<str>,
    marker: &'a str,
    data: &'a [u8],
    wait: Wait,
) -> impl std::future::Future<Output = Result<Option<Acquired>>> + Send + 'a {
    // Not an `async fn`: [`join_queue`]'s future itself, with no second
    // body around it (a waiting task keeps this future).
    join_queue(shared, dir, Fifo(marker), data, wait)
}

/// A FIFO queue of `marker` nodes whose own nodes carry `tag` in their
/// name, before the marker: `_c_<uuid>-<tag>-<marker>-<seq>` (the
/// election's owner identity, see `ops::latch_tag`; `tag` has no `-`).
struct Tagged<'a> {
    marker: &'a str,
    tag: &'a str,
}

impl QueueRules for Tagged<'_> {
    fn node_name(&self) -> Cow<'static, str> {
        Cow::Owned(format!("{}-{}-", self.tag, self.marker))
    }

    fn standing(&self, children: Vec<String>, own: &str) -> std::result::Result<Standing, Wrapped> {
        Fifo(self.marker).standing(children, own)
    }
}

/// As [`enter_queue`], with `tag` in our node's name.
///
/// Cancellation safe: as [`join_queue`].
pub(crate) fn enter_tagged_queue<'a>(
    shared: &'a Shared,
    dir: &'a Arc<str>,
    marker: &'a str,
    tag: &'a str,
    data: &'a [u8],
    wait: Wait,
) -> impl std::future::Future<Output = Result<Option<Acquired>>> + Send + 'a {
    join_queue(shared, dir, Tagged { marker, tag }, data, wait)
}

/// Our node while it waits in a queue: the session it lives in, its
/// withdraw (armed until the node is ours to keep), which knows its path.
struct InQueue {
    /// Knows the session and our node's path.
    withdraw: Arc<Withdraw>,
    undo: CleanupGuard,
    czxid: i64,
    /// When the request whose answer last showed the queue was sent.
    heard_at: Instant,
}

impl InQueue {
    /// The session our node lives in.
    fn session(&self) -> &Arc<Session> {
        &self.withdraw.session
    }

    /// Our node's path (known to the withdraw since the create answered).
    fn node(&self) -> String {
        self.withdraw.known().unwrap_or_default()
    }
}

/// What one step of [`join_queue`] came to.
enum QueueStep {
    /// Our node holds (`Some`), or the wait ended without it (`None`).
    Done(Option<Acquired>),
    /// Our node waits for the node this watch is on to go.
    Wait(OneshotWatcher),
}

/// Adds our node to the queue in `dir` and waits until `rules` say it holds,
/// watching only the node they name.
///
/// Each step (join, list, watch) is boxed and over before the wait, so a
/// waiter keeps only its node's small state and its watch.
///
/// Cancellation safe: a withdraw guard is armed before the create is sent
/// and disarmed only once the node is ours to keep, or known not to exist.
// An `async fn` would keep its arguments twice (see below).
#[allow(clippy::manual_async_fn)]
pub(crate) fn join_queue<'a, R: QueueRules + Send + 'a>(
    shared: &'a Shared,
    dir: &'a Arc<str>,
    rules: R,
    data: &'a [u8],
    wait: Wait,
) -> impl std::future::Future<Output = Result<Option<Acquired>>> + Send + 'a {
    // Not an `async fn`, whose arguments would be kept twice (as the
    // future's captures and as its locals) through the wait. The deadline
    // is read from `wait` where needed, not kept beside it.
    async move {
        tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        // Our nodes' names: `_c_<uuid>-<name>`, the same on every session.
        let uuid = uuid::Uuid::new_v4();
        let mut ours: Option<InQueue> = None;
        loop {
            let step = queue_step(shared, dir, &rules, data, wait, uuid, &mut ours);
            // Out of the match, so that the step is not kept through the wait.
            let watcher = match Box::pin(step).await? {
                QueueStep::Done(acquired) => return Ok(acquired),
                QueueStep::Wait(watcher) => watcher,
            };
            if !watch_fired(shared, watcher, wait.deadline()).await? {
                if let Some(waiting) = ours.take() {
                    Box::pin(clean_up_now(waiting.undo, shared.timeout)).await;
                }
                return Ok(None);
            }
            watch_noticed(shared);
        }
    }
}

/// One step of [`join_queue`]: our node in the queue (joining, or again on
/// a new session), then listings until it holds or a watch is set on the
/// node it waits for. `ours` is our node across steps: taken out here, put
/// back only with a watch to wait on; dropped with its withdraw armed on
/// an error or a cancellation.
async fn queue_step(
    shared: &Shared,
    dir: &Arc<str>,
    rules: &dyn QueueRules,
    data: &[u8],
    wait: Wait,
    uuid: uuid::Uuid,
    ours: &mut Option<InQueue>,
) -> Result<QueueStep> {
    let timeout = shared.timeout;
    let deadline = wait.deadline();
    let mut children = None;
    'session: loop {
        let mut q = match ours.take() {
            Some(q) => q,
            None => {
                shared.lifecycle.check_open()?;
                let session = shared.sessions.get().await?;
                let naming = (uuid, rules.node_name());
                let withdraw = Withdraw::new(&session, Arc::clone(dir), naming, timeout);
                let mut undo =
                    CleanupGuard::arm("withdraw from queue", Arc::clone(&withdraw) as _)?;
                match join(shared, &withdraw, &mut undo, data, true, deadline).await? {
                    Joined::Node {
                        czxid,
                        children: listed,
                        heard_at,
                        ..
                    } => {
                        children = listed;
                        InQueue {
                            withdraw,
                            undo,
                            czxid,
                            heard_at,
                        }
                    }
                    Joined::Again | Joined::SessionEnded => continue 'session,
                    Joined::DeadlinePassed => {
                        clean_up_now(undo, timeout).await;
                        return Ok(QueueStep::Done(None));
                    }
                }
            }
        };
        loop {
            let names = match children.take() {
                Some(names) => names,
                None => {
                    let list_sent = Instant::now();
                    let listed =
                        with_timeout("list", timeout, q.session().client.list_children(dir)).await;
                    match triage_timed("list", timeout, listed) {
                        Ok(names) => {
                            q.heard_at = list_sent;
                            names
                        }
                        Err(Triage::SessionEnded) => {
                            start_over(shared, &Arc::clone(q.session()), &mut q.undo).await;
                            continue 'session;
                        }
                        Err(Triage::Retry) if pause_before_retry(deadline).await => continue,
                        Err(Triage::Retry) => {
                            clean_up_now(q.undo, timeout).await;
                            return Ok(QueueStep::Done(None));
                        }
                        Err(Triage::Fail(e)) => return Err(e),
                    }
                }
            };
            let node = q.node();
            let own_name = node.rsplit('/').next().unwrap_or_default();
            // Kept for the kind check of a node that holds (`kinds`).
            let listing = names.clone();
            let standing = match rules.standing(names, own_name) {
                Ok(standing) => standing,
                Err(Wrapped) => {
                    clean_up_now(q.undo, timeout).await;
                    return Err(wrapped(dir));
                }
            };
            let predecessor = match standing {
                Standing::Missing => {
                    // Our node is gone (deleted by someone): queue again.
                    q.undo.disarm();
                    if passed(deadline) {
                        return Ok(QueueStep::Done(None));
                    }
                    continue 'session;
                }
                Standing::Holds => {
                    q.undo.disarm();
                    return Ok(QueueStep::Done(Some(Acquired {
                        session: Arc::clone(q.session()),
                        node,
                        czxid: q.czxid,
                        heard_at: q.heard_at,
                        listing: Some(listing),
                    })));
                }
                Standing::Behind(child) => format!("{dir}/{child}"),
            };
            if wait == Wait::No || passed(deadline) {
                clean_up_now(q.undo, timeout).await;
                return Ok(QueueStep::Done(None));
            }
            let watched = with_timeout(
                "watch",
                timeout,
                q.session().client.check_and_watch_stat(&predecessor),
            )
            .await;
            match triage_timed("watch", timeout, watched) {
                // Gone already: list again.
                Ok((None, _)) => {}
                Ok((Some(_), watcher)) => {
                    *ours = Some(q);
                    return Ok(QueueStep::Wait(watcher));
                }
                Err(Triage::SessionEnded) => {
                    start_over(shared, &Arc::clone(q.session()), &mut q.undo).await;
                    continue 'session;
                }
                Err(Triage::Retry) if pause_before_retry(deadline).await => {}
                Err(Triage::Retry) => {
                    clean_up_now(q.undo, timeout).await;
                    return Ok(QueueStep::Done(None));
                }
                Err(Triage::Fail(e)) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_of_curator_kazoo_and_others() {
        let seq = |c: &str, m: &str| sequence(c, m).unwrap();
        assert_eq!(seq("_c_1f-lock-0000000042", "lock"), Some(42));
        assert_eq!(seq("abc__lock__0000000007", "lock"), Some(7));
        assert_eq!(seq("_c_1f-latch-0000000003", "latch"), Some(3));
        assert_eq!(seq("abc__lock__0000000007", "latch"), None);
        assert_eq!(seq("_unfair_lock", "lock"), None);
        assert_eq!(seq("_c_x-lock-12", "lock"), None);
        assert_eq!(seq("_c_x-lock-000000000a", "lock"), None);
        assert_eq!(seq("_c_x-lock-2147483647", "lock"), Some(2_147_483_647));
        let q = sorted_queue(
            vec![
                "b-lock-0000000010".into(),
                "a__lock__0000000002".into(),
                "junk".into(),
                "c-lock-0000000005".into(),
            ],
            "lock",
        )
        .unwrap();
        let names: Vec<&str> = q.iter().map(|(_, n)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "a__lock__0000000002",
                "c-lock-0000000005",
                "b-lock-0000000010"
            ]
        );
    }

    #[test]
    fn a_sequence_past_i32_max_is_an_error_not_a_skipped_child() {
        // ZooKeeper prints the wrapped counter with "%010d".
        for child in [
            "_c_1f-lock--2147483648",
            "_c_1f-lock--000000001",
            "x__lock__-2147483647",
        ] {
            assert!(sequence(child, "lock").is_err(), "{child}");
        }
        assert!(sorted_queue(vec!["_c_1f-lock--2147483648".into()], "lock").is_err());
        assert_eq!(sequence("_c_1f-lock--", "lock").unwrap(), None);
    }
}
