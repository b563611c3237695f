//! The Redis fair (FIFO) mutex.

use std::sync::Arc;

use distlock_core::{Error, LeaseOptions, Lock, Name, Result};

use crate::provider::Shared;

/// The Redis fair (FIFO) mutex.
///
/// # Errors
///
/// Not built yet.
pub(crate) fn fair_mutex(
    shared: &Arc<Shared>,
    name: Name,
    lease: LeaseOptions,
) -> Result<Arc<dyn Lock>> {
    let _ = (shared, name, lease);
    Err(Error::Unsupported {
        backend: "redis",
        what: "the fair mutex yet (use mutex, or the ZooKeeper or in-process fair mutex)",
    })
}
