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

/// `distlock_suspended`, on a semaphore (no other test here uses one):
/// with or without the `name` label, as the other test toggles it.
fn suspended(name: &str) -> f64 {
    let base = [("backend", "redis"), ("primitive", "semaphore")];
    let mut named = base.to_vec();
    named.push(("name", name));
    test_support::metrics::gauge("distlock_suspended", &base)
        + test_support::metrics::gauge("distlock_suspended", &named)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_whose_renewals_fail_is_counted_as_suspended_until_one_succeeds() {
    use distlock_core::{LeaseStatus, Provider};
    test_support::metrics::recorder();
    let server = test_support::RedisServer::start();
    let url = format!("{}?response_timeout_ms=300", server.url());
    let provider = RedisProvider::connect(&url).await.unwrap();
    let name = test_support::unique_name("suspended");
    let lease = LeaseOptions::new(Duration::from_secs(6)).unwrap();
    let sem = provider
        .with_lease(lease)
        .unwrap()
        .semaphore(&name, 1)
        .unwrap();
    let guard = sem.try_lock().await.unwrap().unwrap();
    let mut watch = guard.watch();
    assert_eq!(suspended(&name), 0.0);
    // The next renewal (TTL/3 = 2 s) times out against a frozen server.
    server.pause();
    tokio::time::timeout(Duration::from_secs(4), async {
        while watch.status() != LeaseStatus::Suspended {
            watch.changed().await;
        }
    })
    .await
    .expect("suspended while the server is frozen");
    assert_eq!(suspended(&name), 1.0);
    server.resume();
    tokio::time::timeout(Duration::from_secs(3), async {
        while watch.status() != LeaseStatus::Held {
            watch.changed().await;
        }
    })
    .await
    .expect("held again once a renewal got through");
    assert_eq!(suspended(&name), 0.0);
    assert!(guard.is_held());
    guard.release().await.unwrap();
    assert_eq!(suspended(&name), 0.0);
}
