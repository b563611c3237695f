//! One contending OS process of the cross-process bench
//! (`cargo bench -p distlock-benches --bench processes`).
//!
//! ```text
//! contender IMPL TARGET NAME ID TASKS BARRIER
//! contender memory IMPL TARGET K
//! ```
//!
//! `IMPL` is one of `redis-mutex`, `redis-fair`, `redis-election`,
//! `zk-fair`, `zk-unfair`, `rslock` (and `mem` for `memory`); `TARGET` a
//! Redis URL or a ZooKeeper connect string; `NAME` the lock's name (for
//! rslock: the key); `ID` this process's number in the run; `TASKS` the
//! contending tasks in this process; `BARRIER` a file the runner creates
//! once every process is ready, holding `START_NS END_NS` on
//! `CLOCK_MONOTONIC` (one clock for every process of the machine).
//!
//! The process prints `ready,ID` once connected, then waits for the barrier,
//! contends from `START_NS` to `END_NS` with an empty critical section, and
//! prints one line per acquisition,
//! `acq,ID,TASK,ACQUIRE_NS,RELEASE_NS,WAIT_NS` (acquired when `lock()`
//! returned, released when `release()` was called, waited from the call of
//! `lock()`), then `wakeups,ID,N` (the provider's wake-up counter over the
//! run: Redis release messages handed to a waiter, ZooKeeper watch events)
//! and `done,ID,ACQUISITIONS,ERRORS`. The peers in `benches/peers/` print
//! the same lines (without `wakeups`).
//!
//! `memory` holds the lock, measures this process's resident set, starts `K`
//! tasks waiting for it, lets them settle for 3 s, measures again and prints
//! `rss,BEFORE_BYTES,AFTER_BYTES,K`; then it waits for its standard input
//! to close (the runner reads the servers' memory meanwhile) and exits.

use std::io::{BufRead as _, Write as _};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use distlock::mem::MemProvider;
use distlock::redis::RedisProvider;
use distlock::zk::{ZkOptions, ZkProvider};
use distlock::{Election, Lock, Provider};
use distlock_benches::{monotonic_ns, AllPending};

async fn sleep_until_ns(t: u64) {
    let now = monotonic_ns();
    if t > now {
        tokio::time::sleep(Duration::from_nanos(t - now)).await;
    }
}

/// What one task contends with.
#[derive(Clone)]
enum Subject {
    Lock(Arc<dyn Lock>),
    Election(Arc<dyn Election>),
    Rslock(Arc<rslock::LockManager>, String),
}

/// One acquisition: `(acquire_ns, release_ns, wait_ns)`.
type Sample = (u64, u64, u64);

impl Subject {
    /// Acquires before `end_ns` (`None` past it), releases at once; the
    /// acquisition's instants.
    async fn once(&self, candidate: &str, end_ns: u64) -> Result<Option<Sample>, String> {
        let called = monotonic_ns();
        let deadline = Duration::from_nanos(end_ns.saturating_sub(called));
        match self {
            Subject::Lock(lock) => {
                let Ok(got) = tokio::time::timeout(deadline, lock.lock()).await else {
                    return Ok(None);
                };
                let guard = got.map_err(|e| e.to_string())?;
                let acquired = monotonic_ns();
                let released = monotonic_ns();
                guard.release().await.map_err(|e| e.to_string())?;
                Ok(Some((acquired, released, acquired - called)))
            }
            Subject::Election(election) => {
                let Ok(got) = tokio::time::timeout(deadline, election.campaign(candidate)).await
                else {
                    return Ok(None);
                };
                let leadership = got.map_err(|e| e.to_string())?;
                let acquired = monotonic_ns();
                let released = monotonic_ns();
                leadership.resign().await.map_err(|e| e.to_string())?;
                Ok(Some((acquired, released, acquired - called)))
            }
            Subject::Rslock(manager, key) => {
                let ttl = Duration::from_secs(30);
                let Ok(got) =
                    tokio::time::timeout(deadline, manager.acquire_no_guard(key.as_bytes(), ttl))
                        .await
                else {
                    return Ok(None);
                };
                let lock = got.map_err(|e| e.to_string())?;
                let acquired = monotonic_ns();
                let released = monotonic_ns();
                manager.unlock(&lock).await;
                Ok(Some((acquired, released, acquired - called)))
            }
        }
    }
}

/// Reads a provider's wake-up counter (Redis release messages handed to a
/// waiter, ZooKeeper watch events).
type Wakeups = Arc<dyn Fn() -> u64 + Send + Sync>;

async fn provider(imp: &str, target: &str) -> Result<(Arc<dyn Provider>, Option<Wakeups>), String> {
    Ok(match imp {
        "redis-mutex" | "redis-fair" | "redis-election" => {
            let p = RedisProvider::connect(target).await.or_string()?;
            let c = p.clone();
            (Arc::new(p), Some(Arc::new(move || c.wakeups())))
        }
        "zk-fair" | "zk-unfair" => {
            let p = ZkProvider::connect_with(ZkOptions::new(target))
                .await
                .or_string()?;
            let c = p.clone();
            (Arc::new(p), Some(Arc::new(move || c.watch_events())))
        }
        "mem" => (Arc::new(MemProvider::new()), None),
        other => return Err(format!("unknown implementation {other}")),
    })
}

async fn subject(
    imp: &str,
    target: &str,
    name: &str,
) -> Result<(Subject, Option<Wakeups>), String> {
    if imp == "rslock" {
        return Ok((
            Subject::Rslock(
                Arc::new(rslock::LockManager::new(vec![target.to_owned()])),
                name.to_owned(),
            ),
            None,
        ));
    }
    let (p, wakeups) = provider(imp, target).await?;
    let s = match imp {
        "redis-election" => Subject::Election(p.election(name).or_string()?),
        _ => Subject::Lock(Subject::fair_or_plain(
            p.as_ref(),
            imp.ends_with("-fair"),
            name,
        )?),
    };
    Ok((s, wakeups))
}

trait IntoStringError<T> {
    fn or_string(self) -> Result<T, String>;
}

impl<T> IntoStringError<T> for distlock::Result<T> {
    fn or_string(self) -> Result<T, String> {
        self.map_err(|e| e.to_string())
    }
}

impl Subject {
    fn fair_or_plain(p: &dyn Provider, fair: bool, name: &str) -> Result<Arc<dyn Lock>, String> {
        if fair {
            p.fair_mutex(name).or_string()
        } else {
            p.mutex(name).or_string()
        }
    }
}

/// Reads the barrier file once it exists: `(start_ns, end_ns)`.
async fn barrier(path: &str) -> Result<(u64, u64), String> {
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            let mut it = text.split_whitespace().map(str::parse::<u64>);
            if let (Some(Ok(start)), Some(Ok(end))) = (it.next(), it.next()) {
                return Ok((start, end));
            }
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

async fn contend(args: &[String]) -> Result<(), String> {
    let [imp, target, name, id, tasks, barrier_path] = args else {
        return Err("usage: contender IMPL TARGET NAME ID TASKS BARRIER".into());
    };
    let tasks: usize = tasks.parse().map_err(|_| "TASKS: a number")?;
    let (s, wakeups) = subject(imp, target, name).await?;
    println!("ready,{id}");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    let (start, end) = barrier(barrier_path).await?;
    sleep_until_ns(start).await;
    let wakeups_before = wakeups.as_ref().map_or(0, |w| w());
    let mut handles = Vec::new();
    for task in 0..tasks {
        let s = s.clone();
        let candidate = format!("p{id}t{task}");
        handles.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut errors = Vec::new();
            while monotonic_ns() < end {
                match s.once(&candidate, end).await {
                    Ok(Some(sample)) => samples.push(sample),
                    Ok(None) => break,
                    Err(e) => {
                        errors.push(e);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            (samples, errors)
        }));
    }
    let mut out = String::new();
    let (mut count, mut failures) = (0usize, 0usize);
    for (task, h) in handles.into_iter().enumerate() {
        let (samples, errors) = h.await.map_err(|e| e.to_string())?;
        count += samples.len();
        failures += errors.len();
        for (a, r, w) in samples {
            out.push_str(&format!("acq,{id},{task},{a},{r},{w}\n"));
        }
        for e in errors.iter().take(3) {
            eprintln!("contender {id} task {task}: {e}");
        }
    }
    if let Some(w) = &wakeups {
        out.push_str(&format!("wakeups,{id},{}\n", w() - wakeups_before));
    }
    out.push_str(&format!("done,{id},{count},{failures}\n"));
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|e| e.to_string())
}

/// Heap bytes in use (glibc's `mallinfo2().uordblks`): what the process's
/// allocations hold now, whatever the pages around them.
fn heap_bytes() -> u64 {
    // SAFETY: mallinfo2 has no preconditions.
    let info = unsafe { libc::mallinfo2() };
    u64::try_from(info.uordblks).unwrap_or(0)
}

/// Resident memory, after giving freed heap back to the system
/// (`malloc_trim`): what is in use, not the allocator's high-water mark
/// (K waiters' first attempts are in flight at once, and glibc keeps what
/// they freed).
fn rss_bytes() -> u64 {
    // SAFETY: malloc_trim has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page).unwrap_or(4096)
}

async fn memory(args: &[String]) -> Result<(), String> {
    let [imp, target, k] = args else {
        return Err("usage: contender memory IMPL TARGET K".into());
    };
    let k: usize = k.parse().map_err(|_| "K: a number")?;
    let fair = imp == "zk-fair" || imp == "redis-fair";
    let name = format!("memory-{}", std::process::id());
    // The holder on its own provider (connection / session), the waiters
    // sharing another, as K tasks of one application would.
    let (holder_p, waiter_p) = if imp == "mem" {
        let table = MemProvider::new();
        (
            Arc::new(table.new_client()) as Arc<dyn Provider>,
            Arc::new(table.new_client()) as Arc<dyn Provider>,
        )
    } else {
        (
            provider(imp, target).await?.0,
            provider(imp, target).await?.0,
        )
    };
    let holder = Subject::fair_or_plain(holder_p.as_ref(), fair, &name)?
        .lock()
        .await
        .or_string()?;
    let lock = Subject::fair_or_plain(waiter_p.as_ref(), fair, &name)?;
    // One waiter first, so the per-provider machinery (subscriber
    // connection, watch plumbing) is not counted as per-waiter memory.
    let first = {
        let lock = Arc::clone(&lock);
        tokio::spawn(async move { lock.lock().await })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (before, heap_before) = (rss_bytes(), heap_bytes());
    let waiters: Vec<_> = (0..k)
        .map(|_| {
            let lock = Arc::clone(&lock);
            tokio::spawn(async move { lock.lock().await })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (after, heap_after) = (rss_bytes(), heap_bytes());
    // K more waiters as futures driven by one task: what the library keeps
    // per waiter, without the task an application may spawn for each (the
    // futures' slots are allocated before the count).
    let mut slots = Vec::with_capacity(k);
    let futures_before = heap_bytes();
    for _ in 0..k {
        slots.push(Some(lock.lock()));
    }
    let mut all = AllPending(slots);
    tokio::select! {
        () = &mut all => {}
        () = tokio::time::sleep(Duration::from_secs(3)) => {}
    }
    let futures_after = heap_bytes();
    println!(
        "rss,{before},{after},{k},{heap_before},{heap_after},{futures_before},{futures_after}"
    );
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    // The runner reads the servers' memory now; it closes our stdin when done.
    tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        while std::io::stdin().lock().read_line(&mut line).unwrap_or(0) > 0 {
            line.clear();
        }
    })
    .await
    .map_err(|e| e.to_string())?;
    for w in &waiters {
        w.abort();
    }
    drop(all);
    first.abort();
    drop(holder);
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("contender: runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        match args.first().map(String::as_str) {
            Some("memory") => memory(&args[1..]).await,
            _ => contend(&args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("contender: {e}");
            ExitCode::FAILURE
        }
    }
}
