//! ZooKeeper from Debian's `zookeeper` package, run as
//! `java … org.apache.zookeeper.server.quorum.QuorumPeerMain zoo.cfg`:
//! standalone or a 3-node ensemble, on free loopback ports, in temp dirs,
//! killed on drop.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;

use crate::server::{ask, free_port, loopback, require_binary, require_file, wait_until, Proc};

/// Where Debian's package puts the server jar and the logging binding; the
/// jar's manifest names the rest of its class path.
const ZK_JAR: &str = "/usr/share/java/zookeeper.jar";
const SLF4J_SIMPLE_JAR: &str = "/usr/share/java/slf4j-simple.jar";
/// Netty's codec and resolver, which the TLS (Netty) connection factory needs
/// and the server jar's manifest does not name.
const NETTY_JARS: &str = "/usr/share/java/netty-codec.jar:/usr/share/java/netty-resolver.jar";

/// The server's tick: session timeouts may be 2 to 300 ticks (0.4 s to 60 s).
pub const TICK: Duration = Duration::from_millis(200);

#[derive(Debug)]
struct Node {
    id: usize,
    client_port: u16,
    dir: PathBuf,
    proc: Proc,
}

/// A ZooKeeper standalone server or ensemble on 127.0.0.1.
#[derive(Debug)]
pub struct ZkCluster {
    nodes: Vec<Node>,
    _root: TempDir,
}

/// The mode a node reports (`srvr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZkMode {
    /// A single server.
    Standalone,
    /// The ensemble's leader.
    Leader,
    /// A follower.
    Follower,
}

impl ZkCluster {
    /// Starts a standalone server and waits until it serves.
    ///
    /// # Panics
    ///
    /// When Java or the `zookeeper` package is missing (naming
    /// `scripts/install-servers.sh`), or the server does not serve in 60 s.
    #[must_use]
    pub fn standalone() -> Self {
        Self::start(1)
    }

    /// Starts an ensemble of `n` nodes (1 is standalone) and waits until
    /// every node serves.
    ///
    /// # Panics
    ///
    /// As [`ZkCluster::standalone`].
    #[must_use]
    pub fn start(n: usize) -> Self {
        Self::start_with(n, "")
    }

    /// A standalone server that also serves TLS on the returned port, with
    /// the server certificate of `ca` (clients need not present one).
    ///
    /// # Panics
    ///
    /// As [`ZkCluster::standalone`].
    #[must_use]
    pub fn standalone_tls(ca: &crate::tls::TestCa) -> (Self, u16) {
        let keystore = ca.dir().join("server-keystore.pem");
        let mut pem = std::fs::read(ca.server_key()).expect("server key");
        pem.extend(std::fs::read(ca.server_cert()).expect("server cert"));
        std::fs::write(&keystore, pem).expect("write keystore");
        let port = free_port();
        let extra = format!(
            "secureClientPort={port}\nsecureClientPortAddress=127.0.0.1\n\
             serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
             ssl.keyStore.location={}\nssl.keyStore.type=PEM\n\
             ssl.trustStore.location={}\nssl.trustStore.type=PEM\n\
             ssl.clientAuth=none\nssl.hostnameVerification=false\n",
            keystore.display(),
            ca.ca_cert().display(),
        );
        let cluster = Self::start_with(1, &extra);
        // The secure port opens after the plain one the start waited for
        // (seen refused under load); a connection accepted there is ready.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "ZooKeeper's secure client port {port} never opened"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        (cluster, port)
    }

    /// Starts `n` nodes with `extra` lines appended to each `zoo.cfg`.
    ///
    /// # Panics
    ///
    /// As [`ZkCluster::standalone`].
    #[must_use]
    pub fn start_with(n: usize, extra: &str) -> Self {
        assert!(n >= 1, "an ensemble has at least one node");
        require_binary("java");
        require_file(Path::new(ZK_JAR), "ZooKeeper's server jar");
        require_file(Path::new(SLF4J_SIMPLE_JAR), "slf4j-simple.jar");
        let root = tempfile::Builder::new()
            .prefix("distlock-zk-")
            .tempdir()
            .expect("temp dir");
        let mut last_error = String::new();
        for _ in 0..3 {
            let ports: Vec<(u16, u16, u16)> = (0..n)
                .map(|_| (free_port(), free_port(), free_port()))
                .collect();
            let mut servers = String::new();
            if n > 1 {
                for (i, (_, peer, election)) in ports.iter().enumerate() {
                    let _ = writeln!(servers, "server.{}=127.0.0.1:{peer}:{election}", i + 1);
                }
            }
            let mut nodes = Vec::new();
            for (i, (client_port, _, _)) in ports.iter().enumerate() {
                let dir = root.path().join(format!("node{}-{client_port}", i + 1));
                std::fs::create_dir_all(dir.join("data")).expect("data dir");
                std::fs::write(dir.join("data/myid"), format!("{}\n", i + 1)).expect("myid");
                let cfg = format!(
                    "tickTime={tick}\ninitLimit=50\nsyncLimit=25\n\
                     dataDir={data}\nclientPort={client_port}\nclientPortAddress=127.0.0.1\n\
                     maxClientCnxns=0\nminSessionTimeout={min}\nmaxSessionTimeout=60000\n\
                     forceSync=no\nadmin.enableServer=false\n4lw.commands.whitelist=*\n\
                     quorumListenOnAllIPs=false\nstandaloneEnabled=true\n{servers}{extra}",
                    tick = TICK.as_millis(),
                    data = dir.join("data").display(),
                    min = 2 * TICK.as_millis(),
                );
                std::fs::write(dir.join("zoo.cfg"), cfg).expect("zoo.cfg");
                let mut node = Node {
                    id: i + 1,
                    client_port: *client_port,
                    dir,
                    proc: Proc::default(),
                };
                node.spawn();
                nodes.push(node);
            }
            if wait_serving(&mut nodes, true, Duration::from_secs(60)) {
                return ZkCluster { nodes, _root: root };
            }
            last_error = logs(&nodes);
            // Most likely a port taken between probing and binding: retry.
        }
        panic!("ZooKeeper ({n} node(s)) did not serve in 60 s, 3 tries; logs:\n{last_error}");
    }

    /// The connect string: `127.0.0.1:p1,127.0.0.1:p2,…`.
    #[must_use]
    pub fn connect_string(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.client_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The client address of node `i` (0-based).
    #[must_use]
    pub fn addr(&self, i: usize) -> SocketAddr {
        loopback(self.nodes[i].client_port)
    }

    /// How many nodes the cluster has.
    #[must_use]
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Always false: a cluster has at least one node.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// What node `i` says it is, if it serves.
    #[must_use]
    pub fn mode(&self, i: usize) -> Option<ZkMode> {
        let answer = ask(self.addr(i), b"srvr", false)?;
        let mode = answer.lines().find_map(|l| l.strip_prefix("Mode: "))?;
        match mode.trim() {
            "standalone" => Some(ZkMode::Standalone),
            "leader" => Some(ZkMode::Leader),
            "follower" => Some(ZkMode::Follower),
            _ => None,
        }
    }

    /// The index of the node that leads (or the standalone one).
    #[must_use]
    pub fn leader(&self) -> Option<usize> {
        (0..self.nodes.len())
            .find(|&i| matches!(self.mode(i), Some(ZkMode::Leader | ZkMode::Standalone)))
    }

    /// Kills node `i` at once (SIGKILL).
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].proc.kill();
    }

    /// The process id of node `i` while it runs (benches read its CPU time).
    #[must_use]
    pub fn pid(&self, i: usize) -> Option<i32> {
        self.nodes[i].proc.pid()
    }

    /// Freezes node `i` (SIGSTOP).
    pub fn pause(&self, i: usize) {
        self.nodes[i].proc.signal(libc::SIGSTOP);
    }

    /// Thaws node `i` (SIGCONT).
    pub fn resume(&self, i: usize) {
        self.nodes[i].proc.signal(libc::SIGCONT);
    }

    /// Restarts node `i` (killing it first if it runs) and waits until the
    /// whole cluster serves again.
    ///
    /// # Panics
    ///
    /// When it does not serve again within 60 s.
    pub fn restart(&mut self, i: usize) {
        self.nodes[i].proc.kill();
        self.nodes[i].spawn();
        assert!(
            self.wait_serving(Duration::from_secs(60)),
            "ZooKeeper node {} did not come back:\n{}",
            self.nodes[i].id,
            self.logs()
        );
    }

    /// Waits until every running node serves (has a mode); `false` on timeout.
    pub fn wait_serving(&mut self, limit: Duration) -> bool {
        wait_serving(&mut self.nodes, false, limit)
    }

    fn logs(&self) -> String {
        logs(&self.nodes)
    }
}

/// Waits until every running node serves; with `all`, every node must run.
fn wait_serving(nodes: &mut [Node], all: bool, limit: Duration) -> bool {
    wait_until(limit, || {
        nodes.iter_mut().all(|node| {
            let addr = loopback(node.client_port);
            if !node.proc.alive() {
                return !all;
            }
            ask(addr, b"srvr", false).is_some_and(|a| a.contains("Mode: "))
        })
    })
}

fn logs(nodes: &[Node]) -> String {
    nodes
        .iter()
        .map(|n| {
            let log = std::fs::read_to_string(n.dir.join("zk.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            format!("--- node {} ---\n{}", n.id, tail.join("\n"))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

impl Node {
    fn spawn(&mut self) {
        let mut cmd = Command::new("java");
        cmd.args([
            "-Xms16m",
            "-Xmx128m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
        ])
        .arg("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
        .arg("-Dzookeeper.admin.enableServer=false")
        .arg("-Djava.net.preferIPv4Stack=true")
        .arg("-cp")
        .arg(format!("{ZK_JAR}:{SLF4J_SIMPLE_JAR}:{NETTY_JARS}"))
        .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
        .arg(self.dir.join("zoo.cfg"));
        self.proc = Proc::spawn(cmd, &self.dir.join("zk.log")).expect("spawn java for ZooKeeper");
    }
}

/// One standalone ZooKeeper shared by every test of a test binary (killed
/// when the binary exits). Tests sharing it use
/// [`unique_name`](crate::unique_name) prefixes.
#[must_use]
pub fn shared() -> &'static ZkCluster {
    static SERVER: std::sync::OnceLock<ZkCluster> = std::sync::OnceLock::new();
    SERVER.get_or_init(ZkCluster::standalone)
}
