//! Cross-process contention: N separate OS processes (the `contender`
//! binary, or a peer's script in `benches/peers/`) contend on one lock with
//! an empty critical section, against one Redis and one ZooKeeper started
//! for the whole run. Every process records its acquisitions on
//! `CLOCK_MONOTONIC`, so they merge into one timeline.
//!
//! `cargo bench -p distlock-benches --bench processes` writes
//! `benches/results/processes.md`, `processes.csv` and `processes.svg`.
//! Environment:
//!
//! * `DISTLOCK_XBENCH_SECS`: seconds per cell (default 3);
//! * `DISTLOCK_XBENCH_PROCS`: process counts (default `4,16`);
//! * `DISTLOCK_XBENCH_ONLY`: implementations to run (default all), e.g.
//!   `redis-mutex,redispy-1ms,mixed-redis,memory,zk-ops`; a partial run
//!   writes its files to `$TMPDIR/distlock-xbench/`, not `results/`;
//! * `DISTLOCK_XBENCH_TASKS`: contending tasks per distlock process
//!   (default 1);
//! * `DISTLOCK_XBENCH_K`: waiting tasks in the memory figure (default 1000);
//! * `DISTLOCK_XBENCH_SLOWLOG=0`: no slow log (it counts the commands clients
//!   sent, logging every command, which costs Redis CPU per command).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use distlock::zk::{ZkOptions, ZkProvider};
use distlock_benches::monotonic_ns;
use test_support::{unique_name, RedisServer, ZkCluster};

const CONTENDER: &str = env!("CARGO_BIN_EXE_contender");
const PEERS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/peers");

/// Which server an implementation talks to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Backend {
    Redis,
    Zk,
}

/// One implementation, as the runner starts it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Imp {
    RedisMutex,
    RedisFair,
    RedisElection,
    Rslock,
    RedisPyDefault,
    RedisPy1ms,
    ZkFair,
    ZkUnfair,
    Curator,
    Kazoo,
}

impl Imp {
    const ALL: [Imp; 10] = [
        Imp::RedisMutex,
        Imp::RedisFair,
        Imp::RedisElection,
        Imp::Rslock,
        Imp::RedisPyDefault,
        Imp::RedisPy1ms,
        Imp::ZkFair,
        Imp::ZkUnfair,
        Imp::Curator,
        Imp::Kazoo,
    ];

    fn label(self) -> &'static str {
        match self {
            Imp::RedisMutex => "redis-mutex",
            Imp::RedisFair => "redis-fair",
            Imp::RedisElection => "redis-election",
            Imp::Rslock => "rslock",
            Imp::RedisPyDefault => "redispy-default",
            Imp::RedisPy1ms => "redispy-1ms",
            Imp::ZkFair => "zk-fair",
            Imp::ZkUnfair => "zk-unfair",
            Imp::Curator => "curator",
            Imp::Kazoo => "kazoo",
        }
    }

    fn backend(self) -> Backend {
        match self {
            Imp::ZkFair | Imp::ZkUnfair | Imp::Curator | Imp::Kazoo => Backend::Zk,
            _ => Backend::Redis,
        }
    }

    fn color(self) -> &'static str {
        match self {
            Imp::RedisMutex => "#d62728",
            Imp::RedisFair => "#ff9896",
            Imp::RedisElection => "#8c564b",
            Imp::Rslock => "#ff7f0e",
            Imp::RedisPyDefault => "#bcbd22",
            Imp::RedisPy1ms => "#7f7f7f",
            Imp::ZkFair => "#1f77b4",
            Imp::ZkUnfair => "#2ca02c",
            Imp::Curator => "#9467bd",
            Imp::Kazoo => "#17becf",
        }
    }
}

/// What a cell runs: one implementation, or two on one lock (half the
/// processes each).
#[derive(Clone, Debug)]
struct Spec {
    label: &'static str,
    sides: Vec<Imp>,
}

fn specs() -> Vec<Spec> {
    let mut all: Vec<Spec> = Imp::ALL
        .iter()
        .map(|&imp| Spec {
            label: imp.label(),
            sides: vec![imp],
        })
        .collect();
    all.push(Spec {
        label: "mixed-redis",
        sides: vec![Imp::RedisMutex, Imp::RedisPy1ms],
    });
    all.push(Spec {
        label: "mixed-zk",
        sides: vec![Imp::ZkFair, Imp::Curator],
    });
    all
}

struct Servers {
    redis: RedisServer,
    zk: ZkCluster,
    /// Computes the ZooKeeper path of a distlock name (the interop path).
    zk_paths: ZkProvider,
    rt: tokio::runtime::Runtime,
    curator: Option<(tempfile::TempDir, String)>,
    tasks: usize,
    /// Every command in the slow log (to count what clients sent).
    slowlog: bool,
    /// A connect string that replaces ZooKeeper's (the counting relay).
    zk_via: Option<String>,
}

impl Servers {
    fn curator_classpath(&mut self) -> String {
        if let Some((_, cp)) = &self.curator {
            return cp.clone();
        }
        let jars = test_support::curator::JARS.join(":");
        let out = tempfile::tempdir().expect("a temporary directory");
        let status = Command::new("javac")
            .args(["-cp", &jars, "-d"])
            .arg(out.path())
            .arg(format!("{PEERS}/CuratorContender.java"))
            .status()
            .expect("javac runs (scripts/install-servers.sh installs a JDK)");
        assert!(status.success(), "javac CuratorContender.java failed");
        let cp = format!("{}:{jars}", out.path().display());
        self.curator = Some((out, cp.clone()));
        cp
    }

    fn command(&mut self, imp: Imp, name: &str, id: usize, barrier: &Path) -> Command {
        let redis = self.redis.url();
        let zk = self
            .zk_via
            .clone()
            .unwrap_or_else(|| self.zk.connect_string());
        let barrier = barrier.display().to_string();
        let id = id.to_string();
        let tasks = self.tasks.to_string();
        let distlock = |imp: &str, target: &str| {
            let mut c = Command::new(CONTENDER);
            c.args([imp, target, name, &id, &tasks, &barrier]);
            c
        };
        match imp {
            Imp::RedisMutex | Imp::RedisFair | Imp::RedisElection | Imp::Rslock => {
                distlock(imp.label(), &redis)
            }
            Imp::ZkFair | Imp::ZkUnfair => distlock(imp.label(), &zk),
            Imp::RedisPyDefault | Imp::RedisPy1ms => {
                // The key of a distlock mutex is its name (empty prefix).
                let sleep = if imp == Imp::RedisPy1ms {
                    "0.001"
                } else {
                    "0.1"
                };
                let mut c = Command::new("python3");
                c.arg(format!("{PEERS}/redispy_contender.py"))
                    .args([&redis, name, &id, sleep, &barrier]);
                c
            }
            Imp::Kazoo => {
                let path = self.zk_path(name);
                let mut c = Command::new("python3");
                c.arg(format!("{PEERS}/kazoo_contender.py"))
                    .args([&zk, &path, &id, &barrier]);
                c
            }
            Imp::Curator => {
                let path = self.zk_path(name);
                let cp = self.curator_classpath();
                let mut c = Command::new("java");
                c.args([
                    "-XX:+UseSerialGC",
                    "-Xmx128m",
                    "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                    "-cp",
                    &cp,
                    "CuratorContender",
                    &zk,
                    &path,
                    &id,
                    &barrier,
                ]);
                c
            }
        }
    }

    fn zk_path(&self, name: &str) -> String {
        self.zk_paths.path(name).expect("a valid name")
    }

    /// Redis `INFO commandstats` calls per command, and `INFO cpu` seconds.
    fn redis_stats(&self) -> (BTreeMap<String, u64>, f64) {
        let mut calls = BTreeMap::new();
        for line in self.redis.cli(&["INFO", "commandstats"]).lines() {
            let Some(rest) = line.strip_prefix("cmdstat_") else {
                continue;
            };
            let Some((cmd, fields)) = rest.split_once(':') else {
                continue;
            };
            let n = fields
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(0);
            calls.insert(cmd.to_owned(), n);
        }
        let mut cpu = 0.0;
        for line in self.redis.cli(&["INFO", "cpu"]).lines() {
            if let Some(v) = line
                .strip_prefix("used_cpu_sys:")
                .or_else(|| line.strip_prefix("used_cpu_user:"))
            {
                cpu += v.trim().parse::<f64>().unwrap_or(0.0);
            }
        }
        (calls, cpu)
    }

    fn redis_used_memory(&self) -> i64 {
        self.redis
            .cli(&["INFO", "memory"])
            .lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// ZooKeeper's `mntr` (four-letter word, whitelisted by test-support).
    fn zk_mntr(&self) -> BTreeMap<String, i64> {
        let mut out = BTreeMap::new();
        let Ok(mut s) = TcpStream::connect(self.zk.addr(0)) else {
            return out;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = s.write_all(b"mntr");
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        for line in text.lines() {
            if let Some((k, v)) = line.split_once('\t') {
                if let Ok(v) = v.trim().parse::<i64>() {
                    out.insert(k.to_owned(), v);
                }
            }
        }
        out
    }
}

/// A RESP reply, as far as `SLOWLOG GET` needs.
enum Resp {
    Text(String),
    Int,
    Array(Vec<Resp>),
}

fn read_resp(r: &mut impl std::io::BufRead) -> std::io::Result<Resp> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let line = line.trim_end();
    let (kind, rest) = line.split_at(1.min(line.len()));
    let n: i64 = rest.parse().unwrap_or(-1);
    Ok(match kind {
        "*" => {
            let mut items = Vec::new();
            for _ in 0..n.max(0) {
                items.push(read_resp(r)?);
            }
            Resp::Array(items)
        }
        "$" if n >= 0 => {
            let mut buf = vec![0; usize::try_from(n).unwrap_or(0) + 2];
            r.read_exact(&mut buf)?;
            buf.truncate(buf.len() - 2);
            Resp::Text(String::from_utf8_lossy(&buf).into_owned())
        }
        "+" | "-" => Resp::Text(rest.to_owned()),
        _ => Resp::Int,
    })
}

/// Top-level (client-sent) and script-internal commands, by name, from
/// the slow log (every command logged: `slowlog-log-slower-than 0`);
/// script-internal entries carry the client address `?:0`.
fn slowlog_counts(
    addr: std::net::SocketAddr,
) -> (BTreeMap<String, u64>, BTreeMap<String, u64>, usize) {
    let (mut top, mut inner) = (BTreeMap::new(), BTreeMap::new());
    let Ok(mut s) = TcpStream::connect(addr) else {
        return (top, inner, 0);
    };
    let _ = s.write_all(b"SLOWLOG GET -1\r\n");
    let mut r = BufReader::new(s);
    let Ok(Resp::Array(entries)) = read_resp(&mut r) else {
        return (top, inner, 0);
    };
    let total = entries.len();
    for e in entries {
        let Resp::Array(f) = e else { continue };
        let (Some(Resp::Array(args)), Some(Resp::Text(client))) = (f.get(3), f.get(4)) else {
            continue;
        };
        let Some(Resp::Text(cmd)) = args.first() else {
            continue;
        };
        let cmd = cmd.to_lowercase();
        if ["slowlog", "info", "config"].contains(&cmd.as_str()) {
            continue;
        }
        let map = if client == "?:0" {
            &mut inner
        } else {
            &mut top
        };
        *map.entry(cmd).or_insert(0) += 1;
    }
    (top, inner, total)
}

const SLOWLOG_LEN: usize = 1_000_000;

/// A loopback TCP relay in front of ZooKeeper that counts requests by
/// opcode and watch notifications (the jute framing: a 4-byte length, then,
/// after the connect request, `xid` and `type`; a reply with xid -1 is a
/// watch event).
struct ZkOps {
    addr: std::net::SocketAddr,
    counts: std::sync::Arc<std::sync::Mutex<BTreeMap<String, u64>>>,
}

fn zk_op_name(op: i32) -> String {
    match op {
        1 => "create".into(),
        2 => "delete".into(),
        3 => "exists".into(),
        4 => "getData".into(),
        5 => "setData".into(),
        8 => "getChildren".into(),
        9 => "sync".into(),
        11 => "ping".into(),
        12 => "getChildren2".into(),
        14 => "multi".into(),
        15 => "create2".into(),
        17 => "checkWatches".into(),
        18 => "removeWatches".into(),
        19 => "createContainer".into(),
        21 => "createTTL".into(),
        22 => "multiRead".into(),
        101 => "setWatches".into(),
        105 => "setWatches2".into(),
        106 => "addWatch".into(),
        -11 => "closeSession".into(),
        other => format!("op{other}"),
    }
}

/// Reads one length-prefixed frame; `None` at the end of the stream.
fn read_frame(r: &mut impl std::io::Read) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).ok()?;
    let n = usize::try_from(i32::from_be_bytes(len)).ok()?;
    let mut buf = vec![0u8; n + 4];
    buf[..4].copy_from_slice(&len);
    r.read_exact(&mut buf[4..]).ok()?;
    Some(buf)
}

impl ZkOps {
    fn start(upstream: std::net::SocketAddr) -> Self {
        use std::sync::{Arc, Mutex};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the relay");
        let addr = listener.local_addr().expect("the relay's address");
        let counts: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
        let c = Arc::clone(&counts);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                for (from, to, requests) in [
                    (client.try_clone(), server.try_clone(), true),
                    (server.try_clone(), client.try_clone(), false),
                ] {
                    let (Ok(mut from), Ok(mut to)) = (from, to) else {
                        continue;
                    };
                    let c = Arc::clone(&c);
                    std::thread::spawn(move || {
                        let mut first = true;
                        while let Some(frame) = read_frame(&mut from) {
                            if !first && frame.len() >= 12 {
                                let xid =
                                    i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
                                let key = if requests {
                                    let op = i32::from_be_bytes([
                                        frame[8], frame[9], frame[10], frame[11],
                                    ]);
                                    Some(zk_op_name(op))
                                } else if xid == -1 {
                                    Some("watch event".to_owned())
                                } else {
                                    None
                                };
                                if let Some(key) = key {
                                    *c.lock().expect("poisoned").entry(key).or_insert(0) += 1;
                                }
                            }
                            first = false;
                            if to.write_all(&frame).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        ZkOps { addr, counts }
    }

    fn take(&self) -> BTreeMap<String, u64> {
        std::mem::take(&mut *self.counts.lock().expect("poisoned"))
    }
}

/// One acquisition, as a contender printed it.
#[derive(Clone, Copy, Debug)]
struct Acq {
    proc: usize,
    acquire: u64,
    release: u64,
    wait: u64,
}

struct Cell {
    label: &'static str,
    sides: Vec<Imp>,
    procs: usize,
    /// Acquisitions inside the window, by acquire instant.
    acqs: Vec<Acq>,
    secs: f64,
    /// `INFO commandstats` delta: every command, script-internal ones too.
    redis_calls: BTreeMap<String, u64>,
    /// Commands clients sent (the slow log's top-level entries).
    top: BTreeMap<String, u64>,
    /// CPU time (user + system) Redis used in the window, in seconds.
    redis_cpu: f64,
    /// CPU time (user + system) the contender processes used in the
    /// window, all threads, in seconds (`/proc/PID/stat`).
    client_cpu: f64,
    /// CPU time the ZooKeeper server used in the window, in seconds.
    zk_cpu: f64,
    /// `INFO commandstats` delta over the window only (from its start to its
    /// end instant, read by the runner).
    window_calls: BTreeMap<String, u64>,
    zk: BTreeMap<String, i64>,
    wakeups: Option<u64>,
    errors: u64,
}

/// Nearest-rank percentile of sorted values, in thousandths.
fn pct(sorted: &[u64], per_mille: usize) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[(sorted.len() - 1) * per_mille.min(1000) / 1000]
}

fn ms(ns: u64) -> String {
    format!("{:.2}", ns as f64 / 1e6)
}

impl Cell {
    fn side_of(&self, proc: usize) -> usize {
        proc % self.sides.len()
    }

    fn backend(&self) -> Backend {
        self.sides[0].backend()
    }

    fn throughput(&self) -> f64 {
        self.acqs.len() as f64 / self.secs
    }

    /// Fraction of consecutive acquisitions by different processes.
    fn handoff_share(&self) -> f64 {
        let pairs = self.acqs.windows(2);
        let n = pairs.len();
        if n == 0 {
            return 0.0;
        }
        self.acqs
            .windows(2)
            .filter(|w| w[0].proc != w[1].proc)
            .count() as f64
            / n as f64
    }

    /// Median time from a release call to the next acquisition, over the
    /// consecutive acquisitions that went to another process (ns).
    fn handoff_gap_p50(&self) -> u64 {
        let mut gaps: Vec<u64> = self
            .acqs
            .windows(2)
            .filter(|w| w[0].proc != w[1].proc)
            .map(|w| w[1].acquire.saturating_sub(w[0].release))
            .collect();
        gaps.sort_unstable();
        pct(&gaps, 500)
    }

    /// Fraction of consecutive acquisitions by different sides (mixed).
    fn side_switches(&self) -> f64 {
        let n = self.acqs.len().saturating_sub(1);
        if n == 0 {
            return 0.0;
        }
        self.acqs
            .windows(2)
            .filter(|w| self.side_of(w[0].proc) != self.side_of(w[1].proc))
            .count() as f64
            / n as f64
    }

    fn side_share(&self, side: usize) -> f64 {
        if self.acqs.is_empty() {
            return 0.0;
        }
        self.acqs
            .iter()
            .filter(|a| self.side_of(a.proc) == side)
            .count() as f64
            / self.acqs.len() as f64
    }

    /// Acquisitions that began before the previous holder's release began:
    /// a mutual exclusion violation (or a clock problem); must be 0.
    fn overlaps(&self) -> usize {
        let mut last_release = 0;
        let mut bad = 0;
        for a in &self.acqs {
            if a.acquire < last_release {
                bad += 1;
            }
            last_release = last_release.max(a.release);
        }
        bad
    }

    fn waits(&self, proc: Option<usize>) -> Vec<u64> {
        let mut w: Vec<u64> = self
            .acqs
            .iter()
            .filter(|a| proc.is_none_or(|p| a.proc == p))
            .map(|a| a.wait)
            .collect();
        w.sort_unstable();
        w
    }

    /// Per process: (acquisitions, p50, p99, max wait).
    fn per_proc(&self) -> Vec<(usize, u64, u64, u64)> {
        (0..self.procs)
            .map(|p| {
                let w = self.waits(Some(p));
                (
                    w.len(),
                    pct(&w, 500),
                    pct(&w, 990),
                    w.last().copied().unwrap_or(0),
                )
            })
            .collect()
    }

    /// Commands the clients sent (top level).
    fn commands(&self) -> u64 {
        self.top.values().sum()
    }

    /// Every command Redis ran, script-internal ones included.
    fn all_commands(&self) -> u64 {
        self.redis_calls
            .iter()
            .filter(|(c, _)| !["info", "slowlog", "config"].contains(&c.as_str()))
            .map(|(_, n)| n)
            .sum()
    }

    fn top_per_acq(&self, cmd: &str) -> f64 {
        self.per_acq(self.top.get(cmd).copied().unwrap_or(0) as f64)
    }

    fn per_acq(&self, n: f64) -> f64 {
        if self.acqs.is_empty() {
            0.0
        } else {
            n / self.acqs.len() as f64
        }
    }

    /// Server requests per acquisition: Redis commands, or ZooKeeper
    /// packets received.
    fn server_per_acq(&self) -> f64 {
        match self.backend() {
            Backend::Redis => self.per_acq(self.commands() as f64),
            Backend::Zk => {
                self.per_acq(self.zk.get("zk_packets_received").copied().unwrap_or(0) as f64)
            }
        }
    }

    fn breakdown(&self) -> String {
        match self.backend() {
            Backend::Redis => {
                let list = |m: &BTreeMap<String, u64>| {
                    let mut by: Vec<(&String, &u64)> = m
                        .iter()
                        .filter(|(c, n)| {
                            !["info", "slowlog", "config"].contains(&c.as_str()) && **n > 0
                        })
                        .collect();
                    by.sort_by(|a, b| b.1.cmp(a.1));
                    by.iter()
                        .map(|(c, n)| {
                            format!("{} {:.2}", c.to_uppercase(), self.per_acq(**n as f64))
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                format!(
                    "{} (all commands incl. inside scripts {:.2}: {})",
                    if self.top.is_empty() {
                        "- (slow log off)".to_owned()
                    } else {
                        list(&self.top)
                    },
                    self.per_acq(self.all_commands() as f64),
                    list(&self.redis_calls)
                )
            }
            Backend::Zk => ["zk_packets_received", "zk_packets_sent"]
                .iter()
                .map(|k| {
                    let v = self.zk.get(*k).copied().unwrap_or(0);
                    format!(
                        "{} {:.2}",
                        k.trim_start_matches("zk_"),
                        self.per_acq(v as f64)
                    )
                })
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
}

/// CPU time (user + system, every thread) process `pid` used so far, in
/// seconds; 0 when it is gone.
fn process_cpu(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command name's closing parenthesis: field 3 (state) first,
    // then utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse().ok())
        .collect();
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    f.iter().sum::<f64>() / ticks.max(1) as f64
}

/// Runs one cell: starts the processes, waits until each is ready, opens
/// the barrier, collects their lines.
fn run(s: &mut Servers, spec: &Spec, procs: usize, secs: f64) -> Cell {
    run_with(s, spec, procs, secs, &|| {})
}

/// As [`run`], calling `at_start` once every process is ready, just before
/// the barrier opens.
fn run_with(s: &mut Servers, spec: &Spec, procs: usize, secs: f64, at_start: &dyn Fn()) -> Cell {
    let name = unique_name(&format!("x-{}-{procs}", spec.label));
    let dir = tempfile::tempdir().expect("a temporary directory");
    let barrier = dir.path().join("barrier");
    let (tx, rx) = mpsc::channel::<(usize, String)>();
    let mut children: Vec<(Child, std::thread::JoinHandle<String>)> = Vec::new();
    for id in 0..procs {
        let imp = spec.sides[id % spec.sides.len()];
        let mut cmd = s.command(imp, &name, id, &barrier);
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", imp.label()));
        let stdout = child.stdout.take().expect("piped");
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send((id, line)).is_err() {
                    break;
                }
            }
        });
        let mut stderr = child.stderr.take().expect("piped");
        let err = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        children.push((child, err));
    }
    drop(tx);
    let mut lines: Vec<(usize, String)> = Vec::new();
    let mut ready = 0;
    while ready < procs {
        match rx.recv_timeout(Duration::from_secs(120)) {
            Ok((id, line)) if line.starts_with("ready,") => {
                let _ = id;
                ready += 1;
            }
            Ok(other) => lines.push(other),
            Err(e) => {
                for (mut c, err) in children {
                    let _ = c.kill();
                    let _ = c.wait();
                    eprintln!("{}", err.join().unwrap_or_default());
                }
                panic!("{}: only {ready} of {procs} ready: {e}", spec.label);
            }
        }
    }
    let _ = s.redis.cli(&["SLOWLOG", "RESET"]);
    at_start();
    let (redis_before, _) = s.redis_stats();
    let zk_before = s.zk_mntr();
    let start = monotonic_ns() + 100_000_000;
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let end = start + (secs * 1e9) as u64;
    let tmp = dir.path().join("barrier.tmp");
    std::fs::write(&tmp, format!("{start} {end}\n")).expect("write the barrier");
    std::fs::rename(&tmp, &barrier).expect("open the barrier");
    let pids: Vec<u32> = children.iter().map(|(c, _)| c.id()).collect();
    let sleep_until = |at: u64| {
        std::thread::sleep(Duration::from_nanos(at.saturating_sub(monotonic_ns())));
    };
    sleep_until(start);
    let zk_pid = s.zk.pid(0).and_then(|p| u32::try_from(p).ok());
    let client_before: f64 = pids.iter().map(|&p| process_cpu(p)).sum();
    let zk_cpu_before = zk_pid.map_or(0.0, process_cpu);
    let (window_before, redis_cpu_before) = s.redis_stats();
    sleep_until(end);
    // The contenders first: what they do after the window (the last
    // release, printing their samples) is not theirs to count.
    let client_cpu = pids.iter().map(|&p| process_cpu(p)).sum::<f64>() - client_before;
    let zk_cpu = zk_pid.map_or(0.0, process_cpu) - zk_cpu_before;
    let (window_after, redis_cpu_after) = s.redis_stats();
    let window_calls = window_after
        .iter()
        .map(|(k, v)| (k.clone(), v - window_before.get(k).copied().unwrap_or(0)))
        .collect();
    lines.extend(rx.iter());
    let mut errors = 0;
    for (mut c, err) in children {
        let status = c.wait().expect("wait for a contender");
        let err = err.join().unwrap_or_default();
        // The JVM peers warn on close; show standard error on failure only.
        if !status.success() {
            eprintln!("{} ({status}): {}", spec.label, err.trim());
        }
        if !status.success() {
            errors += 1;
        }
    }
    let (redis_after, _) = s.redis_stats();
    let (top, _inner, logged) = if s.slowlog {
        slowlog_counts(s.redis.addr())
    } else {
        (BTreeMap::new(), BTreeMap::new(), 0)
    };
    if logged >= SLOWLOG_LEN {
        eprintln!(
            "{}: the slow log overflowed; client command counts are low",
            spec.label
        );
    }
    let zk_after = s.zk_mntr();
    let mut acqs = Vec::new();
    let mut wakeups: Option<u64> = None;
    for (_, line) in &lines {
        let f: Vec<&str> = line.split(',').collect();
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        match f.first() {
            Some(&"acq") => {
                let a = Acq {
                    proc: usize::try_from(num(1)).unwrap_or(0),
                    acquire: num(3),
                    release: num(4),
                    wait: num(5),
                };
                if (start..end).contains(&a.acquire) {
                    acqs.push(a);
                }
            }
            Some(&"wakeups") => *wakeups.get_or_insert(0) += num(2),
            Some(&"done") => errors += num(3),
            _ => {}
        }
    }
    acqs.sort_by_key(|a| a.acquire);
    let redis_calls = redis_after
        .iter()
        .map(|(k, v)| (k.clone(), v - redis_before.get(k).copied().unwrap_or(0)))
        .collect();
    let zk = zk_after
        .iter()
        .map(|(k, v)| (k.clone(), v - zk_before.get(k).copied().unwrap_or(0)))
        .collect();
    Cell {
        label: spec.label,
        sides: spec.sides.clone(),
        procs,
        acqs,
        secs,
        redis_calls,
        top,
        redis_cpu: redis_cpu_after - redis_cpu_before,
        client_cpu,
        zk_cpu,
        window_calls,
        zk,
        wakeups,
        errors,
    }
}

/// Resident memory of one process whose K tasks wait on a held lock, and
/// what the server holds for them meanwhile.
struct Memory {
    label: &'static str,
    k: u64,
    rss_delta: i64,
    /// Heap bytes in use (malloc's count), after minus before.
    heap_delta: i64,
    /// The same for K more waiters as futures in one task (no task each):
    /// what the library keeps per waiter.
    futures_delta: i64,
    server_delta: Option<(String, i64)>,
}

fn memory(s: &Servers, imp: &'static str, k: usize) -> Memory {
    let target = if imp.starts_with("zk") {
        s.zk.connect_string()
    } else {
        s.redis.url()
    };
    // The slow log would count as server memory: off while measuring.
    let _ = s
        .redis
        .cli(&["CONFIG", "SET", "slowlog-log-slower-than", "-1"]);
    let _ = s.redis.cli(&["SLOWLOG", "RESET"]);
    let redis_before = s.redis_used_memory();
    let zk_before = s.zk_mntr();
    let mut child = Command::new(CONTENDER)
        .args(["memory", imp, &target, &k.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the contender");
    let mut out = BufReader::new(child.stdout.take().expect("piped"));
    let mut line = String::new();
    let _ = out.read_line(&mut line);
    let f: Vec<i64> = line
        .trim()
        .split(',')
        .skip(1)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    let server_delta = if imp.starts_with("redis") {
        Some((
            "Redis used_memory".to_owned(),
            s.redis_used_memory() - redis_before,
        ))
    } else if imp.starts_with("zk") {
        let zk_after = s.zk_mntr();
        let d = |k: &str| {
            zk_after.get(k).copied().unwrap_or(0) - zk_before.get(k).copied().unwrap_or(0)
        };
        Some((
            format!(
                "ZooKeeper approximate_data_size (znodes {:+}, watches {:+})",
                d("zk_znode_count"),
                d("zk_watch_count")
            ),
            d("zk_approximate_data_size"),
        ))
    } else {
        None
    };
    drop(child.stdin.take());
    let _ = child.wait();
    let threshold = if s.slowlog { "0" } else { "-1" };
    let _ = s
        .redis
        .cli(&["CONFIG", "SET", "slowlog-log-slower-than", threshold]);
    Memory {
        label: imp,
        k: u64::try_from(f.get(2).copied().unwrap_or(0)).unwrap_or(0),
        rss_delta: f.get(1).copied().unwrap_or(0) - f.first().copied().unwrap_or(0),
        heap_delta: f.get(4).copied().unwrap_or(0) - f.get(3).copied().unwrap_or(0),
        futures_delta: f.get(6).copied().unwrap_or(0) - f.get(5).copied().unwrap_or(0),
        server_delta,
    }
}

fn env_list(var: &str) -> Option<Vec<String>> {
    std::env::var(var).ok().map(|v| {
        v.split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect()
    })
}

fn main() {
    let secs = std::env::var("DISTLOCK_XBENCH_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(3.0);
    let procs: Vec<usize> = env_list("DISTLOCK_XBENCH_PROCS")
        .map(|v| v.iter().filter_map(|p| p.parse().ok()).collect())
        .unwrap_or_else(|| vec![4, 16]);
    let only = env_list("DISTLOCK_XBENCH_ONLY");
    let wanted = |label: &str| only.as_ref().is_none_or(|o| o.iter().any(|x| x == label));
    let tasks = std::env::var("DISTLOCK_XBENCH_TASKS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let k = std::env::var("DISTLOCK_XBENCH_K")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let slowlog = std::env::var("DISTLOCK_XBENCH_SLOWLOG").map_or(true, |v| v != "0");
    let redis = RedisServer::start_with(&[
        "--slowlog-log-slower-than",
        if slowlog { "0" } else { "-1" },
        "--slowlog-max-len",
        &SLOWLOG_LEN.to_string(),
    ]);
    let zk = ZkCluster::standalone();
    let zk_paths = rt
        .block_on(ZkProvider::connect_with(ZkOptions::new(
            zk.connect_string(),
        )))
        .expect("zk");
    let mut s = Servers {
        redis,
        zk,
        zk_paths,
        rt,
        curator: None,
        tasks,
        slowlog,
        zk_via: None,
    };
    eprintln!(
        "processes: {secs} s per cell, {procs:?} processes, {tasks} task(s) per distlock process"
    );
    let mut cells = Vec::new();
    for spec in specs() {
        if !wanted(spec.label) {
            continue;
        }
        for &n in &procs {
            let cell = run(&mut s, &spec, n, secs);
            eprintln!(
                "{:<16} {:>2} procs: {:>7.0} acq/s, handoff {:.2}, wait p50 {} ms p99 {} ms max {} ms, {:.2} server req/acq, overlaps {}, errors {}",
                cell.label,
                n,
                cell.throughput(),
                cell.handoff_share(),
                ms(pct(&cell.waits(None), 500)),
                ms(pct(&cell.waits(None), 990)),
                ms(cell.waits(None).last().copied().unwrap_or(0)),
                cell.server_per_acq(),
                cell.overlaps(),
                cell.errors,
            );
            cells.push(cell);
        }
    }
    let mut mem = Vec::new();
    if wanted("memory") {
        for imp in ["mem", "redis-mutex", "redis-fair", "zk-fair", "zk-unfair"] {
            let m = memory(&s, imp, k);
            eprintln!(
                "memory {:<12} {} waiters: {} bytes RSS",
                m.label, m.k, m.rss_delta
            );
            mem.push(m);
        }
    }
    // ZooKeeper requests by type: short extra cells through a counting
    // relay (which adds a hop, so their throughput is not reported).
    let mut ops = Vec::new();
    if wanted("zk-ops") {
        let relay = ZkOps::start(s.zk.addr(0));
        s.zk_via = Some(relay.addr.to_string());
        for spec in specs() {
            if !["zk-fair", "zk-unfair", "curator", "kazoo", "mixed-zk"].contains(&spec.label) {
                continue;
            }
            let n = procs.first().copied().unwrap_or(4);
            let cell = run_with(&mut s, &spec, n, secs.min(2.0), &|| {
                let _ = relay.take();
            });
            let counts = relay.take();
            eprintln!("zk-ops {:<10} {n} procs: {counts:?}", spec.label);
            ops.push((spec.label, n, cell.acqs.len(), counts));
        }
        s.zk_via = None;
    }
    let report = report(&cells, &mem, &ops, secs, tasks);
    println!("{report}");
    // A partial run (DISTLOCK_XBENCH_ONLY) leaves the results of record alone.
    let dir = if only.is_some() {
        std::env::temp_dir()
            .join("distlock-xbench")
            .display()
            .to_string()
    } else {
        concat!(env!("CARGO_MANIFEST_DIR"), "/results").to_owned()
    };
    let _ = std::fs::create_dir_all(&dir);
    std::fs::write(format!("{dir}/processes.md"), &report).expect("write md");
    std::fs::write(format!("{dir}/processes.csv"), csv(&cells)).expect("write csv");
    std::fs::write(
        format!("{dir}/processes-per-process.csv"),
        per_process_csv(&cells),
    )
    .expect("write per-process csv");
    std::fs::write(format!("{dir}/processes.svg"), svg(&cells)).expect("write svg");
    eprintln!(
        "wrote {dir}/processes.md, processes.csv, processes-per-process.csv and processes.svg"
    );
    drop(s.rt);
}

fn find<'a>(cells: &'a [Cell], label: &str, procs: usize) -> Option<&'a Cell> {
    cells.iter().find(|c| c.label == label && c.procs == procs)
}

fn csv(cells: &[Cell]) -> String {
    let mut out = String::from("implementation,processes,acquisitions,acq_per_s,handoff_share,wait_p50_ms,wait_p99_ms,wait_max_ms,worst_proc_p99_ms,min_per_proc,max_per_proc,server_requests_per_acq,server_cpu_us_per_acq,client_cpu_us_per_acq,wakeups_per_acq,overlaps,errors\n");
    for c in cells {
        let w = c.waits(None);
        let per = c.per_proc();
        let _ = writeln!(
            out,
            "{},{},{},{:.0},{:.3},{},{},{},{},{},{},{:.2},{:.1},{:.1},{},{},{}",
            c.label,
            c.procs,
            c.acqs.len(),
            c.throughput(),
            c.handoff_share(),
            ms(pct(&w, 500)),
            ms(pct(&w, 990)),
            ms(w.last().copied().unwrap_or(0)),
            ms(per.iter().map(|p| p.2).max().unwrap_or(0)),
            per.iter().map(|p| p.0).min().unwrap_or(0),
            per.iter().map(|p| p.0).max().unwrap_or(0),
            c.server_per_acq(),
            if c.backend() == Backend::Redis {
                c.per_acq(c.redis_cpu * 1e6)
            } else {
                c.per_acq(c.zk_cpu * 1e6)
            },
            c.per_acq(c.client_cpu * 1e6),
            c.wakeups
                .map_or("-".into(), |w| format!("{:.2}", c.per_acq(w as f64))),
            c.overlaps(),
            c.errors
        );
    }
    out
}

/// Wait percentiles of every process of every cell.
fn per_process_csv(cells: &[Cell]) -> String {
    let mut out = String::from(
        "implementation,processes,process,side,acquisitions,wait_p50_ms,wait_p99_ms,wait_max_ms\n",
    );
    for c in cells {
        for (p, (n, p50, p99, max)) in c.per_proc().into_iter().enumerate() {
            let _ = writeln!(
                out,
                "{},{},{p},{},{n},{},{},{}",
                c.label,
                c.procs,
                c.sides[c.side_of(p)].label(),
                ms(p50),
                ms(p99),
                ms(max)
            );
        }
    }
    out
}

/// ZooKeeper requests by type per acquisition: (cell, processes,
/// acquisitions, counts).
type ZkOpCounts = (&'static str, usize, usize, BTreeMap<String, u64>);

fn report(cells: &[Cell], mem: &[Memory], ops: &[ZkOpCounts], secs: f64, tasks: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Cross-process contention (`--bench processes`)\n\n{secs} s per cell, {tasks} contending task(s) per distlock process, one Redis and one ZooKeeper for the whole run, empty critical section. Waits in ms.\n"
    );
    // Targets first.
    out.push_str(&targets(cells, mem));
    out.push_str("\n## Every cell\n\n| implementation | processes | acquisitions/s | handoff share | wait p50 | wait p99 | wait max | max / p50 | worst process p99 | fewest / most per process | server requests per acq. | server CPU µs per acq. | contenders' CPU µs per acq. | wake-ups per acq. | overlaps | errors |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for c in cells {
        let w = c.waits(None);
        let per = c.per_proc();
        let p50 = pct(&w, 500);
        let max = w.last().copied().unwrap_or(0);
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {:.2} | {} | {} | {} | {:.1} | {} | {} / {} | {:.2} | {} | {:.0} | {} | {} | {} |",
            c.label,
            c.procs,
            c.throughput(),
            c.handoff_share(),
            ms(p50),
            ms(pct(&w, 990)),
            ms(max),
            max as f64 / p50.max(1) as f64,
            ms(per.iter().map(|p| p.2).max().unwrap_or(0)),
            per.iter().map(|p| p.0).min().unwrap_or(0),
            per.iter().map(|p| p.0).max().unwrap_or(0),
            c.server_per_acq(),
            if c.backend() == Backend::Redis {
                format!("{:.1}", c.per_acq(c.redis_cpu * 1e6))
            } else {
                format!("{:.1}", c.per_acq(c.zk_cpu * 1e6))
            },
            c.per_acq(c.client_cpu * 1e6),
            c.wakeups
                .map_or("-".into(), |w| format!("{:.2}", c.per_acq(w as f64))),
            c.overlaps(),
            c.errors
        );
    }
    out.push_str("\n## Server requests per acquisition, by command\n\nRedis: the commands clients sent (the slow log, every command logged, top-level entries), then in parentheses every command Redis ran including those inside scripts (`INFO commandstats` delta); over the whole cell (the last in-flight operations after the window included), divided by the acquisitions in the window. ZooKeeper: `mntr` packets received / sent (one request is one packet received).\n\n| implementation | processes | per acquisition |\n|---|---:|---|\n");
    for c in cells {
        let _ = writeln!(out, "| {} | {} | {} |", c.label, c.procs, c.breakdown());
    }
    let mixed: Vec<&Cell> = cells.iter().filter(|c| c.sides.len() > 1).collect();
    if !mixed.is_empty() {
        out.push_str("\n## Mixed runs (half the processes each side, one lock)\n\n| run | processes | side A | side B | acquisitions | A's share | B's share | passes between sides (fraction of consecutive acquisitions) |\n|---|---:|---|---|---:|---:|---:|---:|\n");
        for c in mixed {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {:.2} | {:.2} | {:.3} ({} passes) |",
                c.label,
                c.procs,
                c.sides[0].label(),
                c.sides[1].label(),
                c.acqs.len(),
                c.side_share(0),
                c.side_share(1),
                c.side_switches(),
                (c.side_switches() * c.acqs.len().saturating_sub(1) as f64).round()
            );
        }
    }
    if !ops.is_empty() {
        out.push_str("\n## ZooKeeper requests per acquisition, by type\n\nSeparate short cells through a relay that decodes the clients' requests (opcode) and the server's watch events, counted from the barrier to the end of the cell (the last in-flight operations and the sessions' close included), divided by the acquisitions in the window.\n\n| implementation | processes | acquisitions | per acquisition |\n|---|---:|---:|---|\n");
        for (label, n, acqs, counts) in ops {
            let mut by: Vec<(&String, &u64)> = counts.iter().collect();
            by.sort_by(|a, b| b.1.cmp(a.1));
            let list = by
                .iter()
                .map(|(k, v)| format!("{k} {:.2}", **v as f64 / (*acqs).max(1) as f64))
                .collect::<Vec<_>>()
                .join(", ");
            let _ = writeln!(out, "| {label} | {n} | {acqs} | {list} |");
        }
    }
    if !mem.is_empty() {
        out.push_str("\n## Memory per waiting contender\n\nOne `contender memory` process: a holder on one provider, then one waiter on a second provider (so per-provider machinery is not counted), then RSS before / after K more tasks wait 3 s on the held lock through that provider, each read after `malloc_trim(0)` (so not the allocator's high-water mark from the K first attempts in flight at once), and the heap in use (glibc's `mallinfo2().uordblks`: what the waiters' allocations hold, without the pages the allocator keeps around them). Then K more `lock()` futures wait 3 s driven by one task (no task each, their slots allocated before the count): the heap that adds per waiter is what the library keeps for a waiting contender; the per-task figure adds the tokio task an application may spawn for each (384 B of it is the task itself). The server figure is read while they wait, against the figure before the process started.\n\n| implementation | K | heap per waiting future (library) | heap per waiting task | RSS per waiting task | server | server delta per waiter |\n|---|---:|---:|---:|---:|---|---:|\n");
        for m in mem {
            let per = m.rss_delta as f64 / m.k.max(1) as f64;
            let (server, sd) =
                m.server_delta
                    .as_ref()
                    .map_or(("-".into(), "-".into()), |(what, d)| {
                        (
                            what.clone(),
                            format!("{:.0} B", *d as f64 / m.k.max(1) as f64),
                        )
                    });
            let _ = writeln!(
                out,
                "| {} | {} | {:.2} KiB | {:.2} KiB | {:.2} KiB | {server} | {sd} |",
                m.label,
                m.k,
                m.futures_delta as f64 / m.k.max(1) as f64 / 1024.0,
                m.heap_delta as f64 / m.k.max(1) as f64 / 1024.0,
                per / 1024.0
            );
        }
    }
    out
}

/// Commands a distlock Redis client sends (scripts and subscriptions) per
/// acquisition, both counted over the window only (`INFO commandstats` at
/// its start and end instants): the slow log's figure counts the whole
/// cell, so each process's first wait and its last calls after the window
/// add to it while their acquisitions are not counted.
fn steady_per_acq(c: &Cell) -> f64 {
    let sent: u64 = ["evalsha", "eval", "subscribe", "unsubscribe"]
        .iter()
        .map(|k| c.window_calls.get(*k).copied().unwrap_or(0))
        .sum();
    c.per_acq(sent as f64)
}

fn met(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "met",
        Some(false) => "**missed**",
        None => "not run",
    }
}

fn targets(cells: &[Cell], mem: &[Memory]) -> String {
    let mut out = String::from(
        "## Targets across processes\n\n| figure | target | measured | met? |\n|---|---|---|---|\n",
    );
    let mut row = |figure: String, target: &str, measured: String, ok: Option<bool>| {
        let _ = writeln!(out, "| {figure} | {target} | {measured} | {} |", met(ok));
    };
    for n in [4, 16] {
        let (a, b) = (find(cells, "redis-mutex", n), find(cells, "redispy-1ms", n));
        let r = a
            .zip(b)
            .map(|(a, b)| a.throughput() / b.throughput().max(1e-9));
        row(
            format!("Redis mutex, {n} processes: throughput"),
            "≥ 2× redis-py 1 ms",
            a.zip(b).map_or("-".into(), |(a, b)| {
                format!(
                    "{:.0} / {:.0} acq/s = {:.2}×; per acquisition: CPU {:.0} + {:.0} µs (Redis + clients) against {:.0} + {:.0}, {:.0} µs from a release call to the next acquisition in another process (p50; redis-py {:.0}), handoff share {:.2} against {:.2}",
                    a.throughput(),
                    b.throughput(),
                    r.unwrap_or(0.0),
                    a.per_acq(a.redis_cpu * 1e6),
                    a.per_acq(a.client_cpu * 1e6),
                    b.per_acq(b.redis_cpu * 1e6),
                    b.per_acq(b.client_cpu * 1e6),
                    a.handoff_gap_p50() as f64 / 1e3,
                    b.handoff_gap_p50() as f64 / 1e3,
                    a.handoff_share(),
                    b.handoff_share()
                )
            }),
            r.map(|r| r >= 2.0),
        );
    }
    let c16 = find(cells, "redis-mutex", 16);
    row(
        "Redis mutex, 16 processes: commands per acquisition".into(),
        "≤ 3, no SUBSCRIBE/UNSUBSCRIBE per acquisition",
        c16.map_or("-".into(), |c| {
            let sub = c.top_per_acq("subscribe") + c.top_per_acq("unsubscribe");
            format!(
                "{:.2} in the window ({:.2} over the whole cell: {}); SUBSCRIBE+UNSUBSCRIBE {:.2}",
                steady_per_acq(c),
                c.server_per_acq(),
                c.breakdown(),
                sub
            )
        }),
        c16.map(|c| {
            let sub = c.top_per_acq("subscribe") + c.top_per_acq("unsubscribe");
            // At the two decimals reported: a window's edges cut a few
            // acquisition cycles in two.
            (steady_per_acq(c) * 100.0).round() <= 300.0 && sub < 0.05
        }),
    );
    row(
        "Redis mutex, 16 processes: handoff share / max wait".into(),
        "≥ 0.5 / ≤ 10× median wait",
        c16.map_or("-".into(), |c| {
            let w = c.waits(None);
            format!(
                "{:.2} / {} ms = {:.1}× the median {} ms",
                c.handoff_share(),
                ms(w.last().copied().unwrap_or(0)),
                w.last().copied().unwrap_or(0) as f64 / pct(&w, 500).max(1) as f64,
                ms(pct(&w, 500))
            )
        }),
        c16.map(|c| {
            let w = c.waits(None);
            c.handoff_share() >= 0.5 && w.last().copied().unwrap_or(0) <= 10 * pct(&w, 500)
        }),
    );
    let f16 = find(cells, "redis-fair", 16);
    row(
        "Redis fair mutex, 16 processes".into(),
        "handoff share ≥ 0.95, one wake-up per handoff",
        f16.map_or("-".into(), |c| {
            let handoffs = (c.handoff_share() * c.acqs.len().saturating_sub(1) as f64).max(1.0);
            format!(
                "{:.2}; {:.2} wake-ups per handoff, PUBLISH {:.2} per acq.",
                c.handoff_share(),
                c.wakeups.unwrap_or(0) as f64 / handoffs,
                c.per_acq(c.redis_calls.get("publish").copied().unwrap_or(0) as f64)
            )
        }),
        f16.map(|c| {
            let handoffs = (c.handoff_share() * c.acqs.len().saturating_sub(1) as f64).max(1.0);
            c.handoff_share() >= 0.95 && c.wakeups.unwrap_or(0) as f64 / handoffs <= 1.05
        }),
    );
    for n in [4, 16] {
        let m = find(cells, "mixed-redis", n);
        row(
            format!("distlock + redis-py 1 ms on one key, {n} processes"),
            "≥ 20% of acquisitions pass between the sides",
            m.map_or("-".into(), |c| {
                format!(
                    "{:.1}% (distlock {:.0}% of acquisitions)",
                    c.side_switches() * 100.0,
                    c.side_share(0) * 100.0
                )
            }),
            m.map(|c| c.side_switches() >= 0.2),
        );
    }
    for n in [4, 16] {
        let z = find(cells, "zk-fair", n);
        let cur = find(cells, "curator", n);
        let kaz = find(cells, "kazoo", n);
        let rc = z
            .zip(cur)
            .map(|(z, c)| z.throughput() / c.throughput().max(1e-9));
        let rk = z
            .zip(kaz)
            .map(|(z, k)| z.throughput() / k.throughput().max(1e-9));
        row(
            format!("ZooKeeper fair mutex, {n} processes"),
            "≥ 4× Curator, ≥ 2.5× kazoo, handoff share 1.00",
            z.map_or("-".into(), |z| {
                format!(
                    "{:.0} acq/s: {} Curator, {} kazoo; handoff {:.3}",
                    z.throughput(),
                    rc.map_or("-".into(), |r| format!("{r:.2}×")),
                    rk.map_or("-".into(), |r| format!("{r:.2}×")),
                    z.handoff_share()
                )
            }),
            z.map(|z| {
                rc.is_some_and(|r| r >= 4.0)
                    && rk.is_some_and(|r| r >= 2.5)
                    && z.handoff_share() >= 0.995
            }),
        );
    }
    for label in ["redis-mutex", "redis-fair", "zk-fair", "zk-unfair"] {
        let m = mem.iter().find(|m| m.label == label);
        row(
            format!("Memory per waiting contender, {label}"),
            "≤ 1 KiB",
            m.map_or("-".into(), |m| {
                format!(
                    "{:.2} KiB per waiting future ({:.2} KiB heap, {:.2} KiB RSS per waiting task)",
                    m.futures_delta as f64 / m.k.max(1) as f64 / 1024.0,
                    m.heap_delta as f64 / m.k.max(1) as f64 / 1024.0,
                    m.rss_delta as f64 / m.k.max(1) as f64 / 1024.0
                )
            }),
            m.map(|m| m.futures_delta as f64 / m.k.max(1) as f64 <= 1024.0),
        );
    }
    row(
        "Uncontended lock+release".into(),
        "see `--bench ratios`",
        "not measured here".into(),
        None,
    );
    out
}

/// Throughput per implementation (log scale), 4 and 16 processes side by
/// side, the handoff share written at each bar's end.
fn svg(cells: &[Cell]) -> String {
    let labels: Vec<&'static str> = {
        let mut l: Vec<&'static str> = Vec::new();
        for c in cells {
            if !l.contains(&c.label) {
                l.push(c.label);
            }
        }
        l
    };
    let mut procs: Vec<usize> = cells.iter().map(|c| c.procs).collect();
    procs.sort_unstable();
    procs.dedup();
    let (left, right, top, bar, gap) = (130.0, 140.0, 50.0, 12.0, 10.0);
    let width = 760.0;
    let group = bar * procs.len() as f64 + gap;
    let height = top + group * labels.len() as f64 + 50.0;
    let (lo, hi) = (10.0f64, 100_000.0f64);
    let xs = |v: f64| {
        left + (v.clamp(lo, hi).log10() - lo.log10()) / (hi.log10() - lo.log10())
            * (width - left - right)
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        out,
        r#"<rect width="{width}" height="{height}" fill="white"/>"#
    );
    let _ = writeln!(
        out,
        r#"<text x="{}" y="20" text-anchor="middle" font-size="14">Acquisitions/s across OS processes (handoff share at the bar's end)</text>"#,
        width / 2.0
    );
    for (i, tick) in ["10", "100", "1k", "10k", "100k"].iter().enumerate() {
        let x = xs(10f64.powi(i32::try_from(i).unwrap_or(0) + 1));
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" x2="{x:.1}" y1="{}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{tick}</text>"##,
            top - 10.0,
            height - 40.0,
            height - 25.0
        );
    }
    for (g, label) in labels.iter().enumerate() {
        let y0 = top + g as f64 * group;
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{:.1}" text-anchor="end">{label}</text>"#,
            left - 8.0,
            y0 + bar * procs.len() as f64 / 2.0 + 4.0
        );
        for (j, n) in procs.iter().enumerate() {
            let Some(c) = find(cells, label, *n) else {
                continue;
            };
            let color = if c.sides.len() > 1 {
                "#555"
            } else {
                c.sides[0].color()
            };
            let y = y0 + j as f64 * bar;
            let x1 = xs(c.throughput());
            let opacity = if j == 0 { "0.55" } else { "1" };
            let _ = writeln!(
                out,
                r#"<rect x="{left}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{color}" fill-opacity="{opacity}"/><text x="{:.1}" y="{:.1}" font-size="10">{n}p: {:.0}/s, {:.2}</text>"#,
                (x1 - left).max(1.0),
                bar - 2.0,
                x1 + 4.0,
                y + bar - 3.0,
                c.throughput(),
                c.handoff_share()
            );
        }
    }
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{:.1}" text-anchor="middle">acquisitions per second (log); light bar {} processes, dark {}</text>"#,
        width / 2.0,
        height - 8.0,
        procs.first().copied().unwrap_or(0),
        procs.last().copied().unwrap_or(0)
    );
    out.push_str("</svg>\n");
    out
}
