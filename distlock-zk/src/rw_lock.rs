//! The ZooKeeper read-write lock, in Curator's InterProcessReadWriteLock layout.

use std::sync::Arc;

use distlock_core::{Error, Name, ReadWriteLock, Result};

use crate::provider::Shared;

/// The ZooKeeper read-write lock, in Curator's InterProcessReadWriteLock layout.
///
/// # Errors
///
/// Not built yet.
pub(crate) fn rw_lock(
    shared: &Arc<Shared>,
    name: Name,
    dir: String,
) -> Result<Arc<dyn ReadWriteLock>> {
    let _ = (shared, name, dir);
    Err(Error::Unsupported {
        backend: "zookeeper",
        what: "the read-write lock yet",
    })
}
