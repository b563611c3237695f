//! One timeout wrapper for every backend request.

use std::future::Future;
use std::time::Duration;

use crate::error::{Error, Result};

/// Runs `request` for at most `after`; the outer error is the timeout, the
/// value is whatever the request returned (often the client's own result,
/// for the recipe to act on).
///
/// # Errors
///
/// [`Error::Timeout`] naming `operation` when `after` passes first.
///
/// # Cancellation safety
///
/// As cancellation safe as `request`.
pub async fn with_timeout<T>(
    operation: &'static str,
    after: Duration,
    request: impl Future<Output = T>,
) -> Result<T> {
    tokio::time::timeout(after, request)
        .await
        .map_err(|_| Error::Timeout { operation, after })
}
