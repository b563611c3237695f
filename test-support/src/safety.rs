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

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock_core::{Lock, Provider};

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
    /// Critical sections entered while another was in progress.
    pub overlaps: u64,
    /// Reads and writes the resource refused for stale tokens.
    pub stale_rejected: u64,
    /// Writes accepted by the resource.
    pub accepted_writes: u64,
    /// Accepted writes minus the final value: must be 0.
    pub lost_updates: u64,
    /// Lost leases the holder learned of (`is_held()` false) before its
    /// write.
    pub lost_noticed: u64,
    /// Lost leases the holder did not know of at its write (the resource
    /// refused it).
    pub lost_unnoticed: u64,
}

impl Report {
    /// The share of lost leases noticed before the holder's next write.
    #[must_use]
    pub fn noticed_share(&self) -> Option<f64> {
        let lost = self.lost_noticed + self.lost_unnoticed;
        (lost > 0).then(|| self.lost_noticed as f64 / lost as f64)
    }

    /// The Markdown table header matching [`Report`]'s `Display`.
    #[must_use]
    pub fn header() -> &'static str {
        "| scenario | operations | acquisitions | faults | overlaps | stale rejected | lost updates | lost leases noticed before the write |\n|---|---:|---:|---:|---:|---:|---:|---:|"
    }
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
        write!(
            f,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            self.scenario,
            self.operations,
            self.acquisitions,
            self.faults,
            self.overlaps,
            self.stale_rejected,
            self.lost_updates,
            noticed
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
    inside: AtomicU64,
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

/// One worker's loop: acquire, read, work (or stall), check, write,
/// release.
async fn worker(
    lock: Arc<dyn Lock>,
    store: Arc<FencedStore>,
    counters: Arc<Counters>,
    workload: Workload,
    until: Instant,
    seed: u64,
    stall: Option<Duration>,
) {
    let mut rng = fastrand::Rng::with_seed(seed);
    while Instant::now() < until {
        counters.operations.fetch_add(1, Ordering::Relaxed);
        let limit =
            if workload.cancel_randomly {
                Duration::from_micros(rng.u64(
                    0..=u64::try_from(workload.acquire_timeout.as_micros()).unwrap_or(u64::MAX),
                ))
            } else {
                workload.acquire_timeout
            };
        let guard = match tokio::time::timeout(limit, lock.lock()).await {
            Ok(Ok(guard)) => guard,
            Ok(Err(_)) => {
                // Faults make acquisitions fail: back off and try again.
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            Err(_) => continue,
        };
        counters.acquisitions.fetch_add(1, Ordering::Relaxed);
        let token = guard.fencing_token();
        if counters.inside.fetch_add(1, Ordering::SeqCst) > 0 {
            counters.overlaps.fetch_add(1, Ordering::Relaxed);
        }
        match store.read(token) {
            Ok(value) => {
                match stall {
                    // Blocks the thread: nothing else on this runtime runs.
                    Some(stall) => std::thread::sleep(stall),
                    None => tokio::time::sleep(workload.work).await,
                }
                if guard.is_held() {
                    if store.write(token, value + 1).is_err() {
                        counters.stale.fetch_add(1, Ordering::Relaxed);
                        counters.unnoticed.fetch_add(1, Ordering::Relaxed);
                    }
                } else {
                    counters.noticed.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(Stale) => {
                counters.stale.fetch_add(1, Ordering::Relaxed);
                counters.unnoticed.fetch_add(1, Ordering::Relaxed);
            }
        }
        counters.inside.fetch_sub(1, Ordering::SeqCst);
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
    let store = Arc::new(FencedStore::default());
    let counters = Arc::new(Counters::default());
    let until = Instant::now() + duration;
    let mut tasks = Vec::new();
    for (i, client) in clients.iter().enumerate() {
        for w in 0..workers {
            let lock = make_lock(client.as_ref());
            tasks.push(tokio::spawn(worker(
                lock,
                Arc::clone(&store),
                Arc::clone(&counters),
                workload,
                until,
                (i * 1000 + w) as u64,
                None,
            )));
        }
    }
    let staller = workload.stall.map(|stall| {
        let (lock, store, counters) = (
            make_lock(clients[0].as_ref()),
            Arc::clone(&store),
            Arc::clone(&counters),
        );
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("staller runtime");
            rt.block_on(worker(
                lock,
                store,
                counters,
                workload,
                until,
                7,
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
    let (value, accepted_writes) = store.snapshot();
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
    };
    assert_eq!(
        value, accepted_writes,
        "lost update in {scenario}: {report:?}"
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
}
