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
    /// Whether the command path is known to deliver replies (see
    /// [`Replies`]).
    pub(crate) replies: Replies,
}

/// Whether the command path delivers replies, as the plain mutex's line
/// needs: a place in line is worth keeping only for a provider that hears
/// the reply of the attempt a hand-over wakes. A command left without a
/// reply within the response timeout makes it unknown (a path that lost
/// its return direction still runs what it sends: each refresh of a place
/// would land and keep it) until a command is answered again. While it is
/// unknown, a waiting attempt takes the provider off the line rather than
/// queuing it, and the line's refreshes wait for a `PING` to be answered.
#[derive(Debug, Default)]
pub(crate) struct Replies {
    missed: std::sync::atomic::AtomicBool,
}

impl Replies {
    /// No command was left unanswered since the last answer.
    pub(crate) fn heard(&self) -> bool {
        !self.missed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Counts what became of one command: an answer (an error reply too)
    /// or a timeout; other failures (a refused connection, a reset) say
    /// nothing of replies.
    pub(crate) fn note<T>(&self, outcome: &distlock_core::Result<T>) {
        use std::sync::atomic::Ordering::Relaxed;
        match outcome {
            Ok(_) => self.missed.store(false, Relaxed),
            Err(e) if e.is_timeout() => self.missed.store(true, Relaxed),
            Err(distlock_core::Error::Connection { .. }) => {}
            Err(_) => self.missed.store(false, Relaxed),
        }
    }
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
