//! Requests on nodes: retrying deletes, the withdrawal of a node at a shared
//! path, the lookup of our nodes by prefix, parents, ACLs, and the checks of
//! a lock directory and of a node's owner.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::backend::{with_timeout, Cleanup};
use distlock_core::{Error, Result};
use tokio::time::Instant;
use zookeeper_client::{Acls, CreateMode, Error as ZkError, Stat};

use crate::error::{from_zk, triage_timed, Triage};
use crate::layout::sequence_digits;
use crate::session::Session;

/// ZooKeeper marks container nodes with this `ephemeralOwner`.
pub(crate) const CONTAINER_OWNER: i64 = i64::MIN;

/// Whether a node's `ephemeralOwner` is a session: not 0 (persistent), not
/// a container's, not a TTL node's (the high byte all ones). Only a node a
/// session owns is a lock holder or waiter: any other never goes by itself.
pub(crate) fn session_owned(ephemeral_owner: i64) -> bool {
    ephemeral_owner != 0
        && ephemeral_owner != CONTAINER_OWNER
        && (ephemeral_owner.to_be_bytes()[0]) != 0xFF
}

/// Checks that `dir`, with `stat`, can be a lock's directory: no data (an
/// id counter holds 8 bytes) and not ephemeral (an ephemeral node has no
/// children).
///
/// # Errors
///
/// [`Error::Conflict`] otherwise.
pub(crate) fn check_lock_dir(dir: &str, stat: &Stat) -> Result<()> {
    if stat.ephemeral_owner != 0 && stat.ephemeral_owner != CONTAINER_OWNER {
        return Err(Error::Conflict {
            what: format!("zookeeper node {dir:?}"),
            expected: "lock directory (it is an ephemeral node)",
        });
    }
    if stat.data_length > 0 {
        return Err(Error::Conflict {
            what: format!("zookeeper node {dir:?}"),
            expected: "lock directory without data (it holds data: an id counter or another client's node)",
        });
    }
    Ok(())
}

/// A cleanup budget with no end of its own: retry for as long as the
/// session lives (a node of a live session blocks its lock for as long as
/// the session does; once the session has ended, its ephemeral nodes are
/// gone with it).
pub(crate) const WHILE_SESSION_LIVES: Duration = Duration::MAX;

/// The first pause between two tries of a cleanup, and the longest.
const FIRST_PAUSE: Duration = Duration::from_millis(20);
const LONGEST_PAUSE: Duration = Duration::from_millis(500);

/// Waits before the next try of a cleanup; `false` when that would pass
/// `deadline` (none: [`WHILE_SESSION_LIVES`]).
async fn pause_for_retry(pause: &mut Duration, deadline: Option<Instant>) -> bool {
    if deadline.is_some_and(|d| Instant::now() + *pause >= d) {
        return false;
    }
    tokio::time::sleep(*pause).await;
    *pause = (*pause * 2).min(LONGEST_PAUSE);
    true
}

/// Deletes `node` (at `version`, if given), retrying every failure of
/// unknown outcome (see `error`: a lost or reset connection, the client's
/// own no-response timeout, no answer within a try) until `budget` runs
/// out or the session ends: a failed delete would otherwise leave the node
/// (and the lock) in place for as long as the session lives. Returns
/// whether the node was ours to delete (`Ok(false)`: it was already gone,
/// had another version, or the session ended and took it along; a node
/// gone after a delete of unknown outcome counts as deleted by us).
pub(crate) async fn delete_retrying(
    session: &Session,
    node: &str,
    version: Option<i32>,
    budget: Duration,
) -> Result<bool> {
    let deadline = Instant::now().checked_add(budget);
    let per_try = budget.min(Duration::from_secs(2));
    let mut pause = FIRST_PAUSE;
    let mut sent = false;
    loop {
        let outcome = tokio::time::timeout(per_try, session.client.delete(node, version)).await;
        match outcome {
            Ok(Ok(())) => return Ok(true),
            Ok(Err(ZkError::NoNode)) => return Ok(sent),
            Ok(Err(ZkError::BadVersion)) => return Ok(false),
            Ok(Err(e)) if crate::error::session_ended(&e) => return Ok(false),
            Ok(Err(e)) if !crate::error::unknown(&e) => return Err(from_zk("delete", budget, e)),
            Ok(Err(_)) | Err(_) => sent = true,
        }
        if session.is_dead() {
            return Ok(false);
        }
        if !pause_for_retry(&mut pause, deadline).await {
            return Err(Error::Timeout {
                operation: "delete",
                after: budget,
            });
        }
    }
}

/// Deletes `node` while `is_ours(data, stat)` holds, checking again, after a
/// `sync`, after every failure of unknown outcome: a versioned delete
/// retried blind could delete a successor's node (a new node of a shared
/// path has version 0 too). Retries until `budget` runs out or the session
/// ends. Returns whether it deleted the node (`Ok(false)`: it was not ours,
/// or already gone, or the session ended and took it along; a delete of
/// unknown outcome after which the node is no longer ours counts as done).
pub(crate) async fn delete_if_ours(
    session: &Session,
    node: &str,
    is_ours: impl Fn(&[u8], &Stat) -> bool,
    timeout: Duration,
    budget: Duration,
) -> Result<bool> {
    use crate::error::{session_ended, unknown};
    let deadline = Instant::now().checked_add(budget);
    let mut pause = FIRST_PAUSE;
    let mut first = true;
    let mut sent_delete = false;
    loop {
        if !first {
            if session.is_dead() {
                return Ok(false);
            }
            if !pause_for_retry(&mut pause, deadline).await {
                return Err(Error::Timeout {
                    operation: "delete",
                    after: budget,
                });
            }
            // The server we ask must have seen our earlier delete, if it
            // reached the leader.
            match with_timeout("sync", timeout, session.client.sync(node)).await {
                Ok(Ok(())) | Ok(Err(ZkError::NoNode)) => {}
                Ok(Err(e)) if session_ended(&e) => return Ok(false),
                _ => continue,
            }
        }
        first = false;
        let (data, stat) = match with_timeout("get", timeout, session.client.get_data(node)).await {
            Ok(Ok(found)) => found,
            Ok(Err(ZkError::NoNode)) => return Ok(sent_delete),
            Ok(Err(e)) if session_ended(&e) => return Ok(false),
            Ok(Err(e)) if unknown(&e) => continue,
            Err(_) => continue,
            Ok(Err(e)) => return Err(from_zk("get", timeout, e)),
        };
        if !is_ours(&data, &stat) {
            return Ok(sent_delete);
        }
        sent_delete = true;
        let deleted = with_timeout(
            "delete",
            timeout,
            session.client.delete(node, Some(stat.version)),
        )
        .await;
        match deleted {
            Ok(Ok(())) => return Ok(true),
            // Changed or gone meanwhile: look again.
            Ok(Err(ZkError::NoNode | ZkError::BadVersion)) => sent_delete = false,
            Ok(Err(e)) if session_ended(&e) => return Ok(false),
            Ok(Err(e)) if unknown(&e) => {}
            Err(_) => {}
            Ok(Err(e)) => return Err(from_zk("delete", timeout, e)),
        }
    }
}

/// How a node at a path that others may use too (the unfair node) is
/// known to be ours, besides its owner session.
pub(crate) enum Mark {
    /// It holds our data (the unfair node's owner id).
    Data(Vec<u8>),
    /// It has the `czxid` of the node we created.
    Czxid(i64),
}

/// Withdraws a node at a path that others may use too: deletes `node`
/// only while it is ours ([`Mark`], and our session), retrying for as long
/// as the session may live (a node left behind would hold the lock until
/// the session ends).
pub(crate) struct WithdrawIfOurs {
    pub(crate) session: Arc<Session>,
    pub(crate) node: String,
    pub(crate) mark: Mark,
    pub(crate) timeout: Duration,
}

#[async_trait]
impl Cleanup for WithdrawIfOurs {
    async fn clean_up(&self) -> Result<()> {
        let owner = self.session.id;
        let is_ours = |data: &[u8], stat: &Stat| {
            stat.ephemeral_owner == owner
                && match &self.mark {
                    Mark::Data(ours) => data == ours.as_slice(),
                    Mark::Czxid(czxid) => stat.czxid == *czxid,
                }
        };
        delete_if_ours(
            &self.session,
            &self.node,
            is_ours,
            self.timeout,
            WHILE_SESSION_LIVES,
        )
        .await?;
        Ok(())
    }
}

/// ACLs for nodes we create: creator-only when authenticated, else open.
pub(crate) fn acls(authenticated: bool) -> Acls<'static> {
    if authenticated {
        Acls::creator_all()
    } else {
        Acls::anyone_all()
    }
}

/// Creates every missing ancestor of `path` (not `path` itself) as a
/// container node.
pub(crate) async fn make_parents(
    session: &Session,
    path: &str,
    authenticated: bool,
    timeout: Duration,
) -> Result<()> {
    let Some((parent, _)) = path.rsplit_once('/') else {
        return Ok(());
    };
    if parent.is_empty() {
        return Ok(());
    }
    let options = CreateMode::Container.with_acls(acls(authenticated));
    match with_timeout(
        "create parents",
        timeout,
        session.client.mkdir(parent, &options),
    )
    .await?
    {
        Ok(()) => Ok(()),
        Err(ZkError::NoChildrenForEphemerals) => Err(Error::Conflict {
            what: format!("zookeeper node above {path:?}"),
            expected: "persistent or container parent (an ephemeral node is in the way)",
        }),
        Err(e) => Err(from_zk("create parents", timeout, e)),
    }
}

/// The czxid of a created node as a fencing token.
pub(crate) fn token(czxid: i64) -> Result<u64> {
    u64::try_from(czxid).map_err(|_| Error::server("zookeeper", "negative czxid"))
}
/// Deletes, in the background, every node of `session` with the prefix of
/// `node` (a queue node, `dir/_c_<uuid>-<name><seq10>`), retrying for as
/// long as the session lives.
pub(crate) fn sweep_in_background(session: Arc<Session>, node: &str, timeout: Duration) {
    let Some((dir, name)) = node.rsplit_once('/') else {
        return;
    };
    let Some(prefix) = name.get(..name.len().saturating_sub(10)) else {
        return;
    };
    let (dir, prefix) = (dir.to_owned(), prefix.to_owned());
    tokio::spawn(async move {
        while !session.is_dead() {
            match find_ours(&session, &dir, &prefix, timeout).await {
                Ok(nodes) => {
                    for (node, _) in nodes {
                        let _ = delete_retrying(&session, &node, None, WHILE_SESSION_LIVES).await;
                    }
                    return;
                }
                Err(Triage::Retry) => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(_) => return,
            }
        }
    });
}

/// Our queue nodes in `dir` (prefix and session), lowest first, after a
/// `sync` so that a create of ours that reached the leader is seen.
pub(crate) async fn find_ours(
    session: &Session,
    dir: &str,
    prefix: &str,
    timeout: Duration,
) -> std::result::Result<Vec<(String, i64)>, Triage> {
    let found = find_prefixed(session, dir, prefix, timeout).await?;
    Ok(found
        .into_iter()
        .filter(|(_, _, in_session)| *in_session)
        .map(|(node, czxid, _)| (node, czxid))
        .collect())
}

/// Every node with `prefix` in `dir`, lowest first, as (path, `czxid`,
/// whether `session` owns it), after a `sync` so that a create of ours
/// that reached the leader is seen.
pub(crate) async fn find_prefixed(
    session: &Session,
    dir: &str,
    prefix: &str,
    timeout: Duration,
) -> std::result::Result<Vec<(String, i64, bool)>, Triage> {
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
            let seq = child
                .strip_prefix(prefix)
                .and_then(|digits| sequence_digits(digits).ok().flatten())
                .unwrap_or(u64::MAX);
            ours.push((seq, node, stat.czxid, stat.ephemeral_owner == session.id));
        }
    }
    ours.sort();
    Ok(ours.into_iter().map(|(_, n, c, s)| (n, c, s)).collect())
}
