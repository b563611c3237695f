//! The node layout of every kind of primitive under a lock's directory.

/// The unfair lock's node under the lock's directory.
pub(crate) const UNFAIR_NODE: &str = "_unfair_lock";
/// Curator's `READ_LOCK_NAME`.
pub(crate) const READ: &str = "__READ__";
/// Curator's `WRITE_LOCK_NAME` (the same length as `READ`).
pub(crate) const WRITE: &str = "__WRIT__";
/// The semaphore's internal lock's directory under the lock's.
pub(crate) const LOCKS: &str = "locks";
/// The semaphore's lease nodes' directory under the lock's.
pub(crate) const LEASES: &str = "leases";
