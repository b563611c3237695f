//! The ZooKeeper counting semaphore, in Curator's InterProcessSemaphoreV2 layout.

use std::sync::Arc;

use distlock_core::{Error, Name, Result, Semaphore};

use crate::provider::Shared;

/// The ZooKeeper counting semaphore, in Curator's InterProcessSemaphoreV2 layout.
///
/// # Errors
///
/// Not built yet.
pub(crate) fn semaphore(
    shared: &Arc<Shared>,
    name: Name,
    dir: String,
    permits: u32,
) -> Result<Arc<dyn Semaphore>> {
    let _ = (shared, name, dir, permits);
    Err(Error::Unsupported {
        backend: "zookeeper",
        what: "the semaphore yet",
    })
}
