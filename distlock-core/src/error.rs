//! The one error type of distlock, and how to tell failures apart.
//!
//! "The lock is busy" is never an error, and "the backend is down" never
//! looks like "busy":
//!
//! | what happened | what you get | how to tell |
//! |---|---|---|
//! | busy: not acquired within the wait | `Ok(None)` from `try_lock` / `lock_timeout` (`lock()` keeps waiting) | the `Option` |
//! | backend unreachable or too slow: refused, reset, server or quorum down, no answer in time | `Err(Error::Connection)`, `Err(Error::Timeout)` | [`Error::is_retryable`], [`Error::is_timeout`] |
//! | replicas did not acknowledge (Redis `wait_replicas`) | `Err(Error::NotReplicated)`, nothing held | [`Error::is_retryable`] |
//! | not allowed: wrong credentials, an ACL without the needed permission | `Err(Error::NotAllowed)` | [`Error::is_not_allowed`] |
//! | bad input: name (of a lock, or of a fenced resource), options, URL, unknown scheme or feature off | `Err(Error::InvalidName / InvalidOptions / InvalidUrl / UnsupportedBackend)` | [`Error::is_invalid_input`] |
//! | the name holds something else (another type of key, a foreign node), or a semaphore held under another number of permits | `Err(Error::Conflict)`, `Err(Error::PermitsMismatch)`; nothing changed | [`Error::is_conflict`] |
//! | the lease was lost while held | [`LockGuard::lost`](crate::LockGuard::lost) resolves with a [`LostReason`](crate::LostReason); `extend` and `release` give `Err(Error::NotHeld)` | [`Error::is_not_held`] |
//! | the provider was closed | `Err(Error::Closed)` | the variant |
//! | a counter ran out (fencing tokens, ids) | `Err(Error::Exhausted)` | the variant |
//! | a fenced resource refused a write: a newer holder wrote first | `Err(Error::Stale { token, highest })`; nothing written | [`Error::is_stale`] |
//!
//! Waiting acquisitions (`lock`, `lock_timeout`) ride out retryable errors
//! until their deadline and then return the last one, so a deadline passed
//! while the backend was down is an error, not `Ok(None)`.

use std::time::Duration;

/// A boxed error from a lower layer (network client, server, I/O).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `Result` with distlock's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in distlock.
///
/// The [`error`](crate::error) module's table says which error (or
/// `Ok(None)`) each kind of failure gives and how to tell them apart.
///
/// `Display` describes this level only; the lower-level cause, where there is
/// one, is available through [`std::error::Error::source`]. Use the `is_*`
/// classifiers rather than matching variants where you can: the enum is
/// `#[non_exhaustive]` and grows as backends do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A name given for a lock, election or id generator, or a fenced
    /// resource's name ([the rule](crate::fence#resource-names)), is not
    /// valid.
    #[error("invalid name {name:?}: {reason}")]
    InvalidName {
        /// The rejected name (truncated to 64 characters).
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// Lease or operation options are not valid (zero TTL, TTL too long, ...).
    #[error("invalid options: {0}")]
    InvalidOptions(String),

    /// A URL or connection string could not be used.
    #[error("invalid connection string: {0}")]
    InvalidUrl(String),

    /// The URL names a backend this build does not include (its cargo feature
    /// is off) or that distlock does not know.
    #[error("unsupported backend: {0}")]
    UnsupportedBackend(String),

    /// The backend does not offer this primitive or option (yet).
    #[error("{backend} does not support {what}")]
    Unsupported {
        /// The backend (`"redis"`, `"zookeeper"`, ...).
        backend: &'static str,
        /// What it does not support.
        what: &'static str,
    },

    /// The lease is not held (any more): it was released, expired, or taken
    /// over by another holder. Nothing was changed on the server.
    #[error("lease on {name:?} is not held")]
    NotHeld {
        /// The name of the lock, election or lease.
        name: String,
    },

    /// Something already stored under the name is not what distlock expects
    /// (a Redis key of another type, a ZooKeeper node that is not a lock). It
    /// was left untouched.
    #[error("{what} is not a distlock {expected}; left untouched")]
    Conflict {
        /// The key or path that was found.
        what: String,
        /// What distlock expected to find there.
        expected: &'static str,
    },

    /// A semaphore's permits are held under another number of permits than
    /// this client asked with; nothing was acquired or changed. Every client
    /// of a semaphore must use the same number.
    #[error("semaphore {name:?} is held with {held} permits; this client asked for {asked}")]
    PermitsMismatch {
        /// The semaphore's name.
        name: String,
        /// The number of permits the current holders were admitted under.
        held: u32,
        /// The number this client asked with.
        asked: u32,
    },

    /// Fewer replicas than asked acknowledged a write in time (Redis `WAIT`,
    /// the provider's `wait_replicas` option). An acquisition that was not
    /// acknowledged was undone (nothing is held); a renewal that was not is
    /// counted as failed (the lease runs to its last acknowledged expiry).
    /// Retryable: the replicas may catch up.
    #[error("{what}: {acked} of {wanted} replicas acknowledged within {after:?}")]
    NotReplicated {
        /// What was not acknowledged (`lock "name"` and the step).
        what: String,
        /// Replicas that acknowledged.
        acked: u32,
        /// Replicas asked for.
        wanted: u32,
        /// How long the server waited for them.
        after: Duration,
    },

    /// An operation did not finish within its configured time.
    #[error("{operation} timed out after {after:?}")]
    Timeout {
        /// What timed out.
        operation: &'static str,
        /// The configured limit.
        after: Duration,
    },

    /// The connection to the server failed or was lost; the operation may be
    /// retried.
    #[error("connection to {backend} failed")]
    Connection {
        /// The backend (`"redis"`, `"zookeeper"`, ...).
        backend: &'static str,
        /// The underlying cause.
        #[source]
        source: BoxError,
    },

    /// The server refused the client: authentication failed, or the user
    /// lacks a permission the operation needs (Redis `NOAUTH`, `WRONGPASS`,
    /// `NOPERM`; ZooKeeper `NoAuth`, `AuthFailed`). Not retryable: fix the
    /// credentials or the ACL.
    #[error("{backend} refused: not allowed")]
    NotAllowed {
        /// The backend (`"redis"`, `"zookeeper"`, ...).
        backend: &'static str,
        /// The server's answer.
        #[source]
        source: BoxError,
    },

    /// The server answered with an error.
    #[error("{backend} server error")]
    Server {
        /// The backend (`"redis"`, `"zookeeper"`, ...).
        backend: &'static str,
        /// The underlying cause.
        #[source]
        source: BoxError,
    },

    /// A 64-bit counter has run out: an id generator's ids, or a lock's
    /// fencing tokens. Nothing was acquired or handed out.
    #[error("64-bit counter {name:?} is exhausted")]
    Exhausted {
        /// The id generator's name, or the fencing counter's key.
        name: String,
    },

    /// A fenced resource refused a write: its fencing token `token` is below
    /// `highest`, the token of a newer holder the resource already admitted
    /// (see [`fence`](crate::fence)). Nothing was written. Not retryable:
    /// the caller's lease was superseded.
    #[error("fencing token {token} is stale: the resource admitted {highest}")]
    Stale {
        /// The refused token.
        token: u64,
        /// The token it was compared with: the highest admitted (of an
        /// exclusive holder, for a shared token).
        highest: u64,
    },

    /// The provider was closed, or the runtime it needs is shutting down.
    #[error("provider is closed")]
    Closed,

    /// The operation was called outside a Tokio runtime; distlock needs one to
    /// run a guard's watchdog and its release on drop.
    #[error("no Tokio runtime is running on this thread")]
    NoRuntime,
}

impl Error {
    /// A retry of the same operation may succeed (connection trouble,
    /// timeouts, replicas not acknowledging yet).
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Connection { .. } | Error::Timeout { .. } | Error::NotReplicated { .. }
        )
    }

    /// The operation ran out of time.
    #[must_use]
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout { .. })
    }

    /// The lease is no longer held by the caller.
    #[must_use]
    pub fn is_not_held(&self) -> bool {
        matches!(self, Error::NotHeld { .. })
    }

    /// The caller passed something invalid (name, options, URL); retrying the
    /// same call cannot succeed.
    #[must_use]
    pub fn is_invalid_input(&self) -> bool {
        matches!(
            self,
            Error::InvalidName { .. }
                | Error::InvalidOptions(_)
                | Error::InvalidUrl(_)
                | Error::UnsupportedBackend(_)
        )
    }

    /// The server refused the credentials or the permission
    /// ([`Error::NotAllowed`]).
    #[must_use]
    pub fn is_not_allowed(&self) -> bool {
        matches!(self, Error::NotAllowed { .. })
    }

    /// Data already under the name is not distlock's; nothing was changed.
    #[must_use]
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Conflict { .. })
    }

    /// A fenced resource refused the write for its stale token
    /// ([`Error::Stale`]).
    #[must_use]
    pub fn is_stale(&self) -> bool {
        matches!(self, Error::Stale { .. })
    }

    /// The [`Error::Conflict`] of one name taken as two kinds of primitive:
    /// `name` is in use (held, or waited for ahead of this caller) as a
    /// `found`, and the caller asked for a `wanted`. Nothing was acquired.
    /// The kinds are bare nouns such as [`PrimitiveKind::noun`](crate::PrimitiveKind::noun)
    /// gives; the message puts the article before `found` ("a semaphore",
    /// "an election").
    pub fn kind_conflict(name: &str, found: &str, wanted: &'static str) -> Self {
        let article = match found.bytes().next() {
            Some(b'a' | b'e' | b'i' | b'o' | b'u' | b'A' | b'E' | b'I' | b'O' | b'U') => "an",
            _ => "a",
        };
        Error::Conflict {
            what: format!("name {name:?}, in use by {article} {found},"),
            expected: wanted,
        }
    }

    /// Shorthand for [`Error::NotHeld`].
    pub fn not_held(name: impl Into<String>) -> Self {
        Error::NotHeld { name: name.into() }
    }

    /// Wraps a connection-level failure of `backend`.
    pub fn connection(backend: &'static str, source: impl Into<BoxError>) -> Self {
        Error::Connection {
            backend,
            source: source.into(),
        }
    }

    /// Wraps a server-side error of `backend`.
    pub fn server(backend: &'static str, source: impl Into<BoxError>) -> Self {
        Error::Server {
            backend,
            source: source.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_is_send_sync_static() {
        fn assert_bounds<T: Send + Sync + 'static + std::error::Error>() {}
        assert_bounds::<Error>();
    }

    #[test]
    fn source_is_kept_and_display_is_own_level() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = Error::connection("redis", io);
        assert_eq!(e.to_string(), "connection to redis failed");
        let src = std::error::Error::source(&e).expect("source kept");
        assert_eq!(src.to_string(), "refused");
        assert!(e.is_retryable());
        assert!(!e.is_invalid_input());
    }

    #[test]
    fn classifiers() {
        assert!(Error::not_held("a").is_not_held());
        assert!(Error::InvalidOptions("x".into()).is_invalid_input());
        let t = Error::Timeout {
            operation: "connect",
            after: Duration::from_secs(1),
        };
        assert!(t.is_timeout() && t.is_retryable());
        assert!(Error::Conflict {
            what: "k".into(),
            expected: "lock"
        }
        .is_conflict());
    }

    #[test]
    fn stale_is_its_own_class() {
        let e = Error::Stale {
            token: 3,
            highest: 5,
        };
        assert!(e.is_stale() && !e.is_retryable() && !e.is_invalid_input());
        assert_eq!(
            e.to_string(),
            "fencing token 3 is stale: the resource admitted 5"
        );
        assert!(!Error::Closed.is_stale());
    }

    #[test]
    fn a_kind_conflict_names_the_kind_with_its_article() {
        let e = Error::kind_conflict("jobs/x", "election", "mutex");
        assert_eq!(
            e.to_string(),
            "name \"jobs/x\", in use by an election, is not a distlock mutex; left untouched"
        );
        let e = Error::kind_conflict("jobs/x", "semaphore", "election");
        assert!(e.to_string().contains("in use by a semaphore,"), "{e}");
    }
}
