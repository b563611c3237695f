//! The provider: one connected backend handing out named primitives.

use std::fmt::Debug;
use std::sync::Arc;

use crate::election::Election;
use crate::error::Result;
use crate::ids::IdGenerator;
use crate::lease::LeaseOptions;
use crate::lock::Lock;

/// A connected backend that hands out named primitives.
///
/// Names are validated by [`Name`](crate::Name)'s rule; handing out a
/// primitive does no I/O. Session-based backends (ZooKeeper) ignore the lease
/// options' TTL and renewal: the session is the lease.
pub trait Provider: Send + Sync + Debug {
    /// The backend's short name: `"mem"`, `"redis"`, `"zookeeper"`.
    fn backend(&self) -> &'static str;

    /// The lease options used by the methods without `_with`.
    fn default_lease(&self) -> LeaseOptions;

    /// An unfair mutex (whoever asks first after a release wins) with the
    /// given lease options.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`](crate::Error::InvalidName) for a bad name.
    fn mutex_with(&self, name: &str, lease: LeaseOptions) -> Result<Arc<dyn Lock>>;

    /// A fair (first come, first served) mutex with the given lease options.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`](crate::Error::InvalidName) for a bad name.
    fn fair_mutex_with(&self, name: &str, lease: LeaseOptions) -> Result<Arc<dyn Lock>>;

    /// A leader election whose leadership lease has the given options.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`](crate::Error::InvalidName) for a bad name.
    fn election_with(&self, name: &str, lease: LeaseOptions) -> Result<Arc<dyn Election>>;

    /// An id generator reserving `block_size` ids per round trip.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`](crate::Error::InvalidName) for a bad name,
    /// [`Error::InvalidOptions`](crate::Error::InvalidOptions) for a block
    /// size of 0.
    fn id_generator(&self, name: &str, block_size: u64) -> Result<Arc<dyn IdGenerator>>;

    /// An unfair mutex with the default lease.
    ///
    /// # Errors
    ///
    /// As [`Provider::mutex_with`].
    fn mutex(&self, name: &str) -> Result<Arc<dyn Lock>> {
        self.mutex_with(name, self.default_lease())
    }

    /// A fair mutex with the default lease.
    ///
    /// # Errors
    ///
    /// As [`Provider::fair_mutex_with`].
    fn fair_mutex(&self, name: &str) -> Result<Arc<dyn Lock>> {
        self.fair_mutex_with(name, self.default_lease())
    }

    /// A leader election with the default lease.
    ///
    /// # Errors
    ///
    /// As [`Provider::election_with`].
    fn election(&self, name: &str) -> Result<Arc<dyn Election>> {
        self.election_with(name, self.default_lease())
    }
}
