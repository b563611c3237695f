//! One name is one lock: the node layout of every kind of primitive under a
//! lock's directory, and the check each acquisition runs before it holds.
//!
//! Every kind keeps its nodes under the same directory `DIR` (Curator's
//! layouts): the unfair mutex's one node `DIR/_unfair_lock`; the fair
//! mutex's `DIR/_c_<uuid>-lock-<seq>` (and kazoo's `…__lock__<seq>`); the
//! read-write lock's `DIR/_c_<uuid>-__READ__<seq>` / `…__WRIT__<seq>`; the
//! election's `DIR/_c_<uuid>-<tag>-latch-<seq>`; the semaphore's lease
//! nodes `DIR/leases/_c_<uuid>-lease-<seq>` (its internal lock's nodes under
//! `DIR/locks` are waiters and are not counted).
//!
//! **The check (create, then list).** Once an acquisition's own node exists
//! and its own recipe says it holds, it lists `DIR` (and `DIR/leases` when
//! there is one). Of each other kind present it takes the *front*: its
//! oldest node, by `czxid` (a global order over the ensemble's history; the
//! sequence numbers only order the nodes of one parent, so they pick the
//! front within a kind and one `exists` per kind reads its `czxid`). The
//! mutex and the fair mutex are one family. If another family's front is
//! older than our own node (a holder, or a waiter that came first), the
//! acquisition deletes its node and fails with [`Error::Conflict`] naming
//! both kinds; else it holds. Why two kinds never both hold: of two
//! holders `a` and `b`, say `b` checked later; `a` was alive then, so `b`
//! saw it and holds only if `a` is younger than `b`; then `b` was created
//! before `a` and, alive when `b` checked, was alive when `a` checked after
//! its own create, so `a` saw the older `b` and did not hold. Arriving at
//! once, the older node wins and the younger is refused. Both are refused
//! only when a waiter of one kind comes to hold while a refused node of
//! another kind, created before it, is not deleted yet (a node that came
//! and went while the name was held).
//!
//! **Mutex and fair mutex wait for each other.** The fair queue's head
//! holds only if the unfair node is absent or younger than the head; the
//! unfair node's creator holds only if no fair node is older than its node.
//! The one that yields keeps its node and watches the other's (the unfair
//! node, or the oldest fair node): when that goes it looks again, so no
//! free lock sits unused while the other waits, and the older arrival goes
//! first. The watch is on the very node compared: the watch's stat must
//! show the `czxid` the look compared, else (the unfair node released and
//! created again in between, by a younger arrival that may be waiting for
//! us) the yielder looks again instead of waiting. So a waiter only ever
//! waits for a node older than its own, and two never wait for each other.
//!
//! A node that waited is looked up (its `czxid`) after the look that
//! cleared it: deleted meanwhile (`force_release`, an operator), it is
//! never given back as held; the acquisition joins again.
//!
//! `inspect` and `force_release` of either kind apply the same rule: the
//! older of the unfair node and the fair queue's head is the holder (it
//! holds, or holds once its check is done); the other shows as a waiter.
//!
//! Nothing more is read when no other kind has a node under the directory:
//! the check decides on the listing its recipe already made after creating
//! the node (the queue's listing that showed the fair mutex's, read-write
//! lock's or election's node holding; for the unfair mutex a listing sent
//! right behind its create on the same session, answered in the same round
//! trip). Another kind present costs one `exists` per kind (pipelined); the
//! semaphore lists its directory once more after counting its leases.

use std::sync::Arc;
use std::time::Duration;

use distlock_core::backend::{with_timeout, Cleanup, CleanupGuard};
use distlock_core::{Error, Name, Result, Wait};
use tokio::time::Instant;
use zookeeper_client::{Error as ZkError, OneshotWatcher, Stat};

use crate::context::Context;
use crate::error::{triage_timed, Triage};
use crate::layout::{classify, sequence, Kind, LEASES};
use crate::lease::Acquired;
use crate::node::{Mark, WithdrawIfOurs};
use crate::queue::Withdraw;
use crate::session::Session;
use crate::wait::{
    passed, pause_before_retry, slack, watch_fired, watch_noticed, withdraw_now, within,
};

/// What the check found.
pub(crate) enum Verdict {
    /// Our node may hold.
    Clear,
    /// Our node must wait for this node (of the other half of the mutex
    /// family, older than ours) to go: its path and the `czxid` it was
    /// compared by. The wait is on that very node: a node at the path with
    /// another `czxid` (the unfair node deleted and created again, younger)
    /// is compared again, never waited for.
    Wait(String, i64),
}

/// The front (oldest node) of each kind present, as paths.
#[derive(Default)]
struct Fronts {
    /// `(kind, sequence, path)`; the unfair node with sequence 0.
    of: Vec<(Kind, u64, String)>,
}

impl Fronts {
    fn offer(&mut self, kind: Kind, seq: u64, path: String) {
        match self.of.iter_mut().find(|(k, _, _)| *k == kind) {
            Some(front) if front.1 <= seq => {}
            Some(front) => *front = (kind, seq, path),
            None => self.of.push((kind, seq, path)),
        }
    }
}

/// The fronts of the kinds present among `children` of `dir` (and in its
/// `leases`, listed here when there is one).
async fn fronts(
    session: &Session,
    dir: &str,
    children: Vec<String>,
    timeout: Duration,
) -> Result<Fronts, Triage> {
    let mut fronts = Fronts::default();
    let mut leases = false;
    for child in children {
        match classify(&child) {
            Some((Kind::Semaphore, _)) => leases = true,
            Some((kind, seq)) => fronts.offer(kind, seq.unwrap_or(0), format!("{dir}/{child}")),
            None => {}
        }
    }
    if leases {
        let path = format!("{dir}/{LEASES}");
        let listed = with_timeout("list", timeout, session.client.list_children(&path)).await;
        let children = match listed {
            Ok(Err(ZkError::NoNode)) => Vec::new(),
            other => triage_timed("list", timeout, other)?,
        };
        for child in children {
            if let Ok(Some(seq)) = sequence(&child, "lease") {
                fronts.offer(Kind::Semaphore, seq, format!("{path}/{child}"));
            }
        }
    }
    Ok(fronts)
}

/// One look at `children` of `dir`: `Ok(None)` when a front went between
/// the listing and its `exists` (look again).
async fn look(
    session: &Session,
    (dir, children): (&str, Vec<String>),
    name: &Name,
    mine: Kind,
    own_czxid: i64,
    timeout: Duration,
) -> Result<Option<Verdict>, Triage> {
    let mut fronts = fronts(session, dir, children, timeout).await?;
    // Our own kind's nodes are ordered by its own recipe.
    fronts.of.retain(|(k, _, _)| *k != mine);
    if fronts.of.is_empty() {
        return Ok(Some(Verdict::Clear));
    }
    let family = mine.family();
    let stats = fronts.of.iter().map(|(_, _, path)| {
        let path = path.clone();
        async move { session.client.check_stat(&path).await }
    });
    let read = with_timeout("stat", timeout, futures::future::join_all(stats)).await;
    let read = read.map(|all| {
        all.into_iter()
            .collect::<std::result::Result<Vec<Option<Stat>>, ZkError>>()
    });
    let read = triage_timed("stat", timeout, read)?;
    let mut czxids: Vec<(Kind, i64, &str)> = Vec::with_capacity(fronts.of.len());
    for ((kind, _, path), stat) in fronts.of.iter().zip(read) {
        let Some(stat) = stat else {
            return Ok(None);
        };
        czxids.push((*kind, stat.czxid, path));
    }
    if let Some((other, _, _)) = czxids
        .iter()
        .filter(|(k, c, _)| k.family() != family && *c < own_czxid)
        .min_by_key(|(_, c, _)| *c)
    {
        return Err(Triage::Fail(Error::kind_conflict(
            name.as_str(),
            other.noun(),
            mine.noun(),
        )));
    }
    // The other half of the mutex family, older than our node: wait for it.
    Ok(Some(
        match czxids
            .iter()
            .find(|(k, c, _)| k.family() == family && *k != mine && *c < own_czxid)
        {
            Some((_, czxid, path)) => Verdict::Wait((*path).to_owned(), *czxid),
            None => Verdict::Clear,
        },
    ))
}

/// The check of the module docs for our node of kind `mine` with
/// `own_czxid` under `dir`, on `listing` (the directory's children listed
/// after our node was created) if given, else on a listing of its own.
/// Also returns when the listing it decided on was sent, if it made one.
///
/// # Errors
///
/// `Triage::Fail` with [`Error::Conflict`] when another kind has the name;
/// `Triage::Retry` when the fronts kept going before they could be read.
pub(crate) async fn check(
    session: &Session,
    (dir, mut listing): (&str, Option<Vec<String>>),
    name: &Name,
    mine: Kind,
    own_czxid: i64,
    timeout: Duration,
) -> Result<(Verdict, Option<Instant>), Triage> {
    for _ in 0..8 {
        let (children, sent) = match listing.take() {
            Some(children) => (children, None),
            None => {
                let sent = Instant::now();
                let listed = with_timeout("list", timeout, session.client.list_children(dir)).await;
                (triage_timed("list", timeout, listed)?, Some(sent))
            }
        };
        if let Some(verdict) =
            look(session, (dir, children), name, mine, own_czxid, timeout).await?
        {
            return Ok((verdict, sent));
        }
    }
    Err(Triage::Retry)
}

/// What [`settle`] came to.
pub(crate) enum Settled {
    /// The node holds.
    Held(Acquired),
    /// Given up: `Wait::No` or the deadline while waiting for the other
    /// half of the mutex family; the node is deleted.
    NotAcquired,
    /// The session ended (with the node), or the node was deleted while
    /// it waited: join again.
    Again,
}

/// Runs [`check`] on a node its own recipe just found holding: gives it
/// back when it may hold, waits (watching the other node) while the other
/// half of the mutex family is older, and deletes it and fails with
/// [`Error::Conflict`] when another kind has the name. A node that waited
/// and was deleted meanwhile comes back as [`Settled::Again`].
///
/// Cancellation safe: the node is deleted (in the background if need be)
/// unless it is given back.
pub(crate) async fn settle(
    ctx: &Context,
    name: &Name,
    dir: &str,
    mine: Kind,
    mut acquired: Acquired,
    wait: Wait,
) -> Result<Settled> {
    let timeout = ctx.timeout;
    let deadline = wait.deadline();
    let session: Arc<Session> = Arc::clone(&acquired.session);
    // The unfair node's path is shared by every client: once ours may have
    // been deleted from outside (a force-release while it yielded), another
    // client's node can stand at that path, so it is deleted only if it is
    // still ours (its czxid). Queue nodes have names of their own.
    let withdraw: Arc<dyn Cleanup> = if mine == Kind::Mutex {
        Arc::new(WithdrawIfOurs {
            session: Arc::clone(&session),
            node: acquired.node.clone(),
            mark: Mark::Czxid(acquired.czxid),
            timeout,
        })
    } else {
        Withdraw::node(&session, &acquired.node, timeout)
    };
    let mut withdrawal = CleanupGuard::arm("withdraw a node another kind refused", withdraw)?;
    // Whether this is not our first look (we waited for the other half of
    // the mutex family, or retried): the node is then looked up before it
    // is given back as held.
    let mut looked = false;
    loop {
        let again = std::mem::replace(&mut looked, true);
        let listing = (dir, acquired.listing.take());
        let ask = slack(timeout, wait);
        let checked = check(&session, listing, name, mine, acquired.czxid, ask).await;
        let (waiting_for, compared) = match checked {
            Ok((verdict, sent)) => {
                if let Some(sent) = sent {
                    acquired.heard_at = sent;
                }
                match verdict {
                    Verdict::Clear if !again => {
                        withdrawal.disarm();
                        return Ok(Settled::Held(acquired));
                    }
                    Verdict::Clear => {
                        // We waited: our node may have been deleted
                        // meanwhile (`force_release`, an operator), and
                        // must not come back held. Read after the listing,
                        // so it was there for the look.
                        let stat = with_timeout(
                            "stat",
                            timeout,
                            session.client.check_stat(&acquired.node),
                        )
                        .await;
                        match triage_timed("stat", timeout, stat) {
                            Ok(Some(stat)) if stat.czxid == acquired.czxid => {
                                withdrawal.disarm();
                                return Ok(Settled::Held(acquired));
                            }
                            // Gone (the unfair path may hold another's
                            // node now: never delete it): join again.
                            Ok(_) => {
                                withdrawal.disarm();
                                return Ok(Settled::Again);
                            }
                            Err(Triage::Fail(e)) => {
                                withdraw_now(withdrawal, timeout).await;
                                return Err(e);
                            }
                            Err(Triage::SessionEnded) => {
                                withdrawal.disarm();
                                return Ok(Settled::Again);
                            }
                            Err(Triage::Retry) if pause_before_retry(deadline).await => continue,
                            Err(Triage::Retry) => {
                                withdraw_now(withdrawal, timeout).await;
                                return Ok(Settled::NotAcquired);
                            }
                        }
                    }
                    Verdict::Wait(path, czxid) => (path, czxid),
                }
            }
            Err(Triage::Fail(e)) => {
                withdraw_now(withdrawal, slack(timeout, wait)).await;
                return Err(e);
            }
            Err(Triage::SessionEnded) => {
                withdrawal.disarm();
                return Ok(Settled::Again);
            }
            Err(Triage::Retry) if pause_before_retry(deadline).await => continue,
            Err(Triage::Retry) => {
                withdraw_now(withdrawal, slack(timeout, wait)).await;
                return Ok(Settled::NotAcquired);
            }
        };
        if wait == Wait::No || passed(deadline) {
            withdraw_now(withdrawal, slack(timeout, wait)).await;
            return Ok(Settled::NotAcquired);
        }
        let watched = with_timeout(
            "watch",
            within(timeout, wait),
            session.client.check_and_watch_stat(&waiting_for),
        )
        .await;
        let watcher: OneshotWatcher = match triage_timed("watch", timeout, watched) {
            // Gone: look again.
            Ok((None, _)) => continue,
            // The node we compared, still there: wait for it to go.
            Ok((Some(stat), watcher)) if stat.czxid == compared => watcher,
            // Another node at the path (the unfair node released and
            // created again between the look and the watch): it is younger
            // than the one compared and may be younger than ours, and then
            // it waits for us: compare again instead of waiting for it (the
            // watch, once-only, is dropped).
            Ok((Some(_), _)) => continue,
            Err(Triage::Fail(e)) => {
                withdraw_now(withdrawal, slack(timeout, wait)).await;
                return Err(e);
            }
            Err(Triage::SessionEnded) => {
                withdrawal.disarm();
                return Ok(Settled::Again);
            }
            Err(Triage::Retry) if pause_before_retry(deadline).await => continue,
            Err(Triage::Retry) => {
                withdraw_now(withdrawal, slack(timeout, wait)).await;
                return Ok(Settled::NotAcquired);
            }
        };
        if !watch_fired(ctx, watcher, deadline).await? {
            withdraw_now(withdrawal, slack(timeout, wait)).await;
            return Ok(Settled::NotAcquired);
        }
        watch_noticed(ctx);
    }
}
