//! The Redis read-write lock: two sides over the [queued](crate::queued)
//! engine, `{lock}:rw:…` keys and the `rw_*` scripts.

use std::fmt;
use std::sync::Arc;

use distlock_core::{LeaseOptions, Lock, Name, ReadWriteLock, Result};

use crate::context::Context;
use crate::keys::{Claim, Recipe};
use crate::queued::Queued;

/// A Redis read-write lock: its two sides.
struct RedisRwLock {
    name: Name,
    read: Arc<Queued>,
    write: Arc<Queued>,
}

impl fmt::Debug for RedisRwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisRwLock")
            .field("name", &self.name)
            .field("writer", &self.write.recipe.keys.exclusive)
            .finish_non_exhaustive()
    }
}

impl ReadWriteLock for RedisRwLock {
    fn name(&self) -> &Name {
        &self.name
    }

    fn read(&self) -> Arc<dyn Lock> {
        Arc::clone(&self.read) as Arc<dyn Lock>
    }

    fn write(&self) -> Arc<dyn Lock> {
        Arc::clone(&self.write) as Arc<dyn Lock>
    }
}

/// The Redis read-write lock `name`.
///
/// # Errors
///
/// None today; the signature leaves room for refused options.
pub(crate) fn rw_lock(
    shared: &Arc<Context>,
    name: Name,
    lease: LeaseOptions,
) -> Result<Arc<dyn ReadWriteLock>> {
    let side = |side| {
        Arc::new(Queued {
            shared: Arc::clone(shared),
            recipe: Arc::new(Recipe::new(&shared.options.prefix, name.clone(), side)),
            lease,
        })
    };
    Ok(Arc::new(RedisRwLock {
        read: side(Claim::Read),
        write: side(Claim::Write),
        name,
    }))
}
