//! The fair mutex: a queue of ephemeral sequential nodes (Curator's
//! `InterProcessMutex` names), each waiter watching only its predecessor.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use distlock_core::{Lock, LockGuard, Name, Result, Wait};

use crate::acquire::{acquire, Recipe};
use crate::context::Context;
use crate::layout::Kind;
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

    // Not an `async fn`: the skeleton's future itself, no async body
    // around it (a waiting task keeps this).
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
        Box::pin(acquire(self, wait, move |wait| {
            enter_queue(&self.ctx, &self.dir, "lock", &self.ctx.owner_data, wait)
        }))
    }
}

impl Recipe for FairMutex {
    fn ctx(&self) -> &Arc<Context> {
        &self.ctx
    }

    fn name(&self) -> &Name {
        &self.name
    }

    fn dir(&self) -> &str {
        &self.dir
    }

    fn kind(&self) -> Kind {
        Kind::Fair
    }

    fn hold(&self) -> Option<std::time::Duration> {
        self.hold
    }
}
