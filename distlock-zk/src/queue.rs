//! The queue of ephemeral sequential nodes behind the fair mutex, the
//! election, the read-write lock and the semaphore's internal lock: joining
//! it (the create, with the lookup after an unknown outcome), the rules of
//! who holds ([`QueueRules`]), waiting in it, and withdrawing from it. The
//! protocol is the crate docs' ("The recipes", "Unknown outcomes").

use std::borrow::Cow;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::backend::{with_timeout, Cleanup, CleanupGuard};
use distlock_core::{Error, Result, Wait};
use tokio::time::Instant;
use zookeeper_client::{CreateMode, CreateSequence, Error as ZkError, OneshotWatcher};

use crate::context::{session_for, start_over, Context};
use crate::error::{triage, triage_timed, Triage};
use crate::layout::{sorted_queue, Wrapped};
use crate::lease::Acquired;
use crate::node::{
    acls, check_lock_dir, delete_retrying, find_ours, find_prefixed, make_parents, session_owned,
    WHILE_SESSION_LIVES,
};
use crate::session::Session;
use crate::wait::{
    passed, pause_before_retry, slack, watch_fired, watch_noticed, withdraw_now, within, Recreate,
};

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

    /// The primitive's directory, when the queue's is below it (a
    /// semaphore's `locks`): checked as a lock directory's at every join.
    fn primitive_dir(&self) -> Option<&str> {
        None
    }
}

impl<T: QueueRules + ?Sized> QueueRules for &T {
    fn node_name(&self) -> Cow<'static, str> {
        (**self).node_name()
    }

    fn standing(&self, children: Vec<String>, own: &str) -> std::result::Result<Standing, Wrapped> {
        (**self).standing(children, own)
    }

    fn primitive_dir(&self) -> Option<&str> {
        (**self).primitive_dir()
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
    /// path (a waiting acquisition keeps this for as long as it waits);
    /// `true` when an earlier create of ours in this session had an unknown
    /// outcome (it may land late: every node with our prefix is swept).
    Seq(CreateSequence, bool),
    /// Any other node (found by a lookup after a create of unknown
    /// outcome: a queue withdraw sweeps the prefix too).
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

    /// Deletes the node of `acquired`, and with [`Acquired::sweep`] every
    /// node of its session with its prefix too.
    pub(crate) fn acquired(acquired: &Acquired, timeout: Duration) -> Arc<Self> {
        let parts = acquired.sweep.then(|| {
            let (dir, name) = acquired.node.rsplit_once('/')?;
            let uuid = uuid::Uuid::parse_str(name.get(3..39)?).ok()?;
            // `_c_<uuid>-<name><seq10>`
            let kind = name.get(40..name.len().checked_sub(10)?)?;
            Some((dir, uuid, kind.to_owned()))
        });
        match parts.flatten() {
            Some((dir, uuid, kind)) => {
                let withdraw = Self::new(
                    &acquired.session,
                    Arc::from(dir),
                    (uuid, Cow::Owned(kind)),
                    timeout,
                );
                withdraw.know(&acquired.node);
                withdraw
            }
            None => Self::node(&acquired.session, &acquired.node, timeout),
        }
    }

    fn know(&self, node: &str) {
        *self.known.lock().unwrap_or_else(PoisonError::into_inner) = Known::Path(node.into());
    }

    /// Our node is `dir/prefix<seq>`; `unsure`: an earlier create of ours
    /// in this session had an unknown outcome.
    fn know_seq(&self, seq: CreateSequence, unsure: bool) {
        *self.known.lock().unwrap_or_else(PoisonError::into_inner) = Known::Seq(seq, unsure);
    }

    /// Whether a create of ours in this session had an unknown outcome, so
    /// that more than one node of ours may exist (a late create): the
    /// withdraw then deletes every node with our prefix in the session.
    pub(crate) fn unsure(&self) -> bool {
        if self.dir.is_empty() {
            // A withdraw of one known node.
            return false;
        }
        matches!(
            &*self.known.lock().unwrap_or_else(PoisonError::into_inner),
            Known::Nothing | Known::Seq(_, true) | Known::Path(_)
        )
    }

    /// The known node's path, if any.
    fn known(&self) -> Option<String> {
        match &*self.known.lock().unwrap_or_else(PoisonError::into_inner) {
            Known::Nothing => None,
            Known::Seq(seq, _) => Some(format!("{}{seq}", self.path_prefix())),
            Known::Path(path) => Some(path.to_string()),
        }
    }
}

#[async_trait]
impl Cleanup for Withdraw {
    async fn clean_up(&self) -> Result<()> {
        // Retry for as long as the session may live: a node left behind
        // would stay (and block the queue) until the session ends.
        if let Some(node) = self.known() {
            delete_retrying(&self.session, &node, None, WHILE_SESSION_LIVES).await?;
            if !self.unsure() {
                return Ok(());
            }
        }
        loop {
            if self.session.is_dead() {
                return Ok(());
            }
            match find_ours(&self.session, &self.dir, &self.prefix(), self.timeout()).await {
                Ok(nodes) => {
                    for (node, _) in nodes {
                        delete_retrying(&self.session, &node, None, WHILE_SESSION_LIVES).await?;
                    }
                    return Ok(());
                }
                Err(Triage::SessionEnded) => return Ok(()),
                Err(Triage::Fail(e)) => return Err(e),
                Err(Triage::Retry) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}

/// Our node is the lowest of ours in our session: every node with our
/// prefix in the directory is ours (only this acquisition names nodes with
/// its uuid), the lowest is kept as our node, the others are deleted (of
/// another session of ours too: we left it). Then the caller lists again.
async fn adopt_lowest(q: &mut InQueue, timeout: Duration) -> std::result::Result<(), Triage> {
    let session = Arc::clone(q.session());
    let withdraw = &q.withdraw;
    let mut ours = find_prefixed(&session, &withdraw.dir, &withdraw.prefix(), timeout).await?;
    let keep = ours.iter().position(|(_, _, in_session)| *in_session);
    if let Some(keep) = keep {
        let (node, czxid, _) = ours.remove(keep);
        withdraw.know(&node);
        q.czxid = czxid;
    }
    for (extra, _, _) in ours {
        tracing::debug!(node = %extra, "distlock zookeeper: deleting an extra node of ours");
        // Bounded here; a node still there shows in the next listing.
        let _ = delete_retrying(&session, &extra, None, timeout).await;
    }
    Ok(())
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

async fn look_for_ours(session: &Arc<Session>, withdraw: &Withdraw, wait: Wait) -> Lookup {
    let deadline = wait.deadline();
    loop {
        let sent = Instant::now();
        let ask = within(withdraw.timeout(), wait);
        match find_ours(session, &withdraw.dir, &withdraw.prefix(), ask).await {
            Ok(nodes) => {
                let mut nodes = nodes.into_iter();
                let Some((node, czxid)) = nodes.next() else {
                    return Lookup::Absent;
                };
                for (extra, _) in nodes {
                    // A second node of ours would queue behind us and block
                    // the queue after our release: delete it for sure.
                    let extra = Withdraw::node(session, &extra, withdraw.timeout());
                    if let Ok(mut withdrawal) =
                        CleanupGuard::arm("withdraw an extra queue node", extra)
                    {
                        withdrawal.run_in_background();
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
    /// not happen; the withdrawal is disarmed): create again.
    Again,
    /// The session ended with every ephemeral node of ours (the withdrawal is
    /// disarmed and the session dropped): start over on a new one.
    SessionEnded,
    /// The deadline passed while looking for a node of unknown fate: the
    /// caller cleans up (the withdrawal is still armed) and gives up.
    DeadlinePassed,
}

/// Creates one ephemeral sequential node `withdraw.dir/withdraw.prefix<seq>`
/// in `withdraw`'s session, with `data`; with `list`, the listing of the
/// directory (with its stat, checked as a lock directory's) is pipelined
/// with the create. `under` is the primitive's directory when the queue's
/// is below it (a semaphore's `locks`): its stat is pipelined and checked
/// too. A create of unknown outcome is never sent again until a lookup by
/// its prefix (after a `sync`) has found nothing; the withdraw then
/// remembers that a late create may still land, and sweeps the prefix.
///
/// `withdrawal` must be armed with `withdraw`, before this is called.
///
/// # Errors
///
/// [`Error::Conflict`] for a directory that is not a lock's (ephemeral, or
/// holding data: an id counter), after our node is deleted; server errors
/// (the withdrawal then stays armed when a node of ours may exist).
pub(crate) async fn join(
    ctx: &Context,
    withdraw: &Withdraw,
    withdrawal: &mut CleanupGuard,
    (data, list, under): (&[u8], bool, Option<&str>),
    wait: Wait,
) -> Result<Joined> {
    let timeout = ctx.timeout;
    let session = &withdraw.session;
    let dir = &*withdraw.dir;
    let path_prefix = withdraw.path_prefix();
    let create = CreateMode::EphemeralSequential.with_acls(acls(ctx.authenticated));
    // An earlier create of ours in this session had an unknown outcome.
    let mut unsure = false;
    let mut again = Recreate::new();
    loop {
        // Pipelined: the requests leave now, and ZooKeeper answers a
        // session's requests in order, so the listing includes our node.
        let sent = Instant::now();
        let created = session.client.create(&path_prefix, data, &create);
        let listed = list.then(|| session.client.get_children(dir));
        let checked = under.map(|p| session.client.check_stat(p));
        // The full operation timeout, even near the deadline: every
        // acquisition makes one whole attempt (a free lock is taken with
        // any timeout); past it, only what is left of the slack.
        let outcome = with_timeout("create", slack(timeout, wait), async {
            let (created, listed, checked) = futures::join!(
                created,
                futures::future::OptionFuture::from(listed),
                futures::future::OptionFuture::from(checked)
            );
            (created, listed.and_then(Result::ok), checked)
        })
        .await;
        let (created, listed, checked) = match outcome {
            Ok(answers) => answers,
            Err(_) => (Err(ZkError::Timeout), None, None),
        };
        // The directory as the pipelined reads showed it: `Some(Err)` when
        // it is not a lock's; `None` when its stat did not come.
        let verdict = match (under, &listed, &checked) {
            (None, Some((_, stat)), _) => Some(check_lock_dir(dir, stat)),
            (None, None, _) if !list => Some(Ok(())),
            (Some(p), _, Some(Ok(Some(stat)))) => Some(check_lock_dir(p, stat)),
            (Some(_), _, Some(Ok(None))) => Some(Ok(())),
            _ => None,
        };
        let (node, czxid, children, heard_at) = match created {
            Ok((stat, seq)) => {
                withdraw.know_seq(seq, unsure);
                let verdict = match verdict {
                    Some(v) => v,
                    None => check_dir_again(session, dir, under, timeout).await,
                };
                if let Err(e) = verdict {
                    // Refused: nothing of ours may stay under that name.
                    let _ = with_timeout("withdraw", timeout, withdrawal.run_now()).await;
                    return Err(e);
                }
                let children = listed.map(|(children, _)| children);
                (format!("{path_prefix}{seq}"), stat.czxid, children, sent)
            }
            Err(ZkError::NoNode) => {
                withdrawal.disarm();
                if let Some(p) = under {
                    // Made by us, the missing parents would be left below a
                    // name that is not a lock's.
                    check_dir_again(session, p, None, timeout).await?;
                }
                make_parents(session, &path_prefix, ctx.authenticated, timeout).await?;
                return Ok(Joined::Again);
            }
            Err(ZkError::NoChildrenForEphemerals) => {
                withdrawal.disarm();
                return Err(conflict(dir));
            }
            Err(e) => match triage("create", timeout, e.clone()) {
                Triage::SessionEnded => {
                    start_over(ctx, session, withdrawal).await;
                    return Ok(Joined::SessionEnded);
                }
                Triage::Fail(e) => {
                    withdrawal.disarm();
                    return Err(e);
                }
                // The create may have happened: look, never create twice.
                Triage::Retry => match look_for_ours(session, withdraw, wait).await {
                    Lookup::Found(node, czxid, heard_at) => {
                        withdraw.know(&node);
                        if let Err(e) = check_dir_again(session, dir, under, timeout).await {
                            let _ = with_timeout("withdraw", timeout, withdrawal.run_now()).await;
                            return Err(e);
                        }
                        (node, czxid, None, heard_at)
                    }
                    Lookup::Absent => {
                        // Not there now; it may still land late (read by
                        // the server, not yet run): create again after a
                        // pause, and keep the withdraw's sweep of our
                        // prefix armed (nothing known yet: the withdrawal, armed
                        // on every return below, sweeps it).
                        unsure = true;
                        if again.pause(wait).await {
                            continue;
                        }
                        if wait == Wait::No {
                            return Err(crate::error::from_zk("create", timeout, e));
                        }
                        return Ok(Joined::DeadlinePassed);
                    }
                    Lookup::SessionEnded => {
                        start_over(ctx, session, withdrawal).await;
                        return Ok(Joined::SessionEnded);
                    }
                    Lookup::DeadlinePassed => return Ok(Joined::DeadlinePassed),
                    Lookup::Failed(e) => return Err(e),
                },
            },
        };
        return Ok(Joined::Node {
            node,
            czxid,
            children,
            heard_at,
        });
    }
}

/// Reads the stat of `under` (the primitive's directory), or else of `dir`,
/// and checks it is a lock directory's (absent is fine: nothing is there).
/// Retries unknown outcomes for up to one operation timeout; a check that
/// cannot be answered in that time passes (the pipelined check it repeats
/// answers in every case but a connection failure).
///
/// # Errors
///
/// Only [`Error::Conflict`] (or the server's refusal of the read, such as
/// `NoAuth`).
pub(crate) async fn check_dir_again(
    session: &Session,
    dir: &str,
    under: Option<&str>,
    timeout: Duration,
) -> Result<()> {
    let path = under.unwrap_or(dir);
    let started = Instant::now();
    loop {
        let read = with_timeout("stat", timeout, session.client.check_stat(path)).await;
        match triage_timed("stat", timeout, read) {
            Ok(Some(stat)) => return check_lock_dir(path, &stat),
            Ok(None) => return Ok(()),
            Err(Triage::Fail(e)) => return Err(e),
            Err(Triage::SessionEnded) => return Ok(()),
            Err(Triage::Retry) if started.elapsed() < timeout => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(Triage::Retry) => return Ok(()),
        }
    }
}

/// Joins the queue of `marker` nodes in `dir` and waits for the head of it.
///
/// Cancellation safe: as [`join_queue`].
pub(crate) fn enter_queue<'a>(
    ctx: &'a Context,
    dir: &'a Arc<str>,
    marker: &'a str,
    data: &'a [u8],
    wait: Wait,
) -> impl std::future::Future<Output = Result<Option<Acquired>>> + Send + 'a {
    // Not an `async fn`: [`join_queue`]'s future itself, with no second
    // body around it (a waiting task keeps this future).
    join_queue(ctx, dir, Fifo(marker), data, wait)
}

/// A FIFO queue of `marker` nodes in a directory below the primitive's.
struct Below<'a> {
    marker: &'a str,
    primitive_dir: &'a str,
}

impl QueueRules for Below<'_> {
    fn node_name(&self) -> Cow<'static, str> {
        Fifo(self.marker).node_name()
    }

    fn standing(&self, children: Vec<String>, own: &str) -> std::result::Result<Standing, Wrapped> {
        Fifo(self.marker).standing(children, own)
    }

    fn primitive_dir(&self) -> Option<&str> {
        Some(self.primitive_dir)
    }
}

/// As [`enter_queue`], for a queue in a directory below the primitive's
/// `primitive_dir` (a semaphore's `locks`), which every join checks.
///
/// Cancellation safe: as [`join_queue`].
pub(crate) fn enter_queue_below<'a>(
    ctx: &'a Context,
    dir: &'a Arc<str>,
    primitive_dir: &'a str,
    marker: &'a str,
    data: &'a [u8],
    wait: Wait,
) -> impl std::future::Future<Output = Result<Option<Acquired>>> + Send + 'a {
    join_queue(
        ctx,
        dir,
        Below {
            marker,
            primitive_dir,
        },
        data,
        wait,
    )
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
    ctx: &'a Context,
    dir: &'a Arc<str>,
    marker: &'a str,
    tag: &'a str,
    data: &'a [u8],
    wait: Wait,
) -> impl std::future::Future<Output = Result<Option<Acquired>>> + Send + 'a {
    join_queue(ctx, dir, Tagged { marker, tag }, data, wait)
}

/// Our node while it waits in a queue: the session it lives in, its
/// withdraw (armed until the node is ours to keep), which knows its path.
struct InQueue {
    /// Knows the session and our node's path.
    withdraw: Arc<Withdraw>,
    withdrawal: CleanupGuard,
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
    ctx: &'a Context,
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
            let step = queue_step(ctx, dir, &rules, data, wait, uuid, &mut ours);
            // Out of the match, so that the step is not kept through the wait.
            let watcher = match Box::pin(step).await? {
                QueueStep::Done(acquired) => return Ok(acquired),
                QueueStep::Wait(watcher) => watcher,
            };
            if !watch_fired(ctx, watcher, wait.deadline()).await? {
                if let Some(waiting) = ours.take() {
                    Box::pin(withdraw_now(waiting.withdrawal, slack(ctx.timeout, wait))).await;
                }
                return Ok(None);
            }
            watch_noticed(ctx);
        }
    }
}

/// One step of [`join_queue`]: our node in the queue (joining, or again on
/// a new session), then listings until it holds or a watch is set on the
/// node it waits for. `ours` is our node across steps: taken out here, put
/// back only with a watch to wait on; dropped with its withdraw armed on
/// an error or a cancellation.
async fn queue_step(
    ctx: &Context,
    dir: &Arc<str>,
    rules: &dyn QueueRules,
    data: &[u8],
    wait: Wait,
    uuid: uuid::Uuid,
    ours: &mut Option<InQueue>,
) -> Result<QueueStep> {
    let timeout = ctx.timeout;
    let deadline = wait.deadline();
    let mut children = None;
    // Our extra nodes were looked for once in this step already.
    let mut adopted = false;
    'session: loop {
        let mut q = match ours.take() {
            Some(q) => q,
            None => {
                let Some(session) = session_for(ctx, wait).await? else {
                    return Ok(QueueStep::Done(None));
                };
                let naming = (uuid, rules.node_name());
                let withdraw = Withdraw::new(&session, Arc::clone(dir), naming, timeout);
                let mut withdrawal =
                    CleanupGuard::arm("withdraw from queue", Arc::clone(&withdraw) as _)?;
                let asks = (data, true, rules.primitive_dir());
                match join(ctx, &withdraw, &mut withdrawal, asks, wait).await? {
                    Joined::Node {
                        czxid,
                        children: listed,
                        heard_at,
                        ..
                    } => {
                        children = listed;
                        InQueue {
                            withdraw,
                            withdrawal,
                            czxid,
                            heard_at,
                        }
                    }
                    Joined::Again | Joined::SessionEnded => continue 'session,
                    Joined::DeadlinePassed => {
                        withdraw_now(withdrawal, slack(timeout, wait)).await;
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
                    let ask = within(timeout, wait);
                    let listed =
                        with_timeout("list", ask, q.session().client.list_children(dir)).await;
                    match triage_timed("list", timeout, listed) {
                        Ok(names) => {
                            q.heard_at = list_sent;
                            names
                        }
                        Err(Triage::SessionEnded) => {
                            start_over(ctx, &Arc::clone(q.session()), &mut q.withdrawal).await;
                            continue 'session;
                        }
                        Err(Triage::Retry) if pause_before_retry(deadline).await => continue,
                        Err(Triage::Retry) => {
                            withdraw_now(q.withdrawal, slack(timeout, wait)).await;
                            return Ok(QueueStep::Done(None));
                        }
                        Err(Triage::Fail(e)) => return Err(e),
                    }
                }
            };
            let node = q.node();
            let own_name = node.rsplit('/').next().unwrap_or_default();
            let prefix = q.withdraw.prefix();
            if !adopted
                && names
                    .iter()
                    .any(|c| c.starts_with(&prefix) && c != own_name)
            {
                adopted = true;
                // A second node of ours (a create of unknown outcome that
                // landed late): never wait behind it, nor leave it.
                match adopt_lowest(&mut q, timeout).await {
                    Ok(()) => {}
                    Err(Triage::SessionEnded) => {
                        start_over(ctx, &Arc::clone(q.session()), &mut q.withdrawal).await;
                        continue 'session;
                    }
                    Err(Triage::Retry) if pause_before_retry(deadline).await => {}
                    Err(Triage::Retry) => {
                        withdraw_now(q.withdrawal, slack(timeout, wait)).await;
                        return Ok(QueueStep::Done(None));
                    }
                    Err(Triage::Fail(e)) => return Err(e),
                }
                continue;
            }
            // Kept for the kind check of a node that holds (`kinds`).
            let listing = names.clone();
            let standing = match rules.standing(names, own_name) {
                Ok(standing) => standing,
                Err(Wrapped) => {
                    withdraw_now(q.withdrawal, slack(timeout, wait)).await;
                    return Err(wrapped(dir));
                }
            };
            let predecessor = match standing {
                Standing::Missing => {
                    // Our node is gone (deleted by someone): queue again.
                    q.withdrawal.disarm();
                    if passed(deadline) {
                        return Ok(QueueStep::Done(None));
                    }
                    continue 'session;
                }
                Standing::Holds => {
                    q.withdrawal.disarm();
                    return Ok(QueueStep::Done(Some(Acquired {
                        session: Arc::clone(q.session()),
                        node,
                        czxid: q.czxid,
                        heard_at: q.heard_at,
                        sweep: q.withdraw.unsure(),
                        listing: Some(listing),
                    })));
                }
                Standing::Behind(child) => format!("{dir}/{child}"),
            };
            if wait == Wait::No || passed(deadline) {
                withdraw_now(q.withdrawal, slack(timeout, wait)).await;
                return Ok(QueueStep::Done(None));
            }
            let watched = with_timeout(
                "watch",
                within(timeout, wait),
                q.session().client.check_and_watch_stat(&predecessor),
            )
            .await;
            match triage_timed("watch", timeout, watched) {
                // Gone already: list again.
                Ok((None, _)) => {}
                Ok((Some(stat), _)) if !session_owned(stat.ephemeral_owner) => {
                    // A persistent (or container, or TTL) node in the queue
                    // never goes by itself: waiting for it is waiting
                    // forever. Refused, and our node withdrawn.
                    withdraw_now(q.withdrawal, slack(timeout, wait)).await;
                    return Err(Error::Conflict {
                        what: format!("zookeeper node {predecessor:?}"),
                        expected: "lock node of a session (it is persistent, so it would never be released)",
                    });
                }
                Ok((Some(_), watcher)) => {
                    *ours = Some(q);
                    return Ok(QueueStep::Wait(watcher));
                }
                Err(Triage::SessionEnded) => {
                    start_over(ctx, &Arc::clone(q.session()), &mut q.withdrawal).await;
                    continue 'session;
                }
                Err(Triage::Retry) if pause_before_retry(deadline).await => {}
                Err(Triage::Retry) => {
                    withdraw_now(q.withdrawal, slack(timeout, wait)).await;
                    return Ok(QueueStep::Done(None));
                }
                Err(Triage::Fail(e)) => return Err(e),
            }
        }
    }
}
