//! Safety of the in-process backend: random cancellation of acquisitions,
//! and a holder stalled past its TTL with its watchdog starved, on the
//! mutex, the read-write lock and the semaphore. No lost update on a fenced
//! resource, no torn read, ever.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use distlock_core::mem::MemProvider;
use distlock_core::{LeaseOptions, Provider};
use test_support::safety::{self, Shape, Workload};

const CI: Duration = Duration::from_secs(5);

fn clients() -> Vec<Arc<dyn Provider>> {
    let table = MemProvider::new();
    (0..4)
        .map(|_| Arc::new(table.new_client()) as Arc<dyn Provider>)
        .collect()
}

async fn random_cancellation_and_a_starved_watchdog(shape: Shape) {
    let lease = LeaseOptions::new(Duration::from_millis(300)).unwrap();
    let workload = Workload {
        cancel_randomly: true,
        acquire_timeout: Duration::from_millis(20),
        stall: Some(Duration::from_millis(700)),
        ..Workload::default()
    };
    let report = safety::run_with(
        &format!(
            "mem {}: random cancellation, holder stalled 0.7 s past a 0.3 s TTL",
            shape.label()
        ),
        &clients(),
        2,
        shape.maker("safety", Some(lease)),
        workload,
        safety::scenario_duration(CI),
        |until| async move {
            tokio::time::sleep_until(until.into()).await;
            0
        },
    )
    .await;
    safety::publish(&report);
    safety::assert_lost_before_next(&report);
    // A stall before the check: the guard compares the clock with its
    // deadline itself, so the holder knows the lease is gone. A stall
    // between the check and the write: the fence refuses the write.
    assert!(
        report.lost_noticed + report.stale_rejected >= 1 && report.accepted_writes > 0,
        "{report:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutex() {
    random_cancellation_and_a_starved_watchdog(Shape::Mutex).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_lock() {
    random_cancellation_and_a_starved_watchdog(Shape::ReadWrite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore() {
    random_cancellation_and_a_starved_watchdog(Shape::Semaphore(3)).await;
}
