//! Fencing at the resource, for the stores that need a crate of their own:
//! PostgreSQL (`postgres::PgFence`, feature `postgres`) and HTTP services
//! through tower (`tower::FenceLayer`, feature `tower`).
//!
//! The rule, the in-process fence and the Redis fence live in
//! `distlock::fence` (`distlock_core::fence`, `distlock_redis::RedisFence`);
//! this crate implements the same [`Fence`](distlock_core::fence::Fence)
//! trait, and runs the same conformance suite. The facade re-exports it as
//! `distlock::fence::postgres` (feature `fence-postgres`) and
//! `distlock::fence::tower` (feature `fence-tower`).
//!
//! # Example
//!
//! A PostgreSQL row written only if the holder's token is admitted, in one
//! transaction:
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # mod distlock {
//! #     pub use distlock_core::*;
//! #     pub mod fence { pub use distlock_core::fence::*; pub use distlock_fence::postgres; }
//! # }
//! # #[cfg(feature = "postgres")]
//! # async fn run(mut db: distlock::fence::postgres::tokio_postgres::Client, guard: distlock::LockGuard) -> Result<(), Box<dyn std::error::Error>> {
//! use distlock::fence::{Fence, FenceToken};
//! use distlock::fence::postgres::PgFence;
//!
//! let fence = PgFence::new();
//! fence.migrate(&db).await?;
//! let mut tx = db.transaction().await?;
//! fence.admit(&mut tx, "orders/42", FenceToken::of(&guard)).await?; // Err(Stale): drop tx
//! tx.execute("UPDATE orders SET state = 'paid' WHERE id = 42", &[]).await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```
//!
//! # Feature flags
//!
//! * `postgres`: `postgres::PgFence` on `tokio-postgres` (re-exported as
//!   `distlock_fence::postgres::tokio_postgres`).
//! * `tower`: `tower::FenceLayer` and the client side
//!   `tower::FencingTokenExt`, on `tower-layer`, `tower-service` and `http`.
//!
//! Neither is on by default.
//!
//! # Supported Rust versions
//!
//! The workspace's `rust-version` (1.89).
#![cfg_attr(docsrs, feature(doc_auto_cfg))]

#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "tower")]
pub mod tower;
