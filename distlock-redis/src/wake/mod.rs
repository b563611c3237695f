//! Wake-ups of waiters: the shared pub/sub subscriber, client tracking of
//! foreign holders' keys, and the waits on them.

use tokio::time::{sleep_until, Instant};

use distlock_core::{Error, Result};

pub(crate) mod subscriber;
pub(crate) mod tracker;

/// Waits for a wake-up on `sub` (`true`), or for its confirmation, a change
/// of the foreign holder's key or until `wake` (`false`).
///
/// # Errors
///
/// [`Error::Closed`] when the provider is closed meanwhile.
pub(crate) fn woken<'a>(
    sub: &'a mut crate::wake::subscriber::Subscription,
    key: Option<&'a mut crate::wake::tracker::KeyWatch>,
    wake: Instant,
    lifecycle: &'a distlock_core::backend::Lifecycle,
) -> impl std::future::Future<Output = Result<bool>> + Send + 'a {
    woken_or(sub, key_changed(key), wake, lifecycle)
}

/// [`woken`] with `other` for the foreign holder's key change: the fair
/// mutex's waiters pass one that never resolves, and keep no room for a
/// key watch.
///
/// # Errors
///
/// [`Error::Closed`] when the provider is closed meanwhile.
pub(crate) async fn woken_or<F: std::future::Future<Output = ()> + Send>(
    sub: &mut crate::wake::subscriber::Subscription,
    other: F,
    wake: Instant,
    lifecycle: &distlock_core::backend::Lifecycle,
) -> Result<bool> {
    tokio::select! {
        woken = sub.changed() => Ok(woken),
        () = other => Ok(false),
        () = sleep_until(wake) => Ok(false),
        () = lifecycle.closed() => Err(Error::Closed),
    }
}

/// Resolves when the foreign holder's key changes; never without a watch.
async fn key_changed(key: Option<&mut crate::wake::tracker::KeyWatch>) {
    match key {
        // Boxed: only a waiter behind a foreign holder pays for it.
        Some(key) => Box::pin(key.changed()).await,
        None => std::future::pending().await,
    }
}
