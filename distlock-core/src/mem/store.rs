//! The in-process lock table: holders with real TTLs, FIFO queues, fencing
//! counters, and a version channel per name that wakes waiters.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::{sleep_until, Instant};

use crate::backend::{GuardParts, LeaseBackend, LeaseSignal, LeaseTerms, Lifecycle};
use crate::election::LeaderInfo;
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::lease::LeaseOptions;
use crate::lock::Wait;
use crate::name::Name;

/// Which primitive a slot belongs to: the same name in two kinds is two locks,
/// as on the servers (different keys or node layouts).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Mutex,
    FairMutex,
    Election,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SlotKey {
    pub(crate) kind: Kind,
    pub(crate) name: Name,
}

struct Holder {
    owner: u64,
    token: u64,
    expires: Instant,
    data: Option<Arc<str>>,
}

struct Slot {
    holder: Option<Holder>,
    /// Last fencing token handed out; never reset.
    fence: u64,
    /// Fair waiters' owner ids, first come first.
    queue: VecDeque<u64>,
    /// Bumped on every change of holder or queue; waiters and observers
    /// subscribe before they sleep, so no wake-up is missed.
    version: watch::Sender<u64>,
}

impl Default for Slot {
    fn default() -> Self {
        Slot {
            holder: None,
            fence: 0,
            queue: VecDeque::new(),
            version: watch::Sender::new(0),
        }
    }
}

impl Slot {
    fn bump(&self) {
        self.version.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Drops a holder whose TTL has passed.
    fn expire(&mut self, now: Instant) {
        if self.holder.as_ref().is_some_and(|h| h.expires <= now) {
            self.holder = None;
            self.bump();
        }
    }

    fn held_by(&mut self, owner: u64, now: Instant) -> Option<&mut Holder> {
        self.expire(now);
        self.holder.as_mut().filter(|h| h.owner == owner)
    }

    fn leader(&self) -> Option<LeaderInfo> {
        self.holder.as_ref().map(|h| LeaderInfo {
            id: h.data.as_deref().unwrap_or_default().to_owned(),
            term: h.token,
        })
    }
}

/// The shared table behind every in-process provider of one store.
#[derive(Default)]
pub(crate) struct Store {
    slots: Mutex<HashMap<SlotKey, Slot>>,
    counters: Mutex<HashMap<Name, u64>>,
    owners: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while the table is locked; recover the data if it ever did.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn expiry(from: Instant, ttl: Duration) -> Instant {
    from.checked_add(ttl).unwrap_or(from)
}

/// Removes a fair waiter's place in the queue unless disarmed: runs when an
/// acquisition is cancelled, times out or fails.
struct QueuePlace<'a> {
    store: &'a Store,
    key: &'a SlotKey,
    owner: u64,
    armed: bool,
}

impl Drop for QueuePlace<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut slots = lock(&self.store.slots);
        if let Some(slot) = slots.get_mut(self.key) {
            let before = slot.queue.len();
            slot.queue.retain(|o| *o != self.owner);
            if slot.queue.len() != before {
                slot.bump();
            }
        }
    }
}

impl Store {
    /// Acquires `key` for `lease`, FIFO when `fair`, waiting as `wait` says.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        lifecycle: &Arc<Lifecycle>,
        key: &SlotKey,
        fair: bool,
        wait: Wait,
        lease: LeaseOptions,
        mut data: Option<Arc<str>>,
    ) -> Result<Option<LockGuard>> {
        tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        lifecycle.check_open()?;
        let owner = self.owners.fetch_add(1, Ordering::Relaxed);
        let deadline = wait.deadline();
        let mut place = QueuePlace {
            store: self.as_ref(),
            key,
            owner,
            armed: fair,
        };
        if fair {
            let mut slots = lock(&self.slots);
            let slot = slots.entry(key.clone()).or_default();
            slot.queue.push_back(owner);
            slot.bump();
        }
        loop {
            let now = Instant::now();
            let (mut changes, holder_expires) = {
                let mut slots = lock(&self.slots);
                let slot = slots.entry(key.clone()).or_default();
                slot.expire(now);
                let my_turn = !fair || slot.queue.front() == Some(&owner);
                if slot.holder.is_none() && my_turn {
                    let token = slot.fence.checked_add(1).ok_or_else(|| Error::Exhausted {
                        name: key.name.to_string(),
                    })?;
                    if fair {
                        slot.queue.pop_front();
                        place.armed = false;
                    }
                    slot.fence = token;
                    slot.holder = Some(Holder {
                        owner,
                        token,
                        expires: expiry(now, lease.ttl()),
                        data: data.take(),
                    });
                    slot.bump();
                    drop(slots);
                    return self
                        .guard(lifecycle, key, owner, token, lease, now)
                        .map(Some);
                }
                if wait == Wait::No {
                    return Ok(None);
                }
                (
                    slot.version.subscribe(),
                    slot.holder.as_ref().map(|h| h.expires),
                )
            };
            let wake_at = match (holder_expires, deadline) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            tokio::select! {
                _ = changes.changed() => {}
                () = sleep_until(wake_at.unwrap_or(now)), if wake_at.is_some() => {}
                () = lifecycle.closed() => return Err(Error::Closed),
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                tracing::debug!(name = %key.name, "distlock wait timed out");
                return Ok(None);
            }
        }
    }

    fn guard(
        self: &Arc<Self>,
        lifecycle: &Arc<Lifecycle>,
        key: &SlotKey,
        owner: u64,
        token: u64,
        lease: LeaseOptions,
        acquired_at: Instant,
    ) -> Result<LockGuard> {
        let backend = Arc::new(MemLease {
            store: Arc::clone(self),
            key: key.clone(),
            owner,
        });
        let parts = GuardParts {
            name: key.name.clone(),
            fencing_token: token,
            signal: LeaseSignal::new(),
            terms: LeaseTerms::Ttl(lease),
            acquired_at,
            lifecycle: Arc::clone(lifecycle),
        };
        LockGuard::new(parts, backend)
    }

    /// The election's current leader.
    pub(crate) fn leader(&self, key: &SlotKey) -> Option<LeaderInfo> {
        let mut slots = lock(&self.slots);
        let slot = slots.get_mut(key)?;
        slot.expire(Instant::now());
        slot.leader()
    }

    /// The leader now, a receiver that wakes on the next change, and when the
    /// current leader's lease runs out.
    pub(crate) fn watch_leader(
        &self,
        key: &SlotKey,
    ) -> (Option<LeaderInfo>, watch::Receiver<u64>, Option<Instant>) {
        let mut slots = lock(&self.slots);
        let slot = slots.entry(key.clone()).or_default();
        slot.expire(Instant::now());
        (
            slot.leader(),
            slot.version.subscribe(),
            slot.holder.as_ref().map(|h| h.expires),
        )
    }

    /// Adds `n` to the counter `name`; returns the new value.
    pub(crate) fn reserve(&self, name: &Name, n: u64) -> Result<u64> {
        let mut counters = lock(&self.counters);
        let counter = counters.entry(name.clone()).or_insert(0);
        *counter = counter.checked_add(n).ok_or_else(|| Error::Exhausted {
            name: name.to_string(),
        })?;
        Ok(*counter)
    }
}

/// One held in-process lease.
struct MemLease {
    store: Arc<Store>,
    key: SlotKey,
    owner: u64,
}

impl MemLease {
    fn not_held(&self) -> Error {
        Error::not_held(self.key.name.as_str())
    }
}

#[async_trait]
impl LeaseBackend for MemLease {
    async fn renew(&self, ttl: Duration) -> Result<()> {
        let now = Instant::now();
        let mut slots = lock(&self.store.slots);
        let holder = slots
            .get_mut(&self.key)
            .and_then(|s| s.held_by(self.owner, now))
            .ok_or_else(|| self.not_held())?;
        holder.expires = expiry(now, ttl);
        Ok(())
    }

    async fn release(&self) -> Result<()> {
        let now = Instant::now();
        let mut slots = lock(&self.store.slots);
        let slot = slots.get_mut(&self.key).ok_or_else(|| self.not_held())?;
        if slot.held_by(self.owner, now).is_none() {
            return Err(self.not_held());
        }
        slot.holder = None;
        slot.bump();
        Ok(())
    }
}
