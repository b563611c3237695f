//! `redis-server` on a free loopback port, in a temp dir, killed on drop.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;

use crate::server::{ask, free_port, loopback, require_binary, state_dir, Proc};

/// A `redis-server` on 127.0.0.1, without persistence unless asked.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: TempDir,
    binary: PathBuf,
    extra: Vec<String>,
    proc: Proc,
}

impl RedisServer {
    /// Starts a server and waits until it answers `PING`.
    ///
    /// # Panics
    ///
    /// When `redis-server` is not installed (naming
    /// `scripts/install-servers.sh`) or does not start within 10 s.
    #[must_use]
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments
    /// (`["--appendonly", "yes"]`, ...).
    ///
    /// # Panics
    ///
    /// As [`RedisServer::start`].
    #[must_use]
    pub fn start_with(extra: &[&str]) -> Self {
        let binary = require_binary("redis-server");
        let dir = state_dir("distlock-redis-");
        let mut server = RedisServer {
            port: 0,
            dir,
            binary,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            proc: Proc::default(),
        };
        let mut last_log = String::new();
        for _ in 0..5 {
            server.port = free_port();
            server.proc = spawn(&server.binary, &server.dir, server.port, &server.extra);
            if server.wait_ready() {
                return server;
            }
            last_log = server.log();
            server.proc.kill();
        }
        panic!("redis-server did not start on 127.0.0.1; last log:\n{last_log}");
    }

    /// The server's address.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        loopback(self.port)
    }

    /// The server's port.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server at once (SIGKILL), as a crash.
    pub fn kill(&mut self) {
        self.proc.kill();
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        self.proc.signal(libc::SIGSTOP);
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) {
        self.proc.signal(libc::SIGCONT);
    }

    /// Starts the server again on the same port and data dir (after
    /// [`RedisServer::kill`], or kills it first), and waits until it answers.
    ///
    /// # Panics
    ///
    /// When it does not come back within 10 s.
    pub fn restart(&mut self) {
        self.proc.kill();
        for _ in 0..50 {
            self.proc = spawn(&self.binary, &self.dir, self.port, &self.extra);
            if self.wait_ready() {
                return;
            }
            // The old socket may linger for a moment.
            self.proc.kill();
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "redis-server did not restart on port {}:\n{}",
            self.port,
            self.log()
        );
    }

    /// Whether the server process is running (it may be paused).
    pub fn is_running(&mut self) -> bool {
        self.proc.alive()
    }

    /// Runs one command through `redis-cli` and returns its output.
    ///
    /// # Panics
    ///
    /// When `redis-cli` is missing or cannot run.
    #[must_use]
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new(require_binary("redis-cli"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli runs");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    fn wait_ready(&mut self) -> bool {
        let addr = self.addr();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if !self.proc.alive() {
                return false;
            }
            // A server with a password answers NOAUTH: it is up all the same.
            let answer = ask(addr, b"PING\r\n", true);
            if answer.is_some_and(|a| a.starts_with("+PONG") || a.starts_with("-NOAUTH")) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }
}

fn spawn(binary: &PathBuf, dir: &TempDir, port: u16, extra: &[String]) -> Proc {
    let mut cmd = Command::new(binary);
    cmd.args(["--port", &port.to_string()])
        .args(["--bind", "127.0.0.1"])
        .args(["--protected-mode", "no"])
        .args(["--save", ""])
        .args(["--appendonly", "no"])
        .args(["--daemonize", "no"])
        .arg("--dir")
        .arg(dir.path())
        .args(extra);
    Proc::spawn(cmd, &dir.path().join("redis.log")).expect("spawn redis-server")
}

/// One `redis-server` shared by every test of a test binary (killed when the
/// binary exits). Tests sharing it use [`unique_name`](crate::unique_name)
/// prefixes.
#[must_use]
pub fn shared() -> &'static RedisServer {
    static SERVER: std::sync::OnceLock<RedisServer> = std::sync::OnceLock::new();
    SERVER.get_or_init(RedisServer::start)
}

/// A Redis Cluster of `redis-server --cluster-enabled yes` masters on
/// loopback ports, slots assigned by `redis-cli --cluster create`.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `masters` nodes (at least 3), creates the cluster and waits
    /// until every node reports `cluster_state:ok`.
    ///
    /// # Panics
    ///
    /// When a server does not start or the cluster does not form in 30 s.
    #[must_use]
    pub fn start(masters: usize) -> Self {
        Self::start_with_replicas(masters, 0)
    }

    /// Starts `masters` masters (at least 3) with `replicas` replicas each,
    /// as [`RedisCluster::start`], and also waits until every replica has
    /// caught up with its master.
    ///
    /// # Panics
    ///
    /// As [`RedisCluster::start`].
    #[must_use]
    pub fn start_with_replicas(masters: usize, replicas: usize) -> Self {
        assert!(masters >= 3, "a Redis Cluster needs at least 3 masters");
        let nodes: Vec<RedisServer> = (0..masters * (1 + replicas))
            .map(|_| {
                let bus = free_port().to_string();
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                    "--cluster-port",
                    &bus,
                ])
            })
            .collect();
        let mut args: Vec<String> = vec!["--cluster".into(), "create".into()];
        args.extend(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())));
        args.extend([
            "--cluster-replicas".into(),
            replicas.to_string(),
            "--cluster-yes".into(),
        ]);
        let out = Command::new(require_binary("redis-cli"))
            .args(&args)
            .output()
            .expect("redis-cli --cluster create runs");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = RedisCluster { nodes };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !cluster.nodes.iter().all(|n| {
            n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok")
                && (!n.cli(&["ROLE"]).starts_with("slave")
                    || n.cli(&["INFO", "replication"])
                        .contains("master_link_status:up"))
        }) {
            assert!(
                std::time::Instant::now() < deadline,
                "Redis Cluster did not reach cluster_state:ok with its replicas in sync"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        cluster
    }

    /// The node that is master of `key`'s slot, and the nodes replicating it
    /// (indices into the cluster's nodes).
    ///
    /// # Panics
    ///
    /// When `CLUSTER NODES` cannot be read or names no master for the slot.
    #[must_use]
    pub fn shard_of(&self, key: &str) -> (usize, Vec<usize>) {
        let slot: u16 = self.nodes[0]
            .cli(&["CLUSTER", "KEYSLOT", key])
            .parse()
            .expect("CLUSTER KEYSLOT answers a number");
        let table = self.nodes[0].cli(&["CLUSTER", "NODES"]);
        let index_of = |addr: &str| {
            let port: u16 = addr
                .split('@')
                .next()
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse().ok())
                .expect("a node address with a port");
            self.nodes
                .iter()
                .position(|n| n.port() == port)
                .expect("a node of this cluster")
        };
        let mut master = None;
        for line in table.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 || !fields[2].contains("master") {
                continue;
            }
            let serves = fields[8..].iter().any(|range| {
                let mut ends = range.splitn(2, '-').map(|p| p.parse::<u16>().ok());
                match (ends.next().flatten(), ends.next().flatten()) {
                    (Some(a), Some(b)) => (a..=b).contains(&slot),
                    (Some(a), None) => a == slot,
                    _ => false,
                }
            });
            if serves {
                master = Some((fields[0].to_owned(), index_of(fields[1])));
            }
        }
        let (id, master) = master.expect("a master serves the slot");
        let replicas = table
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .filter(|f| f.len() > 3 && f[3] == id)
            .map(|f| index_of(f[1]))
            .collect();
        (master, replicas)
    }

    /// `redis://127.0.0.1:<port>` of every node.
    #[must_use]
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Node `i`.
    #[must_use]
    pub fn node(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }

    /// Runs a command through `redis-cli -c` (following redirections).
    #[must_use]
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new(require_binary("redis-cli"))
            .args([
                "-c",
                "-h",
                "127.0.0.1",
                "-p",
                &self.nodes[0].port().to_string(),
            ])
            .args(args)
            .output()
            .expect("redis-cli runs");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}
