//! The counting semaphore, in Curator's `InterProcessSemaphoreV2` layout:
//! the protocol and why it is safe are in the crate docs ("The recipes").

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use distlock_core::backend::{with_timeout, CleanupGuard};
use distlock_core::{Error, Lock, LockGuard, Name, Result, Semaphore, Wait};
use tokio::time::Instant;
use zookeeper_client::{Error as ZkError, OneshotWatcher};

use crate::context::{start_over, Context};
use crate::error::{triage_timed, Triage};
use crate::kinds::check;
use crate::layout::{lease_data, owner_data, permits_of, Kind, LEASES, LOCKS};
use crate::lease::guard;
use crate::lease::Acquired;
use crate::node::session_owned;
use crate::queue::{enter_queue_below, join, Joined, Withdraw};
use crate::session::Session;
use crate::wait::{
    passed, pause_before_retry, slack, watch_fired, watch_noticed, withdraw_now, within,
};

/// Builds the ZooKeeper semaphore `name` at `dir` with `permits` (≥ 1).
///
/// # Errors
///
/// None yet: the signature leaves room for checks of the name.
#[allow(clippy::unnecessary_wraps)]
pub(crate) fn semaphore(
    ctx: &Arc<Context>,
    name: Name,
    dir: String,
    permits: u32,
    hold: Option<std::time::Duration>,
) -> Result<Arc<dyn Semaphore>> {
    Ok(Arc::new(ZkSemaphore {
        ctx: Arc::clone(ctx),
        name,
        dir,
        permits,
        hold,
    }))
}

/// A ZooKeeper counting semaphore (see the module documentation).
///
/// Each permit is its own session lease: its guard's fencing token is the
/// `czxid` of its lease node, its `lost()` fires when that node is deleted
/// or the session ends, and a crashed holder's permit comes back when the
/// server ends its session.
///
/// The fencing token is the lease node's `czxid`, not its sequence number:
/// zxids are unique and strictly increasing over the ensemble's whole
/// history (the leader numbers every transaction, and a new leader's epoch
/// is higher), so a later holder of any permit of the name has a greater
/// token, across clients, sessions and leader failover. The sequence would
/// not do: `leases` is a container node that the server deletes once it is
/// empty, and a new one counts from 0 again.
///
/// Permits: our lease nodes hold `distlock permits=N owner=<identity>` (words separated by
/// spaces, so that more can be added). An acquisition reads the data of
/// every other lease node it counts; one that parses as ours with another
/// `N` is a holder admitted under another number, and the acquisition
/// withdraws and fails with [`Error::PermitsMismatch`]. Curator's lease
/// nodes carry other data (by default the client's IP address): they are
/// counted but not checked, and Curator checks nothing of ours, so a Curator
/// client uses its own `maxLeases` and must be configured with the same
/// number by hand.
pub(crate) struct ZkSemaphore {
    ctx: Arc<Context>,
    name: Name,
    dir: String,
    permits: u32,
    hold: Option<std::time::Duration>,
}

impl fmt::Debug for ZkSemaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkSemaphore")
            .field("path", &self.dir)
            .field("permits", &self.permits)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Lock for ZkSemaphore {
    fn name(&self) -> &Name {
        &self.name
    }

    fn backend(&self) -> &'static str {
        "zookeeper"
    }

    fn kind(&self) -> distlock_core::PrimitiveKind {
        distlock_core::PrimitiveKind::Semaphore
    }

    /// Takes one permit.
    ///
    /// [`Wait::No`] takes the internal lock without waiting, as Curator's
    /// `acquire(0, …)` does: a try is refused while another acquisition
    /// holds it (a waiter when all permits are out; else only for the
    /// instant of someone else's acquisition).
    ///
    /// # Errors
    ///
    /// [`Error::PermitsMismatch`] when a distlock holder was admitted under
    /// another number of permits; as [`Lock::acquire`] otherwise.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: the lease node and the internal lock node are
    /// deleted (in the background, if need be) when the acquisition is
    /// dropped at any await point.
    async fn acquire(&self, wait: Wait) -> Result<Option<LockGuard>> {
        tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        take(self, wait).await
    }
}

impl Semaphore for ZkSemaphore {
    fn permits(&self) -> u32 {
        self.permits
    }
}

/// Reads the lease nodes `names` (pipelined) and returns the permits of the
/// first distlock holder admitted under another number than `permits`.
/// Marks the nodes read (or gone) in `checked`. A node no session owns
/// (persistent) is a [`Error::Conflict`]: it would hold a permit forever.
async fn other_permits(
    session: &Session,
    leases: &str,
    names: Vec<String>,
    permits: u32,
    checked: &mut HashSet<String>,
    timeout: std::time::Duration,
) -> std::result::Result<Option<u32>, Triage> {
    let reads = names.iter().map(|n| {
        let path = format!("{leases}/{n}");
        async move { session.client.get_data(&path).await }
    });
    let read = with_timeout("read leases", timeout, futures::future::join_all(reads)).await;
    let Ok(read) = read else {
        return Err(Triage::Retry);
    };
    let mut other = None;
    for (name, data) in names.into_iter().zip(read) {
        let data = match data {
            Ok((_, stat)) if !session_owned(stat.ephemeral_owner) => {
                // A persistent (or container, or TTL) node in `leases`
                // never goes by itself: it would take a permit forever.
                return Err(Triage::Fail(Error::Conflict {
                    what: format!("zookeeper node {:?}", format!("{leases}/{name}")),
                    expected:
                        "lease node of a session (it is persistent, so it would never be released)",
                }));
            }
            Ok((data, _)) => Some(data),
            Err(ZkError::NoNode) => None,
            Err(e) => return Err(crate::error::triage("read leases", timeout, e)),
        };
        let theirs = data.as_deref().and_then(permits_of);
        if other.is_none() && theirs.is_some_and(|p| p != permits) {
            other = theirs;
        }
        checked.insert(name);
    }
    Ok(other)
}

/// What one look at the lease nodes found.
struct Count {
    /// When the listing was sent.
    sent: Instant,
    /// Every child of `leases`, ours included.
    count: usize,
    /// Our node is among them.
    ours_there: bool,
    /// The permits of a distlock holder admitted under another number.
    mismatch: Option<u32>,
    /// Fires at the next change of `leases`.
    watcher: OneshotWatcher,
}

/// Lists `leases` with a watch and checks the permits of the nodes not
/// `checked` yet.
async fn count_leases(
    session: &Session,
    leases: &str,
    own_name: &str,
    permits: u32,
    checked: &mut HashSet<String>,
    timeout: std::time::Duration,
) -> std::result::Result<Count, Triage> {
    let sent = Instant::now();
    let listed = with_timeout(
        "list leases",
        timeout,
        session.client.list_and_watch_children(leases),
    )
    .await;
    let (children, watcher) = triage_timed("list leases", timeout, listed)?;
    let ours_there = children.iter().any(|c| c == own_name);
    let count = children.len();
    let unchecked: Vec<String> = children
        .into_iter()
        .filter(|c| !checked.contains(c))
        .collect();
    let mismatch = if ours_there && !unchecked.is_empty() {
        other_permits(session, leases, unchecked, permits, checked, timeout).await?
    } else {
        None
    };
    Ok(Count {
        sent,
        count,
        ours_there,
        mismatch,
        watcher,
    })
}

/// Deletes the lease node (if any) and then the internal lock node, both
/// within `budget` (at most one operation timeout, and not past the
/// deadline plus one: [`slack`]; what is left then finishes in the
/// background), so that a wait that gives up overruns its deadline by one
/// operation timeout at most.
async fn withdraw_both(
    mut lease: CleanupGuard,
    mut lock: CleanupGuard,
    budget: std::time::Duration,
) {
    let _ = with_timeout("withdraw", budget, async {
        let _ = lease.run_now().await;
        let _ = lock.run_now().await;
    })
    .await;
}

/// Curator's `internalAcquire1Lease`, with distlock's care for unknown
/// outcomes, cancellation and session ends.
async fn take(sem: &ZkSemaphore, wait: Wait) -> Result<Option<LockGuard>> {
    let ctx = sem.ctx.as_ref();
    let deadline = wait.deadline();
    let timeout = ctx.timeout;
    let locks: Arc<str> = Arc::from(format!("{}/{LOCKS}", sem.dir));
    let leases: Arc<str> = Arc::from(format!("{}/{LEASES}", sem.dir));
    let lease_uuid = uuid::Uuid::new_v4();
    let data = lease_data(sem.permits, &ctx.owner);
    let lock_data = owner_data(&ctx.owner);
    let limit = usize::try_from(sem.permits).unwrap_or(usize::MAX);
    'attempt: loop {
        // The internal lock; Wait::No takes it only if nobody is ahead.
        let internal = enter_queue_below(ctx, &locks, &sem.dir, "lock", &lock_data, wait);
        let Some(lock) = internal.await? else {
            return Ok(None);
        };
        let mut lock_withdrawal = CleanupGuard::arm(
            "release the semaphore's internal lock",
            Withdraw::acquired(&lock, timeout),
        )?;
        let session = lock.session;
        // Our lease node, in the session that holds the internal lock.
        let (own, czxid, mut withdrawal, lease_unsure) = loop {
            ctx.lifecycle.check_open()?;
            let naming = (lease_uuid, std::borrow::Cow::Borrowed("lease-"));
            let withdraw = Withdraw::new(&session, Arc::clone(&leases), naming, timeout);
            let mut withdrawal = CleanupGuard::arm("withdraw a lease", Arc::clone(&withdraw) as _)?;
            // The internal lock's join checked the semaphore's directory.
            match join(ctx, &withdraw, &mut withdrawal, (&data, false, None), wait).await? {
                Joined::Node { node, czxid, .. } => {
                    break (node, czxid, withdrawal, withdraw.unsure())
                }
                Joined::Again => {}
                Joined::SessionEnded => {
                    // The internal lock node went with the session.
                    lock_withdrawal.disarm();
                    continue 'attempt;
                }
                Joined::DeadlinePassed => {
                    withdraw_both(withdrawal, lock_withdrawal, slack(timeout, wait)).await;
                    return Ok(None);
                }
            }
        };
        let own_name = own.rsplit('/').next().unwrap_or_default().to_owned();
        let mut checked = HashSet::from([own_name.clone()]);
        loop {
            let counted = count_leases(
                &session,
                &leases,
                &own_name,
                sem.permits,
                &mut checked,
                within(timeout, wait),
            )
            .await;
            let counted = match counted {
                Ok(counted) => counted,
                Err(Triage::SessionEnded) => {
                    start_over(ctx, &session, &mut withdrawal).await;
                    lock_withdrawal.disarm();
                    continue 'attempt;
                }
                Err(Triage::Retry) if pause_before_retry(deadline).await => continue,
                Err(Triage::Retry) => {
                    withdraw_both(withdrawal, lock_withdrawal, slack(timeout, wait)).await;
                    return Ok(None);
                }
                Err(Triage::Fail(e)) => {
                    withdraw_both(withdrawal, lock_withdrawal, slack(timeout, wait)).await;
                    return Err(e);
                }
            };
            if !counted.ours_there {
                // Deleted by someone else: Curator starts over, and so do we.
                withdrawal.disarm();
                withdraw_now(lock_withdrawal, slack(timeout, wait)).await;
                if wait == Wait::No || passed(deadline) {
                    return Ok(None);
                }
                continue 'attempt;
            }
            if let Some(held) = counted.mismatch {
                withdraw_both(withdrawal, lock_withdrawal, slack(timeout, wait)).await;
                return Err(Error::PermitsMismatch {
                    name: sem.name.to_string(),
                    held,
                    asked: sem.permits,
                });
            }
            if counted.count <= limit {
                // One name is one lock (`kinds`): no other kind's node older
                // than our family's front.
                let checked = check(
                    &session,
                    (sem.dir.as_str(), None),
                    &sem.name,
                    Kind::Semaphore,
                    czxid,
                    slack(timeout, wait),
                );
                match Box::pin(checked).await {
                    Ok(_) => {}
                    Err(Triage::SessionEnded) => {
                        start_over(ctx, &session, &mut withdrawal).await;
                        lock_withdrawal.disarm();
                        continue 'attempt;
                    }
                    Err(Triage::Retry) if pause_before_retry(deadline).await => continue,
                    Err(Triage::Retry) => {
                        withdraw_both(withdrawal, lock_withdrawal, slack(timeout, wait)).await;
                        return Ok(None);
                    }
                    Err(Triage::Fail(e)) => {
                        withdraw_both(withdrawal, lock_withdrawal, slack(timeout, wait)).await;
                        return Err(e);
                    }
                }
                withdrawal.disarm();
                let acquired = Acquired {
                    session: Arc::clone(&session),
                    node: own,
                    czxid,
                    heard_at: counted.sent,
                    sweep: lease_unsure,
                    listing: None,
                };
                // The guard owns the lease from here; then the internal
                // lock goes (in the background if this is cancelled).
                let held = guard(&sem.ctx, &sem.name, acquired, true, sem.hold)?;
                withdraw_now(lock_withdrawal, slack(timeout, wait)).await;
                return Ok(Some(held));
            }
            if wait == Wait::No {
                withdraw_both(withdrawal, lock_withdrawal, slack(timeout, wait)).await;
                return Ok(None);
            }
            tracing::debug!(
                name = %sem.name,
                count = counted.count,
                permits = sem.permits,
                "distlock semaphore full; waiting for a release"
            );
            if !watch_fired(ctx, counted.watcher, deadline).await? {
                withdraw_both(withdrawal, lock_withdrawal, slack(timeout, wait)).await;
                return Ok(None);
            }
            watch_noticed(ctx);
        }
    }
}
