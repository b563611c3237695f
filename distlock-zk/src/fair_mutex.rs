//! The fair mutex: a queue of ephemeral sequential nodes (Curator's
//! `InterProcessMutex` names), each waiter watching only its predecessor.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use distlock_core::{Lock, LockGuard, Name, Result, Wait};
use futures::FutureExt;

use crate::context::Context;
use crate::kinds::{settle, Settled};
use crate::layout::Kind;
use crate::lease::guard;
use crate::queue::enter_queue;

/// A ZooKeeper fair mutex.
pub(crate) struct FairMutex {
    pub(crate) ctx: Arc<Context>,
    pub(crate) name: Name,
    /// Shared by every acquisition's withdraw (one copy, not one each).
    pub(crate) dir: Arc<str>,
    /// The lease's `max_hold`, if any.
    pub(crate) hold: Option<std::time::Duration>,
}

impl fmt::Debug for FairMutex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FairMutex")
            .field("path", &self.dir)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Lock for FairMutex {
    fn name(&self) -> &Name {
        &self.name
    }

    fn backend(&self) -> &'static str {
        "zookeeper"
    }

    fn kind(&self) -> distlock_core::PrimitiveKind {
        distlock_core::PrimitiveKind::FairMutex
    }

    // Not an `async fn`: the queue's future with the guard made in place
    // (`map`), no async body around it (a waiting task keeps this).
    fn acquire<'life0, 'async_trait>(
        &'life0 self,
        wait: Wait,
    ) -> Pin<Box<dyn Future<Output = Result<Option<LockGuard>>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        // The queue checks for a runtime at its first poll (a future made
        // outside one and run inside one, `block_on(lock.lock())`, works).
        let queued = enter_queue(&self.ctx, &self.dir, "lock", &self.ctx.owner_data, wait);
        // The queue's head then passes the kind check (`kinds`): boxed, so a
        // waiter in the queue keeps none of it.
        Box::pin(queued.then(move |acquired| {
            Box::pin(async move {
                let mut acquired = acquired?;
                loop {
                    let Some(a) = acquired else {
                        return Ok(None);
                    };
                    match settle(&self.ctx, &self.name, &self.dir, Kind::Fair, a, wait).await? {
                        Settled::Held(a) => {
                            return guard(&self.ctx, &self.name, a, true, self.hold).map(Some)
                        }
                        Settled::NotAcquired => return Ok(None),
                        Settled::Again => {}
                    }
                    acquired =
                        enter_queue(&self.ctx, &self.dir, "lock", &self.ctx.owner_data, wait)
                            .await?;
                }
            })
        }))
    }
}
