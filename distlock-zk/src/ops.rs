//! Operations: the owner identity in our nodes, `inspect` and
//! `force_release`.
//!
//! What our nodes carry (see the crate docs, "Inspect and force-release"):
//!
//! * lock nodes (fair mutex, read-write lock, the semaphore's internal lock):
//!   data `distlock owner=<identity>`;
//! * the unfair lock's node: `distlock owner=<identity> id=<uuid>` (the id
//!   tells our acquisition's node from another's of the same identity);
//! * semaphore lease nodes: `distlock permits=<N> owner=<identity>` (older
//!   distlock wrote `distlock permits=<N>`; both parse);
//! * election nodes: the data stays the candidate id (Curator's
//!   `LeaderLatch` reads it as the participant id), and the identity goes
//!   into the node's name instead: `_c_<uuid>-o=<identity, %-escaped>-latch-<seq>`.
//!
//! Data that does not begin with the word `distlock` is a foreign node's.
//!
//! `inspect` costs three requests in two round trips: a `sync` with one
//! multi-read of the directory's data and its children (of `locks` and
//! `leases` for a semaphore) pipelined behind it, and one
//! multi-read of the data and stat of every child (none when there is no
//! child; one per [`READ_BATCH`] children beyond that). The mutex and the
//! fair mutex are one lock (`kinds`): either kind reads the unfair node with
//! the directory and the fair queue's nodes, and shows the older of the
//! unfair node and the queue's head as the holder (the one that holds, or
//! holds once its check is done), the other as a waiter; `force_release` of
//! either evicts that holder.

use std::time::{Duration, UNIX_EPOCH};

use distlock_core::backend::with_timeout;
use distlock_core::inspect::{HoldRole, Holder, LeaseLeft, PrimitiveKind, Snapshot, Waiters};
use distlock_core::{Error, ForceReleased, LeaderInfo, Name, Result};
use zookeeper_client::{Error as ZkError, MultiReadResult, Stat};

use crate::context::Context;
use crate::error::from_zk;
use crate::layout::{
    asked, latch_owner, parse, rw_queue, sorted_queue, unfair_request, LEASES, LOCKS, REVOKE,
    UNFAIR_NODE,
};
use crate::node::{acls, CONTAINER_OWNER};

/// Children read per multi-read.
pub(crate) const READ_BATCH: usize = 512;

/// What is known of a foreign node: its kind and its data if printable.
fn foreign(what: &str, data: &[u8]) -> String {
    match std::str::from_utf8(data) {
        Ok("") => format!("{what}, no data"),
        Ok(s) if s.len() <= 256 && !s.chars().any(char::is_control) => {
            format!("{what}, data {s:?}")
        }
        _ => format!("{what}, {} bytes of data", data.len()),
    }
}

/// One child read: its path, data and stat.
struct Node {
    name: String,
    path: String,
    data: Vec<u8>,
    stat: Stat,
}

/// One found hold: the node to delete (or ask), and how it shows.
struct Hold {
    path: String,
    holder: Holder,
    ask: Ask,
}

/// How `request_release` asks a hold.
enum Ask {
    /// Write this data on the node, at this version: our nodes' data again
    /// at the version read (inspect still reads the owner; the data version
    /// going above 0 is the mark), `__REVOKE__` on a foreign lock or lease
    /// node (what Curator's `Revoker` writes and a revocable Curator holder
    /// listens for), a foreign election node's data again (a `LeaderLatch`
    /// reads its participant id there). Only on queue nodes: their path is
    /// never created again, so the write lands on the hold read or nowhere.
    Write(Vec<u8>, Option<i32>),
    /// Create this node ([`unfair_request`] of the unfair hold's `czxid`),
    /// then look at the unfair node: the hold read is asked if it is still
    /// there (same `czxid`) once the request exists.
    Node(String),
}

/// A name's state as read, with the paths of its holds.
struct State {
    snapshot: Snapshot,
    holds: Vec<Hold>,
}

fn holder(role: HoldRole, node: &Node, owner: Option<String>, foreign: Option<String>) -> Hold {
    let stat = &node.stat;
    let ask = if node.name == UNFAIR_NODE {
        let dir = node.path.rsplit_once('/').map_or("", |(dir, _)| dir);
        Ask::Node(format!("{dir}/{}", unfair_request(stat.czxid)))
    } else if foreign.is_none() || role == HoldRole::Leader {
        Ask::Write(node.data.clone(), Some(stat.version))
    } else {
        Ask::Write(REVOKE.to_vec(), None)
    };
    Hold {
        path: node.path.clone(),
        ask,
        holder: Holder {
            role,
            owner,
            foreign,
            fencing_token: u64::try_from(stat.czxid).ok(),
            acquired_at: u64::try_from(stat.ctime)
                .ok()
                .map(|ms| UNIX_EPOCH + Duration::from_millis(ms)),
            lease: match stat.ephemeral_owner {
                0 => LeaseLeft::NoExpiry,
                session_id => LeaseLeft::Session { session_id },
            },
            release_requested: asked(&node.data, stat.version),
        },
    }
}

/// The owner and foreign description of a lock node (`what` names its
/// kind for a foreign one).
fn who(node: &Node, what: &str) -> (Option<String>, Option<String>) {
    match parse(&node.data) {
        Some(ours) => (ours.owner, None),
        None => (
            None,
            Some(foreign(&format!("{what} node {}", node.name), &node.data)),
        ),
    }
}

/// Waiters from queue nodes, first in line first.
fn waiters<'a>(
    nodes: impl Iterator<Item = &'a Node>,
    owner: impl Fn(&Node) -> Option<String>,
) -> Waiters {
    let mut w = Waiters::default();
    for node in nodes {
        w.count += 1;
        w.owners.extend(owner(node));
    }
    w
}

fn conflict(path: &str, expected: &'static str) -> Error {
    Error::Conflict {
        what: format!("zookeeper node {path:?}"),
        expected,
    }
}

/// Checks the primitive's directory: absent, or an empty persistent or
/// container node (an id counter holds 8 bytes; an ephemeral node cannot
/// hold lock nodes).
fn check_dir(dir: &str, found: Option<&(Vec<u8>, Stat)>) -> Result<()> {
    let Some((data, stat)) = found else {
        return Ok(());
    };
    if stat.ephemeral_owner != 0 && stat.ephemeral_owner != CONTAINER_OWNER {
        return Err(conflict(dir, "lock directory (it is an ephemeral node)"));
    }
    if !data.is_empty() {
        return Err(conflict(
            dir,
            "lock directory without data (it holds data: an id counter or another client's node)",
        ));
    }
    Ok(())
}

fn zk(timeout: Duration) -> impl Fn(ZkError) -> Error {
    move |e| from_zk("inspect", timeout, e)
}

/// Round 1: the directory's data and, for each of `lists`, its children
/// (`None`: no such node); for each of `reads`, its data and stat.
async fn first_read(
    ctx: &Context,
    dir: &str,
    lists: &[String],
    reads: &[String],
) -> Result<(Vec<Option<Vec<String>>>, Vec<Option<(Vec<u8>, Stat)>>)> {
    let timeout = ctx.timeout;
    let session = ctx.sessions.get().await?;
    let mut reader = session.client.new_multi_reader();
    reader.add_get_data(dir).map_err(zk(timeout))?;
    for path in lists {
        reader.add_get_children(path).map_err(zk(timeout))?;
    }
    for path in reads {
        reader.add_get_data(path).map_err(zk(timeout))?;
    }
    // A `sync` first, pipelined before the reads (a session's requests are
    // answered in order): a follower answers them only once it has every
    // write the leader had committed when the `sync` reached it, so an
    // operator's read sees a hold whose acquisition returned to another
    // client through another server (without it, a lagging follower showed
    // no holder and `force_release` evicted nobody).
    let synced = session.client.sync(dir);
    let (synced, results) = with_timeout(
        "inspect",
        timeout,
        futures::future::join(synced, reader.commit()),
    )
    .await?;
    match synced {
        Ok(()) | Err(ZkError::NoNode) => {}
        Err(e) => return Err(zk(timeout)(e)),
    }
    let results = results.map_err(zk(timeout))?;
    let mut results = results.into_iter();
    let data = |results: &mut std::vec::IntoIter<MultiReadResult>| match results.next() {
        Some(MultiReadResult::Data { data, stat }) => Ok(Some((data, stat))),
        Some(MultiReadResult::Error {
            err: ZkError::NoNode,
        }) => Ok(None),
        Some(MultiReadResult::Error { err }) => Err(zk(timeout)(err)),
        _ => Err(Error::server("zookeeper", "unexpected multi-read reply")),
    };
    let dir_data = data(&mut results)?;
    check_dir(dir, dir_data.as_ref())?;
    let mut children = Vec::with_capacity(lists.len());
    for _ in lists {
        children.push(match results.next() {
            Some(MultiReadResult::Children { children }) => Some(children),
            Some(MultiReadResult::Error {
                err: ZkError::NoNode,
            }) => None,
            Some(MultiReadResult::Error { err }) => return Err(zk(timeout)(err)),
            _ => return Err(Error::server("zookeeper", "unexpected multi-read reply")),
        });
    }
    let mut read = Vec::with_capacity(reads.len());
    for _ in reads {
        read.push(data(&mut results)?);
    }
    Ok((children, read))
}

/// Round 2: the data and stat of `names` in `parent`, in one multi-read per
/// [`READ_BATCH`]; children gone meanwhile are left out.
async fn read_nodes(ctx: &Context, parent: &str, names: Vec<String>) -> Result<Vec<Node>> {
    let timeout = ctx.timeout;
    let mut nodes = Vec::with_capacity(names.len());
    if names.is_empty() {
        return Ok(nodes);
    }
    let session = ctx.sessions.get().await?;
    for batch in names.chunks(READ_BATCH) {
        let mut reader = session.client.new_multi_reader();
        let paths: Vec<String> = batch.iter().map(|n| format!("{parent}/{n}")).collect();
        for path in &paths {
            reader.add_get_data(path).map_err(zk(timeout))?;
        }
        let results = with_timeout("inspect", timeout, reader.commit())
            .await?
            .map_err(zk(timeout))?;
        for ((name, path), result) in batch.iter().zip(paths).zip(results) {
            match result {
                MultiReadResult::Data { data, stat } => nodes.push(Node {
                    name: name.clone(),
                    path,
                    data,
                    stat,
                }),
                MultiReadResult::Error {
                    err: ZkError::NoNode,
                } => {}
                MultiReadResult::Error { err } => return Err(zk(timeout)(err)),
                _ => return Err(Error::server("zookeeper", "unexpected multi-read reply")),
            }
        }
    }
    Ok(nodes)
}

/// Reads `name`'s nodes as the primitive `kind` in `dir`.
async fn read(ctx: &Context, name: &Name, dir: &str, kind: PrimitiveKind) -> Result<State> {
    let mut snapshot = Snapshot::empty(name.clone(), kind, "zookeeper");
    let mut holds = Vec::new();
    let wrapped = |_| {
        conflict(
            dir,
            "lock directory whose sequence counter has not passed 2^31",
        )
    };
    match kind {
        PrimitiveKind::Mutex | PrimitiveKind::FairMutex => {
            // One lock (`kinds`): the older of the unfair node and the fair
            // queue's head holds, whichever kind is asked about; the other
            // waits.
            let unfair = format!("{dir}/{UNFAIR_NODE}");
            let (mut lists, mut read) =
                first_read(ctx, dir, &[dir.to_owned()], std::slice::from_ref(&unfair)).await?;
            let children = lists.pop().flatten().unwrap_or_default();
            let requests: std::collections::HashSet<String> = children
                .iter()
                .filter(|c| c.starts_with(UNFAIR_NODE) && c.len() > UNFAIR_NODE.len())
                .cloned()
                .collect();
            let queue = sorted_queue(children, "lock").map_err(wrapped)?;
            let mut nodes =
                read_nodes(ctx, dir, queue.into_iter().map(|(_, n)| n).collect()).await?;
            if let Some((data, stat)) = read.pop().flatten() {
                if stat.ephemeral_owner == 0 {
                    return Err(conflict(
                        &unfair,
                        "lock node (it is persistent, so it would never be released)",
                    ));
                }
                let node = Node {
                    name: UNFAIR_NODE.to_owned(),
                    path: unfair,
                    data,
                    stat,
                };
                // Ahead of every fair node younger than it (the fair nodes'
                // sequence order is their czxid order).
                let at = nodes
                    .iter()
                    .position(|n| n.stat.czxid > node.stat.czxid)
                    .unwrap_or(nodes.len());
                nodes.insert(at, node);
            }
            let mut nodes = nodes.iter();
            if let Some(head) = nodes.next() {
                let what = if head.name == UNFAIR_NODE {
                    "unfair lock"
                } else {
                    "lock"
                };
                let (owner, foreign) = who(head, what);
                let mut hold = holder(HoldRole::Exclusive, head, owner, foreign);
                if head.name == UNFAIR_NODE {
                    hold.holder.release_requested |=
                        requests.contains(&unfair_request(head.stat.czxid));
                }
                holds.push(hold);
            }
            snapshot.waiters = waiters(nodes, |n| parse(&n.data).and_then(|o| o.owner));
        }
        PrimitiveKind::Election => {
            let (mut lists, _) = first_read(ctx, dir, &[dir.to_owned()], &[]).await?;
            let children = lists.pop().flatten().unwrap_or_default();
            let queue = sorted_queue(children, "latch").map_err(wrapped)?;
            let nodes = read_nodes(ctx, dir, queue.into_iter().map(|(_, n)| n).collect()).await?;
            let mut nodes = nodes.iter();
            if let Some(head) = nodes.next() {
                let id = String::from_utf8_lossy(&head.data).into_owned();
                let owner = latch_owner(&head.name);
                let foreign = owner
                    .is_none()
                    .then(|| foreign(&format!("latch node {}", head.name), &head.data));
                let hold = holder(HoldRole::Leader, head, owner, foreign);
                snapshot.leader = Some(LeaderInfo {
                    id,
                    term: hold.holder.fencing_token.unwrap_or_default(),
                });
                holds.push(hold);
            }
            snapshot.waiters = waiters(nodes, |n| latch_owner(&n.name));
        }
        PrimitiveKind::ReadWrite => {
            let (mut lists, _) = first_read(ctx, dir, &[dir.to_owned()], &[]).await?;
            let children = lists.pop().flatten().unwrap_or_default();
            let queue = rw_queue(children).map_err(wrapped)?;
            let writes: std::collections::HashSet<String> = queue
                .iter()
                .filter(|(_, w, _)| *w)
                .map(|(_, _, n)| n.clone())
                .collect();
            let nodes =
                read_nodes(ctx, dir, queue.into_iter().map(|(_, _, n)| n).collect()).await?;
            // Holding: the first node if it is a write, else every read
            // before the first write.
            let first_write = nodes.iter().position(|n| writes.contains(&n.name));
            let holding = match first_write {
                Some(0) => 1,
                Some(i) => i,
                None => nodes.len(),
            };
            for node in &nodes[..holding] {
                let write = writes.contains(&node.name);
                let (owner, foreign) = who(node, if write { "write lock" } else { "read lock" });
                let role = if write {
                    HoldRole::Write
                } else {
                    HoldRole::Read
                };
                holds.push(holder(role, node, owner, foreign));
            }
            snapshot.waiters = waiters(nodes[holding..].iter(), |n| {
                parse(&n.data).and_then(|o| o.owner)
            });
        }
        PrimitiveKind::Semaphore => {
            let locks = format!("{dir}/{}", LOCKS);
            let leases = format!("{dir}/{}", LEASES);
            let (mut lists, _) =
                first_read(ctx, dir, &[locks.clone(), leases.clone()], &[]).await?;
            let lease_names = lists.pop().flatten().unwrap_or_default();
            let lock_names = lists.pop().flatten().unwrap_or_default();
            let queue = sorted_queue(lock_names, "lock").map_err(wrapped)?;
            let queued = queue.len();
            let mut names: Vec<String> = queue.into_iter().map(|(_, n)| n).collect();
            names.extend(lease_names);
            // One multi-read for both directories: read_nodes takes one
            // parent, so read them as paths under `dir`.
            let names: Vec<String> = names
                .into_iter()
                .enumerate()
                .map(|(i, n)| {
                    let sub = if i < queued { LOCKS } else { LEASES };
                    format!("{sub}/{n}")
                })
                .collect();
            let nodes = read_nodes(ctx, dir, names).await?;
            let in_locks = format!("{}/", LOCKS);
            let (mut queue, mut leases): (Vec<Node>, Vec<Node>) = nodes
                .into_iter()
                .partition(|n| n.name.starts_with(&in_locks));
            for node in queue.iter_mut().chain(leases.iter_mut()) {
                if let Some((_, child)) = node.name.split_once('/') {
                    node.name = child.to_owned();
                }
            }
            // Every holder's lease node was created before any waiting one
            // (only the head of `locks` may have a lease node that does not
            // hold yet, and it is the newest): the first N hold.
            leases.sort_by_key(|n| n.stat.czxid);
            snapshot.permits = leases
                .iter()
                .find_map(|n| parse(&n.data).and_then(|o| o.permits));
            let holding = snapshot.permits.map_or(leases.len(), |p| {
                leases.len().min(usize::try_from(p).unwrap_or(usize::MAX))
            });
            for node in &leases[..holding] {
                let (owner, foreign) = who(node, "semaphore lease");
                holds.push(holder(HoldRole::Permit, node, owner, foreign));
            }
            snapshot.waiters = waiters(queue.iter(), |n| parse(&n.data).and_then(|o| o.owner));
        }
        _ => {
            return Err(Error::InvalidOptions(format!(
                "the ZooKeeper backend does not know the kind {kind}"
            )))
        }
    }
    snapshot.holders = holds.iter().map(|h| h.holder.clone()).collect();
    Ok(State { snapshot, holds })
}

/// `Provider::inspect`.
pub(crate) async fn inspect(
    ctx: &Context,
    name: &Name,
    dir: &str,
    kind: PrimitiveKind,
) -> Result<Snapshot> {
    Ok(read(ctx, name, dir, kind).await?.snapshot)
}

/// `Provider::force_release`: deletes every holding node (pipelined), so
/// that the watches of the waiters behind them fire as on a release, and
/// the holders' own node watches report their leases lost
/// (`LostReason::Deleted`).
pub(crate) async fn force_release(
    ctx: &Context,
    name: &Name,
    dir: &str,
    kind: PrimitiveKind,
) -> Result<ForceReleased> {
    let state = read(ctx, name, dir, kind).await?;
    let session = ctx.sessions.get().await?;
    let deleted = on_each_hold(ctx, "force release", &state.holds, |hold| {
        session.client.delete(&hold.path, None)
    })
    .await?;
    let mut evicted = 0;
    for (hold, outcome) in state.holds.iter().zip(deleted) {
        match outcome {
            Ok(()) => {
                evicted += 1;
                hold.log(name, kind, true);
            }
            // Released meanwhile: not evicted by us.
            Err(ZkError::NoNode) => {}
            Err(e) => return Err(from_zk("force release", ctx.timeout, e)),
        }
    }
    Ok(ForceReleased {
        evicted,
        fence: None,
    })
}

/// Sends `send` for every hold at once (each request goes out as its
/// future is made, before the first answer is awaited), within one
/// response timeout for them all; the outcomes in the order of `holds`.
async fn on_each_hold<T, F: std::future::Future<Output = std::result::Result<T, ZkError>>>(
    ctx: &Context,
    operation: &'static str,
    holds: &[Hold],
    send: impl FnMut(&Hold) -> F,
) -> Result<Vec<std::result::Result<T, ZkError>>> {
    let requests: Vec<F> = holds.iter().map(send).collect();
    with_timeout(operation, ctx.timeout, futures::future::join_all(requests)).await
}

impl Hold {
    /// Logs what an operator's call did to this hold: deleted its node
    /// (`evicted`, a warning) or asked it to release.
    fn log(&self, name: &Name, kind: PrimitiveKind, evicted: bool) {
        let owner = self.holder.owner.as_deref().unwrap_or("-");
        let foreign = self.holder.foreign.as_deref().unwrap_or("-");
        if evicted {
            tracing::warn!(name = %name, kind = %kind, node = %self.path, owner, foreign, "distlock force-release deleted a holder's node");
        } else {
            tracing::info!(name = %name, kind = %kind, node = %self.path, owner, foreign, "distlock asked a holder to release");
        }
    }
}

/// `Provider::request_release`: asks every holding node (pipelined; see
/// [`Ask`]) and returns the holders asked. A node deleted meanwhile
/// (`NoNode`) was released: not asked, not returned. A versioned write
/// that finds another version (`BadVersion`) found the node's data written
/// since the read: asked by someone else meanwhile, and returned. The
/// unfair hold's request node that exists already (`NodeExists`) was made
/// by someone else: asked, and returned; one made for a hold that is gone
/// by then is deleted again, and the hold not returned. The unfair hold's
/// request is then waited on until its holder takes it over or the hold
/// ends ([`until_taken_over`]; a hold that ends first is not returned).
/// Nothing is created on a name nobody holds: it is only read.
pub(crate) async fn request_release(
    ctx: &Context,
    name: &Name,
    dir: &str,
    kind: PrimitiveKind,
) -> Result<Vec<Holder>> {
    let state = read(ctx, name, dir, kind).await?;
    if state.holds.is_empty() {
        return Ok(Vec::new());
    }
    #[cfg(test)]
    tests::between_read_and_write().await;
    let session = ctx.sessions.get().await?;
    let ephemeral = zookeeper_client::CreateMode::Ephemeral.with_acls(acls(ctx.authenticated));
    // Every request is sent here, before the first answer is awaited.
    let requests = state.holds.iter().map(|hold| {
        let sent: futures::future::BoxFuture<'_, std::result::Result<Asked, ZkError>> =
            match &hold.ask {
                Ask::Write(data, version) => {
                    let write = session.client.set_data(&hold.path, data, *version);
                    Box::pin(async move {
                        match write.await {
                            Ok(_) | Err(ZkError::BadVersion) => Ok(Asked::Yes),
                            Err(ZkError::NoNode) => Ok(Asked::Gone),
                            Err(e) => Err(e),
                        }
                    })
                }
                Ask::Node(request) => {
                    // The look at the unfair node goes right behind the
                    // create on the same session, so it is answered after
                    // the request exists (or was refused).
                    let create = session.client.create(request, &ctx.owner_data, &ephemeral);
                    let look = session.client.check_stat(&hold.path);
                    let czxid = hold.holder.fencing_token;
                    Box::pin(async move {
                        let created = match create.await {
                            Ok(_) => true,
                            Err(ZkError::NodeExists) => false,
                            // No directory: the hold is gone.
                            Err(ZkError::NoNode) => return Ok(Asked::Gone),
                            Err(e) => return Err(e),
                        };
                        let held = look
                            .await?
                            .is_some_and(|stat| u64::try_from(stat.czxid).ok() == czxid);
                        Ok(match (held, created) {
                            (true, _) => Asked::Yes,
                            (false, true) => Asked::Stale(request.clone()),
                            (false, false) => Asked::Gone,
                        })
                    })
                }
            };
        sent
    });
    let requests: Vec<_> = requests.collect();
    let asking = with_timeout(
        "request release",
        ctx.timeout,
        futures::future::join_all(requests),
    )
    .await?;
    let mut asked = Vec::with_capacity(state.holds.len());
    for (hold, outcome) in state.holds.into_iter().zip(asking) {
        match outcome {
            Ok(Asked::Yes) => {
                if let Ask::Node(request) = &hold.ask {
                    if !until_taken_over(ctx, &session, &hold, request).await {
                        // The hold ended before its holder heard: nobody
                        // is left to ask.
                        continue;
                    }
                }
                hold.log(name, kind, false);
                asked.push(Holder {
                    release_requested: true,
                    ..hold.holder
                });
            }
            // Released meanwhile: nobody to ask.
            Ok(Asked::Gone) => {}
            Ok(Asked::Stale(request)) => {
                // Ours, for a hold that is gone: it would ask nobody. Ours
                // is ephemeral, so a delete that fails leaves it only until
                // our session ends.
                let delete = session.client.delete(&request, None);
                let _ = with_timeout("request release", ctx.timeout, delete).await;
            }
            Err(e) => return Err(from_zk("request release", ctx.timeout, e)),
        }
    }
    Ok(asked)
}

/// After the unfair hold `hold` was asked with the request node `request`:
/// waits, for at most one operation timeout, until its holder has taken
/// the request over (the node is in the holder's session, or gone: the
/// holder's release deletes it once heard) or the hold has ended. Until
/// then the request lives only as long as the node's maker's session (ours
/// or another asker's), which may end as soon as the call returns.
///
/// `false` when the hold ended first: the request node, if it is our
/// session's, is deleted at once rather than left until our session ends.
/// `true` otherwise, also when the wait runs out (a holder of an older
/// distlock never takes a request over; it can still hear the request at
/// its session check while the maker's session lives) or a read fails.
/// A foreign holder is not waited for.
///
/// One children watch on the directory per round: it fires at the
/// adoption (a delete and a create of the request node) and at the
/// holder's release (the unfair node's delete). The request node and the
/// unfair node are read behind it on the same session, so a change after
/// those reads fires it.
async fn until_taken_over(
    ctx: &Context,
    session: &crate::session::Session,
    hold: &Hold,
    request: &str,
) -> bool {
    let LeaseLeft::Session {
        session_id: holder, ..
    } = hold.holder.lease
    else {
        return true;
    };
    if hold.holder.foreign.is_some() {
        return true;
    }
    let Some((dir, _)) = hold.path.rsplit_once('/') else {
        return true;
    };
    let czxid = hold.holder.fencing_token;
    let start = tokio::time::Instant::now();
    loop {
        let left = ctx.timeout.saturating_sub(start.elapsed());
        // Sent in this order before any answer is awaited.
        let listed = session.client.list_and_watch_children(dir);
        let asked = session.client.check_stat(request);
        let held = session.client.check_stat(&hold.path);
        let Ok((listed, asked, held)) = with_timeout(
            "request release",
            left,
            futures::future::join3(listed, asked, held),
        )
        .await
        else {
            return true;
        };
        let (Ok(asked), Ok(held)) = (asked, held) else {
            return true;
        };
        let Some(stat) = asked else {
            // Deleted by the holder's release, which deletes it once heard.
            return true;
        };
        if stat.ephemeral_owner == holder {
            return true;
        }
        if held.is_none_or(|s| u64::try_from(s.czxid).ok() != czxid) {
            if stat.ephemeral_owner == session.id {
                let delete = session.client.delete(request, None);
                let _ = with_timeout("request release", ctx.timeout, delete).await;
            }
            return false;
        }
        let Ok((_, watcher)) = listed else {
            return true;
        };
        let left = ctx.timeout.saturating_sub(start.elapsed());
        if tokio::time::timeout(left, crate::wait::event_of(watcher))
            .await
            .is_err()
        {
            return true;
        }
    }
}

/// What asking one hold came to.
enum Asked {
    /// Asked (or asked already by someone else).
    Yes,
    /// The hold is gone: nobody was asked.
    Gone,
    /// The hold is gone, and this request node of ours names it.
    Stale(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{owner_data, Ours};
    use distlock_core::{Error, Provider};
    use tokio::sync::oneshot;

    /// The pause a test puts between `request_release`'s read and its
    /// request: told when the read is done, it waits for the go.
    type Pause = (oneshot::Sender<()>, oneshot::Receiver<()>);
    static PAUSE: std::sync::Mutex<Option<Pause>> = std::sync::Mutex::new(None);

    pub(super) async fn between_read_and_write() {
        let pause = PAUSE.lock().ok().and_then(|mut p| p.take());
        if let Some((read, go)) = pause {
            let _ = read.send(());
            let _ = go.await;
        }
    }

    /// The unfair mutex's node has one path: between a request's read of
    /// A's node and its request, A releases and B creates the node again
    /// (at data version 0, like A's). The request must not land on B's
    /// hold: B's owner record stays B's, B is not asked, and the call does
    /// not report having asked A's hold, which is gone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_lands_only_on_the_unfair_hold_it_read() -> Result<(), Error> {
        let hosts = test_support::zookeeper::shared().connect_string();
        let connect = |label: &str| {
            let options = crate::ZkOptions::new(hosts.clone()).owner_label(label);
            crate::ZkProvider::connect_with(options)
        };
        let (a, b) = (connect("a").await?, connect("b").await?);
        let operator = connect("operator").await?;
        let name = test_support::unique_name("ask-race");
        let a_guard = a.mutex(&name)?.try_lock().await?.ok_or(Error::NotHeld {
            name: "A did not get the free lock".into(),
        })?;
        let (read_tx, read_rx) = oneshot::channel();
        let (go_tx, go_rx) = oneshot::channel();
        *PAUSE
            .lock()
            .map_err(|_| Error::server("test", "poisoned"))? = Some((read_tx, go_rx));
        let asking = {
            let operator = operator.clone();
            let name = name.clone();
            tokio::spawn(async move { operator.request_release(&name, PrimitiveKind::Mutex).await })
        };
        read_rx
            .await
            .map_err(|_| Error::server("test", "the request never read"))?;
        // Between the read and the request: A lets go, B takes the lock.
        a_guard.release().await?;
        let b_guard = b.mutex(&name)?.try_lock().await?.ok_or(Error::NotHeld {
            name: "B did not get the free lock".into(),
        })?;
        let _ = go_tx.send(());
        let asked = asking
            .await
            .map_err(|e| Error::server("test", e.to_string()))??;
        assert!(
            asked.is_empty(),
            "A's hold is gone, B was not asked: {asked:?}"
        );

        // B's node is as B created it.
        let node = format!("{}/{UNFAIR_NODE}", operator.path(&name)?);
        let raw = zookeeper_client::Client::connect(&hosts)
            .await
            .map_err(|e| Error::server("test", e.to_string()))?;
        let (data, stat) = raw
            .get_data(&node)
            .await
            .map_err(|e| Error::server("test", e.to_string()))?;
        assert_eq!(
            stat.czxid,
            i64::try_from(b_guard.fencing_token()).unwrap_or(-1)
        );
        assert_eq!(stat.version, 0, "B's node was written");
        let shown = String::from_utf8_lossy(&data).into_owned();
        assert!(shown.contains(&format!("owner={} ", b.owner())), "{shown}");
        // And no request for B's hold was left behind.
        let children = raw
            .list_children(&operator.path(&name)?)
            .await
            .map_err(|e| Error::server("test", e.to_string()))?;
        assert_eq!(children, [UNFAIR_NODE], "{children:?}");
        let snapshot = operator.inspect(&name, PrimitiveKind::Mutex).await?;
        assert_eq!(snapshot.holders.len(), 1, "{snapshot:?}");
        assert_eq!(snapshot.holders[0].owner.as_deref(), Some(b.owner()));
        assert!(!snapshot.holders[0].release_requested, "{snapshot:?}");
        // Nor does B hear a request, through its watch or its session
        // checks (every session timeout / 4).
        let checks = b.session_timeout().await?;
        tokio::time::sleep(checks / 2).await;
        assert!(!b_guard.is_release_requested());
        b_guard.release().await?;
        Ok(())
    }

    #[test]
    fn our_data_parses_and_foreign_data_does_not() {
        assert_eq!(
            parse(&owner_data("web@h:1")),
            Some(Ours {
                owner: Some("web@h:1".into()),
                permits: None
            })
        );
        assert_eq!(
            parse(b"distlock permits=3"),
            Some(Ours {
                owner: None,
                permits: Some(3)
            })
        );
        assert_eq!(
            parse(b"distlock permits=2 owner=h:7 id=abc"),
            Some(Ours {
                owner: Some("h:7".into()),
                permits: Some(2)
            })
        );
        for theirs in [
            &b"127.0.1.1"[..],
            b"",
            b"kazoo",
            b"distlockowner=x",
            &[0xff],
        ] {
            assert_eq!(parse(theirs), None, "{theirs:?}");
        }
        assert_eq!(
            foreign("lock node x", b"127.0.1.1"),
            "lock node x, data \"127.0.1.1\""
        );
        assert_eq!(foreign("lock node x", b""), "lock node x, no data");
        assert_eq!(
            foreign("lock node x", &[0, 1, 2]),
            "lock node x, 3 bytes of data"
        );
    }
}
