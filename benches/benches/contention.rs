//! Contention: throughput, release-to-next-acquire handoff latency (p50,
//! p99), fairness and wake-ups per handoff, for 1 to 64 contenders spread
//! over 4 connections or sessions on one name; and resident memory per 1000
//! waiting contenders. Every implementation runs on the same servers in the
//! same run, the peer `rslock` included.
//!
//! `cargo bench -p distlock-benches --bench contention` prints a Markdown
//! table and writes `benches/results/contention.csv` and
//! `benches/results/handoff.svg`. `DISTLOCK_BENCH_SECS` sets the seconds
//! per cell (default 2).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock::mem::MemProvider;
use distlock::redis::RedisProvider;
use distlock::zk::{ZkOptions, ZkProvider};
use distlock::{Lock, Provider};
use test_support::{unique_name, RedisServer, ZkCluster};

const CONTENDERS: [usize; 4] = [1, 4, 16, 64];
const CLIENTS: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Mem,
    Redis,
    ZkFair,
    ZkUnfair,
    Rslock,
}

impl Kind {
    const ALL: [Kind; 5] = [
        Kind::Mem,
        Kind::Redis,
        Kind::ZkFair,
        Kind::ZkUnfair,
        Kind::Rslock,
    ];

    fn label(self) -> &'static str {
        match self {
            Kind::Mem => "mem/mutex",
            Kind::Redis => "redis/mutex",
            Kind::ZkFair => "zk/fair_mutex",
            Kind::ZkUnfair => "zk/unfair_mutex",
            Kind::Rslock => "rslock (peer)",
        }
    }

    fn color(self) -> &'static str {
        match self {
            Kind::Mem => "#7f7f7f",
            Kind::Redis => "#d62728",
            Kind::ZkFair => "#1f77b4",
            Kind::ZkUnfair => "#2ca02c",
            Kind::Rslock => "#ff7f0e",
        }
    }
}

struct Servers {
    redis: RedisServer,
    zk: ZkCluster,
}

/// The clients of one run: `CLIENTS` providers (or rslock managers).
enum Clients {
    Distlock(Vec<Arc<dyn Provider>>, Stats),
    Rslock(Vec<Arc<rslock::LockManager>>),
}

/// Reads a backend's wake-up counter (release messages or watch events).
enum Stats {
    None,
    Redis(Vec<RedisProvider>),
    Zk(Vec<ZkProvider>),
}

impl Stats {
    fn wakeups(&self) -> u64 {
        match self {
            Stats::None => 0,
            Stats::Redis(p) => p.iter().map(RedisProvider::wakeups).sum(),
            Stats::Zk(p) => p.iter().map(ZkProvider::watch_events).sum(),
        }
    }
}

async fn clients(kind: Kind, s: &Servers) -> Clients {
    match kind {
        Kind::Mem => {
            let table = MemProvider::new();
            let all = (0..CLIENTS)
                .map(|_| Arc::new(table.new_client()) as Arc<dyn Provider>)
                .collect();
            Clients::Distlock(all, Stats::None)
        }
        Kind::Redis => {
            let mut ps = Vec::new();
            for _ in 0..CLIENTS {
                ps.push(RedisProvider::connect(&s.redis.url()).await.expect("redis"));
            }
            let all = ps
                .iter()
                .map(|p| Arc::new(p.clone()) as Arc<dyn Provider>)
                .collect();
            Clients::Distlock(all, Stats::Redis(ps))
        }
        Kind::ZkFair | Kind::ZkUnfair => {
            let mut ps = Vec::new();
            for _ in 0..CLIENTS {
                let options = ZkOptions::new(s.zk.connect_string());
                ps.push(ZkProvider::connect_with(options).await.expect("zk"));
            }
            let all = ps
                .iter()
                .map(|p| Arc::new(p.clone()) as Arc<dyn Provider>)
                .collect();
            Clients::Distlock(all, Stats::Zk(ps))
        }
        Kind::Rslock => Clients::Rslock(
            (0..CLIENTS)
                .map(|_| Arc::new(rslock::LockManager::new(vec![s.redis.url()])))
                .collect(),
        ),
    }
}

fn lock_of(kind: Kind, provider: &dyn Provider, name: &str) -> Arc<dyn Lock> {
    match kind {
        Kind::ZkFair => provider.fair_mutex(name),
        _ => provider.mutex(name),
    }
    .expect("valid name")
}

struct Cell {
    kind: Kind,
    contenders: usize,
    acquisitions: u64,
    elapsed: Duration,
    handoffs: Vec<Duration>,
    per_task: Vec<u64>,
    wakeups: u64,
}

impl Cell {
    fn throughput(&self) -> f64 {
        self.acquisitions as f64 / self.elapsed.as_secs_f64()
    }

    /// The nearest-rank percentile, in thousandths (500 = p50, 990 = p99).
    fn percentile(&self, per_mille: usize) -> Option<Duration> {
        if self.handoffs.is_empty() {
            return None;
        }
        let mut sorted = self.handoffs.clone();
        sorted.sort();
        let rank = (sorted.len() - 1) * per_mille.min(1000) / 1000;
        Some(sorted[rank])
    }

    fn wakeups_per_handoff(&self) -> f64 {
        if self.handoffs.is_empty() {
            0.0
        } else {
            self.wakeups as f64 / self.handoffs.len() as f64
        }
    }
}

/// Who released last, and when: the next acquisition by another contender
/// is a handoff.
#[derive(Default)]
struct Handoff {
    last: Mutex<Option<(Instant, usize)>>,
    samples: Mutex<Vec<Duration>>,
}

impl Handoff {
    fn acquired(&self, me: usize) {
        let now = Instant::now();
        let last = self.last.lock().expect("poisoned").take();
        if let Some((released, who)) = last {
            if who != me {
                self.samples.lock().expect("poisoned").push(now - released);
            }
        }
    }

    fn releasing(&self, me: usize) {
        *self.last.lock().expect("poisoned") = Some((Instant::now(), me));
    }
}

/// The critical section: a little work, no sleep.
async fn work() {
    for _ in 0..4 {
        tokio::task::yield_now().await;
    }
}

async fn run(kind: Kind, contenders: usize, secs: Duration, s: &Servers) -> Cell {
    let clients = clients(kind, s).await;
    let name = unique_name(&format!("contention-{contenders}"));
    let stop = Arc::new(AtomicBool::new(false));
    let handoff = Arc::new(Handoff::default());
    let counts: Arc<Vec<AtomicU64>> =
        Arc::new((0..contenders).map(|_| AtomicU64::new(0)).collect());
    let wakeups_before = match &clients {
        Clients::Distlock(_, stats) => stats.wakeups(),
        Clients::Rslock(_) => 0,
    };
    let start = Instant::now();
    let mut tasks = Vec::new();
    for me in 0..contenders {
        let (stop, handoff, counts) =
            (Arc::clone(&stop), Arc::clone(&handoff), Arc::clone(&counts));
        match &clients {
            Clients::Distlock(providers, _) => {
                let lock = lock_of(kind, providers[me % CLIENTS].as_ref(), &name);
                tasks.push(tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let guard = lock.lock().await.expect("lock");
                        handoff.acquired(me);
                        work().await;
                        counts[me].fetch_add(1, Ordering::Relaxed);
                        handoff.releasing(me);
                        guard.release().await.expect("release");
                    }
                }));
            }
            Clients::Rslock(managers) => {
                let manager = Arc::clone(&managers[me % CLIENTS]);
                let resource = name.clone();
                tasks.push(tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let lock = manager
                            .acquire_no_guard(resource.as_bytes(), Duration::from_secs(30))
                            .await
                            .expect("rslock");
                        handoff.acquired(me);
                        work().await;
                        counts[me].fetch_add(1, Ordering::Relaxed);
                        handoff.releasing(me);
                        manager.unlock(&lock).await;
                    }
                }));
            }
        }
    }
    tokio::time::sleep(secs).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = start.elapsed();
    for t in tasks {
        t.await.expect("contender");
    }
    let wakeups = match &clients {
        Clients::Distlock(_, stats) => stats.wakeups() - wakeups_before,
        Clients::Rslock(_) => 0,
    };
    let handoffs = std::mem::take(&mut *handoff.samples.lock().expect("poisoned"));
    Cell {
        kind,
        contenders,
        acquisitions: counts.iter().map(|c| c.load(Ordering::Relaxed)).sum(),
        elapsed,
        handoffs,
        per_task: counts.iter().map(|c| c.load(Ordering::Relaxed)).collect(),
        wakeups,
    }
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// Resident memory added by 1000 contenders waiting on a held lock.
async fn memory_per_1000(kind: Kind, s: &Servers) -> Option<u64> {
    let Clients::Distlock(providers, _) = clients(kind, s).await else {
        return None;
    };
    let name = unique_name("memory");
    let holder = lock_of(kind, providers[0].as_ref(), &name)
        .lock()
        .await
        .expect("lock");
    let lock = lock_of(kind, providers[1].as_ref(), &name);
    let before = rss_bytes();
    let waiters: Vec<_> = (0..1000)
        .map(|_| {
            let lock = Arc::clone(&lock);
            tokio::spawn(async move { lock.lock().await })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = rss_bytes();
    for w in &waiters {
        w.abort();
    }
    drop(holder);
    tokio::time::sleep(Duration::from_millis(500)).await;
    Some(after.saturating_sub(before))
}

fn micros(d: Option<Duration>) -> String {
    d.map_or("-".into(), |d| format!("{:.0}", d.as_secs_f64() * 1e6))
}

fn svg(cells: &[Cell]) -> String {
    let (w, h, left, right, top, bottom) = (720.0, 420.0, 70.0, 200.0, 30.0, 50.0);
    let xs = |n: usize| {
        let i = CONTENDERS.iter().position(|c| *c == n).unwrap_or(0) as f64;
        left + i * (w - left - right) / (CONTENDERS.len() - 1) as f64
    };
    let (lo, hi) = (1.0f64, 1e6f64); // 1 µs to 1 s, log scale
    let ys = |us: f64| {
        let v = us.clamp(lo, hi).log10();
        top + (1.0 - (v - lo.log10()) / (hi.log10() - lo.log10())) * (h - top - bottom)
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{}" y="18" text-anchor="middle" font-size="14">Release-to-next-acquire handoff (p50 solid, p99 dashed)</text>"#,
        (w - right + left) / 2.0
    );
    let labels = ["1 µs", "10 µs", "100 µs", "1 ms", "10 ms", "100 ms", "1 s"];
    for (exp, label) in (0i32..).zip(labels) {
        let y = ys(10f64.powi(exp));
        let _ = writeln!(
            out,
            r##"<line x1="{left}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{label}</text>"##,
            w - right,
            left - 6.0,
            y + 4.0
        );
    }
    for n in CONTENDERS {
        let x = xs(n);
        let _ = writeln!(
            out,
            r#"<text x="{x:.1}" y="{}" text-anchor="middle">{n}</text>"#,
            h - bottom + 18.0
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">contenders (4 connections / sessions)</text>"#,
        (w - right + left) / 2.0,
        h - 12.0
    );
    for (i, kind) in Kind::ALL.iter().enumerate() {
        for (p, dash) in [(500, ""), (990, r#" stroke-dasharray="5,4""#)] {
            let points: Vec<String> = cells
                .iter()
                .filter(|c| c.kind == *kind)
                .filter_map(|c| {
                    c.percentile(p).map(|d| {
                        format!("{:.1},{:.1}", xs(c.contenders), ys(d.as_secs_f64() * 1e6))
                    })
                })
                .collect();
            if points.len() > 1 {
                let _ = writeln!(
                    out,
                    r#"<polyline fill="none" stroke="{}" stroke-width="2"{dash} points="{}"/>"#,
                    kind.color(),
                    points.join(" ")
                );
            }
        }
        let y = top + 20.0 + i as f64 * 20.0;
        let _ = writeln!(
            out,
            r#"<line x1="{}" x2="{}" y1="{y}" y2="{y}" stroke="{}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
            w - right + 15.0,
            w - right + 40.0,
            kind.color(),
            w - right + 46.0,
            y + 4.0,
            kind.label()
        );
    }
    out.push_str("</svg>\n");
    out
}

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
    let mut cells = Vec::new();
    for kind in Kind::ALL {
        for contenders in CONTENDERS {
            let cell = rt.block_on(run(kind, contenders, secs, &servers));
            eprintln!(
                "{:<16} {:>2} contenders: {:>8.0} acq/s, handoff p50 {} us",
                kind.label(),
                contenders,
                cell.throughput(),
                micros(cell.percentile(500))
            );
            cells.push(cell);
        }
    }
    let mut table = String::from(
        "| implementation | contenders | acquisitions/s | handoff p50 (µs) | handoff p99 (µs) | most / fewest per contender | wake-ups per handoff |\n|---|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut csv = String::from("implementation,contenders,acquisitions_per_s,handoff_p50_us,handoff_p99_us,max_per_contender,min_per_contender,wakeups_per_handoff\n");
    for c in &cells {
        let most = c.per_task.iter().max().copied().unwrap_or(0);
        let fewest = c.per_task.iter().min().copied().unwrap_or(0);
        let wake = match c.kind {
            Kind::Mem | Kind::Rslock => "-".to_owned(),
            _ => format!("{:.2}", c.wakeups_per_handoff()),
        };
        let _ = writeln!(
            table,
            "| {} | {} | {:.0} | {} | {} | {most} / {fewest} | {wake} |",
            c.kind.label(),
            c.contenders,
            c.throughput(),
            micros(c.percentile(500)),
            micros(c.percentile(990)),
        );
        let _ = writeln!(
            csv,
            "{},{},{:.0},{},{},{most},{fewest},{}",
            c.kind.label(),
            c.contenders,
            c.throughput(),
            micros(c.percentile(500)),
            micros(c.percentile(990)),
            wake
        );
    }
    let mut memory = String::from(
        "| implementation | resident memory per 1000 waiting contenders |\n|---|---:|\n",
    );
    for kind in [Kind::Mem, Kind::Redis, Kind::ZkFair, Kind::ZkUnfair] {
        if let Some(bytes) = rt.block_on(memory_per_1000(kind, &servers)) {
            let _ = writeln!(
                memory,
                "| {} | {:.0} KiB |",
                kind.label(),
                bytes as f64 / 1024.0
            );
        }
    }
    println!("{table}\n{memory}");
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/results");
    let _ = std::fs::create_dir_all(dir);
    std::fs::write(format!("{dir}/contention.csv"), csv).expect("write csv");
    std::fs::write(format!("{dir}/contention.md"), format!("{table}\n{memory}")).expect("write md");
    std::fs::write(format!("{dir}/handoff.svg"), svg(&cells)).expect("write svg");
    eprintln!("wrote {dir}/contention.csv, contention.md and handoff.svg");
}
