//! The primitives beyond the mutex, as ratios measured side by side in one
//! run on the same servers:
//!
//! 1. read-heavy workload (95% reads, 16 contenders over 4 clients, 500 µs
//!    critical sections): read-write lock throughput against the mutex;
//! 2. semaphore of 4 with 64 contenders: throughput (against the mutex
//!    with 64 contenders) and wake-ups per release;
//! 3. Redis fair mutex against the plain Redis mutex at 4 / 16 / 64
//!    contenders: handoff p50 in loopback round trips (a `PING` measured in
//!    the same run) and wake-ups per handoff;
//! 4. election failover: the leader's connection blackholed (as a killed
//!    host: no resignation, no release) until an observer sees the next
//!    leader, Redis (lease TTL 2 s) against ZooKeeper (session timeout 2 s).
//!
//! `cargo bench -p distlock-benches --bench primitives` prints Markdown
//! tables and writes `benches/results/primitives.md`. `DISTLOCK_BENCH_SECS`
//! sets the seconds per cell (default 2).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock::mem::MemProvider;
use distlock::redis::{RedisOptions, RedisProvider};
use distlock::zk::{ZkOptions, ZkProvider};
use distlock::{LeaseOptions, Lock, Provider};
use futures::StreamExt;
use test_support::{unique_name, Proxy, RedisServer, ZkCluster};

const CLIENTS: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Mem,
    Redis,
    Zk,
}

impl Backend {
    const ALL: [Backend; 3] = [Backend::Mem, Backend::Redis, Backend::Zk];

    fn label(self) -> &'static str {
        match self {
            Backend::Mem => "mem",
            Backend::Redis => "redis",
            Backend::Zk => "zookeeper",
        }
    }
}

struct Servers {
    redis: RedisServer,
    zk: ZkCluster,
}

/// `CLIENTS` providers and a way to read their wake-up counters.
struct Clients {
    all: Vec<Arc<dyn Provider>>,
    redis: Vec<RedisProvider>,
    zk: Vec<ZkProvider>,
}

impl Clients {
    fn wakeups(&self) -> u64 {
        self.redis.iter().map(RedisProvider::wakeups).sum::<u64>()
            + self.zk.iter().map(ZkProvider::watch_events).sum::<u64>()
    }
}

async fn clients(backend: Backend, s: &Servers) -> Clients {
    let mut out = Clients {
        all: Vec::new(),
        redis: Vec::new(),
        zk: Vec::new(),
    };
    match backend {
        Backend::Mem => {
            let table = MemProvider::new();
            out.all = (0..CLIENTS)
                .map(|_| Arc::new(table.new_client()) as Arc<dyn Provider>)
                .collect();
        }
        Backend::Redis => {
            for _ in 0..CLIENTS {
                let p = RedisProvider::connect(&s.redis.url()).await.expect("redis");
                out.all.push(Arc::new(p.clone()));
                out.redis.push(p);
            }
        }
        Backend::Zk => {
            for _ in 0..CLIENTS {
                let options = ZkOptions::new(s.zk.connect_string());
                let p = ZkProvider::connect_with(options).await.expect("zk");
                out.all.push(Arc::new(p.clone()));
                out.zk.push(p);
            }
        }
    }
    out
}

/// What each contender takes.
#[derive(Clone, Copy, Debug)]
enum Take {
    Mutex,
    FairMutex,
    /// The read-write lock; reads in percent.
    ReadWrite(u8),
    Semaphore(u32),
}

struct Cell {
    acquisitions: u64,
    elapsed: Duration,
    handoffs: Vec<Duration>,
    releases: u64,
    wakeups: u64,
}

impl Cell {
    fn throughput(&self) -> f64 {
        self.acquisitions as f64 / self.elapsed.as_secs_f64()
    }

    fn p50(&self) -> Option<Duration> {
        let mut sorted = self.handoffs.clone();
        sorted.sort();
        sorted.get(sorted.len().saturating_sub(1) / 2).copied()
    }

    fn per(&self, n: u64) -> f64 {
        if n == 0 {
            0.0
        } else {
            self.wakeups as f64 / n as f64
        }
    }
}

/// Release-to-next-acquire handoffs between different contenders.
#[derive(Default)]
struct Handoff {
    last: Mutex<Option<(Instant, usize)>>,
    samples: Mutex<Vec<Duration>>,
}

impl Handoff {
    fn acquired(&self, me: usize) {
        let now = Instant::now();
        if let Some((released, who)) = self.last.lock().expect("poisoned").take() {
            if who != me {
                self.samples.lock().expect("poisoned").push(now - released);
            }
        }
    }

    fn releasing(&self, me: usize) {
        *self.last.lock().expect("poisoned") = Some((Instant::now(), me));
    }
}

async fn run(
    backend: Backend,
    take: Take,
    contenders: usize,
    work: Duration,
    secs: Duration,
    s: &Servers,
) -> Cell {
    let clients = clients(backend, s).await;
    let name = unique_name(&format!("primitives-{contenders}"));
    let stop = Arc::new(AtomicBool::new(false));
    let handoff = Arc::new(Handoff::default());
    let acquisitions = Arc::new(AtomicU64::new(0));
    let wakeups_before = clients.wakeups();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for me in 0..contenders {
        let provider = Arc::clone(&clients.all[me % CLIENTS]);
        let (stop, handoff, acquisitions, name) = (
            Arc::clone(&stop),
            Arc::clone(&handoff),
            Arc::clone(&acquisitions),
            name.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut rng = fastrand_rng(me as u64);
            let (mutex, rw, sem) = match take {
                Take::Mutex => (Some(provider.mutex(&name).expect("mutex")), None, None),
                Take::FairMutex => (Some(provider.fair_mutex(&name).expect("fair")), None, None),
                Take::ReadWrite(_) => (None, Some(provider.rw_lock(&name).expect("rw")), None),
                Take::Semaphore(n) => {
                    (None, None, Some(provider.semaphore(&name, n).expect("sem")))
                }
            };
            while !stop.load(Ordering::Relaxed) {
                let lock: Arc<dyn Lock> = match (&mutex, &rw, &sem, take) {
                    (Some(m), _, _, _) => Arc::clone(m),
                    (_, Some(rw), _, Take::ReadWrite(reads)) => {
                        if rng() % 100 < u64::from(reads) {
                            rw.read()
                        } else {
                            rw.write()
                        }
                    }
                    (_, _, Some(s), _) => Arc::clone(s) as Arc<dyn Lock>,
                    _ => unreachable!("one primitive per contender"),
                };
                let guard = lock.lock().await.expect("lock");
                handoff.acquired(me);
                if work.is_zero() {
                    for _ in 0..4 {
                        tokio::task::yield_now().await;
                    }
                } else {
                    tokio::time::sleep(work).await;
                }
                acquisitions.fetch_add(1, Ordering::Relaxed);
                handoff.releasing(me);
                guard.release().await.expect("release");
            }
        }));
    }
    tokio::time::sleep(secs).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = start.elapsed();
    for t in tasks {
        t.await.expect("contender");
    }
    let acquisitions = acquisitions.load(Ordering::Relaxed);
    let handoffs = std::mem::take(&mut *handoff.samples.lock().expect("poisoned"));
    Cell {
        acquisitions,
        elapsed,
        releases: acquisitions,
        handoffs,
        wakeups: clients.wakeups() - wakeups_before,
    }
}

fn fastrand_rng(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// The median loopback round trip to the Redis server (`PING`).
async fn redis_round_trip(s: &Servers) -> Duration {
    let client = distlock::redis::redis::Client::open(s.redis.url()).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let mut samples = Vec::new();
    for _ in 0..2000 {
        let start = Instant::now();
        let _: String = distlock::redis::redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .expect("PING");
        samples.push(start.elapsed());
    }
    samples.sort();
    samples[samples.len() / 2]
}

/// Leader blackholed behind a proxy → an observer sees another leader.
async fn failover(backend: Backend, s: &Servers) -> Duration {
    let timeout = Duration::from_secs(2);
    let target = match backend {
        Backend::Redis => s.redis.addr(),
        _ => s.zk.addr(0),
    };
    let proxy = Proxy::start(target);
    let connect = |addr: String| async move {
        match backend {
            Backend::Redis => {
                let options =
                    RedisOptions::new().default_lease(LeaseOptions::new(timeout).expect("ttl"));
                Arc::new(
                    RedisProvider::connect_with(&format!("redis://{addr}"), options)
                        .await
                        .expect("redis"),
                ) as Arc<dyn Provider>
            }
            _ => Arc::new(
                ZkProvider::connect_with(ZkOptions::new(addr).session_timeout(timeout))
                    .await
                    .expect("zk"),
            ) as Arc<dyn Provider>,
        }
    };
    let direct = match backend {
        Backend::Redis => s.redis.addr().to_string(),
        _ => s.zk.connect_string(),
    };
    let doomed = connect(proxy.addr().to_string()).await;
    let standby = connect(direct.clone()).await;
    let observer = connect(direct).await;
    let name = unique_name("failover");
    let leader = doomed
        .election(&name)
        .expect("election")
        .campaign("doomed")
        .await
        .expect("campaign");
    let election = standby.election(&name).expect("election");
    let next = tokio::spawn(async move { election.campaign("standby").await });
    let mut stream = observer.election(&name).expect("election").observe();
    loop {
        let now = stream.next().await.expect("stream").expect("observe");
        if now.is_some_and(|l| l.id == "doomed") {
            break;
        }
    }
    let killed = Instant::now();
    proxy.set_blackhole(true);
    loop {
        let now = stream.next().await.expect("stream").expect("observe");
        if now.is_some_and(|l| l.id == "standby") {
            break;
        }
    }
    let took = killed.elapsed();
    next.await
        .expect("task")
        .expect("campaign")
        .resign()
        .await
        .expect("resign");
    std::mem::forget(leader);
    took
}

fn micros(d: Option<Duration>) -> String {
    d.map_or("-".into(), |d| format!("{:.0}", d.as_secs_f64() * 1e6))
}

#[allow(clippy::too_many_lines)]
fn main() {
    let secs = std::env::var("DISTLOCK_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .map_or(Duration::from_secs(2), Duration::from_secs_f64);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let servers = Servers {
        redis: RedisServer::start(),
        zk: ZkCluster::standalone(),
    };
    let work = Duration::from_micros(500);
    let mut out = String::new();

    // 1. Read-heavy.
    out.push_str("## Read-heavy: 95% reads, 16 contenders, 500 µs sections\n\n| backend | rw lock acq/s | mutex acq/s | rw / mutex |\n|---|---:|---:|---:|\n");
    for backend in Backend::ALL {
        let rw = rt.block_on(run(backend, Take::ReadWrite(95), 16, work, secs, &servers));
        let mutex = rt.block_on(run(backend, Take::Mutex, 16, work, secs, &servers));
        let line = format!(
            "| {} | {:.0} | {:.0} | {:.2}× |",
            backend.label(),
            rw.throughput(),
            mutex.throughput(),
            rw.throughput() / mutex.throughput()
        );
        eprintln!("{line}");
        let _ = writeln!(out, "{line}");
    }

    // 2. Semaphore of 4, 64 contenders.
    out.push_str("\n## Semaphore of 4, 64 contenders, 500 µs sections\n\n| backend | semaphore acq/s | mutex acq/s | semaphore / mutex | wake-ups per release |\n|---|---:|---:|---:|---:|\n");
    for backend in Backend::ALL {
        let sem = rt.block_on(run(backend, Take::Semaphore(4), 64, work, secs, &servers));
        let mutex = rt.block_on(run(backend, Take::Mutex, 64, work, secs, &servers));
        let wake = if backend == Backend::Mem {
            "-".to_owned()
        } else {
            format!("{:.2}", sem.per(sem.releases))
        };
        let line = format!(
            "| {} | {:.0} | {:.0} | {:.2}× | {wake} |",
            backend.label(),
            sem.throughput(),
            mutex.throughput(),
            sem.throughput() / mutex.throughput()
        );
        eprintln!("{line}");
        let _ = writeln!(out, "{line}");
    }

    // 3. Redis fair mutex against the plain one.
    let rtt = rt.block_on(redis_round_trip(&servers));
    let _ = write!(
        out,
        "\n## Redis fair mutex against the plain mutex (empty sections; PING = {} µs)\n\n| contenders | fair handoff p50 (µs) | in round trips | fair wake-ups per handoff | fair acq/s | plain handoff p50 (µs) | in round trips | plain wake-ups per handoff | plain acq/s |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        micros(Some(rtt))
    );
    for contenders in [4, 16, 64] {
        let fair = rt.block_on(run(
            Backend::Redis,
            Take::FairMutex,
            contenders,
            Duration::ZERO,
            secs,
            &servers,
        ));
        let plain = rt.block_on(run(
            Backend::Redis,
            Take::Mutex,
            contenders,
            Duration::ZERO,
            secs,
            &servers,
        ));
        let trips = |c: &Cell| {
            c.p50().map_or("-".into(), |d| {
                format!("{:.1}", d.as_secs_f64() / rtt.as_secs_f64())
            })
        };
        let line = format!(
            "| {contenders} | {} | {} | {:.2} | {:.0} | {} | {} | {:.2} | {:.0} |",
            micros(fair.p50()),
            trips(&fair),
            fair.per(fair.handoffs.len() as u64),
            fair.throughput(),
            micros(plain.p50()),
            trips(&plain),
            plain.per(plain.handoffs.len() as u64),
            plain.throughput(),
        );
        eprintln!("{line}");
        let _ = writeln!(out, "{line}");
    }

    // 4. Election failover.
    out.push_str("\n## Election failover: leader blackholed until an observer sees the next (lease / session 2 s)\n\n| backend | failover (ms), 3 runs | median |\n|---|---|---:|\n");
    for backend in [Backend::Redis, Backend::Zk] {
        let mut runs: Vec<Duration> = (0..3)
            .map(|_| rt.block_on(failover(backend, &servers)))
            .collect();
        runs.sort();
        let line = format!(
            "| {} | {} | {:.0} |",
            backend.label(),
            runs.iter()
                .map(|d| format!("{:.0}", d.as_secs_f64() * 1e3))
                .collect::<Vec<_>>()
                .join(", "),
            runs[1].as_secs_f64() * 1e3
        );
        eprintln!("{line}");
        let _ = writeln!(out, "{line}");
    }

    println!("{out}");
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/results");
    let _ = std::fs::create_dir_all(dir);
    std::fs::write(format!("{dir}/primitives.md"), out).expect("write md");
}
