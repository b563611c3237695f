//! Mapping of zookeeper-client's errors onto distlock's.

use std::time::Duration;

use distlock_core::Error;
use zookeeper_client::Error as ZkError;

/// Maps an error of `operation` (which had `timeout`).
pub(crate) fn map(operation: &'static str, timeout: Duration, e: ZkError) -> Error {
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
