//! What a backend implements for ids: a counter that reserves blocks, and
//! the generic [`IdGenerator`] over it.

use std::fmt;
use std::ops::RangeInclusive;

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::ids::IdGenerator;
use crate::name::Name;

/// A backend's counter: reserves `n` ids at once.
#[async_trait]
pub trait IdSource: Send + Sync + 'static {
    /// Adds `n` to the counter and returns its new value: the ids
    /// `new − n + 1 ..= new` now belong to the caller.
    ///
    /// # Errors
    ///
    /// [`Error::Exhausted`] when adding `n` would pass `u64::MAX`; backend
    /// errors.
    ///
    /// # Cancellation safety
    ///
    /// If cancelled, the reservation may or may not have happened.
    async fn reserve(&self, n: u64) -> Result<u64>;
}

/// An [`IdGenerator`] over any [`IdSource`], reserving `block_size` ids per
/// round trip and handing them out locally.
pub struct BlockIds<S> {
    name: Name,
    source: S,
    block_size: u64,
    local: tokio::sync::Mutex<RangeInclusive<u64>>,
}

impl<S: IdSource> BlockIds<S> {
    /// A generator reserving `block_size` ids at a time (1 = one round trip
    /// per id).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] when `block_size` is 0.
    pub fn new(name: Name, source: S, block_size: u64) -> Result<Self> {
        if block_size == 0 {
            return Err(Error::InvalidOptions(
                "id block size must be at least 1".into(),
            ));
        }
        // An empty range: `1..=0`.
        #[allow(clippy::reversed_empty_ranges)]
        let local = tokio::sync::Mutex::new(1..=0);
        Ok(BlockIds {
            name,
            source,
            block_size,
            local,
        })
    }

    /// How many ids one reservation takes.
    #[must_use]
    pub fn block_size(&self) -> u64 {
        self.block_size
    }
}

#[async_trait]
impl<S: IdSource> IdGenerator for BlockIds<S> {
    fn name(&self) -> &Name {
        &self.name
    }

    async fn next(&self) -> Result<u64> {
        let mut local = self.local.lock().await;
        if let Some(id) = local.next() {
            return Ok(id);
        }
        let last = self.source.reserve(self.block_size).await?;
        let first = last
            .checked_sub(self.block_size - 1)
            .filter(|first| *first >= 1)
            .ok_or_else(|| Error::Conflict {
                what: self.name.to_string(),
                expected: "id counter (it went backwards)",
            })?;
        *local = first..=last;
        local.next().ok_or(Error::Exhausted {
            name: self.name.to_string(),
        })
    }
}

impl<S> fmt::Debug for BlockIds<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockIds")
            .field("name", &self.name)
            .field("block_size", &self.block_size)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// A counter starting at `start`, as a backend's would.
    struct Counter(AtomicU64);

    #[async_trait]
    impl IdSource for Counter {
        async fn reserve(&self, n: u64) -> Result<u64> {
            let mut cur = self.0.load(Ordering::SeqCst);
            loop {
                let next = cur
                    .checked_add(n)
                    .ok_or(Error::Exhausted { name: "c".into() })?;
                match self
                    .0
                    .compare_exchange(cur, next, Ordering::SeqCst, Ordering::SeqCst)
                {
                    Ok(_) => return Ok(next),
                    Err(actual) => cur = actual,
                }
            }
        }
    }

    fn ids(start: u64, block: u64) -> BlockIds<Counter> {
        BlockIds::new(
            Name::new("c").unwrap(),
            Counter(AtomicU64::new(start)),
            block,
        )
        .unwrap()
    }

    #[tokio::test]
    async fn blocks_hand_out_consecutive_ids() {
        let g = ids(0, 3);
        let mut got = Vec::new();
        for _ in 0..7 {
            got.push(g.next().await.unwrap());
        }
        assert_eq!(got, [1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(g.source.0.load(Ordering::SeqCst), 9, "one block per 3 ids");
    }

    #[tokio::test]
    async fn exhaustion_is_an_error() {
        let g = ids(u64::MAX - 2, 2);
        assert_eq!(g.next().await.unwrap(), u64::MAX - 1);
        assert_eq!(g.next().await.unwrap(), u64::MAX);
        assert!(matches!(g.next().await, Err(Error::Exhausted { .. })));
    }

    #[test]
    fn zero_block_is_rejected() {
        let r = BlockIds::new(Name::new("c").unwrap(), Counter(AtomicU64::new(0)), 0);
        assert!(matches!(r, Err(Error::InvalidOptions(_))));
    }
}
