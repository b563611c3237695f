//! The in-process lock table: holders with real TTLs, FIFO queues, fencing
//! counters, and a version channel per name that wakes waiters.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::{sleep_until, Instant};

use crate::backend::{GuardParts, LeaseBackend, LeaseSignal, LeaseTerms, Lifecycle};
use crate::election::LeaderInfo;
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::inspect::{HoldRole, Holder as Held, LeaseLeft, PrimitiveKind, Snapshot};
use crate::lease::status::LostReason;
use crate::lease::LeaseOptions;
use crate::lock::Wait;
use crate::name::Name;
use crate::provider::ForceReleased;

/// Which primitive takes a name. One name is one slot whatever the kind: the
/// mutex and the fair mutex share it as one lock, and any other kind that
/// finds the slot in use by another kind is refused (see [`Slot::admits`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Mutex,
    FairMutex,
    Election,
    RwLock,
    Semaphore,
}

impl Kind {
    /// The kinds that are one lock: the mutex and the fair mutex.
    fn family(self) -> Kind {
        match self {
            Kind::FairMutex => Kind::Mutex,
            k => k,
        }
    }

    fn noun(self) -> &'static str {
        match self {
            Kind::Mutex => "mutex",
            Kind::FairMutex => "fair mutex",
            Kind::Election => "election",
            Kind::RwLock => "read-write lock",
            Kind::Semaphore => "semaphore",
        }
    }
}

/// What an acquisition asks for, and so the rule that admits it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Want {
    /// Sole holder; FIFO among the waiters when `fair`.
    Exclusive { fair: bool },
    /// A read share: no writer holds and no writer waits ahead.
    Read,
    /// The write side: sole holder, first in the queue.
    Write,
    /// One of this many permits, first come first served.
    Permit(u32),
}

impl Want {
    fn queued(self) -> bool {
        !matches!(self, Want::Exclusive { fair: false })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SlotKey {
    pub(crate) kind: Kind,
    pub(crate) name: Name,
}

struct Holder {
    owner: u64,
    /// The kind it holds as.
    kind: Kind,
    token: u64,
    expires: Instant,
    data: Option<Arc<str>>,
    /// A write or exclusive hold (not a read share or a permit).
    exclusive: bool,
    /// What it holds, for `inspect`.
    role: HoldRole,
    /// The owner identity of the provider that acquired it.
    who: Arc<str>,
    /// When it was acquired.
    since: SystemTime,
    /// Its lease's status cell: a force-release reports the loss at once.
    signal: LeaseSignal,
}

struct Slot {
    holders: Vec<Holder>,
    /// Last fencing token handed out; never reset.
    fence: u64,
    /// Queued waiters (owner id, what they want, as which kind), first come
    /// first.
    queue: VecDeque<(u64, Want, Kind)>,
    /// The owner identities of the queued waiters.
    waiting: HashMap<u64, Arc<str>>,
    /// The number of permits the current holders of a semaphore were
    /// admitted under.
    permits: u32,
    /// Bumped on every change of holder or queue; waiters and observers
    /// subscribe before they sleep, so no wake-up is missed.
    version: watch::Sender<u64>,
}

impl Default for Slot {
    fn default() -> Self {
        Slot {
            holders: Vec::new(),
            fence: 0,
            queue: VecDeque::new(),
            waiting: HashMap::new(),
            permits: 0,
            version: watch::Sender::new(0),
        }
    }
}

impl Slot {
    fn bump(&self) {
        self.version.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Takes `owner` out of the queue; `seen`: it was in the queue when the
    /// table was last unlocked (others may count it), so they are told.
    fn leave_queue(&mut self, owner: u64, seen: bool) {
        self.queue.retain(|(o, _, _)| *o != owner);
        self.waiting.remove(&owner);
        if seen {
            self.bump();
        }
    }

    /// Drops the holders whose TTL has passed.
    fn expire(&mut self, now: Instant) {
        let before = self.holders.len();
        self.holders.retain(|h| h.expires > now);
        if self.holders.len() != before {
            self.bump();
        }
    }

    fn held_by(&mut self, owner: u64, now: Instant) -> Option<&mut Holder> {
        self.expire(now);
        self.holders.iter_mut().find(|h| h.owner == owner)
    }

    /// Whether `owner` may take what it wants now as `kind` (holders expired
    /// first).
    ///
    /// A holder of another kind, or a waiter of another kind queued ahead of
    /// `owner` (it came first), is [`Error::Conflict`]: the mutex and the fair
    /// mutex are one kind here. Waiters behind `owner` are not counted, so of
    /// two kinds arriving at once the first queued goes on and the other is
    /// refused.
    fn admits(&self, owner: u64, want: Want, kind: Kind, name: &Name) -> Result<bool> {
        let ahead = || self.queue.iter().take_while(|(o, _, _)| *o != owner);
        let other = self
            .holders
            .iter()
            .map(|h| h.kind)
            .chain(ahead().map(|(_, _, k)| *k))
            .find(|k| k.family() != kind.family());
        if let Some(other) = other {
            return Err(Error::kind_conflict(
                name.as_str(),
                other.noun(),
                kind.noun(),
            ));
        }
        Ok(match want {
            Want::Exclusive { fair: false } => self.holders.is_empty(),
            Want::Exclusive { fair: true } | Want::Write => {
                self.holders.is_empty() && self.queue.front().map(|(o, _, _)| *o) == Some(owner)
            }
            Want::Read => {
                !self.holders.iter().any(|h| h.exclusive)
                    && !ahead().any(|(_, w, _)| *w == Want::Write)
            }
            Want::Permit(permits) => {
                if !self.holders.is_empty() && self.permits != permits {
                    return Err(Error::PermitsMismatch {
                        name: name.to_string(),
                        held: self.permits,
                        asked: permits,
                    });
                }
                let before_me = ahead().count();
                usize::try_from(permits)
                    .is_ok_and(|p| self.holders.len().saturating_add(before_me) < p)
            }
        })
    }

    /// The earliest expiry among the holders.
    fn next_expiry(&self) -> Option<Instant> {
        self.holders.iter().map(|h| h.expires).min()
    }

    /// The election's leader: its holder, when the slot is held as an
    /// election.
    fn leader(&self) -> Option<LeaderInfo> {
        self.holders
            .iter()
            .find(|h| h.kind == Kind::Election)
            .map(|h| LeaderInfo {
                id: h.data.as_deref().unwrap_or_default().to_owned(),
                term: h.token,
            })
    }
}

/// The shared table behind every in-process provider of one store.
#[derive(Default)]
pub(crate) struct Store {
    /// One slot per name, whatever the kind.
    slots: Mutex<HashMap<Name, Slot>>,
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

/// Removes a queued waiter's place in the queue unless disarmed: runs when an
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
        if let Some(slot) = slots.get_mut(&self.key.name) {
            let before = slot.queue.len();
            slot.queue.retain(|(o, _, _)| *o != self.owner);
            slot.waiting.remove(&self.owner);
            if slot.queue.len() != before {
                slot.bump();
            }
        }
    }
}

impl Store {
    /// Acquires `key` for `lease` by the rule of `want`, waiting as `wait`
    /// says.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        lifecycle: &Arc<Lifecycle>,
        key: &SlotKey,
        want: Want,
        wait: Wait,
        lease: LeaseOptions,
        mut data: Option<Arc<str>>,
        who: &Arc<str>,
    ) -> Result<Option<LockGuard>> {
        tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        lifecycle.check_open()?;
        let owner = self.owners.fetch_add(1, Ordering::Relaxed);
        let deadline = wait.deadline();
        let queued = want.queued();
        let mut place = QueuePlace {
            store: self.as_ref(),
            key,
            owner,
            armed: queued,
        };
        // A queued acquisition joins the queue under the same table lock as
        // its first decision: one that is refused (another kind, or
        // `Wait::No`) leaves before the lock is let go, so it is never seen
        // queued (a plain waiter counts every queued waiter as ahead of it).
        let mut joining = queued;
        loop {
            let now = Instant::now();
            let (mut changes, holder_expires) = {
                let mut slots = lock(&self.slots);
                let slot = slots.entry(key.name.clone()).or_default();
                let joined_now = std::mem::replace(&mut joining, false);
                if joined_now {
                    slot.queue.push_back((owner, want, key.kind));
                    slot.waiting.insert(owner, Arc::clone(who));
                }
                slot.expire(now);
                let admitted = match slot.admits(owner, want, key.kind, &key.name) {
                    Ok(admitted) => admitted,
                    Err(e) => {
                        if queued {
                            slot.leave_queue(owner, !joined_now);
                            place.armed = false;
                        }
                        return Err(e);
                    }
                };
                if admitted {
                    let token = slot.fence.checked_add(1).ok_or_else(|| Error::Exhausted {
                        name: key.name.to_string(),
                    })?;
                    if queued {
                        slot.queue.retain(|(o, _, _)| *o != owner);
                        slot.waiting.remove(&owner);
                        place.armed = false;
                    }
                    if let Want::Permit(permits) = want {
                        slot.permits = permits;
                    }
                    slot.fence = token;
                    let signal = LeaseSignal::new();
                    slot.holders.push(Holder {
                        owner,
                        kind: key.kind,
                        token,
                        expires: expiry(now, lease.ttl()),
                        data: data.take(),
                        exclusive: matches!(want, Want::Exclusive { .. } | Want::Write),
                        role: match (key.kind, want) {
                            (Kind::Election, _) => HoldRole::Leader,
                            (_, Want::Read) => HoldRole::Read,
                            (_, Want::Write) => HoldRole::Write,
                            (_, Want::Permit(_)) => HoldRole::Permit,
                            (_, Want::Exclusive { .. }) => HoldRole::Exclusive,
                        },
                        who: Arc::clone(who),
                        since: SystemTime::now(),
                        signal: signal.clone(),
                    });
                    slot.bump();
                    drop(slots);
                    return self
                        .guard(lifecycle, key, owner, token, lease, now, signal)
                        .map(Some);
                }
                if wait == Wait::No {
                    if queued {
                        slot.leave_queue(owner, !joined_now);
                        place.armed = false;
                    }
                    return Ok(None);
                }
                if joined_now {
                    slot.bump();
                }
                (slot.version.subscribe(), slot.next_expiry())
            };
            let wake_at = match (holder_expires, deadline) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            tokio::select! {
                _ = changes.changed() => crate::backend::woke(),
                () = sleep_until(wake_at.unwrap_or(now)), if wake_at.is_some() => {}
                () = lifecycle.closed() => return Err(Error::Closed),
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                tracing::debug!(name = %key.name, "distlock wait timed out");
                return Ok(None);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn guard(
        self: &Arc<Self>,
        lifecycle: &Arc<Lifecycle>,
        key: &SlotKey,
        owner: u64,
        token: u64,
        lease: LeaseOptions,
        acquired_at: Instant,
        signal: LeaseSignal,
    ) -> Result<LockGuard> {
        let backend = Arc::new(MemLease {
            store: Arc::clone(self),
            key: key.clone(),
            owner,
        });
        let parts = GuardParts {
            name: key.name.clone(),
            fencing_token: token,
            signal,
            terms: LeaseTerms::Ttl(lease),
            acquired_at,
            lifecycle: Arc::clone(lifecycle),
        };
        LockGuard::new(parts, backend)
    }

    /// The election's current leader.
    pub(crate) fn leader(&self, key: &SlotKey) -> Option<LeaderInfo> {
        let mut slots = lock(&self.slots);
        let slot = slots.get_mut(&key.name)?;
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
        let slot = slots.entry(key.name.clone()).or_default();
        slot.expire(Instant::now());
        (slot.leader(), slot.version.subscribe(), slot.next_expiry())
    }

    /// A snapshot of `key` as `kind`, read under the table's lock: the
    /// holders and waiters of that kind (the mutex and the fair mutex show
    /// each other's), not those of another kind on the same name.
    pub(crate) fn inspect(&self, key: &SlotKey, kind: PrimitiveKind) -> Snapshot {
        let mut snapshot = Snapshot::empty(key.name.clone(), kind, "mem");
        let mut slots = lock(&self.slots);
        let Some(slot) = slots.get_mut(&key.name) else {
            return snapshot;
        };
        let now = Instant::now();
        slot.expire(now);
        let family = key.kind.family();
        snapshot.holders = slot
            .holders
            .iter()
            .filter(|h| h.kind.family() == family)
            .map(|h| Held {
                role: h.role,
                owner: Some(h.who.to_string()),
                foreign: None,
                fencing_token: Some(h.token),
                acquired_at: Some(h.since),
                lease: LeaseLeft::Ttl(h.expires.saturating_duration_since(now)),
                release_requested: h.signal.is_release_requested(),
            })
            .collect();
        let queue = || slot.queue.iter().filter(|(_, _, k)| k.family() == family);
        snapshot.waiters.count = queue().count();
        snapshot.waiters.owners = queue()
            .filter_map(|(o, _, _)| slot.waiting.get(o).map(ToString::to_string))
            .collect();
        if key.kind == Kind::Election {
            snapshot.leader = slot.leader();
        }
        if key.kind == Kind::Semaphore && !snapshot.holders.is_empty() {
            snapshot.permits = Some(slot.permits);
        }
        snapshot
    }

    /// Asks every holder of `key` (of its kind; the mutex and the fair
    /// mutex are one) to release, through its lease's status cell; returns
    /// them as `inspect` shows them. Creates nothing for a name nobody
    /// holds.
    pub(crate) fn request_release(&self, key: &SlotKey, kind: PrimitiveKind) -> Vec<Held> {
        {
            let mut slots = lock(&self.slots);
            let Some(slot) = slots.get_mut(&key.name) else {
                return Vec::new();
            };
            slot.expire(Instant::now());
            let family = key.kind.family();
            for holder in slot.holders.iter().filter(|h| h.kind.family() == family) {
                holder.signal.request_release();
            }
        }
        self.inspect(key, kind).holders
    }

    /// Removes every hold of `key` (of its kind; the mutex and the fair
    /// mutex are one), reports each holder's lease lost at once, and
    /// advances the fencing counter past them.
    pub(crate) fn force_release(&self, key: &SlotKey) -> Result<ForceReleased> {
        let mut slots = lock(&self.slots);
        let slot = slots.entry(key.name.clone()).or_default();
        slot.expire(Instant::now());
        let family = key.kind.family();
        let (evicted, kept) = std::mem::take(&mut slot.holders)
            .into_iter()
            .partition::<Vec<_>, _>(|h| h.kind.family() == family);
        slot.holders = kept;
        for holder in &evicted {
            holder.signal.lose(LostReason::Deleted);
        }
        slot.fence = slot.fence.checked_add(1).ok_or_else(|| Error::Exhausted {
            name: key.name.to_string(),
        })?;
        slot.bump();
        Ok(ForceReleased {
            evicted: evicted.len(),
            fence: Some(slot.fence),
        })
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
            .get_mut(&self.key.name)
            .and_then(|s| s.held_by(self.owner, now))
            .ok_or_else(|| self.not_held())?;
        holder.expires = expiry(now, ttl);
        Ok(())
    }

    async fn release(&self) -> Result<()> {
        let now = Instant::now();
        let mut slots = lock(&self.store.slots);
        let slot = slots
            .get_mut(&self.key.name)
            .ok_or_else(|| self.not_held())?;
        if slot.held_by(self.owner, now).is_none() {
            return Err(self.not_held());
        }
        slot.holders.retain(|h| h.owner != self.owner);
        slot.bump();
        Ok(())
    }
}
