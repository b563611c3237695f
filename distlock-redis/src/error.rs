//! Mapping of the Redis client's errors onto distlock's.

use std::time::Duration;

use distlock_core::Error;
use redis::RedisError;

/// Maps a client error of `operation` (which had `timeout` to answer).
pub(crate) fn from_redis(operation: &'static str, timeout: Duration, e: RedisError) -> Error {
    if e.is_timeout() {
        return Error::Timeout {
            operation,
            after: timeout,
        };
    }
    // An unauthenticated client that sends a long command is cut off with
    // "Protocol error: unauthenticated multibulk length" rather than NOAUTH.
    if matches!(e.code(), Some("NOAUTH" | "WRONGPASS" | "NOPERM"))
        || e.kind() == redis::ErrorKind::AuthenticationFailed
        || e.to_string().contains("unauthenticated")
    {
        return Error::NotAllowed {
            backend: "redis",
            source: Box::new(e),
        };
    }
    // `LOADING`: a server loading its dataset (after a restart) refuses
    // every command until it is done; retrying mends it.
    if e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_cluster_error()
        || e.code() == Some("LOADING")
    {
        return Error::connection("redis", e);
    }
    Error::server("redis", e)
}

/// Maps a pool checkout error.
pub(crate) fn map_pool(timeout: Duration, e: deadpool_redis::PoolError) -> Error {
    use deadpool_redis::PoolError;
    match e {
        PoolError::Backend(e) => from_redis("connect", timeout, e),
        PoolError::Timeout(_) => Error::Timeout {
            operation: "pool checkout",
            after: timeout,
        },
        PoolError::Closed => Error::Closed,
        other => Error::connection("redis", other),
    }
}
