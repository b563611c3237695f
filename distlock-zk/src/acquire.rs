//! The one acquisition of every lock recipe but the semaphore's: join by
//! the recipe's own rule until our node holds (the queue's, or the unfair
//! node's race), pass the kind check (`kinds::settle`), joining again when
//! it says so, and hand out the guard.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use distlock_core::{LockGuard, Name, Result, Wait};
use futures::FutureExt;

use crate::context::Context;
use crate::kinds::{settle, Settled};
use crate::layout::Kind;
use crate::lease::{guard, Acquired};

/// What the skeleton needs of a primitive: its context, its name, its
/// directory, its kind and the lease's `max_hold`.
pub(crate) trait Recipe: Sync {
    fn ctx(&self) -> &Arc<Context>;
    fn name(&self) -> &Name;
    fn dir(&self) -> &str;
    fn kind(&self) -> Kind;
    fn hold(&self) -> Option<Duration>;
}

/// Runs `join(wait)` (our node, holding by its recipe's rule, or `None`
/// when the wait ended without it), then the kind check, and joins again
/// when the check says so (the session ended, or our node was deleted
/// while it waited for the other half of the mutex family); the guard of
/// the node that passes.
///
/// Not an `async fn`: the first join's future with the rest chained on it
/// (boxed), so a waiter in the queue keeps only that future, `recipe` and
/// `join` (one pointer each, as a closure over the primitive).
///
/// Cancellation safe when `join` is: the kind check deletes a node it does
/// not give back.
pub(crate) fn acquire<'a, P, J, F>(
    recipe: &'a P,
    wait: Wait,
    mut join: J,
) -> impl Future<Output = Result<Option<LockGuard>>> + Send + 'a
where
    P: Recipe,
    J: FnMut(Wait) -> F + Send + 'a,
    F: Future<Output = Result<Option<Acquired>>> + Send + 'a,
{
    join(wait).then(move |first| {
        Box::pin(async move {
            let (ctx, name, kind) = (recipe.ctx(), recipe.name(), recipe.kind());
            let mut acquired = first?;
            loop {
                let Some(a) = acquired else {
                    return Ok(None);
                };
                match settle(ctx, name, recipe.dir(), kind, a, wait).await? {
                    Settled::Held(a) => {
                        // The unfair node's path is shared: its guard
                        // checks before deleting.
                        let own_path = kind != Kind::Mutex;
                        return guard(ctx, name, a, own_path, recipe.hold()).map(Some);
                    }
                    Settled::NotAcquired => return Ok(None),
                    Settled::Again => {}
                }
                acquired = join(wait).await?;
            }
        })
    })
}
