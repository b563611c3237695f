//! The fair mutex (ephemeral sequential queue, each waiter watching only its
//! predecessor) and the unfair mutex (one ephemeral node, losers race again
//! when it goes).

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::{Error, GuardParts, LeaseSignal, Lock, LockGuard, Name, Result, Wait};
use tokio::time::Instant;
use zookeeper_client::{CreateMode, Error as ZkError, OneshotWatcher};

use crate::error::{map, session_ended};
use crate::lease::{self, ZkLease};
use crate::node::{acls, delete_retrying, make_parents, op, sorted_queue, token};
use crate::provider::Shared;
use crate::session::Session;

/// The unfair lock's node under the lock's directory.
pub(crate) const UNFAIR_NODE: &str = "_unfair_lock";

/// A lease just won: our node in our session.
pub(crate) struct Won {
    pub(crate) session: Arc<Session>,
    pub(crate) node: String,
    pub(crate) czxid: i64,
}

/// How to find and delete a node we may have created, when an acquisition is
/// cancelled, times out or fails.
#[derive(Clone)]
enum Ours {
    /// A queue node: `dir/prefix…`, found by its prefix if its name is not
    /// known yet.
    Queued { dir: String, prefix: String },
    /// The unfair node: ours if its data is our owner id.
    Owned { node: String, owner: Vec<u8> },
}

/// Deletes our node when an acquisition ends without the lock (cancelled,
/// timed out, failed), unless disarmed. One per acquisition: a cleanup that
/// looks for our node by prefix or owner id must not run while the same
/// acquisition may still create it.
struct Pending {
    session: Option<Arc<Session>>,
    ours: Ours,
    node: Option<String>,
    timeout: Duration,
}

impl Pending {
    fn new(ours: Ours, timeout: Duration) -> Self {
        Pending {
            session: None,
            ours,
            node: None,
            timeout,
        }
    }

    /// About to create our node in `session`.
    fn arm(&mut self, session: &Arc<Session>) {
        self.session = Some(Arc::clone(session));
        self.node = None;
    }

    fn disarm(&mut self) {
        self.session = None;
    }

    /// Deletes now (for timeouts and `try_lock`), so the caller returns with
    /// nothing left behind.
    async fn cleanup(mut self) {
        if let Some(session) = self.session.take() {
            delete_ours(&session, &self.ours, self.node.take(), self.timeout).await;
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            let (ours, node, timeout) = (self.ours.clone(), self.node.take(), self.timeout);
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move { delete_ours(&session, &ours, node, timeout).await });
            }
        }
    }
}

async fn delete_ours(session: &Session, ours: &Ours, node: Option<String>, timeout: Duration) {
    // Retry for as long as the session may live: a node left behind would
    // stay (and block the queue) until the session ends.
    let budget = session.timeout() * 2;
    let deadline = Instant::now() + budget;
    match ours {
        Ours::Queued { dir, prefix } => {
            let mut node = node;
            while node.is_none() && Instant::now() < deadline && !session.is_dead() {
                match find_queued(session, dir, prefix, timeout).await {
                    Ok(found) => {
                        node = Some(found.map(|(n, _)| n).unwrap_or_default());
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
            if let Some(node) = node.filter(|n| !n.is_empty()) {
                let _ = delete_retrying(session, &node, None, budget).await;
            }
        }
        Ours::Owned { node, owner } => {
            while Instant::now() < deadline && !session.is_dead() {
                match op(timeout, "get", session.client.get_data(node)).await {
                    Ok(Ok((data, stat))) => {
                        if &data == owner && stat.ephemeral_owner == session.id {
                            let _ =
                                delete_retrying(session, node, Some(stat.version), budget).await;
                        }
                        return;
                    }
                    Ok(Err(ZkError::ConnectionLoss)) | Err(_) => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Ok(Err(_)) => return,
                }
            }
        }
    }
}

/// Our queue node in `dir`, by prefix, if this session created it.
async fn find_queued(
    session: &Session,
    dir: &str,
    prefix: &str,
    timeout: Duration,
) -> Result<Option<(String, i64)>> {
    let children = match op(timeout, "list", session.client.list_children(dir)).await? {
        Ok(c) => c,
        Err(ZkError::NoNode) => return Ok(None),
        Err(e) => return Err(map("list", timeout, e)),
    };
    for child in children.iter().filter(|c| c.starts_with(prefix)) {
        let node = format!("{dir}/{child}");
        if let Ok(Some(stat)) = op(timeout, "stat", session.client.check_stat(&node)).await? {
            if stat.ephemeral_owner == session.id {
                return Ok(Some((node, stat.czxid)));
            }
        }
    }
    Ok(None)
}

fn conflict(dir: &str) -> Error {
    Error::Conflict {
        what: format!("zookeeper node {dir:?}"),
        expected: "lock directory (it is ephemeral, so it cannot hold lock nodes)",
    }
}

fn past(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}

/// Waits a moment after a connection loss, unless that passes the deadline.
async fn backoff(deadline: Option<Instant>) -> bool {
    let until = Instant::now() + Duration::from_millis(50);
    if deadline.is_some_and(|d| d <= until) {
        return false;
    }
    tokio::time::sleep_until(until).await;
    true
}

/// Waits for a watch to fire; `false` when the deadline came first.
async fn woken(shared: &Shared, watcher: OneshotWatcher, deadline: Option<Instant>) -> bool {
    match deadline {
        Some(d) => {
            if tokio::time::timeout_at(d, watcher.changed()).await.is_err() {
                return false;
            }
        }
        None => {
            watcher.changed().await;
        }
    }
    shared.stats.watch_events.fetch_add(1, Ordering::Relaxed);
    true
}

/// Joins the queue of `marker` nodes in `dir` and waits for the head of it.
pub(crate) async fn enter_queue(
    shared: &Shared,
    dir: &str,
    marker: &str,
    data: &[u8],
    wait: Wait,
) -> Result<Option<Won>> {
    let deadline = wait.deadline();
    let timeout = shared.timeout;
    let prefix = format!("_c_{}-{marker}-", uuid::Uuid::new_v4());
    let create = CreateMode::EphemeralSequential.with_acls(acls(shared.authenticated));
    let path_prefix = format!("{dir}/{prefix}");
    let ours = Ours::Queued {
        dir: dir.to_owned(),
        prefix: prefix.clone(),
    };
    let mut pending = Pending::new(ours, timeout);
    'session: loop {
        let session = shared.sessions.get().await?;
        pending.arm(&session);
        // Pipelined: both requests leave now, and ZooKeeper answers a
        // session's requests in order, so the listing includes our node.
        let created = session.client.create(&path_prefix, data, &create);
        let listed = session.client.list_children(dir);
        let (created, listed) =
            tokio::time::timeout(timeout, async { futures::join!(created, listed) })
                .await
                .map_err(|_| Error::Timeout {
                    operation: "create",
                    after: timeout,
                })?;
        let (node, czxid, mut children) = match created {
            Ok((stat, seq)) => (format!("{path_prefix}{seq}"), stat.czxid, listed.ok()),
            Err(ZkError::NoNode) => {
                pending.disarm();
                make_parents(&session, &path_prefix, shared.authenticated, timeout).await?;
                continue 'session;
            }
            Err(ZkError::NoChildrenForEphemerals) => {
                pending.disarm();
                return Err(conflict(dir));
            }
            Err(ZkError::ConnectionLoss) => {
                // The create may have happened: find our node by its prefix
                // instead of making a second one.
                match find_queued(&session, dir, &prefix, timeout).await {
                    Ok(Some((node, czxid))) => (node, czxid, None),
                    _ if backoff(deadline).await => continue 'session,
                    _ => {
                        pending.cleanup().await;
                        return Ok(None);
                    }
                }
            }
            Err(e) if session_ended(&e) => {
                pending.disarm();
                shared.sessions.ended(&session).await;
                continue 'session;
            }
            Err(e) => {
                pending.disarm();
                return Err(map("create", timeout, e));
            }
        };
        pending.node = Some(node.clone());
        let own_name = node.rsplit('/').next().unwrap_or_default().to_owned();
        loop {
            let names = match children.take() {
                Some(names) => names,
                None => match op(timeout, "list", session.client.list_children(dir)).await? {
                    Ok(names) => names,
                    Err(e) if session_ended(&e) => {
                        pending.disarm();
                        shared.sessions.ended(&session).await;
                        continue 'session;
                    }
                    Err(ZkError::ConnectionLoss) if backoff(deadline).await => continue,
                    Err(ZkError::ConnectionLoss) => {
                        pending.cleanup().await;
                        return Ok(None);
                    }
                    Err(e) => return Err(map("list", timeout, e)),
                },
            };
            // Only the predecessor's name outlives this block: a waiter must
            // not keep the whole listing while it waits (O(n²) memory).
            let (position, predecessor) = {
                let queue = sorted_queue(names, marker);
                let position = queue.iter().position(|(_, n)| *n == own_name);
                let predecessor = position
                    .and_then(|p| p.checked_sub(1))
                    .map(|p| format!("{dir}/{}", queue[p].1));
                (position, predecessor)
            };
            let Some(position) = position else {
                // Our node is gone (deleted by someone, or its session
                // ended): queue again.
                pending.disarm();
                if past(deadline) {
                    return Ok(None);
                }
                continue 'session;
            };
            if position == 0 {
                pending.disarm();
                return Ok(Some(Won {
                    session,
                    node,
                    czxid,
                }));
            }
            if wait == Wait::No || past(deadline) {
                pending.cleanup().await;
                return Ok(None);
            }
            let Some(predecessor) = predecessor else {
                continue;
            };
            match op(
                timeout,
                "watch",
                session.client.check_and_watch_stat(&predecessor),
            )
            .await?
            {
                Ok((None, _)) => {}
                Ok((Some(_), watcher)) => {
                    if !woken(shared, watcher, deadline).await {
                        pending.cleanup().await;
                        return Ok(None);
                    }
                }
                Err(e) if session_ended(&e) => {
                    pending.disarm();
                    shared.sessions.ended(&session).await;
                    continue 'session;
                }
                Err(ZkError::ConnectionLoss) if backoff(deadline).await => {}
                Err(ZkError::ConnectionLoss) => {
                    pending.cleanup().await;
                    return Ok(None);
                }
                Err(e) => return Err(map("watch", timeout, e)),
            }
        }
    }
}

/// Races for the one ephemeral node of an unfair lock.
pub(crate) async fn take_unfair(shared: &Shared, dir: &str, wait: Wait) -> Result<Option<Won>> {
    let deadline = wait.deadline();
    let timeout = shared.timeout;
    let node = format!("{dir}/{UNFAIR_NODE}");
    let owner = uuid::Uuid::new_v4().simple().to_string().into_bytes();
    let create = CreateMode::Ephemeral.with_acls(acls(shared.authenticated));
    let ours = Ours::Owned {
        node: node.clone(),
        owner: owner.clone(),
    };
    let mut pending = Pending::new(ours, timeout);
    loop {
        let session = shared.sessions.get().await?;
        pending.arm(&session);
        match op(
            timeout,
            "create",
            session.client.create(&node, &owner, &create),
        )
        .await?
        {
            Ok((stat, _)) => {
                pending.disarm();
                return Ok(Some(Won {
                    session,
                    node,
                    czxid: stat.czxid,
                }));
            }
            Err(ZkError::NodeExists) => {
                pending.disarm();
                if wait == Wait::No || past(deadline) {
                    return Ok(None);
                }
                match op(timeout, "watch", session.client.check_and_watch_stat(&node)).await? {
                    Ok((None, _)) => {}
                    Ok((Some(stat), _)) if stat.ephemeral_owner == 0 => {
                        return Err(Error::Conflict {
                            what: format!("zookeeper node {node:?}"),
                            expected: "lock node (it is persistent, so it would never be released)",
                        });
                    }
                    Ok((Some(_), watcher)) => {
                        if !woken(shared, watcher, deadline).await {
                            return Ok(None);
                        }
                    }
                    Err(e) if session_ended(&e) => shared.sessions.ended(&session).await,
                    Err(ZkError::ConnectionLoss) if backoff(deadline).await => {}
                    Err(ZkError::ConnectionLoss) => return Ok(None),
                    Err(e) => return Err(map("watch", timeout, e)),
                }
            }
            Err(ZkError::NoNode) => {
                pending.disarm();
                make_parents(&session, &node, shared.authenticated, timeout).await?;
            }
            Err(ZkError::NoChildrenForEphemerals) => {
                pending.disarm();
                return Err(conflict(dir));
            }
            Err(ZkError::ConnectionLoss) => {
                // Ours if the node carries our owner id in our session.
                if let Ok(Ok((data, stat))) =
                    op(timeout, "get", session.client.get_data(&node)).await
                {
                    if data == owner && stat.ephemeral_owner == session.id {
                        pending.disarm();
                        return Ok(Some(Won {
                            session,
                            node,
                            czxid: stat.czxid,
                        }));
                    }
                }
                if !backoff(deadline).await {
                    pending.cleanup().await;
                    return Ok(None);
                }
            }
            Err(e) if session_ended(&e) => {
                pending.disarm();
                shared.sessions.ended(&session).await;
            }
            Err(e) => {
                pending.disarm();
                return Err(map("create", timeout, e));
            }
        }
    }
}

/// Turns a won lease into a guard and starts watching it.
pub(crate) fn guard(shared: &Shared, name: &Name, won: Won, unique: bool) -> Result<LockGuard> {
    let signal = LeaseSignal::new();
    let backend = Arc::new(ZkLease {
        session: Arc::clone(&won.session),
        name: name.clone(),
        node: won.node.clone(),
        czxid: won.czxid,
        unique,
        timeout: shared.timeout,
    });
    let parts = GuardParts {
        name: name.clone(),
        fencing_token: token(won.czxid)?,
        signal: signal.clone(),
        lease: None,
        acquired_at: Instant::now(),
    };
    let guard = LockGuard::new(parts, backend)?;
    lease::watch(won.session, won.node, signal);
    Ok(guard)
}

/// A ZooKeeper mutex, fair or unfair.
pub(crate) struct ZkMutex {
    pub(crate) shared: Arc<Shared>,
    pub(crate) name: Name,
    pub(crate) dir: String,
    pub(crate) fair: bool,
}

impl fmt::Debug for ZkMutex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkMutex")
            .field("path", &self.dir)
            .field("fair", &self.fair)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Lock for ZkMutex {
    fn name(&self) -> &Name {
        &self.name
    }

    async fn acquire(&self, wait: Wait) -> Result<Option<LockGuard>> {
        tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let won = if self.fair {
            enter_queue(&self.shared, &self.dir, "lock", &[], wait).await?
        } else {
            take_unfair(&self.shared, &self.dir, wait).await?
        };
        won.map(|won| guard(&self.shared, &self.name, won, self.fair))
            .transpose()
    }
}
