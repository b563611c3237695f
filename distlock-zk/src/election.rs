//! Leader election, LeaderLatch-style (the crate docs, "Election"; node
//! names in `layout`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::backend::{validate_candidate, with_timeout};
use distlock_core::{Election, Error, LeaderInfo, LeaderStream, Leadership, Name, Result, Wait};
use zookeeper_client::{Error as ZkError, OneshotWatcher};

use crate::acquire::{acquire, Recipe};
use crate::context::Context;
use crate::error::from_zk;
use crate::layout::{latch_tag, sorted_queue, Kind};
use crate::queue::enter_tagged_queue;

/// A ZooKeeper election.
pub(crate) struct ZkElection {
    pub(crate) ctx: Arc<Context>,
    pub(crate) name: Name,
    /// Shared by every acquisition's withdraw.
    pub(crate) dir: Arc<str>,
    /// The lease's `max_hold`, if any.
    pub(crate) hold: Option<std::time::Duration>,
}

impl fmt::Debug for ZkElection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkElection")
            .field("path", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Recipe for ZkElection {
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
        Kind::Election
    }

    fn hold(&self) -> Option<std::time::Duration> {
        self.hold
    }
}

/// The leader now, and (with `watch`) a watcher that fires when the set of
/// candidates changes.
async fn current(
    ctx: &Context,
    dir: &str,
    watch: bool,
) -> Result<(Option<LeaderInfo>, Option<OneshotWatcher>)> {
    let timeout = ctx.timeout;
    loop {
        let session = ctx.sessions.get().await?;
        let client = &session.client;
        let (children, watcher) = if watch {
            match with_timeout("watch", timeout, client.get_and_watch_children(dir)).await? {
                Ok((children, _, watcher)) => (children, Some(watcher)),
                Err(ZkError::NoNode) => {
                    // No election yet: wait for the directory to appear.
                    match with_timeout("watch", timeout, client.check_and_watch_stat(dir)).await? {
                        Ok((None, watcher)) => return Ok((None, Some(watcher))),
                        Ok((Some(_), _)) => continue,
                        Err(e) => return Err(from_zk("watch", timeout, e)),
                    }
                }
                Err(e) => return Err(from_zk("watch", timeout, e)),
            }
        } else {
            match with_timeout("list", timeout, client.list_children(dir)).await? {
                Ok(children) => (children, None),
                Err(ZkError::NoNode) => return Ok((None, None)),
                Err(e) => return Err(from_zk("list", timeout, e)),
            }
        };
        let queue = sorted_queue(children, "latch").map_err(|_| Error::Conflict {
            what: format!("zookeeper node {dir:?}"),
            expected: "election directory whose sequence counter has not passed 2^31",
        })?;
        let Some((_, head)) = queue.into_iter().next() else {
            return Ok((None, watcher));
        };
        match with_timeout("get", timeout, client.get_data(&format!("{dir}/{head}"))).await? {
            Ok((data, stat)) => {
                let info = LeaderInfo {
                    id: String::from_utf8_lossy(&data).into_owned(),
                    term: u64::try_from(stat.czxid).unwrap_or_default(),
                };
                return Ok((Some(info), watcher));
            }
            // The head left between the two reads: look again.
            Err(ZkError::NoNode) => {}
            Err(e) => return Err(from_zk("get", timeout, e)),
        }
    }
}

#[async_trait]
impl Election for ZkElection {
    fn name(&self) -> &Name {
        &self.name
    }

    async fn campaign(&self, candidate: &str) -> Result<Leadership> {
        validate_candidate(candidate)?;
        tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        distlock_core::backend::measured_campaign("zookeeper", &self.name, async {
            // The data stays the candidate id (Curator's LeaderLatch reads
            // it); our owner identity goes into the node's name.
            let tag = latch_tag(&self.ctx.owner);
            let held = acquire(self, Wait::Forever, |wait| {
                enter_tagged_queue(
                    &self.ctx,
                    &self.dir,
                    "latch",
                    &tag,
                    candidate.as_bytes(),
                    wait,
                )
            })
            .await?
            .ok_or(Error::Closed)?;
            // The node we lead with is ours by construction: created in this
            // session (or found by prefix with this session as its owner).
            Ok(Leadership::new(held, candidate))
        })
        .await
    }

    async fn leader(&self) -> Result<Option<LeaderInfo>> {
        self.ctx.lifecycle.check_open()?;
        Ok(current(&self.ctx, &self.dir, false).await?.0)
    }

    fn observe(&self) -> LeaderStream {
        struct State {
            ctx: Arc<Context>,
            dir: String,
            last: Option<Option<LeaderInfo>>,
            watcher: Option<OneshotWatcher>,
        }
        let state = State {
            ctx: Arc::clone(&self.ctx),
            dir: self.dir.to_string(),
            last: None,
            watcher: None,
        };
        Box::pin(futures::stream::unfold(state, |mut state| async move {
            loop {
                if let Some(watcher) = state.watcher.take() {
                    // Fired, or dropped with its client (a session that
                    // ended): look again either way, on the session now.
                    let _ = crate::wait::event_of(watcher).await;
                }
                match current(&state.ctx, &state.dir, true).await {
                    Ok((leader, watcher)) => {
                        state.watcher = watcher;
                        if state.last.as_ref() != Some(&leader) {
                            state.last = Some(leader.clone());
                            return Some((Ok(leader), state));
                        }
                    }
                    Err(e) => {
                        // Report, then try again after a pause.
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        return Some((Err(e), state));
                    }
                }
            }
        }))
    }
}
