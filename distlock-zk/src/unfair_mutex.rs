//! The unfair mutex: one ephemeral node `_unfair_lock` that every contender
//! races to create (the crate docs, "The recipes" and "Unknown outcomes").

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::backend::{with_timeout, CleanupGuard};
use distlock_core::{Error, Lock, LockGuard, Name, Result, Wait};
use tokio::time::Instant;
use zookeeper_client::{CreateMode, Error as ZkError, OneshotWatcher};

use crate::acquire::{acquire, Recipe};
use crate::context::{session_for, start_over, Context};
use crate::error::{from_zk, triage, triage_timed, Triage};
use crate::layout::{Kind, UNFAIR_NODE};
use crate::lease::Acquired;
use crate::node::{acls, check_lock_dir, make_parents, Mark, WithdrawIfOurs};
use crate::queue::{check_dir_again, conflict};
use crate::session::Session;
use crate::wait::{
    passed, pause_before_retry, slack, watch_fired, watch_noticed, withdraw_now, within, Recreate,
};

/// A ZooKeeper unfair mutex.
pub(crate) struct UnfairMutex {
    pub(crate) ctx: Arc<Context>,
    pub(crate) name: Name,
    pub(crate) dir: String,
    /// The lease's `max_hold`, if any.
    pub(crate) hold: Option<std::time::Duration>,
    /// The directory was seen to be a lock's (not an id counter): checked
    /// by this handle's first create, pipelined with it, so that later
    /// acquisitions cost no request for it.
    pub(crate) dir_checked: AtomicBool,
}

impl fmt::Debug for UnfairMutex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UnfairMutex")
            .field("path", &self.dir)
            .finish_non_exhaustive()
    }
}

/// What the lock node is, as far as one read could tell.
enum Found {
    Ours(i64, Instant),
    Theirs(OneshotWatcher),
    Absent,
}

/// Reads the node with a watch; ours if it holds our owner id in our
/// session.
async fn inspect(
    session: &Session,
    node: &str,
    owner: &[u8],
    timeout: Duration,
) -> std::result::Result<Found, Triage> {
    let sent = Instant::now();
    let read = with_timeout("watch", timeout, session.client.get_and_watch_data(node)).await;
    match read {
        Ok(Err(ZkError::NoNode)) => Ok(Found::Absent),
        other => {
            let (data, stat, watcher) = triage_timed("watch", timeout, other)?;
            if stat.ephemeral_owner == 0 {
                return Err(Triage::Fail(Error::Conflict {
                    what: format!("zookeeper node {node:?}"),
                    expected: "lock node (it is persistent, so it would never be released)",
                }));
            }
            if data == owner && stat.ephemeral_owner == session.id {
                Ok(Found::Ours(stat.czxid, sent))
            } else {
                Ok(Found::Theirs(watcher))
            }
        }
    }
}

/// What one attempt at the lock node came to.
enum Step {
    /// Taken, or given up (`None`: not free and not to wait, or the
    /// deadline passed).
    Done(Option<Acquired>),
    /// Another holds it: wait for this watch, then race again.
    Wait(OneshotWatcher),
}

/// Races for the one ephemeral node of an unfair lock, with `owner` as
/// its data: attempts, and waits for the holder's node to go between them.
/// Each attempt is boxed and over before the wait, so a waiter keeps only
/// its wait. The node it takes then passes the kind check (`acquire`).
async fn take(
    ctx: &Context,
    dir: &str,
    dir_checked: &AtomicBool,
    owner: Arc<[u8]>,
    wait: Wait,
) -> Result<Option<Acquired>> {
    // At the first poll: a future made outside a runtime and run inside
    // one works.
    tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
    let deadline = wait.deadline();
    let node = format!("{dir}/{UNFAIR_NODE}");
    loop {
        // Out of the match, so that the step is not kept through the wait.
        let watcher = match Box::pin(attempt(ctx, (dir, dir_checked), &node, &owner, wait)).await? {
            Step::Done(acquired) => return Ok(acquired),
            Step::Wait(watcher) => watcher,
        };
        if wait == Wait::No || passed(deadline) {
            return Ok(None);
        }
        if !watch_fired(ctx, watcher, deadline).await? {
            return Ok(None);
        }
        watch_noticed(ctx);
    }
}

/// One attempt: create the node, or learn who holds it (with a watch),
/// starting over on a new session when ours ends.
async fn attempt(
    ctx: &Context,
    (dir, dir_checked): (&str, &AtomicBool),
    node: &str,
    owner: &[u8],
    wait: Wait,
) -> Result<Step> {
    let deadline = wait.deadline();
    let timeout = ctx.timeout;
    let create = CreateMode::Ephemeral.with_acls(acls(ctx.authenticated));
    'session: loop {
        let Some(session) = session_for(ctx, wait).await? else {
            return Ok(Step::Done(None));
        };
        let ours = Arc::new(WithdrawIfOurs {
            session: Arc::clone(&session),
            node: node.to_owned(),
            mark: Mark::Data(owner.to_vec()),
            timeout,
        });
        let mut withdrawal = CleanupGuard::arm("withdraw the unfair node", ours)?;
        // `true` while the last create's outcome is unknown: only the
        // lookup may be retried, never the create.
        let mut unknown = false;
        // The last create's error, while its outcome is unknown.
        let mut last = None;
        let mut again = Recreate::new();
        loop {
            if !unknown {
                let sent = Instant::now();
                // The first create of this handle takes the directory's
                // stat along (pipelined): a name whose node is an id
                // counter is refused, not locked.
                let check = !dir_checked.load(Ordering::Relaxed);
                // The full operation timeout, even near the deadline: a
                // free lock is taken with any timeout; past it, only what
                // is left of the slack.
                let asked = with_timeout("create", slack(timeout, wait), async {
                    let stat = check.then(|| session.client.check_stat(dir));
                    let creating = session.client.create(node, owner, &create);
                    // Sent right behind the create on the same session, so
                    // the server answers it after the create (one round trip
                    // for both): the listing the kind check needs (`kinds`).
                    let listing = session.client.list_children(dir);
                    let (created, dir_stat) =
                        futures::join!(creating, futures::future::OptionFuture::from(stat));
                    (created, dir_stat, listing)
                })
                .await;
                let (created, dir_stat, listing) = match asked {
                    Ok((created, dir_stat, listing)) => {
                        (Ok(created), dir_stat.and_then(Result::ok), Some(listing))
                    }
                    Err(e) => (Err(e), None, None),
                };
                let verdict = match (&created, &dir_stat) {
                    (_, Some(Some(stat))) => check_lock_dir(dir, stat),
                    (Ok(Ok(_)), None) if check => {
                        check_dir_again(&session, dir, None, timeout).await
                    }
                    _ => Ok(()),
                };
                if verdict.is_ok() && dir_stat.is_some() {
                    dir_checked.store(true, Ordering::Relaxed);
                }
                if let Err(e) = verdict {
                    let refused = matches!(&created, Ok(Err(e)) if !crate::error::unknown(e));
                    if refused {
                        withdrawal.disarm();
                    } else {
                        // Ours may be there: nothing may stay under a name
                        // that is refused.
                        withdraw_now(withdrawal, slack(timeout, wait)).await;
                    }
                    return Err(e);
                }
                match created {
                    Ok(Ok((stat, _))) => {
                        // Read before the withdrawal is disarmed: a cancellation
                        // while it is awaited still deletes our node.
                        let listing = match listing {
                            Some(listing) => with_timeout("list", timeout, listing)
                                .await
                                .ok()
                                .and_then(std::result::Result::ok),
                            None => None,
                        };
                        withdrawal.disarm();
                        return Ok(Step::Done(Some(Acquired {
                            session: Arc::clone(&session),
                            node: node.to_owned(),
                            czxid: stat.czxid,
                            heard_at: sent,
                            sweep: false,
                            listing,
                        })));
                    }
                    Ok(Err(ZkError::NodeExists)) if wait == Wait::No => {
                        // Someone else's: ours is only created after a
                        // lookup found none.
                        withdrawal.disarm();
                        return Ok(Step::Done(None));
                    }
                    Ok(Err(ZkError::NodeExists)) => {}
                    Ok(Err(ZkError::NoNode)) => {
                        withdrawal.disarm();
                        make_parents(&session, node, ctx.authenticated, timeout).await?;
                        continue 'session;
                    }
                    Ok(Err(ZkError::NoChildrenForEphemerals)) => {
                        withdrawal.disarm();
                        return Err(conflict(dir));
                    }
                    Ok(Err(e)) => match triage("create", timeout, e.clone()) {
                        Triage::SessionEnded => {
                            start_over(ctx, &session, &mut withdrawal).await;
                            continue 'session;
                        }
                        Triage::Fail(e) => {
                            withdrawal.disarm();
                            return Err(e);
                        }
                        Triage::Retry => {
                            unknown = true;
                            last = Some(from_zk("create", timeout, e));
                        }
                    },
                    Err(e) => {
                        unknown = true;
                        last = Some(e);
                    }
                }
            }
            if unknown {
                // Make sure the server we ask has seen our create, if it
                // reached the leader at all.
                let ask = within(timeout, wait);
                let synced = with_timeout("sync", ask, session.client.sync(dir)).await;
                if let Err(t) = triage_timed("sync", timeout, synced) {
                    match t {
                        Triage::SessionEnded => {
                            start_over(ctx, &session, &mut withdrawal).await;
                            continue 'session;
                        }
                        Triage::Retry if pause_before_retry(deadline).await => continue,
                        Triage::Retry => {
                            withdraw_now(withdrawal, slack(timeout, wait)).await;
                            return Ok(Step::Done(None));
                        }
                        // No directory: the create cannot have happened.
                        Triage::Fail(_) => {}
                    }
                }
            }
            match inspect(&session, node, owner, within(timeout, wait)).await {
                Ok(Found::Ours(czxid, heard_at)) => {
                    withdrawal.disarm();
                    return Ok(Step::Done(Some(Acquired {
                        session,
                        node: node.to_owned(),
                        czxid,
                        heard_at,
                        sweep: false,
                        listing: None,
                    })));
                }
                Ok(Found::Absent) if unknown => {
                    // Definitive: ours never landed (or it went); create
                    // again after a pause. A late create may still land:
                    // the withdrawal, armed on every return, deletes it.
                    unknown = false;
                    if !again.pause(wait).await {
                        return match last.take() {
                            Some(e) if wait == Wait::No => Err(e),
                            _ => Ok(Step::Done(None)),
                        };
                    }
                }
                Ok(Found::Absent) => {
                    // The holder's node went: race for it at once.
                }
                Ok(Found::Theirs(watcher)) => {
                    withdrawal.disarm();
                    return Ok(Step::Wait(watcher));
                }
                Err(Triage::SessionEnded) => {
                    start_over(ctx, &session, &mut withdrawal).await;
                    continue 'session;
                }
                Err(Triage::Retry) if pause_before_retry(deadline).await => {}
                Err(Triage::Retry) => {
                    withdraw_now(withdrawal, slack(timeout, wait)).await;
                    return Ok(Step::Done(None));
                }
                Err(Triage::Fail(e)) => {
                    if unknown {
                        withdraw_now(withdrawal, slack(timeout, wait)).await;
                    }
                    return Err(e);
                }
            }
        }
    }
}

impl Recipe for UnfairMutex {
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
        Kind::Mutex
    }

    fn hold(&self) -> Option<std::time::Duration> {
        self.hold
    }
}

#[async_trait]
impl Lock for UnfairMutex {
    fn name(&self) -> &Name {
        &self.name
    }

    fn backend(&self) -> &'static str {
        "zookeeper"
    }

    fn kind(&self) -> distlock_core::PrimitiveKind {
        distlock_core::PrimitiveKind::Mutex
    }

    // Not an `async fn`: the skeleton's future itself, no async body
    // around it (a waiting task keeps this).
    fn acquire<'life0, 'async_trait>(
        &'life0 self,
        wait: Wait,
    ) -> Pin<Box<dyn Future<Output = Result<Option<LockGuard>>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        // Our identity, and an id that tells this acquisition's node from
        // another's of the same identity: the same for every join of this
        // acquisition (a late create of ours is then still ours).
        let owner: Arc<[u8]> = format!(
            "distlock owner={} id={}",
            self.ctx.owner,
            uuid::Uuid::new_v4().simple()
        )
        .into_bytes()
        .into();
        Box::pin(acquire(self, wait, move |wait| {
            take(
                &self.ctx,
                &self.dir,
                &self.dir_checked,
                Arc::clone(&owner),
                wait,
            )
        }))
    }
}
