//! The semaphore's resource for the safety checker: N slots. The mutex's
//! and the read-write lock's values are on the product's fences
//! (`distlock_core::fence`; see [`safety::run_fenced`](crate::safety::run_fenced)).

use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::safety::Stale;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// N slots guarded by a semaphore of N permits: each holder claims a slot,
/// does a read-modify-write on it, and gives it back. A claim when every
/// slot is claimed is over capacity (more holders than permits); it takes
/// the slot of the lowest token, whose holder's write is then refused.
///
/// No token rule is checked here: a semaphore's permits hold together with
/// interleaved tokens, so a slot that refused tokens below the highest it
/// saw refused live holders (under connection delays, a permit whose slot
/// a later permit had used first; see `distlock_core::fence`, "Several
/// holders at once"). What keeps the slots' values whole is the claim: a
/// holder writes only the slot it claimed and still holds.
#[derive(Debug)]
pub struct SlotStore {
    slots: Mutex<Vec<Slot>>,
}

#[derive(Debug, Default, Clone)]
struct Slot {
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
    /// None today: a claim always gets a slot (over capacity: another's).
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
    /// [`Stale`] when the slot was taken over by a claim over capacity.
    pub fn write(&self, token: u64, claim: Claim) -> Result<(), Stale> {
        let mut slots = lock(&self.slots);
        let s = &mut slots[claim.slot];
        if s.claimant != Some(token) {
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
    fn a_permit_below_one_that_used_its_slot_first_is_not_refused() {
        // The trap of a per-slot token rule: permit 2 used slot 0 and gave
        // it back; permit 1, still held, claims slot 0 and writes.
        let s = SlotStore::new(2);
        let b = s.claim(2).unwrap();
        s.write(2, b).unwrap();
        let a = s.claim(1).unwrap();
        assert_eq!(s.write(1, a), Ok(()));
        assert_eq!(s.snapshot(), (2, 2));
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
