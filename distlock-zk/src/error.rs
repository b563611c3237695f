//! Mapping of zookeeper-client's errors onto distlock's, and the one place
//! that decides which of them leave a request's outcome unknown.
//!
//! What zookeeper-client 0.11 hands a request that was in flight when its
//! connection failed (read in its `session/mod.rs` and `session/depot.rs`:
//! every error that ends a connection is sent to every request written on
//! it, and requests made during a reconnect wait for the new connection):
//!
//! * `ConnectionLoss`: the server closed the connection (a read of 0 bytes);
//! * `Custom`: a socket error (`ECONNRESET`, `EPIPE`, …, wrapped with
//!   `Error::other`), and the client's own no-response timeout ("no
//!   response from connection in …ms", 2/5 of the session timeout);
//! * `UnexpectedError`, `UnmarshalError`, `UnexpectedErrorCode`: a reply
//!   the client could not read (a server error code it does not know, such
//!   as `OPERATIONTIMEOUT` or `REQUESTTIMEOUT`, among them);
//! * `SessionMoved`, `Throttled`: the server did not run the request, but
//!   the session lives on (Curator retries both);
//! * `Timeout`, `NoHosts`: a reconnection that ran out of time or hosts.
//!
//! None of these says the request did not take effect, so every recipe
//! treats them as **unknown outcomes** (look, then act again), and only the
//! server's definitive answers ([`refused`]) as refusals. An error variant
//! this crate does not know yet counts as unknown too: looking again is
//! safe, giving up on a node that may exist is not.

use std::time::Duration;

use distlock_core::Error;
use zookeeper_client::Error as ZkError;

/// Maps an error of `operation` (which had `timeout`).
pub(crate) fn from_zk(operation: &'static str, timeout: Duration, e: ZkError) -> Error {
    match e {
        ZkError::Timeout => Error::Timeout {
            operation,
            after: timeout,
        },
        ZkError::NoAuth | ZkError::AuthFailed => Error::NotAllowed {
            backend: "zookeeper",
            source: Box::new(e),
        },
        e if refused(&e) => Error::server("zookeeper", e),
        // The session's end and every unknown outcome: retryable.
        e => Error::connection("zookeeper", e),
    }
}

/// Whether the session behind the error is gone for good.
pub(crate) fn session_ended(e: &ZkError) -> bool {
    matches!(
        e,
        ZkError::SessionExpired | ZkError::ClientClosed | ZkError::AuthFailed
    )
}

/// Whether the server (or the client, before sending) answered the request
/// definitively: it did not take effect, and sending it again would get
/// the same answer. Everything else but the session's end leaves the
/// outcome unknown (see the module docs).
pub(crate) fn refused(e: &ZkError) -> bool {
    matches!(
        e,
        ZkError::NoNode
            | ZkError::NoAuth
            | ZkError::BadVersion
            | ZkError::NoChildrenForEphemerals
            | ZkError::NodeExists
            | ZkError::NotEmpty
            | ZkError::InvalidAcl
            | ZkError::NotReadOnly
            | ZkError::NoWatcher
            | ZkError::QuotaExceeded
            | ZkError::MarshallingError
            | ZkError::Unimplemented
            | ZkError::ReconfigDisabled
            | ZkError::BadArguments(_)
            | ZkError::RuntimeInconsistent
    )
}

/// Whether the request may or may not have taken effect: neither a
/// definitive answer nor the session's end.
pub(crate) fn unknown(e: &ZkError) -> bool {
    !refused(e) && !session_ended(e)
}

/// What a recipe does after a request failed.
pub(crate) enum Triage {
    /// The request's outcome is unknown (the connection dropped or was
    /// reset, the reply did not come in time, or could not be read): look
    /// before acting again.
    Retry,
    /// The session is gone for good, with every ephemeral node it had.
    SessionEnded,
    /// The server refused: give up with this error.
    Fail(Error),
}

/// Sorts a failed request of `operation` into [`Triage`]: the one place the
/// recipes decide what a ZooKeeper error means for them.
pub(crate) fn triage(operation: &'static str, timeout: Duration, e: ZkError) -> Triage {
    if session_ended(&e) {
        Triage::SessionEnded
    } else if refused(&e) {
        Triage::Fail(from_zk(operation, timeout, e))
    } else {
        Triage::Retry
    }
}

/// Sorts the result of a request run with a timeout: our own timeout is an
/// unknown outcome, like a connection loss.
pub(crate) fn triage_timed<T>(
    operation: &'static str,
    timeout: Duration,
    r: distlock_core::Result<std::result::Result<T, ZkError>>,
) -> std::result::Result<T, Triage> {
    match r {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(triage(operation, timeout, e)),
        Err(_) => Err(Triage::Retry),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The errors zookeeper-client gives a request whose connection failed
    /// are unknown outcomes, and map to retryable errors; the server's
    /// answers are refusals. (`Custom`, a socket error or the client's own
    /// no-response timeout, has no public constructor: the fault tests
    /// reach it through a connection reset.)
    #[test]
    fn lost_connections_and_unreadable_replies_are_unknown_outcomes() {
        for e in [
            ZkError::ConnectionLoss,
            ZkError::Timeout,
            ZkError::SessionMoved,
            ZkError::Throttled,
            ZkError::NoHosts,
            ZkError::UnexpectedError("no response".into()),
            ZkError::UnexpectedErrorCode(-122),
        ] {
            assert!(unknown(&e), "{e:?}");
            assert!(matches!(
                triage("x", Duration::ZERO, e.clone()),
                Triage::Retry
            ));
            assert!(
                from_zk("x", Duration::ZERO, e.clone()).is_retryable(),
                "{e:?}"
            );
        }
        for e in [ZkError::NoNode, ZkError::NodeExists, ZkError::BadVersion] {
            assert!(refused(&e) && !unknown(&e));
            assert!(matches!(triage("x", Duration::ZERO, e), Triage::Fail(_)));
        }
        for e in [ZkError::SessionExpired, ZkError::ClientClosed] {
            assert!(!unknown(&e));
            assert!(matches!(
                triage("x", Duration::ZERO, e),
                Triage::SessionEnded
            ));
        }
    }
}
