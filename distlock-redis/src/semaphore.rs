//! The Redis counting semaphore: the [queued](crate::queued) acquisition
//! with `{lock}:sem:…` keys and the `sem_*`
//! scripts.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use distlock_core::{LeaseOptions, Lock, LockGuard, Name, Result, Semaphore, Wait};

use crate::context::Context;
use crate::keys::{Claim, Recipe};
use crate::queued::Queued;

/// A Redis semaphore of `permits`.
struct RedisSemaphore {
    inner: Queued,
    permits: u32,
}

impl fmt::Debug for RedisSemaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSemaphore")
            .field("name", &self.inner.recipe.name)
            .field("permits", &self.permits)
            .field("holders", &self.inner.recipe.keys.holders)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Lock for RedisSemaphore {
    fn name(&self) -> &Name {
        self.inner.name()
    }

    fn backend(&self) -> &'static str {
        "redis"
    }

    fn kind(&self) -> distlock_core::PrimitiveKind {
        distlock_core::PrimitiveKind::Semaphore
    }

    async fn acquire(&self, wait: Wait) -> Result<Option<LockGuard>> {
        self.inner.acquire(wait).await
    }
}

impl Semaphore for RedisSemaphore {
    fn permits(&self) -> u32 {
        self.permits
    }
}

/// The Redis counting semaphore `name` of `permits` (checked by the
/// provider: at least 1).
///
/// # Errors
///
/// None today; the signature leaves room for refused options.
pub(crate) fn semaphore(
    shared: &Arc<Context>,
    name: Name,
    permits: u32,
    lease: LeaseOptions,
) -> Result<Arc<dyn Semaphore>> {
    Ok(Arc::new(RedisSemaphore {
        inner: Queued {
            shared: Arc::clone(shared),
            recipe: Arc::new(Recipe::new(
                &shared.options.prefix,
                name,
                Claim::Permit(permits),
            )),
            lease,
        },
        permits,
    }))
}
