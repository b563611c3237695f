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
//! * `UnexpectedError`, `UnmarshalError`: a reply the client could not read
//!   (a reply to no pending request, an unknown op code, bytes that do not
//!   parse);
//! * `Timeout`, `NoHosts`: a reconnection that ran out of time or hosts.
//!
//! None of these says whether the request took effect, so every recipe
//! treats them as **unknown outcomes** (look, then act again). An error
//! variant this crate does not know yet counts as unknown too: looking
//! again is safe, giving up on a node that may exist is not.
//!
//! Every other error is an **answer**: an error code in the header of the
//! server's reply (`record.rs` and `proto/error_code.rs`: `NoNode`,
//! `NodeExists`, `BadVersion`, …, and `UnexpectedErrorCode(code)` for a
//! code the client has no variant for, such as -120
//! `EPHEMERALONLOCALSESSION`), or the client's refusal before sending
//! (`BadArguments`, `RuntimeInconsistent`). The server answers only for a
//! request it ran or refused, and a refused one changed nothing: the
//! client's own `Error::has_no_data_change` (crate-private) lists the same
//! codes. Such an answer is never looked up ([`refused`]). Two of them,
//! `SessionMoved` and `Throttled`, say "not now" rather than "never":
//! they map to a retryable error (Curator retries both), but the request
//! did not take effect, so no lookup follows.

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
        // Answers that may be different next time: the caller may retry.
        e @ (ZkError::SessionMoved | ZkError::Throttled) => Error::connection("zookeeper", e),
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
/// definitively: it did not take effect, so there is nothing to look up.
/// Every error code in a server's reply is such an answer, a code the
/// client does not know (`UnexpectedErrorCode`) included. Everything else
/// but the session's end leaves the outcome unknown (see the module docs).
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
            | ZkError::SessionMoved
            | ZkError::NotReadOnly
            | ZkError::NoWatcher
            | ZkError::QuotaExceeded
            | ZkError::Throttled
            | ZkError::MarshallingError
            | ZkError::Unimplemented
            | ZkError::ReconfigDisabled
            | ZkError::UnexpectedErrorCode(_)
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
    /// The server answered (the request did not take effect): give up with
    /// this error (retryable for `SessionMoved` and `Throttled`).
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
    /// answers are refusals, a code the client does not know included.
    /// (`Custom`, a socket error or the client's own no-response timeout,
    /// has no public constructor: the fault tests reach it through a
    /// connection reset.)
    #[test]
    fn lost_connections_and_unreadable_replies_are_unknown_outcomes() {
        for e in [
            ZkError::ConnectionLoss,
            ZkError::Timeout,
            ZkError::NoHosts,
            ZkError::UnexpectedError("no response".into()),
            ZkError::UnmarshalError {
                entity: "reply",
                reason: &"insufficient buf",
            },
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
        for e in [
            ZkError::NoNode,
            ZkError::NodeExists,
            ZkError::BadVersion,
            ZkError::UnexpectedErrorCode(-120),
        ] {
            assert!(refused(&e) && !unknown(&e), "{e:?}");
            assert!(!from_zk("x", Duration::ZERO, e.clone()).is_retryable());
            assert!(matches!(triage("x", Duration::ZERO, e), Triage::Fail(_)));
        }
        // Not done, but may be done next time.
        for e in [ZkError::SessionMoved, ZkError::Throttled] {
            assert!(refused(&e) && !unknown(&e), "{e:?}");
            match triage("x", Duration::ZERO, e) {
                Triage::Fail(e) => assert!(e.is_retryable(), "{e:?}"),
                _ => panic!("not an answer"),
            }
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
