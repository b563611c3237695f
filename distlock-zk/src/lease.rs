//! A held ZooKeeper lease: our ephemeral node in our session. Released by
//! deleting the node; lost when the session expires or closes, or the node
//! is deleted; suspended while the session is disconnected.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::{Error, LeaseBackend, LeaseSignal, LostReason, Name, Result};
use zookeeper_client::EventType;

use crate::error::{map, session_ended};
use crate::node::{delete_retrying, op};
use crate::session::{Session, Status};

/// One held lease.
pub(crate) struct ZkLease {
    pub(crate) session: Arc<Session>,
    pub(crate) name: Name,
    pub(crate) node: String,
    pub(crate) czxid: i64,
    /// The node's path is ours alone (a queue node): delete it without
    /// looking first. A shared path (the unfair lock) is checked first.
    pub(crate) unique: bool,
    pub(crate) timeout: Duration,
}

impl ZkLease {
    fn not_held(&self) -> Error {
        Error::not_held(self.name.as_str())
    }

    /// Whether the node is still the one we created, in our session; with
    /// its version.
    async fn ours(&self) -> Result<Option<i32>> {
        match op(
            self.timeout,
            "check lease",
            self.session.client.check_stat(&self.node),
        )
        .await?
        {
            Ok(Some(stat))
                if stat.czxid == self.czxid && stat.ephemeral_owner == self.session.id =>
            {
                Ok(Some(stat.version))
            }
            Ok(_) => Ok(None),
            Err(e) if session_ended(&e) => Ok(None),
            Err(e) => Err(map("check lease", self.timeout, e)),
        }
    }
}

#[async_trait]
impl LeaseBackend for ZkLease {
    async fn renew(&self, _ttl: Duration) -> Result<()> {
        // A session lease needs no renewal; report whether it is still ours.
        match self.ours().await? {
            Some(_) => Ok(()),
            None => Err(self.not_held()),
        }
    }

    async fn release(&self) -> Result<()> {
        let version = if self.unique {
            None
        } else {
            Some(self.ours().await?.ok_or_else(|| self.not_held())?)
        };
        match delete_retrying(&self.session, &self.node, version, self.timeout).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(self.not_held()),
            Err(e) => {
                // Keep trying in the background while the session may live:
                // a node left behind would hold the lock until it ends.
                let (session, node) = (Arc::clone(&self.session), self.node.clone());
                let budget = session.timeout() * 2;
                tokio::spawn(
                    async move { delete_retrying(&session, &node, version, budget).await },
                );
                Err(e)
            }
        }
    }
}

/// Watches the session and the node for as long as the lease is active.
pub(crate) fn watch(session: Arc<Session>, node: String, signal: LeaseSignal) {
    tokio::spawn(async move {
        let mut status = session.status.clone();
        let deleted = node_deleted(&session, &node);
        tokio::pin!(deleted);
        loop {
            let current = *status.borrow_and_update();
            match current {
                Status::Connected => signal.suspend(false),
                Status::Disconnected => signal.suspend(true),
                Status::Expired => {
                    signal.lose(LostReason::SessionExpired);
                    return;
                }
                Status::Closed => {
                    signal.lose(LostReason::SessionClosed);
                    return;
                }
            }
            tokio::select! {
                () = signal.ended() => return,
                changed = status.changed() => {
                    if changed.is_err() && !status.borrow().is_dead() {
                        // The session's state task is gone without a final
                        // state: only the node watch is left.
                        std::future::pending::<()>().await;
                    }
                }
                () = &mut deleted => {
                    signal.lose(LostReason::Deleted);
                    return;
                }
            }
        }
    });
}

/// Resolves when `node` is deleted; pends while it exists or cannot be
/// asked (session events are the state watch's business).
async fn node_deleted(session: &Session, node: &str) {
    loop {
        match session.client.check_and_watch_stat(node).await {
            Ok((None, _)) => return,
            Ok((Some(_), watcher)) => match watcher.changed().await.event_type {
                EventType::NodeDeleted => return,
                EventType::Session => std::future::pending::<()>().await,
                _ => {}
            },
            Err(e) if session_ended(&e) => std::future::pending::<()>().await,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}
