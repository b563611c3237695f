//! Read-write locks: readers share, a writer excludes everyone.

use std::fmt::Debug;
use std::sync::Arc;

use crate::lock::Lock;
use crate::name::Name;

/// A named distributed read-write lock.
///
/// [`read`](ReadWriteLock::read) and [`write`](ReadWriteLock::write) give
/// the two sides as [`Lock`]s, each with `try_lock`, `lock` and
/// `lock_timeout`, each returning a [`LockGuard`](crate::LockGuard) that owns
/// its own lease (a reader that dies frees its share when its lease ends).
///
/// * Any number of readers hold at once; a writer holds alone.
/// * No writer starvation: once a writer waits, readers that come after it
///   wait behind it.
/// * Fencing: a write guard's token is strictly greater than every earlier
///   read or write guard's token of the name; a read guard's token is
///   strictly greater than every earlier write guard's (readers' tokens are
///   unique too).
///
/// A read-write lock is a name of its own kind: a mutex of the same name is
/// another lock (on ZooKeeper the layout is Curator's
/// `InterProcessReadWriteLock`, so Curator's read-write lock on the same path
/// is the same lock).
///
/// ```
/// # use distlock_core as distlock;
/// use distlock::{mem::MemProvider, Provider};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
/// let locks = MemProvider::new();
/// let rw = locks.rw_lock("catalog")?;
/// let r1 = rw.read().lock().await?;
/// let r2 = rw.read().lock().await?; // readers share
/// assert!(rw.write().try_lock().await?.is_none());
/// let last_read = r2.fencing_token();
/// r1.release().await?;
/// r2.release().await?;
/// let w = rw.write().lock().await?;
/// assert!(w.fencing_token() > last_read);
/// w.release().await?;
/// # Ok(()) }
/// ```
pub trait ReadWriteLock: Send + Sync + Debug {
    /// The lock's name.
    fn name(&self) -> &Name;

    /// The read side: shared with other readers, excluded by a writer.
    fn read(&self) -> Arc<dyn Lock>;

    /// The write side: excludes readers and other writers.
    fn write(&self) -> Arc<dyn Lock>;
}
