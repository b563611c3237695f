//! Fenced resources for the safety checker beyond the mutex's
//! [`FencedStore`](crate::safety::FencedStore): a reader/writer resource
//! and an N-slot resource. Each refuses accesses whose fencing token shows
//! they were superseded, and counts what must never happen.

use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::safety::Stale;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A value guarded by a read-write lock, written in two steps (begin, then
/// commit after the work) and read twice (at the start and at the end of a
/// read hold).
///
/// Fencing follows the read-write lock's token rule: a write must carry a
/// token at least as high as every access seen (reads included), a read one
/// at least as high as every write begun. A read with a higher token than
/// an open write aborts that write (its commit is then refused), so a read
/// only ever sees committed values; a read whose second look finds another
/// value counts as a torn read, which must never happen.
#[derive(Debug, Default)]
pub struct RwStore {
    state: Mutex<RwState>,
}

#[derive(Debug, Default)]
struct RwState {
    highest_any: u64,
    highest_write: u64,
    /// The token of the write begun and not yet committed.
    open: Option<u64>,
    value: u64,
    accepted_writes: u64,
    torn_reads: u64,
}

impl RwStore {
    /// Begins a write with `token`; returns the value to build on.
    ///
    /// # Errors
    ///
    /// [`Stale`] when a higher token has been seen.
    pub fn begin_write(&self, token: u64) -> Result<u64, Stale> {
        let mut s = lock(&self.state);
        if token < s.highest_any {
            return Err(Stale);
        }
        s.highest_any = token;
        s.highest_write = token;
        s.open = Some(token);
        Ok(s.value)
    }

    /// Commits the write begun with `token`.
    ///
    /// # Errors
    ///
    /// [`Stale`] when a higher token has been seen since, or the write was
    /// aborted by a later reader.
    pub fn commit(&self, token: u64, value: u64) -> Result<(), Stale> {
        let mut s = lock(&self.state);
        if s.open != Some(token) || token < s.highest_any {
            if s.open == Some(token) {
                s.open = None;
            }
            return Err(Stale);
        }
        s.open = None;
        s.value = value;
        s.accepted_writes += 1;
        Ok(())
    }

    /// Abandons the write begun with `token` (its holder saw the lease go).
    pub fn abort(&self, token: u64) {
        let mut s = lock(&self.state);
        if s.open == Some(token) {
            s.open = None;
        }
    }

    /// Reads with `token` (the first look of a read hold).
    ///
    /// # Errors
    ///
    /// [`Stale`] when a write with a higher token has begun.
    pub fn read(&self, token: u64) -> Result<u64, Stale> {
        let mut s = lock(&self.state);
        if token < s.highest_write {
            return Err(Stale);
        }
        s.highest_any = s.highest_any.max(token);
        if s.open.is_some_and(|w| w < token) {
            // A write superseded by this reader: it can never commit.
            s.open = None;
        }
        Ok(s.value)
    }

    /// The second look of a read hold that first saw `first`: a different
    /// value is a torn read.
    ///
    /// # Errors
    ///
    /// [`Stale`] when a write with a higher token has begun since.
    pub fn reread(&self, token: u64, first: u64) -> Result<(), Stale> {
        let mut s = lock(&self.state);
        if token < s.highest_write {
            return Err(Stale);
        }
        if s.value != first {
            s.torn_reads += 1;
        }
        Ok(())
    }

    /// The value, the accepted writes and the torn reads.
    #[must_use]
    pub fn snapshot(&self) -> (u64, u64, u64) {
        let s = lock(&self.state);
        (s.value, s.accepted_writes, s.torn_reads)
    }
}

/// N slots guarded by a semaphore of N permits: each holder claims a slot,
/// does a fenced read-modify-write on it, and gives it back. A claim when
/// every slot is claimed is over capacity (more holders than permits); it
/// takes the slot of the lowest token, whose holder's write is then refused.
#[derive(Debug)]
pub struct SlotStore {
    slots: Mutex<Vec<Slot>>,
}

#[derive(Debug, Default, Clone)]
struct Slot {
    highest: u64,
    claimant: Option<u64>,
    value: u64,
    accepted_writes: u64,
}

/// A slot claimed for a hold.
#[derive(Debug, Clone, Copy)]
pub struct Claim {
    slot: usize,
    value: u64,
    /// Every slot was claimed already: more holders than permits.
    pub over_capacity: bool,
}

impl SlotStore {
    /// `permits` free slots.
    #[must_use]
    pub fn new(permits: usize) -> Self {
        SlotStore {
            slots: Mutex::new(vec![Slot::default(); permits.max(1)]),
        }
    }

    /// Claims a slot with `token` and reads it.
    ///
    /// # Errors
    ///
    /// [`Stale`] when the slot it would take has seen a higher token.
    pub fn claim(&self, token: u64) -> Result<Claim, Stale> {
        let mut slots = lock(&self.slots);
        let free = slots.iter().position(|s| s.claimant.is_none());
        let over_capacity = free.is_none();
        let slot = free.unwrap_or_else(|| {
            (0..slots.len())
                .min_by_key(|&i| slots[i].claimant)
                .unwrap_or(0)
        });
        let s = &mut slots[slot];
        if token < s.highest {
            return Err(Stale);
        }
        s.highest = token;
        s.claimant = Some(token);
        Ok(Claim {
            slot,
            value: s.value,
            over_capacity,
        })
    }

    /// Writes the claimed slot's next value and gives the slot back.
    ///
    /// # Errors
    ///
    /// [`Stale`] when the slot has seen a higher token or was taken over.
    pub fn write(&self, token: u64, claim: Claim) -> Result<(), Stale> {
        let mut slots = lock(&self.slots);
        let s = &mut slots[claim.slot];
        if s.claimant != Some(token) || token < s.highest {
            return Err(Stale);
        }
        s.claimant = None;
        s.value = claim.value + 1;
        s.accepted_writes += 1;
        Ok(())
    }

    /// Gives the slot back without writing.
    pub fn give_back(&self, token: u64, claim: Claim) {
        let mut slots = lock(&self.slots);
        let s = &mut slots[claim.slot];
        if s.claimant == Some(token) {
            s.claimant = None;
        }
    }

    /// The sum of the slots' values and of their accepted writes.
    #[must_use]
    pub fn snapshot(&self) -> (u64, u64) {
        let slots = lock(&self.slots);
        slots
            .iter()
            .fold((0, 0), |(v, w), s| (v + s.value, w + s.accepted_writes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_reader_aborts_an_open_write_and_a_stale_reader_is_refused() {
        let s = RwStore::default();
        assert_eq!(s.begin_write(3), Ok(0));
        assert_eq!(s.read(5), Ok(0));
        assert_eq!(s.commit(3, 1), Err(Stale), "superseded write committed");
        assert_eq!(s.begin_write(4), Err(Stale));
        assert_eq!(s.begin_write(6), Ok(0));
        assert_eq!(s.commit(6, 1), Ok(()));
        assert_eq!(s.read(5), Err(Stale));
        assert_eq!(s.reread(5, 0), Err(Stale));
        assert_eq!(s.read(7), Ok(1));
        assert_eq!(s.reread(7, 1), Ok(()));
        assert_eq!(s.snapshot(), (1, 1, 0));
    }

    #[test]
    fn over_capacity_takes_the_lowest_token_whose_write_is_refused() {
        let s = SlotStore::new(2);
        let a = s.claim(1).unwrap();
        let b = s.claim(2).unwrap();
        assert!(!a.over_capacity && !b.over_capacity);
        let c = s.claim(3).unwrap();
        assert!(c.over_capacity);
        assert_eq!(s.write(1, a), Err(Stale));
        assert_eq!(s.write(2, b), Ok(()));
        assert_eq!(s.write(3, c), Ok(()));
        assert_eq!(s.snapshot(), (2, 2));
    }
}
