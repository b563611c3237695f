//! What every primitive of one provider shares: the command connection, the
//! subscriber and tracker that wake its waiters, its options and lifecycle.

use std::sync::Arc;

use distlock_core::backend::Lifecycle;
use distlock_core::Result;

use crate::net::{Commands, Conn};
use crate::options::RedisOptions;
use crate::wake::subscriber::Subscriber;
use crate::wake::tracker::Tracker;

/// What every primitive of one provider shares.
#[derive(Debug)]
pub(crate) struct Context {
    /// The command connection.
    pub(crate) commands: Commands,
    pub(crate) subscriber: Subscriber,
    /// Wake-ups on changes of keys held by clients that do not publish.
    pub(crate) tracker: Tracker,
    pub(crate) options: RedisOptions,
    pub(crate) lifecycle: Arc<Lifecycle>,
    /// The owner identity stored with every hold (`label@host:pid`).
    pub(crate) owner: String,
}

impl Context {
    /// The command connection.
    ///
    /// # Errors
    ///
    /// [`Error::Closed`](distlock_core::Error::Closed) once the provider is closed.
    pub(crate) fn conn(&self) -> Result<Conn> {
        self.commands.conn()
    }
}
