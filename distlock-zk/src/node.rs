//! Paths, node names and the small helpers every recipe uses.

use std::future::Future;
use std::time::Duration;

use distlock_core::{Error, Name, Result};
use zookeeper_client::{Acls, CreateMode, Error as ZkError};

use crate::error::map;
use crate::session::Session;

/// ZooKeeper marks container nodes with this `ephemeralOwner`.
pub(crate) const CONTAINER_OWNER: i64 = i64::MIN;

/// The directory of a primitive: root + `/` + name.
pub(crate) fn dir(root: &str, name: &Name) -> String {
    format!("{root}/{name}")
}

/// Runs one request with the operation timeout. The outer error is ours
/// (timeout); the inner one is the server's answer, for the recipe to act on.
pub(crate) async fn op<T>(
    timeout: Duration,
    operation: &'static str,
    request: impl Future<Output = std::result::Result<T, ZkError>>,
) -> Result<std::result::Result<T, ZkError>> {
    tokio::time::timeout(timeout, request)
        .await
        .map_err(|_| Error::Timeout {
            operation,
            after: timeout,
        })
}

/// Deletes `node` (at `version`, if given), retrying connection losses and
/// timeouts until `budget` runs out: a failed delete would otherwise leave the
/// node (and the lock) in place for as long as the session lives. Returns
/// whether the node was ours to delete (`Ok(false)`: it was already gone, had
/// another version, or the session ended and took it along).
pub(crate) async fn delete_retrying(
    session: &Session,
    node: &str,
    version: Option<i32>,
    budget: Duration,
) -> Result<bool> {
    let deadline = tokio::time::Instant::now() + budget;
    let per_try = budget.min(Duration::from_secs(2));
    let mut pause = Duration::from_millis(20);
    loop {
        let outcome = tokio::time::timeout(per_try, session.client.delete(node, version)).await;
        match outcome {
            Ok(Ok(())) => return Ok(true),
            Ok(Err(ZkError::NoNode | ZkError::BadVersion)) => return Ok(false),
            Ok(Err(e)) if crate::error::session_ended(&e) => return Ok(false),
            Ok(Err(ZkError::ConnectionLoss)) | Err(_) => {}
            Ok(Err(e)) => return Err(map("delete", budget, e)),
        }
        if tokio::time::Instant::now() + pause >= deadline {
            return Err(Error::Timeout {
                operation: "delete",
                after: budget,
            });
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
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
    match op(
        timeout,
        "create parents",
        session.client.mkdir(parent, &options),
    )
    .await?
    {
        Ok(()) => Ok(()),
        Err(ZkError::NoChildrenForEphemerals) => Err(Error::Conflict {
            what: format!("zookeeper node above {path:?}"),
            expected: "persistent or container parent (an ephemeral node is in the way)",
        }),
        Err(e) => Err(map("create parents", timeout, e)),
    }
}

/// The sequence number of a queue child of `marker` (`lock`, `latch`):
/// Curator's `…-lock-0000000042` and, for locks, kazoo's
/// `…__lock__0000000042`.
pub(crate) fn sequence(child: &str, marker: &str) -> Option<u64> {
    let curator = format!("-{marker}-");
    let kazoo = format!("__{marker}__");
    let digits = child
        .rsplit_once(curator.as_str())
        .or_else(|| {
            (marker == "lock")
                .then(|| child.rsplit_once(kazoo.as_str()))
                .flatten()
        })
        .map(|(_, d)| d)?;
    if digits.len() < 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Queue children of `marker`, in queue order.
pub(crate) fn sorted_queue(children: Vec<String>, marker: &str) -> Vec<(u64, String)> {
    let mut queue: Vec<(u64, String)> = children
        .into_iter()
        .filter_map(|c| sequence(&c, marker).map(|s| (s, c)))
        .collect();
    queue.sort();
    queue
}

/// The czxid of a created node as a fencing token.
pub(crate) fn token(czxid: i64) -> Result<u64> {
    u64::try_from(czxid).map_err(|_| Error::server("zookeeper", "negative czxid"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_of_curator_kazoo_and_others() {
        assert_eq!(sequence("_c_1f-lock-0000000042", "lock"), Some(42));
        assert_eq!(sequence("abc__lock__0000000007", "lock"), Some(7));
        assert_eq!(sequence("_c_1f-latch-0000000003", "latch"), Some(3));
        assert_eq!(sequence("abc__lock__0000000007", "latch"), None);
        assert_eq!(sequence("_unfair_lock", "lock"), None);
        assert_eq!(sequence("_c_x-lock-12", "lock"), None);
        assert_eq!(sequence("_c_x-lock-000000000a", "lock"), None);
        let q = sorted_queue(
            vec![
                "b-lock-0000000010".into(),
                "a__lock__0000000002".into(),
                "junk".into(),
                "c-lock-0000000005".into(),
            ],
            "lock",
        );
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
}
