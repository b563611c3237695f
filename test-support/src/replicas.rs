//! A Redis master with replicas (`--replicaof`), on loopback ports, for the
//! replica-acknowledgement (`WAIT`) tests.

use std::time::{Duration, Instant};

use crate::redis::RedisServer;

/// A master and its replicas, each a [`RedisServer`] on 127.0.0.1.
#[derive(Debug)]
pub struct Replicated {
    master: RedisServer,
    replicas: Vec<RedisServer>,
}

impl Replicated {
    /// Starts a master and `replicas` replicas of it, and waits until every
    /// replica is connected and has caught up.
    ///
    /// # Panics
    ///
    /// When a server does not start, or replication does not settle in 20 s.
    #[must_use]
    pub fn start(replicas: usize) -> Self {
        let master = RedisServer::start();
        let port = master.port().to_string();
        let replicas = (0..replicas)
            .map(|_| RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]))
            .collect();
        let set = Replicated { master, replicas };
        set.wait_in_sync();
        set
    }

    /// The master.
    #[must_use]
    pub fn master(&self) -> &RedisServer {
        &self.master
    }

    /// Replica `i`.
    #[must_use]
    pub fn replica(&self, i: usize) -> &RedisServer {
        &self.replicas[i]
    }

    /// Replica `i`, to kill or restart.
    pub fn replica_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.replicas[i]
    }

    /// Waits until the master sees every replica online and each has
    /// acknowledged the master's current replication offset.
    ///
    /// # Panics
    ///
    /// When that does not happen within 20 s.
    pub fn wait_in_sync(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let info = self.master.cli(&["INFO", "replication"]);
            let field = |name: &str| {
                info.lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(|v| v.trim().to_owned())
            };
            let offset = field("master_repl_offset:").and_then(|v| v.parse::<i64>().ok());
            let online: Vec<i64> = info
                .lines()
                .filter(|l| l.starts_with("slave") && l.contains("state=online"))
                .filter_map(|l| {
                    l.split(',')
                        .find_map(|kv| kv.strip_prefix("offset="))
                        .and_then(|v| v.parse().ok())
                })
                .collect();
            if online.len() == self.replicas.len()
                && offset.is_some_and(|o| online.iter().all(|r| *r >= o))
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "replication did not settle: {info}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
