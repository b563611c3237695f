//! The Redis counting semaphore.

use std::sync::Arc;

use distlock_core::{Error, LeaseOptions, Name, Result, Semaphore};

use crate::provider::Shared;

/// The Redis counting semaphore.
///
/// # Errors
///
/// Not built yet.
pub(crate) fn semaphore(
    shared: &Arc<Shared>,
    name: Name,
    permits: u32,
    lease: LeaseOptions,
) -> Result<Arc<dyn Semaphore>> {
    let _ = (shared, name, lease, permits);
    Err(Error::Unsupported {
        backend: "redis",
        what: "the semaphore yet",
    })
}
