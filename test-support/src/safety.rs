//! A Jepsen-style checker for locks under faults: clients do
//! read-modify-write on a fenced resource under the lock, carrying their
//! guard's fencing token, while a scenario injects faults.
//!
//! The resource checks the token on every read and write and remembers the
//! highest it has seen: an access with a lower token is rejected. With
//! reads fenced too, an accepted write can never overwrite an update it did
//! not read, so the final value must equal the number of accepted writes: no
//! lost update, whatever the faults. Overlapping critical sections in real
//! time are counted (they are expected under pauses and partitions); every
//! stale access must be rejected.
//!
//! It also checks the lost signal against the next holder: whenever a lease
//! ends without a release (another client's acquisition returns while the
//! previous holder has not started releasing, or started only after it knew
//! the lease was lost), was the previous holder's status already lost at the
//! moment the next holder's acquisition returned?
//!
//! And liveness ([`run_liveness`]): the longest time the lock sat free
//! while a live waiter waited, under provider deaths, silent subscribers,
//! cuts and partitions. "Free" is known from the test side: the instant a
//! holder's `release()` returned (a failed release: its start plus the
//! lease's length), or for a dead holder its death plus the longest its
//! lease or session can outlive it; a stall ends when the next live
//! acquisition returns, and counts from the later of "free" and the start
//! of the earliest live waiter's wait.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use distlock_core::fence::FenceToken;
use distlock_core::{
    Election, Error, Leadership, LeaseOptions, LeaseWatch, Lock, LockGuard, MemFence, Provider,
    ReadWriteLock, Semaphore,
};

use crate::fence_conformance::FencedStore as ProductStore;
use crate::resources::{Claim, SlotStore};
use crate::Proxy;

/// A resource that rejects any access with a fencing token lower than the
/// highest it has seen.
#[derive(Debug, Default)]
pub struct FencedStore {
    state: Mutex<StoreState>,
}

#[derive(Debug, Default)]
struct StoreState {
    highest: u64,
    value: u64,
    accepted_writes: u64,
}

/// An access refused for its stale token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stale;

impl FencedStore {
    fn admit(state: &mut StoreState, token: u64) -> Result<(), Stale> {
        if token < state.highest {
            return Err(Stale);
        }
        state.highest = token;
        Ok(())
    }

    /// Reads the value with `token`.
    ///
    /// # Errors
    ///
    /// [`Stale`] when a higher token has been seen.
    pub fn read(&self, token: u64) -> Result<u64, Stale> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Self::admit(&mut state, token)?;
        Ok(state.value)
    }

    /// Writes `value` with `token`.
    ///
    /// # Errors
    ///
    /// [`Stale`] when a higher token has been seen.
    pub fn write(&self, token: u64, value: u64) -> Result<(), Stale> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Self::admit(&mut state, token)?;
        state.value = value;
        state.accepted_writes += 1;
        Ok(())
    }

    /// The value and the number of accepted writes.
    #[must_use]
    pub fn snapshot(&self) -> (u64, u64) {
        let state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        (state.value, state.accepted_writes)
    }
}

/// What one scenario measured.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The scenario's name.
    pub scenario: String,
    /// Acquire calls made.
    pub operations: u64,
    /// Acquisitions that returned a guard.
    pub acquisitions: u64,
    /// Faults injected.
    pub faults: u64,
    /// Critical sections entered while another was in progress that they
    /// must exclude (a mutex's or a writer's with anyone's, a reader's with
    /// a writer's), or a semaphore's permits over their number.
    pub overlaps: u64,
    /// Reads and writes the resource refused for stale tokens.
    pub stale_rejected: u64,
    /// Writes accepted by the resource.
    pub accepted_writes: u64,
    /// Accepted writes minus the final value: must be 0.
    pub lost_updates: u64,
    /// Reads of a read-write lock's resource that saw the value change
    /// under them: must be 0.
    pub torn_reads: u64,
    /// Write histories checked (one per fenced resource of the run; 0 for
    /// a semaphore's slots, which no token rule fences: see
    /// [`SlotStore`]).
    pub histories: u64,
    /// Fenced accesses (admitted or refused) in those histories.
    pub history_attempts: u64,
    /// Violations the history check found (see [`history_violations`]):
    /// must be 0.
    pub history_violations: u64,
    /// Lost leases the holder learned of (`is_held()` false) before its
    /// write.
    pub lost_noticed: u64,
    /// Lost leases the holder did not know of at its write (the resource
    /// refused it).
    pub lost_unnoticed: u64,
    /// Leases that ended without a release, taken over by the next holder,
    /// whose status was already lost when the next holder's acquisition
    /// returned (stalled holders not counted).
    pub lost_before_next: u64,
    /// As `lost_before_next`, but the previous holder's status was still
    /// held or suspended when the next holder's acquisition returned: the
    /// lost signal came late.
    pub lost_after_next: u64,
    /// Leases of the stalled worker (its runtime starved, see
    /// [`Workload::stall`]) taken over without a release. Its signal cannot
    /// run while its thread is blocked: the fence covers it, so they are
    /// counted apart.
    pub starved_takeovers: u64,
    /// The liveness figure of [`run_liveness`]: the longest time the lock
    /// sat free while a live waiter waited; `None` where not measured.
    pub free_stalls: Option<FreeStalls>,
}

impl Report {
    /// The share of lost leases noticed before the holder's next write.
    #[must_use]
    pub fn noticed_share(&self) -> Option<f64> {
        let lost = self.lost_noticed + self.lost_unnoticed;
        (lost > 0).then(|| self.lost_noticed as f64 / lost as f64)
    }

    /// The share of leases ended without a release (stalled holders
    /// excluded) whose status was lost by the time the next holder's
    /// acquisition returned; `None` without such a takeover.
    #[must_use]
    pub fn lost_before_next_share(&self) -> Option<f64> {
        let takeovers = self.lost_before_next + self.lost_after_next;
        (takeovers > 0).then(|| self.lost_before_next as f64 / takeovers as f64)
    }

    /// The Markdown table header matching [`Report`]'s `Display`.
    #[must_use]
    pub fn header() -> &'static str {
        "| scenario | operations | acquisitions | faults | overlaps | stale rejected | lost updates, torn reads | histories: accesses, violations | lost leases noticed before the write | lost() before next holder | longest free with a live waiter |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    }
}

/// Panics unless every lease that ended without a release (stalled holders
/// aside) was already lost, as its holder saw it, when the next holder's
/// acquisition returned; passes when there was no such takeover.
///
/// # Panics
///
/// When [`Report::lost_before_next_share`] is below 100%.
pub fn assert_lost_before_next(report: &Report) {
    assert!(
        report.lost_after_next == 0,
        "{}: {} of {} leases taken over without a release were not yet lost() when the next holder got the lock: {report:?}",
        report.scenario,
        report.lost_after_next,
        report.lost_before_next + report.lost_after_next,
    );
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let noticed = self
            .noticed_share()
            .map_or("no lease lost".to_owned(), |s| {
                format!(
                    "{:.0}% ({}/{})",
                    s * 100.0,
                    self.lost_noticed,
                    self.lost_noticed + self.lost_unnoticed
                )
            });
        let mut before_next = self
            .lost_before_next_share()
            .map_or("no takeover".to_owned(), |s| {
                format!(
                    "{:.0}% ({}/{})",
                    s * 100.0,
                    self.lost_before_next,
                    self.lost_before_next + self.lost_after_next
                )
            });
        if self.starved_takeovers > 0 {
            before_next.push_str(&format!("; starved: {}", self.starved_takeovers));
        }
        let history = if self.histories == 0 {
            "-".to_owned()
        } else {
            format!(
                "{}: {}, {}",
                self.histories, self.history_attempts, self.history_violations
            )
        };
        write!(
            f,
            "| {} | {} | {} | {} | {} | {} | {}, {} | {} | {} | {} | {} |",
            self.scenario,
            self.operations,
            self.acquisitions,
            self.faults,
            self.overlaps,
            self.stale_rejected,
            self.lost_updates,
            self.torn_reads,
            history,
            noticed,
            before_next,
            self.free_stalls
                .map_or_else(|| "-".to_owned(), |s| s.to_string())
        )
    }
}

#[derive(Default)]
struct Counters {
    operations: AtomicU64,
    acquisitions: AtomicU64,
    overlaps: AtomicU64,
    stale: AtomicU64,
    noticed: AtomicU64,
    unnoticed: AtomicU64,
    inside: Mutex<Occupancy>,
    lost_before_next: AtomicU64,
    lost_after_next: AtomicU64,
    starved_takeovers: AtomicU64,
    /// Writes the resource accepted (reads not counted), so a run that
    /// ends with none can go on until one lands ([`WRITE_CAP`]).
    writes: AtomicU64,
    /// The latest holder, replaced by each acquisition under this lock.
    holder: Mutex<Option<Holder>>,
}

/// How a holder's lease is ending, as the next acquirer finds it: still
/// working under it.
const WORKING: u8 = 0;
/// It called `release()` while its lease was held (or suspended).
const RELEASING_HELD: u8 = 1;
/// It called `release()` after its lease was lost: the lease ended without
/// a release.
const RELEASING_LOST: u8 = 2;

/// The latest holder of the lock, as recorded when its `lock()` returned.
struct Holder {
    worker: u64,
    token: u64,
    watch: LeaseWatch,
    /// [`WORKING`], [`RELEASING_HELD`] or [`RELEASING_LOST`].
    ending: Arc<AtomicU8>,
    stalled: bool,
}

impl Counters {
    fn occupy(&self, role: Role, permits: u64) -> bool {
        self.inside
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .enter(role, permits)
    }

    fn vacate(&self, role: Role) {
        self.inside
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .leave(role);
    }

    /// Records `next` as the holder and classifies how the previous one's
    /// lease ended. Called the moment `next`'s acquisition returned.
    fn take_over(&self, next: Holder) {
        let mut holder = self.holder.lock().unwrap_or_else(PoisonError::into_inner);
        if holder.as_ref().is_some_and(|h| h.token > next.token) {
            // A later holder recorded itself first: this lease was already
            // superseded, and that holder classified the one before.
            return;
        }
        let worker = next.worker;
        let Some(previous) = holder.replace(next) else {
            return;
        };
        // Status is read here, under the lock, at the takeover.
        let lost_now = !previous.watch.status().is_active();
        let lost = match previous.ending.load(Ordering::SeqCst) {
            WORKING => lost_now,
            RELEASING_LOST => true,
            _ => return,
        };
        if previous.worker == worker {
            // Its own earlier lease: released before it acquired again.
            return;
        }
        let counter = if previous.stalled {
            &self.starved_takeovers
        } else if lost {
            &self.lost_before_next
        } else {
            &self.lost_after_next
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// How a worker behaves.
#[derive(Clone, Copy, Debug)]
pub struct Workload {
    /// Work inside the critical section, between the read and the write.
    pub work: Duration,
    /// Give up a `lock()` after at most this long (random below it when
    /// `cancel_randomly`).
    pub acquire_timeout: Duration,
    /// Cancel acquisitions at random points of their wait.
    pub cancel_randomly: bool,
    /// Adds one worker on a thread and runtime of its own that blocks its
    /// thread for this long inside every critical section: its watchdog (on
    /// the same runtime) is starved, as in a long GC pause.
    pub stall: Option<Duration>,
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            work: Duration::from_millis(2),
            acquire_timeout: Duration::from_secs(5),
            cancel_randomly: false,
            stall: None,
        }
    }
}

/// What the workers of a run contend on.
#[derive(Clone, Debug)]
pub enum Subject {
    /// A mutex (or any primitive acting as one): a fenced read-modify-write
    /// on one value.
    Mutex(Arc<dyn Lock>),
    /// A read-write lock: writers do a two-step fenced write (through the
    /// run's fence), readers read twice; `reads_percent` of the
    /// acquisitions read.
    ReadWrite {
        /// The lock.
        lock: Arc<dyn ReadWriteLock>,
        /// The share of acquisitions that read, in percent.
        reads_percent: u8,
    },
    /// A semaphore: each holder claims one of its permits' slots and does a
    /// fenced read-modify-write on it ([`SlotStore`]).
    Semaphore(Arc<dyn Semaphore>),
}

/// Which primitive a scenario runs on: every scenario runs once per shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// The unfair mutex.
    Mutex,
    /// The fair mutex.
    FairMutex,
    /// A read-write lock, half reads (so that every scenario has writes to check).
    ReadWrite,
    /// A semaphore of this many permits.
    Semaphore(u32),
}

impl Shape {
    /// A short label for scenario names.
    #[must_use]
    pub fn label(self) -> String {
        match self {
            Shape::Mutex => "mutex".into(),
            Shape::FairMutex => "fair mutex".into(),
            Shape::ReadWrite => "rw lock".into(),
            Shape::Semaphore(n) => format!("semaphore of {n}"),
        }
    }

    /// A scenario's name with this shape's label.
    #[must_use]
    pub fn scenario(self, base: &str) -> String {
        format!("{base} [{}]", self.label())
    }

    /// Makes this shape's subject named `name` on a provider, with `lease`
    /// (`None`: the provider's default, as a session backend needs).
    ///
    /// # Panics
    ///
    /// When the provider refuses the name or the lease.
    pub fn maker(
        self,
        name: &str,
        lease: Option<distlock_core::LeaseOptions>,
    ) -> impl Fn(&dyn Provider) -> Subject + '_ {
        move |p| {
            let lease = lease.unwrap_or_else(|| p.default_lease());
            match self {
                Shape::Mutex => Subject::Mutex(
                    p.with_lease(lease)
                        .expect("lease")
                        .mutex(name)
                        .expect("mutex"),
                ),
                Shape::FairMutex => Subject::Mutex(
                    p.with_lease(lease)
                        .expect("lease")
                        .fair_mutex(name)
                        .expect("fair mutex"),
                ),
                Shape::ReadWrite => Subject::ReadWrite {
                    lock: p
                        .with_lease(lease)
                        .expect("lease")
                        .rw_lock(name)
                        .expect("rw lock"),
                    reads_percent: 50,
                },
                Shape::Semaphore(n) => Subject::Semaphore(
                    p.with_lease(lease)
                        .expect("lease")
                        .semaphore(name, n)
                        .expect("semaphore"),
                ),
            }
        }
    }
}

/// What one acquisition does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Exclusive,
    Read,
    Write,
    Permit,
}

impl Subject {
    fn pick(&self, rng: &mut fastrand::Rng) -> (Arc<dyn Lock>, Role) {
        match self {
            Subject::Mutex(lock) => (Arc::clone(lock), Role::Exclusive),
            Subject::ReadWrite {
                lock,
                reads_percent,
            } => {
                if rng.u8(0..100) < *reads_percent {
                    (lock.read(), Role::Read)
                } else {
                    (lock.write(), Role::Write)
                }
            }
            Subject::Semaphore(s) => (Arc::clone(s) as Arc<dyn Lock>, Role::Permit),
        }
    }

    /// The run's resource: a mutex's value or a read-write lock's on
    /// `store` (the product's fence; the in-process [`MemFence`] when
    /// `None`), a semaphore's slots.
    fn resource(&self, store: Option<&Arc<dyn ProductStore>>) -> Resource {
        let fenced = || {
            Fenced::new(
                store
                    .cloned()
                    .unwrap_or_else(|| Arc::new(MemFence::<u64>::new()) as Arc<dyn ProductStore>),
            )
        };
        match self {
            Subject::Mutex(_) => Resource::Value(fenced()),
            Subject::ReadWrite { .. } => Resource::ReadWrite(fenced()),
            Subject::Semaphore(s) => {
                Resource::Slots(SlotStore::new(usize::try_from(s.permits()).unwrap_or(1)))
            }
        }
    }
}

/// One fenced access as the history records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// The worker (its holder at the time).
    pub worker: u64,
    /// The token it carried.
    pub token: u64,
    /// Whether the token was an exclusive holder's.
    pub exclusive: bool,
    /// `None`: admitted; `Some(h)`: refused as stale, `h` the highest the
    /// store compared it with.
    pub refused: Option<u64>,
    /// When the access was sent (its first try).
    pub start: Instant,
    /// When its answer came.
    pub end: Instant,
}

/// The history check, the property Kleppmann states, over one resource's
/// fenced accesses (real-time order: an access "after" another started
/// after the other's answer came):
///
/// * admitted tokens never go down: no access is admitted after an access
///   with a higher token was, where either is exclusive (shared tokens,
///   readers', interleave among themselves by design), so no write of a
///   holder is admitted after a newer holder's write was;
/// * every refusal was of a token below the highest admitted: the refused
///   token is below the `highest` the store named, and that token was
///   admitted (by an exclusive access, for a shared refusal) by an access
///   sent before the refusal came.
///
/// Returns a description of every violation.
#[must_use]
pub fn history_violations(attempts: &[Attempt]) -> Vec<String> {
    use std::collections::HashMap;
    let mut violations = Vec::new();
    let mut admitted: Vec<&Attempt> = attempts.iter().filter(|a| a.refused.is_none()).collect();
    admitted.sort_by_key(|a| a.end);
    let mut earliest_any: HashMap<u64, Instant> = HashMap::new();
    let mut earliest_exclusive: HashMap<u64, Instant> = HashMap::new();
    for a in &admitted {
        let e = earliest_any.entry(a.token).or_insert(a.start);
        *e = (*e).min(a.start);
        if a.exclusive {
            let e = earliest_exclusive.entry(a.token).or_insert(a.start);
            *e = (*e).min(a.start);
        }
    }
    let mut by_start: Vec<&Attempt> = attempts.iter().collect();
    by_start.sort_by_key(|a| a.start);
    let (mut next, mut max_any, mut max_exclusive) = (0, 0u64, 0u64);
    for b in by_start {
        while next < admitted.len() && admitted[next].end < b.start {
            max_any = max_any.max(admitted[next].token);
            if admitted[next].exclusive {
                max_exclusive = max_exclusive.max(admitted[next].token);
            }
            next += 1;
        }
        match b.refused {
            None => {
                let bar = if b.exclusive { max_any } else { max_exclusive };
                if b.token < bar {
                    violations.push(format!(
                        "worker {} admitted with token {} after {bar} was: {b:?}",
                        b.worker, b.token
                    ));
                }
            }
            Some(highest) => {
                let named = if b.exclusive {
                    earliest_any.get(&highest)
                } else {
                    earliest_exclusive.get(&highest)
                };
                if b.token >= highest || named.is_none_or(|start| *start >= b.end) {
                    violations.push(format!(
                        "worker {} refused with token {} for {highest}, not an admitted higher token: {b:?}",
                        b.worker, b.token
                    ));
                }
            }
        }
    }
    violations
}

/// A value on the product's fence, with its history.
struct Fenced {
    store: Arc<dyn ProductStore>,
    name: String,
    accepted: AtomicU64,
    /// Writes refused after an unknown outcome: the first try may have
    /// landed (the retry was then refused for a newer holder's token).
    uncertain: AtomicU64,
    torn: AtomicU64,
    history: Mutex<Vec<Attempt>>,
}

/// Retries a fenced access whose outcome is unknown (a retryable error: a
/// cut, a timeout) with the same token until it is admitted or refused:
/// the retry of an access that landed is admitted as the same holder's.
/// Also says whether an outcome was unknown on the way.
async fn settle<T, Fut>(mut access: impl FnMut() -> Fut) -> (distlock_core::Result<T>, bool)
where
    Fut: Future<Output = distlock_core::Result<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut retried = false;
    loop {
        match access().await {
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                retried = true;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => return (other, retried),
        }
    }
}

impl Fenced {
    fn new(store: Arc<dyn ProductStore>) -> Self {
        Fenced {
            store,
            name: format!("safety/{:016x}", fastrand::u64(..)),
            accepted: AtomicU64::new(0),
            uncertain: AtomicU64::new(0),
            torn: AtomicU64::new(0),
            history: Mutex::new(Vec::new()),
        }
    }

    fn record<T>(
        &self,
        worker: u64,
        token: FenceToken,
        start: Instant,
        outcome: &distlock_core::Result<T>,
    ) -> Result<(), Stale> {
        let refused = match outcome {
            Ok(_) => None,
            Err(Error::Stale { highest, .. }) => Some(*highest),
            Err(e) => panic!("the fenced store failed: {e:?}"),
        };
        self.history
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Attempt {
                worker,
                token: token.token(),
                exclusive: token.is_exclusive(),
                refused,
                start,
                end: Instant::now(),
            });
        if refused.is_some() {
            Err(Stale)
        } else {
            Ok(())
        }
    }

    /// A fenced read: admits `token` and reads, in one step.
    async fn read(&self, worker: u64, token: FenceToken) -> Result<u64, Stale> {
        let start = Instant::now();
        let (out, _) = settle(|| self.store.admit_read(&self.name, token)).await;
        self.record(worker, token, start, &out)?;
        Ok(out.ok().flatten().unwrap_or(0))
    }

    /// A fenced write of `value`.
    async fn write(&self, worker: u64, token: FenceToken, value: u64) -> Result<(), Stale> {
        let start = Instant::now();
        let (out, retried) = settle(|| self.store.write(&self.name, token, value)).await;
        if retried && out.is_err() {
            self.uncertain.fetch_add(1, Ordering::Relaxed);
        }
        self.record(worker, token, start, &out)?;
        self.accepted.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The value, the accepted writes (those refused after an unknown
    /// outcome whose first try the value shows count too) and the torn
    /// reads.
    async fn snapshot(&self) -> (u64, u64, u64) {
        let value = settle(|| self.store.read(&self.name))
            .await
            .0
            .expect("read the fenced value")
            .unwrap_or(0);
        let accepted = self.accepted.load(Ordering::Relaxed);
        let uncertain = self.uncertain.load(Ordering::Relaxed);
        // Each uncertain write landed at most once (its retries carry the
        // same value): the value is at most that many above.
        let accepted = if value > accepted && value <= accepted + uncertain {
            value
        } else {
            accepted
        };
        (value, accepted, self.torn.load(Ordering::Relaxed))
    }
}

/// The fenced resource of a run, and who is inside it.
enum Resource {
    /// A mutex's value: a fenced read, then a fenced write of the value
    /// read plus one.
    Value(Fenced),
    /// A read-write lock's value: writers as [`Resource::Value`], readers
    /// read twice (fenced, with shared tokens); a second read that finds
    /// another value is a torn read.
    ReadWrite(Fenced),
    /// A semaphore's slots.
    Slots(SlotStore),
}

/// What a holder read when it entered.
enum Entered {
    Value(u64),
    Claim(Claim),
}

impl Resource {
    /// The fenced first access of a hold.
    async fn enter(&self, worker: u64, role: Role, token: u64) -> Result<Entered, Stale> {
        match self {
            Resource::Value(f) => f
                .read(worker, FenceToken::exclusive(token))
                .await
                .map(Entered::Value),
            Resource::ReadWrite(f) if role == Role::Read => f
                .read(worker, FenceToken::shared(token))
                .await
                .map(Entered::Value),
            Resource::ReadWrite(f) => f
                .read(worker, FenceToken::exclusive(token))
                .await
                .map(Entered::Value),
            Resource::Slots(slots) => slots.claim(token).map(Entered::Claim),
        }
    }

    /// The fenced last access of a hold that still believed its lease held.
    async fn finish(
        &self,
        worker: u64,
        role: Role,
        token: u64,
        entered: Entered,
    ) -> Result<(), Stale> {
        match (self, entered) {
            (Resource::Value(f), Entered::Value(v)) => {
                f.write(worker, FenceToken::exclusive(token), v + 1).await
            }
            (Resource::ReadWrite(f), Entered::Value(v)) if role == Role::Read => {
                let again = f.read(worker, FenceToken::shared(token)).await?;
                if again != v {
                    f.torn.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            }
            (Resource::ReadWrite(f), Entered::Value(v)) => {
                f.write(worker, FenceToken::exclusive(token), v + 1).await
            }
            (Resource::Slots(slots), Entered::Claim(c)) => slots.write(token, c),
            _ => Err(Stale),
        }
    }

    /// A hold that saw its lease lost leaves without its last access.
    fn abandon(&self, token: u64, entered: Entered) {
        if let (Resource::Slots(slots), Entered::Claim(c)) = (self, entered) {
            slots.give_back(token, c);
        }
    }

    /// The final value, accepted writes and torn reads.
    async fn snapshot(&self) -> (u64, u64, u64) {
        match self {
            Resource::Value(f) | Resource::ReadWrite(f) => f.snapshot().await,
            Resource::Slots(slots) => {
                let (v, w) = slots.snapshot();
                (v, w, 0)
            }
        }
    }

    /// The histories checked (0 or 1), their accesses and violations.
    fn check_history(&self, scenario: &str) -> (u64, u64, u64) {
        match self {
            Resource::Value(f) | Resource::ReadWrite(f) => {
                let history = f.history.lock().unwrap_or_else(PoisonError::into_inner);
                let violations = history_violations(&history);
                for v in violations.iter().take(5) {
                    eprintln!("{scenario}: history violation: {v}");
                }
                (1, history.len() as u64, violations.len() as u64)
            }
            Resource::Slots(_) => (0, 0, 0),
        }
    }
}

/// Who is inside the critical sections, to count overlaps.
#[derive(Default)]
struct Occupancy {
    /// Exclusive holders and writers.
    exclusive: u64,
    readers: u64,
    permits: u64,
}

impl Occupancy {
    /// Enters as `role`; whether that overlaps what `role` must exclude.
    fn enter(&mut self, role: Role, permits: u64) -> bool {
        match role {
            Role::Exclusive | Role::Write => {
                let overlap = self.exclusive > 0 || self.readers > 0;
                self.exclusive += 1;
                overlap
            }
            Role::Read => {
                self.readers += 1;
                self.exclusive > 0
            }
            Role::Permit => {
                self.permits += 1;
                self.permits > permits
            }
        }
    }

    fn leave(&mut self, role: Role) {
        let n = match role {
            Role::Exclusive | Role::Write => &mut self.exclusive,
            Role::Read => &mut self.readers,
            Role::Permit => &mut self.permits,
        };
        *n = n.saturating_sub(1);
    }
}

/// How long a run goes on past its duration, with no more faults, while
/// no write has been accepted yet. A run of faults can leave none (the
/// read-write lock's workers may all pick reads while a server restarts,
/// on a loaded machine), and a run with no write proves nothing: it goes
/// on until one lands. Reaching this cap is a failure of liveness (no
/// write in that time on a healthy server), which the scenario's
/// `accepted_writes > 0` check then reports.
const WRITE_CAP: Duration = Duration::from_secs(30);

/// One worker's loop: acquire, read, work (or stall), check, write,
/// release, until `until`, then on while no write has been accepted yet
/// (up to [`WRITE_CAP`] more). `seed` is also the worker's id, unique
/// within a run.
#[allow(clippy::too_many_arguments)]
async fn worker(
    subject: Subject,
    resource: Arc<Resource>,
    counters: Arc<Counters>,
    workload: Workload,
    until: Instant,
    seed: u64,
    stall: Option<Duration>,
) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let permits = match &subject {
        Subject::Semaphore(s) => u64::from(s.permits()),
        _ => 1,
    };
    let running = || {
        let now = Instant::now();
        now < until || (counters.writes.load(Ordering::Relaxed) == 0 && now < until + WRITE_CAP)
    };
    while running() {
        counters.operations.fetch_add(1, Ordering::Relaxed);
        let limit =
            if workload.cancel_randomly {
                Duration::from_micros(rng.u64(
                    0..=u64::try_from(workload.acquire_timeout.as_micros()).unwrap_or(u64::MAX),
                ))
            } else {
                workload.acquire_timeout
            };
        let (lock, role) = subject.pick(&mut rng);
        let guard = match tokio::time::timeout(limit, lock.lock()).await {
            Ok(Ok(guard)) => guard,
            Ok(Err(_)) => {
                // Faults make acquisitions fail: back off and try again.
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            Err(_) => continue,
        };
        let token = guard.fencing_token();
        let ending = Arc::new(AtomicU8::new(WORKING));
        if matches!(role, Role::Exclusive | Role::Write) {
            // Exclusive holds follow each other: classify the takeover.
            counters.take_over(Holder {
                worker: seed,
                token,
                watch: guard.watch(),
                ending: Arc::clone(&ending),
                stalled: stall.is_some(),
            });
        }
        counters.acquisitions.fetch_add(1, Ordering::Relaxed);
        if counters.occupy(role, permits) {
            counters.overlaps.fetch_add(1, Ordering::Relaxed);
        }
        match resource.enter(seed, role, token).await {
            Ok(entered) => {
                // The stalled worker pauses either before it checks its
                // lease (it then sees the lease gone: the guard compares
                // the clock with its deadline itself) or between the check
                // and the write, where no signal can help: the fence must
                // refuse the write.
                let stall_after_check = stall.is_some() && rng.bool();
                match stall {
                    // Blocks the thread: nothing else on this runtime runs.
                    Some(stall) if !stall_after_check => std::thread::sleep(stall),
                    _ => tokio::time::sleep(workload.work).await,
                }
                if guard.is_held() {
                    if let (true, Some(stall)) = (stall_after_check, stall) {
                        std::thread::sleep(stall);
                    }
                    if resource.finish(seed, role, token, entered).await.is_err() {
                        counters.stale.fetch_add(1, Ordering::Relaxed);
                        counters.unnoticed.fetch_add(1, Ordering::Relaxed);
                    } else if role != Role::Read {
                        counters.writes.fetch_add(1, Ordering::Relaxed);
                    }
                } else {
                    counters.noticed.fetch_add(1, Ordering::Relaxed);
                    resource.abandon(token, entered);
                }
            }
            Err(Stale) => {
                counters.stale.fetch_add(1, Ordering::Relaxed);
                counters.unnoticed.fetch_add(1, Ordering::Relaxed);
            }
        }
        counters.vacate(role);
        let how = if guard.is_held() {
            RELEASING_HELD
        } else {
            RELEASING_LOST
        };
        ending.store(how, Ordering::SeqCst);
        // Under faults the release may fail; the lease then ends by itself.
        let _ = tokio::time::timeout(Duration::from_secs(5), guard.release()).await;
    }
}

/// Runs `workers` per client on the lock made by `make_lock` for `duration`,
/// while `faults` runs; `faults` returns how many faults it injected.
///
/// # Panics
///
/// When the resource lost an update (the invariant), or a worker panicked.
pub async fn run<F, Fut>(
    scenario: &str,
    clients: &[Arc<dyn Provider>],
    workers: usize,
    make_lock: impl Fn(&dyn Provider) -> Arc<dyn Lock>,
    workload: Workload,
    duration: Duration,
    faults: F,
) -> Report
where
    F: FnOnce(Instant) -> Fut,
    Fut: Future<Output = u64>,
{
    let make = |p: &dyn Provider| Subject::Mutex(make_lock(p));
    run_with(scenario, clients, workers, make, workload, duration, faults).await
}

/// Runs `workers` per client on the subject (mutex, read-write lock or
/// semaphore, with its fenced resource) made by `make` for `duration`,
/// while `faults` runs; `faults` returns how many faults it injected.
///
/// # Panics
///
/// When the resource lost an update or a read was torn (the invariants),
/// or a worker panicked.
pub async fn run_with<F, Fut>(
    scenario: &str,
    clients: &[Arc<dyn Provider>],
    workers: usize,
    make: impl Fn(&dyn Provider) -> Subject,
    workload: Workload,
    duration: Duration,
    faults: F,
) -> Report
where
    F: FnOnce(Instant) -> Fut,
    Fut: Future<Output = u64>,
{
    run_fenced(
        scenario, clients, workers, make, None, workload, duration, faults,
    )
    .await
}

/// As [`run_with`], with the mutex's or read-write lock's value kept on
/// `store` (a product fence: `RedisFence` in distlock-redis's safety
/// tests) instead of the in-process [`MemFence`] (`None`). Every fenced
/// access is recorded and the history checked ([`history_violations`]).
///
/// # Panics
///
/// When the resource lost an update, a read was torn or the history check
/// found a violation (the invariants), the store failed other than by a
/// retryable error or a refusal, or a worker panicked.
#[allow(clippy::too_many_arguments)]
pub async fn run_fenced<F, Fut>(
    scenario: &str,
    clients: &[Arc<dyn Provider>],
    workers: usize,
    make: impl Fn(&dyn Provider) -> Subject,
    store: Option<Arc<dyn ProductStore>>,
    workload: Workload,
    duration: Duration,
    faults: F,
) -> Report
where
    F: FnOnce(Instant) -> Fut,
    Fut: Future<Output = u64>,
{
    let resource = Arc::new(make(clients[0].as_ref()).resource(store.as_ref()));
    let counters = Arc::new(Counters::default());
    let until = Instant::now() + duration;
    let mut tasks = Vec::new();
    for (i, client) in clients.iter().enumerate() {
        for w in 0..workers {
            tasks.push(tokio::spawn(worker(
                make(client.as_ref()),
                Arc::clone(&resource),
                Arc::clone(&counters),
                workload,
                until,
                (i * 1000 + w) as u64,
                None,
            )));
        }
    }
    let staller = workload.stall.map(|stall| {
        let (subject, resource, counters) = (
            make(clients[0].as_ref()),
            Arc::clone(&resource),
            Arc::clone(&counters),
        );
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("staller runtime");
            rt.block_on(worker(
                subject,
                resource,
                counters,
                workload,
                until,
                // Its seed is its id too: apart from every `i * 1000 + w`.
                u64::MAX,
                Some(stall),
            ));
        })
    });
    let faults = faults(until).await;
    for t in tasks {
        t.await.expect("worker panicked");
    }
    if let Some(staller) = staller {
        staller.join().expect("staller panicked");
    }
    let (value, accepted_writes, torn_reads) = resource.snapshot().await;
    let (histories, history_attempts, history_violations) = resource.check_history(scenario);
    let report = Report {
        scenario: scenario.to_owned(),
        operations: counters.operations.load(Ordering::Relaxed),
        acquisitions: counters.acquisitions.load(Ordering::Relaxed),
        faults,
        overlaps: counters.overlaps.load(Ordering::Relaxed),
        stale_rejected: counters.stale.load(Ordering::Relaxed),
        accepted_writes,
        lost_updates: accepted_writes.saturating_sub(value),
        torn_reads,
        histories,
        history_attempts,
        history_violations,
        lost_noticed: counters.noticed.load(Ordering::Relaxed),
        lost_unnoticed: counters.unnoticed.load(Ordering::Relaxed),
        lost_before_next: counters.lost_before_next.load(Ordering::Relaxed),
        lost_after_next: counters.lost_after_next.load(Ordering::Relaxed),
        starved_takeovers: counters.starved_takeovers.load(Ordering::Relaxed),
        free_stalls: None,
    };
    assert_eq!(
        value, accepted_writes,
        "lost update in {scenario}: {report:?}"
    );
    assert_eq!(torn_reads, 0, "torn read in {scenario}: {report:?}");
    assert_eq!(
        history_violations, 0,
        "the history check failed in {scenario}: {report:?}"
    );
    report
}

/// Seconds per scenario: `DISTLOCK_SAFETY_SECS`, default `ci` (CI-sized).
#[must_use]
pub fn scenario_duration(ci: Duration) -> Duration {
    std::env::var("DISTLOCK_SAFETY_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .map_or(ci, Duration::from_secs_f64)
}

/// Appends a report line to the file named by `DISTLOCK_SAFETY_REPORT`, if
/// set (the long run collects its table this way), and prints it.
pub fn publish(report: &Report) {
    println!("{}\n{report}", Report::header());
    if let Ok(path) = std::env::var("DISTLOCK_SAFETY_REPORT") {
        use std::io::Write as _;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{report}");
        }
    }
}

// ------------------------------------------------------------ liveness

/// What a liveness run measured: how long a free lock sat while a live
/// waiter was waiting (see [`run_liveness`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FreeStalls {
    /// Stalls measured: hand-overs to a live waiter, and a lock still free
    /// with a live waiter at the end of the run.
    pub handovers: u64,
    /// The longest.
    pub worst: Duration,
    /// How many were longer than `threshold`.
    pub over: u64,
    /// The threshold of `over`.
    pub threshold: Duration,
}

impl fmt::Display for FreeStalls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ms; {} of {} > {} ms",
            self.worst.as_millis(),
            self.over,
            self.handovers,
            self.threshold.as_millis()
        )
    }
}

/// Panics unless the longest stall of `report` is at most `bound` and at
/// most `allowed_over` stalls were longer than its threshold (one per
/// fault, say: at most one such stall per dead provider).
///
/// # Panics
///
/// As said, or when the report has no liveness figure.
pub fn assert_liveness(report: &Report, bound: Duration, allowed_over: u64) {
    let stalls = report
        .free_stalls
        .unwrap_or_else(|| panic!("{}: no liveness figure", report.scenario));
    assert!(
        stalls.worst <= bound && stalls.over <= allowed_over,
        "{}: a free lock sat with a live waiter for up to {:?} (bound {bound:?}), \
         {} stalls over {:?} (allowed {allowed_over}): {report:?}",
        report.scenario,
        stalls.worst,
        stalls.over,
        stalls.threshold,
    );
}

/// The primitive of a liveness run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LiveShape {
    /// The unfair mutex.
    Mutex,
    /// The fair mutex.
    FairMutex,
    /// The election (a term is a hold, resigning a release).
    Election,
}

impl LiveShape {
    /// A scenario's name with this shape's label.
    #[must_use]
    pub fn scenario(self, base: &str) -> String {
        let label = match self {
            LiveShape::Mutex => "mutex",
            LiveShape::FairMutex => "fair mutex",
            LiveShape::Election => "election",
        };
        format!("{base} [{label}]")
    }

    fn make(self, p: &dyn Provider, name: &str, lease: Option<LeaseOptions>) -> Contended {
        let lease = lease.unwrap_or_else(|| p.default_lease());
        match self {
            LiveShape::Mutex => Contended::Lock(
                p.with_lease(lease)
                    .expect("lease")
                    .mutex(name)
                    .expect("mutex"),
            ),
            LiveShape::FairMutex => Contended::Lock(
                p.with_lease(lease)
                    .expect("lease")
                    .fair_mutex(name)
                    .expect("fair mutex"),
            ),
            LiveShape::Election => Contended::Election(
                p.with_lease(lease)
                    .expect("lease")
                    .election(name)
                    .expect("election"),
            ),
        }
    }
}

enum Contended {
    Lock(Arc<dyn Lock>),
    Election(Arc<dyn Election>),
}

enum Hold {
    Guard(LockGuard),
    Leader(Leadership),
}

impl Contended {
    /// `Ok(None)`: not within `limit`.
    async fn acquire(
        &self,
        candidate: &str,
        limit: Duration,
    ) -> distlock_core::Result<Option<Hold>> {
        match self {
            // The outer timeout too: a wait that overruns its own deadline
            // must not stall the worker's loop.
            Contended::Lock(lock) => {
                match tokio::time::timeout(limit, lock.lock_timeout(limit)).await {
                    Ok(r) => r.map(|g| g.map(Hold::Guard)),
                    Err(_) => Ok(None),
                }
            }
            Contended::Election(e) => {
                match tokio::time::timeout(limit, e.campaign(candidate)).await {
                    Ok(r) => r.map(|l| Some(Hold::Leader(l))),
                    Err(_) => Ok(None),
                }
            }
        }
    }
}

impl Hold {
    fn token(&self) -> u64 {
        match self {
            Hold::Guard(g) => g.fencing_token(),
            Hold::Leader(l) => l.term(),
        }
    }

    fn is_held(&self) -> bool {
        match self {
            Hold::Guard(g) => g.is_held(),
            Hold::Leader(l) => l.is_leader(),
        }
    }

    async fn release(self) -> distlock_core::Result<()> {
        match self {
            Hold::Guard(g) => g.release().await,
            Hold::Leader(l) => l.resign().await,
        }
    }
}

/// The fault a liveness run repeats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LiveFault {
    /// A member dies: its proxy swallows every byte and cuts every
    /// connection, never to be restored, and its worker task is aborted
    /// (whatever it was doing: waiting in line or holding).
    Death,
    /// A member's pub/sub connection goes silent but stays open
    /// ([`Proxy::silence_connections_that_sent`] on `SUBSCRIBE`); the
    /// member stays alive, and its waiters count as live.
    SilentSubscriber,
    /// Every connection of a member is cut ([`Proxy::cut`]); it reconnects.
    Cut,
    /// A member's next request containing the marker (say a lock node's
    /// name) is forwarded, its reply swallowed, and then its connections
    /// are cut: the request landed, the client saw a reset
    /// ([`Proxy::lose_reply_to`], then [`Proxy::cut`]). Not counted when no
    /// such request came within half the fault interval.
    CutAfterRequest(&'static [u8]),
    /// A member's proxy swallows every byte for this long, connections
    /// open ([`Proxy::set_blackhole`]): a partition shorter than the
    /// session, longer than the client's own no-response timeout.
    Blackhole(Duration),
}

/// One contender of a liveness run: a provider connected through its own
/// proxy.
pub struct Member {
    /// The provider.
    pub provider: Arc<dyn Provider>,
    /// Its proxy to the server.
    pub proxy: Proxy,
}

/// How a liveness run goes.
#[derive(Clone, Copy, Debug)]
pub struct LivePlan {
    /// The fault.
    pub fault: LiveFault,
    /// The first fault comes after this, then one every `every`.
    pub every: Duration,
    /// How long a dead member's lease or session can hold the lock on the
    /// server after its death, at the latest (the TTL; the session timeout
    /// and a server tick): a dead holder's lock counts as free from then.
    pub dead_lease: Duration,
    /// A failed release may leave the lock held this long (as `dead_lease`).
    pub failed_release: Duration,
    /// Stalls longer than this are counted.
    pub threshold: Duration,
    /// Members never faulted (deaths stop when only these are left).
    pub spared: usize,
    /// Work under the lock.
    pub work: Duration,
    /// A member pauses up to this long (at random) between a release and
    /// its next acquisition: long enough that the waiters a release must
    /// wake are in line, not arriving afresh (a fresh attempt would find
    /// the lock free and hide a lost wake-up).
    pub pause: Duration,
}

/// The test side's view of who holds, who waits and since when the lock is
/// free.
#[derive(Default)]
struct Watcher {
    /// Token and member of the latest holder.
    holder: Option<(u64, usize)>,
    /// The latest holder's token and the instant the lock is free at the
    /// latest: its release returned, or its death plus `dead_lease`.
    free_since: Option<(u64, Instant)>,
    /// Members waiting now, since when.
    waiting: std::collections::HashMap<usize, Instant>,
    /// Dead members, and when they died.
    dead: std::collections::HashMap<usize, Instant>,
    stalls: Vec<Duration>,
}

impl Watcher {
    fn earliest_live_waiter(&self) -> Option<Instant> {
        self.waiting
            .iter()
            .filter(|(m, _)| !self.dead.contains_key(m))
            .map(|(_, since)| *since)
            .min()
    }

    fn waits(&mut self, member: usize, now: Instant) {
        if !self.dead.contains_key(&member) {
            self.waiting.insert(member, now);
        }
    }

    fn stops_waiting(&mut self, member: usize) {
        self.waiting.remove(&member);
    }

    fn acquired(&mut self, member: usize, token: u64, now: Instant, dead_lease: Duration) {
        if self.holder.is_some_and(|(t, _)| t > token) {
            // Superseded already: a later holder recorded itself first.
            self.waiting.remove(&member);
            return;
        }
        if let Some(&died) = self.dead.get(&member) {
            // Its acquisition landed before its death: held, by nobody
            // alive, until its lease can end.
            self.holder = Some((token, member));
            self.free_since = Some((token, died + dead_lease));
            return;
        }
        if let Some((t, free)) = self.free_since.take() {
            if t < token {
                // The stall counts from when the lock was free and a live
                // waiter (this one at least) was waiting.
                let from = self.earliest_live_waiter().map_or(free, |w| w.max(free));
                self.stalls.push(now.saturating_duration_since(from));
            }
        }
        self.waiting.remove(&member);
        self.holder = Some((token, member));
    }

    /// A hold ended at `free` at the latest (unless another holder came).
    fn released(&mut self, member: usize, token: u64, free: Instant) {
        if self.holder == Some((token, member)) && !self.dead.contains_key(&member) {
            self.free_since = Some((token, free));
        }
    }

    fn died(&mut self, member: usize, now: Instant, dead_lease: Duration) {
        self.dead.insert(member, now);
        self.waiting.remove(&member);
        if let Some((token, m)) = self.holder {
            if m == member && self.free_since.is_none_or(|(t, _)| t != token) {
                self.free_since = Some((token, now + dead_lease));
            }
        }
    }

    /// The end of the run: a lock still free with a live waiter is a stall
    /// up to now.
    fn close(&mut self, now: Instant) {
        if let (Some((_, free)), Some(w)) = (self.free_since, self.earliest_live_waiter()) {
            if free < now {
                self.stalls.push(now.saturating_duration_since(w.max(free)));
            }
        }
    }
}

/// An exclusive holder inside the critical section until dropped.
struct Inside<'a>(&'a Counters);

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0.vacate(Role::Exclusive);
    }
}

fn seen(w: &Mutex<Watcher>) -> std::sync::MutexGuard<'_, Watcher> {
    w.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs one worker per member on the primitive `shape` named `name` for
/// `duration`, repeating `plan.fault` on members other than the first
/// `plan.spared`, and measures **how long the lock sat free while a live
/// waiter waited**: from the moment it was free (a release returned, or a
/// dead holder's lease could end at the latest: its death plus
/// `plan.dead_lease`) to the moment the next live acquisition returned,
/// counted from the later of that and the start of the earliest live
/// waiter's wait. Each holder also does a fenced read-modify-write, so
/// the run checks for lost updates too.
///
/// # Panics
///
/// When the resource lost an update, or a worker panicked.
#[allow(clippy::too_many_lines)]
pub async fn run_liveness(
    scenario: &str,
    members: Vec<Member>,
    shape: LiveShape,
    name: &str,
    lease: Option<LeaseOptions>,
    plan: LivePlan,
    duration: Duration,
) -> Report {
    let store = Arc::new(FencedStore::default());
    let watcher = Arc::new(Mutex::new(Watcher::default()));
    let counters = Arc::new(Counters::default());
    let until = Instant::now() + duration;
    let mut tasks = Vec::new();
    for (m, member) in members.iter().enumerate() {
        let contended = shape.make(member.provider.as_ref(), name, lease);
        let (store, counters) = (Arc::clone(&store), Arc::clone(&counters));
        let watcher = Arc::clone(&watcher);
        tasks.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(m as u64);
            let candidate = format!("member-{m}");
            while Instant::now() < until {
                counters.operations.fetch_add(1, Ordering::Relaxed);
                seen(&watcher).waits(m, Instant::now());
                let hold = match contended.acquire(&candidate, Duration::from_secs(5)).await {
                    Ok(Some(hold)) => hold,
                    Ok(None) => {
                        seen(&watcher).stops_waiting(m);
                        continue;
                    }
                    Err(_) => {
                        seen(&watcher).stops_waiting(m);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let token = hold.token();
                seen(&watcher).acquired(m, token, Instant::now(), plan.dead_lease);
                counters.acquisitions.fetch_add(1, Ordering::Relaxed);
                if counters.occupy(Role::Exclusive, 1) {
                    counters.overlaps.fetch_add(1, Ordering::Relaxed);
                }
                // Leaves the section when dropped: also when the member dies
                // (its task aborted) inside it, since a dead process does not
                // touch the resource again.
                let inside = Inside(&counters);
                match store.read(token) {
                    Ok(v) => {
                        tokio::time::sleep(plan.work).await;
                        if !hold.is_held() {
                            counters.noticed.fetch_add(1, Ordering::Relaxed);
                        } else if store.write(token, v + 1).is_err() {
                            counters.stale.fetch_add(1, Ordering::Relaxed);
                            counters.unnoticed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Err(Stale) => {
                        counters.stale.fetch_add(1, Ordering::Relaxed);
                        counters.unnoticed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                drop(inside);
                let started = Instant::now();
                let released = tokio::time::timeout(Duration::from_secs(5), hold.release()).await;
                // Free by now, or (failed) once the lease can end.
                let free = match released {
                    Ok(Ok(())) => Instant::now(),
                    _ => started + plan.failed_release,
                };
                seen(&watcher).released(m, token, free);
                let pause = u64::try_from(plan.pause.as_micros()).unwrap_or(u64::MAX);
                tokio::time::sleep(Duration::from_micros(rng.u64(0..=pause))).await;
            }
        }));
    }
    let mut faults = 0;
    let mut rng = fastrand::Rng::with_seed(29);
    let mut alive: Vec<usize> = (plan.spared..members.len()).collect();
    let mut next = Instant::now() + plan.every;
    while next + plan.every / 2 < until && !alive.is_empty() {
        tokio::time::sleep_until(next.into()).await;
        next += plan.every;
        match plan.fault {
            LiveFault::Death => {
                let m = alive.swap_remove(rng.usize(0..alive.len()));
                let proxy = &members[m].proxy;
                proxy.set_blackhole(true);
                proxy.cut();
                tasks[m].abort();
                watcher.lock().unwrap_or_else(PoisonError::into_inner).died(
                    m,
                    Instant::now(),
                    plan.dead_lease,
                );
            }
            LiveFault::SilentSubscriber => {
                // Each member once: silenced for the rest of the run.
                let m = alive.swap_remove(rng.usize(0..alive.len()));
                if members[m].proxy.silence_connections_that_sent(b"SUBSCRIBE") == 0 {
                    // No subscriber connection open yet: no fault.
                    continue;
                }
            }
            LiveFault::Cut => members[alive[rng.usize(0..alive.len())]].proxy.cut(),
            LiveFault::Blackhole(length) => {
                let proxy = &members[alive[rng.usize(0..alive.len())]].proxy;
                proxy.set_blackhole(true);
                tokio::time::sleep(length).await;
                proxy.set_blackhole(false);
            }
            LiveFault::CutAfterRequest(marker) => {
                let proxy = &members[alive[rng.usize(0..alive.len())]].proxy;
                proxy.lose_reply_to(marker);
                let give_up = Instant::now() + plan.every / 2;
                while !proxy.losing_replies() && Instant::now() < give_up {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                let landed = proxy.losing_replies();
                // A moment for the client to wait on the lost reply.
                tokio::time::sleep(Duration::from_millis(20)).await;
                proxy.heal();
                proxy.cut();
                if !landed {
                    continue;
                }
            }
        }
        faults += 1;
    }
    tokio::time::sleep_until(until.into()).await;
    seen(&watcher).close(Instant::now());
    for t in tasks {
        match t.await {
            Ok(()) => {}
            Err(e) if e.is_cancelled() => {}
            Err(e) => panic!("worker panicked: {e}"),
        }
    }
    let (value, accepted_writes) = store.snapshot();
    let stalls = std::mem::take(&mut seen(&watcher).stalls);
    let free_stalls = FreeStalls {
        handovers: stalls.len() as u64,
        worst: stalls.iter().copied().max().unwrap_or_default(),
        over: stalls.iter().filter(|s| **s > plan.threshold).count() as u64,
        threshold: plan.threshold,
    };
    let report = Report {
        scenario: scenario.to_owned(),
        operations: counters.operations.load(Ordering::Relaxed),
        acquisitions: counters.acquisitions.load(Ordering::Relaxed),
        faults,
        overlaps: counters.overlaps.load(Ordering::Relaxed),
        stale_rejected: counters.stale.load(Ordering::Relaxed),
        accepted_writes,
        lost_updates: accepted_writes.saturating_sub(value),
        lost_noticed: counters.noticed.load(Ordering::Relaxed),
        lost_unnoticed: counters.unnoticed.load(Ordering::Relaxed),
        free_stalls: Some(free_stalls),
        ..Report::default()
    };
    assert_eq!(
        value, accepted_writes,
        "lost update in {scenario}: {report:?}"
    );
    report
}

/// Writes three `#[tokio::test]`s for a scenario function
/// `async fn name(shape: Shape)`, in a module of its name: `mutex` (the
/// unfair mutex, or with `fair` the fair mutex), `rw_lock` (half reads) and
/// `semaphore` (2 permits).
///
/// ```text
/// test_support::every_shape!(server_paused_past_the_ttl);
/// test_support::every_shape!(fair session_expiry_of_a_blackholed_client);
/// ```
#[macro_export]
macro_rules! every_shape {
    (fair $name:ident) => {
        $crate::every_shape!(@ $name, $crate::safety::Shape::FairMutex);
    };
    ($name:ident) => {
        $crate::every_shape!(@ $name, $crate::safety::Shape::Mutex);
    };
    (@ $name:ident, $mutex:expr) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mutex() {
                super::$name($mutex).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn rw_lock() {
                super::$name($crate::safety::Shape::ReadWrite).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn semaphore() {
                super::$name($crate::safety::Shape::Semaphore(2)).await;
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_fences_reads_and_writes() {
        let s = FencedStore::default();
        assert_eq!(s.read(5), Ok(0));
        assert_eq!(s.read(6), Ok(0));
        // Token 5 read before 6 did, but 6 has been seen since: refused.
        assert_eq!(s.write(5, 1), Err(Stale));
        assert_eq!(s.write(6, 1), Ok(()));
        assert_eq!(s.read(4), Err(Stale));
        assert_eq!(s.snapshot(), (1, 1));
    }

    fn holder(worker: u64, guard: &distlock_core::LockGuard, stalled: bool) -> Holder {
        Holder {
            worker,
            token: guard.fencing_token(),
            watch: guard.watch(),
            ending: Arc::new(AtomicU8::new(WORKING)),
            stalled,
        }
    }

    #[tokio::test]
    async fn takeovers_are_classified_by_the_previous_holders_status() {
        use distlock_core::mem::MemProvider;
        use distlock_core::LeaseOptions;

        let locks = MemProvider::new();
        let short = LeaseOptions::manual(Duration::from_millis(30)).unwrap();
        let counters = Counters::default();
        let expired = locks
            .with_lease(short)
            .unwrap()
            .mutex("a")
            .unwrap()
            .lock()
            .await
            .unwrap();
        counters.take_over(holder(1, &expired, false));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!expired.is_held());
        // Lost before the next holder came: counted as such.
        let held = locks.mutex("b").unwrap().lock().await.unwrap();
        counters.take_over(holder(2, &held, false));
        // Still held when the next holder came: late.
        let stalled = locks.mutex("c").unwrap().lock().await.unwrap();
        counters.take_over(holder(3, &stalled, true));
        // A stalled holder's takeover is counted apart.
        let released = locks.mutex("d").unwrap().lock().await.unwrap();
        let mut record = holder(4, &released, false);
        let ending = Arc::clone(&record.ending);
        counters.take_over(record);
        // Started releasing while held: not a takeover.
        ending.store(RELEASING_HELD, Ordering::SeqCst);
        let lost_then_released = locks.mutex("e").unwrap().lock().await.unwrap();
        record = holder(5, &lost_then_released, false);
        let ending = Arc::clone(&record.ending);
        counters.take_over(record);
        // Started releasing after it knew the lease was lost: lost before.
        ending.store(RELEASING_LOST, Ordering::SeqCst);
        let last = locks.mutex("f").unwrap().lock().await.unwrap();
        counters.take_over(holder(6, &last, false));
        // A superseded acquisition (a later token is recorded) changes
        // nothing; nor does a worker's own earlier lease.
        let mut stale = holder(7, &last, false);
        stale.token = 0;
        counters.take_over(stale);
        counters.take_over(holder(6, &last, false));

        let count = |c: &AtomicU64| c.load(Ordering::SeqCst);
        assert_eq!(count(&counters.lost_before_next), 2);
        assert_eq!(count(&counters.lost_after_next), 1);
        assert_eq!(count(&counters.starved_takeovers), 1);
        for g in [expired, held, stalled, released, lost_then_released, last] {
            let _ = g.release().await;
        }
    }

    #[test]
    fn the_history_check_finds_each_violation() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let a = |worker, token, exclusive, refused, start, end| Attempt {
            worker,
            token,
            exclusive,
            refused,
            start: at(start),
            end: at(end),
        };
        let good = [
            a(1, 5, true, None, 0, 1),
            a(2, 7, true, None, 2, 3),
            a(1, 5, true, Some(7), 4, 5),
            // Readers interleave; a reader below a writer is refused.
            a(3, 9, false, None, 6, 7),
            a(4, 8, false, None, 8, 9),
            a(5, 6, false, Some(7), 10, 11),
            // Overlapping in time: either order may have happened.
            a(6, 11, true, None, 12, 20),
            a(7, 10, true, None, 13, 14),
        ];
        assert_eq!(history_violations(&good), Vec::<String>::new());
        // A lower token admitted after a higher one's answer came.
        let mut bad = good.to_vec();
        bad.push(a(1, 10, true, None, 21, 22));
        assert_eq!(history_violations(&bad).len(), 1, "{bad:?}");
        // A reader admitted below a writer that was.
        let mut bad = good.to_vec();
        bad.push(a(3, 9, false, None, 21, 22));
        assert_eq!(history_violations(&bad).len(), 1);
        // A refusal naming a token nobody had admitted, or not higher.
        let mut bad = good.to_vec();
        bad.push(a(8, 3, true, Some(4), 21, 22));
        bad.push(a(8, 12, true, Some(11), 21, 22));
        // A shared refusal named for a reader's token.
        bad.push(a(9, 8, false, Some(9), 21, 22));
        assert_eq!(history_violations(&bad).len(), 3);
    }

    #[test]
    fn the_report_shows_lost_before_next_holder() {
        let mut report = Report {
            scenario: "s".into(),
            ..Report::default()
        };
        assert!(
            report.to_string().ends_with("| no takeover | - |"),
            "{report}"
        );
        assert!(report.to_string().contains("| 0, 0 |"), "{report}");
        assert_lost_before_next(&report);
        report.lost_before_next = 12;
        report.starved_takeovers = 3;
        assert!(
            report
                .to_string()
                .ends_with("| 100% (12/12); starved: 3 | - |"),
            "{report}"
        );
        assert_eq!(report.lost_before_next_share(), Some(1.0));
        assert_lost_before_next(&report);
        assert_eq!(
            Report::header()
                .lines()
                .next()
                .unwrap()
                .matches('|')
                .count(),
            report.to_string().matches('|').count()
        );
        report.lost_after_next = 4;
        assert!(report.to_string().contains("| 75% (12/16); starved: 3 |"));
        let caught = std::panic::catch_unwind(|| assert_lost_before_next(&report));
        assert!(caught.is_err(), "a late lost() passed");
        report.free_stalls = Some(FreeStalls {
            handovers: 9,
            worst: Duration::from_millis(812),
            over: 2,
            threshold: Duration::from_millis(500),
        });
        assert!(
            report.to_string().ends_with("| 812 ms; 2 of 9 > 500 ms |"),
            "{report}"
        );
        assert_liveness(&report, Duration::from_secs(1), 2);
        for (bound, allowed) in [(Duration::from_millis(800), 2), (Duration::from_secs(1), 1)] {
            let caught = std::panic::catch_unwind(|| assert_liveness(&report, bound, allowed));
            assert!(caught.is_err(), "{bound:?}, {allowed} passed");
        }
    }

    #[test]
    fn a_stall_counts_from_the_later_of_free_and_a_live_waiter() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let lease = Duration::from_millis(1000);
        let mut w = Watcher::default();
        w.waits(0, ms(0));
        w.acquired(0, 1, ms(0), lease);
        // Member 1 waits from 5; the release returns at 10; got at 12.
        w.waits(1, ms(5));
        w.released(0, 1, ms(10));
        w.acquired(1, 2, ms(12), lease);
        // Nobody waits until 30: the stall counts from 30.
        w.released(1, 2, ms(20));
        w.waits(0, ms(30));
        w.acquired(0, 3, ms(31), lease);
        // The holder dies at 40: free at 1040 at the latest; member 2
        // (waiting since 35) gets it at 1100.
        w.waits(2, ms(35));
        w.died(0, ms(40), lease);
        w.acquired(2, 4, ms(1100), lease);
        // A release recorded after the next holder's acquisition: ignored.
        w.waits(1, ms(1100));
        w.acquired(1, 5, ms(1101), lease);
        w.released(2, 4, ms(1102));
        // A dead member's waits do not count; the end closes an open stall.
        w.released(1, 5, ms(1200));
        w.waits(0, ms(1150));
        w.waits(2, ms(1300));
        w.close(ms(1500));
        let got: Vec<u128> = w.stalls.iter().map(Duration::as_millis).collect();
        assert_eq!(got, [2, 1, 60, 200]);
    }
}
