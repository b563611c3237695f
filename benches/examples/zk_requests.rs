//! What one uncontended ZooKeeper lock+release sends: the raw floor of
//! `--bench ratios` (ephemeral sequential create + delete), the fair mutex
//! and the unfair mutex, each run through a counting TCP proxy in front of a
//! private ZooKeeper, with the requests of each kind per lock+release (read
//! from the frames the client sends) and the median time.
//!
//! ```sh
//! cargo run --release -p distlock-benches --example zk_requests
//! ```
//! `DISTLOCK_BENCH_ROUNDS` sets the rounds per subject (default 500);
//! `DISTLOCK_PROFILE_SUBJECT=N` runs subject N (0 the floor, 1 the floor
//! with the listing, 2 the fair mutex, 3 the unfair mutex) alone, to be
//! run under `perf stat -e task-clock,context-switches`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock::zk::zookeeper_client::{self, Acls, CreateMode};
use distlock::zk::{ZkOptions, ZkProvider};
use distlock::Provider;
use test_support::ZkCluster;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Requests seen, by the name of their opcode.
type Counts = Arc<Mutex<BTreeMap<&'static str, u64>>>;

fn op_name(op: i32) -> &'static str {
    match op {
        1 => "create",
        2 => "delete",
        3 => "exists",
        4 => "getData",
        5 => "setData",
        8 => "getChildren",
        9 => "sync",
        11 => "ping",
        12 => "getChildren2",
        13 => "check",
        14 => "multi",
        15 => "create2",
        17 => "checkWatches",
        18 => "removeWatches",
        19 => "createContainer",
        22 => "multiRead",
        101 | 105 => "setWatches",
        -11 => "closeSession",
        _ => "other",
    }
}

/// Forwards client to server, counting each request frame (length, xid,
/// opcode) after the connect request.
async fn count_requests(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    counts: Counts,
) {
    let mut first = true;
    loop {
        let mut len = [0u8; 4];
        if from.read_exact(&mut len).await.is_err() {
            return;
        }
        let n = usize::try_from(u32::from_be_bytes(len)).unwrap_or(0);
        let mut body = vec![0u8; n];
        if from.read_exact(&mut body).await.is_err() {
            return;
        }
        if !first && n >= 8 {
            let op = i32::from_be_bytes([body[4], body[5], body[6], body[7]]);
            *counts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .entry(op_name(op))
                .or_default() += 1;
        }
        first = false;
        if to.write_all(&len).await.is_err() || to.write_all(&body).await.is_err() {
            return;
        }
    }
}

async fn proxy(target: SocketAddr, counts: Counts) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(target).await else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (client_read, mut client_write) = client.into_split();
            let (mut server_read, server_write) = server.into_split();
            tokio::spawn(count_requests(
                client_read,
                server_write,
                Arc::clone(&counts),
            ));
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
            });
        }
    });
    addr
}

/// User and system CPU time of this process so far (its threads only), and
/// its voluntary context switches.
fn cpu_time() -> (Duration, i64) {
    // SAFETY: `getrusage` writes into the struct it is given.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    (tv(usage.ru_utime) + tv(usage.ru_stime), usage.ru_nvcsw)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Runs `round` `rounds` times; the requests per round and the median.
/// Requests per round by opcode, and the median round.
type Measured = (BTreeMap<&'static str, f64>, Duration);

async fn measure<F, Fut>(counts: &Counts, rounds: usize, mut round: F) -> Measured
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    // Warm up (parents made, connections settled), then count from zero.
    for _ in 0..20 {
        round().await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    counts
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clear();
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        round().await;
        times.push(start.elapsed());
    }
    // Late requests of the last rounds (a lease's watch) count too.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let per_round = counts
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .filter(|(op, _)| **op != "ping")
        .map(|(op, n)| {
            #[allow(clippy::cast_precision_loss)]
            let per = *n as f64 / rounds as f64;
            (*op, per)
        })
        .collect();
    (per_round, median(times))
}

fn show(what: &str, per_round: &BTreeMap<&'static str, f64>, median: Duration, floor: Duration) {
    let total: f64 = per_round.values().sum();
    let ops: Vec<String> = per_round
        .iter()
        .map(|(op, n)| format!("{op} {n:.2}"))
        .collect();
    println!(
        "| {what} | {total:.2} | {} | {:.1} | {:.2} |",
        ops.join(", "),
        median.as_secs_f64() * 1e6,
        median.as_secs_f64() / floor.as_secs_f64()
    );
}

/// One lock+release (or its raw equivalent) of each subject.
struct Subjects {
    raw: zookeeper_client::Client,
    locks: ZkProvider,
    fair: std::sync::Arc<dyn distlock::Lock>,
    unfair: std::sync::Arc<dyn distlock::Lock>,
}

const NAMES: [&str; 4] = [
    "raw create + delete (the floor)",
    "raw create + getChildren2 pipelined, then delete",
    "zk/fair_mutex lock + release",
    "zk/unfair_mutex lock + release",
];

impl Subjects {
    async fn new(connect: String) -> Self {
        let raw = zookeeper_client::Client::connect(&connect)
            .await
            .expect("zk");
        let open = CreateMode::Persistent.with_acls(Acls::anyone_all());
        let _ = raw.mkdir("/ratio", &open).await;
        let locks = ZkProvider::connect_with(ZkOptions::new(connect))
            .await
            .expect("zk provider");
        let fair = locks.fair_mutex("ratio/fair").expect("name");
        let unfair = locks.mutex("ratio/unfair").expect("name");
        Subjects {
            raw,
            locks,
            fair,
            unfair,
        }
    }

    async fn round(&self, subject: usize) {
        let ephemeral = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        match subject {
            0 => {
                let (_, seq) = self
                    .raw
                    .create("/ratio/n-", &[], &ephemeral)
                    .await
                    .expect("create");
                self.raw
                    .delete(&format!("/ratio/n-{seq}"), None)
                    .await
                    .expect("delete");
            }
            1 => {
                let created = self.raw.create("/ratio/n-", &[], &ephemeral);
                let listed = self.raw.get_children("/ratio");
                let (created, listed) = futures::join!(created, listed);
                let (_, seq) = created.expect("create");
                listed.expect("list");
                self.raw
                    .delete(&format!("/ratio/n-{seq}"), None)
                    .await
                    .expect("delete");
            }
            2 => self
                .fair
                .lock()
                .await
                .expect("lock")
                .release()
                .await
                .expect("release"),
            _ => self
                .unfair
                .lock()
                .await
                .expect("lock")
                .release()
                .await
                .expect("release"),
        }
    }
}

/// The medians of every subject, interleaved round by round.
async fn timed(s: &Subjects, rounds: usize) -> Vec<Duration> {
    let mut times = vec![Vec::with_capacity(rounds); NAMES.len()];
    for subject in 0..NAMES.len() {
        for _ in 0..20 {
            s.round(subject).await;
        }
    }
    for _ in 0..rounds {
        for (subject, t) in times.iter_mut().enumerate() {
            let start = Instant::now();
            s.round(subject).await;
            t.push(start.elapsed());
        }
    }
    times.into_iter().map(median).collect()
}

fn main() {
    let rounds: usize = std::env::var("DISTLOCK_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(500);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let zk = ZkCluster::standalone();
    rt.block_on(async {
        let counts = Counts::default();
        // Timed straight to the server, interleaved; counted through the
        // proxy, one subject at a time.
        let direct = Subjects::new(zk.connect_string()).await;
        if let Some(only) = std::env::var("DISTLOCK_PROFILE_SUBJECT")
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
        {
            // One subject alone: the client's CPU per round (this process
            // only, not the server's).
            for _ in 0..20 {
                direct.round(only).await;
            }
            let ((cpu, switches), start) = (cpu_time(), Instant::now());
            for _ in 0..rounds {
                direct.round(only).await;
            }
            let elapsed = start.elapsed();
            let (cpu_now, switches_now) = cpu_time();
            #[allow(clippy::cast_precision_loss)]
            let per = |d: Duration| d.as_secs_f64() * 1e6 / rounds as f64;
            #[allow(clippy::cast_precision_loss)]
            let switches = (switches_now - switches) as f64 / rounds as f64;
            println!(
                "{}: {:.1} µs client CPU, {switches:.1} voluntary context switches, {:.1} µs elapsed per round",
                NAMES[only],
                per(cpu_now - cpu),
                per(elapsed)
            );
            direct.locks.close().await.expect("close");
            return;
        }
        let medians = timed(&direct, rounds).await;
        direct.locks.close().await.expect("close");
        let addr = proxy(zk.addr(0), Arc::clone(&counts)).await;
        let proxied = Subjects::new(format!("127.0.0.1:{}", addr.port())).await;
        println!("| per lock+release | requests | by opcode (pings left out) | median (µs) | ratio |");
        println!("|---|---:|---|---:|---:|");
        for (subject, median) in medians.iter().enumerate() {
            let (per_round, _) = measure(&counts, 100, || proxied.round(subject)).await;
            show(NAMES[subject], &per_round, *median, medians[0]);
        }
        proxied.locks.close().await.expect("close");
    });
    drop(rt);
}
