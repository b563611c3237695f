//! The in-process fence: values in a map, each with its fence, behind one
//! mutex, for tests and single-process use.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;

use super::{check_resource, Fence, FenceToken, Highest};
use crate::error::Result;

/// Fenced values in process memory: each resource (by name) holds an
/// optional value of type `V` and its fence (see [the module
/// docs](super)).
///
/// A write is a closure run on the value under the fence's mutex, only if
/// its token is admitted, so check and write are one step. Keep the closure
/// short: it blocks every other resource of this fence while it runs, and
/// it must not call back into the same fence (that would deadlock). A
/// closure that panics leaves its value as the panic left it, and its token
/// unrecorded.
///
/// Resources live as long as the fence; a resource's numbers never go down.
pub struct MemFence<V = ()> {
    resources: Mutex<HashMap<String, Entry<V>>>,
}

struct Entry<V> {
    highest: Highest,
    value: Option<V>,
}

impl<V> Default for Entry<V> {
    fn default() -> Self {
        Entry {
            highest: Highest::default(),
            value: None,
        }
    }
}

impl<V> Default for MemFence<V> {
    fn default() -> Self {
        MemFence {
            resources: Mutex::new(HashMap::new()),
        }
    }
}

impl<V> fmt::Debug for MemFence<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemFence")
            .field("resources", &self.lock().len())
            .finish()
    }
}

impl<V> MemFence<V> {
    /// An empty fence.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry<V>>> {
        self.resources
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `write` on `resource`'s value (`None` until a write sets it)
    /// if `token` is admitted, and records the token after it returns:
    /// atomic, nothing else of this fence runs in between.
    ///
    /// # Errors
    ///
    /// [`Error::Stale`](crate::Error::Stale) when `token` is refused:
    /// `write` is not run and nothing changes;
    /// [`Error::InvalidName`](crate::Error::InvalidName) /
    /// [`Error::InvalidOptions`](crate::Error::InvalidOptions) for a bad
    /// resource name or token 0.
    pub fn write<R>(
        &self,
        resource: &str,
        token: FenceToken,
        write: impl FnOnce(&mut Option<V>) -> R,
    ) -> Result<R> {
        check_resource(resource)?;
        let mut resources = self.lock();
        let current = resources
            .get(resource)
            .map_or_else(Highest::default, |e| e.highest);
        let next = current.check(token)?;
        let entry = resources.entry(resource.to_owned()).or_default();
        let out = write(&mut entry.value);
        entry.highest = next;
        Ok(out)
    }

    /// Admits `token` on `resource` without a write (a barrier: every lower
    /// token is refused from now on).
    ///
    /// # Errors
    ///
    /// As [`MemFence::write`].
    pub fn admit(&self, resource: &str, token: FenceToken) -> Result<Highest> {
        check_resource(resource)?;
        let mut resources = self.lock();
        let entry = resources.entry(resource.to_owned()).or_default();
        entry.highest = entry.highest.check(token)?;
        Ok(entry.highest)
    }

    /// What `resource` has admitted (zeros for one never written).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`](crate::Error::InvalidName) for a bad name.
    pub fn highest(&self, resource: &str) -> Result<Highest> {
        check_resource(resource)?;
        Ok(self
            .lock()
            .get(resource)
            .map_or_else(Highest::default, |e| e.highest))
    }

    /// Reads `resource`'s value through `read` (unfenced: reads change
    /// nothing).
    pub fn read_with<R>(&self, resource: &str, read: impl FnOnce(Option<&V>) -> R) -> R {
        read(self.lock().get(resource).and_then(|e| e.value.as_ref()))
    }

    /// A copy of `resource`'s value.
    #[must_use]
    pub fn read(&self, resource: &str) -> Option<V>
    where
        V: Clone,
    {
        self.lock().get(resource).and_then(|e| e.value.clone())
    }
}

#[async_trait]
impl<V: Send> Fence for MemFence<V> {
    async fn admit(&self, _cx: &mut (), resource: &str, token: FenceToken) -> Result<Highest> {
        MemFence::admit(self, resource, token)
    }

    async fn highest(&self, _cx: &mut (), resource: &str) -> Result<Highest> {
        MemFence::highest(self, resource)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_write_does_not_run() {
        let f: MemFence<u32> = MemFence::new();
        f.write("r", FenceToken::exclusive(2), |v| *v = Some(1))
            .unwrap();
        let mut ran = false;
        let e = f
            .write("r", FenceToken::exclusive(1), |_| ran = true)
            .unwrap_err();
        assert!(e.is_stale() && !ran);
        assert_eq!(f.read("r"), Some(1));
        assert_eq!(f.highest("r").unwrap().token, 2);
        assert_eq!(f.highest("other").unwrap(), Highest::default());
    }
}
