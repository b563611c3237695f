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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracing_events_carry_the_owner_and_never_the_token_value() {
    let url = format!("{}?owner=traced-job", test_support::redis::shared().url());
    let provider = RedisProvider::connect(&url).await.unwrap();
    assert!(distlock_core::Provider::owner(&provider).starts_with("traced-job@"));
    let client = distlock_redis::redis::Client::open(test_support::redis::shared().url()).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    test_support::metrics::tracing_events_carry_the_owner(&provider, |name| {
        let mut conn = conn.clone();
        async move {
            // The lock key is exactly the name (empty prefix): its value is
            // the token that must never be logged.
            let value: Option<String> = distlock_redis::redis::cmd("GET")
                .arg(&name)
                .query_async(&mut conn)
                .await
                .unwrap();
            Some(value.expect("the lock key holds the token"))
        }
    })
    .await;
}
