//! ZooKeeper backend of distlock.
//!
//! This crate pins the `zookeeper-client` version (with its `tokio` feature,
//! without which the client panics with "no spawner") and re-exports it. The
//! ZooKeeper recipes (fair and unfair mutex, leader election, id generator)
//! are not in this release yet; [`connect`] says so with a typed error.
//!
//! # Supported Rust versions
//!
//! Rust 1.88 or later.

pub use distlock_core;
pub use zookeeper_client;

use std::sync::Arc;

use distlock_core::{Error, Provider, Result};

/// Connects to ZooKeeper at `connect_string`.
///
/// # Errors
///
/// Always [`Error::UnsupportedBackend`] in this release: the ZooKeeper recipes
/// are not built yet.
///
/// # Cancellation safety
///
/// Cancellation safe: it opens nothing.
#[allow(clippy::unused_async)]
pub async fn connect(connect_string: &str) -> Result<Arc<dyn Provider>> {
    let _ = connect_string;
    Err(Error::UnsupportedBackend(
        "the ZooKeeper recipes are not in this release of distlock-zk yet".into(),
    ))
}
