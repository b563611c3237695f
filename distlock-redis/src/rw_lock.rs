//! The Redis read-write lock.

use std::sync::Arc;

use distlock_core::{Error, LeaseOptions, Name, ReadWriteLock, Result};

use crate::provider::Shared;

/// The Redis read-write lock.
///
/// # Errors
///
/// Not built yet.
pub(crate) fn rw_lock(
    shared: &Arc<Shared>,
    name: Name,
    lease: LeaseOptions,
) -> Result<Arc<dyn ReadWriteLock>> {
    let _ = (shared, name, lease);
    Err(Error::Unsupported {
        backend: "redis",
        what: "the read-write lock yet",
    })
}
