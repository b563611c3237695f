//! The read-write lock, in Curator's `InterProcessReadWriteLock` layout: one
//! queue of read and write nodes in the lock's directory.
//!
//! Who holds and whom a waiter watches are the crate docs' ("The
//! recipes"); here are the rules as [`QueueRules`] and the proof of the
//! tokens' order.
//!
//! # Fencing
//!
//! A guard's token is the `czxid` of its node, as for the fair mutex.
//! Claim: for two holds A and B of which at least one is a write, if A's
//! node was created first (smaller `czxid`), B's hold began after A's node
//! was gone. B's node is behind A's in the queue (the directory's counter
//! grows with every create; and if the directory was removed and made again
//! in between, it was empty, so A's node was gone already). A writer B holds
//! only as the lowest node, a reader B only with no write node before it,
//! and A is before B and is a write if B is a read: so the listing in
//! which B saw itself holding, read after B's create in B's session (so at
//! a later point of the server's order), no longer had A's node. Hence an
//! earlier hold that conflicts has the smaller `czxid`: every write token is
//! greater than every earlier read or write token, every read token greater
//! than every earlier write token, and zxids are unique, so readers' tokens
//! are distinct too. A hold that was lost (session expired, node deleted)
//! counts as ended when its node went, which is when the next hold could
//! begin.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use distlock_core::{Error, Lock, LockGuard, Name, ReadWriteLock, Result, Wait};

use crate::acquire::{acquire, Recipe};
use crate::context::Context;
use crate::layout::{rw_queue, Kind, Wrapped, READ, WRITE};
use crate::queue::{join_queue, QueueRules, Standing};

/// The queue rules of one side of the lock.
struct Side {
    write: bool,
}

impl QueueRules for Side {
    fn node_name(&self) -> Cow<'static, str> {
        Cow::Borrowed(if self.write { WRITE } else { READ })
    }

    fn standing(&self, children: Vec<String>, own: &str) -> std::result::Result<Standing, Wrapped> {
        let mut queue = rw_queue(children)?;
        let Some(position) = queue.iter().position(|(_, _, n)| n == own) else {
            return Ok(Standing::Missing);
        };
        let blocker = if self.write {
            position.checked_sub(1)
        } else {
            queue[..position].iter().rposition(|(_, write, _)| *write)
        };
        Ok(match blocker {
            None => Standing::Holds,
            Some(i) => Standing::Behind(queue.swap_remove(i).2),
        })
    }
}

/// One side of a ZooKeeper read-write lock, as a [`Lock`].
struct RwSide {
    ctx: Arc<Context>,
    name: Name,
    dir: Arc<str>,
    side: Side,
    hold: Option<std::time::Duration>,
}

impl fmt::Debug for RwSide {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(if self.side.write {
            "WriteLock"
        } else {
            "ReadLock"
        })
        .field("path", &self.dir)
        .finish_non_exhaustive()
    }
}

#[async_trait]
impl Lock for RwSide {
    fn name(&self) -> &Name {
        &self.name
    }

    fn backend(&self) -> &'static str {
        "zookeeper"
    }

    fn kind(&self) -> distlock_core::PrimitiveKind {
        distlock_core::PrimitiveKind::ReadWrite
    }

    async fn acquire(&self, wait: Wait) -> Result<Option<LockGuard>> {
        tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        acquire(self, wait, |wait| {
            join_queue(&self.ctx, &self.dir, &self.side, &self.ctx.owner_data, wait)
        })
        .await
    }
}

impl Recipe for RwSide {
    fn ctx(&self) -> &Arc<Context> {
        &self.ctx
    }

    fn name(&self) -> &Name {
        &self.name
    }

    fn dir(&self) -> &str {
        &self.dir
    }

    fn kind(&self) -> Kind {
        Kind::Rw
    }

    fn hold(&self) -> Option<std::time::Duration> {
        self.hold
    }
}

/// A ZooKeeper read-write lock: its two sides.
struct ZkRwLock {
    name: Name,
    read: Arc<dyn Lock>,
    write: Arc<dyn Lock>,
}

impl fmt::Debug for ZkRwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkRwLock")
            .field("read", &self.read)
            .field("write", &self.write)
            .finish()
    }
}

impl ReadWriteLock for ZkRwLock {
    fn name(&self) -> &Name {
        &self.name
    }

    fn read(&self) -> Arc<dyn Lock> {
        Arc::clone(&self.read)
    }

    fn write(&self) -> Arc<dyn Lock> {
        Arc::clone(&self.write)
    }
}

/// The read-write lock `name`, its nodes in `dir`.
///
/// # Errors
///
/// None so far: the provider checked the name and its options.
pub(crate) fn rw_lock(
    ctx: &Arc<Context>,
    name: Name,
    dir: String,
    hold: Option<std::time::Duration>,
) -> Result<Arc<dyn ReadWriteLock>> {
    let dir: Arc<str> = Arc::from(dir);
    let side = |write: bool, dir: Arc<str>| -> Arc<dyn Lock> {
        Arc::new(RwSide {
            ctx: Arc::clone(ctx),
            name: name.clone(),
            dir,
            side: Side { write },
            hold,
        })
    };
    let write = side(true, dir.clone());
    let read = side(false, dir);
    Ok(Arc::new(ZkRwLock { name, read, write }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn standing(write: bool, children: &[&str], own: &str) -> String {
        let children = children.iter().map(|c| (*c).to_owned()).collect();
        match (Side { write }).standing(children, own).unwrap() {
            Standing::Holds => "holds".into(),
            Standing::Behind(child) => child,
            Standing::Missing => "missing".into(),
        }
    }

    #[test]
    fn readers_share_until_a_writer_queues_and_then_wait_for_the_last_writer_before_them() {
        let children = [
            "_c_r1-__READ__0000000001",
            "_c_w1-__WRIT__0000000003",
            "_c_r2-__READ__0000000002",
            "_c_w2-__WRIT__0000000005",
            "_c_r3-__READ__0000000004",
            "_c_r4-__READ__0000000006",
            "unrelated",
            "_c_x-lock-0000000000",
        ];
        assert_eq!(
            standing(false, &children, "_c_r1-__READ__0000000001"),
            "holds"
        );
        assert_eq!(
            standing(false, &children, "_c_r2-__READ__0000000002"),
            "holds"
        );
        assert_eq!(
            standing(false, &children, "_c_r3-__READ__0000000004"),
            "_c_w1-__WRIT__0000000003"
        );
        assert_eq!(
            standing(false, &children, "_c_r4-__READ__0000000006"),
            "_c_w2-__WRIT__0000000005"
        );
        assert_eq!(
            standing(false, &children, "_c_gone-__READ__0000000007"),
            "missing"
        );
    }

    #[test]
    fn a_writer_holds_as_the_lowest_node_and_waits_for_its_predecessor() {
        let children = [
            "_c_w2-__WRIT__0000000005",
            "_c_r2-__READ__0000000002",
            "_c_w1-__WRIT__0000000003",
            "_c_r1-__READ__0000000001",
        ];
        assert_eq!(
            standing(true, &children, "_c_w1-__WRIT__0000000003"),
            "_c_r2-__READ__0000000002"
        );
        assert_eq!(
            standing(true, &children, "_c_w2-__WRIT__0000000005"),
            "_c_w1-__WRIT__0000000003"
        );
        assert_eq!(
            standing(true, &children[..1], "_c_w2-__WRIT__0000000005"),
            "holds"
        );
    }

    #[test]
    fn a_wrapped_sequence_is_refused() {
        let children = vec![
            "_c_r1-__READ__0000000001".to_owned(),
            "_c_w1-__WRIT__-2147483648".to_owned(),
        ];
        assert!((Side { write: false })
            .standing(children, "_c_r1-__READ__0000000001")
            .is_err());
    }
}
