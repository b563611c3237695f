//! A Redis Sentinel group on loopback: one master, its replicas and three
//! Sentinels, each a `redis-server` process of its own (Sentinels run as
//! `redis-server <dir>/sentinel.conf --sentinel`, each in its own temp dir
//! because Sentinel rewrites its config file).
//!
//! # Holding replication back (the failover experiment)
//!
//! Pausing a replica alone does **not** hold replication back: what the
//! master sends while the replica is stopped waits in the replica's socket
//! buffer and is applied when it resumes, even after the master died. The
//! sequence that works, and that Sentinel reliably turns into a promotion:
//!
//! 1. [`SentinelGroup::wait_replicas_in_sync`] (the replica has everything
//!    written so far);
//! 2. [`SentinelGroup::hold_back_replication`]`(i)`: pauses replica `i`
//!    (SIGSTOP) and has the master drop its replication link
//!    (`CLIENT KILL TYPE replica`), so writes from now on reach the master
//!    only (the stopped replica cannot reconnect);
//! 3. write on the master (the acquisition that must be lost);
//! 4. kill the master ([`RedisServer::kill`] on
//!    [`SentinelGroup::server_mut`]`(master index)`);
//! 5. [`SentinelGroup::resume`]`(i)` **at once**: Sentinel promotes only a
//!    replica it can reach. A replica silent for longer than
//!    `down-after-milliseconds` is itself marked down and never chosen, so
//!    steps 2–5 must take well under [`DOWN_AFTER`] (3 s; the
//!    group is started with `replica-priority 100` and no
//!    `min-replicas-to-write`, so nothing else stops the promotion);
//! 6. [`SentinelGroup::wait_for_failover`]`(old master port, deadline)`.
//!
//! The promoted replica then lacks the write of step 3.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::redis::RedisServer;
use crate::server::{ask, free_port, loopback, require_binary, state_dir, Proc};

/// The Sentinels' `down-after-milliseconds`.
///
/// 3 s, not 1 s: under a load of 10 on 2 cores a freshly promoted master
/// went unanswered for over 1 s while the old master restarted, the
/// Sentinels judged the new master down as well and failed over a second
/// time, to the restarted (empty) old master, which then never became a
/// replica (seen in full runs: the demotion wait ran out with the old
/// master still master).
pub const DOWN_AFTER: Duration = Duration::from_millis(3000);

/// One Sentinel process.
#[derive(Debug)]
pub struct SentinelNode {
    port: u16,
    dir: TempDir,
    conf: String,
    proc: Proc,
}

impl SentinelNode {
    fn start(name: &str, master_port: u16) -> SentinelNode {
        // In memory (a Sentinel whose config fsync stalls 2 s behind a busy
        // disk enters TILT mode for 30 s and fails nothing over: seen in a
        // full run).
        let mut dir = state_dir("distlock-sentinel-");
        let mut last_log = String::new();
        for _ in 0..5 {
            let port = free_port();
            let conf = format!(
                "port {port}\n\
                 bind 127.0.0.1\n\
                 protected-mode no\n\
                 daemonize no\n\
                 dir {dir}\n\
                 sentinel resolve-hostnames no\n\
                 sentinel monitor {name} 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds {name} {down}\n\
                 sentinel failover-timeout {name} 3000\n\
                 sentinel parallel-syncs {name} 1\n",
                dir = dir.path().display(),
                down = DOWN_AFTER.as_millis(),
            );
            let mut node = SentinelNode {
                port,
                dir,
                conf,
                proc: Proc::default(),
            };
            node.spawn();
            if node.wait_ready() {
                return node;
            }
            last_log = node.log();
            node.proc.kill();
            dir = node.dir;
        }
        panic!("redis-server --sentinel did not start; last log:\n{last_log}");
    }

    fn conf_path(&self) -> PathBuf {
        self.dir.path().join("sentinel.conf")
    }

    fn spawn(&mut self) {
        std::fs::write(self.conf_path(), &self.conf).expect("write sentinel.conf");
        let mut cmd = Command::new(require_binary("redis-server"));
        cmd.arg(self.conf_path()).arg("--sentinel");
        self.proc =
            Proc::spawn(cmd, &self.dir.path().join("sentinel.log")).expect("spawn sentinel");
    }

    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if !self.proc.alive() {
                return false;
            }
            if ask(loopback(self.port), b"PING\r\n", true).is_some_and(|a| a.starts_with("+PONG")) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sentinel.log")).unwrap_or_default()
    }

    /// The Sentinel's port.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the Sentinel (SIGKILL).
    pub fn kill(&mut self) {
        self.proc.kill();
    }

    /// Freezes the Sentinel (SIGSTOP).
    pub fn pause(&self) {
        self.proc.signal(libc::SIGSTOP);
    }

    /// Thaws a paused Sentinel (SIGCONT).
    pub fn resume(&self) {
        self.proc.signal(libc::SIGCONT);
    }

    /// Starts a killed Sentinel again on its port, with the config it had
    /// rewritten (it remembers the master, replicas and other Sentinels).
    pub fn restart(&mut self) {
        self.proc.kill();
        if let Ok(conf) = std::fs::read_to_string(self.conf_path()) {
            self.conf = conf;
        }
        for _ in 0..50 {
            self.spawn();
            if self.wait_ready() {
                return;
            }
            self.proc.kill();
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "sentinel did not restart on port {}:\n{}",
            self.port,
            self.log()
        );
    }

    /// Runs one command through `redis-cli` against this Sentinel.
    #[must_use]
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, args)
    }
}

fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new(require_binary("redis-cli"))
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli runs");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// `field\nvalue\n…` (redis-cli's rendering of a flat map) as pairs.
fn pairs(text: &str) -> Vec<(String, String)> {
    let lines: Vec<&str> = text.lines().collect();
    lines
        .chunks(2)
        .filter(|c| c.len() == 2)
        .map(|c| (c[0].to_owned(), c[1].to_owned()))
        .collect()
}

fn field(text: &str, key: &str) -> Option<String> {
    pairs(text)
        .into_iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
}

/// `key:value` lines of `INFO`.
fn info_field(info: &str, key: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map(|v| v.trim().to_owned())
}

/// A master, its replicas and three Sentinels monitoring them, on loopback.
/// Servers are known by index (0 is the first master) and by role, as the
/// Sentinels currently see it.
#[derive(Debug)]
pub struct SentinelGroup {
    name: String,
    servers: Vec<RedisServer>,
    sentinels: Vec<SentinelNode>,
}

impl SentinelGroup {
    /// Starts a master with `replicas` replicas and three Sentinels (quorum
    /// 2), and waits until every Sentinel sees the master, every replica and
    /// the two other Sentinels.
    ///
    /// # Panics
    ///
    /// When a process does not start or the group does not form in 30 s.
    #[must_use]
    pub fn start(replicas: usize) -> Self {
        let name = format!("m{:08x}", fastrand::u32(..));
        let master = RedisServer::start_with(&["--replica-priority", "100"]);
        let mport = master.port().to_string();
        let mut servers = vec![master];
        for _ in 0..replicas {
            servers.push(RedisServer::start_with(&[
                "--replicaof",
                "127.0.0.1",
                &mport,
                "--replica-priority",
                "100",
            ]));
        }
        let sentinels = (0..3)
            .map(|_| SentinelNode::start(&name, servers[0].port()))
            .collect();
        let group = SentinelGroup {
            name,
            servers,
            sentinels,
        };
        group.wait_formed(Duration::from_secs(30));
        group
    }

    fn wait_formed(&self, limit: Duration) {
        let replicas = (self.servers.len() - 1).to_string();
        let deadline = Instant::now() + limit;
        loop {
            let formed = self.sentinels.iter().all(|s| {
                let m = s.cli(&["SENTINEL", "MASTER", &self.name]);
                field(&m, "num-slaves").as_deref() == Some(replicas.as_str())
                    && field(&m, "num-other-sentinels").as_deref() == Some("2")
                    && field(&m, "flags").as_deref() == Some("master")
            }) && self.servers[1..].iter().all(|r| {
                info_field(&r.cli(&["INFO", "replication"]), "master_link_status").as_deref()
                    == Some("up")
            });
            if formed {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the Sentinel group did not form: {:?}",
                self.sentinels
                    .iter()
                    .map(|s| s.cli(&["SENTINEL", "MASTER", &self.name]))
                    .collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The master name the Sentinels monitor.
    #[must_use]
    pub fn master_name(&self) -> &str {
        &self.name
    }

    /// `redis+sentinel://127.0.0.1:s1,127.0.0.1:s2,127.0.0.1:s3/<name>`.
    #[must_use]
    pub fn url(&self) -> String {
        format!(
            "redis+sentinel://{}/{}",
            self.sentinel_addrs().join(","),
            self.name
        )
    }

    /// `127.0.0.1:<port>` of every Sentinel.
    #[must_use]
    pub fn sentinel_addrs(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect()
    }

    /// The master's port as the first Sentinel that answers says
    /// (`SENTINEL get-master-addr-by-name`).
    ///
    /// # Panics
    ///
    /// When no Sentinel answers.
    #[must_use]
    pub fn master_port(&self) -> u16 {
        self.sentinels
            .iter()
            .find_map(|s| {
                let answer = s.cli(&["SENTINEL", "get-master-addr-by-name", &self.name]);
                answer.lines().nth(1)?.trim().parse().ok()
            })
            .expect("no Sentinel names the master")
    }

    /// The index of the server on `port`.
    ///
    /// # Panics
    ///
    /// When no server of the group listens there.
    #[must_use]
    pub fn index_of(&self, port: u16) -> usize {
        self.servers
            .iter()
            .position(|s| s.port() == port)
            .expect("a server of the group")
    }

    /// The index of the current master (as the Sentinels say).
    #[must_use]
    pub fn master_index(&self) -> usize {
        self.index_of(self.master_port())
    }

    /// The current master (as the Sentinels say).
    #[must_use]
    pub fn master(&self) -> &RedisServer {
        &self.servers[self.master_index()]
    }

    /// The index of the `i`-th server that is not the current master.
    #[must_use]
    pub fn replica_index(&self, i: usize) -> usize {
        let master = self.master_index();
        (0..self.servers.len())
            .filter(|&j| j != master)
            .nth(i)
            .expect("no such replica")
    }

    /// The `i`-th server that is not the current master.
    #[must_use]
    pub fn replica(&self, i: usize) -> &RedisServer {
        &self.servers[self.replica_index(i)]
    }

    /// Server `i` by index (0 was the first master).
    #[must_use]
    pub fn server(&self, i: usize) -> &RedisServer {
        &self.servers[i]
    }

    /// Server `i`, to kill or restart it.
    pub fn server_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.servers[i]
    }

    /// Number of Redis servers (master and replicas).
    #[must_use]
    pub fn servers(&self) -> usize {
        self.servers.len()
    }

    /// Sentinel `i` (0..3).
    #[must_use]
    pub fn sentinel(&self, i: usize) -> &SentinelNode {
        &self.sentinels[i]
    }

    /// Sentinel `i`, to kill or restart it.
    pub fn sentinel_mut(&mut self, i: usize) -> &mut SentinelNode {
        &mut self.sentinels[i]
    }

    /// The role server `i` reports (`master`, `slave`), or `""` when it
    /// does not answer.
    #[must_use]
    pub fn role(&self, i: usize) -> String {
        self.servers[i]
            .cli(&["ROLE"])
            .lines()
            .next()
            .unwrap_or("")
            .to_owned()
    }

    /// Waits until the Sentinels name a master other than `old_master_port`
    /// (every Sentinel that answers agrees, at least two answer) and that
    /// server reports itself master; returns its port.
    ///
    /// # Panics
    ///
    /// When that does not happen within `deadline`.
    #[must_use]
    pub fn wait_for_failover(&self, old_master_port: u16, deadline: Duration) -> u16 {
        let until = Instant::now() + deadline;
        loop {
            let named = self.named_masters();
            if named.len() >= 2 && named.iter().all(|&p| p == named[0] && p != old_master_port) {
                let port = named[0];
                if cli(port, &["ROLE"]).lines().next() == Some("master") {
                    return port;
                }
            }
            if Instant::now() >= until {
                panic!(
                    "no failover away from port {old_master_port} within {deadline:?}; Sentinels name {named:?}\n{}",
                    self.sentinel_logs()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The master port each Sentinel that answers names.
    fn named_masters(&self) -> Vec<u16> {
        self.sentinels
            .iter()
            .filter_map(|s| {
                let answer = s.cli(&["SENTINEL", "get-master-addr-by-name", &self.name]);
                answer.lines().nth(1)?.trim().parse().ok()
            })
            .collect()
    }

    /// Waits until server `i` reports `role` (`master` or `slave`).
    ///
    /// # Panics
    ///
    /// When it does not within `deadline`.
    pub fn wait_role(&self, i: usize, role: &str, deadline: Duration) {
        let until = Instant::now() + deadline;
        let port = self.servers[i].port();
        while self.role(i) != role {
            // Waiting for a demotion while the Sentinels have made this very
            // server master again (a second failover) can only run out:
            // say so at once, with the Sentinels' account.
            let named = self.named_masters();
            assert!(
                !(role == "slave" && named.len() >= 2 && named.iter().all(|&p| p == port)),
                "server {i} (port {port}) was waited on to become a replica, but the Sentinels failed over to it again\n{}",
                self.sentinel_logs()
            );
            assert!(
                Instant::now() < until,
                "server {i} is {:?}, not {role}, after {deadline:?}\n{}",
                self.role(i),
                self.sentinel_logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The last 40 lines of every Sentinel's log, for a failure message:
    /// what the Sentinels did (a vote, a TILT, a conversion) is the only
    /// account of why a failover or a demotion did not come.
    fn sentinel_logs(&self) -> String {
        self.sentinels
            .iter()
            .map(|s| {
                let log = s.log();
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                format!("--- Sentinel {}:\n{}", s.port, tail.join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits until every running replica of the current master has
    /// processed everything the master wrote (each replica's
    /// `slave_repl_offset` is at or past the master's `master_repl_offset`
    /// read just before), and each has its link to the master up.
    ///
    /// # Panics
    ///
    /// When they are not in sync within 30 s.
    pub fn wait_replicas_in_sync(&self) {
        let master = self.master_index();
        let until = Instant::now() + Duration::from_secs(30);
        let number = |v: Option<String>| v.and_then(|v| v.parse::<u64>().ok());
        loop {
            // Read first: a replica at or past it has everything written so
            // far (the master keeps writing: Sentinel's hello messages).
            let offset = number(info_field(
                &self.servers[master].cli(&["INFO", "replication"]),
                "master_repl_offset",
            ));
            let synced = offset.is_some()
                && (0..self.servers.len()).filter(|&j| j != master).all(|j| {
                    let info = self.servers[j].cli(&["INFO", "replication"]);
                    info_field(&info, "master_link_status").as_deref() == Some("up")
                        && number(info_field(&info, "slave_repl_offset")) >= offset
                });
            if synced {
                return;
            }
            assert!(
                Instant::now() < until,
                "replicas not in sync with the master (offset {offset:?})"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Holds replication to server `i` (a replica) back: pauses it
    /// (SIGSTOP) and has the master drop its replication links, so what is
    /// written from now on reaches the master only. Resume it with
    /// [`SentinelGroup::resume`] within [`DOWN_AFTER`] if Sentinel must be
    /// able to promote it (see the module docs for the whole sequence).
    pub fn hold_back_replication(&self, i: usize) {
        let master = self.master_index();
        assert_ne!(i, master, "server {i} is the master");
        self.servers[i].pause();
        let killed = self.servers[master].cli(&["CLIENT", "KILL", "TYPE", "replica"]);
        assert!(
            killed.parse::<u32>().is_ok_and(|n| n >= 1),
            "the master dropped no replication link: {killed:?}"
        );
    }

    /// Pauses server `i` (SIGSTOP).
    pub fn pause(&self, i: usize) {
        self.servers[i].pause();
    }

    /// Resumes server `i` (SIGCONT).
    pub fn resume(&self, i: usize) {
        self.servers[i].resume();
    }
}
