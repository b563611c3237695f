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

    /// Waits until every replica is connected, done with its initial sync
    /// and acknowledging writes: a write on the master is acknowledged by
    /// every replica through `WAIT` (what the tests' acquisitions rely on).
    ///
    /// The master's view alone is not enough: it reports a replica
    /// `state=online` with `offset=0` as soon as the snapshot is sent, while
    /// the replica may still be writing it to disk and loading it; a
    /// `WAIT` then went unanswered for 1 s in a loaded full run.
    ///
    /// # Panics
    ///
    /// When that does not happen within 20 s.
    pub fn wait_in_sync(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let wanted = self.replicas.len().to_string();
        loop {
            let linked = self.replicas.iter().all(|r| {
                let info = r.cli(&["INFO", "replication"]);
                info.lines().any(|l| l.trim() == "master_link_status:up")
                    && info
                        .lines()
                        .any(|l| l.trim() == "master_sync_in_progress:0")
            });
            if linked {
                let written = self
                    .master
                    .cli(&["INCR", "distlock-test:replication-check"]);
                assert!(
                    written.parse::<u64>().is_ok(),
                    "the master took no write: {written:?}"
                );
                if self.master.cli(&["WAIT", &wanted, "200"]) == wanted {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "replication did not settle: {}",
                self.master.cli(&["INFO", "replication"])
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
