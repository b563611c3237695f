//! What the provider hands every primitive: its sessions, its options and
//! its counters, and the provider's live session for an acquisition.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use distlock_core::backend::{CleanupGuard, Lifecycle};
use distlock_core::{Result, Wait};
use tokio::time::Instant;

use crate::session::{Session, Sessions};

/// Counters for tests and benches.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    /// Watch notifications that woke a waiter.
    pub(crate) watch_events: AtomicU64,
}

/// What every primitive of one provider shares.
pub(crate) struct Context {
    pub(crate) sessions: Sessions,
    pub(crate) authenticated: bool,
    pub(crate) timeout: Duration,
    pub(crate) stats: Stats,
    pub(crate) lifecycle: Arc<Lifecycle>,
    /// The owner identity stored with every hold (`label@host:pid`).
    pub(crate) owner: String,
    /// The data of our lock nodes (`ops::owner_data` of `owner`), made
    /// once: a waiting acquisition borrows it.
    pub(crate) owner_data: Vec<u8>,
}
/// The provider's live session, for an acquisition that may wait: a
/// retryable failure to open one (the ensemble unreachable for now, after
/// our last session expired) is retried, with a pause that doubles from
/// 50 ms to 1 s, until the deadline, like any other retryable error while
/// waiting; opening is bounded by the deadline too. `Ok(None)`: the
/// deadline passed. A try ([`Wait::No`]) fails at once.
///
/// # Errors
///
/// [`Error::Closed`], a non-retryable error, or any error for a try.
pub(crate) async fn session_for(ctx: &Context, wait: Wait) -> Result<Option<Arc<Session>>> {
    // A try opens a session as it must: its "deadline" is now.
    let deadline = match wait {
        Wait::No => None,
        other => other.deadline(),
    };
    let mut pause = Duration::from_millis(50);
    loop {
        ctx.lifecycle.check_open()?;
        let opening = ctx.sessions.get();
        let opened = match deadline {
            Some(d) => match tokio::time::timeout_at(d, opening).await {
                Ok(opened) => opened,
                Err(_) => return Ok(None),
            },
            None => opening.await,
        };
        match opened {
            Ok(session) => return Ok(Some(session)),
            Err(e) if wait != Wait::No && e.is_retryable() => {
                tracing::debug!(error = %e, "distlock zookeeper: no session yet; retrying");
                let until = Instant::now() + pause;
                if deadline.is_some_and(|d| d <= until) {
                    return Ok(None);
                }
                tokio::time::sleep_until(until).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            Err(e) => return Err(e),
        }
    }
}

/// The session ended and took every ephemeral node of ours with it:
/// nothing is left to clean up, and the caller starts over on a new
/// session.
pub(crate) async fn start_over(
    ctx: &Context,
    session: &Arc<Session>,
    withdrawal: &mut CleanupGuard,
) {
    withdrawal.disarm();
    ctx.sessions.ended(session).await;
}
