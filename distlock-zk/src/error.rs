//! Mapping of zookeeper-client's errors onto distlock's.

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
        ZkError::ConnectionLoss
        | ZkError::NoHosts
        | ZkError::SessionExpired
        | ZkError::ClientClosed
        | ZkError::SessionMoved
        | ZkError::Throttled => Error::connection("zookeeper", e),
        ZkError::NoAuth | ZkError::AuthFailed => Error::NotAllowed {
            backend: "zookeeper",
            source: Box::new(e),
        },
        other => Error::server("zookeeper", other),
    }
}

/// Whether the session behind the error is gone for good.
pub(crate) fn session_ended(e: &ZkError) -> bool {
    matches!(
        e,
        ZkError::SessionExpired | ZkError::ClientClosed | ZkError::AuthFailed
    )
}

/// What a recipe does after a request failed.
pub(crate) enum Triage {
    /// The connection dropped (or the reply did not come in time): the
    /// request's outcome is unknown; look before acting again.
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
        return Triage::SessionEnded;
    }
    match e {
        ZkError::ConnectionLoss | ZkError::Timeout => Triage::Retry,
        other => Triage::Fail(from_zk(operation, timeout, other)),
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
