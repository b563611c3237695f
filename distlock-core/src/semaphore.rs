//! Counting semaphores: at most N holders at once.

use crate::lock::Lock;

/// A named distributed counting semaphore: at most
/// [`permits`](Semaphore::permits) holders at any instant, across all
/// clients.
///
/// Acquiring (the [`Lock`] methods) takes one permit; the
/// [`LockGuard`](crate::LockGuard) is that permit's lease, with its own
/// fencing token (unique and increasing per name), its own `lost()` and
/// watchdog. A permit whose lease ends (TTL or session) is reclaimed without
/// any operator action. A semaphore of 1 is a mutex.
///
/// Every client of one name must agree on the number of permits: while
/// permits are held, an acquisition asking with another number fails with
/// [`Error::PermitsMismatch`](crate::Error::PermitsMismatch) and changes nothing (when nothing is held, the
/// next holder's number applies).
///
/// ```
/// # use distlock_core as distlock;
/// use distlock::{mem::MemProvider, Provider};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
/// let locks = MemProvider::new();
/// let pool = locks.semaphore("db-connections", 2)?;
/// let a = pool.lock().await?;
/// let b = pool.lock().await?;
/// assert!(pool.try_lock().await?.is_none()); // both permits are out
/// assert_ne!(a.fencing_token(), b.fencing_token());
/// a.release().await?;
/// b.release().await?;
/// # Ok(()) }
/// ```
pub trait Semaphore: Lock {
    /// How many holders the semaphore admits at once.
    fn permits(&self) -> u32;
}
