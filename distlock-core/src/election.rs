//! Leader election: campaign for leadership, observe who leads.

use std::fmt;
use std::future::Future;

use async_trait::async_trait;
use futures::stream::BoxStream;

use crate::error::{Error, Result};
use crate::guard::{LeaseWatch, LockGuard};
#[doc(inline)]
pub use crate::inspect::LeaderInfo;
use crate::lease::status::{LeaseStatus, LostReason};
use crate::name::Name;

/// Read a [`LeaderStream`] with it: `stream.next().await`.
#[doc(no_inline)]
pub use futures::StreamExt;

/// A stream of the current leader, starting with the leader at subscription
/// time and yielding each change (`None`: no leader right now).
pub type LeaderStream = BoxStream<'static, Result<Option<LeaderInfo>>>;

/// A named leader election.
///
/// One candidate at a time is leader; its [`Leadership`] is a lease like a
/// lock's, its term a fencing token. [`Election::observe`] is a
/// [`Stream`](futures::Stream): read it with [`StreamExt`] (re-exported
/// here).
///
/// ```
/// # mod distlock {
/// #     pub use distlock_core::*;
/// #     pub async fn connect(_url: &str) -> Result<std::sync::Arc<dyn Provider>> {
/// #         Ok(std::sync::Arc::new(mem::MemProvider::new()))
/// #     }
/// # }
/// use distlock::election::StreamExt;
/// use distlock::Provider;
///
/// # async fn schedule(_term: u64) {}
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
/// let locks = distlock::connect("mem://").await?;
/// let election = locks.election("scheduler")?;
/// let mut leaders = election.observe(); // first the leader now: nobody
/// assert_eq!(leaders.next().await.transpose()?, Some(None));
///
/// let leadership = election.campaign("host-a").await?; // waits until elected
/// let seen = leaders.next().await.transpose()?.flatten();
/// assert_eq!(seen.map(|l| l.id), Some("host-a".to_owned()));
/// tokio::select! {
///     () = schedule(leadership.term()) => leadership.resign().await?,
///     reason = leadership.lost() => eprintln!("no longer leader: {reason}"),
/// }
/// # Ok(()) }
/// ```
#[async_trait]
pub trait Election: Send + Sync + fmt::Debug {
    /// The election's name.
    fn name(&self) -> &Name;

    /// Campaigns as `candidate` and waits until elected.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for a candidate id that is empty, longer
    /// than 256 bytes or holds control characters; backend errors.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: a dropped campaign withdraws the candidacy.
    async fn campaign(&self, candidate: &str) -> Result<Leadership>;

    /// The current leader, if any.
    ///
    /// # Errors
    ///
    /// Backend errors.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: it only reads.
    async fn leader(&self) -> Result<Option<LeaderInfo>>;

    /// Observes the leader as it changes: first the leader now, then each
    /// change. An observer that falls behind sees the latest leader, not
    /// every one in between (as a ZooKeeper watch would). The stream holds no
    /// candidacy.
    fn observe(&self) -> LeaderStream;
}

/// Checks a candidate id: 1 to 256 bytes, no control characters.
///
/// # Errors
///
/// [`Error::InvalidOptions`] when it breaks that rule.
#[doc(hidden)] // for backends: `distlock_core::backend::validate_candidate`
pub fn validate_candidate(candidate: &str) -> Result<()> {
    if candidate.is_empty() || candidate.len() > 256 || candidate.chars().any(char::is_control) {
        return Err(Error::InvalidOptions(
            "candidate id must be 1 to 256 bytes without control characters".into(),
        ));
    }
    Ok(())
}

/// Proof of leadership: a lease like a lock's, with the candidate id.
#[must_use = "dropping the leadership resigns at once"]
pub struct Leadership {
    guard: LockGuard,
    candidate: String,
}

impl Leadership {
    /// Wraps the guard of the election's lease.
    #[doc(hidden)] // for backends (see `distlock_core::backend`), not users
    pub fn new(guard: LockGuard, candidate: impl Into<String>) -> Self {
        Leadership {
            guard,
            candidate: candidate.into(),
        }
    }

    /// The id this leader campaigned with.
    #[must_use]
    pub fn candidate(&self) -> &str {
        &self.candidate
    }

    /// The term: a fencing token strictly greater than any earlier leader's.
    #[must_use]
    pub fn term(&self) -> u64 {
        self.guard.fencing_token()
    }

    /// Whether leadership is (as far as the library knows) still held.
    #[must_use]
    pub fn is_leader(&self) -> bool {
        self.guard.is_held()
    }

    /// The lease's current status.
    #[must_use]
    pub fn status(&self) -> LeaseStatus {
        self.guard.status()
    }

    /// The instant until which leadership is known held (see
    /// [`LockGuard::held_until`]): what the leader runs must stop by then.
    #[must_use]
    pub fn held_until(&self) -> Option<std::time::Instant> {
        self.guard.held_until()
    }

    /// Resolves when leadership is lost (see [`LockGuard::lost`]).
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: it only observes.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.guard.lost()
    }

    /// Resolves when someone asks this leader to step down
    /// ([`Provider::request_release`](crate::Provider::request_release)
    /// with [`PrimitiveKind::Election`](crate::PrimitiveKind::Election),
    /// `distlock unlock --kind election`): hand over at a safe point with
    /// [`Leadership::resign`]. Leadership stays held until then (see
    /// [`LockGuard::release_requested`]).
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: it only observes.
    pub fn release_requested(&self) -> impl Future<Output = ()> + Send + 'static {
        self.guard.release_requested()
    }

    /// Whether someone asked this leader to step down.
    #[must_use]
    pub fn is_release_requested(&self) -> bool {
        self.guard.is_release_requested()
    }

    /// An owned view of the lease status.
    #[must_use]
    pub fn watch(&self) -> LeaseWatch {
        self.guard.watch()
    }

    /// Gives up leadership; the next candidate is elected.
    ///
    /// # Errors
    ///
    /// As [`LockGuard::release`].
    ///
    /// # Cancellation safety
    ///
    /// As [`LockGuard::release`].
    pub async fn resign(self) -> Result<()> {
        self.guard.release().await
    }
}

impl crate::metrics::Acquisition for Leadership {
    fn acquired(&self) -> bool {
        true
    }

    fn count_hold(&self, labels: crate::metrics::Labels) {
        self.guard.attach_metrics(labels);
    }
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("candidate", &self.candidate)
            .field("guard", &self.guard)
            .finish()
    }
}
