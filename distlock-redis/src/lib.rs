//! Redis backend of distlock.
//!
//! This crate pins the `redis` and `deadpool-redis` versions the workspace
//! builds with and re-exports them, so users name the client's types without
//! a second copy. The Redis recipes (SET NX PX + fencing script, watchdog,
//! pub/sub waiting, pool and Cluster, id generator) are not in this release
//! yet; [`connect`] says so with a typed error.
//!
//! # Supported Rust versions
//!
//! Rust 1.88 or later.

pub use deadpool_redis;
pub use distlock_core;
pub use redis;

use std::sync::Arc;

use distlock_core::{Error, Provider, Result};

/// Connects to Redis at `url`.
///
/// # Errors
///
/// Always [`Error::UnsupportedBackend`] in this release: the Redis recipes
/// are not built yet.
///
/// # Cancellation safety
///
/// Cancellation safe: it opens nothing.
#[allow(clippy::unused_async)]
pub async fn connect(url: &str) -> Result<Arc<dyn Provider>> {
    let _ = url;
    Err(Error::UnsupportedBackend(
        "the Redis recipes are not in this release of distlock-redis yet".into(),
    ))
}
