//! The metrics recorded (feature `metrics`) match the operations performed,
//! read back through `metrics-util`'s debugging recorder.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]
#![cfg(feature = "metrics")]

use std::sync::Arc;
use std::time::Duration;

use distlock_core::mem::MemProvider;
use distlock_core::{LeaseOptions, LostReason, Provider};
use test_support::metrics::{counter, gauge, histogram_count, recorder};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_holds_renewals_and_losses_are_recorded() {
    recorder();
    let a = MemProvider::new();
    let b = a.new_client();
    let mutex = [("backend", "mem"), ("primitive", "mutex")];
    let outcome = |o: &'static str| [("backend", "mem"), ("primitive", "mutex"), ("outcome", o)];

    let lock_a = a
        .with_lease(LeaseOptions::new(Duration::from_millis(300)).unwrap())
        .unwrap()
        .mutex("m/one")
        .unwrap();
    let lock_b = b.mutex("m/one").unwrap();
    let held = lock_a.try_lock().await.unwrap().unwrap();
    assert_eq!(gauge("distlock_holds", &mutex), 1.0);
    assert!(lock_b.try_lock().await.unwrap().is_none());
    assert!(lock_b
        .lock_timeout(Duration::from_millis(50))
        .await
        .unwrap()
        .is_none());
    // A waiter that gets in once the holder releases: contended.
    let waiter = tokio::spawn({
        let lock_b = Arc::clone(&lock_b);
        async move { lock_b.lock().await }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(gauge("distlock_waiters", &mutex), 1.0);
    // The watchdog renewed at TTL/3 meanwhile.
    assert!(counter("distlock_renewals_total", &mutex) >= 1);
    held.release().await.unwrap();
    let second = waiter.await.unwrap().unwrap();
    assert_eq!(counter("distlock_acquire_total", &outcome("acquired")), 2);
    assert_eq!(counter("distlock_acquire_total", &outcome("busy")), 1);
    assert_eq!(counter("distlock_acquire_total", &outcome("timeout")), 1);
    assert_eq!(counter("distlock_acquire_contended_total", &mutex), 1);
    assert_eq!(gauge("distlock_waiters", &mutex), 0.0);
    assert_eq!(histogram_count("distlock_wait_seconds", &mutex), 4);
    second.release().await.unwrap();
    assert_eq!(gauge("distlock_holds", &mutex), 0.0);
    assert_eq!(histogram_count("distlock_hold_seconds", &mutex), 2);

    // A manual lease left to expire ends lost, by reason; another primitive
    // has its own labels.
    let sem = [("backend", "mem"), ("primitive", "semaphore")];
    let s = a
        .with_lease(LeaseOptions::manual(Duration::from_millis(100)).unwrap())
        .unwrap()
        .semaphore("m/sem", 2)
        .unwrap();
    let permit = s.try_lock().await.unwrap().unwrap();
    assert_eq!(permit.lost().await, LostReason::Expired);
    drop(permit);
    assert_eq!(
        counter(
            "distlock_leases_lost_total",
            &[
                ("backend", "mem"),
                ("primitive", "semaphore"),
                ("reason", "expired")
            ]
        ),
        1
    );
    assert_eq!(gauge("distlock_holds", &sem), 0.0);
    assert_eq!(
        counter(
            "distlock_leases_lost_total",
            &[
                ("backend", "mem"),
                ("primitive", "mutex"),
                ("reason", "expired")
            ]
        ),
        0
    );
    // The check every backend runs (it turns name labels on: last).
    let c = MemProvider::new();
    let d = c.new_client();
    let lease = LeaseOptions::new(Duration::from_secs(30)).unwrap();
    test_support::metrics::acquisitions_are_recorded(&c, &d, "mem", lease).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_requests_are_counted_while_they_are_pending() {
    recorder();
    let a = MemProvider::new();
    let operator = a.new_client();
    // The fair mutex: labels of its own in this binary's one recorder.
    let fair = [("backend", "mem"), ("primitive", "fair")];
    // The operator asks the holders of the fair mutex; how many it asked.
    let ask = || async {
        operator
            .request_release("m/asked", distlock_core::PrimitiveKind::FairMutex)
            .await
            .unwrap()
            .len()
    };
    let guard = a.fair_mutex("m/asked").unwrap().lock().await.unwrap();
    assert_eq!(gauge("distlock_release_requested", &fair), 0.0);
    for _ in 0..2 {
        assert_eq!(ask().await, 1);
    }
    guard.release_requested().await;
    // Asked twice, one pending request of one guard.
    assert_eq!(gauge("distlock_release_requested", &fair), 1.0);
    assert_eq!(counter("distlock_release_requests_total", &fair), 1);
    guard.release().await.unwrap();
    assert_eq!(gauge("distlock_release_requested", &fair), 0.0);
    assert_eq!(counter("distlock_release_requests_total", &fair), 1);
    // A guard dropped while asked leaves the gauge too.
    let guard = a.fair_mutex("m/asked").unwrap().lock().await.unwrap();
    ask().await;
    assert_eq!(gauge("distlock_release_requested", &fair), 1.0);
    drop(guard);
    assert_eq!(gauge("distlock_release_requested", &fair), 0.0);
    assert_eq!(counter("distlock_release_requests_total", &fair), 2);
    // A guard asked, then evicted, is no longer counted while it lives on.
    let guard = a.fair_mutex("m/asked").unwrap().lock().await.unwrap();
    ask().await;
    assert_eq!(gauge("distlock_release_requested", &fair), 1.0);
    operator
        .force_release("m/asked", distlock_core::PrimitiveKind::FairMutex)
        .await
        .unwrap();
    assert!(matches!(
        guard.lost().await,
        LostReason::Taken | LostReason::Deleted
    ));
    assert_eq!(gauge("distlock_release_requested", &fair), 0.0);
    // A manual lease asked, then left to expire, likewise.
    let guard = a
        .with_lease(LeaseOptions::manual(Duration::from_millis(100)).unwrap())
        .unwrap()
        .fair_mutex("m/asked")
        .unwrap()
        .lock()
        .await
        .unwrap();
    ask().await;
    assert_eq!(gauge("distlock_release_requested", &fair), 1.0);
    assert_eq!(guard.lost().await, LostReason::Expired);
    assert_eq!(gauge("distlock_release_requested", &fair), 0.0);
    drop(guard);
    assert_eq!(gauge("distlock_release_requested", &fair), 0.0);
}
