//! A held ZooKeeper lease: our ephemeral node in our session, its release
//! and its watch (the crate docs, "Leases"); and [`Acquired`], the node an
//! acquisition hands to the guard.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::backend::{with_timeout, GuardParts, LeaseBackend, LeaseSignal, LeaseTerms};
use distlock_core::{Error, LockGuard, LostReason, Name, Result};
use tokio::sync::watch;
use tokio::time::Instant;
use zookeeper_client::EventType;

use crate::context::Context;
use crate::error::{from_zk, session_ended};
use crate::layout;
use crate::node::{
    acls, delete_if_ours, delete_retrying, sweep_in_background, token, WHILE_SESSION_LIVES,
};
use crate::session::{Session, Status};

/// A lease just acquired: our node in our session.
pub(crate) struct Acquired {
    pub(crate) session: Arc<Session>,
    pub(crate) node: String,
    pub(crate) czxid: i64,
    /// When the request whose answer showed us the holder was sent: the
    /// server heard the session at or after this instant.
    pub(crate) heard_at: Instant,
    /// A create of this acquisition had an unknown outcome in this
    /// session: a late one may still land, so the release also deletes
    /// every node with our prefix ([`sweep_in_background`]).
    pub(crate) sweep: bool,
    /// The directory's children as that answer listed them, after our node
    /// was created (for the kind check, `kinds`), if it was a listing.
    pub(crate) listing: Option<Vec<String>>,
}

/// One held lease.
pub(crate) struct ZkLease {
    /// Keeps the provider (and so its session) alive while the guard lives.
    ctx: Arc<Context>,
    /// Not owned: closing the provider closes the session even while a
    /// guard is still around.
    session: Weak<Session>,
    name: Name,
    node: String,
    czxid: i64,
    /// The node's path is ours alone (a queue node): delete it without
    /// looking first. A shared path (the unfair lock) is checked first.
    own_path: bool,
    /// Also delete every node with our node's prefix at the release (a
    /// create of unknown outcome of this acquisition may land late).
    sweep: bool,
    /// The lease's status: a lease known lost (its node deleted) never
    /// takes the one-request release.
    signal: LeaseSignal,
    /// The one-request release's delete was sent once: a second run of the
    /// release (after the first was dropped half-way, or gave up) must not
    /// send another. That first delete may land only now, and the next
    /// holder may create the node at version 0 at once: a second delete at
    /// version 0 would delete theirs. Later runs look first (the check of
    /// czxid and owner, sent after the first delete on the same session, is
    /// answered after it).
    quick_sent: AtomicBool,
    /// The unfair hold's request node (`layout::unfair_request` of our
    /// `czxid`, beside our node): a request to release made for this hold
    /// and no other. `None` for a queue node (asked on its own data).
    request: Option<String>,
}

impl ZkLease {
    fn not_held(&self) -> Error {
        Error::not_held(self.name.as_str())
    }

    fn session(&self) -> Result<Arc<Session>> {
        // Gone: the provider was closed or the session ended (and its
        // ephemeral node with it).
        self.session.upgrade().ok_or_else(|| self.not_held())
    }

    /// Whether the node is still the one we created, in our session; with
    /// its version.
    async fn ours(&self, session: &Session) -> Result<Option<i32>> {
        let timeout = self.ctx.timeout;
        match with_timeout(
            "check lease",
            timeout,
            session.client.check_stat(&self.node),
        )
        .await?
        {
            Ok(Some(stat)) if stat.czxid == self.czxid && stat.ephemeral_owner == session.id => {
                Ok(Some(stat.version))
            }
            Ok(_) => Ok(None),
            Err(e) if session_ended(&e) => Ok(None),
            Err(e) => Err(from_zk("check lease", timeout, e)),
        }
    }
}

impl ZkLease {
    /// The unfair lock's release in one request: a delete at version 0
    /// (our node's data is set after its create only by a request to
    /// release, so its version stays 0 unless we were asked), on our
    /// session (a session that ended cannot delete). When that cannot
    /// tell, the checked delete looks first: a node at another version is
    /// not the one we created, or ours asked to release (a request we have
    /// not heard yet); a lost answer may have deleted it.
    ///
    /// A lease known lost, or known asked to release, never takes this
    /// path. The one case left that the
    /// version cannot tell apart: an operator's force-release deleted our
    /// node and another client created the lock node again just before
    /// this delete, before our node watch reported the deletion: the delete
    /// then deletes theirs. That
    /// client's guard sees its node deleted and fires `lost()` (its token
    /// is below the next holder's), as after any force-release; the
    /// operations docs warn of it. Without a force-release nobody but our
    /// session deletes our ephemeral node.
    async fn delete_at_version_zero(&self, session: &Session) -> Quick {
        if matches!(self.signal.status(), distlock_core::LeaseStatus::Lost(_)) {
            // Our node was deleted (the watch saw it): whatever is at the
            // path now is someone else's.
            return Quick::NotAtZero;
        }
        if self.signal.is_release_requested() {
            // Our node's data was written since its create: not at 0.
            return Quick::NotAtZero;
        }
        if self.quick_sent.swap(true, Ordering::SeqCst) {
            return Quick::Unknown;
        }
        let timeout = self.ctx.timeout;
        match with_timeout(
            "delete",
            timeout,
            session.client.delete(&self.node, Some(0)),
        )
        .await
        {
            Ok(Ok(())) => Quick::Done(Ok(true)),
            Ok(Err(zookeeper_client::Error::NoNode)) => Quick::Done(Ok(false)),
            Ok(Err(e)) if session_ended(&e) => Quick::Done(Ok(false)),
            Ok(Err(zookeeper_client::Error::BadVersion)) => Quick::NotAtZero,
            _ => Quick::Unknown,
        }
    }

    fn owned(&self, deleted: bool) -> Result<()> {
        if deleted {
            Ok(())
        } else {
            Err(self.not_held())
        }
    }
}

/// What the one-request release found.
enum Quick {
    /// Deleted (`true`), or not there / not ours any more (`false`).
    Done(Result<bool>),
    /// A node at another version: not the one we created.
    NotAtZero,
    /// No answer: the delete may have happened.
    Unknown,
}

#[async_trait]
impl LeaseBackend for ZkLease {
    async fn renew(&self, _session_timeout: Duration) -> Result<()> {
        // A session lease is not renewed, it is confirmed: the answer proves
        // the server heard the session after this request was sent. The
        // `sync` goes through the leader first, so a follower cut off from
        // the leader (which would still answer reads) cannot confirm a
        // session the leader has expired.
        let session = self.session()?;
        let timeout = self.ctx.timeout;
        match with_timeout("sync", timeout, session.client.sync(&self.node)).await? {
            Ok(()) | Err(zookeeper_client::Error::NoNode) => {}
            Err(e) if session_ended(&e) => return Err(self.not_held()),
            Err(e) => return Err(from_zk("sync", timeout, e)),
        }
        // Sent with the check of our node, no round trip of its own: the
        // unfair hold hears a request made for it here, every timeout/4.
        let request = self
            .request
            .as_deref()
            .filter(|_| !self.signal.is_release_requested())
            .map(|request| session.client.check_stat(request));
        match self.ours(&session).await? {
            Some(version) => {
                // The fallback for a request to release whose watch event
                // was missed: any data written on our node after its create
                // is one (ours or Curator's `Revoker`), and this check comes
                // every timeout/4 at no extra cost.
                if version > 0 {
                    self.signal.request_release();
                }
                if let Some(request) = request {
                    if let Ok(Ok(Some(_))) = with_timeout("check lease", timeout, request).await {
                        self.signal.request_release();
                    }
                }
                Ok(())
            }
            None => Err(self.not_held()),
        }
    }

    async fn release(&self) -> Result<()> {
        let session = self.session()?;
        let timeout = self.ctx.timeout;
        let deleted = if self.own_path {
            // A queue node's path is ours alone: no check needed.
            delete_retrying(&session, &self.node, None, timeout).await
        } else {
            let sent = match self.delete_at_version_zero(&session).await {
                Quick::Done(done) => return done.and_then(|d| self.owned(d)),
                Quick::NotAtZero => false,
                Quick::Unknown => true,
            };
            let (czxid, owner) = (self.czxid, session.id);
            let is_ours = move |_: &[u8], stat: &zookeeper_client::Stat| {
                stat.czxid == czxid && stat.ephemeral_owner == owner
            };
            // Gone after a delete whose answer was lost: ours did it.
            delete_if_ours(&session, &self.node, is_ours, timeout, timeout)
                .await
                .map(|deleted| deleted || sent)
        };
        if self.sweep {
            // After our own delete, so that it cannot find our node gone.
            sweep_in_background(Arc::clone(&session), &self.node, timeout);
        }
        if let Some(request) = self
            .request
            .clone()
            .filter(|_| self.signal.is_release_requested())
        {
            // Heard and done with: the request node would otherwise stay
            // until its maker's session ends. Best effort (another user's
            // node under digest ACLs stays until then).
            let session = Arc::clone(&session);
            tokio::spawn(async move {
                let delete = session.client.delete(&request, None);
                let _ = with_timeout("delete", timeout, delete).await;
            });
        }
        match deleted {
            Ok(true) => Ok(()),
            Ok(false) => Err(self.not_held()),
            Err(e) => {
                // Keep trying in the background while the session may live:
                // a node left behind would hold the lock until it ends.
                let (node, own_path, czxid) = (self.node.clone(), self.own_path, self.czxid);
                let budget = WHILE_SESSION_LIVES;
                tokio::spawn(async move {
                    if own_path {
                        delete_retrying(&session, &node, None, budget).await
                    } else {
                        let owner = session.id;
                        let is_ours = move |_: &[u8], stat: &zookeeper_client::Stat| {
                            stat.czxid == czxid && stat.ephemeral_owner == owner
                        };
                        delete_if_ours(&session, &node, is_ours, timeout, budget).await
                    }
                });
                Err(e)
            }
        }
    }

    fn response_timeout(&self) -> Option<Duration> {
        Some(self.ctx.timeout)
    }
}

/// Turns an acquired node into a guard and starts watching it.
pub(crate) fn guard(
    ctx: &Arc<Context>,
    name: &Name,
    acquired: Acquired,
    own_path: bool,
    hold: Option<std::time::Duration>,
) -> Result<LockGuard> {
    let signal = LeaseSignal::new();
    if let Some(limit) = hold {
        // `max_hold`: the core ends the hold at the limit and the watchdog
        // deletes the node.
        signal.set_hold_limit(
            acquired
                .heard_at
                .checked_add(limit)
                .unwrap_or(acquired.heard_at),
        );
    }
    let fencing_token = token(acquired.czxid);
    let dir = (!own_path)
        .then(|| acquired.node.rsplit_once('/'))
        .flatten()
        .map(|(dir, _)| dir.to_owned());
    let request = dir
        .as_ref()
        .map(|dir| format!("{dir}/{}", layout::unfair_request(acquired.czxid)));
    if let Some(dir) = dir {
        tokio::spawn(hear_requests(
            Arc::downgrade(&acquired.session),
            (dir, layout::unfair_request(acquired.czxid)),
            ctx.authenticated,
            signal.clone(),
        ));
    }
    let backend = Arc::new(ZkLease {
        request,
        ctx: Arc::clone(ctx),
        session: Arc::downgrade(&acquired.session),
        name: name.clone(),
        node: acquired.node.clone(),
        czxid: acquired.czxid,
        own_path,
        sweep: acquired.sweep,
        signal: signal.clone(),
        quick_sent: AtomicBool::new(false),
    });
    let parts = GuardParts {
        name: name.clone(),
        // A negative czxid cannot happen; if it ever did, the guard is
        // built with token 0 and released at once below.
        fencing_token: *fencing_token.as_ref().unwrap_or(&0),
        signal: signal.clone(),
        terms: LeaseTerms::Session {
            timeout: acquired.session.timeout(),
        },
        acquired_at: acquired.heard_at,
        lifecycle: Arc::clone(&ctx.lifecycle),
    };
    let guard = LockGuard::new(parts, backend)?;
    fencing_token?;
    // A queue node's path is ours alone, so its watch can wait: nobody
    // can create another node there. The unfair mutex's path is shared: a
    // node deleted by someone else may be re-created by the next holder at
    // once, and a quick release (a delete at version 0) would delete that
    // one, so its watch starts at once.
    let watch_after = if own_path {
        WATCH_AFTER
    } else {
        Duration::ZERO
    };
    watch(
        Arc::downgrade(&acquired.session),
        acquired.session.status.clone(),
        (acquired.node, acquired.czxid),
        watch_after,
        signal,
    );
    Ok(guard)
}

/// Follows the unfair hold's request node (`request`, beside our node in
/// `dir`) with a children watch on `dir`, from [`WATCH_AFTER`] into the
/// hold (a shorter hold costs no request; a request made before the watch
/// is set shows in its listing): a request is heard as soon as it is made,
/// not only at the next session check. A heard request's node is made our
/// session's (deleted and created again in one multi), so it lasts as long
/// as the hold, not only as long as the asking session (a `distlock
/// unlock` that exits), and `inspect` keeps showing the request. Ends with
/// the hold: the children watch fires at our own release's delete, so it
/// is never dropped unfired (no `removeWatches`).
async fn hear_requests(
    session: Weak<Session>,
    (dir, request): (String, String),
    authenticated: bool,
    signal: LeaseSignal,
) {
    tokio::time::sleep(WATCH_AFTER).await;
    let path = format!("{dir}/{request}");
    let mut ours = false;
    loop {
        if !signal.status().is_active() {
            return;
        }
        let Some(live) = session.upgrade() else {
            return;
        };
        let listed = live.client.list_and_watch_children(&dir).await;
        let watcher = match listed {
            Ok((children, watcher)) => {
                if !ours && children.contains(&request) {
                    signal.request_release();
                    ours = adopt(&live, &path, authenticated).await;
                }
                watcher
            }
            Err(e) if session_ended(&e) => return,
            // The directory is gone: so is our node; the node watch says so.
            Err(zookeeper_client::Error::NoNode) => return,
            Err(_) => {
                drop(live);
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        drop(live);
        match crate::wait::event_of(watcher).await.map(|e| e.event_type) {
            Some(EventType::Session) | None => return,
            Some(_) => {}
        }
    }
}

/// Makes the request node at `path` our session's, as one multi (a delete
/// and a create), or creates it if it went meanwhile (its maker's session
/// ended). Best effort: `false` when it could not (another user's node
/// under digest ACLs stays its maker's).
async fn adopt(session: &Session, path: &str, authenticated: bool) -> bool {
    let mode = zookeeper_client::CreateMode::Ephemeral.with_acls(acls(authenticated));
    let mut multi = session.client.new_multi_writer();
    let built = multi
        .add_delete(path, None)
        .and_then(|()| multi.add_create(path, b"", &mode));
    if built.is_err() {
        return false;
    }
    match multi.commit().await {
        Ok(_) => true,
        Err(_) => session.client.create(path, b"", &mode).await.is_ok(),
    }
}

/// How long a released lease's node watch waits for the release's delete
/// to fire it.
const RELEASE_LINGER: Duration = Duration::from_secs(2);

/// How long a hold of a queue node lasts before the node is watched (a
/// deletion by someone else, such as a force-release, is reported at most
/// this late).
const WATCH_AFTER: Duration = Duration::from_millis(20);

/// Watches the session and the node for as long as the lease is active.
fn watch(
    session: Weak<Session>,
    mut status: watch::Receiver<Status>,
    (node, czxid): (String, i64),
    watch_after: Duration,
    signal: LeaseSignal,
) {
    tokio::spawn(async move {
        // A queue node is watched once the hold has lasted WATCH_AFTER: a
        // lock held for less (the common short critical section) costs no
        // watch request, and a deletion before the watch is set is seen by
        // the watch's own read (the node is gone: the path is never used
        // again), at most WATCH_AFTER late.
        let watching = AtomicBool::new(false);
        let deleted = async {
            if !watch_after.is_zero() {
                tokio::time::sleep(watch_after).await;
            }
            watching.store(true, Ordering::Relaxed);
            node_deleted(session, &node, czxid, &signal).await;
        };
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
                () = signal.ended() => {
                    // Released: the release is deleting the node now. The
                    // node watch is kept until that delete fires it (the
                    // server sends the event before the delete's reply), as
                    // a watcher dropped unfired costs a `removeWatches`
                    // request; bounded, for a release that does not delete.
                    if watching.load(Ordering::Relaxed) {
                        let _ = tokio::time::timeout(RELEASE_LINGER, &mut deleted).await;
                    }
                    return;
                }
                changed = status.changed() => {
                    if changed.is_err() && !status.borrow().is_dead() {
                        // The session's state task is gone without a final
                        // state: the deadline and the node watch are left.
                        tokio::select! {
                            () = signal.ended() => return,
                            () = &mut deleted => {
                                signal.lose(LostReason::Deleted);
                                return;
                            }
                        }
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
/// asked (session events are the state watch's business). Every read also
/// looks for a request to release on the node (data written after its
/// create, or `__REVOKE__`: `layout::asked`) and tells `signal`: the data
/// watch fires on a request's `setData` as on the delete, so hearing one
/// costs no request beyond the watch's own read.
///
/// The watch is a data watch (`getData`), not an `exists` watch: on a node
/// that is gone already (a lease released at once) `getData` fails and
/// leaves no watch, where `exists` would leave one for the node's creation,
/// which zookeeper-client removes with one more request when dropped.
///
/// A node at the path that is not ours (another `czxid`: ours was deleted
/// and someone created the path again) counts as deleted.
async fn node_deleted(session: Weak<Session>, node: &str, czxid: i64, signal: &LeaseSignal) {
    loop {
        let asked = match session.upgrade() {
            // Held only for the request: the watch outlives no session.
            Some(live) => live.client.get_and_watch_data(node).await,
            None => return std::future::pending().await,
        };
        match asked {
            Err(zookeeper_client::Error::NoNode) => return,
            Ok((_, stat, _)) if stat.czxid != czxid => return,
            Ok((data, stat, watcher)) => {
                if layout::asked(&data, stat.version) {
                    signal.request_release();
                }
                match crate::wait::event_of(watcher).await.map(|e| e.event_type) {
                    Some(EventType::NodeDeleted) => return,
                    // The client gone: the session's end is the state
                    // watch's business.
                    Some(EventType::Session) | None => std::future::pending::<()>().await,
                    Some(_) => {}
                }
            }
            Err(e) if session_ended(&e) => std::future::pending::<()>().await,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}
