//! Test support for distlock: real servers on loopback ports, a fault-injecting
//! TCP proxy, and the conformance suite every backend runs.
//!
//! Servers come from Debian's packages (`redis-server`, `zookeeper`), installed
//! by `scripts/install-servers.sh`. A missing binary is a loud failure that
//! names that script, never a silent skip. Everything listens on 127.0.0.1
//! only.

// Test support fails loudly by design: a server that does not start is a
// test failure, reported with the reason.
#![allow(clippy::missing_panics_doc)]

pub mod conformance;
pub mod curator;
pub mod fence_conformance;
pub mod kinds;
pub mod masters;
pub mod metrics;
pub mod multi;
pub mod operations;
pub mod postgres;
pub mod primitives;
pub mod properties;
pub mod proxy;
pub mod redis;
pub mod replicas;
pub mod resources;
pub mod revocation;
pub mod safety;
pub mod sentinel;
mod server;
pub mod tls;
pub mod tracing_capture;
pub mod zookeeper;

pub use proxy::Proxy;

/// How long a peer's process (redis-py, kazoo, a JVM with Curator) may take
/// to start and take its lock before a test gives up on it. Its start-up is
/// nothing of ours: on a loaded 2-core machine a Python interpreter took
/// over 3 s once. Tests wait this long for the peer's hold to show, then
/// measure from there what is ours.
pub const PEER_START: std::time::Duration = std::time::Duration::from_secs(30);
pub use redis::RedisServer;
pub use sentinel::SentinelGroup;
pub use server::free_port;
pub use zookeeper::ZkCluster;

/// A name prefix unique to one test run and test, so tests can share a
/// server: `t<random>/<test>`.
#[must_use]
pub fn unique_name(test: &str) -> String {
    format!("t{:016x}/{test}", fastrand::u64(..))
}
