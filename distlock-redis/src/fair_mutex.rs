//! The Redis fair (FIFO) mutex: the [fair queue](crate::fair_queue) on the
//! plain mutex's lock key and fencing counter.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use distlock_core::{LeaseOptions, Lock, LockGuard, Name, Result, Wait};
use futures::future::BoxFuture;

use crate::context::Context;
use crate::fair_queue::FairQueue;
use crate::keys::Keys;

/// The Redis fair (FIFO) mutex.
///
/// # Errors
///
/// None today; the signature leaves room for checks of the lease.
pub(crate) fn fair_mutex(
    shared: &Arc<Context>,
    name: Name,
    lease: LeaseOptions,
) -> Result<Arc<dyn Lock>> {
    Ok(Arc::new(RedisFairMutex {
        queue: FairQueue {
            shared: Arc::clone(shared),
            keys: Arc::new(Keys::lock(&shared.options.prefix, &name)),
            name,
            lease,
        },
    }))
}

/// A Redis fair mutex.
pub(crate) struct RedisFairMutex {
    queue: FairQueue,
}

impl fmt::Debug for RedisFairMutex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisFairMutex")
            .field("name", &self.queue.name)
            .field("key", &self.queue.keys.lock)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Lock for RedisFairMutex {
    fn name(&self) -> &Name {
        &self.queue.name
    }

    fn backend(&self) -> &'static str {
        "redis"
    }

    fn kind(&self) -> distlock_core::PrimitiveKind {
        distlock_core::PrimitiveKind::FairMutex
    }

    // Not an `async fn`: the queue's future, boxed as it is, with no
    // second body around it (a waiting task keeps this future).
    fn acquire<'a, 'b>(&'a self, wait: Wait) -> BoxFuture<'b, Result<Option<LockGuard>>>
    where
        'a: 'b,
        Self: 'b,
    {
        Box::pin(self.queue.acquire(wait, None))
    }
}
