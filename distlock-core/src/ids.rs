//! Id generation: unique `u64` ids, optionally handed out from blocks.

use std::fmt;

use async_trait::async_trait;

use crate::error::Result;
use crate::name::Name;

/// A generator of unique ids.
#[async_trait]
pub trait IdGenerator: Send + Sync + fmt::Debug {
    /// The generator's name.
    fn name(&self) -> &Name;

    /// The next id: unique across every client of the same name, at least 1,
    /// and increasing for each generator object (not across clients when
    /// blocks are used: ids are then unique but not globally ordered).
    ///
    /// # Errors
    ///
    /// Connection and server errors of the backend; [`Error::Exhausted`](crate::Error::Exhausted) when
    /// the 64-bit id space is used up; [`Error::Conflict`](crate::Error::Conflict) when the name holds
    /// data that is not a counter.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: a cancelled call may skip ids (a reserved block
    /// is dropped), never hand one out twice.
    async fn next(&self) -> Result<u64>;
}
