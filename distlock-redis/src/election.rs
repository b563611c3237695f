//! Redis leader election.

use std::sync::Arc;

use distlock_core::{Election, Error, LeaseOptions, Name, Result};

use crate::provider::Shared;

/// Redis leader election.
///
/// # Errors
///
/// Not built yet.
pub(crate) fn election(
    shared: &Arc<Shared>,
    name: Name,
    lease: LeaseOptions,
) -> Result<Arc<dyn Election>> {
    let _ = (shared, name, lease);
    Err(Error::Unsupported {
        backend: "redis",
        what: "leader election yet (use the ZooKeeper or in-process election)",
    })
}
