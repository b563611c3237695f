//! The metrics a Redis provider records match the operations performed
//! (a test binary of its own: the recorder is global).
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use distlock_core::LeaseOptions;
use distlock_redis::RedisProvider;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_are_recorded() {
    let url = test_support::redis::shared().url();
    let a = RedisProvider::connect(&url).await.unwrap();
    let b = RedisProvider::connect(&url).await.unwrap();
    let lease = LeaseOptions::new(Duration::from_secs(30)).unwrap();
    test_support::metrics::acquisitions_are_recorded(&a, &b, "redis", lease).await;
}
