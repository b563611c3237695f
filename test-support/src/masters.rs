//! N independent `redis-server` masters on loopback, for Redlock.

use crate::redis::RedisServer;

/// Independent Redis masters (no replication between them), each a
/// [`RedisServer`] on its own loopback port, without persistence: a
/// [`RedisMasters::restart_empty`] comes back with no data.
#[derive(Debug)]
pub struct RedisMasters {
    nodes: Vec<RedisServer>,
}

impl RedisMasters {
    /// Starts `n` masters.
    ///
    /// # Panics
    ///
    /// As [`RedisServer::start`].
    #[must_use]
    pub fn start(n: usize) -> Self {
        RedisMasters {
            nodes: (0..n).map(|_| RedisServer::start()).collect(),
        }
    }

    /// The number of masters.
    #[must_use]
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// `redis+redlock://127.0.0.1:p1,127.0.0.1:p2,…`.
    #[must_use]
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis+redlock://{}", hosts.join(","))
    }

    /// `redis://127.0.0.1:<port>` of each master.
    #[must_use]
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Master `i`.
    #[must_use]
    pub fn node(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }

    /// Master `i`, to kill or restart it.
    pub fn node_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.nodes[i]
    }

    /// Restarts master `i` on its port with no data (the masters run
    /// without persistence: no RDB, no AOF), killing it first if it runs.
    ///
    /// # Panics
    ///
    /// As [`RedisServer::restart`], and when the master is configured to
    /// persist anything.
    pub fn restart_empty(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        node.kill();
        node.restart();
        assert_eq!(
            node.cli(&["CONFIG", "GET", "appendonly"]),
            "appendonly\nno",
            "master {i} has an AOF"
        );
        assert_eq!(
            node.cli(&["CONFIG", "GET", "save"]),
            "save",
            "master {i} saves snapshots"
        );
    }

    /// Runs `redis-cli` on every master; one output per master.
    #[must_use]
    pub fn cli_all(&self, args: &[&str]) -> Vec<String> {
        self.nodes.iter().map(|n| n.cli(args)).collect()
    }
}
