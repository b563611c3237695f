//! What a backend hands the core for a lease it just acquired.

use std::sync::Arc;

use tokio::time::Instant;

use super::lifecycle::Lifecycle;
use super::signal::LeaseSignal;
use super::terms::LeaseTerms;
use crate::name::Name;

/// What a backend hands the core to build a [`LockGuard`](crate::LockGuard).
#[derive(Debug)]
pub struct GuardParts {
    /// The lock's name.
    pub name: Name,
    /// The fencing token of this acquisition.
    pub fencing_token: u64,
    /// The lease's status cell; the backend may keep a clone to report loss.
    pub signal: LeaseSignal,
    /// The lease's terms.
    pub terms: LeaseTerms,
    /// When the acquire request was sent: the lease counts from here.
    pub acquired_at: Instant,
    /// The provider the lease belongs to; `close()` there ends it.
    pub lifecycle: Arc<Lifecycle>,
}
