//! How a lease stands: held, suspended, lost (and why) or released.

use std::fmt;

/// Why a lease was lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// The TTL ran out without a successful renewal.
    Expired,
    /// A renewal found that somebody else (or nobody) holds the lease.
    Taken,
    /// The session that owned the lease expired (ZooKeeper).
    SessionExpired,
    /// The session that owned the lease was closed.
    SessionClosed,
    /// The lease's node or key was deleted by someone else.
    Deleted,
    /// The lease was held for its [`LeaseOptions::max_hold`](crate::LeaseOptions::max_hold):
    /// the watchdog stopped renewing it and released it.
    MaxHold,
    /// The provider that acquired the lease was closed.
    ProviderClosed,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::Expired => "lease expired without renewal",
            LostReason::MaxHold => "lease held for its max_hold",
            // A renewal cannot tell which: it finds only that the hold is
            // not its own ("held by someone else" misled when it was
            // force-released and nobody held it).
            LostReason::Taken => {
                "lease is no longer ours (taken by another holder, or by none: force-released or expired)"
            }
            LostReason::SessionExpired => "session expired",
            LostReason::SessionClosed => "session closed",
            LostReason::Deleted => "lease was deleted",
            LostReason::ProviderClosed => "provider was closed",
        })
    }
}

/// The state of a lease as its holder knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseStatus {
    /// Held, and the last renewal (or the acquisition) succeeded.
    Held,
    /// Probably still held, but the server cannot be reached right now
    /// (renewals failing, ZooKeeper session disconnected). Stop writing if in
    /// doubt; [`LeaseStatus::Lost`] follows if it does not come back in time.
    ///
    /// On a TTL lease (Redis, in-process) a renewal makes the lease
    /// suspended when it fails for a transport reason, or when it is still
    /// unanswered a quarter of the renewal interval after it was sent (a
    /// stopped server), whichever comes first; the next confirmed renewal
    /// makes it held again. On ZooKeeper it is suspended while the session
    /// is disconnected.
    Suspended,
    /// Gone: the holder must stop working under it.
    Lost(LostReason),
    /// Released by its holder (by `release()` or by dropping the guard).
    Released,
}

impl LeaseStatus {
    /// Held or suspended.
    #[must_use]
    pub fn is_active(self) -> bool {
        matches!(self, LeaseStatus::Held | LeaseStatus::Suspended)
    }
}
